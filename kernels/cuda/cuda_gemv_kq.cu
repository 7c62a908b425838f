/* cuda_gemv_kq.cu - the row kernels (decode, verification: cuda_gemv.cu's header) of
 * the K-quants of the Q4_K_M / Q5_K_M files, Q4_K, Q5_K and Q6_K, in their rows
 * layout (the file's blocks as they are), with int8 dot products:
 *
 *   x is quantised once per product per 32-element block (tdm_cuda_quantize_x: q_x,
 *   d_x, and the block's sum of q_x), as for the q8_0 / q4_0 kernels.  A K-quant
 *   sub-block has one scale (and Q4_K / Q5_K one min) and lies in one x block, so
 *     Q4_K / Q5_K (sub-blocks of 32, value d sc q - dmin m):
 *       acc += (d sc) d_x * dp4a(q, q_x) - (dmin m) d_x * sum(q_x)
 *     Q6_K (sub-blocks of 16, value d sc (q - 32), q - 32 as signed bytes):
 *       acc += (d sc) d_x * dp4a(q - 32, q_x)
 *   with the scales' products (d sc, dmin m) in f32 exactly as the host dequantises
 *   them (tdm_row_to_f32); only x's rounding to int8 separates the result from the
 *   f32 reference (tests: normalised error against x quantised the same way).
 *
 * A lane takes chunks of 32 elements: 16 bytes of quants, so 8 lanes cover a
 * super-block of 256 and a warp's 32 lanes 4 consecutive super-blocks per step.
 *   Q4_K (144-byte blocks: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
 *     nibbles): chunk s of a block is qs[16 s ..]: its low nibbles are elements
 *     l0 .. l0 + 15 (l0 = 16 (s % 2)) of sub-block j0 = 2 (s / 2), its high nibbles
 *     those of sub-block j0 + 1.  The quants with one 16-byte load that bypasses L1
 *     (read once), the block's first 16 bytes (scales) with one L1 load that the 8
 *     lanes of the block share.  The min of each sub-block is taken once, by the
 *     lane of l0 = 0 (the other lane's min factor is 0: the same code for all).
 *   Q5_K (176-byte blocks: Q4_K's header, 32 bytes of fifth bits, 128 of nibbles):
 *     as Q4_K, the fifth bits of elements l0 .. l0 + 15 one more shared 16-byte load.
 *   Q6_K (210-byte blocks: 128 bytes of low nibbles ql, 64 of high bit pairs qh, 16
 *     int8 scales, d): chunk s = 4 h + 2 t + a is ql[16 s ..], whose low nibbles are
 *     elements 128 h + 32 t + 16 a + (0 .. 15) and high nibbles 64 further, their
 *     bit pairs in qh[128 + 32 h + 16 a ..] (bits 2 t and 2 t + 4).  Blocks of 210
 *     bytes start at even addresses only: ql and qh are read as five aligned words
 *     each (L1 loads, shared by the neighbouring lanes) joined by a funnel shift.
 *
 * Each warp owns two W rows as the other row kernels (rows_of), walks its chunks in
 * increasing order and stores through gv_store (fixed butterfly, part order): an
 * output element is computed by the same operations whatever the number of rows and
 * the other rows, so decode and verification give identical results.  A weight
 * whose blocks of warps would not fill the GPU twice has its chunks split into two
 * or four parts (gv_ksplit in cuda_gemv.cu, by the weight alone).
 */
#include <cuda_fp16.h>

#include "cuda_gemv.cuh"
#include "cuda_internal.h"
#include "cuda_weights.cuh"

/* Byte i (0 .. 11) of a K-quant block's 12 bytes of scales, which are words 1 .. 3
 * of its first 16 bytes. */
__device__ __forceinline__ int kq_scale_byte(const uint4 &h, int i) {
    const uint32_t w = i < 4 ? h.y : i < 8 ? h.z : h.w;
    return (int)((w >> (8 * (i & 3))) & 0xffu);
}

/* The 6-bit scale and min of sub-block j (0 .. 7) of a Q4_K / Q5_K block
 * (dtype_kquant.c's get_scale_min_k4). */
