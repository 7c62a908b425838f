/* ops.c - the element-wise / row-wise CPU ops: get_rows, rmsnorm, add_bias, rope,
 * swiglu, gather_rows, kv_write.  Each validates its arguments, then hands rows
 * (one chunk each) to the thread pool when the work is large enough to pay for the
 * dispatch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

/* Elements per thread below which an op stays on the calling thread. */
#define MIN_WORK 16384

#define GET_CPU(op)                                                     \
    tdm_cpu *c = tdm_cpu_of(b, op, err);                                \
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG

/* ---- get_rows ------------------------------------------------------------------ */

typedef struct get_rows_job {
    const tdm_cpu *c;
    const tdm_weight *w;
    const int32_t *ids;
    int32_t n;
    float *out; /* [n][cols] */
} get_rows_job;

static void get_rows_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    get_rows_job *j = ctx;
    const tdm_weight *w = j->w;
    float *o = j->out + i * w->cols;
    if (w->layout == TDM_LAYOUT_ROWS) {
        j->c->k->convert_rows(w, j->ids[i], 1, o, w->cols);
        return;
    }
    /* other layouts (matmul weights, not embeddings): element by element */
    for (int64_t k = 0; k < w->cols; k++)
        o[k] = tdm_weight_elem(w->type, w->layout, w->cols, w->row_bytes, w->data, j->ids[i], k);
}

tandem_status tdm_cpu_get_rows(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n,
                               float *out, tdm_err *err) {
    GET_CPU("get_rows");
    tandem_status st = tdm_cpu_check_weight(w, "get_rows", err);
    if (st != TANDEM_OK) return st;
    if (n < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "get_rows: n = %d", (int)n);
    if (n == 0) return TANDEM_OK;
    if (!ids || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "get_rows: NULL ids or out");
    if ((st = tdm_check_ids(ids, n, w->rows, "get_rows", err))) return st;
    get_rows_job j = {c, w, ids, n, out};
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, (int64_t)n * w->cols, MIN_WORK), get_rows_task, &j);
    return TANDEM_OK;
}

/* ---- rmsnorm ------------------------------------------------------------------- */

typedef struct rmsnorm_job {
    const tdm_cpu *c;
    const float *x, *gamma;
    int32_t n, dim;
    float eps;
    float *out;
} rmsnorm_job;

static void rmsnorm_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    rmsnorm_job *j = ctx;
    j->c->k->rmsnorm_row(j->x + i * j->dim, j->gamma, j->dim, j->eps, j->out + i * j->dim);
}

tandem_status tdm_cpu_rmsnorm(tdm_backend *b, const float *x, const float *gamma, int32_t n,
                              int32_t dim, float eps, float *out, tdm_err *err) {
    GET_CPU("rmsnorm");
    if (n < 0 || dim <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rmsnorm: n = %d, dim = %d", (int)n, (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!x || !gamma || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rmsnorm: NULL pointer");
    if (!(eps >= 0)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rmsnorm: eps %g", (double)eps);
    rmsnorm_job j = {c, x, gamma, n, dim, eps, out};
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, (int64_t)n * dim, MIN_WORK), rmsnorm_task, &j);
    return TANDEM_OK;
}

/* ---- add_bias ------------------------------------------------------------------ */

tandem_status tdm_cpu_add_bias(tdm_backend *b, float *y, const float *bias, int32_t n, int32_t dim,
                               tdm_err *err) {
    GET_CPU("add_bias");
    (void)c;
    if (n < 0 || dim <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "add_bias: n = %d, dim = %d", (int)n, (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!y || !bias) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "add_bias: NULL pointer");
    for (int64_t i = 0; i < n; i++) {
        float *yi = y + i * dim;
        for (int32_t k = 0; k < dim; k++) yi[k] += bias[k];
    }
    return TANDEM_OK;
}

/* ---- rope ---------------------------------------------------------------------- */

#define ROPE_MAX_ROT 1024
#define ROPE_MAX_CACHED_POS (1 << 20)

typedef struct rope_job {
    const tdm_cpu *c;
    float *x;
    int32_t n, row_stride, n_head, head_dim, half;
    const int32_t *pos;
    bool neox;
    const float *cs; /* [pos][half][2] */
} rope_job;

static void rope_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    rope_job *j = ctx;
    j->c->k->rope_row(j->x + i * j->row_stride, j->n_head, j->head_dim, j->half, j->neox,
                      j->cs + (size_t)j->pos[i] * (size_t)j->half * 2);
}

