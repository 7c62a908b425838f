/* cuda_gemv.cu - matrix products of one to a few rows (decode, verification):
 * y[n][ldy] (+)= x[n][cols] W^T, streaming W once per tile of up to 8 input rows,
 * at close to memory bandwidth.  The tiles of a product are one launch (blockIdx.x:
 * the tile, blockIdx.y: the block of W rows, so a W block's tiles run side by side
 * and all but the first read it from L2), a partial last tile included except on
 * tall weights (tdm_cuda_gemv): a 9-row verification of a small model reads W from
 * memory once, as a decode step does.
 *
 * Each warp owns two W rows (or, for the SwiGLU epilogue, gate row j and up row
 * j + ff, so it can write silu(gate) * up itself) and walks them with 16-byte
 * loads that bypass L1 (W is read once); x stays in L1 / L2 and is read with
 * 16-byte loads too.  Every lane accumulates its columns in increasing order and the
 * warp adds the lanes with a fixed butterfly, so an output element is computed by
 * the same operations whatever the number of rows n and whatever the other rows
 * are: decode and verification of the same row give identical results.
 *
 * A weight whose W rows are too few to keep every multiprocessor busy (gv_ksplit:
 * 7B shapes' Wo and W2, 0.48 waves of blocks at 8 rows, ncu: 1.5-1.7 TB/s; a 160m
 * draft's products) has its columns split into ks = 2 or 4 parts, each W row summed
 * by ks warps of one block over [p n8 / ks, (p + 1) n8 / ks) in the same way, their
 * sums added in part order through shared memory; ks depends on the weight alone.
 *
 *   f16 / bf16 (rows layout, cols % 8 == 0): W converted to f32 in registers,
 *     f32 FMAs with f32 x.  At one row W streams at 3.5-4.0 TB/s (7B shapes, back to
 *     back); at 5 rows at 2.3-2.8 (ncu, Wqkv: 16 warps a multiprocessor at 118
 *     registers, three quarters of warp time waiting on loads).  Measured without
 *     gain (2026-12-03): W loads software-pipelined in registers, each row split over
 *     the four warps of a block (5.8 waves instead of 1.45), W staged in shared
 *     memory by cp.async (6.26 ms for a 5-row 7B forward became 6.37-6.75).
 *   q8_0 / q4_0 (QSPLIT layout, rows 16-byte aligned): x quantised per 32-element
 *     block to int8 (tdm_cuda_quantize_x), int8 dot products (dp4a) per block, then
 *     acc += isum * (d_w * d_x) in f32; q4_0 subtracts its offset of 8 per block
 *     exactly (isum - 8 * sum q_x).
 *   q4_k, q5_k, q6_k (rows layout, whole super-blocks): x quantised as for q8_0,
 *     int8 dot products per sub-block with the scales (and mins) applied in f32
 *     (cuda_gemv_kq.cu, whose header tells the lanes' chunks).
 *   q4_1, q5_0, q5_1, q2_k, q3_k (rows layout), and q4_k .. q6_k as the reference
 *     (tdm_backend_cuda_force_matmul(b, 3)): each lane dequantises groups of 16
 *     elements in registers (tdm_cu_deq16, the host's values exactly), f32 FMAs with
 *     f32 x; 32 lanes cover 512 consecutive elements per step.  (This path streamed
 *     a 7B Q4_K_M file at about a third of its roofline: the f32 work per weight byte
 *     bound it, not memory.)
 */
#include <cuda_fp16.h>

#include "cuda_fp8.cuh"
#include "cuda_gemv.cuh"
#include "cuda_internal.h"
#include "cuda_reduce.cuh"
#include "cuda_weights.cuh"

