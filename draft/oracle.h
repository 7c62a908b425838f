/* oracle.h - BENCHMARK ONLY: controlled acceptance at real cost (oracle.c).
 *
 * With tandem_generate_params.bench_oracle_tokens set (the target's own greedy
 * continuation of the prompt, from a target-only run), the draft still runs its
 * real forward at its real shape, but at each drafted position whose path so far
 * is the target's continuation its candidates (best first) are rearranged: the
 * target's next token is the first candidate with probability alpha; otherwise,
 * with probability 1/2 it is the second (so a tree can catch it), else it is not
 * proposed at all.  Positions off that path keep the draft's own candidates.  A
 * dynamic tree weighs candidate rank 0 alpha, rank 1 (1 - alpha) / 2 and the rest
 * the remainder (as a draft calibrated to this acceptance would; a random-weight
 * draft's own probabilities are flat).  Greedy chains on a backend that drafts on
 * the device stay there (draft/chain.c): the on-path positions' tokens are known
 * before the chain runs, and the first off-path position takes the draft's best
 * token other than the truth (-FLT_MAX added to its logit on the device), so the
 * chain costs what an unmodified one does.
 * Verification, acceptance and commit run unchanged, so the output is still the
 * target's own and every cost is real; only the acceptance is controlled.  Greedy,
 * single-sequence steps only (a request with it needs greedy decoding and an
 * engine of one sequence).  Never a default. */
#ifndef TDM_ORACLE_H
#define TDM_ORACLE_H

#include <stdbool.h>
#include <stdint.h>

#include "sampling.h"

/* Where the truth goes among one position's candidates: 0 (first) with
 * probability alpha, else 1 (second) or -1 (nowhere) alike; draws two uniforms. */
int32_t tdm_oracle_rank(double alpha, tdm_rng *rng);
/* The candidates of one position: own[0..n_own) the draft's ranking (best first,
 * distinct), truth the target's token there; writes k candidates to out (fewer when
 * own runs short), drawing two uniforms from rng. */
int32_t tdm_oracle_arrange(int32_t truth, double alpha, tdm_rng *rng, const int32_t *own, int32_t n_own, int32_t k,
                           int32_t *out);

#endif
