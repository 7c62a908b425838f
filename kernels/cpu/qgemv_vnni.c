/* qgemv_vnni.c - the integer-dot matmul (qdot.h) of a few x rows (decode and short
 * verification batches) with AVX-512 VNNI, reading the weight blocks as the file
 * stores them.
 *
 * The prep path (qdot_driver.h) writes each super-block's integer form (tdm_kprep,
 * ~600 bytes) to the stack and reads it back: worth it when 16 x rows share it, but
 * for one x row it is the bulk of the work, and the W stream (memory bound) stalls
 * behind it.  Here each 64-byte vector of levels is unpacked in registers and
 * multiplied at once: vpdpbusd (u8 levels x s8 qx, 4 products summed per int32 lane:
 * |sum| < 2^15, as levels < 64 and |qx| <= 127), two such vectors packed into int16,
 * then one vpdpwssd with their sub-block scales (int16).  Each W row's scales, mins
 * and d of 4 rows' Q4_K blocks are unpacked together (q4k_heads).  The sums are the
 * exact integers of qdot.h and the f32 steps are its steps in its order, so the bits
 * are those of tdm_qdot_ref and of every other level.
 *
 * Q5_0 (the draft's matrices): two 32-element blocks per vector, vpdpbusd, each
 * block's f32 step in order.  Groups of 4 W rows; for each (super-)block, the x rows
 * in groups of up to 4, each W vector serving every x row of the group. */
#include <immintrin.h>

#include "cpu_internal.h"
#include "qdot_prep.h"

#define QG_MR 4       /* x rows per register group */
#define QG_PF_ROWS 8  /* software prefetch distance in W rows */

static inline __m256i half_sum(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* Two 32-byte pieces of qx (at p and p + 64) as one vector: Q4_K's low nibbles of
 * qs[0..63] are elements 0..31 and 64..95 of a 128-element half. */
static inline __m512i x_pair(const int8_t *p) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(const void *)p)),
                              _mm256_loadu_si256((const __m256i *)(const void *)(p + 64)), 1);
}

/* Q4_K (d dmin scales[12] qs[128]) heads of 4 W rows at once: the 16 bytes d, dmin,
 * scales[12] of row j in 128-bit lane j of *h on return; *s gets, in lane j, the 8
 * scales (bytes 0-7) and the 8 mins (bytes 8-15) of row j (tdm_k4_scales: by 32-bit
 * words a0, a1, a2 of the 12 bytes, sc = [a0 & 0x3f3f3f3f, (a2 & 0x0f0f0f0f) | ((a0 >>
 * 6) & 0x03030303) << 4], mn = [a1 & 0x3f3f3f3f, ((a2 >> 4) & 0x0f0f0f0f) | ((a1 >> 6) &
 * 0x03030303) << 4]; ((a >> 6) & 3) << 4 of each byte is (a >> 2) & 0x30 of it), and
 * d4, dm4 the 4 rows' d and dmin (f16 to f32: exact). */
static inline void q4k_heads(const uint8_t *const blk[4], __m512i *s, __m128 *d4, __m128 *dm4) {
    __m512i h = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)blk[0]));
    h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)(const void *)blk[1]), 1);
    h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)(const void *)blk[2]), 2);
    h = _mm512_inserti32x4(h, _mm_loadu_si128((const __m128i *)(const void *)blk[3]), 3);
    /* words 1, 2, 3 of a lane are a0, a1, a2 */
    const __m512i p = _mm512_shuffle_epi32(h, (_MM_PERM_ENUM)_MM_SHUFFLE(3, 2, 3, 1)); /* [a0, a2, a1, a2] */
    const __m512i q = _mm512_shuffle_epi32(h, (_MM_PERM_ENUM)_MM_SHUFFLE(2, 2, 1, 1)); /* [a0, a0, a1, a1] */
    const __m512i r = _mm512_and_si512(_mm512_srlv_epi32(p, _mm512_set4_epi32(4, 0, 0, 0)),
                                       _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
    *s = _mm512_ternarylogic_epi32(r, _mm512_srli_epi32(q, 2), _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0),
                                   0xf8); /* r | (q >> 2 & mask) */
    /* word 0 of each lane: d | dmin << 16 */
    const __m128i dd = _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set4_epi32(12, 8, 4, 0), h));
    const __m256 f = _mm256_cvtph_ps(_mm_shuffle_epi8(dd, _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15)));
    *d4 = _mm256_castps256_ps128(f);
    *dm4 = _mm256_extractf128_ps(f, 1);
}

