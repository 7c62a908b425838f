/* step.c - one scheduler iteration (scheduler.h):
 *   1. the inbox joins the queue; cancels and deadlines end their requests;
 *   2. admission: waiting requests join the running batch while a place is free and
 *      the KV pool holds their prompt (prefix-cache hits counted as held);
 *   3. the plan: every decoding sequence's next row, then prompt chunks of the
 *      prefilling ones under the step's token budget;
 *   4. KV blocks for the plan, preempting the lowest-priority, newest sequence when
 *      the pool is full;
 *   5. the forwards: rows grouped so that each is computed as it would be alone (one
 *      forward on a backend that is row-invariant at any size, groups of at most
 *      invariant_rows decode rows and one prompt chunk per forward otherwise); the
 *      draft model sees the prompt chunks too;
 *   6. tokens drawn and committed; finished sequences leave at once.
 * With a draft, every decoding sequence speculates (the length from measured
 * costs, draft/length.h): its chain comes from n-gram lookup or from batched
 * drafting (one draft forward per round for all), and its rows join the same
 * forward.  A sampled sequence's tokens are drawn with the uniform each position
 * would use without speculation, target and draft alike, and a drafted token is
 * kept when it equals the target's: its output is exactly what it would be alone
 * and unspeculated, whatever the batch and the lengths chosen.  A lone greedy
 * sequence (or a sampled one on an engine of one sequence) takes the
 * single-sequence speculative step instead (lone.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accept.h"
#include "length.h"
#include "chain.h"
#include "commit.h"
#include "liblog.h"
#include "kv_cache.h"
#include "lone.h"
#include "ngram.h"
#include "sched_internal.h"
#include "tree_accept.h"
#include "tree_draft.h"
#include "tree_verify.h"
#include "verify.h"

_Static_assert(TDM_ENGINE_BATCH_LOGITS_MAX <= TDM_LEN_SEQ_MAX, "a decision weighs every speculating sequence");

void tdm_sched_fail(tdm_req *r, tandem_status st, const tdm_err *err) {
    if (r->fail_st) return;
    r->fail_st = st ? st : TANDEM_ERR_INTERNAL;
    if (err) r->fail_err = *err;
    else memset(&r->fail_err, 0, sizeof r->fail_err);
}

/* ---- 1. inbox, cancels, deadlines ---- */

/* Puts a request in the waiting queue; false when out of memory. */
static bool queue(tdm_sched *s, tdm_req *r) {
    if (!tdm_queue_push(&s->wait, r)) return false;
    if (r->deadline > 0 && (s->wait_deadline == 0 || r->deadline < s->wait_deadline)) s->wait_deadline = r->deadline;
    return true;
}

static void take_inbox(tdm_sched *s) {
    pthread_mutex_lock(&s->mu);
    tdm_req *in = s->inbox_head;
    s->inbox_head = s->inbox_tail = NULL;
    s->n_inbox = 0;
    s->cancels = s->n_cancel > 0;
    if (s->cancels) { /* copy the flags the other threads set */
        for (tdm_req *r = s->live; r; r = r->next_live) r->cancel_seen = r->cancel;
    }
    pthread_mutex_unlock(&s->mu);
    while (in) {
        tdm_req *nx = in->next_inbox;
        in->next_inbox = NULL;
        if (in->s.max_new == 0) { /* nothing to run */
            in->s.done = true;
            in->s.finish = TANDEM_FINISH_LENGTH;
            tdm_sched_finish(s, in, TANDEM_FINISH_NONE);
        } else if (!queue(s, in)) {
            tdm_err err;
            tdm_seterr(&err, TANDEM_ERR_NOMEM, "out of memory queueing the request");
            tdm_sched_fail(in, TANDEM_ERR_NOMEM, &err);
            tdm_sched_finish(s, in, TANDEM_FINISH_NONE);
        }
        in = nx;
    }
}

static tandem_finish_reason expiry(const tdm_req *r, double now) {
    if (r->cancel_seen) return TANDEM_FINISH_CANCELLED;
    if (r->deadline > 0 && now >= r->deadline) return TANDEM_FINISH_TIMEOUT;
    return TANDEM_FINISH_NONE;
}

