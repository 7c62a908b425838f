/* batch_verify.c - acceptance by agreement and commit of a chain verified in a
 * batch (batch_verify.h); the rule and the rollback are verify.c's. */
#include "batch_verify.h"

#include "accept.h"

int32_t tdm_verify_commit_match(tdm_engine *e, tdm_seq *s, const int32_t *draft, int32_t k, const int32_t *target,
                                bool ngram, double draft_s, double verify_s) {
    int32_t next;
    const int32_t acc = tdm_accept_greedy(draft, k, target, &next), before = s->n_tokens;
    if (s->sp.temperature > 0) tdm_engine_consume(s, acc + 1);
    tdm_verify_keep(e, s, draft, acc, next);
    s->spec.forwards++;
    s->spec.forward_tokens += (uint64_t)(s->n_tokens - before);
    if (k == 0) return 0;
    tdm_ctrl_observe(ngram ? &s->ctrl_ng : &s->ctrl, k, acc);
    tandem_spec_stats *ss = &s->spec;
    ss->steps++;
    ss->drafted += (uint64_t)k;
    ss->accepted += (uint64_t)acc;
    if (ngram) {
        ss->ngram_steps++;
        ss->ngram_drafted += (uint64_t)k;
        ss->ngram_accepted += (uint64_t)acc;
    }
    ss->accept_hist[acc < TANDEM_SPEC_HIST_MAX ? acc : TANDEM_SPEC_HIST_MAX - 1]++;
    ss->k_final = k;
    ss->draft_ms += draft_s * 1e3;
    ss->verify_ms += verify_s * 1e3;
    return acc;
}
