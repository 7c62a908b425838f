/* matmul_avx2.c - AVX2 + FMA + F16C kernels (compiled with -mavx2 -mfma -mf16c).
 *
 * Accumulation scheme (see cpu_internal.h): one __m256 accumulator per (x row,
 * W row) pair, k in steps of 8 with a masked tail, reduced by reduce4's tree.
 * gemm uses a 2 x 4 register block (2 input rows x 4 W rows = 8 accumulators).
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn_keys.h"
#include "cpu_internal.h"

#define V 8
#define PF_ROWS 16 /* prefetch distance in W rows */

/* Lane mask with the first rem (< 8) lanes set. */
static inline __m256i tail_mask(int64_t rem) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem), lanes);
}

/* [sum(a), sum(b), sum(c), sum(d)]: per vector (l_i + l_{i+4}), then (0+1)+(2+3). */
static inline __m128 reduce4(__m256 a, __m256 b, __m256 c, __m256 d) {
    __m128 a4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 b4 = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps(b, 1));
    __m128 c4 = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    __m128 d4 = _mm_add_ps(_mm256_castps256_ps128(d), _mm256_extractf128_ps(d, 1));
    return _mm_hadd_ps(_mm_hadd_ps(a4, b4), _mm_hadd_ps(c4, d4));
}

static inline float reduce1(__m256 a) { return _mm_cvtss_f32(reduce4(a, a, a, a)); }

static inline void store4(float *y, __m128 s, int64_t nv, bool acc) {
    if (nv == 4) {
        if (acc) s = _mm_add_ps(_mm_loadu_ps(y), s);
        _mm_storeu_ps(y, s);
        return;
    }
    float t[4];
    _mm_storeu_ps(t, s);
    for (int64_t j = 0; j < nv; j++) y[j] = acc ? y[j] + t[j] : t[j];
}

/* ---- loads --------------------------------------------------------------------- */

static inline __m256 load_f32(const void *p) { return _mm256_loadu_ps(p); }
static inline __m256 load_f32_tail(const void *p, int64_t rem) {
    return _mm256_maskload_ps(p, tail_mask(rem));
}
static inline __m256 load_f16(const void *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256 load_f16_tail(const void *p, int64_t rem) {
    uint16_t t[V] = {0};
    memcpy(t, p, (size_t)rem * 2);
    return load_f16(t);
}
static inline __m256 load_bf16(const void *p) {
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}
static inline __m256 load_bf16_tail(const void *p, int64_t rem) {
    uint16_t t[V] = {0};
    memcpy(t, p, (size_t)rem * 2);
    return load_bf16(t);
}

/* ---- conversion ---------------------------------------------------------------- */

static void convert_row(uint32_t type, const uint8_t *src, float *dst, int64_t cols) {
    int64_t k = 0;
    switch (type) {
    case TDM_F32:
        memcpy(dst, src, (size_t)cols * sizeof(float));
        break;
    case TDM_F16:
        for (; k + V <= cols; k += V) _mm256_storeu_ps(dst + k, load_f16(src + 2 * k));
        for (; k < cols; k++) {
            uint16_t h;
            memcpy(&h, src + 2 * k, 2);
            dst[k] = _cvtsh_ss(h);
        }
        break;
    case TDM_BF16:
        for (; k + V <= cols; k += V) _mm256_storeu_ps(dst + k, load_bf16(src + 2 * k));
        for (; k < cols; k++) {
            uint16_t h;
            memcpy(&h, src + 2 * k, 2);
            dst[k] = tdm_bf16_to_f32(h);
        }
        break;
    case TDM_Q8_0:
        for (int64_t b = 0; b < cols / TDM_QK; b++) {
            const uint8_t *blk = src + b * sizeof(tdm_block_q8_0);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
            for (int q = 0; q < 4; q++) {
                __m128i v = _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * q));
                _mm256_storeu_ps(dst + b * TDM_QK + 8 * q,
                                 _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
            }
        }
        break;
    case TDM_Q4_0: {
        const __m256i eight = _mm256_set1_epi32(8), low = _mm256_set1_epi32(15);
        for (int64_t b = 0; b < cols / TDM_QK; b++) {
            const uint8_t *blk = src + b * sizeof(tdm_block_q4_0);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            __m256 d = _mm256_set1_ps(_cvtsh_ss(dh));
            for (int q = 0; q < 2; q++) {
                __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * q)));
                __m256i lo = _mm256_sub_epi32(_mm256_and_si256(v, low), eight);
                __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(v, 4), eight);
                _mm256_storeu_ps(dst + b * TDM_QK + 8 * q, _mm256_mul_ps(d, _mm256_cvtepi32_ps(lo)));
                _mm256_storeu_ps(dst + b * TDM_QK + 16 + 8 * q,
                                 _mm256_mul_ps(d, _mm256_cvtepi32_ps(hi)));
            }
        }
        break;
    }
    default: /* the other quantised types: the reference conversion (embedding rows) */
        tdm_row_to_f32(type, src, dst, cols);
        break;
    }
}

