/* cuda_rowops.cu - the row-wise ops on the GPU: get_rows (embedding lookup, any
 * weight type), rmsnorm, add_bias, rope, swiglu, gather_rows, argmax, top k.  One thread block
 * per row (or per row and head); each computes what the CPU's op computes, in f32
 * (rmsnorm's sum of squares in f64, RoPE's angles in f64, as the CPU does).  The
 * ops of the qwen3 / gemma3 blocks: cuda_archops.cu. */
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>

#include "cuda_internal.h"
#include "cuda_reduce.cuh"
#include "cuda_weights.cuh"

#define GET_CUDA(op)                                                                   \
    tdm_cuda *c = tdm_cuda_of(b, op, err);                                             \
    if (!c) return TANDEM_ERR_INVALID_ARG

/* ---- get_rows ------------------------------------------------------------------ */

/* Row ids[i] of w (an id outside [0, n_w) gives zeros: get_rows_dev's contract;
 * get_rows checks its ids on the host first). */
template <uint32_t T>
__global__ void k_get_rows(const uint8_t *w, size_t row_bytes, int32_t cols, int64_t n_w, const int32_t *ids, float *out) {
    TDM_PDL_ENTRY();
    const int32_t i = blockIdx.x, id = ids[i];
    const bool ok = id >= 0 && id < n_w;
    const uint8_t *row = w + (size_t)(ok ? id : 0) * row_bytes;
    for (int32_t k = threadIdx.x; k < cols; k += blockDim.x) out[(size_t)i * cols + k] = ok ? tdm_cu_wload<T>(row, k) : 0.0f;
}

template <uint32_t T>
__global__ void k_get_rows_qsplit(const uint8_t *w, size_t row_bytes, int32_t cols, int64_t n_w, const int32_t *ids,
                                  float *out) {
    TDM_PDL_ENTRY();
    const int32_t i = blockIdx.x, id = ids[i];
    const bool ok = id >= 0 && id < n_w;
    const uint8_t *row = w + (size_t)(ok ? id : 0) * row_bytes;
    for (int32_t k = threadIdx.x; k < cols; k += blockDim.x)
        out[(size_t)i * cols + k] = ok ? tdm_cu_wload_qsplit<T>(row, cols, k) : 0.0f;
}

/* The get_rows kernels on device ids d[n]. */
static tandem_status get_rows_launch(tdm_cuda *c, const tdm_weight *w, const int32_t *d, int32_t n, float *out,
                                     tdm_err *err) {
    const uint8_t *wd = (const uint8_t *)w->data;
    const int32_t cols = (int32_t)w->cols;
    if (w->layout == TDM_LAYOUT_QSPLIT) {
        if (w->type == TDM_Q8_0)
            tdm_launch(k_get_rows_qsplit<TDM_Q8_0>, n, TDM_CUDA_THREADS, 0, c->stream, wd, w->row_bytes, cols, w->rows, d, out);
        else
            tdm_launch(k_get_rows_qsplit<TDM_Q4_0>, n, TDM_CUDA_THREADS, 0, c->stream, wd, w->row_bytes, cols, w->rows, d, out);
        TDM_CU_LAUNCHED("get_rows");
        return TANDEM_OK;
    }
    switch (w->type) {
#define CASE(T)                                                                                  \
    case T: tdm_launch(k_get_rows<T>, n, TDM_CUDA_THREADS, 0, c->stream, wd, w->row_bytes, cols, w->rows, d, out); break;
        TDM_CU_FOR_EACH_WTYPE(CASE)
#undef CASE
    default: break;
    }
    TDM_CU_LAUNCHED("get_rows");
    return TANDEM_OK;
}

tandem_status tdm_cuda_get_rows(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n, float *out,
                                tdm_err *err) {
    GET_CUDA("get_rows");
    tandem_status st = tdm_cuda_check_weight(w, "get_rows", err);
    if (st) return st;
    if (n < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "get_rows: n = %d", (int)n);
    if (n == 0) return TANDEM_OK;
    if (!ids || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "get_rows: NULL ids or out");
    if ((st = tdm_check_ids(ids, n, w->rows, "get_rows", err))) return st;
    int32_t *h = (int32_t *)tdm_cuda_meta_host(c, (size_t)n * sizeof(int32_t), err);
    if (!h) return err ? err->status : TANDEM_ERR_BACKEND;
    memcpy(h, ids, (size_t)n * sizeof(int32_t));
    const int32_t *d = (const int32_t *)tdm_cuda_meta_upload(c, (size_t)n * sizeof(int32_t), err);
    if (!d) return err ? err->status : TANDEM_ERR_BACKEND;
    return get_rows_launch(c, w, d, n, out, err);
}

