/* test_cuda_kernels.c - the CUDA backend's fast paths against the reference ops
 * (tests/ref_ops.c) by normalised error, with outputs poisoned (NaN) before each
 * run so an unwritten element fails:
 *   - the row kernels (decode and verification products) for f16, bf16, the
 *     split-layout q8_0 / q4_0 and every other quantised type (the int8 kernels of
 *     q4_k / q5_k / q6_k against x quantised the same way, and their dequantising
 *     reference kernel), odd row counts, 1..16 input rows; every row of a batch
 *     equal bit for bit to the same row alone;
 *   - cuBLAS for many rows (each type, activations rounded to 16 bits);
 *   - attention by tiles and splits: head dims 64, 80, 96, 128, 256, grouped
 *     queries, block sizes 8 / 16 / 32, contexts that are not a multiple of the
 *     block size, up to 4099 keys, many sequences of different lengths in a batch;
 *     a row alone equal bit for bit to the same row in a batch;
 *   - f16, q8_0 and fp8 caches (fp8: E4M3 codes with their scales) throughout;
 *   - batched decode and verification attention (64 sequences of 1 .. 4099 keys,
 *     1 or 5 rows each, every head dim, MHA and GQA, block sizes 8 / 16 / 32): the
 *     decode kernel against ref_attention, the tiled kernel and each row alone, bit
 *     for bit;
 *   - token-tree attention on random trees of up to 64 nodes against the CPU
 *     backend and the dense masked reference, every cache type and head dim: the
 *     tiled and decode kernels with tree masks (cuda_flash.cu, cuda_decode_attn.cu)
 *     where they run the shape, bit for bit alike and each row alone as in the
 *     batch, every tree row bit for bit equal to a causal row over its keys at
 *     consecutive slots (what target-only decoding computes), and the scores and
 *     softmax kernels (the masks as extra slots, TDM_CUDA_ATTN_SCORES); kv_move
 *     against the reference values.
 * (The fused forward, argmax and sampling on the device: test_cuda_fused.c.)
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

/* Each of rows pick[0..n_pick) of x (device, n rows of w->cols) multiplied alone
 * gives bit for bit row pick[i] of y (host, the batch's result). */
static void rows_alone(tdm_backend *b, const tdm_weight *dw, const float *dx, const float *y, int32_t n,
                       const int32_t *pick, size_t n_pick) {
    for (size_t p = 0; p < n_pick; p++) {
        float *dy1 = tdm_cu_test_put(b, NULL, (size_t)dw->rows * 4);
        OK(b->ops->matmul(b, dw, dx + (size_t)pick[p] * dw->cols, 1, dy1, false, &err_));
        float *y1 = tdm_cu_test_get(b, dy1, (size_t)dw->rows * 4);
        cr_assert(memcmp(y1, y + (size_t)pick[p] * dw->rows, (size_t)dw->rows * 4) == 0,
                  "%s [%lld][%lld] n %d: row %d alone differs from the batch", tdm_dtype_name(dw->type),
                  (long long)dw->rows, (long long)dw->cols, n, (int)pick[p]);
        free(y1);
        b->ops->free(b, dy1);
    }
}

static const uint32_t fast_types[] = {TDM_F16,  TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1, TDM_Q5_0,
                                      TDM_Q5_1, TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};

static bool is_quant(uint32_t t) { return t == TDM_Q8_0 || t == TDM_Q4_0; }
/* The types whose row kernels read x quantised to int8 per 32-element block: the
 * split-layout q8_0 / q4_0 and the K-quants of cuda_gemv_kq.cu. */
static bool is_kq_int8(uint32_t t) { return t == TDM_Q4_K || t == TDM_Q5_K || t == TDM_Q6_K; }
static bool reads_xq(uint32_t t) { return is_quant(t) || is_kq_int8(t); }
/* Normalised error bound against the reference with x quantised the same way: the
 * q8_0 / q4_0 kernels sum whole blocks in integers (one f32 product a block); the
 * K-quant kernels add two or four f32 products a chunk (scales, mins), more f32
 * roundings (ny < 8: one or a few output values, each its own relative error). */
