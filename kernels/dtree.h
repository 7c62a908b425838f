/* dtree.h - a greedy dynamic token tree grown where the draft's logits are (the
 * tree_grow op of kernels/backend.h), so that a tree's levels follow each other on
 * the device without the host waiting between them; the host downloads it once,
 * when it is complete (draft/tree_draft.c).
 *
 * Nodes are appended as draft/tree.c appends them (tdm_tree_add: parents first,
 * each row's children in rank order) with the same float weights, and each level's
 * expansions are picked as tree_draft.c's pick_expand picks them, so the tree equals
 * the one grown on the host from the same candidates.  Plain C: the same layout on
 * both sides.
 */
#ifndef TDM_DTREE_H
#define TDM_DTREE_H

#include <stdint.h>

#define TDM_DTREE_POOL 256  /* nodes at most (draft/tree.h's TDM_TREE_POOL) */
#define TDM_DTREE_LEVEL 64  /* expansions of one level at most */

typedef struct tdm_dtree {
    int32_t n;                          /* nodes */
    int32_t n_fed;                      /* nodes given draft slots (fed to the draft) */
    int32_t n_exp;                      /* expansions of the newest level */
    int32_t bad;                        /* 1: a logits row held a NaN or an infinity, or a
                                           level had fewer nodes than it expands */
    int32_t token[TDM_DTREE_POOL];      /* [n] */
    int32_t parent[TDM_DTREE_POOL];     /* [n] -1: the root */
    int32_t depth[TDM_DTREE_POOL];      /* [n] 0: a child of the root */
    int32_t dslot[TDM_DTREE_POOL];      /* [n] draft slot (n_committed + dslot), -1: not fed */
    float w[TDM_DTREE_POOL];            /* [n] cumulative draft probability of its path */
    int32_t exp[TDM_DTREE_LEVEL];       /* [n_exp] the newest level's expanded nodes, in
                                           creation order (the next forward's rows) */
    int32_t next_tok[TDM_DTREE_LEVEL];  /* [n_exp] their tokens (the forward's token ids) */
    uint64_t next_mask[TDM_DTREE_LEVEL];/* [n_exp] their draft masks: bit dslot of the node
                                           and of each ancestor (the forward's tree masks) */
} tdm_dtree;

#endif
