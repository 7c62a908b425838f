/* test_cuda_kernels.c - the CUDA backend's fast paths against the reference ops
 * (tests/ref_ops.c) by normalised error, with outputs poisoned (NaN) before each
 * run so an unwritten element fails:
 *   - the row kernels (decode and verification products) for f16, bf16 and the
 *     split-layout q8_0 / q4_0, odd row counts, 1..16 input rows; every row of a
 *     batch equal bit for bit to the same row alone;
 *   - cuBLAS for many rows (each type, activations rounded to 16 bits);
 *   - attention by tiles and splits: head dims 64, 80, 96, 128, 256, grouped
 *     queries, block sizes 8 / 16 / 32, contexts that are not a multiple of the
 *     block size, up to 4099 keys, many sequences of different lengths in a batch;
 *     a row alone equal bit for bit to the same row in a batch;
 *   - batched decode and verification attention (64 sequences of 1 .. 4099 keys,
 *     1 or 5 rows each, every head dim, MHA and GQA, block sizes 8 / 16 / 32): the
 *     decode kernel against ref_attention, the tiled kernel and each row alone, bit
 *     for bit;
 *   - the fused forward (the blocks op, CUDA graphs) against the same model run op
 *     by op on the GPU and on the CPU, for f16, bf16, q8_0 and q4_0 weights;
 *   - argmax on the device against tdm_argmax_finite, with the top softmax
 *     probability against tdm_top_prob; the embedding of device ids (zeros for an
 *     id outside the vocabulary);
 *   - sampling on the device: processed distributions against tdm_probs_from_logits
 *     (temperature, top-k, top-p, min-p, ties), draws against tdm_sample_probs with
 *     the same uniforms, the acceptance rule against tdm_accept_sample;
 *   - token-tree attention (cuda_tree_attn.cu) on random trees of up to 64 nodes
 *     against the CPU backend and the dense masked reference, every cache type and
 *     head dim it takes; kv_move against the reference values.
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

static void poison(tdm_backend *b, void *dev, size_t floats) {
    float *h = malloc(floats * sizeof(float));
    for (size_t i = 0; i < floats; i++) h[i] = NAN;
    tdm_err err = {0};
    cr_assert_eq(b->ops->upload(b, dev, h, floats * sizeof(float), &err), TANDEM_OK, "%s", err.msg);
    free(h);
}

/* ---- matrix products ------------------------------------------------------------ */

/* y (=|+=) x W^T with x quantised per 32-element block as the int8 kernels do
 * (d = max |x| / 127, q = round half to even of x * 127 / max |x|). */
static void ref_matmul_xq(const tdm_weight *w, const float *x, int32_t n, float *y, bool acc) {
    const int64_t cols = w->cols;
    float *wr = malloc((size_t)cols * sizeof(float)), *xq = malloc((size_t)cols * sizeof(float));
    for (int32_t i = 0; i < n; i++) {
        const float *xi = x + (size_t)i * cols;
        for (int64_t b = 0; b < cols / TDM_QK; b++) {
            float a = 0;
            for (int j = 0; j < TDM_QK; j++) a = fmaxf(a, fabsf(xi[b * TDM_QK + j]));
            const float id = a > 0 ? 127.0f / a : 0.0f, d = a / 127.0f;
            for (int j = 0; j < TDM_QK; j++) {
                float q = rintf(xi[b * TDM_QK + j] * id);
                q = q > 127 ? 127 : q < -127 ? -127 : q;
                xq[b * TDM_QK + j] = q * d;
            }
        }
        for (int64_t r = 0; r < w->rows; r++) {
            tdm_row_to_f32(w->type, (const uint8_t *)w->data + r * w->row_bytes, wr, cols);
            double s = 0;
            for (int64_t k = 0; k < cols; k++) s += (double)wr[k] * xq[k];
            float *o = y + (size_t)i * w->rows + r;
            *o = acc ? *o + (float)s : (float)s;
        }
    }
    free(wr);
    free(xq);
}

/* A device copy of w in the layout the CUDA backend loads it in. */
static tdm_weight put_packed(tdm_backend *b, const tdm_weight *w) {
    tdm_weight d = *w;
    d.layout = b->ops->weight_layout ? b->ops->weight_layout(b, w->type, w->rows, w->cols) : TDM_LAYOUT_ROWS;
    void *host = malloc((size_t)w->rows * w->row_bytes);
    cr_assert(tdm_weight_pack(d.layout, w->type, w->rows, w->cols, w->data, host));
    d.data = tdm_cu_test_put(b, host, (size_t)w->rows * w->row_bytes);
    free(host);
    return d;
}

static const uint32_t fast_types[] = {TDM_F16,  TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1, TDM_Q5_0,
                                      TDM_Q5_1, TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};

static bool is_quant(uint32_t t) { return t == TDM_Q8_0 || t == TDM_Q4_0; }

