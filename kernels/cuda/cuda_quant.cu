/* cuda_quant.cu - conversions for the matrix products: activations quantised per
 * 32-element block for the int8 kernels (tdm_cuda_quantize_x), activations
 * converted to the 16-bit type cuBLAS multiplies in (tdm_cuda_convert), and
 * quantised weights (QSPLIT) dequantised to f16 for cuBLAS (tdm_cuda_dequant_f16). */
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
    k_quantize_x<<<grid, 256, 0, c->stream>>>(x, cols, (int8_t *)xq->q, (float *)xq->d, (int32_t *)xq->qs);
    TDM_CU_LAUNCHED("quantize_x");
    return TANDEM_OK;
}

template <typename O> __global__ void k_convert(const float *x, int64_t count, O *o) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x)
        o[i] = tdm_cu_from_f32<O>(x[i]);
}

tandem_status tdm_cuda_convert(tdm_cuda *c, const float *x, int64_t count, uint32_t type, void *out, tdm_err *err) {
    if (count <= 0) return TANDEM_OK;
    if (!x || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "convert: NULL pointer");
    const unsigned blocks = (unsigned)TDM_MIN((count + 255) / 256, (int64_t)c->n_sm * 16);
    if (type == TDM_F16) k_convert<__half><<<blocks, 256, 0, c->stream>>>(x, count, (__half *)out);
    else if (type == TDM_BF16) k_convert<__nv_bfloat16><<<blocks, 256, 0, c->stream>>>(x, count, (__nv_bfloat16 *)out);
    else if (type == TDM_F32) TDM_CU(cudaMemcpyAsync(out, x, (size_t)count * 4, cudaMemcpyDeviceToDevice, c->stream));
    else return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "convert: to %s", tdm_dtype_name(type));
    TDM_CU_LAUNCHED("convert");
    return TANDEM_OK;
}

/* Grid (rows), 256 threads: row r of a QSPLIT Q8_0 / Q4_0 weight to f16 [cols]. */
template <uint32_t T> __global__ void k_dequant_f16(const uint8_t *w, size_t row_bytes, int32_t cols, __half *o) {
    const uint8_t *row = w + (size_t)blockIdx.x * row_bytes;
    const uint16_t *scales = (const uint16_t *)(row + (T == TDM_Q8_0 ? cols : cols / 2));
    __half *orow = o + (size_t)blockIdx.x * cols;
    for (int32_t k = threadIdx.x; k < cols; k += blockDim.x) {
        const int32_t b = k / TDM_QK, j = k % TDM_QK;
        int v;
        if (T == TDM_Q8_0) {
            v = (int8_t)row[k];
        } else {
            const uint8_t byte = row[(size_t)b * 16 + (j & 15)];
            v = (j < 16 ? (byte & 15) : (byte >> 4)) - 8;
        }
        orow[k] = __float2half_rn(tdm_cu_h2f(scales[b]) * (float)v);
    }
}

tandem_status tdm_cuda_dequant_f16(tdm_cuda *c, const tdm_weight *w, void *out_v, tdm_err *err) {
    __half *out = (__half *)out_v;
    if (w->layout != TDM_LAYOUT_QSPLIT || (w->type != TDM_Q8_0 && w->type != TDM_Q4_0))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "dequant: %s weight in layout %u", tdm_dtype_name(w->type),
                          (unsigned)w->layout);
    if (w->rows > 0x7fffffff) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "dequant: %lld rows", (long long)w->rows);
    const unsigned g = (unsigned)w->rows;
    if (w->type == TDM_Q8_0)
        k_dequant_f16<TDM_Q8_0><<<g, 256, 0, c->stream>>>((const uint8_t *)w->data, w->row_bytes, (int32_t)w->cols, out);
    else
        k_dequant_f16<TDM_Q4_0><<<g, 256, 0, c->stream>>>((const uint8_t *)w->data, w->row_bytes, (int32_t)w->cols, out);
    TDM_CU_LAUNCHED("dequant");
    return TANDEM_OK;
}
