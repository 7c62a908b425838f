/* sched.c - the scheduler's edges: submission, cancellation, finishing, the
 * scheduler thread and the blocking run (scheduler.h).  One iteration is step.c
 * (with step_chain.c, step_tree.c and step_run.c). */
#include <stdlib.h>
#include <string.h>

#include "commit.h"
#include "diag.h"
#include "kv_cache.h"
#include "sched_internal.h"

static void free_arrays(tdm_sched *s) {
    free(s->run), free(s->g_seqs), free(s->g_rows), free(s->g_masks), free(s->draws), free(s->g_tok);
    free(s->g_who), free(s->g_slot), free(s->drafts), free(s->k_of), free(s->items);
    free(s->tree_of), free(s->trees), free(s->look_of), free(s->roots), free(s->plan_of);
    free(s->g_con), free(s->g_con_err);
}

tandem_status tdm_sched_create(tdm_engine *e, const tdm_spec_ws_opts *opts, tdm_sched **out, tdm_err *err) {
    *out = NULL;
    tdm_sched *s = calloc(1, sizeof *s);
    if (!s) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    s->e = e;
    s->cap = TDM_MAX(e->cfg.n_seq_max, 1);
    s->run = calloc((size_t)s->cap, sizeof *s->run);
    const size_t L = (size_t)TDM_MAX(e->n_logit_rows, s->cap);
    s->g_seqs = calloc((size_t)s->cap, sizeof *s->g_seqs);
    s->g_rows = calloc(L, sizeof *s->g_rows);
    s->g_masks = calloc(L, sizeof *s->g_masks);
    s->draws = calloc((size_t)s->cap * (TDM_CTRL_MAX_K + 1), sizeof *s->draws);
    s->g_tok = calloc(L, sizeof *s->g_tok);
    s->g_con = calloc((size_t)s->cap, sizeof *s->g_con);
    s->g_con_err = calloc((size_t)s->cap, sizeof *s->g_con_err);
    s->g_who = calloc(L, sizeof *s->g_who);
    s->g_slot = calloc(L, sizeof *s->g_slot);
    s->drafts = calloc((size_t)s->cap * TDM_CTRL_MAX_K, sizeof *s->drafts);
    s->k_of = calloc((size_t)s->cap, sizeof *s->k_of);
    s->items = calloc((size_t)s->cap, sizeof *s->items);
    s->tree_of = calloc((size_t)s->cap, sizeof *s->tree_of);
    s->trees = e->draft ? calloc((size_t)s->cap, sizeof *s->trees) : NULL;
    s->look_of = calloc((size_t)s->cap, sizeof *s->look_of);
    s->plan_of = calloc((size_t)s->cap, sizeof *s->plan_of);
    s->roots = calloc((size_t)s->cap * TDM_TREE_DEPTH_MAX, sizeof *s->roots);
    if ((e->draft && !s->trees) || !s->look_of || !s->plan_of || !s->roots || !s->tree_of || !s->run || !s->g_seqs || !s->g_rows || !s->g_masks || !s->draws || !s->g_tok || !s->g_con || !s->g_con_err || !s->g_who || !s->g_slot || !s->drafts || !s->k_of ||
        !s->items) {
        free_arrays(s);
        free(s);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    if (e->draft) {
        tandem_status st = tdm_spec_ws_create(e, opts, &s->ws, err);
        if (st) {
            free_arrays(s);
            free(s);
            return st;
        }
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv_work, NULL);
    pthread_cond_init(&s->cv_done, NULL);
    pthread_mutex_init(&s->ctl_mu, NULL);
    s->next_id = 1;
    s->kv_free_seen = tdm_kv_pool_n_free(e->pool);
    atomic_init(&s->alpha_carry, -1.0);
    tdm_ctrl_init(&s->pair, 1, TDM_CTRL_MAX_K, 0);
    s->pair.alpha_ema = 0.05;
    if (s->ws) s->ws->len.log = tdm_diag_get()->sched_log;
    *out = s;
    return TANDEM_OK;
}

tdm_spec_ws *tdm_sched_ws(tdm_sched *s) { return s->ws; }

const tdm_req *tdm_sched_running_req(const tdm_sched *s, int32_t i) { return i >= 0 && i < s->n_run ? s->run[i] : NULL; }

static void free_req(tdm_engine *e, tdm_req *r) {
    tdm_seq_release(e, &r->s);
    tdm_spec_rec_free(&r->sr);
    free(r);
}

void tdm_sched_free(tdm_sched *s) {
    if (!s) return;
    tdm_err err = {0};
    (void)tdm_sched_stop(s, &err);
    /* everything still here ends cancelled: the queue, the running batch, the inbox */
    pthread_mutex_lock(&s->mu);
    tdm_req *in = s->inbox_head;
    s->inbox_head = s->inbox_tail = NULL;
    s->n_inbox = 0;
    pthread_mutex_unlock(&s->mu);
    for (tdm_req *r; (r = tdm_queue_pop(&s->wait));) tdm_sched_finish(s, r, TANDEM_FINISH_CANCELLED);
    while (s->n_run > 0) tdm_sched_finish(s, s->run[0], TANDEM_FINISH_CANCELLED);
    while (in) {
        tdm_req *nx = in->next_inbox;
        tdm_sched_finish(s, in, TANDEM_FINISH_CANCELLED);
        in = nx;
    }
    tdm_queue_free(&s->wait);
    pthread_cond_destroy(&s->cv_work);
    pthread_cond_destroy(&s->cv_done);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->ctl_mu);
    tdm_spec_ws_free(s->e, s->ws);
    free_arrays(s);
    free(s);
}

