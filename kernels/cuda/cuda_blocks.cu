/* cuda_blocks.cu - the `blocks` op on the GPU: every transformer block of a
 * forward pass with fused kernels, the batch metadata uploaded once per forward,
 * and (for decode and verification batches) the whole sequence of launches
 * captured once per batch shape into a CUDA graph and replayed.
 *
 * Per block, for a batch of n rows:
 *   n <= TDM_CUDA_GEMV_MAX_ROWS (decode, verification; a token tree's verification
 *   up to TDM_CUDA_TREE_MAX_ROWS; rows_shared batches up to TDM_CUDA_SHARED_ROWS): the row kernels
 *     (cuda_gemv.cu), which read each weight once and give each row the same
 *     result whatever else is in the batch:
 *       rmsnorm -> [int8 blocks] -> Wqkv -> bias + RoPE + K/V write -> attention
 *       -> [int8] -> x += Wo att -> rmsnorm -> [int8] -> silu(gate) * up (one
 *       kernel with W13) -> [int8] -> x += W2 ff
 *   more rows (prefill chunks): cuBLAS with the activations in the weight's
 *     16-bit type:
 *       rmsnorm -> f16 -> Wqkv -> RoPE + K/V -> attention -> f16 -> x += Wo att
 *       -> rmsnorm -> f16 -> W13 -> SwiGLU -> f16 -> x += W2 ff
 * A mixture-of-experts layer's FFN half: rmsnorm -> the router's product -> routing
 * and the grouped expert products of cuda_moe.cu, whose sum x += (the same kernels
 * as its ops, for every batch: each row computed as alone).
 * Attention is tdm_cuda_flash (cuda_flash.cu) for an f16, q8_0 or fp8 cache and the head dims it
 * knows, token-tree batches (a tree mask per row) included; batches with CSR extra
 * slots or other shapes use the op table's attention (not captured in graphs).  qwen3's q / k head norms run
 * between Wqkv and RoPE; the gemma3 blocks (post norms, GeGLU, sliding windows,
 * soft-capping) are declined: they run op by op.
 *
 * Graphs: a batch of at most TDM_CUDA_GRAPH_MAX_ROWS rows whose shape (rows and
 * product path, tiles, attention splits rounded up to a power of two, buffers,
 * weights) is seen a second time is captured and then replayed (cuBLAS products
 * too: its workspace is fixed, cuda_gemm.cu).  Its
 * kernels read the batch metadata from one fixed device buffer, which the host
 * fills (through a pinned buffer) before each replay.  TANDEM_CUDA_GRAPHS=0 turns
 * graphs off.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_fused.h"
#include "cuda_graph.h"
#include "cuda_prof.h"

/* ---- buffers ----------------------------------------------------------------- */

/* Where the pieces of one forward live inside c->fwd_buf. */
typedef struct fwd_layout {
    float *xb;       /* [n][wide] f32 activations (normed rows, attention output) */
    void *a16;       /* [n][wide] 16-bit activations for cuBLAS */
    float *qkv;      /* [n][qkv_w] */
    float *att;      /* [n][qd] */
    float *gu;       /* [n][2 ff] */
    float *ff;       /* [n][ff] */
    void *xq;        /* tdm_cuda_xq_bytes(n, wide) */
    float2 *cs;      /* [n][n_rot / 2] RoPE cos / sin */
    float *part;     /* attention partials */
    float *moe_logits; /* [n][n_expert] a mixture of experts' router logits */
    int32_t *moe_ids;  /* [n][n_expert_used] each row's experts */
    float *moe_w;      /* [n][n_expert_used] and their weights */
    size_t bytes;
} fwd_layout;

static size_t align256(size_t b) { return (b + 255) / 256 * 256; }

