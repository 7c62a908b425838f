/* cuda_testutil.c - see cuda_testutil.h. */
#include "cuda_testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

tdm_backend *tdm_cu_test_gpu(void) {
    tdm_backend *b = NULL;
    tdm_err err = {0};
#ifdef TDM_TEST_CUDA_ON_CPU
    cr_assert_eq(tdm_backend_cpu_create(2, &b, &err), TANDEM_OK, "%s", err.msg);
#else
    cr_assert_eq(tdm_backend_cuda_create(0, &b, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_str_eq(b->ops->name, "cuda");
#endif
    return b;
}

void *tdm_cu_test_put(tdm_backend *b, const void *host, size_t n) {
    void *d = NULL;
    tdm_err err = {0};
    cr_assert_eq(b->ops->alloc(b, n, &d, &err), TANDEM_OK, "%s", err.msg);
    if (host) cr_assert_eq(b->ops->upload(b, d, host, n, &err), TANDEM_OK, "%s", err.msg);
    return d;
}

void *tdm_cu_test_get(tdm_backend *b, const void *dev, size_t n) {
    void *h = malloc(n + 16);
    tdm_err err = {0};
    cr_assert(h);
    cr_assert_eq(b->ops->download(b, h, dev, n, &err), TANDEM_OK, "%s", err.msg);
    return h;
}

tdm_weight tdm_cu_test_put_weight(tdm_backend *b, const tdm_weight *w) {
    tdm_weight d = *w;
    d.data = tdm_cu_test_put(b, w->data, (size_t)w->rows * w->row_bytes);
    return d;
}

int tdm_cu_test_main(int argc, char *argv[]) {
#ifndef TDM_TEST_CUDA_ON_CPU /* (a debugging build: the tests' own code on the CPU backend) */
    tdm_backend *b = NULL;
    tdm_err err = {0};
    if (tdm_backend_cuda_create(0, &b, &err) != TANDEM_OK) {
        printf("skipped: %s\n", err.msg);
        return 77;
    }
    tdm_backend_destroy(b);
#endif
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}