void tdm_sched_stat_add(tdm_sched *s, uint64_t *field, uint64_t n) {
    pthread_mutex_lock(&s->mu);
    *field += n;
    pthread_mutex_unlock(&s->mu);
}

tandem_status tdm_sched_submit(tdm_sched *s, const int32_t *prompt, int32_t n_prompt,
                               const tandem_generate_params *gp, int priority, double timeout_ms,
                               tandem_finish_cb on_finish, void *user_data, uint64_t *out_id, tdm_err *err) {
    if (!(timeout_ms >= 0))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "timeout_ms %g is out of range [0, +inf]", timeout_ms);
    tdm_req *r = calloc(1, sizeof *r);
    if (!r) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    tandem_status st = tdm_seq_init(s->e, &r->s, prompt, n_prompt, gp, err);
    if (!st)
        st = tdm_spec_rec_init(&r->sr, gp, s->e->cfg.n_seq_max,
                               atomic_load_explicit(&s->alpha_carry, memory_order_relaxed), err);
    if (st) {
        free_req(s->e, r);
        return st;
    }
    r->priority = priority;
    r->on_finish = on_finish;
    r->user_data = user_data;
    r->n_goal = n_prompt;
    r->t_submit = tdm_now();
    if (timeout_ms > 0) r->deadline = r->t_submit + timeout_ms * 1e-3;
    pthread_mutex_lock(&s->mu);
    r->id = s->next_id++;
    r->order = s->next_order++;
    if (s->inbox_tail) s->inbox_tail->next_inbox = r;
    else s->inbox_head = r;
    s->inbox_tail = r;
    s->n_inbox++;
    r->next_live = s->live;
    if (s->live) s->live->prev_live = r;
    s->live = r;
    s->stats.n_submitted++;
    if (out_id) *out_id = r->id;
    pthread_cond_signal(&s->cv_work);
    pthread_mutex_unlock(&s->mu);
    return TANDEM_OK;
}

tandem_status tdm_sched_cancel(tdm_sched *s, uint64_t id, tdm_err *err) {
    pthread_mutex_lock(&s->mu);
    tdm_req *r = s->live;
    while (r && r->id != id) r = r->next_live;
    bool ok = r && !r->finished && !r->cancel;
    if (ok) {
        r->cancel = true;
        s->n_cancel++;
        pthread_cond_signal(&s->cv_work);
    }
    pthread_mutex_unlock(&s->mu);
    if (!ok) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "no queued or running request has id %llu",
                               (unsigned long long)id);
    return TANDEM_OK;
}

void tdm_sched_unrun(tdm_sched *s, tdm_req *r) {
    /* (from the end: a step's finishes go from the last running request down, so
     * each is found at once, and a batch that ends together costs O(n), not O(n^2)) */
    for (int32_t i = s->n_run - 1; i >= 0; i--)
        if (s->run[i] == r) {
            memmove(s->run + i, s->run + i + 1, (size_t)(s->n_run - i - 1) * sizeof *s->run);
            s->n_run--;
            return;
        }
}

