/* ops_arch.c - the CPU ops the qwen3 and gemma3 blocks add to the llama block:
 * per-head RMSNorm (q and k norms), GeGLU, the residual add after a post norm, the
 * embedding scale and logit soft-capping.  Each validates its arguments, then hands
 * rows to the thread pool when the work pays for the dispatch. */
#include <math.h>

#include "cpu_internal.h"

/* Elements per thread below which an op stays on the calling thread. */
#define MIN_WORK 16384

#define GET_CPU(op)                                                     \
    tdm_cpu *c = tdm_cpu_of(b, op, err);                                \
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG

/* ---- head_rmsnorm -------------------------------------------------------------- */

typedef struct head_norm_job {
    const tdm_cpu *c;
    float *x;
    int32_t row_stride, n_head, head_dim;
    const float *gamma;
    float eps;
} head_norm_job;

static void head_norm_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    head_norm_job *j = ctx;
    float *row = j->x + i * j->row_stride;
    for (int32_t h = 0; h < j->n_head; h++) {
        float *v = row + (int64_t)h * j->head_dim;
        j->c->k->rmsnorm_row(v, j->gamma, j->head_dim, j->eps, v);
    }
}

tandem_status tdm_cpu_head_rmsnorm(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                                   int32_t head_dim, const float *gamma, float eps, tdm_err *err) {
    GET_CPU("head_rmsnorm");
    tandem_status st = tdm_check_head_norm(x, gamma, n, row_stride, n_head, head_dim, eps, err);
    if (st || n == 0) return st;
    head_norm_job j = {c, x, row_stride, n_head, head_dim, gamma, eps};
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, (int64_t)n * n_head * head_dim, MIN_WORK), head_norm_task, &j);
    return TANDEM_OK;
}

/* ---- geglu --------------------------------------------------------------------- */

void tdm_cpu_geglu_row(const float *g, const float *u, float *o, int32_t n) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int32_t i = 0; i < n; i++) {
        const float x = g[i];
        o[i] = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x))) * u[i];
    }
}

typedef struct geglu_job {
    const float *gate_up; /* [n][2 * ff] */
    int32_t ff;
    float *out;           /* [n][ff] */
} geglu_job;

static void geglu_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    geglu_job *j = ctx;
    const float *g = j->gate_up + i * 2 * j->ff;
    tdm_cpu_geglu_row(g, g + j->ff, j->out + i * j->ff, j->ff);
}

tandem_status tdm_cpu_geglu(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff, float *out, tdm_err *err) {
    GET_CPU("geglu");
    tandem_status st = tdm_check_rows("geglu", gate_up, out, n, ff, err);
    if (st || n == 0) return st;
    geglu_job j = {gate_up, ff, out};
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, (int64_t)n * ff, 2048), geglu_task, &j);
    return TANDEM_OK;
}

/* ---- add, scale, softcap ------------------------------------------------------- */

tandem_status tdm_cpu_add(tdm_backend *b, float *y, const float *x, int32_t n, int32_t dim, tdm_err *err) {
    GET_CPU("add");
    (void)c;
    tandem_status st = tdm_check_rows("add", y, x, n, dim, err);
    if (st) return st;
    const int64_t len = (int64_t)n * dim;
    for (int64_t i = 0; i < len; i++) y[i] += x[i];
    return TANDEM_OK;
}

tandem_status tdm_cpu_scale(tdm_backend *b, float *x, int32_t n, int32_t dim, float s, tdm_err *err) {
    GET_CPU("scale");
    (void)c;
    tandem_status st = tdm_check_rows("scale", x, x, n, dim, err);
    if (st) return st;
    if ((st = tdm_check_factor("scale", s, false, err))) return st;
    const int64_t len = (int64_t)n * dim;
    for (int64_t i = 0; i < len; i++) x[i] *= s;
    return TANDEM_OK;
}

typedef struct softcap_job {
    float *x;
    int32_t dim;
    float cap;
} softcap_job;

static void softcap_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    softcap_job *j = ctx;
    float *r = j->x + i * j->dim;
    for (int32_t k = 0; k < j->dim; k++) r[k] = tdm_cpu_softcap1(r[k], j->cap);
}

tandem_status tdm_cpu_softcap(tdm_backend *b, float *x, int32_t n, int32_t dim, float cap, tdm_err *err) {
    GET_CPU("softcap");
    tandem_status st = tdm_check_rows("softcap", x, x, n, dim, err);
    if (st) return st;
    if ((st = tdm_check_factor("softcap", cap, true, err))) return st;
    if (n == 0) return TANDEM_OK;
    softcap_job j = {x, dim, cap};
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, (int64_t)n * dim, 4096), softcap_task, &j);
    return TANDEM_OK;
}

