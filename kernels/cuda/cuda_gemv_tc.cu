/* cuda_gemv_tc.cu - f16 / bf16 matrix products of one to 64 rows on tensor cores
 * (tdm_cuda_gemv_tc, called by tdm_cuda_gemv): y[n][ldy] (+)= x[n][cols] W^T.
 *
 * The CUDA-core kernels (cuda_gemv.cu) spend an FMA per weight element per input
 * row, so a verification of 8 rows of a 7B model is compute-bound there (10.5 ms
 * for 9 rows against 4.9 ms for one).  Here the input rows are the N side of
 * mma.m16n8k16 (8 rows per n-tile, NT n-tiles per pass) and W the M side, so W is
 * streamed once per pass at memory speed for up to 8 * NT rows.
 *
 *   Block: 16 W rows (STORE / ACCUM: rows r0 .. r0 + 15; SWIGLU: gate rows j0 .. j0 + 7
 *     as M rows 0-7 and their up rows j0 + ff .. as M rows 8-15, so a lane holds a
 *     gate and its up for the same output) by one tile of 8 * NT input rows.  Its
 *     four warps take the 32-column chunks c = warp, warp + 4, ...; lane (g, t)
 *     loads 8 consecutive columns 8t .. 8t + 7 of a chunk for W rows g and g + 8 and
 *     input row g of each n-tile (16-byte loads), which two mma steps take as their
 *     k = 2t, 2t + 1, 2t + 8, 2t + 9 (a column order of our choosing: the same for W
 *     and x, so the dot products are unchanged).
 *   Precision: x (f32) is split into parts of the weight's type, each the rounded
 *     remainder of the ones before, and every part is multiplied (f32
 *     accumulation): f16 two parts, 22 significant bits of x; bf16 three, 24 (f32's).
 *     Converting x to f16 once, as a cuBLAS product of f16 activations does, keeps
 *     11.  f16's first part saturates at +-65504 and its second does not, so an
 *     activation beyond about 131000 in magnitude, an infinity or a NaN gives a
 *     product that is not finite (the engine reports non-finite logits), never a
 *     clipped one.
 *   Accuracy: the tensor cores' f32 accumulation is not IEEE round-to-nearest; against
 *     an f64 reference the normalised error is about 2.6e-6 at 4096 columns (the
 *     CUDA-core kernels: under 2e-6).
 *   Speed (H200, 2026-12-03): Llama-2-7B shapes F16, forwards of 1 / 5 / 9 rows
 *     6.85 / 6.99 / 7.93 ms against 4.92 / 6.26 / 11.31 ms on CUDA cores: flat to 5
 *     rows, but W streams at 2.0 TB/s at one row against 2.75, so it is off by
 *     default (TANDEM_CUDA_GEMV_TC=1 turns it on).  Measured and not the cause:
 *     the x splitting (packed saturating conversions, about 3 instructions a value
 *     instead of 9: 7.00 -> 6.85 ms); loading each warp's chunks as runs of 512
 *     contiguous bytes a row was slower (7.95 ms); staging W in shared memory as
 *     whole 256-byte runs (cp.async, two 4 KB stages a warp) with ldmatrix fragments
 *     was slower still (8.57 ms at one row; commit 1befda4).  What is fast on this
 *     chip: cuBLAS's f16 kernel for 1 to 8 rows (nvjet 128x8x64, 12 stages of 16 KB,
 *     one 384-thread block a multiprocessor, ncu 2026-12-03) streams W at 3.4 TB/s
 *     flat from 1 to 8 rows, but is not batch invariant and takes f16 x.  Next: a
 *     kernel of that shape (deep pipeline, large M tile) with a fixed K order.
 *   Order: each warp's partial sums over its chunks in increasing order, then the
 *     four warps' added in warp order.  Nothing depends on the number of input rows
 *     or on the other rows (the mma computes each output from its own row and column
 *     only), so a decode row and the same row in a verification give the same bits.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_internal.h"
#include "cuda_weights.cuh"

#define TC_WARPS 4
#define TC_CHUNK 32 /* columns per warp step */

