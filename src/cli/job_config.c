/* job_config.c - the job file of `tandem run JOB.ini` (INI, read with inih):
 *
 *   [model]    target, draft
 *   [engine]   backend (cpu|cuda), threads, max_batch, max_batch_tokens, block_size, ctx, kv_mem_mb,
 *              tensor_parallel (1..8: the target split across that many GPUs),
 *              gpu_mem_mb, kv_type (auto|f32|f16|q8_0|fp8), weights (native|fp8), draft_vocab (auto|0|N >= 1024),
 *              prefix_cache, batch_invariant (true|false)
 *   [spec]     k (a number or auto), k_max, ngram, p_min, tree (off, auto, a node budget or a
 *              static shape such as 4,2,2,1)
 *   [sampling] temperature, top_k, top_p, min_p, seed, max_tokens,
 *              stop (JSON: "\n\n" or ["\n\n", "def "])
 *   [job]      input, output, priority, timeout_s, chat_template (a built-in name or
 *              a named template of the model, for the inputs that carry "messages")
 *   [server]   (`tandem serve`, in place of [job]) host, port, api_key, max_queue,
 *              max_body_kb, request_timeout_s, shutdown_grace_s, model_name, chat_template,
 *              max_connections, max_connections_per_ip, read_timeout_s, idle_timeout_s,
 *              log_file, log_format, cors_origin
 *
 * Paths are relative to the config file; `--set section.key=value` overrides a key.
 * Every unknown section or key, bad value, over-long line and missing file is
 * reported as FILE:LINE with the key (the first problem only).
 */
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "json.h"

static int cfg_fail(cli_job_cfg *c, const char *section, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int cfg_fail(cli_job_cfg *c, const char *section, const char *key, const char *fmt, ...) {
    if (c->err[0]) return 0;
    int k = c->line > 0 ? snprintf(c->err, sizeof c->err, "%s:%d: [%s] %s: ", c->file, c->line, section, key)
                        : snprintf(c->err, sizeof c->err, "%s: [%s] %s: ", c->file, section, key);
    if (k < 0 || (size_t)k >= sizeof c->err) return 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, sizeof c->err - (size_t)k, fmt, ap);
    va_end(ap);
    return 0; /* (stops inih) */
}

static bool parse_long(const char *v, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno == ERANGE || x < lo || x > hi) return false;
    *out = x;
    return true;
}

static bool parse_double(const char *v, double lo, double hi, bool lo_open, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) return false;
    *out = x;
    return true;
}

/* The range applies to the value as the float the library takes (1e-320 is 0 there),
 * as for the options (main.c). */
static bool parse_float(const char *v, double lo, double hi, bool lo_open, float *out) {
    double x;
    if (!parse_double(v, lo, hi, lo_open, &x) || (lo_open ? !((float)x > lo) : !((float)x >= lo))) return false;
    *out = (float)x;
    return true;
}

/* " (it is 0 as a float)" for a number that a float cannot tell from 0, else "". */
static const char *float_zero_note(const char *v) {
    char *end;
    const double x = strtod(v, &end);
    return end != v && !*end && x != 0 && (float)x == 0 ? " (it is 0 as a float)" : "";
}

/* A path value: relative ones are taken from the config file's directory. */
static int set_path(cli_job_cfg *c, const char *section, const char *key, const char *v, char *dst) {
    if (!*v) return cfg_fail(c, section, key, "empty path");
    int k = v[0] == '/' ? snprintf(dst, PATH_MAX, "%s", v) : snprintf(dst, PATH_MAX, "%s/%s", c->dir, v);
    if (k < 0 || k >= PATH_MAX) return cfg_fail(c, section, key, "path too long");
    return 1;
}

#define INT_KEY(name, lo, hi, field)                                                                   \
    if (!strcmp(k, name)) {                                                                           \
        long x;                                                                                        \
        if (!parse_long(v, lo, hi, &x)) return cfg_fail(c, s, k, "'%s' is not an integer in [%ld, %ld]", v, (long)(lo), (long)(hi)); \
        field = (int)x;                                                                                \
        return 1;                                                                                      \
    }

/* Each section's keys: 1 = taken, 0 = failed (c->err set). */
static int key_model(cli_job_cfg *c, const char *s, const char *k, const char *v) {
    if (!strcmp(k, "target")) return c->target_line = c->line, c->target_file = c->file, set_path(c, s, k, v, c->target);
    if (!strcmp(k, "draft")) {
        c->draft_line = c->line, c->draft_file = c->file;
        return *v ? set_path(c, s, k, v, c->draft) : (c->draft[0] = 0, 1);
    }
    return cfg_fail(c, s, k, "unknown key (known: target, draft)");
}

