/* costs.h - what a pair's forwards and speculative steps cost, measured (costs.c);
 * the length controller (length.h) and the tree controller (tree_ctrl.h) read it.
 *
 * Row costs: the seconds of a forward as a function of its row count, for the
 * target (rows verified) and for the draft (one round: one row per drafting
 * sequence), per row count up to TDM_ROWCOST_MAX.  The lesser of the first two
 * samples (either may include one-time work such as capturing a CUDA graph, which
 * only makes a forward dearer: an estimate left too dear would never be chosen, so
 * never measured again); then an EMA, except that a sample under half the estimate
 * replaces it.  Between measured
 * counts a roofline guess, extrapolated beyond them.
 *
 * Step costs: an EMA of the seconds of a whole speculative step (drafting,
 * verification, host work) by batch size and speculation length, measured on steps
 * without prompt chunks or trees (the lesser of the first two samples, as
 * above; later ones are clamped to twice the estimate, so that a step slowed by
 * something else moves it little, and one under half the estimate replaces it: the
 * estimate held one-time work).  Where measured it has the last word:
 * the row-cost model leaves out what it does not see (host work, launches, a forward
 * split by its logits rows).  Costs, unlike acceptance, do not change with the text,
 * so a length measured once stays comparable with one measured long before. */
#ifndef TDM_COSTS_H
#define TDM_COSTS_H

#include <stdbool.h>
#include <stdint.h>

#define TDM_CTRL_MAX_K 32     /* the longest chain a step drafts */
#define TDM_ROWCOST_MAX 1024  /* rows the row costs keep apart (more: proportional) */
#define TDM_STEP_COST_B 256   /* batch sizes the step costs keep apart (more: the last) */

typedef struct tdm_rowcost {
    double t[TDM_ROWCOST_MAX + 1];  /* [rows] seconds of a forward of that many rows (EMA), 0 = unmeasured */
    uint8_t n[TDM_ROWCOST_MAX + 1]; /* [rows] samples taken, up to 2 */
    double ema;                     /* weight of a new sample, default 0.2 */
    int32_t top;                    /* the highest row count measured, 0 = none */
} tdm_rowcost;

void tdm_rowcost_init(tdm_rowcost *c);
void tdm_rowcost_observe(tdm_rowcost *c, int32_t rows, double seconds);
/* The estimate for rows: measured (sampled twice; a count sampled once counts at
 * the lesser of its sample and the estimate from the others, as the step costs
 * below); between measured counts lo < rows < hi the
 * dearer of t(lo) and t(hi) * rows / hi (a forward costs what reading the weights
 * costs until its rows make it compute-bound, then grows with them; never above the
 * straight line between the two), which errs on the cheap side so that an
 * unmeasured length gets tried; below every measurement t(hi); above, the slope of
 * the two highest; 0 when nothing is measured yet. */
double tdm_rowcost_get(const tdm_rowcost *c, int32_t rows);

typedef struct tdm_step_costs {
    double t[TDM_STEP_COST_B + 1][TDM_CTRL_MAX_K + 1];  /* [batch][k] seconds per step, 0 = unmeasured */
    uint8_t n[TDM_STEP_COST_B + 1][TDM_CTRL_MAX_K + 1]; /* [batch][k] samples taken, up to 2 */
} tdm_step_costs;

void tdm_step_costs_init(tdm_step_costs *t);
void tdm_step_costs_observe(tdm_step_costs *t, int32_t batch, int32_t k, double seconds);

/* A pair's costs (the scheduler's, in its speculation workspace). */
typedef struct tdm_pair_costs {
    tdm_rowcost target; /* a target forward, by rows */
    tdm_rowcost draft;  /* one draft round, by drafting sequences */
    tdm_step_costs steps;
} tdm_pair_costs;

void tdm_pair_costs_init(tdm_pair_costs *c);
/* The target's forward of rows rows: tdm_rowcost_get, or 1 when nothing is measured
 * yet (a prior: only ratios of costs matter). */
double tdm_cost_target(const tdm_pair_costs *c, int32_t rows);
/* One draft round of n sequences: measured (tdm_rowcost_get), else a quarter of the
 * target's forward of n rows (a prior). */
double tdm_cost_draft(const tdm_pair_costs *c, int32_t n);

#endif
