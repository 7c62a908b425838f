/* controller.h - adaptive speculation length.
 *
 * Keeps an exponential moving average of the acceptance rate alpha (per sequence)
 * and of measured costs: the time of one draft step, and the time of one target
 * verification as a function of the number of positions verified (a per-n EMA,
 * interpolated linearly for unmeasured n).  Chooses k in [k_min, k_max] that
 * maximises expected tokens per second:
 *     E[tokens](k) = (1 - alpha^(k+1)) / (1 - alpha)     (k + 1 when alpha = 1)
 *     rate(k)      = E[tokens](k) / (k * t_draft + t_verify(k + 1))
 * Until costs are measured it uses a prior (t_verify(n) = t_verify(1), t_draft =
 * t_verify(1) / 4 as a guess) so early choices are sensible.
 *
 * Back-off (tdm_ctrl_plan): when even the best k is expected to be slower than plain
 * decoding (rate(k) < 1 / t_verify(1): a draft that is rarely right), the step does
 * not speculate.  Every probe_gap-th such step probes with k = 1 so that a rising
 * acceptance is seen; the gap starts at TDM_CTRL_PROBE_MIN, doubles after every
 * probe that accepts nothing, up to TDM_CTRL_PROBE_MAX, and is 0 after one that
 * accepts (probe again at once, until the estimate says whether to speculate).  At
 * acceptance 0 this costs one draft step and one two-row verification per gap,
 * instead of one per token.  A request starts halfway between the prior and the
 * engine's last request's acceptance estimate (src/engine/engine.c), so a pair that never
 * agrees backs off within a few steps.
 */
#ifndef TDM_CONTROLLER_H
#define TDM_CONTROLLER_H

#include <stdbool.h>
#include <stdint.h>

#define TDM_CTRL_MAX_K 32
#define TDM_COST_MAX_N 65 /* verification rows the cost model measures: a chain of TDM_CTRL_MAX_K
                             or a tree of 64 nodes, plus the pending token */

/* Shared, per-engine cost model (machine + model pair properties). */
typedef struct tdm_cost_model {
    double t_draft;                       /* seconds per draft step (EMA), 0 = unknown */
    double t_verify[TDM_COST_MAX_N + 1]; /* [n] seconds to verify n positions (EMA), 0 = unknown */
    double ema;                           /* smoothing weight of a new sample, default 0.1 */
} tdm_cost_model;

void tdm_cost_init(tdm_cost_model *c);
void tdm_cost_observe_draft(tdm_cost_model *c, double seconds_per_step);
void tdm_cost_observe_verify(tdm_cost_model *c, int32_t n_positions, double seconds);
/* Estimated verify time for n positions (interpolated / extrapolated). */
double tdm_cost_verify(const tdm_cost_model *c, int32_t n_positions);

/* Per-sequence controller. */
typedef struct tdm_spec_ctrl {
    int32_t k_min, k_max;   /* 1 <= k_min <= k_max <= TDM_CTRL_MAX_K */
    int32_t k_fixed;        /* > 0: always this k */
    double alpha;           /* EMA of per-token acceptance probability */
    double alpha_ema;       /* smoothing weight, default 0.2 */
    int32_t k_last;
    /* back-off (tdm_ctrl_plan) */
    int32_t n_plain;   /* plain steps since the last probe */
    int32_t probe_gap; /* plain steps before the next probe */
    bool probing;      /* the last planned step was a probe */
} tdm_spec_ctrl;

#define TDM_CTRL_PROBE_MIN 8
#define TDM_CTRL_PROBE_MAX 64

void tdm_ctrl_init(tdm_spec_ctrl *c, int32_t k_min, int32_t k_max, int32_t k_fixed);
/* The k to draft next. */
int32_t tdm_ctrl_choose_k(tdm_spec_ctrl *c, const tdm_cost_model *cost);
/* The same for a proposer that costs t_draft seconds per drafted token (0 for one
 * that runs no model, such as n-gram lookup); *rate (optional) receives the expected
 * tokens per second of that k. */
int32_t tdm_ctrl_choose_k_cost(tdm_spec_ctrl *c, const tdm_cost_model *cost, double t_draft, double *rate);
/* The step's plan: the k to draft (tdm_ctrl_choose_k_cost), or 0 when speculating
 * is expected to be slower than plain decoding (the back-off above; a fixed k never
 * backs off).  *rate (optional): the expected tokens per second of the plan. */
int32_t tdm_ctrl_plan(tdm_spec_ctrl *c, const tdm_cost_model *cost, double t_draft, double *rate);
/* Expected tokens per second when drafting k tokens at acceptance alpha. */
double tdm_ctrl_rate(const tdm_cost_model *cost, double alpha, double t_draft, int32_t k);
/* The draft-step cost the controller assumes (measured, or the prior). */
double tdm_cost_draft(const tdm_cost_model *cost);
/* Records a step: k drafted, n_accepted of them accepted.  A step that stopped
 * early (p_min) counts only the tokens actually drafted. */
void tdm_ctrl_observe(tdm_spec_ctrl *c, int32_t k, int32_t n_accepted);
/* Expected tokens per step for acceptance alpha and k drafted. */
double tdm_ctrl_expected_tokens(double alpha, int32_t k);

#endif
