/* test_sched.c - the scheduler through the public asynchronous API:
 *   - submit + step: every request's on_finish is called once, the streamed text
 *     is its text, the tokens are the ones it gets alone;
 *   - the engine's own thread, with blocking batches from several host threads;
 *   - cancel and timeout end requests with the text so far and free their blocks;
 *     bad ids and bad requests are errors;
 *   - priorities: higher first, first come first served within a priority;
 *   - stop strings: the text ends before the first one, streaming never shows it;
 *   - chunked prefill under a small token budget, and the prefix cache (with a
 *     draft too): the same tokens as alone, cache hits counted;
 *   - random arrivals, cancels and deadlines on a KV pool small enough to preempt,
 *     against a simple model: every request ends exactly once, no block leaks;
 *   - greedy and sampled requests with a draft under preemption: each as alone;
 *   - n_seq_max 512: 320 short requests in one scheduler, all running at once (or
 *     as many as a small pool holds), each as alone;
 *   - a long prompt beside 20 decoding sequences under a small token budget: the
 *     decodes get a token every step, the prompt advances every step. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api_testutil.h"
#include "tandem.h"
#include "testutil.h"
#include "tiny_model.h"

#define MAX_REQ 64

/* What the callbacks saw of each request. */
typedef struct seen {
    int finishes;            /* on_finish calls */
    int order;               /* when it finished (0, 1, ...) */
    tandem_result res;
    char stream[4096];       /* text passed to on_token */
    size_t n_stream;
    int n_tokens_cb;
} seen;

typedef struct board {
    pthread_mutex_t mu;
    seen s[MAX_REQ];
    tandem_request_id ids[MAX_REQ];
    int n_finished;
} board;

typedef struct cb_ctx {
    board *b;
    int i;
} cb_ctx;

static bool on_token(int32_t token, const char *text, size_t len, void *user) {
    (void)token;
    cb_ctx *c = user;
    seen *s = &c->b->s[c->i];
    cr_assert(s->n_stream + len < sizeof s->stream);
    memcpy(s->stream + s->n_stream, text, len);
    s->n_stream += len;
    s->n_tokens_cb++;
    return true;
}

static void on_finish(tandem_request_id id, tandem_result *r, void *user) {
    cb_ctx *c = user;
    pthread_mutex_lock(&c->b->mu);
    seen *s = &c->b->s[c->i];
    cr_assert_eq(c->b->ids[c->i] == 0 || c->b->ids[c->i] == id, true, "on_finish with another id");
    s->finishes++;
    s->order = c->b->n_finished++;
    s->res = *r;
    pthread_mutex_unlock(&c->b->mu);
}

static board *board_new(void) {
    board *b = calloc(1, sizeof *b);
    pthread_mutex_init(&b->mu, NULL);
    return b;
}

