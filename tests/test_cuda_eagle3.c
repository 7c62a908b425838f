/* test_cuda_eagle3.c - EAGLE-3 on the CUDA backend against the CPU backend
 * (src/model/eagle3.h; the CPU side's own reference checks: test_eagle3.c):
 *   - the target's feature export (the pycode target, layers 2, 4, 5 and the layer
 *     count, a 20-row prefill then 3 rows, through the fused blocks and op by op):
 *     the exported rows match the CPU's by normalised error, and the export leaves
 *     the GPU's own logits unchanged bit for bit;
 *   - the head's forward (tandem synth's eagle3-pycode head paired with the target,
 *     fused features, three forwards over its KV, a deeper level fed its own output,
 *     a row without logits): logits at the d2t ids and the pre-norm outputs match the
 *     CPU's, every other id TDM_LOGIT_NONE;
 *   - the head as the draft of the one step: greedy output equals target-only output
 *     (alone: fixed length, adaptive with lookups, the oracle's arrangement, head
 *     trees of 16 (candidates by the device's topk) and the oracle's trees; four at a
 *     time, chains and trees of 8), and sampled output keeps the target's
 *     distribution (chi-square against the CPU's target-only sampling, with an
 *     in-memory head on the tiny target; chains and head trees).
 *
 * Without a CUDA device (or in a build without CUDA) the program prints why and
 * exits with 77, which meson reports as skipped. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_testutil.h"
#include "dtype.h"
#include "eagle3.h"
#include "eagle3_testutil.h"
#include "engine.h"
#include "stats.h"
#include "tandem.h"
#include "tiny_model.h"
#include "ref_ops.h"
#include "synth.h"
#include "testutil.h"

static tdm_backend *cpu1(void) {
    tdm_backend *be;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &be, &err), TANDEM_OK, "%s", err.msg);
    return be;
}

static void *host_copy(tdm_backend *be, const void *p, size_t n) {
    if (be->host_memory) {
        void *h = malloc(n);
        memcpy(h, p, n);
        return h;
    }
    return tdm_cu_test_get(be, p, n);
}

/* ---- the feature export ---------------------------------------------------------- */

/* The two forwards on rig r with the export of ids[n] on (with) or off: logits
 * (host, [23][V]) and, with the export, the features (host, [23][n E]). */
static void run_export(tdm_cu_rig *r, const int32_t *ids, int n, bool with, bool by_ops, const int32_t *tok,
                       float **logits, float **feat) {
    tdm_err err = {0};
    const int32_t V = r->m->hp.n_vocab, E = r->m->hp.n_embd;
    cr_assert_eq(tdm_fwd_scratch_set_features(&r->fs, ids, with ? n : 0, &err), TANDEM_OK, "%s", err.msg);
    *logits = malloc((size_t)23 * V * sizeof(float));
    if (with) *feat = malloc((size_t)23 * n * E * sizeof(float));
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, 32, &err), TANDEM_OK);
    const int p0[2] = {0, 20}, nr[2] = {20, 3};
    for (int k = 0; k < 2; k++) {
        tdm_batch_clear(&b);
        for (int i = 0; i < nr[k]; i++) tdm_batch_add(&b, tok[p0[k] + i], p0[k] + i, 0, p0[k] + i, true);
        float *l = tdm_cu_rig_forward(r, &b, by_ops);
        memcpy(*logits + (size_t)p0[k] * V, l, (size_t)nr[k] * V * sizeof(float));
        free(l);
        if (with) {
            float *f = host_copy(r->be, r->fs.feat, (size_t)nr[k] * n * E * sizeof(float));
            memcpy(*feat + (size_t)p0[k] * n * E, f, (size_t)nr[k] * n * E * sizeof(float));
            free(f);
        }
    }
    tdm_batch_free(&b);
}

