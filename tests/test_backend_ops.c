/* test_backend_ops.c - every CPU op, at every SIMD level this machine has, against
 * the reference implementations in ref_ops.c; determinism across thread counts;
 * argument validation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_testutil.h"
#include "cpu_internal.h"
#include "ref_ops.h"
#include "testutil.h"

/* ---- helpers (and backend_testutil.h) --------------------------------------------- */

static const uint32_t all_types[] = {TDM_F32,  TDM_F16,  TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1, TDM_Q5_0,
                                     TDM_Q5_1, TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};
/* the types of the original matmul test (any multiple of 32 columns, f32 arithmetic) */
#define N_F32_TYPES 5

static bool is_quant(uint32_t t) { return tdm_dtype_block_elems(t) > 1; }
/* A column count of about c that the type's blocks divide. */
static int64_t type_cols(uint32_t t, int64_t c) {
    int64_t be = tdm_dtype_block_elems(t);
    return (c + be - 1) / be * be;
}

/* ---- matmul -------------------------------------------------------------------- */

static void check_matmul(tdm_backend *b, uint32_t type, int64_t rows, int64_t cols, int32_t n,
                         bool acc, uint64_t seed) {
    uint64_t rng = seed;
    tdm_weight w = tdm_test_weight(type, rows, cols, &rng);
    double e = tdm_test_matmul_err(b, &w, &w, n, acc, &rng);
    cr_assert(e < 1e-5, "matmul %s level %d [%lld][%lld] n=%d acc=%d: err %g", tdm_dtype_name(type),
              tdm_backend_cpu_level(b), (long long)rows, (long long)cols, n, acc, e);
    free((void *)w.data);
}

Test(matmul, all_levels_types_shapes) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    /* rows, cols, n */
    static const int64_t shapes[][3] = {
        {1, 32, 1},   {5, 64, 1},    {4, 32, 2},    {7, 96, 3},   {33, 160, 5},  {64, 384, 1},
        {130, 128, 17}, {45, 256, 128}, {17, 32, 9}, {300, 64, 4}, {129, 1024, 2},
    };
    static const int64_t odd_shapes[][3] = {{3, 1, 1},  {9, 7, 2},   {11, 17, 5},
                                            {6, 37, 1}, {21, 100, 6}, {40, 15, 33}};
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        for (size_t t = 0; t < N_F32_TYPES; t++) {
            for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
                for (int acc = 0; acc < 2; acc++)
                    check_matmul(b, all_types[t], shapes[s][0], shapes[s][1], (int32_t)shapes[s][2],
                                 acc, 1000 + s * 7 + t);
            if (!is_quant(all_types[t]))
                for (size_t s = 0; s < TDM_ARRAY_LEN(odd_shapes); s++)
                    check_matmul(b, all_types[t], odd_shapes[s][0], odd_shapes[s][1],
                                 (int32_t)odd_shapes[s][2], s & 1, 2000 + s);
        }
        tdm_backend_destroy(b);
    }
}

/* The integer-dot types (qdot.h) at every level: against the f32 reference on x
 * itself (the int8 rounding of x: below 2 %), against the reference on x as the
 * kernels quantise it (f32 rounding only: below 1e-5), and bit-identical to the
 * scalar level. */
static void check_qdot(tdm_backend *b, tdm_backend *b0, uint32_t type, int64_t rows, int64_t cols, int32_t n,
                       bool acc, uint64_t seed) {
    uint64_t rng = seed;
    tdm_weight w = tdm_test_weight(type, rows, cols, &rng);
    size_t ny = (size_t)n * (size_t)rows;
    float *x = tdm_test_rand_vec(&rng, (size_t)n * (size_t)cols, -1, 1);
    float *y0 = tdm_test_rand_vec(&rng, ny, -1, 1);
    float *y = malloc(ny * 4), *ys = malloc(ny * 4), *yr = malloc(ny * 4), *yq = malloc(ny * 4);
    memcpy(y, y0, ny * 4), memcpy(ys, y0, ny * 4), memcpy(yr, y0, ny * 4), memcpy(yq, y0, ny * 4);
    tdm_err err = {0};
    cr_assert_eq(b->ops->matmul(b, &w, x, n, y, acc, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(b0->ops->matmul(b0, &w, x, n, ys, acc, &err), TANDEM_OK, "%s", err.msg);
    ref_matmul(&w, x, n, yr, acc);
    /* x as the kernels see it: qx * dx */
    void *buf = tdm_alloc_aligned(tdm_xq_bytes(type, cols, n) + 64, 64);
    tdm_xq xq;
    tdm_xq_quantize(type, x, n, cols, 0, n, buf, &xq);
    float *xd = malloc((size_t)n * cols * 4);
    for (int64_t k = 0; k < (int64_t)n * cols; k++)
        xd[k] = (float)xq.q[k] * xq.d[k / xq.blk];
    ref_matmul(&w, xd, n, yq, acc);
    double e = ref_nrm_err(y, yr, ny), eq = ref_nrm_err(y, yq, ny);
    const char *nm = tdm_dtype_name(type);
    int lv = tdm_backend_cpu_level(b);
    cr_assert(e < 2e-2, "%s level %d [%lld][%lld] n=%d acc=%d: err %g vs f32 x", nm, lv, (long long)rows,
              (long long)cols, n, acc, e);
    cr_assert(eq < 1e-5, "%s level %d [%lld][%lld] n=%d acc=%d: err %g vs quantised x", nm, lv, (long long)rows,
              (long long)cols, n, acc, eq);
    cr_assert(memcmp(y, ys, ny * 4) == 0, "%s level %d [%lld][%lld] n=%d: differs from the scalar level", nm, lv,
              (long long)rows, (long long)cols, n);
    tdm_free_aligned(buf);
    free(xd), free(x), free(y0), free(y), free(ys), free(yr), free(yq);
    free((void *)w.data);
}

Test(matmul, qdot_types_all_levels) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    /* rows, cols, n: partial groups of 4 W rows, one and several blocks, every x
     * row count of the kernels' register blocks, x chunks past 16 and 64 */
    static const int64_t shapes[][3] = {{1, 256, 1},  {5, 512, 1},   {7, 256, 3},  {33, 768, 5}, {64, 256, 17},
                                        {45, 512, 70}, {130, 1024, 2}, {17, 256, 9}, {6, 256, 4},  {9, 512, 6}};
    tdm_backend *b0 = tdm_test_backend(TDM_CPU_SCALAR, 2);
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        for (size_t t = N_F32_TYPES; t < TDM_ARRAY_LEN(all_types); t++)
            for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
                check_qdot(b, b0, all_types[t], shapes[s][0], shapes[s][1], (int32_t)shapes[s][2], s & 1,
                           3000 + s * 13 + t);
        /* 32-element types: rows of fewer than 256 columns */
        for (size_t t = N_F32_TYPES; t < TDM_ARRAY_LEN(all_types); t++)
            if (!tdm_dtype_is_kquant(all_types[t])) {
                check_qdot(b, b0, all_types[t], 4, 32, 2, false, 4000 + t);
                check_qdot(b, b0, all_types[t], 7, 96, 3, true, 4100 + t);
            }
        tdm_backend_destroy(b);
    }
    tdm_backend_destroy(b0);
}

