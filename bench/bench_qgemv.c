/* bench_qgemv.c - the direct integer-dot kernel of a few x rows (qgemv_vnni.c), on
 * one thread, by weight type and x row count.
 *
 * Two shapes per type: a weight that stays in the core's L2 cache ([256][1536]: the
 * kernel's arithmetic alone) and one of the real target's FFN size ([8960][1536]:
 * read from memory, as a decode step reads it).  For n = 1 .. 8 x rows, prints the
 * median time of one call and the nanoseconds per x row and 256 weights (one
 * super-block of a W row), R alternated rounds.  Times are the thread's CPU time, so
 * that other processes on the machine count less (they still share its caches and
 * memory).  Needs AVX-512 VNNI.
 *
 * usage: bench_qgemv [-r R] [-t q4_k,q6_k,q5_0] [-n 1,2,3,4,5,6,7,8]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu_internal.h"
#include "qdot.h"

static uint64_t rng_state = 12345;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static tdm_weight make_weight(uint32_t type, int64_t rows, int64_t cols) {
    uint64_t rb = 0;
    tdm_dtype_row_bytes(type, (uint64_t)cols, &rb);
    tdm_weight w = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb};
    uint8_t *data = tdm_alloc_aligned((size_t)(rb * (uint64_t)rows), 64);
    float *row = malloc((size_t)cols * sizeof(float));
    if (!data || !row) exit(1);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < cols; k++) row[k] = frand();
        tdm_row_from_f32(type, row, data + r * rb, cols);
    }
    free(row);
    w.data = data;
    return w;
}

int main(int argc, char **argv) {
    int rounds = 5;
    const char *types_arg = "q4_k,q6_k,q5_0", *ns_arg = "1,2,3,4,5,6,7,8";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc) types_arg = argv[++i];
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) ns_arg = argv[++i];
        else {
            fprintf(stderr, "usage: bench_qgemv [-r R] [-t q4_k,q6_k,q5_0] [-n 1,2,..,8]\n");
            return 2;
        }
    }
    if (!__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "bench_qgemv: this CPU has no AVX-512 VNNI\n");
        return 1;
    }
    int ns[16], nn = 0;
    for (const char *p = ns_arg; *p && nn < 16;) {
        int v = atoi(p);
        if (v < 1 || v > TDM_QGEMV_MAX) {
            fprintf(stderr, "bench_qgemv: -n values are 1 .. %d\n", TDM_QGEMV_MAX);
            return 2;
        }
        ns[nn++] = v;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    const int64_t cols = 1536, shapes[2] = {256, 8960};
    float *x = malloc((size_t)TDM_QGEMV_MAX * cols * sizeof(float));
    float *y = malloc((size_t)TDM_QGEMV_MAX * 8960 * sizeof(float));
    for (int64_t i = 0; i < TDM_QGEMV_MAX * cols; i++) x[i] = frand();
    char types[64];
    snprintf(types, sizeof types, "%s", types_arg);
    for (char *tok = strtok(types, ","); tok; tok = strtok(NULL, ",")) {
        uint32_t type = !strcmp(tok, "q4_k") ? TDM_Q4_K : !strcmp(tok, "q6_k") ? TDM_Q6_K : !strcmp(tok, "q5_0") ? TDM_Q5_0 : 0;
        if (!type) {
            fprintf(stderr, "bench_qgemv: -t takes q4_k, q6_k, q5_0, not '%s'\n", tok);
            return 2;
        }
        for (int s = 0; s < 2; s++) {
            const int64_t rows = shapes[s];
            tdm_weight w = make_weight(type, rows, cols);
            void *buf = tdm_alloc_aligned(tdm_xq_bytes(type, cols, TDM_QGEMV_MAX), 64);
            /* calls per sample: about 20 ms of work */
            double per_sb[16][64];
            double per_call[16][64];
            for (int r = 0; r < rounds && r < 64; r++)
                for (int k = 0; k < nn; k++) {
                    const int n = ns[k];
                    tdm_xq xq;
                    tdm_xq_quantize(type, x, n, cols, 0, n, buf, &xq);
                    tdm_qgemv_vnni(&w, &xq, n, 0, rows, y, rows, false);
                    const int calls = rows > 1000 ? 8 : 200;
                    double t0 = now();
                    for (int c = 0; c < calls; c++) tdm_qgemv_vnni(&w, &xq, n, 0, rows, y, rows, false);
                    const double dt = (now() - t0) / calls;
                    per_call[k][r] = dt;
                    per_sb[k][r] = dt * 1e9 / ((double)rows * (double)(cols / 256) * n);
                }
            printf("%s [%lld][%lld] (%s):\n", tok, (long long)rows, (long long)cols, s == 0 ? "in L2" : "from memory");
            for (int k = 0; k < nn; k++) {
                const int R = rounds < 64 ? rounds : 64;
                qsort(per_call[k], (size_t)R, sizeof(double), cmp_double);
                qsort(per_sb[k], (size_t)R, sizeof(double), cmp_double);
                printf("  n=%d: %9.1f us per call, %6.2f ns per x row and super-block (median of %d)\n", ns[k],
                       per_call[k][R / 2] * 1e6, per_sb[k][R / 2], R);
            }
            free((void *)w.data);
            free(buf);
        }
    }
    free(x);
    free(y);
    return 0;
}
