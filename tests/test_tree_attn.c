/* test_tree_attn.c - token-tree attention on the CPU (every SIMD level, every
 * cache type) against a dense masked softmax (tree_testutil.h) on random trees:
 * node i at slot prefix + i, position prefix + depth, seeing the prefix and its
 * ancestors through its tree mask; several sequences' trees in one batch beside
 * plain rows; and the checks that refuse malformed tree rows. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend_testutil.h"
#include "ref_ops.h"
#include "testutil.h"
#include "tree_testutil.h"

typedef struct tree_case {
    int32_t n_head, n_kv_head, head_dim, block_size;
    uint32_t cache_type;
    int32_t n_seq;
    int32_t prefix[3], nodes[3]; /* per sequence: committed prefix, tree nodes */
} tree_case;

typedef struct tree_fix {
    tdm_kv_seq seqs[3];
    const tdm_kv_seq *sp[3];
    void *kc, *vc;
    tdm_batch bt;
    float *q;
    int32_t q_stride;
} tree_fix;

/* Caches holding random K/V at every slot of every sequence (ref_kv_write), and a
 * batch of each sequence's root row (the last prefix token) and its tree's rows. */
static void fix_init(tree_fix *f, const tree_case *tc, uint64_t *rng) {
    memset(f, 0, sizeof *f);
    int32_t lens[3];
    for (int s = 0; s < tc->n_seq; s++) lens[s] = tc->prefix[s] + tc->nodes[s];
    const int32_t nb = tdm_test_shuffled_seqs(rng, tc->n_seq, lens, tc->block_size, 2, f->seqs, f->sp);
    const size_t bytes = (size_t)nb * tc->n_kv_head * (size_t)tdm_kv_unit_bytes(tc->cache_type, tc->block_size, tc->head_dim);
    f->kc = calloc(1, bytes), f->vc = calloc(1, bytes);
    const int32_t kvd = tc->n_kv_head * tc->head_dim;
    for (int s = 0; s < tc->n_seq; s++) {
        tdm_batch w;
        cr_assert_eq(tdm_batch_init(&w, lens[s], NULL), TANDEM_OK);
        for (int32_t i = 0; i < lens[s]; i++) tdm_batch_add(&w, 0, i, s, i, false);
        float *k = tdm_test_rand_vec(rng, (size_t)lens[s] * kvd, -1, 1), *v = tdm_test_rand_vec(rng, (size_t)lens[s] * kvd, -1, 1);
        tdm_kv_write_args a = {&w, f->sp, k, v, kvd, f->kc, f->vc, tc->cache_type, tc->n_kv_head, tc->head_dim,
                               tc->block_size};
        ref_kv_write(&a);
        free(k), free(v);
        tdm_batch_free(&w);
    }
    cr_assert_eq(tdm_batch_init(&f->bt, 3 * (TDM_TREE_MAX_NODES + 1), NULL), TANDEM_OK);
    for (int s = 0; s < tc->n_seq; s++) {
        const int32_t P = tc->prefix[s], N = tc->nodes[s];
        int32_t parent[TDM_TREE_MAX_NODES], depth[TDM_TREE_MAX_NODES];
        uint64_t mask[TDM_TREE_MAX_NODES];
        tdm_test_random_tree(rng, N, parent, depth, mask);
        if (P > 0) tdm_batch_add(&f->bt, 0, P - 1, s, P - 1, true);
        for (int32_t i = 0; i < N; i++)
            cr_assert_geq(tdm_batch_add_tree(&f->bt, 0, P + depth[i], s, P + i, P, mask[i], true), 0);
    }
    f->q_stride = tc->n_head * tc->head_dim + 5;
    f->q = tdm_test_rand_vec(rng, (size_t)f->bt.n_rows * f->q_stride, -1.5f, 1.5f);
}

static void fix_free(tree_fix *f, int n_seq) {
    for (int s = 0; s < n_seq; s++) free(f->seqs[s].blocks);
    free(f->kc), free(f->vc), free(f->q);
    tdm_batch_free(&f->bt);
}

