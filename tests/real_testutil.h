/* real_testutil.h - what the tests of real published models share (test_real_model.c,
 * test_real_pair.c): their reference files' lines (tests/data/real/, JSON lines, one JSON
 * object per line with a "kind"), token comparisons, and the check of a greedy
 * continuation against a float32 reference that may depart only at a near tie. */
#ifndef TDM_REAL_TESTUTIL_H
#define TDM_REAL_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "tandem.h"

/* A reference line's string member key (fails the test without one). */
const char *real_str(const tdm_json *line, const char *key);
bool real_is_kind(const tdm_json *line, const char *kind);

/* Expects got[n_got] to equal llama.cpp's want[n_want] for text, naming who (a model)
 * and the first position where they differ. */
void real_expect_ids(const int32_t *got, size_t n_got, const int32_t *want, size_t n_want, const char *who,
                     const char *text);

/* One generation line ("plain" or "chat"): its prompt ids, the reference's tokens and
 * top-two logit margins. */
typedef struct real_case {
    const char *kind;
    int32_t *prompt;
    size_t n_prompt;
    int32_t *ref;
    size_t n_ref;
    double *margin; /* [n_ref] */
} real_case;

/* The generation lines of ref[n_ref], at most cap; free with real_cases_free. */
size_t real_cases_load(tdm_json *const *ref, size_t n_ref, real_case *c, size_t cap);
void real_cases_free(real_case *c, size_t n);

/* A request of case c, greedy, as many new tokens as its reference has. */
tandem_request real_case_request(const real_case *c);

/* Checks r (case i's greedy output) against c's reference: equal, or departing at a
 * position where the reference's margin is below near_tie (logged).  Returns true when
 * equal. */
bool real_case_follows(const real_case *c, size_t i, const tandem_result *r, double near_tie);

#endif
