/* bench_batch.c - throughput and per-request latency of continuous batching against
 * the batch size, measured as llama.cpp's llama-batched-bench measures it (B
 * prompts of npp tokens, npp + ntg positions each, nothing shared), optionally with
 * speculation off and on.
 *
 *   bench_batch -m TARGET [-d DRAFT] [--backend cpu|cuda] [--batch 1,8,32,64,128] [--tensor-parallel N]
 *               [--npp 128] [--ntg 128] [--reps 3] [--threads N] [--prompts FILE.jsonl]
 *               [--max-batch-tokens N] [--json OUT.json] [--no-spec] [--invariant]
 *               [--temp T] [--weights native|fp8] [--kv-type auto|f16|q8_0|fp8]
 *   --threads: CPU threads (default 0 = all cores); --max-batch-tokens: the engine's
 *   max_batch_tokens (default 0 = its own); --no-spec: ignore -d; --temp: sample at
 *   temperature T (top-p 0.95, request i seeded i + 1) instead of greedy decoding;
 *   --weights fp8: both models with FP8 weights (tandem_model_params.weights);
 *   --kv-type: the KV cache's element type (tandem_engine_params.kv_type, default auto).
 *
 * For each batch size B: an engine with n_seq_max = B and n_ctx = npp + ntg + 64
 * (kv_bytes 0: the KV cache holds n_ctx tokens of each of the B sequences, both
 * models), the prefix cache off; B requests of exactly npp prompt tokens each, greedy
 * (or sampled: --temp),
 * max_tokens = ntg, ignore_eos, all given to one tandem_generate_batch call.  Prompts
 * are synthetic by default: pseudo-random ids in [4, n_vocab) (in [4, n_vocab - 256)
 * when n_vocab > 4096, past the reserved special tokens some vocabularies end with),
 * different for every request and every repetition.  With --prompts, request i of
 * repetition r takes prompt (r * B + i) mod n of the file (BOS as the model asks),
 * cut to npp tokens or filled up with the following prompts' tokens (real text, for
 * speculation's acceptance).  One untimed warm-up run per engine, then --reps timed
 * runs; with -d (and no --no-spec) each repetition runs speculation off (an engine
 * without the draft) and then on (the same target with the draft) on the same
 * prompts.  Every figure is the median over the repetitions of that figure.
 *
 * Definitions (times from a monotonic clock; t = 0 when tandem_generate_batch is
 * called; a token's time is when on_token receives it):
 *   T_total  the whole tandem_generate_batch call
 *   t_pp     the time the last request receives its first token
 *   t_end    the time the last token of any request is received
 *   T_PP     = t_pp;  S_PP = B * npp / T_PP
 *   T_TG     = t_end - t_pp
 *   N_TG     = the tokens received after t_pp (B * (ntg - 1) when every prompt is
 *              prefilled before decoding starts; fewer where decode steps overlapped
 *              prompt chunks; a step's tokens reach on_token one after another, so
 *              decode tokens of the step that gave the last first token may count)
 *   S_TG     = N_TG / T_TG: tokens per second of the generation phase.  This is
 *              llama-batched-bench's S_TG = B * TG / T_TG (TG decode steps of B
 *              tokens after the prompts' prefill) for the same work: B tokens per
 *              decode step over the time of the decode steps
 *   S_total  = B * (npp + ntg) / T_total (llama-batched-bench's S)
 *   per request: end-to-end = the time of its last token (all requests arrive at
 *   t = 0); TTFT = the time of its first token; TPOT = (last - first) / (ntg - 1);
 *   each reported as the median and the 90th percentile (linear interpolation)
 *   over the B requests of a run.
 *
 * Prints progress on stderr, a markdown table on stdout (and the on/off ratios with
 * a draft), and with --json every figure with each repetition's values, the date,
 * the machine and the command line.
 */
#include <dirent.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_prompts.h"
#include "tandem.h"

#define MAX_BATCHES 32
#define MAX_REPS 32
#define CTX_SLACK 64 /* positions per sequence beyond npp + ntg */

typedef struct opts {
    const char *target, *draft, *prompts, *json;
    tandem_model_params mp;
    int batch[MAX_BATCHES], n_batch;
    int npp, ntg, reps, threads, max_batch_tokens;
    bool spec; /* also run with the draft */
    bool invariant; /* tandem_engine_params.batch_invariant (--invariant: true) */
    float temp;     /* sampling temperature, 0 = greedy */
    tandem_kv_type kv_type; /* --kv-type (TANDEM_KV_AUTO: the backend's) */
} opts;