/* The cache for a table freq[n_rot / 2] and magnitude mscale, grown to hold
 * positions up to max_pos; NULL on allocation failure. */
static tdm_rope_cache *rope_cache_get(tdm_cpu *c, int32_t n_rot, const double *freq, float mscale, int32_t max_pos) {
    int32_t half = n_rot / 2;
    tdm_rope_cache *rc = NULL;
    for (int i = 0; i < TDM_ROPE_CACHES; i++) {
        tdm_rope_cache *t = &c->rope[i];
        if (t->inv_freq && t->n_rot == n_rot && t->mscale == mscale &&
            memcmp(t->inv_freq, freq, (size_t)half * sizeof(double)) == 0) {
            rc = t;
            break;
        }
    }
    if (!rc) {
        rc = &c->rope[c->rope_next];
        c->rope_next = (c->rope_next + 1) % TDM_ROPE_CACHES;
        free(rc->cs);
        free(rc->valid);
        free(rc->inv_freq);
        memset(rc, 0, sizeof *rc);
        rc->inv_freq = malloc((size_t)half * sizeof(double));
        if (!rc->inv_freq) return NULL;
        rc->n_rot = n_rot;
        rc->mscale = mscale;
        memcpy(rc->inv_freq, freq, (size_t)half * sizeof(double));
    }
    if (max_pos >= rc->cap_pos) {
        int32_t cap = rc->cap_pos ? rc->cap_pos : 1024;
        while (cap <= max_pos) cap *= 2;
        float *ncs = realloc(rc->cs, (size_t)cap * (size_t)half * 2 * sizeof(float));
        if (!ncs) return NULL;
        rc->cs = ncs;
        uint8_t *nv = realloc(rc->valid, (size_t)cap);
        if (!nv) return NULL;
        memset(nv + rc->cap_pos, 0, (size_t)(cap - rc->cap_pos));
        rc->valid = nv;
        rc->cap_pos = cap;
    }
    return rc;
}

const float *tdm_cpu_rope_table(tdm_cpu *c, const tdm_rope_params *rp, int32_t head_dim, const int32_t *pos,
                                int32_t n, tdm_err *err) {
    if (!rp) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: NULL params");
        return NULL;
    }
    if (rp->n_rot <= 0 || rp->n_rot % 2 != 0 || rp->n_rot > head_dim) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: n_rot %d (head_dim %d)", (int)rp->n_rot, (int)head_dim);
        return NULL;
    }
    if (rp->n_rot > ROPE_MAX_ROT) {
        tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "rope: n_rot %d > %d", (int)rp->n_rot, ROPE_MAX_ROT);
        return NULL;
    }
    if (!rp->freq && (!(rp->freq_base > 0) || !isfinite(rp->freq_scale))) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: freq_base %g, freq_scale %g", (double)rp->freq_base,
                   (double)rp->freq_scale);
        return NULL;
    }
    const float mscale = rp->mscale == 0.0f ? 1.0f : rp->mscale;
    if (!isfinite(mscale)) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: mscale %g", (double)rp->mscale);
        return NULL;
    }
    if (n > 0 && !pos) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: NULL pos");
        return NULL;
    }
    int32_t max_pos = 0;
    for (int32_t i = 0; i < n; i++) {
        if (pos[i] < 0 || pos[i] >= ROPE_MAX_CACHED_POS) {
            tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: position %d out of range [0, %d)", (int)pos[i],
                       ROPE_MAX_CACHED_POS);
            return NULL;
        }
        max_pos = pos[i] > max_pos ? pos[i] : max_pos;
    }
    int32_t half = rp->n_rot / 2;
    double dflt[ROPE_MAX_ROT / 2];
    const double *freq = rp->freq;
    if (!freq) {
        for (int32_t t = 0; t < half; t++)
            dflt[t] = (double)rp->freq_scale * pow((double)rp->freq_base, -2.0 * t / rp->n_rot);
        freq = dflt;
    }
    tdm_rope_cache *rc = rope_cache_get(c, rp->n_rot, freq, mscale, max_pos);
    if (!rc) {
        tdm_seterr(err, TANDEM_ERR_NOMEM, "rope: out of memory for the angle cache");
        return NULL;
    }
    for (int32_t i = 0; i < n; i++) { /* fill missing positions (single-threaded) */
        int32_t p = pos[i];
        if (rc->valid[p]) continue;
        float *cs = rc->cs + (size_t)p * (size_t)half * 2;
        for (int32_t t = 0; t < half; t++) {
            double theta = (double)p * rc->inv_freq[t];
            cs[2 * t] = (float)(cos(theta) * (double)mscale);
            cs[2 * t + 1] = (float)(sin(theta) * (double)mscale);
        }
        rc->valid[p] = 1;
    }
    return rc->cs;
}

