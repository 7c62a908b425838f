/* test_layout.c - weight layouts (dtype.h tdm_layout): packing, element access, and
 * the CPU matmul on packed (P64) weights against the reference on the same matrix
 * in the rows layout; determinism across thread counts and batch sizes; the model
 * loader's use of the backend's layout; argument validation. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_testutil.h"
#include "model.h"
#include "ref_ops.h"
#include "testutil.h"

static const uint32_t elem_types[] = {TDM_F32, TDM_F16, TDM_BF16};

/* w in the P64 layout (data malloc'd). */
static tdm_weight packed(const tdm_weight *w) {
    tdm_weight p = *w;
    void *d = malloc(w->row_bytes * (size_t)w->rows + 64);
    cr_assert(d);
    cr_assert(tdm_weight_pack(TDM_LAYOUT_P64, w->type, w->rows, w->cols, w->data, d));
    p.data = d;
    p.layout = TDM_LAYOUT_P64;
    return p;
}

/* The levels whose kernels read P64 (the others must refuse it). */
static bool level_reads_p64(tdm_cpu_level l) { return tdm_cpu_kernels_for(l)->gemv_p64 != NULL; }

Test(layout, fits_pack_and_elements) {
    cr_assert(tdm_layout_fits(TDM_LAYOUT_P64, TDM_F16, 128, 7));
    cr_assert(tdm_layout_fits(TDM_LAYOUT_P64, TDM_F32, 64, 1));
    cr_assert(!tdm_layout_fits(TDM_LAYOUT_P64, TDM_F16, 100, 32), "rows not a multiple of 64");
    cr_assert(!tdm_layout_fits(TDM_LAYOUT_P64, TDM_Q8_0, 128, 32), "quantised blocks");
    cr_assert(!tdm_layout_fits(TDM_LAYOUT_P64, TDM_F16, 0, 32));
    cr_assert(!tdm_layout_fits(7, TDM_F16, 128, 32), "unknown layout");
    cr_assert(tdm_layout_fits(TDM_LAYOUT_ROWS, TDM_Q4_0, 3, 32));
    for (size_t t = 0; t < TDM_ARRAY_LEN(elem_types); t++) {
        uint64_t rng = 3 + t;
        tdm_weight w = tdm_test_weight(elem_types[t], 192, 19, &rng);
        tdm_weight p = packed(&w);
        cr_assert(memcmp(p.data, w.data, w.row_bytes * 192) != 0, "packing moved nothing");
        for (int64_t r = 0; r < w.rows; r++)
            for (int64_t c = 0; c < w.cols; c++) {
                float a = tdm_weight_elem(w.type, TDM_LAYOUT_ROWS, w.cols, w.row_bytes, w.data, r, c);
                float b = tdm_weight_elem(p.type, TDM_LAYOUT_P64, p.cols, p.row_bytes, p.data, r, c);
                cr_assert(memcmp(&a, &b, 4) == 0, "%s (%lld, %lld): %g vs %g", tdm_dtype_name(w.type),
                          (long long)r, (long long)c, (double)a, (double)b);
            }
        free((void *)w.data);
        free((void *)p.data);
    }
    /* a quantised rows-layout element, through the block that holds it */
    uint64_t rng = 9;
    tdm_weight q = tdm_test_weight(TDM_Q8_0, 3, 64, &rng);
    float row[64];
    tdm_row_to_f32(TDM_Q8_0, (const uint8_t *)q.data + 2 * q.row_bytes, row, 64);
    for (int c = 0; c < 64; c++)
        cr_assert_eq(tdm_weight_elem(TDM_Q8_0, TDM_LAYOUT_ROWS, 64, q.row_bytes, q.data, 2, c), row[c]);
    cr_assert(!tdm_weight_pack(TDM_LAYOUT_P64, TDM_Q8_0, 3, 64, q.data, row), "refused, dst untouched");
    cr_assert(isnan(tdm_weight_elem(77, TDM_LAYOUT_ROWS, 64, q.row_bytes, q.data, 0, 0)), "unknown type");
    cr_assert(isnan(tdm_weight_elem(TDM_Q8_0, 5, 64, q.row_bytes, q.data, 0, 0)), "unknown layout");
    free((void *)q.data);
}

