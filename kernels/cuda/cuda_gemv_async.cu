/* cuda_gemv_async.cu - f16 / bf16 matrix products of one to 8 rows per tile on tensor
 * cores, W staged through shared memory by asynchronous copies
 * (tdm_cuda_gemv_tcs, called by tdm_cuda_gemv when c->gemv_tc == 2):
 * y[n][ldy] (+)= x[n][cols] W^T.
 *
 * The CUDA-core kernels (cuda_gemv.cu) spend an FMA per weight element per input row:
 * at 5 rows of a 7B model that is a fifth of the forward in FP32 work alone (6.26 ms
 * against 4.9 ms for one row).  cuda_gemv_tc.cu puts the rows on tensor cores but
 * loads W straight into mma fragments, 64 bytes of each of 8 rows per warp load,
 * and streams it at 2.0 TB/s.  Here W moves as the CUDA-core kernels read it
 * (every warp copy is whole 256-byte runs of W rows, cp.async, L2 only) into shared
 * memory, and ldmatrix forms the fragments there.
 *
 *   Block: 4 warps on the same 16 W rows (STORE / ACCUM: rows r0 .. r0 + 15; SWIGLU:
 *     gate rows j0 .. j0 + 7 as M rows 0-7 and their up rows as M rows 8-15), warp s
 *     the columns [s L, min((s + 1) L, cols)) with L = ceil(cols / 64) * 16, by one
 *     tile of 8 input rows (blockIdx.x).
 *   Warp: stages of 128 columns of its 16 rows (4 KB) in a ring of two; while one is
 *     multiplied the next is in flight.  Per 16 columns: ldmatrix.x4 gives the A
 *     fragment (16 W rows x 16 columns), lane (g, t) reads x[g][k + 2t, 2t + 1, 2t +
 *     8, 2t + 9] for the B fragment, and mma.m16n8k16 with f32 accumulation runs once
 *     per part of x.
 *   Precision: x (f32) is split into parts of the weight's type, each the rounded
 *     remainder of the ones before (f16: two parts, 22 significant bits; bf16: three,
 *     24), each part with its own accumulators, added in part order at the end.
 *   Order: the four warps' sums added in warp order (shared memory).  Nothing
 *     depends on the number of input rows or on the other rows (the mma computes each
 *     column of its output from that column alone), so a decode row and the same row
 *     in a verification give the same bits.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_internal.h"

#define TS_WARPS 4                      /* warps per block, one per column segment */
#define TS_COLS 128                     /* columns per stage */
#define TS_PITCH (TS_COLS * 2 + 16)     /* bytes per staged row (padded: ldmatrix rows in distinct banks) */
#define TS_STAGE (16 * TS_PITCH)        /* bytes per stage */

template <uint32_t T> struct ts_parts { static constexpr int n = T == TDM_F16 ? 2 : 3; };

/* (a, b) rounded to f16 (saturating) / bf16, packed: a in the low half. */
template <uint32_t T> __device__ __forceinline__ uint32_t ts_pack(float a, float b) {
    uint32_t r;
    if (T == TDM_F16) asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    else asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}
template <uint32_t T> __device__ __forceinline__ float2 ts_unpack(uint32_t r) {
    if (T == TDM_F16) return __half22float2(*reinterpret_cast<const __half2 *>(&r));
    return make_float2(__uint_as_float(r << 16), __uint_as_float(r & 0xffff0000u));
}
/* (a, b) split into NP packed parts. */
template <uint32_t T> __device__ __forceinline__ void ts_split(float a, float b, uint32_t out[ts_parts<T>::n]) {
#pragma unroll
    for (int p = 0; p < ts_parts<T>::n; p++) {
        out[p] = ts_pack<T>(a, b);
        if (p + 1 < ts_parts<T>::n) {
            const float2 h = ts_unpack<T>(out[p]);
            a -= h.x;
            b -= h.y;
        }
    }
}

template <uint32_t T>
__device__ __forceinline__ void ts_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    if (T == TDM_F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ts_copy16(uint32_t smem, const void *gmem) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(gmem) : "memory");
}
__device__ __forceinline__ void ts_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void ts_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* Copies stage columns [c0, c0 + 128) of the warp's 16 rows (16-byte pieces past
 * `end` are zeros) into the stage at `dst`: lane l takes pieces l, l + 32, ...
 * (piece q: row q / 16, bytes 16 (q % 16)), so each copy instruction moves two
 * whole 256-byte runs. */
