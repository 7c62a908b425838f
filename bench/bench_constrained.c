/* bench_constrained.c - what grammar-constrained decoding costs (issue 47): decode
 * speed with and without a JSON schema, target-only and speculative, at batch 1 and
 * batch 8, alternated A/B in one process.  --arm penalties: with and without the
 * logit edits instead (presence 0.5, frequency 0.5, repetition 1.1, a logit_bias of
 * 4 tokens); --arm logprobs: with and without logprobs (5 alternatives per token).
 * --tree N|auto: the speculative engine alone, every request under the arm (the
 * schema, penalties or logprobs), A verifying chains (spec_tree 0) and B token trees
 * (spec_tree N, or the controller's choice), alternated the same way (--arm none:
 * neither, the reference).
 *
 * Per batch size B: a target-only engine and a speculative one, each of B sequences;
 * per repetition every engine runs the prompts twice, unconstrained (A) and under the
 * schema (B), the order A B in even repetitions and B A in odd ones, so that machine
 * noise hits both alike.  The prompts run in waves of B requests (one
 * tandem_generate_batch each: every request of a wave starts and decodes together);
 * the figure is decoded tokens (after each request's first, the prefill's) / the
 * waves' decode seconds (a wave's: the longest decode time of its requests, which
 * run side by side).  Both runs generate max_tokens tokens per request
 * (ignore_eos; the schema keeps the output open: the default is an array of at
 * least 40 records, or give --schema, say an object whose string must be long), so
 * they differ only in the constraint (a request that ends before max_tokens anyway
 * is reported: its wave then runs fewer sequences).  Prints the medians of the
 * rates, and the medians over the repetitions of the ratios within one
 * (constrained / unconstrained: the overhead; speculative / target-only: the
 * speed-up, with and without the schema; and the share of the speed-up the schema
 * keeps), which cancel what drifts between repetitions on a shared machine.
 *
 * usage: bench_constrained -m TARGET -d DRAFT --prompts FILE [-n 64] [--limit 16]
 *                          [--reps 5] [--threads 2] [--batch 1,8] [--schema JSON]
 *                          [--arm schema|penalties|logprobs] [--tree N|auto [--arm none]]
 *                          [--only target|spec,free|on]
 * --only: one engine and one arm alone (for a profiler: perf record of what one arm
 * runs); the other rows print 0 and the ratios mean nothing.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_prompts.h"
#include "tandem.h"

#define MAX_REPS 32

/* Records of a table: an array of at least 40 objects (a model writing it does not
 * finish within 64 tokens, so that both runs decode as many tokens). */
static const char *SCHEMA_DEFAULT =
    "{\"type\": \"array\", \"minItems\": 40, \"items\": {\"type\": \"object\", \"properties\": {"
    "\"id\": {\"type\": \"integer\"}, \"name\": {\"type\": \"string\", \"maxLength\": 16}, \"ok\": {\"type\": "
    "\"boolean\"}}, \"required\": [\"id\", \"name\", \"ok\"], \"additionalProperties\": false}}";

/* What a run adds: nothing (A), or the B arm's. */
typedef enum arm { ARM_NONE, ARM_SCHEMA, ARM_PENALTIES, ARM_LOGPROBS } arm;
static const tandem_logit_bias BIAS[] = {{13, 1.5f}, {220, -1.0f}, {7, 0.5f}, {198, -2.0f}};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static void die(const char *what) {
    fprintf(stderr, "bench_constrained: %s: %s\n", what, tandem_last_error());
    exit(1);
}

/* Runs the prompts on e in waves of batch and returns decoded tokens / decode
 * seconds; *acc gets the acceptance of the drafted tokens. */
