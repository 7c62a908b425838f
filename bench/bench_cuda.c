/* bench_cuda.c - the CUDA backend's kernels at real model sizes, on random data:
 *   matmul: for each weight type (f16, q8_0, q4_0, q4_k, q6_k, ... in the layout the
 *     backend loads them in) and Llama-2-7B's matrix shapes, the row kernels and cuBLAS at each
 *     row count, so the crossover between the two is measured; time per call, the
 *     weight bytes read per second and the arithmetic rate; for q4_k / q5_k / q6_k up
 *     to 16 rows also their dequantising reference kernel (force_matmul 3: the row
 *     kernel before the int8 ones), timed alternately with the int8 kernel;
 *   attention: 32 heads of 128 (and 32 / 8 grouped) over contexts of 128 .. 4096
 *     keys, for 1, 4, 13 rows (decode, verification) and a 512-row prefill;
 *   batched decode attention: 64 sequences of 256 / 1024 / 4096 keys, 1 or 5 rows
 *     each (decode, verification), 32 heads of 128 (32 / 8 grouped), blocks of 16
 *     shuffled over the cache; time per call and the K / V bytes the rows must
 *     read per second (--tiled: the tiled kernel instead, TDM_CUDA_ATTN_TILED).
 * Times are medians over repetitions of batches of calls between two
 * synchronisations (host clock), after warm-up.
 *
 * usage: bench_cuda [--types f16,q8_0,q4_0] [--ns 1,2,4,8,16,32,64,128,512] [-r R]
 *                   [--attention-only] [--decode-only] [--matmul-only] [--tiled]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, const tdm_err *err) {
    fprintf(stderr, "bench_cuda: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static void *dev_random(tdm_backend *be, size_t bytes, uint64_t seed, bool floats) {
    uint8_t *h = malloc(bytes);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < bytes; i += 4) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        uint32_t v = (uint32_t)s;
        if (floats) {
            float f = ((float)(v >> 8) / 16777216.0f - 0.5f) * 0.1f;
            memcpy(&v, &f, 4);
        } else if (i % 2 == 0) {
            v &= 0x3bff3bffu; /* (f16 pairs / quant bytes: finite scales) */
        }
        memcpy(h + i, &v, bytes - i < 4 ? bytes - i : 4);
    }
    void *d = NULL;
    tdm_err err = {0};
    if (be->ops->alloc(be, bytes, &d, &err)) die("alloc", &err);
    if (be->ops->upload(be, d, h, bytes, &err)) die("upload", &err);
    free(h);
    return d;
}

/* Median seconds per call of fn over r repetitions of `calls` calls. */
typedef tandem_status (*call_fn)(void *ctx, tdm_err *err);
static double time_calls(tdm_backend *be, call_fn fn, void *ctx, int calls, int r) {
    tdm_err err = {0};
    double *t = malloc((size_t)r * sizeof *t);
    for (int i = -2; i < r; i++) {
        double t0 = tdm_now();
        for (int k = 0; k < calls; k++)
            if (fn(ctx, &err)) die("call", &err);
        if (be->ops->sync(be, &err)) die("sync", &err);
        if (i >= 0) t[i] = (tdm_now() - t0) / calls;
    }
    qsort(t, (size_t)r, sizeof *t, cmp_double);
    double m = t[r / 2];
    free(t);
    return m;
}

typedef struct mm_ctx {
    tdm_backend *be;
    tdm_weight w;
    const float *x;
    float *y;
    int32_t n;
} mm_ctx;
static tandem_status mm_call(void *p, tdm_err *err) {
    mm_ctx *c = p;
    return c->be->ops->matmul(c->be, &c->w, c->x, c->n, c->y, false, err);
}

typedef struct at_ctx {
    tdm_backend *be;
    tdm_attn_args a;
} at_ctx;
static tandem_status at_call(void *p, tdm_err *err) {
    at_ctx *c = p;
    return c->be->ops->attention(c->be, &c->a, err);
}

