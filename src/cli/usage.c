/* usage.c - the help of the `tandem` program: the command list, one help text per
 * command, and what a usage error prints (the error, then one line pointing to the
 * command's --help, not the whole help, which would scroll the error away).  A
 * mistyped command or option gets a suggestion: the command names, and the options
 * that the command's help text mentions (the help is the one list of options, so a
 * suggestion is never an option that the help does not document). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "input.h"

#define STR_(x) #x
#define STR(x) STR_(x) /* a number macro as text, for the usage text */
#define LINE_MIB STR(TDM_INPUT_LINE_MIB)
#define TOTAL_MIB STR(TDM_INPUT_TOTAL_MIB)
#define SPEC_K_MAX STR(TANDEM_SPEC_K_MAX)

static const char help_generate[] =
    "usage: tandem generate -m MODEL [-d DRAFT] (-p TEXT | --prompts FILE.jsonl | --messages FILE.json) [options]\n"
    "  -m, --model FILE      target model (GGUF)\n"
    "  -d, --draft FILE      draft model for speculative decoding, or an EAGLE-3 draft head\n"
    "                        (architecture eagle3: chains and trees from the target's features)\n"
    "  -p, --prompt TEXT     prompt text (id 0)\n"
    "      --prompts FILE    JSON lines: {\"id\", \"prompt\" or \"messages\"[, \"seed\", \"max_tokens\",\n"
    "                        \"temperature\", \"priority\", \"timeout_s\", \"stop\": STRING or [STRING, ...],\n"
    "                        \"grammar\": GBNF, \"json_schema\": SCHEMA, \"presence_penalty\",\n"
    "                        \"frequency_penalty\", \"repetition_penalty\", \"min_tokens\",\n"
    "                        \"logit_bias\": {\"ID\": B}, \"logprobs\": N]};\n"
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
    "      --presence-penalty X  subtracted from the logit of every token the output holds,\n"
    "                        -2 <= X <= 2 (OpenAI's; default 0)\n"
    "      --frequency-penalty X  times a token's count in the output, subtracted, -2 <= X <= 2\n"
    "                        (OpenAI's; default 0)\n"
    "      --repetition-penalty X  a token of the prompt or the output: its logit divided by X\n"
    "                        when positive, multiplied when negative, 0 < X <= 100 (vLLM's;\n"
    "                        default 1 = off)\n"
    "      --min-tokens N    no end of generation and no stop string before N tokens (default 0)\n"
    "      --logit-bias ID=B[,ID=B]...  B added to token ID's logit, -100 <= B <= 100\n"
    "                        (with -d the penalties and biases stay lossless: the edited\n"
    "                        distribution is the target)\n"
    "      --logprobs N      each token's log-probability and the N likeliest alternatives\n"
    "                        (0..20): --json lines' \"logprobs\", else a line per token on stderr\n"
    "      --grammar FILE    constrain the output to a GBNF grammar (llama.cpp's syntax, a root\n"
    "                        rule); with -d the drafts and every verified token too (lossless)\n"
    "      --json-schema FILE  constrain the output to a JSON schema ({\"type\": \"object\"}: any\n"
    "                        JSON object); at most one of the two; a prompt line's \"grammar\"\n"
    "                        (text) or \"json_schema\" (object) replaces it for that line\n"
    "  -t, --threads N       CPU threads, 0.." STR(TANDEM_THREADS_MAX) ", 0 = all cores (default 0)\n"
    "      --backend B       cpu or cuda (default cpu)\n"
    "      --tensor-parallel N  split the target across N GPUs (cuda: devices 0..N-1, NCCL;\n"
    "                        heads, KV heads and FFN features must divide by N; the draft\n"
    "                        runs whole on the first), 1..8 (default 1)\n"
    "      --batch N         decode N prompts at once (continuous batching), 1.." STR(CLI_BATCH_MAX) " (default 1);\n"
    "                        results print in input order; a failed prompt does not stop the others\n"
    "      --gpu-mem SIZE    device memory budget (e.g. 24G): weights, buffers, and the KV cache\n"
    "                        in what is left (cuda only; default: a cache for one full context)\n"
    "      --weights W       native (as the files store them) or fp8: both models' block\n"
    "                        matrices of F16 / BF16 / F32 / Q8_0 quantised at load to FP8\n"
    "                        E4M3 with a scale per output row (FP8 tensor cores on cuda;\n"
    "                        the CPU computes them too, slowly) (default native)\n"
    "      --kv-type T       KV cache type of both models: auto (f16 on the CPU and cuda),\n"
    "                        f32, f16, q8_0 (int8 with a scale per position and head:\n"
    "                        about half of f16), or fp8 (FP8 E4M3 with the same scales:\n"
    "                        the bytes of q8_0) (default auto)\n"
    "      --ctx N           context: tokens per sequence, prompt and reply, 1..2^24 (default\n"
    "                        4096, or the model's training context if smaller); a longer prompt\n"
    "                        is an error, a reply reaching it ends with finish reason length\n"
    "      --kv-mem SIZE     KV cache budget (e.g. 512M), the most its memory grows to (default:\n"
    "                        --ctx tokens for each of --batch sequences); on the CPU it is taken\n"
    "                        as tokens arrive\n"
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
    "      --draft-vocab N   the draft's logits over token ids [0, N) and the special tokens\n"
    "                        only (its output head computes N rows; the output is unchanged),\n"
    "                        N >= " STR(TANDEM_DRAFT_VOCAB_MIN) ", 0 = the whole vocabulary, auto = " STR(TANDEM_DRAFT_VOCAB_AUTO_N) " for a\n"
    "                        vocabulary above " STR(TANDEM_DRAFT_VOCAB_AUTO_ABOVE) " tokens, else the whole (default auto)\n";