tandem_status tdm_cuda_get_rows_dev(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n, float *out,
                                    tdm_err *err) {
    GET_CUDA("get_rows_dev");
    tandem_status st = tdm_cuda_check_weight(w, "get_rows_dev", err);
    if (st) return st;
    if (n < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "get_rows_dev: n = %d", (int)n);
    if (n == 0) return TANDEM_OK;
    if (!ids || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "get_rows_dev: NULL ids or out");
    return get_rows_launch(c, w, ids, n, out, err);
}

/* ---- rmsnorm ------------------------------------------------------------------- */

__global__ void k_rmsnorm(const float *x, const float *g, int32_t dim, float eps, float *o) {
    TDM_PDL_ENTRY();
    const float *xr = x + (size_t)blockIdx.x * dim;
    float *orow = o + (size_t)blockIdx.x * dim;
    double ss = 0;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) ss += (double)xr[k] * xr[k];
    ss = tdm_cu_block_sum(ss);
    const float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) orow[k] = xr[k] * inv * g[k];
}

tandem_status tdm_cuda_rmsnorm(tdm_backend *b, const float *x, const float *gamma, int32_t n, int32_t dim,
                               float eps, float *out, tdm_err *err) {
    GET_CUDA("rmsnorm");
    if (n < 0 || dim <= 0 || !(eps >= 0))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rmsnorm: n = %d, dim = %d, eps = %g", (int)n, (int)dim,
                          (double)eps);
    if (n == 0) return TANDEM_OK;
    if (!x || !gamma || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rmsnorm: NULL pointer");
    tdm_launch(k_rmsnorm, n, TDM_CUDA_THREADS, 0, c->stream, x, gamma, dim, eps, out);
    TDM_CU_LAUNCHED("rmsnorm");
    return TANDEM_OK;
}

/* ---- scatter_cols ---------------------------------------------------------------- */

/* Grid (column chunks, rows): y's rows all fill, then x's columns to their ids (the
 * second kernel after the first in the stream). */
__global__ void k_fill_rows(float *y, int32_t dim, float fill) {
    TDM_PDL_ENTRY();
    const int32_t k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k < dim) y[(size_t)blockIdx.y * dim + k] = fill;
}

__global__ void k_scatter_cols(const float *x, int32_t nx, const int32_t *ids, int32_t dim, float *y) {
    TDM_PDL_ENTRY();
    const int32_t j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < nx) y[(size_t)blockIdx.y * dim + ids[j]] = x[(size_t)blockIdx.y * nx + j];
}

tandem_status tdm_cuda_scatter_cols(tdm_backend *b, const float *x, int32_t n, int32_t nx, const int32_t *ids,
                                    int32_t dim, float fill, float *y, tdm_err *err) {
    GET_CUDA("scatter_cols");
    tandem_status st = tdm_check_scatter(x, n, nx, ids, dim, y, err);
    if (st || n == 0) return st;
    if (n > 65535) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "scatter_cols: %d rows (at most 65535)", (int)n);
    const int32_t t = TDM_CUDA_THREADS;
    tdm_launch(k_fill_rows, dim3((unsigned)((dim + t - 1) / t), (unsigned)n), t, 0, c->stream, y, dim, fill);
    TDM_CU_LAUNCHED("scatter_cols (fill)");
    tdm_launch(k_scatter_cols, dim3((unsigned)((nx + t - 1) / t), (unsigned)n), t, 0, c->stream, x, nx, ids, dim, y);
    TDM_CU_LAUNCHED("scatter_cols");
    return TANDEM_OK;
}

/* ---- mask_rows ------------------------------------------------------------------- */

/* Grid (column chunks, rows): a thread per column reads its word (neighbours share
 * it through the cache) and writes fill where the bit is clear. */
__global__ void k_mask_rows(float *x, int32_t dim, const uint32_t *mask, size_t words, float fill) {
    TDM_PDL_ENTRY();
    const int32_t v = blockIdx.x * blockDim.x + threadIdx.x;
    if (v >= dim) return;
    const uint32_t w = mask[(size_t)blockIdx.y * words + (size_t)(v >> 5)];
    if (!(w >> (v & 31) & 1u)) x[(size_t)blockIdx.y * dim + v] = fill;
}

