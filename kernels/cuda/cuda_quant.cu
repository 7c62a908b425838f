/* cuda_quant.cu - conversions for the matrix products: activations quantised per
 * 32-element block for the int8 kernels (tdm_cuda_quantize_x), activations
 * converted to the 16-bit type cuBLAS multiplies in (tdm_cuda_convert), and
 * quantised weights (QSPLIT Q8_0 / Q4_0, and the rows layout of the other quantised
 * types) dequantised to f16 for cuBLAS (tdm_cuda_dequant_f16). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_internal.h"
#include "cuda_quant.cuh"
#include "cuda_weights.cuh"

size_t tdm_cuda_xq_bytes(int32_t n, int32_t cols) {
    const size_t nb = (size_t)cols / TDM_QK;
    return (size_t)n * ((size_t)cols + nb * (sizeof(float) + sizeof(int32_t)));
}

tdm_cuda_xq tdm_cuda_xq_at(void *buf, int32_t n, int32_t cols) {
    const size_t nb = (size_t)cols / TDM_QK;
    int8_t *q = (int8_t *)buf;
    float *d = (float *)(q + (size_t)n * cols);
    int32_t *qs = (int32_t *)(d + (size_t)n * nb);
    tdm_cuda_xq x = {q, d, qs};
    return x;
}

/* Grid (blocks of 8 quantisation blocks, rows), 256 threads: one warp per block. */
__global__ void k_quantize_x(const float *x, int32_t cols, int8_t *q, float *d, int32_t *qs) {
    TDM_PDL_ENTRY();
    const int32_t nb = cols / TDM_QK, b = (int32_t)(blockIdx.x * 8 + (threadIdx.x >> 5)), i = (int32_t)blockIdx.y;
    if (b >= nb) return;
    const int lane = threadIdx.x & 31;
    const size_t k = (size_t)i * cols + (size_t)b * TDM_QK + lane;
    tdm_cu_quant_block(x[k], q + k, d + (size_t)i * nb + b, qs + (size_t)i * nb + b);
}

tandem_status tdm_cuda_quantize_x(tdm_cuda *c, const float *x, int32_t n, int32_t cols, const tdm_cuda_xq *xq,
                                  tdm_err *err) {
    if (n <= 0 || cols <= 0 || cols % TDM_QK != 0 || !x || !xq)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "quantize_x: %d rows of %d", (int)n, (int)cols);
    const dim3 grid((unsigned)((cols / TDM_QK + 7) / 8), (unsigned)n);
    tdm_launch(k_quantize_x, grid, 256, 0, c->stream, x, cols, (int8_t *)xq->q, (float *)xq->d, (int32_t *)xq->qs);
    TDM_CU_LAUNCHED("quantize_x");
    return TANDEM_OK;
}

template <typename O> __global__ void k_convert(const float *x, int64_t count, O *o) {
    TDM_PDL_ENTRY();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        o[i] = tdm_cu_from_f32<O>(x[i]);
}

tandem_status tdm_cuda_convert(tdm_cuda *c, const float *x, int64_t count, uint32_t type, void *out, tdm_err *err) {
    if (count <= 0) return TANDEM_OK;
    if (!x || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "convert: NULL pointer");
    const unsigned blocks = (unsigned)TDM_MIN((count + 255) / 256, (int64_t)c->n_sm * 16);
    if (type == TDM_F16) tdm_launch(k_convert<__half>, blocks, 256, 0, c->stream, x, count, (__half *)out);
    else if (type == TDM_BF16) tdm_launch(k_convert<__nv_bfloat16>, blocks, 256, 0, c->stream, x, count, (__nv_bfloat16 *)out);
    else if (type == TDM_F32) TDM_CU(cudaMemcpyAsync(out, x, (size_t)count * 4, cudaMemcpyDeviceToDevice, c->stream));
    else return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "convert: to %s", tdm_dtype_name(type));
    TDM_CU_LAUNCHED("convert");
    return TANDEM_OK;
}

/* A thread per 32-element block of a QSPLIT Q8_0 / Q4_0 weight [rows][cols]: its
 * quants (16-byte loads when the rows allow) times the block's scale, as 32 f16
 * (four 16-byte stores). */
