/* cuda_stub.c - tdm_backend_cuda_create for builds without CUDA. */
#include "backend.h"
#include "collective.h"

tandem_status tdm_backend_cuda_create(int32_t device, tdm_backend **out, tdm_err *err) {
    if (out) *out = NULL;
    return tdm_seterr(err, TANDEM_ERR_BACKEND,
                      "tandem was built without CUDA (cannot use CUDA device %d)", (int)device);
}

void tdm_backend_cuda_graph_stats(tdm_backend *b, uint64_t *replays, uint64_t *captures) {
    (void)b;
    *replays = *captures = 0;
}

void tdm_backend_cuda_force_matmul(tdm_backend *b, int path) {
    (void)b;
    (void)path;
}

void tdm_backend_cuda_force_attention(tdm_backend *b, tdm_cuda_attn_path path) {
    (void)b;
    (void)path;
}

tandem_status tdm_collective_nccl_create(tdm_backend *const *bes, int32_t n, tdm_collective **out, tdm_err *err) {
    (void)bes;
    (void)n;
    *out = NULL;
    return tdm_seterr(err, TANDEM_ERR_BACKEND, "tandem was built without CUDA: a model cannot be split across GPUs");
}
