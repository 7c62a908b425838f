/* sched_internal.h - the scheduler's state, shared by its files (sched.c: inbox,
 * thread, finishing; step.c: one iteration; queue.c: the waiting heap). */
#ifndef TDM_SCHED_INTERNAL_H
#define TDM_SCHED_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "length.h"
#include "chain.h"
#include "queue.h"
#include "scheduler.h"
#include "spec_rec.h"
#include "verdict.h"

typedef enum tdm_req_state {
    TDM_REQ_WAITING = 0, /* in the queue (new or preempted) */
    TDM_REQ_PREFILL,     /* running: positions [n_fed, n_goal) still to compute */
    TDM_REQ_RUNNING,     /* running: decoding */
} tdm_req_state;

struct tdm_req {
    uint64_t id;
    uint64_t order;            /* arrival order */
    int priority;
    double t_submit, deadline; /* tdm_now() seconds; deadline 0 = none */
    double t_start, t_first;   /* first admission; first token (0 = not yet) */
    tandem_finish_cb on_finish;
    void *user_data;
    tdm_seq s;                 /* validated at submit */
    tdm_spec_rec sr;           /* its speculation record */
    tdm_req_state state;
    int32_t n_fed;             /* positions computed for both models in this residency */
    int32_t n_goal;            /* positions to compute before decoding: the prompt, or for a
                                  recomputation every token but the pending last one */
    bool cancel;               /* asked by tdm_sched_cancel (under the lock) */
    bool cancel_seen;          /* the stepping thread's copy of cancel */
    bool finished;             /* on_finish called or about to be (under the lock) */
    int n_preempt;
    size_t n_cached;           /* prompt positions from the prefix cache, first admission */
    tandem_status fail_st;     /* set when it failed alone */
    tdm_err fail_err;
    tdm_req *next_inbox;       /* inbox list (under the lock) */
    tdm_req *prev_live, *next_live; /* every unfinished request (under the lock) */
};

/* step.c: one sequence's rows of a step, positions [from, to) */
typedef struct step_item {
    tdm_req *r;
    int32_t from, to;
    bool decode;   /* the pending token and k drafted ones (1 + k rows, all giving logits),
                      else a prompt chunk */
    bool want;     /* (a chunk) its last row's logits give the first token */
    int32_t k;     /* (decode) drafted tokens verified by its rows */
    bool ngram;    /* (decode) its chain comes from n-gram lookup, not the draft model */
    int32_t *draft;/* (decode) [TDM_CTRL_MAX_K] its chain */
    tdm_tree *tree;/* (decode) a token tree verified instead of a chain (k = 0), or NULL */
    int32_t budget;/* (decode, tree) its node budget */
    bool reject;   /* (decode) verified by rejection sampling against the draft's q rows
                      (a lone sampled sequence: lone.c), not by agreement with the
                      target's own draws */
} step_item;

