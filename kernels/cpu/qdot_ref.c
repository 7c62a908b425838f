/* qdot_ref.c - the integer-dot matmul's portable parts (qdot.h): x quantisation
 * (shared by every level, so each sees the same qx), the integer forms of the weight
 * blocks, and the scalar kernel. */
#include <float.h>
#include <math.h>

#include "cpu_internal.h"
#include "qdot.h"

static size_t up64(size_t n) { return (n + 63) & ~(size_t)63; }

size_t tdm_xq_bytes(uint32_t type, int64_t cols, int32_t n) {
    size_t nb = (size_t)(cols / tdm_xq_block(type)), rows = (size_t)(n > 0 ? n : 0);
    return up64(rows * (size_t)cols) + up64(rows * nb * sizeof(float)) + up64(rows * (size_t)(cols / 16) * 2);
}

void tdm_xq_quantize(uint32_t type, const float *x, int32_t n, int64_t cols, int32_t i0, int32_t i1, void *buf,
                     tdm_xq *xq) {
    const int32_t blk = tdm_xq_block(type);
    const int64_t nb = cols / blk;
    int8_t *q = buf;
    float *d = (float *)(void *)((uint8_t *)buf + up64((size_t)n * (size_t)cols));
    int16_t *s16 = (int16_t *)(void *)((uint8_t *)d + up64((size_t)n * (size_t)nb * sizeof(float)));
    *xq = (tdm_xq){.n = n, .blk = blk, .cols = cols, .q = q, .d = d, .s16 = s16};
    for (int32_t i = i0; i < i1; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + (size_t)i * cols + b * blk;
            int8_t *qb = q + (size_t)i * cols + b * blk;
            float amax = 0;
            bool finite = true;
            for (int32_t k = 0; k < blk; k++) {
                const float a = fabsf(xb[k]);
                finite &= a <= FLT_MAX; /* false for NaN and infinities */
                amax = a > amax ? a : amax;
            }
            float id = finite && amax > 0 ? 127.0f / amax : 0.0f;
            d[(size_t)i * nb + b] = finite ? amax / 127.0f : NAN;
            for (int32_t k = 0; k < blk; k++) {
                if (!finite) { /* the block's outputs are NaN through dx; its qx are 0 */
                    qb[k] = 0;
                    continue;
                }
                /* |x id| <= 127 (+ rounding): adding and removing 1.5 * 2^23 rounds it to
                 * the nearest integer, ties to even, as lrintf does in the default mode */
                float v = xb[k] * id, r = (v + 12582912.0f) - 12582912.0f;
                qb[k] = (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : (int)r);
            }
            for (int32_t g = 0; g < blk / 16; g++) {
                int s = 0;
                for (int k = 0; k < 16; k++) s += qb[16 * g + k];
                s16[(size_t)i * (cols / 16) + b * (blk / 16) + g] = (int16_t)s;
            }
        }
}

/* ---- integer forms of the weight blocks -------------------------------------------- */

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return tdm_f16_to_f32(h);
}

