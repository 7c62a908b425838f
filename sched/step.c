/* step.c - one scheduler iteration (scheduler.h), the one place a step is
 * composed, for a lone sequence (a batch of one) and a batch alike:
 *   1. the inbox joins the queue; cancels and deadlines end their requests;
 *   2. admission: waiting requests join the running batch while a place is free and
 *      the KV pool holds their prompt besides the next rows of those running
 *      (prefix-cache hits counted as held);
 *   3. the plan: every decoding sequence's length (step_chain.c: one decision for
 *      the step, draft/length.h) or token tree (step_tree.c), then prompt chunks of
 *      the prefilling ones under the step's token budget;
 *   4. KV blocks for the plan (each proposal's longest), preempting the
 *      lowest-priority, newest sequence when the pool is full;
 *   5. the proposals: trees (or lookups instead), then chains (lookups where they
 *      pay, the draft model's together for the rest);
 *   6. the forwards, verdicts and commits (step_run.c): rows grouped so that each
 *      is computed as it would be alone; finished sequences leave at once;
 *   7. what the step cost, for the length controller (draft/costs.h).
 * Data flows one way: request -> plan -> proposals (draft/) -> forward -> verdicts
 * (verify/) -> commit (commit.h, where tokens leave). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain.h"
#include "kv_cache.h"
#include "sched_internal.h"
#include "tree_draft.h"

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

/* The blocks the running sequences take before their next decode row is backed
 * (a prefilling one's: its goal and the row after it; a decoding one's: its pending
 * token's row) beyond those they hold: admission leaves them free, so that the
 * batch admitted is one the pool holds for its next step, rather than one the
 * step's reservation preempts back to the queue (longer proposals, and growth
 * beyond the next row, may still preempt). */
static int32_t promised_blocks(const tdm_sched *s) {
    tdm_kv_pool *pool = s->e->pool;
    int32_t n = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        const tdm_req *r = s->run[i];
        const int32_t rows = TDM_MAX(r->n_goal + 1, r->s.n_tokens);
        n += TDM_MAX(tdm_kv_blocks_for(pool, rows) - r->s.kv.n_blocks, 0);
    }
    return n;
}

