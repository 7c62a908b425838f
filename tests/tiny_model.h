/* tiny_model.h - random-weight llama / qwen2 / qwen3 / gemma3 / qwen3moe models built by the
 * tests themselves (GGUF written in memory with gguf_write, then saved to a temp
 * file), with the tensors and keys llama.cpp's converter writes for each. */
#ifndef TDM_TINY_MODEL_H
#define TDM_TINY_MODEL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct tdm_tiny_cfg {
    int32_t n_vocab;      /* <= 90: token i is the single character '!' + i */
    int32_t n_embd, n_layer, n_head, n_head_kv, n_ff;
    uint32_t wtype;       /* weight dtype (tdm_dtype) for the matrices */
    float scale;          /* matrix weights uniform in [-scale, scale] */
    float emb_scale;      /* token embedding uniform in [-emb_scale, emb_scale] */
    uint64_t seed;
    const char *arch;     /* "llama" (default), "qwen2", "qwen3" (q / k norms) or "gemma3" (q / k
                             norms, post norms; give it sliding_window and >= 6 layers) */
    int32_t eos;          /* EOS token id, or -1 for none */
    /* Optional extensions; the zero value of each keeps the default behaviour. */
    bool untied_output;   /* write a separate random output.weight (default: tied to token_embd) */
    float rope_scale;     /* > 0: write rope.scaling.type "linear" with this factor */
    int32_t tok_offset;   /* token i is the character '!' + tok_offset + i (n_vocab + offset <= 94) */
    const char *skip_tensor;      /* tensor name left out of the file (NULL: none) */
    const char *bad_shape_tensor; /* tensor written with one extra row (NULL: none) */
    const char *nan_tensor;       /* tensor whose first value is NaN (NULL: none; q8_0: the
                                     first block's scale; f32, f16, bf16 or q8_0 only) */
    float nan_value;              /* with nan_tensor: the value planted instead of NaN (e.g.
                                     INFINITY; 0: NaN) */
    uint32_t attn_v_type;         /* attn_v.weight's type (0: wtype), for mixes like Q4_K_M */
    uint32_t ffn_down_type;       /* ffn_down.weight's type (0: wtype) */
    int32_t head_dim;             /* > 0: attention.key_length / value_length, the heads' size
                                     (0: n_embd / n_head, no key written) */
    float rope_base;              /* rope.freq_base (0: 10000) */
    const char *rope_type;        /* with rope_scale > 0: rope.scaling.type (NULL: "linear") */
    int32_t yarn_orig_ctx;        /* > 0: rope.scaling.original_context_length */
    float rope_attn_factor;       /* > 0: rope.scaling.attn_factor */
    int32_t rope_freqs_ctx;       /* > 0: rope_freqs.weight, Llama 3's per-pair divisors (factor 8,
                                     low / high frequency factors 1 / 4) for this original context */
    int32_t sliding_window;       /* > 0: attention.sliding_window; < 0: written as 0; 0: absent */
    float attn_softcap;           /* > 0: attn_logit_softcapping */
    float final_softcap;          /* > 0: final_logit_softcapping */
    uint32_t alignment;           /* general.alignment, a power of two (0: GGUF's default 32) */
    int32_t context_length;       /* > 0: the training context written (0: 256) */
    /* A mixture of experts ("llama": Mixtral's layout; "qwen3moe" needs it): n_expert
     * experts of n_ff features each per layer, n_expert_used per row; the router
     * blk.N.ffn_gate_inp [n_embd][n_expert] (f32) and ffn_{gate,up,down}_exps
     * instead of the dense FFN tensors. */
    int32_t n_expert, n_expert_used;
    bool zero_router;             /* the router's weights all 0: every expert ties */
    bool no_expert_used_key;      /* leave expert_used_count out */
    uint32_t exp_up_type;         /* ffn_up_exps's type (0: wtype) */
    const char *extra_expert_tensor; /* a 3-D tensor written with one expert too many */
    const char *flat_tensor;         /* a 3-D tensor written as 2-D [ne0, ne1 * ne2] */
} tdm_tiny_cfg;

tdm_tiny_cfg tdm_tiny_default(void);

/* Writes the model to a new temp file; returns its malloc'ed path (unlink + free). */
char *tdm_tiny_model_file(const tdm_tiny_cfg *cfg);

#endif