/* The 4 W rows' min sums against one x row: lane j of sm holds row j's 8 mins as
 * int16 (q4k_heads' s, bytes 8-15 widened), s16 the x row's 16 sums of 16; imin =
 * sum_s m_{s/2} xs16_s = sum_k m_k (xs16_{2k} + xs16_{2k+1}), the same integer. */
static inline __m128i q4k_mins(__m512i sm, __m256i s16) {
    const __m256i h = _mm256_hadd_epi16(s16, s16); /* per 128 bits: its 4 pair sums, twice (|sum| <= 32 * 127) */
    const __m512i x32 = _mm512_broadcast_i32x4(_mm256_castsi256_si128(_mm256_permute4x64_epi64(h, 0x88)));
    __m512i p = _mm512_madd_epi16(sm, x32);
    p = _mm512_add_epi32(p, _mm512_shuffle_epi32(p, (_MM_PERM_ENUM)0xb1));
    p = _mm512_add_epi32(p, _mm512_shuffle_epi32(p, (_MM_PERM_ENUM)0x4e));
    return _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set4_epi32(12, 8, 4, 0), p));
}

/* The level sums: vpdpbusd of a vector of levels (u8) and its qx (s8) gives 16 int32
 * lanes, each the sum of 4 products within one sub-block (|sum| <= 4 * 63 * 127 <
 * 2^15), so two such vectors pack into int16 exactly (vpackssdw, per 128 bits: 4
 * lanes of the first, then 4 of the second) and one vpdpwssd applies their sub-block
 * scales: 6 multiplies per 256 levels and x row where maddubs + vpdpwssd take 8.
 * qg_pick[type][h] gives each int16 lane of pack h (levels vectors 2 h, 2 h + 1) its
 * sub-block's scale. */
/* Q4_K: vector k holds sub-blocks lo = (k / 2) * 4 + k % 2 (low 256 bits) and lo + 2
 * (high): pack 0 has sub-blocks 0, 1 in 128-bit lanes 0 and 1 and 2, 3 in lanes 2 and
 * 3; pack 1 has 4, 5 and 6, 7.  The index bytes pick from the 8 scale bytes (in every
 * 128 bits), then 0x80: a zero high byte. */
#define QG_H4(a) a, 0x80, a, 0x80, a, 0x80, a, 0x80
#define QG_Q4LANE(a, b) QG_H4(a), QG_H4(b)
static const _Alignas(64) uint8_t q4k_pick[2][64] = {
    {QG_Q4LANE(0, 1), QG_Q4LANE(0, 1), QG_Q4LANE(2, 3), QG_Q4LANE(2, 3)},
    {QG_Q4LANE(4, 5), QG_Q4LANE(4, 5), QG_Q4LANE(6, 7), QG_Q4LANE(6, 7)}};
/* Q6_K: vector k holds elements 64 k .. 64 k + 63, 128-bit lane l sub-block 4 k + l:
 * pack 0 lane l has sub-blocks l and 4 + l, pack 1 8 + l and 12 + l (indexes of the
 * 16 scales as int16). */
#define QG_W4(a) a, a, a, a
#define QG_Q6LANE(a, b) QG_W4(a), QG_W4(b)
static const _Alignas(64) uint16_t q6k_pick[2][32] = {
    {QG_Q6LANE(0, 4), QG_Q6LANE(1, 5), QG_Q6LANE(2, 6), QG_Q6LANE(3, 7)},
    {QG_Q6LANE(8, 12), QG_Q6LANE(9, 13), QG_Q6LANE(10, 14), QG_Q6LANE(11, 15)}};

