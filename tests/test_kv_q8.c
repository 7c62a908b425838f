/* test_kv_q8.c - the quantised KV caches (src/base/kv_layout.h): q8_0 (int8 values)
 * and fp8 (E4M3 values), each with one f32 scale per (position, kv head); every test
 * runs for both (suites kv_q8 / kv_fp8, kv_q8_engine / kv_fp8_engine).
 *
 * ops (the CPU backend, every SIMD level this machine has):
 *   the SIMD levels' E4M3 reads of all 256 codes against dtype.c's table;
 *   kv_write byte-exact against the reference, with zero, huge, tiny, subnormal,
 *   tied and non-finite vectors, and the quantisation's own error bound;
 *   attention against the double-precision reference over the dequantised cache
 *   (tight) and over an f32 cache of the same K/V (loose), GQA ratios 1 to 8, block
 *   sizes the lengths cross, tree rows; huge and zero vectors; a NaN reaching only
 *   the rows that see it; the tensor-parallel blocks op against the op-by-op forward.
 * engine (the pycode models):
 *   K/V bytes per position of each cache type; speculative output equals
 *   target-only output with the same quantised cache (both drafts); prefix-cache hits
 *   and a forked sequence's copy-on-write give the tokens and logits of a cold
 *   computation; greedy output against the f16 cache's (bench_kv runs the 100
 *   prompts of the criterion). */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../bench/bench_prompts.h"
#include "../bench/kv_quality.h"
#include "api_testutil.h"
#include "backend_testutil.h"
#include "cpu_internal.h"
#include "engine.h"
#include "ref_ops.h"
#include "testutil.h"

/* A host cache of n_blocks blocks (zeroed). */
static void *cache_new(uint32_t type, int32_t n_blocks, int32_t nkv, int32_t bs, int32_t hd) {
    void *c = calloc((size_t)n_blocks * nkv, (size_t)tdm_kv_unit_bytes(type, bs, hd));
    cr_assert(c);
    return c;
}

/* ---- kv_write ------------------------------------------------------------------- */

/* Head vector of kind `kind` for a cache of type `type`: 0 random, 1 zeros, 2 huge
 * (up to 3.4e38), 3 tiny, 4 subnormal, 5 ties (scale exactly 1; q8_0: halves, fp8:
 * midpoints between codes, round to even), 6 one non-zero value, 7 non-finite (K: a
 * NaN, V: an infinity). */
static void fill_vec(uint32_t type, float *x, int32_t hd, int kind, bool is_k, uint64_t *rng) {
    const bool f8 = type == TDM_F8_E4M3;
    for (int32_t d = 0; d < hd; d++) x[d] = tdm_test_randf(rng, -1, 1);
    for (int32_t d = 0; d < hd; d++) {
        switch (kind) {
        case 1: x[d] = 0; break;
        case 2: x[d] *= 1e30f; break;
        case 3: x[d] *= 1e-30f; break;
        case 4: x[d] *= 1e-40f; break;
        case 5: /* fp8: (1 + (2m + 1) / 16) between codes 1 + m / 8 and 1 + (m + 1) / 8 */
            x[d] = f8 ? (d % 2 ? -1.0f : 1.0f) * (1.0f + (float)(2 * (d % 8) + 1) / 16.0f) : (float)(d % 9) - 3.5f;
            break;
        case 6: x[d] = d == hd - 1 ? -3.0f : 0.0f; break;
        default: break;
        }
    }
    if (kind == 2) x[0] = 3.4e38f;
    if (kind == 5) x[0] = f8 ? TDM_E4M3_MAX : 127.0f;
    if (kind == 7) x[hd / 2] = is_k ? NAN : INFINITY;
}

/* The stored vector of (slot, g) against its input x: scale = max|x| / 127 (q8_0)
 * or / 448 (fp8) (0 for zeros), each value within half a step of x (q8_0: half the
 * scale; fp8: 2^-4 |x|, 3 mantissa bits, or half the subnormal step 2^-9 scale);
 * NaN scale for a non-finite x. */
static void check_quantised(uint32_t type, const void *cache, bool is_k, const tdm_kv_seq *s, int32_t slot, int32_t g,
                            const float *x, int32_t nkv, int32_t bs, int32_t hd) {
    float amax = 0;
    bool finite = true;
    for (int32_t d = 0; d < hd; d++) finite = finite && isfinite(x[d]), amax = fmaxf(amax, fabsf(x[d]));
    const float sc = ref_kv_scale(cache, is_k, s, slot, g, nkv, bs, hd);
    const bool f8 = type == TDM_F8_E4M3;
    if (!finite) {
        cr_assert(isnan(sc), "slot %d head %d: a non-finite vector's scale is %g", slot, g, (double)sc);
        return;
    }
    cr_assert(sc == amax / (f8 ? TDM_E4M3_MAX : 127.0f), "slot %d head %d: scale %g for max %g", slot, g, (double)sc,
              (double)amax);
    for (int32_t d = 0; d < hd; d++) {
        const double v = ref_kv_get(cache, type, is_k, s, slot, g, d, nkv, bs, hd);
        const double step = f8 ? fmax(0x1p-4 * fabs(x[d]), 0x1p-10 * sc) : 0.5 * sc;
        const double bound = step + 1e-6 * fabs(x[d]) + 512.0 * FLT_TRUE_MIN;
        cr_assert(fabs(v - x[d]) <= bound, "slot %d head %d d %d: %g stored as %g (scale %g)", slot, g, d, (double)x[d],
                  v, (double)sc);
    }
}

