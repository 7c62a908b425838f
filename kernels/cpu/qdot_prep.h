/* qdot_prep.h - the integer forms of weight blocks (tdm_kprep, tdm_qprep; qdot.h)
 * with AVX2 intrinsics, for the SIMD levels' integer-dot kernels (included by
 * qdot_avx2.c and qdot_avx512.c, compiled with AVX2 at least).  Each fill gives the
 * same bytes as tdm_kprep_ref / tdm_qprep_ref; types without a vector fill here use
 * those. */
#ifndef TDM_QDOT_PREP_H
#define TDM_QDOT_PREP_H

#include <immintrin.h>

#include "qdot.h"

/* [sum(a), sum(b), sum(c), sum(d)] of 8 int32 lanes each, exact. */
static inline __m128i reduce4(__m256i a, __m256i b, __m256i c, __m256i d) {
    __m256i t = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    return _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

static inline float qp_h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Q4_K / Q5_K scales (tdm_k4_scales) by 32-bit lanes of the 12 bytes: s8 = the 8
 * scales, c[2 s] = c[2 s + 1] = min s (scp is left unset: the dot loops read s8). */
static inline void qp_scales32(tdm_kprep *p, const uint8_t q[12]) {
    uint32_t a0, a1, a2;
    memcpy(&a0, q, 4), memcpy(&a1, q + 4, 4), memcpy(&a2, q + 8, 4);
    uint64_t sc = (uint64_t)(a0 & 0x3f3f3f3fu) | (uint64_t)((a2 & 0x0f0f0f0fu) | (((a0 >> 6) & 0x03030303u) << 4)) << 32;
    uint64_t mn = (uint64_t)(a1 & 0x3f3f3f3fu) | (uint64_t)(((a2 >> 4) & 0x0f0f0f0fu) | (((a1 >> 6) & 0x03030303u) << 4)) << 32;
    _mm_store_si128((__m128i *)(void *)p->s8, _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc)));
    __m128i m8 = _mm_cvtsi64_si128((long long)mn);
    _mm256_store_si256((__m256i *)(void *)p->c, _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)));
}

/* scp[8 s .. 8 s + 7] = sc16[s] for 16 sub-blocks of 16 (sc16: 16 int16). */
static inline void qp_scales16(tdm_kprep *p, __m256i sc16) {
    const __m256i pick = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3, 2,
                                          3, 2, 3, 2, 3, 2, 3);
    for (int t = 0; t < 8; t++) {
        __m256i pair = _mm256_permutevar8x32_epi32(sc16, _mm256_set1_epi32(t)); /* words 2t, 2t + 1 everywhere */
        _mm256_store_si256((__m256i *)(void *)(p->scp + 16 * t), _mm256_shuffle_epi8(pair, pick));
    }
}

static inline void qp_q45_K(const uint8_t *b, bool five, tdm_kprep *p) {
    qp_scales32(p, b + 4);
    p->d = qp_h2f(b), p->dm = qp_h2f(b + 2);
    const uint8_t *qs = b + (five ? 48 : 16);
    const __m256i low = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256i hv = five ? _mm256_loadu_si256((const __m256i *)(const void *)(b + 16)) : _mm256_setzero_si256();
    for (int j = 0; j < 4; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * j));
        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        if (five) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2 * j), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hv, 2 * j + 1), one), 4));
        }
        _mm256_store_si256((__m256i *)(void *)(p->q + 64 * j), lo);
        _mm256_store_si256((__m256i *)(void *)(p->q + 64 * j + 32), hi);
    }
}