static fwd_layout plan_buffers(uint8_t *base, const tdm_blocks_args *a, int32_t n, int32_t n_splits) {
    const int32_t qd = a->n_head * a->head_dim, kvd = a->n_kv_head * a->head_dim, F = a->n_ff, E = a->n_embd;
    const size_t wide = (size_t)TDM_MAX(TDM_MAX(E, qd), F);
    fwd_layout L;
    size_t off = 0;
#define CARVE(field, type, bytes)                                    \
    do {                                                             \
        L.field = (type)(base ? base + off : NULL);                  \
        off += align256(bytes);                                      \
    } while (0)
    CARVE(xb, float *, (size_t)n * wide * 4);
    CARVE(a16, void *, (size_t)n * wide * 2);
    CARVE(qkv, float *, (size_t)n * (qd + 2 * kvd) * 4);
    CARVE(att, float *, (size_t)n * qd * 4);
    CARVE(gu, float *, (size_t)n * 2 * F * 4);
    CARVE(ff, float *, (size_t)n * F * 4);
    CARVE(xq, void *, tdm_cuda_xq_bytes(n, (int32_t)wide));
    CARVE(cs, float2 *, (size_t)n * (a->rope->n_rot / 2) * sizeof(float2));
    CARVE(part, float *, tdm_flash_part_floats(n_splits, n, a->n_head, a->head_dim) * 4);
    CARVE(moe_logits, float *, (size_t)n * a->n_expert * 4);
    CARVE(moe_ids, int32_t *, (size_t)n * a->n_expert_used * 4);
    CARVE(moe_w, float *, (size_t)n * a->n_expert_used * 4);
#undef CARVE
    L.bytes = off;
    return L;
}

/* ---- one matrix product, by the fastest path the weight allows -------------------- */

/* What a product reads: f32 rows, 16-bit rows (cuBLAS), or int8 blocks. */
typedef enum mm_in { IN_F32, IN_16, IN_Q8 } mm_in;

static bool need_xq(const tdm_cuda *c, const tdm_weight *w) {
    return tdm_cuda_gemv_fast(w) && tdm_cuda_gemv_reads_xq(c, w);
}

static bool gemm_ok(const tdm_weight *w) {
    if (w->layout == TDM_LAYOUT_QSPLIT) return true;
    return w->layout == TDM_LAYOUT_ROWS && w->type != TDM_Q8_0 && w->type != TDM_Q4_0; /* (the others: f16) */
}

/* The input kind a weight's product reads on the row path or the cuBLAS path. */
static mm_in in_kind(const tdm_cuda *c, const tdm_weight *w, bool rows_path) {
    if (rows_path) return need_xq(c, w) ? IN_Q8 : IN_F32;
    if (!gemm_ok(w)) return IN_F32;
    return tdm_cuda_gemm_act_type(w->type) == TDM_F32 ? IN_F32 : IN_16;
}

/* The element type a producer writes for that input. */
static uint32_t in_type(const tdm_weight *w, mm_in k) {
    if (k == IN_Q8) return (uint32_t)TDM_Q8_0;
    return k == IN_16 ? tdm_cuda_gemm_act_type(w->type) : (uint32_t)TDM_F32;
}

typedef struct mm_bufs {
    const float *f32;   /* input as f32 */
    const void *a16;    /* input in the weight's 16-bit type */
    tdm_cuda_xq xq;     /* input as int8 blocks */
    float *gu;          /* SwiGLU through a separate product: gate / up rows */
} mm_bufs;

/* y (+)= in W^T (epi), from the input kind in_kind(c, w, rows_path) prepared in b. */
static tandem_status mm(tdm_cuda *c, const tdm_weight *w, bool rows_path, const mm_bufs *b, int32_t n, float *y,
                        int32_t ldy, tdm_gemv_epi epi, tdm_err *err) {
    const mm_in k = in_kind(c, w, rows_path);
    tandem_status st;
    if (rows_path && tdm_cuda_gemv_fast(w)) return tdm_cuda_gemv(c, w, b->f32, &b->xq, n, y, ldy, epi, err);
    float *out = epi == TDM_EPI_SWIGLU ? b->gu : y;
    if (k == IN_16 || (!rows_path && gemm_ok(w)))
        st = tdm_cuda_gemm(c, w, k == IN_16 ? b->a16 : (const void *)b->f32, n, out, epi == TDM_EPI_ACCUM, err);
    else
        st = tdm_cuda_matmul_rows(c, w, b->f32, n, out, epi == TDM_EPI_ACCUM, err);
    if (st || epi != TDM_EPI_SWIGLU) return st;
    return tdm_cuda_swiglu_to(c, b->gu, n, (int32_t)(w->rows / 2), TDM_F32, y, err);
}

