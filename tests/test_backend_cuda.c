/* test_backend_cuda.c - the CUDA backend against the reference ops (tests/ref_ops.c)
 * and against the CPU backend on the real target model, by normalised error, as
 * llama.cpp's test-backend-ops compares backends.
 *
 * Without a CUDA device (or in a build without CUDA) the program prints why and
 * exits with 77, which meson reports as skipped. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "backend_testutil.h"
#include "cuda_testutil.h"
#include "engine.h"
#include "grammar.h"
#include "model.h"
#include "nonfinite_testutil.h"
#include "ref_ops.h"
#include "sampling.h"
#include "spec_ws.h"
#include "tandem.h"
#include "stats.h"
#include "testutil.h"
#include "tiny_model.h"
#include <unistd.h>

#define gpu tdm_cu_test_gpu
#define put tdm_cu_test_put
#define get tdm_cu_test_get
#define put_weight tdm_cu_test_put_weight

Test(cuda_backend, memory_ops) {
    tdm_backend *b = gpu();
    tdm_err err = {0};
    uint8_t src[1000], back[1000];
    for (int i = 0; i < 1000; i++) src[i] = (uint8_t)(i * 7);
    void *d1 = NULL, *d2 = NULL;
    OK(b->ops->alloc(b, 1000, &d1, &err_));
    uint8_t *z = get(b, d1, 1000);
    for (int i = 0; i < 1000; i++) cr_assert_eq(z[i], 0, "alloc is not zeroed at %d", i);
    free(z);
    OK(b->ops->alloc(b, 1000, &d2, &err_));
    OK(b->ops->upload(b, d1, src, 1000, &err_));
    OK(b->ops->copy(b, d2, d1, 1000, &err_));
    OK(b->ops->download(b, back, d2, 1000, &err_));
    cr_assert(memcmp(src, back, 1000) == 0);
    OK(b->ops->sync(b, &err_));
    /* an impossible allocation is an error, not a crash */
    void *huge = NULL;
    cr_assert_neq(b->ops->alloc(b, (size_t)1 << 50, &huge, &err), TANDEM_OK);
    cr_assert_null(huge);
    b->ops->free(b, d1);
    b->ops->free(b, d2);
    b->ops->free(b, NULL);
    tdm_backend_destroy(b);
}

static const uint32_t types[] = {TDM_F32,  TDM_F16,  TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1, TDM_Q5_0,
                                 TDM_Q5_1, TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};

Test(cuda_ops, get_rows_all_types) {
    tdm_backend *b = gpu();
    uint64_t rng = 11;
    for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++) {
        /* 96 columns, or one K-quant super-block of 256 */
        const int64_t cols = tdm_dtype_is_kquant(types[t]) ? 256 : 96;
        tdm_weight w = tdm_test_weight(types[t], 50, cols, &rng);
        tdm_weight dw = put_weight(b, &w);
        int32_t ids[7] = {0, 49, 3, 3, 17, 48, 25};
        float *out = put(b, NULL, 7 * 256 * 4), ref[7 * 256];
        OK(b->ops->get_rows(b, &dw, ids, 7, out, &err_));
        ref_get_rows(&w, ids, 7, ref);
        float *h = get(b, out, (size_t)(7 * cols * 4));
        cr_assert(memcmp(h, ref, (size_t)(7 * cols * 4)) == 0, "get_rows %s differs (dequantisation not bit-exact)",
                  tdm_dtype_name(types[t]));
        int32_t bad = 50;
        tdm_err err = {0};
        cr_assert_eq(b->ops->get_rows(b, &dw, &bad, 1, out, &err), TANDEM_ERR_INVALID_ARG);
        free(h);
        b->ops->free(b, out);
        b->ops->free(b, (void *)dw.data);
        free((void *)w.data);
    }
    tdm_backend_destroy(b);
}

