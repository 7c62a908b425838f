/* tree_draft.h - drafting token trees with the draft model or an EAGLE-3 head, for
 * one sequence or many at once (tree_draft.c). */
#ifndef TDM_TREE_DRAFT_H
#define TDM_TREE_DRAFT_H

#include "engine.h"
#include "spec_rec.h"
#include "spec_ws.h"
#include "tree.h"

typedef struct tdm_tree_job {
    tdm_seq *s;
    tdm_spec_rec *sr;  /* its speculation record */
    tdm_tree_cfg cfg;  /* its shape and budget (depth within what the request may take) */
    tdm_tree *tree;    /* out: the tree, masks filled */
    bool sample;       /* children drawn from the draft's processed distribution without
                          replacement (tree_accept.h's sampling rule; q rows in
                          ws->tree_q, one sampled job at a time), else its likeliest tokens */
} tdm_tree_job;

/* Slots past the committed tokens a tree of this configuration may occupy (target
 * nodes or draft nodes): what the sequence's blocks must back. */
int32_t tdm_tree_slots(const tdm_tree_cfg *c);

/* Drafts every job's tree: the draft catches up on the committed tokens it has not
 * seen (the last one's distribution gives the root's children), then each level is
 * one draft forward over the nodes chosen for expansion of every job, each node at
 * slot n + its draft slot, position n + its depth, seeing the prefix and its fed
 * ancestors (a tree mask), so the draft's K/V for tree nodes live in the
 * sequence's blocks.  Afterwards each sequence's draft holds [0, n) and its tree's
 * fed nodes (dslot).  Blocks must back n + tdm_tree_slots(cfg) slots.  With an
 * EAGLE-3 head as the draft the same levels run through the head (its rows one slot
 * lower, each node fed its parent's h: src/engine/head.c).  *n_forwards: draft
 * forwards run. */
tandem_status tdm_draft_trees(tdm_engine *e, tdm_spec_ws *ws, tdm_tree_job *jobs, int32_t n, int32_t *n_forwards, tdm_err *err);

#endif