typedef struct expire_ctx {
    tdm_sched *s;
    double now;
    double deadline; /* the earliest deadline of those kept, 0 = none */
} expire_ctx;

static bool drop_expired(tdm_req *r, void *user) {
    expire_ctx *c = user;
    tandem_finish_reason why = expiry(r, c->now);
    if (why == TANDEM_FINISH_NONE) {
        if (r->deadline > 0 && (c->deadline == 0 || r->deadline < c->deadline)) c->deadline = r->deadline;
        return false;
    }
    tdm_sched_finish(c->s, r, why);
    return true;
}

/* Ends cancelled and expired requests; the waiting queue is scanned only in a step
 * that has a cancel or reaches its earliest deadline. */
static void expire(tdm_sched *s, double now) {
    if (s->cancels || (s->wait_deadline > 0 && now >= s->wait_deadline)) {
        expire_ctx c = {s, now, 0};
        tdm_queue_filter(&s->wait, drop_expired, &c);
        s->wait_deadline = c.deadline;
    }
    for (int32_t i = s->n_run - 1; i >= 0; i--) {
        tdm_req *r = s->run[i];
        tandem_finish_reason why = expiry(r, now);
        if (why != TANDEM_FINISH_NONE) tdm_sched_finish(s, r, why);
    }
}

/* ---- 2. admission ---- */

static bool fresh(const tdm_req *r) { return r->s.n_tokens == r->s.n_prompt; }

static void admit(tdm_sched *s, double now) {
    tdm_engine *e = s->e;
    tdm_kv_pool *pool = e->pool;
    const int32_t bs = tdm_kv_pool_block_size(pool);
    while (s->n_run < s->cap) {
        tdm_req *r = tdm_queue_top(&s->wait);
        if (!r) return;
        tdm_seq *q = &r->s;
        const bool first = fresh(r);
        /* a fresh prompt is computed up to its last token (whose logits give the first
         * new token); a preempted sequence up to its pending token */
        const int32_t goal = first ? q->n_prompt : q->n_tokens - 1;
        int32_t cached = 0;
        if (e->cfg.prefix_cache && q->kv.len == 0) {
            const int32_t max_blocks = (first ? goal - 1 : goal) / bs;
            cached = tdm_kv_prefix_match(pool, q->tokens, goal, max_blocks, &q->kv);
        }
        const int32_t need = tdm_kv_blocks_for(pool, goal + 1) - q->kv.n_blocks;
        if (s->n_run > 0 && need > tdm_kv_pool_n_free(pool)) { /* wait for blocks */
            tdm_kv_seq_free(pool, &q->kv);
            return;
        }
        tdm_queue_pop(&s->wait);
        r->state = TDM_REQ_PREFILL;
        r->n_goal = goal;
        r->n_fed = cached;
        q->n_target = cached;
        q->n_draft = e->draft ? cached : 0;
        if (r->t_start == 0) {
            r->t_start = now;
            /* what the pair has been accepting, rather than a prior that may keep a
             * batch from ever speculating (and so from ever learning) */
            if (s->pair_seen && r->sr.ctrl.k_fixed == 0) r->sr.ctrl.alpha = s->pair.alpha;
            tdm_payoff_carry(&r->sr.pay, &s->pay);
            r->n_cached = (size_t)cached;
            pthread_mutex_lock(&s->mu);
            s->stats.prompt_tokens += (uint64_t)q->n_prompt;
            s->stats.cached_tokens += (uint64_t)cached;
            if (cached > 0) s->stats.prefix_hits++;
            pthread_mutex_unlock(&s->mu);
        }
        s->run[s->n_run++] = r;
    }
}

/* ---- 3. the plan ---- */

/* Rows up to which a forward computes each row as alone, 0 = any (or no need). */
static int32_t invariant_rows(const tdm_engine *e) { return e->cfg.batch_invariant ? e->be->invariant_rows : 0; }

/* Prompt chunks end on multiples of the engine's prefill chunk, so that a prompt
 * is cut the same way whatever else runs (on a backend whose rows depend on the
 * size of the product, the chunk's own forward then computes what it would alone);
 * on a backend that is row-invariant at any size the budget may cut them anywhere. */
