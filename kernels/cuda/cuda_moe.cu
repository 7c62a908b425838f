/* cuda_moe.cu - mixture-of-experts layers on the GPU (qwen3moe, Mixtral): the
 * moe_route and moe_experts ops of kernels/backend.h, with every index on the
 * device, so a step never waits for the host (as llama.cpp's mul_mat_id with its
 * ids on the device).
 *
 * moe_route: one warp per row.  softmax of the router's logits (the maximum
 *   ignoring NaN, exp in f32, the sum in double, as tdm_moe_route), then k rounds
 *   of a warp arg-max over the experts not yet taken, larger probability first and
 *   the lower expert index on a tie (a NaN probability ranks below every number:
 *   a row with a non-finite logit has only NaN probabilities, and takes experts
 *   0 .. k-1 as the host does), then the k weights renormalised (their sum in slot
 *   order, clamped below at 6.103515625e-5).
 *
 * moe_experts: the rows' (row, expert) pairs grouped by expert, then one launch
 *   per product over all the experts:
 *   1. k_moe_sort (one block, a thread per expert): counts, offsets (a block
 *      scan), each expert's pairs in row order into slots, and tiles of at most
 *      MOE_TILE slots of one expert; the tile count stays on the device, the
 *      launches below have a grid of its bound ((n k + 7) / 8 + min(n_expert, n k)
 *      tiles) and blocks past it return at once.
 *   2. k_moe_gemv (SwiGLU epilogue): h[slot] = swiglu(x[row of slot] W13_e^T);
 *   3. k_moe_gemv (store): y[slot] = h[slot] W2_e^T;
 *      each block one tile of one expert, each warp one W row pair (the gate and
 *      up rows j and j + n_ff, or rows 2j and 2j + 1), read once for the tile's up
 *      to 8 rows; lanes dequantise 16 elements at a time (tdm_cu_deq16: the
 *      host's values exactly; f32 / f16 / bf16 converted, Q8_0 / Q4_0 in either
 *      layout) and sum in f32 in increasing column order, the warp adds the lanes
 *      in a fixed butterfly: a row's products are the same operations whatever
 *      the other rows are, so a row's result never depends on its batch.
 *   4. k_moe_sum: out[i] = sum of w[i][j] y[slot of (i, j)] over the row's experts
 *      in ascending expert order, each term added as acc + w * y (not fused), as
 *      the host's ops do.
 *   Weights are each expert's own tdm_weight (the loader places them apart); the
 *   experts of one product must share type, layout and row bytes (one file tensor
 *   gives them); their data pointers go to a device table kept per layer (rebuilt
 *   when they change), so the launches replay in a CUDA graph.
 * The fused forward (cuda_blocks.cu) runs the same kernels for a layer's experts
 * (tdm_cuda_moe_ffn), adding the sum into the residual stream.
 *   The product kernels read every weight type the row kernels read, but the
 *   K-quants dequantised to f32 (the dense decode's int8 dp4a kernels are not yet
 *   grouped), and batches are f32 CUDA-core work (no tensor-core grouped GEMM yet).
 */
#include <cub/block/block_scan.cuh>
#include <string.h>

#include "cuda_internal.h"
#include "cuda_reduce.cuh"
#include "cuda_weights.cuh"

#define MOE_MAX_EXPERTS 512 /* (model.h's TDM_MAX_EXPERTS) */
#define MOE_MAX_K 64
#define MOE_TILE 8          /* slots (rows of one expert) per product block */
#define MOE_WARPS 4         /* warps per product block */
#define MOE_GRID_Y 65535    /* tiles per launch at most */

/* ---- routing ------------------------------------------------------------------- */

/* (v, e) ranks above (bv, be): larger first, the lower expert on a tie; NaN lowest. */
__device__ __forceinline__ bool moe_better(float v, int32_t e, float bv, int32_t be) {
    if (be < 0) return e >= 0;
    if (e < 0) return false;
    const bool vn = isnan(v), bn = isnan(bv);
    if (vn != bn) return bn;
    if (!vn && v != bv) return v > bv;
    return e < be;
}

