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

static void run_case(const tdm_tree_case *tc, uint64_t seed) {
    uint64_t rng = seed;
    tdm_tree_fix f;
    tdm_test_tree_fix_init(&f, tc, &rng);
    const size_t n_out = (size_t)f.bt.n_rows * tc->n_head * tc->head_dim;
    float *ref = calloc(n_out, 4), *out = calloc(n_out, 4), *out3 = calloc(n_out, 4);
    tdm_attn_args a = tdm_test_tree_fix_args(&f, tc, ref);
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
    tdm_test_tree_fix_free(&f, tc->n_seq);
}

Test(tree_attn, one_tree_f32) {
    for (uint64_t seed = 1; seed <= 4; seed++) {
        tdm_tree_case tc = {4, 4, 64, 16, TDM_F32, 1, {37}, {(int32_t)(seed * 16)}};
        run_case(&tc, seed);
    }
}

Test(tree_attn, gqa_f16_three_trees) {
    tdm_tree_case tc = {8, 2, 64, 16, TDM_F16, 3, {50, 1, 23}, {64, 9, 32}};
    run_case(&tc, 7);
}

Test(tree_attn, q8_0_and_small_blocks) {
    tdm_tree_case tc = {6, 3, 32, 8, TDM_Q8_0, 2, {17, 4}, {40, 64}};
    run_case(&tc, 11);
    tdm_tree_case t2 = {4, 1, 128, 16, TDM_F16, 1, {0}, {20}}; /* no prefix: the tree alone */
    run_case(&t2, 12);
}

/* A row with both CSR extras and a tree mask, and a mask reaching past the
 * sequence's reserved slots, are refused with a message. */
Test(tree_attn, malformed_rows_refused) {
    uint64_t rng = 3;
    tdm_tree_case tc = {2, 2, 16, 16, TDM_F32, 1, {10}, {5}};
    tdm_tree_fix f;
    tdm_test_tree_fix_init(&f, &tc, &rng);
    float *out = calloc((size_t)f.bt.n_rows * 2 * 16, 4);
    tdm_attn_args a = tdm_test_tree_fix_args(&f, &tc, out);
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
    tdm_test_tree_fix_free(&f, tc.n_seq);
}
