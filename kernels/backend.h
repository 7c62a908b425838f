/* backend.h - the narrow op interface every compute backend implements.
 *
 * The model's forward pass (src/model/forward.c) is written once on top of this table.
 * kernels/cpu implements it now; kernels/cuda will implement it with device
 * memory.  All pointers passed to ops are backend memory (host memory for the CPU
 * backend).  Every op returns a tandem_status; unsupported sizes or types return
 * TANDEM_ERR_UNSUPPORTED with a message, never crash.
 *
 * Row-major everywhere.  "x[n][d]" means n rows of d contiguous floats.
 */
#ifndef TDM_BACKEND_H
#define TDM_BACKEND_H

#include "batch.h"
#include "common.h"
#include "dtree.h"
#include "dtype.h"
#include "kv_cache.h"
#include "kv_layout.h"
#include "logit_edit.h"
#include "sampling.h"

typedef struct tdm_backend tdm_backend;

/* A weight matrix W[rows][cols] of any supported dtype.  Used as y = x * W^T (each
 * output element is a dot product of an input row and a W row).  Its layout
 * (tdm_layout, dtype.h) is TDM_LAYOUT_ROWS (rows contiguous, row_bytes apart)
 * unless a backend asked for another one when the model was loaded
 * (tdm_backend_ops.weight_layout); only matmul reads other layouts, and get_rows
 * too on backends with any_layout. */
typedef struct tdm_weight {
    uint32_t type;     /* tdm_dtype */
    int64_t rows;      /* output features */
    int64_t cols;      /* input features (multiple of the type's block size) */
    size_t row_bytes;  /* bytes of one row (of the rows layout; the same total for others).
                          A view of columns [c0, c0 + cols) of a wider weight keeps the
                          whole's row_bytes and points data at column c0 (rows layout:
                          rows are row_bytes apart; P64: 64-row blocks 64 * row_bytes
                          apart, data at element c0 * 64 of the first block) */
    const void *data;  /* backend memory */
    uint32_t layout;   /* tdm_layout; 0 = TDM_LAYOUT_ROWS */
    const float *scale; /* [rows] backend memory: TDM_F8_E4M3's per-row scales (element
                           (r, c) = e4m3 value * scale[r]); NULL for every other type */
} tdm_weight;

/* Views of part of a weight (no copy; kernels/weight_view.c): *v = rows [r0, r0 +
 * nr) (P64: r0 and nr multiples of 64), or columns [c0, c0 + nc) (rows layout:
 * whole quantisation blocks).  False, v untouched, when w's layout cannot express
 * the view or it does not lie inside w. */
bool tdm_weight_rows_view(const tdm_weight *w, int64_t r0, int64_t nr, tdm_weight *v);
bool tdm_weight_cols_view(const tdm_weight *w, int64_t c0, int64_t nc, tdm_weight *v);

/* RoPE: pair t < n_rot / 2 of every head of a row at position p is rotated by the
 * angle theta = p * freq[t], and both rotated values are multiplied by mscale:
 *   a' = (a cos theta - b sin theta) mscale,  b' = (a sin theta + b cos theta) mscale.
 * Every scaling a GGUF names (none, linear, yarn, Llama 3's rope_freqs) is such a
 * table plus a magnitude: src/model/rope.c computes them once at load, as llama.cpp does. */
typedef struct tdm_rope_params {
    int32_t n_rot;       /* rotated dims per head (<= head_dim, even) */
    float freq_base;     /* theta base, e.g. 10000 (for the table below when freq is NULL) */
    float freq_scale;    /* linear scaling: position multiplied by this (1 = none; likewise) */
    bool neox;           /* false: GGUF "normal" layout, rotate adjacent pairs (2i, 2i+1);
                            true: NEOX layout, rotate (i, i + n_rot/2) */
    const double *freq;  /* [n_rot / 2] backend memory: radians per position of pair t; NULL:
                            freq_scale * freq_base^(-2t / n_rot) */
    float mscale;        /* magnitude of cos and sin (yarn's attention factor); 0 means 1 */
} tdm_rope_params;

/* The FFN's gated activation (the gate half of W13's rows through it, times the up
 * half). */
typedef enum tdm_ffn_act {
    TDM_ACT_SILU = 0,      /* SwiGLU: llama, qwen2, qwen3 */
    TDM_ACT_GELU_TANH = 1, /* GeGLU with GELU's tanh approximation: gemma3 */
} tdm_ffn_act;

