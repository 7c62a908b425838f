/* bench_mem.c - read bandwidth of this machine by working-set size.
 *
 * T threads each sum their own contiguous part of one buffer, again and again; the
 * median time of a whole pass gives GB/s.  A buffer that fits the last-level cache
 * is read from it on every pass after the first; a larger one comes from DRAM.  A
 * decode step of the target model streams its weights once (31.5 MB of f16), so
 * whether they stay in the cache between steps decides its speed: this program
 * shows where that boundary is and how far apart the two rates are.
 *
 * usage: bench_mem [-t threads] [-s MB,MB,...] [-r passes]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

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

int main(int argc, char **argv) {
    int nth = 2, passes = 0;
    double sizes[32] = {4, 8, 16, 24, 28, 30, 32, 34, 36, 40, 48, 64, 128};
    int n_sizes = 13;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) {
            nth = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            passes = atoi(argv[++i]);
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
            fprintf(stderr, "usage: %s [-t threads] [-s MB,MB,...] [-r passes]\n", argv[0]);
            return 2;
        }
    }
    if (nth < 1 || nth > 256 || n_sizes == 0 || passes < 0) {
        fprintf(stderr, "bench_mem: bad arguments\n");
        return 2;
    }
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
        double chk = 0;
        for (int i = 0; i < nth; i++) {
            pthread_join(th[i], NULL);
            chk += jobs[i].sum;
        }
        pthread_barrier_destroy(&bar);
        qsort(t + 2, (size_t)np - 2, sizeof(double), cmp_double);
        double med = t[2 + (np - 2) / 2], best = t[2];
        printf("%8.1f MB: %6.1f GB/s median, %6.1f GB/s best (%d passes%s)\n", sizes[si], bytes / med * 1e-9,
               bytes / best * 1e-9, np, chk == 0 ? ", empty" : "");
        free(th);
        free(jobs);
        free(t);
        tdm_free_aligned(buf);
    }
    return 0;
}