Test(cuda_ops, row_ops) {
    tdm_backend *b = gpu();
    uint64_t rng = 5;
    const int32_t n = 5, dim = 200, ff = 150, stride = 7 * 32 + 5;
    float *x = tdm_test_rand_vec(&rng, (size_t)n * dim, -3, 3), *g = tdm_test_rand_vec(&rng, dim, -2, 2);
    float *gu = tdm_test_rand_vec(&rng, (size_t)n * 2 * ff, -12, 12);
    float *q = tdm_test_rand_vec(&rng, (size_t)n * stride, -2, 2);
    float *dx = put(b, x, (size_t)n * dim * 4), *dg = put(b, g, dim * 4), *dgu = put(b, gu, (size_t)n * 2 * ff * 4);
    float *dout = put(b, NULL, (size_t)n * 2 * ff * 4), *ref = malloc((size_t)n * 2 * ff * 4);

    OK(b->ops->rmsnorm(b, dx, dg, n, dim, 1e-5f, dout, &err_));
    ref_rmsnorm(x, g, n, dim, 1e-5f, ref);
    float *h = get(b, dout, (size_t)n * dim * 4);
    cr_assert(ref_nrm_err(h, ref, (size_t)n * dim) < 1e-6, "rmsnorm");
    free(h);

    OK(b->ops->add_bias(b, dx, dg, n, dim, &err_));
    memcpy(ref, x, (size_t)n * dim * 4);
    ref_add_bias(ref, g, n, dim);
    h = get(b, dx, (size_t)n * dim * 4);
    cr_assert(memcmp(h, ref, (size_t)n * dim * 4) == 0, "add_bias");
    free(h);

    OK(b->ops->swiglu(b, dgu, n, ff, dout, &err_));
    ref_swiglu(gu, n, ff, ref);
    h = get(b, dout, (size_t)n * ff * 4);
    cr_assert(ref_nrm_err(h, ref, (size_t)n * ff) < 1e-6, "swiglu");
    free(h);

    int32_t rows[3] = {4, 0, 4};
    OK(b->ops->gather_rows(b, dx, rows, 3, dim, dout, &err_));
    h = get(b, dout, 3 * dim * 4);
    float *xb = get(b, dx, (size_t)n * dim * 4);
    ref_gather_rows(xb, rows, 3, dim, ref);
    cr_assert(memcmp(h, ref, 3 * dim * 4) == 0, "gather_rows");
    free(h);
    free(xb);

    int32_t pos[5] = {0, 1, 17, 1000, 4095};
    for (int neox = 0; neox < 2; neox++) {
        tdm_rope_params rp = {.n_rot = 24, .freq_base = 10000, .freq_scale = 0.5f, .neox = neox};
        float *dq = put(b, q, (size_t)n * stride * 4);
        OK(b->ops->rope(b, dq, n, stride, 7, 32, pos, &rp, &err_));
        memcpy(ref, q, (size_t)n * stride * 4);
        ref_rope(ref, n, stride, 7, 32, pos, &rp);
        h = get(b, dq, (size_t)n * stride * 4);
        cr_assert(ref_nrm_err(h, ref, (size_t)n * stride) < 1e-6, "rope neox %d", neox);
        free(h);
        b->ops->free(b, dq);
    }
    /* bad arguments: clear errors */
    tdm_err err = {0};
    cr_assert_eq(b->ops->rmsnorm(b, dx, dg, -1, dim, 1e-5f, dout, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->rope(b, dx, n, stride, 7, 32, NULL, &(tdm_rope_params){24, 1e4f, 1, false, NULL, 0}, &err),
                 TANDEM_ERR_INVALID_ARG);
    tdm_backend *cpu = tdm_test_backend(TDM_CPU_SCALAR, 1);
    cr_assert_eq(b->ops->rmsnorm(cpu, x, g, n, dim, 1e-5f, ref, &err), TANDEM_ERR_INVALID_ARG,
                 "a CUDA op given a CPU backend");
    tdm_backend_destroy(cpu);

    void *dev[] = {dx, dg, dgu, dout};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
    free(x), free(g), free(gu), free(q), free(ref);
    tdm_backend_destroy(b);
}

/* scatter_cols (a draft head over part of the vocabulary, draft_vocab) equals the CPU
 * backend's op bit for bit: rows of the head's logits placed at their ids, the fill
 * everywhere else; a bad shape is refused. */
Test(cuda_ops, scatter_cols_equals_cpu) {
    tdm_backend *b = gpu(), *cpu = tdm_test_backend(TDM_CPU_SCALAR, 1);
    uint64_t rng = 9;
    const int32_t n = 3, dim = 5000;
    int32_t ids[1100], nx = 0;
    for (int32_t v = 0; v < dim && nx < 1100; v++)
        if (v < 1024 || v % 97 == 5) ids[nx++] = v;
    float *x = tdm_test_rand_vec(&rng, (size_t)n * nx, -20, 20), *want = malloc((size_t)n * dim * 4);
    float *dx = put(b, x, (size_t)n * nx * 4), *dy = put(b, NULL, (size_t)n * dim * 4);
    int32_t *dids = put(b, ids, (size_t)nx * 4);
    tdm_cu_test_poison(b, dy, (size_t)n * dim);
    OK(b->ops->scatter_cols(b, dx, n, nx, dids, dim, TDM_LOGIT_NONE, dy, &err_));
    OK(cpu->ops->scatter_cols(cpu, x, n, nx, ids, dim, TDM_LOGIT_NONE, want, &err_));
    float *got = get(b, dy, (size_t)n * dim * 4);
    cr_assert(memcmp(got, want, (size_t)n * dim * 4) == 0, "scatter_cols differs from the CPU's");
    tdm_err err = {0};
    cr_assert_eq(b->ops->scatter_cols(b, dx, n, dim + 1, dids, dim, 0, dy, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->scatter_cols(b, dx, -1, nx, dids, dim, 0, dy, &err), TANDEM_ERR_INVALID_ARG);
    OK(b->ops->scatter_cols(b, dx, 0, nx, dids, dim, 0, dy, &err_));
    b->ops->free(b, dx), b->ops->free(b, dy), b->ops->free(b, dids);
    free(x), free(want), free(got);
    tdm_backend_destroy(cpu);
    tdm_backend_destroy(b);
}

/* mask_rows (grammar-constrained decoding's token masks) equals the CPU backend's op
 * bit for bit, which is tdm_logits_mask row by row: disallowed columns get the fill,
 * the others keep their logits (a width not a multiple of 32, words of every kind);
 * a bad shape is refused. */
Test(cuda_ops, mask_rows_equals_cpu) {
    tdm_backend *b = gpu(), *cpu = tdm_test_backend(TDM_CPU_SCALAR, 1);
    uint64_t rng = 11;
    const int32_t n = 5, dim = 5003;
    const size_t W = ((size_t)dim + 31) / 32;
    uint32_t *mask = tdm_test_rand_mask(&rng, (size_t)n * W);
    float *x = tdm_test_rand_vec(&rng, (size_t)n * dim, -20, 20), *want = malloc((size_t)n * dim * 4);
    memcpy(want, x, (size_t)n * dim * 4);
    float *dx = put(b, x, (size_t)n * dim * 4);
    uint32_t *dm = put(b, mask, (size_t)n * W * 4);
    OK(b->ops->mask_rows(b, dx, n, dim, dm, TDM_LOGIT_NONE, &err_));
    OK(cpu->ops->mask_rows(cpu, want, n, dim, mask, TDM_LOGIT_NONE, &err_));
    float *got = get(b, dx, (size_t)n * dim * 4);
    cr_assert(memcmp(got, want, (size_t)n * dim * 4) == 0, "mask_rows differs from the CPU's");
    int32_t masked = 0;
    for (int32_t i = 0; i < n; i++)
        for (int32_t v = 0; v < dim; v++) {
            const bool on = mask[(size_t)i * W + (size_t)v / 32] >> (v % 32) & 1;
            cr_assert_eq(got[(size_t)i * dim + v], on ? x[(size_t)i * dim + v] : TDM_LOGIT_NONE);
            masked += !on;
        }
    cr_assert_gt(masked, 0);
    tdm_err err = {0};
    cr_assert_eq(b->ops->mask_rows(b, dx, -1, dim, dm, 0, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->mask_rows(b, dx, n, 0, dm, 0, &err), TANDEM_ERR_INVALID_ARG);
    OK(b->ops->mask_rows(b, dx, 0, dim, dm, 0, &err_));
    b->ops->free(b, dx), b->ops->free(b, dm);
    free(x), free(want), free(got), free(mask);
    tdm_backend_destroy(cpu);
    tdm_backend_destroy(b);
}

/* edit_rows (penalties, logit_bias, min_tokens) equals the CPU backend's op bit for
 * bit: rows of no edit, a few, and thousands (more than a block's threads), every
 * kind of edit (bias, repetition's division / multiplication, subtraction,
 * suppression); a bad shape is refused. */
Test(cuda_ops, edit_rows_equals_cpu) {
    tdm_backend *b = gpu(), *cpu = tdm_test_backend(TDM_CPU_SCALAR, 1);
    uint64_t rng = 17;
    const int32_t n = 6, dim = 5003;
    const int32_t per_row[6] = {0, 3, 1, 3000, 0, 257};
    int32_t off[7] = {0};
    for (int32_t i = 0; i < n; i++) off[i + 1] = off[i] + per_row[i];
    tdm_logit_edit *ed = malloc((size_t)off[n] * sizeof *ed);
    int32_t *perm = malloc((size_t)dim * sizeof *perm);
    for (int32_t i = 0; i < n; i++) {
        for (int32_t v = 0; v < dim; v++) perm[v] = v;
        for (int32_t j = 0; j < per_row[i]; j++) { /* (distinct ids: a partial shuffle) */
            const int32_t at = j + (int32_t)(tdm_test_rand(&rng) % (uint64_t)(dim - j));
            const int32_t t = perm[at];
            perm[at] = perm[j], perm[j] = t;
            tdm_logit_edit *e = &ed[off[i] + j];
            const float r = 1.0f + (float)(tdm_test_rand(&rng) % 100) / 50.0f;
            *e = (tdm_logit_edit){t, (float)(tdm_test_rand(&rng) % 200) - 100.0f, 1.0f / r, r,
                                  -(float)(tdm_test_rand(&rng) % 7) * 0.6f};
            if (j % 11 == 5) *e = (tdm_logit_edit){t, 0, 0, 0, TDM_LOGIT_NONE};
        }
    }
    float *x = tdm_test_rand_vec(&rng, (size_t)n * dim, -20, 20), *want = malloc((size_t)n * dim * 4);
    memcpy(want, x, (size_t)n * dim * 4);
    float *dx = put(b, x, (size_t)n * dim * 4);
    tdm_logit_edit *ded = put(b, ed, (size_t)off[n] * sizeof *ed);
    int32_t *doff = put(b, off, sizeof off);
    OK(b->ops->edit_rows(b, dx, n, dim, ded, doff, &err_));
    OK(cpu->ops->edit_rows(cpu, want, n, dim, ed, off, &err_));
    float *got = get(b, dx, (size_t)n * dim * 4);
    cr_assert(memcmp(got, want, (size_t)n * dim * 4) == 0, "edit_rows differs from the CPU's");
    cr_assert(memcmp(want, x, (size_t)n * dim * 4) != 0);
    tdm_err err = {0};
    cr_assert_eq(b->ops->edit_rows(b, dx, -1, dim, ded, doff, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->edit_rows(b, dx, n, 0, ded, doff, &err), TANDEM_ERR_INVALID_ARG);
    OK(b->ops->edit_rows(b, dx, 0, dim, ded, doff, &err_));
    b->ops->free(b, dx), b->ops->free(b, ded), b->ops->free(b, doff);
    free(x), free(want), free(got), free(ed), free(perm);
    tdm_backend_destroy(cpu);
    tdm_backend_destroy(b);
}

/* row_top (the logprobs summary of device rows) equals the CPU backend's op: the
 * same ids and logits bit for bit (ties to the lower id: a row of many ties), the
 * logsumexp within 1e-6 relative, the asked-for logit; k 0, a row of masked logits,
 * a width above the block's threads many times over; a bad k is refused. */
Test(cuda_ops, row_top_equals_cpu) {
    tdm_backend *b = gpu(), *cpu = tdm_test_backend(TDM_CPU_SCALAR, 1);
    uint64_t rng = 23;
    const int32_t n = 5, dim = 151936;
    float *x = tdm_test_rand_vec(&rng, (size_t)n * dim, -20, 20);
    for (int32_t v = 0; v < dim; v++) x[(size_t)dim + v] = (float)(v % 37); /* (ties) */
    for (int32_t v = 0; v < dim; v += 3) x[2 * (size_t)dim + v] = TDM_LOGIT_NONE;
    const int32_t want[5] = {0, 36, 151935, -1, 77};
    float *dx = put(b, x, (size_t)n * dim * 4);
    int32_t *dw = put(b, want, sizeof want);
    tdm_row_top *dout = NULL, got[5], ref[5];
    OK(b->ops->alloc(b, sizeof got, (void **)&dout, &err_));
    for (int32_t k = 0; k <= TDM_ROW_TOP_MAX; k += 5) {
        OK(b->ops->row_top(b, dx, n, dim, k, dw, dout, &err_));
        OK(b->ops->download(b, got, dout, sizeof got, &err_));
        OK(cpu->ops->row_top(cpu, x, n, dim, k, want, ref, &err_));
        for (int32_t i = 0; i < n; i++) {
            cr_assert_eq(got[i].k, k);
            cr_assert(fabs(got[i].lse - ref[i].lse) <= 1e-6 * fmax(1.0, fabs(ref[i].lse)), "row %d: lse %.9g, CPU %.9g",
                      (int)i, got[i].lse, ref[i].lse);
            cr_assert_eq(got[i].want, ref[i].want, "row %d", (int)i);
            for (int32_t j = 0; j < k; j++)
                cr_assert(got[i].ids[j] == ref[i].ids[j] && got[i].val[j] == ref[i].val[j],
                          "row %d, k %d, entry %d: %d (%g), CPU %d (%g)", (int)i, (int)k, (int)j, got[i].ids[j],
                          got[i].val[j], ref[i].ids[j], ref[i].val[j]);
        }
    }
    tdm_err err = {0};
    cr_assert_eq(b->ops->row_top(b, dx, n, dim, TDM_ROW_TOP_MAX + 1, dw, dout, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->row_top(b, dx, -1, dim, 1, dw, dout, &err), TANDEM_ERR_INVALID_ARG);
    OK(b->ops->row_top(b, dx, 0, dim, 1, dw, dout, &err_));
    b->ops->free(b, dx), b->ops->free(b, dw), b->ops->free(b, dout);
    free(x);
    tdm_backend_destroy(cpu);
    tdm_backend_destroy(b);
}

/* Every type and several shapes and batch sizes against ref_matmul; up to the row
 * kernels' limit each row of a batch equals, bit for bit, the same row computed
 * alone. */
#define TDM_TEST_CUDA_GEMV_MAX_ROWS 16 /* (kernels/cuda/cuda_internal.h) */
Test(cuda_matmul, types_shapes_batches) {
    tdm_backend *b = gpu();
    uint64_t rng = 3;
    /* (cols % 8 != 0: the element-wise kernel for 16-bit types too) */
    const int64_t shapes[][2] = {{1, 32}, {67, 96}, {384, 384}, {1030, 128}, {8, 1024}, {13, 100}, {67, 768}};
    const int32_t ns[] = {1, 3, 8, 9, 20};
    for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++)
        for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
            if (shapes[s][1] % tdm_dtype_block_elems(types[t]) != 0) continue;
            tdm_weight w = tdm_test_weight(types[t], shapes[s][0], shapes[s][1], &rng);
            tdm_weight dw = put_weight(b, &w);
            for (size_t k = 0; k < TDM_ARRAY_LEN(ns); k++)
                for (int acc = 0; acc < 2; acc++) {
                    const int32_t n = ns[k];
                    const size_t ny = (size_t)n * w.rows;
                    float *x = tdm_test_rand_vec(&rng, (size_t)n * w.cols, -1, 1), *y0 = tdm_test_rand_vec(&rng, ny, -1, 1);
                    float *ref = malloc(ny * 4);
                    memcpy(ref, y0, ny * 4);
                    float *dx = put(b, x, (size_t)n * w.cols * 4), *dy = put(b, y0, ny * 4);
                    OK(b->ops->matmul(b, &dw, dx, n, dy, acc, &err_));
                    ref_matmul(&w, x, n, ref, acc);
                    float *y = get(b, dy, ny * 4);
                    double e = ref_nrm_err(y, ref, ny);
                    /* more rows than the row kernels take, 16-bit weights: cuBLAS, with x
                     * rounded to the weight's type */
                    const bool newq = tdm_dtype_block_elems(w.type) > 1 && w.type != TDM_Q8_0 && w.type != TDM_Q4_0;
                    const bool gemm = n > TDM_TEST_CUDA_GEMV_MAX_ROWS &&
                                      (w.type == TDM_F16 || w.type == TDM_BF16 || newq); /* (newq: f16 dequantised) */
                    /* q4_k / q5_k / q6_k on the row kernels: x rounded to int8 per 32-element
                     * block (exact against that: test_cuda_kernels.c) */
                    const bool kq_int8 = !gemm && n <= TDM_TEST_CUDA_GEMV_MAX_ROWS &&
                                         (w.type == TDM_Q4_K || w.type == TDM_Q5_K || w.type == TDM_Q6_K);
                    const double tol = kq_int8 ? 2e-2 : !gemm ? 2e-6 : w.type == TDM_BF16 ? 2e-2 : 3e-3;
                    cr_assert(e < tol, "matmul %s [%lld][%lld] n %d acc %d: err %g", tdm_dtype_name(w.type),
                              (long long)w.rows, (long long)w.cols, (int)n, acc, e);
                    if (!acc && n > 1 && n <= TDM_TEST_CUDA_GEMV_MAX_ROWS) { /* the last row alone */
                        float *dy1 = put(b, NULL, (size_t)w.rows * 4);
                        OK(b->ops->matmul(b, &dw, dx + (size_t)(n - 1) * w.cols, 1, dy1, false, &err_));
                        float *y1 = get(b, dy1, (size_t)w.rows * 4);
                        cr_assert(memcmp(y1, y + (size_t)(n - 1) * w.rows, (size_t)w.rows * 4) == 0,
                                  "matmul %s n %d: a row alone differs from the batch", tdm_dtype_name(w.type), n);
                        free(y1);
                        b->ops->free(b, dy1);
                    }
                    free(y), free(x), free(y0), free(ref);
                    b->ops->free(b, dx);
                    b->ops->free(b, dy);
                }
            b->ops->free(b, (void *)dw.data);
            free((void *)w.data);
        }
    /* a layout or type it does not read is a clear error */
    tdm_weight w = tdm_test_weight(TDM_F16, 64, 64, &rng);
    tdm_weight dw = put_weight(b, &w);
    dw.layout = TDM_LAYOUT_P64;
    tdm_err err = {0};
    float *dx = put(b, NULL, 64 * 4), *dy = put(b, NULL, 64 * 4);
    cr_assert_eq(b->ops->matmul(b, &dw, dx, 1, dy, false, &err), TANDEM_ERR_UNSUPPORTED);
    dw.layout = TDM_LAYOUT_ROWS;
    dw.type = 999;
    cr_assert_eq(b->ops->matmul(b, &dw, dx, 1, dy, false, &err), TANDEM_ERR_UNSUPPORTED);
    b->ops->free(b, dx), b->ops->free(b, dy);
    b->ops->free(b, (void *)dw.data);
    free((void *)w.data);
    tdm_backend_destroy(b);
}

/* FP8 E4M3 weights with per-row scales: the row kernels (up to the row-kernel count,
 * f32 x) equal the CPU's product of the same weight up to f32 rounding, and a row
 * alone equals it in a batch; more rows take cuBLASLt's FP8 tensor-core product, x
 * quantised per row to E4M3 (as vLLM's dynamic FP8), within a few percent. */
Test(cuda_matmul, fp8_rows_and_gemm) {
    tdm_backend *b = gpu(), *cpu = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &cpu, &err), TANDEM_OK, "%s", err.msg);
    uint64_t rng = 11;
    const int64_t shapes[][2] = {{67, 96}, {384, 384}, {1030, 128}, {8, 1024}, {13, 112}, {4096, 256}};
    const int32_t ns[] = {1, 3, 8, 9, 20, 64, 300};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
        const int64_t rows = shapes[s][0], cols = shapes[s][1];
        float *wf = tdm_test_rand_vec(&rng, (size_t)(rows * cols), -1, 1), *sc = malloc((size_t)rows * 4);
        uint8_t *q = malloc((size_t)(rows * cols));
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t c = 0; c < cols; c++) wf[r * cols + c] *= (float)(1 + r % 7); /* rows of other scales */
            cr_assert(tdm_row_to_e4m3(wf + r * cols, cols, q + r * cols, &sc[r]));
        }
        const tdm_weight w = {.type = TDM_F8_E4M3, .rows = rows, .cols = cols, .row_bytes = (size_t)cols, .data = q,
                              .scale = sc};
        tdm_weight dw = w;
        dw.data = put(b, q, (size_t)(rows * cols));
        dw.scale = put(b, sc, (size_t)rows * 4);
        for (size_t k = 0; k < TDM_ARRAY_LEN(ns); k++)
            for (int acc = 0; acc < 2; acc++) {
                const int32_t n = ns[k];
                const size_t ny = (size_t)n * rows;
                float *x = tdm_test_rand_vec(&rng, (size_t)n * cols, -1, 1), *y0 = tdm_test_rand_vec(&rng, ny, -1, 1);
                float *ref = malloc(ny * 4);
                memcpy(ref, y0, ny * 4);
                OK(cpu->ops->matmul(cpu, &w, x, n, ref, acc, &err_));
                float *dx = put(b, x, (size_t)n * cols * 4), *dy = put(b, y0, ny * 4);
                OK(b->ops->matmul(b, &dw, dx, n, dy, acc, &err_));
                float *y = get(b, dy, ny * 4);
                const bool rows_kernels = n <= TDM_TEST_CUDA_GEMV_MAX_ROWS;
                const double e = ref_nrm_err(y, ref, ny), tol = rows_kernels ? 2e-6 : 6e-2;
                cr_assert(e < tol, "fp8 matmul [%lld][%lld] n %d acc %d: err %g", (long long)rows, (long long)cols,
                          (int)n, acc, e);
                if (!acc && n > 1 && rows_kernels) { /* the last row alone */
                    float *dy1 = put(b, NULL, (size_t)rows * 4);
                    OK(b->ops->matmul(b, &dw, dx + (size_t)(n - 1) * cols, 1, dy1, false, &err_));
                    float *y1 = get(b, dy1, (size_t)rows * 4);
                    cr_assert(memcmp(y1, y + (size_t)(n - 1) * rows, (size_t)rows * 4) == 0,
                              "fp8 matmul n %d: a row alone differs from the batch", n);
                    free(y1);
                    b->ops->free(b, dy1);
                }
                free(y), free(x), free(y0), free(ref);
                b->ops->free(b, dx);
                b->ops->free(b, dy);
            }
        tdm_weight bad = dw; /* without its scales: refused */
        bad.scale = NULL;
        float *dx = put(b, NULL, (size_t)cols * 4), *dy = put(b, NULL, (size_t)rows * 4);
        cr_assert_eq(b->ops->matmul(b, &bad, dx, 1, dy, false, &err), TANDEM_ERR_INVALID_ARG);
        b->ops->free(b, dx), b->ops->free(b, dy);
        b->ops->free(b, (void *)dw.data);
        b->ops->free(b, (void *)dw.scale);
        free(wf), free(sc), free(q);
    }
    tdm_backend_destroy(cpu);
    tdm_backend_destroy(b);
}

