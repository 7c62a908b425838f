/* spec.c - one speculative step: choose k, draft a chain, verify it, adapt.
 *
 * The step never drafts more than the request can still use (max tokens, context),
 * and falls back to a plain target step when no draft token fits. */
#include "engine.h"

tandem_status tdm_spec_step(tdm_engine *e, tdm_seq *s, tdm_err *err) {
    tandem_status st;
    const int32_t n = s->n_tokens;
    const int32_t k_chosen = tdm_ctrl_choose_k(&s->ctrl, &e->cost);
    int32_t k = k_chosen;
    /* Adaptive mode explores: every 8th step drafts one token more or fewer than the
     * controller's choice, so the verify costs of the neighbouring lengths stay
     * measured (an estimate that is never re-measured can keep a stale value). */
    if (s->ctrl.k_fixed == 0 && (++s->n_spec_steps & 7) == 0) {
        k += (s->n_spec_steps & 8) ? 1 : -1;
        if (k < s->ctrl.k_min) k = TDM_MIN(k_chosen + 1, s->ctrl.k_max);
        if (k > s->ctrl.k_max) k = TDM_MAX(k_chosen - 1, s->ctrl.k_min);
    }
    int32_t room = s->max_new - (n - s->n_prompt) - 1; /* tokens beyond the one the target adds */
    int32_t ctx_room = e->cfg.n_ctx - n;
    if (k > room) k = room;
    if (k > ctx_room) k = ctx_room;
    if (k <= 0) return tdm_seq_step_target(e, s, err);
    int32_t draft[TDM_CTRL_MAX_K];
    int32_t nd, acc;
    double t0 = tdm_now();
    if ((st = tdm_draft_chain(e, s, k, draft, &nd, err))) return st;
    double t1 = tdm_now();
    if ((st = tdm_verify_chain(e, s, draft, nd, &acc, err))) return st;
    double t2 = tdm_now();

    tdm_cost_observe_draft(&e->cost, (t1 - t0) / (double)nd); /* nd draft forwards */
    tdm_cost_observe_verify(&e->cost, nd + 1, t2 - t1);
    tdm_ctrl_observe(&s->ctrl, nd, acc);

    tandem_spec_stats *ss = &s->spec;
    ss->steps++;
    ss->drafted += (uint64_t)nd;
    ss->accepted += (uint64_t)acc;
    ss->accept_hist[acc < TANDEM_SPEC_HIST_MAX ? acc : TANDEM_SPEC_HIST_MAX - 1]++;
    ss->k_final = k_chosen; /* the controller's choice, before end-of-request clamping */
    ss->draft_ms += (t1 - t0) * 1e3;
    ss->verify_ms += (t2 - t1) * 1e3;
    return TANDEM_OK;
}