void tdm_kprep_ref(uint32_t type, const uint8_t *b, tdm_kprep *p) {
    int16_t sc[16]; /* per 16 elements */
    switch (type) {
    case TDM_Q2_K: /* scales[16] qs[64] d dmin */
        for (int e = 0; e < TDM_QK_K; e++) p->q[e] = (b[16 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        for (int s = 0; s < 16; s++) sc[s] = b[s] & 15, p->c[s] = b[s] >> 4;
        p->d = h2f(b + 80), p->dm = h2f(b + 82);
        break;
    case TDM_Q3_K: { /* hmask[32] qs[64] scales[12] d */
        int8_t s3[16];
        tdm_k3_scales(b + 96, s3);
        for (int e = 0; e < TDM_QK_K; e++)
            p->q[e] = (uint8_t)(((b[32 + 32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) |
                                (((b[e % 32] >> (e / 32)) & 1) << 2));
        for (int s = 0; s < 16; s++) sc[s] = s3[s], p->c[s] = (int16_t)(4 * s3[s]);
        p->d = h2f(b + 108), p->dm = 0;
        break;
    }
    case TDM_Q4_K:   /* d dmin scales[12] qs[128] */
    case TDM_Q5_K: { /* d dmin scales[12] qh[32] qs[128] */
        uint8_t s4[8], m4[8];
        tdm_k4_scales(b + 4, s4, m4);
        const uint8_t *qs = b + (type == TDM_Q5_K ? 48 : 16);
        for (int e = 0; e < TDM_QK_K; e++) {
            uint8_t byte = qs[32 * (e / 64) + e % 32];
            int q = (e % 64) < 32 ? byte & 15 : byte >> 4;
            if (type == TDM_Q5_K) q |= ((b[16 + e % 32] >> (e / 32)) & 1) << 4;
            p->q[e] = (uint8_t)q;
        }
        for (int s = 0; s < 16; s++) sc[s] = s4[s / 2], p->c[s] = m4[s / 2];
        for (int s = 0; s < 8; s++) p->s8[s] = s4[s];
        p->d = h2f(b), p->dm = h2f(b + 2);
        break;
    }
    case TDM_Q6_K: /* ql[128] qh[64] scales[16] d */
        for (int e = 0; e < TDM_QK_K; e++) {
            int h = e / 128, t = (e % 128) / 32, l = e % 32;
            uint8_t byte = b[64 * h + 32 * (t & 1) + l];
            p->q[e] = (uint8_t)((t < 2 ? byte & 15 : byte >> 4) | (((b[128 + 32 * h + l] >> (2 * t)) & 3) << 4));
        }
        for (int s = 0; s < 16; s++) sc[s] = (int8_t)b[192 + s], p->c[s] = (int16_t)(32 * (int8_t)b[192 + s]);
        p->d = h2f(b + 208), p->dm = 0;
        break;
    default:
        memset(p, 0, sizeof *p);
        return;
    }
    for (int k = 0; k < 128; k++) p->scp[k] = sc[k / 8];
}

void tdm_qprep_ref(uint32_t type, const uint8_t *b, tdm_qprep *p) {
    const bool has_m = type != TDM_Q5_0, five = type != TDM_Q4_1;
    const uint8_t *qh = b + (has_m ? 4 : 2), *qs = five ? qh + 4 : b + 4;
    for (int j = 0; j < TDM_QK; j++) {
        int q = j < 16 ? qs[j] & 15 : qs[j - 16] >> 4;
        if (five) q |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
        p->q[j] = (uint8_t)q;
    }
    p->d = h2f(b);
    p->m = has_m ? h2f(b + 2) : 0.0f;
}

/* ---- the scalar kernel ---------------------------------------------------------------- */

#define XCHUNK 64 /* x rows whose accumulators a pass over W rows keeps */

void tdm_qdot_ref(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y, int64_t ldy,
                  bool acc) {
    const uint32_t type = w->type;
    const bool kq = tdm_dtype_is_kquant(type), off = tdm_kquant_offset(type);
    const int64_t cols = w->cols, nb = cols / xq->blk;
    const size_t bb = tdm_dtype_block_bytes(type);
    float accv[XCHUNK];
    tdm_kprep kp;
    tdm_qprep qp;
    for (int32_t i0 = 0; i0 < n; i0 += XCHUNK) {
        const int32_t m = TDM_MIN(XCHUNK, n - i0);
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *row = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
            for (int32_t i = 0; i < m; i++) accv[i] = 0;
            for (int64_t b = 0; b < nb; b++) {
                if (kq) tdm_kprep_ref(type, row + (size_t)b * bb, &kp);
                else tdm_qprep_ref(type, row + (size_t)b * bb, &qp);
                for (int32_t i = 0; i < m; i++) {
                    const int8_t *qx = xq->q + (size_t)(i0 + i) * cols + b * xq->blk;
                    const int16_t *xs = xq->s16 + (size_t)(i0 + i) * (cols / 16) + b * (xq->blk / 16);
                    const float dx = xq->d[(size_t)(i0 + i) * nb + b];
                    int32_t isum = 0, corr = 0;
                    if (kq) {
                        for (int k = 0; k < 128; k++)
                            isum += kp.scp[k] * (kp.q[2 * k] * qx[2 * k] + kp.q[2 * k + 1] * qx[2 * k + 1]);
                        for (int s = 0; s < 16; s++) corr += kp.c[s] * xs[s];
                        accv[i] = off ? tdm_qdot_step(accv[i], dx, kp.d, isum - corr)
                                      : tdm_qdot_step_min(accv[i], dx, kp.d, isum, kp.dm, corr);
                    } else {
                        for (int k = 0; k < TDM_QK; k++) isum += qp.q[k] * qx[k];
                        int32_t xsum = xs[0] + xs[1];
                        accv[i] = type == TDM_Q5_0 ? tdm_qdot_step(accv[i], dx, qp.d, isum - 16 * xsum)
                                                   : tdm_qdot_step_off(accv[i], dx, qp.d, isum, qp.m, xsum);
                    }
                }
            }
            for (int32_t i = 0; i < m; i++) {
                float *o = y + (size_t)(i0 + i) * ldy + r;
                *o = acc ? *o + accv[i] : accv[i];
            }
        }
    }
}
