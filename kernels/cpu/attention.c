/* attention.c - attention of batch rows over the paged KV cache (CPU).
 *
 * For each (row r, head h) pair, with kv head g = h / (n_head / n_kv_head):
 *   visible slots = [0, n_visible[r]) of the row's sequence, then the extra slots
 *   extra_slot[extra_off[r] .. extra_off[r+1]) when extra_off != NULL, or for a
 *   token-tree row the slots n_visible[r] + j of the bits j of tree_mask[r] (in
 *   increasing j);
 *   score_s = scale * q . K[s];  p = softmax(score) (max subtracted);
 *   out = sum_s p_s V[s].
 * Every (row, head) output is computed entirely by one thread with the same
 * operations whatever the thread count or the batch's other rows (see attn_slice).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

/* Rows are processed in slices: up to TDM_ATTN_SLICE consecutive rows of one
 * sequence.  A chunk of the thread pool is one (slice, kv head) pair: every query
 * vector of the slice in that kv group (rows x heads of the group) is scored
 * together against the K blocks (kernel table attn_qk: K is stored [hd][bs] per
 * block, so 16 keys are one vector), so K is read once per chunk instead of once
 * per (row, head).  The arithmetic of each (row, head) output is the
 * same whatever slice it falls in, so results do not depend on the batch's other
 * rows or on the thread count. */

typedef struct attn_job {
    tdm_cpu *c;
    const tdm_attn_args *a;
    const int32_t *slice;  /* [n_slices][2]: first row, row count */
    int64_t n_tot_max;     /* visible slots of the widest row */
} attn_job;

/* Asks for bytes [p, p + n) to be brought into the cache (the K/V of a layer
 * are usually evicted by the weights streamed since the previous step). */
static inline void prefetch_range(const void *p, size_t n) {
    for (size_t off = 0; off < n; off += 64) __builtin_prefetch((const char *)p + off, 0, 3);
}

static inline uint64_t row_mask(const tdm_batch *bt, int32_t r) { return bt->tree && bt->tree_mask ? bt->tree_mask[r] : 0; }

static inline int32_t row_n_extra(const tdm_attn_args *a, int32_t r) {
    const uint64_t m = row_mask(a->batch, r);
    if (m) return __builtin_popcountll(m);
    const int32_t *off = a->batch->extra_off;
    return off ? off[r + 1] - off[r] : 0;
}

/* The extra slots of row r: its CSR list, or its tree mask's slots written to buf
 * [TDM_TREE_MAX_NODES]. */
static inline const int32_t *row_extra(const tdm_batch *bt, int32_t r, int32_t *buf) {
    uint64_t m = row_mask(bt, r);
    if (!m) return bt->extra_off && bt->extra_off[r + 1] > bt->extra_off[r] ? bt->extra_slot + bt->extra_off[r] : NULL;
    int32_t n = 0;
    for (; m; m &= m - 1) buf[n++] = bt->n_visible[r] + __builtin_ctzll(m);
    return buf;
}

/* Bytes from a cache's start to the (block holding slot `slot`, kv head g) unit
 * (kv_layout.h: K [hd][bs], V [bs][hd] values, q8_0 scales after them). */
static inline int64_t unit_offset(const tdm_attn_args *a, const tdm_kv_seq *s, int32_t slot, int32_t g, int64_t unit) {
    return ((int64_t)s->blocks[slot / a->block_size] * a->n_kv_head + g) * unit;
}

/* q8_0, fp8: the scale of slot `slot` of kv head g in a cache (K or V). */
static inline float slot_scale(const void *cache, const tdm_attn_args *a, const tdm_kv_seq *s, int32_t slot, int32_t g,
                             int64_t unit) {
    float d;
    memcpy(&d,
           (const uint8_t *)cache + unit_offset(a, s, slot, g, unit) +
               tdm_kv_scale_off(a->block_size, a->head_dim) + 4 * (int64_t)(slot % a->block_size),
           4);
    return d;
}

