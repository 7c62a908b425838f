/* bench_mem.c - read bandwidth of this machine by working-set size.
 *
 * T threads each sum their own contiguous part of one buffer, again and again; the
 * median time of a whole pass gives GB/s.  A buffer that fits the last-level cache
 * is read from it on every pass after the first; a larger one comes from DRAM.  A
 * decode step of the target model streams its weights once (31.5 MB of f16), so
 * whether they stay in the cache between steps decides its speed: this program
 * shows where that boundary is and how far apart the two rates are.
 *
 * --fma adds the rate of a register-only AVX-512 FMA loop on one thread and on all
 * threads at once: on a host whose other tenants use the SMT siblings of these cores
 * the second figure falls below twice the first, and compute-bound work (a
 * speculative verification) slows with it.
 *
 * --c2c adds the round trip of a cache line between two threads (one writes, the
 * other answers, 100,000 times, median of 9 batches): when the host places our two
 * vCPUs on cores that share a last-level cache it is short; when they sit on
 * different core complexes it is several times longer, and every op whose input
 * the other thread wrote (the row ops between matmuls) pays for it.
 *
 * usage: bench_mem [-t threads] [-s MB,MB,...] [-r passes] [--fma] [--c2c]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_FMA_PROBE 1

typedef struct fma_job {
    pthread_barrier_t *bar;
    double gflops;
    float sink;
} fma_job;

/* 12 independent chains of zmm FMAs (enough to fill two FMA pipes of latency 4-6). */
__attribute__((target("avx512f"))) static void *fma_worker(void *arg) {
    fma_job *j = arg;
    __m512 a[12], x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
    for (int i = 0; i < 12; i++) a[i] = _mm512_setzero_ps();
    if (j->bar) pthread_barrier_wait(j->bar);
    const long iters = 4000000;
    double t0 = tdm_now();
    for (long it = 0; it < iters; it++) {
        for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
        __asm__ volatile("" : "+v"(x)); /* keeps the loop */
    }
    double dt = tdm_now() - t0;
    __m512 s = a[0];
    for (int i = 1; i < 12; i++) s = _mm512_add_ps(s, a[i]);
    j->sink = _mm512_reduce_add_ps(s);
    j->gflops = (double)iters * 12 * 32 / dt * 1e-9;
    return NULL;
}

static void fma_probe(int nth) {
    if (!__builtin_cpu_supports("avx512f")) {
        printf("fma: no AVX-512 on this machine\n");
        return;
    }
    fma_job one = {NULL, 0, 0};
    fma_worker(&one);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)nth);
    fma_job jobs[256];
    pthread_t th[256];
    for (int i = 1; i < nth; i++) {
        jobs[i] = (fma_job){&bar, 0, 0};
        pthread_create(&th[i], NULL, fma_worker, &jobs[i]);
    }
    jobs[0] = (fma_job){&bar, 0, 0};
    fma_worker(&jobs[0]);
    double tot = jobs[0].gflops;
    for (int i = 1; i < nth; i++) {
        pthread_join(th[i], NULL);
        tot += jobs[i].gflops;
    }
    pthread_barrier_destroy(&bar);
    printf("fma zmm: 1 thread %.0f GFLOP/s, %d threads %.0f GFLOP/s (%.2fx)\n", one.gflops, nth, tot,
           tot / one.gflops);
}
#endif

typedef struct mem_job {
    const float *p;
    size_t n;          /* floats */
    int passes;
    pthread_barrier_t *bar;
    double sum;
} mem_job;

/* Sums n floats with 64 independent accumulators (vectorised by the compiler:
 * enough independent chains that the loads, not the adds, set the pace). */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static double sum_range(const float *p, size_t n) {
    float acc[64] = {0};
    for (size_t i = 0; i + 64 <= n; i += 64) {
        __builtin_prefetch(p + i + 1024, 0, 3);
        for (int j = 0; j < 64; j++) acc[j] += p[i + j];
    }
    double s = 0;
    for (int j = 0; j < 64; j++) s += acc[j];
    return s;
}

static volatile double g_sink; /* the sums, so that no pass can be optimised away */

