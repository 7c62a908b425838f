/* kv_quality.c - see kv_quality.h. */
#include "kv_quality.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sampling.h"

typedef struct kvq_engine {
    tdm_backend *be; /* the model's (weights) */
    tdm_model *m;
    tdm_engine *e;
} kvq_engine;

static bool kvq_open(kvq_engine *k, const kvq_opts *o, tandem_kv_type type, bool fp8, tdm_err *err) {
    memset(k, 0, sizeof *k);
    tandem_status st = o->cuda ? tdm_backend_cuda_create(0, &k->be, err) : tdm_backend_cpu_create(1, &k->be, err);
    const tdm_load_opts opt = {.fp8 = fp8};
    if (st || tdm_model_load_opts(o->model, k->be, &opt, &k->m, err)) return false;
    tdm_engine_cfg ec = {.n_threads = o->threads, .block_size = 16, .kv_type = (int32_t)type};
    return tdm_engine_create(k->m, NULL, &ec, &k->e, err) == TANDEM_OK;
}

static void kvq_close(kvq_engine *k) {
    tdm_engine_free(k->e);
    tdm_model_free(k->m);
    tdm_backend_destroy(k->be);
}

/* Logits of every step of tokens[p, p + n) given tokens[0, p) into out[n][V]: step i
 * predicts token p + i.  follow: the tokens past the prompt are the argmaxes of the
 * steps (written into tokens); else they are read from tokens (teacher forcing). */
static bool kvq_steps(kvq_engine *k, int32_t *tokens, int32_t p, int32_t n, bool follow, float *out, tdm_err *err) {
    const int32_t V = k->m->hp.n_vocab;
    tdm_seq s;
    memset(&s, 0, sizeof s);
    s.tokens = tokens;
    s.n_tokens = s.cap = p + n;
    bool ok = true;
    for (int32_t i = 0; i < n && ok; i++) {
        ok = tdm_engine_feed(k->e, &s, false, i ? p + i - 1 : 0, p + i, true, TDM_FWD_LOGITS, err) == TANDEM_OK;
        if (!ok) break;
        memcpy(out + (size_t)i * V, k->e->logits_t, (size_t)V * sizeof(float));
        if (follow) tokens[p + i] = tdm_argmax(out + (size_t)i * V, V);
    }
    tdm_kv_seq_free(k->e->pool, &s.kv);
    return ok;
}

/* The top logit minus the second (0 for a single entry). */
static double top2_margin(const float *l, int32_t V) {
    float a = -INFINITY, b = -INFINITY;
    for (int32_t v = 0; v < V; v++) {
        if (l[v] > a) b = a, a = l[v];
        else if (l[v] > b) b = l[v];
    }
    return V > 1 ? (double)a - b : 0.0;
}

bool kvq_run(const kvq_opts *o, char *const *prompts, int n_prompts, kvq_stats *st, tdm_err *err) {
    memset(st, 0, sizeof *st);
    if (o->n_gen < 1 || o->prompt_tokens < 1) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv quality: n_gen %d, prompt_tokens %d", o->n_gen, o->prompt_tokens);
        return false;
    }
    kvq_engine r, t;
    memset(&t, 0, sizeof t);
    bool ok = kvq_open(&r, o, o->ref_type, false, err) && kvq_open(&t, o, o->test_type, o->test_fp8, err);
    const int32_t V = ok ? r.m->hp.n_vocab : 0, G = o->n_gen;
    int32_t *tok = ok ? malloc(((size_t)o->prompt_tokens + (size_t)G) * sizeof(int32_t)) : NULL;
    float *lr = ok ? malloc((size_t)G * V * sizeof(float)) : NULL, *lt = ok ? malloc((size_t)G * V * sizeof(float)) : NULL;
    if (ok && (!tok || !lr || !lt)) {
        tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        ok = false;
    }
    if (ok) {
        const tdm_kv_layout lay[2] = {tdm_model_kv_layout(r.m, r.e->kv_t.type), tdm_model_kv_layout(t.m, t.e->kv_t.type)};
        for (int i = 0; i < 2; i++) st->bytes_per_token[i] = tdm_kv_bytes_per_token(&lay[i], 16);
    }
    double num = 0, den = 0;
    for (int p = 0; ok && p < n_prompts; p++) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (tdm_tokenize(r.m->tok, prompts[p], strlen(prompts[p]), true, false, &ids, &n, err)) {
            ok = false;
            break;
        }
        const int32_t P = (int32_t)(n < (size_t)o->prompt_tokens ? n : (size_t)o->prompt_tokens);
        memcpy(tok, ids, (size_t)P * sizeof(int32_t));
        free(ids);
        if (P == 0) continue;
        ok = kvq_steps(&r, tok, P, G, true, lr, err) && kvq_steps(&t, tok, P, G, false, lt, err);
        int32_t dep = -1;
        for (int32_t i = 0; ok && i < G; i++) {
            const float *a = lr + (size_t)i * V, *b = lt + (size_t)i * V;
            double sn = 0, sd = 0;
            for (int32_t v = 0; v < V; v++) sn += ((double)b[v] - a[v]) * ((double)b[v] - a[v]), sd += (double)a[v] * a[v];
            num += sn, den += sd;
            if (sd > 0 && sqrt(sn / sd) > st->logits_err_max) st->logits_err_max = sqrt(sn / sd);
            const bool agree = tdm_argmax(b, V) == tok[P + i];
            st->n_steps++;
            st->n_agree += agree;
            if (dep < 0 && !agree) dep = i;
        }
        if (!ok) break;
        st->n_prompts++;
        st->prefix_sum += (uint64_t)(dep < 0 ? G : dep);
        if (dep < 0) {
            st->n_equal++;
            continue;
        }
        const double m = top2_margin(lr + (size_t)dep * V, V);
        if (m > st->worst_margin) st->worst_margin = m;
        if (m < o->tie_margin) st->n_near_tie++;
        else st->n_other++;
    }
    st->logits_err = den > 0 ? sqrt(num / den) : 0;
    free(tok), free(lr), free(lt);
    kvq_close(&t);
    kvq_close(&r);
    return ok;
}
