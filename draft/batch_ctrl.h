/* batch_ctrl.h - the speculation length of a batch: one k for every greedy
 * sequence of a step, from measured costs.
 *
 * Costs: the seconds of a forward as a function of its row count, for the target
 * and for the draft (an EMA per row count up to TDM_ROWCOST_MAX, interpolated
 * between measured counts, extrapolated linearly beyond them).  For a batch of B
 * sequences with acceptance estimates alpha_i and room cap_i (tokens each may still
 * take), drafting k tokens each yields
 *     E(k)    = sum_i E[tokens](alpha_i, min(k, cap_i))
 *     T(k)    = k * t_draft(B) + t_target(sum_i (1 + min(k, cap_i)) + other)
 * and k = 0 (no speculation) E(0) = B, T(0) = t_target(B + other), where `other` are
 * the step's rows that do not speculate (prompt chunks, sampled sequences).  The
 * choice maximises E(k) / T(k).  As the batch grows the target's forward turns
 * compute-bound, t_target grows with its rows, and the choice falls to 0. */
#ifndef TDM_BATCH_CTRL_H
#define TDM_BATCH_CTRL_H

#include <stdint.h>

#define TDM_ROWCOST_MAX 1024
#define TDM_BATCH_SEQ_MAX 512 /* sequences one decision weighs at most */

typedef struct tdm_rowcost {
    double t[TDM_ROWCOST_MAX + 1]; /* [rows] seconds of a forward of that many rows (EMA), 0 = unmeasured */
    double ema;                    /* weight of a new sample, default 0.2 */
} tdm_rowcost;

void tdm_rowcost_init(tdm_rowcost *c);
void tdm_rowcost_observe(tdm_rowcost *c, int32_t rows, double seconds);
/* The estimate for rows (measured, interpolated or extrapolated); 0 when nothing is
 * measured yet. */
double tdm_rowcost_get(const tdm_rowcost *c, int32_t rows);

typedef struct tdm_batch_seq {
    double alpha;  /* acceptance estimate */
    int32_t cap;   /* most tokens it may draft this step (room, k_max) */
} tdm_batch_seq;

/* The k in [0, k_max] that maximises expected tokens per second (see the top of the
 * file) for n <= TDM_BATCH_SEQ_MAX sequences; k_max is the batch's limit (every sequence's cap limits only its own
 * rows).  0 until a plain step of about this size is measured; after that an
 * unmeasured larger row count is taken as dear as the largest measured one (flat),
 * so that an untried k looks cheap and gets tried once.  draft holds the seconds
 * of one drafting round by the number of sequences drafting. */
int32_t tdm_batch_choose_k(const tdm_rowcost *target, const tdm_rowcost *draft, const tdm_batch_seq *seqs,
                           int32_t n, int32_t other_rows, int32_t k_max);

/* What speculation actually delivered: an EMA of the greedy sequences' tokens per
 * second for each batch size and speculation length (the cost model above leaves
 * out what it does not see: host work, launches, a forward split by its logits
 * rows), which has the last word once measured. */
#define TDM_BATCH_RATE_B 256
#define TDM_BATCH_RATE_K 8

typedef struct tdm_batch_rates {
    double r[TDM_BATCH_RATE_B + 1][TDM_BATCH_RATE_K + 1]; /* [batch][k] tokens/s, 0 = unmeasured */
} tdm_batch_rates;

void tdm_batch_rates_init(tdm_batch_rates *t);
void tdm_batch_rates_observe(tdm_batch_rates *t, int32_t batch, int32_t k, double tokens_per_s);

/* The length for a batch of n greedy sequences: 0 until the plain step is measured at
 * this batch size; then the cost model's choice when its rate is not yet measured
 * (it is tried), else the best measured length.  k_max at most TDM_BATCH_RATE_K. */
int32_t tdm_batch_choose_k_measured(const tdm_batch_rates *t, const tdm_rowcost *target, const tdm_rowcost *draft,
                                    const tdm_batch_seq *seqs, int32_t n, int32_t other_rows, int32_t k_max);

#endif