/* ---- the forward -------------------------------------------------------------------- */

typedef struct fwd_ctx {
    tdm_cuda *c;
    const tdm_blocks_args *a;
    fwd_layout L;
    tdm_cuda_meta fm;
    const tdm_cuda_row *rows_d;
    const tdm_cuda_tile *tiles_d;
    const int32_t *tabs_d;
    int32_t n_splits;   /* launched (>= the batch's need) */
    int32_t gh;         /* heads per attention block */
    bool rows_path, flash;
} fwd_ctx;

/* Writes the activations a product of w reads (kind k) from f32 rows x[n][dim]:
 * into b (pointing at the layout's buffers). */
static tandem_status prepare_input(const fwd_ctx *f, const tdm_weight *w, const float *x, int32_t dim, mm_bufs *b,
                                   tdm_err *err) {
    const mm_in k = in_kind(f->c, w, f->rows_path);
    const int32_t n = f->fm.n_rows;
    b->f32 = x;
    if (k == IN_Q8) return tdm_cuda_quantize_x(f->c, x, n, dim, &b->xq, err);
    if (k == IN_16) return tdm_cuda_convert(f->c, x, (int64_t)n * dim, in_type(w, k), f->L.a16, err);
    return TANDEM_OK;
}

/* rmsnorm of the residual into what w's product reads. */
static tandem_status norm_for(const fwd_ctx *f, const float *gamma, const tdm_weight *w, mm_bufs *b, tdm_err *err) {
    const tdm_blocks_args *a = f->a;
    const mm_in k = in_kind(f->c, w, f->rows_path);
    b->f32 = f->L.xb;
    void *out = k == IN_16 ? f->L.a16 : (void *)f->L.xb;
    return tdm_cuda_rmsnorm_to(f->c, a->x, gamma, f->fm.n_rows, a->n_embd, a->norm_eps, in_type(w, k), out, &b->xq, err);
}

static tandem_status attention(const fwd_ctx *f, int32_t l, const tdm_weight *wo, mm_bufs *b, tdm_err *err) {
    const tdm_blocks_args *a = f->a;
    const int32_t n = f->fm.n_rows, qd = a->n_head * a->head_dim, qkv_w = qd + 2 * a->n_kv_head * a->head_dim;
    const mm_in k = in_kind(f->c, wo, f->rows_path);
    if (f->flash) {
        tdm_flash_args fa;
        fa.rows = f->rows_d;
        fa.tiles = f->tiles_d;
        fa.tabs = f->tabs_d;
        fa.n_rows = n;
        fa.n_tiles = f->fm.n_tiles;
        fa.n_splits = f->n_splits;
        fa.tile_rows = f->fm.max_tile_rows;
        fa.heads_per_block = f->gh;
        fa.q = f->L.qkv;
        fa.q_stride = qkv_w;
        fa.k_cache = a->k_cache[l];
        fa.v_cache = a->v_cache[l];
        fa.cache_type = a->cache_type;
        fa.n_head = a->n_head;
        fa.n_kv_head = a->n_kv_head;
        fa.head_dim = a->head_dim;
        fa.block_size = a->block_size;
        fa.scale = a->attn_scale;
        fa.part = f->L.part;
        fa.out_type = k == IN_16 ? in_type(wo, k) : (uint32_t)TDM_F32;
        fa.out = k == IN_16 ? f->L.a16 : (void *)f->L.att;
        fa.tree = a->batch->tree;
        tandem_status st = tdm_cuda_flash(f->c, &fa, err);
        if (st) return st;
        b->f32 = f->L.att;
        return k == IN_Q8 ? tdm_cuda_quantize_x(f->c, f->L.att, n, qd, &b->xq, err) : TANDEM_OK;
    }
    tdm_attn_args aa;
    memset(&aa, 0, sizeof aa);
    aa.batch = a->batch;
    aa.seqs = a->seqs;
    aa.q = f->L.qkv;
    aa.q_stride = qkv_w;
    aa.out = f->L.att;
    aa.k_cache = a->k_cache[l];
    aa.v_cache = a->v_cache[l];
    aa.cache_type = a->cache_type;
    aa.n_head = a->n_head;
    aa.n_kv_head = a->n_kv_head;
    aa.head_dim = a->head_dim;
    aa.block_size = a->block_size;
    aa.scale = a->attn_scale;
    tandem_status st = tdm_cuda_attention_on(f->c, &aa, err);
    if (st) return st;
    return prepare_input(f, wo, f->L.att, qd, b, err);
}