/* Write K/V of batch rows into the paged cache of one layer. */
typedef struct tdm_kv_write_args {
    const tdm_batch *batch;
    const tdm_kv_seq *const *seqs;   /* [n_seq] block tables, indexed by batch->seq */
    const float *k;                  /* [n_rows][row_stride], K at offset 0 of each row */
    const float *v;                  /* [n_rows][row_stride] */
    int32_t row_stride;              /* floats between consecutive rows of k / v */
    void *k_cache;                   /* [n_blocks][n_kv_head][head_dim][block_size]: per block, the
                                        keys side by side for each d (attention scores read
                                        16 slots per vector); q8_0: plus per-slot scales in
                                        each (block, kv head) unit (kv_layout.h) */
    void *v_cache;                   /* [n_blocks][n_kv_head][block_size][head_dim] (q8_0: the same) */
    uint32_t cache_type;             /* TDM_F32, TDM_F16, TDM_Q8_0 or TDM_F8_E4M3 (kv_layout.h) */
    int32_t n_kv_head, head_dim, block_size;
} tdm_kv_write_args;

/* Attention of batch rows over the paged cache of one layer (after kv_write). */
typedef struct tdm_attn_args {
    const tdm_batch *batch;
    const tdm_kv_seq *const *seqs;   /* [n_seq] block tables, indexed by batch->seq */
    const float *q;                  /* [n_rows][q_stride], heads at offset h * head_dim */
    int32_t q_stride;
    float *out;                      /* [n_rows][n_head * head_dim] */
    const void *k_cache;             /* [n_blocks][n_kv_head][head_dim][block_size] (+ q8_0 scales) */
    const void *v_cache;             /* [n_blocks][n_kv_head][block_size][head_dim] (+ q8_0 scales) */
    uint32_t cache_type;             /* TDM_F32, TDM_F16, TDM_Q8_0 or TDM_F8_E4M3 (kv_layout.h) */
    int32_t n_head, n_kv_head, head_dim, block_size; /* n_head % n_kv_head == 0 (GQA) */
    float scale;                     /* softmax scale, usually 1/sqrt(head_dim) */
    int32_t window;                  /* > 0: sliding window - of the slots [0, n_visible) a row at
                                        position p sees only those j with p - j < window (slot j
                                        holds position j in every batch the engine builds; extra
                                        slots, a tree row's ancestors within the tree's depth, are
                                        always seen); 0: every visible slot */
    float softcap;                   /* > 0: each score s = scale q.k becomes softcap tanh(s /
                                        softcap) before the softmax (logit soft-capping; an
                                        infinite s becomes NaN, as the softcap op); 0: off */
} tdm_attn_args;

/* Copies K/V slots of one sequence in every layer (kv_move, tdm_kv_store_move_slots):
 * slot dst[i] of every layer's K and V gets slot src[i]'s values (q8_0: and scale),
 * the pairs applied in order i = 0, 1, ... as if one at a time: a pair may overwrite
 * a slot an earlier pair read (a token tree's accepted path moving to consecutive
 * slots, draft/tree.h: path [0, 2, 3] moves 2 -> 1, then 3 -> 2). */
typedef struct tdm_kv_move_args {
    const tdm_kv_seq *seq;   /* its block table */
    const int32_t *src;      /* [n] host memory */
    const int32_t *dst;      /* [n] host memory */
    int32_t n;
    void *const *k_cache;    /* [n_layer] K caches (layout: tdm_kv_write_args) */
    void *const *v_cache;    /* [n_layer] V caches */
    int32_t n_layer;
    uint32_t cache_type;     /* TDM_F32, TDM_F16, TDM_Q8_0 or TDM_F8_E4M3 */
    int32_t n_kv_head, head_dim, block_size;
} tdm_kv_move_args;

/* A row-quantised copy of an output projection W[rows][cols] (tdm_qhead_build,
 * src/model/qhead.c) for cheap approximate logits with a rigorous error bound.  Laid out
 * for int8 dot-product instructions: groups of 16 W rows, and in each group the 16
 * rows' values of 4 consecutive columns stored together (64 bytes), so one
 * instruction advances 16 rows by 4 columns and no horizontal sums are needed.
 *
 * With x quantised the same way (scale dx = max|x| / 127, qx = round(x / dx)), the
 * approximate logit A = dx d[r] sum_k qx q[r][k] (the sum exact in integers) is
 * within  L1(x) xcoef[r] + ex l1[r] + 1e-6 |A|  of what matmul computes for W row
 * r, where L1(x) = sum |x_k| and ex = max |x_k - dx qx_k|. */
typedef struct tdm_qhead {
    int64_t rows, cols;         /* W's shape */
    int64_t rows_pad, cols_pad; /* rows_pad: multiple of 64; cols_pad: multiple of 4 */
    const int8_t *q;            /* [rows_pad/64][cols_pad/4][4][16][4]: round(w / d), |q| <= 127
                                   (panels of 64 rows; per 4 columns, 4 groups of 16 rows x 4
                                   columns, so a panel is one sequential stream); padding rows
                                   and columns are 0 */
    const float *d;             /* [rows_pad] max_k |w[r][k]| / 127 (0 for zero and padding rows) */
    const int32_t *qsum;        /* [rows_pad] sum_k q[r][k] */
    const float *xcoef;         /* [rows_pad] max_k |w - d q| + gamma(cols) max_k |w|, rounded up
                                   (gamma bounds matmul's own f32 rounding) */
    const float *l1;            /* [rows_pad] sum_k |d q[r][k]|, rounded up */
} tdm_qhead;

