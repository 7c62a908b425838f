/* test_cuda_fused.c - the CUDA backend's fused forward and its device-side
 * decisions against references, outputs poisoned (NaN) before each run:
 *   - the fused forward (the blocks op, CUDA graphs) against the same model run op
 *     by op on the GPU and on the CPU, for f16, bf16, q8_0, q4_0 and row-layout
 *     K-quant / q5_0 weights, f16 and q8_0 caches; token-tree batches of 8 and 32
 *     rows too (tree masks in the tiled attention, captured), their chain-shaped
 *     rows bit for bit as a chain verification computes them;
 *   - argmax on the device against tdm_argmax_finite, with the top softmax
 *     probability against tdm_top_prob; the embedding of device ids (zeros for an
 *     id outside the vocabulary); the top k logits and their probabilities (a
 *     token tree's draft candidates) against a reference;
 *   - sampling on the device: processed distributions against tdm_probs_from_logits
 *     (temperature, top-k, top-p, min-p, ties), draws against tdm_sample_probs with
 *     the same uniforms, the acceptance rule against tdm_accept_sample.
 * (The matrix products and attention kernels: test_cuda_kernels.c.)
 * Without a CUDA device the program reports itself skipped (exit 77). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "accept.h"
#include "backend_testutil.h"
#include "cuda_testutil.h"
#include "model.h"
#include "ref_ops.h"
#include "sampling.h"
#include "testutil.h"
#include "tiny_model.h"
#include "tree_testutil.h"

#define GEMV_MAX_ROWS 16 /* TDM_CUDA_GEMV_MAX_ROWS (kernels/cuda/cuda_internal.h) */
#define poison tdm_cu_test_poison

/* ---- the fused forward ---------------------------------------------------------- */

/* A tiny two-layer model of these shapes as a file, and three rigs over it: the
 * GPU's blocks op (g), the GPU op by op (o) and the CPU (c).  Returns its path
 * (close_rigs removes it). */
static char *open_rigs(uint32_t wtype, int32_t n_embd, int32_t n_head, int32_t n_head_kv, int32_t n_ff, uint64_t seed,
                       uint32_t kv_type, tdm_cu_rig *g, tdm_cu_rig *o, tdm_cu_rig *c) {
    tdm_tiny_cfg tc = tdm_tiny_default();
    tc.wtype = wtype;
    tc.n_embd = n_embd, tc.n_head = n_head, tc.n_head_kv = n_head_kv, tc.n_ff = n_ff, tc.n_layer = 2;
    tc.untied_output = true;
    tc.seed = seed;
    char *path = tdm_tiny_model_file(&tc);
    tdm_backend *cpu = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &cpu, &err), TANDEM_OK, "%s", err.msg);
    tdm_cu_rig_open_kv(g, tdm_cu_test_gpu(), path, 16, kv_type);
    tdm_cu_rig_open_kv(o, tdm_cu_test_gpu(), path, 16, kv_type);
    tdm_cu_rig_open_kv(c, cpu, path, 16, kv_type);
    return path;
}

static void close_rigs(char *path, tdm_cu_rig *g, tdm_cu_rig *o, tdm_cu_rig *c) {
    tdm_cu_rig_close(g);
    tdm_cu_rig_close(o);
    tdm_cu_rig_close(c);
    unlink(path);
    free(path);
}

/* A prefill of 40 rows, then decode and verification batches of 1, 5 and 1 rows
 * three times each (direct, captured, replayed): the blocks op equals the op-by-op
 * forward on the GPU, comes close to the CPU's, and repeats exactly. */
