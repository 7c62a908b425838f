/* tiny_model.h - random-weight llama models built by the tests themselves
 * (GGUF written in memory with gguf_write, then saved to a temp file). */
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
    const char *arch;     /* "llama" (default) or "qwen2" */
    int32_t eos;          /* EOS token id, or -1 for none */
    /* Optional extensions; the zero value of each keeps the default behaviour. */
    bool untied_output;   /* write a separate random output.weight (default: tied to token_embd) */
    float rope_scale;     /* > 0: write rope.scaling.type "linear" with this factor */
    int32_t tok_offset;   /* token i is the character '!' + tok_offset + i (n_vocab + offset <= 94) */
    const char *skip_tensor;      /* tensor name left out of the file (NULL: none) */
    const char *bad_shape_tensor; /* tensor written with one extra row (NULL: none) */
    const char *nan_tensor;       /* tensor whose first value is NaN (NULL: none) */
    uint32_t attn_v_type;         /* attn_v.weight's type (0: wtype), for mixes like Q4_K_M */
    uint32_t ffn_down_type;       /* ffn_down.weight's type (0: wtype) */
} tdm_tiny_cfg;

tdm_tiny_cfg tdm_tiny_default(void);

/* Writes the model to a new temp file; returns its malloc'ed path (unlink + free). */
char *tdm_tiny_model_file(const tdm_tiny_cfg *cfg);

#endif
