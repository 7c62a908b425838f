/* threadpool.c - fork-join pool: spin on a generation counter, then sleep. */
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TDM_CPU_RELAX() _mm_pause()
#else
#define TDM_CPU_RELAX() ((void)0)
#endif

typedef struct tdm_worker {
    tdm_threadpool *tp;
    int ith;
    uint64_t team_tag; /* the last team job this worker ran its part of */
    pthread_t thread;
} tdm_worker;

/* A team member's barrier count, alone in its cache line. */
typedef struct tdm_team_slot {
    _Alignas(64) atomic_uint epoch;
} tdm_team_slot;

/* The job word: [63:52] max threads, [51:26] chunk count, [25:0] next chunk.  A
 * team job has chunk count 0 and its tag (a job number, never 0) as next chunk. */
#define W_NEXT_BITS 26
#define W_MASK (((uint64_t)1 << W_NEXT_BITS) - 1)
static inline uint64_t w_pack(uint64_t maxth, uint64_t n, uint64_t next) {
    return (maxth << (2 * W_NEXT_BITS)) | (n << W_NEXT_BITS) | next;
}

struct tdm_threadpool {
    int n_threads;          /* including the caller */
    tdm_worker *workers;    /* [n_threads - 1], ith = 1.. */
    int n_started;

    atomic_bool stop;

    /* The current job, in one cache line: a waiting worker that sees gen change
     * gets the job word, fn and ctx with the same line transfer (in separate lines
     * they cost a worker about 0.3 us more per job).  fn and ctx are written by the
     * caller before the job word is published and read by a thread only after it
     * has claimed a chunk. */
    _Alignas(64) atomic_uint gen;         /* bumped once per job (wakes workers) */
    _Atomic uint64_t word;                /* see w_pack */
    tdm_task_fn fn;
    void *ctx;
    _Alignas(64) atomic_llong n_done;     /* chunks finished */
    _Alignas(64) atomic_int n_sleeping;

    pthread_mutex_t mu;
    pthread_cond_t cv;
    double spin_s;          /* how long idle workers spin before sleeping */

    int team_n;             /* members of the current team job */
    uint64_t team_tag;      /* tag of the last team job */
    tdm_team_slot *slots;   /* [n_threads] barrier counts of team members */
};

static double tp_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits until gen differs from seen; returns the new value. */
static unsigned tp_wait_job(tdm_threadpool *tp, unsigned seen) {
    unsigned g = atomic_load_explicit(&tp->gen, memory_order_acquire);
    if (g != seen) return g;
    double deadline = tp_now() + tp->spin_s;
    for (unsigned it = 1;; it++) {
        TDM_CPU_RELAX();
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (g != seen) return g;
        if ((it & 255) == 0 && tp_now() > deadline) break;
    }
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add(&tp->n_sleeping, 1); /* seq_cst: pairs with the caller's gen bump */
    while ((g = atomic_load(&tp->gen)) == seen) pthread_cond_wait(&tp->cv, &tp->mu);
    atomic_fetch_sub(&tp->n_sleeping, 1);
    pthread_mutex_unlock(&tp->mu);
    return g;
}

/* Claims the next chunk of the current job for thread ith; -1 when none is left. */
static int64_t tp_claim(tdm_threadpool *tp, int ith) {
    uint64_t v = atomic_load_explicit(&tp->word, memory_order_acquire);
    for (;;) {
        uint64_t maxth = v >> (2 * W_NEXT_BITS), n = (v >> W_NEXT_BITS) & W_MASK, next = v & W_MASK;
        if (next >= n || (uint64_t)ith >= maxth) return -1;
        if (atomic_compare_exchange_weak_explicit(&tp->word, &v, v + 1, memory_order_acq_rel,
                                                  memory_order_acquire))
            return (int64_t)next;
    }
}

