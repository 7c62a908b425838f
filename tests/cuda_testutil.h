/* cuda_testutil.h - shared helpers of the CUDA backend tests (test_backend_cuda.c,
 * test_cuda_kernels.c): the backend under test, device copies, and the entry point
 * that reports the program skipped (exit 77) where no CUDA device can be used. */
#ifndef TDM_CUDA_TESTUTIL_H
#define TDM_CUDA_TESTUTIL_H

#include <criterion/criterion.h>

#include "backend.h"

/* The CUDA backend on device 0 (a test built with TDM_TEST_CUDA_ON_CPU: the CPU
 * backend, to debug the tests' own code). */
tdm_backend *tdm_cu_test_gpu(void);
/* A zeroed device buffer of n bytes holding a copy of host (when not NULL). */
void *tdm_cu_test_put(tdm_backend *b, const void *host, size_t n);
/* A malloc'd host copy of n bytes of device memory. */
void *tdm_cu_test_get(tdm_backend *b, const void *dev, size_t n);
/* A device copy of a host weight (same type, shape and layout). */
tdm_weight tdm_cu_test_put_weight(tdm_backend *b, const tdm_weight *w);
/* Runs the Criterion tests, or prints why not and returns 77 without a device. */
int tdm_cu_test_main(int argc, char *argv[]);

/* Asserts that an op call returns TANDEM_OK; the call may name err_ for its error. */
#define OK(call)                                                                        \
    do {                                                                                \
        tdm_err err_ = {0};                                                             \
        tandem_status st_ = (call);                                                     \
        cr_assert_eq(st_, TANDEM_OK, "%s: %s", #call, err_.msg);                        \
    } while (0)

#endif
