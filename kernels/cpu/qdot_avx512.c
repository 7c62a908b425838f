/* qdot_avx512.c - the integer-dot matmul (qdot.h) with AVX-512 BW (compiled with
 * the AVX-512 level's flags): 64 elements per maddubs / madd for the K-quants; the
 * 32-element types run the AVX2 drivers' code (qdot_driver.h). */
#include <immintrin.h>

#include "cpu_internal.h"
#include "qdot_prep.h"

static inline __m256i half_sum(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* As qdot_avx2.c's kdot, 64 elements per step. */
static inline __attribute__((always_inline)) void
kdot(const int MR, const bool s32, const tdm_kprep *kp, const int8_t *const qx[2], __m128i is[2]) {
    __m512i a[2][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) a[i][j] = _mm512_setzero_si512();
    for (int k = 0; k < 4; k++) {
        __m512i xv[2];
        for (int i = 0; i < MR; i++) xv[i] = _mm512_loadu_si512((const void *)(qx[i] + 64 * k));
        for (int j = 0; j < 4; j++) {
            __m512i q = _mm512_load_si512((const void *)(kp[j].q + 64 * k));
            __m512i s = s32 ? _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(kp[j].s8[2 * k])),
                                                 _mm256_set1_epi16(kp[j].s8[2 * k + 1]), 1)
                            : _mm512_load_si512((const void *)(kp[j].scp + 32 * k));
            for (int i = 0; i < MR; i++)
                a[i][j] = _mm512_add_epi32(a[i][j], _mm512_madd_epi16(_mm512_maddubs_epi16(q, xv[i]), s));
        }
    }
    for (int i = 0; i < MR; i++)
        is[i] = reduce4(half_sum(a[i][0]), half_sum(a[i][1]), half_sum(a[i][2]), half_sum(a[i][3]));
}

#define QD_KDOT kdot
#define QD_NAME tdm_qdot_avx512
#include "qdot_driver.h"