static void check_fused_kv(uint32_t wtype, int32_t n_embd, int32_t n_head, int32_t n_head_kv, int32_t n_ff,
                           bool graphs, uint32_t kv_type) {
    tdm_cu_rig rg, ro, rc;
    char *path = open_rigs(wtype, n_embd, n_head, n_head_kv, n_ff, 5 + wtype, kv_type, &rg, &ro, &rc);
    const int32_t V = rg.m->hp.n_vocab;
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, 64, NULL), TANDEM_OK);
    const int32_t steps[] = {40, 1, 5, 1, 1, 5, 1, 1, 5, 1};
    int32_t pos = 0;
    float *first[3] = {NULL, NULL, NULL};
    for (size_t k = 0; k < TDM_ARRAY_LEN(steps); k++) {
        tdm_batch_clear(&bt);
        /* steps 1-3 repeat as 4-6 and 7-9 at the same positions: same inputs, same slots */
        if (k == 0) pos = 0;
        else if ((k - 1) % 3 == 0) pos = 40;
        for (int32_t i = 0; i < steps[k]; i++) {
            const int32_t tok = (int32_t)((pos * 31 + 7) % V);
            tdm_batch_add(&bt, tok, pos, 0, pos, true);
            pos++;
        }
        const int32_t nl = tdm_batch_n_logits(&bt);
        float *lg = tdm_cu_rig_forward(&rg, &bt, false), *lo = tdm_cu_rig_forward(&ro, &bt, true);
        float *lc = tdm_cu_rig_forward(&rc, &bt, false);
        const size_t nv = (size_t)nl * V;
        const double e_ops = ref_nrm_err(lg, lo, nv), e_cpu = ref_nrm_err(lg, lc, nv);
        const bool big = bt.n_rows > GEMV_MAX_ROWS;
        /* f16 / bf16 activations on tensor cores for the prefill (and so in the K / V
         * that later rows read); int8 activations (per 32-element block) for quantised
         * weights, exact against their own reference in cuda_gemv above */
        /* the CPU's other quantised types round x to int8 too (kernels/cpu/qdot.h), the
         * GPU's q4_k / q5_k / q6_k kernels as well (the other types read f32 x) */
        const bool cpu_int8 = (wtype == TDM_Q8_0 || wtype == TDM_Q4_0) || tdm_dtype_block_elems(wtype) > 1;
        double tol_cpu = cpu_int8 ? 1e-1 : wtype == TDM_BF16 ? 2e-2 : big ? 3e-3 : 2e-3;
        /* q8_0 K / V: the GPU's f16 prefill activations move some quants a step from
         * the CPU's; fused (RoPE + quantisation in one kernel) and op by op may too,
         * where a value lands a rounding away from a half step */
        if (kv_type == TDM_Q8_0) tol_cpu = TDM_MAX(tol_cpu, 2e-2);
        /* fp8 K / V: a code a step away is 2^-3 of its value (q8_0: 1/127 of the
         * vector's largest), so the same moves weigh more */
        if (kv_type == TDM_F8_E4M3) tol_cpu = TDM_MAX(tol_cpu, 5e-2);
        const double tol_ops = kv_type == TDM_Q8_0 ? 1e-4 : kv_type == TDM_F8_E4M3 ? 1e-3 : 1e-5;
        cr_assert(e_ops < tol_ops, "%s, %s cache, step %zu (%d rows): fused vs ops err %g", tdm_dtype_name(wtype),
                  tdm_dtype_name(kv_type), k, (int)bt.n_rows, e_ops);
        cr_assert(e_cpu < tol_cpu, "%s step %zu (%d rows): GPU vs CPU err %g", tdm_dtype_name(wtype), k, (int)bt.n_rows,
                  e_cpu);
        if (k >= 1) {
            const size_t slot = (k - 1) % 3;
            if (!first[slot]) {
                first[slot] = malloc(nv * 4);
                memcpy(first[slot], lg, nv * 4);
            } else {
                cr_assert(memcmp(first[slot], lg, nv * 4) == 0, "%s step %zu: a repeated batch gives other logits",
                          tdm_dtype_name(wtype), k);
            }
        }
        free(lg), free(lo), free(lc);
    }
    uint64_t replays = 0, captures = 0;
    tdm_backend_cuda_graph_stats(rg.be, &replays, &captures);
    cr_log_info("%s: %llu graph captures, %llu replays", tdm_dtype_name(wtype), (unsigned long long)captures,
                (unsigned long long)replays);
    if (graphs) {
        cr_assert_geq(captures, 2, "decode (1 row) and verification (5 rows) shapes are captured");
        cr_assert_geq(replays, 2);
    } else {
        cr_assert_eq(captures, 0, "shapes the tiled attention does not run are not captured");
    }
    for (int i = 0; i < 3; i++) free(first[i]);
    tdm_batch_free(&bt);
    close_rigs(path, &rg, &ro, &rc);
}

static void check_fused(uint32_t wtype, int32_t n_embd, int32_t n_head, int32_t n_head_kv, int32_t n_ff,
                        bool graphs) {
    check_fused_kv(wtype, n_embd, n_head, n_head_kv, n_ff, graphs, TDM_F16);
}

Test(cuda_fused, f16_gqa_hd128, .timeout = 300) { check_fused(TDM_F16, 512, 4, 1, 768, true); }
/* a q8_0 cache: RoPE, quantisation and the K / V write in one kernel, the tiled
 * attention on int8 (graphs captured); hd 48 takes the op's attention */