/* One timed run's figures (seconds, tokens per second). */
typedef struct figures {
    double t_total, t_pp, t_tg, s_pp, s_tg, s_total;
    double n_tg;
    double e2e_med, e2e_p90, tpot_med, tpot_p90, ttft_med, ttft_p90, ttft_p99;
    double lib_queue_ms, lib_prefill_ms, lib_decode_ms; /* medians of tandem_result's */
    double drafted, accepted, steps, preemptions, cached;
} figures;

#define N_FIG (sizeof(figures) / sizeof(double)) /* (all its fields are doubles) */
_Static_assert(sizeof(figures) % sizeof(double) == 0, "figures holds doubles only");

/* Every repetition of one (batch size, speculation) cell, and their medians. */
typedef struct cell {
    int batch;
    bool spec;
    int n;
    figures rep[MAX_REPS], med;
    double peak_device_mb;
} cell;

/* The prompt token ids of a --prompts file: with BOS as the model asks (a request's
 * start) and without (what fills a short request up). */
typedef struct prompt_set {
    int n;
    int32_t **ids, **cont;
    size_t *n_ids, *n_cont;
} prompt_set;

/* One request's token times. */
typedef struct req_clock {
    double *t;
    int n, cap;
} req_clock;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool on_token(int32_t token, const char *text, size_t len, void *user_data) {
    (void)token, (void)text, (void)len;
    req_clock *c = user_data;
    if (c->n < c->cap) c->t[c->n] = now_s();
    c->n++;
    return true;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of v[0..n) (sorts v), linear interpolation between order statistics. */
static double quantile(double *v, int n, double q) {
    if (n <= 0) return NAN;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    double pos = q * (double)(n - 1);
    int lo = (int)pos;
    if (lo >= n - 1) return v[n - 1];
    return v[lo] + (pos - (double)lo) * (v[lo + 1] - v[lo]);
}

/* ------------------------------------------------------------------ arguments */

/* A comma-separated list of positive integers. */
static bool parse_int_list(const char *s, int *out, int max, int *n) {
    *n = 0;
    while (*s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 1 || v > 1 << 20 || *n >= max) return false;
        out[(*n)++] = (int)v;
        s = end;
        if (*s == ',') s++;
        else if (*s) return false;
    }
    return *n > 0;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

static int usage(const char *msg, const char *arg) {
    if (msg) fprintf(stderr, "error: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "usage: bench_batch -m TARGET [-d DRAFT] [--backend cpu|cuda] [--batch 1,8,32,64,128]\n"
                    "                   [--npp 128] [--ntg 128] [--reps 3] [--threads N] [--prompts FILE.jsonl]\n"
                    "                   [--max-batch-tokens N] [--json OUT.json] [--no-spec]\n"
                    "                   [--invariant] [--temp T] [--tensor-parallel N] [--weights native|fp8]\n"
                    "                   [--kv-type auto|f16|q8_0|fp8]\n");
    return 2;
}

static int parse_args(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->mp = tandem_model_default_params();
    o->npp = 128, o->ntg = 128, o->reps = 3, o->spec = true, o->invariant = tandem_engine_default_params().batch_invariant;
    static const int def_batch[] = {1, 8, 32, 64, 128};
    o->n_batch = (int)(sizeof def_batch / sizeof def_batch[0]);
    memcpy(o->batch, def_batch, sizeof def_batch);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--no-spec")) {
            o->spec = false;
            continue;
        }
        if (!strcmp(a, "--invariant")) {
            o->invariant = true;
            continue;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(NULL, NULL);
        const char *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) return usage("a value is missing after", a);
        bool ok = true;
        if (!strcmp(a, "-m")) o->target = v;
        else if (!strcmp(a, "-d")) o->draft = v;
        else if (!strcmp(a, "--prompts")) o->prompts = v;
        else if (!strcmp(a, "--json")) o->json = v;
        else if (!strcmp(a, "--batch")) ok = parse_int_list(v, o->batch, MAX_BATCHES, &o->n_batch);
        else if (!strcmp(a, "--npp")) ok = parse_int(v, 1, 1 << 20, &o->npp);
        else if (!strcmp(a, "--ntg")) ok = parse_int(v, 2, 1 << 20, &o->ntg);
        else if (!strcmp(a, "--reps")) ok = parse_int(v, 1, MAX_REPS, &o->reps);
        else if (!strcmp(a, "--threads")) ok = parse_int(v, 0, TANDEM_THREADS_MAX, &o->threads);
        else if (!strcmp(a, "--max-batch-tokens")) ok = parse_int(v, 0, 65536, &o->max_batch_tokens);
        else if (!strcmp(a, "--tensor-parallel")) ok = parse_int(v, 1, 8, &o->mp.tensor_parallel);
        else if (!strcmp(a, "--temp")) {
            char *end;
            o->temp = strtof(v, &end);
            ok = end != v && !*end && o->temp >= 0.0f && o->temp <= 100.0f;
        }
        else if (!strcmp(a, "--weights")) {
            ok = !strcmp(v, "native") || !strcmp(v, "fp8");
            o->mp.weights = strcmp(v, "fp8") ? TANDEM_WEIGHTS_NATIVE : TANDEM_WEIGHTS_FP8;
        }
        else if (!strcmp(a, "--kv-type")) {
            static const char *const names[] = {"auto", "f32", "f16", "q8_0", "fp8"};
            ok = false;
            for (int k = 0; k < (int)(sizeof names / sizeof names[0]); k++)
                if (!strcmp(v, names[k])) o->kv_type = (tandem_kv_type)k, ok = true;
        }
        else if (!strcmp(a, "--backend")) {
            ok = !strcmp(v, "cpu") || !strcmp(v, "cuda");
            o->mp.backend = strcmp(v, "cuda") ? TANDEM_BACKEND_CPU : TANDEM_BACKEND_CUDA;
        } else return usage("unknown option", a);
        if (!ok) return usage("bad value", a);
    }
    if (!o->target) return usage("-m TARGET is required", NULL);
    if (!o->draft) o->spec = false;
    return 0;
}

