/* cli_bench.c - `tandem bench`: prefill and decode speed, greedy.
 *
 * Two modes:
 *  - synthetic (default): a prompt of exactly P tokens (BOS, if the model has one,
 *    then the ids of a built-in chunk of Python source repeated as needed), run
 *    with tandem_generate_ids R times; the median of each rate is reported.
 *  - --prompts FILE: every prompt of the file (at most --limit), -n new tokens each;
 *    rates aggregate a whole pass (total tokens / total time); with R > 1 passes
 *    the median over passes is reported.
 * Speculative statistics are summed over every run.  The prefix cache is off unless
 * --prefix-cache: the runs repeat their prompts, and a prefill rate from cached
 * blocks would measure nothing; with it on, the hit rate is reported. */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli.h"
#include "json.h"

static const char bench_source[] =
    "import os\n"
    "import sys\n"
    "from collections import defaultdict\n"
    "\n"
    "\n"
    "class LineCounter:\n"
    "    \"\"\"Counts lines, words and characters of the files under a directory.\"\"\"\n"
    "\n"
    "    def __init__(self, root, extensions=(\".py\", \".txt\")):\n"
    "        self.root = root\n"
    "        self.extensions = tuple(extensions)\n"
    "        self.totals = defaultdict(int)\n"
    "\n"
    "    def files(self):\n"
    "        for dirpath, dirnames, filenames in os.walk(self.root):\n"
    "            dirnames[:] = [d for d in dirnames if not d.startswith(\".\")]\n"
    "            for name in sorted(filenames):\n"
    "                if name.endswith(self.extensions):\n"
    "                    yield os.path.join(dirpath, name)\n"
    "\n"
    "    def count(self, path):\n"
    "        lines = words = chars = 0\n"
    "        with open(path, encoding=\"utf-8\", errors=\"replace\") as f:\n"
    "            for line in f:\n"
    "                lines += 1\n"
    "                words += len(line.split())\n"
    "                chars += len(line)\n"
    "        return lines, words, chars\n"
    "\n"
    "    def run(self):\n"
    "        for path in self.files():\n"
    "            lines, words, chars = self.count(path)\n"
    "            self.totals[\"lines\"] += lines\n"
    "            self.totals[\"words\"] += words\n"
    "            self.totals[\"chars\"] += chars\n"
    "            print(f\"{lines:8d} {words:8d} {chars:8d} {path}\")\n"
    "        return dict(self.totals)\n"
    "\n"
    "\n"
    "def main(argv):\n"
    "    root = argv[1] if len(argv) > 1 else \".\"\n"
    "    totals = LineCounter(root).run()\n"
    "    print(\"total:\", totals.get(\"lines\", 0), \"lines\")\n"
    "    return 0\n"
    "\n"
    "\n"
    "if __name__ == \"__main__\":\n"
    "    sys.exit(main(sys.argv))\n";

typedef struct bench_opts {
    const char *model, *draft, *prompts_file;
    int prompt_tokens;       /* -p, default 128 */
    int new_tokens;          /* -n, default 128 */
    int threads;
    tandem_backend_kind backend;
    size_t gpu_mem;          /* 0 = no budget */
    tandem_kv_type kv_type;  /* --kv-type; default auto */
    tandem_weights weights;  /* --weights; default native */
    int draft_vocab;         /* --draft-vocab; default auto */
    int ctx;                 /* --ctx; 0 = the engine's default */
    size_t kv_mem;           /* --kv-mem; 0 = ctx tokens */
    int tensor_parallel;     /* --tensor-parallel; default 1 */
    int spec_k, spec_k_max, spec_ngram;
    int spec_tree;           /* --spec-tree: 0 = off, TANDEM_SPEC_TREE_AUTO, a budget */
    const char *spec_tree_shape; /* --spec-tree as a static shape */
    float oracle;            /* --spec-oracle: benchmark mode's acceptance, < 0 = off */
    int reps;                /* 0 = mode default */
    int limit;               /* 0 = all prompts */
    bool json;
    bool prefix_cache;       /* --prefix-cache */
} bench_opts;

/* One measured pass. */
typedef struct bench_run {
    double prompt_tokens, gen_tokens, decode_tokens, prefill_ms, decode_ms;
} bench_run;