static void k_convert_rows(const tdm_weight *w, int64_t r0, int64_t nr, float *dst, int64_t ld) {
    const uint8_t *base = (const uint8_t *)w->data;
    for (int64_t i = 0; i < nr; i++)
        convert_row(w->type, base + (size_t)(r0 + i) * w->row_bytes, dst + i * ld, w->cols);
}

/* s[i][j] += x row i (8 floats from k; rem < 8: a tail of rem) * b_j, for i < MR: the
 * register block shared by the tile kernel and the direct kernel. */
static inline __attribute__((always_inline)) void
fma_rows(const int MR, __m256 s[][4], __m256 b0, __m256 b1, __m256 b2, __m256 b3, const float *x,
         int64_t ldx, int64_t k, int64_t rem) {
    for (int i = 0; i < MR; i++) {
        __m256 a = rem >= V ? _mm256_loadu_ps(x + i * ldx + k) : load_f32_tail(x + i * ldx + k, rem);
        s[i][0] = _mm256_fmadd_ps(a, b0, s[i][0]);
        s[i][1] = _mm256_fmadd_ps(a, b1, s[i][1]);
        s[i][2] = _mm256_fmadd_ps(a, b2, s[i][2]);
        s[i][3] = _mm256_fmadd_ps(a, b3, s[i][3]);
    }
}

/* ---- gemm: MR input rows x 4 W rows ------------------------------------------- */

static inline __attribute__((always_inline)) void
kern(const int MR, const float *x, int64_t ldx, const float *w, int64_t ldw, int64_t cols,
     float *y, int64_t ldy, int64_t nv, bool acc) {
    __m256 s[2][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) s[i][j] = _mm256_setzero_ps();
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    int64_t k = 0;
    for (; k + V <= cols; k += V) {
        __m256 b0 = _mm256_loadu_ps(w0 + k), b1 = _mm256_loadu_ps(w1 + k);
        __m256 b2 = _mm256_loadu_ps(w2 + k), b3 = _mm256_loadu_ps(w3 + k);
        fma_rows(MR, s, b0, b1, b2, b3, x, ldx, k, V);
    }
    if (k < cols) {
        int64_t rem = cols - k;
        __m256 b0 = load_f32_tail(w0 + k, rem), b1 = load_f32_tail(w1 + k, rem);
        __m256 b2 = load_f32_tail(w2 + k, rem), b3 = load_f32_tail(w3 + k, rem);
        fma_rows(MR, s, b0, b1, b2, b3, x, ldx, k, rem);
    }
    for (int i = 0; i < MR; i++)
        store4(y + i * ldy, reduce4(s[i][0], s[i][1], s[i][2], s[i][3]), nv, acc);
}

static void k_gemm(const float *x, int64_t ldx, int32_t n, const float *wt, int64_t ldw,
                   int64_t nr, int64_t cols, float *y, int64_t ldy, bool acc) {
    int32_t i = 0;
    for (; i + 2 <= n; i += 2)
        for (int64_t j = 0; j < nr; j += 4)
            kern(2, x + i * ldx, ldx, wt + j * ldw, ldw, cols, y + i * ldy + j, ldy,
                 TDM_MIN(4, nr - j), acc);
    for (; i < n; i++)
        for (int64_t j = 0; j < nr; j += 4)
            kern(1, x + i * ldx, ldx, wt + j * ldw, ldw, cols, y + i * ldy + j, ldy,
                 TDM_MIN(4, nr - j), acc);
}