/* -------------------------------------------------------------------- prompts */

static void prompt_set_free(prompt_set *ps) {
    for (int i = 0; i < ps->n; i++) {
        tandem_free(ps->ids[i]);
        tandem_free(ps->cont[i]);
    }
    free(ps->ids), free(ps->cont), free(ps->n_ids), free(ps->n_cont);
    memset(ps, 0, sizeof *ps);
}

static tandem_status prompt_set_load(const tandem_model *m, const char *path, prompt_set *ps) {
    memset(ps, 0, sizeof *ps);
    int n;
    char **text = bench_prompts_read(path, 1 << 30, &n);
    tandem_status st = TANDEM_OK;
    if (n == 0) {
        fprintf(stderr, "error: %s: no prompts\n", path);
        st = TANDEM_ERR_FORMAT;
    }
    ps->ids = calloc((size_t)n + 1, sizeof *ps->ids);
    ps->cont = calloc((size_t)n + 1, sizeof *ps->cont);
    ps->n_ids = calloc((size_t)n + 1, sizeof *ps->n_ids);
    ps->n_cont = calloc((size_t)n + 1, sizeof *ps->n_cont);
    if (!st && (!ps->ids || !ps->cont || !ps->n_ids || !ps->n_cont)) st = TANDEM_ERR_NOMEM;
    for (int i = 0; i < n && !st; i++, ps->n++) {
        st = tandem_tokenize(m, text[i], strlen(text[i]), true, &ps->ids[i], &ps->n_ids[i]);
        if (!st) st = tandem_tokenize(m, text[i], strlen(text[i]), false, &ps->cont[i], &ps->n_cont[i]);
        if (st) fprintf(stderr, "error: %s: prompt %d: %s\n", path, i, tandem_last_error());
    }
    bench_prompts_free(text, n);
    if (st) prompt_set_free(ps);
    return st;
}

/* Request i of repetition rep (rep == reps: the warm-up): npp ids into out. */
static void fill_prompt(const prompt_set *ps, int n_vocab, int B, int rep, int i, int npp, int32_t *out) {
    if (ps->n == 0) {
        const int lo = 4, hi = n_vocab > 4096 ? n_vocab - 256 : n_vocab;
        uint64_t x = ((uint64_t)rep << 32) ^ (uint64_t)i; /* a 64-bit LCG (Knuth's MMIX), its high bits */
        for (int k = 0; k < npp; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            out[k] = lo + (int32_t)((x >> 33) % (uint64_t)(hi - lo));
        }
        return;
    }
    int p = (int)(((long long)rep * B + i) % ps->n), k = 0;
    for (size_t j = 0; j < ps->n_ids[p] && k < npp; j++) out[k++] = ps->ids[p][j];
    while (k < npp) {
        p = (p + 1) % ps->n;
        for (size_t j = 0; j < ps->n_cont[p] && k < npp; j++) out[k++] = ps->cont[p][j];
    }
}

