/* cuda_weights.cuh - element k of a weight row of each type, as f32, on the device:
 * the values tdm_row_to_f32 gives on the host (f16 and bf16 exactly; q8_0 and q4_0
 * as d * q with d the block's f16 scale, in f32). */
#ifndef TDM_CUDA_WEIGHTS_CUH
#define TDM_CUDA_WEIGHTS_CUH

#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "dtype.h"
}

/* The weight types the CUDA kernels read, for switch statements over templates. */
#define TDM_CU_FOR_EACH_WTYPE(X) X(TDM_F32) X(TDM_F16) X(TDM_BF16) X(TDM_Q8_0) X(TDM_Q4_0) TDM_CU_FOR_EACH_KTYPE(X)
/* The types read 16 elements at a time (tdm_cu_deq16): Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K. */
#define TDM_CU_FOR_EACH_KTYPE(X) \
    X(TDM_Q4_1) X(TDM_Q5_0) X(TDM_Q5_1) X(TDM_Q2_K) X(TDM_Q3_K) X(TDM_Q4_K) X(TDM_Q5_K) X(TDM_Q6_K)

__device__ __forceinline__ float tdm_cu_h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* 16 bytes of a weight, not kept in L1 (each weight byte is read once per product). */
__device__ __forceinline__ uint4 tdm_cu_ld_stream(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* The f16 scale of the quantisation block at p (2 bytes, any alignment). */
__device__ __forceinline__ float tdm_cu_scale(const uint8_t *p) {
    return tdm_cu_h2f((uint16_t)(p[0] | (p[1] << 8)));
}

template <uint32_t T> __device__ __forceinline__ float tdm_cu_wload(const uint8_t *row, int32_t k);

template <> __device__ __forceinline__ float tdm_cu_wload<TDM_F32>(const uint8_t *row, int32_t k) {
    return ((const float *)row)[k];
}
template <> __device__ __forceinline__ float tdm_cu_wload<TDM_F16>(const uint8_t *row, int32_t k) {
    return tdm_cu_h2f(((const uint16_t *)row)[k]);
}
template <> __device__ __forceinline__ float tdm_cu_wload<TDM_BF16>(const uint8_t *row, int32_t k) {
    return __uint_as_float((uint32_t)((const uint16_t *)row)[k] << 16);
}
template <> __device__ __forceinline__ float tdm_cu_wload<TDM_Q8_0>(const uint8_t *row, int32_t k) {
    const uint8_t *blk = row + (size_t)(k / TDM_QK) * sizeof(tdm_block_q8_0);
    return tdm_cu_scale(blk) * (float)(int8_t)blk[2 + k % TDM_QK];
}
template <> __device__ __forceinline__ float tdm_cu_wload<TDM_Q4_0>(const uint8_t *row, int32_t k) {
    const uint8_t *blk = row + (size_t)(k / TDM_QK) * sizeof(tdm_block_q4_0);
    const int32_t j = k % TDM_QK;
    const uint8_t q = blk[2 + (j & 15)];
    return tdm_cu_scale(blk) * (float)((j < 16 ? (q & 15) : (q >> 4)) - 8);
}

/* ---- Q4_1, Q5_0, Q5_1 and the K-quants (dtype.h, src/base/dtype_kquant.c) ---------- */

/* 16 bytes at p as 4 little-endian words, with the widest loads p's alignment allows
 * (a 16-byte load for Q4_K / Q5_K rows, whose blocks are multiples of 16 bytes;
 * 2-byte loads for Q6_K's 210-byte blocks). */
__device__ __forceinline__ void tdm_cu_ld16(const uint8_t *p, uint32_t w[4]) {
    const uintptr_t a = (uintptr_t)p;
    if ((a & 15) == 0) {
        const uint4 u = __ldg((const uint4 *)p);
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else if ((a & 3) == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++) w[k] = __ldg((const uint32_t *)p + k);
    } else if ((a & 1) == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++)
            w[k] = (uint32_t)__ldg((const uint16_t *)p + 2 * k) | (uint32_t)__ldg((const uint16_t *)p + 2 * k + 1) << 16;
    } else {
#pragma unroll
        for (int k = 0; k < 4; k++)
            w[k] = (uint32_t)__ldg(p + 4 * k) | (uint32_t)__ldg(p + 4 * k + 1) << 8 | (uint32_t)__ldg(p + 4 * k + 2) << 16 |
                   (uint32_t)__ldg(p + 4 * k + 3) << 24;
    }
}
/* Byte l (< 16) of tdm_cu_ld16's words. */
__device__ __forceinline__ int tdm_cu_byte(const uint32_t w[4], int l) { return (int)((w[l >> 2] >> (8 * (l & 3))) & 0xffu); }