static void board_free(board *b, int n) {
    for (int i = 0; i < n; i++) tandem_result_free(&b->s[i].res);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

static tandem_engine *engine(tandem_model *t, tandem_model *d, int n_seq, size_t kv_bytes, int budget) {
    tandem_engine_params p = tandem_engine_default_params();
    p.n_threads = 2;
    p.n_seq_max = n_seq;
    p.kv_bytes = kv_bytes;
    p.max_batch_tokens = budget;
    p.n_ctx = 512;
    return api_open_engine(t, d, &p);
}

/* prompt i: BOS and a few tokens that differ by request */
static void prompt_of(int i, int32_t *ids, size_t n) {
    ids[0] = 1;
    for (size_t k = 1; k < n; k++) ids[k] = (int32_t)(300 + (i * 37 + (int)k * 11) % 2000);
}

static tandem_request request(const int32_t *ids, size_t n, int max_tokens) {
    tandem_request r = tandem_request_default();
    r.prompt_ids = ids;
    r.n_prompt_ids = n;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    return r;
}

static cb_ctx g_ctx[MAX_REQ];

static tandem_request_id submit(tandem_engine *e, board *b, int i, tandem_request r) {
    g_ctx[i] = (cb_ctx){b, i};
    r.params.on_token = on_token;
    r.params.user_data = &g_ctx[i];
    tandem_request_id id = 0;
    cr_assert_eq(tandem_engine_submit(e, &r, on_finish, &g_ctx[i], &id), TANDEM_OK, "%s", tandem_last_error());
    cr_assert(id > 0);
    b->ids[i] = id;
    return id;
}

static void drain(tandem_engine *e) {
    int pending = 1;
    for (int guard = 0; pending > 0; guard++) {
        cr_assert(guard < 100000, "the scheduler does not finish");
        cr_assert_eq(tandem_engine_step(e, &pending), TANDEM_OK, "%s", tandem_last_error());
    }
}

static void no_leak(tandem_engine *e) {
    tandem_engine_stats st;
    cr_assert_eq(tandem_engine_get_stats(e, &st), TANDEM_OK);
    cr_assert_eq(st.kv_blocks_free, st.kv_blocks_total, "%d of %d KV blocks free", st.kv_blocks_free,
                 st.kv_blocks_total);
    cr_assert_eq(st.n_running + st.n_waiting, 0);
    cr_assert_eq(st.n_finished, st.n_submitted);
}

static void same_as(const tandem_result *want, const tandem_result *got, const char *what, int i) {
    cr_assert_eq(got->status, TANDEM_OK, "%s %d: %s", what, i, got->error ? got->error : "");
    cr_assert(got->n_tokens == want->n_tokens &&
                  memcmp(got->tokens, want->tokens, want->n_tokens * sizeof(int32_t)) == 0 &&
                  strcmp(got->text, want->text) == 0,
              "%s %d: %zu tokens, %zu alone", what, i, got->n_tokens, want->n_tokens);
}

static tandem_result alone(tandem_engine *e1, const tandem_request *r) {
    tandem_result res;
    cr_assert_eq(tandem_generate_ids(e1, r->prompt_ids, r->n_prompt_ids, &r->params, &res), TANDEM_OK, "%s",
                 tandem_last_error());
    return res;
}

Test(sched, submit_step_stream_and_finish_once) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine *e = engine(t, NULL, 3, 0, 0), *e1 = engine(t, NULL, 1, 0, 0);
    board *b = board_new();
    int32_t ids[6][12];
    const int n = 6;
    for (int i = 0; i < n; i++) {
        prompt_of(i, ids[i], 12);
        submit(e, b, i, request(ids[i], 12, 10 + i));
    }
    drain(e);
    for (int i = 0; i < n; i++) {
        seen *s = &b->s[i];
        cr_assert_eq(s->finishes, 1, "request %d: %d on_finish calls", i, s->finishes);
        const tandem_request r = request(ids[i], 12, 10 + i);
        tandem_result want = alone(e1, &r);
        same_as(&want, &s->res, "batched", i);
        cr_assert_eq(s->res.finish_reason, TANDEM_FINISH_LENGTH);
        cr_assert_eq((int)s->res.n_tokens, s->n_tokens_cb);
        cr_assert(s->n_stream == strlen(s->res.text) && memcmp(s->stream, s->res.text, s->n_stream) == 0,
                  "request %d: the stream differs from the text", i);
        tandem_result_free(&want);
    }
    no_leak(e);
    /* after the end, its id is no longer cancellable; 0 never is */
    cr_assert_eq(tandem_engine_cancel(e, b->ids[0]), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_engine_cancel(e, 0), TANDEM_ERR_INVALID_ARG);
    board_free(b, n);
    tandem_engine_close(e1);
    tandem_engine_close(e);
    tandem_model_close(t);
}

/* ---- the engine's thread ---- */

typedef struct host_job {
    tandem_engine *e;
    int32_t ids[3][10];
    tandem_result out[3];
    tandem_status st;
} host_job;

static void *host_thread(void *arg) {
    host_job *j = arg;
    tandem_request r[3];
    for (int k = 0; k < 3; k++) r[k] = request(j->ids[k], 10, 12);
    j->st = tandem_generate_batch(j->e, r, 3, j->out);
    return NULL;
}

