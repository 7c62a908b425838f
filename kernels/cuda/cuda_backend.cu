/* cuda_backend.cu - the CUDA backend: device selection, memory, metadata staging
 * and the op table (kernels/backend.h).  The ops' kernels live in cuda_rowops.cu,
 * cuda_matmul.cu and cuda_attention.cu.
 *
 * One stream per backend; ops enqueue and return, so consecutive ops overlap with
 * the host's work.  upload and download are synchronous (the host buffer may be
 * reused as soon as they return), as is sync.  Not thread-safe: one backend is
 * driven by one thread at a time (as the engine does).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_graph.h"
#include "cuda_prof.h"
#include "cuda_internal.h"

bool tdm_cuda_pdl = false;

tandem_status tdm_cuda_status(cudaError_t e, const char *what, tdm_err *err) {
    if (e == cudaSuccess) return TANDEM_OK;
    return tdm_seterr(err, TANDEM_ERR_BACKEND, "cuda: %s: %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

#define META_ALIGN 256
#define META_MIN_CAP ((size_t)1 << 20)

void *tdm_cuda_meta_host(tdm_cuda *c, size_t bytes, tdm_err *err) {
    if (c->meta_off + bytes <= c->meta_cap) return c->meta_h + c->meta_off;
    /* start over: wait until every queued copy and kernel is done with the ring */
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        tdm_cuda_status(e, "metadata ring", err);
        return NULL;
    }
    c->meta_off = 0;
    c->meta_n_recent = 0; /* (their regions are about to be rewritten) */
    if (bytes <= c->meta_cap) return c->meta_h;
    size_t cap = TDM_MAX(META_MIN_CAP, 2 * bytes);
    cudaFreeHost(c->meta_h);
    cudaFree(c->meta_d);
    c->meta_h = c->meta_d = NULL;
    c->meta_cap = 0;
    void *h = NULL, *d = NULL;
    e = cudaMallocHost(&h, cap);
    if (e == cudaSuccess) e = cudaMalloc(&d, cap);
    if (e != cudaSuccess) {
        cudaFreeHost(h);
        tdm_cuda_status(e, "metadata ring", err);
        return NULL;
    }
    c->meta_h = (uint8_t *)h;
    c->meta_d = (uint8_t *)d;
    c->meta_cap = cap;
    return c->meta_h;
}

void *tdm_cuda_meta_upload(tdm_cuda *c, size_t bytes, tdm_err *err) {
    const uint8_t *h = c->meta_h + c->meta_off;
    for (int i = 0; i < c->meta_n_recent; i++)
        if (c->meta_recent[i].bytes == bytes && memcmp(c->meta_h + c->meta_recent[i].off, h, bytes) == 0)
            return c->meta_d + c->meta_recent[i].off;
    uint8_t *d = c->meta_d + c->meta_off;
    cudaError_t e = cudaMemcpyAsync(d, c->meta_h + c->meta_off, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess) {
        tdm_cuda_status(e, "metadata upload", err);
        return NULL;
    }
    c->meta_recent[c->meta_next_recent].off = c->meta_off;
    c->meta_recent[c->meta_next_recent].bytes = bytes;
    c->meta_next_recent = (c->meta_next_recent + 1) % 4;
    if (c->meta_n_recent < 4) c->meta_n_recent++;
    c->meta_off += (bytes + META_ALIGN - 1) / META_ALIGN * META_ALIGN;
    return d;
}

float *tdm_cuda_scratch(tdm_cuda *c, size_t n, tdm_err *err) {
    if (n <= c->scratch_cap) return c->scratch_d;
    size_t cap = n < 65536 ? 65536 : n * 2;
    void *p = NULL;
    cudaError_t e = cudaFree(c->scratch_d);
    c->scratch_d = NULL;
    c->scratch_cap = 0;
    if (e == cudaSuccess) e = cudaMalloc(&p, cap * sizeof(float));
    if (e != cudaSuccess) {
        tdm_cuda_status(e, "attention scratch", err);
        return NULL;
    }
    c->scratch_d = (float *)p;
    c->scratch_cap = cap;
    return c->scratch_d;
}