tandem_status tdm_cuda_mask_rows(tdm_backend *b, float *x, int32_t n, int32_t dim, const uint32_t *mask, float fill,
                                 tdm_err *err) {
    GET_CUDA("mask_rows");
    tandem_status st = tdm_check_rows("mask_rows", x, mask, n, dim, err);
    if (st || n == 0) return st;
    if (n > 65535) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "mask_rows: %d rows (at most 65535)", (int)n);
    const int32_t t = TDM_CUDA_THREADS;
    tdm_launch(k_mask_rows, dim3((unsigned)((dim + t - 1) / t), (unsigned)n), t, 0, c->stream, x, dim, mask,
               ((size_t)dim + 31) / 32, fill);
    TDM_CU_LAUNCHED("mask_rows");
    return TANDEM_OK;
}

/* ---- edit_rows ------------------------------------------------------------------- */

/* Grid (1, rows): a block per row, its threads striding over the row's edits (ids
 * distinct within a row: no two threads write one logit); the formula of
 * tdm_logit_edit_apply (logit_edit.h). */
__global__ void k_edit_rows(float *x, int32_t dim, const tdm_logit_edit *edits, const int32_t *off) {
    TDM_PDL_ENTRY();
    const int32_t r = blockIdx.y, end = off[r + 1];
    for (int32_t j = off[r] + threadIdx.x; j < end; j += blockDim.x) {
        const tdm_logit_edit ed = edits[j];
        float *p = x + (size_t)r * dim + ed.id;
        float y = __fadd_rn(*p, ed.bias); /* (no contraction into FMAs: the CPU's rounding) */
        y = y > 0 ? __fmul_rn(y, ed.pos) : __fmul_rn(y, ed.neg);
        *p = __fadd_rn(y, ed.add);
    }
}

tandem_status tdm_cuda_edit_rows(tdm_backend *b, float *x, int32_t n, int32_t dim, const tdm_logit_edit *edits,
                                 const int32_t *off, tdm_err *err) {
    GET_CUDA("edit_rows");
    if (n < 0 || dim <= 0 || (n > 0 && (!x || !off || !edits)))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "edit_rows: bad shape (n %d, dim %d)", (int)n, (int)dim);
    if (n == 0) return TANDEM_OK;
    if (n > 65535) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "edit_rows: %d rows (at most 65535)", (int)n);
    tdm_launch(k_edit_rows, dim3(1u, (unsigned)n), TDM_CUDA_THREADS, 0, c->stream, x, dim, edits, off);
    TDM_CU_LAUNCHED("edit_rows");
    return TANDEM_OK;
}

/* ---- row_top ---------------------------------------------------------------------- */

#define ROW_TOP_THREADS 256

/* (v, i) becomes the better of it and (ov, oi): the larger value, ties the lower id */
__device__ __forceinline__ void rt_better(float &v, int32_t &i, float ov, int32_t oi) {
    if (ov > v || (ov == v && oi < i)) v = ov, i = oi;
}

/* A block's best (v, i) to every thread. */
__device__ void rt_block_best(float &v, int32_t &i, float *sv, int32_t *si) {
    for (int o = 16; o > 0; o >>= 1) rt_better(v, i, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, i, o));
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); /* (sv / si free from the previous call) */
    if (lane == 0) sv[w] = v, si[w] = i;
    __syncthreads();
    v = sv[0], i = si[0];
    for (int x = 1; x < ROW_TOP_THREADS / 32; x++) rt_better(v, i, sv[x], si[x]);
}

/* Grid (rows): a block per row.  Each thread keeps the k largest of its strided
 * entries (in id order, so ties keep the lower id first) and the row's max; the sum
 * of exp(x - max) in double; then k rounds of a block-wide best over the threads'
 * list heads, the winner's head moving on. */
