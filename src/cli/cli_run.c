/* cli_run.c - `tandem run JOB.ini`: a batch job described by an INI file (the keys:
 * job_config.c).
 *
 * Nothing runs on a bad config, nor on an input with an id twice (job_ids.c).  The
 * input is JSON lines as for `tandem generate --prompts` (prompts.c; a malformed line
 * becomes an error line of the output; the job goes on); the output has one JSON line
 * per input line, the fields of `tandem generate --json` (or {"id", "error"}), written
 * the moment each request completes: the scheduler is fed continuously (a new request
 * whenever one finishes, max_batch * 4 read ahead), so the lines come in the order the
 * requests finish, not the input's (`tandem merge --sort` restores the input order).  The output is a regular file, locked for the
 * run (line_out.c: a second runner on it is refused at once), written whole lines at a
 * time and synced at the end; a failed write (a full disk) stops the job with its
 * cause, the file cut back to its last complete line.  A job restarted on the same
 * output skips the ids already there (a last line cut short by a kill is dropped and
 * redone), so a killed or failed job loses and duplicates nothing.  `--shard I/N`
 * takes only the lines whose id hashes to shard I of N (`tandem merge` joins the
 * shards' outputs).  Progress goes to stderr (a bar on a terminal, lines otherwise),
 * and a summary at the end.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "json.h"

/* ---- output: resuming -------------------------------------------------------------- */

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Appends the id of one output line (a line that does not parse or has no id: none). */
static bool add_done_id(const char *line, size_t len, char ***v, size_t *n, size_t *cap) {
    tdm_json *j = NULL;
    tdm_err jerr = {0};
    if (tdm_json_parse(line, len, &j, &jerr) != TANDEM_OK) return true;
    const tdm_json *id = tdm_json_get(j, "id");
    char *t = id ? cli_json_id_text(id) : NULL;
    tdm_json_free(j);
    if (!t) return true;
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 64;
        char **nv = realloc(*v, nc * sizeof *nv);
        if (!nv) return free(t), false;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = t;
    return true;
}

/* The ids of the output's complete lines (sorted), after cutting a last line a kill
 * left without its newline; n_done = how many. */
static bool done_ids(cli_line_out *o, char ***ids, size_t *n_done, char *err, size_t cap) {
    *ids = NULL;
    *n_done = 0;
    const int fd = dup(o->fd);
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return snprintf(err, cap, "%s: %s", o->path, strerror(errno)), false;
    }
    char *line = NULL;
    size_t lcap = 0, n = 0, cap_ids = 0;
    off_t good_end = 0;
    ssize_t got;
    char **v = NULL;
    bool ok = true;
    while (ok && (got = getline(&line, &lcap, f)) > 0) {
        if (line[got - 1] != '\n') break; /* cut short: dropped below */
        good_end += got;
        ok = add_done_id(line, (size_t)got - 1, &v, &n, &cap_ids);
    }
    if (ok && ferror(f)) ok = false, snprintf(err, cap, "%s: %s", o->path, strerror(errno));
    else if (!ok) snprintf(err, cap, "%s: out of memory", o->path);
    free(line);
    fclose(f);
    if (ok && good_end != o->end && !cli_line_out_cut(o, good_end)) ok = false, snprintf(err, cap, "%s", o->err);
    if (!ok) {
        for (size_t i = 0; i < n; i++) free(v[i]);
        free(v);
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

typedef struct run_args {
    const char *path;
    char **sets;                 /* [n_sets] --set values (heap array) */
    int n_sets;
    long shard_i, shard_n;
    char tree_set[96];           /* --spec-tree T as "spec.tree=T" (one of sets) */
} run_args;

/* A count of decimal digits only (no sign, space or base prefix); s advanced past it. */
static bool parse_digits(const char **s, long *out) {
    if (**s < '0' || **s > '9') return false;
    long x = 0;
    for (; **s >= '0' && **s <= '9'; (*s)++) {
        if (x > (LONG_MAX - (**s - '0')) / 10) return false;
        x = x * 10 + (**s - '0');
    }
    *out = x;
    return true;
}

/* --shard I/N: exactly I, '/', N, with 0 <= I < N. */
static bool parse_shard(const char *s, long *i, long *n) {
    return parse_digits(&s, i) && *s++ == '/' && parse_digits(&s, n) && *s == 0 && *i < *n;
}

/* Returns -1 to go on, else an exit code (a->sets is freed by the caller). */
static int parse_run_args(int argc, char **argv, run_args *a) {
    *a = (run_args){.sets = calloc((size_t)argc, sizeof *a->sets), .shard_n = 1};
    if (!a->sets) return cli_error("out of memory");
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (!strcmp(argv[i], "--set") && i + 1 < argc) {
            a->sets[a->n_sets++] = argv[++i];
        } else if (!strcmp(argv[i], "--spec-tree") && i + 1 < argc) {
            if (strlen(argv[++i]) > 64) return cli_usage_error("--spec-tree %.40s...: too long", argv[i]);
            snprintf(a->tree_set, sizeof a->tree_set, "spec.tree=%s", argv[i]);
            a->sets[a->n_sets++] = a->tree_set;
        } else if (!strcmp(argv[i], "--shard") && i + 1 < argc) {
            if (!parse_shard(argv[++i], &a->shard_i, &a->shard_n))
                return cli_usage_error("--shard %s: expected I/N with 0 <= I < N (decimal digits)", argv[i]);
        } else if (i + 1 == argc && (!strcmp(argv[i], "--set") || !strcmp(argv[i], "--spec-tree") ||
                                     !strcmp(argv[i], "--shard"))) {
            return cli_usage_error("option %s needs a value", argv[i]);
        } else if (argv[i][0] == '-' || a->path) {
            return cli_unknown_arg(argv[i]);
        } else {
            a->path = argv[i];
        }
    }
    return a->path ? -1 : cli_usage_error("run: missing JOB.ini");
}

