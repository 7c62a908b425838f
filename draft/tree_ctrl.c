/* tree_ctrl.c - chain or tree, and the budget (tree_ctrl.h). */
#include "tree_ctrl.h"

#include "common.h"
#include "length.h"

const int32_t TDM_TREE_BUDGETS[TDM_TREE_N_BUDGETS] = {4, 8, 16, 32, 64};

void tdm_tree_ctrl_init(tdm_tree_ctrl *c) {
    for (int i = 0; i < TDM_TREE_N_BUDGETS; i++) c->tokens[i] = 0;
}

int32_t tdm_tree_budget_index(int32_t b) {
    int32_t i = 0;
    while (i + 1 < TDM_TREE_N_BUDGETS && TDM_TREE_BUDGETS[i + 1] <= b) i++;
    return i;
}

static double ema(double old, double x, double w) { return old > 0 ? old + w * (x - old) : x; }

void tdm_tree_ctrl_observe(tdm_tree_ctrl *c, int32_t budget, int32_t tokens) {
    const int32_t i = tdm_tree_budget_index(budget);
    c->tokens[i] = ema(c->tokens[i], (double)tokens, 0.15);
}

void tdm_tree_cost_observe(tdm_tree_cost *c, int32_t budget, double t_draft, double t_verify, int32_t tokens) {
    const int32_t i = tdm_tree_budget_index(budget);
    if (t_draft > 0) c->t_draft[i] = ema(c->t_draft[i], t_draft, 0.1);
    if (t_verify > 0) c->t_verify[i] = ema(c->t_verify[i], t_verify, 0.1);
    if (tokens > 0) c->tokens[i] = ema(c->tokens[i], (double)tokens, 0.1);
}

double tdm_tree_rate(const tdm_tree_ctrl *const *ctrl, const double *alpha, int32_t n, const tdm_tree_cost *tc,
                        const tdm_pair_costs *cost, int32_t other, int32_t i) {
    const int32_t b = TDM_TREE_BUDGETS[i];
    const tdm_tree_cfg cfg = tdm_tree_cfg_dynamic(b);
    double tok = 0;
    for (int32_t j = 0; j < n; j++) {
        const double hope = alpha[j] + 0.15 < 0.95 ? alpha[j] + 0.15 : 0.95; /* (an unmeasured budget's acceptance) */
        tok += ctrl[j]->tokens[i] > 0 ? ctrl[j]->tokens[i]
               : tc->tokens[i] > 0    ? tc->tokens[i]
                                      : tdm_ctrl_expected_tokens(hope, cfg.depth);
    }
    const double td = tc->t_draft[i] > 0 ? tc->t_draft[i] : cfg.depth * tdm_cost_draft(cost, n * cfg.width);
    const double tv = n == 1 && other == 0 && tc->t_verify[i] > 0 ? tc->t_verify[i]
                                                                   : tdm_cost_target(cost, other + n * (b + 1));
    const double t = td + tv;
    return tok / (t > 0 ? t : 1e-30);
}

int32_t tdm_tree_choose(const tdm_tree_ctrl *const *ctrl, const double *alpha, int32_t n, const tdm_tree_cost *tc,
                        const tdm_pair_costs *cost, double chain_rate, int32_t other, int32_t max_budget,
                        int32_t max_rows, uint32_t *n_decisions) {
    if (n < 1) return 0;
    double best = chain_rate, second = -1;
    int32_t pick = 0, runner = -1;
    for (int32_t i = 0; i < TDM_TREE_N_BUDGETS && TDM_TREE_BUDGETS[i] <= max_budget; i++) {
        if (other + n * (1 + TDM_TREE_BUDGETS[i]) > max_rows) break;
        const double r = tdm_tree_rate(ctrl, alpha, n, tc, cost, other, i);
        if (r > best) {
            second = best, runner = pick;
            best = r, pick = TDM_TREE_BUDGETS[i];
        } else if (r > second) {
            second = r, runner = TDM_TREE_BUDGETS[i];
        }
    }
    /* the runner-up every 8th step while it is expected within 80 % of the best,
     * else every 64th (a tree that measured far slower costs little to re-check) */
    const uint32_t gap = second >= 0.8 * best ? 8 : 64;
    if (++*n_decisions % gap == 0 && runner >= 0) return runner;
    return pick;
}