/* Every level writes the reference's bytes, and what it writes is the quantisation
 * of kv_layout.h, for every kind of vector and odd shapes (head dim 1, 13, 100; block
 * size 1, 5). */
static void kv_write_extremes(uint32_t type) {
    static const struct {
        int32_t nkv, hd, bs, len;
    } shapes[] = {{2, 64, 16, 37}, {3, 13, 5, 23}, {1, 1, 1, 4}, {2, 100, 8, 17}};
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int nl = tdm_test_levels(lv);
    for (size_t si = 0; si < TDM_ARRAY_LEN(shapes); si++) {
        const int32_t nkv = shapes[si].nkv, hd = shapes[si].hd, bs = shapes[si].bs, len = shapes[si].len;
        uint64_t rng = 100 + si;
        tdm_kv_seq seq;
        const tdm_kv_seq *sp[1];
        const int32_t n_blocks = tdm_test_shuffled_seqs(&rng, 1, &len, bs, 2, &seq, sp);
        const int32_t stride = nkv * hd + 3;
        float *k = calloc((size_t)len * stride, 4), *v = calloc((size_t)len * stride, 4);
        for (int32_t r = 0; r < len; r++)
            for (int32_t g = 0; g < nkv; g++) {
                fill_vec(type, k + (size_t)r * stride + (size_t)g * hd, hd, (r + g) % 8, true, &rng);
                fill_vec(type, v + (size_t)r * stride + (size_t)g * hd, hd, (r + 3 * g) % 8, false, &rng);
            }
        tdm_batch bt;
        cr_assert_eq(tdm_batch_init(&bt, len, NULL), TANDEM_OK);
        for (int32_t r = 0; r < len; r++) tdm_batch_add(&bt, 0, r, 0, (r * 5 + 2) % len, false); /* scrambled slots */
        const size_t bytes = (size_t)n_blocks * nkv * (size_t)tdm_kv_unit_bytes(type, bs, hd);
        void *kr = cache_new(type, n_blocks, nkv, bs, hd), *vr = cache_new(type, n_blocks, nkv, bs, hd);
        tdm_kv_write_args ar = {&bt, sp, k, v, stride, kr, vr, type, nkv, hd, bs};
        ref_kv_write(&ar);
        for (int l = 0; l < nl; l++) {
            void *kc = cache_new(type, n_blocks, nkv, bs, hd), *vc = cache_new(type, n_blocks, nkv, bs, hd);
            tdm_kv_write_args a = ar;
            a.k_cache = kc, a.v_cache = vc;
            tdm_backend *b = tdm_test_backend(lv[l], 2);
            tdm_err err = {0};
            cr_assert_eq(b->ops->kv_write(b, &a, &err), TANDEM_OK, "%s", err.msg);
            tdm_backend_destroy(b);
            cr_assert(memcmp(kc, kr, bytes) == 0, "K bytes differ from the reference (level %d, shape %zu)", lv[l], si);
            cr_assert(memcmp(vc, vr, bytes) == 0, "V bytes differ from the reference (level %d, shape %zu)", lv[l], si);
            free(kc), free(vc);
        }
        for (int32_t r = 0; r < len; r++)
            for (int32_t g = 0; g < nkv; g++) {
                check_quantised(type, kr, true, &seq, bt.slot[r], g, k + (size_t)r * stride + (size_t)g * hd, nkv,
                                bs, hd);
                check_quantised(type, vr, false, &seq, bt.slot[r], g, v + (size_t)r * stride + (size_t)g * hd, nkv,
                                bs, hd);
            }
        free(kr), free(vr), free(k), free(v), free(seq.blocks);
        tdm_batch_free(&bt);
    }
}

Test(kv_q8, kv_write_extremes_all_levels) { kv_write_extremes(TDM_Q8_0); }
Test(kv_fp8, kv_write_extremes_all_levels) { kv_write_extremes(TDM_F8_E4M3); }

/* Every level reads each of the 256 E4M3 codes as dtype.c's table value (NaN codes
 * as NaN), in scores (attn_qk, a one-hot query: the score is the key's element) and
 * in weighted sums of V (attn_pv, weight 1), at every position of a 16-wide vector
 * (the scores' codes at 13 to 16 keys: the masked tails too). */