/* The types whose few-row matmul reads the file's blocks directly (k_qgemv, AVX-512
 * VNNI): every n up to past TDM_QGEMV_MAX, the real pair's row lengths (1536, 4864,
 * 8960; Q5_0 also 896 and rows of an odd block count), partial groups of 4 W rows;
 * the same bits as the scalar level at every level. */
Test(matmul, qdot_direct_few_rows) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    static const uint32_t types[] = {TDM_Q4_K, TDM_Q6_K, TDM_Q5_0};
    static const int64_t shapes[][2] = {{13, 1536}, {6, 4864}, {9, 8960}, {3, 256}};
    tdm_backend *b0 = tdm_test_backend(TDM_CPU_SCALAR, 2);
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++) {
            for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
                for (int32_t n = 1; n <= TDM_QGEMV_MAX + 1; n++)
                    check_qdot(b, b0, types[t], shapes[s][0], shapes[s][1], n, n & 1, 5000 + s * 31 + n + t);
            if (types[t] == TDM_Q5_0) /* 28, 3 and 1 blocks: the odd last block alone */
                for (int32_t n = 1; n <= 5; n++) {
                    check_qdot(b, b0, types[t], 10, 896, n, n & 1, 5400 + n);
                    check_qdot(b, b0, types[t], 5, 96, n, false, 5500 + n);
                    check_qdot(b, b0, types[t], 7, 32, n, true, 5600 + n);
                }
        }
        tdm_backend_destroy(b);
    }
    tdm_backend_destroy(b0);
}

/* A NaN in x makes that row's outputs NaN (not finite garbage from its int8 form). */
Test(matmul, qdot_nan_input) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 1);
        for (size_t t = N_F32_TYPES; t < TDM_ARRAY_LEN(all_types); t++) {
            uint64_t rng = 9;
            tdm_weight w = tdm_test_weight(all_types[t], 8, 256, &rng);
            float *x = tdm_test_rand_vec(&rng, 512, -1, 1), y[16];
            x[300] = NAN;
            cr_assert_eq(b->ops->matmul(b, &w, x, 2, y, false, NULL), TANDEM_OK);
            for (int r = 0; r < 8; r++) {
                cr_assert(isfinite(y[r]), "%s row 0", tdm_dtype_name(all_types[t]));
                cr_assert(isnan(y[8 + r]), "%s row 1: %g", tdm_dtype_name(all_types[t]), y[8 + r]);
            }
            free(x);
            free((void *)w.data);
        }
        tdm_backend_destroy(b);
    }
}

/* Bit-identical across thread counts, and row i of a batched matmul equals the
 * matmul of row i alone (decode and verification agree exactly). */
Test(matmul, deterministic_threads_and_batch) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    const int64_t rows = 203;
    for (int32_t n = 11; n <= 20; n += 9) /* 11: the direct path; 20: the tile path vs direct rows */
    for (int l = 0; l < nl; l++) {
        tdm_backend *bs[3] = {tdm_test_backend(lv[l], 1), tdm_test_backend(lv[l], 2), tdm_test_backend(lv[l], 3)};
        for (size_t t = 0; t < TDM_ARRAY_LEN(all_types); t++) {
            uint64_t rng = 77 + t;
            const int64_t cols = type_cols(all_types[t], 192);
            tdm_weight w = tdm_test_weight(all_types[t], rows, cols, &rng);
            float *x = tdm_test_rand_vec(&rng, (size_t)n * cols, -2, 2);
            float *y[3];
            for (int k = 0; k < 3; k++) {
                y[k] = calloc((size_t)n * rows, sizeof(float));
                cr_assert_eq(bs[k]->ops->matmul(bs[k], &w, x, n, y[k], false, NULL), TANDEM_OK);
            }
            cr_assert(memcmp(y[0], y[1], (size_t)n * rows * 4) == 0, "1 vs 2 threads, %s level %d",
                      tdm_dtype_name(all_types[t]), lv[l]);
            cr_assert(memcmp(y[0], y[2], (size_t)n * rows * 4) == 0, "1 vs 3 threads, %s level %d",
                      tdm_dtype_name(all_types[t]), lv[l]);
            float *y1 = calloc((size_t)rows, sizeof(float));
            for (int32_t i = 0; i < n; i++) {
                cr_assert_eq(bs[1]->ops->matmul(bs[1], &w, x + i * cols, 1, y1, false, NULL), TANDEM_OK);
                cr_assert(memcmp(y1, y[0] + i * rows, (size_t)rows * 4) == 0,
                          "row %d alone differs from the batch, %s level %d", i,
                          tdm_dtype_name(all_types[t]), lv[l]);
            }
            free(y1);
            for (int k = 0; k < 3; k++) free(y[k]);
            free(x);
            free((void *)w.data);
        }
        for (int k = 0; k < 3; k++) tdm_backend_destroy(bs[k]);
    }
}

