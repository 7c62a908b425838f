/* cuda_matmul.cu - the matmul op (which picks the row kernels, cuBLAS or these),
 * and the generic kernels: y[n][rows] (+)= x[n][cols] * W^T for any weight type of
 * the rows layout and any shape.
 *
 * One warp per W row; the warp walks the row once per tile of up to TILE input rows
 * (each lane every 32nd column, converting W on load), keeps one f32 accumulator
 * per input row, and reduces them across the warp.  So a batch of up to TILE rows
 * reads W once, as decode and verification batches need; larger batches read it
 * once per tile.  Each output element is computed by the same sequence of
 * operations whatever n is, so results do not depend on the batch's other rows.
 *
 * f16 and bf16 rows whose width is a multiple of 8 (and 16-byte aligned data) are
 * read with 16-byte loads, 8 columns per lane (k_matmul_v8); other types and
 * shapes one element per lane (k_matmul).  They serve the shapes the fast paths do
 * not (odd widths, f32 weights, quantised rows that are not 16-byte aligned).
 */
#include "cuda_internal.h"
#include "cuda_weights.cuh"

#define TILE 8          /* input rows per pass over W */
#define WARPS 8         /* W rows (warps) per thread block */

/* What one warp computes: W row r against input rows i0 .. i0 + nt - 1. */
struct warp_tile {
    int32_t lane, r, i0, nt;
};

__device__ __forceinline__ warp_tile tile_of(int32_t n) {
    warp_tile t;
    t.lane = threadIdx.x & 31;
    t.r = blockIdx.x * WARPS + (threadIdx.x >> 5);
    t.i0 = blockIdx.y * TILE;
    t.nt = min(TILE, n - t.i0);
    return t;
}

/* Sums each row's per-lane partial sums across the warp (a fixed butterfly) and
 * writes (or adds) them to y[i0 + i][r]. */
__device__ __forceinline__ void store_tile(const warp_tile &t, const float s[TILE], float *y, int32_t rows,
                                           bool acc) {
#pragma unroll
    for (int i = 0; i < TILE; i++) {
        float v = s[i];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (t.lane == 0 && i < t.nt) {
            float *out = y + (size_t)(t.i0 + i) * rows + t.r;
            *out = acc ? *out + v : v;
        }
    }
}

template <uint32_t T>
__global__ void __launch_bounds__(WARPS * 32)
k_matmul(const uint8_t *w, size_t row_bytes, int32_t rows, int32_t cols, const float *x, int32_t n, float *y,
         bool acc) {
    TDM_PDL_ENTRY();
    const warp_tile t = tile_of(n);
    if (t.r >= rows) return;
    const uint8_t *wr = w + (size_t)t.r * row_bytes;
    const float *xt = x + (size_t)t.i0 * cols;
    float s[TILE] = {0};
    for (int32_t k = t.lane; k < cols; k += 32) {
        const float wv = tdm_cu_wload<T>(wr, k);
#pragma unroll
        for (int i = 0; i < TILE; i++)
            if (i < t.nt) s[i] = fmaf(wv, xt[(size_t)i * cols + k], s[i]);
    }
    store_tile(t, s, y, rows, acc);
}

/* 8 consecutive elements of a 16-bit row (f16 or bf16) as f32. */
template <uint32_t T> __device__ __forceinline__ void load8(const uint4 &u, float f[8]) {
    const uint32_t v[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint16_t lo = (uint16_t)(v[i] & 0xffffu), hi = (uint16_t)(v[i] >> 16);
        if (T == TDM_F16) {
            f[2 * i] = tdm_cu_h2f(lo);
            f[2 * i + 1] = tdm_cu_h2f(hi);
        } else {
            f[2 * i] = __uint_as_float((uint32_t)lo << 16);
            f[2 * i + 1] = __uint_as_float((uint32_t)hi << 16);
        }
    }
}

/* As k_matmul, for 16-bit types with cols % 8 == 0: lane l reads columns 8 l .. 8 l
 * + 7 of each 256-column stretch with one 16-byte load (x likewise, as float4s). */