void tdm_sched_finish(tdm_sched *s, tdm_req *r, tandem_finish_reason reason) {
    tdm_engine *e = s->e;
    if (r->state != TDM_REQ_WAITING) tdm_sched_unrun(s, r);
    tandem_result res;
    memset(&res, 0, sizeof res);
    tandem_status st = r->fail_st;
    tdm_err err = r->fail_err;
    const double now = tdm_now();
    if (!st) {
        if (reason != TANDEM_FINISH_NONE) r->s.finish = reason;
        const double t0 = r->t_start > 0 ? r->t_start : now, t1 = r->t_first > 0 ? r->t_first : now;
        st = tdm_seq_result(&r->s, (t1 - t0) * 1e3, (now - t1) * 1e3, &res, &err);
        if (!st) tdm_spec_stats_result(&res.spec, &r->sr.spec, res.decode_ms, e->draft != NULL);
        /* the next request starts from what this one's pair accepted */
        if (!st && r->sr.spec.drafted > 0) atomic_store_explicit(&s->alpha_carry, r->sr.ctrl.alpha, memory_order_relaxed);
    }
    if (st) {
        tandem_result_free(&res);
        res.status = st;
        res.error = strdup(err.msg[0] ? err.msg : tandem_status_str(st));
        res.finish_reason = TANDEM_FINISH_ERROR;
        res.n_prompt_tokens = (size_t)r->s.n_prompt;
    }
    res.queue_ms = ((r->t_start > 0 ? r->t_start : now) - r->t_submit) * 1e3;
    res.n_cached_tokens = r->n_cached;
    res.n_preemptions = r->n_preempt;
    tdm_kv_seq_free(e->pool, &r->s.kv);
    pthread_mutex_lock(&s->mu);
    s->kv_free_seen = tdm_kv_pool_n_free(e->pool); /* (before on_finish: a caller that waits for it sees its blocks free) */
    s->run_seen = s->n_run;
    r->finished = true;
    if (r->cancel) s->n_cancel--;
    if (r->prev_live) r->prev_live->next_live = r->next_live;
    else s->live = r->next_live;
    if (r->next_live) r->next_live->prev_live = r->prev_live;
    tandem_engine_stats *t = &s->stats;
    t->n_finished++;
    if (res.status) t->n_failed++;
    if (res.finish_reason == TANDEM_FINISH_CANCELLED) t->n_cancelled++;
    if (res.finish_reason == TANDEM_FINISH_TIMEOUT) t->n_timeouts++;
    t->generated_tokens += res.n_tokens;
    t->spec_drafted += res.spec.drafted;
    t->spec_accepted += res.spec.accepted;
    pthread_mutex_unlock(&s->mu);
    const uint64_t id = r->id;
    tandem_finish_cb cb = r->on_finish;
    void *ud = r->user_data;
    free_req(e, r);
    if (cb) cb(id, &res, ud);
    else tandem_result_free(&res);
}

static bool pending_locked(const tdm_sched *s) { return s->n_inbox > 0 || s->live != NULL; }

/* The scheduler this thread is stepping (callbacks run inside a step). */
static _Thread_local tdm_sched *tl_stepping;

/* Exactly one thread steps at any time: the scheduler thread, a blocking run or a
 * tdm_sched_step, whichever holds s->stepping (taken and dropped under s->mu). */
/* Waits (s->mu held) for the stepper to drop the right to step, or for cv_done's
 * other news (a request finished, the thread stopped). */
static void wait_step_locked(tdm_sched *s) {
    s->n_step_wait++;
    pthread_cond_wait(&s->cv_done, &s->mu);
    s->n_step_wait--;
}

static void take_step_locked(tdm_sched *s) {
    while (s->stepping) wait_step_locked(s);
    s->stepping = true;
}

static void drop_step_locked(tdm_sched *s) {
    s->kv_free_seen = tdm_kv_pool_n_free(s->e->pool);
    s->run_seen = s->n_run;
    s->stepping = false;
    if (s->n_step_wait > 0) pthread_cond_broadcast(&s->cv_done);
}

/* One iteration by a thread that holds the right to step (s->mu not held). */
static void iterate(tdm_sched *s, tdm_err *err) {
    tl_stepping = s;
    (void)tdm_sched_iterate(s, err); /* (what fails, fails its requests alone) */
    tl_stepping = NULL;
}

tandem_status tdm_sched_step(tdm_sched *s, int *n_pending, tdm_err *err) {
    if (tl_stepping == s) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "step called from a callback");
    pthread_mutex_lock(&s->mu);
    take_step_locked(s);
    pthread_mutex_unlock(&s->mu);
    iterate(s, err);
    pthread_mutex_lock(&s->mu);
    drop_step_locked(s);
    if (n_pending) *n_pending = (int)(s->stats.n_submitted - s->stats.n_finished); /* (the live requests) */
    pthread_mutex_unlock(&s->mu);
    return TANDEM_OK;
}

static void *thread_main(void *arg) {
    tdm_sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->th_stop && (!pending_locked(s) || s->stepping)) {
            if (s->stepping) { /* (a step begun before the thread started) */
                wait_step_locked(s);
            } else {
                pthread_cond_wait(&s->cv_work, &s->mu);
            }
        }
        if (s->th_stop) break;
        s->stepping = true;
        pthread_mutex_unlock(&s->mu);
        tdm_err err = {0};
        iterate(s, &err);
        pthread_mutex_lock(&s->mu);
        drop_step_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

