/* batch_chain.h - greedy draft chains for the greedy sequences of a batch, one
 * draft forward per round (batch_chain.c). */
#ifndef TDM_BATCH_CHAIN_H
#define TDM_BATCH_CHAIN_H

#include "batch_ctrl.h"
#include "engine.h"

/* Drafts k[i] tokens (0 = none) after seqs[i]'s committed tokens, greedily, into
 * draft[i * TDM_CTRL_MAX_K + 0 .. k[i]).  Every sequence's blocks must already back
 * positions up to n_tokens + k[i] - 2 (the draft writes its K/V there); n_draft
 * becomes n_tokens + k[i] - 1.  Scratch: kv [n], who and slot [e->n_logit_rows].
 * round_cost (optional) receives the time of each later round's forward by its
 * rows. */
tandem_status tdm_draft_batch_greedy(tdm_engine *e, tdm_seq *const *seqs, int32_t n, const int32_t *k,
                                     int32_t *draft, const tdm_kv_seq **kv, int32_t *who, int32_t *slot,
                                     tdm_rowcost *round_cost, tdm_err *err);

#endif
