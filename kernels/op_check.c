/* op_check.c - argument checks that every backend's ops make alike (backend.h). */
#include "backend.h"

tandem_status tdm_check_ids(const int32_t *ids, int32_t n, int64_t limit, const char *op, tdm_err *err) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= limit)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: id %d at %d out of range [0, %lld)", op,
                              (int)ids[i], (int)i, (long long)limit);
    return TANDEM_OK;
}
