/* step_chain.c - the chains of a step (step.c): each speculating sequence's length
 * from the one length controller, n-gram lookups where they pay, and the draft
 * model's chains for the rest.
 *
 * The length (draft/length.h): every decoding sequence that is not a tree's and
 * may still draft joins one decision for the step, a lone sequence as the batch of
 * one, from measured step costs and acceptance; it may be 0 (the controller backed
 * off: speculation expected to be slower than plain decoding).  A request's fixed
 * k is its own and stays out of the decision (its rows count as the step's other
 * rows).  No sequence drafts more than it can still use (max tokens, the context),
 * and on a batch-invariant GPU a chain's rows fit one forward of invariant rows.
 *
 * Lookups (draft/ngram.c, spec_ngram): a sequence whose lookups are on this step
 * (spec_rec.h: they pay) may propose up to k_look tokens looked up in its own text,
 * k_look maximising the lookups' expected rate (tdm_len_lookup_k).  The lookup is
 * taken instead of the draft model's chain, or of a plain step when the length is
 * 0, when the step's expected rate with it, E[tokens] / cost (the row model,
 * tdm_len_rate; the lookup runs no model, and a lone sequence that takes it runs no
 * draft round at all), is at least the rate without it; every TDM_NGRAM_EXPLORE-th
 * match passed over is taken anyway, so that a low estimate can recover.  A
 * constrained sequence's lookup is cut at the first token its grammar refuses.
 *
 * The draft model's chains are drafted together (draft/chain.h: one draft forward
 * per round for all; a sampled sequence's token drawn with the uniform its target
 * token uses, or from q with its own draws for rejection sampling).  A lone
 * drafting sequence's chain may be completed by a lookup after any drafted token
 * (k_ext): its chain runs round by round on the host anyway where an extension is
 * possible, while a batch's greedy chains run back to back on the device with one
 * wait, which a decision per round would break.  The draft catches up on the tokens
 * it skipped (after lookup steps) at its next chain, in one batched forward. */
#include <string.h>

#include "chain.h"
#include "constrain.h"
#include "ngram.h"
#include "sched_internal.h"

void tdm_sched_choose_k(tdm_sched *s) {
    tdm_engine *e = s->e;
    memset(s->k_of, 0, (size_t)s->n_run * sizeof *s->k_of);
    memset(s->look_of, 0, (size_t)s->n_run * sizeof *s->look_of);
    for (int32_t i = 0; i < s->n_run; i++) s->plan_of[i] = -1;
    memset(s->tree_of, 0, (size_t)s->n_run * sizeof *s->tree_of);
    memset(&s->len_ch, 0, sizeof s->len_ch);
    s->step_b = s->step_k = 0;
    if (!e->draft) return;
    const int32_t tree_rows = tdm_sched_choose_trees(s);
    tdm_len_seq bs[TDM_ENGINE_BATCH_LOGITS_MAX];
    int32_t idx[TDM_ENGINE_BATCH_LOGITS_MAX], nb = 0, other = tree_rows, k_max = 0, k_min = TDM_CTRL_MAX_K, n_dec = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        const tdm_req *r = s->run[i];
        if (r->state != TDM_REQ_RUNNING) {
            other += TDM_MIN(r->n_goal - r->n_fed, e->cfg.prefill_chunk);
            continue;
        }
        n_dec++;
        if (s->tree_of[i] > 0) continue; /* (its rows are in tree_rows) */
        const tdm_spec_ctrl *ctrl = &r->sr.ctrl;
        const int32_t cap = TDM_MIN(ctrl->k_fixed > 0 ? ctrl->k_fixed : ctrl->k_max, tdm_sched_room(s, &r->s));
        if (cap <= 0 || nb == TDM_ENGINE_BATCH_LOGITS_MAX) {
            other++;
            continue;
        }
        if (ctrl->k_fixed > 0) { /* (its own length, out of the decision) */
            s->k_of[i] = s->plan_of[i] = cap;
            other += 1 + cap;
            continue;
        }
        idx[nb] = i;
        bs[nb++] = (tdm_len_seq){ctrl->alpha, cap};
        k_max = TDM_MAX(k_max, cap);
        k_min = TDM_MIN(k_min, ctrl->k_min);
    }
    s->other_rows = other;
    s->n_spec = nb;
    for (int32_t i = 0; i < s->n_run; i++) s->n_spec += s->k_of[i] > 0; /* (the fixed ones so far) */
    /* every chain verified within one forward's logits rows */
    const int32_t per_seq = (e->n_logit_rows - other) / TDM_MAX(n_dec, 1) - 1;
    if (nb >= 1) {
        k_max = TDM_MIN(k_max, per_seq);
        if (k_max > 0) {
            tdm_len_choose(&s->ws->len, bs, nb, other, TDM_MIN(k_min, k_max), k_max, &s->len_ch);
            s->step_b = nb;
            s->step_k = s->len_ch.k;
            for (int32_t j = 0; j < nb; j++) {
                s->k_of[idx[j]] = TDM_MIN(s->step_k, bs[j].cap);
                s->plan_of[idx[j]] = s->step_k; /* (before end-of-request clamping) */
            }
        }
    }
    /* the longest lookup each decoding sequence may propose (within a tree's budget;
     * the row costs looked up once for the step) */
    double t_rows[TDM_CTRL_MAX_K + 2];
    tdm_len_lookup_costs(&s->ws->len, t_rows);
    for (int32_t i = 0; i < s->n_run; i++) {
        tdm_req *r = s->run[i];
        if (r->state != TDM_REQ_RUNNING || !tdm_spec_lookup_n(&r->sr)) continue;
        int32_t cap = TDM_MIN(tdm_sched_room(s, &r->s), TDM_MAX(per_seq, s->k_of[i]));
        if (s->tree_of[i] > 0) cap = TDM_MIN(cap, s->tree_of[i]);
        s->look_of[i] = tdm_len_lookup_k_at(t_rows, &r->sr.ctrl_ng, cap);
    }
}

