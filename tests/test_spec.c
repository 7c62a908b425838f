/* test_spec.c - speculative decoding is lossless under greedy decoding: over the
 * 100 dev prompts, both drafts and k in {1, 2, 4, 8, auto}, with n-gram lookup and
 * with early stop by draft confidence, the output equals target-only output token
 * for token; rollback leaves exactly the blocks the accepted length needs, and
 * nothing leaks. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "scheduler.h"
#include "spec_ws.h"
#include "kv_cache.h"
#include "testutil.h"

#define N_NEW 64

static tdm_backend *g_wbe;
static tdm_model *g_target, *g_draft[2];
static const char *g_draft_files[2] = {"pycode-draft-s-f16.gguf", "pycode-draft-xs-f16.gguf"};

static void setup(void) {
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &g_wbe, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(tdm_test_model_path("pycode-target-f16.gguf"), g_wbe, &g_target, &err), TANDEM_OK,
                 "%s", err.msg);
    for (int d = 0; d < 2; d++)
        cr_assert_eq(tdm_model_load(tdm_test_model_path(g_draft_files[d]), g_wbe, &g_draft[d], &err), TANDEM_OK,
                     "%s", err.msg);
}

static void teardown(void) {
    tdm_model_free(g_draft[0]);
    tdm_model_free(g_draft[1]);
    tdm_model_free(g_target);
    tdm_backend_destroy(g_wbe);
}

TestSuite(spec, .init = setup, .fini = teardown, .timeout = 3000);

static tdm_engine *make_engine(tdm_model *draft) { return tdm_test_engine(g_target, draft, 2); }

/* Greedy, the draft model alone (n-gram lookup has its own tests). */
static tandem_generate_params greedy_params(void) {
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = N_NEW;
    gp.spec_ngram = 0;
    return gp;
}

/* The prompt ids of a refs line and the target-only result for them (greedy). */
static int32_t *target_only(tdm_engine *plain, const tdm_json *ref, const tandem_generate_params *gp, size_t *n,
                            tandem_result *want) {
    tdm_err err = {0};
    int32_t *ids = tdm_test_json_ids(tdm_json_get(ref, "prompt_ids"), n);
    cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)*n, gp, want, &err), TANDEM_OK, "%s", err.msg);
    return ids;
}

/* Greedy equality, all in one pass over the prompts so that each prompt's
 * target-only output (the expensive fixture) is computed once and checked against:
 *   (a) both drafts with k in {1, 2, 4, 8, auto}, the draft model alone (each
 *       prompt takes every third (draft, k) pair in turn: every pair meets a third of
 *       the prompts);
 *   (b) n-gram lookup beside draft-xs, three {k, n-gram length} configurations (one
 *       per prompt in turn: each meets a third of the prompts);
 *   (c) early stop by draft confidence (p_min 0.6, k 8, draft-s) on the first ten
 *       prompts: still equal, and steps draft fewer than k when the draft is unsure.
 * Every step also checks that no KV block leaks.  A sanitizer build runs every check
 * on every 34th prompt (three) and k in {1, 4, auto} (TDM_TEST_SANITIZED). */
typedef struct greedy_cmp {
    const char *what;
    int prompt, k, ngram;
} greedy_cmp;

static void expect_same(const tandem_result *got, const tandem_result *want, const tdm_engine *e,
                        const greedy_cmp *c) {
    size_t diff = 0;
    while (diff < got->n_tokens && diff < want->n_tokens && got->tokens[diff] == want->tokens[diff]) diff++;
    cr_assert(got->n_tokens == want->n_tokens && diff == want->n_tokens,
              "prompt %d, %s, k=%d, ngram=%d: output differs from target-only at token %zu (lengths %zu/%zu)",
              c->prompt, c->what, c->k, c->ngram, diff, got->n_tokens, want->n_tokens);
    cr_assert_eq(got->finish_reason, want->finish_reason, "prompt %d, %s, k=%d: finish reason", c->prompt, c->what,
                 c->k);
    cr_assert_str_eq(got->text, want->text);
    cr_assert_eq(tdm_kv_pool_n_free(e->pool), tdm_kv_pool_n_blocks(e->pool), "prompt %d, %s, k=%d: KV blocks leaked",
                 c->prompt, c->what, c->k);
    cr_assert_leq(got->spec.accepted, got->spec.drafted);
}