static const char help_chat[] =
    "usage: tandem chat -m MODEL [-d DRAFT] [--chat-template T] [--system TEXT] [generate's sampling,\n"
    "            speculation and engine options]\n"
    "  each line of stdin is a user message, answered as it arrives (a terminal or a\n"
    "  pipe); the reply streams to stdout and the conversation is kept.  A line ending\n"
    "  in \\ goes on in the next line (the message is the lines joined by newlines).\n"
    "  Commands: /help lists them, /reset forgets the conversation (not --system),\n"
    "  /exit (or /quit, or the end of input) ends it.  Ctrl-C during a reply stops the\n"
    "  reply and keeps the conversation; Ctrl-C at an empty prompt ends the chat.  On a\n"
    "  terminal: a loading line while the models load, and each reply's tokens, rate,\n"
    "  acceptance (with -d) and finish reason on stderr; with libedit, line editing and\n"
    "  the session's history (up arrow)\n";

static const char help_tokenize[] =
    "usage: tandem tokenize -m MODEL [--no-bos] [--text TEXT]\n"
    "  reads stdin (at most " TOTAL_MIB " MiB) when --text is not given; prints the ids as a JSON array;\n"
    "  adds BOS / EOS where the vocabulary asks (add_bos_token / add_eos_token) unless --no-bos;\n"
    "  needs only the file's metadata (a vocabulary-only GGUF, any tensor types)\n";

static const char help_info[] =
    "usage: tandem info MODEL [-d DRAFT] [--ctx N]\n"
    "  the header, metadata and tensors; marks the tensors of types tandem does not support;\n"
    "  then the memory an engine takes on the CPU: the weights, the KV cache per token and at\n"
    "  the context (--ctx N, default as for generate), the working buffers, with -d for the pair\n";

