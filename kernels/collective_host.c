/* collective_host.c - the collectives of ranks in host memory (collective.h). */
#include "collective.h"

#include <stdlib.h>
#include <string.h>

static tandem_status host_all_reduce(tdm_collective *c, float *const *bufs, size_t count, tdm_err *err) {
    for (int32_t r = 0; r < c->n; r++)
        if (!bufs[r] && count > 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "all_reduce: rank %d's buffer is NULL", (int)r);
    if (c->n == 1) return TANDEM_OK;
    for (size_t i = 0; i < count; i++) {
        float sum = bufs[0][i];
        for (int32_t r = 1; r < c->n; r++) sum += bufs[r][i];
        for (int32_t r = 0; r < c->n; r++) bufs[r][i] = sum;
    }
    return TANDEM_OK;
}

static tandem_status host_gather_cols(tdm_collective *c, float *dst, int64_t dst_cols, float *const *src,
                                      const int64_t *col0, const int64_t *ncols, int32_t rows, tdm_err *err) {
    for (int32_t r = 0; r < c->n; r++) {
        if (col0[r] < 0 || ncols[r] < 0 || col0[r] + ncols[r] > dst_cols)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gather_cols: rank %d's columns [%lld, %lld) outside %lld",
                              (int)r, (long long)col0[r], (long long)(col0[r] + ncols[r]), (long long)dst_cols);
        for (int32_t i = 0; i < rows; i++)
            memcpy(dst + (size_t)i * (size_t)dst_cols + (size_t)col0[r], src[r] + (size_t)i * (size_t)ncols[r],
                   (size_t)ncols[r] * sizeof(float));
    }
    return TANDEM_OK;
}

static void host_destroy(tdm_collective *c) { free(c); }

static const tdm_collective_ops host_ops = {"host", host_all_reduce, host_gather_cols, host_destroy};

tandem_status tdm_collective_host_create(int32_t n, tdm_collective **out, tdm_err *err) {
    *out = NULL;
    if (n < 1 || n > TDM_TP_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "a group of %d ranks (1..%d)", (int)n, TDM_TP_MAX);
    tdm_collective *c = calloc(1, sizeof *c);
    if (!c) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    c->ops = &host_ops;
    c->n = n;
    *out = c;
    return TANDEM_OK;
}

void tdm_collective_destroy(tdm_collective *c) {
    if (c) c->ops->destroy(c);
}

tandem_status tdm_backend_activate(tdm_backend *b, tdm_err *err) {
    return b && b->ops->make_current ? b->ops->make_current(b, err) : TANDEM_OK;
}
