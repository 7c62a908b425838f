/* chain.c - chain proposals for one sequence or a batch (chain.h): host rounds, a
 * lone sequence's chain on the device, a greedy batch's rounds on the device. */
#include "chain.h"

#include <string.h>

#include "constrain.h"
#include "kv_cache.h"
#include "ngram.h"
#include "oracle.h"
#include "penalty.h"
#include "tree.h"

static float max_of(const float *p, int32_t n) {
    float m = 0;
    for (int32_t i = 0; i < n; i++) m = p[i] > m ? p[i] : m;
    return m;
}

/* Benchmark only (draft/oracle.h): the chain's token i from the draft's logits l,
 * its candidates rearranged while the chain so far is the target's continuation. */
static int32_t oracle_token(const tdm_seq *s, tdm_spec_rec *sr, const float *l, int32_t V, const int32_t *draft, int32_t i) {
    const int32_t g = s->n_tokens - s->n_prompt; /* generated index of the chain's first token */
    bool on = g + i < sr->n_oracle;
    for (int32_t j = 0; j < i && on; j++) on = draft[j] == sr->oracle[g + j];
    int32_t own[2], x;
    const int32_t n_own = tdm_top_tokens(l, V, 2, own);
    if (!on) return own[0];
    return tdm_oracle_arrange(sr->oracle[g + i], sr->oracle_alpha, &sr->oracle_rng, own, n_own, 1, &x) ? x : own[0];
}

/* After draft[0..len) (the last one just drafted): an n-gram continuation of up to
 * k_ext - len tokens written to draft[len..], when its expected rate beats the draft
 * model's; returns its length (0: keep drafting).  Deciding from the drafted prefix
 * is sound: the proposal for a position may depend on everything before it. */
static int32_t lookup_extension(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, int32_t len, int32_t k, int32_t k_ext,
                                int32_t *draft) {
    if (!tdm_spec_lookup_n(sr) || k_ext <= len) return 0;
    int32_t m = tdm_ngram_propose(s->tokens, s->n_tokens + len, tdm_spec_lookup_n(sr), k_ext - len, draft + len);
    /* a constrained chain's: cut at the first token the grammar refuses after draft[0..len)
     * (the matcher's state while drafting) */
    if (m > 0 && s->con) m = tdm_constraint_prefix(s, draft + len, m);
    if (m == 0) return 0;
    const int32_t kd = TDM_MAX(k - len, 1); /* (what the model would still draft) */
    const double rate_ng = tdm_len_rate(&ws->len, 1, tdm_ctrl_expected_tokens(sr->ctrl_ng.alpha, m), 1 + m, 0);
    const double rate_d = tdm_len_rate(&ws->len, 1, tdm_ctrl_expected_tokens(sr->ctrl.alpha, kd), 1 + kd, kd);
    if (rate_ng < rate_d) return 0;
    tdm_draft_onehot_q(e, ws, s, draft, len, m);
    return m;
}

/* Benchmark only (draft/oracle.h): the oracle's chain of k as the token loop's
 * oracle_token would draw it, known before the chain runs: tokens [0, *n_plan) are
 * the target's own (plan[]), token *off (-1: none) the draft's best other than
 * *off_truth, the rest the draft's own. */
static void oracle_plan(const tdm_seq *s, tdm_spec_rec *sr, int32_t k, int32_t *plan, int32_t *n_plan, int32_t *off, int32_t *off_truth) {
    const int32_t g = s->n_tokens - s->n_prompt;
    *n_plan = 0, *off = -1, *off_truth = -1;
    for (int32_t i = 0; i < k && g + i < sr->n_oracle; i++) {
        if (tdm_oracle_rank(sr->oracle_alpha, &sr->oracle_rng) == 0) {
            plan[(*n_plan)++] = sr->oracle[g + i];
            continue;
        }
        *off = i, *off_truth = sr->oracle[g + i];
        return;
    }
}

/* The oracle chain's token i from its forward's logits in e->out_d: the argmax into
 * ids_d[i]; a planned token (i < n_plan, in ids_d already): the argmax into a spare
 * word, so the chain costs what an unmodified one does; the off-path token (i ==
 * off): the argmax with the truth's logit pushed down by -FLT_MAX. */