template <uint32_t T>
__global__ void __launch_bounds__(WARPS * 32)
k_matmul_v8(const uint8_t *w, size_t row_bytes, int32_t rows, int32_t cols, const float *x, int32_t n, float *y,
            bool acc) {
    TDM_PDL_ENTRY();
    const warp_tile t = tile_of(n);
    if (t.r >= rows) return;
    const uint4 *wr = (const uint4 *)(w + (size_t)t.r * row_bytes);
    const float *xt = x + (size_t)t.i0 * cols;
    float s[TILE] = {0};
    for (int32_t k8 = t.lane; k8 < cols / 8; k8 += 32) {
        float wv[8];
        load8<T>(wr[k8], wv);
#pragma unroll
        for (int i = 0; i < TILE; i++)
            if (i < t.nt) {
                const float4 *xp = (const float4 *)(xt + (size_t)i * cols) + 2 * k8;
                const float4 a = xp[0], b = xp[1];
                float u = s[i];
                u = fmaf(wv[0], a.x, u), u = fmaf(wv[1], a.y, u), u = fmaf(wv[2], a.z, u), u = fmaf(wv[3], a.w, u);
                u = fmaf(wv[4], b.x, u), u = fmaf(wv[5], b.y, u), u = fmaf(wv[6], b.z, u), u = fmaf(wv[7], b.w, u);
                s[i] = u;
            }
    }
    store_tile(t, s, y, rows, acc);
}

tandem_status tdm_cuda_matmul_rows(tdm_cuda *c, const tdm_weight *w, const float *x, int32_t n, float *y,
                                   bool accumulate, tdm_err *err) {
    if (w->layout != TDM_LAYOUT_ROWS)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "matmul: the generic kernels read the rows layout (got %u)",
                          (unsigned)w->layout);
    const unsigned tiles = (unsigned)((n + TILE - 1) / TILE);
    if (tiles > 65535u) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "matmul: %d rows in one call", (int)n);
    const dim3 grid((unsigned)((w->rows + WARPS - 1) / WARPS), tiles);
    const uint8_t *wd = (const uint8_t *)w->data;
    const int32_t rows = (int32_t)w->rows, cols = (int32_t)w->cols;
    const bool v8 = (w->type == TDM_F16 || w->type == TDM_BF16) && cols % 8 == 0 && w->row_bytes % 16 == 0 &&
                    (uintptr_t)wd % 16 == 0 && (uintptr_t)x % 16 == 0;
    if (v8) {
        if (w->type == TDM_F16)
            tdm_launch(k_matmul_v8<TDM_F16>, grid, WARPS * 32, 0, c->stream, wd, w->row_bytes, rows, cols, x, n, y, accumulate);
        else
            tdm_launch(k_matmul_v8<TDM_BF16>, grid, WARPS * 32, 0, c->stream, wd, w->row_bytes, rows, cols, x, n, y, accumulate);
        TDM_CU_LAUNCHED("matmul");
        return TANDEM_OK;
    }
    switch (w->type) {
#define CASE(T)                                                                                        \
    case T:                                                                                            \
        tdm_launch(k_matmul<T>, grid, WARPS * 32, 0, c->stream, wd, w->row_bytes, rows, cols, x, n, y, accumulate); \
        break;
        TDM_CU_FOR_EACH_WTYPE(CASE)
#undef CASE
    default: break;
    }
    TDM_CU_LAUNCHED("matmul");
    return TANDEM_OK;
}

/* The matmul op: the row kernels (cuda_gemv.cu) for up to TDM_CUDA_GEMV_MAX_ROWS
 * rows of a weight they read fast, cuBLAS (cuda_gemm.cu) for more rows, and the
 * generic kernels above otherwise.  x is converted (or quantised) into backend
 * scratch as the chosen path needs. */
