/* lone.c - a lone sequence's steps (lone.h): the prefill, a plain step, and a
 * speculative step: choose k, draft a chain, verify it, commit, adapt.
 *
 * The length comes from the one length controller (draft/length.h) as for any
 * batch, here of one: measured step times by k, back-off and probes.  The step
 * never drafts more than the request can still use (max tokens, context), and is
 * a plain target step when no draft token fits or the controller backs off.
 *
 * With n-gram lookup on, a step first looks for an n-gram proposal (draft/ngram.c).
 * It is used when its expected rate, E[tokens] / its step's cost (it runs no model),
 * is at least the other choice's, each from the row model (draft/length.h
 * tdm_len_rate): the draft model's chain at the controller's length, a plain step
 * when the controller backed off, or the token tree; every TDM_NGRAM_EXPLORE-th match passed over is used anyway so
 * that a low estimate can recover.  Otherwise the draft model proposes, and a
 * lookup may complete its chain after any drafted token (draft/chain.c).  The draft
 * model catches up on the tokens it skipped at its next step (one batched
 * forward). */
#include "lone.h"

#include <string.h>

#include "chain.h"
#include "commit.h"
#include "kv_cache.h"
#include "liblog.h"
#include "ngram.h"

/* An n-gram proposal for this step, or 0 when it is not expected to beat the other
 * choice, whose expected rate is rate_other (tokens per second). */
static int32_t ngram_step(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, int32_t k_limit, double rate_other, int32_t *draft) {
    if (!tdm_spec_lookup_n(sr)) return 0;
    const int32_t k = tdm_len_lookup_k(&ws->len, &sr->ctrl_ng, k_limit);
    if (k <= 0) return 0;
    const int32_t nd = tdm_ngram_propose(s->tokens, s->n_tokens, tdm_spec_lookup_n(sr), k, draft);
    if (nd == 0) return 0;
    const double rate_ng = tdm_len_rate(&ws->len, 1, tdm_ctrl_expected_tokens(sr->ctrl_ng.alpha, nd), 1 + nd, 0);
    if (!tdm_ngram_take(rate_ng, rate_other, &sr->n_ngram_skips)) return 0;
    tdm_draft_onehot_q(e, ws, s, draft, 0, nd);
    return nd;
}

/* A plain step (the target's next token, drawn as without speculation), committed;
 * k_final: the statistics' controller choice to record (-1: none). */
static tandem_status plain_step(tdm_sched *sc, tdm_req *r, int32_t k_final, tdm_err *err) {
    tdm_verdict v;
    tandem_status st = tdm_sched_verify_lone(sc, r, NULL, 0, 0, NULL, &v, err);
    if (st) return st;
    tdm_commit_chain(sc->e, &r->s, NULL, &v);
    tdm_spec_stats_add(&r->sr, &sc->pay, &(tdm_step_obs){.committed = 1, .k_final = k_final});
    return TANDEM_OK;
}

tandem_status tdm_seq_step_target(tdm_sched *sc, tdm_req *r, tdm_err *err) {
    const double t0 = tdm_now();
    tandem_status st = plain_step(sc, r, -1, err);
    if (!st && sc->ws) {
        const double t = tdm_now() - t0;
        tdm_lone_observe(sc, 1, t, 0);
        tdm_len_observe_step(&sc->ws->len, 1, 0, t);
    }
    return st;
}

void tdm_lone_observe(tdm_sched *sc, int32_t verify_rows, double verify_s, double draft_s) {
    tdm_pair_costs *c = &sc->ws->len.cost;
    if (verify_rows > 0) tdm_rowcost_observe(&c->target, verify_rows, verify_s);
    if (draft_s > 0) tdm_rowcost_observe(&c->draft, 1, draft_s);
}

static tandem_status tdm_spec_step(tdm_sched *sc, tdm_req *r, tdm_err *err);

tandem_status tdm_seq_step(tdm_sched *sc, tdm_req *r, tdm_err *err) {
    if (r->s.done) return TANDEM_OK;
    return sc->e->draft ? tdm_spec_step(sc, r, err) : tdm_seq_step_target(sc, r, err);
}


static tandem_status verify_step(tdm_sched *sc, tdm_req *r, const int32_t *draft, int32_t nd, int32_t n_model,
                                 int32_t n_fwd, int32_t n_ng, int32_t k_chosen, double t0, double t1, int32_t catch_up,
                                 tdm_err *err);

