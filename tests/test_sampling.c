/* test_sampling.c - rng, logits processing (against a naive sort-everything
 * implementation), and sampling (chi-square goodness of fit). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"
#include "stats.h"
#include "testutil.h"

/* ------------------------------------------------------------------ rng */

Test(sampling, rng_known_answers) {
    /* xoshiro256** seeded with splitmix64, computed with an independent implementation. */
    const uint64_t want0[4] = {0x99ec5f36cb75f2b4ull, 0xbf6e1f784956452aull, 0x1a5f849d4933e6e0ull,
                               0x6aa594f1262d2d2cull};
    const uint64_t want1[4] = {0xbe6a36374160d49bull, 0x214aaa0637a688c6ull, 0xf69d16de9954d388ull,
                               0x0c60048c4e96e033ull};
    tdm_rng r;
    tdm_rng_seed(&r, 0);
    for (int i = 0; i < 4; i++) cr_assert_eq(tdm_rng_next(&r), want0[i], "seed 0 draw %d", i);
    tdm_rng_seed(&r, 12345);
    for (int i = 0; i < 4; i++) cr_assert_eq(tdm_rng_next(&r), want1[i], "seed 12345 draw %d", i);
}

Test(sampling, rng_determinism) {
    tdm_rng a, b, c;
    tdm_rng_seed(&a, 42);
    tdm_rng_seed(&b, 42);
    tdm_rng_seed(&c, 43);
    int same_c = 0;
    for (int i = 0; i < 10000; i++) {
        uint64_t x = tdm_rng_next(&a), y = tdm_rng_next(&b), z = tdm_rng_next(&c);
        cr_assert_eq(x, y, "same seed diverged at draw %d", i);
        same_c += x == z;
    }
    cr_assert_eq(same_c, 0, "different seeds gave %d equal draws", same_c);
}

Test(sampling, uniform_range_and_distribution) {
    tdm_rng r;
    tdm_rng_seed(&r, 7);
    enum { N = 1000000, BINS = 100 };
    uint64_t counts[BINS] = {0};
    double probs[BINS];
    double lo = 1, hi = 0, sum = 0;
    for (int i = 0; i < BINS; i++) probs[i] = 1.0 / BINS;
    for (int i = 0; i < N; i++) {
        double u = tdm_rng_uniform(&r);
        cr_assert(u >= 0.0 && u < 1.0, "uniform out of [0,1): %.17g", u);
        /* exactly 53 bits: u * 2^53 is an integer */
        cr_assert_eq(u * 0x1.0p53, floor(u * 0x1.0p53));
        lo = fmin(lo, u);
        hi = fmax(hi, u);
        sum += u;
        counts[(int)(u * BINS)]++;
    }
    cr_assert_lt(lo, 1e-4);
    cr_assert_gt(hi, 1 - 1e-4);
    cr_assert_lt(fabs(sum / N - 0.5), 0.002);
    double pv = tdm_stat_chi2_gof(counts, probs, BINS, NULL);
    cr_assert_gt(pv, 1e-3, "uniform histogram p-value %g", pv);
}

Test(sampling, stats_helper_sanity) {
    /* Known chi-square survival values. */
    cr_assert_lt(fabs(tdm_stat_chi2_sf(3.841458820694124, 1) - 0.05), 1e-9);
    cr_assert_lt(fabs(tdm_stat_chi2_sf(2.0, 2) - exp(-1.0)), 1e-12);       /* df 2: e^(-x/2) */
    cr_assert_lt(fabs(tdm_stat_gamma_q(1.0, 3.0) - exp(-3.0)), 1e-12);
    /* Closed forms: even df: e^(-x/2) sum_{i < df/2} (x/2)^i / i!; df 1: erfc(sqrt(x/2)). */
    const double xs[] = {0.5, 3.0, 10.0, 29.0, 45.0, 80.0, 150.0};
    const int dfs[] = {2, 4, 10, 30, 60, 100};
    for (size_t a = 0; a < TDM_ARRAY_LEN(xs); a++) {
        for (size_t b = 0; b < TDM_ARRAY_LEN(dfs); b++) {
            double h = xs[a] / 2, term = 1, sum = 0;
            for (int i = 0; i < dfs[b] / 2; i++) {
                sum += term;
                term *= h / (i + 1);
            }
            double want = exp(-h) * sum, got = tdm_stat_chi2_sf(xs[a], dfs[b]);
            cr_assert_lt(fabs(got - want), 1e-10 + 1e-9 * want, "chi2_sf(%g, %d) = %.15g, want %.15g", xs[a],
                         dfs[b], got, want);
        }
        double want1 = erfc(sqrt(xs[a] / 2));
        cr_assert_lt(fabs(tdm_stat_chi2_sf(xs[a], 1) - want1), 1e-10 + 1e-9 * want1, "df 1 at %g", xs[a]);
    }
}

