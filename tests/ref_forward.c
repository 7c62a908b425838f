/* ref_forward.c - the independent reference forward of the tests (ref_forward.h). */
#include "ref_forward.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "gguf.h"

/* ------------------------------------------------------------ reading */

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

/* A 3-D tensor [ne2][ne1][ne0] dequantised to f32. */
static float *ref_tensor3(const tdm_gguf *g, const char *name, int64_t ne0, int64_t ne1, int64_t ne2) {
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, name);
    cr_assert(t, "reference: tensor '%s' missing", name);
    cr_assert(t->n_dims == 3 && t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == ne2,
              "reference: tensor '%s' is not [%lld, %lld, %lld]", name, (long long)ne0, (long long)ne1,
              (long long)ne2);
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(t->type, (uint64_t)ne0, &rb));
    cr_assert_eq(rb * (uint64_t)(ne1 * ne2), t->nbytes);
    float *out = malloc((size_t)(ne0 * ne1 * ne2) * sizeof(float));
    cr_assert(out);
    for (int64_t r = 0; r < ne1 * ne2; r++)
        tdm_row_to_f32(t->type, (const uint8_t *)t->data + (uint64_t)r * rb, out + r * ne0, ne0);
    return out;
}

static bool ref_has(const tdm_gguf *g, const char *arch, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return tdm_gguf_find(g, key) != NULL;
}

static uint32_t ref_u32(const tdm_gguf *g, const char *arch, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_get_u32(g, key, &v, &err), TANDEM_OK, "%s", err.msg);
    return v;
}

static double ref_f32(const tdm_gguf *g, const char *arch, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    float v;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_get_f32(g, key, &v, &err), TANDEM_OK, "%s", err.msg);
    return v;
}

