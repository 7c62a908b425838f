/* bench_profile.c - where the time of a decode step goes, per op and per model.
 *
 * Runs greedy generation over the first prompts of a prompts file (target-only, or
 * speculative with a draft and a fixed or adaptive k) and wraps the CPU backend's op
 * table to time every op call.  The first half of the prompts warms up; the second
 * half is measured.  Prints, per (model, op, rows in the call): calls per unit, mean
 * microseconds per call and per unit, where a unit is a decode token (target-only)
 * or a speculative step.  The model of a call is told by its width (the target's
 * n_embd); the output head is reported apart as "lm_head".
 *
 *   bench_profile -m TARGET [-d DRAFT] --prompts FILE [--limit 30] [-n 128]
 *                 [--spec-k K (0 = auto)] [--spec-ngram N] [--threads 2]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_prompts.h"
#include "engine.h"
#include "scheduler.h"
#include "tokenizer.h"

enum { OP_GET_ROWS, OP_RMSNORM, OP_MATMUL, OP_LM_HEAD, OP_ROPE, OP_KV_WRITE, OP_ATTENTION, OP_SWIGLU, OP_GATHER, OP_HEAD_ARGMAX, OP_QHEAD, OP_BLOCKS, N_OPS };
static const char *op_names[N_OPS] = {"get_rows", "rmsnorm",  "matmul", "lm_head", "rope",
                                      "kv_write", "attention", "swiglu", "gather", "head_argmax", "qhead_logits",
                                      "blocks"};
#define MAX_ROWS 17 /* calls with >= 16 rows share the last bin */

static const tdm_backend_ops *g_real;
static tdm_backend_ops g_wrap;
static int g_model, g_target_dim, g_vocab; /* current model: 0 target, 1 draft */
static double g_sec[2][N_OPS][MAX_ROWS];
static long g_calls[2][N_OPS][MAX_ROWS];

static void account(int op, int32_t n, double t0) {
    int b = n >= MAX_ROWS - 1 ? MAX_ROWS - 1 : n;
    g_sec[g_model][op][b] += tdm_now() - t0;
    g_calls[g_model][op][b]++;
}

/* Each wrapper restores the real table around the call (the CPU backend checks it). */
#define WRAP_CALL(op, n, call)          \
    do {                                \
        double t0_ = tdm_now();         \
        b->ops = g_real;                \
        tandem_status st_ = (call);     \
        b->ops = &g_wrap;               \
        account((op), (n), t0_);        \
        return st_;                     \
    } while (0)

static tandem_status w_get_rows(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n, float *out,
                                tdm_err *e) {
    g_model = w->cols == g_target_dim ? 0 : 1;
    WRAP_CALL(OP_GET_ROWS, n, g_real->get_rows(b, w, ids, n, out, e));
}
static tandem_status w_rmsnorm(tdm_backend *b, const float *x, const float *g, int32_t n, int32_t dim, float eps,
                               float *out, tdm_err *e) {
    g_model = dim == g_target_dim ? 0 : 1;
    WRAP_CALL(OP_RMSNORM, n, g_real->rmsnorm(b, x, g, n, dim, eps, out, e));
}
static tandem_status w_matmul(tdm_backend *b, const tdm_weight *w, const float *x, int32_t n, float *y, bool acc,
                              tdm_err *e) {
    WRAP_CALL(w->rows == g_vocab ? OP_LM_HEAD : OP_MATMUL, n, g_real->matmul(b, w, x, n, y, acc, e));
}
static tandem_status w_rope(tdm_backend *b, float *x, int32_t n, int32_t rs, int32_t nh, int32_t hd,
                            const int32_t *pos, const tdm_rope_params *p, tdm_err *e) {
    WRAP_CALL(OP_ROPE, n, g_real->rope(b, x, n, rs, nh, hd, pos, p, e));
}
static tandem_status w_kv_write(tdm_backend *b, const tdm_kv_write_args *a, tdm_err *e) {
    WRAP_CALL(OP_KV_WRITE, a->batch->n_rows, g_real->kv_write(b, a, e));
}
static tandem_status w_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *e) {
    WRAP_CALL(OP_ATTENTION, a->batch->n_rows, g_real->attention(b, a, e));
}
static tandem_status w_swiglu(tdm_backend *b, const float *g, int32_t n, int32_t ff, float *o, tdm_err *e) {
    WRAP_CALL(OP_SWIGLU, n, g_real->swiglu(b, g, n, ff, o, e));
}
static tandem_status w_gather(tdm_backend *b, const float *x, const int32_t *r, int32_t n, int32_t d, float *o,
                              tdm_err *e) {
    WRAP_CALL(OP_GATHER, n, g_real->gather_rows(b, x, r, n, d, o, e));
}
static tandem_status w_head_argmax(tdm_backend *b, const tdm_weight *w, const tdm_qhead *h, const float *x,
                                   int32_t n, const uint32_t *const *masks, int32_t *ids, tdm_err *e) {
    WRAP_CALL(OP_HEAD_ARGMAX, n, g_real->head_argmax(b, w, h, x, n, masks, ids, e));
}
static tandem_status w_qhead(tdm_backend *b, const tdm_qhead *h, const float *x, int32_t n, float *y,
                             tdm_err *e) {
    WRAP_CALL(OP_QHEAD, n, g_real->qhead_logits(b, h, x, n, y, e));
}

/* The tensor-parallel blocks (all layers in one call); calls it declines (the
 * draft's shapes) are not counted. */
static tandem_status w_blocks(tdm_backend *b, const tdm_blocks_args *a, tdm_err *e) {
    g_model = a->n_embd == g_target_dim ? 0 : 1;
    double t0 = tdm_now();
    b->ops = g_real;
    tandem_status st = g_real->blocks(b, a, e);
    b->ops = &g_wrap;
    if (st != TANDEM_ERR_UNSUPPORTED) account(OP_BLOCKS, a->batch->n_rows, t0);
    return st;
}

