/* test_tree.c - token-tree speculation end to end on the pycode pair: greedy
 * output equals target-only output on all 100 dev prompts with static and
 * dynamic trees, and with trees verified as chain rows (spine first); after every
 * tree step the block table holds exactly the accepted length (both models rolled
 * back, no block leaked), greedy and sampled; sampled
 * requests verifying trees in a batch give the target-only engine's tokens; the tree
 * structure's pruning and the shape parser. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kv_cache.h"
#include "scheduler.h"
#include "testutil.h"
#include "oracle.h"
#include "tree.h"

#define N_NEW 32

static tdm_backend *g_wbe;
static tdm_model *g_target, *g_draft;

static void setup(void) { tdm_test_pair_load("pycode-draft-s-f16.gguf", &g_wbe, &g_target, &g_draft); }
static void teardown(void) { tdm_test_pair_free(g_wbe, g_target, g_draft); }

TestSuite(tree, .init = setup, .fini = teardown, .timeout = 1200);

static tdm_engine *make_engine(tdm_model *draft) { return tdm_test_engine(g_target, draft, 2); }

/* What one test's trees are: configuration `kind` (0, 1) of prompt li, its node
 * bound per step and its name. */
typedef void (*tree_kind_fn)(tandem_generate_params *g, size_t li, int kind, int32_t *max_nodes, const char **name);

/* Every stride-th dev prompt with both kinds of tree: greedy output equals
 * target-only output, nothing leaks, every step is a tree of at most the kind's
 * nodes, forwards commit every token but the first; accepted tokens and steps by
 * kind, and target forwards and the tokens they committed, added up. */
static void check_trees_equal(size_t stride, tree_kind_fn kinds, uint64_t acc[2], uint64_t steps[2], uint64_t *fwd,
                              uint64_t *fwd_tok) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    cr_assert_eq(n_lines, 100);
    tdm_engine *plain = make_engine(NULL), *spec = make_engine(g_draft);
    tdm_err err = {0};
    for (size_t li = 0; li < n_lines; li += stride) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = N_NEW;
        gp.spec_ngram = 0;
        tandem_result want;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        for (int kind = 0; kind < 2; kind++) {
            tandem_generate_params g = gp;
            int32_t max_nodes;
            const char *name;
            kinds(&g, li, kind, &max_nodes, &name);
            tandem_result got;
            cr_assert_eq(tdm_generate_one(spec, ids, (int32_t)n, &g, &got, &err), TANDEM_OK, "%s", err.msg);
            size_t diff = 0;
            while (diff < got.n_tokens && diff < want.n_tokens && got.tokens[diff] == want.tokens[diff]) diff++;
            cr_assert(got.n_tokens == want.n_tokens && diff == want.n_tokens,
                      "prompt %zu, %s tree: output differs from target-only at token %zu (lengths %zu/%zu)", li, name,
                      diff, got.n_tokens, want.n_tokens);
            cr_assert_str_eq(got.text, want.text);
            cr_assert_eq(tdm_kv_pool_n_free(spec->pool), tdm_kv_pool_n_blocks(spec->pool), "prompt %zu: blocks leaked",
                         li);
            cr_assert_leq(got.spec.accepted, got.spec.drafted);
            cr_assert_eq(got.spec.tree_steps, got.spec.steps, "every step a tree");
            cr_assert_leq(got.spec.tree_nodes, (uint64_t)max_nodes * got.spec.steps, "%s tree", name);
            cr_assert_eq(got.spec.forward_tokens + 1, got.n_tokens, "forwards commit every token but the first");
            acc[kind] += got.spec.accepted;
            steps[kind] += got.spec.steps;
            *fwd += got.spec.forwards;
            *fwd_tok += got.spec.forward_tokens;
            tandem_result_free(&got);
        }
        tandem_result_free(&want);
        free(ids);
    }
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}

/* A static tree (4,2,2,1: 44 nodes) and a dynamic one (budget 32, or 8 on every
 * third prompt). */