/* ---- direct path: small n, W converted on the fly ------------------------------ */

static inline __attribute__((always_inline)) __m256 wload(const uint32_t type, const uint8_t *p,
                                                          int64_t k) {
    if (type == TDM_F16) return load_f16(p + 2 * k);
    if (type == TDM_BF16) return load_bf16(p + 2 * k);
    return _mm256_loadu_ps((const float *)(const void *)p + k);
}

static inline __attribute__((always_inline)) __m256 wload_tail(const uint32_t type, const uint8_t *p,
                                                               int64_t k, int64_t rem) {
    if (type == TDM_F16) return load_f16_tail(p + 2 * k, rem);
    if (type == TDM_BF16) return load_bf16_tail(p + 2 * k, rem);
    return load_f32_tail((const float *)(const void *)p + k, rem);
}

/* MR input rows x the 4 W rows p[0..3] (converted while loading). */
static inline __attribute__((always_inline)) void
dkern(const int MR, const uint32_t type, const uint8_t *const p[4], const float *x, int64_t ldx,
      int64_t cols, float *y, int64_t ldy, int64_t nv, bool acc, const uint8_t *pf, size_t pf_stride) {
    const int64_t pf_esz = type == TDM_F32 ? 4 : 2;
    __m256 s[2][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) s[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + V <= cols; k += V) {
        if (pf && (k & 15) == 0) { /* one prefetch per 64-byte line of the next W rows */
            for (int j = 0; j < 4; j++)
                _mm_prefetch((const char *)pf + (size_t)j * pf_stride + k * pf_esz, _MM_HINT_T0);
        }
        __m256 b0 = wload(type, p[0], k), b1 = wload(type, p[1], k);
        __m256 b2 = wload(type, p[2], k), b3 = wload(type, p[3], k);
        fma_rows(MR, s, b0, b1, b2, b3, x, ldx, k, V);
    }
    if (k < cols) {
        int64_t rem = cols - k;
        __m256 b0 = wload_tail(type, p[0], k, rem), b1 = wload_tail(type, p[1], k, rem);
        __m256 b2 = wload_tail(type, p[2], k, rem), b3 = wload_tail(type, p[3], k, rem);
        fma_rows(MR, s, b0, b1, b2, b3, x, ldx, k, rem);
    }
    for (int i = 0; i < MR; i++)
        store4(y + i * ldy, reduce4(s[i][0], s[i][1], s[i][2], s[i][3]), nv, acc);
}

/* Weights 8t .. 8t + 7 of a Q8_0 / Q4_0 block as f32 (d: its scale, broadcast): the
 * values convert_row stores, computed the same way, so the direct path's FMA chains
 * give the tile path's bits. */
static inline __attribute__((always_inline)) __m256 qload8(const uint32_t type, const uint8_t *blk, __m256 d, int t) {
    if (type == TDM_Q8_0)
        return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * t)))));
    /* Q4_0: elements 0..15 are the low nibbles of bytes 0..15, 16..31 the high ones */
    __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * (t & 1))));
    __m256i l = t < 2 ? _mm256_and_si256(v, _mm256_set1_epi32(15)) : _mm256_srli_epi32(v, 4);
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(l, _mm256_set1_epi32(8))));
}

/* dkern for Q8_0 / Q4_0 W rows, a block at a time (cols is a multiple of 32). */
static inline __attribute__((always_inline)) void
qkern(const int MR, const uint32_t type, const uint8_t *const p[4], const float *x, int64_t ldx, int64_t cols,
      float *y, int64_t ldy, int64_t nv, bool acc, const uint8_t *pf, size_t pf_stride) {
    const size_t bb = type == TDM_Q8_0 ? sizeof(tdm_block_q8_0) : sizeof(tdm_block_q4_0);
    __m256 s[2][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) s[i][j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < cols / TDM_QK; b++) {
        const uint8_t *blk[4];
        __m256 d[4];
        for (int j = 0; j < 4; j++) {
            blk[j] = p[j] + (size_t)b * bb;
            if (pf) _mm_prefetch((const char *)pf + (size_t)j * pf_stride + (size_t)b * bb, _MM_HINT_T0);
            uint16_t dh;
            memcpy(&dh, blk[j], 2);
            d[j] = _mm256_set1_ps(_cvtsh_ss(dh));
        }
        for (int t = 0; t < 4; t++)
            fma_rows(MR, s, qload8(type, blk[0], d[0], t), qload8(type, blk[1], d[1], t),
                     qload8(type, blk[2], d[2], t), qload8(type, blk[3], d[3], t), x, ldx, b * TDM_QK + 8 * t, V);
    }
    for (int i = 0; i < MR; i++)
        store4(y + i * ldy, reduce4(s[i][0], s[i][1], s[i][2], s[i][3]), nv, acc);
}