static inline void qp_q6_K(const uint8_t *b, tdm_kprep *p) {
    const __m256i low = _mm256_set1_epi8(15);
    for (int h = 0; h < 2; h++) {
        __m256i l0 = _mm256_loadu_si256((const __m256i *)(const void *)(b + 64 * h));
        __m256i l1 = _mm256_loadu_si256((const __m256i *)(const void *)(b + 64 * h + 32));
        __m256i hv = _mm256_loadu_si256((const __m256i *)(const void *)(b + 128 + 32 * h));
        __m256i e0 = _mm256_or_si256(_mm256_and_si256(l0, low),
                                     _mm256_slli_epi16(_mm256_and_si256(hv, _mm256_set1_epi8(0x03)), 4));
        __m256i e1 = _mm256_or_si256(_mm256_and_si256(l1, low),
                                     _mm256_slli_epi16(_mm256_and_si256(hv, _mm256_set1_epi8(0x0c)), 2));
        __m256i e2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                     _mm256_and_si256(hv, _mm256_set1_epi8(0x30)));
        __m256i e3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                     _mm256_srli_epi16(_mm256_and_si256(hv, _mm256_set1_epi8((char)0xc0)), 2));
        _mm256_store_si256((__m256i *)(void *)(p->q + 128 * h), e0);
        _mm256_store_si256((__m256i *)(void *)(p->q + 128 * h + 32), e1);
        _mm256_store_si256((__m256i *)(void *)(p->q + 128 * h + 64), e2);
        _mm256_store_si256((__m256i *)(void *)(p->q + 128 * h + 96), e3);
    }
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(b + 192)));
    qp_scales16(p, sc16);
    _mm256_store_si256((__m256i *)(void *)p->c, _mm256_slli_epi16(sc16, 5));
    p->d = qp_h2f(b + 208), p->dm = 0;
}

/* Q2_K / Q3_K: the 2-bit fields of qs (element 128 h + 32 t + l at bits 2 t of qs[32 h
 * + l]) into q, plus Q3_K's high bits from hmask (bit 4 h + t of hmask[l], as 4). */
static inline void qp_q23_K(const uint8_t *qs, const uint8_t *hmask, tdm_kprep *p) {
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256i hm = hmask ? _mm256_loadu_si256((const __m256i *)(const void *)hmask) : _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * h));
        for (int t = 0; t < 4; t++) {
            __m256i e = _mm256_and_si256(_mm256_srli_epi16(v, 2 * t), three);
            if (hmask) e = _mm256_or_si256(e, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + t), one), 2));
            _mm256_store_si256((__m256i *)(void *)(p->q + 128 * h + 32 * t), e);
        }
    }
}

static inline void qp_q2_K(const uint8_t *b, tdm_kprep *p) {
    qp_q23_K(b + 16, NULL, p);
    __m128i s = _mm_loadu_si128((const __m128i *)(const void *)b);
    qp_scales16(p, _mm256_cvtepu8_epi16(_mm_and_si128(s, _mm_set1_epi8(15))));
    _mm256_store_si256((__m256i *)(void *)p->c, _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), _mm_set1_epi8(15))));
    p->d = qp_h2f(b + 80), p->dm = qp_h2f(b + 82);
}

static inline void qp_q3_K(const uint8_t *b, tdm_kprep *p) {
    qp_q23_K(b + 32, b, p);
    int8_t sc[16];
    tdm_k3_scales(b + 96, sc);
    __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(const void *)sc));
    qp_scales16(p, sc16);
    _mm256_store_si256((__m256i *)(void *)p->c, _mm256_slli_epi16(sc16, 2));
    p->d = qp_h2f(b + 108), p->dm = 0;
}

static inline __attribute__((always_inline)) void qp_kprep(const uint32_t type, const uint8_t *b, tdm_kprep *p) {
    switch (type) {
    case TDM_Q4_K: qp_q45_K(b, false, p); break;
    case TDM_Q5_K: qp_q45_K(b, true, p); break;
    case TDM_Q6_K: qp_q6_K(b, p); break;
    case TDM_Q2_K: qp_q2_K(b, p); break;
    default: qp_q3_K(b, p); break;
    }
}

/* A 32-element block's levels as 32 bytes (element order). */
static inline __attribute__((always_inline)) __m256i qp_q32(const uint32_t type, const uint8_t *b) {
    const bool has_m = type != TDM_Q5_0, five = type != TDM_Q4_1;
    const uint8_t *qh = b + (has_m ? 4 : 2), *qs = five ? qh + 4 : b + 4;
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)qs);
    const __m128i low = _mm_set1_epi8(15);
    __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
    if (five) { /* byte j = 0x10 where bit j of qh is set */
        uint32_t bits;
        memcpy(&bits, qh, 4);
        const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
        const __m256i mask = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
        __m256i by = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread), mask);
        q = _mm256_or_si256(q, _mm256_and_si256(_mm256_cmpeq_epi8(by, mask), _mm256_set1_epi8(0x10)));
    }
    return q;
}

#endif
