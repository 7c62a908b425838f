/* test_spec.c - speculative decoding is lossless under greedy decoding: for all
 * 100 dev prompts, both drafts and k in {1, 2, 4, 8, auto}, the output equals
 * target-only output token for token; rollback leaves exactly the blocks the
 * accepted length needs, and nothing leaks. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
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

static tdm_engine *make_engine(tdm_model *draft) {
    tdm_err err = {0};
    tdm_engine_cfg cfg = {.n_threads = 2};
    tdm_engine *e;
    cr_assert_eq(tdm_engine_create(g_target, draft, &cfg, &e, &err), TANDEM_OK, "%s", err.msg);
    return e;
}

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
    cr_assert_eq(tdm_engine_generate(plain, ids, (int32_t)*n, gp, want, &err), TANDEM_OK, "%s", err.msg);
    return ids;
}

Test(spec, greedy_equals_target_only_all_prompts_drafts_and_k) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    cr_assert_eq(n_lines, 100);
    tdm_engine *plain = make_engine(NULL);
    tdm_engine *spec[2] = {make_engine(g_draft[0]), make_engine(g_draft[1])};
    const int ks[] = {1, 2, 4, 8, 0 /* auto */};
    tdm_err err = {0};
    uint64_t drafted[2][5] = {{0}}, accepted[2][5] = {{0}};
    for (size_t li = 0; li < n_lines; li++) {
        size_t n;
        tandem_generate_params gp = greedy_params();
        tandem_result want;
        int32_t *ids = target_only(plain, refs[li], &gp, &n, &want);
        for (int d = 0; d < 2; d++) {
            for (size_t ki = 0; ki < TDM_ARRAY_LEN(ks); ki++) {
                gp.spec_k = ks[ki];
                tandem_result got;
                cr_assert_eq(tdm_engine_generate(spec[d], ids, (int32_t)n, &gp, &got, &err), TANDEM_OK, "%s",
                             err.msg);
                size_t diff = 0;
                while (diff < got.n_tokens && diff < want.n_tokens && got.tokens[diff] == want.tokens[diff]) diff++;
                cr_assert(got.n_tokens == want.n_tokens && diff == want.n_tokens,
                          "prompt %zu, %s, k=%d: output differs from target-only at token %zu (lengths %zu/%zu)",
                          li, g_draft_files[d], ks[ki], diff, got.n_tokens, want.n_tokens);
                cr_assert_eq(got.finish_reason, want.finish_reason);
                cr_assert_str_eq(got.text, want.text);
                cr_assert_eq(tdm_kv_pool_n_free(spec[d]->pool), tdm_kv_pool_n_blocks(spec[d]->pool),
                             "KV blocks leaked");
                cr_assert_leq(got.spec.accepted, got.spec.drafted);
                if (ks[ki] > 0) cr_assert_leq(got.spec.drafted, (uint64_t)ks[ki] * got.spec.steps);
                drafted[d][ki] += got.spec.drafted;
                accepted[d][ki] += got.spec.accepted;
                tandem_result_free(&got);
            }
        }
        tandem_result_free(&want);
        free(ids);
    }
    for (int d = 0; d < 2; d++)
        for (size_t ki = 0; ki < TDM_ARRAY_LEN(ks); ki++) {
            cr_log_info("%s k=%d: acceptance %.3f", g_draft_files[d], ks[ki],
                        drafted[d][ki] ? (double)accepted[d][ki] / (double)drafted[d][ki] : 0.0);
            cr_assert_gt(accepted[d][ki], 0, "no draft token was ever accepted");
        }
    tdm_engine_free(plain);
    tdm_engine_free(spec[0]);
    tdm_engine_free(spec[1]);
    tdm_test_jsonl_free(refs, n_lines);
}

/* After every step the shared block table holds exactly the accepted length:
 * target positions n - 1, draft positions <= n - 1, blocks in use = blocks for n - 1. */
Test(spec, rollback_keeps_exactly_the_accepted_length) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *e = make_engine(g_draft[0]);
    tdm_err err = {0};
    for (size_t li = 0; li < 10; li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        for (int temp = 0; temp < 2; temp++) {
            tandem_generate_params gp = tandem_generate_default_params();
            gp.max_tokens = 80;
            gp.temperature = temp ? 0.8f : 0.0f;
            gp.seed = li;
            gp.spec_k = (int)(li % 3) * 3; /* 0 (auto), 3, 6 */
            gp.spec_ngram = li % 2 ? 3 : 0;  /* n-gram proposals on odd prompts */
            tdm_seq s;
            cr_assert_eq(tdm_seq_init(e, &s, ids, (int32_t)n, &gp, &err), TANDEM_OK, "%s", err.msg);
            cr_assert_eq(tdm_seq_prefill(e, &s, &err), TANDEM_OK, "%s", err.msg);
            int steps = 0;
            while (!s.done) {
                cr_assert_eq(tdm_seq_step(e, &s, &err), TANDEM_OK, "%s", err.msg);
                steps++;
                if (s.done) break;
                int32_t held = s.n_tokens - 1;
                cr_assert_eq(s.n_target, held);
                cr_assert_leq(s.n_draft, held);
                cr_assert_eq(s.kv.len, held, "block table holds %d positions, accepted length needs %d",
                             (int)s.kv.len, (int)held);
                int32_t used = tdm_kv_pool_n_blocks(e->pool) - tdm_kv_pool_n_free(e->pool);
                cr_assert_eq(used, tdm_kv_blocks_for(e->pool, held), "%d blocks in use for %d positions",
                             (int)used, (int)held);
            }
            cr_assert_gt(steps, 0);
            tdm_seq_release(e, &s);
            cr_assert_eq(tdm_kv_pool_n_free(e->pool), tdm_kv_pool_n_blocks(e->pool), "leak after release");
        }
        free(ids);
    }
    tdm_engine_free(e);
    tdm_test_jsonl_free(refs, n_lines);
}

