/* fwd_testutil.c - the engine side of the forward-pass comparisons (fwd_testutil.h). */
#include "fwd_testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "dtype.h"
#include "kv_cache.h"
#include "ref_forward.h"
#include "testutil.h"

static void eng_open_with(eng *x, const tdm_tiny_cfg *cfg, int32_t prefill_chunk, int threads, bool tp,
                          int32_t kv_type) {
    tdm_err err = {0};
    x->path = tdm_tiny_model_file(cfg);
    cr_assert_eq(tdm_backend_cpu_create(1, &x->wbe, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(x->path, x->wbe, &x->m, &err), TANDEM_OK, "%s", err.msg);
    tdm_engine_cfg ec = {.n_threads = threads, .block_size = BLOCK_SIZE, .prefill_chunk = prefill_chunk,
                         .kv_type = kv_type};
    cr_assert_eq(tdm_engine_create(x->m, NULL, &ec, &x->e, &err), TANDEM_OK, "%s", err.msg);
    tdm_backend_cpu_set_tp(x->e->be, tp);
}

/* An f32 cache: these engines are compared with the double-precision reference at
 * f32 tolerances, which the default f16 cache's rounding of K and V would exceed
 * (the default is checked on its own: eng_open_kv, forward_ref.f16_kv_default). */
void eng_open_ex(eng *x, const tdm_tiny_cfg *cfg, int32_t prefill_chunk, int threads, bool tp) {
    eng_open_with(x, cfg, prefill_chunk, threads, tp, TANDEM_KV_F32);
}

void eng_open_kv(eng *x, const tdm_tiny_cfg *cfg, int32_t kv_type) { eng_open_with(x, cfg, 0, 2, true, kv_type); }

void eng_open(eng *x, const tdm_tiny_cfg *cfg, int32_t prefill_chunk) {
    eng_open_ex(x, cfg, prefill_chunk, 2, true);
}

void eng_close(eng *x) {
    tdm_engine_free(x->e);
    tdm_model_free(x->m);
    tdm_backend_destroy(x->wbe);
    unlink(x->path);
    free(x->path);
}

/* Engine logits at every position: the last row of each prefix.  [n][V] */
float *eng_logits_prefixes(eng *x, const int32_t *tok, int n) {
    int V = x->m->hp.n_vocab;
    float *out = malloc((size_t)n * V * sizeof(float));
    tdm_err err = {0};
    for (int t = 0; t < n; t++)
        cr_assert_eq(tdm_engine_score_last(x->e, false, tok, t + 1, out + (size_t)t * V, &err), TANDEM_OK,
                     "prefix %d: %s", t + 1, err.msg);
    cr_assert_eq(tdm_kv_pool_n_free(x->e->pool), tdm_kv_pool_n_blocks(x->e->pool), "KV blocks leaked");
    return out;
}

/* Engine logits at every position, feeding one row per forward.  [n][V] */
float *eng_logits_rowwise(eng *x, const int32_t *tok, int n) {
    int V = x->m->hp.n_vocab;
    float *out = malloc((size_t)n * V * sizeof(float));
    int32_t *ids = malloc((size_t)n * sizeof(int32_t));
    memcpy(ids, tok, (size_t)n * sizeof(int32_t));
    tdm_seq s;
    memset(&s, 0, sizeof s);
    s.tokens = ids;
    s.n_tokens = s.cap = n;
    tdm_err err = {0};
    for (int t = 0; t < n; t++) {
        cr_assert_eq(tdm_engine_feed(x->e, &s, false, t, t + 1, true, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s",
                     err.msg);
        cr_assert_eq(x->e->be->ops->download(x->e->be, out + (size_t)t * V, x->e->logits_t,
                                             (size_t)V * sizeof(float), &err),
                     TANDEM_OK);
    }
    tdm_kv_seq_free(x->e->pool, &s.kv);
    free(ids);
    return out;
}

void random_tokens(int32_t *tok, int n, int V, uint64_t seed) {
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)V);
}

/* Max over positions of ||a - b|| / ||b|| (b the reference). */
double max_rel_err(const float *eng_l, const double *ref_l, int n, int V, int *worst) {
    double mx = 0;
    *worst = 0;
    for (int t = 0; t < n; t++) {
        double d2 = 0, r2 = 0;
        for (int i = 0; i < V; i++) {
            double r = ref_l[(size_t)t * V + i], d = (double)eng_l[(size_t)t * V + i] - r;
            d2 += d * d;
            r2 += r * r;
        }
        double e = sqrt(d2) / sqrt(r2);
        if (!(e <= mx)) {
            mx = e;
            *worst = t;
        }
    }
    return mx;
}