static double xq_tol(uint32_t t, size_t ny) { return is_kq_int8(t) ? (ny < 8 ? 1e-3 : 2e-5) : 1e-5; }

/* One product of n rows of x by dw (the device copy of w), stored or accumulated
 * (stored: outputs poisoned first), checked: the types that read x quantised to
 * int8 against x quantised the same way (xq_tol) and against f32 x (2e-2; the
 * K-quants over 8 values or more: one value's own relative error from x's rounding
 * can pass 2e-2 where the value is near zero), the others against f32 x (one
 * output value: relative to that value, which the accumulated y0 can bring near
 * zero; f32 sums stay within 2e-5 of it); rows 0, n / 2 and n - 1 alone bit for
 * bit as in the batch.  kq_ref: the same product on the dequantising reference
 * kernel (force_matmul 3, f32 x) as well, within f32 rounding of the f32
 * reference. */
static void check_product(tdm_backend *b, const tdm_weight *w, const tdm_weight *dw, int32_t n, int acc,
                          uint64_t *rng, bool kq_ref) {
    const size_t ny = (size_t)n * w->rows;
    float *x = tdm_test_rand_vec(rng, (size_t)n * w->cols, -1, 1);
    float *y0 = tdm_test_rand_vec(rng, ny, -1, 1), *ref = malloc(ny * 4), *ref32 = malloc(ny * 4);
    memcpy(ref, y0, ny * 4);
    memcpy(ref32, y0, ny * 4);
    float *dx = tdm_cu_test_put(b, x, (size_t)n * w->cols * 4), *dy = tdm_cu_test_put(b, y0, ny * 4);
    if (!acc) poison(b, dy, ny);
    OK(b->ops->matmul(b, dw, dx, n, dy, acc, &err_));
    float *y = tdm_cu_test_get(b, dy, ny * 4);
    ref_matmul(w, x, n, ref32, acc);
    const double e32 = ref_nrm_err(y, ref32, ny), tol32 = ny < 8 ? 2e-5 : 2e-6;
    const char *name = tdm_dtype_name(w->type);
    const long long rows = (long long)w->rows, cols = (long long)w->cols;
    if (reads_xq(w->type)) {
        ref_matmul_xq(w, x, n, ref, acc);
        const double e = ref_nrm_err(y, ref, ny);
        cr_assert(e < xq_tol(w->type, ny), "%s [%lld][%lld] n %d acc %d: err %g against quantised x", name, rows, cols,
                  n, acc, e);
        if (is_quant(w->type) || ny >= 8)
            cr_assert(e32 < 2e-2, "%s [%lld][%lld] n %d: err %g against f32 x", name, rows, cols, n, e32);
    } else {
        cr_assert(e32 < tol32, "%s [%lld][%lld] n %d acc %d: err %g", name, rows, cols, n, acc, e32);
    }
    if (!acc && n > 1) {
        const int32_t pick[] = {0, n / 2, n - 1};
        rows_alone(b, dw, dx, y, n, pick, TDM_ARRAY_LEN(pick));
    }
    if (kq_ref) {
        OK(b->ops->upload(b, dy, y0, ny * 4, &err_));
        if (!acc) poison(b, dy, ny);
        tdm_backend_cuda_force_matmul(b, 3);
        OK(b->ops->matmul(b, dw, dx, n, dy, acc, &err_));
        tdm_backend_cuda_force_matmul(b, 0);
        float *yr = tdm_cu_test_get(b, dy, ny * 4);
        const double er = ref_nrm_err(yr, ref32, ny);
        cr_assert(er < tol32, "%s [%lld][%lld] n %d acc %d: reference kernel err %g", name, rows, cols, n, acc, er);
        free(yr);
    }
    free(y), free(x), free(y0), free(ref), free(ref32);
    b->ops->free(b, dx);
    b->ops->free(b, dy);
}

/* Every fast type at shapes that take each column split of the f16 / bf16 kernels
 * (cuda_gemv.cu's gv_ksplit, on a GPU of 100+ multiprocessors: [1031][256] one part,
 * [67][768] two, [300][4096] and [2][11008] four), 1 to 16 rows, stored and
 * accumulated (check_product). */
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
                for (int acc = 0; acc < 2; acc++) check_product(b, &w, &dw, ns[k], acc, &rng, false);
            b->ops->free(b, (void *)dw.data);
            free((void *)w.data);
        }
    tdm_backend_destroy(b);
}