Test(matmul, rejects_bad_args) {
    tdm_backend *b = tdm_test_backend(tdm_cpu_best_level(), 2);
    uint64_t rng = 5;
    tdm_weight w = tdm_test_weight(TDM_F32, 4, 32, &rng);
    float x[64] = {0}, y[8] = {0};
    tdm_err err = {0};
    cr_assert_eq(b->ops->matmul(b, NULL, x, 1, y, false, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->matmul(b, &w, NULL, 1, y, false, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->matmul(b, &w, x, -1, y, false, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "matmul"), "%s", err.msg);
    tdm_weight bad = w;
    bad.type = 77;
    cr_assert_eq(b->ops->matmul(b, &bad, x, 1, y, false, &err), TANDEM_ERR_UNSUPPORTED);
    bad = w;
    bad.type = TDM_Q8_0;
    bad.cols = 33;
    bad.row_bytes = 1000;
    cr_assert_eq(b->ops->matmul(b, &bad, x, 1, y, false, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "multiple of 32"), "%s", err.msg);
    bad = w;
    bad.row_bytes = 8;
    cr_assert_eq(b->ops->matmul(b, &bad, x, 1, y, false, &err), TANDEM_ERR_INVALID_ARG);
    bad = w;
    bad.data = NULL;
    cr_assert_eq(b->ops->matmul(b, &bad, x, 1, y, false, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->matmul(b, &w, x, 0, y, false, &err), TANDEM_OK);
    free((void *)w.data);
    tdm_backend_destroy(b);
}

/* ---- get_rows, rmsnorm, add_bias, swiglu, gather_rows --------------------------- */

Test(ops, get_rows_all_types) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        for (size_t t = 0; t < TDM_ARRAY_LEN(all_types); t++) {
            int64_t cols = is_quant(all_types[t]) ? type_cols(all_types[t], 96) : 45;
            uint64_t rng = 11 + t;
            tdm_weight w = tdm_test_weight(all_types[t], 50, cols, &rng);
            int32_t ids[7] = {0, 49, 3, 3, 17, 25, 48};
            float *out = calloc(7 * (size_t)cols, 4), *ref = calloc(7 * (size_t)cols, 4);
            cr_assert_eq(b->ops->get_rows(b, &w, ids, 7, out, NULL), TANDEM_OK);
            ref_get_rows(&w, ids, 7, ref);
            cr_assert(memcmp(out, ref, 7 * (size_t)cols * 4) == 0, "get_rows %s level %d",
                      tdm_dtype_name(all_types[t]), lv[l]);
            int32_t bad = 50;
            tdm_err err = {0};
            cr_assert_eq(b->ops->get_rows(b, &w, &bad, 1, out, &err), TANDEM_ERR_INVALID_ARG);
            free(out);
            free(ref);
            free((void *)w.data);
        }
        tdm_backend_destroy(b);
    }
}

/* Every f16 bit pattern (subnormals, inf, NaN) converts exactly, at every level
 * (bit-exact except NaN payloads). */
Test(ops, get_rows_f16_exhaustive) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    uint16_t *h = malloc(65536 * 2);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    tdm_weight w = {.type = TDM_F16, .rows = 1024, .cols = 64, .row_bytes = 128, .data = h};
    int32_t ids[1024];
    for (int i = 0; i < 1024; i++) ids[i] = 1023 - i;
    float *out = malloc(65536 * 4), *ref = malloc(65536 * 4);
    ref_get_rows(&w, ids, 1024, ref);
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        cr_assert_eq(b->ops->get_rows(b, &w, ids, 1024, out, NULL), TANDEM_OK);
        for (int i = 0; i < 65536; i++) {
            /* F16C quiets signalling NaNs: NaNs need only stay NaN */
            if (isnan(ref[i])) {
                cr_assert(isnan(out[i]), "element %d: not NaN at level %d", i, lv[l]);
                continue;
            }
            cr_assert(memcmp(&out[i], &ref[i], 4) == 0, "f16 conversion differs at level %d: %g vs %g",
                      lv[l], (double)out[i], (double)ref[i]);
        }
        tdm_backend_destroy(b);
    }
    free(h);
    free(out);
    free(ref);
}

Test(ops, rmsnorm_bias_swiglu_gather) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    static const int32_t dims[][2] = {{1, 1}, {3, 7}, {5, 384}, {64, 1000}, {2, 33}};
    for (int l = 0; l < nl; l++)
        for (int nt = 1; nt <= 3; nt++) {
            tdm_backend *b = tdm_test_backend(lv[l], nt);
            for (size_t s = 0; s < TDM_ARRAY_LEN(dims); s++) {
                int32_t n = dims[s][0], dim = dims[s][1];
                size_t nd = (size_t)n * dim;
                uint64_t rng = 31 + s;
                float *x = tdm_test_rand_vec(&rng, 2 * nd, -3, 3), *g = tdm_test_rand_vec(&rng, (size_t)dim * 2, -2, 2);
                float *out = calloc(2 * nd, 4), *ref = calloc(2 * nd, 4);
                /* rmsnorm, also in place */
                cr_assert_eq(b->ops->rmsnorm(b, x, g, n, dim, 1e-5f, out, NULL), TANDEM_OK);
                ref_rmsnorm(x, g, n, dim, 1e-5f, ref);
                cr_assert(ref_nrm_err(out, ref, nd) < 1e-6, "rmsnorm n=%d dim=%d", n, dim);
                memcpy(out, x, nd * 4);
                cr_assert_eq(b->ops->rmsnorm(b, out, g, n, dim, 1e-5f, out, NULL), TANDEM_OK);
                cr_assert(ref_nrm_err(out, ref, nd) < 1e-6, "rmsnorm in place n=%d dim=%d", n, dim);
                /* add_bias */
                memcpy(out, x, nd * 4);
                memcpy(ref, x, nd * 4);
                cr_assert_eq(b->ops->add_bias(b, out, g, n, dim, NULL), TANDEM_OK);
                ref_add_bias(ref, g, n, dim);
                cr_assert(memcmp(out, ref, nd * 4) == 0, "add_bias");
                /* swiglu: x viewed as [n][2 * dim] */
                cr_assert_eq(b->ops->swiglu(b, x, n, dim, out, NULL), TANDEM_OK);
                ref_swiglu(x, n, dim, ref);
                cr_assert(ref_nrm_err(out, ref, nd) < 1e-6, "swiglu n=%d ff=%d", n, dim);
                /* gather_rows: reversed order with a repeat */
                int32_t *rows = calloc((size_t)n + 1, sizeof(int32_t));
                for (int32_t i = 0; i < n; i++) rows[i] = n - 1 - i;
                rows[n] = 0;
                cr_assert_eq(b->ops->gather_rows(b, x, rows, n + 1, dim, out, NULL), TANDEM_OK);
                ref_gather_rows(x, rows, n + 1, dim, ref);
                cr_assert(memcmp(out, ref, ((size_t)n + 1) * dim * 4) == 0, "gather_rows");
                free(rows);
                free(x);
                free(g);
                free(out);
                free(ref);
            }
            tdm_err err = {0};
            float v[4] = {0};
            cr_assert_eq(b->ops->rmsnorm(b, NULL, v, 1, 4, 1e-5f, v, &err), TANDEM_ERR_INVALID_ARG);
            cr_assert_eq(b->ops->rmsnorm(b, v, v, -1, 4, 1e-5f, v, &err), TANDEM_ERR_INVALID_ARG);
            cr_assert_eq(b->ops->swiglu(b, v, 1, 0, v, &err), TANDEM_ERR_INVALID_ARG);
            cr_assert_eq(b->ops->add_bias(b, v, NULL, 1, 4, &err), TANDEM_ERR_INVALID_ARG);
            int32_t neg = -1;
            cr_assert_eq(b->ops->gather_rows(b, v, &neg, 1, 4, v, &err), TANDEM_ERR_INVALID_ARG);
            tdm_backend_destroy(b);
        }
}

/* The vectorised exp inside swiglu over a wide range of inputs. */
/* rmsnorm and rope promise the same floats at every level (cpu_internal.h): each
 * level against the scalar level, bit for bit, over odd and vector-sized shapes. */
