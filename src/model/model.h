/* model.h - a llama-family model: hyperparameters + weights placed on a backend.
 *
 * Architecture differences are data, not code paths (docs/DESIGN.md,
 * "Architectures"): `llama` (GQA, tied or separate output, GGUF "normal" RoPE with
 * adjacent pairs, Llama 3's rope_freqs), `qwen2` (q/k/v biases, NEOX RoPE), `qwen3`
 * (NEOX RoPE, per-head RMSNorm of q and k) and `gemma3` (scaled embeddings, q/k
 * norms, post-attention and post-FFN norms, GeGLU, interleaved sliding-window and
 * global layers with their own RoPE bases, optional logit soft-capping) run the same
 * forward (forward.c).
 *
 * Weights are fused at load where that saves passes: wqkv = [wq; wk; wv] rows and
 * w13 = [w_gate; w_up] rows, so one matmul reads each.
 */
#ifndef TDM_MODEL_H
#define TDM_MODEL_H

#include "backend.h"
#include "gguf.h"
#include "rope.h"
#include "tokenizer.h"

typedef enum tdm_arch_id {
    TDM_ARCH_LLAMA = 0,
    TDM_ARCH_QWEN2 = 1,
    TDM_ARCH_QWEN3 = 2,
    TDM_ARCH_GEMMA3 = 3,
    TDM_ARCH_QWEN3MOE = 4, /* qwen3 attention, mixture-of-experts FFN */
    TDM_ARCH_EAGLE3 = 5,   /* an EAGLE-3 draft head (eagle3.h): its keys are read as llama's,
                              its tensors by tdm_eagle3_load, never by tdm_model_load */
} tdm_arch_id;

/* Most experts a mixture-of-experts layer may have (llama.cpp's LLAMA_MAX_EXPERTS). */
#define TDM_MAX_EXPERTS 512

typedef struct tdm_hparams {
    char arch[16];          /* "llama", "qwen2", "qwen3", "gemma3", "qwen3moe" (or "eagle3": a
                               draft head, eagle3.h) */
    uint32_t arch_id;       /* tdm_arch_id */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;       /* n_embd / n_head unless key_length says otherwise */
    int32_t n_ff;           /* FFN features; of each expert in a mixture-of-experts model */
    int32_t n_expert;       /* experts per layer (<arch>.expert_count), 0: a dense FFN */
    int32_t n_expert_used;  /* experts each row goes through (<arch>.expert_used_count) */
    float norm_eps;         /* RMSNorm epsilon */
    tdm_rope_params rope;   /* RoPE of the (global) layers; .freq is the model's table, set at
                               load (NULL from tdm_hparams_read alone) */
    tdm_rope_params rope_swa; /* RoPE of the sliding-window layers (gemma3: base 10000, unscaled) */
    tdm_rope_scaling rope_scaling; /* the scaling the metadata gives */
    bool rope_freqs;        /* llama: the file has rope_freqs.weight ([n_rot / 2] divisors) */
    bool qkv_bias;          /* qwen2 */
    bool qk_norm;           /* qwen3, gemma3: blk.N.attn_q_norm / attn_k_norm ([head_dim]) */
    bool post_norms;        /* gemma3: blk.N.post_attention_norm / post_ffw_norm ([n_embd]) */
    uint32_t ffn_act;       /* tdm_ffn_act: SwiGLU, or gemma3's GeGLU */
    float embd_scale;       /* token embeddings multiplied by this (gemma3: sqrt(n_embd); else 1) */
    float attn_scale;       /* attention softmax scale (1 / sqrt(head_dim); gemma3 27B: 1 /
                               sqrt(n_embd / n_head)) */
    float attn_softcap;     /* attention logit soft-capping, 0 = off (gemma3.attn_logit_softcapping) */
    float final_softcap;    /* output logit soft-capping, 0 = off (gemma3.final_logit_softcapping) */
    int32_t swa_window;     /* sliding window of the sliding-window layers, 0 = none */
    int32_t swa_pattern;    /* layer l slides iff l % swa_pattern < swa_pattern - 1 (gemma3: 6) */
    bool tied_output;       /* output projection = token embedding */
} tdm_hparams;

/* Whether layer l attends within the sliding window (and uses rope_swa). */
static inline bool tdm_hparams_layer_swa(const tdm_hparams *hp, int32_t l) {
    return hp->swa_window > 0 && hp->swa_pattern > 0 && l % hp->swa_pattern < hp->swa_pattern - 1;
}