static void admit(tdm_sched *s, double now) {
    tdm_engine *e = s->e;
    tdm_kv_pool *pool = e->pool;
    const int32_t bs = tdm_kv_pool_block_size(pool);
    int32_t promised = -1; /* (counted at the first waiting request) */
    while (s->n_run < s->cap) {
        tdm_req *r = tdm_queue_top(&s->wait);
        if (!r) return;
        if (promised < 0) promised = promised_blocks(s);
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
        if (s->n_run > 0 && need > tdm_kv_pool_n_free(pool) - promised) { /* wait for blocks */
            tdm_kv_seq_free(pool, &q->kv);
            return;
        }
        promised += need;
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

/* Prompt chunks end on multiples of the engine's prefill chunk, so that a prompt
 * is cut the same way whatever else runs (on a backend whose rows depend on the
 * size of the product, the chunk's own forward then computes what it would alone);
 * on a backend that is row-invariant at any size the budget may cut them anywhere.
 *
 * Neither side starves the other: every decoding sequence's rows are in every step
 * (they come first, even past the budget), and the prompt chunks take what the
 * budget leaves, in admission order, with at least one chunk (of at most
 * prefill_chunk rows) in every step however many decode.  A decode step is thus
 * lengthened by at most max(budget - its decode rows, one chunk) prompt rows, and a
 * waiting prompt advances by at least one chunk a step. */
static int32_t plan(tdm_sched *s, step_item *it) {
    tdm_engine *e = s->e;
    const int32_t budget = e->cfg.max_batch_tokens, pc = e->cfg.prefill_chunk;
    const bool any_cut = tdm_sched_invariant_rows(e) == 0;
    int32_t n = 0, rows = 0;
    for (int32_t i = 0; i < s->n_run; i++) {
        tdm_req *r = s->run[i];
        if (r->state != TDM_REQ_RUNNING) continue;
        const int32_t p = r->s.n_tokens - 1, k = s->k_of[i], look = s->look_of[i];
        it[n] = (step_item){.r = r, .from = p, .to = p + 1 + TDM_MAX(k, look), .decode = true, .want = true, .k = k,
                            .k_plan = s->e->draft ? s->plan_of[i] : -1, .k_look = look, .n_model = k, .draft = s->drafts + (size_t)i * TDM_CTRL_MAX_K,
                            .root = s->roots + (size_t)i * TDM_TREE_DEPTH_MAX,
                            /* (device q rows only where no chain keeps its q rows on the host:
                             * a constrained or penalised one's, a head's) */
                            .reject = r->s.sp.temperature > 0 && s->cap == 1 && e->draft &&
                                      (!(r->s.con || r->s.pen || e->head) || !s->ws->q_dev) && r->s.lp_top < 0};
        tdm_tree_cfg cfg;
        if (s->tree_of[i] > 0) {
            it[n].tree = &s->trees[i], it[n].budget = s->tree_of[i], it[n].k = it[n].n_model = 0;
            if (tdm_sched_tree_cfg(s, &it[n], &cfg)) it[n].to = p + 1 + TDM_MAX(tdm_tree_slots(&cfg), look); /* (what it reserves) */
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
        it[n++] = (step_item){.r = r, .from = r->n_fed, .to = r->n_fed + c, .want = fresh(r) && r->n_fed + c == r->n_goal,
                              .k_plan = -1};
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

/* ---- the iteration ---- */

static void finish_done(tdm_sched *s) {
    for (int32_t i = s->n_run - 1; i >= 0; i--) {
        tdm_req *r = s->run[i];
        if (r->s.con && r->s.con->fail_st) tdm_sched_fail(r, r->s.con->fail_st, &r->s.con->fail_err);
        if (r->fail_st || r->s.done) tdm_sched_finish(s, r, TANDEM_FINISH_NONE);
    }
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
    for (int32_t i = 0; i < s->n_run; i++) /* (lookups this step, where they pay: draft/payoff.h) */
        if (s->run[i]->state == TDM_REQ_RUNNING) tdm_spec_rec_step(&s->run[i]->sr);
    step_item *it = s->items;
    int32_t n;
    do { /* (again after a preemption: the running batch changed) */
        tdm_sched_choose_k(s);
        n = plan(s, it);
    } while (!reserve(s, it, n) && s->n_run > 0);
    if (s->n_run > 0 && n > 0) {
        const double t0 = tdm_now();
        s->t_draft = 0;
        s->step_own = n == 1 && it[0].decode;
        int32_t catch_up = 0;
        bool any_tree = false;
        for (int32_t i = 0; i < n; i++) any_tree |= it[i].tree != NULL;
        if (e->draft) tdm_phase_start(&e->ph, e->be);
        if (tdm_sched_draft_trees(s, it, n) && tdm_sched_draft_chains(s, it, n, &catch_up)) {
            if (e->draft && !any_tree) tdm_phase_mark(&e->ph, e->be, TDM_PH_CHAIN_DRAFT);
            s->t_verify0 = tdm_now();
            s->t_draft = s->t_verify0 - t0;
            int32_t rows = 0;
            bool chunk = false, trees = false, own = true; /* own: every chain the model's at the step's length */
            for (int32_t i = 0; i < n; i++) {
                if (it[i].decode && !it[i].tree) { /* (its rows: the proposal's, which may be shorter) */
                    it[i].to = it[i].from + 1 + it[i].k;
                    if (it[i].k == 0) it[i].reject = false; /* (a plain step draws) */
                }
                rows += tdm_sched_item_rows(&it[i]);
                trees |= it[i].tree != NULL;
                chunk |= !it[i].decode || it[i].tree; /* (a tree's step is not a chain length's) */
                own &= !it[i].ngram && it[i].n_model == it[i].k;
            }
            tdm_sched_run_plan(s, it, n);
            const double t1 = tdm_now();
            if (e->draft) tdm_phase_mark(&e->ph, e->be, any_tree ? TDM_PH_TREE_KEEP : TDM_PH_CHAIN_VERIFY);
            /* the target's rows (a tree's masked rows are its own: draft/tree_ctrl.h) */
            if (s->ws && !trees) tdm_rowcost_observe(&s->ws->len.cost.target, rows, t1 - s->t_verify0);
            if (s->ws && n == 1 && it[0].tree && !it[0].ngram)
                tdm_tree_cost_observe(&s->tree_cost, it[0].budget, 0, t1 - s->t_verify0, 0);
            /* what a step of this batch and length costs, where nothing else was in it:
             * no prompt chunk or tree, no catching up beyond a token or two a sequence;
             * a lone sequence's only where its chain was the model's at the chosen
             * length (a batch's lookups replace some chains every step) */
            if (s->step_b > 0 && !chunk && catch_up <= s->step_b && (s->step_b > 1 || own))
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