Test(cuda_fused, f16_weights_q8_0_cache, .timeout = 300) { check_fused_kv(TDM_F16, 512, 4, 1, 768, true, TDM_Q8_0); }
Test(cuda_fused, q8_0_weights_q8_0_cache, .timeout = 300) { check_fused_kv(TDM_Q8_0, 512, 4, 2, 768, true, TDM_Q8_0); }
Test(cuda_fused, q8_0_cache_odd_width, .timeout = 300) { check_fused_kv(TDM_Q8_0, 96, 2, 1, 160, false, TDM_Q8_0); }
/* an fp8 cache: the same kernels with E4M3 codes (Hopper's conversions) */
Test(cuda_fused, f16_weights_fp8_cache, .timeout = 300) { check_fused_kv(TDM_F16, 512, 4, 1, 768, true, TDM_F8_E4M3); }
Test(cuda_fused, fp8_cache_odd_width, .timeout = 300) { check_fused_kv(TDM_Q8_0, 96, 2, 1, 160, false, TDM_F8_E4M3); }
Test(cuda_fused, bf16_mha_hd64, .timeout = 300) { check_fused(TDM_BF16, 256, 4, 4, 512, true); }
Test(cuda_fused, q8_0_split_layout, .timeout = 300) { check_fused(TDM_Q8_0, 512, 4, 2, 768, true); }
Test(cuda_fused, q4_0_split_layout, .timeout = 300) { check_fused(TDM_Q4_0, 512, 8, 2, 1024, true); }
/* widths whose quantised rows are not 16-byte aligned (the generic kernels, rows
 * layout) and a head dim the tiled attention does not know (48: the op's) */
Test(cuda_fused, q8_0_odd_width_generic, .timeout = 300) { check_fused(TDM_Q8_0, 96, 2, 1, 160, false); }
/* the K-quants (rows layout: int8 kernels for q4_k / q5_k / q6_k, their SwiGLU
 * epilogue too) and Q5_0 (dequantised in registers); f16 for cuBLAS */
Test(cuda_fused, q4_k_rows, .timeout = 300) { check_fused(TDM_Q4_K, 512, 8, 2, 1024, true); }
Test(cuda_fused, q5_k_rows, .timeout = 300) { check_fused(TDM_Q5_K, 512, 4, 2, 768, true); }
Test(cuda_fused, q6_k_rows, .timeout = 300) { check_fused(TDM_Q6_K, 256, 4, 4, 512, true); }
Test(cuda_fused, q5_0_rows, .timeout = 300) { check_fused(TDM_Q5_0, 256, 4, 2, 512, true); }

/* ---- token trees through the fused forward ----------------------------------------- */

/* The tree batch after a prefix of P committed slots: the root row (slot P, causal)
 * and node i at slot P + 1 + i, position P + 1 + its depth, seeing [0, P + 1) and
 * its ancestors. */
static void tree_batch(tdm_batch *bt, int32_t P, int32_t n, const int32_t *depth, const uint64_t *mask, int32_t V) {
    tdm_batch_clear(bt);
    tdm_batch_add(bt, (P * 31 + 7) % V, P, 0, P, true);
    for (int32_t i = 0; i < n; i++)
        cr_assert_geq(tdm_batch_add_tree(bt, (int32_t)((P + 5 * i + 3) % V), P + 1 + depth[i], 0, P + 1 + i, P + 1,
                                         mask[i], true),
                      0);
}

/* After a prefill of 40 rows, trees of 7 and 31 nodes (8 and 32 rows: the second
 * past TDM_CUDA_GEMV_MAX_ROWS, on the row kernels as a verification must be), each
 * three times (direct, captured, replayed): the blocks op equals the op-by-op
 * forward (the scores and softmax kernels, TDM_CUDA_ATTN_SCORES) and comes close to the
 * CPU; repeats are exact; and the root row and the first node (a chain of two)
 * give the bits a 2-row verification batch gives. */