/* Warp w of block b routes row 4 b + w. */
__global__ void k_moe_route(const float *logits, int32_t n, int32_t ne, int32_t k, int32_t *ids, float *w) {
    TDM_PDL_ENTRY();
    const int32_t row = (int32_t)blockIdx.x * 4 + (int32_t)(threadIdx.x >> 5), lane = (int32_t)(threadIdx.x & 31);
    if (row >= n) return;
    const float *l = logits + (size_t)row * ne;
    float p[MOE_MAX_EXPERTS / 32]; /* lane's experts lane + 32 j */
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < MOE_MAX_EXPERTS / 32; j++) {
        const int32_t e = lane + 32 * j;
        p[j] = e < ne ? l[e] : -INFINITY;
        if (p[j] > mx) mx = p[j]; /* (a NaN is never larger) */
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v = __shfl_xor_sync(0xffffffffu, mx, o);
        if (v > mx) mx = v;
    }
    double sum = 0;
#pragma unroll
    for (int j = 0; j < MOE_MAX_EXPERTS / 32; j++)
        if (lane + 32 * j < ne) sum += (double)(p[j] = expf(p[j] - mx));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = (float)(1.0 / sum);
#pragma unroll
    for (int j = 0; j < MOE_MAX_EXPERTS / 32; j++) p[j] *= inv;
    uint32_t taken = 0; /* bit j: expert lane + 32 j taken */
    float wsel[MOE_MAX_K];
    int32_t esel[MOE_MAX_K];
    for (int32_t s = 0; s < k; s++) {
        float bv = 0.0f;
        int32_t be = -1;
#pragma unroll
        for (int j = 0; j < MOE_MAX_EXPERTS / 32; j++) {
            const int32_t e = lane + 32 * j;
            if (e < ne && !(taken >> j & 1u) && moe_better(p[j], e, bv, be)) bv = p[j], be = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v = __shfl_xor_sync(0xffffffffu, bv, o);
            const int32_t e = __shfl_xor_sync(0xffffffffu, be, o);
            if (moe_better(v, e, bv, be)) bv = v, be = e;
        }
        if ((be & 31) == lane) taken |= 1u << (be >> 5);
        esel[s] = be;
        wsel[s] = bv;
    }
    if (lane != 0) return;
    float t = 0.0f;
    for (int32_t s = 0; s < k; s++) t += wsel[s];
    if (t < 6.103515625e-5f) t = 6.103515625e-5f;
    for (int32_t s = 0; s < k; s++) {
        ids[(size_t)row * k + s] = esel[s];
        w[(size_t)row * k + s] = wsel[s] / t;
    }
}

tandem_status tdm_cuda_moe_route(tdm_backend *b, const float *logits, int32_t n, int32_t n_expert, int32_t k,
                                 int32_t *ids, float *w, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "moe_route", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (n < 0 || n_expert < 1 || n_expert > MOE_MAX_EXPERTS || k < 1 || k > n_expert || k > MOE_MAX_K)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "moe_route: n %d, %d of %d experts (1 <= k <= experts <= %d, "
                          "k <= %d)", (int)n, (int)k, (int)n_expert, MOE_MAX_EXPERTS, MOE_MAX_K);
    if (n == 0) return TANDEM_OK;
    if (!logits || !ids || !w) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "moe_route: NULL pointer");
    tdm_launch(k_moe_route, dim3((unsigned)((n + 3) / 4)), dim3(128), 0, c->stream, logits, n, n_expert, k, ids, w);
    TDM_CU_LAUNCHED("moe_route");
    return TANDEM_OK;
}

/* ---- grouping ------------------------------------------------------------------ */

