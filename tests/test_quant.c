/* test_quant.c - the quantised types' formats (dtype.h): dequantisation bit-exact
 * against a plain reference written here from the GGUF block definitions (byte
 * offsets, not the project's structs), on random blocks with extreme f16 scales;
 * quantise -> dequantise error bounds and their order across types; odd inputs
 * (zeros, constants, huge and tiny values); row sizes and the loader's message for
 * a row that is not a whole number of blocks. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gguf.h"
#include "gguf_write.h"
#include "quantize.h"
#include "testutil.h"

/* ---- the reference, from the block definitions ------------------------------------ */

static float h2f(const uint8_t *p) {
    uint16_t h = (uint16_t)(p[0] | (p[1] << 8));
    return tdm_f16_to_f32(h);
}

/* Q4_1 {d, m, qs[16]}, Q5_0 {d, qh[4], qs[16]}, Q5_1 {d, m, qh[4], qs[16]}:
 * byte j of qs holds element j (low nibble) and j + 16 (high nibble); bit j of the
 * little-endian u32 qh is element j's fifth bit. */
static void ref_q4_1(const uint8_t *b, float *y) {
    float d = h2f(b), m = h2f(b + 2);
    for (int j = 0; j < 16; j++) {
        int lo = b[4 + j] & 0x0F, hi = b[4 + j] >> 4;
        y[j] = lo * d + m;
        y[j + 16] = hi * d + m;
    }
}

static void ref_q5(const uint8_t *b, float *y, bool with_min) {
    float d = h2f(b), m = with_min ? h2f(b + 2) : 0.0f;
    const uint8_t *qh = b + (with_min ? 4 : 2), *qs = qh + 4;
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0x0F) | (int)(((h >> j) & 1) << 4);
        int x1 = (qs[j] >> 4) | (int)(((h >> (j + 16)) & 1) << 4);
        if (with_min) {
            y[j] = x0 * d + m;
            y[j + 16] = x1 * d + m;
        } else {
            y[j] = (x0 - 16) * d;
            y[j + 16] = (x1 - 16) * d;
        }
    }
}

/* Q2_K {scales[16], qs[64], d, dmin}: per 128 elements 32 bytes of qs, shifted 0,
 * 2, 4, 6 for 4 runs of 32; each run of 16 its own scale byte (scale low nibble,
 * min high nibble). */
static void ref_q2_K(const uint8_t *b, float *y) {
    const uint8_t *sc = b, *q = b + 16;
    float d = h2f(b + 80), dmin = h2f(b + 82);
    int is = 0;
    for (int half = 0; half < 2; half++, q += 32)
        for (int shift = 0; shift < 8; shift += 2)
            for (int part = 0; part < 2; part++, is++) {
                float dl = d * (sc[is] & 0xF), ml = dmin * (sc[is] >> 4);
                for (int l = 0; l < 16; l++) *y++ = dl * ((q[16 * part + l] >> shift) & 3) - ml;
            }
}

/* Q3_K {hmask[32], qs[64], scales[12], d}: qs as Q2_K; the high bit from hmask, bit
 * m of hmask[l] for the m-th run of 32; 16 6-bit scales: the low nibbles of bytes
 * 0-7 (scales 0-7) and their high nibbles (8-15), the top 2 bits from bytes 8-11,
 * 2 bits per scale group of 4; value = scale - 32. */
static void ref_q3_K(const uint8_t *b, float *y) {
    const uint8_t *hm = b, *q = b + 32, *s = b + 96;
    float d = h2f(b + 108);
    int sc[16];
    for (int i = 0; i < 8; i++) {
        sc[i] = s[i] & 0xF;
        sc[i + 8] = s[i] >> 4;
    }
    for (int i = 0; i < 16; i++) sc[i] |= ((s[8 + (i & 3)] >> (2 * (i >> 2))) & 3) << 4;
    int is = 0, m = 0;
    for (int half = 0; half < 2; half++, q += 32)
        for (int shift = 0; shift < 8; shift += 2, m++)
            for (int part = 0; part < 2; part++, is++) {
                float dl = d * (sc[is] - 32);
                for (int l = 0; l < 16; l++) {
                    int k = 16 * part + l;
                    int v = ((q[k] >> shift) & 3) - (((hm[k] >> m) & 1) ? 0 : 4);
                    *y++ = dl * v;
                }
            }
}

/* Q4_K / Q5_K scale j and min j from the 12 bytes: j < 4: bytes j and j + 4, low 6
 * bits; j >= 4: the nibbles of byte j + 4 plus the top 2 bits of bytes j - 4 and j. */