/* ---- scatter_cols -------------------------------------------------------------- */

typedef struct scatter_job {
    const float *x;
    const int32_t *ids;
    int32_t nx, dim;
    float fill;
    float *y;
    _Atomic bool bad; /* an id out of order or range (each row's task checks) */
} scatter_job;

/* One row in one pass over it: the run of fill before each id, then the id's logit. */
static void scatter_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    scatter_job *j = ctx;
    const float *x = j->x + i * j->nx;
    float *y = j->y + i * j->dim;
    int32_t next = 0; /* first entry of y not yet written */
    for (int32_t k = 0; k < j->nx; k++) {
        const int32_t id = j->ids[k];
        if (id < next || id >= j->dim) {
            j->bad = true;
            return;
        }
        for (int32_t v = next; v < id; v++) y[v] = j->fill;
        y[id] = x[k];
        next = id + 1;
    }
    for (int32_t v = next; v < j->dim; v++) y[v] = j->fill;
}

tandem_status tdm_cpu_scatter_cols(tdm_backend *b, const float *x, int32_t n, int32_t nx, const int32_t *ids,
                                   int32_t dim, float fill, float *y, tdm_err *err) {
    GET_CPU("scatter_cols");
    tandem_status st = tdm_check_scatter(x, n, nx, ids, dim, y, err);
    if (st || n == 0) return st;
    scatter_job j = {x, ids, nx, dim, fill, y, false};
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, (int64_t)n * dim, 65536), scatter_task, &j);
    if (j.bad) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "scatter_cols: ids not ascending in [0, %d)", (int)dim);
    return TANDEM_OK;
}

/* ---- mask_rows ----------------------------------------------------------------- */

typedef struct mask_job {
    float *x;
    const uint32_t *mask;
    int32_t dim;
    float fill;
} mask_job;

static void mask_task(void *ctx, int64_t i, int ith) {
    (void)ith;
    const mask_job *j = ctx;
    const size_t words = ((size_t)j->dim + 31) / 32;
    tdm_logits_mask(j->x + i * j->dim, j->dim, j->mask + (size_t)i * words, j->fill);
}

tandem_status tdm_cpu_mask_rows(tdm_backend *b, float *x, int32_t n, int32_t dim, const uint32_t *mask, float fill,
                                tdm_err *err) {
    GET_CPU("mask_rows");
    tandem_status st = tdm_check_rows("mask_rows", x, mask, n, dim, err);
    if (st || n == 0) return st;
    mask_job j = {x, mask, dim, fill};
    tdm_threadpool_run(c->pool, n, tdm_cpu_nth(c, (int64_t)n * dim, 65536), mask_task, &j);
    return TANDEM_OK;
}

tandem_status tdm_cpu_edit_rows(tdm_backend *b, float *x, int32_t n, int32_t dim, const tdm_logit_edit *edits,
                                const int32_t *off, tdm_err *err) {
    GET_CPU("edit_rows");
    (void)c;
    if (n < 0 || dim <= 0 || (n > 0 && (!x || !off)))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "edit_rows: bad shape (n %d, dim %d)", (int)n, (int)dim);
    for (int32_t i = 0; i < n; i++)
        if (off[i + 1] < off[i] || (off[i + 1] > off[i] && !edits))
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "edit_rows: bad offsets at row %d", (int)i);
    if (!tdm_logits_edit_rows(x, n, dim, edits, off))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "edit_rows: a token id out of range [0, %d)", (int)dim);
    return TANDEM_OK;
}

tandem_status tdm_cpu_row_top(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t k, const int32_t *want,
                              tdm_row_top *out, tdm_err *err) {
    GET_CPU("row_top");
    (void)c;
    if (n < 0 || dim <= 0 || k < 0 || k > TDM_ROW_TOP_MAX || k > dim || (n > 0 && (!x || !want || !out)))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "row_top: n = %d, dim = %d, k = %d (0..%d)", (int)n, (int)dim,
                          (int)k, TDM_ROW_TOP_MAX);
    for (int32_t i = 0; i < n; i++) {
        const float *row = x + (size_t)i * (size_t)dim;
        tdm_logits_row_top(row, dim, k, &out[i]);
        out[i].want = want[i] >= 0 && want[i] < dim ? row[want[i]] : 0.0f;
    }
    return TANDEM_OK;
}
