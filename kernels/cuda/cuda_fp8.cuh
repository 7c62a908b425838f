/* cuda_fp8.cuh - FP8 E4M3 (src/base/dtype.h, TDM_F8_E4M3) conversions on the GPU, one
 * definition for the FP8 weights (cuda_gemv.cu, cuda_gemm.cu) and the fp8 KV cache
 * (cuda_kvq8.cuh).  Hopper converts pairs of codes in hardware (cvt.rn.f16x2.e4m3x2). */
#ifndef TDM_CUDA_FP8_CUH
#define TDM_CUDA_FP8_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* Two E4M3 codes (the first in the low byte) as f32, exactly (through f16x2; the NaN
 * codes 0x7f / 0xff give NaN). */
__device__ __forceinline__ float2 tdm_cu_e4m3x2_to_float2(uint16_t v) {
    const __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    return __half22float2(*reinterpret_cast<const __half2 *>(&hr));
}

/* One E4M3 code as f32, exactly. */
__device__ __forceinline__ float tdm_cu_e4m3_to_f32(uint8_t v) {
    const __half_raw hr = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)v, __NV_E4M3);
    return __half2float(__half(hr));
}

/* x as E4M3, rounded to nearest even and saturated to +-448 (the bytes of the CPU's
 * tdm_f32_to_e4m3 for every x; a NaN gives 0x7f). */
__device__ __forceinline__ uint8_t tdm_cu_f32_to_e4m3(float x) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

#endif
