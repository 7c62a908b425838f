/* bench_forward.c - one model's forward pass on a chosen backend, by batch shape.
 *
 * Loads a model on the CPU backend or the CUDA backend, fills a sequence's K/V with
 * a prefill of P tokens (timed), then times forwards of n rows at positions P ..
 * P + n - 1 for each n of -n (a decode step is n = 1; a verification of k drafted
 * tokens is n = k + 1), each with logits for every row copied to the host, or with
 * --argmax only each row's argmax (what a greedy step needs).  With --tree the n rows
 * are a token tree's verification instead of a chain's: the pending token at P - 1
 * and n - 1 nodes of a tree (nodes 0-3 below the root, node i >= 4 below node
 * (i - 4) / 4), each at slot P + i, position P + its depth, with its ancestor mask
 * (what tdm_verify_tree runs).  Prints the median of R repetitions per shape, after
 * warm-up.
 *
 * --vocab N,... times the output head over part of the vocabulary (draft_vocab: ids
 * [0, N) and the special tokens; 0 = the whole head), the values alternated
 * repetition by repetition (A B A B) so that a shared machine's load falls on each
 * alike; --approx takes the quantised copy's approximate logits where the model has
 * one (what a sampled draft reads).
 *
 * --kv-type picks the cache's element type (default f16).  --fill writes random
 * values in [-1, 1] over the K/V of the P positions instead of the prefill (a context
 * of thousands of tokens then takes no minutes of prefill; the same values for every
 * type, and written, so the cache is as resident as after a prefill).
 *
 * --kq-ref (CUDA): Q4_K / Q5_K / Q6_K products on the row kernel that dequantises
 * them to f32 instead of their int8 kernels (tdm_backend_cuda_force_matmul 3), for
 * an A / B of the two in one binary.
 *
 * usage: bench_forward -m MODEL [--backend cpu|cuda] [--threads T] [-p P] [-n 1,2,4,8]
 *                      [-r R] [--argmax | --approx] [--tree] [--kv-type f32|f16|q8_0|fp8] [--fill] [--kq-ref]
 *                      [--vocab N,...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "vocab_head.h"

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, const tdm_err *err) {
    fprintf(stderr, "bench_forward: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

int main(int argc, char **argv) {
    const char *model = NULL, *backend = "cpu", *ns_arg = "1,2,3,4,5,6,8", *vocab_arg = "0";
    int threads = 2, prompt = 128, reps = 50;
    bool argmax = false, approx = false, tree = false, fill = false, kq_ref = false;
    uint32_t kv_type = TDM_F16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--backend") && i + 1 < argc) backend = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc) ns_arg = argv[++i];
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--argmax")) argmax = true;
        else if (!strcmp(argv[i], "--approx")) approx = true;
        else if (!strcmp(argv[i], "--vocab") && i + 1 < argc) vocab_arg = argv[++i];
        else if (!strcmp(argv[i], "--tree")) tree = true;
        else if (!strcmp(argv[i], "--fill")) fill = true;
        else if (!strcmp(argv[i], "--kq-ref")) kq_ref = true;
        else if (!strcmp(argv[i], "--kv-type") && i + 1 < argc) {
            const char *v = argv[++i];
            kv_type = !strcmp(v, "f32")    ? TDM_F32
                      : !strcmp(v, "f16")  ? TDM_F16
                      : !strcmp(v, "q8_0") ? TDM_Q8_0
                      : !strcmp(v, "fp8")  ? TDM_F8_E4M3
                                           : 0xffff;
            if (kv_type == 0xffff) {
                fprintf(stderr, "bench_forward: --kv-type takes f32, f16, q8_0 or fp8, not '%s'\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "usage: %s -m MODEL [--backend cpu|cuda] [--threads T] [-p P] [-n 1,2,4,8] [-r R] [--argmax | "
                            "--approx] [--tree] [--kv-type f32|f16|q8_0|fp8] [--fill] [--kq-ref] [--vocab N,...]\n",
                    argv[0]);
            return 2;
        }
    }
    int ns[32], n_ns = 0, n_max = 1;
    for (char *s = (char *)ns_arg; *s && n_ns < 32;) {
        ns[n_ns] = (int)strtol(s, &s, 10);
        if (ns[n_ns] < 1 || ns[n_ns] > 64) {
            fprintf(stderr, "bench_forward: -n values must be in 1..64\n");
            return 2;
        }
        n_max = ns[n_ns] > n_max ? ns[n_ns] : n_max;
        n_ns++;
        if (*s == ',') s++;
    }
    int vocabs[4], n_vocab_cfg = 0;
    for (char *s = (char *)vocab_arg; *s && n_vocab_cfg < 4;) {
        vocabs[n_vocab_cfg++] = (int)strtol(s, &s, 10);
        if (*s == ',') s++;
    }
    if (argmax && approx) {
        fprintf(stderr, "bench_forward: --argmax or --approx, not both\n");
        return 2;
    }
    const int p_max = fill ? 1 << 17 : 2048;
    if (!model || prompt < 1 || reps < 1 || prompt + n_max > p_max) {
        fprintf(stderr, "bench_forward: need -m, 1 <= P (P + n <= %d), R >= 1\n", p_max);
        return 2;
    }
    tdm_err err = {0};
    tdm_backend *be = NULL;
    tandem_status st = !strcmp(backend, "cuda") ? tdm_backend_cuda_create(0, &be, &err)
                                                : tdm_backend_cpu_create(threads, &be, &err);
    if (st) die("backend", &err);
    if (kq_ref) {
        if (strcmp(backend, "cuda") != 0) {
            fprintf(stderr, "bench_forward: --kq-ref needs --backend cuda\n");
            return 2;
        }
        tdm_backend_cuda_force_matmul(be, 3);
    }
    tdm_model *m = NULL;
    if (tdm_model_load(model, be, &m, &err)) die("model", &err);
    const int32_t bs = 16, n_blocks = (prompt + n_max + bs - 1) / bs, V = m->hp.n_vocab;
    tdm_kv_store kv;
    if (tdm_kv_store_init(&kv, m, be, kv_type, n_blocks, bs, &err)) die("kv", &err);
    tdm_kv_seq seq = {calloc((size_t)n_blocks, 4), n_blocks, n_blocks, n_blocks * bs};
    for (int32_t i = 0; i < n_blocks; i++) seq.blocks[i] = i;
    const tdm_kv_seq *sp[1] = {&seq};
    tdm_fwd_scratch fs = {0};
    float *logits_d = NULL, *logits_h = malloc((size_t)n_max * V * 4);
    if (be->ops->alloc(be, (size_t)(n_max > 1 ? n_max : 1) * V * 4, (void **)&logits_d, &err)) die("alloc", &err);
    tdm_batch bt;
    if (tdm_batch_init(&bt, prompt + n_max, &err)) die("batch", &err);
    /* the heads over part of the vocabulary (--vocab; 0: the whole) */
    tdm_vocab_head heads[4] = {0};
    for (int v = 0; v < n_vocab_cfg; v++) {
        if (vocabs[v] == 0) continue;
        int32_t *vids, n_vids;
        if (tdm_vocab_subset_ids(m->tok, V, vocabs[v], &vids, &n_vids, &err) ||
            tdm_vocab_head_init(&heads[v], m, vids, n_vids, &err))
            die("--vocab", &err);
        free(vids);
    }

    /* prefill (logits of the last row), or --fill: every value of the cache uniform
     * in [-1, 1] (q8_0: quants uniform in [-127, 127], scales 1/127), the same values
     * for every type, so that the forwards after it compute on alike activations */
    double best = 1e30;
    if (fill) {
        const int64_t unit = tdm_kv_unit_bytes(kv.type, kv.block_size, kv.head_dim), vals = (int64_t)bs * kv.head_dim;
        const size_t n_units = (size_t)n_blocks * (size_t)kv.n_kv_head, per_layer = n_units * (size_t)unit;
        uint8_t *pat = calloc(per_layer, 1);
        uint64_t rng = 12345;
        for (size_t u = 0; u < n_units; u++) {
            uint8_t *p = pat + u * (size_t)unit;
            for (int64_t i = 0; i < vals; i++) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                const float x = (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
                if (kv.type == TDM_F32) memcpy(p + 4 * i, &x, 4);
                else if (kv.type == TDM_F16) {
                    const uint16_t h = tdm_f32_to_f16(x);
                    memcpy(p + 2 * i, &h, 2);
                } else if (kv.type == TDM_F8_E4M3) p[i] = tdm_f32_to_e4m3(x * TDM_E4M3_MAX);
                else p[i] = (uint8_t)(int8_t)lrintf(x * 127.0f);
            }
            if (tdm_kv_scaled(kv.type))
                for (int32_t j = 0; j < bs; j++) {
                    const float d = kv.type == TDM_Q8_0 ? 1.0f / 127.0f : 1.0f / TDM_E4M3_MAX;
                    memcpy(p + tdm_kv_scale_off(bs, kv.head_dim) + 4 * j, &d, 4);
                }
        }
        for (int32_t l = 0; l < kv.n_layer; l++)
            if (be->ops->upload(be, kv.k[l], pat, per_layer, &err) || be->ops->upload(be, kv.v[l], pat, per_layer, &err))
                die("fill", &err);
        free(pat);
    }
    for (int r = 0; r < (fill ? 0 : 3); r++) {
        tdm_batch_clear(&bt);
        for (int32_t p = 0; p < prompt; p++) tdm_batch_add(&bt, (p * 7919) % V, p, 0, p, p == prompt - 1);
        double t0 = tdm_now();
        if (tdm_model_forward(m, be, &kv, &bt, sp, &fs, logits_d, &err)) die("prefill", &err);
        if (be->ops->download(be, logits_h, logits_d, (size_t)V * 4, &err)) die("download", &err);
        double t = tdm_now() - t0;
        best = t < best ? t : best;
    }
    int32_t ids[64];
    if (fill) printf("%s %s: %s cache of %d positions filled (no prefill)\n", backend, model, tdm_dtype_name(kv_type), prompt);
    else
        printf("%s %s: prefill %d tokens: %.1f us (%.0f tok/s, best of 3)\n", backend, model, prompt, best * 1e6,
               prompt / best);

    double *tv = malloc((size_t)reps * (size_t)n_vocab_cfg * sizeof(double));
    const tdm_fwd_kind kind = argmax ? TDM_FWD_ARGMAX : approx ? TDM_FWD_LOGITS_APPROX : TDM_FWD_LOGITS;
    for (int k = 0; k < n_ns; k++) {
        const int n = ns[k];
        for (int rv = -5 * n_vocab_cfg; rv < reps * n_vocab_cfg; rv++) { /* 5 warm-up runs each */
            const int v = (rv + 5 * n_vocab_cfg) % n_vocab_cfg, r = rv < 0 ? -1 : rv / n_vocab_cfg;
            double *t = tv + (size_t)v * (size_t)reps;
            fs.vhead = vocabs[v] ? &heads[v] : NULL;
            tdm_batch_clear(&bt);
            if (tree) {
                /* the pending token, then the nodes below it */
                uint64_t mask[64];
                int32_t depth[64];
                tdm_batch_add(&bt, 7, prompt - 1, 0, prompt - 1, true);
                for (int32_t i = 0; i + 1 < n; i++) {
                    const int32_t par = i < 4 ? -1 : (i - 4) / 4;
                    mask[i] = (par < 0 ? 0 : mask[par]) | (1ull << i);
                    depth[i] = par < 0 ? 0 : depth[par] + 1;
                    tdm_batch_add_tree(&bt, (i * 31 + 7) % V, prompt + depth[i], 0, prompt + i, prompt, mask[i], true);
                }
            } else {
                for (int32_t i = 0; i < n; i++) tdm_batch_add(&bt, (i * 31 + 7) % V, prompt + i, 0, prompt + i, true);
            }
            double t0 = tdm_now();
            if (tdm_model_forward_ex(m, be, &kv, &bt, sp, &fs, kind, logits_d, ids, &err)) die("forward", &err);
            if (!argmax && be->ops->download(be, logits_h, logits_d, (size_t)n * V * 4, &err)) die("download", &err);
            if (r >= 0) t[r] = tdm_now() - t0;
        }
        for (int v = 0; v < n_vocab_cfg; v++) {
            double *t = tv + (size_t)v * (size_t)reps;
            qsort(t, (size_t)reps, sizeof *t, cmp_double);
            char head[48] = "";
            if (n_vocab_cfg > 1 || vocabs[v])
                snprintf(head, sizeof head, " vocab %d (%d rows)", vocabs[v], vocabs[v] ? (int)heads[v].n : (int)V);
            printf("%s%s%s%s: %d rows: %.1f us per forward (median of %d; min %.1f, max %.1f)\n", backend,
                   argmax ? " argmax" : approx ? " approx" : "", tree ? " tree" : "", head, n, t[reps / 2] * 1e6, reps,
                   t[0] * 1e6, t[reps - 1] * 1e6);
        }
    }
    free(tv);
    fs.vhead = NULL;
    for (int v = 0; v < n_vocab_cfg; v++) tdm_vocab_head_free(&heads[v]);
    tdm_batch_free(&bt);
    free(logits_h);
    be->ops->free(be, logits_d);
    tdm_fwd_scratch_free(&fs);
    tdm_kv_store_free(&kv);
    free(seq.blocks);
    tdm_model_free(m);
    tdm_backend_destroy(be);
    return 0;
}