/* q8_0, fp8: x[h * ld + j] *= sc[j] for h < nh, j < n. */
static void scale_cols(float *x, int64_t ld, int32_t nh, const float *sc, int32_t n) {
    for (int32_t h = 0; h < nh; h++)
        for (int32_t j = 0; j < n; j++) x[h * ld + j] *= sc[j];
}

/* Rows [r0, r0 + nr) (one sequence), the heads of kv group g, whose query vectors
 * are read and outputs written at kv group gq of io (q and out rows; gq = g for the
 * op's own arguments).  Scratch (tdm_cpu_attn_scratch): qbuf [nr * group][hd],
 * scores [nr * group][n_tot_max], acc [nr * group][hd], kt [blocks of the widest
 * row] (K block pointers), inv [nr * group], ksc and vsc [n_tot_max] (q8_0, fp8:
 * the scales of the slots of the widest row).
 *
 * q8_0 and fp8 caches: the kernels read the int8 quants / E4M3 codes as values, and
 * the slot scales are applied here: score = (scale * q . kq) * kscale, then after the softmax
 * numerators p (whose sum is the normaliser) the weights p * vscale. */
static void attn_slice(const tdm_cpu_kernels *k, const tdm_attn_args *a, const tdm_attn_io *io, int64_t ld,
                       int32_t r0, int32_t nr, int32_t g, int32_t gq, float *qbuf, float *scores, float *acc,
                       const void **kt, float *inv, float *ksc, float *vsc) {
    const tdm_batch *bt = a->batch;
    const tdm_kv_seq *s = a->seqs[bt->seq[r0]];
    const int32_t hd = a->head_dim, group = a->n_head / a->n_kv_head, bs = a->block_size;
    const uint32_t type = a->cache_type;
    const bool q8 = tdm_kv_scaled(type); /* (q8_0 or fp8) */
    const int64_t esz = tdm_kv_elem_bytes(type), unit = tdm_kv_unit_bytes(type, bs, hd);
    const float scale = a->scale;
    int32_t max_vis = 0;
    for (int32_t i = 0; i < nr; i++) {
        max_vis = TDM_MAX(max_vis, bt->n_visible[r0 + i]);
        memcpy(qbuf + (int64_t)i * group * hd, io->q + (int64_t)(r0 + i) * io->q_stride + (int64_t)gq * group * hd,
               (size_t)group * hd * sizeof(float));
    }
    const int32_t nq = nr * group;

    /* scores[qi][slot] = scale * q . K[slot] for the visible slots of the widest row,
     * about 64 slots (a few K blocks) per call; the next K blocks and this call's V
     * blocks are prefetched while these are scored */
    const int32_t n_blk = (max_vis + bs - 1) / bs, per = TDM_MAX(1, 64 / bs);
    for (int32_t b = 0; b < n_blk; b++)
        kt[b] = (const uint8_t *)a->k_cache + ((int64_t)s->blocks[b] * a->n_kv_head + g) * unit;
    for (int32_t b = 0; b < TDM_MIN(per, n_blk); b++) prefetch_range(kt[b], (size_t)unit);
    for (int32_t b = 0; b < n_blk; b += per) {
        int32_t nb = TDM_MIN(per, n_blk - b), i = b * bs, cnt = TDM_MIN(nb * bs, max_vis - i);
        for (int32_t x = b + per; x < TDM_MIN(b + 2 * per, n_blk); x++) prefetch_range(kt[x], (size_t)unit);
        for (int32_t x = b; x < b + nb; x++)
            prefetch_range((const uint8_t *)a->v_cache + ((const uint8_t *)kt[x] - (const uint8_t *)a->k_cache),
                           (size_t)unit);
        k->attn_qk(qbuf, hd, nq, kt + b, type, bs, cnt, hd, scale, scores + i, ld);
    }
    if (q8)
        for (int32_t j = 0; j < max_vis; j++) {
            ksc[j] = slot_scale(a->k_cache, a, s, j, g, unit);
            vsc[j] = slot_scale(a->v_cache, a, s, j, g, unit);
        }

    /* per row: extra slots (one by one, after the row's own visible ones), softmax
     * numerators in place (q8_0, fp8: then weighted by the V scales) */
    for (int32_t ri = 0; ri < nr; ri++) {
        const int32_t r = r0 + ri;
        const int32_t n_vis = bt->n_visible[r], n_extra = row_n_extra(a, r), n_tot = n_vis + n_extra;
        int32_t tbuf[TDM_TREE_MAX_NODES];
        const int32_t *extra = n_extra ? row_extra(bt, r, tbuf) : NULL;
        const float *q = qbuf + (int64_t)ri * group * hd;
        float *sc = scores + (int64_t)ri * group * ld; /* [group][ld] */
        if (n_tot == 0) continue;
        if (q8) scale_cols(sc, ld, group, ksc, n_vis);
        for (int32_t e = 0; e < n_extra; e++) {
            /* the key's column of its block, read as a one-slot block */
            const void *col = (const uint8_t *)a->k_cache + unit_offset(a, s, extra[e], g, unit) + (extra[e] % bs) * esz;
            k->attn_qk(q, hd, group, &col, type, bs, 1, hd, scale, sc + n_vis + e, ld);
            if (q8) {
                const float d = slot_scale(a->k_cache, a, s, extra[e], g, unit);
                scale_cols(sc + n_vis + e, ld, group, &d, 1);
            }
        }
        /* sliding window: the visible slots before lo get probability 0 (extra
         * slots, after the visible ones, are always seen) */
        const int32_t lo = a->window > 0 ? TDM_MIN(n_vis, TDM_MAX(0, bt->pos[r] - a->window + 1)) : 0;
        for (int32_t h = 0; h < group; h++) {
            float *sh = sc + h * ld;
            if (a->softcap > 0)
                for (int32_t j = lo; j < n_tot; j++) sh[j] = tdm_cpu_softcap1(sh[j], a->softcap);
            for (int32_t j = 0; j < lo; j++) sh[j] = 0.0f;
            inv[ri * group + h] = lo < n_tot ? 1.0f / k->softmax_num(sh + lo, n_tot - lo) : 0.0f;
        }
        if (q8) { /* (slots outside the window keep probability 0, whatever their scale) */
            scale_cols(sc + lo, ld, group, vsc + lo, n_vis - lo);
            for (int32_t e = 0; e < n_extra; e++) {
                const float d = slot_scale(a->v_cache, a, s, extra[e], g, unit);
                scale_cols(sc + n_vis + e, ld, group, &d, 1);
            }
        }
    }

    /* weighted sum of V, per block of visible slots: consecutive rows that see the
     * whole block share one pass over it (their query vectors are consecutive in
     * scores and acc); a row that sees part of it gets its own pass */
    memset(acc, 0, (size_t)nq * hd * sizeof(float));
    for (int32_t i = 0, b = 0; i < max_vis; b++) {
        int32_t cnt = TDM_MIN(bs, max_vis - i);
        const uint8_t *vb = (const uint8_t *)a->v_cache + ((int64_t)s->blocks[b] * a->n_kv_head + g) * unit;
        for (int32_t ri = 0; ri < nr;) {
            int32_t nv = bt->n_visible[r0 + ri], rj = ri + 1;
            if (nv >= i + cnt) {
                while (rj < nr && bt->n_visible[r0 + rj] >= i + cnt) rj++;
                k->attn_pv(acc + (int64_t)ri * group * hd, scores + (int64_t)ri * group * ld + i, ld,
                           (rj - ri) * group, vb, type, cnt, hd);
            } else if (nv > i) {
                k->attn_pv(acc + (int64_t)ri * group * hd, scores + (int64_t)ri * group * ld + i, ld, group,
                           vb, type, nv - i, hd);
            }
            ri = rj;
        }
        i += cnt;
    }

    for (int32_t ri = 0; ri < nr; ri++) {
        const int32_t r = r0 + ri;
        const int32_t n_vis = bt->n_visible[r], n_extra = row_n_extra(a, r);
        int32_t tbuf[TDM_TREE_MAX_NODES];
        const int32_t *extra = n_extra ? row_extra(bt, r, tbuf) : NULL;
        const float *sc = scores + (int64_t)ri * group * ld;
        float *ar = acc + (int64_t)ri * group * hd;
        float *out = io->out + (int64_t)r * io->out_stride + (int64_t)gq * group * hd;
        if (n_vis + n_extra == 0) {
            memset(out, 0, (size_t)group * hd * sizeof(float));
            continue;
        }
        for (int32_t e = 0; e < n_extra; e++) {
            const int32_t slot = extra[e];
            const uint8_t *row = (const uint8_t *)a->v_cache + unit_offset(a, s, slot, g, unit) +
                                 (int64_t)(slot % bs) * hd * esz;
            k->attn_pv(ar, sc + n_vis + e, ld, group, row, type, 1, hd);
        }
        for (int32_t h = 0; h < group; h++)
            for (int32_t d = 0; d < hd; d++) out[h * hd + d] = ar[h * hd + d] * inv[ri * group + h];
    }
}