/* QSPLIT (quants then scales per row) keeps every element of Q8_0 and Q4_0 rows,
 * and holds nothing else. */
Test(layout, qsplit_pack_and_elements) {
    cr_assert(tdm_layout_fits(TDM_LAYOUT_QSPLIT, TDM_Q8_0, 3, 64));
    cr_assert(tdm_layout_fits(TDM_LAYOUT_QSPLIT, TDM_Q4_0, 1, 32));
    cr_assert(!tdm_layout_fits(TDM_LAYOUT_QSPLIT, TDM_F16, 64, 64), "element types");
    cr_assert(!tdm_layout_fits(TDM_LAYOUT_QSPLIT, TDM_Q8_0, 0, 64));
    const uint32_t qt[] = {TDM_Q8_0, TDM_Q4_0};
    for (size_t t = 0; t < TDM_ARRAY_LEN(qt); t++) {
        uint64_t rng = 21 + t;
        tdm_weight w = tdm_test_weight(qt[t], 5, 96, &rng);
        uint8_t *d = malloc(w.row_bytes * 5);
        cr_assert(tdm_weight_pack(TDM_LAYOUT_QSPLIT, w.type, w.rows, w.cols, w.data, d));
        cr_assert(memcmp(d, w.data, w.row_bytes * 5) != 0, "packing moved nothing");
        for (int64_t r = 0; r < w.rows; r++) {
            /* the scales of row r are its last 2 * 3 bytes, in block order */
            for (int b = 0; b < 3; b++)
                cr_assert(memcmp(d + r * w.row_bytes + w.row_bytes - 6 + 2 * b,
                                 (const uint8_t *)w.data + r * w.row_bytes + b * tdm_dtype_block_bytes(w.type), 2) == 0);
            for (int64_t c = 0; c < w.cols; c++) {
                float a = tdm_weight_elem(w.type, TDM_LAYOUT_ROWS, w.cols, w.row_bytes, w.data, r, c);
                float b = tdm_weight_elem(w.type, TDM_LAYOUT_QSPLIT, w.cols, w.row_bytes, d, r, c);
                cr_assert(memcmp(&a, &b, 4) == 0, "%s (%lld, %lld): %g vs %g", tdm_dtype_name(w.type),
                          (long long)r, (long long)c, (double)a, (double)b);
            }
        }
        free((void *)w.data);
        free(d);
    }
}

static void check_p64(tdm_backend *b, uint32_t type, int64_t rows, int64_t cols, int32_t n, bool acc,
                      uint64_t seed) {
    uint64_t rng = seed;
    tdm_weight w = tdm_test_weight(type, rows, cols, &rng);
    tdm_weight p = packed(&w);
    double e = tdm_test_matmul_err(b, &p, &w, n, acc, &rng);
    cr_assert(e < 1e-5, "p64 matmul %s [%lld][%lld] n=%d acc=%d: err %g", tdm_dtype_name(type),
              (long long)rows, (long long)cols, n, acc, e);
    free((void *)w.data);
    free((void *)p.data);
}

Test(layout, p64_matmul_matches_reference) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv), tested = 0;
    /* rows, cols, n: one to many blocks, odd and long columns, every kind of row
     * group (1..6 rows in one pass, 7..12 in two half-block passes, 13 = 7 + 6,
     * 16 = 8 + 8), prefill-sized n */
    static const int64_t shapes[][3] = {
        {64, 32, 1},   {64, 1, 2},    {128, 17, 3},  {192, 96, 4},  {640, 384, 4},  {384, 1024, 5},
        {256, 100, 6}, {128, 384, 7}, {192, 33, 10}, {128, 64, 12}, {320, 64, 13}, {64, 48, 16},
        {128, 96, 40}, {2048, 384, 1},
    };
    for (int l = 0; l < nl; l++) {
        if (!level_reads_p64(lv[l])) continue;
        for (int nt = 1; nt <= 2; nt++) {
            tdm_backend *b = tdm_test_backend(lv[l], nt);
            for (size_t t = 0; t < TDM_ARRAY_LEN(elem_types); t++)
                for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++)
                    check_p64(b, elem_types[t], shapes[s][0], shapes[s][1], (int32_t)shapes[s][2],
                              (s + t + (size_t)nt) & 1, 500 + s * 3 + t);
            tdm_backend_destroy(b);
            tested++;
        }
    }
    if (tested == 0) cr_skip("no SIMD level here reads the P64 layout");
}