static int key_job(cli_job_cfg *c, const char *s, const char *k, const char *v) {
    if (!strcmp(k, "input")) return c->input_line = c->line, c->input_file = c->file, set_path(c, s, k, v, c->input);
    if (!strcmp(k, "output")) return set_path(c, s, k, v, c->output);
    INT_KEY("priority", INT_MIN, INT_MAX, c->priority)
    if (!strcmp(k, "timeout_s")) {
        double x;
        if (!parse_double(v, 0, TDM_ARG_TIMEOUT_S_MAX, false, &x))
            return cfg_fail(c, s, k, "'%s' is not a number of seconds in [0, %g]", v, TDM_ARG_TIMEOUT_S_MAX);
        c->timeout_ms = x * 1000.0;
        return 1;
    }
    if (!strcmp(k, "chat_template")) {
        if (strlen(v) >= sizeof c->chat_template) return cfg_fail(c, s, k, "longer than %zu bytes", sizeof c->chat_template - 1);
        snprintf(c->chat_template, sizeof c->chat_template, "%s", v);
        return 1;
    }
    return cfg_fail(c, s, k, "unknown key (known: input, output, priority, timeout_s, chat_template)");
}

/* (here rather than beside --kv-type's parser in main.c: the job-file parser links
 * without main.c, tests/fuzz/fuzz_config.c) */
bool cli_kv_type_from_str(const char *s, tandem_kv_type *out) {
    static const struct {
        const char *name;
        tandem_kv_type type;
    } names[] = {{"auto", TANDEM_KV_AUTO}, {"f32", TANDEM_KV_F32}, {"f16", TANDEM_KV_F16}, {"q8_0", TANDEM_KV_Q8_0},
                 {"fp8", TANDEM_KV_FP8}};
    for (size_t i = 0; s && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(s, names[i].name) == 0) {
            *out = names[i].type;
            return true;
        }
    return false;
}

bool cli_weights_from_str(const char *s, tandem_weights *out) {
    if (s && !strcmp(s, "native")) *out = TANDEM_WEIGHTS_NATIVE;
    else if (s && !strcmp(s, "fp8")) *out = TANDEM_WEIGHTS_FP8;
    else return false;
    return true;
}

bool cli_draft_vocab_from_str(const char *s, int *out) {
    if (!s) return false;
    if (strcmp(s, "auto") == 0) {
        *out = TANDEM_DRAFT_VOCAB_AUTO;
        return true;
    }
    long x;
    if (!parse_long(s, 0, 1L << 30, &x) || (x > 0 && x < TANDEM_DRAFT_VOCAB_MIN)) return false;
    *out = (int)x;
    return true;
}

static int key_engine(cli_job_cfg *c, const char *s, const char *k, const char *v) {
    if (!strcmp(k, "backend")) {
        if (!strcmp(v, "cpu")) c->backend = TANDEM_BACKEND_CPU;
        else if (!strcmp(v, "cuda")) c->backend = TANDEM_BACKEND_CUDA;
        else return cfg_fail(c, s, k, "'%s' is not cpu or cuda", v);
        return 1;
    }
    INT_KEY("threads", 0, TANDEM_THREADS_MAX, c->threads)
    INT_KEY("max_batch", 1, CLI_BATCH_MAX, c->max_batch)
    INT_KEY("block_size", 1, 4096, c->block_size)
    INT_KEY("max_batch_tokens", 0, 65536, c->max_batch_tokens)
    INT_KEY("tensor_parallel", 1, 8, c->tensor_parallel)
    INT_KEY("ctx", 1, CLI_CTX_MAX, c->ctx)
    if (!strcmp(k, "prefix_cache") || !strcmp(k, "batch_invariant")) {
        const int on = !strcmp(v, "true");
        if (!on && strcmp(v, "false")) return cfg_fail(c, s, k, "'%s' is not true or false", v);
        if (!strcmp(k, "prefix_cache")) c->prefix_cache = on;
        else c->batch_invariant = on;
        return 1;
    }
    if (!strcmp(k, "kv_type")) {
        if (!cli_kv_type_from_str(v, &c->kv_type)) return cfg_fail(c, s, k, "'%s' is not " CLI_KV_TYPES, v);
        return 1;
    }
    if (!strcmp(k, "weights")) {
        if (!cli_weights_from_str(v, &c->weights)) return cfg_fail(c, s, k, "'%s' is not " CLI_WEIGHTS, v);
        return 1;
    }
    if (!strcmp(k, "draft_vocab")) {
        if (!cli_draft_vocab_from_str(v, &c->draft_vocab)) return cfg_fail(c, s, k, "'%s' is not " CLI_DRAFT_VOCAB, v);
        return 1;
    }
    if (!strcmp(k, "kv_mem_mb") || !strcmp(k, "gpu_mem_mb")) {
        long x;
        if (!parse_long(v, 1, 1L << 30, &x)) return cfg_fail(c, s, k, "'%s' is not a size in MiB in [1, 2^30]", v);
        if (!strcmp(k, "kv_mem_mb")) c->kv_mem_mb = x;
        else c->gpu_mem_mb = x;
        return 1;
    }
    return cfg_fail(c, s, k,
                    "unknown key (known: backend, threads, max_batch, max_batch_tokens, block_size, ctx, kv_mem_mb, "
                    "gpu_mem_mb, kv_type, weights, draft_vocab, prefix_cache, batch_invariant, tensor_parallel)");
}

