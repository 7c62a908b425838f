/* cuda_weights.cuh - element k of a weight row of each type, as f32, on the device:
 * the values tdm_row_to_f32 gives on the host (f16 and bf16 exactly; q8_0 and q4_0
 * as d * q with d the block's f16 scale, in f32). */
#ifndef TDM_CUDA_WEIGHTS_CUH
#define TDM_CUDA_WEIGHTS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "dtype.h"
}

/* The weight types the CUDA kernels read, for switch statements over templates. */
#define TDM_CU_FOR_EACH_WTYPE(X) X(TDM_F32) X(TDM_F16) X(TDM_BF16) X(TDM_Q8_0) X(TDM_Q4_0)

__device__ __forceinline__ float tdm_cu_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* The f16 scale of the quantisation block at p (2 bytes, any alignment). */
__device__ __forceinline__ float tdm_cu_scale(const uint8_t *p) {
    return tdm_cu_h2f((uint16_t)(p[0] | (p[1] << 8)));
}

template <uint32_t T> __device__ __forceinline__ float tdm_cu_wload(const uint8_t *row, int32_t k);

template <> __device__ __forceinline__ float tdm_cu_wload<TDM_F32>(const uint8_t *row, int32_t k) {
    return ((const float *)row)[k];
}
template <> __device__ __forceinline__ float tdm_cu_wload<TDM_F16>(const uint8_t *row, int32_t k) {
    return tdm_cu_h2f(((const uint16_t *)row)[k]);
}
template <> __device__ __forceinline__ float tdm_cu_wload<TDM_BF16>(const uint8_t *row, int32_t k) {
    return __uint_as_float((uint32_t)((const uint16_t *)row)[k] << 16);
}
template <> __device__ __forceinline__ float tdm_cu_wload<TDM_Q8_0>(const uint8_t *row, int32_t k) {
    const uint8_t *blk = row + (size_t)(k / TDM_QK) * sizeof(tdm_block_q8_0);
    return tdm_cu_scale(blk) * (float)(int8_t)blk[2 + k % TDM_QK];
}
template <> __device__ __forceinline__ float tdm_cu_wload<TDM_Q4_0>(const uint8_t *row, int32_t k) {
    const uint8_t *blk = row + (size_t)(k / TDM_QK) * sizeof(tdm_block_q4_0);
    const int32_t j = k % TDM_QK;
    const uint8_t q = blk[2 + (j & 15)];
    return tdm_cu_scale(blk) * (float)((j < 16 ? (q & 15) : (q >> 4)) - 8);
}

/* Element k of a QSPLIT row of cols columns (Q8_0: [cols] int8 then [cols / 32] f16
 * scales; Q4_0: [cols / 2] bytes of nibbles in block order, then the scales). */
template <uint32_t T> __device__ __forceinline__ float tdm_cu_wload_qsplit(const uint8_t *row, int32_t cols, int32_t k) {
    const int32_t b = k / TDM_QK, j = k % TDM_QK;
    if (T == TDM_Q8_0) return tdm_cu_scale(row + cols + 2 * b) * (float)(int8_t)row[k];
    const uint8_t q = row[16 * b + (j & 15)];
    return tdm_cu_scale(row + cols / 2 + 2 * b) * (float)((j < 16 ? (q & 15) : (q >> 4)) - 8);
}

#endif