/* Views of rows and columns (tdm_weight_rows_view / _cols_view): the matmul of a
 * view, in either layout, equals the reference matmul of that part of the matrix;
 * element access agrees; views the layout cannot express are refused. */
Test(layout, views_of_rows_and_columns) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    static const uint32_t types[] = {TDM_F32, TDM_F16, TDM_BF16, TDM_Q8_0, TDM_Q4_0};
    const int64_t rows = 256, cols = 192;
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++) {
            uint64_t rng = 70 + t;
            tdm_weight w = tdm_test_weight(types[t], rows, cols, &rng);
            bool elem = tdm_dtype_block_elems(types[t]) == 1;
            tdm_weight p = elem ? packed(&w) : w;
            /* rows [64, 192), columns [32, 160), both */
            tdm_weight rv, rp, cv, cp, bv, bp;
            cr_assert(tdm_weight_rows_view(&w, 64, 128, &rv) && tdm_weight_cols_view(&w, 32, 128, &cv));
            cr_assert(tdm_weight_rows_view(&cv, 64, 128, &bv));
            const tdm_weight *want[3] = {&rv, &cv, &bv};
            tdm_weight *got[3] = {&rp, &cp, &bp};
            tdm_weight tmp;
            cr_assert(tdm_weight_rows_view(&p, 64, 128, &rp) && tdm_weight_cols_view(&p, 32, 128, &cp));
            cr_assert(tdm_weight_cols_view(&p, 32, 128, &tmp) && tdm_weight_rows_view(&tmp, 64, 128, &bp));
            for (int v = 0; v < 3; v++) {
                for (int64_t r = 0; r < want[v]->rows; r += 37)
                    for (int64_t c = 0; c < want[v]->cols; c += 11) {
                        float x = tdm_weight_elem(want[v]->type, want[v]->layout, want[v]->cols, want[v]->row_bytes,
                                                  want[v]->data, r, c);
                        float y = tdm_weight_elem(got[v]->type, got[v]->layout, got[v]->cols, got[v]->row_bytes,
                                                  got[v]->data, r, c);
                        cr_assert(memcmp(&x, &y, 4) == 0, "%s view %d (%lld, %lld)", tdm_dtype_name(w.type), v,
                                  (long long)r, (long long)c);
                    }
                if (got[v]->layout == TDM_LAYOUT_P64 && !level_reads_p64(lv[l])) continue;
                static const int32_t ns[] = {1, 5, 13, 20};
                for (size_t k = 0; k < TDM_ARRAY_LEN(ns); k++) {
                    double e = tdm_test_matmul_err(b, got[v], want[v], ns[k], k & 1, &rng);
                    cr_assert(e < 1e-5, "%s %s view %d n=%d: err %g", tdm_cpu_level_name(lv[l]),
                              tdm_dtype_name(w.type), v, ns[k], e);
                }
            }
            /* refused: outside the matrix, empty, partial blocks, P64 rows off 64 */
            cr_assert(!tdm_weight_rows_view(&w, 200, 64, &tmp) && !tdm_weight_rows_view(&w, -1, 2, &tmp));
            cr_assert(!tdm_weight_cols_view(&w, 0, 0, &tmp) && !tdm_weight_cols_view(&w, 160, 64, &tmp));
            if (!elem) cr_assert(!tdm_weight_cols_view(&w, 16, 32, &tmp), "half a quantisation block");
            if (elem) cr_assert(!tdm_weight_rows_view(&p, 32, 64, &tmp), "P64 rows off a block");
            if (elem) free((void *)p.data);
            free((void *)w.data);
        }
        tdm_backend_destroy(b);
    }
}

/* Bit-identical across thread counts, and each row of a batch equals that row
 * alone: a verification row gives exactly what decoding it alone gives. */
