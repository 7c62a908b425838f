/* sched.c - many requests at once: iteration-level (continuous) batching.
 *
 * Requests wait in array order; up to the engine's n_seq_max run at a time.  A
 * request joins when a place is free: its prompt is prefilled and its first token
 * committed.  Each iteration then advances every running sequence by one token
 * with one target forward whose rows are the sequences' pending tokens (in chunks
 * of at most the backend's batch-invariant rows and the engine's logits rows), so
 * the weights are read once for all of them, and every row is computed as it would
 * be alone: greedy output equals one-at-a-time output.  A sequence that finishes
 * leaves at once and frees its blocks; the next request takes its place in the
 * same iteration.
 *
 * Speculation: a greedy sequence that runs alone on an engine with a draft steps
 * speculatively (tdm_spec_step; greedy output is the same either way).  Sampled
 * sequences always step target-only, so a request's tokens never depend on the
 * rest of the batch.  Tokens are drawn as the single-request path draws them (on
 * the device where the engine samples there), with the request's own generator.
 *
 * Errors: a request whose prompt or parameters are bad, or that finds no KV blocks,
 * fails alone (status and message in its result) and frees what it held; the
 * others go on.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kv_cache.h"

typedef struct sched_slot {
    tdm_seq s;
    int32_t req;           /* request index */
    double t_start, t_first; /* wall clock at admission and after the first token */
} sched_slot;

static void fail_req(tandem_result *r, tandem_status st, const tdm_err *err) {
    memset(r, 0, sizeof *r);
    r->status = st ? st : TANDEM_ERR_BACKEND;
    r->error = strdup(err && err->msg[0] ? err->msg : tandem_status_str(r->status));
}

static void finish_slot(tdm_engine *e, sched_slot *sl, tandem_result *res, tandem_status st, const tdm_err *err) {
    tandem_result *r = &res[sl->req];
    tdm_err rerr = {0};
    if (!st) st = tdm_seq_result(e, &sl->s, (sl->t_first - sl->t_start) * 1e3, (tdm_now() - sl->t_first) * 1e3, r,
                                 &rerr), err = &rerr;
    if (st) {
        tandem_result_free(r);
        fail_req(r, st, err);
    }
    tdm_seq_release(e, &sl->s);
    sl->req = -1;
}

/* One token for each of the n sequences (all not done, all stepping target-only):
 * one forward over their pending tokens.  A sequence that cannot reserve its next
 * slot gets st_row set, gives its blocks back at once and is left out; a failed
 * forward fails them all. */
static void step_rows(tdm_engine *e, sched_slot *const *sl, int32_t n, tandem_status *st_row, tdm_err *err_row) {
    const tdm_kv_seq *seqs[TDM_ENGINE_LOGIT_ROWS];
    int32_t idx[TDM_ENGINE_LOGIT_ROWS], m = 0;
    bool any_sample = false;
    for (int32_t i = 0; i < n; i++) {
        tdm_seq *s = &sl[i]->s;
        st_row[i] = tdm_kv_seq_reserve(e->pool, &s->kv, s->n_tokens, &err_row[i]);
        if (!st_row[i] && e->copy_status) st_row[i] = tdm_seterr(&err_row[i], e->copy_status, "%s", e->copy_err.msg);
        if (st_row[i]) { /* it fails alone: its blocks go back now, for the rows after it */
            tdm_kv_seq_free(e->pool, &s->kv);
            continue;
        }
        idx[m] = i;
        seqs[m++] = &s->kv;
        any_sample |= s->sp.temperature > 0;
    }
    if (m == 0) return;
    tdm_batch *b = &e->batch;
    tdm_batch_clear(b);
    for (int32_t j = 0; j < m; j++) {
        const tdm_seq *s = &sl[idx[j]]->s;
        tdm_batch_add(b, s->tokens[s->n_tokens - 1], s->n_tokens - 1, j, s->n_tokens - 1, true);
    }
    const bool dev = e->p_dev != NULL;
    const tdm_fwd_kind kind = !any_sample ? TDM_FWD_ARGMAX : dev ? TDM_FWD_LOGITS_DEV : TDM_FWD_LOGITS;
    tdm_err ferr = {0};
    tandem_status st = tdm_engine_forward(e, false, b, seqs, kind, &ferr);
    int32_t tok[TDM_ENGINE_LOGIT_ROWS];
    if (!st && kind == TDM_FWD_ARGMAX) memcpy(tok, e->ids, (size_t)m * sizeof(int32_t));
    if (!st && kind == TDM_FWD_LOGITS)
        for (int32_t j = 0; j < m && !st; j++) {
            tdm_seq *s = &sl[idx[j]]->s;
            const float *l = e->logits_t + (size_t)j * (size_t)e->n_vocab;
            tok[j] = s->sp.temperature > 0 ? tdm_sample_logits(l, e->n_vocab, &s->sp, &e->ss, e->tmp, &s->rng)
                                           : tdm_argmax_finite(l, e->n_vocab);
        }
    if (!st && kind == TDM_FWD_LOGITS_DEV) { /* each row as next_token draws it alone */
        const tdm_backend_ops *op = e->be->ops;
        const size_t V = (size_t)e->n_vocab;
        int32_t *ids_d = e->samp_dev + TDM_ENGINE_SAMP_IDS;
        for (int32_t j = 0; j < m && !st; j++) {
            tdm_seq *s = &sl[idx[j]]->s;
            const float *l = e->out_t + (size_t)j * V;
            if (s->sp.temperature > 0) {
                double u;
                tdm_engine_draws(s, 1, &u);
                st = op->probs_dev(e->be, l, 1, e->n_vocab, &s->sp, e->p_dev + (size_t)j * V, e->samp_dev + j, &ferr);
                if (!st) st = op->sample_dev(e->be, e->p_dev + (size_t)j * V, 1, e->n_vocab, &u, ids_d + j, NULL, &ferr);
            } else {
                st = op->argmax_dev(e->be, l, 1, e->n_vocab, ids_d + j, NULL, &ferr);
            }
        }
        int32_t got[TDM_ENGINE_SAMP_WORDS];
        if (!st) st = op->download(e->be, got, e->samp_dev, sizeof got, &ferr);
        for (int32_t j = 0; j < m && !st; j++) {
            tdm_seq *s = &sl[idx[j]]->s;
            tok[j] = got[TDM_ENGINE_SAMP_IDS + j];
            if (s->sp.temperature > 0) {
                if (!got[j]) tok[j] = -1;
                else tdm_engine_consume(s, 1);
            }
        }
    }
    for (int32_t j = 0; j < m; j++) {
        const int32_t i = idx[j];
        tdm_seq *s = &sl[i]->s;
        if (!st && tok[j] < 0)
            st_row[i] = tdm_seterr(&err_row[i], TANDEM_ERR_FORMAT,
                                   "target model '%s': non-finite logits (NaN or infinity) at position %d",
                                   tdm_model_label(e->target), (int)(s->n_tokens - 1));
        else if (st)
            st_row[i] = st, err_row[i] = ferr;
        if (st_row[i]) continue;
        s->n_target = s->n_tokens;
        tdm_seq_commit(e, s, tok[j]);
    }
}

