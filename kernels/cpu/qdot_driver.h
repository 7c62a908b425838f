/* qdot_driver.h - the SIMD levels' integer-dot matmul drivers (qdot.h), included by
 * qdot_avx2.c and qdot_avx512.c after they define
 *   QD_KDOT(MR, s32, kp, qx, is): is[i] = the 4 W rows' exact level sums (sum_e sc(e)
 *       q_e qx_e of one super-block, __m128i of 4) for x rows i < MR (a constant),
 *       qx[i] their 256 qx; s32: the scales per 32 elements are in kp[j].s8
 *   QD_NAME: the entry point's name.
 * Groups of 4 W rows.  K-quants: per super-block the 4 rows' integer forms
 * (tdm_kprep: levels, per-pair scales, corrections) are filled once into the stack,
 * then every x row of the chunk takes them, two at a time, so each loaded W vector
 * serves two.  32-element types: each block's 4 level vectors live in registers
 * (AVX2 at both levels).  The f32 steps of qdot.h run on 4 lanes at once. */
#ifndef TDM_QDOT_DRIVER_H
#define TDM_QDOT_DRIVER_H

#include "qdot_prep.h"

#define XC 16 /* x rows per chunk (accumulators kept per chunk) */
#define QD_PF_ROWS 16 /* software prefetch distance in W rows */

static inline void store4(float *y, __m128 s, int64_t nv, bool acc) {
    float t[4];
    _mm_storeu_ps(t, s);
    for (int64_t j = 0; j < nv; j++) y[j] = acc ? y[j] + t[j] : t[j];
}

/* The 4 W rows from r (the last repeated past r1); returns how many are real. */
static inline int64_t rows4(const tdm_weight *w, int64_t r, int64_t r1, const uint8_t *p[4]) {
    for (int j = 0; j < 4; j++) p[j] = (const uint8_t *)w->data + (size_t)TDM_MIN(r + j, r1 - 1) * w->row_bytes;
    return TDM_MIN(4, r1 - r);
}

static inline void zero(__m128 *f, int32_t m) {
    for (int32_t i = 0; i < m; i++) f[i] = _mm_setzero_ps();
}

/* The f32 step of one block for one x row over 4 W rows (qdot.h): isum4 the 4
 * rows' level sums, the corrections from x's sums of 16 (exact integers, any order). */
static inline __attribute__((always_inline)) __m128 kstep(const bool off, __m128 facc, float dx, __m128 d4, __m128 dm4,
                                                          __m128i isum4, const tdm_kprep *kp, const int16_t *xs) {
    __m256i xs16 = _mm256_loadu_si256((const __m256i *)(const void *)xs), c[4];
    for (int j = 0; j < 4; j++) c[j] = _mm256_madd_epi16(_mm256_load_si256((const __m256i *)(const void *)kp[j].c), xs16);
    const __m128i cor4 = reduce4(c[0], c[1], c[2], c[3]);
    const __m128 vdx = _mm_set1_ps(dx);
    if (off) {
        __m128 t = _mm_mul_ps(d4, _mm_cvtepi32_ps(_mm_sub_epi32(isum4, cor4)));
        return _mm_add_ps(facc, _mm_mul_ps(vdx, t));
    }
    __m128 t = _mm_mul_ps(d4, _mm_cvtepi32_ps(isum4));
    __m128 u = _mm_mul_ps(dm4, _mm_cvtepi32_ps(cor4));
    return _mm_add_ps(facc, _mm_mul_ps(vdx, _mm_sub_ps(t, u)));
}

static inline __attribute__((always_inline)) void
krows(const uint32_t type, const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y,
      int64_t ldy, bool acc) {
    const bool off = tdm_kquant_offset(type), s32 = type == TDM_Q4_K || type == TDM_Q5_K;
    const int64_t cols = w->cols, nb = cols / TDM_QK_K;
    const size_t bb = tdm_dtype_block_bytes(type);
    tdm_kprep kp[4];
    __m128 facc[XC];
    for (int64_t r = r0; r < r1; r += 4) {
        const uint8_t *p[4];
        const int64_t nv = rows4(w, r, r1, p);
        for (int32_t i0 = 0; i0 < n; i0 += XC) {
            const int32_t m = TDM_MIN(XC, n - i0);
            zero(facc, m);
            for (int64_t b = 0; b < nb; b++) {
                if (i0 == 0 && r + QD_PF_ROWS + 4 <= r1) /* the W rows QD_PF_ROWS ahead, during the first x chunk */
                    for (int j = 0; j < 4; j++)
                        for (size_t o = 0; o < bb; o += 64)
                            _mm_prefetch((const char *)(p[j] + (size_t)QD_PF_ROWS * w->row_bytes + (size_t)b * bb + o),
                                         _MM_HINT_T0);
                for (int j = 0; j < 4; j++) qp_kprep(type, p[j] + (size_t)b * bb, &kp[j]);
                const __m128 d4 = _mm_setr_ps(kp[0].d, kp[1].d, kp[2].d, kp[3].d);
                const __m128 dm4 = _mm_setr_ps(kp[0].dm, kp[1].dm, kp[2].dm, kp[3].dm);
                for (int32_t i = 0; i < m; i += 2) {
                    const int mr = TDM_MIN(2, m - i);
                    const int64_t ia = i0 + i, ib = i0 + i + mr - 1;
                    const int8_t *qx[2] = {xq->q + (size_t)ia * cols + b * TDM_QK_K, xq->q + (size_t)ib * cols + b * TDM_QK_K};
                    __m128i is[2];
                    const float dxa = xq->d[(size_t)ia * nb + b], dxb = xq->d[(size_t)ib * nb + b];
                    const int16_t *xsa = xq->s16 + (size_t)ia * (cols / 16) + b * 16;
                    const int16_t *xsb = xq->s16 + (size_t)ib * (cols / 16) + b * 16;
                    if (mr == 2) {
                        QD_KDOT(2, s32, kp, qx, is);
                        facc[i] = kstep(off, facc[i], dxa, d4, dm4, is[0], kp, xsa);
                        facc[i + 1] = kstep(off, facc[i + 1], dxb, d4, dm4, is[1], kp, xsb);
                    } else {
                        QD_KDOT(1, s32, kp, qx, is);
                        facc[i] = kstep(off, facc[i], dxa, d4, dm4, is[0], kp, xsa);
                    }
                }
            }
            for (int32_t i = 0; i < m; i++) store4(y + (size_t)(i0 + i) * ldy + r, facc[i], nv, acc);
        }
    }
}

