/* bench_spec.c - speculative decoding sweep: target-only vs. each draft with
 * k = 1..8 and auto, greedy, N new tokens per prompt over a prompts file.
 *
 * All configurations run in one process, interleaved in blocks of prompts (each
 * block under every configuration in turn) so that machine noise hits them alike;
 * each figure is the median over repetitions of (generated tokens / decode time)
 * summed over the prompts; the last column gives the smallest and largest ratio of
 * a configuration to target-only decode within one repetition.
 *
 *   bench_spec -m TARGET -d DRAFT [-d DRAFT2] --prompts FILE [-n 128] [--threads 2]
 *              [--reps 3] [--limit L] [--ks 1,2,3,4,5,6,7,8,0]   (0 = auto)
 *              [--ngram N[,N2..]]  (also run every draft configuration with spec_ngram = N, ...)
 *              [--block B]   (prompts per configuration turn, default 10)
 *              [--p-min P[,P2..]]  (run every draft configuration with spec_p_min = P, ...;
 *                                   default 0 = off)
 *              [--backend cpu|cuda]  (where the models run; default cpu)
 *              [--host-topk]  (greedy tree levels' candidates from host copies of the
 *                              logits instead of the device's topk op: what it buys)
 *              [--lookup-cands N]  (continuations a lookup tree takes, 1..4; 1: lookup steps
 *                                   verify one chain)
 *              [--lookup-tree-extra X]  (a lookup tree's nodes beyond its first continuation
 *                                        at most X; default the tree budget's)
 *              [--no-tree-lookups]  (draft trees without the lookups' continuations)
 *              [--tree-auto-max B]  (the largest budget --tree -1 (auto) weighs)
 *              [--temp T] [--top-p P]  (sampling instead of greedy; prompt p of repetition
 *                                       r is seeded with r * 1000 + p in every configuration)
 *              [--tree N[,N2..]]  (also run each draft with token trees of at most N nodes,
 *                                  -1 = auto; once per --ngram value, 0 = lookup off:
 *                                  greedy trees then hold the lookups too)
 *              [--tree-shape S]   (also run each draft with the static tree S, e.g. 4,2,2,1;
 *                                  repeat for more shapes, at most 8)
 *              [--tree-width W] [--tree-branch B] [--tree-depth D]  (the dynamic trees'
 *                                  expansions per level, children per expansion and
 *                                  levels instead of their defaults: draft/tree.h,
 *                                  tdm_tree_set_bench_shape)
 *              [--oracle-alpha A[,A2..]]  BENCHMARK MODE, labelled "oracle" in the output:
 *                  every draft configuration (chains and trees) runs once per A with
 *                  controlled acceptance (tandem.h bench_oracle_tokens: the target's own
 *                  continuation, from the target-only run of the same prompt, is the
 *                  draft's first candidate with probability A, else its second with
 *                  probability 1/2, else absent); real draft and verification costs
 * Every configuration reports its committed tokens per target forward (chains and
 * trees alike: the forwards after the prompt's, the tokens they committed), and,
 * greedy without the oracle, how many of its runs gave other tokens than the
 * target-only run of the same prompt (speculation must give none).
 * Prints a markdown table and one JSON object per configuration (stdout).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "bench_prompts.h"
#include "tandem.h"
#include "tree.h"

#define MAX_CFG 64
#define MAX_REPS 32

typedef struct cfg {
    int draft;     /* -1 = none */
    int k;         /* 0 = auto */
    int ngram;     /* spec_ngram */
    float p_min;   /* spec_p_min */
    int tree;      /* spec_tree (0: chains) */
    const char *shape; /* spec_tree_shape, or NULL */
    uint64_t forwards, fwd_tokens; /* repetition 0's target forwards and the tokens they committed */
    uint64_t tree_steps;           /* repetition 0's steps that verified a token tree */
    uint64_t tree_nodes;           /* their nodes */
    float alpha;   /* oracle acceptance (benchmark mode), < 0 = off */
    double tps[MAX_REPS];
    double mean_acc, acc_rate, k_final_sum;
    uint64_t steps, drafted, accepted, tokens, ng_steps, ng_drafted, ng_accepted;
    double draft_ms, verify_ms, decode_ms; /* repetition 0's sums */
    int differs;   /* greedy: runs (prompts x repetitions) whose tokens differ from target-only */
} cfg;

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double t[MAX_REPS];
    memcpy(t, v, (size_t)n * sizeof *t);
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

