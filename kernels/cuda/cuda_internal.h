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

typedef struct cublasContext *cublasHandle_t; /* (cublas_v2.h, included where used) */
typedef struct tdm_cuda_graphs tdm_cuda_graphs; /* cuda_graph.cu */
typedef struct tdm_cuda_prof tdm_cuda_prof;     /* cuda_prof.cu */

extern "C" {
#include "backend.h"
#include "diag.h"
#include "liblog.h"
}

/* A grown-on-demand device buffer (tdm_cuda_buf_get). */
typedef struct tdm_cuda_buf {
    void *p;
    size_t cap;
} tdm_cuda_buf;

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
    int n_sm;            /* multiprocessors */
    size_t smem_optin;   /* most dynamic shared memory a block may ask for */
    /* cuBLAS (cuda_gemm.cu): created at the first many-row matmul */
    cublasHandle_t cublas;
    void *cublas_ws;     /* its workspace (fixed, so GEMMs can be captured in graphs) */
    void *cublaslt;      /* cublasLtHandle_t for the FP8 products (cuda_gemm.cu), the same
                            workspace; created at the first */
    int fp8_outer;       /* whether cuBLASLt scales FP8 products by row vectors here: 0 not
                            asked yet, 1 yes, -1 no (a separate scaling pass then) */
    /* grown-on-demand device buffers of the matmul paths (tdm_cuda_buf) */
    tdm_cuda_buf xq_buf, x16_buf, wdeq_buf, fwd_buf, ids_buf, att_buf, topk_buf, tree_buf, moe_buf;
    tdm_cuda_buf f8x_buf, f8d_buf; /* FP8 products: x as E4M3 rows + scales; unscaled sums */
    tdm_cuda_graphs *graphs; /* captured forward passes (cuda_graph.cu) */
    void *dl_h;          /* pinned staging of small downloads [TDM_CUDA_DL_PINNED] (NULL until
                            the first; dl_off: its allocation failed, downloads go direct) */
    bool dl_off;
    tdm_cuda_prof *prof;     /* stage times (cuda_prof.cu), with TANDEM_CUDA_PROFILE=1 */
    int force_mm;        /* benchmarks (tdm_backend_cuda_force_matmul): 0 = pick by rows,
                            1 = the row kernels (up to 64 rows), 2 = cuBLAS, 3 = pick by
                            rows, Q4_K / Q5_K / Q6_K rows on the f32 reference kernel */
    tdm_cuda_attn_path attn_path; /* tests (tdm_backend_cuda_force_attention): the
                                     attention kernels taken; TDM_CUDA_ATTN_AUTO */
    struct tdm_cuda_moe_tabs *moe_tabs; /* the experts' weight tables on the device
                                           (cuda_moe.cu), kept for graphs */
    bool capturing;      /* a stream capture is in progress: no synchronisation, no
                            allocation (ops that would need one fail instead) */
    size_t bytes_peak;   /* the most device memory in use seen after an allocation (the
                            whole device, as cudaMemGetInfo reports it) */
} tdm_cuda;

/* The backend's state, or NULL with err set when b is not a CUDA backend. */
tdm_cuda *tdm_cuda_of(tdm_backend *b, const char *op, tdm_err *err);

/* TANDEM_OK, or TANDEM_ERR_BACKEND naming what failed and CUDA's message. */
tandem_status tdm_cuda_status(cudaError_t e, const char *what, tdm_err *err);
/* Downloads up to this many bytes (ids, a device-grown tree) go through a pinned
 * buffer: a copy into pageable memory costs the driver its own staging. */
#define TDM_CUDA_DL_PINNED (64 * 1024)

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

/* ---- launches: programmatic dependent launch ------------------------------------
 *
 * Every kernel of the backend is launched through tdm_launch, which on a Hopper GPU
 * sets the programmatic-stream-serialisation attribute: a kernel's thread blocks may
 * be scheduled while the kernel before it in the stream is still finishing, so its
 * launch and ramp-up overlap the tail of the one before (decode and verification
 * forwards are chains of a few hundred short kernels; a graph replays them with
 * these edges too).  To keep stream order exact, every kernel begins with
 * TDM_PDL_ENTRY: it waits there until the kernel before it has completed and its
 * writes are visible (griddepcontrol.wait; nothing is read or written before it),
 * then lets the next kernel be scheduled (griddepcontrol.launch_dependents).  So a
 * kernel still sees exactly what it would see without the attribute, and so does
 * everything after it: results are bit for bit those of plain launches.
 * Before Hopper, plain launches (tdm_cuda_pdl, set when a backend opens). */