static double run(tandem_engine *e, char **prompts, int n, int max_tokens, const char *schema, arm b, int spec_tree,
                  int batch, double *acc) {
    tandem_request *rq = calloc((size_t)n, sizeof *rq);
    tandem_result *res = calloc((size_t)n, sizeof *res);
    for (int i = 0; i < n; i++) {
        rq[i] = tandem_request_default();
        rq[i].prompt = prompts[i];
        rq[i].params.max_tokens = max_tokens;
        rq[i].params.ignore_eos = true;
        rq[i].params.spec_tree = spec_tree;
        if (b == ARM_SCHEMA) rq[i].params.json_schema = schema;
        if (b == ARM_PENALTIES) {
            rq[i].params.presence_penalty = rq[i].params.frequency_penalty = 0.5f;
            rq[i].params.repetition_penalty = 1.1f;
            rq[i].params.logit_bias = BIAS;
            rq[i].params.n_logit_bias = 4;
        }
        if (b == ARM_LOGPROBS) rq[i].params.logprobs = true, rq[i].params.top_logprobs = 5;
    }
    double tokens = 0, decode_s = 0, drafted = 0, accepted = 0;
    int short_ = 0;
    for (int w = 0; w < n; w += batch) {
        const int m = n - w < batch ? n - w : batch;
        if (tandem_generate_batch(e, rq + w, (size_t)m, res + w) != TANDEM_OK) die("generate");
        double longest = 0;
        for (int i = w; i < w + m; i++) {
            if (res[i].status != TANDEM_OK) {
                fprintf(stderr, "bench_constrained: request %d: %s\n", i, res[i].error ? res[i].error : "?");
                exit(1);
            }
            tokens += res[i].n_tokens > 0 ? (double)res[i].n_tokens - 1 : 0;
            short_ += res[i].n_tokens < (size_t)max_tokens;
            longest = res[i].decode_ms > longest ? res[i].decode_ms : longest;
            drafted += (double)res[i].spec.drafted;
            accepted += (double)res[i].spec.accepted;
            tandem_result_free(&res[i]);
        }
        decode_s += longest / 1e3;
    }
    free(rq);
    free(res);
    if (short_) fprintf(stderr, "bench_constrained: %d of %d requests ended before %d tokens\n", short_, n, max_tokens);
    *acc = drafted > 0 ? accepted / drafted : 0;
    return tokens / decode_s;
}

/* --tree: per batch size, the speculative engine under the arm, chains (A) against
 * trees (B), alternated A B / B A; the medians of the rates and of the ratios within
 * a repetition. */
static void trees_vs_chains(tandem_model *t, tandem_model *d, char **prompts, int n, int n_new, const char *schema, arm b,
                            int tree, char *bl, int reps, int threads, const char *what, const char *tree_arg) {
    printf("| batch | %s: tok/s chains | tok/s trees (%s) | trees / chains | acceptance chains, trees |\n"
           "|---|---|---|---|---|\n", what, tree_arg);
    for (char *tok = strtok(bl, ","); tok; tok = strtok(NULL, ",")) {
        const int B = atoi(tok);
        tandem_engine_params ep = tandem_engine_default_params();
        ep.n_threads = threads;
        ep.n_seq_max = B;
        tandem_engine *e;
        if (tandem_engine_open(t, d, &ep, &e) != TANDEM_OK) die("engine");
        double rate[2][MAX_REPS], acc[2][MAX_REPS], ratio[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            for (int o = 0; o < 2; o++) {
                const int c = r % 2 ? 1 - o : o; /* A B, then B A */
                rate[c][r] = run(e, prompts, n, n_new, schema, b, c ? tree : 0, B, &acc[c][r]);
            }
            ratio[r] = rate[1][r] / rate[0][r];
        }
        const double r_ratio = median(ratio, reps);
        printf("| %d | %.1f | %.1f | %.3f | %.3f, %.3f |\n", B, median(rate[0], reps), median(rate[1], reps), r_ratio,
               median(acc[0], reps), median(acc[1], reps));
        fflush(stdout);
        tandem_engine_close(e);
    }
}

