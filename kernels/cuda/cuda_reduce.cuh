/* cuda_reduce.cuh - warp- and block-wide reductions shared by the kernels. */
#ifndef TDM_CUDA_REDUCE_CUH
#define TDM_CUDA_REDUCE_CUH

#include "cuda_nonfinite.cuh"

/* Sum of v over the thread block (blockDim.x a multiple of 32, at most 1024), in a
 * fixed order (so every call on the same values gives the same sum).  Every thread
 * of the block must call it; it returns the sum to all of them. */
__device__ __forceinline__ double tdm_cu_block_sum(double v) {
    __shared__ double part[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads(); /* (part may still be read by an earlier call) */
    if (lane == 0) part[wid] = v;
    __syncthreads();
    double s = 0;
    if (wid == 0) {
        s = lane < (int)(blockDim.x >> 5) ? part[lane] : 0.0;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) part[0] = s;
    }
    __syncthreads();
    return part[0];
}

/* The maximum (NaN when a lane holds NaN) and the sum of v over a warp (all 32
 * lanes), in a fixed butterfly order, returned to every lane. */
__device__ __forceinline__ float tdm_cu_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = tdm_cu_max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float tdm_cu_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#endif
