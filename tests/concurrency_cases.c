/* concurrency_cases.c - one engine driven from many threads at once, as the header
 * allows (tandem.h, "Thread safety"): exactly one thread steps the scheduler at any
 * time, whatever the callers do.  Plain C (no Criterion), so that the same cases run
 * in the Criterion suite of the normal and AddressSanitizer builds
 * (test_concurrency.c) and in the ThreadSanitizer build (tsan_concurrency.c:
 * Criterion's process arena cannot start under ThreadSanitizer).
 *   - callers looping in tandem_generate while the engine's thread is stopped under
 *     them, then started and stopped again and again (before the fix several threads
 *     stepped at once: a segfault, a heap-use-after-free, or a hang in the thread pool);
 *   - many threads in tandem_generate on an engine that was never started;
 *   - submits, cancels, start / stop cycles, host steps and stats from many threads:
 *     every request ends exactly once, no KV block leaks;
 *   - callbacks that call start, stop, step or a blocking generate get an error.
 * The models are the two small pycode drafts (target draft-s, draft draft-xs), so a
 * sanitizer build stays quick; every greedy output is compared with the same request
 * run alone. */
#include "concurrency_cases.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tandem.h"

#define SMALL_TARGET "pycode-draft-s-f16.gguf"
#define SMALL_DRAFT "pycode-draft-xs-f16.gguf"
#define N_PROMPT 8
#define N_NEW 6
#define N_KINDS 5 /* distinct prompts; results are checked against each alone */
#define MAX_THREADS 16

/* ---- failures, from any thread ---- */

/* The first failure of a case. */
typedef struct failure {
    pthread_mutex_t mu;
    char msg[512];
    bool failed;
} failure;

static void fail_at(failure *f, int line, const char *fmt, ...) {
    pthread_mutex_lock(&f->mu);
    if (!f->failed) {
        f->failed = true;
        const int n = snprintf(f->msg, sizeof f->msg, "line %d: ", line);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(f->msg + n, sizeof f->msg - (size_t)n, fmt, ap);
        va_end(ap);
    }
    pthread_mutex_unlock(&f->mu);
}

/* Records a failure unless cond holds; evaluates to cond. */
#define OK(f, cond, ...) ((cond) ? true : (fail_at((f), __LINE__, __VA_ARGS__), false))

static bool has_failed(failure *f) {
    pthread_mutex_lock(&f->mu);
    const bool r = f->failed;
    pthread_mutex_unlock(&f->mu);
    return r;
}

/* The case's verdict: copies the message out. */
static bool verdict(failure *f, char *why, size_t cap) {
    const bool ok = !has_failed(f);
    if (!ok) snprintf(why, cap, "%s", f->msg);
    pthread_mutex_destroy(&f->mu);
    return ok;
}

static void failure_init(failure *f) {
    memset(f, 0, sizeof *f);
    pthread_mutex_init(&f->mu, NULL);
}

/* ---- models, engines, requests ---- */

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static tandem_model *open_model(failure *f, const char *models, const char *file) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", models, file);
    tandem_model *m = NULL;
    OK(f, tandem_model_open(path, NULL, &m) == TANDEM_OK, "%s: %s", path, tandem_last_error());
    return m;
}

static tandem_engine *open_engine(failure *f, tandem_model *t, tandem_model *d, int n_seq) {
    tandem_engine_params p = tandem_engine_default_params();
    p.n_threads = 2;
    p.n_seq_max = n_seq;
    p.n_ctx = 128;
    tandem_engine *e = NULL;
    OK(f, tandem_engine_open(t, d, &p, &e) == TANDEM_OK, "engine: %s", tandem_last_error());
    return e;
}

static void prompt_of(int i, int32_t *ids) {
    ids[0] = 1;
    for (int k = 1; k < N_PROMPT; k++) ids[k] = (int32_t)(300 + (i * 53 + k * 17) % 2000);
}

static tandem_generate_params gen_params(void) {
    tandem_generate_params g = tandem_generate_default_params();
    g.max_tokens = N_NEW;
    g.ignore_eos = true;
    return g;
}