__device__ __forceinline__ void kq_scale_min(const uint4 &h, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = kq_scale_byte(h, j) & 63;
        *m = kq_scale_byte(h, j + 4) & 63;
    } else {
        *sc = (kq_scale_byte(h, j + 4) & 15) | ((kq_scale_byte(h, j - 4) >> 6) << 4);
        *m = (kq_scale_byte(h, j + 4) >> 4) | ((kq_scale_byte(h, j) >> 6) << 4);
    }
}

/* One W row's share of a chunk: the quants of its two groups of 16 (Q4_K / Q5_K:
 * elements l0 .. l0 + 15 of sub-blocks j0 and j0 + 1, unsigned; Q6_K: groups t and
 * t + 2, q - 32 signed), one byte an element, and their f32 factors. */
struct kq_chunk {
    uint32_t lo[4], hi[4];
    float dlo, dhi; /* d * sc of each group */
    float mlo, mhi; /* Q4_K / Q5_K: dmin * m of each sub-block, 0 on the lane of l0 = 16 */
};

template <bool FIVE>
__device__ __forceinline__ void kq45_load(const uint8_t *row, int32_t kb, int s, kq_chunk *k) {
    const uint8_t *b = row + (size_t)kb * (FIVE ? 176 : 144);
    const uint4 h = __ldg((const uint4 *)b);
    const uint4 q = tdm_cu_ld_stream(b + (FIVE ? 48 : 16) + 16 * s);
    const int j0 = 2 * (s >> 1);
    int sc0, m0, sc1, m1;
    kq_scale_min(h, j0, &sc0, &m0);
    kq_scale_min(h, j0 + 1, &sc1, &m1);
    const float d = tdm_cu_h2f((uint16_t)(h.x & 0xffffu)), dmin = tdm_cu_h2f((uint16_t)(h.x >> 16));
    k->dlo = __fmul_rn(d, (float)sc0);
    k->dhi = __fmul_rn(d, (float)sc1);
    const bool first = (s & 1) == 0;
    k->mlo = first ? __fmul_rn(dmin, (float)m0) : 0.0f;
    k->mhi = first ? __fmul_rn(dmin, (float)m1) : 0.0f;
    const uint32_t M = 0x0f0f0f0fu, qw[4] = {q.x, q.y, q.z, q.w};
    uint32_t hw[4] = {0, 0, 0, 0};
    if (FIVE) {
        const uint4 qh = __ldg((const uint4 *)(b + 16 + 16 * (s & 1)));
        hw[0] = qh.x, hw[1] = qh.y, hw[2] = qh.z, hw[3] = qh.w;
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        k->lo[i] = qw[i] & M;
        k->hi[i] = (qw[i] >> 4) & M;
        if (FIVE) {
            k->lo[i] |= ((hw[i] >> j0) & 0x01010101u) << 4;
            k->hi[i] |= ((hw[i] >> (j0 + 1)) & 0x01010101u) << 4;
        }
    }
}

/* 16 bytes at p (2-byte aligned) as four little-endian words: five aligned word
 * loads (through L1: the neighbouring lanes read the same words) joined by a
 * funnel shift of 0 or 16 bits.  The fifth word stays inside a Q6_K block for the
 * ql and qh chunks read here (scales and d follow them). */
__device__ __forceinline__ void kq_ld16_a2(const uint8_t *p, uint32_t w[4]) {
    const uintptr_t a = (uintptr_t)p;
    const uint32_t *q = (const uint32_t *)(a & ~(uintptr_t)3);
    const uint32_t sh = (uint32_t)(a & 3) * 8;
    uint32_t v[5];
#pragma unroll
    for (int k = 0; k < 5; k++) v[k] = __ldg(q + k);
#pragma unroll
    for (int k = 0; k < 4; k++) w[k] = __funnelshift_r(v[k], v[k + 1], sh);
}

