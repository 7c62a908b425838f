/* batch_chain.c - greedy chains for many sequences at once.
 *
 * Round 0 catches every sequence's draft up on the committed tokens it has not
 * seen and drafts its first token; round r drafts token r of every sequence still
 * drafting, one row each.  Each round is one draft forward (more when its rows
 * exceed the batch or the logits rows), so the draft's weights are read once per
 * round for the whole batch, not once per sequence. */
#include "batch_chain.h"

#include "kv_cache.h"

/* rows of one draft forward being gathered, and whose drafted token each logits
 * row gives */
typedef struct round_buf {
    tdm_engine *e;
    tdm_rowcost *cost;
    const tdm_kv_seq **kv; /* [n] */
    int32_t *who;          /* [n_logit_rows] the sequence of each logits row */
    int32_t *slot;         /* [n_logit_rows] its index in that sequence's chain */
    int32_t *draft;        /* [n][TDM_CTRL_MAX_K] */
    int32_t m;             /* logits rows gathered */
} round_buf;

static tandem_status flush(round_buf *r, tdm_err *err) {
    tdm_engine *e = r->e;
    if (e->batch.n_rows == 0) return TANDEM_OK;
    const double t0 = tdm_now();
    e->batch.rows_shared = true; /* (a draft's rows only propose: the fastest products) */
    tandem_status st = tdm_engine_forward(e, true, &e->batch, r->kv, TDM_FWD_ARGMAX, err);
    if (st) return st;
    if (r->cost) tdm_rowcost_observe(r->cost, e->batch.n_rows, tdm_now() - t0);
    for (int32_t j = 0; j < r->m; j++) r->draft[(size_t)r->who[j] * TDM_CTRL_MAX_K + r->slot[j]] = e->ids[j];
    r->m = 0;
    tdm_batch_clear(&e->batch);
    return TANDEM_OK;
}

static tandem_status add_row(round_buf *r, int32_t seq, int32_t token, int32_t pos, int32_t want_slot, tdm_err *err) {
    tdm_engine *e = r->e;
    tandem_status st;
    if ((e->batch.n_rows >= e->max_rows || (want_slot >= 0 && r->m >= e->n_logit_rows)) && (st = flush(r, err)))
        return st;
    tdm_batch_add(&e->batch, token, pos, seq, pos, want_slot >= 0);
    if (want_slot >= 0) {
        r->who[r->m] = seq;
        r->slot[r->m++] = want_slot;
    }
    return TANDEM_OK;
}

tandem_status tdm_draft_batch_greedy(tdm_engine *e, tdm_seq *const *seqs, int32_t n, const int32_t *k,
                                     int32_t *draft, const tdm_kv_seq **kv, int32_t *who, int32_t *slot,
                                     tdm_rowcost *round_cost, tdm_err *err) {
    round_buf r = {e, NULL, kv, who, slot, draft, 0};
    int32_t k_max = 0;
    for (int32_t i = 0; i < n; i++) {
        kv[i] = &seqs[i]->kv;
        k_max = TDM_MAX(k_max, k[i]);
    }
    tandem_status st;
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
    r.cost = round_cost;
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
