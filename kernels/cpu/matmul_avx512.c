/* matmul_avx512.c - AVX-512 kernels (compiled with -mavx512f/bw/vl/dq -mfma -mf16c).
 *
 * Accumulation scheme (see cpu_internal.h): one __m512 accumulator per (x row,
 * W row) pair, k in steps of 16 with a masked tail, reduced by reduce4's tree.
 * gemm uses a 4 x 4 register block (4 input rows x 4 W rows = 16 accumulators).
 */
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "attn_keys.h"
#include "cpu_internal.h"

#define V 16
#define PF_ROWS 16 /* prefetch distance in W rows (best of 4, 8, 16 measured) */


static inline __mmask16 tail_mask(int64_t rem) { return (__mmask16)((1u << rem) - 1u); }

/* [sum(a), sum(b), sum(c), sum(d)] with a fixed tree per vector:
 * chunks (q0+q2)+(q1+q3), then lanes (l0+l2)+(l1+l3). */
static inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0x4E));
    t = _mm512_add_ps(t, _mm512_shuffle_ps(t, t, 0xB1));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, t));
}

static inline float reduce1(__m512 a) { return _mm_cvtss_f32(reduce4(a, a, a, a)); }

/* Stores 4 results to y[0..nv) (nv <= 4), adding when acc. */
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

/* ---- conversion ---------------------------------------------------------------- */

