/* test_cuda_moe.c - mixture-of-experts layers on the CUDA backend
 * (kernels/cuda/cuda_moe.cu):
 *   the moe_route op against the host's router (tdm_moe_route, moe.h): the same
 *   experts, weights within 4e-6 relative (exp's rounding), ties to the lower expert index, non-finite
 *   rows; 1, 3, 8, 64 and 512 rows, 8 and 128 experts;
 *   the moe_experts op against a double-precision reference on the dequantised
 *   weights (the values the kernels read), every weight type the experts come in
 *   (both layouts of q8_0 / q4_0), 1, 3, 8, 64 and 512 rows, routing random, all
 *   rows to the same experts (the others unused), and a batch invariance check
 *   (a row alone gives the bits it gets in the batch);
 *   tiny qwen3moe and Mixtral models' CUDA forwards (f32; and q4_k / q6_k under a
 *   zero router), through the fused blocks (decode replayed from CUDA graphs) and
 *   op by op (a 40-row prefill, then decode
 *   steps) against the CPU forward: logits and greedy tokens;
 *   greedy speculative decoding with an MoE target and draft on the GPU equal to
 *   target-only decoding there.
 *
 * Without a CUDA device (or in a build without CUDA) the program prints why and
 * exits with 77, which meson reports as skipped. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_testutil.h"
#include "cuda_testutil.h"
#include "dtype.h"
#include "model.h"
#include "moe.h"
#include "ref_ops.h"
#include "sampling.h"
#include "tandem.h"
#include "testutil.h"
#include "tiny_model.h"

#define gpu tdm_cu_test_gpu
#define put tdm_cu_test_put
#define get tdm_cu_test_get

int main(int argc, char *argv[]) { return tdm_cu_test_main(argc, argv); }

static const int32_t ROWS[] = {1, 3, 8, 64, 512};

/* ------------------------------------------------------------ moe_route */

static void check_route(tdm_backend *b, const float *logits, int32_t n, int32_t ne, int32_t k, const char *what) {
    tdm_err err = {0};
    float *ld = put(b, logits, (size_t)n * ne * 4);
    int32_t *idd = put(b, NULL, (size_t)n * k * 4);
    float *wd = put(b, NULL, (size_t)n * k * 4);
    cr_assert_eq(b->ops->moe_route(b, ld, n, ne, k, idd, wd, &err), TANDEM_OK, "%s: %s", what, err.msg);
    int32_t *ids = get(b, idd, (size_t)n * k * 4);
    float *w = get(b, wd, (size_t)n * k * 4);
    int32_t want_ids[64];
    float want_w[64];
    for (int32_t i = 0; i < n; i++) {
        tdm_moe_route(logits + (size_t)i * ne, ne, k, want_ids, want_w);
        for (int32_t j = 0; j < k; j++) {
            const float g = w[(size_t)i * k + j], x = want_w[j];
            cr_assert_eq(ids[(size_t)i * k + j], want_ids[j], "%s: row %d slot %d: expert %d, host %d", what, (int)i,
                         (int)j, (int)ids[(size_t)i * k + j], (int)want_ids[j]);
            cr_assert(isfinite(x) ? fabsf(g - x) <= 4e-6f * fabsf(x) + 1e-12f : !isfinite(g),
                      "%s: row %d slot %d: weight %.9g, host %.9g", what, (int)i, (int)j, g, x);
        }
    }
    free(ids);
    free(w);
    b->ops->free(b, ld);
    b->ops->free(b, idd);
    b->ops->free(b, wd);
}

