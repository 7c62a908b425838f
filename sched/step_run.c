/* step_run.c - the forwards of a step's plan (step.c), each item's verdict and
 * its commit.
 *
 * The plan's rows are grouped into forwards so that each row is computed as it
 * would be alone: one forward on a backend that is row-invariant at any size,
 * groups of at most invariant_rows decode rows and one prompt chunk per forward
 * otherwise; the draft model sees the prompt chunks too.  An item verified by
 * rejection sampling goes alone in its forward (its rule reads the forward's
 * logits rows).
 *
 * Verdicts (verify/): a greedy chain or tree by agreement with the target's
 * argmaxes; a sampled one by agreement with the target's own draws, each row drawn
 * with the uniform its position would use without speculation (the draft drew its
 * tokens with the same uniforms), so that the output is exactly what it would be
 * alone and unspeculated, whatever the batch; or, for a sampled sequence on an
 * engine of one sequence (it->reject), by rejection sampling against the draft's q
 * rows (Leviathan et al.; multi-candidate for trees), which keeps the distribution
 * and accepts more.  Commits go through commit.h, the one place tokens leave; the
 * step's observations (acceptance per proposer, statistics, the payoff of lookups)
 * are entered there too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accept.h"
#include "commit.h"
#include "constrain.h"
#include "kv_cache.h"
#include "liblog.h"
#include "penalty.h"
#include "sched_internal.h"
#include "tree_accept.h"
#include "tree_verify.h"
#include "verify.h"

static int32_t item_logits(const step_item *it) { return it->tree ? 1 + it->tree->n : it->decode ? 1 + it->k : it->want; }

/* What an item's verdict reads of the target's forward: tokens drawn per logits
 * row (a greedy item's argmaxes, TDM_FWD_ARGMAX; a sampled item's draws with its
 * uniforms, where the engine samples), or, for rejection sampling, the logits rows
 * themselves where its rule runs: a chain's on the device with the draft's q rows
 * there, a tree's on the host. */
static tdm_fwd_kind item_kind(const tdm_sched *s, const step_item *it) {
    const tdm_seq *q = &it->r->s;
    const bool samples = q->sp.temperature > 0 && (it->tree || it->decode || it->want);
    /* (its rows masked or edited before the draw; a logprobs request's rows read on
     * the host, where their summaries are taken) */
    const bool lp = q->lp_top >= 0 && (it->decode || it->want), rows_read = lp && !s->e->lp_dev;
    const bool masked = q->con && (it->decode || it->want);
    const bool edited = (q->pen && (it->decode || it->want)) || lp;
    const tdm_fwd_kind logits = s->e->p_dev && !rows_read ? TDM_FWD_LOGITS_DEV : TDM_FWD_LOGITS;
    /* (greedy and masked only: where the logits are host memory the forward's own
     * argmax takes the masks, tdm_batch.logit_masks: the quantised head's bounds over
     * the allowed tokens instead of every exact logit; edited rows need the logits) */
    if (masked && !edited && !samples)
        return s->e->be->host_memory && !s->e->target->tp ? TDM_FWD_ARGMAX : logits;
    if (edited && !samples) return logits;
    if (!samples) return TDM_FWD_ARGMAX;
    if (it->reject) return !it->tree && s->ws && s->ws->q_dev ? TDM_FWD_LOGITS_DEV : TDM_FWD_LOGITS;
    return logits;
}

/* Row j's summary into its sequence's lp_rows (in row order: a sequence's rows are
 * consecutive, its chain's rows 0..k, a tree's pending token's and its nodes'). */
static void keep_lp_row(const tdm_draw_row *rows, int32_t j, int32_t token, const tdm_row_top *top) {
    tdm_seq *q = (tdm_seq *)rows[j].s;
    if (j == 0 || rows[j - 1].s != q) q->lp_next = q->lp_fill = 0;
    if (q->lp_fill >= TDM_LP_ROWS) return;
    tdm_lp_row *r = &q->lp_rows[q->lp_fill++];
    r->token = token;
    r->logit = top->want;
    r->lse = top->lse;
    r->k = TDM_MIN(top->k, TANDEM_TOP_LOGPROBS_MAX);
    memcpy(r->ids, top->ids, (size_t)r->k * sizeof r->ids[0]);
    memcpy(r->val, top->val, (size_t)r->k * sizeof r->val[0]);
}

