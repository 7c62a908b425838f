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
 *              [--temp T] [--top-p P]  (sampling instead of greedy; prompt p of repetition
 *                                       r is seeded with r * 1000 + p in every configuration)
 * Prints a markdown table and one JSON object per configuration (stdout).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_prompts.h"
#include "tandem.h"

#define MAX_CFG 64
#define MAX_REPS 32

typedef struct cfg {
    int draft;     /* -1 = none */
    int k;         /* 0 = auto */
    int ngram;     /* spec_ngram */
    float p_min;   /* spec_p_min */
    double tps[MAX_REPS];
    double mean_acc, acc_rate, k_final_sum;
    uint64_t steps, drafted, accepted, tokens, ng_steps, ng_drafted, ng_accepted;
    double draft_ms, verify_ms, decode_ms; /* repetition 0's sums */
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
    tandem_model_params mp = tandem_model_default_params();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
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
        else if (!strcmp(a, "--block")) block = atoi(v) > 0 ? atoi(v) : 1;
        else if (!strcmp(a, "--backend")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "error: --backend cpu|cuda\n");
                return 2;
            }
            mp.backend = strcmp(v, "cuda") ? TANDEM_BACKEND_CPU : TANDEM_BACKEND_CUDA;
        }
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
        if (tandem_engine_open(target, drafts[d], &ep, &spec[d])) die("engine");

    cfg cfgs[MAX_CFG];
    int n_cfg = 0;
    memset(cfgs, 0, sizeof cfgs);
    cfgs[n_cfg++].draft = -1;
    for (int ng = 0; ng < n_ngrams; ng++)
        for (int d = 0; d < n_drafts; d++)
            for (int pm = 0; pm < n_pmins; pm++)
                for (int k = 0; k < n_ks && n_cfg < MAX_CFG; k++) {
                    cfgs[n_cfg].draft = d;
                    cfgs[n_cfg].ngram = ngrams[ng];
                    cfgs[n_cfg].p_min = pmins[pm];
                    cfgs[n_cfg++].k = ks[k];
                }

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
                    tandem_result res;
                    if (tandem_generate(e, prompts[p], &gp, &res)) die("generate");
                    decode_ms[c] += res.decode_ms;
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
                    }
                    tandem_result_free(&res);
                }
        for (int c = 0; c < n_cfg; c++) {
            cfg *C = &cfgs[c];
            C->tps[r] = (double)toks[c] / (decode_ms[c] * 1e-3);
            fprintf(stderr, "rep %d %s k=%d ngram=%d: %.0f tok/s\n", r,
                    C->draft < 0 ? "none" : draft_paths[C->draft], C->k, C->ngram, C->tps[r]);
        }
    }

    double base = median(cfgs[0].tps, reps);
    if (temp > 0) printf("sampling: temperature %g, top-p %g\n\n", (double)temp, (double)top_p);
    printf("| draft | k | n-gram | decode tok/s (median of %d) | speed-up | acceptance | mean accepted/step | "
           "mean k_final | n-gram steps / acceptance | speed-up per repetition, min-max |\n",
           reps);
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (int c = 0; c < n_cfg; c++) {
        cfg *C = &cfgs[c];
        double m = median(C->tps, reps);
        const char *dn = C->draft < 0 ? "none" : strrchr(draft_paths[C->draft], '/') ? strrchr(draft_paths[C->draft], '/') + 1 : draft_paths[C->draft];
        char kbuf[40];
        if (C->draft < 0) snprintf(kbuf, sizeof kbuf, "-");
        else if (C->k == 0) snprintf(kbuf, sizeof kbuf, "auto");
        else snprintf(kbuf, sizeof kbuf, "%d", C->k);
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
        printf("| %s | %s | %s | %.0f | %.2fx | %.3f | %.2f | %.1f | %s | %.2fx-%.2fx |\n", dn, kbuf,
               C->ngram ? (char[]){(char)('0' + C->ngram), 0} : "off", m, m / base,
               C->drafted ? (double)C->accepted / (double)C->drafted : 0.0,
               C->steps ? (double)C->accepted / (double)C->steps : 0.0, C->k_final_sum / n_prompts, ngbuf, lo, hi);
    }
    for (int c = 0; c < n_cfg; c++) {
        cfg *C = &cfgs[c];
        printf("{\"draft\": \"%s\", \"k\": %d, \"ngram\": %d, \"p_min\": %g, \"decode_tok_s\": %.1f, \"acceptance_rate\": %.4f, "
               "\"mean_accepted\": %.3f, \"us_per_step\": {\"draft\": %.1f, \"verify\": %.1f, \"all\": %.1f}}\n",
               C->draft < 0 ? "none" : draft_paths[C->draft], C->k, C->ngram, (double)C->p_min, median(C->tps, reps),
               C->drafted ? (double)C->accepted / (double)C->drafted : 0.0,
               C->steps ? (double)C->accepted / (double)C->steps : 0.0, C->steps ? 1e3 * C->draft_ms / (double)C->steps : 0.0,
               C->steps ? 1e3 * C->verify_ms / (double)C->steps : 0.0,
               1e3 * C->decode_ms / (double)(C->steps ? C->steps : (C->tokens > (uint64_t)n_prompts ? C->tokens - (uint64_t)n_prompts : 1)));
    }
    bench_prompts_free(prompts, n_prompts);
    tandem_engine_close(plain);
    for (int d = 0; d < n_drafts; d++) {
        tandem_engine_close(spec[d]);
        tandem_model_close(drafts[d]);
    }
    tandem_model_close(target);
    return 0;
}