Test(layout, p64_deterministic_threads_and_batch) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv), tested = 0;
    const int64_t rows = 448, cols = 200;
    for (int l = 0; l < nl; l++) {
        if (!level_reads_p64(lv[l])) continue;
        tdm_backend *bs[3] = {tdm_test_backend(lv[l], 1), tdm_test_backend(lv[l], 2), tdm_test_backend(lv[l], 3)};
        for (size_t t = 0; t < TDM_ARRAY_LEN(elem_types); t++)
            for (int32_t n = 2; n <= 23; n += 7) {
                uint64_t rng = 41 + t;
                tdm_weight w = tdm_test_weight(elem_types[t], rows, cols, &rng);
                tdm_weight p = packed(&w);
                float *x = tdm_test_rand_vec(&rng, (size_t)n * cols, -2, 2);
                float *y[3], *y1 = calloc((size_t)rows, sizeof(float));
                for (int k = 0; k < 3; k++) {
                    y[k] = calloc((size_t)n * rows, sizeof(float));
                    cr_assert_eq(bs[k]->ops->matmul(bs[k], &p, x, n, y[k], false, NULL), TANDEM_OK);
                }
                for (int k = 1; k < 3; k++)
                    cr_assert(memcmp(y[0], y[k], (size_t)n * rows * 4) == 0, "1 vs %d threads, %s n=%d",
                              k + 1, tdm_dtype_name(w.type), n);
                for (int32_t i = 0; i < n; i++) {
                    cr_assert_eq(bs[1]->ops->matmul(bs[1], &p, x + i * cols, 1, y1, false, NULL), TANDEM_OK);
                    cr_assert(memcmp(y1, y[0] + i * rows, (size_t)rows * 4) == 0,
                              "row %d alone differs from the batch of %d, %s", i, n, tdm_dtype_name(w.type));
                }
                free(y1);
                for (int k = 0; k < 3; k++) free(y[k]);
                free(x);
                free((void *)w.data);
                free((void *)p.data);
            }
        for (int k = 0; k < 3; k++) tdm_backend_destroy(bs[k]);
        tested++;
    }
    if (tested == 0) cr_skip("no SIMD level here reads the P64 layout");
}

/* Levels without the kernel refuse a packed weight by name; every level refuses a
 * layout that does not fit; get_rows reads a packed weight exactly. */
Test(layout, validation_and_get_rows) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    int nl = tdm_test_levels(lv);
    uint64_t rng = 17;
    tdm_weight w = tdm_test_weight(TDM_F16, 128, 40, &rng);
    tdm_weight p = packed(&w);
    float *x = tdm_test_rand_vec(&rng, 40, -1, 1), y[128];
    int32_t ids[4] = {127, 0, 64, 65};
    float got[4 * 40], want[4 * 40];
    ref_get_rows(&w, ids, 4, want);
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        tdm_err err = {0};
        uint32_t lay = b->ops->weight_layout(b, TDM_F16, 128, 40);
        cr_assert_eq(lay, level_reads_p64(lv[l]) ? TDM_LAYOUT_P64 : TDM_LAYOUT_ROWS, "level %d", lv[l]);
        cr_assert_eq(b->ops->weight_layout(b, TDM_F16, 100, 40), TDM_LAYOUT_ROWS);
        cr_assert_eq(b->ops->weight_layout(b, TDM_Q8_0, 128, 64), TDM_LAYOUT_ROWS);
        tandem_status st = b->ops->matmul(b, &p, x, 1, y, false, &err);
        if (level_reads_p64(lv[l])) {
            cr_assert_eq(st, TANDEM_OK, "%s", err.msg);
        } else {
            cr_assert_eq(st, TANDEM_ERR_UNSUPPORTED);
            cr_assert(strstr(err.msg, "layout"), "%s", err.msg);
        }
        tdm_weight bad = p;
        bad.rows = 100; /* not whole blocks */
        cr_assert_eq(b->ops->matmul(b, &bad, x, 1, y, false, &err), TANDEM_ERR_UNSUPPORTED);
        cr_assert(strstr(err.msg, "layout"), "%s", err.msg);
        bad = p;
        bad.layout = 9;
        cr_assert_eq(b->ops->matmul(b, &bad, x, 1, y, false, &err), TANDEM_ERR_UNSUPPORTED);
        cr_assert_eq(b->ops->get_rows(b, &p, ids, 4, got, &err), TANDEM_OK, "%s", err.msg);
        cr_assert(memcmp(got, want, sizeof got) == 0, "get_rows of a packed weight, level %d", lv[l]);
        tdm_backend_destroy(b);
    }
    free(x);
    free((void *)w.data);
    free((void *)p.data);
}