/* ------------------------------------------------------- naive reference */

typedef struct cand {
    float p;
    int32_t id;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p != y->p) return x->p > y->p ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Sort everything, then apply the filters exactly as documented in sampling.h. */
static void naive_probs(const float *logits, int32_t n, const tdm_sampler_params *sp, float *out) {
    memset(out, 0, (size_t)n * sizeof *out);
    if (sp->temperature <= 0) {
        int32_t best = 0;
        for (int32_t i = 1; i < n; i++)
            if (logits[i] > logits[best]) best = i;
        out[best] = 1;
        return;
    }
    float m = logits[0];
    for (int32_t i = 1; i < n; i++) m = fmaxf(m, logits[i]);
    cand *c = malloc((size_t)n * sizeof *c);
    double sum = 0;
    for (int32_t i = 0; i < n; i++) sum += exp(((double)logits[i] - m) / sp->temperature);
    for (int32_t i = 0; i < n; i++) {
        c[i].p = (float)(exp(((double)logits[i] - m) / sp->temperature) / sum);
        c[i].id = i;
    }
    qsort(c, (size_t)n, sizeof *c, cand_cmp);
    int32_t keep = n;
    while (keep > 1 && c[keep - 1].p == 0) keep--; /* zero-probability tokens stay 0 anyway */
    if (sp->top_k > 0 && sp->top_k < keep) keep = sp->top_k;
    if (sp->top_p < 1) {
        double mass = 0, cum = 0;
        for (int32_t i = 0; i < keep; i++) mass += c[i].p;
        int32_t m2 = keep;
        for (int32_t i = 0; i < keep; i++) {
            cum += c[i].p;
            if (cum >= sp->top_p * mass) {
                m2 = i + 1;
                break;
            }
        }
        keep = m2 < 1 ? 1 : m2;
    }
    if (sp->min_p > 0) {
        double thr = (double)sp->min_p * c[0].p;
        int32_t m3 = 0;
        while (m3 < keep && c[m3].p >= thr) m3++;
        keep = m3;
    }
    double kept = 0;
    for (int32_t i = 0; i < keep; i++) kept += c[i].p;
    for (int32_t i = 0; i < keep; i++) out[c[i].id] = (float)(c[i].p / kept);
    free(c);
}

static void check_against_naive(const float *logits, int32_t n, tdm_sampler_params sp,
                                tdm_sampler_scratch *s, const char *what) {
    float *got = malloc((size_t)n * sizeof *got), *want = malloc((size_t)n * sizeof *want);
    tdm_probs_from_logits(logits, n, &sp, s, got);
    naive_probs(logits, n, &sp, want);
    double sum = 0;
    for (int32_t i = 0; i < n; i++) {
        cr_assert_eq(got[i] == 0, want[i] == 0,
                     "%s (T=%g k=%d p=%g min_p=%g n=%d): token %d kept differently: got %g want %g", what,
                     sp.temperature, sp.top_k, sp.top_p, sp.min_p, n, i, got[i], want[i]);
        cr_assert_leq(fabsf(got[i] - want[i]), 1e-6f + 1e-5f * want[i], "%s: token %d got %.9g want %.9g", what,
                      i, got[i], want[i]);
        sum += got[i];
    }
    cr_assert_lt(fabs(sum - 1.0), 1e-5, "%s: sums to %.9g", what, sum);
    free(got);
    free(want);
}


/* Random logits: continuous (gaussian-ish), or from a few levels (many exact ties). */
static void random_logits(uint64_t *st, float *l, int32_t n, int kind) {
    for (int32_t i = 0; i < n; i++) {
        if (kind == 0) l[i] = (float)((tdm_test_randu(st) + tdm_test_randu(st) + tdm_test_randu(st) - 1.5) * 6.0);
        else l[i] = (float)(tdm_test_rand(st) % 5) * 0.75f;
    }
}

