/* test_concurrency.c - the engine driven from many threads (the cases and what they
 * check: concurrency_cases.c), in the Criterion suite of the normal and
 * AddressSanitizer builds.  The ThreadSanitizer build runs the same cases through
 * tsan_concurrency.c. */
#include <criterion/criterion.h>

#include "concurrency_cases.h"
#include "testutil.h"

static void run_case(const char *name) {
    for (const cc_case *c = cc_cases; c->name; c++)
        if (!strcmp(c->name, name)) {
            char why[512] = "";
            cr_assert(c->run(TDM_MODELS, why, sizeof why), "%s: %s", name, why);
            return;
        }
    cr_assert_fail("no case %s", name);
}

Test(concurrency, stop_and_start_while_callers_wait_in_generate) {
    run_case("stop_and_start_while_callers_wait_in_generate");
}
Test(concurrency, speculating_pair_stopped_under_callers) { run_case("speculating_pair_stopped_under_callers"); }
Test(concurrency, many_callers_on_an_engine_never_started) { run_case("many_callers_on_an_engine_never_started"); }
Test(concurrency, submits_cancels_start_stop_and_steps_from_many_threads) {
    run_case("submits_cancels_start_stop_and_steps_from_many_threads");
}
Test(concurrency, callbacks_cannot_start_stop_step_or_block) { run_case("callbacks_cannot_start_stop_step_or_block"); }
