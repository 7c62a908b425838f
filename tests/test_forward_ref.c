/* test_forward_ref.c - the engine's forward pass against a plain C reference on
 * tiny random-weight models (tests/tiny_model.c).
 *
 * The reference reads the GGUF itself (src/gguf.h), dequantises every weight with
 * tdm_row_to_f32 and runs the textbook llama / qwen2 forward in double precision
 * over the whole token sequence (causal attention, no KV cache).  The engine's
 * logits at every position (tdm_engine_score_last on each prefix) must match with
 * a normalised error ||engine - ref|| / ||ref|| below a tight tolerance: both sides
 * use the same dequantised weights, so only f32 rounding separates them.
 *
 * Also: prefill in chunks vs. one row at a time gives bit-identical logits
 * (batch invariance) for every weight type; the CPU backend's tensor-parallel
 * blocks match the reference, the op-by-op forward and themselves across batch
 * shapes, and run exactly where their shape rules say.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "dtype.h"
#include "engine.h"
#include "gguf.h"
#include "kv_cache.h"
#include "testutil.h"
#include "tiny_model.h"

#define N_TOK 40        /* prompt length: crosses KV blocks of 16 */
#define BLOCK_SIZE 16

/* ------------------------------------------------------------ reference model */

typedef struct ref_layer {
    float *attn_norm, *ffn_norm; /* [E] */
    float *wq;                   /* [H*hd][E] */
    float *wk, *wv;              /* [Hkv*hd][E] */
    float *bq;                   /* [H*hd] or NULL */
    float *bk, *bv;              /* [Hkv*hd] or NULL */
    float *wo;                   /* [E][H*hd] */
    float *wg, *wu;              /* [F][E] */
    float *wd;                   /* [E][F] */
} ref_layer;

typedef struct ref_model {
    int E, L, H, Hkv, hd, F, V, n_rot;
    double eps, base, freq_scale;
    bool neox;       /* qwen2: rotate (i, i + n_rot/2); llama: (2i, 2i+1) */
    bool tied;       /* no output.weight: the head is token_embd */
    float *tok_embd; /* [V][E] */
    float *out_norm; /* [E] */
    float *output;   /* [V][E] (== tok_embd when tied) */
    ref_layer *layers;
} ref_model;

/* A tensor [rows][cols] dequantised to f32 (rows == 1 for a vector), or NULL when
 * absent and optional. */
static float *ref_tensor(const tdm_gguf *g, const char *name, int64_t cols, int64_t rows, bool optional) {
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, name);
    if (!t) {
        cr_assert(optional, "reference: tensor '%s' missing", name);
        return NULL;
    }
    cr_assert_eq(t->ne[0], cols, "reference: tensor '%s' ne0 %lld != %lld", name, (long long)t->ne[0],
                 (long long)cols);
    cr_assert_eq(t->ne[1], rows, "reference: tensor '%s' ne1 %lld != %lld", name, (long long)t->ne[1],
                 (long long)rows);
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(t->type, (uint64_t)cols, &rb));
    cr_assert_eq(rb * (uint64_t)rows, t->nbytes);
    float *out = malloc((size_t)(cols * rows) * sizeof(float));
    cr_assert(out);
    for (int64_t r = 0; r < rows; r++)
        tdm_row_to_f32(t->type, (const uint8_t *)t->data + (uint64_t)r * rb, out + r * cols, cols);
    return out;
}

static uint32_t ref_u32(const tdm_gguf *g, const char *arch, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_get_u32(g, key, &v, &err), TANDEM_OK, "%s", err.msg);
    return v;
}

static float ref_f32(const tdm_gguf *g, const char *arch, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    float v;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_get_f32(g, key, &v, &err), TANDEM_OK, "%s", err.msg);
    return v;
}