double check_case(const char *what, const tdm_tiny_cfg *cfg, double tol) {
    return check_case_kv(what, cfg, tol, TANDEM_KV_F32);
}

double check_case_kv(const char *what, const tdm_tiny_cfg *cfg, double tol, int32_t kv_type) {
    eng x;
    eng_open_kv(&x, cfg, kv_type);
    ref_model rm;
    ref_load(x.path, &rm);
    cr_assert_eq(rm.V, x.m->hp.n_vocab);
    cr_assert_eq(rm.tied, x.m->hp.tied_output, "%s: tied output detection differs", what);
    int32_t tok[N_TOK];
    random_tokens(tok, N_TOK, rm.V, cfg->seed * 31 + 5);
    double *ref = ref_forward(&rm, tok, N_TOK);
    float *got = eng_logits_prefixes(&x, tok, N_TOK);
    int worst;
    double e = max_rel_err(got, ref, N_TOK, rm.V, &worst);
    cr_log_info("%s: max normalised logit error %.3g (position %d)", what, e, worst);
    cr_expect(e < tol, "%s: normalised logit error %.3g at position %d exceeds %.1g", what, e, worst, tol);
    free(ref);
    free(got);
    ref_free(&rm);
    eng_close(&x);
    return e;
}

double type_tol(uint32_t t) {
    if (t == TDM_F32) return TOL_F32;
    if (t == TDM_F16 || t == TDM_BF16 || t == TDM_Q8_0 || t == TDM_Q4_0) return TOL_QUANT;
    return tdm_dtype_is_kquant(t) ? TOL_QDOTK : TOL_QDOT32;
}

tdm_tiny_cfg base_cfg(uint64_t seed) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.n_vocab = 48;
    c.seed = seed;
    return c;
}

tdm_tiny_cfg qwen3moe_cfg(uint64_t seed) {
    tdm_tiny_cfg c = base_cfg(seed);
    c.arch = "qwen3moe";
    c.head_dim = 32;
    c.n_ff = 32;
    c.n_expert = 8;
    c.n_expert_used = 2;
    return c;
}

tdm_tiny_cfg mixtral_cfg(uint64_t seed) {
    tdm_tiny_cfg c = base_cfg(seed);
    c.n_layer = 3;
    c.n_expert = 4;
    c.n_expert_used = 2;
    return c;
}

/* ------------------------------------------------------------ sharp comparisons */

double cmp_err(const cmp *c) {
    double *ref = ref_forward(&c->rm, c->tok, N_TOK);
    int worst;
    double e = max_rel_err(c->got, ref, N_TOK, c->rm.V, &worst);
    free(ref);
    return e;
}

void cmp_open(cmp *c, const tdm_tiny_cfg *cfg, const char *what) {
    eng_open(&c->x, cfg, 0);
    ref_load(c->x.path, &c->rm);
    random_tokens(c->tok, N_TOK, c->rm.V, cfg->seed * 31 + 5);
    c->got = eng_logits_prefixes(&c->x, c->tok, N_TOK);
    double e = cmp_err(c);
    cr_log_info("%s: %.3g", what, e);
    cr_assert_lt(e, TOL_F32, "%s: normalised logit error %.3g", what, e);
}

void cmp_expect_far(const cmp *c, const char *what, double min) {
    double e = cmp_err(c);
    cr_log_info("reference %s: %.3g", what, e);
    cr_assert_gt(e, min, "a reference %s agrees with the engine (%.3g)", what, e);
}

void cmp_close(cmp *c) {
    free(c->got);
    ref_free(&c->rm);
    eng_close(&c->x);
}

/* ------------------------------------------------------------ batch invariance */