/* ---------------------------------------------------------------- measuring */

/* Buffers of one batch size's runs. */
typedef struct run_bufs {
    int B;
    tandem_request *req;
    tandem_result *res;
    req_clock *clk;
    int32_t *ids;
    double *times, *scratch;
} run_bufs;

static void run_bufs_free(run_bufs *rb) {
    free(rb->req), free(rb->res), free(rb->clk), free(rb->ids), free(rb->times), free(rb->scratch);
    memset(rb, 0, sizeof *rb);
}

static bool run_bufs_init(run_bufs *rb, int B, const opts *o) {
    memset(rb, 0, sizeof *rb);
    rb->B = B;
    rb->req = calloc((size_t)B, sizeof *rb->req);
    rb->res = calloc((size_t)B, sizeof *rb->res);
    rb->clk = calloc((size_t)B, sizeof *rb->clk);
    rb->ids = calloc((size_t)B * (size_t)o->npp, sizeof *rb->ids);
    rb->times = calloc((size_t)B * (size_t)o->ntg, sizeof *rb->times);
    rb->scratch = calloc((size_t)B, sizeof *rb->scratch);
    if (!rb->req || !rb->res || !rb->clk || !rb->ids || !rb->times || !rb->scratch) {
        run_bufs_free(rb);
        return false;
    }
    for (int i = 0; i < B; i++) {
        rb->clk[i] = (req_clock){.t = rb->times + (size_t)i * (size_t)o->ntg, .cap = o->ntg};
        tandem_request *r = &rb->req[i];
        memset(r, 0, sizeof *r);
        r->prompt_ids = rb->ids + (size_t)i * (size_t)o->npp;
        r->n_prompt_ids = (size_t)o->npp;
        r->params = tandem_generate_default_params();
        r->params.max_tokens = o->ntg;
        r->params.temperature = o->temp;
        r->params.top_p = o->temp > 0 ? 0.95f : 1.0f;
        r->params.seed = (uint64_t)i + 1;
        r->params.ignore_eos = true;
        r->params.on_token = on_token;
        r->params.user_data = &rb->clk[i];
    }
    return true;
}

/* The median over the requests of the double at byte offset off of tandem_result. */
static double result_median(run_bufs *rb, size_t off) {
    for (int i = 0; i < rb->B; i++) rb->scratch[i] = *(const double *)((const char *)&rb->res[i] + off);
    return quantile(rb->scratch, rb->B, 0.5);
}

/* The median and the 90th percentile of rb->scratch. */
static void spread(run_bufs *rb, double *med, double *p90) {
    *med = quantile(rb->scratch, rb->B, 0.5);
    *p90 = quantile(rb->scratch, rb->B, 0.9);
}

/* The figures of a finished run; false (with a message) when a request did not
 * produce exactly ntg tokens. */
static bool run_figures(run_bufs *rb, const opts *o, double t0, double t_total, figures *f) {
    const int B = rb->B;
    memset(f, 0, sizeof *f);
    for (int i = 0; i < B; i++) {
        const tandem_result *r = &rb->res[i];
        if (r->status != TANDEM_OK || r->n_tokens != (size_t)o->ntg || rb->clk[i].n != o->ntg) {
            fprintf(stderr, "error: request %d of batch %d: %s (%zu tokens of %d, %d seen by on_token, finish %s)\n", i,
                    B, r->status ? (r->error ? r->error : tandem_status_str(r->status)) : "too few tokens",
                    r->n_tokens, o->ntg, rb->clk[i].n, tandem_finish_reason_str(r->finish_reason));
            return false;
        }
    }
    double t_pp = 0, t_end = 0;
    for (int i = 0; i < B; i++) {
        const req_clock *c = &rb->clk[i];
        t_pp = fmax(t_pp, c->t[0] - t0);
        t_end = fmax(t_end, c->t[c->n - 1] - t0);
    }
    for (int i = 0; i < B; i++)
        for (int k = 0; k < rb->clk[i].n; k++) f->n_tg += rb->clk[i].t[k] - t0 > t_pp;
    f->t_total = t_total;
    f->t_pp = t_pp;
    f->t_tg = t_end - t_pp;
    f->s_pp = (double)B * o->npp / t_pp;
    f->s_tg = f->t_tg > 0 ? f->n_tg / f->t_tg : NAN;
    f->s_total = (double)B * (o->npp + o->ntg) / t_total;
    for (int i = 0; i < B; i++) rb->scratch[i] = rb->clk[i].t[o->ntg - 1] - t0;
    spread(rb, &f->e2e_med, &f->e2e_p90);
    for (int i = 0; i < B; i++) rb->scratch[i] = rb->clk[i].t[0] - t0;
    spread(rb, &f->ttft_med, &f->ttft_p90);
    f->ttft_p99 = quantile(rb->scratch, rb->B, 0.99);
    for (int i = 0; i < B; i++) rb->scratch[i] = (rb->clk[i].t[o->ntg - 1] - rb->clk[i].t[0]) / (o->ntg - 1);
    spread(rb, &f->tpot_med, &f->tpot_p90);
    f->lib_queue_ms = result_median(rb, offsetof(tandem_result, queue_ms));
    f->lib_prefill_ms = result_median(rb, offsetof(tandem_result, prefill_ms));
    f->lib_decode_ms = result_median(rb, offsetof(tandem_result, decode_ms));
    for (int i = 0; i < B; i++) {
        const tandem_result *r = &rb->res[i];
        f->drafted += (double)r->spec.drafted;
        f->accepted += (double)r->spec.accepted;
        f->steps += (double)r->spec.steps;
        f->preemptions += r->n_preemptions;
        f->cached += (double)r->n_cached_tokens;
    }
    return true;
}