static void check_fused_tree(uint32_t wtype, int32_t n_head, int32_t n_head_kv, uint32_t kv_type) {
    tdm_cu_rig rg, ro, rc;
    char *path = open_rigs(wtype, 512, n_head, n_head_kv, 768, 11 + wtype, kv_type, &rg, &ro, &rc);
    const int32_t V = rg.m->hp.n_vocab, P = 40;
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, 64, NULL), TANDEM_OK);
    for (int32_t i = 0; i < P; i++) tdm_batch_add(&bt, (i * 31 + 7) % V, i, 0, i, i == P - 1);
    tdm_cu_rig *all[3] = {&rg, &ro, &rc};
    for (int k = 0; k < 3; k++) free(tdm_cu_rig_forward(all[k], &bt, k == 1));
    uint64_t rng = 77 + wtype;
    const int32_t sizes[] = {7, 31};
    for (size_t si = 0; si < TDM_ARRAY_LEN(sizes); si++) {
        const int32_t n = sizes[si];
        int32_t parent[64], depth[64];
        uint64_t mask[64];
        tdm_test_random_tree(&rng, n, parent, depth, mask);
        tree_batch(&bt, P, n, depth, mask, V);
        const size_t nv = (size_t)(n + 1) * V;
        float *first = NULL;
        for (int rep = 0; rep < 3; rep++) {
            float *lg = tdm_cu_rig_forward(&rg, &bt, false);
            tdm_backend_cuda_force_attention(ro.be, TDM_CUDA_ATTN_SCORES);
            float *lo = tdm_cu_rig_forward(&ro, &bt, true);
            tdm_backend_cuda_force_attention(ro.be, TDM_CUDA_ATTN_AUTO);
            float *lc = tdm_cu_rig_forward(&rc, &bt, false);
            const double e_ops = ref_nrm_err(lg, lo, nv), e_cpu = ref_nrm_err(lg, lc, nv);
            const bool int8 = wtype == TDM_Q8_0 || wtype == TDM_Q4_0;
            const double tol_cpu = int8 ? 1e-1 : kv_type == TDM_Q8_0 ? 2e-2 : kv_type == TDM_F8_E4M3 ? 5e-2 : 3e-3;
            /* (op by op, more than GEMV_MAX_ROWS rows take cuBLAS with 16-bit activations) */
            const double tol_ops = n + 1 > GEMV_MAX_ROWS ? tol_cpu
                                   : kv_type == TDM_Q8_0 ? 1e-4
                                   : kv_type == TDM_F8_E4M3 ? 1e-3
                                                            : 1e-5;
            cr_assert(e_ops < tol_ops, "%s tree of %d: fused vs ops err %g", tdm_dtype_name(wtype), (int)n, e_ops);
            cr_assert(e_cpu < tol_cpu, "%s tree of %d: GPU vs CPU err %g", tdm_dtype_name(wtype), (int)n, e_cpu);
            if (!first) first = lg, lg = NULL;
            else cr_assert(memcmp(first, lg, nv * 4) == 0, "tree of %d, run %d: other logits", (int)n, rep);
            free(lg), free(lo), free(lc);
        }
        /* the root and node 0 as a chain verification of two rows */
        tdm_batch_clear(&bt);
        tdm_batch_add(&bt, (P * 31 + 7) % V, P, 0, P, true);
        tdm_batch_add(&bt, (P + 3) % V, P + 1, 0, P + 1, true);
        float *lchain = tdm_cu_rig_forward(&rg, &bt, false);
        cr_assert(memcmp(lchain, first, 2 * (size_t)V * 4) == 0,
                  "tree of %d: the root and its first child differ from a chain of the same two rows", (int)n);
        free(lchain), free(first);
    }
#ifndef TDM_TEST_CUDA_ON_CPU /* (no graphs there) */
    uint64_t replays = 0, captures = 0;
    tdm_backend_cuda_graph_stats(rg.be, &replays, &captures);
    cr_assert_geq(captures, 2, "both tree shapes are captured (%llu captures)", (unsigned long long)captures);
    cr_assert_geq(replays, 2);
#endif
    tdm_batch_free(&bt);
    close_rigs(path, &rg, &ro, &rc);
}

Test(cuda_fused, tree_f16_gqa, .timeout = 300) { check_fused_tree(TDM_F16, 4, 1, TDM_F16); }
Test(cuda_fused, tree_q8_0_weights_q8_0_cache, .timeout = 300) { check_fused_tree(TDM_Q8_0, 8, 2, TDM_Q8_0); }
Test(cuda_fused, tree_f16_weights_fp8_cache, .timeout = 300) { check_fused_tree(TDM_F16, 8, 2, TDM_F8_E4M3); }
Test(cuda_fused, tree_q4_0_mha, .timeout = 300) { check_fused_tree(TDM_Q4_0, 4, 4, TDM_F16); }

/* ---- argmax -------------------------------------------------------------------- */

