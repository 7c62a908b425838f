/* test_nonfinite.c - a NaN or an infinity planted in one weight (each tensor of a layer,
 * the output norm, the output head, tied or not; f32 and q8_0 matrices) is a model
 * error naming the model at every CPU SIMD level (tdm_cpu_cap_level): greedy and sampled,
 * target only and speculative (chains and trees), in the target and in the draft.
 * It never becomes text.  (tests/nonfinite_testutil.c has the cases; the GPU runs them
 * in test_backend_cuda.c.) */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "cpu_internal.h"
#include "nonfinite_testutil.h"

/* Every case at the given level (skipped above the CPU's). */
static void check_level(const char *level, tdm_cpu_level lv) {
    if (tdm_cpu_best_level() < lv) cr_skip_test("this CPU has no %s", level);
    tdm_cpu_cap_level(lv);
    cr_assert_str_eq(tdm_cpu_features(), level);
    tdm_nf_check_all(level, NULL, 0, 4);
    tdm_cpu_cap_level(TDM_CPU_N_LEVELS);
}

Test(nonfinite, scalar, .timeout = 120) { check_level("scalar", TDM_CPU_SCALAR); }
Test(nonfinite, avx2, .timeout = 120) { check_level("avx2", TDM_CPU_AVX2); }
Test(nonfinite, avx512, .timeout = 120) { check_level("avx512", TDM_CPU_AVX512); }