/* Whether the model's attention needs a backend with attn_window_softcap. */
static inline bool tdm_hparams_attn_ext(const tdm_hparams *hp) { return hp->swa_window > 0 || hp->attn_softcap > 0; }

/* The weights of one block (the backend's description of them). */
typedef tdm_block_weights tdm_layer;

/* A load's options: its progress hook (tandem_model_params' progress_callback):
 * fn(base + scale * done, user), done the fraction of this model's tensors placed so
 * far; fn returning false ends the load with TANDEM_ERR_CANCELLED (fn NULL: none); and
 * how the weights are kept. */
typedef struct tdm_load_opts {
    bool (*fn)(float progress, void *user);
    void *user;
    float base, scale;
    bool fp8; /* the blocks' dense F16 / BF16 / F32 / Q8_0 weights made FP8 E4M3 with
                 per-row scales (tandem_model_params.weights) */
} tdm_load_opts;

typedef struct tdm_model {
    tdm_gguf *gguf;
    tdm_tokenizer *tok;
    tdm_hparams hp;
    tdm_backend *be;        /* owns the weight memory */
    tdm_weight tok_embd;    /* [n_vocab][n_embd] */
    const float *out_norm;  /* [n_embd] */
    tdm_weight output;      /* [n_vocab][n_embd] (== tok_embd when tied) */
    tdm_layer *layers;      /* [n_layer] */
    tdm_weight *experts;    /* [n_layer][2][n_expert]: each layer's experts' w13 ([2*n_ff][n_embd]),
                               then their w2 ([n_embd][n_ff]) (layers point into it); NULL: dense */
    tdm_qhead qhead;        /* output's row-quantised copy (backend memory), when has_qhead */
    bool has_qhead;         /* built at load on backends with int8 dot products */
    void **owned;           /* backend buffers to free */
    int32_t n_owned, cap_owned;
    uint64_t n_params;
    uint64_t weight_bytes;
    char name[128];         /* general.name, or "" */
    char file[128];         /* the file's base name, or "" (loaded from an opened GGUF) */
    /* Tensor parallelism (tp.h): a rank of a split model holds its part of the
     * weights, hp is its shape (its heads, KV heads, FFN features) and hp_full the
     * whole model's. */
    int32_t tp_rank, tp_size;  /* rank of a split model, and how many (tp_size 0: whole) */
    int32_t vocab0;            /* output's rows are the vocabulary [vocab0, vocab0 + output.rows) */
    tdm_hparams hp_full;       /* == hp when whole */
    struct tdm_tp_group *tp;   /* rank 0 of a split model: its group (tp.h); else NULL */
    const tdm_load_opts *load_opts; /* while loading: its options (NULL: the defaults) */
    bool fp8;               /* the blocks' dense weights were made FP8 at load */
    uint64_t n_found;          /* while loading: tensors found so far (the progress) */
} tdm_model;

/* How messages name the model: its file's base name, else general.name, else "unnamed". */
const char *tdm_model_label(const tdm_model *m);

/* Loads rank `rank` of `n` of a split model (tp.h) from an opened GGUF (ownership of
 * g passes to the model, also on failure): rank < 0 loads the whole model.  pr (may be
 * NULL: the defaults) carries the options, its hook hears of the progress and may cancel. */
tandem_status tdm_model_load_rank(tdm_gguf *g, tdm_backend *be, int32_t rank, int32_t n, const tdm_load_opts *pr,
                                  tdm_model **out, tdm_err *err);
/* Loads a model from a GGUF file onto a backend (the model keeps `be` but does not
 * own it: the caller destroys it after the model). */
tandem_status tdm_model_load(const char *path, tdm_backend *be, tdm_model **out, tdm_err *err);
/* The same with load options (pr may be NULL: the defaults). */
tandem_status tdm_model_load_opts(const char *path, tdm_backend *be, const tdm_load_opts *pr,
                                      tdm_model **out, tdm_err *err);
/* The same from an already opened GGUF (ownership of g passes to the model, also
 * on failure). */
tandem_status tdm_model_load_gguf(tdm_gguf *g, tdm_backend *be, tdm_model **out, tdm_err *err);
void tdm_model_free(tdm_model *m);

/* Weight placement for files that are not a whole model (an EAGLE-3 head, eagle3.c),
 * on a model shell m whose gguf, be and hp are set (tensors found through m->gguf;
 * every size checked against the file; memory owned by m, freed by tdm_model_free):
 * load_mat: the matrix `name` [rows][cols] (GGUF ne = {cols, rows}) as it is;
 * load_vec: the 1-D `name` [n] converted to f32 (optional: absent leaves *out NULL);
 * place: the rows-layout bytes at host memory src (owned by the caller) as weight w of
 *   type/rows/cols (w->type, rows, cols, row_bytes set by the caller);
 * load_rope: m->hp.rope's table (rope_freqs.weight when hp.rope_freqs). */