static int32_t plan(tdm_sched *s, step_item *it) {
    tdm_engine *e = s->e;
    const int32_t budget = e->cfg.max_batch_tokens, pc = e->cfg.prefill_chunk;
    const bool any_cut = invariant_rows(e) == 0;
    int32_t n = 0, rows = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        tdm_req *r = s->run[i];
        if (r->state != TDM_REQ_RUNNING) continue;
        const int32_t p = r->s.n_tokens - 1, k = s->k_of[i];
        it[n] = (step_item){r, p, p + 1 + k, true, true, k, false, s->drafts + (size_t)i * TDM_CTRL_MAX_K, NULL, 0, false};
        tdm_tree_cfg cfg;
        if (s->tree_of[i] > 0) {
            it[n].tree = &s->trees[i], it[n].budget = s->tree_of[i];
            if (tdm_sched_tree_cfg(s, &it[n], &cfg)) it[n].to = p + 1 + tdm_tree_slots(&cfg); /* (what it reserves) */
            else it[n].tree = NULL;
        }
        rows += it[n].tree ? 1 + it[n].budget : 1 + k;
        n++;
    }
    bool chunked = false;
    for (int32_t i = 0; i < s->n_run; i++) {
        tdm_req *r = s->run[i];
        if (r->state != TDM_REQ_PREFILL) continue;
        int32_t c = TDM_MIN(r->n_goal - r->n_fed, pc - r->n_fed % pc);
        const int32_t left = budget - rows;
        if (c > left) { /* one chunk runs in every step, even over the budget */
            if (any_cut && left > 0) c = left;
            else if (chunked) break;
        }
        it[n++] = (step_item){r, r->n_fed, r->n_fed + c, false, fresh(r) && r->n_fed + c == r->n_goal, 0, false, NULL, NULL, 0, false};
        rows += c;
        chunked = true;
    }
    return n;
}

/* ---- 4. KV blocks, preemption ---- */

static tdm_req *victim(const tdm_sched *s) {
    tdm_req *v = NULL;
    for (int32_t i = 0; i < s->n_run; i++) {
        tdm_req *r = s->run[i];
        if (!v || r->priority < v->priority || (r->priority == v->priority && r->order > v->order)) v = r;
    }
    return v;
}

static void preempt(tdm_sched *s, tdm_req *r) {
    tdm_kv_seq_free(s->e->pool, &r->s.kv);
    tdm_sched_unrun(s, r);
    r->state = TDM_REQ_WAITING;
    r->n_fed = 0;
    r->s.n_target = r->s.n_draft = 0;
    r->n_preempt++;
    tdm_sched_stat_add(s, &s->stats.n_preemptions, 1);
    if (!queue(s, r)) {
        tdm_err err;
        tdm_seterr(&err, TANDEM_ERR_NOMEM, "out of memory requeueing a preempted request");
        tdm_sched_fail(r, TANDEM_ERR_NOMEM, &err);
        tdm_sched_finish(s, r, TANDEM_FINISH_NONE);
    }
}

/* Backs every planned row; returns false when a sequence was preempted or failed
 * (the plan must be made again). */
static bool reserve(tdm_sched *s, const step_item *it, int32_t n) {
    tdm_engine *e = s->e;
    for (int32_t i = 0; i < n; i++) {
        tdm_req *r = it[i].r;
        tdm_err err = {0};
        tandem_status st = tdm_kv_seq_reserve(e->pool, &r->s.kv, it[i].to, &err);
        if (!st && e->copy_status) {
            st = tdm_seterr(&err, e->copy_status, "%s", e->copy_err.msg);
            e->copy_status = TANDEM_OK;
        }
        if (!st) continue;
        if (st == TANDEM_ERR_KV_FULL && s->n_run > 1) {
            preempt(s, victim(s));
        } else {
            tdm_sched_fail(r, st, &err);
            tdm_sched_finish(s, r, TANDEM_FINISH_NONE);
        }
        return false;
    }
    return true;
}

/* ---- 5, 6. forwards, tokens ---- */

static int32_t item_rows(const step_item *it) { return it->tree ? 1 + it->tree->n : it->to - it->from; }
static int32_t item_logits(const step_item *it) { return it->tree ? 1 + it->tree->n : it->decode ? 1 + it->k : it->want; }

