/* test_spec_stat.c - statistical losslessness of speculative sampling: with a
 * small random-weight model pair made here, the empirical distribution of the
 * generated tokens at positions 1..4 under speculative sampling matches
 * target-only sampling (two-sample chi-square, p-value > 1e-4, fixed seeds; 20000
 * draws per distribution, an eighth of them in a sanitizer build, a 32nd for the
 * long de Bruijn prompt there).  The seeds are fixed but adaptive configurations
 * draw by measured costs, so each run is a fresh sample: 72 p-values a test
 * command (9 cases, 4 positions, 2 builds) at 1e-3 would fail a correct engine in
 * 7 % of runs (one did, p = 0.00031, 2026-12-06); at 1e-4, 0.7 % (with the two
 * draft_vocab cases, 88 p-values: 0.9 %).  A different distribution must score
 * below the same bound (the last test).  Two cases run with the draft's head over
 * half the vocabulary (draft_vocab). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "scheduler.h"
#include "stats.h"
#include "testutil.h"
#include "tiny_model.h"

/* Draws per distribution: 20000 in the release build (the test's power); a
 * sanitizer build checks the same paths with an eighth of them. */
#define N_RUNS (tdm_test_sanitized() ? 2500 : 20000)
#define N_POS 4

typedef struct pair {
    char *tpath, *dpath;
    tdm_backend *wbe;
    tdm_model *target, *draft;
} pair;

