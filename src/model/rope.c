/* rope.c - RoPE frequency tables from a model's metadata (rope.h). */
#include "rope.h"

#include <math.h>

tdm_rope_scaling tdm_rope_scaling_make(uint32_t type, float factor, float attn_factor, int32_t n_ctx_orig) {
    tdm_rope_scaling s = {.type = type, .factor = factor, .n_ctx_orig = n_ctx_orig, .beta_fast = 32.0f,
                          .beta_slow = 1.0f};
    s.ext_factor = type == TDM_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    s.attn_factor = 1.0f;
    if (s.ext_factor != 0.0f) {
        /* llama_context: yarn_attn_factor = get_mscale(factor) (1 below a factor of 1),
         * then the 1 + 0.1 ln(factor) that ggml's rope_yarn multiplies in is cancelled */
        const float mscale = factor <= 1.0f ? 1.0f : 0.1f * logf(factor) + 1.0f;
        s.attn_factor = mscale * (1.0f / (1.0f + 0.1f * logf(factor)));
    }
    s.attn_factor *= attn_factor;
    return s;
}

float tdm_rope_mscale(const tdm_rope_scaling *s, float freq_scale) {
    if (s->ext_factor == 0.0f) return s->attn_factor;
    return s->attn_factor * (1.0f + 0.1f * logf(1.0f / freq_scale));
}

/* ggml_rope_yarn_corr_dim: the dimension at which n_ctx_orig positions make n_rot_
 * full rotations (computed in float, as ggml does, so the floor / ceil below land on
 * the same integers). */
static float corr_dim(int32_t n_dims, int32_t n_ctx_orig, float n_rot_, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot_ * 2.0f * (float)M_PI)) / (2.0f * logf(base));
}

void tdm_rope_table(const tdm_rope_scaling *s, int32_t n_rot, float base, float freq_scale, const float *ff,
                    double *freq) {
    float lo = 0, hi = 0;
    if (s->ext_factor != 0.0f) {
        lo = fmaxf(0.0f, floorf(corr_dim(n_rot, s->n_ctx_orig, s->beta_fast, base)));
        hi = fminf((float)(n_rot - 1), ceilf(corr_dim(n_rot, s->n_ctx_orig, s->beta_slow, base)));
    }
    for (int32_t t = 0; t < n_rot / 2; t++) {
        const double extrap = pow((double)base, -2.0 * t / n_rot) / (ff ? (double)ff[t] : 1.0);
        const double interp = (double)freq_scale * extrap;
        double f = interp;
        if (s->ext_factor != 0.0f) {
            const float y = ((float)t - lo) / fmaxf(0.001f, hi - lo);
            const double mix = (double)((1.0f - fminf(1.0f, fmaxf(0.0f, y))) * s->ext_factor);
            f = interp * (1.0 - mix) + extrap * mix;
        }
        freq[t] = f;
    }
}
