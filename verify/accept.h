/* accept.h - acceptance rules for verifying a drafted chain against the target.
 *
 * Greedy: accept drafted tokens while each equals the target's argmax at its
 * position; then emit the target's argmax at the first mismatch (the correction) or
 * after the last drafted token (the bonus).  Output equals target-only greedy.
 *
 * Sampling (Leviathan et al. 2023; Chen et al. 2023): drafted token x_i, drawn from
 * q_i, is accepted with probability min(1, p_i(x)/q_i(x)); on the first rejection the
 * emitted token is drawn from normalize(max(0, p_i - q_i)); when all k are accepted
 * the bonus token is drawn from p_k.  p and q are the processed distributions
 * (same temperature/top-k/top-p/min-p).  The output has exactly the target's
 * distribution.
 */
#ifndef TDM_ACCEPT_H
#define TDM_ACCEPT_H

#include "sampling.h"

/* Greedy.  draft[k]; target_argmax[k + 1] (argmax of the target at each verified
 * position).  Returns n_accepted in [0, k]; *next = target_argmax[n_accepted]. */
int32_t tdm_accept_greedy(const int32_t *draft, int32_t k, const int32_t *target_argmax,
                          int32_t *next);

/* Probability of accepting a drafted token with target prob px and draft prob qx:
 * min(1, px/qx).  px <= 0: 0 (always reject).  qx <= 0 < px: 1 (the limit of px/qx;
 * such a token cannot have been drawn from q, so this never changes the output
 * distribution). */
double tdm_accept_prob(float px, float qx);

/* residual[n] = normalize(max(0, p - q)).  If p - q has no positive mass (p == q),
 * residual = p (the case cannot arise in sampling then, but the result is a
 * distribution).  Returns the unnormalised mass sum(max(0, p - q)). */
double tdm_residual_dist(const float *p, const float *q, int32_t n, float *residual);

/* Sampling.  draft[k]; p: [k + 1][n_vocab] target distributions; q: [k][n_vocab] draft
 * distributions; scratch: [n_vocab] (may be NULL).  Returns n_accepted in [0, k]; *next
 * is the correction or bonus token.  Uses exactly one rng draw per accept decision (in
 * order) plus one for the emitted token, so results are reproducible. */
int32_t tdm_accept_sample(const int32_t *draft, int32_t k, const float *p, const float *q,
                          int32_t n_vocab, tdm_rng *rng, float *scratch, int32_t *next);

#endif