/* Attention of 64 sequences of ctx keys each, `rows` last rows of each attending
 * (causal): time per call, and the K / V bytes of the visible keys over it. */
static void bench_batched_decode(tdm_backend *be, int reps) {
    enum { N_SEQ = 64 };
    printf("\n| seqs | heads | ctx | rows/seq | us | K/V GB/s |\n|---|---|---|---|---|---|\n");
    const int heads[][2] = {{32, 32}, {32, 8}};
    const int ctxs[] = {256, 1024, 4096}, rows_set[] = {1, 5};
    tdm_err err = {0};
    for (size_t h = 0; h < 2; h++)
        for (size_t ci = 0; ci < sizeof ctxs / sizeof ctxs[0]; ci++) {
            const int ctx = ctxs[ci], hd = 128, nkv = heads[h][1], nh = heads[h][0], bs = 16;
            const int nb1 = (ctx + bs - 1) / bs, nb = N_SEQ * nb1;
            const size_t cbytes = (size_t)nb * nkv * bs * hd * 2;
            void *kc = dev_random(be, cbytes, 17, false), *vc = dev_random(be, cbytes, 18, false);
            tdm_kv_seq seqs[N_SEQ];
            const tdm_kv_seq *sp[N_SEQ];
            for (int s = 0; s < N_SEQ; s++) {
                seqs[s] = (tdm_kv_seq){calloc((size_t)nb1, 4), nb1, nb1, ctx};
                for (int i = 0; i < nb1; i++) /* (block ids spread over the cache: a permutation of 0 .. nb - 1) */
                    seqs[s].blocks[i] = (int32_t)(((int64_t)(s * nb1 + i) * 7919) % nb);
                sp[s] = &seqs[s];
            }
            for (size_t ri = 0; ri < sizeof rows_set / sizeof rows_set[0]; ri++) {
                const int rows = rows_set[ri], n = N_SEQ * rows;
                tdm_batch bt;
                if (tdm_batch_init(&bt, n, &err)) die("batch", &err);
                for (int s = 0; s < N_SEQ; s++)
                    for (int r = 0; r < rows; r++) tdm_batch_add(&bt, 0, ctx - rows + r, s, ctx - rows + r, false);
                const int q_stride = (nh + 2 * nkv) * hd;
                float *q = dev_random(be, (size_t)n * q_stride * 4, 19, true);
                float *o = dev_random(be, (size_t)n * nh * hd * 4, 20, true);
                at_ctx c = {be, {&bt, sp, q, q_stride, o, kc, vc, TDM_F16, nh, nkv, hd, bs, 1.0f / sqrtf((float)hd), 0, 0}};
                const double t = time_calls(be, at_call, &c, 20, reps);
                const double kv = 2.0 * N_SEQ * (double)ctx * nkv * hd * 2; /* K and V of every visible key */
                printf("| %d | %d/%d | %d | %d | %.1f | %.0f |\n", N_SEQ, nh, nkv, ctx, rows, t * 1e6, kv / t / 1e9);
                fflush(stdout);
                be->ops->free(be, q);
                be->ops->free(be, o);
                tdm_batch_free(&bt);
            }
            for (int s = 0; s < N_SEQ; s++) free(seqs[s].blocks);
            be->ops->free(be, kc);
            be->ops->free(be, vc);
        }
}

/* A weight type by name (f16, q8_0, q4_k, ...); q4_0 when unknown. */
static uint32_t type_of(const char *s) {
    for (uint32_t t = 0; t < 31; t++)
        if (tdm_dtype_supported(t) && !strcmp(s, tdm_dtype_name(t))) return t;
    return TDM_Q4_0;
}

