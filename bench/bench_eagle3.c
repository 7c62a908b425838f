/* bench_eagle3.c - the costs of EAGLE-3 drafting's parts on a chosen backend: the
 * target's decode step with and without the feature export, and an EAGLE-3 head's
 * encoder (fc over the features) and decoder forward by row count.
 *
 * Loads a target and an EAGLE-3 head (tandem synth's eagle3-* shapes, or a
 * converted one), fills both caches with a prefill of P tokens, then times:
 *   - one target decode row at position P, the export off and on, alternated
 *     repetition by repetition (A B A B) so that a shared machine's load falls on
 *     each alike;
 *   - for each n of -n: the head's encoder over n feature rows, and its decoder over
 *     n rows at positions P .. P + n - 1 (a draft level of n sequences or tree nodes
 *     costs about this), logits of every row over the whole vocabulary (d2t's ids
 *     scored) left in backend memory, each followed by a sync.
 * Prints the median of R repetitions per measurement, after warm-up.
 *
 * usage: bench_eagle3 -m TARGET -e HEAD [--backend cpu|cuda] [--threads T] [-p P] [-n 1,4,16,64] [-r R]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "eagle3.h"

static void die(const char *what, const tdm_err *err) { bench_die("bench_eagle3", what, err); }

static void sync_be(tdm_backend *be) {
    tdm_err err = {0};
    if (be->ops->sync && be->ops->sync(be, &err)) die("sync", &err);
}

int main(int argc, char **argv) {
    const char *target = NULL, *head = NULL, *backend = "cpu", *ns_arg = "1,4,16,64";
    int threads = 2, prompt = 128, reps = 30;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) target = argv[++i];
        else if (!strcmp(argv[i], "-e") && i + 1 < argc) head = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) ns_arg = argv[++i];
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s -m TARGET -e HEAD [--backend cpu|cuda] [--threads T] [-p P] [-n 1,4,16,64] "
                            "[-r R]\n", argv[0]);
            return 2;
        }
    }
    int ns[16], n_ns = 0, n_max = 1;
    for (char *s = (char *)ns_arg; *s && n_ns < 16;) {
        ns[n_ns] = (int)strtol(s, &s, 10);
        if (ns[n_ns] < 1 || ns[n_ns] > 256) {
            fprintf(stderr, "bench_eagle3: -n values must be in 1..256\n");
            return 2;
        }
        n_max = ns[n_ns] > n_max ? ns[n_ns] : n_max;
        n_ns++;
        if (*s == ',') s++;
    }
    if (!target || !head || prompt < 1 || prompt > 4096 || reps < 1) {
        fprintf(stderr, "bench_eagle3: need -m and -e, 1 <= P <= 4096, R >= 1\n");
        return 2;
    }
    tdm_err err = {0};
    tdm_backend *be = NULL;
    if (!strcmp(backend, "cuda") ? tdm_backend_cuda_create(0, &be, &err) : tdm_backend_cpu_create(threads, &be, &err))
        die("backend", &err);
    tdm_model *m = NULL;
    tdm_eagle3 *h = NULL;
    if (tdm_model_load(target, be, &m, &err)) die("target", &err);
    if (tdm_eagle3_load(head, be, &h, &err)) die("head", &err);
    if (tdm_eagle3_pair(h, m, &err)) die("pair", &err);
    const int32_t bs = 16, n_blocks = (prompt + n_max + bs - 1) / bs, V = m->hp.n_vocab;
    const int32_t E = h->ep.n_embd, T3 = 3 * h->ep.target_hidden;
    tdm_kv_store kv, hkv;
    if (tdm_kv_store_init(&kv, m, be, TDM_F16, n_blocks, bs, &err) ||
        tdm_kv_store_init(&hkv, h->m, be, TDM_F16, n_blocks, bs, &err))
        die("kv", &err);
    tdm_kv_seq seq = {calloc((size_t)n_blocks, 4), n_blocks, n_blocks, n_blocks * bs};
    for (int32_t i = 0; i < n_blocks; i++) seq.blocks[i] = i;
    const tdm_kv_seq *sp[1] = {&seq};
    const int32_t n_rows = prompt > n_max ? prompt : n_max;
    tdm_fwd_scratch fs = {0};
    tdm_eagle3_scratch hs = {0};
    float *logits = NULL, *feat = NULL, *g = NULL, *hout = NULL;
    if (be->ops->alloc(be, (size_t)n_max * V * 4, (void **)&logits, &err) ||
        be->ops->alloc(be, (size_t)n_rows * T3 * 4, (void **)&feat, &err) ||
        be->ops->alloc(be, (size_t)n_rows * E * 4, (void **)&g, &err) ||
        be->ops->alloc(be, (size_t)n_rows * E * 4, (void **)&hout, &err))
        die("alloc", &err);
    tdm_batch bt;
    if (tdm_batch_init(&bt, n_rows, &err)) die("batch", &err);

    /* the prefill: the target with the export (its features fill `feat`), then the
     * head over the same positions */
    if (tdm_fwd_scratch_set_features(&fs, h->ep.feat_layers, TDM_EAGLE3_N_FEAT, &err)) die("features", &err);
    tdm_batch_clear(&bt);
    for (int32_t p = 0; p < prompt; p++) tdm_batch_add(&bt, (p * 7919) % V, p, 0, p, p == prompt - 1);
    if (tdm_model_forward(m, be, &kv, &bt, sp, &fs, logits, &err)) die("prefill", &err);
    if (be->ops->copy(be, feat, fs.feat, (size_t)prompt * T3 * 4, &err)) die("copy", &err);
    for (int32_t p = prompt; p < n_max; p++) /* (more rows than the prompt: repeat its features) */
        if (be->ops->copy(be, feat + (size_t)p * T3, fs.feat + (size_t)(p % prompt) * T3, (size_t)T3 * 4, &err))
            die("copy", &err);
    if (tdm_eagle3_fuse(h, be, &hs, feat, prompt, g, &err)) die("fuse", &err);
    for (int32_t i = 0; i < prompt; i++) bt.want_logits[i] = 0;
    bt.want_logits[prompt - 1] = 1;
    if (tdm_eagle3_forward(h, be, &hkv, &bt, sp, &hs, g, hout, logits, &err)) die("head prefill", &err);
    sync_be(be);
    printf("%s: target %s, head %s (hidden %d, draft vocabulary %d of %d), context %d\n", backend, target, head,
           (int)E, (int)h->ep.n_draft_vocab, (int)V, prompt);

    double *ta = malloc((size_t)reps * sizeof *ta), *tb = malloc((size_t)reps * sizeof *tb);
    /* the target's decode row, export off (A) and on (B) */
    for (int r = -5; r < reps; r++)
        for (int ab = 0; ab < 2; ab++) {
            if (tdm_fwd_scratch_set_features(&fs, h->ep.feat_layers, ab ? TDM_EAGLE3_N_FEAT : 0, &err))
                die("features", &err);
            tdm_batch_clear(&bt);
            tdm_batch_add(&bt, 17, prompt, 0, prompt, true);
            const double t0 = tdm_now();
            if (tdm_model_forward(m, be, &kv, &bt, sp, &fs, logits, &err)) die("decode", &err);
            sync_be(be);
            if (r >= 0) (ab ? tb : ta)[r] = tdm_now() - t0;
        }
    printf("target decode row: %.1f us; with the feature export: %.1f us\n", bench_median(ta, reps) * 1e6,
           bench_median(tb, reps) * 1e6);
    /* the head by rows */
    for (int k = 0; k < n_ns; k++) {
        const int n = ns[k];
        for (int r = -5; r < reps; r++) {
            double t0 = tdm_now();
            if (tdm_eagle3_fuse(h, be, &hs, feat, n, g, &err)) die("fuse", &err);
            sync_be(be);
            double t1 = tdm_now();
            tdm_batch_clear(&bt);
            for (int i = 0; i < n; i++) tdm_batch_add(&bt, (i * 31 + 5) % V, prompt + i, 0, prompt + i, true);
            if (tdm_eagle3_forward(h, be, &hkv, &bt, sp, &hs, g, hout, logits, &err)) die("head", &err);
            sync_be(be);
            if (r >= 0) ta[r] = t1 - t0, tb[r] = tdm_now() - t1;
        }
        printf("head, %3d rows: encoder %.1f us, decoder %.1f us (%.1f us a row)\n", n, bench_median(ta, reps) * 1e6,
               bench_median(tb, reps) * 1e6, bench_median(tb, reps) * 1e6 / n);
    }
    free(ta), free(tb);
    float *bufs[] = {logits, feat, g, hout};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->ops->free(be, bufs[i]);
    tdm_batch_free(&bt);
    tdm_eagle3_scratch_free(&hs);
    tdm_fwd_scratch_free(&fs);
    tdm_kv_store_free(&kv);
    tdm_kv_store_free(&hkv);
    free(seq.blocks);
    tdm_eagle3_free(h);
    tdm_model_free(m);
    tdm_backend_destroy(be);
    return 0;
}
