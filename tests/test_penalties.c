/* test_penalties.c - presence / frequency / repetition penalties, logit_bias,
 * min_tokens (src/engine/penalty.h) and logprobs, composed with speculation:
 *   - greedy: the first two tokens are the argmax of a double-precision reference
 *     of the edits applied to the target's own logits (a target-only forward);
 *   - greedy, over dev prompts: the output with the draft (adaptive chains with
 *     n-gram lookups, fixed k, token trees of fixed budgets and auto ones, with and
 *     without lookups) equals the target-only penalised output (some under a
 *     grammar too), alone and in a batch of four (chains, and trees);
 *   - sampled: the first token (repetition penalty + logit_bias) and the speculated
 *     second (frequency / presence penalties of the first) against the edited
 *     softmax (chi-square), verified by rejection sampling and by agreement, chains
 *     and trees;
 *   - min_tokens and logit_bias on the end-of-generation tokens;
 *   - logprobs: every token's logprob and top alternatives against a double
 *     log-softmax of the target's logits by a target-only forward, with and without
 *     the draft, chains and trees (same tokens, within 1e-4);
 *   - bad values fail at submission naming the field;
 *   - the CPU backend's edit_rows op against the reference. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api_testutil.h"
#include "backend.h"
#include "engine.h"
#include "kv_cache.h"
#include "logit_edit.h"
#include "scheduler.h"
#include "stats.h"
#include "tandem.h"
#include "testutil.h"
#include "tokenizer.h"

static tdm_backend *g_wbe;
static tdm_model *g_target, *g_draft;

static void setup(void) { tdm_test_pair_load("pycode-draft-s-f16.gguf", &g_wbe, &g_target, &g_draft); }
static void teardown(void) { tdm_test_pair_free(g_wbe, g_target, g_draft); }

TestSuite(penalties, .init = setup, .fini = teardown, .timeout = 1800);

static tdm_engine *engine_of(tdm_model *draft, int32_t n_seq) {
    tdm_err err = {0};
    tdm_engine_cfg cfg = {.n_threads = 2, .n_seq_max = n_seq};
    tdm_engine *e;
    cr_assert_eq(tdm_engine_create(g_target, draft, &cfg, &e, &err), TANDEM_OK, "%s", err.msg);
    return e;
}

/* The edited logits (double) of the target after ids[n], of which ids[n_prompt..n)
 * are generated: logit_bias, repetition (prompt + generated), frequency / presence
 * (generated), min_tokens (eog suppressed while n - n_prompt < min_tokens). */
static void edited_logits(tdm_engine *e, const int32_t *ids, int32_t n, int32_t n_prompt,
                          const tandem_generate_params *gp, double *out) {
    const int32_t V = e->n_vocab;
    float *l = malloc((size_t)V * sizeof(float));
    int32_t *cnt = calloc((size_t)V, sizeof(int32_t));
    bool *in = calloc((size_t)V, sizeof(bool));
    tdm_err err = {0};
    cr_assert_eq(tdm_engine_score_last(e, false, ids, n, l, &err), TANDEM_OK, "%s", err.msg);
    for (int32_t i = 0; i < n; i++) {
        in[ids[i]] = true;
        if (i >= n_prompt) cnt[ids[i]]++;
    }
    for (int32_t v = 0; v < V; v++) {
        double x = l[v];
        for (int b = 0; b < gp->n_logit_bias; b++)
            if (gp->logit_bias[b].token == v) x += gp->logit_bias[b].bias;
        if (in[v] && gp->repetition_penalty != 1) x = x > 0 ? x / gp->repetition_penalty : x * gp->repetition_penalty;
        if (cnt[v] > 0) x -= gp->frequency_penalty * cnt[v] + gp->presence_penalty;
        if (n - n_prompt < gp->min_tokens && tdm_tok_is_eog(e->target->tok, v)) x = -1e30;
        out[v] = x;
    }
    free(l);
    free(cnt);
    free(in);
}

