/* batch_verify.h - the verdict on one sequence's chain verified inside a batched
 * forward (batch_verify.c). */
#ifndef TDM_BATCH_VERIFY_H
#define TDM_BATCH_VERIFY_H

#include "engine.h"

/* draft[0..k) was verified (k = 0: a plain step): target[0..k] are the target's
 * tokens at rows [pending token, draft[0], ..., draft[k-1]], each its argmax when
 * the sequence is greedy, else drawn with the uniform its position would use
 * without speculation (the draft drew draft[d] with the same uniform).  Accepts the
 * longest prefix of the chain that agrees, rolls both models back to it with one
 * truncate, commits it and the target's next token, consumes one uniform per
 * token committed, and records the step in the sequence's controller (ngram: the
 * lookup's) and statistics (draft_s and verify_s: the step's phase times).
 *
 * The committed tokens are the target's own at every position, so the output is
 * token for token the output of decoding without speculation, greedy or sampled;
 * for a sampled sequence a drafted token survives with the probability that the
 * two draws agree (which the shared uniform makes likely where p and q are close),
 * at most min over p, q's overlap, rather than the optimum of rejection sampling
 * (verify/accept.h), in exchange for output that does not depend on the batch.
 * Returns the tokens accepted. */
int32_t tdm_verify_commit_match(tdm_engine *e, tdm_seq *s, const int32_t *draft, int32_t k, const int32_t *target,
                                bool ngram, double draft_s, double verify_s);

#endif
