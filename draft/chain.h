/* chain.h - a lone sequence's chain proposal by the draft model (chain.c). */
#ifndef TDM_CHAIN_H
#define TDM_CHAIN_H

#include "engine.h"
#include "spec_rec.h"
#include "spec_ws.h"

/* Proposes up to k tokens after the committed sequence; fills draft[0..*n_drafted)
 * and, when sampling, q rows (in ws->qprobs on the host; on the device in ws->q_dev,
 * its first *n_model rows the model's).  The first *n_model tokens come from the
 * draft model, which runs *n_model forward passes (a catch-up pass, then one per
 * token but the last; *n_forwards of them in all, which is k on a backend that
 * drafts on the device).  With n-gram lookup on, once a drafted prefix makes a
 * lookup match the chain is completed from the match instead (up to k_ext tokens
 * in all) when the controller expects that to pay. */
tandem_status tdm_draft_chain(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, int32_t k, int32_t k_ext, int32_t *draft,
                              int32_t *n_drafted, int32_t *n_model, int32_t *n_forwards, tdm_err *err);
/* Fills the q rows [from, from + n) of ws->qprobs one-hot on draft[from ..] (the
 * distribution of a lookup proposal) when the request samples on the host (device
 * q rows past the model's are one-hot already). */
void tdm_draft_onehot_q(const tdm_engine *e, tdm_spec_ws *ws, const tdm_seq *s, const int32_t *draft, int32_t from, int32_t n);

#endif
