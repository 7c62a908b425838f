/* attention.c - attention of batch rows over the paged KV cache (CPU).
 *
 * For each (row r, head h) pair, with kv head g = h / (n_head / n_kv_head):
 *   visible slots = [0, n_visible[r]) of the row's sequence, then the extra slots
 *   extra_slot[extra_off[r] .. extra_off[r+1]) when extra_off != NULL;
 *   score_s = scale * q . K[s];  p = softmax(score) (max subtracted);
 *   out = sum_s p_s V[s].
 * Each (row, head) pair is one chunk of the thread pool, computed entirely by one
 * thread, so the result does not depend on the thread count.
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

typedef struct attn_job {
    tdm_cpu *c;
    const tdm_attn_args *a;
    int32_t hpc;      /* heads per chunk: a divisor of the GQA group size */
    int64_t n_tot_max; /* visible slots of the widest row */
} attn_job;

static inline int32_t row_n_extra(const tdm_attn_args *a, int32_t r) {
    const int32_t *off = a->batch->extra_off;
    return off ? off[r + 1] - off[r] : 0;
}

/* Element offset of slot s of kv head g in a [n_blocks][n_kv_head][bs][hd] cache. */
static inline int64_t slot_offset(const tdm_attn_args *a, const tdm_kv_seq *s, int32_t slot,
                                  int32_t g) {
    int32_t block = s->blocks[slot / a->block_size];
    return (((int64_t)block * a->n_kv_head + g) * a->block_size + slot % a->block_size) *
           a->head_dim;
}

/* Heads [h0, h0 + nh) of row r, all in kv group g.  scores: [nh][n_tot_max],
 * acc: [nh][head_dim], kbuf: [block_size rounded up to TDM_MM_RB][head_dim]. */
static void attn_heads(const tdm_cpu_kernels *k, const tdm_attn_args *a, int64_t n_tot_max,
                       int32_t r, int32_t h0, int32_t nh, float *scores, float *acc, float *kbuf) {
    const tdm_batch *bt = a->batch;
    const tdm_kv_seq *s = a->seqs[bt->seq[r]];
    int32_t hd = a->head_dim, g = h0 / (a->n_head / a->n_kv_head);
    int32_t n_vis = bt->n_visible[r], n_extra = row_n_extra(a, r), n_tot = n_vis + n_extra;
    const int32_t *extra = n_extra ? bt->extra_slot + bt->extra_off[r] : NULL;
    const float *q = a->q + (int64_t)r * a->q_stride + (int64_t)h0 * hd;
    float *out = a->out + (int64_t)r * a->n_head * hd + (int64_t)h0 * hd;
    const float scale = a->scale;

    if (n_tot == 0) {
        memset(out, 0, (size_t)nh * hd * sizeof(float));
        return;
    }
    /* scores: per block of visible slots, K block (converted to f32) x q as a small
     * gemm [nh][hd] x [cnt][hd]^T; extra slots one by one. */
    size_t esz = a->cache_type == TDM_F16 ? 2 : 4;
    tdm_weight kw = {.type = a->cache_type, .rows = a->block_size, .cols = hd,
                     .row_bytes = (size_t)hd * esz, .data = NULL};
    for (int32_t i = 0, b = 0; i < n_vis; b++) {
        int32_t cnt = TDM_MIN(a->block_size, n_vis - i);
        int32_t padded = (cnt + TDM_MM_RB - 1) / TDM_MM_RB * TDM_MM_RB;
        int64_t base = ((int64_t)s->blocks[b] * a->n_kv_head + g) * a->block_size * hd;
        kw.data = (const uint8_t *)a->k_cache + (size_t)base * esz;
        k->convert_rows(&kw, 0, cnt, kbuf, hd);
        if (padded > cnt) memset(kbuf + (int64_t)cnt * hd, 0, (size_t)(padded - cnt) * hd * sizeof(float));
        k->gemm(q, hd, nh, kbuf, hd, cnt, hd, scores + i, n_tot_max, false);
        i += cnt;
    }
    for (int32_t e = 0; e < n_extra; e++) {
        int64_t off = slot_offset(a, s, extra[e], g);
        for (int32_t h = 0; h < nh; h++)
            scores[h * n_tot_max + n_vis + e] =
                a->cache_type == TDM_F16 ? k->dot_f16(q + h * hd, (const uint16_t *)a->k_cache + off, hd)
                                         : k->dot_f32(q + h * hd, (const float *)a->k_cache + off, hd);
    }
    for (int32_t h = 0; h < nh; h++)
        for (int32_t i = 0; i < n_tot; i++) scores[h * n_tot_max + i] *= scale;
    /* softmax numerators, in place */
    float inv[nh];
    for (int32_t h = 0; h < nh; h++) inv[h] = 1.0f / k->softmax_num(scores + h * n_tot_max, n_tot);
    /* weighted sum of V: per block of visible slots, then the extra slots */
    memset(acc, 0, (size_t)nh * hd * sizeof(float));
    for (int32_t i = 0, b = 0; i < n_vis; b++) {
        int32_t cnt = TDM_MIN(a->block_size, n_vis - i);
        int64_t base = ((int64_t)s->blocks[b] * a->n_kv_head + g) * a->block_size * hd;
        k->attn_pv(acc, scores + i, n_tot_max, nh, (const uint8_t *)a->v_cache + (size_t)base * esz,
                   a->cache_type, cnt, hd);
        i += cnt;
    }
    for (int32_t e = 0; e < n_extra; e++) {
        int64_t off = slot_offset(a, s, extra[e], g);
        k->attn_pv(acc, scores + n_vis + e, n_tot_max, nh, (const uint8_t *)a->v_cache + (size_t)off * esz,
                   a->cache_type, 1, hd);
    }
    for (int32_t h = 0; h < nh; h++)
        for (int32_t d = 0; d < hd; d++) out[h * hd + d] = acc[h * hd + d] * inv[h];
}

