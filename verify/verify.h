/* verify.h - a drafted chain's verification by the target alone (verify.c): one
 * target forward, the acceptance rule, the verdict. */
#ifndef TDM_VERIFY_H
#define TDM_VERIFY_H

#include "engine.h"
#include "spec_ws.h"
#include "verdict.h"

/* Scores the chain draft[0..k) after s's committed tokens with one target forward
 * over [pending token, draft...] and returns the verdict: greedy by agreement with
 * the target's argmaxes (accept.h); sampled by rejection sampling against the
 * draft's q rows (Leviathan et al.; on the device where the engine samples there:
 * the first n_q_dev rows of ws->q_dev are the draft model's, the rest one-hot
 * lookups; else the host rows of ws->qprobs).  Consumes the draws the rule used from
 * s's generator; changes nothing else of s (sched/commit.c commits the verdict). */
tandem_status tdm_verify_chain(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, const int32_t *draft, int32_t k, int32_t n_q_dev,
                               tdm_verdict *v, tdm_err *err);

#endif