Test(cuda_gemv, types_shapes_rows, .timeout = 300) {
    tdm_backend *b = tdm_cu_test_gpu();
    uint64_t rng = 41;
    const int64_t shapes[][2] = {{1, 256}, {67, 768}, {1031, 256}, {300, 4096}, {2, 11008}};
    const int32_t ns[] = {1, 2, 5, 8, 9, 13, 16};
    for (size_t t = 0; t < TDM_ARRAY_LEN(fast_types); t++)
        for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
            tdm_weight w = tdm_test_weight(fast_types[t], shapes[s][0], shapes[s][1], &rng);
            tdm_weight dw = put_packed(b, &w);
            if (is_quant(w.type)) cr_assert_eq(dw.layout, TDM_LAYOUT_QSPLIT, "quantised weights load split");
            for (size_t k = 0; k < TDM_ARRAY_LEN(ns); k++)
                for (int acc = 0; acc < 2; acc++) {
                    const int32_t n = ns[k];
                    const size_t ny = (size_t)n * w.rows;
                    float *x = tdm_test_rand_vec(&rng, (size_t)n * w.cols, -1, 1);
                    float *y0 = tdm_test_rand_vec(&rng, ny, -1, 1), *ref = malloc(ny * 4), *ref32 = malloc(ny * 4);
                    memcpy(ref, y0, ny * 4);
                    memcpy(ref32, y0, ny * 4);
                    float *dx = tdm_cu_test_put(b, x, (size_t)n * w.cols * 4), *dy = tdm_cu_test_put(b, y0, ny * 4);
                    if (!acc) poison(b, dy, ny);
                    OK(b->ops->matmul(b, &dw, dx, n, dy, acc, &err_));
                    float *y = tdm_cu_test_get(b, dy, ny * 4);
                    ref_matmul(&w, x, n, ref32, acc);
                    double e32 = ref_nrm_err(y, ref32, ny);
                    if (is_quant(w.type)) { /* exact against x quantised the same way; close to f32 x */
                        ref_matmul_xq(&w, x, n, ref, acc);
                        double e = ref_nrm_err(y, ref, ny);
                        cr_assert(e < 1e-5, "%s [%lld][%lld] n %d acc %d: err %g against quantised x",
                                  tdm_dtype_name(w.type), (long long)w.rows, (long long)w.cols, n, acc, e);
                        cr_assert(e32 < 2e-2, "%s n %d: err %g against f32 x", tdm_dtype_name(w.type), n, e32);
                    } else {
                        /* (one output value: the error is relative to that one value, which the
                         * accumulated y0 can bring near zero; f32 sums stay within 2e-5 of it) */
                        const double tol = ny < 8 ? 2e-5 : 2e-6;
                        cr_assert(e32 < tol, "%s [%lld][%lld] n %d acc %d: err %g", tdm_dtype_name(w.type),
                                  (long long)w.rows, (long long)w.cols, n, acc, e32);
                    }
                    if (!acc && n > 1) { /* each of the first and last rows alone: bit for bit */
                        const int32_t pick[2] = {0, n - 1};
                        for (int p = 0; p < 2; p++) {
                            float *dy1 = tdm_cu_test_put(b, NULL, (size_t)w.rows * 4);
                            OK(b->ops->matmul(b, &dw, dx + (size_t)pick[p] * w.cols, 1, dy1, false, &err_));
                            float *y1 = tdm_cu_test_get(b, dy1, (size_t)w.rows * 4);
                            cr_assert(memcmp(y1, y + (size_t)pick[p] * w.rows, (size_t)w.rows * 4) == 0,
                                      "%s n %d: row %d alone differs from the batch", tdm_dtype_name(w.type), n,
                                      pick[p]);
                            free(y1);
                            b->ops->free(b, dy1);
                        }
                    }
                    free(y), free(x), free(y0), free(ref), free(ref32);
                    b->ops->free(b, dx);
                    b->ops->free(b, dy);
                }
            b->ops->free(b, (void *)dw.data);
            free((void *)w.data);
        }
    tdm_backend_destroy(b);
}

Test(cuda_gemm, many_rows_each_type, .timeout = 300) {
    tdm_backend *b = tdm_cu_test_gpu();
    uint64_t rng = 43;
    const int64_t shapes[][2] = {{96, 256}, {1030, 512}, {257, 4096}};
    const int32_t ns[] = {17, 40, 130};
    for (size_t t = 0; t < TDM_ARRAY_LEN(fast_types); t++)
        for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
            tdm_weight w = tdm_test_weight(fast_types[t], shapes[s][0], shapes[s][1], &rng);
            tdm_weight dw = put_packed(b, &w);
            for (size_t k = 0; k < TDM_ARRAY_LEN(ns); k++)
                for (int acc = 0; acc < 2; acc++) {
                    const int32_t n = ns[k];
                    const size_t ny = (size_t)n * w.rows;
                    float *x = tdm_test_rand_vec(&rng, (size_t)n * w.cols, -1, 1);
                    float *y0 = tdm_test_rand_vec(&rng, ny, -1, 1), *ref = malloc(ny * 4);
                    memcpy(ref, y0, ny * 4);
                    float *dx = tdm_cu_test_put(b, x, (size_t)n * w.cols * 4), *dy = tdm_cu_test_put(b, y0, ny * 4);
                    if (!acc) poison(b, dy, ny);
                    OK(b->ops->matmul(b, &dw, dx, n, dy, acc, &err_));
                    float *y = tdm_cu_test_get(b, dy, ny * 4);
                    ref_matmul(&w, x, n, ref, acc);
                    const double e = ref_nrm_err(y, ref, ny), tol = w.type == TDM_BF16 ? 2e-2 : 3e-3;
                    cr_assert(e < tol, "%s [%lld][%lld] n %d acc %d: err %g (bound %g)", tdm_dtype_name(w.type),
                              (long long)w.rows, (long long)w.cols, n, acc, e, tol);
                    free(y), free(x), free(y0), free(ref);
                    b->ops->free(b, dx);
                    b->ops->free(b, dy);
                }
            b->ops->free(b, (void *)dw.data);
            free((void *)w.data);
        }
    tdm_backend_destroy(b);
}

