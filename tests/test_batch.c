/* test_batch.c - tandem_generate_batch, the continuous-batching scheduler:
 *   - greedy outputs over the prompts-dev prompts with 1, 8 and 32 sequences at
 *     a time, and 8 in a KV pool so small that sequences are preempted, equal
 *     one-at-a-time tandem_generate_ids, target-only and with a draft (whose
 *     sequences speculate in the batch);
 *   - sampled outputs do not depend on the batch (same seed, same tokens), with or
 *     without a draft: batched speculation keeps each sequence's own draws;
 *   - with a draft, the sequences of a batch speculate (drafted tokens accepted,
 *     n-gram proposals among them);
 *   - p_min cuts the chains of a batch's sequences, greedy and sampled, and their
 *     output is still what they give alone and unspeculated;
 *   - a bad request fails alone with its message;
 *   - a pool for two of four long requests preempts instead of failing, the
 *     outputs unchanged, and every block comes back.
 * Greedy checks run every prompt, sampled ones every third (the sanitizer build:
 * every 20th for both). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tandem.h"
#include "testutil.h"

#define N_NEW 24

static tandem_model *open_model(const char *name) {
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(tdm_test_model_path(name), NULL, &m), TANDEM_OK, "%s", tandem_last_error());
    return m;
}

static tandem_engine *open_engine(tandem_model *t, tandem_model *d, int n_seq, size_t kv_bytes) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    ep.n_seq_max = n_seq;
    ep.kv_bytes = kv_bytes;
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(t, d, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    return e;
}

/* Every `every`th prompt (in a sanitizer build every 20th) as token ids. */
typedef struct prompt_set {
    int32_t **ids;
    size_t *n;
    size_t count;
} prompt_set;

static prompt_set load_prompts(size_t every) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    prompt_set p = {calloc(n_lines, sizeof(int32_t *)), calloc(n_lines, sizeof(size_t)), 0};
    /* a sanitizer build: 5 prompts (more than the small pool's two sequences, so
     * that it preempts) */
    const size_t step = tdm_test_sanitized() ? 20 : every;
    for (size_t li = 0; li < n_lines; li += step) {
        p.ids[p.count] = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &p.n[p.count]);
        p.count++;
    }
    tdm_test_jsonl_free(refs, n_lines);
    return p;
}

static void free_prompts(prompt_set *p) {
    for (size_t i = 0; i < p->count; i++) free(p->ids[i]);
    free(p->ids);
    free(p->n);
}

static tandem_request *requests(const prompt_set *p, const tandem_generate_params *gp, bool seeds) {
    tandem_request *r = calloc(p->count, sizeof *r);
    for (size_t i = 0; i < p->count; i++) {
        r[i].prompt_ids = p->ids[i];
        r[i].n_prompt_ids = p->n[i];
        r[i].params = *gp;
        if (seeds) r[i].params.seed = 1000 + i;
    }
    return r;
}

static void same_tokens(const tandem_result *a, const tandem_result *b, const char *what, size_t i) {
    cr_assert_eq(b->status, TANDEM_OK, "%s, request %zu: %s", what, i, b->error ? b->error : "");
    cr_assert(a->n_tokens == b->n_tokens && memcmp(a->tokens, b->tokens, a->n_tokens * sizeof(int32_t)) == 0 &&
                  a->finish_reason == b->finish_reason && strcmp(a->text, b->text) == 0,
              "%s, request %zu: %zu tokens vs %zu alone", what, i, b->n_tokens, a->n_tokens);
}

/* One at a time on an engine of one sequence: the reference. */
static tandem_result *alone(tandem_engine *e, const tandem_request *r, size_t n) {
    tandem_result *out = calloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(tandem_generate_ids(e, r[i].prompt_ids, r[i].n_prompt_ids, &r[i].params, &out[i]), TANDEM_OK,
                     "%s", tandem_last_error());
    return out;
}

static void free_results(tandem_result *r, size_t n) {
    for (size_t i = 0; i < n; i++) tandem_result_free(&r[i]);
    free(r);
}