static int parse_args(int argc, char **argv, bench_opts *o) {
    *o = (bench_opts){.prompt_tokens = 128, .new_tokens = 128, .backend = TANDEM_BACKEND_CPU, .oracle = -1,
                      .tensor_parallel = 1, .draft_vocab = TANDEM_DRAFT_VOCAB_AUTO,
                      .spec_ngram = tandem_generate_default_params().spec_ngram};
    bool have_p = false;
    const char *spec_opt = NULL, *limit_opt = NULL; /* given: need -d / --prompts */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool ok = true, missing = false;
        if (cli_is_help(a)) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
#define TAKE(s, l) cli_take(argc, argv, &i, (s), (l), &v, &missing)
        if (cli_opt_flag(a, NULL, "--json")) o->json = true;
        else if (cli_opt_flag(a, NULL, "--prefix-cache")) o->prefix_cache = true;
        else if (TAKE("-m", "--model")) o->model = v;
        else if (TAKE("-d", "--draft")) o->draft = v;
        else if (TAKE(NULL, "--prompts")) o->prompts_file = v;
        else if (TAKE("-p", "--prompt-tokens")) {
            ok = cli_parse_int(a, v, 1, 1 << 20, &o->prompt_tokens);
            have_p = true;
        } else if (TAKE("-n", "--max-tokens")) ok = cli_parse_int(a, v, 1, 1 << 20, &o->new_tokens);
        else if (TAKE("-t", "--threads")) ok = cli_parse_int(a, v, 0, TANDEM_THREADS_MAX, &o->threads);
        else if (TAKE(NULL, "--backend")) ok = cli_parse_backend(a, v, &o->backend);
        else if (TAKE(NULL, "--tensor-parallel")) ok = cli_parse_tensor_parallel(a, v, &o->tensor_parallel);
        else if (TAKE(NULL, "--gpu-mem")) ok = cli_parse_size(a, v, &o->gpu_mem);
        else if (TAKE(NULL, "--kv-type")) ok = cli_parse_kv_type(a, v, &o->kv_type);
        else if (TAKE(NULL, "--weights")) ok = cli_parse_weights(a, v, &o->weights);
        else if (TAKE(NULL, "--draft-vocab")) ok = cli_parse_draft_vocab(a, v, &o->draft_vocab);
        else if (TAKE(NULL, "--ctx")) ok = cli_parse_int(a, v, 1, CLI_CTX_MAX, &o->ctx);
        else if (TAKE(NULL, "--kv-mem")) ok = cli_parse_size(a, v, &o->kv_mem);
        else if (TAKE(NULL, "--spec-k")) ok = cli_parse_spec_k(a, v, &o->spec_k);
        else if (TAKE(NULL, "--spec-k-max")) ok = cli_parse_int(a, v, 1, TANDEM_SPEC_K_MAX, &o->spec_k_max);
        else if (TAKE(NULL, "--spec-ngram")) ok = cli_parse_spec_ngram(a, v, &o->spec_ngram);
        else if (TAKE(NULL, "--spec-tree")) ok = cli_parse_spec_tree(a, v, &o->spec_tree, &o->spec_tree_shape);
        else if (TAKE(NULL, "--spec-oracle")) ok = cli_parse_float(a, v, 0, 1, &o->oracle);
        else if (TAKE(NULL, "--reps")) ok = cli_parse_int(a, v, 1, 10000, &o->reps);
        else if (TAKE(NULL, "--limit")) {
            ok = cli_parse_int(a, v, 1, 1 << 30, &o->limit);
            limit_opt = a;
        }
        else return cli_unknown_arg(a);
#undef TAKE
        if (missing || !ok) return CLI_EXIT_USAGE;
        if (!spec_opt && cli_is_spec_opt(a)) spec_opt = a;
    }
    if (!o->model) return cli_usage_error("missing required option -m MODEL");
    if (spec_opt && !o->draft) return cli_needs(spec_opt, "-d DRAFT");
    if (limit_opt && !o->prompts_file) return cli_needs(limit_opt, "--prompts FILE");
    if (have_p && o->prompts_file) return cli_usage_error("give either -p or --prompts, not both");
    if (o->reps == 0) o->reps = o->prompts_file ? 1 : 5;
    return -1;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Builds the synthetic prompt: [n] ids.  *out is malloc'ed. */
