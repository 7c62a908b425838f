/* cuda_testutil.h - shared helpers of the CUDA backend tests (test_backend_cuda.c,
 * test_cuda_kernels.c): the backend under test, device copies, and the entry point
 * that reports the program skipped (exit 77) where no CUDA device can be used. */
#ifndef TDM_CUDA_TESTUTIL_H
#define TDM_CUDA_TESTUTIL_H

#include <criterion/criterion.h>

#include "backend.h"
#include "model.h"

/* The CUDA backend on device 0 (a test built with TDM_TEST_CUDA_ON_CPU: the CPU
 * backend, to debug the tests' own code). */
tdm_backend *tdm_cu_test_gpu(void);
/* A zeroed device buffer of n bytes holding a copy of host (when not NULL). */
void *tdm_cu_test_put(tdm_backend *b, const void *host, size_t n);
/* Fills `floats` floats of device memory with NaN (an output a kernel fails to
 * write then fails the comparison). */
void tdm_cu_test_poison(tdm_backend *b, void *dev, size_t floats);
/* A malloc'd host copy of n bytes of device memory. */
void *tdm_cu_test_get(tdm_backend *b, const void *dev, size_t n);
/* A device copy of a host weight (same type, shape and layout). */
tdm_weight tdm_cu_test_put_weight(tdm_backend *b, const tdm_weight *w);
/* One model on one backend with its own K/V storage (f16, or kv_type with _kv;
 * n_blocks blocks of 16) and one sequence of n_blocks * 16 reserved positions over
 * a shuffled block table. */
typedef struct tdm_cu_rig {
    tdm_backend *be;
    struct tdm_model *m;
    tdm_kv_store kv;
    tdm_kv_seq seq;
    tdm_fwd_scratch fs;
    float *logits; /* backend memory [64][n_vocab] */
} tdm_cu_rig;
void tdm_cu_rig_open(tdm_cu_rig *r, tdm_backend *be, const char *path, int32_t n_blocks);
void tdm_cu_rig_open_kv(tdm_cu_rig *r, tdm_backend *be, const char *path, int32_t n_blocks, uint32_t kv_type);
/* A forward of bt (by_ops: the op-by-op path instead of the backend's blocks op);
 * returns a malloc'd host copy of the logits rows. */
float *tdm_cu_rig_forward(tdm_cu_rig *r, const tdm_batch *bt, bool by_ops);
void tdm_cu_rig_close(tdm_cu_rig *r); /* (destroys the backend too) */

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