__device__ __forceinline__ void ts_stage(uint32_t dst, uint8_t *dst_ptr, const uint8_t *const rows[16], int32_t c0,
                                         int32_t end, int lane) {
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const int q = lane + 32 * u, r = q >> 4, p = q & 15;
        const int32_t col = c0 + 8 * p;
        const uint32_t off = (uint32_t)(r * TS_PITCH + 16 * p);
        if (col < end) ts_copy16(dst + off, rows[r] + (size_t)col * 2);
        else *(uint4 *)(dst_ptr + off) = make_uint4(0, 0, 0, 0);
    }
}

template <uint32_t T, int EPI>
__global__ void __launch_bounds__(TS_WARPS * 32)
k_gemv_tcs(const uint8_t *__restrict__ w, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
           const float *__restrict__ x, float *y, int32_t ldy, int32_t n_rows) {
    constexpr int NP = ts_parts<T>::n;
    __shared__ __align__(16) uint8_t ring[TS_WARPS][2][TS_STAGE];
    __shared__ float red[TS_WARPS - 1][32][4];
    const int warp = (int)(threadIdx.x >> 5), lane = (int)(threadIdx.x & 31);
    const int g = lane >> 2, t = lane & 3;
    const int32_t r0 = (int32_t)blockIdx.y * (EPI == TDM_EPI_SWIGLU ? 8 : 16);
    /* M row m's W row, clamped to existing rows (extra outputs are never stored) */
    const uint8_t *rows[16];
#pragma unroll
    for (int m = 0; m < 16; m++) {
        int32_t r;
        if (EPI == TDM_EPI_SWIGLU) r = min(r0 + (m & 7), n_out - 1) + (m >= 8 ? ff : 0);
        else r = min(r0 + m, n_out - 1);
        rows[m] = w + (size_t)r * row_bytes;
    }
    const int32_t L = (cols + 63) / 64 * 16, lo = warp * L, hi = min(cols, lo + L);
    const int32_t n_st = hi > lo ? (hi - lo + TS_COLS - 1) / TS_COLS : 0;
    uint8_t *my = ring[warp][0];
    const uint32_t my_s = (uint32_t)__cvta_generic_to_shared(my);
    if (n_st > 0) ts_stage(my_s, my, rows, lo, hi, lane);
    ts_commit();
    if (n_st > 1) ts_stage(my_s + TS_STAGE, my + TS_STAGE, rows, lo + TS_COLS, hi, lane);
    ts_commit();
    TDM_PDL_ENTRY();
    const int32_t row0 = (int32_t)blockIdx.x * 8;
    const float *xr = row0 + g < n_rows ? x + (size_t)(row0 + g) * cols : NULL; /* B column g: input row */
    float acc[NP][4];
#pragma unroll
    for (int p = 0; p < NP; p++) acc[p][0] = acc[p][1] = acc[p][2] = acc[p][3] = 0.0f;
    /* ldmatrix.x4: lane i addresses row (i % 8) + 8 ((i / 8) % 2), columns 8 (i / 16) */
    const uint32_t lm_off = (uint32_t)(((lane & 7) + 8 * ((lane >> 3) & 1)) * TS_PITCH + 16 * (lane >> 4));
    for (int32_t s = 0; s < n_st; s++) {
        ts_wait<1>();
        __syncwarp();
        const uint32_t st = my_s + (uint32_t)(s & 1) * TS_STAGE;
        const int32_t c0 = lo + s * TS_COLS;
#pragma unroll
        for (int kk = 0; kk < TS_COLS / 16; kk++) {
            const int32_t k = c0 + 16 * kk;
            if (k >= hi) break;
            uint32_t a[4];
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                         : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                         : "r"(st + lm_off + 32 * kk));
            float2 xa = make_float2(0.0f, 0.0f), xb = xa;
            if (xr) {
                if (k + 2 * t < hi) xa = __ldg((const float2 *)(xr + k + 2 * t));
                if (k + 8 + 2 * t < hi) xb = __ldg((const float2 *)(xr + k + 8 + 2 * t));
            }
            uint32_t b0[NP], b1[NP];
            ts_split<T>(xa.x, xa.y, b0);
            ts_split<T>(xb.x, xb.y, b1);
#pragma unroll
            for (int p = 0; p < NP; p++) ts_mma<T>(acc[p], a, b0[p], b1[p]);
        }
        __syncwarp();
        if (s + 2 < n_st) ts_stage(st, my + (s & 1) * TS_STAGE, rows, c0 + 2 * TS_COLS, hi, lane);
        ts_commit();
    }
    ts_wait<0>();
    float v[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        float sum = acc[0][e];
#pragma unroll
        for (int p = 1; p < NP; p++) sum += acc[p][e];
        v[e] = sum;
    }
    /* the warps' sums, added in warp order */
    if (warp > 0) {
#pragma unroll
        for (int e = 0; e < 4; e++) red[warp - 1][lane][e] = v[e];
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int u = 0; u < TS_WARPS - 1; u++)
#pragma unroll
        for (int e = 0; e < 4; e++) v[e] += red[u][lane][e];
    /* v: (M row g, input rows 2t, 2t + 1), (M row g + 8, the same) */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int32_t i = row0 + 2 * t + h;
        if (i >= n_rows) continue;
        float *yr = y + (size_t)i * ldy;
        if (EPI == TDM_EPI_SWIGLU) {
            const int32_t o = r0 + g;
            const float a = v[h], b = v[2 + h];
            if (o < n_out) yr[o] = a / (1.0f + expf(-a)) * b;
        } else {
            const int32_t oa = r0 + g, ob = r0 + 8 + g;
            if (EPI == TDM_EPI_ACCUM) {
                if (oa < n_out) yr[oa] += v[h];
                if (ob < n_out) yr[ob] += v[2 + h];
            } else {
                if (oa < n_out) yr[oa] = v[h];
                if (ob < n_out) yr[ob] = v[2 + h];
            }
        }
    }
}

