/* cuda_archops.cu - the ops the qwen3 and gemma3 blocks add to the llama block, on
 * the GPU: per-head RMSNorm (q and k norms), GeGLU, the residual add after a post
 * norm, the embedding scale and logit soft-capping.  Each computes what the CPU's
 * op computes (kernels/cpu/ops_arch.c) in f32, the sum of squares in f64. */
#include <math.h>

#include "cuda_internal.h"
#include "cuda_nonfinite.cuh"
#include "cuda_reduce.cuh"

#define GET_CUDA(op)                                                                   \
    tdm_cuda *c = tdm_cuda_of(b, op, err);                                             \
    if (!c) return TANDEM_ERR_INVALID_ARG

/* Block (row i, head h): v = x[i][h * hd ..+ hd) normalised in place. */
__global__ void k_head_rmsnorm(float *x, int32_t row_stride, int32_t hd, const float *g, float eps) {
    TDM_PDL_ENTRY();
    float *v = x + (size_t)blockIdx.x * row_stride + (size_t)blockIdx.y * hd;
    double ss = 0;
    for (int32_t k = threadIdx.x; k < hd; k += blockDim.x) ss += (double)v[k] * v[k];
    ss = tdm_cu_block_sum(ss); /* (every thread has read its elements before any writes) */
    const float inv = (float)(1.0 / sqrt(ss / hd + (double)eps));
    for (int32_t k = threadIdx.x; k < hd; k += blockDim.x) v[k] = v[k] * inv * g[k];
}

tandem_status tdm_cuda_head_rmsnorm(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                                    int32_t head_dim, const float *gamma, float eps, tdm_err *err) {
    GET_CUDA("head_rmsnorm");
    return tdm_cuda_head_rmsnorm_on(c, x, n, row_stride, n_head, head_dim, gamma, eps, err);
}

tandem_status tdm_cuda_head_rmsnorm_on(tdm_cuda *c, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                                       int32_t head_dim, const float *gamma, float eps, tdm_err *err) {
    tandem_status st = tdm_check_head_norm(x, gamma, n, row_stride, n_head, head_dim, eps, err);
    if (st || n == 0) return st;
    if (n_head > 65535) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "head_rmsnorm: %d heads", (int)n_head);
    tdm_launch(k_head_rmsnorm, dim3((unsigned)n, (unsigned)n_head), 128, 0, c->stream, x, row_stride, head_dim, gamma, eps);
    TDM_CU_LAUNCHED("head_rmsnorm");
    return TANDEM_OK;
}

/* Block per row: o = gelu(g) * u, GELU's tanh approximation. */
__global__ void k_geglu(const float *gu, int32_t ff, float *o) {
    TDM_PDL_ENTRY();
    const float *g = gu + (size_t)blockIdx.x * 2 * ff, *u = g + ff;
    float *orow = o + (size_t)blockIdx.x * ff;
    const float kc = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int32_t k = threadIdx.x; k < ff; k += blockDim.x) {
        const float x = g[k];
        orow[k] = 0.5f * x * (1.0f + tanhf(kc * (x + 0.044715f * x * x * x))) * u[k];
    }
}

tandem_status tdm_cuda_geglu(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff, float *out, tdm_err *err) {
    GET_CUDA("geglu");
    tandem_status st = tdm_check_rows("geglu", gate_up, out, n, ff, err);
    if (st || n == 0) return st;
    tdm_launch(k_geglu, n, TDM_CUDA_THREADS, 0, c->stream, gate_up, ff, out);
    TDM_CU_LAUNCHED("geglu");
    return TANDEM_OK;
}

/* Block per row of dim elements: y += x, x *= s, or x = cap tanh(x / cap). */
__global__ void k_add(float *y, const float *x, int32_t dim) {
    TDM_PDL_ENTRY();
    const size_t r = (size_t)blockIdx.x * dim;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) y[r + k] += x[r + k];
}

__global__ void k_scale(float *x, int32_t dim, float s) {
    TDM_PDL_ENTRY();
    const size_t r = (size_t)blockIdx.x * dim;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) x[r + k] *= s;
}

__global__ void k_softcap(float *x, int32_t dim, float cap) {
    TDM_PDL_ENTRY();
    const size_t r = (size_t)blockIdx.x * dim;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) x[r + k] = tdm_cu_softcap(x[r + k], cap);
}

tandem_status tdm_cuda_add(tdm_backend *b, float *y, const float *x, int32_t n, int32_t dim, tdm_err *err) {
    GET_CUDA("add");
    tandem_status st = tdm_check_rows("add", y, x, n, dim, err);
    if (st || n == 0) return st;
    tdm_launch(k_add, n, TDM_CUDA_THREADS, 0, c->stream, y, x, dim);
    TDM_CU_LAUNCHED("add");
    return TANDEM_OK;
}

tandem_status tdm_cuda_scale(tdm_backend *b, float *x, int32_t n, int32_t dim, float s, tdm_err *err) {
    GET_CUDA("scale");
    tandem_status st = tdm_check_rows("scale", x, x, n, dim, err);
    if (st) return st;
    if ((st = tdm_check_factor("scale", s, false, err))) return st;
    if (n == 0) return TANDEM_OK;
    tdm_launch(k_scale, n, TDM_CUDA_THREADS, 0, c->stream, x, dim, s);
    TDM_CU_LAUNCHED("scale");
    return TANDEM_OK;
}

tandem_status tdm_cuda_softcap(tdm_backend *b, float *x, int32_t n, int32_t dim, float cap, tdm_err *err) {
    GET_CUDA("softcap");
    tandem_status st = tdm_check_rows("softcap", x, x, n, dim, err);
    if (st) return st;
    if ((st = tdm_check_factor("softcap", cap, true, err))) return st;
    if (n == 0) return TANDEM_OK;
    tdm_launch(k_softcap, n, TDM_CUDA_THREADS, 0, c->stream, x, dim, cap);
    TDM_CU_LAUNCHED("softcap");
    return TANDEM_OK;
}
