/* bench_util.h - small helpers of the benchmark programs (bench_eagle3.c,
 * bench_head_tree.c, bench_host.c): the median of timings, and an exit naming what
 * failed. */
#ifndef TDM_BENCH_UTIL_H
#define TDM_BENCH_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of t[0..n) (sorts t; an even n: the mean of the middle two; none: NaN). */
static inline double bench_median(double *t, int n) {
    if (n <= 0) return NAN;
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* "PROG: WHAT: the error's message" on stderr, then exit(1). */
static inline void bench_die(const char *prog, const char *what, const tdm_err *err) {
    fprintf(stderr, "%s: %s: %s\n", prog, what, err ? err->msg : "");
    exit(1);
}

#endif