static void static_and_dynamic(tandem_generate_params *g, size_t li, int kind, int32_t *max_nodes, const char **name) {
    if (kind == 0) g->spec_tree_shape = "4,2,2,1";
    else g->spec_tree = li % 3 == 2 ? 8 : 32;
    *max_nodes = kind ? 32 : 44;
    *name = kind ? "dynamic" : "static";
}

/* Every prompt (a sanitizer build: every 25th) with static_and_dynamic trees. */
Test(tree, greedy_outputs_equal_target_only) {
    uint64_t acc[2] = {0}, steps[2] = {0}, fwd = 0, fwd_tok = 0;
    check_trees_equal(tdm_test_sanitized() ? 25 : 1, static_and_dynamic, acc, steps, &fwd, &fwd_tok);
    for (int k = 0; k < 2; k++) {
        cr_log_info("%s trees: %.3f accepted per step", k ? "dynamic" : "static", (double)acc[k] / (double)steps[k]);
        cr_assert_gt(acc[k], steps[k], "trees accept more than one token per step on average");
    }
    cr_log_info("%.3f tokens per target forward", (double)fwd_tok / (double)fwd);
}

/* One expansion a level with two children, five levels (the benchmark knobs, set by
 * the test: every draft level a chain row), and a static chain "1,1,1,1" (every
 * node on the spine: a verification of causal rows only). */
static void spine_trees(tandem_generate_params *g, size_t li, int kind, int32_t *max_nodes, const char **name) {
    (void)li;
    if (kind == 0) g->spec_tree = 16;
    else g->spec_tree_shape = "1,1,1,1";
    *max_nodes = kind ? 4 : 10;
    *name = kind ? "1,1,1,1" : "width 1";
}

/* A benchmark's dynamic tree shape (bench_spec --tree-width ...) replaces the
 * defaults of the trees made after it, 0 keeps each; a value out of range is an
 * error naming it and changes nothing. */
Test(tree, bench_shape) {
    const tdm_tree_cfg d = tdm_tree_cfg_dynamic(32);
    tdm_err err = {0};
    cr_assert_eq(tdm_tree_set_bench_shape(&(tdm_tree_bench_shape){1, 0, 5}, &err), TANDEM_OK, "%s", err.msg);
    tdm_tree_cfg c = tdm_tree_cfg_dynamic(32);
    cr_assert(c.width == 1 && c.topk == d.topk && c.depth == 5, "width %d topk %d depth %d", (int)c.width, (int)c.topk,
              (int)c.depth);
    cr_assert_eq(tdm_tree_cfg_dynamic(3).depth, 3, "the depth is at most the budget");
    const tdm_tree_bench_shape bad[] = {{17, 0, 0}, {0, -1, 0}, {0, 0, 1}, {0, 0, TDM_TREE_DEPTH_MAX + 1}};
    const char *names[] = {"width 17", "branch -1", "depth 1", "depth 17"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bad); i++) {
        cr_assert_eq(tdm_tree_set_bench_shape(&bad[i], &err), TANDEM_ERR_INVALID_ARG, "%s accepted", names[i]);
        cr_assert(strstr(err.msg, names[i]), "%s: %s", names[i], err.msg);
    }
    c = tdm_tree_cfg_dynamic(32);
    cr_assert(c.width == 1 && c.depth == 5, "a refused shape changed the trees");
    cr_assert_eq(tdm_tree_set_bench_shape(&(tdm_tree_bench_shape){0, 0, 0}, &err), TANDEM_OK);
    c = tdm_tree_cfg_dynamic(32);
    cr_assert(c.width == d.width && c.topk == d.topk && c.depth == d.depth);
}

/* Trees verified as chain rows (spine first) on every 4th prompt (a sanitizer
 * build: every 25th).  The benchmark shape is process-wide; Criterion runs each
 * test in its own process. */