extern bool tdm_cuda_pdl;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define TDM_PDL_ENTRY()                                          \
    do {                                                         \
        asm volatile("griddepcontrol.wait;" ::: "memory");       \
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); \
    } while (0)
#else
#define TDM_PDL_ENTRY() \
    do {                \
    } while (0)
#endif
/* kernel<<<grid, block, smem, stream>>>(args...), with the attribute when
 * tdm_cuda_pdl; the launch's error is left for TDM_CU_LAUNCHED (cudaGetLastError). */
template <typename... P, typename... A>
static inline void tdm_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                              A &&...args) {
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = at;
    cfg.numAttrs = tdm_cuda_pdl ? 1 : 0;
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<A &&>(args)...);
}

/* Room for `bytes` of metadata in the ring's host half (valid until the matching
 * tdm_cuda_meta_upload), NULL with err set on failure. */
void *tdm_cuda_meta_host(tdm_cuda *c, size_t bytes, tdm_err *err);
/* Queues the copy of those `bytes` to the device and returns their device address,
 * for the kernels enqueued next (NULL with err set on failure).  Does not wait. */
void *tdm_cuda_meta_upload(tdm_cuda *c, size_t bytes, tdm_err *err);
/* Device scratch of at least n floats (attention scores), NULL with err set. */
float *tdm_cuda_scratch(tdm_cuda *c, size_t n, tdm_err *err);

/* Checks a weight for the ops that read it (shape, type, data, layout: rows, or
 * QSPLIT for Q8_0 / Q4_0). */
tandem_status tdm_cuda_check_weight(const tdm_weight *w, const char *op, tdm_err *err);

/* A device buffer of at least `bytes` (grown, contents lost, when smaller; never
 * during a capture), NULL with err set on failure. */
void *tdm_cuda_buf_get(tdm_cuda *c, tdm_cuda_buf *b, size_t bytes, const char *what, tdm_err *err);
void tdm_cuda_buf_free(tdm_cuda *c, tdm_cuda_buf *b);

/* ---- matrix products (cuda_gemv.cu, cuda_gemm.cu, cuda_quant.cu) ---------------- */

/* Rows up to which a matmul streams W once with the row-by-row kernels (batch
 * invariant: an output row is computed by the same operations whatever the other
 * rows); larger batches go through cuBLAS on tensor cores.  Decode and every
 * verification (at most TDM_CTRL_MAX_K + 1 rows) stay below it, so a speculative
 * step computes each row exactly as a target-only step does. */
#define TDM_CUDA_GEMV_MAX_ROWS 16
/* A forward whose rows need not be computed as alone (tdm_batch.rows_shared) takes
 * the row kernels up to this many rows and cuBLAS above (the measured crossover:
 * bench/RESULTS.md). */
#define TDM_CUDA_SHARED_ROWS 4
#define TDM_CUDA_GEMV_FORCED_MAX_ROWS 64 /* (when a benchmark forces the row kernels) */
/* Rows up to which a token-tree batch of the target (not rows_shared: a
 * verification, whose rows must be computed as each alone) stays on the row
 * kernels in the fused forward: a tree of up to TDM_TREE_MAX_NODES - 1 nodes and its
 * root. */
#define TDM_CUDA_TREE_MAX_ROWS 64
/* Rows up to which the fused forward of a batch is captured into a CUDA graph
 * (cuda_blocks.cu): decode, verification, token trees, draft tree levels. */
#define TDM_CUDA_GRAPH_MAX_ROWS 64

/* x quantised for the Q8_0 / Q4_0 / K-quant kernels, per row and 32-element block:
 * q[n][cols] int8 = round(x / d), d[n][cols / 32] = max |x| / 127, qs[n][cols / 32]
 * = sum of the block's q.  One device buffer: q, then d, then qs. */
typedef struct tdm_cuda_xq {
    const int8_t *q;
    const float *d;
    const int32_t *qs;
} tdm_cuda_xq;
/* Bytes of the quantised copy of n rows of cols, and its parts within a buffer. */
size_t tdm_cuda_xq_bytes(int32_t n, int32_t cols);
tdm_cuda_xq tdm_cuda_xq_at(void *buf, int32_t n, int32_t cols);

/* What a matmul does with its result: y = v, y += v, or (w = [gate; up], 2 * rows
 * outputs) y[i][j] = silu(gate_j) * up_j. */
typedef enum tdm_gemv_epi { TDM_EPI_STORE, TDM_EPI_ACCUM, TDM_EPI_SWIGLU } tdm_gemv_epi;