tandem_status tdm_cuda_matmul(tdm_backend *b, const tdm_weight *w, const float *x, int32_t n, float *y,
                              bool accumulate, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "matmul", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    tandem_status st = tdm_cuda_check_weight(w, "matmul", err);
    if (st) return st;
    if (n < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "matmul: n = %d", (int)n);
    if (n == 0 || w->rows == 0) return TANDEM_OK;
    if (!x || !y) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "matmul: NULL x or y");
    if (w->rows > INT32_MAX) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "matmul: %lld rows", (long long)w->rows);
    const int32_t cols = (int32_t)w->cols;
    const tdm_gemv_epi epi = accumulate ? TDM_EPI_ACCUM : TDM_EPI_STORE;
    const bool rows_kernels = c->force_mm == 1   ? n <= TDM_CUDA_GEMV_FORCED_MAX_ROWS
                              : c->force_mm == 2 ? false
                                                 : n <= TDM_CUDA_GEMV_MAX_ROWS;
    if (rows_kernels && tdm_cuda_gemv_fast(w)) {
        tdm_cuda_xq xq = {NULL, NULL, NULL};
        if (tdm_cuda_gemv_reads_xq(c, w)) {
            void *buf = tdm_cuda_buf_get(c, &c->xq_buf, tdm_cuda_xq_bytes(n, cols), "matmul: quantised x", err);
            if (!buf) return err ? err->status : TANDEM_ERR_BACKEND;
            xq = tdm_cuda_xq_at(buf, n, cols);
            if ((st = tdm_cuda_quantize_x(c, x, n, cols, &xq, err))) return st;
        }
        return tdm_cuda_gemv(c, w, x, &xq, n, y, (int32_t)w->rows, epi, err);
    }
    if (w->type == TDM_F8_E4M3) { /* (the row kernels when fast; else cuBLASLt, x quantised there) */
        st = tdm_cuda_gemm(c, w, x, n, y, accumulate, err);
        if (st != TANDEM_ERR_UNSUPPORTED || !tdm_cuda_gemv_fast(w) || c->capturing) return st;
        /* cuBLASLt has no FP8 product of this shape (its layouts want the weight's
         * rows in multiples of 16 bytes of output, say): the row kernels, a tile of
         * rows at a time, exact in f32 x */
        if (err) memset(err, 0, sizeof *err);
        st = TANDEM_OK;
        const int32_t step = TDM_CUDA_GEMV_MAX_ROWS;
        for (int32_t i = 0; i < n && !st; i += step) {
            tdm_cuda_xq xq = {NULL, NULL, NULL};
            st = tdm_cuda_gemv(c, w, x + (size_t)i * (size_t)cols, &xq, TDM_MIN(step, n - i), y + (size_t)i * (size_t)w->rows,
                               (int32_t)w->rows, epi, err);
        }
        return st;
    }
    const bool dequant_gemm = w->layout == TDM_LAYOUT_ROWS && tdm_dtype_block_elems(w->type) > 1 &&
                              w->type != TDM_Q8_0 && w->type != TDM_Q4_0; /* (dequantised to f16) */
    if (!rows_kernels && (w->layout == TDM_LAYOUT_QSPLIT || w->type == TDM_F16 || w->type == TDM_BF16 || dequant_gemm)) {
        const uint32_t at = tdm_cuda_gemm_act_type(w->type);
        void *xa = tdm_cuda_buf_get(c, &c->x16_buf, (size_t)n * (size_t)cols * 2, "matmul: 16-bit x", err);
        if (!xa) return err ? err->status : TANDEM_ERR_BACKEND;
        if ((st = tdm_cuda_convert(c, x, (int64_t)n * cols, at, xa, err))) return st;
        return tdm_cuda_gemm(c, w, xa, n, y, accumulate, err);
    }
    if (w->layout == TDM_LAYOUT_QSPLIT)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "matmul: %s weight of %d columns in the split layout",
                          tdm_dtype_name(w->type), (int)cols);
    return tdm_cuda_matmul_rows(c, w, x, n, y, accumulate, err);
}