/* ---- paged KV cache ------------------------------------------------------------ */

typedef struct attn_case {
    int32_t n_head, n_kv_head, head_dim, block_size;
    uint32_t cache_type;
    int32_t n_seq, lens[3];
    bool tree;
} attn_case;

/* Asserts a cache written by the GPU equals the reference's bytes; on a difference
 * says where (unit, the byte's offset in it: a value's code or, from scale_off on, a
 * slot's f32 scale), both bytes and how many differ. */
static void cache_same(const void *got, const void *want, size_t n, int64_t unit, int64_t scale_off, const char *what) {
    const uint8_t *g = got, *w = want;
    size_t n_diff = 0, first = n;
    for (size_t i = 0; i < n; i++)
        if (g[i] != w[i]) n_diff++, first = first < n ? first : i;
    if (n_diff == 0) return;
    const int64_t at = (int64_t)(first % (size_t)unit);
    cr_assert_fail("kv_write %s differs from the reference in %zu of %zu bytes; the first: unit %zu, byte %lld (%s), "
                   "GPU 0x%02x, reference 0x%02x",
                   what, n_diff, n, first / (size_t)unit, (long long)at, at >= scale_off ? "a scale" : "a value",
                   g[first], w[first]);
}

/* Sequences over shuffled, interleaved blocks; every slot written by kv_write
 * (byte-exact against ref_kv_write); then the last rows of each sequence (tree:
 * a prefix plus scattered extra slots) attend, against ref_attention. */