static tandem_status oracle_pick(tdm_engine *e, tdm_spec_ws *ws, int32_t i, int32_t n_plan, int32_t off, int32_t off_truth,
                                 float *top_i, tdm_err *err) {
    const tdm_backend_ops *op = e->be->ops;
    int32_t *ids_d = ws->chain_dev, *spare = ws->chain_dev + 2 * TDM_CTRL_MAX_K + 1;
    if (i == off) {
        const float *lowest = (const float *)(ws->chain_dev + 2 * TDM_CTRL_MAX_K); /* -FLT_MAX */
        tandem_status st = op->add(e->be, e->out_d + off_truth, lowest, 1, 1, err);
        if (st) return st;
    }
    return op->argmax_dev(e->be, e->out_d, 1, e->n_vocab, i < n_plan ? spare : ids_d + i, top_i, err);
}

/* A lone sequence's drafting where the backend keeps argmaxes (greedy) or samples
 * (ws->q_dev) in its memory (ws->chain_dev): the catch-up forward and the k - 1 forwards after it are
 * queued back to back, each embedding the token the one before chose, on the
 * device; the host waits once, for the k tokens and their top probabilities (of
 * the logits' softmax when greedy, of q when sampling).  p_min and the n-gram
 * extension then cut the chain where the token-by-token loop below would have
 * stopped (each decision depends only on the tokens before it), so the proposal is
 * the same; the forwards past a cut are spent, and the draft's K/V count only up
 * to it.  Sampling draws token i with the i-th uniform of the request's generator,
 * and the generator moves on by the tokens kept, as the loop's draws would. */
static tandem_status chain_on_device(tdm_engine *e, tdm_spec_ws *ws, tdm_chain_req *q, tdm_err *err) {
    tdm_seq *s = q->s;
    tdm_spec_rec *sr = q->sr;
    const int32_t k = q->k, k_ext = q->k_ext;
    int32_t *draft = q->draft, *n_drafted = &q->n_drafted, *n_model = &q->n_model, *n_forwards = &q->n_forwards;
    const int32_t n = s->n_tokens;
    const tdm_kv_seq *seqs[1] = {&s->kv};
    const bool sample = s->sp.temperature > 0;
    const tdm_backend_ops *op = e->be->ops;
    const int32_t V = e->n_vocab;
    int32_t *ids_d = ws->chain_dev;
    /* top probabilities only where p_min reads them */
    float *top_d = sr->spec_p_min > 0 ? (float *)(ws->chain_dev + TDM_CTRL_MAX_K) : NULL;
    double u[TDM_CTRL_MAX_K];
    if (sample) tdm_engine_draws(s, k, u);
    tandem_status st;
    /* the chain writes the draft's K/V up to position n + k - 2 */
    if ((st = tdm_kv_seq_reserve(e->pool, &s->kv, n + k - 1, err))) return st;
    if (e->copy_status) return tdm_seterr(err, e->copy_status, "%s", e->copy_err.msg);
    /* the oracle benchmark's plan, its known tokens uploaded first (greedy only) */
    int32_t plan[TDM_CTRL_MAX_K], n_plan = 0, off = -1, off_truth = -1;
    const bool oracle = sr->oracle && !sample;
    if (oracle) {
        oracle_plan(s, sr, k, plan, &n_plan, &off, &off_truth);
        if (n_plan > 0 && (st = op->upload(e->be, ids_d, plan, (size_t)n_plan * sizeof(int32_t), err))) return st;
    }
    tdm_batch *b = &e->batch;
    /* catch up: rows [n_draft, n), the last one's argmax -> token 0 */
    for (int32_t c = s->n_draft; c < n; c += e->max_rows) {
        const int32_t end = TDM_MIN(n, c + e->max_rows);
        tdm_batch_clear(b);
        for (int32_t p = c; p < end; p++) tdm_batch_add(b, s->tokens[p], p, 0, p, p == n - 1);
        if (end < n) {
            st = tdm_engine_forward(e, true, b, seqs, TDM_FWD_LOGITS_DEV, err);
        } else if (oracle) {
            st = tdm_model_forward_dev(e->draft, e->be, &e->kv_d, b, seqs, &e->fs_d, NULL, e->out_d, NULL, NULL, err);
            if (!st) st = oracle_pick(e, ws, 0, n_plan, off, off_truth, top_d, err);
        } else {
            st = tdm_model_forward_dev(e->draft, e->be, &e->kv_d, b, seqs, &e->fs_d, NULL, e->out_d,
                                       sample ? NULL : ids_d, top_d, err);
            if (!st && sample) st = op->probs_dev(e->be, e->out_d, 1, V, &s->sp, ws->q_dev, e->samp_dev, err);
            if (!st && sample) st = op->sample_dev(e->be, ws->q_dev, 1, V, u, ids_d, top_d, err);
        }
        if (st) return st;
    }
    /* token i + 1 after token i, at position n + i */
    for (int32_t i = 0; i + 1 < k; i++) {
        tdm_batch_clear(b);
        tdm_batch_add(b, 0, n + i, 0, n + i, true); /* (the token is ids_d[i]) */
        float *top_i = top_d ? top_d + i + 1 : NULL;
        if ((st = tdm_model_forward_dev(e->draft, e->be, &e->kv_d, b, seqs, &e->fs_d, ids_d + i, e->out_d,
                                        sample || oracle ? NULL : ids_d + i + 1, oracle ? NULL : top_i, err)))
            return st;
        if (oracle && (st = oracle_pick(e, ws, i + 1, n_plan, off, off_truth, top_i, err))) return st;
        if (sample) {
            float *qi = ws->q_dev + (size_t)(i + 1) * (size_t)V;
            if ((st = op->probs_dev(e->be, e->out_d, 1, V, &s->sp, qi, e->samp_dev + i + 1, err))) return st;
            if ((st = op->sample_dev(e->be, qi, 1, V, u + i + 1, ids_d + i + 1, top_i, err))) return st;
        }
    }
    *n_forwards = k;
    int32_t got[2 * TDM_CTRL_MAX_K], ok[TDM_CTRL_MAX_K];
    if ((st = op->download(e->be, got, ws->chain_dev, sizeof got, err))) return st;
    if (sample && (st = op->download(e->be, ok, e->samp_dev, (size_t)k * sizeof(int32_t), err))) return st;
    const float *top = (const float *)(got + TDM_CTRL_MAX_K);
    for (int32_t i = 0; i < k; i++) {
        if (got[i] < 0 || (sample && !ok[i]))
            return tdm_engine_nonfinite(e, true, n - 1 + i, err);
        if (i > 0 && sr->spec_p_min > 0 && top[i] < sr->spec_p_min) break;
        draft[i] = got[i];
        *n_drafted = *n_model = i + 1;
        s->tokens[n + i] = got[i];
        int32_t m = lookup_extension(e, ws, s, sr, i + 1, k, k_ext, draft);
        if (m > 0) {
            *n_drafted = i + 1 + m;
            break;
        }
    }
    /* the draft was fed token j at position n + j for j < k - 1: consistent with the
     * chain up to its model-drafted prefix */
    s->n_draft = n + TDM_MIN(*n_model, k - 1);
    if (sample) tdm_engine_consume(s, *n_model);
    return TANDEM_OK;
}