static int32_t argmax_d(const double *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* softmax (temperature 1) of x[n] into p, and log-softmax into lp (may be NULL) */
static void softmax_d(const double *x, int32_t n, double *p, double *lp) {
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < n; i++) mx = fmax(mx, x[i]);
    for (int32_t i = 0; i < n; i++) sum += exp(x[i] - mx);
    for (int32_t i = 0; i < n; i++) {
        if (p) p[i] = exp(x[i] - mx) / sum;
        if (lp) lp[i] = x[i] - mx - log(sum);
    }
}

/* Python-like definitions (the pycode pair writes Python). */
static const char *G_DEF = "root ::= \"def \" [a-z_]+ \"(\" [a-z, ]* \"):\\n    return \" [a-z0-9_ +*()]+ \"\\n\"";

static const tandem_logit_bias BIAS[] = {{13, 3.5f}, {220, -2.0f}, {7, 1.25f}, {198, -100.0f}};

/* the parameter sets the tests cycle through */
static tandem_generate_params params_of(int c) {
    tandem_generate_params gp = tandem_generate_default_params();
    switch (c % 4) {
    case 0:
        gp.presence_penalty = 0.8f, gp.frequency_penalty = 0.6f;
        break;
    case 1:
        gp.repetition_penalty = 1.3f;
        break;
    case 2:
        gp.logit_bias = BIAS, gp.n_logit_bias = TDM_ARRAY_LEN(BIAS), gp.frequency_penalty = -0.5f;
        break;
    default:
        gp.repetition_penalty = 0.9f, gp.presence_penalty = -1.0f, gp.frequency_penalty = 1.5f, gp.min_tokens = 10;
        gp.logit_bias = BIAS, gp.n_logit_bias = 2;
        break;
    }
    return gp;
}

/* The first tokens of greedy penalised target-only output are the reference's argmaxes. */
Test(penalties, greedy_first_tokens_follow_the_reference) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = engine_of(NULL, 1);
    const int32_t V = plain->n_vocab;
    double *x = malloc((size_t)V * sizeof(double));
    tdm_err err = {0};
    for (int c = 0; c < 8; c++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[c], "prompt_ids"), &n);
        tandem_generate_params gp = params_of(c);
        gp.max_tokens = 4;
        tandem_result r;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
        int32_t *all = malloc((n + 4) * sizeof(int32_t));
        memcpy(all, ids, n * sizeof(int32_t));
        for (size_t t = 0; t < r.n_tokens; t++) {
            edited_logits(plain, all, (int32_t)(n + t), (int32_t)n, &gp, x);
            cr_assert_eq(r.tokens[t], argmax_d(x, V), "set %d, token %zu: %d, the reference's argmax %d", c, t,
                         r.tokens[t], argmax_d(x, V));
            all[n + t] = r.tokens[t];
        }
        free(all);
        tandem_result_free(&r);
        free(ids);
    }
    free(x);
    tdm_engine_free(plain);
    tdm_test_jsonl_free(refs, n_lines);
}

static void expect_same(const tandem_result *got, const tandem_result *want, const tdm_engine *e, const char *what,
                        size_t li) {
    size_t diff = 0;
    while (diff < got->n_tokens && diff < want->n_tokens && got->tokens[diff] == want->tokens[diff]) diff++;
    cr_assert(got->n_tokens == want->n_tokens && diff == want->n_tokens,
              "prompt %zu, %s: output differs from target-only at token %zu (lengths %zu/%zu)", li, what, diff,
              got->n_tokens, want->n_tokens);
    cr_assert_eq(got->finish_reason, want->finish_reason, "prompt %zu, %s: finish reason", li, what);
    cr_assert_str_eq(got->text, want->text);
    cr_assert_eq(tdm_kv_pool_n_free(e->pool), tdm_kv_pool_n_blocks(e->pool), "prompt %zu, %s: KV blocks leaked", li,
                 what);
}

/* Greedy: the speculated penalised output equals the target-only one, over dev
 * prompts and parameter sets; the penalties change the output of some. */