/* The per-x-row data of one super-block: its 4 (Q4_K: rearranged) 64-element qx
 * vectors, dx and the 16 sums of 16. */
typedef struct qg_x {
    __m512i v[4];
    __m256i s16;
    float dx;
} qg_x;

/* One super-block b of the 4 W rows p[] against x rows xs[0 .. MR): the exact level
 * sums is[i] (minus the offset correction for Q6_K) and, for Q4_K, the min sums
 * im[i] (4 W rows per __m128i). */
static inline __attribute__((always_inline)) void
kblock(const int MR, const uint32_t type, const uint8_t *const blk[4], __m512i s4, const qg_x *xs, __m128i is[QG_MR]) {
    __m512i a[QG_MR][4];
    __m256i m[QG_MR][4];
    for (int j = 0; j < 4; j++) {
        const uint8_t *b = blk[j];
        __m512i q[4], s[2];
        if (type == TDM_Q4_K) {
            const __m512i low = _mm512_set1_epi8(15);
            const __m512i v0 = _mm512_loadu_si512((const void *)(b + 16)), v1 = _mm512_loadu_si512((const void *)(b + 80));
            q[0] = _mm512_and_si512(v0, low), q[1] = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low);
            q[2] = _mm512_and_si512(v1, low), q[3] = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low);
            /* row j's scales (lane j of s4) in every 128 bits, picked for the two packs */
            const __m512i sv = _mm512_permutexvar_epi64(_mm512_set1_epi64(2 * j), s4);
            for (int h = 0; h < 2; h++) s[h] = _mm512_shuffle_epi8(sv, _mm512_load_si512((const void *)q4k_pick[h]));
        } else { /* Q6_K: ql[128] qh[64] scales[16] d */
            const __m512i low = _mm512_set1_epi8(15), hmask = _mm512_set1_epi8(0x30);
            for (int h = 0; h < 2; h++) {
                const __m512i l = _mm512_loadu_si512((const void *)(b + 64 * h));
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)(b + 128 + 32 * h));
                /* high 2 bits of elements 128 h + 32 t + l at bits 2 t of qh[32 h + l]:
                 * [qh, qh >> 2] pairs t = 0, 1 (bits 0-1) and t = 2, 3 (bits 4-5) */
                const __m512i hx = _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
                q[2 * h] = _mm512_or_si512(_mm512_and_si512(l, low), _mm512_and_si512(_mm512_slli_epi16(hx, 4), hmask));
                q[2 * h + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), low), _mm512_and_si512(hx, hmask));
            }
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b + 192)));
            const __m512i sc = _mm512_castsi256_si512(sc16);
            for (int h = 0; h < 2; h++) s[h] = _mm512_permutexvar_epi16(_mm512_load_si512((const void *)q6k_pick[h]), sc);
            const __m256i c16 = _mm256_slli_epi16(sc16, 5); /* scale * 32 per 16 */
            for (int i = 0; i < MR; i++) m[i][j] = _mm256_madd_epi16(c16, xs[i].s16);
        }
        for (int i = 0; i < MR; i++) {
            const __m512i z = _mm512_setzero_si512();
            const __m512i p0 = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, q[0], xs[i].v[0]), _mm512_dpbusd_epi32(z, q[1], xs[i].v[1]));
            const __m512i p1 = _mm512_packs_epi32(_mm512_dpbusd_epi32(z, q[2], xs[i].v[2]), _mm512_dpbusd_epi32(z, q[3], xs[i].v[3]));
            a[i][j] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(z, p0, s[0]), p1, s[1]);
        }
    }
    for (int i = 0; i < MR; i++) {
        __m256i h[4];
        for (int j = 0; j < 4; j++) h[j] = half_sum(a[i][j]);
        if (type == TDM_Q6_K)
            for (int j = 0; j < 4; j++) h[j] = _mm256_sub_epi32(h[j], m[i][j]);
        is[i] = reduce4(h[0], h[1], h[2], h[3]);
    }
}