tandem_status tdm_sched_start(tdm_sched *s, tdm_err *err) {
    if (tl_stepping == s) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "start called from a callback");
    pthread_mutex_lock(&s->ctl_mu);
    pthread_mutex_lock(&s->mu);
    const bool started = s->th_started;
    s->th_stop = false;
    pthread_mutex_unlock(&s->mu);
    tandem_status st = TANDEM_OK;
    if (!started) {
        if (pthread_create(&s->th, NULL, thread_main, s) != 0) {
            st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "could not start the scheduler thread");
        } else {
            pthread_mutex_lock(&s->mu);
            s->th_started = true;
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_mutex_unlock(&s->ctl_mu);
    return st;
}

tandem_status tdm_sched_stop(tdm_sched *s, tdm_err *err) {
    if (tl_stepping == s) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "stop called from a callback");
    pthread_mutex_lock(&s->ctl_mu);
    pthread_mutex_lock(&s->mu);
    const bool started = s->th_started;
    s->th_stop = true;
    pthread_cond_broadcast(&s->cv_work);
    pthread_cond_broadcast(&s->cv_done);
    pthread_mutex_unlock(&s->mu);
    if (started) pthread_join(s->th, NULL);
    pthread_mutex_lock(&s->mu);
    s->th_started = false;
    s->th_stop = false;
    pthread_cond_broadcast(&s->cv_done); /* (blocking runs now step themselves, one at a time) */
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&s->ctl_mu);
    return TANDEM_OK;
}

bool tdm_sched_running(tdm_sched *s) {
    pthread_mutex_lock(&s->mu);
    bool r = s->th_started;
    pthread_mutex_unlock(&s->mu);
    return r;
}

void tdm_sched_stats(tdm_sched *s, tandem_engine_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->stats;
    /* the running batch as the last step left it; every other live request waits
     * (one that finished since is no longer live) */
    const int live = (int)(s->stats.n_submitted - s->stats.n_finished);
    out->n_running = TDM_MIN(s->run_seen, live);
    out->n_waiting = live - out->n_running;
    out->kv_blocks_total = tdm_kv_pool_n_blocks(s->e->pool);
    out->kv_blocks_free = s->kv_free_seen;
    pthread_mutex_unlock(&s->mu);
}

/* ---- the blocking run ---- */

typedef struct run_wait {
    tdm_sched *s;
    tandem_result *res;
    int32_t remaining;
} run_wait;

typedef struct run_slot {
    run_wait *w;
    int32_t i;
} run_slot;

static void run_done(tandem_request_id id, tandem_result *result, void *user) {
    (void)id;
    run_slot *sl = user;
    sl->w->res[sl->i] = *result;
    pthread_mutex_lock(&sl->w->s->mu);
    sl->w->remaining--;
    pthread_cond_broadcast(&sl->w->s->cv_done);
    pthread_mutex_unlock(&sl->w->s->mu);
}

tandem_status tdm_sched_run(tdm_sched *s, const int32_t *const *prompts, const int32_t *n_prompts,
                            const tandem_generate_params *params, const int *priority, const double *timeout_ms,
                            int32_t n, tandem_result *res, tdm_err *err) {
    if (tl_stepping == s) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "a blocking generate called from a callback");
    run_slot *slots = calloc((size_t)TDM_MAX(n, 1), sizeof *slots);
    if (!slots) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    run_wait w = {.s = s, .res = res, .remaining = 0};
    for (int32_t i = 0; i < n; i++) {
        if (n_prompts[i] < 0) continue; /* (failed before it came here: res[i] is set) */
        slots[i] = (run_slot){&w, i};
        tdm_err rerr = {0};
        pthread_mutex_lock(&s->mu);
        w.remaining++;
        pthread_mutex_unlock(&s->mu);
        tandem_status st = tdm_sched_submit(s, prompts[i], n_prompts[i], &params[i], priority ? priority[i] : 0,
                                            timeout_ms ? timeout_ms[i] : 0.0, run_done, &slots[i], NULL, &rerr);
        if (st) { /* fails alone */
            pthread_mutex_lock(&s->mu);
            w.remaining--;
            pthread_mutex_unlock(&s->mu);
            memset(&res[i], 0, sizeof res[i]);
            res[i].status = st;
            res[i].error = strdup(rerr.msg[0] ? rerr.msg : tandem_status_str(st));
            res[i].finish_reason = TANDEM_FINISH_ERROR;
        }
    }
    pthread_mutex_lock(&s->mu);
    while (w.remaining > 0) {
        if (s->th_started) { /* the scheduler thread steps: wait for these requests */
            pthread_cond_wait(&s->cv_done, &s->mu);
            continue;
        }
        if (s->stepping) { /* another caller steps: wait for it, or for these requests */
            wait_step_locked(s);
            continue;
        }
        s->stepping = true;
        pthread_mutex_unlock(&s->mu);
        tdm_err serr = {0};
        iterate(s, &serr);
        pthread_mutex_lock(&s->mu);
        drop_step_locked(s);
    }
    pthread_mutex_unlock(&s->mu);
    free(slots);
    return TANDEM_OK;
}