Test(sampling, filters_match_naive_random) {
    uint64_t st = 99;
    const int32_t sizes[] = {1, 2, 3, 7, 50, 257, 1000};
    const float temps[] = {0.05f, 0.7f, 1.0f, 1.7f};
    const int32_t ks[] = {0, 1, 2, 5, 40, 5000};
    const float ps[] = {1.0f, 0.0f, 0.3f, 0.9f, 0.999f};
    const float mins[] = {0.0f, 0.05f, 0.5f, 1.0f};
    tdm_sampler_scratch s;
    cr_assert_eq(tdm_sampler_scratch_init(&s, 1000, NULL), TANDEM_OK);
    float *l = malloc(1000 * sizeof *l);
    int cases = 0;
    for (size_t a = 0; a < TDM_ARRAY_LEN(sizes); a++)
        for (int kind = 0; kind < 2; kind++) {
            random_logits(&st, l, sizes[a], kind);
            for (size_t b = 0; b < TDM_ARRAY_LEN(temps); b++)
                for (size_t c = 0; c < TDM_ARRAY_LEN(ks); c++)
                    for (size_t d = 0; d < TDM_ARRAY_LEN(ps); d++)
                        for (size_t e = 0; e < TDM_ARRAY_LEN(mins); e++) {
                            tdm_sampler_params sp = {temps[b], ks[c], ps[d], mins[e]};
                            check_against_naive(l, sizes[a], sp, &s, kind ? "ties" : "random");
                            cases++;
                        }
        }
    cr_assert_gt(cases, 1000);
    free(l);
    tdm_sampler_scratch_free(&s);
}

/* A model-sized vocabulary with a long tail (most tokens far below the top), where
 * the candidate list skips the tail by a threshold, plus -inf logits (never kept)
 * and ties at the top: the same results as the naive filters. */
Test(sampling, filters_match_naive_large_vocab) {
    enum { N = 8192 };
    uint64_t st = 5;
    const float temps[] = {0.3f, 0.8f, 1.5f};
    const int32_t ks[] = {0, 1, 40, 500};
    const float ps[] = {1.0f, 0.5f, 0.95f, 0.9999f};
    const float mins[] = {0.0f, 0.01f, 0.2f};
    tdm_sampler_scratch s;
    cr_assert_eq(tdm_sampler_scratch_init(&s, N, NULL), TANDEM_OK);
    float *l = malloc(N * sizeof *l);
    for (int kind = 0; kind < 3; kind++) {
        for (int32_t i = 0; i < N; i++) { /* a few strong tokens over a wide tail */
            double u = tdm_test_randu(&st);
            l[i] = (float)(kind == 2 ? 4.0 * u : -12.0 * u * u + (tdm_test_rand(&st) % 97 == 0 ? 9.0 : 0.0));
        }
        if (kind == 1) {
            l[10] = l[20] = l[30] = 12.0f; /* tied top */
            l[40] = l[50] = -INFINITY;
        }
        for (size_t b = 0; b < TDM_ARRAY_LEN(temps); b++)
            for (size_t c = 0; c < TDM_ARRAY_LEN(ks); c++)
                for (size_t d = 0; d < TDM_ARRAY_LEN(ps); d++)
                    for (size_t e = 0; e < TDM_ARRAY_LEN(mins); e++) {
                        tdm_sampler_params sp = {temps[b], ks[c], ps[d], mins[e]};
                        check_against_naive(l, N, sp, &s, kind == 0 ? "tail" : kind == 1 ? "tail+special" : "flat");
                    }
    }
    free(l);
    tdm_sampler_scratch_free(&s);
}

Test(sampling, top_p_exact_boundaries) {
    /* Uniform over 256 tokens and top_p = m / 256: the cumulative mass hits top_p
     * exactly after m tokens, so exactly m must be kept (the lowest ids). */
    enum { N = 256 };
    float l[N], pr[N];
    for (int i = 0; i < N; i++) l[i] = 0.25f;
    tdm_sampler_scratch s;
    cr_assert_eq(tdm_sampler_scratch_init(&s, N, NULL), TANDEM_OK);
    for (int m = 1; m < N; m++) {
        tdm_sampler_params sp = {1.0f, 0, (float)m / N, 0.0f};
        tdm_probs_from_logits(l, N, &sp, &s, pr);
        for (int i = 0; i < N; i++)
            cr_assert_eq(pr[i], i < m ? 1.0f / (float)m : 0.0f, "top_p %d/256: token %d has %g", m, i, pr[i]);
        sp.top_k = 200; /* relative to the top-k mass: m / 256 of 200 tokens */
        check_against_naive(l, N, sp, &s, "uniform top-k + top-p");
    }
    tdm_sampler_scratch_free(&s);
}