static tdm_attn_args fix_args(const tree_fix *f, const tree_case *tc, float *out) {
    return (tdm_attn_args){&f->bt, f->sp, f->q, f->q_stride, out, f->kc, f->vc, tc->cache_type, tc->n_head,
                           tc->n_kv_head, tc->head_dim, tc->block_size, 1.0f / sqrtf((float)tc->head_dim), 0, 0};
}

static void run_case(const tree_case *tc, uint64_t seed) {
    uint64_t rng = seed;
    tree_fix f;
    fix_init(&f, tc, &rng);
    const size_t n_out = (size_t)f.bt.n_rows * tc->n_head * tc->head_dim;
    float *ref = calloc(n_out, 4), *out = calloc(n_out, 4), *out3 = calloc(n_out, 4);
    tdm_attn_args a = fix_args(&f, tc, ref);
    ref_tree_attention(&a);
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int nl = tdm_test_levels(lv);
    for (int l = 0; l < nl; l++) {
        for (int nt = 1; nt <= 3; nt += 2) {
            tdm_backend *b = tdm_test_backend(lv[l], nt);
            a.out = nt == 1 ? out : out3;
            tdm_err err = {0};
            cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_OK, "%s", err.msg);
            tdm_backend_destroy(b);
        }
        const double e = ref_nrm_err(out, ref, n_out);
        cr_assert(e < 1e-5, "tree attention level %d, heads %d/%d, hd %d, %s, %d seqs: normalised error %g", lv[l],
                  tc->n_head, tc->n_kv_head, tc->head_dim, tdm_dtype_name(tc->cache_type), tc->n_seq, e);
        cr_assert(memcmp(out, out3, n_out * 4) == 0, "tree attention: 1 vs 3 threads differ");
    }
    free(ref), free(out), free(out3);
    fix_free(&f, tc->n_seq);
}

Test(tree_attn, one_tree_f32) {
    for (uint64_t seed = 1; seed <= 4; seed++) {
        tree_case tc = {4, 4, 64, 16, TDM_F32, 1, {37}, {(int32_t)(seed * 16)}};
        run_case(&tc, seed);
    }
}

Test(tree_attn, gqa_f16_three_trees) {
    tree_case tc = {8, 2, 64, 16, TDM_F16, 3, {50, 1, 23}, {64, 9, 32}};
    run_case(&tc, 7);
}

Test(tree_attn, q8_0_and_small_blocks) {
    tree_case tc = {6, 3, 32, 8, TDM_Q8_0, 2, {17, 4}, {40, 64}};
    run_case(&tc, 11);
    tree_case t2 = {4, 1, 128, 16, TDM_F16, 1, {0}, {20}}; /* no prefix: the tree alone */
    run_case(&t2, 12);
}

/* A row with both CSR extras and a tree mask, and a mask reaching past the
 * sequence's reserved slots, are refused with a message. */
Test(tree_attn, malformed_rows_refused) {
    uint64_t rng = 3;
    tree_case tc = {2, 2, 16, 16, TDM_F32, 1, {10}, {5}};
    tree_fix f;
    fix_init(&f, &tc, &rng);
    float *out = calloc((size_t)f.bt.n_rows * 2 * 16, 4);
    tdm_attn_args a = fix_args(&f, &tc, out);
    tdm_backend *b = tdm_test_backend(TDM_CPU_SCALAR, 1);
    tdm_err err = {0};
    const uint64_t keep = f.bt.tree_mask[1];
    f.bt.tree_mask[1] = 1ull << 20; /* slot 30 of a sequence of 15 */
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "tree slot"), "%s", err.msg);
    f.bt.tree_mask[1] = keep;
    int32_t off[8] = {0, 1, 1, 1, 1, 1, 1, 1}, slot[1] = {3};
    f.bt.extra_off = off, f.bt.extra_slot = slot;
    off[1] = 0, off[2] = 1; /* row 1 (a tree row) gets an extra slot too */
    for (int i = 3; i < 8; i++) off[i] = 1;
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "both"), "%s", err.msg);
    f.bt.extra_off = NULL, f.bt.extra_slot = NULL;
    tdm_backend_destroy(b);
    free(out);
    fix_free(&f, tc.n_seq);
}
