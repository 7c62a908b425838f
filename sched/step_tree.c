/* step_tree.c - token trees in a step (step.c): which decoding sequences verify a
 * tree this step and of how many nodes, n-gram lookups in and instead of them,
 * the trees drafted together (one draft forward per level for all,
 * draft/tree_draft.h), and each one's commit after the step's target forward.
 *
 * A sequence with spec_tree > 0 takes a tree of that budget every step.  For
 * spec_tree auto the step's auto sequences (a lone one is the batch of one) share
 * one choice among chains (budget 0, the length controller's last length) and the
 * budgets of TDM_TREE_BUDGETS (up to the workspace's tree_auto_max), by expected
 * tokens per second of the step (draft/tree_ctrl.h: measured tokens per tree step,
 * drafting seconds, a lone tree's verification seconds, else the target's row
 * costs, draft/costs.h: on the CPU a forward's cost grows with its rows, on a GPU at
 * small batch it hardly does, and at large batch nothing is free - the
 * measurements say which).
 *
 * With n-gram lookup on (spec_ngram), a sequence's lookup replaces its tree when
 * the lookup's expected rate (it runs no model) is at least the tree's; a greedy
 * one then verifies the lookup with other matches' continuations beside it, as one
 * tree of lookups (SpecInfer's merged tree of several speculators), when they
 * branch off it.  A drafted tree also holds the sequence's lookups within its
 * budget (tdm_sched_tree_lookups): the continuation of the committed text below the
 * root, and that of the text and the tree's likeliest path below the path's end.
 *
 * Verdicts (step_run.c): a greedy tree by agreement with the target's argmaxes; a
 * sampled one by agreement with the target's own draws (every row draws with the
 * uniform of the position it predicts), or, on an engine of one sequence, by
 * multi-candidate rejection sampling (children drawn from the draft without
 * replacement; such a tree holds no lookups).  A constrained or penalised
 * sequence's rows, drafted and verified, are masked and edited per node with its
 * path's grammar state and counts, so every verdict sees the distribution the
 * target has alone after that path; its lookups are cut where the grammar refuses
 * them (grammar_cut). */
#include "sched_internal.h"

#include <string.h>

#include "commit.h"
#include "constrain.h"
#include "kv_cache.h"
#include "ngram.h"
#include "tree_accept.h"
#include "tree_draft.h"
#include "tree_verify.h"

/* (a constrained, penalised or logprobs sequence too: its drafted rows are masked
 * and edited per node, draft/tree_draft.c; its verified rows per node, step_run.c;
 * the accepted path's logprobs rows kept, sched/commit.c) */
static bool tree_capable(const tdm_req *r) { return r->state == TDM_REQ_RUNNING && r->sr.spec_tree != 0; }

/* The largest budget an auto choice weighs. */
static int32_t auto_max(const tdm_sched *s) {
    const int32_t m = s->ws->opts.tree_auto_max;
    return m > 0 ? m : TDM_TREE_MAX;
}

/* The shared choice of the auto sequences (0: chains; draft/tree_ctrl.h), the
 * chain at the length controller's last length. */
static int32_t choose_auto(tdm_sched *s, int32_t n_auto, int32_t other) {
    const tdm_pair_costs *pc = &s->ws->len.cost;
    if (!(tdm_rowcost_get(&pc->target, other + n_auto * 2) > 0)) return 0; /* nothing measured yet: chains first */
    const tdm_tree_ctrl *ctrl[TDM_ENGINE_BATCH_LOGITS_MAX];
    double alpha[TDM_ENGINE_BATCH_LOGITS_MAX], a_sum = 0;
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_run && n < TDM_ENGINE_BATCH_LOGITS_MAX; i++) {
        const tdm_req *r = s->run[i];
        if (!tree_capable(r) || r->sr.spec_tree != TANDEM_SPEC_TREE_AUTO || tdm_sched_room(s, &r->s) <= 0) continue;
        ctrl[n] = &r->sr.tctrl;
        alpha[n] = r->sr.ctrl.alpha;
        a_sum += alpha[n++];
    }
    if (n == 0) return 0;
    const int32_t k = TDM_MAX(s->ws->len.dec_k, 1);
    const double chain = tdm_len_rate(&s->ws->len, n, n * tdm_ctrl_expected_tokens(a_sum / n, k), other + n * (1 + k), k);
    return tdm_tree_choose(ctrl, alpha, n, &s->tree_cost, pc, chain, other, auto_max(s), s->e->max_rows,
                           &s->n_tree_decisions);
}