/* Batches of 1, 8 and 32 (and 8 in a small pool) on a target-only engine and on one
 * with a draft, against a reference computed once: one-at-a-time
 * tandem_generate_ids when greedy, the target-only batch of one when sampling. */
static void check_batches(float temperature) {
    tandem_model *t = open_model("pycode-target-f16.gguf"), *d = open_model("pycode-draft-xs-f16.gguf");
    prompt_set p = load_prompts(temperature > 0 ? 3 : 1);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = N_NEW;
    /* a fixed length, so that every step with a draft speculates whatever the costs
     * measured (a sanitizer build's costs may keep the adaptive choice at 0) */
    gp.spec_k = 3;
    gp.temperature = temperature;
    gp.top_p = temperature > 0 ? 0.95f : 1.0f;
    tandem_request *r = requests(&p, &gp, temperature > 0);
    tandem_result *ref = NULL;
    if (temperature <= 0) {
        tandem_engine *e1 = open_engine(t, NULL, 1, 0);
        ref = alone(e1, r, p.count);
        tandem_engine_close(e1);
    }
    /* -8: eight at a time in a pool of 19 blocks of 16 positions: admission takes two
     * 129-token prompts (9 blocks each with the row after them), which then need 10
     * each as they grow (preempting) */
    const int sizes[] = {1, 8, 32, -8};
    cr_assert_gt(p.count, 3, "the small pool holds two sequences: more prompts are needed");
    tandem_model_info mi, mi_d;
    cr_assert_eq(tandem_model_get_info(t, &mi), TANDEM_OK);
    cr_assert_eq(tandem_model_get_info(d, &mi_d), TANDEM_OK);
    for (int with_draft = 0; with_draft < 2; with_draft++) {
        for (size_t si = 0; si < TDM_ARRAY_LEN(sizes); si++) {
            const bool small = sizes[si] < 0;
            const size_t per_token = (size_t)(mi.kv_bytes_per_token + (with_draft ? mi_d.kv_bytes_per_token : 0));
            const size_t kv = small ? per_token * 19 * 16 : 0;
            tandem_engine *e = open_engine(t, with_draft ? d : NULL, abs(sizes[si]), kv);
            tandem_result *got = calloc(p.count, sizeof *got);
            cr_assert_eq(tandem_generate_batch(e, r, p.count, got), TANDEM_OK, "%s", tandem_last_error());
            if (small) {
                tandem_engine_stats st;
                cr_assert_eq(tandem_engine_get_stats(e, &st), TANDEM_OK);
                cr_assert_gt(st.n_preemptions, 0, "a pool of 19 blocks for eight sequences preempted none");
            }
            tandem_engine_close(e);
            if (with_draft && sizes[si] > 1) { /* greedy and sampled sequences speculate */
                uint64_t drafted = 0, accepted = 0, ngram = 0;
                for (size_t i = 0; i < p.count; i++) {
                    drafted += got[i].spec.drafted;
                    accepted += got[i].spec.accepted;
                    ngram += got[i].spec.ngram_drafted;
                }
                cr_assert_gt(accepted, 0, "batch %d with a draft: %llu drafted, none accepted", sizes[si],
                             (unsigned long long)drafted);
                cr_assert_gt(ngram, 0, "batch %d with a draft: no n-gram proposal", sizes[si]);
            }
            if (!ref) { /* sampling: the target-only batch of one is the reference */
                ref = got;
                continue;
            }
            if (with_draft && temperature > 0 && sizes[si] == 1) {
                /* an engine of one sequence samples speculatively: the same distribution
                 * with other draws (test_spec_stat checks it) */
                free_results(got, p.count);
                continue;
            }
            char what[64];
            snprintf(what, sizeof what, "%s, %s, batch %d%s", with_draft ? "draft" : "target only",
                     temperature > 0 ? "sampled" : "greedy", abs(sizes[si]), small ? ", small pool" : "");
            for (size_t i = 0; i < p.count; i++) same_tokens(&ref[i], &got[i], what, i);
            free_results(got, p.count);
        }
    }
    if (ref) free_results(ref, p.count);
    free(r);
    free_prompts(&p);
    tandem_model_close(d);
    tandem_model_close(t);
}