static inline int64_t attn_round16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* Scratch floats of one thread: acc, kt, qbuf, scores, inv, ksc, vsc (each 64-byte
 * aligned). */
enum { ATTN_PARTS = 7 };
static void attn_scratch_parts(const tdm_attn_args *a, int64_t ld, int64_t parts[ATTN_PARTS]) {
    int64_t group = a->n_head / a->n_kv_head, hd = a->head_dim;
    parts[0] = attn_round16(TDM_ATTN_SLICE * group * hd);
    parts[1] = attn_round16(((ld + a->block_size - 1) / a->block_size) * (int64_t)(sizeof(void *) / sizeof(float)));
    parts[2] = attn_round16(TDM_ATTN_SLICE * group * hd);
    parts[3] = attn_round16(TDM_ATTN_SLICE * group * ld);
    parts[4] = attn_round16(TDM_ATTN_SLICE * group);
    parts[5] = parts[6] = tdm_kv_scaled(a->cache_type) ? attn_round16(ld) : 0;
}

size_t tdm_cpu_attn_scratch(const tdm_attn_args *a, int64_t n_tot_max) {
    int64_t parts[ATTN_PARTS], need = 0;
    attn_scratch_parts(a, n_tot_max, parts);
    for (int i = 0; i < ATTN_PARTS; i++) need += parts[i];
    return (size_t)need;
}

