/* cli.h - private interface between the parts of the `tandem` command-line program.
 *
 * Exit codes: 0 success, 1 runtime error ("error: <message>" on stderr),
 * 2 bad command line ("error: <message>" plus the usage text on stderr).
 */
#ifndef TDM_CLI_H
#define TDM_CLI_H

#include <float.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "request_args.h"
#include "tandem.h"

struct tdm_json; /* json.h */

#define CLI_BATCH_MAX 1024 /* --batch at most */
#define CLI_EXIT_OK 0
#define CLI_EXIT_ERROR 1
#define CLI_EXIT_USAGE 2

/* Subcommands: argv[0] is the subcommand name; return the exit code. */
int cli_generate(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_bench(int argc, char **argv);
int cli_synth(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_merge(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_quantize(int argc, char **argv);
int cli_serve(int argc, char **argv);

/* ------------------------------------------------------------ messages */

/* usage.c: the help texts.  cli_set_command names the command being run (false if
 * there is none of that name); cli_usage prints its help, or the command list before
 * one is set; cli_help_command prints a named command's help (false if none). */
bool cli_set_command(const char *name);
void cli_usage(FILE *f);
bool cli_help_command(FILE *f, const char *name);
/* The closest command name to word, or of the current command's options to arg
 * ("--temperature" -> "--temp"), copied into buf; NULL when none is close. */
const char *cli_suggest_command(const char *word, char *buf, size_t cap);
const char *cli_suggest_option(const char *arg, char *buf, size_t cap);
/* "error: unknown command 'x'" with a suggestion; returns CLI_EXIT_USAGE. */
int cli_unknown_command(const char *name);
/* Prints "error: <msg>" and one line pointing to the command's --help to stderr;
 * returns CLI_EXIT_USAGE. */
int cli_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Prints "error: <msg>" to stderr; returns CLI_EXIT_ERROR. */
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* cli_error with a va_list (cli_usage_error prints its error through it). */
int cli_verror(const char *fmt, va_list ap);
/* The error of opening a target/draft pair: a mismatch (TANDEM_ERR_MISMATCH, whose
 * message says what differs but not which files) names both files; a draft that is
 * an EAGLE-3 head is checked against the target (cli_eagle3_check) and refused as not
 * yet drafting; any other status is cli_status_error's.  Returns CLI_EXIT_ERROR. */
int cli_pair_error(tandem_status st, const char *target, const char *draft);
/* Whether draft is an EAGLE-3 head (*is_head), and if so whether it fits target
 * (cli_info.c): CLI_EXIT_OK with a line saying so in fit[cap], or an error printed
 * (an invalid head, or a mismatch naming both files); not a head: CLI_EXIT_OK,
 * nothing printed. */
int cli_eagle3_check(const char *target, const char *draft, bool *is_head, char *fit, size_t cap);
/* Prints "error: <what>: <tandem_last_error() or the status string>"; returns
 * CLI_EXIT_ERROR.  what may be NULL. */
int cli_status_error(tandem_status st, const char *what);

/* ------------------------------------------------------ option parsing */

/* Matches argv[*i] against a short (may be NULL) and a long option name that take
 * a value, given as "-x V", "--long V" or "--long=V".  Returns true on a match and
 * sets *val (advancing *i past a separate value); when the value is missing it
 * prints a usage error, sets *val = NULL and *missing = true. */
bool cli_take(int argc, char **argv, int *i, const char *short_name, const char *long_name,
              const char **val, bool *missing);
/* Prints the usage error for an unknown option or a stray argument; returns
 * CLI_EXIT_USAGE. */
int cli_unknown_arg(const char *arg);
/* True when argv[i] is exactly the short or the long flag (no value). */
bool cli_opt_flag(const char *arg, const char *short_name, const char *long_name);
/* True for -h / --help. */
bool cli_is_help(const char *arg);

/* Strict number parsing: the whole string must be consumed and the value must lie
 * in [lo, hi]; otherwise prints a usage error naming the option and returns false.
 * opt is the option as written (a "--name=value" form is shown as "--name").
 * A NULL s (value missing, already reported) returns false silently. */
bool cli_parse_int(const char *opt, const char *s, long lo, long hi, int *out);
bool cli_parse_u64(const char *opt, const char *s, uint64_t *out);
/* A byte count: digits with an optional K, M, G or T suffix (powers of 1024), at
 * least 1 MiB. */
bool cli_parse_size(const char *opt, const char *s, size_t *out);
bool cli_parse_float(const char *opt, const char *s, double lo, double hi, float *out);
/* --logit-bias ID=B[,ID=B]...: ids >= 0 (the model checks the vocabulary), biases in
 * [-100, 100], at most TANDEM_LOGIT_BIAS_MAX; *out heap.  False with the usage error
 * printed. */
bool cli_parse_logit_bias(const char *opt, const char *s, tandem_logit_bias **out, int *n);
/* The same for the half-open range (lo, hi]. */
bool cli_parse_float_gt(const char *opt, const char *s, double lo, double hi, float *out);
/* The usage error for an option given without the one it needs to take effect
 * ("option --spec-k has no effect without -d DRAFT"); returns CLI_EXIT_USAGE.  An
 * option that would be ignored is refused rather than silently dropped. */
int cli_needs(const char *opt, const char *needed);
/* True for the speculation options (--spec-k, --spec-k-max, --p-min, --spec-ngram, --spec-tree,
 * --spec-oracle, --draft-vocab, as
 * "--name" or "--name=value"): they need -d DRAFT. */
bool cli_is_spec_opt(const char *arg);
/* "cpu" or "cuda". */
bool cli_parse_backend(const char *opt, const char *s, tandem_backend_kind *out);
/* --tensor-parallel N: N in [1, 8] (the library checks that the model divides). */
bool cli_parse_tensor_parallel(const char *opt, const char *s, int *out);
/* A KV cache type's name: "auto", "f32", "f16", "q8_0" or "fp8" (false for another,
 * nothing printed); shared by --kv-type and the job files' kv_type. */
bool cli_kv_type_from_str(const char *s, tandem_kv_type *out);
/* "native" / "fp8" (tandem_model_params.weights); false for anything else (nothing
 * printed); shared by --weights and the job files' weights. */
#define CLI_WEIGHTS "native or fp8"
bool cli_weights_from_str(const char *s, tandem_weights *out);
/* --weights: cli_weights_from_str, a usage error naming the option otherwise. */
bool cli_parse_weights(const char *opt, const char *s, tandem_weights *out);
#define CLI_KV_TYPES "auto, f32, f16, q8_0 or fp8"
/* A draft_vocab value: "auto" -> TANDEM_DRAFT_VOCAB_AUTO, "0" (the whole vocabulary) or
 * N in [TANDEM_DRAFT_VOCAB_MIN, 2^30] (the engine checks it against the vocabulary's
 * size); false for another, nothing printed.  Shared by --draft-vocab and the job
 * files' draft_vocab. */
bool cli_draft_vocab_from_str(const char *s, int *out);
#define CLI_DRAFT_VOCAB "auto, 0 (the whole vocabulary) or a number of tokens >= 1024"
/* --draft-vocab: cli_draft_vocab_from_str, a usage error naming the option otherwise. */
bool cli_parse_draft_vocab(const char *opt, const char *s, int *out);
/* --kv-type: cli_kv_type_from_str, a usage error naming the option otherwise. */
bool cli_parse_kv_type(const char *opt, const char *s, tandem_kv_type *out);
/* "auto" -> 0 (adaptive), or a fixed length 1..TANDEM_SPEC_K_MAX. */
bool cli_parse_spec_k(const char *opt, const char *s, int *out);
/* "off" or 0 -> 0, or an n-gram length TANDEM_SPEC_NGRAM_MIN..MAX (--spec-ngram). */
bool cli_parse_spec_ngram(const char *opt, const char *s, int *out);
/* The same as an option: a usage error naming it. */
bool cli_parse_spec_tree(const char *opt, const char *s, int *tree, const char **shape);

/* ------------------------------------------------------- prompt files */

/* The value ranges of the sampling options, shared by the flags (--temp, -n) and
 * the prompt-file members (temperature, max_tokens): tandem.h's ranges, as far as a
 * command line can write them.  Seeds take the whole 64-bit range in both. */
#define CLI_TEMP_MAX FLT_MAX  /* --temp, "temperature": [0, FLT_MAX] */
#define CLI_CTX_MAX (1 << 24) /* --ctx, [engine] ctx at most (the largest context a GGUF may declare) */
#define CLI_COUNT_MAX INT_MAX /* -n, --top-k, "max_tokens": [0, INT_MAX] */
/* tandem serve's connections: [server] max_connections (and per address) in [1, 65536]
 * (0 per address: no limit), read_timeout_s / idle_timeout_s in (0, 86400] */
#define CLI_CONNECTIONS_MAX 65536
#define CLI_CONNECTIONS_DEFAULT 512
#define CLI_CONNECTIONS_PER_IP_DEFAULT 128
#define CLI_CONN_TIMEOUT_S_MAX 86400.0

/* An id as given: CLI_ID_INT is a prompt's place (no id member: its 0-based index;
 * -p TEXT: 0); a numeric id keeps the literal as written, echoed verbatim. */
typedef enum cli_id_kind { CLI_ID_INT, CLI_ID_NUM, CLI_ID_STR } cli_id_kind;

typedef struct cli_prompt {
    int line;                /* 1-based line in the file (0 for -p TEXT) */
    cli_id_kind id_kind;
    int64_t id_int;          /* CLI_ID_INT */
    char *id_str;            /* CLI_ID_NUM: the number's literal; CLI_ID_STR: the string;
                                [id_len] bytes + NUL (heap) */
    size_t id_len;
    char *text;              /* the prompt: [len] bytes + NUL (heap; may hold NULs); for a
                                chat prompt, the rendered conversation once rendered */
    size_t len;
    char *messages;          /* "messages" given: that array as JSON text (heap), rendered by
                                the model's chat template before generation; else NULL */
    bool has_seed;
    uint64_t seed;
    bool has_max_tokens;
    int max_tokens;
    bool has_temperature;
    float temperature;
    bool has_priority;
    int priority;
    bool has_timeout;
    double timeout_ms;       /* "timeout_s" * 1000 */
    bool has_stop;           /* "stop" given (possibly []: none) */
    char **stop;             /* [n_stop] NUL-terminated strings (heap) */
    int n_stop;
    char *grammar;           /* "grammar": GBNF text (heap), NULL = the job's */
    char *json_schema;       /* "json_schema": the schema's JSON text (heap; an object, or a
                                string holding one), NULL = the job's */
    bool has_presence, has_frequency, has_repetition, has_min_tokens, has_logprobs;
    float presence, frequency, repetition; /* "presence_penalty", "frequency_penalty",
                                "repetition_penalty" */
    int min_tokens;          /* "min_tokens" */
    int logprobs;            /* "logprobs": N alternatives, -1 = off (false) */
    tandem_logit_bias *logit_bias; /* "logit_bias" {"ID": B}: [n_logit_bias] (heap), NULL = the job's */
    int n_logit_bias;
    char *error;             /* cli_prompts_read_lenient: "FILE:LINE: problem" of a bad line
                                (heap; the id is then the line's index), else NULL */
} cli_prompt;

typedef struct cli_prompts {
    cli_prompt *items;       /* [n] */
    size_t n;
} cli_prompts;

/* Reads a JSON-lines prompt file (any file, pipe or device) within input.h's limits:
 * a line at most TDM_INPUT_LINE_MAX bytes, the file TDM_INPUT_TOTAL_MAX.  Blank lines
 * are skipped.  On a bad line, writes "FILE:LINE: problem" into err and returns false
 * (nothing allocated). */
bool cli_prompts_read(const char *path, cli_prompts *out, char *err, size_t err_cap);
/* The same, but a bad line becomes an item with error set (a job reports it and
 * goes on); false (err set) only when the file cannot be read. */
bool cli_prompts_read_lenient(const char *path, cli_prompts *out, char *err, size_t err_cap);
/* Either of them from an open stream f, called name in messages (f is not closed). */
bool cli_prompts_read_stream(FILE *f, const char *name, bool lenient, cli_prompts *out, char *err,
                             size_t err_cap);
/* A single prompt from -p TEXT (id 0).  False on out of memory. */
bool cli_prompts_single(const char *text, cli_prompts *out);
void cli_prompts_free(cli_prompts *p);

/* Whether m is a messages array: objects with a string "role" (what chat templates
 * need; the rest is the template's business). */
bool cli_messages_ok(const struct tdm_json *m);

/* Puts p's own fields (seed, max_tokens, temperature, stop, grammar or json_schema,
 * priority, timeout) over
 * the request's (those of the command line or the job).  rq->params.stop then points
 * into p. */
void cli_prompt_apply(const cli_prompt *p, tandem_request *rq);


/* Writes the id: as JSON (strings quoted and escaped) or as plain text. */
void cli_prompt_write_id(FILE *f, const cli_prompt *p, bool json);
/* The id as the JSON text an output line holds (a string quoted and escaped as
 * cli_prompt_write_id writes it, a number's literal), or NULL for a value that is
 * neither a string nor a number (or out of memory).  Heap; the key under which
 * `tandem run` and `tandem merge` compare ids. */
char *cli_prompt_id_text(const cli_prompt *p);
char *cli_json_id_text(const struct tdm_json *id);
/* A result as one JSON line (tandem generate --json), flushed. */
void cli_json_result(FILE *f, const cli_prompt *p, const tandem_result *r, bool has_draft);

/* ---------------------------------------------- job ids (job_ids.c) */

/* An id of a job's lines (its JSON text, as cli_prompt_id_text) and where it stands. */
typedef struct cli_id_at {
    char *id;                    /* heap */
    const char *file;
    int line;
    bool implicit;               /* a prompt without an "id" (its 0-based index) */
    size_t seq;                  /* the order pushed */
} cli_id_at;

typedef struct cli_ids {
    cli_id_at *v;
    size_t n, cap;
} cli_ids;

/* Appends id (taken: freed with ids); false when out of memory (id not taken). */
bool cli_ids_push(cli_ids *ids, char *id, const char *file, int line, bool implicit);
/* Appends the ids of ps's items (read from file), in order; false (printed) when out
 * of memory. */
bool cli_ids_of_prompts(cli_ids *ids, const cli_prompts *ps, const char *file);
/* Sorts by id (then the order pushed), for the two below. */
void cli_ids_sort(cli_ids *ids);
/* False when an id appears more than once: each duplicate printed as an error naming
 * both lines ("FILE:LINE: duplicate id 7 (first at FILE:LINE)"), the first few. */
bool cli_ids_unique(const cli_ids *ids);
bool cli_ids_has(const cli_ids *ids, const char *id);
void cli_ids_free(cli_ids *ids);

/* ------------------------------------------ output files (line_out.c) */

/* A file written a line at a time (`tandem run`'s output, `tandem merge`'s OUT.tmp). */
typedef struct cli_line_out {
    const char *path;
    int fd;                      /* -1: not open */
    off_t end;                   /* the length written: the end of its last complete line */
    FILE *pend;                  /* the lines not yet written (a memory stream) */
    char *buf;                   /* pend's bytes [len] */
    size_t len;
    char err[PATH_MAX + 256];    /* the first problem: "PATH: problem" */
} cli_line_out;

/* Opens (creating) path for writing: a regular file only (another kind refused before
 * it is read, a FIFO never waited on), locked for as long as it is open (held by
 * another: refused), emptied when truncate, else written after what it holds (end:
 * its size).  False with o->err set; call cli_line_out_close in either case. */
bool cli_line_out_open(cli_line_out *o, const char *path, bool truncate);
/* Cuts the file to end bytes (a resumed output's incomplete last line). */
bool cli_line_out_cut(cli_line_out *o, off_t end);
/* Where the lines go: whole lines only, each ending in a newline. */
FILE *cli_line_out_stream(cli_line_out *o);
/* Writes the pending lines.  When a write fails the file is cut back to the end of
 * its last complete line and o->err says why ("PATH: cannot write: No space left on
 * device"); every later call fails too. */
bool cli_line_out_flush(cli_line_out *o);
/* cli_line_out_flush once bytes or more are pending (else only o->err checked). */
bool cli_line_out_flush_at(cli_line_out *o, size_t bytes);
/* Flushes, then syncs the file to the disk. */
bool cli_line_out_sync(cli_line_out *o);
/* cli_line_out_sync, then renames the file to `to` (replacing it) and syncs the
 * directory: the lines appear at once and whole; o->path becomes to. */
bool cli_line_out_rename(cli_line_out *o, const char *to);
/* cli_line_out_sync, then closes (the lock goes with it); false when anything failed
 * (o->err).  Safe after a failed open. */
bool cli_line_out_close(cli_line_out *o);

/* ---------------------------------------------------------- job files */

/* `tandem serve`'s [server] section (job_config.c; the flags of the same names
 * override it). */
typedef struct cli_server_cfg {
    char host[256];              /* host: the address to bind; default 127.0.0.1 */
    int port;                    /* port: default 8080; 0 = any free port */
    char api_key[256];           /* api_key: "" = none (not given; an empty value is refused) */
    int max_queue;               /* max_queue: waiting requests beyond which 429; default 64,
                                    0 = no limit */
    int max_body_kb;             /* max_body_kb: request body limit; default 1024 */
    double request_timeout_s;    /* request_timeout_s: every request's limit; 0 = none (default) */
    double shutdown_grace_s;     /* shutdown_grace_s: SIGTERM waits this long; default 10 */
    char model_name[256];        /* model_name: the id clients use; "" = the target's file name
                                    without .gguf */
    int max_connections;         /* max_connections: open at once; default 512 */
    int max_connections_per_ip;  /* max_connections_per_ip: from one address; default 128,
                                    0 = no limit */
    double read_timeout_s;       /* read_timeout_s: a request's headers and body; default 30 */
    double idle_timeout_s;       /* idle_timeout_s: a kept-alive connection; default 75 */
    char log_file[PATH_MAX];     /* log_file: "" = stderr */
    bool log_json;               /* log_format: text (default) or json (one JSON object a line) */
    char cors_origin[1024];      /* cors_origin: "" = no CORS (default); "*" or comma-separated
                                    origins (scheme://host[:port]) allowed to call the API
                                    from a browser (cli_cors_origin_check) */
} cli_server_cfg;

/* A cors_origin value: "*", or origins "http(s)://host[:port]" separated by commas
 * (no path, no spaces).  False with why set. */
bool cli_cors_origin_check(const char *v, char *why, size_t cap);

/* A `tandem run` job file (job_config.c: the sections and keys are listed there), or
 * with serve set a `tandem serve` config: [server] instead of [job]. */
typedef struct cli_job_cfg {
    char dir[PATH_MAX];          /* the config file's directory */
    char target[PATH_MAX], draft[PATH_MAX], input[PATH_MAX], output[PATH_MAX];
    int target_line, draft_line, input_line; /* where they were set (0: --set) */
    const char *target_file, *draft_file, *input_file;
    tandem_backend_kind backend;
    int threads, max_batch, block_size;
    int max_batch_tokens;        /* [engine]: 0 = the engine's default */
    int prefix_cache, batch_invariant; /* [engine]: 1 / 0, -1 = not set (the engine's default) */
    long kv_mem_mb, gpu_mem_mb;
    int ctx;                 /* [engine] ctx: tokens per sequence; 0 = the engine's default */
    tandem_kv_type kv_type;  /* [engine] kv_type; default auto */
    tandem_weights weights;  /* [engine] weights: native / fp8, both models; default native */
    int draft_vocab;         /* [engine] draft_vocab (cli_draft_vocab_from_str); default auto */
    int tensor_parallel;     /* [engine] tensor_parallel: the target split across N ranks; default 1 */
    int spec_k, spec_k_max, spec_ngram;
    int spec_tree;               /* [spec] tree: 0 = off, TANDEM_SPEC_TREE_AUTO, a budget */
    char spec_tree_shape[64];    /* [spec] tree as a static shape ("" = none) */
    float p_min;
    tandem_generate_params gp;   /* [sampling]; gp.stop points to stop */
    char **stop;                 /* [sampling] stop: [n_stop] heap strings */
    int n_stop;
    int priority;                /* [job] priority: the requests' default */
    double timeout_ms;           /* [job] timeout_s * 1000: the requests' default (0: none) */
    char chat_template[256];     /* [job] chat_template: for inputs with "messages" ("" = the
                                    model's own); serve: [server] chat_template */
    bool serve;                  /* a `tandem serve` config */
    cli_server_cfg server;       /* serve: [server] */
    /* where the first problem was found */
    char err[PATH_MAX + 512];
    const char *file;            /* the config's path, or "--set" */
    int line;                    /* current line (the reader counts them) */
} cli_job_cfg;

/* Reads a job file from f (named path: messages and the directory of relative paths
 * come from it), then applies the n_sets "section.key=value" overrides of --set and
 * checks the whole: required keys, that the files named exist, keys that need
 * others.  defaults: the sampling parameters under the file's keys
 * (tandem_generate_default_params()).  False with c->err set to "FILE:LINE: [section]
 * key: problem".  Free c with cli_job_cfg_free in either case. */
bool cli_job_cfg_read(FILE *f, const char *path, const tandem_generate_params *defaults, char **sets, int n_sets,
                      cli_job_cfg *c);
/* The same, opening path. */
bool cli_job_cfg_load(const char *path, const tandem_generate_params *defaults, char **sets, int n_sets,
                      cli_job_cfg *c);
void cli_job_cfg_free(cli_job_cfg *c);
/* `tandem serve CONFIG.ini`: the same with [server] in place of [job] (no input or
 * output). */
bool cli_serve_cfg_load(const char *path, const tandem_generate_params *defaults, char **sets, int n_sets,
                        cli_job_cfg *c);
/* A serve config with every default (`tandem serve -m MODEL`, no file). */
void cli_serve_cfg_init(cli_job_cfg *c, const tandem_generate_params *defaults);
/* Opens the models and the engine a config names; -1 on success, else an exit code
 * (the error printed; what was opened is closed).  progress (may be NULL) is each
 * model's load progress callback (tandem_model_params); when it stops a load the exit
 * code is CLI_EXIT_OK and nothing is printed (the caller knows why). */
int cli_job_open_engine(const cli_job_cfg *c, bool (*progress)(float, void *), void *progress_user,
                        tandem_model **target, tandem_model **draft, tandem_engine **eng);
/* The config's request parameters: [sampling], [job] priority / timeout, and with a
 * draft the [spec] keys. */
tandem_request cli_job_request(const cli_job_cfg *c, bool has_draft);

/* ------------------------------------------------- generate and chat */

/* The options of `tandem generate` and `tandem chat`. */
typedef struct cli_gen_opts {
    const char *model, *draft, *prompt, *prompts_file;
    const char *messages_file; /* --messages: one conversation (implies chat) */
    const char *chat_template; /* --chat-template: a built-in name, a model's named
                                  template, or a .jinja file; NULL = the model's */
    const char *system;        /* tandem chat --system TEXT */
    bool chat;                 /* --chat: render prompts as conversations */
    int max_tokens;            /* default 128 */
    float temp, top_p, min_p, p_min;
    int top_k;
    uint64_t seed;
    int threads;               /* 0 = all cores */
    tandem_backend_kind backend;
    size_t gpu_mem;            /* 0 = no budget */
    int batch;                 /* requests decoding at once (default 1) */
    int spec_k;                /* 0 = adaptive */
    int spec_k_max;            /* 0 = library default */
    int spec_ngram;            /* 0 = off; default: the library's */
    int spec_tree;             /* --spec-tree: 0 = off, TANDEM_SPEC_TREE_AUTO, a budget */
    const char *spec_tree_shape; /* --spec-tree as a static shape, NULL = none */
    tandem_kv_type kv_type;    /* --kv-type; default auto */
    tandem_weights weights;    /* --weights: native / fp8, both models; default native */
    int draft_vocab;           /* --draft-vocab (cli_draft_vocab_from_str); default auto */
    int ctx;                   /* --ctx: tokens per sequence; 0 = the engine's default */
    size_t kv_mem;             /* --kv-mem: KV cache budget in bytes; 0 = ctx x batch */
    int tensor_parallel;       /* --tensor-parallel: the target split across N ranks; default 1 */
    char *grammar;             /* --grammar FILE's text (heap, lives to the exit), NULL = none */
    char *json_schema;         /* --json-schema FILE's text (heap, likewise), NULL = none */
    float presence, frequency, repetition; /* --presence-penalty, --frequency-penalty,
                                  --repetition-penalty; defaults 0, 0, 1 */
    int min_tokens;            /* --min-tokens; default 0 */
    tandem_logit_bias *logit_bias; /* --logit-bias ID=B,...: [n_logit_bias] (heap), NULL = none */
    int n_logit_bias;
    int logprobs;              /* --logprobs N: alternatives per token, -1 = off (default) */
    bool json;
} cli_gen_opts;

/* Frees what cli_gen_parse allocated (the --grammar / --json-schema texts). */
void cli_gen_opts_free(cli_gen_opts *o);
/* Parses the options (interactive: `tandem chat`'s, no prompt options); returns -1
 * to go on, else an exit code (usage errors printed). */
int cli_gen_parse(int argc, char **argv, bool interactive, cli_gen_opts *o);
/* Opens the models and the engine of o (*draft NULL without -d); -1 on success,
 * else an exit code (the error printed; what was opened is closed). */
int cli_gen_open(const cli_gen_opts *o, bool (*progress)(float, void *), void *progress_user, tandem_model **target,
                 tandem_model **draft, tandem_engine **eng);
/* The request of o's sampling and speculation options. */
tandem_request cli_gen_request(const cli_gen_opts *o);
/* The text of --chat-template VALUE for the library: a file's contents when VALUE
 * names a readable file (heap, *owned set), else VALUE itself; NULL when a file could
 * not be read (the error printed). */
const char *cli_chat_template_arg(const char *value, char **owned);

/* Renders the prompts that carry messages (all: the others too, as one user message)
 * by the chat template tmpl (NULL: the model's), in place.  A failure: lenient, the
 * prompt's error ("FILE:LINE: ...", the job goes on); else printed, and the exit
 * code returned.  -1 when done. */
int cli_render_chats(const tandem_model *target, const char *tmpl, bool all, const char *file, cli_prompts *ps,
                     bool lenient);

/* ---------------------------------------------------------------- misc */

/* Writes a finite double as a JSON number (non-finite values become 0). */
void cli_json_num(FILE *f, double x, int decimals);
/* Writes `"spec": {...}` for speculative statistics: steps, drafted, accepted,
 * acceptance_rate, mean_accepted, k_final, accept_hist (steps that accepted 0, 1, ...
 * tokens, up to the last non-zero bin), draft_ms, verify_ms, other_ms.  Rates are
 * recomputed from the counts, so summed statistics print correctly. */
void cli_json_spec(FILE *f, const tandem_spec_stats *s);
/* Adds b's counts and times into a (k_final taken from b). */
void cli_spec_add(tandem_spec_stats *a, const tandem_spec_stats *b);
/* Tokens per second for n tokens in ms milliseconds; 0 when n or ms is 0: no rate
 * for work not done. */
double cli_tok_per_s(double n, double ms);
/* The same as text: "123 tok/s", or "n/a" where cli_tok_per_s is 0 (buf: scratch). */
const char *cli_rate_str(double n, double ms, char buf[32]);

#endif
