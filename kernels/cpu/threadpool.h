/* threadpool.h - a fork-join thread pool with low dispatch overhead.
 *
 * tdm_threadpool_run(pool, n_chunks, max_threads, fn, ctx) calls fn(ctx, chunk, ith)
 * once for every chunk in [0, n_chunks) and returns when all calls have finished.
 * Chunks are claimed dynamically (one atomic word), by the calling thread (ith = 0)
 * and by up to max_threads - 1 workers (ith = 1 ..), so a worker that the OS has
 * descheduled simply does less work: the caller never waits for a thread that has
 * not started a chunk.  Which thread runs a chunk must not change its result
 * (callers make each chunk a self-contained unit of work), so results do not
 * depend on the thread count or on scheduling.
 *
 * Idle workers spin on an atomic generation counter for a short while (spin_us
 * microseconds; the CPU backend's pools TDM_THREADPOOL_SPIN_US) before sleeping on
 * a condition variable, so back-to-back ops dispatch in well under a microsecond.
 *
 * tdm_threadpool_team(pool, n, fn, ctx) is the other kind of job: fn(ctx, ith, ith)
 * runs exactly once on each of the threads ith = 0 .. n - 1 (the caller is 0), all
 * at once, so the calls may wait for each other at tdm_team_sync.  A team member
 * descheduled by the OS delays the others, so teams suit work whose parts must
 * stay on the same thread from step to step (data a thread keeps in its caches).
 *
 * One job at a time: run and team are not reentrant and must be called from one
 * thread.
 */
#ifndef TDM_THREADPOOL_H
#define TDM_THREADPOOL_H

#include "common.h"

typedef struct tdm_threadpool tdm_threadpool;
/* ith: the thread running the chunk, in [0, pool size) (for per-thread scratch). */
typedef void (*tdm_task_fn)(void *ctx, int64_t chunk, int ith);

#define TDM_THREADPOOL_MAX_THREADS 1024
#define TDM_THREADPOOL_MAX_CHUNKS ((int64_t)1 << 26)

/* How long the CPU backend's idle workers spin before they sleep, microseconds. */
#define TDM_THREADPOOL_SPIN_US 200

/* A pool of n_threads threads in all (the caller counts as one: n_threads - 1
 * workers are started).  1 <= n_threads <= TDM_THREADPOOL_MAX_THREADS; spin_us in
 * [0, 1e6] (0: idle workers sleep at once, as the tests' sleep path does). */
tandem_status tdm_threadpool_create(int n_threads, int spin_us, tdm_threadpool **out, tdm_err *err);
void tdm_threadpool_destroy(tdm_threadpool *tp); /* NULL is a no-op */
int tdm_threadpool_size(const tdm_threadpool *tp);
/* Runs fn over n_chunks chunks on at most max_threads threads (clamped to [1, size]);
 * 1 thread, or more than TDM_THREADPOOL_MAX_CHUNKS chunks, runs inline in order. */
void tdm_threadpool_run(tdm_threadpool *tp, int64_t n_chunks, int max_threads, tdm_task_fn fn,
                        void *ctx);
/* fn(user, i) once for every i in [0, n) on all the pool's threads (a chunk each, as
 * tdm_threadpool_run claims them), for tasks that need no thread index. */
void tdm_threadpool_for(tdm_threadpool *tp, int32_t n, void (*fn)(void *user, int32_t i), void *user);
/* Runs fn(ctx, ith, ith) once on each thread ith in [0, n), concurrently; returns
 * when all have returned (n = 1: inline).  Returns false, running nothing, unless
 * 1 <= n <= the pool size. */
bool tdm_threadpool_team(tdm_threadpool *tp, int n, tdm_task_fn fn, void *ctx);
/* Inside a team job: waits until every member of the team has called it as many
 * times as member ith has (a barrier; stores before it are visible after it). */
void tdm_team_sync(tdm_threadpool *tp, int ith);

#endif
