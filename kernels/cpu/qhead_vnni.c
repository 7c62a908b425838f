/* qhead_vnni.c - approximate logits of the quantised output head (tdm_qhead) with
 * AVX-512 VNNI (compiled with -mavx512f -mavx512bw -mavx512vnni; called only when the
 * CPU has VNNI).
 *
 * One vpdpbusd multiplies 4 unsigned x bytes (broadcast) by the 4-column slice of
 * 16 W rows and adds each row's 4 products to its own 32-bit lane: the 16 lanes end
 * as 16 finished row sums, so no horizontal reduction is needed.  A panel of 64 rows
 * (4 groups, contiguous per 4 columns: one sequential stream) is swept for up to 6 x
 * rows at a time (24 accumulators), and the sums become logits or bounds while they
 * are still in registers.  Integer sums are exact and the float epilogue repeats the
 * reference's operations: results equal tdm_qhead_approx_ref bit for bit.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

/* The epilogue for 16 W rows [r, r + 16) and one x row: the integer sums become
 * approximate logits, or upper bounds with the row's largest lower bound kept in
 * lov; lanes of rows past h->rows are not stored.  The float operations are those
 * of tdm_qhead_approx_ref, in the same order (no FMA), so results are equal bit for
 * bit. */
static inline __attribute__((always_inline)) void
epilogue(const tdm_qhead *h, int64_t r, __m512i sum, const tdm_qhead_xstat *xs, bool bound, float *out,
         __m512 *lov) {
    if (r >= h->rows) return;
    __mmask16 m = h->rows - r >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (h->rows - r)) - 1);
    __m512i v = _mm512_sub_epi32(sum, _mm512_slli_epi32(_mm512_loadu_si512(h->qsum + r), 7));
    __m512 a = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(xs->dx), _mm512_loadu_ps(h->d + r)),
                             _mm512_cvtepi32_ps(v));
    if (!bound) {
        _mm512_mask_storeu_ps(out + r, m, a);
        return;
    }
    __m512 b = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(xs->l1), _mm512_loadu_ps(h->xcoef + r)),
                             _mm512_mul_ps(_mm512_set1_ps(xs->ex), _mm512_loadu_ps(h->l1 + r)));
    b = _mm512_add_ps(b, _mm512_mul_ps(_mm512_set1_ps(TDM_QHEAD_REL_ERR), _mm512_abs_ps(a)));
    b = _mm512_add_ps(_mm512_mul_ps(b, _mm512_set1_ps(TDM_QHEAD_WIDEN)), _mm512_set1_ps(FLT_MIN));
    _mm512_mask_storeu_ps(out + r, m, _mm512_add_ps(a, b));
    *lov = _mm512_mask_max_ps(*lov, m, *lov, _mm512_sub_ps(a, b));
}

/* MR (<= 6) x rows against one panel (W rows [r, r + 64)): MR x 4 accumulators of
 * 16 rows.  (Splitting the chains of one or two rows over two accumulator sets was
 * measured: no faster, the sweep is bound by the panel's stream.) */
static inline __attribute__((always_inline)) void
panel(const int MR, const tdm_qhead *h, int64_t r, const int8_t *g, int64_t c4, const uint8_t *xq,
      int64_t ldx, const tdm_qhead_xstat *xs, bool bound, float *out, int64_t ldo, __m512 *lov,
      const int8_t *pf) {
    __m512i s[6][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) s[i][j] = _mm512_setzero_si512();
    for (int64_t k = 0; k < c4; k++) {
        if (pf) /* the next panel, line for line (the head streams from memory) */
            for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(pf + k * 256 + j * 64), _MM_HINT_T0);
        const int8_t *gk = g + k * 256;
        __m512i w0 = _mm512_loadu_si512(gk), w1 = _mm512_loadu_si512(gk + 64);
        __m512i w2 = _mm512_loadu_si512(gk + 128), w3 = _mm512_loadu_si512(gk + 192);
        for (int i = 0; i < MR; i++) {
            int32_t x4;
            memcpy(&x4, xq + i * ldx + 4 * k, 4);
            __m512i xb = _mm512_set1_epi32(x4);
            s[i][0] = _mm512_dpbusd_epi32(s[i][0], xb, w0);
            s[i][1] = _mm512_dpbusd_epi32(s[i][1], xb, w1);
            s[i][2] = _mm512_dpbusd_epi32(s[i][2], xb, w2);
            s[i][3] = _mm512_dpbusd_epi32(s[i][3], xb, w3);
        }
    }
    /* through a small buffer: an epilogue loop too long to unroll would otherwise
     * index the accumulators and keep them in memory during the sweep */
    __m512i sums[6][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) sums[i][j] = s[i][j];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) epilogue(h, r + 16 * j, sums[i][j], &xs[i], bound, out + i * ldo, &lov[i]);
}

void tdm_qhead_approx_vnni(const tdm_qhead *h, const uint8_t *xq, const tdm_qhead_xstat *xs, int32_t n,
                           int64_t p0, int64_t p1, bool bound, float *out, int64_t ldo, float *lo) {
    const int64_t c4 = h->cols_pad / 4, pstride = c4 * 256, ldx = h->cols_pad;
    const int32_t passes = (n + 5) / 6; /* x rows split as evenly as possible, at most 6 a pass */
    __m512 lov[TDM_QHEAD_MAX_X];
    for (int32_t i = 0; i < n; i++) lov[i] = _mm512_set1_ps(-INFINITY);
    for (int64_t p = p0; p < p1; p++) {
        const int8_t *g = h->q + p * pstride;
        const int8_t *pf = p + 1 < p1 ? g + pstride : NULL; /* during the first pass only */
        for (int32_t q = 0, i = 0; q < passes; q++, pf = NULL) {
            int32_t m = (n - i) / (passes - q);
            const uint8_t *x = xq + i * ldx;
            float *o = out + i * ldo;
            const tdm_qhead_xstat *st = xs + i;
            __m512 *lv = lov + i;
            switch (m) {
            case 6: panel(6, h, p * 64, g, c4, x, ldx, st, bound, o, ldo, lv, pf); break;
            case 5: panel(5, h, p * 64, g, c4, x, ldx, st, bound, o, ldo, lv, pf); break;
            case 4: panel(4, h, p * 64, g, c4, x, ldx, st, bound, o, ldo, lv, pf); break;
            case 3: panel(3, h, p * 64, g, c4, x, ldx, st, bound, o, ldo, lv, pf); break;
            case 2: panel(2, h, p * 64, g, c4, x, ldx, st, bound, o, ldo, lv, pf); break;
            case 1: panel(1, h, p * 64, g, c4, x, ldx, st, bound, o, ldo, lv, pf); break;
            default: break;
            }
            i += m;
        }
    }
    if (bound)
        for (int32_t i = 0; i < n; i++) lo[i] = fmaxf(lo[i], _mm512_reduce_max_ps(lov[i]));
}
