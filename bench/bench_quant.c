/* bench_quant.c - the error of each `tandem quantize` type against the f16 model.
 *
 * Quantises MODEL (an f16 GGUF) to every type of quantize.h into a temporary file,
 * runs both on the CPU backend over the first P prompts of PROMPTS (JSON lines,
 * "prompt"), each cut to T tokens, one row per forward, and compares the logits at
 * every position: the normalised error ||q - f|| / ||f|| (mean and 95th percentile
 * over positions) and the top-1 agreement (positions whose argmax is the f16
 * model's).  Also the error of the quantised weights alone: the quantised file
 * converted back to f16 (exact but for f16's rounding) runs on the f32 path, so the
 * difference between the two columns is what the integer-dot kernels' int8 rounding
 * of x adds (kernels/cpu/qdot.h).  Prints a markdown table: type, tensors per type,
 * bits per weight of the matrices, errors.
 *
 * usage: bench_quant -m MODEL --prompts FILE [-P 20] [-T 96] [--threads 2] [--types q4_k_m,q8_0,...]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_prompts.h"
#include "engine.h"
#include "quantize.h"
#include "sampling.h"

static void die(const char *what, const tdm_err *err) {
    fprintf(stderr, "bench_quant: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

typedef struct run {
    tdm_backend *be;
    tdm_model *m;
    tdm_engine *e;
} run;

static void run_open(run *r, const char *path, int threads) {
    tdm_err err = {0};
    if (tdm_backend_cpu_create(1, &r->be, &err) || tdm_model_load(path, r->be, &r->m, &err)) die(path, &err);
    tdm_engine_cfg ec = {.n_threads = threads, .block_size = 16};
    if (tdm_engine_create(r->m, NULL, &ec, &r->e, &err)) die("engine", &err);
}

static void run_close(run *r) {
    tdm_engine_free(r->e);
    tdm_model_free(r->m);
    tdm_backend_destroy(r->be);
}

/* Logits at every position of tok[0..n) into out[n][V], one row per forward. */
static void logits_rows(run *r, const int32_t *tok, int32_t n, float *out) {
    int32_t V = r->m->hp.n_vocab;
    tdm_seq s;
    memset(&s, 0, sizeof s);
    s.tokens = (int32_t *)tok;
    s.n_tokens = s.cap = n;
    tdm_err err = {0};
    for (int32_t t = 0; t < n; t++) {
        if (tdm_engine_feed(r->e, &s, false, t, t + 1, true, TDM_FWD_LOGITS, &err)) die("forward", &err);
        memcpy(out + (size_t)t * V, r->e->logits_t, (size_t)V * sizeof(float));
    }
    tdm_kv_seq_free(r->e->pool, &s.kv);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct cmp_data {
    const int32_t *tok, *len;
    int n_prompts, T, threads;
    int32_t V;
    size_t n_pos;
    const float *lf; /* [n_pos][V] the f16 logits */
    float *lq;
    double *err_pos;
} cmp_data;

/* The model at path against the f16 logits: mean and p95 error, top-1 agreement. */
static void compare(cmp_data *c, const char *path, double *mean, double *p95, double *agree) {
    run q;
    run_open(&q, path, c->threads);
    for (int p = 0, off = 0; p < c->n_prompts; off += c->len[p], p++)
        logits_rows(&q, c->tok + (size_t)p * c->T, c->len[p], c->lq + (size_t)off * c->V);
    run_close(&q);
    size_t same = 0;
    double sum = 0;
    for (size_t i = 0; i < c->n_pos; i++) {
        const float *a = c->lf + i * c->V, *b = c->lq + i * c->V;
        double num = 0, den = 0;
        for (int32_t v = 0; v < c->V; v++) num += ((double)b[v] - a[v]) * ((double)b[v] - a[v]), den += (double)a[v] * a[v];
        c->err_pos[i] = den > 0 ? sqrt(num / den) : 0;
        sum += c->err_pos[i];
        same += tdm_argmax(a, c->V) == tdm_argmax(b, c->V);
    }
    qsort(c->err_pos, c->n_pos, sizeof(double), cmp_double);
    *mean = sum / (double)c->n_pos;
    *p95 = c->err_pos[(size_t)(0.95 * (double)(c->n_pos - 1))];
    *agree = 100.0 * (double)same / (double)c->n_pos;
}

int main(int argc, char **argv) {
    const char *model = NULL, *prompts_path = NULL;
    char types_buf[512] = "f16,q8_0,q6_k,q5_k_m,q5_k,q5_1,q5_0,q4_k_m,q4_k,q4_1,q4_0,q3_k_m,q3_k,q2_k";
    int P = 20, T = 96, threads = 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--prompts") && i + 1 < argc) prompts_path = argv[++i];
        else if (!strcmp(argv[i], "-P") && i + 1 < argc) P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-T") && i + 1 < argc) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--types") && i + 1 < argc) snprintf(types_buf, sizeof types_buf, "%s", argv[++i]);
        else {
            fprintf(stderr, "usage: %s -m MODEL --prompts FILE [-P 20] [-T 96] [--threads 2] [--types a,b]\n", argv[0]);
            return 2;
        }
    }
    if (!model || !prompts_path || P < 1 || T < 2) {
        fprintf(stderr, "bench_quant: -m MODEL and --prompts FILE are required\n");
        return 2;
    }
    int n_prompts = 0;
    char **prompts = bench_prompts_read(prompts_path, P, &n_prompts);
    run ref;
    run_open(&ref, model, threads);
    const int32_t V = ref.m->hp.n_vocab;
    int32_t *tok = malloc((size_t)n_prompts * T * sizeof(int32_t)), *len = calloc((size_t)n_prompts, sizeof(int32_t));
    size_t n_pos = 0;
    for (int p = 0; p < n_prompts; p++) {
        int32_t *ids = NULL;
        size_t n = 0;
        tdm_err err = {0};
        if (tdm_tokenize(ref.m->tok, prompts[p], strlen(prompts[p]), true, false, &ids, &n, &err)) die("tokenize", &err);
        len[p] = n < (size_t)T ? (int32_t)n : T;
        memcpy(tok + (size_t)p * T, ids, (size_t)len[p] * sizeof(int32_t));
        free(ids);
        n_pos += (size_t)len[p];
    }
    float *lf = malloc(n_pos * V * sizeof(float)), *lq = malloc(n_pos * V * sizeof(float));
    double *err_pos = malloc(n_pos * sizeof(double));
    if (!lf || !lq || !err_pos) die("out of memory", NULL);
    for (int p = 0, off = 0; p < n_prompts; off += len[p], p++)
        logits_rows(&ref, tok + (size_t)p * T, len[p], lf + (size_t)off * V);
    fprintf(stderr, "bench_quant: f16 logits of %zu positions (%d prompts of up to %d tokens)\n", n_pos, n_prompts, T);

    printf("| type | tensors by type | bits/weight (matrices) | logits error: mean | p95 | top-1 agreement | "
           "weights alone: error | top-1 |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    char tmp[] = "/tmp/bench_quant_XXXXXX", tmp2[] = "/tmp/bench_quant_f16_XXXXXX";
    int fd = mkstemp(tmp), fd2 = mkstemp(tmp2);
    if (fd < 0 || fd2 < 0) die("mkstemp", NULL);
    close(fd);
    close(fd2);
    cmp_data cd = {tok, len, n_prompts, T, threads, V, n_pos, lf, lq, err_pos};
    for (char *name = strtok(types_buf, ","); name; name = strtok(NULL, ",")) {
        const tdm_quant_kind *k = tdm_quant_kind_find(name);
        if (!k) {
            fprintf(stderr, "bench_quant: unknown type %s\n", name);
            continue;
        }
        tdm_err err = {0};
        if (tdm_quantize_file(model, tmp, k, true, NULL, NULL, &err)) die("quantize", &err);
        /* the tensors' types and the matrices' bits per weight */
        tdm_gguf *g = NULL;
        if (tdm_gguf_open(tmp, &g, &err)) die(tmp, &err);
        uint64_t counts[32] = {0}, mat_bytes = 0, mat_params = 0;
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const tdm_gguf_tensor *t = &g->tensors[i];
            if (t->n_dims < 2) continue;
            if (t->type < 32) counts[t->type]++;
            mat_bytes += t->nbytes;
            mat_params += (uint64_t)t->ne[0] * (uint64_t)t->ne[1];
        }
        tdm_gguf_close(g);
        double mean, p95, agree, wmean, wp95, wagree;
        compare(&cd, tmp, &mean, &p95, &agree);
        if (tdm_quantize_file(tmp, tmp2, tdm_quant_kind_find("f16"), true, NULL, NULL, &err)) die("to f16", &err);
        compare(&cd, tmp2, &wmean, &wp95, &wagree);
        char mix[160] = "";
        for (uint32_t t = 0; t < 32; t++)
            if (counts[t]) snprintf(mix + strlen(mix), sizeof mix - strlen(mix), "%s%llu %s", mix[0] ? ", " : "",
                                    (unsigned long long)counts[t], tdm_dtype_name(t));
        printf("| %s | %s | %.2f | %.4f | %.4f | %.1f %% | %.4f | %.1f %% |\n", k->name, mix,
               8.0 * (double)mat_bytes / (double)mat_params, mean, p95, agree, wmean, wagree);
        fflush(stdout);
    }
    unlink(tmp);
    unlink(tmp2);
    run_close(&ref);
    free(lf), free(lq), free(err_pos), free(tok), free(len);
    bench_prompts_free(prompts, n_prompts);
    return 0;
}