Test(sched, own_thread_serves_several_host_threads) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine *e = engine(t, NULL, 4, 0, 0), *e1 = engine(t, NULL, 1, 0, 0);
    cr_assert_eq(tandem_engine_start(e), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tandem_engine_start(e), TANDEM_OK); /* (a no-op) */
    cr_assert_eq(tandem_engine_step(e, NULL), TANDEM_ERR_INVALID_ARG);
    host_job jobs[3];
    pthread_t th[3];
    for (int h = 0; h < 3; h++) {
        jobs[h].e = e;
        for (int k = 0; k < 3; k++) prompt_of(h * 3 + k, jobs[h].ids[k], 10);
        cr_assert_eq(pthread_create(&th[h], NULL, host_thread, &jobs[h]), 0);
    }
    for (int h = 0; h < 3; h++) pthread_join(th[h], NULL);
    cr_assert_eq(tandem_engine_stop(e), TANDEM_OK);
    cr_assert_eq(tandem_engine_stop(e), TANDEM_OK);
    for (int h = 0; h < 3; h++) {
        cr_assert_eq(jobs[h].st, TANDEM_OK);
        for (int k = 0; k < 3; k++) {
            tandem_request r = request(jobs[h].ids[k], 10, 12);
            tandem_result want = alone(e1, &r);
            same_as(&want, &jobs[h].out[k], "from a host thread", h * 3 + k);
            tandem_result_free(&want);
            tandem_result_free(&jobs[h].out[k]);
        }
    }
    no_leak(e);
    tandem_engine_close(e1);
    tandem_engine_close(e);
    tandem_model_close(t);
}

Test(sched, cancel_and_timeout_end_with_the_text_so_far) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine *e = engine(t, NULL, 4, 0, 0);
    board *b = board_new();
    int32_t ids[4][8];
    for (int i = 0; i < 4; i++) prompt_of(i, ids[i], 8);
    tandem_request_id run_id = submit(e, b, 0, request(ids[0], 8, 400));
    tandem_request r1 = request(ids[1], 8, 400);
    r1.timeout_ms = 30;
    submit(e, b, 1, r1);
    submit(e, b, 2, request(ids[2], 8, 6));
    for (int k = 0; k < 5; k++) cr_assert_eq(tandem_engine_step(e, NULL), TANDEM_OK);
    cr_assert_eq(tandem_engine_cancel(e, run_id), TANDEM_OK);
    cr_assert_eq(tandem_engine_cancel(e, run_id), TANDEM_ERR_INVALID_ARG, "cancelled twice");
    tandem_request_id queued = submit(e, b, 3, request(ids[3], 8, 50));
    cr_assert_eq(tandem_engine_cancel(e, queued), TANDEM_OK); /* before it ever ran */
    drain(e);
    cr_assert_eq(b->s[0].res.finish_reason, TANDEM_FINISH_CANCELLED);
    cr_assert(b->s[0].res.n_tokens >= 4 && b->s[0].res.n_tokens < 400, "%zu tokens", b->s[0].res.n_tokens);
    cr_assert_eq(b->s[1].res.finish_reason, TANDEM_FINISH_TIMEOUT);
    cr_assert(b->s[1].res.n_tokens < 400);
    cr_assert_eq(b->s[2].res.finish_reason, TANDEM_FINISH_LENGTH);
    cr_assert_eq(b->s[3].res.finish_reason, TANDEM_FINISH_CANCELLED);
    cr_assert_eq(b->s[3].res.n_tokens, 0);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(b->s[i].finishes, 1);
        cr_assert_eq(b->s[i].res.status, TANDEM_OK);
        cr_assert_str_eq(b->s[i].res.text, b->s[i].stream[0] ? b->s[i].stream : "");
    }
    no_leak(e);
    tandem_engine_stats st;
    tandem_engine_get_stats(e, &st);
    cr_assert_eq(st.n_cancelled, 2);
    cr_assert_eq(st.n_timeouts, 1);
    /* bad requests fail at submit, with no callback */
    tandem_request bad = request(ids[0], 8, 4);
    bad.timeout_ms = -1;
    cr_assert_eq(tandem_engine_submit(e, &bad, on_finish, NULL, NULL), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "timeout_ms"), "%s", tandem_last_error());
    bad = request(ids[0], 8, 4);
    const char *stops[] = {""};
    bad.params.stop = stops;
    bad.params.n_stop = 1;
    cr_assert_eq(tandem_engine_submit(e, &bad, on_finish, NULL, NULL), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "stop string 0"), "%s", tandem_last_error());
    bad = request(NULL, 0, 4);
    cr_assert_eq(tandem_engine_submit(e, &bad, on_finish, NULL, NULL), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tandem_engine_submit(NULL, &bad, on_finish, NULL, NULL), TANDEM_ERR_INVALID_ARG);
    board_free(b, 4);
    tandem_engine_close(e);
    tandem_model_close(t);
}