/* What the job did, for the summary. */
typedef struct run_totals {
    size_t n_fin, n_err, n_timeouts;
    uint64_t tokens, drafted, accepted, prompt_tokens, cached_tokens, preemptions;
} run_totals;

typedef struct run_ctx run_ctx;
struct run_ctx {
    const cli_job_cfg *c;
    const cli_prompts *in;
    char **ids;                  /* [in->n] the ids as the output writes them */
    tandem_model *target;
    bool has_draft;
    tandem_engine *eng;
    cli_line_out *out;
    run_totals t;
    size_t n_flight;             /* requests submitted and not finished */
    bool stopped;                /* the job ended: results still arriving are dropped */
    struct run_job_item *items;  /* the on_finish data of the owed inputs (freed after the
                                    engine's close, which may still call on_finish) */
};

/* The inputs this run owes: in this shard and not done (the ids of out's lines). */
static size_t select_todo(run_ctx *x, const run_args *a, char **done, size_t n_done, size_t *todo,
                          size_t *n_skipped) {
    size_t n_todo = 0;
    *n_skipped = 0;
    for (size_t i = 0; i < x->in->n; i++) {
        if (a->shard_n > 1 && fnv1a(x->ids[i]) % (uint64_t)a->shard_n != (uint64_t)a->shard_i) continue;
        if (is_done(done, n_done, x->ids[i])) {
            (*n_skipped)++;
            continue;
        }
        todo[n_todo++] = i;
    }
    return n_todo;
}

tandem_request cli_job_request(const cli_job_cfg *c, bool has_draft) {
    tandem_request rq = tandem_request_default();
    rq.params = c->gp;
    rq.priority = c->priority;
    rq.timeout_ms = c->timeout_ms;
    if (has_draft) {
        tandem_generate_params *g = &rq.params;
        g->spec_k = c->spec_k;
        g->spec_k_max = c->spec_k_max;
        if (g->spec_k_min > g->spec_k_max) g->spec_k_min = g->spec_k_max;
        g->spec_p_min = c->p_min;
        g->spec_ngram = c->spec_ngram;
        g->spec_tree = c->spec_tree_shape[0] ? 0 : c->spec_tree;
        g->spec_tree_shape = c->spec_tree_shape[0] ? c->spec_tree_shape : NULL;
    }
    return rq;
}

/* The request of prompt p: the job's parameters under p's own.  *tok: the ids of a
 * prompt with NUL bytes (tokenized with its length; free with tandem_free). */
