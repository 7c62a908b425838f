/* test_eagle3_spec.c - an EAGLE-3 head as the draft of the one step (issue 46,
 * phase 2; src/engine/head.c, draft/chain.c):
 *   - greedy output with tandem synth's eagle3-pycode head equals target-only output,
 *     every request alone and four at a time (prompts of different lengths), with
 *     n-gram lookups off and on, adaptive and fixed lengths; alone with the oracle
 *     benchmark's arrangement (drafted chains accepted to random depths); four in a
 *     pool small enough to preempt; after a prefix-cache hit; chains cut by p_min and
 *     grammar-constrained ones; TANDEM_SCHED_LOG's step lines name each chain, its
 *     place and what it accepted, as the output shows;
 *   - roll-back: along runs whose chains are accepted to random depths (the oracle at
 *     random acceptance, random fixed lengths, lookups on and off), after every step
 *     the sequence's pending feature rows equal the target's features recomputed from
 *     scratch, and the head's K/V of every slot it holds equal a recomputation;
 *   - sampled: the distribution of the first four tokens with a head (an in-memory
 *     one on the tiny random target) is target-only sampling's (two-sample
 *     chi-square, as test_spec_stat), by rejection sampling with the head's q rows
 *     (an engine of one sequence) and by agreement with the target's draws (a batch);
 *   - token trees drafted by the head (head.c tree mode, draft/tree_draft.c): every
 *     child's probability against a chain of head forwards along its path (static
 *     and dynamic trees of three sequences drafted together, levels split over
 *     forwards too); greedy equality with fixed budgets, a static shape and the
 *     controller's choice, alone, four at a time and preempting, with lookups, the
 *     oracle and after a prefix-cache hit; roll-back after every step of runs of one
 *     and four sequences accepted to random depths (the oracle poked into a batch);
 *     chi-square by rejection sampling and by agreement.
 * A random head accepts little (greedy: nothing on its own); the acceptance seen is
 * logged. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_testutil.h"
#include "eagle3_testutil.h"
#include "engine.h"
#include "kv_cache.h"
#include "scheduler.h"
#include "sched_internal.h"
#include "stats.h"
#include "tandem.h"
#include "testutil.h"
#include "tiny_model.h"
#include "tree_draft.h"

#define N_NEW 24

/* ---- greedy equality through the public API ---- */

typedef struct prompts {
    int32_t **ids;
    size_t *n;
    size_t count;
} prompts;

/* Every `every`th dev prompt (a sanitizer build: at most 5). */
static prompts load_prompts(size_t every) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    prompts p = {calloc(n_lines, sizeof(int32_t *)), calloc(n_lines, sizeof(size_t)), 0};
    for (size_t li = 0; li < n_lines && (!tdm_test_sanitized() || p.count < 5); li += every) {
        p.ids[p.count] = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &p.n[p.count]);
        p.count++;
    }
    tdm_test_jsonl_free(refs, n_lines);
    return p;
}

static void free_prompts(prompts *p) {
    for (size_t i = 0; i < p->count; i++) free(p->ids[i]);
    free(p->ids);
    free(p->n);
}

static tandem_model *open_model(const char *path) {
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(path, NULL, &m), TANDEM_OK, "%s", tandem_last_error());
    return m;
}

/* The pycode target and tandem synth's eagle3-pycode head (f16, a temporary file). */
typedef struct pair {
    char hpath[32];
    tandem_model *t, *h;
} pair;

static void pair_open(pair *p) {
    synth_head(p->hpath, TDM_F16, NULL);
    p->t = open_model(tdm_test_model_path("pycode-target-f16.gguf"));
    p->h = open_model(p->hpath);
}

static void pair_close(pair *p) {
    tandem_model_close(p->h);
    tandem_model_close(p->t);
    unlink(p->hpath);
}

static tandem_engine *open_engine(tandem_model *t, tandem_model *d, int n_seq, size_t kv_bytes, bool prefix) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2, ep.n_seq_max = n_seq, ep.kv_bytes = kv_bytes, ep.prefix_cache = prefix;
    return api_open_engine(t, d, &ep);
}

static void same_tokens(const tandem_result *a, const tandem_result *b, const char *what, size_t i) {
    cr_assert_eq(b->status, TANDEM_OK, "%s, request %zu: %s", what, i, b->error ? b->error : "");
    size_t at = 0;
    while (at < a->n_tokens && at < b->n_tokens && a->tokens[at] == b->tokens[at]) at++;
    cr_assert(a->n_tokens == b->n_tokens && at == a->n_tokens && a->finish_reason == b->finish_reason,
              "%s, request %zu: %zu tokens vs %zu target-only, first difference at %zu", what, i, b->n_tokens,
              a->n_tokens, at);
}

typedef struct gcase {
    const char *name;
    int spec_k, ngram;
    float oracle;      /* > 0: the oracle's arrangement at this acceptance */
    int tree;          /* spec_tree: 0 chains, N a tree of N nodes, TANDEM_SPEC_TREE_AUTO */
    const char *shape; /* spec_tree_shape, or NULL */
} gcase;

/* The cases' requests over p (the oracle's continuation: ref's tokens). */
static tandem_request *requests(const prompts *p, const gcase *c, const tandem_result *ref) {
    tandem_request *r = calloc(p->count, sizeof *r);
    for (size_t i = 0; i < p->count; i++) {
        r[i].prompt_ids = p->ids[i];
        r[i].n_prompt_ids = p->n[i];
        r[i].params = tandem_generate_default_params();
        r[i].params.max_tokens = N_NEW;
        r[i].params.spec_k = c->spec_k;
        r[i].params.spec_ngram = c->ngram;
        r[i].params.spec_tree = c->tree;
        r[i].params.spec_tree_shape = c->shape;
        if (c->oracle > 0) {
            r[i].params.bench_oracle_tokens = ref[i].tokens;
            r[i].params.bench_n_oracle = (int)ref[i].n_tokens;
            r[i].params.bench_oracle_alpha = c->oracle;
        }
    }
    return r;
}

static void free_results(tandem_result *r, size_t n) {
    for (size_t i = 0; i < n; i++) tandem_result_free(&r[i]);
    free(r);
}