static void ref_k4_scale(int j, const uint8_t *s, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K {d, dmin, scales[12], qs[128]}, Q5_K {d, dmin, scales[12], qh[32], qs[128]}:
 * per 64 elements 32 bytes of qs, low nibbles then high nibbles, two sub-blocks of
 * 32; Q5_K's fifth bits: bits 2i and 2i + 1 of qh[l] for the i-th 64. */
static void ref_q45_K(const uint8_t *b, float *y, bool five) {
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *s = b + 4, *qh = b + 16, *q = b + (five ? 48 : 16);
    for (int i = 0; i < 4; i++, q += 32) {
        int sc, mn;
        ref_k4_scale(2 * i, s, &sc, &mn);
        float d1 = d * sc, m1 = dmin * mn;
        ref_k4_scale(2 * i + 1, s, &sc, &mn);
        float d2 = d * sc, m2 = dmin * mn;
        for (int l = 0; l < 32; l++) *y++ = d1 * ((q[l] & 0xF) + (five && (qh[l] >> (2 * i)) & 1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * ((q[l] >> 4) + (five && (qh[l] >> (2 * i + 1)) & 1 ? 16 : 0)) - m2;
    }
}

/* Q6_K {ql[128], qh[64], scales[16] (int8), d}: per 128 elements 64 bytes of ql and
 * 32 of qh: element l, l + 32, l + 64, l + 96 from the low nibble of ql[l], of
 * ql[l + 32], the high nibble of ql[l], of ql[l + 32], with bits 0-1, 2-3, 4-5, 6-7 of
 * qh[l] on top; minus 32; scale per 16. */
static void ref_q6_K(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = h2f(b + 208);
    for (int half = 0; half < 2; half++, ql += 64, qh += 32, sc += 8, y += 128)
        for (int l = 0; l < 32; l++) {
            int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[l / 16] * q1;
            y[l + 32] = d * sc[l / 16 + 2] * q2;
            y[l + 64] = d * sc[l / 16 + 4] * q3;
            y[l + 96] = d * sc[l / 16 + 6] * q4;
        }
}

typedef struct qtype {
    uint32_t type;
    int elems, bytes;
    int scale_off[2]; /* byte offsets of the f16 scale fields (-1: none) */
    void (*ref)(const uint8_t *b, float *y);
} qtype;

static void ref_q5_0(const uint8_t *b, float *y) { ref_q5(b, y, false); }
static void ref_q5_1(const uint8_t *b, float *y) { ref_q5(b, y, true); }
static void ref_q4_K(const uint8_t *b, float *y) { ref_q45_K(b, y, false); }
static void ref_q5_K(const uint8_t *b, float *y) { ref_q45_K(b, y, true); }

static const qtype qtypes[] = {
    {TDM_Q4_1, 32, 20, {0, 2}, ref_q4_1},    {TDM_Q5_0, 32, 22, {0, -1}, ref_q5_0},
    {TDM_Q5_1, 32, 24, {0, 2}, ref_q5_1},    {TDM_Q2_K, 256, 84, {80, 82}, ref_q2_K},
    {TDM_Q3_K, 256, 110, {108, -1}, ref_q3_K}, {TDM_Q4_K, 256, 144, {0, 2}, ref_q4_K},
    {TDM_Q5_K, 256, 176, {0, 2}, ref_q5_K},  {TDM_Q6_K, 256, 210, {208, -1}, ref_q6_K},
};

/* f16 scales that stress the arithmetic: zero, negative zero, the smallest and the
 * largest subnormal, the smallest normal, one, the largest finite, negatives. */
static const uint16_t extreme_h[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x0400, 0x3c00, 0x7bff, 0xfbff, 0x8001, 0xbc00};

static uint16_t random_finite_h(uint64_t *rng) {
    uint16_t h;
    do h = (uint16_t)tdm_test_rand(rng);
    while (((h >> 10) & 0x1f) == 0x1f);
    return h;
}

Test(quant, sizes_and_names) {
    for (size_t t = 0; t < TDM_ARRAY_LEN(qtypes); t++) {
        const qtype *q = &qtypes[t];
        cr_assert(tdm_dtype_supported(q->type));
        cr_assert_eq(tdm_dtype_block_elems(q->type), (uint32_t)q->elems, "%s", tdm_dtype_name(q->type));
        cr_assert_eq(tdm_dtype_block_bytes(q->type), (uint32_t)q->bytes, "%s", tdm_dtype_name(q->type));
        uint64_t rb;
        cr_assert(tdm_dtype_row_bytes(q->type, (uint64_t)q->elems * 3, &rb));
        cr_assert_eq(rb, (uint64_t)q->bytes * 3);
        cr_assert_not(tdm_dtype_row_bytes(q->type, (uint64_t)q->elems * 3 + 16, &rb));
        cr_assert_neq(strcmp(tdm_dtype_name(q->type), "unknown"), 0);
    }
    cr_assert_not(tdm_dtype_supported(15)); /* Q8_K: not a weight type */
    cr_assert_not(tdm_dtype_supported(16)); /* IQ2_XXS */
}

/* Random blocks (random bytes, the scale fields set to each extreme and to random
 * finite values): tdm_row_to_f32 equals the reference bit for bit. */
Test(quant, dequant_bit_exact) {
    uint64_t rng = 42;
    for (size_t t = 0; t < TDM_ARRAY_LEN(qtypes); t++) {
        const qtype *q = &qtypes[t];
        const int nb = 64;
        uint8_t *blk = malloc((size_t)nb * q->bytes);
        float *got = malloc((size_t)nb * q->elems * 4), *want = malloc((size_t)nb * q->elems * 4);
        size_t n_ext = TDM_ARRAY_LEN(extreme_h);
        for (int round = 0; round < 8; round++) {
            for (int i = 0; i < nb * q->bytes; i++) blk[i] = (uint8_t)tdm_test_rand(&rng);
            for (int b = 0; b < nb; b++)
                for (int f = 0; f < 2; f++) {
                    if (q->scale_off[f] < 0) continue;
                    uint16_t h = (b + round + f) % 3 == 0 ? random_finite_h(&rng)
                                                          : extreme_h[(size_t)(b * 3 + f + round) % n_ext];
                    blk[b * q->bytes + q->scale_off[f]] = (uint8_t)h;
                    blk[b * q->bytes + q->scale_off[f] + 1] = (uint8_t)(h >> 8);
                }
            tdm_row_to_f32(q->type, blk, got, (int64_t)nb * q->elems);
            for (int b = 0; b < nb; b++) q->ref(blk + b * q->bytes, want + b * q->elems);
            for (int i = 0; i < nb * q->elems; i++) {
                uint32_t a, c;
                memcpy(&a, &got[i], 4);
                memcpy(&c, &want[i], 4);
                cr_assert_eq(a, c, "%s block %d element %d: %a vs reference %a", tdm_dtype_name(q->type),
                             i / q->elems, i % q->elems, (double)got[i], (double)want[i]);
            }
        }
        /* element access through a weight view of the rows layout agrees */
        for (int k = 0; k < 3 * q->elems; k += 7)
            cr_assert_eq(tdm_weight_elem(q->type, TDM_LAYOUT_ROWS, 3 * q->elems, (size_t)3 * q->bytes, blk, 1, k),
                         want[3 * q->elems + k]);
        free(blk);
        free(got);
        free(want);
    }
}

/* ---- quantisation ----------------------------------------------------------------- */

static double gauss(uint64_t *rng) {
    double u = (tdm_test_randu(rng) + 1e-12), v = tdm_test_randu(rng);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* ||dequant(quant(x)) - x|| / ||x|| of rows of n elements. */
static double roundtrip_err(uint32_t type, const float *x, int64_t n) {
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(type, (uint64_t)n, &rb));
    uint8_t *q = malloc((size_t)rb);
    float *y = malloc((size_t)n * 4);
    tdm_row_from_f32(type, x, q, n);
    tdm_row_to_f32(type, q, y, n);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        cr_assert(isfinite(y[i]), "%s: element %lld not finite", tdm_dtype_name(type), (long long)i);
        num += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        den += (double)x[i] * x[i];
    }
    free(q);
    free(y);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Gaussian rows (with a few outliers, as real weights have): every type within its
 * bound, more bits never worse, each K-quant better than the 32-element type of its
 * width. */
Test(quant, roundtrip_error_bounds_and_order) {
    const int64_t n = 256 * 64;
    float *x = malloc((size_t)n * 4);
    uint64_t rng = 7;
    for (int64_t i = 0; i < n; i++) x[i] = (float)(0.02 * gauss(&rng) * (i % 97 == 0 ? 8 : 1));
    static const struct { uint32_t type; double bound; } b[] = {
        {TDM_Q2_K, 0.45}, {TDM_Q3_K, 0.25}, {TDM_Q4_0, 0.15}, {TDM_Q4_1, 0.14}, {TDM_Q4_K, 0.10},
        {TDM_Q5_0, 0.075}, {TDM_Q5_1, 0.07}, {TDM_Q5_K, 0.05}, {TDM_Q6_K, 0.035}, {TDM_Q8_0, 0.012},
    };
    double e[TDM_ARRAY_LEN(b)];
    for (size_t t = 0; t < TDM_ARRAY_LEN(b); t++) {
        e[t] = roundtrip_err(b[t].type, x, n);
        cr_log_info("%s: normalised error %.4f", tdm_dtype_name(b[t].type), e[t]);
        cr_expect(e[t] < b[t].bound, "%s: error %.4f over %.3f", tdm_dtype_name(b[t].type), e[t], b[t].bound);
    }
    for (size_t t = 1; t < TDM_ARRAY_LEN(b); t++)
        cr_expect(e[t] < e[t - 1], "%s (%.4f) not better than %s (%.4f)", tdm_dtype_name(b[t].type), e[t],
                  tdm_dtype_name(b[t - 1].type), e[t - 1]);
    free(x);
}

static const uint32_t all_q[] = {TDM_Q4_0, TDM_Q4_1, TDM_Q5_0, TDM_Q5_1, TDM_Q8_0,
                                 TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};

/* Zeros come back as zeros; constant, huge (f16 range), tiny (f16 subnormal range)
 * and one-hot rows come back finite and close. */
Test(quant, odd_inputs) {
    const int64_t n = 512;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    uint8_t *q = malloc((size_t)n * 2);
    for (size_t t = 0; t < TDM_ARRAY_LEN(all_q); t++) {
        uint32_t ty = all_q[t];
        const char *nm = tdm_dtype_name(ty);
        for (int64_t i = 0; i < n; i++) x[i] = 0;
        tdm_row_from_f32(ty, x, q, n);
        tdm_row_to_f32(ty, q, y, n);
        for (int64_t i = 0; i < n; i++) cr_assert_eq(y[i], 0.0f, "%s zeros: %g at %lld", nm, y[i], (long long)i);
        uint64_t rng = 3 + t;
        const float scales[] = {1.0f, 3000.0f, 1e-4f};
        for (size_t s = 0; s < TDM_ARRAY_LEN(scales); s++) {
            for (int64_t i = 0; i < n; i++) x[i] = scales[s] * (float)gauss(&rng);
            double e = roundtrip_err(ty, x, n);
            cr_expect(e < 0.5, "%s scale %g: error %.3f", nm, scales[s], e);
        }
        for (int64_t i = 0; i < n; i++) x[i] = -0.75f;
        cr_expect(roundtrip_err(ty, x, n) < 0.2, "%s constant", nm);
        for (int64_t i = 0; i < n; i++) x[i] = i == 77 ? 5.0f : 0.0f;
        cr_expect(roundtrip_err(ty, x, n) < 0.2, "%s one-hot", nm);
    }
    free(x);
    free(y);
    free(q);
}

/* A GGUF whose q4_k tensor row (384) is not a whole number of super-blocks: the
 * loader names the tensor, the type and the block size. */
Test(quant, loader_rejects_partial_super_block) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_str(w, "general.architecture", "llama");
    uint8_t data[144 * 2] = {0};
    int64_t ne[2] = {384, 1};
    tdm_gguf_w_tensor(w, "blk.0.attn_q.weight", TDM_Q4_K, 2, ne, data, sizeof data);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(tdm_gguf_writer_finish(w, &buf, &len), TANDEM_OK);
    tdm_gguf_writer_free(w);
    tdm_gguf *g = NULL;
    tdm_err err = {0};
    cr_assert_neq(tdm_gguf_open_memory(buf, len, &g, &err), TANDEM_OK);
    cr_assert(strstr(err.msg, "blk.0.attn_q.weight") && strstr(err.msg, "q4_k") && strstr(err.msg, "256"), "%s",
              err.msg);
    free(buf);
}

/* ---- tandem quantize's tensor types (quantize.h) --------------------------------- */

static uint32_t rule(const char *kind, const char *name, int64_t ne0, uint32_t n_dims, int32_t n_layer, bool output) {
    tdm_quant_model m = {.n_layer = n_layer, .gqa = 4, .has_output = output};
    tdm_gguf_tensor t = {.name = (char *)name, .type = TDM_F16, .n_dims = n_dims, .ne = {ne0, 64, 1, 1}};
    const tdm_quant_kind *k = tdm_quant_kind_find(kind);
    cr_assert(k, "%s", kind);
    return tdm_quant_tensor_type(k, &m, &t);
}

Test(quant, mix_rules) {
    /* q4_k_m over 8 layers: q6_k for attn_v / ffn_down of layers 0, 3, 6, 7 (llama.cpp's) */
    const bool more[8] = {true, false, false, true, false, false, true, true};
    for (int l = 0; l < 8; l++) {
        char v[64], d[64], q[64];
        snprintf(v, sizeof v, "blk.%d.attn_v.weight", l);
        snprintf(d, sizeof d, "blk.%d.ffn_down.weight", l);
        snprintf(q, sizeof q, "blk.%d.attn_q.weight", l);
        uint32_t want = more[l] ? TDM_Q6_K : TDM_Q4_K;
        cr_assert_eq(rule("q4_k_m", v, 4096, 2, 8, true), want, "layer %d attn_v", l);
        cr_assert_eq(rule("q4_k_m", d, 4096, 2, 8, true), want, "layer %d ffn_down", l);
        cr_assert_eq(rule("q4_k_m", q, 4096, 2, 8, true), (uint32_t)TDM_Q4_K);
        cr_assert_eq(rule("q5_k_m", v, 4096, 2, 8, true), more[l] ? (uint32_t)TDM_Q6_K : (uint32_t)TDM_Q5_K);
        cr_assert_eq(rule("q4_k", v, 4096, 2, 8, true), (uint32_t)TDM_Q4_K, "plain q4_k: no mix");
    }
    /* the output head (or the tied embedding), norms, fallbacks */
    cr_assert_eq(rule("q4_0", "output.weight", 4096, 2, 8, true), (uint32_t)TDM_Q6_K);
    cr_assert_eq(rule("q8_0", "output.weight", 4096, 2, 8, true), (uint32_t)TDM_Q8_0);
    cr_assert_eq(rule("q4_k_m", "token_embd.weight", 4096, 2, 8, true), (uint32_t)TDM_Q4_K);
    cr_assert_eq(rule("q4_k_m", "token_embd.weight", 4096, 2, 8, false), (uint32_t)TDM_Q6_K, "tied: the head");
    cr_assert_eq(rule("q4_k_m", "token_embd.weight", 384, 2, 8, false), (uint32_t)TDM_Q8_0, "q6_k -> q8_0");
    cr_assert_eq(rule("q4_k_m", "blk.1.attn_q.weight", 384, 2, 8, true), (uint32_t)TDM_Q5_0, "q4_k -> q5_0");
    cr_assert_eq(rule("q5_k", "blk.1.attn_q.weight", 384, 2, 8, true), (uint32_t)TDM_Q5_1, "q5_k -> q5_1");
    cr_assert_eq(rule("q3_k", "blk.1.attn_q.weight", 384, 2, 8, true), (uint32_t)TDM_Q4_0, "q3_k -> q4_0");
    cr_assert_eq(rule("q4_k", "blk.1.attn_q.weight", 100, 2, 8, true), (uint32_t)TDM_F16, "no block fits");
    cr_assert_eq(rule("q4_k_m", "blk.1.attn_norm.weight", 4096, 1, 8, true), (uint32_t)TDM_F16, "1-D: unchanged");
    cr_assert_eq(rule("q2_k", "blk.1.ffn_down.weight", 4096, 2, 8, true), (uint32_t)TDM_Q3_K);
    cr_assert_eq(rule("q2_k", "blk.1.attn_v.weight", 4096, 2, 8, true), (uint32_t)TDM_Q4_K, "gqa 4");
    cr_assert_eq(rule("q3_k_m", "blk.1.attn_v.weight", 4096, 2, 8, true), (uint32_t)TDM_Q5_K);
    cr_assert_eq(rule("q3_k_m", "blk.2.attn_v.weight", 4096, 2, 8, true), (uint32_t)TDM_Q4_K);
    cr_assert_null(tdm_quant_kind_find("q7_k"));
    /* mixtures of experts: the router keeps its type, ffn_down_exps is ffn_down (llama.cpp's) */
    cr_assert_eq(rule("q4_k_m", "blk.0.ffn_gate_inp.weight", 4096, 2, 8, true), (uint32_t)TDM_F16, "router");
    cr_assert_eq(rule("q4_k_m", "blk.0.ffn_down_exps.weight", 4096, 3, 8, true), (uint32_t)TDM_Q6_K);
    cr_assert_eq(rule("q4_k_m", "blk.1.ffn_down_exps.weight", 4096, 3, 8, true), (uint32_t)TDM_Q4_K);
    cr_assert_eq(rule("q4_k_m", "blk.1.ffn_gate_exps.weight", 4096, 3, 8, true), (uint32_t)TDM_Q4_K);
}