Test(tree, spine_rows_equal_target_only) {
    tdm_err err = {0};
    cr_assert_eq(tdm_tree_set_bench_shape(&(tdm_tree_bench_shape){1, 2, 5}, &err), TANDEM_OK, "%s", err.msg);
    uint64_t acc[2] = {0}, steps[2] = {0}, fwd = 0, fwd_tok = 0;
    check_trees_equal(tdm_test_sanitized() ? 25 : 4, spine_trees, acc, steps, &fwd, &fwd_tok);
    cr_assert_gt(acc[0], 0);
    cr_assert_gt(acc[1], 0);
}

/* Greedy trees with n-gram lookup on (spec_ngram 4, a budget of 8 and auto): a
 * step of lookups alone verifies a lookup tree (a chain when no other match
 * branches off), a draft tree also holds the lookups' continuations; the output equals target-only output on every 4th dev
 * prompt (a sanitizer build: every 25th), 64 tokens, and the lookups are used and
 * accepted.  After every step the K/V bookkeeping holds (tdm_test_run_checked). */
Test(tree, lookup_trees_equal_target_only) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = make_engine(NULL), *spec = make_engine(g_draft);
    tdm_err err = {0};
    uint64_t ng_steps = 0, ng_acc = 0, steps = 0, tree_steps = 0, lookup_trees = 0;
    for (size_t li = 0; li < n_lines; li += tdm_test_sanitized() ? 25 : 4) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 64;
        gp.spec_ngram = 0;
        tandem_result want;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        for (int kind = 0; kind < 2; kind++) {
            tandem_generate_params g = gp;
            g.spec_ngram = 4;
            g.spec_tree = kind ? TANDEM_SPEC_TREE_AUTO : 8;
            tandem_spec_stats st;
            tdm_test_run_checked(spec, ids, n, &g, &st);
            tandem_result got;
            cr_assert_eq(tdm_generate_one(spec, ids, (int32_t)n, &g, &got, &err), TANDEM_OK, "%s", err.msg);
            size_t diff = 0;
            while (diff < got.n_tokens && diff < want.n_tokens && got.tokens[diff] == want.tokens[diff]) diff++;
            cr_assert(got.n_tokens == want.n_tokens && diff == want.n_tokens,
                      "prompt %zu, tree %s with lookups: output differs from target-only at token %zu", li,
                      kind ? "auto" : "8", diff);
            cr_assert_eq(tdm_kv_pool_n_free(spec->pool), tdm_kv_pool_n_blocks(spec->pool), "prompt %zu: blocks leaked",
                         li);
            cr_assert_leq(got.spec.accepted, got.spec.drafted);
            cr_assert_leq(got.spec.ngram_accepted, got.spec.ngram_drafted);
            cr_assert_eq(got.spec.forward_tokens + 1, got.n_tokens, "forwards commit every token but the first");
            if (kind == 0) {
                cr_assert_leq(got.spec.steps, got.spec.tree_steps + got.spec.ngram_steps,
                              "prompt %zu: every step a tree or lookups alone", li);
                lookup_trees += got.spec.tree_steps + got.spec.ngram_steps - got.spec.steps; /* (counted in both) */
                cr_assert_leq(got.spec.tree_nodes, 8 * got.spec.tree_steps, "prompt %zu: trees within the budget", li);
            }
            ng_steps += got.spec.ngram_steps;
            ng_acc += got.spec.ngram_accepted;
            steps += got.spec.steps;
            tree_steps += got.spec.tree_steps;
            tandem_result_free(&got);
        }
        tandem_result_free(&want);
        free(ids);
    }
    cr_log_info("%llu steps, %llu trees, %llu of lookups alone (%llu lookup trees at budget 8), %llu lookup tokens "
                "accepted",
                (unsigned long long)steps, (unsigned long long)tree_steps, (unsigned long long)ng_steps,
                (unsigned long long)lookup_trees, (unsigned long long)ng_acc);
    cr_assert_gt(ng_steps, 0, "lookup steps happen on code");
    /* (the sanitizer build's four prompts may take none: lookups are chosen by
     * measured costs) */
    if (!tdm_test_sanitized()) cr_assert_gt(lookup_trees, 0, "some lookup steps branch (lookup trees)");
    cr_assert_gt(ng_acc, 0, "lookup tokens are accepted");
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}

