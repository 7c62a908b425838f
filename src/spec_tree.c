/* spec_tree.c - one token-tree step for one sequence: grow the tree with the
 * draft (draft/tree_draft.c), verify it with one target forward and commit the
 * accepted path (verify/tree_verify.c), record costs and acceptance
 * (draft/tree_ctrl.h).  src/spec.c decides when a step is a tree. */
#include "engine.h"
#include "tree_draft.h"
#include "tree_verify.h"

bool tdm_spec_tree_cfg(const tdm_seq *s, int32_t budget, int32_t room, tdm_tree_cfg *out) {
    if (room <= 0 || budget <= 0) return false;
    room = TDM_MIN(room, TDM_TREE_DEPTH_MAX);
    if (s->tree_shape.n_shape > 0) {
        tdm_tree_cfg c = s->tree_shape;
        c.n_shape = TDM_MIN(c.n_shape, room);
        c.budget = tdm_tree_shape_nodes(c.shape, c.n_shape);
        *out = c;
        return true;
    }
    tdm_tree_cfg c = tdm_tree_cfg_dynamic(budget);
    c.depth = TDM_MIN(c.depth, room);
    *out = c;
    return true;
}

tandem_status tdm_spec_tree_step(tdm_engine *e, tdm_seq *s, int32_t budget, tdm_err *err) {
    const int32_t n = s->n_tokens;
    const int32_t room = TDM_MIN(s->max_new - (n - s->n_prompt) - 1, e->cfg.n_ctx - n);
    tdm_tree_job job = {s, {0}, &e->tree, s->sp.temperature > 0};
    if (!tdm_spec_tree_cfg(s, budget, room, &job.cfg)) return tdm_seq_step_target(e, s, err);
    tandem_status st;
    if ((st = tdm_kv_seq_reserve(e->pool, &s->kv, n + tdm_tree_slots(&job.cfg), err))) return st;
    if (e->copy_status) return tdm_seterr(err, e->copy_status, "%s", e->copy_err.msg);
    const double t0 = tdm_now();
    tdm_phase_start(&e->ph, e->be);
    int32_t n_fwd, acc;
    if ((st = tdm_draft_trees(e, &job, 1, &n_fwd, err))) return st;
    const double t1 = tdm_now();
    const int32_t nodes = e->tree.n, before = s->n_tokens;
    if (nodes == 0) return tdm_seq_step_target(e, s, err);
    if ((st = tdm_verify_tree(e, s, &e->tree, &acc, err))) return st;
    const double t2 = tdm_now();
    tdm_tree_cost_observe(&e->tree_cost, job.cfg.budget, t1 - t0, t2 - t1, acc + 1);
    tdm_tree_ctrl_observe(&s->tctrl, job.cfg.budget, acc + 1);
    /* the chain controller's acceptance sees the path as a chain's prefix */
    tdm_ctrl_observe(&s->ctrl, TDM_MIN(acc + 1, e->tree.depth[nodes - 1] + 1), acc);
    tandem_spec_stats *ss = &s->spec;
    ss->steps++;
    ss->tree_steps++;
    ss->tree_nodes += (uint64_t)nodes;
    ss->drafted += (uint64_t)nodes;
    ss->accepted += (uint64_t)acc;
    ss->accept_hist[acc < TANDEM_SPEC_HIST_MAX ? acc : TANDEM_SPEC_HIST_MAX - 1]++;
    ss->forwards++;
    ss->forward_tokens += (uint64_t)(s->n_tokens - before);
    ss->draft_ms += (t1 - t0) * 1e3;
    ss->verify_ms += (t2 - t1) * 1e3;
    return TANDEM_OK;
}
