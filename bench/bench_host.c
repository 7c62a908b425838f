/* bench_host.c - the host side of a large-batch scheduler step (issue 45): what one
 * decode step of B sequences costs besides the forwards, on the CPU, no GPU needed.
 *
 *   bench_host -m TARGET [-d DRAFT] [--batch 64,128,256,512] [--npp 16] [--ntg 32]
 *              [--temp T] [--ngram N] [--threads 1] [--prompts FILE.jsonl] [--kv-tokens N]
 *              [--backend cpu|cuda]
 *
 * For each batch size B: an engine with n_seq_max = B, n_ctx = npp + ntg + 64, the
 * prefix cache off, max_batch_tokens B * (npp + 1) (every prompt prefilled in the
 * first step, so that every sequence decodes from the second on); B requests of
 * exactly npp prompt tokens (prompt i: the text of line i mod n of the prompts
 * file, tests/data/prompts-dev.jsonl by default, tokenised and cut or repeated to
 * npp), max_tokens = ntg,
 * ignore_eos, greedy or sampled (--temp T: top-p 0.95, request i seeded i + 1),
 * spec_ngram N (default 4, the API's; with -d), a token callback that counts (as a
 * server's would receive every piece), all given to one tandem_generate_batch call
 * after an untimed warm-up call of the same requests.  --kv-tokens N: a KV pool of
 * N positions (kv_bytes, both models) instead of n_ctx for each sequence, so that
 * admission waits for blocks and sequences are preempted.  --backend cuda: both
 * models on the GPU (there forward and draw include the launches and the waits for
 * the device; host is still what the step adds to them).
 *
 * The library's functions that a step is made of are timed by wrapping them at link
 * time (the linker's --wrap, bench/meson.build): each call's time minus the time of
 * the wrapped calls inside it (self time), summed per step into:
 *   forward   tdm_engine_forward (target and draft; on a GPU the device's work, with
 *             the argmax of greedy rows)
 *   draw      tdm_engine_draw and tdm_engine_mask_rows (on the CPU the sampled rows'
 *             softmax / top-p / draw over the vocabulary on the host; on a GPU the
 *             device's sampling, only token ids coming back)
 *   choose_k  tdm_sched_choose_k (lengths, trees, lookup lengths)
 *   draft     tdm_sched_draft_chains / _trees outside their forwards and draws
 *             (n-gram lookups, the chains' bookkeeping)
 *   reserve   tdm_kv_seq_reserve (block tables grown for the step's rows)
 *   batch     tdm_sched_run_plan outside its forwards, draws and commits (the
 *             forward's rows, sequences and draw rows built; verdicts)
 *   commit    tdm_commit_chain / _token / tdm_sched_commit_tree (tokens appended, K/V
 *             truncated, detokenisation, stop and end checks, the token callback)
 *   finish    tdm_sched_finish (results built, blocks freed, on_finish)
 *   other     the rest of tdm_sched_iterate (inbox, expiry, admission, the plan,
 *             the statistics)
 * host = step - forward - draw: what a GPU step would add to its device time.
 *
 * Only the steady decode steps count: those whose plan is B decode items and no
 * prompt chunk (the prefill steps, and the last step, where every request finishes,
 * are left out; finish is reported per request from every step, and the host
 * time of the step where the most requests finished on its own).  Prints one
 * markdown row per B: steady steps, the step's median wall time, forward and draw
 * medians, host median and mean per step and the median per sequence, and each host
 * part's median per step (microseconds; medians, since a busy machine's stray
 * pauses land in one part or another: they need not add up to the host median);
 * on stderr, every step of the timed run: its host time in all and the most of one
 * step, and the preemptions of both runs.  The wrapping costs two clock reads per
 * wrapped call (about 50 ns), included in the figures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_prompts.h"
#include "bench_util.h"
#include "commit.h"
#include "kv_cache.h"
#include "sched_internal.h"
#include "tandem.h"

#define MAX_BATCHES 16

enum { P_FWD, P_DRAW, P_CHOOSE, P_DRAFT, P_RESERVE, P_BATCH, P_COMMIT, P_FINISH, P_OTHER, N_PART };
static const char *part_names[N_PART] = {"forward", "draw", "choose_k", "draft", "reserve",
                                         "batch", "commit", "finish", "other"};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- self-time accounting of the wrapped calls (the stepping thread's only) ---- */