/* Parts x is split into: f16 keeps 11 significant bits a part (two parts: 22),
 * bf16 8 (three parts: 24, as f32). */
template <uint32_t T> struct tc_parts { static constexpr int n = T == TDM_F16 ? 2 : 3; };

/* (a, b) rounded to f16 (with sat: saturating at +-65504; NaN stays NaN) / bf16,
 * packed: a in the low half. */
template <uint32_t T> __device__ __forceinline__ uint32_t tc_pack(float a, float b, bool sat) {
    uint32_t r;
    if (T == TDM_F16 && sat) asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    else if (T == TDM_F16) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}

/* The packed pair back in f32. */
template <uint32_t T> __device__ __forceinline__ float2 tc_unpack(uint32_t r) {
    if (T == TDM_F16) return __half22float2(*reinterpret_cast<const __half2 *>(&r));
    return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
}

/* Two f32 (a, b) as packed pairs of the weight's 16-bit type: part 0 the rounded
 * values, each next part the rounded remainder of the parts before (f16: part 0
 * saturates, so a remainder beyond f16's range - an activation beyond about 131000,
 * an infinity - reaches the last part, which does not: infinite there). */
template <uint32_t T> __device__ __forceinline__ void tc_split2(float a, float b, uint32_t out[tc_parts<T>::n]) {
#pragma unroll
    for (int p = 0; p < tc_parts<T>::n; p++) {
        out[p] = tc_pack<T>(a, b, p + 1 < tc_parts<T>::n);
        if (p + 1 < tc_parts<T>::n) {
            const float2 h = tc_unpack<T>(out[p]);
            a -= h.x; /* (exact) */
            b -= h.y;
        }
    }
}