/* Index in tdm_qhead.q of row r, column k (c4 = cols_pad / 4). */
static inline int64_t tdm_qhead_qidx(int64_t c4, int64_t r, int64_t k) {
    return ((r / 64) * c4 + k / 4) * 256 + (r % 64 / 16) * 64 + (r % 16) * 4 + k % 4;
}

/* The weights of one llama-family transformer block (hd = head_dim). */
typedef struct tdm_block_weights {
    const float *attn_norm; /* [n_embd] */
    tdm_weight wqkv;        /* [n_head*hd + 2*n_head_kv*hd][n_embd]: q rows, then k, then v; all
                               zero (data NULL) when the three are kept apart (tdm_qkv_split) */
    tdm_weight wq, wk, wv;  /* when tdm_qkv_split: [n_head*hd][n_embd], [n_head_kv*hd][n_embd],
                               [n_head_kv*hd][n_embd], each of its file's type (a Q4_K_M file's
                               Q4_K q and k with a Q6_K v): host-memory backends only (the model
                               loader fuses mixed types into one f16 weight for the others) */
    const float *bqkv;      /* [n_head*hd + 2*n_head_kv*hd] or NULL */
    const float *q_norm;    /* [hd] RMSNorm of each q head before RoPE (qwen3, gemma3), or NULL */
    const float *k_norm;    /* [hd] the same for each k head, or NULL */
    tdm_weight wo;          /* [n_embd][n_head*hd] */
    const float *attn_post_norm; /* [n_embd] RMSNorm of the attention output before the residual
                                    add (gemma3's post_attention_norm), or NULL */
    const float *ffn_norm;  /* [n_embd] */
    tdm_weight w13;         /* [2*n_ff][n_embd]: gate rows, then up rows */
    tdm_weight w2;          /* [n_embd][n_ff] */
    const float *ffn_post_norm; /* [n_embd] RMSNorm of the FFN output before the residual add
                                   (gemma3's post_ffw_norm), or NULL */
    /* A mixture-of-experts FFN (qwen3moe, Mixtral) instead of w13 / w2 (which are then
     * empty), n_expert experts of n_ff features each: */
    tdm_weight router;      /* [n_expert][n_embd] the gate's logits (ffn_gate_inp) */
    const tdm_weight *exp_w13; /* [n_expert] each [2*n_ff][n_embd]: the expert's gate rows, then
                                  its up rows; NULL: a dense FFN */
    const tdm_weight *exp_w2;  /* [n_expert] each [n_embd][n_ff] */
} tdm_block_weights;

/* Whether a block's q, k and v weights are three (wq, wk, wv) rather than one (wqkv). */
static inline bool tdm_qkv_split(const tdm_block_weights *L) { return L->wqkv.data == NULL; }

/* Every transformer block of a forward pass over a batch (the `blocks` op): per
 * block, what src/model/forward.c otherwise runs op by op. */
typedef struct tdm_blocks_args {
    const tdm_batch *batch;
    const tdm_kv_seq *const *seqs;       /* [n_seq] block tables, indexed by batch->seq */
    const tdm_block_weights *layers;     /* [n_layer] */
    void *const *k_cache;                /* [n_layer] K caches (layout: tdm_kv_write_args) */
    void *const *v_cache;                /* [n_layer] V caches */
    uint32_t cache_type;                 /* TDM_F32, TDM_F16, TDM_Q8_0 or TDM_F8_E4M3 (kv_layout.h) */
    int32_t block_size;
    int32_t n_layer, n_embd, n_ff, n_head, n_kv_head, head_dim;
    float norm_eps;
    const tdm_rope_params *rope;
    float attn_scale;                    /* the attention's softmax scale */
    /* Beyond the llama / qwen2 block (a backend's blocks op declines what it does not
     * run; every zero value is the plain block): */
    const tdm_rope_params *rope_swa;     /* sliding-window layers' RoPE, or NULL (= rope) */
    int32_t swa_window, swa_pattern;     /* window > 0: layer l attends within it when
                                            l % swa_pattern < swa_pattern - 1 */
    float attn_softcap;                  /* tdm_attn_args.softcap of every layer */
    uint32_t ffn_act;                    /* tdm_ffn_act */
    int32_t n_expert, n_expert_used;     /* a mixture of experts (the layers' router,
                                            exp_w13 and exp_w2; n_ff: each expert's):
                                            experts per layer and per row; 0: dense */
    float *x;                            /* [n_rows][n_embd]: in, the embeddings; out, the
                                            residual stream after the last block */
    /* Optional, on backends with blocks_feat (NULL: none): for each k < n_feat, the
     * residual stream entering block feat_layers[k] of every row into feat[row][k *
     * n_embd ...] (rows n_feat * n_embd apart; ids from n_layer up are not written):
     * an EAGLE-3 head's features (src/model/eagle3.h), written as the blocks run */
    float *feat;
    const int32_t *feat_layers;
    int32_t n_feat;
} tdm_blocks_args;

