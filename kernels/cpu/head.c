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
 * logits, bit for bit.  Rows of x with a non-finite value, bounds that overflow
 * and a non-finite exact logit fall back to full logits, where tdm_argmax_finite
 * reports the row as -1 (every logit is finite otherwise: a finite bound holds it).
 */
#include <float.h>
#include <math.h>
#include <string.h>

#include "cpu_internal.h"
#include "sampling.h"

#define XCHUNK TDM_QHEAD_MAX_X /* x rows per pass (the most the kernel takes) */
#define HEAD_CAND 32 /* candidates a task keeps per x row */

void tdm_qhead_approx_ref(const tdm_qhead *h, const uint8_t *xq, const tdm_qhead_xstat *xs, int32_t n,
                          int64_t p0, int64_t p1, bool bound, float *out, int64_t ldo, float *lo) {
    const int64_t r1 = TDM_MIN(p1 * 64, h->rows), c4 = h->cols_pad / 4;
    for (int32_t i = 0; i < n; i++) {
        for (int64_t r = p0 * 64; r < r1; r++) {
            int32_t s = 0;
            for (int64_t k = 0; k < h->cols_pad; k++)
                s += (int32_t)xq[i * h->cols_pad + k] * (int32_t)h->q[tdm_qhead_qidx(c4, r, k)];
            float a = (xs[i].dx * h->d[r]) * (float)(s - 128 * h->qsum[r]);
            if (!bound) {
                out[i * ldo + r] = a;
                continue;
            }
            float b = (xs[i].l1 * h->xcoef[r] + xs[i].ex * h->l1[r]) + TDM_QHEAD_REL_ERR * fabsf(a);
            b = b * TDM_QHEAD_WIDEN + FLT_MIN;
            out[i * ldo + r] = a + b;
            lo[i] = fmaxf(lo[i], a - b);
        }
    }
}

/* qx = round(x / dx) stored as qx + 128 (unsigned bytes for vpdpbusd); padding
 * columns 128 (they meet zero weights).  false when x holds a non-finite value. */
static bool quantize_x(const float *x, int64_t cols, int64_t cols_pad, uint8_t *xq, tdm_qhead_xstat *st) {
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
    const uint8_t *xq;          /* [n][cols_pad] */
    const tdm_qhead_xstat *xs;  /* [n] */
    int32_t n;
    bool bound;                 /* out holds upper bounds A + B, lo and cand are filled */
    int64_t chunk;              /* panels per task */
    int64_t tasks;
    float *out;                 /* [n][ldo] approximate logits A, or A + B */
    int64_t ldo;
    float *lo;                  /* [tasks][XCHUNK] max of A - B over the task's rows */
    int32_t *cand;              /* [tasks][XCHUNK][1 + HEAD_CAND]: count (-1: too many), rows */
} head_job;

/* The rows r in [r0, r1) with ub[r] >= lo, in increasing order, into cand[1..] and
 * their count into cand[0] (-1 past cap).  Candidates are rare, so blocks of 16 are
 * tested branch-free first. */
static void find_cands(const float *ub, int64_t r0, int64_t r1, float lo, int32_t *cand, int32_t cap) {
    int32_t nc = 0;
    for (int64_t q0 = r0; q0 < r1; q0 += 16) {
        int64_t qe = TDM_MIN(q0 + 16, r1);
        int any = 0;
        for (int64_t r = q0; r < qe; r++) any |= ub[r] >= lo;
        for (int64_t r = q0; any && r < qe; r++)
            if (ub[r] >= lo) {
                if (nc == cap) {
                    cand[0] = -1;
                    return;
                }
                cand[1 + nc++] = (int32_t)r;
            }
    }
    cand[0] = nc;
}

static void head_task(void *ctx, int64_t t, int ith) {
    (void)ith;
    head_job *j = ctx;
    const tdm_qhead *h = j->h;
    int64_t p0 = t * j->chunk, p1 = TDM_MIN(p0 + j->chunk, h->rows_pad / 64);
    float lo[XCHUNK];
    for (int32_t i = 0; i < j->n; i++) lo[i] = -INFINITY;
    j->c->k_approx(h, j->xq, j->xs, j->n, p0, p1, j->bound, j->out, j->ldo, lo);
    if (!j->bound) return;
    for (int32_t i = 0; i < j->n; i++) {
        find_cands(j->out + i * j->ldo, p0 * 64, TDM_MIN(p1 * 64, h->rows), lo[i],
                   j->cand + (t * XCHUNK + i) * (HEAD_CAND + 1), HEAD_CAND);
        j->lo[t * XCHUNK + i] = lo[i];
    }
}

/* Buffers of a pass over n <= XCHUNK x rows, in c->head_buf: x bytes, and with
 * bound the upper bounds [n][rows_pad], per-task maxima and candidates. */
