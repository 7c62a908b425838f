/* test_ngram.c - n-gram lookup proposals (draft/ngram.c) against a brute-force
 * definition, and the hand-checked cases behind it. */
#include <criterion/criterion.h>
#include <string.h>

#include "ngram.h"
#include "testutil.h"

/* The definition: for n = n_max .. TDM_NGRAM_MIN, the largest j < len - n with
 * toks[j, j + n) == toks[len - n, len); propose toks[j + n, ...) up to max_out. */
static int32_t ref_propose(const int32_t *t, int32_t len, int32_t n_max, int32_t max_out, int32_t *out) {
    if (n_max > TDM_NGRAM_MAX) n_max = TDM_NGRAM_MAX;
    for (int32_t n = n_max; n >= TDM_NGRAM_MIN; n--)
        for (int32_t j = len - n - 1; j >= 0; j--) {
            if (memcmp(t + j, t + len - n, (size_t)n * sizeof *t) != 0) continue;
            int32_t c = 0;
            while (c < max_out && j + n + c < len) {
                out[c] = t[j + n + c];
                c++;
            }
            return c;
        }
    return 0;
}

Test(ngram, hand_cases) {
    int32_t out[8];
    /* "a b c d a b" -> after "a b" came "c d a b" */
    const int32_t t1[] = {1, 2, 3, 4, 1, 2};
    cr_assert_eq(tdm_ngram_propose(t1, 6, 3, 8, out), 4);
    cr_assert(out[0] == 3 && out[1] == 4 && out[2] == 1 && out[3] == 2);
    cr_assert_eq(tdm_ngram_propose(t1, 6, 3, 2, out), 2, "max_out caps the proposal");
    /* the most recent occurrence wins: "x y 5 ... x y 6 ... x y" proposes 6 */
    const int32_t t2[] = {7, 8, 5, 9, 7, 8, 6, 9, 7, 8};
    cr_assert_eq(tdm_ngram_propose(t2, 10, 2, 1, out), 1);
    cr_assert_eq(out[0], 6);
    /* the longest n-gram wins over a more recent shorter one: key "3 7 8" */
    const int32_t t3[] = {3, 7, 8, 1, 4, 7, 8, 2, 3, 7, 8};
    cr_assert_eq(tdm_ngram_propose(t3, 11, 3, 1, out), 1);
    cr_assert_eq(out[0], 1, "3-gram match (followed by 1) must win over the 2-gram one (followed by 2)");
    cr_assert_eq(tdm_ngram_propose(t3, 11, 2, 1, out), 1);
    cr_assert_eq(out[0], 2, "with n_max 2 the most recent 2-gram wins");
    /* a run of one token: the overlapping match proposes more of it */
    const int32_t t4[] = {5, 5, 5, 5};
    cr_assert_eq(tdm_ngram_propose(t4, 4, 2, 8, out), 1);
    cr_assert_eq(out[0], 5);
    /* no match, too short, off */
    const int32_t t5[] = {1, 2, 3, 4, 5};
    cr_assert_eq(tdm_ngram_propose(t5, 5, 3, 8, out), 0);
    cr_assert_eq(tdm_ngram_propose(t1, 2, 3, 8, out), 0);
    cr_assert_eq(tdm_ngram_propose(t1, 6, 1, 8, out), 0, "n_max below the minimum n-gram means off");
    cr_assert_eq(tdm_ngram_propose(t1, 6, 3, 0, out), 0);
    cr_assert_eq(tdm_ngram_propose(NULL, 6, 3, 8, out), 0);
}

Test(ngram, matches_definition_on_random_sequences) {
    uint64_t st = 5;
    int32_t t[200], a[16], b[16];
    for (int it = 0; it < 20000; it++) {
        int32_t len = (int32_t)(tdm_test_rand(&st) % 200);
        int32_t alphabet = 2 + (int32_t)(tdm_test_rand(&st) % 6); /* small: many repeats */
        for (int32_t i = 0; i < len; i++) t[i] = (int32_t)(tdm_test_rand(&st) % (uint64_t)alphabet);
        int32_t n_max = (int32_t)(tdm_test_rand(&st) % 10), max_out = (int32_t)(tdm_test_rand(&st) % 17);
        int32_t na = tdm_ngram_propose(t, len, n_max, max_out, a), nb = ref_propose(t, len, n_max, max_out, b);
        cr_assert_eq(na, nb, "iteration %d: %d vs %d proposed (len %d, n_max %d, max %d)", it, na, nb, len, n_max,
                     max_out);
        cr_assert(memcmp(a, b, (size_t)na * sizeof *a) == 0, "iteration %d: proposals differ", it);
    }
}
