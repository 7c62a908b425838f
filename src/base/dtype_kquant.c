/* dtype_kquant.c - the K-quants (super-blocks of TDM_QK_K = 256 elements, as GGUF
 * defines them; dtype.h has the structs): dequantisation and reference quantisers.
 *
 * Element e of a super-block (e < 256), by type:
 *   Q2_K  q = (qs[32 (e / 128) + e % 32] >> 2 ((e % 128) / 32)) & 3, sub-block s = e / 16:
 *         x = (d * (scales[s] & 15)) * q - (dmin * (scales[s] >> 4))
 *   Q3_K  q = Q2_K's 2 bits | bit (e / 32) of hmask[e % 32] << 2, s = e / 16, sc = the
 *         6-bit scale s less 32 (tdm_k3_scales):  x = (d * sc) * (q - 4)
 *   Q4_K  q = nibble of qs[32 (e / 64) + e % 32] (low when e % 64 < 32), s = e / 32,
 *         (sc, m) = tdm_k4_scales s:  x = (d * sc) * q - (dmin * m)
 *   Q5_K  q = Q4_K's nibble | bit (e / 32) of qh[e % 32] << 4, otherwise as Q4_K
 *   Q6_K  with h = e / 128, t = (e % 128) / 32, l = e % 32: q = nibble of ql[64 h + 32 (t
 *         & 1) + l] (low for t < 2) | ((qh[32 h + l] >> 2 t) & 3) << 4, s = e / 16:
 *         x = (d * scales[s]) * (q - 32)
 *
 * Quantisation (the usual per-block error minimisation): each sub-block gets the
 * scale (and, for the types with mins, the offset) of least weighted squared error
 * over a small grid of candidate scales, each candidate's quants refitted by least
 * squares; the sub-block scales are then quantised under the super-block's f16
 * scale, and the values re-rounded with the scales as stored.
 */
#include <math.h>

#include "dtype_quant.h"

/* ---- dequantisation ---------------------------------------------------------------- */

static void deq_q2_K(const tdm_block_q2_K *b, float *y) {
    float d = tdm_f16_to_f32(b->d), dmin = tdm_f16_to_f32(b->dmin);
    for (int e = 0; e < TDM_QK_K; e++) {
        int q = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        uint8_t s = b->scales[e / 16];
        float dl = d * (float)(s & 15), ml = dmin * (float)(s >> 4);
        y[e] = dl * (float)q - ml;
    }
}

static void deq_q3_K(const tdm_block_q3_K *b, float *y) {
    float d = tdm_f16_to_f32(b->d);
    int8_t sc[16];
    tdm_k3_scales(b->scales, sc);
    for (int e = 0; e < TDM_QK_K; e++) {
        int q = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        q |= ((b->hmask[e % 32] >> (e / 32)) & 1) << 2;
        float dl = d * (float)sc[e / 16];
        y[e] = dl * (float)(q - 4);
    }
}

static void deq_q45_K(const uint8_t *scales, const uint8_t *qs, const uint8_t *qh, uint16_t dh, uint16_t mh,
                      float *y) {
    float d = tdm_f16_to_f32(dh), dmin = tdm_f16_to_f32(mh);
    uint8_t sc[8], m[8];
    tdm_k4_scales(scales, sc, m);
    for (int s = 0; s < 8; s++) {
        float d1 = d * (float)sc[s], m1 = dmin * (float)m[s];
        for (int l = 0; l < 32; l++) {
            int e = 32 * s + l;
            uint8_t byte = qs[32 * (s / 2) + l];
            int q = s % 2 ? byte >> 4 : byte & 15;
            if (qh) q |= ((qh[l] >> s) & 1) << 4;
            y[e] = d1 * (float)q - m1;
        }
    }
}

static void deq_q6_K(const tdm_block_q6_K *b, float *y) {
    float d = tdm_f16_to_f32(b->d);
    for (int e = 0; e < TDM_QK_K; e++) {
        int h = e / 128, t = (e % 128) / 32, l = e % 32;
        uint8_t byte = b->ql[64 * h + 32 * (t & 1) + l];
        int q = (t < 2 ? byte & 15 : byte >> 4) | (((b->qh[32 * h + l] >> (2 * t)) & 3) << 4);
        float dl = d * (float)b->scales[e / 16];
        y[e] = dl * (float)(q - 32);
    }
}

/* Per super-block wrappers of the raw bytes (copied into the struct: rows need not
 * be aligned). */