Test(sampling, filter_semantics_by_hand) {
    /* probabilities 0.4 0.3 0.2 0.1 at T = 1 */
    const float l[4] = {logf(0.1f), logf(0.4f), logf(0.2f), logf(0.3f)};
    float pr[4];
    tdm_sampler_scratch s;
    cr_assert_eq(tdm_sampler_scratch_init(&s, 4, NULL), TANDEM_OK);
    tdm_sampler_params sp = {1.0f, 2, 1.0f, 0.0f};
    tdm_probs_from_logits(l, 4, &sp, &s, pr); /* top-2: {1, 3} -> 4/7, 3/7 */
    cr_assert_float_eq(pr[1], 0.4f / 0.7f, 1e-6);
    cr_assert_float_eq(pr[3], 0.3f / 0.7f, 1e-6);
    cr_assert(pr[0] == 0 && pr[2] == 0);
    sp = (tdm_sampler_params){1.0f, 0, 0.65f, 0.0f}; /* 0.4 < 0.65 <= 0.7: two tokens */
    tdm_probs_from_logits(l, 4, &sp, &s, pr);
    cr_assert(pr[1] > 0 && pr[3] > 0 && pr[0] == 0 && pr[2] == 0);
    sp = (tdm_sampler_params){1.0f, 0, 0.75f, 0.0f}; /* three tokens */
    tdm_probs_from_logits(l, 4, &sp, &s, pr);
    cr_assert(pr[1] > 0 && pr[3] > 0 && pr[2] > 0 && pr[0] == 0);
    /* top-p after top-k is relative to the top-k mass: top-2 {0.4, 0.3} -> {4/7, 3/7}; p = 0.5 keeps one */
    sp = (tdm_sampler_params){1.0f, 2, 0.5f, 0.0f};
    tdm_probs_from_logits(l, 4, &sp, &s, pr);
    cr_assert_float_eq(pr[1], 1.0f, 1e-6);
    sp = (tdm_sampler_params){1.0f, 0, 1.0f, 0.6f}; /* min-p: keep p >= 0.24 */
    tdm_probs_from_logits(l, 4, &sp, &s, pr);
    cr_assert(pr[1] > 0 && pr[3] > 0 && pr[2] == 0 && pr[0] == 0);
    sp = (tdm_sampler_params){1.0f, 0, 0.0f, 0.0f}; /* top_p = 0: at least one token */
    tdm_probs_from_logits(l, 4, &sp, &s, pr);
    cr_assert_float_eq(pr[1], 1.0f, 1e-6);
    /* ties in top-k: lower id wins */
    const float t[5] = {1, 2, 2, 2, 0};
    sp = (tdm_sampler_params){1.0f, 2, 1.0f, 0.0f};
    float pr5[5];
    tdm_sampler_scratch_free(&s);
    cr_assert_eq(tdm_sampler_scratch_init(&s, 5, NULL), TANDEM_OK);
    tdm_probs_from_logits(t, 5, &sp, &s, pr5);
    cr_assert(pr5[1] == 0.5f && pr5[2] == 0.5f && pr5[3] == 0 && pr5[0] == 0 && pr5[4] == 0);
    tdm_sampler_scratch_free(&s);
}

/* The plain definition: the first index of the largest non-NaN value, 0 if none. */
static int32_t ref_argmax(const float *l, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(l[i]) && (best < 0 || l[i] > l[best])) best = i;
    return best < 0 ? 0 : best;
}