static void pair_open(pair *p, uint64_t dseed) {
    tdm_err err = {0};
    tdm_tiny_cfg tc = tdm_tiny_default();
    tdm_tiny_cfg dc = tdm_tiny_default();
    dc.seed = dseed;
    dc.n_layer = 1;
    dc.n_embd = 32;
    dc.n_head = 2;
    dc.n_head_kv = 1;
    dc.n_ff = 64;
    p->tpath = tdm_tiny_model_file(&tc);
    p->dpath = tdm_tiny_model_file(&dc);
    cr_assert_eq(tdm_backend_cpu_create(1, &p->wbe, &err), TANDEM_OK);
    cr_assert_eq(tdm_model_load(p->tpath, p->wbe, &p->target, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(p->dpath, p->wbe, &p->draft, &err), TANDEM_OK, "%s", err.msg);
}

static void pair_close(pair *p) {
    tdm_model_free(p->target);
    tdm_model_free(p->draft);
    tdm_backend_destroy(p->wbe);
    unlink(p->tpath);
    unlink(p->dpath);
    free(p->tpath);
    free(p->dpath);
}

/* counts[pos][token] over n_runs sampled continuations */
static void sample_counts(tdm_engine *e, const tandem_generate_params *base, const int32_t *prompt,
                          int32_t n_prompt, uint64_t seed0, int n_runs, int32_t V, uint64_t *counts,
                          tandem_spec_stats *agg) {
    tdm_test_sample_counts(e, base, prompt, n_prompt, seed0, n_runs, N_POS, V, counts, agg);
}

/* Prompts: PLAIN {3, 7, 1}; REPEAT P + C + P where C is the target's greedy
 * continuation of P, so a step-start lookup proposes C whenever the first sampled
 * token is C's first (plausible proposals, accepted or rejected at random); DEBRUIJN:
 * every bigram over tokens 0..14, then 15, which occurs nowhere before: a step-start
 * lookup of "15 y" fails, so the draft model proposes x, and then "y x" always
 * matches - the chain is completed by lookup after a drafted prefix. */
enum { PROMPT_PLAIN, PROMPT_REPEAT, PROMPT_DEBRUIJN };

static int32_t make_prompt(int kind, tdm_engine *plain, int32_t *prompt) {
    prompt[0] = 3, prompt[1] = 7, prompt[2] = 1;
    if (kind == PROMPT_REPEAT) {
        tdm_err err = {0};
        tandem_generate_params g0 = tandem_generate_default_params();
        g0.max_tokens = 6;
        tandem_result c;
        cr_assert_eq(tdm_generate_one(plain, prompt, 3, &g0, &c, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(c.n_tokens, 6);
        memcpy(prompt + 3, c.tokens, 6 * sizeof(int32_t));
        memcpy(prompt + 9, prompt, 3 * sizeof(int32_t));
        tandem_result_free(&c);
        return 12;
    }
    if (kind == PROMPT_DEBRUIJN) {
        /* greedy "prefer the largest unused successor" walk from 0: a de Bruijn
         * sequence of order 2 over 15 symbols (checked below) */
        bool used[15][15] = {{false}};
        int32_t n = 0;
        prompt[n++] = 0;
        for (;;) {
            int32_t last = prompt[n - 1], next = -1;
            for (int32_t t = 14; t >= 0 && next < 0; t--)
                if (!used[last][t]) next = t;
            if (next < 0) break;
            used[last][next] = true;
            prompt[n++] = next;
        }
        for (int32_t a = 0; a < 15; a++)
            for (int32_t b = 0; b < 15; b++) cr_assert(used[a][b], "bigram %d %d missing", a, b);
        prompt[n++] = 15;
        return n;
    }
    return 3;
}

/* tree: spec_tree (0 = chains), shape: spec_tree_shape (NULL = none); n_sub > 0: the
 * draft's head over tokens [0, n_sub) only (tdm_engine_set_draft_vocab) */
static void check_lossless_s(float temp, int top_k, float top_p, int spec_k, float p_min, int ngram, int kind, int tree,
                             const char *shape, int32_t n_sub) {
    pair p;
    pair_open(&p, 2);
    tdm_err err = {0};
    tdm_engine_cfg cfg = {.n_threads = 1};
    tdm_engine *plain, *spec;
    cr_assert_eq(tdm_engine_create(p.target, NULL, &cfg, &plain, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_create(p.target, p.draft, &cfg, &spec, &err), TANDEM_OK, "%s", err.msg);
    int32_t V = p.target->hp.n_vocab;
    if (n_sub > 0) {
        int32_t ids[96];
        for (int32_t i = 0; i < n_sub; i++) ids[i] = i;
        cr_assert_eq(tdm_engine_set_draft_vocab(spec, ids, n_sub, &err), TANDEM_OK, "%s", err.msg);
    }
    uint64_t *a = calloc((size_t)(N_POS * V), 8), *b = calloc((size_t)(N_POS * V), 8);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.temperature = temp;
    gp.top_k = top_k;
    gp.top_p = top_p;
    gp.spec_k = spec_k;
    gp.spec_p_min = p_min;
    gp.spec_ngram = ngram;
    gp.spec_tree = tree;
    gp.spec_tree_shape = shape;
    int32_t prompt[240];
    int32_t n_prompt = make_prompt(kind, plain, prompt);
    tandem_spec_stats agg = {0};
    /* every draw prefills its prompt: the de Bruijn prompt (226 tokens) costs a
     * sanitizer build most of this file's time, so there it takes a quarter of the
     * draws (625: the same paths, a chi-square of less power) */
    const int n_runs = kind == PROMPT_DEBRUIJN && tdm_test_sanitized() ? N_RUNS / 4 : N_RUNS;
    sample_counts(plain, &gp, prompt, n_prompt, 1000000, n_runs, V, a, NULL);
    sample_counts(spec, &gp, prompt, n_prompt, 2000000, n_runs, V, b, &agg);
    double acc = agg.drafted ? (double)agg.accepted / (double)agg.drafted : 0;
    cr_log_info("temp %.2f top_k %d top_p %.2f k %d p_min %.2f tree %d %s draft vocab %d: acceptance %.3f, %.3f "
                "drafted per run",
                temp, top_k, top_p, spec_k, p_min, tree, shape ? shape : "-", n_sub ? (int)n_sub : (int)V, acc,
                (double)agg.drafted / n_runs);
    if (tree || shape) cr_assert_gt(agg.tree_steps, 0, "no tree was verified");
    /* the test is only meaningful when some drafts are accepted and some rejected */
    cr_assert(acc > 0.05 && acc < 0.98, "acceptance %.3f: the pair does not exercise both outcomes", acc);
    if (ngram) {
        double ng_acc = agg.ngram_drafted ? (double)agg.ngram_accepted / (double)agg.ngram_drafted : 0;
        cr_log_info("  n-gram: %.3f steps per run, acceptance %.3f", (double)agg.ngram_steps / n_runs, ng_acc);
        /* (an adaptive configuration takes lookups by measured costs, which a
         * sanitizer build sharing two cores distorts: such runs looked up 128
         * tokens in all, and once 13 (7 accepted); there, where memory errors are
         * what the build looks for, one of each outcome; 200 in the normal build) */
        const uint64_t min_each = tdm_test_sanitized() ? 1 : 200;
        cr_assert(agg.ngram_accepted >= min_each && agg.ngram_drafted - agg.ngram_accepted >= min_each,
                  "n-gram proposals: %llu accepted of %llu, both outcomes not exercised",
                  (unsigned long long)agg.ngram_accepted, (unsigned long long)agg.ngram_drafted);
    }
    for (int i = 0; i < N_POS; i++) {
        double pv = tdm_stat_chi2_two_sample(a + i * V, b + i * V, V);
        cr_log_info("  position %d: p-value %.4f", i + 1, pv);
        cr_assert_gt(pv, 1e-4, "position %d: speculative sampling differs from target-only (p = %.2g)", i + 1,
                     pv);
    }
    free(a);
    free(b);
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    pair_close(&p);
}

static void check_lossless_t(float temp, int top_k, float top_p, int spec_k, float p_min, int ngram, int kind, int tree,
                             const char *shape) {
    check_lossless_s(temp, top_k, top_p, spec_k, p_min, ngram, kind, tree, shape, 0);
}

static void check_lossless(float temp, int top_k, float top_p, int spec_k, float p_min, int ngram, int kind) {
    check_lossless_t(temp, top_k, top_p, spec_k, p_min, ngram, kind, 0, NULL);
}

Test(spec_stat, plain_temperature_k3, .timeout = 600) { check_lossless(1.0f, 0, 1.0f, 3, 0.0f, 0, PROMPT_PLAIN); }
Test(spec_stat, top_k_top_p_k2, .timeout = 600) { check_lossless(0.8f, 8, 0.9f, 2, 0.0f, 0, PROMPT_PLAIN); }
Test(spec_stat, adaptive_k, .timeout = 600) { check_lossless(1.2f, 0, 1.0f, 0, 0.0f, 0, PROMPT_PLAIN); }
/* early stop by the draft's top probability (decided before drawing the token) */
Test(spec_stat, p_min_early_stop_k4, .timeout = 600) { check_lossless(1.6f, 0, 1.0f, 4, 0.55f, 0, PROMPT_PLAIN); }
/* n-gram proposals (a one-hot draft distribution) mixed with the draft model's */
Test(spec_stat, ngram_lookup_adaptive, .timeout = 600) { check_lossless(0.6f, 0, 1.0f, 0, 0.0f, 3, PROMPT_REPEAT); }
Test(spec_stat, ngram_lookup_top_k_top_p_k3, .timeout = 600) {
    check_lossless(0.9f, 6, 0.9f, 3, 0.0f, 2, PROMPT_REPEAT);
}
/* chains whose drafted prefix is completed by lookup */
Test(spec_stat, ngram_completes_drafted_chains, .timeout = 600) {
    check_lossless(2.5f, 0, 1.0f, 4, 0.0f, 2, PROMPT_DEBRUIJN);
}

/* token trees: multi-candidate rejection sampling over siblings drawn without
 * replacement, a static shape and a dynamic tree */
Test(spec_stat, tree_static_shape, .timeout = 600) { check_lossless_t(1.0f, 0, 1.0f, 0, 0.0f, 0, PROMPT_PLAIN, 0, "3,2,1"); }
Test(spec_stat, tree_dynamic_top_k, .timeout = 600) { check_lossless_t(0.8f, 8, 0.9f, 0, 0.0f, 0, PROMPT_PLAIN, 12, NULL); }

/* the draft's head over half the vocabulary (draft_vocab): its proposals never name
 * the other tokens, which the target still emits at their probability; a chain with
 * top-k / top-p and a dynamic tree */
Test(spec_stat, draft_vocab_subset_k3, .timeout = 600) {
    check_lossless_s(0.9f, 6, 0.95f, 3, 0.0f, 0, PROMPT_PLAIN, 0, NULL, 8);
}
Test(spec_stat, draft_vocab_subset_tree, .timeout = 600) {
    check_lossless_s(1.0f, 0, 1.0f, 0, 0.0f, 0, PROMPT_PLAIN, 12, NULL, 8);
}

/* Sanity check of the test itself: a different model gives a detectably different
 * distribution, so the chi-square test has power. */
Test(spec_stat, test_detects_a_different_distribution, .timeout = 600) {
    pair p;
    pair_open(&p, 2);
    tdm_err err = {0};
    tdm_engine_cfg cfg = {.n_threads = 1};
    tdm_engine *et, *ed;
    cr_assert_eq(tdm_engine_create(p.target, NULL, &cfg, &et, &err), TANDEM_OK);
    cr_assert_eq(tdm_engine_create(p.draft, NULL, &cfg, &ed, &err), TANDEM_OK);
    int32_t V = p.target->hp.n_vocab;
    uint64_t *a = calloc((size_t)(N_POS * V), 8), *b = calloc((size_t)(N_POS * V), 8);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.temperature = 1.0f;
    const int32_t prompt[] = {3, 7, 1};
    sample_counts(et, &gp, prompt, 3, 1, N_RUNS, V, a, NULL);
    sample_counts(ed, &gp, prompt, 3, 2, N_RUNS, V, b, NULL);
    double pv = tdm_stat_chi2_two_sample(a, b, V);
    cr_assert_lt(pv, 1e-4, "target and draft distributions not told apart (p = %.3g)", pv);
    free(a);
    free(b);
    tdm_engine_free(et);
    tdm_engine_free(ed);
    pair_close(&p);
}