Test(kv_fp8, codes_all_levels) {
    enum { HD = 19, BS = 16 }; /* (an odd head dim: the kernels' tails) */
    uint8_t kblk[HD * BS], vrow[256 + HD];
    for (int i = 0; i < 256 + HD; i++) vrow[i] = (uint8_t)(i * 7 + 3);
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int nl = tdm_test_levels(lv);
    for (int l = 0; l < nl; l++) {
        const tdm_cpu_kernels *k = tdm_cpu_kernels_for(lv[l]);
        for (int c0 = 0; c0 < 256; c0 += BS)
            for (int d = 0; d < HD; d++) { /* codes c0 .. c0 + 15 at element d, zeros elsewhere */
                memset(kblk, 0, sizeof kblk);
                for (int j = 0; j < BS; j++) kblk[d * BS + j] = (uint8_t)(c0 + j);
                const void *kt[1] = {kblk};
                float q[HD] = {0}, sc[BS];
                q[d] = 1.0f;
                const int cnt = BS - d % 4; /* (and masked tails) */
                k->attn_qk(q, HD, 1, kt, TDM_F8_E4M3, BS, cnt, HD, 1.0f, sc, BS);
                for (int j = 0; j < cnt; j++) {
                    const float want = tdm_e4m3_to_f32(kblk[d * BS + j]);
                    cr_assert(isnan(want) ? isnan(sc[j]) : sc[j] == want, "level %d code 0x%02x: score %g, value %g",
                              lv[l], kblk[d * BS + j], (double)sc[j], (double)want);
                }
            }
        for (int c0 = 0; c0 < 256; c0++) {
            float acc[HD] = {0}, one = 1.0f;
            k->attn_pv(acc, &one, 1, 1, vrow + c0, TDM_F8_E4M3, 1, HD);
            for (int d = 0; d < HD; d++) {
                const float want = tdm_e4m3_to_f32(vrow[c0 + d]);
                cr_assert(isnan(want) ? isnan(acc[d]) : acc[d] == want, "level %d code 0x%02x: %g, value %g", lv[l],
                          vrow[c0 + d], (double)acc[d], (double)want);
            }
        }
    }
}

/* ---- attention ------------------------------------------------------------------ */

typedef struct acase {
    int32_t n_head, nkv, hd, bs, n_seq, lens[3];
    bool tree; /* rows see a prefix plus scattered extra slots */
} acase;

/* A case's sequences, caches (quantised, of type `type`, and f32 of the same K/V),
 * rows and queries. */
typedef struct afix {
    uint32_t type;
    tdm_kv_seq seqs[3];
    const tdm_kv_seq *sp[3];
    void *kq, *vq, *kf, *vf;
    tdm_batch bt;
    int32_t extra_off[65], extra_slot[1024];
    float *q;
    int32_t q_stride;
    size_t n_out;
} afix;

/* k / v rows of every slot: kmod / vmod (may be NULL) change row `slot` of sequence s
 * before it is written. */
typedef void (*row_mod)(float *x, int32_t nkv, int32_t hd, int32_t s, int32_t slot, uint64_t *rng);

static void afix_init(afix *f, uint32_t type, const acase *c, uint64_t seed, row_mod kmod, row_mod vmod) {
    memset(f, 0, sizeof *f);
    f->type = type;
    uint64_t rng = seed;
    const int32_t nkv = c->nkv, hd = c->hd, bs = c->bs;
    const int32_t n_blocks = tdm_test_shuffled_seqs(&rng, c->n_seq, c->lens, bs, 2, f->seqs, f->sp);
    f->kq = cache_new(type, n_blocks, nkv, bs, hd), f->vq = cache_new(type, n_blocks, nkv, bs, hd);
    f->kf = cache_new(TDM_F32, n_blocks, nkv, bs, hd), f->vf = cache_new(TDM_F32, n_blocks, nkv, bs, hd);
    tdm_backend *b = tdm_test_backend(TDM_CPU_SCALAR, 1);
    for (int s = 0; s < c->n_seq; s++) {
        const int32_t len = c->lens[s], stride = nkv * hd;
        float *k = tdm_test_rand_vec(&rng, (size_t)len * stride, -2, 2), *v = tdm_test_rand_vec(&rng, (size_t)len * stride, -2, 2);
        for (int32_t p = 0; p < len; p++) {
            if (kmod) kmod(k + (size_t)p * stride, nkv, hd, s, p, &rng);
            if (vmod) vmod(v + (size_t)p * stride, nkv, hd, s, p, &rng);
        }
        tdm_batch wb;
        cr_assert_eq(tdm_batch_init(&wb, len, NULL), TANDEM_OK);
        for (int32_t p = 0; p < len; p++) tdm_batch_add(&wb, 0, p, s, p, false);
        tdm_kv_write_args a = {&wb, f->sp, k, v, stride, f->kq, f->vq, type, nkv, hd, bs};
        tdm_err err = {0};
        cr_assert_eq(b->ops->kv_write(b, &a, &err), TANDEM_OK, "%s", err.msg);
        a.k_cache = f->kf, a.v_cache = f->vf, a.cache_type = TDM_F32;
        cr_assert_eq(b->ops->kv_write(b, &a, &err), TANDEM_OK, "%s", err.msg);
        tdm_batch_free(&wb);
        free(k), free(v);
    }
    tdm_backend_destroy(b);
    /* the last 6 positions of each sequence as rows; tree: a prefix plus extras */
    cr_assert_eq(tdm_batch_init(&f->bt, 64, NULL), TANDEM_OK);
    int32_t n_extra = 0;
    for (int s = 0; s < c->n_seq; s++)
        for (int32_t p = TDM_MAX(0, c->lens[s] - 6); p < c->lens[s]; p++) {
            const int32_t r = tdm_batch_add(&f->bt, 0, p, s, p, false);
            if (c->tree) {
                f->bt.n_visible[r] = c->lens[s] / 2;
                for (int32_t e = c->lens[s] / 2; e <= p; e += 1 + (e % 3)) f->extra_slot[n_extra++] = e;
            }
            f->extra_off[r + 1] = n_extra;
        }
    if (c->tree) f->bt.extra_off = f->extra_off, f->bt.extra_slot = f->extra_slot;
    f->q_stride = c->n_head * hd + 2 * nkv * hd;
    f->q = tdm_test_rand_vec(&rng, (size_t)f->bt.n_rows * f->q_stride, -1.5f, 1.5f);
    f->n_out = (size_t)f->bt.n_rows * c->n_head * hd;
}

