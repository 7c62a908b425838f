/* spec_ws.h - the speculation workspace (spec_ws.c): the buffers proposers and
 * verifiers work in beside an engine's own (drafted chains and their top
 * probabilities on the device, the draft's q rows, a tree's p / q rows, candidates
 * and the device-grown tree), and the length controller with the pair's measured
 * costs.  The scheduler owns one per engine with a draft model. */
#ifndef TDM_SPEC_WS_H
#define TDM_SPEC_WS_H

#include "length.h"
#include "dtree.h"
#include "engine.h"
#include "ngram.h"
#include "tree.h"
#include "tree_ctrl.h"

/* words of chain_dev past its tokens and top probabilities: -FLT_MAX, a spare id */
#define TDM_CHAIN_DEV_EXTRA 2
/* Candidates per node a greedy tree level takes from the topk op (16 children, and
 * one more for the benchmark's oracle, oracle.h). */
#define TDM_TREE_TOPK 17

/* Paths a workspace takes through the host where the device could (tests compare
 * the two; every flag false by default). */
typedef struct tdm_spec_ws_opts {
    bool host_chain;   /* greedy draft chains token by token through the host */
    bool host_topk;    /* greedy tree levels' candidates from host copies of the logits */
    bool host_tree;    /* a lone sequence's dynamic trees grown level by level through the host */
    /* benchmark shapes of lookups in trees (sched/step_tree.c; docs/DESIGN.md,
     * "Lookups in trees"); 0 / false: the library's choice */
    int32_t lookup_cands;      /* continuations a lookup tree takes, 1..TDM_LOOKUP_CANDS (1: a
                                  lookup step verifies one chain); 0: TDM_LOOKUP_CANDS */
    int32_t lookup_tree_extra; /* > 0: a lookup tree holds at most this many nodes beyond its
                                  first continuation; 0: the tree budget's */
    bool no_tree_lookups;      /* draft trees without the lookups' continuations */
    int32_t tree_auto_max;     /* the largest budget tree auto weighs, 1..TDM_TREE_MAX; 0: TDM_TREE_MAX */
} tdm_spec_ws_opts;

typedef struct tdm_spec_ws {
    tdm_spec_ws_opts opts;   /* as created (checked) */
    int32_t *bchain_dev;     /* [TDM_CTRL_MAX_K][n_logit_rows] backend memory: a batch's greedy
                                chains, round by round (chain.c), with chain_dev */
    int32_t *chain_dev;      /* [2][TDM_CTRL_MAX_K] + TDM_CHAIN_DEV_EXTRA backend memory: a
                                greedy draft chain's tokens, then their top probabilities
                                (as floats), then -FLT_MAX (a float) and a spare id (the oracle
                                benchmark's), when the backend keeps argmaxes on the device
                                (chain.c); else NULL */
    float *q_dev;            /* [TDM_CTRL_MAX_K][n_vocab] backend: draft q rows (with device
                                sampling, e->p_dev, and device chains), else NULL */
    float *probs;            /* [TDM_CTRL_MAX_K + 1][n_vocab] host: target p rows */
    float *qprobs;           /* [TDM_CTRL_MAX_K][n_vocab] host: draft q rows */
    float *tree_p;           /* [TDM_TREE_MAX + 1][n_vocab] host: a sampled tree's target p rows */
    float *tree_q;           /* [TDM_TREE_MAX + 1][n_vocab] host: the draft q rows its children
                                were drawn from (row 0: the root's, 1 + dslot: a node's) */
    double *tree_scr;        /* [2][n_vocab] host: tree_accept.h's scratch */
    int32_t *tree_topk_ids;  /* [n_logit_rows][TDM_TREE_TOPK] host, or NULL: greedy tree
                                levels' candidates from the backend's topk op (no logits
                                downloaded; a device backend with the op) */
    float *tree_topk_p;      /* [n_logit_rows][TDM_TREE_TOPK] their probabilities */
    tdm_dtree *dtree;        /* backend memory, or NULL: a lone sequence's greedy dynamic
                                tree grown on the device (backends with tree_grow, with
                                tree_topk_ids; tree_draft.c) */
    tdm_dtree *dtree_h;      /* host: its copy once grown */
    bool dtree_off;          /* the draft's forward took no device masks: host levels */
    tdm_len_ctrl len;        /* the speculation length and the pair's measured costs
                                (length.h): the scheduler's, for every step */
} tdm_spec_ws;

/* The workspace for engine e (which has a draft model), on its backend; opts (NULL:
 * the defaults) out of range: TANDEM_ERR_INVALID_ARG naming the field. */
tandem_status tdm_spec_ws_create(tdm_engine *e, const tdm_spec_ws_opts *opts, tdm_spec_ws **out, tdm_err *err);
/* Frees ws (its backend buffers on e's backend); NULL is a no-op. */
void tdm_spec_ws_free(tdm_engine *e, tdm_spec_ws *ws);

#endif
