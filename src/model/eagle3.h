/* eagle3.h - EAGLE-3 draft heads in llama.cpp's GGUF format (architecture `eagle3`):
 * the file, its pairing with a target, and the head's forward.
 *
 * A head drafts from the target's own hidden states (EAGLE-3; llama.cpp
 * src/models/eagle3.cpp).  The target's forward exports the residual stream entering
 * three of its layers (the feature layers, `eagle3.target_layers`; an id equal to the
 * target's layer count is the stream after its last layer), [n][3 * target hidden]
 * (tdm_fwd_scratch_set_features, model.h).  The head then runs
 *   encoder:  g = fc(feat)                  (fc [n_embd][3 * target hidden]; with
 *             norm_before_fc, fc(rmsnorm(feat, enc_norm)))
 *   decoder:  one llama block whose attention reads [rmsnorm(embd(token), attn_norm) ;
 *             rmsnorm(g, hidden_norm)] (2 * n_embd wide), whose attention residual is g
 *             (rmsnorm(g) with norm_before_residual), then the FFN half as llama's;
 *             h = the block's output (pre-norm): the next draft level's g;
 *             logits = rmsnorm(h, output_norm) output^T over the draft vocabulary,
 *             placed at the target ids d2t[j] (TDM_LOGIT_NONE elsewhere).
 * At KV position P the head's row is (token P + 1, g of position P), with RoPE at P
 * (llama.cpp common/speculative.cpp, "EAGLE3 input convention").
 *
 * The file's tensors (GGUF ne order, E = n_embd, T = target hidden, V = the target's
 * vocabulary, Vd = the draft vocabulary, F = n_ff, qd = n_head * head_dim, kvd =
 * n_head_kv * head_dim):
 *   fc.weight                 [3T, E]        any supported type
 *   enc.output_norm.weight    [3T]           only with norm_before_fc
 *   token_embd.weight         [E, V]         optional (absent: the target's embedding)
 *   output_norm.weight        [E]
 *   output.weight             [E, Vd]        optional (absent: the target's head, Vd = V)
 *   d2t                       [Vd] i64       optional (absent: Vd = V, the identity)
 *   rope_freqs.weight         [head_dim / 2] optional
 *   blk.0.attn_norm.weight    [E]            (the token embedding's norm)
 *   blk.0.attn_norm_2.weight  [E]            (g's norm: the checkpoint's hidden_norm)
 *   blk.0.attn_q.weight       [2E, qd]       attn_k / attn_v [2E, kvd]
 *   blk.0.attn_output.weight  [qd, E]
 *   blk.0.ffn_norm.weight     [E]
 *   blk.0.ffn_gate.weight, ffn_up.weight [E, F];  ffn_down.weight [F, E]
 * and the keys eagle3.{context_length, embedding_length, block_count = 1,
 * feed_forward_length, attention.head_count, attention.head_count_kv,
 * attention.layer_norm_rms_epsilon, rope.freq_base, ...} as llama's, plus
 *   eagle3.target_layers        [3] i32 (or u32)  the feature layers (required)
 *   eagle3.target_hidden_size   u32               T (required)
 *   eagle3.norm_before_residual bool              (optional, false)
 *   eagle3.norm_before_fc       bool              (optional, false)
 * and the target's tokenizer (V tokens) or eagle3.vocab_size.  d2t holds target ids
 * (llama.cpp's graph writes draft logit j to row d2t[j]: the converter has added the
 * HF checkpoint's offsets j + d2t[j]); tandem needs them distinct and in [0, V), and
 * sorts them (with the head's rows) where a file's are not ascending.
 */
#ifndef TDM_EAGLE3_H
#define TDM_EAGLE3_H

#include "model.h"

#define TDM_EAGLE3_N_FEAT 3 /* feature layers a head fuses */

typedef struct tdm_eagle3_hparams {
    int32_t n_embd, n_head, n_head_kv, head_dim, n_ff;
    int32_t n_vocab;          /* the target's vocabulary (the file's tokenizer / vocab_size) */
    int32_t n_draft_vocab;    /* the head's output rows (d2t's length; n_vocab without d2t) */
    int32_t target_hidden;    /* T: each feature's width */
    int32_t feat_layers[TDM_EAGLE3_N_FEAT]; /* the target layers whose input stream it fuses */
    bool norm_before_residual, norm_before_fc;
    bool own_embd;            /* token_embd.weight in the file (else the target's) */
    bool own_output;          /* output.weight in the file (else the target's) */
    bool has_d2t;
} tdm_eagle3_hparams;