void ref_load(const char *path, ref_model *m) {
    memset(m, 0, sizeof *m);
    tdm_gguf *g;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open(path, &g, &err), TANDEM_OK, "%s", err.msg);
    tdm_gguf_str arch_s;
    cr_assert_eq(tdm_gguf_get_str(g, "general.architecture", &arch_s, &err), TANDEM_OK);
    cr_assert(arch_s.len < sizeof m->arch);
    memcpy(m->arch, arch_s.ptr, arch_s.len);
    const char *arch = m->arch;
    const bool llama = !strcmp(arch, "llama"), qwen2 = !strcmp(arch, "qwen2"), qwen3moe = !strcmp(arch, "qwen3moe"),
               qwen3 = !strcmp(arch, "qwen3") || qwen3moe, gemma = !strcmp(arch, "gemma3");
    cr_assert(llama || qwen2 || qwen3 || gemma, "reference: architecture %s", arch);

    m->E = (int)ref_u32(g, arch, "embedding_length");
    m->L = (int)ref_u32(g, arch, "block_count");
    m->F = (int)ref_u32(g, arch, "feed_forward_length");
    if (ref_has(g, arch, "expert_count")) {
        m->NE = (int)ref_u32(g, arch, "expert_count");
        m->K = (int)ref_u32(g, arch, "expert_used_count");
        if (qwen3moe) m->F = (int)ref_u32(g, arch, "expert_feed_forward_length");
    }
    cr_assert(!qwen3moe || m->NE > 0, "reference: qwen3moe without experts");
    m->H = (int)ref_u32(g, arch, "attention.head_count");
    m->Hkv = ref_has(g, arch, "attention.head_count_kv") ? (int)ref_u32(g, arch, "attention.head_count_kv") : m->H;
    m->hd = ref_has(g, arch, "attention.key_length") ? (int)ref_u32(g, arch, "attention.key_length") : m->E / m->H;
    m->n_rot = ref_has(g, arch, "rope.dimension_count") ? (int)ref_u32(g, arch, "rope.dimension_count") : m->hd;
    m->eps = ref_f32(g, arch, "attention.layer_norm_rms_epsilon");
    m->base = ref_has(g, arch, "rope.freq_base") ? ref_f32(g, arch, "rope.freq_base") : 10000.0;
    m->base_swa = m->base;
    m->freq_scale = 1.0;
    m->attn_factor = ref_has(g, arch, "rope.scaling.attn_factor") ? ref_f32(g, arch, "rope.scaling.attn_factor") : 1.0;
    const char *type = ref_has(g, arch, "rope.scaling.factor") ? "linear" : "none";
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    tdm_gguf_str st;
    if (tdm_gguf_find(g, key)) {
        cr_assert_eq(tdm_gguf_get_str(g, key, &st, &err), TANDEM_OK);
        type = st.len == 4 && !memcmp(st.ptr, "yarn", 4)     ? "yarn"
               : st.len == 6 && !memcmp(st.ptr, "linear", 6) ? "linear"
                                                              : "none";
        cr_assert(strcmp(type, "none") || (st.len == 4 && !memcmp(st.ptr, "none", 4)), "reference: scaling type");
    }
    if (strcmp(type, "none")) m->freq_scale = 1.0 / ref_f32(g, arch, "rope.scaling.factor");
    m->yarn = !strcmp(type, "yarn");
    if (m->yarn)
        m->yarn_orig_ctx = ref_has(g, arch, "rope.scaling.original_context_length")
                               ? (int)ref_u32(g, arch, "rope.scaling.original_context_length")
                               : (int)ref_u32(g, arch, "context_length");
    m->neox = !llama;
    m->gelu = gemma;
    m->embd_scale = gemma ? sqrt((double)m->E) : 1.0;
    m->attn_scale = 1.0 / sqrt((double)m->hd);
    if (gemma) {
        m->window = (int)ref_u32(g, arch, "attention.sliding_window");
        m->base_swa = 10000.0; /* transformers' rope_local_base_freq */
        if (m->L == 62) m->attn_scale = 1.0 / sqrt((double)(m->E / m->H)); /* the 27B's query_pre_attn_scalar */
        if (ref_has(g, arch, "attn_logit_softcapping")) m->attn_softcap = ref_f32(g, arch, "attn_logit_softcapping");
        if (ref_has(g, arch, "final_logit_softcapping")) m->final_softcap = ref_f32(g, arch, "final_logit_softcapping");
        cr_assert(!m->yarn, "reference: yarn on gemma3 is not modelled");
    }
    const tdm_gguf_tensor *te = tdm_gguf_find_tensor(g, "token_embd.weight");
    cr_assert(te);
    m->V = (int)te->ne[1];

    int E = m->E, F = m->F, hd = m->hd, qd = m->H * hd, kvd = m->Hkv * hd;
    m->tok_embd = ref_tensor(g, "token_embd.weight", E, m->V, false);
    m->out_norm = ref_tensor(g, "output_norm.weight", E, 1, false);
    m->output = ref_tensor(g, "output.weight", E, m->V, true);
    m->tied = m->output == NULL;
    if (m->tied) m->output = m->tok_embd;
    if (llama) m->rope_freqs = ref_tensor(g, "rope_freqs.weight", m->n_rot / 2, 1, true);
    m->use_rope_freqs = m->rope_freqs != NULL;
    m->layers = calloc((size_t)m->L, sizeof *m->layers);
    char name[96];
    for (int l = 0; l < m->L; l++) {
        ref_layer *y = &m->layers[l];
#define N(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
        y->attn_norm = ref_tensor(g, N("attn_norm.weight"), E, 1, false);
        y->wq = ref_tensor(g, N("attn_q.weight"), E, qd, false);
        y->wk = ref_tensor(g, N("attn_k.weight"), E, kvd, false);
        y->wv = ref_tensor(g, N("attn_v.weight"), E, kvd, false);
        if (qwen2) {
            y->bq = ref_tensor(g, N("attn_q.bias"), qd, 1, false);
            y->bk = ref_tensor(g, N("attn_k.bias"), kvd, 1, false);
            y->bv = ref_tensor(g, N("attn_v.bias"), kvd, 1, false);
        }
        if (qwen3 || gemma) {
            y->q_norm = ref_tensor(g, N("attn_q_norm.weight"), hd, 1, false);
            y->k_norm = ref_tensor(g, N("attn_k_norm.weight"), hd, 1, false);
        }
        y->wo = ref_tensor(g, N("attn_output.weight"), qd, E, false);
        y->ffn_norm = ref_tensor(g, N("ffn_norm.weight"), E, 1, false);
        if (m->NE > 0) {
            y->router = ref_tensor(g, N("ffn_gate_inp.weight"), E, m->NE, false);
            y->wg = ref_tensor3(g, N("ffn_gate_exps.weight"), E, F, m->NE);
            y->wu = ref_tensor3(g, N("ffn_up_exps.weight"), E, F, m->NE);
            y->wd = ref_tensor3(g, N("ffn_down_exps.weight"), F, E, m->NE);
        } else {
            y->wg = ref_tensor(g, N("ffn_gate.weight"), E, F, false);
            y->wu = ref_tensor(g, N("ffn_up.weight"), E, F, false);
            y->wd = ref_tensor(g, N("ffn_down.weight"), F, E, false);
        }
        if (gemma) {
            y->post_attn = ref_tensor(g, N("post_attention_norm.weight"), E, 1, false);
            y->post_ffn = ref_tensor(g, N("post_ffw_norm.weight"), E, 1, false);
            y->swa = (l + 1) % 6 != 0; /* transformers' Gemma3: every sixth layer is global */
        }
#undef N
    }
    tdm_gguf_close(g);
    ref_rope_tables(m);
}