Test(cuda_ops, argmax_ties_nan_and_inf) {
    tdm_backend *b = tdm_cu_test_gpu();
    enum { N = 5, D = 70001 };
    uint64_t rng = 3;
    float *x = tdm_test_rand_vec(&rng, (size_t)N * D, -5, 5);
    x[0 * D + 70000] = 9, x[0 * D + 12345] = 9; /* a tie: the first wins */
    x[1 * D + 4] = NAN, x[1 * D + 5] = 7;       /* a NaN: -1 (a model error) */
    x[2 * D + 900] = -INFINITY;                 /* an infinity: -1 */
    for (int k = 0; k < D; k++) x[3 * D + k] = NAN;
    x[4 * D + D - 1] = 100;                     /* the last index */
    float *dx = tdm_cu_test_put(b, x, (size_t)N * D * 4);
    int32_t ids[N];
    OK(b->ops->argmax(b, dx, N, D, ids, &err_));
    for (int i = 0; i < N; i++)
        cr_assert_eq(ids[i], tdm_argmax_finite(x + (size_t)i * D, D), "row %d: %d vs %d", i, ids[i],
                     tdm_argmax_finite(x + (size_t)i * D, D));
    cr_assert_eq(ids[0], 12345);
    cr_assert_eq(ids[1], -1);
    cr_assert_eq(ids[2], -1);
    cr_assert_eq(ids[4], D - 1);
    b->ops->free(b, dx);
    free(x);
    tdm_backend_destroy(b);
}

/* The topk op's reference: row x[dim]'s k first entries by value (ties: the lower
 * index), their softmax probabilities (the sum in double); -1 / 0 past dim. */
static void ref_topk(const float *x, int32_t dim, int32_t k, int32_t *ids, float *pr) {
    double mx = -INFINITY, sum = 0;
    for (int32_t i = 0; i < dim; i++) mx = fmax(mx, x[i]);
    for (int32_t i = 0; i < dim; i++) sum += (double)expf(x[i] - (float)mx);
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t i = 0; i < dim; i++) {
            bool taken = false;
            for (int32_t t = 0; t < j && !taken; t++) taken = ids[t] == i;
            if (!taken && (best < 0 || x[i] > x[best])) best = i;
        }
        ids[j] = best;
        pr[j] = best < 0 ? 0.0f : (float)((double)expf(x[best] - (float)mx) / sum);
    }
}

/* topk: each row's k largest logits in order (ties to the lower index) with their
 * softmax probabilities, as the reference; -1 for a row with a NaN or an
 * infinity; -1 past a row shorter than k. */
Test(cuda_ops, topk_matches_the_reference) {
    tdm_backend *b = tdm_cu_test_gpu();
    if (!b->ops->topk) {
        tdm_backend_destroy(b);
        cr_skip_test("no topk op on this backend");
    }
    enum { N = 6, D = 32000, K = 17 };
    uint64_t rng = 13;
    float *x = tdm_test_rand_vec(&rng, (size_t)N * D, -8, 8);
    x[1 * D + 777] = 30;                                  /* peaked */
    x[2 * D + 5] = NAN;                                   /* broken: -1 */
    x[3 * D + 9] = INFINITY;                              /* broken: -1 */
    for (int32_t i = 0; i < D; i++) x[4 * D + i] = 0.5f;  /* flat: ids 0 .. 16 */
    for (int32_t i = 100; i < 140; i += 3) x[5 * D + i] = 9.0f; /* ties at the top */
    float *dx = tdm_cu_test_put(b, x, (size_t)N * D * 4);
    int32_t ids[N * K];
    float pr[N * K];
    OK(b->ops->topk(b, dx, N, D, K, ids, pr, &err_));
    for (int i = 0; i < N; i++) {
        if (i == 2 || i == 3) {
            cr_assert_eq(ids[i * K], -1, "row %d: a broken row gives %d", i, ids[i * K]);
            continue;
        }
        int32_t wi[K];
        float wp[K];
        ref_topk(x + (size_t)i * D, D, K, wi, wp);
        for (int j = 0; j < K; j++) {
            cr_assert_eq(ids[i * K + j], wi[j], "row %d rank %d: id %d, want %d", i, j, ids[i * K + j], wi[j]);
            cr_assert(fabsf(pr[i * K + j] - wp[j]) <= 1e-5f * wp[j], "row %d rank %d: p %g, want %g", i, j,
                      pr[i * K + j], wp[j]);
        }
    }
    cr_assert_eq(ids[4 * K + 16], 16);
    cr_assert_eq(ids[5 * K + 0], 100);
    cr_assert_eq(ids[5 * K + 1], 103);
    /* a row shorter than k: its entries, then -1 */
    OK(b->ops->topk(b, dx, 1, 10, K, ids, pr, &err_));
    for (int j = 0; j < K; j++) cr_assert(j < 10 ? ids[j] >= 0 : ids[j] == -1 && pr[j] == 0.0f, "rank %d: %d", j, ids[j]);
    tdm_err e2 = {0};
    cr_assert_eq(b->ops->topk(b, dx, 1, D, TDM_TOPK_MAX + 1, ids, pr, &e2), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(e2.msg, "topk"), "%s", e2.msg);
    b->ops->free(b, dx);
    free(x);
    tdm_backend_destroy(b);
}

