/* test_tp.c - tensor parallelism (src/model/tp.h) on the CPU, where the ranks' shards
 * run one after another through the same code a GPU group runs:
 *   - the shape checks: heads, KV heads and FFN features that do not divide, a
 *     quantised wo / w2 whose rank columns are not whole blocks, degrees out of
 *     range, a split draft - each a clear error naming it;
 *   - every weight's shard against the unsharded tensor, for every weight type:
 *     a row-split weight's product equals the whole's rows, a column-split one's
 *     products sum to the whole's (normalised error), the vocabulary parts tile the
 *     head;
 *   - the KV layout: rank r's cache holds KV heads [r G/n, (r + 1) G/n) of the
 *     whole model's cache;
 *   - the split forward (degrees 1, 2 and 4) against the whole model's logits on
 *     llama (GQA), qwen2 (biases), qwen3 (q / k norms) and gemma3 (post norms,
 *     sliding window, soft-caps), f32 and quantised;
 *   - the pycode target split 2 ways through the public API: greedy output equals
 *     the whole model's on dev prompts, alone and batched, and speculative output
 *     (chains and trees, with the whole draft) equals target-only output. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fwd_testutil.h"
#include "kv_cache.h"
#include "tandem.h"
#include "testutil.h"
#include "tp.h"

/* A model split n ways on one host backend, and an engine over it. */
static void tp_open(eng *x, const tdm_tiny_cfg *cfg, int32_t n) {
    tdm_err err = {0};
    x->path = tdm_tiny_model_file(cfg);
    cr_assert_eq(tdm_backend_cpu_create(1, &x->wbe, &err), TANDEM_OK, "%s", err.msg);
    tdm_backend *bes[TDM_TP_MAX];
    for (int32_t r = 0; r < n; r++) bes[r] = x->wbe;
    tdm_collective *coll;
    cr_assert_eq(tdm_collective_host_create(n, &coll, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load_tp(x->path, bes, n, false, coll, NULL, &x->m, &err), TANDEM_OK, "%s", err.msg);
    /* f32 KV, as eng_open_ex's whole model: the checks read the caches as f32 */
    tdm_engine_cfg ec = {.n_threads = 2, .block_size = BLOCK_SIZE, .kv_type = TANDEM_KV_F32};
    cr_assert_eq(tdm_engine_create(x->m, NULL, &ec, &x->e, &err), TANDEM_OK, "%s", err.msg);
}

/* Loading the model split n ways fails with a message containing `want`. */
static void expect_split_error(const tdm_tiny_cfg *cfg, int32_t n, const char *want) {
    tdm_err err = {0};
    char *path = tdm_tiny_model_file(cfg);
    tdm_backend *be;
    cr_assert_eq(tdm_backend_cpu_create(1, &be, &err), TANDEM_OK);
    tdm_backend *bes[TDM_TP_MAX] = {be, be, be, be, be, be, be, be};
    tdm_collective *coll = NULL;
    tdm_model *m = NULL;
    if (n >= 1 && n <= TDM_TP_MAX) cr_assert_eq(tdm_collective_host_create(n, &coll, &err), TANDEM_OK);
    tandem_status st = tdm_model_load_tp(path, bes, n, false, coll, NULL, &m, &err);
    cr_assert_neq(st, TANDEM_OK, "split %d ways: loaded (wanted an error about '%s')", (int)n, want);
    cr_assert_null(m);
    cr_assert(strstr(err.msg, want), "split %d ways: '%s' does not say '%s'", (int)n, err.msg, want);
    tdm_backend_destroy(be);
    unlink(path);
    free(path);
}

Test(tp, shapes_that_do_not_divide_are_errors) {
    tdm_tiny_cfg c = base_cfg(1); /* 4 heads, 2 KV heads, 96 FFN features */
    expect_split_error(&c, 3, "4 attention heads do not divide by 3");
    expect_split_error(&c, 4, "2 KV heads do not divide by 4");
    expect_split_error(&c, 0, "out of range");
    expect_split_error(&c, 9, "out of range");
    c.n_ff = 90;
    c.n_head_kv = 4;
    expect_split_error(&c, 4, "90 FFN features do not divide by 4");
    /* q4_k (blocks of 256): n_embd 256, heads of 64, split 2 ways - wo's 128 columns
     * a rank are half a block */
    tdm_tiny_cfg q = base_cfg(2);
    q.n_embd = 256;
    q.n_ff = 512;
    q.wtype = TDM_Q4_K;
    expect_split_error(&q, 2, "attn_output.weight");
    expect_split_error(&q, 2, "cannot be split 2 ways");
    /* the FFN: q8_0 blocks of 32, 96 features / 2 = 48 columns a rank */
    tdm_tiny_cfg f = base_cfg(3);
    f.n_ff = 96;
    f.wtype = TDM_Q8_0;
    expect_split_error(&f, 2, "ffn_down.weight");
}

/* y[n][w->rows] = x W^T on the compute backend. */
static float *product(tdm_backend *be, const tdm_weight *w, const float *x, int32_t n) {
    float *y = calloc((size_t)n * (size_t)w->rows, sizeof(float));
    tdm_err err = {0};
    cr_assert_eq(be->ops->matmul(be, w, x, n, y, false, &err), TANDEM_OK, "%s", err.msg);
    return y;
}

static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Rank r's weight, row-split: its rows r0[p] .. + nr[p] of the whole's, parts p
 * stacked (wqkv's q, k, v; w13's gate, up; the head's vocabulary). */
static void check_rows(tdm_backend *be, const char *what, const tdm_weight *whole, const tdm_weight *part,
                       const int64_t *r0, const int64_t *nr, int np, const float *x, int32_t n) {
    float *yw = product(be, whole, x, n), *yp = product(be, part, x, n);
    float *want = calloc((size_t)n * (size_t)part->rows, sizeof(float));
    for (int32_t i = 0; i < n; i++)
        for (int p = 0, o = 0; p < np; o += (int)nr[p], p++)
            memcpy(want + (size_t)i * part->rows + o, yw + (size_t)i * whole->rows + r0[p], (size_t)nr[p] * sizeof(float));
    const double e = rel_err(yp, want, (size_t)n * (size_t)part->rows);
    cr_expect(e < 1e-5, "%s: its rows' products differ from the whole's by %.3g", what, e);
    free(yw);
    free(yp);
    free(want);
}

/* The column-split weights of every rank: their products of x's matching columns
 * sum to the whole's product. */
static void check_cols(tdm_backend *be, const char *what, const tdm_weight *whole, const tdm_weight *const *parts,
                       int32_t nr, const float *x, int32_t n) {
    float *yw = product(be, whole, x, n);
    float *sum = calloc((size_t)n * (size_t)whole->rows, sizeof(float));
    int64_t c0 = 0;
    for (int32_t r = 0; r < nr; r++) {
        const int64_t nc = parts[r]->cols;
        cr_assert_eq(parts[r]->rows, whole->rows, "%s", what);
        float *xr = malloc((size_t)n * (size_t)nc * sizeof(float));
        for (int32_t i = 0; i < n; i++) memcpy(xr + (size_t)i * nc, x + (size_t)i * whole->cols + c0, (size_t)nc * 4);
        float *yr = product(be, parts[r], xr, n);
        for (size_t i = 0; i < (size_t)n * (size_t)whole->rows; i++) sum[i] += yr[i];
        free(xr);
        free(yr);
        c0 += nc;
    }
    cr_assert_eq(c0, whole->cols, "%s: the ranks' columns do not tile the whole's", what);
    const double e = rel_err(sum, yw, (size_t)n * (size_t)whole->rows);
    cr_expect(e < 2e-5, "%s: the ranks' products sum to the whole's within %.3g", what, e);
    free(yw);
    free(sum);
}

static void check_weights(uint32_t type, const char *arch, int32_t n_split) {
    tdm_tiny_cfg c = base_cfg(40 + type);
    c.arch = arch;
    c.n_embd = tdm_dtype_is_kquant(type) ? 256 : n_split > 2 ? 128 : 64; /* (whole blocks of 32 a rank) */
    c.n_head = tdm_dtype_is_kquant(type) ? 2 : 4;
    c.head_dim = tdm_dtype_is_kquant(type) ? 256 : 0; /* (a head a rank: whole blocks of 256) */
    c.n_head_kv = n_split > 2 ? 4 : 2;
    c.n_ff = tdm_dtype_is_kquant(type) ? 512 : 128;
    c.wtype = type;
    c.untied_output = type == TDM_F16;
    eng whole, split;
    eng_open_ex(&whole, &c, 0, 1, false);
    tp_open(&split, &c, n_split);
    const tdm_tp_group *g = split.m->tp;
    const tdm_hparams *hp = &whole.m->hp;
    const int64_t hd = hp->head_dim, E = hp->n_embd;
    const int32_t rows = 5;
    uint64_t rng = 7;
    const int64_t width = TDM_MAX(E, TDM_MAX((int64_t)hp->n_head * hd, hp->n_ff));
    float *x = malloc((size_t)rows * (size_t)width * sizeof(float));
    char what[96];
    for (int32_t l = 0; l < hp->n_layer; l++) {
        const tdm_layer *W = &whole.m->layers[l];
        const tdm_weight *wo[TDM_TP_MAX], *w2[TDM_TP_MAX];
        for (int32_t r = 0; r < n_split; r++) {
            const tdm_model *mr = g->rank[r];
            const tdm_layer *P = &mr->layers[l];
            const int64_t qd = (int64_t)mr->hp.n_head * hd, kvd = (int64_t)mr->hp.n_head_kv * hd, F = mr->hp.n_ff;
            const int64_t QD = (int64_t)hp->n_head * hd, KVD = (int64_t)hp->n_head_kv * hd;
            for (int64_t i = 0; i < rows * E; i++) x[i] = tdm_test_randf(&rng, -1, 1);
            const int64_t q0[3] = {r * qd, QD + r * kvd, QD + KVD + r * kvd}, qn[3] = {qd, kvd, kvd};
            snprintf(what, sizeof what, "%s %s layer %d rank %d wqkv", arch, tdm_dtype_name(type), (int)l, (int)r);
            check_rows(whole.e->be, what, &W->wqkv, &P->wqkv, q0, qn, 3, x, rows);
            const int64_t g0[2] = {r * F, hp->n_ff + r * F}, gn[2] = {F, F};
            snprintf(what, sizeof what, "%s %s layer %d rank %d w13", arch, tdm_dtype_name(type), (int)l, (int)r);
            check_rows(whole.e->be, what, &W->w13, &P->w13, g0, gn, 2, x, rows);
            if (W->bqkv) { /* qwen2's biases: its heads' parts */
                for (int p = 0, o = 0; p < 3; o += (int)qn[p], p++)
                    cr_expect(memcmp(P->bqkv + o, W->bqkv + q0[p], (size_t)qn[p] * sizeof(float)) == 0,
                              "layer %d rank %d: bias part %d", (int)l, (int)r, p);
            }
            wo[r] = &P->wo;
            w2[r] = &P->w2;
        }
        for (int64_t i = 0; i < rows * width; i++) x[i] = tdm_test_randf(&rng, -1, 1);
        snprintf(what, sizeof what, "%s %s layer %d wo", arch, tdm_dtype_name(type), (int)l);
        check_cols(whole.e->be, what, &W->wo, wo, n_split, x, rows);
        snprintf(what, sizeof what, "%s %s layer %d w2", arch, tdm_dtype_name(type), (int)l);
        check_cols(whole.e->be, what, &W->w2, w2, n_split, x, rows);
    }
    /* the head: vocabulary parts tiling [0, V) */
    for (int64_t i = 0; i < rows * E; i++) x[i] = tdm_test_randf(&rng, -1, 1);
    int64_t v_end = 0;
    for (int32_t r = 0; r < n_split; r++) {
        const tdm_model *mr = g->rank[r];
        cr_assert_eq(mr->vocab0, v_end, "rank %d's vocabulary starts at %d, not %lld", (int)r, (int)mr->vocab0,
                     (long long)v_end);
        const int64_t v0 = mr->vocab0, nv = mr->output.rows;
        snprintf(what, sizeof what, "%s %s rank %d output", arch, tdm_dtype_name(type), (int)r);
        check_rows(whole.e->be, what, &whole.m->output, &mr->output, &v0, &nv, 1, x, rows);
        v_end += nv;
    }
    cr_assert_eq(v_end, hp->n_vocab);
    free(x);
    eng_close(&split);
    eng_close(&whole);
}

Test(tp, every_weight_type_splits_like_the_whole, .timeout = 300) {
    const uint32_t types[] = {TDM_F32, TDM_F16, TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1, TDM_Q5_0, TDM_Q5_1,
                              TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};
    for (size_t i = 0; i < TDM_ARRAY_LEN(types); i++) check_weights(types[i], "llama", 2);
    check_weights(TDM_F32, "qwen2", 2);
    check_weights(TDM_Q8_0, "llama", 4);
}

/* Logits of the split model at every position against the whole model's; and its
 * KV caches against the whole's: rank r's KV head j is the whole's r G/n + j. */
static void check_forward(const char *what, const tdm_tiny_cfg *c, int32_t n_split, double tol) {
    eng whole, split;
    eng_open_ex(&whole, c, 0, 2, false);
    tp_open(&split, c, n_split);
    const int V = whole.m->hp.n_vocab;
    int32_t tok[N_TOK];
    random_tokens(tok, N_TOK, V, c->seed + 5);
    float *want = eng_logits_prefixes(&whole, tok, N_TOK), *got = eng_logits_prefixes(&split, tok, N_TOK);
    double worst = 0;
    for (int t = 0; t < N_TOK; t++)
        worst = fmax(worst, rel_err(got + (size_t)t * V, want + (size_t)t * V, (size_t)V));
    cr_log_info("%s, split %d ways: max normalised logit error %.3g", what, (int)n_split, worst);
    cr_expect(worst < tol, "%s, split %d ways: normalised logit error %.3g over %.1g", what, (int)n_split, worst, tol);
    free(want);
    free(got);

    /* the KV layout after one prefill of the prompt, both engines */
    tdm_err err = {0};
    tdm_seq sw, ss;
    int32_t *ids = malloc(sizeof tok);
    memcpy(ids, tok, sizeof tok);
    tdm_seq *seqs[2] = {&sw, &ss};
    eng *engs[2] = {&whole, &split};
    for (int k = 0; k < 2; k++) {
        memset(seqs[k], 0, sizeof *seqs[k]);
        seqs[k]->tokens = ids;
        seqs[k]->n_tokens = seqs[k]->cap = N_TOK;
        cr_assert_eq(tdm_engine_feed(engs[k]->e, seqs[k], false, 0, N_TOK, true, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s",
                     err.msg);
    }
    const tdm_kv_store *kw = &whole.e->kv_t;
    const size_t unit = (size_t)tdm_kv_unit_bytes(kw->type, kw->block_size, kw->head_dim);
    int32_t g0 = 0, n_ranks = 0;
    for (const tdm_kv_store *kr = &split.e->kv_t; kr; kr = kr->tp_next, n_ranks++) {
        cr_assert_eq(kr->n_kv_head, kw->n_kv_head / n_split);
        for (int32_t l = 0; l < kw->n_layer; l++)
            for (int32_t b = 0; b < sw.kv.n_blocks; b++)
                for (int32_t j = 0; j < kr->n_kv_head; j++) {
                    const float *a = (const float *)((const uint8_t *)kr->k[l] + ((size_t)ss.kv.blocks[b] * kr->n_kv_head + j) * unit);
                    const float *bw = (const float *)((const uint8_t *)kw->k[l] +
                                                      ((size_t)sw.kv.blocks[b] * kw->n_kv_head + g0 + j) * unit);
                    const double e = rel_err(a, bw, unit / sizeof(float));
                    cr_expect(e < (l == 0 ? 1e-5 : tol), "%s: layer %d block %d: rank %d's K of head %d vs the whole's "
                              "head %d: %.3g", what, (int)l, (int)b, (int)n_ranks, (int)j, (int)(g0 + j), e);
                }
        g0 += kr->n_kv_head;
    }
    cr_assert_eq(n_ranks, n_split);
    tdm_kv_seq_free(whole.e->pool, &sw.kv);
    tdm_kv_seq_free(split.e->pool, &ss.kv);
    cr_assert_eq(tdm_kv_pool_n_free(split.e->pool), tdm_kv_pool_n_blocks(split.e->pool), "KV blocks leaked");
    free(ids);
    eng_close(&split);
    eng_close(&whole);
}

Test(tp, split_forward_equals_the_whole, .timeout = 300) {
    tdm_tiny_cfg l = base_cfg(60); /* GQA: 4 heads, 2 KV heads */
    l.n_head_kv = 4;
    check_forward("llama f32", &l, 1, 1e-5);
    check_forward("llama f32", &l, 2, 1e-5);
    check_forward("llama f32", &l, 4, 1e-5);
    l.n_head_kv = 2;
    l.n_ff = 128;
    l.wtype = TDM_Q8_0;
    l.untied_output = true;
    check_forward("llama q8_0 GQA, untied", &l, 2, 1e-5);
    tdm_tiny_cfg q2 = base_cfg(61);
    q2.arch = "qwen2";
    check_forward("qwen2 (biases)", &q2, 2, 1e-5);
    tdm_tiny_cfg q3 = base_cfg(62);
    q3.arch = "qwen3";
    q3.head_dim = 32;
    check_forward("qwen3 (q / k norms, heads of 32)", &q3, 2, 1e-5);
    tdm_tiny_cfg g = base_cfg(63);
    g.arch = "gemma3";
    g.n_layer = 7;
    g.n_head_kv = 2;
    g.head_dim = 32;
    g.sliding_window = 8;
    g.rope_base = 1e6f;
    g.attn_softcap = 30;
    g.final_softcap = 20;
    check_forward("gemma3 (post norms, window, soft-caps)", &g, 2, 1e-5);
    tdm_tiny_cfg k = base_cfg(64);
    k.n_embd = 256;
    k.n_head = 2;
    k.head_dim = 256;
    k.n_ff = 512;
    k.wtype = TDM_Q4_K;
    check_forward("llama q4_k", &k, 2, TOL_QDOTK);
}

/* ------------------------------------------------------------ the pycode pair, public API */

static tandem_model *open_pycode(const char *file, int tp) {
    tandem_model_params mp = tandem_model_default_params();
    mp.tensor_parallel = tp;
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(tdm_test_model_path(file), &mp, &m), TANDEM_OK, "%s", tandem_last_error());
    return m;
}

static tandem_engine *open_eng(tandem_model *t, tandem_model *d, int n_seq) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    ep.n_seq_max = n_seq;
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(t, d, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    return e;
}

Test(tp, pycode_split_generates_what_the_whole_does, .timeout = 600) {
    tandem_model *whole = open_pycode("pycode-target-f16.gguf", 1), *split = open_pycode("pycode-target-f16.gguf", 2);
    tandem_model *draft = open_pycode("pycode-draft-s-f16.gguf", 1);
    tandem_model_info wi, si;
    cr_assert_eq(tandem_model_get_info(whole, &wi), TANDEM_OK);
    cr_assert_eq(tandem_model_get_info(split, &si), TANDEM_OK);
    cr_assert(si.tensor_parallel == 2 && wi.tensor_parallel == 1);
    cr_assert(si.n_head == wi.n_head && si.n_head_kv == wi.n_head_kv && si.n_ff == wi.n_ff && si.n_vocab == wi.n_vocab,
              "a split model reports the whole model's shapes");
    cr_assert_eq(si.kv_bytes_per_token * 2, wi.kv_bytes_per_token, "each rank caches half the KV heads");

    /* bad input: a degree that does not divide, a split draft */
    tandem_model_params mp = tandem_model_default_params();
    mp.tensor_parallel = 3;
    tandem_model *bad = NULL;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-target-f16.gguf"), &mp, &bad), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "2 KV heads do not divide by 3"), "%s", tandem_last_error());
    mp.tensor_parallel = 9;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-target-f16.gguf"), &mp, &bad), TANDEM_ERR_INVALID_ARG);
    tandem_engine *be = NULL;
    tandem_engine_params ep = tandem_engine_default_params();
    cr_assert_eq(tandem_engine_open(whole, split, &ep, &be), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "draft model is split"), "%s", tandem_last_error());

    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    const size_t N = tdm_test_sanitized() ? 3 : 8;
    tandem_engine *ew = open_eng(whole, NULL, 1), *es = open_eng(split, NULL, 1), *esd = open_eng(split, draft, 1);
    tandem_engine *eb = open_eng(split, draft, 4);
    tandem_request *req = calloc(N, sizeof *req);
    tandem_result *want = calloc(N, sizeof *want), *batch = calloc(N, sizeof *batch);
    int32_t **ids = calloc(N, sizeof *ids);
    for (size_t i = 0; i < N; i++) {
        size_t n;
        ids[i] = tdm_test_json_ids(tdm_json_get(refs[i * (n_lines / N)], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 24;
        cr_assert_eq(tandem_generate_ids(ew, ids[i], n, &gp, &want[i]), TANDEM_OK, "%s", tandem_last_error());
        tandem_result got;
        const char *how[] = {"split", "split, speculative chains", "split, trees of 16"};
        for (int k = 0; k < 3; k++) {
            gp.spec_tree = k == 2 ? 16 : 0;
            /* (chains of a fixed length: an adaptive one may rightly not speculate in a
             * short request, e.g. in the sanitizer build where the costs differ) */
            gp.spec_k = k == 1 ? 4 : 0;
            cr_assert_eq(tandem_generate_ids(k ? esd : es, ids[i], n, &gp, &got), TANDEM_OK, "%s", tandem_last_error());
            cr_assert(got.n_tokens == want[i].n_tokens &&
                          memcmp(got.tokens, want[i].tokens, got.n_tokens * sizeof(int32_t)) == 0,
                      "prompt %zu, %s: output differs from the whole model's", i, how[k]);
            if (k) cr_assert_gt(got.spec.drafted, 0, "prompt %zu, %s: nothing drafted", i, how[k]);
            tandem_result_free(&got);
        }
        req[i] = tandem_request_default();
        req[i].prompt_ids = ids[i];
        req[i].n_prompt_ids = n;
        req[i].params.max_tokens = 24;
        req[i].params.spec_tree = i % 2 ? 16 : 0;
    }
    cr_assert_eq(tandem_generate_batch(eb, req, N, batch), TANDEM_OK, "%s", tandem_last_error());
    for (size_t i = 0; i < N; i++) {
        cr_assert_eq(batch[i].status, TANDEM_OK, "%s", batch[i].error ? batch[i].error : "");
        cr_assert(batch[i].n_tokens == want[i].n_tokens &&
                      memcmp(batch[i].tokens, want[i].tokens, want[i].n_tokens * sizeof(int32_t)) == 0,
                  "prompt %zu, split, batched with a draft: output differs from the whole model's", i);
        tandem_result_free(&batch[i]);
        tandem_result_free(&want[i]);
        free(ids[i]);
    }
    free(req);
    free(want);
    free(batch);
    free(ids);
    tdm_test_jsonl_free(refs, n_lines);
    tandem_engine_close(eb);
    tandem_engine_close(esd);
    tandem_engine_close(es);
    tandem_engine_close(ew);
    tandem_model_close(draft);
    tandem_model_close(split);
    tandem_model_close(whole);
}