/* The logprobs summaries of the drawn rows [0, m) of logprobs requests (edited and
 * masked by the draw): of host rows here; of device rows by the backend's row_top
 * op (a run of a sequence's rows per call, the drawn tokens' logits read where the
 * draw left them), a few hundred bytes a row read back. */
static tandem_status logprob_rows(tdm_engine *e, const tdm_draw_row *rows, int32_t m, tdm_fwd_kind kind,
                                  const int32_t *tok, tdm_err *err) {
    const size_t V = (size_t)e->n_vocab;
    if (kind == TDM_FWD_LOGITS) {
        for (int32_t j = 0; j < m; j++) {
            if (rows[j].s->lp_top < 0) continue;
            const float *l = e->logits_t + (size_t)j * V;
            tdm_row_top top;
            tdm_logits_row_top(l, e->n_vocab, rows[j].s->lp_top, &top);
            top.want = tok[j] >= 0 ? l[tok[j]] : 0.0f;
            keep_lp_row(rows, j, tok[j], &top);
        }
        return TANDEM_OK;
    }
    if (kind != TDM_FWD_LOGITS_DEV || !e->lp_dev || !e->draw_dev) return TANDEM_OK; /* (no logprobs row: item_kind) */
    const tdm_backend_ops *op = e->be->ops;
    int32_t lo = m, hi = 0;
    tandem_status st = TANDEM_OK;
    for (int32_t j = 0; j < m && !st;) {
        if (rows[j].s->lp_top < 0) {
            j++;
            continue;
        }
        int32_t end = j + 1;
        while (end < m && rows[end].s == rows[j].s) end++;
        st = op->row_top(e->be, e->out_t + (size_t)j * V, end - j, e->n_vocab, rows[j].s->lp_top, e->draw_dev + j,
                         e->lp_dev + j, err);
        lo = TDM_MIN(lo, j), hi = end;
        j = end;
    }
    if (st || lo >= hi) return st;
    tdm_row_top *got = malloc((size_t)(hi - lo) * sizeof *got);
    if (!got) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    if (!(st = op->download(e->be, got, e->lp_dev + lo, (size_t)(hi - lo) * sizeof *got, err)))
        for (int32_t j = lo; j < hi; j++)
            if (rows[j].s->lp_top >= 0) keep_lp_row(rows, j, tok[j], &got[j - lo]);
    free(got);
    return st;
}

/* A constrained or penalised tree item's rows r0[0..1 + n) masked and edited: row 0
 * (its pending token's) with the grammar's state and the counts after the committed
 * text, node x's row with those after x's path (constrain.h, penalty.h; the masks
 * made by group_forward), so that each row's argmax or draw is the target's own
 * under the request's rules given that path.  A failure fails the request alone
 * (its rows then draw as they are and are dropped). */
static void tree_row_edits(const step_item *it, tdm_draw_row *r0) {
    tdm_seq *q = &it->r->s;
    const tdm_tree *t = it->tree;
    tdm_err err = {0};
    tandem_status st;
    if (q->con && !it->r->fail_st)
        for (int32_t x = 0; x <= t->n; x++) r0[x].mask = tdm_constraint_row(q, x);
    if (q->pen && !it->r->fail_st) {
        if ((st = tdm_penalty_tree_rows(q, t->token, t->parent, t->n, &err))) tdm_sched_fail(it->r, st, &err);
        else
            for (int32_t x = 0; x <= t->n; x++) r0[x].edit = tdm_penalty_row(q, x, &r0[x].n_edit);
    }
    if (it->r->fail_st)
        for (int32_t x = 0; x <= t->n; x++) r0[x].mask = NULL, r0[x].edit = NULL, r0[x].n_edit = 0;
}