/* One tandem_generate_batch call over B requests of repetition rep. */
static bool run_once(tandem_engine *e, run_bufs *rb, const prompt_set *ps, int n_vocab, const opts *o, int rep,
                     figures *f) {
    for (int i = 0; i < rb->B; i++) {
        fill_prompt(ps, n_vocab, rb->B, rep, i, o->npp, rb->ids + (size_t)i * (size_t)o->npp);
        rb->clk[i].n = 0;
    }
    double t0 = now_s();
    tandem_status st = tandem_generate_batch(e, rb->req, (size_t)rb->B, rb->res);
    double t_total = now_s() - t0;
    bool ok = st == TANDEM_OK;
    if (!ok) fprintf(stderr, "error: tandem_generate_batch: %s: %s\n", tandem_status_str(st), tandem_last_error());
    if (ok) ok = run_figures(rb, o, t0, t_total, f);
    for (int i = 0; i < rb->B; i++) tandem_result_free(&rb->res[i]);
    return ok;
}

static void cell_medians(cell *c) {
    double v[MAX_REPS];
    for (size_t k = 0; k < N_FIG; k++) {
        for (int r = 0; r < c->n; r++) v[r] = ((const double *)&c->rep[r])[k];
        ((double *)&c->med)[k] = quantile(v, c->n, 0.5);
    }
}

static tandem_status open_engine(tandem_model *target, tandem_model *draft, int B, const opts *o,
                                 tandem_engine **out) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = o->threads;
    ep.n_seq_max = B;
    ep.n_ctx = o->npp + o->ntg + CTX_SLACK;
    ep.kv_bytes = 0; /* n_ctx tokens for each of the B sequences */
    ep.max_batch_tokens = o->max_batch_tokens;
    ep.prefix_cache = false; /* every figure from prompts computed in full */
    ep.batch_invariant = o->invariant;
    ep.kv_type = o->kv_type;
    tandem_status st = tandem_engine_open(target, draft, &ep, out);
    if (st)
        fprintf(stderr, "error: engine for batch %d%s: %s: %s\n", B, draft ? " with the draft" : "",
                tandem_status_str(st), tandem_last_error());
    return st;
}

/* Every repetition of one batch size: cells[0] speculation off, cells[1] on. */
static bool measure_batch(tandem_model *target, tandem_model *draft, int n_vocab, const prompt_set *ps,
                          const opts *o, int B, cell *cells) {
    const int n_modes = o->spec ? 2 : 1;
    tandem_engine *eng[2] = {NULL, NULL};
    run_bufs rb;
    if (!run_bufs_init(&rb, B, o)) {
        fprintf(stderr, "error: out of memory for batch %d\n", B);
        return false;
    }
    bool ok = true;
    for (int m = 0; m < n_modes && ok; m++) {
        cells[m] = (cell){.batch = B, .spec = m == 1};
        ok = !open_engine(target, m ? draft : NULL, B, o, &eng[m]);
    }
    for (int m = 0; m < n_modes && ok; m++) {
        figures f;
        fprintf(stderr, "batch %d, speculation %s: warm-up\n", B, m ? "on" : "off");
        ok = run_once(eng[m], &rb, ps, n_vocab, o, o->reps, &f);
    }
    for (int r = 0; r < o->reps && ok; r++)
        for (int m = 0; m < n_modes && ok; m++) {
            figures *f = &cells[m].rep[r];
            ok = run_once(eng[m], &rb, ps, n_vocab, o, r, f);
            if (!ok) break;
            cells[m].n++;
            fprintf(stderr,
                    "batch %d, speculation %s, rep %d/%d: S_TG %.1f tok/s, S_PP %.1f tok/s, total %.3f s, "
                    "end-to-end median %.3f s\n",
                    B, m ? "on" : "off", r + 1, o->reps, f->s_tg, f->s_pp, f->t_total, f->e2e_med);
        }
    for (int m = 0; m < n_modes; m++) {
        if (ok) {
            cell_medians(&cells[m]);
            cells[m].peak_device_mb = (double)tandem_engine_device_peak_bytes(eng[m]) / (1024.0 * 1024.0);
        }
        tandem_engine_close(eng[m]);
    }
    run_bufs_free(&rb);
    return ok;
}