static const char help_bench[] =
    "usage: tandem bench -m MODEL [-d DRAFT] [--prompts FILE [--limit L]] [-p PROMPT_TOKENS]\n"
    "             [-n N] [--threads N] [--backend B] [--gpu-mem SIZE] [--kv-type T] [--ctx N] [--kv-mem SIZE]\n"
    "             [--tensor-parallel N] [--weights W]\n"
    "             [--spec-k N|auto] [--spec-k-max N] [--spec-ngram N] [--spec-tree T] [--reps R]\n"
    "             [--spec-oracle A] [--draft-vocab N]\n"
    "             [--prefix-cache] [--json]\n"
    "  -p N                  synthetic prompt length in tokens, 1..2^20 (default 128)\n"
    "  -n N                  new tokens per run, 1..2^20 (default 128)\n"
    "      --prompts FILE    run the prompts of a JSON-lines file instead (greedy)\n"
    "      --limit L         use at most L prompts of the file (needs --prompts)\n"
    "      --ctx N, --kv-mem SIZE  as for generate (-p and -n must fit the context)\n"
    "      --reps R          repetitions; the median is reported (default 5, 1 with --prompts)\n"
    "      --spec-oracle A   BENCHMARK MODE (never a default): controlled acceptance at real\n"
    "                        cost; the draft runs its real forward but the target's own next\n"
    "                        token (from a target-only run, also timed: the speed-up's base)\n"
    "                        is its first candidate with probability A, else its second with\n"
    "                        probability 1/2, else absent; 0 <= A <= 1 (needs -d)\n"
    "      --prefix-cache    share cached prompt blocks between runs (off: every prefill\n"
    "                        computed) and report the hit rate\n"
    "      --json            print one JSON object\n";

static const char help_run[] =
    "usage: tandem run JOB.ini [--set SECTION.KEY=VALUE]... [--shard I/N] [--spec-tree T]\n"
    "  [model] target, draft; [engine] backend, threads, max_batch, max_batch_tokens,\n"
    "  block_size, ctx (as --ctx), kv_mem_mb, gpu_mem_mb, kv_type (auto|f32|f16|q8_0|fp8), weights\n"
    "  (native|fp8, as --weights), prefix_cache,\n"
    "  batch_invariant (true|false), tensor_parallel (1..8, as --tensor-parallel), draft_vocab\n"
    "  (auto|0|N, as --draft-vocab);\n"
    "  [spec] k, k_max, ngram, p_min, tree (as --spec-tree; --spec-tree T is --set spec.tree=T); [sampling] temperature, top_k, top_p, min_p,\n"
    "  seed, max_tokens, stop (JSON: \"STR\" or [\"STR\", ...]); [job] input, output\n"
    "  (an input line's \"grammar\" (GBNF text) or \"json_schema\" (a schema) constrains it;\n"
    "  its \"presence_penalty\", \"frequency_penalty\", \"repetition_penalty\", \"min_tokens\",\n"
    "  \"logit_bias\" and \"logprobs\" as generate's options, its output line's \"logprobs\")\n"
    "  (JSON lines; the input's ids unique; the output a regular file, locked for the run,\n"
    "  whole lines, each written as its request completes: in completion order, not the\n"
    "  input's (merge --sort restores it); a rerun skips the ids already in output),\n"
    "  priority, timeout_s (the\n"
    "  requests' defaults), chat_template (a built-in or the model's named template, for\n"
    "  inputs with \"messages\").  Paths are relative to the file; --shard takes the ids\n"
    "  that hash to shard I of N\n";