tandem_status tdm_cpu_rope(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                           int32_t head_dim, const int32_t *pos, const tdm_rope_params *rp,
                           tdm_err *err) {
    GET_CPU("rope");
    if (n < 0 || n_head <= 0 || head_dim <= 0 || (int64_t)n_head * head_dim > row_stride)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "rope: n = %d, n_head = %d, head_dim = %d, row_stride = %d", (int)n,
                          (int)n_head, (int)head_dim, (int)row_stride);
    if (n > 0 && !x) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: NULL x");
    const float *cs = tdm_cpu_rope_table(c, rp, head_dim, pos, n, err);
    if (!cs) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    if (n == 0) return TANDEM_OK;
    rope_job j = {.c = c, .x = x, .n = n, .row_stride = row_stride, .n_head = n_head, .head_dim = head_dim,
                  .half = rp->n_rot / 2, .pos = pos, .neox = rp->neox, .cs = cs};
    int64_t work = (int64_t)n * n_head * rp->n_rot;
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, work, MIN_WORK), rope_task, &j);
    return TANDEM_OK;
}

/* ---- swiglu -------------------------------------------------------------------- */

typedef struct swiglu_job {
    const tdm_cpu *c;
    const float *gate_up; /* [n][2 * ff] */
    int32_t n, ff;
    float *out;           /* [n][ff] */
} swiglu_job;

static void swiglu_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    swiglu_job *j = ctx;
    {
        const float *g = j->gate_up + i * 2 * j->ff, *u = g + j->ff;
        float *o = j->out + i * j->ff;
        j->c->k->swiglu(g, u, o, j->ff);
    }
}

tandem_status tdm_cpu_swiglu(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff,
                             float *out, tdm_err *err) {
    GET_CPU("swiglu");
    if (n < 0 || ff <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "swiglu: n = %d, ff = %d", (int)n, (int)ff);
    if (n == 0) return TANDEM_OK;
    if (!gate_up || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "swiglu: NULL pointer");
    swiglu_job j = {c, gate_up, n, ff, out};
    /* an exp and a division per element: two threads pay from about 4 rows of 1024 */
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, (int64_t)n * ff, 2048), swiglu_task, &j);
    return TANDEM_OK;
}

/* ---- gather_rows --------------------------------------------------------------- */

tandem_status tdm_cpu_gather_rows(tdm_backend *b, const float *x, const int32_t *rows, int32_t n,
                                  int32_t dim, float *out, tdm_err *err) {
    GET_CPU("gather_rows");
    (void)c;
    if (n < 0 || dim <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gather_rows: n = %d, dim = %d", (int)n,
                          (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!x || !rows || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gather_rows: NULL pointer");
    for (int32_t i = 0; i < n; i++)
        if (rows[i] < 0)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gather_rows: row %d at %d", (int)rows[i],
                              (int)i);
    for (int32_t i = 0; i < n; i++)
        memmove(out + (int64_t)i * dim, x + (int64_t)rows[i] * dim, (size_t)dim * sizeof(float));
    return TANDEM_OK;
}

/* ---- kv_write ------------------------------------------------------------------ */

tandem_status tdm_cpu_kv_write_check_rows(const tdm_kv_write_args *a, tdm_err *err) {
    const tdm_batch *bt = a->batch;
    int32_t bs = a->block_size;
    for (int32_t r = 0; r < bt->n_rows; r++) {
        int32_t si = bt->seq[r], slot = bt->slot[r];
        const tdm_kv_seq *s = si >= 0 ? a->seqs[si] : NULL;
        if (!s || !s->blocks)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: row %d: bad sequence %d", (int)r,
                              (int)si);
        if (slot < 0 || slot >= s->len || slot / bs >= s->n_blocks || s->blocks[slot / bs] < 0)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "kv_write: row %d: slot %d outside the sequence (len %d, %d blocks)",
                              (int)r, (int)slot, (int)s->len, (int)s->n_blocks);
    }
    return TANDEM_OK;
}

