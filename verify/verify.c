/* verify.c - verification of a drafted chain: one target forward over the pending
 * token and the k drafted tokens, the acceptance rule, commit and rollback.
 *
 * Rows: [last committed token, x_1, ..., x_k] at positions n-1 .. n+k-1.  Row i's
 * logits are the target's distribution for the token after it, so row i judges
 * x_{i+1} and row k gives the bonus token.  After acceptance of a prefix of length
 * a, the target holds positions [0, n + a) and the draft at most as many (it may
 * not have been fed the last drafted token); one truncate of the shared block table
 * to n + a rolls both back.
 */
#include "accept.h"
#include "engine.h"
#include "kv_cache.h"

tandem_status tdm_verify_chain(tdm_engine *e, tdm_seq *s, const int32_t *draft, int32_t k,
                               int32_t *n_accepted, tdm_err *err) {
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
    const bool greedy = s->sp.temperature <= 0;
    /* greedy needs only each row's argmax, which the quantised head finds exactly */
    if ((st = tdm_engine_forward(e, false, b, seqs, greedy ? TDM_FWD_ARGMAX : TDM_FWD_LOGITS, err))) return st;

    int32_t acc, next;
    if (greedy) {
        acc = tdm_accept_greedy(draft, k, e->ids, &next);
    } else {
        for (int32_t i = 0; i <= k; i++)
            tdm_probs_from_logits(e->logits_t + (size_t)i * (size_t)V, V, &s->sp, &e->ss,
                                  e->probs + (size_t)i * (size_t)V);
        acc = tdm_accept_sample(draft, k, e->probs, e->qprobs, V, &s->rng, e->tmp, &next);
    }

    /* roll back both models to the accepted prefix with one truncate: the target
     * holds rows up to x_acc; the draft holds what it was fed, at most as much */
    s->n_target = n + acc;
    if (s->n_draft > n + acc) s->n_draft = n + acc;
    tdm_kv_seq_truncate(e->pool, &s->kv, n + acc);

    /* commit the accepted tokens and the target's token */
    bool go = true;
    for (int32_t i = 0; i < acc && go; i++) go = tdm_seq_commit(e, s, draft[i]);
    if (go) tdm_seq_commit(e, s, next);
    *n_accepted = acc;
    return TANDEM_OK;
}