/* 8 consecutive 16-bit elements (f16 or bf16) as f32. */
template <uint32_t T> __device__ __forceinline__ void cvt8(const uint4 &u, float f[8]) {
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (T == TDM_F16) {
            const float2 p = __half22float2(*reinterpret_cast<const __half2 *>(&v[i]));
            f[2 * i] = p.x;
            f[2 * i + 1] = p.y;
        } else {
            f[2 * i] = __uint_as_float(v[i] << 16);
            f[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);
        }
    }
}

/* 8 bytes from global memory, bypassing L1 (as tdm_cu_ld_stream). */
__device__ __forceinline__ uint2 ld_stream8(const void *p) {
    uint2 v;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

/* Elements 8 k8 .. 8 k8 + 7 of W row wr as f32: 16 bytes of f16 / bf16, or 8 bytes
 * of FP8 E4M3 (unscaled: the kernels multiply a row's sums by its scale). */
template <uint32_t T> __device__ __forceinline__ void ld8(const uint8_t *wr, int32_t k8, float f[8]) {
    if (T == TDM_F8_E4M3) {
        const uint2 u = ld_stream8(wr + (size_t)k8 * 8);
        const uint32_t v[2] = {u.x, u.y};
#pragma unroll
        for (int i = 0; i < 2; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float2 p = tdm_cu_e4m3x2_to_float2((uint16_t)(v[i] >> (16 * h)));
                f[4 * i + 2 * h] = p.x;
                f[4 * i + 2 * h + 1] = p.y;
            }
    } else {
        cvt8<T>(tdm_cu_ld_stream((const uint4 *)wr + k8), f);
    }
}

/* f16 / bf16 / fp8_e4m3 (its per-row scales in wscale, NULL for the others) with two
 * W rows a warp. */
template <uint32_t T, int NR, int EPI>
__global__ void __launch_bounds__(GV_WARPS * 32)
k_gemv16(const uint8_t *__restrict__ w, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
         const float *__restrict__ x, float *y, int32_t ldy, int32_t n_rows, int32_t ks,
         const float *__restrict__ wscale) {
    TDM_PDL_ENTRY();
    const gv_rows r = rows_of<EPI>(n_out, ff, ks);
    if (!r.active && ks == 1) return; /* (with parts, every warp reaches the barrier) */
    x += (size_t)blockIdx.x * GV_TILE * cols; /* (this block's tile of input rows) */
    y += (size_t)blockIdx.x * GV_TILE * ldy;
    const int32_t lane = (int32_t)(threadIdx.x & 31), last = tile_last<NR>(n_rows);
    const uint8_t *wa = w + (size_t)r.ra * row_bytes, *wb = w + (size_t)r.rb * row_bytes;
    float sa[NR], sb[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) sa[i] = sb[i] = 0.0f;
    int32_t lo, hi;
    gv_part(cols / 8, ks, &lo, &hi);
    if (!r.active) hi = lo;
#pragma unroll 4
    for (int32_t k8 = lo + lane; k8 < hi; k8 += 32) {
        float fa[8], fb[8];
        ld8<T>(wa, k8, fa);
        ld8<T>(wb, k8, fb);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const float4 *xp = (const float4 *)(x + (size_t)min(i, last) * cols) + 2 * k8;
            const float4 p = __ldg(xp), q = __ldg(xp + 1);
            const float xv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
            float u = sa[i], v = sb[i];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                u = fmaf(fa[e], xv[e], u);
                v = fmaf(fb[e], xv[e], v);
            }
            sa[i] = u;
            sb[i] = v;
        }
    }
    if (T == TDM_F8_E4M3 && r.active) {
        const float ca = wscale[r.ra], cb = wscale[r.rb];
#pragma unroll
        for (int i = 0; i < NR; i++) {
            sa[i] *= ca;
            sb[i] *= cb;
        }
    }
    gv_store<NR, EPI>(r, sa, sb, y, ldy, last, ks);
}

