/* chain.c - chain proposals: the draft model catches up on the committed tokens
 * it has not seen, then proposes up to k tokens autoregressively.
 *
 * Greedy (temperature 0): each drafted token is the draft's argmax.  Sampling: it
 * is drawn from q, the draft's distribution after the request's temperature /
 * top-k / top-p / min-p processing; q rows are kept in ws->qprobs for verification.
 * Drafting stops early when the draft's top probability falls below p_min (greedy:
 * of the softmax of its logits; sampling: of q, the processed distribution).
 */
#include "chain.h"

#include <string.h>

#include "kv_cache.h"
#include "ngram.h"
#include "oracle.h"
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
    if (!sr->spec_ngram || k_ext <= len) return 0;
    int32_t m = tdm_ngram_propose(s->tokens, s->n_tokens + len, sr->spec_ngram, k_ext - len, draft + len);
    if (m == 0) return 0;
    double rate_ng = tdm_ctrl_rate(&ws->cost, sr->ctrl_ng.alpha, 0.0, m);
    double rate_d = tdm_ctrl_rate(&ws->cost, sr->ctrl.alpha, tdm_cost_draft(&ws->cost), TDM_MAX(k - len, 1));
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

/* Drafting where the backend keeps argmaxes (greedy) or samples (ws->q_dev) in its
 * memory (ws->chain_dev): the catch-up forward and the k - 1 forwards after it are
 * queued back to back, each embedding the token the one before chose, on the
 * device; the host waits once, for the k tokens and their top probabilities (of
 * the logits' softmax when greedy, of q when sampling).  p_min and the n-gram
 * extension then cut the chain where the token-by-token loop below would have
 * stopped (each decision depends only on the tokens before it), so the proposal is
 * the same; the forwards past a cut are spent, and the draft's K/V count only up
 * to it.  Sampling draws token i with the i-th uniform of the request's generator,
 * and the generator moves on by the tokens kept, as the loop's draws would. */
static tandem_status chain_on_device(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, int32_t k, int32_t k_ext, int32_t *draft,
                                     int32_t *n_drafted, int32_t *n_model, int32_t *n_forwards, tdm_err *err) {
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

tandem_status tdm_draft_chain(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, int32_t k, int32_t k_ext, int32_t *draft,
                              int32_t *n_drafted, int32_t *n_model, int32_t *n_forwards, tdm_err *err) {
    const int32_t V = e->n_vocab;
    const bool greedy = s->sp.temperature <= 0;
    const int32_t n = s->n_tokens;
    tandem_status st;
    *n_drafted = *n_model = *n_forwards = 0;
    if ((greedy || ws->q_dev) && ws->chain_dev && k >= 1 && k <= TDM_CTRL_MAX_K)
        return chain_on_device(e, ws, s, sr, k, k_ext, draft, n_drafted, n_model, n_forwards, err);
    /* catch up: rows [n_draft, n) -> the distribution of the token after them */
    if ((st = tdm_engine_feed(e, s, true, s->n_draft, n, true, TDM_FWD_LOGITS_APPROX, err))) return st;
    *n_forwards = 1;
    for (int32_t i = 0; i < k; i++) {
        const float *l = e->logits_d;
        /* p_min looks at the distribution only, never at the token drawn from it
         * (deciding on the drawn token would bias what reaches verification) */
        int32_t x;
        if (greedy) {
            if (i > 0 && sr->spec_p_min > 0 && tdm_top_prob(l, V) < sr->spec_p_min) break;
            x = sr->oracle ? oracle_token(s, sr, l, V, draft, i) : tdm_argmax(l, V);
        } else {
            float *q = ws->qprobs + (size_t)i * (size_t)V;
            tdm_probs_from_logits(l, V, &s->sp, &e->ss, q);
            if (i > 0 && sr->spec_p_min > 0 && max_of(q, V) < sr->spec_p_min) break;
            x = tdm_sample_probs(q, V, &s->rng);
        }
        draft[i] = x;
        *n_drafted = *n_model = i + 1;
        s->tokens[n + i] = x; /* stored after the committed tokens (fed below, looked up) */
        int32_t m = lookup_extension(e, ws, s, sr, i + 1, k, k_ext, draft);
        if (m > 0) {
            *n_drafted = i + 1 + m;
            break;
        }
        if (i + 1 == k) break;
        /* feed x at position n + i */
        if ((st = tdm_engine_feed(e, s, true, n + i, n + i + 1, true, TDM_FWD_LOGITS_APPROX, err))) return st;
        ++*n_forwards;
    }
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