Test(penalties, greedy_spec_equals_target_only) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = engine_of(NULL, 1), *spec = engine_of(g_draft, 1);
    static const struct {
        const char *what;
        int k, ngram, tree;
    } cfgs[] = {{"adaptive k, lookups", 0, 4, 0},
                {"k 4", 4, 0, 0},
                {"auto trees, lookups", 0, 4, TANDEM_SPEC_TREE_AUTO},
                {"tree of 8", 0, 0, 8},
                {"tree of 16, lookups", 0, 4, 16}};
    tdm_err err = {0};
    uint64_t drafted = 0, accepted = 0, tree_steps = 0;
    int changed = 0;
    const size_t n_prompts = tdm_test_sanitized() ? 6 : 32;
    for (size_t li = 0; li < n_prompts; li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params gp = params_of((int)li);
        gp.max_tokens = 40;
        if (li % 5 == 4) gp.grammar = G_DEF; /* (edits and a grammar's masks on one row) */
        tandem_generate_params off = tandem_generate_default_params();
        off.max_tokens = gp.max_tokens;
        tandem_result want, base;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &off, &base, &err), TANDEM_OK, "%s", err.msg);
        changed += base.n_tokens != want.n_tokens || memcmp(base.tokens, want.tokens, want.n_tokens * sizeof(int32_t));
        const int c = (int)(li % TDM_ARRAY_LEN(cfgs));
        tandem_generate_params sp = gp;
        sp.spec_k = cfgs[c].k;
        sp.spec_ngram = cfgs[c].ngram;
        sp.spec_tree = cfgs[c].tree;
        tandem_result got;
        cr_assert_eq(tdm_generate_one(spec, ids, (int32_t)n, &sp, &got, &err), TANDEM_OK, "%s", err.msg);
        expect_same(&got, &want, spec, cfgs[c].what, li);
        if (cfgs[c].tree > 0) tree_steps += got.spec.tree_steps;
        drafted += got.spec.drafted;
        accepted += got.spec.accepted;
        tandem_result_free(&got);
        tandem_result_free(&want);
        tandem_result_free(&base);
        free(ids);
    }
    cr_assert_gt(accepted, 0, "nothing drafted was accepted (%llu drafted)", (unsigned long long)drafted);
    cr_assert_gt(changed, (int)n_prompts / 4, "the penalties changed only %d outputs of %zu", changed, n_prompts);
    cr_assert_gt(tree_steps, 0, "no tree was verified");
    cr_log_info("penalised greedy: %llu drafted, %llu accepted, %llu tree steps; %d of %zu outputs changed",
                (unsigned long long)drafted, (unsigned long long)accepted, (unsigned long long)tree_steps, changed,
                n_prompts);
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}

/* A batch of penalised and plain greedy requests on a speculating engine of four
 * sequences (batch invariant): each gets its solo target-only output; tree: every
 * request asks for trees of that budget (some with lookups). */
static void batch_mixed(int tree) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    size_t n_lines;
    tdm_json **items = tdm_test_jsonl(tdm_test_data_path("prompts-dev.jsonl"), &n_lines);
    enum { N = 8 };
    tandem_request req[N];
    for (int i = 0; i < N; i++) {
        req[i] = tandem_request_default();
        req[i].prompt = tdm_json_get(items[40 + i], "prompt")->str;
        if (i % 4 != 3) req[i].params = params_of(i);
        req[i].params.max_tokens = 40;
        req[i].params.logprobs = i % 2 == 0;
        req[i].params.spec_tree = tree;
        if (tree) req[i].params.spec_ngram = i % 3 ? 4 : 0;
    }
    api_expect_batch_equals_solo(t, d, req, N);
    tdm_test_jsonl_free(items, n_lines);
    tandem_model_close(d);
    tandem_model_close(t);
}

Test(penalties, batch_mixed_equals_solo) { batch_mixed(0); }
Test(penalties, batch_mixed_trees_equals_solo) { batch_mixed(12); }
Test(penalties, batch_mixed_auto_trees_equals_solo) { batch_mixed(TANDEM_SPEC_TREE_AUTO); }

/* Sampled with speculation (k 1: the second token is a verified one): the first
 * token against the edited softmax after the prompt, the second (given the likeliest
 * first) against the edited softmax after it, where the frequency and presence
 * penalties of the first apply. */