static const char help_serve[] =
    "usage: tandem serve (-m MODEL [-d DRAFT] | CONFIG.ini [--set SECTION.KEY=VALUE]...) [options]\n"
    "  an OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions\n"
    "  (streaming with \"stream\": true), GET /v1/models[/ID], /health, /metrics,\n"
    "  POST /tokenize, /detokenize\n"
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
    "      --log-format F    text (default) or json: one JSON object a line, with its time\n"
    "                        (a served request: client, method, path, status, tokens, seconds)\n"
    "      --cors-origin O   let browsers of origin O call the API (CORS headers, OPTIONS\n"
    "                        preflights): \"*\", or http(s)://host[:port],... (default off)\n"
    "      --backend, -t, --kv-type, --ctx, --kv-mem, --spec-k, --spec-tree, --tensor-parallel,\n"
    "      --draft-vocab, --weights\n"
    "                        as for generate (--kv-mem: default --ctx tokens of --max-batch sequences)\n"
    "  CONFIG.ini: the sections of run, with [server] (host, port, api_key, max_queue,\n"
    "  max_body_kb, request_timeout_s, shutdown_grace_s, model_name, chat_template,\n"
    "  max_connections, max_connections_per_ip, read_timeout_s, idle_timeout_s, log_file,\n"
    "  log_format, cors_origin)\n"
    "  in place of [job]; flags override it.  SIGTERM: drain, then exit 0\n";

static const char help_merge[] =
    "usage: tandem merge OUT.jsonl IN.jsonl... [--input JOB_INPUT.jsonl [--sort]] [--force]\n"
    "  joins shard outputs into OUT (written whole or not at all); every id exactly once,\n"
    "  no malformed or truncated line; --input: every id of the job's input present;\n"
    "  --sort: the lines in the input's order; --force: replace an existing OUT\n";

static const char help_synth[] =
    "usage: tandem synth --shape SHAPE --type TYPE [--tokenizer-from MODEL] [--seed S] [--force]\n"
    "             [--dry-run] OUT.gguf\n"
    "      --shape SHAPE     llama2-7b, llama3-8b, llama2-13b, tinyllama-1.1b, llama-160m,\n"
    "                        llama3.2-1b (tied, rope_freqs), qwen3-0.6b, gemma3-1b, or the\n"
    "                        mixtures of experts qwen3-30b-a3b and mixtral-8x7b, or the\n"
    "                        EAGLE-3 draft heads eagle3-llama3-8b, eagle3-llama2-7b and\n"
    "                        eagle3-pycode (llama.cpp's eagle3 layout)\n"
    "      --type TYPE       every matrix f16, q8_0, q4_0, q4_k, q5_k or q6_k, or the mixes\n"
    "                        q4_k_m, q5_k_m (tandem quantize's rules; norms f32)\n"
    "      --tokenizer-from MODEL  copy the tokenizer of a GGUF with the shape's vocabulary\n"
    "                        size (default: a synthetic SentencePiece vocabulary)\n"
    "      --seed S          random seed (default 0)\n"
    "      --force           replace OUT.gguf if it exists\n"
    "      --dry-run         print the tensor count and file size, write nothing\n";

static const char help_quantize[] =
    "usage: tandem quantize IN.gguf OUT.gguf --type TYPE [--force]\n"
    "      --type TYPE       f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k\n"
    "                        (every matrix; the output head q6_k), or the mixes q3_k_m,\n"
    "                        q4_k_m, q5_k_m (some attn_v / ffn_down layers q6_k, as\n"
    "                        llama.cpp's); norms stay f32; rows that are not whole\n"
    "                        blocks fall back (q4_k -> q5_0, q6_k -> q8_0, ...)\n"
    "      --force           replace OUT.gguf if it exists\n";

typedef struct command_help {
    const char *name;
    const char *summary; /* the command list's line */
    const char *text;    /* tandem NAME --help */
    const char *also;    /* a command whose options this one takes too (chat: generate's), or NULL */
} command_help;