#define DEPTH_MAX 16
typedef struct frame {
    double t0, child; /* when the call began; the wrapped calls' seconds inside it */
} frame;
static frame g_stack[DEPTH_MAX];
static int g_depth;
static double g_part[N_PART];   /* this step's self seconds per part */
static double g_finish_s;       /* every finish's seconds, in every step */
static long g_finishes;
static int32_t g_dec, g_chunks; /* this step's plan */

static void enter(void) {
    if (g_depth < DEPTH_MAX) g_stack[g_depth] = (frame){now_s(), 0};
    g_depth++;
}

static double leave(int part) {
    g_depth--;
    if (g_depth >= DEPTH_MAX) return 0;
    const double el = now_s() - g_stack[g_depth].t0;
    g_part[part] += el - g_stack[g_depth].child;
    if (g_depth > 0 && g_depth - 1 < DEPTH_MAX) g_stack[g_depth - 1].child += el;
    return el;
}

#define WRAP(ret, name, part, params, args)      \
    ret __real_##name params;                    \
    ret __wrap_##name params;                    \
    ret __wrap_##name params {                   \
        enter();                                 \
        ret r_ = __real_##name args;             \
        leave(part);                             \
        return r_;                               \
    }
#define WRAP_VOID(name, part, params, args)      \
    void __real_##name params;                   \
    void __wrap_##name params;                   \
    void __wrap_##name params {                  \
        enter();                                 \
        __real_##name args;                      \
        leave(part);                             \
    }

WRAP(tandem_status, tdm_engine_forward, P_FWD,
     (tdm_engine * e, bool d, const tdm_batch *b, const tdm_kv_seq *const *q, tdm_fwd_kind k, tdm_err *err),
     (e, d, b, q, k, err))
WRAP(tandem_status, tdm_engine_draw, P_DRAW,
     (tdm_engine * e, bool d, const tdm_draw_row *rows, int32_t m, tdm_fwd_kind k, int32_t *tok, tdm_err *err),
     (e, d, rows, m, k, tok, err))
WRAP(tandem_status, tdm_engine_mask_rows, P_DRAW,
     (tdm_engine * e, bool d, const tdm_draw_row *rows, int32_t m, tdm_fwd_kind k, tdm_err *err),
     (e, d, rows, m, k, err))
WRAP_VOID(tdm_sched_choose_k, P_CHOOSE, (tdm_sched * s), (s))
WRAP(bool, tdm_sched_draft_chains, P_DRAFT, (tdm_sched * s, step_item *it, int32_t n, int32_t *c), (s, it, n, c))
WRAP(bool, tdm_sched_draft_trees, P_DRAFT, (tdm_sched * s, step_item *it, int32_t n), (s, it, n))
WRAP(tandem_status, tdm_kv_seq_reserve, P_RESERVE, (tdm_kv_pool * p, tdm_kv_seq *q, int32_t n, tdm_err *err),
     (p, q, n, err))
WRAP(bool, tdm_commit_token, P_COMMIT, (tdm_engine * e, tdm_seq *q, int32_t t), (e, q, t))
WRAP_VOID(tdm_commit_chain, P_COMMIT, (tdm_engine * e, tdm_seq *q, const int32_t *d, const tdm_verdict *v),
          (e, q, d, v))
WRAP_VOID(tdm_sched_commit_tree, P_COMMIT,
          (tdm_sched * s, const step_item *it, const tdm_verdict *v, double a, double b), (s, it, v, a, b))

void __real_tdm_sched_finish(tdm_sched *s, tdm_req *r, tandem_finish_reason why);
void __wrap_tdm_sched_finish(tdm_sched *s, tdm_req *r, tandem_finish_reason why);
void __wrap_tdm_sched_finish(tdm_sched *s, tdm_req *r, tandem_finish_reason why) {
    enter();
    __real_tdm_sched_finish(s, r, why);
    g_finish_s += leave(P_FINISH);
    g_finishes++;
}

