/* tree_verify.c - a token tree's rows in a verification forward, and rejection
 * sampling's verdict on it (tree_verify.h). */
#include "tree_verify.h"

#include "tree_accept.h"

bool tdm_tree_rows(tdm_batch *b, const tdm_seq *s, const tdm_tree *t, int32_t si) {
    const int32_t n = s->n_tokens;
    if (b->n_rows + 1 + t->n > b->cap) return false;
    tdm_batch_add(b, s->tokens[n - 1], n - 1, si, n - 1, true);
    for (int32_t i = 0; i < t->n; i++) {
        if (i < t->n_spine) /* (slot n + i, position n + i: a chain's row; tree.h) */
            tdm_batch_add(b, t->token[i], n + i, si, n + i, true);
        else
            tdm_batch_add_tree(b, t->token[i], n + t->depth[i], si, n + i, n, t->mask[i], true);
    }
    /* a verification's rows, each computed as in a decode step, also when every
     * node is on the spine (the backends' tree batches keep that up to more rows) */
    if (t->n > 0 && b->tree_mask) b->tree = true;
    return true;
}

tandem_status tdm_verify_tree_reject(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, const tdm_tree *t, int32_t row0,
                                     tdm_verdict *v, tdm_err *err) {
    const int32_t V = e->n_vocab;
    const float *rows = e->logits_t + (size_t)row0 * (size_t)V;
    for (int32_t i = 0; i <= t->n; i++)
        tdm_probs_from_logits(rows + (size_t)i * (size_t)V, V, &s->sp, &e->ss, ws->tree_p + (size_t)i * (size_t)V);
    v->n_acc = tdm_tree_accept_sample(t, ws->tree_p, ws->tree_q, V, false, &s->rng, ws->tree_scr, v->path, &v->next);
    if (v->next < 0) return tdm_engine_nonfinite(e, false, s->n_tokens - 1, err);
    return TANDEM_OK;
}