/* One block of MOE_MAX_EXPERTS threads, thread e for expert e: the np = n k pairs'
 * ids[np] grouped.  slot_pair[slot] = the pair in slot (expert e's pairs in pair
 * order from its offset), pair_slot[p] = p's slot (-1 for an id outside [0, ne):
 * the caller's error, its term is left out), tiles[t] = {expert, first slot, slots}
 * and *n_tiles their number. */
__global__ void __launch_bounds__(MOE_MAX_EXPERTS)
k_moe_sort(const int32_t *ids, int32_t np, int32_t ne, int32_t *slot_pair, int32_t *pair_slot, int4 *tiles,
           int32_t *n_tiles) {
    TDM_PDL_ENTRY();
    typedef cub::BlockScan<int32_t, MOE_MAX_EXPERTS> scan_t;
    __shared__ typename scan_t::TempStorage tmp;
    __shared__ int32_t ids_s[1024];
    const int32_t e = (int32_t)threadIdx.x;
    for (int32_t p = e; p < np; p += MOE_MAX_EXPERTS) pair_slot[p] = -1;
    int32_t cnt = 0;
    for (int32_t p0 = 0; p0 < np; p0 += 1024) { /* (ids staged through shared memory) */
        const int32_t m = min(1024, np - p0);
        __syncthreads();
        for (int32_t i = e; i < m; i += MOE_MAX_EXPERTS) ids_s[i] = ids[p0 + i];
        __syncthreads();
        if (e < ne)
            for (int32_t i = 0; i < m; i++) cnt += ids_s[i] == e;
    }
    int32_t start, tstart, total;
    const int32_t nt = (cnt + MOE_TILE - 1) / MOE_TILE;
    scan_t(tmp).ExclusiveSum(cnt, start);
    __syncthreads();
    scan_t(tmp).ExclusiveSum(nt, tstart, total);
    if (e == 0) *n_tiles = total;
    for (int32_t t = 0; t < nt; t++)
        tiles[tstart + t] = make_int4(e, start + t * MOE_TILE, min(MOE_TILE, cnt - t * MOE_TILE), 0);
    int32_t s = start;
    for (int32_t p0 = 0; p0 < np; p0 += 1024) {
        const int32_t m = min(1024, np - p0);
        __syncthreads();
        for (int32_t i = e; i < m; i += MOE_MAX_EXPERTS) ids_s[i] = ids[p0 + i];
        __syncthreads();
        if (cnt == 0 || e >= ne) continue;
        for (int32_t i = 0; i < m; i++)
            if (ids_s[i] == e) {
                slot_pair[s] = p0 + i;
                pair_slot[p0 + i] = s++;
            }
    }
}

/* ---- the products -------------------------------------------------------------- */

/* Elements 16 c .. 16 c + 15 of a row of cols columns (layout QS: QSPLIT). */
template <uint32_t T, bool QS> __device__ __forceinline__ void moe_deq16(const uint8_t *row, int32_t cols, int32_t c,
                                                                        float f[16]) {
    if constexpr (T == TDM_F32) {
        const float4 *p = (const float4 *)row + 4 * c;
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const float4 v = __ldg(p + q);
            f[4 * q] = v.x, f[4 * q + 1] = v.y, f[4 * q + 2] = v.z, f[4 * q + 3] = v.w;
        }
    } else if constexpr (T == TDM_F16 || T == TDM_BF16 || T == TDM_Q8_0 || T == TDM_Q4_0) {
#pragma unroll
        for (int j = 0; j < 16; j++) {
            if constexpr (QS && (T == TDM_Q8_0 || T == TDM_Q4_0)) f[j] = tdm_cu_wload_qsplit<T>(row, cols, 16 * c + j);
            else f[j] = tdm_cu_wload<T>(row, 16 * c + j);
        }
    } else {
        tdm_cu_deq16<T>(row, c, f);
    }
}