/* A group's forward kind from its items' (item_kind): host rows where any item
 * reads them (every row can be drawn there), else device rows where any has them. */
static tdm_fwd_kind group_kind(tdm_fwd_kind group, tdm_fwd_kind item) {
    if (item == TDM_FWD_ARGMAX || group == TDM_FWD_LOGITS) return group;
    return item;
}

/* A forward's grammar masks (src/engine/constrain.h), the items in s->g_con computed
 * side by side on the host threads: each touches only its own sequence's matcher. */
typedef struct con_rows {
    tdm_sched *s;
    const step_item *it;
} con_rows;

static void con_rows_task(void *user, int32_t j) {
    const con_rows *c = user;
    const step_item *x = &c->it[c->s->g_con[j]];
    const tdm_tree *t = x->tree;
    tdm_err *err = &c->s->g_con_err[j];
    err->status = t ? tdm_constraint_tree_rows(&x->r->s, t->token, t->parent, t->n, err)
                    : tdm_constraint_rows(&x->r->s, x->draft, x->decode ? x->k : 0, err);
}

/* Whether item x's logits rows are masked by its grammar (a failure fails it alone:
 * its rows draw unmasked and are dropped). */
static bool item_masked(const step_item *x) {
    return x->r->s.con && (x->decode || x->want) && !x->r->fail_st; /* (a tree's: decode) */
}

/* The rows of items [0, n) as one forward of the target (and one of the draft over
 * the prompt chunks among them), and a token drawn for every logits row (s->g_tok,
 * in row order) unless the item is verified by rejection sampling (then alone). */
