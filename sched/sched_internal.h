/* sched_internal.h - the scheduler's state, shared by its files (sched.c: inbox,
 * thread, finishing; step.c: one iteration and its plan; step_chain.c: lengths and
 * chains; step_tree.c: token trees; step_run.c: the forwards, verdicts and commits;
 * queue.c: the waiting heap). */
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

/* One sequence's rows of a step (step.c plans them, step_chain.c and step_tree.c
 * propose, step_run.c verifies and commits), positions [from, to). */
typedef struct step_item {
    tdm_req *r;
    int32_t from, to;  /* a decode item's `to` is first what its blocks must back (its
                          longest proposal), then its rows' end once proposed */
    bool decode;       /* the pending token and k proposed ones (1 + k rows, all giving
                          logits), or a tree; else a prompt chunk */
    bool want;         /* (a chunk) its last row's logits give the first token */
    int32_t k;         /* (decode) tokens proposed as a chain, verified by its rows */
    int32_t k_plan;    /* (decode) the length the controller gave it (-1: none) */
    int32_t k_look;    /* (decode) the longest lookup it may propose this step (0: none) */
    int32_t n_model;   /* (decode) of the chain, the draft model's first n_model tokens
                          (the rest looked up) */
    bool ngram;        /* (decode) the proposal is lookups alone, a chain or a tree */
    int32_t *draft;    /* (decode) [TDM_CTRL_MAX_K] its chain */
    tdm_tree *tree;    /* (decode) a token tree verified instead of a chain (k = 0), or NULL */
    int32_t budget;    /* (decode, tree) its node budget */
    int32_t *root;     /* (decode, tree) [TDM_TREE_DEPTH_MAX] the lookup its tree holds from
                          the root, or a lookup tree's first continuation: what the lookups'
                          estimate learns from */
    int32_t n_root;
    bool reject;       /* (decode, sampled) verified by rejection sampling against the
                          draft's q rows (a sampled sequence on an engine of one sequence),
                          not by agreement with the target's own draws; alone in its
                          forward */
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
    const uint32_t **g_masks;  /* [n_logit_rows] each logits row's grammar mask, for a masked
                                  greedy forward (tdm_batch.logit_masks) */
    int32_t *g_tok;            /* [n_logit_rows] the token drawn for each logits row */
    int32_t *g_con;            /* [cap] a forward's items whose grammar masks it computes */
    tdm_err *g_con_err;        /* [cap] and each one's outcome (status in .status) */
    double *draws;             /* [cap][TDM_CTRL_MAX_K + 1] drafting sequences' uniforms */
    int32_t *g_who, *g_slot;   /* [n_logit_rows] drafting scratch (draft/chain.h) */
    int32_t *drafts;           /* [cap][TDM_CTRL_MAX_K] this step's drafted chains */
    step_item *items;          /* [cap] this step's plan */
    int32_t *k_of;             /* [cap] tokens each running sequence drafts this step */
    int32_t *look_of;          /* [cap] the longest lookup each may propose this step */
    int32_t *plan_of;          /* [cap] the length the controller gave each (its statistics'
                                  k_final; -1: none, it was out of the decision) */
    int32_t *roots;            /* [cap][TDM_TREE_DEPTH_MAX] the lookups trees hold */
    int32_t *tree_of;          /* [cap] the node budget of each running sequence's tree this
                                  step (0: a chain or nothing) */
    tdm_tree *trees;           /* [cap] this step's trees, by running sequence */
    tdm_tree_cost tree_cost;   /* drafting seconds of a batch's trees, by budget */
    uint32_t n_tree_decisions; /* auto tree choices so far (exploration schedule) */
    int32_t step_b, step_k;    /* this step's speculating batch and length (0: none) */
    int32_t other_rows;        /* this step's target rows outside the decision (prompt
                                  chunks, trees, fixed lengths) */
    int32_t n_spec;            /* sequences that may draft a chain this step */
    tdm_len_choice len_ch;     /* this step's length decision (draft/length.h; the
                                  controller and the measured costs: ws->len) */
    tdm_spec_ctrl pair;        /* the pair's acceptance over every drafted chain (alpha):
                                  a new request's starting estimate */
    bool pair_seen;            /* pair observed at least once */
    tdm_payoff pay;            /* what lookups and the draft model yield over every request
                                  (draft/payoff.h): a new request's starting figures */
    double t_draft, t_verify0; /* this step's drafting seconds; when its verification began */
    bool step_own;             /* the step is one sequence's alone: its seconds are its own
                                  (the payoff of lookups, draft/payoff.h) */
};