__global__ void k_row_top(const float *x, int32_t dim, int32_t k, const int32_t *want, tdm_row_top *out) {
    TDM_PDL_ENTRY();
    __shared__ float sv[ROW_TOP_THREADS / 32];
    __shared__ int32_t si[ROW_TOP_THREADS / 32];
    __shared__ double sd[ROW_TOP_THREADS / 32];
    const float *row = x + (size_t)blockIdx.x * dim;
    float lv[TDM_ROW_TOP_MAX];
    int32_t li[TDM_ROW_TOP_MAX];
    int32_t have = 0;
    float m = -INFINITY;
    for (int32_t v = threadIdx.x; v < dim; v += blockDim.x) {
        const float xv = row[v];
        m = fmaxf(m, xv);
        if (k > 0 && (have < k || xv > lv[k - 1])) {
            int32_t at = have < k ? have++ : k - 1;
            while (at > 0 && xv > lv[at - 1]) {
                lv[at] = lv[at - 1], li[at] = li[at - 1];
                at--;
            }
            lv[at] = xv, li[at] = v;
        }
    }
    int32_t mi = 0;
    rt_block_best(m, mi, sv, si);
    double acc = 0;
    for (int32_t v = threadIdx.x; v < dim; v += blockDim.x) acc += (double)expf(row[v] - m);
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) sd[threadIdx.x >> 5] = acc;
    __syncthreads();
    tdm_row_top *o = out + blockIdx.x;
    if (threadIdx.x == 0) {
        double sum = 0;
        for (int w = 0; w < ROW_TOP_THREADS / 32; w++) sum += sd[w];
        o->lse = (double)m + log(sum);
        o->k = k;
        const int32_t t = want[blockIdx.x];
        o->want = t >= 0 && t < dim ? row[t] : 0.0f;
    }
    int32_t head = 0;
    for (int32_t j = 0; j < k; j++) {
        float bv = head < have ? lv[head] : -INFINITY;
        int32_t bi = head < have ? li[head] : INT32_MAX;
        rt_block_best(bv, bi, sv, si);
        if (head < have && li[head] == bi) head++; /* (ids are distinct: one winner) */
        if (threadIdx.x == 0) o->ids[j] = bi, o->val[j] = bv;
    }
}

tandem_status tdm_cuda_row_top(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t k, const int32_t *want,
                               tdm_row_top *out, tdm_err *err) {
    GET_CUDA("row_top");
    if (n < 0 || dim <= 0 || k < 0 || k > TDM_ROW_TOP_MAX || k > dim || (n > 0 && (!x || !want || !out)))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "row_top: n = %d, dim = %d, k = %d (0..%d)", (int)n, (int)dim,
                          (int)k, TDM_ROW_TOP_MAX);
    if (n == 0) return TANDEM_OK;
    tdm_launch(k_row_top, (unsigned)n, ROW_TOP_THREADS, 0, c->stream, x, dim, k, want, out);
    TDM_CU_LAUNCHED("row_top");
    return TANDEM_OK;
}

/* ---- add_bias, swiglu, gather_rows --------------------------------------------- */

__global__ void k_add_bias(float *y, const float *bias, int32_t dim) {
    TDM_PDL_ENTRY();
    float *row = y + (size_t)blockIdx.x * dim;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) row[k] += bias[k];
}

tandem_status tdm_cuda_add_bias(tdm_backend *b, float *y, const float *bias, int32_t n, int32_t dim,
                                tdm_err *err) {
    GET_CUDA("add_bias");
    if (n < 0 || dim <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "add_bias: n = %d, dim = %d", (int)n, (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!y || !bias) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "add_bias: NULL pointer");
    tdm_launch(k_add_bias, n, TDM_CUDA_THREADS, 0, c->stream, y, bias, dim);
    TDM_CU_LAUNCHED("add_bias");
    return TANDEM_OK;
}

__global__ void k_swiglu(const float *gu, int32_t ff, float *o) {
    TDM_PDL_ENTRY();
    const float *g = gu + (size_t)blockIdx.x * 2 * ff, *u = g + ff;
    float *orow = o + (size_t)blockIdx.x * ff;
    for (int32_t k = threadIdx.x; k < ff; k += blockDim.x) orow[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
}

tandem_status tdm_cuda_swiglu(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff, float *out,
                              tdm_err *err) {
    GET_CUDA("swiglu");
    if (n < 0 || ff <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "swiglu: n = %d, ff = %d", (int)n, (int)ff);
    if (n == 0) return TANDEM_OK;
    if (!gate_up || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "swiglu: NULL pointer");
    tdm_launch(k_swiglu, n, TDM_CUDA_THREADS, 0, c->stream, gate_up, ff, out);
    TDM_CU_LAUNCHED("swiglu");
    return TANDEM_OK;
}

__global__ void k_gather(const float *x, const int32_t *rows, int32_t dim, float *o) {
    TDM_PDL_ENTRY();
    const float *src = x + (size_t)rows[blockIdx.x] * dim;
    float *dst = o + (size_t)blockIdx.x * dim;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) dst[k] = src[k];
}

