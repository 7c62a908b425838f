/* test_constrained.c - grammar-constrained decoding (tandem_generate_params.grammar /
 * .json_schema, src/engine/constrain.h) composed with speculation:
 *   - greedy: under a GBNF grammar and under a JSON schema, over dev prompts, the
 *     output with the draft (chains at fixed and adaptive lengths, n-gram lookups,
 *     token trees of fixed budgets and auto ones) equals the target-only
 *     constrained output token for token (and logprobs, on a third of the prompts,
 *     within 1e-4), every text a sentence (or, cut by max_tokens, a prefix) of the
 *     grammar, and no KV block leaks;
 *   - a batch of constrained and unconstrained requests on a speculating engine of
 *     four sequences (chains, and trees) gives each its solo target-only output;
 *   - sampled: the constrained target's distribution: the first token and the
 *     speculated second (given the first) against the masked softmax of the
 *     target's logits (chi-square; chains and trees), and the speculated output
 *     equal to the target-only output drawn with the same seed;
 *   - the matcher's mark / rollback as the step uses it, fuzzed against a matcher
 *     replayed on the kept tokens; a tree's rows (tdm_constraint_tree_rows) and the
 *     commit of a random path of it, likewise;
 *   - a grammar that finishes ends the request (finish reason stop); bad grammars
 *     and schemas fail at submission through the public API with the grammar
 *     engine's message. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api_testutil.h"
#include "constrain.h"
#include "engine.h"
#include "json_schema.h"
#include "kv_cache.h"
#include "scheduler.h"
#include "stats.h"
#include "tandem.h"
#include "testutil.h"

/* Python-like function definitions (the pycode pair writes Python). */
static const char *G_PY =
    "root ::= \"def \" name \"(\" params? \"):\\n\" body\n"
    "name ::= [a-z_] [a-z0-9_]{0,15}\n"
    "params ::= name (\",\" \" \"? name){0,4}\n"
    "body ::= (\"    \" stmt \"\\n\"){1,4}\n"
    "stmt ::= \"return \" expr | name \" = \" expr\n"
    "expr ::= atom (\" \" op \" \" atom){0,3}\n"
    "atom ::= name | [0-9]{1,4} | name \"(\" \")\"\n"
    "op ::= [-+*/] | \"==\"\n";

static const char *S_OBJ =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20},"
    "\"id\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":10},"
    "\"maxItems\":3}},\"required\":[\"name\",\"id\",\"tags\"],\"additionalProperties\":false}";

static tdm_backend *g_wbe;
static tdm_model *g_target, *g_draft;

static void setup(void) { tdm_test_pair_load("pycode-draft-s-f16.gguf", &g_wbe, &g_target, &g_draft); }
static void teardown(void) { tdm_test_pair_free(g_wbe, g_target, g_draft); }

TestSuite(constrained, .init = setup, .fini = teardown, .timeout = 1800);

/* An engine of n_seq sequences (2 threads): on an engine of one, a sampled sequence
 * is verified by rejection sampling; on more, by agreement with the target's draws. */
static tdm_engine *engine_of(tdm_model *draft, int32_t n_seq) {
    tdm_err err = {0};
    tdm_engine_cfg cfg = {.n_threads = 2, .n_seq_max = n_seq};
    tdm_engine *e;
    cr_assert_eq(tdm_engine_create(g_target, draft, &cfg, &e, &err), TANDEM_OK, "%s", err.msg);
    return e;
}

/* The text is a sentence of g (finished or ended by end of generation) or, when
 * max_tokens cut it, a prefix of one. */
