/* test_head.c - the quantised output head (src/model/qhead.c, kernels/cpu/head.c):
 * the stored bounds hold, the int8 approximation kernel equals the scalar reference
 * bit for bit, approximate logits stay within their bound of matmul's logits, and
 * head_argmax equals tdm_argmax_finite of matmul's logits exactly (-1 for a row with
 * a non-finite logit) -- over weight types, shapes, batch sizes, ties, near-ties,
 * zero, huge and non-finite inputs.
 * Skipped (reported as such) on CPUs without AVX-512 VNNI. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_internal.h"
#include "qhead.h"
#include "sampling.h"
#include "testutil.h"

static tdm_backend *vnni_backend(int nt) {
    tdm_backend *b = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create_level(nt, tdm_cpu_best_level(), &b, &err), TANDEM_OK, "%s", err.msg);
    if (!b->int8_dot) {
        tdm_backend_destroy(b);
        cr_skip_test("no AVX-512 VNNI on this CPU: the quantised head is not used here");
    }
    return b;
}

/* W[rows][cols] of type from random values in [-1, 1]; rows listed in dup copy row 0. */
static tdm_weight mk_weight(uint32_t type, int64_t rows, int64_t cols, uint64_t *rng, int n_dup,
                            const int64_t *dup) {
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(type, (uint64_t)cols, &rb));
    tdm_weight w = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb};
    uint8_t *data = malloc((size_t)(rb * (uint64_t)rows) + 64);
    float *row = malloc((size_t)cols * sizeof(float));
    cr_assert(data && row);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < cols; k++) row[k] = tdm_test_randf(rng, -1.0f, 1.0f);
        tdm_row_from_f32(type, row, data + r * rb, cols);
    }
    for (int i = 0; i < n_dup; i++) memcpy(data + dup[i] * rb, data, rb);
    free(row);
    w.data = data;
    return w;
}

typedef struct qh {
    void *buf;
    tdm_qhead h;
} qh;

static qh mk_qhead(const tdm_weight *w) {
    qh q;
    size_t bytes = tdm_qhead_bytes(w->rows, w->cols);
    cr_assert(bytes > 0);
    q.buf = tdm_alloc_aligned(bytes, 64);
    cr_assert(q.buf);
    tdm_qhead_place(&q.h, w->rows, w->cols, q.buf);
    tdm_err err = {0};
    cr_assert_eq(tdm_qhead_fill(w, q.buf, &err), TANDEM_OK, "%s", err.msg);
    return q;
}

static int8_t qval(const tdm_qhead *h, int64_t r, int64_t k) {
    return h->q[(r / 64) * (h->cols_pad / 4) * 256 + (k / 4) * 256 + (r % 64 / 16) * 64 + (r % 16) * 4 + k % 4];
}

static const uint32_t types[] = {TDM_F16, TDM_F32, TDM_BF16, TDM_Q8_0, TDM_Q4_0};

Test(head, fill_bounds_hold) {
    uint64_t rng = 11;
    for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++) {
        int64_t rows = 300, cols = types[t] == TDM_Q8_0 || types[t] == TDM_Q4_0 ? 96 : 70;
        tdm_weight w = mk_weight(types[t], rows, cols, &rng, 0, NULL);
        qh q = mk_qhead(&w);
        cr_assert_eq(q.h.rows_pad % 64, 0);
        cr_assert_eq(q.h.cols_pad % 4, 0);
        float *row = malloc((size_t)cols * sizeof(float));
        for (int64_t r = 0; r < q.h.rows_pad; r++) {
            if (r >= rows) { /* padding rows are zero */
                cr_assert_eq(q.h.d[r], 0.0f);
                for (int64_t k = 0; k < q.h.cols_pad; k++) cr_assert_eq(qval(&q.h, r, k), 0);
                continue;
            }
            tdm_row_to_f32(w.type, (const uint8_t *)w.data + r * w.row_bytes, row, cols);
            double emax = 0, l1 = 0;
            int32_t s = 0;
            for (int64_t k = 0; k < cols; k++) {
                int q8 = qval(&q.h, r, k);
                cr_assert(q8 >= -127 && q8 <= 127);
                s += q8;
                emax = fmax(emax, fabs((double)row[k] - (double)q.h.d[r] * q8));
                l1 += fabs((double)q.h.d[r] * q8);
            }
            for (int64_t k = cols; k < q.h.cols_pad; k++) cr_assert_eq(qval(&q.h, r, k), 0);
            cr_assert_eq(s, q.h.qsum[r], "row %lld", (long long)r);
            cr_assert((double)q.h.xcoef[r] >= emax, "row %lld: xcoef %g < error %g", (long long)r, q.h.xcoef[r], emax);
            cr_assert((double)q.h.l1[r] >= l1 * (1 - 1e-12), "row %lld", (long long)r);
            cr_assert(emax <= (double)q.h.d[r] * 0.5001, "row %lld: rounding error %g > d/2", (long long)r, emax);
        }
        free(row);
        tdm_free_aligned(q.buf);
        free((void *)w.data);
    }
}