/* ---- a greedy batch on the device ---- */

/* Every sequence greedy with the same k, without p_min, a lookup's extension or the
 * oracle, round 0 within one forward: the rounds can run back to back on the device
 * (on_device below). */
static bool device_rounds(const tdm_engine *e, const tdm_spec_ws *ws, const tdm_chain_req *req, int32_t n) {
    if (!ws->bchain_dev || e->head || n > e->n_logit_rows || req[0].k < 1) return false;
    int32_t rows = 0;
    for (int32_t i = 0; i < n; i++) {
        const tdm_chain_req *q = &req[i];
        if (q->s->sp.temperature > 0 || q->k != req[0].k || q->k_ext > q->k || q->sr->spec_p_min > 0 || q->sr->oracle ||
            q->s->con || q->s->pen)
            return false;
        rows += q->s->n_tokens - q->s->n_draft;
    }
    return rows <= e->max_rows;
}

/* The rounds queued back to back, each embedding the tokens the one before chose
 * where they are (ws->bchain_dev, round d's n tokens at d * n), and the host waits
 * once, for every round's tokens: the same chains as the rounds one by one (the
 * argmax of each row is the same whatever else is queued), without a round trip per
 * round. */
static tandem_status on_device(tdm_engine *e, tdm_spec_ws *ws, tdm_chain_req *req, int32_t n, int32_t k,
                               const tdm_draft_scratch *scr, tdm_err *err) {
    tdm_batch *b = &e->batch;
    int32_t *ids = ws->bchain_dev;
    tandem_status st;
    tdm_batch_clear(b);
    for (int32_t i = 0; i < n; i++) {
        const tdm_seq *s = req[i].s;
        for (int32_t p = s->n_draft; p < s->n_tokens; p++) tdm_batch_add(b, s->tokens[p], p, i, p, p == s->n_tokens - 1);
    }
    b->rows_shared = true;
    if ((st = tdm_model_forward_dev(e->draft, e->be, &e->kv_d, b, scr->kv, &e->fs_d, NULL, e->out_d, ids, NULL, err)))
        return st;
    for (int32_t d = 1; d < k; d++) {
        tdm_batch_clear(b);
        for (int32_t i = 0; i < n; i++) {
            const int32_t pos = req[i].s->n_tokens + d - 1;
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
            req[i].draft[d] = got[i];
        }
    }
    return TANDEM_OK;
}