static int key_spec(cli_job_cfg *c, const char *s, const char *k, const char *v) {
    if (!strcmp(k, "k")) {
        if (!strcmp(v, "auto")) {
            c->spec_k = 0;
            return 1;
        }
        long x;
        if (!parse_long(v, 1, TANDEM_SPEC_K_MAX, &x))
            return cfg_fail(c, s, k, "'%s' is not auto or an integer in [1, %d]", v, TANDEM_SPEC_K_MAX);
        c->spec_k = (int)x;
        return 1;
    }
    INT_KEY("k_max", 1, TANDEM_SPEC_K_MAX, c->spec_k_max)
    if (!strcmp(k, "ngram")) {
        long x;
        if (!strcmp(v, "off")) x = 0;
        else if (!parse_long(v, 0, TANDEM_SPEC_NGRAM_MAX, &x) || (x != 0 && x < TANDEM_SPEC_NGRAM_MIN))
            return cfg_fail(c, s, k, "'%s' is not off, 0 or an integer in [%d, %d]", v, TANDEM_SPEC_NGRAM_MIN,
                            TANDEM_SPEC_NGRAM_MAX);
        c->spec_ngram = (int)x;
        return 1;
    }
    if (!strcmp(k, "p_min")) {
        if (!parse_float(v, 0, 1, false, &c->p_min)) return cfg_fail(c, s, k, "'%s' is not a number in [0, 1]", v);
        return 1;
    }
    if (!strcmp(k, "tree")) {
        char msg[300];
        if (!tdm_arg_spec_tree_into(v, &c->spec_tree, c->spec_tree_shape, sizeof c->spec_tree_shape, msg, sizeof msg))
            return cfg_fail(c, s, k, "%s", msg);
        return 1;
    }
    return cfg_fail(c, s, k, "unknown key (known: k, k_max, ngram, p_min, tree)");
}

/* [sampling] stop: the value is JSON (a string or an array of strings). */
static int key_stop(cli_job_cfg *c, const char *s, const char *k, const char *v) {
    tdm_json *j = NULL;
    tdm_err jerr = {0};
    if (tdm_json_parse(v, strlen(v), &j, &jerr) != TANDEM_OK)
        return cfg_fail(c, s, k, "'%s' is not JSON (%s); write a string or an array of strings, e.g. "
                        "[\"\\n\\n\", \"def \"] (a ';' after a space starts a comment: write it \\u003b)", v, jerr.msg);
    char **stop = NULL, why[128];
    int n = 0;
    bool ok = tdm_arg_stop_from_json(j, &stop, &n, why, sizeof why);
    tdm_json_free(j);
    if (!ok) return cfg_fail(c, s, k, "'%s': stop%s", v, why);
    tdm_arg_stop_free(c->stop, c->n_stop);
    c->stop = stop;
    c->n_stop = n;
    return 1;
}