/* The tokens of each prompt kind alone, on an engine of its own. */
typedef struct expected {
    int32_t tok[N_KINDS][N_NEW];
    size_t n[N_KINDS];
} expected;

static bool expect_alone(failure *f, tandem_model *t, tandem_model *d, expected *x) {
    tandem_engine *e1 = open_engine(f, t, d, 1);
    if (!e1) return false;
    const tandem_generate_params g = gen_params();
    bool ok = true;
    for (int i = 0; i < N_KINDS && ok; i++) {
        int32_t ids[N_PROMPT];
        prompt_of(i, ids);
        tandem_result r;
        ok = OK(f, tandem_generate_ids(e1, ids, N_PROMPT, &g, &r) == TANDEM_OK, "alone: %s", tandem_last_error());
        if (!ok) break;
        ok = OK(f, r.n_tokens == (size_t)N_NEW, "alone: %zu tokens", r.n_tokens);
        if (ok) memcpy(x->tok[i], r.tokens, r.n_tokens * sizeof(int32_t));
        x->n[i] = r.n_tokens;
        tandem_result_free(&r);
    }
    tandem_engine_close(e1);
    return ok;
}

static void check_no_leak(failure *f, tandem_engine *e) {
    tandem_engine_stats st;
    if (!OK(f, tandem_engine_get_stats(e, &st) == TANDEM_OK, "stats")) return;
    OK(f, st.kv_blocks_free == st.kv_blocks_total, "%d of %d KV blocks free", st.kv_blocks_free, st.kv_blocks_total);
    OK(f, st.n_running + st.n_waiting == 0, "%d running, %d waiting", st.n_running, st.n_waiting);
    OK(f, st.n_finished == st.n_submitted, "%llu of %llu finished", (unsigned long long)st.n_finished,
       (unsigned long long)st.n_submitted);
}

/* ---- callers looping in tandem_generate ---- */

typedef struct caller {
    failure *f;
    tandem_engine *e;
    const expected *x;
    atomic_bool *quit;
    int id, min_calls; /* at least min_calls calls, then until *quit */
    int calls;
} caller;

static void *caller_main(void *arg) {
    caller *c = arg;
    const tandem_generate_params g = gen_params();
    for (int k = 0; (k < c->min_calls || !atomic_load(c->quit)) && !has_failed(c->f); k++) {
        const int kind = (c->id + k) % N_KINDS;
        int32_t ids[N_PROMPT];
        prompt_of(kind, ids);
        tandem_result r;
        if (!OK(c->f, tandem_generate_ids(c->e, ids, N_PROMPT, &g, &r) == TANDEM_OK, "caller %d: %s", c->id,
                tandem_last_error()))
            break;
        OK(c->f, r.n_tokens == c->x->n[kind] && !memcmp(r.tokens, c->x->tok[kind], r.n_tokens * sizeof(int32_t)),
           "caller %d, call %d: %zu tokens, not the request's tokens alone", c->id, k, r.n_tokens);
        tandem_result_free(&r);
        c->calls++;
    }
    return NULL;
}

/* n callers loop in tandem_generate while meanwhile(e) runs on this thread. */
static void run_callers(failure *f, tandem_engine *e, const expected *x, int n, int min_calls,
                        void (*meanwhile)(failure *, tandem_engine *)) {
    caller c[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    atomic_bool quit = false;
    int started = 0;
    for (int i = 0; i < n && i < MAX_THREADS; i++, started++) {
        c[i] = (caller){.f = f, .e = e, .x = x, .quit = &quit, .id = i, .min_calls = min_calls};
        if (!OK(f, pthread_create(&th[i], NULL, caller_main, &c[i]) == 0, "pthread_create")) break;
    }
    if (meanwhile) meanwhile(f, e);
    atomic_store(&quit, true);
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        OK(f, c[i].calls >= min_calls, "caller %d made %d calls", i, c[i].calls);
    }
}

/* The engine's thread runs for 300 ms under the callers, is stopped (they step it
 * themselves from then on), and is started and stopped again 10 times. */