/* f16 / bf16 with four W rows a warp (STORE / ACCUM: rows 4w .. 4w + 3; SWIGLU:
 * gate rows 2w, 2w + 1 and their up rows), for tiles of three or more input rows:
 * each x load feeds twice the W rows, so x (f32, twice W's bytes per element and
 * read once per input row) no longer saturates L1 as the rows grow.  Every output
 * element takes exactly k_gemv16's operations (the same lanes, columns, FMA order
 * and butterfly), so decode on k_gemv16 and verification here agree bit for bit. */
template <uint32_t T, int NR, int EPI>
__global__ void __launch_bounds__(GV_WARPS * 32)
k_gemv16w(const uint8_t *__restrict__ w, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
          const float *__restrict__ x, float *y, int32_t ldy, int32_t n_rows, int32_t ks,
          const float *__restrict__ wscale) {
    TDM_PDL_ENTRY();
    const int32_t warp = ((int32_t)blockIdx.y * GV_WARPS + (int32_t)(threadIdx.x >> 5)) / ks; /* (its group) */
    int32_t row[4], out[4];
    bool has[4];
    if (EPI == TDM_EPI_SWIGLU) { /* outputs 2w, 2w + 1: gate rows then up rows */
        for (int j = 0; j < 2; j++) {
            out[j] = 2 * warp + j;
            has[j] = has[j + 2] = out[j] < n_out;
            row[j] = has[j] ? out[j] : 2 * warp;
            row[j + 2] = row[j] + ff;
        }
    } else {
        for (int j = 0; j < 4; j++) {
            out[j] = 4 * warp + j;
            has[j] = out[j] < n_out;
            row[j] = has[j] ? out[j] : 4 * warp;
        }
    }
    if (!has[0] && ks == 1) return; /* (with parts, every warp reaches the barrier) */
    x += (size_t)blockIdx.x * GV_TILE * cols;
    y += (size_t)blockIdx.x * GV_TILE * ldy;
    const int32_t lane = (int32_t)(threadIdx.x & 31), last = tile_last<NR>(n_rows);
    const uint8_t *wr[4];
#pragma unroll
    for (int j = 0; j < 4; j++) wr[j] = w + (size_t)row[j] * row_bytes;
    float acc[4][NR];
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < NR; i++) acc[j][i] = 0.0f;
    int32_t lo, hi;
    gv_part(cols / 8, ks, &lo, &hi);
    if (!has[0]) hi = lo;
#pragma unroll 2
    for (int32_t k8 = lo + lane; k8 < hi; k8 += 32) {
        float f[4][8];
#pragma unroll
        for (int j = 0; j < 4; j++) ld8<T>(wr[j], k8, f[j]);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const float4 *xp = (const float4 *)(x + (size_t)min(i, last) * cols) + 2 * k8;
            const float4 p = __ldg(xp), q = __ldg(xp + 1);
            const float xv[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                float u = acc[j][i];
#pragma unroll
                for (int e = 0; e < 8; e++) u = fmaf(f[j][e], xv[e], u);
                acc[j][i] = u;
            }
        }
    }
    if (T == TDM_F8_E4M3 && has[0])
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float cj = wscale[row[j]];
#pragma unroll
            for (int i = 0; i < NR; i++) acc[j][i] *= cj;
        }
    /* lane i: input row i's sums (as gv_store) */
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NR; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float t = tdm_cu_warp_sum(acc[j][i]);
            if (lane == i) v[j] = t;
        }
    if (ks > 1) {
        __shared__ float red[GV_WARPS][GV_TILE][4];
        if (!gv_combine<4>(v, ks, red)) return;
    }
    if (!has[0] || lane >= NR || lane > last) return;
    float *yr = y + (size_t)lane * ldy;
    if (EPI == TDM_EPI_SWIGLU) {
        for (int j = 0; j < 2; j++)
            if (has[j]) yr[out[j]] = v[j] / (1.0f + expf(-v[j])) * v[j + 2];
    } else {
        for (int j = 0; j < 4; j++)
            if (has[j]) {
                if (EPI == TDM_EPI_ACCUM) yr[out[j]] += v[j];
                else yr[out[j]] = v[j];
            }
    }
}

