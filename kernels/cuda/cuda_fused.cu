/* cuda_fused.cu - the row kernels of the fused forward pass (cuda_blocks.cu), each
 * doing in one launch what the op table does in several:
 *   rmsnorm straight into what the next product reads (f32, f16, bf16, or int8
 *     blocks for the quantised kernels);
 *   the RoPE angles of a batch once per forward (shared by every layer and head);
 *   q/k/v bias, RoPE of q (in place) and of k, and the K / V writes into the paged
 *     cache, in one kernel (a q8_0 or fp8 cache: k rotated in place too, then each k
 *     and v head quantised into the cache by a warp);
 *   SwiGLU into the next product's input type.
 * Numerics follow the op kernels (cuda_rowops.cu): the sum of squares and the angles
 * in f64, everything else in f32. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include "cuda_fused.h"
#include "cuda_kvq8.cuh"
#include "cuda_quant.cuh"
#include "cuda_reduce.cuh"

/* ---- rmsnorm ------------------------------------------------------------------- */

__device__ __forceinline__ float row_inv_rms(const float *xr, int32_t dim, float eps) {
    double ss = 0;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) ss += (double)xr[k] * xr[k];
    ss = tdm_cu_block_sum(ss);
    return (float)(1.0 / sqrt(ss / dim + (double)eps));
}

/* Block per row: o[row] = x * inv_rms * g in type O. */
template <typename O> __global__ void k_rmsnorm_to(const float *x, const float *g, int32_t dim, float eps, O *o) {
    TDM_PDL_ENTRY();
    const float *xr = x + (size_t)blockIdx.x * dim;
    const float inv = row_inv_rms(xr, dim, eps);
    O *orow = o + (size_t)blockIdx.x * dim;
    for (int32_t k = threadIdx.x; k < dim; k += blockDim.x) orow[k] = tdm_cu_from_f32<O>(xr[k] * inv * g[k]);
}

/* Block per row: the normed row quantised per 32-element block (a warp per block). */
__global__ void k_rmsnorm_q8(const float *x, const float *g, int32_t dim, float eps, int8_t *q, float *d,
                             int32_t *qs) {
    TDM_PDL_ENTRY();
    const float *xr = x + (size_t)blockIdx.x * dim;
    const float inv = row_inv_rms(xr, dim, eps);
    const int32_t nb = dim / 32, lane = threadIdx.x & 31;
    for (int32_t b = threadIdx.x >> 5; b < nb; b += blockDim.x >> 5) {
        const int32_t k = b * 32 + lane;
        const size_t at = (size_t)blockIdx.x * dim + k, bt = (size_t)blockIdx.x * nb + b;
        tdm_cu_quant_block(xr[k] * inv * g[k], q + at, d + bt, qs + bt);
    }
}

tandem_status tdm_cuda_rmsnorm_to(tdm_cuda *c, const float *x, const float *gamma, int32_t n, int32_t dim, float eps,
                                  uint32_t type, void *out, const tdm_cuda_xq *xq, tdm_err *err) {
    if (n <= 0) return TANDEM_OK;
    const unsigned th = 1024; /* (a decode row is one block: as many threads as can help) */
    switch (type) {
    case TDM_F32: tdm_launch(k_rmsnorm_to<float>, n, th, 0, c->stream, x, gamma, dim, eps, (float *)out); break;
    case TDM_F16: tdm_launch(k_rmsnorm_to<__half>, n, th, 0, c->stream, x, gamma, dim, eps, (__half *)out); break;
    case TDM_BF16:
        tdm_launch(k_rmsnorm_to<__nv_bfloat16>, n, th, 0, c->stream, x, gamma, dim, eps, (__nv_bfloat16 *)out);
        break;
    case TDM_Q8_0:
        if (dim % 32 != 0) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "rmsnorm: int8 blocks of a %d row", (int)dim);
        tdm_launch(k_rmsnorm_q8, n, th, 0, c->stream, x, gamma, dim, eps, (int8_t *)xq->q, (float *)xq->d, (int32_t *)xq->qs);
        break;
    default: return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "rmsnorm: output %s", tdm_dtype_name(type));
    }
    TDM_CU_LAUNCHED("rmsnorm (fused)");
    return TANDEM_OK;
}

/* ---- RoPE angles, and q / k / v into place ------------------------------------- */

/* Block per row: cs[row][t] = (cos, sin) of pos * freq[t], times mscale (freq: the
 * table, device memory; NULL: freq_scale * base^(-2t / n_rot)), as k_rope. */
__global__ void k_rope_table(const tdm_cuda_row *rows, int32_t half, const double *freq, double freq_base,
                             double freq_scale, double mscale, float2 *cs) {
    TDM_PDL_ENTRY();
    const double p = (double)rows[blockIdx.x].pos;
    for (int32_t t = threadIdx.x; t < half; t += blockDim.x) {
        const double f = freq ? freq[t] : freq_scale * pow(freq_base, -2.0 * t / (2.0 * half));
        const double theta = p * f;
        cs[(size_t)blockIdx.x * half + t] = make_float2((float)(cos(theta) * mscale), (float)(sin(theta) * mscale));
    }
}