/* Every case over every 10th dev prompt, alone, four at a time and four in a pool
 * of about two (preempting; not for adaptive chains), against target-only. */
static void greedy_cases(const gcase *cases, size_t n_cases) {
    pair pr;
    pair_open(&pr);
    tandem_model *t = pr.t, *h = pr.h;
    prompts p = load_prompts(10);
    cr_assert_geq(p.count, 4);
    /* the reference: target-only, one at a time */
    tandem_result *ref = calloc(p.count, sizeof *ref);
    {
        tandem_engine *e = open_engine(t, NULL, 1, 0, false);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = N_NEW;
        for (size_t i = 0; i < p.count; i++)
            cr_assert_eq(tandem_generate_ids(e, p.ids[i], p.n[i], &gp, &ref[i]), TANDEM_OK, "%s", tandem_last_error());
        tandem_engine_close(e);
    }
    tandem_model_info mi, mi_h;
    cr_assert_eq(tandem_model_get_info(t, &mi), TANDEM_OK);
    cr_assert_eq(tandem_model_get_info(h, &mi_h), TANDEM_OK);
    for (size_t ci = 0; ci < n_cases; ci++) {
        const gcase *c = &cases[ci];
        tandem_request *r = requests(&p, c, ref);
        /* 1: alone; 4: four at a time; -4: four in a pool of 19 blocks of 16 positions
         * (both models'): admission takes two 129-token prompts (9 blocks each with
         * the row after them), which then need 10 each as they grow (preempting) */
        const int sizes[] = {1, 4, -4};
        for (size_t si = 0; si < TDM_ARRAY_LEN(sizes); si++) {
            const bool small = sizes[si] < 0;
            if (c->oracle > 0 && sizes[si] != 1) continue; /* (the oracle: an engine of one sequence) */
            if (small && c->spec_k == 0 && c->tree == 0 && !c->shape) continue;
            const size_t kv = small ? (size_t)(mi.kv_bytes_per_token + mi_h.kv_bytes_per_token) * 19 * 16 : 0;
            tandem_engine *e = open_engine(t, h, abs(sizes[si]), kv, true);
            tandem_result *got = calloc(p.count, sizeof *got);
            if (sizes[si] == 1) {
                for (size_t i = 0; i < p.count; i++)
                    cr_assert_eq(tandem_generate_ids(e, r[i].prompt_ids, r[i].n_prompt_ids, &r[i].params, &got[i]),
                                 TANDEM_OK, "%s", tandem_last_error());
            } else {
                cr_assert_eq(tandem_generate_batch(e, r, p.count, got), TANDEM_OK, "%s", tandem_last_error());
            }
            tandem_engine_stats st;
            cr_assert_eq(tandem_engine_get_stats(e, &st), TANDEM_OK);
            if (small) cr_assert_gt(st.n_preemptions, 0, "%s: a pool of 19 blocks for four sequences preempted none", c->name);
            tandem_engine_close(e);
            uint64_t drafted = 0, accepted = 0, ngram = 0, tree_steps = 0, deep = 0;
            for (size_t i = 0; i < p.count; i++) {
                char what[96];
                snprintf(what, sizeof what, "%s, batch %d%s", c->name, abs(sizes[si]), small ? ", small pool" : "");
                same_tokens(&ref[i], &got[i], what, i);
                drafted += got[i].spec.drafted;
                accepted += got[i].spec.accepted;
                ngram += got[i].spec.ngram_drafted;
                tree_steps += got[i].spec.tree_steps;
                for (int a = 3; a < TANDEM_SPEC_HIST_MAX; a++) deep += got[i].spec.accept_hist[a];
            }
            cr_log_info("%s, batch %d%s: %llu drafted (%llu looked up), %llu accepted (%.3f); %llu tree steps, %llu "
                        "steps accepting 3 or more",
                        c->name, abs(sizes[si]), small ? ", small pool" : "", (unsigned long long)drafted,
                        (unsigned long long)ngram, (unsigned long long)accepted,
                        drafted ? (double)accepted / (double)drafted : 0.0, (unsigned long long)tree_steps,
                        (unsigned long long)deep);
            if (c->spec_k > 0 || c->tree > 0 || c->shape) cr_assert_gt(drafted - ngram, 0, "%s: the head drafted nothing", c->name);
            if (c->tree > 0 || c->shape) cr_assert_gt(tree_steps, 0, "%s: no tree verified", c->name);
            if (c->oracle > 0) cr_assert_gt(accepted, 0, "%s: nothing accepted", c->name);
            if (c->oracle >= 0.7f && (c->tree > 0 || c->shape)) cr_assert_gt(deep, 0, "%s: no deep path accepted", c->name);
            free_results(got, p.count);
        }
        free(r);
    }
    free_results(ref, p.count);
    free_prompts(&p);
    pair_close(&pr);
}

Test(eagle3_spec, greedy_equals_target_only, .timeout = 900) {
    const gcase cases[] = {{"k 3, no lookups", 3, 0, 0, 0, NULL},
                           {"adaptive, lookups", 0, 3, 0, 0, NULL},
                           {"k 4, lookups", 4, 2, 0, 0, NULL},
                           {"oracle 0.7, k 4, no lookups", 4, 0, 0.7f, 0, NULL},
                           {"oracle 0.5, adaptive, lookups", 0, 3, 0.5f, 0, NULL}};
    greedy_cases(cases, TDM_ARRAY_LEN(cases));
}

/* Token trees drafted by the head: fixed budgets, a static shape and the controller's
 * choice, with and without lookups merged in, and the oracle's (deep paths accepted;
 * an engine of one sequence: batched deep paths in roll_back_trees_batched). */
Test(eagle3_spec, greedy_trees_equal_target_only, .timeout = 1200) {
    const gcase cases[] = {{"tree 8, no lookups", 0, 0, 0, 8, NULL},
                           {"tree 16, lookups", 0, 3, 0, 16, NULL},
                           {"tree auto, lookups", 0, 3, 0, TANDEM_SPEC_TREE_AUTO, NULL},
                           {"shape 4,2,2,1", 0, 0, 0, 0, "4,2,2,1"},
                           {"oracle 0.8, tree 16", 0, 0, 0.8f, 16, NULL},
                           {"oracle 0.7, shape 3,2,2,1,1,1", 0, 0, 0.7f, 0, "3,2,2,1,1,1"},
                           {"oracle 0.8, tree auto", 0, 0, 0.8f, TANDEM_SPEC_TREE_AUTO, NULL}};
    greedy_cases(cases, TDM_ARRAY_LEN(cases));
}

