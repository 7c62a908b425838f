/* cuda_kvq8.cuh - the quantised KV caches (src/base/kv_layout.h: q8_0 and fp8) on the
 * GPU: a warp's quantisation of one head vector into its slot (kv_write, rope_kv),
 * the slot scales the attention kernels read, and how they read a value of each
 * cache type.
 *
 * A cache is [n_blocks][n_kv_head] units of tdm_kv_unit_bytes(type, bs, hd) bytes:
 * f32 / f16 values (K [hd][bs], V [bs][hd]); q8_0 int8 quants or fp8 E4M3 codes in
 * the same orders, then f32 scales [bs] at tdm_kv_scale_off(bs, hd).  The kernels
 * take the cache element type as a template parameter C: float, __half, int8_t for
 * q8_0, or __nv_fp8_e4m3 for fp8 (read in pairs by Hopper's conversion, cuda_fp8.cuh). */
#ifndef TDM_CUDA_KVQ8_CUH
#define TDM_CUDA_KVQ8_CUH

#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>
#include <type_traits>

#include "cuda_fp8.cuh"
#include "kv_layout.h"

/* True for the element types of the scaled caches (q8_0's int8_t, fp8's __nv_fp8_e4m3). */
template <typename C> __host__ __device__ constexpr bool tdm_cu_kv_scaled() { return sizeof(C) == 1; }

/* Quantises the head vector x[hd] by one warp (all 32 lanes call it, lane = their
 * lane) into slot p of the unit at `unit` of a q8_0 (C int8_t) or fp8 (C
 * __nv_fp8_e4m3) cache: K (is_k) quants / codes at [d][bs], V at [bs][hd], and the
 * slot's scale; the same bytes as the CPU's tdm_kv_q8_quant_vec / tdm_kv_fp8_quant_vec
 * (the absolute maximum is exact in any order, the rest is per element). */
template <typename C>
__device__ __forceinline__ void tdm_cu_kv8_write(const float *x, int32_t hd, uint8_t *unit, int32_t bs, int32_t p,
                                                 bool is_k, int lane) {
    static_assert(tdm_cu_kv_scaled<C>(), "a scaled cache");
    constexpr bool f8 = !std::is_same<C, int8_t>::value;
    float m = 0.0f;
    for (int32_t d = lane; d < hd; d += 32) m = tdm_kv_absmax(m, x[d]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = tdm_kv_absmax(m, __shfl_xor_sync(0xffffffffu, m, o));
    const float sc = f8 ? tdm_kv_fp8_scale(m) : tdm_kv_q8_scale(m);
    for (int32_t d = lane; d < hd; d += 32) {
        const uint8_t q = f8 ? (sc > 0.0f ? tdm_cu_f32_to_e4m3(x[d] / sc) : (uint8_t)0) : (uint8_t)tdm_kv_q8_quant(x[d], sc);
        unit[is_k ? (size_t)d * bs + p : (size_t)p * hd + d] = q;
    }
    if (lane == 0) ((float *)(unit + tdm_kv_scale_off(bs, hd)))[p] = sc;
}

/* The first byte of the (block, kv head g) unit of a cache. */
__device__ __forceinline__ const uint8_t *tdm_cu_kv_unit(const void *cache, int64_t blk, int32_t n_kv, int32_t g,
                                                          int64_t unit_bytes) {
    return (const uint8_t *)cache + (blk * n_kv + g) * unit_bytes;
}

/* A stored value as f32 (q8_0: the quant, fp8: the code's value; their scale is
 * applied apart). */
template <typename C> __device__ __forceinline__ float tdm_cu_kv_val(C v);
template <> __device__ __forceinline__ float tdm_cu_kv_val<float>(float v) { return v; }
template <> __device__ __forceinline__ float tdm_cu_kv_val<__half>(__half v) { return __half2float(v); }
template <> __device__ __forceinline__ float tdm_cu_kv_val<int8_t>(int8_t v) { return (float)v; }
template <> __device__ __forceinline__ float tdm_cu_kv_val<__nv_fp8_e4m3>(__nv_fp8_e4m3 v) {
    return tdm_cu_e4m3_to_f32(v.__x);
}

/* Two consecutive stored values (2-aligned) as f32. */
template <typename C> __device__ __forceinline__ float2 tdm_cu_kv_val2(const C *p);
template <> __device__ __forceinline__ float2 tdm_cu_kv_val2<__half>(const __half *p) {
    return __half22float2(*(const __half2 *)p);
}
template <> __device__ __forceinline__ float2 tdm_cu_kv_val2<int8_t>(const int8_t *p) {
    const char2 c = *(const char2 *)p;
    return make_float2((float)c.x, (float)c.y);
}
template <> __device__ __forceinline__ float2 tdm_cu_kv_val2<__nv_fp8_e4m3>(const __nv_fp8_e4m3 *p) {
    return tdm_cu_e4m3x2_to_float2(*(const uint16_t *)p);
}

/* The scale of slot p of a unit: q8_0's and fp8's stored one, 1 for the other types
 * (a value times 1 is itself, so their arithmetic is unchanged). */
template <typename C> __device__ __forceinline__ float tdm_cu_kv_scale(const uint8_t *unit, int32_t bs, int32_t hd,
                                                                        int32_t p) {
    if constexpr (tdm_cu_kv_scaled<C>()) return ((const float *)(unit + tdm_kv_scale_off(bs, hd)))[p];
    else return 1.0f;
}

#endif
