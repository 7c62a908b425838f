/* bench_head_tree.c - an EAGLE-3 head's drafting cost per level, chains against token
 * trees (issue 46; draft/chain.c, draft/tree_draft.c, src/engine/head.c).
 *
 * Loads a target and a head (tandem synth's eagle3-* shapes, or a converted one) on
 * the CPU, runs B sequences of P synthetic prompt tokens through a few speculative
 * steps (so each holds a verified path's pending features, as in decoding), then
 * drafts from the same state again and again, alternating A B A B: A a chain of k
 * tokens for every sequence (tdm_draft_chains: the catch-up round and k - 1 rounds of
 * one row per sequence), B a token tree for every sequence (tdm_draft_trees: the
 * catch-up and one forward per level over every sequence's expanded nodes; a dynamic
 * tree of N nodes, or a static shape).  Each call starts from the same head state
 * (n_draft reset), so both redo the same catch-up.  Prints the medians of R calls:
 * microseconds per call, head forwards per call, microseconds per level (per
 * forward), and the calling thread's CPU microseconds per level (the figure to read
 * on a loaded machine with --threads 1, where every op runs on this thread: a call
 * longer than a time slice is also charged the other processes' turns).
 *
 * usage: bench_head_tree -m TARGET -e HEAD [--threads T] [-p P] [-b B] [-k K] [--tree N | --shape S] [-r R]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "chain.h"
#include "eagle3.h"
#include "engine.h"
#include "sched_internal.h"
#include "scheduler.h"
#include "tree_draft.h"

static void die(const char *what, const tdm_err *err) { bench_die("bench_head_tree", what, err); }

/* This thread's CPU seconds. */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_fin(tandem_request_id id, tandem_result *res, void *user) {
    (void)id, (void)user;
    tandem_result_free(res);
}

#define MAX_SEQ 64