__device__ __forceinline__ void kq6_load(const uint8_t *row, int32_t kb, int s, kq_chunk *k) {
    const uint8_t *b = row + (size_t)kb * 210;
    const int h = s >> 2, t = (s >> 1) & 1, a = s & 1;
    uint32_t ql[4], qh[4];
    kq_ld16_a2(b + 16 * s, ql);
    kq_ld16_a2(b + 128 + 32 * h + 16 * a, qh);
    const float d = tdm_cu_h2f(__ldg((const uint16_t *)(b + 208)));
    k->dlo = __fmul_rn(d, (float)(int8_t)__ldg(b + 192 + 8 * h + 2 * t + a));
    k->dhi = __fmul_rn(d, (float)(int8_t)__ldg(b + 192 + 8 * h + 2 * (t + 2) + a));
    k->mlo = k->mhi = 0.0f;
    const uint32_t M = 0x0f0f0f0fu, H = 0x03030303u, O = 0x20202020u;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        k->lo[i] = __vsub4((ql[i] & M) | (((qh[i] >> (2 * t)) & H) << 4), O);
        k->hi[i] = __vsub4(((ql[i] >> 4) & M) | (((qh[i] >> (2 * t + 4)) & H) << 4), O);
    }
}

template <uint32_t T> __device__ __forceinline__ void kq_load(const uint8_t *row, int32_t kb, int s, kq_chunk *k) {
    if (T == TDM_Q6_K) kq6_load(row, kb, s, k);
    else kq45_load<T == TDM_Q5_K>(row, kb, s, k);
}

/* The int8 dot product of a group's 16 quants with 16 of x. */
__device__ __forceinline__ int kq_dot16(const uint32_t q[4], const uint4 &x) {
    int v = dp4a(q[0], x.x, 0);
    v = dp4a(q[1], x.y, v);
    v = dp4a(q[2], x.z, v);
    return dp4a(q[3], x.w, v);
}

/* acc += one W row's chunk against x's groups (quantised blocks xb0 and xb0 + XS). */
template <bool MINS>
__device__ __forceinline__ float kq_acc(float acc, const kq_chunk &k, const uint4 &x0, const uint4 &x1, float dx0,
                                        float dx1, float qs0, float qs1) {
    acc = fmaf((float)kq_dot16(k.lo, x0), k.dlo * dx0, acc);
    acc = fmaf((float)kq_dot16(k.hi, x1), k.dhi * dx1, acc);
    if (MINS) {
        acc = fmaf(-qs0, k.mlo * dx0, acc);
        acc = fmaf(-qs1, k.mhi * dx1, acc);
    }
    return acc;
}

template <uint32_t T, int NR, int EPI>
__global__ void __launch_bounds__(GV_WARPS * 32)
k_gemv_kq8(const uint8_t *__restrict__ w, size_t row_bytes, int32_t n_out, int32_t cols, int32_t ff,
           tdm_cuda_xq xq, float *y, int32_t ldy, int32_t n_rows, int32_t ks) {
    TDM_PDL_ENTRY();
    constexpr bool MINS = T != TDM_Q6_K;
    constexpr int XS = T == TDM_Q6_K ? 2 : 1; /* x blocks between a chunk's two groups */
    const gv_rows r = rows_of<EPI>(n_out, ff, ks);
    if (!r.active && ks == 1) return; /* (with parts, every warp reaches the barrier) */
    const int32_t lane = (int32_t)(threadIdx.x & 31), nb = cols / TDM_QK, last = tile_last<NR>(n_rows);
    xq = tdm_gv_tile(xq, cols, nb);
    y += (size_t)blockIdx.x * GV_TILE * ldy;
    const uint8_t *rowa = w + (size_t)r.ra * row_bytes, *rowb = w + (size_t)r.rb * row_bytes;
    float sa[NR], sb[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) sa[i] = sb[i] = 0.0f;
    int32_t lo, hi;
    gv_part(nb, ks, &lo, &hi); /* (chunks of 32 elements) */
    if (!r.active) hi = lo;
#pragma unroll 2
    for (int32_t c = lo + lane; c < hi; c += 32) {
        const int32_t kb = c >> 3;
        const int s = c & 7;
        kq_chunk A, B;
        kq_load<T>(rowa, kb, s, &A);
        kq_load<T>(rowb, kb, s, &B);
        /* the x block of the chunk's first group, and its elements' offset in it */
        const int32_t xb0 = 8 * kb + (T == TDM_Q6_K ? 4 * (s >> 2) + ((s >> 1) & 1) : 2 * (s >> 1));
        const size_t xo = (size_t)TDM_QK * xb0 + 16 * (s & 1);
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const size_t ri = (size_t)min(i, last);
            const int8_t *xr = xq.q + ri * cols + xo;
            const uint4 x0 = __ldg((const uint4 *)xr), x1 = __ldg((const uint4 *)(xr + XS * TDM_QK));
            const float *dx = xq.d + ri * nb + xb0;
            const float dx0 = __ldg(dx), dx1 = __ldg(dx + XS);
            float qs0 = 0.0f, qs1 = 0.0f;
            if (MINS) {
                qs0 = (float)__ldg(xq.qs + ri * nb + xb0);
                qs1 = (float)__ldg(xq.qs + ri * nb + xb0 + 1);
            }
            sa[i] = kq_acc<MINS>(sa[i], A, x0, x1, dx0, dx1, qs0, qs1);
            sb[i] = kq_acc<MINS>(sb[i], B, x0, x1, dx0, dx1, qs0, qs1);
        }
    }
    gv_store<NR, EPI>(r, sa, sb, y, ldy, last, ks);
}

