/* tree.h - token trees: their shape, and how one is grown from the draft's
 * distributions (tree.c) and drafted with the draft model (tree_draft.c).
 *
 * A tree hangs below the sequence's last committed token (the root, not a node).
 * Nodes are numbered in creation order, every parent before its children; node i
 * goes at KV slot n + i after the n committed tokens, at RoPE position n +
 * depth(i) (depth 0: a child of the root), and sees the committed tokens and its
 * ancestors: mask[i] has bit j set for node j = i or an ancestor of i.
 *
 * Shapes:
 *   static: branching factors per depth ("4,2,2,1": the root gets 4 children, each
 *     of them 2, ...), as Medusa / SpecInfer's fixed trees;
 *   dynamic: EAGLE-2's: every level expands the `width` nodes of the deepest level
 *     with the highest cumulative draft probability (the product of the draft's
 *     probabilities along the path) by their `topk` likeliest tokens, up to `depth`
 *     levels; a greedy tree then keeps the `budget` nodes of highest cumulative
 *     probability (ancestors first: it only falls along a path).  A sampled tree
 *     draws each node's children from the draft's distribution without replacement
 *     and is never pruned after drawing (which would bias what reaches verification):
 *     its levels stop where the budget runs out.
 */
#ifndef TDM_TREE_H
#define TDM_TREE_H

#include <stdbool.h>
#include <stdint.h>

#include "batch.h"
#include "common.h"
#include "sampling.h"

#define TDM_TREE_MAX TDM_TREE_MAX_NODES /* nodes of a tree at most (one mask word) */
#define TDM_TREE_POOL 256               /* candidate nodes a greedy dynamic tree grows before pruning */
#define TDM_TREE_SHAPE_MAX 16           /* depths of a static shape at most */
#define TDM_TREE_DEPTH_MAX 16           /* depth of any tree at most */

typedef struct tdm_tree_cfg {
    int32_t budget;                      /* nodes at most, [1, TDM_TREE_MAX] */
    int32_t n_shape;                     /* > 0: a static tree of these branching factors */
    int32_t shape[TDM_TREE_SHAPE_MAX];   /* [n_shape] children per node at each depth */
    int32_t topk, width, depth;          /* dynamic: children per expansion, expansions per
                                            level, levels */
} tdm_tree_cfg;

/* The dynamic tree of a node budget: topk 4, width 4 (EAGLE-2's), depth budget / 2
 * (2 .. TDM_TREE_DEPTH_MAX): a greedy tree grows at most 4 + 16 (depth - 1)
 * candidates and keeps the budget's best; the draft sees at most 4 (depth - 1). */
tdm_tree_cfg tdm_tree_cfg_dynamic(int32_t budget);
/* Benchmarks only (bench_spec --tree-width, --tree-branch, --tree-depth; never set by
 * the library): the dynamic trees made after it take these expansions per level
 * (width, 1..16), children per expansion (branch, 1..16) and levels (depth,
 * 2..TDM_TREE_DEPTH_MAX, at most the budget) instead of tdm_tree_cfg_dynamic's; 0
 * keeps its own.  Process-wide (atomics): set it before the engines run.  A value
 * out of range is TANDEM_ERR_INVALID_ARG naming it, and nothing is changed. */
typedef struct tdm_tree_bench_shape {
    int32_t width, branch, depth;
} tdm_tree_bench_shape;
tandem_status tdm_tree_set_bench_shape(const tdm_tree_bench_shape *s, tdm_err *err);
/* "4,2,2,1" -> a static tree (at most TDM_TREE_MAX nodes, each factor 1..16); false
 * with a message in err naming what is wrong. */
bool tdm_tree_cfg_parse_shape(const char *s, tdm_tree_cfg *out, tdm_err *err);
/* Nodes of a static shape. */
int32_t tdm_tree_shape_nodes(const int32_t *shape, int32_t n_shape);