Test(sampling, argmax_matches_reference) {
    /* values drawn from a small set so ties are common; NaN and infinities mixed in */
    const float vals[] = {-INFINITY, -3.0f, -0.5f, 0.0f, 1.25f, 2.0f, INFINITY, NAN};
    uint64_t st = 77;
    float l[300];
    for (int it = 0; it < 20000; it++) {
        int32_t n = 1 + (int32_t)(tdm_test_rand(&st) % 300);
        int mode = (int)(tdm_test_rand(&st) % 4); /* which values may appear */
        int span = mode == 0 ? 8 : mode == 1 ? 6 : mode == 2 ? 2 : 1;
        int lo = mode == 3 ? 7 : mode == 2 ? 0 : 0;
        for (int32_t i = 0; i < n; i++) {
            int v = lo + (int)(tdm_test_rand(&st) % (uint64_t)span);
            if (mode == 2 && tdm_test_rand(&st) % 3 == 0) v = 7; /* -inf and NaN only */
            l[i] = mode == 1 && tdm_test_rand(&st) % 4 == 0 ? (float)tdm_test_randu(&st) : vals[v];
        }
        cr_assert_eq(tdm_argmax(l, n), ref_argmax(l, n), "iteration %d, n %d, mode %d", it, (int)n, mode);
    }
}

/* The plain definition in double: 1 / sum exp(l_i - max) over the finite logits. */
static double ref_top_prob(const float *l, int32_t n) {
    double m = -INFINITY, sum = 0;
    int32_t n_inf = 0;
    for (int32_t i = 0; i < n; i++) {
        if (l[i] == INFINITY) n_inf++;
        else if (!isnan(l[i]) && l[i] > m) m = l[i];
    }
    if (n_inf) return 1.0 / n_inf;
    if (m == -INFINITY) return 0.0;
    for (int32_t i = 0; i < n; i++)
        if (!isnan(l[i]) && l[i] != -INFINITY) sum += exp((double)l[i] - m);
    return 1.0 / sum;
}

Test(sampling, top_prob_matches_reference) {
    uint64_t st = 4242;
    float *l = malloc(8192 * sizeof *l);
    const int32_t sizes[] = {1, 2, 7, 8, 9, 15, 16, 17, 100, 8191, 8192};
    for (size_t a = 0; a < TDM_ARRAY_LEN(sizes); a++)
        for (int kind = 0; kind < 4; kind++) {
            const int32_t n = sizes[a];
            random_logits(&st, l, n, kind & 1);
            if (kind >= 2) /* scaled: flat (0.01) or peaked (8) distributions */
                for (int32_t i = 0; i < n; i++) l[i] *= kind == 2 ? 0.01f : 8.0f;
            double want = ref_top_prob(l, n);
            float got = tdm_top_prob(l, n);
            cr_assert_leq(fabs(got - want), 1e-5 * want, "n %d kind %d: got %.9g want %.9g", (int)n, kind,
                          (double)got, want);
        }
    /* NaN and -inf count as 0; +inf logits share the mass; nothing finite -> 0 */
    const float odd[6] = {NAN, -INFINITY, 2.0f, 2.0f, -1000.0f, NAN};
    cr_assert_float_eq(tdm_top_prob(odd, 6), 0.5f, 1e-6f);
    const float infs[4] = {INFINITY, 1.0f, INFINITY, NAN};
    cr_assert_float_eq(tdm_top_prob(infs, 4), 0.5f, 0.0f);
    const float none[3] = {NAN, -INFINITY, NAN};
    cr_assert_eq(tdm_top_prob(none, 3), 0.0f);
    cr_assert_eq(tdm_top_prob(none, 0), 0.0f);
    cr_assert_eq(tdm_top_prob(NULL, 4), 0.0f);
    free(l);
}

Test(sampling, greedy_and_ties) {
    const float l[6] = {1, 3, -2, 3, NAN, 2};
    cr_assert_eq(tdm_argmax(l, 6), 1);
    const float nanfirst[3] = {NAN, -5, -1};
    cr_assert_eq(tdm_argmax(nanfirst, 3), 2);
    cr_assert_eq(tdm_argmax(l, 0), -1);
    float pr[6];
    tdm_sampler_params sp = {0.0f, 0, 1.0f, 0.0f};
    tdm_probs_from_logits(l, 6, &sp, NULL, pr);
    for (int i = 0; i < 6; i++) cr_assert_eq(pr[i], i == 1 ? 1.0f : 0.0f);
    sp.temperature = -1.0f;
    tdm_probs_from_logits(l, 6, &sp, NULL, pr);
    cr_assert_eq(pr[1], 1.0f);
    tdm_rng r;
    tdm_rng_seed(&r, 1);
    tdm_rng before = r;
    cr_assert_eq(tdm_sample_logits(l, 6, &sp, NULL, pr, &r), 1);
    cr_assert(!memcmp(&r, &before, sizeof r), "greedy must not consume random numbers");
}