static void deq_q2_K_raw(const uint8_t *p, float *y) {
    tdm_block_q2_K b;
    memcpy(&b, p, sizeof b);
    deq_q2_K(&b, y);
}
static void deq_q3_K_raw(const uint8_t *p, float *y) {
    tdm_block_q3_K b;
    memcpy(&b, p, sizeof b);
    deq_q3_K(&b, y);
}
static void deq_q4_K_raw(const uint8_t *p, float *y) {
    tdm_block_q4_K b;
    memcpy(&b, p, sizeof b);
    deq_q45_K(b.scales, b.qs, NULL, b.d, b.dmin, y);
}
static void deq_q5_K_raw(const uint8_t *p, float *y) {
    tdm_block_q5_K b;
    memcpy(&b, p, sizeof b);
    deq_q45_K(b.scales, b.qs, b.qh, b.d, b.dmin, y);
}
static void deq_q6_K_raw(const uint8_t *p, float *y) {
    tdm_block_q6_K b;
    memcpy(&b, p, sizeof b);
    deq_q6_K(&b, y);
}

bool tdm_krow_to_f32(uint32_t type, const void *src, float *y, int64_t n) {
    void (*f)(const uint8_t *, float *) = NULL;
    switch (type) {
    case TDM_Q2_K: f = deq_q2_K_raw; break;
    case TDM_Q3_K: f = deq_q3_K_raw; break;
    case TDM_Q4_K: f = deq_q4_K_raw; break;
    case TDM_Q5_K: f = deq_q5_K_raw; break;
    case TDM_Q6_K: f = deq_q6_K_raw; break;
    default: return false;
    }
    const size_t bb = tdm_dtype_block_bytes(type);
    for (int64_t i = 0; i < n / TDM_QK_K; i++) f((const uint8_t *)src + (size_t)i * bb, y + i * TDM_QK_K);
    return true;
}

/* ---- sub-block fits ------------------------------------------------------------------ */

/* Nearest integer (ties to even, in the default rounding mode), clamped to [lo, hi];
 * NaN gives lo.  (|v| < 2^22 once clamped: adding and removing 1.5 * 2^23 rounds.) */
static inline int iround(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo;
    if (v >= (float)hi) return hi;
    float t = v + 12582912.0f; /* (IEEE arithmetic: the compiler keeps both steps) */
    return (int)(t - 12582912.0f);
}

/* Sub-blocks of n values x quantised as scale * L + off, L in [0, nmax], off <= 0,
 * weights w: for candidate inverse scales (nmax + r0 + dr * k) / (max - min), k =
 * 0..steps (min = min(x, 0)), the levels rounded, then (scale, off) refitted by
 * weighted least squares (off clamped to 0 when positive); keeps the candidate of
 * least weighted squared error.  Returns scale, *neg_off = -off >= 0, L set. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L, float *neg_off,
                           float r0, float dr, int steps) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < n; i++) mn = x[i] < mn ? x[i] : mn, mx = x[i] > mx ? x[i] : mx;
    if (mn > 0) mn = 0;
    if (!(mx > mn)) { /* constant (or NaN) */
        memset(L, 0, (size_t)n);
        *neg_off = isfinite(mn) ? -mn : 0.0f;
        return 0.0f;
    }
    float best_scale = (mx - mn) / (float)nmax, best_off = mn, best_err = INFINITY;
    {
        float is = (float)nmax / (mx - mn), err = 0;
        for (int i = 0; i < n; i++) {
            L[i] = (uint8_t)iround(is * (x[i] - mn), 0, nmax);
            float e = best_scale * L[i] + mn - x[i];
            err += w[i] * e * e;
        }
        best_err = err;
    }
    uint8_t cand[32];
    for (int k = 0; k <= steps; k++) {
        float is = ((float)nmax + r0 + dr * (float)k) / (mx - mn);
        float sw = 0, sl = 0, sl2 = 0, sx = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            int l = iround(is * (x[i] - mn), 0, nmax);
            cand[i] = (uint8_t)l;
            sw += w[i], sl += w[i] * l, sl2 += w[i] * l * l, sx += w[i] * x[i], sxl += w[i] * l * x[i];
        }
        float det = sw * sl2 - sl * sl;
        if (!(det > 0)) continue;
        float scale = (sw * sxl - sx * sl) / det, off = (sl2 * sx - sl * sxl) / det;
        if (off > 0) off = 0, scale = sxl / sl2;
        float err = 0;
        for (int i = 0; i < n; i++) {
            float e = scale * cand[i] + off - x[i];
            err += w[i] * e * e;
        }
        if (err < best_err) {
            best_err = err, best_scale = scale, best_off = off;
            memcpy(L, cand, (size_t)n);
        }
    }
    *neg_off = -best_off;
    return best_scale;
}

/* Sub-blocks quantised symmetrically as scale * l, l in [-nmax, nmax - 1], weights
 * x^2: candidate inverse scales -(nmax + 0.1 k) / v, k = -9..9, v the value of
 * largest magnitude; for each the least-squares scale of its levels; keeps the
 * candidate of least weighted error.  Returns the scale (0 for an all-zero block). */
