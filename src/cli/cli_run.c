/* cli_run.c - `tandem run JOB.ini`: a batch job described by an INI file (inih).
 *
 *   [model]    target, draft
 *   [engine]   backend (cpu|cuda), threads, max_batch, block_size, kv_mem_mb, gpu_mem_mb
 *   [spec]     k (a number or auto), k_max, ngram, p_min, tree (off)
 *   [sampling] temperature, top_k, top_p, min_p, seed, max_tokens
 *   [job]      input, output
 *
 * Paths are relative to the config file; `--set section.key=value` overrides a key.
 * Every unknown section or key, bad value and missing file is reported as FILE:LINE
 * with the key, and nothing runs on a bad config.  The input is JSON lines as for
 * `tandem generate --prompts` (a malformed line becomes an error line of the output;
 * the job goes on); the output has one JSON line per input line, the fields of
 * `tandem generate --json` (or {"id", "error"}), written as each batch of requests
 * completes and flushed.  A job restarted on the same output skips the ids already
 * there (a last line cut short by a kill is dropped and redone), so a killed job
 * loses and duplicates nothing.  `--shard I/N` takes only the lines whose id hashes to
 * shard I of N.  Progress goes to stderr (a bar on a terminal, lines otherwise), and
 * a summary at the end.
 */
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "json.h"

typedef struct job_cfg {
    char dir[PATH_MAX];          /* the config file's directory */
    char target[PATH_MAX], draft[PATH_MAX], input[PATH_MAX], output[PATH_MAX];
    int target_line, draft_line, input_line; /* where they were set (0: --set) */
    const char *target_file, *draft_file, *input_file;
    tandem_backend_kind backend;
    int threads, max_batch, block_size;
    long kv_mem_mb, gpu_mem_mb;
    int spec_k, spec_k_max, spec_ngram;
    float p_min;
    tandem_generate_params gp;   /* [sampling] */
    /* where the first problem was found */
    char err[PATH_MAX + 512];
    const char *file;            /* the config's path, or "--set" */
    int line;                    /* current line (the reader counts them) */
} job_cfg;