/* ---- attention ------------------------------------------------------------------ */

typedef struct flash_case {
    int32_t n_head, n_kv_head, head_dim, block_size;
    int32_t n_seq, lens[4];
    int32_t rows_per_seq; /* the last ones of each sequence attend (causal) */
    bool q8;              /* a q8_0 cache (kernels/kv_layout.h) instead of f16 */
    int32_t window;       /* tdm_attn_args.window (gemma3's sliding layers; the tiled kernels) */
    float softcap;        /* tdm_attn_args.softcap */
} flash_case;

/* Random K / V in [-2, 2] for every slot of n_seq sequences, written into the
 * host caches kr / vr (type ct: f16 or q8_0, the layouts of kernels/backend.h). */
static void fill_caches(uint64_t *rng, int n_seq, const int32_t *lens, const tdm_kv_seq **sp, int32_t nkv, int32_t hd,
                        int32_t bs, uint32_t ct, void *kr, void *vr) {
    const int32_t stride = nkv * hd;
    for (int s = 0; s < n_seq; s++) {
        tdm_batch bt;
        const int32_t len = lens[s];
        cr_assert_eq(tdm_batch_init(&bt, len, NULL), TANDEM_OK);
        for (int32_t i = 0; i < len; i++) tdm_batch_add(&bt, 0, i, s, i, false);
        float *k = tdm_test_rand_vec(rng, (size_t)len * stride, -2, 2), *v = tdm_test_rand_vec(rng, (size_t)len * stride, -2, 2);
        tdm_kv_write_args ar = {&bt, sp, k, v, stride, kr, vr, ct, nkv, hd, bs};
        ref_kv_write(&ar);
        free(k), free(v);
        tdm_batch_free(&bt);
    }
}

/* Caches written on the host (random K / V over shuffled blocks), uploaded; rows
 * of every sequence attend through the attention op (tiles and splits), against
 * ref_attention; then each sequence's last row alone, bit for bit. */
