/* batch_verify.h - the verdict on one greedy sequence's chain verified inside a
 * batched forward (batch_verify.c). */
#ifndef TDM_BATCH_VERIFY_H
#define TDM_BATCH_VERIFY_H

#include "engine.h"

/* draft[0..k) was verified: target[0..k] are the target's argmaxes at rows
 * [pending token, draft[0], ..., draft[k-1]].  Accepts the longest agreeing prefix,
 * rolls both models back to it with one truncate, commits it and the target's next
 * token, and records the step in the sequence's controller and statistics (draft_s
 * and verify_s: the step's phase times).  Returns the tokens accepted. */
int32_t tdm_verify_commit_greedy(tdm_engine *e, tdm_seq *s, const int32_t *draft, int32_t k, const int32_t *target,
                                 double draft_s, double verify_s);

#endif
