/* qhead_vnni.c - integer dot products of the quantised output head (tdm_qhead) with
 * AVX-512 VNNI (compiled with -mavx512f -mavx512bw -mavx512vnni; called only when the
 * CPU has VNNI).
 *
 * One vpdpbusd multiplies 4 unsigned x bytes (broadcast) by the 4-column slice of
 * 16 W rows and adds each row's 4 products to its own 32-bit lane: the 16 lanes end
 * as 16 finished row sums, so no horizontal reduction is needed.  A panel of 64 rows
 * (4 groups, contiguous per 4 columns: one sequential stream) is swept for up to 4 x
 * rows at a time (16 accumulators).  Integer sums are exact: results equal
 * tdm_qhead_dot_ref bit for bit.
 */
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"

static inline __attribute__((always_inline)) void
panel(const int MR, const int8_t *g, int64_t c4, const uint8_t *xq, int64_t ldx, int32_t *y, int64_t ldy,
      const int8_t *pf) {
    __m512i s[4][4];
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
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) _mm512_storeu_si512(y + i * ldy + 16 * j, s[i][j]);
}

void tdm_qhead_dot_vnni(const tdm_qhead *h, const uint8_t *xq, int32_t n, int64_t p0, int64_t p1,
                        int32_t *isum) {
    const int64_t c4 = h->cols_pad / 4, pstride = c4 * 256, ldx = h->cols_pad, ldy = h->rows_pad;
    for (int64_t p = p0; p < p1; p++) {
        const int8_t *g = h->q + p * pstride;
        const int8_t *pf = p + 1 < p1 ? g + pstride : NULL; /* during the first pass only */
        int32_t i = 0;
        for (; i + 4 <= n; i += 4, pf = NULL)
            panel(4, g, c4, xq + i * ldx, ldx, isum + i * ldy + p * 64, ldy, pf);
        switch (n - i) {
        case 3: panel(3, g, c4, xq + i * ldx, ldx, isum + i * ldy + p * 64, ldy, pf); break;
        case 2: panel(2, g, c4, xq + i * ldx, ldx, isum + i * ldy + p * 64, ldy, pf); break;
        case 1: panel(1, g, c4, xq + i * ldx, ldx, isum + i * ldy + p * 64, ldy, pf); break;
        default: break;
        }
    }
}

/* Rows [r0, r1) of one x row: approximate logits a[r] from the integer sums (isum
 * counts x bytes offset by 128, undone with qsum); with b: the bounds of tdm_qhead
 * (widened for the float arithmetic here), *lo = the largest a - b, and the rows
 * with a + b >= *lo in cand[1..] (cand[0]: their count, -1 past cap).  Plain loops
 * the compiler vectorises for AVX-512; candidates are rare, so blocks of 16 are
 * tested branch-free first. */
void tdm_qhead_post_vnni(const tdm_qhead *h, const int32_t *isum, float dx, float l1x, float ex, int64_t r0,
                         int64_t r1, float *a, float *b, float *lo, int32_t *cand, int32_t cap) {
    for (int64_t r = r0; r < r1; r++) a[r] = (dx * h->d[r]) * (float)(isum[r] - 128 * h->qsum[r]);
    if (!b) return;
    float lane[16];
    for (int l = 0; l < 16; l++) lane[l] = -INFINITY;
    int64_t r = r0;
    for (; r + 16 <= r1; r += 16)
        for (int l = 0; l < 16; l++) {
            float bb = (l1x * h->xcoef[r + l] + ex * h->l1[r + l] + 1e-6f * fabsf(a[r + l])) * 1.00001f + FLT_MIN;
            float v = a[r + l] - bb;
            b[r + l] = bb;
            lane[l] = v > lane[l] ? v : lane[l];
        }
    for (; r < r1; r++) {
        b[r] = (l1x * h->xcoef[r] + ex * h->l1[r] + 1e-6f * fabsf(a[r])) * 1.00001f + FLT_MIN;
        lane[0] = a[r] - b[r] > lane[0] ? a[r] - b[r] : lane[0];
    }
    float m = -INFINITY;
    for (int l = 0; l < 16; l++) m = lane[l] > m ? lane[l] : m;
    int32_t nc = 0;
    for (int64_t q0 = r0; q0 < r1 && nc >= 0; q0 += 16) {
        int64_t qe = q0 + 16 < r1 ? q0 + 16 : r1;
        int any = 0;
        for (r = q0; r < qe; r++) any |= a[r] + b[r] >= m;
        for (r = q0; any && r < qe; r++)
            if (a[r] + b[r] >= m) {
                if (nc == cap) {
                    nc = -1;
                    break;
                }
                cand[1 + nc++] = (int32_t)r;
            }
    }
    cand[0] = nc;
    *lo = m;
}