static void run_attn(const attn_case *tc, uint64_t rng) {
    tdm_backend *b = gpu();
    const int32_t bs = tc->block_size, nkv = tc->n_kv_head, hd = tc->head_dim;
    tdm_kv_seq seqs[3] = {0};
    const tdm_kv_seq *sp[3];
    const int32_t n_blocks = tdm_test_shuffled_seqs(&rng, tc->n_seq, tc->lens, bs, 2, seqs, sp);
    const size_t cbytes = (size_t)n_blocks * nkv * (size_t)tdm_kv_unit_bytes(tc->cache_type, bs, hd);
    void *kc = put(b, NULL, cbytes), *vc = put(b, NULL, cbytes);
    void *kr = calloc(1, cbytes), *vr = calloc(1, cbytes);
    for (int s = 0; s < tc->n_seq; s++) {
        tdm_batch bt;
        const int32_t len = tc->lens[s], stride = nkv * hd + 3;
        cr_assert_eq(tdm_batch_init(&bt, len, NULL), TANDEM_OK);
        for (int32_t i = 0; i < len; i++) tdm_batch_add(&bt, 0, i, s, tdm_test_scrambled_slot(i, len), false);
        float *k = tdm_test_rand_vec(&rng, (size_t)len * stride, -2, 2), *v = tdm_test_rand_vec(&rng, (size_t)len * stride, -2, 2);
        float *dk = put(b, k, (size_t)len * stride * 4), *dv = put(b, v, (size_t)len * stride * 4);
        tdm_kv_write_args a = {&bt, sp, dk, dv, stride, kc, vc, tc->cache_type, nkv, hd, bs};
        OK(b->ops->kv_write(b, &a, &err_));
        tdm_kv_write_args ar = {&bt, sp, k, v, stride, kr, vr, tc->cache_type, nkv, hd, bs};
        ref_kv_write(&ar);
        b->ops->free(b, dk), b->ops->free(b, dv);
        free(k), free(v);
        tdm_batch_free(&bt);
    }
    void *kh = get(b, kc, cbytes), *vh = get(b, vc, cbytes);
    const int64_t unit = tdm_kv_unit_bytes(tc->cache_type, bs, hd);
    const int64_t sc_off = tdm_kv_scaled(tc->cache_type) ? tdm_kv_scale_off(bs, hd) : unit;
    cache_same(kh, kr, cbytes, unit, sc_off, "K");
    cache_same(vh, vr, cbytes, unit, sc_off, "V");

    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, 64, NULL), TANDEM_OK);
    int32_t extra_off[65] = {0}, extra_slot[2048], n_extra = 0;
    for (int s = 0; s < tc->n_seq; s++)
        for (int32_t p = TDM_MAX(0, tc->lens[s] - 5); p < tc->lens[s]; p++) {
            int32_t r = tdm_batch_add(&bt, 0, p, s, p, false);
            if (tc->tree) {
                bt.n_visible[r] = tc->lens[s] / 2;
                for (int32_t e = tc->lens[s] / 2; e <= p; e += 1 + (e % 3)) extra_slot[n_extra++] = e;
            }
            extra_off[r + 1] = n_extra;
        }
    if (tc->tree) bt.extra_off = extra_off, bt.extra_slot = extra_slot;
    const int32_t q_stride = tc->n_head * hd + 2 * nkv * hd;
    const size_t n_out = (size_t)bt.n_rows * tc->n_head * hd;
    float *q = tdm_test_rand_vec(&rng, (size_t)bt.n_rows * q_stride, -1.5f, 1.5f), *ref = calloc(n_out, 4);
    float *dq = put(b, q, (size_t)bt.n_rows * q_stride * 4), *dout = put(b, NULL, n_out * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    tdm_attn_args a = {&bt, sp, dq, q_stride, dout, kc, vc, tc->cache_type, tc->n_head, nkv, hd, bs, scale, 0, 0};
    OK(b->ops->attention(b, &a, &err_));
    tdm_attn_args ar = {&bt, sp, q, q_stride, ref, kr, vr, tc->cache_type, tc->n_head, nkv, hd, bs, scale, 0, 0};
    ref_attention(&ar);
    float *out = get(b, dout, n_out * 4);
    double e = ref_nrm_err(out, ref, n_out);
    cr_assert(e < 1e-5, "attention heads %d/%d hd %d %s tree %d: err %g", tc->n_head, nkv, hd,
              tdm_dtype_name(tc->cache_type), tc->tree, e);
    /* a slot outside the sequence is a clear error */
    bt.n_visible[0] = tc->lens[bt.seq[0]] + 1;
    tdm_err err = {0};
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "n_visible"), "%s", err.msg);
    bt.extra_off = NULL, bt.extra_slot = NULL;
    tdm_batch_free(&bt);
    void *dev[] = {kc, vc, dq, dout};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
    free(kh), free(vh), free(kr), free(vr), free(q), free(ref), free(out);
    for (int s = 0; s < tc->n_seq; s++) free(seqs[s].blocks);
    tdm_backend_destroy(b);
}

Test(cuda_attention, mha_f32) {
    attn_case tc = {4, 4, 64, 16, TDM_F32, 1, {37}, false};
    run_attn(&tc, 1);
}
Test(cuda_attention, gqa_f16_three_sequences) {
    attn_case tc = {6, 2, 64, 16, TDM_F16, 3, {200, 17, 64}, false};
    run_attn(&tc, 2);
}
Test(cuda_attention, tree_extra_slots_odd_shapes) {
    attn_case tc = {8, 2, 40, 8, TDM_F16, 2, {45, 300}, true};
    run_attn(&tc, 3);
}
/* a q8_0 cache: kv_write's bytes are the CPU reference's (the same quantisation);
 * attention on the tiles (hd 64) and on the op's kernels (tree rows, hd 40) against
 * the reference over the dequantised cache */
Test(cuda_attention, q8_0_tiles_and_tree_rows) {
    attn_case t1 = {6, 2, 64, 16, TDM_Q8_0, 3, {200, 17, 64}, false};
    run_attn(&t1, 4);
    attn_case t2 = {8, 2, 40, 8, TDM_Q8_0, 2, {45, 300}, true};
    run_attn(&t2, 5);
    attn_case t3 = {4, 4, 64, 16, TDM_Q8_0, 1, {37}, true};
    run_attn(&t3, 6);
}

/* An fp8 cache: kv_write's bytes are the CPU reference's (the GPU's satfinite E4M3
 * conversion rounds as tdm_f32_to_e4m3), attention on the tiles (hd 64, 128: the
 * real pair's) and on the op's kernels (tree rows with CSR extras, hd 40, block size
 * 8) against the reference over the dequantised cache. */
Test(cuda_attention, fp8_tiles_and_tree_rows) {
    attn_case t1 = {6, 2, 64, 16, TDM_F8_E4M3, 3, {200, 17, 64}, false};
    run_attn(&t1, 14);
    attn_case t2 = {8, 2, 40, 8, TDM_F8_E4M3, 2, {45, 300}, true};
    run_attn(&t2, 15);
    attn_case t3 = {12, 2, 128, 16, TDM_F8_E4M3, 2, {301, 37}, false};
    run_attn(&t3, 16);
    attn_case t4 = {14, 2, 64, 16, TDM_F8_E4M3, 1, {77}, true};
    run_attn(&t4, 17);
}

/* The same K / V (written by the GPU's kv_write) in an f16 and an fp8 cache, the same
 * queries: the GPU's fp8 attention equals the CPU backend's over the same fp8 bytes
 * (1e-5), and stays within 8e-2 of the GPU's f16 attention by normalised error (E4M3
 * keeps 3 mantissa bits, about 2.6 % rms per value, in K and in V; these cases
 * measured 4.5 to 4.9 % on the CPU backend); outputs poisoned with NaN first, odd
 * lengths, decode, verification and prefill rows. */
static void fp8_against_f16(int32_t n_head, int32_t nkv, int32_t hd, int32_t len, int32_t n_rows, uint64_t rng) {
    tdm_backend *b = gpu(), *cpu = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(2, &cpu, &err), TANDEM_OK, "%s", err.msg);
    const int32_t bs = 16, stride = nkv * hd;
    tdm_kv_seq seq = {0};
    const tdm_kv_seq *sp[1];
    const int32_t n_blocks = tdm_test_shuffled_seqs(&rng, 1, &len, bs, 2, &seq, sp);
    const uint32_t types[2] = {TDM_F16, TDM_F8_E4M3};
    tdm_batch wb;
    cr_assert_eq(tdm_batch_init(&wb, len, NULL), TANDEM_OK);
    for (int32_t i = 0; i < len; i++) tdm_batch_add(&wb, 0, i, 0, i, false);
    float *k = tdm_test_rand_vec(&rng, (size_t)len * stride, -3, 3), *v = tdm_test_rand_vec(&rng, (size_t)len * stride, -3, 3);
    float *dk = put(b, k, (size_t)len * stride * 4), *dv = put(b, v, (size_t)len * stride * 4);
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, n_rows, NULL), TANDEM_OK);
    for (int32_t p = len - n_rows; p < len; p++) tdm_batch_add(&bt, 0, p, 0, p, false);
    const int32_t q_stride = n_head * hd;
    const size_t n_out = (size_t)n_rows * n_head * hd;
    float *q = tdm_test_rand_vec(&rng, (size_t)n_rows * q_stride, -2, 2), *dq = put(b, q, n_out * 4);
    float *out[2], *dout = put(b, NULL, n_out * 4);
    const float scale = 1.0f / sqrtf((float)hd);
    void *kc8 = NULL, *vc8 = NULL; /* the fp8 cache, on the host */
    for (int t = 0; t < 2; t++) {
        const size_t cbytes = (size_t)n_blocks * nkv * (size_t)tdm_kv_unit_bytes(types[t], bs, hd);
        void *kc = put(b, NULL, cbytes), *vc = put(b, NULL, cbytes);
        tdm_kv_write_args wa = {&wb, sp, dk, dv, stride, kc, vc, types[t], nkv, hd, bs};
        OK(b->ops->kv_write(b, &wa, &err_));
        tdm_cu_test_poison(b, dout, n_out);
        tdm_attn_args a = {&bt, sp, dq, q_stride, dout, kc, vc, types[t], n_head, nkv, hd, bs, scale, 0, 0};
        OK(b->ops->attention(b, &a, &err_));
        out[t] = get(b, dout, n_out * 4);
        if (t == 1) kc8 = get(b, kc, cbytes), vc8 = get(b, vc, cbytes);
        b->ops->free(b, kc), b->ops->free(b, vc);
    }
    float *oc = calloc(n_out, 4);
    tdm_attn_args ac = {&bt, sp, q, q_stride, oc, kc8, vc8, TDM_F8_E4M3, n_head, nkv, hd, bs, scale, 0, 0};
    OK(cpu->ops->attention(cpu, &ac, &err_));
    const double e_cpu = ref_nrm_err(out[1], oc, n_out), e_f16 = ref_nrm_err(out[1], out[0], n_out);
    cr_log_info("fp8 attention heads %d/%d hd %d, %d keys, %d rows: against the CPU's fp8 %.3g, against f16 %.4f",
                n_head, nkv, hd, len, n_rows, e_cpu, e_f16);
    cr_assert(e_cpu < 1e-5, "hd %d: the GPU's fp8 attention against the CPU's: %g", hd, e_cpu);
    cr_assert(e_f16 < 8e-2, "hd %d: fp8 against f16 attention: %g", hd, e_f16);
    void *dev[] = {dk, dv, dq, dout};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++) b->ops->free(b, dev[i]);
    free(k), free(v), free(q), free(out[0]), free(out[1]), free(oc), free(kc8), free(vc8), free(seq.blocks);
    tdm_batch_free(&wb), tdm_batch_free(&bt);
    tdm_backend_destroy(cpu);
    tdm_backend_destroy(b);
}