static const command_help commands[] = {
    {"generate", "generate completions (optionally with speculative decoding)", help_generate, NULL},
    {"chat", "talk with a model on the terminal (its chat template, streamed replies)", help_chat, "generate"},
    {"tokenize", "print the token ids of a text", help_tokenize, NULL},
    {"info", "describe a GGUF file (metadata and tensors)", help_info, NULL},
    {"bench", "measure prefill and decode speed", help_bench, NULL},
    {"synth", "write a random-weight model with the shapes of a real one", help_synth, NULL},
    {"run", "run a batch job described by an INI file (configs/*.ini)", help_run, NULL},
    {"merge", "join the outputs of a job's shards, checking every id once", help_merge, NULL},
    {"quantize", "convert a model's matrices to a quantised type (q4_k_m, q8_0, ...)", help_quantize, NULL},
    {"serve", "an OpenAI-compatible HTTP server (completions, chat, streaming, metrics)", help_serve, NULL},
};
#define N_COMMANDS (sizeof commands / sizeof *commands)

static const command_help *current; /* the command being run; NULL before one is known */

static const command_help *find_command(const char *name) {
    for (size_t i = 0; name && i < N_COMMANDS; i++)
        if (strcmp(commands[i].name, name) == 0) return &commands[i];
    return NULL;
}

bool cli_set_command(const char *name) {
    current = find_command(name);
    return current != NULL;
}

static void print_overview(FILE *f) {
    fputs("usage: tandem <command> [options]\n\ncommands:\n", f);
    for (size_t i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fputs("  help       this list; tandem help COMMAND: that command's options\n"
          "\n"
          "tandem COMMAND --help   a command's options\n"
          "tandem --version        the version and the backends of this build\n",
          f);
}

static void print_command(FILE *f, const command_help *c) {
    fputs(c->text, f);
    const command_help *also = find_command(c->also);
    if (also) {
        fprintf(f, "\n%s's options, which %s takes too:\n", also->name, c->name);
        fputs(strchr(also->text, '\n') + 1, f); /* without its usage line */
    }
}

void cli_usage(FILE *f) {
    if (current) print_command(f, current);
    else print_overview(f);
}

bool cli_help_command(FILE *f, const char *name) {
    const command_help *c = find_command(name);
    if (c) print_command(f, c);
    return c != NULL;
}

static void usage_pointer(void) {
    if (current) fprintf(stderr, "see 'tandem %s --help' for %s's options\n", current->name, current->name);
    else fputs("see 'tandem --help' for the commands\n", stderr);
}

int cli_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    cli_verror(fmt, ap);
    va_end(ap);
    usage_pointer();
    return CLI_EXIT_USAGE;
}

/* ------------------------------------------------------------ suggestions */

/* The edit distance (insertions, deletions, substitutions) of a[0..na) and b[0..nb),
 * or a number above cap once it must exceed cap (names are short: cap keeps it so). */
static size_t edit_distance(const char *a, size_t na, const char *b, size_t nb, size_t cap) {
    enum { MAXN = 64 };
    if (na > MAXN || nb > MAXN) return cap + 1;
    size_t row[MAXN + 1];
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0], best = row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t up = row[j];
            size_t v = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < v) v = up + 1;
            if (row[j - 1] + 1 < v) v = row[j - 1] + 1;
            row[j] = v;
            diag = up;
            if (v < best) best = v;
        }
        if (best > cap) return cap + 1;
    }
    return row[nb];
}

/* How far a typed name w is from a known name c (both without their dashes), or
 * SIZE_MAX when c is no plausible meaning of w: close by edit distance (at most 1 for
 * names up to 4 characters, 2 up to 8, 3 beyond), or one a prefix of the other
 * (--temperature for --temp, --max for --max-tokens) where the shorter has at least 3
 * characters.  One-letter names are never guessed at (-x is not a typo of -n). */
static size_t closeness(const char *w, size_t nw, const char *c, size_t nc) {
    size_t shorter = nw < nc ? nw : nc;
    if (shorter < 2) return SIZE_MAX;
    size_t cap = shorter <= 4 ? 1 : shorter <= 8 ? 2 : 3;
    size_t d = edit_distance(w, nw, c, nc, cap);
    if (d <= cap) return d;
    if (shorter >= 3 && strncmp(w, c, shorter) == 0) return cap + 1 + (nw > nc ? nw - nc : nc - nw);
    return SIZE_MAX;
}