/* Block (W row block bx, tile blockIdx.y + t0): for the tile's slots s (up to NR of
 * them, the tile's last standing in for the missing ones, never stored):
 *   SWIGLU: y[s][j] = silu(x_s . W_e[j]) * (x_s . W_e[j + ff]), j = the warp's row;
 *   else:   y[s][2j + h] = x_s . W_e[2j + h], h < 2;
 * x_s = x[slot_pair[s] / k] (SWIGLU: the layer's rows) or x[s] (the slots' h). */
template <uint32_t T, bool QS, int NR, bool SWIGLU>
__global__ void __launch_bounds__(MOE_WARPS * 32)
k_moe_gemv(const uint8_t *const *wtab, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
           const float *__restrict__ x, const int32_t *slot_pair, int32_t k, const int4 *tiles,
           const int32_t *n_tiles, int32_t t0, float *y, int32_t ldy) {
    TDM_PDL_ENTRY();
    const int32_t tile = (int32_t)blockIdx.y + t0;
    if (tile >= *n_tiles) return;
    const int4 t = tiles[tile];
    const int32_t warp = (int32_t)blockIdx.x * MOE_WARPS + (int32_t)(threadIdx.x >> 5), lane = (int32_t)(threadIdx.x & 31);
    int32_t ra, rb;
    bool has_b = true;
    if (SWIGLU) {
        ra = warp, rb = warp + ff;
        if (ra >= ff) return;
    } else {
        ra = 2 * warp, rb = ra + 1;
        if (ra >= n_out) return;
        if (rb >= n_out) has_b = false, rb = ra;
    }
    const uint8_t *w = wtab[t.x];
    const uint8_t *rowa = w + (size_t)ra * row_bytes, *rowb = w + (size_t)rb * row_bytes;
    const int32_t m = min(t.z, NR);
    const float *xr[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const int32_t s = t.y + min(i, m - 1);
        xr[i] = x + (size_t)(SWIGLU ? slot_pair[s] / k : s) * cols;
    }
    float sa[NR], sb[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) sa[i] = sb[i] = 0.0f;
    const int32_t n16 = cols / 16;
    for (int32_t c = lane; c < n16; c += 32) {
        float fa[16], fb[16];
        moe_deq16<T, QS>(rowa, cols, c, fa);
        moe_deq16<T, QS>(rowb, cols, c, fb);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            tdm_cu_dot16x2(fa, fb, (const float4 *)(xr[i]) + 4 * c, sa[i], sb[i]);
        }
    }
    float va = 0.0f, vb = 0.0f;
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const float a = tdm_cu_warp_sum(sa[i]), bsum = tdm_cu_warp_sum(sb[i]);
        if (lane == i) va = a, vb = bsum;
    }
    if (lane >= m) return;
    float *yr = y + (size_t)(t.y + lane) * ldy;
    if (SWIGLU) {
        yr[ra] = va / (1.0f + expf(-va)) * vb;
    } else {
        yr[ra] = va;
        if (has_b) yr[rb] = vb;
    }
}

/* Row blockIdx.x: out = its experts' weighted outputs summed in ascending expert
 * order (acc + w * y, not fused; a pair without a slot adds nothing), or with ACC
 * out += that sum (the add op's one rounding). */
template <bool ACC>
__global__ void k_moe_sum(const int32_t *ids, const float *w, const int32_t *pair_slot, const float *y, int32_t k,
                          int32_t dim, float *out) {
    TDM_PDL_ENTRY();
    __shared__ int32_t order[MOE_MAX_K];
    const int32_t i = (int32_t)blockIdx.x;
    const int32_t *id = ids + (size_t)i * k;
    if (threadIdx.x == 0)
        for (int32_t s = 0; s < k; s++) { /* insertion sort of the slots by expert */
            int32_t t = s;
            while (t > 0 && id[order[t - 1]] > id[s]) {
                order[t] = order[t - 1];
                t--;
            }
            order[t] = s;
        }
    __syncthreads();
    for (int32_t col = (int32_t)threadIdx.x; col < dim; col += (int32_t)blockDim.x) {
        float acc = 0.0f;
        for (int32_t s = 0; s < k; s++) {
            const int32_t j = order[s], slot = pair_slot[(size_t)i * k + j];
            if (slot >= 0) acc = __fadd_rn(acc, __fmul_rn(w[(size_t)i * k + j], y[(size_t)slot * dim + col]));
        }
        float *o = out + (size_t)i * dim + col;
        *o = ACC ? __fadd_rn(*o, acc) : acc;
    }
}

