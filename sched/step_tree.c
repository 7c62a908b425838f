/* step_tree.c - token trees in the scheduler's batched step (step.c): which
 * decoding sequences verify a tree this step and of how many nodes, their trees
 * drafted together (one draft forward per level for all, draft/tree_draft.h), and
 * each one's verdict after the step's target forward.
 *
 * A greedy sequence with spec_tree > 0 takes a tree of that budget every step.  For
 * spec_tree auto the batch's auto sequences share one choice among chains (budget
 * 0, the batch's chain length) and the budgets of TDM_TREE_BUDGETS, by expected
 * tokens per second of the step:
 *     sum_i tokens_i(b) / (t_tree_draft(b) + t_target(other rows + sum_i (1 + b)))
 * with tokens_i(b) each sequence's measured tokens per tree step (tree_ctrl.h; a
 * hopeful prior until measured), t_tree_draft(b) the batch's measured drafting
 * seconds (until measured, depth(b) draft rounds of the row-cost model) and
 * t_target the target's measured seconds by row count (draft/costs.h): on the
 * CPU a forward's cost grows with its rows, on a GPU at small batch it hardly does,
 * and at large batch nothing is free - the measurements say which.  Every 16th
 * decision measures the runner-up.  A sampled sequence's tree is verified as a
 * chain is (step.c): every row draws the target's token with the uniform of the
 * position it predicts (the root's row the first uniform to come, a node at depth d
 * the (d + 2)-th), and the path whose every token equals the target's draw at its
 * parent is kept, so its output is what it would be alone and unspeculated.  (The
 * single-sequence step, lone_tree.c, uses multi-candidate rejection sampling
 * instead.)  With n-gram lookup on, every tree also holds its sequence's lookups
 * within its budget (tdm_spec_tree_lookups); lookup steps alone stay chains here. */
#include "sched_internal.h"

#include "commit.h"
#include "lone.h"

#include "kv_cache.h"
#include "tree_accept.h"
#include "tree_draft.h"
#include "tree_verify.h"

static bool tree_capable(const tdm_req *r) { return r->state == TDM_REQ_RUNNING && r->sr.spec_tree != 0; }

/* The most nodes a tree may have this step: its room, the invariant rows. */
static int32_t room_of(const tdm_sched *s, const tdm_seq *q) {
    const tdm_engine *e = s->e;
    int32_t room = TDM_MIN(q->max_new - (q->n_tokens - q->n_prompt) - 1, e->cfg.n_ctx - q->n_tokens);
    const int32_t inv = e->cfg.batch_invariant ? e->be->invariant_rows : 0;
    return inv > 0 ? TDM_MIN(room, inv - 1) : room;
}

/* The shared choice of the auto sequences (0: chains). */
static int32_t choose_auto(tdm_sched *s, int32_t n_auto, double alpha_sum, int32_t other) {
    const double t_chain_rows = tdm_rowcost_get(&s->ws->len.cost.target, other + n_auto * 2);
    if (!(t_chain_rows > 0)) return 0; /* nothing measured yet: chains first */
    const int32_t k = TDM_MAX(s->ws->len.dec_k, 1);
    const double alpha = alpha_sum / n_auto;
    const double t_round = tdm_rowcost_get(&s->ws->len.cost.draft, n_auto);
    double best = n_auto * tdm_ctrl_expected_tokens(alpha, k) /
                  (k * t_round + tdm_rowcost_get(&s->ws->len.cost.target, other + n_auto * (1 + k)) + 1e-12);
    double second = -1;
    int32_t pick = 0, runner = -1;
    for (int32_t bi = 0; bi < TDM_TREE_N_BUDGETS; bi++) {
        const int32_t b = TDM_TREE_BUDGETS[bi];
        if (other + n_auto * (1 + b) > s->e->max_rows) break;
        const tdm_tree_cfg cfg = tdm_tree_cfg_dynamic(b);
        double tok = 0;
        for (int32_t i = 0; i < s->n_run; i++) {
            const tdm_req *r = s->run[i];
            if (!tree_capable(r) || r->sr.spec_tree != TANDEM_SPEC_TREE_AUTO) continue;
            const double m = r->sr.tctrl.tokens[bi];
            tok += m > 0 ? m : tdm_ctrl_expected_tokens(TDM_MIN(r->sr.ctrl.alpha + 0.15, 0.95), cfg.depth);
        }
        const double td = s->tree_cost.t_draft[bi] > 0 ? s->tree_cost.t_draft[bi]
                                                        : cfg.depth * tdm_rowcost_get(&s->ws->len.cost.draft, n_auto * cfg.width);
        const double rate = tok / (td + tdm_rowcost_get(&s->ws->len.cost.target, other + n_auto * (1 + b)) + 1e-12);
        if (rate > best) second = best, runner = pick, best = rate, pick = b;
        else if (rate > second) second = rate, runner = b;
    }
    if ((++s->n_tree_decisions & 15) == 0 && runner >= 0) return runner;
    return pick;
}

