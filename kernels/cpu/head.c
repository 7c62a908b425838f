/* head.c - the quantised output head on the CPU (tdm_qhead, kernels/backend.h):
 * approximate logits, and the exact greedy argmax that computes only the logits
 * the approximation's error bounds cannot rule out.
 *
 * Argmax of x row i: with A[r] the approximate logit and B[r] its bound, every
 * exact logit K[r] lies in [A[r] - B[r], A[r] + B[r]].  With lo = max_r (A - B), a
 * row with A[r] + B[r] < lo has K[r] < K of the row reaching lo, so it is neither
 * the maximum nor tied with it; the exact logits of the remaining candidates (a
 * handful on real models) decide, first index on ties, as tdm_argmax does.  The
 * exact logits come from the level's gemv, whose value for (x row, W row) is the
 * one matmul computes (cpu_internal.h), so the answer is tdm_argmax of matmul's
 * logits, bit for bit.  Rows of x with a non-finite value, and bounds that
 * overflow, fall back to full logits.
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "qhead.h"
#include "sampling.h"

#define XCHUNK 16    /* x rows per pass */
#define HEAD_CAND 32 /* candidates a task keeps per x row */

void tdm_qhead_dot_ref(const tdm_qhead *h, const uint8_t *xq, int32_t n, int64_t p0, int64_t p1,
                       int32_t *isum) {
    const int64_t c4 = h->cols_pad / 4;
    for (int32_t i = 0; i < n; i++)
        for (int64_t r = p0 * 64; r < p1 * 64; r++) {
            int32_t s = 0;
            for (int64_t k = 0; k < h->cols_pad; k++)
                s += (int32_t)xq[i * h->cols_pad + k] * (int32_t)h->q[tdm_qhead_qidx(c4, r, k)];
            isum[i * h->rows_pad + r] = s;
        }
}

typedef struct xstat {
    float dx;  /* scale */
    float l1;  /* sum |x|, rounded up */
    float ex;  /* max |x - dx qx|, rounded up */
} xstat;

/* qx = round(x / dx) stored as qx + 128 (unsigned bytes for vpdpbusd); padding
 * columns 128 (they meet zero weights).  false when x holds a non-finite value. */
static bool quantize_x(const float *x, int64_t cols, int64_t cols_pad, uint8_t *xq, xstat *st) {
    float amax = 0;
    for (int64_t k = 0; k < cols; k++) {
        if (!(fabsf(x[k]) <= FLT_MAX)) return false; /* NaN or inf */
        amax = fmaxf(amax, fabsf(x[k]));
    }
    float dx = amax / 127.0f, inv = dx > 0 ? 1.0f / dx : 0.0f;
    double l1 = 0, ex = 0;
    for (int64_t k = 0; k < cols; k++) {
        float t = rintf(x[k] * inv);
        int32_t q = t > 127.0f ? 127 : t < -127.0f ? -127 : (int32_t)t;
        xq[k] = (uint8_t)(q + 128);
        l1 += fabs((double)x[k]);
        ex = fmax(ex, fabs((double)x[k] - (double)dx * (double)q));
    }
    memset(xq + cols, 128, (size_t)(cols_pad - cols));
    st->dx = dx;
    st->l1 = tdm_float_up(l1 * (1.0 + 0x1p-40));
    st->ex = tdm_float_up(ex);
    return true;
}

typedef struct head_job {
    tdm_cpu *c;
    const tdm_qhead *h;
    const uint8_t *xq;   /* [n][cols_pad] */
    const xstat *xs;     /* [n] */
    int32_t n;
    int64_t chunk;       /* panels per task */
    int64_t tasks;
    int32_t *isum;       /* [n][rows_pad] */
    float *a;            /* [n][lda] approximate logits */
    int64_t lda;
    float *bound;        /* [n][rows_pad] or NULL (approximate logits only) */
    float *lo;           /* [tasks][XCHUNK] max of a - bound over the task's rows */
    int32_t *cand;       /* [tasks][XCHUNK][1 + HEAD_CAND]: count (-1: too many), rows */
} head_job;

static void head_task(void *ctx, int64_t t, int ith) {
    (void)ith;
    head_job *j = ctx;
    const tdm_qhead *h = j->h;
    int64_t p0 = t * j->chunk, p1 = TDM_MIN(p0 + j->chunk, h->rows_pad / 64);
    j->c->k_dot(h, j->xq, j->n, p0, p1, j->isum);
    const int64_t q0 = p0 * 64, r1 = TDM_MIN(p1 * 64, h->rows);
    for (int32_t i = 0; i < j->n; i++) {
        const xstat *xs = &j->xs[i];
        int32_t *cand = j->bound ? j->cand + (t * XCHUNK + i) * (HEAD_CAND + 1) : NULL;
        float lo = -INFINITY;
        j->c->k_post(h, j->isum + i * h->rows_pad, xs->dx, xs->l1, xs->ex, q0, r1, j->a + i * j->lda,
                     j->bound ? j->bound + i * h->rows_pad : NULL, &lo, cand, HEAD_CAND);
        j->lo[t * XCHUNK + i] = lo;
    }
}

