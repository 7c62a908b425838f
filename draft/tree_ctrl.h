/* tree_ctrl.h - chain or tree, and the node budget, for the tree-capable sequences
 * of a step (a lone sequence is the batch of one), from measured acceptance and
 * measured costs (tree_ctrl.c).
 *
 * Per sequence: an EMA of the tokens a tree step committed (accepted + 1) for each
 * budget of TDM_TREE_BUDGETS.  Per engine, for each budget: EMAs of a tree step's
 * drafting seconds, of a lone tree's verification seconds (a tree's own: its masked
 * rows cost more than a chain's rows of the same count, 467 against 293 us for 11
 * rows of the pycode target on an H200, so the chain's row costs (costs.h) neither
 * feed nor are fed by them) and of its tokens over all sequences.  A step of n
 * sequences takes the best expected rate,
 *     chain: the length controller's expected rate at its k   (length.h)
 *     tree b: sum_i tokens_i(b) / (t_tree_draft(b) + t_tree_verify(b)),
 * where a budget a sequence has not measured takes the engine's tokens for it, and
 * one the engine has not measured either is assumed to commit what a chain as deep
 * would at a hopeful acceptance (alpha + 0.15); a tree's drafting not measured yet
 * costs depth(b) draft rounds of n * width rows, and its verification, in a batch or
 * not measured yet, the target's rows of the step (costs.h: the others' rows and
 * the n trees' 1 + b each), so that it gets tried.  Every 8th decision measures the
 * runner-up instead while its expected rate is within 80 % of the best, every 64th
 * otherwise. */
#ifndef TDM_TREE_CTRL_H
#define TDM_TREE_CTRL_H

#include "costs.h"
#include "tree.h"

#define TDM_TREE_N_BUDGETS 5
extern const int32_t TDM_TREE_BUDGETS[TDM_TREE_N_BUDGETS]; /* 4, 8, 16, 32, 64 */

typedef struct tdm_tree_ctrl {
    double tokens[TDM_TREE_N_BUDGETS]; /* EMA of tokens per tree step, 0 = unmeasured */
} tdm_tree_ctrl;

/* Per engine (all sequences); 0 = unmeasured.  The scheduler's own (sched/) records
 * drafting seconds only: its verifications are batches, costed by their rows. */
typedef struct tdm_tree_cost {
    double t_draft[TDM_TREE_N_BUDGETS];  /* EMA of a tree step's drafting seconds */
    double t_verify[TDM_TREE_N_BUDGETS]; /* EMA of its verification seconds */
    double tokens[TDM_TREE_N_BUDGETS];   /* EMA of the tokens it committed */
} tdm_tree_cost;

void tdm_tree_ctrl_init(tdm_tree_ctrl *c);
/* The budget of TDM_TREE_BUDGETS nearest to (at most) b: its index. */
int32_t tdm_tree_budget_index(int32_t b);
void tdm_tree_ctrl_observe(tdm_tree_ctrl *c, int32_t budget, int32_t tokens);
/* One tree step of the budget: its drafting and verification seconds and the tokens
 * it committed (a time that is not positive is not recorded). */
void tdm_tree_cost_observe(tdm_tree_cost *c, int32_t budget, double t_draft, double t_verify, int32_t tokens);
/* The expected rate (tokens per second) of a step of the n trees of ctrl[0..n)
 * (acceptance estimates alpha[0..n)) at the budget of index i, beside `other` target
 * rows, as tdm_tree_choose weighs it. */
double tdm_tree_rate(const tdm_tree_ctrl *const *ctrl, const double *alpha, int32_t n, const tdm_tree_cost *tc,
                     const tdm_pair_costs *cost, int32_t other, int32_t i);
/* The step's choice for the tree-capable sequences ctrl[0..n) (acceptance
 * estimates alpha[0..n)), beside `other` target rows: 0 = chains (expected rate
 * chain_rate), else the budget of TDM_TREE_BUDGETS, at most max_budget and within
 * max_rows rows in all.  *n_decisions counts the decisions (the runner-up's
 * schedule). */
int32_t tdm_tree_choose(const tdm_tree_ctrl *const *ctrl, const double *alpha, int32_t n, const tdm_tree_cost *tc,
                        const tdm_pair_costs *cost, double chain_rate, int32_t other, int32_t max_budget,
                        int32_t max_rows, uint32_t *n_decisions);

#endif