bool tdm_gemv_kq_takes(const tdm_weight *w) {
    return w->layout == TDM_LAYOUT_ROWS && (w->type == TDM_Q4_K || w->type == TDM_Q5_K || w->type == TDM_Q6_K) &&
           w->cols % 256 == 0 && (uintptr_t)w->data % 16 == 0;
}

template <int NR, int EPI>
static void kq_launch_nr(tdm_cuda *c, const tdm_weight *w, dim3 grid, int32_t n_out, int32_t ff,
                         const tdm_cuda_xq &xq, float *y, int32_t ldy, int32_t n_rows, int32_t ks) {
    const uint8_t *wd = (const uint8_t *)w->data;
    const int32_t cols = (int32_t)w->cols;
    const unsigned th = GV_WARPS * 32;
    if (w->type == TDM_Q4_K)
        tdm_launch(k_gemv_kq8<TDM_Q4_K, NR, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, xq, y, ldy, n_rows, ks);
    else if (w->type == TDM_Q5_K)
        tdm_launch(k_gemv_kq8<TDM_Q5_K, NR, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, xq, y, ldy, n_rows, ks);
    else
        tdm_launch(k_gemv_kq8<TDM_Q6_K, NR, EPI>, grid, th, 0, c->stream, wd, w->row_bytes, n_out, cols, ff, xq, y, ldy, n_rows, ks);
}

template <int EPI>
static void kq_launch_epi(tdm_cuda *c, const tdm_weight *w, dim3 grid, int nr, int32_t n_out, int32_t ff,
                          const tdm_cuda_xq &xq, float *y, int32_t ldy, int32_t n_rows, int32_t ks) {
    switch (nr) {
#define NR_CASE(N) \
    case N: kq_launch_nr<N, EPI>(c, w, grid, n_out, ff, xq, y, ldy, n_rows, ks); break;
        NR_CASE(1) NR_CASE(2) NR_CASE(3) NR_CASE(4) NR_CASE(5) NR_CASE(6) NR_CASE(7) NR_CASE(8)
#undef NR_CASE
    default: break;
    }
}

void tdm_gemv_kq_launch(tdm_cuda *c, const tdm_weight *w, dim3 grid, int nr, tdm_gemv_epi epi, int32_t n_out,
                        int32_t ff, const tdm_cuda_xq &xq, float *y, int32_t ldy, int32_t n_rows, int32_t ks) {
    if (epi == TDM_EPI_STORE) kq_launch_epi<TDM_EPI_STORE>(c, w, grid, nr, n_out, ff, xq, y, ldy, n_rows, ks);
    else if (epi == TDM_EPI_ACCUM) kq_launch_epi<TDM_EPI_ACCUM>(c, w, grid, nr, n_out, ff, xq, y, ldy, n_rows, ks);
    else kq_launch_epi<TDM_EPI_SWIGLU>(c, w, grid, nr, n_out, ff, xq, y, ldy, n_rows, ks);
}