tandem_status tdm_cuda_check_weight(const tdm_weight *w, const char *op, tdm_err *err) {
    if (!w) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: NULL weight", op);
    switch (w->type) {
    case TDM_F32: case TDM_F16: case TDM_BF16: case TDM_Q8_0: case TDM_Q4_0:
    case TDM_Q4_1: case TDM_Q5_0: case TDM_Q5_1: case TDM_Q2_K: case TDM_Q3_K: case TDM_Q4_K: case TDM_Q5_K:
    case TDM_Q6_K: break;
    case TDM_F8_E4M3:
        if (!w->scale || w->layout != TDM_LAYOUT_ROWS)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: an fp8_e4m3 weight needs its row scales and the rows layout",
                              op);
        break;
    default:
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s: weight type %s is not supported by the CUDA backend",
                          op, tdm_dtype_name(w->type));
    }
    const bool q = w->type == TDM_Q8_0 || w->type == TDM_Q4_0;
    if (w->layout != TDM_LAYOUT_ROWS && !(q && w->layout == TDM_LAYOUT_QSPLIT))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s: the CUDA backend does not read %s weights in layout %u",
                          op, tdm_dtype_name(w->type), (unsigned)w->layout);
    if (w->rows < 0 || w->cols <= 0 || w->cols > INT32_MAX || w->rows > INT32_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: bad weight shape [%lld][%lld]", op,
                          (long long)w->rows, (long long)w->cols);
    if (w->cols % tdm_dtype_block_elems(w->type) != 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: %lld columns are not whole %s blocks", op,
                          (long long)w->cols, tdm_dtype_name(w->type));
    if (w->rows > 0 && !w->data) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: NULL weight data", op);
    return TANDEM_OK;
}

/* Device memory in use now (the whole device: this process's buffers and the CUDA
 * context), remembered as the peak when larger. */
static void note_memory(tdm_cuda *c) {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) != cudaSuccess) {
        cudaGetLastError();
        return;
    }
    if (total - free_b > c->bytes_peak) c->bytes_peak = total - free_b;
}

void *tdm_cuda_buf_get(tdm_cuda *c, tdm_cuda_buf *b, size_t bytes, const char *what, tdm_err *err) {
    if (bytes <= b->cap && b->p) return b->p;
    if (c->capturing) {
        tdm_seterr(err, TANDEM_ERR_BACKEND, "%s: %zu bytes needed during a graph capture", what, bytes);
        return NULL;
    }
    tdm_cuda_buf_free(c, b);
    const size_t cap = TDM_MAX(bytes + bytes / 4, (size_t)1 << 16);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, cap);
    if (e != cudaSuccess) {
        cudaGetLastError();
        tdm_seterr(err, e == cudaErrorMemoryAllocation ? TANDEM_ERR_NOMEM : TANDEM_ERR_BACKEND,
                   "%s: %zu bytes of device memory: %s", what, cap, cudaGetErrorString(e));
        return NULL;
    }
    b->p = p;
    b->cap = cap;
    note_memory(c);
    return p;
}

void tdm_cuda_buf_free(tdm_cuda *c, tdm_cuda_buf *b) {
    if (!b->p) return;
    tdm_cuda_graphs_clear(c); /* (a graph may read it) */
    cudaFree(b->p);
    b->p = NULL;
    b->cap = 0;
}

/* ---- memory -------------------------------------------------------------------- */

static tandem_status cu_alloc(tdm_backend *b, size_t bytes, void **out, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "alloc", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "alloc: NULL out");
    *out = NULL;
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError(); /* clear it */
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "alloc: %zu bytes of device memory: out of memory", bytes);
    }
    TDM_CU(e);
    e = cudaMemsetAsync(p, 0, bytes, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        cudaFree(p);
        return tdm_cuda_status(e, "alloc: zeroing", err);
    }
    note_memory(c);
    *out = p;
    return TANDEM_OK;
}

static void cu_free(tdm_backend *b, void *p) {
    tdm_cuda *c = p ? tdm_cuda_of(b, "free", NULL) : NULL;
    if (!c) return;
    tdm_cuda_graphs_clear(c); /* (a captured graph may read p) */
    cudaFree(p);              /* (waits for work using it) */
}

static size_t cu_mem_peak(tdm_backend *b) {
    tdm_cuda *c = tdm_cuda_of(b, "mem_peak", NULL);
    return c ? c->bytes_peak : 0;
}

/* QSPLIT for quantised weights whose rows stay 16-byte aligned (the row kernels'
 * loads), the rows layout for everything else. */
static uint32_t cu_weight_layout(tdm_backend *b, uint32_t type, int64_t rows, int64_t cols) {
    (void)b;
    if ((type == TDM_Q8_0 || type == TDM_Q4_0) && cols % (8 * TDM_QK) == 0 &&
        tdm_layout_fits(TDM_LAYOUT_QSPLIT, type, rows, cols))
        return TDM_LAYOUT_QSPLIT;
    return TDM_LAYOUT_ROWS;
}

