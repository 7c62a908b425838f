/* qdot.h - the integer-dot matmul of the quantised types Q4_1, Q5_0, Q5_1 and
 * Q2_K .. Q6_K on the CPU (private to kernels/cpu).
 *
 * The input rows are quantised to int8 per block (tdm_xq: 32 elements for the
 * 32-element types, 256 for the K-quants): scale dx = max|x| / 127, qx = round(x /
 * dx) (ties to even), and the sums of each 16 qx.  A weight block's dot product with
 * a quantised x block is then an exact integer computation (every partial sum fits
 * int32; maddubs' int16 pair sums never saturate: weight levels are < 64 and |qx| <=
 * 127), finished by a few f32 steps in a fixed order, per (x row, W row, block):
 *   K-quants with mins (Q2_K, Q4_K, Q5_K):
 *     isum = sum_e sc(e) q_e qx_e,  imin = sum_s m_s xs16_s (s: 16-element groups)
 *     acc  = acc + dx * ((d * isum) - (dmin * imin))
 *   Q3_K, Q6_K (levels offset by o = 4, 32):
 *     isum = sum_e sc(e) q_e qx_e - o sum_s sc_s xs16_s,  acc = acc + dx * (d * isum)
 *   Q4_1, Q5_1: isum = sum q qx, xsum = sum qx:  acc = acc + dx * ((d * isum) + (m * xsum))
 *   Q5_0:       isum = sum q qx - 16 xsum:       acc = acc + dx * (d * isum)
 * (integers converted to f32 by rounding, no fused multiply-adds), acc starting at 0
 * and taking the blocks in order; y = acc (or y + acc).  So every SIMD level gives
 * the same bits, whatever it groups; the error against f32 arithmetic is x's int8
 * rounding (about 0.4 % of a block's largest |x|), as in llama.cpp.  A block of x with
 * a non-finite value gets dx = NaN, so its outputs are NaN.
 *
 * Two ways to the same sums: the levels' kernels (qdot_driver.h) fill each W block's
 * integer form (tdm_kprep, tdm_qprep) on the stack, per call, and let up to 16 x rows
 * share it; for a few x rows (decode, short verification batches) the CPU's direct
 * kernel where it has one (qgemv_vnni.c: Q4_K, Q6_K, Q5_0) unpacks the file's blocks
 * in registers instead.  No integer form is kept beside the weights. */
#ifndef TDM_QDOT_H
#define TDM_QDOT_H

#include "dtype.h"
#include "dtype_quant.h"

struct tdm_weight;

/* The types this path computes. */
static inline bool tdm_qdot_type(uint32_t t) {
    return t == TDM_Q4_1 || t == TDM_Q5_0 || t == TDM_Q5_1 || tdm_dtype_is_kquant(t);
}
/* Elements per x block for a weight type (256 for K-quants, else 32). */
static inline int32_t tdm_xq_block(uint32_t t) { return tdm_dtype_is_kquant(t) ? TDM_QK_K : TDM_QK; }

/* n x rows of cols elements quantised for weights of one type. */
typedef struct tdm_xq {
    int32_t n, blk;      /* rows; elements per block (tdm_xq_block) */
    int64_t cols;
    const int8_t *q;     /* [n][cols] qx */
    const float *d;      /* [n][cols / blk] dx (NaN for a block with a non-finite value) */
    const int16_t *s16;  /* [n][cols / 16] sums of 16 consecutive qx */
} tdm_xq;

/* Bytes tdm_xq_quantize needs for n rows (64-byte aligned pieces). */
size_t tdm_xq_bytes(uint32_t type, int64_t cols, int32_t n);
/* Rows [i0, i1) of x[n][cols] into the buffer laid out for n rows (buf 64-byte
 * aligned, tdm_xq_bytes); *xq describes all n rows (call with i0 = 0 .. n in pieces
 * from several threads, then use it). */
void tdm_xq_quantize(uint32_t type, const float *x, int32_t n, int64_t cols, int32_t i0, int32_t i1, void *buf,
                     tdm_xq *xq);

/* A K-quant super-block of one W row in integer form, what the dot loops read.  The
 * SIMD levels fill it with vector code; the result is the same. */
typedef struct tdm_kprep {
    uint8_t q[TDM_QK_K];  /* [256] the levels as unsigned ints (natural element order) */
    int16_t scp[128];     /* [128] the sub-block scale of elements 2k and 2k + 1 (maddubs' pairs) */
    int16_t c[16];        /* [16] per 16 elements: the min level (Q2_K, Q4_K, Q5_K) or scale * offset
                             (Q3_K: 4, Q6_K: 32) */
    int16_t s8[8];        /* [8] Q4_K, Q5_K: the 8 sub-block scales (scp repeats them; a vector fill
                             may leave scp unset for these types and the dot loops read s8) */
    float d, dm;          /* super-block scale; min scale (0 for Q3_K, Q6_K) */
    float pad[2];
} __attribute__((aligned(64))) tdm_kprep;

/* True for the K-quants whose levels carry an offset (c is scale * offset). */
static inline bool tdm_kquant_offset(uint32_t t) { return t == TDM_Q3_K || t == TDM_Q6_K; }

/* The portable fill of one super-block (blk: its bytes). */
void tdm_kprep_ref(uint32_t type, const uint8_t *blk, tdm_kprep *p);

/* A 32-element block of one W row in integer form. */
typedef struct tdm_qprep {
    uint8_t q[TDM_QK];  /* [32] the levels (0..15 or 0..31) */
    float d, m;         /* scale; offset m (Q4_1, Q5_1), 0 for Q5_0 */
} tdm_qprep;
void tdm_qprep_ref(uint32_t type, const uint8_t *blk, tdm_qprep *p);

/* The f32 steps (the order the header gives). */
static inline float tdm_qdot_step_min(float acc, float dx, float d, int32_t isum, float dm, int32_t imin) {
    float a = d * (float)isum, b = dm * (float)imin;
    return acc + dx * (a - b);
}
static inline float tdm_qdot_step(float acc, float dx, float d, int32_t isum) {
    float a = d * (float)isum;
    return acc + dx * a;
}
static inline float tdm_qdot_step_off(float acc, float dx, float d, int32_t isum, float m, int32_t xsum) {
    float a = d * (float)isum, b = m * (float)xsum;
    return acc + dx * (a + b);
}

/* y[i][r] (=|+=) the dot of x row i and W row r for i < n, r in [r0, r1): the portable
 * kernel (every type of tdm_qdot_type). */
void tdm_qdot_ref(const struct tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y,
                  int64_t ldy, bool acc);
#if defined(__x86_64__)
void tdm_qdot_avx2(const struct tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y,
                   int64_t ldy, bool acc);
void tdm_qdot_avx512(const struct tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y,
                     int64_t ldy, bool acc);
#endif

#endif
