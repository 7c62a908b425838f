/* tree_verify.h - verification of a drafted token tree and its commit
 * (tree_verify.c). */
#ifndef TDM_TREE_VERIFY_H
#define TDM_TREE_VERIFY_H

#include "engine.h"
#include "tree.h"

/* Adds the rows of s's tree to the batch (sequence index si): the last committed
 * token at slot n - 1 (a causal row), then node i at slot n + i, position n +
 * depth, seeing [0, n) and its ancestors.  False when the batch is full. */
bool tdm_tree_rows(tdm_batch *b, const tdm_seq *s, const tdm_tree *t, int32_t si);

/* Verifies s's tree with one target forward and commits the result: greedy by
 * matching the target's argmaxes; sampled by multi-candidate rejection sampling
 * (tree_accept.h; children drawn without replacement, the draft's q rows in
 * e->tree_q).  *n_accepted: the accepted path's length; path[0..*n_accepted)
 * (TDM_TREE_MAX entries): its nodes, root side first. */
tandem_status tdm_verify_tree(tdm_engine *e, tdm_seq *s, const tdm_tree *t, int32_t *n_accepted, int32_t *path,
                              tdm_err *err);

/* The commit after a verdict: path[0..m) (accepted nodes, root side first) and
 * next.  Both models' K/V of the path move to consecutive slots n .. n + m - 1 (the
 * draft's as far as it saw the path), one truncate to n + m rolls everything else
 * back, and the path's tokens and next are committed (as far as the request takes
 * them). */
tandem_status tdm_tree_keep(tdm_engine *e, tdm_seq *s, const tdm_tree *t, const int32_t *path, int32_t m, int32_t next,
                            tdm_err *err);

#endif