/* A decode item's verdict by agreement and its commit: out[0..k] are the target's
 * tokens at rows [pending token, draft[0], ..., draft[k-1]] (k = 0: a plain step),
 * each its argmax when the sequence is greedy, else drawn with the uniform its
 * position would use without speculation (the draft drew draft[d] with the same
 * uniform).  The longest agreeing prefix and the target's next token are
 * committed, one uniform consumed per token committed, and the step recorded in
 * the sequence's controller (an n-gram chain: the lookups') and statistics.
 *
 * The committed tokens are the target's own at every position, so the output is
 * token for token the output of decoding without speculation, greedy or sampled;
 * for a sampled sequence a drafted token survives with the probability that the
 * two draws agree (which the shared uniform makes likely where p and q are close),
 * at most min over p, q's overlap, rather than the optimum of rejection sampling
 * (verify/accept.h), in exchange for output that does not depend on the batch.
 * Returns the tokens accepted. */
static int32_t commit_match(tdm_sched *s, const step_item *it, const int32_t *out, double draft_s,
                            double verify_s) {
    tdm_seq *q = &it->r->s;
    tdm_spec_rec *sr = &it->r->sr;
    const int32_t k = it->k, before = q->n_tokens;
    tdm_verdict v;
    v.n_acc = tdm_accept_greedy(it->draft, k, out, &v.next);
    if (q->sp.temperature > 0) tdm_engine_consume(q, v.n_acc + 1);
    tdm_commit_chain(s->e, q, it->draft, &v);
    if (k > 0) tdm_ctrl_observe(it->ngram ? &sr->ctrl_ng : &sr->ctrl, k, v.n_acc);
    tdm_spec_stats_add(sr, NULL, &(tdm_step_obs){.proposed = k, .accepted = v.n_acc,
                                                 .looked_up = it->ngram ? k : 0, .looked_up_acc = it->ngram ? v.n_acc : 0,
                                                 .lookup_step = it->ngram && k > 0, .committed = q->n_tokens - before,
                                                 .k_final = k > 0 ? k : -1, .draft_s = draft_s, .verify_s = verify_s});
    return v.n_acc;
}

/* What an item's verdict reads of the target's forward: tokens drawn per logits
 * row (a greedy item's argmaxes, TDM_FWD_ARGMAX; a sampled item's draws with its
 * uniforms, where the engine samples), or, for rejection sampling (it->reject, alone
 * in its group), the logits rows themselves where its rule runs: a chain's on the
 * device with the draft's q rows there, a tree's on the host. */
static tdm_fwd_kind item_kind(const tdm_sched *s, const step_item *it) {
    const bool samples = it->r->s.sp.temperature > 0 && (it->tree || it->decode || it->want);
    if (!samples) return TDM_FWD_ARGMAX;
    if (it->reject) return !it->tree && s->ws && s->ws->q_dev ? TDM_FWD_LOGITS_DEV : TDM_FWD_LOGITS;
    return s->e->p_dev ? TDM_FWD_LOGITS_DEV : TDM_FWD_LOGITS;
}