static tandem_status cu_memcpy(tdm_backend *b, void *dst, const void *src, size_t n, cudaMemcpyKind kind,
                               const char *op, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, op, err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (n == 0) return TANDEM_OK;
    if (!dst || !src) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: NULL pointer", op);
    TDM_CU(cudaMemcpyAsync(dst, src, n, kind, c->stream));
    TDM_CU(cudaStreamSynchronize(c->stream));
    return TANDEM_OK;
}

static tandem_status cu_upload(tdm_backend *b, void *dst, const void *src, size_t n, tdm_err *err) {
    return cu_memcpy(b, dst, src, n, cudaMemcpyHostToDevice, "upload", err);
}
static tandem_status cu_download(tdm_backend *b, void *dst, const void *src, size_t n, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "download", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (n > 0 && n <= TDM_CUDA_DL_PINNED && dst && src && !c->dl_off) {
        if (!c->dl_h && cudaMallocHost(&c->dl_h, TDM_CUDA_DL_PINNED) != cudaSuccess) {
            (void)cudaGetLastError(); /* (not sticky: the direct copy below) */
            c->dl_h = NULL;
            c->dl_off = true;
        }
        if (c->dl_h) {
            TDM_CU(cudaMemcpyAsync(c->dl_h, src, n, cudaMemcpyDeviceToHost, c->stream));
            TDM_CU(cudaStreamSynchronize(c->stream));
            memcpy(dst, c->dl_h, n);
            return TANDEM_OK;
        }
    }
    return cu_memcpy(b, dst, src, n, cudaMemcpyDeviceToHost, "download", err);
}
static tandem_status cu_copy(tdm_backend *b, void *dst, const void *src, size_t n, tdm_err *err) {
    return cu_memcpy(b, dst, src, n, cudaMemcpyDeviceToDevice, "copy", err);
}

static tandem_status cu_sync(tdm_backend *b, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "sync", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    TDM_CU(cudaStreamSynchronize(c->stream));
    return TANDEM_OK;
}

static void cu_destroy(tdm_backend *b) {
    if (!b) return;
    tdm_cuda *c = (tdm_cuda *)b->impl;
    if (c) {
        cudaSetDevice(c->device);
        if (c->stream) cudaStreamSynchronize(c->stream);
        cudaFree(c->meta_d);
        cudaFreeHost(c->meta_h);
        cudaFreeHost(c->dl_h);
        cudaFree(c->scratch_d);
        tdm_cuda_prof_report(c);
        tdm_cuda_graphs_free(c);
        tdm_cuda_gemm_destroy(c);
        tdm_cuda_moe_free(c);
        tdm_cuda_buf *bufs[] = {&c->xq_buf, &c->x16_buf, &c->wdeq_buf, &c->fwd_buf, &c->ids_buf, &c->att_buf, &c->topk_buf, &c->tree_buf,
                                &c->moe_buf, &c->f8x_buf, &c->f8d_buf};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) tdm_cuda_buf_free(c, bufs[i]);
        if (c->stream) cudaStreamDestroy(c->stream);
        free(c);
    }
    free(b);
}

/* The backend's device current for this thread (tensor parallelism drives several
 * from one thread). */
static tandem_status cu_make_current(tdm_backend *b, tdm_err *err) {
    tdm_cuda *c = (tdm_cuda *)b->impl;
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur == c->device) return TANDEM_OK;
    TDM_CU(cudaSetDevice(c->device));
    return TANDEM_OK;
}

