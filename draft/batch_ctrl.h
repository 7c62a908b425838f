/* batch_ctrl.h - the speculation length of a batch: one k for every speculating
 * sequence of a step, from measured costs.
 *
 * A model of the costs: the seconds of a forward as a function of its row count,
 * for the target and for the draft (per row count up to TDM_ROWCOST_MAX: the second
 * sample replaces the first, which may include one-time work such as capturing a
 * CUDA graph, then an EMA; between measured counts a roofline guess, extrapolated
 * linearly beyond them).  For a batch of B
 * sequences with acceptance estimates alpha_i and room cap_i (tokens each may still
 * take), drafting k tokens each yields
 *     E(k)    = sum_i E[tokens](alpha_i, min(k, cap_i))
 *     T(k)    = k * t_draft(B) + t_target(sum_i (1 + min(k, cap_i)) + other)
 * and k = 0 (no speculation) E(0) = B, T(0) = t_target(B + other), where `other` are
 * the step's rows that do not speculate (prompt chunks).  The choice maximises
 * E(k) / T(k), with T measured per (B, k) where it is (tdm_batch_steps below) and
 * the model filling the gaps.  As the batch grows the target's forward turns
 * compute-bound, t_target grows with its rows, and the choice falls to 0. */
#ifndef TDM_BATCH_CTRL_H
#define TDM_BATCH_CTRL_H

#include <stdbool.h>
#include <stdint.h>

#define TDM_ROWCOST_MAX 1024
#define TDM_BATCH_SEQ_MAX 512 /* sequences one decision weighs at most */

typedef struct tdm_rowcost {
    double t[TDM_ROWCOST_MAX + 1]; /* [rows] seconds of a forward of that many rows (EMA), 0 = unmeasured */
    uint8_t n[TDM_ROWCOST_MAX + 1];/* [rows] samples taken, up to 2 */
    double ema;                    /* weight of a new sample, default 0.2 */
} tdm_rowcost;

void tdm_rowcost_init(tdm_rowcost *c);
void tdm_rowcost_observe(tdm_rowcost *c, int32_t rows, double seconds);
/* The estimate for rows: measured; between measured counts lo < rows < hi the
 * dearer of t(lo) and t(hi) * rows / hi (a forward costs what reading the weights
 * costs until its rows make it compute-bound, then grows with them; never above the
 * straight line between the two), which errs on the cheap side so that an
 * unmeasured length gets tried; below every measurement t(hi); above, the slope of
 * the two highest; 0 when nothing is measured yet. */
double tdm_rowcost_get(const tdm_rowcost *c, int32_t rows);

typedef struct tdm_batch_seq {
    double alpha;  /* acceptance estimate */
    int32_t cap;   /* most tokens it may draft this step (room, k_max) */
} tdm_batch_seq;

/* What a step actually costs: an EMA of the seconds of a whole step (drafting,
 * verification, host work) by batch size and speculation length, measured on steps
 * without prompt chunks (the second sample replaces the first, as above; later
 * ones are clamped to [1/2, 2] times the estimate, so that a step slowed by
 * something else moves it little).  It has the last word where measured: the row-cost model
 * leaves out what it does not see (host work, launches, a forward split by its
 * logits rows).  Costs, unlike tokens per second, do not change with the text, so a
 * length measured once stays comparable with one measured long before. */
#define TDM_BATCH_STEP_B 256
#define TDM_BATCH_STEP_K 8

typedef struct tdm_batch_steps {
    double t[TDM_BATCH_STEP_B + 1][TDM_BATCH_STEP_K + 1];  /* [batch][k] seconds per step, 0 = unmeasured */
    uint8_t n[TDM_BATCH_STEP_B + 1][TDM_BATCH_STEP_K + 1]; /* [batch][k] samples taken, up to 2 */
} tdm_batch_steps;

void tdm_batch_steps_init(tdm_batch_steps *t);
void tdm_batch_steps_observe(tdm_batch_steps *t, int32_t batch, int32_t k, double seconds);

/* The length for a batch of n sequences: 0 until a plain step of this batch size is
 * measured; then the k in [0, k_max] (k_max at most TDM_BATCH_STEP_K) maximising
 * E(k) / T(k), E from the sequences' acceptance estimates as above and T(k) the
 * measured step time at (n, k) plus the model's cost of the other rows.  Where (n, k)
 * is not measured, T(k) is the nearest measured length's time plus the model's
 * difference between the two, so an unmeasured length is tried only when that
 * estimate says it pays; *trial (optional) is then true.  *explore (optional): a
 * neighbouring length (k - 1 or k + 1) worth measuring now and then, one sampled
 * less than twice first, else one expected within 10 % of the best; -1 if none. */
int32_t tdm_batch_choose_k_measured(const tdm_batch_steps *t, const tdm_rowcost *target, const tdm_rowcost *draft,
                                    const tdm_batch_seq *seqs, int32_t n, int32_t other_rows, int32_t k_max,
                                    bool *trial, int32_t *explore);

#endif