Test(cuda_moe, route_matches_host) {
    tdm_backend *b = gpu();
    uint64_t rng = 4801;
    static const int32_t shapes[][2] = {{8, 2}, {128, 8}, {60, 4}, {512, 64}};
    for (size_t si = 0; si < TDM_ARRAY_LEN(shapes); si++) {
        const int32_t ne = shapes[si][0], k = shapes[si][1];
        for (size_t ri = 0; ri < TDM_ARRAY_LEN(ROWS); ri++) {
            const int32_t n = ROWS[ri];
            float *l = malloc((size_t)n * ne * 4);
            for (int32_t i = 0; i < n * ne; i++) l[i] = tdm_test_randf(&rng, -4.0f, 4.0f);
            char what[96];
            snprintf(what, sizeof what, "%d rows, %d of %d experts", (int)n, (int)k, (int)ne);
            check_route(b, l, n, ne, k, what);
            /* ties: each row's logits from four values only, so the k picks cross ties */
            for (int32_t i = 0; i < n * ne; i++) l[i] = (float)(tdm_test_rand(&rng) % 4);
            snprintf(what, sizeof what, "%d rows, %d of %d experts, tied", (int)n, (int)k, (int)ne);
            check_route(b, l, n, ne, k, what);
            free(l);
        }
    }
    /* every logit equal (the k lowest experts), and non-finite rows (valid, distinct
     * experts; non-finite weights, as on the host) */
    const float rows[][6] = {{1, 1, 1, 1, 1, 1},     {NAN, 1, 2, 3, 4, 5},           {1, NAN, NAN, 0, 2, 2},
                             {INFINITY, 0, 1, 2, 3, 4}, {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY},
                             {0, 0, 5, 5, 0, 5}};
    check_route(b, &rows[0][0], (int32_t)TDM_ARRAY_LEN(rows), 6, 3, "hand-made rows");
    tdm_err err = {0};
    cr_assert_eq(b->ops->moe_route(b, NULL, 1, 8, 9, NULL, NULL, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->moe_route(b, NULL, 1, 513, 2, NULL, NULL, &err), TANDEM_ERR_INVALID_ARG);
    tdm_backend_destroy(b);
}

/* ------------------------------------------------------------ moe_experts */

/* A random weight [rows][cols] of type t: host rows-layout bytes (*host) and its
 * device copy in the layout the CUDA loader gives it. */
static tdm_weight rand_dev_weight(tdm_backend *b, uint32_t t, int64_t rows, int64_t cols, uint64_t *rng,
                                  uint8_t **host) {
    void *buf;
    const tdm_weight w = tdm_test_rand_weight_for(b, t, rows, cols, rng, &buf, host);
    const tdm_weight d = tdm_cu_test_put_weight(b, &w);
    free(buf);
    return d;
}

/* The dequantised weight [rows][cols] (double). */
static double *deq(uint32_t t, const uint8_t *data, int64_t rows, int64_t cols) {
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(t, (uint64_t)cols, &rb));
    double *o = malloc((size_t)(rows * cols) * sizeof(double));
    float *f = malloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        tdm_row_to_f32(t, data + r * rb, f, cols);
        for (int64_t c = 0; c < cols; c++) o[r * cols + c] = f[c];
    }
    free(f);
    return o;
}

/* out[n][E] in double: each row's experts' swiglu(x W13^T) W2^T, weighted. */
static void ref_experts(const float *x, int32_t n, int32_t E, int32_t F, int32_t K, const int32_t *ids,
                        const float *w, double *const *w13, double *const *w2, double *out) {
    double *h = malloc((size_t)F * sizeof(double));
    for (int32_t i = 0; i < n; i++) {
        double *o = out + (size_t)i * E;
        memset(o, 0, (size_t)E * sizeof(double));
        for (int32_t j = 0; j < K; j++) {
            const int32_t e = ids[i * K + j];
            for (int32_t f = 0; f < F; f++) {
                double g = 0, u = 0;
                for (int32_t c = 0; c < E; c++) {
                    g += w13[e][(size_t)f * E + c] * x[(size_t)i * E + c];
                    u += w13[e][(size_t)(f + F) * E + c] * x[(size_t)i * E + c];
                }
                h[f] = g / (1.0 + exp(-g)) * u;
            }
            for (int32_t c = 0; c < E; c++) {
                double y = 0;
                for (int32_t f = 0; f < F; f++) y += w2[e][(size_t)c * F + f] * h[f];
                o[c] += w[i * K + j] * y;
            }
        }
    }
    free(h);
}