int main(int argc, char **argv) {
    const char *target = NULL, *draft = NULL, *prompts_file = NULL, *schema = SCHEMA_DEFAULT, *batches = "1,8";
    const char *arm_name = "schema", *tree_arg = NULL, *only = NULL;
    int n_new = 64, limit = 16, reps = 5, threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_constrained: %s needs a value\n", a);
            return 2;
        }
        if (!strcmp(a, "-m")) target = v;
        else if (!strcmp(a, "-d")) draft = v;
        else if (!strcmp(a, "--prompts")) prompts_file = v;
        else if (!strcmp(a, "-n")) n_new = atoi(v);
        else if (!strcmp(a, "--limit")) limit = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--threads")) threads = atoi(v);
        else if (!strcmp(a, "--batch")) batches = v;
        else if (!strcmp(a, "--schema")) schema = v;
        else if (!strcmp(a, "--arm")) arm_name = v;
        else if (!strcmp(a, "--tree")) tree_arg = v;
        else if (!strcmp(a, "--only")) only = v;
        else {
            fprintf(stderr, "bench_constrained: unknown option %s\n", a);
            return 2;
        }
        i++;
    }
    const arm b = !strcmp(arm_name, "penalties") ? ARM_PENALTIES : !strcmp(arm_name, "logprobs") ? ARM_LOGPROBS
                : !strcmp(arm_name, "none") && tree_arg ? ARM_NONE : ARM_SCHEMA;
    const int tree = !tree_arg ? 0 : !strcmp(tree_arg, "auto") ? TANDEM_SPEC_TREE_AUTO : atoi(tree_arg);
    /* --only: the engine (0 target, 1 spec) and arm (0 free, 1 on) that run, -1 all */
    int only_x = -1, only_c = -1;
    if (only) {
        only_x = !strncmp(only, "target,", 7) ? 0 : !strncmp(only, "spec,", 5) ? 1 : -2;
        const char *c = strchr(only, ',');
        only_c = !c ? -2 : !strcmp(c + 1, "free") ? 0 : !strcmp(c + 1, "on") ? 1 : -2;
    }
    if (!target || !draft || !prompts_file || n_new < 2 || limit < 1 || reps < 1 || reps > MAX_REPS ||
        (b == ARM_SCHEMA && strcmp(arm_name, "schema")) ||
        (tree_arg && tree != TANDEM_SPEC_TREE_AUTO && (tree < 1 || tree > TANDEM_SPEC_TREE_MAX)) ||
        only_x == -2 || only_c == -2 || (only && tree_arg)) {
        fprintf(stderr, "usage: bench_constrained -m TARGET -d DRAFT --prompts FILE [-n 64] [--limit 16] [--reps 5]"
                        " [--threads 2] [--batch 1,8] [--schema JSON] [--arm schema|penalties|logprobs] [--tree N|auto [--arm none]]"
                        " [--only target|spec,free|on]\n");
        return 2;
    }
    const char *what = b == ARM_SCHEMA ? "JSON schema" : b == ARM_NONE ? "unconstrained" : arm_name;
    int n = 0;
    char **prompts = bench_prompts_read(prompts_file, limit, &n);
    tandem_model *t = NULL, *d = NULL;
    if (tandem_model_open(target, NULL, &t) != TANDEM_OK) die(target);
    if (tandem_model_open(draft, NULL, &d) != TANDEM_OK) die(draft);
    char *bl = strdup(batches);
    if (tree_arg) {
        trees_vs_chains(t, d, prompts, n, n_new, schema, b, tree, bl, reps, threads, what, tree_arg);
        free(bl);
        tandem_model_close(d);
        tandem_model_close(t);
        bench_prompts_free(prompts, n);
        return 0;
    }
    printf("| batch | engine | tok/s free | tok/s %s | %s / free | acceptance free, %s |\n"
           "|---|---|---|---|---|---|\n", what, arm_name, arm_name);
    for (char *tok = strtok(bl, ","); tok; tok = strtok(NULL, ",")) {
        const int B = atoi(tok);
        tandem_engine_params ep = tandem_engine_default_params();
        ep.n_threads = threads;
        ep.n_seq_max = B;
        tandem_engine *eng[2];
        if (tandem_engine_open(t, NULL, &ep, &eng[0]) != TANDEM_OK) die("engine");
        if (tandem_engine_open(t, d, &ep, &eng[1]) != TANDEM_OK) die("engine");
        double rate[2][2][MAX_REPS], acc[2][2][MAX_REPS];
        for (int r = 0; r < reps; r++)
            for (int x = 0; x < 2; x++)
                for (int o = 0; o < 2; o++) {
                    const int c = r % 2 ? 1 - o : o; /* A B, then B A */
                    rate[x][c][r] = acc[x][c][r] = 0;
                    if ((only_x >= 0 && x != only_x) || (only_c >= 0 && c != only_c)) continue;
                    rate[x][c][r] = run(eng[x], prompts, n, n_new, schema, c ? b : ARM_NONE, 0, B, &acc[x][c][r]);
                }
        /* ratios within a repetition (its A and B ran back to back), then their median:
         * what drifts between repetitions cancels */
        double med[2][2], ratio[2][MAX_REPS], sp[2][MAX_REPS], kept[MAX_REPS];
        for (int r = 0; r < reps; r++) {
            for (int x = 0; x < 2; x++) ratio[x][r] = rate[x][1][r] / rate[x][0][r];
            for (int c = 0; c < 2; c++) sp[c][r] = rate[1][c][r] / rate[0][c][r];
            kept[r] = sp[1][r] / sp[0][r];
        }
        for (int x = 0; x < 2; x++) {
            for (int c = 0; c < 2; c++) med[x][c] = median(rate[x][c], reps);
            printf("| %d | %s | %.1f | %.1f | %.3f | %.3f, %.3f |\n", B, x ? "speculative (draft)" : "target only",
                   med[x][0], med[x][1], median(ratio[x], reps), x ? median(acc[x][0], reps) : 0.0,
                   x ? median(acc[x][1], reps) : 0.0);
        }
        const double sp0 = median(sp[0], reps), sp1 = median(sp[1], reps);
        printf("| %d | speed-up of the draft | %.2fx | %.2fx | kept %.0f %% | |\n", B, sp0, sp1, 100.0 * median(kept, reps));
        fflush(stdout);
        tandem_engine_close(eng[0]);
        tandem_engine_close(eng[1]);
    }
    free(bl);
    tandem_model_close(d);
    tandem_model_close(t);
    bench_prompts_free(prompts, n);
    return 0;
}