static inline __attribute__((always_inline)) void
direct_rows(const uint32_t type, const tdm_weight *w, const float *x, int32_t n, int64_t r0,
            int64_t r1, float *y, int64_t ldy, bool acc) {
    const uint8_t *base = (const uint8_t *)w->data;
    int64_t cols = w->cols, ldx = cols;
    for (int64_t r = r0; r < r1; r += 4) {
        const uint8_t *p[4];
        for (int j = 0; j < 4; j++) p[j] = base + (size_t)TDM_MIN(r + j, r1 - 1) * w->row_bytes;
        int64_t nv = TDM_MIN(4, r1 - r);
        /* software prefetch of W rows PF_ROWS ahead during the first pass (see avx512) */
        const uint8_t *pf = r + PF_ROWS + 4 <= r1 ? base + (size_t)(r + PF_ROWS) * w->row_bytes : NULL;
        size_t ps = w->row_bytes;
        int32_t i = 0;
        const bool q = type == TDM_Q8_0 || type == TDM_Q4_0;
        for (; i + 2 <= n; i += 2, pf = NULL) {
            if (q) qkern(2, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps);
            else dkern(2, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps);
        }
        if (i < n) {
            if (q) qkern(1, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps);
            else dkern(1, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps);
        }
    }
}

static bool k_gemv(const tdm_weight *w, const float *x, int32_t n, int64_t r0, int64_t r1, float *y,
                   int64_t ldy, bool acc) {
    switch (w->type) {
    case TDM_F32: direct_rows(TDM_F32, w, x, n, r0, r1, y, ldy, acc); return true;
    case TDM_F16: direct_rows(TDM_F16, w, x, n, r0, r1, y, ldy, acc); return true;
    case TDM_BF16: direct_rows(TDM_BF16, w, x, n, r0, r1, y, ldy, acc); return true;
    case TDM_Q8_0: direct_rows(TDM_Q8_0, w, x, n, r0, r1, y, ldy, acc); return true;
    case TDM_Q4_0: direct_rows(TDM_Q4_0, w, x, n, r0, r1, y, ldy, acc); return true;
    default: return false;
    }
}

/* ---- attention helpers --------------------------------------------------------- */