static void run_flash(const flash_case *tc, uint64_t rng) {
    tdm_backend *b = tdm_cu_test_gpu();
    const int32_t bs = tc->block_size, nkv = tc->n_kv_head, hd = tc->head_dim;
    tdm_kv_seq seqs[4] = {0};
    const tdm_kv_seq *sp[4];
    const int32_t n_blocks = tdm_test_shuffled_seqs(&rng, tc->n_seq, tc->lens, bs, 3, seqs, sp);
    const uint32_t ct = tc->q8 ? TDM_Q8_0 : TDM_F16;
    const size_t cbytes = (size_t)n_blocks * nkv * (size_t)tdm_kv_unit_bytes(ct, bs, hd);
    void *kr = calloc(1, cbytes), *vr = calloc(1, cbytes);
    fill_caches(&rng, tc->n_seq, tc->lens, sp, nkv, hd, bs, ct, kr, vr);
    void *kc = tdm_cu_test_put(b, kr, cbytes), *vc = tdm_cu_test_put(b, vr, cbytes);
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, 256, NULL), TANDEM_OK);
    for (int s = 0; s < tc->n_seq; s++)
        for (int32_t p = TDM_MAX(0, tc->lens[s] - tc->rows_per_seq); p < tc->lens[s]; p++) tdm_batch_add(&bt, 0, p, s, p, false);
    const int32_t q_stride = tc->n_head * hd + 2 * nkv * hd;
    const size_t n_out = (size_t)bt.n_rows * tc->n_head * hd;
    float *q = tdm_test_rand_vec(&rng, (size_t)bt.n_rows * q_stride, -1.5f, 1.5f), *ref = calloc(n_out, 4);
    float *dq = tdm_cu_test_put(b, q, (size_t)bt.n_rows * q_stride * 4), *dout = tdm_cu_test_put(b, NULL, n_out * 4);
    poison(b, dout, n_out);
    const float scale = 1.0f / sqrtf((float)hd);
    tdm_attn_args a = {&bt, sp, dq, q_stride, dout, kc, vc, ct, tc->n_head, nkv, hd, bs, scale, tc->window, tc->softcap};
    OK(b->ops->attention(b, &a, &err_));
    tdm_attn_args ar = {&bt, sp, q, q_stride, ref, kr, vr, ct, tc->n_head, nkv, hd, bs, scale, tc->window, tc->softcap};
    ref_attention(&ar);
    float *out = tdm_cu_test_get(b, dout, n_out * 4);
    double e = ref_nrm_err(out, ref, n_out);
    /* a prefill batch on tensor cores: Q and P rounded to f16 */
    const char *tcv = getenv("TANDEM_FLASH_TC");
    const bool tcore = bt.n_rows > GEMV_MAX_ROWS && tcv && !strcmp(tcv, "1") && !tc->window && !tc->softcap;
    const double tol = tcore ? 5e-3 : 1e-5;
    cr_assert(e < tol, "attention %s heads %d/%d hd %d bs %d, %d rows: err %g", tdm_dtype_name(ct), tc->n_head, nkv, hd,
              bs, (int)bt.n_rows, e);
    /* each sequence's last row alone */
    const size_t row_out = (size_t)tc->n_head * hd;
    for (int32_t r = 0; r < bt.n_rows; r++) {
        if (r + 1 < bt.n_rows && bt.seq[r + 1] == bt.seq[r]) continue;
        tdm_batch one;
        cr_assert_eq(tdm_batch_init(&one, 1, NULL), TANDEM_OK);
        tdm_batch_add(&one, 0, bt.pos[r], bt.seq[r], bt.slot[r], false);
        float *d1 = tdm_cu_test_put(b, NULL, row_out * 4);
        tdm_attn_args a1 = a;
        a1.batch = &one;
        a1.q = dq + (size_t)r * q_stride;
        a1.out = d1;
        OK(b->ops->attention(b, &a1, &err_));
        float *o1 = tdm_cu_test_get(b, d1, row_out * 4);
        if (tcore) /* (alone, the row takes the f32 kernels) */
            cr_assert(ref_nrm_err(out + (size_t)r * row_out, o1, row_out) < tol, "hd %d: row %d alone", hd, (int)r);
        else
            cr_assert(memcmp(o1, out + (size_t)r * row_out, row_out * 4) == 0,
                      "hd %d: row %d alone differs from the batch", hd, (int)r);
        free(o1);
        b->ops->free(b, d1);
        tdm_batch_free(&one);
    }
    tdm_batch_free(&bt);
    void *dev[] = {kc, vc, dq, dout};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
    free(kr), free(vr), free(q), free(ref), free(out);
    for (int s = 0; s < tc->n_seq; s++) free(seqs[s].blocks);
    tdm_backend_destroy(b);
}

/* ---- token trees ------------------------------------------------------------------ */

static void run_tree(const tdm_tree_case *tc, uint64_t seed) {
    uint64_t rng = seed;
    tdm_tree_fix f;
    tdm_test_tree_fix_init(&f, tc, &rng);
    const size_t n_out = (size_t)f.bt.n_rows * tc->n_head * tc->head_dim, nq = (size_t)f.bt.n_rows * f.q_stride;
    float *ref = calloc(n_out, 4), *cpu = calloc(n_out, 4);
    tdm_attn_args a = tdm_test_tree_fix_args(&f, tc, ref);
    ref_tree_attention(&a);
    tdm_backend *cb = tdm_test_backend(TDM_CPU_SCALAR, 1), *g = tdm_cu_test_gpu();
    a.out = cpu;
    OK(cb->ops->attention(cb, &a, &err_));
    tdm_backend_destroy(cb);
    tdm_attn_args d = a;
    d.k_cache = tdm_cu_test_put(g, f.kc, f.cache_bytes), d.v_cache = tdm_cu_test_put(g, f.vc, f.cache_bytes);
    d.q = tdm_cu_test_put(g, f.q, nq * 4), d.out = tdm_cu_test_put(g, NULL, n_out * 4);
    poison(g, d.out, n_out);
    OK(g->ops->attention(g, &d, &err_));
    float *got = tdm_cu_test_get(g, d.out, n_out * 4);
    const double e_ref = ref_nrm_err(got, ref, n_out), e_cpu = ref_nrm_err(got, cpu, n_out);
    cr_assert(e_ref < 1e-4 && e_cpu < 1e-4, "tree attention heads %d/%d hd %d %s: error %g (reference), %g (CPU)",
              tc->n_head, tc->n_kv_head, tc->head_dim, tdm_dtype_name(tc->cache_type), e_ref, e_cpu);
#ifndef TDM_TEST_CUDA_ON_CPU /* (the CPU backend has no kv_move op: the engine copies itself) */
    /* kv_move: three slots of sequence 0's tree to the slots after its prefix */
    const int32_t P = tc->prefix[0], src[3] = {P + 5, P + 9, P + 11}, dst[3] = {P, P + 1, P + 2};
    void *kcs[1] = {(void *)d.k_cache}, *vcs[1] = {(void *)d.v_cache};
    const tdm_kv_move_args mv = {&f.seqs[0], src, dst, 3, kcs, vcs, 1, tc->cache_type, tc->n_kv_head, tc->head_dim,
                                 tc->block_size};
    OK(g->ops->kv_move(g, &mv, &err_));
    void *kh = tdm_cu_test_get(g, d.k_cache, f.cache_bytes), *vh = tdm_cu_test_get(g, d.v_cache, f.cache_bytes);
    for (int i = 0; i < 3; i++)
        for (int32_t h = 0; h < tc->n_kv_head; h++)
            for (int32_t x = 0; x < tc->head_dim; x++)
                for (int kv = 0; kv < 2; kv++) {
                    const double want = ref_kv_get(kv ? f.vc : f.kc, tc->cache_type, !kv, &f.seqs[0], src[i], h, x,
                                                   tc->n_kv_head, tc->block_size, tc->head_dim);
                    const double have = ref_kv_get(kv ? vh : kh, tc->cache_type, !kv, &f.seqs[0], dst[i], h, x,
                                                   tc->n_kv_head, tc->block_size, tc->head_dim);
                    cr_assert_eq(have, want, "kv_move: pair %d head %d elem %d (%s)", i, h, x, kv ? "V" : "K");
                }
    free(kh), free(vh);
#endif
    free(got), free(ref), free(cpu);
    g->ops->free(g, (void *)d.k_cache), g->ops->free(g, (void *)d.v_cache), g->ops->free(g, (void *)d.q), g->ops->free(g, d.out);
    tdm_backend_destroy(g);
    tdm_test_tree_fix_free(&f, tc->n_seq);
}