Test(ops, rmsnorm_rope_same_at_every_level) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    static const int32_t dims[] = {1, 7, 8, 33, 384, 1000};
    static const tdm_rope_params params[] = {{64, 10000.0f, 1.0f, false, NULL, 0}, {64, 10000.0f, 1.0f, true, NULL, 0},
                                             {48, 10000.0f, 1.0f, false, NULL, 0}, {6, 100.0f, 1.0f, false, NULL, 0}};
    const int32_t n = 9, n_head = 3, head_dim = 64, stride = 3 * 64;
    int32_t pos[9];
    for (int i = 0; i < n; i++) pos[i] = i * 131 % 900;
    uint64_t rng = 77;
    float *x = tdm_test_rand_vec(&rng, (size_t)n * 1000, -30, 30), *g = tdm_test_rand_vec(&rng, 1000, -2, 2);
    float *out[TDM_CPU_N_LEVELS];
    for (size_t d = 0; d < TDM_ARRAY_LEN(dims); d++) {
        for (int l = 0; l < nl; l++) {
            tdm_backend *b = tdm_test_backend(lv[l], 1);
            out[l] = malloc((size_t)n * dims[d] * 4);
            cr_assert_eq(b->ops->rmsnorm(b, x, g, n, dims[d], 1e-6f, out[l], NULL), TANDEM_OK);
            tdm_backend_destroy(b);
        }
        for (int l = 1; l < nl; l++) {
            cr_assert(memcmp(out[0], out[l], (size_t)n * dims[d] * 4) == 0, "rmsnorm dim %d: level %d differs",
                      (int)dims[d], lv[l]);
        }
        for (int l = 0; l < nl; l++) free(out[l]);
    }
    for (size_t p = 0; p < TDM_ARRAY_LEN(params); p++) {
        for (int l = 0; l < nl; l++) {
            tdm_backend *b = tdm_test_backend(lv[l], 1);
            out[l] = malloc((size_t)n * stride * 4);
            memcpy(out[l], x, (size_t)n * stride * 4);
            cr_assert_eq(b->ops->rope(b, out[l], n, stride, n_head, head_dim, pos, &params[p], NULL), TANDEM_OK);
            tdm_backend_destroy(b);
        }
        for (int l = 1; l < nl; l++)
            cr_assert(memcmp(out[0], out[l], (size_t)n * stride * 4) == 0, "rope params %zu: level %d differs", p,
                      lv[l]);
        for (int l = 0; l < nl; l++) free(out[l]);
    }
    free(x);
    free(g);
}

Test(ops, swiglu_wide_range) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    const int32_t n = 3, ff = 1001;
    uint64_t rng = 99;
    float *x = tdm_test_rand_vec(&rng, (size_t)n * 2 * ff, -1, 1);
    for (int32_t i = 0; i < n; i++)
        for (int32_t k = 0; k < ff; k++) x[(size_t)i * 2 * ff + k] = -120.0f + 240.0f * (float)k / ff;
    float *out = calloc((size_t)n * ff, 4), *ref = calloc((size_t)n * ff, 4);
    ref_swiglu(x, n, ff, ref);
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        cr_assert_eq(b->ops->swiglu(b, x, n, ff, out, NULL), TANDEM_OK);
        for (size_t i = 0; i < (size_t)n * ff; i++)
            cr_assert(fabsf(out[i] - ref[i]) <= 1e-6f * fabsf(ref[i]) + 1e-30f, "level %d: [%zu] %g vs %g",
                      lv[l], i, (double)out[i], (double)ref[i]);
        tdm_backend_destroy(b);
    }
    free(x);
    free(out);
    free(ref);
}

/* ---- rope ---------------------------------------------------------------------- */

Test(ops, rope_layouts) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    static const tdm_rope_params params[] = {
        {64, 10000.0f, 1.0f, false, NULL, 0}, {64, 10000.0f, 1.0f, true, NULL, 0}, {32, 500000.0f, 0.25f, false, NULL, 0},
        {16, 10000.0f, 1.0f, true, NULL, 0},  {2, 100.0f, 2.0f, false, NULL, 0},
    };
    const int32_t n = 13, n_head = 3, head_dim = 64, stride = 3 * 64 + 5;
    int32_t pos[13];
    for (int i = 0; i < n; i++) pos[i] = i * 77 % 1000;
    for (int l = 0; l < nl; l++)
        for (size_t p = 0; p < TDM_ARRAY_LEN(params); p++) {
            uint64_t rng = 55 + p;
            float *x = tdm_test_rand_vec(&rng, (size_t)n * stride, -2, 2);
            float *ref = malloc((size_t)n * stride * 4), *y[3];
            memcpy(ref, x, (size_t)n * stride * 4);
            ref_rope(ref, n, stride, n_head, head_dim, pos, &params[p]);
            for (int nt = 1; nt <= 3; nt++) {
                tdm_backend *b = tdm_test_backend(lv[l], nt);
                y[nt - 1] = malloc((size_t)n * stride * 4);
                memcpy(y[nt - 1], x, (size_t)n * stride * 4);
                cr_assert_eq(b->ops->rope(b, y[nt - 1], n, stride, n_head, head_dim, pos, &params[p], NULL),
                             TANDEM_OK);
                tdm_backend_destroy(b);
            }
            double e = ref_nrm_err(y[0], ref, (size_t)n * stride);
            cr_assert(e < 1e-6, "rope params %zu: err %g", p, e);
            /* dims past n_rot and the row padding are untouched */
            for (int i = 0; i < n; i++)
                for (int k = n_head * head_dim; k < stride; k++)
                    cr_assert_eq(y[0][i * stride + k], x[i * stride + k]);
            cr_assert(memcmp(y[0], y[1], (size_t)n * stride * 4) == 0);
            cr_assert(memcmp(y[0], y[2], (size_t)n * stride * 4) == 0);
            for (int k = 0; k < 3; k++) free(y[k]);
            free(x);
            free(ref);
        }
    /* known value: position 1, pair (0, 1), theta = 1 rad */
    tdm_backend *b = tdm_test_backend(TDM_CPU_SCALAR, 1);
    float v[2] = {1.0f, 0.0f};
    int32_t one = 1;
    tdm_rope_params rp = {2, 10000.0f, 1.0f, false, NULL, 0};
    cr_assert_eq(b->ops->rope(b, v, 1, 2, 1, 2, &one, &rp, NULL), TANDEM_OK);
    cr_assert_float_eq(v[0], cosf(1.0f), 1e-6);
    cr_assert_float_eq(v[1], sinf(1.0f), 1e-6);
    tdm_err err = {0};
    rp.n_rot = 3;
    cr_assert_eq(b->ops->rope(b, v, 1, 2, 1, 2, &one, &rp, &err), TANDEM_ERR_INVALID_ARG);
    tdm_backend_destroy(b);
}