static float fit_scale_sym(int n, int nmax, const float *x) {
    float amax = 0, v = 0;
    for (int i = 0; i < n; i++)
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]), v = x[i];
    if (!(amax > 1e-15f) || !isfinite(amax)) return 0.0f;
    float best = -1, best_scale = -v / (float)nmax;
    for (int k = -9; k <= 9; k++) {
        float is = -((float)nmax + 0.1f * (float)k) / v, sxl = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            int l = iround(is * x[i], -nmax, nmax - 1);
            float w = x[i] * x[i];
            sxl += w * x[i] * l, sl2 += w * l * l;
        }
        /* error = sum w x^2 - sxl^2 / sl2: the largest sxl^2 / sl2 wins */
        if (sl2 > 0 && sxl * sxl / sl2 > best) best = sxl * sxl / sl2, best_scale = sxl / sl2;
    }
    return best_scale;
}

/* ---- quantisers ---------------------------------------------------------------------- */

static void quant_q2_K(const float *x, tdm_block_q2_K *b) {
    float scale[16], off[16], w[16];
    uint8_t L[TDM_QK_K];
    float max_scale = 0, max_off = 0;
    for (int s = 0; s < 16; s++) {
        for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * s + l]);
        scale[s] = fit_scale_min(16, 3, x + 16 * s, w, L + 16 * s, &off[s], -0.5f, 0.1f, 15);
        max_scale = fmaxf(max_scale, scale[s]);
        max_off = fmaxf(max_off, off[s]);
    }
    memset(b, 0, sizeof *b);
    b->d = tdm_f32_to_f16(max_scale / 15.0f);
    b->dmin = tdm_f32_to_f16(max_off / 15.0f);
    for (int s = 0; s < 16; s++) {
        int ls = max_scale > 0 ? iround(scale[s] * 15.0f / max_scale, 0, 15) : 0;
        int lm = max_off > 0 ? iround(off[s] * 15.0f / max_off, 0, 15) : 0;
        b->scales[s] = (uint8_t)(ls | (lm << 4));
        float d = tdm_f16_to_f32(b->d) * (float)ls, m = tdm_f16_to_f32(b->dmin) * (float)lm;
        for (int l = 0; l < 16; l++) L[16 * s + l] = d != 0.0f ? (uint8_t)iround((x[16 * s + l] + m) / d, 0, 3) : 0;
    }
    for (int e = 0; e < TDM_QK_K; e++) b->qs[32 * (e / 128) + e % 32] |= (uint8_t)(L[e] << (2 * ((e % 128) / 32)));
}

static void quant_q3_K(const float *x, tdm_block_q3_K *b) {
    float scale[16], max_scale = 0;
    for (int s = 0; s < 16; s++) {
        scale[s] = fit_scale_sym(16, 4, x + 16 * s);
        if (fabsf(scale[s]) > fabsf(max_scale)) max_scale = scale[s];
    }
    memset(b, 0, sizeof *b);
    float is = max_scale != 0.0f ? -32.0f / max_scale : 0.0f;
    b->d = tdm_f32_to_f16(max_scale != 0.0f ? 1.0f / is : 0.0f);
    for (int s = 0; s < 16; s++) {
        int v = iround(is * scale[s], -32, 31) + 32;
        b->scales[s % 8] |= (uint8_t)((v & 15) << (s < 8 ? 0 : 4));
        b->scales[8 + s % 4] |= (uint8_t)((v >> 4) << (2 * (s / 4)));
    }
    int8_t sc[16];
    tdm_k3_scales(b->scales, sc);
    for (int e = 0; e < TDM_QK_K; e++) {
        float d = tdm_f16_to_f32(b->d) * (float)sc[e / 16];
        int q = d != 0.0f ? iround(x[e] / d, -4, 3) + 4 : 4;
        b->qs[32 * (e / 128) + e % 32] |= (uint8_t)((q & 3) << (2 * ((e % 128) / 32)));
        b->hmask[e % 32] |= (uint8_t)((q >> 2) << (e / 32));
    }
}