/* With n-gram lookup on, the output is still exactly target-only output, n-gram
 * proposals are made and accepted, and the draft model catches up afterwards. */
Test(spec, ngram_greedy_equals_target_only) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = make_engine(NULL), *spec = make_engine(g_draft[1]);
    tdm_err err = {0};
    const int cfg[][2] = {{0, 3}, {4, 2}, {0, 8}}; /* {spec_k, spec_ngram} */
    uint64_t ng_steps[3] = {0}, ng_acc[3] = {0}, model_steps[3] = {0};
    for (size_t li = 0; li < n_lines; li++) {
        size_t n;
        tandem_generate_params gp = greedy_params();
        tandem_result want;
        int32_t *ids = target_only(plain, refs[li], &gp, &n, &want);
        for (int c = 0; c < 3; c++) {
            gp.spec_k = cfg[c][0];
            gp.spec_ngram = cfg[c][1];
            tandem_result got;
            cr_assert_eq(tdm_engine_generate(spec, ids, (int32_t)n, &gp, &got, &err), TANDEM_OK, "%s", err.msg);
            cr_assert(got.n_tokens == want.n_tokens &&
                          memcmp(got.tokens, want.tokens, want.n_tokens * sizeof(int32_t)) == 0,
                      "prompt %zu, k=%d, ngram=%d: output differs from target-only", li, cfg[c][0], cfg[c][1]);
            cr_assert_eq(tdm_kv_pool_n_free(spec->pool), tdm_kv_pool_n_blocks(spec->pool), "KV blocks leaked");
            cr_assert_leq(got.spec.ngram_steps, got.spec.steps);
            cr_assert_leq(got.spec.ngram_accepted, got.spec.ngram_drafted);
            cr_assert_leq(got.spec.ngram_drafted, got.spec.drafted);
            ng_steps[c] += got.spec.ngram_steps;
            ng_acc[c] += got.spec.ngram_accepted;
            model_steps[c] += got.spec.steps - got.spec.ngram_steps;
            tandem_result_free(&got);
        }
        tandem_result_free(&want);
        free(ids);
    }
    for (int c = 0; c < 3; c++) {
        cr_log_info("k=%d ngram=%d: %llu n-gram steps, %llu accepted, %llu draft-model steps", cfg[c][0], cfg[c][1],
                    (unsigned long long)ng_steps[c], (unsigned long long)ng_acc[c],
                    (unsigned long long)model_steps[c]);
        cr_assert_gt(ng_steps[c], 0, "no n-gram proposal was made");
        cr_assert_gt(ng_acc[c], 0, "no n-gram token was accepted");
        cr_assert_gt(model_steps[c], 0, "the draft model never proposed");
    }
    tdm_engine_free(plain);
    tdm_engine_free(spec);
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
    cr_assert_eq(tdm_engine_generate(e, ids, (int32_t)n, &gp, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_CANCELLED, "finish %s after %zu tokens (callback saw %d)",
                 tandem_finish_reason_str(r.finish_reason), r.n_tokens, stop.count);
    cr_assert_eq(r.n_tokens, 10, "cancel at the 10th token: got %zu tokens", r.n_tokens);
    cr_assert_eq(tdm_kv_pool_n_free(e->pool), tdm_kv_pool_n_blocks(e->pool));
    tandem_result_free(&r);
    free(ids);
    tdm_test_jsonl_free(refs, n_lines);
    tdm_engine_free(e);
}

/* Early stop by draft confidence (p_min): still exactly target-only output, and
 * steps draft fewer tokens than k when the draft is unsure. */
Test(spec, p_min_early_stop_keeps_greedy_equality) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_engine *plain = make_engine(NULL), *spec = make_engine(g_draft[0]);
    tdm_err err = {0};
    uint64_t steps = 0, drafted = 0;
    for (size_t li = 0; li < 10; li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = N_NEW;
        tandem_result want, got;
        cr_assert_eq(tdm_engine_generate(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        gp.spec_k = 8;
        gp.spec_p_min = 0.6f;
        gp.spec_ngram = 0;
        cr_assert_eq(tdm_engine_generate(spec, ids, (int32_t)n, &gp, &got, &err), TANDEM_OK, "%s", err.msg);
        cr_assert(got.n_tokens == want.n_tokens &&
                      memcmp(got.tokens, want.tokens, want.n_tokens * sizeof(int32_t)) == 0,
                  "prompt %zu: p_min output differs from target-only", li);
        steps += got.spec.steps;
        drafted += got.spec.drafted;
        tandem_result_free(&want);
        tandem_result_free(&got);
        free(ids);
    }
    cr_assert_lt(drafted, 8 * steps, "p_min never stopped drafting early (%llu drafted in %llu steps)",
                 (unsigned long long)drafted, (unsigned long long)steps);
    cr_assert_gt(drafted, steps, "p_min stopped every chain after one token");
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_test_jsonl_free(refs, n_lines);
}