typedef struct tdm_tree {
    int32_t n;                       /* nodes */
    int32_t token[TDM_TREE_POOL];    /* [n] its token */
    int32_t parent[TDM_TREE_POOL];   /* [n] its parent's index, -1 = the root */
    int32_t depth[TDM_TREE_POOL];    /* [n] 0 for the root's children */
    uint64_t mask[TDM_TREE_MAX];     /* [n] itself and its ancestors (bits of node indices) */
    float w[TDM_TREE_POOL];          /* [n] cumulative draft probability of its path */
    int32_t dslot[TDM_TREE_POOL];    /* [n] where the draft holds its K/V: slot n_committed +
                                        dslot; -1 = the draft never saw it */
    int32_t qrow[TDM_TREE_POOL];     /* [n] sampling: row of the draft's distribution its
                                        children were drawn from (-1: none) */
    int32_t qrow_root;               /* the same for the root's children */
    uint8_t lookup[TDM_TREE_POOL];   /* [n] 1: added by an n-gram lookup (tdm_tree_merge_chain),
                                        0: the draft model's */
    int32_t n_fed;                   /* nodes the draft saw (dslot 0 .. n_fed - 1) */
    int32_t n_spine;                 /* nodes 0 .. n_spine - 1 are the spine (tdm_tree_spine_first):
                                        node i at depth i, the first child of node i - 1; 0
                                        until it is set */
} tdm_tree;

void tdm_tree_reset(tdm_tree *t);
/* Appends a node (no mask yet); -1 when the pool is full. */
int32_t tdm_tree_add(tdm_tree *t, int32_t parent, int32_t token, float w);
/* Keeps the `budget` nodes of highest w (ties: the earlier node), which along a
 * path only falls, so that every kept node's parent is kept; renumbers them in
 * their old order and fills the masks.  Also when the tree already fits. */
void tdm_tree_prune(tdm_tree *t, int32_t budget);
/* Fills the masks (every node's index < TDM_TREE_MAX). */
void tdm_tree_masks(tdm_tree *t);
/* Moves the spine, the chain of first children from the root (a dynamic tree's
 * likeliest path), to the front: node i of it becomes node i, the other nodes follow
 * in their old order (so parents still come first and siblings keep their order),
 * sets n_spine and fills the masks.  Node i of the spine then sits at slot n + i,
 * position n + i: its verification row is a causal row, as a chain's (verify/). */
void tdm_tree_spine_first(tdm_tree *t);
/* Merges another speculator's chain of proposed tokens toks[0..n) (an n-gram
 * lookup's continuation) into the tree below node v (-1 = the root), as SpecInfer
 * merges its speculators' proposals into one token tree: the chain follows the
 * nodes already there while its tokens match and adds the rest as new nodes (dslot
 * -1, lookup 1), each with w = its parent's w (1 for the root) times a, the
 * speculator's acceptance per token in (0, 1], so that tdm_tree_prune ranks both
 * speculators' nodes alike.  It stops where the tree holds max_nodes nodes (at most
 * TDM_TREE_MAX) or a node would sit at depth max_depth or deeper.  Returns the
 * nodes added; the masks and the spine are the caller's (tdm_tree_spine_first). */
int32_t tdm_tree_merge_chain(tdm_tree *t, int32_t v, const int32_t *toks, int32_t n, float a, int32_t max_nodes,
                             int32_t max_depth);
/* How the draft model and the lookups (tdm_tree_merge_chain) share tree t and its
 * accepted path[0..m): draft_run, the path's first nodes that are the draft's;
 * lookup_acc, the path's lookup nodes; lookup_nodes, the tree's; draft_depth, the
 * levels of the draft's own nodes. */
typedef struct tdm_tree_share {
    int32_t draft_run, lookup_acc, lookup_nodes, draft_depth;
} tdm_tree_share;
tdm_tree_share tdm_tree_share_of(const tdm_tree *t, const int32_t *path, int32_t m);
/* The children of node v (-1 = the root) in order; returns their count. */
int32_t tdm_tree_children(const tdm_tree *t, int32_t v, int32_t *kids);

/* The k likeliest tokens of d[n] (ties: the lower id), written in decreasing
 * probability to ids; returns min(k, n). */
int32_t tdm_top_tokens(const float *d, int32_t n, int32_t k, int32_t *ids);
/* The same by k passes over d (the definition; tests compare the two). */
int32_t tdm_top_tokens_ref(const float *d, int32_t n, int32_t k, int32_t *ids);
/* Draws k distinct tokens from d[n] without replacement (each the next draw from d
 * with the tokens drawn so far removed, renormalised), one uniform of rng each;
 * returns how many it drew (fewer when d has fewer positive entries). */
int32_t tdm_draw_distinct(const float *d, int32_t n, int32_t k, tdm_rng *rng, int32_t *ids);

#endif