static tandem_status build_prompt(const tandem_model *m, int n, int32_t **out) {
    *out = NULL;
    tandem_model_info info;
    tandem_status s = tandem_model_get_info(m, &info);
    if (s != TANDEM_OK) return s;
    int32_t *chunk = NULL;
    size_t n_chunk = 0;
    s = tandem_tokenize(m, bench_source, sizeof bench_source - 1, false, &chunk, &n_chunk);
    if (s != TANDEM_OK) return s;
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids || n_chunk == 0) {
        free(ids);
        tandem_free(chunk);
        return ids ? TANDEM_ERR_INTERNAL : TANDEM_ERR_NOMEM;
    }
    int k = 0;
    if (info.bos >= 0) ids[k++] = info.bos;
    for (size_t j = 0; k < n; j = (j + 1) % n_chunk) ids[k++] = chunk[j];
    tandem_free(chunk);
    *out = ids;
    return TANDEM_OK;
}

/* Benchmark mode (--spec-oracle): the target's own continuation of every prompt
 * (truth[i], n_truth[i] tokens) from a target-only engine, whose decode rate over
 * the same runs is *plain_tps (the speed-up's base, median of reps). */
static tandem_status oracle_truth(tandem_model *target, const tandem_engine_params *ep, const int32_t *ids, size_t n_ids,
                                  const cli_prompts *ps, const tandem_generate_params *gp, int reps, int32_t **truth,
                                  int *n_truth, double *plain_tps) {
    tandem_engine *plain = NULL;
    tandem_status s = tandem_engine_open(target, NULL, ep, &plain);
    double v[64] = {0};
    const size_t n = ids ? 1 : ps->n;
    for (int rep = 0; rep < reps && rep < 64 && s == TANDEM_OK; rep++) {
        double toks = 0, ms = 0;
        for (size_t i = 0; i < n && s == TANDEM_OK; i++) {
            tandem_result r;
            memset(&r, 0, sizeof r);
            s = ids ? tandem_generate_ids(plain, ids, n_ids, gp, &r) : tandem_generate(plain, ps->items[i].text, gp, &r);
            if (s == TANDEM_OK && rep == 0 && r.n_tokens > 0 && (truth[i] = malloc(r.n_tokens * sizeof(int32_t)))) {
                memcpy(truth[i], r.tokens, r.n_tokens * sizeof(int32_t));
                n_truth[i] = (int)r.n_tokens;
            }
            toks += r.n_tokens > 0 ? (double)(r.n_tokens - 1) : 0.0;
            ms += r.decode_ms;
            tandem_result_free(&r);
        }
        v[rep] = cli_tok_per_s(toks, ms);
    }
    tandem_engine_close(plain);
    *plain_tps = s == TANDEM_OK ? median(v, reps < 64 ? reps : 64) : 0.0;
    return s;
}

/* gp with the oracle of prompt i when there is one. */
static tandem_generate_params with_oracle(const tandem_generate_params *gp, const bench_opts *o, int32_t *const *truth,
                                          const int *n_truth, size_t i) {
    tandem_generate_params g = *gp;
    if (o->oracle >= 0 && truth && truth[i]) {
        g.bench_oracle_tokens = truth[i];
        g.bench_n_oracle = n_truth[i];
        g.bench_oracle_alpha = o->oracle;
    }
    return g;
}

/* Runs one generation and adds it to run / spec. */
static tandem_status run_one(tandem_engine *eng, const int32_t *ids, size_t n_ids,
                             const char *text, const tandem_generate_params *gp, bench_run *run,
                             tandem_spec_stats *spec) {
    tandem_result r;
    memset(&r, 0, sizeof r);
    tandem_status s = ids ? tandem_generate_ids(eng, ids, n_ids, gp, &r)
                          : tandem_generate(eng, text, gp, &r);
    if (s == TANDEM_OK) {
        run->prompt_tokens += (double)r.n_prompt_tokens;
        run->gen_tokens += (double)r.n_tokens;
        /* the first token comes out of the prefill; decode time covers the rest */
        run->decode_tokens += r.n_tokens > 0 ? (double)(r.n_tokens - 1) : 0.0;
        run->prefill_ms += r.prefill_ms;
        run->decode_ms += r.decode_ms;
        if (spec) cli_spec_add(spec, &r.spec);
    }
    tandem_result_free(&r);
    return s;
}

/* What the report needs beside the rates: memory, and the bytes a decode step reads
 * (target weights, plus its K / V at the run's mean context length). */
typedef struct bench_mem {
    double rss_mb, gpu_mb;
    double gpu_mb_rank[8];  /* of a split target: each GPU's peak (rank 0's = gpu_mb) */
    int n_rank;             /* --tensor-parallel */
    double decode_gb_s; /* bytes read per target decode step / its time (target-only runs) */
} bench_mem;