/* Q4_K (qh NULL, nmax 15) and Q5_K (nmax 31). */
static void quant_q45_K(const float *x, int nmax, uint16_t *dh, uint16_t *mh, uint8_t scales[12], uint8_t qs[128],
                        uint8_t *qh) {
    float scale[8], off[8], w[32];
    uint8_t L[TDM_QK_K];
    float max_scale = 0, max_off = 0;
    for (int s = 0; s < 8; s++) {
        const float *xs = x + 32 * s;
        float ss = 0;
        for (int l = 0; l < 32; l++) ss += xs[l] * xs[l];
        float rms = sqrtf(ss / 32);
        for (int l = 0; l < 32; l++) w[l] = rms + fabsf(xs[l]);
        scale[s] = nmax == 15 ? fit_scale_min(32, nmax, xs, w, L + 32 * s, &off[s], -1.0f, 0.1f, 20)
                              : fit_scale_min(32, nmax, xs, w, L + 32 * s, &off[s], -0.5f, 0.1f, 15);
        max_scale = fmaxf(max_scale, scale[s]);
        max_off = fmaxf(max_off, off[s]);
    }
    uint8_t ls[8], lm[8];
    for (int s = 0; s < 8; s++) {
        ls[s] = (uint8_t)(max_scale > 0 ? iround(scale[s] * 63.0f / max_scale, 0, 63) : 0);
        lm[s] = (uint8_t)(max_off > 0 ? iround(off[s] * 63.0f / max_off, 0, 63) : 0);
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((ls[j + 4] & 15) | ((lm[j + 4] & 15) << 4));
    }
    *dh = tdm_f32_to_f16(max_scale / 63.0f);
    *mh = tdm_f32_to_f16(max_off / 63.0f);
    memset(qs, 0, 128);
    if (qh) memset(qh, 0, 32);
    for (int s = 0; s < 8; s++) {
        float d = tdm_f16_to_f32(*dh) * (float)ls[s], m = tdm_f16_to_f32(*mh) * (float)lm[s];
        for (int l = 0; l < 32; l++) {
            int q = d != 0.0f ? iround((x[32 * s + l] + m) / d, 0, nmax) : 0;
            qs[32 * (s / 2) + l] |= (uint8_t)((q & 15) << (s % 2 ? 4 : 0));
            if (qh) qh[l] |= (uint8_t)((q >> 4) << s);
        }
    }
}

static void quant_q6_K(const float *x, tdm_block_q6_K *b) {
    float scale[16], max_scale = 0;
    for (int s = 0; s < 16; s++) {
        scale[s] = fit_scale_sym(16, 32, x + 16 * s);
        if (fabsf(scale[s]) > fabsf(max_scale)) max_scale = scale[s];
    }
    memset(b, 0, sizeof *b);
    if (max_scale == 0.0f) return; /* all zero: d = 0 */
    float is = -128.0f / max_scale;
    b->d = tdm_f32_to_f16(1.0f / is);
    for (int s = 0; s < 16; s++) b->scales[s] = (int8_t)iround(is * scale[s], -128, 127);
    for (int e = 0; e < TDM_QK_K; e++) {
        float d = tdm_f16_to_f32(b->d) * (float)b->scales[e / 16];
        int q = d != 0.0f ? iround(x[e] / d, -32, 31) + 32 : 32;
        int h = e / 128, t = (e % 128) / 32, l = e % 32;
        b->ql[64 * h + 32 * (t & 1) + l] |= (uint8_t)((q & 15) << (t < 2 ? 0 : 4));
        b->qh[32 * h + l] |= (uint8_t)((q >> 4) << (2 * t));
    }
}

static void quant_q2_K_raw(const float *x, uint8_t *o) {
    tdm_block_q2_K b;
    quant_q2_K(x, &b);
    memcpy(o, &b, sizeof b);
}
static void quant_q3_K_raw(const float *x, uint8_t *o) {
    tdm_block_q3_K b;
    quant_q3_K(x, &b);
    memcpy(o, &b, sizeof b);
}
static void quant_q4_K_raw(const float *x, uint8_t *o) {
    tdm_block_q4_K b;
    quant_q45_K(x, 15, &b.d, &b.dmin, b.scales, b.qs, NULL);
    memcpy(o, &b, sizeof b);
}
static void quant_q5_K_raw(const float *x, uint8_t *o) {
    tdm_block_q5_K b;
    quant_q45_K(x, 31, &b.d, &b.dmin, b.scales, b.qs, b.qh);
    memcpy(o, &b, sizeof b);
}
static void quant_q6_K_raw(const float *x, uint8_t *o) {
    tdm_block_q6_K b;
    quant_q6_K(x, &b);
    memcpy(o, &b, sizeof b);
}

bool tdm_krow_from_f32(uint32_t type, const float *src, void *dst, int64_t n) {
    void (*f)(const float *, uint8_t *) = NULL;
    switch (type) {
    case TDM_Q2_K: f = quant_q2_K_raw; break;
    case TDM_Q3_K: f = quant_q3_K_raw; break;
    case TDM_Q4_K: f = quant_q4_K_raw; break;
    case TDM_Q5_K: f = quant_q5_K_raw; break;
    case TDM_Q6_K: f = quant_q6_K_raw; break;
    default: return false;
    }
    const size_t bb = tdm_dtype_block_bytes(type);
    for (int64_t i = 0; i < n / TDM_QK_K; i++) f(src + i * TDM_QK_K, (uint8_t *)dst + (size_t)i * bb);
    return true;
}