static inline int64_t attn_round16(int64_t n) { return (n + 15) & ~(int64_t)15; }
static inline int64_t attn_kbuf_floats(const tdm_attn_args *a) {
    return (int64_t)(a->block_size + TDM_MM_RB - 1) / TDM_MM_RB * TDM_MM_RB * a->head_dim;
}

static void attn_task(void *ctx, int64_t chunk, int ith) {
    attn_job *j = ctx;
    const tdm_attn_args *a = j->a;
    int32_t per_row = a->n_head / j->hpc;
    float *acc = j->c->scratch[ith].buf;                         /* [hpc][head_dim] */
    float *kbuf = acc + attn_round16((int64_t)j->hpc * a->head_dim); /* [bs][head_dim] */
    float *scores = kbuf + attn_round16(attn_kbuf_floats(a));       /* [hpc][n_tot_max] */
    attn_heads(j->c->k, a, j->n_tot_max, (int32_t)(chunk / per_row),
               (int32_t)(chunk % per_row) * j->hpc, j->hpc, scores, acc, kbuf);
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
        if (bt->extra_off) {
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

tandem_status tdm_cpu_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *err) {
    tdm_cpu *c = tdm_cpu_of(b, "attention", err);
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    if (!a || !a->batch) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: NULL args or batch");
    const tdm_batch *bt = a->batch;
    if (bt->n_rows < 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: n_rows %d", (int)bt->n_rows);
    if (bt->n_rows == 0) return TANDEM_OK;
    if (a->cache_type != TDM_F32 && a->cache_type != TDM_F16)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: cache type %s",
                          tdm_dtype_name(a->cache_type));
    if (a->n_head <= 0 || a->n_kv_head <= 0 || a->n_head % a->n_kv_head != 0 || a->head_dim <= 0 ||
        a->block_size <= 0 || (int64_t)a->n_head * a->head_dim > a->q_stride)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "attention: n_head %d, n_kv_head %d, head_dim %d, block_size %d, q_stride %d",
                          (int)a->n_head, (int)a->n_kv_head, (int)a->head_dim, (int)a->block_size,
                          (int)a->q_stride);
    if (a->n_head > 4096 || a->head_dim > 65536)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: n_head %d / head_dim %d too large",
                          (int)a->n_head, (int)a->head_dim);
    if (!a->seqs || !a->q || !a->out || !a->k_cache || !a->v_cache || !bt->seq || !bt->n_visible)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: NULL pointer");
    if (!isfinite(a->scale))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: scale %g", (double)a->scale);
    int64_t max_tot = attn_validate_rows(a, err);
    if (max_tot < 0) return err ? err->status : TANDEM_ERR_INVALID_ARG;

    /* Heads of one kv group are done together (one pass over K/V) unless that
     * leaves too few chunks for the threads; per-head results do not depend on it. */
    int32_t group = a->n_head / a->n_kv_head, hpc = group;
    while (hpc > 1 && (int64_t)bt->n_rows * (a->n_head / hpc) < 2 * (int64_t)c->n_threads) {
        int32_t d = hpc - 1;
        while (group % d != 0) d--;
        hpc = d;
    }
    attn_job j = {c, a, hpc, TDM_MAX(max_tot, 1)};
    size_t need = (size_t)(attn_round16((int64_t)hpc * a->head_dim) + attn_round16(attn_kbuf_floats(a)) +
                           hpc * j.n_tot_max + 16);
    tandem_status st = tdm_cpu_scratch_reserve(c, need, err);
    if (st != TANDEM_OK) return st;
    int64_t n_chunks = (int64_t)bt->n_rows * (a->n_head / hpc);
    int64_t work = (int64_t)bt->n_rows * a->n_head * (max_tot + 1) * a->head_dim; /* upper bound */
    tdm_threadpool_run(c->pool, n_chunks, tdm_cpu_nth(c, TDM_MIN(work, n_chunks * 16384), 16384),
                       attn_task, &j);
    return TANDEM_OK;
}
