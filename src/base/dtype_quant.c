/* dtype_quant.c - Q4_1, Q5_0 and Q5_1 (32-element blocks; dtype.h): dequantisation
 * in the definitions' order of operations, and the reference quantisers (the scale
 * and offset from the block's extremes, values rounded to the nearest level). */
#include <float.h>
#include <math.h>

#include "dtype_quant.h"

/* The 5th bit of element j of a Q5 block's qh. */
static inline int q5_high(const uint8_t qh[4], int j) { return (qh[j / 8] >> (j % 8)) & 1; }

/* Element j's 4 low bits in a 16-byte nibble array (j < 16 low nibbles, else high). */
static inline int nib(const uint8_t qs[16], int j) { return j < 16 ? qs[j] & 15 : qs[j - 16] >> 4; }

bool tdm_qrow_to_f32(uint32_t type, const void *src, float *dst, int64_t n) {
    const uint8_t *s = src;
    switch (type) {
    case TDM_Q4_1:
        for (int64_t b = 0; b < n / TDM_QK; b++, dst += TDM_QK) {
            tdm_block_q4_1 k;
            memcpy(&k, s + b * sizeof k, sizeof k);
            float d = tdm_f16_to_f32(k.d), m = tdm_f16_to_f32(k.m);
            for (int j = 0; j < TDM_QK; j++) dst[j] = (float)nib(k.qs, j) * d + m;
        }
        return true;
    case TDM_Q5_0:
        for (int64_t b = 0; b < n / TDM_QK; b++, dst += TDM_QK) {
            tdm_block_q5_0 k;
            memcpy(&k, s + b * sizeof k, sizeof k);
            float d = tdm_f16_to_f32(k.d);
            for (int j = 0; j < TDM_QK; j++) dst[j] = (float)((nib(k.qs, j) | (q5_high(k.qh, j) << 4)) - 16) * d;
        }
        return true;
    case TDM_Q5_1:
        for (int64_t b = 0; b < n / TDM_QK; b++, dst += TDM_QK) {
            tdm_block_q5_1 k;
            memcpy(&k, s + b * sizeof k, sizeof k);
            float d = tdm_f16_to_f32(k.d), m = tdm_f16_to_f32(k.m);
            for (int j = 0; j < TDM_QK; j++) dst[j] = (float)(nib(k.qs, j) | (q5_high(k.qh, j) << 4)) * d + m;
        }
        return true;
    default:
        return false;
    }
}

/* Round half up, clamped to [0, hi] (NaN to 0). */
static inline int level(float v, int hi) {
    float r = floorf(v + 0.5f);
    return r >= (float)hi ? hi : r > 0 ? (int)r : 0;
}

/* Packs levels q[32] (< 16, or < 32 with qh) into a block's nibbles and high bits. */
static void pack_nibbles(const int q[TDM_QK], uint8_t qs[16], uint8_t *qh) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
    if (qh) {
        memset(qh, 0, 4);
        for (int j = 0; j < TDM_QK; j++) qh[j / 8] |= (uint8_t)(((q[j] >> 4) & 1) << (j % 8));
    }
}

/* Asymmetric block (Q4_1, Q5_1): levels 0..nmax spanning [min, max]. */
static void quant_min_max(const float *x, int nmax, uint16_t *dh, uint16_t *mh, int q[TDM_QK]) {
    float mn = FLT_MAX, mx = -FLT_MAX;
    for (int j = 0; j < TDM_QK; j++) {
        mn = fminf(mn, x[j]);
        mx = fmaxf(mx, x[j]);
    }
    float d = (mx - mn) / (float)nmax, id = d != 0.0f ? 1.0f / d : 0.0f;
    *dh = tdm_f32_to_f16(d);
    *mh = tdm_f32_to_f16(mn);
    for (int j = 0; j < TDM_QK; j++) q[j] = level((x[j] - mn) * id, nmax);
}

bool tdm_qrow_from_f32(uint32_t type, const float *src, void *dst, int64_t n) {
    uint8_t *o = dst;
    int q[TDM_QK];
    switch (type) {
    case TDM_Q4_1:
        for (int64_t b = 0; b < n / TDM_QK; b++) {
            tdm_block_q4_1 k;
            quant_min_max(src + b * TDM_QK, 15, &k.d, &k.m, q);
            pack_nibbles(q, k.qs, NULL);
            memcpy(o + b * sizeof k, &k, sizeof k);
        }
        return true;
    case TDM_Q5_1:
        for (int64_t b = 0; b < n / TDM_QK; b++) {
            tdm_block_q5_1 k;
            quant_min_max(src + b * TDM_QK, 31, &k.d, &k.m, q);
            pack_nibbles(q, k.qs, k.qh);
            memcpy(o + b * sizeof k, &k, sizeof k);
        }
        return true;
    case TDM_Q5_0:
        for (int64_t b = 0; b < n / TDM_QK; b++) {
            const float *x = src + b * TDM_QK;
            float amax = 0, max = 0; /* the value of largest magnitude maps to level 0 */
            for (int j = 0; j < TDM_QK; j++)
                if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
            float d = max / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            tdm_block_q5_0 k;
            k.d = tdm_f32_to_f16(d);
            for (int j = 0; j < TDM_QK; j++) q[j] = level(x[j] * id + 16.0f, 31);
            pack_nibbles(q, k.qs, k.qh);
            memcpy(o + b * sizeof k, &k, sizeof k);
        }
        return true;
    default:
        return false;
    }
}