/* The rows of items [0, n) as one forward of the target (and one of the draft over
 * the prompt chunks among them), and a token drawn for every logits row (s->g_tok,
 * in row order) unless the items are verified by rejection sampling (it->reject:
 * then their rules read the forward's logits rows; a group holds no other item). */
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
            rows[m++] = (tdm_draw_row){q, u[0]};
            for (int32_t x = 0; x < t->n; x++) rows[m++] = (tdm_draw_row){q, u[t->depth[x] + 1]};
            if (item_kind(s, &it[i]) != TDM_FWD_ARGMAX) kind = item_kind(s, &it[i]);
            continue;
        }
        if (draws) tdm_engine_draws(q, item_logits(&it[i]), u);
        for (int32_t p = it[i].from, d = 0; p < it[i].to; p++) {
            const bool want = it[i].decode || (it[i].want && p == it[i].to - 1);
            const int32_t tk = p < q->n_tokens ? q->tokens[p] : it[i].draft[p - q->n_tokens];
            tdm_batch_add(b, tk, p, i, p, want);
            if (want) rows[m++] = (tdm_draw_row){q, u[d++]};
        }
        if (item_kind(s, &it[i]) != TDM_FWD_ARGMAX) kind = item_kind(s, &it[i]);
        any_chunk |= !it[i].decode;
    }
    *kind_out = kind;
    b->rows_shared = !e->cfg.batch_invariant && n > 1; /* (a lone sequence's rows stay its own) */
    tandem_status st = tdm_engine_forward(e, false, b, seqs, kind, err);
    const bool rule_reads_rows = n > 0 && it[0].reject && kind != TDM_FWD_ARGMAX;
    if (!st && m > 0 && !rule_reads_rows) st = tdm_engine_draw(e, false, rows, m, kind, s->g_tok, err);
    if (!st && e->draft && any_chunk) { /* the draft sees the prompt chunks */
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

/* Runs items [0, n) as one forward (group_forward), then commits their results. */
static void run_group(tdm_sched *s, const step_item *it, int32_t n) {
    tdm_engine *e = s->e;
    int32_t *tok = s->g_tok;
    tdm_err err = {0};
    tdm_fwd_kind kind;
    tandem_status st = group_forward(s, it, n, &kind, &err);
    const double now = tdm_now();
    for (int32_t i = 0, j = 0; i < n; i++) {
        tdm_req *r = it[i].r;
        tdm_seq *q = &r->s;
        const int32_t n_out = item_logits(&it[i]);
        const int32_t *out = tok + j, t = n_out ? out[n_out - 1] : 0;
        j += n_out;
        if (st) {
            tdm_sched_fail(r, st, &err);
            continue;
        }
        int32_t bad = -1;
        for (int32_t x = 0; x < n_out && bad < 0; x++)
            if (out[x] < 0) bad = x;
        if (bad >= 0) {
            tdm_err ferr;
            tdm_engine_nonfinite(e, false, it[i].to - n_out + bad, &ferr);
            tdm_sched_fail(r, TANDEM_ERR_FORMAT, &ferr);
            continue;
        }
        if (it[i].tree) {
            tdm_sched_commit_tree(s, &it[i], out, s->t_draft, now - s->t_verify0);
            if (r->t_first == 0) r->t_first = now;
            continue;
        }
        if (it[i].decode) { /* a verified chain, or the plain next token (k = 0) */
            const int32_t acc = commit_match(s, &it[i], out, s->t_draft, now - s->t_verify0);
            if (it[i].k > 0 && !it[i].ngram) {
                tdm_ctrl_observe(&s->pair, it[i].k, acc);
                s->pair_seen = true;
            }
            if (r->t_first == 0) r->t_first = now;
            continue;
        }
        q->n_target = it[i].to;
        if (!it[i].decode) {
            r->n_fed = it[i].to;
            if (e->draft) q->n_draft = it[i].to;
            if (r->n_fed < r->n_goal) continue;
            r->state = TDM_REQ_RUNNING;
            if (e->cfg.prefix_cache) tdm_kv_prefix_publish(e->pool, &q->kv, q->tokens, r->n_fed);
            if (!it[i].want) continue; /* (a recomputation: its next token is pending) */
        }
        if (q->sp.temperature > 0) tdm_engine_consume(q, 1);
        tdm_commit_token(e, q, t);
        if (r->t_first == 0) r->t_first = now;
    }
}

tandem_status tdm_sched_verify_lone(tdm_sched *s, tdm_req *r, const int32_t *draft, int32_t k, int32_t n_q_dev,
                                    const tdm_tree *tree, tdm_verdict *v, tdm_err *err) {
    tdm_engine *e = s->e;
    tdm_seq *q = &r->s;
    const int32_t n = q->n_tokens;
    const bool reject = q->sp.temperature > 0 && (k > 0 || tree);
    tandem_status st;
    const int32_t slots = tree ? TDM_MAX(tree->n, tree->n_fed) : k;
    if (tree && 1 + tree->n > e->n_logit_rows)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "a tree of %d nodes exceeds the engine's %d logits rows",
                          (int)tree->n, (int)e->n_logit_rows);
    if ((st = tdm_kv_seq_reserve(e->pool, &q->kv, n + slots, err))) return st;
    if (e->copy_status) return tdm_seterr(err, e->copy_status, "%s", e->copy_err.msg);
    const step_item it = {r, n - 1, n + k, true, true, k, false, (int32_t *)draft, (tdm_tree *)tree,
                          tree ? tree->n : 0, reject};
    tdm_fwd_kind kind;
    if ((st = group_forward(s, &it, 1, &kind, err))) return st;
    const int32_t *out = s->g_tok;
    if (reject && tree) return tdm_verify_tree_reject(e, s->ws, q, tree, 0, v, err);
    if (reject) return tdm_verify_reject(e, s->ws, q, draft, k, n_q_dev, 0, kind, v, err);
    const int32_t n_out = item_logits(&it);
    for (int32_t x = 0; x < n_out; x++)
        if (out[x] < 0) return tdm_engine_nonfinite(e, false, n - 1 + (tree ? 0 : x), err);
    if (tree) {
        v->n_acc = tdm_tree_accept_match(tree, out, v->path, &v->next);
    } else {
        v->n_acc = tdm_accept_greedy(draft, k, out, &v->next);
    }
    /* (a sampled plain step drew its token with the uniform it would use anyway) */
    if (q->sp.temperature > 0) tdm_engine_consume(q, v->n_acc + 1);
    return TANDEM_OK;
}