/* ---- host rounds ---- */

/* rows of one draft forward being gathered, and whose drafted token each logits
 * row gives */
typedef struct round_buf {
    tdm_engine *e;
    tdm_spec_ws *ws;
    const tdm_draft_scratch *scr;
    tdm_chain_req *req;
    bool *live;      /* [n] still drafting */
    int32_t *fed;    /* [n] chain tokens fed to the draft so far */
    int32_t m;       /* logits rows gathered */
    bool host;       /* a row needs its logits on the host (own draws, p_min, the oracle) */
    bool sampled;    /* a row draws with a coupled uniform */
} round_buf;

static bool needs_host_logits(const tdm_chain_req *q) {
    return (q->s->sp.temperature > 0 && !q->u) || q->sr->spec_p_min > 0 || (q->sr->oracle && q->s->sp.temperature <= 0) ||
           q->s->con || q->s->pen; /* (masked / edited on the host with the state along the chain) */
}

/* Sequence i's token d is x (or, stop, none: p_min cut the chain before it): kept,
 * the chain maybe completed by a lookup, its drafting over at k. */
static void take(round_buf *r, int32_t i, int32_t d, int32_t x, bool stop) {
    tdm_chain_req *q = &r->req[i];
    if (stop || (q->s->con && !tdm_constraint_draft_accept(q->s, x))) { /* (a masked draw is allowed: never refused) */
        r->live[i] = false;
        return;
    }
    q->draft[d] = x;
    q->n_drafted = q->n_model = d + 1;
    if (q->s->n_tokens + d < q->s->cap) q->s->tokens[q->s->n_tokens + d] = x; /* (for the lookups) */
    const int32_t m = lookup_extension(r->e, r->ws, q->s, q->sr, d + 1, q->k, q->k_ext, q->draft);
    if (m > 0) q->n_drafted = d + 1 + m;
    if (m > 0 || d + 1 >= q->k) r->live[i] = false;
}

/* The token of logits row l for sequence i's slot d, from host logits: its argmax
 * (or the oracle's), a coupled draw, or an own draw from q (kept in ws->qprobs);
 * *stop when p_min cuts the chain before it. */
static int32_t host_token(round_buf *r, int32_t i, int32_t d, float *l, bool *stop, tdm_err *err) {
    tdm_engine *e = r->e;
    const tdm_chain_req *q = &r->req[i];
    tdm_seq *s = q->s;
    const int32_t V = e->n_vocab;
    const float p_min = q->sr->spec_p_min;
    *stop = false;
    if (s->pen) { /* the row edited as the target's row d will be (acceptance only) */
        if (!tdm_logits_finite(l, V)) return -1;
        if (tdm_penalty_draft_row(s, q->draft, d, l, err)) return *stop = true, -2;
    }
    if (s->con) { /* the row masked with the state after draft[0..d) (the matcher's now) */
        if (!tdm_logits_finite(l, V)) return -1;
        int32_t n_allowed = 0;
        tandem_status st = tdm_constraint_draft_mask(s, d, &n_allowed, err); /* (kept for the verification) */
        if (st) return *stop = true, -2;
        if (n_allowed == 0) return *stop = true, -1; /* (the grammar finished: nothing to propose) */
        tdm_logits_mask(l, V, tdm_constraint_row(s, d), TDM_LOGIT_NONE);
    }
    if (s->sp.temperature <= 0) {
        if (d > 0 && p_min > 0 && tdm_top_prob(l, V) < p_min) return *stop = true, -1;
        return q->sr->oracle ? oracle_token(s, q->sr, l, V, q->draft, d) : tdm_argmax_finite(l, V);
    }
    float *p = q->u ? e->tmp : r->ws->qprobs + (size_t)d * (size_t)V;
    tdm_probs_from_logits(l, V, &s->sp, &e->ss, p);
    if (d > 0 && p_min > 0 && max_of(p, V) < p_min) return *stop = true, -1;
    return q->u ? tdm_sample_probs_u(p, V, q->u[d]) : tdm_sample_probs(p, V, &s->rng);
}

