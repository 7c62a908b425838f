/* commit.c - commits and rollbacks (commit.h). */
#include "commit.h"

#include <stdlib.h>
#include <string.h>

#include "constrain.h"
#include "kv_cache.h"
#include "penalty.h"

static bool append_text(tdm_seq *s, const char *t, size_t n) {
    if (s->text_len + n + 1 > s->text_cap) {
        size_t nc = TDM_MAX(s->text_cap * 2, s->text_len + n + 256);
        char *nt = realloc(s->text, nc);
        if (!nt) return false;
        s->text = nt;
        s->text_cap = nc;
    }
    memcpy(s->text + s->text_len, t, n);
    s->text_len += n;
    s->text[s->text_len] = 0;
    return true;
}

/* The committed token's log-probabilities from its row (tdm_seq.lp_rows), into
 * s->lp (sized at submission for every token the request can generate). */
static const tandem_token_logprob *take_logprob(tdm_seq *s, int32_t token) {
    const int32_t n_gen = s->n_tokens - s->n_prompt;
    if (n_gen >= s->lp_cap) return NULL; /* (never) */
    tandem_token_logprob *lp = &s->lp[n_gen];
    memset(lp, 0, sizeof *lp);
    if (s->lp_next < s->lp_fill) {
        const tdm_lp_row *r = &s->lp_rows[s->lp_next++];
        /* (the row's drawn token is the one committed: logprobs requests are verified by
         * agreement, a tree's rows of its accepted path: tdm_commit_tree) */
        lp->logprob = r->token == token ? (float)((double)r->logit - r->lse) : 0.0f;
        lp->n_top = TDM_MIN(r->k, s->lp_top);
        for (int32_t j = 0; j < lp->n_top; j++) {
            lp->top_ids[j] = r->ids[j];
            lp->top_logprobs[j] = (float)((double)r->val[j] - r->lse);
        }
    }
    return lp;
}

bool tdm_commit_token(tdm_engine *e, tdm_seq *s, int32_t token) {
    if (s->done) return false;
    const tandem_token_logprob *lp = s->lp_top >= 0 ? take_logprob(s, token) : NULL;
    s->tokens[s->n_tokens++] = token;
    const tdm_tokenizer *tok = e->target->tok;
    const size_t before = s->text_len;
    char *buf = e->piece;
    int32_t nb = tdm_detok_push(&s->detok, tok, token, buf, e->piece_cap);
    if (nb > 0) append_text(s, buf, (size_t)nb);
    int32_t n_gen = s->n_tokens - s->n_prompt;
    const bool refused = s->con && !tdm_constraint_commit(s, token); /* (the request fails: step.c) */
    if (s->pen) tdm_penalty_commit(s, token);
    if (!s->ignore_eos && tdm_tok_is_eog(tok, token)) {
        s->done = true;
        s->finish = TANDEM_FINISH_EOS;
    } else if (n_gen >= s->max_new || s->n_tokens >= e->cfg.n_ctx) {
        s->done = true;
        s->finish = TANDEM_FINISH_LENGTH;
    } else if (refused || (s->con && tdm_constraint_finished(s))) { /* nothing can follow */
        s->done = true;
        s->finish = TANDEM_FINISH_STOP;
    }
    if (s->done) {
        int32_t nf = tdm_detok_flush(&s->detok, buf, e->piece_cap);
        if (nf > 0) append_text(s, buf, (size_t)nf);
    }
    /* a stop string ends the text before it, whatever else ended it */
    if (s->stop.n && s->text_len > before && n_gen >= s->min_tokens) { /* (none before min_tokens) */
        ptrdiff_t at = tdm_stop_find(&s->stop, s->text, s->text_len, before);
        if (at >= 0) {
            s->text_len = (size_t)at;
            s->text[at] = 0;
            s->done = true;
            s->finish = TANDEM_FINISH_STOP;
        }
    }
    /* stream what can no longer begin a stop string */
    size_t safe = s->done ? s->text_len : s->text_len - tdm_stop_holdback(&s->stop, s->text, s->text_len);
    if (safe < s->emitted) safe = s->emitted;
    const char *piece = s->text ? s->text + s->emitted : "";
    const size_t n_piece = safe - s->emitted;
    s->emitted = safe;
    if ((s->on_token && !s->on_token(token, piece, n_piece, s->user_data)) ||
        (s->on_token_lp && !s->on_token_lp(token, piece, n_piece, lp, s->user_data))) {
        if (!s->done) s->finish = TANDEM_FINISH_CANCELLED;
        s->done = true;
    }
    return !s->done;
}

void tdm_commit_chain(tdm_engine *e, tdm_seq *s, const int32_t *draft, const tdm_verdict *v) {
    const int32_t n = s->n_tokens, acc = v->n_acc;
    s->n_target = n + acc;
    if (s->n_draft > n + acc) s->n_draft = n + acc;
    tdm_kv_seq_truncate(e->pool, &s->kv, n + acc);
    bool go = true;
    for (int32_t i = 0; i < acc && go; i++) go = tdm_commit_token(e, s, draft[i]);
    if (go) tdm_commit_token(e, s, v->next);
}

