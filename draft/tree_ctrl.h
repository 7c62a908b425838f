/* tree_ctrl.h - chain or tree, and the node budget, from measured acceptance and
 * measured costs (tree_ctrl.c).
 *
 * Per sequence: an EMA of the tokens a tree step committed (accepted + 1) for each
 * budget of TDM_TREE_BUDGETS.  Per engine: an EMA of a tree step's drafting seconds
 * for each budget; verification seconds by row count are the chain controller's
 * (tdm_cost_model.t_verify, measured for chains and trees alike: a forward of n
 * rows costs what it costs).  A step takes the best expected rate,
 *     chain: E[tokens](alpha, k) / (k t_draft + t_verify(k + 1))   (controller.h)
 *     tree b: tokens(b) / (t_tree_draft(b) + t_verify(b + 1)),
 * an unmeasured budget assumed to commit what a chain as deep would at a hopeful
 * acceptance (alpha + 0.15) and to draft at depth(b) chain steps, so that it gets
 * tried; every 8th step measures the runner-up instead. */
#ifndef TDM_TREE_CTRL_H
#define TDM_TREE_CTRL_H

#include "controller.h"
#include "tree.h"

#define TDM_TREE_N_BUDGETS 5
extern const int32_t TDM_TREE_BUDGETS[TDM_TREE_N_BUDGETS]; /* 4, 8, 16, 32, 64 */

typedef struct tdm_tree_ctrl {
    double tokens[TDM_TREE_N_BUDGETS]; /* EMA of tokens per tree step, 0 = unmeasured */
    uint32_t n_decisions;
} tdm_tree_ctrl;

typedef struct tdm_tree_cost {
    double t_draft[TDM_TREE_N_BUDGETS]; /* EMA of a tree step's drafting seconds, 0 = unmeasured */
} tdm_tree_cost;

void tdm_tree_ctrl_init(tdm_tree_ctrl *c);
/* The budget of TDM_TREE_BUDGETS nearest to (at most) b: its index. */
int32_t tdm_tree_budget_index(int32_t b);
void tdm_tree_ctrl_observe(tdm_tree_ctrl *c, int32_t budget, int32_t tokens);
void tdm_tree_cost_observe(tdm_tree_cost *c, int32_t budget, double seconds);
/* The step's choice: 0 = a chain (of the chain controller's k), else a tree budget
 * at most max_budget.  chain_k: the chain controller's length for this step. */
int32_t tdm_tree_choose(tdm_tree_ctrl *c, const tdm_tree_cost *tc, const tdm_cost_model *cost, double alpha,
                        int32_t chain_k, int32_t max_budget);

#endif