Test(cuda_tree, f16_gqa_three_trees) { run_tree(&(tdm_tree_case){8, 2, 64, 16, TDM_F16, 3, {300, 20, 57}, {64, 9, 33}}, 1); }
Test(cuda_tree, q8_0_hd128) { run_tree(&(tdm_tree_case){4, 4, 128, 16, TDM_Q8_0, 2, {129, 40}, {48, 64}}, 2); }
Test(cuda_tree, f32_hd96_block8) { run_tree(&(tdm_tree_case){6, 3, 96, 8, TDM_F32, 1, {1000}, {40}}, 3); }
Test(cuda_tree, f16_hd256_and_hd32) {
    run_tree(&(tdm_tree_case){4, 1, 256, 16, TDM_F16, 1, {70}, {64}}, 4);
    run_tree(&(tdm_tree_case){2, 2, 32, 32, TDM_F16, 2, {33, 12}, {20, 30}}, 5);
}

Test(cuda_flash, decode_mha_hd128) { run_flash(&(flash_case){32, 32, 128, 16, 1, {300}, 1}, 1); }
Test(cuda_flash, gqa_8_chains_three_sequences) { run_flash(&(flash_case){32, 8, 128, 16, 3, {1000, 37, 129}, 5}, 2); }
Test(cuda_flash, prefill_64_rows_hd64) { run_flash(&(flash_case){12, 12, 64, 16, 1, {64}, 64}, 3); }
Test(cuda_flash, hd80_block8) { run_flash(&(flash_case){8, 2, 80, 8, 2, {45, 300}, 3}, 4); }
Test(cuda_flash, hd96_block32_verification) { run_flash(&(flash_case){6, 2, 96, 32, 1, {200}, 13}, 5); }
Test(cuda_flash, hd256) { run_flash(&(flash_case){4, 1, 256, 16, 2, {257, 31}, 2}, 6); }
Test(cuda_flash, long_context_4099) { run_flash(&(flash_case){32, 4, 64, 16, 1, {4099}, 1}, 7); }
Test(cuda_flash, group_of_three_four_sequences) { run_flash(&(flash_case){6, 2, 64, 16, 4, {5, 130, 1, 77}, 4}, 8); }
Test(cuda_flash, wide_group_split_across_blocks) { run_flash(&(flash_case){32, 1, 64, 16, 1, {100}, 3}, 9); }
/* prefill batches, on the f32 tiles and (TANDEM_FLASH_TC=1) on tensor cores: every
 * head dim, GQA, two sequences, block sizes 8 / 16 / 32, tiles cut short at a
 * sequence's end */
static void run_flash_both(const flash_case *tc, uint64_t rng) {
    run_flash(tc, rng);
    setenv("TANDEM_FLASH_TC", "1", 1);
    run_flash(tc, rng);
    unsetenv("TANDEM_FLASH_TC");
}
Test(cuda_flash, prefill_gqa_hd128_two_sequences) { run_flash_both(&(flash_case){32, 8, 128, 16, 2, {150, 400}, 100}, 10); }
Test(cuda_flash, prefill_hd80_block8) { run_flash_both(&(flash_case){8, 2, 80, 8, 1, {77}, 40}, 11); }
Test(cuda_flash, prefill_hd96_block32) { run_flash_both(&(flash_case){6, 2, 96, 32, 2, {70, 20}, 20}, 12); }
Test(cuda_flash, prefill_hd256) { run_flash_both(&(flash_case){4, 1, 256, 16, 1, {300}, 33}, 13); }
Test(cuda_flash, prefill_64_rows_hd64_tensor_cores) { run_flash_both(&(flash_case){12, 12, 64, 16, 1, {64}, 64}, 3); }
/* a q8_0 cache: int8 quants staged with their scales (tensor cores: dequantised to
 * f16), against the reference over the dequantised cache */