/* argmax_dev: the same ids as argmax, kept on the device, and each row's top
 * softmax probability; get_rows_dev embeds device ids, zeros for -1. */
Test(cuda_ops, argmax_dev_top_prob_and_device_ids) {
    tdm_backend *b = tdm_cu_test_gpu();
    enum { N = 4, D = 32000, E = 96 };
    uint64_t rng = 11;
    float *x = tdm_test_rand_vec(&rng, (size_t)N * D, -8, 8);
    x[1 * D + 777] = 30;          /* a peaked row: top close to 1 */
    x[2 * D + 5] = NAN;           /* a broken row: -1, top 0 */
    for (int k = 0; k < D; k++) x[3 * D + k] = 0.5f; /* flat: the first index, top 1 / D */
    float *dx = tdm_cu_test_put(b, x, (size_t)N * D * 4);
    int32_t *dids = tdm_cu_test_put(b, NULL, N * 4);
    float *dtop = tdm_cu_test_put(b, NULL, N * 4);
    poison(b, dtop, N);
    OK(b->ops->argmax_dev(b, dx, N, D, dids, dtop, &err_));
    int32_t *ids = tdm_cu_test_get(b, dids, N * 4);
    float *top = tdm_cu_test_get(b, dtop, N * 4);
    for (int i = 0; i < N; i++) {
        const float *xi = x + (size_t)i * D;
        cr_assert_eq(ids[i], tdm_argmax_finite(xi, D), "row %d: %d", i, ids[i]);
        const float want = ids[i] < 0 ? 0.0f : tdm_top_prob(xi, D);
        cr_assert(fabsf(top[i] - want) <= 1e-5f * want, "row %d: top %g, want %g", i, top[i], want);
    }
    cr_assert_eq(ids[2], -1);
    cr_assert_eq(ids[3], 0);
    /* embed [ids[0], -1 (row 2's), ids[1]] from device memory */
    float *wh = tdm_test_rand_vec(&rng, (size_t)D * E, -1, 1);
    const tdm_weight wt = {TDM_F32, D, E, E * 4, wh, 0, NULL};
    const tdm_weight emb_w = tdm_cu_test_put_weight(b, &wt);
    int32_t want_ids[3] = {ids[0], -1, ids[1]};
    int32_t *dwant = tdm_cu_test_put(b, want_ids, sizeof want_ids);
    float *demb = tdm_cu_test_put(b, NULL, 3 * E * 4);
    poison(b, demb, 3 * E);
    OK(b->ops->get_rows_dev(b, &emb_w, dwant, 3, demb, &err_));
    float *emb = tdm_cu_test_get(b, demb, 3 * E * 4);
    int32_t host_ids[2] = {ids[0], ids[1]};
    float *dref = tdm_cu_test_put(b, NULL, 2 * E * 4);
    OK(b->ops->get_rows(b, &emb_w, host_ids, 2, dref, &err_));
    float *ref = tdm_cu_test_get(b, dref, 2 * E * 4);
    cr_assert(memcmp(emb, ref, E * 4) == 0 && memcmp(emb + 2 * E, ref + E, E * 4) == 0, "device ids embed as host ids");
    for (int k = 0; k < E; k++) cr_assert_eq(emb[E + k], 0.0f, "id -1 embeds as zeros");
    cr_assert(memcmp(ref, wh + (size_t)ids[0] * E, E * 4) == 0, "get_rows copies the row");
    void *dev[] = {dx, dids, dtop, dwant, demb, dref, (void *)emb_w.data};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
    free(x), free(ids), free(top), free(emb), free(ref), free(wh);
    tdm_backend_destroy(b);
}

/* ---- sampling on the device -------------------------------------------------------- */

/* logits[n][V]: random, with ties among the largest values and a flat tail */
static float *sampling_logits(uint64_t *rng, int32_t n, int32_t V) {
    float *x = tdm_test_rand_vec(rng, (size_t)n * V, -6, 4);
    for (int32_t i = 0; i < n; i++) {
        float *r = x + (size_t)i * V;
        r[V / 3] = r[V / 2] = r[V - 1] = 7.5f; /* a three-way tie at the top */
        for (int32_t j = 0; j < 40; j++) r[(j * 977) % V] = 5.0f; /* a tie across the top-k / top-p cuts */
    }
    return x;
}