static inline __attribute__((always_inline)) void
qrows(const uint32_t type, const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y,
      int64_t ldy, bool acc) {
    const int64_t cols = w->cols, nb = cols / TDM_QK;
    const size_t bb = tdm_dtype_block_bytes(type);
    const __m256i ones = _mm256_set1_epi16(1);
    __m128 facc[XC];
    for (int64_t r = r0; r < r1; r += 4) {
        const uint8_t *p[4];
        const int64_t nv = rows4(w, r, r1, p);
        for (int32_t i0 = 0; i0 < n; i0 += XC) {
            const int32_t m = TDM_MIN(XC, n - i0);
            zero(facc, m);
            for (int64_t b = 0; b < nb; b++) {
                __m256i q[4];
                float d[4], mm[4];
                if (i0 == 0 && r + QD_PF_ROWS + 4 <= r1) /* the W rows QD_PF_ROWS ahead, during the first x chunk */
                    for (int j = 0; j < 4; j++)
                        _mm_prefetch((const char *)(p[j] + (size_t)QD_PF_ROWS * w->row_bytes + (size_t)b * bb), _MM_HINT_T0);
                for (int j = 0; j < 4; j++) {
                    const uint8_t *blk = p[j] + (size_t)b * bb;
                    q[j] = qp_q32(type, blk);
                    d[j] = qp_h2f(blk);
                    mm[j] = type == TDM_Q5_0 ? 0.0f : qp_h2f(blk + 2);
                }
                const __m128 d4 = _mm_loadu_ps(d), m4 = _mm_loadu_ps(mm);
                for (int32_t i = 0; i < m; i++) {
                    const int64_t ix = i0 + i;
                    __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq->q + (size_t)ix * cols + b * TDM_QK));
                    __m256i a[4];
                    for (int j = 0; j < 4; j++) a[j] = _mm256_madd_epi16(_mm256_maddubs_epi16(q[j], xv), ones);
                    __m128i isum = reduce4(a[0], a[1], a[2], a[3]);
                    const int16_t *xs = xq->s16 + (size_t)ix * (cols / 16) + 2 * b;
                    const int32_t xsum = xs[0] + xs[1];
                    const __m128 vdx = _mm_set1_ps(xq->d[(size_t)ix * nb + b]);
                    if (type == TDM_Q5_0) {
                        isum = _mm_sub_epi32(isum, _mm_set1_epi32(16 * xsum));
                        facc[i] = _mm_add_ps(facc[i], _mm_mul_ps(vdx, _mm_mul_ps(d4, _mm_cvtepi32_ps(isum))));
                    } else {
                        __m128 t = _mm_mul_ps(d4, _mm_cvtepi32_ps(isum)), u = _mm_mul_ps(m4, _mm_set1_ps((float)xsum));
                        facc[i] = _mm_add_ps(facc[i], _mm_mul_ps(vdx, _mm_add_ps(t, u)));
                    }
                }
            }
            for (int32_t i = 0; i < m; i++) store4(y + (size_t)(i0 + i) * ldy + r, facc[i], nv, acc);
        }
    }
}

void QD_NAME(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y, int64_t ldy,
             bool acc) {
    switch (w->type) {
    case TDM_Q4_K: krows(TDM_Q4_K, w, xq, n, r0, r1, y, ldy, acc); break;
    case TDM_Q5_K: krows(TDM_Q5_K, w, xq, n, r0, r1, y, ldy, acc); break;
    case TDM_Q6_K: krows(TDM_Q6_K, w, xq, n, r0, r1, y, ldy, acc); break;
    case TDM_Q2_K: krows(TDM_Q2_K, w, xq, n, r0, r1, y, ldy, acc); break;
    case TDM_Q3_K: krows(TDM_Q3_K, w, xq, n, r0, r1, y, ldy, acc); break;
    case TDM_Q4_1: qrows(TDM_Q4_1, w, xq, n, r0, r1, y, ldy, acc); break;
    case TDM_Q5_0: qrows(TDM_Q5_0, w, xq, n, r0, r1, y, ldy, acc); break;
    case TDM_Q5_1: qrows(TDM_Q5_1, w, xq, n, r0, r1, y, ldy, acc); break;
    default: tdm_qdot_ref(w, xq, n, r0, r1, y, ldy, acc); break;
    }
}

#endif
