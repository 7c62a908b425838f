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

/* A lookup over text + tail equals the lookup over the two joined; several
 * candidates: the first is the single lookup's, none repeats the start of an
 * earlier one, each is the continuation of a match (the definition's, over all
 * matches in the same order). */
Test(ngram, after_and_multi_match_definitions) {
    uint64_t st = 11;
    int32_t t[200], a[16], b[16], cands[4 * 16], lens[4];
    for (int it = 0; it < 5000; it++) {
        const int32_t len = (int32_t)(tdm_test_rand(&st) % 200);
        const int32_t alphabet = 2 + (int32_t)(tdm_test_rand(&st) % 6);
        for (int32_t i = 0; i < len; i++) t[i] = (int32_t)(tdm_test_rand(&st) % (uint64_t)alphabet);
        const int32_t n_max = (int32_t)(tdm_test_rand(&st) % 10), max_out = 1 + (int32_t)(tdm_test_rand(&st) % 16);
        const int32_t cut = len ? (int32_t)(tdm_test_rand(&st) % (uint64_t)(len + 1)) : 0;
        int32_t na = tdm_ngram_propose_after(t, cut, t + cut, len - cut, n_max, max_out, a);
        int32_t nb = ref_propose(t, len, n_max, max_out, b);
        cr_assert_eq(na, nb, "iteration %d: after: %d vs %d", it, na, nb);
        cr_assert(memcmp(a, b, (size_t)na * sizeof *a) == 0, "iteration %d: after: proposals differ", it);
        const int32_t m = tdm_ngram_propose_multi(t, len, n_max, max_out, 4, cands, lens);
        cr_assert_eq(m > 0, nb > 0, "iteration %d", it);
        if (m > 0) {
            cr_assert_eq(lens[0], nb);
            cr_assert(memcmp(cands, b, (size_t)nb * sizeof *b) == 0, "iteration %d: the first is the lookup's", it);
        }
        for (int32_t c = 0; c < m; c++) {
            cr_assert(lens[c] >= 1 && lens[c] <= max_out);
            for (int32_t q = 0; q < c; q++) {
                const int32_t k = lens[c] < lens[q] ? lens[c] : lens[q];
                cr_assert(memcmp(cands + c * max_out, cands + q * max_out, (size_t)k * sizeof *cands) != 0,
                          "iteration %d: candidate %d repeats %d", it, c, q);
            }
            /* some match of an n-gram of the key is followed by it */
            bool found = false;
            for (int32_t n = TDM_NGRAM_MIN; n <= (n_max < TDM_NGRAM_MAX ? n_max : TDM_NGRAM_MAX) && !found; n++)
                for (int32_t j = 0; j + n < len && !found; j++)
                    found = memcmp(t + j, t + len - n, (size_t)n * sizeof *t) == 0 &&
                            (lens[c] == max_out || j + n + lens[c] == len) &&
                            memcmp(t + j + n, cands + c * max_out, (size_t)lens[c] * sizeof *t) == 0;
            cr_assert(found, "iteration %d: candidate %d follows no match", it, c);
        }
    }
    /* hand case: after "1 2" came 3 (most recent), then 4, then 3 again (a repeat) */
    const int32_t h[] = {1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2};
    cr_assert_eq(tdm_ngram_propose_multi(h, 11, 2, 1, 4, cands, lens), 2);
    cr_assert(cands[0] == 3 && cands[1] == 4);
}