Test(sched, priorities_run_first_then_fifo) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine *e = engine(t, NULL, 1, 0, 0);
    board *b = board_new();
    int32_t ids[6][6];
    const int prio[6] = {0, 0, 5, 1, 5, 0};
    for (int i = 0; i < 6; i++) {
        prompt_of(i, ids[i], 6);
        tandem_request r = request(ids[i], 6, 3);
        r.priority = prio[i];
        submit(e, b, i, r);
    }
    drain(e);
    const int want[6] = {2, 4, 3, 0, 1, 5}; /* by priority, then submission */
    for (int k = 0; k < 6; k++)
        cr_assert_eq(b->s[want[k]].order, k, "request %d finished %d-th, not %d-th", want[k], b->s[want[k]].order, k);
    board_free(b, 6);
    tandem_engine_close(e);
    tandem_model_close(t);
}

Test(sched, stop_strings_cut_the_text_and_never_stream) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine *e = engine(t, NULL, 2, 0, 0);
    int32_t ids[10];
    prompt_of(3, ids, 10);
    tandem_request r = request(ids, 10, 40);
    tandem_result full = alone(e, &r);
    const size_t L = strlen(full.text);
    cr_assert(L > 20, "too little text to cut: '%s'", full.text);
    /* a stop string from the middle of the text, and one that never occurs */
    char stop[8];
    memcpy(stop, full.text + L / 2, 4);
    stop[4] = 0;
    const char *stops[] = {"\x01never\x01", stop};
    r.params.stop = stops;
    r.params.n_stop = 2;
    board *b = board_new();
    submit(e, b, 0, r);
    drain(e);
    const tandem_result *got = &b->s[0].res;
    const char *first = strstr(full.text, stop);
    cr_assert_not_null(first);
    cr_assert_eq(got->finish_reason, TANDEM_FINISH_STOP);
    cr_assert_eq(strlen(got->text), (size_t)(first - full.text), "text '%s' not cut before '%s'", got->text, stop);
    cr_assert(strncmp(got->text, full.text, strlen(got->text)) == 0);
    cr_assert(b->s[0].n_stream == strlen(got->text) && memcmp(b->s[0].stream, got->text, b->s[0].n_stream) == 0,
              "streamed '%.*s', text '%s'", (int)b->s[0].n_stream, b->s[0].stream, got->text);
    cr_assert(got->n_tokens < full.n_tokens);
    board_free(b, 1);
    tandem_result_free(&full);
    tandem_engine_close(e);
    tandem_model_close(t);
}

/* Long prompts under a budget of 8 rows a step (prefilled over many steps beside
 * the decodes), then the same prompts again: the prefix cache gives their full
 * blocks back; with a draft too.  Every output is the one alone. */