static int key_sampling(cli_job_cfg *c, const char *s, const char *k, const char *v) {
    tandem_generate_params *g = &c->gp;
    if (!strcmp(k, "temperature")) {
        if (!parse_float(v, 0, FLT_MAX, false, &g->temperature)) return cfg_fail(c, s, k, "'%s' is not a number >= 0", v);
        return 1;
    }
    if (!strcmp(k, "top_p")) {
        if (!parse_float(v, 0, 1, true, &g->top_p))
            return cfg_fail(c, s, k, "'%s' is not a number in (0, 1]%s", v, float_zero_note(v));
        return 1;
    }
    if (!strcmp(k, "min_p")) {
        if (!parse_float(v, 0, 1, false, &g->min_p)) return cfg_fail(c, s, k, "'%s' is not a number in [0, 1]", v);
        return 1;
    }
    if (!strcmp(k, "seed")) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (*v < '0' || *v > '9' || *end || errno == ERANGE)
            return cfg_fail(c, s, k, "'%s' is not an integer in [0, 2^64-1]", v);
        g->seed = (uint64_t)x;
        return 1;
    }
    INT_KEY("top_k", 0, INT_MAX, g->top_k)
    INT_KEY("max_tokens", 0, INT_MAX, g->max_tokens)
    if (!strcmp(k, "stop")) return key_stop(c, s, k, v);
    return cfg_fail(c, s, k, "unknown key (known: temperature, top_k, top_p, min_p, seed, max_tokens, stop)");
}

/* A string key into a fixed buffer. */
static int set_str(cli_job_cfg *c, const char *s, const char *k, const char *v, char *dst, size_t cap) {
    if (strlen(v) >= cap) return cfg_fail(c, s, k, "longer than %zu bytes", cap - 1);
    snprintf(dst, cap, "%s", v);
    return 1;
}

static int key_server(cli_job_cfg *c, const char *s, const char *k, const char *v) {
    cli_server_cfg *sv = &c->server;
    if (!strcmp(k, "host")) return *v ? set_str(c, s, k, v, sv->host, sizeof sv->host) : cfg_fail(c, s, k, "empty");
    if (!strcmp(k, "api_key"))
        return *v ? set_str(c, s, k, v, sv->api_key, sizeof sv->api_key)
                  : cfg_fail(c, s, k, "empty (it would let every request in: leave the key out to serve without one)");
    if (!strcmp(k, "log_file")) return set_path(c, s, k, v, sv->log_file);
    if (!strcmp(k, "log_format")) {
        if (strcmp(v, "text") && strcmp(v, "json")) return cfg_fail(c, s, k, "'%s' is not text or json", v);
        sv->log_json = !strcmp(v, "json");
        return 1;
    }
    if (!strcmp(k, "model_name")) return set_str(c, s, k, v, sv->model_name, sizeof sv->model_name);
    if (!strcmp(k, "cors_origin")) {
        char why[160];
        if (!cli_cors_origin_check(v, why, sizeof why)) return cfg_fail(c, s, k, "%s", why);
        return set_str(c, s, k, v, sv->cors_origin, sizeof sv->cors_origin);
    }
    if (!strcmp(k, "chat_template")) return set_str(c, s, k, v, c->chat_template, sizeof c->chat_template);
    INT_KEY("port", 0, 65535, sv->port)
    INT_KEY("max_queue", 0, INT_MAX, sv->max_queue)
    INT_KEY("max_body_kb", 1, 1 << 20, sv->max_body_kb)
    INT_KEY("max_connections", 1, CLI_CONNECTIONS_MAX, sv->max_connections)
    INT_KEY("max_connections_per_ip", 0, CLI_CONNECTIONS_MAX, sv->max_connections_per_ip)
    if (!strcmp(k, "request_timeout_s") || !strcmp(k, "shutdown_grace_s")) {
        double x;
        if (!parse_double(v, 0, TDM_ARG_TIMEOUT_S_MAX, false, &x))
            return cfg_fail(c, s, k, "'%s' is not a number of seconds in [0, %g]", v, TDM_ARG_TIMEOUT_S_MAX);
        *(!strcmp(k, "request_timeout_s") ? &sv->request_timeout_s : &sv->shutdown_grace_s) = x;
        return 1;
    }
    if (!strcmp(k, "read_timeout_s") || !strcmp(k, "idle_timeout_s")) {
        double x;
        if (!parse_double(v, 0, CLI_CONN_TIMEOUT_S_MAX, true, &x))
            return cfg_fail(c, s, k, "'%s' is not a number of seconds in (0, %g]", v, CLI_CONN_TIMEOUT_S_MAX);
        *(!strcmp(k, "read_timeout_s") ? &sv->read_timeout_s : &sv->idle_timeout_s) = x;
        return 1;
    }
    return cfg_fail(c, s, k,
                    "unknown key (known: host, port, api_key, max_queue, max_body_kb, request_timeout_s, "
                    "shutdown_grace_s, model_name, chat_template, max_connections, max_connections_per_ip, "
                    "read_timeout_s, idle_timeout_s, log_file, log_format, cors_origin)");
}