Test(cuda_flash, q8_gqa_8_chains_three_sequences) { run_flash(&(flash_case){32, 8, 128, 16, 3, {1000, 37, 129}, 5, true}, 41); }
Test(cuda_flash, q8_hd80_block8) { run_flash(&(flash_case){8, 2, 80, 8, 2, {45, 300}, 3, true}, 42); }
Test(cuda_flash, q8_group_of_three) { run_flash(&(flash_case){6, 2, 64, 16, 4, {5, 130, 1, 77}, 4, true}, 43); }
Test(cuda_flash, q8_prefill_hd64) { run_flash_both(&(flash_case){12, 12, 64, 16, 1, {64}, 64, true}, 44); }
Test(cuda_flash, q8_prefill_hd96_block32) { run_flash_both(&(flash_case){6, 2, 96, 32, 2, {70, 20}, 20, true}, 45); }
Test(cuda_flash, q8_prefill_hd256) { run_flash_both(&(flash_case){4, 1, 256, 16, 1, {300}, 33, true}, 46); }
/* gemma3's attention: a sliding window shorter than the context (decode, verification
 * and prefill rows, windows cutting blocks mid-way) and logit soft-capping, alone and
 * together, f16 and q8_0, head dims 256 and 128 (the tiled kernels) */
Test(cuda_flash, window_decode_and_prefill) {
    run_flash(&(flash_case){4, 1, 256, 16, 2, {300, 31}, 40, false, 37, 0}, 51);
    run_flash(&(flash_case){8, 2, 128, 16, 3, {1000, 37, 9}, 5, false, 512, 0}, 52);
    run_flash(&(flash_case){8, 2, 128, 16, 3, {1000, 37, 9}, 5, true, 100, 0}, 53);
}
Test(cuda_flash, softcap_and_window_with_softcap) {
    run_flash(&(flash_case){8, 2, 128, 16, 2, {200, 64}, 13, false, 0, 1.5f}, 54);
    run_flash(&(flash_case){4, 1, 256, 16, 1, {300}, 33, false, 64, 2.0f}, 55);
    run_flash(&(flash_case){4, 1, 256, 16, 1, {300}, 33, true, 64, 2.0f}, 56);
}

/* Batched decode / verification attention (the decode kernel, cuda_decode_attn.cu):
 * 64 sequences of mixed lengths 1 .. 4099 (split and block edges among them), the
 * last rows_per_seq rows of each attending; against ref_attention, each
 * sequence's last row alone bit for bit, and the whole batch bit for bit against
 * the tiled kernel (TANDEM_FLASH_DECODE=0). */
typedef struct decode_case {
    int32_t n_head, n_kv_head, head_dim, block_size, rows_per_seq;
    bool q8; /* a q8_0 cache instead of f16 */
} decode_case;