Test(cuda_attention, fp8_against_cpu_and_f16) {
    fp8_against_f16(12, 2, 128, 333, 1, 31); /* the real target's shape: decode */
    fp8_against_f16(12, 2, 128, 1029, 5, 32); /* verification, several splits */
    fp8_against_f16(14, 2, 64, 200, 64, 33);  /* the real draft's: prefill rows */
    fp8_against_f16(8, 8, 80, 47, 3, 34);     /* MHA, an odd length */
}

/* ---- the real model ------------------------------------------------------------ */

/* A prefill of 40 tokens with logits for every row, then two decode steps: the
 * CUDA forward's logits match the CPU backend's (op by op, one thread) by
 * normalised error, and give the same argmax. */
Test(cuda_forward, target_matches_cpu, .timeout = 300) {
    tdm_backend *cpu = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &cpu, &err), TANDEM_OK, "%s", err.msg);
    tdm_cu_rig rc, rg;
    tdm_cu_rig_open(&rc, cpu, tdm_test_model_path("pycode-target-f16.gguf"), 8);
    tdm_cu_rig_open(&rg, gpu(), tdm_test_model_path("pycode-target-f16.gguf"), 8);
    const int32_t V = rc.m->hp.n_vocab;
    uint64_t rng = 9;
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, 64, NULL), TANDEM_OK);
    for (int32_t p = 0; p < 40; p++) tdm_batch_add(&bt, (int32_t)(tdm_test_rand(&rng) % (uint64_t)V), p, 0, p, true);
    for (int step = 0; step < 3; step++) {
        float *lc = tdm_cu_rig_forward(&rc, &bt, false), *lg = tdm_cu_rig_forward(&rg, &bt, false);
        const int32_t nl = tdm_batch_n_logits(&bt);
        double e = ref_nrm_err(lg, lc, (size_t)nl * V);
        /* a prefill of more rows than the row kernels take multiplies in f16 on tensor
         * cores (activations rounded to f16), and later rows read its K / V; decode
         * rows themselves stay in f32 */
        const bool f16_acts = bt.n_rows > TDM_TEST_CUDA_GEMV_MAX_ROWS;
        cr_assert(e < (f16_acts ? 3e-3 : 1e-3), "step %d (%d rows): logits err %g", step, (int)bt.n_rows, e);
        for (int32_t i = 0; i < nl; i++) {
            int32_t ac = tdm_argmax(lc + (size_t)i * V, V), ag = tdm_argmax(lg + (size_t)i * V, V);
            float gap = fabsf(lc[(size_t)i * V + ac] - lc[(size_t)i * V + ag]);
            cr_assert(ac == ag || gap < (f16_acts ? 3e-2f : 1e-3f), "step %d row %d: argmax %d on the CPU, %d on CUDA",
                      step, (int)i, (int)ac, (int)ag);
        }
        int32_t next = tdm_argmax(lc + (size_t)(nl - 1) * V, V), pos = bt.pos[bt.n_rows - 1] + 1;
        free(lc), free(lg);
        tdm_batch_clear(&bt);
        tdm_batch_add(&bt, next, pos, 0, pos, true);
    }
    tdm_batch_free(&bt);
    tdm_cu_rig_close(&rc);
    tdm_cu_rig_close(&rg);
}

/* The pycode target and draft-xs on the GPU through the public API, engines of ep
 * (NULL: the defaults), requests of gp0 (NULL: the defaults; max_tokens is the
 * reference's): over the refs-dev prompts, speculative decoding (adaptive k, n-gram
 * lookup, or what gp0 says) gives exactly the target-only tokens.  Returns how many
 * target-only continuations equal the transformers reference; *accepted, *drafted:
 * the speculative counts (*trees: token-tree steps, when not NULL). */
/* The attention kernels cuda_spec_equality_gp's models take (the default unless a
 * test sets another). */
static tdm_cuda_attn_path g_attn = TDM_CUDA_ATTN_AUTO;

/* The pycode target and draft_file (under models/) opened on the GPU. */
/* The weights open_cuda_pair loads both models with (a test may set FP8). */
static tandem_weights g_weights = TANDEM_WEIGHTS_NATIVE;

static void open_cuda_pair(const char *draft_file, tandem_model **target, tandem_model **draft) {
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = TANDEM_BACKEND_CUDA;
    mp.weights = g_weights;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-target-f16.gguf"), &mp, target), TANDEM_OK, "%s",
                 tandem_last_error());
    cr_assert_eq(tandem_model_open(tdm_test_model_path(draft_file), &mp, draft), TANDEM_OK, "%s", tandem_last_error());
}

static int cuda_spec_equality_gp(const tandem_engine_params *ep, const tdm_api_paths *paths,
                                 const tandem_generate_params *gp0, const char *what, uint64_t *accepted,
                                 uint64_t *drafted, uint64_t *trees) {
    tandem_model *target = NULL, *draft = NULL;
    open_cuda_pair("pycode-draft-xs-f16.gguf", &target, &draft);
    tdm_backend_cuda_force_attention(tdm_api_model_backend(target), g_attn);
    tdm_backend_cuda_force_attention(tdm_api_model_backend(draft), g_attn);
    tandem_engine *plain = NULL, *spec = NULL;
    cr_assert_eq(tandem_engine_open(target, NULL, ep, &plain), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tdm_api_engine_open(target, draft, ep, paths, &spec), TANDEM_OK, "%s", tandem_last_error());
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    int matches = 0;
    *accepted = *drafted = 0;
    if (trees) *trees = 0;
    for (size_t li = 0; li < n_lines; li++) {
        size_t n, n_ref;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        int32_t *want = tdm_test_json_ids(tdm_json_get(refs[li], "target_greedy_ids"), &n_ref);
        tandem_generate_params gp = gp0 ? *gp0 : tandem_generate_default_params();
        gp.max_tokens = (int)n_ref;
        tandem_result a, b;
        cr_assert_eq(tandem_generate_ids(plain, ids, n, &gp, &a), TANDEM_OK, "%s", tandem_last_error());
        cr_assert_eq(tandem_generate_ids(spec, ids, n, &gp, &b), TANDEM_OK, "%s", tandem_last_error());
        matches += a.n_tokens == n_ref && memcmp(a.tokens, want, n_ref * sizeof(int32_t)) == 0;
        cr_assert(a.n_tokens == b.n_tokens && memcmp(a.tokens, b.tokens, a.n_tokens * sizeof(int32_t)) == 0,
                  "%s, prompt %zu: speculative decoding on the GPU differs from target-only decoding", what, li);
        *accepted += b.spec.accepted;
        *drafted += b.spec.drafted;
        if (trees) *trees += b.spec.tree_steps;
        tandem_result_free(&a);
        tandem_result_free(&b);
        free(ids);
        free(want);
    }
    printf("cuda, %s: %d of %zu greedy continuations identical to the reference; acceptance %llu / %llu\n", what,
           matches, n_lines, (unsigned long long)*accepted, (unsigned long long)*drafted);
    tdm_test_jsonl_free(refs, n_lines);
    tandem_engine_close(spec);
    tandem_engine_close(plain);
    tandem_model_close(draft);
    tandem_model_close(target);
    return matches;
}

static int cuda_spec_equality(const tandem_engine_params *ep, const char *what, uint64_t *accepted, uint64_t *drafted) {
    return cuda_spec_equality_gp(ep, NULL, NULL, what, accepted, drafted, NULL);
}

/* Token trees on the GPU (tree masks in the fused forward's attention, the row
 * kernels for up to 64 verification rows, CUDA graphs, draft candidates from the
 * topk op): with dynamic trees of 32 and 12 nodes, a static 4,2,2,1 tree, and the
 * scores and softmax kernels instead of the tiled ones (TDM_CUDA_ATTN_SCORES) and host
 * candidates (tdm_spec_ws_opts.host_topk), every step a tree, greedy output equals
 * target-only output on every prompt. */