static tandem_status run_layers(const fwd_ctx *f, tdm_err *err) {
    const tdm_blocks_args *a = f->a;
    tdm_cuda *c = f->c;
    const int32_t n = f->fm.n_rows, E = a->n_embd, F = a->n_ff;
    const int32_t qd = a->n_head * a->head_dim, qkv_w = qd + 2 * a->n_kv_head * a->head_dim;
    tandem_status st;
    mm_bufs b;
    b.xq = tdm_cuda_xq_at(f->L.xq, n, TDM_MAX(TDM_MAX(E, qd), F));
    b.gu = f->L.gu;
    b.a16 = f->L.a16;
    if ((st = tdm_cuda_rope_table(c, f->rows_d, n, a->rope, f->L.cs, err))) return st;
    for (int32_t l = 0; l < a->n_layer; l++) {
        const tdm_block_weights *W = &a->layers[l];
        tdm_cuda_prof_mark(c, TDM_PROF_NORM);
        if ((st = norm_for(f, W->attn_norm, &W->wqkv, &b, err))) return st;
        tdm_cuda_prof_mark(c, TDM_PROF_QKV);
        if ((st = mm(c, &W->wqkv, f->rows_path, &b, n, f->L.qkv, qkv_w, TDM_EPI_STORE, err))) return st;
        tdm_cuda_prof_mark(c, TDM_PROF_ROPE_KV);
        if (W->q_norm && /* qwen3: each q and k head RMS-normed before RoPE */
            ((st = tdm_cuda_head_rmsnorm_on(c, f->L.qkv, n, qkv_w, a->n_head, a->head_dim, W->q_norm, a->norm_eps,
                                            err)) ||
             (st = tdm_cuda_head_rmsnorm_on(c, f->L.qkv + qd, n, qkv_w, a->n_kv_head, a->head_dim, W->k_norm,
                                            a->norm_eps, err))))
            return st;
        if ((st = tdm_cuda_rope_kv(c, f->L.qkv, n, qkv_w, W->bqkv, a->n_head, a->n_kv_head, a->head_dim, a->rope,
                                   f->L.cs, f->rows_d, a->k_cache[l], a->v_cache[l], a->cache_type, a->block_size, err)))
            return st;
        tdm_cuda_prof_mark(c, TDM_PROF_ATTENTION);
        if ((st = attention(f, l, &W->wo, &b, err))) return st;
        tdm_cuda_prof_mark(c, TDM_PROF_WO);
        if ((st = mm(c, &W->wo, f->rows_path, &b, n, a->x, E, TDM_EPI_ACCUM, err))) return st;
        tdm_cuda_prof_mark(c, TDM_PROF_NORM2);
        if (W->exp_w13) { /* a mixture of experts: the router's product, then cuda_moe.cu */
            if ((st = tdm_cuda_rmsnorm_to(c, a->x, W->ffn_norm, n, E, a->norm_eps, TDM_F32, f->L.xb, NULL, err)) ||
                (st = prepare_input(f, &W->router, f->L.xb, E, &b, err)) ||
                (st = mm(c, &W->router, f->rows_path, &b, n, f->L.moe_logits, a->n_expert, TDM_EPI_STORE, err)))
                return st;
            tdm_cuda_prof_mark(c, TDM_PROF_W13);
            if ((st = tdm_cuda_moe_ffn(c, W->exp_w13, W->exp_w2, f->L.xb, f->L.moe_logits, n, E, F, a->n_expert,
                                       a->n_expert_used, f->L.moe_ids, f->L.moe_w, a->x, err)))
                return st;
            continue;
        }
        if ((st = norm_for(f, W->ffn_norm, &W->w13, &b, err))) return st;
        tdm_cuda_prof_mark(c, TDM_PROF_W13);
        if (f->rows_path) {
            if ((st = mm(c, &W->w13, true, &b, n, f->L.ff, F, TDM_EPI_SWIGLU, err))) return st;
            if ((st = prepare_input(f, &W->w2, f->L.ff, F, &b, err))) return st;
        } else {
            if ((st = mm(c, &W->w13, false, &b, n, f->L.gu, 2 * F, TDM_EPI_STORE, err))) return st;
            const mm_in k2 = in_kind(c, &W->w2, false);
            b.f32 = f->L.ff;
            if ((st = tdm_cuda_swiglu_to(c, f->L.gu, n, F, in_type(&W->w2, k2), k2 == IN_16 ? f->L.a16 : (void *)f->L.ff,
                                         err)))
                return st;
        }
        tdm_cuda_prof_mark(c, TDM_PROF_W2);
        if ((st = mm(c, &W->w2, f->rows_path, &b, n, a->x, E, TDM_EPI_ACCUM, err))) return st;
    }
    return TANDEM_OK;
}