void check_batch_invariance(const tdm_tiny_cfg *c, const char *what) {
    eng whole, chunked;
    eng_open(&whole, c, 0);   /* prefill of <= 256 rows: one forward */
    eng_open(&chunked, c, 7); /* prefill in forwards of 7 rows */
    int V = whole.m->hp.n_vocab;
    int32_t tok[N_TOK];
    random_tokens(tok, N_TOK, V, c->seed + 1000);
    float *a = eng_logits_prefixes(&whole, tok, N_TOK);
    float *b = eng_logits_prefixes(&chunked, tok, N_TOK);
    float *r = eng_logits_rowwise(&whole, tok, N_TOK);
    cr_assert_eq(tdm_kv_pool_n_free(whole.e->pool), tdm_kv_pool_n_blocks(whole.e->pool));
    for (int t = 0; t < N_TOK; t++) {
        for (int i = 0; i < V; i++) {
            size_t k = (size_t)t * V + i;
            cr_assert(memcmp(&a[k], &r[k], sizeof(float)) == 0,
                      "%s position %d token %d: one batch %.9g vs one row at a time %.9g", what, t, i, a[k], r[k]);
            cr_assert(memcmp(&b[k], &r[k], sizeof(float)) == 0,
                      "%s position %d token %d: chunks of 7 %.9g vs one row at a time %.9g", what, t, i, b[k], r[k]);
        }
    }
    free(a);
    free(b);
    free(r);
    eng_close(&whole);
    eng_close(&chunked);
}

/* ------------------------------------------------------------ tensor-parallel blocks */

void check_tp(const char *what, const tdm_tiny_cfg *cfg, int threads, int runs_rule) {
    const uint64_t seed = cfg->seed;
    eng tp, ops, tp7;
    eng_open_ex(&tp, cfg, 0, threads, true);
    eng_open_ex(&ops, cfg, 0, threads, false);
    eng_open_ex(&tp7, cfg, 7, threads, true);
    ref_model rm;
    ref_load(tp.path, &rm);
    int V = rm.V, worst;
    int32_t tok[N_TOK];
    random_tokens(tok, N_TOK, V, seed * 7 + 3);
    uint64_t runs0 = tdm_backend_cpu_blocks_runs(tp.e->be);
    float *a = eng_logits_prefixes(&tp, tok, N_TOK);
    uint64_t runs = tdm_backend_cpu_blocks_runs(tp.e->be) - runs0;
    bool want = runs_rule == 2 ? tp.m->layers[0].wqkv.layout == TDM_LAYOUT_ROWS : runs_rule == 1;
    cr_assert_eq(runs > 0, want, "%s: the blocks op ran %llu forwards (expected it %s)", what,
                 (unsigned long long)runs, want ? "to run" : "to decline");
    cr_assert_eq(tdm_backend_cpu_blocks_runs(ops.e->be), 0, "%s: blocks ran with tensor parallelism off", what);

    /* against the double-precision reference and the op-by-op forward */
    double *ref = ref_forward(&rm, tok, N_TOK);
    double e = max_rel_err(a, ref, N_TOK, V, &worst);
    cr_log_info("%s: tensor parallel vs reference %.3g", what, e);
    cr_assert(e < type_tol(cfg->wtype), "%s: normalised logit error %.3g at position %d", what, e, worst);
    float *b = eng_logits_prefixes(&ops, tok, N_TOK);
    double *bd = malloc((size_t)N_TOK * V * sizeof(double));
    for (size_t i = 0; i < (size_t)N_TOK * V; i++) bd[i] = b[i];
    e = max_rel_err(a, bd, N_TOK, V, &worst);
    /* f32 rounding apart; the integer-dot types round each matmul's x to int8, where an
     * input one ulp off can land one step away (measured: 0 to 1.4 %) */
    const double tol_ops = tdm_dtype_block_elems(cfg->wtype) > 1 && type_tol(cfg->wtype) > TOL_QUANT ? type_tol(cfg->wtype)
                                                                                                   : 1e-5;
    cr_assert(e < tol_ops, "%s: tensor parallel vs op by op %.3g at position %d", what, e, worst);

    /* one batch, chunks of 7 and one row at a time: the same bits */
    float *a7 = eng_logits_prefixes(&tp7, tok, N_TOK);
    float *r = eng_logits_rowwise(&tp, tok, N_TOK);
    for (size_t k = 0; k < (size_t)N_TOK * V; k++) {
        cr_assert(memcmp(&a[k], &r[k], 4) == 0, "%s: one batch vs one row at a time at %zu", what, k);
        cr_assert(memcmp(&a7[k], &r[k], 4) == 0, "%s: chunks of 7 vs one row at a time at %zu", what, k);
    }
    free(a);
    free(a7);
    free(r);
    free(b);
    free(bd);
    free(ref);
    ref_free(&rm);
    eng_close(&tp);
    eng_close(&ops);
    eng_close(&tp7);
}