bool cli_cors_origin_check(const char *v, char *why, size_t cap) {
    if (!strcmp(v, "*")) return true;
    if (!*v) return snprintf(why, cap, "empty (leave it out for no CORS, or \"*\" for any origin)"), false;
    for (const char *p = v; *p;) {
        const char *end = strchr(p, ',');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        const size_t scheme = !strncmp(p, "http://", 7) ? 7 : !strncmp(p, "https://", 8) ? 8 : 0;
        bool ok = scheme && n > scheme;
        for (size_t i = scheme; ok && i < n; i++)
            ok = (unsigned char)p[i] > 0x20 && p[i] != 0x7f && p[i] != '/' && p[i] != '*';
        if (!ok)
            return snprintf(why, cap, "'%.*s' is not an origin (http://host[:port] or https://..., no path; or \"*\" "
                            "alone)", (int)(n > 100 ? 100 : n), p), false;
        p += n + (end != NULL);
        if (end && !*p) return snprintf(why, cap, "a comma with no origin after it"), false;
    }
    return true;
}

static int on_key(void *user, const char *s, const char *k, const char *v) {
    static const struct {
        const char *name;
        int (*fn)(cli_job_cfg *, const char *, const char *, const char *);
    } sections[] = {{"model", key_model}, {"engine", key_engine}, {"spec", key_spec},
                    {"sampling", key_sampling}, {"job", key_job}};
    cli_job_cfg *c = user;
    if (c->err[0]) return 0;
    for (size_t i = 0; i < sizeof sections / sizeof sections[0]; i++)
        if (!strcmp(s, sections[i].name) && (c->serve ? strcmp(s, "job") != 0 : true))
            return sections[i].fn(c, s, k, v);
    if (c->serve && !strcmp(s, "server")) return key_server(c, s, k, v);
    return cfg_fail(c, s, k, "unknown section [%s] (known: model, engine, spec, sampling, %s)", s,
                    c->serve ? "server" : "job");
}

/* inih's line reader, counting lines for the messages.  A line that does not fit
 * inih's buffer would be cut (its value silently shortened): refused. */
typedef struct line_src {
    FILE *f;
    cli_job_cfg *c;
} line_src;