/* A tree's logprobs rows (its pending token's, then node i's at 1 + i, as verified)
 * cut to its accepted path's: row 0 and the rows of path[0..m), which give the path's
 * tokens after the first and the bonus token. */
static void keep_path_lp_rows(tdm_seq *s, const tdm_tree *t, const int32_t *path, int32_t m) {
    if (s->lp_top < 0 || s->lp_next != 0 || s->lp_fill != 1 + t->n) return; /* (not a tree's rows: none kept) */
    for (int32_t j = 0; j < m; j++) s->lp_rows[1 + j] = s->lp_rows[1 + path[j]]; /* (path[j] >= j: a node's
                                                                                  parent comes first) */
    s->lp_fill = 1 + m;
}

tandem_status tdm_commit_tree(tdm_engine *e, tdm_seq *s, const tdm_tree *t, const tdm_verdict *v, tdm_err *err) {
    const int32_t n = s->n_tokens, m = v->n_acc;
    const int32_t *path = v->path;
    int32_t src[TDM_TREE_MAX] = {0}, dst[TDM_TREE_MAX] = {0}, f = 0, nm = 0;
    tandem_status st;
    /* (a node already at its place, as the spine's are, does not move) */
    for (int32_t j = 0; j < m; j++)
        if (path[j] != j) src[nm] = n + path[j], dst[nm++] = n + j;
    if ((st = tdm_kv_store_move_slots(&e->kv_t, &s->kv, src, dst, nm, err))) return st;
    /* the draft saw a prefix of the path (a node it saw has every ancestor seen); an
     * EAGLE-3 head's drafted slots are dropped instead (its pending features, head.c) */
    nm = 0;
    while (f < m && !e->head && t->dslot[path[f]] >= 0) {
        if (t->dslot[path[f]] != f) src[nm] = n + t->dslot[path[f]], dst[nm++] = n + f;
        f++;
    }
    if (e->draft && (st = tdm_kv_store_move_slots(&e->kv_d, &s->kv, src, dst, nm, err))) return st;
    s->n_target = n + m;
    s->n_draft = TDM_MIN(s->n_draft, n) + (s->n_draft >= n ? f : 0);
    tdm_kv_seq_truncate(e->pool, &s->kv, n + m);
    keep_path_lp_rows(s, t, path, m);
    bool go = true;
    for (int32_t j = 0; j < m && go; j++) go = tdm_commit_token(e, s, t->token[path[j]]);
    if (go) tdm_commit_token(e, s, v->next);
    return TANDEM_OK;
}

void tdm_spec_stats_add(tdm_spec_rec *sr, tdm_payoff *pair, const tdm_step_obs *o) {
    tandem_spec_stats *ss = &sr->spec;
    if (pair && o->proposed > 0 && (!o->tree || o->lookup_step)) {
        const tdm_pay_kind k = o->looked_up > 0 || o->lookup_step ? TDM_PAY_LOOKUP : TDM_PAY_MODEL;
        tdm_payoff_observe(&sr->pay, k, o->committed, o->draft_s + o->verify_s);
        tdm_payoff_observe(pair, k, o->committed, o->draft_s + o->verify_s);
    }
    ss->forwards++;
    ss->forward_tokens += (uint64_t)o->committed;
    if (o->looked_up > 0 || o->lookup_step) {
        ss->ngram_drafted += (uint64_t)o->looked_up;
        ss->ngram_accepted += (uint64_t)o->looked_up_acc;
    }
    if (o->lookup_step) ss->ngram_steps++;
    if (o->k_final >= 0) ss->k_final = o->k_final;
    if (o->proposed == 0) return;
    ss->steps++;
    if (o->tree) {
        ss->tree_steps++;
        ss->tree_nodes += (uint64_t)o->proposed;
    }
    ss->drafted += (uint64_t)o->proposed;
    ss->accepted += (uint64_t)o->accepted;
    ss->accept_hist[o->accepted < TANDEM_SPEC_HIST_MAX ? o->accepted : TANDEM_SPEC_HIST_MAX - 1]++;
    ss->draft_ms += o->draft_s * 1e3;
    ss->verify_ms += o->verify_s * 1e3;
}

void tdm_spec_stats_result(tandem_spec_stats *out, const tandem_spec_stats *ss, double decode_ms, bool has_draft) {
    *out = *ss;
    if (out->drafted) out->acceptance_rate = (double)out->accepted / (double)out->drafted;
    if (out->steps) out->mean_accepted = (double)out->accepted / (double)out->steps;
    if (has_draft) {
        const double other = decode_ms - out->draft_ms - out->verify_ms;
        out->other_ms = other > 0 ? other : 0;
    }
}