/* Whether a weight is tall: its blocks of four W rows a warp still cover every SM.
 * A small model's products are latency-bound (more blocks win); a tall weight's are
 * bandwidth-bound at one row and compute-bound at 8. */
static bool gv_tall(const tdm_cuda *c, const tdm_weight *w) {
    return w->rows >= (int64_t)4 * GV_WARPS * TDM_MAX(c->n_sm, 1);
}

/* W rows a warp of the f16 / bf16 kernels takes for tiles of nr input rows: the
 * wide kernel from three rows of a tall weight; decode keeps two, for more warps in
 * flight.  (Either gives the same bits.) */
static int gv_rows_per_warp(const tdm_cuda *c, const tdm_weight *w, int nr) {
    const bool t16 = w->type == TDM_F16 || w->type == TDM_BF16 || w->type == TDM_F8_E4M3;
    return t16 && w->layout == TDM_LAYOUT_ROWS && nr >= 3 && gv_tall(c, w) ? 4 : 2;
}

/* Whether w's products take the K-quant kernels of cuda_gemv_kq.cu (int8 x): Q4_K,
 * Q5_K and Q6_K rows, unless a benchmark asked for the dequantising reference
 * kernel (tdm_backend_cuda_force_matmul(b, 3)). */
static bool gv_kq(const tdm_cuda *c, const tdm_weight *w) { return c->force_mm != 3 && tdm_gemv_kq_takes(w); }

bool tdm_cuda_gemv_reads_xq(const tdm_cuda *c, const tdm_weight *w) {
    if (w->layout == TDM_LAYOUT_QSPLIT) return tdm_cuda_gemv_fast(w);
    return gv_kq(c, w);
}

/* Parts the columns of an f16 / bf16 weight are summed in (1, 2 or 4; the kernels'
 * gv_part): a weight whose blocks of four W rows a warp would not fill the GPU twice
 * over (7B shapes: Wo and W2's 4096 rows, 0.48 waves; a 160m draft's 768-row
 * products) gives each W row ks warps, each at least 32 chunks of 8 columns, their
 * sums added in part order.  It depends on the weight and the device only, never on
 * the number of input rows, so a decode row and the same row in a verification still
 * get the same bits (cuda_gemv/types_shapes_rows checks).  (Measured against no
 * split, and against splitting while blocks number fewer than 4 per multiprocessor,
 * both slower: bench/RESULTS.md, 2026-12-05.)  The K-quant kernels (two W rows a
 * warp, chunks of 32 columns) split by the same rule counted in their own units. */
static int32_t gv_ksplit(const tdm_cuda *c, const tdm_weight *w) {
    if (gv_kq(c, w)) { /* the K-quant kernels: two W rows a warp, chunks of 32 elements */
        const int64_t blocks = (w->rows + 2 * GV_WARPS - 1) / (2 * GV_WARPS), n32 = w->cols / 32;
        int32_t ks = 1;
        while (2 * ks <= GV_KSPLIT_MAX && blocks * ks < 2 * (int64_t)c->n_sm && n32 / (2 * ks) >= 32) ks *= 2;
        return ks;
    }
    if ((w->type != TDM_F16 && w->type != TDM_BF16 && w->type != TDM_F8_E4M3) || w->layout != TDM_LAYOUT_ROWS)
        return 1;
    const int64_t blocks = (w->rows + 4 * GV_WARPS - 1) / (4 * GV_WARPS), n8 = w->cols / 8;
    int32_t ks = 1;
    while (2 * ks <= GV_KSPLIT_MAX && blocks * ks < 2 * (int64_t)c->n_sm && n8 / (2 * ks) >= 32) ks *= 2;
    return ks;
}


/* q8_0, QSPLIT rows: [cols] int8 quants, then [cols / 32] f16 scales.  Lane chunks
 * of 16 quants (half a block). */