/* The experts of one product: shared type, layout and row bytes, shape rows x cols,
 * data 16-byte aligned for the f32 loads, columns in whole 16-element groups. */
static tandem_status check_experts(const tdm_weight *w, int32_t ne, int64_t rows, int64_t cols, const char *what,
                                   tdm_err *err) {
    for (int32_t e = 0; e < ne; e++) {
        tandem_status st = tdm_cuda_check_weight(&w[e], "moe_experts", err);
        if (st) return st;
        if (w[e].rows != rows || w[e].cols != cols || w[e].type != w[0].type || w[e].layout != w[0].layout ||
            w[e].row_bytes != w[0].row_bytes)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "moe_experts: %s of expert %d is %s [%lld][%lld] (layout %u, %zu row bytes), expert 0's "
                              "%s [%lld][%lld] (layout %u, %zu), wanted [%lld][%lld]", what, (int)e,
                              tdm_dtype_name(w[e].type), (long long)w[e].rows, (long long)w[e].cols,
                              (unsigned)w[e].layout, w[e].row_bytes, tdm_dtype_name(w[0].type), (long long)w[0].rows,
                              (long long)w[0].cols, (unsigned)w[0].layout, w[0].row_bytes, (long long)rows,
                              (long long)cols);
    }
    const uint32_t t = w[0].type;
    const bool qs = w[0].layout == TDM_LAYOUT_QSPLIT;
    bool ok = cols % 16 == 0 && (qs ? (t == TDM_Q8_0 || t == TDM_Q4_0) : w[0].layout == TDM_LAYOUT_ROWS);
    if (t == TDM_F32) ok = ok && w[0].row_bytes % 16 == 0;
    for (int32_t e = 0; ok && t == TDM_F32 && e < ne; e++) ok = (uintptr_t)w[e].data % 16 == 0;
    switch (t) {
    case TDM_F32: case TDM_F16: case TDM_BF16: case TDM_Q8_0: case TDM_Q4_0:
#define KT(T) case T:
        TDM_CU_FOR_EACH_KTYPE(KT)
#undef KT
        break;
    default: ok = false;
    }
    if (!ok)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "moe_experts: %s experts of %s [%lld][%lld] (layout %u) have no "
                          "grouped kernel", what, tdm_dtype_name(t), (long long)rows, (long long)cols,
                          (unsigned)w[0].layout);
    return TANDEM_OK;
}

template <uint32_t T, bool QS, bool SWIGLU>
static void launch_t(tdm_cuda *c, int nr, dim3 grid, const uint8_t *const *wtab, size_t row_bytes, int32_t n_out,
                     int32_t cols, int32_t ff, const float *x, const int32_t *slot_pair, int32_t k, const int4 *tiles,
                     const int32_t *n_tiles, int32_t t0, float *y, int32_t ldy) {
    const dim3 th(MOE_WARPS * 32);
#define MOE_NR(N)                                                                                                  \
    case N:                                                                                                        \
        tdm_launch(k_moe_gemv<T, QS, N, SWIGLU>, grid, th, 0, c->stream, wtab, row_bytes, n_out, cols, ff, x,      \
                   slot_pair, k, tiles, n_tiles, t0, y, ldy);                                                      \
        break;
    switch (nr) {
        MOE_NR(1) MOE_NR(2) MOE_NR(4) MOE_NR(8)
    default: break;
    }
#undef MOE_NR
}