static inline __m512 load_f16(const void *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline __m512 load_f16_mask(const void *p, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
static inline __m512 load_bf16(const void *p) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}
static inline __m512 load_bf16_mask(const void *p, __mmask16 m) {
    __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

static void convert_row(uint32_t type, const uint8_t *src, float *dst, int64_t cols) {
    int64_t k = 0;
    switch (type) {
    case TDM_F32:
        memcpy(dst, src, (size_t)cols * sizeof(float));
        break;
    case TDM_F16:
        for (; k + V <= cols; k += V) _mm512_storeu_ps(dst + k, load_f16(src + 2 * k));
        if (k < cols) _mm512_mask_storeu_ps(dst + k, tail_mask(cols - k),
                                            load_f16_mask(src + 2 * k, tail_mask(cols - k)));
        break;
    case TDM_BF16:
        for (; k + V <= cols; k += V) _mm512_storeu_ps(dst + k, load_bf16(src + 2 * k));
        if (k < cols) _mm512_mask_storeu_ps(dst + k, tail_mask(cols - k),
                                            load_bf16_mask(src + 2 * k, tail_mask(cols - k)));
        break;
    case TDM_Q8_0:
        for (int64_t b = 0; b < cols / TDM_QK; b++) {
            const uint8_t *blk = src + b * sizeof(tdm_block_q8_0);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            __m512 d = _mm512_set1_ps(tdm_f16_to_f32(dh));
            __m128i q0 = _mm_loadu_si128((const __m128i *)(blk + 2));
            __m128i q1 = _mm_loadu_si128((const __m128i *)(blk + 18));
            _mm512_storeu_ps(dst + b * TDM_QK, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0))));
            _mm512_storeu_ps(dst + b * TDM_QK + 16,
                             _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1))));
        }
        break;
    case TDM_Q4_0: {
        const __m512i eight = _mm512_set1_epi32(8), low = _mm512_set1_epi32(15);
        for (int64_t b = 0; b < cols / TDM_QK; b++) {
            const uint8_t *blk = src + b * sizeof(tdm_block_q4_0);
            uint16_t dh;
            memcpy(&dh, blk, 2);
            __m512 d = _mm512_set1_ps(tdm_f16_to_f32(dh));
            __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
            __m512i lo = _mm512_sub_epi32(_mm512_and_si512(q, low), eight);
            __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(q, 4), eight);
            _mm512_storeu_ps(dst + b * TDM_QK, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
            _mm512_storeu_ps(dst + b * TDM_QK + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
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

/* s[i][j] += x row i (16 floats from k; m masks a tail) * b_j, for i < MR: the
 * register block shared by the tile kernel and the direct kernel. */
static inline __attribute__((always_inline)) void
fma_rows(const int MR, __m512 s[][4], __m512 b0, __m512 b1, __m512 b2, __m512 b3, const float *x,
         int64_t ldx, int64_t k, __mmask16 m) {
    for (int i = 0; i < MR; i++) {
        __m512 a = m == 0xffff ? _mm512_loadu_ps(x + i * ldx + k) : _mm512_maskz_loadu_ps(m, x + i * ldx + k);
        s[i][0] = _mm512_fmadd_ps(a, b0, s[i][0]);
        s[i][1] = _mm512_fmadd_ps(a, b1, s[i][1]);
        s[i][2] = _mm512_fmadd_ps(a, b2, s[i][2]);
        s[i][3] = _mm512_fmadd_ps(a, b3, s[i][3]);
    }
}

/* ---- gemm: MR input rows x 4 W rows ------------------------------------------- */

static inline __attribute__((always_inline)) void
kern(const int MR, const float *x, int64_t ldx, const float *w, int64_t ldw, int64_t cols,
     float *y, int64_t ldy, int64_t nv, bool acc) {
    __m512 s[4][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) s[i][j] = _mm512_setzero_ps();
    const float *w0 = w, *w1 = w + ldw, *w2 = w + 2 * ldw, *w3 = w + 3 * ldw;
    int64_t k = 0;
    for (; k + V <= cols; k += V) {
        __m512 b0 = _mm512_loadu_ps(w0 + k), b1 = _mm512_loadu_ps(w1 + k);
        __m512 b2 = _mm512_loadu_ps(w2 + k), b3 = _mm512_loadu_ps(w3 + k);
        fma_rows(MR, s, b0, b1, b2, b3, x, ldx, k, 0xffff);
    }
    if (k < cols) {
        __mmask16 m = tail_mask(cols - k);
        __m512 b0 = _mm512_maskz_loadu_ps(m, w0 + k), b1 = _mm512_maskz_loadu_ps(m, w1 + k);
        __m512 b2 = _mm512_maskz_loadu_ps(m, w2 + k), b3 = _mm512_maskz_loadu_ps(m, w3 + k);
        fma_rows(MR, s, b0, b1, b2, b3, x, ldx, k, m);
    }
    for (int i = 0; i < MR; i++)
        store4(y + i * ldy, reduce4(s[i][0], s[i][1], s[i][2], s[i][3]), nv, acc);
}

static void k_gemm(const float *x, int64_t ldx, int32_t n, const float *wt, int64_t ldw,
                   int64_t nr, int64_t cols, float *y, int64_t ldy, bool acc) {
    int32_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int64_t j = 0; j < nr; j += 4)
            kern(4, x + i * ldx, ldx, wt + j * ldw, ldw, cols, y + i * ldy + j, ldy,
                 TDM_MIN(4, nr - j), acc);
    int32_t rest = n - i;
    for (int64_t j = 0; rest > 0 && j < nr; j += 4) {
        const float *xi = x + i * ldx, *wj = wt + j * ldw;
        float *yij = y + i * ldy + j;
        int64_t nv = TDM_MIN(4, nr - j);
        if (rest == 3) kern(3, xi, ldx, wj, ldw, cols, yij, ldy, nv, acc);
        else if (rest == 2) kern(2, xi, ldx, wj, ldw, cols, yij, ldy, nv, acc);
        else kern(1, xi, ldx, wj, ldw, cols, yij, ldy, nv, acc);
    }
}

/* ---- direct path: small n, W converted on the fly ------------------------------ */

/* Elements k .. k + 15 (k a multiple of 16) of a q8_0 / q4_0 row, dequantised
 * exactly as convert_row does (d * q in f32). */
static inline __m512 load_q8_0(const uint8_t *p, int64_t k) {
    const uint8_t *blk = p + (size_t)(k >> 5) * sizeof(tdm_block_q8_0);
    uint16_t dh;
    memcpy(&dh, blk, 2);
    __m512 d = _mm512_set1_ps(_cvtsh_ss(dh));
    __m128i q = _mm_loadu_si128((const __m128i *)(blk + 2 + (k & 31)));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
}

static inline __m512 load_q4_0(const uint8_t *p, int64_t k) {
    const uint8_t *blk = p + (size_t)(k >> 5) * sizeof(tdm_block_q4_0);
    uint16_t dh;
    memcpy(&dh, blk, 2);
    __m512 d = _mm512_set1_ps(_cvtsh_ss(dh));
    __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
    q = (k & 16) ? _mm512_srli_epi32(q, 4) : _mm512_and_si512(q, _mm512_set1_epi32(15));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(q, _mm512_set1_epi32(8))));
}

/* Byte offset of element k (a multiple of 16) in a row. */
static inline __attribute__((always_inline)) int64_t elem_offset(const uint32_t type, int64_t k) {
    if (type == TDM_Q8_0) return (k >> 5) * (int64_t)sizeof(tdm_block_q8_0);
    if (type == TDM_Q4_0) return (k >> 5) * (int64_t)sizeof(tdm_block_q4_0);
    return k * (type == TDM_F32 ? 4 : 2);
}