/* Q6_K: the 4 W rows' d (f16 at byte 208 of a block) as f32 (exact). */
static inline __m128 q6k_d4(const uint8_t *const blk[4]) {
    uint16_t h[4];
    for (int j = 0; j < 4; j++) memcpy(&h[j], blk[j] + 208, 2);
    return _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(const void *)h));
}

/* Starts the group of 4 W rows from r: p[] (the last row repeated past r1), the n
 * accumulators zeroed, *pf whether the rows QG_PF_ROWS ahead are in range; returns
 * how many rows are real. */
static inline int64_t qg_group(const tdm_weight *w, int64_t r, int64_t r1, int32_t n, const uint8_t *p[4],
                               __m128 *facc, bool *pf) {
    for (int j = 0; j < 4; j++) p[j] = (const uint8_t *)w->data + (size_t)TDM_MIN(r + j, r1 - 1) * w->row_bytes;
    for (int32_t i = 0; i < n; i++) facc[i] = _mm_setzero_ps();
    *pf = r + QG_PF_ROWS + 4 <= r1;
    return TDM_MIN(4, r1 - r);
}

/* y[i][0 .. nv) (=|+=) the lanes of facc[i] for x rows i < n (y rows ldy apart). */
static inline void qg_store(float *y, int64_t ldy, const __m128 *facc, int32_t n, int64_t nv, bool acc) {
    for (int32_t i = 0; i < n; i++) {
        float t[4], *o = y + (size_t)i * ldy;
        _mm_storeu_ps(t, facc[i]);
        for (int64_t j = 0; j < nv; j++) o[j] = acc ? o[j] + t[j] : t[j];
    }
}

static inline __attribute__((always_inline)) void
krows(const uint32_t type, const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y,
      int64_t ldy, bool acc) {
    const int64_t cols = w->cols, nb = cols / TDM_QK_K;
    const size_t bb = tdm_dtype_block_bytes(type), rb = w->row_bytes;
    __m128 facc[TDM_MM_DIRECT_MAX];
    qg_x xs[QG_MR];
    for (int64_t r = r0; r < r1; r += 4) {
        const uint8_t *p[4];
        bool pf;
        const int64_t nv = qg_group(w, r, r1, n, p, facc, &pf);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk[4];
            for (int j = 0; j < 4; j++) {
                blk[j] = p[j] + (size_t)b * bb;
                if (pf)
                    for (size_t o = 0; o < bb; o += 64)
                        _mm_prefetch((const char *)(blk[j] + (size_t)QG_PF_ROWS * rb + o), _MM_HINT_T0);
            }
            __m128 d4, dm4 = _mm_setzero_ps();
            __m512i s4 = _mm512_setzero_si512(), sm = s4;
            if (type == TDM_Q4_K) {
                q4k_heads(blk, &s4, &d4, &dm4);
                sm = _mm512_shuffle_epi8(s4, _mm512_set4_epi32((int)0x800f800e, (int)0x800d800c, (int)0x800b800a,
                                                               (int)0x80098008)); /* the mins as int16 */
            } else {
                d4 = q6k_d4(blk);
            }
            for (int32_t i0 = 0; i0 < n; i0 += QG_MR) {
                const int mr = (int)TDM_MIN(QG_MR, n - i0);
                for (int i = 0; i < mr; i++) {
                    const int8_t *qx = xq->q + (size_t)(i0 + i) * cols + b * TDM_QK_K;
                    if (type == TDM_Q4_K) {
                        xs[i].v[0] = x_pair(qx), xs[i].v[1] = x_pair(qx + 32);
                        xs[i].v[2] = x_pair(qx + 128), xs[i].v[3] = x_pair(qx + 160);
                    } else {
                        for (int k = 0; k < 4; k++) xs[i].v[k] = _mm512_loadu_si512((const void *)(qx + 64 * k));
                    }
                    xs[i].s16 = _mm256_loadu_si256((const __m256i *)(const void *)(xq->s16 + (size_t)(i0 + i) * (cols / 16) + b * 16));
                    xs[i].dx = xq->d[(size_t)(i0 + i) * nb + b];
                }
                __m128i is[QG_MR];
                switch (mr) {
                case 1: kblock(1, type, blk, s4, xs, is); break;
                case 2: kblock(2, type, blk, s4, xs, is); break;
                case 3: kblock(3, type, blk, s4, xs, is); break;
                default: kblock(4, type, blk, s4, xs, is); break;
                }
                for (int i = 0; i < mr; i++) { /* the f32 steps of qdot.h, 4 W rows at once */
                    const __m128 vdx = _mm_set1_ps(xs[i].dx), t = _mm_mul_ps(d4, _mm_cvtepi32_ps(is[i]));
                    if (type == TDM_Q4_K) {
                        const __m128 u = _mm_mul_ps(dm4, _mm_cvtepi32_ps(q4k_mins(sm, xs[i].s16)));
                        facc[i0 + i] = _mm_add_ps(facc[i0 + i], _mm_mul_ps(vdx, _mm_sub_ps(t, u)));
                    } else {
                        facc[i0 + i] = _mm_add_ps(facc[i0 + i], _mm_mul_ps(vdx, t));
                    }
                }
            }
        }
        qg_store(y + r, ldy, facc, n, nv, acc);
    }
}

