/* tree_verify.c - one target forward over a token tree and its verdict
 * (tree_verify.h). */
#include "tree_verify.h"

#include "kv_cache.h"
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

tandem_status tdm_verify_tree(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, const tdm_tree *t, tdm_verdict *v, tdm_err *err) {
    const int32_t V = e->n_vocab, n = s->n_tokens;
    const tdm_kv_seq *seqs[1] = {&s->kv};
    tandem_status st;
    int32_t *path = v->path;
    v->n_acc = 0;
    if ((st = tdm_kv_seq_reserve(e->pool, &s->kv, n + TDM_MAX(t->n, t->n_fed), err))) return st;
    if (e->copy_status) return tdm_seterr(err, e->copy_status, "%s", e->copy_err.msg);
    if (1 + t->n > e->n_logit_rows)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "a tree of %d nodes exceeds the engine's %d logits rows", (int)t->n,
                          (int)e->n_logit_rows);
    tdm_batch *b = &e->batch;
    tdm_batch_clear(b);
    tdm_tree_rows(b, s, t, 0);
    const bool greedy = s->sp.temperature <= 0;
    if ((st = tdm_engine_forward(e, false, b, seqs, greedy ? TDM_FWD_ARGMAX : TDM_FWD_LOGITS, err))) return st;
    tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_VERIFY);
    int32_t m, next;
    if (greedy) {
        m = tdm_tree_accept_match(t, e->ids, path, &next);
    } else {
        for (int32_t i = 0; i <= t->n; i++)
            tdm_probs_from_logits(e->logits_t + (size_t)i * (size_t)V, V, &s->sp, &e->ss, ws->tree_p + (size_t)i * (size_t)V);
        m = tdm_tree_accept_sample(t, ws->tree_p, ws->tree_q, V, false, &s->rng, ws->tree_scr, path, &next);
    }
    if (next < 0) return tdm_engine_nonfinite(e, false, n - 1, err);
    v->n_acc = m;
    v->next = next;
    tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_ACCEPT);
    return TANDEM_OK;
}