Test(sched, chunked_prefill_and_prefix_cache_keep_the_tokens) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    tandem_engine *e1 = engine(t, NULL, 1, 0, 0);
    for (int with_draft = 0; with_draft < 2; with_draft++) {
        tandem_engine *e = engine(t, with_draft ? d : NULL, 4, 0, 8);
        int32_t ids[4][70];
        tandem_request r[4];
        tandem_result want[4], got[4];
        for (int i = 0; i < 4; i++) {
            prompt_of(i % 2, ids[i], 70); /* two distinct prompts, twice each */
            ids[i][69] = 500 + i;         /* (the last block differs) */
            r[i] = request(ids[i], 70, 12);
            want[i] = alone(e1, &r[i]);
        }
        cr_assert_eq(tandem_generate_batch(e, r, 2, got), TANDEM_OK);
        cr_assert_eq(tandem_generate_batch(e, r + 2, 2, got + 2), TANDEM_OK);
        for (int i = 0; i < 4; i++) same_as(&want[i], &got[i], with_draft ? "cached, draft" : "cached", i);
        for (int i = 2; i < 4; i++)
            cr_assert(got[i].n_cached_tokens >= 48, "request %d: %zu cached tokens", i, got[i].n_cached_tokens);
        tandem_engine_stats st;
        tandem_engine_get_stats(e, &st);
        cr_assert(st.cached_tokens >= 96 && st.prompt_tokens == 280, "%llu of %llu cached",
                  (unsigned long long)st.cached_tokens, (unsigned long long)st.prompt_tokens);
        for (int i = 0; i < 4; i++) tandem_result_free(&want[i]), tandem_result_free(&got[i]);
        tandem_engine_close(e);
    }
    tandem_engine_close(e1);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* Random submits (random priorities, some deadlines), cancels and steps on a pool
 * of about three sequences' worth of blocks, six at a time. */
Test(sched, random_arrivals_cancels_deadlines_no_leak) {
    tandem_model *t = api_open_model(TARGET);
    tandem_model_info mi;
    cr_assert_eq(tandem_model_get_info(t, &mi), TANDEM_OK);
    tandem_engine *e = engine(t, NULL, 6, (size_t)mi.kv_bytes_per_token * 3 * 64, 16);
    board *b = board_new();
    static int32_t ids[MAX_REQ][20];
    uint64_t rng = 12345;
    int n = 0, cancelled = 0;
    bool want_cancel[MAX_REQ] = {0};
    for (int round = 0; round < 400 && (n < MAX_REQ || b->n_finished < n); round++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const unsigned x = (unsigned)(rng >> 33);
        if (x % 3 == 0 && n < MAX_REQ) {
            prompt_of(n, ids[n], 4 + x % 16);
            tandem_request r = request(ids[n], 4 + x % 16, 4 + (int)(x / 7 % 40));
            r.priority = (int)(x / 11 % 3);
            if (x / 13 % 5 == 0) r.timeout_ms = 1 + x / 17 % 20;
            submit(e, b, n, r);
            n++;
        } else if (x % 3 == 1 && n > 0) {
            int i = (int)(x / 5 % (unsigned)n);
            tandem_status st = tandem_engine_cancel(e, b->ids[i]);
            pthread_mutex_lock(&b->mu);
            bool done = b->s[i].finishes > 0;
            pthread_mutex_unlock(&b->mu);
            /* OK exactly when it has not finished and was not cancelled before */
            cr_assert_eq(st == TANDEM_OK, !done && !want_cancel[i], "cancel %d: %d", i, st);
            if (st == TANDEM_OK) want_cancel[i] = true, cancelled++;
        } else {
            cr_assert_eq(tandem_engine_step(e, NULL), TANDEM_OK);
        }
    }
    drain(e);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(b->s[i].finishes, 1, "request %d ended %d times", i, b->s[i].finishes);
        const tandem_result *r = &b->s[i].res;
        cr_assert_eq(r->status, TANDEM_OK, "request %d: %s", i, r->error ? r->error : "");
        if (want_cancel[i])
            cr_assert(r->finish_reason == TANDEM_FINISH_CANCELLED || r->finish_reason == TANDEM_FINISH_LENGTH ||
                      r->finish_reason == TANDEM_FINISH_TIMEOUT);
    }
    no_leak(e);
    tandem_engine_stats st;
    tandem_engine_get_stats(e, &st);
    cr_assert_eq(st.n_submitted, (uint64_t)n);
    cr_assert(st.n_cancelled <= (uint64_t)cancelled);
    cr_assert(st.n_preemptions > 0 && st.n_timeouts > 0 && st.n_cancelled > 0,
              "the mix should preempt, time out and cancel: %llu, %llu, %llu", (unsigned long long)st.n_preemptions,
              (unsigned long long)st.n_timeouts, (unsigned long long)st.n_cancelled);
    board_free(b, n);
    tandem_engine_close(e);
    tandem_model_close(t);
}