/* ---- KV cache: kv_write + attention -------------------------------------------- */

typedef struct kv_fixture {
    int32_t n_seq;
    tdm_kv_seq seqs[3];
    const tdm_kv_seq *seq_ptrs[3];
    int32_t n_blocks; /* in the cache */
} kv_fixture;

/* Sequences of the given lengths over a pool of blocks handed out in a shuffled
 * order (block tables not in order, interleaved between sequences). */
static void kv_fixture_init(kv_fixture *f, int32_t n_seq, const int32_t *lens, int32_t bs,
                            uint64_t *rng) {
    memset(f, 0, sizeof *f);
    f->n_seq = n_seq;
    int32_t total = 0;
    for (int s = 0; s < n_seq; s++) total += (lens[s] + bs - 1) / bs;
    f->n_blocks = total + 3;
    int32_t *perm = malloc((size_t)f->n_blocks * sizeof(int32_t));
    for (int32_t i = 0; i < f->n_blocks; i++) perm[i] = i;
    for (int32_t i = f->n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(tdm_test_rand(rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t next = 0;
    for (int s = 0; s < n_seq; s++) {
        int32_t nb = (lens[s] + bs - 1) / bs;
        f->seqs[s].blocks = calloc((size_t)nb + 1, sizeof(int32_t));
        f->seqs[s].n_blocks = nb;
        f->seqs[s].cap_blocks = nb + 1;
        f->seqs[s].len = lens[s];
        f->seq_ptrs[s] = &f->seqs[s];
    }
    /* interleave: block b of every sequence in turn */
    for (int32_t b = 0;; b++) {
        bool any = false;
        for (int s = 0; s < n_seq; s++)
            if (b < f->seqs[s].n_blocks) {
                f->seqs[s].blocks[b] = perm[next++];
                any = true;
            }
        if (!any) break;
    }
    free(perm);
}

static void kv_fixture_free(kv_fixture *f) {
    for (int s = 0; s < f->n_seq; s++) free(f->seqs[s].blocks);
}

/* Fills every slot of every sequence with random K/V through kv_write (checked
 * against ref_kv_write), so attention has a full cache to read. */
static void fill_cache(tdm_backend *b, kv_fixture *f, uint32_t ct, int32_t nkv, int32_t hd, int32_t bs,
                       void *kc, void *vc, uint64_t *rng) {
    size_t cache_bytes = (size_t)f->n_blocks * nkv * (size_t)tdm_kv_unit_bytes(ct, bs, hd);
    void *kr = calloc(1, cache_bytes), *vr = calloc(1, cache_bytes);
    for (int s = 0; s < f->n_seq; s++) {
        tdm_batch bt;
        int32_t len = f->seqs[s].len;
        cr_assert_eq(tdm_batch_init(&bt, len, NULL), TANDEM_OK);
        /* slots written in a scrambled order */
        for (int32_t i = 0; i < len; i++) tdm_batch_add(&bt, 0, i, s, tdm_test_scrambled_slot(i, len), false);
        int32_t stride = nkv * hd + 3;
        float *k = tdm_test_rand_vec(rng, (size_t)len * stride, -1, 1), *v = tdm_test_rand_vec(rng, (size_t)len * stride, -1, 1);
        tdm_kv_write_args a = {&bt, f->seq_ptrs, k, v, stride, kc, vc, ct, nkv, hd, bs};
        tdm_err err = {0};
        cr_assert_eq(b->ops->kv_write(b, &a, &err), TANDEM_OK, "%s", err.msg);
        a.k_cache = kr;
        a.v_cache = vr;
        ref_kv_write(&a);
        free(k);
        free(v);
        tdm_batch_free(&bt);
    }
    cr_assert(memcmp(kc, kr, cache_bytes) == 0, "kv_write K differs from the reference");
    cr_assert(memcmp(vc, vr, cache_bytes) == 0, "kv_write V differs from the reference");
    free(kr);
    free(vr);
}

/* kv_write at every level and every cache type, byte-exact against the reference,
 * with values that exercise f16 rounding, subnormals and overflow. */
Test(kv_write, all_levels_exact) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    const int32_t nkv = 2, hd = 40, bs = 8, lens[2] = {29, 11};
    for (int l = 0; l < nl; l++)
        for (int ct = 0; ct < 3; ct++) {
            const uint32_t type = ct == 0 ? TDM_F32 : ct == 1 ? TDM_F16 : TDM_Q8_0;
            uint64_t rng = 123 + ct;
            kv_fixture f;
            kv_fixture_init(&f, 2, lens, bs, &rng);
            size_t bytes = (size_t)f.n_blocks * nkv * (size_t)tdm_kv_unit_bytes(type, bs, hd);
            void *kc = calloc(1, bytes), *vc = calloc(1, bytes), *kr = calloc(1, bytes), *vr = calloc(1, bytes);
            tdm_batch bt;
            cr_assert_eq(tdm_batch_init(&bt, 40, NULL), TANDEM_OK);
            for (int s = 0; s < 2; s++)
                for (int32_t i = 0; i < lens[s]; i++) tdm_batch_add(&bt, 0, i, s, lens[s] - 1 - i, false);
            int32_t stride = nkv * hd + 1;
            float *k = tdm_test_rand_vec(&rng, (size_t)bt.n_rows * stride, -2, 2);
            float *v = tdm_test_rand_vec(&rng, (size_t)bt.n_rows * stride, -1e-5f, 1e-5f); /* f16 subnormals */
            k[0] = 70000.0f;
            k[1] = -65519.0f;
            k[2] = 1.00048828125f; /* a tie: rounds to even */
            tdm_kv_write_args a = {&bt, f.seq_ptrs, k, v, stride, kc, vc, type, nkv, hd, bs};
            tdm_backend *b = tdm_test_backend(lv[l], 2);
            tdm_err err = {0};
            cr_assert_eq(b->ops->kv_write(b, &a, &err), TANDEM_OK, "%s", err.msg);
            tdm_backend_destroy(b);
            a.k_cache = kr;
            a.v_cache = vr;
            ref_kv_write(&a);
            cr_assert(memcmp(kc, kr, bytes) == 0, "K level %d type %s", lv[l], tdm_dtype_name(type));
            cr_assert(memcmp(vc, vr, bytes) == 0, "V level %d type %s", lv[l], tdm_dtype_name(type));
            free(k);
            free(v);
            free(kc);
            free(vc);
            free(kr);
            free(vr);
            tdm_batch_free(&bt);
            kv_fixture_free(&f);
        }
}

typedef struct attn_case {
    int32_t n_head, n_kv_head, head_dim, block_size;
    uint32_t cache_type;
    int32_t n_seq;
    int32_t lens[3];
    bool tree; /* extra slots */
} attn_case;

static void run_attn_case(const attn_case *tc, uint64_t seed) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    uint64_t rng = seed;
    kv_fixture f;
    kv_fixture_init(&f, tc->n_seq, tc->lens, tc->block_size, &rng);
    size_t cache_bytes = (size_t)f.n_blocks * tc->n_kv_head *
                         (size_t)tdm_kv_unit_bytes(tc->cache_type, tc->block_size, tc->head_dim);
    void *kc = calloc(1, cache_bytes), *vc = calloc(1, cache_bytes);
    tdm_backend *b0 = tdm_test_backend(TDM_CPU_SCALAR, 2);
    fill_cache(b0, &f, tc->cache_type, tc->n_kv_head, tc->head_dim, tc->block_size, kc, vc, &rng);
    tdm_backend_destroy(b0);

    /* Batch: for each sequence, the last few positions as causal rows; in tree mode
     * the rows see a prefix plus scattered extra slots past it. */
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, 64, NULL), TANDEM_OK);
    int32_t extra_off[65] = {0}, extra_slot[512];
    int32_t n_extra = 0;
    for (int s = 0; s < tc->n_seq; s++) {
        int32_t len = tc->lens[s];
        for (int32_t p = TDM_MAX(0, len - 5); p < len; p++) {
            int32_t r = tdm_batch_add(&bt, 0, p, s, p, false);
            if (tc->tree) {
                int32_t prefix = len / 2;
                bt.n_visible[r] = prefix;
                for (int32_t e = prefix; e <= p; e += 1 + (e % 3)) extra_slot[n_extra++] = e;
            }
            extra_off[r + 1] = n_extra;
        }
    }
    if (tc->tree) {
        bt.extra_off = malloc(sizeof extra_off);
        bt.extra_slot = malloc(sizeof extra_slot);
        memcpy(bt.extra_off, extra_off, sizeof extra_off);
        memcpy(bt.extra_slot, extra_slot, sizeof extra_slot);
    }
    int32_t q_stride = tc->n_head * tc->head_dim + 2 * tc->n_kv_head * tc->head_dim;
    float *q = tdm_test_rand_vec(&rng, (size_t)bt.n_rows * q_stride, -1.5f, 1.5f);
    size_t n_out = (size_t)bt.n_rows * tc->n_head * tc->head_dim;
    float *ref = calloc(n_out, 4);
    tdm_attn_args a = {&bt, f.seq_ptrs, q, q_stride, ref, kc, vc, tc->cache_type,
                       tc->n_head, tc->n_kv_head, tc->head_dim, tc->block_size,
                       1.0f / sqrtf((float)tc->head_dim), 0, 0};
    ref_attention(&a);
    for (int l = 0; l < nl; l++) {
        float *out[3];
        for (int nt = 1; nt <= 3; nt++) {
            tdm_backend *b = tdm_test_backend(lv[l], nt);
            out[nt - 1] = calloc(n_out, 4);
            a.out = out[nt - 1];
            tdm_err err = {0};
            cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_OK, "%s", err.msg);
            tdm_backend_destroy(b);
        }
        double e = ref_nrm_err(out[0], ref, n_out);
        cr_assert(e < 1e-5, "attention level %d heads %d/%d hd %d %s tree %d: err %g", lv[l], tc->n_head,
                  tc->n_kv_head, tc->head_dim, tdm_dtype_name(tc->cache_type), tc->tree, e);
        cr_assert(memcmp(out[0], out[1], n_out * 4) == 0, "attention 1 vs 2 threads");
        cr_assert(memcmp(out[0], out[2], n_out * 4) == 0, "attention 1 vs 3 threads");
        /* batch invariance: each row alone gives bit-identical output */
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        size_t row_out = (size_t)tc->n_head * tc->head_dim;
        for (int32_t r = 0; r < bt.n_rows; r++) {
            tdm_batch one;
            cr_assert_eq(tdm_batch_init(&one, 1, NULL), TANDEM_OK);
            tdm_batch_add(&one, 0, bt.pos[r], bt.seq[r], bt.slot[r], false);
            one.n_visible[0] = bt.n_visible[r];
            int32_t off1[2] = {0, 0};
            if (bt.extra_off) {
                off1[1] = bt.extra_off[r + 1] - bt.extra_off[r];
                one.extra_off = off1;
                one.extra_slot = bt.extra_slot + bt.extra_off[r];
            }
            float *o1 = calloc(row_out, 4);
            tdm_attn_args a1 = a;
            a1.batch = &one;
            a1.q = q + (size_t)r * q_stride;
            a1.out = o1;
            tdm_err err = {0};
            cr_assert_eq(b->ops->attention(b, &a1, &err), TANDEM_OK, "%s", err.msg);
            cr_assert(memcmp(o1, out[0] + (size_t)r * row_out, row_out * 4) == 0,
                      "attention level %d: row %d alone differs from the batch", lv[l], (int)r);
            one.extra_off = NULL;
            one.extra_slot = NULL;
            tdm_batch_free(&one);
            free(o1);
        }
        tdm_backend_destroy(b);
        for (int k = 0; k < 3; k++) free(out[k]);
    }
    free(ref);
    free(q);
    free(kc);
    free(vc);
    tdm_batch_free(&bt);
    kv_fixture_free(&f);
}