static void run_decode_batch(const decode_case *tc, uint64_t rng) {
    enum { N_SEQ = 64 };
    static const int32_t edges[] = {1, 4099, 2, 255, 256, 257, 31, 32, 33, 511, 512, 513, 1000, 17, 4096, 8};
    tdm_backend *b = tdm_cu_test_gpu();
    const int32_t bs = tc->block_size, nkv = tc->n_kv_head, hd = tc->head_dim, stride = nkv * hd;
    int32_t lens[N_SEQ];
    for (int s = 0; s < N_SEQ; s++)
        lens[s] = s < (int)TDM_ARRAY_LEN(edges) ? edges[s] : 1 + (int32_t)(tdm_test_rand(&rng) % 1200);
    tdm_kv_seq seqs[N_SEQ];
    const tdm_kv_seq *sp[N_SEQ];
    const int32_t n_blocks = tdm_test_shuffled_seqs(&rng, N_SEQ, lens, bs, 3, seqs, sp);
    const uint32_t ct = tc->q8 ? TDM_Q8_0 : TDM_F16;
    const size_t cbytes = (size_t)n_blocks * nkv * (size_t)tdm_kv_unit_bytes(ct, bs, hd);
    void *kr = calloc(1, cbytes), *vr = calloc(1, cbytes);
    cr_assert(kr && vr);
    fill_caches(&rng, N_SEQ, lens, sp, nkv, hd, bs, ct, kr, vr);
    void *kc = tdm_cu_test_put(b, kr, cbytes), *vc = tdm_cu_test_put(b, vr, cbytes);
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, N_SEQ * tc->rows_per_seq, NULL), TANDEM_OK);
    for (int s = 0; s < N_SEQ; s++)
        for (int32_t p = TDM_MAX(0, lens[s] - tc->rows_per_seq); p < lens[s]; p++) tdm_batch_add(&bt, 0, p, s, p, false);
    const int32_t q_stride = tc->n_head * hd + 2 * stride;
    const size_t n_out = (size_t)bt.n_rows * tc->n_head * hd, row_out = (size_t)tc->n_head * hd;
    float *q = tdm_test_rand_vec(&rng, (size_t)bt.n_rows * q_stride, -1.5f, 1.5f), *ref = calloc(n_out, 4);
    float *dq = tdm_cu_test_put(b, q, (size_t)bt.n_rows * q_stride * 4), *dout = tdm_cu_test_put(b, NULL, n_out * 4);
    poison(b, dout, n_out);
    const float scale = 1.0f / sqrtf((float)hd);
    tdm_attn_args a = {&bt, sp, dq, q_stride, dout, kc, vc, ct, tc->n_head, nkv, hd, bs, scale, 0, 0};
    OK(b->ops->attention(b, &a, &err_));
    float *out = tdm_cu_test_get(b, dout, n_out * 4);
    tdm_attn_args ar = {&bt, sp, q, q_stride, ref, kr, vr, ct, tc->n_head, nkv, hd, bs, scale, 0, 0};
    ref_attention(&ar);
    const double e = ref_nrm_err(out, ref, n_out);
    cr_assert(e < 1e-5, "decode attention heads %d/%d hd %d bs %d, %d rows: err %g", tc->n_head, nkv, hd, bs,
              (int)bt.n_rows, e);
    for (int32_t r = 0; r < bt.n_rows; r++) /* every row on its own too (short rows hide in the batch norm) */
        cr_assert(ref_nrm_err(out + (size_t)r * row_out, ref + (size_t)r * row_out, row_out) < 1e-4,
                  "hd %d: row %d (sequence %d, %d keys)", hd, (int)r, (int)bt.seq[r], (int)bt.n_visible[r]);
    /* the tiled kernel on the same batch: the same bits */
    setenv("TANDEM_FLASH_DECODE", "0", 1);
    poison(b, dout, n_out);
    OK(b->ops->attention(b, &a, &err_));
    unsetenv("TANDEM_FLASH_DECODE");
    float *out_t = tdm_cu_test_get(b, dout, n_out * 4);
    for (int32_t r = 0; r < bt.n_rows; r++)
        cr_assert(memcmp(out_t + (size_t)r * row_out, out + (size_t)r * row_out, row_out * 4) == 0,
                  "hd %d: row %d: the tiled kernel differs from the decode kernel", hd, (int)r);
    /* each sequence's last row alone */
    float *d1 = tdm_cu_test_put(b, NULL, row_out * 4);
    for (int32_t r = 0; r < bt.n_rows; r++) {
        if (r + 1 < bt.n_rows && bt.seq[r + 1] == bt.seq[r]) continue;
        tdm_batch one;
        cr_assert_eq(tdm_batch_init(&one, 1, NULL), TANDEM_OK);
        tdm_batch_add(&one, 0, bt.pos[r], bt.seq[r], bt.slot[r], false);
        tdm_attn_args a1 = a;
        a1.batch = &one;
        a1.q = dq + (size_t)r * q_stride;
        a1.out = d1;
        poison(b, d1, row_out);
        OK(b->ops->attention(b, &a1, &err_));
        float *o1 = tdm_cu_test_get(b, d1, row_out * 4);
        cr_assert(memcmp(o1, out + (size_t)r * row_out, row_out * 4) == 0, "hd %d: row %d alone differs from the batch",
                  hd, (int)r);
        free(o1);
        tdm_batch_free(&one);
    }
    tdm_batch_free(&bt);
    void *dev[] = {kc, vc, dq, dout, d1};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
    free(kr), free(vr), free(q), free(ref), free(out), free(out_t);
    for (int s = 0; s < N_SEQ; s++) free(seqs[s].blocks);
    tdm_backend_destroy(b);
}

#define DECODE_TEST(name, seed, ...) \
    Test(cuda_flash_decode, name, .timeout = 600) { run_decode_batch(&(decode_case){__VA_ARGS__}, seed); }
