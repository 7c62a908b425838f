/* cuda_nccl.cu - the collectives of tensor parallelism over CUDA ranks
 * (kernels/collective.h): NCCL's all-reduce, one communicator per device made
 * together (ncclCommInitAll: one process, one thread driving every rank), and the
 * logits gather as 2-D copies into rank 0's buffer.
 *
 * Ordering: every call enqueues on the ranks' own streams (the backends' streams,
 * where their ops run), so it follows the ops before it and precedes those after
 * it on each rank.  The gather makes rank 0's stream wait for each rank's part (an
 * event recorded on the rank's stream) and each rank's stream wait for the copies
 * (an event on rank 0's stream) before its next work overwrites the part.
 * Built without NCCL (TDM_HAVE_NCCL undefined), creation fails with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "collective.h"
}

#ifdef TDM_HAVE_NCCL
#include <nccl.h>

typedef struct nccl_coll {
    tdm_cuda *c[TDM_TP_MAX];
    ncclComm_t comm[TDM_TP_MAX];
    cudaEvent_t part[TDM_TP_MAX]; /* on rank r's device: its part is ready */
    cudaEvent_t copied;           /* on rank 0's device: the gather's copies are done */
} nccl_coll;

static tandem_status nccl_status(ncclResult_t r, const char *what, tdm_err *err) {
    if (r == ncclSuccess) return TANDEM_OK;
    return tdm_seterr(err, TANDEM_ERR_BACKEND, "nccl: %s failed: %s", what, ncclGetErrorString(r));
}

static tandem_status nccl_all_reduce(tdm_collective *c, float *const *bufs, size_t count, tdm_err *err) {
    nccl_coll *k = (nccl_coll *)c->impl;
    if (c->n == 1 || count == 0) return TANDEM_OK;
    tandem_status st = nccl_status(ncclGroupStart(), "ncclGroupStart", err);
    for (int32_t r = 0; r < c->n && !st; r++)
        st = nccl_status(ncclAllReduce(bufs[r], bufs[r], count, ncclFloat, ncclSum, k->comm[r], k->c[r]->stream),
                         "ncclAllReduce", err);
    tandem_status st_end = nccl_status(ncclGroupEnd(), "ncclGroupEnd", st ? NULL : err); /* (always closed) */
    return st ? st : st_end;
}

static tandem_status nccl_gather_cols(tdm_collective *c, float *dst, int64_t dst_cols, float *const *src,
                                      const int64_t *col0, const int64_t *ncols, int32_t rows, tdm_err *err) {
    nccl_coll *k = (nccl_coll *)c->impl;
    tdm_cuda *c0 = k->c[0];
    for (int32_t r = 0; r < c->n; r++) {
        if (col0[r] < 0 || ncols[r] < 0 || col0[r] + ncols[r] > dst_cols)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gather_cols: rank %d's columns [%lld, %lld) outside %lld",
                              (int)r, (long long)col0[r], (long long)(col0[r] + ncols[r]), (long long)dst_cols);
        if (rows == 0 || ncols[r] == 0) continue;
        if (r > 0) { /* rank 0 waits for rank r's part */
            TDM_CU(cudaSetDevice(k->c[r]->device));
            TDM_CU(cudaEventRecord(k->part[r], k->c[r]->stream));
            TDM_CU(cudaSetDevice(c0->device));
            TDM_CU(cudaStreamWaitEvent(c0->stream, k->part[r], 0));
        }
        const size_t w = (size_t)ncols[r] * sizeof(float);
        TDM_CU(cudaMemcpy2DAsync(dst + col0[r], (size_t)dst_cols * sizeof(float), src[r], w, w, (size_t)rows,
                                 cudaMemcpyDefault, c0->stream));
    }
    if (c->n == 1) return TANDEM_OK;
    TDM_CU(cudaEventRecord(k->copied, c0->stream));
    for (int32_t r = 1; r < c->n; r++) { /* rank r's next work waits for the copies */
        TDM_CU(cudaSetDevice(k->c[r]->device));
        TDM_CU(cudaStreamWaitEvent(k->c[r]->stream, k->copied, 0));
    }
    TDM_CU(cudaSetDevice(c0->device));
    return TANDEM_OK;
}