static void stop_under_callers(failure *f, tandem_engine *e) {
    sleep_ms(300);
    OK(f, tandem_engine_stop(e) == TANDEM_OK, "stop: %s", tandem_last_error());
    sleep_ms(100);
    for (int i = 0; i < 10; i++) {
        OK(f, tandem_engine_start(e) == TANDEM_OK, "start: %s", tandem_last_error());
        sleep_ms(10 + 7 * i);
        OK(f, tandem_engine_stop(e) == TANDEM_OK, "stop: %s", tandem_last_error());
        sleep_ms(5 + 3 * i);
    }
}

/* Callers on an engine of target t (and draft d), started or not. */
static bool callers_case(const char *models, bool with_draft, bool started, int n_callers, int min_calls,
                         void (*meanwhile)(failure *, tandem_engine *), char *why, size_t cap) {
    failure f;
    failure_init(&f);
    tandem_model *t = open_model(&f, models, SMALL_TARGET);
    tandem_model *d = with_draft && t ? open_model(&f, models, SMALL_DRAFT) : NULL;
    expected x;
    tandem_engine *e = NULL;
    if (t && (d || !with_draft) && expect_alone(&f, t, d, &x) && (e = open_engine(&f, t, d, 4))) {
        if (!started || OK(&f, tandem_engine_start(e) == TANDEM_OK, "start: %s", tandem_last_error())) {
            run_callers(&f, e, &x, n_callers, min_calls, meanwhile);
            OK(&f, tandem_engine_stop(e) == TANDEM_OK, "stop");
            check_no_leak(&f, e);
        }
    }
    tandem_engine_close(e);
    tandem_model_close(d);
    tandem_model_close(t);
    return verdict(&f, why, cap);
}

static bool stop_start_under_callers(const char *models, char *why, size_t cap) {
    return callers_case(models, false, true, 4, 3, stop_under_callers, why, cap);
}

static bool speculating_pair_stopped_under_callers(const char *models, char *why, size_t cap) {
    return callers_case(models, true, true, 4, 3, stop_under_callers, why, cap);
}

static bool many_callers_never_started(const char *models, char *why, size_t cap) {
    return callers_case(models, false, false, 8, 2, NULL, why, cap);
}

/* ---- submits, cancels, start / stop, steps and stats from many threads ---- */

#define N_SUBMITTERS 3
#define PER_SUBMITTER 12
#define N_ASYNC (N_SUBMITTERS * PER_SUBMITTER)

typedef struct async_board {
    failure *f;
    tandem_engine *e;
    atomic_int finishes[N_ASYNC];
    atomic_uint_least64_t ids[N_ASYNC];
    atomic_int n_finished, n_cancel_ok;
    atomic_bool quit;
} async_board;

typedef struct slot {
    async_board *b;
    int i;
} slot;

static void on_finish(tandem_request_id id, tandem_result *r, void *user) {
    slot *sl = user;
    (void)id;
    atomic_fetch_add(&sl->b->finishes[sl->i], 1);
    atomic_fetch_add(&sl->b->n_finished, 1);
    tandem_result_free(r);
}

typedef struct submitter {
    async_board *b;
    slot *slots; /* [PER_SUBMITTER] */
    int first;
} submitter;

static void *submit_main(void *arg) {
    submitter *s = arg;
    for (int k = 0; k < PER_SUBMITTER; k++) {
        const int i = s->first + k;
        int32_t ids[N_PROMPT];
        prompt_of(i, ids);
        tandem_request r = tandem_request_default();
        r.prompt_ids = ids;
        r.n_prompt_ids = N_PROMPT;
        r.params = gen_params();
        r.params.max_tokens = 4 + i % 8;
        s->slots[k] = (slot){s->b, i};
        tandem_request_id id = 0;
        if (!OK(s->b->f, tandem_engine_submit(s->b->e, &r, on_finish, &s->slots[k], &id) == TANDEM_OK, "submit: %s",
                tandem_last_error())) {
            atomic_fetch_add(&s->b->finishes[i], 1); /* (counted as ended: the case fails anyway) */
            atomic_fetch_add(&s->b->n_finished, 1);
            continue;
        }
        atomic_store(&s->b->ids[i], id);
        sleep_ms(i % 3);
    }
    return NULL;
}

