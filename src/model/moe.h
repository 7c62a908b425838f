/* moe.h - the router of a mixture-of-experts layer (qwen3moe, Mixtral), as
 * llama.cpp's build_moe_ffn runs it for these architectures: softmax over the
 * experts' logits (in f32 with the sum in double, as ggml's soft_max), the k
 * largest probabilities, and those probabilities renormalised to sum to 1 (the sum
 * clamped below at 6.103515625e-5, as llama.cpp does).  Ties go to the lower
 * expert index, as a stable descending sort orders them: what llama.cpp's CPU
 * argsort_top_k gives up to 16 experts (std::sort's insertion sort; beyond 16 its
 * order of ties is unspecified).  Both architectures gate by softmax with
 * renormalised weights whatever else the file says (llama.cpp reads no gating key
 * for them). */
#ifndef TDM_MOE_H
#define TDM_MOE_H

#include <stdint.h>

/* One row: logits[n_expert] -> ids[k] (distinct experts, most probable first) and
 * w[k] their weights.  1 <= k <= n_expert <= TDM_MAX_EXPERTS (model.h).  Non-finite
 * logits give non-finite weights (the forward's logits then report them), never an
 * id outside [0, n_expert). */
void tdm_moe_route(const float *logits, int32_t n_expert, int32_t k, int32_t *ids, float *w);

#endif