static void die(const char *what, const tdm_err *err) {
    fprintf(stderr, "error: %s: %s\n", what, err->msg);
    exit(1);
}

int main(int argc, char **argv) {
    const char *tpath = NULL, *dpath = NULL, *ppath = NULL;
    int limit = 30, n_new = 128, spec_k = 0, ngram = 0, threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-m")) tpath = v;
        else if (!strcmp(a, "-d")) dpath = v;
        else if (!strcmp(a, "--prompts")) ppath = v;
        else if (!strcmp(a, "--limit")) limit = atoi(v);
        else if (!strcmp(a, "-n")) n_new = atoi(v);
        else if (!strcmp(a, "--spec-k")) spec_k = atoi(v);
        else if (!strcmp(a, "--spec-ngram")) ngram = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else {
            fprintf(stderr, "error: unknown flag %s\n", a);
            return 2;
        }
    }
    if (!tpath || !ppath || limit < 2) {
        fprintf(stderr, "usage: bench_profile -m TARGET [-d DRAFT] --prompts FILE [--limit L] [-n N] "
                        "[--spec-k K] [--spec-ngram N] [--threads T]\n");
        return 2;
    }
    tdm_err err = {0};
    tdm_backend *wbe;
    tdm_model *target, *draft = NULL;
    tdm_engine *e;
    if (tdm_backend_cpu_create(1, &wbe, &err)) die("backend", &err);
    if (tdm_model_load(tpath, wbe, &target, &err)) die(tpath, &err);
    if (dpath && tdm_model_load(dpath, wbe, &draft, &err)) die(dpath, &err);
    tdm_engine_cfg cfg = {.n_threads = threads};
    if (tdm_engine_create(target, draft, &cfg, &e, &err)) die("engine", &err);
    g_target_dim = target->hp.n_embd;
    g_vocab = target->hp.n_vocab;
    g_real = e->be->ops;
    g_wrap = *g_real;
    g_wrap.get_rows = w_get_rows;
    g_wrap.rmsnorm = w_rmsnorm;
    g_wrap.matmul = w_matmul;
    g_wrap.rope = w_rope;
    g_wrap.kv_write = w_kv_write;
    g_wrap.attention = w_attention;
    g_wrap.swiglu = w_swiglu;
    g_wrap.gather_rows = w_gather;
    if (g_real->head_argmax) g_wrap.head_argmax = w_head_argmax;
    if (g_real->qhead_logits) g_wrap.qhead_logits = w_qhead;
    if (g_real->blocks) g_wrap.blocks = w_blocks;
    e->be->ops = &g_wrap;

    int n_prompts;
    char **prompts = bench_prompts_read(ppath, limit, &n_prompts);
    double decode_ms = 0, draft_ms = 0, verify_ms = 0;
    long tokens = 0, steps = 0;
    for (int np = 0; np < n_prompts; np++) {
        const char *text = prompts[np];
        int32_t *ids = NULL;
        size_t n_ids = 0; /* as tandem_generate encodes a prompt */
        if (tdm_tokenize(target->tok, text, strlen(text), true, true, &ids, &n_ids, &err))
            die("tokenize", &err);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = n_new;
        gp.spec_k = spec_k;
        gp.spec_ngram = ngram;
        if (np == n_prompts / 2) { /* the first half warmed up */
            memset(g_sec, 0, sizeof g_sec);
            memset(g_calls, 0, sizeof g_calls);
        }
        tandem_result r;
        if (tdm_generate_one(e, ids, (int32_t)n_ids, &gp, &r, &err)) die("generate", &err);
        if (np >= n_prompts / 2) {
            decode_ms += r.decode_ms;
            tokens += r.n_tokens > 0 ? (long)r.n_tokens - 1 : 0;
            draft_ms += r.spec.draft_ms;
            verify_ms += r.spec.verify_ms;
            steps += (long)r.spec.steps;
        }
        tandem_result_free(&r);
        free(ids);
    }
    bench_prompts_free(prompts, n_prompts);
    if (tokens == 0) {
        fprintf(stderr, "error: %s: fewer than 2 prompts\n", ppath);
        return 1;
    }
    double units = steps ? (double)steps : (double)tokens;
    printf("decode %.1f tok/s, %.4f ms per token", tokens / decode_ms * 1e3, decode_ms / tokens);
    if (steps)
        printf("; %ld steps, %.2f tokens per step, draft %.3f ms + verify %.3f ms per step", steps,
               (double)tokens / steps, draft_ms / steps, verify_ms / steps);
    printf("\nper %s (calls with 16+ rows, i.e. prefill, are amortised over the same units):\n",
           steps ? "step" : "token");
    printf("%-6s %-10s %5s %10s %10s %10s\n", "model", "op", "rows", "calls", "us/call", "us/unit");
    for (int m = 0; m < 2; m++)
        for (int op = 0; op < N_OPS; op++)
            for (int n = 0; n < MAX_ROWS; n++)
                if (g_calls[m][op][n])
                    printf("%-6s %-10s %4d%s %10.2f %10.2f %10.2f\n", m ? "draft" : "target", op_names[op], n,
                           n == MAX_ROWS - 1 ? "+" : " ", g_calls[m][op][n] / units,
                           g_sec[m][op][n] / g_calls[m][op][n] * 1e6, g_sec[m][op][n] / units * 1e6);
    tdm_engine_free(e);
    tdm_model_free(draft);
    tdm_model_free(target);
    tdm_backend_destroy(wbe);
    return 0;
}