/* 8 int8 values (a q8_0 cache's quants) as floats. */
static inline __m256 load_i8(const void *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __m256 load_i8_tail(const void *p, int64_t rem) {
    int8_t t[V] = {0};
    memcpy(t, p, (size_t)rem);
    return load_i8(t);
}

/* 8 E4M3 codes (dtype.h) as their f32 values, exactly: each code's sign and 7
 * exponent-mantissa bits moved to an f16's (bit 7 to 15, bits 0-6 to 7-13: the same
 * 3 mantissa bits, an exponent biased by 15 instead of 7, subnormals included), that
 * half converted and multiplied by 2^8; the NaN codes (magnitude 0x7f) become an f16
 * NaN. */
static inline __m256 load_e4m3(const void *p) {
    const __m128i x = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    const __m128i nan = _mm_cmpeq_epi16(_mm_and_si128(x, _mm_set1_epi16(0x7f)), _mm_set1_epi16(0x7f));
    const __m128i h = _mm_slli_epi16(_mm_add_epi16(x, _mm_and_si128(x, _mm_set1_epi16(0x80))), 7);
    return _mm256_mul_ps(_mm256_cvtph_ps(_mm_blendv_epi8(h, _mm_set1_epi16(0x7e00), nan)), _mm256_set1_ps(256.0f));
}
static inline __m256 load_e4m3_tail(const void *p, int64_t rem) {
    uint8_t t[V] = {0};
    memcpy(t, p, (size_t)rem);
    return load_e4m3(t);
}

/* 8 cache values from element k of p: f32, f16, q8_0 quants or fp8 codes' values
 * (kv_layout.h). */
static inline __attribute__((always_inline)) __m256 kvload(const uint32_t type, const uint8_t *p, int64_t k) {
    if (type == TDM_F16) return load_f16(p + 2 * k);
    if (type == TDM_Q8_0) return load_i8(p + k);
    if (type == TDM_F8_E4M3) return load_e4m3(p + k);
    return _mm256_loadu_ps((const float *)(const void *)p + k);
}
static inline __attribute__((always_inline)) __m256 kvload_tail(const uint32_t type, const uint8_t *p, int64_t rem) {
    if (type == TDM_F16) return load_f16_tail(p, rem);
    if (type == TDM_Q8_0) return load_i8_tail(p, rem);
    if (type == TDM_F8_E4M3) return load_e4m3_tail(p, rem);
    return load_f32_tail(p, rem);
}

/* Scores of QB query vectors against 2 key vectors of up to 8 slots (len 0: none):
 * acc[i][v] is one lane chain of FMAs over d = 0 .. hd - 1, as the kernel table's
 * contract says, whatever QB or the tiling. */
static inline __attribute__((always_inline)) void
qk_tile(const int QB, const uint32_t type, const float *qv, int64_t ldq, const tdm_kvec kv2[2], int64_t qoff,
        size_t dstride, int32_t hd, float scale, int64_t lds) {
    __m256 acc[4][2];
    for (int i = 0; i < QB; i++)
        for (int v = 0; v < 2; v++) acc[i][v] = _mm256_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        __m256 kv[2];
        for (int v = 0; v < 2; v++) {
            const uint8_t *p = kv2[v].k + d * dstride;
            int32_t len = kv2[v].len;
            if (len == V) kv[v] = kvload(type, p, 0);
            else if (len == 0) kv[v] = _mm256_setzero_ps();
            else kv[v] = kvload_tail(type, p, len);
        }
        for (int i = 0; i < QB; i++) {
            __m256 a = _mm256_set1_ps(qv[i * ldq + d]);
            for (int v = 0; v < 2; v++) acc[i][v] = _mm256_fmadd_ps(a, kv[v], acc[i][v]);
        }
    }
    const __m256 vs = _mm256_set1_ps(scale);
    for (int i = 0; i < QB; i++)
        for (int v = 0; v < 2; v++) {
            float t[V];
            _mm256_storeu_ps(t, _mm256_mul_ps(acc[i][v], vs));
            memcpy(kv2[v].s + qoff + i * lds, t, (size_t)kv2[v].len * sizeof(float));
        }
}

static inline __attribute__((always_inline)) void
qk_rows(const uint32_t type, const float *qv, int64_t ldq, int32_t nq, const void *const *kt, int32_t bs,
        int32_t cnt, int32_t hd, float scale, float *s, int64_t lds) {
    const size_t esz = (size_t)tdm_kv_elem_bytes(type);
    int32_t groups, base, extra;
    tdm_balanced_groups(nq, 4, &groups, &base, &extra);
    tdm_kcursor cur = {kt, s, bs, cnt, V, 0, 0, esz};
    tdm_kvec kv[2];
    while (tdm_kcursor_next(&cur, 2, kv) > 0)
        for (int32_t g = 0, i = 0; g < groups; g++) {
            int32_t qb = base + (g < extra);
            const float *qi = qv + (int64_t)i * ldq;
            const int64_t qo = (int64_t)i * lds, ds = (int64_t)bs * (int64_t)esz;
            if (qb == 4) qk_tile(4, type, qi, ldq, kv, qo, ds, hd, scale, lds);
            else if (qb == 3) qk_tile(3, type, qi, ldq, kv, qo, ds, hd, scale, lds);
            else if (qb == 2) qk_tile(2, type, qi, ldq, kv, qo, ds, hd, scale, lds);
            else qk_tile(1, type, qi, ldq, kv, qo, ds, hd, scale, lds);
            i += qb;
        }
}