static void *mem_worker(void *arg) {
    mem_job *j = arg;
    for (int r = 0; r < j->passes; r++) {
        pthread_barrier_wait(j->bar);
        j->sum += sum_range(j->p, j->n);
        pthread_barrier_wait(j->bar);
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

enum { C2C_TRIPS = 100000, C2C_BATCHES = 9 };
static _Alignas(64) atomic_int c2c_flag;

/* The answering side: waits for each odd value and writes the next even one. */
static void *c2c_other(void *arg) {
    (void)arg;
    for (int b = 0; b < C2C_BATCHES; b++)
        for (int i = 0; i < C2C_TRIPS; i++) {
            int want = 2 * (b * C2C_TRIPS + i) + 1;
            while (atomic_load_explicit(&c2c_flag, memory_order_acquire) != want) {
            }
            atomic_store_explicit(&c2c_flag, want + 1, memory_order_release);
        }
    return NULL;
}

static void c2c_probe(void) {
    pthread_t th;
    atomic_store(&c2c_flag, 0);
    if (pthread_create(&th, NULL, c2c_other, NULL) != 0) {
        printf("c2c: cannot start a thread\n");
        return;
    }
    double t[C2C_BATCHES];
    for (int b = 0; b < C2C_BATCHES; b++) {
        double t0 = tdm_now();
        for (int i = 0; i < C2C_TRIPS; i++) {
            int v = 2 * (b * C2C_TRIPS + i) + 1;
            atomic_store_explicit(&c2c_flag, v, memory_order_release);
            while (atomic_load_explicit(&c2c_flag, memory_order_acquire) != v + 1) {
            }
        }
        t[b] = (tdm_now() - t0) / C2C_TRIPS;
    }
    pthread_join(th, NULL);
    qsort(t, C2C_BATCHES, sizeof t[0], cmp_double);
    printf("c2c: round trip of a cache line between two threads %.0f ns (median of %d batches)\n",
           t[C2C_BATCHES / 2] * 1e9, C2C_BATCHES);
}

int main(int argc, char **argv) {
    int nth = 2, passes = 0;
    bool fma = false, c2c = false;
    double sizes[32] = {4, 8, 16, 24, 28, 30, 32, 34, 36, 40, 48, 64, 128};
    int n_sizes = 13;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            nth = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            passes = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--fma")) {
            fma = true;
        } else if (!strcmp(argv[i], "--c2c")) {
            c2c = true;
        } else if (!strcmp(argv[i], "-s") && i + 1 < argc) {
            n_sizes = 0;
            for (char *q = argv[++i]; *q && n_sizes < 32;) {
                char *end;
                double v = strtod(q, &end);
                if (end == q || v <= 0 || v > 65536) break;
                sizes[n_sizes++] = v;
                q = *end == ',' ? end + 1 : end;
            }
        } else {
            fprintf(stderr, "usage: %s [-t threads] [-s MB,MB,...] [-r passes] [--fma] [--c2c]\n", argv[0]);
            return 2;
        }
    }
    if (nth < 1 || nth > 256 || n_sizes == 0 || passes < 0) {
        fprintf(stderr, "bench_mem: bad arguments\n");
        return 2;
    }
    if (passes > 0 && passes < 3) {
        fprintf(stderr, "bench_mem: -r needs at least 3 passes (the first two are warm-up)\n");
        return 2;
    }
    if (c2c) c2c_probe();
#ifdef HAVE_FMA_PROBE
    if (fma) fma_probe(nth);
#else
    if (fma) printf("fma: probe not built for this machine\n");
#endif
    printf("read bandwidth, %d threads, median of the passes after two warm-up passes\n", nth);
    for (int si = 0; si < n_sizes; si++) {
        size_t bytes = (size_t)(sizes[si] * 1048576.0) / (256 * (size_t)nth) * (256 * (size_t)nth);
        int np = passes ? passes : (int)(4096 / sizes[si]) + 20;
        if (np > 2000) np = 2000;
        float *buf = tdm_alloc_aligned(bytes + 4096 * sizeof(float), 64);
        double *t = malloc((size_t)np * sizeof *t);
        mem_job *jobs = calloc((size_t)nth, sizeof *jobs);
        pthread_t *th = calloc((size_t)nth, sizeof *th);
        if (!buf || !t || !jobs || !th) {
            fprintf(stderr, "bench_mem: out of memory for %.1f MB\n", sizes[si]);
            return 1;
        }
        for (size_t i = 0; i < bytes / sizeof(float) + 4096; i++) buf[i] = (float)(i & 7);
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, (unsigned)nth + 1);
        size_t per = bytes / sizeof(float) / (size_t)nth;
        for (int i = 0; i < nth; i++) {
            jobs[i] = (mem_job){buf + (size_t)i * per, per, np, &bar, 0};
            pthread_create(&th[i], NULL, mem_worker, &jobs[i]);
        }
        for (int r = 0; r < np; r++) {
            double t0 = tdm_now();
            pthread_barrier_wait(&bar);
            pthread_barrier_wait(&bar);
            t[r] = tdm_now() - t0;
        }
        for (int i = 0; i < nth; i++) {
            pthread_join(th[i], NULL);
            g_sink += jobs[i].sum;
        }
        pthread_barrier_destroy(&bar);
        qsort(t + 2, (size_t)np - 2, sizeof(double), cmp_double);
        double med = t[2 + (np - 2) / 2], best = t[2];
        printf("%8.1f MB: %6.1f GB/s median, %6.1f GB/s best (%d passes)\n", sizes[si], bytes / med * 1e-9,
               bytes / best * 1e-9, np);
        free(th);
        free(jobs);
        free(t);
        tdm_free_aligned(buf);
    }
    return 0;
}