static tandem_status flush(round_buf *r, tdm_err *err) {
    tdm_engine *e = r->e;
    const tdm_draft_scratch *scr = r->scr;
    if (e->batch.n_rows == 0) return TANDEM_OK;
    e->batch.rows_shared = true; /* (a draft's rows only propose: the fastest products) */
    /* host logits where a row needs them (the quantised head's: any distribution
     * serves a proposal), else argmaxes, or logits where the engine samples */
    const tdm_fwd_kind kind = r->host      ? TDM_FWD_LOGITS_APPROX
                              : !r->sampled ? TDM_FWD_ARGMAX
                              : e->p_dev    ? TDM_FWD_LOGITS_DEV
                                            : TDM_FWD_LOGITS;
    tandem_status st = tdm_engine_forward(e, true, &e->batch, scr->kv, kind, err);
    if (!st && !r->host) {
        for (int32_t j = 0; j < r->m; j++) {
            const tdm_chain_req *q = &r->req[scr->who[j]];
            scr->rows[j] = (tdm_draw_row){q->s, q->u ? q->u[scr->slot[j]] : 0, NULL, NULL, 0};
        }
        st = tdm_engine_draw(e, true, scr->rows, r->m, kind, scr->tok, err);
    }
    for (int32_t j = 0; j < r->m && !st; j++) {
        const int32_t i = scr->who[j], d = scr->slot[j];
        bool stop = false;
        const int32_t x = r->host ? host_token(r, i, d, e->logits_d + (size_t)j * (size_t)e->n_vocab, &stop, err) : scr->tok[j];
        if (x == -2) return err->status ? err->status : TANDEM_ERR_INTERNAL; /* (a mask failed) */
        if (!stop && x < 0) return tdm_engine_nonfinite(e, true, r->req[i].s->n_tokens - 1 + d, err);
        r->req[i].n_forwards++;
        take(r, i, d, x, stop);
    }
    r->m = 0;
    r->host = r->sampled = false;
    tdm_batch_clear(&e->batch);
    return st;
}

static tandem_status add_row(round_buf *r, int32_t i, int32_t token, int32_t pos, int32_t want_slot, tdm_err *err) {
    tdm_engine *e = r->e;
    tandem_status st;
    if ((e->batch.n_rows >= e->max_rows || (want_slot >= 0 && r->m >= e->n_logit_rows)) && (st = flush(r, err)))
        return st;
    tdm_batch_add(&e->batch, token, pos, i, pos, want_slot >= 0);
    if (want_slot >= 0) {
        const tdm_chain_req *q = &r->req[i];
        r->scr->who[r->m] = i;
        r->scr->slot[r->m++] = want_slot;
        r->host |= needs_host_logits(q);
        r->sampled |= q->s->sp.temperature > 0;
    }
    return TANDEM_OK;
}

/* Round 0 catches every drafting sequence up on the committed tokens its draft has
 * not seen and drafts its first token; round d drafts token d of every sequence
 * still drafting, one row each. */
static tandem_status host_rounds(round_buf *r, int32_t n, tdm_err *err) {
    tdm_engine *e = r->e;
    tandem_status st;
    int32_t k_max = 0;
    tdm_batch_clear(&e->batch);
    for (int32_t i = 0; i < n; i++) {
        const tdm_seq *s = r->req[i].s;
        if (!r->live[i]) continue;
        k_max = TDM_MAX(k_max, r->req[i].k);
        for (int32_t p = s->n_draft; p < s->n_tokens; p++)
            if ((st = add_row(r, i, s->tokens[p], p, p == s->n_tokens - 1 ? 0 : -1, err))) return st;
    }
    if ((st = flush(r, err))) return st;
    for (int32_t d = 1; d < k_max; d++) {
        for (int32_t i = 0; i < n; i++) {
            if (!r->live[i]) continue;
            const int32_t pos = r->req[i].s->n_tokens + d - 1;
            r->fed[i]++;
            if ((st = add_row(r, i, r->req[i].draft[d - 1], pos, d, err))) return st;
        }
        if ((st = flush(r, err))) return st;
    }
    return TANDEM_OK;
}