static tandem_status head_buffers(tdm_cpu *c, const tdm_qhead *h, int32_t n, bool bound, uint8_t **xq,
                                  float **ub, float **lo, int32_t **cand, tdm_err *err) {
    size_t sx = (size_t)n * (size_t)h->cols_pad, sv = bound ? (size_t)n * (size_t)h->rows_pad * 4 : 0;
    size_t slo = (size_t)c->n_threads * XCHUNK * 4;
    size_t scand = (size_t)c->n_threads * XCHUNK * (HEAD_CAND + 1) * 4;
    size_t off_ub = (sx + 63) & ~(size_t)63, off_lo = off_ub + sv, off_cand = off_lo + slo;
    size_t total = off_cand + scand;
    if (total > c->head_cap) {
        void *p = tdm_alloc_aligned(total, 64);
        if (!p) return tdm_seterr(err, TANDEM_ERR_NOMEM, "head: out of memory (%zu bytes)", total);
        tdm_free_aligned(c->head_buf);
        c->head_buf = p;
        c->head_cap = total;
    }
    uint8_t *base = c->head_buf;
    *xq = base;
    *ub = bound ? (float *)(void *)(base + off_ub) : NULL;
    *lo = (float *)(void *)(base + off_lo);
    *cand = (int32_t *)(void *)(base + off_cand);
    return TANDEM_OK;
}

static tandem_status check_head(tdm_cpu *c, const tdm_qhead *h, const float *x, int32_t n, const void *out,
                                const char *op, tdm_err *err) {
    if (!c->k_approx)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s: needs AVX-512 VNNI (level %s)", op,
                          tdm_cpu_level_name(c->level));
    if (!h || !h->q || h->rows <= 0 || h->cols <= 0 || h->rows_pad % 64 || h->cols_pad % 4 ||
        h->rows_pad < h->rows || h->cols_pad < h->cols)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: bad quantised head", op);
    if (n < 0 || (n > 0 && (!x || !out))) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: bad arguments", op);
    return TANDEM_OK;
}

/* One pass: quantise x rows (false in ok[i] for a non-finite row), then approximate
 * logits into a (ld lda) or, with bound, upper bounds, per-task maxima and
 * candidates into c->head_buf (j describes them). */
static tandem_status head_pass(tdm_cpu *c, const tdm_qhead *h, const float *x, int32_t n, float *a,
                               int64_t lda, bool bound, head_job *j, bool *ok, tdm_err *err) {
    uint8_t *xq = NULL;
    float *ub = NULL, *lo = NULL;
    int32_t *cand = NULL;
    tandem_status st = head_buffers(c, h, n, bound, &xq, &ub, &lo, &cand, err);
    if (st) return st;
    tdm_qhead_xstat st_rows[XCHUNK];
    for (int32_t i = 0; i < n; i++) {
        ok[i] = quantize_x(x + i * h->cols, h->cols, h->cols_pad, xq + i * h->cols_pad, &st_rows[i]);
        if (!ok[i]) { /* any finite stand-in; the row's result is replaced */
            memset(xq + i * h->cols_pad, 128, (size_t)h->cols_pad);
            st_rows[i] = (tdm_qhead_xstat){0, 0, 0};
        }
    }
    int64_t n_panels = h->rows_pad / 64;
    int nth = tdm_cpu_nth(c, n_panels * 64 * h->cols * n, 1 << 18);
    *j = (head_job){.c = c, .h = h, .xq = xq, .xs = st_rows, .n = n, .bound = bound,
                    .out = bound ? ub : a, .ldo = bound ? h->rows_pad : lda, .lo = lo, .cand = cand};
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

/* out[r] = the exact logit of W row r for x row xi, the value matmul computes. */
static tandem_status exact_logit(tdm_cpu *c, const tdm_weight *w, const float *xi, int64_t r, float *out,
                                 tdm_err *err) {
    if (tdm_qdot_type(w->type)) { /* the integer-dot path: matmul of the row alone */
        tdm_weight v;
        return tdm_weight_rows_view(w, r, 1, &v) ? tdm_cpu_matmul_on(c, &v, xi, 1, out + r, false, err)
                                                 : TANDEM_ERR_INVALID_ARG;
    }
    if (!c->k->gemv(w, xi, 1, r, r + 1, out, 0, false))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "head_argmax: %s weights", tdm_dtype_name(w->type));
    return TANDEM_OK;
}

/* Row i's answer among the tokens of mask (a grammar's): the allowed row of the
 * largest upper bound r* gives a lower bound, its exact logit lo, of the largest
 * allowed logit; every allowed row whose upper bound reaches lo is computed exactly
 * (in increasing order: the first of a tie wins), the others are below lo.  -1 (the
 * caller then decides on full logits) when nothing is allowed, a bound overflowed
 * or a logit is not finite. */
