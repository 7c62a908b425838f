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
 * FP8 E4M3 weights (per-row scales, tdm_weight.scale): x quantised per row to E4M3
 * with its own scale (max |x| / 448, as vLLM's dynamic per-token FP8), then an FP8
 * tensor-core GEMM through cuBLASLt with f32 accumulation, the two scale vectors
 * applied by cuBLASLt's outer-vector scaling where the library offers it for the
 * device, else by a pass over the f32 products.
 *
 * In column-major terms y^T (rows x n) = W (rows x cols, stored as W^T column-major,
 * i.e. row-major W) times x^T: GEMM(op(A) = T, op(B) = N, m = rows, n, k = cols). */
#include <cublasLt.h>
#include <cublas_v2.h>

#include "cuda_fp8.cuh"
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
    if (c->cublaslt) cublasLtDestroy((cublasLtHandle_t)c->cublaslt);
    c->cublaslt = NULL;
    if (c->cublas) cublasDestroy(c->cublas);
    cudaFree(c->cublas_ws);
    c->cublas = NULL;
    c->cublas_ws = NULL;
}

uint32_t tdm_cuda_gemm_act_type(uint32_t wtype) {
    if (wtype == TDM_BF16) return TDM_BF16;
    if (wtype == TDM_F32 || wtype == TDM_F8_E4M3) return TDM_F32; /* (fp8: quantised here) */
    return TDM_F16;
}

static cudaDataType_t cuda_type(uint32_t t) {
    return t == TDM_BF16 ? CUDA_R_16BF : t == TDM_F32 ? CUDA_R_32F : CUDA_R_16F;
}

/* ---- FP8 ---- */

static tandem_status lt_status(cublasStatus_t s, const char *what, tdm_err *err) {
    /* (NOT_SUPPORTED: no algorithm for this shape, TANDEM_ERR_UNSUPPORTED for the caller's fallback) */
    return tdm_seterr(err, s == CUBLAS_STATUS_NOT_SUPPORTED ? TANDEM_ERR_UNSUPPORTED : TANDEM_ERR_BACKEND,
                      "cublasLt: %s: %s (%d)", what, cublasGetStatusString(s), (int)s);
}

/* Row i of x[n][k] as E4M3 (q[i][k]) with its scale s[i] = max |x_i| / 448 (1 for a
 * row of zeros): one block a row. */
__global__ void __launch_bounds__(256) k_quant_e4m3(const float *__restrict__ x, int32_t k, uint8_t *__restrict__ q,
                                                   float *__restrict__ s) {
    TDM_PDL_ENTRY();
    __shared__ float red[8];
    const float *xr = x + (size_t)blockIdx.x * k;
    float m = 0.0f;
    for (int32_t j = threadIdx.x; j < k; j += blockDim.x) m = fmaxf(m, fabsf(xr[j]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = 0.0f;
    for (int i = 0; i < (int)(blockDim.x >> 5); i++) m = fmaxf(m, red[i]);
    const float sc = m > 0.0f ? m / 448.0f : 1.0f, inv = 1.0f / sc;
    uint8_t *qr = q + (size_t)blockIdx.x * k;
    for (int32_t j = threadIdx.x; j < k; j += blockDim.x)
        qr[j] = tdm_cu_f32_to_e4m3(xr[j] * inv);
    if (threadIdx.x == 0) s[blockIdx.x] = sc;
}

/* y[i][r] (+)= d[i][r] * ws[r] * xs[i]. */
__global__ void k_scale_fp8(const float *__restrict__ d, const float *__restrict__ ws, const float *__restrict__ xs,
                            int32_t m, int32_t n, float *y, bool acc) {
    TDM_PDL_ENTRY();
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= (int64_t)m * n) return;
    const int32_t i = (int32_t)(e / m), r = (int32_t)(e % m);
    const float v = d[e] * ws[r] * xs[i];
    y[e] = acc ? y[e] + v : v;
}

/* One cuBLASLt FP8 product y (+)= (x_q W_q^T) scaled; outer: the scales applied by
 * cuBLASLt as row vectors (false: none, the unscaled sums to d).  CUBLAS_STATUS_NOT_SUPPORTED
 * (no algorithm) is returned as is, for the caller to fall back. */
static cublasStatus_t lt_matmul(tdm_cuda *c, const tdm_weight *w, const uint8_t *xq, const float *xs, int n, bool outer,
                                float *d, bool acc) {
    const int m = (int)w->rows, k = (int)w->cols;
    cublasLtHandle_t h = (cublasLtHandle_t)c->cublaslt;
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t s = cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    if (!s && outer) {
        const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
        const void *pa = w->scale, *pb = xs;
        s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode);
        if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode);
        if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &pa, sizeof pa);
        if (!s) s = cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &pb, sizeof pb);
    }
    if (!s) s = cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, (int64_t)w->row_bytes);
    if (!s) s = cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k);
    if (!s) s = cublasLtMatrixLayoutCreate(&ld, CUDA_R_32F, m, n, m);
    if (!s) s = cublasLtMatmulPreferenceCreate(&pref);
    const uint64_t wsb = CUBLAS_WORKSPACE_BYTES;
    if (!s) s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof wsb);
    cublasLtMatmulHeuristicResult_t res;
    int cnt = 0;
    if (!s) s = cublasLtMatmulAlgoGetHeuristic(h, op, la, lb, ld, ld, pref, 1, &res, &cnt);
    if (!s && cnt == 0) s = CUBLAS_STATUS_NOT_SUPPORTED;
    const float alpha = 1.0f, beta = acc ? 1.0f : 0.0f;
    if (!s)
        s = cublasLtMatmul(h, op, &alpha, w->data, la, xq, lb, &beta, d, ld, d, ld, &res.algo, c->cublas_ws,
                           CUBLAS_WORKSPACE_BYTES, c->stream);
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    return s;
}