Test(sched, close_with_work_left_cancels_it) {
    tandem_model *t = api_open_model(TARGET);
    tandem_engine *e = engine(t, NULL, 2, 0, 0);
    board *b = board_new();
    int32_t ids[3][8];
    for (int i = 0; i < 3; i++) {
        prompt_of(i, ids[i], 8);
        submit(e, b, i, request(ids[i], 8, 100));
    }
    cr_assert_eq(tandem_engine_step(e, NULL), TANDEM_OK);
    tandem_engine_close(e);
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(b->s[i].finishes, 1);
        cr_assert_eq(b->s[i].res.finish_reason, TANDEM_FINISH_CANCELLED);
    }
    board_free(b, 3);
    tandem_model_close(t);
}

/* A draft, greedy and sampled requests mixed, a pool small enough to preempt: the
 * greedy ones speculate in the batch and the sampled ones step target-only, and
 * every output is the one it gets alone on a target-only engine (a preemption
 * reshapes the batch mid-step; each sequence must keep its own kind of step). */
Test(sched, mixed_greedy_sampled_with_draft_under_preemption) {
    tandem_model *t = api_open_model(TARGET), *d = api_open_model(DRAFT);
    tandem_model_info mi;
    cr_assert_eq(tandem_model_get_info(t, &mi), TANDEM_OK);
    tandem_engine *e = engine(t, d, 6, (size_t)mi.kv_bytes_per_token * 2 * 96, 0);
    tandem_engine *e1 = engine(t, NULL, 1, 0, 0);
    int32_t ids[6][12];
    tandem_request r[6];
    tandem_result want[6], got[6];
    for (int i = 0; i < 6; i++) {
        prompt_of(i, ids[i], 12);
        r[i] = request(ids[i], 12, 40);
        /* a fixed length, so that the draft speculates whatever the measured costs
         * (a sanitizer build's costs may keep the adaptive choice at 0) */
        r[i].params.spec_k = 3;
        if (i % 2) {
            r[i].params.temperature = 0.9f;
            r[i].params.seed = 100 + (uint64_t)i;
        }
        want[i] = alone(e1, &r[i]);
    }
    cr_assert_eq(tandem_generate_batch(e, r, 6, got), TANDEM_OK);
    for (int i = 0; i < 6; i++) same_as(&want[i], &got[i], i % 2 ? "sampled" : "greedy", i);
    tandem_engine_stats st;
    tandem_engine_get_stats(e, &st);
    cr_assert_gt(st.n_preemptions, 0, "a pool for three of six sequences preempted none");
    cr_assert_gt(st.spec_drafted, 0, "the greedy sequences did not speculate");
    for (int i = 0; i < 6; i++) tandem_result_free(&want[i]), tandem_result_free(&got[i]);
    tandem_engine_close(e1);
    tandem_engine_close(e);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* ---- many sequences at once ---- */

#define N_MANY 320

typedef struct many_slot {
    tandem_result res;
    int finishes;
} many_slot;

static void many_finish(tandem_request_id id, tandem_result *r, void *user) {
    (void)id;
    many_slot *s = user; /* (every callback runs on the stepping thread: this one) */
    s->res = *r;
    s->finishes++;
}

/* A tiny random model (64 tokens, 32 wide): many requests in seconds under the
 * sanitizers.  *path: its file (unlink and free). */
static tandem_model *tiny_model(char **path) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.n_vocab = 64, c.n_embd = 32, c.n_head = 2, c.n_head_kv = 1, c.n_ff = 48;
    *path = tdm_tiny_model_file(&c);
    tandem_model *t = NULL;
    cr_assert_eq(tandem_model_open(*path, NULL, &t), TANDEM_OK, "%s", tandem_last_error());
    return t;
}