static tandem_status group_forward(tdm_sched *s, const step_item *it, int32_t n, tdm_fwd_kind *kind_out,
                                   tdm_err *err) {
    tdm_engine *e = s->e;
    const tdm_kv_seq **seqs = s->g_seqs;
    tdm_draw_row *rows = s->g_rows;
    int32_t m = 0;
    bool any_chunk = false;
    tdm_fwd_kind kind = TDM_FWD_ARGMAX; /* (the group's: its sampled items agree) */
    tdm_batch *b = &e->batch;
    tdm_batch_clear(b);
    /* the constrained items' masks: row d with the grammar's state after the chain's
     * first d tokens, a tree's row 1 + x with that after node x's path */
    int32_t n_con = 0;
    for (int32_t i = 0; i < n; i++)
        if (item_masked(&it[i])) s->g_con[n_con++] = i;
    con_rows cr = {s, it};
    tdm_engine_host_for(e, n_con, con_rows_task, &cr);
    for (int32_t j = 0; j < n_con; j++)
        if (s->g_con_err[j].status) tdm_sched_fail(it[s->g_con[j]].r, s->g_con_err[j].status, &s->g_con_err[j]);
    for (int32_t i = 0; i < n; i++) {
        tdm_seq *q = &it[i].r->s;
        seqs[i] = &q->kv;
        /* row d of the item's logits draws with the d-th uniform to come (a tree's
         * node at depth d with uniform d + 1: the position its logits predict) */
        double u[TDM_MAX(TDM_CTRL_MAX_K, TDM_TREE_DEPTH_MAX) + 1] = {0};
        const bool draws = q->sp.temperature > 0 && !it[i].reject;
        if (it[i].tree) {
            const tdm_tree *t = it[i].tree;
            tdm_tree_rows(b, q, t, i);
            int32_t deepest = -1;
            for (int32_t x = 0; x < t->n; x++) deepest = TDM_MAX(deepest, t->depth[x]);
            if (draws) tdm_engine_draws(q, deepest + 2, u);
            tdm_draw_row *r0 = rows + m;
            rows[m++] = (tdm_draw_row){q, u[0], NULL, NULL, 0};
            for (int32_t x = 0; x < t->n; x++) rows[m++] = (tdm_draw_row){q, u[t->depth[x] + 1], NULL, NULL, 0};
            tree_row_edits(&it[i], r0);
            kind = group_kind(kind, item_kind(s, &it[i]));
            continue;
        }
        if (draws) tdm_engine_draws(q, item_logits(&it[i]), u);
        const bool masked = q->con && (it[i].decode || it[i].want); /* (its masks above) */
        /* a penalised item's rows edited likewise: row d with the counts after the
         * chain's first d tokens */
        const bool edited = q->pen && (it[i].decode || it[i].want) && !it[i].r->fail_st;
        if (edited) {
            tdm_err perr = {0};
            tandem_status pst = tdm_penalty_rows(q, it[i].draft, it[i].decode ? it[i].k : 0, &perr);
            if (pst) tdm_sched_fail(it[i].r, pst, &perr);
        }
        for (int32_t p = it[i].from, d = 0; p < it[i].to; p++) {
            const bool want = it[i].decode || (it[i].want && p == it[i].to - 1);
            const int32_t tk = p < q->n_tokens ? q->tokens[p] : it[i].draft[p - q->n_tokens];
            tdm_batch_add(b, tk, p, i, p, want);
            if (want) {
                const bool ok = !it[i].r->fail_st;
                rows[m] = (tdm_draw_row){q, u[d], masked && ok ? tdm_constraint_row(q, d) : NULL, NULL, 0};
                if (edited && ok) rows[m].edit = tdm_penalty_row(q, d, &rows[m].n_edit);
                m++, d++;
            }
        }
        kind = group_kind(kind, item_kind(s, &it[i]));
        any_chunk |= !it[i].decode;
    }
    *kind_out = kind;
    if (kind == TDM_FWD_ARGMAX) { /* (the masks of a greedy forward's rows go with it) */
        bool any = false;
        for (int32_t j = 0; j < m; j++) any |= (s->g_masks[j] = rows[j].mask) != NULL;
        b->logit_masks = any ? s->g_masks : NULL;
    }
    b->rows_shared = !e->cfg.batch_invariant && n > 1; /* (a lone sequence's rows stay its own) */
    tandem_status st = tdm_engine_forward(e, false, b, seqs, kind, err);
    const bool rule_reads_rows = n > 0 && it[0].reject && kind != TDM_FWD_ARGMAX;
    if (!st && m > 0 && !rule_reads_rows) st = tdm_engine_draw(e, false, rows, m, kind, s->g_tok, err);
    if (!st && m > 0 && !rule_reads_rows) st = logprob_rows(e, rows, m, kind, s->g_tok, err);
    if (!st && m > 0 && rule_reads_rows) st = tdm_engine_mask_rows(e, false, rows, m, kind, err); /* (p masked) */
    if (!st && e->draft && !e->head && any_chunk) { /* the draft sees the prompt chunks (a head: run_group) */
        tdm_batch_clear(b);
        for (int32_t i = 0; i < n; i++) {
            if (it[i].decode) continue;
            const tdm_seq *q = &it[i].r->s;
            for (int32_t p = it[i].from; p < it[i].to; p++) tdm_batch_add(b, q->tokens[p], p, i, p, false);
        }
        b->rows_shared = true; /* (the draft's rows only propose) */
        st = tdm_engine_forward(e, true, b, seqs, TDM_FWD_LOGITS, err);
    }
    return st;
}

/* A decode item's chain verdict v (its tokens not yet committed) committed, and what
 * the step teaches: the model-drafted prefix and the looked-up rest update their
 * own acceptance estimates (the pair's too, for the model's), and the request's
 * statistics (with the payoff of lookups where the step's seconds are its own). */
