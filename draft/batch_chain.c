/* batch_chain.c - chains for many sequences at once.
 *
 * Round 0 catches every sequence's draft up on the committed tokens it has not
 * seen and drafts its first token; round r drafts token r of every sequence still
 * drafting, one row each.  Each round is one draft forward (more when its rows
 * exceed the batch or the logits rows), so the draft's weights are read once per
 * round for the whole batch, not once per sequence.  A round whose rows are all
 * greedy asks the forward for argmaxes only; one with a sampled row asks for
 * logits (on the device where the engine samples there).  On a backend that keeps
 * argmaxes on the device, a batch of greedy sequences with one k runs its rounds
 * back to back there and waits once. */
#include "batch_chain.h"

#include "kv_cache.h"

/* rows of one draft forward being gathered, and whose drafted token each logits
 * row gives */
typedef struct round_buf {
    tdm_engine *e;
    const tdm_draft_scratch *scr;
    tdm_seq *const *seqs;
    const double *u;  /* [n][TDM_CTRL_MAX_K + 1] */
    int32_t *draft;   /* [n][TDM_CTRL_MAX_K] */
    int32_t m;        /* logits rows gathered */
    bool sampled;     /* one of them samples */
} round_buf;

static tandem_status flush(round_buf *r, tdm_err *err) {
    tdm_engine *e = r->e;
    const tdm_draft_scratch *scr = r->scr;
    if (e->batch.n_rows == 0) return TANDEM_OK;
    e->batch.rows_shared = true; /* (a draft's rows only propose: the fastest products) */
    const tdm_fwd_kind kind = !r->sampled ? TDM_FWD_ARGMAX : e->p_dev ? TDM_FWD_LOGITS_DEV : TDM_FWD_LOGITS;
    tandem_status st = tdm_engine_forward(e, true, &e->batch, scr->kv, kind, err);
    for (int32_t j = 0; j < r->m && !st; j++) {
        const int32_t i = scr->who[j];
        scr->rows[j] = (tdm_draw_row){r->seqs[i], r->u[(size_t)i * (TDM_CTRL_MAX_K + 1) + scr->slot[j]]};
    }
    if (!st) st = tdm_engine_draw(e, true, scr->rows, r->m, kind, scr->tok, err);
    for (int32_t j = 0; j < r->m && !st; j++) {
        const int32_t x = scr->tok[j];
        if (x < 0) return tdm_engine_nonfinite(e, true, -1, err);
        r->draft[(size_t)scr->who[j] * TDM_CTRL_MAX_K + scr->slot[j]] = x;
    }
    r->m = 0;
    r->sampled = false;
    tdm_batch_clear(&e->batch);
    return st;
}

static tandem_status add_row(round_buf *r, int32_t seq, int32_t token, int32_t pos, int32_t want_slot, tdm_err *err) {
    tdm_engine *e = r->e;
    tandem_status st;
    if ((e->batch.n_rows >= e->max_rows || (want_slot >= 0 && r->m >= e->n_logit_rows)) && (st = flush(r, err)))
        return st;
    tdm_batch_add(&e->batch, token, pos, seq, pos, want_slot >= 0);
    if (want_slot >= 0) {
        r->scr->who[r->m] = seq;
        r->scr->slot[r->m++] = want_slot;
        r->sampled |= r->seqs[seq]->sp.temperature > 0;
    }
    return TANDEM_OK;
}

/* Every sequence greedy with the same k, round 0 within one forward: the rounds can
 * run back to back on the device (on_device below). */
static bool device_rounds(const tdm_engine *e, const tdm_spec_ws *ws, tdm_seq *const *seqs, int32_t n, const int32_t *k) {
    if (!ws->bchain_dev || n > e->n_logit_rows || k[0] < 1 || k[0] > TDM_CTRL_MAX_K) return false;
    int32_t rows = 0;
    for (int32_t i = 0; i < n; i++) {
        if (seqs[i]->sp.temperature > 0 || k[i] != k[0]) return false;
        rows += seqs[i]->n_tokens - seqs[i]->n_draft;
    }
    return rows <= e->max_rows;
}

/* The rounds queued back to back, each embedding the tokens the one before chose
 * where they are (ws->bchain_dev, round d's n tokens at d * n), and the host waits
 * once, for every round's tokens: the same chains as the rounds one by one (the
 * argmax of each row is the same whatever else is queued), without a round trip per
 * round. */