/* A mixture-of-experts layer's experts over a batch (the moe_experts op): for each
 * row i and each of its experts e = ids[i][j] (j < k, distinct),
 *   h = swiglu(x[i] W13_e^T),  out[i] = sum of w[i][j] * (h W2_e^T),
 * the sum from 0 over the row's experts in ascending expert order, each term added
 * as acc += w * y (as src/model/forward_moe.c computes it op by op).  ids and w are
 * backend memory (the host's on host-memory backends; on the others the moe_route
 * op's output, so that no step waits for the host). */
typedef struct tdm_moe_args {
    const float *x;        /* [n][n_embd] the normed rows */
    int32_t n, n_embd, n_ff, n_expert, k;
    const int32_t *ids;    /* [n][k] backend memory: each row's experts */
    const float *w;        /* [n][k] backend memory: their weights */
    const tdm_weight *w13; /* [n_expert] each [2*n_ff][n_embd]: gate rows, then up rows */
    const tdm_weight *w2;  /* [n_expert] each [n_embd][n_ff] */
    float *out;            /* [n][n_embd] */
} tdm_moe_args;

typedef struct tdm_backend_ops {
    const char *name;
    void (*destroy)(tdm_backend *b);

    /* memory */
    tandem_status (*alloc)(tdm_backend *b, size_t bytes, void **out, tdm_err *err); /* zeroed */
    void (*free)(tdm_backend *b, void *p);
    tandem_status (*upload)(tdm_backend *b, void *dst, const void *src, size_t n, tdm_err *err);
    tandem_status (*download)(tdm_backend *b, void *dst, const void *src, size_t n, tdm_err *err);
    tandem_status (*copy)(tdm_backend *b, void *dst, const void *src, size_t n, tdm_err *err);

    /* out[n][w->cols] = rows ids[i] of w, converted to f32 (embedding lookup) */
    tandem_status (*get_rows)(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n,
                              float *out, tdm_err *err);
    /* out[n][dim] = x / sqrt(mean(x^2) + eps) * gamma   (out may equal x) */
    tandem_status (*rmsnorm)(tdm_backend *b, const float *x, const float *gamma, int32_t n,
                             int32_t dim, float eps, float *out, tdm_err *err);
    /* Optional (NULL: TDM_LAYOUT_ROWS always): the layout matmul reads fastest for a
     * weight of this type and shape; the model loader packs its matmul weights
     * into it (tdm_weight_pack).  A backend only names layouts its matmul reads. */
    uint32_t (*weight_layout)(tdm_backend *b, uint32_t type, int64_t rows, int64_t cols);
    /* y[n][w->rows] = x[n][w->cols] * W^T, or += when accumulate.  Reads W once per
     * call (not once per row) so a batch of n rows costs about one pass over W. */
    tandem_status (*matmul)(tdm_backend *b, const tdm_weight *w, const float *x, int32_t n,
                            float *y, bool accumulate, tdm_err *err);
    /* y[n][dim] += bias[dim] */
    tandem_status (*add_bias)(tdm_backend *b, float *y, const float *bias, int32_t n, int32_t dim,
                              tdm_err *err);
    /* In-place RoPE on x[n][row_stride]: heads h in [0, n_head) at offset h * head_dim,
     * row i rotated by position pos[i]. */
    tandem_status (*rope)(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                          int32_t head_dim, const int32_t *pos, const tdm_rope_params *rp,
                          tdm_err *err);
    tandem_status (*kv_write)(tdm_backend *b, const tdm_kv_write_args *a, tdm_err *err);
    tandem_status (*attention)(tdm_backend *b, const tdm_attn_args *a, tdm_err *err);
    /* out[n][ff] = silu(gate_up[i][j]) * gate_up[i][ff + j]   (gate_up is [n][2 * ff]) */
    tandem_status (*swiglu)(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff, float *out,
                            tdm_err *err);
    /* Copies rows: out[i] = x[rows[i]] for i < n (dim floats each). */
    tandem_status (*gather_rows)(tdm_backend *b, const float *x, const int32_t *rows, int32_t n,
                                 int32_t dim, float *out, tdm_err *err);
    /* Optional (present when tdm_backend.int8_dot): the quantised output head.
     * qhead_logits: y[n][qh->rows] = the approximate logits A of x[n][qh->cols] (see
     * tdm_qhead): a cheap stand-in for matmul where an approximation serves (the
     * draft model's proposals).
     * head_argmax: ids[i] = the first index of the largest logit of row i of
     * matmul(w, x), exactly as tdm_argmax_finite finds it on matmul's output (-1 when
     * a logit of the row is NaN or infinite), computing only the logits the bounds of
     * A cannot rule out (qh is w's quantised copy).  masks: NULL, or [n] host
     * pointers to rows of (w->rows + 31) / 32 words (NULL entries: that row
     * unmasked): row i's id is then tdm_argmax_masked's (sampling.h) on matmul's
     * row: the first largest logit among the tokens whose bit is set, -1 when a
     * logit of the whole row is not finite or no token is allowed. */
    tandem_status (*qhead_logits)(tdm_backend *b, const tdm_qhead *qh, const float *x, int32_t n,
                                  float *y, tdm_err *err);
    tandem_status (*head_argmax)(tdm_backend *b, const tdm_weight *w, const tdm_qhead *qh,
                                 const float *x, int32_t n, const uint32_t *const *masks, int32_t *ids,
                                 tdm_err *err);
    /* Optional (NULL: forward.c runs the blocks op by op): all transformer blocks
     * in one call, so a backend can keep data where it was computed between ops
     * (the CPU backend splits heads and FFN features between its threads, tensor
     * parallel).  Results equal the op sequence's up to rounding (partial sums are
     * grouped differently), never depend on the batch's other rows, and are the same
     * for every call with the same backend configuration.  Returns
     * TANDEM_ERR_UNSUPPORTED, having touched nothing, for shapes or configurations it
     * does not run; forward.c then runs the ops, and (unless the batch has tree rows)
     * runs the model's later forwards on this scratch by ops too without asking: a
     * decline must not depend on the batch, except on its tree rows. */
    tandem_status (*blocks)(tdm_backend *b, const tdm_blocks_args *a, tdm_err *err);
    /* Waits for queued work (a no-op for the CPU backend). */
    tandem_status (*sync)(tdm_backend *b, tdm_err *err);
    /* Optional (NULL: forward.c finds the argmax on a host copy): ids[i] = the first
     * index of the largest value of x[i][0..dim), or -1 when the row holds a NaN or
     * an infinity, as tdm_argmax_finite does; ids is host memory, x backend memory. */
    tandem_status (*argmax)(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t *ids, tdm_err *err);
    /* Optional: the most device memory in use at any point so far, in bytes (the
     * whole device as the driver reports it), 0 when unknown. */
    size_t (*mem_peak)(tdm_backend *b);
    /* Optional (NULL on host-memory backends: there the engine reads ids directly):
     * get_rows and argmax on ids in backend memory, so that forwards can feed each
     * other's tokens without the host waiting in between (a draft chain).
     * get_rows_dev: as get_rows with ids[n] in backend memory; an id outside [0,
     * w->rows) gives a row of zeros (its producer reported it: argmax_dev's -1).
     * argmax_dev: ids[i] (backend memory) as argmax computes it, and, when top is
     * not NULL, top[i] (backend memory) = the largest probability of softmax(x[i])
     * as tdm_top_prob computes it (0 for a row argmax marks -1); does not wait. */
    tandem_status (*get_rows_dev)(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n, float *out,
                                  tdm_err *err);
    tandem_status (*argmax_dev)(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t *ids, float *top,
                                tdm_err *err);
    /* Optional (NULL: the engine samples on host copies of the logits): sampling
     * where the logits are, nothing waits, every pointer but u and draft is backend
     * memory.
     * probs_dev: probs[i] = tdm_probs_from_logits(logits[i], sp) up to rounding (the
     *   same filters, order and ties); ok[i] = 0 for a row with a NaN or infinite
     *   logit (its probs are then 0), else 1.
     * sample_dev: ids[i] = the token tdm_sample_probs draws from probs[i] with the
     *   uniform u[i] (host, n <= TDM_SAMPLE_DEV_MAX_ROWS), -1 when no entry is positive; and, when pmax
     *   is not NULL, pmax[i] = the row's largest entry.
     * accept_dev: tdm_accept_sample's rule on p[k + 1][dim] and q[k][dim] (rows i >=
     *   n_q are one-hot on draft[i] and need not exist), with draft[k] and u[k + 1]
     *   on the host (u[i] decides draft token i; the emitted token is drawn with the
     *   next one): out[0] = accepted tokens, out[1] = the emitted token (k <= 32). */
    tandem_status (*probs_dev)(tdm_backend *b, const float *logits, int32_t n, int32_t dim,
                               const tdm_sampler_params *sp, float *probs, int32_t *ok, tdm_err *err);
    tandem_status (*sample_dev)(tdm_backend *b, const float *probs, int32_t n, int32_t dim, const double *u,
                                int32_t *ids, float *pmax, tdm_err *err);
    tandem_status (*accept_dev)(tdm_backend *b, const float *p, const float *q, int32_t n_q, const int32_t *draft,
                                int32_t k, int32_t dim, const double *u, int32_t *out, tdm_err *err);

    /* The ops of the qwen3 / gemma3 blocks (NULL: forward.c refuses such models on
     * this backend, naming the op). */
    /* In place, each head alone: x[i][h * head_dim ..+ head_dim) for rows i < n
     * (row_stride floats apart) and heads h < n_head = rmsnorm of it with gamma[head_dim]
     * (rmsnorm's arithmetic on each head). */
    tandem_status (*head_rmsnorm)(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                                  int32_t head_dim, const float *gamma, float eps, tdm_err *err);
    /* out[n][ff] = gelu(gate_up[i][j]) * gate_up[i][ff + j], gelu(g) = 0.5 g (1 +
     * tanh(sqrt(2 / pi) (g + 0.044715 g^3)))   (gate_up is [n][2 * ff]) */
    tandem_status (*geglu)(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff, float *out, tdm_err *err);
    /* y[n][dim] += x[n][dim] */
    tandem_status (*add)(tdm_backend *b, float *y, const float *x, int32_t n, int32_t dim, tdm_err *err);
    /* x[n][dim] *= s */
    tandem_status (*scale)(tdm_backend *b, float *x, int32_t n, int32_t dim, float s, tdm_err *err);
    /* x[n][dim] = cap * tanh(x / cap)   (cap > 0; an infinite x becomes NaN, which the
     * logits check reports, instead of +-cap) */
    tandem_status (*softcap)(tdm_backend *b, float *x, int32_t n, int32_t dim, float cap, tdm_err *err);
    /* Optional (NULL: the engine copies with `copy`, or directly on host memory):
     * tdm_kv_move_args's copy in one call. */
    tandem_status (*kv_move)(tdm_backend *b, const tdm_kv_move_args *a, tdm_err *err);
    /* Optional (NULL: nothing to do): makes the backend's device the calling thread's
     * current one, before its ops are called from a thread that drives several
     * devices (tensor parallelism, src/model/tp.h; collective.h's tdm_backend_activate). */
    tandem_status (*make_current)(tdm_backend *b, tdm_err *err);
    /* Optional (NULL: the engine finds them on host copies of the logits; a token
     * tree's draft levels): for each row x[i][0..dim) (backend memory) its k <=
     * TDM_TOPK_MAX largest entries, ids[i * k + j] (host memory) in decreasing order,
     * ties to the lower index, and probs[i * k + j] = their softmax probabilities
     * exp(x - max) / sum exp(x - max) (the sum in double, as tdm_top_prob); a row
     * holding a NaN or an infinity gets ids[i * k] = -1, and rows of fewer than k
     * entries -1 past them (probability 0).  Waits for the result. */
    tandem_status (*topk)(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t k, int32_t *ids,
                          float *probs, tdm_err *err);
    /* Optional (NULL: greedy tree levels go through the host): one level of a greedy
     * dynamic token tree grown in backend memory (kernels/dtree.h), without waiting.
     * x[n][dim] (backend memory): the draft's logits rows of the level just drafted,
     * row i for node t->exp[i], or, with depth 0, one row for the root (t is reset
     * first).  Each row's k likeliest tokens, as the topk op finds them, become that
     * node's children at `depth`, weight = the node's weight (the root's: 1) times
     * their probability, appended row by row in rank order; a row with a NaN or an
     * infinity sets t->bad.  When width > 0, the `width` children of highest weight
     * (ties: the earlier) are the next level's expansions (fewer when the fed nodes
     * would reach TDM_TREE_MAX_NODES; t->bad when there are fewer than
     * want_exp): each gets the next draft slot, in creation order, and t->next_tok /
     * t->next_mask hold their tokens and draft masks; missing ones get token 0 and
     * mask (1 << its slot) | ((1 << depth) - 1).  k <= 16, n <= TDM_DTREE_LEVEL. */
    tandem_status (*tree_grow)(tdm_backend *b, tdm_dtree *t, const float *x, int32_t n, int32_t dim, int32_t k,
                               int32_t depth, int32_t width, int32_t want_exp, tdm_err *err);
    /* Optional (NULL: forward_moe.c runs the experts op by op, through matmul, swiglu
     * and gather_rows): tdm_moe_args's products in one call (the CPU: each thread
     * takes whole experts' products for groups of rows, instead of every thread a
     * part of each product in turn; CUDA: grouped products over every expert in one
     * launch each, ids and w on the device).  Each row's result is what the ops give,
     * bit for bit on the CPU (up to rounding elsewhere), and never depends on the
     * other rows.  Returns
     * TANDEM_ERR_UNSUPPORTED, having touched nothing, for a batch it leaves to the
     * ops (on the CPU: fewer groups than threads). */
    tandem_status (*moe_experts)(tdm_backend *b, const tdm_moe_args *a, tdm_err *err);
    /* Optional (NULL: a head over part of the vocabulary, src/model/vocab_head.h, is
     * refused on this backend): the logits of such a head placed into whole-vocabulary
     * rows, y[i][ids[j]] = x[i][j] for rows i < n and j < nx, every other entry of
     * y[n][dim] = fill (TDM_LOGIT_NONE).  ids[nx] (backend memory) ascending, each in
     * [0, dim): the CPU refuses others (TANDEM_ERR_INVALID_ARG, y then partly written),
     * a GPU trusts its caller (tdm_vocab_head_init checked them).  Does not wait. */
    tandem_status (*scatter_cols)(tdm_backend *b, const float *x, int32_t n, int32_t nx, const int32_t *ids,
                                  int32_t dim, float fill, float *y, tdm_err *err);
    /* Optional (NULL: constrained requests are refused where the engine samples on
     * the device): token masks of grammar-constrained decoding, x[i][v] = fill for
     * every row i < n and column v < dim whose bit is clear in mask[i] ((dim + 31) / 32
     * words a row, bit v % 32 of word v / 32), the others unchanged: each row as
     * tdm_logits_mask (sampling.h) makes it.  x and mask backend memory.  Does not wait. */
    tandem_status (*mask_rows)(tdm_backend *b, float *x, int32_t n, int32_t dim, const uint32_t *mask, float fill,
                               tdm_err *err);
    /* Optional (NULL: penalised requests are refused where the engine samples on the
     * device): per-row logit edits (penalties, logit_bias, min_tokens), row i of
     * x[n][dim] gets edits[off[i] .. off[i + 1]) (ids in [0, dim), each at most once a
     * row), x[i][id] = tdm_logit_edit_apply(edit, x[i][id]): each row as
     * tdm_logits_edit_rows (logit_edit.h) makes it.  x, edits and off[n + 1] backend
     * memory; the CPU refuses an id out of range (TANDEM_ERR_INVALID_ARG, rows partly
     * edited), a GPU trusts its caller (the engine checked them at submission).  Does
     * not wait. */
    tandem_status (*edit_rows)(tdm_backend *b, float *x, int32_t n, int32_t dim, const tdm_logit_edit *edits,
                               const int32_t *off, tdm_err *err);
    /* Optional (NULL: a logprobs request's rows are read on the host): each finite row
     * x[i][0..dim) summarised into out[i] as tdm_logits_row_top (logit_edit.h) makes
     * it (its logsumexp within 1e-6 relative; its k <= TDM_ROW_TOP_MAX largest entries,
     * ids and logits, decreasing, ties to the lower id), and out[i].want = x[i][want[i]]
     * (0 for an id out of range).  x, want[n] and out[n] backend memory: a few hundred
     * bytes a row to read back, not the row.  Does not wait. */
    tandem_status (*row_top)(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t k, const int32_t *want,
                             tdm_row_top *out, tdm_err *err);
    /* Optional (NULL: the host routes, src/model/moe.h; a backend without host memory
     * then runs no mixture-of-experts model): each row of a mixture-of-experts
     * router's logits[n][n_expert] (backend memory) routed as tdm_moe_route does
     * (softmax, the k most probable with ties to the lower expert index, weights
     * renormalised), into ids[n][k] and w[n][k] (backend memory), without waiting:
     * the moe_experts op reads them there.  1 <= k <= n_expert <= 512, k <= 64. */
    tandem_status (*moe_route)(tdm_backend *b, const float *logits, int32_t n, int32_t n_expert, int32_t k,
                               int32_t *ids, float *w, tdm_err *err);
    /* Optional (NULL: the caller runs the tasks itself, in order): fn(user, i) once for
     * every i in [0, n), on the backend's host threads (the calling thread among them),
     * returning when every call has returned.  For host work of a step that is
     * independent per sequence (a grammar's masks, src/engine/constrain.h): each call
     * touches only its own i's data and never calls the backend.  Not reentrant; from
     * the thread that issues the backend's ops, between them. */
    void (*host_for)(tdm_backend *b, int32_t n, void (*fn)(void *user, int32_t i), void *user);
} tdm_backend_ops;

