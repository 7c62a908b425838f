/* main.c - the `tandem` program: subcommand dispatch, usage text, and the option
 * parsing helpers shared by the subcommands. */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "input.h"
#include "json.h"

#define STR_(x) #x
#define STR(x) STR_(x) /* a number macro as text, for the usage text */
#define LINE_MIB STR(TDM_INPUT_LINE_MIB)
#define TOTAL_MIB STR(TDM_INPUT_TOTAL_MIB)
#define SPEC_K_MAX STR(TANDEM_SPEC_K_MAX)

static const char usage_text[] =
    "usage: tandem <command> [options]\n"
    "\n"
    "commands:\n"
    "  generate   generate completions (optionally with speculative decoding)\n"
    "  chat       talk with a model on the terminal (its chat template, streamed replies)\n"
    "  tokenize   print the token ids of a text\n"
    "  info       describe a GGUF file (metadata and tensors)\n"
    "  bench      measure prefill and decode speed\n"
    "  synth      write a random-weight model with the shapes of a real one\n"
    "  run        run a batch job described by an INI file (configs/*.ini)\n"
    "  merge      join the outputs of a job's shards, checking every id once\n"
    "  quantize   convert a model's matrices to a quantised type (q4_k_m, q8_0, ...)\n"
    "  help       print this text\n"
    "\n"
    "tandem generate -m MODEL [-d DRAFT] (-p TEXT | --prompts FILE.jsonl | --messages FILE.json) [options]\n"
    "  -m, --model FILE      target model (GGUF)\n"
    "  -d, --draft FILE      draft model for speculative decoding\n"
    "  -p, --prompt TEXT     prompt text (id 0)\n"
    "      --prompts FILE    JSON lines: {\"id\", \"prompt\" or \"messages\"[, \"seed\", \"max_tokens\",\n"
    "                        \"temperature\", \"priority\", \"timeout_s\", \"stop\": STRING or [STRING, ...]]};\n"
    "                        \"messages\": [{\"role\", \"content\"}, ...] is rendered by the chat template\n"
    "                        (a line at most " LINE_MIB " MiB, the file at most " TOTAL_MIB " MiB)\n"
    "      --messages FILE   one conversation: a JSON array of messages (OpenAI style), or\n"
    "                        {\"messages\": [...], \"tools\": [...]}; implies --chat\n"
    "      --chat            render prompts as conversations (-p TEXT and \"prompt\" lines as\n"
    "                        one user message) by the model's chat template, ending with\n"
    "                        the assistant's turn; generation stops at the end of the turn\n"
    "      --chat-template T the template instead of the model's: a built-in one (chatml, llama2,\n"
    "                        llama3, gemma, mistral, mistral-v7, phi3, deepseek2, deepseek3,\n"
    "                        deepseek-r1), a named one of the model, or a .jinja file\n"
    "  -n, --max-tokens N    new tokens at most, N >= 0 (default 128)\n"
    "      --temp T          temperature, T >= 0, 0 = greedy (default 0)\n"
    "      --top-k K         top-k filter, K >= 0, 0 = off (default 0)\n"
    "      --top-p P         nucleus filter, 0 < P <= 1, 1 = off (default 1)\n"
    "      --min-p P         min-p filter, 0 <= P <= 1, 0 = off (default 0)\n"
    "      --seed S          sampling seed, 0 <= S <= 2^64-1 (default 0)\n"
    "  -t, --threads N       CPU threads, 0.." STR(TANDEM_THREADS_MAX) ", 0 = all cores (default 0)\n"
    "      --backend B       cpu or cuda (default cpu)\n"
    "      --tensor-parallel N  split the target across N GPUs (cuda: devices 0..N-1, NCCL;\n"
    "                        heads, KV heads and FFN features must divide by N; the draft\n"
    "                        runs whole on the first), 1..8 (default 1)\n"
    "      --batch N         decode N prompts at once (continuous batching), 1.." STR(CLI_BATCH_MAX) " (default 1);\n"
    "                        results print in input order; a failed prompt does not stop the others\n"
    "      --gpu-mem SIZE    device memory budget (e.g. 24G): weights, buffers, and the KV cache\n"
    "                        in what is left (cuda only; default: a cache for one full context)\n"
    "      --kv-type T       KV cache type of both models: auto (f32 on the CPU, f16 on cuda),\n"
    "                        f32, f16, or q8_0 (int8 with a scale per position and head:\n"
    "                        about half of f16) (default auto)\n"
    "      --json            one JSON object per prompt on stdout\n"
    "  speculation (refused without -d):\n"
    "      --spec-k N|auto   draft tokens per step, 1.." SPEC_K_MAX ", auto = adaptive (default auto)\n"
    "      --spec-k-max N    adaptive upper bound, 1.." SPEC_K_MAX " (default 12)\n"
    "      --p-min P         stop drafting below this draft probability, 0 <= P <= 1 (default 0)\n"
    "      --spec-ngram N    also propose by n-gram lookup in the text so far: match the\n"
    "                        last N..2 tokens, N = " STR(TANDEM_SPEC_NGRAM_MIN) ".." STR(TANDEM_SPEC_NGRAM_MAX) "; 0 or off = never (default 4)\n"
    "      --spec-tree T     token trees instead of chains: NODES (a dynamic tree of at most\n"
    "                        NODES nodes, 1.." STR(TANDEM_SPEC_TREE_MAX) "), a static shape of branching factors\n"
    "                        per depth (4,2,2,1), auto (chain or tree and the budget from\n"
    "                        measured acceptance and costs) or off (default off)\n"
    "\n"
    "tandem chat -m MODEL [-d DRAFT] [--chat-template T] [--system TEXT] [generate's sampling,\n"
    "            speculation and engine options]\n"
    "  each line of stdin is a user message, answered as it arrives (a terminal or a\n"
    "  pipe); the reply streams to stdout and the conversation is kept.  A line ending\n"
    "  in \\ goes on in the next line (the message is the lines joined by newlines).\n"
    "  Commands: /help lists them, /reset forgets the conversation (not --system),\n"
    "  /exit (or /quit, or the end of input) ends it.  Ctrl-C during a reply stops the\n"
    "  reply and keeps the conversation; Ctrl-C at an empty prompt ends the chat.  On a\n"
    "  terminal: a loading line while the models load, and each reply's tokens, rate,\n"
    "  acceptance (with -d) and finish reason on stderr; with libedit, line editing and\n"
    "  the session's history (up arrow)\n"
    "\n"
    "tandem tokenize -m MODEL [--no-bos] [--text TEXT]\n"
    "  reads stdin (at most " TOTAL_MIB " MiB) when --text is not given; prints the ids as a JSON array;\n"
    "  adds BOS / EOS where the vocabulary asks (add_bos_token / add_eos_token) unless --no-bos;\n"
    "  needs only the file's metadata (a vocabulary-only GGUF, any tensor types)\n"
    "\n"
    "tandem info MODEL\n"
    "  the header, metadata and tensors; marks the tensors of types tandem does not support\n"
    "\n"
    "tandem bench -m MODEL [-d DRAFT] [--prompts FILE [--limit L]] [-p PROMPT_TOKENS]\n"
    "             [-n N] [--threads N] [--backend B] [--gpu-mem SIZE] [--kv-type T] [--tensor-parallel N]\n"
    "             [--spec-k N|auto] [--spec-k-max N] [--spec-ngram N] [--spec-tree T] [--reps R]\n"
    "             [--spec-oracle A]\n"
    "             [--prefix-cache] [--json]\n"
    "  -p N                  synthetic prompt length in tokens, 1..2^20 (default 128)\n"
    "  -n N                  new tokens per run, 1..2^20 (default 128)\n"
    "      --prompts FILE    run the prompts of a JSON-lines file instead (greedy)\n"
    "      --limit L         use at most L prompts of the file (needs --prompts)\n"
    "      --reps R          repetitions; the median is reported (default 5, 1 with --prompts)\n"
    "      --spec-oracle A   BENCHMARK MODE (never a default): controlled acceptance at real\n"
    "                        cost; the draft runs its real forward but the target's own next\n"
    "                        token (from a target-only run, also timed: the speed-up's base)\n"
    "                        is its first candidate with probability A, else its second with\n"
    "                        probability 1/2, else absent; 0 <= A <= 1 (needs -d)\n"
    "      --prefix-cache    share cached prompt blocks between runs (off: every prefill\n"
    "                        computed) and report the hit rate\n"
    "      --json            print one JSON object\n"
    "\n"
    "tandem run JOB.ini [--set SECTION.KEY=VALUE]... [--shard I/N] [--spec-tree T]\n"
    "  [model] target, draft; [engine] backend, threads, max_batch, max_batch_tokens,\n"
    "  block_size, kv_mem_mb, gpu_mem_mb, kv_type (auto|f32|f16|q8_0), prefix_cache,\n"
    "  batch_invariant (true|false), tensor_parallel (1..8, as --tensor-parallel);\n"
    "  [spec] k, k_max, ngram, p_min, tree (as --spec-tree; --spec-tree T is --set spec.tree=T); [sampling] temperature, top_k, top_p, min_p,\n"
    "  seed, max_tokens, stop (JSON: \"STR\" or [\"STR\", ...]); [job] input, output\n"
    "  (JSON lines; the input's ids unique; the output a regular file, locked for the run,\n"
    "  whole lines, each written as its request completes: in completion order, not the\n"
    "  input's (merge --sort restores it); a rerun skips the ids already in output),\n"
    "  priority, timeout_s (the\n"
    "  requests' defaults), chat_template (a built-in or the model's named template, for\n"
    "  inputs with \"messages\").  Paths are relative to the file; --shard takes the ids\n"
    "  that hash to shard I of N\n"
    "\n"
    "tandem serve (-m MODEL [-d DRAFT] | CONFIG.ini [--set SECTION.KEY=VALUE]...) [options]\n"
    "  an OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions\n"
    "  (streaming with \"stream\": true), GET /v1/models, /health, /metrics\n"
    "      --host H          address to bind (default 127.0.0.1)\n"
    "      --port P          port (default 8080; 0 = any free one, printed)\n"
    "      --api-key KEY     require \"Authorization: Bearer KEY\" on /v1/ (not empty)\n"
    "      --max-queue N     waiting requests beyond which 429 (default 64; 0 = no limit)\n"
    "      --max-body-kb N   request body limit (default 1024)\n"
    "      --request-timeout S  every request ends after S seconds (default 0 = none)\n"
    "      --shutdown-grace S   SIGTERM lets requests finish for S seconds (default 10)\n"
    "      --model-name ID   the model's id for clients (default: the file name)\n"
    "      --chat-template T a built-in name, the model's named template or a .jinja file\n"
    "      --max-batch N     sequences decoding at once (default 8)\n"
    "      -n, --max-tokens N  a request's max_tokens when it gives none (default 128)\n"
    "      --max-connections N  connections at once (default 512; the slowest readers,\n"
    "                        then the longest idle, give way to new ones)\n"
    "      --max-connections-per-ip N  the same per client address (default 128; 0 = none)\n"
    "      --read-timeout S  a request's headers and body arrive within S s (default 30)\n"
    "      --idle-timeout S  a kept-alive connection waits S s for a request (default 75)\n"
    "      --log-file PATH   append the log to PATH (time-stamped) instead of stderr\n"
    "      --backend, -t, --kv-type, --spec-k, --spec-tree, --tensor-parallel  as for generate\n"
    "  CONFIG.ini: the sections of run, with [server] (host, port, api_key, max_queue,\n"
    "  max_body_kb, request_timeout_s, shutdown_grace_s, model_name, chat_template,\n"
    "  max_connections, max_connections_per_ip, read_timeout_s, idle_timeout_s, log_file)\n"
    "  in place of [job]; flags override it.  SIGTERM: drain, then exit 0\n"
    "\n"
    "tandem merge OUT.jsonl IN.jsonl... [--input JOB_INPUT.jsonl [--sort]] [--force]\n"
    "  joins shard outputs into OUT (written whole or not at all); every id exactly once,\n"
    "  no malformed or truncated line; --input: every id of the job's input present;\n"
    "  --sort: the lines in the input's order; --force: replace an existing OUT\n"
    "\n"
    "tandem synth --shape SHAPE --type TYPE [--tokenizer-from MODEL] [--seed S] [--force]\n"
    "             [--dry-run] OUT.gguf\n"
    "      --shape SHAPE     llama2-7b, llama3-8b, llama2-13b, tinyllama-1.1b, llama-160m,\n"
    "                        llama3.2-1b (tied, rope_freqs), qwen3-0.6b or gemma3-1b\n"
    "      --type TYPE       every matrix f16, q8_0, q4_0, q4_k, q5_k or q6_k, or the mixes\n"
    "                        q4_k_m, q5_k_m (tandem quantize's rules; norms f32)\n"
    "      --tokenizer-from MODEL  copy the tokenizer of a GGUF with the shape's vocabulary\n"
    "                        size (default: a synthetic SentencePiece vocabulary)\n"
    "      --seed S          random seed (default 0)\n"
    "      --force           replace OUT.gguf if it exists\n"
    "      --dry-run         print the tensor count and file size, write nothing\n"
    "\n"
    "tandem quantize IN.gguf OUT.gguf --type TYPE [--force]\n"
    "      --type TYPE       f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k\n"
    "                        (every matrix; the output head q6_k), or the mixes q3_k_m,\n"
    "                        q4_k_m, q5_k_m (some attn_v / ffn_down layers q6_k, as\n"
    "                        llama.cpp's); norms stay f32; rows that are not whole\n"
    "                        blocks fall back (q4_k -> q5_0, q6_k -> q8_0, ...)\n"
    "      --force           replace OUT.gguf if it exists\n"
    "\n"
    "tandem --version | --help\n";