/* n_seq_max 512 (issue 45's largest batch): 320 short requests of varied lengths,
 * greedy and sampled, in one scheduler.  With a pool for all of them every one is
 * running after the first step; with a pool for about a third, as many as it holds
 * (the others wait, or are preempted later); either way every request finishes
 * once, with the tokens and text it gets alone on an engine of one sequence, and
 * every block comes back.  A tiny random model, so that it takes seconds under
 * the sanitizers. */
Test(sched, max_batch_512_many_short_requests_as_alone) {
    char *path = NULL;
    tandem_model *t = tiny_model(&path);
    tandem_model_info mi;
    cr_assert_eq(tandem_model_get_info(t, &mi), TANDEM_OK);
    int32_t(*ids)[12] = calloc(N_MANY, sizeof *ids);
    tandem_request *r = calloc(N_MANY, sizeof *r);
    tandem_result *want = calloc(N_MANY, sizeof *want);
    many_slot *got = calloc(N_MANY, sizeof *got);
    cr_assert(ids && r && want && got);
    tandem_engine_params p = tandem_engine_default_params();
    p.n_threads = 2, p.n_ctx = 32;
    tandem_engine *e1 = api_open_engine(t, NULL, &p);
    uint64_t rng = 45;
    for (int i = 0; i < N_MANY; i++) {
        const size_t n = 3 + (size_t)(i % 9);
        for (size_t k = 0; k < n; k++) ids[i][k] = (int32_t)(1 + tdm_test_rand(&rng) % 63);
        r[i] = request(ids[i], n, 1 + (i * 7) % 9);
        if (i % 4 == 3) {
            r[i].params.temperature = 0.8f, r[i].params.top_p = 0.95f;
            r[i].params.seed = 7 + (uint64_t)i;
        }
        want[i] = alone(e1, &r[i]);
    }
    tandem_engine_close(e1);
    for (int small = 0; small < 2; small++) {
        memset(got, 0, N_MANY * sizeof *got);
        p.n_seq_max = 512;
        /* (small: 100 blocks of 16 positions, for about a third of the requests) */
        p.kv_bytes = small ? (size_t)mi.kv_bytes_per_token * 16 * 100 : 0;
        tandem_engine *e = api_open_engine(t, NULL, &p);
        for (int i = 0; i < N_MANY; i++)
            cr_assert_eq(tandem_engine_submit(e, &r[i], many_finish, &got[i], NULL), TANDEM_OK, "%s",
                         tandem_last_error());
        int pending = 0;
        cr_assert_eq(tandem_engine_step(e, &pending), TANDEM_OK, "%s", tandem_last_error());
        tandem_engine_stats st;
        cr_assert_eq(tandem_engine_get_stats(e, &st), TANDEM_OK);
        if (small)
            cr_assert(st.n_running > 50 && st.n_running < 120, "%d running in a pool of 100 blocks (%llu preempted)",
                      st.n_running, (unsigned long long)st.n_preemptions);
        else
            cr_assert_eq(st.n_running, N_MANY - (int)st.n_finished, "%d running, %d finished of %d",
                         st.n_running, (int)st.n_finished, N_MANY);
        drain(e);
        for (int i = 0; i < N_MANY; i++) {
            cr_assert_eq(got[i].finishes, 1, "request %d: %d on_finish calls", i, got[i].finishes);
            same_as(&want[i], &got[i].res, small ? "small pool" : "512 sequences", i);
            tandem_result_free(&got[i].res);
        }
        no_leak(e);
        tandem_engine_close(e);
    }
    for (int i = 0; i < N_MANY; i++) tandem_result_free(&want[i]);
    free(ids), free(r), free(want), free(got);
    tandem_model_close(t);
    unlink(path);
    free(path);
}