Test(spec, greedy_outputs_equal_target_only) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    cr_assert_eq(n_lines, 100);
    tdm_engine *plain = make_engine(NULL);
    tdm_engine *spec[2] = {make_engine(g_draft[0]), make_engine(g_draft[1])};
    static const int ks_full[] = {1, 2, 4, 8, 0 /* auto */}, ks_quick[] = {1, 4, 0};
    const bool quick = tdm_test_sanitized();
    const int *ks = quick ? ks_quick : ks_full;
    const size_t n_ks = quick ? TDM_ARRAY_LEN(ks_quick) : TDM_ARRAY_LEN(ks_full);
    const size_t stride = quick ? 34 : 1;
    static const int ng_cfg[][2] = {{0, 3}, {4, 2}, {0, 8}}; /* {spec_k, spec_ngram} */
    tdm_err err = {0};
    uint64_t drafted[2][5] = {{0}}, accepted[2][5] = {{0}};
    uint64_t ng_steps[3] = {0}, ng_acc[3] = {0}, model_steps[3] = {0};
    uint64_t pm_steps = 0, pm_drafted = 0;
    int n_pmin = 0;
    for (size_t li = 0; li < n_lines; li += stride) {
        size_t n;
        tandem_generate_params gp = greedy_params();
        tandem_result want;
        int32_t *ids = target_only(plain, refs[li], &gp, &n, &want);
        /* (a) the draft models alone */
        for (int d = 0; d < 2; d++) {
            for (size_t ki = 0; ki < n_ks; ki++) {
                if (!quick && (ki + li + 2 * (size_t)d) % 3) continue; /* a third of the pairs per prompt, all over the set */
                gp = greedy_params();
                gp.spec_k = ks[ki];
                tandem_result got;
                cr_assert_eq(tdm_generate_one(spec[d], ids, (int32_t)n, &gp, &got, &err), TANDEM_OK, "%s",
                             err.msg);
                greedy_cmp c = {g_draft_files[d], (int)li, ks[ki], 0};
                expect_same(&got, &want, spec[d], &c);
                if (ks[ki] > 0) cr_assert_leq(got.spec.drafted, (uint64_t)ks[ki] * got.spec.steps);
                drafted[d][ki] += got.spec.drafted;
                accepted[d][ki] += got.spec.accepted;
                tandem_result_free(&got);
            }
        }
        /* (b) n-gram lookup beside draft-xs */
        for (int c = 0; c < 3; c++) {
            if (!quick && (size_t)c != li % 3) continue; /* one configuration per prompt, in turn */
            gp = greedy_params();
            gp.spec_k = ng_cfg[c][0];
            gp.spec_ngram = ng_cfg[c][1];
            tandem_result got;
            cr_assert_eq(tdm_generate_one(spec[1], ids, (int32_t)n, &gp, &got, &err), TANDEM_OK, "%s", err.msg);
            greedy_cmp cmp = {"n-gram + draft-xs", (int)li, ng_cfg[c][0], ng_cfg[c][1]};
            expect_same(&got, &want, spec[1], &cmp);
            cr_assert_leq(got.spec.ngram_steps, got.spec.steps);
            cr_assert_leq(got.spec.ngram_accepted, got.spec.ngram_drafted);
            cr_assert_leq(got.spec.ngram_drafted, got.spec.drafted);
            ng_steps[c] += got.spec.ngram_steps;
            ng_acc[c] += got.spec.ngram_accepted;
            model_steps[c] += got.spec.steps - got.spec.ngram_steps;
            tandem_result_free(&got);
        }
        /* (c) early stop by draft confidence */
        if (n_pmin < 10) {
            gp = greedy_params();
            gp.spec_k = 8;
            gp.spec_p_min = 0.6f;
            tandem_result got;
            cr_assert_eq(tdm_generate_one(spec[0], ids, (int32_t)n, &gp, &got, &err), TANDEM_OK, "%s", err.msg);
            greedy_cmp cmp = {"p_min 0.6 + draft-s", (int)li, 8, 0};
            expect_same(&got, &want, spec[0], &cmp);
            pm_steps += got.spec.steps;
            pm_drafted += got.spec.drafted;
            n_pmin++;
            tandem_result_free(&got);
        }
        tandem_result_free(&want);
        free(ids);
    }
    for (int d = 0; d < 2; d++)
        for (size_t ki = 0; ki < n_ks; ki++) {
            cr_log_info("%s k=%d: acceptance %.3f", g_draft_files[d], ks[ki],
                        drafted[d][ki] ? (double)accepted[d][ki] / (double)drafted[d][ki] : 0.0);
            cr_assert_gt(accepted[d][ki], 0, "no draft token was ever accepted");
        }
    for (int c = 0; c < 3; c++) {
        cr_log_info("k=%d ngram=%d: %llu n-gram steps, %llu accepted, %llu draft-model steps", ng_cfg[c][0],
                    ng_cfg[c][1], (unsigned long long)ng_steps[c], (unsigned long long)ng_acc[c],
                    (unsigned long long)model_steps[c]);
        cr_assert_gt(ng_steps[c], 0, "no n-gram proposal was made");
        cr_assert_gt(ng_acc[c], 0, "no n-gram token was accepted");
        cr_assert_gt(model_steps[c], 0, "the draft model never proposed");
    }
    cr_assert_lt(pm_drafted, 8 * pm_steps, "p_min never stopped drafting early (%llu drafted in %llu steps)",
                 (unsigned long long)pm_drafted, (unsigned long long)pm_steps);
    cr_assert_gt(pm_drafted, pm_steps, "p_min stopped every chain after one token");
    tdm_engine_free(plain);
    tdm_engine_free(spec[0]);
    tdm_engine_free(spec[1]);
    tdm_test_jsonl_free(refs, n_lines);
}