Test(batch, greedy_equals_one_at_a_time, .timeout = 600) { check_batches(0.0f); }
Test(batch, sampled_tokens_do_not_depend_on_the_batch, .timeout = 600) { check_batches(0.9f); }

/* Chains cut by p_min in a batch (draft/chain.h): greedy requests give what they
 * give alone, sampled ones what the target-only batch gives with the same seeds. */
static void check_p_min(float temperature) {
    tandem_model *t = open_model("pycode-target-f16.gguf"), *d = open_model("pycode-draft-xs-f16.gguf");
    prompt_set p = load_prompts(temperature > 0 ? 6 : 3);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = N_NEW;
    gp.spec_k = 4;
    gp.spec_ngram = 0; /* (every proposal the draft model's: the cut is p_min's) */
    gp.spec_p_min = 0.6f;
    gp.temperature = temperature;
    tandem_request *r = requests(&p, &gp, temperature > 0);
    tandem_engine *e0 = open_engine(t, NULL, temperature > 0 ? 8 : 1, 0);
    tandem_result *ref;
    if (temperature > 0) {
        ref = calloc(p.count, sizeof *ref);
        cr_assert_eq(tandem_generate_batch(e0, r, p.count, ref), TANDEM_OK, "%s", tandem_last_error());
    } else {
        ref = alone(e0, r, p.count);
    }
    tandem_engine_close(e0);
    /* drafted tokens per chain, with p_min 0.6 and without */
    double per_chain[2];
    for (int cut = 0; cut < 2; cut++) {
        for (size_t i = 0; i < p.count; i++) r[i].params.spec_p_min = cut ? 0.6f : 0.0f;
        tandem_engine *e = open_engine(t, d, 8, 0);
        tandem_result *got = calloc(p.count, sizeof *got);
        cr_assert_eq(tandem_generate_batch(e, r, p.count, got), TANDEM_OK, "%s", tandem_last_error());
        tandem_engine_close(e);
        uint64_t drafted = 0, accepted = 0, chains = 0;
        for (size_t i = 0; i < p.count; i++) {
            char what[64];
            snprintf(what, sizeof what, "p_min %.1f, %s, batch 8", cut ? 0.6 : 0.0, temperature > 0 ? "sampled" : "greedy");
            same_tokens(&ref[i], &got[i], what, i);
            drafted += got[i].spec.drafted;
            accepted += got[i].spec.accepted;
            for (size_t h = 0; h < TDM_ARRAY_LEN(got[i].spec.accept_hist); h++) chains += got[i].spec.accept_hist[h];
        }
        cr_assert_gt(accepted, 0, "%llu drafted, none accepted", (unsigned long long)drafted);
        per_chain[cut] = (double)drafted / (double)chains;
        free_results(got, p.count);
    }
    cr_assert_lt(per_chain[1], per_chain[0] - 0.25, "p_min 0.6 cut few chains: %.2f tokens a chain, %.2f without",
                 per_chain[1], per_chain[0]);
    free_results(ref, p.count);
    free(r);
    free_prompts(&p);
    tandem_model_close(d);
    tandem_model_close(t);
}

Test(batch, p_min_cuts_chains_greedy, .timeout = 600) { check_p_min(0.0f); }
Test(batch, p_min_cuts_chains_sampled, .timeout = 600) { check_p_min(0.9f); }