/* c += a b, m16n8k16, f32 accumulators. */
template <uint32_t T>
__device__ __forceinline__ void tc_mma(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                       uint32_t b1) {
    if (T == TDM_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* One chunk: W rows (g, g + 8) columns k .. k + 7 in wa, wb; each n-tile's input row
 * g at the same columns from x (zeros where !in or the row does not exist). */
template <uint32_t T, int NT>
__device__ __forceinline__ void tc_chunk(float acc[NT][4], const uint4 &wa, const uint4 &wb, const float *const xr[NT],
                                         int32_t k, bool in) {
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float4 p = make_float4(0.f, 0.f, 0.f, 0.f), q = p;
        if (in && xr[j]) {
            p = __ldg((const float4 *)(xr[j] + k));
            q = __ldg((const float4 *)(xr[j] + k) + 1);
        }
        constexpr int NP = tc_parts<T>::n;
        uint32_t x0[NP], x1[NP], x2[NP], x3[NP];
        tc_split2<T>(p.x, p.y, x0);
        tc_split2<T>(p.z, p.w, x1);
        tc_split2<T>(q.x, q.y, x2);
        tc_split2<T>(q.z, q.w, x3);
        /* step 1: columns 8t .. 8t + 3; step 2: 8t + 4 .. 8t + 7 (each part in turn) */
#pragma unroll
        for (int e = 0; e < NP; e++) tc_mma<T>(acc[j], wa.x, wb.x, wa.y, wb.y, x0[e], x1[e]);
#pragma unroll
        for (int e = 0; e < NP; e++) tc_mma<T>(acc[j], wa.z, wb.z, wa.w, wb.w, x2[e], x3[e]);
    }
}

template <uint32_t T, int NT, int EPI>
__global__ void __launch_bounds__(TC_WARPS * 32)
k_gemv_tc(const uint8_t *__restrict__ w, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
          const float *__restrict__ x, float *y, int32_t ldy, int32_t n_rows) {
    TDM_PDL_ENTRY();
    __shared__ float red[TC_WARPS - 1][NT][32][4];
    const int32_t warp = (int32_t)(threadIdx.x >> 5), lane = (int32_t)(threadIdx.x & 31);
    const int32_t g = lane >> 2, t = lane & 3;
    const int32_t r0 = (int32_t)blockIdx.y * (EPI == TDM_EPI_SWIGLU ? 8 : 16);
    /* this lane's W rows (M rows g and g + 8), clamped to existing rows (the extra
     * outputs are never stored) */
    int32_t ra, rb;
    if (EPI == TDM_EPI_SWIGLU) {
        ra = min(r0 + g, n_out - 1);
        rb = ra + ff;
    } else {
        ra = min(r0 + g, n_out - 1);
        rb = min(r0 + 8 + g, n_out - 1);
    }
    const int32_t row0 = (int32_t)blockIdx.x * 8 * NT; /* this block's first input row */
    const float *xr[NT];
#pragma unroll
    for (int j = 0; j < NT; j++) {
        const int32_t i = row0 + 8 * j + g;
        xr[j] = i < n_rows ? x + (size_t)i * cols : NULL;
    }
    const uint8_t *wa_p = w + (size_t)ra * row_bytes, *wb_p = w + (size_t)rb * row_bytes;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    const int32_t n_chunks = (cols + TC_CHUNK - 1) / TC_CHUNK, n_full = cols / TC_CHUNK;
    const int32_t col = 8 * t; /* this lane's columns within a chunk */
    constexpr int U = NT == 1 ? 8 : 4; /* chunks whose W loads a warp has in flight */
    int32_t c = warp;
    /* groups of U whole chunks, their W loads issued together */
    for (; c + (U - 1) * TC_WARPS < n_full; c += U * TC_WARPS) {
        uint4 wa[U], wb[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t k = (c + u * TC_WARPS) * TC_CHUNK + col;
            wa[u] = tdm_cu_ld_stream(wa_p + (size_t)k * 2);
            wb[u] = tdm_cu_ld_stream(wb_p + (size_t)k * 2);
        }
#pragma unroll
        for (int u = 0; u < U; u++)
            tc_chunk<T, NT>(acc, wa[u], wb[u], xr, (c + u * TC_WARPS) * TC_CHUNK + col, true);
    }
    /* the rest one at a time; in a last partial chunk the lanes past cols add zeros
     * (the mma takes the whole warp) */
    for (; c < n_chunks; c += TC_WARPS) {
        const int32_t k = c * TC_CHUNK + col;
        const bool in = k < cols;
        uint4 wa = make_uint4(0, 0, 0, 0), wb = wa;
        if (in) {
            wa = tdm_cu_ld_stream(wa_p + (size_t)k * 2);
            wb = tdm_cu_ld_stream(wb_p + (size_t)k * 2);
        }
        tc_chunk<T, NT>(acc, wa, wb, xr, k, in);
    }
    /* the warps' sums, added in warp order */
    if (warp > 0) {
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) red[warp - 1][j][lane][e] = acc[j][e];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int v = 0; v < TC_WARPS - 1; v++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[j][e] += red[v][j][lane][e];
        /* acc[j]: (M row g, input rows 2t, 2t + 1), (M row g + 8, the same) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int32_t i = row0 + 8 * j + 2 * t + h; /* input row */
            if (i >= n_rows) continue;
            float *yr = y + (size_t)i * ldy;
            if (EPI == TDM_EPI_SWIGLU) {
                const int32_t o = r0 + g;
                const float a = acc[j][h], b = acc[j][2 + h];
                if (o < n_out) yr[o] = a / (1.0f + expf(-a)) * b;
            } else {
                const int32_t oa = r0 + g, ob = r0 + 8 + g;
                if (EPI == TDM_EPI_ACCUM) {
                    if (oa < n_out) yr[oa] += acc[j][h];
                    if (ob < n_out) yr[ob] += acc[j][2 + h];
                } else {
                    if (oa < n_out) yr[oa] = acc[j][h];
                    if (ob < n_out) yr[ob] = acc[j][2 + h];
                }
            }
        }
    }
}