/* ------------------------------------------------------------------ output */

static void print_tables(const opts *o, const cell *cells, int n_cells) {
    printf("| B | speculation | S_PP tok/s | S_TG tok/s | S_total tok/s | T_total s | end-to-end median / p90 s | "
           "TPOT median / p90 ms | TTFT median / p99 ms | acceptance |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < n_cells; c++) {
        const figures *f = &cells[c].med;
        char acc[32] = "-";
        if (cells[c].spec) snprintf(acc, sizeof acc, f->drafted > 0 ? "%.3f" : "none drafted", f->accepted / f->drafted);
        printf("| %d | %s | %.1f | %.1f | %.1f | %.3f | %.3f / %.3f | %.2f / %.2f | %.1f / %.1f | %s |\n", cells[c].batch,
               cells[c].spec ? "on" : "off", f->s_pp, f->s_tg, f->s_total, f->t_total, f->e2e_med, f->e2e_p90,
               1e3 * f->tpot_med, 1e3 * f->tpot_p90, 1e3 * f->ttft_med, 1e3 * f->ttft_p99, acc);
    }
    if (!o->spec) return;
    printf("\n| B | S_TG off | S_TG on | on / off | per repetition min-max | S_total off | S_total on | on / off |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c + 1 < n_cells; c += 2) {
        const cell *off = &cells[c], *on = &cells[c + 1];
        double lo = INFINITY, hi = 0;
        for (int r = 0; r < on->n; r++) {
            double q = on->rep[r].s_tg / off->rep[r].s_tg;
            lo = fmin(lo, q), hi = fmax(hi, q);
        }
        printf("| %d | %.1f | %.1f | %.3f | %.3f-%.3f | %.1f | %.1f | %.3f |\n", off->batch, off->med.s_tg,
               on->med.s_tg, on->med.s_tg / off->med.s_tg, lo, hi, off->med.s_total, on->med.s_total,
               on->med.s_total / off->med.s_total);
    }
}