void ref_free(ref_model *m) {
    for (int l = 0; l < m->L; l++) {
        ref_layer *y = &m->layers[l];
        float *p[] = {y->attn_norm, y->ffn_norm, y->wq, y->wk, y->wv, y->bq, y->bk, y->bv,
                      y->q_norm, y->k_norm, y->wo, y->post_attn, y->post_ffn, y->wg, y->wu, y->wd, y->router};
        for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
    }
    free(m->layers);
    if (!m->tied) free(m->output);
    free(m->tok_embd);
    free(m->out_norm);
    free(m->rope_freqs);
    free(m->freq);
    free(m->freq_swa);
}

/* ------------------------------------------------------------ RoPE tables */

/* transformers' YaRN (modeling_rope_utils._compute_yarn_parameters): the dimension
 * at which the original context makes n full rotations. */
static double yarn_corr_dim(double n, int dim, double base, int orig_ctx) {
    return dim * log(orig_ctx / (n * 2 * M_PI)) / (2 * log(base));
}

void ref_rope_tables(ref_model *m) {
    const int half = m->n_rot / 2;
    free(m->freq);
    free(m->freq_swa);
    m->freq = malloc((size_t)half * sizeof(double));
    m->freq_swa = malloc((size_t)half * sizeof(double));
    const double factor = 1.0 / m->freq_scale;
    double low = 0, high = 0;
    if (m->yarn) { /* beta_fast 32, beta_slow 1 */
        low = fmax(floor(yarn_corr_dim(32, m->n_rot, m->base, m->yarn_orig_ctx)), 0);
        high = fmin(ceil(yarn_corr_dim(1, m->n_rot, m->base, m->yarn_orig_ctx)), m->n_rot - 1);
        if (low == high) high += 0.001;
    }
    for (int t = 0; t < half; t++) {
        double inv = 1.0 / pow(m->base, 2.0 * t / m->n_rot);
        if (m->rope_freqs && m->use_rope_freqs) inv /= m->rope_freqs[t];
        if (m->yarn) {
            const double ramp = fmin(fmax((t - low) / (high - low), 0), 1);
            const double extrap = 1 - ramp; /* the share of the unscaled frequency */
            m->freq[t] = inv / factor * (1 - extrap) + inv * extrap;
        } else {
            m->freq[t] = inv * m->freq_scale;
        }
        m->freq_swa[t] = 1.0 / pow(m->base_swa, 2.0 * t / m->n_rot);
    }
    m->mscale = m->attn_factor * (m->yarn && factor > 1 ? 0.1 * log(factor) + 1.0 : 1.0);
    m->mscale_swa = m->attn_factor;
}

