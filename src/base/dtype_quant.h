/* dtype_quant.h - the quantised types beyond Q8_0 / Q4_0 (private to src/ and the
 * kernels): row conversions (dtype_quant.c: Q4_1, Q5_0, Q5_1; dtype_kquant.c: the
 * K-quants) and the decoders of the K-quants' packed sub-block scales, which the
 * matmul kernels share with the reference dequantisation. */
#ifndef TDM_DTYPE_QUANT_H
#define TDM_DTYPE_QUANT_H

#include "dtype.h"

/* One row of n elements (a multiple of the type's block) to / from f32; false (dst
 * untouched) for a type the file does not handle. */
bool tdm_qrow_to_f32(uint32_t type, const void *src, float *dst, int64_t n);
bool tdm_qrow_from_f32(uint32_t type, const float *src, void *dst, int64_t n);
bool tdm_krow_to_f32(uint32_t type, const void *src, float *dst, int64_t n);
bool tdm_krow_from_f32(uint32_t type, const float *src, void *dst, int64_t n);

/* Q4_K / Q5_K: scale sc[j] and min m[j] (6 bits each) of sub-block j < 8 from the
 * 12 packed bytes q: j < 4: sc = q[j] & 63, m = q[j + 4] & 63; j >= 4: the low 4
 * bits in q[j + 4] (scale low nibble, min high nibble), the high 2 bits in the top
 * bits of q[j - 4] (scale) and q[j] (min). */
static inline void tdm_k4_scales(const uint8_t q[12], uint8_t sc[8], uint8_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (uint8_t)((q[j + 8] & 15) | ((q[j] >> 6) << 4));
        m[j + 4] = (uint8_t)((q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4));
    }
}

/* Q3_K: the 16 signed scales (stored value - 32, in [-32, 31]) from the 12 packed
 * bytes: scale i's low 4 bits are the low (i < 8) or high (i >= 8) nibble of q[i %
 * 8], its high 2 bits are bits 2 (i / 4) of q[8 + i % 4]. */
static inline void tdm_k3_scales(const uint8_t q[12], int8_t sc[16]) {
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? q[i] & 15 : q[i - 8] >> 4;
        int hi = (q[8 + i % 4] >> (2 * (i / 4))) & 3;
        sc[i] = (int8_t)((lo | (hi << 4)) - 32);
    }
}

#endif