static inline __attribute__((always_inline)) __m512 wload(const uint32_t type, const uint8_t *p,
                                                          int64_t k) {
    if (type == TDM_Q8_0) return load_q8_0(p, k);
    if (type == TDM_Q4_0) return load_q4_0(p, k);
    if (type == TDM_F16) return load_f16(p + 2 * k);
    if (type == TDM_BF16) return load_bf16(p + 2 * k);
    return _mm512_loadu_ps((const float *)(const void *)p + k);
}

static inline __attribute__((always_inline)) __m512 wload_mask(const uint32_t type, const uint8_t *p,
                                                               int64_t k, __mmask16 m) {
    if (type == TDM_F16) return load_f16_mask(p + 2 * k, m);
    if (type == TDM_BF16) return load_bf16_mask(p + 2 * k, m);
    return _mm512_maskz_loadu_ps(m, (const float *)(const void *)p + k);
}

/* MR input rows x the 4 W rows p[0..3] (converted while loading).  Quantised rows
 * have a multiple of 32 columns, so they never reach the masked tail. */
static inline __attribute__((always_inline)) void
dkern(const int MR, const uint32_t type, const uint8_t *const p[4], const float *x, int64_t ldx,
      int64_t cols, float *y, int64_t ldy, int64_t nv, bool acc, const uint8_t *pf, size_t pf_stride) {
    __m512 s[6][4];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < 4; j++) s[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + V <= cols; k += V) {
        /* about one prefetch per 64-byte line (quantised rows: one per 16 elements) */
        if (pf && (type == TDM_F32 || type == TDM_Q8_0 || type == TDM_Q4_0 || (k & 31) == 0)) {
            /* software prefetch of the next W rows: keeps more memory requests in
             * flight while the FMAs of this group run (decode is bandwidth bound) */
            const char *q = (const char *)pf + elem_offset(type, k);
            _mm_prefetch(q, _MM_HINT_T0);
            _mm_prefetch(q + pf_stride, _MM_HINT_T0);
            _mm_prefetch(q + 2 * pf_stride, _MM_HINT_T0);
            _mm_prefetch(q + 3 * pf_stride, _MM_HINT_T0);
        }
        __m512 b0 = wload(type, p[0], k), b1 = wload(type, p[1], k);
        __m512 b2 = wload(type, p[2], k), b3 = wload(type, p[3], k);
        fma_rows(MR, s, b0, b1, b2, b3, x, ldx, k, 0xffff);
    }
    if (k < cols) {
        __mmask16 m = tail_mask(cols - k);
        __m512 b0 = wload_mask(type, p[0], k, m), b1 = wload_mask(type, p[1], k, m);
        __m512 b2 = wload_mask(type, p[2], k, m), b3 = wload_mask(type, p[3], k, m);
        fma_rows(MR, s, b0, b1, b2, b3, x, ldx, k, m);
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
        /* prefetch the next group of 4 rows during the first pass over this group */
        const uint8_t *pf = r + PF_ROWS + 4 <= r1 ? base + (size_t)(r + PF_ROWS) * w->row_bytes : NULL;
        size_t ps = w->row_bytes;
        int32_t i = 0;
        /* up to 6 input rows share each converted W vector (24 accumulators) */
        for (; i + 6 <= n; i += 6, pf = NULL)
            dkern(6, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps);
        switch (n - i) {
        case 5: dkern(5, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps); break;
        case 4: dkern(4, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps); break;
        case 3: dkern(3, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps); break;
        case 2: dkern(2, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps); break;
        case 1: dkern(1, type, p, x + i * ldx, ldx, cols, y + i * ldy + r, ldy, nv, acc, pf, ps); break;
        default: break;
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

/* ---- P64 layout: [rows / 64][cols][64] ----------------------------------------- */

/* Software prefetch of the P64 stream: into L1 this many bytes ahead (of 0, 1 K, 4 K,
 * 8 K, 16 K, 32 K, 64 K: 8 K best) and into L2 TDM_P64_PF2_BYTES ahead (of none,
 * 16 K, 24 K, 48 K: 24 K best, -8 % on the target's matmuls at n = 1 and 4). */
#ifndef TDM_P64_PF_BYTES
#define TDM_P64_PF_BYTES 8192
#endif
#ifndef TDM_P64_PF2_BYTES
#define TDM_P64_PF2_BYTES 24576
#endif

/* Where a P64 stream goes on after a block: blocks are `stride` bytes apart and
 * the stream reads the first `slice` bytes of each (a view of some columns: the
 * rest, gap = stride - slice, belongs to other columns; gap = 0 for a whole
 * weight).  The stream ends at `end`. */
typedef struct p64_stream {
    size_t gap;
    const uint8_t *end;
} p64_stream;

/* Prefetches the stream TDM_P64_PF_BYTES (into L1) and TDM_P64_PF2_BYTES (into
 * L2) past column p of a block whose slice ends at slice_end: an address past the
 * slice moves on by the gap, into the next block's slice. */
static inline __attribute__((always_inline)) void p64_prefetch(const uint8_t *p, size_t col_bytes,
                                                                const uint8_t *slice_end, p64_stream st) {
    const uint8_t *q = p + TDM_P64_PF_BYTES, *q2 = p + TDM_P64_PF2_BYTES;
    if (q >= slice_end) q += st.gap;
    if (q2 >= slice_end) q2 += st.gap;
    if (q < st.end)
        for (size_t l = 0; l < col_bytes; l += 64) _mm_prefetch((const char *)q + l, _MM_HINT_T0);
    if (q2 < st.end)
        for (size_t l = 0; l < col_bytes; l += 64) _mm_prefetch((const char *)q2 + l, _MM_HINT_T1);
}

/* MR input rows x one 64-row block (4 vectors of 16 outputs): s[i][v] +=
 * x[i][k] * W[k][v lanes] for k = 0, 1, ..., cols - 1 in order, one FMA per
 * column, so every output is one lane summed serially over k whatever MR is.  The
 * stream is prefetched ahead (TDM_P64_PF_BYTES, TDM_P64_PF2_BYTES; p64_stream). */
static inline __attribute__((always_inline)) void
p64_kern(const int MR, const uint32_t type, const uint8_t *blk, const float *x, int64_t cols, float *y,
         int64_t ldy, bool acc, p64_stream st) {
    const size_t col_bytes = 64 * (type == TDM_F32 ? 4 : 2);
    __m512 s[6][4];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 4; v++) s[i][v] = _mm512_setzero_ps();
    const uint8_t *slice_end = blk + (size_t)cols * col_bytes;
    for (int64_t k = 0; k < cols; k++) {
        p64_prefetch(blk + (size_t)k * col_bytes, col_bytes, slice_end, st);
        __m512 w[4];
        for (int v = 0; v < 4; v++) w[v] = wload(type, blk, k * 64 + 16 * v);
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(x[i * cols + k]);
            for (int v = 0; v < 4; v++) s[i][v] = _mm512_fmadd_ps(a, w[v], s[i][v]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 4; v++) {
            float *o = y + i * ldy + 16 * v;
            _mm512_storeu_ps(o, acc ? _mm512_add_ps(_mm512_loadu_ps(o), s[i][v]) : s[i][v]);
        }
}

/* MR (7..12) input rows x half of a 64-row block (2 vectors: outputs 32 h .. 32 h +
 * 31), with the same lane chains as p64_kern: twice the rows per converted weight
 * vector.  The half h = 0 pass prefetches the stream; the h = 1 pass reads the
 * block again from the caches. */
static inline __attribute__((always_inline)) void
p64_half(const int MR, const uint32_t type, const uint8_t *blk, int h, const float *x, int64_t cols, float *y,
         int64_t ldy, bool acc, p64_stream st) {
    const size_t col_bytes = 64 * (type == TDM_F32 ? 4 : 2);
    __m512 s[12][2];
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 2; v++) s[i][v] = _mm512_setzero_ps();
    const uint8_t *slice_end = blk + (size_t)cols * col_bytes;
    for (int64_t k = 0; k < cols; k++) {
        if (h == 0) p64_prefetch(blk + (size_t)k * col_bytes, col_bytes, slice_end, st);
        __m512 w0 = wload(type, blk, k * 64 + 32 * h), w1 = wload(type, blk, k * 64 + 32 * h + 16);
        for (int i = 0; i < MR; i++) {
            __m512 a = _mm512_set1_ps(x[i * cols + k]);
            s[i][0] = _mm512_fmadd_ps(a, w0, s[i][0]);
            s[i][1] = _mm512_fmadd_ps(a, w1, s[i][1]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int v = 0; v < 2; v++) {
            float *o = y + i * ldy + 32 * h + 16 * v;
            _mm512_storeu_ps(o, acc ? _mm512_add_ps(_mm512_loadu_ps(o), s[i][v]) : s[i][v]);
        }
}

/* Blocks [b0, b1) against input rows [0, n): one block at a time (one sequential
 * stream per thread; two blocks at a time for one row measured 20 % slower on the
 * target's matmuls), rows in balanced groups of at most 6, or of at most 12 in two
 * half-block passes when n > 6. */
static inline __attribute__((always_inline)) void
p64_rows(const uint32_t type, const tdm_weight *w, const float *x, int32_t n, int64_t b0, int64_t b1,
         float *y, int64_t ldy, bool acc) {
    const int64_t cols = w->cols;
    /* blocks 64 rows of row_bytes apart (a view of some columns of a wider weight
     * reads the first cols columns of each) */
    const size_t blk_bytes = 64 * w->row_bytes, slice = (size_t)cols * 64 * (type == TDM_F32 ? 4 : 2);
    const uint8_t *base = (const uint8_t *)w->data;
    const p64_stream end = {blk_bytes - slice, base + (size_t)(b1 - 1) * blk_bytes + slice};
    int32_t groups, base_rows, extra;
    tdm_balanced_groups(n, n > 6 ? 12 : 6, &groups, &base_rows, &extra);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *p = base + (size_t)b * blk_bytes;
        for (int32_t g = 0, i = 0; g < groups; g++) {
            int32_t mr = base_rows + (g < extra);
            const float *xi = x + (int64_t)i * cols;
            float *yo = y + (int64_t)i * ldy + b * 64;
            if (mr > 6) {
                for (int h = 0; h < 2; h++) switch (mr) {
                    case 12: p64_half(12, type, p, h, xi, cols, yo, ldy, acc, end); break;
                    case 11: p64_half(11, type, p, h, xi, cols, yo, ldy, acc, end); break;
                    case 10: p64_half(10, type, p, h, xi, cols, yo, ldy, acc, end); break;
                    case 9: p64_half(9, type, p, h, xi, cols, yo, ldy, acc, end); break;
                    case 8: p64_half(8, type, p, h, xi, cols, yo, ldy, acc, end); break;
                    default: p64_half(7, type, p, h, xi, cols, yo, ldy, acc, end); break;
                    }
                i += mr;
                continue;
            }
            switch (mr) {
            case 6: p64_kern(6, type, p, xi, cols, yo, ldy, acc, end); break;
            case 5: p64_kern(5, type, p, xi, cols, yo, ldy, acc, end); break;
            case 4: p64_kern(4, type, p, xi, cols, yo, ldy, acc, end); break;
            case 3: p64_kern(3, type, p, xi, cols, yo, ldy, acc, end); break;
            case 2: p64_kern(2, type, p, xi, cols, yo, ldy, acc, end); break;
            default: p64_kern(1, type, p, xi, cols, yo, ldy, acc, end); break;
            }
            i += mr;
        }
    }
}

static bool k_gemv_p64(const tdm_weight *w, const float *x, int32_t n, int64_t b0, int64_t b1, float *y,
                       int64_t ldy, bool acc) {
    switch (w->type) {
    case TDM_F32: p64_rows(TDM_F32, w, x, n, b0, b1, y, ldy, acc); return true;
    case TDM_F16: p64_rows(TDM_F16, w, x, n, b0, b1, y, ldy, acc); return true;
    case TDM_BF16: p64_rows(TDM_BF16, w, x, n, b0, b1, y, ldy, acc); return true;
    default: return false;
    }
}

/* ---- attention helpers --------------------------------------------------------- */

/* 16 cache values (lanes of m) from element k of p: f32, f16 or q8_0 quants
 * (kv_layout.h; not the weights' Q8_0 blocks). */
/* 16 E4M3 codes (dtype.h) as their f32 values, exactly: each code's sign and 7
 * exponent-mantissa bits moved to an f16's (bit 7 to 15, bits 0-6 to 7-13: the same
 * 3 mantissa bits, an exponent biased by 15 instead of 7, subnormals included), that
 * half converted and multiplied by 2^8; the NaN codes (magnitude 0x7f) become an f16
 * NaN. */
static inline __m512 e4m3_to_ps(__m128i b) {
    const __m256i x = _mm256_cvtepu8_epi16(b), mag = _mm256_and_si256(x, _mm256_set1_epi16(0x7f));
    __m256i h = _mm256_slli_epi16(_mm256_add_epi16(x, _mm256_and_si256(x, _mm256_set1_epi16(0x80))), 7);
    h = _mm256_mask_mov_epi16(h, _mm256_cmpeq_epi16_mask(mag, _mm256_set1_epi16(0x7f)), _mm256_set1_epi16(0x7e00));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
}

static inline __attribute__((always_inline)) __m512 kvload_mask(const uint32_t type, const uint8_t *p, int64_t k,
                                                                __mmask16 m) {
    if (type == TDM_F16) return load_f16_mask(p + 2 * k, m);
    if (type == TDM_Q8_0) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p + k)));
    if (type == TDM_F8_E4M3) return e4m3_to_ps(_mm_maskz_loadu_epi8(m, p + k));
    return _mm512_maskz_loadu_ps(m, (const float *)(const void *)p + k);
}
static inline __attribute__((always_inline)) __m512 kvload(const uint32_t type, const uint8_t *p, int64_t k) {
    if (type == TDM_F16) return load_f16(p + 2 * k);
    if (type == TDM_Q8_0) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + k))));
    if (type == TDM_F8_E4M3) return e4m3_to_ps(_mm_loadu_si128((const __m128i *)(p + k)));
    return _mm512_loadu_ps((const float *)(const void *)p + k);
}

