/* api_testutil.c - helpers shared by the public-API tests (see api_testutil.h). */
#include "api_testutil.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "scheduler.h"
#include "testutil.h"

tandem_model *api_open_model(const char *file) {
    tandem_model *m = NULL;
    tandem_status st = tandem_model_open(tdm_test_model_path(file), NULL, &m);
    cr_assert_eq(st, TANDEM_OK, "%s: %s", file, tandem_last_error());
    cr_assert(m);
    return m;
}

tandem_engine *api_open_engine(tandem_model *t, tandem_model *d, const tandem_engine_params *p) {
    tandem_engine_params def = tandem_engine_default_params();
    def.n_threads = 2;
    tandem_engine *e = NULL;
    tandem_status st = tandem_engine_open(t, d, p ? p : &def, &e);
    cr_assert_eq(st, TANDEM_OK, "engine: %s", tandem_last_error());
    cr_assert(e);
    return e;
}

void api_expect_batch_equals_solo(tandem_model *t, tandem_model *d, tandem_request *req, int n) {
    tandem_engine *plain = api_open_engine(t, NULL, NULL);
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    ep.n_seq_max = 4;
    ep.batch_invariant = true;
    tandem_engine *batch = api_open_engine(t, d, &ep);
    tandem_result *want = calloc((size_t)n, sizeof *want), *got = calloc((size_t)n, sizeof *got);
    cr_assert(want && got);
    for (int i = 0; i < n; i++)
        cr_assert_eq(tandem_generate(plain, req[i].prompt, &req[i].params, &want[i]), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tandem_generate_batch(batch, req, (size_t)n, got), TANDEM_OK, "%s", tandem_last_error());
    for (int i = 0; i < n; i++) {
        cr_assert_eq(got[i].status, TANDEM_OK, "request %d: %s", i, got[i].error ? got[i].error : "");
        cr_assert_eq(got[i].n_tokens, want[i].n_tokens, "request %d: %zu tokens, solo %zu", i, got[i].n_tokens,
                     want[i].n_tokens);
        cr_assert_eq(memcmp(got[i].tokens, want[i].tokens, got[i].n_tokens * sizeof(int32_t)), 0,
                     "request %d differs from its solo output", i);
        cr_assert_str_eq(got[i].text, want[i].text);
        tandem_result_free(&got[i]);
        tandem_result_free(&want[i]);
    }
    free(want);
    free(got);
    tandem_engine_close(batch);
    tandem_engine_close(plain);
}

uint64_t api_first_two_tokens(tdm_engine *e, const int32_t *ids, int32_t n, const tandem_generate_params *gp, int runs,
                              uint64_t seed0, uint64_t *first, uint64_t *second, int32_t *best) {
    const int32_t V = e->n_vocab;
    int32_t *pairs = malloc((size_t)runs * 2 * sizeof(int32_t));
    cr_assert(pairs);
    tandem_generate_params p = *gp;
    p.max_tokens = 3;
    p.ignore_eos = true;
    uint64_t drafted = 0;
    tdm_err err = {0};
    for (int r = 0; r < runs; r++) {
        p.seed = seed0 + (uint64_t)r;
        tandem_result res;
        cr_assert_eq(tdm_generate_one(e, ids, n, &p, &res, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(res.n_tokens, 3);
        first[res.tokens[0]]++;
        pairs[2 * r] = res.tokens[0], pairs[2 * r + 1] = res.tokens[1];
        drafted += res.spec.drafted;
        tandem_result_free(&res);
    }
    *best = 0;
    for (int32_t i = 0; i < V; i++)
        if (first[i] > first[*best]) *best = i;
    for (int r = 0; r < runs; r++)
        if (pairs[2 * r] == *best) second[pairs[2 * r + 1]]++;
    free(pairs);
    return drafted;
}

void api_expect_tree_steps(tdm_engine *e, const int32_t *ids, int32_t n, const tandem_generate_params *gp) {
    tandem_generate_params one = *gp;
    one.max_tokens = 3;
    one.ignore_eos = true;
    tandem_result r;
    tdm_err err = {0};
    cr_assert_eq(tdm_generate_one(e, ids, n, &one, &r, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_gt(r.spec.tree_steps, 0, "no tree was verified");
    tandem_result_free(&r);
}