void tdm_cpu_attn_run(const tdm_cpu_kernels *k, const tdm_attn_args *a, const tdm_attn_io *io,
                      int64_t n_tot_max, const int32_t *slice, int32_t g, int32_t gq, float *scratch) {
    int64_t parts[ATTN_PARTS];
    attn_scratch_parts(a, n_tot_max, parts);
    float *acc = scratch, *ktf = acc + parts[0], *qbuf = ktf + parts[1];
    float *scores = qbuf + parts[2], *inv = scores + parts[3], *ksc = inv + parts[4], *vsc = ksc + parts[5];
    attn_slice(k, a, io, n_tot_max, slice[0], slice[1], g, gq, qbuf, scores, acc, (const void **)(void *)ktf,
               inv, ksc, vsc);
}

static void attn_task(void *ctx, int64_t chunk, int ith) {
    attn_job *j = ctx;
    const tdm_attn_args *a = j->a;
    const tdm_attn_io io = {a->q, a->q_stride, a->out, (int64_t)a->n_head * a->head_dim};
    int32_t g = (int32_t)(chunk % a->n_kv_head);
    tdm_cpu_attn_run(j->c->k, a, &io, j->n_tot_max, j->slice + 2 * (chunk / a->n_kv_head), g, g,
                     j->c->scratch[ith].buf);
}