/* After every step: the target holds n - 1 positions, the draft at most as many,
 * the block table exactly n - 1 and the pool exactly its blocks; greedy and
 * sampled, static, dynamic and auto trees (a sanitizer build: the first three
 * prompts).  Nothing leaks after release. */
Test(tree, commit_keeps_exactly_the_accepted_path) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *e = make_engine(g_draft);
    for (size_t li = 0; li < (tdm_test_sanitized() ? 3u : 6u); li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        for (int temp = 0; temp < 2; temp++) {
            tandem_generate_params gp = tandem_generate_default_params();
            gp.max_tokens = 48;
            gp.temperature = temp ? 0.8f : 0.0f;
            gp.seed = li;
            gp.spec_ngram = 0;
            if (li % 3 == 0) gp.spec_tree_shape = "3,2,2";
            else gp.spec_tree = li % 3 == 1 ? 24 : TANDEM_SPEC_TREE_AUTO;
            tandem_spec_stats st;
            tdm_test_run_checked(e, ids, n, &gp, &st);
            if (li % 3 != 2) cr_assert_gt(st.tree_steps, 0);
        }
        free(ids);
    }
    tdm_engine_free(e);
    tdm_test_jsonl_free(refs, n_lines);
}

/* Root children a (0.6, token 10), b (0.3, 11); a's children c (0.5, 12), d (0.05,
 * 13); b's child e (0.2, 14): nodes 0-4 in that order.  Returns c. */
static int32_t five_nodes(tdm_tree *t) {
    tdm_tree_reset(t);
    const int32_t a = tdm_tree_add(t, -1, 10, 0.6f), b = tdm_tree_add(t, -1, 11, 0.3f);
    const int32_t c = tdm_tree_add(t, a, 12, 0.5f);
    tdm_tree_add(t, a, 13, 0.05f);
    tdm_tree_add(t, b, 14, 0.2f);
    return c;
}

/* Pruning keeps the highest cumulative probabilities with every parent, in the old
 * order; masks are the ancestor sets. */
Test(tree, prune_and_masks) {
    tdm_tree t;
    five_nodes(&t);
    tdm_tree_prune(&t, 4);
    cr_assert_eq(t.n, 4);
    const int32_t tok[] = {10, 11, 12, 14}, par[] = {-1, -1, 0, 1};
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(t.token[i], tok[i], "node %d", i);
        cr_assert_eq(t.parent[i], par[i], "node %d", i);
    }
    cr_assert_eq(t.mask[2], 0x5ull);
    cr_assert_eq(t.mask[3], 0xaull);
    int32_t kids[8];
    cr_assert_eq(tdm_tree_children(&t, -1, kids), 2);
    cr_assert_eq(tdm_tree_children(&t, 0, kids), 1);
    cr_assert_eq(kids[0], 2);
}

/* The spine (first children from the root) moves to the front; the other nodes keep
 * their order, parents stay before children and siblings keep their order. */
Test(tree, spine_first) {
    tdm_tree t;
    const int32_t c = five_nodes(&t);
    tdm_tree_add(&t, c, 15, 0.4f); /* f, c's child */
    t.dslot[c] = 7;
    tdm_tree_spine_first(&t);
    cr_assert_eq(t.n, 6);
    cr_assert_eq(t.n_spine, 3);
    /* new order: a, c, f, b, d, e */
    const int32_t tok[] = {10, 12, 15, 11, 13, 14}, par[] = {-1, 0, 1, -1, 0, 3}, dep[] = {0, 1, 2, 0, 1, 1};
    for (int i = 0; i < 6; i++) {
        cr_assert_eq(t.token[i], tok[i], "node %d", i);
        cr_assert_eq(t.parent[i], par[i], "node %d", i);
        cr_assert_eq(t.depth[i], dep[i], "node %d", i);
    }
    cr_assert_eq(t.dslot[1], 7, "a node's draft slot moves with it");
    cr_assert_eq(t.mask[2], 0x7ull);
    cr_assert_eq(t.mask[4], 0x11ull);
    cr_assert_eq(t.mask[5], 0x28ull);
    int32_t kids[8];
    cr_assert_eq(tdm_tree_children(&t, 0, kids), 2);
    cr_assert_eq(kids[0], 1, "the spine child stays its parent's first");
    cr_assert_eq(kids[1], 4);
    for (int i = 0; i < t.n_spine; i++) cr_assert_eq(t.depth[i], i);
    /* a tree already spine-first is left as it is */
    tdm_tree u = t;
    tdm_tree_spine_first(&u);
    for (int i = 0; i < 6; i++) cr_assert_eq(u.token[i], t.token[i]);
    /* pruning forgets the spine */
    tdm_tree_prune(&u, 6);
    cr_assert_eq(u.n_spine, 0);
}