static void die(const char *what) {
    fprintf(stderr, "error: %s: %s\n", what, tandem_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    const char *target_path = NULL, *prompts_path = NULL, *draft_paths[4];
    int n_drafts = 0, n_new = 128, threads = 2, reps = 3, limit = 1 << 30, block = 10;
    int ngrams[8] = {0}, n_ngrams = 1; /* 0 = off, always run */
    int ks[16] = {1, 2, 3, 4, 5, 6, 7, 8, 0}, n_ks = 9;
    float pmins[8] = {0}; /* spec_p_min values */
    int n_pmins = 1;
    float temp = 0.0f, top_p = 1.0f; /* greedy by default */
    int trees[8], n_trees = 0;
    float alphas[8] = {-1.0f}; /* oracle acceptances, -1 = off */
    int n_alphas = 1;
    const char *shapes[8];
    int n_shapes = 0;
    tdm_tree_bench_shape tree_shape = {0, 0, 0}; /* 0: the library's */
    tandem_model_params mp = tandem_model_default_params();
    tdm_api_paths paths = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--host-topk")) { /* (flags without a value) */
            paths.ws.host_topk = true;
            continue;
        }
        if (!strcmp(a, "--no-tree-lookups")) {
            paths.ws.no_tree_lookups = true;
            continue;
        }
        if (!v) {
            fprintf(stderr, "error: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-m")) target_path = v;
        else if (!strcmp(a, "-d") && n_drafts < 4) draft_paths[n_drafts++] = v;
        else if (!strcmp(a, "--prompts")) prompts_path = v;
        else if (!strcmp(a, "-n")) n_new = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--limit")) limit = atoi(v);
        else if (!strcmp(a, "--ngram")) {
            for (char *q = (char *)v; *q && n_ngrams < 8;) {
                ngrams[n_ngrams++] = (int)strtol(q, &q, 10);
                if (*q == ',') q++;
                else if (*q) break;
            }
        }
        else if (!strcmp(a, "--p-min")) {
            n_pmins = 0;
            for (char *q = (char *)v; *q && n_pmins < 8;) {
                pmins[n_pmins++] = strtof(q, &q);
                if (*q == ',') q++;
                else if (*q) break;
            }
        }
        else if (!strcmp(a, "--tree")) {
            for (char *q = (char *)v; *q && n_trees < 8;) {
                trees[n_trees++] = (int)strtol(q, &q, 10);
                if (*q == ',') q++;
                else if (*q) break;
            }
        }
        else if (!strcmp(a, "--tree-shape") && n_shapes < 8) shapes[n_shapes++] = v;
        else if (!strcmp(a, "--tree-width")) tree_shape.width = atoi(v);
        else if (!strcmp(a, "--tree-branch")) tree_shape.branch = atoi(v);
        else if (!strcmp(a, "--tree-depth")) tree_shape.depth = atoi(v);
        else if (!strcmp(a, "--oracle-alpha")) {
            n_alphas = 0;
            for (char *q = (char *)v; *q && n_alphas < 8;) {
                alphas[n_alphas] = strtof(q, &q);
                if (!(alphas[n_alphas] >= 0 && alphas[n_alphas] <= 1)) {
                    fprintf(stderr, "error: --oracle-alpha takes values in [0, 1]\n");
                    return 2;
                }
                n_alphas++;
                if (*q == ',') q++;
                else if (*q) break;
            }
        }
        else if (!strcmp(a, "--block")) block = atoi(v) > 0 ? atoi(v) : 1;
        else if (!strcmp(a, "--backend")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "error: --backend cpu|cuda\n");
                return 2;
            }
            mp.backend = strcmp(v, "cuda") ? TANDEM_BACKEND_CPU : TANDEM_BACKEND_CUDA;
        }
        else if (!strcmp(a, "--lookup-cands")) paths.ws.lookup_cands = atoi(v);
        else if (!strcmp(a, "--lookup-tree-extra")) paths.ws.lookup_tree_extra = atoi(v);
        else if (!strcmp(a, "--tree-auto-max")) paths.ws.tree_auto_max = atoi(v);
        else if (!strcmp(a, "--temp")) temp = strtof(v, NULL);
        else if (!strcmp(a, "--top-p")) top_p = strtof(v, NULL);
        else if (!strcmp(a, "--ks")) {
            n_ks = 0;
            for (char *s = (char *)v; *s && n_ks < 16;) {
                ks[n_ks++] = (int)strtol(s, &s, 10);
                if (*s == ',') s++;
            }
        } else {
            fprintf(stderr, "error: unknown flag %s\n", a);
            return 2;
        }
        i++;
    }
    if (!target_path || !prompts_path || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: bench_spec -m TARGET -d DRAFT --prompts FILE [-n N] [--threads T] [--reps R] [--backend cpu|cuda]\n");
        return 2;
    }

    tdm_err terr = {0};
    if (tdm_tree_set_bench_shape(&tree_shape, &terr)) {
        fprintf(stderr, "error: %s\n", terr.msg);
        return 2;
    }

    int n_prompts;
    char **prompts = bench_prompts_read(prompts_path, limit, &n_prompts);

    tandem_model *target, *drafts[4];
    if (tandem_model_open(target_path, &mp, &target)) die(target_path);
    for (int d = 0; d < n_drafts; d++)
        if (tandem_model_open(draft_paths[d], &mp, &drafts[d])) die(draft_paths[d]);
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = threads;
    tandem_engine *plain, *spec[4];
    if (tandem_engine_open(target, NULL, &ep, &plain)) die("engine");
    for (int d = 0; d < n_drafts; d++)
        if (tdm_api_engine_open(target, drafts[d], &ep, &paths, &spec[d])) die("draft engine");

    cfg cfgs[MAX_CFG];
    int n_cfg = 0;
    memset(cfgs, 0, sizeof cfgs);
    cfgs[n_cfg].alpha = -1;
    cfgs[n_cfg++].draft = -1;
    for (int al = 0; al < n_alphas; al++) {
    const int first = n_cfg;
    for (int ng = 0; ng < n_ngrams; ng++)
        for (int d = 0; d < n_drafts; d++)
            for (int pm = 0; pm < n_pmins; pm++)
                for (int k = 0; k < n_ks && n_cfg < MAX_CFG; k++) {
                    cfgs[n_cfg].draft = d;
                    cfgs[n_cfg].ngram = ngrams[ng];
                    cfgs[n_cfg].p_min = pmins[pm];
                    cfgs[n_cfg++].k = ks[k];
                }
    for (int ng = 0; ng < n_ngrams; ng++)
        for (int d = 0; d < n_drafts; d++) {
            for (int t = 0; t < n_trees && n_cfg < MAX_CFG; t++)
                cfgs[n_cfg].draft = d, cfgs[n_cfg].ngram = ngrams[ng], cfgs[n_cfg++].tree = trees[t];
            for (int t = 0; t < n_shapes && n_cfg < MAX_CFG; t++)
                cfgs[n_cfg].draft = d, cfgs[n_cfg].ngram = ngrams[ng], cfgs[n_cfg++].shape = shapes[t];
        }
    for (int c = first; c < n_cfg; c++) cfgs[c].alpha = alphas[al];
    }
    if (alphas[0] >= 0 && temp > 0) {
        fprintf(stderr, "error: --oracle-alpha needs greedy decoding\n");
        return 2;
    }
    /* the target's own continuation of each prompt (the oracle's), from the
     * target-only runs of repetition 0, which come first in every block */
    int32_t **truth = calloc((size_t)n_prompts, sizeof *truth);
    int *n_truth = calloc((size_t)n_prompts, sizeof *n_truth);

    /* Blocks of `block` prompts run under every configuration in turn, so slow and
     * fast phases of a shared machine fall on all configurations alike, while each
     * configuration still runs several requests in a row as a user's job would (one
     * prompt at a time would make every request start with cold caches). */
    for (int r = 0; r < reps; r++) {
        double decode_ms[MAX_CFG] = {0};
        uint64_t toks[MAX_CFG] = {0};
        for (int p0 = 0; p0 < n_prompts; p0 += block)
            for (int c = 0; c < n_cfg; c++)
                for (int p = p0; p < n_prompts && p < p0 + block; p++) {
                    cfg *C = &cfgs[c];
                    tandem_engine *e = C->draft < 0 ? plain : spec[C->draft];
                    tandem_generate_params gp = tandem_generate_default_params();
                    gp.max_tokens = n_new;
                    gp.spec_k = C->k;
                    gp.spec_ngram = C->ngram;
                    gp.spec_p_min = C->p_min;
                    gp.temperature = temp;
                    gp.top_p = top_p;
                    gp.seed = (uint64_t)r * 1000u + (uint64_t)p;
                    gp.spec_tree = C->tree;
                    gp.spec_tree_shape = C->shape;
                    if (C->alpha >= 0 && C->draft >= 0 && n_truth[p] > 0) {
                        gp.bench_oracle_tokens = truth[p];
                        gp.bench_n_oracle = n_truth[p];
                        gp.bench_oracle_alpha = C->alpha;
                    }
                    tandem_result res;
                    if (tandem_generate(e, prompts[p], &gp, &res)) die("generate");
                    decode_ms[c] += res.decode_ms;
                    if (C->draft < 0 && !truth[p] && res.n_tokens > 0) {
                        truth[p] = malloc(res.n_tokens * sizeof(int32_t));
                        memcpy(truth[p], res.tokens, res.n_tokens * sizeof(int32_t));
                        n_truth[p] = (int)res.n_tokens;
                    }
                    if (temp <= 0 && C->alpha < 0 && truth[p] &&
                        (res.n_tokens != (size_t)n_truth[p] ||
                         memcmp(res.tokens, truth[p], res.n_tokens * sizeof(int32_t)) != 0))
                        C->differs++;
                    /* the first token comes from the prefill */
                    toks[c] += res.n_tokens > 0 ? res.n_tokens - 1 : 0;
                    if (r == 0) {
                        C->steps += res.spec.steps;
                        C->drafted += res.spec.drafted;
                        C->accepted += res.spec.accepted;
                        C->k_final_sum += res.spec.k_final;
                        C->tokens += res.n_tokens;
                        C->ng_steps += res.spec.ngram_steps;
                        C->ng_drafted += res.spec.ngram_drafted;
                        C->ng_accepted += res.spec.ngram_accepted;
                        C->draft_ms += res.spec.draft_ms;
                        C->verify_ms += res.spec.verify_ms;
                        C->decode_ms += res.decode_ms;
                        C->forwards += res.spec.forwards;
                        C->fwd_tokens += res.spec.forward_tokens;
                        C->tree_steps += res.spec.tree_steps;
                        C->tree_nodes += res.spec.tree_nodes;
                    }
                    tandem_result_free(&res);
                }
        for (int c = 0; c < n_cfg; c++) {
            cfg *C = &cfgs[c];
            C->tps[r] = (double)toks[c] / (decode_ms[c] * 1e-3);
            fprintf(stderr, "rep %d %s k=%d ngram=%d tree=%d%s%s: %.0f tok/s\n", r,
                    C->draft < 0 ? "none" : draft_paths[C->draft], C->k, C->ngram, C->tree, C->shape ? " shape " : "",
                    C->shape ? C->shape : "", C->tps[r]);
        }
    }

    double base = median(cfgs[0].tps, reps);
    if (temp > 0) printf("sampling: temperature %g, top-p %g\n\n", (double)temp, (double)top_p);
    printf("| draft | k | n-gram | decode tok/s (median of %d) | speed-up | acceptance | mean accepted/step | "
           "mean k_final | n-gram steps / acceptance | speed-up per repetition, min-max | tokens per target forward | "
           "outputs unlike target-only |\n",
           reps);
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < n_cfg; c++) {
        cfg *C = &cfgs[c];
        double m = median(C->tps, reps);
        const char *dn = C->draft < 0 ? "none" : strrchr(draft_paths[C->draft], '/') ? strrchr(draft_paths[C->draft], '/') + 1 : draft_paths[C->draft];
        char kbuf[40];
        if (C->draft < 0) snprintf(kbuf, sizeof kbuf, "-");
        else if (C->shape) snprintf(kbuf, sizeof kbuf, "tree %s", C->shape);
        else if (C->tree) snprintf(kbuf, sizeof kbuf, C->tree < 0 ? "tree auto" : "tree %d", C->tree);
        else if (C->k == 0) snprintf(kbuf, sizeof kbuf, "auto");
        else snprintf(kbuf, sizeof kbuf, "%d", C->k);
        if (C->draft >= 0 && C->alpha >= 0) {
            size_t len = strlen(kbuf);
            snprintf(kbuf + len, sizeof kbuf - len, ", oracle alpha %.2f", (double)C->alpha);
        }
        if (C->draft >= 0 && C->p_min > 0) {
            size_t len = strlen(kbuf);
            snprintf(kbuf + len, sizeof kbuf - len, ", p_min %.2g", (double)C->p_min);
        }
        char ngbuf[48] = "-";
        if (C->ngram)
            snprintf(ngbuf, sizeof ngbuf, "%.0f%% / %.3f", C->steps ? 100.0 * (double)C->ng_steps / (double)C->steps : 0.0,
                     C->ng_drafted ? (double)C->ng_accepted / (double)C->ng_drafted : 0.0);
        /* each repetition's ratio to target-only decode of the same repetition (the
         * configurations of a repetition ran interleaved in blocks of prompts) */
        double lo = 1e30, hi = 0;
        for (int r = 0; r < reps; r++) {
            double q = C->tps[r] / cfgs[0].tps[r];
            lo = q < lo ? q : lo;
            hi = q > hi ? q : hi;
        }
        char dbuf[32] = "-";
        if (temp <= 0 && C->draft >= 0) snprintf(dbuf, sizeof dbuf, "%d of %d", C->differs, n_prompts * reps);
        printf("| %s | %s | %s | %.0f | %.2fx | %.3f | %.2f | %.1f | %s | %.2fx-%.2fx | %.3f | %s |\n", dn, kbuf,
               C->ngram ? (char[]){(char)('0' + C->ngram), 0} : "off", m, m / base,
               C->drafted ? (double)C->accepted / (double)C->drafted : 0.0,
               C->steps ? (double)C->accepted / (double)C->steps : 0.0, C->k_final_sum / n_prompts, ngbuf, lo, hi,
               C->forwards ? (double)C->fwd_tokens / (double)C->forwards : 0.0, dbuf);
    }
    for (int c = 0; c < n_cfg; c++) {
        cfg *C = &cfgs[c];
        printf("{\"draft\": \"%s\", \"k\": %d, \"ngram\": %d, \"p_min\": %g, \"oracle_alpha\": %g, \"tree\": %d, \"tree_shape\": \"%s\", "
               "\"differs\": %d, \"forwards\": %llu, \"tokens_per_forward\": %.4f, \"decode_tok_s\": %.1f, \"acceptance_rate\": %.4f, "
               "\"mean_accepted\": %.3f, \"steps\": %llu, \"tree_steps\": %llu, \"tree_nodes\": %llu, \"ngram_steps\": %llu, \"us_per_step\": {\"draft\": %.1f, \"verify\": %.1f, \"all\": %.1f}}\n",
               C->draft < 0 ? "none" : draft_paths[C->draft], C->k, C->ngram, (double)C->p_min, (double)C->alpha, C->tree,
               C->shape ? C->shape : "", C->differs, (unsigned long long)C->forwards,
               C->forwards ? (double)C->fwd_tokens / (double)C->forwards : 0.0, median(C->tps, reps),
               C->drafted ? (double)C->accepted / (double)C->drafted : 0.0,
               C->steps ? (double)C->accepted / (double)C->steps : 0.0, (unsigned long long)C->steps,
               (unsigned long long)C->tree_steps, (unsigned long long)C->tree_nodes, (unsigned long long)C->ng_steps,
               C->steps ? 1e3 * C->draft_ms / (double)C->steps : 0.0,
               C->steps ? 1e3 * C->verify_ms / (double)C->steps : 0.0,
               1e3 * C->decode_ms / (double)(C->steps ? C->steps : (C->tokens > (uint64_t)n_prompts ? C->tokens - (uint64_t)n_prompts : 1)));
    }
    for (int p = 0; p < n_prompts; p++) free(truth[p]);
    free(truth), free(n_truth);
    bench_prompts_free(prompts, n_prompts);
    tandem_engine_close(plain);
    for (int d = 0; d < n_drafts; d++) {
        tandem_engine_close(spec[d]);
        tandem_model_close(drafts[d]);
    }
    tandem_model_close(target);
    return 0;
}
