/* cuda_internal.h - the CUDA backend's shared declarations (C++ / CUDA side).
 *
 * The backend (cuda_backend.cu) implements the op table of kernels/backend.h on
 * device memory.  Every op enqueues its kernels on the backend's one stream and
 * returns; upload, download and sync wait for it.  Batch metadata (token ids,
 * positions, visible sets, block tables) is host memory by the op contract: an op
 * packs what its kernels need into one host buffer, checks it there (so bad
 * arguments are reported before anything runs), and copies it to the device with
 * one transfer (tdm_cuda_meta).
 *
 * Launchers are plain C++ functions returning a status; unsupported types or sizes
 * return TANDEM_ERR_UNSUPPORTED with a message, and every CUDA call is checked.
 */
#ifndef TDM_CUDA_INTERNAL_H
#define TDM_CUDA_INTERNAL_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "backend.h"
}

typedef struct tdm_cuda {
    int device;
    cudaStream_t stream;
    /* Metadata ring: an op packs its metadata at meta_off in the pinned host half
     * and copies it to the same offset of the device half, asynchronously; the
     * ring starts over (after a stream synchronisation) when it is full, so no
     * region is rewritten while a copy or kernel may still read it. */
    uint8_t *meta_h;     /* [meta_cap] pinned host memory */
    uint8_t *meta_d;     /* [meta_cap] device memory */
    size_t meta_cap, meta_off;
    /* The last uploads (ring offsets and sizes): an op whose packed metadata equals
     * one of them reuses its device copy (the layers of one forward pass the same
     * positions, slots and block tables). */
    struct { size_t off, bytes; } meta_recent[4];
    int meta_n_recent, meta_next_recent;
    float *scratch_d;    /* attention scores [rows * heads][n_tot_max] */
    size_t scratch_cap;  /* floats */
    char name[96];       /* "cuda:0 (NVIDIA H200)" */
} tdm_cuda;

/* The backend's state, or NULL with err set when b is not a CUDA backend. */
tdm_cuda *tdm_cuda_of(tdm_backend *b, const char *op, tdm_err *err);

/* TANDEM_OK, or TANDEM_ERR_BACKEND naming what failed and CUDA's message. */
tandem_status tdm_cuda_status(cudaError_t e, const char *what, tdm_err *err);
#define TDM_CU(call)                                                                   \
    do {                                                                               \
        cudaError_t e_ = (call);                                                       \
        if (e_ != cudaSuccess) return tdm_cuda_status(e_, #call, err);                  \
    } while (0)
/* After a launch: the launch's own error (bad configuration), if any. */
#define TDM_CU_LAUNCHED(what)                                                          \
    do {                                                                               \
        cudaError_t e_ = cudaGetLastError();                                           \
        if (e_ != cudaSuccess) return tdm_cuda_status(e_, what, err);                  \
    } while (0)

/* Room for `bytes` of metadata in the ring's host half (valid until the matching
 * tdm_cuda_meta_upload), NULL with err set on failure. */
void *tdm_cuda_meta_host(tdm_cuda *c, size_t bytes, tdm_err *err);
/* Queues the copy of those `bytes` to the device and returns their device address,
 * for the kernels enqueued next (NULL with err set on failure).  Does not wait. */
void *tdm_cuda_meta_upload(tdm_cuda *c, size_t bytes, tdm_err *err);
/* Device scratch of at least n floats (attention scores), NULL with err set. */
float *tdm_cuda_scratch(tdm_cuda *c, size_t n, tdm_err *err);

/* Checks a weight for the ops that read it (shape, type, data, rows layout). */
tandem_status tdm_cuda_check_weight(const tdm_weight *w, const char *op, tdm_err *err);

/* ---- ops (cuda_rowops.cu, cuda_matmul.cu, cuda_attention.cu) ---------------- */

tandem_status tdm_cuda_get_rows(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n, float *out,
                                tdm_err *err);
tandem_status tdm_cuda_rmsnorm(tdm_backend *b, const float *x, const float *gamma, int32_t n, int32_t dim,
                               float eps, float *out, tdm_err *err);
tandem_status tdm_cuda_add_bias(tdm_backend *b, float *y, const float *bias, int32_t n, int32_t dim,
                                tdm_err *err);
tandem_status tdm_cuda_rope(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                            int32_t head_dim, const int32_t *pos, const tdm_rope_params *rp, tdm_err *err);
tandem_status tdm_cuda_swiglu(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff, float *out,
                              tdm_err *err);
tandem_status tdm_cuda_gather_rows(tdm_backend *b, const float *x, const int32_t *rows, int32_t n, int32_t dim,
                                   float *out, tdm_err *err);
tandem_status tdm_cuda_matmul(tdm_backend *b, const tdm_weight *w, const float *x, int32_t n, float *y,
                              bool accumulate, tdm_err *err);
tandem_status tdm_cuda_kv_write(tdm_backend *b, const tdm_kv_write_args *a, tdm_err *err);
tandem_status tdm_cuda_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *err);

/* Threads per block of the row kernels. */
#define TDM_CUDA_THREADS 256

#endif