/* After every step the shared block table holds exactly the accepted length:
 * target positions n - 1, draft positions <= n - 1, blocks in use = blocks for n - 1.
 * Ten prompts (a sanitizer build: six, still every pairing of k and n-gram). */
Test(spec, rollback_keeps_exactly_the_accepted_length) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *e = make_engine(g_draft[0]);
    for (size_t li = 0; li < (tdm_test_sanitized() ? 6u : 10u); li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        for (int temp = 0; temp < 2; temp++) {
            tandem_generate_params gp = tandem_generate_default_params();
            gp.max_tokens = 80;
            gp.temperature = temp ? 0.8f : 0.0f;
            gp.seed = li;
            gp.spec_k = (int)(li % 3) * 3; /* 0 (auto), 3, 6 */
            gp.spec_ngram = li % 2 ? 3 : 0;  /* n-gram proposals on odd prompts */
            cr_assert_gt(tdm_test_run_checked(e, ids, n, &gp, NULL), 0);
        }
        free(ids);
    }
    tdm_engine_free(e);
    tdm_test_jsonl_free(refs, n_lines);
}

/* When the draft model backs off (here: its measured cost made hopeless by hand, as
 * a draft that costs a third of a target step can be on a GPU), n-gram lookups still
 * speculate when they beat a plain step, from the first step on (the back-off's first
 * probe of the draft model comes only after TDM_CTRL_PROBE_MIN plain steps, past
 * these requests' 8 tokens); the output stays target-only's.  40 prompts (a sanitizer
 * build: every fourth of them). */
Test(spec, ngram_speculates_while_the_draft_backs_off) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = TDM_CTRL_PROBE_MIN;
    gp.spec_ngram = 2;
    tdm_err err = {0};
    tdm_engine *plain = make_engine(NULL), *e = make_engine(g_draft[1]);
    tdm_sched *sched;
    cr_assert_eq(tdm_sched_create(e, NULL, &sched, &err), TANDEM_OK, "%s", err.msg);
    tdm_len_ctrl *len = &tdm_sched_ws(sched)->len;
    uint64_t ng_steps = 0, ng_acc = 0, model = 0;
    for (size_t li = 0; li < 40 && li < n_lines; li += tdm_test_sanitized() ? 4 : 1) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_result want, got;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        /* a second a draft token: never worth it (row costs and measured steps) */
        tdm_len_init(len);
        for (int i = 0; i < 2; i++) {
            tdm_rowcost_observe(&len->cost.draft, 1, 1.0);
            for (int r = 1; r <= 65; r++) tdm_rowcost_observe(&len->cost.target, r, 1e-3);
            for (int k = 0; k <= TDM_CTRL_MAX_K; k++) tdm_len_observe_step(len, 1, k, 1e-3 + k * 1.0);
        }
        const int32_t *prompt = ids, n_prompt = (int32_t)n;
        cr_assert_eq(tdm_sched_run(sched, &prompt, &n_prompt, &gp, NULL, NULL, 1, &got, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(got.status, TANDEM_OK, "%s", got.error ? got.error : "");
        const greedy_cmp c = {"draft backed off, n-gram on", (int)li, 0, 2};
        expect_same(&got, &want, e, &c);
        ng_steps += got.spec.ngram_steps;
        ng_acc += got.spec.ngram_accepted;
        model += got.spec.drafted - got.spec.ngram_drafted;
        tandem_result_free(&want);
        tandem_result_free(&got);
        free(ids);
    }
    cr_assert_gt(ng_steps, 0, "no n-gram step while the draft model backed off");
    cr_assert_gt(ng_acc, 0, "no looked-up token accepted");
    cr_assert_eq(model, 0, "the backed-off draft model proposed %llu tokens", (unsigned long long)model);
    tdm_sched_free(sched);
    tdm_engine_free(plain);
    tdm_engine_free(e);
    tdm_test_jsonl_free(refs, n_lines);
}

/* A request cancelled mid-way by its callback frees everything. */
Test(spec, cancel_frees_all_blocks) {
    tdm_engine *e = make_engine(g_draft[1]);
    size_t n_lines, n;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[0], "prompt_ids"), &n); /* 64 tokens without EOS */
    tdm_test_stop stop = {0, 10};
    tdm_err err = {0};
    tandem_generate_params gp = tandem_generate_default_params();
    gp.on_token = tdm_test_stop_cb;
    gp.user_data = &stop;
    tandem_result r;
    cr_assert_eq(tdm_generate_one(e, ids, (int32_t)n, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_CANCELLED, "finish %s after %zu tokens (callback saw %d)",
                 tandem_finish_reason_str(r.finish_reason), r.n_tokens, stop.count);
    cr_assert_eq(r.n_tokens, 10, "cancel at the 10th token: got %zu tokens", r.n_tokens);
    cr_assert_eq(tdm_kv_pool_n_free(e->pool), tdm_kv_pool_n_blocks(e->pool));
    tandem_result_free(&r);
    free(ids);
    tdm_test_jsonl_free(refs, n_lines);
    tdm_engine_free(e);
}