/* The engine's check of every output row: one NaN or infinity anywhere (each vector
 * lane, the scalar tail) makes a row non-finite, and its argmax -1. */
Test(sampling, non_finite_logits_are_found) {
    const int32_t n = 8192 + 5;
    float *l = malloc((size_t)n * sizeof *l);
    uint64_t st = 11;
    random_logits(&st, l, n, 0);
    cr_assert(tdm_logits_finite(l, n));
    cr_assert_eq(tdm_argmax_finite(l, n), tdm_argmax(l, n));
    const float bad[] = {NAN, INFINITY, -INFINITY};
    const int32_t at[] = {0, 1, 15, 16, 31, 4095, 8191, 8192, n - 1};
    for (size_t b = 0; b < TDM_ARRAY_LEN(bad); b++)
        for (size_t k = 0; k < TDM_ARRAY_LEN(at); k++) {
            float keep = l[at[k]];
            l[at[k]] = bad[b];
            cr_assert(!tdm_logits_finite(l, n), "%g at %d not found", bad[b], at[k]);
            cr_assert_eq(tdm_argmax_finite(l, n), -1);
            cr_assert(!tdm_logits_finite(l + at[k], 1));
            l[at[k]] = keep;
        }
    const float big[3] = {3.4e38f, -3.4e38f, 0.0f}; /* large but finite */
    cr_assert(tdm_logits_finite(big, 3));
    cr_assert(tdm_logits_finite(l, 0) && tdm_logits_finite(NULL, 0));
    free(l);
}

Test(sampling, extreme_temperatures_and_bad_logits) {
    const int32_t n = 100;
    float l[100], pr[100];
    uint64_t st = 5;
    random_logits(&st, l, n, 0);
    l[17] = 50.0f;
    l[42] = 50.0f;
    tdm_sampler_params sp = {1e-6f, 0, 1.0f, 0.0f};
    tdm_probs_from_logits(l, n, &sp, NULL, pr); /* two tied maxima share the mass */
    for (int i = 0; i < n; i++) cr_assert_float_eq(pr[i], (i == 17 || i == 42) ? 0.5f : 0.0f, 1e-6);
    sp.temperature = 1e30f;
    tdm_probs_from_logits(l, n, &sp, NULL, pr); /* uniform */
    for (int i = 0; i < n; i++) cr_assert_float_eq(pr[i], 0.01f, 1e-6);
    sp = (tdm_sampler_params){1e30f, 3, 1.0f, 0.0f}; /* uniform + top-k: lowest ids win ties */
    tdm_probs_from_logits(l, n, &sp, NULL, pr);
    for (int i = 0; i < n; i++) cr_assert_float_eq(pr[i], i < 3 ? 1.0f / 3 : 0.0f, 1e-6);
    /* -inf and NaN logits get probability 0; +inf logits take all the mass. */
    float bad[5] = {-INFINITY, 1.0f, NAN, 1.0f, -INFINITY};
    sp = (tdm_sampler_params){1.0f, 0, 1.0f, 0.0f};
    tdm_probs_from_logits(bad, 5, &sp, NULL, pr);
    cr_assert(pr[0] == 0 && pr[2] == 0 && pr[4] == 0 && pr[1] == 0.5f && pr[3] == 0.5f);
    float inf[4] = {1.0f, INFINITY, 3.0f, INFINITY};
    tdm_probs_from_logits(inf, 4, &sp, NULL, pr);
    cr_assert(pr[0] == 0 && pr[2] == 0 && pr[1] == 0.5f && pr[3] == 0.5f);
    float allbad[3] = {NAN, -INFINITY, NAN};
    tdm_probs_from_logits(allbad, 3, &sp, NULL, pr);
    cr_assert_eq(pr[0] + pr[1] + pr[2], 1.0f, "still a distribution");
}

