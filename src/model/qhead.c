/* qhead.c - row-wise int8 quantisation of an output projection with the numbers
 * its error bound needs (see tdm_qhead in kernels/backend.h).
 *
 * Every stored bound is computed in double and rounded up to float, so the bound a
 * backend evaluates in float (with its own small safety factor) is never below the
 * true distance between the approximate and the matmul logit.
 */
#include <stdlib.h>
#include <string.h>

#include "qhead.h"

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
static size_t align64(size_t v) { return (v + 63) & ~(size_t)63; }

size_t tdm_qhead_bytes(int64_t rows, int64_t cols) {
    if (rows <= 0 || cols <= 0 || rows > (1 << 24) || cols > (1 << 16)) return 0;
    int64_t rp = round_up(rows, 64), cp = round_up(cols, 4);
    return align64((size_t)(rp * cp)) + 4 * align64((size_t)rp * 4);
}

void tdm_qhead_place(tdm_qhead *h, int64_t rows, int64_t cols, void *buf) {
    int64_t rp = round_up(rows, 64), cp = round_up(cols, 4);
    uint8_t *p = buf;
    size_t vec = align64((size_t)rp * 4);
    h->rows = rows;
    h->cols = cols;
    h->rows_pad = rp;
    h->cols_pad = cp;
    h->q = (const int8_t *)p;
    p += align64((size_t)(rp * cp));
    h->d = (const float *)(const void *)p;
    h->qsum = (const int32_t *)(const void *)(p + vec);
    h->xcoef = (const float *)(const void *)(p + 2 * vec);
    h->l1 = (const float *)(const void *)(p + 3 * vec);
}

tandem_status tdm_qhead_fill(const tdm_weight *w, void *buf, tdm_err *err) {
    if (w->layout != TDM_LAYOUT_ROWS)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "quantised head: the weight is not in the rows layout");
    tdm_qhead h;
    tdm_qhead_place(&h, w->rows, w->cols, buf);
    memset(buf, 0, tdm_qhead_bytes(w->rows, w->cols));
    int8_t *q = (int8_t *)h.q;
    float *d = (float *)h.d, *xcoef = (float *)h.xcoef, *l1 = (float *)h.l1;
    int32_t *qsum = (int32_t *)h.qsum;
    const int64_t cols = w->cols, c4 = h.cols_pad / 4;
    /* matmul's f32 accumulation of cols products (exact in FMA) and a reduction
     * tree: at most cols + 8 roundings, each a relative 2^-24 */
    const double gamma = (double)(cols + 8) * 0x1p-24 / (1.0 - (double)(cols + 8) * 0x1p-24);
    float *row = malloc((size_t)cols * sizeof *row);
    if (!row) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory quantising the output head");
    for (int64_t r = 0; r < w->rows; r++) {
        tdm_row_to_f32(w->type, (const uint8_t *)w->data + (size_t)r * w->row_bytes, row, cols);
        float amax = 0;
        for (int64_t k = 0; k < cols; k++) {
            if (!isfinite(row[k])) {
                free(row);
                return tdm_seterr(err, TANDEM_ERR_FORMAT, "output head row %lld holds a non-finite value",
                                  (long long)r);
            }
            amax = fmaxf(amax, fabsf(row[k]));
        }
        float dr = amax / 127.0f, inv = dr > 0 ? 1.0f / dr : 0.0f;
        double emax = 0, sum_abs = 0;
        int32_t s = 0;
        for (int64_t k = 0; k < cols; k++) {
            float t = rintf(row[k] * inv);
            int32_t qi = t > 127.0f ? 127 : t < -127.0f ? -127 : (int32_t)t;
            q[tdm_qhead_qidx(c4, r, k)] = (int8_t)qi;
            s += qi;
            double wq = (double)dr * (double)qi; /* exact: 24 x 8 bits */
            emax = fmax(emax, fabs((double)row[k] - wq));
            sum_abs += fabs(wq);
        }
        d[r] = dr;
        qsum[r] = s;
        xcoef[r] = tdm_float_up(emax + gamma * (double)amax);
        l1[r] = tdm_float_up(sum_abs * (1.0 + 0x1p-40)); /* the double sum's own rounding */
    }
    free(row);
    return TANDEM_OK;
}
