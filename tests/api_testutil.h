/* api_testutil.h - helpers shared by the public-API tests (test_api.c, test_api_generate.c). */
#ifndef TDM_API_TESTUTIL_H
#define TDM_API_TESTUTIL_H

#include "tandem.h"

/* Model files under models/ (see tdm_test_model_path). */
#define TARGET "pycode-target-f16.gguf"
#define DRAFT "pycode-draft-xs-f16.gguf"

/* Opens a model file under models/ with default params; fails the test on an error. */
tandem_model *api_open_model(const char *file);

/* Opens an engine for target t and draft d (NULL: target only) with params p, or, when p is NULL,
 * the defaults with 2 threads; fails the test on an error. */
tandem_engine *api_open_engine(tandem_model *t, tandem_model *d, const tandem_engine_params *p);

/* Runs req[0..n) one by one on a target-only engine of t (2 threads) and together on
 * a speculating engine of t and d of four sequences (batch invariant): each request's
 * batched output must be its solo one (fails the test otherwise). */
void api_expect_batch_equals_solo(tandem_model *t, tandem_model *d, tandem_request *req, int n);

/* Sampled outputs of 3 tokens (ignore_eos) of ids[0..n) on e under gp, runs of them
 * with the seeds seed0 + r: first[e->n_vocab] += the counts of their first tokens,
 * *best = the likeliest first, second[] += the counts of the second tokens after it
 * (the chi-square tests of sampling under a grammar or penalties).  Returns the
 * tokens the draft proposed. */
typedef struct tdm_engine tdm_engine;
uint64_t api_first_two_tokens(tdm_engine *e, const int32_t *ids, int32_t n, const tandem_generate_params *gp, int runs,
                              uint64_t seed0, uint64_t *first, uint64_t *second, int32_t *best);
/* One request of gp (max_tokens 3, as api_first_two_tokens runs them) on e verifies
 * at least one token tree (a chi-square test's verdicts were a tree's). */
void api_expect_tree_steps(tdm_engine *e, const int32_t *ids, int32_t n, const tandem_generate_params *gp);

#endif