/* Another speculator's chain merges into the tree (SpecInfer): it follows the nodes
 * with its tokens, adds the rest as lookup nodes below the last one it found, and
 * stops at the node and depth bounds; the spine and masks then hold. */
Test(tree, merge_chain) {
    tdm_tree t;
    five_nodes(&t); /* a(10) -> c(12), d(13); b(11) -> e(14) */
    const int32_t chain[] = {10, 13, 20, 21};
    cr_assert_eq(tdm_tree_merge_chain(&t, -1, chain, 4, 0.5f, TDM_TREE_MAX, 16), 2, "10 and 13 are there");
    cr_assert_eq(t.n, 7);
    cr_assert_eq(t.token[5], 20);
    cr_assert_eq(t.parent[5], 3, "below d");
    cr_assert_eq(t.depth[5], 2);
    cr_assert_eq(t.parent[6], 5);
    cr_assert_eq(t.depth[6], 3);
    cr_assert(t.lookup[5] && t.lookup[6] && !t.lookup[0] && !t.lookup[3]);
    cr_assert_eq(t.dslot[5], -1, "the draft never saw a lookup node");
    cr_assert_float_eq(t.w[5], 0.05f * 0.5f, 1e-7, "its parent's weight times the speculator's acceptance");
    cr_assert_float_eq(t.w[6], 0.05f * 0.25f, 1e-7);
    /* the same chain again adds nothing; a new root branch adds all of it */
    cr_assert_eq(tdm_tree_merge_chain(&t, -1, chain, 4, 0.5f, TDM_TREE_MAX, 16), 0);
    const int32_t other[] = {30, 31, 32};
    cr_assert_eq(tdm_tree_merge_chain(&t, -1, other, 3, 0.5f, 9, 16), 2, "stops at 9 nodes");
    cr_assert_eq(t.n, 9);
    cr_assert_eq(t.parent[7], -1);
    /* below node c (depth 1) at most depth 3: one node (depth 2) */
    const int32_t deep[] = {40, 41, 42};
    cr_assert_eq(tdm_tree_merge_chain(&t, 2, deep, 3, 0.5f, TDM_TREE_MAX, 3), 1);
    cr_assert_eq(t.depth[9], 2);
    cr_assert_eq(tdm_tree_merge_chain(&t, 17, deep, 3, 0.5f, TDM_TREE_MAX, 16), 0, "no node 17");
    /* both speculators' nodes ranked alike: a confident lookup beats the draft's */
    tdm_tree u;
    five_nodes(&u); /* w: a 0.6, b 0.3, c 0.5, d 0.05, e 0.2 */
    const int32_t sure[] = {50, 51};
    cr_assert_eq(tdm_tree_merge_chain(&u, -1, sure, 2, 0.9f, TDM_TREE_MAX, 16), 2);
    tdm_tree_prune(&u, 4);
    const int32_t keep[] = {10, 12, 50, 51}; /* (old order: a, c, 50, 51) */
    cr_assert_eq(u.n, 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(u.token[i], keep[i], "node %d", i);
    cr_assert(u.lookup[2] && u.lookup[3] && !u.lookup[0]);
    tdm_tree_spine_first(&t);
    /* spine: a, c, 40 (first children); lookup flags move with their nodes */
    cr_assert_eq(t.n_spine, 3);
    cr_assert_eq(t.token[2], 40);
    cr_assert(t.lookup[2]);
    /* the spine as an accepted path: two draft nodes, then a lookup node */
    const int32_t path[] = {0, 1, 2};
    const tdm_tree_share sh = tdm_tree_share_of(&t, path, 3);
    cr_assert_eq(sh.draft_run, 2);
    cr_assert_eq(sh.lookup_acc, 1);
    cr_assert_eq(sh.lookup_nodes, 5, "20, 21, 30, 31, 40");
    cr_assert_eq(sh.draft_depth, 2, "the draft's nodes reach depth 1");
    for (int32_t i = 0; i < t.n; i++) {
        cr_assert_lt(t.parent[i], i, "node %d: parent first", i);
        const uint64_t want = (t.parent[i] < 0 ? 0 : t.mask[t.parent[i]]) | (1ull << i);
        cr_assert_eq(t.mask[i], want, "node %d", i);
        cr_assert_eq(t.lookup[i] != 0, t.token[i] >= 20, "node %d (token %d)", i, t.token[i]);
    }
}

/* The one-pass top-k against the k passes that define it: values from a few levels
 * (many ties), zeros (masked tokens), infinities, and rows with a NaN. */
Test(tree, top_tokens_one_pass_equals_passes) {
    enum { N = 300 };
    float d[N];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int trial = 0; trial < 400; trial++) {
        const int32_t n = 1 + trial % N, levels = 1 + trial % 7;
        for (int32_t i = 0; i < n; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            d[i] = (float)((x >> 33) % (uint64_t)levels) / (float)levels;
            if (trial % 5 == 1 && (x >> 20) % 4 == 0) d[i] = 0.0f;
        }
        if (trial % 11 == 3) d[(trial * 7) % n] = INFINITY;
        if (trial % 13 == 4) d[(trial * 5) % n] = -INFINITY;
        if (trial % 17 == 5) d[(trial * 3) % n] = NAN;
        for (int32_t k = 0; k <= 20; k++) {
            int32_t got[N], want[N];
            const int32_t a = tdm_top_tokens(d, n, k, got), b = tdm_top_tokens_ref(d, n, k, want);
            cr_assert_eq(a, b, "trial %d k %d: %d tokens against %d", trial, k, a, b);
            for (int32_t j = 0; j < a; j++)
                cr_assert_eq(got[j], want[j], "trial %d n %d k %d rank %d: %d against %d", trial, n, k, j, got[j],
                             want[j]);
        }
    }
}