/* A rate line; "n/a" for work not done (-n 1, or an EOS first, decodes nothing). */
static void print_rate(const char *label, double tok_per_s) {
    if (tok_per_s > 0)
        printf("%s%.1f tok/s\n", label, tok_per_s);
    else
        printf("%sn/a (no tokens)\n", label);
}

static void print_report(const bench_opts *o, int threads, const bench_run *last, size_t n_prompts,
                         double prefill_tps, double decode_tps, const tandem_spec_stats *spec,
                         const bench_mem *mem, const tandem_engine_stats *es, double plain_tps) {
    const double hit = es->prompt_tokens ? (double)es->cached_tokens / (double)es->prompt_tokens : 0.0;
    const double rss_mb = mem->rss_mb;
    double acc_rate = spec->drafted ? (double)spec->accepted / (double)spec->drafted : 0.0;
    double mean_acc = spec->steps ? (double)spec->accepted / (double)spec->steps : 0.0;
    if (o->json) {
        fputs("{\"model\": ", stdout);
        tdm_json_write_str(stdout, o->model, strlen(o->model));
        fputs(", \"draft\": ", stdout);
        if (o->draft)
            tdm_json_write_str(stdout, o->draft, strlen(o->draft));
        else
            fputs("null", stdout);
        printf(", \"threads\": %d, \"backend\": \"%s\", \"prompt_tokens\": %.0f, "
               "\"new_tokens\": %d, \"generated_tokens\": %.0f",
               threads, o->backend == TANDEM_BACKEND_CUDA ? "cuda" : "cpu", last->prompt_tokens,
               o->new_tokens, last->gen_tokens);
        if (o->prompts_file) printf(", \"n_prompts\": %zu", n_prompts);
        fputs(", \"prefill_tok_s\": ", stdout);
        cli_json_num(stdout, prefill_tps, 2);
        fputs(", \"decode_tok_s\": ", stdout);
        cli_json_num(stdout, decode_tps, 2);
        fputs(", \"peak_rss_mb\": ", stdout);
        cli_json_num(stdout, rss_mb, 1);
        fputs(", \"peak_gpu_mb\": ", stdout);
        cli_json_num(stdout, mem->gpu_mb, 1);
        fprintf(stdout, ", \"tensor_parallel\": %d, \"peak_gpu_mb_per_rank\": [", mem->n_rank);
        for (int r = 0; r < mem->n_rank; r++) {
            if (r) fputs(", ", stdout);
            cli_json_num(stdout, mem->gpu_mb_rank[r], 1);
        }
        fputs("]", stdout);
        if (!o->draft) {
            fputs(", \"decode_gb_s\": ", stdout);
            cli_json_num(stdout, mem->decode_gb_s, 1);
        }
        printf(", \"reps\": %d, \"prefix_cache\": %s, \"prefix_hit_rate\": ", o->reps,
               o->prefix_cache ? "true" : "false");
        cli_json_num(stdout, hit, 4);
        if (o->draft) {
            fputs(", ", stdout);
            cli_json_spec(stdout, spec);
        }
        if (o->oracle >= 0) {
            fputs(", \"bench_mode\": \"oracle\", \"oracle_alpha\": ", stdout);
            cli_json_num(stdout, o->oracle, 3);
            fputs(", \"plain_decode_tok_s\": ", stdout);
            cli_json_num(stdout, plain_tps, 2);
            fputs(", \"speedup\": ", stdout);
            cli_json_num(stdout, plain_tps > 0 ? decode_tps / plain_tps : 0.0, 3);
        }
        fputs("}\n", stdout);
    } else {
        printf("model:    %s\n", o->model);
        if (o->draft) printf("draft:    %s\n", o->draft);
        printf("backend:  %s, %d threads\n", o->backend == TANDEM_BACKEND_CUDA ? "cuda" : "cpu",
               threads);
        if (o->prompts_file)
            printf("prompts:  %zu from %s: %.0f prompt tokens, %.0f generated tokens per pass "
                   "(-n %d)\n",
                   n_prompts, o->prompts_file, last->prompt_tokens, last->gen_tokens,
                   o->new_tokens);
        else
            printf("prompt:   %d tokens (synthetic), %d new tokens (%.0f generated)\n",
                   o->prompt_tokens, o->new_tokens, last->gen_tokens);
        printf("reps:     %d (median)\n", o->reps);
        if (o->prefix_cache)
            printf("prefix:   %.1f%% of prompt tokens from the prefix cache\n", 100.0 * hit);
        print_rate("prefill:  ", prefill_tps);
        print_rate("decode:   ", decode_tps);
        if (!o->draft && decode_tps > 0)
            printf("          %.1f GB/s of weights and K/V read per decode step\n", mem->decode_gb_s);
        if (o->draft)
            printf("spec:     acceptance %.3f, mean accepted %.2f/step, %llu steps, k_final %d; "
                   "n-gram lookup: %llu steps, %llu of %llu proposed tokens\n",
                   acc_rate, mean_acc, (unsigned long long)spec->steps, spec->k_final,
                   (unsigned long long)spec->ngram_steps, (unsigned long long)spec->ngram_drafted,
                   (unsigned long long)spec->drafted);
        if (o->oracle >= 0)
            printf("ORACLE BENCHMARK MODE (controlled acceptance, alpha %.2f): target-only decode %.1f tok/s, "
                   "speed-up %.2fx\n",
                   (double)o->oracle, plain_tps, plain_tps > 0 ? decode_tps / plain_tps : 0.0);
        if (o->draft && spec->forwards)
            printf("          %.3f tokens per target forward; trees in %llu steps\n",
                   (double)spec->forward_tokens / (double)spec->forwards, (unsigned long long)spec->tree_steps);
        printf("peak RSS: %.1f MB\n", rss_mb);
        if (mem->gpu_mb > 0) printf("peak GPU: %.1f MB (device memory in use)\n", mem->gpu_mb);
        for (int r = 0; mem->n_rank > 1 && mem->gpu_mb > 0 && r < mem->n_rank; r++)
            printf("  rank %d (tensor parallel): %.1f MB\n", r, mem->gpu_mb_rank[r]);
    }
    fflush(stdout);
}

