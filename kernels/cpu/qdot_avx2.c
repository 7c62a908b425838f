/* qdot_avx2.c - the integer-dot matmul (qdot.h) with AVX2 (compiled with -mavx2
 * -mfma -mf16c): 32 elements per maddubs / madd (the drivers: qdot_driver.h). */
#include <immintrin.h>

#include "cpu_internal.h"
#include "qdot_prep.h"

/* is[i] = the scaled level dot of the 4 W rows' preps with 256 qx of x row i, for
 * MR x rows (s32: the scales per 32 elements in s8, else per pair in scp). */
static inline __attribute__((always_inline)) void
kdot(const int MR, const bool s32, const tdm_kprep *kp, const int8_t *const qx[2], __m128i is[2]) {
    __m256i a[2][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) a[i][j] = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        __m256i xv[2];
        for (int i = 0; i < MR; i++) xv[i] = _mm256_loadu_si256((const __m256i *)(const void *)(qx[i] + 32 * k));
        for (int j = 0; j < 4; j++) {
            __m256i q = _mm256_load_si256((const __m256i *)(const void *)(kp[j].q + 32 * k));
            __m256i s = s32 ? _mm256_set1_epi16(kp[j].s8[k])
                            : _mm256_load_si256((const __m256i *)(const void *)(kp[j].scp + 16 * k));
            for (int i = 0; i < MR; i++)
                a[i][j] = _mm256_add_epi32(a[i][j], _mm256_madd_epi16(_mm256_maddubs_epi16(q, xv[i]), s));
        }
    }
    for (int i = 0; i < MR; i++) is[i] = reduce4(a[i][0], a[i][1], a[i][2], a[i][3]);
}

#define QD_KDOT kdot
#define QD_NAME tdm_qdot_avx2
#include "qdot_driver.h"