/* Tokens a request has streamed (its on_token calls). */
static bool count_token(int32_t token, const char *text, size_t len, void *user) {
    (void)token, (void)text, (void)len;
    ++*(int *)user;
    return true;
}

/* A long prompt arriving while 20 sequences decode, under a budget of 24 rows a
 * step: every decoding sequence still gets its token in every step (decodes come
 * first), and the prompt, cut to the 4 rows the decodes leave, still advances every
 * step, so that its first token comes within 200 / 4 steps; then it decodes beside
 * them.  Every output is the one it gets alone. */
Test(sched, prompt_chunks_and_decodes_do_not_starve_each_other) {
    char *path = NULL;
    tandem_model *t = tiny_model(&path);
    tandem_engine_params p = tandem_engine_default_params();
    p.n_threads = 2, p.n_ctx = 256, p.n_seq_max = 32, p.max_batch_tokens = 24, p.prefix_cache = false;
    tandem_engine *e = api_open_engine(t, NULL, &p);
    enum { N_DEC = 20, N_LONG = 200 };
    int32_t ids[N_DEC + 1][N_LONG];
    tandem_request r[N_DEC + 1];
    many_slot got[N_DEC + 1];
    int n_tok[N_DEC + 1] = {0};
    memset(got, 0, sizeof got);
    uint64_t rng = 46;
    for (int i = 0; i <= N_DEC; i++) {
        const size_t n = i < N_DEC ? 4 : N_LONG;
        for (size_t k = 0; k < n; k++) ids[i][k] = (int32_t)(1 + tdm_test_rand(&rng) % 63);
        r[i] = request(ids[i], n, i < N_DEC ? 120 : 8);
        r[i].params.on_token = count_token;
        r[i].params.user_data = &n_tok[i];
    }
    for (int i = 0; i < N_DEC; i++)
        cr_assert_eq(tandem_engine_submit(e, &r[i], many_finish, &got[i], NULL), TANDEM_OK, "%s", tandem_last_error());
    for (bool all = false; !all;) { /* until every one decodes */
        cr_assert_eq(tandem_engine_step(e, NULL), TANDEM_OK);
        all = true;
        for (int i = 0; i < N_DEC; i++) all &= n_tok[i] > 0;
    }
    cr_assert_eq(tandem_engine_submit(e, &r[N_DEC], many_finish, &got[N_DEC], NULL), TANDEM_OK, "%s",
                 tandem_last_error());
    int steps = 0, first_at = -1;
    for (int pending = 1; pending > 0; steps++) {
        cr_assert(steps < 1000, "the scheduler does not finish");
        int before[N_DEC];
        memcpy(before, n_tok, sizeof before);
        cr_assert_eq(tandem_engine_step(e, &pending), TANDEM_OK, "%s", tandem_last_error());
        for (int i = 0; i < N_DEC; i++)
            if (!got[i].finishes) /* (still decoding: one token a step, target only) */
                cr_assert_eq(n_tok[i], before[i] + 1, "step %d: request %d got %d tokens", steps, i,
                             n_tok[i] - before[i]);
        if (first_at < 0 && n_tok[N_DEC] > 0) first_at = steps;
    }
    cr_assert(first_at >= 0 && first_at < N_LONG / 4, "the long prompt's first token came at step %d", first_at);
    tandem_engine_params p1 = p;
    p1.n_seq_max = 1;
    tandem_engine *e1 = api_open_engine(t, NULL, &p1);
    for (int i = 0; i <= N_DEC; i++) {
        cr_assert_eq(got[i].finishes, 1, "request %d: %d on_finish calls", i, got[i].finishes);
        tandem_result want = alone(e1, &r[i]);
        same_as(&want, &got[i].res, "beside a long prompt", i);
        tandem_result_free(&want);
        tandem_result_free(&got[i].res);
    }
    no_leak(e);
    tandem_engine_close(e1);
    tandem_engine_close(e);
    tandem_model_close(t);
    unlink(path);
    free(path);
}