bool tdm_cuda_gemv_tc_use(const tdm_cuda *c, const tdm_weight *w) {
    return c->gemv_tc && w->layout == TDM_LAYOUT_ROWS && (w->type == TDM_F16 || w->type == TDM_BF16) &&
           w->cols % 8 == 0 && w->row_bytes % 16 == 0 && (uintptr_t)w->data % 16 == 0;
}

template <uint32_t T, int EPI>
static void tc_launch(tdm_cuda *c, int nt, dim3 grid, const tdm_weight *w, int32_t n_out, int32_t ff, const float *x,
                      float *y, int32_t ldy, int32_t n) {
    const uint8_t *wd = (const uint8_t *)w->data;
    const int32_t cols = (int32_t)w->cols;
    const unsigned th = TC_WARPS * 32;
    if (nt == 1) tdm_launch(k_gemv_tc<T, 1, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy, n);
    else if (nt == 2) tdm_launch(k_gemv_tc<T, 2, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy, n);
    else tdm_launch(k_gemv_tc<T, 4, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy, n);
}

template <uint32_t T>
static void tc_launch_epi(tdm_cuda *c, tdm_gemv_epi epi, int nt, dim3 grid, const tdm_weight *w, int32_t n_out,
                          int32_t ff, const float *x, float *y, int32_t ldy, int32_t n) {
    if (epi == TDM_EPI_STORE) tc_launch<T, TDM_EPI_STORE>(c, nt, grid, w, n_out, ff, x, y, ldy, n);
    else if (epi == TDM_EPI_ACCUM) tc_launch<T, TDM_EPI_ACCUM>(c, nt, grid, w, n_out, ff, x, y, ldy, n);
    else tc_launch<T, TDM_EPI_SWIGLU>(c, nt, grid, w, n_out, ff, x, y, ldy, n);
}

tandem_status tdm_cuda_gemv_tc(tdm_cuda *c, const tdm_weight *w, const float *x, int32_t n, float *y, int32_t ldy,
                               tdm_gemv_epi epi, tdm_err *err) {
    if (!tdm_cuda_gemv_tc_use(c, w))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemv_tc: %s weight [%lld][%lld] has no tensor-core kernel",
                          tdm_dtype_name(w->type), (long long)w->rows, (long long)w->cols);
    const int32_t ff = (int32_t)(w->rows / 2);
    const int32_t n_out = epi == TDM_EPI_SWIGLU ? ff : (int32_t)w->rows;
    /* n-tiles per pass: the fewest that take the rows in one pass, at most 4 (32
     * rows); more rows run as more passes side by side (blockIdx.x) */
    const int nt = n <= 8 ? 1 : n <= 16 ? 2 : 4;
    const unsigned passes = (unsigned)((n + 8 * nt - 1) / (8 * nt));
    const int64_t wblocks = ((int64_t)n_out + (epi == TDM_EPI_SWIGLU ? 7 : 15)) / (epi == TDM_EPI_SWIGLU ? 8 : 16);
    if (wblocks > 65535)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemv_tc: %lld output rows (at most %lld)", (long long)n_out,
                          (long long)65535 * (epi == TDM_EPI_SWIGLU ? 8 : 16));
    const dim3 grid(passes, (unsigned)wblocks);
    if (w->type == TDM_F16) tc_launch_epi<TDM_F16>(c, epi, nt, grid, w, n_out, ff, x, y, ldy, n);
    else tc_launch_epi<TDM_BF16>(c, epi, nt, grid, w, n_out, ff, x, y, ldy, n);
    TDM_CU_LAUNCHED("gemv_tc");
    return TANDEM_OK;
}