int main(int argc, char **argv) {
    const char *types_arg = "f16,q8_0,q4_0", *ns_arg = "1,2,4,8,16,32,64,128,512";
    int reps = 15;
    bool attention_only = false, decode_only = false, matmul_only = false, tiled = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--attention-only")) attention_only = true;
        else if (!strcmp(argv[i], "--decode-only")) attention_only = decode_only = true;
        else if (!strcmp(argv[i], "--matmul-only")) matmul_only = true;
        else if (!strcmp(argv[i], "--tiled")) tiled = true;
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) types_arg = argv[++i];
        else if (!strcmp(argv[i], "--ns") && i + 1 < argc) ns_arg = argv[++i];
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--types f16,q8_0,q4_0] [--ns 1,2,4,...] [-r R] [--attention-only] "
                            "[--decode-only] [--matmul-only] [--tiled]\n", argv[0]);
            return 2;
        }
    }
    int ns[32], n_ns = 0, n_max = 1;
    for (char *s = (char *)ns_arg; *s && n_ns < 32;) {
        ns[n_ns] = (int)strtol(s, &s, 10);
        if (ns[n_ns] < 1 || ns[n_ns] > 4096) die("--ns values in 1..4096", NULL);
        n_max = ns[n_ns] > n_max ? ns[n_ns] : n_max;
        n_ns++;
        if (*s == ',') s++;
    }
    tdm_err err = {0};
    tdm_backend *be = NULL;
    if (tdm_backend_cuda_create(0, &be, &err)) die("backend", &err);
    if (tiled) tdm_backend_cuda_force_attention(be, TDM_CUDA_ATTN_TILED);
    /* Llama-2-7B's matrices: qkv, o, gate+up, down, head */
    const int64_t shapes[][2] = {{12288, 4096}, {4096, 4096}, {22016, 4096}, {4096, 11008}, {32000, 4096}};
    float *x = dev_random(be, (size_t)n_max * 11008 * 4, 1, true);
    float *y = dev_random(be, (size_t)n_max * 32000 * 4, 2, true);
    printf("| type | shape | rows | row kernels us | GB/s | cuBLAS us | GB/s | TFLOP/s (faster) | f32 reference us | GB/s |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (char *ts = (char *)types_arg; *ts && !attention_only;) {
        char name[16];
        size_t len = strcspn(ts, ",");
        snprintf(name, sizeof name, "%.*s", (int)len, ts);
        ts += len + (ts[len] == ',');
        const uint32_t type = type_of(name);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            mm_ctx c = {be, {0}, x, y, 1};
            c.w.type = type;
            c.w.rows = shapes[s][0];
            c.w.cols = shapes[s][1];
            uint64_t rb = 0;
            tdm_dtype_row_bytes(type, (uint64_t)c.w.cols, &rb);
            c.w.row_bytes = (size_t)rb;
            c.w.layout = be->ops->weight_layout(be, type, c.w.rows, c.w.cols);
            const size_t wbytes = (size_t)c.w.rows * c.w.row_bytes;
            c.w.data = dev_random(be, wbytes, 3 + s, false);
            for (int k = 0; k < n_ns; k++) {
                c.n = ns[k];
                double t_rows = -1, t_blas = -1, t_ref = -1;
                const bool kq = (type == TDM_Q4_K || type == TDM_Q5_K || type == TDM_Q6_K) && c.n <= 16;
                if (kq) { /* int8 kernel and reference alternated (A B A B), medians of each */
                    double a[4], r[4];
                    for (int k2 = 0; k2 < 4; k2++) {
                        tdm_backend_cuda_force_matmul(be, 1);
                        a[k2] = time_calls(be, mm_call, &c, 20, reps);
                        tdm_backend_cuda_force_matmul(be, 3);
                        r[k2] = time_calls(be, mm_call, &c, 20, reps);
                    }
                    qsort(a, 4, sizeof a[0], cmp_double);
                    qsort(r, 4, sizeof r[0], cmp_double);
                    t_rows = (a[1] + a[2]) / 2, t_ref = (r[1] + r[2]) / 2;
                } else if (c.n <= 64) {
                    tdm_backend_cuda_force_matmul(be, 1);
                    t_rows = time_calls(be, mm_call, &c, 20, reps);
                }
                tdm_backend_cuda_force_matmul(be, 2);
                t_blas = time_calls(be, mm_call, &c, 20, reps);
                tdm_backend_cuda_force_matmul(be, 0);
                const double best = t_rows > 0 && t_rows < t_blas ? t_rows : t_blas;
                const double flop = 2.0 * (double)c.w.rows * (double)c.w.cols * c.n;
                char ref[48] = "-";
                if (t_ref > 0) snprintf(ref, sizeof ref, "%.1f | %.0f", t_ref * 1e6, wbytes / t_ref / 1e9);
                else snprintf(ref, sizeof ref, "- | -");
                printf("| %s | [%lld][%lld] | %d | %s%.1f | %.0f | %.1f | %.0f | %.1f | %s |\n", name, (long long)c.w.rows,
                       (long long)c.w.cols, c.n, t_rows > 0 ? "" : "(n/a) ", t_rows > 0 ? t_rows * 1e6 : 0.0,
                       t_rows > 0 ? wbytes / t_rows / 1e9 : 0.0, t_blas * 1e6, wbytes / t_blas / 1e9,
                       flop / best / 1e12, ref);
                fflush(stdout);
            }
            be->ops->free(be, (void *)c.w.data);
        }
    }
    be->ops->free(be, x);
    be->ops->free(be, y);
    if (matmul_only) {
        tdm_backend_destroy(be);
        return 0;
    }

    /* attention over one sequence of ctx positions (f16 cache, blocks of 16) */
    printf("\n| heads | ctx | rows | us | K/V GB/s |\n|---|---|---|---|---|\n");
    const int heads[][2] = {{32, 32}, {32, 8}};
    const int ctxs[] = {128, 512, 2048, 4096};
    const int rows_set[] = {1, 4, 13, 512};
    for (size_t h = 0; h < 2 && !decode_only; h++)
        for (size_t ci = 0; ci < sizeof ctxs / sizeof ctxs[0]; ci++) {
            const int ctx = ctxs[ci], hd = 128, nkv = heads[h][1], nh = heads[h][0], bs = 16;
            const int nb = (ctx + bs - 1) / bs;
            const size_t cbytes = (size_t)nb * nkv * bs * hd * 2;
            void *kc = dev_random(be, cbytes, 7, false), *vc = dev_random(be, cbytes, 8, false);
            tdm_kv_seq seq = {calloc((size_t)nb, 4), nb, nb, ctx};
            for (int i = 0; i < nb; i++) seq.blocks[i] = (i * 7) % nb; /* (a permutation when 7 and nb are coprime) */
            if (nb % 7 == 0)
                for (int i = 0; i < nb; i++) seq.blocks[i] = i;
            const tdm_kv_seq *sp[1] = {&seq};
            for (size_t ri = 0; ri < sizeof rows_set / sizeof rows_set[0]; ri++) {
                const int rows = rows_set[ri] < ctx ? rows_set[ri] : ctx;
                tdm_batch bt;
                if (tdm_batch_init(&bt, rows, &err)) die("batch", &err);
                for (int r = 0; r < rows; r++) tdm_batch_add(&bt, 0, ctx - rows + r, 0, ctx - rows + r, false);
                const int q_stride = (nh + 2 * nkv) * hd;
                float *q = dev_random(be, (size_t)rows * q_stride * 4, 9, true);
                float *o = dev_random(be, (size_t)rows * nh * hd * 4, 10, true);
                at_ctx c = {be, {&bt, sp, q, q_stride, o, kc, vc, TDM_F16, nh, nkv, hd, bs, 1.0f / sqrtf((float)hd), 0, 0}};
                const double t = time_calls(be, at_call, &c, 20, reps);
                printf("| %d/%d | %d | %d | %.1f | %.0f |\n", nh, nkv, ctx, rows, t * 1e6, 2.0 * cbytes / t / 1e9);
                fflush(stdout);
                be->ops->free(be, q);
                be->ops->free(be, o);
                tdm_batch_free(&bt);
            }
            free(seq.blocks);
            be->ops->free(be, kc);
            be->ops->free(be, vc);
        }
    bench_batched_decode(be, reps);
    tdm_backend_destroy(be);
    return 0;
}
