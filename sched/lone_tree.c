/* lone_tree.c - one token-tree step for a lone sequence: grow the tree with the
 * draft (draft/tree_draft.c), merge the n-gram lookups' continuations into it
 * (greedy, spec_ngram on), verify it with one target forward and commit the
 * accepted path (verify/tree_verify.c), record costs and acceptance
 * (draft/tree_ctrl.h).  lone.c decides when a step is a tree, and when an
 * n-gram proposal alone replaces it. */
#include <stdlib.h>

#include "lone.h"

#include "commit.h"
#include "kv_cache.h"
#include "ngram.h"
#include "tree_draft.h"
#include "tree_verify.h"

bool tdm_spec_tree_cfg(const tdm_spec_rec *sr, int32_t budget, int32_t room, tdm_tree_cfg *out) {
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

/* The tokens s may still draft beyond the one the target adds: within its
 * max_tokens and the context. */
static int32_t room_of(const tdm_engine *e, const tdm_seq *s) {
    return TDM_MIN(s->max_new - (s->n_tokens - s->n_prompt) - 1, e->cfg.n_ctx - s->n_tokens);
}

/* The n-gram lookups' acceptance per token, as a tree weighs a lookup node (its
 * parent's cumulative probability times this). */
static float lookup_alpha(const tdm_spec_rec *sr) {
    return (float)TDM_MIN(TDM_MAX(sr->ctrl_ng.alpha, 0.05), 0.95);
}

void tdm_spec_tree_lookups(tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, tdm_tree *t, int32_t budget, int32_t max_depth, int32_t *root,
                           int32_t *n_root) {
    *n_root = 0;
    if (tdm_spec_lookup_n(sr) <= 0 || sr->oracle || ws->opts.no_tree_lookups) return;
    const int32_t k = tdm_len_lookup_k(&ws->len, &sr->ctrl_ng, TDM_TREE_DEPTH_MAX);
    max_depth = TDM_MIN(max_depth, TDM_TREE_DEPTH_MAX);
    if (k <= 0 || max_depth <= 0) return;
    const float a = lookup_alpha(sr);
    *n_root = tdm_ngram_propose(s->tokens, s->n_tokens, tdm_spec_lookup_n(sr), k, root);
    int32_t added = tdm_tree_merge_chain(t, -1, root, *n_root, a, TDM_TREE_MAX, max_depth);
    const int32_t leaf = t->n_spine - 1; /* (spine node i: node i, at depth i) */
    if (leaf >= 0 && leaf + 1 < max_depth) {
        int32_t spine[TDM_TREE_DEPTH_MAX], out[TDM_TREE_DEPTH_MAX];
        for (int32_t i = 0; i <= leaf; i++) spine[i] = t->token[i];
        const int32_t m = tdm_ngram_propose_after(s->tokens, s->n_tokens, spine, leaf + 1, tdm_spec_lookup_n(sr), k, out);
        added += tdm_tree_merge_chain(t, leaf, out, m, a, TDM_TREE_MAX, max_depth);
    }
    if (added == 0) return;
    if (t->n > budget) tdm_tree_prune(t, budget);
    tdm_tree_spine_first(t);
}

/* The n-gram controller learns from the lookup prop[0..n) proposed after
 * position `before` as from a chain: how many of its tokens were committed. */
static void observe_lookup(const tdm_seq *s, tdm_spec_rec *sr, const int32_t *prop, int32_t n, int32_t before) {
    if (n <= 0) return;
    int32_t m = 0;
    while (m < n && before + m < s->n_tokens && prop[m] == s->tokens[before + m]) m++;
    tdm_ctrl_observe(&sr->ctrl_ng, n, m);
}

/* Verifies s's tree t and commits the verdict (the commit's time marked as the
 * tree's keep phase). */
static tandem_status verify_commit(tdm_sched *sc, tdm_req *r, const tdm_tree *t, tdm_verdict *v, tdm_err *err) {
    tdm_engine *e = sc->e;
    tandem_status st = tdm_sched_verify_lone(sc, r, NULL, 0, 0, t, v, err);
    if (!st) tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_VERIFY);
    if (!st) st = tdm_commit_tree(e, &r->s, t, v, err);
    if (!st) tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_KEEP);
    return st;
}