static void ref_load(const char *path, ref_model *m) {
    memset(m, 0, sizeof *m);
    tdm_gguf *g;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open(path, &g, &err), TANDEM_OK, "%s", err.msg);
    tdm_gguf_str arch_s;
    cr_assert_eq(tdm_gguf_get_str(g, "general.architecture", &arch_s, &err), TANDEM_OK);
    char arch[16] = {0};
    cr_assert(arch_s.len < sizeof arch);
    memcpy(arch, arch_s.ptr, arch_s.len);
    bool qwen = strcmp(arch, "qwen2") == 0;
    cr_assert(qwen || strcmp(arch, "llama") == 0);

    m->E = (int)ref_u32(g, arch, "embedding_length");
    m->L = (int)ref_u32(g, arch, "block_count");
    m->F = (int)ref_u32(g, arch, "feed_forward_length");
    m->H = (int)ref_u32(g, arch, "attention.head_count");
    m->Hkv = (int)ref_u32(g, arch, "attention.head_count_kv");
    m->hd = m->E / m->H;
    m->n_rot = m->hd;
    m->eps = ref_f32(g, arch, "attention.layer_norm_rms_epsilon");
    m->base = ref_f32(g, arch, "rope.freq_base");
    m->freq_scale = 1.0;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (tdm_gguf_find(g, key)) {
        tdm_gguf_str st;
        cr_assert_eq(tdm_gguf_get_str(g, key, &st, &err), TANDEM_OK);
        cr_assert(st.len == 6 && memcmp(st.ptr, "linear", 6) == 0);
        m->freq_scale = 1.0 / (double)ref_f32(g, arch, "rope.scaling.factor");
    }
    m->neox = qwen;
    const tdm_gguf_tensor *te = tdm_gguf_find_tensor(g, "token_embd.weight");
    cr_assert(te);
    m->V = (int)te->ne[1];

    int E = m->E, F = m->F, qd = m->H * m->hd, kvd = m->Hkv * m->hd;
    m->tok_embd = ref_tensor(g, "token_embd.weight", E, m->V, false);
    m->out_norm = ref_tensor(g, "output_norm.weight", E, 1, false);
    m->output = ref_tensor(g, "output.weight", E, m->V, true);
    m->tied = m->output == NULL;
    if (m->tied) m->output = m->tok_embd;
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    char name[96];
    for (int l = 0; l < m->L; l++) {
        ref_layer *y = &m->layers[l];
#define N(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
        y->attn_norm = ref_tensor(g, N("attn_norm.weight"), E, 1, false);
        y->wq = ref_tensor(g, N("attn_q.weight"), E, qd, false);
        y->wk = ref_tensor(g, N("attn_k.weight"), E, kvd, false);
        y->wv = ref_tensor(g, N("attn_v.weight"), E, kvd, false);
        if (qwen) {
            y->bq = ref_tensor(g, N("attn_q.bias"), qd, 1, false);
            y->bk = ref_tensor(g, N("attn_k.bias"), kvd, 1, false);
            y->bv = ref_tensor(g, N("attn_v.bias"), kvd, 1, false);
        }
        y->wo = ref_tensor(g, N("attn_output.weight"), qd, E, false);
        y->ffn_norm = ref_tensor(g, N("ffn_norm.weight"), E, 1, false);
        y->wg = ref_tensor(g, N("ffn_gate.weight"), E, F, false);
        y->wu = ref_tensor(g, N("ffn_up.weight"), E, F, false);
        y->wd = ref_tensor(g, N("ffn_down.weight"), F, E, false);
#undef N
    }
    tdm_gguf_close(g);
}

static void ref_free(ref_model *m) {
    for (int l = 0; l < m->L; l++) {
        ref_layer *y = &m->layers[l];
        float *p[] = {y->attn_norm, y->ffn_norm, y->wq, y->wk, y->wv, y->bq, y->bk, y->bv, y->wo, y->wg, y->wu, y->wd};
        for (size_t i = 0; i < TDM_ARRAY_LEN(p); i++) free(p[i]);
    }
    free(m->layers);
    if (!m->tied) free(m->output);
    free(m->tok_embd);
    free(m->out_norm);
}

/* ------------------------------------------------------------ reference forward */

/* y[r] = sum_c W[r][c] x[c] (+ b[r]); W: [rows][cols]. */
static void ref_matvec(const float *W, const float *b, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = s + (b ? (double)b[r] : 0.0);
    }
}

static void ref_rmsnorm(const double *x, const float *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * (double)w[i];
}