Test(tree, shape_parser) {
    tdm_tree_cfg c;
    tdm_err err = {0};
    cr_assert(tdm_tree_cfg_parse_shape("4,2,2,1", &c, &err));
    cr_assert_eq(c.n_shape, 4);
    cr_assert_eq(c.budget, 4 + 8 + 16 + 16);
    static const char *bad[] = {"", "4,,2", "0", "4,x", "17", "8,8", "4,2,"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bad); i++) {
        if (i == 6) {
            cr_assert(tdm_tree_cfg_parse_shape(bad[i], &c, &err), "a trailing comma is accepted");
            continue;
        }
        err.msg[0] = 0;
        cr_assert_not(tdm_tree_cfg_parse_shape(bad[i], &c, &err), "'%s' accepted", bad[i]);
        cr_assert(strstr(err.msg, "tree shape"), "'%s': message '%s'", bad[i], err.msg);
    }
}

/* Trees inside the continuous-batching scheduler: N prompts, four decoding at once,
 * each request its own tree setting (a budget of 16, a static shape, auto, or
 * chains) in one batched verification per step; every output equals target-only
 * output, and trees were verified in batches.  Sampled (temperatures 1.0 and 0.6,
 * top-p 0.95, a seed each): each row draws the target's token with the uniform of
 * the position it predicts and the matching path is kept, so the tokens are the
 * target-only engine's (which draws one uniform per token) whatever the trees.
 * ngram: the requests' spec_ngram (their trees then hold lookups too). */