/* One grouped product over every tile (launches of at most MOE_GRID_Y tiles). */
template <bool SWIGLU>
static tandem_status launch_product(tdm_cuda *c, const tdm_weight *w0, const uint8_t *const *wtab, int nr,
                                    int32_t bound, const float *x, const int32_t *slot_pair, int32_t k,
                                    const int4 *tiles, const int32_t *n_tiles, float *y, int32_t ldy, tdm_err *err) {
    const int32_t rows = (int32_t)w0->rows, cols = (int32_t)w0->cols, ff = rows / 2;
    const int32_t per_block = SWIGLU ? MOE_WARPS : 2 * MOE_WARPS; /* outputs */
    const int32_t n_out = SWIGLU ? ff : rows;
    const bool qs = w0->layout == TDM_LAYOUT_QSPLIT;
    for (int32_t t0 = 0; t0 < bound; t0 += MOE_GRID_Y) {
        const dim3 grid((unsigned)((n_out + per_block - 1) / per_block), (unsigned)TDM_MIN(MOE_GRID_Y, bound - t0));
        switch (w0->type) {
#define MOE_T(T)                                                                                                    \
    case T:                                                                                                         \
        if (qs) launch_t<T, true, SWIGLU>(c, nr, grid, wtab, w0->row_bytes, n_out, cols, ff, x, slot_pair, k, tiles, \
                                          n_tiles, t0, y, ldy);                                                     \
        else launch_t<T, false, SWIGLU>(c, nr, grid, wtab, w0->row_bytes, n_out, cols, ff, x, slot_pair, k, tiles,  \
                                        n_tiles, t0, y, ldy);                                                       \
        break;
            MOE_T(TDM_F32) MOE_T(TDM_F16) MOE_T(TDM_BF16) MOE_T(TDM_Q8_0) MOE_T(TDM_Q4_0)
            TDM_CU_FOR_EACH_KTYPE(MOE_T)
#undef MOE_T
        default: break;
        }
        TDM_CU_LAUNCHED("moe_experts");
    }
    return TANDEM_OK;
}

static size_t al16(size_t b) { return (b + 15) & ~(size_t)15; }

/* ---- the experts' weight tables ------------------------------------------------- */

/* One layer's table: its experts' data pointers, W13 then W2, on the device (a graph
 * replays launches that read it, so it stays where it is while its weights do). */
typedef struct moe_tab {
    const tdm_weight *w13, *w2;
    int32_t ne;
    const uint8_t **host; /* [2 ne] the pointers uploaded */
    const uint8_t **dev;  /* [2 ne] */
} moe_tab;

struct tdm_cuda_moe_tabs {
    moe_tab *t;
    int32_t n, cap;
};

void tdm_cuda_moe_free(tdm_cuda *c) {
    struct tdm_cuda_moe_tabs *m = c->moe_tabs;
    if (!m) return;
    for (int32_t i = 0; i < m->n; i++) {
        free(m->t[i].host);
        cudaFree(m->t[i].dev);
    }
    free(m->t);
    free(m);
    c->moe_tabs = NULL;
}

/* The device table of these experts: the one kept for them while their data
 * pointers are the ones it holds, else (re)built, which waits for the stream and
 * cannot happen during a capture.  NULL with err set on failure. */