tandem_status tdm_cuda_rope_table(tdm_cuda *c, const tdm_cuda_row *rows, int32_t n, const tdm_rope_params *rp,
                                  float2 *cs, tdm_err *err) {
    if (n <= 0) return TANDEM_OK;
    const double mscale = rp->mscale == 0.0f ? 1.0 : (double)rp->mscale;
    tdm_launch(k_rope_table, n, 64, 0, c->stream, rows, rp->n_rot / 2, rp->freq, (double)rp->freq_base,
                                          (double)rp->freq_scale, mscale, cs);
    TDM_CU_LAUNCHED("rope table");
    return TANDEM_OK;
}

/* The rotation partner of pair t: (2t, 2t + 1), or NEOX (t, t + half). */
__device__ __forceinline__ void pair_of(int32_t t, int32_t half, bool neox, int32_t *a, int32_t *b) {
    *a = neox ? t : 2 * t;
    *b = neox ? t + half : 2 * t + 1;
}

#define ROPE_HEADS 4 /* heads (of q, k and v together) per thread block */

/* Of a thread block's heads [h0, h1) of row (q | k | v heads): + bias (then a
 * barrier), and heads [h0, r1) rotated in place, a thread per rotation pair, by the
 * row's angles rc. */
__device__ __forceinline__ void bias_rope_heads(float *row, const float *bias, int32_t h0, int32_t h1, int32_t r1,
                                                int32_t hd, int32_t half, bool neox, const float2 *rc) {
    if (bias) {
        for (int32_t j = h0 * hd + threadIdx.x; j < h1 * hd; j += blockDim.x) row[j] += bias[j];
        __syncthreads();
    }
    for (int32_t i = h0 * half + threadIdx.x; i < r1 * half; i += blockDim.x) {
        float *v = row + (size_t)(i / half) * hd;
        int32_t a, b;
        pair_of(i % half, half, neox, &a, &b);
        const float2 r = rc[i % half], x0 = make_float2(v[a], v[b]);
        v[a] = x0.x * r.x - x0.y * r.y;
        v[b] = x0.x * r.y + x0.y * r.x;
    }
}

/* Block (row, group of ROPE_HEADS heads of the row's q | k | v): + bias; q heads
 * rotated in place (a thread per rotation pair); k heads rotated into the K cache
 * ([blk][g][d][off]); v heads into the V cache ([blk][g][off][d]). */
template <typename C>
__global__ void k_rope_kv(float *qkv, int32_t stride, const float *bias, int32_t n_head, int32_t n_kv, int32_t hd,
                          int32_t half, bool neox, const float2 *cs, const tdm_cuda_row *rows, C *kc, C *vc,
                          int32_t bs) {
    TDM_PDL_ENTRY();
    float *row = qkv + (size_t)blockIdx.x * stride;
    const int32_t h0 = (int32_t)blockIdx.y * ROPE_HEADS, h1 = min(h0 + ROPE_HEADS, n_head + 2 * n_kv);
    const float2 *rc = cs + (size_t)blockIdx.x * half;
    const tdm_cuda_row m = rows[blockIdx.x];
    bias_rope_heads(row, bias, h0, h1, min(h1, n_head), hd, half, neox, rc); /* q: pairs in place */
    const int32_t rot = 2 * half, k0 = max(h0, n_head);
    for (int32_t i = k0 * hd + threadIdx.x; i < h1 * hd; i += blockDim.x) { /* k and v: elements */
        const int32_t h = i / hd, d = i % hd;
        const float *v = row + (size_t)h * hd;
        if (h >= n_head + n_kv) {
            const int32_t g = h - n_head - n_kv;
            vc[(((size_t)m.kv_blk * n_kv + g) * bs + m.kv_off) * hd + d] = tdm_cu_from_f32<C>(v[d]);
            continue;
        }
        float out = v[d];
        if (d < rot) { /* d is one end of its pair: find the pair and which end */
            const int32_t t = neox ? (d < half ? d : d - half) : d / 2;
            int32_t a, b;
            pair_of(t, half, neox, &a, &b);
            const float2 r = rc[t];
            out = d == a ? v[a] * r.x - v[b] * r.y : v[a] * r.y + v[b] * r.x;
        }
        const int32_t g = h - n_head;
        kc[(((size_t)m.kv_blk * n_kv + g) * hd + d) * bs + m.kv_off] = tdm_cu_from_f32<C>(out);
    }
}

/* The same for a q8_0 (C int8_t) or fp8 (C __nv_fp8_e4m3) cache
 * (src/base/kv_layout.h), ROPE_HEADS warps per block: + bias; q and k heads rotated
 * in place (a thread per rotation pair, as q above); then warp w quantises head
 * h0 + w, when it is a k or a v head, into its slot of the cache with its scale
 * (cuda_kvq8.cuh). */