Test(cuda_engine, trees_equal_target_only, .timeout = 900) {
    static const struct {
        int nodes;
        const char *shape;
        bool scores, host_topk;
    } cases[] = {{32, NULL, false, false}, {12, NULL, false, false}, {0, "4,2,2,1", false, false},
                 {32, NULL, true, false}, {16, NULL, false, true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        g_attn = cases[i].scores ? TDM_CUDA_ATTN_SCORES : TDM_CUDA_ATTN_AUTO;
        tandem_generate_params gp = tandem_generate_default_params();
        gp.spec_tree = cases[i].nodes;
        gp.spec_tree_shape = cases[i].shape;
        char what[96];
        snprintf(what, sizeof what, "trees of %d nodes%s%s%s", cases[i].nodes, cases[i].shape ? ", shape " : "",
                 cases[i].shape ? cases[i].shape : "",
                 cases[i].scores ? ", scores and softmax kernels" : cases[i].host_topk ? ", host candidates" : "");
        const tdm_api_paths paths = {.ws = {.host_topk = cases[i].host_topk}};
        uint64_t accepted, drafted, trees;
        cuda_spec_equality_gp(NULL, &paths, &gp, what, &accepted, &drafted, &trees);
        g_attn = TDM_CUDA_ATTN_AUTO;
        cr_assert_gt(trees, 0, "%s: no tree steps", what);
        cr_assert_gt(accepted, 0, "%s: no tree node accepted", what);
    }
}

/* A lone sequence's greedy dynamic trees grown on the device (the tree_grow op, one
 * wait per tree) are the trees the host grows from the same candidates
 * (tdm_spec_ws_opts.host_tree): over every prompt, the same tree steps, nodes drafted and
 * accepted, and output equal to target-only output either way. n-gram lookups are
 * off here: how long a lookup runs and whether a step is a lookup alone follow the
 * measured step costs, which differ between two runs (lookups in device trees are
 * checked against target-only output in trees_equal_target_only). */
Test(cuda_engine, device_trees_equal_host_trees, .timeout = 900) {
    const int budgets[] = {16, 5};
    for (size_t i = 0; i < sizeof budgets / sizeof budgets[0]; i++) {
        tandem_generate_params gp = tandem_generate_default_params();
        gp.spec_tree = budgets[i];
        gp.spec_ngram = 0;
        uint64_t acc[2], dr[2], tr[2];
        for (int host = 0; host < 2; host++) {
            const tdm_api_paths paths = {.ws = {.host_tree = host}};
            cuda_spec_equality_gp(NULL, &paths, &gp, host ? "trees grown on the host" : "trees grown on the device",
                                  &acc[host], &dr[host], &tr[host]);
        }
        cr_assert_gt(tr[0], 0, "no tree steps");
        cr_assert(acc[0] == acc[1] && dr[0] == dr[1] && tr[0] == tr[1],
                  "trees of %d: device %llu / %llu accepted / drafted in %llu trees, host %llu / %llu in %llu",
                  budgets[i], (unsigned long long)acc[0], (unsigned long long)dr[0], (unsigned long long)tr[0],
                  (unsigned long long)acc[1], (unsigned long long)dr[1], (unsigned long long)tr[1]);
    }
}

/* Greedy decoding reproduces the transformers reference continuations as on the
 * CPU (98 of 100 there); speculative output equals target-only output. */
Test(cuda_engine, greedy_reference_and_speculative_equality, .timeout = 900) {
    uint64_t accepted, drafted;
    const int matches = cuda_spec_equality(NULL, "f16 cache", &accepted, &drafted);
    cr_assert_gt(drafted, 0);
    cr_assert_geq(matches, 98, "only %d of 100 greedy continuations match the reference", matches);
}

/* Grammar-constrained decoding on the GPU (the masks uploaded and applied by the
 * mask_rows op where the logits are, device sampling; the constrained draft's chains
 * on the host; chains and token trees): under a GBNF grammar and a JSON schema, greedy
 * speculative output equals target-only output and parses under the grammar; sampled
 * (an engine of one sequence), the speculative output equals the target-only output
 * of the same seed. */
Test(cuda_engine, constrained_speculative_equality, .timeout = 900) {
    static const char *gram = "root ::= \"def \" [a-z_]+ \"(\" [a-z, ]* \"):\\n    return \" [a-z0-9_ +*]+ \"\\n\"";
    static const char *schema = "{\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 20},"
                                " \"n\": {\"type\": \"integer\"}}, \"required\": [\"name\", \"n\"], \"additionalProperties\": false}";
    tandem_model *target = NULL, *draft = NULL;
    open_cuda_pair("pycode-draft-xs-f16.gguf", &target, &draft);
    tandem_engine *plain = NULL, *spec = NULL;
    cr_assert_eq(tandem_engine_open(target, NULL, NULL, &plain), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tandem_engine_open(target, draft, NULL, &spec), TANDEM_OK, "%s", tandem_last_error());
    tdm_grammar *g;
    tdm_err err = {0};
    cr_assert_eq(tdm_grammar_parse(gram, strlen(gram), &g, &err), TANDEM_OK, "%s", err.msg);
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    uint64_t drafted = 0, tree_steps = 0;
    for (size_t li = 0; li < 24; li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 48;
        gp.grammar = li % 2 ? NULL : gram;
        gp.json_schema = li % 2 ? schema : NULL;
        if (li % 3 == 2) gp.temperature = 0.8f, gp.seed = 500 + li;
        gp.spec_tree = li % 4 == 1 ? 8 : li % 4 == 2 ? TANDEM_SPEC_TREE_AUTO : 0; /* (trees' rows masked per node) */
        tandem_result a, b;
        cr_assert_eq(tandem_generate_ids(plain, ids, n, &gp, &a), TANDEM_OK, "%s", tandem_last_error());
        cr_assert_eq(tandem_generate_ids(spec, ids, n, &gp, &b), TANDEM_OK, "%s", tandem_last_error());
        cr_assert(a.n_tokens == b.n_tokens && memcmp(a.tokens, b.tokens, a.n_tokens * sizeof(int32_t)) == 0,
                  "prompt %zu (%s): constrained speculative decoding on the GPU differs from target-only", li,
                  gp.temperature > 0 ? "sampled" : "greedy");
        if (gp.grammar && a.finish_reason != TANDEM_FINISH_LENGTH) {
            bool ok = false;
            cr_assert_eq(tdm_grammar_matches(g, a.text, strlen(a.text), &ok, &err), TANDEM_OK, "%s", err.msg);
            cr_assert(ok, "prompt %zu: \"%s\" is not a sentence of the grammar", li, a.text);
        }
        drafted += b.spec.drafted;
        tree_steps += b.spec.tree_steps;
        tandem_result_free(&a);
        tandem_result_free(&b);
        free(ids);
    }
    cr_assert_gt(drafted, 0);
    cr_assert_gt(tree_steps, 0, "no tree was verified");
    tdm_grammar_free(g);
    tdm_test_jsonl_free(refs, n_lines);
    tandem_engine_close(spec);
    tandem_engine_close(plain);
    tandem_model_close(draft);
    tandem_model_close(target);
}

/* Penalties, logit_bias, min_tokens and logprobs on the GPU (the edits uploaded and
 * applied by the edit_rows op where the logits are, the summaries by the row_top op;
 * the penalised draft's chains and trees on the host): greedy and sampled (an engine of one
 * sequence: agreement with the target's draws), speculative output equals
 * target-only output, logprobs within 1e-4, each greedy token its own top
 * alternative. */
Test(cuda_engine, penalties_and_logprobs_speculative_equality, .timeout = 900) {
    tandem_model *target = NULL, *draft = NULL;
    open_cuda_pair("pycode-draft-xs-f16.gguf", &target, &draft);
    tandem_engine *plain = NULL, *spec = NULL;
    cr_assert_eq(tandem_engine_open(target, NULL, NULL, &plain), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tandem_engine_open(target, draft, NULL, &spec), TANDEM_OK, "%s", tandem_last_error());
    static const tandem_logit_bias bias[] = {{13, 2.5f}, {220, -3.0f}, {198, -100.0f}};
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    uint64_t drafted = 0, tree_steps = 0;
    for (size_t li = 0; li < 16; li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 40;
        gp.presence_penalty = li % 2 ? 0.8f : 0.0f;
        gp.frequency_penalty = li % 3 ? 0.5f : -0.5f;
        gp.repetition_penalty = li % 4 ? 1.2f : 1.0f;
        gp.min_tokens = li % 5 == 0 ? 20 : 0;
        gp.logit_bias = bias;
        gp.n_logit_bias = li % 2 ? 3 : 0;
        gp.logprobs = li % 4 != 3;
        gp.top_logprobs = gp.logprobs ? (int)(li % 21) : 0;
        if (li % 3 == 2) gp.temperature = 0.8f, gp.seed = 900 + li;
        gp.spec_tree = li % 4 == 1 ? 8 : li % 4 == 2 ? TANDEM_SPEC_TREE_AUTO : 0; /* (trees' rows edited per node) */
        tandem_result a, b;
        cr_assert_eq(tandem_generate_ids(plain, ids, n, &gp, &a), TANDEM_OK, "%s", tandem_last_error());
        cr_assert_eq(tandem_generate_ids(spec, ids, n, &gp, &b), TANDEM_OK, "%s", tandem_last_error());
        cr_assert(a.n_tokens == b.n_tokens && memcmp(a.tokens, b.tokens, a.n_tokens * sizeof(int32_t)) == 0,
                  "prompt %zu (%s): penalised speculative decoding on the GPU differs from target-only", li,
                  gp.temperature > 0 ? "sampled" : "greedy");
        if (gp.min_tokens) cr_assert_geq(a.n_tokens, (size_t)TDM_MIN(gp.min_tokens, gp.max_tokens));
        cr_assert_eq(!!a.logprobs, gp.logprobs);
        for (size_t t = 0; gp.logprobs && t < a.n_tokens; t++) {
            cr_assert_float_eq(a.logprobs[t].logprob, b.logprobs[t].logprob, 1e-4, "prompt %zu, token %zu", li, t);
            cr_assert_leq(a.logprobs[t].logprob, 1e-6);
            cr_assert_eq(a.logprobs[t].n_top, gp.top_logprobs);
            if (gp.temperature == 0 && gp.top_logprobs > 0) cr_assert_eq(a.logprobs[t].top_ids[0], a.tokens[t]);
        }
        drafted += b.spec.drafted;
        tree_steps += b.spec.tree_steps;
        tandem_result_free(&a);
        tandem_result_free(&b);
        free(ids);
    }
    cr_assert_gt(drafted, 0);
    cr_assert_gt(tree_steps, 0, "no tree was verified");
    tdm_test_jsonl_free(refs, n_lines);
    tandem_engine_close(spec);
    tandem_engine_close(plain);
    tandem_model_close(draft);
    tandem_model_close(target);
}

/* Both models with FP8 weights on the GPU: speculation (chains, n-gram lookups)
 * still gives exactly the target-only tokens of the FP8 target, and FP8 keeps most
 * reference continuations (printed). */
Test(cuda_engine, fp8_weights_speculative_equality, .timeout = 900) {
    uint64_t acc, dr;
    g_weights = TANDEM_WEIGHTS_FP8;
    const int matches = cuda_spec_equality(NULL, "fp8 weights", &acc, &dr);
    g_weights = TANDEM_WEIGHTS_NATIVE;
    cr_assert_gt(acc, 0, "no drafted token was accepted with FP8 weights");
    cr_assert_gt(matches, 0, "no FP8 continuation equals the F16 reference");
}

/* Caches of type kv (both models): speculative output equals target-only
 * output with the same cache (the flash, decode and fused RoPE + K/V kernels on
 * its values); the continuations equal to the reference are reported, not required (a
 * quantised cache departs from f16 at near ties: bench_kv). */
static void cache_speculative_equality(tandem_kv_type kv, const char *what) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.kv_type = kv;
    uint64_t accepted, drafted;
    cuda_spec_equality(&ep, what, &accepted, &drafted);
    cr_assert_gt(drafted, 0);
}