void cli_usage(FILE *f) { fputs(usage_text, f); }

int cli_usage_error(const char *fmt, ...) {
    fputs("error: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs("\n\n", stderr);
    cli_usage(stderr);
    return CLI_EXIT_USAGE;
}

int cli_error(const char *fmt, ...) {
    fputs("error: ", stderr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CLI_EXIT_ERROR;
}

int cli_status_error(tandem_status st, const char *what) {
    const char *msg = tandem_last_error();
    if (!msg || !*msg) msg = tandem_status_str(st);
    if (!msg) msg = "unknown error";
    if (what)
        return cli_error("%s: %s", what, msg);
    return cli_error("%s", msg);
}

bool cli_take(int argc, char **argv, int *i, const char *short_name, const char *long_name,
              const char **val, bool *missing) {
    const char *a = argv[*i];
    const char *name = NULL;
    if (short_name && strcmp(a, short_name) == 0) name = short_name;
    if (long_name && strcmp(a, long_name) == 0) name = long_name;
    if (name) {
        if (*i + 1 >= argc) {
            cli_usage_error("option %s needs a value", name);
            *val = NULL;
            *missing = true;
            return true;
        }
        *i += 1;
        *val = argv[*i];
        return true;
    }
    if (long_name) {
        size_t n = strlen(long_name);
        if (strncmp(a, long_name, n) == 0 && a[n] == '=') {
            *val = a + n + 1;
            return true;
        }
    }
    return false;
}

int cli_unknown_arg(const char *arg) {
    if (arg[0] == '-' && arg[1] != '\0') return cli_usage_error("unknown option '%s'", arg);
    return cli_usage_error("unexpected argument '%s'", arg);
}

/* The length of the option name in "--name" or "--name=value". */
static int opt_len(const char *opt) { return (int)strcspn(opt, "="); }

bool cli_opt_flag(const char *arg, const char *short_name, const char *long_name) {
    return (short_name && strcmp(arg, short_name) == 0) ||
           (long_name && strcmp(arg, long_name) == 0);
}

bool cli_is_help(const char *arg) { return cli_opt_flag(arg, "-h", "--help"); }

bool cli_parse_int(const char *opt, const char *s, long lo, long hi, int *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    /* strtol skips leading blanks: demand a sign or a digit first. */
    if (!(isdigit((unsigned char)*s) || *s == '-' || *s == '+') || end == s || *end != '\0' ||
        errno == ERANGE) {
        cli_usage_error("option %.*s: '%s' is not an integer", opt_len(opt), opt, s);
        return false;
    }
    if (v < lo || v > hi || v < INT_MIN || v > INT_MAX) {
        cli_usage_error("option %.*s: %ld is out of range [%ld, %ld]", opt_len(opt), opt, v, lo, hi);
        return false;
    }
    *out = (int)v;
    return true;
}

bool cli_parse_u64(const char *opt, const char *s, uint64_t *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    if (*s < '0' || *s > '9') { /* rejects '-', '+', spaces and "" */
        cli_usage_error("option %.*s: '%s' is not a non-negative integer", opt_len(opt), opt, s);
        return false;
    }
    unsigned long long v = strtoull(s, &end, 10);
    if (*end != '\0' || errno == ERANGE) {
        cli_usage_error("option %.*s: '%s' is not a non-negative 64-bit integer", opt_len(opt), opt, s);
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

bool cli_parse_size(const char *opt, const char *s, size_t *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    unsigned long long v = *s >= '0' && *s <= '9' ? strtoull(s, &end, 10) : 0;
    int shift = -1;
    if (end && end != s && errno != ERANGE) {
        if (*end == '\0') shift = 0;
        else if (end[1] == '\0' || ((end[1] == 'B' || end[1] == 'b') && end[2] == '\0') ||
                 (end[1] == 'i' && end[2] == 'B' && end[3] == '\0'))
            shift = *end == 'K' || *end == 'k' ? 10 : *end == 'M' || *end == 'm' ? 20 : *end == 'G' || *end == 'g' ? 30
                  : *end == 'T' || *end == 't' ? 40 : -1;
    }
    if (shift < 0 || (shift > 0 && v > (SIZE_MAX >> shift)) || (v << shift) < (1ull << 20)) {
        cli_usage_error("option %.*s: '%s' is not a size of at least 1M (digits with an optional K, M, G or T suffix)",
                        opt_len(opt), opt, s);
        return false;
    }
    *out = (size_t)(v << shift);
    return true;
}

/* A float in [lo, hi], or (lo, hi] when lo_open; the range applies to the value as a
 * float, which is what the library receives (1e-50 is 0 there, 1e39 infinite). */
static bool parse_float_range(const char *opt, const char *s, double lo, bool lo_open, double hi, float *out) {
    if (!s) return false;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (!(isdigit((unsigned char)*s) || *s == '-' || *s == '+' || *s == '.') || end == s ||
        *end != '\0' || !isfinite(v)) { /* (an underflow is a number: the range decides) */
        cli_usage_error("option %.*s: '%s' is not a number", opt_len(opt), opt, s);
        return false;
    }
    double f = fabs(v) > FLT_MAX ? v * INFINITY : (double)(float)v; /* (float)v would be undefined */
    if (!(lo_open ? f > lo : f >= lo) || !(f <= hi)) {
        cli_usage_error("option %.*s: %s is out of range %c%g, %g]", opt_len(opt), opt, s, lo_open ? '(' : '[',
                        lo, hi);
        return false;
    }
    *out = (float)v;
    return true;
}

bool cli_parse_float(const char *opt, const char *s, double lo, double hi, float *out) {
    return parse_float_range(opt, s, lo, false, hi, out);
}

bool cli_parse_float_gt(const char *opt, const char *s, double lo, double hi, float *out) {
    return parse_float_range(opt, s, lo, true, hi, out);
}

bool cli_is_spec_opt(const char *arg) {
    static const char *const names[] = {"--spec-k", "--spec-k-max", "--p-min", "--spec-ngram", "--spec-tree",
                                        "--spec-oracle"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if ((int)strlen(names[i]) == opt_len(arg) && strncmp(arg, names[i], strlen(names[i])) == 0) return true;
    return false;
}

int cli_needs(const char *opt, const char *needed) {
    return cli_usage_error("option %.*s has no effect without %s", opt_len(opt), opt, needed);
}

bool cli_parse_tensor_parallel(const char *opt, const char *s, int *out) { return cli_parse_int(opt, s, 1, 8, out); }

bool cli_parse_backend(const char *opt, const char *s, tandem_backend_kind *out) {
    if (!s) return false;
    if (strcmp(s, "cpu") == 0) {
        *out = TANDEM_BACKEND_CPU;
        return true;
    }
    if (strcmp(s, "cuda") == 0) {
        *out = TANDEM_BACKEND_CUDA;
        return true;
    }
    cli_usage_error("option %.*s: unknown backend '%s' (expected cpu or cuda)", opt_len(opt), opt, s);
    return false;
}

bool cli_parse_kv_type(const char *opt, const char *s, tandem_kv_type *out) {
    if (!s) return false;
    if (cli_kv_type_from_str(s, out)) return true;
    cli_usage_error("option %.*s: unknown KV cache type '%s' (expected " CLI_KV_TYPES ")", opt_len(opt), opt, s);
    return false;
}

bool cli_parse_spec_k(const char *opt, const char *s, int *out) {
    if (!s) return false;
    if (strcmp(s, "auto") == 0) {
        *out = 0;
        return true;
    }
    return cli_parse_int(opt, s, 1, TANDEM_SPEC_K_MAX, out);
}

bool cli_parse_spec_ngram(const char *opt, const char *s, int *out) {
    if (!s) return false;
    if (strcmp(s, "off") == 0) {
        *out = 0;
        return true;
    }
    if (!cli_parse_int(opt, s, 0, TANDEM_SPEC_NGRAM_MAX, out)) return false;
    if (*out > 0 && *out < TANDEM_SPEC_NGRAM_MIN) {
        cli_usage_error("option %.*s: n-gram length %d is not allowed (0 = off, or %d..%d)", opt_len(opt), opt,
                        *out, TANDEM_SPEC_NGRAM_MIN, TANDEM_SPEC_NGRAM_MAX);
        return false;
    }
    return true;
}

bool cli_parse_spec_tree(const char *opt, const char *s, int *tree, const char **shape) {
    if (!s) return false;
    char msg[300];
    if (tdm_arg_spec_tree_from_str(s, tree, shape, msg, sizeof msg)) return true;
    cli_usage_error("option %.*s: %s", opt_len(opt), opt, msg);
    return false;
}

void cli_json_num(FILE *f, double x, int decimals) {
    if (!isfinite(x)) x = 0;
    fprintf(f, "%.*f", decimals, x);
}

double cli_tok_per_s(double n, double ms) { return n > 0 && ms > 0 ? n * 1000.0 / ms : 0.0; }

const char *cli_rate_str(double n, double ms, char buf[32]) {
    double r = cli_tok_per_s(n, ms);
    if (r <= 0) return "n/a";
    snprintf(buf, 32, "%.0f tok/s", r);
    return buf;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs("error: missing command\n\n", stderr);
        cli_usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "help") == 0 || cli_is_help(cmd)) {
        cli_usage(stdout);
        return CLI_EXIT_OK;
    }
    if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0 || strcmp(cmd, "version") == 0) {
        printf("tandem %s\n", TANDEM_VERSION);
        return CLI_EXIT_OK;
    }
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    if (strcmp(cmd, "generate") == 0) return cli_generate(sub_argc, sub_argv);
    if (strcmp(cmd, "tokenize") == 0) return cli_tokenize(sub_argc, sub_argv);
    if (strcmp(cmd, "info") == 0) return cli_info(sub_argc, sub_argv);
    if (strcmp(cmd, "bench") == 0) return cli_bench(sub_argc, sub_argv);
    if (strcmp(cmd, "synth") == 0) return cli_synth(sub_argc, sub_argv);
    if (strcmp(cmd, "run") == 0) return cli_run(sub_argc, sub_argv);
    if (strcmp(cmd, "merge") == 0) return cli_merge(sub_argc, sub_argv);
    if (strcmp(cmd, "chat") == 0) return cli_chat(sub_argc, sub_argv);
    if (strcmp(cmd, "quantize") == 0) return cli_quantize(sub_argc, sub_argv);
    if (strcmp(cmd, "serve") == 0) return cli_serve(sub_argc, sub_argv);
    return cli_usage_error("unknown command '%s'", cmd);
}

void cli_json_spec(FILE *f, const tandem_spec_stats *s) {
    double rate = s->drafted ? (double)s->accepted / (double)s->drafted : 0.0;
    double mean = s->steps ? (double)s->accepted / (double)s->steps : 0.0;
    fprintf(f, "\"spec\": {\"steps\": %llu, \"drafted\": %llu, \"accepted\": %llu, \"acceptance_rate\": ",
            (unsigned long long)s->steps, (unsigned long long)s->drafted, (unsigned long long)s->accepted);
    cli_json_num(f, rate, 4);
    fputs(", \"mean_accepted\": ", f);
    cli_json_num(f, mean, 4);
    fprintf(f, ", \"k_final\": %d, \"accept_hist\": [", s->k_final);
    int last = 0;
    for (int i = 0; i < TANDEM_SPEC_HIST_MAX; i++)
        if (s->accept_hist[i]) last = i;
    for (int i = 0; i <= last; i++) fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)s->accept_hist[i]);
    fprintf(f, "], \"ngram_steps\": %llu, \"ngram_drafted\": %llu, \"ngram_accepted\": %llu",
            (unsigned long long)s->ngram_steps, (unsigned long long)s->ngram_drafted,
            (unsigned long long)s->ngram_accepted);
    fprintf(f, ", \"tree_steps\": %llu, \"tree_nodes\": %llu, \"forwards\": %llu, \"tokens_per_forward\": ",
            (unsigned long long)s->tree_steps, (unsigned long long)s->tree_nodes, (unsigned long long)s->forwards);
    cli_json_num(f, s->forwards ? (double)s->forward_tokens / (double)s->forwards : 0.0, 4);
    fputs(", \"draft_ms\": ", f);
    cli_json_num(f, s->draft_ms, 3);
    fputs(", \"verify_ms\": ", f);
    cli_json_num(f, s->verify_ms, 3);
    fputs(", \"other_ms\": ", f);
    cli_json_num(f, s->other_ms, 3);
    fputc('}', f);
}