/* Groups the plan into forwards (see the top of the file) and runs them. */
static void run_plan(tdm_sched *s, const step_item *it, int32_t n) {
    tdm_engine *e = s->e;
    const int32_t inv = invariant_rows(e);
    for (int32_t i = 0; i < n;) {
        const int32_t cap_logits = TDM_MIN(e->n_logit_rows, TDM_ENGINE_BATCH_LOGITS_MAX);
        int32_t rows = 0, logits = 0, j = i;
        while (j < n) {
            const step_item *x = &it[j];
            if (inv > 0 && j > i && (!x->decode || !it[i].decode)) break; /* a chunk goes alone */
            if (inv > 0 && j > i && x->decode && rows + item_rows(x) > inv) break;
            if (j > i && (rows + item_rows(x) > e->max_rows || logits + item_logits(x) > cap_logits)) break;
            rows += item_rows(x);
            logits += item_logits(x);
            j++;
        }
        run_group(s, it + i, j - i);
        i = j;
    }
}

/* ---- speculation in a batch ---- */

/* The tokens each running sequence drafts this step (s->k_of): every decoding
 * sequence speculates when the engine has a draft (a lone greedy one takes
 * tdm_seq_step instead), with one k for the batch from the one length controller
 * (draft/length.h: measured costs; a request's fixed spec_k is its own).  On a
 * batch-invariant GPU a chain's rows fit one forward of invariant rows. */
static void choose_k(tdm_sched *s) {
    tdm_engine *e = s->e;
    memset(s->k_of, 0, (size_t)s->n_run * sizeof *s->k_of);
    memset(s->tree_of, 0, (size_t)s->n_run * sizeof *s->tree_of);
    s->step_b = s->step_k = 0;
    if (!e->draft) return;
    const int32_t tree_rows = tdm_sched_choose_trees(s);
    tdm_len_seq bs[TDM_ENGINE_BATCH_LOGITS_MAX];
    int32_t idx[TDM_ENGINE_BATCH_LOGITS_MAX], nb = 0, other = tree_rows, k_max = 0;
    const int32_t inv = invariant_rows(e);
    for (int32_t i = 0; i < s->n_run; i++) {
        const tdm_req *r = s->run[i];
        const tdm_seq *q = &r->s;
        if (r->state != TDM_REQ_RUNNING) {
            other += TDM_MIN(r->n_goal - r->n_fed, e->cfg.prefill_chunk);
            continue;
        }
        if (s->tree_of[i] > 0) continue; /* (its rows are in tree_rows) */
        if (nb == TDM_ENGINE_BATCH_LOGITS_MAX) {
            other++;
            continue;
        }
        const tdm_spec_ctrl *ctrl = &r->sr.ctrl;
        int32_t cap = ctrl->k_fixed > 0 ? ctrl->k_fixed : ctrl->k_max;
        cap = TDM_MIN(cap, q->max_new - (q->n_tokens - q->n_prompt) - 1); /* (the target adds one) */
        cap = TDM_MIN(cap, e->cfg.n_ctx - q->n_tokens);
        if (inv > 0) cap = TDM_MIN(cap, inv - 1);
        if (cap <= 0) {
            other++;
            continue;
        }
        idx[nb] = i;
        bs[nb++] = (tdm_len_seq){ctrl->alpha, cap};
        k_max = TDM_MAX(k_max, cap);
    }
    if (nb < 1) return;
    /* every chain verified within one forward's logits rows */
    k_max = TDM_MIN(k_max, (e->n_logit_rows - other) / nb - 1);
    if (k_max <= 0) return;
    tdm_len_choose(&s->ws->len, bs, nb, other, 1, k_max, &s->len_ch);
    const int32_t k = s->len_ch.k;
    s->step_b = nb;
    s->step_k = k;
    for (int32_t j = 0; j < nb; j++) {
        const tdm_spec_rec *sr = &s->run[idx[j]]->sr;
        s->k_of[idx[j]] = sr->ctrl.k_fixed > 0 ? bs[j].cap : TDM_MIN(k, bs[j].cap);
    }
}

