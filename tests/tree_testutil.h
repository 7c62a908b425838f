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

/* A tree-attention case: up to three sequences, each a committed prefix and a
 * random tree after it. */
typedef struct tdm_tree_case {
    int32_t n_head, n_kv_head, head_dim, block_size;
    uint32_t cache_type;
    int32_t n_seq;
    int32_t prefix[3], nodes[3]; /* per sequence: committed prefix, tree nodes */
} tdm_tree_case;

/* Host caches holding random K/V at every slot of every sequence (ref_kv_write,
 * over shuffled block tables), and a batch of each sequence's root row (the last
 * prefix token, a causal row) and its tree's rows; q random. */
typedef struct tdm_tree_fix {
    tdm_kv_seq seqs[3];
    const tdm_kv_seq *sp[3];
    void *kc, *vc;        /* host caches */
    size_t cache_bytes;   /* of each */
    tdm_batch bt;
    float *q;             /* [bt.n_rows][q_stride] */
    int32_t q_stride;
} tdm_tree_fix;

void tdm_test_tree_fix_init(tdm_tree_fix *f, const tdm_tree_case *tc, uint64_t *rng);
void tdm_test_tree_fix_free(tdm_tree_fix *f, int n_seq);
/* Attention arguments of the fixture writing into out (scale 1 / sqrt(head_dim)). */
tdm_attn_args tdm_test_tree_fix_args(const tdm_tree_fix *f, const tdm_tree_case *tc, float *out);

/* Copies slot src of sequence s (cache ks / vs) to slot dst of sequence d (caches
 * kd / vd) byte for byte, every kv head: K, V and (q8_0) their scales, as the
 * kv_move op does. */
void tdm_test_kv_copy_slot(const void *ks, const void *vs, const tdm_kv_seq *s, int32_t src, void *kd, void *vd,
                           const tdm_kv_seq *d, int32_t dst, uint32_t type, int32_t n_kv_head, int32_t head_dim,
                           int32_t block_size);

#endif