tandem_status tdm_spec_tree_step(tdm_sched *sc, tdm_req *r, int32_t budget, tdm_err *err) {
    tdm_engine *e = sc->e;
    tdm_spec_ws *ws = sc->ws;
    tdm_seq *s = &r->s;
    tdm_spec_rec *sr = &r->sr;
    const int32_t n = s->n_tokens, room = room_of(e, s);
    tdm_tree_job job = {s, sr, {0}, &ws->tree, s->sp.temperature > 0};
    if (!tdm_spec_tree_cfg(sr, budget, room, &job.cfg)) return tdm_seq_step_target(sc, r, err);
    tandem_status st;
    if ((st = tdm_kv_seq_reserve(e->pool, &s->kv, n + tdm_tree_slots(&job.cfg), err))) return st;
    if (e->copy_status) return tdm_seterr(err, e->copy_status, "%s", e->copy_err.msg);
    const double t0 = tdm_now();
    tdm_phase_start(&e->ph, e->be);
    int32_t n_fwd;
    if ((st = tdm_draft_trees(e, ws, &job, 1, &n_fwd, err))) return st;
    int32_t ng_root[TDM_TREE_DEPTH_MAX], n_root = 0;
    if (!job.sample) tdm_spec_tree_lookups(ws, s, sr, &ws->tree, job.cfg.budget, room, ng_root, &n_root);
    const double t1 = tdm_now();
    const tdm_tree *t = &ws->tree;
    const int32_t nodes = t->n, before = s->n_tokens;
    if (nodes == 0) return tdm_seq_step_target(sc, r, err);
    tdm_verdict v;
    if ((st = verify_commit(sc, r, t, &v, err))) return st;
    const int32_t acc = v.n_acc, *path = v.path;
    const double t2 = tdm_now();
    tdm_tree_cost_observe(&ws->tree_cost, job.cfg.budget, t1 - t0, t2 - t1, acc + 1);
    tdm_tree_ctrl_observe(&sr->tctrl, job.cfg.budget, acc + 1);
    /* the chain controller's acceptance sees the draft's part of the path as a
     * chain's prefix; the n-gram controller's, the root lookup as a chain */
    const tdm_tree_share sh = tdm_tree_share_of(t, path, acc);
    tdm_ctrl_observe(&sr->ctrl, TDM_MIN(sh.draft_run + 1, TDM_MAX(sh.draft_depth, 1)), sh.draft_run);
    observe_lookup(s, sr, ng_root, n_root, before);
    tdm_spec_stats_add(sr, &sc->pay, &(tdm_step_obs){.proposed = nodes, .accepted = acc, .looked_up = sh.lookup_nodes,
                                                 .looked_up_acc = sh.lookup_acc, .tree = true,
                                                 .committed = s->n_tokens - before, .k_final = -1,
                                                 .draft_s = t1 - t0, .verify_s = t2 - t1});
    return TANDEM_OK;
}

bool tdm_spec_lookup_tree(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, const int32_t *first, int32_t n_first, int32_t budget) {
    const int32_t n = s->n_tokens;
    const int32_t max_depth = TDM_MIN(room_of(e, s), TDM_TREE_DEPTH_MAX), L = TDM_MIN(n_first, TDM_TREE_DEPTH_MAX);
    tdm_tree *t = &ws->tree;
    tdm_tree_reset(t);
    const int32_t cands = ws->opts.lookup_cands, extra = ws->opts.lookup_tree_extra;
    if (L <= 0 || cands < 2) return false;
    int32_t cand[TDM_LOOKUP_CANDS * TDM_TREE_DEPTH_MAX], lens[TDM_LOOKUP_CANDS];
    const int32_t m = tdm_ngram_propose_multi(s->tokens, n, tdm_spec_lookup_n(sr), L, cands, cand, lens);
    const int32_t max_nodes = TDM_MIN(TDM_MIN(budget, TDM_TREE_MAX), extra > 0 ? L + extra : TDM_TREE_MAX);
    const float a = lookup_alpha(sr);
    tdm_tree_merge_chain(t, -1, first, L, a, max_nodes, max_depth); /* (the spine) */
    for (int32_t c = 0; c < m; c++) tdm_tree_merge_chain(t, -1, cand + c * L, lens[c], a, max_nodes, max_depth);
    tdm_tree_spine_first(t);
    return t->n > t->n_spine;
}

tandem_status tdm_spec_lookup_tree_step(tdm_sched *sc, tdm_req *r, const int32_t *first, int32_t n_first,
                                        int32_t k_chosen, double t0, tdm_err *err) {
    tdm_spec_ws *ws = sc->ws;
    tdm_seq *s = &r->s;
    tdm_spec_rec *sr = &r->sr;
    tdm_tree *t = &ws->tree;
    const int32_t nodes = t->n, before = s->n_tokens, L = TDM_MIN(n_first, TDM_TREE_DEPTH_MAX);
    if (nodes == 0) return tdm_seq_step_target(sc, r, err);
    const double t1 = tdm_now();
    tdm_verdict v;
    tandem_status st;
    if ((st = verify_commit(sc, r, t, &v, err))) return st;
    const int32_t acc = v.n_acc;
    const double t2 = tdm_now();
    tdm_lone_observe(sc, nodes + 1, t2 - t1, 0);
    observe_lookup(s, sr, first, L, before);
    tdm_spec_stats_add(sr, &sc->pay, &(tdm_step_obs){.proposed = nodes, .accepted = acc, .looked_up = nodes,
                                                 .looked_up_acc = acc, .lookup_step = true, .tree = true,
                                                 .committed = s->n_tokens - before, .k_final = k_chosen,
                                                 .draft_s = t1 - t0, .verify_s = t2 - t1});
    return TANDEM_OK;
}