/* y[j] = the elements 16 c + j (j < 16) of a row, exactly as tdm_row_to_f32 computes
 * them: the same f32 operations in the same order, none fused (__fmul_rn etc.). */
template <uint32_t T> __device__ __forceinline__ void tdm_cu_deq16(const uint8_t *row, int32_t c, float y[16]);

/* A 32-element block's 16 elements of half h: q = nibble (| fifth bit), then
 * Q4_1 / Q5_1: q * d + m, Q5_0: (q - 16) * d. */
template <uint32_t T> __device__ __forceinline__ void tdm_cu_deq16_q32(const uint8_t *row, int32_t c, float y[16]) {
    const bool has_m = T != TDM_Q5_0, five = T != TDM_Q4_1;
    const uint8_t *b = row + (size_t)(c >> 1) * (T == TDM_Q4_1 ? 20 : T == TDM_Q5_0 ? 22 : 24);
    const int h = c & 1;
    const uint8_t *qh = b + (has_m ? 4 : 2), *qs = five ? qh + 4 : b + 4;
    const float d = tdm_cu_scale(b), m = has_m ? tdm_cu_scale(b + 2) : 0.0f;
    const uint32_t hb = five ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24 : 0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = h ? qs[j] >> 4 : qs[j] & 15;
        if (five) q |= (int)((hb >> (16 * h + j)) & 1) << 4;
        y[j] = T == TDM_Q5_0 ? __fmul_rn((float)(q - 16), d) : __fadd_rn(__fmul_rn((float)q, d), m);
    }
}
template <> __device__ __forceinline__ void tdm_cu_deq16<TDM_Q4_1>(const uint8_t *r, int32_t c, float y[16]) {
    tdm_cu_deq16_q32<TDM_Q4_1>(r, c, y);
}
template <> __device__ __forceinline__ void tdm_cu_deq16<TDM_Q5_0>(const uint8_t *r, int32_t c, float y[16]) {
    tdm_cu_deq16_q32<TDM_Q5_0>(r, c, y);
}
template <> __device__ __forceinline__ void tdm_cu_deq16<TDM_Q5_1>(const uint8_t *r, int32_t c, float y[16]) {
    tdm_cu_deq16_q32<TDM_Q5_1>(r, c, y);
}

/* Q4_K / Q5_K: group s = c % 16 of the super-block lies in sub-block j = s / 2,
 * bytes 32 (s / 4) + 16 (s % 2) .. of qs, low nibbles for even j. */
template <bool FIVE> __device__ __forceinline__ void tdm_cu_deq16_k45(const uint8_t *row, int32_t c, float y[16]) {
    const uint8_t *b = row + (size_t)(c >> 4) * (FIVE ? 176 : 144), *sc = b + 4;
    const int s = c & 15, j = s >> 1, l0 = 16 * (s & 1);
    int scv, mv;
    if (j < 4) scv = sc[j] & 63, mv = sc[j + 4] & 63;
    else scv = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4), mv = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    const float d1 = __fmul_rn(tdm_cu_scale(b), (float)scv), m1 = __fmul_rn(tdm_cu_scale(b + 2), (float)mv);
    uint32_t qw[4], hw[4] = {0, 0, 0, 0};
    tdm_cu_ld16(b + (FIVE ? 48 : 16) + 32 * (s >> 2) + l0, qw);
    if (FIVE) tdm_cu_ld16(b + 16 + l0, hw);
