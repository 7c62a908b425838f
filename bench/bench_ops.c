/* bench_ops.c - matmul microbenchmark of the CPU backend.
 *
 * For each SIMD level, weight dtype and shape, times y[n][rows] = x[n][cols] * W^T at
 * decode (n = 1) and prefill (n = 128) shapes and prints the median GFLOP/s and the
 * weight bandwidth in GB/s.  The integer-dot types (q4_1 .. q6_k, whose rows are
 * multiples of 256 for the K-quants) run on a 7B model's shapes.  Then a "target decode" run: every matmul of one decode
 * step of the 15.7M-param target model (8 layers, dim 384, ff 1024, 6/2 heads of 64,
 * vocab 8192 output head), f16 weights, as the forward would issue them.
 *
 * usage: bench_ops [-t threads] [-l scalar|avx2|avx512] [-d dtype[,dtype..]] [-s seconds] [-n 1,4,128]
 *                  [--attention] [--head] [--step rounds] [--kv-attention rounds] [--scatter]
 *   -n: the input row counts of the single-shape runs (default 1,128)
 *   --attention: only the target's attention over 200 slots, for the -n row counts
 *   --head: only the quantised output heads ([8192][384] and [8192][128])
 *   --step R: only the target's 32 layer matmuls (no head), for the -n row counts,
 *             in R interleaved rounds
 *   --kv-attention R: only a decode row's attention of the real 1.5B target's shapes,
 *             f32 / f16 / q8_0 / fp8 caches at contexts 512, 2048, 4096, R alternated rounds
 *   --scatter: only the scatter_cols op of a draft head over part of the vocabulary
 *             (draft_vocab): 32791 logits a row (Qwen2.5's 32768 and specials) placed
 *             into rows of 151936, the rest filled, for the -n row counts
 *   --qgemv R: only the direct integer-dot kernel of a few x rows (qgemv_vnni.c, AVX-512
 *             VNNI) on one thread, Q4_K / Q6_K / Q5_0 (or -d's), for the -n row counts
 *             (1 .. 8): a [256][1536] weight that stays in L2 (the arithmetic alone) and
 *             one of the real target's FFN size, [8960][1536], read from memory; the
 *             median over R alternated rounds of the thread's CPU time (other processes
 *             on a shared machine count less) per call and per x row and 256 weights
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "cpu_internal.h"
#include "qdot.h"
#include "qhead.h"

static uint64_t rng_state = 12345;
static float frand(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static tdm_weight make_weight(uint32_t type, int64_t rows, int64_t cols) {
    uint64_t rb = 0;
    tdm_dtype_row_bytes(type, (uint64_t)cols, &rb);
    tdm_weight w = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb};
    uint8_t *data = tdm_alloc_aligned((size_t)(rb * (uint64_t)rows), 64);
    float *row = malloc((size_t)cols * sizeof(float));
    if (!data || !row) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < cols; k++) row[k] = frand();
        tdm_row_from_f32(type, row, data + r * rb, cols);
    }
    free(row);
    w.data = data;
    return w;
}

/* A copy of w in the layout the backend's matmul prefers (w itself when that is the
 * rows layout); free the copy's data when its layout differs from w's. */