static void json_str(FILE *f, const char *s) {
    if (!s) {
        fputs("null", f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

/* "name": value, */
static void json_field(FILE *f, const char *name, double v) {
    fprintf(f, "\"%s\": ", name);
    json_num(f, v);
    fputs(", ", f);
}

static void json_figures(FILE *f, const figures *x) {
    fputc('{', f);
    json_field(f, "s_pp", x->s_pp), json_field(f, "s_tg", x->s_tg), json_field(f, "s_total", x->s_total);
    json_field(f, "t_pp_s", x->t_pp), json_field(f, "t_tg_s", x->t_tg), json_field(f, "t_total_s", x->t_total);
    json_field(f, "n_tg_tokens", x->n_tg);
    json_field(f, "e2e_median_s", x->e2e_med), json_field(f, "e2e_p90_s", x->e2e_p90);
    json_field(f, "tpot_median_ms", 1e3 * x->tpot_med), json_field(f, "tpot_p90_ms", 1e3 * x->tpot_p90);
    json_field(f, "ttft_median_ms", 1e3 * x->ttft_med), json_field(f, "ttft_p90_ms", 1e3 * x->ttft_p90);
    json_field(f, "ttft_p99_ms", 1e3 * x->ttft_p99);
    json_field(f, "lib_queue_median_ms", x->lib_queue_ms), json_field(f, "lib_prefill_median_ms", x->lib_prefill_ms);
    json_field(f, "lib_decode_median_ms", x->lib_decode_ms);
    json_field(f, "spec_drafted", x->drafted), json_field(f, "spec_accepted", x->accepted);
    json_field(f, "spec_steps", x->steps);
    json_field(f, "acceptance", x->drafted > 0 ? x->accepted / x->drafted : NAN);
    json_field(f, "preemptions", x->preemptions);
    fputs("\"cached_tokens\": ", f);
    json_num(f, x->cached);
    fputc('}', f);
}

/* The first line of path that starts with key, after the key and any ':' and blanks. */
static void read_keyed_line(const char *path, const char *key, char *out, size_t cap) {
    FILE *f = fopen(path, "r");
    char line[512];
    out[0] = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (strncmp(line, key, strlen(key))) continue;
        char *v = line + strlen(key);
        while (*v == ' ' || *v == '\t' || *v == ':') v++;
        v[strcspn(v, "\n")] = 0;
        snprintf(out, cap, "%s", v);
        break;
    }
    if (f) fclose(f);
}

/* The first NVIDIA GPU's model name from the driver's /proc files ("" if none). */
static void gpu_name(char *out, size_t cap) {
    out[0] = 0;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (!d) return;
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        if (de->d_name[0] == '.') continue;
        char path[512];
        snprintf(path, sizeof path, "/proc/driver/nvidia/gpus/%s/information", de->d_name);
        read_keyed_line(path, "Model", out, cap);
        if (out[0]) break;
    }
    closedir(d);
}

static bool write_json(const opts *o, int argc, char **argv, const tandem_model_info *ti, const cell *cells,
                       int n_cells) {
    FILE *f = fopen(o->json, "w");
    if (!f) {
        fprintf(stderr, "error: cannot write %s\n", o->json);
        return false;
    }
    char host[256] = "", cpu[256], gpu[256] = "", date[64], cmd[4096] = "";
    gethostname(host, sizeof host - 1);
    read_keyed_line("/proc/cpuinfo", "model name", cpu, sizeof cpu);
    if (o->mp.backend == TANDEM_BACKEND_CUDA) gpu_name(gpu, sizeof gpu);
    time_t now = time(NULL);
    struct tm tm;
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(cmd);
        snprintf(cmd + len, sizeof cmd - len, "%s%s", i ? " " : "", argv[i]);
    }
    fputs("{\"tool\": \"bench_batch\", \"date\": ", f);
    json_str(f, date);
    fputs(", \"host\": ", f), json_str(f, host);
    fputs(", \"cpu\": ", f), json_str(f, cpu);
    fprintf(f, ", \"n_cpus\": %ld, \"gpu\": ", sysconf(_SC_NPROCESSORS_ONLN));
    json_str(f, gpu[0] ? gpu : NULL);
    fputs(", \"command\": ", f), json_str(f, cmd);
    fputs(",\n \"backend\": ", f), json_str(f, o->mp.backend == TANDEM_BACKEND_CUDA ? "cuda" : "cpu");
    fputs(", \"target\": ", f), json_str(f, o->target);
    fputs(", \"draft\": ", f), json_str(f, o->spec ? o->draft : NULL);
    fputs(", \"prompts\": ", f), json_str(f, o->prompts);
    fputs(", \"model\": {\"arch\": ", f), json_str(f, ti->arch);
    fputs(", \"name\": ", f), json_str(f, ti->name);
    fprintf(f, ", \"n_params\": %llu, \"n_layer\": %d, \"n_embd\": %d, \"n_vocab\": %d}",
            (unsigned long long)ti->n_params, ti->n_layer, ti->n_embd, ti->n_vocab);
    fprintf(f, ",\n \"npp\": %d, \"ntg\": %d, \"reps\": %d, \"threads\": %d, \"max_batch_tokens\": %d, \"n_ctx\": %d, \"batch_invariant\": %s, \"temperature\": %g",
            o->npp, o->ntg, o->reps, o->threads, o->max_batch_tokens, o->npp + o->ntg + CTX_SLACK,
            o->invariant ? "true" : "false", (double)o->temp);
    static const char *const kv_names[] = {"auto", "f32", "f16", "q8_0", "fp8"};
    fputs(", \"weights\": ", f), json_str(f, o->mp.weights == TANDEM_WEIGHTS_FP8 ? "fp8" : "native");
    fputs(", \"kv_type\": ", f), json_str(f, kv_names[o->kv_type]);
    fputs(",\n \"definitions\": {"
          "\"t\": \"seconds from the tandem_generate_batch call; a token's time is when on_token receives it\", "
          "\"t_pp\": \"the time the last request receives its first token\", "
          "\"s_pp\": \"B * npp / t_pp\", "
          "\"t_tg\": \"t_end - t_pp, t_end = the time of the last token of any request\", "
          "\"n_tg_tokens\": \"tokens received after t_pp (B * (ntg - 1) when all prefills come first)\", "
          "\"s_tg\": \"n_tg_tokens / t_tg (llama-batched-bench: B * TG / T_TG, B tokens per decode step)\", "
          "\"s_total\": \"B * (npp + ntg) / t_total (the whole call)\", "
          "\"e2e\": \"a request's last token time\", \"ttft\": \"a request's first token time\", "
          "\"tpot\": \"(last - first token time) / (ntg - 1)\", "
          "\"aggregation\": \"median and p90 (TTFT also p99) over a run's B requests; every figure the median over reps\"}",
          f);
    fputs(",\n \"runs\": [", f);
    for (int c = 0; c < n_cells; c++) {
        const cell *x = &cells[c];
        fprintf(f, "%s\n  {\"batch\": %d, \"spec\": %s, \"peak_device_mb\": %.1f, \"median\": ", c ? "," : "",
                x->batch, x->spec ? "true" : "false", x->peak_device_mb);
        json_figures(f, &x->med);
        fputs(", \"reps\": [", f);
        for (int r = 0; r < x->n; r++) {
            if (r) fputs(", ", f);
            json_figures(f, &x->rep[r]);
        }
        fputs("]}", f);
    }
    fputs("\n ],\n \"spec_ratio\": [", f);
    for (int c = 0; o->spec && c + 1 < n_cells; c += 2) {
        const cell *off = &cells[c], *on = &cells[c + 1];
        fprintf(f, "%s\n  {\"batch\": %d, ", c ? "," : "", off->batch);
        json_field(f, "s_tg_on_off", on->med.s_tg / off->med.s_tg);
        fputs("\"s_tg_on_off_reps\": [", f);
        for (int r = 0; r < on->n; r++) {
            if (r) fputs(", ", f);
            json_num(f, on->rep[r].s_tg / off->rep[r].s_tg);
        }
        fputs("], ", f);
        json_field(f, "s_total_on_off", on->med.s_total / off->med.s_total);
        fputs("\"e2e_median_on_off\": ", f);
        json_num(f, on->med.e2e_med / off->med.e2e_med);
        fputc('}', f);
    }
    fputs("\n ]}\n", f);
    bool ok = !ferror(f);
    ok &= fclose(f) == 0;
    if (!ok) fprintf(stderr, "error: writing %s failed\n", o->json);
    return ok;
}