static tandem_request make_request(const run_ctx *x, const cli_prompt *p, int32_t **tok) {
    tandem_request rq = cli_job_request(x->c, x->has_draft);
    cli_prompt_apply(p, &rq);
    *tok = NULL;
    if (memchr(p->text, '\0', p->len)) {
        size_t nt = 0;
        if (tandem_tokenize(x->target, p->text, p->len, true, tok, &nt) != TANDEM_OK) *tok = NULL, nt = 0;
        rq.prompt_ids = *tok;
        rq.n_prompt_ids = nt;
    } else {
        rq.prompt = p->text;
    }
    return rq;
}

/* The output line of input i: its result r, or its error (a bad line: r NULL). */
static void write_line(run_ctx *x, size_t i, const tandem_result *r) {
    const cli_prompt *p = &x->in->items[i];
    const char *e = p->error ? p->error : r && r->status ? (r->error ? r->error : "error") : NULL;
    run_totals *t = &x->t;
    FILE *f = cli_line_out_stream(x->out);
    if (e) {
        fprintf(f, "{\"id\": %s, \"error\": ", x->ids[i]);
        tdm_json_write_str(f, e, strlen(e));
        fputs("}\n", f);
        t->n_err++;
    } else {
        cli_json_result(f, p, r, x->has_draft);
        t->tokens += r->n_tokens;
        t->drafted += r->spec.drafted;
        t->accepted += r->spec.accepted;
        t->prompt_tokens += r->n_prompt_tokens;
        t->cached_tokens += r->n_cached_tokens;
        t->preemptions += (uint64_t)(r->n_preemptions > 0 ? r->n_preemptions : 0);
        if (r->finish_reason == TANDEM_FINISH_TIMEOUT) t->n_timeouts++;
    }
    t->n_fin++;
}

/* One owed input in flight: what its on_finish needs. */
typedef struct run_job_item {
    run_ctx *x;
    size_t i;                    /* the input's index */
} run_job_item;

/* An input's result, on the thread that steps: its line written at once (flushed
 * after the step).  After the job stopped (a failed write or step: the engine's close
 * cancels what is left), results are dropped. */
static void on_finish(tandem_request_id id, tandem_result *r, void *user) {
    (void)id;
    run_job_item *it = user;
    run_ctx *x = it->x;
    x->n_flight--;
    if (!x->stopped && !x->out->err[0]) write_line(x, it->i, r);
    tandem_result_free(r);
}

/* Submits owed input todo[k] (a bad line, or a request the engine refuses: its error
 * line written here).  False when the job must stop (out of memory). */
static bool submit_one(run_ctx *x, size_t k, run_job_item *items, const size_t *todo) {
    const cli_prompt *p = &x->in->items[todo[k]];
    if (p->error) return write_line(x, todo[k], NULL), true;
    items[k] = (run_job_item){.x = x, .i = todo[k]};
    int32_t *tok = NULL;
    tandem_request rq = make_request(x, p, &tok);
    const tandem_status s = tandem_engine_submit(x->eng, &rq, on_finish, &items[k], NULL);
    tandem_free(tok);
    if (s == TANDEM_OK) return x->n_flight++, true;
    if (s == TANDEM_ERR_NOMEM) return false;
    tandem_result r = {.status = s, .error = (char *)tandem_last_error(), .finish_reason = TANDEM_FINISH_ERROR};
    write_line(x, todo[k], &r); /* (fails alone, as in a batch) */
    return true;
}

/* Runs every owed input through the engine's scheduler, fed continuously: a new
 * request is submitted whenever one finishes, at most max_batch * 4 queued or
 * running (the read-ahead), in input order.  Each line is written the moment its
 * request completes (flushed after the step that finished it), so the output's
 * order may differ from the input's (`tandem merge --sort` restores it) and a kill
 * loses only the requests in flight.  Returns an exit code. */