static double nrm_err_d(const float *got, const double *want, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Each type the experts come in; 1 .. 512 rows routed at random or all to experts
 * 0 .. K-1 (the others unused); within 5e-6 normalised error of the reference on
 * the dequantised weights (f32 sums in another order); the first row computed
 * alone gives the same bits as in every batch. */
Test(cuda_moe, experts_match_reference, .timeout = 600) {
    static const uint32_t types[] = {TDM_F32, TDM_F16, TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1,
                                     TDM_Q5_0, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K, TDM_Q3_K, TDM_Q2_K};
    enum { E = 256, F = 256, NE = 16, K = 4, NMAX = 512 };
    tdm_backend *b = gpu();
    tdm_err err = {0};
    uint64_t rng = 4802;
    float *x = malloc((size_t)NMAX * E * 4), *wt = malloc((size_t)NMAX * K * 4);
    int32_t *ids = malloc((size_t)NMAX * K * 4);
    double *want = malloc((size_t)NMAX * E * sizeof(double));
    for (int i = 0; i < NMAX * E; i++) x[i] = tdm_test_randf(&rng, -1.0f, 1.0f);
    float *xd = put(b, x, (size_t)NMAX * E * 4), *outd = put(b, NULL, (size_t)NMAX * E * 4);
    int32_t *idd = put(b, NULL, (size_t)NMAX * K * 4);
    float *wd = put(b, NULL, (size_t)NMAX * K * 4);
    for (size_t ti = 0; ti < TDM_ARRAY_LEN(types); ti++) {
        const uint32_t t = types[ti];
        tdm_weight w13[NE], w2[NE];
        double *r13[NE], *r2[NE];
        for (int e = 0; e < NE; e++) {
            uint8_t *h13, *h2;
            w13[e] = rand_dev_weight(b, t, 2 * F, E, &rng, &h13);
            w2[e] = rand_dev_weight(b, t, E, F, &rng, &h2);
            r13[e] = deq(t, h13, 2 * F, E);
            r2[e] = deq(t, h2, E, F);
            free(h13);
            free(h2);
        }
        for (int skew = 0; skew < 2; skew++)
            for (size_t ri = 0; ri < TDM_ARRAY_LEN(ROWS); ri++) {
                const int32_t n = ROWS[ri];
                for (int32_t i = 0; i < n; i++) {
                    for (int32_t j = 0; j < K; j++) {
                        int32_t e;
                        bool dup;
                        do {
                            e = skew ? (j + (int32_t)(tdm_test_rand(&rng) % K)) % K
                                     : (int32_t)(tdm_test_rand(&rng) % NE);
                            dup = false;
                            for (int32_t q = 0; q < j; q++) dup |= ids[i * K + q] == e;
                        } while (dup);
                        ids[i * K + j] = e;
                        wt[i * K + j] = tdm_test_randf(&rng, 0.05f, 0.5f);
                    }
                }
                OK(b->ops->upload(b, idd, ids, (size_t)n * K * 4, &err_));
                OK(b->ops->upload(b, wd, wt, (size_t)n * K * 4, &err_));
                tdm_cu_test_poison(b, outd, (size_t)n * E);
                tdm_moe_args a = {.x = xd, .n = n, .n_embd = E, .n_ff = F, .n_expert = NE, .k = K, .ids = idd,
                                  .w = wd, .w13 = w13, .w2 = w2, .out = outd};
                cr_assert_eq(b->ops->moe_experts(b, &a, &err), TANDEM_OK, "%s: %s", tdm_dtype_name(t), err.msg);
                float *got = get(b, outd, (size_t)n * E * 4);
                ref_experts(x, n, E, F, K, ids, wt, r13, r2, want);
                const double e = nrm_err_d(got, want, (size_t)n * E);
                cr_log_info("%s, %d rows%s: %.3g", tdm_dtype_name(t), (int)n, skew ? " (skewed)" : "", e);
                cr_assert(e < 5e-6, "%s, %d rows%s: normalised error %g", tdm_dtype_name(t), (int)n,
                          skew ? " to the same experts" : "", e);
                free(got);
            }
        /* batch invariance: row 0 alone, then the same row first in 512 */
        for (int32_t j = 0; j < K; j++) ids[j] = (j * 5) % NE, wt[j] = 0.25f;
        OK(b->ops->upload(b, idd, ids, (size_t)K * 4, &err_));
        OK(b->ops->upload(b, wd, wt, (size_t)K * 4, &err_));
        tdm_moe_args a = {.x = xd, .n = 1, .n_embd = E, .n_ff = F, .n_expert = NE, .k = K, .ids = idd, .w = wd,
                          .w13 = w13, .w2 = w2, .out = outd};
        OK(b->ops->moe_experts(b, &a, &err_));
        float *alone = get(b, outd, E * 4);
        for (int32_t i = 1; i < NMAX; i++)
            for (int32_t j = 0; j < K; j++) ids[i * K + j] = (i + j) % NE, wt[i * K + j] = 0.25f;
        OK(b->ops->upload(b, idd, ids, (size_t)NMAX * K * 4, &err_));
        OK(b->ops->upload(b, wd, wt, (size_t)NMAX * K * 4, &err_));
        a.n = NMAX;
        OK(b->ops->moe_experts(b, &a, &err_));
        float *batch = get(b, outd, E * 4);
        cr_assert(memcmp(alone, batch, E * 4) == 0, "%s: a row alone and in a batch of %d differ", tdm_dtype_name(t),
                  NMAX);
        free(alone);
        free(batch);
        for (int e = 0; e < NE; e++) {
            b->ops->free(b, (void *)w13[e].data);
            b->ops->free(b, (void *)w2[e].data);
            free(r13[e]);
            free(r2[e]);
        }
    }
    /* experts of different types within one product: refused, naming them */
    {
        uint8_t *h;
        tdm_weight w13[2], w2[2];
        w13[0] = rand_dev_weight(b, TDM_F16, 2 * F, E, &rng, &h), free(h);
        w13[1] = rand_dev_weight(b, TDM_BF16, 2 * F, E, &rng, &h), free(h);
        w2[0] = rand_dev_weight(b, TDM_F16, E, F, &rng, &h), free(h);
        w2[1] = w2[0];
        tdm_moe_args a = {.x = xd, .n = 1, .n_embd = E, .n_ff = F, .n_expert = 2, .k = 1, .ids = idd, .w = wd,
                          .w13 = w13, .w2 = w2, .out = outd};
        cr_assert_eq(b->ops->moe_experts(b, &a, &err), TANDEM_ERR_INVALID_ARG);
        cr_assert(strstr(err.msg, "expert 1"), "message: %s", err.msg);
        b->ops->free(b, (void *)w13[0].data);
        b->ops->free(b, (void *)w13[1].data);
        b->ops->free(b, (void *)w2[0].data);
    }
    b->ops->free(b, xd);
    b->ops->free(b, outd);
    b->ops->free(b, idd);
    b->ops->free(b, wd);
    free(x), free(wt), free(ids), free(want);
    tdm_backend_destroy(b);
}

/* ------------------------------------------------------------ tiny models */

/* A 40-row prefill with logits for every row, then five decode steps: the CUDA
 * forward (the fused blocks, whose decode steps replay a CUDA graph, and op by op)
 * against the CPU's, logits within tol normalised error (the prefill's at least
 * 3e-3: its dense products run through cuBLAS; as test_cuda_arch's dense models),
 * and (tokens) the same greedy token each step, or one whose CPU logit ties the
 * CPU's choice within 1e-2.  (f32 weights where the routers decide: f16 products of 40 rows through
 * cuBLAS round their input to f16, enough to flip a close routing decision between
 * the backends, an O(1) difference that is no error.) */
static void check_model(const tdm_tiny_cfg *cfg, const char *what, double tol, bool tokens) {
    char *path = tdm_tiny_model_file(cfg);
    tdm_err err = {0};
    for (int by_ops = 0; by_ops < 2; by_ops++) {
        tdm_backend *cb = NULL;
        cr_assert_eq(tdm_backend_cpu_create(1, &cb, &err), TANDEM_OK, "%s", err.msg);
        tdm_cu_rig rc, rg;
        tdm_cu_rig_open(&rc, cb, path, 8);
        tdm_cu_rig_open(&rg, gpu(), path, 8);
        const int32_t V = rc.m->hp.n_vocab;
        const char *how = by_ops ? "op by op" : "blocks op";
        uint64_t rng = cfg->seed;
        tdm_batch bt;
        cr_assert_eq(tdm_batch_init(&bt, 64, NULL), TANDEM_OK);
        for (int32_t p = 0; p < 40; p++)
            tdm_batch_add(&bt, (int32_t)(tdm_test_rand(&rng) % (uint64_t)V), p, 0, p, true);
        for (int step = 0; step < 6; step++) {
            float *lc = tdm_cu_rig_forward(&rc, &bt, true), *lg = tdm_cu_rig_forward(&rg, &bt, by_ops);
            cr_assert_eq(rg.fs.blocks_declined, (bool)by_ops, "%s: the blocks op %s", what,
                         by_ops ? "ran" : "declined");
            const int32_t nl = tdm_batch_n_logits(&bt);
            const double e = ref_nrm_err(lg, lc, (size_t)nl * V), t = bt.n_rows > 16 ? TDM_MAX(tol, 3e-3) : tol;
            cr_log_info("%s (%s), step %d (%d rows): %.3g", what, how, step, (int)bt.n_rows, e);
            cr_assert(e < t, "%s (%s) step %d (%d rows): logits err %g", what, how, step, (int)bt.n_rows, e);
            const int32_t next = tdm_argmax(lc + (size_t)(nl - 1) * V, V), pos = bt.pos[bt.n_rows - 1] + 1;
            const int32_t got = tdm_argmax(lg + (size_t)(nl - 1) * V, V);
            const float *last = lc + (size_t)(nl - 1) * V;
            if (tokens) /* (or a tie within the logits' tolerance) */
                cr_assert(got == next || fabsf(last[got] - last[next]) < 1e-2f,
                          "%s (%s) step %d: greedy token %d, the CPU's %d", what, how, step, (int)got, (int)next);
            free(lc), free(lg);
            tdm_batch_clear(&bt);
            tdm_batch_add(&bt, next, pos, 0, pos, true);
        }
        uint64_t replays, captures;
        tdm_backend_cuda_graph_stats(rg.be, &replays, &captures);
        cr_log_info("%s (%s): %llu graph replays, %llu captures", what, how, (unsigned long long)replays,
                    (unsigned long long)captures);
#ifndef TDM_TEST_CUDA_ON_CPU
        cr_assert(by_ops || replays > 0, "%s: the decode steps replayed no CUDA graph", what);
#endif
        tdm_batch_free(&bt);
        tdm_cu_rig_close(&rc);
        tdm_cu_rig_close(&rg);
    }
    unlink(path);
    free(path);
}

static tdm_tiny_cfg moe_cfg(const char *arch, uint64_t seed) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.arch = arch;
    c.n_vocab = 48;
    c.seed = seed;
    c.n_embd = 256;
    c.n_ff = 256;
    c.n_head = 4;
    c.head_dim = 64;
    c.n_expert = 8;
    c.n_expert_used = 2;
    c.wtype = TDM_F32;
    return c;
}