static void chi_square(int32_t n_seq, int tree) {
    tdm_engine *spec = engine_of(g_draft, n_seq);
    const int32_t V = spec->n_vocab;
    size_t n_lines, n;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[3], "prompt_ids"), &n);
    const int32_t np = (int32_t)TDM_MIN(n, 24);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.temperature = 1.0f;
    gp.spec_k = 1;
    gp.spec_ngram = 0;
    gp.repetition_penalty = 1.6f;
    gp.frequency_penalty = 1.2f;
    gp.presence_penalty = 0.7f;
    gp.logit_bias = BIAS;
    gp.n_logit_bias = 3;
    gp.spec_tree = tree; /* (max_tokens 3: one level, the root's children, a multi-candidate verdict) */
    const int runs = tdm_test_sanitized() ? 300 : 1500;
    uint64_t *first = calloc((size_t)V, sizeof(uint64_t)), *second = calloc((size_t)V, sizeof(uint64_t));
    int32_t best;
    cr_assert_gt(api_first_two_tokens(spec, ids, np, &gp, runs, 991, first, second, &best), 0);
    if (tree) api_expect_tree_steps(spec, ids, np, &gp); /* (the verdicts were a tree's) */
    double *x = malloc((size_t)V * sizeof(double)), *p = malloc((size_t)V * sizeof(double));
    edited_logits(spec, ids, np, np, &gp, x);
    softmax_d(x, V, p, NULL);
    int df = 0;
    const double pv1 = tdm_stat_chi2_gof(first, p, V, &df);
    cr_assert_geq(pv1, 1e-3, "first token: chi-square p = %g (df %d)", pv1, df);
    int32_t *ids2 = malloc(((size_t)np + 1) * sizeof(int32_t));
    memcpy(ids2, ids, (size_t)np * sizeof(int32_t));
    ids2[np] = best;
    edited_logits(spec, ids2, np + 1, np, &gp, x);
    softmax_d(x, V, p, NULL);
    const double pv2 = tdm_stat_chi2_gof(second, p, V, &df);
    cr_assert_geq(pv2, 1e-3, "second token given %d (%llu runs): chi-square p = %g (df %d)", best,
                  (unsigned long long)first[best], pv2, df);
    cr_log_info("penalised chi-square, %d sequence(s), tree %d: first p %.3f, second p %.3f (%llu runs of the first)",
                (int)n_seq, tree, pv1, pv2, (unsigned long long)first[best]);
    free(ids2);
    free(x);
    free(p);
    free(first);
    free(second);
    free(ids);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}

Test(penalties, sampled_chi_square_rejection) { chi_square(1, 0); }
Test(penalties, sampled_chi_square_agreement) { chi_square(2, 0); }
Test(penalties, sampled_chi_square_tree_rejection) { chi_square(1, 4); }
Test(penalties, sampled_chi_square_tree_agreement) { chi_square(2, 4); }

/* min_tokens holds back an end of generation that logit_bias +100 forces; logit_bias
 * -100 on every end-of-generation token keeps generation going to max_tokens. */