static tandem_status tdm_spec_step(tdm_sched *sc, tdm_req *r, tdm_err *err) {
    tdm_engine *e = sc->e;
    tdm_spec_ws *ws = sc->ws;
    tdm_seq *s = &r->s;
    tdm_spec_rec *sr = &r->sr;
    tandem_status st;
    const int32_t n = s->n_tokens;
    tdm_spec_rec_step(sr); /* (lookups this step, where they pay) */
    int32_t room = s->max_new - (n - s->n_prompt) - 1; /* tokens beyond the one the target adds */
    int32_t ctx_room = e->cfg.n_ctx - n;
    const int32_t k_limit = TDM_MIN(room, ctx_room);
    if (k_limit <= 0) return tdm_seq_step_target(sc, r, err);
    /* the length: a fixed k or tree budget is the request's (no back-off), else the
     * length controller's for a batch of one */
    tdm_len_choice ch = {0};
    const tdm_len_seq one = {sr->ctrl.alpha, TDM_MIN(sr->ctrl.k_max, k_limit)};
    int32_t k;
    if (sr->ctrl.k_fixed > 0 || sr->spec_tree > 0) {
        k = TDM_MIN(sr->ctrl.k_fixed > 0 ? sr->ctrl.k_fixed : sr->ctrl.k_max, k_limit);
        ch.rate = tdm_len_rate(&ws->len, 1, tdm_ctrl_expected_tokens(sr->ctrl.alpha, k), 1 + k, k);
        ch.k = k;
    } else {
        tdm_len_choose(&ws->len, &one, 1, 0, TDM_MIN(sr->ctrl.k_min, one.cap), one.cap, &ch);
        k = ch.k;
    }
    const int32_t k_chosen = k;
    int32_t draft[TDM_CTRL_MAX_K];
    int32_t nd, n_model = 0, n_fwd = 0, n_ng = 0;
    const double t0 = tdm_now();
    if (k == 0) {
        /* the controller backed off (draft/length.h); an n-gram proposal drafts
         * nothing and is taken when it beats a plain step, else a plain step, its
         * cost measured */
        n_ng = ngram_step(e, ws, s, sr, k_limit, ch.rate_plain, draft);
        if (n_ng == 0) {
            if ((st = plain_step(sc, r, 0, err))) return st;
            const double t = tdm_now() - t0;
            tdm_lone_observe(sc, 1, t, 0);
            tdm_len_observe_step(&ws->len, 1, 0, t);
            return TANDEM_OK;
        }
        return verify_step(sc, r, draft, n_ng, 0, 0, n_ng, 0, t0, tdm_now(), 0, err);
    }
    /* a token tree instead of the chain: always at a fixed budget, or when the tree
     * controller expects it to pay (draft/tree_ctrl.h) */
    const int32_t tb = sr->spec_tree > 0 ? sr->spec_tree
                       : sr->spec_tree == TANDEM_SPEC_TREE_AUTO
                           ? tdm_tree_choose(&sr->tctrl, &ws->tree_cost, &ws->len.cost, sr->ctrl.alpha,
                                             tdm_len_rate(&ws->len, 1, tdm_ctrl_expected_tokens(sr->ctrl.alpha, k), 1 + k, k),
                                             ws->opts.tree_auto_max)
                           : 0;
    if (tb > 0) {
        /* an n-gram proposal alone when it beats the tree, as below when it beats a
         * chain (a greedy tree also holds lookups itself: lone_tree.c) */
        const double rate_tree = tdm_tree_rate(&sr->tctrl, &ws->tree_cost, &ws->len.cost, sr->ctrl.alpha, tb);
        n_ng = ngram_step(e, ws, s, sr, k_limit, rate_tree, draft);
        /* greedy: the lookup with other matches' continuations beside it, as a tree
         * (when they branch off it) */
        if (n_ng > 0 && s->sp.temperature <= 0 && n_ng <= TDM_TREE_DEPTH_MAX &&
            tdm_spec_lookup_tree(e, ws, s, sr, draft, n_ng, tb))
            return tdm_spec_lookup_tree_step(sc, r, draft, n_ng, k_chosen, t0, err);
        if (n_ng > 0) return verify_step(sc, r, draft, n_ng, 0, 0, n_ng, k_chosen, t0, tdm_now(), 0, err);
        return tdm_spec_tree_step(sc, r, tb, err);
    }
    /* (proposers compared on the same footing: the row model's rates) */
    n_ng = ngram_step(e, ws, s, sr, k_limit, tdm_len_rate(&ws->len, 1, tdm_ctrl_expected_tokens(sr->ctrl.alpha, k), 1 + k, k),
                      draft);
    int32_t catch_up = 0;
    if (n_ng > 0) {
        nd = n_ng;
    } else {
        /* a lookup may complete the chain after a drafted prefix: up to the longer of
         * the chain and the lookups' own length */
        const int32_t k_ext = tdm_spec_lookup_n(sr)
                                  ? TDM_MAX(k, tdm_len_lookup_k(&ws->len, &sr->ctrl_ng, k_limit))
                                  : k;
        tdm_phase_start(&e->ph, e->be);
        tdm_chain_req q = {.s = s, .sr = sr, .k = k, .k_ext = k_ext, .u = NULL, .draft = draft};
        const tdm_draft_scratch scr = tdm_sched_draft_scratch(sc);
        if ((st = tdm_draft_chains(e, ws, &q, 1, &scr, &catch_up, err))) return st;
        nd = q.n_drafted, n_model = q.n_model, n_fwd = q.n_forwards;
        tdm_phase_mark(&e->ph, e->be, TDM_PH_CHAIN_DRAFT);
    }
    st = verify_step(sc, r, draft, nd, n_model, n_fwd, n_ng, k_chosen, t0, tdm_now(), catch_up, err);
    if (n_ng == 0) tdm_phase_mark(&e->ph, e->be, TDM_PH_CHAIN_VERIFY);
    return st;
}