Test(head, fill_rejects_non_finite) {
    uint64_t rng = 3;
    tdm_weight w = mk_weight(TDM_F32, 70, 40, &rng, 0, NULL);
    float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        memcpy((uint8_t *)w.data + 33 * w.row_bytes + 5 * 4, &bad[i], 4);
        void *buf = tdm_alloc_aligned(tdm_qhead_bytes(w.rows, w.cols), 64);
        tdm_err err = {0};
        cr_assert_eq(tdm_qhead_fill(&w, buf, &err), TANDEM_ERR_FORMAT);
        cr_assert(strstr(err.msg, "row 33"), "%s", err.msg);
        tdm_free_aligned(buf);
    }
    free((void *)w.data);
    cr_assert_eq(tdm_qhead_bytes(0, 10), 0);
    cr_assert_eq(tdm_qhead_bytes(10, (int64_t)1 << 20), 0);
}

/* The VNNI kernel against tdm_qhead_approx_ref, bit for bit: logits, bounds and
 * maxima; n = 1..13 covers every split of x rows into passes of at most 6; the
 * panel ranges start and end anywhere; entries outside the call's rows untouched. */
Test(head, vnni_approx_equals_reference) {
    tdm_backend *b = vnni_backend(2);
    tdm_backend_destroy(b);
    uint64_t rng = 5;
    static const int64_t shapes[][2] = {{64, 4}, {100, 130}, {1000, 384}, {129, 7}, {320, 64}, {200, 8}};
    for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
        tdm_weight w = mk_weight(TDM_F16, shapes[s][0], shapes[s][1], &rng, 0, NULL);
        qh q = mk_qhead(&w);
        const int64_t np = q.h.rows_pad / 64, ldo = q.h.rows_pad + 3;
        for (int32_t n = 1; n <= 13; n++) {
            size_t nx = (size_t)n * (size_t)q.h.cols_pad, ny = (size_t)n * (size_t)ldo;
            uint8_t *xq = malloc(nx);
            float *y = malloc(ny * 4), *yr = malloc(ny * 4);
            tdm_qhead_xstat xs[13];
            for (size_t i = 0; i < nx; i++) xq[i] = (uint8_t)(tdm_test_rand(&rng) & 255);
            for (int32_t i = 0; i < n; i++)
                xs[i] = (tdm_qhead_xstat){tdm_test_randf(&rng, 1e-3f, 1.0f), tdm_test_randf(&rng, 0.0f, 9.0f),
                                          tdm_test_randf(&rng, 0.0f, 0.01f)};
            int64_t p0 = (int64_t)(tdm_test_rand(&rng) % (uint64_t)np);
            int64_t p1 = p0 + 1 + (int64_t)(tdm_test_rand(&rng) % (uint64_t)(np - p0));
            for (int bound = 0; bound < 2; bound++) {
                float lo[13], lor[13];
                for (size_t i = 0; i < ny; i++) y[i] = yr[i] = -7.0f; /* untouched outside the rows */
                for (int32_t i = 0; i < n; i++) lo[i] = lor[i] = i == 0 ? 1e30f : -INFINITY;
                tdm_qhead_approx_vnni(&q.h, xq, xs, n, p0, p1, bound, y, ldo, lo);
                tdm_qhead_approx_ref(&q.h, xq, xs, n, p0, p1, bound, yr, ldo, lor);
                cr_assert_eq(memcmp(y, yr, ny * 4), 0, "[%lld][%lld] n=%d panels [%lld, %lld) bound %d",
                             (long long)shapes[s][0], (long long)shapes[s][1], n, (long long)p0, (long long)p1,
                             bound);
                if (bound) cr_assert_eq(memcmp(lo, lor, sizeof(float) * (size_t)n), 0, "n=%d", n);
                cr_assert_eq(lo[0], 1e30f); /* a maximum, not an assignment */
                int64_t r_end = p1 * 64 < q.h.rows ? p1 * 64 : q.h.rows;
                if (p0 > 0) cr_assert_eq(y[p0 * 64 - 1], -7.0f, "row before the call's rows written");
                cr_assert_eq(y[r_end], -7.0f, "row past the call's rows written");
                for (int32_t i = 1; bound && i < n; i++) cr_assert(isfinite(lo[i]), "lo[%d] not set", i);
            }
            free(xq);
            free(y);
            free(yr);
        }
        tdm_free_aligned(q.buf);
        free((void *)w.data);
    }
}