Test(penalties, min_tokens_and_eos_bias) {
    tdm_engine *spec = engine_of(g_draft, 1);
    const int32_t *eog;
    const int32_t n_eog = tdm_tok_eog_ids(g_target->tok, &eog);
    cr_assert_gt(n_eog, 0);
    tandem_logit_bias lb[TDM_TOK_EOG_MAX];
    for (int32_t i = 0; i < n_eog; i++) lb[i] = (tandem_logit_bias){eog[i], 100.0f};
    const int32_t prompt[] = {1, 2, 3, 4, 5};
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 30;
    gp.logit_bias = lb;
    gp.n_logit_bias = n_eog;
    tandem_result r;
    tdm_err err = {0};
    cr_assert_eq(tdm_generate_one(spec, prompt, 5, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(r.n_tokens, 1, "EOS +100: the first token ends it (%zu tokens)", r.n_tokens);
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_EOS);
    tandem_result_free(&r);
    gp.min_tokens = 7;
    cr_assert_eq(tdm_generate_one(spec, prompt, 5, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(r.n_tokens, 8, "min_tokens 7: %zu tokens", r.n_tokens);
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_EOS);
    for (size_t i = 0; i < 7; i++) cr_assert(!tdm_tok_is_eog(g_target->tok, r.tokens[i]));
    tandem_result_free(&r);
    /* the stop string is not looked for before min_tokens */
    gp.n_logit_bias = 0;
    gp.min_tokens = 0;
    gp.max_tokens = 24;
    gp.ignore_eos = true;
    cr_assert_eq(tdm_generate_one(spec, prompt, 5, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_gt(strlen(r.text), 4);
    char stop[3] = {r.text[1], r.text[2], 0}; /* (a text that occurs at once) */
    const char *stops[] = {stop};
    tandem_result_free(&r);
    gp.stop = stops;
    gp.n_stop = 1;
    cr_assert_eq(tdm_generate_one(spec, prompt, 5, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_STOP);
    const size_t n_stopped = r.n_tokens;
    tandem_result_free(&r);
    gp.min_tokens = (int)n_stopped + 3;
    cr_assert_eq(tdm_generate_one(spec, prompt, 5, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_geq(r.n_tokens, (size_t)gp.min_tokens, "stopped at %zu tokens before min_tokens %d", r.n_tokens,
                  gp.min_tokens);
    tandem_result_free(&r);
    /* -100 on the end-of-generation tokens: none is generated */
    for (int32_t i = 0; i < n_eog; i++) lb[i].bias = -100.0f;
    gp = tandem_generate_default_params();
    gp.max_tokens = 40;
    gp.logit_bias = lb;
    gp.n_logit_bias = n_eog;
    gp.temperature = 1.5f;
    for (int s = 0; s < 4; s++) {
        gp.seed = (uint64_t)s;
        cr_assert_eq(tdm_generate_one(spec, prompt, 5, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(r.finish_reason, TANDEM_FINISH_LENGTH);
        for (size_t i = 0; i < r.n_tokens; i++) cr_assert(!tdm_tok_is_eog(g_target->tok, r.tokens[i]));
        tandem_result_free(&r);
    }
    tdm_engine_free(spec);
}

/* logprobs: each token's logprob and top alternatives against the double
 * log-softmax of the target's (edited) logits, with and without a draft. */
static void check_logprobs(const tandem_result *r, tdm_engine *ref, const int32_t *ids, int32_t n,
                           const tandem_generate_params *gp, const char *what) {
    const int32_t V = ref->n_vocab;
    double *x = malloc((size_t)V * sizeof(double)), *lp = malloc((size_t)V * sizeof(double));
    int32_t *all = malloc(((size_t)n + r->n_tokens) * sizeof(int32_t));
    memcpy(all, ids, (size_t)n * sizeof(int32_t));
    cr_assert(r->logprobs, "%s: no logprobs", what);
    for (size_t t = 0; t < r->n_tokens; t++) {
        edited_logits(ref, all, n + (int32_t)t, n, gp, x);
        softmax_d(x, V, NULL, lp);
        const tandem_token_logprob *g = &r->logprobs[t];
        cr_assert_float_eq(g->logprob, lp[r->tokens[t]], 1e-4, "%s, token %zu: logprob %g, reference %g", what, t,
                           g->logprob, lp[r->tokens[t]]);
        cr_assert_eq(g->n_top, gp->top_logprobs);
        for (int j = 0; j < g->n_top; j++) {
            cr_assert_float_eq(g->top_logprobs[j], lp[g->top_ids[j]], 1e-4, "%s, token %zu, top %d", what, t, j);
            if (j > 0) cr_assert_geq(g->top_logprobs[j - 1], g->top_logprobs[j]);
        }
        if (g->n_top > 0) cr_assert_eq(g->top_ids[0], argmax_d(x, V), "%s, token %zu: the likeliest", what, t);
        if (gp->temperature == 0 && g->n_top > 0) cr_assert_eq(g->top_ids[0], r->tokens[t]);
        all[n + t] = r->tokens[t];
    }
    free(all);
    free(x);
    free(lp);
}

typedef struct lp_stream {
    tandem_token_logprob lp[64];
    int n;
} lp_stream;

static bool lp_stream_cb(int32_t token, const char *text, size_t len, const tandem_token_logprob *lp, void *ud) {
    (void)token, (void)text, (void)len;
    lp_stream *out = ud;
    cr_assert(lp);
    if (out->n < 64) out->lp[out->n++] = *lp;
    return true;
}

Test(penalties, logprobs_equal_the_targets_log_softmax) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = engine_of(NULL, 1), *spec = engine_of(g_draft, 1), *spec2 = engine_of(g_draft, 2);
    tdm_err err = {0};
    uint64_t tree_steps = 0;
    for (int ct = 0; ct < 12; ct++) { /* (sets 0..5 with chains, again with trees) */
        const int c = ct % 6, tree = ct < 6 ? 0 : ct % 2 ? 8 : 16;
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[10 + c], "prompt_ids"), &n);
        tandem_generate_params gp = c % 2 ? params_of(c) : tandem_generate_default_params();
        gp.max_tokens = 12;
        gp.spec_k = 3; /* (a fixed length: the automatic one may choose none on a loaded machine) */
        gp.logprobs = true;
        gp.top_logprobs = c == 4 ? 0 : 5 + 3 * c;
        if (c == 5) gp.temperature = 0.8f, gp.seed = 5;
        gp.spec_tree = tree;
        gp.spec_ngram = tree == 16 ? 4 : 0;
        tandem_result want, got;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        check_logprobs(&want, plain, ids, (int32_t)n, &gp, "target-only");
        tdm_engine *s = c == 5 ? spec2 : spec; /* (a sampled one: agreement, same seed, same tokens) */
        /* streamed: the callback's logprobs are the result's */
        lp_stream *streamed = calloc(1, sizeof *streamed);
        gp.on_token_lp = lp_stream_cb;
        gp.user_data = streamed;
        cr_assert_eq(tdm_generate_one(s, ids, (int32_t)n, &gp, &got, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(got.n_tokens, want.n_tokens);
        cr_assert_eq(memcmp(got.tokens, want.tokens, got.n_tokens * sizeof(int32_t)), 0, "set %d: tokens differ", c);
        check_logprobs(&got, plain, ids, (int32_t)n, &gp, tree ? "speculated, trees" : "speculated");
        cr_assert_gt(got.spec.drafted, 0);
        tree_steps += got.spec.tree_steps;
        cr_assert_eq(streamed->n, (int)got.n_tokens);
        for (size_t t = 0; t < got.n_tokens; t++)
            cr_assert_eq(memcmp(&streamed->lp[t], &got.logprobs[t], sizeof got.logprobs[t]), 0);
        free(streamed);
        tandem_result_free(&want);
        tandem_result_free(&got);
        free(ids);
    }
    cr_assert_gt(tree_steps, 0, "no tree was verified");
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_engine_free(spec2);
    tdm_test_jsonl_free(refs, n_lines);
}

/* Bad values fail at submission, naming the field (the public API's message). */
Test(penalties, bad_values_name_the_field) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine *e = api_open_engine(t, NULL, NULL);
    static const tandem_logit_bias bad_id[] = {{-1, 1.0f}}, bad_bias[] = {{5, 101.0f}}, twice[] = {{5, 1}, {5, 2}};
    static const struct {
        const char *field;
        int which;
    } cases[] = {{"presence_penalty", 0}, {"frequency_penalty", 1}, {"repetition_penalty", 2}, {"repetition_penalty", 3},
                 {"min_tokens", 4},       {"logit_bias", 5},        {"logit_bias", 6},         {"logit_bias", 7},
                 {"top_logprobs", 8},     {"top_logprobs", 9},      {"logit_bias", 10}};
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++) {
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 2;
        switch (cases[i].which) {
        case 0: gp.presence_penalty = 2.5f; break;
        case 1: gp.frequency_penalty = NAN; break;
        case 2: gp.repetition_penalty = 0; break;
        case 3: gp.repetition_penalty = -1; break;
        case 4: gp.min_tokens = -1; break;
        case 5: gp.logit_bias = bad_id, gp.n_logit_bias = 1; break;
        case 6: gp.logit_bias = bad_bias, gp.n_logit_bias = 1; break;
        case 7: gp.logit_bias = twice, gp.n_logit_bias = 2; break;
        case 8: gp.top_logprobs = 21, gp.logprobs = true; break;
        case 9: gp.top_logprobs = 3; break;
        default: gp.logit_bias = NULL, gp.n_logit_bias = 1; break;
        }
        tandem_result r;
        cr_assert_eq(tandem_generate(e, "def f", &gp, &r), TANDEM_ERR_INVALID_ARG, "case %zu accepted", i);
        cr_assert(strstr(tandem_last_error(), cases[i].field), "case %zu: \"%s\" does not name %s", i,
                  tandem_last_error(), cases[i].field);
    }
    tandem_engine_close(e);
    tandem_model_close(t);
}

/* The CPU backend's edit_rows op against the reference, and its argument checks. */
Test(penalties, cpu_edit_rows_equals_reference) {
    tdm_backend *b;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &b, &err), TANDEM_OK, "%s", err.msg);
    enum { N = 3, D = 50 };
    float x[N * D], y[N * D];
    for (int i = 0; i < N * D; i++) x[i] = y[i] = (float)((i * 37) % 23) - 11.0f;
    const tdm_logit_edit ed[] = {{3, 1.0f, 0.5f, 2.0f, -0.25f}, {49, 0, 1, 1, -3}, {0, 0, 0, 0, TDM_LOGIT_NONE},
                                 {7, -100, 1, 1, 0},            {8, 2, 0.25f, 4, 0}};
    const int32_t off[N + 1] = {0, 3, 3, 5};
    cr_assert_eq(b->ops->edit_rows(b, x, N, D, ed, off, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(tdm_logits_edit_rows(y, N, D, ed, off));
    cr_assert_eq(memcmp(x, y, sizeof x), 0);
    cr_assert_eq(x[0], TDM_LOGIT_NONE);
    const float old = (float)(((2 * D + 8) * 37) % 23) - 11.0f + 2; /* (row 2, token 8: bias 2, then / 4 or * 4) */
    cr_assert_float_eq(x[2 * D + 8], old > 0 ? old * 0.25f : old * 4, 1e-6);
    const tdm_logit_edit out_of_range[] = {{D, 0, 1, 1, 1}};
    const int32_t off1[2] = {0, 1};
    cr_assert_eq(b->ops->edit_rows(b, x, 1, D, out_of_range, off1, &err), TANDEM_ERR_INVALID_ARG);
    tdm_backend_destroy(b);
}

/* The CPU backend's row_top op (the logprobs summary of device rows) against a double
 * reference: the logsumexp, the k largest entries with ties to the lower id, the
 * logit of the token asked for; k 0 and an id out of range. */
Test(penalties, cpu_row_top_equals_reference) {
    tdm_backend *b;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &b, &err), TANDEM_OK, "%s", err.msg);
    enum { N = 3, D = 1000 };
    float *x = malloc(N * D * sizeof(float));
    for (int i = 0; i < N * D; i++) x[i] = (float)((i * 7919) % 997) / 40.0f - 12.0f; /* (many ties) */
    x[D + 5] = TDM_LOGIT_NONE;
    const int32_t want[N] = {17, -1, 999};
    tdm_row_top out[N];
    for (int k = 0; k <= TDM_ROW_TOP_MAX; k += 20) {
        cr_assert_eq(b->ops->row_top(b, x, N, D, k, want, out, &err), TANDEM_OK, "%s", err.msg);
        for (int i = 0; i < N; i++) {
            const float *r = x + i * D;
            double mx = -INFINITY, sum = 0;
            for (int v = 0; v < D; v++) mx = fmax(mx, r[v]);
            for (int v = 0; v < D; v++) sum += exp((double)r[v] - mx);
            cr_assert_float_eq(out[i].lse, mx + log(sum), 1e-5);
            cr_assert_eq(out[i].want, want[i] >= 0 ? r[want[i]] : 0.0f);
            cr_assert_eq(out[i].k, k);
            for (int j = 0; j < k; j++) { /* the j-th largest, ties to the lower id */
                int rank = 0;
                for (int v = 0; v < D; v++) rank += r[v] > r[out[i].ids[j]] || (r[v] == r[out[i].ids[j]] && v < out[i].ids[j]);
                cr_assert_eq(rank, j, "row %d, entry %d: id %d ranks %d", i, j, out[i].ids[j], rank);
                cr_assert_eq(out[i].val[j], r[out[i].ids[j]]);
            }
        }
    }
    cr_assert_eq(b->ops->row_top(b, x, N, D, TDM_ROW_TOP_MAX + 1, want, out, &err), TANDEM_ERR_INVALID_ARG);
    free(x);
    tdm_backend_destroy(b);
}