/* Chains cut by p_min (the head's top probability) and grammar-constrained chains
 * (masked on the host along the chain), greedy and sampled on an engine of one
 * sequence (the sampled output: by rejection sampling, the same distribution with
 * other draws; here only that it runs and keeps the grammar), and grammar-constrained
 * head trees of 8 (greedy; rows masked per node), against target-only. */
Test(eagle3_spec, p_min_and_constrained, .timeout = 300) {
    static const char *schema = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\"}, \"n\": "
                                "{\"type\": \"integer\"}}, \"required\": [\"name\", \"n\"]}";
    pair pr;
    pair_open(&pr);
    tandem_model *t = pr.t, *h = pr.h;
    prompts p = load_prompts(15);
    tandem_engine *plain = open_engine(t, NULL, 1, 0, false), *spec = open_engine(t, h, 1, 0, false);
    uint64_t drafted = 0, tree_steps = 0;
    for (size_t i = 0; i < p.count; i++)
        for (int c = 0; c < 4; c++) {
            tandem_generate_params gp = tandem_generate_default_params();
            gp.max_tokens = N_NEW;
            gp.spec_k = 4;
            if (c == 0) gp.spec_p_min = 0.02f;
            if (c >= 1) gp.json_schema = schema;
            if (c == 2) gp.temperature = 0.8f, gp.seed = 7 + i;
            if (c == 3) gp.spec_tree = 8;
            tandem_result a, b;
            cr_assert_eq(tandem_generate_ids(plain, p.ids[i], p.n[i], &gp, &a), TANDEM_OK, "%s", tandem_last_error());
            cr_assert_eq(tandem_generate_ids(spec, p.ids[i], p.n[i], &gp, &b), TANDEM_OK, "%s", tandem_last_error());
            if (c != 2) same_tokens(&a, &b, c == 3 ? "constrained trees" : c ? "constrained" : "p_min", i);
            else cr_assert(b.n_tokens > 0 && b.text[0] == '{', "sampled, constrained: '%s'", b.text);
            if (c == 3) tree_steps += b.spec.tree_steps;
            drafted += b.spec.drafted;
            tandem_result_free(&a);
            tandem_result_free(&b);
        }
    cr_assert_gt(drafted, 0);
    cr_assert_gt(tree_steps, 0, "no constrained head tree verified");
    tandem_engine_close(spec);
    tandem_engine_close(plain);
    free_prompts(&p);
    pair_close(&pr);
}

/* TANDEM_SCHED_LOG=1's step lines name each chain and its place (bench/xcheck_eagle3.py
 * compares them with llama.cpp's drafts): for every step of a greedy oracle run, the
 * line's chain holds the step's proposed tokens, its first `accepted` are the output's
 * tokens from the line's place (tokens generated before the step) on, the next one
 * is not, and the lines' proposals add up to the result's drafted count. */
typedef struct step_log {
    char *text;
    size_t len;
} step_log;

static void keep_steps(tandem_log_level level, const char *msg, void *user) {
    step_log *l = user;
    if (level != TANDEM_LOG_INFO || strncmp(msg, "step: ", 6) != 0) return;
    const size_t n = strlen(msg);
    l->text = realloc(l->text, l->len + n + 2);
    memcpy(l->text + l->len, msg, n);
    l->len += n;
    l->text[l->len++] = '\n';
    l->text[l->len] = 0;
}

Test(eagle3_spec, sched_log_names_each_chain, .timeout = 300) {
    cr_assert_eq(setenv("TANDEM_SCHED_LOG", "1", 1), 0); /* (read at the first engine's creation) */
    pair pr;
    pair_open(&pr);
    prompts p = load_prompts(50);
    tandem_result ref, got;
    tandem_engine *plain = open_engine(pr.t, NULL, 1, 0, false), *spec = open_engine(pr.t, pr.h, 1, 0, false);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = N_NEW;
    cr_assert_eq(tandem_generate_ids(plain, p.ids[0], p.n[0], &gp, &ref), TANDEM_OK, "%s", tandem_last_error());
    const gcase c = {"oracle 0.6, k 4", 4, 0, 0.6f, 0, NULL};
    prompts first = p; /* (prompt 0 alone: ref is its result only) */
    first.count = 1;
    tandem_request *r = requests(&first, &c, &ref);
    step_log log = {0};
    tandem_log_set(keep_steps, &log);
    cr_assert_eq(tandem_generate_ids(spec, r[0].prompt_ids, r[0].n_prompt_ids, &r[0].params, &got), TANDEM_OK, "%s",
                 tandem_last_error());
    tandem_log_set(NULL, NULL);
    same_tokens(&ref, &got, c.name, 0);
    cr_assert_not_null(log.text, "no step line");
    int steps = 0, proposed_sum = 0, accepted_sum = 0;
    for (char *line = log.text; *line; line = strchr(line, '\n') + 1, steps++) {
        int proposed, accepted, at, off;
        const char *pp = strstr(line, "proposed "), *pa = strstr(line, "accepted "), *pt = strstr(line, "; at ");
        cr_assert(pp && pa && pt, "a step line without its fields: %.200s", line);
        cr_assert_eq(sscanf(pp, "proposed %d", &proposed), 1);
        cr_assert_eq(sscanf(pa, "accepted %d", &accepted), 1);
        cr_assert_eq(sscanf(pt, "; at %d, chain [%n", &at, &off), 1, "%.200s", line);
        const char *q = pt + off;
        for (int j = 0; j < proposed; j++) {
            char *end;
            const long id = strtol(q, &end, 10);
            cr_assert(end != q, "step %d: the chain holds %d ids, proposed %d", steps, j, proposed);
            q = end;
            const size_t o = (size_t)at + (size_t)j;
            if (j < accepted) cr_assert(o < got.n_tokens && got.tokens[o] == id, "step %d at %d: accepted id %d", steps, at, j);
            if (j == accepted && o < got.n_tokens) cr_assert_neq(got.tokens[o], id, "step %d at %d: id %d rejected", steps, at, j);
        }
        cr_assert_eq(*q, ']', "step %d: more ids than the %d proposed", steps, proposed);
        proposed_sum += proposed;
        accepted_sum += accepted;
    }
    cr_assert_eq((uint64_t)proposed_sum, got.spec.drafted);
    cr_assert_eq((uint64_t)accepted_sum, got.spec.accepted);
    cr_assert_gt(accepted_sum, 0, "the oracle accepted nothing: the chains' tokens were not checked");
    free(log.text);
    free(r);
    tandem_result_free(&got);
    tandem_result_free(&ref);
    tandem_engine_close(spec);
    tandem_engine_close(plain);
    free_prompts(&p);
    pair_close(&pr);
}

