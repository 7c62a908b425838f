/* tsan_concurrency.c - the concurrency cases (concurrency_cases.c) as a plain program,
 * for the ThreadSanitizer build (Criterion cannot start under ThreadSanitizer).
 *   tsan_concurrency MODELS_DIR [CASE]
 * Runs every case (or the one named), prints one line each and closes with
 * "concurrency: N passed, N failed"; exits 1 on a failure.  ThreadSanitizer itself
 * exits non-zero on a report (halt_on_error=1 in scripts/test.sh). */
#include <stdio.h>
#include <string.h>

#include "concurrency_cases.h"

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s MODELS_DIR [CASE]\n", argv[0]);
        return 2;
    }
    int passed = 0, failed = 0;
    for (const cc_case *c = cc_cases; c->name; c++) {
        if (argc == 3 && strcmp(argv[2], c->name) != 0) continue;
        char why[512] = "";
        const bool ok = c->run(argv[1], why, sizeof why);
        printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", c->name, ok ? "" : ": ", why);
        fflush(stdout);
        ok ? passed++ : failed++;
    }
    printf("concurrency: %d passed, %d failed\n", passed, failed);
    return failed || passed == 0 ? 1 : 0;
}