tandem_status tdm_cuda_gather_rows(tdm_backend *b, const float *x, const int32_t *rows, int32_t n, int32_t dim,
                                   float *out, tdm_err *err) {
    GET_CUDA("gather_rows");
    if (n < 0 || dim <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gather_rows: n = %d, dim = %d", (int)n, (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!x || !rows || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gather_rows: NULL pointer");
    for (int32_t i = 0; i < n; i++)
        if (rows[i] < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gather_rows: row %d at %d", (int)rows[i], (int)i);
    int32_t *h = (int32_t *)tdm_cuda_meta_host(c, (size_t)n * sizeof(int32_t), err);
    if (!h) return err ? err->status : TANDEM_ERR_BACKEND;
    memcpy(h, rows, (size_t)n * sizeof(int32_t));
    const int32_t *d = (const int32_t *)tdm_cuda_meta_upload(c, (size_t)n * sizeof(int32_t), err);
    if (!d) return err ? err->status : TANDEM_ERR_BACKEND;
    tdm_launch(k_gather, n, TDM_CUDA_THREADS, 0, c->stream, x, d, dim, out);
    TDM_CU_LAUNCHED("gather_rows");
    return TANDEM_OK;
}

/* ---- rope ---------------------------------------------------------------------- */

/* Block (row i, head h): pair t < half rotated by theta = pos[i] * freq[t] (freq:
 * the table, device memory; NULL: freq_scale * freq_base^(-2t / n_rot)), cos and
 * sin times mscale, as the CPU's table; normal layout pairs (2t, 2t + 1), NEOX (t,
 * t + half). */
__global__ void k_rope(float *x, int32_t row_stride, int32_t head_dim, const int32_t *pos, int32_t half,
                       const double *freq, double freq_base, double freq_scale, double mscale, bool neox) {
    TDM_PDL_ENTRY();
    float *v = x + (size_t)blockIdx.x * row_stride + (size_t)blockIdx.y * head_dim;
    const double p = (double)pos[blockIdx.x];
    for (int32_t t = threadIdx.x; t < half; t += blockDim.x) {
        const double f = freq ? freq[t] : freq_scale * pow(freq_base, -2.0 * t / (2.0 * half));
        const double theta = p * f;
        const float cs = (float)(cos(theta) * mscale), sn = (float)(sin(theta) * mscale);
        const int32_t a = neox ? t : 2 * t, bb = neox ? t + half : 2 * t + 1;
        const float x0 = v[a], x1 = v[bb];
        v[a] = x0 * cs - x1 * sn;
        v[bb] = x0 * sn + x1 * cs;
    }
}

tandem_status tdm_cuda_rope(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                            int32_t head_dim, const int32_t *pos, const tdm_rope_params *rp, tdm_err *err) {
    GET_CUDA("rope");
    if (n < 0 || n_head <= 0 || head_dim <= 0 || (int64_t)n_head * head_dim > row_stride)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: n = %d, n_head = %d, head_dim = %d, row_stride = %d",
                          (int)n, (int)n_head, (int)head_dim, (int)row_stride);
    if (!rp) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: NULL params");
    if (rp->n_rot <= 0 || rp->n_rot % 2 != 0 || rp->n_rot > head_dim)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: n_rot %d (head_dim %d)", (int)rp->n_rot, (int)head_dim);
    if (!rp->freq && (!(rp->freq_base > 0) || !isfinite(rp->freq_scale)))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: freq_base %g, freq_scale %g", (double)rp->freq_base,
                          (double)rp->freq_scale);
    const float mscale = rp->mscale == 0.0f ? 1.0f : rp->mscale;
    if (!isfinite(mscale)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: mscale %g", (double)rp->mscale);
    if (n == 0) return TANDEM_OK;
    if (!x || !pos) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: NULL x or pos");
    for (int32_t i = 0; i < n; i++)
        if (pos[i] < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rope: position %d at %d", (int)pos[i], (int)i);
    if (n_head > 65535) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "rope: %d heads", (int)n_head);
    int32_t *h = (int32_t *)tdm_cuda_meta_host(c, (size_t)n * sizeof(int32_t), err);
    if (!h) return err ? err->status : TANDEM_ERR_BACKEND;
    memcpy(h, pos, (size_t)n * sizeof(int32_t));
    const int32_t *d = (const int32_t *)tdm_cuda_meta_upload(c, (size_t)n * sizeof(int32_t), err);
    if (!d) return err ? err->status : TANDEM_ERR_BACKEND;
    tdm_launch(k_rope, dim3((unsigned)n, (unsigned)n_head), 64, 0, c->stream, x, row_stride, head_dim, d, rp->n_rot / 2,
                                                                      rp->freq, (double)rp->freq_base,
                                                                      (double)rp->freq_scale, (double)mscale, rp->neox);
    TDM_CU_LAUNCHED("rope");
    return TANDEM_OK;
}