/* ------------------------------------------------------------ forward */

/* y[r] = sum_c W[r][c] x[c] (+ b[r]); W: [rows][cols]. */
static void rf_matvec(const float *W, const float *b, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int c = 0; c < cols; c++) s += (double)W[(size_t)r * cols + c] * x[c];
        y[r] = s + (b ? (double)b[r] : 0.0);
    }
}

static void rf_rmsnorm(const double *x, const float *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    double inv = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * inv * (double)w[i];
}

/* Rotates every head of v ([n_head][hd]) for position pos with table freq. */
static void rf_rope(const ref_model *m, double *v, int n_head, int pos, const double *freq, double mscale) {
    int half = m->n_rot / 2;
    for (int h = 0; h < n_head; h++) {
        double *x = v + (size_t)h * m->hd;
        for (int i = 0; i < half; i++) {
            double theta = pos * freq[i];
            double c = cos(theta) * mscale, s = sin(theta) * mscale;
            int a = m->neox ? i : 2 * i;
            int b = m->neox ? i + half : 2 * i + 1;
            double x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x0 * s + x1 * c;
        }
    }
}

static double silu(double x) { return x / (1.0 + exp(-x)); }
static double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }

/* A mixture-of-experts FFN on one normed row xb[E], added to x[E]: the router's
 * softmax, the K most probable experts (ties to the lower index), their
 * probabilities renormalised; g, u [F] and tmp [E] scratch. */