static void commit_chain_item(tdm_sched *s, const step_item *it, const tdm_verdict *v, double draft_s,
                              double verify_s) {
    tdm_seq *q = &it->r->s;
    tdm_spec_rec *sr = &it->r->sr;
    const int32_t k = it->k, n_model = TDM_MIN(it->n_model, k), n_look = k - n_model, before = q->n_tokens;
    const int32_t acc = v->n_acc, acc_look = TDM_MAX(acc - n_model, 0);
    tdm_commit_chain(s->e, q, it->draft, v);
    if (n_model > 0) {
        tdm_ctrl_observe(&sr->ctrl, n_model, TDM_MIN(acc, n_model));
        tdm_ctrl_observe(&s->pair, n_model, TDM_MIN(acc, n_model));
        s->pair_seen = true;
    }
    if (n_look > 0 && acc >= n_model) tdm_ctrl_observe(&sr->ctrl_ng, n_look, acc_look);
    if (s->ws && s->ws->len.log && k > 0) { /* (TANDEM_SCHED_LOG=1: each proposal and what it yielded) */
        char ids[TANDEM_SPEC_K_MAX * 12 + 1] = ""; /* the chain's ids (bench/xcheck_eagle3.py reads them) */
        for (int32_t i = 0, at = 0; i < k && at < (int32_t)sizeof ids; i++)
            at += snprintf(ids + at, sizeof ids - (size_t)at, i ? " %d" : "%d", (int)it->draft[i]);
        tdm_log(TANDEM_LOG_INFO, "step: request %llu, k %d, proposed %d (model %d, looked up %d%s), accepted %d; alpha %.2f, lookups' %.2f; ms %.3f + %.3f; at %d, chain [%s]",
                (unsigned long long)it->r->id, (int)it->k_plan, (int)k, (int)n_model, (int)n_look,
                it->ngram ? ", a lookup step" : "", (int)acc, sr->ctrl.alpha, sr->ctrl_ng.alpha, draft_s * 1e3,
                verify_s * 1e3, (int)(before - q->n_prompt), ids);
    }
    tdm_spec_stats_add(sr, s->step_own ? &s->pay : NULL,
                       &(tdm_step_obs){.proposed = k, .accepted = acc, .looked_up = n_look, .looked_up_acc = acc_look,
                                       .lookup_step = it->ngram && k > 0, .committed = q->n_tokens - before,
                                       .k_final = it->k_plan, .draft_s = draft_s, .verify_s = verify_s});
}

/* An EAGLE-3 head's features of item x's committed rows (from row0 of the forward;
 * before: its tokens before the commit): a prompt chunk's, a chain's verified path
 * (engine.h tdm_engine_head_keep), or a tree's accepted path (v: its verdict). */
static void head_keep(tdm_sched *s, const step_item *x, const tdm_verdict *v, int32_t row0, int32_t before) {
    tdm_seq *q = &x->r->s;
    tdm_err err = {0};
    const int32_t n = x->decode ? q->n_tokens - before : x->to - x->from; /* (a path: accepted + 1) */
    if (x->r->fail_st) return;
    tandem_status st = x->tree ? tdm_sched_head_keep_tree(s, x, v, row0, before, &err)
                               : tdm_engine_head_keep(s->e, q, row0, x->from, n, !x->decode, &err);
    if (st) tdm_sched_fail(x->r, st, &err);
}