/* ---- argmax -------------------------------------------------------------------- */

/* Block per row: the first index of the largest value, as tdm_argmax_finite finds
 * it: -1 when the row holds a NaN or an infinity; and when top is not NULL the
 * largest probability of the row's softmax, 1 / sum exp(x - max) (0 for a -1 row). */
__global__ void k_argmax(const float *x, int32_t dim, int32_t *ids, float *top) {
    TDM_PDL_ENTRY();
    __shared__ float bv[32];
    __shared__ int32_t bi[32];
    __shared__ float s_best;
    __shared__ double s_sum[32];
    const float *row = x + (size_t)blockIdx.x * dim;
    float best = -INFINITY;
    int32_t idx = INT32_MAX;
    int bad = 0;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) {
        const float v = row[k];
        bad |= !isfinite(v);
        if (v > best || (v == best && k < idx)) {
            best = v;
            idx = k;
        }
    }
    bad = __syncthreads_or(bad);
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) {
            best = ov;
            idx = oi;
        }
    }
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (lane == 0) {
        bv[wid] = best;
        bi[wid] = idx;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x >> 5); w++)
            if (bv[w] > best || (bv[w] == best && bi[w] < idx)) {
                best = bv[w];
                idx = bi[w];
            }
        ids[blockIdx.x] = bad ? -1 : idx;
        s_best = best;
    }
    if (!top) return;
    __syncthreads();
    const float mx = s_best;
    double sum = 0.0;
    if (!bad)
        for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) sum += (double)expf(row[k] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) s_sum[wid] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double t = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) t += s_sum[w];
        top[blockIdx.x] = bad || !(t > 0.0) ? 0.0f : (float)(1.0 / t);
    }
}

tandem_status tdm_cuda_argmax(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t *ids, tdm_err *err) {
    GET_CUDA("argmax");
    if (n < 0 || dim <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "argmax: n = %d, dim = %d", (int)n, (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!x || !ids) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "argmax: NULL pointer");
    int32_t *dev = (int32_t *)tdm_cuda_buf_get(c, &c->ids_buf, (size_t)n * sizeof(int32_t), "argmax", err);
    if (!dev) return err ? err->status : TANDEM_ERR_BACKEND;
    tdm_launch(k_argmax, n, 1024, 0, c->stream, x, dim, dev, (float *)NULL);
    TDM_CU_LAUNCHED("argmax");
    TDM_CU(cudaMemcpyAsync(ids, dev, (size_t)n * sizeof(int32_t), cudaMemcpyDeviceToHost, c->stream));
    TDM_CU(cudaStreamSynchronize(c->stream));
    return TANDEM_OK;
}

tandem_status tdm_cuda_argmax_dev(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t *ids, float *top,
                                  tdm_err *err) {
    GET_CUDA("argmax_dev");
    if (n < 0 || dim <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "argmax_dev: n = %d, dim = %d", (int)n, (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!x || !ids) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "argmax_dev: NULL pointer");
    tdm_launch(k_argmax, n, 1024, 0, c->stream, x, dim, ids, top);
    TDM_CU_LAUNCHED("argmax_dev");
    return TANDEM_OK;
}

/* ---- top k ------------------------------------------------------------------------ */

/* The order of the topk op: a before b when larger, ties to the lower index. */
__device__ __forceinline__ bool tk_before(float av, int32_t ai, float bv, int32_t bi) {
    return av > bv || (av == bv && ai < bi);
}

/* Block per row.  Each thread keeps its own first k entries in the order (one scan
 * of its elements, insertion into a short sorted list); then k rounds each take
 * the block's first list head and advance the list it came from (the indices are
 * the threads' own, so exactly one list holds it).  Every entry of the row's first
 * k is among its thread's first k, so the picks are the row's first k in the order.
 * Then the softmax probabilities of the picks: exp(v - max) / sum exp(x - max), the
 * sum in double as k_argmax's. */
