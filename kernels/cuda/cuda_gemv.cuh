/* cuda_gemv.cuh - what the row kernels (cuda_gemv.cu, and the K-quant kernels of
 * cuda_gemv_kq.cu) share: the launch geometry (warps per block, tiles of input rows,
 * column parts), each warp's W rows, and the reduction and epilogues that store the
 * sums (every kernel's output elements go through gv_store's fixed butterfly and
 * part order: the determinism contract of cuda_gemv.cu's header). */
#ifndef TDM_CUDA_GEMV_CUH
#define TDM_CUDA_GEMV_CUH

#include "cuda_internal.h"
#include "cuda_reduce.cuh"

#define GV_WARPS 4 /* warps per thread block */
#define GV_KSPLIT_MAX 4 /* parts a weight's columns are split into at most (gv_ksplit) */
#define GV_TILE 8  /* input rows per pass over W */

/* The two W rows of a warp, and whether the second one exists (STORE / ACCUM: rows
 * 2w and 2w + 1; SWIGLU: gate row w and up row w + ff). */
struct gv_rows {
    int32_t ra, rb;
    bool has_b, active;
};

template <int EPI> __device__ __forceinline__ gv_rows rows_of(int32_t n_out, int32_t ff, int32_t ks = 1) {
    const int32_t warp = ((int32_t)blockIdx.y * GV_WARPS + (int32_t)(threadIdx.x >> 5)) / ks; /* (its group) */
    gv_rows r;
    if (EPI == TDM_EPI_SWIGLU) {
        r.ra = warp;
        r.rb = warp + ff;
        r.active = warp < n_out;
        r.has_b = true;
    } else {
        r.ra = 2 * warp;
        r.rb = r.ra + 1;
        r.active = r.ra < n_out;
        r.has_b = r.rb < n_out;
        if (!r.has_b) r.rb = r.ra;
    }
    return r;
}

/* The last input row of this block's tile that exists: the tiles of a launch may end
 * with a partial one, whose missing rows read the x of row `last` (every row's sums
 * are computed by its own operations alone) and are never stored.  (Skipping them
 * instead, a branch per row in the unrolled loops, measured slower on the H200:
 * 7B shapes, 9 rows 11.5 -> 13.7 ms.) */
template <int NR> __device__ __forceinline__ int32_t tile_last(int32_t n_rows) {
    return min(NR, n_rows - (int32_t)blockIdx.x * GV_TILE) - 1;
}

/* The part of a weight's columns a warp sums (tdm_cuda_gemv's split of the columns
 * into ks parts, ks dividing GV_WARPS: warp w of the grid takes part w % ks of the
 * W rows of group w / ks, so a group's parts are warps of one block): chunks of 8
 * columns [lo, hi). */
__device__ __forceinline__ void gv_part(int32_t n8, int32_t ks, int32_t *lo, int32_t *hi) {
    const int32_t p = ((int32_t)blockIdx.y * GV_WARPS + (int32_t)(threadIdx.x >> 5)) % ks;
    *lo = p * n8 / ks;
    *hi = (p + 1) * n8 / ks;
}

/* The sums of a group's ks parts (lane i: input row i's NW values v), added in part
 * order through shared memory (every warp of the block calls it: a barrier); true
 * for the warp that then holds the totals (the group's part 0). */
template <int NW>
__device__ __forceinline__ bool gv_combine(float v[NW], int32_t ks, float (*red)[GV_TILE][NW]) {
    const int32_t warp = (int32_t)(threadIdx.x >> 5), lane = (int32_t)(threadIdx.x & 31);
    if (lane < GV_TILE)
#pragma unroll
        for (int j = 0; j < NW; j++) red[warp][lane][j] = v[j];
    __syncthreads();
    if (warp % ks != 0) return false;
    if (lane < GV_TILE)
        for (int32_t p = 1; p < ks; p++)
#pragma unroll
            for (int j = 0; j < NW; j++) v[j] += red[warp + p][lane][j];
    return true;
}

/* Reduces each input row's partial sums over the warp (every lane gets the same
 * sums; with ks parts, then over the group's parts) and writes them: lane i writes
 * input row i's outputs, so the rows' read-modify-writes (ACCUM) wait on memory
 * once, side by side, not one after another.  With ks > 1 every warp of the block
 * must call it. */
template <int NR, int EPI>
__device__ __forceinline__ void gv_store(const gv_rows &r, float sa[NR], float sb[NR], float *y, int32_t ldy,
                                         int32_t last, int32_t ks = 1) {
    const int lane = threadIdx.x & 31;
    float v[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const float ai = tdm_cu_warp_sum(sa[i]), bi = tdm_cu_warp_sum(sb[i]);
        if (lane == i) v[0] = ai, v[1] = bi;
    }
    if (ks > 1) {
        __shared__ float red[GV_WARPS][GV_TILE][2];
        if (!gv_combine<2>(v, ks, red)) return;
    }
    if (!r.active || lane >= NR || lane > last) return;
    const float a = v[0], b = v[1];
    float *yr = y + (size_t)lane * ldy;
    if (EPI == TDM_EPI_SWIGLU) {
        yr[r.ra] = a / (1.0f + expf(-a)) * b;
    } else if (EPI == TDM_EPI_ACCUM) {
        yr[r.ra] += a;
        if (r.has_b) yr[r.rb] += b;
    } else {
        yr[r.ra] = a;
        if (r.has_b) yr[r.rb] = b;
    }
}

/* The quantised x of this block's tile of input rows. */
__device__ __forceinline__ tdm_cuda_xq tdm_gv_tile(tdm_cuda_xq xq, int32_t cols, int32_t nb) {
    const size_t r0 = (size_t)blockIdx.x * GV_TILE;
    xq.q += r0 * cols;
    xq.d += r0 * nb;
    xq.qs += r0 * nb;
    return xq;
}

__device__ __forceinline__ int dp4a(uint32_t a, uint32_t b, int c) { return __dp4a((int)a, (int)b, c); }

/* The K-quant kernels (cuda_gemv_kq.cu): whether they take a weight (rows layout,
 * Q4_K / Q5_K / Q6_K, whole super-blocks, 16-byte aligned data), and one launch of
 * them (the grid and arguments tdm_cuda_gemv computes for every kernel; nr: rows per
 * tile, 1..GV_TILE; xq: this launch's rows of x quantised). */
bool tdm_gemv_kq_takes(const tdm_weight *w);
void tdm_gemv_kq_launch(tdm_cuda *c, const tdm_weight *w, dim3 grid, int nr, tdm_gemv_epi epi, int32_t n_out,
                        int32_t ff, const tdm_cuda_xq &xq, float *y, int32_t ldy, int32_t n_rows, int32_t ks);

#endif