/* x rows: kind 0 random; 1 peaked on W row 7 (a trained head's shape); 2 zero;
 * 3 peaked with tiny noise (near-ties with the duplicated rows); 4 huge (1e30);
 * 5 one NaN; 6 one +inf. */
static void fill_x(float *x, const tdm_weight *w, int kind, uint64_t *rng) {
    int64_t E = w->cols;
    float *row = malloc((size_t)E * sizeof(float));
    tdm_row_to_f32(w->type, w->data, row, E); /* row 0 (duplicated in some tests) */
    for (int64_t k = 0; k < E; k++) {
        float u = tdm_test_randf(rng, -1.0f, 1.0f);
        switch (kind) {
        case 0: x[k] = u; break;
        case 1: x[k] = 0.3f * u + 2.0f * row[k]; break;
        case 2: x[k] = 0; break;
        case 3: x[k] = 1e-4f * u + row[k]; break;
        case 4: x[k] = 1e30f * u; break;
        default: x[k] = u; break;
        }
    }
    if (kind == 5) x[E / 2] = NAN;
    if (kind == 6) x[E / 3] = INFINITY;
    free(row);
}

#define N_KINDS 7

Test(head, argmax_equals_argmax_of_matmul_logits) {
    tdm_backend *b = vnni_backend(2);
    uint64_t rng = 99;
    static const int64_t shapes[][2] = {{1000, 384}, {8192, 128}, {333, 96}, {64, 32}};
    static const int64_t dups[] = {5, 64, 200, 301};
    uint64_t n_cases = 0, n_non_finite = 0;
    for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++)
        for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
            int64_t V = shapes[s][0], E = shapes[s][1];
            int nd = 0;
            while (nd < 4 && dups[nd] < V) nd++;
            tdm_weight w = mk_weight(types[t], V, E, &rng, nd, dups); /* exact ties with row 0 */
            qh q = mk_qhead(&w);
            for (int32_t n = 1; n <= 18; n += (n < 5 ? 1 : 13)) { /* 1..5 and 18 (two passes) */
                float *x = malloc((size_t)(n * E) * sizeof(float)), *y = malloc((size_t)(n * V) * sizeof(float));
                int32_t *ids = malloc((size_t)n * sizeof(int32_t));
                for (int32_t i = 0; i < n; i++) fill_x(x + i * E, &w, (int)((i + n + s) % N_KINDS), &rng);
                tdm_err err = {0};
                cr_assert_eq(b->ops->matmul(b, &w, x, n, y, false, &err), TANDEM_OK, "%s", err.msg);
                cr_assert_eq(b->ops->head_argmax(b, &w, &q.h, x, n, NULL, ids, &err), TANDEM_OK, "%s", err.msg);
                for (int32_t i = 0; i < n; i++) {
                    int32_t want = tdm_argmax_finite(y + (size_t)i * V, (int32_t)V);
                    n_non_finite += want < 0;
                    cr_assert_eq(ids[i], want, "%s [%lld][%lld] n=%d row %d (kind %d): %d vs %d",
                                 tdm_dtype_name(types[t]), (long long)V, (long long)E, n, i,
                                 (int)((i + n + s) % N_KINDS), ids[i], want);
                    n_cases++;
                }
                free(x);
                free(y);
                free(ids);
            }
            tdm_free_aligned(q.buf);
            free((void *)w.data);
        }
    cr_assert_gt(n_cases, 400);
    cr_assert_gt(n_non_finite, 40); /* the NaN / inf rows of x (kinds 5, 6) are reported */
    tdm_backend_destroy(b);
}