/* Scores of QB query vectors against 4 key vectors of up to 16 slots (a vector
 * with len 0 is masked out entirely: masked loads do not fault): acc[i][v] is one
 * lane chain of FMAs over d = 0, 1, ..., hd - 1, so each score is formed exactly as
 * the kernel table's contract says, whatever QB or the tiling. */
static inline __attribute__((always_inline)) void
qk_tile(const int QB, const uint32_t type, const float *qv, int64_t ldq, const tdm_kvec kv4[4], int64_t qoff,
        size_t dstride, int32_t hd, __m512 scale, int64_t lds) {
    __m512 acc[6][4];
    __mmask16 km[4];
    for (int v = 0; v < 4; v++) km[v] = kv4[v].len == 16 ? (__mmask16)0xffff : tail_mask(kv4[v].len);
    for (int i = 0; i < QB; i++)
        for (int v = 0; v < 4; v++) acc[i][v] = _mm512_setzero_ps();
    for (int32_t d = 0; d < hd; d++) {
        __m512 kv[4];
        for (int v = 0; v < 4; v++) kv[v] = kvload_mask(type, kv4[v].k + d * dstride, 0, km[v]);
        for (int i = 0; i < QB; i++) {
            __m512 a = _mm512_set1_ps(qv[i * ldq + d]);
            for (int v = 0; v < 4; v++) acc[i][v] = _mm512_fmadd_ps(a, kv[v], acc[i][v]);
        }
    }
    for (int i = 0; i < QB; i++)
        for (int v = 0; v < 4; v++)
            _mm512_mask_storeu_ps(kv4[v].s + qoff + i * lds, km[v], _mm512_mul_ps(acc[i][v], scale));
}