int32_t tdm_sched_choose_trees(tdm_sched *s) {
    int32_t n_auto = 0, rows = 0, other = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        const tdm_req *r = s->run[i];
        s->tree_of[i] = 0;
        if (r->state != TDM_REQ_RUNNING) other += TDM_MIN(r->n_goal - r->n_fed, s->e->cfg.prefill_chunk);
        if (!tree_capable(r) || tdm_sched_room(s, &r->s) <= 0) continue;
        if (r->sr.spec_tree > 0) {
            s->tree_of[i] = r->sr.spec_tree;
            rows += 1 + r->sr.spec_tree;
        } else {
            n_auto++;
        }
    }
    const int32_t b = n_auto ? choose_auto(s, n_auto, other + rows) : 0;
    for (int32_t i = 0; i < s->n_run && b > 0; i++)
        if (tree_capable(s->run[i]) && s->run[i]->sr.spec_tree == TANDEM_SPEC_TREE_AUTO && tdm_sched_room(s, &s->run[i]->s) > 0)
            s->tree_of[i] = b;
    int32_t total = 0;
    for (int32_t i = 0; i < s->n_run; i++) total += s->tree_of[i] > 0 ? 1 + s->tree_of[i] : 0;
    return total;
}

/* The tree configuration of at most budget nodes, its depth within room tokens (a
 * static shape cut to room depths); false when nothing fits. */