/* True when the row kernels read w fast (16-byte loads): f16 / bf16 rows with cols
 * a multiple of 8, QSPLIT Q8_0 / Q4_0 whose rows are 16-byte aligned, or rows of
 * the other quantised types (Q4_1 .. Q6_K: dequantised 16 elements at a time). */
bool tdm_cuda_gemv_fast(const tdm_weight *w);
/* Whether the row kernels read w's input quantised (tdm_cuda_xq: QSPLIT Q8_0 / Q4_0,
 * and Q4_K / Q5_K / Q6_K rows unless the dequantising reference kernel is forced,
 * force_mm 3) rather than f32.  w must be tdm_cuda_gemv_fast. */
bool tdm_cuda_gemv_reads_xq(const tdm_cuda *c, const tdm_weight *w);
/* y[n][ldy] (+)= x[n][w->cols] W^T with the row kernels, n <= TDM_CUDA_GEMV_MAX_ROWS
 * (more rows run in tiles of 8).  Weights that tdm_cuda_gemv_reads_xq read xq (x
 * quantised, f32 x unused); the others read x.  w must be tdm_cuda_gemv_fast. */
tandem_status tdm_cuda_gemv(tdm_cuda *c, const tdm_weight *w, const float *x, const tdm_cuda_xq *xq, int32_t n,
                            float *y, int32_t ldy, tdm_gemv_epi epi, tdm_err *err);
/* xq = x[n][cols] quantised (cols a multiple of 32). */
tandem_status tdm_cuda_quantize_x(tdm_cuda *c, const float *x, int32_t n, int32_t cols, const tdm_cuda_xq *xq,
                                  tdm_err *err);
/* The 16-bit type cuBLAS multiplies w in: TDM_BF16 for bf16 weights, else TDM_F16
 * (f16, and quantised weights dequantised to f16); TDM_F32 for f32 weights. */
uint32_t tdm_cuda_gemm_act_type(uint32_t wtype);
/* y[n][w->rows] (+)= x W^T through cuBLAS: xa is x in tdm_cuda_gemm_act_type(w)
 * ([n][w->cols], f16 / bf16, or f32); quantised weights are dequantised to f16 in
 * a scratch buffer first. */
tandem_status tdm_cuda_gemm(tdm_cuda *c, const tdm_weight *w, const void *xa, int32_t n, float *y, bool accumulate,
                            tdm_err *err);
/* out[w->rows][w->cols] f16 = a QSPLIT Q8_0 / Q4_0 weight, or a rows-layout weight
 * of the other quantised types, dequantised (d * q,
 * rounded to f16). */
tandem_status tdm_cuda_dequant_f16(tdm_cuda *c, const tdm_weight *w, void *out, tdm_err *err);
/* out[n][dim] = x converted to type (TDM_F16 / TDM_BF16 / TDM_F32). */
tandem_status tdm_cuda_convert(tdm_cuda *c, const float *x, int64_t count, uint32_t type, void *out, tdm_err *err);
void tdm_cuda_gemm_destroy(tdm_cuda *c);

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
tandem_status tdm_cuda_scatter_cols(tdm_backend *b, const float *x, int32_t n, int32_t nx, const int32_t *ids,
                                    int32_t dim, float fill, float *y, tdm_err *err);
tandem_status tdm_cuda_mask_rows(tdm_backend *b, float *x, int32_t n, int32_t dim, const uint32_t *mask, float fill,
                                 tdm_err *err);
tandem_status tdm_cuda_edit_rows(tdm_backend *b, float *x, int32_t n, int32_t dim, const tdm_logit_edit *edits,
                                 const int32_t *off, tdm_err *err);
tandem_status tdm_cuda_row_top(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t k, const int32_t *want,
                               tdm_row_top *out, tdm_err *err);
/* The ops of the qwen3 / gemma3 blocks (cuda_archops.cu). */
tandem_status tdm_cuda_head_rmsnorm(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                                    int32_t head_dim, const float *gamma, float eps, tdm_err *err);
/* (the same on a backend's state, for the blocks op) */
tandem_status tdm_cuda_head_rmsnorm_on(tdm_cuda *c, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                                       int32_t head_dim, const float *gamma, float eps, tdm_err *err);
tandem_status tdm_cuda_geglu(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff, float *out, tdm_err *err);
tandem_status tdm_cuda_add(tdm_backend *b, float *y, const float *x, int32_t n, int32_t dim, tdm_err *err);
tandem_status tdm_cuda_scale(tdm_backend *b, float *x, int32_t n, int32_t dim, float s, tdm_err *err);
tandem_status tdm_cuda_softcap(tdm_backend *b, float *x, int32_t n, int32_t dim, float cap, tdm_err *err);
tandem_status tdm_cuda_matmul(tdm_backend *b, const tdm_weight *w, const float *x, int32_t n, float *y,
                              bool accumulate, tdm_err *err);