/* Keeps c[0..nc) in *best when it is closer to w than the best so far. */
static void consider(const char *w, size_t nw, const char *c, size_t nc, const char **best, size_t *best_n,
                     size_t *best_d) {
    size_t d = closeness(w, nw, c, nc);
    if (d < *best_d) {
        *best = c;
        *best_n = nc;
        *best_d = d;
    }
}

const char *cli_suggest_command(const char *word, char *buf, size_t cap) {
    const char *best = NULL;
    size_t best_n = 0, best_d = SIZE_MAX;
    for (size_t i = 0; i < N_COMMANDS; i++)
        consider(word, strlen(word), commands[i].name, strlen(commands[i].name), &best, &best_n, &best_d);
    if (!best || best_n >= cap) return NULL;
    snprintf(buf, cap, "%.*s", (int)best_n, best);
    return buf;
}

/* The options a help text mentions: "-x" or "--name" after a blank, '(', '[', '|' or
 * ',', the name letters, digits and dashes.  Each is given to consider(). */
static void consider_options(const char *text, const char *w, size_t nw, size_t w_dashes, const char **best,
                             size_t *best_n, size_t *best_d) {
    for (const char *p = text; (p = strchr(p, '-')) != NULL; p++) {
        char before = p == text ? ' ' : p[-1];
        if (!strchr(" \n([|,", before)) continue;
        size_t dashes = p[1] == '-' ? 2 : 1;
        const char *name = p + dashes;
        size_t n = 0;
        while ((name[n] >= 'a' && name[n] <= 'z') || (name[n] >= 'A' && name[n] <= 'Z') ||
               (name[n] >= '0' && name[n] <= '9') || (n > 0 && name[n] == '-'))
            n++;
        if (n == 0 || (!(name[0] >= 'a' && name[0] <= 'z') && !(name[0] >= 'A' && name[0] <= 'Z'))) continue;
        if ((dashes == 1) != (n == 1)) continue; /* -x and --name only ("-abc" is no option) */
        /* the same spelling as typed (dashes and all) is no typo of itself */
        if (dashes == w_dashes && n == nw && strncmp(name, w, n) == 0) continue;
        const char *prev = *best;
        consider(w, nw, name, n, best, best_n, best_d);
        if (*best != prev) *best = p; /* keep the dashes */
        if (*best == p) *best_n = n + dashes;
        p = name + n - 1;
    }
}

const char *cli_suggest_option(const char *arg, char *buf, size_t cap) {
    if (!current || arg[0] != '-') return NULL;
    size_t dashes = arg[1] == '-' ? 2 : 1;
    const char *w = arg + dashes;
    size_t nw = strcspn(w, "=");
    const char *best = NULL;
    size_t best_n = 0, best_d = SIZE_MAX;
    consider_options(current->text, w, nw, dashes, &best, &best_n, &best_d);
    const command_help *also = find_command(current->also);
    if (also) consider_options(also->text, w, nw, dashes, &best, &best_n, &best_d);
    if (!best || best_n >= cap) return NULL;
    snprintf(buf, cap, "%.*s", (int)best_n, best);
    return buf;
}

int cli_unknown_command(const char *name) {
    char hint[32];
    if (cli_suggest_command(name, hint, sizeof hint))
        return cli_usage_error("unknown command '%s' (did you mean %s?)", name, hint);
    return cli_usage_error("unknown command '%s'", name);
}

int cli_unknown_arg(const char *arg) {
    char hint[64];
    if (arg[0] == '-' && arg[1] != '\0') {
        if (cli_suggest_option(arg, hint, sizeof hint))
            return cli_usage_error("unknown option '%s' (did you mean %s?)", arg, hint);
        return cli_usage_error("unknown option '%s'", arg);
    }
    return cli_usage_error("unexpected argument '%s'", arg);
}