Test(sampling, large_vocab_top_k_matches_naive) {
    const int32_t n = 151936;
    float *l = malloc((size_t)n * sizeof *l);
    uint64_t st = 1234;
    random_logits(&st, l, n, 0);
    tdm_sampler_scratch s;
    cr_assert_eq(tdm_sampler_scratch_init(&s, n, NULL), TANDEM_OK);
    check_against_naive(l, n, (tdm_sampler_params){0.8f, 40, 1.0f, 0.0f}, &s, "vocab150k k40");
    check_against_naive(l, n, (tdm_sampler_params){0.8f, 40, 0.9f, 0.05f}, &s, "vocab150k k40 p0.9");
    check_against_naive(l, n, (tdm_sampler_params){0.8f, 0, 0.95f, 0.0f}, &s, "vocab150k p0.95");
    check_against_naive(l, n, (tdm_sampler_params){0.3f, 0, 0.5f, 0.0f}, &s, "vocab150k p0.5");
    /* Timing (informative only): top-k 40 over 150k tokens should take about a millisecond. */
    float *pr = malloc((size_t)n * sizeof *pr);
    tdm_sampler_params sp = {0.8f, 40, 0.95f, 0.0f};
    double t0 = tdm_now();
    for (int i = 0; i < 20; i++) tdm_probs_from_logits(l, n, &sp, &s, pr);
    cr_log_info("probs_from_logits, vocab %d, k=40 p=0.95: %.3f ms", n, (tdm_now() - t0) / 20 * 1e3);
    tdm_sampler_scratch_free(&s);
    free(pr);
    free(l);
}

/* ------------------------------------------------------------- sampling */

Test(sampling, sample_probs_chi_square) {
    enum { N = 23, DRAWS = 300000 };
    float probs[N];
    double pd[N];
    uint64_t st = 77;
    for (int i = 0; i < N; i++) {
        probs[i] = (i % 5 == 3) ? 0.0f : (float)(0.01 + tdm_test_randu(&st)) * (i == 0 ? 20.0f : 1.0f);
        pd[i] = probs[i];
    }
    probs[N - 1] = 0.0f; /* the last token is impossible: the rounding guard must not pick it */
    pd[N - 1] = 0.0;
    uint64_t counts[N] = {0};
    tdm_rng r;
    tdm_rng_seed(&r, 2024);
    for (int i = 0; i < DRAWS; i++) {
        int32_t t = tdm_sample_probs(probs, N, &r);
        cr_assert(t >= 0 && t < N && probs[t] > 0, "drew impossible token %d", t);
        counts[t]++;
    }
    int df = 0;
    double pv = tdm_stat_chi2_gof(counts, pd, N, &df);
    cr_assert_gt(pv, 1e-3, "chi-square p-value %g (df %d)", pv, df);
    cr_assert_gt(df, 10);
}

Test(sampling, sample_probs_detects_wrong_distribution) {
    /* The chi-square check has power: drawing from p but testing against a slightly
     * different q must fail. */
    enum { N = 4, DRAWS = 200000 };
    float p[N] = {0.25f, 0.25f, 0.25f, 0.25f};
    double q[N] = {0.26, 0.24, 0.25, 0.25};
    uint64_t counts[N] = {0};
    tdm_rng r;
    tdm_rng_seed(&r, 3);
    for (int i = 0; i < DRAWS; i++) counts[tdm_sample_probs(p, N, &r)]++;
    cr_assert_lt(tdm_stat_chi2_gof(counts, q, N, NULL), 1e-3);
}

Test(sampling, sample_probs_one_draw_and_edges) {
    float p[5] = {0, 0.5f, 0, 0.5f, 0};
    tdm_rng r, ref;
    tdm_rng_seed(&r, 9);
    tdm_rng_seed(&ref, 9);
    for (int i = 0; i < 1000; i++) {
        int32_t t = tdm_sample_probs(p, 5, &r);
        cr_assert(t == 1 || t == 3);
        tdm_rng_next(&ref);
        cr_assert(!memcmp(&r, &ref, sizeof r), "tdm_sample_probs must use exactly one draw");
        /* and it is the inverse CDF of that draw */
    }
    /* Inverse CDF: u < 0.5 -> 1, else 3 (reconstructed from the same stream). */
    tdm_rng a, b;
    tdm_rng_seed(&a, 10);
    tdm_rng_seed(&b, 10);
    for (int i = 0; i < 1000; i++) {
        double u = tdm_rng_uniform(&b);
        cr_assert_eq(tdm_sample_probs(p, 5, &a), u < 0.5 ? 1 : 3);
    }
    float tail[3] = {1e-30f, 0, 0}; /* tiny mass, last positive entry first */
    cr_assert_eq(tdm_sample_probs(tail, 3, &r), 0);
    float none[3] = {0, -1, NAN};
    cr_assert_eq(tdm_sample_probs(none, 3, &r), -1);
    cr_assert_eq(tdm_sample_probs(p, 0, &r), -1);
    /* unnormalised input */
    float big[2] = {3, 1};
    uint64_t c[2] = {0};
    for (int i = 0; i < 40000; i++) c[tdm_sample_probs(big, 2, &r)]++;
    double pd[2] = {0.75, 0.25};
    cr_assert_gt(tdm_stat_chi2_gof(c, pd, 2, NULL), 1e-3);
}