/* The loader packs the layer matrices in the backend's layout and leaves the
 * embedding / output head in rows; a backend of a level without the packed kernel
 * (AVX2) keeps every weight in rows.  (Greedy generation with packed weights
 * against transformers: test_generate.) */
Test(layout, model_loader_uses_backend_layout) {
    const char *path = tdm_test_model_path("pycode-draft-xs-f16.gguf");
    tdm_model *m[2] = {NULL, NULL};
    tdm_backend *b[2] = {NULL, NULL};
    tdm_err err = {0};
    for (int k = 0; k < 2; k++) {
        tandem_status st = k == 0 ? tdm_backend_cpu_create(2, &b[k], &err)
                                  : tdm_backend_cpu_create_level(2, TDM_CPU_AVX2, &b[k], &err);
        if (k == 1 && st == TANDEM_ERR_UNSUPPORTED) { /* (no AVX2: no level packs either) */
            tdm_model_free(m[0]);
            tdm_backend_destroy(b[0]);
            cr_skip("this CPU's matmul reads only the rows layout");
        }
        cr_assert_eq(st, TANDEM_OK, "%s", err.msg);
        cr_assert_eq(tdm_model_load(path, b[k], &m[k], &err), TANDEM_OK, "%s", err.msg);
    }
    uint32_t want = b[0]->ops->weight_layout(b[0], TDM_F16, m[0]->layers[0].w13.rows, m[0]->hp.n_embd);
    if (want == TDM_LAYOUT_ROWS) {
        for (int k = 0; k < 2; k++) {
            tdm_model_free(m[k]);
            tdm_backend_destroy(b[k]);
        }
        cr_skip("this CPU's matmul reads only the rows layout");
    }
    for (int32_t l = 0; l < m[0]->hp.n_layer; l++) {
        const tdm_layer *L = &m[0]->layers[l], *R = &m[1]->layers[l];
        cr_assert(L->wqkv.layout == want && L->wo.layout == want && L->w13.layout == want && L->w2.layout == want);
        cr_assert(R->wqkv.layout == 0 && R->wo.layout == 0 && R->w13.layout == 0 && R->w2.layout == 0);
    }
    cr_assert_eq(m[0]->tok_embd.layout, TDM_LAYOUT_ROWS);
    cr_assert_eq(m[0]->output.layout, TDM_LAYOUT_ROWS);
    /* the packed layer weights hold the same values */
    const tdm_weight *a = &m[0]->layers[1].w13, *r = &m[1]->layers[1].w13;
    for (int64_t i = 0; i < a->rows; i += 37)
        for (int64_t c = 0; c < a->cols; c += 5)
            cr_assert_eq(tdm_weight_elem(a->type, a->layout, a->cols, a->row_bytes, a->data, i, c),
                         tdm_weight_elem(r->type, r->layout, r->cols, r->row_bytes, r->data, i, c));
    /* the file's bytes (their pages were released after packing: read back from the
     * file) equal the packed weight, element for element */
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(m[0]->gguf, "blk.1.ffn_down.weight");
    cr_assert(t);
    const tdm_weight *d = &m[0]->layers[1].w2;
    cr_assert_eq(d->layout, want);
    for (int64_t i = 0; i < d->rows; i++)
        for (int64_t c = 0; c < d->cols; c++)
            cr_assert_eq(tdm_weight_elem(d->type, d->layout, d->cols, d->row_bytes, d->data, i, c),
                         tdm_weight_elem(d->type, TDM_LAYOUT_ROWS, d->cols, d->row_bytes, t->data, i, c));
    for (int k = 0; k < 2; k++) {
        tdm_model_free(m[k]);
        tdm_backend_destroy(b[k]);
    }
}