void tdm_sched_take_lookup_chain(tdm_sched *s, step_item *it, int32_t nd) {
    it->tree = NULL;
    it->k = nd;
    it->n_model = 0;
    it->to = it->from + 1 + nd;
    it->ngram = true;
    if (it->reject) tdm_draft_onehot_q(s->e, s->ws, &it->r->s, it->draft, 0, nd);
}

/* A lookup instead of the item's model chain (or of its plain step, k = 0), where
 * the step's expected rate with it is at least the rate without (see the top of
 * the file): the others' expected tokens and rows stay; a lone sequence taking it
 * runs no draft round. */
static bool lookup_chain(tdm_sched *s, step_item *it) {
    const tdm_seq *q = &it->r->s;
    tdm_spec_rec *sr = &it->r->sr;
    int32_t nd = tdm_ngram_propose(q->tokens, q->n_tokens, tdm_spec_lookup_n(sr), it->k_look, it->draft);
    if (nd > 0 && q->con) nd = tdm_constraint_prefix(&it->r->s, it->draft, nd); /* (cut at the first token the
                                                                                      grammar refuses) */
    if (nd <= 0) return false;
    const tdm_len_choice *ch = &s->len_ch;
    const tdm_len_ctrl *len = &s->ws->len;
    const bool decided = s->step_b > 0 && it->r->sr.ctrl.k_fixed == 0; /* (part of the decision's e and rows) */
    const double e_d = tdm_ctrl_expected_tokens(sr->ctrl.alpha, it->k);
    const double e_rest = decided ? TDM_MAX(ch->e - e_d, 0.0) : ch->e;
    const int32_t n = TDM_MAX(s->step_b, 1);
    const int32_t rows = (decided ? ch->rows : ch->rows + 1 + it->k) + s->other_rows;
    const int32_t rounds = TDM_MAX(s->step_k, it->k);
    const int32_t rounds_ng = s->n_spec > 1 ? rounds : 0;
    const double rate_ng = tdm_len_rate(len, n, e_rest + tdm_ctrl_expected_tokens(sr->ctrl_ng.alpha, nd),
                                        rows - it->k + nd, rounds_ng);
    const double rate_d = tdm_len_rate(len, n, e_rest + e_d, rows, it->k > 0 ? rounds : 0);
    if (!tdm_ngram_take(rate_ng, rate_d, &sr->n_ngram_skips)) return false;
    tdm_sched_take_lookup_chain(s, it, nd);
    return true;
}

bool tdm_sched_draft_chains(tdm_sched *s, step_item *it, int32_t n, int32_t *catch_up) {
    tdm_engine *e = s->e;
    tdm_chain_req req[TDM_ENGINE_BATCH_LOGITS_MAX];
    step_item *who[TDM_ENGINE_BATCH_LOGITS_MAX];
    int32_t m = 0;
    *catch_up = 0;
    for (int32_t i = 0; i < n && m < TDM_ENGINE_BATCH_LOGITS_MAX; i++) {
        step_item *x = &it[i];
        if (!x->decode || x->tree || x->ngram) continue;
        if (x->k_look > 0 && lookup_chain(s, x)) continue;
        if (x->k <= 0) continue;
        tdm_seq *q = &x->r->s;
        const bool coupled = q->sp.temperature > 0 && !x->reject;
        double *u = s->draws + (size_t)m * (TDM_CTRL_MAX_K + 1);
        if (coupled) tdm_engine_draws(q, x->k, u);
        who[m] = x;
        req[m++] = (tdm_chain_req){.s = q, .sr = &x->r->sr, .k = x->k, .k_ext = x->k, .u = coupled ? u : NULL,
                                   .draft = x->draft};
    }
    if (m == 0) return true;
    if (m == 1 && who[0]->k_look > who[0]->k) req[0].k_ext = who[0]->k_look; /* (a lone chain's extension) */
    const tdm_draft_scratch scr = tdm_sched_draft_scratch(s);
    tdm_err err = {0};
    const double t0 = tdm_now();
    tandem_status st = tdm_draft_chains(e, s->ws, req, m, &scr, catch_up, &err);
    if (st) {
        for (int32_t j = 0; j < m; j++) tdm_sched_fail(who[j]->r, st, &err);
        return false;
    }
    /* a round's cost: the drafting over its rounds, where it caught up on no more
     * than a token or two a sequence */
    int32_t rounds = 0;
    for (int32_t j = 0; j < m; j++) rounds = TDM_MAX(rounds, req[j].n_forwards);
    if (*catch_up <= m && rounds > 0) tdm_rowcost_observe(&s->ws->len.cost.draft, m, (tdm_now() - t0) / (double)rounds);
    for (int32_t j = 0; j < m; j++) { /* (p_min may have cut a chain, a lookup completed it) */
        who[j]->k = req[j].n_drafted;
        who[j]->n_model = req[j].n_model;
        who[j]->to = who[j]->from + 1 + req[j].n_drafted;
    }
    return true;
}