/* An n-gram proposal of up to it->k tokens for the item's sequence, taken instead
 * of the draft model's chain when the step's expected rate with it is at least
 * the rate with the model's chain (draft/length.h: tdm_len_rate; the others'
 * rows and draft rounds stay), with tdm_ngram_take's exploration; the item then
 * verifies it. */
static bool ngram_chain(const tdm_sched *s, step_item *it) {
    const tdm_seq *q = &it->r->s;
    tdm_spec_rec *sr = &it->r->sr;
    if (!tdm_spec_lookup_n(sr)) return false;
    const int32_t nd = tdm_ngram_propose(q->tokens, q->n_tokens, tdm_spec_lookup_n(sr), it->k, it->draft);
    if (nd <= 0) return false;
    const tdm_len_choice *ch = &s->len_ch;
    const double e_d = tdm_ctrl_expected_tokens(sr->ctrl.alpha, it->k);
    const double e_rest = TDM_MAX(ch->e - e_d, 0.0);
    const int32_t n = TDM_MAX(s->step_b, 1), rows = TDM_MAX(ch->rows, 1 + it->k);
    const double rate_ng = tdm_len_rate(&s->ws->len, n, e_rest + tdm_ctrl_expected_tokens(sr->ctrl_ng.alpha, nd),
                                        rows - it->k + nd, s->step_k);
    const double rate_d = tdm_len_rate(&s->ws->len, n, e_rest + e_d, rows, s->step_k);
    if (!tdm_ngram_take(rate_ng, rate_d, &sr->n_ngram_skips)) return false;
    it->k = nd;
    it->to = it->from + 1 + nd;
    it->ngram = true;
    return true;
}

/* Proposes the chains the plan verifies: n-gram lookups where they pay, the draft
 * model for the rest (draft/chain.h: one draft forward per round for all of them;
 * a sampled sequence's token d drafted with the uniform its target token uses);
 * false when drafting failed (its sequences fail, nothing else runs).  *catch_up:
 * the rows the draft fed for tokens it had not seen. */
static bool draft_chains(tdm_sched *s, step_item *it, int32_t n, int32_t *catch_up) {
    tdm_engine *e = s->e;
    tdm_chain_req req[TDM_ENGINE_BATCH_LOGITS_MAX];
    step_item *who[TDM_ENGINE_BATCH_LOGITS_MAX];
    int32_t m = 0, k_max = 0;
    *catch_up = 0;
    for (int32_t i = 0; i < n && m < TDM_ENGINE_BATCH_LOGITS_MAX; i++) {
        if (!it[i].decode || it[i].k <= 0 || ngram_chain(s, &it[i])) continue;
        tdm_seq *q = &it[i].r->s;
        double *u = s->draws + (size_t)m * (TDM_CTRL_MAX_K + 1);
        if (q->sp.temperature > 0) tdm_engine_draws(q, it[i].k, u);
        who[m] = &it[i];
        req[m++] = (tdm_chain_req){.s = q, .sr = &it[i].r->sr, .k = it[i].k, .k_ext = it[i].k,
                                   .u = q->sp.temperature > 0 ? u : NULL, .draft = it[i].draft};
        k_max = TDM_MAX(k_max, it[i].k);
    }
    if (m == 0) return true;
    const tdm_draft_scratch scr = tdm_sched_draft_scratch(s);
    tdm_err err = {0};
    const double t0 = tdm_now();
    tandem_status st = tdm_draft_chains(e, s->ws, req, m, &scr, catch_up, &err);
    /* a round's cost: the drafting over its rounds, where it caught up on no more
     * than a token or two a sequence */
    if (!st && *catch_up <= m) tdm_rowcost_observe(&s->ws->len.cost.draft, m, (tdm_now() - t0) / (double)k_max);
    for (int32_t j = 0; j < m && !st; j++) { /* (p_min may have cut a chain) */
        who[j]->k = req[j].n_drafted;
        who[j]->to = who[j]->from + 1 + req[j].n_drafted;
    }
    if (!st) return true;
    for (int32_t j = 0; j < m; j++) tdm_sched_fail(who[j]->r, st, &err);
    return false;
}

