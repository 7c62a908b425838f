/* ref_ops.c - reference implementations of the backend ops (see ref_ops.h). */
#include "ref_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void ref_get_rows(const tdm_weight *w, const int32_t *ids, int32_t n, float *out) {
    for (int32_t i = 0; i < n; i++)
        tdm_row_to_f32(w->type, (const uint8_t *)w->data + (size_t)ids[i] * w->row_bytes,
                       out + (size_t)i * w->cols, w->cols);
}

void ref_rmsnorm(const float *x, const float *gamma, int32_t n, int32_t dim, float eps, float *out) {
    for (int32_t i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * dim;
        double ss = 0;
        for (int32_t k = 0; k < dim; k++) ss += (double)xi[k] * xi[k];
        double inv = 1.0 / sqrt(ss / dim + eps);
        for (int32_t k = 0; k < dim; k++) out[(size_t)i * dim + k] = (float)(xi[k] * inv * gamma[k]);
    }
}

void ref_matmul(const tdm_weight *w, const float *x, int32_t n, float *y, bool accumulate) {
    float *row = malloc((size_t)w->cols * sizeof(float));
    if (!row) return;
    for (int64_t r = 0; r < w->rows; r++) {
        tdm_row_to_f32(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, row, w->cols);
        for (int32_t i = 0; i < n; i++) {
            double s = 0;
            for (int64_t k = 0; k < w->cols; k++) s += (double)x[(size_t)i * w->cols + k] * row[k];
            float *yi = &y[(size_t)i * w->rows + r];
            *yi = accumulate ? (float)(*yi + s) : (float)s;
        }
    }
    free(row);
}

void ref_add_bias(float *y, const float *bias, int32_t n, int32_t dim) {
    for (int32_t i = 0; i < n; i++)
        for (int32_t k = 0; k < dim; k++) y[(size_t)i * dim + k] += bias[k];
}

void ref_rope(float *x, int32_t n, int32_t row_stride, int32_t n_head, int32_t head_dim,
              const int32_t *pos, const tdm_rope_params *rp) {
    int32_t half = rp->n_rot / 2;
    for (int32_t i = 0; i < n; i++)
        for (int32_t h = 0; h < n_head; h++) {
            float *v = x + (size_t)i * row_stride + (size_t)h * head_dim;
            for (int32_t t = 0; t < half; t++) {
                double f = rp->freq ? rp->freq[t] : (double)rp->freq_scale * pow((double)rp->freq_base, -2.0 * t / rp->n_rot);
                double theta = (double)pos[i] * f, ms = rp->mscale == 0 ? 1.0 : (double)rp->mscale;
                int32_t a = rp->neox ? t : 2 * t, b = rp->neox ? t + half : 2 * t + 1;
                double x0 = v[a], x1 = v[b];
                v[a] = (float)((x0 * cos(theta) - x1 * sin(theta)) * ms);
                v[b] = (float)((x0 * sin(theta) + x1 * cos(theta)) * ms);
            }
        }
}

void ref_swiglu(const float *gate_up, int32_t n, int32_t ff, float *out) {
    for (int32_t i = 0; i < n; i++)
        for (int32_t k = 0; k < ff; k++) {
            double g = gate_up[(size_t)i * 2 * ff + k], u = gate_up[(size_t)i * 2 * ff + ff + k];
            out[(size_t)i * ff + k] = (float)(g / (1.0 + exp(-g)) * u);
        }
}

void ref_gather_rows(const float *x, const int32_t *rows, int32_t n, int32_t dim, float *out) {
    for (int32_t i = 0; i < n; i++)
        for (int32_t k = 0; k < dim; k++) out[(size_t)i * dim + k] = x[(size_t)rows[i] * dim + k];
}

/* Element index of (slot, kv head g, d) in V ([n_blocks][n_kv_head][bs][hd]) and in K
 * ([n_blocks][n_kv_head][hd][bs], backend.h), for f32 and f16 caches. */
static size_t ref_cache_index(const tdm_kv_seq *s, int32_t slot, int32_t g, int32_t d,
                              int32_t n_kv_head, int32_t block_size, int32_t head_dim) {
    size_t block = (size_t)s->blocks[slot / block_size];
    size_t pos = (size_t)(slot % block_size);
    return ((block * n_kv_head + g) * block_size + pos) * head_dim + d;
}