/* The drafting scratch (draft/chain.h) in the scheduler's buffers. */
static inline tdm_draft_scratch tdm_sched_draft_scratch(tdm_sched *s) {
    return (tdm_draft_scratch){s->g_seqs, s->g_who, s->g_slot, s->g_tok, s->g_rows};
}
/* The i-th running request (admission order), NULL past the last (for tests that
 * check a running sequence between steps). */
const tdm_req *tdm_sched_running_req(const tdm_sched *s, int32_t i);
/* step.c */
tandem_status tdm_sched_iterate(tdm_sched *s, tdm_err *err);
/* Marks r failed with st (the first failure wins); it finishes at the step's end. */
void tdm_sched_fail(tdm_req *r, tandem_status st, const tdm_err *err);
/* Rows up to which a forward computes each row as alone, 0 = any (or no need). */
static inline int32_t tdm_sched_invariant_rows(const tdm_engine *e) {
    return e->cfg.batch_invariant ? e->be->invariant_rows : 0;
}
/* The tokens q may still propose beyond the one the target adds: within its
 * max_tokens, the context and the invariant rows. */
static inline int32_t tdm_sched_room(const tdm_sched *s, const tdm_seq *q) {
    const int32_t room = TDM_MIN(q->max_new - (q->n_tokens - q->n_prompt) - 1, s->e->cfg.n_ctx - q->n_tokens);
    const int32_t inv = tdm_sched_invariant_rows(s->e);
    return inv > 0 ? TDM_MIN(room, inv - 1) : room;
}
/* An item's target rows: a tree's pending token and nodes, else its positions. */
static inline int32_t tdm_sched_item_rows(const step_item *it) { return it->tree ? 1 + it->tree->n : it->to - it->from; }
/* step_chain.c: this step's lengths (s->k_of, s->look_of; the trees' budgets,
 * s->tree_of, through tdm_sched_choose_trees); the chains of the plan's items
 * [0, n): lookups where they pay, the draft model's for the rest (false: drafting
 * failed, its sequences failed); *catch_up: the rows the draft fed for tokens it had
 * not seen. */
void tdm_sched_choose_k(tdm_sched *s);
bool tdm_sched_draft_chains(tdm_sched *s, step_item *it, int32_t n, int32_t *catch_up);
/* The item verifies the lookup it->draft[0..nd) as a chain instead of its model
 * chain, plain step or tree (its rows, the lookup's one-hot q rows for rejection
 * sampling). */
void tdm_sched_take_lookup_chain(tdm_sched *s, step_item *it, int32_t nd);
/* step_tree.c: this step's tree budgets (s->tree_of) and the rows they take; the
 * configuration of a tree item; the plan's trees (a lookup alone instead where it
 * pays; drafted together; false: their sequences failed); a tree item's verdict v
 * (step_run.c's) committed, and what the step teaches. */
int32_t tdm_sched_choose_trees(tdm_sched *s);
bool tdm_sched_tree_cfg(const tdm_sched *s, const step_item *it, tdm_tree_cfg *cfg);
bool tdm_sched_draft_trees(tdm_sched *s, step_item *it, int32_t n);
void tdm_sched_commit_tree(tdm_sched *s, const step_item *it, const tdm_verdict *v, double draft_s, double verify_s);
/* An EAGLE-3 head's pending features after tree item it's verdict v was committed
 * (the item's root row at row0 of the forward; before: its tokens before the commit):
 * the accepted path's rows alone (engine.h tdm_engine_head_keep_path). */
tandem_status tdm_sched_head_keep_tree(tdm_sched *s, const step_item *it, const tdm_verdict *v, int32_t row0,
                                       int32_t before, tdm_err *err);
/* step_run.c: the plan's items [0, n) as forwards (grouped so that each row is
 * computed as it would be alone), each item's verdict and commit. */
void tdm_sched_run_plan(tdm_sched *s, const step_item *it, int32_t n);

/* sched.c: ends a request (result built, blocks freed, on_finish called, freed).
 * reason NONE: from its sequence (done) or its fail_st. */
void tdm_sched_finish(tdm_sched *s, tdm_req *r, tandem_finish_reason reason);
void tdm_sched_stat_add(tdm_sched *s, uint64_t *field, uint64_t n);
/* Takes a request out of the running batch (the order of the others is kept). */
void tdm_sched_unrun(tdm_sched *s, tdm_req *r);

#endif