int cli_bench(int argc, char **argv) {
    bench_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc >= 0) return rc;

    cli_prompts prompts = {0};
    if (o.prompts_file) {
        char err[512];
        if (!cli_prompts_read(o.prompts_file, &prompts, err, sizeof err)) return cli_error("%s", err);
        if (o.limit > 0 && prompts.n > (size_t)o.limit) {
            for (size_t i = (size_t)o.limit; i < prompts.n; i++) {
                free(prompts.items[i].text);
                free(prompts.items[i].id_str);
            }
            prompts.n = (size_t)o.limit;
        }
        for (size_t i = 0; i < prompts.n; i++)
            if (memchr(prompts.items[i].text, '\0', prompts.items[i].len)) {
                cli_prompts_free(&prompts);
                return cli_error("%s:%d: the prompt contains a NUL character", o.prompts_file,
                                 prompts.items[i].line);
            }
    }

    tandem_model *target = NULL, *draft = NULL;
    tandem_engine *eng = NULL;
    int32_t *ids = NULL, **truth = NULL; /* --spec-oracle: [prompts] the target's continuations */
    int *n_truth = NULL;
    double plain_tps = 0; /* --spec-oracle: target-only decode tok/s (median) */
    double *prefill_v = calloc((size_t)o.reps, sizeof *prefill_v);
    double *decode_v = calloc((size_t)o.reps, sizeof *decode_v);
    tandem_status s = TANDEM_OK;
    if (!prefill_v || !decode_v) {
        rc = cli_error("out of memory");
        goto done;
    }
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = o.backend;
    mp.weights = o.weights;
    mp.tensor_parallel = o.tensor_parallel; /* (the target only) */
    if ((s = tandem_model_open(o.model, &mp, &target)) != TANDEM_OK) goto fail;
    mp.tensor_parallel = 1;
    if (o.draft && (s = tandem_model_open(o.draft, &mp, &draft)) != TANDEM_OK) goto fail;
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = o.threads;
    ep.gpu_mem = o.gpu_mem;
    ep.kv_type = o.kv_type;
    ep.draft_vocab = o.draft_vocab;
    ep.n_ctx = o.ctx;
    ep.kv_bytes = o.kv_mem;
    ep.prefix_cache = o.prefix_cache;
    if ((s = tandem_engine_open(target, draft, &ep, &eng)) != TANDEM_OK) goto fail;
    if (!o.prompts_file && (s = build_prompt(target, o.prompt_tokens, &ids)) != TANDEM_OK) goto fail;

    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = o.new_tokens;
    gp.temperature = 0; /* greedy */
    gp.spec_k = o.spec_k;
    if (o.spec_k_max > 0) gp.spec_k_max = o.spec_k_max;
    gp.spec_ngram = o.spec_ngram;
    gp.spec_tree = o.spec_tree_shape ? 0 : o.spec_tree;
    gp.spec_tree_shape = o.spec_tree_shape;
    if (gp.spec_k_min > gp.spec_k_max) gp.spec_k_min = gp.spec_k_max;
    /* synthetic runs generate exactly -n tokens, as llama-bench does */
    gp.ignore_eos = !o.prompts_file;

    /* Warm-up (not measured): touches the weights and the KV cache once. */
    {
        bench_run warm = {0};
        tandem_generate_params wp = gp;
        wp.max_tokens = gp.max_tokens < 8 ? gp.max_tokens : 8;
        if (ids)
            s = run_one(eng, ids, (size_t)o.prompt_tokens, NULL, &wp, &warm, NULL);
        else
            s = run_one(eng, NULL, 0, prompts.items[0].text, &wp, &warm, NULL);
        if (s != TANDEM_OK) goto fail;
    }

    if (o.oracle >= 0) {
        const size_t n_truth_cap = ids ? 1 : prompts.n;
        truth = calloc(n_truth_cap, sizeof *truth);
        n_truth = calloc(n_truth_cap, sizeof *n_truth);
        if (!truth || !n_truth) {
            rc = cli_error("out of memory");
            goto done;
        }
        if ((s = oracle_truth(target, &ep, ids, (size_t)o.prompt_tokens, &prompts, &gp, o.reps, truth, n_truth,
                              &plain_tps)) != TANDEM_OK)
            goto fail;
    }
    tandem_spec_stats spec;
    memset(&spec, 0, sizeof spec);
    bench_run run = {0};
    for (int rep = 0; rep < o.reps; rep++) {
        memset(&run, 0, sizeof run);
        if (ids) {
            const tandem_generate_params g = with_oracle(&gp, &o, truth, n_truth, 0);
            s = run_one(eng, ids, (size_t)o.prompt_tokens, NULL, &g, &run, &spec);
        } else {
            for (size_t i = 0; i < prompts.n && s == TANDEM_OK; i++) {
                const tandem_generate_params g = with_oracle(&gp, &o, truth, n_truth, i);
                s = run_one(eng, NULL, 0, prompts.items[i].text, &g, &run, &spec);
            }
        }
        if (s != TANDEM_OK) goto fail;
        prefill_v[rep] = cli_tok_per_s(run.prompt_tokens, run.prefill_ms);
        decode_v[rep] = cli_tok_per_s(run.decode_tokens, run.decode_ms);
    }
    int threads = o.threads;
    if (threads == 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        threads = nc > 0 ? (int)nc : 1;
    }
    const double decode_tps = median(decode_v, o.reps);
    bench_mem mem;
    memset(&mem, 0, sizeof mem);
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    getrusage(RUSAGE_SELF, &ru);
    mem.rss_mb = (double)ru.ru_maxrss / 1024.0;
    mem.gpu_mb = (double)tandem_engine_device_peak_bytes(eng) / (1024.0 * 1024.0);
    mem.n_rank = o.tensor_parallel;
    for (int r = 0; r < mem.n_rank && r < 8; r++)
        mem.gpu_mb_rank[r] = (double)tandem_engine_device_peak_bytes_rank(eng, r) / (1024.0 * 1024.0);
    tandem_model_info ti;
    if (tandem_model_get_info(target, &ti) == TANDEM_OK && run.gen_tokens > 0) {
        /* a decode step at position p reads the weights and p positions of K / V */
        const double runs = o.prompts_file ? (double)prompts.n : 1.0;
        const double mean_ctx = run.prompt_tokens / runs + run.gen_tokens / runs / 2.0;
        const double bytes = (double)ti.decode_bytes + mean_ctx * (double)ti.kv_bytes_per_token;
        mem.decode_gb_s = bytes * decode_tps / 1e9;
    }
    tandem_engine_stats es;
    if (tandem_engine_get_stats(eng, &es) != TANDEM_OK) memset(&es, 0, sizeof es);
    print_report(&o, threads, &run, prompts.n, median(prefill_v, o.reps), decode_tps, &spec, &mem, &es, plain_tps);
    rc = CLI_EXIT_OK;
    goto done;

fail:
    rc = cli_pair_error(s, o.model, o.draft);
done:
    for (size_t i = 0; truth && i < (ids ? 1 : prompts.n); i++) free(truth[i]);
    free(truth);
    free(n_truth);
    free(ids);
    free(prefill_v);
    free(decode_v);
    tandem_engine_close(eng);
    tandem_model_close(draft);
    tandem_model_close(target);
    cli_prompts_free(&prompts);
    return rc;
}