/* Rotates every head of v ([n_head][hd]) for position pos. */
static void ref_rope(const ref_model *m, double *v, int n_head, int pos) {
    int half = m->n_rot / 2;
    for (int h = 0; h < n_head; h++) {
        double *x = v + (size_t)h * m->hd;
        for (int i = 0; i < half; i++) {
            double theta = pos * m->freq_scale * pow(m->base, -2.0 * i / m->n_rot);
            double c = cos(theta), s = sin(theta);
            int a = m->neox ? i : 2 * i;
            int b = m->neox ? i + half : 2 * i + 1;
            double x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

static double silu(double x) { return x / (1.0 + exp(-x)); }

/* Logits of every position of tok[0..n) (positions 0..n-1).  Returns [n][V]. */
static double *ref_forward(const ref_model *m, const int32_t *tok, int n) {
    int E = m->E, F = m->F, hd = m->hd, qd = m->H * hd, kvd = m->Hkv * hd, V = m->V;
    int group = m->H / m->Hkv;
    double *x = calloc((size_t)n * E, sizeof(double));   /* [n][E] residual stream */
    double *xb = calloc((size_t)E, sizeof(double));      /* [E] */
    double *q = calloc((size_t)n * qd, sizeof(double));  /* [n][H][hd] */
    double *k = calloc((size_t)n * kvd, sizeof(double)); /* [n][Hkv][hd] */
    double *v = calloc((size_t)n * kvd, sizeof(double)); /* [n][Hkv][hd] */
    double *att = calloc((size_t)qd, sizeof(double));    /* [H][hd] */
    double *sc = calloc((size_t)n, sizeof(double));      /* [n] scores */
    double *tmp = calloc((size_t)(E > F ? E : F), sizeof(double));
    double *g = calloc((size_t)F, sizeof(double)), *u = calloc((size_t)F, sizeof(double));
    double *logits = calloc((size_t)n * V, sizeof(double));

    for (int t = 0; t < n; t++)
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = m->tok_embd[(size_t)tok[t] * E + i];

    for (int l = 0; l < m->L; l++) {
        const ref_layer *y = &m->layers[l];
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(x + (size_t)t * E, y->attn_norm, E, m->eps, xb);
            ref_matvec(y->wq, y->bq, xb, qd, E, q + (size_t)t * qd);
            ref_matvec(y->wk, y->bk, xb, kvd, E, k + (size_t)t * kvd);
            ref_matvec(y->wv, y->bv, xb, kvd, E, v + (size_t)t * kvd);
            ref_rope(m, q + (size_t)t * qd, m->H, t);
            ref_rope(m, k + (size_t)t * kvd, m->Hkv, t);
        }
        for (int t = 0; t < n; t++) {
            for (int h = 0; h < m->H; h++) {
                int kh = h / group;
                const double *qh = q + (size_t)t * qd + (size_t)h * hd;
                double mx = -INFINITY;
                for (int j = 0; j <= t; j++) {
                    const double *kj = k + (size_t)j * kvd + (size_t)kh * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += qh[d] * kj[d];
                    sc[j] = s / sqrt((double)hd);
                    if (sc[j] > mx) mx = sc[j];
                }
                double sum = 0;
                for (int j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                double *o = att + (size_t)h * hd;
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int j = 0; j <= t; j++) {
                    const double *vj = v + (size_t)j * kvd + (size_t)kh * hd;
                    for (int d = 0; d < hd; d++) o[d] += sc[j] / sum * vj[d];
                }
            }
            ref_matvec(y->wo, NULL, att, E, qd, tmp);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += tmp[i];
        }
        for (int t = 0; t < n; t++) {
            ref_rmsnorm(x + (size_t)t * E, y->ffn_norm, E, m->eps, xb);
            ref_matvec(y->wg, NULL, xb, F, E, g);
            ref_matvec(y->wu, NULL, xb, F, E, u);
            for (int i = 0; i < F; i++) g[i] = silu(g[i]) * u[i];
            ref_matvec(y->wd, NULL, g, E, F, tmp);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += tmp[i];
        }
    }
    for (int t = 0; t < n; t++) {
        ref_rmsnorm(x + (size_t)t * E, m->out_norm, E, m->eps, xb);
        ref_matvec(m->output, NULL, xb, V, E, logits + (size_t)t * V);
    }
    free(x);
    free(xb);
    free(q);
    free(k);
    free(v);
    free(att);
    free(sc);
    free(tmp);
    free(g);
    free(u);
    return logits;
}

/* ------------------------------------------------------------ engine side */

typedef struct eng {
    char *path;
    tdm_backend *wbe;
    tdm_model *m;
    tdm_engine *e;
} eng;

/* An engine of `threads` threads over the model; tp: whether its CPU backend may
 * run the blocks tensor parallel (kernels/cpu/blocks.c). */
static void eng_open_ex(eng *x, const tdm_tiny_cfg *cfg, int32_t prefill_chunk, int threads, bool tp) {
    tdm_err err = {0};
    x->path = tdm_tiny_model_file(cfg);
    cr_assert_eq(tdm_backend_cpu_create(1, &x->wbe, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(x->path, x->wbe, &x->m, &err), TANDEM_OK, "%s", err.msg);
    tdm_engine_cfg ec = {.n_threads = threads, .block_size = BLOCK_SIZE, .prefill_chunk = prefill_chunk};
    cr_assert_eq(tdm_engine_create(x->m, NULL, &ec, &x->e, &err), TANDEM_OK, "%s", err.msg);
    tdm_backend_cpu_set_tp(x->e->be, tp);
}

static void eng_open(eng *x, const tdm_tiny_cfg *cfg, int32_t prefill_chunk) {
    eng_open_ex(x, cfg, prefill_chunk, 2, true);
}

static void eng_close(eng *x) {
    tdm_engine_free(x->e);
    tdm_model_free(x->m);
    tdm_backend_destroy(x->wbe);
    unlink(x->path);
    free(x->path);
}

/* Engine logits at every position: the last row of each prefix.  [n][V] */
static float *eng_logits_prefixes(eng *x, const int32_t *tok, int n) {
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
static float *eng_logits_rowwise(eng *x, const int32_t *tok, int n) {
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

static void random_tokens(int32_t *tok, int n, int V, uint64_t seed) {
    uint64_t rng = seed;
    for (int i = 0; i < n; i++) tok[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)V);
}

/* Max over positions of ||a - b|| / ||b|| (b the reference). */
static double max_rel_err(const float *eng_l, const double *ref_l, int n, int V, int *worst) {
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

/* Builds the model, runs both sides over N_TOK random tokens and compares. */
static void check_case(const char *what, const tdm_tiny_cfg *cfg, double tol) {
    eng x;
    eng_open(&x, cfg, 0);
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
}

/* Tolerances: the engine computes in f32 (on the same dequantised weights), the
 * reference in double; the measured errors are ~5e-7 (the brief allows 1e-4). */
#define TOL_F32 2e-5
#define TOL_QUANT 2e-5
/* The integer-dot types (Q4_1 .. Q6_K) also round x to int8 per block in every
 * matmul (kernels/cpu/qdot.h, as llama.cpp does): half a step of a block's largest
 * |x| / 127 per input, large against heavy-tailed inputs (SwiGLU's); measured on
 * these models: 1.5-3.4 % with blocks of 32, 4-7.4 % with the K-quants' 256.  The
 * kernels themselves are checked to 1e-5 against the reference on the quantised x
 * (test_backend_ops); here the tolerance still catches any loading error (O(1)). */
#define TOL_QDOT32 5e-2
#define TOL_QDOTK 8e-2

static double type_tol(uint32_t t) {
    if (t == TDM_F32) return TOL_F32;
    if (t == TDM_F16 || t == TDM_BF16 || t == TDM_Q8_0 || t == TDM_Q4_0) return TOL_QUANT;
    return tdm_dtype_is_kquant(t) ? TOL_QDOTK : TOL_QDOT32;
}

static tdm_tiny_cfg base_cfg(uint64_t seed) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.n_vocab = 48;
    c.seed = seed;
    return c;
}

Test(forward_ref, llama_tied_output, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(11);
    check_case("llama tied", &c, TOL_F32);
}

Test(forward_ref, llama_separate_output, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(12);
    c.untied_output = true;
    check_case("llama untied", &c, TOL_F32);
}

Test(forward_ref, qwen2_biases_neox_rope, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(13);
    c.arch = "qwen2";
    check_case("qwen2", &c, TOL_F32);
    c.untied_output = true;
    c.seed = 14;
    check_case("qwen2 untied", &c, TOL_F32);
}

Test(forward_ref, gqa_ratios_1_2_4, .timeout = 180) {
    const int kv_heads[] = {4, 2, 1}; /* n_head 4: ratios 1, 2, 4 */
    for (size_t i = 0; i < TDM_ARRAY_LEN(kv_heads); i++) {
        tdm_tiny_cfg c = base_cfg(20 + i);
        c.n_head = 4;
        c.n_head_kv = kv_heads[i];
        char what[64];
        snprintf(what, sizeof what, "llama GQA %d", 4 / kv_heads[i]);
        check_case(what, &c, TOL_F32);
        c.arch = "qwen2";
        snprintf(what, sizeof what, "qwen2 GQA %d", 4 / kv_heads[i]);
        check_case(what, &c, TOL_F32);
    }
}

Test(forward_ref, head_dim_16_and_32, .timeout = 180) {
    /* head_dim = n_embd / n_head */
    struct { int embd, head, head_kv; } s[] = {{64, 4, 2}, {64, 2, 1}, {128, 4, 2}, {128, 8, 2}};
    for (size_t i = 0; i < TDM_ARRAY_LEN(s); i++) {
        tdm_tiny_cfg c = base_cfg(30 + i);
        c.n_embd = s[i].embd;
        c.n_head = s[i].head;
        c.n_head_kv = s[i].head_kv;
        char what[64];
        snprintf(what, sizeof what, "llama embd %d heads %d/%d (head_dim %d)", s[i].embd, s[i].head,
                 s[i].head_kv, s[i].embd / s[i].head);
        check_case(what, &c, TOL_F32);
    }
}

Test(forward_ref, linear_rope_scaling, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(40);
    c.rope_scale = 2.0f;
    check_case("llama rope linear x2", &c, TOL_F32);
    c.arch = "qwen2";
    c.rope_scale = 4.0f;
    check_case("qwen2 rope linear x4", &c, TOL_F32);
}

static const uint32_t k_types[] = {TDM_F32,  TDM_F16,  TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1, TDM_Q5_0,
                                   TDM_Q5_1, TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};

/* A tiny model of type t: the K-quants need rows of whole super-blocks (256). */
static tdm_tiny_cfg type_cfg(uint32_t t, uint64_t seed) {
    tdm_tiny_cfg c = base_cfg(seed);
    c.wtype = t;
    if (tdm_dtype_is_kquant(t)) c.n_embd = 256, c.n_ff = 256;
    return c;
}

Test(forward_ref, weight_types, .timeout = 300) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(k_types); i++) {
        tdm_tiny_cfg c = type_cfg(k_types[i], 50 + i);
        char what[64];
        snprintf(what, sizeof what, "llama %s", tdm_dtype_name(k_types[i]));
        check_case(what, &c, type_tol(k_types[i]));
        c.arch = "qwen2";
        c.untied_output = true;
        snprintf(what, sizeof what, "qwen2 untied %s", tdm_dtype_name(k_types[i]));
        check_case(what, &c, type_tol(k_types[i]));
    }
}

/* A Q4_K_M-like mix: Q4_K matrices, Q6_K attn_v (fused with q and k into an f16
 * weight) and ffn_down, Q5_0 rows where 256 does not divide them. */
Test(forward_ref, mixed_types, .timeout = 120) {
    tdm_tiny_cfg c = type_cfg(TDM_Q4_K, 58);
    c.attn_v_type = TDM_Q6_K;
    c.ffn_down_type = TDM_Q6_K;
    check_case("llama q4_k + q6_k", &c, TOL_QDOTK);
    c = base_cfg(59);
    c.wtype = TDM_Q5_0;
    c.attn_v_type = TDM_Q8_0;
    c.untied_output = true;
    check_case("llama q5_0 + q8_0", &c, TOL_QDOT32);
    eng x;
    eng_open(&x, &c, 0);
    cr_assert_eq(x.m->layers[0].wqkv.type, TDM_F16, "mixed q, k, v fuse into f16");
    cr_assert_eq(x.m->layers[0].w2.type, TDM_Q5_0);
    eng_close(&x);
}

/* The comparison is sharp: a reference with the other RoPE layout, or without the
 * linear scaling, is far from the engine. */
Test(forward_ref, comparison_detects_wrong_rope, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(60);
    c.rope_scale = 2.0f;
    eng x;
    eng_open(&x, &c, 0);
    ref_model rm;
    ref_load(x.path, &rm);
    int32_t tok[N_TOK];
    random_tokens(tok, N_TOK, rm.V, 77);
    float *got = eng_logits_prefixes(&x, tok, N_TOK);
    int worst;
    double *ref = ref_forward(&rm, tok, N_TOK);
    cr_assert_lt(max_rel_err(got, ref, N_TOK, rm.V, &worst), TOL_F32);
    free(ref);
    rm.neox = true;
    ref = ref_forward(&rm, tok, N_TOK);
    double e_layout = max_rel_err(got, ref, N_TOK, rm.V, &worst);
    free(ref);
    rm.neox = false;
    rm.freq_scale = 1.0;
    ref = ref_forward(&rm, tok, N_TOK);
    double e_scale = max_rel_err(got, ref, N_TOK, rm.V, &worst);
    free(ref);
    cr_log_info("wrong layout: %.3g, no scaling: %.3g", e_layout, e_scale);
    cr_assert_gt(e_layout, 1e-2, "NEOX reference agrees with the llama engine (%.3g)", e_layout);
    cr_assert_gt(e_scale, 1e-2, "unscaled reference agrees with the scaled engine (%.3g)", e_scale);
    free(got);
    ref_free(&rm);
    eng_close(&x);
}

/* ------------------------------------------------------------ batch invariance */

static void check_batch_invariance(const tdm_tiny_cfg *c, const char *what) {
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

Test(forward_ref, batch_invariance_every_weight_type, .timeout = 300) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(k_types); i++) {
        tdm_tiny_cfg c = type_cfg(k_types[i], 70 + i);
        char what[64];
        snprintf(what, sizeof what, "llama %s", tdm_dtype_name(k_types[i]));
        check_batch_invariance(&c, what);
        c.arch = "qwen2";
        c.untied_output = true;
        snprintf(what, sizeof what, "qwen2 %s", tdm_dtype_name(k_types[i]));
        check_batch_invariance(&c, what);
    }
}

/* ------------------------------------------------------------ tensor-parallel blocks */

typedef struct tp_case {
    const char *what;
    int embd, head, head_kv, ff, threads;
    uint32_t wtype;
    const char *arch;
    int runs; /* 1: the blocks op takes this shape; 0: it declines (the forward runs op by
                 op); 2: it takes it iff the weights are in the rows layout (the P64
                 layout cannot split into slices of 32 rows) */
} tp_case;

static void check_tp_case(const tp_case *tc, uint64_t seed) {
    tdm_tiny_cfg c = base_cfg(seed);
    c.n_embd = tc->embd;
    c.n_head = tc->head;
    c.n_head_kv = tc->head_kv;
    c.n_ff = tc->ff;
    c.wtype = tc->wtype;
    c.arch = tc->arch;
    c.untied_output = tc->arch && !strcmp(tc->arch, "qwen2");
    eng tp, ops, tp7;
    eng_open_ex(&tp, &c, 0, tc->threads, true);
    eng_open_ex(&ops, &c, 0, tc->threads, false);
    eng_open_ex(&tp7, &c, 7, tc->threads, true);
    ref_model rm;
    ref_load(tp.path, &rm);
    int V = rm.V, worst;
    int32_t tok[N_TOK];
    random_tokens(tok, N_TOK, V, seed * 7 + 3);
    uint64_t runs0 = tdm_backend_cpu_blocks_runs(tp.e->be);
    float *a = eng_logits_prefixes(&tp, tok, N_TOK);
    uint64_t runs = tdm_backend_cpu_blocks_runs(tp.e->be) - runs0;
    bool want = tc->runs == 2 ? tp.m->layers[0].wqkv.layout == TDM_LAYOUT_ROWS : tc->runs == 1;
    cr_assert_eq(runs > 0, want, "%s: the blocks op ran %llu forwards (expected it %s)", tc->what,
                 (unsigned long long)runs, want ? "to run" : "to decline");
    cr_assert_eq(tdm_backend_cpu_blocks_runs(ops.e->be), 0, "%s: blocks ran with tensor parallelism off", tc->what);

    /* against the double-precision reference and the op-by-op forward */
    double *ref = ref_forward(&rm, tok, N_TOK);
    double e = max_rel_err(a, ref, N_TOK, V, &worst);
    cr_log_info("%s: tensor parallel vs reference %.3g", tc->what, e);
    cr_assert(e < type_tol(tc->wtype), "%s: normalised logit error %.3g at position %d", tc->what, e, worst);
    float *b = eng_logits_prefixes(&ops, tok, N_TOK);
    double *bd = malloc((size_t)N_TOK * V * sizeof(double));
    for (size_t i = 0; i < (size_t)N_TOK * V; i++) bd[i] = b[i];
    e = max_rel_err(a, bd, N_TOK, V, &worst);
    /* f32 rounding apart; the integer-dot types round each matmul's x to int8, where an
     * input one ulp off can land one step away (measured: 0 to 1.4 %) */
    const double tol_ops = tdm_dtype_block_elems(tc->wtype) > 1 && type_tol(tc->wtype) > TOL_QUANT ? type_tol(tc->wtype)
                                                                                                   : 1e-5;
    cr_assert(e < tol_ops, "%s: tensor parallel vs op by op %.3g at position %d", tc->what, e, worst);

    /* one batch, chunks of 7 and one row at a time: the same bits */
    float *a7 = eng_logits_prefixes(&tp7, tok, N_TOK);
    float *r = eng_logits_rowwise(&tp, tok, N_TOK);
    for (size_t k = 0; k < (size_t)N_TOK * V; k++) {
        cr_assert(memcmp(&a[k], &r[k], 4) == 0, "%s: one batch vs one row at a time at %zu", tc->what, k);
        cr_assert(memcmp(&a7[k], &r[k], 4) == 0, "%s: chunks of 7 vs one row at a time at %zu", tc->what, k);
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

/* head_dim 64 with 4 / 2 heads and 256 FFN features split two ways: slices of
 * 128 / 64 / 128 rows, so the P64 layout (element types) splits too */
static const tp_case tp_cases[] = {
    {"f16 P64, 2 threads", 256, 4, 2, 256, 2, TDM_F16, "llama", 1},
    {"f32 P64, 2 threads", 256, 4, 2, 256, 2, TDM_F32, "llama", 1},
    {"bf16 P64, 2 threads", 256, 4, 2, 256, 2, TDM_BF16, "llama", 1},
    {"qwen2 f16 (biases, NEOX rope), 2 threads", 256, 4, 2, 256, 2, TDM_F16, "qwen2", 1},
    {"q8_0 rows layout, 2 threads", 256, 4, 2, 256, 2, TDM_Q8_0, "llama", 1},
    {"q4_0 rows layout, 4 threads", 256, 8, 4, 256, 4, TDM_Q4_0, "llama", 1},
    {"qwen2 q8_0 slices of 32 rows, 4 threads", 128, 4, 4, 128, 4, TDM_Q8_0, "qwen2", 1},
    {"f16 slices of 32 rows, 4 threads", 128, 4, 4, 128, 4, TDM_F16, "llama", 2},
    {"3 threads, 2 kv heads: declines", 256, 4, 2, 258, 3, TDM_F16, "llama", 0},
    {"1 thread: declines", 256, 4, 2, 256, 1, TDM_F16, "llama", 0},
    {"one kv head shared by 2 threads", 256, 4, 1, 256, 2, TDM_F16, "llama", 1},
    {"qwen2 q8_0, 2 kv heads shared by 4 threads", 256, 4, 2, 256, 4, TDM_Q8_0, "qwen2", 1},
    {"4 threads, 2 query heads on one kv head: declines", 128, 2, 1, 256, 4, TDM_F16, "llama", 0},
    {"q4_k, 2 threads", 512, 8, 2, 512, 2, TDM_Q4_K, "llama", 1},
    {"qwen2 q6_k, 2 threads", 512, 8, 2, 512, 2, TDM_Q6_K, "qwen2", 1},
    {"q5_0, 4 threads", 256, 8, 4, 256, 4, TDM_Q5_0, "llama", 1},

    {"q4_k column slices of 128 (not whole super-blocks): declines", 256, 4, 2, 256, 2, TDM_Q4_K, "llama", 0},
};

Test(forward_ref, tensor_parallel_blocks, .timeout = 300) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(tp_cases); i++) check_tp_case(&tp_cases[i], 90 + i);
}

/* Some of them at the lower SIMD levels (rows layout: the direct and tile kernels on
 * views). */
Test(forward_ref, tensor_parallel_blocks_lower_levels, .timeout = 300) {
    static const size_t picks[] = {0, 6, 10}; /* f16 2 threads, q8_0 4 threads, a shared kv head */
    static const char *levels[] = {"avx2", "scalar"};
    for (size_t l = 0; l < TDM_ARRAY_LEN(levels); l++) {
        setenv("TANDEM_CPU", levels[l], 1);
        for (size_t i = 0; i < TDM_ARRAY_LEN(picks); i++) check_tp_case(&tp_cases[picks[i]], 120 + i + 10 * l);
    }
    unsetenv("TANDEM_CPU");
}

/* Two sequences in one batch, one of them with tree rows (a sibling and its child:
 * extra visible slots), through the tensor-parallel blocks: each row's logits equal,
 * bit for bit, those of its path fed as a plain sequence, and those of the
 * op-by-op forward to rounding. */
static float *multi_seq_logits(eng *x, const int32_t *ta, const int32_t *tb, int32_t alt[2]) {
    tdm_engine *e = x->e;
    int V = x->m->hp.n_vocab;
    tdm_err err = {0};
    tdm_seq sa, sb;
    memset(&sa, 0, sizeof sa);
    memset(&sb, 0, sizeof sb);
    sa.tokens = (int32_t *)ta;
    sa.n_tokens = sa.cap = 19;
    sb.tokens = (int32_t *)tb;
    sb.n_tokens = sb.cap = 16;
    cr_assert_eq(tdm_engine_feed(e, &sa, false, 0, 16, false, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_feed(e, &sb, false, 0, 14, false, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_kv_seq_reserve(e->pool, &sa.kv, 19, &err), TANDEM_OK);
    cr_assert_eq(tdm_kv_seq_reserve(e->pool, &sb.kv, 18, &err), TANDEM_OK);
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, 8, &err), TANDEM_OK);
    /* B first, then A: B at 14, 15; the sibling of 15 (token alt[0], slot 16) and its
     * child (alt[1], position 16, slot 17) see [0, 15) plus their tree slots */
    tdm_batch_add(&b, tb[14], 14, 1, 14, true);
    tdm_batch_add(&b, tb[15], 15, 1, 15, true);
    tdm_batch_add(&b, alt[0], 15, 1, 16, true);
    tdm_batch_add(&b, alt[1], 16, 1, 17, true);
    for (int p = 16; p < 19; p++) tdm_batch_add(&b, ta[p], p, 0, p, true);
    b.n_visible[2] = b.n_visible[3] = 15;
    b.extra_off = calloc(8, sizeof(int32_t));
    b.extra_slot = malloc(3 * sizeof(int32_t));
    b.extra_off[3] = 1; /* row 2: slot 16 */
    b.extra_off[4] = b.extra_off[5] = b.extra_off[6] = b.extra_off[7] = 3; /* row 3: 16, 17 */
    b.extra_slot[0] = 16;
    b.extra_slot[1] = 16;
    b.extra_slot[2] = 17;
    const tdm_kv_seq *seqs[2] = {&sa.kv, &sb.kv};
    float *out = malloc((size_t)b.n_rows * V * sizeof(float));
    cr_assert_eq(tdm_model_forward(x->m, e->be, &e->kv_t, &b, seqs, &e->fs_t, out, &err), TANDEM_OK, "%s",
                 err.msg);
    tdm_batch_free(&b);
    tdm_kv_seq_free(e->pool, &sa.kv);
    tdm_kv_seq_free(e->pool, &sb.kv);
    return out;
}

Test(forward_ref, tensor_parallel_multi_sequence_batch, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(140);
    c.n_embd = 256;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.n_ff = 256;
    c.wtype = TDM_F16;
    eng tp, ops;
    eng_open_ex(&tp, &c, 0, 2, true);
    eng_open_ex(&ops, &c, 0, 2, false);
    int V = tp.m->hp.n_vocab;
    int32_t ta[19], tb[16], alt[2];
    random_tokens(ta, 19, V, 1401);
    random_tokens(tb, 16, V, 1402);
    random_tokens(alt, 2, V, 1403);
    uint64_t runs0 = tdm_backend_cpu_blocks_runs(tp.e->be);
    float *got = multi_seq_logits(&tp, ta, tb, alt);
    cr_assert_gt(tdm_backend_cpu_blocks_runs(tp.e->be), runs0, "the blocks op did not run");
    float *base = multi_seq_logits(&ops, ta, tb, alt);

    /* each row's path as a plain sequence */
    int32_t paths[7][19], lens[7];
    for (int r = 0; r < 2; r++) {
        memcpy(paths[r], tb, sizeof(int32_t) * (size_t)(15 + r));
        lens[r] = 15 + r;
    }
    memcpy(paths[2], tb, sizeof(int32_t) * 15);
    paths[2][15] = alt[0];
    lens[2] = 16;
    memcpy(paths[3], paths[2], sizeof(int32_t) * 16);
    paths[3][16] = alt[1];
    lens[3] = 17;
    for (int r = 4; r < 7; r++) {
        memcpy(paths[r], ta, sizeof(int32_t) * (size_t)(13 + r));
        lens[r] = 13 + r;
    }
    float *one = malloc((size_t)V * sizeof(float));
    double *bd = malloc((size_t)V * sizeof(double));
    tdm_err err = {0};
    for (int r = 0; r < 7; r++) {
        cr_assert_eq(tdm_engine_score_last(tp.e, false, paths[r], lens[r], one, &err), TANDEM_OK, "%s", err.msg);
        cr_assert(memcmp(one, got + (size_t)r * V, (size_t)V * sizeof(float)) == 0,
                  "row %d: the batch of two sequences differs from its path fed alone", r);
        for (int i = 0; i < V; i++) bd[i] = base[(size_t)r * V + i];
        int worst;
        double e = max_rel_err(got + (size_t)r * V, bd, 1, V, &worst);
        cr_assert(e < 1e-5, "row %d: tensor parallel vs op by op %.3g", r, e);
    }
    cr_assert_eq(tdm_kv_pool_n_free(tp.e->pool), tdm_kv_pool_n_blocks(tp.e->pool), "KV blocks leaked");
    free(one);
    free(bd);
    free(got);
    free(base);
    eng_close(&tp);
    eng_close(&ops);
}
