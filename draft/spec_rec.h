/* spec_rec.h - one sequence's speculation record (spec_rec.c): what its proposers
 * and controllers know and what its speculation did.  The scheduler keeps one in
 * each request (sched/sched_internal.h); the engine's sequence (tdm_seq) knows
 * nothing of it. */
#ifndef TDM_SPEC_REC_H
#define TDM_SPEC_REC_H

#include "length.h"
#include "payoff.h"
#include "sampling.h"
#include "tree.h"
#include "tree_ctrl.h"

typedef struct tdm_spec_rec {
    tdm_spec_ctrl ctrl;      /* the draft model's acceptance estimate, the request's k bounds */
    float spec_p_min;        /* drafting stops below this top probability (spec_p_min) */
    int32_t spec_ngram;      /* longest n-gram looked up, 0 = off */
    tdm_payoff pay;          /* what lookups and the draft model yield, measured (payoff.h) */
    bool lookups;            /* this step may propose lookups (tdm_spec_rec_step) */
    tdm_spec_ctrl ctrl_ng;   /* the n-gram proposals' acceptance estimate */
    int32_t n_ngram_skips;   /* matches passed over for the draft model (exploration) */
    int32_t spec_tree;       /* 0 = chains, TANDEM_SPEC_TREE_AUTO, > 0 a tree budget */
    tdm_tree_cfg tree_shape; /* a static tree (n_shape > 0), else n_shape 0 */
    tdm_tree_ctrl tctrl;     /* tokens per tree step by budget */
    int32_t *oracle;         /* [n_oracle] benchmark only (oracle.h): the target's own
                                continuation, NULL = off */
    int32_t n_oracle;
    double oracle_alpha;
    tdm_rng oracle_rng;      /* its draws (apart from the request's generator) */
    tandem_spec_stats spec;  /* what the speculation did (sched/commit.h adds each step) */
} tdm_spec_rec;

/* Fills r from a request's validated parameters (tdm_seq_init checked their
 * ranges): the controllers (the draft model's acceptance estimate starts halfway
 * between its prior and carry, the engine's last request's final estimate, when
 * carry >= 0), n-gram lookup, the tree setting (a static shape parsed: a bad one is
 * TANDEM_ERR_INVALID_ARG naming it), the oracle benchmark's continuation (which needs
 * an engine of n_seq_max 1). */
tandem_status tdm_spec_rec_init(tdm_spec_rec *r, const tandem_generate_params *gp, int32_t n_seq_max, double carry,
                                tdm_err *err);
void tdm_spec_rec_free(tdm_spec_rec *r);
/* At the start of each of the sequence's steps: whether the step may propose
 * n-gram lookups (on, and paying: payoff.h). */
void tdm_spec_rec_step(tdm_spec_rec *r);
/* The longest n-gram this step looks up, 0 = none. */
static inline int32_t tdm_spec_lookup_n(const tdm_spec_rec *r) { return r->lookups ? r->spec_ngram : 0; }

#endif