static void nccl_destroy(tdm_collective *c) {
    nccl_coll *k = (nccl_coll *)c->impl;
    if (k) {
        for (int32_t r = 0; r < c->n; r++) {
            if (!k->c[r]) continue;
            cudaSetDevice(k->c[r]->device);
            cudaStreamSynchronize(k->c[r]->stream);
            if (k->comm[r]) ncclCommDestroy(k->comm[r]);
            if (k->part[r]) cudaEventDestroy(k->part[r]);
            if (r == 0 && k->copied) cudaEventDestroy(k->copied);
        }
        if (k->c[0]) cudaSetDevice(k->c[0]->device);
        free(k);
    }
    free(c);
}

static const tdm_collective_ops nccl_ops = {"nccl", nccl_all_reduce, nccl_gather_cols, nccl_destroy};

extern "C" tandem_status tdm_collective_nccl_create(tdm_backend *const *bes, int32_t n, tdm_collective **out,
                                                    tdm_err *err) {
    *out = NULL;
    if (n < 1 || n > TDM_TP_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "a group of %d ranks (1..%d)", (int)n, TDM_TP_MAX);
    int devs[TDM_TP_MAX];
    tdm_cuda *cs[TDM_TP_MAX];
    for (int32_t r = 0; r < n; r++) {
        if (!(cs[r] = tdm_cuda_of(bes[r], "tensor parallel", err))) return err ? err->status : TANDEM_ERR_INVALID_ARG;
        devs[r] = cs[r]->device;
        for (int32_t q = 0; q < r; q++)
            if (devs[q] == devs[r])
                return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tensor parallel: ranks %d and %d are both on cuda:%d",
                                  (int)q, (int)r, devs[r]);
    }
    tdm_collective *c = (tdm_collective *)calloc(1, sizeof *c);
    nccl_coll *k = (nccl_coll *)calloc(1, sizeof *k);
    if (!c || !k) {
        free(c);
        free(k);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    c->ops = &nccl_ops;
    c->n = n;
    c->impl = k;
    tandem_status st = TANDEM_OK;
    if (n > 1) st = nccl_status(ncclCommInitAll(k->comm, n, devs), "ncclCommInitAll", err);
    for (int32_t r = 0; r < n && !st; r++) {
        k->c[r] = cs[r];
        cudaError_t e = cudaSetDevice(devs[r]);
        if (e == cudaSuccess) e = cudaEventCreateWithFlags(&k->part[r], cudaEventDisableTiming);
        if (e == cudaSuccess && r == 0) e = cudaEventCreateWithFlags(&k->copied, cudaEventDisableTiming);
        if (e == cudaSuccess && r > 0) { /* direct copies into rank 0 where the link allows (else staged) */
            int can = 0;
            if (cudaDeviceCanAccessPeer(&can, devs[0], devs[r]) == cudaSuccess && can) {
                cudaSetDevice(devs[0]);
                if (cudaDeviceEnablePeerAccess(devs[r], 0) != cudaSuccess) cudaGetLastError(); /* (already on) */
            }
        }
        if (e != cudaSuccess) st = tdm_cuda_status(e, "tensor parallel events", err);
    }
    cudaSetDevice(devs[0]);
    if (st) {
        for (int32_t r = 0; r < n; r++) k->c[r] = cs[r];
        nccl_destroy(c);
        return st;
    }
    *out = c;
    return TANDEM_OK;
}

#else /* built without NCCL */

extern "C" tandem_status tdm_collective_nccl_create(tdm_backend *const *bes, int32_t n, tdm_collective **out,
                                                    tdm_err *err) {
    (void)bes;
    (void)n;
    *out = NULL;
    return tdm_seterr(err, TANDEM_ERR_BACKEND,
                      "tandem was built without NCCL: a model on CUDA cannot be split across GPUs (rebuild where "
                      "NCCL's headers and library are found)");
}

#endif