template <int NR, int EPI>
__global__ void __launch_bounds__(GV_WARPS * 32)
k_gemv_q8(const uint8_t *__restrict__ w, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
          tdm_cuda_xq xq, float *y, int32_t ldy, int32_t n_rows) {
    TDM_PDL_ENTRY();
    const gv_rows r = rows_of<EPI>(n_out, ff);
    if (!r.active) return;
    const int32_t lane = (int32_t)(threadIdx.x & 31), nb = cols / TDM_QK, last = tile_last<NR>(n_rows);
    xq = tdm_gv_tile(xq, cols, nb);
    y += (size_t)blockIdx.x * GV_TILE * ldy;
    const uint8_t *rowa = w + (size_t)r.ra * row_bytes, *rowb = w + (size_t)r.rb * row_bytes;
    const uint16_t *da = (const uint16_t *)(rowa + cols), *db = (const uint16_t *)(rowb + cols);
    float sa[NR], sb[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) sa[i] = sb[i] = 0.0f;
    const int32_t n16 = cols / 16;
#pragma unroll 4
    for (int32_t c = lane; c < n16; c += 32) {
        const uint4 qa = tdm_cu_ld_stream(rowa + 16 * (size_t)c), qb = tdm_cu_ld_stream(rowb + 16 * (size_t)c);
        const int32_t b = c >> 1;
        const float dwa = tdm_cu_h2f(__ldg(da + b)), dwb = tdm_cu_h2f(__ldg(db + b));
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const size_t ri = (size_t)min(i, last);
            const uint4 xv = __ldg((const uint4 *)(xq.q + ri * cols) + c);
            const float dx = __ldg(xq.d + ri * nb + b);
            int ia = dp4a(qa.x, xv.x, 0), ib = dp4a(qb.x, xv.x, 0);
            ia = dp4a(qa.y, xv.y, ia), ib = dp4a(qb.y, xv.y, ib);
            ia = dp4a(qa.z, xv.z, ia), ib = dp4a(qb.z, xv.z, ib);
            ia = dp4a(qa.w, xv.w, ia), ib = dp4a(qb.w, xv.w, ib);
            sa[i] = fmaf((float)ia, dwa * dx, sa[i]);
            sb[i] = fmaf((float)ib, dwb * dx, sb[i]);
        }
    }
    gv_store<NR, EPI>(r, sa, sb, y, ldy, last);
}

/* q4_0, QSPLIT rows: [cols / 2] bytes of nibbles (block b's 16 bytes: element j in
 * the low nibble of byte j, element j + 16 in its high nibble), then the f16
 * scales.  Lane chunks of one whole block. */