/* Checks that every slot a row reads is backed by a block; returns the largest
 * number of visible slots of a row, or -1 with err set. */
static int64_t attn_validate_rows(const tdm_attn_args *a, tdm_err *err) {
    const tdm_batch *bt = a->batch;
    int64_t max_tot = 0;
    for (int32_t r = 0; r < bt->n_rows; r++) {
        int32_t si = bt->seq[r];
        const tdm_kv_seq *s = si >= 0 ? a->seqs[si] : NULL;
        if (!s || !s->blocks) {
            tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: row %d: bad sequence %d", (int)r, (int)si);
            return -1;
        }
        int64_t cap = TDM_MIN((int64_t)s->len, (int64_t)s->n_blocks * a->block_size);
        int32_t nv = bt->n_visible[r];
        if (nv < 0 || nv > cap) {
            tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                       "attention: row %d: n_visible %d outside the sequence (len %d, %d blocks)",
                       (int)r, (int)nv, (int)s->len, (int)s->n_blocks);
            return -1;
        }
        for (int32_t blk = 0; blk < (nv + a->block_size - 1) / a->block_size; blk++)
            if (s->blocks[blk] < 0) {
                tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: row %d: block %d has id %d", (int)r,
                           (int)blk, (int)s->blocks[blk]);
                return -1;
            }
        int32_t ne = 0;
        const uint64_t tm = row_mask(bt, r);
        if (tm) {
            if (bt->extra_off && bt->extra_off[r + 1] != bt->extra_off[r]) {
                tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: row %d has both extra slots and a tree mask",
                           (int)r);
                return -1;
            }
            const int32_t top = nv + 63 - __builtin_clzll(tm); /* the highest slot it sees */
            if (top >= cap || s->blocks[top / a->block_size] < 0) {
                tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                           "attention: row %d: tree slot %d outside the sequence (len %d)", (int)r, (int)top,
                           (int)s->len);
                return -1;
            }
            for (int32_t blk = nv / a->block_size; blk <= top / a->block_size; blk++)
                if (s->blocks[blk] < 0) {
                    tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: row %d: block %d has id %d", (int)r,
                               (int)blk, (int)s->blocks[blk]);
                    return -1;
                }
            ne = __builtin_popcountll(tm);
        } else if (bt->extra_off) {
            int32_t o0 = bt->extra_off[r], o1 = bt->extra_off[r + 1];
            if (o0 < 0 || o1 < o0 || !bt->extra_slot) {
                tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: row %d: bad extra offsets [%d, %d)",
                           (int)r, (int)o0, (int)o1);
                return -1;
            }
            ne = o1 - o0;
            for (int32_t e = o0; e < o1; e++) {
                int32_t slot = bt->extra_slot[e];
                if (slot < 0 || slot >= cap || s->blocks[slot / a->block_size] < 0) {
                    tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                               "attention: row %d: extra slot %d outside the sequence (len %d)", (int)r,
                               (int)slot, (int)s->len);
                    return -1;
                }
            }
        }
        max_tot = TDM_MAX(max_tot, (int64_t)nv + ne);
    }
    return max_tot;
}