Test(cuda_eagle3, features_match_cpu, .timeout = 300) {
    const char *path = tdm_test_model_path("pycode-target-f16.gguf");
    const int32_t ids[4] = {2, 4, 5, 8};
    int32_t tok[23];
    uint64_t rng = 21;
    for (int i = 0; i < 23; i++) tok[i] = (int32_t)(tdm_test_rand(&rng) % 8192);
    for (int by_ops = 0; by_ops < 2; by_ops++) {
        tdm_cu_rig rc, rg, rg0;
        float *lc, *fc, *lg, *fg, *lg0, *unused = NULL;
        tdm_cu_rig_open(&rc, cpu1(), path, 4);
        const size_t V = 8192, E = (size_t)rc.m->hp.n_embd;
        run_export(&rc, ids, 4, true, by_ops, tok, &lc, &fc);
        tdm_cu_rig_close(&rc);
        tdm_cu_rig_open(&rg, tdm_cu_test_gpu(), path, 4);
        run_export(&rg, ids, 4, true, by_ops, tok, &lg, &fg);
        tdm_cu_rig_close(&rg);
        tdm_cu_rig_open(&rg0, tdm_cu_test_gpu(), path, 4);
        run_export(&rg0, ids, 4, false, by_ops, tok, &lg0, &unused);
        tdm_cu_rig_close(&rg0);
        cr_assert_eq(memcmp(lg, lg0, 23 * V * sizeof(float)), 0, "the export changed the GPU's logits (%s)",
                     by_ops ? "ops" : "fused blocks");
        for (int k = 0; k < 4; k++) { /* each layer's rows against the CPU's */
            float *a = malloc(23 * E * sizeof(float)), *c = malloc(23 * E * sizeof(float));
            for (int i = 0; i < 23; i++) {
                memcpy(a + (size_t)i * E, fg + ((size_t)i * 4 + (size_t)k) * E, E * sizeof(float));
                memcpy(c + (size_t)i * E, fc + ((size_t)i * 4 + (size_t)k) * E, E * sizeof(float));
            }
            const double e = ref_nrm_err(a, c, 23 * E);
            /* (a prefill of 20 rows may multiply in f16 on tensor cores) */
            cr_assert_lt(e, 3e-3, "layer %d: features err %g (%s)", (int)ids[k], e, by_ops ? "ops" : "fused blocks");
            free(a), free(c);
        }
        free(lc), free(fc), free(lg), free(fg), free(lg0);
    }
}

/* ---- the head's forward ---------------------------------------------------------- */

typedef struct hrig {
    tdm_backend *be;
    tdm_model *t;
    tdm_eagle3 *h;
    tdm_kv_store kv;
    tdm_kv_seq seq;
    int32_t blocks[4];
    tdm_eagle3_scratch s;
    float *feat, *g, *hout, *logits, *g3; /* backend memory */
} hrig;