static tandem_status gemm_fp8(tdm_cuda *c, const tdm_weight *w, const float *x, int n, float *y, bool acc,
                              tdm_err *err) {
    const int m = (int)w->rows, k = (int)w->cols;
    if (!w->scale || w->layout != TDM_LAYOUT_ROWS || k % 16 || w->row_bytes % 16 || (uintptr_t)w->data % 16)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "gemm: fp8_e4m3 weight [%d][%d] (row bytes %zu): the FP8 products need its row scales and "
                          "16-byte aligned rows",
                          m, k, w->row_bytes);
    if (!c->cublaslt) {
        if (c->capturing) return tdm_seterr(err, TANDEM_ERR_BACKEND, "cublasLt: first use during a graph capture");
        cublasLtHandle_t h = NULL;
        cublasStatus_t s = cublasLtCreate(&h);
        if (s) return lt_status(s, "cublasLtCreate", err);
        c->cublaslt = h;
    }
    const size_t qbytes = ((size_t)n * (size_t)k + 15) / 16 * 16;
    uint8_t *buf = (uint8_t *)tdm_cuda_buf_get(c, &c->f8x_buf, qbytes + (size_t)n * sizeof(float), "gemm: fp8 x", err);
    if (!buf) return err ? err->status : TANDEM_ERR_BACKEND;
    float *xs = (float *)(buf + qbytes);
    tdm_launch(k_quant_e4m3, dim3((unsigned)n), dim3(256), 0, c->stream, x, (int32_t)k, buf, xs);
    TDM_CU_LAUNCHED("gemm: fp8 x");
    if (c->fp8_outer >= 0) {
        const cublasStatus_t s = lt_matmul(c, w, buf, xs, n, true, y, acc);
        if (s == CUBLAS_STATUS_SUCCESS) {
            c->fp8_outer = 1;
            return TANDEM_OK;
        }
        if (s != CUBLAS_STATUS_NOT_SUPPORTED || c->fp8_outer == 1) return lt_status(s, "FP8 matmul", err);
        c->fp8_outer = -1; /* (no outer-vector scaling here: the pass below) */
    }
    float *d = (float *)tdm_cuda_buf_get(c, &c->f8d_buf, (size_t)n * (size_t)m * sizeof(float), "gemm: fp8 sums", err);
    if (!d) return err ? err->status : TANDEM_ERR_BACKEND;
    const cublasStatus_t s = lt_matmul(c, w, buf, xs, n, false, d, false);
    if (s) return lt_status(s, "FP8 matmul", err);
    const int64_t total = (int64_t)n * m;
    tdm_launch(k_scale_fp8, dim3((unsigned)((total + 255) / 256)), dim3(256), 0, c->stream, (const float *)d,
               w->scale, (const float *)xs, (int32_t)m, (int32_t)n, y, acc);
    TDM_CU_LAUNCHED("gemm: fp8 scales");
    return TANDEM_OK;
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
    if (w->type == TDM_F8_E4M3) return gemm_fp8(c, w, (const float *)xa, (int)n, y, accumulate, err);
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
