/* synth.h - random-weight models with the shapes of real ones, for speed
 * measurements (`tandem synth`).
 *
 * A synthetic model is a GGUF v3 file that tandem and llama.cpp both load: the
 * llama architecture (RMSNorm, RoPE in the "normal" GGUF layout, SwiGLU, no biases,
 * an untied output.weight unless the shape ties it; Llama 3.2's rope_freqs), or
 * the qwen3 / gemma3 architecture with their extra norms (f32 of 1.0, as the norms
 * of the other shapes), or a mixture of experts (qwen3moe, or llama with experts:
 * Mixtral; llama.cpp's layout, the router f32 and random as llama.cpp's quantiser
 * leaves it), every matrix of one type (f16, q8_0, q4_0, q4_k, q5_k or
 * q6_k) or the types of a quantize.h mix (q4_k_m, q5_k_m: q6_k output, attn_v and
 * ffn_down where llama.cpp's mix puts them), f32 norms of 1.0, and a tokenizer (synthesised, or copied from another GGUF);
 * or an EAGLE-3 draft head (architecture eagle3) for a target of such a shape.  Matrix
 * entries are uniform with standard deviation 0.5 / sqrt(cols), so activations stay
 * well-conditioned in f32 and in f16.  The data is a random tile per type and row
 * length, repeated through the tensors (each tensor starts at another block of its
 * tile): writing 13 GB costs little more than the disk's time.  Everything is
 * deterministic given the seed.
 */
#ifndef TDM_SYNTH_H
#define TDM_SYNTH_H

#include "common.h"
#include "gguf_write.h"
#include "quantize.h"

typedef struct tdm_synth_shape {
    const char *name;
    int32_t n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, n_ctx;
    float rope_base;
    bool hidden;           /* a test shape, left out of listings */
    const char *arch;      /* "llama" (NULL), "qwen3" (+ q / k norms) or "gemma3" (+ q / k norms,
                              post norms) */
    int32_t head_dim;      /* the heads' size (attention.key_length); 0: n_embd / n_head */
    bool tied;             /* no output.weight: the head is token_embd */
    bool rope_freqs;       /* llama: rope_freqs.weight, Llama 3.1's divisors (factor 32, low /
                              high frequency factors 1 / 4, original context 8192) */
    int32_t sliding_window; /* gemma3's attention.sliding_window */
    int32_t n_expert;      /* > 0: a mixture of experts ("qwen3moe", or "llama" with experts:
                              Mixtral) of this many experts per layer, instead of the dense FFN */
    int32_t n_expert_used; /* experts per token (expert_used_count) */
    int32_t n_ff_exp;      /* qwen3moe: each expert's features (expert_feed_forward_length; n_ff
                              is then the feed_forward_length its files carry); 0: n_ff */
    /* "eagle3": an EAGLE-3 draft head for a target of n_vocab tokens and hidden size
     * n_embd (llama.cpp's layout, src/model/eagle3.h; n_layer 1, no token_embd: the
     * target's), its lm_head over n_draft_vocab tokens (< n_vocab: with a d2t table,
     * the target ids floor(j * n_vocab / n_draft_vocab)) */
    int32_t n_draft_vocab;
    int32_t feat_layers[3]; /* eagle3.target_layers */
    bool own_embd;          /* eagle3: its own token_embd.weight [n_embd, n_vocab] */
} tdm_synth_shape;

/* The shape table (*n entries) and a lookup by name (NULL when unknown). */
const tdm_synth_shape *tdm_synth_shapes(size_t *n);
const tdm_synth_shape *tdm_synth_shape_find(const char *name);

/* Progress: bytes written so far of the file's total; return false to cancel. */
typedef bool (*tdm_synth_progress_fn)(void *ctx, uint64_t done, uint64_t total);

typedef struct tdm_synth_opts {
    const tdm_synth_shape *shape;
    uint32_t type;               /* every matrix: TDM_F16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_K, TDM_Q5_K or
                                    TDM_Q6_K (ignored when kind is set) */
    const tdm_quant_kind *kind;  /* NULL, or a quantize.h kind whose per-tensor rules give the types */
    uint64_t seed;
    const char *tokenizer_from;  /* GGUF whose tokenizer.* keys are copied; NULL: synthesise */
    size_t tile_bytes;           /* random data per tile; 0: TDM_SYNTH_TILE_BYTES */
    bool overwrite;              /* replace an existing output file */
    tdm_synth_progress_fn progress; /* may be NULL */
    void *progress_ctx;
} tdm_synth_opts;

#define TDM_SYNTH_TILE_BYTES ((size_t)16 << 20)

/* What a model of these options holds. */
typedef struct tdm_synth_info {
    uint64_t n_tensors, n_params, file_bytes;
} tdm_synth_info;

/* The GGUF file type (general.file_type) of a matrix type: F16 1, Q8_0 7, Q4_0 2,
 * Q4_K 14, Q5_K 16, Q6_K 18; 0 for a type synth does not write. */
uint32_t tdm_synth_file_type(uint32_t type);

/* A writer holding the model's metadata and tensor infos (no data), ready to stream.
 * Fails on a bad type, an unreadable tokenizer file (TANDEM_ERR_IO / FORMAT) or one
 * whose token count is not the shape's vocabulary (TANDEM_ERR_MISMATCH). */
tandem_status tdm_synth_plan(const tdm_synth_opts *o, tdm_gguf_writer **out, tdm_synth_info *info,
                             tdm_err *err);

/* Writes the model to path: to "path.tmp" first, renamed at the end, so an
 * interrupted or failed run never leaves a partial file at path (the temporary file
 * is removed on failure).  Refuses an existing path unless o->overwrite.  Errors name
 * the file and the OS error; TANDEM_ERR_CANCELLED when the progress callback said
 * stop.  info (may be NULL) gets the sizes. */
tandem_status tdm_synth_write(const tdm_synth_opts *o, const char *path, tdm_synth_info *info, tdm_err *err);

/* The tokenizer.* keys of a synthetic SentencePiece vocabulary of exactly n_vocab
 * tokens (n_vocab >= 260), which tandem's and llama.cpp's "llama" tokenizers load:
 * <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF>, then "▁", the printable ASCII
 * characters and "▁"-prefixed and bare lower-case letter strings, shortest first
 * (scores falling in that order).  bos 1, eos 2, unk 0, add_bos true. */
tandem_status tdm_synth_vocab(tdm_gguf_writer *w, int32_t n_vocab, tdm_err *err);

#endif