int64_t tdm_cpu_attn_check(const tdm_attn_args *a, tdm_err *err) {
    if (!a || !a->batch) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: NULL args or batch");
        return -1;
    }
    const tdm_batch *bt = a->batch;
    if (bt->n_rows < 0) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: n_rows %d", (int)bt->n_rows);
        return -1;
    }
    if (bt->n_rows == 0) return 0;
    if (!tdm_kv_type_ok(a->cache_type)) {
        tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: cache type %s", tdm_dtype_name(a->cache_type));
        return -1;
    }
    if (a->n_head <= 0 || a->n_kv_head <= 0 || a->n_head % a->n_kv_head != 0 || a->head_dim <= 0 ||
        a->block_size <= 0 || (int64_t)a->n_head * a->head_dim > a->q_stride) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                   "attention: n_head %d, n_kv_head %d, head_dim %d, block_size %d, q_stride %d",
                   (int)a->n_head, (int)a->n_kv_head, (int)a->head_dim, (int)a->block_size, (int)a->q_stride);
        return -1;
    }
    if (a->n_head > 4096 || a->head_dim > 65536) {
        tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: n_head %d / head_dim %d too large", (int)a->n_head,
                   (int)a->head_dim);
        return -1;
    }
    if (!a->seqs || !a->q || !a->out || !a->k_cache || !a->v_cache || !bt->seq || !bt->n_visible) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: NULL pointer");
        return -1;
    }
    if (!isfinite(a->scale)) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: scale %g", (double)a->scale);
        return -1;
    }
    if (a->window < 0 || !(a->softcap >= 0 && isfinite(a->softcap)) || (a->window > 0 && !bt->pos)) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: window %d, softcap %g%s", (int)a->window,
                   (double)a->softcap, a->window > 0 && !bt->pos ? ", NULL positions" : "");
        return -1;
    }
    int64_t max_tot = attn_validate_rows(a, err);
    return max_tot < 0 ? -1 : TDM_MAX(max_tot, 1);
}

int32_t *tdm_cpu_attn_slices(const tdm_batch *bt, int32_t per, int32_t *buf, int32_t cap, int32_t *n_slices) {
    int32_t n = bt->n_rows, *sl = buf, n_sl = 0;
    if (n > cap && !(sl = malloc((size_t)n * 2 * sizeof *sl))) return NULL;
    for (int32_t r = 0; r < n;) {
        int32_t len = 1;
        while (r + len < n && len < per && bt->seq[r + len] == bt->seq[r]) len++;
        sl[2 * n_sl] = r;
        sl[2 * n_sl + 1] = len;
        n_sl++;
        r += len;
    }
    *n_slices = n_sl;
    return sl;
}

tandem_status tdm_cpu_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *err) {
    tdm_cpu *c = tdm_cpu_of(b, "attention", err);
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    int64_t max_tot = tdm_cpu_attn_check(a, err);
    if (max_tot < 0) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    if (max_tot == 0) return TANDEM_OK; /* no rows */
    const tdm_batch *bt = a->batch;

    /* Slices: runs of consecutive rows of one sequence, cut into pieces of at most
     * TDM_ATTN_SLICE rows, smaller when that leaves too few chunks for the threads. */
    int32_t n = bt->n_rows, per = TDM_ATTN_SLICE, n_sl;
    while (per > 1 && ((int64_t)n + per - 1) / per * a->n_kv_head < (int64_t)c->n_threads) per /= 2;
    int32_t stack_sl[2 * 64], *sl = tdm_cpu_attn_slices(bt, per, stack_sl, 64, &n_sl);
    if (!sl) return tdm_seterr(err, TANDEM_ERR_NOMEM, "attention: out of memory");
    attn_job j = {c, a, sl, max_tot};
    tandem_status st = tdm_cpu_scratch_reserve(c, tdm_cpu_attn_scratch(a, max_tot), err);
    if (st == TANDEM_OK) {
        int64_t n_chunks = (int64_t)n_sl * a->n_kv_head;
        int64_t work = (int64_t)n * a->n_head * (max_tot + 1) * a->head_dim; /* upper bound */
        tdm_threadpool_run(c->pool, n_chunks, tdm_cpu_nth(c, TDM_MIN(work, n_chunks * 16384), 16384),
                           attn_task, &j);
    }
    if (sl != stack_sl) free(sl);
    return st;
}