static inline __attribute__((always_inline)) void
qk_rows(const uint32_t type, const float *qv, int64_t ldq, int32_t nq, const void *const *kt, int32_t bs,
        int32_t cnt, int32_t hd, float scale, float *s, int64_t lds) {
    const size_t esz = (size_t)tdm_kv_elem_bytes(type);
    int32_t groups, base, extra;
    tdm_balanced_groups(nq, 6, &groups, &base, &extra);
    const __m512 vs = _mm512_set1_ps(scale);
    tdm_kcursor cur = {kt, s, bs, cnt, 16, 0, 0, esz};
    tdm_kvec kv[4];
    while (tdm_kcursor_next(&cur, 4, kv) > 0)
        for (int32_t g = 0, i = 0; g < groups; g++) {
            int32_t qb = base + (g < extra);
            const float *qi = qv + (int64_t)i * ldq;
            const int64_t qo = (int64_t)i * lds, ds = (int64_t)bs * (int64_t)esz;
            switch (qb) {
            case 6: qk_tile(6, type, qi, ldq, kv, qo, ds, hd, vs, lds); break;
            case 5: qk_tile(5, type, qi, ldq, kv, qo, ds, hd, vs, lds); break;
            case 4: qk_tile(4, type, qi, ldq, kv, qo, ds, hd, vs, lds); break;
            case 3: qk_tile(3, type, qi, ldq, kv, qo, ds, hd, vs, lds); break;
            case 2: qk_tile(2, type, qi, ldq, kv, qo, ds, hd, vs, lds); break;
            default: qk_tile(1, type, qi, ldq, kv, qo, ds, hd, vs, lds); break;
            }
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

/* acc[h][d] += sum_i p[h * ldp + i] v[i][d] for H <= PV_H heads at once and the
 * NV * 16 columns from d0 (m: mask of the last vector): each V vector is loaded
 * once for all the heads.  Every acc element sees the same FMAs in order of i
 * whatever the number of heads blocked together. */
#define PV_H 6
static inline __attribute__((always_inline)) void
pv_block(const uint32_t type, const int H, const int NV, float *acc, int64_t hd, const float *p,
         int64_t ldp, int32_t cnt, const uint8_t *v, size_t row, int32_t d0, __mmask16 m) {
    __m512 s[PV_H][4];
    for (int h = 0; h < H; h++)
        for (int c = 0; c < NV; c++) s[h][c] = _mm512_maskz_loadu_ps(c == NV - 1 ? m : 0xffff, acc + h * hd + d0 + c * V);
    const uint8_t *vp = v;
    for (int32_t i = 0; i < cnt; i++, vp += row) {
        __m512 b[4];
        for (int c = 0; c < NV; c++) b[c] = c == NV - 1 ? kvload_mask(type, vp, d0 + c * V, m) : kvload(type, vp, d0 + c * V);
        for (int h = 0; h < H; h++) {
            __m512 pi = _mm512_set1_ps(p[h * ldp + i]);
            for (int c = 0; c < NV; c++) s[h][c] = _mm512_fmadd_ps(pi, b[c], s[h][c]);
        }
    }
    for (int h = 0; h < H; h++)
        for (int c = 0; c < NV; c++) _mm512_mask_storeu_ps(acc + h * hd + d0 + c * V, c == NV - 1 ? m : 0xffff, s[h][c]);
}

/* All heads for columns [d0, d0 + NV * 16): blocks of PV_H heads, then the rest. */
static inline __attribute__((always_inline)) void
pv_cols(const uint32_t type, const int NV, float *acc, const float *p, int64_t ldp, int32_t nh,
        const uint8_t *v, size_t row, int32_t cnt, int32_t hd, int32_t d0, __mmask16 m) {
    int32_t h = 0;
    for (; h + PV_H <= nh; h += PV_H)
        pv_block(type, PV_H, NV, acc + (int64_t)h * hd, hd, p + h * ldp, ldp, cnt, v, row, d0, m);
    float *a = acc + (int64_t)h * hd;
    const float *ph = p + h * ldp;
    switch (nh - h) {
    case 5: pv_block(type, 5, NV, a, hd, ph, ldp, cnt, v, row, d0, m); break;
    case 4: pv_block(type, 4, NV, a, hd, ph, ldp, cnt, v, row, d0, m); break;
    case 3: pv_block(type, 3, NV, a, hd, ph, ldp, cnt, v, row, d0, m); break;
    case 2: pv_block(type, 2, NV, a, hd, ph, ldp, cnt, v, row, d0, m); break;
    case 1: pv_block(type, 1, NV, a, hd, ph, ldp, cnt, v, row, d0, m); break;
    default: break;
    }
}

static inline __attribute__((always_inline)) void
pv_heads(const uint32_t type, float *acc, const float *p, int64_t ldp, int32_t nh, const uint8_t *v,
         int32_t cnt, int32_t hd) {
    size_t esz = (size_t)tdm_kv_elem_bytes(type), row = (size_t)hd * esz;
    int32_t d0 = 0;
    for (; d0 + 4 * V <= hd; d0 += 4 * V) pv_cols(type, 4, acc, p, ldp, nh, v, row, cnt, hd, d0, 0xffff);
    for (; d0 < hd; d0 += V) /* tail columns one vector at a time */
        pv_cols(type, 1, acc, p, ldp, nh, v, row, cnt, hd, d0,
                hd - d0 >= V ? (__mmask16)0xffff : tail_mask(hd - d0));
}

static void k_attn_pv(float *acc, const float *p, int64_t ldp, int32_t nh, const void *v,
                      uint32_t type, int32_t cnt, int32_t hd) {
    if (type == TDM_F16) pv_heads(TDM_F16, acc, p, ldp, nh, v, cnt, hd);
    else if (type == TDM_Q8_0) pv_heads(TDM_Q8_0, acc, p, ldp, nh, v, cnt, hd);
    else if (type == TDM_F8_E4M3) pv_heads(TDM_F8_E4M3, acc, p, ldp, nh, v, cnt, hd);
    else pv_heads(TDM_F32, acc, p, ldp, nh, v, cnt, hd);
}

/* ---- exp, softmax, swiglu ------------------------------------------------------ */

/* exp(x) to about 2 ulp: x clamped to [-87.3, 88.7], 2^n * poly(r) with
 * n = round(x / ln 2) and r = x - n ln 2 (ln 2 in two parts).  NaN stays NaN (max and
 * min return their second operand when either is NaN, so x goes second): a NaN score
 * or gate must reach the logits, where it is reported, not become exp(-87.3) = 0. */
static inline __m512 vexp(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.72283f), _mm512_max_ps(_mm512_set1_ps(-87.33654f), x));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

static float k_softmax_num(float *x, int32_t n) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int32_t i = 0;
    for (; i + V <= n; i += V) vm = _mm512_max_ps(vm, _mm512_loadu_ps(x + i));
    float m = _mm512_reduce_max_ps(vm);
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    __m512 s = _mm512_setzero_ps(), mm = _mm512_set1_ps(m);
    for (i = 0; i + V <= n; i += V) {
        __m512 e = vexp(_mm512_sub_ps(_mm512_loadu_ps(x + i), mm));
        _mm512_storeu_ps(x + i, e);
        s = _mm512_add_ps(s, e);
    }
    if (i < n) {
        const __m512i lanes = _mm512_maskz_set1_epi32(tail_mask(n - i), -1);
        __m512 t = _mm512_maskz_loadu_ps(tail_mask(n - i), x + i);
        __m512 e = vexp(_mm512_sub_ps(t, mm));
        e = _mm512_and_ps(e, _mm512_castsi512_ps(lanes)); /* zero the lanes past n */
        _mm512_mask_storeu_ps(x + i, tail_mask(n - i), e);
        s = _mm512_add_ps(s, e);
    }
    return reduce1(s);
}

