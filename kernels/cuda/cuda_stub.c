/* cuda_stub.c - tdm_backend_cuda_create for builds without CUDA. */
#include "backend.h"

tandem_status tdm_backend_cuda_create(int32_t device, tdm_backend **out, tdm_err *err) {
    if (out) *out = NULL;
    return tdm_seterr(err, TANDEM_ERR_BACKEND,
                      "tandem was built without CUDA (cannot use CUDA device %d)", (int)device);
}

void tdm_backend_cuda_graph_stats(tdm_backend *b, uint64_t *replays, uint64_t *captures) {
    (void)b;
    *replays = *captures = 0;
}