Test(cuda_moe, tiny_models_match_cpu, .timeout = 300) {
    tdm_tiny_cfg q = moe_cfg("qwen3moe", 4810);
    /* (1e-3: the fused blocks' attention takes its probabilities in f16, as for the
     * dense models of test_cuda_arch; the op-by-op path measured 1e-5 .. 2e-5) */
    check_model(&q, "qwen3moe f32", 1e-3, true);
    tdm_tiny_cfg m = moe_cfg("llama", 4811);
    m.n_layer = 3;
    m.n_expert = 4;
    check_model(&m, "mixtral f32", 1e-3, true);
    /* K-quants: a zero router (every expert at the same weight: no close routing
     * decision for the int8 activations of the CPU's products to flip) */
    tdm_tiny_cfg k = moe_cfg("qwen3moe", 4812);
    k.zero_router = true;
    k.n_expert_used = k.n_expert;
    k.wtype = TDM_Q4_K;
    k.ffn_down_type = TDM_Q6_K;
    check_model(&k, "qwen3moe q4_k, q6_k down", 8e-2, false); /* (int8 activations on both: near ties may swap) */
}

/* ------------------------------------------------------------ speculation */

/* Greedy speculative decoding on the GPU (an MoE draft: the target's first layer;
 * k = 1, 3 and adaptive) gives the target-only tokens. */