/* The step's verification of draft[0..nd) (its first n_model tokens from the draft
 * model in n_fwd forwards, the rest looked up; n_ng > 0: an n-gram step), drafted
 * from t0 to t1 (the draft catching up on catch_up rows first), and what the
 * controllers and the request's statistics learn: a chain of the model's alone,
 * the draft caught up, is a step of length n_model for the length controller. */
static tandem_status verify_step(tdm_sched *sc, tdm_req *r, const int32_t *draft, int32_t nd, int32_t n_model,
                                 int32_t n_fwd, int32_t n_ng, int32_t k_chosen, double t0, double t1, int32_t catch_up,
                                 tdm_err *err) {
    tdm_engine *e = sc->e;
    tdm_seq *s = &r->s;
    tdm_spec_rec *sr = &r->sr;
    const int32_t n = s->n_tokens;
    tdm_verdict v;
    tandem_status st;
    if ((st = tdm_sched_verify_lone(sc, r, draft, nd, n_model, NULL, &v, err))) return st;
    tdm_commit_chain(e, s, draft, &v);
    const int32_t acc = v.n_acc;
    double t2 = tdm_now();

    /* the model-drafted prefix and the looked-up rest update their own estimates */
    int32_t n_look = nd - n_model;
    if (n_model > 0) {
        tdm_lone_observe(sc, 0, 0, (t1 - t0) / (double)TDM_MAX(n_fwd, 1)); /* per forward */
        tdm_ctrl_observe(&sr->ctrl, n_model, TDM_MIN(acc, n_model));
    }
    int32_t acc_look = TDM_MAX(acc - n_model, 0);
    if (n_look > 0 && acc >= n_model) tdm_ctrl_observe(&sr->ctrl_ng, n_look, acc_look);
    tdm_lone_observe(sc, nd + 1, t2 - t1, 0);
    if (sc->ws->len.log) /* (TANDEM_SCHED_LOG=1: each lone step's proposal and what it yielded) */
        tdm_log(TANDEM_LOG_INFO, "lone: k %d, proposed %d (model %d, looked up %d%s), accepted %d; alpha %.2f, lookups' %.2f; ms %.3f + %.3f",
                (int)k_chosen, (int)nd, (int)n_model, (int)n_look, n_ng > 0 ? ", a lookup step" : "", (int)acc,
                sr->ctrl.alpha, sr->ctrl_ng.alpha, (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    if (n_model > 0 && n_model == nd && catch_up <= 1) tdm_len_observe_step(&sc->ws->len, 1, n_model, t2 - t0);
    /* (k_final: the controller's choice, before end-of-request clamping) */
    tdm_spec_stats_add(sr, &sc->pay, &(tdm_step_obs){.proposed = nd, .accepted = acc, .looked_up = n_look,
                                                 .looked_up_acc = acc_look, .lookup_step = n_ng > 0,
                                                 .committed = s->n_tokens - n, .k_final = k_chosen,
                                                 .draft_s = t1 - t0, .verify_s = t2 - t1});
    return TANDEM_OK;
}
