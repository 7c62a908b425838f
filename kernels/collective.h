/* collective.h - the collectives of tensor parallelism (src/model/tp.h): one model split
 * across n ranks, each rank's buffers in its own backend's memory.
 *
 * Two implementations: the host one (kernels/collective_host.c) for ranks whose
 * memory is host memory (the CPU backend: the shards run one after another, a
 * correctness vehicle for the tests), and NCCL's (kernels/cuda/cuda_nccl.cu) for
 * CUDA ranks, one device each, driven from one thread.  Calls are made from the
 * thread that drives the ranks; they enqueue on the ranks' streams and return
 * (host: they complete at once).  Not thread-safe: one caller at a time. */
#ifndef TDM_COLLECTIVE_H
#define TDM_COLLECTIVE_H

#include "backend.h"

#define TDM_TP_MAX 8 /* ranks of a group at most */

typedef struct tdm_collective tdm_collective;

typedef struct tdm_collective_ops {
    const char *name;
    /* bufs[r] (count floats in rank r's memory, r < n): every one becomes their sum
     * (host: summed in rank order, the same bits on every rank). */
    tandem_status (*all_reduce_sum)(tdm_collective *c, float *const *bufs, size_t count, tdm_err *err);
    /* Rank 0's dst[rows][dst_cols]: columns [col0[r], col0[r] + ncols[r]) of every row
     * = src[r][rows][ncols[r]] (rank r's memory), for every rank r.  src[r] may be
     * written again once the call returns (later work on rank r waits for the copy). */
    tandem_status (*gather_cols)(tdm_collective *c, float *dst, int64_t dst_cols, float *const *src,
                                 const int64_t *col0, const int64_t *ncols, int32_t rows, tdm_err *err);
    void (*destroy)(tdm_collective *c);
} tdm_collective_ops;

struct tdm_collective {
    const tdm_collective_ops *ops;
    int32_t n; /* ranks */
    void *impl;
};

/* Ranks of host memory (n in [1, TDM_TP_MAX]). */
tandem_status tdm_collective_host_create(int32_t n, tdm_collective **out, tdm_err *err);
/* NCCL over the CUDA backends bes[0 .. n) (distinct devices; rank r = bes[r]);
 * TANDEM_ERR_BACKEND in a build without CUDA or NCCL, naming which. */
tandem_status tdm_collective_nccl_create(tdm_backend *const *bes, int32_t n, tdm_collective **out, tdm_err *err);
void tdm_collective_destroy(tdm_collective *c); /* NULL is a no-op */

/* Makes b's device the calling thread's current one (backends with make_current;
 * a no-op for others). */
tandem_status tdm_backend_activate(tdm_backend *b, tdm_err *err);

#endif