template <uint32_t T>
__global__ void k_dequant_f16(const uint8_t *w, size_t row_bytes, int32_t cols, int64_t n_blocks, __half *o) {
    TDM_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks) return;
    const int32_t nb = cols / TDM_QK;
    const int64_t r = i / nb;
    const int32_t b = (int32_t)(i % nb);
    const uint8_t *row = w + (size_t)r * row_bytes;
    const float d = tdm_cu_scale(row + (T == TDM_Q8_0 ? cols : cols / 2) + 2 * b);
    int8_t q[TDM_QK];
    if (T == TDM_Q8_0) {
        const uint8_t *src = row + (size_t)b * TDM_QK;
#pragma unroll
        for (int j = 0; j < TDM_QK; j++) q[j] = (int8_t)src[j];
    } else {
        const uint8_t *src = row + (size_t)b * 16;
#pragma unroll
        for (int j = 0; j < 16; j++) {
            q[j] = (int8_t)((src[j] & 15) - 8);
            q[j + 16] = (int8_t)((src[j] >> 4) - 8);
        }
    }
    __align__(16) __half h[TDM_QK];
#pragma unroll
    for (int j = 0; j < TDM_QK; j++) h[j] = __float2half_rn(d * (float)q[j]);
    uint4 *dst = (uint4 *)(o + (size_t)r * cols + (size_t)b * TDM_QK);
#pragma unroll
    for (int k = 0; k < 4; k++) dst[k] = ((const uint4 *)h)[k];
}

/* A thread per 16-element group of a rows-layout weight of the 16-element-group
 * types: tdm_cu_deq16 rounded to f16 (two 16-byte stores). */
template <uint32_t T>
__global__ void k_dequant16_f16(const uint8_t *w, size_t row_bytes, int32_t cols, int64_t n_groups, __half *o) {
    TDM_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_groups) return;
    const int32_t ng = cols / 16;
    const int64_t r = i / ng;
    const int32_t g = (int32_t)(i % ng);
    float v[16];
    tdm_cu_deq16<T>(w + (size_t)r * row_bytes, g, v);
    __align__(16) __half h[16];
#pragma unroll
    for (int j = 0; j < 16; j++) h[j] = __float2half_rn(v[j]);
    uint4 *dst = (uint4 *)(o + (size_t)r * cols + (size_t)g * 16);
    dst[0] = ((const uint4 *)h)[0];
    dst[1] = ((const uint4 *)h)[1];
}

tandem_status tdm_cuda_dequant_f16(tdm_cuda *c, const tdm_weight *w, void *out_v, tdm_err *err) {
    __half *out = (__half *)out_v;
    if (w->layout == TDM_LAYOUT_ROWS && w->type != TDM_Q8_0 && w->type != TDM_Q4_0 && tdm_dtype_block_elems(w->type) > 1) {
        const int64_t n_groups = w->rows * (w->cols / 16);
        if ((n_groups + 255) / 256 > 0x7fffffff)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "dequant: %lld groups", (long long)n_groups);
        const unsigned g = (unsigned)((n_groups + 255) / 256);
        const uint8_t *wd = (const uint8_t *)w->data;
        switch (w->type) {
#define KT(T)                                                                                                 \
    case T:                                                                                                   \
        tdm_launch(k_dequant16_f16<T>, g, 256, 0, c->stream, wd, w->row_bytes, (int32_t)w->cols, n_groups, out); \
        break;
            TDM_CU_FOR_EACH_KTYPE(KT)
#undef KT
        default:
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "dequant: %s weight", tdm_dtype_name(w->type));
        }
        TDM_CU_LAUNCHED("dequant");
        return TANDEM_OK;
    }
    if (w->layout != TDM_LAYOUT_QSPLIT || (w->type != TDM_Q8_0 && w->type != TDM_Q4_0))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "dequant: %s weight in layout %u", tdm_dtype_name(w->type),
                          (unsigned)w->layout);
    const int64_t n_blocks = w->rows * (w->cols / TDM_QK);
    if ((n_blocks + 255) / 256 > 0x7fffffff)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "dequant: %lld blocks", (long long)n_blocks);
    const unsigned g = (unsigned)((n_blocks + 255) / 256);
    const uint8_t *wd = (const uint8_t *)w->data;
    if (w->type == TDM_Q8_0)
        tdm_launch(k_dequant_f16<TDM_Q8_0>, g, 256, 0, c->stream, wd, w->row_bytes, (int32_t)w->cols, n_blocks, out);
    else
        tdm_launch(k_dequant_f16<TDM_Q4_0>, g, 256, 0, c->stream, wd, w->row_bytes, (int32_t)w->cols, n_blocks, out);
    TDM_CU_LAUNCHED("dequant");
    return TANDEM_OK;
}