tandem_status tdm_engine_generate_batch(tdm_engine *e, const int32_t *const *prompts, const int32_t *n_prompts,
                                        const tandem_generate_params *params, int32_t n, tandem_result *res) {
    const int32_t cap = TDM_MAX(e->cfg.n_seq_max, 1);
    sched_slot *slots = calloc((size_t)cap, sizeof *slots);
    sched_slot **run = calloc((size_t)cap, sizeof *run);
    tandem_status *st_row = calloc((size_t)cap, sizeof *st_row);
    tdm_err *err_row = calloc((size_t)cap, sizeof *err_row);
    if (!slots || !run || !st_row || !err_row) {
        free(slots), free(run), free(st_row), free(err_row);
        return TANDEM_ERR_NOMEM;
    }
    for (int32_t i = 0; i < cap; i++) slots[i].req = -1;
    /* rows per forward: what the logits buffers hold and the backend computes as alone */
    int32_t chunk = TDM_ENGINE_LOGIT_ROWS - 1;
    if (e->be->invariant_rows > 0) chunk = TDM_MIN(chunk, e->be->invariant_rows);
    int32_t next = 0, n_run = 0;
    for (;;) {
        /* admit waiting requests into free places */
        for (int32_t i = 0; i < cap && next < n; i++) {
            if (slots[i].req >= 0) continue;
            while (next < n && n_prompts[next] < 0) next++; /* (failed before it came here) */
            if (next >= n) break;
            sched_slot *sl = &slots[i];
            tdm_err err = {0};
            sl->req = next++;
            sl->t_start = tdm_now();
            tandem_status st = tdm_seq_init(e, &sl->s, prompts[sl->req], n_prompts[sl->req], &params[sl->req], &err);
            if (!st) st = tdm_seq_prefill(e, &sl->s, &err);
            sl->t_first = tdm_now();
            if (st || sl->s.done) {
                finish_slot(e, sl, res, st, &err);
                i--; /* (this place is free again) */
            }
        }
        n_run = 0;
        for (int32_t i = 0; i < cap; i++)
            if (slots[i].req >= 0) run[n_run++] = &slots[i];
        if (n_run == 0) break;
        /* one token for every running sequence */
        const bool alone_spec = n_run == 1 && e->draft && run[0]->s.sp.temperature <= 0;
        if (alone_spec) {
            tdm_err err = {0};
            tandem_status st = tdm_seq_step(e, &run[0]->s, &err);
            if (st || run[0]->s.done) finish_slot(e, run[0], res, st, &err);
            continue;
        }
        for (int32_t c0 = 0; c0 < n_run; c0 += chunk) {
            const int32_t m = TDM_MIN(chunk, n_run - c0);
            step_rows(e, run + c0, m, st_row, err_row);
            for (int32_t j = 0; j < m; j++) {
                sched_slot *sl = run[c0 + j];
                if (st_row[j] || sl->s.done) finish_slot(e, sl, res, st_row[j], &err_row[j]);
            }
        }
    }
    free(slots), free(run), free(st_row), free(err_row);
    return TANDEM_OK;
}