/* Buffers of a pass over n <= XCHUNK x rows, in c->head_buf. */
static tandem_status head_buffers(tdm_cpu *c, const tdm_qhead *h, int32_t n, bool bound, uint8_t **xq,
                                  int32_t **isum, float **a, float **b, float **lo, int32_t **cand,
                                  tdm_err *err) {
    size_t sx = (size_t)n * (size_t)h->cols_pad, sv = (size_t)n * (size_t)h->rows_pad * 4;
    size_t slo = (size_t)c->n_threads * XCHUNK * 4;
    size_t scand = (size_t)c->n_threads * XCHUNK * (HEAD_CAND + 1) * 4;
    size_t off_isum = (sx + 63) & ~(size_t)63, off_a = off_isum + sv, off_b = off_a + sv;
    size_t off_lo = off_b + (bound ? sv : 0), off_cand = off_lo + slo, total = off_cand + scand;
    if (total > c->head_cap) {
        void *p = tdm_alloc_aligned(total, 64);
        if (!p) return tdm_seterr(err, TANDEM_ERR_NOMEM, "head: out of memory (%zu bytes)", total);
        tdm_free_aligned(c->head_buf);
        c->head_buf = p;
        c->head_cap = total;
    }
    uint8_t *base = c->head_buf;
    *xq = base;
    *isum = (int32_t *)(void *)(base + off_isum);
    *a = (float *)(void *)(base + off_a);
    *b = bound ? (float *)(void *)(base + off_b) : NULL;
    *lo = (float *)(void *)(base + off_lo);
    *cand = (int32_t *)(void *)(base + off_cand);
    return TANDEM_OK;
}

static tandem_status check_head(tdm_cpu *c, const tdm_qhead *h, const float *x, int32_t n, const void *out,
                                const char *op, tdm_err *err) {
    if (!c->k_dot)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s: needs AVX-512 VNNI (level %s)", op,
                          tdm_cpu_level_name(c->level));
    if (!h || !h->q || h->rows <= 0 || h->cols <= 0 || h->rows_pad % 64 || h->cols_pad % 4 ||
        h->rows_pad < h->rows || h->cols_pad < h->cols)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: bad quantised head", op);
    if (n < 0 || (n > 0 && (!x || !out))) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: bad arguments", op);
    return TANDEM_OK;
}

/* One pass: quantise x rows (false in ok[i] for a non-finite row), integer dots,
 * approximate logits into a (ld lda) and, when b, bounds and per-task maxima. */
static tandem_status head_pass(tdm_cpu *c, const tdm_qhead *h, const float *x, int32_t n, float *a,
                               int64_t lda, bool bound, head_job *j, bool *ok, tdm_err *err) {
    uint8_t *xq = NULL;
    int32_t *isum = NULL;
    float *abuf = NULL, *b = NULL, *lo = NULL;
    int32_t *cand = NULL;
    tandem_status st = head_buffers(c, h, n, bound, &xq, &isum, &abuf, &b, &lo, &cand, err);
    if (st) return st;
    xstat st_rows[XCHUNK];
    for (int32_t i = 0; i < n; i++) {
        ok[i] = quantize_x(x + i * h->cols, h->cols, h->cols_pad, xq + i * h->cols_pad, &st_rows[i]);
        if (!ok[i]) { /* any finite stand-in; the row's result is replaced */
            memset(xq + i * h->cols_pad, 128, (size_t)h->cols_pad);
            st_rows[i] = (xstat){0, 0, 0};
        }
    }
    int64_t n_panels = h->rows_pad / 64;
    int nth = tdm_cpu_nth(c, n_panels * 64 * h->cols * n, 1 << 18);
    *j = (head_job){.c = c, .h = h, .xq = xq, .xs = st_rows, .n = n, .isum = isum, .a = a ? a : abuf,
                    .lda = a ? lda : h->rows_pad, .bound = b, .lo = lo, .cand = cand};
    j->chunk = (n_panels + nth - 1) / nth;
    j->tasks = (n_panels + j->chunk - 1) / j->chunk;
    tdm_threadpool_run(c->pool, j->tasks, nth, head_task, j);
    j->xs = NULL; /* st_rows dies with this frame */
    return TANDEM_OK;
}