tandem_status tdm_model_load_mat(tdm_model *m, const char *name, int64_t cols, int64_t rows, bool matmul_only,
                                 tdm_weight *w, tdm_err *err);
tandem_status tdm_model_load_vec(tdm_model *m, const char *name, int64_t n, bool optional, const float **out,
                                 tdm_err *err);
tandem_status tdm_model_place(tdm_model *m, const void *src, bool matmul_only, tdm_weight *w, tdm_err *err);
tandem_status tdm_model_load_rope(tdm_model *m, tdm_err *err);
/* Backend memory owned by m (freed with it). */
tandem_status tdm_model_alloc(tdm_model *m, size_t bytes, void **out, tdm_err *err);

/* Reads and validates hyperparameters from metadata (src/model/hparams.c; no weights). */
tandem_status tdm_hparams_read(const tdm_gguf *g, tdm_hparams *hp, tdm_err *err);
/* TANDEM_ERR_UNSUPPORTED, naming the model, the backend and what it lacks, when be
 * cannot run the model's forward (sliding-window attention or soft-capping on a
 * backend whose attention has neither, a missing op); else TANDEM_OK. */
tandem_status tdm_model_check_backend(const tdm_model *m, const tdm_backend *be, tdm_err *err);

/* ------------------------------------------------------------ KV storage */

/* One model's K/V storage for all blocks of a pool (see kv_cache.h). */
typedef struct tdm_kv_store {
    tdm_backend *be;
    uint32_t type;          /* TDM_F32, TDM_F16, TDM_Q8_0 or TDM_F8_E4M3 (src/base/kv_layout.h) */
    int32_t n_layer, n_kv_head, head_dim, block_size, n_blocks;
    void **k;               /* [n_layer] -> [n_blocks][n_kv_head] units of K: [head_dim][block_size]
                               values (q8_0: int8, then per-slot f32 scales; kv_layout.h) */
    void **v;               /* [n_layer] -> [n_blocks][n_kv_head] units of V: [block_size][head_dim]
                               values (q8_0: the same) */
    struct tdm_kv_store *tp_next; /* a split model's next rank's storage (its KV heads of the
                                     same blocks), or NULL; owned, freed with this one */
} tdm_kv_store;

tdm_kv_layout tdm_model_kv_layout(const tdm_model *m, uint32_t type);
/* K and V bytes per position of a model's cache with blocks of block_size slots
 * (every layer; q8_0's padding shared out over the block's slots). */
uint64_t tdm_kv_bytes_per_token(const tdm_kv_layout *l, int32_t block_size);
/* A split model's storage is a chain, one store per rank (tp_next), each on the
 * rank's compute backend (tdm_tp_rank_be; be for rank 0); copies and moves apply
 * to every rank. */
tandem_status tdm_kv_store_init(tdm_kv_store *s, const tdm_model *m, tdm_backend *be, uint32_t type,
                                int32_t n_blocks, int32_t block_size, tdm_err *err);
void tdm_kv_store_free(tdm_kv_store *s);
/* Copies one block (all layers, K and V). */
tandem_status tdm_kv_store_copy_block(tdm_kv_store *s, int32_t src, int32_t dst, tdm_err *err);
/* Copies slots src[i] -> dst[i] (i < n) of seq in every layer (tdm_kv_move_args: no
 * dst is another pair's src; every slot below seq->len): the backend's kv_move,
 * else direct copies on host memory, else the backend's copy piece by piece. */
tandem_status tdm_kv_store_move_slots(tdm_kv_store *s, const tdm_kv_seq *seq, const int32_t *src, const int32_t *dst,
                                      int32_t n, tdm_err *err);

/* ------------------------------------------------------------- forward */