static void afix_free(afix *f, const acase *c) {
    f->bt.extra_off = NULL, f->bt.extra_slot = NULL;
    tdm_batch_free(&f->bt);
    for (int s = 0; s < c->n_seq; s++) free(f->seqs[s].blocks);
    free(f->kq), free(f->vq), free(f->kf), free(f->vf), free(f->q);
}

static tdm_attn_args afix_args(const afix *f, const acase *c, bool quant, float *out) {
    tdm_attn_args a = {&f->bt, f->sp, f->q, f->q_stride, out, quant ? f->kq : f->kf, quant ? f->vq : f->vf,
                       quant ? f->type : TDM_F32, c->n_head, c->nkv, c->hd, c->bs, 1.0f / sqrtf((float)c->hd), 0, 0};
    return a;
}

/* Normalised error over the elements both have finite; *nan_mismatch: elements
 * NaN in one and not the other. */
static double err_finite(const float *a, const float *b, size_t n, size_t *nan_mismatch) {
    double num = 0, den = 0;
    *nan_mismatch = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i]) != isnan(b[i])) (*nan_mismatch)++;
        if (!isfinite(a[i]) || !isfinite(b[i])) continue;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? 1e30 : 0);
}

/* The backend's attention on the quantised cache at every level (2 threads): against
 * the reference over the dequantised cache within tight (NaN where it is NaN), and,
 * when loose > 0, against the reference over the f32 cache within loose; all_finite:
 * every output finite.  Returns the largest error against the f32 cache. */
static double run_case(const acase *c, const afix *f, double tight, double loose, bool all_finite) {
    float *ref = calloc(f->n_out, 4), *reff = calloc(f->n_out, 4), *out = calloc(f->n_out, 4);
    tdm_attn_args a = afix_args(f, c, true, ref);
    ref_attention(&a);
    tdm_attn_args af = afix_args(f, c, false, reff);
    ref_attention(&af);
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int nl = tdm_test_levels(lv);
    double worst = 0;
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        a.out = out;
        tdm_err err = {0};
        cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_OK, "%s", err.msg);
        tdm_backend_destroy(b);
        size_t nan_bad;
        const double e = err_finite(out, ref, f->n_out, &nan_bad);
        cr_assert_eq(nan_bad, 0, "level %d heads %d/%d hd %d bs %d: %zu outputs NaN in one only", lv[l], c->n_head,
                     c->nkv, c->hd, c->bs, nan_bad);
        cr_assert(e < tight, "level %d heads %d/%d hd %d bs %d tree %d: %g against the dequantised reference", lv[l],
                  c->n_head, c->nkv, c->hd, c->bs, c->tree, e);
        for (size_t i = 0; all_finite && i < f->n_out; i++)
            cr_assert(isfinite(out[i]), "level %d: output %zu is %g", lv[l], i, (double)out[i]);
        const double ef = err_finite(out, reff, f->n_out, &nan_bad);
        worst = fmax(worst, ef);
        if (loose > 0)
            cr_assert(ef < loose, "level %d heads %d/%d hd %d bs %d: %g against the f32 cache", lv[l], c->n_head, c->nkv,
                      c->hd, c->bs, ef);
    }
    free(ref), free(reff), free(out);
    return worst;
}

/* GQA ratios 1, 2, 4, 8 (and 4 with head dim 128), block sizes 4 to 32 crossed by
 * the lengths, several sequences, tree rows: within 1e-5 of the reference over the
 * dequantised cache, and within `loose` of the f32 cache's (normalised errors). */