Test(cuda_engine, q8_0_cache_speculative_equality, .timeout = 900) {
    cache_speculative_equality(TANDEM_KV_Q8_0, "q8_0 cache");
}
/* The same with fp8 caches (both models): the flash, decode and fused RoPE + K/V
 * kernels on E4M3 codes. */
Test(cuda_engine, fp8_cache_speculative_equality, .timeout = 900) {
    cache_speculative_equality(TANDEM_KV_FP8, "fp8 cache");
}

/* The draft's head over 1024 of pycode's 8192 tokens (draft_vocab) on the GPU: its
 * logits placed into whole rows by scatter_cols, read by the device chains' argmax,
 * the trees' topk and the device sampling: greedy speculative output equals
 * target-only output on every prompt with chains and with trees, and in the oracle
 * benchmark mode (whose -FLT_MAX push beside TDM_LOGIT_NONE stays finite). */
Test(cuda_engine, draft_vocab_equality, .timeout = 900) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.draft_vocab = 1024;
    uint64_t accepted, drafted, trees;
    cuda_spec_equality(&ep, "draft_vocab 1024, chains", &accepted, &drafted);
    cr_assert_gt(accepted, 0, "no draft token accepted");
    tandem_generate_params gp = tandem_generate_default_params();
    gp.spec_tree = 16;
    cuda_spec_equality_gp(&ep, NULL, &gp, "draft_vocab 1024, trees", &accepted, &drafted, &trees);
    cr_assert_gt(trees, 0, "no tree steps");
    /* the oracle mode on a few prompts */
    tandem_model *target = NULL, *draft = NULL;
    open_cuda_pair("pycode-draft-s-f16.gguf", &target, &draft);
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(target, draft, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    for (size_t li = 0; li < n_lines; li += 20) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        tandem_generate_params g = tandem_generate_default_params();
        g.max_tokens = 48;
        g.spec_k = 4;
        g.spec_ngram = 0;
        tandem_result a, o;
        cr_assert_eq(tandem_generate_ids(e, ids, n, &g, &a), TANDEM_OK, "%s", tandem_last_error());
        g.bench_oracle_tokens = a.tokens;
        g.bench_n_oracle = (int)a.n_tokens;
        g.bench_oracle_alpha = 0.7f;
        cr_assert_eq(tandem_generate_ids(e, ids, n, &g, &o), TANDEM_OK, "%s", tandem_last_error());
        cr_assert(o.n_tokens == a.n_tokens && !memcmp(o.tokens, a.tokens, a.n_tokens * sizeof(int32_t)),
                  "prompt %zu, oracle: output differs", li);
        tandem_result_free(&a);
        tandem_result_free(&o);
        free(ids);
    }
    tdm_test_jsonl_free(refs, n_lines);
    tandem_engine_close(e);
    tandem_model_close(draft);
    tandem_model_close(target);
}

/* Greedy drafting on the device (the chain's forwards queued back to back, one
 * wait per chain) proposes exactly what token-by-token drafting proposes: with a
 * fixed k the two engines draft and accept the same counts and emit the same
 * tokens (tdm_spec_ws_opts.host_chain selects the host loop when an engine opens).  The
 * same with the oracle benchmark mode (draft/oracle.h; alpha 0, 0.7, 1: the device
 * chain's planned tokens and masked argmax against the host loop's rearranged
 * candidates, the same draws), alpha 0 accepting nothing and 1 everything on the
 * target's path. */
Test(cuda_engine, device_draft_chain_equals_host_chain, .timeout = 300) {
    tandem_model *target = NULL, *draft = NULL;
    open_cuda_pair("pycode-draft-s-f16.gguf", &target, &draft);
    tandem_engine *dev = NULL, *host = NULL;
    cr_assert_eq(tandem_engine_open(target, draft, NULL, &dev), TANDEM_OK, "%s", tandem_last_error());
    const tdm_api_paths host_chain = {.ws = {.host_chain = true}};
    cr_assert_eq(tdm_api_engine_open(target, draft, NULL, &host_chain, &host), TANDEM_OK, "%s", tandem_last_error());
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    uint64_t drafted = 0;
    for (size_t li = 0; li < n_lines; li += 5) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li], "prompt_ids"), &n);
        for (int k = 3; k <= 6; k += 3) {
            tandem_generate_params gp = tandem_generate_default_params();
            gp.max_tokens = 64;
            gp.spec_k = k;
            gp.spec_ngram = 0;
            tandem_result a, b;
            cr_assert_eq(tandem_generate_ids(dev, ids, n, &gp, &a), TANDEM_OK, "%s", tandem_last_error());
            cr_assert_eq(tandem_generate_ids(host, ids, n, &gp, &b), TANDEM_OK, "%s", tandem_last_error());
            cr_assert(a.n_tokens == b.n_tokens && memcmp(a.tokens, b.tokens, a.n_tokens * sizeof(int32_t)) == 0,
                      "prompt %zu, k %d: tokens differ", li, k);
            cr_assert(a.spec.drafted == b.spec.drafted && a.spec.accepted == b.spec.accepted &&
                          a.spec.steps == b.spec.steps,
                      "prompt %zu, k %d: device chain drafted %llu / accepted %llu in %llu steps, host %llu / %llu / %llu",
                      li, k, (unsigned long long)a.spec.drafted, (unsigned long long)a.spec.accepted,
                      (unsigned long long)a.spec.steps, (unsigned long long)b.spec.drafted,
                      (unsigned long long)b.spec.accepted, (unsigned long long)b.spec.steps);
            drafted += a.spec.drafted;
            static const float alphas[] = {0.0f, 0.7f, 1.0f};
            for (int ai = 0; ai < 3; ai++) {
                tandem_generate_params go = gp;
                go.bench_oracle_tokens = a.tokens;
                go.bench_n_oracle = (int)a.n_tokens;
                go.bench_oracle_alpha = alphas[ai];
                go.seed = 11 + li;
                tandem_result oa, ob;
                cr_assert_eq(tandem_generate_ids(dev, ids, n, &go, &oa), TANDEM_OK, "%s", tandem_last_error());
                cr_assert_eq(tandem_generate_ids(host, ids, n, &go, &ob), TANDEM_OK, "%s", tandem_last_error());
                cr_assert(oa.n_tokens == a.n_tokens && !memcmp(oa.tokens, a.tokens, a.n_tokens * sizeof(int32_t)) &&
                              ob.n_tokens == a.n_tokens && !memcmp(ob.tokens, a.tokens, a.n_tokens * sizeof(int32_t)),
                          "prompt %zu, k %d, oracle alpha %g: output differs from target-only", li, k, alphas[ai]);
                cr_assert(oa.spec.drafted == ob.spec.drafted && oa.spec.accepted == ob.spec.accepted,
                          "prompt %zu, k %d, oracle alpha %g: device chain drafted %llu / accepted %llu, host %llu / %llu",
                          li, k, alphas[ai], (unsigned long long)oa.spec.drafted, (unsigned long long)oa.spec.accepted,
                          (unsigned long long)ob.spec.drafted, (unsigned long long)ob.spec.accepted);
                if (ai == 0) cr_assert_eq(oa.spec.accepted, 0, "oracle alpha 0: %llu accepted", (unsigned long long)oa.spec.accepted);
                if (ai == 2)
                    cr_assert_geq(oa.spec.forward_tokens, (uint64_t)k * oa.spec.forwards - (uint64_t)k,
                                  "oracle alpha 1: %llu tokens in %llu forwards", (unsigned long long)oa.spec.forward_tokens,
                                  (unsigned long long)oa.spec.forwards);
                tandem_result_free(&oa);
                tandem_result_free(&ob);
            }
            tandem_result_free(&a);
            tandem_result_free(&b);
        }
        free(ids);
    }
    cr_assert_gt(drafted, 0);
    tdm_test_jsonl_free(refs, n_lines);
    tandem_engine_close(host);
    tandem_engine_close(dev);
    tandem_model_close(draft);
    tandem_model_close(target);
}

/* A device memory budget sizes the KV cache from what the weights and buffers
 * leave; too small a budget fails to open, naming the figures. */