static void expect_text_fits(const tdm_grammar *g, const tandem_result *r, const char *what, size_t li) {
    tdm_err err = {0};
    if (r->finish_reason == TANDEM_FINISH_LENGTH) {
        tdm_gmatch *m;
        cr_assert_eq(tdm_gmatch_create(g, &m, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(tdm_gmatch_accept(m, r->text, strlen(r->text), &err), TANDEM_OK,
                     "%s, prompt %zu: not a prefix of the grammar: \"%s\" (%s)", what, li, r->text, err.msg);
        tdm_gmatch_free(m);
        return;
    }
    bool ok = false;
    cr_assert_eq(tdm_grammar_matches(g, r->text, strlen(r->text), &ok, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(ok, "%s, prompt %zu (finish %d): not a sentence of the grammar: \"%s\"", what, li, (int)r->finish_reason,
              r->text);
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
    cr_assert_eq(!got->logprobs, !want->logprobs, "prompt %zu, %s: logprobs", li, what);
    for (size_t t = 0; want->logprobs && t < want->n_tokens; t++) { /* (the speculated ones' from verified rows) */
        const tandem_token_logprob *a = &got->logprobs[t], *b = &want->logprobs[t];
        cr_assert_float_eq(a->logprob, b->logprob, 1e-4, "prompt %zu, %s, token %zu: logprob %g, target-only %g", li,
                           what, t, a->logprob, b->logprob);
        cr_assert_eq(a->n_top, b->n_top);
        for (int j = 0; j < a->n_top; j++) { /* (the ids where no near tie could swap them) */
            cr_assert_float_eq(a->top_logprobs[j], b->top_logprobs[j], 1e-4);
            const bool tie = (j > 0 && b->top_logprobs[j - 1] - b->top_logprobs[j] < 1e-3f) ||
                             (j + 1 < b->n_top && b->top_logprobs[j] - b->top_logprobs[j + 1] < 1e-3f);
            if (!tie) cr_assert_eq(a->top_ids[j], b->top_ids[j], "prompt %zu, %s, token %zu: alternative %d", li, what, t, j);
        }
    }
    cr_assert_eq(tdm_kv_pool_n_free(e->pool), tdm_kv_pool_n_blocks(e->pool), "prompt %zu, %s: KV blocks leaked", li,
                 what);
}

typedef struct spec_cfg {
    const char *what;
    int k, ngram, tree;
} spec_cfg;

/* Greedy equality over n_prompts dev prompts under one constraint. */
static void greedy_equality(const char *grammar, const char *schema, size_t n_prompts) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    cr_assert_geq(n_lines, n_prompts);
    tdm_engine *plain = tdm_test_engine(g_target, NULL, 2), *spec = tdm_test_engine(g_target, g_draft, 2);
    tdm_grammar *g;
    tdm_err err = {0};
    cr_assert_eq(grammar ? tdm_grammar_parse(grammar, strlen(grammar), &g, &err)
                         : tdm_json_schema_grammar(schema, strlen(schema), &g, &err),
                 TANDEM_OK, "%s", err.msg);
    static const spec_cfg cfgs[] = {
        {"adaptive k, lookups", 0, 4, 0},
        {"k 4, no lookups", 4, 0, 0},
        {"k 1", 1, 0, 0},
        {"lookups of 2", 0, 2, 0},
        {"auto trees, lookups", 0, 4, TANDEM_SPEC_TREE_AUTO},
        {"tree of 8", 0, 0, 8},
        {"tree of 16, lookups", 0, 4, 16},
        {"tree of 32", 0, 0, 32},
    };
    uint64_t drafted = 0, accepted = 0, tree_steps = 0;
    const size_t stride = tdm_test_sanitized() ? 10 : 1;
    for (size_t li = 0; li < n_prompts; li += stride) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 48;
        gp.grammar = grammar;
        gp.json_schema = schema;
        gp.logprobs = li % 3 == 0; /* (under the mask: the speculated tokens' from the verified rows) */
        gp.top_logprobs = gp.logprobs ? 3 : 0;
        tandem_result want;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_gt(want.n_tokens, 0);
        expect_text_fits(g, &want, "target-only", li);
        for (size_t c = 0; c < TDM_ARRAY_LEN(cfgs); c++) {
            if (!tdm_test_sanitized() && (c + li) % 2) continue; /* (half the configurations per prompt) */
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
        }
        tandem_result_free(&want);
        free(ids);
    }
    cr_assert_gt(drafted, 0, "nothing was drafted");
    cr_assert_gt(accepted, 0, "nothing drafted was accepted");
    cr_assert_gt(tree_steps, 0, "no tree was verified");
    cr_log_info("constrained greedy: %llu drafted, %llu accepted, %llu tree steps", (unsigned long long)drafted,
                (unsigned long long)accepted, (unsigned long long)tree_steps);
    tdm_grammar_free(g);
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}

Test(constrained, greedy_grammar_spec_equals_target_only) { greedy_equality(G_PY, NULL, 24); }

Test(constrained, greedy_schema_spec_equals_target_only) { greedy_equality(NULL, S_OBJ, 24); }

/* A batch of constrained (grammar, schema) and unconstrained greedy requests on a
 * speculating engine of four sequences: each gets its solo target-only output;
 * tree: every request asks for trees of that budget (some with lookups). */
static void batch_mixed(int tree) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    size_t n_lines;
    tdm_json **items = tdm_test_jsonl(tdm_test_data_path("prompts-dev.jsonl"), &n_lines);
    enum { N = 7 };
    tandem_request req[N];
    for (int i = 0; i < N; i++) {
        req[i] = tandem_request_default();
        req[i].prompt = tdm_json_get(items[30 + i], "prompt")->str;
        req[i].params.max_tokens = 40;
        if (i % 3 == 0) req[i].params.grammar = G_PY;
        if (i % 3 == 1) req[i].params.json_schema = S_OBJ;
        req[i].params.spec_tree = tree;
        if (tree) req[i].params.spec_ngram = i % 2 ? 4 : 0;
    }
    api_expect_batch_equals_solo(t, d, req, N);
    tdm_test_jsonl_free(items, n_lines);
    tandem_model_close(d);
    tandem_model_close(t);
}

Test(constrained, batch_mixed_equals_solo) { batch_mixed(0); }
Test(constrained, batch_mixed_trees_equals_solo) { batch_mixed(12); }
Test(constrained, batch_mixed_auto_trees_equals_solo) { batch_mixed(TANDEM_SPEC_TREE_AUTO); }

/* More schemas than the engine shares (TDM_CON_SHARED): a speculating engine of 12
 * sequences runs 12 requests of 10 schemas at once (two repeated: those share a
 * grammar; with every place in use the rest compile their own), after 10 solo runs
 * on a target-only engine (whose places are replaced as new schemas come); each
 * batched output equals its solo one and fits its schema. */
Test(constrained, more_schemas_than_shared_places) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    size_t n_lines;
    tdm_json **items = tdm_test_jsonl(tdm_test_data_path("prompts-dev.jsonl"), &n_lines);
    enum { N = 12 };
    char schema[N][256];
    tandem_request req[N];
    for (int i = 0; i < N; i++) {
        const int k = i < 10 ? i : i - 10; /* (requests 10 and 11: the schemas of 0 and 1) */
        snprintf(schema[i], sizeof schema[i],
                 "{\"type\":\"object\",\"properties\":{\"n%d\":{\"type\":\"string\",\"maxLength\":%d},"
                 "\"id\":{\"type\":\"integer\"}},\"required\":[\"n%d\",\"id\"],\"additionalProperties\":false}",
                 k, 4 + k, k);
        req[i] = tandem_request_default();
        req[i].prompt = tdm_json_get(items[40 + i], "prompt")->str;
        req[i].params.max_tokens = 20;
        req[i].params.json_schema = schema[i];
    }
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    ep.n_seq_max = N;
    ep.batch_invariant = true;
    tandem_engine *plain = api_open_engine(t, NULL, NULL), *batch = api_open_engine(t, d, &ep);
    tandem_result want[N], got[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(tandem_generate(plain, req[i].prompt, &req[i].params, &want[i]), TANDEM_OK, "%s",
                     tandem_last_error());
    cr_assert_eq(tandem_generate_batch(batch, req, N, got), TANDEM_OK, "%s", tandem_last_error());
    for (int i = 0; i < N; i++) {
        cr_assert_eq(got[i].status, TANDEM_OK, "request %d: %s", i, got[i].error ? got[i].error : "");
        cr_assert_eq(got[i].n_tokens, want[i].n_tokens, "request %d", i);
        cr_assert_eq(memcmp(got[i].tokens, want[i].tokens, got[i].n_tokens * sizeof(int32_t)), 0,
                     "request %d differs from its solo output", i);
        tdm_grammar *g;
        tdm_err err = {0};
        cr_assert_eq(tdm_json_schema_grammar(schema[i], strlen(schema[i]), &g, &err), TANDEM_OK, "%s", err.msg);
        expect_text_fits(g, &got[i], "batched", (size_t)i);
        tdm_grammar_free(g);
        tandem_result_free(&got[i]);
        tandem_result_free(&want[i]);
    }
    tandem_engine_close(batch);
    tandem_engine_close(plain);
    tdm_test_jsonl_free(items, n_lines);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* A grammar that nothing can follow ends the request at once, finish reason stop. */
Test(constrained, finished_grammar_stops) {
    tdm_engine *e = tdm_test_engine(g_target, g_draft, 2);
    const int32_t prompt[] = {1, 2, 3, 4};
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 30;
    gp.grammar = "root ::= \"def main():\"";
    tandem_result r;
    tdm_err err = {0};
    cr_assert_eq(tdm_generate_one(e, prompt, 4, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_str_eq(r.text, "def main():");
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_STOP);
    tandem_result_free(&r);
    tdm_engine_free(e);
}

/* Sampled, on an engine of two sequences (verification by agreement with the
 * target's own masked draws; chains and trees): the speculated output equals the
 * target-only output drawn with the same seed. */
Test(constrained, sampled_spec_equals_target_only_same_seed) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = engine_of(NULL, 2), *spec = engine_of(g_draft, 2);
    tdm_err err = {0};
    uint64_t drafted = 0;
    for (size_t li = 0; li < 8; li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 40;
        gp.temperature = 0.7f;
        gp.top_k = li % 2 ? 20 : 0;
        gp.seed = 1000 + li;
        gp.grammar = li % 2 ? NULL : G_PY;
        gp.json_schema = li % 2 ? S_OBJ : NULL;
        gp.spec_k = li % 3 == 0 ? 0 : 3;
        gp.spec_tree = li % 4 == 1 ? 8 : li % 4 == 2 ? TANDEM_SPEC_TREE_AUTO : 0;
        tandem_result want, got;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(tdm_generate_one(spec, ids, (int32_t)n, &gp, &got, &err), TANDEM_OK, "%s", err.msg);
        expect_same(&got, &want, spec, "sampled", li);
        drafted += got.spec.drafted;
        tandem_result_free(&want);
        tandem_result_free(&got);
        free(ids);
    }
    cr_assert_gt(drafted, 0);
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}

/* The masked softmax (temperature 1) of the target's logits after ids[n] under the
 * state of m, into p[V]. */
static void masked_softmax(tdm_engine *e, const int32_t *ids, int32_t n, tdm_gmatch *m, const tdm_gvocab *v,
                           double *p) {
    const int32_t V = e->n_vocab;
    float *l = malloc((size_t)V * sizeof(float));
    uint32_t *mask = calloc(e->mask_words, sizeof(uint32_t));
    tdm_err err = {0};
    cr_assert_eq(tdm_engine_score_last(e, false, ids, n, l, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_gmatch_mask(m, v, mask, NULL, &err), TANDEM_OK, "%s", err.msg);
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < V; i++)
        if (i < tdm_gvocab_n(v) && (mask[i / 32] >> (i % 32) & 1)) mx = fmax(mx, l[i]);
    for (int32_t i = 0; i < V; i++) {
        const bool ok = i < tdm_gvocab_n(v) && (mask[i / 32] >> (i % 32) & 1);
        p[i] = ok ? exp((double)l[i] - mx) : 0;
        sum += p[i];
    }
    for (int32_t i = 0; i < V; i++) p[i] /= sum;
    free(l);
    free(mask);
}

/* Sampled with speculation (k 1, or a tree of `tree` nodes: max_tokens 3 leaves it one
 * level, the root's children, so that the second token is a verified one): the first
 * token against the masked softmax after the prompt, and the second, given the
 * likeliest first, against the masked softmax after it; on an engine of one sequence
 * (rejection sampling with masked p and q rows, multi-candidate for a tree) and of
 * two (agreement). */
static void chi_square(int32_t n_seq, int tree) {
    tdm_engine *spec = engine_of(g_draft, n_seq);
    const int32_t V = spec->n_vocab;
    size_t n_lines, n;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[3], "prompt_ids"), &n);
    const int32_t np = (int32_t)TDM_MIN(n, 24);
    const char *gram = "root ::= [a-z_ ]{16,40}";
    tdm_grammar *g;
    tdm_gmatch *m;
    const tdm_gvocab *v;
    tdm_err err = {0};
    cr_assert_eq(tdm_grammar_parse(gram, strlen(gram), &g, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_gmatch_create(g, &m, &err), TANDEM_OK, "%s", err.msg);
    /* the engine's vocabulary (built at the first constrained request) */
    tandem_generate_params gp = tandem_generate_default_params();
    gp.temperature = 1.0f;
    gp.grammar = gram;
    gp.spec_k = 1;
    gp.spec_ngram = 0;
    gp.spec_tree = tree;
    const int runs = tdm_test_sanitized() ? 300 : 1500;
    uint64_t *first = calloc((size_t)V, sizeof(uint64_t)), *second = calloc((size_t)V, sizeof(uint64_t));
    int32_t best;
    cr_assert_gt(api_first_two_tokens(spec, ids, np, &gp, runs, 77, first, second, &best), 0);
    if (tree) api_expect_tree_steps(spec, ids, np, &gp); /* (the verdicts were a tree's) */
    v = spec->gvocab;
    cr_assert(v);
    double *p = malloc((size_t)V * sizeof(double));
    masked_softmax(spec, ids, np, m, v, p);
    int df = 0;
    const double pv1 = tdm_stat_chi2_gof(first, p, V, &df);
    cr_assert_geq(pv1, 1e-3, "first token: chi-square p = %g (df %d)", pv1, df);
    int32_t *ids2 = malloc(((size_t)np + 1) * sizeof(int32_t));
    memcpy(ids2, ids, (size_t)np * sizeof(int32_t));
    ids2[np] = best;
    cr_assert_eq(tdm_gmatch_accept_token(m, v, best, &err), TANDEM_OK, "%s", err.msg);
    masked_softmax(spec, ids2, np + 1, m, v, p);
    const double pv2 = tdm_stat_chi2_gof(second, p, V, &df);
    cr_assert_geq(pv2, 1e-3, "second token given %d (%llu runs): chi-square p = %g (df %d)", best,
                  (unsigned long long)first[best], pv2, df);
    cr_log_info("chi-square, %d sequence(s), tree %d: first p %.3f, second p %.3f (%llu runs of the first)", (int)n_seq,
                tree, pv1, pv2, (unsigned long long)first[best]);
    free(ids2);
    free(p);
    free(first);
    free(second);
    free(ids);
    tdm_gmatch_free(m);
    tdm_grammar_free(g);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}

Test(constrained, sampled_chi_square_rejection) { chi_square(1, 0); }
Test(constrained, sampled_chi_square_agreement) { chi_square(2, 0); }
Test(constrained, sampled_chi_square_tree_rejection) { chi_square(1, 4); }
Test(constrained, sampled_chi_square_tree_agreement) { chi_square(2, 4); }

/* A random allowed token of the mask (-1: none). */
static int32_t pick_allowed(const uint32_t *mask, int32_t V, uint64_t *rs) {
    int32_t n = 0;
    for (int32_t i = 0; i < V; i++) n += mask[i / 32] >> (i % 32) & 1;
    if (n == 0) return -1;
    int32_t want = (int32_t)(tdm_test_rand(rs) % (uint64_t)n);
    for (int32_t i = 0; i < V; i++)
        if ((mask[i / 32] >> (i % 32) & 1) && want-- == 0) return i;
    return -1;
}

/* Steps as the scheduler runs them (mark; a chain accepted token by token; rollback
 * to mark + a random accepted length; the bonus token; now and then a commit of the
 * history) against a matcher replayed on the kept tokens: the same masks, the same
 * completeness. */
Test(constrained, rollback_fuzz_against_replay) {
    const tdm_tokenizer *tok = g_target->tok;
    tdm_gvocab *v;
    tdm_grammar *g;
    tdm_gmatch *m;
    tdm_err err = {0};
    cr_assert_eq(tdm_gvocab_create(tok, &v, &err), TANDEM_OK, "%s", err.msg);
    const int32_t V = tdm_gvocab_n(v);
    const size_t W = tdm_gvocab_mask_words(v);
    uint32_t *mask = malloc(W * 4), *mask2 = malloc(W * 4);
    const char *grams[] = {G_PY, NULL};
    char *schema_gbnf = NULL;
    cr_assert_eq(tdm_json_schema_to_gbnf(S_OBJ, strlen(S_OBJ), &schema_gbnf, &err), TANDEM_OK, "%s", err.msg);
    grams[1] = schema_gbnf;
    uint64_t rs = 12345;
    int steps = 0;
    for (int gi = 0; gi < 2; gi++) {
        cr_assert_eq(tdm_grammar_parse(grams[gi], strlen(grams[gi]), &g, &err), TANDEM_OK, "%s", err.msg);
        for (int run = 0; run < (tdm_test_sanitized() ? 4 : 30); run++) {
            cr_assert_eq(tdm_gmatch_create(g, &m, &err), TANDEM_OK, "%s", err.msg);
            int32_t kept[256];
            int32_t n_kept = 0;
            while (n_kept < 200 && !tdm_gmatch_is_finished(m)) {
                const uint32_t mark = tdm_gmatch_mark(m);
                const int32_t k = (int32_t)(tdm_test_rand(&rs) % 6);
                int32_t chain[8], nc = 0;
                for (; nc < k; nc++) { /* (a chain the grammar allows, as a masked draft draws it) */
                    cr_assert_eq(tdm_gmatch_mask(m, v, mask, NULL, &err), TANDEM_OK, "%s", err.msg);
                    const int32_t x = pick_allowed(mask, V, &rs);
                    if (x < 0 || tdm_gvocab_is_eog(v, x)) break;
                    cr_assert_eq(tdm_gmatch_accept_token(m, v, x, &err), TANDEM_OK, "%s", err.msg);
                    chain[nc] = x;
                }
                const int32_t acc = nc ? (int32_t)(tdm_test_rand(&rs) % (uint64_t)(nc + 1)) : 0;
                cr_assert_eq(tdm_gmatch_rollback(m, mark + (uint32_t)acc, &err), TANDEM_OK, "%s", err.msg);
                for (int32_t i = 0; i < acc && n_kept < 256; i++) kept[n_kept++] = chain[i];
                cr_assert_eq(tdm_gmatch_mask(m, v, mask, NULL, &err), TANDEM_OK, "%s", err.msg);
                const int32_t bonus = pick_allowed(mask, V, &rs);
                if (bonus < 0 || tdm_gvocab_is_eog(v, bonus)) break;
                cr_assert_eq(tdm_gmatch_accept_token(m, v, bonus, &err), TANDEM_OK, "%s", err.msg);
                kept[n_kept++] = bonus;
                if (tdm_test_rand(&rs) % 4 == 0) cr_assert_eq(tdm_gmatch_commit(m, &err), TANDEM_OK, "%s", err.msg);
                /* the replay */
                tdm_gmatch *r;
                cr_assert_eq(tdm_gmatch_create(g, &r, &err), TANDEM_OK, "%s", err.msg);
                for (int32_t i = 0; i < n_kept; i++)
                    cr_assert_eq(tdm_gmatch_accept_token(r, v, kept[i], &err), TANDEM_OK, "%s", err.msg);
                cr_assert_eq(tdm_gmatch_mask(m, v, mask, NULL, &err), TANDEM_OK, "%s", err.msg);
                cr_assert_eq(tdm_gmatch_mask(r, v, mask2, NULL, &err), TANDEM_OK, "%s", err.msg);
                cr_assert_eq(memcmp(mask, mask2, W * 4), 0, "grammar %d, run %d: masks differ after %d kept tokens", gi,
                             run, (int)n_kept);
                cr_assert_eq(tdm_gmatch_is_complete(m), tdm_gmatch_is_complete(r));
                tdm_gmatch_free(r);
                steps++;
            }
            tdm_gmatch_free(m);
        }
        tdm_grammar_free(g);
    }
    cr_assert_gt(steps, 200);
    cr_log_info("rollback fuzz: %d steps", steps);
    free(schema_gbnf);
    free(mask);
    free(mask2);
    tdm_gvocab_free(v);
}

/* A fresh matcher of g fed a[0..na) then b[0..nb): its mask into mask (false, mask
 * untouched, when the grammar refuses a token); *complete whether the text is a
 * sentence. */
static bool replay_mask(const tdm_grammar *g, const tdm_gvocab *v, const int32_t *a, int32_t na, const int32_t *b,
                        int32_t nb, uint32_t *mask, int32_t *n_allowed, bool *complete) {
    tdm_gmatch *r;
    tdm_err err = {0};
    cr_assert_eq(tdm_gmatch_create(g, &r, &err), TANDEM_OK, "%s", err.msg);
    bool ok = true;
    for (int32_t i = 0; i < na; i++) cr_assert_eq(tdm_gmatch_accept_token(r, v, a[i], &err), TANDEM_OK, "%s", err.msg);
    for (int32_t i = 0; i < nb && ok; i++) ok = tdm_gmatch_accept_token(r, v, b[i], &err) == TANDEM_OK;
    if (ok) cr_assert_eq(tdm_gmatch_mask(r, v, mask, n_allowed, &err), TANDEM_OK, "%s", err.msg);
    if (ok && complete) *complete = tdm_gmatch_is_complete(r);
    tdm_gmatch_free(r);
    return ok;
}

/* Node i's path (its ancestors' tokens, root first, then its own) into path; its length. */
static int32_t tree_path(const int32_t *token, const int32_t *parent, int32_t i, int32_t *path) {
    int32_t d = 0, tmp[64];
    for (int32_t a = i; a >= 0; a = parent[a]) tmp[d++] = token[a];
    for (int32_t x = 0; x < d; x++) path[x] = tmp[d - 1 - x];
    return d;
}

/* Trees as the step verifies them: random trees below the committed text (each
 * child a token the grammar allows after its parent's path, now and then one it may
 * refuse, as an n-gram lookup's), the drafting's masks of some paths
 * (tdm_constraint_path_mask, kept) and the rows' masks (tdm_constraint_tree_rows,
 * which reuse them) against matchers replayed on the committed text and each node's path (a refused
 * or finished path: a row allowing everything), then a random accepted path and a
 * bonus token committed (tdm_constraint_commit): the committed matcher's masks and
 * completeness equal a replay's of the committed tokens. */
Test(constrained, tree_rows_and_commit_fuzz_against_replay) {
    tdm_engine *e = tdm_test_engine(g_target, NULL, 2);
    tdm_err err = {0};
    uint64_t rs = 777;
    int steps = 0, refused_nodes = 0;
    for (int gi = 0; gi < 2; gi++) {
        for (int run = 0; run < (tdm_test_sanitized() ? 2 : 6); run++) {
            tandem_generate_params gp = tandem_generate_default_params();
            gp.grammar = gi == 0 ? G_PY : NULL;
            gp.json_schema = gi == 1 ? S_OBJ : NULL;
            tdm_seq q = {0};
            cr_assert_eq(tdm_constraint_init(e, &q, &gp, &err), TANDEM_OK, "%s", err.msg);
            const tdm_gvocab *v = q.con->v;
            const tdm_grammar *g = q.con->g;
            const int32_t V = tdm_gvocab_n(v);
            const size_t W = q.con->words;
            uint32_t *mask = calloc(W, 4), *all = malloc(W * 4);
            memset(all, 0xff, W * 4);
            int32_t kept[512], n_kept = 0;
            while (n_kept < 160 && !tdm_constraint_finished(&q)) {
                /* a random tree */
                int32_t token[TDM_TREE_MAX_NODES], parent[TDM_TREE_MAX_NODES], depth[TDM_TREE_MAX_NODES], path[64];
                const int32_t n = 1 + (int32_t)(tdm_test_rand(&rs) % 20);
                for (int32_t i = 0; i < n; i++) {
                    int32_t p = (int32_t)(tdm_test_rand(&rs) % (uint64_t)(i + 1)) - 1;
                    while (p >= 0 && depth[p] >= 6) p = parent[p];
                    parent[i] = p;
                    depth[i] = p < 0 ? 0 : depth[p] + 1;
                    const int32_t d = p < 0 ? 0 : tree_path(token, parent, p, path);
                    int32_t x = -1, n_allowed = 0;
                    if (tdm_test_rand(&rs) % 8 && replay_mask(g, v, kept, n_kept, path, d, mask, &n_allowed, NULL))
                        x = pick_allowed(mask, V, &rs);
                    token[i] = x >= 0 ? x : (int32_t)(tdm_test_rand(&rs) % (uint64_t)V); /* (maybe refused) */
                }
                /* the drafting's masks of some paths (kept, then reused by the rows) */
                for (int32_t r = 0; r <= n; r++) {
                    if (tdm_test_rand(&rs) % 2) continue;
                    const int32_t d = r == 0 ? 0 : tree_path(token, parent, r - 1, path);
                    const uint32_t *got = NULL;
                    int32_t n_got = -1, n_allowed = 0;
                    cr_assert_eq(tdm_constraint_path_mask(&q, path, d, &got, &n_got, &err), TANDEM_OK, "%s", err.msg);
                    if (replay_mask(g, v, kept, n_kept, path, d, mask, &n_allowed, NULL)) {
                        cr_assert_eq(n_got, n_allowed);
                        cr_assert(got && memcmp(got, mask, W * 4) == 0, "the path mask of row %d differs", (int)r);
                    } else {
                        cr_assert(!got && n_got == 0, "a refused path's mask");
                    }
                }
                cr_assert_eq(tdm_constraint_tree_rows(&q, token, parent, n, &err), TANDEM_OK, "%s", err.msg);
                for (int32_t r = 0; r <= n; r++) {
                    const int32_t d = r == 0 ? 0 : tree_path(token, parent, r - 1, path);
                    int32_t n_allowed = 0;
                    const bool ok = replay_mask(g, v, kept, n_kept, path, d, mask, &n_allowed, NULL);
                    const uint32_t *want = ok && n_allowed > 0 ? mask : all;
                    refused_nodes += !ok;
                    cr_assert_eq(memcmp(tdm_constraint_row(&q, r), want, W * 4), 0,
                                 "grammar %d, run %d, %d kept: the tree row %d differs from the replay's%s", gi, run,
                                 (int)n_kept, (int)r, ok ? "" : " (a refused path)");
                }
                /* a random accepted path (as far as the grammar takes it), then a bonus */
                const int32_t end = (int32_t)(tdm_test_rand(&rs) % (uint64_t)(n + 1)) - 1;
                int32_t m = end < 0 ? 0 : tree_path(token, parent, end, path);
                int32_t ok_len = 0, n_allowed = 0;
                while (ok_len < m && replay_mask(g, v, kept, n_kept, path, ok_len + 1, mask, &n_allowed, NULL) &&
                       n_allowed > 0)
                    ok_len++;
                m = (int32_t)(tdm_test_rand(&rs) % (uint64_t)(ok_len + 1));
                for (int32_t i = 0; i < m; i++) {
                    cr_assert(tdm_constraint_commit(&q, path[i]), "a path token the rows allowed was refused");
                    kept[n_kept++] = path[i];
                }
                cr_assert(replay_mask(g, v, kept, n_kept, NULL, 0, mask, &n_allowed, NULL));
                const int32_t bonus = pick_allowed(mask, V, &rs);
                if (bonus < 0 || tdm_gvocab_is_eog(v, bonus)) break;
                cr_assert(tdm_constraint_commit(&q, bonus));
                kept[n_kept++] = bonus;
                /* the committed state against the replay */
                bool complete = false;
                cr_assert(replay_mask(g, v, kept, n_kept, NULL, 0, mask, &n_allowed, &complete));
                uint32_t *now = calloc(W, 4);
                int32_t n_now = 0;
                cr_assert_eq(tdm_constraint_mask_now(&q, now, &n_now, &err), TANDEM_OK, "%s", err.msg);
                cr_assert_eq(memcmp(now, mask, W * 4), 0, "grammar %d, run %d: masks differ after %d kept tokens", gi,
                             run, (int)n_kept);
                cr_assert_eq(tdm_gmatch_is_complete(q.con->m), complete);
                free(now);
                steps++;
            }
            free(mask);
            free(all);
            tdm_constraint_free(&q);
        }
    }
    cr_assert_gt(steps, 40);
    cr_assert_gt(refused_nodes, 0, "no tree held a refused node");
    cr_log_info("tree rollback fuzz: %d steps, %d refused paths", steps, refused_nodes);
    tdm_engine_free(e);
}

/* Bad constraints fail at submission through the public API, with the grammar
 * engine's message. */
/* A request of grammar / schema on e fails with TANDEM_ERR_INVALID_ARG, its message
 * holding each of the needles (NULL-terminated). */
static void expect_refused(tandem_engine *e, const char *grammar, const char *schema, const char *const *needles) {
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 4;
    gp.grammar = grammar;
    gp.json_schema = schema;
    tandem_result r;
    cr_assert_eq(tandem_generate(e, "def f", &gp, &r), TANDEM_ERR_INVALID_ARG, "%s / %s was accepted",
                 grammar ? grammar : "-", schema ? schema : "-");
    for (const char *const *x = needles; *x; x++)
        cr_assert(strstr(tandem_last_error(), *x), "'%s' lacks '%s'", tandem_last_error(), *x);
}

Test(constrained, bad_grammar_and_schema_through_the_api) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine *e = api_open_engine(t, NULL, NULL);
    expect_refused(e, "root ::= \"a\" undefined_rule", NULL, (const char *[]){"grammar: line 1:", "undefined_rule", NULL});
    expect_refused(e, "root ::= (\"a\"", NULL, (const char *[]){"grammar: ", NULL});
    expect_refused(e, NULL, "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"x+\"}}}",
                   (const char *[]){"json_schema: ", "#/properties/a", NULL});
    expect_refused(e, NULL, "{\"type\":", (const char *[]){"json_schema: ", NULL});
    expect_refused(e, "root ::= \"a\"", "{\"type\":\"object\"}", (const char *[]){"both", NULL});
    tandem_generate_params gp = tandem_generate_default_params();
    tandem_result r;
    gp.json_schema = "{\"type\":\"object\"}";
    /* json_object mode: any JSON object */
    gp.grammar = NULL;
    gp.max_tokens = 24;
    cr_assert_eq(tandem_generate(e, "def f", &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    const char *x = r.text;
    while (*x == ' ' || *x == '\n' || *x == '\t') x++;
    cr_assert_eq(*x, '{', "%s", r.text);
    tandem_result_free(&r);
    tandem_engine_close(e);
    tandem_model_close(t);
}

/* A KV pool for about two of four constrained sequences on a speculating engine: the
 * scheduler preempts and recomputes, the matchers follow the kept tokens, and every
 * request gets its solo target-only output. */
Test(constrained, preemption_keeps_the_grammar) {
    static const char *schema =
        "{\"type\": \"array\", \"minItems\": 40, \"items\": {\"type\": \"object\", \"properties\": {\"id\": {\"type\": "
        "\"integer\"}, \"name\": {\"type\": \"string\", \"maxLength\": 16}}, \"required\": [\"id\", \"name\"], "
        "\"additionalProperties\": false}}";
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    tandem_model_info mt, md;
    cr_assert_eq(tandem_model_get_info(t, &mt), TANDEM_OK);
    cr_assert_eq(tandem_model_get_info(d, &md), TANDEM_OK);
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    ep.n_seq_max = 4;
    ep.batch_invariant = true;
    ep.kv_bytes = (size_t)(mt.kv_bytes_per_token + md.kv_bytes_per_token) * 2 * 170;
    tandem_engine *e = api_open_engine(t, d, &ep), *plain = api_open_engine(t, NULL, NULL);
    static const char *const prompts[4] = {"import os\n", "def main():\n", "class A:\n", "x = 1\n"};
    tandem_request r[4];
    tandem_result out[4], want[4];
    for (int i = 0; i < 4; i++) {
        r[i] = tandem_request_default();
        r[i].prompt = prompts[i];
        r[i].params.max_tokens = 150;
        r[i].params.ignore_eos = true;
        r[i].params.spec_k = 4; /* (a fixed length and no lookups: the blocks the steps */
        r[i].params.spec_ngram = 0; /* take, and so the preemptions, do not depend on measured costs) */
        if (i % 2) r[i].params.json_schema = schema;
        else r[i].params.grammar = "root ::= (\"x\" [0-9]{1,3} \" = \" [a-z_]{1,12} \"\\n\"){60,}";
        cr_assert_eq(tandem_generate(plain, prompts[i], &r[i].params, &want[i]), TANDEM_OK, "%s", tandem_last_error());
    }
    cr_assert_eq(tandem_generate_batch(e, r, 4, out), TANDEM_OK);
    int preempted = 0;
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(out[i].status, TANDEM_OK, "request %d: %s", i, out[i].error ? out[i].error : "");
        cr_assert(out[i].n_tokens == want[i].n_tokens &&
                      memcmp(out[i].tokens, want[i].tokens, want[i].n_tokens * sizeof(int32_t)) == 0,
                  "request %d differs from its solo output under preemption", i);
        preempted += out[i].n_preemptions;
        tandem_result_free(&out[i]);
        tandem_result_free(&want[i]);
    }
    cr_assert_geq(preempted, 1, "no request was preempted");
    cr_log_info("preemptions: %d", preempted);
    tandem_engine_close(e);
    tandem_engine_close(plain);
    tandem_model_close(d);
    tandem_model_close(t);
}