template <int NR, int EPI>
__global__ void __launch_bounds__(GV_WARPS * 32)
k_gemv_q4(const uint8_t *__restrict__ w, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
          tdm_cuda_xq xq, float *y, int32_t ldy, int32_t n_rows) {
    TDM_PDL_ENTRY();
    const gv_rows r = rows_of<EPI>(n_out, ff);
    if (!r.active) return;
    const int32_t lane = (int32_t)(threadIdx.x & 31), nb = cols / TDM_QK, last = tile_last<NR>(n_rows);
    xq = tdm_gv_tile(xq, cols, nb);
    y += (size_t)blockIdx.x * GV_TILE * ldy;
    const uint8_t *rowa = w + (size_t)r.ra * row_bytes, *rowb = w + (size_t)r.rb * row_bytes;
    const uint16_t *da = (const uint16_t *)(rowa + cols / 2), *db = (const uint16_t *)(rowb + cols / 2);
    float sa[NR], sb[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) sa[i] = sb[i] = 0.0f;
    const uint32_t M = 0x0f0f0f0fu;
#pragma unroll 4
    for (int32_t b = lane; b < nb; b += 32) {
        const uint4 qa = tdm_cu_ld_stream(rowa + 16 * (size_t)b), qb = tdm_cu_ld_stream(rowb + 16 * (size_t)b);
        const uint32_t la[4] = {qa.x & M, qa.y & M, qa.z & M, qa.w & M};
        const uint32_t ha[4] = {(qa.x >> 4) & M, (qa.y >> 4) & M, (qa.z >> 4) & M, (qa.w >> 4) & M};
        const uint32_t lb[4] = {qb.x & M, qb.y & M, qb.z & M, qb.w & M};
        const uint32_t hb[4] = {(qb.x >> 4) & M, (qb.y >> 4) & M, (qb.z >> 4) & M, (qb.w >> 4) & M};
        const float dwa = tdm_cu_h2f(__ldg(da + b)), dwb = tdm_cu_h2f(__ldg(db + b));
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const size_t ri = (size_t)min(i, last);
            const uint4 *xp = (const uint4 *)(xq.q + ri * cols + (size_t)TDM_QK * b);
            const uint4 xl = __ldg(xp), xh = __ldg(xp + 1);
            const uint32_t xlo[4] = {xl.x, xl.y, xl.z, xl.w}, xhi[4] = {xh.x, xh.y, xh.z, xh.w};
            int ia = 0, ib = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                ia = dp4a(la[k], xlo[k], ia);
                ib = dp4a(lb[k], xlo[k], ib);
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                ia = dp4a(ha[k], xhi[k], ia);
                ib = dp4a(hb[k], xhi[k], ib);
            }
            const int32_t off = 8 * __ldg(xq.qs + ri * nb + b);
            const float dx = __ldg(xq.d + ri * nb + b);
            sa[i] = fmaf((float)(ia - off), dwa * dx, sa[i]);
            sb[i] = fmaf((float)(ib - off), dwb * dx, sb[i]);
        }
    }
    gv_store<NR, EPI>(r, sa, sb, y, ldy, last);
}

/* The 16-element-group types, rows layout: f32 x. */
template <uint32_t T, int NR, int EPI>
__global__ void __launch_bounds__(GV_WARPS * 32)
k_gemv_kq(const uint8_t *__restrict__ w, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
          const float *__restrict__ x, float *y, int32_t ldy, int32_t n_rows) {
    TDM_PDL_ENTRY();
    const gv_rows r = rows_of<EPI>(n_out, ff);
    if (!r.active) return;
    x += (size_t)blockIdx.x * GV_TILE * cols;
    y += (size_t)blockIdx.x * GV_TILE * ldy;
    const int32_t lane = (int32_t)(threadIdx.x & 31), last = tile_last<NR>(n_rows);
    const uint8_t *rowa = w + (size_t)r.ra * row_bytes, *rowb = w + (size_t)r.rb * row_bytes;
    float sa[NR], sb[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) sa[i] = sb[i] = 0.0f;
    const int32_t n16 = cols / 16;
#pragma unroll 2
    for (int32_t c = lane; c < n16; c += 32) {
        float fa[16], fb[16];
        tdm_cu_deq16<T>(rowa, c, fa);
        tdm_cu_deq16<T>(rowb, c, fb);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            tdm_cu_dot16x2(fa, fb, (const float4 *)(x + (size_t)min(i, last) * cols) + 4 * c, sa[i], sb[i]);
        }
    }
    gv_store<NR, EPI>(r, sa, sb, y, ldy, last);
}

static bool is_ktype(uint32_t t) {
    switch (t) {
#define KT(T) case T:
        TDM_CU_FOR_EACH_KTYPE(KT)
#undef KT
        return true;
    default: return false;
    }
}