static void *cancel_main(void *arg) {
    async_board *b = arg;
    unsigned seed = 7;
    while (!atomic_load(&b->quit)) {
        seed = seed * 1103515245u + 12345u;
        const int i = (int)((seed >> 8) % N_ASYNC);
        const uint64_t id = atomic_load(&b->ids[i]);
        if (id && (seed >> 4) % 3 == 0 && tandem_engine_cancel(b->e, id) == TANDEM_OK)
            atomic_fetch_add(&b->n_cancel_ok, 1);
        tandem_engine_stats st;
        OK(b->f, tandem_engine_get_stats(b->e, &st) == TANDEM_OK && st.kv_blocks_free <= st.kv_blocks_total,
           "stats while stepping");
        sleep_ms(2);
    }
    return NULL;
}

static void *toggle_main(void *arg) {
    async_board *b = arg;
    for (int k = 0; !atomic_load(&b->quit); k++) {
        OK(b->f, (k % 2 ? tandem_engine_stop(b->e) : tandem_engine_start(b->e)) == TANDEM_OK, "%s: %s",
           k % 2 ? "stop" : "start", tandem_last_error());
        sleep_ms(3 + k % 5);
    }
    return NULL;
}

/* A host thread that steps the engine whenever it can (refused while the thread runs). */
static void *stepper_main(void *arg) {
    async_board *b = arg;
    while (!atomic_load(&b->quit)) {
        int pending = 0;
        const tandem_status st = tandem_engine_step(b->e, &pending);
        OK(b->f, st == TANDEM_OK || st == TANDEM_ERR_INVALID_ARG, "step: %s", tandem_last_error());
        if (st != TANDEM_OK || pending == 0) sleep_ms(1);
    }
    return NULL;
}

static bool submits_cancels_start_stop_steps(const char *models, char *why, size_t cap) {
    failure f;
    failure_init(&f);
    tandem_model *t = open_model(&f, models, SMALL_TARGET);
    tandem_model *d = t ? open_model(&f, models, SMALL_DRAFT) : NULL;
    tandem_engine *e = d ? open_engine(&f, t, d, 4) : NULL;
    async_board *b = calloc(1, sizeof *b);
    slot *slots = calloc(N_ASYNC, sizeof *slots);
    if (e && OK(&f, b && slots, "out of memory")) {
        b->f = &f;
        b->e = e;
        pthread_t sub[N_SUBMITTERS], canc, tog, step;
        submitter sj[N_SUBMITTERS];
        for (int k = 0; k < N_SUBMITTERS; k++) {
            sj[k] = (submitter){b, slots + k * PER_SUBMITTER, k * PER_SUBMITTER};
            if (pthread_create(&sub[k], NULL, submit_main, &sj[k]) != 0) submit_main(&sj[k]);
        }
        const bool c_ok = pthread_create(&canc, NULL, cancel_main, b) == 0;
        const bool t_ok = pthread_create(&tog, NULL, toggle_main, b) == 0;
        const bool s_ok = pthread_create(&step, NULL, stepper_main, b) == 0;
        OK(&f, c_ok && t_ok && s_ok, "pthread_create");
        for (int k = 0; k < N_SUBMITTERS; k++) pthread_join(sub[k], NULL);
        for (int guard = 0; atomic_load(&b->n_finished) < N_ASYNC; guard++) {
            if (!OK(&f, guard < 60000, "%d of %d requests finished in 60 s", atomic_load(&b->n_finished), N_ASYNC))
                break;
            sleep_ms(1);
        }
        atomic_store(&b->quit, true);
        if (c_ok) pthread_join(canc, NULL);
        if (t_ok) pthread_join(tog, NULL);
        if (s_ok) pthread_join(step, NULL);
        OK(&f, tandem_engine_stop(e) == TANDEM_OK, "stop");
        for (int i = 0; i < N_ASYNC; i++)
            OK(&f, atomic_load(&b->finishes[i]) == 1, "request %d ended %d times", i, atomic_load(&b->finishes[i]));
        tandem_engine_stats st;
        if (OK(&f, tandem_engine_get_stats(e, &st) == TANDEM_OK, "stats"))
            /* (an accepted cancel of a request that ends in the same step ends it as it would) */
            OK(&f, st.n_cancelled <= (uint64_t)atomic_load(&b->n_cancel_ok), "%llu cancelled, %d cancels accepted",
               (unsigned long long)st.n_cancelled, atomic_load(&b->n_cancel_ok));
        check_no_leak(&f, e);
    }
    tandem_engine_close(e); /* (after every callback: the slots outlive it) */
    free(slots);
    free(b);
    tandem_model_close(d);
    tandem_model_close(t);
    return verdict(&f, why, cap);
}