tandem_status tdm_draft_chains(tdm_engine *e, tdm_spec_ws *ws, tdm_chain_req *req, int32_t n, const tdm_draft_scratch *scr,
                               int32_t *catch_up, tdm_err *err) {
    bool live[TDM_ENGINE_BATCH_LOGITS_MAX];
    int32_t fed[TDM_ENGINE_BATCH_LOGITS_MAX];
    tandem_status st;
    *catch_up = 0;
    if (n > TDM_ENGINE_BATCH_LOGITS_MAX)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "%d sequences to draft for, at most %d", (int)n,
                          TDM_ENGINE_BATCH_LOGITS_MAX);
    int32_t n_own = 0;
    for (int32_t i = 0; i < n; i++) {
        tdm_chain_req *q = &req[i];
        tdm_seq *s = q->s;
        q->n_drafted = q->n_model = q->n_forwards = 0;
        if (q->k < 0 || q->k > TDM_CTRL_MAX_K || q->k_ext > TDM_CTRL_MAX_K)
            return tdm_seterr(err, TANDEM_ERR_INTERNAL, "a chain of %d (%d with lookups) tokens, at most %d", (int)q->k,
                              (int)q->k_ext, TDM_CTRL_MAX_K);
        n_own += q->k > 0 && s->sp.temperature > 0 && !q->u;
        scr->kv[i] = &s->kv;
        live[i] = q->k > 0;
        fed[i] = 0;
        if (q->k <= 0) continue;
        /* (an EAGLE-3 head always catches up on the last verified path, up to the chain's
         * length: its level 1, not a catch-up) */
        *catch_up += TDM_MAX(0, s->n_tokens - 1 - s->n_draft - (e->head ? q->k : 0));
        /* the chain writes the draft's K/V up to position n_tokens + k - 2 */
        if ((st = tdm_kv_seq_reserve(e->pool, &s->kv, s->n_tokens + q->k - 1, err))) return st;
        if (e->copy_status) return tdm_seterr(err, e->copy_status, "%s", e->copy_err.msg);
    }
    if (n_own > 1) return tdm_seterr(err, TANDEM_ERR_INTERNAL, "%d sequences drafting with q rows, at most 1", (int)n_own);
    if (n == 1 && req[0].k > 0 && ws->chain_dev && !e->head && !req[0].s->con && !req[0].s->pen &&
        (req[0].s->sp.temperature <= 0 || (!req[0].u && ws->q_dev)))
        return chain_on_device(e, ws, &req[0], err);
    if (device_rounds(e, ws, req, n)) {
        if ((st = on_device(e, ws, req, n, req[0].k, scr, err))) return st;
        for (int32_t i = 0; i < n; i++) {
            req[i].n_drafted = req[i].n_model = req[i].n_forwards = req[i].k;
            req[i].s->n_draft = req[i].s->n_tokens + req[i].k - 1;
        }
        return TANDEM_OK;
    }
    round_buf r = {e, ws, scr, req, live, fed, 0, false, false};
    for (int32_t i = 0; i < n; i++)
        if (req[i].k > 0 && req[i].s->con) tdm_constraint_draft_begin(req[i].s);
    st = host_rounds(&r, n, err);
    for (int32_t i = 0; i < n; i++)
        if (req[i].k > 0 && req[i].s->con) tdm_constraint_draft_end(req[i].s);
    tdm_batch_clear(&e->batch);
    if (st) return st;
    /* the draft was fed the chain's tokens up to fed[i]: its K/V is consistent up to
     * there (a lookup's completion and a cut leave later forwards unspent) */
    for (int32_t i = 0; i < n; i++)
        if (req[i].k > 0) req[i].s->n_draft = req[i].s->n_tokens + fed[i];
    return TANDEM_OK;
}

void tdm_draft_onehot_q(const tdm_engine *e, tdm_spec_ws *ws, const tdm_seq *s, const int32_t *draft, int32_t from, int32_t n) {
    if (s->sp.temperature <= 0 || ws->q_dev) return; /* greedy has no q; device q rows past
                                                       e->n_q_dev are one-hot already */
    const size_t V = (size_t)e->n_vocab;
    for (int32_t i = from; i < from + n; i++) {
        float *q = ws->qprobs + (size_t)i * V;
        memset(q, 0, V * sizeof(float));
        q[draft[i]] = 1.0f;
    }
}