/* A prompt whose first blocks are in the prefix cache (published by an earlier
 * request with the same start): the head misses one feature, the output does not
 * change; with chains and with head trees (tree 16 > 0). */
static void prefix_hit(int tree) {
    pair pr;
    pair_open(&pr);
    tandem_model *t = pr.t, *h = pr.h;
    prompts p = load_prompts(7);
    int32_t *longer = malloc((p.n[0] + p.n[1]) * sizeof *longer); /* prompt 0, then prompt 1 */
    memcpy(longer, p.ids[0], p.n[0] * sizeof *longer);
    memcpy(longer + p.n[0], p.ids[1], p.n[1] * sizeof *longer);
    cr_assert_geq(p.n[0], 32, "prompt 0 fills two blocks");
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = N_NEW;
    gp.spec_k = 3;
    gp.spec_tree = tree;
    tandem_result ref, a, b;
    tandem_engine *e0 = open_engine(t, NULL, 1, 0, false);
    cr_assert_eq(tandem_generate_ids(e0, longer, p.n[0] + p.n[1], &gp, &ref), TANDEM_OK, "%s", tandem_last_error());
    tandem_engine_close(e0);
    tandem_engine *e = open_engine(t, h, 1, 0, true);
    cr_assert_eq(tandem_generate_ids(e, p.ids[0], p.n[0], &gp, &a), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tandem_generate_ids(e, longer, p.n[0] + p.n[1], &gp, &b), TANDEM_OK, "%s", tandem_last_error());
    tandem_engine_stats st;
    cr_assert_eq(tandem_engine_get_stats(e, &st), TANDEM_OK);
    cr_assert_gt(st.prefix_hits, 0, "no prefix-cache hit");
    same_tokens(&ref, &b, "after a prefix-cache hit", 1);
    cr_assert_gt(b.spec.drafted, 0);
    if (tree > 0) cr_assert_gt(b.spec.tree_steps, 0, "no tree verified");
    tandem_result_free(&ref);
    tandem_result_free(&a);
    tandem_result_free(&b);
    tandem_engine_close(e);
    free(longer);
    free_prompts(&p);
    pair_close(&pr);
}

Test(eagle3_spec, prefix_cache_hit, .timeout = 300) { prefix_hit(0); }
Test(eagle3_spec, prefix_cache_hit_trees, .timeout = 300) { prefix_hit(16); }

/* ---- roll-back: pending features and the head's K/V against recomputations ---- */

typedef struct fin {
    bool done;
    tandem_result res;
} fin;

static void on_fin(tandem_request_id id, tandem_result *res, void *user) {
    (void)id;
    fin *f = user;
    f->res = *res;
    f->done = true;
}