static void hrig_open(hrig *r, tdm_backend *be, const char *head, const float *feat, int N) {
    tdm_err err = {0};
    memset(r, 0, sizeof *r);
    r->be = be;
    cr_assert_eq(tdm_model_load(tdm_test_model_path("pycode-target-f16.gguf"), be, &r->t, &err), TANDEM_OK, "%s",
                 err.msg);
    cr_assert_eq(tdm_eagle3_load(head, be, &r->h, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_eagle3_pair(r->h, r->t, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_kv_store_init(&r->kv, r->h->m, be, TDM_F16, 4, 16, &err), TANDEM_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++) r->blocks[i] = 3 - i; /* (not in order) */
    r->seq = (tdm_kv_seq){.blocks = r->blocks, .n_blocks = 4, .cap_blocks = 4, .len = 64};
    const size_t E = (size_t)r->h->ep.n_embd, T3 = 3 * (size_t)r->h->ep.target_hidden, V = (size_t)r->h->ep.n_vocab;
    r->feat = tdm_cu_test_put(be, feat, (size_t)N * T3 * sizeof(float));
    r->g = tdm_cu_test_put(be, NULL, (size_t)N * E * sizeof(float));
    r->hout = tdm_cu_test_put(be, NULL, (size_t)8 * E * sizeof(float));
    r->g3 = tdm_cu_test_put(be, NULL, (size_t)2 * E * sizeof(float));
    r->logits = tdm_cu_test_put(be, NULL, (size_t)8 * V * sizeof(float));
    cr_assert_eq(tdm_eagle3_fuse(r->h, be, &r->s, r->feat, N, r->g, &err), TANDEM_OK, "%s", err.msg);
}

static void hrig_close(hrig *r) {
    float *bufs[] = {r->feat, r->g, r->hout, r->g3, r->logits};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) r->be->ops->free(r->be, bufs[i]);
    tdm_eagle3_scratch_free(&r->s);
    tdm_kv_store_free(&r->kv);
    tdm_eagle3_free(r->h);
    tdm_model_free(r->t);
    tdm_backend_destroy(r->be);
}

/* Forward k of the three (rows [p0, p0 + n) of tok; the third: a deeper level's row
 * fed the second's output, then a fused row, only it wanting logits): host copies of
 * the logits rows and the outputs. */
static void hrig_step(hrig *r, int k, const int32_t *tok, float **logits, int *nl, float **hout) {
    tdm_err err = {0};
    const size_t E = (size_t)r->h->ep.n_embd, V = (size_t)r->h->ep.n_vocab;
    const int p0[3] = {0, 5, 6}, n[3] = {5, 1, 2};
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, 8, &err), TANDEM_OK);
    for (int i = 0; i < n[k]; i++) tdm_batch_add(&b, tok[p0[k] + i], p0[k] + i, 0, p0[k] + i, true);
    const float *g = r->g + (size_t)p0[k] * E;
    if (k == 2) {
        b.want_logits[0] = 0;
        cr_assert_eq(r->be->ops->copy(r->be, r->g3, r->hout, E * sizeof(float), &err), TANDEM_OK);
        cr_assert_eq(r->be->ops->copy(r->be, r->g3 + E, r->g + 7 * E, E * sizeof(float), &err), TANDEM_OK);
        g = r->g3;
    }
    const tdm_kv_seq *seqs[1] = {&r->seq};
    cr_assert_eq(tdm_eagle3_forward(r->h, r->be, &r->kv, &b, seqs, &r->s, g, r->hout, r->logits, &err), TANDEM_OK,
                 "%s", err.msg);
    *nl = tdm_batch_n_logits(&b);
    *logits = host_copy(r->be, r->logits, (size_t)*nl * V * sizeof(float));
    *hout = host_copy(r->be, r->hout, (size_t)n[k] * E * sizeof(float));
    tdm_batch_free(&b);
}

Test(cuda_eagle3, head_matches_cpu, .timeout = 300) {
    char path[] = "/tmp/tdm_cuda_eagle3_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    tdm_synth_opts o = {.shape = tdm_synth_shape_find("eagle3-pycode"), .type = TDM_F16, .seed = 11,
                        .tokenizer_from = tdm_test_model_path("pycode-target-f16.gguf"), .overwrite = true};
    tdm_err err = {0};
    cr_assert_eq(tdm_synth_write(&o, path, NULL, &err), TANDEM_OK, "%s", err.msg);
    const int N = 8, T3 = 3 * 384;
    uint64_t rng = 5;
    float *feat = malloc((size_t)N * T3 * sizeof *feat);
    for (int i = 0; i < N * T3; i++) feat[i] = tdm_test_randf(&rng, -2.0f, 2.0f);
    int32_t tok[8];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(tdm_test_rand(&rng) % 8192);
    hrig c, g;
    hrig_open(&c, cpu1(), path, feat, N);
    hrig_open(&g, tdm_cu_test_gpu(), path, feat, N);
    unlink(path);
    const size_t E = 384, V = 8192;
    { /* the fused features */
        float *gc = host_copy(c.be, c.g, (size_t)N * E * sizeof(float)), *gg = host_copy(g.be, g.g, (size_t)N * E * 4);
        const double e = ref_nrm_err(gg, gc, (size_t)N * E);
        cr_assert_lt(e, 1e-3, "fc: err %g", e);
        free(gc), free(gg);
    }
    for (int k = 0; k < 3; k++) {
        float *lc, *lg, *hc, *hg;
        int nc, ng;
        hrig_step(&c, k, tok, &lc, &nc, &hc);
        hrig_step(&g, k, tok, &lg, &ng, &hg);
        cr_assert_eq(nc, ng);
        /* the d2t ids' logits (every other id TDM_LOGIT_NONE on both) */
        size_t m = 0;
        for (size_t i = 0; i < (size_t)nc * V; i++) {
            cr_assert_eq(lc[i] == TDM_LOGIT_NONE, lg[i] == TDM_LOGIT_NONE, "forward %d: logit %zu", k, i);
            if (lc[i] != TDM_LOGIT_NONE) lc[m] = lc[i], lg[m++] = lg[i];
        }
        cr_assert_eq(m, (size_t)nc * 2048, "forward %d: %zu scored ids", k, m);
        const double el = ref_nrm_err(lg, lc, m);
        const int n_rows = k == 0 ? 5 : k == 1 ? 1 : 2;
        const double eh = ref_nrm_err(hg, hc, (size_t)n_rows * E);
        cr_assert_lt(el, 1e-3, "forward %d: logits err %g", k, el);
        cr_assert_lt(eh, 1e-3, "forward %d: outputs err %g", k, eh);
        free(lc), free(lg), free(hc), free(hg);
    }
    free(feat);
    hrig_close(&c);
    hrig_close(&g);
}

