/* op_check.c - argument checks that every backend's ops make alike (backend.h). */
#include "backend.h"

#include <math.h>

tandem_status tdm_check_rows(const char *op, const void *a, const void *b, int32_t n, int32_t dim, tdm_err *err) {
    if (n < 0 || dim <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: n = %d, dim = %d", op, (int)n, (int)dim);
    if (n > 0 && (!a || !b)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: NULL pointer", op);
    return TANDEM_OK;
}

tandem_status tdm_check_scatter(const float *x, int32_t n, int32_t nx, const int32_t *ids, int32_t dim, const float *y,
                                tdm_err *err) {
    if (n < 0 || nx <= 0 || nx > dim)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "scatter_cols: n = %d, nx = %d, dim = %d", (int)n, (int)nx,
                          (int)dim);
    if (n > 0 && (!x || !ids || !y)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "scatter_cols: NULL pointer");
    return TANDEM_OK;
}

tandem_status tdm_check_factor(const char *op, float v, bool positive, tdm_err *err) {
    if (!isfinite(v) || (positive && !(v > 0)))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: %s %g", op, positive ? "cap" : "factor", (double)v);
    return TANDEM_OK;
}

tandem_status tdm_check_head_norm(const float *x, const float *gamma, int32_t n, int32_t row_stride, int32_t n_head,
                                  int32_t head_dim, float eps, tdm_err *err) {
    if (n < 0 || n_head <= 0 || head_dim <= 0 || (int64_t)n_head * head_dim > row_stride || !(eps >= 0))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "head_rmsnorm: n = %d, n_head = %d, head_dim = %d, row_stride = %d, eps = %g", (int)n,
                          (int)n_head, (int)head_dim, (int)row_stride, (double)eps);
    if (n > 0 && (!x || !gamma)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "head_rmsnorm: NULL pointer");
    return TANDEM_OK;
}

tandem_status tdm_check_ids(const int32_t *ids, int32_t n, int64_t limit, const char *op, tdm_err *err) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= limit)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: id %d at %d out of range [0, %lld)", op,
                              (int)ids[i], (int)i, (long long)limit);
    return TANDEM_OK;
}