void cli_spec_add(tandem_spec_stats *a, const tandem_spec_stats *b) {
    a->steps += b->steps;
    a->drafted += b->drafted;
    a->accepted += b->accepted;
    a->k_final = b->k_final;
    for (int i = 0; i < TANDEM_SPEC_HIST_MAX; i++) a->accept_hist[i] += b->accept_hist[i];
    a->draft_ms += b->draft_ms;
    a->verify_ms += b->verify_ms;
    a->other_ms += b->other_ms;
    a->ngram_steps += b->ngram_steps;
    a->ngram_drafted += b->ngram_drafted;
    a->ngram_accepted += b->ngram_accepted;
    a->forwards += b->forwards;
    a->forward_tokens += b->forward_tokens;
    a->tree_steps += b->tree_steps;
    a->tree_nodes += b->tree_nodes;
}

/* One result as tandem generate --json writes it (a line, flushed). */
void cli_json_result(FILE *f, const cli_prompt *p, const tandem_result *r, bool has_draft) {
    fputs("{\"id\": ", f);
    cli_prompt_write_id(f, p, true);
    fputs(", \"text\": ", f);
    tdm_json_write_str(f, r->text ? r->text : "", r->text ? strlen(r->text) : 0);
    fputs(", \"tokens\": [", f);
    for (size_t i = 0; i < r->n_tokens; i++) fprintf(f, i ? ", %d" : "%d", (int)r->tokens[i]);
    fputs("], \"finish_reason\": ", f);
    const char *fr = tandem_finish_reason_str(r->finish_reason);
    tdm_json_write_str(f, fr ? fr : "none", fr ? strlen(fr) : 4);
    fprintf(f, ", \"prompt_tokens\": %zu, \"cached_tokens\": %zu, \"preemptions\": %d, \"queue_ms\": ",
            r->n_prompt_tokens, r->n_cached_tokens, r->n_preemptions);
    cli_json_num(f, r->queue_ms, 3);
    fputs(", \"timings\": {\"prefill_ms\": ", f);
    cli_json_num(f, r->prefill_ms, 3);
    fputs(", \"decode_ms\": ", f);
    cli_json_num(f, r->decode_ms, 3);
    fputs(", \"decode_tok_per_s\": ", f); /* 0 with no decoded token */
    cli_json_num(f, cli_tok_per_s(r->n_tokens > 0 ? (double)(r->n_tokens - 1) : 0.0, r->decode_ms), 2);
    fputc('}', f);
    if (has_draft) {
        fputs(", ", f);
        cli_json_spec(f, &r->spec);
    }
    fputs("}\n", f);
    fflush(f);
}

