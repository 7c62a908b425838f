/* ref_forward.h - an independent reference forward pass for the tests: it reads a
 * GGUF itself (src/gguf/gguf.h), dequantises every weight with tdm_row_to_f32 and runs
 * the textbook llama / qwen2 / qwen3 / gemma3 forward in double precision over a
 * whole token sequence (causal attention, no KV cache; qwen3moe / Mixtral experts:
 * softmax router, top k with ties to the lower index, renormalised weights), with its own RoPE frequency
 * tables (Llama 3's rope_freqs, linear and YaRN scaling, written after Hugging Face
 * transformers' rope utilities), sliding-window masks, soft-caps and GeGLU.
 *
 * Nothing here calls the engine's code beyond the GGUF reader and the
 * dequantisation, so a wrong reading of a key or a wrong formula on either side
 * shows up as a difference. */
#ifndef TDM_REF_FORWARD_H
#define TDM_REF_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

typedef struct ref_layer {
    float *attn_norm, *ffn_norm; /* [E] */
    float *wq;                   /* [H*hd][E] */
    float *wk, *wv;              /* [Hkv*hd][E] */
    float *bq;                   /* [H*hd] or NULL */
    float *bk, *bv;              /* [Hkv*hd] or NULL */
    float *q_norm, *k_norm;      /* [hd] or NULL (qwen3, gemma3) */
    float *wo;                   /* [E][H*hd] */
    float *post_attn, *post_ffn; /* [E] or NULL (gemma3) */
    float *wg, *wu;              /* [F][E] (experts: [NE][F][E]) */
    float *wd;                   /* [E][F] (experts: [NE][E][F]) */
    float *router;               /* [NE][E] (mixture of experts), or NULL */
    bool swa;                    /* attends within the sliding window, with the local RoPE */
} ref_layer;

typedef struct ref_model {
    char arch[16];
    int E, L, H, Hkv, hd, F, V, n_rot;
    int NE, K;         /* mixture of experts: experts per layer (0: dense) and per row; F is
                          each expert's size */
    double eps;
    bool neox;         /* qwen2 / qwen3 / gemma3: rotate (i, i + n_rot/2); llama: (2i, 2i+1) */
    bool tied;         /* no output.weight: the head is token_embd */
    bool gelu;         /* gemma3: GeGLU (tanh GELU); else SwiGLU */
    double embd_scale; /* gemma3: sqrt(E); else 1 */
    double attn_scale; /* softmax scale */
    double attn_softcap, final_softcap; /* 0 = off */
    int window;        /* sliding window of the swa layers (0: none) */
    /* RoPE: the parameters the tables are made from (ref_rope_tables), and the tables */
    double base, base_swa;     /* theta bases of the global / sliding-window layers */
    double freq_scale;         /* 1 / rope.scaling.factor (global layers) */
    bool yarn;                 /* YaRN scaling of the global layers */
    int yarn_orig_ctx;         /* its original context */
    double attn_factor;        /* rope.scaling.attn_factor */
    float *rope_freqs;         /* [n_rot/2] Llama 3's divisors, or NULL */
    bool use_rope_freqs;       /* apply them (true when present; tests may turn it off) */
    double *freq, *freq_swa;   /* [n_rot/2] radians per position */
    double mscale, mscale_swa; /* magnitudes of cos / sin */
    float *tok_embd;           /* [V][E] */
    float *out_norm;           /* [E] */
    float *output;             /* [V][E] (== tok_embd when tied) */
    ref_layer *layers;         /* [L] */
} ref_model;

/* Reads the model (fails the test on anything it does not understand). */
void ref_load(const char *path, ref_model *m);
void ref_free(ref_model *m);
/* Recomputes freq / freq_swa / mscale* from the RoPE parameters above (after a test
 * changed one of them). */
void ref_rope_tables(ref_model *m);
/* Logits of every position of tok[0..n) (positions 0..n-1).  Returns [n][V]
 * (malloc'ed). */
double *ref_forward(const ref_model *m, const int32_t *tok, int n);

#endif
