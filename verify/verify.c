/* verify.c - verification of a drafted chain: one target forward over the pending
 * token and the k drafted tokens, and the acceptance rule's verdict (the scheduler
 * commits it: sched/commit.c).
 *
 * Rows: [last committed token, x_1, ..., x_k] at positions n-1 .. n+k-1.  Row i's
 * logits are the target's distribution for the token after it, so row i judges
 * x_{i+1} and row k gives the bonus token.
 */
#include "verify.h"

#include "accept.h"
#include "kv_cache.h"

tandem_status tdm_verify_chain(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, const int32_t *draft, int32_t k, int32_t n_q_dev,
                               tdm_verdict *v, tdm_err *err) {
    const int32_t V = e->n_vocab;
    const int32_t n = s->n_tokens;
    const tdm_kv_seq *seqs[1] = {&s->kv};
    tandem_status st;
    if ((st = tdm_kv_seq_reserve(e->pool, &s->kv, n + k, err))) return st;
    if (e->copy_status) return tdm_seterr(err, e->copy_status, "%s", e->copy_err.msg);

    tdm_batch *b = &e->batch;
    tdm_batch_clear(b);
    tdm_batch_add(b, s->tokens[n - 1], n - 1, 0, n - 1, true);
    for (int32_t i = 0; i < k; i++) tdm_batch_add(b, draft[i], n + i, 0, n + i, true);
    const bool greedy = s->sp.temperature <= 0, on_dev = !greedy && ws->q_dev;
    /* greedy needs only each row's argmax, which the quantised head finds exactly */
    const tdm_fwd_kind kind = greedy ? TDM_FWD_ARGMAX : on_dev ? TDM_FWD_LOGITS_DEV : TDM_FWD_LOGITS;
    if ((st = tdm_engine_forward(e, false, b, seqs, kind, err))) return st;

    int32_t acc, next;
    if (greedy) {
        acc = tdm_accept_greedy(draft, k, e->ids, &next);
    } else if (on_dev) {
        /* p rows and the acceptance rule on the device, with the draws the host rule
         * would make: one per decision, one for the emitted token */
        const tdm_backend_ops *op = e->be->ops;
        double u[TDM_CTRL_MAX_K + 1];
        tdm_engine_draws(s, k + 1, u);
        int32_t *out = e->samp_dev + TDM_ENGINE_SAMP_OUT;
        if ((st = op->probs_dev(e->be, e->out_t, k + 1, V, &s->sp, e->p_dev, e->samp_dev, err))) return st;
        if ((st = op->accept_dev(e->be, e->p_dev, ws->q_dev, TDM_MIN(n_q_dev, k), draft, k, V, u, out, err)))
            return st;
        int32_t got[TDM_ENGINE_SAMP_WORDS];
        if ((st = op->download(e->be, got, e->samp_dev, sizeof got, err))) return st;
        if ((st = tdm_engine_check_ok(e, false, got, k + 1, n - 1, err))) return st;
        acc = got[TDM_ENGINE_SAMP_OUT];
        next = got[TDM_ENGINE_SAMP_OUT + 1];
        if (acc < 0 || acc > k || next < 0 || next >= V)
            return tdm_seterr(err, TANDEM_ERR_BACKEND, "device acceptance gave %d accepted, token %d", (int)acc, (int)next);
        tdm_engine_consume(s, acc < k ? acc + 2 : k + 1);
    } else {
        for (int32_t i = 0; i <= k; i++)
            tdm_probs_from_logits(e->logits_t + (size_t)i * (size_t)V, V, &s->sp, &e->ss,
                                  ws->probs + (size_t)i * (size_t)V);
        acc = tdm_accept_sample(draft, k, ws->probs, ws->qprobs, V, &s->rng, e->tmp, &next);
    }

    v->n_acc = acc;
    v->next = next;
    return TANDEM_OK;
}
