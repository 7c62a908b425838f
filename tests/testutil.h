/* testutil.h - shared helpers for the Criterion tests. */
#ifndef TDM_TESTUTIL_H
#define TDM_TESTUTIL_H

#include "common.h"
#include "json.h"
#include "tandem.h"

/* TDM_TEST_SANITIZED (1 in a sanitizer build, set by tests/meson.build): the long
 * end-to-end tests check the same things on a subset of their inputs there (fewer
 * prompts, fewer speculation lengths, fewer statistical draws), where memory and
 * undefined-behaviour errors are what the build looks for; the release build runs
 * every input.  tdm_test_sanitized() is that flag as a value. */
#ifndef TDM_TEST_SANITIZED
#define TDM_TEST_SANITIZED 0
#endif
static inline bool tdm_test_sanitized(void) { return TDM_TEST_SANITIZED != 0; }

/* Paths under tests/data and models/ (compiled in as TDM_TEST_DATA / TDM_MODELS). */
const char *tdm_test_data_path(const char *name);  /* static buffer, rotating (4 slots) */
const char *tdm_test_model_path(const char *name);

/* Runs the program's Criterion tests as Criterion's own main would (for tests with a
 * main of their own, which first decide whether to skip: exit 77). */
int tdm_test_run_all(int argc, char *argv[]);

/* Parses a JSON-lines file: one tdm_json per non-empty line.  Fails the test on error.
 * Free with tdm_test_jsonl_free. */
tdm_json **tdm_test_jsonl(const char *path, size_t *n);
void tdm_test_jsonl_free(tdm_json **items, size_t n);

/* Reads an array of integers from a JSON array (fails the test on a bad element). */
int32_t *tdm_test_json_ids(const tdm_json *arr, size_t *n);

/* Deterministic pseudo-random numbers for tests (splitmix64). */
uint64_t tdm_test_rand(uint64_t *state);
float tdm_test_randf(uint64_t *state, float lo, float hi);
double tdm_test_randu(uint64_t *state); /* [0, 1), 53 random bits */

/* A token callback for tandem_generate_params.on_token that stops generation at the
 * limit-th token: user_data points to a tdm_test_stop {count, limit}. */
typedef struct tdm_test_stop {
    int count, limit;
} tdm_test_stop;
bool tdm_test_stop_cb(int32_t token, const char *text, size_t len, void *user_data);

/* counts[pos][token] += the tokens at positions 0..n_pos-1 of n_runs sampled
 * continuations of prompt on engine e (seeds seed0, seed0 + 1, ...; base's other
 * parameters, max_tokens = n_pos); when agg is not NULL, the runs' speculation counts
 * (drafted, accepted, n-gram steps / drafted / accepted) are added to it.  The
 * statistical losslessness tests draw their samples with it. */
typedef struct tdm_engine tdm_engine;
void tdm_test_sample_counts(tdm_engine *e, const tandem_generate_params *base, const int32_t *prompt,
                            int32_t n_prompt, uint64_t seed0, int n_runs, int n_pos, int32_t V, uint64_t *counts,
                            tandem_spec_stats *agg);

/* An engine of target and draft (NULL: target-only) with n_threads CPU threads and
 * the other settings at their defaults (fails the test otherwise). */
typedef struct tdm_model tdm_model;
tdm_engine *tdm_test_engine(tdm_model *target, tdm_model *draft, int32_t n_threads);

/* The pycode target and draft_file (under models/) loaded on a new CPU backend of one
 * thread (fails the test otherwise); tdm_test_pair_free frees all three. */
typedef struct tdm_backend tdm_backend;
void tdm_test_pair_load(const char *draft_file, tdm_backend **wbe, tdm_model **target, tdm_model **draft);
void tdm_test_pair_free(tdm_backend *wbe, tdm_model *target, tdm_model *draft);

/* After a decode step of s (not done): the target holds the n - 1 positions before
 * the pending token, the draft at most as many, the block table exactly n - 1 and
 * the pool exactly the blocks for them (s alone on e). */
typedef struct tdm_seq tdm_seq;
void tdm_test_check_held(const tdm_engine *e, const tdm_seq *s);
/* Runs a request of ids on e (alone) step by step, checking tdm_test_check_held and
 * the pool's invariants after every step and that nothing leaks after release;
 * returns its steps and fills *spec (may be NULL) with its statistics. */
int tdm_test_run_checked(tdm_engine *e, const int32_t *ids, size_t n, const tandem_generate_params *gp,
                         tandem_spec_stats *spec);

#endif