void __real_tdm_sched_run_plan(tdm_sched *s, const step_item *it, int32_t n);
void __wrap_tdm_sched_run_plan(tdm_sched *s, const step_item *it, int32_t n);
void __wrap_tdm_sched_run_plan(tdm_sched *s, const step_item *it, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        if (it[i].decode) g_dec++;
        else g_chunks++;
    }
    enter();
    __real_tdm_sched_run_plan(s, it, n);
    leave(P_BATCH);
}

/* The steady steps of the run in progress: wall seconds, and parts. */
typedef struct run_steps {
    int batch, n, cap;
    double *wall, *host;
    double *part[N_PART]; /* [cap] each steady step's seconds per part */
    long end_fin;    /* the most requests that finished in one step */
    double end_host; /* that step's host seconds */
    int n_all;       /* every step of the run */
    double all_host, max_host; /* their host seconds in all, and the most of one */
} run_steps;
static run_steps *g_run;

tandem_status __real_tdm_sched_iterate(tdm_sched *s, tdm_err *err);
tandem_status __wrap_tdm_sched_iterate(tdm_sched *s, tdm_err *err);
tandem_status __wrap_tdm_sched_iterate(tdm_sched *s, tdm_err *err) {
    memset(g_part, 0, sizeof g_part);
    g_dec = g_chunks = 0;
    const long fin0 = g_finishes;
    g_depth = 0;
    enter();
    tandem_status st = __real_tdm_sched_iterate(s, err);
    const double wall = leave(P_OTHER);
    run_steps *r = g_run;
    if (r) {
        const double host = wall - g_part[P_FWD] - g_part[P_DRAW];
        r->n_all++;
        r->all_host += host;
        if (host > r->max_host) r->max_host = host;
    }
    if (r && g_finishes - fin0 > r->end_fin) { /* (the step where the most requests finish) */
        r->end_fin = g_finishes - fin0;
        r->end_host = wall - g_part[P_FWD] - g_part[P_DRAW];
    }
    if (r && g_dec == r->batch && g_chunks == 0 && g_finishes == fin0 && r->n < r->cap) {
        r->wall[r->n] = wall;
        r->host[r->n] = wall - g_part[P_FWD] - g_part[P_DRAW];
        for (int p = 0; p < N_PART; p++) r->part[p][r->n] = g_part[p];
        r->n++;
    }
    return st;
}

/* ---- the run ---- */

static long g_tokens_seen;
static bool on_token(int32_t token, const char *text, size_t len, void *user_data) {
    (void)token, (void)text, (void)len, (void)user_data;
    g_tokens_seen++;
    return true;
}

static int usage(const char *msg, const char *arg) {
    if (msg) fprintf(stderr, "error: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr, "usage: bench_host -m TARGET [-d DRAFT] [--batch 64,128,256,512] [--npp 16] [--ntg 32]\n"
                    "                  [--temp T] [--ngram N] [--threads 1] [--prompts FILE.jsonl]\n"
                    "                  [--kv-tokens N] [--backend cpu|cuda]\n");
    return 2;
}

static bool parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < lo || v > hi) return false;
    *out = (int)v;
    return true;
}

