/* concurrency_cases.h - the engine driven from many threads (concurrency_cases.c):
 * plain C cases shared by the Criterion suite (test_concurrency.c) and the
 * ThreadSanitizer driver (tsan_concurrency.c). */
#ifndef TDM_CONCURRENCY_CASES_H
#define TDM_CONCURRENCY_CASES_H

#include <stdbool.h>
#include <stddef.h>

/* A case: true when it passed; else false with why[0..cap) naming the failure.
 * models: the folder holding the pycode models. */
typedef bool (*cc_case_fn)(const char *models, char *why, size_t cap);

typedef struct cc_case {
    const char *name;
    cc_case_fn run;
} cc_case;

/* The cases, NULL-terminated. */
extern const cc_case cc_cases[];

#endif
