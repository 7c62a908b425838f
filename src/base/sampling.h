/* sampling.h - logits processing, seeded random numbers, token sampling.
 *
 * The processed distribution (temperature, then top-k, top-p, min-p filters) is
 * built as a dense probability vector over the vocabulary, because speculative
 * sampling needs p and q for the same tokens.  temperature <= 0 means greedy: the
 * distribution is one-hot on the argmax (lowest id on ties).
 *
 * Order: softmax(logits / temperature); top-k keeps the k most probable tokens (ties:
 * lower id first); top-p keeps the smallest prefix, by probability descending (ties:
 * lower id first), whose mass is >= top_p times the mass that survived top-k (at least
 * one token); min-p keeps tokens with p >= min_p * p_max; the survivors are
 * renormalised and every filtered token is exactly 0.
 */
#ifndef TDM_SAMPLING_H
#define TDM_SAMPLING_H

#include "common.h"

typedef struct tdm_sampler_params {
    float temperature;  /* <= 0: greedy */
    int32_t top_k;      /* <= 0: off */
    float top_p;        /* >= 1: off */
    float min_p;        /* <= 0: off; keep tokens with p >= min_p * p_max */
} tdm_sampler_params;

/* xoshiro256** seeded by splitmix64: same seed, same stream, on every platform. */
typedef struct tdm_rng {
    uint64_t s[4];
} tdm_rng;

void tdm_rng_seed(tdm_rng *rng, uint64_t seed);
uint64_t tdm_rng_next(tdm_rng *rng);
double tdm_rng_uniform(tdm_rng *rng); /* [0, 1), 53 random bits */

int32_t tdm_argmax(const float *logits, int32_t n); /* lowest index on ties; NaN never wins; -1 if n <= 0 */

/* Whether every logit is finite (no NaN, no infinity): one vectorised pass. */
bool tdm_logits_finite(const float *logits, int32_t n);
/* tdm_argmax, or -1 when a logit is not finite (a broken model: no token). */
int32_t tdm_argmax_finite(const float *logits, int32_t n);
/* Token masks (grammar-constrained decoding): l[i] = fill for every i < n whose bit
 * (i % 32 of mask[i / 32], (n + 31) / 32 words) is clear; the others unchanged.  The
 * reference of the backends' mask_rows op. */
void tdm_logits_mask(float *l, int32_t n, const uint32_t *mask, float fill);
/* The first largest logit among the tokens whose bit in mask is set (a grammar's
 * greedy token), without writing l; -1 when a logit of the whole row is not finite
 * or no token is allowed. */
int32_t tdm_argmax_masked(const float *l, int32_t n, const uint32_t *mask);

/* The largest probability of softmax(logits): 1 / sum_i exp(l_i - max), in one
 * vectorised pass without writing the distribution (the draft's p_min test).  NaN
 * and -inf logits count as 0; returns 0 when no logit is finite or +inf, and 1 /
 * (count of +inf logits) when some are +inf. */
float tdm_top_prob(const float *logits, int32_t n);

/* Scratch space for tdm_probs_from_logits (reusable; sized for n_vocab). */
typedef struct tdm_sampler_scratch {
    int32_t n_vocab;
    int32_t *idx;   /* [n_vocab] */
    float *val;     /* [n_vocab] */
} tdm_sampler_scratch;

tandem_status tdm_sampler_scratch_init(tdm_sampler_scratch *s, int32_t n_vocab, tdm_err *err);
void tdm_sampler_scratch_free(tdm_sampler_scratch *s);

/* probs[n_vocab] = the processed distribution (sums to 1; filtered tokens are 0). */
void tdm_probs_from_logits(const float *logits, int32_t n_vocab, const tdm_sampler_params *p,
                           tdm_sampler_scratch *s, float *probs);

/* Draws from a distribution (need not be normalised; sum must be > 0).
 * Uses exactly one tdm_rng_uniform draw.  Never returns a token with probability <= 0;
 * returns -1 when no entry is positive. */
int32_t tdm_sample_probs(const float *probs, int32_t n, tdm_rng *rng);
/* The same draw with the uniform u in [0, 1) given (tdm_sample_probs(p, n, rng) ==
 * tdm_sample_probs_u(p, n, the uniform rng gives)). */
int32_t tdm_sample_probs_u(const float *probs, int32_t n, double u);

/* Convenience: greedy argmax when temperature <= 0, else process and sample. */
int32_t tdm_sample_logits(const float *logits, int32_t n_vocab, const tdm_sampler_params *p,
                          tdm_sampler_scratch *s, float *probs_tmp, tdm_rng *rng);

#endif