Test(cuda_sampling, probs_match_the_host_filters) {
    tdm_backend *b = tdm_cu_test_gpu();
    const int32_t Vs[] = {32000, 8191};
    const tdm_sampler_params ps[] = {
        {1.0f, 0, 1.0f, 0.0f}, {0.7f, 40, 1.0f, 0.0f}, {1.3f, 0, 0.9f, 0.0f}, {0.8f, 50, 0.95f, 0.05f},
        {1.0f, 0, 1.0f, 0.2f}, {2.0f, 3, 1.0f, 0.0f},  {1.0f, 42, 1.0f, 0.0f}, {0.5f, 0, 0.3f, 0.0f},
    };
    uint64_t rng = 21;
    for (size_t vi = 0; vi < TDM_ARRAY_LEN(Vs); vi++) {
        const int32_t V = Vs[vi], N = 3;
        float *x = sampling_logits(&rng, N, V);
        float *dx = tdm_cu_test_put(b, x, (size_t)N * V * 4), *dp = tdm_cu_test_put(b, NULL, (size_t)N * V * 4);
        int32_t *dok = tdm_cu_test_put(b, NULL, N * 4);
        tdm_sampler_scratch ss;
        OK(tdm_sampler_scratch_init(&ss, V, &err_));
        float *want = malloc((size_t)V * 4);
        for (size_t pi = 0; pi < TDM_ARRAY_LEN(ps); pi++) {
            poison(b, dp, (size_t)N * V);
            OK(b->ops->probs_dev(b, dx, N, V, &ps[pi], dp, dok, &err_));
            float *got = tdm_cu_test_get(b, dp, (size_t)N * V * 4);
            int32_t *ok = tdm_cu_test_get(b, dok, N * 4);
            for (int32_t i = 0; i < N; i++) {
                tdm_probs_from_logits(x + (size_t)i * V, V, &ps[pi], &ss, want);
                const float *g = got + (size_t)i * V;
                int32_t kept = 0;
                for (int32_t j = 0; j < V; j++) {
                    cr_assert_eq(g[j] > 0, want[j] > 0, "V %d params %zu row %d: token %d kept %d on the device, %d on the host",
                                 V, pi, i, j, g[j] > 0, want[j] > 0);
                    kept += want[j] > 0;
                }
                double e = ref_nrm_err(g, want, (size_t)V);
                cr_assert(e < 1e-5, "V %d params %zu row %d: normalised error %g (%d kept)", V, pi, i, e, kept);
                cr_assert_eq(ok[i], 1);
            }
            free(got), free(ok);
        }
        /* a NaN row is flagged, its probabilities 0 */
        x[5] = NAN;
        float *dx2 = tdm_cu_test_put(b, x, (size_t)V * 4);
        OK(b->ops->probs_dev(b, dx2, 1, V, &ps[0], dp, dok, &err_));
        int32_t *ok = tdm_cu_test_get(b, dok, 4);
        cr_assert_eq(ok[0], 0);
        free(ok);
        void *dev[] = {dx, dp, dok, dx2};
        for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
        tdm_sampler_scratch_free(&ss);
        free(x), free(want);
    }
    tdm_backend_destroy(b);
}

/* The same uniform draws the same token as tdm_sample_probs (ties of the cumulative
 * sums at a boundary aside, which random uniforms do not hit). */
Test(cuda_sampling, draws_match_tdm_sample_probs) {
    tdm_backend *b = tdm_cu_test_gpu();
    enum { V = 5000, N = 32 };
    uint64_t rng = 5;
    float *p = tdm_test_rand_vec(&rng, (size_t)N * V, 0, 1);
    for (int32_t i = 0; i < N; i++)
        for (int32_t j = 0; j < V; j++)
            if ((j * 7 + i) % 5 != 0) p[(size_t)i * V + j] = 0.0f; /* sparse rows, unnormalised */
    float *dp = tdm_cu_test_put(b, p, (size_t)N * V * 4), *dmax = tdm_cu_test_put(b, NULL, N * 4);
    int32_t *dids = tdm_cu_test_put(b, NULL, N * 4);
    for (int rep = 0; rep < 20; rep++) {
        tdm_rng r;
        tdm_rng_seed(&r, 100 + (uint64_t)rep);
        double u[N];
        int32_t want[N];
        for (int32_t i = 0; i < N; i++) {
            tdm_rng c = r;
            u[i] = tdm_rng_uniform(&c);
            want[i] = tdm_sample_probs(p + (size_t)i * V, V, &r);
        }
        OK(b->ops->sample_dev(b, dp, N, V, u, dids, dmax, &err_));
        int32_t *ids = tdm_cu_test_get(b, dids, N * 4);
        float *mx = tdm_cu_test_get(b, dmax, N * 4);
        for (int32_t i = 0; i < N; i++) {
            cr_assert_eq(ids[i], want[i], "rep %d row %d: device %d, host %d (u %.17g)", rep, i, ids[i], want[i], u[i]);
            float m = 0;
            for (int32_t j = 0; j < V; j++) m = fmaxf(m, p[(size_t)i * V + j]);
            cr_assert_eq(mx[i], m);
        }
        free(ids), free(mx);
    }
    void *dev[] = {dp, dmax, dids};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
    free(p);
    tdm_backend_destroy(b);
}