/* ---- the head as the draft of the one step (src/engine/head.c) --------------------- */

static tandem_model *open_cuda(const char *path) {
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = TANDEM_BACKEND_CUDA;
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(path, &mp, &m), TANDEM_OK, "%s", tandem_last_error());
    return m;
}

static tandem_engine *open_engine(tandem_model *t, tandem_model *d, int n_seq) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_seq_max = n_seq;
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(t, d, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    return e;
}

/* Greedy output with tandem synth's eagle3-pycode head on the GPU (its forward on the
 * op table, the target's features by the parts path) equals target-only output on
 * every 4th dev prompt: alone with a fixed length and no lookups, adaptive with
 * lookups, with the oracle's arrangement (chains accepted to random depths), head
 * trees of 16 and the oracle's trees of 16, and four sequences at a time (chains,
 * then head trees of 8) against each alone. */
Test(cuda_eagle3, head_greedy_equals_target_only, .timeout = 900) {
    char hpath[32];
    synth_head(hpath, TDM_F16, NULL);
    tandem_model *t = open_cuda(tdm_test_model_path("pycode-target-f16.gguf")), *h = open_cuda(hpath);
    unlink(hpath);
    tandem_engine *plain = open_engine(t, NULL, 1), *spec = open_engine(t, h, 1), *batch = open_engine(t, h, 4);
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    const size_t n_req = (n_lines + 3) / 4;
    tandem_request *req = calloc(n_req, sizeof *req);
    tandem_result *ref = calloc(n_req, sizeof *ref), *got = calloc(n_req, sizeof *got);
    uint64_t drafted[7] = {0}, accepted[7] = {0};
    for (size_t i = 0; i < n_req; i++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[4 * i], "prompt_ids"), &n);
        req[i] = tandem_request_default();
        req[i].prompt_ids = ids;
        req[i].n_prompt_ids = n;
        req[i].params.max_tokens = 32;
        req[i].params.spec_k = 3;
        req[i].params.spec_ngram = 0;
        cr_assert_eq(tandem_generate_ids(plain, ids, n, &req[i].params, &ref[i]), TANDEM_OK, "%s", tandem_last_error());
        for (int c = 0; c < 5; c++) {
            tandem_generate_params gp = req[i].params;
            if (c == 1) gp.spec_k = 0, gp.spec_ngram = 3;
            if (c == 2 || c == 4) gp.spec_k = 4, gp.bench_oracle_tokens = ref[i].tokens, gp.bench_n_oracle = (int)ref[i].n_tokens,
                gp.bench_oracle_alpha = c == 2 ? 0.7f : 0.8f;
            if (c >= 3) gp.spec_tree = 16;
            tandem_result b;
            cr_assert_eq(tandem_generate_ids(spec, ids, n, &gp, &b), TANDEM_OK, "%s", tandem_last_error());
            cr_assert(ref[i].n_tokens == b.n_tokens && memcmp(ref[i].tokens, b.tokens, b.n_tokens * sizeof(int32_t)) == 0,
                      "case %d, prompt %zu: speculation with the head on the GPU differs from target-only", c, 4 * i);
            drafted[c] += b.spec.drafted;
            accepted[c] += b.spec.accepted;
            tandem_result_free(&b);
        }
    }
    for (int c = 5; c < 7; c++) { /* four at a time: chains, then head trees of 8 */
        for (size_t i = 0; i < n_req; i++) req[i].params.spec_tree = c == 6 ? 8 : 0;
        cr_assert_eq(tandem_generate_batch(batch, req, n_req, got), TANDEM_OK, "%s", tandem_last_error());
        for (size_t i = 0; i < n_req; i++) {
            cr_assert(got[i].status == TANDEM_OK && ref[i].n_tokens == got[i].n_tokens &&
                          memcmp(ref[i].tokens, got[i].tokens, got[i].n_tokens * sizeof(int32_t)) == 0,
                      "prompt %zu, four at a time%s: speculation with the head on the GPU differs from target-only", 4 * i,
                      c == 6 ? ", trees" : "");
            drafted[c] += got[i].spec.drafted;
            accepted[c] += got[i].spec.accepted;
            tandem_result_free(&got[i]);
        }
    }
    for (int c = 0; c < 7; c++)
        printf("cuda, EAGLE-3 head, case %d: %llu drafted, %llu accepted\n", c, (unsigned long long)drafted[c],
               (unsigned long long)accepted[c]);
    cr_assert_gt(drafted[0], 0);
    cr_assert_gt(drafted[3], 0, "the head's trees: nothing drafted");
    cr_assert_gt(accepted[2], 0, "the oracle's chains: none accepted");
    cr_assert_gt(accepted[4], 0, "the oracle's trees: none accepted");
    for (size_t i = 0; i < n_req; i++) {
        free((void *)req[i].prompt_ids);
        tandem_result_free(&ref[i]);
    }
    free(req), free(ref), free(got);
    tdm_test_jsonl_free(refs, n_lines);
    tandem_engine_close(batch);
    tandem_engine_close(spec);
    tandem_engine_close(plain);
    tandem_model_close(h);
    tandem_model_close(t);
}