static int32_t pow2_at_least(int32_t v) {
    int32_t p = 1;
    while (p < v) p *= 2;
    return p;
}

tandem_status tdm_cuda_blocks(tdm_backend *be, const tdm_blocks_args *a, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(be, "blocks", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (!a || !a->batch || !a->seqs || !a->layers || !a->k_cache || !a->v_cache || !a->x || !a->rope)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: NULL argument");
    const tdm_batch *bt = a->batch;
    const int32_t n = bt->n_rows;
    if (n <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: %d rows", (int)n);
    if (a->n_head <= 0 || a->n_kv_head <= 0 || a->n_head % a->n_kv_head || a->head_dim <= 0 || a->block_size <= 0 ||
        a->rope->n_rot <= 0 || a->rope->n_rot % 2 || a->rope->n_rot > a->head_dim)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: heads %d / %d, head_dim %d, block_size %d, n_rot %d",
                          (int)a->n_head, (int)a->n_kv_head, (int)a->head_dim, (int)a->block_size, (int)a->rope->n_rot);
    if (!tdm_kv_type_ok(a->cache_type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: cache type %s", tdm_dtype_name(a->cache_type));
    if (a->swa_window || a->attn_softcap != 0 || a->ffn_act != TDM_ACT_SILU || (a->rope_swa && a->rope_swa != a->rope) ||
        (a->layers[0].q_norm && (a->layers[0].bqkv || !a->layers[0].k_norm)) || a->layers[0].attn_post_norm ||
        a->layers[0].ffn_post_norm)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: the gemma3 blocks run op by op");
    if (a->n_expert < 0 || (a->n_expert > 0) != (a->layers[0].exp_w13 != NULL) ||
        (a->n_expert > 0 && (a->n_expert_used <= 0 || a->n_expert_used > a->n_expert)))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: %d of %d experts for layers %s experts",
                          (int)a->n_expert_used, (int)a->n_expert, a->layers[0].exp_w13 ? "with" : "without");
    fwd_ctx f;
    memset(&f, 0, sizeof f);
    f.c = c;
    f.a = a;
    /* the row kernels: batch invariant (a verification's rows computed as each
     * alone, so greedy speculation equals target-only decoding), up to the rows a
     * verification or a token tree's verification has; rows that only propose
     * (rows_shared) take them only while they are the fastest */
    f.rows_path = n <= (bt->rows_shared ? TDM_CUDA_SHARED_ROWS
                                        : bt->tree ? TDM_CUDA_TREE_MAX_ROWS : TDM_CUDA_GEMV_MAX_ROWS);
    f.flash = !bt->extra_off && tdm_flash_supported(a->head_dim, a->block_size, a->cache_type) &&
              tdm_cuda_flash_enabled(c);
    if (bt->tree_mask_dev && !f.flash)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: tree masks in device memory take the flash kernels");
    const int32_t max_q = tdm_flash_max_q(n);
    const int32_t gh = tdm_flash_heads_per_block(c, bt, a->n_head, a->n_kv_head, max_q);
    size_t meta_bytes;
    tandem_status st = tdm_cuda_meta_size(bt, a->seqs, &meta_bytes, err);
    if (st) return st;
    void *mh = tdm_cuda_graph_meta_host(c, meta_bytes, err);
    if (!mh) return err ? err->status : TANDEM_ERR_BACKEND;
    if ((st = tdm_cuda_meta_fill(bt, a->seqs, a->block_size, gh, max_q, mh, &f.fm, err))) return st;
    f.gh = gh;
    const int32_t need_splits = TDM_MAX(1, (f.fm.max_kv + TDM_FLASH_SPLIT - 1) / TDM_FLASH_SPLIT);
    f.n_splits = n <= TDM_CUDA_GRAPH_MAX_ROWS ? pow2_at_least(need_splits) : need_splits; /* (graphs reused) */
    /* the buffers, at their final size before any capture */
    const fwd_layout sz = plan_buffers(NULL, a, n, f.n_splits);
    uint8_t *base = (uint8_t *)tdm_cuda_buf_get(c, &c->fwd_buf, sz.bytes, "forward buffers", err);
    if (!base) return err ? err->status : TANDEM_ERR_BACKEND;
    f.L = plan_buffers(base, a, n, f.n_splits);
    const uint8_t *meta = (const uint8_t *)tdm_cuda_graph_meta_upload(c, f.fm.bytes, err);
    if (!meta) return err ? err->status : TANDEM_ERR_BACKEND;
    tdm_cuda_meta_at(meta, n, &f.rows_d, &f.tiles_d, &f.tabs_d);
    /* a device-grown tree level: its masks replace the host's stand-ins */
    if (bt->tree_mask_dev && (st = tdm_cuda_meta_masks(c, (tdm_cuda_row *)f.rows_d, bt->tree_mask_dev, n, err)))
        return st;
    if (tdm_cuda_prof_on()) { /* stage times: direct, with events between the stages */
        tdm_cuda_prof_begin(c, n, f.rows_path);
        st = run_layers(&f, err);
        tdm_cuda_prof_end(c);
        return st;
    }
    if (n > TDM_CUDA_GRAPH_MAX_ROWS || !f.flash) return run_layers(&f, err);
    /* decode, verification, trees, draft rounds: replay a graph of this shape, or
     * record one */
    const uint64_t key[] = {(uint64_t)n * 2 + (uint64_t)f.rows_path, (uint64_t)f.fm.n_tiles, (uint64_t)f.n_splits,
                            (uint64_t)f.fm.max_tile_rows * 1024 + (uint64_t)gh,
                            (uint64_t)(uintptr_t)a->x, (uint64_t)(uintptr_t)a->layers, (uint64_t)(uintptr_t)a->k_cache[0],
                            (uint64_t)(uintptr_t)base, (uint64_t)(uintptr_t)meta, (uint64_t)a->n_layer,
                            (uint64_t)a->cache_type};
    return tdm_cuda_graph_run(c, key, TDM_ARRAY_LEN(key), (tandem_status(*)(const void *, tdm_err *))run_layers, &f, err);
}