/* The logit that a head over part of the vocabulary (scatter_cols) gives every token
 * outside it.  Finite, so every check of logits for NaN or infinity passes (the
 * engine's, the device sampling's ok flags, argmax's -1; a logit pushed down by
 * -FLT_MAX, as the benchmark oracle does, stays finite too), yet exp(TDM_LOGIT_NONE -
 * l) is 0 in float and double for any real logit l (and any temperature): softmax
 * gives those tokens probability 0, and no argmax or top-k picks them while the row
 * has a real logit. */
#define TDM_LOGIT_NONE (-1e30f)

/* The topk op's k at most. */
#define TDM_TOPK_MAX 32
/* The most rows one sample_dev call draws (its uniforms go by value). */
#define TDM_SAMPLE_DEV_MAX_ROWS 32

struct tdm_backend {
    const tdm_backend_ops *ops;
    int32_t n_threads; /* CPU threads used by ops (CPU backend) */
    bool host_memory;  /* backend memory is host memory (the CPU backend): the host may
                          read op outputs directly; otherwise through download */
    bool int8_dot;     /* qhead_logits / head_argmax are implemented and fast here */
    uint32_t direct_types; /* weight types (bit 1 << type) whose matmul of a few rows reads
                              the weight's own blocks at about memory speed (the CPU with
                              AVX-512 VNNI: Q4_K, Q6_K, Q5_0), so the loader keeps no
                              quantised copy of an output head of such a type (its exact
                              logits read fewer bytes than the copy would); 0: none */
    bool any_layout;   /* every op that reads weights (get_rows too) reads every layout
                          weight_layout names, so the loader may pack the embedding and
                          the output head as well */
    uint32_t kv_type;  /* element type of the K/V caches engines make here by default
                          (TDM_F16 on the CPU and the GPU; an engine may ask
                          for any tdm_kv_type_ok type instead) */
    int32_t invariant_rows; /* rows up to which every row of a forward is computed as it
                               would be alone (0 = any number: the CPU; 16 on the GPU,
                               whose larger batches take cuBLAS) */
    bool attn_window_softcap; /* attention honours tdm_attn_args.window and .softcap (else
                                 it refuses them: models that need them fail at load) */
    bool blocks_feat;  /* the blocks op writes tdm_blocks_args.feat (else a forward that
                          exports features runs it in parts ending at the feature layers) */
    void *impl;
};