/* The K-quant int8 kernels (cuda_gemv_kq.cu) at every row count of decode and
 * verification, 1 to 9 (9: a full tile of 8 and a partial one, a launch of its own
 * on the tall [2200][512]), on shapes that take each column split of theirs on a GPU
 * of 100+ multiprocessors ([1031][256] and [2200][512] none, [600][2048] two parts,
 * [300][4096] and [3][11008] four), stored and accumulated, with their reference
 * kernel (check_product).  (The SwiGLU epilogue: test_cuda_fused.c's q4_k / q5_k /
 * q6_k models, fused against op by op.) */
Test(cuda_gemv, kquant_int8_rows_1_to_9, .timeout = 300) {
    tdm_backend *b = tdm_cu_test_gpu();
    uint64_t rng = 59;
    const uint32_t types[] = {TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};
    const int64_t shapes[][2] = {{1031, 256}, {2200, 512}, {600, 2048}, {300, 4096}, {3, 11008}};
    for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++)
        for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
            tdm_weight w = tdm_test_weight(types[t], shapes[s][0], shapes[s][1], &rng);
            tdm_weight dw = put_packed(b, &w);
            cr_assert_eq(dw.layout, TDM_LAYOUT_ROWS, "K-quants load in their rows layout");
            for (int32_t n = 1; n <= 9; n++)
                for (int acc = 0; acc < 2; acc++) check_product(b, &w, &dw, n, acc, &rng, true);
            b->ops->free(b, (void *)dw.data);
            free((void *)w.data);
        }
    tdm_backend_destroy(b);
}

/* The row kernels past 16 rows (a token tree's verification: up to 64 rows, tiles
 * of 8, the last partial: in the same launch on a weight of 300 rows, a launch of
 * its own on a tall one of 2200, which also takes the f16 / bf16 kernel of four W
 * rows a warp, its columns in two parts): against the reference, and each row bit
 * for bit as it is alone (a decode step). */
Test(cuda_gemv, partial_tiles, .timeout = 300) {
    tdm_backend *b = tdm_cu_test_gpu();
    tdm_backend_cuda_force_matmul(b, 1);
    uint64_t rng = 47;
    const int32_t ns[] = {17, 33, 63};
    for (size_t t = 0; t < 2 * TDM_ARRAY_LEN(fast_types); t++) {
        tdm_weight w = tdm_test_weight(fast_types[t / 2], t % 2 ? 2200 : 300, 512, &rng);
        tdm_weight dw = put_packed(b, &w);
        for (size_t k = 0; k < TDM_ARRAY_LEN(ns); k++) {
            const int32_t n = ns[k];
            const size_t ny = (size_t)n * w.rows;
            float *x = tdm_test_rand_vec(&rng, (size_t)n * w.cols, -1, 1), *ref = calloc(ny, 4);
            float *dx = tdm_cu_test_put(b, x, (size_t)n * w.cols * 4), *dy = tdm_cu_test_put(b, NULL, ny * 4);
            poison(b, dy, ny);
            OK(b->ops->matmul(b, &dw, dx, n, dy, false, &err_));
            float *y = tdm_cu_test_get(b, dy, ny * 4);
            if (reads_xq(w.type)) ref_matmul_xq(&w, x, n, ref, false);
            else ref_matmul(&w, x, n, ref, false);
            const double e = ref_nrm_err(y, ref, ny);
            cr_assert(e < (reads_xq(w.type) ? xq_tol(w.type, ny) : 2e-6), "%s n %d: err %g", tdm_dtype_name(w.type), n, e);
            const int32_t pick[] = {0, 8, n / 2, n - 2, n - 1};
            rows_alone(b, &dw, dx, y, n, pick, TDM_ARRAY_LEN(pick));
            free(y), free(x), free(ref);
            b->ops->free(b, dx);
            b->ops->free(b, dy);
        }
        b->ops->free(b, (void *)dw.data);
        free((void *)w.data);
    }
    tdm_backend_destroy(b);
}