/* Runs chunks of the current (chunked) job until none is left. */
static void tp_chunks(tdm_threadpool *tp, int ith) {
    for (int64_t c; (c = tp_claim(tp, ith)) >= 0;) {
        tp->fn(tp->ctx, c, ith);
        atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
    }
}

/* A worker's part of the current job. */
static void tp_work(tdm_threadpool *tp, tdm_worker *w) {
    const int ith = w->ith;
    uint64_t v = atomic_load_explicit(&tp->word, memory_order_acquire);
    if (((v >> W_NEXT_BITS) & W_MASK) == 0) { /* a team job: run its part once */
        uint64_t tag = v & W_MASK;
        if ((uint64_t)ith >= v >> (2 * W_NEXT_BITS) || tag == w->team_tag) return;
        w->team_tag = tag;
        tp->fn(tp->ctx, ith, ith);
        atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
        return;
    }
    tp_chunks(tp, ith);
}

static void *tp_worker_main(void *arg) {
    tdm_worker *w = arg;
    tdm_threadpool *tp = w->tp;
    unsigned seen = 0;
    for (;;) {
        seen = tp_wait_job(tp, seen);
        if (atomic_load(&tp->stop)) break;
        tp_work(tp, w);
    }
    return NULL;
}

static void tp_bump(tdm_threadpool *tp) {
    atomic_fetch_add(&tp->gen, 1); /* seq_cst: pairs with the workers' n_sleeping++ */
    if (atomic_load(&tp->n_sleeping) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
}

static void tp_stop_workers(tdm_threadpool *tp) {
    if (tp->n_started == 0) return;
    atomic_store(&tp->stop, true);
    tp_bump(tp);
    for (int i = 0; i < tp->n_started; i++) pthread_join(tp->workers[i].thread, NULL);
    tp->n_started = 0;
}

tandem_status tdm_threadpool_create(int n_threads, int spin_us, tdm_threadpool **out, tdm_err *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > TDM_THREADPOOL_MAX_THREADS)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "thread pool: bad thread count %d", n_threads);
    if (spin_us < 0 || spin_us > 1000000)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "thread pool: spin time %d us out of range [0, 1e6]", spin_us);
    tdm_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return tdm_seterr(err, TANDEM_ERR_NOMEM, "thread pool: out of memory");
    tp->n_threads = n_threads;
    atomic_init(&tp->gen, 0);
    atomic_init(&tp->word, 0);
    atomic_init(&tp->stop, false);
    atomic_init(&tp->n_done, 0);
    atomic_init(&tp->n_sleeping, 0);
    tp->spin_s = spin_us * 1e-6;
    if (pthread_mutex_init(&tp->mu, NULL) != 0) {
        free(tp);
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "thread pool: mutex init failed");
    }
    if (pthread_cond_init(&tp->cv, NULL) != 0) {
        pthread_mutex_destroy(&tp->mu);
        free(tp);
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "thread pool: condvar init failed");
    }
    tp->slots = tdm_alloc_aligned((size_t)n_threads * sizeof *tp->slots, 64);
    if (!tp->slots) {
        tdm_threadpool_destroy(tp);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "thread pool: out of memory");
    }
    for (int i = 0; i < n_threads; i++) atomic_init(&tp->slots[i].epoch, 0);
    if (n_threads > 1) {
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        if (!tp->workers) {
            tdm_threadpool_destroy(tp);
            return tdm_seterr(err, TANDEM_ERR_NOMEM, "thread pool: out of memory");
        }
        for (int i = 0; i < n_threads - 1; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].ith = i + 1;
            if (pthread_create(&tp->workers[i].thread, NULL, tp_worker_main, &tp->workers[i]) != 0) {
                tdm_threadpool_destroy(tp);
                return tdm_seterr(err, TANDEM_ERR_BACKEND, "thread pool: cannot start thread %d of %d",
                                  i + 1, n_threads);
            }
            tp->n_started++;
        }
    }
    *out = tp;
    return TANDEM_OK;
}