static void attention_against_references(uint32_t type, double loose) {
    static const acase cases[] = {
        {4, 4, 64, 16, 2, {70, 33}, false}, {4, 2, 64, 4, 1, {50}, false},       {8, 2, 40, 32, 2, {100, 7}, false},
        {8, 1, 64, 16, 1, {45}, true},      {12, 3, 128, 16, 1, {80}, false},    {6, 2, 24, 8, 3, {19, 40, 1}, true},
    };
    double worst = 0;
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++) {
        afix f;
        afix_init(&f, type, &cases[i], 7 + i, NULL, NULL);
        worst = fmax(worst, run_case(&cases[i], &f, 1e-5, loose, true));
        afix_free(&f, &cases[i]);
    }
    cr_log_info("%s attention against the f32 cache: largest normalised error %.4g", tdm_dtype_name(type), worst);
}

Test(kv_q8, attention_against_references) { attention_against_references(TDM_Q8_0, 2e-2); }
/* (E4M3 keeps 3 mantissa bits: each value within 2^-4 relative, about 2 % rms, and
 * the largest error measured over these cases is about 3 %) */
Test(kv_fp8, attention_against_references) { attention_against_references(TDM_F8_E4M3, 6e-2); }

/* Huge keys (scores of 1e15: one-hot softmax), zero keys and values, values of
 * 1e30: the same as the reference over the dequantised cache, finite. */
static void huge_k(float *x, int32_t nkv, int32_t hd, int32_t s, int32_t slot, uint64_t *rng) {
    (void)s, (void)rng;
    for (int32_t i = 0; i < nkv * hd; i++) x[i] *= slot < 10 ? 1e15f : slot < 15 ? 0.0f : 1.0f;
}
static void huge_v(float *x, int32_t nkv, int32_t hd, int32_t s, int32_t slot, uint64_t *rng) {
    (void)s, (void)rng;
    for (int32_t i = 0; i < nkv * hd; i++) x[i] *= slot >= 20 && slot < 25 ? 1e30f : slot >= 25 && slot < 30 ? 0.0f : 1.0f;
}
/* A NaN in kv head 0's key of the last slot. */
static void nan_k(float *x, int32_t nkv, int32_t hd, int32_t s, int32_t slot, uint64_t *rng) {
    (void)nkv, (void)s, (void)rng;
    if (slot == 39) x[hd / 3] = NAN;
}

static void attention_extremes(uint32_t type) {
    const acase c = {4, 2, 64, 16, 1, {40}, false};
    afix f;
    afix_init(&f, type, &c, 21, huge_k, huge_v);
    run_case(&c, &f, 1e-5, 0, true);
    afix_free(&f, &c);

    /* a NaN key: each output is NaN exactly when it is from the f32 cache with the
     * same NaN, at every level (levels differ: the scalar softmax passes NaN on, the
     * vector ones clamp it away); the outputs it cannot reach (the rows before slot
     * 39, kv head 1's heads) match the reference */
    afix_init(&f, type, &c, 22, nan_k, NULL);
    float *out = calloc(f.n_out, 4), *outf = calloc(f.n_out, 4), *ref = calloc(f.n_out, 4);
    tdm_attn_args ar = afix_args(&f, &c, true, ref);
    ref_attention(&ar);
    const int32_t hd = c.hd, group = c.n_head / c.nkv;
    for (int32_t r = 0; r < f.bt.n_rows; r++)
        for (int32_t h = 0; h < group; h++)
            if (f.bt.n_visible[r] == 40) memset(ref + ((size_t)r * c.n_head + h) * hd, 0, (size_t)hd * 4);
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int nl = tdm_test_levels(lv);
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        tdm_attn_args a = afix_args(&f, &c, true, out), af = afix_args(&f, &c, false, outf);
        tdm_err err = {0};
        cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(b->ops->attention(b, &af, &err), TANDEM_OK, "%s", err.msg);
        tdm_backend_destroy(b);
        for (int32_t r = 0; r < f.bt.n_rows; r++)
            for (int32_t h = 0; h < c.n_head; h++) {
                const bool reached = f.bt.n_visible[r] == 40 && h / group == 0;
                float *o = out + ((size_t)r * c.n_head + h) * hd, *of = outf + ((size_t)r * c.n_head + h) * hd;
                for (int32_t d = 0; d < hd; d++) {
                    cr_assert_eq(isnan(o[d]), isnan(of[d]), "level %d row %d head %d: %g, f32 cache %g", lv[l], r, h,
                                 (double)o[d], (double)of[d]);
                    cr_assert(reached || isfinite(o[d]), "level %d row %d head %d: %g", lv[l], r, h, (double)o[d]);
                }
                if (reached) memset(o, 0, (size_t)hd * 4);
            }
        cr_assert(ref_nrm_err(out, ref, f.n_out) < 1e-5, "level %d: %g", lv[l], ref_nrm_err(out, ref, f.n_out));
    }
    free(out), free(outf), free(ref);
    afix_free(&f, &c);
}

Test(kv_q8, attention_extremes) { attention_extremes(TDM_Q8_0); }
Test(kv_fp8, attention_extremes) { attention_extremes(TDM_F8_E4M3); }

/* ---- the pycode models ---------------------------------------------------------- */