static int run_all(run_ctx *x, const size_t *todo, size_t n_todo) {
    run_job_item *items = x->items = calloc(n_todo ? n_todo : 1, sizeof *items);
    const size_t ahead = (size_t)x->c->max_batch * 4;
    int rc = items ? CLI_EXIT_OK : cli_error("out of memory");
    const bool tty = isatty(STDERR_FILENO);
    const double t0 = tdm_now();
    double t_shown = -1.0;
    size_t next = 0, shown = 0;
    tandem_status s = TANDEM_OK;
    while (rc == CLI_EXIT_OK && (next < n_todo || x->n_flight > 0)) {
        while (next < n_todo && x->n_flight < ahead)
            if (!submit_one(x, next++, items, todo)) {
                rc = cli_error("out of memory");
                break;
            }
        if (rc != CLI_EXIT_OK) break;
        if (x->n_flight > 0 && (s = tandem_engine_step(x->eng, NULL)) != TANDEM_OK) break;
        if (x->t.n_fin == shown) continue;
        if (!cli_line_out_flush(x->out)) break;
        shown = x->t.n_fin;
        const double now = tdm_now();
        if (tty || shown == n_todo || t_shown < 0 || now - t_shown >= 1.0) { /* (lines: one a second) */
            progress(tty, shown, n_todo, x->t.tokens, t0, shown == n_todo);
            t_shown = now;
        }
    }
    x->stopped = true; /* (what is still in flight is cancelled by the engine's close) */
    if (rc == CLI_EXIT_OK && (s || x->out->err[0])) {
        if (tty && shown) fputc('\n', stderr); /* (below the bar) */
        rc = s ? cli_status_error(s, NULL)
               : cli_error("%s (the file ends at its last complete line; once the cause is fixed, run the job "
                           "again to complete it)", x->out->err);
    }
    return rc;
}

static void summary(const run_totals *t, size_t n_skipped, double dt, bool has_draft) {
    fprintf(stderr, "run: %zu requests (%zu already done, %zu errors), %llu tokens in %.1f s: %.0f tok/s", t->n_fin,
            n_skipped, t->n_err, (unsigned long long)t->tokens, dt, dt > 0 ? (double)t->tokens / dt : 0.0);
    if (has_draft && t->drafted) fprintf(stderr, ", acceptance %.3f", (double)t->accepted / (double)t->drafted);
    fprintf(stderr, ", prefix cache %llu of %llu prompt tokens (%.1f%%), %llu preemptions, %zu timeouts\n",
            (unsigned long long)t->cached_tokens, (unsigned long long)t->prompt_tokens,
            t->prompt_tokens ? 100.0 * (double)t->cached_tokens / (double)t->prompt_tokens : 0.0,
            (unsigned long long)t->preemptions, t->n_timeouts);
}

int cli_job_open_engine(const cli_job_cfg *c, bool (*progress)(float, void *), void *progress_user,
                        tandem_model **target, tandem_model **draft, tandem_engine **eng) {
    tandem_model_params mp = tandem_model_default_params();
    mp.backend = c->backend;
    mp.progress_callback = progress;
    mp.progress_callback_user_data = progress_user;
    mp.weights = c->weights; /* (both models) */
    mp.tensor_parallel = c->tensor_parallel > 0 ? c->tensor_parallel : 1; /* (the target only) */
    tandem_status s = tandem_model_open(c->target, &mp, target);
    mp.tensor_parallel = 1;
    if (!s && c->draft[0]) s = tandem_model_open(c->draft, &mp, draft);
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = c->threads;
    ep.n_seq_max = c->max_batch;
    ep.kv_block_size = c->block_size;
    ep.kv_bytes = (size_t)c->kv_mem_mb << 20;
    ep.n_ctx = c->ctx;
    ep.gpu_mem = (size_t)c->gpu_mem_mb << 20;
    ep.max_batch_tokens = c->max_batch_tokens;
    ep.kv_type = c->kv_type;
    ep.draft_vocab = c->draft_vocab;
    if (c->prefix_cache >= 0) ep.prefix_cache = c->prefix_cache;
    if (c->batch_invariant >= 0) ep.batch_invariant = c->batch_invariant;
    if (!s) s = tandem_engine_open(*target, *draft, &ep, eng);
    if (!s) return -1;
    const int rc = s == TANDEM_ERR_CANCELLED && progress ? CLI_EXIT_OK : cli_pair_error(s, c->target, c->draft);
    tandem_model_close(*draft);
    tandem_model_close(*target);
    *target = *draft = NULL;
    return rc;
}