void tdm_threadpool_destroy(tdm_threadpool *tp) {
    if (!tp) return;
    tp_stop_workers(tp);
    pthread_cond_destroy(&tp->cv);
    pthread_mutex_destroy(&tp->mu);
    free(tp->workers);
    tdm_free_aligned(tp->slots);
    free(tp);
}

int tdm_threadpool_size(const tdm_threadpool *tp) { return tp ? tp->n_threads : 1; }

/* Waits until n chunks (or team parts) of the current job have finished. */
static void tp_wait_done(tdm_threadpool *tp, int64_t n) {
    for (unsigned it = 1; atomic_load_explicit(&tp->n_done, memory_order_acquire) < n; it++) {
        TDM_CPU_RELAX();
        if ((it & 1023) == 0) sched_yield(); /* a worker may have been descheduled */
    }
}

void tdm_threadpool_run(tdm_threadpool *tp, int64_t n_chunks, int max_threads, tdm_task_fn fn,
                        void *ctx) {
    if (n_chunks <= 0) return;
    if (max_threads > tp->n_threads) max_threads = tp->n_threads;
    if (max_threads <= 1 || n_chunks == 1 || tp->n_started == 0 ||
        n_chunks > TDM_THREADPOOL_MAX_CHUNKS) { /* (too many chunks for the job word: inline) */
        for (int64_t c = 0; c < n_chunks; c++) fn(ctx, c, 0);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->word, w_pack((uint64_t)max_threads, (uint64_t)n_chunks, 0),
                          memory_order_release);
    tp_bump(tp);
    tp_chunks(tp, 0);
    tp_wait_done(tp, n_chunks);
}

bool tdm_threadpool_team(tdm_threadpool *tp, int n, tdm_task_fn fn, void *ctx) {
    if (n < 1 || n > tp->n_threads || (n > 1 && tp->n_started != tp->n_threads - 1)) return false;
    if (n == 1) {
        tp->team_n = 1;
        fn(ctx, 0, 0);
        return true;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->team_n = n;
    for (int i = 0; i < n; i++) atomic_store_explicit(&tp->slots[i].epoch, 0, memory_order_relaxed);
    tp->team_tag = tp->team_tag % W_MASK + 1; /* 1 .. W_MASK, never 0 */
    atomic_store_explicit(&tp->n_done, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->word, w_pack((uint64_t)n, 0, tp->team_tag), memory_order_release);
    tp_bump(tp);
    fn(ctx, 0, 0);
    atomic_fetch_add_explicit(&tp->n_done, 1, memory_order_release);
    tp_wait_done(tp, n);
    return true;
}

void tdm_team_sync(tdm_threadpool *tp, int ith) {
    const int n = tp->team_n;
    if (n <= 1) return;
    tdm_team_slot *s = tp->slots;
    unsigned e = atomic_load_explicit(&s[ith].epoch, memory_order_relaxed) + 1;
    atomic_store_explicit(&s[ith].epoch, e, memory_order_release);
    for (int j = 0; j < n; j++) {
        if (j == ith) continue;
        for (unsigned it = 1; (int)(atomic_load_explicit(&s[j].epoch, memory_order_acquire) - e) < 0; it++) {
            TDM_CPU_RELAX();
            if ((it & 1023) == 0) sched_yield(); /* the member may have been descheduled */
        }
    }
}

typedef struct for_ctx {
    void (*fn)(void *user, int32_t i);
    void *user;
} for_ctx;

static void for_task(void *ctx, int64_t chunk, int ith) {
    (void)ith;
    const for_ctx *f = ctx;
    f->fn(f->user, (int32_t)chunk);
}

void tdm_threadpool_for(tdm_threadpool *tp, int32_t n, void (*fn)(void *user, int32_t i), void *user) {
    for_ctx f = {fn, user};
    tdm_threadpool_run(tp, n, tdm_threadpool_size(tp), for_task, &f);
}