static void check_batched_trees(int32_t N, bool sampled, int ngram) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = make_engine(NULL);
    tdm_err err = {0};
    tdm_engine_cfg cfg = {.n_threads = 2, .n_seq_max = 4};
    tdm_engine *e;
    cr_assert_eq(tdm_engine_create(g_target, g_draft, &cfg, &e, &err), TANDEM_OK, "%s", err.msg);
    int32_t *ids[24];
    int32_t n_ids[24];
    tandem_generate_params gp[24];
    tandem_result want[24], got[24];
    cr_assert_leq(N, 24);
    for (int32_t i = 0; i < N; i++) {
        size_t n;
        ids[i] = tdm_test_json_ids(tdm_json_get(refs[(size_t)i * (sampled ? 7 : 4) % n_lines], "prompt_ids"), &n);
        n_ids[i] = (int32_t)n;
        gp[i] = tandem_generate_default_params();
        gp[i].max_tokens = N_NEW;
        gp[i].spec_ngram = 0;
        if (sampled) {
            gp[i].temperature = i % 2 ? 0.6f : 1.0f;
            gp[i].top_p = 0.95f;
            gp[i].seed = 500 + (uint64_t)i;
        }
        cr_assert_eq(tdm_generate_one(plain, ids[i], n_ids[i], &gp[i], &want[i], &err), TANDEM_OK, "%s", err.msg);
        gp[i].spec_ngram = ngram;
        switch (i % 4) {
        case 0: gp[i].spec_tree = 16; break;
        case 1: gp[i].spec_tree_shape = "3,2,2,1"; break;
        case 2: gp[i].spec_tree = TANDEM_SPEC_TREE_AUTO; break;
        default: break; /* chains */
        }
    }
    tdm_sched *s;
    cr_assert_eq(tdm_sched_create(e, NULL, &s, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_sched_run(s, (const int32_t *const *)ids, n_ids, gp, NULL, NULL, N, got, &err), TANDEM_OK, "%s",
                 err.msg);
    uint64_t tree_steps = 0, accepted = 0, ng_accepted = 0;
    for (int32_t i = 0; i < N; i++) {
        cr_assert_eq(got[i].status, TANDEM_OK, "request %d: %s", i, got[i].error ? got[i].error : "");
        cr_assert(got[i].n_tokens == want[i].n_tokens &&
                      memcmp(got[i].tokens, want[i].tokens, want[i].n_tokens * sizeof(int32_t)) == 0,
                  "request %d (tree setting %d, temperature %g): output differs from target-only", i, i % 4,
                  gp[i].temperature);
        if (i % 4 < 2) cr_assert_gt(got[i].spec.tree_steps, 0, "request %d verified no tree", i);
        if (i % 4 == 3) cr_assert_eq(got[i].spec.tree_steps, 0);
        tree_steps += got[i].spec.tree_steps;
        if (i % 4 < 3) accepted += got[i].spec.accepted;
        if (i % 4 < 3) ng_accepted += got[i].spec.ngram_accepted;
        cr_assert_leq(got[i].spec.ngram_accepted, got[i].spec.ngram_drafted);
        tandem_result_free(&got[i]);
        tandem_result_free(&want[i]);
        free(ids[i]);
    }
    cr_log_info("%llu %s tree steps in the batch, %llu tokens accepted (%llu of lookup nodes)",
                (unsigned long long)tree_steps, sampled ? "sampled" : "greedy", (unsigned long long)accepted,
                (unsigned long long)ng_accepted);
    cr_assert_gt(accepted, 0, "no tree node accepted");
    if (ngram) cr_assert_gt(ng_accepted, 0, "no lookup node accepted in a tree");
    cr_assert_eq(tdm_kv_pool_n_free(e->pool), tdm_kv_pool_n_blocks(e->pool), "blocks leaked");
    tdm_sched_free(s);
    tdm_engine_free(e);
    tdm_engine_free(plain);
    tdm_test_jsonl_free(refs, n_lines);
}

