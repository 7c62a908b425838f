/* verify.c - rejection sampling's verdict on a drafted chain (verify.h).
 *
 * Rows: [last committed token, x_1, ..., x_k] at positions n-1 .. n+k-1.  Row i's
 * logits are the target's distribution for the token after it, so row i judges
 * x_{i+1} and row k gives the bonus token.
 */
#include "verify.h"

#include "accept.h"

tandem_status tdm_verify_reject(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, const int32_t *draft, int32_t k,
                                int32_t n_q_dev, int32_t row0, tdm_fwd_kind kind, tdm_verdict *v, tdm_err *err) {
    const int32_t V = e->n_vocab, n = s->n_tokens;
    int32_t acc, next;
    tandem_status st;
    if (kind == TDM_FWD_LOGITS_DEV) {
        if (!ws->q_dev || !e->p_dev)
            return tdm_seterr(err, TANDEM_ERR_INTERNAL, "rejection sampling on the device without its buffers");
        /* p rows and the acceptance rule on the device, with the draws the host rule
         * would make: one per decision, one for the emitted token */
        const tdm_backend_ops *op = e->be->ops;
        double u[TDM_CTRL_MAX_K + 1];
        tdm_engine_draws(s, k + 1, u);
        int32_t *out = e->samp_dev + TDM_ENGINE_SAMP_OUT;
        const float *rows = e->out_t + (size_t)row0 * (size_t)V;
        if ((st = op->probs_dev(e->be, rows, k + 1, V, &s->sp, e->p_dev, e->samp_dev, err))) return st;
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
    } else if (kind == TDM_FWD_LOGITS) {
        const float *rows = e->logits_t + (size_t)row0 * (size_t)V;
        for (int32_t i = 0; i <= k; i++)
            tdm_probs_from_logits(rows + (size_t)i * (size_t)V, V, &s->sp, &e->ss, ws->probs + (size_t)i * (size_t)V);
        acc = tdm_accept_sample(draft, k, ws->probs, ws->qprobs, V, &s->rng, e->tmp, &next);
    } else {
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "rejection sampling needs logits rows (forward kind %d)", (int)kind);
    }
    v->n_acc = acc;
    v->next = next;
    return TANDEM_OK;
}