#pragma unroll
    for (int l = 0; l < 16; l++) {
        const int byte = tdm_cu_byte(qw, l);
        int q = (j & 1) ? byte >> 4 : byte & 15;
        if (FIVE) q |= ((tdm_cu_byte(hw, l) >> j) & 1) << 4;
        y[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}
template <> __device__ __forceinline__ void tdm_cu_deq16<TDM_Q4_K>(const uint8_t *r, int32_t c, float y[16]) {
    tdm_cu_deq16_k45<false>(r, c, y);
}
template <> __device__ __forceinline__ void tdm_cu_deq16<TDM_Q5_K>(const uint8_t *r, int32_t c, float y[16]) {
    tdm_cu_deq16_k45<true>(r, c, y);
}

/* Q6_K: group s, half h = s / 8, quarter t = (s % 8) / 2. */
template <> __device__ __forceinline__ void tdm_cu_deq16<TDM_Q6_K>(const uint8_t *row, int32_t c, float y[16]) {
    const uint8_t *b = row + (size_t)(c >> 4) * 210;
    const int s = c & 15, h = s >> 3, t = (s & 7) >> 1, l0 = 16 * (s & 1);
    const float dl = __fmul_rn(tdm_cu_scale(b + 208), (float)(int8_t)b[192 + s]);
    uint32_t lw[4], hw[4];
    tdm_cu_ld16(b + 64 * h + 32 * (t & 1) + l0, lw);
    tdm_cu_ld16(b + 128 + 32 * h + l0, hw);
#pragma unroll
    for (int l = 0; l < 16; l++) {
        const int lo = tdm_cu_byte(lw, l), hi = tdm_cu_byte(hw, l);
        const int q = (t < 2 ? lo & 15 : lo >> 4) | (((hi >> (2 * t)) & 3) << 4);
        y[l] = __fmul_rn(dl, (float)(q - 32));
    }
}

/* Q2_K / Q3_K: the 2-bit fields of qs (Q3_K: plus hmask's bit 4 h + t, value q - 4). */
template <> __device__ __forceinline__ void tdm_cu_deq16<TDM_Q2_K>(const uint8_t *row, int32_t c, float y[16]) {
    const uint8_t *b = row + (size_t)(c >> 4) * 84;
    const int s = c & 15, h = s >> 3, t = (s & 7) >> 1, l0 = 16 * (s & 1);
    const float dl = __fmul_rn(tdm_cu_scale(b + 80), (float)(b[s] & 15));
    const float ml = __fmul_rn(tdm_cu_scale(b + 82), (float)(b[s] >> 4));
    uint32_t qw[4];
    tdm_cu_ld16(b + 16 + 32 * h + l0, qw);
#pragma unroll
    for (int l = 0; l < 16; l++) y[l] = __fsub_rn(__fmul_rn(dl, (float)((tdm_cu_byte(qw, l) >> (2 * t)) & 3)), ml);
}
template <> __device__ __forceinline__ void tdm_cu_deq16<TDM_Q3_K>(const uint8_t *row, int32_t c, float y[16]) {
    const uint8_t *b = row + (size_t)(c >> 4) * 110, *sc = b + 96;
    const int s = c & 15, h = s >> 3, t = (s & 7) >> 1, l0 = 16 * (s & 1);
    const int lo = s < 8 ? sc[s] & 15 : sc[s - 8] >> 4, hi = (sc[8 + (s & 3)] >> (2 * (s >> 2))) & 3;
    const float dl = __fmul_rn(tdm_cu_scale(b + 108), (float)((lo | (hi << 4)) - 32));
    uint32_t qw[4], hw[4];
    tdm_cu_ld16(b + 32 + 32 * h + l0, qw);
    tdm_cu_ld16(b + l0, hw);
#pragma unroll
    for (int l = 0; l < 16; l++) {
        const int q = ((tdm_cu_byte(qw, l) >> (2 * t)) & 3) | (((tdm_cu_byte(hw, l) >> (4 * h + t)) & 1) << 2);
        y[l] = __fmul_rn(dl, (float)(q - 4));
    }
}

/* Element k of these types (one 16-element group decoded: for get_rows). */
#define TDM_CU_WLOAD16(T)                                                                              \
    template <> __device__ __forceinline__ float tdm_cu_wload<T>(const uint8_t *row, int32_t k) {     \
        float y[16];                                                                                   \
        tdm_cu_deq16<T>(row, k >> 4, y);                                                               \
        float v = y[0];                                                                                \
        _Pragma("unroll") for (int j = 1; j < 16; j++) v = (k & 15) == j ? y[j] : v;                   \
        return v;                                                                                      \
    }
TDM_CU_FOR_EACH_KTYPE(TDM_CU_WLOAD16)
#undef TDM_CU_WLOAD16

/* Two weight rows' 16 dequantised elements fa, fb against 16 activations at xp (four
 * float4, read through the read-only cache): u += fa . x, v += fb . x, in element
 * order (the row kernels' and the experts' products of the 16-element types). */
__device__ __forceinline__ void tdm_cu_dot16x2(const float fa[16], const float fb[16], const float4 *xp, float &u,
                                               float &v) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const float4 p = __ldg(xp + q);
        const float xv[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            u = fmaf(fa[4 * q + e], xv[e], u);
            v = fmaf(fb[4 * q + e], xv[e], v);
        }
    }
}

/* Element k of a QSPLIT row of cols columns (Q8_0: [cols] int8 then [cols / 32] f16
 * scales; Q4_0: [cols / 2] bytes of nibbles in block order, then the scales). */
template <uint32_t T> __device__ __forceinline__ float tdm_cu_wload_qsplit(const uint8_t *row, int32_t cols, int32_t k) {
    const int32_t b = k / TDM_QK, j = k % TDM_QK;
    if (T == TDM_Q8_0) return tdm_cu_scale(row + cols + 2 * b) * (float)(int8_t)row[k];
    const uint8_t q = row[16 * b + (j & 15)];
    return tdm_cu_scale(row + cols / 2 + 2 * b) * (float)((j < 16 ? (q & 15) : (q >> 4)) - 8);
}

#endif