static void k_rmsnorm_row(const float *x, const float *g, int32_t dim, float eps, float *o) {
    __m512d a = _mm512_setzero_pd(); /* lane l: k % 8 == l */
    int32_t k = 0;
    for (; k + 8 <= dim; k += 8) {
        __m512d xv = _mm512_cvtps_pd(_mm256_loadu_ps(x + k));
        a = _mm512_add_pd(a, _mm512_mul_pd(xv, xv));
    }
    double l[8];
    _mm512_storeu_pd(l, a);
    for (; k < dim; k++) l[k % 8] += (double)x[k] * x[k];
    double ss = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
    const __m512 vi = _mm512_set1_ps(inv);
    for (k = 0; k + V <= dim; k += V)
        _mm512_storeu_ps(o + k, _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(x + k), vi), _mm512_loadu_ps(g + k)));
    if (k < dim) {
        __mmask16 m = tail_mask(dim - k);
        _mm512_mask_storeu_ps(o + k, m, _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + k), vi),
                                                      _mm512_maskz_loadu_ps(m, g + k)));
    }
}

/* Interleaved pairs, 8 per vector: [a0 b0 a1 b1 ..] with cs = [c0 s0 c1 s1 ..]:
 * a' = a c - b s and b' = a s + b c, as products then one add (swapped lanes). */
