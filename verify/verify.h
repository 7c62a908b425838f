/* verify.h - rejection sampling's verdict on a drafted chain (verify.c).  The
 * scheduler runs the target forward over [pending token, draft...]; a greedy chain's
 * verdict is agreement with the target's argmaxes (accept.h), a sampled one's in a
 * batch agreement with the target's own draws (sched/step.c). */
#ifndef TDM_VERIFY_H
#define TDM_VERIFY_H

#include "engine.h"
#include "spec_ws.h"
#include "verdict.h"

/* The verdict on draft[0..k) after s's committed tokens whose k + 1 target logits
 * rows are rows [row0, row0 + k] of the latest target forward, by rejection
 * sampling against the draft's q rows (Leviathan et al.; accept.h): kind
 * TDM_FWD_LOGITS_DEV, on the device, the first n_q_dev rows of ws->q_dev the draft
 * model's and the rest one-hot lookups; TDM_FWD_LOGITS, the host rows of
 * ws->qprobs.  Consumes the draws the rule used from s's generator; changes nothing
 * else of s (sched/commit.c commits the verdict). */
tandem_status tdm_verify_reject(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, const int32_t *draft, int32_t k,
                                int32_t n_q_dev, int32_t row0, tdm_fwd_kind kind, tdm_verdict *v, tdm_err *err);

#endif