static tandem_status on_device(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *const *seqs, int32_t n, int32_t k, int32_t *draft,
                               const tdm_draft_scratch *scr, tdm_err *err) {
    tdm_batch *b = &e->batch;
    int32_t *ids = ws->bchain_dev;
    tandem_status st;
    tdm_batch_clear(b);
    for (int32_t i = 0; i < n; i++) {
        const tdm_seq *s = seqs[i];
        for (int32_t p = s->n_draft; p < s->n_tokens; p++) tdm_batch_add(b, s->tokens[p], p, i, p, p == s->n_tokens - 1);
    }
    b->rows_shared = true;
    if ((st = tdm_model_forward_dev(e->draft, e->be, &e->kv_d, b, scr->kv, &e->fs_d, NULL, e->out_d, ids, NULL, err)))
        return st;
    for (int32_t d = 1; d < k; d++) {
        tdm_batch_clear(b);
        for (int32_t i = 0; i < n; i++) {
            const int32_t pos = seqs[i]->n_tokens + d - 1;
            tdm_batch_add(b, 0, pos, i, pos, true); /* (the token is ids[(d - 1) * n + i]) */
        }
        b->rows_shared = true;
        if ((st = tdm_model_forward_dev(e->draft, e->be, &e->kv_d, b, scr->kv, &e->fs_d, ids + (size_t)(d - 1) * n,
                                        e->out_d, ids + (size_t)d * n, NULL, err)))
            return st;
    }
    tdm_batch_clear(b);
    int32_t *got = scr->tok; /* [n_logit_rows]: a round at a time */
    for (int32_t d = 0; d < k; d++) {
        if ((st = e->be->ops->download(e->be, got, ids + (size_t)d * n, (size_t)n * sizeof(int32_t), err))) return st;
        for (int32_t i = 0; i < n; i++) {
            if (got[i] < 0) return tdm_engine_nonfinite(e, true, -1, err);
            draft[(size_t)i * TDM_CTRL_MAX_K + d] = got[i];
        }
    }
    return TANDEM_OK;
}

tandem_status tdm_draft_batch(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *const *seqs, int32_t n, const int32_t *k, const double *u,
                              int32_t *draft, const tdm_draft_scratch *scr, int32_t *catch_up, tdm_err *err) {
    round_buf r = {e, scr, seqs, u, draft, 0, false};
    int32_t k_max = 0;
    *catch_up = 0;
    for (int32_t i = 0; i < n; i++) {
        scr->kv[i] = &seqs[i]->kv;
        k_max = TDM_MAX(k_max, k[i]);
    }
    for (int32_t i = 0; i < n; i++)
        if (k[i] > 0) *catch_up += TDM_MAX(0, seqs[i]->n_tokens - 1 - seqs[i]->n_draft);
    tandem_status st;
    if (device_rounds(e, ws, seqs, n, k)) {
        if ((st = on_device(e, ws, seqs, n, k[0], draft, scr, err))) return st;
        for (int32_t i = 0; i < n; i++) seqs[i]->n_draft = seqs[i]->n_tokens + k[0] - 1;
        return TANDEM_OK;
    }
    tdm_batch_clear(&e->batch);
    /* round 0: the catch-up rows, the last of each giving its first token */
    for (int32_t i = 0; i < n; i++) {
        const tdm_seq *s = seqs[i];
        if (k[i] <= 0) continue;
        for (int32_t p = s->n_draft; p < s->n_tokens; p++)
            if ((st = add_row(&r, i, s->tokens[p], p, p == s->n_tokens - 1 ? 0 : -1, err))) return st;
    }
    if ((st = flush(&r, err))) return st;
    /* rounds 1 .. k_max - 1: one row per sequence still drafting */
    for (int32_t d = 1; d < k_max; d++) {
        for (int32_t i = 0; i < n; i++) {
            if (k[i] <= d) continue;
            const tdm_seq *s = seqs[i];
            const int32_t pos = s->n_tokens + d - 1;
            if ((st = add_row(&r, i, draft[(size_t)i * TDM_CTRL_MAX_K + d - 1], pos, d, err))) return st;
        }
        if ((st = flush(&r, err))) return st;
    }
    for (int32_t i = 0; i < n; i++)
        if (k[i] > 0) seqs[i]->n_draft = seqs[i]->n_tokens + k[i] - 1;
    return TANDEM_OK;
}