/* With a grammar's mask per row: the id is the first largest of matmul's logits
 * among the allowed tokens (-1 when none is, or the row is not finite).  Masks: every token, a random half, a random few, one token, the
 * duplicated rows (exact ties) only, none; a NULL entry leaves its row unmasked. */
Test(head, masked_argmax_equals_masked_argmax_of_matmul_logits) {
    tdm_backend *b = vnni_backend(2);
    uint64_t rng = 7;
    static const int64_t shapes[][2] = {{1000, 384}, {8192, 128}, {333, 96}, {64, 32}};
    static const int64_t dups[] = {5, 64, 200, 301};
    uint64_t n_cases = 0, n_masked = 0;
    for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++)
        for (size_t s = 0; s < TDM_ARRAY_LEN(shapes); s++) {
            int64_t V = shapes[s][0], E = shapes[s][1];
            const int32_t W = (int32_t)((V + 31) / 32);
            int nd = 0;
            while (nd < 4 && dups[nd] < V) nd++;
            tdm_weight w = mk_weight(types[t], V, E, &rng, nd, dups);
            qh q = mk_qhead(&w);
            for (int32_t n = 1; n <= 18; n += (n < 5 ? 1 : 13)) {
                float *x = malloc((size_t)(n * E) * sizeof(float)), *y = malloc((size_t)(n * V) * sizeof(float));
                int32_t *ids = malloc((size_t)n * sizeof(int32_t));
                uint32_t *mk = calloc((size_t)n * (size_t)W, sizeof(uint32_t));
                const uint32_t **masks = calloc((size_t)n, sizeof *masks);
                for (int32_t i = 0; i < n; i++) {
                    fill_x(x + i * E, &w, (int)((i + 2 * n + s) % N_KINDS), &rng);
                    uint32_t *m = mk + (size_t)i * (size_t)W;
                    const int kind = (int)((i + n + t) % 7);
                    for (int64_t r = 0; r < V; r++) {
                        uint64_t u = tdm_test_rand(&rng) % 100;
                        bool on = kind == 0 ? true : kind == 1 ? u < 50 : kind == 2 ? u < 3 : kind == 3 ? r == V / 2
                                  : kind == 4 ? (r == 0 || r == dups[0]) : false;
                        if (on) m[r / 32] |= 1u << (r % 32);
                    }
                    masks[i] = kind == 6 ? NULL : m;
                }
                tdm_err err = {0};
                cr_assert_eq(b->ops->matmul(b, &w, x, n, y, false, &err), TANDEM_OK, "%s", err.msg);
                cr_assert_eq(b->ops->head_argmax(b, &w, &q.h, x, n, masks, ids, &err), TANDEM_OK, "%s", err.msg);
                for (int32_t i = 0; i < n; i++) {
                    float *yi = y + (size_t)i * V;
                    int32_t want = tdm_argmax_finite(yi, (int32_t)V);
                    if (want >= 0 && masks[i]) { /* (the first largest allowed; -1: none) */
                        want = -1;
                        for (int64_t r = 0; r < V; r++)
                            if (masks[i][r / 32] >> (r % 32) & 1u && (want < 0 || yi[r] > yi[want])) want = (int32_t)r;
                        n_masked++;
                    }
                    cr_assert_eq(ids[i], want, "%s [%lld][%lld] n=%d row %d (x kind %d, mask kind %d): %d vs %d (%g %g)", tdm_dtype_name(types[t]),
                                 (long long)V, (long long)E, n, i, (int)((i + 2 * n + s) % N_KINDS), (int)((i + n + t) % 7), ids[i], want, ids[i] >= 0 ? yi[ids[i]] : 0.0, want >= 0 ? yi[want] : 0.0);
                    n_cases++;
                }
                free(x);
                free(y);
                free(ids);
                free(mk);
                free(masks);
            }
            tdm_free_aligned(q.buf);
            free((void *)w.data);
        }
    cr_assert_gt(n_cases, 400);
    cr_assert_gt(n_masked, 200);
    tdm_backend_destroy(b);
}

