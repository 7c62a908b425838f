/* test_api_generate.c - generation through the public C API (include/tandem.h): greedy
 * speculative == target-only, streaming callbacks, bad requests, cancellation from the callback,
 * a KV cache too small for the prompt, engine parameters (threads, KV block size, n_ctx)
 * that must not change / must bound the output, and models whose logits are not finite. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_testutil.h"
#include "tandem.h"
#include "testutil.h"
#include "tiny_model.h"

/* ------------------------------------------------------------ generation */

static char **dev_prompts(size_t want) {
    size_t n;
    tdm_json **items = tdm_test_jsonl(tdm_test_data_path("prompts-dev.jsonl"), &n);
    cr_assert_geq(n, want);
    char **out = calloc(want, sizeof *out);
    for (size_t i = 0; i < want; i++) {
        const tdm_json *p = tdm_json_get(items[i], "prompt");
        cr_assert(p && p->type == TDM_JSON_STRING);
        out[i] = strdup(p->str);
    }
    tdm_test_jsonl_free(items, n);
    return out;
}

static void free_prompts(char **p, size_t n) {
    for (size_t i = 0; i < n; i++) free(p[i]);
    free(p);
}

/* Collects what the streaming callback sees. */
typedef struct stream_log {
    int32_t toks[512];
    size_t n;
    char text[16384];
    size_t len;
} stream_log;

static bool on_token(int32_t token, const char *text, size_t len, void *ud) {
    stream_log *s = ud;
    cr_assert(s->n < 512);
    s->toks[s->n++] = token;
    cr_assert(len == 0 || text);
    cr_assert(s->len + len < sizeof s->text);
    memcpy(s->text + s->len, text, len);
    s->len += len;
    s->text[s->len] = 0;
    return true;
}

static void expect_stream_equals_result(const stream_log *s, const tandem_result *r, const char *what) {
    cr_assert_eq(s->n, r->n_tokens, "%s: callback saw %zu tokens, result has %zu", what, s->n, r->n_tokens);
    cr_assert_eq(memcmp(s->toks, r->tokens, s->n * sizeof(int32_t)), 0, "%s: callback tokens differ", what);
    cr_assert_str_eq(s->text, r->text, "%s: concatenated callback text differs from result.text", what);
}

#define N_GEN_PROMPTS 4

Test(api, greedy_speculative_equals_target_only, .timeout = 300) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    tandem_engine *plain = api_open_engine(t, NULL, NULL), *spec = api_open_engine(t, d, NULL);
    char **prompts = dev_prompts(N_GEN_PROMPTS);
    const int ks[] = {0, 1, 4};
    uint64_t drafted = 0;
    for (size_t i = 0; i < N_GEN_PROMPTS; i++) {
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 40;
        stream_log *lp = calloc(1, sizeof *lp);
        gp.on_token = on_token;
        gp.user_data = lp;
        tandem_result want;
        cr_assert_eq(tandem_generate(plain, prompts[i], &gp, &want), TANDEM_OK, "%s", tandem_last_error());
        cr_assert_gt(want.n_tokens, 0);
        cr_assert(want.n_prompt_tokens > 1);
        cr_assert(want.finish_reason == TANDEM_FINISH_LENGTH || want.finish_reason == TANDEM_FINISH_EOS);
        if (want.finish_reason == TANDEM_FINISH_LENGTH) cr_assert_eq(want.n_tokens, 40);
        cr_assert_eq(want.spec.steps, 0, "target-only engine reports speculative steps");
        expect_stream_equals_result(lp, &want, "target-only");
        /* the text is the detokenized tokens */
        char *txt;
        cr_assert_eq(tandem_detokenize(t, want.tokens, want.n_tokens, &txt), TANDEM_OK);
        cr_assert_str_eq(txt, want.text);
        tandem_free(txt);
        for (size_t k = 0; k < sizeof ks / sizeof ks[0]; k++) {
            memset(lp, 0, sizeof *lp);
            gp.spec_k = ks[k];
            tandem_result got;
            cr_assert_eq(tandem_generate(spec, prompts[i], &gp, &got), TANDEM_OK, "%s", tandem_last_error());
            size_t diff = 0;
            while (diff < got.n_tokens && diff < want.n_tokens && got.tokens[diff] == want.tokens[diff]) diff++;
            cr_assert(got.n_tokens == want.n_tokens && diff == want.n_tokens,
                      "prompt %zu, k=%d: speculative output differs at token %zu (lengths %zu / %zu)", i, ks[k],
                      diff, got.n_tokens, want.n_tokens);
            cr_assert_str_eq(got.text, want.text);
            cr_assert_eq(got.finish_reason, want.finish_reason);
            cr_assert_eq(got.n_prompt_tokens, want.n_prompt_tokens);
            /* (a fixed length speculates every step; the automatic one (k 0) chooses by
             * measured costs, and on a loaded machine may choose no speculation for a
             * whole short request: it was so in an ASan run at load 10) */
            if (ks[k] > 0) cr_assert_gt(got.spec.steps, 0, "prompt %zu, k=%d: no speculative step", i, ks[k]);
            cr_assert_leq(got.spec.accepted, got.spec.drafted);
            if (ks[k] > 0) cr_assert_leq(got.spec.drafted, (uint64_t)ks[k] * got.spec.steps);
            uint64_t hist = 0;
            for (int b = 0; b < TANDEM_SPEC_HIST_MAX; b++) hist += got.spec.accept_hist[b];
            cr_assert_eq(hist, got.spec.steps);
            drafted += got.spec.drafted;
            expect_stream_equals_result(lp, &got, "speculative");
            tandem_result_free(&got);
        }
        free(lp);
        tandem_result_free(&want);
    }
    cr_assert_gt(drafted, 0);
    free_prompts(prompts, N_GEN_PROMPTS);
    tandem_engine_close(spec);
    tandem_engine_close(plain);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* A request that must be rejected with INVALID_ARG (out stays empty). */