static tdm_weight layout_copy(tdm_backend *b, const tdm_weight *w) {
    uint32_t lay = b->ops->weight_layout ? b->ops->weight_layout(b, w->type, w->rows, w->cols) : TDM_LAYOUT_ROWS;
    if (lay == TDM_LAYOUT_ROWS) return *w;
    tdm_weight p = *w;
    size_t bytes = w->row_bytes * (size_t)w->rows;
    void *d = tdm_alloc_aligned(bytes, 64);
    if (!d || !tdm_weight_pack(lay, w->type, w->rows, w->cols, w->data, d)) {
        fprintf(stderr, "cannot pack a weight\n");
        exit(1);
    }
    p.data = d;
    p.layout = lay;
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median seconds of one call of fn over repeated runs lasting about `secs`. */
typedef void (*bench_fn)(void *ctx);
static double median_time(bench_fn fn, void *ctx, double secs) {
    for (int i = 0; i < 3; i++) fn(ctx); /* warm up: caches, scratch, threads */
    enum { MAX_REPS = 4000 };
    static double t[MAX_REPS];
    int n = 0;
    double start = tdm_now();
    while (n < MAX_REPS && (n < 15 || tdm_now() - start < secs)) {
        double t0 = tdm_now();
        fn(ctx);
        t[n++] = tdm_now() - t0;
    }
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return t[n / 2];
}

typedef struct mm_ctx {
    tdm_backend *b;
    const tdm_weight *w;
    int n_w;
    const float *x;
    int32_t n;
    float *y;
} mm_ctx;

static void run_matmuls(void *p) {
    mm_ctx *c = p;
    for (int i = 0; i < c->n_w; i++) {
        tdm_err err;
        if (c->b->ops->matmul(c->b, &c->w[i], c->x, c->n, c->y, false, &err) != TANDEM_OK) {
            fprintf(stderr, "matmul failed: %s\n", err.msg);
            exit(1);
        }
    }
}

typedef struct attn_ctx {
    tdm_backend *b;
    tdm_attn_args a;
} attn_ctx;

static void run_attention(void *p) {
    attn_ctx *c = p;
    tdm_err err;
    if (c->b->ops->attention(c->b, &c->a, &err) != TANDEM_OK) {
        fprintf(stderr, "attention failed: %s\n", err.msg);
        exit(1);
    }
}

/* Attention of n rows at the end of a ctx-long sequence (6 heads / 2 kv heads of 64,
 * blocks of 16), the target model's shapes. */
static void bench_attention(tdm_backend *b, uint32_t ct, int32_t ctx, int32_t n, double secs) {
    const int32_t bs = 16, nkv = 2, hd = 64, nh = 6, nb = (ctx + bs - 1) / bs;
    size_t esz = ct == TDM_F16 ? 2 : 4, cache = (size_t)nb * nkv * bs * hd * esz;
    uint8_t *kc = malloc(cache), *vc = malloc(cache);
    for (size_t i = 0; i < cache / 2; i++) {
        uint16_t h = tdm_f32_to_f16(frand());
        memcpy(kc + 2 * i, &h, 2);
        h = tdm_f32_to_f16(frand());
        memcpy(vc + 2 * i, &h, 2);
    }
    if (ct == TDM_F32)
        for (size_t i = 0; i < cache / 4; i++) {
            ((float *)kc)[i] = frand();
            ((float *)vc)[i] = frand();
        }
    int32_t *blocks = malloc((size_t)nb * sizeof(int32_t));
    for (int32_t i = 0; i < nb; i++) blocks[i] = nb - 1 - i;
    tdm_kv_seq seq = {blocks, nb, nb, ctx};
    const tdm_kv_seq *seqs[1] = {&seq};
    tdm_batch bt;
    tdm_batch_init(&bt, n, NULL);
    for (int32_t i = 0; i < n; i++) tdm_batch_add(&bt, 0, ctx - n + i, 0, ctx - n + i, true);
    float *q = malloc((size_t)n * nh * hd * sizeof(float)), *out = malloc((size_t)n * nh * hd * sizeof(float));
    for (int32_t i = 0; i < n * nh * hd; i++) q[i] = frand();
    attn_ctx c = {b, {&bt, seqs, q, nh * hd, out, kc, vc, ct, nh, nkv, hd, bs, 0.125f, 0, 0}};
    double sec = median_time(run_attention, &c, secs);
    printf("%-7s attention %s cache, ctx %d, n=%d: %.1f us\n", tdm_cpu_level_name(tdm_backend_cpu_level(b)),
           tdm_dtype_name(ct), ctx, n, sec * 1e6);
    tdm_batch_free(&bt);
    free(q);
    free(out);
    free(blocks);
    free(kc);
    free(vc);
}

/* --kv-attention R: one decode row's attention over every layer of the 1.5B real
 * target (28 layers, 12 heads / 2 kv heads of 128, blocks of 16) at contexts 512,
 * 2048 and 4096, with f32, f16 and q8_0 caches (values uniform in [-1, 1]; q8_0
 * quants in [-127, 127], scales 1/127), the types alternated in each of R rounds in
 * this one process; the 28 layers' caches exceed the last-level cache as in a real
 * step, where the weights streamed between layers evict them.  Prints the median
 * time per step (all layers) of each type and context. */
typedef struct kv_attn_ctx {
    tdm_backend *b;
    tdm_attn_args a[28];
} kv_attn_ctx;

static void run_kv_attention(void *p) {
    kv_attn_ctx *c = p;
    for (int l = 0; l < 28; l++) {
        tdm_err err;
        if (c->b->ops->attention(c->b, &c->a[l], &err) != TANDEM_OK) {
            fprintf(stderr, "attention failed: %s\n", err.msg);
            exit(1);
        }
    }
}

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void bench_kv_attention(tdm_backend *b, int rounds, double secs) {
    enum { NL = 28, NH = 12, NKV = 2, HD = 128, BS = 16, NT = 4, NC = 3 };
    const uint32_t types[NT] = {TDM_F32, TDM_F16, TDM_Q8_0, TDM_F8_E4M3};
    const int32_t ctxs[NC] = {512, 2048, 4096};
    double *t = calloc((size_t)rounds * NT * NC, sizeof(double));
    for (int c = 0; c < NC; c++) {
        const int32_t ctx = ctxs[c], nb = (ctx + BS - 1) / BS;
        int32_t *blocks = malloc((size_t)nb * sizeof(int32_t));
        for (int32_t i = 0; i < nb; i++) blocks[i] = i;
        tdm_kv_seq seq = {blocks, nb, nb, ctx};
        const tdm_kv_seq *seqs[1] = {&seq};
        tdm_batch bt;
        tdm_batch_init(&bt, 1, NULL);
        tdm_batch_add(&bt, 0, ctx - 1, 0, ctx - 1, true);
        float *q = malloc(NH * HD * sizeof(float)), *out = malloc(NH * HD * sizeof(float));
        for (int i = 0; i < NH * HD; i++) q[i] = frand();
        kv_attn_ctx ac[NT];
        uint8_t *mem[NT];
        for (int k = 0; k < NT; k++) {
            const uint32_t ty = types[k];
            const size_t unit = (size_t)tdm_kv_unit_bytes(ty, BS, HD), per = (size_t)nb * NKV * unit;
            mem[k] = malloc(per * 2 * NL);
            for (size_t u = 0; u < (size_t)nb * NKV * 2 * NL; u++) {
                uint8_t *p = mem[k] + u * unit;
                for (int i = 0; i < BS * HD; i++) {
                    const float x = frand();
                    if (ty == TDM_F32) memcpy(p + 4 * i, &x, 4);
                    else if (ty == TDM_F16) {
                        const uint16_t h = tdm_f32_to_f16(x);
                        memcpy(p + 2 * i, &h, 2);
                    } else if (ty == TDM_F8_E4M3) p[i] = tdm_f32_to_e4m3(x * TDM_E4M3_MAX);
                    else p[i] = (uint8_t)(int8_t)lrintf(x * 127.0f);
                }
                if (tdm_kv_scaled(ty))
                    for (int j = 0; j < BS; j++) {
                        const float d = ty == TDM_Q8_0 ? 1.0f / 127.0f : 1.0f / TDM_E4M3_MAX;
                        memcpy(p + tdm_kv_scale_off(BS, HD) + 4 * j, &d, 4);
                    }
            }
            ac[k].b = b;
            for (int l = 0; l < NL; l++)
                ac[k].a[l] = (tdm_attn_args){&bt, seqs, q, NH * HD, out, mem[k] + (size_t)2 * l * per,
                                             mem[k] + (size_t)(2 * l + 1) * per, ty, NH, NKV, HD, BS,
                                             0.0883883f, 0, 0};
        }
        for (int r = 0; r < rounds; r++)
            for (int k = 0; k < NT; k++) {
                const int kk = (k + r) % NT; /* rotating order */
                t[((size_t)c * NT + kk) * rounds + r] = median_time(run_kv_attention, &ac[kk], secs);
            }
        for (int k = 0; k < NT; k++) {
            double *tk = t + ((size_t)c * NT + k) * rounds;
            qsort(tk, (size_t)rounds, sizeof *tk, cmp_dbl);
            printf("%-7s kv attention, 28 layers x 12/2 heads of 128, ctx %d, %s cache: %.1f us per step "
                   "(median of %d rounds; min %.1f, max %.1f)\n",
                   tdm_cpu_level_name(tdm_backend_cpu_level(b)), ctx, tdm_dtype_name(types[k]), tk[rounds / 2] * 1e6,
                   rounds, tk[0] * 1e6, tk[rounds - 1] * 1e6);
            free(mem[k]);
        }
        tdm_batch_free(&bt);
        free(q);
        free(out);
        free(blocks);
    }
    free(t);
}

typedef struct head_ctx {
    tdm_backend *b;
    const tdm_weight *w;
    const tdm_qhead *h;
    const float *x;
    int32_t n;
    float *y;
    int32_t *ids;
} head_ctx;

static void run_qhead(void *p) {
    head_ctx *c = p;
    tdm_err err;
    if (c->b->ops->qhead_logits(c->b, c->h, c->x, c->n, c->y, &err) != TANDEM_OK) {
        fprintf(stderr, "qhead_logits failed: %s\n", err.msg);
        exit(1);
    }
}

static void run_head_argmax(void *p) {
    head_ctx *c = p;
    tdm_err err;
    if (c->b->ops->head_argmax(c->b, c->w, c->h, c->x, c->n, NULL, c->ids, &err) != TANDEM_OK) {
        fprintf(stderr, "head_argmax failed: %s\n", err.msg);
        exit(1);
    }
}

/* The quantised output head (qhead.h) of a [V][E] f16 head: approximate logits and
 * exact argmax, hot in the caches, against the f16 matmul of the same rows.  The x
 * rows are made so that one logit stands out (as with a trained model) and a few
 * come close. */
static void bench_head(tdm_backend *b, int64_t V, int64_t E, double secs) {
    if (!b->int8_dot) return;
    tdm_weight w = make_weight(TDM_F16, V, E);
    void *buf = tdm_alloc_aligned(tdm_qhead_bytes(V, E), 64);
    tdm_qhead h;
    tdm_err err;
    tdm_qhead_place(&h, V, E, buf);
    if (tdm_qhead_fill(&w, buf, &err) != TANDEM_OK) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    float *x = malloc((size_t)(8 * E) * sizeof(float)), *y = malloc((size_t)(8 * V) * sizeof(float));
    float *row = malloc((size_t)E * sizeof(float));
    int32_t ids[8];
    for (int i = 0; i < 8; i++) { /* x = 0.3 * noise + 3 * (W row 17 i) */
        tdm_row_to_f32(TDM_F16, (const uint8_t *)w.data + (size_t)(17 * i) * w.row_bytes, row, E);
        for (int64_t k = 0; k < E; k++) x[i * E + k] = 0.3f * frand() + 3.0f * row[k];
    }
    static const int32_t ns[] = {1, 4, 5};
    for (size_t k = 0; k < 3; k++) {
        head_ctx c = {b, &w, &h, x, ns[k], y, ids};
        mm_ctx m = {b, &w, 1, x, ns[k], y};
        double t_mm = median_time(run_matmuls, &m, secs), t_q = median_time(run_qhead, &c, secs);
        double t_am = median_time(run_head_argmax, &c, secs);
        tdm_cpu *cpu = b->impl;
        printf("%-7s head f16 [%lld][%lld] n=%d: matmul %.1f us, qhead_logits %.1f us, head_argmax %.1f us "
               "(%.1f exact logits per row)\n",
               tdm_cpu_level_name(tdm_backend_cpu_level(b)), (long long)V, (long long)E, ns[k], t_mm * 1e6,
               t_q * 1e6, t_am * 1e6, cpu->head_rows ? (double)cpu->head_cands / (double)cpu->head_rows : 0.0);
    }
    free(x);
    free(y);
    free(row);
    tdm_free_aligned(buf);
    tdm_free_aligned((void *)w.data);
}

typedef struct scatter_ctx {
    tdm_backend *b;
    const float *x;
    const int32_t *ids;
    int32_t n, nx, dim;
    float *y;
} scatter_ctx;

static void run_scatter(void *p) {
    scatter_ctx *c = p;
    tdm_err err;
    if (c->b->ops->scatter_cols(c->b, c->x, c->n, c->nx, c->ids, c->dim, TDM_LOGIT_NONE, c->y, &err))
        fprintf(stderr, "scatter_cols: %s\n", err.msg);
}

/* scatter_cols at the real draft's shapes: the first 32768 ids and 23 special ones of
 * 151936, n rows. */
static void bench_scatter(tdm_backend *b, const int32_t *ns, int n_ns, double secs) {
    enum { DIM = 151936, NX = 32791 };
    int32_t *ids = malloc(NX * sizeof *ids);
    for (int32_t j = 0; j < NX; j++) ids[j] = j < 32768 ? j : 151643 + (j - 32768);
    float *x = malloc((size_t)128 * NX * sizeof *x), *y = malloc((size_t)128 * DIM * sizeof *y);
    for (size_t i = 0; i < (size_t)128 * NX; i++) x[i] = frand();
    for (int k = 0; k < n_ns; k++) {
        scatter_ctx c = {b, x, ids, ns[k], NX, DIM, y};
        const double t = median_time(run_scatter, &c, secs);
        printf("scatter_cols %d of %d logits, %3d rows: %8.1f us (%.1f GB/s written)\n", NX, DIM, ns[k], t * 1e6,
               (double)ns[k] * DIM * 4 / t / 1e9);
    }
    free(ids), free(x), free(y);
}

static size_t weight_bytes(const tdm_weight *w) { return w->row_bytes * (size_t)w->rows; }

/* One decode step of the target model as the engine loads it: 8 x (fused qkv, o,
 * fused gate+up, down), with_head + the output head as a rows-layout matmul (the
 * engine's target uses the quantised head instead), the layer weights in the
 * backend's preferred layout (and, with both_layouts, in the rows layout too):
 * microseconds per step for each row count in ns, in `rounds` interleaved rounds. */
static void bench_step(tdm_backend *b, const float *x, float *y, const int32_t *ns, int n_ns, int rounds,
                       bool both_layouts, bool with_head, double secs) {
    enum { N_LAYER = 8, N_W = N_LAYER * 4 + 1 };
    static const int64_t layer[4][2] = {{640, 384}, {384, 384}, {2048, 384}, {384, 1024}};
    const char *lv = tdm_cpu_level_name(tdm_backend_cpu_level(b));
    tdm_weight ws[2][N_W];
    size_t bytes = 0;
    for (int l = 0; l < N_LAYER; l++)
        for (int m = 0; m < 4; m++) {
            ws[0][l * 4 + m] = make_weight(TDM_F16, layer[m][0], layer[m][1]);
            ws[1][l * 4 + m] = layout_copy(b, &ws[0][l * 4 + m]);
        }
    ws[0][N_W - 1] = ws[1][N_W - 1] = make_weight(TDM_F16, 8192, 384);
    const int n_w = with_head ? N_W : N_W - 1;
    for (int i = 0; i < n_w; i++) bytes += weight_bytes(&ws[0][i]);
    bool packed = ws[1][0].layout != ws[0][0].layout;
    for (int r = 0; r < rounds; r++)
        for (int k = 0; k < n_ns; k++)
            for (int li = packed && !both_layouts; li < (packed ? 2 : 1); li++) {
                mm_ctx c = {b, ws[li], n_w, x, ns[k], y};
                double sec = median_time(run_matmuls, &c, secs);
                printf("%-7s target model f16%s (%.1f MB, %d matmuls) n=%d: %.1f us/step, %.1f GB/s, "
                       "%.1f GFLOP/s\n",
                       lv, li ? " p64" : "", bytes * 1e-6, n_w, ns[k], sec * 1e6, bytes / sec * 1e-9,
                       bytes * (double)ns[k] / sec * 1e-9);
            }
    for (int i = 0; i < N_W; i++) {
        if (packed && i < N_W - 1) tdm_free_aligned((void *)ws[1][i].data);
        tdm_free_aligned((void *)ws[0][i].data);
    }
}

static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* --qgemv: see the header. */
static int bench_qgemv(const int32_t *ns, int n_ns, uint32_t only_types, int rounds) {
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx512vnni")) {
        fprintf(stderr, "bench_ops --qgemv: this CPU has no AVX-512 VNNI\n");
        return 1;
    }
    for (int k = 0; k < n_ns; k++)
        if (ns[k] > TDM_QGEMV_MAX) {
            fprintf(stderr, "bench_ops --qgemv: -n values are 1 .. %d\n", TDM_QGEMV_MAX);
            return 2;
        }
    if (rounds > 64) rounds = 64;
    static const uint32_t types[] = {TDM_Q4_K, TDM_Q6_K, TDM_Q5_0};
    const int64_t cols = 1536, shapes[2] = {256, 8960};
    float *x = malloc((size_t)TDM_QGEMV_MAX * cols * sizeof(float));
    float *y = malloc((size_t)TDM_QGEMV_MAX * 8960 * sizeof(float));
    if (!x || !y) return 1;
    for (int64_t i = 0; i < TDM_QGEMV_MAX * cols; i++) x[i] = frand();
    for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++) {
        if (only_types && !(only_types >> types[t] & 1)) continue;
        for (int s = 0; s < 2; s++) {
            const int64_t rows = shapes[s];
            tdm_weight w = make_weight(types[t], rows, cols);
            void *buf = tdm_alloc_aligned(tdm_xq_bytes(types[t], cols, TDM_QGEMV_MAX), 64);
            double per_call[16][64];
            for (int r = 0; r < rounds; r++)
                for (int k = 0; k < n_ns; k++) {
                    tdm_xq xq;
                    tdm_xq_quantize(types[t], x, ns[k], cols, 0, ns[k], buf, &xq);
                    tdm_qgemv_vnni(&w, &xq, ns[k], 0, rows, y, rows, false); /* (warm) */
                    const int calls = rows > 1000 ? 8 : 200;
                    const double t0 = thread_cpu_s();
                    for (int c = 0; c < calls; c++) tdm_qgemv_vnni(&w, &xq, ns[k], 0, rows, y, rows, false);
                    per_call[k][r] = (thread_cpu_s() - t0) / calls;
                }
            printf("%s [%lld][%lld] (%s):\n", tdm_dtype_name(types[t]), (long long)rows, (long long)cols,
                   s == 0 ? "in L2" : "from memory");
            for (int k = 0; k < n_ns; k++) {
                qsort(per_call[k], (size_t)rounds, sizeof(double), cmp_double);
                const double med = per_call[k][rounds / 2];
                printf("  n=%d: %9.1f us per call, %6.2f ns per x row and 256 weights (median of %d)\n", ns[k],
                       med * 1e6, med * 1e9 / ((double)rows * (double)(cols / 256) * ns[k]), rounds);
            }
            tdm_free_aligned((void *)w.data);
            tdm_free_aligned(buf);
        }
    }
    free(x);
    free(y);
    return 0;