static const tdm_backend_ops cuda_ops_table = {
    /* .name = */ "cuda",
    /* .destroy = */ cu_destroy,
    /* .alloc = */ cu_alloc,
    /* .free = */ cu_free,
    /* .upload = */ cu_upload,
    /* .download = */ cu_download,
    /* .copy = */ cu_copy,
    /* .get_rows = */ tdm_cuda_get_rows,
    /* .rmsnorm = */ tdm_cuda_rmsnorm,
    /* .weight_layout = */ cu_weight_layout,
    /* .matmul = */ tdm_cuda_matmul,
    /* .add_bias = */ tdm_cuda_add_bias,
    /* .rope = */ tdm_cuda_rope,
    /* .kv_write = */ tdm_cuda_kv_write,
    /* .attention = */ tdm_cuda_attention,
    /* .swiglu = */ tdm_cuda_swiglu,
    /* .gather_rows = */ tdm_cuda_gather_rows,
    /* .qhead_logits = */ NULL,
    /* .head_argmax = */ NULL,
    /* .blocks = */ tdm_cuda_blocks,
    /* .sync = */ cu_sync,
    /* .argmax = */ tdm_cuda_argmax,
    /* .mem_peak = */ cu_mem_peak,
    /* .get_rows_dev = */ tdm_cuda_get_rows_dev,
    /* .argmax_dev = */ tdm_cuda_argmax_dev,
    /* .probs_dev = */ tdm_cuda_probs_dev,
    /* .sample_dev = */ tdm_cuda_sample_dev,
    /* .accept_dev = */ tdm_cuda_accept_dev,
    /* .head_rmsnorm = */ tdm_cuda_head_rmsnorm,
    /* .geglu = */ tdm_cuda_geglu,
    /* .add = */ tdm_cuda_add,
    /* .scale = */ tdm_cuda_scale,
    /* .softcap = */ tdm_cuda_softcap,
    /* .kv_move = */ tdm_cuda_kv_move,
    /* .make_current = */ cu_make_current,
    /* .topk = */ tdm_cuda_topk,
    /* .tree_grow = */ tdm_cuda_tree_grow,
    /* .moe_experts = */ tdm_cuda_moe_experts,
    /* .scatter_cols = */ tdm_cuda_scatter_cols,
    /* .mask_rows = */ tdm_cuda_mask_rows,
    /* .edit_rows = */ tdm_cuda_edit_rows,
    /* .row_top = */ tdm_cuda_row_top,
    /* .moe_route = */ tdm_cuda_moe_route,
    /* .host_for = */ NULL, /* (the step's host work runs on the stepping thread) */
};

tdm_cuda *tdm_cuda_of(tdm_backend *b, const char *op, tdm_err *err) {
    if (!b || b->ops != &cuda_ops_table || !b->impl) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: not a CUDA backend", op);
        return NULL;
    }
    return (tdm_cuda *)b->impl;
}

extern "C" tandem_status tdm_backend_cuda_create(int32_t device, tdm_backend **out, tdm_err *err) {
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "cuda backend: NULL out");
    *out = NULL;
    if (tandem_status st = tdm_diag_check(err)) return st;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return tdm_seterr(err, TANDEM_ERR_BACKEND, "cuda backend: no CUDA device (%s)",
                          e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    if (device < 0 || device >= count)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "cuda backend: device %d of %d", (int)device, count);
    TDM_CU(cudaSetDevice(device));
    cudaDeviceProp prop;
    TDM_CU(cudaGetDeviceProperties(&prop, device));
    if (prop.major < 7)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "cuda backend: %s has compute capability %d.%d (7.0+)",
                          prop.name, prop.major, prop.minor);
    tdm_cuda *c = (tdm_cuda *)calloc(1, sizeof *c);
    tdm_backend *b = (tdm_backend *)calloc(1, sizeof *b);
    if (!c || !b) {
        free(c);
        free(b);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "cuda backend: out of memory");
    }
    c->device = device;
    c->n_sm = prop.multiProcessorCount;
    /* programmatic dependent launch (cuda_internal.h): Hopper and later */
    tdm_cuda_pdl = prop.major >= 9;
    c->smem_optin = prop.sharedMemPerBlockOptin;
    snprintf(c->name, sizeof c->name, "cuda:%d (%.64s)", (int)device, prop.name);
    b->ops = &cuda_ops_table;
    b->impl = c;
    b->n_threads = 1;
    b->int8_dot = false;
    b->host_memory = false;
    b->invariant_rows = TDM_CUDA_GEMV_MAX_ROWS;
    b->attn_window_softcap = true; /* (the tiled kernels; the flash kernels decline them) */
    b->any_layout = true;
    b->kv_type = TDM_F16;
    e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        cu_destroy(b);
        return tdm_cuda_status(e, "stream", err);
    }
    *out = b;
    return TANDEM_OK;
}

extern "C" void tdm_backend_cuda_graph_stats(tdm_backend *b, uint64_t *replays, uint64_t *captures) {
    tdm_cuda *c = tdm_cuda_of(b, "graph_stats", NULL);
    *replays = *captures = 0;
    if (c) tdm_cuda_graph_stats(c, replays, captures);
}

extern "C" void tdm_backend_cuda_force_matmul(tdm_backend *b, int path) {
    tdm_cuda *c = tdm_cuda_of(b, "force_matmul", NULL);
    if (c) c->force_mm = path;
}

extern "C" void tdm_backend_cuda_force_attention(tdm_backend *b, tdm_cuda_attn_path path) {
    tdm_cuda *c = tdm_cuda_of(b, "force_attention", NULL);
    if (c) c->attn_path = path;
}