Test(cuda_moe, speculative_equals_target_only, .timeout = 300) {
    tdm_tiny_cfg tc = moe_cfg("qwen3moe", 4820);
    tc.wtype = TDM_F16;
    tc.n_layer = 3;
    tdm_tiny_cfg dc = tc;
    dc.n_layer = 1;
    char *tp = tdm_tiny_model_file(&tc), *dp = tdm_tiny_model_file(&dc);
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = TANDEM_BACKEND_CUDA;
    tandem_model *t, *d;
    cr_assert_eq(tandem_model_open(tp, &mp, &t), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tandem_model_open(dp, &mp, &d), TANDEM_OK, "%s", tandem_last_error());
    tandem_engine *plain, *spec;
    cr_assert_eq(tandem_engine_open(t, NULL, NULL, &plain), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tandem_engine_open(t, d, NULL, &spec), TANDEM_OK, "%s", tandem_last_error());
    static const int ks[] = {1, 3, 0};
    uint64_t accepted = 0;
    for (int p = 0; p < 3; p++) {
        int32_t prompt[12];
        uint64_t rng = 4830 + (uint64_t)p;
        for (int i = 0; i < 12; i++) prompt[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)tc.n_vocab);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 40;
        gp.spec_ngram = 0;
        tandem_result want;
        cr_assert_eq(tandem_generate_ids(plain, prompt, 12, &gp, &want), TANDEM_OK, "%s", tandem_last_error());
        for (size_t i = 0; i < TDM_ARRAY_LEN(ks); i++) {
            gp.spec_k = ks[i];
            tandem_result got;
            cr_assert_eq(tandem_generate_ids(spec, prompt, 12, &gp, &got), TANDEM_OK, "%s", tandem_last_error());
            size_t diff = 0;
            while (diff < got.n_tokens && diff < want.n_tokens && got.tokens[diff] == want.tokens[diff]) diff++;
            cr_assert(got.n_tokens == want.n_tokens && diff == want.n_tokens,
                      "prompt %d k=%d: differs from target-only at token %zu (lengths %zu / %zu)", p, ks[i], diff,
                      got.n_tokens, want.n_tokens);
            accepted += got.spec.accepted;
            tandem_result_free(&got);
        }
        tandem_result_free(&want);
    }
    cr_log_info("qwen3moe on CUDA: %llu drafted tokens accepted", (unsigned long long)accepted);
    tandem_engine_close(spec);
    tandem_engine_close(plain);
    tandem_model_close(d);
    tandem_model_close(t);
    unlink(tp);
    unlink(dp);
    free(tp);
    free(dp);
}