static size_t ref_k_index(const tdm_kv_seq *s, int32_t slot, int32_t g, int32_t d, int32_t n_kv_head,
                          int32_t block_size, int32_t head_dim) {
    size_t block = (size_t)s->blocks[slot / block_size];
    size_t pos = (size_t)(slot % block_size);
    return ((block * n_kv_head + g) * head_dim + d) * block_size + pos;
}

/* q8_0 and fp8 (src/base/kv_layout.h): the (block, kv head) unit of a slot, its
 * quant / code of element d (K: [hd][bs], V: [bs][hd]) and its scale. */
typedef struct ref_q8_at {
    uint8_t *unit;
    size_t q;      /* byte of the quant in the unit */
    size_t scale;  /* byte of the slot's f32 scale in the unit */
} ref_q8_at;

static ref_q8_at ref_q8(const void *cache, bool is_k, const tdm_kv_seq *s, int32_t slot, int32_t g, int32_t d,
                        int32_t n_kv_head, int32_t bs, int32_t hd) {
    size_t unit = (size_t)tdm_kv_unit_bytes(TDM_Q8_0, bs, hd) /* (fp8's too) */, pos = (size_t)(slot % bs);
    size_t block = (size_t)s->blocks[slot / bs];
    ref_q8_at at = {(uint8_t *)cache + (block * n_kv_head + g) * unit,
                    is_k ? (size_t)d * bs + pos : pos * hd + d,
                    (size_t)tdm_kv_scale_off(bs, hd) + 4 * pos};
    return at;
}

float ref_kv_scale(const void *cache, bool is_k, const tdm_kv_seq *s, int32_t slot, int32_t g, int32_t n_kv_head,
                      int32_t bs, int32_t hd) {
    ref_q8_at at = ref_q8(cache, is_k, s, slot, g, 0, n_kv_head, bs, hd);
    float sc;
    memcpy(&sc, at.unit + at.scale, 4);
    return sc;
}

double ref_kv_get(const void *cache, uint32_t type, bool is_k, const tdm_kv_seq *s, int32_t slot, int32_t g,
                         int32_t d, int32_t n_kv_head, int32_t bs, int32_t hd) {
    if (tdm_kv_scaled(type)) {
        ref_q8_at at = ref_q8(cache, is_k, s, slot, g, d, n_kv_head, bs, hd);
        const double q = type == TDM_Q8_0 ? (double)(int8_t)at.unit[at.q] : (double)tdm_e4m3_to_f32(at.unit[at.q]);
        return (double)ref_kv_scale(cache, is_k, s, slot, g, n_kv_head, bs, hd) * q;
    }
    size_t i = is_k ? ref_k_index(s, slot, g, d, n_kv_head, bs, hd) : ref_cache_index(s, slot, g, d, n_kv_head, bs, hd);
    if (type == TDM_F16) return tdm_f16_to_f32(((const uint16_t *)cache)[i]);
    return ((const float *)cache)[i];
}

/* q8_0 / fp8 (type): one head vector x[hd] into (slot, g) of a cache, as kv_layout.h
 * defines it (fp8: the E4M3 conversion is dtype.c's, checked against a nearest-code
 * search by tests/test_fp8.c). */
static void ref_q8_write(uint32_t type, void *cache, bool is_k, const tdm_kv_seq *s, int32_t slot, int32_t g,
                         const float *x, int32_t n_kv_head, int32_t bs, int32_t hd) {
    float amax = 0;
    bool finite = true;
    for (int32_t d = 0; d < hd; d++) {
        finite = finite && isfinite(x[d]);
        if (fabsf(x[d]) > amax) amax = fabsf(x[d]);
    }
    const float sc = finite ? amax / (type == TDM_Q8_0 ? 127.0f : 448.0f) : NAN;
    for (int32_t d = 0; d < hd; d++) {
        ref_q8_at at = ref_q8(cache, is_k, s, slot, g, d, n_kv_head, bs, hd);
        long q = 0;
        if (type == TDM_F8_E4M3) {
            at.unit[at.q] = sc > 0 ? tdm_f32_to_e4m3(x[d] / sc) : 0;
        } else if (sc > 0) {
            q = lrintf(fminf(fmaxf(x[d] / sc, -127.0f), 127.0f)); /* (ties to even; the clamp first
                                                                      keeps lrintf in range) */
            if (q > 127) q = 127;
            if (q < -127) q = -127;
        }
        if (type == TDM_Q8_0) at.unit[at.q] = (uint8_t)(int8_t)q;
        if (d == 0) memcpy(at.unit + at.scale, &sc, 4);
    }
}