/* Bad requests among good ones: each fails alone, naming its problem. */
Test(batch, a_bad_request_fails_alone) {
    tandem_model *t = open_model("pycode-target-f16.gguf");
    tandem_engine *e = open_engine(t, NULL, 4, 0);
    const int32_t good[] = {1, 822, 1243, 2989}, bad_id[] = {1, 99999};
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 12;
    tandem_request r[6];
    for (int i = 0; i < 6; i++) r[i] = (tandem_request){NULL, good, 4, gp, 0, 0};
    r[1].params.top_p = 0.0f;           /* out of range */
    r[2].prompt_ids = bad_id, r[2].n_prompt_ids = 2;
    r[3].prompt = "def add(a, b):";     /* text prompts work beside ids */
    r[4].n_prompt_ids = 0;              /* an empty prompt */
    tandem_result out[6];
    cr_assert_eq(tandem_generate_batch(e, r, 6, out), TANDEM_OK);
    cr_assert_eq(out[1].status, TANDEM_ERR_INVALID_ARG);
    cr_assert(out[1].error && strstr(out[1].error, "top_p"), "%s", out[1].error);
    cr_assert_eq(out[2].status, TANDEM_ERR_INVALID_ARG);
    cr_assert(out[2].error && strstr(out[2].error, "99999"), "%s", out[2].error);
    cr_assert_eq(out[4].status, TANDEM_ERR_INVALID_ARG);
    cr_assert(out[4].error && strstr(out[4].error, "empty prompt"), "%s", out[4].error);
    tandem_result want;
    cr_assert_eq(tandem_generate_ids(e, good, 4, &gp, &want), TANDEM_OK);
    for (int i = 0; i < 6; i += 5) same_tokens(&want, &out[i], "beside bad requests", (size_t)i);
    cr_assert_eq(out[3].status, TANDEM_OK, "%s", out[3].error);
    cr_assert_eq(out[3].n_tokens, 12);
    cr_assert_null(out[0].error);
    tandem_result_free(&want);
    for (int i = 0; i < 6; i++) tandem_result_free(&out[i]);
    cr_assert_eq(tandem_generate_batch(e, r, 0, NULL), TANDEM_OK);
    cr_assert_eq(tandem_generate_batch(NULL, r, 1, out), TANDEM_ERR_INVALID_ARG);
    tandem_engine_close(e);
    tandem_model_close(t);
}

/* A KV pool for about two sequences, four at a time: instead of failing, the
 * scheduler preempts the newest sequence (frees its blocks, recomputes it when it is
 * admitted again); every request completes with the tokens it gets alone, and every
 * block comes back. */
Test(batch, kv_pool_full_preempts_and_output_is_unchanged) {
    tandem_model *t = open_model("pycode-target-f16.gguf");
    tandem_model_info mi;
    cr_assert_eq(tandem_model_get_info(t, &mi), TANDEM_OK);
    const size_t per_token = (size_t)mi.kv_bytes_per_token;
    tandem_engine *e = open_engine(t, NULL, 4, per_token * 2 * 160);
    tandem_engine *e1 = open_engine(t, NULL, 1, 0);
    int32_t prompts[4][4];
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 150;
    gp.ignore_eos = true;
    tandem_request r[4];
    tandem_result out[4], want[4];
    for (int i = 0; i < 4; i++) {
        const int32_t p[4] = {1, 822 + i, 1243, 2989 - i};
        memcpy(prompts[i], p, sizeof p);
        r[i] = tandem_request_default();
        r[i].prompt_ids = prompts[i];
        r[i].n_prompt_ids = 4;
        r[i].params = gp;
        cr_assert_eq(tandem_generate_ids(e1, prompts[i], 4, &gp, &want[i]), TANDEM_OK, "%s", tandem_last_error());
    }
    cr_assert_eq(tandem_generate_batch(e, r, 4, out), TANDEM_OK);
    int preempted = 0;
    for (int i = 0; i < 4; i++) {
        same_tokens(&want[i], &out[i], "under preemption", (size_t)i);
        preempted += out[i].n_preemptions;
    }
    cr_assert(preempted >= 1, "no request was preempted: the pool should hold two of the four");
    tandem_engine_stats st;
    cr_assert_eq(tandem_engine_get_stats(e, &st), TANDEM_OK);
    cr_assert_eq(st.n_preemptions, (uint64_t)preempted);
    cr_assert_eq(st.kv_blocks_free, st.kv_blocks_total, "%d of %d blocks free after the batch", st.kv_blocks_free,
                 st.kv_blocks_total);
    cr_assert_eq(st.n_running + st.n_waiting, 0);
    for (int i = 0; i < 4; i++) tandem_result_free(&out[i]), tandem_result_free(&want[i]);
    tandem_engine_close(e1);
    tandem_engine_close(e);
    tandem_model_close(t);
}
