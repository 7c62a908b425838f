/* chain.c - chain proposals: the draft model catches up on the committed tokens
 * it has not seen, then proposes up to k tokens autoregressively.
 *
 * Greedy (temperature 0): each drafted token is the draft's argmax.  Sampling: it
 * is drawn from q, the draft's distribution after the request's temperature /
 * top-k / top-p / min-p processing; q rows are kept in e->qprobs for verification.
 * Drafting stops early when the draft's top probability falls below p_min (greedy:
 * of the softmax of its logits; sampling: of q, the processed distribution).
 */
#include "engine.h"
#include "kv_cache.h"
#include "ngram.h"

static float max_of(const float *p, int32_t n) {
    float m = 0;
    for (int32_t i = 0; i < n; i++) m = p[i] > m ? p[i] : m;
    return m;
}

/* After draft[0..len) (the last one just drafted): an n-gram continuation of up to
 * k_ext - len tokens written to draft[len..], when its expected rate beats the draft
 * model's; returns its length (0: keep drafting).  Deciding from the drafted prefix
 * is sound: the proposal for a position may depend on everything before it. */
static int32_t lookup_extension(tdm_engine *e, tdm_seq *s, int32_t len, int32_t k, int32_t k_ext,
                                int32_t *draft) {
    if (!s->spec_ngram || k_ext <= len) return 0;
    int32_t m = tdm_ngram_propose(s->tokens, s->n_tokens + len, s->spec_ngram, k_ext - len, draft + len);
    if (m == 0) return 0;
    double rate_ng = tdm_ctrl_rate(&e->cost, s->ctrl_ng.alpha, 0.0, m);
    double rate_d = tdm_ctrl_rate(&e->cost, s->ctrl.alpha, tdm_cost_draft(&e->cost), TDM_MAX(k - len, 1));
    if (rate_ng < rate_d) return 0;
    tdm_spec_onehot_q(e, s, draft, len, m);
    return m;
}

tandem_status tdm_draft_chain(tdm_engine *e, tdm_seq *s, int32_t k, int32_t k_ext, int32_t *draft,
                              int32_t *n_drafted, int32_t *n_model, tdm_err *err) {
    const int32_t V = e->n_vocab;
    const bool greedy = s->sp.temperature <= 0;
    const int32_t n = s->n_tokens;
    tandem_status st;
    *n_drafted = *n_model = 0;
    /* catch up: rows [n_draft, n) -> the distribution of the token after them */
    if ((st = tdm_engine_feed(e, s, true, s->n_draft, n, true, TDM_FWD_LOGITS_APPROX, err))) return st;
    for (int32_t i = 0; i < k; i++) {
        const float *l = e->logits_d;
        /* p_min looks at the distribution only, never at the token drawn from it
         * (deciding on the drawn token would bias what reaches verification) */
        int32_t x;
        if (greedy) {
            if (i > 0 && s->spec_p_min > 0 && tdm_top_prob(l, V) < s->spec_p_min) break;
            x = tdm_argmax(l, V);
        } else {
            float *q = e->qprobs + (size_t)i * (size_t)V;
            tdm_probs_from_logits(l, V, &s->sp, &e->ss, q);
            if (i > 0 && s->spec_p_min > 0 && max_of(q, V) < s->spec_p_min) break;
            x = tdm_sample_probs(q, V, &s->rng);
        }
        draft[i] = x;
        *n_drafted = *n_model = i + 1;
        s->tokens[n + i] = x; /* stored after the committed tokens (fed below, looked up) */
        int32_t m = lookup_extension(e, s, i + 1, k, k_ext, draft);
        if (m > 0) {
            *n_drafted = i + 1 + m;
            break;
        }
        if (i + 1 == k) break;
        /* feed x at position n + i */
        if ((st = tdm_engine_feed(e, s, true, n + i, n + i + 1, true, TDM_FWD_LOGITS_APPROX, err))) return st;
    }
    return TANDEM_OK;
}
