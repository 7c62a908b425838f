/* rope.h - RoPE frequency tables from a model's metadata (kernels/backend.h,
 * tdm_rope_params), computed as llama.cpp's ggml_rope_ext computes its angles.
 *
 * For pair t < n_rot / 2 of a head (llama.cpp's rope_yarn, ggml-cpu):
 *   extrap = base^(-2t / n_rot) / ff[t]          (ff: Llama 3's rope_freqs, else 1)
 *   interp = freq_scale * extrap                  (freq_scale = 1 / rope.scaling.factor)
 *   yarn (ext_factor != 0): mix = ext_factor * ramp(t), ramp(t) = 1 - clamp((t - lo) /
 *     max(0.001, hi - lo), 0, 1) with [lo, hi] ggml_rope_yarn_corr_dims(n_rot,
 *     n_ctx_orig, base, beta_fast, beta_slow); freq[t] = interp (1 - mix) + extrap mix
 *   otherwise freq[t] = interp
 *   mscale = attn_factor (1 + 0.1 ln(1 / freq_scale)) under yarn, else attn_factor.
 * The angle of a position p is p * freq[t]: every scaling is a table and a magnitude.
 */
#ifndef TDM_ROPE_H
#define TDM_ROPE_H

#include "common.h"

typedef enum tdm_rope_scaling_type {
    TDM_ROPE_SCALING_NONE = 0,
    TDM_ROPE_SCALING_LINEAR = 1,
    TDM_ROPE_SCALING_YARN = 2,
} tdm_rope_scaling_type;

/* The scaling a model's metadata gives, resolved as llama.cpp resolves it (its
 * llama_context's cparams with default context parameters). */
typedef struct tdm_rope_scaling {
    uint32_t type;        /* tdm_rope_scaling_type */
    float factor;         /* rope.scaling.factor (1: none) */
    int32_t n_ctx_orig;   /* yarn: rope.scaling.original_context_length, default context_length */
    float ext_factor;     /* yarn: 1, else 0 */
    float attn_factor;    /* cparams.yarn_attn_factor: rope.scaling.attn_factor (default 1), under
                             yarn times get_mscale(factor) / (1 + 0.1 ln factor) */
    float beta_fast, beta_slow; /* llama.cpp's defaults: 32, 1 */
} tdm_rope_scaling;

/* Resolves the scaling of `type` with rope.scaling.factor `factor` (> 0),
 * rope.scaling.attn_factor `attn_factor` (> 0) and the yarn original context
 * n_ctx_orig. */
tdm_rope_scaling tdm_rope_scaling_make(uint32_t type, float factor, float attn_factor, int32_t n_ctx_orig);

/* The magnitude of a layer whose frequency scale is freq_scale. */
float tdm_rope_mscale(const tdm_rope_scaling *s, float freq_scale);

/* freq[t] for t < n_rot / 2 (see above) of a layer with theta base `base` and
 * frequency scale freq_scale (1 / factor; gemma3's sliding-window layers: 1);
 * ff: [n_rot / 2] per-pair divisors (> 0), or NULL. */
void tdm_rope_table(const tdm_rope_scaling *s, int32_t n_rot, float base, float freq_scale, const float *ff,
                    double *freq);

#endif