void tdm_cpu_kv_write_heads(const tdm_cpu *c, const tdm_kv_write_args *a, int32_t g0, int32_t ng) {
    const tdm_batch *bt = a->batch;
    const int32_t bs = a->block_size, hd = a->head_dim, nkv = a->n_kv_head;
    const uint32_t type = a->cache_type;
    const int64_t unit = tdm_kv_unit_bytes(type, bs, hd), soff = tdm_kv_scale_off(bs, hd);
    for (int32_t r = 0; r < bt->n_rows; r++) {
        const tdm_kv_seq *s = a->seqs[bt->seq[r]];
        int32_t slot = bt->slot[r], block = s->blocks[slot / bs], p = slot % bs;
        const float *k = a->k + (int64_t)r * a->row_stride, *v = a->v + (int64_t)r * a->row_stride;
        for (int32_t g = g0; g < g0 + ng; g++) {
            /* the (block, kv head) units: K [hd][bs], V [bs][hd] (kv_layout.h) */
            uint8_t *ku = (uint8_t *)a->k_cache + ((int64_t)block * nkv + g) * unit;
            uint8_t *vu = (uint8_t *)a->v_cache + ((int64_t)block * nkv + g) * unit;
            const float *kg = k + (int64_t)(g - g0) * hd, *vg = v + (int64_t)(g - g0) * hd;
            if (type == TDM_F32) {
                float *kc = (float *)(void *)ku + p;
                for (int32_t d = 0; d < hd; d++) kc[(int64_t)d * bs] = kg[d];
                memcpy(vu + (size_t)p * hd * sizeof(float), vg, (size_t)hd * sizeof(float));
            } else if (type == TDM_F16) {
                uint16_t *kc = (uint16_t *)(void *)ku + p, tmp[64];
                for (int32_t d0 = 0; d0 < hd; d0 += 64) {
                    int32_t n = TDM_MIN(64, hd - d0);
                    c->k->to_f16(kg + d0, tmp, n);
                    for (int32_t d = 0; d < n; d++) kc[(int64_t)(d0 + d) * bs] = tmp[d];
                }
                c->k->to_f16(vg, (uint16_t *)(void *)vu + (int64_t)p * hd, hd);
            } else { /* q8_0, fp8: quants / codes, then the slot's scale */
                const bool f8 = type == TDM_F8_E4M3;
                const float dk = f8 ? tdm_kv_fp8_quant_vec(kg, hd, ku + p, bs)
                                    : tdm_kv_q8_quant_vec(kg, hd, (int8_t *)ku + p, bs);
                const float dv = f8 ? tdm_kv_fp8_quant_vec(vg, hd, vu + (int64_t)p * hd, 1)
                                    : tdm_kv_q8_quant_vec(vg, hd, (int8_t *)vu + (int64_t)p * hd, 1);
                memcpy(ku + soff + 4 * (int64_t)p, &dk, 4);
                memcpy(vu + soff + 4 * (int64_t)p, &dv, 4);
            }
        }
    }
}

tandem_status tdm_cpu_kv_write(tdm_backend *b, const tdm_kv_write_args *a, tdm_err *err) {
    GET_CPU("kv_write");
    if (!a || !a->batch) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: NULL args or batch");
    const tdm_batch *bt = a->batch;
    if (bt->n_rows < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: n_rows %d", (int)bt->n_rows);
    if (bt->n_rows == 0) return TANDEM_OK;
    if (!tdm_kv_type_ok(a->cache_type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "kv_write: cache type %s",
                          tdm_dtype_name(a->cache_type));
    if (a->n_kv_head <= 0 || a->head_dim <= 0 || a->block_size <= 0 ||
        (int64_t)a->n_kv_head * a->head_dim > a->row_stride)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "kv_write: n_kv_head %d, head_dim %d, block_size %d, row_stride %d",
                          (int)a->n_kv_head, (int)a->head_dim, (int)a->block_size, (int)a->row_stride);
    if (!a->seqs || !a->k || !a->v || !a->k_cache || !a->v_cache || !bt->seq || !bt->slot)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: NULL pointer");
    tandem_status st = tdm_cpu_kv_write_check_rows(a, err);
    if (st) return st;
    tdm_cpu_kv_write_heads(c, a, 0, a->n_kv_head);
    return TANDEM_OK;
}