int main(int argc, char **argv) {
    const char *target = NULL, *draft = NULL, *prompts = "tests/data/prompts-dev.jsonl";
    int batch[MAX_BATCHES] = {64, 128, 256, 512}, n_batch = 4, npp = 16, ntg = 32, threads = 1, ngram = 4;
    int kv_tokens = 0;
    float temp = 0.0f;
    tandem_model_params mp = tandem_model_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[++i] : NULL;
        if (!v) return usage("a value is missing after", a);
        bool ok = true;
        if (!strcmp(a, "-m")) target = v;
        else if (!strcmp(a, "-d")) draft = v;
        else if (!strcmp(a, "--prompts")) prompts = v;
        else if (!strcmp(a, "--npp")) ok = parse_int(v, 1, 4096, &npp);
        else if (!strcmp(a, "--ntg")) ok = parse_int(v, 4, 4096, &ntg);
        else if (!strcmp(a, "--threads")) ok = parse_int(v, 0, 64, &threads);
        else if (!strcmp(a, "--kv-tokens")) ok = parse_int(v, 1, 1 << 24, &kv_tokens);
        else if (!strcmp(a, "--backend")) {
            ok = !strcmp(v, "cpu") || !strcmp(v, "cuda");
            mp.backend = strcmp(v, "cuda") ? TANDEM_BACKEND_CPU : TANDEM_BACKEND_CUDA;
        }
        else if (!strcmp(a, "--ngram")) ok = parse_int(v, 0, TANDEM_SPEC_NGRAM_MAX, &ngram);
        else if (!strcmp(a, "--temp")) {
            char *end;
            temp = strtof(v, &end);
            ok = end != v && !*end && temp >= 0.0f && temp <= 100.0f;
        } else if (!strcmp(a, "--batch")) {
            n_batch = 0;
            for (const char *s = v; *s && ok;) {
                char *end;
                long b = strtol(s, &end, 10);
                ok = end != s && b >= 1 && b <= 4096 && n_batch < MAX_BATCHES;
                if (ok) batch[n_batch++] = (int)b;
                s = *end == ',' ? end + 1 : end;
                ok = ok && (*end == ',' || !*end);
            }
        } else return usage("unknown option", a);
        if (!ok) return usage("bad value", v);
    }
    if (!target) return usage("-m is required", NULL);
    tandem_model *mt = NULL, *md = NULL;
    if (tandem_model_open(target, &mp, &mt) || (draft && tandem_model_open(draft, &mp, &md))) {
        fprintf(stderr, "error: %s\n", tandem_last_error());
        return 1;
    }
    size_t kv_per_token = 0; /* (both models') */
    for (tandem_model *m = mt; m; m = m == mt ? md : NULL) {
        tandem_model_info mi;
        if (tandem_model_get_info(m, &mi)) return 1;
        kv_per_token += (size_t)mi.kv_bytes_per_token;
    }
    int n_text = 0;
    char **text = bench_prompts_read(prompts, 1000, &n_text);
    if (n_text == 0) {
        fprintf(stderr, "error: no prompts in %s\n", prompts);
        return 1;
    }
    int bmax = 0;
    for (int i = 0; i < n_batch; i++) bmax = batch[i] > bmax ? batch[i] : bmax;
    int32_t *ids = calloc((size_t)bmax * (size_t)npp, sizeof *ids);
    tandem_request *req = calloc((size_t)bmax, sizeof *req);
    tandem_result *res = calloc((size_t)bmax, sizeof *res);
    run_steps rs = {.cap = 1 << 16};
    rs.wall = calloc((size_t)rs.cap, sizeof *rs.wall);
    rs.host = calloc((size_t)rs.cap, sizeof *rs.host);
    bool parts_ok = true;
    for (int p = 0; p < N_PART; p++) parts_ok &= (rs.part[p] = calloc((size_t)rs.cap, sizeof(double))) != NULL;
    if (!ids || !req || !res || !rs.wall || !rs.host || !parts_ok) return 1;
    for (int i = 0; i < bmax; i++) { /* prompt i: text i mod n, cut or repeated to npp tokens */
        int32_t *t = NULL;
        size_t n = 0;
        const char *s = text[i % n_text];
        if (tandem_tokenize(mt, s, strlen(s), true, &t, &n) || n == 0) {
            fprintf(stderr, "error: tokenizing prompt %d: %s\n", i % n_text, tandem_last_error());
            return 1;
        }
        for (int j = 0; j < npp; j++) ids[(size_t)i * (size_t)npp + (size_t)j] = t[(size_t)j % n];
        tandem_free(t);
    }
    bench_prompts_free(text, n_text);
    time_t now = time(NULL);
    char date[64];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    printf("bench_host %s%s%s, %s, npp %d, ntg %d, %s, ngram %d, threads %d, %s\n\n", target, draft ? " + " : "",
           draft ? draft : "", mp.backend == TANDEM_BACKEND_CUDA ? "cuda" : "cpu", npp, ntg,
           temp > 0 ? "sampled" : "greedy", draft ? ngram : 0, threads, date);
    printf("| B | steady steps | step ms (median) | forward ms | draw ms | host ms (median) | host ms (mean) "
           "| host us/seq |");
    for (int p = P_CHOOSE; p < N_PART; p++)
        if (p != P_FINISH) printf(" %s us |", part_names[p]);
    printf(" finish us/req | end step: finishes, host ms |\n|---|---|---|---|---|---|---|---|");
    for (int p = P_CHOOSE; p < N_PART; p++)
        if (p != P_FINISH) printf("---|");
    printf("---|---|\n");
    for (int bi = 0; bi < n_batch; bi++) {
        const int B = batch[bi];
        tandem_engine_params ep = tandem_engine_default_params();
        ep.n_seq_max = B;
        ep.n_ctx = npp + ntg + 64;
        ep.prefix_cache = false;
        if (kv_tokens > 0) ep.kv_bytes = (size_t)kv_tokens * kv_per_token;
        ep.n_threads = threads;
        ep.max_batch_tokens = B * (npp + 1) > 65536 ? 65536 : B * (npp + 1); /* (every prompt in the first step) */
        tandem_engine *eng = NULL;
        if (tandem_engine_open(mt, md, &ep, &eng)) {
            fprintf(stderr, "error: engine for batch %d: %s\n", B, tandem_last_error());
            return 1;
        }
        for (int i = 0; i < B; i++) {
            req[i] = tandem_request_default();
            req[i].prompt_ids = ids + (size_t)i * (size_t)npp;
            req[i].n_prompt_ids = (size_t)npp;
            tandem_generate_params *gp = &req[i].params;
            gp->max_tokens = ntg;
            gp->ignore_eos = true;
            gp->spec_ngram = ngram;
            gp->on_token = on_token;
            if (temp > 0) gp->temperature = temp, gp->top_p = 0.95f, gp->seed = (uint64_t)i + 1;
        }
        for (int rep = 0; rep < 2; rep++) { /* warm-up, then the timed run */
            rs.n = 0, rs.batch = B, rs.end_fin = 0, rs.end_host = 0;
            rs.n_all = 0, rs.all_host = rs.max_host = 0;
            g_finish_s = 0, g_finishes = 0;
            g_run = rep ? &rs : NULL;
            if (tandem_generate_batch(eng, req, (size_t)B, res)) {
                fprintf(stderr, "error: batch %d: %s\n", B, tandem_last_error());
                return 1;
            }
            g_run = NULL;
            for (int i = 0; i < B; i++) {
                if (res[i].status || res[i].n_tokens != (size_t)ntg) {
                    fprintf(stderr, "error: request %d: %s (%zu tokens)\n", i, res[i].error ? res[i].error : "",
                            res[i].n_tokens);
                    return 1;
                }
                tandem_result_free(&res[i]);
            }
        }
        tandem_engine_stats est;
        if (tandem_engine_get_stats(eng, &est)) return 1;
        tandem_engine_close(eng);
        fprintf(stderr,
                "B %d: all %d steps: host %.3f ms in all, %.3f ms at most in one step; %llu preemptions in both runs\n",
                B, rs.n_all, rs.all_host * 1e3, rs.max_host * 1e3, (unsigned long long)est.n_preemptions);
        const int n = rs.n;
        if (n == 0) {
            printf("| %d | 0 (no steady decode step) |\n", B);
            continue;
        }
        double host_sum = 0;
        for (int i = 0; i < n; i++) host_sum += rs.host[i];
        const double wall_med = bench_median(rs.wall, n), host_med = bench_median(rs.host, n);
        printf("| %d | %d | %.2f | %.2f | %.2f | %.3f | %.3f | %.2f |", B, n, wall_med * 1e3,
               bench_median(rs.part[P_FWD], n) * 1e3, bench_median(rs.part[P_DRAW], n) * 1e3, host_med * 1e3, host_sum / n * 1e3,
               host_med / B * 1e6);
        for (int p = P_CHOOSE; p < N_PART; p++)
            if (p != P_FINISH) printf(" %.1f |", bench_median(rs.part[p], n) * 1e6);
        printf(" %.2f | %ld, %.3f |\n", g_finishes ? g_finish_s / (double)g_finishes * 1e6 : 0.0, rs.end_fin,
               rs.end_host * 1e3);
        fflush(stdout);
    }
    free(ids), free(req), free(res), free(rs.wall), free(rs.host);
    for (int p = 0; p < N_PART; p++) free(rs.part[p]);
    tandem_model_close(md);
    tandem_model_close(mt);
    (void)g_tokens_seen;
    return 0;
}