int main(int argc, char **argv) {
    const char *target = NULL, *head = NULL, *shape = NULL;
    int threads = 2, prompt = 128, n_seq = 1, k = 8, budget = 8, reps = 30;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-m") && i + 1 < argc) target = argv[++i];
        else if (!strcmp(argv[i], "-e") && i + 1 < argc) head = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-p") && i + 1 < argc) prompt = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-b") && i + 1 < argc) n_seq = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-k") && i + 1 < argc) k = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tree") && i + 1 < argc) budget = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc) shape = argv[++i];
        else if (!strcmp(argv[i], "-r") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s -m TARGET -e HEAD [--threads T] [-p P] [-b B] [-k K] [--tree N | --shape S] "
                            "[-r R]\n", argv[0]);
            return 2;
        }
    }
    if (!target || !head || prompt < 2 || prompt > 4096 || n_seq < 1 || n_seq > MAX_SEQ || k < 1 || k > TDM_CTRL_MAX_K ||
        budget < 1 || budget > TDM_TREE_MAX || reps < 1) {
        fprintf(stderr, "bench_head_tree: need -m and -e, 2 <= P <= 4096, 1 <= B <= %d, 1 <= K <= %d, 1 <= N <= %d, "
                        "R >= 1\n", MAX_SEQ, TDM_CTRL_MAX_K, TDM_TREE_MAX);
        return 2;
    }
    tdm_err err = {0};
    tdm_tree_cfg tc = tdm_tree_cfg_dynamic(budget);
    if (shape && !tdm_tree_cfg_parse_shape(shape, &tc, &err)) die("--shape", &err);
    tdm_backend *be = NULL;
    if (tdm_backend_cpu_create(threads, &be, &err)) die("backend", &err);
    tdm_model *m = NULL;
    tdm_eagle3 *h = NULL;
    if (tdm_model_load(target, be, &m, &err)) die("target", &err);
    if (tdm_eagle3_load(head, be, &h, &err)) die("head", &err);
    tdm_engine_cfg cfg = {.n_threads = threads, .n_seq_max = n_seq};
    tdm_engine *e = NULL;
    if (tdm_engine_create_ex(m, NULL, h, &cfg, &e, &err)) die("engine", &err);
    tdm_sched *s = NULL;
    if (tdm_sched_create(e, NULL, &s, &err)) die("scheduler", &err);
    const int32_t V = e->n_vocab;
    int32_t *ids = malloc((size_t)prompt * sizeof *ids);
    for (int i = 0; i < n_seq; i++) {
        for (int32_t p = 0; p < prompt; p++) ids[p] = (int32_t)(((int64_t)p * 7919 + (int64_t)i * 104729) % V);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 1 << 20, gp.ignore_eos = true, gp.spec_k = 2, gp.spec_ngram = 0; /* (no lookups: the head drafts every chain) */
        if (tdm_sched_submit(s, ids, prompt, &gp, 0, 0, on_fin, NULL, NULL, &err)) die("submit", &err);
    }
    /* prefill, then a few chain steps: every sequence holds a verified path's features */
    for (int st = 0, running = 0; running < n_seq || st < 4; st++) {
        if (tdm_sched_step(s, NULL, &err)) die("step", &err);
        running = 0;
        for (int i = 0; i < n_seq; i++) {
            const tdm_req *r = tdm_sched_running_req(s, i);
            running += r && r->state == TDM_REQ_RUNNING;
        }
        if (running < n_seq) st = 0;
    }
    tdm_req *reqs[MAX_SEQ];
    int32_t nd0[MAX_SEQ], drafts[MAX_SEQ * TDM_CTRL_MAX_K];
    tdm_chain_req creq[MAX_SEQ];
    tdm_tree_job jobs[MAX_SEQ];
    static tdm_tree trees[MAX_SEQ];
    for (int i = 0; i < n_seq; i++) {
        reqs[i] = (tdm_req *)tdm_sched_running_req(s, i);
        nd0[i] = reqs[i]->s.n_draft;
        if (tdm_kv_seq_reserve(e->pool, &reqs[i]->s.kv, reqs[i]->s.n_tokens + TDM_MAX(TDM_TREE_MAX, k), &err))
            die("reserve", &err);
    }
    const tdm_draft_scratch scr = tdm_sched_draft_scratch(s);
    double *t[2] = {malloc((size_t)reps * sizeof(double)), malloc((size_t)reps * sizeof(double))};
    double *lv[2] = {malloc((size_t)reps * sizeof(double)), malloc((size_t)reps * sizeof(double))};
    double *cl[2] = {malloc((size_t)reps * sizeof(double)), malloc((size_t)reps * sizeof(double))};
    int32_t fwd[2] = {0, 0}, nodes = 0;
    for (int r = -3; r < reps; r++)
        for (int ab = 0; ab < 2; ab++) {
            for (int i = 0; i < n_seq; i++) reqs[i]->s.n_draft = nd0[i]; /* (the same state each time) */
            int32_t n_fwd = 0, catch_up = 0;
            const double t0 = tdm_now(), c0 = cpu_now();
            if (ab == 0) {
                for (int i = 0; i < n_seq; i++)
                    creq[i] = (tdm_chain_req){&reqs[i]->s, &reqs[i]->sr, k, k, NULL, drafts + i * TDM_CTRL_MAX_K, 0, 0, 0};
                if (tdm_draft_chains(e, tdm_sched_ws(s), creq, n_seq, &scr, &catch_up, &err)) die("chains", &err);
                for (int i = 0; i < n_seq; i++) n_fwd = TDM_MAX(n_fwd, creq[i].n_forwards);
            } else {
                for (int i = 0; i < n_seq; i++) jobs[i] = (tdm_tree_job){&reqs[i]->s, &reqs[i]->sr, tc, &trees[i], false};
                if (tdm_draft_trees(e, tdm_sched_ws(s), jobs, n_seq, &n_fwd, &err)) die("trees", &err);
                nodes = 0;
                for (int i = 0; i < n_seq; i++) nodes += trees[i].n;
            }
            const double dt = tdm_now() - t0, dc = cpu_now() - c0;
            fwd[ab] = n_fwd;
            if (r >= 0) t[ab][r] = dt, lv[ab][r] = dt / TDM_MAX(n_fwd, 1), cl[ab][r] = dc / TDM_MAX(n_fwd, 1);
        }
    for (int i = 0; i < n_seq; i++) reqs[i]->s.n_draft = nd0[i];
    char what[64];
    if (shape) snprintf(what, sizeof what, "tree %s", shape);
    else snprintf(what, sizeof what, "tree of %d (depth %d, width %d, top-%d)", budget, (int)tc.depth, (int)tc.width,
                  (int)tc.topk);
    printf("head %s (hidden %d, draft vocabulary %d of %d), %d sequence%s of %d tokens, %d threads, medians of %d "
           "alternated calls\n", head, (int)h->ep.n_embd, (int)h->ep.n_draft_vocab, (int)V, n_seq, n_seq > 1 ? "s" : "",
           prompt, threads, reps);
    printf("| drafter | us per call | head forwards | us per level | CPU us per level (this thread) |\n"
           "|---|---|---|---|---|\n");
    printf("| chain of %d | %.1f | %d | %.1f | %.1f |\n", k, bench_median(t[0], reps) * 1e6, (int)fwd[0],
           bench_median(lv[0], reps) * 1e6, bench_median(cl[0], reps) * 1e6);
    printf("| %s, %d nodes | %.1f | %d | %.1f | %.1f |\n", what, (int)nodes, bench_median(t[1], reps) * 1e6, (int)fwd[1],
           bench_median(lv[1], reps) * 1e6, bench_median(cl[1], reps) * 1e6);
    tdm_sched_free(s);
    tdm_engine_free(e);
    tdm_eagle3_free(h);
    tdm_model_free(m);
    tdm_backend_destroy(be);
    for (int ab = 0; ab < 2; ab++) free(t[ab]), free(lv[ab]), free(cl[ab]);
    free(ids);
    return 0;
}