/* Scratch activations, grown on demand (backend memory). */
typedef struct tdm_fwd_scratch {
    tdm_backend *be;
    int32_t cap_rows;
    float *x;       /* [rows][n_embd] residual stream */
    float *xb;      /* [rows][n_embd] normed */
    float *qkv;     /* [rows][q_dim + 2 kv_dim] */
    float *att;     /* [rows][q_dim] */
    float *gate_up; /* [rows][2 n_ff] */
    float *ff;      /* [rows][n_ff] */
    /* mixture-of-experts layers (forward_moe.c; NULL for dense models) */
    float *moe_logits; /* [rows][n_expert] the router's logits */
    float *moe_x;      /* [rows][n_embd] the normed rows routed to one expert */
    float *moe_y;      /* [rows][n_embd] that expert's outputs */
    float *moe_acc;    /* [rows][n_embd] the weighted sum of each row's experts */
    int32_t *moe_ids;  /* [rows][n_expert_used] each row's experts (host) */
    float *moe_w;      /* [rows][n_expert_used] and their weights (host) */
    int32_t *moe_rows; /* [rows] the rows of one expert (host) */
    float *moe_rw;     /* [rows] and their weights for it (host) */
    int32_t *moe_ids_dev; /* [rows][n_expert_used] each row's experts and their weights, */
    float *moe_w_dev;     /* the moe_route op's output (backend memory; NULL on backends
                             with host memory, where the host routes) */
    int32_t *ids;   /* [rows] tokens / logit rows (host) */
    int32_t cap_ids;
    float *host_logits; /* [cap_host] host copy of logits rows (backends without host memory) */
    size_t cap_host;    /* floats */
    bool blocks_declined; /* the backend's blocks op declined this model (a matter of
                             shapes and configuration): the ops run one by one */
    int32_t mm_rows;      /* this forward's products in slices of this many rows (0: all
                             at once): a token-tree verification on a backend whose
                             products are batch invariant only up to invariant_rows, so
                             that its rows get a decode step's bits (forward_trunk) */
    /* a split model's forward (forward_tp.c) */
    float *tp_y;          /* [cap_rows][n_embd] an output projection's partial sums */
    size_t cap_tp_y;      /* floats */
    float *tp_logits;     /* [rows][output.rows] this rank's logits columns */
    size_t cap_tp_logits; /* floats */
    struct tdm_fwd_scratch *tp_rank; /* rank 0: [n - 1] the other ranks' scratch, or NULL */
    int32_t tp_n;
    /* The output head the forwards on this scratch use: NULL, the model's own; else a
     * head over part of the vocabulary (vocab_head.h; the engine sets it on its
     * draft's scratch).  Not owned, and kept by tdm_fwd_scratch_free. */
    const struct tdm_vocab_head *vhead;
    float *sub_logits;    /* [cap_sub][vhead->n] that head's own logits (backend memory) */
    int32_t cap_sub;      /* rows */
    /* The features an EAGLE-3 head drafts from (eagle3.h), off (n_feat 0) unless set
     * (tdm_fwd_scratch_set_features): every forward on this scratch writes, for each
     * of its rows i, the residual stream entering layer feat_layers[k] (the layer count:
     * after the last layer, before the output norm) into feat[i][k * n_embd ...], as the
     * blocks run (no extra pass).  Kept by tdm_fwd_scratch_free (the buffer is freed). */
    int32_t n_feat;
    int32_t feat_layers[4];
    float *feat;          /* [cap_feat][n_feat * n_embd] backend memory: the last forward's rows */
    int32_t cap_feat;     /* rows */
} tdm_fwd_scratch;

/* Turns the feature export on (n in [1, 4] layer ids, each in [0, the model's layer
 * count], checked by the forward) or off (n = 0). */
tandem_status tdm_fwd_scratch_set_features(tdm_fwd_scratch *s, const int32_t *layers, int32_t n, tdm_err *err);

/* The pieces of one block (forward.c), for the split forward (forward_tp.c).
 * scratch_reserve: s's buffers for `rows` rows of model hp on be.
 * layer_attn: layer l's attention half on s->x (norm, qkv, rope, K/V written,
 *   attention, Wo): the projection added to s->x (through the post norm where the
 *   layer has one) when y is NULL, else written to y[n][n_embd] (partial sums).
 * layer_ffn: the FFN half likewise.
 * residual: x += y through the layer's post norm (NULL: none); y overwritten. */
tandem_status tdm_fwd_scratch_reserve(tdm_fwd_scratch *s, tdm_backend *be, const tdm_hparams *hp, int32_t rows,
                                      tdm_err *err);
tandem_status tdm_fwd_layer_attn(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                 const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, int32_t l, float *y, tdm_err *err);
tandem_status tdm_fwd_layer_ffn(const tdm_model *m, tdm_backend *be, tdm_fwd_scratch *s, int32_t n, int32_t l,
                                float *y, tdm_err *err);
/* y[n][w->rows] (+)= x[n][w->cols] W^T (the matmul op), in slices of s->mm_rows rows
 * when set. */
