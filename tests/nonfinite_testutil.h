/* nonfinite_testutil.h - models with a NaN or an infinity planted in one weight, and the
 * check that generation on them is a model error (test_nonfinite.c on the CPU's SIMD
 * levels, test_backend_cuda.c on the GPU). */
#ifndef TDM_NONFINITE_TESTUTIL_H
#define TDM_NONFINITE_TESTUTIL_H

#include <stdint.h>

#include "tandem.h"

/* For every case (llama f32, q8_0 and f16, qwen2, gemma3 with soft-caps, qwen3moe's
 * router and experts on the CPU; each tensor of
 * layer 0, one of layer 1, the output norm and the heads, tied and untied), NaN and
 * +inf planted in the target and then in the draft (a sound model of the same shape
 * beside it): generation fails with TANDEM_ERR_FORMAT "non-finite logits" naming the
 * broken model (target / draft and its file) and returns no tokens, greedy and
 * sampled, target only and speculative (chains; trees with a draft); the sound pair
 * then generates.  Models open with mp (NULL: defaults); head_dim > 0 sets the heads'
 * size (attention kernels that need one); the prompt is n_prompt (1..64) tokens;
 * where (the backend and level) goes into the failure messages. */
void tdm_nf_check_all(const char *where, const tandem_model_params *mp, int32_t head_dim, int32_t n_prompt);

#endif