/* The acceptance rule with the uniforms tdm_accept_sample would draw: the same
 * accepted count and emitted token (chains of model rows, one-hot rows, rejections,
 * full acceptance). */
Test(cuda_sampling, acceptance_matches_tdm_accept_sample) {
    tdm_backend *b = tdm_cu_test_gpu();
    enum { V = 300, K = 6 };
    uint64_t rng = 77;
    float *p = malloc((size_t)(K + 1) * V * 4), *q = malloc((size_t)K * V * 4), *qh = malloc((size_t)K * V * 4);
    float *dp = tdm_cu_test_put(b, NULL, (size_t)(K + 1) * V * 4), *dq = tdm_cu_test_put(b, NULL, (size_t)K * V * 4);
    int32_t *dout = tdm_cu_test_put(b, NULL, 8);
    int outcomes[K + 1] = {0};
    for (int rep = 0; rep < 300; rep++) {
        const int32_t k = 1 + rep % K, n_q = rep % 3 == 0 ? k / 2 : k; /* rows >= n_q one-hot */
        for (int32_t r = 0; r <= k; r++) {
            double s = 0;
            for (int32_t j = 0; j < V; j++) s += p[r * V + j] = powf(tdm_test_randf(&rng, 0, 1), 6.0f);
            for (int32_t j = 0; j < V; j++) p[r * V + j] = (float)(p[r * V + j] / s);
        }
        int32_t draft[K];
        for (int32_t r = 0; r < k; r++) {
            double s = 0;
            for (int32_t j = 0; j < V; j++) /* q close to p, so chains get accepted */
                s += q[r * V + j] = p[r * V + j] * tdm_test_randf(&rng, 0.5f, 1.5f) + 1e-4f;
            for (int32_t j = 0; j < V; j++) q[r * V + j] = (float)(q[r * V + j] / s);
            /* the draft token: likely under q */
            int32_t best = 0;
            for (int32_t j = 0; j < V; j++) best = q[r * V + j] * tdm_test_randf(&rng, 0, 1) > q[r * V + best] * 0.5f ? j : best;
            draft[r] = best;
        }
        memcpy(qh, q, (size_t)k * V * 4);
        for (int32_t r = n_q; r < k; r++) { /* one-hot rows on the host side */
            memset(qh + r * V, 0, (size_t)V * 4);
            qh[r * V + draft[r]] = 1.0f;
        }
        OK(b->ops->upload(b, dp, p, (size_t)(k + 1) * V * 4, &err_));
        OK(b->ops->upload(b, dq, q, (size_t)k * V * 4, &err_));
        tdm_rng r0;
        tdm_rng_seed(&r0, 9000 + (uint64_t)rep);
        tdm_rng rc = r0;
        double u[K + 1];
        for (int32_t i = 0; i <= k; i++) u[i] = tdm_rng_uniform(&rc);
        int32_t next;
        const int32_t acc = tdm_accept_sample(draft, k, p, qh, V, &r0, NULL, &next);
        OK(b->ops->accept_dev(b, dp, dq, n_q, draft, k, V, u, dout, &err_));
        int32_t *out = tdm_cu_test_get(b, dout, 8);
        cr_assert(out[0] == acc && out[1] == next, "rep %d (k %d, %d q rows): device %d / %d, host %d / %d", rep, k,
                  n_q, out[0], out[1], acc, next);
        outcomes[acc == k ? K : acc]++;
        free(out);
    }
    cr_assert(outcomes[0] > 0 && outcomes[K] > 0, "both rejections and full acceptance");
    void *dev[] = {dp, dq, dout};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
    free(p), free(q), free(qh);
    tdm_backend_destroy(b);
}

int main(int argc, char *argv[]) { return tdm_cu_test_main(argc, argv); }