/* The f16 / bf16 row kernels forced up to 64 input rows (tdm_backend_cuda_force_matmul)
 * at shapes with edges: columns not a multiple of 32, rows not a multiple of 16, 1
 * to 64 input rows: against the reference within 2e-6, each row bit for bit as it
 * is alone. */
Test(cuda_gemv, forced_rows_edges, .timeout = 300) {
    tdm_backend *b = tdm_cu_test_gpu();
    tdm_backend_cuda_force_matmul(b, 1);
    uint64_t rng = 53;
    const int64_t shapes[][2] = {{37, 200}, {300, 8}, {16, 40}, {1000, 96}, {64, 4096}};
    const int32_t ns[] = {1, 7, 8, 9, 16, 17, 32, 33, 64};
    const uint32_t types[] = {TDM_F16, TDM_BF16};
    for (size_t t = 0; t < 2; t++)
        for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
            tdm_weight w = tdm_test_weight(types[t], shapes[s][0], shapes[s][1], &rng);
            tdm_weight dw = put_packed(b, &w);
            for (size_t k = 0; k < TDM_ARRAY_LEN(ns); k++)
                for (int acc = 0; acc < 2; acc++) {
                    const int32_t n = ns[k];
                    const size_t ny = (size_t)n * w.rows;
                    float *x = tdm_test_rand_vec(&rng, (size_t)n * w.cols, -2, 2);
                    float *y0 = tdm_test_rand_vec(&rng, ny, -1, 1), *ref = malloc(ny * 4);
                    memcpy(ref, y0, ny * 4);
                    float *dx = tdm_cu_test_put(b, x, (size_t)n * w.cols * 4), *dy = tdm_cu_test_put(b, y0, ny * 4);
                    OK(b->ops->matmul(b, &dw, dx, n, dy, acc, &err_));
                    float *y = tdm_cu_test_get(b, dy, ny * 4);
                    ref_matmul(&w, x, n, ref, acc);
                    const double e = ref_nrm_err(y, ref, ny), tol = ny < 8 ? 2e-5 : 2e-6;
                    cr_assert(e < tol, "%s [%lld][%lld] n %d acc %d: err %g", tdm_dtype_name(w.type), (long long)w.rows,
                              (long long)w.cols, n, acc, e);
                    if (!acc) {
                        const int32_t pick[] = {0, n / 2, n - 1};
                        rows_alone(b, &dw, dx, y, n, pick, TDM_ARRAY_LEN(pick));
                    }
                    free(y), free(x), free(y0), free(ref);
                    b->ops->free(b, dx), b->ops->free(b, dy);
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
    bool q8;              /* a q8_0 cache (src/base/kv_layout.h) instead of f16 */
    int32_t window;       /* tdm_attn_args.window (gemma3's sliding layers; the tiled kernels) */
    float softcap;        /* tdm_attn_args.softcap */
    bool fp8;             /* an fp8 cache (src/base/kv_layout.h) instead of f16 */
} flash_case;

/* The cache type of a case. */
static uint32_t case_type(bool q8, bool fp8) { return fp8 ? TDM_F8_E4M3 : q8 ? TDM_Q8_0 : TDM_F16; }

/* Random K / V in [-2, 2] for every slot of n_seq sequences, written into the
 * host caches kr / vr (type ct: f16, q8_0 or fp8, the layouts of kernels/backend.h). */
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
    const uint32_t ct = case_type(tc->q8, tc->fp8);
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
    cr_assert(e < 1e-5, "attention %s heads %d/%d hd %d bs %d, %d rows: err %g", tdm_dtype_name(ct), tc->n_head, nkv, hd,
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
        cr_assert(memcmp(o1, out + (size_t)r * row_out, row_out * 4) == 0, "hd %d: row %d alone differs from the batch",
                  hd, (int)r);
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

/* Each tree row r of f's batch (outputs got, by backend g on d's caches) against a
 * causal row of one fresh sequence holding row r's visible keys, in rank order, at
 * slots 0 .. L - 1: the same bits. */
static void chain_rows_match(tdm_backend *g, const tdm_tree_fix *f, const tdm_tree_case *tc, const tdm_attn_args *d,
                             const float *got) {
    const size_t row_out = (size_t)tc->n_head * tc->head_dim;
    const int64_t unit = tdm_kv_unit_bytes(tc->cache_type, tc->block_size, tc->head_dim);
    float *d1 = tdm_cu_test_put(g, NULL, row_out * 4);
    for (int32_t r = 0; r < f->bt.n_rows; r++) {
        const uint64_t m = f->bt.tree_mask[r];
        if (!m) continue;
        const tdm_kv_seq *s = &f->seqs[f->bt.seq[r]];
        const int32_t nv = f->bt.n_visible[r], L = nv + __builtin_popcountll(m);
        const int32_t nb = (L + tc->block_size - 1) / tc->block_size;
        tdm_kv_seq cs = TDM_KV_SEQ_INIT;
        cs.len = L;
        cs.n_blocks = cs.cap_blocks = nb;
        cs.blocks = malloc((size_t)nb * sizeof(int32_t));
        for (int32_t b = 0; b < nb; b++) cs.blocks[b] = nb - 1 - b; /* (reversed: tables still matter) */
        const size_t bytes = (size_t)nb * tc->n_kv_head * (size_t)unit;
        void *kc = calloc(1, bytes), *vc = calloc(1, bytes);
        int32_t j = 0;
        for (; j < nv; j++)
            tdm_test_kv_copy_slot(f->kc, f->vc, s, j, kc, vc, &cs, j, tc->cache_type, tc->n_kv_head, tc->head_dim,
                                  tc->block_size);
        for (uint64_t b = m; b; b &= b - 1, j++)
            tdm_test_kv_copy_slot(f->kc, f->vc, s, nv + __builtin_ctzll(b), kc, vc, &cs, j, tc->cache_type,
                                  tc->n_kv_head, tc->head_dim, tc->block_size);
        tdm_batch one;
        cr_assert_eq(tdm_batch_init(&one, 1, NULL), TANDEM_OK);
        tdm_batch_add(&one, 0, f->bt.pos[r], 0, L - 1, false);
        const tdm_kv_seq *csp[1] = {&cs};
        tdm_attn_args a1 = *d;
        a1.batch = &one;
        a1.seqs = csp;
        a1.k_cache = tdm_cu_test_put(g, kc, bytes);
        a1.v_cache = tdm_cu_test_put(g, vc, bytes);
        a1.q = d->q + (size_t)r * f->q_stride;
        a1.out = d1;
        poison(g, d1, row_out);
        OK(g->ops->attention(g, &a1, &err_));
        float *o1 = tdm_cu_test_get(g, d1, row_out * 4);
        cr_assert(memcmp(o1, got + (size_t)r * row_out, row_out * 4) == 0,
                  "tree batch hd %d %s: row %d (mask %llx, %d keys) differs from a causal row over its keys at "
                  "consecutive slots",
                  tc->head_dim, tdm_dtype_name(tc->cache_type), (int)r, (unsigned long long)m, (int)L);
        free(o1);
        g->ops->free(g, (void *)a1.k_cache), g->ops->free(g, (void *)a1.v_cache);
        free(kc), free(vc), free(cs.blocks);
        tdm_batch_free(&one);
    }
    g->ops->free(g, d1);
}

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
    /* the shapes the tiled kernels run take tree batches there (cuda_flash.cu, tree
     * masks); the scores and softmax kernels (TDM_CUDA_ATTN_SCORES: the masks as
     * extra slots) on the same batch, and the
     * tiled kernels without the decode kernel (TDM_CUDA_ATTN_TILED), the same bits */
    tdm_backend_cuda_force_attention(g, TDM_CUDA_ATTN_SCORES);
    poison(g, d.out, n_out);
    OK(g->ops->attention(g, &d, &err_));
    float *got_k = tdm_cu_test_get(g, d.out, n_out * 4);
    const double e_k = ref_nrm_err(got_k, ref, n_out);
    cr_assert(e_k < 1e-4, "tree batch on the scores kernels hd %d %s: error %g", tc->head_dim, tdm_dtype_name(tc->cache_type), e_k);
    tdm_backend_cuda_force_attention(g, TDM_CUDA_ATTN_TILED);
    poison(g, d.out, n_out);
    OK(g->ops->attention(g, &d, &err_));
    tdm_backend_cuda_force_attention(g, TDM_CUDA_ATTN_AUTO);
    float *got_t = tdm_cu_test_get(g, d.out, n_out * 4);
    cr_assert(memcmp(got_t, got, n_out * 4) == 0, "tree batch hd %d %s: the tiled kernel differs from the decode kernel",
              tc->head_dim, tdm_dtype_name(tc->cache_type));
    /* every row alone (a batch of that one row, its tree mask kept): the batch's bits */
    const size_t row_out = (size_t)tc->n_head * tc->head_dim;
    float *d1 = tdm_cu_test_put(g, NULL, row_out * 4);
    for (int32_t r = 0; r < f.bt.n_rows; r++) {
        tdm_batch one;
        cr_assert_eq(tdm_batch_init(&one, 1, NULL), TANDEM_OK);
        const uint64_t m = f.bt.tree_mask[r];
        if (m) tdm_batch_add_tree(&one, 0, f.bt.pos[r], f.bt.seq[r], f.bt.slot[r], f.bt.n_visible[r], m, false);
        else tdm_batch_add(&one, 0, f.bt.pos[r], f.bt.seq[r], f.bt.slot[r], false);
        tdm_attn_args a1 = d;
        a1.batch = &one;
        a1.q = d.q + (size_t)r * f.q_stride;
        a1.out = d1;
        poison(g, d1, row_out);
        OK(g->ops->attention(g, &a1, &err_));
        float *o1 = tdm_cu_test_get(g, d1, row_out * 4);
        cr_assert(memcmp(o1, got + (size_t)r * row_out, row_out * 4) == 0,
                  "tree batch hd %d %s: row %d (mask %llx) alone differs from the batch", tc->head_dim,
                  tdm_dtype_name(tc->cache_type), (int)r, (unsigned long long)m);
        free(o1);
        tdm_batch_free(&one);
    }
    g->ops->free(g, d1);
    /* exactness: every tree row against a causal row over its keys copied to
     * consecutive slots (the prefix, then its ancestors by depth, then itself: what
     * target-only decoding of the node's path attends to), bit for bit */
    chain_rows_match(g, &f, tc, &d, got);
    free(got_k), free(got_t);
#ifndef TDM_TEST_CUDA_ON_CPU /* (the CPU backend has no kv_move op: the engine copies itself) */
    /* kv_move: an accepted path of sequence 0's tree to the slots after its prefix,
     * as the engine moves it: nodes 0, 2, 3, 5, 6, ... (each pair overwrites the slot
     * the one before read: applied in order) */
    const int32_t P = tc->prefix[0], N = tc->nodes[0];
    int32_t src[8], dst[8], n_mv = 0;
    for (int32_t v = 0; v < N && n_mv < 8; v += 1 + (n_mv % 2)) src[n_mv] = P + v, dst[n_mv] = P + n_mv, n_mv++;
    void *kcs[1] = {(void *)d.k_cache}, *vcs[1] = {(void *)d.v_cache};
    const tdm_kv_move_args mv = {&f.seqs[0], src, dst, n_mv, kcs, vcs, 1, tc->cache_type, tc->n_kv_head, tc->head_dim,
                                 tc->block_size};
    OK(g->ops->kv_move(g, &mv, &err_));
    void *kh = tdm_cu_test_get(g, d.k_cache, f.cache_bytes), *vh = tdm_cu_test_get(g, d.v_cache, f.cache_bytes);
    for (int i = 0; i < n_mv; i++)
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
Test(cuda_tree, fp8_hd128_and_hd64) {
    run_tree(&(tdm_tree_case){12, 2, 128, 16, TDM_F8_E4M3, 2, {129, 40}, {48, 64}}, 21);
    run_tree(&(tdm_tree_case){14, 2, 64, 16, TDM_F8_E4M3, 3, {300, 20, 57}, {64, 9, 33}}, 22);
}
Test(cuda_tree, f32_hd96_block8) { run_tree(&(tdm_tree_case){6, 3, 96, 8, TDM_F32, 1, {1000}, {40}}, 3); }
Test(cuda_tree, f16_hd256_and_hd32) {
    run_tree(&(tdm_tree_case){4, 1, 256, 16, TDM_F16, 1, {70}, {64}}, 4);
    run_tree(&(tdm_tree_case){2, 2, 32, 32, TDM_F16, 2, {33, 12}, {20, 30}}, 5);
}
/* small trees after long prefixes, 15 rows: tiles of a few rows over many splits (the
 * decode kernel, cuda_decode_attn.cu, with tree masks), and a tree straddling a
 * split boundary (prefix 250 + 12 nodes) */
Test(cuda_tree, small_trees_long_prefixes) {
    run_tree(&(tdm_tree_case){32, 8, 128, 16, TDM_F16, 3, {1000, 700, 250}, {4, 5, 3}}, 6);
    run_tree(&(tdm_tree_case){32, 8, 128, 16, TDM_Q8_0, 3, {4099, 250, 31}, {3, 12, 2}}, 7);
    run_tree(&(tdm_tree_case){8, 2, 80, 8, TDM_F16, 2, {520, 9}, {7, 6}}, 8);
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
/* prefill batches: every head dim, GQA, two sequences, block sizes 8 / 16 / 32,
 * tiles cut short at a sequence's end */
Test(cuda_flash, prefill_gqa_hd128_two_sequences) { run_flash(&(flash_case){32, 8, 128, 16, 2, {150, 400}, 100}, 10); }
Test(cuda_flash, prefill_hd80_block8) { run_flash(&(flash_case){8, 2, 80, 8, 1, {77}, 40}, 11); }
Test(cuda_flash, prefill_hd96_block32) { run_flash(&(flash_case){6, 2, 96, 32, 2, {70, 20}, 20}, 12); }
Test(cuda_flash, prefill_hd256) { run_flash(&(flash_case){4, 1, 256, 16, 1, {300}, 33}, 13); }
/* a q8_0 cache: int8 quants staged with their scales, against the reference over
 * the dequantised cache */
Test(cuda_flash, q8_gqa_8_chains_three_sequences) { run_flash(&(flash_case){32, 8, 128, 16, 3, {1000, 37, 129}, 5, true}, 41); }
Test(cuda_flash, q8_hd80_block8) { run_flash(&(flash_case){8, 2, 80, 8, 2, {45, 300}, 3, true}, 42); }
Test(cuda_flash, q8_group_of_three) { run_flash(&(flash_case){6, 2, 64, 16, 4, {5, 130, 1, 77}, 4, true}, 43); }
Test(cuda_flash, q8_prefill_hd64) { run_flash(&(flash_case){12, 12, 64, 16, 1, {64}, 64, true}, 44); }
Test(cuda_flash, q8_prefill_hd96_block32) { run_flash(&(flash_case){6, 2, 96, 32, 2, {70, 20}, 20, true}, 45); }
Test(cuda_flash, q8_prefill_hd256) { run_flash(&(flash_case){4, 1, 256, 16, 1, {300}, 33, true}, 46); }
/* an fp8 cache: E4M3 codes staged with their scales, converted in pairs, against the
 * reference over the dequantised cache; the real pair's shapes (12 / 2 heads of 128,
 * 14 / 2 of 64) among them */
Test(cuda_flash, fp8_gqa_8_chains_three_sequences) {
    run_flash(&(flash_case){32, 8, 128, 16, 3, {1000, 37, 129}, 5, .fp8 = true}, 61);
}
Test(cuda_flash, fp8_qwen_target_and_draft_shapes) {
    run_flash(&(flash_case){12, 2, 128, 16, 2, {700, 33}, 5, .fp8 = true}, 62);
    run_flash(&(flash_case){14, 2, 64, 16, 2, {300, 1}, 5, .fp8 = true}, 63);
}
Test(cuda_flash, fp8_hd80_block8) { run_flash(&(flash_case){8, 2, 80, 8, 2, {45, 300}, 3, .fp8 = true}, 64); }
Test(cuda_flash, fp8_prefill_hd64) { run_flash(&(flash_case){12, 12, 64, 16, 1, {64}, 64, .fp8 = true}, 65); }
Test(cuda_flash, fp8_prefill_hd96_block32) { run_flash(&(flash_case){6, 2, 96, 32, 2, {70, 20}, 20, .fp8 = true}, 66); }
Test(cuda_flash, fp8_prefill_hd256_window_softcap) {
    run_flash(&(flash_case){4, 1, 256, 16, 1, {300}, 33, .fp8 = true}, 67);
    run_flash(&(flash_case){8, 2, 128, 16, 3, {1000, 37, 9}, 5, false, 100, 0, true}, 68);
    run_flash(&(flash_case){4, 1, 256, 16, 1, {300}, 33, false, 64, 2.0f, true}, 69);
}
/* gemma3's attention: a sliding window shorter than the context (decode, verification
 * and prefill rows, windows cutting blocks mid-way) and logit soft-capping, alone and
 * together, f16 and q8_0, head dims 256 and 128 (the tiled kernels) */
Test(cuda_flash, window_decode_and_prefill) {
    run_flash(&(flash_case){4, 1, 256, 16, 2, {300, 31}, 40, false, 37, 0, false}, 51);
    run_flash(&(flash_case){8, 2, 128, 16, 3, {1000, 37, 9}, 5, false, 512, 0, false}, 52);
    run_flash(&(flash_case){8, 2, 128, 16, 3, {1000, 37, 9}, 5, true, 100, 0, false}, 53);
}
Test(cuda_flash, softcap_and_window_with_softcap) {
    run_flash(&(flash_case){8, 2, 128, 16, 2, {200, 64}, 13, false, 0, 1.5f, false}, 54);
    run_flash(&(flash_case){4, 1, 256, 16, 1, {300}, 33, false, 64, 2.0f, false}, 55);
    run_flash(&(flash_case){4, 1, 256, 16, 1, {300}, 33, true, 64, 2.0f, false}, 56);
}

/* Batched decode / verification attention (the decode kernel, cuda_decode_attn.cu):
 * 64 sequences of mixed lengths 1 .. 4099 (split and block edges among them), the
 * last rows_per_seq rows of each attending; against ref_attention, each
 * sequence's last row alone bit for bit, and the whole batch bit for bit against
 * the tiled kernel (TDM_CUDA_ATTN_TILED). */
typedef struct decode_case {
    int32_t n_head, n_kv_head, head_dim, block_size, rows_per_seq;
    bool q8;  /* a q8_0 cache instead of f16 */
    bool fp8; /* an fp8 cache instead of f16 */
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
    const uint32_t ct = case_type(tc->q8, tc->fp8);
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
    tdm_backend_cuda_force_attention(b, TDM_CUDA_ATTN_TILED);
    poison(b, dout, n_out);
    OK(b->ops->attention(b, &a, &err_));
    tdm_backend_cuda_force_attention(b, TDM_CUDA_ATTN_AUTO);
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
/* fp8 caches (the real pair's shapes: 12 / 2 heads of 128, 14 / 2 of 64) */
DECODE_TEST(fp8_gqa_12_2_hd128_bs16_decode, 61, 12, 2, 128, 16, 1, false, true)
DECODE_TEST(fp8_gqa_12_2_hd128_bs16_verify5, 62, 12, 2, 128, 16, 5, false, true)
DECODE_TEST(fp8_gqa_14_2_hd64_bs16_decode, 63, 14, 2, 64, 16, 1, false, true)
DECODE_TEST(fp8_mha_8_hd64_bs8_verify5, 64, 8, 8, 64, 8, 5, false, true)
DECODE_TEST(fp8_gqa_8_2_hd80_bs32_verify5, 65, 8, 2, 80, 32, 5, false, true)
DECODE_TEST(fp8_gqa_8_2_hd256_bs16_decode, 66, 8, 2, 256, 16, 1, false, true)

int main(int argc, char *argv[]) { return tdm_cu_test_main(argc, argv); }