/* The generic matmul kernels (rows layout, any type and shape). */
tandem_status tdm_cuda_matmul_rows(tdm_cuda *c, const tdm_weight *w, const float *x, int32_t n, float *y,
                                   bool accumulate, tdm_err *err);
/* The attention op on a backend's state (tdm_cuda_attention's body). */
tandem_status tdm_cuda_attention_on(tdm_cuda *c, const tdm_attn_args *a, tdm_err *err);
/* The topk op (cuda_rowops.cu), and its kernel alone: ids / probs in device memory,
 * queued. */
tandem_status tdm_cuda_topk(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t k, int32_t *ids,
                            float *probs, tdm_err *err);
tandem_status tdm_cuda_topk_dev(tdm_cuda *c, const float *x, int32_t n, int32_t dim, int32_t k, int32_t *ids,
                                float *probs, tdm_err *err);
/* The tree_grow op (cuda_tree_grow.cu). */
tandem_status tdm_cuda_tree_grow(tdm_backend *b, tdm_dtree *t, const float *x, int32_t n, int32_t dim, int32_t k,
                                 int32_t depth, int32_t width, int32_t want_exp, tdm_err *err);
/* Mixture-of-experts layers (cuda_moe.cu): the moe_route and moe_experts ops. */
tandem_status tdm_cuda_moe_route(tdm_backend *b, const float *logits, int32_t n, int32_t n_expert, int32_t k,
                                 int32_t *ids, float *w, tdm_err *err);
tandem_status tdm_cuda_moe_experts(tdm_backend *b, const tdm_moe_args *a, tdm_err *err);
/* The fused forward's mixture-of-experts FFN (cuda_blocks.cu): each row of the
 * router's logits[n][n_expert] routed into ids / w ([n][k] device buffers), then
 * x[n][n_embd] += the experts' weighted outputs for the normed rows xb, as the two
 * ops compute them; launches only (no host wait, no allocation once the buffers
 * have grown: capturable). */
tandem_status tdm_cuda_moe_ffn(tdm_cuda *c, const tdm_weight *w13, const tdm_weight *w2, const float *xb,
                               const float *logits, int32_t n, int32_t n_embd, int32_t n_ff, int32_t n_expert,
                               int32_t k, int32_t *ids, float *w, float *x, tdm_err *err);
void tdm_cuda_moe_free(tdm_cuda *c);
tandem_status tdm_cuda_kv_write(tdm_backend *b, const tdm_kv_write_args *a, tdm_err *err);
tandem_status tdm_cuda_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *err);
/* Whether the tiled kernels (cuda_flash.cu) take the batches of the shapes they run:
 * yes, unless a test forced TDM_CUDA_ATTN_SCORES (then the scores and softmax
 * kernels of cuda_attention.cu serve every batch, tree masks as extra slots, and the
 * fused forward is not captured into graphs: a reference path for tests, exact
 * against itself as the tiled kernels are against themselves). */
bool tdm_cuda_flash_enabled(const tdm_cuda *c);
/* The kv_move op (cuda_kv_move.cu): one kernel for every pair, layer and kv head. */
tandem_status tdm_cuda_kv_move(tdm_backend *b, const tdm_kv_move_args *a, tdm_err *err);
tandem_status tdm_cuda_blocks(tdm_backend *b, const tdm_blocks_args *a, tdm_err *err);
tandem_status tdm_cuda_argmax(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t *ids, tdm_err *err);
/* Device sampling (cuda_sample.cu); accept_dev takes chains of up to this many. */
#define TDM_CUDA_ACCEPT_MAX_K 32
tandem_status tdm_cuda_probs_dev(tdm_backend *b, const float *logits, int32_t n, int32_t dim,
                                 const tdm_sampler_params *sp, float *probs, int32_t *ok, tdm_err *err);
tandem_status tdm_cuda_sample_dev(tdm_backend *b, const float *probs, int32_t n, int32_t dim, const double *u,
                                  int32_t *ids, float *pmax, tdm_err *err);
tandem_status tdm_cuda_accept_dev(tdm_backend *b, const float *p, const float *q, int32_t n_q, const int32_t *draft,
                                  int32_t k, int32_t dim, const double *u, int32_t *out, tdm_err *err);
tandem_status tdm_cuda_get_rows_dev(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n, float *out,
                                    tdm_err *err);
tandem_status tdm_cuda_argmax_dev(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t *ids, float *top,
                                  tdm_err *err);

/* Threads per block of the row kernels. */
#define TDM_CUDA_THREADS 256

#endif
