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

/* Verifies s's tree with one target forward and returns the verdict: greedy by
 * matching the target's argmaxes; sampled by multi-candidate rejection sampling
 * (tree_accept.h; children drawn without replacement, the draft's q rows in
 * ws->tree_q).  v->n_acc: the accepted path's length; v->path[0..n_acc): its nodes,
 * root side first (sched/commit.c commits it). */
tandem_status tdm_verify_tree(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, const tdm_tree *t, tdm_verdict *v, tdm_err *err);

#endif