static void k_rope_row(float *v, int32_t n_head, int32_t head_dim, int32_t half, bool neox, const float *cs) {
    if (neox || half % 8 != 0) {
        tdm_cpu_rope_row_scalar(v, n_head, head_dim, half, neox, cs);
        return;
    }
    const __m512i swap = _mm512_setr_epi32(1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    const __mmask16 even = 0x5555;
    for (int32_t h = 0; h < n_head; h++, v += head_dim)
        for (int32_t t = 0; t < 2 * half; t += V) {
            __m512 x = _mm512_loadu_ps(v + t), w = _mm512_loadu_ps(cs + t); /* [c s ..] */
            __m512 xs = _mm512_permutexvar_ps(swap, x);                    /* [b a ..] */
            __m512 c = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14), w);
            __m512 s = _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15), w);
            __m512 p = _mm512_mul_ps(x, c), q = _mm512_mul_ps(xs, s); /* [a c, b c ..], [b s, a s ..] */
            /* even lanes a c - b s, odd lanes b c + a s (= a s + b c: addition commutes) */
            _mm512_storeu_ps(v + t, _mm512_mask_sub_ps(_mm512_add_ps(p, q), even, p, q));
        }
}

static void k_swiglu(const float *g, const float *u, float *o, int32_t n) {
    const __m512 one = _mm512_set1_ps(1.0f);
    int32_t i = 0;
    for (; i + V <= n; i += V) {
        __m512 gv = _mm512_loadu_ps(g + i);
        __m512 sig = _mm512_div_ps(gv, _mm512_add_ps(one, vexp(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
        _mm512_storeu_ps(o + i, _mm512_mul_ps(sig, _mm512_loadu_ps(u + i)));
    }
    for (; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void k_to_f16(const float *src, uint16_t *dst, int32_t n) {
    int32_t i = 0;
    for (; i + V <= n; i += V) {
        __m256i h = _mm512_cvtps_ph(_mm512_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_storeu_si256((__m256i *)(dst + i), h);
    }
    for (; i < n; i++) dst[i] = tdm_f32_to_f16(src[i]);
}

const tdm_cpu_kernels tdm_cpu_kernels_avx512 = {
    .name = "avx512",
    .convert_rows = k_convert_rows,
    .gemm = k_gemm,
    .gemv = k_gemv,
    .gemv_types = (1u << TDM_F32) | (1u << TDM_F16) | (1u << TDM_BF16) | (1u << TDM_Q8_0) | (1u << TDM_Q4_0),
    .qdot = tdm_qdot_avx512,
    .gemv_p64 = k_gemv_p64,
    .attn_qk = k_attn_qk,
    .attn_pv = k_attn_pv,
    .softmax_num = k_softmax_num,
    .rmsnorm_row = k_rmsnorm_row,
    .rope_row = k_rope_row,
    .swiglu = k_swiglu,
    .to_f16 = k_to_f16,
};