static const uint8_t *const *moe_table(tdm_cuda *c, const tdm_weight *w13, const tdm_weight *w2, int32_t ne,
                                       tdm_err *err) {
    if (!c->moe_tabs && !(c->moe_tabs = (struct tdm_cuda_moe_tabs *)calloc(1, sizeof *c->moe_tabs))) {
        tdm_seterr(err, TANDEM_ERR_NOMEM, "moe_experts: out of memory");
        return NULL;
    }
    struct tdm_cuda_moe_tabs *m = c->moe_tabs;
    moe_tab *t = NULL;
    for (int32_t i = 0; i < m->n && !t; i++)
        if (m->t[i].w13 == w13 && m->t[i].w2 == w2 && m->t[i].ne == ne) t = &m->t[i];
    if (t) {
        bool same = true;
        for (int32_t e = 0; e < ne && same; e++)
            same = t->host[e] == (const uint8_t *)w13[e].data && t->host[ne + e] == (const uint8_t *)w2[e].data;
        if (same) return t->dev;
    } else {
        if (m->n == m->cap) {
            const int32_t cap = m->cap ? 2 * m->cap : 64;
            moe_tab *nt = (moe_tab *)realloc(m->t, (size_t)cap * sizeof *nt);
            if (!nt) {
                tdm_seterr(err, TANDEM_ERR_NOMEM, "moe_experts: out of memory");
                return NULL;
            }
            m->t = nt;
            m->cap = cap;
        }
        t = &m->t[m->n];
        memset(t, 0, sizeof *t);
        t->w13 = w13, t->w2 = w2, t->ne = ne;
        t->host = (const uint8_t **)calloc((size_t)2 * ne, sizeof *t->host);
        if (!t->host) {
            tdm_seterr(err, TANDEM_ERR_NOMEM, "moe_experts: out of memory");
            return NULL;
        }
        if (c->capturing) {
            free(t->host);
            tdm_seterr(err, TANDEM_ERR_BACKEND, "moe_experts: a new experts table during a graph capture");
            return NULL;
        }
        cudaError_t e = cudaMalloc((void **)&t->dev, (size_t)2 * ne * sizeof(void *));
        if (e != cudaSuccess) {
            cudaGetLastError();
            free(t->host);
            tdm_cuda_status(e, "moe_experts: experts table", err);
            return NULL;
        }
        m->n++;
    }
    if (c->capturing) {
        tdm_seterr(err, TANDEM_ERR_BACKEND, "moe_experts: experts table changed during a graph capture");
        return NULL;
    }
    for (int32_t e = 0; e < ne; e++) {
        t->host[e] = (const uint8_t *)w13[e].data;
        t->host[ne + e] = (const uint8_t *)w2[e].data;
    }
    cudaError_t e = cudaMemcpyAsync(t->dev, t->host, (size_t)2 * ne * sizeof(void *), cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream); /* (host is pageable and rewritten later) */
    if (e != cudaSuccess) {
        tdm_cuda_status(e, "moe_experts: experts table", err);
        return NULL;
    }
    return t->dev;
}

/* ---- the experts op and the fused forward's layer -------------------------------- */

static tandem_status check_args(int32_t n, int32_t E, int32_t F, int32_t NE, int32_t K, const tdm_weight *w13,
                                const tdm_weight *w2, tdm_err *err) {
    if (n < 0 || E <= 0 || F <= 0 || NE <= 0 || NE > MOE_MAX_EXPERTS || K <= 0 || K > NE || K > MOE_MAX_K)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "moe_experts: n %d, n_embd %d, n_ff %d, %d of %d experts "
                          "(at most %d of %d)", (int)n, (int)E, (int)F, (int)K, (int)NE, MOE_MAX_K, MOE_MAX_EXPERTS);
    if ((int64_t)n * K > (int64_t)1 << 24)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "moe_experts: %d rows of %d experts", (int)n, (int)K);
    tandem_status st;
    if ((st = check_experts(w13, NE, 2 * (int64_t)F, E, "gate and up", err)) ||
        (st = check_experts(w2, NE, E, F, "down", err)))
        return st;
    return TANDEM_OK;
}