/* Argument checks the backends share (kernels/op_check.c): every ids[i] of n in
 * [0, limit), else TANDEM_ERR_INVALID_ARG naming op, the id and its index. */
tandem_status tdm_check_ids(const int32_t *ids, int32_t n, int64_t limit, const char *op, tdm_err *err);
/* The row ops' (add, scale, softcap, geglu: dim = ff): n >= 0, dim > 0, a and b not
 * NULL when n > 0.  A scale's factor finite; a soft-cap positive and finite
 * (positive).  head_rmsnorm's shape (heads inside a row), eps >= 0, pointers. */
tandem_status tdm_check_rows(const char *op, const void *a, const void *b, int32_t n, int32_t dim, tdm_err *err);
/* scatter_cols' shape: n >= 0, 0 < nx <= dim, x, ids and y not NULL when n > 0. */
tandem_status tdm_check_scatter(const float *x, int32_t n, int32_t nx, const int32_t *ids, int32_t dim, const float *y,
                                tdm_err *err);
tandem_status tdm_check_factor(const char *op, float v, bool positive, tdm_err *err);
tandem_status tdm_check_head_norm(const float *x, const float *gamma, int32_t n, int32_t row_stride, int32_t n_head,
                                  int32_t head_dim, float eps, tdm_err *err);