template <typename C>
__global__ void k_rope_kv_q8(float *qkv, int32_t stride, const float *bias, int32_t n_head, int32_t n_kv, int32_t hd,
                             int32_t half, bool neox, const float2 *cs, const tdm_cuda_row *rows, uint8_t *kc,
                             uint8_t *vc, int32_t bs) {
    TDM_PDL_ENTRY();
    float *row = qkv + (size_t)blockIdx.x * stride;
    const int32_t h0 = (int32_t)blockIdx.y * ROPE_HEADS, h1 = min(h0 + ROPE_HEADS, n_head + 2 * n_kv);
    const float2 *rc = cs + (size_t)blockIdx.x * half;
    bias_rope_heads(row, bias, h0, h1, min(h1, n_head + n_kv), hd, half, neox, rc); /* q and k heads */
    __syncthreads();
    const tdm_cuda_row m = rows[blockIdx.x];
    const int64_t unit = tdm_kv_unit_bytes(TDM_Q8_0, bs, hd); /* (fp8's too) */
    const int32_t h = h0 + (int32_t)(threadIdx.x >> 5);
    if (h < n_head || h >= h1) return;
    const bool is_k = h < n_head + n_kv;
    const int32_t g = is_k ? h - n_head : h - n_head - n_kv;
    tdm_cu_kv8_write<C>(row + (size_t)h * hd, hd, (is_k ? kc : vc) + ((int64_t)m.kv_blk * n_kv + g) * unit, bs,
                        m.kv_off, is_k, (int)(threadIdx.x & 31));
}

tandem_status tdm_cuda_rope_kv(tdm_cuda *c, float *qkv, int32_t n, int32_t stride, const float *bias,
                               int32_t n_head, int32_t n_kv, int32_t hd, const tdm_rope_params *rp, const float2 *cs,
                               const tdm_cuda_row *rows, void *kc, void *vc, uint32_t cache_type, int32_t bs,
                               tdm_err *err) {
    if (n <= 0) return TANDEM_OK;
    const int32_t half = rp->n_rot / 2;
    const dim3 grid((unsigned)n, (unsigned)((n_head + 2 * n_kv + ROPE_HEADS - 1) / ROPE_HEADS));
    if (cache_type == TDM_Q8_0)
        tdm_launch(k_rope_kv_q8<int8_t>, grid, 32 * ROPE_HEADS, 0, c->stream, qkv, stride, bias, n_head, n_kv, hd, half,
                   rp->neox, cs, rows, (uint8_t *)kc, (uint8_t *)vc, bs);
    else if (cache_type == TDM_F8_E4M3)
        tdm_launch(k_rope_kv_q8<__nv_fp8_e4m3>, grid, 32 * ROPE_HEADS, 0, c->stream, qkv, stride, bias, n_head, n_kv, hd,
                   half, rp->neox, cs, rows, (uint8_t *)kc, (uint8_t *)vc, bs);
    else if (cache_type == TDM_F16)
        tdm_launch(k_rope_kv<__half>, grid, 128, 0, c->stream, qkv, stride, bias, n_head, n_kv, hd, half, rp->neox, cs, rows,
                                                    (__half *)kc, (__half *)vc, bs);
    else if (cache_type == TDM_F32)
        tdm_launch(k_rope_kv<float>, grid, 128, 0, c->stream, qkv, stride, bias, n_head, n_kv, hd, half, rp->neox, cs, rows,
                                                   (float *)kc, (float *)vc, bs);
    else
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "rope_kv: cache type %s", tdm_dtype_name(cache_type));
    TDM_CU_LAUNCHED("rope + kv write");
    return TANDEM_OK;
}

/* ---- SwiGLU ---------------------------------------------------------------------- */

template <typename O> __global__ void k_swiglu_to(const float *gu, int32_t ff, O *o) {
    TDM_PDL_ENTRY();
    const float *g = gu + (size_t)blockIdx.x * 2 * ff, *u = g + ff;
    O *orow = o + (size_t)blockIdx.x * ff;
    for (int32_t k = threadIdx.x; k < ff; k += blockDim.x) orow[k] = tdm_cu_from_f32<O>(g[k] / (1.0f + expf(-g[k])) * u[k]);
}

tandem_status tdm_cuda_swiglu_to(tdm_cuda *c, const float *gate_up, int32_t n, int32_t ff, uint32_t type, void *out,
                                 tdm_err *err) {
    if (n <= 0) return TANDEM_OK;
    switch (type) {
    case TDM_F32: tdm_launch(k_swiglu_to<float>, n, 256, 0, c->stream, gate_up, ff, (float *)out); break;
    case TDM_F16: tdm_launch(k_swiglu_to<__half>, n, 256, 0, c->stream, gate_up, ff, (__half *)out); break;
    case TDM_BF16: tdm_launch(k_swiglu_to<__nv_bfloat16>, n, 256, 0, c->stream, gate_up, ff, (__nv_bfloat16 *)out); break;
    default: return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "swiglu: output %s", tdm_dtype_name(type));
    }
    TDM_CU_LAUNCHED("swiglu (fused)");
    return TANDEM_OK;
}