/* The input's ids into x->ids, refused when one appears twice (each such line
 * named).  -1 to go on, else an exit code. */
static int take_input_ids(run_ctx *x, const char *path) {
    cli_ids ids = {0};
    bool ok = cli_ids_of_prompts(&ids, x->in, path);
    if (ok) {
        cli_ids_sort(&ids);
        ok = cli_ids_unique(&ids);
    }
    for (size_t i = 0; ok && i < ids.n; i++) { /* (pushed in input order: seq is the index) */
        x->ids[ids.v[i].seq] = ids.v[i].id;
        ids.v[i].id = NULL;
    }
    cli_ids_free(&ids);
    return ok ? -1 : CLI_EXIT_ERROR;
}

/* The inputs this run owes (todo[*n_todo]): the output's done lines read back (its
 * incomplete last line cut).  -1 to go on, else an exit code. */
static int owed(run_ctx *x, const run_args *a, size_t *todo, size_t *n_todo, size_t *n_skipped) {
    char err[PATH_MAX + 512];
    char **done = NULL;
    size_t n_done = 0;
    if (!done_ids(x->out, &done, &n_done, err, sizeof err)) return cli_error("%s", err);
    *n_todo = select_todo(x, a, done, n_done, todo, n_skipped);
    for (size_t i = 0; i < n_done; i++) free(done[i]);
    free(done);
    return -1;
}

/* The job once its config is read: an exit code.  The input is checked and the output
 * locked before the models load. */
static int run_job(const cli_job_cfg *c, const run_args *a) {
    char err[PATH_MAX + 512];
    cli_prompts in;
    if (!cli_prompts_read_lenient(c->input, &in, err, sizeof err)) return cli_error("%s", err);
    cli_line_out out = {.fd = -1};
    run_ctx x = {.c = c, .in = &in, .ids = calloc(in.n, sizeof *x.ids), .has_draft = c->draft[0] != 0, .out = &out};
    size_t *todo = calloc(in.n, sizeof *todo), n_skipped = 0, n_todo = 0;
    int rc = !todo || !x.ids ? cli_error("out of memory") : take_input_ids(&x, c->input);
    if (rc < 0 && !cli_line_out_open(&out, c->output, false)) rc = cli_error("%s", out.err);
    if (rc < 0) rc = owed(&x, a, todo, &n_todo, &n_skipped);
    tandem_model *target = NULL, *draft = NULL;
    if (rc < 0) rc = cli_job_open_engine(c, NULL, NULL, &target, &draft, &x.eng);
    x.target = target;
    if (rc < 0) /* inputs with "messages": rendered, a failure that input's error */
        rc = cli_render_chats(target, c->chat_template[0] ? c->chat_template : NULL, false, c->input, &in, true);
    if (rc < 0) {
        const double t0 = tdm_now();
        rc = run_all(&x, todo, n_todo);
        if (!out.err[0]) summary(&x.t, n_skipped, tdm_now() - t0, x.has_draft); /* (a failed write: its error) */
        if (x.t.n_err && rc == CLI_EXIT_OK) rc = CLI_EXIT_ERROR;
    }
    const bool reported = out.err[0] != 0;
    if (!cli_line_out_close(&out) && !reported) rc = cli_error("%s", out.err);
    tandem_engine_close(x.eng);
    free(x.items);
    tandem_model_close(draft);
    tandem_model_close(target);
    for (size_t i = 0; i < in.n && x.ids; i++) free(x.ids[i]);
    free(x.ids);
    free(todo);
    cli_prompts_free(&in);
    return rc;
}

int cli_run(int argc, char **argv) {
    run_args a;
    int rc = parse_run_args(argc, argv, &a);
    if (rc >= 0) {
        free(a.sets);
        return rc;
    }
    tandem_generate_params defaults = tandem_generate_default_params();
    cli_job_cfg *c = malloc(sizeof *c);
    if (!c) {
        free(a.sets);
        return cli_error("out of memory");
    }
    bool ok = cli_job_cfg_load(a.path, &defaults, a.sets, a.n_sets, c);
    free(a.sets);
    rc = ok ? run_job(c, &a) : cli_error("%s", c->err);
    cli_job_cfg_free(c);
    free(c);
    return rc;
}