static void expect_bad_request(tandem_engine *e, const int32_t *ids, size_t n, const tandem_generate_params *gp,
                               const char *what) {
    tandem_result r;
    memset(&r, 0, sizeof r);
    tandem_status st = tandem_generate_ids(e, ids, n, gp, &r);
    cr_assert_eq(st, TANDEM_ERR_INVALID_ARG, "%s: status %d (%s)", what, (int)st, tandem_last_error());
    cr_assert(tandem_last_error()[0], "%s: no message", what);
    cr_assert_null(r.tokens, "%s", what);
    cr_assert_null(r.text, "%s", what);
    tandem_result_free(&r);
}

static void expect_same_result(tandem_engine *e, const int32_t *ids, size_t n, const tandem_result *want,
                               const char *what) {
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 12;
    tandem_result r;
    cr_assert_eq(tandem_generate_ids(e, ids, n, &gp, &r), TANDEM_OK, "after %s: %s", what, tandem_last_error());
    cr_assert_eq(r.n_tokens, want->n_tokens, "after %s", what);
    cr_assert_eq(memcmp(r.tokens, want->tokens, r.n_tokens * sizeof(int32_t)), 0, "after %s: output changed",
                 what);
    tandem_result_free(&r);
}

static void bad_requests_on(tandem_engine *e) {
    int32_t ids[] = {0, 490, 63, 3067, 8};
    size_t n = 5;
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 12;
    tandem_result good;
    cr_assert_eq(tandem_generate_ids(e, ids, n, &gp, &good), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(good.n_tokens, 12);

#define BAD(desc, stmt)                                                  \
    do {                                                                 \
        tandem_generate_params p = tandem_generate_default_params();     \
        p.max_tokens = 12;                                               \
        stmt;                                                            \
        expect_bad_request(e, ids, n, &p, desc);                         \
        expect_same_result(e, ids, n, &good, desc);                      \
    } while (0)
    BAD("temperature -1", p.temperature = -1.0f);
    BAD("temperature NaN", p.temperature = 0.0f / 0.0f);
    BAD("top_p 0", p.top_p = 0.0f);
    BAD("top_p 1.5", p.top_p = 1.5f);
    BAD("top_k -1", p.top_k = -1);
    BAD("min_p 2", p.min_p = 2.0f);
    BAD("spec_k 33", p.spec_k = 33);
    BAD("spec_k -1", p.spec_k = -1);
    BAD("spec_k_max 40", p.spec_k_max = 40);
    BAD("spec_k_min 0", p.spec_k_min = 0);
    BAD("max_tokens -1", p.max_tokens = -1);
    BAD("spec_ngram 1", p.spec_ngram = 1);
    BAD("spec_ngram 9", p.spec_ngram = 9);
    BAD("spec_ngram -2", p.spec_ngram = -2);
    BAD("spec_p_min 1.5", p.spec_p_min = 1.5f);
    BAD("spec_p_min NaN", p.spec_p_min = 0.0f / 0.0f);
#undef BAD
    /* the message names the field and its range */
    gp.top_p = 0;
    expect_bad_request(e, ids, n, &gp, "top_p 0");
    cr_assert(strstr(tandem_last_error(), "top_p") && strstr(tandem_last_error(), "(0, 1]"), "%s",
              tandem_last_error());
    gp.top_p = 1;
    gp = tandem_generate_default_params();
    int32_t out_hi[] = {0, 490, 8192};
    expect_bad_request(e, out_hi, 3, &gp, "prompt id 8192");
    expect_same_result(e, ids, n, &good, "prompt id 8192");
    int32_t out_lo[] = {0, -1, 5};
    expect_bad_request(e, out_lo, 3, &gp, "prompt id -1");
    expect_bad_request(e, ids, 0, &gp, "empty prompt");
    expect_bad_request(e, NULL, 3, &gp, "NULL prompt");
    /* a rejected request leaves the result zeroed (safe to free) */
    tandem_result r;
    memset(&r, 0x5A, sizeof r);
    gp.temperature = -1;
    cr_assert_eq(tandem_generate_ids(e, ids, n, &gp, &r), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(r.tokens);
    cr_assert_null(r.text);
    cr_assert_eq(r.n_tokens, 0);
    tandem_result_free(&r);
    gp.temperature = 0;
    cr_assert_eq(tandem_generate_ids(NULL, ids, n, &gp, &r), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_generate_ids(e, ids, n, &gp, NULL), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_generate(e, NULL, &gp, &r), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_generate(NULL, "x", &gp, &r), TANDEM_ERR_INVALID_ARG);
    expect_same_result(e, ids, n, &good, "NULL arguments");

    /* max_tokens = 0: nothing generated, finish "length" */
    gp.max_tokens = 0;
    cr_assert_eq(tandem_generate_ids(e, ids, n, &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(r.n_tokens, 0);
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_LENGTH);
    cr_assert_str_eq(tandem_finish_reason_str(r.finish_reason), "length");
    cr_assert(r.text && r.text[0] == 0);
    cr_assert_eq(r.n_prompt_tokens, n);
    tandem_result_free(&r);
    cr_assert_eq(tandem_generate(e, "def f():", &gp, &r), TANDEM_OK);
    cr_assert_eq(r.n_tokens, 0);
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_LENGTH);
    tandem_result_free(&r);
    expect_same_result(e, ids, n, &good, "max_tokens 0");
    tandem_result_free(&good);
}

Test(api, bad_requests_are_rejected_and_the_engine_still_works, .timeout = 300) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    tandem_engine *plain = api_open_engine(t, NULL, NULL);
    bad_requests_on(plain);
    tandem_engine_close(plain);
    tandem_engine *spec = api_open_engine(t, d, NULL);
    bad_requests_on(spec);
    tandem_engine_close(spec);
    tandem_model_close(d);
    tandem_model_close(t);
}

static bool stop_at_5(int32_t token, const char *text, size_t len, void *ud) {
    (void)token, (void)text, (void)len;
    return ++*(int *)ud < 5;
}

Test(api, callback_cancels, .timeout = 120) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    tandem_engine *spec = api_open_engine(t, d, NULL);
    int count = 0;
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 50;
    gp.on_token = stop_at_5;
    gp.user_data = &count;
    tandem_result r;
    char **prompts = dev_prompts(1);
    cr_assert_eq(tandem_generate(spec, prompts[0], &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    free_prompts(prompts, 1);
    cr_assert_eq(count, 5);
    cr_assert_eq(r.n_tokens, 5);
    cr_assert_eq(r.finish_reason, TANDEM_FINISH_CANCELLED);
    cr_assert_str_eq(tandem_finish_reason_str(r.finish_reason), "cancelled");
    tandem_result_free(&r);
    tandem_engine_close(spec);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* ------------------------------------------------------------ KV budget */

/* K and V bytes of one 16-token block of an f32 cache for a model. */
static size_t kv_block_bytes(const tandem_model *m) {
    tandem_model_info in;
    cr_assert_eq(tandem_model_get_info(m, &in), TANDEM_OK);
    return (size_t)in.n_layer * 2 * (size_t)in.n_head_kv * (size_t)(in.n_embd / in.n_head) * 4 * 16;
}

/* Generates greedily (max new tokens) and reports whether it ran to the length limit. */
static bool runs_to_length(tandem_engine *e, const int32_t *ids, size_t n, int max_new) {
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = max_new;
    tandem_result r;
    cr_assert_eq(tandem_generate_ids(e, ids, n, &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    bool ok = r.finish_reason == TANDEM_FINISH_LENGTH && r.n_tokens == (size_t)max_new;
    tandem_result_free(&r);
    return ok;
}

/* Same tokens from e as from ref for this request. */
static void expect_same_as(tandem_engine *e, tandem_engine *ref, const int32_t *ids, size_t n, int max_new,
                           const char *what) {
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = max_new;
    tandem_result a, b;
    cr_assert_eq(tandem_generate_ids(ref, ids, n, &gp, &b), TANDEM_OK, "%s: %s", what, tandem_last_error());
    cr_assert_eq(tandem_generate_ids(e, ids, n, &gp, &a), TANDEM_OK, "%s: %s", what, tandem_last_error());
    cr_assert_eq(a.n_tokens, (size_t)max_new, "%s: %zu tokens (%s)", what, a.n_tokens,
                 tandem_finish_reason_str(a.finish_reason));
    cr_assert_eq(a.n_tokens, b.n_tokens, "%s", what);
    cr_assert_eq(memcmp(a.tokens, b.tokens, a.n_tokens * sizeof(int32_t)), 0, "%s: output differs", what);
    tandem_result_free(&a);
    tandem_result_free(&b);
}

#define KV_SHORT 8   /* prompt 8 + 16 new: 2 blocks */
#define KV_MEDIUM 40 /* prompt 40 + 20 new: 60 of the 64 positions */

static void kv_full_on(tandem_model *t, tandem_model *d) {
    tandem_engine *ref = api_open_engine(t, d, NULL);
    /* 4 blocks of 16 positions */
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    ep.kv_bytes = 4 * (kv_block_bytes(t) + (d ? kv_block_bytes(d) : 0));
    tandem_engine *e = api_open_engine(t, d, &ep);

    /* a dev prompt whose short and medium prefixes do not stop at EOS */
    const size_t n_prompts = 10;
    char **prompts = dev_prompts(n_prompts);
    int32_t *ids = NULL;
    size_t n_long = 0;
    for (size_t i = 0; i < n_prompts && !ids; i++) {
        int32_t *cand;
        size_t n;
        cr_assert_eq(tandem_tokenize(t, prompts[i], strlen(prompts[i]), true, &cand, &n), TANDEM_OK);
        if (n > 80 && n < 1000 && runs_to_length(ref, cand, KV_SHORT, 16) && runs_to_length(ref, cand, KV_MEDIUM, 20)) {
            ids = cand;
            n_long = n;
        } else {
            tandem_free(cand);
        }
    }
    free_prompts(prompts, n_prompts);
    cr_assert(ids, "no dev prompt suits the test");

    for (int round = 0; round < 3; round++) {
        /* too long for 64 positions */
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 16;
        tandem_result r;
        memset(&r, 0, sizeof r);
        tandem_status st = tandem_generate_ids(e, ids, n_long, &gp, &r);
        cr_assert_eq(st, TANDEM_ERR_KV_FULL, "round %d: prompt of %zu tokens gave %d (%s)", round, n_long, (int)st,
                     tandem_last_error());
        cr_assert(tandem_last_error()[0]);
        cr_assert_null(r.tokens);
        char what[64];
        snprintf(what, sizeof what, "round %d, short request", round);
        expect_same_as(e, ref, ids, KV_SHORT, 16, what);
        /* nearly all blocks: fails if a failed request leaked one */
        snprintf(what, sizeof what, "round %d, 60 positions", round);
        expect_same_as(e, ref, ids, KV_MEDIUM, 20, what);
    }
    tandem_free(ids);
    tandem_engine_close(e);
    tandem_engine_close(ref);
}

Test(api, small_kv_budget_gives_kv_full_and_recovers, .timeout = 300) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    kv_full_on(t, NULL);
    kv_full_on(t, d);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* ------------------------------------------------------------ engine parameters */

/* Greedy output does not depend on the KV block size, nor on the thread count among
 * counts that run the target the same way: op by op (1 and 3 threads: the target's 2
 * kv heads do not split 3 ways) or tensor parallel (2 threads), whose partial sums
 * round differently (docs/DESIGN.md, decision 8). */
Test(api, threads_and_block_size_do_not_change_output, .timeout = 300) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    char **prompts = dev_prompts(2);
    struct { int threads, block; } cfgs[] = {{2, 16}, {2, 7}, {2, 64}, {2, 1}, {1, 16}, {3, 16}, {3, 5}};
    for (int use_draft = 0; use_draft < 2; use_draft++) {
        tandem_result want[2];
        for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
            if (c == 4) { /* the op-by-op group: compare with its first */
                tandem_result_free(&want[0]);
                tandem_result_free(&want[1]);
            }
            tandem_engine_params ep = tandem_engine_default_params();
            ep.n_threads = cfgs[c].threads;
            ep.kv_block_size = cfgs[c].block;
            tandem_engine *e = api_open_engine(t, use_draft ? d : NULL, &ep);
            for (int i = 0; i < 2; i++) {
                tandem_generate_params gp = tandem_generate_default_params();
                gp.max_tokens = 24;
                tandem_result r;
                cr_assert_eq(tandem_generate(e, prompts[i], &gp, &r), TANDEM_OK, "%s", tandem_last_error());
                if (c == 0 || c == 4) {
                    want[i] = r;
                    continue;
                }
                cr_assert(r.n_tokens == want[i].n_tokens &&
                              memcmp(r.tokens, want[i].tokens, r.n_tokens * sizeof(int32_t)) == 0,
                          "%s, %d threads, block size %d, prompt %d: output differs from %d threads / 16",
                          use_draft ? "speculative" : "target-only", cfgs[c].threads, cfgs[c].block, i,
                          c < 4 ? 2 : 1);
                tandem_result_free(&r);
            }
            tandem_engine_close(e);
        }
        tandem_result_free(&want[0]);
        tandem_result_free(&want[1]);
    }
    free_prompts(prompts, 2);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* n_ctx bounds the prompt and the generation ("length" when the context is full). */
Test(api, context_limit, .timeout = 120) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    char **prompts = dev_prompts(1);
    int32_t *ids;
    size_t n;
    cr_assert_eq(tandem_tokenize(t, prompts[0], strlen(prompts[0]), true, &ids, &n), TANDEM_OK);
    cr_assert_gt(n, 64);
    free_prompts(prompts, 1);
    for (int use_draft = 0; use_draft < 2; use_draft++) {
        tandem_engine_params ep = tandem_engine_default_params();
        ep.n_threads = 2;
        ep.n_ctx = 48;
        tandem_engine *e = api_open_engine(t, use_draft ? d : NULL, &ep);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 100;
        tandem_result r;
        memset(&r, 0, sizeof r);
        cr_assert_eq(tandem_generate_ids(e, ids, 64, &gp, &r), TANDEM_ERR_INVALID_ARG,
                     "a 64-token prompt in a 48-token context");
        cr_assert(tandem_last_error()[0]);
        cr_assert_eq(tandem_generate_ids(e, ids, 48, &gp, &r), TANDEM_ERR_INVALID_ARG,
                     "a 48-token prompt in a 48-token context");
        cr_assert_eq(tandem_generate_ids(e, ids, 30, &gp, &r), TANDEM_OK, "%s", tandem_last_error());
        cr_assert(r.n_tokens <= 18, "%zu tokens after a 30-token prompt in a 48-token context", r.n_tokens);
        if (r.finish_reason != TANDEM_FINISH_EOS) {
            cr_assert_eq(r.finish_reason, TANDEM_FINISH_LENGTH);
            cr_assert_eq(r.n_tokens, 18, "the context was not used up: %zu tokens", r.n_tokens);
        }
        tandem_result_free(&r);
        tandem_engine_close(e);
    }
    tandem_free(ids);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* ------------------------------------------------------------ non-finite logits */

/* A tiny model file (the model keeps it mapped; unlinked here); *file: its base name. */
static tandem_model *open_tiny_named(const tdm_tiny_cfg *c, char *file, size_t cap) {
    char *path = tdm_tiny_model_file(c);
    snprintf(file, cap, "%s", strrchr(path, '/') + 1);
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(path, NULL, &m), TANDEM_OK, "%s", tandem_last_error());
    unlink(path);
    free(path);
    return m;
}

/* Generation fails with TANDEM_ERR_FORMAT naming the model (role and file), greedy and sampled. */
static void expect_non_finite(tandem_model *t, tandem_model *d, const char *role, const char *file) {
    tandem_engine *e = api_open_engine(t, d, NULL);
    int32_t ids[] = {1, 2, 3, 4};
    for (int k = 0; k < 2; k++) {
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 8;
        gp.temperature = k ? 0.8f : 0.0f;
        gp.spec_k = 2; /* (the draft model proposes at every step: the length controller would
                          measure plain steps first, and lookups may win every step of a short text) */
        tandem_result r;
        tandem_status st = tandem_generate_ids(e, ids, 4, &gp, &r);
        const char *msg = tandem_last_error();
        cr_assert_eq(st, TANDEM_ERR_FORMAT, "%s %s, temperature %g: status %d (%s)", role, file, gp.temperature,
                     (int)st, msg);
        cr_assert(strstr(msg, "non-finite logits") && strstr(msg, role) && strstr(msg, file),
                  "message '%s' should name the %s model %s", msg, role, file);
        cr_assert_null(r.tokens);
        tandem_result_free(&r);
    }
    tandem_engine_close(e);
}

/* NaN weights (a norm, an embedding row) used to give token 0 and "eos"; now they are a
 * model error, also when only the draft model is broken. */
Test(api, non_finite_logits_are_a_model_error, .timeout = 120) {
    char good_file[64], norm_file[64], emb_file[64], draft_file[64];
    tdm_tiny_cfg c = tdm_tiny_default();
    tandem_model *good = open_tiny_named(&c, good_file, sizeof good_file);
    c.nan_tensor = "output_norm.weight";
    tandem_model *nan_norm = open_tiny_named(&c, norm_file, sizeof norm_file);
    c.nan_tensor = "token_embd.weight"; /* token 0's row: the tied output head's too */
    tandem_model *nan_emb = open_tiny_named(&c, emb_file, sizeof emb_file);
    c.nan_tensor = "output_norm.weight";
    c.seed = 5;
    tandem_model *nan_draft = open_tiny_named(&c, draft_file, sizeof draft_file);

    expect_non_finite(nan_norm, NULL, "target model", norm_file);
    expect_non_finite(nan_emb, NULL, "target model", emb_file);
    expect_non_finite(nan_norm, good, "target model", norm_file);
    expect_non_finite(good, nan_draft, "draft model", draft_file);

    /* the sound pair still generates */
    tandem_engine *e = api_open_engine(good, NULL, NULL);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 4;
    tandem_result r;
    int32_t ids[] = {1, 2, 3, 4};
    cr_assert_eq(tandem_generate_ids(e, ids, 4, &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(r.n_tokens, 4);
    tandem_result_free(&r);
    tandem_engine_close(e);
    tandem_model_close(nan_draft);
    tandem_model_close(nan_emb);
    tandem_model_close(nan_norm);
    tandem_model_close(good);
}