tandem_status tdm_fwd_matmul(tdm_backend *be, const tdm_fwd_scratch *s, const tdm_weight *w, const float *x,
                             int32_t n, float *y, bool acc, tdm_err *err);
/* layer_moe: layer l's mixture-of-experts FFN half (the FFN half of layer_ffn when
 * the layer has experts; forward_moe.c).
 * moe_by_ops: the moe_experts op's result (backend.h, tdm_moe_args; a->ids and a->w
 *   host memory) through the matmul, swiglu and gather_rows ops, expert by expert:
 *   backends without the op, batches it declines, and its reference in the tests;
 *   s's MoE buffers for a->n rows as scratch (tdm_fwd_scratch_reserve). */
tandem_status tdm_fwd_layer_moe(const tdm_model *m, tdm_backend *be, tdm_fwd_scratch *s, int32_t n, int32_t l,
                                float *y, tdm_err *err);
tandem_status tdm_fwd_moe_by_ops(tdm_backend *be, const tdm_fwd_scratch *s, const tdm_moe_args *a, tdm_err *err);
tandem_status tdm_fwd_residual(tdm_backend *be, const tdm_hparams *hp, const float *post_norm, float *x, float *y,
                               int32_t n, tdm_err *err);
/* The rows of x[batch->n_rows][E] with want_logits, gathered into tmp when not all of
 * them, then RMS-normed with out_norm into out[*nl][E] (out may be tmp); ids: host
 * scratch of n_rows for their indices.  *nl = 0: nothing written. */
tandem_status tdm_fwd_logit_rows(tdm_backend *be, const tdm_batch *batch, const float *x, const float *out_norm,
                                 int32_t E, float eps, int32_t *ids, float *tmp, float *out, int32_t *nl,
                                 tdm_err *err);
/* The batch against the model and the block tables (host side). */
tandem_status tdm_fwd_check_batch(const tdm_model *m, const tdm_kv_store *kv, const tdm_batch *b,
                                  const tdm_kv_seq *const *seqs, bool tokens_on_host, tdm_err *err);

void tdm_fwd_scratch_free(tdm_fwd_scratch *s);

/* What a forward returns for the rows that want logits (n_logits of them, in row
 * order). */
typedef enum tdm_fwd_kind {
    TDM_FWD_LOGITS,        /* logits[n_logits][n_vocab], exact */
    TDM_FWD_LOGITS_APPROX, /* the same from the quantised head (qhead) when the model has
                              one, else exact: for the draft's proposals, where any
                              distribution serves (verification keeps the output exact) */
    TDM_FWD_LOGITS_DEV,    /* TDM_FWD_LOGITS for the model; the engine leaves them in
                              backend memory for device sampling (tdm_engine_forward) */
    TDM_FWD_ARGMAX,        /* ids[n_logits] = tdm_argmax_finite of the exact logits (-1
                              for a row with a non-finite logit), from the quantised
                              head's bounds plus a few exact logits when the model has
                              one (logits: scratch for models without) */
} tdm_fwd_kind;
tandem_status tdm_model_forward_ex(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv,
                                   const tdm_batch *batch, const tdm_kv_seq *const *seqs,
                                   tdm_fwd_scratch *s, tdm_fwd_kind kind, float *logits, int32_t *ids,
                                   tdm_err *err);
/* A forward whose greedy outputs stay in backend memory, without waiting for
 * them (the engine's draft chains; backends with argmax_dev): tokens from tok_dev
 * ([n_rows] ids in backend memory) when not NULL, else batch->token (tokens from
 * tok_dev are not checked: an id outside the vocabulary embeds as zeros); for the
 * rows with want_logits, their logits into logits (backend memory), and, when ids_dev
 * is not NULL, their argmax into ids_dev and the top softmax probability into top_dev
 * (backend memory, as argmax_dev writes them; top_dev may be NULL). */
tandem_status tdm_model_forward_dev(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                    const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, const int32_t *tok_dev,
                                    float *logits, int32_t *ids_dev, float *top_dev, tdm_err *err);
/* Runs the model over a batch.  K/V of every row is written into its slot (the
 * sequences' block tables must already be reserved past every slot).  logits
 * receives [n_logits][n_vocab] for the rows with want_logits, in row order. */
tandem_status tdm_model_forward(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv,
                                const tdm_batch *batch, const tdm_kv_seq *const *seqs,
                                tdm_fwd_scratch *s, float *logits, tdm_err *err);

#endif