/* Sampling with a head on the GPU (device sampling; a head's q rows are on the host,
 * so a lone sequence is verified by agreement with the target's draws, as a batch
 * is): the first four tokens' distribution is the CPU's target-only one (two-sample
 * chi-square, p > 1e-3), one sequence and four. */
static void head_sampling(int n_seq, int spec_k, int ngram, int tree) {
    tdm_err err = {0};
    tdm_tiny_cfg tc = tdm_tiny_default();
    tc.n_vocab = 24;
    char *tp = tdm_tiny_model_file(&tc);
    tdm_backend *cpu = cpu1(), *cu = tdm_cu_test_gpu();
    tdm_model *t_cpu, *t_gpu;
    cr_assert_eq(tdm_model_load(tp, cpu, &t_cpu, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(tp, cu, &t_gpu, &err), TANDEM_OK, "%s", err.msg);
    uint8_t *buf;
    tdm_eagle3 *hd = tiny_head(cu, &tc, 18, &buf);
    tdm_engine_cfg cfg = {.n_threads = 1, .n_seq_max = n_seq};
    tdm_engine *ref, *spec;
    cr_assert_eq(tdm_engine_create(t_cpu, NULL, &cfg, &ref, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_create_ex(t_gpu, NULL, hd, &cfg, &spec, &err), TANDEM_OK, "%s", err.msg);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.temperature = 0.9f, gp.top_p = 0.95f, gp.spec_k = spec_k, gp.spec_ngram = ngram, gp.spec_tree = tree;
    char what[112];
    snprintf(what, sizeof what, "cuda, EAGLE-3 head sampling, %d sequences, k %d, lookups %d, tree %d", n_seq, spec_k,
             ngram, tree);
    check_same_distribution(ref, spec, &gp, 10000, 4, 1e-3, what);
    tdm_engine_free(spec);
    tdm_engine_free(ref);
    tdm_eagle3_free(hd);
    free(buf);
    tdm_model_free(t_gpu);
    tdm_model_free(t_cpu);
    tdm_backend_destroy(cu);
    tdm_backend_destroy(cpu);
    unlink(tp);
    free(tp);
}

Test(cuda_eagle3, head_sampling_lossless_alone_k3, .timeout = 600) { head_sampling(1, 3, 0, 0); }
Test(cuda_eagle3, head_sampling_lossless_batch_adaptive, .timeout = 600) { head_sampling(4, 0, 2, 0); }
Test(cuda_eagle3, head_sampling_lossless_trees_alone, .timeout = 600) { head_sampling(1, 0, 0, 6); }
Test(cuda_eagle3, head_sampling_lossless_trees_batch, .timeout = 600) { head_sampling(4, 0, 2, 8); }

int main(int argc, char *argv[]) { return tdm_cu_test_main(argc, argv); }
