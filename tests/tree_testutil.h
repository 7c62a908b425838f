/* tree_testutil.h - random token trees and a dense reference of tree attention,
 * for the tree tests (test_tree_attn.c, test_cuda_kernels.c). */
#ifndef TDM_TREE_TESTUTIL_H
#define TDM_TREE_TESTUTIL_H

#include "backend.h"

/* A random tree of n <= TDM_TREE_MAX_NODES nodes in parent-before-child order:
 * parent[i] < i (-1: a child of the root, the last committed token), depth[i]
 * (0 for the root's children), mask[i] = node i and its ancestors. */
void tdm_test_random_tree(uint64_t *rng, int32_t n, int32_t *parent, int32_t *depth, uint64_t *mask);

/* Attention of a's rows as a dense masked softmax in double: for every slot j of
 * the row's sequence below its len, visible when j < n_visible, or a tree mask's
 * bit j - n_visible is set, or j is one of its CSR extras; scores of the others
 * are -inf. */
void ref_tree_attention(const tdm_attn_args *a);

#endif
