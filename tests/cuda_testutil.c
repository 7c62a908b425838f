/* cuda_testutil.c - see cuda_testutil.h. */
#include "cuda_testutil.h"

#include "testutil.h"

#include <stdio.h>
#include <math.h>
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

void tdm_cu_rig_open(tdm_cu_rig *r, tdm_backend *be, const char *path, int32_t n_blocks) {
    tdm_cu_rig_open_kv(r, be, path, n_blocks, TDM_F16);
}

void tdm_cu_test_poison(tdm_backend *b, void *dev, size_t floats) {
    float *h = malloc(floats * sizeof(float));
    for (size_t i = 0; i < floats; i++) h[i] = NAN;
    tdm_err err = {0};
    cr_assert_eq(b->ops->upload(b, dev, h, floats * sizeof(float), &err), TANDEM_OK, "%s", err.msg);
    free(h);
}

void tdm_cu_rig_open_kv(tdm_cu_rig *r, tdm_backend *be, const char *path, int32_t n_blocks, uint32_t kv_type) {
    memset(r, 0, sizeof *r);
    r->be = be;
    tdm_err err = {0};
    cr_assert_eq(tdm_model_load(path, be, &r->m, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_kv_store_init(&r->kv, r->m, be, kv_type, n_blocks, 16, &err), TANDEM_OK, "%s", err.msg);
    r->seq = (tdm_kv_seq){calloc((size_t)n_blocks, 4), n_blocks, n_blocks, n_blocks * 16};
    for (int32_t i = 0; i < n_blocks; i++) r->seq.blocks[i] = n_blocks - 1 - i; /* (not in order) */
    cr_assert_eq(be->ops->alloc(be, (size_t)64 * r->m->hp.n_vocab * 4, (void **)&r->logits, &err), TANDEM_OK, "%s",
                 err.msg);
}

float *tdm_cu_rig_forward(tdm_cu_rig *r, const tdm_batch *bt, bool by_ops) {
    const tdm_kv_seq *sp[1] = {&r->seq};
    tdm_err err = {0};
    r->fs.blocks_declined = by_ops; /* (forward.c runs the ops when the blocks op declined) */
    cr_assert_eq(tdm_model_forward(r->m, r->be, &r->kv, bt, sp, &r->fs, r->logits, &err), TANDEM_OK, "%s", err.msg);
    const size_t bytes = (size_t)tdm_batch_n_logits(bt) * r->m->hp.n_vocab * 4;
    if (r->be->host_memory) {
        float *h = malloc(bytes);
        memcpy(h, r->logits, bytes);
        return h;
    }
    return tdm_cu_test_get(r->be, r->logits, bytes);
}

void tdm_cu_rig_close(tdm_cu_rig *r) {
    r->be->ops->free(r->be, r->logits);
    tdm_fwd_scratch_free(&r->fs);
    tdm_kv_store_free(&r->kv);
    tdm_model_free(r->m);
    free(r->seq.blocks);
    tdm_backend_destroy(r->be);
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
    return tdm_test_run_all(argc, argv);
}