Test(cuda_engine, gpu_mem_budget) {
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = TANDEM_BACKEND_CUDA;
    tandem_model *target = NULL;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-target-f16.gguf"), &mp, &target), TANDEM_OK, "%s",
                 tandem_last_error());
    tandem_engine_params ep = tandem_engine_default_params();
    ep.gpu_mem = 40u << 20; /* the weights alone are 31 MB */
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(target, NULL, &ep, &e), TANDEM_ERR_NOMEM);
    cr_assert(strstr(tandem_last_error(), "gpu_mem of 40.0 MiB"), "%s", tandem_last_error());
    ep.gpu_mem = 512u << 20;
    cr_assert_eq(tandem_engine_open(target, NULL, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 16;
    tandem_result r;
    cr_assert_eq(tandem_generate(e, "def add(a, b):", &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(r.n_tokens > 0, true);
    tandem_result_free(&r);
    tandem_engine_close(e);
    tandem_model_close(target);
}

/* ---- sampling on the device: lossless, by a chi-square test ----------------------- */

#define GPU_RUNS 10000
#define GPU_POS 4

/* counts[pos][token] of GPU_RUNS sampled continuations of prompt */
static void gpu_counts(tdm_engine *e, const tandem_generate_params *base, const int32_t *prompt, int32_t n_prompt,
                       uint64_t seed0, int32_t V, uint64_t *counts, tandem_spec_stats *agg) {
    tdm_test_sample_counts(e, base, prompt, n_prompt, seed0, GPU_RUNS, GPU_POS, V, counts, agg);
}

/* A random-weight pair on the GPU, sampling on the device: target-only and
 * speculative sampling (device draft chains, device acceptance) both give the
 * distribution host sampling gives on the CPU, position by position (two-sample
 * chi-square, p > 1e-3, fixed seeds). */
static void check_device_sampling(float temp, int top_k, float top_p, float min_p, int spec_k, int ngram) {
    tdm_err err = {0};
    tdm_tiny_cfg tc = tdm_tiny_default(), dc = tdm_tiny_default();
    tc.n_vocab = 24;
    dc.n_vocab = 24;
    dc.seed = 2, dc.n_layer = 1, dc.n_embd = 32, dc.n_head = 2, dc.n_head_kv = 1, dc.n_ff = 64;
    char *tp = tdm_tiny_model_file(&tc), *dp = tdm_tiny_model_file(&dc);
    tdm_backend *cpu = NULL, *cu = tdm_cu_test_gpu();
    cr_assert_eq(tdm_backend_cpu_create(1, &cpu, &err), TANDEM_OK);
    tdm_model *t_cpu, *t_gpu, *d_gpu;
    cr_assert_eq(tdm_model_load(tp, cpu, &t_cpu, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(tp, cu, &t_gpu, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(dp, cu, &d_gpu, &err), TANDEM_OK, "%s", err.msg);
    tdm_engine_cfg cfg = {.n_threads = 1};
    tdm_engine *ref, *plain, *spec;
    cr_assert_eq(tdm_engine_create(t_cpu, NULL, &cfg, &ref, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_create(t_gpu, NULL, &cfg, &plain, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_create(t_gpu, d_gpu, &cfg, &spec, &err), TANDEM_OK, "%s", err.msg);
    tdm_spec_ws *ws = NULL;
    cr_assert_eq(tdm_spec_ws_create(spec, NULL, &ws, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(plain->p_dev && ws->q_dev && ws->chain_dev, "the GPU engines sample on the device");
    tdm_spec_ws_free(spec, ws);
    const int32_t V = tc.n_vocab;
    uint64_t *a = calloc((size_t)(GPU_POS * V), 8), *b = calloc((size_t)(GPU_POS * V), 8),
             *c = calloc((size_t)(GPU_POS * V), 8);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.temperature = temp;
    gp.top_k = top_k;
    gp.top_p = top_p;
    gp.min_p = min_p;
    gp.spec_k = spec_k;
    gp.spec_ngram = ngram;
    const int32_t prompt[] = {3, 7, 1, 3, 7, 1, 3, 7};
    tandem_spec_stats agg = {0};
    gpu_counts(ref, &gp, prompt, 8, 1000000, V, a, NULL);
    gpu_counts(plain, &gp, prompt, 8, 2000000, V, b, NULL);
    gpu_counts(spec, &gp, prompt, 8, 3000000, V, c, &agg);
    const double acc = agg.drafted ? (double)agg.accepted / (double)agg.drafted : 0;
    printf("device sampling, temp %.2f top_k %d top_p %.2f min_p %.2f k %d ngram %d: acceptance %.3f, %.2f drafted and "
           "%.2f n-gram steps per run\n",
           temp, top_k, top_p, min_p, spec_k, ngram, acc, (double)agg.drafted / GPU_RUNS,
           (double)agg.ngram_steps / GPU_RUNS);
    cr_assert(acc > 0.05 && acc < 0.98, "acceptance %.3f: both outcomes must occur", acc);
    for (int i = 0; i < GPU_POS; i++) {
        const double p1 = tdm_stat_chi2_two_sample(a + i * V, b + i * V, V);
        const double p2 = tdm_stat_chi2_two_sample(a + i * V, c + i * V, V);
        printf("  position %d: p-value %.4f (device target-only), %.4f (device speculative)\n", i + 1, p1, p2);
        cr_assert_gt(p1, 1e-3, "position %d: device sampling differs from host sampling (p = %.2g)", i + 1, p1);
        cr_assert_gt(p2, 1e-3, "position %d: device speculative sampling differs from host sampling (p = %.2g)", i + 1, p2);
    }
    free(a), free(b), free(c);
    tdm_engine_free(spec);
    tdm_engine_free(plain);
    tdm_engine_free(ref);
    tdm_model_free(d_gpu);
    tdm_model_free(t_gpu);
    tdm_model_free(t_cpu);
    tdm_backend_destroy(cu);
    tdm_backend_destroy(cpu);
    unlink(tp), unlink(dp);
    free(tp), free(dp);
}

Test(cuda_sampling, lossless_temperature_k3, .timeout = 600) { check_device_sampling(1.0f, 0, 1.0f, 0.0f, 3, 0); }
Test(cuda_sampling, lossless_filters_ngram_adaptive, .timeout = 600) {
    check_device_sampling(1.5f, 12, 0.95f, 0.01f, 0, 2);
}

/* NaN and +inf planted in each weight (tests/nonfinite_testutil.c: every tensor of a
 * layer, the output norm and the heads; f32, f16 and q8_0 matrices; in the target and
 * in the draft, greedy and sampled, plain and speculative) are a model error on the
 * GPU as on the CPU: the attention kernels, the activations' int8 quantisation and
 * f16 conversion, the soft-caps and the device argmax / sampling carry them to the
 * logits check.  Heads of 64 take the flash and decode kernels, a 20-token prompt a
 * prefill tile. */
Test(cuda_engine, non_finite_weights_are_a_model_error, .timeout = 600) {
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = TANDEM_BACKEND_CUDA;
    tdm_nf_check_all("cuda", &mp, 64, 20);
}

int main(int argc, char *argv[]) { return tdm_cu_test_main(argc, argv); }

/* The scheduler on the GPU: batches of 8 and 32 (target-only and with a draft), a
 * prompt budget of 16 rows a step, and a KV pool small enough to preempt, give
 * the greedy tokens of one-at-a-time decoding on every prefix of the 100
 * prompts-dev prompts; sampled tokens do not depend on the batch.  With
 * batch_invariant off (a step's rows in one forward) the outputs are counted. */
static tandem_engine *cuda_batch_engine(tandem_model *t, tandem_model *d, int n_seq, int budget, size_t kv_bytes,
                                        bool invariant) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_seq_max = n_seq;
    ep.max_batch_tokens = budget;
    ep.kv_bytes = kv_bytes;
    ep.batch_invariant = invariant;
    ep.n_ctx = 1024;
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(t, d, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    return e;
}

static int cuda_batch_compare(tandem_engine *e, const tandem_request *r, const tandem_result *want, size_t n,
                              const char *what, bool must) {
    tandem_result *got = calloc(n, sizeof *got);
    cr_assert_eq(tandem_generate_batch(e, r, n, got), TANDEM_OK, "%s", tandem_last_error());
    int same = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(got[i].status, TANDEM_OK, "%s, request %zu: %s", what, i, got[i].error ? got[i].error : "");
        bool eq = got[i].n_tokens == want[i].n_tokens &&
                  memcmp(got[i].tokens, want[i].tokens, want[i].n_tokens * sizeof(int32_t)) == 0;
        if (must) cr_assert(eq, "%s, request %zu: %zu tokens differ from alone", what, i, got[i].n_tokens);
        same += eq;
        tandem_result_free(&got[i]);
    }
    free(got);
    printf("cuda batch: %s: %d of %zu as alone\n", what, same, n);
    return same;
}

Test(cuda_batch, scheduler_outputs_equal_alone, .timeout = 900) {
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = TANDEM_BACKEND_CUDA;
    tandem_model *t = NULL, *d = NULL;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-target-f16.gguf"), &mp, &t), TANDEM_OK, "%s",
                 tandem_last_error());
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-draft-xs-f16.gguf"), &mp, &d), TANDEM_OK, "%s",
                 tandem_last_error());
    size_t n;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n);
    tandem_request *r = calloc(n, sizeof *r);
    int32_t **ids = calloc(n, sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        size_t len;
        ids[i] = tdm_test_json_ids(tdm_json_get(refs[i], "prompt_ids"), &len);
        r[i] = tandem_request_default();
        r[i].prompt_ids = ids[i];
        r[i].n_prompt_ids = len;
        r[i].params.max_tokens = 32;
    }
    tandem_engine *e1 = cuda_batch_engine(t, NULL, 1, 0, 0, true);
    tandem_result *want = calloc(n, sizeof *want);
    cr_assert_eq(tandem_generate_batch(e1, r, n, want), TANDEM_OK);
    const int sizes[] = {8, 32};
    for (int dr = 0; dr < 2; dr++)
        for (int si = 0; si < 2; si++) {
            tandem_engine *e = cuda_batch_engine(t, dr ? d : NULL, sizes[si], 0, 0, true);
            char what[64];
            snprintf(what, sizeof what, "%s, batch %d", dr ? "draft" : "target only", sizes[si]);
            cuda_batch_compare(e, r, want, n, what, true);
            tandem_engine_close(e);
        }
    /* prompts prefilled 16 rows a step beside the decodes; a pool of ~3 sequences */
    tandem_model_info mi;
    tandem_model_get_info(t, &mi);
    tandem_engine *e = cuda_batch_engine(t, NULL, 8, 16, (size_t)mi.kv_bytes_per_token * 3 * 192, true);
    cuda_batch_compare(e, r, want, n, "budget 16, small pool", true);
    tandem_engine_stats st;
    tandem_engine_get_stats(e, &st);
    printf("cuda batch: small pool: %llu preemptions\n", (unsigned long long)st.n_preemptions);
    cr_assert_gt(st.n_preemptions, 0);
    cr_assert_eq(st.kv_blocks_free, st.kv_blocks_total);
    tandem_engine_close(e);
    /* rows shared by one forward: counted, not required */
    e = cuda_batch_engine(t, NULL, 32, 0, 0, false);
    int same = cuda_batch_compare(e, r, want, n, "batch 32, batch_invariant off", false);
    cr_assert_geq(same, (int)n * 9 / 10);
    tandem_engine_close(e);
    /* sampling: the batch does not change a request's tokens */
    for (size_t i = 0; i < n; i++) {
        r[i].params.temperature = 0.8f;
        r[i].params.seed = 77 + i;
        tandem_result_free(&want[i]);
    }
    cr_assert_eq(tandem_generate_batch(e1, r, n, want), TANDEM_OK);
    e = cuda_batch_engine(t, d, 16, 0, 0, true);
    cuda_batch_compare(e, r, want, n, "sampled, draft, batch 16", true);
    tandem_engine_close(e);
    for (size_t i = 0; i < n; i++) tandem_result_free(&want[i]), free(ids[i]);
    free(want), free(ids), free(r);
    tandem_engine_close(e1);
    tdm_test_jsonl_free(refs, n);
    tandem_model_close(d);
    tandem_model_close(t);
}