/* ---- what a callback may not call ---- */

typedef struct cb_probe {
    tandem_engine *e;
    int calls;
    tandem_status start, stop, step, gen;
} cb_probe;

static bool probe_token(int32_t token, const char *text, size_t len, void *user) {
    (void)token, (void)text, (void)len;
    cb_probe *p = user;
    if (p->calls++ == 0) {
        p->start = tandem_engine_start(p->e);
        p->stop = tandem_engine_stop(p->e);
        p->step = tandem_engine_step(p->e, NULL);
        tandem_result r;
        int32_t ids[N_PROMPT];
        prompt_of(0, ids);
        p->gen = tandem_generate_ids(p->e, ids, N_PROMPT, NULL, &r);
        if (p->gen == TANDEM_OK) tandem_result_free(&r);
    }
    return true;
}

static bool callbacks_cannot_start_stop_step_or_block(const char *models, char *why, size_t cap) {
    failure f;
    failure_init(&f);
    tandem_model *t = open_model(&f, models, SMALL_TARGET);
    tandem_engine *e = t ? open_engine(&f, t, NULL, 2) : NULL;
    for (int threaded = 0; e && threaded < 2 && !has_failed(&f); threaded++) {
        if (threaded && !OK(&f, tandem_engine_start(e) == TANDEM_OK, "start")) break;
        cb_probe p = {.e = e};
        tandem_generate_params g = gen_params();
        g.on_token = probe_token;
        g.user_data = &p;
        int32_t ids[N_PROMPT];
        prompt_of(1, ids);
        tandem_result r;
        if (!OK(&f, tandem_generate_ids(e, ids, N_PROMPT, &g, &r) == TANDEM_OK, "%s", tandem_last_error())) break;
        OK(&f, r.n_tokens == (size_t)N_NEW, "%zu tokens", r.n_tokens);
        tandem_result_free(&r);
        OK(&f, p.start == TANDEM_ERR_INVALID_ARG && p.stop == TANDEM_ERR_INVALID_ARG &&
                   p.step == TANDEM_ERR_INVALID_ARG && p.gen == TANDEM_ERR_INVALID_ARG,
           "from a callback (%s): start %d, stop %d, step %d, generate %d", threaded ? "thread" : "caller", p.start,
           p.stop, p.step, p.gen);
    }
    if (e) {
        OK(&f, tandem_engine_stop(e) == TANDEM_OK, "stop");
        check_no_leak(&f, e);
    }
    tandem_engine_close(e);
    tandem_model_close(t);
    return verdict(&f, why, cap);
}

const cc_case cc_cases[] = {
    {"stop_and_start_while_callers_wait_in_generate", stop_start_under_callers},
    {"speculating_pair_stopped_under_callers", speculating_pair_stopped_under_callers},
    {"many_callers_on_an_engine_never_started", many_callers_never_started},
    {"submits_cancels_start_stop_and_steps_from_many_threads", submits_cancels_start_stop_steps},
    {"callbacks_cannot_start_stop_step_or_block", callbacks_cannot_start_stop_step_or_block},
    {NULL, NULL},
};