/* (a sanitizer build: four requests, one of each tree setting, decoding at once) */
Test(tree, batched_trees_equal_target_only) { check_batched_trees(tdm_test_sanitized() ? 4 : 24, false, 0); }
Test(tree, batched_sampled_trees_equal_target_only) { check_batched_trees(tdm_test_sanitized() ? 4 : 16, true, 0); }
/* The same with n-gram lookup on: the trees hold lookups too (within their budgets). */
Test(tree, batched_lookup_trees_equal_target_only) { check_batched_trees(tdm_test_sanitized() ? 4 : 12, false, 4); }
Test(tree, batched_sampled_lookup_trees_equal_target_only) { check_batched_trees(tdm_test_sanitized() ? 4 : 8, true, 4); }

/* Benchmark mode (draft/oracle.h): the rearrangement itself, and on the pycode
 * pair that alpha 1 makes every proposal on the target's path accepted, alpha 0
 * none of a chain's (its first candidate is then never the target's), both with
 * output equal to target-only output. */
Test(tree, oracle_controls_acceptance) {
    const int32_t own[4] = {7, 3, 9, 4};
    int32_t out[4];
    tdm_rng r;
    tdm_rng_seed(&r, 1);
    cr_assert_eq(tdm_oracle_arrange(9, 1.0, &r, own, 4, 3, out), 3);
    cr_assert(out[0] == 9 && out[1] == 7 && out[2] == 3, "alpha 1: the truth first, the rest in order");
    int seconds = 0, absent = 0;
    for (int i = 0; i < 400; i++) {
        const int32_t n = tdm_oracle_arrange(7, 0.0, &r, own, 4, 2, out);
        cr_assert_eq(n, 2);
        cr_assert_neq(out[0], 7, "alpha 0: never first");
        seconds += out[1] == 7;
        absent += out[1] != 7;
    }
    cr_assert(seconds > 150 && absent > 150, "second half the time: %d of 400", seconds);

    size_t n_lines, n;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = make_engine(NULL), *spec = make_engine(g_draft);
    tdm_err err = {0};
    int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[3], "prompt_ids"), &n);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 40;
    gp.ignore_eos = true;
    tandem_result want;
    cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
    for (int mode = 0; mode < 3; mode++) {
        tandem_generate_params g = gp;
        g.bench_oracle_tokens = want.tokens;
        g.bench_n_oracle = (int)want.n_tokens;
        g.bench_oracle_alpha = mode == 1 ? 0.0f : 1.0f;
        g.spec_k = mode < 2 ? 4 : 0;
        g.spec_tree = mode == 2 ? 16 : 0;
        tandem_result got;
        cr_assert_eq(tdm_generate_one(spec, ids, (int32_t)n, &g, &got, &err), TANDEM_OK, "%s", err.msg);
        cr_assert(got.n_tokens == want.n_tokens && !memcmp(got.tokens, want.tokens, want.n_tokens * sizeof(int32_t)),
                  "mode %d: output differs from target-only", mode);
        if (mode == 1) cr_assert_eq(got.spec.accepted, 0, "alpha 0: %llu accepted", (unsigned long long)got.spec.accepted);
        else cr_assert_geq(got.spec.forward_tokens, 4 * got.spec.forwards - 4, "alpha 1: %llu tokens in %llu forwards",
                           (unsigned long long)got.spec.forward_tokens, (unsigned long long)got.spec.forwards);
        tandem_result_free(&got);
    }
    gp.temperature = 0.5f;
    gp.bench_oracle_tokens = want.tokens;
    gp.bench_n_oracle = (int)want.n_tokens;
    tandem_result bad;
    cr_assert_eq(tdm_generate_one(spec, ids, (int32_t)n, &gp, &bad, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "greedy"), "%s", err.msg);
    tandem_result_free(&want);
    free(ids);
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}