static int cfg_fail(job_cfg *c, const char *section, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int cfg_fail(job_cfg *c, const char *section, const char *key, const char *fmt, ...) {
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

static bool parse_float(const char *v, double lo, double hi, bool lo_open, float *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || !isfinite(x) || x > hi || (lo_open ? x <= lo : x < lo)) return false;
    *out = (float)x;
    return true;
}

/* A path value: relative ones are taken from the config file's directory. */
static int set_path(job_cfg *c, const char *section, const char *key, const char *v, char *dst) {
    if (!*v) return cfg_fail(c, section, key, "empty path");
    int k = v[0] == '/' ? snprintf(dst, PATH_MAX, "%s", v) : snprintf(dst, PATH_MAX, "%s/%s", c->dir, v);
    if (k < 0 || k >= PATH_MAX) return cfg_fail(c, section, key, "path too long");
    return 1;
}

#define INT_KEY(sec, name, lo, hi, field)                                                              \
    if (!strcmp(s, sec) && !strcmp(k, name)) {                                                        \
        long x;                                                                                        \
        if (!parse_long(v, lo, hi, &x)) return cfg_fail(c, s, k, "'%s' is not an integer in [%ld, %ld]", v, (long)(lo), (long)(hi)); \
        field = (int)x;                                                                                \
        return 1;                                                                                      \
    }

static int on_key(void *user, const char *s, const char *k, const char *v) {
    job_cfg *c = user;
    if (c->err[0]) return 0;
    if (!strcmp(s, "model")) {
        if (!strcmp(k, "target")) return c->target_line = c->line, c->target_file = c->file, set_path(c, s, k, v, c->target);
        if (!strcmp(k, "draft")) {
            c->draft_line = c->line, c->draft_file = c->file;
            return *v ? set_path(c, s, k, v, c->draft) : (c->draft[0] = 0, 1);
        }
        return cfg_fail(c, s, k, "unknown key (known: target, draft)");
    }
    if (!strcmp(s, "job")) {
        if (!strcmp(k, "input")) return c->input_line = c->line, c->input_file = c->file, set_path(c, s, k, v, c->input);
        if (!strcmp(k, "output")) return set_path(c, s, k, v, c->output);
        return cfg_fail(c, s, k, "unknown key (known: input, output)");
    }
    if (!strcmp(s, "engine")) {
        if (!strcmp(k, "backend")) {
            if (!strcmp(v, "cpu")) c->backend = TANDEM_BACKEND_CPU;
            else if (!strcmp(v, "cuda")) c->backend = TANDEM_BACKEND_CUDA;
            else return cfg_fail(c, s, k, "'%s' is not cpu or cuda", v);
            return 1;
        }
        INT_KEY("engine", "threads", 0, TANDEM_THREADS_MAX, c->threads)
        INT_KEY("engine", "max_batch", 1, CLI_BATCH_MAX, c->max_batch)
        INT_KEY("engine", "block_size", 1, 4096, c->block_size)
        if (!strcmp(k, "kv_mem_mb") || !strcmp(k, "gpu_mem_mb")) {
            long x;
            if (!parse_long(v, 1, 1L << 30, &x)) return cfg_fail(c, s, k, "'%s' is not a size in MiB in [1, 2^30]", v);
            if (!strcmp(k, "kv_mem_mb")) c->kv_mem_mb = x;
            else c->gpu_mem_mb = x;
            return 1;
        }
        return cfg_fail(c, s, k, "unknown key (known: backend, threads, max_batch, block_size, kv_mem_mb, gpu_mem_mb)");
    }
    if (!strcmp(s, "spec")) {
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
        INT_KEY("spec", "k_max", 1, TANDEM_SPEC_K_MAX, c->spec_k_max)
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
            if (strcmp(v, "off") != 0) return cfg_fail(c, s, k, "'%s': token trees are not implemented yet (only off)", v);
            return 1;
        }
        return cfg_fail(c, s, k, "unknown key (known: k, k_max, ngram, p_min, tree)");
    }
    if (!strcmp(s, "sampling")) {
        tandem_generate_params *g = &c->gp;
        if (!strcmp(k, "temperature")) {
            if (!parse_float(v, 0, FLT_MAX, false, &g->temperature)) return cfg_fail(c, s, k, "'%s' is not a number >= 0", v);
            return 1;
        }
        if (!strcmp(k, "top_p")) {
            if (!parse_float(v, 0, 1, true, &g->top_p)) return cfg_fail(c, s, k, "'%s' is not a number in (0, 1]", v);
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
        INT_KEY("sampling", "top_k", 0, INT_MAX, g->top_k)
        INT_KEY("sampling", "max_tokens", 0, INT_MAX, g->max_tokens)
        return cfg_fail(c, s, k, "unknown key (known: temperature, top_k, top_p, min_p, seed, max_tokens)");
    }
    return cfg_fail(c, s, k, "unknown section [%s] (known: model, engine, spec, sampling, job)", s);
}

/* inih's line reader, counting lines for the messages. */
typedef struct line_src {
    FILE *f;
    job_cfg *c;
} line_src;

static char *read_line(char *buf, int n, void *stream) {
    line_src *ls = stream;
    char *r = fgets(buf, n, ls->f);
    if (r) ls->c->line++;
    return r;
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* Reads the config and applies the --set overrides; false with c->err set. */
static bool load_cfg(const char *path, char **sets, int n_sets, job_cfg *c) {
    memset(c, 0, sizeof *c);
    c->gp = tandem_generate_default_params();
    c->spec_ngram = c->gp.spec_ngram;
    c->spec_k_max = c->gp.spec_k_max;
    c->max_batch = 8;
    c->block_size = 16;
    c->file = path;
    const char *slash = strrchr(path, '/');
    if (slash) snprintf(c->dir, sizeof c->dir, "%.*s", (int)(slash - path), path);
    else snprintf(c->dir, sizeof c->dir, ".");
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(c->err, sizeof c->err, "%s: %s", path, strerror(errno));
        return false;
    }
    line_src ls = {f, c};
    int r = ini_parse_stream(read_line, &ls, on_key, c);
    fclose(f);
    if (c->err[0]) return false;
    if (r != 0) {
        snprintf(c->err, sizeof c->err, "%s:%d: not INI syntax (expected [section] or key = value)", path, r);
        return false;
    }
    for (int i = 0; i < n_sets; i++) { /* section.key=value */
        c->file = "--set";
        c->line = 0;
        char buf[2048];
        snprintf(buf, sizeof buf, "%s", sets[i]);
        char *dot = strchr(buf, '.'), *eq = strchr(buf, '=');
        if (!dot || !eq || dot > eq) {
            snprintf(c->err, sizeof c->err, "--set %s: expected section.key=value", sets[i]);
            return false;
        }
        *dot = *eq = 0;
        if (!on_key(c, buf, dot + 1, eq + 1)) return false;
    }
    c->file = path;
    c->line = 0;
    if (!c->target[0]) return cfg_fail(c, "model", "target", "required"), false;
    if (!c->input[0]) return cfg_fail(c, "job", "input", "required"), false;
    if (!c->output[0]) return cfg_fail(c, "job", "output", "required"), false;
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
    return true;
}

/* ---- output: resuming -------------------------------------------------------------- */

/* An id as the output writes it (the JSON text of the value). */
static char *id_text(const cli_prompt *p) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    if (!m) return NULL;
    cli_prompt_write_id(m, p, true);
    fclose(m);
    return buf;
}