tandem_status tdm_cpu_qhead_logits(tdm_backend *be, const tdm_qhead *h, const float *x, int32_t n, float *y,
                                   tdm_err *err) {
    tdm_cpu *c = tdm_cpu_of(be, "qhead_logits", err);
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    tandem_status st = check_head(c, h, x, n, y, "qhead_logits", err);
    for (int32_t i0 = 0; !st && i0 < n; i0 += XCHUNK) {
        int32_t m = TDM_MIN(XCHUNK, n - i0);
        bool ok[XCHUNK];
        head_job j;
        st = head_pass(c, h, x + i0 * h->cols, m, y + i0 * h->rows, h->rows, false, &j, ok, err);
        for (int32_t i = 0; !st && i < m; i++)
            if (!ok[i]) /* NaN / inf in x: every logit of the row is NaN */
                for (int64_t r = 0; r < h->rows; r++) y[(i0 + i) * h->rows + r] = NAN;
    }
    return st;
}

/* The first of the largest exact logits among row i's candidates (rows whose upper
 * bound reaches lo; the exact logits overwrite b), -1 when none is finite. */
static tandem_status best_candidate(tdm_cpu *c, const tdm_weight *w, const head_job *j, int32_t i,
                                    const float *xi, float lo, int32_t *out, tdm_err *err) {
    const tdm_qhead *h = j->h;
    const float *a = j->a + i * h->rows_pad;
    float *b = j->bound + i * h->rows_pad, best = -INFINITY;
    int32_t idx = -1;
    int64_t n_cand = 0;
    bool scan = false; /* a task found too many: scan the whole row */
    for (int64_t t = 0; t < j->tasks; t++) scan |= j->cand[(t * XCHUNK + i) * (HEAD_CAND + 1)] < 0;
    for (int64_t t = 0; t < (scan ? 1 : j->tasks); t++) {
        const int32_t *cl = j->cand + (t * XCHUNK + i) * (HEAD_CAND + 1);
        int64_t nr = scan ? h->rows : cl[0]; /* rows in increasing order */
        for (int64_t u = 0; u < nr; u++) {
            int64_t r = scan ? u : cl[1 + u];
            if (!(a[r] + b[r] >= lo)) continue;
            if (!c->k->gemv(w, xi, 1, r, r + 1, b, 0, false))
                return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "head_argmax: %s weights", tdm_dtype_name(w->type));
            n_cand++;
            if (b[r] > best) best = b[r], idx = (int32_t)r;
        }
    }
    c->head_rows++;
    c->head_cands += (uint64_t)n_cand;
    *out = idx;
    return TANDEM_OK;
}

tandem_status tdm_cpu_head_argmax(tdm_backend *be, const tdm_weight *w, const tdm_qhead *h, const float *x,
                                  int32_t n, int32_t *ids, tdm_err *err) {
    tdm_cpu *c = tdm_cpu_of(be, "head_argmax", err);
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    tandem_status st = check_head(c, h, x, n, ids, "head_argmax", err);
    if (!st) st = tdm_cpu_check_weight(w, "head_argmax", err);
    if (!st && w->layout != TDM_LAYOUT_ROWS)
        st = tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "head_argmax: the output weight is not in the rows layout");
    if (st) return st;
    if (w->rows != h->rows || w->cols != h->cols)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "head_argmax: head [%lld][%lld] is not W's [%lld][%lld]",
                          (long long)h->rows, (long long)h->cols, (long long)w->rows, (long long)w->cols);
    for (int32_t i0 = 0; i0 < n; i0 += XCHUNK) {
        int32_t m = TDM_MIN(XCHUNK, n - i0);
        bool ok[XCHUNK];
        head_job j;
        if ((st = head_pass(c, h, x + i0 * h->cols, m, NULL, 0, true, &j, ok, err))) return st;
        for (int32_t i = 0; i < m; i++) {
            const float *xi = x + (i0 + i) * h->cols;
            float lo = -INFINITY;
            for (int64_t t = 0; t < j.tasks; t++) lo = fmaxf(lo, j.lo[t * XCHUNK + i]);
            int32_t idx = -1;
            if (ok[i] && isfinite(lo) && (st = best_candidate(c, w, &j, i, xi, lo, &idx, err))) return st;
            if (idx < 0) { /* non-finite x, an overflowing bound or no finite candidate: every logit */
                float *full = j.bound + i * h->rows_pad;
                if ((st = tdm_cpu_matmul(be, w, xi, 1, full, false, err))) return st;
                idx = tdm_argmax(full, (int32_t)h->rows);
            }
            ids[i0 + i] = idx;
        }
    }
    return TANDEM_OK;
}