struct tdm_sched {
    tdm_engine *e;
    tdm_spec_ws *ws;           /* the speculation workspace (an engine with a draft), else NULL */
    _Atomic double alpha_carry;/* the last speculating request's final acceptance estimate
                                  (the next request starts halfway between it and the
                                  prior: acceptance is mostly the pair's); < 0: none yet.
                                  Written by the stepping thread, read by submits */
    /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv_work;    /* the thread waits for work */
    pthread_cond_t cv_done;    /* tdm_sched_run waits for its requests, and any thread for
                                  the right to step (stepping) */
    pthread_mutex_t ctl_mu;    /* serialises tdm_sched_start and tdm_sched_stop (held over
                                  the thread's creation and join) */
    tdm_req *inbox_head, *inbox_tail;
    tdm_req *live;             /* doubly linked list of unfinished requests */
    int32_t n_inbox, n_cancel; /* requests in the inbox; cancels not yet applied */
    uint64_t next_id, next_order;
    tandem_engine_stats stats;
    bool th_started, th_stop;
    bool stepping;             /* a thread is inside an iteration: exactly one steps at any
                                  time (the scheduler thread, a blocking run, or
                                  tdm_sched_step), whatever the callers do */
    int32_t n_step_wait;       /* threads waiting for the right to step */
    /* free KV blocks and running sequences at the end of the last step or finish (the
     * pool and the batch are the stepping thread's: stats read these) */
    int32_t kv_free_seen, run_seen;
    pthread_t th;
    /* the stepping thread's own */
    tdm_queue wait;
    double wait_deadline;      /* no waiting request expires before this (0 = none does) */
    bool cancels;              /* this step saw cancel flags */
    tdm_req **run;             /* [cap] running requests, admission order */
    int32_t n_run, cap;
    const tdm_kv_seq **g_seqs; /* [cap] a forward's sequences */
    tdm_draw_row *g_rows;      /* [n_logit_rows] each logits row's sequence and uniform */
    int32_t *g_tok;            /* [n_logit_rows] the token drawn for each logits row */
    double *draws;             /* [cap][TDM_CTRL_MAX_K + 1] drafting sequences' uniforms */
    int32_t *g_who, *g_slot;   /* [n_logit_rows] drafting scratch (draft/chain.h) */
    int32_t *drafts;           /* [cap][TDM_CTRL_MAX_K] this step's drafted chains */
    step_item *items;          /* [cap] this step's plan */
    int32_t *k_of;             /* [cap] tokens each running sequence drafts this step */
    int32_t *tree_of;          /* [cap] the node budget of each running sequence's tree this
                                  step (0: a chain or nothing) */
    tdm_tree *trees;           /* [cap] this step's trees, by running sequence */
    tdm_tree_cost tree_cost;   /* drafting seconds of a batch's trees, by budget */
    uint32_t n_tree_decisions; /* auto tree choices so far (exploration schedule) */
    int32_t step_b, step_k;    /* this step's speculating batch and length (0: none) */
    tdm_len_choice len_ch;     /* this step's length decision (draft/length.h; the
                                  controller and the measured costs: ws->len) */
    tdm_spec_ctrl pair;        /* the pair's acceptance over every drafted chain (alpha):
                                  a new request's starting estimate */
    bool pair_seen;            /* pair observed at least once */
    tdm_payoff pay;            /* what lookups and the draft model yield over every request
                                  (draft/payoff.h): a new request's starting figures */
    double t_draft, t_verify0; /* this step's drafting seconds; when its verification began */
};

/* The drafting scratch (draft/chain.h) in the scheduler's buffers. */
static inline tdm_draft_scratch tdm_sched_draft_scratch(tdm_sched *s) {
    return (tdm_draft_scratch){s->g_seqs, s->g_who, s->g_slot, s->g_tok, s->g_rows};
}
/* The i-th running request (admission order), NULL past the last (for tests that
 * check a running sequence between steps). */
const tdm_req *tdm_sched_running_req(const tdm_sched *s, int32_t i);
/* step.c */
/* A lone sequence's verification (lone.c): one target forward over r's pending
 * token and draft[0..k), or its tree (k = 0; no tree and k = 0: a plain step), and
 * the verdict: greedy by agreement with the target's argmaxes; sampled by rejection
 * sampling against the draft's q rows (n_q_dev of them the model's on the device;
 * verify.h, tree_verify.h), a plain step's token drawn as without speculation.
 * Reserves the K/V the rows need; commits nothing (sched/commit.h). */
tandem_status tdm_sched_verify_lone(tdm_sched *s, tdm_req *r, const int32_t *draft, int32_t k, int32_t n_q_dev,
                                    const tdm_tree *tree, tdm_verdict *v, tdm_err *err);
tandem_status tdm_sched_iterate(tdm_sched *s, tdm_err *err);
/* Marks r failed with st (the first failure wins); it finishes at the step's end. */
void tdm_sched_fail(tdm_req *r, tandem_status st, const tdm_err *err);
/* step_tree.c: this step's tree budgets (s->tree_of) and the rows they take; the
 * configuration of a tree item; drafting the plan's trees (false: their sequences
 * failed); a tree item's verdict and commit from the target's tokens out[1 + nodes]. */
int32_t tdm_sched_choose_trees(tdm_sched *s);
bool tdm_sched_tree_cfg(const tdm_sched *s, const step_item *it, tdm_tree_cfg *cfg);
bool tdm_sched_draft_trees(tdm_sched *s, step_item *it, int32_t n);
void tdm_sched_commit_tree(tdm_sched *s, const step_item *it, const int32_t *out, double draft_s, double verify_s);
/* sched.c: ends a request (result built, blocks freed, on_finish called, freed).
 * reason NONE: from its sequence (done) or its fail_st. */
void tdm_sched_finish(tdm_sched *s, tdm_req *r, tandem_finish_reason reason);
void tdm_sched_stat_add(tdm_sched *s, uint64_t *field, uint64_t n);
/* Takes a request out of the running batch (the order of the others is kept). */
void tdm_sched_unrun(tdm_sched *s, tdm_req *r);

#endif