static char *read_line(char *buf, int n, void *stream) {
    line_src *ls = stream;
    if (ls->c->err[0]) return NULL;
    char *r = fgets(buf, n, ls->f);
    if (!r) return NULL;
    ls->c->line++;
    size_t len = strlen(buf);
    if (len + 1 == (size_t)n && buf[len - 1] != '\n') { /* full: the line fits if it ends here */
        int ch = getc(ls->f);
        if (ch != '\n' && ch != EOF) {
            snprintf(ls->c->err, sizeof ls->c->err, "%s:%d: line longer than %d bytes (inih's limit)", ls->c->file,
                     ls->c->line, n - 1);
            return NULL;
        }
    }
    return r;
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static void cfg_init(cli_job_cfg *c, const char *path, const tandem_generate_params *defaults, bool serve) {
    memset(c, 0, sizeof *c);
    c->serve = serve;
    if (serve) {
        snprintf(c->server.host, sizeof c->server.host, "127.0.0.1");
        c->server.port = 8080;
        c->server.max_queue = 64;
        c->server.max_body_kb = 1024;
        c->server.shutdown_grace_s = 10;
        c->server.max_connections = CLI_CONNECTIONS_DEFAULT;
        c->server.max_connections_per_ip = CLI_CONNECTIONS_PER_IP_DEFAULT;
        c->server.read_timeout_s = 30;
        c->server.idle_timeout_s = 75;
    }
    c->gp = *defaults;
    c->gp.stop = NULL;
    c->gp.n_stop = 0;
    c->spec_ngram = c->gp.spec_ngram;
    c->spec_k_max = c->gp.spec_k_max;
    c->max_batch = 8;
    c->block_size = 16;
    c->tensor_parallel = 1;
    c->draft_vocab = TANDEM_DRAFT_VOCAB_AUTO;
    c->prefix_cache = c->batch_invariant = -1; /* (not set: the engine's defaults) */
    c->file = path;
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(c->dir, sizeof c->dir, "%.*s", (int)(slash - path), path);
    else snprintf(c->dir, sizeof c->dir, ".");
}

/* The --set overrides (section.key=value). */
static bool apply_sets(cli_job_cfg *c, char **sets, int n_sets) {
    for (int i = 0; i < n_sets; i++) {
        c->file = "--set";
        c->line = 0;
        char *buf = strdup(sets[i]); /* (any length) */
        if (!buf) return snprintf(c->err, sizeof c->err, "--set: out of memory"), false;
        char *dot = strchr(buf, '.'), *eq = strchr(buf, '=');
        if (!dot || !eq || dot > eq) {
            snprintf(c->err, sizeof c->err, "--set %s: expected section.key=value", sets[i]);
            free(buf);
            return false;
        }
        *dot = *eq = 0;
        const int ok = on_key(c, buf, dot + 1, eq + 1);
        free(buf);
        if (!ok) return false;
    }
    return true;
}

/* The checks of the whole: required keys, files that exist, keys that need others. */
static bool check_cfg(cli_job_cfg *c, const char *path) {
    c->file = path;
    c->line = 0;
    if (!c->serve && !c->target[0]) return cfg_fail(c, "model", "target", "required"), false; /* (serve: or -m) */
    if (!c->serve && !c->input[0]) return cfg_fail(c, "job", "input", "required"), false;
    if (!c->serve && !c->output[0]) return cfg_fail(c, "job", "output", "required"), false;
    const struct { const char *sec, *key, *path, *file; int line; } files[] = {
        {"model", "target", c->target, c->target_file, c->target_line},
        {"model", "draft", c->draft, c->draft_file, c->draft_line},
        {"job", "input", c->input, c->input_file, c->input_line}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (files[i].path[0] && !exists(files[i].path)) {
            c->file = files[i].file, c->line = files[i].line;
            return cfg_fail(c, files[i].sec, files[i].key, "%s: no such file", files[i].path), false;
        }
    if (!c->draft[0] && (c->spec_k != 0 || c->p_min > 0))
        return cfg_fail(c, "spec", "k", "needs [model] draft"), false;
    if (!c->draft[0] && c->spec_tree != 0) return cfg_fail(c, "spec", "tree", "needs [model] draft"), false;
    return true;
}

static bool cfg_read(FILE *f, const char *path, const tandem_generate_params *defaults, char **sets, int n_sets,
                     bool serve, cli_job_cfg *c) {
    cfg_init(c, path, defaults, serve);
    line_src ls = {f, c};
    int r = ini_parse_stream(read_line, &ls, on_key, c);
    if (!c->err[0] && r != 0)
        snprintf(c->err, sizeof c->err, "%s:%d: not INI syntax (expected [section] or key = value)", path, r);
    if (c->err[0] || !apply_sets(c, sets, n_sets) || !check_cfg(c, path)) return false;
    c->gp.stop = (const char *const *)c->stop;
    c->gp.n_stop = c->n_stop;
    return true;
}

static bool cfg_load(const char *path, const tandem_generate_params *defaults, char **sets, int n_sets, bool serve,
                     cli_job_cfg *c) {
    FILE *f = fopen(path, "r");
    if (!f) {
        cfg_init(c, path, defaults, serve);
        snprintf(c->err, sizeof c->err, "%s: %s", path, strerror(errno));
        return false;
    }
    bool ok = cfg_read(f, path, defaults, sets, n_sets, serve, c);
    fclose(f);
    return ok;
}

bool cli_job_cfg_read(FILE *f, const char *path, const tandem_generate_params *defaults, char **sets, int n_sets,
                      cli_job_cfg *c) {
    return cfg_read(f, path, defaults, sets, n_sets, false, c);
}

bool cli_job_cfg_load(const char *path, const tandem_generate_params *defaults, char **sets, int n_sets,
                      cli_job_cfg *c) {
    return cfg_load(path, defaults, sets, n_sets, false, c);
}

bool cli_serve_cfg_load(const char *path, const tandem_generate_params *defaults, char **sets, int n_sets,
                        cli_job_cfg *c) {
    return cfg_load(path, defaults, sets, n_sets, true, c);
}

void cli_serve_cfg_init(cli_job_cfg *c, const tandem_generate_params *defaults) {
    cfg_init(c, "command line", defaults, true);
}

void cli_job_cfg_free(cli_job_cfg *c) {
    if (!c) return;
    tdm_arg_stop_free(c->stop, c->n_stop);
    c->stop = NULL;
    c->n_stop = 0;
    c->gp.stop = NULL;
    c->gp.n_stop = 0;
}
