/* tree_verify.h - verification of a drafted token tree (tree_verify.c). */
#ifndef TDM_TREE_VERIFY_H
#define TDM_TREE_VERIFY_H

#include "engine.h"
#include "spec_ws.h"
#include "tree.h"
#include "verdict.h"

/* Adds the rows of s's tree to the batch (sequence index si): the last committed
 * token at slot n - 1 (a causal row), then node i at slot n + i, position n +
 * depth, seeing [0, n) and its ancestors.  False when the batch is full. */
bool tdm_tree_rows(tdm_batch *b, const tdm_seq *s, const tdm_tree *t, int32_t si);

/* The verdict on s's tree t whose 1 + t->n target logits rows (the pending token's,
 * then node i's) are host rows [row0, row0 + 1 + t->n) of the latest target forward,
 * by multi-candidate rejection sampling (tree_accept.h; children drawn without
 * replacement, the draft's q rows in ws->tree_q).  v->n_acc: the accepted path's
 * length; v->path[0..n_acc): its nodes, root side first.  Consumes the draws the
 * rule used from s's generator (sched/commit.c commits the verdict).  A greedy
 * tree's verdict is agreement with the target's argmaxes (tree_accept.h). */
tandem_status tdm_verify_tree_reject(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, const tdm_tree *t, int32_t row0,
                                     tdm_verdict *v, tdm_err *err);

#endif