/* Runs items [0, n) as one forward (group_forward), then commits their results. */
static void run_group(tdm_sched *s, const step_item *it, int32_t n) {
    tdm_engine *e = s->e;
    int32_t *tok = s->g_tok;
    tdm_err err = {0};
    tdm_fwd_kind kind;
    tandem_status st = group_forward(s, it, n, &kind, &err);
    const double now = tdm_now();
    const double draft_s = s->t_draft, verify_s = now - s->t_verify0;
    for (int32_t i = 0, j = 0, row0 = 0; i < n; row0 += tdm_sched_item_rows(&it[i]), i++) {
        tdm_req *r = it[i].r;
        tdm_seq *q = &r->s;
        const int32_t before = q->n_tokens;
        if (st) {
            tdm_sched_fail(r, st, &err);
            continue;
        }
        if (it[i].reject) { /* (alone in its forward: its rule reads the rows) */
            if (r->fail_st) continue; /* (its masks failed) */
            tdm_verdict v;
            if ((st = it[i].tree ? tdm_verify_tree_reject(e, s->ws, q, it[i].tree, 0, &v, &err)
                                 : tdm_verify_reject(e, s->ws, q, it[i].draft, it[i].k, it[i].n_model, 0, kind, &v, &err))) {
                tdm_sched_fail(r, st, &err);
                continue;
            }
            if (it[i].tree) tdm_sched_commit_tree(s, &it[i], &v, draft_s, verify_s);
            else commit_chain_item(s, &it[i], &v, draft_s, verify_s);
            if (e->head) head_keep(s, &it[i], &v, row0, before);
            if (r->t_first == 0) r->t_first = now;
            continue;
        }
        const int32_t n_out = item_logits(&it[i]);
        const int32_t *out = tok + j, t = n_out ? out[n_out - 1] : 0;
        j += n_out;
        if (r->fail_st) continue; /* (its masks failed) */
        int32_t bad = -1;
        for (int32_t x = 0; x < n_out && bad < 0; x++)
            if (out[x] < 0) bad = x;
        if (bad >= 0) {
            tdm_err ferr;
            tdm_engine_nonfinite(e, false, it[i].tree ? it[i].from : it[i].to - n_out + bad, &ferr);
            tdm_sched_fail(r, TANDEM_ERR_FORMAT, &ferr);
            continue;
        }
        if (it[i].tree) {
            tdm_verdict v;
            v.n_acc = tdm_tree_accept_match(it[i].tree, out, v.path, &v.next);
            if (q->sp.temperature > 0) tdm_engine_consume(q, v.n_acc + 1); /* the uniforms of the kept tokens */
            tdm_sched_commit_tree(s, &it[i], &v, draft_s, verify_s);
            if (e->head) head_keep(s, &it[i], &v, row0, before);
            if (r->t_first == 0) r->t_first = now;
            continue;
        }
        if (it[i].decode) { /* a verified chain, or the plain next token (k = 0) */
            tdm_verdict v;
            v.n_acc = tdm_accept_greedy(it[i].draft, it[i].k, out, &v.next);
            if (q->sp.temperature > 0) tdm_engine_consume(q, v.n_acc + 1);
            commit_chain_item(s, &it[i], &v, draft_s, verify_s);
            if (e->head) head_keep(s, &it[i], NULL, row0, before);
            if (r->t_first == 0) r->t_first = now;
            continue;
        }
        if (e->head) head_keep(s, &it[i], NULL, row0, before); /* (sets n_draft) */
        q->n_target = it[i].to;
        r->n_fed = it[i].to;
        if (e->draft && !e->head) q->n_draft = it[i].to;
        if (r->n_fed < r->n_goal) continue;
        r->state = TDM_REQ_RUNNING;
        if (e->cfg.prefix_cache) tdm_kv_prefix_publish(e->pool, &q->kv, q->tokens, r->n_fed);
        if (!it[i].want) continue; /* (a recomputation: its next token is pending) */
        if (q->sp.temperature > 0) tdm_engine_consume(q, 1);
        tdm_commit_token(e, q, t);
        if (r->t_first == 0) r->t_first = now;
    }
}

void tdm_sched_run_plan(tdm_sched *s, const step_item *it, int32_t n) {
    tdm_engine *e = s->e;
    const int32_t inv = tdm_sched_invariant_rows(e);
    for (int32_t i = 0; i < n;) {
        const int32_t cap_logits = TDM_MIN(e->n_logit_rows, TDM_ENGINE_BATCH_LOGITS_MAX);
        int32_t rows = 0, logits = 0, j = i;
        while (j < n) {
            const step_item *x = &it[j];
            if (j > i && (x->reject || it[i].reject)) break; /* (its rule reads the rows) */
            if (inv > 0 && j > i && (!x->decode || !it[i].decode)) break; /* a chunk goes alone */
            if (inv > 0 && j > i && x->decode && rows + tdm_sched_item_rows(x) > inv) break;
            if (j > i && (rows + tdm_sched_item_rows(x) > e->max_rows || logits + item_logits(x) > cap_logits)) break;
            rows += tdm_sched_item_rows(x);
            logits += item_logits(x);
            j++;
        }
        run_group(s, it + i, j - i);
        i = j;
    }
}