/* heads, kv heads, head dim, block size, rows per sequence */
DECODE_TEST(mha_32_hd128_bs16_decode, 21, 32, 32, 128, 16, 1)
DECODE_TEST(gqa_32_8_hd128_bs16_decode, 22, 32, 8, 128, 16, 1)
DECODE_TEST(gqa_32_8_hd128_bs32_verify5, 23, 32, 8, 128, 32, 5)
DECODE_TEST(mha_8_hd128_bs8_verify5, 24, 8, 8, 128, 8, 5)
DECODE_TEST(mha_8_hd64_bs8_decode, 25, 8, 8, 64, 8, 1)
DECODE_TEST(gqa_8_2_hd64_bs16_verify5, 26, 8, 2, 64, 16, 5)
DECODE_TEST(gqa_8_2_hd80_bs8_decode, 27, 8, 2, 80, 8, 1)
DECODE_TEST(mha_6_hd80_bs32_verify5, 28, 6, 6, 80, 32, 5)
DECODE_TEST(gqa_12_4_hd96_bs32_decode, 29, 12, 4, 96, 32, 1)
DECODE_TEST(gqa_12_4_hd96_bs16_verify5, 30, 12, 4, 96, 16, 5)
DECODE_TEST(mha_4_hd256_bs16_decode, 31, 4, 4, 256, 16, 1)
DECODE_TEST(gqa_8_2_hd256_bs8_verify5, 32, 8, 2, 256, 8, 5)
DECODE_TEST(gqa_32_4_hd128_bs16_verify5, 33, 32, 4, 128, 16, 5)
/* q8_0 caches */
DECODE_TEST(q8_gqa_32_8_hd128_bs16_verify5, 51, 32, 8, 128, 16, 5, true)
DECODE_TEST(q8_mha_8_hd64_bs8_decode, 52, 8, 8, 64, 8, 1, true)
DECODE_TEST(q8_gqa_8_2_hd80_bs32_verify5, 53, 8, 2, 80, 32, 5, true)
DECODE_TEST(q8_gqa_8_2_hd256_bs16_decode, 54, 8, 2, 256, 16, 1, true)

/* ---- the fused forward ---------------------------------------------------------- */

/* A prefill of 40 rows, then decode and verification batches of 1, 5 and 1 rows
 * three times each (direct, captured, replayed): the blocks op equals the op-by-op
 * forward on the GPU, comes close to the CPU's, and repeats exactly. */
static void check_fused_kv(uint32_t wtype, int32_t n_embd, int32_t n_head, int32_t n_head_kv, int32_t n_ff,
                           bool graphs, uint32_t kv_type) {
    tdm_tiny_cfg tc = tdm_tiny_default();
    tc.wtype = wtype;
    tc.n_embd = n_embd, tc.n_head = n_head, tc.n_head_kv = n_head_kv, tc.n_ff = n_ff, tc.n_layer = 2;
    tc.untied_output = true;
    tc.seed = 5 + wtype;
    char *path = tdm_tiny_model_file(&tc);
    tdm_backend *cpu = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &cpu, &err), TANDEM_OK, "%s", err.msg);
    tdm_cu_rig rg, ro, rc;
    tdm_cu_rig_open_kv(&rg, tdm_cu_test_gpu(), path, 16, kv_type);
    tdm_cu_rig_open_kv(&ro, tdm_cu_test_gpu(), path, 16, kv_type);
    tdm_cu_rig_open_kv(&rc, cpu, path, 16, kv_type);
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
         * GPU's read f32 x */
        const bool cpu_int8 = is_quant(wtype) || tdm_dtype_block_elems(wtype) > 1;
        double tol_cpu = cpu_int8 ? 1e-1 : wtype == TDM_BF16 ? 2e-2 : big ? 3e-3 : 2e-3;
        /* q8_0 K / V: the GPU's f16 prefill activations move some quants a step from
         * the CPU's; fused (RoPE + quantisation in one kernel) and op by op may too,
         * where a value lands a rounding away from a half step */
        if (kv_type == TDM_Q8_0) tol_cpu = TDM_MAX(tol_cpu, 2e-2);
        const double tol_ops = kv_type == TDM_Q8_0 ? 1e-4 : 1e-5;
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
    tdm_cu_rig_close(&rg);
    tdm_cu_rig_close(&ro);
    tdm_cu_rig_close(&rc);
    unlink(path);
    free(path);
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
Test(cuda_fused, bf16_mha_hd64, .timeout = 300) { check_fused(TDM_BF16, 256, 4, 4, 512, true); }
Test(cuda_fused, q8_0_split_layout, .timeout = 300) { check_fused(TDM_Q8_0, 512, 4, 2, 768, true); }
Test(cuda_fused, q4_0_split_layout, .timeout = 300) { check_fused(TDM_Q4_0, 512, 8, 2, 1024, true); }
/* widths whose quantised rows are not 16-byte aligned (the generic kernels, rows
 * layout) and a head dim the tiled attention does not know (48: the op's) */
Test(cuda_fused, q8_0_odd_width_generic, .timeout = 300) { check_fused(TDM_Q8_0, 96, 2, 1, 160, false); }
/* the K-quants and Q5_0 (rows layout, dequantised in registers; f16 for cuBLAS) */
Test(cuda_fused, q4_k_rows, .timeout = 300) { check_fused(TDM_Q4_K, 512, 8, 2, 1024, true); }
Test(cuda_fused, q6_k_rows, .timeout = 300) { check_fused(TDM_Q6_K, 256, 4, 4, 512, true); }
Test(cuda_fused, q5_0_rows, .timeout = 300) { check_fused(TDM_Q5_0, 256, 4, 2, 512, true); }

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
    const tdm_weight wt = {TDM_F32, D, E, E * 4, wh, 0};
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