int32_t tdm_sched_choose_trees(tdm_sched *s) {
    int32_t n_auto = 0, rows = 0, other = 0;
    double alpha = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        const tdm_req *r = s->run[i];
        s->tree_of[i] = 0;
        if (r->state != TDM_REQ_RUNNING) other += TDM_MIN(r->n_goal - r->n_fed, s->e->cfg.prefill_chunk);
        if (!tree_capable(r) || room_of(s, &r->s) <= 0) continue;
        if (r->sr.spec_tree > 0) {
            s->tree_of[i] = r->sr.spec_tree;
            rows += 1 + r->sr.spec_tree;
        } else {
            n_auto++;
            alpha += r->sr.ctrl.alpha;
        }
    }
    const int32_t b = n_auto ? choose_auto(s, n_auto, alpha, other + rows) : 0;
    for (int32_t i = 0; i < s->n_run && b > 0; i++)
        if (tree_capable(s->run[i]) && s->run[i]->sr.spec_tree == TANDEM_SPEC_TREE_AUTO && room_of(s, &s->run[i]->s) > 0)
            s->tree_of[i] = b;
    int32_t total = 0;
    for (int32_t i = 0; i < s->n_run; i++) total += s->tree_of[i] > 0 ? 1 + s->tree_of[i] : 0;
    return total;
}

bool tdm_sched_tree_cfg(const tdm_sched *s, const step_item *it, tdm_tree_cfg *cfg) {
    return tdm_spec_tree_cfg(&it->r->sr, it->budget, room_of(s, &it->r->s), cfg);
}

bool tdm_sched_draft_trees(tdm_sched *s, step_item *it, int32_t n) {
    tdm_engine *e = s->e;
    tdm_tree_job jobs[TDM_ENGINE_BATCH_LOGITS_MAX];
    step_item *who[TDM_ENGINE_BATCH_LOGITS_MAX];
    int32_t m = 0, budget = 0;
    for (int32_t i = 0; i < n && m < TDM_ENGINE_BATCH_LOGITS_MAX; i++) {
        if (!it[i].tree) continue;
        jobs[m] = (tdm_tree_job){&it[i].r->s, &it[i].r->sr, {0}, it[i].tree, false};
        if (!tdm_sched_tree_cfg(s, &it[i], &jobs[m].cfg)) {
            it[i].tree = NULL; /* (a plain step) */
            continue;
        }
        budget = TDM_MAX(budget, jobs[m].cfg.budget);
        who[m++] = &it[i];
    }
    if (m == 0) return true;
    tdm_err err = {0};
    int32_t n_fwd;
    const double t0 = tdm_now();
    tandem_status st = tdm_draft_trees(e, s->ws, jobs, m, &n_fwd, &err);
    if (!st) {
        /* each tree also holds its sequence's n-gram lookups, within its budget
         * (verified by the target's argmax or its own draws: any proposal keeps the
         * output) */
        for (int32_t j = 0; j < m; j++) {
            int32_t root[TDM_TREE_DEPTH_MAX], n_root;
            tdm_spec_tree_lookups(s->ws, jobs[j].s, jobs[j].sr, jobs[j].tree, jobs[j].cfg.budget, room_of(s, jobs[j].s), root, &n_root);
        }
        tdm_tree_cost_observe(&s->tree_cost, budget, tdm_now() - t0, 0, 0); /* (verification: the batch's row costs) */
        return true;
    }
    for (int32_t j = 0; j < m; j++) tdm_sched_fail(who[j]->r, st, &err);
    return false;
}

void tdm_sched_commit_tree(tdm_sched *s, const step_item *it, const int32_t *out, double draft_s, double verify_s) {
    tdm_seq *q = &it->r->s;
    tdm_spec_rec *sr = &it->r->sr;
    const tdm_tree *t = it->tree;
    tdm_verdict v;
    const int32_t before = q->n_tokens, m = tdm_tree_accept_match(t, out, v.path, &v.next);
    v.n_acc = m;
    tdm_err err = {0};
    tandem_status st = tdm_commit_tree(s->e, q, t, &v, &err);
    if (st) {
        tdm_sched_fail(it->r, st, &err);
        return;
    }
    if (q->sp.temperature > 0) tdm_engine_consume(q, m + 1); /* the uniforms of the kept tokens */
    tdm_tree_ctrl_observe(&sr->tctrl, it->budget, m + 1);
    /* the chain controller sees the draft's part of the path (before any lookup
     * node) as a chain's prefix */
    const tdm_tree_share sh = tdm_tree_share_of(t, v.path, m);
    tdm_ctrl_observe(&sr->ctrl, TDM_MIN(sh.draft_run + 1, TDM_MAX(sh.draft_depth, 1)), sh.draft_run);
    tdm_spec_stats_add(sr, NULL, &(tdm_step_obs){.proposed = t->n, .accepted = m, .looked_up = sh.lookup_nodes,
                                                 .looked_up_acc = sh.lookup_acc, .tree = true,
                                                 .committed = q->n_tokens - before, .k_final = -1,
                                                 .draft_s = draft_s, .verify_s = verify_s});
}