void ref_kv_write(const tdm_kv_write_args *a) {
    for (int32_t r = 0; r < a->batch->n_rows; r++) {
        const tdm_kv_seq *s = a->seqs[a->batch->seq[r]];
        const int32_t slot = a->batch->slot[r];
        for (int32_t g = 0; g < a->n_kv_head; g++) {
            const float *kr = a->k + (size_t)r * a->row_stride + (size_t)g * a->head_dim;
            const float *vr = a->v + (size_t)r * a->row_stride + (size_t)g * a->head_dim;
            if (tdm_kv_scaled(a->cache_type)) {
                const int32_t nkv = a->n_kv_head, bs = a->block_size, hd = a->head_dim;
                ref_q8_write(a->cache_type, a->k_cache, true, s, slot, g, kr, nkv, bs, hd);
                ref_q8_write(a->cache_type, a->v_cache, false, s, slot, g, vr, nkv, bs, hd);
                continue;
            }
            for (int32_t d = 0; d < a->head_dim; d++) {
                size_t ci = ref_cache_index(s, slot, g, d, a->n_kv_head, a->block_size, a->head_dim);
                size_t ki = ref_k_index(s, slot, g, d, a->n_kv_head, a->block_size, a->head_dim);
                if (a->cache_type == TDM_F16) {
                    ((uint16_t *)a->k_cache)[ki] = tdm_f32_to_f16(kr[d]);
                    ((uint16_t *)a->v_cache)[ci] = tdm_f32_to_f16(vr[d]);
                } else {
                    ((float *)a->k_cache)[ki] = kr[d];
                    ((float *)a->v_cache)[ci] = vr[d];
                }
            }
        }
    }
}

void ref_attention(const tdm_attn_args *a) {
    const tdm_batch *bt = a->batch;
    int32_t group = a->n_head / a->n_kv_head, hd = a->head_dim, nkv = a->n_kv_head, bs = a->block_size;
    for (int32_t r = 0; r < bt->n_rows; r++) {
        const tdm_kv_seq *s = a->seqs[bt->seq[r]];
        int32_t n_extra = bt->extra_off ? bt->extra_off[r + 1] - bt->extra_off[r] : 0;
        int32_t n_tot = bt->n_visible[r] + n_extra;
        int32_t *slots = malloc((size_t)(n_tot + 1) * sizeof(int32_t));
        double *p = malloc((size_t)(n_tot + 1) * sizeof(double));
        if (!slots || !p) {
            free(slots);
            free(p);
            return;
        }
        int32_t n_seen = 0; /* (a window hides the visible slots of positions pos - window and older) */
        for (int32_t i = 0; i < bt->n_visible[r]; i++)
            if (a->window <= 0 || bt->pos[r] - i < a->window) slots[n_seen++] = i;
        for (int32_t e = 0; e < n_extra; e++) slots[n_seen++] = bt->extra_slot[bt->extra_off[r] + e];
        n_tot = n_seen;
        for (int32_t h = 0; h < a->n_head; h++) {
            int32_t g = h / group;
            const float *q = a->q + (size_t)r * a->q_stride + (size_t)h * hd;
            float *out = a->out + (size_t)r * a->n_head * hd + (size_t)h * hd;
            double m = -INFINITY, sum = 0;
            for (int32_t i = 0; i < n_tot; i++) {
                double dot = 0;
                for (int32_t d = 0; d < hd; d++)
                    dot += (double)q[d] * ref_kv_get(a->k_cache, a->cache_type, true, s, slots[i], g, d, nkv, bs, hd);
                p[i] = dot * a->scale;
                if (a->softcap > 0) p[i] = a->softcap * tanh(p[i] / a->softcap);
                if (p[i] > m) m = p[i];
            }
            for (int32_t i = 0; i < n_tot; i++) {
                p[i] = exp(p[i] - m);
                sum += p[i];
            }
            for (int32_t d = 0; d < hd; d++) {
                double o = 0;
                for (int32_t i = 0; i < n_tot; i++)
                    o += p[i] * ref_kv_get(a->v_cache, a->cache_type, false, s, slots[i], g, d, nkv, bs, hd);
                out[d] = n_tot > 0 ? (float)(o / sum) : 0.0f;
            }
        }
        free(slots);
        free(p);
    }
}

double ref_nrm_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) return 1e30;
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    if (den == 0) return num == 0 ? 0 : 1e30;
    return sqrt(num / den);
}