static tdm_backend *g_wbe;
static tdm_model *g_target;

static void models_setup(void) {
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &g_wbe, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(tdm_test_model_path("pycode-target-f16.gguf"), g_wbe, &g_target, &err), TANDEM_OK,
                 "%s", err.msg);
}

static void models_teardown(void) {
    tdm_model_free(g_target);
    tdm_backend_destroy(g_wbe);
}

TestSuite(kv_q8_engine, .init = models_setup, .fini = models_teardown, .timeout = 600);
TestSuite(kv_fp8_engine, .init = models_setup, .fini = models_teardown, .timeout = 600);

/* The cache type of a tandem_kv_type of these tests. */
static uint32_t kv_dtype(tandem_kv_type kv) { return kv == TANDEM_KV_FP8 ? TDM_F8_E4M3 : TDM_Q8_0; }

static tdm_engine *engine_kv(tandem_kv_type kv, tdm_model *draft, bool tp) {
    tdm_err err = {0};
    tdm_engine_cfg cfg = {.n_threads = 2, .kv_type = kv};
    tdm_engine *e = NULL;
    cr_assert_eq(tdm_engine_create(g_target, draft, &cfg, &e, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(e->kv_t.type, kv_dtype(kv));
    tdm_backend_cpu_set_tp(e->be, tp);
    return e;
}

/* Bytes per position: f32 8 L H D, f16 4 L H D, q8_0 and fp8 2 L H (D + 4) (block
 * size 16). */
Test(kv_q8_engine, bytes_per_token) {
    const tdm_hparams *hp = &g_target->hp;
    const uint32_t types[4] = {TDM_F32, TDM_F16, TDM_Q8_0, TDM_F8_E4M3};
    uint64_t b[4];
    for (int i = 0; i < 4; i++) {
        const tdm_kv_layout l = tdm_model_kv_layout(g_target, types[i]);
        b[i] = tdm_kv_bytes_per_token(&l, 16);
    }
    const uint64_t lh = 2ull * (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv;
    cr_assert_eq(b[0], lh * (uint64_t)hp->head_dim * 4);
    cr_assert_eq(b[1], lh * (uint64_t)hp->head_dim * 2);
    cr_assert_eq(b[2], lh * ((uint64_t)hp->head_dim + 4));
    cr_assert_eq(b[3], b[2]);
    cr_assert(2 * b[2] < b[1] * 1.1, "q8_0 %llu bytes against f16 %llu", (unsigned long long)b[2], (unsigned long long)b[1]);
    cr_log_info("pycode target K/V bytes per position: f32 %llu, f16 %llu, q8_0 %llu (%.3f of f16)",
                (unsigned long long)b[0], (unsigned long long)b[1], (unsigned long long)b[2], (double)b[2] / (double)b[1]);
}

/* Logits after each prefix tok[0 .. t + 1) for t < n: [n][V]. */
static float *prefix_logits(tdm_engine *e, const int32_t *tok, int32_t n) {
    const int32_t V = g_target->hp.n_vocab;
    float *out = malloc((size_t)n * V * 4);
    tdm_err err = {0};
    for (int32_t t = 0; t < n; t++)
        cr_assert_eq(tdm_engine_score_last(e, false, tok, t + 1, out + (size_t)t * V, &err), TANDEM_OK, "%s", err.msg);
    return out;
}

/* The tensor-parallel blocks op on a quantised cache: runs, and gives the op-by-op
 * forward's logits up to f32 rounding. */
static void blocks_op_matches_ops(tandem_kv_type kv) {
    tdm_engine *tp = engine_kv(kv, NULL, true), *ops = engine_kv(kv, NULL, false);
    enum { N = 24 };
    int32_t tok[N];
    uint64_t rng = 5;
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)g_target->hp.n_vocab);
    const uint64_t runs0 = tdm_backend_cpu_blocks_runs(tp->be);
    float *a = prefix_logits(tp, tok, N), *b = prefix_logits(ops, tok, N);
    cr_assert_gt(tdm_backend_cpu_blocks_runs(tp->be), runs0, "the blocks op declined the quantised cache");
    cr_assert_eq(tdm_backend_cpu_blocks_runs(ops->be), 0);
    const size_t n = (size_t)N * g_target->hp.n_vocab;
    cr_assert(ref_nrm_err(a, b, n) < 1e-4, "tensor parallel vs op by op: %g", ref_nrm_err(a, b, n));
    free(a), free(b);
    tdm_engine_free(tp), tdm_engine_free(ops);
}

Test(kv_q8_engine, blocks_op_matches_ops) { blocks_op_matches_ops(TANDEM_KV_Q8_0); }
Test(kv_fp8_engine, blocks_op_matches_ops) { blocks_op_matches_ops(TANDEM_KV_FP8); }

/* A forked sequence shares every block of its parent, the last one half full; its
 * own tokens copy that block (with its scales) before writing into it, so parent
 * and child then give the logits of sequences computed from scratch. */
static void fork_copy_on_write(tandem_kv_type kv) {
    tdm_engine *e = engine_kv(kv, NULL, true);
    enum { P = 40, C = 8 }; /* 2.5 blocks shared, 8 own tokens each */
    const int32_t V = g_target->hp.n_vocab;
    int32_t ta[P + C], tb[P + C];
    uint64_t rng = 17;
    for (int i = 0; i < P + C; i++) ta[i] = tb[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)V);
    for (int i = P; i < P + C; i++) tb[i] = (ta[i] + 1 + i) % V;
    tdm_seq a, b;
    memset(&a, 0, sizeof a), memset(&b, 0, sizeof b);
    a.tokens = ta, b.tokens = tb;
    a.n_tokens = a.cap = b.n_tokens = b.cap = P + C;
    tdm_err err = {0};
    cr_assert_eq(tdm_engine_feed(e, &a, false, 0, P, false, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_kv_seq_fork(e->pool, &a.kv, &b.kv, &err), TANDEM_OK, "%s", err.msg);
    const int32_t shared = a.kv.blocks[P / 16];
    cr_assert_eq(tdm_kv_pool_refcount(e->pool, shared), 2);
    float *la = malloc((size_t)V * 4), *lb = malloc((size_t)V * 4);
    cr_assert_eq(tdm_engine_feed(e, &b, false, P, P + C, true, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    memcpy(lb, e->logits_t, (size_t)V * 4);
    cr_assert_neq(b.kv.blocks[P / 16], shared, "the child wrote into the shared block");
    cr_assert_eq(b.kv.blocks[0], a.kv.blocks[0], "full blocks stay shared");
    cr_assert_eq(tdm_engine_feed(e, &a, false, P, P + C, true, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    memcpy(la, e->logits_t, (size_t)V * 4);
    float *wa = malloc((size_t)V * 4), *wb = malloc((size_t)V * 4);
    cr_assert_eq(tdm_engine_score_last(e, false, ta, P + C, wa, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_score_last(e, false, tb, P + C, wb, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(memcmp(la, wa, (size_t)V * 4) == 0, "the parent's logits after the fork differ from a cold run");
    cr_assert(memcmp(lb, wb, (size_t)V * 4) == 0, "the child's logits differ from a cold run");
    tdm_kv_seq_free(e->pool, &a.kv), tdm_kv_seq_free(e->pool, &b.kv);
    free(la), free(lb), free(wa), free(wb);
    tdm_engine_free(e);
}

Test(kv_q8_engine, fork_copy_on_write) { fork_copy_on_write(TANDEM_KV_Q8_0); }
Test(kv_fp8_engine, fork_copy_on_write) { fork_copy_on_write(TANDEM_KV_FP8); }

/* ---- through the public API ----------------------------------------------------- */

static tandem_engine *api_engine(tandem_model *t, tandem_model *d, tandem_kv_type kv, bool prefix_cache) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2, ep.kv_type = kv, ep.prefix_cache = prefix_cache;
    return api_open_engine(t, d, &ep);
}

static void assert_same_tokens(const tandem_result *a, const tandem_result *b, const char *what, int p) {
    cr_assert_eq(a->n_tokens, b->n_tokens, "%s, prompt %d: %zu tokens against %zu", what, p, a->n_tokens, b->n_tokens);
    for (size_t i = 0; i < a->n_tokens; i++)
        cr_assert_eq(a->tokens[i], b->tokens[i], "%s, prompt %d: token %zu differs", what, p, i);
}

/* Greedy speculative decoding with a quantised cache (both models' caches of that
 * type) gives the target-only output with the same cache, for both drafts. */
static void spec_equals_target_only(tandem_kv_type kv) {
    const int n_prompts = tdm_test_sanitized() ? 2 : 5;
    int n = 0;
    char **prompts = bench_prompts_read(tdm_test_data_path("prompts-dev.jsonl"), n_prompts, &n);
    tandem_model *t = api_open_model("pycode-target-f16.gguf");
    const char *drafts[2] = {"pycode-draft-xs-f16.gguf", "pycode-draft-s-f16.gguf"};
    tandem_engine *plain = api_engine(t, NULL, kv, false);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 40;
    tandem_result *want = calloc((size_t)n, sizeof *want);
    for (int p = 0; p < n; p++)
        cr_assert_eq(tandem_generate(plain, prompts[p], &gp, &want[p]), TANDEM_OK, "%s", tandem_last_error());
    tandem_engine_close(plain);
    for (int d = 0; d < 2; d++) {
        tandem_model *dm = api_open_model(drafts[d]);
        tandem_engine *spec = api_engine(t, dm, kv, false);
        tandem_generate_params sp = gp;
        sp.spec_k = d == 0 ? 4 : 0; /* fixed, and adaptive */
        uint64_t drafted = 0;
        for (int p = 0; p < n; p++) {
            tandem_result r;
            cr_assert_eq(tandem_generate(spec, prompts[p], &sp, &r), TANDEM_OK, "%s", tandem_last_error());
            assert_same_tokens(&r, &want[p], drafts[d], p);
            drafted += r.spec.drafted;
            tandem_result_free(&r);
        }
        cr_assert_gt(drafted, 0, "%s: nothing was drafted", drafts[d]);
        tandem_engine_close(spec);
        tandem_model_close(dm);
    }
    for (int p = 0; p < n; p++) tandem_result_free(&want[p]);
    free(want);
    tandem_model_close(t);
    bench_prompts_free(prompts, n);
}

Test(kv_q8_engine, spec_equals_target_only) { spec_equals_target_only(TANDEM_KV_Q8_0); }
Test(kv_fp8_engine, spec_equals_target_only) { spec_equals_target_only(TANDEM_KV_FP8); }

/* The prefix cache on a quantised cache: a repeated prompt takes its blocks from the
 * cache and generates what a cold engine does; a prompt sharing only a prefix
 * too.  Bad kv_type values are refused. */
static void prefix_cache(tandem_kv_type kv) {
    int n = 0;
    char **prompts = bench_prompts_read(tdm_test_data_path("prompts-dev.jsonl"), 1, &n);
    cr_assert_eq(n, 1);
    tandem_model *t = api_open_model("pycode-target-f16.gguf");
    tandem_engine *warm = api_engine(t, NULL, kv, true), *cold = api_engine(t, NULL, kv, false);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 24;
    const size_t len = strlen(prompts[0]);
    char *other = strdup(prompts[0]);
    other[len * 3 / 4] = other[len * 3 / 4] == 'x' ? 'y' : 'x'; /* the same first three quarters */
    const char *texts[3] = {prompts[0], prompts[0], other};
    for (int i = 0; i < 3; i++) {
        tandem_result rw, rc;
        cr_assert_eq(tandem_generate(warm, texts[i], &gp, &rw), TANDEM_OK, "%s", tandem_last_error());
        cr_assert_eq(tandem_generate(cold, texts[i], &gp, &rc), TANDEM_OK, "%s", tandem_last_error());
        if (i > 0) cr_assert_gt(rw.n_cached_tokens, 0, "request %d found nothing in the prefix cache", i);
        assert_same_tokens(&rw, &rc, "prefix cache", i);
        tandem_result_free(&rw), tandem_result_free(&rc);
    }
    tandem_engine_close(warm), tandem_engine_close(cold);
    tandem_engine_params ep = tandem_engine_default_params();
    tandem_engine *e = NULL;
    ep.kv_type = (tandem_kv_type)(TANDEM_KV_FP8 + 1);
    cr_assert_eq(tandem_engine_open(t, NULL, &ep, &e), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "kv_type"), "%s", tandem_last_error());
    ep.kv_type = (tandem_kv_type)-1;
    cr_assert_eq(tandem_engine_open(t, NULL, &ep, &e), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(e);
    free(other);
    tandem_model_close(t);
    bench_prompts_free(prompts, n);
}

Test(kv_q8_engine, prefix_cache) { prefix_cache(TANDEM_KV_Q8_0); }
Test(kv_fp8_engine, prefix_cache) { prefix_cache(TANDEM_KV_FP8); }

/* The criterion on a few prompts (bench_kv: all 100, 64 tokens): greedy
 * output with the quantised cache equals the f16 cache's or first departs at a near
 * tie (f16 top-two margin below 0.5), and the logits stay close. */
static void greedy_against_f16(tandem_kv_type kv) {
    const bool san = tdm_test_sanitized();
    int n = 0;
    char **prompts = bench_prompts_read(tdm_test_data_path("prompts-dev.jsonl"), san ? 3 : 10, &n);
    kvq_opts o = {tdm_test_model_path("pycode-target-f16.gguf"), 2, TANDEM_KV_F16, kv, 128, san ? 12 : 32,
                  0.5f, false, false};
    kvq_stats st;
    tdm_err err = {0};
    cr_assert(kvq_run(&o, prompts, n, &st, &err), "%s", err.msg);
    cr_log_info("%s against f16, %d prompts x %d tokens: %d equal, %d near-tie departures, %d other; logits error "
                "%.5f (worst step %.5f); bytes per position %llu against %llu",
                tdm_dtype_name(kv_dtype(kv)), st.n_prompts, o.n_gen, st.n_equal, st.n_near_tie, st.n_other,
                st.logits_err, st.logits_err_max, (unsigned long long)st.bytes_per_token[1],
                (unsigned long long)st.bytes_per_token[0]);
    cr_assert_eq(st.n_prompts, n);
    cr_assert_leq(st.n_other, n / 10, "%d of %d prompts depart from f16 away from a near tie", st.n_other, n);
    cr_assert_lt(st.logits_err, 0.02);
    cr_assert(st.bytes_per_token[1] * 10 < st.bytes_per_token[0] * 6, "the cache is not about half of f16");
    bench_prompts_free(prompts, n);
}

Test(kv_q8_engine, greedy_against_f16) { greedy_against_f16(TANDEM_KV_Q8_0); }
Test(kv_fp8_engine, greedy_against_f16) { greedy_against_f16(TANDEM_KV_FP8); }