bool tdm_cuda_gemv_tcs_use(const tdm_cuda *c, const tdm_weight *w) {
    return c->gemv_tc == 2 && w->layout == TDM_LAYOUT_ROWS && (w->type == TDM_F16 || w->type == TDM_BF16) &&
           w->cols % 8 == 0 && w->row_bytes % 16 == 0 && (uintptr_t)w->data % 16 == 0;
}

template <uint32_t T>
static void ts_launch(tdm_cuda *c, tdm_gemv_epi epi, dim3 grid, const tdm_weight *w, int32_t n_out, int32_t ff,
                      const float *x, float *y, int32_t ldy, int32_t n) {
    const uint8_t *wd = (const uint8_t *)w->data;
    const int32_t cols = (int32_t)w->cols;
    const unsigned th = TS_WARPS * 32;
    if (epi == TDM_EPI_STORE)
        tdm_launch(k_gemv_tcs<T, TDM_EPI_STORE>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy, n);
    else if (epi == TDM_EPI_ACCUM)
        tdm_launch(k_gemv_tcs<T, TDM_EPI_ACCUM>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy, n);
    else
        tdm_launch(k_gemv_tcs<T, TDM_EPI_SWIGLU>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, x, y, ldy, n);
}

tandem_status tdm_cuda_gemv_tcs(tdm_cuda *c, const tdm_weight *w, const float *x, int32_t n, float *y, int32_t ldy,
                                tdm_gemv_epi epi, tdm_err *err) {
    if (!tdm_cuda_gemv_tcs_use(c, w))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemv_tcs: %s weight [%lld][%lld] has no kernel here",
                          tdm_dtype_name(w->type), (long long)w->rows, (long long)w->cols);
    const int32_t ff = (int32_t)(w->rows / 2);
    const int32_t n_out = epi == TDM_EPI_SWIGLU ? ff : (int32_t)w->rows;
    const int64_t wblocks = ((int64_t)n_out + (epi == TDM_EPI_SWIGLU ? 7 : 15)) / (epi == TDM_EPI_SWIGLU ? 8 : 16);
    if (wblocks > 65535)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "gemv_tcs: %lld output rows (at most %lld)", (long long)n_out,
                          (long long)65535 * (epi == TDM_EPI_SWIGLU ? 8 : 16));
    const dim3 grid((unsigned)((n + 7) / 8), (unsigned)wblocks);
    if (w->type == TDM_F16) ts_launch<TDM_F16>(c, epi, grid, w, n_out, ff, x, y, ldy, n);
    else ts_launch<TDM_BF16>(c, epi, grid, w, n_out, ff, x, y, ldy, n);
    TDM_CU_LAUNCHED("gemv_tcs");
    return TANDEM_OK;
}