static tandem_status best_masked(tdm_cpu *c, const tdm_weight *w, const head_job *j, int32_t i, const float *xi,
                                 const uint32_t *mask, int32_t *out, tdm_err *err) {
    const int64_t rows = j->h->rows;
    float *ub = j->out + i * j->ldo; /* (exact logits replace their bounds) */
    int64_t top = -1;
    *out = -1;
    if (!tdm_logits_finite(ub, (int32_t)rows)) return TANDEM_OK; /* (a bound overflowed: an unallowed logit may not be finite) */
    for (int64_t w0 = 0; w0 < rows; w0 += 32) {
        uint32_t bits = mask[w0 / 32];
        while (bits) {
            const int64_t r = w0 + __builtin_ctz(bits);
            bits &= bits - 1;
            if (r < rows && (top < 0 || ub[r] > ub[top])) top = r;
        }
    }
    if (top < 0) return TANDEM_OK;
    tandem_status st = exact_logit(c, w, xi, top, ub, err);
    if (st || !isfinite(ub[top])) return st;
    const float lo = ub[top];
    float best = -INFINITY;
    int32_t idx = -1;
    int64_t n_cand = 0;
    for (int64_t w0 = 0; w0 < rows; w0 += 32) {
        uint32_t bits = mask[w0 / 32];
        while (bits) {
            const int64_t r = w0 + __builtin_ctz(bits);
            bits &= bits - 1;
            if (r >= rows || !(ub[r] >= lo)) continue;
            if (r != top) {
                if ((st = exact_logit(c, w, xi, r, ub, err))) return st;
                n_cand++;
                if (!isfinite(ub[r])) return TANDEM_OK;
            }
            if (ub[r] > best) best = ub[r], idx = (int32_t)r;
        }
    }
    c->head_rows++;
    c->head_cands += (uint64_t)n_cand + 1;
    *out = idx;
    return TANDEM_OK;
}

/* The first of the largest exact logits among row i's candidates (rows whose upper
 * bound reaches lo; the exact logits overwrite their bounds), -1 when one is not finite. */
static tandem_status best_candidate(tdm_cpu *c, const tdm_weight *w, const head_job *j, int32_t i,
                                    const float *xi, float lo, int32_t *out, tdm_err *err) {
    const tdm_qhead *h = j->h;
    float *ub = j->out + i * j->ldo, best = -INFINITY; /* an exact logit replaces its bound */
    int32_t idx = -1;
    int64_t n_cand = 0;
    bool scan = false; /* a task found too many: scan the whole row */
    bool finite = true;
    for (int64_t t = 0; t < j->tasks; t++) scan |= j->cand[(t * XCHUNK + i) * (HEAD_CAND + 1)] < 0;
    for (int64_t t = 0; finite && t < (scan ? 1 : j->tasks); t++) {
        const int32_t *cl = j->cand + (t * XCHUNK + i) * (HEAD_CAND + 1);
        int64_t nr = scan ? h->rows : cl[0]; /* rows in increasing order */
        for (int64_t u = 0; finite && u < nr; u++) {
            int64_t r = scan ? u : cl[1 + u];
            if (!(ub[r] >= lo)) continue;
            tandem_status st = exact_logit(c, w, xi, r, ub, err);
            if (st) return st;
            n_cand++;
            finite = isfinite(ub[r]); /* NaN / inf: the full logits decide (and report it) */
            if (ub[r] > best) best = ub[r], idx = (int32_t)r;
        }
    }
    if (!finite) idx = -1;
    c->head_rows++;
    c->head_cands += (uint64_t)n_cand;
    *out = idx;
    return TANDEM_OK;
}

tandem_status tdm_cpu_head_argmax(tdm_backend *be, const tdm_weight *w, const tdm_qhead *h, const float *x,
                                  int32_t n, const uint32_t *const *masks, int32_t *ids, tdm_err *err) {
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
            const uint32_t *mask = masks ? masks[i0 + i] : NULL;
            int32_t idx = -1;
            if (ok[i] && isfinite(lo) &&
                (st = mask ? best_masked(c, w, &j, i, xi, mask, &idx, err) : best_candidate(c, w, &j, i, xi, lo, &idx, err)))
                return st;
            if (idx < 0) { /* non-finite x, an overflowing bound or a non-finite candidate: every logit */
                float *full = j.out + i * j.ldo;
                if ((st = tdm_cpu_matmul(be, w, xi, 1, full, false, err))) return st;
                idx = mask ? tdm_argmax_masked(full, (int32_t)h->rows, mask) : tdm_argmax_finite(full, (int32_t)h->rows);
            }
            ids[i0 + i] = idx;
        }
    }
    return TANDEM_OK;
}