/* The ids of the output's complete lines (sorted), after cutting a last line a kill
 * left without its newline; n_done = how many. */
static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static bool done_ids(const char *path, char ***ids, size_t *n_done, char *err, size_t cap) {
    *ids = NULL;
    *n_done = 0;
    FILE *f = fopen(path, "r+");
    if (!f) return errno == ENOENT ? true : (snprintf(err, cap, "%s: %s", path, strerror(errno)), false);
    char *line = NULL;
    size_t lcap = 0, n = 0, cap_ids = 0;
    long good_end = 0;
    ssize_t got;
    char **v = NULL;
    while ((got = getline(&line, &lcap, f)) > 0) {
        if (line[got - 1] != '\n') break; /* cut short: dropped below */
        good_end = ftell(f);
        tdm_json *j = NULL;
        tdm_err jerr = {0};
        if (tdm_json_parse(line, (size_t)got - 1, &j, &jerr) != TANDEM_OK) continue;
        const tdm_json *id = tdm_json_get(j, "id");
        if (id) {
            char *t = NULL;
            size_t tl = 0;
            FILE *m = open_memstream(&t, &tl);
            if (m) {
                if (id->type == TDM_JSON_STRING) tdm_json_write_str(m, id->str, id->str_len);
                else fwrite(id->str, 1, id->str_len, m);
                fclose(m);
                if (n == cap_ids) {
                    cap_ids = cap_ids ? 2 * cap_ids : 64;
                    v = realloc(v, cap_ids * sizeof *v);
                }
                v[n++] = t;
            }
        }
        tdm_json_free(j);
    }
    free(line);
    bool ok = ftruncate(fileno(f), good_end) == 0;
    fclose(f);
    if (!ok) {
        snprintf(err, cap, "%s: cannot cut its incomplete last line: %s", path, strerror(errno));
        return false;
    }
    if (n) qsort(v, n, sizeof *v, cmp_str);
    *ids = v;
    *n_done = n;
    return true;
}