/* ---- the iteration ---- */

static void finish_done(tdm_sched *s) {
    for (int32_t i = s->n_run - 1; i >= 0; i--) {
        tdm_req *r = s->run[i];
        if (r->fail_st || r->s.done) tdm_sched_finish(s, r, TANDEM_FINISH_NONE);
    }
}

static bool alone_spec(const tdm_sched *s) {
    if (s->n_run != 1 || !s->e->draft) return false;
    const tdm_req *r = s->run[0];
    return r->state == TDM_REQ_RUNNING && (r->s.sp.temperature <= 0 || s->cap == 1);
}

tandem_status tdm_sched_iterate(tdm_sched *s, tdm_err *err) {
    (void)err;
    tdm_engine *e = s->e;
    e->copy_status = TANDEM_OK;
    take_inbox(s);
    const double now = tdm_now();
    expire(s, now);
    admit(s, now);
    if (s->n_run == 0) return TANDEM_OK;
    tdm_sched_stat_add(s, &s->stats.steps, 1);
    if (alone_spec(s)) {
        tdm_req *r = s->run[0];
        tdm_err serr = {0};
        tandem_status st = tdm_seq_step(s, r, &serr);
        if (st) tdm_sched_fail(r, st, &serr);
        finish_done(s);
        return TANDEM_OK;
    }
    for (int32_t i = 0; i < s->n_run; i++) /* (lookups this step, where they pay: what a lone
                                               step measured, draft/payoff.h) */
        if (s->run[i]->state == TDM_REQ_RUNNING) tdm_spec_rec_step(&s->run[i]->sr);
    step_item *it = s->items;
    int32_t n;
    do { /* (again after a preemption: the running batch changed) */
        choose_k(s);
        n = plan(s, it);
    } while (!reserve(s, it, n) && s->n_run > 0);
    if (s->n_run > 0 && n > 0) {
        const double t0 = tdm_now();
        s->t_draft = 0;
        int32_t catch_up;
        if (draft_chains(s, it, n, &catch_up) && tdm_sched_draft_trees(s, it, n)) {
            s->t_verify0 = tdm_now();
            s->t_draft = s->t_verify0 - t0;
            int32_t rows = 0;
            bool chunk = false;
            for (int32_t i = 0; i < n; i++) {
                rows += item_rows(&it[i]);
                chunk |= !it[i].decode || it[i].tree; /* (a tree's step is not a chain length's) */
            }
            run_plan(s, it, n);
            const double t1 = tdm_now();
            if (s->ws) tdm_rowcost_observe(&s->ws->len.cost.target, rows, t1 - s->t_verify0);
            /* what a step of this batch and length costs, where nothing else was in
             * it: no prompt chunk, no catching up beyond a token or two a sequence */
            if (s->step_b > 0 && !chunk && catch_up <= s->step_b)
                tdm_len_observe_step(&s->ws->len, s->step_b, s->step_k, t1 - t0);
        }
    }
    /* a recomputed sequence whose every position came from the cache decodes next */
    for (int32_t i = 0; i < s->n_run; i++) {
        tdm_req *r = s->run[i];
        if (r->state == TDM_REQ_PREFILL && !fresh(r) && r->n_fed >= r->n_goal) r->state = TDM_REQ_RUNNING;
    }
    finish_done(s);
    return TANDEM_OK;
}