static float max_abs(const float *x, size_t n) {
    float m = 0;
    for (size_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

/* The sequence's pending features and the head's slots [0, n_draft - 1), against the
 * target's features of its committed positions and the head run over them from
 * scratch (f32 K/V both). */
static void check_against_recompute(tdm_engine *e, tdm_backend *be, const tdm_seq *s) {
    const tdm_model *tm = e->target;
    const tdm_eagle3 *hd = e->head;
    const int32_t n_t = s->n_target, h_n = TDM_MAX(s->n_draft - 1, 0), F = 3 * hd->ep.target_hidden;
    tdm_err err = {0};
    /* pending rows cover the head's catch-up: [h_n, n_target) */
    cr_assert_leq(s->feat0, h_n, "pending rows start at %d, the head holds slots up to %d", (int)s->feat0, (int)h_n);
    cr_assert_eq(s->feat0 + s->n_feat, n_t, "pending rows end at %d, the target holds %d", (int)(s->feat0 + s->n_feat),
                 (int)n_t);
    cr_assert_leq(s->n_feat, TDM_HEAD_PENDING);
    /* the target's features from scratch */
    const int32_t nb = (n_t + 15) / 16 + 1;
    tdm_kv_store kt = {0}, kh = {0};
    int32_t *blocks = malloc((size_t)nb * sizeof *blocks);
    for (int32_t i = 0; i < nb; i++) blocks[i] = i;
    tdm_kv_seq seq = {.blocks = blocks, .n_blocks = nb, .cap_blocks = nb, .len = nb * 16};
    const tdm_kv_seq *seqs[1] = {&seq};
    cr_assert_eq(tdm_kv_store_init(&kt, tm, be, TDM_F32, nb, 16, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_kv_store_init(&kh, hd->m, be, TDM_F32, nb, 16, &err), TANDEM_OK, "%s", err.msg);
    tdm_fwd_scratch fs = {0};
    cr_assert_eq(tdm_fwd_scratch_set_features(&fs, hd->ep.feat_layers, 3, &err), TANDEM_OK);
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, n_t + 1, &err), TANDEM_OK);
    for (int32_t p = 0; p < n_t; p++) tdm_batch_add(&b, s->tokens[p], p, 0, p, p == n_t - 1);
    float *logits = malloc((size_t)tm->hp.n_vocab * sizeof *logits);
    cr_assert_eq(tdm_model_forward(tm, be, &kt, &b, seqs, &fs, logits, &err), TANDEM_OK, "%s", err.msg);
    const float *pend = s->feat;
    for (int32_t i = 0; i < s->n_feat; i++) {
        const float *want = fs.feat + (size_t)(s->feat0 + i) * (size_t)F, *got = pend + (size_t)i * (size_t)F;
        const float tol = 2e-3f * fmaxf(max_abs(want, (size_t)F), 1.0f);
        for (int32_t j = 0; j < F; j++)
            cr_assert(fabsf(want[j] - got[j]) <= tol, "pending feature of position %d, column %d: %g, recomputed %g",
                      (int)(s->feat0 + i), (int)j, got[j], want[j]);
    }
    /* the head over slots [0, h_n): token P + 1 with fc(feature P) */
    if (h_n > 0) {
        tdm_eagle3_scratch hs = {0};
        float *g;
        cr_assert_eq(be->ops->alloc(be, (size_t)h_n * (size_t)hd->ep.n_embd * sizeof(float), (void **)&g, &err), TANDEM_OK);
        cr_assert_eq(tdm_eagle3_fuse(hd, be, &hs, fs.feat, h_n, g, &err), TANDEM_OK, "%s", err.msg);
        tdm_batch_clear(&b);
        for (int32_t P = 0; P < h_n; P++) tdm_batch_add(&b, s->tokens[P + 1], P, 0, P, false);
        cr_assert_eq(tdm_eagle3_forward(hd, be, &kh, &b, seqs, &hs, g, NULL, NULL, &err), TANDEM_OK, "%s", err.msg);
        /* K unit: [head_dim][16] values, V unit: [16][head_dim] (f32), per block and KV head */
        const int32_t hdim = hd->ep.head_dim, nkv = hd->ep.n_head_kv;
        for (int32_t P = 0; P < h_n; P++) {
            const int32_t eb = s->kv.blocks[P / 16], j = P % 16;
            for (int32_t kvh = 0; kvh < nkv; kvh++)
                for (int32_t d = 0; d < hdim; d++) {
                    const size_t ko = ((size_t)(P / 16) * nkv + kvh) * (size_t)hdim * 16 + (size_t)d * 16 + j;
                    const size_t ke = ((size_t)eb * nkv + kvh) * (size_t)hdim * 16 + (size_t)d * 16 + j;
                    const size_t vo = (((size_t)(P / 16) * nkv + kvh) * 16 + j) * (size_t)hdim + d;
                    const size_t ve = (((size_t)eb * nkv + kvh) * 16 + j) * (size_t)hdim + d;
                    const float kw = ((const float *)kh.k[0])[ko], kg = ((const float *)e->kv_d.k[0])[ke];
                    const float vw = ((const float *)kh.v[0])[vo], vg = ((const float *)e->kv_d.v[0])[ve];
                    cr_assert(fabsf(kw - kg) <= 2e-3f * fmaxf(fabsf(kw), 1.0f) &&
                                  fabsf(vw - vg) <= 2e-3f * fmaxf(fabsf(vw), 1.0f),
                              "head slot %d (of %d), KV head %d, dim %d: K %g V %g, recomputed K %g V %g", (int)P,
                              (int)h_n, (int)kvh, (int)d, kg, vg, kw, vw);
                }
        }
        be->ops->free(be, g);
        tdm_eagle3_scratch_free(&hs);
    }
    free(logits);
    tdm_batch_free(&b);
    tdm_fwd_scratch_free(&fs);
    tdm_kv_store_free(&kt);
    tdm_kv_store_free(&kh);
    free(blocks);
}

/* The engine-level tests' rig: tandem synth's eagle3-pycode head on the pycode target
 * (one CPU thread, f32 K/V), an engine of n_seq sequences drafting with it and a
 * target-only one of one sequence. */
typedef struct head_rig {
    char hpath[32];
    tdm_backend *be;
    tdm_model *tm;
    tdm_eagle3 *hd;
    tdm_engine *plain, *e;
} head_rig;

static void head_rig_open(head_rig *r, int n_seq) {
    tdm_err err = {0};
    synth_head(r->hpath, TDM_F16, NULL);
    r->be = cpu(1);
    r->tm = load_target(r->be);
    cr_assert_eq(tdm_eagle3_load(r->hpath, r->be, &r->hd, &err), TANDEM_OK, "%s", err.msg);
    tdm_engine_cfg cfg = {.n_threads = 1, .kv_type = TANDEM_KV_F32}, cfg_e = cfg;
    cfg_e.n_seq_max = n_seq;
    cr_assert_eq(tdm_engine_create(r->tm, NULL, &cfg, &r->plain, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_create_ex(r->tm, NULL, r->hd, &cfg_e, &r->e, &err), TANDEM_OK, "%s", err.msg);
}

static void head_rig_close(head_rig *r) {
    tdm_engine_free(r->e);
    tdm_engine_free(r->plain);
    tdm_eagle3_free(r->hd);
    tdm_model_free(r->tm);
    tdm_backend_destroy(r->be);
    unlink(r->hpath);
}

Test(eagle3_spec, roll_back_keeps_features_exact, .timeout = 900) {
    head_rig hr;
    head_rig_open(&hr, 1);
    tdm_backend *be = hr.be;
    tdm_engine *plain = hr.plain, *e = hr.e;
    tdm_err err = {0};
    prompts p = load_prompts(tdm_test_sanitized() ? 40 : 20);
    uint64_t rng = 46;
    int steps = 0;
    uint64_t drafted = 0, accepted = 0;
    int hist[8] = {0};
    for (size_t i = 0; i < p.count; i++) {
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 40;
        tandem_result ref;
        cr_assert_eq(tdm_generate_one(plain, p.ids[i], (int32_t)p.n[i], &gp, &ref, &err), TANDEM_OK, "%s", err.msg);
        gp.spec_k = 1 + (int)(tdm_test_rand(&rng) % 6);
        gp.spec_ngram = tdm_test_rand(&rng) % 2 ? 2 : 0;
        gp.bench_oracle_tokens = ref.tokens;
        gp.bench_n_oracle = (int)ref.n_tokens;
        gp.bench_oracle_alpha = (float)(0.2 + 0.75 * tdm_test_randu(&rng));
        tdm_sched *s;
        cr_assert_eq(tdm_sched_create(e, NULL, &s, &err), TANDEM_OK, "%s", err.msg);
        fin f = {0};
        cr_assert_eq(tdm_sched_submit(s, p.ids[i], (int32_t)p.n[i], &gp, 0, 0, on_fin, &f, NULL, &err), TANDEM_OK, "%s",
                     err.msg);
        while (!f.done) {
            cr_assert_eq(tdm_sched_step(s, NULL, &err), TANDEM_OK, "%s", err.msg);
            const tdm_req *r = tdm_sched_running_req(s, 0);
            if (!r || r->state != TDM_REQ_RUNNING) continue;
            check_against_recompute(e, be, &r->s);
            steps++;
        }
        cr_assert_eq(f.res.status, TANDEM_OK, "%s", f.res.error ? f.res.error : "");
        same_tokens(&ref, &f.res, "oracle run", i);
        drafted += f.res.spec.drafted;
        accepted += f.res.spec.accepted;
        for (int a = 0; a < 8; a++) hist[a] += (int)f.res.spec.accept_hist[a];
        tandem_result_free(&f.res);
        tandem_result_free(&ref);
        tdm_sched_free(s);
    }
    cr_log_info("roll-back: %d steps checked, %llu drafted, %llu accepted; accepted per step 0..7: %d %d %d %d %d %d %d %d",
                steps, (unsigned long long)drafted, (unsigned long long)accepted, hist[0], hist[1], hist[2], hist[3],
                hist[4], hist[5], hist[6], hist[7]);
    cr_assert_gt(hist[0], 0);
    cr_assert_gt(hist[1] + hist[2], 0, "no chain was accepted in part");
    cr_assert_gt(hist[3] + hist[4] + hist[5], 0, "no chain was accepted deeply");
    free_prompts(&p);
    head_rig_close(&hr);
}

/* The oracle's arrangement (draft/oracle.h) given to a running request of a batch
 * engine, which the public parameters refuse (an engine of one sequence): the test's
 * way to get deep paths accepted in a batch of head trees. */
static void poke_oracle(tdm_req *r, const tandem_result *ref, double alpha, uint64_t seed) {
    r->sr.oracle = malloc(ref->n_tokens * sizeof(int32_t));
    cr_assert_not_null(r->sr.oracle);
    memcpy(r->sr.oracle, ref->tokens, ref->n_tokens * sizeof(int32_t));
    r->sr.n_oracle = (int32_t)ref->n_tokens;
    r->sr.oracle_alpha = alpha;
    tdm_rng_seed(&r->sr.oracle_rng, seed);
}

/* Head trees accepted to random depths, one and four sequences at a time (random
 * budgets, the controller's choice, static shapes, lookups on and off, the oracle at
 * random acceptance): after every step each running sequence's pending features and
 * the head's K/V equal recomputations (nothing of a rejected branch stays), and the
 * outputs equal target-only. */
Test(eagle3_spec, roll_back_trees_batched, .timeout = 900) {
    head_rig hr;
    head_rig_open(&hr, 4);
    tdm_backend *be = hr.be;
    tdm_engine *plain = hr.plain, *e = hr.e;
    tdm_err err = {0};
    prompts p = load_prompts(tdm_test_sanitized() ? 25 : 8);
    static const char *shapes[] = {"4,2,2,1", "2,2,2,2,2", "1,1,1,1,1,1,1,1,1,1", "6,3,1"};
    static const int budgets[] = {2, 4, 8, 16, 32, 64, TANDEM_SPEC_TREE_AUTO};
    uint64_t rng = 4646;
    int steps = 0, checks = 0;
    uint64_t drafted = 0, accepted = 0, tree_steps = 0;
    int hist[8] = {0};
    for (size_t i0 = 0, g = 0; i0 < p.count; g++) {
        const size_t n = TDM_MIN(g % 2 ? 4 : 1, p.count - i0); /* (alone, then four at a time) */
        tandem_result ref[4];
        fin f[4] = {0};
        uint64_t ids[4];
        double alpha[4];
        tdm_sched *s;
        cr_assert_eq(tdm_sched_create(e, NULL, &s, &err), TANDEM_OK, "%s", err.msg);
        for (size_t j = 0; j < n; j++) {
            tandem_generate_params gp = tandem_generate_default_params();
            gp.max_tokens = 40;
            cr_assert_eq(tdm_generate_one(plain, p.ids[i0 + j], (int32_t)p.n[i0 + j], &gp, &ref[j], &err), TANDEM_OK,
                         "%s", err.msg);
            const uint64_t pick = tdm_test_rand(&rng) % (TDM_ARRAY_LEN(budgets) + TDM_ARRAY_LEN(shapes));
            if (pick < TDM_ARRAY_LEN(budgets)) gp.spec_tree = budgets[pick];
            else gp.spec_tree_shape = shapes[pick - TDM_ARRAY_LEN(budgets)];
            gp.spec_ngram = tdm_test_rand(&rng) % 2 ? 2 : 0;
            alpha[j] = tdm_test_rand(&rng) % 4 ? 0.3 + 0.65 * tdm_test_randu(&rng) : 0; /* (0: the head's own) */
            cr_assert_eq(tdm_sched_submit(s, p.ids[i0 + j], (int32_t)p.n[i0 + j], &gp, 0, 0, on_fin, &f[j], &ids[j], &err),
                         TANDEM_OK, "%s", err.msg);
        }
        for (bool all = false; !all;) {
            cr_assert_eq(tdm_sched_step(s, NULL, &err), TANDEM_OK, "%s", err.msg);
            steps++;
            for (int32_t k = 0; k < 4; k++) {
                tdm_req *r = (tdm_req *)tdm_sched_running_req(s, k);
                if (!r) continue;
                for (size_t j = 0; j < n; j++)
                    if (r->id == ids[j] && alpha[j] > 0 && !r->sr.oracle) poke_oracle(r, &ref[j], alpha[j], ids[j] * 7 + 1);
                if (r->state != TDM_REQ_RUNNING) continue;
                check_against_recompute(e, be, &r->s);
                checks++;
            }
            all = true;
            for (size_t j = 0; j < n; j++) all &= f[j].done;
        }
        for (size_t j = 0; j < n; j++) {
            cr_assert_eq(f[j].res.status, TANDEM_OK, "%s", f[j].res.error ? f[j].res.error : "");
            same_tokens(&ref[j], &f[j].res, n > 1 ? "head trees, four at a time" : "head trees, alone", i0 + j);
            drafted += f[j].res.spec.drafted;
            accepted += f[j].res.spec.accepted;
            tree_steps += f[j].res.spec.tree_steps;
            for (int a = 0; a < 8; a++) hist[a] += (int)f[j].res.spec.accept_hist[a];
            tandem_result_free(&f[j].res);
            tandem_result_free(&ref[j]);
        }
        tdm_sched_free(s);
        i0 += n;
    }
    cr_log_info("roll-back, trees: %d steps, %d sequences checked, %llu drafted, %llu accepted, %llu tree steps; "
                "accepted per step 0..7: %d %d %d %d %d %d %d %d",
                steps, checks, (unsigned long long)drafted, (unsigned long long)accepted, (unsigned long long)tree_steps,
                hist[0], hist[1], hist[2], hist[3], hist[4], hist[5], hist[6], hist[7]);
    cr_assert_gt(tree_steps, 0);
    cr_assert_gt(hist[0], 0);
    cr_assert_gt(hist[1] + hist[2], 0, "no tree was accepted in part");
    cr_assert_gt(hist[3] + hist[4] + hist[5] + hist[6] + hist[7], 0, "no tree was accepted deeply");
    free_prompts(&p);
    head_rig_close(&hr);
}

/* softmax(l[V]) into p (double sums). */
static void softmax_ref(const float *l, int32_t V, double *p) {
    float mx = l[0];
    for (int32_t i = 1; i < V; i++) mx = fmaxf(mx, l[i]);
    double sum = 0;
    for (int32_t i = 0; i < V; i++) sum += p[i] = exp((double)l[i] - mx);
    for (int32_t i = 0; i < V; i++) p[i] /= sum;
}

/* The head's distribution after s's committed tokens and path[0..d) from a chain of
 * head forwards (chain mode: the catch-up from n_draft0, then one row per token, each
 * fed the h of the row before), into p. */
static void chain_reference(tdm_engine *e, tdm_seq *s, int32_t n_draft0, const int32_t *path, int32_t d, double *p) {
    const tdm_kv_seq *kv[1] = {&s->kv};
    const int32_t n = s->n_tokens;
    tdm_err err = {0};
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, n + 1, &err), TANDEM_OK);
    s->n_draft = n_draft0;
    for (int32_t p0 = n_draft0; p0 < n; p0++) tdm_batch_add(&b, s->tokens[p0], p0, 0, p0, p0 == n - 1);
    cr_assert_eq(tdm_engine_forward(e, true, &b, kv, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    for (int32_t j = 0; j < d; j++) {
        tdm_batch_clear(&b);
        tdm_batch_add(&b, path[j], n + j, 0, n + j, true);
        cr_assert_eq(tdm_engine_forward(e, true, &b, kv, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    }
    softmax_ref(e->logits_d, e->n_vocab, p);
    tdm_batch_free(&b);
}

/* The head's trees against chains of head forwards: after a few steps of three
 * sequences, their trees are drafted together (tdm_draft_trees; static shapes and
 * dynamic trees, once with levels split over several forwards by a small logits
 * budget), and every node's children are the likeliest tokens of the head's
 * distribution along the node's path computed as a chain, each with its probability
 * (the child's cumulative weight over its parent's): the tree's rows one slot lower,
 * their masks, and each node fed its parent's h. */
Test(eagle3_spec, tree_nodes_match_chains, .timeout = 600) {
    head_rig hr;
    head_rig_open(&hr, 4);
    tdm_engine *e = hr.e;
    tdm_err err = {0};
    const int32_t V = e->n_vocab, logit_rows = e->n_logit_rows;
    double *pr = malloc((size_t)V * sizeof *pr);
    prompts p = load_prompts(30);
    cr_assert_geq(p.count, 3);
    static const char *shapes[] = {"3,2,2", NULL, "2,2,2,2", NULL};
    static const int budgets[] = {0, 16, 0, 32};
    int checked = 0;
    for (int pass = 0; pass < 4; pass++) {
        tdm_sched *s;
        cr_assert_eq(tdm_sched_create(e, NULL, &s, &err), TANDEM_OK, "%s", err.msg);
        fin f[3] = {0};
        for (int j = 0; j < 3; j++) {
            tandem_generate_params gp = tandem_generate_default_params();
            gp.max_tokens = 64;
            gp.spec_k = 2 + j; /* (some chains first: pending rows of different counts) */
            cr_assert_eq(tdm_sched_submit(s, p.ids[j], (int32_t)p.n[j], &gp, 0, 0, on_fin, &f[j], NULL, &err), TANDEM_OK,
                         "%s", err.msg);
        }
        for (int st = 0; st < 6 + pass; st++) cr_assert_eq(tdm_sched_step(s, NULL, &err), TANDEM_OK, "%s", err.msg);
        tdm_tree_job jobs[3];
        static tdm_tree trees[3];
        int32_t nd0[3], m = 0;
        for (int32_t k = 0; k < 3; k++) {
            tdm_req *r = (tdm_req *)tdm_sched_running_req(s, k);
            cr_assert(r && r->state == TDM_REQ_RUNNING);
            tdm_tree_cfg tc;
            if (shapes[pass]) cr_assert(tdm_tree_cfg_parse_shape(shapes[pass], &tc, &err), "%s", err.msg);
            else tc = tdm_tree_cfg_dynamic(budgets[pass]);
            cr_assert_eq(tdm_kv_seq_reserve(e->pool, &r->s.kv, r->s.n_tokens + TDM_TREE_MAX, &err), TANDEM_OK);
            nd0[m] = r->s.n_draft;
            jobs[m++] = (tdm_tree_job){&r->s, &r->sr, tc, &trees[k], false};
        }
        if (pass == 3) e->n_logit_rows = 5; /* (levels of several forwards each) */
        int32_t n_fwd;
        cr_assert_eq(tdm_draft_trees(e, tdm_sched_ws(s), jobs, m, &n_fwd, &err), TANDEM_OK, "%s", err.msg);
        e->n_logit_rows = logit_rows;
        for (int32_t k = 0; k < m; k++) {
            const tdm_tree *t = jobs[k].tree;
            const tdm_tree_cfg *tc = &jobs[k].cfg;
            cr_assert_gt(t->n, 1);
            for (int32_t v = -1; v < t->n; v++) {
                int32_t kids[TDM_TREE_POOL], path[TDM_TREE_DEPTH_MAX];
                const int32_t nk = tdm_tree_children(t, v, kids), d = v < 0 ? 0 : t->depth[v] + 1;
                if (nk == 0) continue;
                for (int32_t a = v; a >= 0; a = t->parent[a]) path[t->depth[a]] = t->token[a];
                chain_reference(e, jobs[k].s, nd0[k], path, d, pr);
                const int32_t c = tc->n_shape > 0 ? tc->shape[d] : tc->topk; /* (the candidates per node) */
                const double wv = v < 0 ? 1.0 : t->w[v];
                for (int32_t x = 0; x < nk; x++) {
                    const int32_t tok = t->token[kids[x]];
                    const double got = t->w[kids[x]] / wv;
                    cr_assert(fabs(got - pr[tok]) <= 1e-3 * pr[tok] + 1e-6,
                              "pass %d, sequence %d, node %d (depth %d) child %d: probability %g, the chain's %g", pass,
                              (int)k, (int)v, (int)d, (int)tok, got, pr[tok]);
                    int32_t above = 0;
                    for (int32_t i = 0; i < V; i++) above += pr[i] > pr[tok] * (1 + 1e-4) + 1e-9;
                    cr_assert_lt(above, c, "pass %d, sequence %d, node %d: child %d is behind %d likelier tokens", pass,
                                 (int)k, (int)v, (int)tok, (int)above);
                    checked++;
                }
            }
            jobs[k].s->n_draft = nd0[k]; /* (the head's slots as before the trees) */
        }
        tdm_sched_free(s);
        for (int j = 0; j < 3; j++) tandem_result_free(&f[j].res);
    }
    cr_log_info("head trees against chains: %d children checked", checked);
    cr_assert_gt(checked, 100);
    free(pr);
    free_prompts(&p);
    head_rig_close(&hr);
}

/* ---- sampled: chi-square against target-only sampling ---- */

#define N_RUNS (tdm_test_sanitized() ? 2500 : 20000)
#define N_POS 4

/* n_seq > 1: a batch engine (verification by agreement with the target's draws);
 * 1: rejection sampling against the head's q rows.  gp: the sampler and speculation. */
static void check_lossless(const tandem_generate_params *gp, int n_seq, const char *what) {
    tdm_err err = {0};
    tdm_tiny_cfg tc = tdm_tiny_default();
    char *tpath = tdm_tiny_model_file(&tc);
    tdm_backend *be = cpu(1);
    tdm_model *tm;
    cr_assert_eq(tdm_model_load(tpath, be, &tm, &err), TANDEM_OK, "%s", err.msg);
    uint8_t *buf;
    tdm_eagle3 *hd = tiny_head(be, &tc, 12, &buf); /* (12 of the 16 tokens in its vocabulary) */
    tdm_engine_cfg cfg = {.n_threads = 1, .n_seq_max = n_seq};
    tdm_engine *plain, *spec;
    cr_assert_eq(tdm_engine_create(tm, NULL, &cfg, &plain, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_create_ex(tm, NULL, hd, &cfg, &spec, &err), TANDEM_OK, "%s", err.msg);
    check_same_distribution(plain, spec, gp, N_RUNS, N_POS, 1e-4, what);
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_eagle3_free(hd);
    free(buf);
    tdm_model_free(tm);
    tdm_backend_destroy(be);
    unlink(tpath);
    free(tpath);
}

/* sampling parameters: temperature, speculation length (0: adaptive), lookups */
static tandem_generate_params sampled(float temp, int spec_k, int ngram) {
    tandem_generate_params gp = tandem_generate_default_params();
    gp.temperature = temp;
    gp.spec_k = spec_k;
    gp.spec_ngram = ngram;
    return gp;
}

Test(eagle3_spec, sampled_rejection_k3, .timeout = 900) {
    const tandem_generate_params gp = sampled(1.0f, 3, 0);
    check_lossless(&gp, 1, "rejection sampling, k 3");
}
Test(eagle3_spec, sampled_rejection_adaptive_lookups, .timeout = 900) {
    tandem_generate_params gp = sampled(0.8f, 0, 2);
    gp.top_k = 8, gp.top_p = 0.9f;
    check_lossless(&gp, 1, "rejection sampling, adaptive, lookups, top_k 8, top_p 0.9");
}
Test(eagle3_spec, sampled_agreement_batch_k2, .timeout = 900) {
    tandem_generate_params gp = sampled(0.9f, 2, 0);
    gp.top_p = 0.95f;
    check_lossless(&gp, 4, "agreement (four sequences), k 2, top_p 0.95");
}

/* the same with head trees: SpecInfer's rejection sampling over children drawn from
 * the head without replacement (one sequence), and agreement with the target's draws
 * (a batch; the trees hold the lookups too) */
Test(eagle3_spec, sampled_trees_rejection, .timeout = 900) {
    tandem_generate_params gp = sampled(1.0f, 0, 0);
    gp.spec_tree = 6;
    check_lossless(&gp, 1, "head trees of 6, rejection sampling");
}
Test(eagle3_spec, sampled_trees_rejection_shape, .timeout = 900) {
    tandem_generate_params gp = sampled(0.8f, 0, 0);
    gp.spec_tree_shape = "3,2,1";
    gp.top_k = 8;
    check_lossless(&gp, 1, "head trees 3,2,1, rejection sampling, top_k 8");
}
Test(eagle3_spec, sampled_trees_agreement_batch, .timeout = 900) {
    tandem_generate_params gp = sampled(0.9f, 0, 2);
    gp.spec_tree = 8;
    gp.top_p = 0.95f;
    check_lossless(&gp, 4, "head trees of 8 (four sequences), agreement, lookups, top_p 0.95");
}