bool tdm_cuda_gemv_fast(const tdm_weight *w) {
    if (w->layout == TDM_LAYOUT_ROWS && is_ktype(w->type))
        return w->cols % tdm_dtype_block_elems(w->type) == 0 && (uintptr_t)w->data % 16 == 0;
    const uintptr_t a = (uintptr_t)w->data;
    if (w->layout == TDM_LAYOUT_ROWS && (w->type == TDM_F16 || w->type == TDM_BF16))
        return w->cols % 8 == 0 && w->row_bytes % 16 == 0 && a % 16 == 0;
    if (w->layout == TDM_LAYOUT_ROWS && w->type == TDM_F8_E4M3)
        return w->scale && w->cols % 8 == 0 && w->row_bytes % 8 == 0 && a % 8 == 0;
    if (w->layout == TDM_LAYOUT_QSPLIT && (w->type == TDM_Q8_0 || w->type == TDM_Q4_0))
        return w->cols % TDM_QK == 0 && w->row_bytes % 16 == 0 && a % 16 == 0;
    return false;
}

/* One launch: grid.x tiles of NR input rows of x / xq / y, n_rows of them in all
 * (the last tile may be partial). */
template <int NR, int EPI>
static void launch_nr(tdm_cuda *c, const tdm_weight *w, dim3 grid, int32_t n_out, int32_t ff, const float *x,
                      const tdm_cuda_xq &xq, float *y, int32_t ldy, int32_t n_rows, int32_t ks) {
    const uint8_t *wd = (const uint8_t *)w->data;
    const int32_t cols = (int32_t)w->cols;
    const unsigned th = GV_WARPS * 32;
    const bool wide = gv_rows_per_warp(c, w, NR) == 4;
    const float *ws = w->scale; /* (fp8_e4m3's; NULL for the others) */
    switch (w->type) {
#define T16(T)                                                                                                   \
    case T:                                                                                                      \
        if (wide)                                                                                                \
            tdm_launch(k_gemv16w<T, NR, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy, \
                       n_rows, ks, ws);                                                                          \
        else                                                                                                     \
            tdm_launch(k_gemv16<T, NR, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy,  \
                       n_rows, ks, ws);                                                                          \
        break;
        T16(TDM_F16)
        T16(TDM_BF16)
        T16(TDM_F8_E4M3)
#undef T16
    case TDM_Q8_0:
        tdm_launch(k_gemv_q8<NR, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, xq, y, ldy, n_rows);
        break;
    case TDM_Q4_0:
        tdm_launch(k_gemv_q4<NR, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, xq, y, ldy, n_rows);
        break;
#define KT(T)                                                                                         \
    case T:                                                                                           \
        tdm_launch(k_gemv_kq<T, NR, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy, n_rows); \
        break;
        TDM_CU_FOR_EACH_KTYPE(KT)
#undef KT
    default:
        break;
    }
}

template <int EPI>
static void launch_epi(tdm_cuda *c, const tdm_weight *w, dim3 grid, int nr, int32_t n_out, int32_t ff,
                       const float *x, const tdm_cuda_xq &xq, float *y, int32_t ldy, int32_t n_rows, int32_t ks) {
    switch (nr) {
#define NR_CASE(N) \
    case N: launch_nr<N, EPI>(c, w, grid, n_out, ff, x, xq, y, ldy, n_rows, ks); break;
        NR_CASE(1) NR_CASE(2) NR_CASE(3) NR_CASE(4) NR_CASE(5) NR_CASE(6) NR_CASE(7) NR_CASE(8)
#undef NR_CASE
    default: break;
    }
}