typedef struct tdm_eagle3 {
    tdm_model *m;             /* the shell: gguf, backend, owned memory, hp (n_layer 1, the
                                 block's shape, RoPE; n_vocab = the target's), its block in
                                 layers[0] (attn_norm, wo, ffn_norm, w13, w2; wqkv unused) */
    tdm_eagle3_hparams ep;
    tdm_weight fc;            /* [n_embd][3T] */
    const float *enc_norm;    /* [3T], or NULL (norm_before_fc only) */
    const float *hidden_norm; /* [n_embd] */
    tdm_weight wqkv_e;        /* [qd + 2 kvd][n_embd]: the q, k, v rows' columns that read the
                                 normed embedding */
    tdm_weight wqkv_g;        /* [qd + 2 kvd][n_embd]: their columns that read the normed g */
    tdm_weight tok_embd;      /* [n_vocab][n_embd] own, or the paired target's (rows = 0 until
                                 paired when the file has none) */
    tdm_weight output;        /* [n_draft_vocab][n_embd] own, or the paired target's */
    int32_t *d2t;             /* [n_draft_vocab] host: target ids, ascending; NULL without d2t */
    const int32_t *d2t_dev;   /* the same in backend memory */
    bool paired;              /* tdm_eagle3_pair succeeded */
    char file[128];           /* the file's base name, or "" */
} tdm_eagle3;

/* Reads the head's keys (no tensors, no backend: `tandem info`, the CLI's check of
 * -d).  TANDEM_ERR_UNSUPPORTED naming the architecture for a file that is not
 * eagle3; TANDEM_ERR_FORMAT for a missing or inconsistent key or tensor (every
 * tensor's shape is checked here too, and d2t's ids). */
tandem_status tdm_eagle3_read_hparams(const tdm_gguf *g, tdm_hparams *hp, tdm_eagle3_hparams *ep, tdm_err *err);
/* Whether g's general.architecture is eagle3. */
bool tdm_gguf_is_eagle3(const tdm_gguf *g);

/* Loads a head onto be (ownership of g passes to the head, also on failure).  The
 * file's own tensors only: tdm_eagle3_pair completes it with a target's. */
tandem_status tdm_eagle3_load_gguf(tdm_gguf *g, tdm_backend *be, tdm_eagle3 **out, tdm_err *err);
tandem_status tdm_eagle3_load(const char *path, tdm_backend *be, tdm_eagle3 **out, tdm_err *err);
void tdm_eagle3_free(tdm_eagle3 *h);

/* Checks a head (its keys) against a target: the vocabulary, the feature width
 * (target_hidden_size = the target's n_embd), the feature layers (each in [0, the
 * target's layer count]), and where the head borrows the target's embedding or head,
 * n_embd and the vocabulary.  TANDEM_ERR_MISMATCH naming both (head_name,
 * target_name). */
tandem_status tdm_eagle3_check_target(const tdm_eagle3_hparams *ep, const char *head_name, const tdm_hparams *target,
                                      const char *target_name, tdm_err *err);
/* Pairs a loaded head with a loaded target (whole, on a backend of the head's kind:
 * an engine runs both on its own): the check above,
 * then the target's embedding / head where the file has none. */
tandem_status tdm_eagle3_pair(tdm_eagle3 *h, const tdm_model *target, tdm_err *err);

/* ------------------------------------------------------------- forward */

/* The head's activations, grown on demand (backend memory). */
typedef struct tdm_eagle3_scratch {
    tdm_backend *be;
    int32_t cap;
    float *g;      /* [cap][n_embd] the fused features (tdm_eagle3_fuse's output when asked) */
    float *x;      /* [cap][n_embd] the residual stream */
    float *xe;     /* [cap][n_embd] the normed embedding, then the normed FFN input */
    float *xg;     /* [cap][n_embd] the normed g */
    float *qkv;    /* [cap][qd + 2 kvd] */
    float *att;    /* [cap][qd] */
    float *gu;     /* [cap][2 n_ff] */
    float *ff;     /* [cap][n_ff] */
    float *enc;    /* [cap][3T] the normed features (norm_before_fc only) */
    float *sub;    /* [cap][n_draft_vocab] the draft vocabulary's logits (with d2t) */
    int32_t *ids;  /* [cap] host: the rows that want logits */
} tdm_eagle3_scratch;

void tdm_eagle3_scratch_free(tdm_eagle3_scratch *s);

/* g[n][n_embd] = fc(feat[n][3T]) (through enc_norm with norm_before_fc): the encoder.
 * feat and g in backend memory. */
tandem_status tdm_eagle3_fuse(const tdm_eagle3 *h, tdm_backend *be, tdm_eagle3_scratch *s, const float *feat, int32_t n,
                              float *g, tdm_err *err);

/* The decoder over a batch (the head paired): row i embeds batch->token[i] (a target
 * id) with g[i] ([n][n_embd], backend memory: fused features, or a previous level's
 * h), writes its K/V into kv (the head's one layer, tdm_kv_store_init with h->m) at
 * its slot and attends as the batch says (a tree's masks too); h_out[n][n_embd]
 * (may be NULL) receives every row's pre-norm output; logits[n_logits][n_vocab] the
 * rows with want_logits, over the whole target vocabulary: d2t's ids scored,
 * TDM_LOGIT_NONE elsewhere. */
tandem_status tdm_eagle3_forward(const tdm_eagle3 *h, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                 const tdm_kv_seq *const *seqs, tdm_eagle3_scratch *s, const float *g, float *h_out,
                                 float *logits, tdm_err *err);

#endif