/* Sparse rows of every length around the 16-entry blocks tdm_sample_probs skips,
 * with zero, negative and NaN entries: the token of each draw is the plain inverse
 * CDF of the same uniform (positive entries summed in index order). */
static int32_t inverse_cdf_ref(const float *p, int32_t n, double u) {
    double total = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++)
        if (p[i] > 0.0f) total += p[i], last = i;
    if (last < 0) return -1;
    double cum = 0.0;
    for (int32_t i = 0; i < last; i++)
        if (p[i] > 0.0f && u * total < (cum += p[i])) return i;
    return last;
}

Test(sampling, sample_probs_sparse_rows_match_inverse_cdf) {
    enum { NMAX = 70 };
    float p[NMAX];
    uint64_t st = 21;
    tdm_rng r;
    tdm_rng_seed(&r, 4);
    int checked = 0;
    for (int32_t n = 1; n <= NMAX; n++)
        for (int rep = 0; rep < 20; rep++) {
            for (int32_t i = 0; i < n; i++) {
                uint64_t k = tdm_test_rand(&st) % 16;
                p[i] = k == 0 ? (float)tdm_test_randu(&st) : k == 1 ? -0.5f : k == 2 ? NAN : 0.0f;
            }
            for (int d = 0; d < 8; d++) {
                tdm_rng before = r;
                int32_t got = tdm_sample_probs(p, n, &r);
                cr_assert_eq(got, inverse_cdf_ref(p, n, tdm_rng_uniform(&before)), "n %d", (int)n);
                checked += got >= 0;
            }
        }
    cr_assert_gt(checked, 5000);
}

Test(sampling, sample_logits_matches_processed_distribution) {
    enum { N = 12, DRAWS = 200000 };
    float l[N], pr[N];
    uint64_t st = 11;
    random_logits(&st, l, N, 0);
    tdm_sampler_params sp = {0.9f, 6, 0.9f, 0.02f};
    tdm_sampler_scratch s;
    cr_assert_eq(tdm_sampler_scratch_init(&s, N, NULL), TANDEM_OK);
    float want[N];
    tdm_probs_from_logits(l, N, &sp, &s, want);
    double pd[N];
    for (int i = 0; i < N; i++) pd[i] = want[i];
    uint64_t counts[N] = {0};
    tdm_rng r;
    tdm_rng_seed(&r, 5);
    for (int i = 0; i < DRAWS; i++) counts[tdm_sample_logits(l, N, &sp, &s, pr, &r)]++;
    double pv = tdm_stat_chi2_gof(counts, pd, N, NULL);
    cr_assert_gt(pv, 1e-3, "p-value %g", pv);
    tdm_sampler_scratch_free(&s);
}

Test(sampling, scratch_errors) {
    tdm_sampler_scratch s;
    tdm_err err = {0};
    cr_assert_eq(tdm_sampler_scratch_init(&s, 0, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strlen(err.msg) > 0);
    cr_assert_eq(tdm_sampler_scratch_init(NULL, 5, &err), TANDEM_ERR_INVALID_ARG);
    tdm_sampler_scratch_free(&s);
    tdm_sampler_scratch_free(NULL);
    /* A too-small scratch still gives the right answer (temporary buffers). */
    cr_assert_eq(tdm_sampler_scratch_init(&s, 2, NULL), TANDEM_OK);
    float l[8];
    uint64_t st = 3;
    random_logits(&st, l, 8, 0);
    check_against_naive(l, 8, (tdm_sampler_params){1.0f, 3, 0.8f, 0.0f}, &s, "small scratch");
    tdm_sampler_scratch_free(&s);
}