__global__ void k_topk(const float *x, int32_t dim, int32_t k, int32_t *ids, float *probs) {
    TDM_PDL_ENTRY();
    __shared__ float bv[32], s_val[TDM_TOPK_MAX];
    __shared__ int32_t bi[32], s_idx[TDM_TOPK_MAX];
    __shared__ int s_bad;
    const float *row = x + (size_t)blockIdx.x * dim;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
    float lv[TDM_TOPK_MAX];
    int32_t li[TDM_TOPK_MAX];
    int32_t n_own = 0;
    int nonfin = 0;
    for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) {
        const float v = row[i];
        nonfin |= !isfinite(v);
        if (n_own == k && !tk_before(v, i, lv[k - 1], li[k - 1])) continue;
        int32_t p = n_own < k ? n_own++ : k - 1;
        for (; p > 0 && tk_before(v, i, lv[p - 1], li[p - 1]); p--) lv[p] = lv[p - 1], li[p] = li[p - 1];
        lv[p] = v;
        li[p] = i;
    }
    nonfin = __syncthreads_or(nonfin);
    if (threadIdx.x == 0) s_bad = nonfin;
    int32_t head = 0;
    for (int32_t j = 0; j < k; j++) {
        float best = head < n_own ? lv[head] : -INFINITY;
        int32_t idx = head < n_own ? li[head] : INT32_MAX;
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (tk_before(ov, oi, best, idx)) {
                best = ov;
                idx = oi;
            }
        }
        if (lane == 0) {
            bv[wid] = best;
            bi[wid] = idx;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < nw; w++)
                if (tk_before(bv[w], bi[w], best, idx)) {
                    best = bv[w];
                    idx = bi[w];
                }
            s_val[j] = best;
            s_idx[j] = idx;
        }
        __syncthreads();
        if (head < n_own && li[head] == s_idx[j]) head++;
    }
    const bool bad = s_bad != 0;
    const float mx = s_val[0];
    double sum = 0.0;
    if (!bad)
        for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) sum += (double)expf(row[i] - mx);
    const double t = tdm_cu_block_sum(sum);
    if (threadIdx.x == 0) {
        for (int32_t j = 0; j < k; j++) {
            const bool none = bad || s_idx[j] == INT32_MAX || !(t > 0.0);
            ids[(size_t)blockIdx.x * k + j] = none ? -1 : s_idx[j];
            probs[(size_t)blockIdx.x * k + j] = none ? 0.0f : (float)((double)expf(s_val[j] - mx) / t);
        }
    }
}

tandem_status tdm_cuda_topk_dev(tdm_cuda *c, const float *x, int32_t n, int32_t dim, int32_t k, int32_t *ids,
                                float *probs, tdm_err *err) {
    tdm_launch(k_topk, n, 1024, 0, c->stream, x, dim, k, ids, probs);
    TDM_CU_LAUNCHED("topk");
    return TANDEM_OK;
}

tandem_status tdm_cuda_topk(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t k, int32_t *ids,
                            float *probs, tdm_err *err) {
    GET_CUDA("topk");
    if (n < 0 || dim <= 0 || k <= 0 || k > TDM_TOPK_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "topk: n = %d, dim = %d, k = %d (1..%d)", (int)n, (int)dim, (int)k,
                          TDM_TOPK_MAX);
    if (n == 0) return TANDEM_OK;
    if (!x || !ids || !probs) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "topk: NULL pointer");
    const size_t each = (size_t)n * (size_t)k * sizeof(int32_t); /* (ids, then probs: 4 bytes each) */
    uint8_t *dev = (uint8_t *)tdm_cuda_buf_get(c, &c->topk_buf, 2 * each, "topk", err);
    if (!dev) return err ? err->status : TANDEM_ERR_BACKEND;
    tandem_status st = tdm_cuda_topk_dev(c, x, n, dim, k, (int32_t *)dev, (float *)(dev + each), err);
    if (st) return st;
    TDM_CU(cudaMemcpyAsync(ids, dev, each, cudaMemcpyDeviceToHost, c->stream));
    TDM_CU(cudaMemcpyAsync(probs, dev + each, each, cudaMemcpyDeviceToHost, c->stream));
    TDM_CU(cudaStreamSynchronize(c->stream));
    return TANDEM_OK;
}