static void rf_moe(const ref_model *m, const ref_layer *y, const double *xb, double *g, double *u, double *tmp,
                   double *x) {
    const int E = m->E, F = m->F, NE = m->NE;
    double p[512], mx = -INFINITY, sum = 0;
    cr_assert(NE <= 512);
    rf_matvec(y->router, NULL, xb, NE, E, p);
    for (int e = 0; e < NE; e++) mx = fmax(mx, p[e]);
    for (int e = 0; e < NE; e++) sum += (p[e] = exp(p[e] - mx));
    bool taken[512] = {0};
    int ids[512];
    double w[512], wsum = 0;
    for (int j = 0; j < m->K; j++) {
        int best = -1;
        for (int e = 0; e < NE; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
        taken[best] = true;
        ids[j] = best;
        wsum += (w[j] = p[best] / sum);
    }
    for (int j = 0; j < m->K; j++) {
        const size_t e = (size_t)ids[j];
        rf_matvec(y->wg + e * F * E, NULL, xb, F, E, g);
        rf_matvec(y->wu + e * F * E, NULL, xb, F, E, u);
        for (int i = 0; i < F; i++) g[i] = silu(g[i]) * u[i];
        rf_matvec(y->wd + e * E * F, NULL, g, E, F, tmp);
        for (int i = 0; i < E; i++) x[i] += w[j] / wsum * tmp[i];
    }
}

double *ref_forward(const ref_model *m, const int32_t *tok, int n) {
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
        for (int i = 0; i < E; i++) x[(size_t)t * E + i] = m->tok_embd[(size_t)tok[t] * E + i] * m->embd_scale;

    for (int l = 0; l < m->L; l++) {
        const ref_layer *y = &m->layers[l];
        const double *freq = y->swa ? m->freq_swa : m->freq;
        const double mscale = y->swa ? m->mscale_swa : m->mscale;
        for (int t = 0; t < n; t++) {
            double *qt = q + (size_t)t * qd, *kt = k + (size_t)t * kvd;
            rf_rmsnorm(x + (size_t)t * E, y->attn_norm, E, m->eps, xb);
            rf_matvec(y->wq, y->bq, xb, qd, E, qt);
            rf_matvec(y->wk, y->bk, xb, kvd, E, kt);
            rf_matvec(y->wv, y->bv, xb, kvd, E, v + (size_t)t * kvd);
            if (y->q_norm) {
                for (int h = 0; h < m->H; h++) rf_rmsnorm(qt + (size_t)h * hd, y->q_norm, hd, m->eps, qt + (size_t)h * hd);
                for (int h = 0; h < m->Hkv; h++) rf_rmsnorm(kt + (size_t)h * hd, y->k_norm, hd, m->eps, kt + (size_t)h * hd);
            }
            rf_rope(m, qt, m->H, t, freq, mscale);
            rf_rope(m, kt, m->Hkv, t, freq, mscale);
        }
        for (int t = 0; t < n; t++) {
            const int j0 = y->swa && m->window > 0 && t - m->window + 1 > 0 ? t - m->window + 1 : 0;
            for (int h = 0; h < m->H; h++) {
                int kh = h / group;
                const double *qh = q + (size_t)t * qd + (size_t)h * hd;
                double mx = -INFINITY;
                for (int j = j0; j <= t; j++) {
                    const double *kj = k + (size_t)j * kvd + (size_t)kh * hd;
                    double s = 0;
                    for (int d = 0; d < hd; d++) s += qh[d] * kj[d];
                    s *= m->attn_scale;
                    if (m->attn_softcap > 0) s = m->attn_softcap * tanh(s / m->attn_softcap);
                    sc[j] = s;
                    if (s > mx) mx = s;
                }
                double sum = 0;
                for (int j = j0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                double *o = att + (size_t)h * hd;
                for (int d = 0; d < hd; d++) o[d] = 0;
                for (int j = j0; j <= t; j++) {
                    const double *vj = v + (size_t)j * kvd + (size_t)kh * hd;
                    for (int d = 0; d < hd; d++) o[d] += sc[j] / sum * vj[d];
                }
            }
            rf_matvec(y->wo, NULL, att, E, qd, tmp);
            if (y->post_attn) rf_rmsnorm(tmp, y->post_attn, E, m->eps, tmp);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += tmp[i];
        }
        for (int t = 0; t < n && m->NE > 0; t++) {
            rf_rmsnorm(x + (size_t)t * E, y->ffn_norm, E, m->eps, xb);
            rf_moe(m, y, xb, g, u, tmp, x + (size_t)t * E);
        }
        for (int t = 0; t < n && m->NE == 0; t++) {
            rf_rmsnorm(x + (size_t)t * E, y->ffn_norm, E, m->eps, xb);
            rf_matvec(y->wg, NULL, xb, F, E, g);
            rf_matvec(y->wu, NULL, xb, F, E, u);
            for (int i = 0; i < F; i++) g[i] = (m->gelu ? gelu_tanh(g[i]) : silu(g[i])) * u[i];
            rf_matvec(y->wd, NULL, g, E, F, tmp);
            if (y->post_ffn) rf_rmsnorm(tmp, y->post_ffn, E, m->eps, tmp);
            for (int i = 0; i < E; i++) x[(size_t)t * E + i] += tmp[i];
        }
    }
    for (int t = 0; t < n; t++) {
        double *lt = logits + (size_t)t * V;
        rf_rmsnorm(x + (size_t)t * E, m->out_norm, E, m->eps, xb);
        rf_matvec(m->output, NULL, xb, V, E, lt);
        if (m->final_softcap > 0)
            for (int i = 0; i < V; i++) lt[i] = m->final_softcap * tanh(lt[i] / m->final_softcap);
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