static void k_attn_qk(const float *qv, int64_t ldq, int32_t nq, const void *const *kt, uint32_t type,
                      int32_t bs, int32_t cnt, int32_t hd, float scale, float *s, int64_t lds) {
    if (nq <= 0) return;
    if (type == TDM_F16) qk_rows(TDM_F16, qv, ldq, nq, kt, bs, cnt, hd, scale, s, lds);
    else if (type == TDM_Q8_0) qk_rows(TDM_Q8_0, qv, ldq, nq, kt, bs, cnt, hd, scale, s, lds);
    else if (type == TDM_F8_E4M3) qk_rows(TDM_F8_E4M3, qv, ldq, nq, kt, bs, cnt, hd, scale, s, lds);
    else qk_rows(TDM_F32, qv, ldq, nq, kt, bs, cnt, hd, scale, s, lds);
}

static inline __attribute__((always_inline)) void
pv_rows(const uint32_t type, float *acc, const float *p, int32_t cnt, const uint8_t *v, int32_t hd) {
    size_t esz = (size_t)tdm_kv_elem_bytes(type), row = (size_t)hd * esz;
    int32_t d = 0;
    for (; d + 4 * V <= hd; d += 4 * V) {
        __m256 s0 = _mm256_loadu_ps(acc + d), s1 = _mm256_loadu_ps(acc + d + V);
        __m256 s2 = _mm256_loadu_ps(acc + d + 2 * V), s3 = _mm256_loadu_ps(acc + d + 3 * V);
        const uint8_t *vp = v + (size_t)d * esz;
        for (int32_t i = 0; i < cnt; i++, vp += row) {
            __m256 pi = _mm256_set1_ps(p[i]);
            s0 = _mm256_fmadd_ps(pi, kvload(type, vp, 0), s0);
            s1 = _mm256_fmadd_ps(pi, kvload(type, vp, V), s1);
            s2 = _mm256_fmadd_ps(pi, kvload(type, vp, 2 * V), s2);
            s3 = _mm256_fmadd_ps(pi, kvload(type, vp, 3 * V), s3);
        }
        _mm256_storeu_ps(acc + d, s0);
        _mm256_storeu_ps(acc + d + V, s1);
        _mm256_storeu_ps(acc + d + 2 * V, s2);
        _mm256_storeu_ps(acc + d + 3 * V, s3);
    }
    for (; d + V <= hd; d += V) {
        __m256 s0 = _mm256_loadu_ps(acc + d);
        const uint8_t *vp = v + (size_t)d * esz;
        for (int32_t i = 0; i < cnt; i++, vp += row)
            s0 = _mm256_fmadd_ps(_mm256_set1_ps(p[i]), kvload(type, vp, 0), s0);
        _mm256_storeu_ps(acc + d, s0);
    }
    for (; d < hd; d++) {
        float s0 = acc[d];
        const uint8_t *vp = v + (size_t)d * esz;
        for (int32_t i = 0; i < cnt; i++, vp += row) {
            float x;
            if (type == TDM_F16) {
                uint16_t h;
                memcpy(&h, vp, 2);
                x = _cvtsh_ss(h);
            } else if (type == TDM_Q8_0) {
                x = (float)*(const int8_t *)vp;
            } else if (type == TDM_F8_E4M3) {
                x = tdm_e4m3_to_f32(*vp);
            } else {
                memcpy(&x, vp, 4);
            }
            s0 = fmaf(p[i], x, s0);
        }
        acc[d] = s0;
    }
}

static void k_attn_pv(float *acc, const float *p, int64_t ldp, int32_t nh, const void *v,
                      uint32_t type, int32_t cnt, int32_t hd) {
    for (int32_t h = 0; h < nh; h++) {
        if (type == TDM_F16) pv_rows(TDM_F16, acc + (int64_t)h * hd, p + h * ldp, cnt, v, hd);
        else if (type == TDM_Q8_0) pv_rows(TDM_Q8_0, acc + (int64_t)h * hd, p + h * ldp, cnt, v, hd);
        else if (type == TDM_F8_E4M3) pv_rows(TDM_F8_E4M3, acc + (int64_t)h * hd, p + h * ldp, cnt, v, hd);
        else pv_rows(TDM_F32, acc + (int64_t)h * hd, p + h * ldp, cnt, v, hd);
    }
}