/* The grouped products and the sum (ACC: into out as +=), n > 0, arguments checked. */
static tandem_status run_experts(tdm_cuda *c, const float *x, int32_t n, int32_t E, int32_t F, int32_t NE, int32_t K,
                                 const int32_t *ids, const float *wt, const tdm_weight *w13, const tdm_weight *w2,
                                 float *out, bool acc, tdm_err *err) {
    const uint8_t *const *td = moe_table(c, w13, w2, NE, err);
    if (!td) return err ? err->status : TANDEM_ERR_BACKEND;
    /* the call's buffer: slot_pair, pair_slot [np], n_tiles, tiles [bound], h [np][F],
     * y [np][E] */
    const int32_t np = n * K, bound = (np + MOE_TILE - 1) / MOE_TILE + TDM_MIN(NE, np);
    const size_t o_ps = al16((size_t)np * 4), o_nt = o_ps + al16((size_t)np * 4), o_tl = o_nt + 16,
                 o_h = o_tl + al16((size_t)bound * sizeof(int4)), o_y = o_h + al16((size_t)np * F * 4),
                 bytes = o_y + (size_t)np * E * 4;
    uint8_t *buf = (uint8_t *)tdm_cuda_buf_get(c, &c->moe_buf, bytes, "moe_experts", err);
    if (!buf) return err ? err->status : TANDEM_ERR_NOMEM;
    int32_t *slot_pair = (int32_t *)buf, *pair_slot = (int32_t *)(buf + o_ps), *n_tiles = (int32_t *)(buf + o_nt);
    int4 *tiles = (int4 *)(buf + o_tl);
    float *h = (float *)(buf + o_h), *y = (float *)(buf + o_y);
    tdm_launch(k_moe_sort, dim3(1), dim3(MOE_MAX_EXPERTS), 0, c->stream, ids, np, NE, slot_pair, pair_slot, tiles,
               n_tiles);
    TDM_CU_LAUNCHED("moe_experts (grouping)");
    /* rows per tile: an expert takes at most one pair of a row (distinct experts) */
    const int nr = n == 1 ? 1 : n == 2 ? 2 : n <= 4 ? 4 : MOE_TILE;
    tandem_status st;
    if ((st = launch_product<true>(c, &w13[0], td, nr, bound, x, slot_pair, K, tiles, n_tiles, h, F, err)) ||
        (st = launch_product<false>(c, &w2[0], td + NE, nr, bound, h, slot_pair, K, tiles, n_tiles, y, E, err)))
        return st;
    if (acc)
        tdm_launch(k_moe_sum<true>, dim3((unsigned)n), dim3(256), 0, c->stream, ids, wt, (const int32_t *)pair_slot,
                   (const float *)y, K, E, out);
    else
        tdm_launch(k_moe_sum<false>, dim3((unsigned)n), dim3(256), 0, c->stream, ids, wt, (const int32_t *)pair_slot,
                   (const float *)y, K, E, out);
    TDM_CU_LAUNCHED("moe_experts (sum)");
    return TANDEM_OK;
}

tandem_status tdm_cuda_moe_experts(tdm_backend *b, const tdm_moe_args *a, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "moe_experts", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (!a || !a->x || !a->ids || !a->w || !a->w13 || !a->w2 || !a->out)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "moe_experts: NULL argument");
    tandem_status st = check_args(a->n, a->n_embd, a->n_ff, a->n_expert, a->k, a->w13, a->w2, err);
    if (st || a->n == 0) return st;
    return run_experts(c, a->x, a->n, a->n_embd, a->n_ff, a->n_expert, a->k, a->ids, a->w, a->w13, a->w2, a->out,
                       false, err);
}

tandem_status tdm_cuda_moe_ffn(tdm_cuda *c, const tdm_weight *w13, const tdm_weight *w2, const float *xb,
                               const float *logits, int32_t n, int32_t n_embd, int32_t n_ff, int32_t n_expert,
                               int32_t k, int32_t *ids, float *w, float *x, tdm_err *err) {
    if (!w13 || !w2 || !xb || !logits || !ids || !w || !x)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "moe_experts: NULL argument");
    tandem_status st = check_args(n, n_embd, n_ff, n_expert, k, w13, w2, err);
    if (st || n == 0) return st;
    tdm_launch(k_moe_route, dim3((unsigned)((n + 3) / 4)), dim3(128), 0, c->stream, logits, n, n_expert, k, ids, w);
    TDM_CU_LAUNCHED("moe_route");
    return run_experts(c, xb, n, n_embd, n_ff, n_expert, k, ids, w, w13, w2, x, true, err);
}