Test(attention, single_seq_mha_f32) {
    attn_case tc = {4, 4, 64, 16, TDM_F32, 1, {37}, false};
    run_attn_case(&tc, 1);
}

Test(attention, gqa_f16_multi_seq) {
    attn_case tc = {6, 2, 64, 16, TDM_F16, 3, {50, 1, 23}, false};
    run_attn_case(&tc, 2);
}

Test(attention, gqa_odd_head_dim_f32) {
    attn_case tc = {4, 1, 13, 4, TDM_F32, 2, {9, 30}, false};
    run_attn_case(&tc, 3);
}

Test(attention, wide_group_long_head) {
    /* 8 query heads per kv head (more than the kernels block together), head_dim
     * with a partial last vector */
    attn_case tc = {8, 1, 100, 16, TDM_F32, 2, {45, 20}, false};
    run_attn_case(&tc, 6);
    attn_case tc2 = {8, 2, 72, 16, TDM_F16, 1, {33}, true};
    run_attn_case(&tc2, 7);
}

Test(attention, tree_extra_slots) {
    attn_case tc1 = {6, 2, 64, 8, TDM_F16, 2, {40, 19}, true};
    run_attn_case(&tc1, 4);
    attn_case tc2 = {2, 2, 24, 32, TDM_F32, 3, {70, 12, 33}, true};
    run_attn_case(&tc2, 5);
}