/* CPU backend with n_threads threads (0 = all cores). */
tandem_status tdm_backend_cpu_create(int32_t n_threads, tdm_backend **out, tdm_err *err);
/* CUDA backend (returns TANDEM_ERR_BACKEND when built without CUDA or no device). */
tandem_status tdm_backend_cuda_create(int32_t device, tdm_backend **out, tdm_err *err);
/* A CUDA backend's forward-pass graphs so far: launches of captured graphs and
 * captures (both 0 for other backends and builds without CUDA). */
void tdm_backend_cuda_graph_stats(tdm_backend *b, uint64_t *replays, uint64_t *captures);
/* For benchmarks of the matmul op: 0 = pick the path by rows (the default), 1 = the
 * row kernels wherever they read the weight (up to 64 rows), 2 = cuBLAS, 3 = as 0
 * but Q4_K / Q5_K / Q6_K rows on the row kernel that dequantises them to f32 (the
 * reference of their int8 kernels; the fused forward too). */
void tdm_backend_cuda_force_matmul(tdm_backend *b, int path);
/* The attention kernels a CUDA backend takes (tests and benchmarks: each path is
 * the reference of the one before; no effect on other backends). */
typedef enum tdm_cuda_attn_path {
    TDM_CUDA_ATTN_AUTO = 0,   /* the default: the decode kernel for decode and
                                 verification tiles where its grid fills the GPU, the
                                 tiled kernels for the other batches they run */
    TDM_CUDA_ATTN_TILED = 1,  /* the tiled kernels for every row (no decode kernel:
                                 the same bits) */
    TDM_CUDA_ATTN_SCORES = 2, /* the scores and softmax kernels for every batch (tree
                                 masks as extra slots; the fused forward is then not
                                 captured into graphs) */
} tdm_cuda_attn_path;
void tdm_backend_cuda_force_attention(tdm_backend *b, tdm_cuda_attn_path path);
void tdm_backend_destroy(tdm_backend *b); /* NULL is a no-op */

/* A description of the CPU features in use ("avx512", "avx2", "scalar"). */
const char *tdm_cpu_features(void);

#endif
