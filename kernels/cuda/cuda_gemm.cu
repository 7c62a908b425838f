/* cuda_gemm.cu - matrix products of many rows (prefill chunks, large batches)
 * through cuBLAS on tensor cores: f16 or bf16 operands (the activations converted
 * to the weight's type by the caller), f32 accumulation and f32 output, y += when
 * accumulating (beta = 1).  Quantised weights (Q8_0 / Q4_0 QSPLIT, the others in
 * rows) are dequantised to f16 into
 * a scratch buffer first (one pass over the weight, then cuBLAS); f32 weights use
 * plain single-precision GEMM.
 *
 * The handle is created at the first call, on the backend's stream, with a fixed
 * workspace, so the products can also be captured into CUDA graphs.
 *
 * In column-major terms y^T (rows x n) = W (rows x cols, stored as W^T column-major,
 * i.e. row-major W) times x^T: GEMM(op(A) = T, op(B) = N, m = rows, n, k = cols). */
#include <cublas_v2.h>

#include "cuda_internal.h"

#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

static tandem_status cublas_status(cublasStatus_t s, const char *what, tdm_err *err) {
    if (s == CUBLAS_STATUS_SUCCESS) return TANDEM_OK;
    return tdm_seterr(err, TANDEM_ERR_BACKEND, "cublas: %s: %s (%d)", what, cublasGetStatusString(s), (int)s);
}
#define TDM_CUBLAS(call)                                                               \
    do {                                                                               \
        cublasStatus_t s_ = (call);                                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) return cublas_status(s_, #call, err);         \
    } while (0)

static tandem_status ensure_handle(tdm_cuda *c, tdm_err *err) {
    if (c->cublas) return TANDEM_OK;
    if (c->capturing) return tdm_seterr(err, TANDEM_ERR_BACKEND, "cublas: first use during a graph capture");
    cublasHandle_t h = NULL;
    TDM_CUBLAS(cublasCreate(&h));
    void *ws = NULL;
    cudaError_t e = cudaMalloc(&ws, CUBLAS_WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        cublasDestroy(h);
        return tdm_cuda_status(e, "cublas workspace", err);
    }
    cublasStatus_t s = cublasSetStream(h, c->stream);
    if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetWorkspace(h, ws, CUBLAS_WORKSPACE_BYTES);
    if (s != CUBLAS_STATUS_SUCCESS) {
        cublasDestroy(h);
        cudaFree(ws);
        return cublas_status(s, "cublas set-up", err);
    }
    c->cublas = h;
    c->cublas_ws = ws;
    return TANDEM_OK;
}

void tdm_cuda_gemm_destroy(tdm_cuda *c) {
    if (c->cublas) cublasDestroy(c->cublas);
    cudaFree(c->cublas_ws);
    c->cublas = NULL;
    c->cublas_ws = NULL;
}

uint32_t tdm_cuda_gemm_act_type(uint32_t wtype) {
    if (wtype == TDM_BF16) return TDM_BF16;
    if (wtype == TDM_F32) return TDM_F32;
    return TDM_F16;
}

static cudaDataType_t cuda_type(uint32_t t) {
    return t == TDM_BF16 ? CUDA_R_16BF : t == TDM_F32 ? CUDA_R_32F : CUDA_R_16F;
}

tandem_status tdm_cuda_gemm(tdm_cuda *c, const tdm_weight *w, const void *xa, int32_t n, float *y, bool accumulate,
                            tdm_err *err) {
    if (n <= 0) return TANDEM_OK;
    if (!xa || !y) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gemm: NULL input or output");
    if (w->rows > INT32_MAX || w->cols > INT32_MAX)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemm: weight [%lld][%lld]", (long long)w->rows,
                          (long long)w->cols);
    tandem_status st = ensure_handle(c, err);
    if (st) return st;
    const int m = (int)w->rows, k = (int)w->cols;
    const void *a = w->data;
    uint32_t at = w->type;
    int lda;
    if (tdm_dtype_block_elems(w->type) > 1) {
        if ((w->type == TDM_Q8_0 || w->type == TDM_Q4_0) && w->layout != TDM_LAYOUT_QSPLIT)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemm: %s weight in the rows layout", tdm_dtype_name(w->type));
        void *deq = tdm_cuda_buf_get(c, &c->wdeq_buf, (size_t)m * (size_t)k * 2, "gemm: dequantised weight", err);
        if (!deq) return err ? err->status : TANDEM_ERR_BACKEND;
        if ((st = tdm_cuda_dequant_f16(c, w, deq, err))) return st;
        a = deq;
        at = TDM_F16;
        lda = k;
    } else if (w->type == TDM_F16 || w->type == TDM_BF16 || w->type == TDM_F32) {
        if (w->layout != TDM_LAYOUT_ROWS)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemm: layout %u", (unsigned)w->layout);
        lda = (int)(w->row_bytes / (w->type == TDM_F32 ? 4 : 2));
    } else {
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemm: weight type %s", tdm_dtype_name(w->type));
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    const cudaDataType_t t = cuda_type(at);
    TDM_CUBLAS(cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, t, lda, xa, t, k, &beta, y,
                            CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return TANDEM_OK;
}