/* Approximate logits are within the documented bound of matmul's logits; a row of
 * x with a NaN gives NaN logits. */
Test(head, approx_logits_within_bound) {
    tdm_backend *b = vnni_backend(2);
    uint64_t rng = 7;
    for (size_t t = 0; t < TDM_ARRAY_LEN(types); t++) {
        int64_t V = 700, E = 160;
        tdm_weight w = mk_weight(types[t], V, E, &rng, 0, NULL);
        qh q = mk_qhead(&w);
        int32_t n = 6;
        float *x = malloc((size_t)(n * E) * sizeof(float)), *y = malloc((size_t)(n * V) * 4), *a = malloc((size_t)(n * V) * 4);
        for (int32_t i = 0; i < n; i++) fill_x(x + i * E, &w, i, &rng); /* kinds 0..5 */
        tdm_err err = {0};
        cr_assert_eq(b->ops->matmul(b, &w, x, n, y, false, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(b->ops->qhead_logits(b, &q.h, x, n, a, &err), TANDEM_OK, "%s", err.msg);
        for (int32_t i = 0; i < n; i++) {
            const float *xi = x + i * E;
            if (i == 5) {
                for (int64_t r = 0; r < V; r++) cr_assert(isnan(a[i * V + r]));
                continue;
            }
            double amax = 0, l1 = 0;
            for (int64_t k = 0; k < E; k++) amax = fmax(amax, fabs(xi[k])), l1 += fabs(xi[k]);
            double dx = (float)(amax / 127.0), ex = 0;
            for (int64_t k = 0; k < E; k++) {
                double qx = dx > 0 ? rint((double)(xi[k] * (1.0f / (float)dx))) : 0;
                ex = fmax(ex, fabs(xi[k] - dx * qx));
            }
            for (int64_t r = 0; r < V; r++) {
                double A = a[i * V + r], K = y[i * V + r];
                double bound = l1 * q.h.xcoef[r] + ex * q.h.l1[r] + 1e-6 * fabs(A);
                cr_assert(fabs(A - K) <= bound * 1.0001 + 1e-30, "%s row %d W row %lld: |%g - %g| > %g",
                          tdm_dtype_name(types[t]), i, (long long)r, A, K, bound);
            }
        }
        free(x);
        free(y);
        free(a);
        tdm_free_aligned(q.buf);
        free((void *)w.data);
    }
    tdm_backend_destroy(b);
}

Test(head, rejects_bad_args) {
    tdm_backend *b = vnni_backend(1);
    uint64_t rng = 1;
    tdm_weight w = mk_weight(TDM_F16, 100, 64, &rng, 0, NULL), w2 = mk_weight(TDM_F16, 101, 64, &rng, 0, NULL);
    qh q = mk_qhead(&w);
    float x[64] = {0}, y[128];
    int32_t id;
    tdm_err err = {0};
    cr_assert_eq(b->ops->head_argmax(b, &w2, &q.h, x, 1, NULL, &id, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "head_argmax"), "%s", err.msg);
    cr_assert_eq(b->ops->head_argmax(b, &w, NULL, x, 1, NULL, &id, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->qhead_logits(b, &q.h, NULL, 1, y, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->qhead_logits(b, &q.h, x, -1, y, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(b->ops->qhead_logits(b, &q.h, x, 0, y, &err), TANDEM_OK);
    tdm_free_aligned(q.buf);
    free((void *)w.data);
    free((void *)w2.data);
    tdm_backend_destroy(b);
}

/* Levels without VNNI report the ops as unsupported (the forward then computes
 * every logit). */
Test(head, unsupported_below_avx512) {
    tdm_backend *b = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create_level(1, TDM_CPU_SCALAR, &b, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(!b->int8_dot);
    uint64_t rng = 2;
    tdm_weight w = mk_weight(TDM_F16, 64, 32, &rng, 0, NULL);
    qh q = mk_qhead(&w);
    float x[32] = {0}, y[64];
    cr_assert_eq(b->ops->qhead_logits(b, &q.h, x, 1, y, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "VNNI"), "%s", err.msg);
    tdm_free_aligned(q.buf);
    free((void *)w.data);
    tdm_backend_destroy(b);
}
