/* cuda_quant.cuh - device helpers shared by the kernels that quantise or convert
 * activations (cuda_quant.cu, and the fused row kernels of cuda_fused.cu). */
#ifndef TDM_CUDA_QUANT_CUH
#define TDM_CUDA_QUANT_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_nonfinite.cuh"

/* f32 to the stored type (round to nearest even). */
template <typename O> __device__ __forceinline__ O tdm_cu_from_f32(float v);
template <> __device__ __forceinline__ float tdm_cu_from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half tdm_cu_from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 tdm_cu_from_f32<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}

/* One 32-element quantisation block held by a warp, lane l holding element l:
 * d = max |v| / 127, q_l = round(v_l / d) (half to even), and the block's sum of q.
 * Lane l writes q_l; lane 0 writes d and the sum.  All 32 lanes must call it.  A
 * NaN or an infinity in the block makes d NaN or infinite (and every q 0), so the
 * products of the block are not finite either, as on the CPU (kernels/cpu/qdot.h). */
__device__ __forceinline__ void tdm_cu_quant_block(float v, int8_t *q, float *d, int32_t *qsum) {
    float a = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = tdm_cu_max_nan(a, __shfl_xor_sync(0xffffffffu, a, o));
    const float id = a > 0.0f ? 127.0f / a : 0.0f;
    int qv = __float2int_rn(v * id);
    qv = qv > 127 ? 127 : qv < -127 ? -127 : qv;
    *q = (int8_t)qv;
    int s = qv;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) {
        *d = a / 127.0f;
        *qsum = s;
    }
}

#endif