/* ---- exp, softmax, swiglu ------------------------------------------------------ */

/* exp(x) to about 2 ulp: x clamped to [-87.3, 88.7], 2^n * poly(r) with
 * n = round(x / ln 2) and r = x - n ln 2 (ln 2 in two parts).  NaN stays NaN (max and
 * min return their second operand when either is NaN, so x goes second): a NaN score
 * or gate must reach the logits, where it is reported, not become exp(-87.3) = 0. */
static inline __m256 vexp(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(88.72283f), _mm256_max_ps(_mm256_set1_ps(-87.33654f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

static float k_softmax_num(float *x, int32_t n) {
    __m256 vm = _mm256_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + V <= n; i += V) vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
    float m = ({ __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
                 h = _mm_max_ps(h, _mm_movehl_ps(h, h));
                 h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
                 _mm_cvtss_f32(h); });
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    __m256 s = _mm256_setzero_ps(), mm = _mm256_set1_ps(m);
    for (i = 0; i + V <= n; i += V) {
        __m256 e = vexp(_mm256_sub_ps(_mm256_loadu_ps(x + i), mm));
        _mm256_storeu_ps(x + i, e);
        s = _mm256_add_ps(s, e);
    }
    if (i < n) {
        const __m256i lanes = tail_mask(n - i);
        __m256 t = _mm256_maskload_ps(x + i, lanes);
        __m256 e = vexp(_mm256_sub_ps(t, mm));
        e = _mm256_and_ps(e, _mm256_castsi256_ps(lanes)); /* zero the lanes past n */
        _mm256_maskstore_ps(x + i, lanes, e);
        s = _mm256_add_ps(s, e);
    }
    return reduce1(s);
}

static void k_rmsnorm_row(const float *x, const float *g, int32_t dim, float eps, float *o) {
    __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd(); /* lanes 0-3, 4-7 */
    int32_t k = 0;
    for (; k + 8 <= dim; k += 8) {
        __m256d xa = _mm256_cvtps_pd(_mm_loadu_ps(x + k)), xb = _mm256_cvtps_pd(_mm_loadu_ps(x + k + 4));
        a = _mm256_add_pd(a, _mm256_mul_pd(xa, xa));
        b = _mm256_add_pd(b, _mm256_mul_pd(xb, xb));
    }
    double l[8];
    _mm256_storeu_pd(l, a);
    _mm256_storeu_pd(l + 4, b);
    for (; k < dim; k++) l[k % 8] += (double)x[k] * x[k];
    double ss = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
    const __m256 vi = _mm256_set1_ps(inv);
    for (k = 0; k + V <= dim; k += V)
        _mm256_storeu_ps(o + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + k), vi), _mm256_loadu_ps(g + k)));
    for (; k < dim; k++) o[k] = x[k] * inv * g[k];
}

static void k_swiglu(const float *g, const float *u, float *o, int32_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int32_t i = 0;
    for (; i + V <= n; i += V) {
        __m256 gv = _mm256_loadu_ps(g + i);
        __m256 sig = _mm256_div_ps(gv, _mm256_add_ps(one, vexp(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
        _mm256_storeu_ps(o + i, _mm256_mul_ps(sig, _mm256_loadu_ps(u + i)));
    }
    for (; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void k_to_f16(const float *src, uint16_t *dst, int32_t n) {
    int32_t i = 0;
    for (; i + V <= n; i += V) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++) dst[i] = tdm_f32_to_f16(src[i]);
}

const tdm_cpu_kernels tdm_cpu_kernels_avx2 = {
    .name = "avx2",
    .convert_rows = k_convert_rows,
    .gemm = k_gemm,
    .gemv = k_gemv,
    .gemv_types = (1u << TDM_F32) | (1u << TDM_F16) | (1u << TDM_BF16) | (1u << TDM_Q8_0) | (1u << TDM_Q4_0),
    .qdot = tdm_qdot_avx2,
    .attn_qk = k_attn_qk,
    .attn_pv = k_attn_pv,
    .softmax_num = k_softmax_num,
    .rmsnorm_row = k_rmsnorm_row,
    .rope_row = tdm_cpu_rope_row_scalar,
    .swiglu = k_swiglu,
    .to_f16 = k_to_f16,
};