int main(int argc, char **argv) {
    opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc) return rc;
    tandem_model *target = NULL, *draft = NULL;
    tandem_model_info ti;
    prompt_set ps = {0};
    cell *cells = calloc((size_t)o.n_batch * 2, sizeof *cells);
    int n_cells = 0;
    rc = 1;
    if (!cells) {
        fprintf(stderr, "error: out of memory\n");
        goto done;
    }
    tandem_model_params dmp = o.mp;
    dmp.tensor_parallel = 1; /* (the draft runs whole) */
    if (tandem_model_open(o.target, &o.mp, &target) || (o.spec && tandem_model_open(o.draft, &dmp, &draft))) {
        fprintf(stderr, "error: %s\n", tandem_last_error());
        goto done;
    }
    if (tandem_model_get_info(target, &ti)) {
        fprintf(stderr, "error: %s: %s\n", o.target, tandem_last_error());
        goto done;
    }
    if (o.prompts && prompt_set_load(target, o.prompts, &ps)) goto done;
    fprintf(stderr, "bench_batch: %s%s%s, %s, npp %d, ntg %d, %d reps, %s prompts\n", o.target,
            o.spec ? " + " : "", o.spec ? o.draft : "", o.mp.backend == TANDEM_BACKEND_CUDA ? "cuda" : "cpu", o.npp,
            o.ntg, o.reps, o.prompts ? o.prompts : "synthetic");
    for (int b = 0; b < o.n_batch; b++) {
        if (!measure_batch(target, draft, ti.n_vocab, &ps, &o, o.batch[b], cells + n_cells)) goto done;
        n_cells += o.spec ? 2 : 1;
    }
    print_tables(&o, cells, n_cells);
    rc = o.json && !write_json(&o, argc, argv, &ti, cells, n_cells);
done:
    prompt_set_free(&ps);
    free(cells);
    tandem_model_close(draft);
    tandem_model_close(target);
    return rc;
}
