/* test_draft_vocab.c - the draft's head over part of the vocabulary
 * (tandem_engine_params.draft_vocab, src/model/vocab_head.h):
 *   - the subset's ids: [0, N) and every special and end-of-generation token, ascending,
 *     a bad N refused (GPT-2's and StarCoder's vocabularies; Qwen2.5's when the real
 *     pair is in models/real/);
 *   - the scatter_cols op against a plain loop, and its refusals;
 *   - a forward through such a head (a general map of head rows to tokens, not only a
 *     prefix) gives the whole head's logits on its ids and TDM_LOGIT_NONE elsewhere,
 *     for every output kind (exact, the quantised copy's approximate logits, greedy
 *     argmax) and several rows at once, on a tied f32 and an untied Q8_0 model;
 *   - the engine's draft_vocab: its range checks, auto, and greedy speculative output
 *     with the pycode pair and N below the vocabulary equal to target-only output,
 *     chains and trees. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "engine.h"
#include "kv_cache.h"
#include "scheduler.h"
#include "testutil.h"
#include "tiny_model.h"
#include "vocab_head.h"

/* ---- the subset's ids ---------------------------------------------------------- */

static tdm_tokenizer *load_tok(const char *path, tdm_gguf **g) {
    tdm_err err = {0};
    tdm_tokenizer *t;
    cr_assert_eq(tdm_gguf_open(path, g, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_tokenizer_load(*g, &t, &err), TANDEM_OK, "%s", err.msg);
    return t;
}

/* ids of N tokens: ascending, [0, N) first, then exactly the specials and
 * end-of-generation ids at or above N. */
static void expect_subset(const tdm_tokenizer *t, int32_t n_vocab, int32_t n, int32_t *n_out) {
    tdm_err err = {0};
    int32_t *ids, n_ids;
    cr_assert_eq(tdm_vocab_subset_ids(t, n_vocab, n, &ids, &n_ids, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_geq(n_ids, n);
    for (int32_t i = 0; i < n; i++) cr_assert_eq(ids[i], i);
    for (int32_t i = 1; i < n_ids; i++) cr_assert_gt(ids[i], ids[i - 1], "not ascending at %d", (int)i);
    int32_t want = n;
    for (int32_t id = n; id < n_vocab; id++) want += tdm_tok_is_special(t, id) || tdm_tok_is_eog(t, id);
    cr_assert_eq(n_ids, want);
    for (int32_t i = n; i < n_ids; i++)
        cr_assert(tdm_tok_is_special(t, ids[i]) || tdm_tok_is_eog(t, ids[i]), "id %d is not special", (int)ids[i]);
    const int32_t *eog;
    const int32_t n_eog = tdm_tok_eog_ids(t, &eog);
    for (int32_t e = 0; e < n_eog; e++) {
        bool found = false;
        for (int32_t i = 0; i < n_ids && !found; i++) found = ids[i] == eog[e];
        cr_assert(found, "end-of-generation id %d missing", (int)eog[e]);
    }
    free(ids);
    *n_out = n_ids;
}

Test(draft_vocab, subset_ids) {
    tdm_gguf *g;
    tdm_tokenizer *t = load_tok(tdm_test_data_path("vocab/ggml-vocab-gpt-2.gguf"), &g);
    const int32_t V = tdm_tok_n_vocab(t);
    int32_t n;
    expect_subset(t, V, 1024, &n);
    cr_assert_eq(n, 1025, "GPT-2: [0, 1024) and <|endoftext|>"); /* (50256: control, EOS) */
    expect_subset(t, V, V, &n);
    cr_assert_eq(n, V);
    tdm_err err = {0};
    int32_t *ids, n_ids;
    cr_assert_eq(tdm_vocab_subset_ids(t, V, 0, &ids, &n_ids, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_vocab_subset_ids(t, V, V + 1, &ids, &n_ids, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "out of range"), "%s", err.msg);
    tdm_tokenizer_free(t);
    tdm_gguf_close(g);
    /* StarCoder: its special tokens lead the vocabulary */
    t = load_tok(tdm_test_data_path("vocab/ggml-vocab-starcoder.gguf"), &g);
    expect_subset(t, tdm_tok_n_vocab(t), 1024, &n);
    cr_assert_eq(n, 1024);
    expect_subset(t, tdm_tok_n_vocab(t), 5, &n); /* [0, 5) and the specials past it */
    cr_assert_gt(n, 5);
    tdm_tokenizer_free(t);
    tdm_gguf_close(g);
}

/* Qwen2.5's: the chat's end-of-turn and end-of-text tokens (ids past 151643) come
 * with any N. */
Test(draft_vocab, subset_ids_qwen) {
    const char *path = tdm_test_model_path("real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    if (access(path, R_OK) != 0) cr_skip_test("%s absent", path); /* (a warning and a return made the run exit 1) */
    tdm_gguf *g;
    tdm_tokenizer *t = load_tok(path, &g);
    int32_t n;
    expect_subset(t, tdm_tok_n_vocab(t), TANDEM_DRAFT_VOCAB_AUTO_N, &n);
    cr_log_info("Qwen2.5, N = %d: %d ids", TANDEM_DRAFT_VOCAB_AUTO_N, (int)n);
    tdm_err err = {0};
    int32_t *ids, n_ids;
    cr_assert_eq(tdm_vocab_subset_ids(t, tdm_tok_n_vocab(t), TANDEM_DRAFT_VOCAB_AUTO_N, &ids, &n_ids, &err), TANDEM_OK);
    int32_t *tok;
    size_t n_tok;
    for (int k = 0; k < 2; k++) {
        const char *s = k ? "<|im_end|>" : "<|endoftext|>";
        cr_assert_eq(tdm_tokenize(t, s, strlen(s), false, true, &tok, &n_tok, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(n_tok, 1);
        cr_assert_gt(tok[0], TANDEM_DRAFT_VOCAB_AUTO_N);
        bool found = false;
        for (int32_t i = 0; i < n_ids && !found; i++) found = ids[i] == tok[0];
        cr_assert(found, "%s (%d) is not in the subset", s, (int)tok[0]);
        free(tok);
    }
    free(ids);
    tdm_tokenizer_free(t);
    tdm_gguf_close(g);
}

/* ---- the scatter_cols op ------------------------------------------------------- */

Test(draft_vocab, scatter_cols_op) {
    tdm_err err = {0};
    tdm_backend *be;
    cr_assert_eq(tdm_backend_cpu_create(2, &be, &err), TANDEM_OK, "%s", err.msg);
    enum { N = 3, NX = 5, DIM = 16 };
    const int32_t ids[NX] = {0, 4, 7, 8, 15};
    float x[N][NX], y[N][DIM];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < NX; j++) x[i][j] = (float)(10 * i + j) - 7.5f;
    memset(y, 0x7f, sizeof y);
    cr_assert_eq(be->ops->scatter_cols(be, &x[0][0], N, NX, ids, DIM, TDM_LOGIT_NONE, &y[0][0], &err), TANDEM_OK,
                 "%s", err.msg);
    for (int i = 0; i < N; i++)
        for (int v = 0; v < DIM; v++) {
            float want = TDM_LOGIT_NONE;
            for (int j = 0; j < NX; j++)
                if (ids[j] == v) want = x[i][j];
            cr_assert_eq(y[i][v], want, "row %d, column %d", i, v);
        }
    cr_assert_eq(be->ops->scatter_cols(be, &x[0][0], 0, NX, ids, DIM, 0, &y[0][0], &err), TANDEM_OK);
    const int32_t down[NX] = {0, 4, 4, 8, 15}, out[NX] = {0, 4, 7, 8, 16};
    cr_assert_eq(be->ops->scatter_cols(be, &x[0][0], N, NX, down, DIM, 0, &y[0][0], &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(be->ops->scatter_cols(be, &x[0][0], N, NX, out, DIM, 0, &y[0][0], &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(be->ops->scatter_cols(be, &x[0][0], N, NX, ids, 4, 0, &y[0][0], &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(be->ops->scatter_cols(be, NULL, N, NX, ids, DIM, 0, &y[0][0], &err), TANDEM_ERR_INVALID_ARG);
    /* the fill is finite and gives probability 0 next to any real logit, at any
     * temperature; a logit pushed down by -FLT_MAX (the benchmark oracle) stays finite */
    cr_assert(isfinite(TDM_LOGIT_NONE) && isfinite(TDM_LOGIT_NONE - FLT_MAX));
    const float l[3] = {TDM_LOGIT_NONE, -80.0f, TDM_LOGIT_NONE};
    float p[3];
    for (int k = 0; k < 3; k++) {
        const tdm_sampler_params sp = {.temperature = k == 0 ? 0.05f : k == 1 ? 1.0f : 1e6f, .top_p = 1.0f};
        tdm_probs_from_logits(l, 3, &sp, NULL, p);
        cr_assert(p[0] == 0 && p[1] == 1 && p[2] == 0, "temperature %g: %g %g %g", (double)sp.temperature,
                  (double)p[0], (double)p[1], (double)p[2]);
    }
    cr_assert(tdm_logits_finite(l, 3));
    cr_assert_eq(tdm_argmax_finite(l, 3), 1);
    tdm_backend_destroy(be);
}

/* ---- a forward through a head over part of the vocabulary ------------------------ */

#define N_ROWS 24

typedef struct rig {
    char *path;
    tdm_backend *wbe;
    tdm_model *m;
    tdm_engine *e; /* the model as its own draft */
    int32_t V;
} rig;

static void rig_open(rig *r, tdm_tiny_cfg *cfg) {
    tdm_err err = {0};
    r->path = tdm_tiny_model_file(cfg);
    cr_assert_eq(tdm_backend_cpu_create(1, &r->wbe, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(r->path, r->wbe, &r->m, &err), TANDEM_OK, "%s", err.msg);
    tdm_engine_cfg ec = {.n_threads = 2, .kv_type = TANDEM_KV_F32};
    cr_assert_eq(tdm_engine_create(r->m, r->m, &ec, &r->e, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_null(r->e->fs_d.vhead, "a vocabulary of %d has no subset by default", (int)r->m->hp.n_vocab);
    r->V = r->m->hp.n_vocab;
}

static void rig_close(rig *r) {
    tdm_engine_free(r->e);
    tdm_model_free(r->m);
    tdm_backend_destroy(r->wbe);
    unlink(r->path);
    free(r->path);
}

/* One draft forward over tok[0, N_ROWS), every row wanting an output of this kind:
 * logits rows into out[N_ROWS][V] (the argmax kind: ids into out_ids). */
static void draft_rows(rig *r, const int32_t *tok, tdm_fwd_kind kind, float *out, int32_t *out_ids) {
    tdm_engine *e = r->e;
    tdm_err err = {0};
    tdm_kv_seq kv = {0};
    const tdm_kv_seq *seqs[1] = {&kv};
    cr_assert_eq(tdm_kv_seq_reserve(e->pool, &kv, N_ROWS, &err), TANDEM_OK, "%s", err.msg);
    tdm_batch_clear(&e->batch);
    for (int32_t p = 0; p < N_ROWS; p++) tdm_batch_add(&e->batch, tok[p], p, 0, p, true);
    cr_assert_eq(tdm_engine_forward(e, true, &e->batch, seqs, kind, &err), TANDEM_OK, "%s", err.msg);
    if (kind == TDM_FWD_ARGMAX) memcpy(out_ids, e->ids, N_ROWS * sizeof *out_ids);
    else memcpy(out, e->logits_d, (size_t)N_ROWS * (size_t)r->V * sizeof(float));
    /* the forward the GPU's draft chains call (backend memory: host memory here) */
    if (kind == TDM_FWD_LOGITS) {
        cr_assert_eq(tdm_model_forward_dev(r->m, e->be, &e->kv_d, &e->batch, seqs, &e->fs_d, NULL, e->out_d, NULL, NULL,
                                           &err),
                     TANDEM_OK, "%s", err.msg);
        cr_assert_eq(memcmp(out, e->out_d, (size_t)N_ROWS * (size_t)r->V * sizeof(float)), 0,
                     "tdm_model_forward_dev's logits differ from tdm_model_forward_ex's");
    }
    tdm_kv_seq_free(e->pool, &kv);
}

static void check_head(tdm_tiny_cfg cfg, const char *what) {
    rig r;
    rig_open(&r, &cfg);
    const int32_t V = r.V;
    /* a general map: every third token, the last, and a run in the middle */
    int32_t ids[96], n = 0;
    bool in[96] = {false};
    for (int32_t v = 0; v < V; v++)
        if (v % 3 == 1 || v == V - 1 || (v >= 20 && v < 26)) ids[n++] = v, in[v] = true;
    int32_t tok[N_ROWS];
    uint64_t rng = 5;
    for (int i = 0; i < N_ROWS; i++) tok[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)V);
    float *whole = malloc((size_t)N_ROWS * V * sizeof(float)), *sub = malloc((size_t)N_ROWS * V * sizeof(float));
    int32_t am_whole[N_ROWS], am_sub[N_ROWS];
    tdm_err err = {0};
    const tdm_fwd_kind kinds[3] = {TDM_FWD_LOGITS, TDM_FWD_LOGITS_APPROX, TDM_FWD_ARGMAX};
    bool qcopy = false;
    for (int k = 0; k < 3; k++) {
        /* the whole head's output (for the argmax kind: its exact logits) */
        cr_assert_eq(tdm_engine_set_draft_vocab(r.e, NULL, 0, &err), TANDEM_OK);
        draft_rows(&r, tok, kinds[k] == TDM_FWD_ARGMAX ? TDM_FWD_LOGITS : kinds[k], whole, am_whole);
        cr_assert_eq(tdm_engine_set_draft_vocab(r.e, ids, n, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(r.e->vhead.n, n);
        cr_assert_eq(r.e->vhead.has_qhead, r.m->has_qhead, "the subset's head has a quantised copy iff the whole has");
        qcopy = r.e->vhead.has_qhead;
        draft_rows(&r, tok, kinds[k], sub, am_sub);
        for (int i = 0; i < N_ROWS; i++) {
            if (kinds[k] == TDM_FWD_ARGMAX) { /* the whole row's argmax among the subset */
                const float *l = whole + (size_t)i * V;
                int32_t best = -1;
                for (int32_t j = 0; j < n; j++)
                    if (best < 0 || l[ids[j]] > l[best]) best = ids[j];
                cr_assert_eq(am_sub[i], best, "%s, row %d: argmax %d, over the subset %d", what, i, (int)am_sub[i],
                             (int)best);
                continue;
            }
            const float *w = whole + (size_t)i * V, *s = sub + (size_t)i * V;
            double scale = 0;
            for (int32_t v = 0; v < V; v++) scale = fmax(scale, fabs(w[v]));
            for (int32_t v = 0; v < V; v++) {
                if (!in[v]) {
                    cr_assert_eq(s[v], TDM_LOGIT_NONE, "%s, kind %d, row %d, token %d outside", what, k, i, (int)v);
                    continue;
                }
                cr_assert_leq(fabs(s[v] - w[v]), 1e-6 * scale, "%s, kind %d, row %d, token %d: %g, whole %g", what, k,
                              i, (int)v, (double)s[v], (double)w[v]);
            }
        }
    }
    cr_log_info("%s: %d of %d tokens, quantised copy %s", what, (int)n, (int)V, qcopy ? "yes" : "no");
    /* ids not ascending or out of range are refused, and leave the whole head */
    int32_t bad[3] = {4, 2, 9};
    cr_assert_eq(tdm_engine_set_draft_vocab(r.e, bad, 3, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(r.e->fs_d.vhead);
    bad[0] = 1, bad[1] = 2, bad[2] = V;
    cr_assert_eq(tdm_engine_set_draft_vocab(r.e, bad, 3, &err), TANDEM_ERR_INVALID_ARG);
    free(whole);
    free(sub);
    rig_close(&r);
}

Test(draft_vocab, forward_tied_f32) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.n_vocab = 80;
    check_head(c, "tied f32");
}

/* An untied Q8_0 head, as the real draft's: on a CPU with int8 dot products it has a
 * quantised copy (head_argmax, qhead_logits), and so has the subset's head. */
Test(draft_vocab, forward_untied_q8_0) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.n_vocab = 80;
    c.n_embd = 64;
    c.n_ff = 128;
    c.wtype = TDM_Q8_0;
    c.untied_output = true;
    check_head(c, "untied q8_0");
}

/* ---- the engine's draft_vocab --------------------------------------------------- */

static tdm_backend *g_wbe;
static tdm_model *g_target, *g_draft;

static void pair_setup(void) { tdm_test_pair_load("pycode-draft-s-f16.gguf", &g_wbe, &g_target, &g_draft); }
static void pair_teardown(void) { tdm_test_pair_free(g_wbe, g_target, g_draft); }

static tandem_status open_engine(int32_t draft_vocab, tdm_engine **e, tdm_err *err) {
    tdm_engine_cfg cfg = {.n_threads = 2, .draft_vocab = draft_vocab};
    return tdm_engine_create(g_target, g_draft, &cfg, e, err);
}

Test(draft_vocab, engine_values, .init = pair_setup, .fini = pair_teardown) {
    tdm_err err = {0};
    tdm_engine *e = NULL;
    const int32_t V = g_target->hp.n_vocab; /* 8192 */
    const int32_t bad[] = {-2, 1, TANDEM_DRAFT_VOCAB_MIN - 1, V + 1, INT32_MAX};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bad); i++) {
        cr_assert_eq(open_engine(bad[i], &e, &err), TANDEM_ERR_INVALID_ARG, "draft_vocab %d", (int)bad[i]);
        cr_assert(strstr(err.msg, "draft_vocab") && strstr(err.msg, "out of range"), "%s", err.msg);
    }
    /* auto: a vocabulary of 8192 keeps the whole head; 0 and V too */
    const int32_t whole[] = {TANDEM_DRAFT_VOCAB_AUTO, 0, V};
    for (size_t i = 0; i < TDM_ARRAY_LEN(whole); i++) {
        cr_assert_eq(open_engine(whole[i], &e, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_null(e->fs_d.vhead, "draft_vocab %d", (int)whole[i]);
        tdm_engine_free(e);
    }
    cr_assert_eq(open_engine(TANDEM_DRAFT_VOCAB_MIN, &e, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(e->fs_d.vhead, &e->vhead);
    cr_assert_eq(e->vhead.n, TANDEM_DRAFT_VOCAB_MIN, "pycode's one special token (0) is in [0, N)");
    cr_assert_eq(e->vhead.w.rows, TANDEM_DRAFT_VOCAB_MIN);
    tdm_engine_free(e);
    /* a target-only engine takes any value in range and makes no head */
    tdm_engine_cfg cfg = {.n_threads = 1, .draft_vocab = 2048};
    cr_assert_eq(tdm_engine_create(g_target, NULL, &cfg, &e, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_null(e->fs_d.vhead);
    tdm_engine_free(e);
    cr_assert_eq(tdm_draft_vocab_rows(TANDEM_DRAFT_VOCAB_AUTO, 151936), TANDEM_DRAFT_VOCAB_AUTO_N);
    cr_assert_eq(tdm_draft_vocab_rows(TANDEM_DRAFT_VOCAB_AUTO, TANDEM_DRAFT_VOCAB_AUTO_ABOVE), 0);
    /* the public API names the problem */
    tandem_model *t, *d;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-target-f16.gguf"), NULL, &t), TANDEM_OK);
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-draft-xs-f16.gguf"), NULL, &d), TANDEM_OK);
    tandem_engine_params ep = tandem_engine_default_params();
    cr_assert_eq(ep.draft_vocab, TANDEM_DRAFT_VOCAB_AUTO);
    ep.n_threads = 1;
    ep.draft_vocab = 100;
    tandem_engine *te = NULL;
    cr_assert_eq(tandem_engine_open(t, d, &ep, &te), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "draft_vocab 100 is out of range"), "%s", tandem_last_error());
    cr_assert_null(te);
    tandem_model_close(d);
    tandem_model_close(t);
}

/* Greedy speculation with the draft's head over 1024 or 2048 of the 8192 tokens gives
 * the target-only tokens: chains (k 4, adaptive) and trees (a dynamic one of 12 nodes,
 * a static 3,2,1), on 12 dev prompts; the draft still gets tokens accepted. */
Test(draft_vocab, greedy_equals_target_only, .init = pair_setup, .fini = pair_teardown, .timeout = 600) {
    size_t n_lines;
    tdm_json **refs = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n_lines);
    tdm_err err = {0};
    tdm_engine *plain, *spec[2];
    cr_assert_eq(open_engine(0, &plain, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(open_engine(1024, &spec[0], &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(open_engine(2048, &spec[1], &err), TANDEM_OK, "%s", err.msg);
    uint64_t drafted[2] = {0}, accepted[2] = {0}, tree_steps = 0;
    const size_t n_prompts = tdm_test_sanitized() ? 3 : 12;
    for (size_t li = 0; li < n_prompts; li++) {
        size_t n;
        int32_t *ids = tdm_test_json_ids(tdm_json_get(refs[li * 8], "prompt_ids"), &n);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 48;
        gp.spec_ngram = 0;
        tandem_result want;
        cr_assert_eq(tdm_generate_one(plain, ids, (int32_t)n, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        for (int c = 0; c < 4; c++) {
            const int s = (int)((li + (size_t)c) % 2);
            tandem_generate_params g = gp;
            g.spec_k = c == 0 ? 4 : 0;
            g.spec_tree = c == 2 ? 12 : 0;
            g.spec_tree_shape = c == 3 ? "3,2,1" : NULL;
            tandem_result got;
            cr_assert_eq(tdm_generate_one(spec[s], ids, (int32_t)n, &g, &got, &err), TANDEM_OK, "%s", err.msg);
            size_t d = 0;
            while (d < got.n_tokens && d < want.n_tokens && got.tokens[d] == want.tokens[d]) d++;
            cr_assert(d == got.n_tokens && d == want.n_tokens,
                      "prompt %zu, draft_vocab %d, configuration %d: differs from target-only at token %zu (lengths "
                      "%zu / %zu)",
                      li * 8, s ? 2048 : 1024, c, d, got.n_tokens, want.n_tokens);
            cr_assert_eq(tdm_kv_pool_n_free(spec[s]->pool), tdm_kv_pool_n_blocks(spec[s]->pool), "KV blocks leaked");
            drafted[s] += got.spec.drafted;
            accepted[s] += got.spec.accepted;
            tree_steps += got.spec.tree_steps;
            tandem_result_free(&got);
        }
        tandem_result_free(&want);
        free(ids);
    }
    for (int s = 0; s < 2; s++) {
        cr_log_info("draft_vocab %d: %llu of %llu drafted tokens accepted", s ? 2048 : 1024,
                    (unsigned long long)accepted[s], (unsigned long long)drafted[s]);
        cr_assert_gt(accepted[s], 0);
    }
    cr_assert_gt(tree_steps, 0, "no tree was verified");
    tdm_engine_free(plain);
    tdm_engine_free(spec[0]);
    tdm_engine_free(spec[1]);
    tdm_test_jsonl_free(refs, n_lines);
}