tandem_status tdm_cuda_gemv(tdm_cuda *c, const tdm_weight *w, const float *x, const tdm_cuda_xq *xq, int32_t n,
                            float *y, int32_t ldy, tdm_gemv_epi epi, tdm_err *err) {
    if (!tdm_cuda_gemv_fast(w))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemv: %s weight [%lld][%lld] (layout %u) has no fast kernel",
                          tdm_dtype_name(w->type), (long long)w->rows, (long long)w->cols, (unsigned)w->layout);
    /* (callers choose the row kernels up to TDM_CUDA_GEMV_MAX_ROWS, or forced, or for
     * a token tree's verification up to TDM_CUDA_TREE_MAX_ROWS) */
    const int32_t max_rows = TDM_MAX(TDM_CUDA_GEMV_FORCED_MAX_ROWS, TDM_CUDA_TREE_MAX_ROWS);
    if (n <= 0 || n > max_rows) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gemv: %d rows (1..%d)", (int)n, (int)max_rows);
    const bool quant = tdm_cuda_gemv_reads_xq(c, w), kq = gv_kq(c, w);
    if (!y || (quant ? !xq || !xq->q : !x)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gemv: NULL input or output");
    if (epi == TDM_EPI_SWIGLU && w->rows % 2 != 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gemv: SwiGLU over %lld rows (gate and up halves)",
                          (long long)w->rows);
    const int32_t ff = (int32_t)(w->rows / 2);
    const int32_t n_out = epi == TDM_EPI_SWIGLU ? ff : (int32_t)w->rows;
    if (ldy < n_out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gemv: ldy %d < %d outputs", (int)ldy, (int)n_out);
    /* Tiles of GV_TILE rows (a batch of fewer: one tile of exactly its rows).  A
     * partial last tile goes in the same launch (its W blocks read from L2 beside
     * the full tiles', its missing rows computed and dropped) unless the weight is
     * tall: there the products are compute-bound at 8 rows and the dropped rows cost
     * a full tile, so the partial tile is a second launch of exactly its rows
     * (measured, 7B shapes, 9 rows: 10.5 ms as two launches, 11.5 ms as one;
     * pycode, whose weights are not tall: 339 us as two, 290 us as one). */
    const int32_t cols = (int32_t)w->cols, nb = cols / TDM_QK;
    const int32_t full = n / GV_TILE, rem = n % GV_TILE;
    const bool split = gv_tall(c, w) && full > 0 && rem > 0;
    const int32_t ks = gv_ksplit(c, w);
    for (int32_t i0 = 0; i0 < n;) {
        const int32_t rows = split && i0 == 0 ? full * GV_TILE : n - i0; /* this launch's */
        const int nr = rows <= GV_TILE ? rows : GV_TILE;
        const unsigned tiles = (unsigned)((rows + GV_TILE - 1) / GV_TILE);
        /* outputs a warp writes: its W rows (SwiGLU: half of them, gate and up) */
        const int per_warp = gv_rows_per_warp(c, w, nr) / (epi == TDM_EPI_SWIGLU ? 2 : 1);
        const int64_t warps = ((int64_t)n_out + per_warp - 1) / per_warp * ks;
        const int64_t wblocks = (warps + GV_WARPS - 1) / GV_WARPS;
        if (wblocks > 65535)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemv: %lld output rows (the row kernels take %lld)",
                              (long long)n_out, (long long)65535 * GV_WARPS / ks * per_warp);
        const dim3 grid(tiles, (unsigned)wblocks);
        tdm_cuda_xq xt = {0, 0, 0};
        if (quant) xt = {xq->q + (size_t)i0 * cols, xq->d + (size_t)i0 * nb, xq->qs + (size_t)i0 * nb};
        const float *xi = quant ? NULL : x + (size_t)i0 * cols;
        float *yi = y + (size_t)i0 * ldy;
        if (kq) tdm_gemv_kq_launch(c, w, grid, nr, epi, n_out, ff, xt, yi, ldy, rows, ks);
        else if (epi == TDM_EPI_STORE) launch_epi<TDM_EPI_STORE>(c, w, grid, nr, n_out, ff, xi, xt, yi, ldy, rows, ks);
        else if (epi == TDM_EPI_ACCUM) launch_epi<TDM_EPI_ACCUM>(c, w, grid, nr, n_out, ff, xi, xt, yi, ldy, rows, ks);
        else launch_epi<TDM_EPI_SWIGLU>(c, w, grid, nr, n_out, ff, xi, xt, yi, ldy, rows, ks);
        TDM_CU_LAUNCHED("gemv");
        i0 += rows;
    }
    return TANDEM_OK;
}