#else
    (void)ns, (void)n_ns, (void)only_types, (void)rounds;
    fprintf(stderr, "bench_ops --qgemv: x86-64 only\n");
    return 1;
#endif
}

int main(int argc, char **argv) {
    int n_threads = 2;
    int only_level = -1;
    uint32_t only_types = 0; /* -d: bit per type (0: every type) */
    double secs = 0.15;
    int32_t ns[16] = {1, 128};
    int n_ns = 2;
    bool ns_given = false;
    bool attn_only = false;
    int step_rounds = 0; /* --step R: only the target step's layer matmuls, -n rows, R rounds */
    bool head_only = false; /* --head: only the quantised output head */
    bool scatter_only = false; /* --scatter: only scatter_cols */
    int kv_rounds = 0;      /* --kv-attention R: only the KV cache types' attention, R rounds */
    int qgemv_rounds = 0;   /* --qgemv R: only the direct integer-dot kernel, R rounds */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) n_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--step") && i + 1 < argc) step_rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) secs = atof(argv[++i]);
        else if (!strcmp(argv[i], "--attention")) attn_only = true;
        else if (!strcmp(argv[i], "--head")) head_only = true;
        else if (!strcmp(argv[i], "--scatter")) scatter_only = true;
        else if (!strcmp(argv[i], "--kv-attention") && i + 1 < argc) kv_rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--qgemv") && i + 1 < argc) qgemv_rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-l") && i + 1 < argc) {
            const char *l = argv[++i];
            only_level = !strcmp(l, "avx512") ? 2 : !strcmp(l, "avx2") ? 1 : 0;
        } else if (!strcmp(argv[i], "-d") && i + 1 < argc) {
            for (char *d = strtok(argv[++i], ","); d; d = strtok(NULL, ","))
                for (uint32_t t = 0; t < 31; t++)
                    if (tdm_dtype_supported(t) && !strcmp(d, tdm_dtype_name(t))) only_types |= 1u << t;
        } else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
            n_ns = 0;
            ns_given = true;
            for (char *q = argv[++i]; *q && n_ns < 16;) {
                long v = strtol(q, &q, 10);
                if (v < 1 || v > 128) break;
                ns[n_ns++] = (int32_t)v;
                if (*q == ',') q++;
            }
        } else {
            fprintf(stderr, "usage: %s [-t threads] [-l scalar|avx2|avx512] [-d dtype] [-s seconds] [-n 1,4,128] [--attention] [--head] [--step rounds] [--kv-attention rounds] [--qgemv rounds] [--scatter]\n",
                    argv[0]);
            return 2;
        }
    }
    if (qgemv_rounds > 0) {
        static const int32_t all[] = {1, 2, 3, 4, 5, 6, 7, 8}; /* (without -n: every count) */
        return ns_given ? bench_qgemv(ns, n_ns, only_types, qgemv_rounds) : bench_qgemv(all, 8, only_types, qgemv_rounds);
    }
    static const uint32_t types[] = {TDM_F32,  TDM_F16,  TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1, TDM_Q5_0,
                                     TDM_Q5_1, TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};
    static const int64_t shapes[][2] = {{1024, 384}, {384, 1024}, {2048, 384}, {384, 384}, {8192, 384}};
    /* the integer-dot types: llama2-7b's q/o, gate/up and down shapes */
    static const int64_t qshapes[][2] = {{4096, 4096}, {11008, 4096}, {4096, 11008}};

    float *x = malloc(128 * 11008 * sizeof(float));
    float *y = malloc(128 * 11008 * sizeof(float));
    for (int i = 0; i < 128 * 11008; i++) x[i] = frand();

    printf("threads %d, best level %s\n", n_threads, tdm_cpu_level_name(tdm_cpu_best_level()));
    printf("%-7s %-5s %-12s %4s %10s %9s %8s\n", "level", "dtype", "W shape", "n", "median us",
           "GFLOP/s", "GB/s");
    for (int lv = 0; lv <= (int)tdm_cpu_best_level(); lv++) {
        if (only_level >= 0 && lv != only_level) continue;
        tdm_backend *b = NULL;
        tdm_err err;
        if (tdm_backend_cpu_create_level(n_threads, (tdm_cpu_level)lv, &b, &err) != TANDEM_OK) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        if (step_rounds > 0) {
            bench_step(b, x, y, ns, n_ns, step_rounds, false, false, secs);
            tdm_backend_destroy(b);
            continue;
        }
        if (kv_rounds > 0) {
            bench_kv_attention(b, kv_rounds, secs);
            tdm_backend_destroy(b);
            continue;
        }
        if (scatter_only) {
            if (lv == (int)tdm_cpu_best_level()) bench_scatter(b, ns, n_ns, secs);
            tdm_backend_destroy(b);
            continue;
        }
        if (head_only) {
            bench_head(b, 8192, 384, secs);
            bench_head(b, 8192, 128, secs);
            tdm_backend_destroy(b);
            continue;
        }
        if (attn_only) { /* the target's attention over 200 slots, for the rows given by -n */
            for (int k = 0; k < n_ns; k++) bench_attention(b, TDM_F32, 200, ns[k], secs);
            tdm_backend_destroy(b);
            continue;
        }
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            if (only_types && !(only_types >> types[t] & 1)) continue;
            const bool qd = tdm_qdot_type(types[t]);
            const size_t n_shapes = qd ? TDM_ARRAY_LEN(qshapes) : TDM_ARRAY_LEN(shapes);
            for (size_t s = 0; s < n_shapes; s++) {
                tdm_weight wl[2];
                wl[0] = make_weight(types[t], qd ? qshapes[s][0] : shapes[s][0], qd ? qshapes[s][1] : shapes[s][1]);
                wl[1] = layout_copy(b, &wl[0]);
                for (int li = 0; li < (wl[1].layout != wl[0].layout ? 2 : 1); li++)
                    for (int k = 0; k < n_ns; k++) {
                        const tdm_weight *w = &wl[li];
                        mm_ctx c = {b, w, 1, x, ns[k], y};
                        double sec = median_time(run_matmuls, &c, lv == 0 ? secs / 3 : secs);
                        double flop = 2.0 * (double)w->rows * (double)w->cols * ns[k];
                        char shape[32], dt[16];
                        snprintf(shape, sizeof shape, "[%lld][%lld]", (long long)w->rows, (long long)w->cols);
                        snprintf(dt, sizeof dt, "%s%s", tdm_dtype_name(types[t]), li ? "/p64" : "");
                        printf("%-7s %-5s %-12s %4d %10.1f %9.1f %8.1f\n", tdm_cpu_level_name(lv), dt, shape,
                               ns[k], sec * 1e6, flop / sec * 1e-9, (double)weight_bytes(w) / sec * 1e-9);
                    }
                if (wl[1].layout != wl[0].layout) tdm_free_aligned((void *)wl[1].data);
                tdm_free_aligned((void *)wl[0].data);
            }
        }

        if (!only_types || (only_types >> TDM_F16 & 1)) {
            static const int32_t step_ns[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16};
            bench_step(b, x, y, step_ns, (int)(sizeof step_ns / sizeof step_ns[0]), 1, true, true, 3 * secs);
            bench_head(b, 8192, 384, secs);
            bench_head(b, 8192, 128, secs);
            bench_attention(b, TDM_F32, 200, 1, secs);
            bench_attention(b, TDM_F32, 200, 4, secs);
            bench_attention(b, TDM_F16, 1000, 1, secs);
            bench_attention(b, TDM_F32, 1000, 1, secs);
            bench_attention(b, TDM_F16, 256, 128, secs);
        }
        tdm_backend_destroy(b);
    }
    free(x);
    free(y);
    return 0;
}