/* ---- Q5_0 (d qh[4] qs[16]: 32 elements), two blocks per vector ------------------ */

/* The levels (0..31) of the Q5_0 blocks at b0 and b1 as 64 bytes (element order):
 * the 16 qs bytes of each in two 128-bit lanes, the second lane shifted by 4, and
 * 0x10 where the bit of qh is set (a byte mask). */
static inline __m512i q50_pair(const uint8_t *b0, const uint8_t *b1) {
    uint32_t h0, h1;
    memcpy(&h0, b0 + 2, 4), memcpy(&h1, b1 + 2, 4);
    const __m128i qa = _mm_loadu_si128((const __m128i *)(const void *)(b0 + 6));
    const __m128i qb = _mm_loadu_si128((const __m128i *)(const void *)(b1 + 6));
    __m512i v = _mm512_mask_broadcast_i32x4(_mm512_broadcast_i32x4(qa), 0xff00, qb); /* [qa qa qb qb] */
    v = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xff00ff00u, v, 4), _mm512_set1_epi8(15));
    return _mm512_or_si512(v, _mm512_maskz_mov_epi8((__mmask64)((uint64_t)h1 << 32 | h0), _mm512_set1_epi8(0x10)));
}

/* Blocks b and b + 1 (the same block twice when b is the last, its second half
 * unused) of the 4 W rows p[] against x rows [i0, i0 + MR); accumulates into facc. */
static inline __attribute__((always_inline)) void
q50_pair_rows(const int MR, const uint8_t *const p[4], int64_t b, bool two, const tdm_xq *xq, int32_t i0, __m128 *facc) {
    const int64_t cols = xq->cols, nb = cols / TDM_QK;
    const int64_t b1 = two ? b + 1 : b;
    __m512i a[QG_MR][4], xv[QG_MR];
    for (int i = 0; i < MR; i++)
        xv[i] = _mm512_maskz_loadu_epi8(two ? ~(__mmask64)0 : 0xffffffffu, xq->q + (size_t)(i0 + i) * cols + b * TDM_QK);
    uint16_t hs[8]; /* d of the 4 rows' block b, then of block b1 (f16); (an array, not
                       _mm_insert_epi16, whose lane must be a constant even where the loop
                       is not unrolled: -O0, sanitizers) */
    for (int j = 0; j < 4; j++) {
        const uint8_t *k0 = p[j] + (size_t)b * 22, *k1 = p[j] + (size_t)b1 * 22;
        memcpy(&hs[j], k0, 2), memcpy(&hs[4 + j], k1, 2);
        const __m512i q = q50_pair(k0, k1);
        for (int i = 0; i < MR; i++) a[i][j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xv[i]);
    }
    const __m128i dh = _mm_loadu_si128((const __m128i *)hs);
    const __m256 d8 = _mm256_cvtph_ps(dh); /* (exact) */
    const __m128 d40 = _mm256_castps256_ps128(d8), d41 = _mm256_extractf128_ps(d8, 1);
    for (int i = 0; i < MR; i++) {
        const int16_t *xs = xq->s16 + (size_t)(i0 + i) * (cols / 16) + 2 * b;
        const float *dx = xq->d + (size_t)(i0 + i) * nb + b;
        /* the 4 rows' sums of each 128-bit lane ([row 0 .. row 3] in every lane), then
         * lanes 0 + 1 (block b) and 2 + 3 (block b1) */
        const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[i][0], a[i][1]), _mm512_unpackhi_epi32(a[i][0], a[i][1]));
        const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[i][2], a[i][3]), _mm512_unpackhi_epi32(a[i][2], a[i][3]));
        __m512i u = _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
        u = _mm512_add_epi32(u, _mm512_shuffle_i32x4(u, u, _MM_SHUFFLE(2, 3, 0, 1)));
        __m128i s0 = _mm512_castsi512_si128(u);
        s0 = _mm_sub_epi32(s0, _mm_set1_epi32(16 * (xs[0] + xs[1])));
        facc[i] = _mm_add_ps(facc[i], _mm_mul_ps(_mm_set1_ps(dx[0]), _mm_mul_ps(d40, _mm_cvtepi32_ps(s0))));
        if (two) {
            __m128i s1 = _mm512_extracti32x4_epi32(u, 2);
            s1 = _mm_sub_epi32(s1, _mm_set1_epi32(16 * (xs[2] + xs[3])));
            facc[i] = _mm_add_ps(facc[i], _mm_mul_ps(_mm_set1_ps(dx[1]), _mm_mul_ps(d41, _mm_cvtepi32_ps(s1))));
        }
    }
}