static bool tree_cfg(const tdm_spec_rec *sr, int32_t budget, int32_t room, tdm_tree_cfg *out) {
    if (room <= 0 || budget <= 0) return false;
    room = TDM_MIN(room, TDM_TREE_DEPTH_MAX);
    if (sr->tree_shape.n_shape > 0) {
        tdm_tree_cfg c = sr->tree_shape;
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

bool tdm_sched_tree_cfg(const tdm_sched *s, const step_item *it, tdm_tree_cfg *cfg) {
    return tree_cfg(&it->r->sr, it->budget, tdm_sched_room(s, &it->r->s), cfg);
}

/* The n-gram lookups' acceptance per token, as a tree weighs a lookup node (its
 * parent's cumulative probability times this). */
static float lookup_alpha(const tdm_spec_rec *sr) { return (float)TDM_MIN(TDM_MAX(sr->ctrl_ng.alpha, 0.05), 0.95); }

/* Of a lookup toks[0..n) proposed after the committed text and after[0..n_after)
 * (a path of the tree), the tokens a constrained sequence's grammar allows there (a
 * prefix; the rest would only be refused by its rows' masks); n without a grammar. */
static int32_t grammar_cut(tdm_seq *q, const int32_t *after, int32_t n_after, const int32_t *toks, int32_t n) {
    if (!q->con || n <= 0) return n;
    int32_t all[2 * TDM_TREE_DEPTH_MAX];
    if (n_after + n > (int32_t)TDM_ARRAY_LEN(all)) n = (int32_t)TDM_ARRAY_LEN(all) - n_after;
    if (n_after > 0) memcpy(all, after, (size_t)n_after * sizeof *all);
    memcpy(all + n_after, toks, (size_t)n * sizeof *all);
    return TDM_MAX(tdm_constraint_prefix(q, all, n_after + n) - n_after, 0);
}

/* Merges q's lookups into its drafted tree t of at most `budget` nodes, none deeper
 * than max_depth - 1: the continuation of the committed text below the root (it
 * follows the draft's nodes while they agree), and that of the text plus the
 * spine below the spine's last node; each as long as the lookups' length
 * (draft/length.h tdm_len_lookup_k).  A lookup node's weight is its parent's times
 * the lookups' acceptance, and the tree then keeps the budget's best nodes of both
 * speculators (tdm_tree_prune); the spine is recomputed.  root[0..*n_root) is the
 * root's lookup. */
static void tree_lookups(tdm_spec_ws *ws, tdm_seq *q, tdm_spec_rec *sr, tdm_tree *t, int32_t budget, int32_t max_depth,
                         int32_t *root, int32_t *n_root) {
    *n_root = 0;
    if (tdm_spec_lookup_n(sr) <= 0 || sr->oracle || ws->opts.no_tree_lookups) return;
    const int32_t k = tdm_len_lookup_k(&ws->len, &sr->ctrl_ng, TDM_TREE_DEPTH_MAX);
    max_depth = TDM_MIN(max_depth, TDM_TREE_DEPTH_MAX);
    if (k <= 0 || max_depth <= 0) return;
    const float a = lookup_alpha(sr);
    *n_root = grammar_cut(q, NULL, 0, root, tdm_ngram_propose(q->tokens, q->n_tokens, tdm_spec_lookup_n(sr), k, root));
    int32_t added = tdm_tree_merge_chain(t, -1, root, *n_root, a, TDM_TREE_MAX, max_depth);
    const int32_t leaf = t->n_spine - 1; /* (spine node i: node i, at depth i) */
    if (leaf >= 0 && leaf + 1 < max_depth) {
        int32_t spine[TDM_TREE_DEPTH_MAX], out[TDM_TREE_DEPTH_MAX];
        for (int32_t i = 0; i <= leaf; i++) spine[i] = t->token[i];
        const int32_t m = grammar_cut(q, spine, leaf + 1, out,
                                      tdm_ngram_propose_after(q->tokens, q->n_tokens, spine, leaf + 1, tdm_spec_lookup_n(sr), k, out));
        added += tdm_tree_merge_chain(t, leaf, out, m, a, TDM_TREE_MAX, max_depth);
    }
    if (added == 0) return;
    if (t->n > budget) tdm_tree_prune(t, budget);
    tdm_tree_spine_first(t);
}

/* A tree of lookups alone into t, of at most `budget` nodes: first[0..n_first) (the
 * lookup taken) and other matches' continuations (the workspace's lookup_cands in
 * all) from the root, in that order while the budget lasts; whether the tree
 * branches (else the item verifies first[] as a chain: the same proposal, a chain's
 * rows). */
static bool lookup_tree(const tdm_sched *s, tdm_seq *q, tdm_spec_rec *sr, tdm_tree *t, const int32_t *first,
                        int32_t n_first, int32_t budget) {
    const tdm_spec_ws *ws = s->ws;
    const int32_t n = q->n_tokens;
    const int32_t max_depth = TDM_MIN(tdm_sched_room(s, q), TDM_TREE_DEPTH_MAX), L = TDM_MIN(n_first, TDM_TREE_DEPTH_MAX);
    tdm_tree_reset(t);
    const int32_t cands = ws->opts.lookup_cands, extra = ws->opts.lookup_tree_extra;
    if (L <= 0 || cands < 2) return false;
    int32_t cand[TDM_LOOKUP_CANDS * TDM_TREE_DEPTH_MAX], lens[TDM_LOOKUP_CANDS];
    const int32_t m = tdm_ngram_propose_multi(q->tokens, n, tdm_spec_lookup_n(sr), L, cands, cand, lens);
    const int32_t max_nodes = TDM_MIN(TDM_MIN(budget, TDM_TREE_MAX), extra > 0 ? L + extra : TDM_TREE_MAX);
    const float a = lookup_alpha(sr);
    tdm_tree_merge_chain(t, -1, first, L, a, max_nodes, max_depth); /* (the spine) */
    for (int32_t c = 0; c < m; c++)
        tdm_tree_merge_chain(t, -1, cand + c * L, grammar_cut(q, NULL, 0, cand + c * L, lens[c]), a, max_nodes, max_depth);
    tdm_tree_spine_first(t);
    return t->n > t->n_spine;
}

/* A lookup instead of the item's tree, where its rate beats the tree's (the
 * sequence's own, tdm_tree_rate for one tree, against the lookup's expected tokens
 * over its rows); true when taken: the item
 * is then a lookup tree (greedy, when other matches branch off it) or a lookup
 * chain. */
static bool lookup_instead(tdm_sched *s, step_item *it, const tdm_tree_cfg *cfg) {
    tdm_seq *q = &it->r->s;
    tdm_spec_rec *sr = &it->r->sr;
    if (it->k_look <= 0) return false;
    const int32_t nd = grammar_cut(q, NULL, 0, it->draft,
                                   tdm_ngram_propose(q->tokens, q->n_tokens, tdm_spec_lookup_n(sr), it->k_look, it->draft));
    if (nd <= 0) return false;
    const tdm_pair_costs *pc = &s->ws->len.cost;
    const tdm_tree_ctrl *ctrl = &sr->tctrl;
    const double alpha = sr->ctrl.alpha;
    const double rate_tree = tdm_tree_rate(&ctrl, &alpha, 1, &s->tree_cost, pc, 0, tdm_tree_budget_index(cfg->budget));
    const double rate_ng = tdm_ctrl_expected_tokens(sr->ctrl_ng.alpha, nd) / (tdm_cost_target(pc, 1 + nd) + 1e-12);
    if (!tdm_ngram_take(rate_ng, rate_tree, &sr->n_ngram_skips)) return false;
    it->ngram = true;
    if (q->sp.temperature <= 0 && nd <= TDM_TREE_DEPTH_MAX && lookup_tree(s, q, sr, it->tree, it->draft, nd, it->budget)) {
        const int32_t L = TDM_MIN(nd, TDM_TREE_DEPTH_MAX);
        memcpy(it->root, it->draft, (size_t)L * sizeof *it->root);
        it->n_root = L;
        it->reject = false; /* (greedy) */
        return true;
    }
    tdm_sched_take_lookup_chain(s, it, nd);
    return true;
}

/* The n-gram controller learns from the lookup prop[0..n) proposed after position
 * `before` as from a chain: how many of its tokens were committed. */
static void observe_lookup(const tdm_seq *q, tdm_spec_rec *sr, const int32_t *prop, int32_t n, int32_t before) {
    if (n <= 0) return;
    int32_t m = 0;
    while (m < n && before + m < q->n_tokens && prop[m] == q->tokens[before + m]) m++;
    tdm_ctrl_observe(&sr->ctrl_ng, n, m);
}

bool tdm_sched_draft_trees(tdm_sched *s, step_item *it, int32_t n) {
    tdm_engine *e = s->e;
    tdm_tree_job jobs[TDM_ENGINE_BATCH_LOGITS_MAX];
    step_item *who[TDM_ENGINE_BATCH_LOGITS_MAX];
    int32_t m = 0, budget = 0;
    for (int32_t i = 0; i < n && m < TDM_ENGINE_BATCH_LOGITS_MAX; i++) {
        if (!it[i].tree) continue;
        tdm_tree_job job = {&it[i].r->s, &it[i].r->sr, {0}, it[i].tree, it[i].reject};
        if (!tdm_sched_tree_cfg(s, &it[i], &job.cfg)) {
            it[i].tree = NULL; /* (a plain step) */
            continue;
        }
        if (lookup_instead(s, &it[i], &job.cfg)) continue;
        budget = TDM_MAX(budget, job.cfg.budget);
        jobs[m] = job;
        who[m++] = &it[i];
    }
    if (m == 0) return true;
    tdm_err err = {0};
    int32_t n_fwd;
    const double t0 = tdm_now();
    tandem_status st = tdm_draft_trees(e, s->ws, jobs, m, &n_fwd, &err);
    if (st) {
        for (int32_t j = 0; j < m; j++) tdm_sched_fail(who[j]->r, st, &err);
        return false;
    }
    for (int32_t j = 0; j < m; j++) {
        step_item *x = who[j];
        /* a greedy tree, or one verified by the target's own draws, also holds the
         * lookups (any proposal keeps the output); a tree for rejection sampling
         * holds the draft's draws alone */
        if (!jobs[j].sample)
            tree_lookups(s->ws, jobs[j].s, jobs[j].sr, x->tree, jobs[j].cfg.budget, tdm_sched_room(s, jobs[j].s), x->root,
                         &x->n_root);
        if (x->tree->n == 0) x->tree = NULL, x->reject = false; /* (a plain step) */
    }
    tdm_tree_cost_observe(&s->tree_cost, budget, tdm_now() - t0, 0, 0); /* (verification: the row costs) */
    return true;
}

void tdm_sched_commit_tree(tdm_sched *s, const step_item *it, const tdm_verdict *v, double draft_s, double verify_s) {
    tdm_seq *q = &it->r->s;
    tdm_spec_rec *sr = &it->r->sr;
    const tdm_tree *t = it->tree;
    const int32_t before = q->n_tokens, m = v->n_acc;
    tdm_err err = {0};
    tandem_status st = tdm_commit_tree(s->e, q, t, v, &err);
    if (st) {
        tdm_sched_fail(it->r, st, &err);
        return;
    }
    observe_lookup(q, sr, it->root, it->n_root, before);
    if (!it->ngram) {
        tdm_tree_ctrl_observe(&sr->tctrl, it->budget, m + 1);
        tdm_tree_cost_observe(&s->tree_cost, it->budget, 0, 0, m + 1);
        /* the chain controller sees the draft's part of the path (before any lookup
         * node) as a chain's prefix */
        const tdm_tree_share sh = tdm_tree_share_of(t, v->path, m);
        tdm_ctrl_observe(&sr->ctrl, TDM_MIN(sh.draft_run + 1, TDM_MAX(sh.draft_depth, 1)), sh.draft_run);
        tdm_spec_stats_add(sr, NULL, &(tdm_step_obs){.proposed = t->n, .accepted = m, .looked_up = sh.lookup_nodes,
                                                     .looked_up_acc = sh.lookup_acc, .tree = true,
                                                     .committed = q->n_tokens - before, .k_final = -1,
                                                     .draft_s = draft_s, .verify_s = verify_s});
        return;
    }
    tdm_spec_stats_add(sr, s->step_own ? &s->pay : NULL,
                       &(tdm_step_obs){.proposed = t->n, .accepted = m, .looked_up = t->n, .looked_up_acc = m,
                                       .lookup_step = true, .tree = true, .committed = q->n_tokens - before,
                                       .k_final = it->k_plan, .draft_s = draft_s, .verify_s = verify_s});
}

tandem_status tdm_sched_head_keep_tree(tdm_sched *s, const step_item *it, const tdm_verdict *v, int32_t row0,
                                       int32_t before, tdm_err *err) {
    tdm_seq *q = &it->r->s;
    /* (the path's tokens and the next one, fewer where the request ended inside it) */
    const int32_t n = TDM_MIN(q->n_tokens - before, v->n_acc + 1);
    return tdm_engine_head_keep_path(s->e, q, row0, it->from, v->path, n, err);
}