/* The q8_0 cache (int8 values with a scale per slot and kv head) through the same
 * checks: against the reference over the dequantised cache, threads, batch
 * invariance; GQA ratios 1 to 8, odd head dims and block sizes, tree rows. */
Test(attention, q8_0_cache) {
    attn_case tc1 = {8, 2, 64, 16, TDM_Q8_0, 3, {50, 1, 23}, false};
    run_attn_case(&tc1, 11);
    attn_case tc2 = {4, 4, 13, 5, TDM_Q8_0, 2, {9, 30}, false};
    run_attn_case(&tc2, 12);
    attn_case tc3 = {8, 1, 100, 16, TDM_Q8_0, 1, {45}, true};
    run_attn_case(&tc3, 13);
    attn_case tc4 = {6, 2, 40, 8, TDM_Q8_0, 2, {40, 19}, true};
    run_attn_case(&tc4, 14);
}

Test(attention, rejects_bad_args) {
    tdm_backend *b = tdm_test_backend(tdm_cpu_best_level(), 2);
    uint64_t rng = 9;
    int32_t lens[1] = {8};
    kv_fixture f;
    kv_fixture_init(&f, 1, lens, 4, &rng);
    float cache[4096] = {0}, q[256] = {0}, out[256];
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, 4, NULL), TANDEM_OK);
    tdm_batch_add(&bt, 0, 0, 0, 7, false);
    tdm_attn_args a = {&bt, f.seq_ptrs, q, 64, out, cache, cache, TDM_F32, 2, 1, 32, 4, 0.1f, 0, 0};
    tdm_err err = {0};
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_OK, "%s", err.msg);
    a.n_kv_head = 3;
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_INVALID_ARG);
    a.n_kv_head = 1;
    a.cache_type = TDM_Q4_0;
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_UNSUPPORTED);
    a.cache_type = TDM_F32;
    bt.n_visible[0] = 9; /* beyond the sequence */
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "n_visible"), "%s", err.msg);
    bt.n_visible[0] = 8;
    a.q = NULL;
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_INVALID_ARG);
    a.q = q;
    /* kv_write: slot past the sequence, bad cache type */
    tdm_kv_write_args w = {&bt, f.seq_ptrs, q, q, 32, cache, cache, TDM_F32, 1, 32, 4};
    cr_assert_eq(b->ops->kv_write(b, &w, &err), TANDEM_OK, "%s", err.msg);
    bt.slot[0] = 8;
    cr_assert_eq(b->ops->kv_write(b, &w, &err), TANDEM_ERR_INVALID_ARG);
    bt.slot[0] = 7;
    w.cache_type = TDM_BF16;
    cr_assert_eq(b->ops->kv_write(b, &w, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert_eq(b->ops->kv_write(b, NULL, &err), TANDEM_ERR_INVALID_ARG);
    tdm_batch_free(&bt);
    kv_fixture_free(&f);
    tdm_backend_destroy(b);
}

/* ---- backend creation ---------------------------------------------------------- */

Test(backend, create_levels_and_env) {
    tdm_backend *b = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(0, &b, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_geq(b->n_threads, 1);
    cr_assert_str_eq(b->ops->name, "cpu");
    cr_assert_eq(tdm_backend_cpu_level(b), (int)tdm_cpu_best_level());
    tdm_backend_destroy(b);
    tdm_backend_destroy(NULL);

    tdm_cpu_cap_level(TDM_CPU_SCALAR);
    cr_assert_str_eq(tdm_cpu_features(), "scalar");
    cr_assert_eq(tdm_backend_cpu_create(2, &b, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_backend_cpu_level(b), TDM_CPU_SCALAR);
    tdm_backend_destroy(b);
    if (tdm_cpu_best_level() >= TDM_CPU_AVX2) {
        tdm_cpu_cap_level(TDM_CPU_AVX2);
        cr_assert_str_eq(tdm_cpu_features(), "avx2");
    }
    tdm_cpu_cap_level(TDM_CPU_AVX512); /* never raises the level */
    cr_assert_str_eq(tdm_cpu_features(), tdm_cpu_level_name(tdm_cpu_best_level()));
    tdm_cpu_cap_level(TDM_CPU_N_LEVELS);

    cr_assert_eq(tdm_backend_cpu_create(-1, &b, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(b);
    if (tdm_cpu_best_level() < TDM_CPU_AVX512)
        cr_assert_eq(tdm_backend_cpu_create_level(1, TDM_CPU_AVX512, &b, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert_eq(tdm_backend_cuda_create(0, &b, &err), TANDEM_ERR_BACKEND);
    cr_assert(strstr(err.msg, "without CUDA") || strlen(err.msg) > 0, "%s", err.msg);
}

Test(backend, memory_ops) {
    tdm_backend *b = tdm_test_backend(TDM_CPU_SCALAR, 1);
    void *p = NULL, *q = NULL;
    cr_assert_eq(b->ops->alloc(b, 1000, &p, NULL), TANDEM_OK);
    cr_assert_eq(b->ops->alloc(b, 1000, &q, NULL), TANDEM_OK);
    for (int i = 0; i < 1000; i++) cr_assert_eq(((uint8_t *)p)[i], 0);
    cr_assert_eq((uintptr_t)p % 64, 0);
    char src[1000], dst[1000];
    for (int i = 0; i < 1000; i++) src[i] = (char)(i * 13);
    cr_assert_eq(b->ops->upload(b, p, src, 1000, NULL), TANDEM_OK);
    cr_assert_eq(b->ops->copy(b, q, p, 1000, NULL), TANDEM_OK);
    cr_assert_eq(b->ops->download(b, dst, q, 1000, NULL), TANDEM_OK);
    cr_assert(memcmp(src, dst, 1000) == 0);
    cr_assert_eq(b->ops->upload(b, NULL, src, 10, NULL), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->sync(b, NULL), TANDEM_OK);
    b->ops->free(b, p);
    b->ops->free(b, q);
    tdm_backend_destroy(b);
}

/* A counting task: each thread marks itself. */
typedef struct count_ctx {
    int hits[64];        /* per chunk */
    _Atomic int by[3];   /* chunks run per thread */
} count_ctx;

static void count_task(void *c, int64_t chunk, int ith) {
    count_ctx *x = c;
    x->hits[chunk]++;
    x->by[ith]++;
}

/* Many small back-to-back jobs through the pool (exercises spin and sleep paths). */
/* A pool of n threads whose idle workers sleep at once (spin 0) or spin first. */
static tdm_threadpool *test_pool(int n, int spin) {
    tdm_threadpool *tp = NULL;
    cr_assert_eq(tdm_threadpool_create(n, spin ? TDM_THREADPOOL_SPIN_US : 0, &tp, NULL), TANDEM_OK);
    return tp;
}

Test(backend, threadpool_many_jobs) {
    for (int spin = 0; spin < 2; spin++) {
        tdm_threadpool *tp = test_pool(3, spin);
        cr_assert_eq(tdm_threadpool_size(tp), 3);
        for (int it = 0; it < 2000; it++) {
            count_ctx ctx;
            memset(&ctx, 0, sizeof ctx);
            int nth = 1 + it % 3, n_chunks = it % 64;
            tdm_threadpool_run(tp, n_chunks, nth, count_task, &ctx);
            for (int c = 0; c < 64; c++) cr_assert_eq(ctx.hits[c], c < n_chunks ? 1 : 0);
            int total = 0;
            for (int t = 0; t < 3; t++) {
                total += ctx.by[t];
                if (t >= nth) cr_assert_eq(ctx.by[t], 0, "thread %d ran with max %d", t, nth);
            }
            cr_assert_eq(total, n_chunks);
        }
        tdm_threadpool_destroy(tp);
    }
}

/* tdm_threadpool_for and the CPU backend's host_for (what the step's grammar masks
 * run on): every index exactly once, none past n, for n of 0, 1 and many. */
static void for_task(void *user, int32_t i) { ((_Atomic int *)user)[i]++; }

Test(backend, threadpool_for_and_host_for) {
    tdm_threadpool *tp = test_pool(3, 1);
    tdm_backend *b = NULL;
    cr_assert_eq(tdm_backend_cpu_create(2, &b, NULL), TANDEM_OK);
    cr_assert(b->ops->host_for);
    for (int32_t n = 0; n < 70; n += 1 + n / 8) {
        for (int via = 0; via < 2; via++) {
            _Atomic int hits[72] = {0};
            if (via) b->ops->host_for(b, n, for_task, hits);
            else tdm_threadpool_for(tp, n, for_task, hits);
            for (int32_t i = 0; i < 72; i++) cr_assert_eq(hits[i], i < n ? 1 : 0, "n %d, index %d (via %d)", n, i, via);
        }
    }
    tdm_backend_destroy(b);
    tdm_threadpool_destroy(tp);
}

/* A team task: each member counts its runs, then in every round adds one to a
 * shared counter and checks, between two barriers, that all members did. */
#define TEAM_ROUNDS 20
typedef struct team_ctx {
    tdm_threadpool *tp;
    int n;
    _Atomic int runs[4];     /* per member */
    _Atomic int counter;
    _Atomic int bad;         /* counts seen that a correct barrier rules out */
    _Atomic int ith_ne_chunk;
} team_ctx;

static void team_task(void *c, int64_t chunk, int ith) {
    team_ctx *x = c;
    if (chunk != ith) x->ith_ne_chunk++;
    x->runs[ith]++;
    for (int r = 0; r < TEAM_ROUNDS; r++) {
        x->counter++;
        tdm_team_sync(x->tp, ith);
        if (x->counter != (r + 1) * x->n) x->bad++;
        tdm_team_sync(x->tp, ith);
    }
}

/* Team jobs of every size, mixed with chunked jobs, through sleeping and spinning
 * workers: every member runs exactly once per job and the barrier holds. */
Test(backend, threadpool_team_jobs) {
    for (int spin = 0; spin < 2; spin++) {
        tdm_threadpool *tp = test_pool(4, spin);
        team_ctx bad = {.tp = tp};
        cr_assert(!tdm_threadpool_team(tp, 0, team_task, &bad), "a team of 0");
        cr_assert(!tdm_threadpool_team(tp, 5, team_task, &bad), "a team larger than the pool");
        cr_assert_eq(bad.runs[0], 0);
        for (int it = 0; it < 400; it++) {
            team_ctx ctx = {.tp = tp, .n = 1 + it % 4};
            cr_assert(tdm_threadpool_team(tp, ctx.n, team_task, &ctx));
            for (int t = 0; t < 4; t++)
                cr_assert_eq(ctx.runs[t], t < ctx.n ? 1 : 0, "job %d (team of %d): member %d ran %d times", it,
                             ctx.n, t, (int)ctx.runs[t]);
            cr_assert_eq(ctx.counter, TEAM_ROUNDS * ctx.n);
            cr_assert_eq(ctx.bad, 0, "job %d (team of %d): the barrier let a member through early", it, ctx.n);
            cr_assert_eq(ctx.ith_ne_chunk, 0);
            if (it % 3 == 0) { /* a chunked job in between */
                count_ctx cc;
                memset(&cc, 0, sizeof cc);
                tdm_threadpool_run(tp, 1 + it % 64, 3, count_task, &cc);
                for (int c = 0; c < 64; c++) cr_assert_eq(cc.hits[c], c < 1 + it % 64 ? 1 : 0);
            }
        }
        tdm_threadpool_destroy(tp);
    }
}


/* mask_rows (grammar-constrained decoding's token masks) on every level and with
 * threads: each row's disallowed columns get the fill, the others keep their values
 * bit for bit, against a loop over the bits; a width not a multiple of 32, words all
 * ones, all zeros and mixed; a bad shape is refused. */
Test(ops, mask_rows_against_bits) {
    uint64_t rng = 21;
    const int32_t n = 7, dim = 1000;
    const size_t W = ((size_t)dim + 31) / 32;
    uint32_t *mask = tdm_test_rand_mask(&rng, (size_t)n * W);
    float *x = tdm_test_rand_vec(&rng, (size_t)n * dim, -5, 5), *y = malloc((size_t)n * dim * 4);
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int n_lv = tdm_test_levels(lv);
    for (int l = 0; l < n_lv; l++)
        for (int th = 1; th <= 2; th++) {
            tdm_backend *b = tdm_test_backend(lv[l], th);
            memcpy(y, x, (size_t)n * dim * 4);
            tdm_err err = {0};
            cr_assert_eq(b->ops->mask_rows(b, y, n, dim, mask, -7.0f, &err), TANDEM_OK, "%s", err.msg);
            for (int32_t i = 0; i < n; i++)
                for (int32_t v = 0; v < dim; v++) {
                    const bool on = mask[(size_t)i * W + (size_t)v / 32] >> (v % 32) & 1;
                    cr_assert_eq(y[(size_t)i * dim + v], on ? x[(size_t)i * dim + v] : -7.0f, "row %d column %d", i, v);
                }
            cr_assert_eq(b->ops->mask_rows(b, y, -1, dim, mask, 0, &err), TANDEM_ERR_INVALID_ARG);
            cr_assert_eq(b->ops->mask_rows(b, y, n, 0, mask, 0, &err), TANDEM_ERR_INVALID_ARG);
            cr_assert_eq(b->ops->mask_rows(b, y, n, dim, NULL, 0, &err), TANDEM_ERR_INVALID_ARG);
            tdm_backend_destroy(b);
        }
    free(mask), free(x), free(y);
}