__attribute__((noinline)) static void q50_rows(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y, int64_t ldy,
                     bool acc) {
    const int64_t nb = w->cols / TDM_QK;
    const size_t rb = w->row_bytes;
    __m128 facc[TDM_MM_DIRECT_MAX];
    for (int64_t r = r0; r < r1; r += 4) {
        const uint8_t *p[4];
        bool pf;
        const int64_t nv = qg_group(w, r, r1, n, p, facc, &pf);
        for (int64_t b = 0; b < nb; b += 2) {
            const bool two = b + 1 < nb;
            if (pf)
                for (int j = 0; j < 4; j++) _mm_prefetch((const char *)(p[j] + (size_t)QG_PF_ROWS * rb + (size_t)b * 22), _MM_HINT_T0);
            for (int32_t i0 = 0; i0 < n; i0 += QG_MR) {
                switch (TDM_MIN(QG_MR, n - i0)) {
                case 1: q50_pair_rows(1, p, b, two, xq, i0, facc + i0); break;
                case 2: q50_pair_rows(2, p, b, two, xq, i0, facc + i0); break;
                case 3: q50_pair_rows(3, p, b, two, xq, i0, facc + i0); break;
                default: q50_pair_rows(4, p, b, two, xq, i0, facc + i0); break;
                }
            }
        }
        qg_store(y + r, ldy, facc, n, nv, acc);
    }
}

/* (each type's loop its own function: inlined into one, their code's placement moved
 * with every change of the others, and Q5_0's speed with it, by about 10 %) */
__attribute__((noinline)) static void q4k_rows(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1,
                                               float *y, int64_t ldy, bool acc) {
    krows(TDM_Q4_K, w, xq, n, r0, r1, y, ldy, acc);
}
__attribute__((noinline)) static void q6k_rows(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1,
                                               float *y, int64_t ldy, bool acc) {
    krows(TDM_Q6_K, w, xq, n, r0, r1, y, ldy, acc);
}

bool tdm_qgemv_vnni(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y, int64_t ldy,
                    bool acc) {
    if (n > TDM_MM_DIRECT_MAX) return false;
    switch (w->type) {
    case TDM_Q4_K: q4k_rows(w, xq, n, r0, r1, y, ldy, acc); return true;
    case TDM_Q6_K: q6k_rows(w, xq, n, r0, r1, y, ldy, acc); return true;
    case TDM_Q5_0: q50_rows(w, xq, n, r0, r1, y, ldy, acc); return true;
    default: return false;
    }
}
