/* backend_testutil.c - see backend_testutil.h. */
#include "backend_testutil.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "ref_ops.h"

#include "testutil.h"

int tdm_test_levels(tdm_cpu_level out[TDM_CPU_N_LEVELS]) {
    int n = 0;
    for (int l = 0; l <= (int)tdm_cpu_best_level(); l++) out[n++] = (tdm_cpu_level)l;
    return n;
}

tdm_backend *tdm_test_backend(tdm_cpu_level level, int nt) {
    tdm_backend *b = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create_level(nt, level, &b, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(b->n_threads, nt);
    cr_assert_eq(tdm_backend_cpu_level(b), (int)level);
    return b;
}

float *tdm_test_rand_vec(uint64_t *rng, size_t n, float lo, float hi) {
    float *v = malloc(n * sizeof(float) + 64);
    cr_assert(v);
    for (size_t i = 0; i < n; i++) v[i] = tdm_test_randf(rng, lo, hi);
    return v;
}

uint32_t *tdm_test_rand_mask(uint64_t *rng, size_t n) {
    uint32_t *m = malloc(n * sizeof(uint32_t));
    cr_assert(m);
    for (size_t i = 0; i < n; i++) {
        const uint64_t r = tdm_test_rand(rng);
        m[i] = i % 5 == 0 ? 0xffffffffu : i % 7 == 0 ? 0 : (uint32_t)r;
    }
    return m;
}

tdm_weight tdm_test_weight(uint32_t type, int64_t rows, int64_t cols, uint64_t *rng) {
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(type, (uint64_t)cols, &rb));
    tdm_weight w = {.type = type, .rows = rows, .cols = cols, .row_bytes = rb};
    uint8_t *data = malloc((size_t)(rb * (uint64_t)rows) + 64);
    cr_assert(data);
    float *row = tdm_test_rand_vec(rng, (size_t)cols, -1.0f, 1.0f);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t k = 0; k < cols; k++) row[k] = tdm_test_randf(rng, -1.0f, 1.0f);
        tdm_row_from_f32(type, row, data + r * rb, cols);
    }
    free(row);
    w.data = data;
    return w;
}

double tdm_test_matmul_err(tdm_backend *b, const tdm_weight *w, const tdm_weight *ref, int32_t n, bool acc,
                           uint64_t *rng) {
    size_t ny = (size_t)n * (size_t)w->rows;
    float *x = tdm_test_rand_vec(rng, (size_t)n * (size_t)w->cols, -1, 1);
    float *y = tdm_test_rand_vec(rng, ny, -1, 1);
    float *yr = malloc(ny * sizeof(float) + 4);
    cr_assert(yr);
    memcpy(yr, y, ny * sizeof(float));
    tdm_err err = {0};
    cr_assert_eq(b->ops->matmul(b, w, x, n, y, acc, &err), TANDEM_OK, "%s", err.msg);
    ref_matmul(ref, x, n, yr, acc);
    double e = ref_nrm_err(y, yr, ny);
    free(x);
    free(y);
    free(yr);
    return e;
}

static int32_t gcd32(int32_t a, int32_t b) {
    while (b) {
        const int32_t t = a % b;
        a = b, b = t;
    }
    return a;
}

int32_t tdm_test_scrambled_slot(int32_t i, int32_t len) {
    int32_t m = 7;
    while (gcd32(m, len) != 1) m++;
    return (int32_t)(((int64_t)i * m + 3) % len);
}

int32_t tdm_test_shuffled_seqs(uint64_t *rng, int n_seq, const int32_t *lens, int32_t bs, int32_t spare,
                               tdm_kv_seq *seqs, const tdm_kv_seq **sp) {
    int32_t total = 0;
    for (int s = 0; s < n_seq; s++) total += (lens[s] + bs - 1) / bs;
    const int32_t n_blocks = total + spare;
    int32_t *perm = malloc((size_t)n_blocks * 4);
    cr_assert(perm);
    for (int32_t i = 0; i < n_blocks; i++) perm[i] = i;
    for (int32_t i = n_blocks - 1; i > 0; i--) {
        int32_t j = (int32_t)(tdm_test_rand(rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    for (int s = 0, next = 0; s < n_seq; s++) {
        const int32_t nb = (lens[s] + bs - 1) / bs;
        seqs[s] = (tdm_kv_seq){calloc((size_t)nb, 4), nb, nb, lens[s]};
        for (int32_t k = 0; k < nb; k++) seqs[s].blocks[k] = perm[next++];
        sp[s] = &seqs[s];
    }
    free(perm);
    return n_blocks;
}

tdm_weight tdm_test_rand_weight_for(tdm_backend *be, uint32_t t, int64_t rows, int64_t cols, uint64_t *rng,
                                    void **buf, uint8_t **rows_bytes) {
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(t, (uint64_t)cols, &rb));
    uint8_t *data = malloc((size_t)(rb * (uint64_t)rows));
    float *row = malloc((size_t)cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) row[c] = tdm_test_randf(rng, -0.1f, 0.1f);
        tdm_row_from_f32(t, row, data + r * rb, cols);
    }
    free(row);
    if (rows_bytes) {
        *rows_bytes = malloc((size_t)(rb * (uint64_t)rows));
        memcpy(*rows_bytes, data, (size_t)(rb * (uint64_t)rows));
    }
    tdm_weight w = {.type = t, .rows = rows, .cols = cols, .row_bytes = (size_t)rb, .data = data};
    uint32_t layout = be->ops->weight_layout ? be->ops->weight_layout(be, t, rows, cols) : TDM_LAYOUT_ROWS;
    if (layout != TDM_LAYOUT_ROWS && tdm_layout_fits(layout, t, rows, cols)) {
        uint8_t *packed = malloc((size_t)(rb * (uint64_t)rows));
        cr_assert(tdm_weight_pack(layout, t, rows, cols, data, packed));
        free(data);
        data = packed;
        w.data = data;
        w.layout = layout;
    }
    *buf = data;
    return w;
}