static bool is_done(char **ids, size_t n, const char *id) {
    return n && bsearch(&id, ids, n, sizeof *ids, cmp_str) != NULL;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* ---- progress ---------------------------------------------------------------------- */

static void progress(bool tty, size_t done, size_t total, uint64_t tokens, double t0, bool last) {
    const double dt = tdm_now() - t0, rate = dt > 0 ? (double)tokens / dt : 0.0;
    const double eta = done > 0 && done < total ? dt * (double)(total - done) / (double)done : 0.0;
    if (tty) {
        const int w = 30, fill = total ? (int)((double)w * (double)done / (double)total) : w;
        fprintf(stderr, "\r[%.*s%*s] %zu/%zu requests, %.0f tok/s, ETA %.0f s%s", fill,
                "##############################", w - fill, "", done, total, rate, eta, last ? "\n" : "");
    } else {
        fprintf(stderr, "run: %zu/%zu requests, %llu tokens, %.0f tok/s, ETA %.0f s\n", done, total,
                (unsigned long long)tokens, rate, eta);
    }
    fflush(stderr);
}

/* ---- the job ----------------------------------------------------------------------- */

static int usage_run(const char *msg) { return cli_usage_error("%s", msg); }

int cli_run(int argc, char **argv) {
    const char *path = NULL;
    char **sets = calloc((size_t)argc, sizeof *sets);
    int n_sets = 0;
    long shard_i = 0, shard_n = 1;
    if (!sets) return cli_error("out of memory");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            sets[n_sets++] = argv[++i];
        } else if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            char *sl = strchr(argv[++i], '/');
            if (!sl || sscanf(argv[i], "%ld/%ld", &shard_i, &shard_n) != 2 || shard_n < 1 || shard_i < 0 ||
                shard_i >= shard_n) {
                free(sets);
                return cli_usage_error("--shard %s: expected I/N with 0 <= I < N", argv[i]);
            }
        } else if (argv[i][0] == '-' || path) {
            free(sets);
            return cli_usage_error("run: unexpected argument '%s'", argv[i]);
        } else {
            path = argv[i];
        }
    }
    if (!path) {
        free(sets);
        return usage_run("run: missing JOB.ini");
    }
    job_cfg c;
    bool ok = load_cfg(path, sets, n_sets, &c);
    free(sets);
    if (!ok) return cli_error("%s", c.err);

    char err[PATH_MAX + 512];
    cli_prompts in;
    if (!cli_prompts_read_lenient(c.input, &in, err, sizeof err)) return cli_error("%s", err);
    char **done = NULL;
    size_t n_done = 0;
    if (!done_ids(c.output, &done, &n_done, err, sizeof err)) {
        cli_prompts_free(&in);
        return cli_error("%s", err);
    }
    /* the requests this run owes: not done, in this shard */
    size_t *todo = calloc(in.n ? in.n : 1, sizeof *todo), n_todo = 0, n_skipped = 0;
    char **ids = calloc(in.n ? in.n : 1, sizeof *ids);
    for (size_t i = 0; i < in.n && todo && ids; i++) {
        ids[i] = id_text(&in.items[i]);
        if (!ids[i]) continue;
        if (shard_n > 1 && fnv1a(ids[i]) % (uint64_t)shard_n != (uint64_t)shard_i) continue;
        if (is_done(done, n_done, ids[i])) {
            n_skipped++;
            continue;
        }
        todo[n_todo++] = i;
    }
    for (size_t i = 0; i < n_done; i++) free(done[i]);
    free(done);

    int rc = CLI_EXIT_OK;
    tandem_model *target = NULL, *draft = NULL;
    tandem_engine *eng = NULL;
    FILE *out = NULL;
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = c.backend;
    tandem_status s = tandem_model_open(c.target, &mp, &target);
    if (!s && c.draft[0]) s = tandem_model_open(c.draft, &mp, &draft);
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = c.threads;
    ep.n_seq_max = c.max_batch;
    ep.kv_block_size = c.block_size;
    ep.kv_bytes = (size_t)c.kv_mem_mb << 20;
    ep.gpu_mem = (size_t)c.gpu_mem_mb << 20;
    if (!s) s = tandem_engine_open(target, draft, &ep, &eng);
    if (s) {
        rc = cli_status_error(s, NULL);
        goto done;
    }
    out = fopen(c.output, "a");
    if (!out) {
        rc = cli_error("%s: %s", c.output, strerror(errno));
        goto done;
    }
    const bool tty = isatty(STDERR_FILENO);
    const double t0 = tdm_now();
    uint64_t tokens = 0, drafted = 0, accepted = 0;
    size_t n_err = 0, n_fin = 0;
    /* windows of requests: each runs as one batch and is written when it completes */
    const size_t win = (size_t)c.max_batch * 4;
    tandem_request *req = calloc(win, sizeof *req);
    tandem_result *res = calloc(win, sizeof *res);
    if (!req || !res) {
        free(req), free(res);
        rc = cli_error("out of memory");
        goto done;
    }
    for (size_t w0 = 0; w0 < n_todo; w0 += win) {
        const size_t m = n_todo - w0 < win ? n_todo - w0 : win;
        size_t nr = 0, map[win ? win : 1];
        int32_t *tok[win ? win : 1];
        for (size_t j = 0; j < m; j++) {
            const cli_prompt *p = &in.items[todo[w0 + j]];
            if (p->error) continue;
            tandem_generate_params gp = c.gp;
            if (p->has_seed) gp.seed = p->seed;
            if (p->has_max_tokens) gp.max_tokens = p->max_tokens;
            if (p->has_temperature) gp.temperature = p->temperature;
            if (draft) {
                gp.spec_k = c.spec_k;
                gp.spec_k_max = c.spec_k_max;
                if (gp.spec_k_min > gp.spec_k_max) gp.spec_k_min = gp.spec_k_max;
                gp.spec_p_min = c.p_min;
                gp.spec_ngram = c.spec_ngram;
            }
            req[nr] = (tandem_request){NULL, NULL, 0, gp};
            tok[nr] = NULL;
            if (memchr(p->text, '\0', p->len)) { /* NUL bytes: tokenized with its length */
                size_t nt = 0;
                if (tandem_tokenize(target, p->text, p->len, true, &tok[nr], &nt) != TANDEM_OK) tok[nr] = NULL, nt = 0;
                req[nr].prompt_ids = tok[nr];
                req[nr].n_prompt_ids = nt;
            } else {
                req[nr].prompt = p->text;
            }
            map[nr++] = j;
        }
        if (nr && (s = tandem_generate_batch(eng, req, nr, res)) != TANDEM_OK) {
            rc = cli_status_error(s, NULL);
            break;
        }
        /* the window's lines in input order */
        for (size_t j = 0, r = 0; j < m; j++) {
            const cli_prompt *p = &in.items[todo[w0 + j]];
            const tandem_result *x = r < nr && map[r] == j ? &res[r++] : NULL;
            const char *e = p->error ? p->error : x && x->status ? (x->error ? x->error : "error") : NULL;
            if (e) {
                fprintf(out, "{\"id\": %s, \"error\": ", ids[todo[w0 + j]]);
                tdm_json_write_str(out, e, strlen(e));
                fputs("}\n", out);
                n_err++;
            } else {
                cli_json_result(out, p, x, draft != NULL);
                tokens += x->n_tokens;
                drafted += x->spec.drafted;
                accepted += x->spec.accepted;
            }
            n_fin++;
        }
        fflush(out);
        for (size_t r = 0; r < nr; r++) {
            tandem_result_free(&res[r]);
            tandem_free(tok[r]);
        }
        progress(tty, n_fin, n_todo, tokens, t0, n_fin == n_todo);
    }
    free(req), free(res);
    {
        const double dt = tdm_now() - t0;
        fprintf(stderr, "run: %zu requests (%zu already done, %zu errors), %llu tokens in %.1f s: %.0f tok/s", n_fin,
                n_skipped, n_err, (unsigned long long)tokens, dt, dt > 0 ? (double)tokens / dt : 0.0);
        if (draft && drafted) fprintf(stderr, ", acceptance %.3f", (double)accepted / (double)drafted);
        fputc('\n', stderr);
    }
    if (n_err && rc == CLI_EXIT_OK) rc = CLI_EXIT_ERROR;

done:
    if (out && fclose(out) != 0 && rc == CLI_EXIT_OK) rc = cli_error("%s: %s", c.output, strerror(errno));
    tandem_engine_close(eng);
    tandem_model_close(draft);
    tandem_model_close(target);
    for (size_t i = 0; i < in.n && ids; i++) free(ids[i]);
    free(ids);
    free(todo);
    cli_prompts_free(&in);
    return rc;
}
