/* cli_serve.c - `tandem serve`: the OpenAI-compatible HTTP server (src/server/).
 *
 *   tandem serve -m MODEL [-d DRAFT] [--host H] [--port P] [options]
 *   tandem serve CONFIG.ini [options]       (the flags override the file)
 *
 * The file is a job file (job_config.c) with [server] in place of [job].  The server
 * listens first and answers /health with 503 while the models load, then 200.
 * SIGTERM or SIGINT: no new connection or request, the requests in flight get
 * shutdown_grace_s seconds to finish, the rest are cancelled; exit 0.  During the load
 * the signal stops it between two tensors (the load's progress callback looks for it)
 * and the server exits 0 at once. */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cli.h"

#ifdef TDM_HAVE_HTTP
#include "server.h"
#endif

/* The flags, each applied over the config (or the defaults) once it is read. */
enum {
    O_MODEL, O_DRAFT, O_HOST, O_PORT, O_BACKEND, O_API_KEY, O_MAX_QUEUE, O_MAX_BODY, O_TIMEOUT, O_GRACE,
    O_MODEL_NAME, O_CHAT_TEMPLATE, O_THREADS, O_MAX_BATCH, O_KV_TYPE, O_CTX, O_KV_MEM, O_MAX_TOKENS, O_SPEC_K, O_DRAFT_VOCAB, O_SPEC_TREE, O_TP,
    O_MAX_CONN, O_MAX_CONN_IP, O_READ_TIMEOUT, O_IDLE_TIMEOUT, O_LOG_FILE, O_LOG_FORMAT, O_CORS, O_WEIGHTS, O_COUNT
};

static const struct {
    const char *s, *l;
} opt_names[O_COUNT] = {
    [O_MODEL] = {"-m", "--model"}, [O_DRAFT] = {"-d", "--draft"}, [O_HOST] = {NULL, "--host"},
    [O_PORT] = {NULL, "--port"}, [O_BACKEND] = {NULL, "--backend"}, [O_API_KEY] = {NULL, "--api-key"},
    [O_MAX_QUEUE] = {NULL, "--max-queue"}, [O_MAX_BODY] = {NULL, "--max-body-kb"},
    [O_TIMEOUT] = {NULL, "--request-timeout"}, [O_GRACE] = {NULL, "--shutdown-grace"},
    [O_MODEL_NAME] = {NULL, "--model-name"}, [O_CHAT_TEMPLATE] = {NULL, "--chat-template"},
    [O_THREADS] = {"-t", "--threads"}, [O_MAX_BATCH] = {NULL, "--max-batch"}, [O_KV_TYPE] = {NULL, "--kv-type"},
    [O_CTX] = {NULL, "--ctx"}, [O_KV_MEM] = {NULL, "--kv-mem"},
    [O_MAX_TOKENS] = {"-n", "--max-tokens"}, [O_SPEC_K] = {NULL, "--spec-k"},
    [O_DRAFT_VOCAB] = {NULL, "--draft-vocab"}, [O_SPEC_TREE] = {NULL, "--spec-tree"},
    [O_TP] = {NULL, "--tensor-parallel"}, [O_MAX_CONN] = {NULL, "--max-connections"},
    [O_MAX_CONN_IP] = {NULL, "--max-connections-per-ip"}, [O_READ_TIMEOUT] = {NULL, "--read-timeout"},
    [O_IDLE_TIMEOUT] = {NULL, "--idle-timeout"}, [O_LOG_FILE] = {NULL, "--log-file"},
    [O_LOG_FORMAT] = {NULL, "--log-format"}, [O_CORS] = {NULL, "--cors-origin"}, [O_WEIGHTS] = {NULL, "--weights"},
};

typedef struct serve_args {
    const char *config;
    const char *val[O_COUNT];    /* each flag's value as given (NULL: not given) */
    const char *name[O_COUNT];   /* the flag as written, for messages */
    char **sets;                 /* [n_sets] --set values (heap array) */
    int n_sets;
} serve_args;

/* Returns -1 to go on, else an exit code. */
static int parse_args(int argc, char **argv, serve_args *a) {
    memset(a, 0, sizeof *a);
    if (!(a->sets = calloc((size_t)argc, sizeof *a->sets))) return cli_error("out of memory");
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
        const char *v = NULL;
        bool missing = false, taken = false;
        for (int o = 0; o < O_COUNT && !taken; o++) {
            const char *arg = argv[i];
            if (cli_take(argc, argv, &i, opt_names[o].s, opt_names[o].l, &v, &missing)) {
                if (missing) return CLI_EXIT_USAGE;
                a->val[o] = v;
                a->name[o] = arg;
                taken = true;
            }
        }
        if (taken) continue;
        if (cli_take(argc, argv, &i, NULL, "--set", &v, &missing)) {
            if (missing) return CLI_EXIT_USAGE;
            a->sets[a->n_sets++] = (char *)v;
        } else if (argv[i][0] == '-' || a->config) {
            return cli_unknown_arg(argv[i]);
        } else {
            a->config = argv[i];
        }
    }
    if (a->n_sets && !a->config) return cli_usage_error("serve: --set needs CONFIG.ini");
    return -1;
}

/* A path flag into a config path field. */
static bool set_path_flag(const char *opt, const char *v, char *dst) {
    if (strlen(v) >= PATH_MAX || !*v) {
        cli_usage_error("option %s: empty or too long path", opt);
        return false;
    }
    snprintf(dst, PATH_MAX, "%s", v);
    return true;
}

static bool set_str_flag(const char *opt, const char *v, char *dst, size_t cap) {
    if (strlen(v) >= cap) {
        cli_usage_error("option %s: longer than %zu bytes", opt, cap - 1);
        return false;
    }
    snprintf(dst, cap, "%s", v);
    return true;
}

/* The flags over c; false with the usage error printed. */
static bool apply_flags(const serve_args *a, cli_job_cfg *c) {
    cli_server_cfg *sv = &c->server;
    float f = 0;
    int n = 0;
    for (int o = 0; o < O_COUNT; o++) {
        const char *v = a->val[o], *opt = a->name[o];
        if (!v) continue;
        bool ok = true;
        switch (o) {
        case O_MODEL: ok = set_path_flag(opt, v, c->target); break;
        case O_DRAFT: ok = set_path_flag(opt, v, c->draft); break;
        case O_HOST: ok = *v ? set_str_flag(opt, v, sv->host, sizeof sv->host) : (cli_usage_error("option %s: empty", opt), false); break;
        case O_PORT: ok = cli_parse_int(opt, v, 0, 65535, &sv->port); break;
        case O_BACKEND: ok = cli_parse_backend(opt, v, &c->backend); break;
        case O_API_KEY:
            ok = *v ? set_str_flag(opt, v, sv->api_key, sizeof sv->api_key)
                    : (cli_usage_error("option %s: empty (it would let every request in: leave the option out to "
                                       "serve without a key)", opt), false);
            break;
        case O_MAX_QUEUE: ok = cli_parse_int(opt, v, 0, INT_MAX, &sv->max_queue); break;
        case O_MAX_BODY: ok = cli_parse_int(opt, v, 1, 1 << 20, &sv->max_body_kb); break;
        case O_TIMEOUT:
            if ((ok = cli_parse_float(opt, v, 0, TDM_ARG_TIMEOUT_S_MAX, &f))) sv->request_timeout_s = f;
            break;
        case O_GRACE:
            if ((ok = cli_parse_float(opt, v, 0, TDM_ARG_TIMEOUT_S_MAX, &f))) sv->shutdown_grace_s = f;
            break;
        case O_MODEL_NAME: ok = set_str_flag(opt, v, sv->model_name, sizeof sv->model_name); break;
        case O_CHAT_TEMPLATE: ok = set_str_flag(opt, v, c->chat_template, sizeof c->chat_template); break;
        case O_THREADS: ok = cli_parse_int(opt, v, 0, TANDEM_THREADS_MAX, &c->threads); break;
        case O_MAX_BATCH: ok = cli_parse_int(opt, v, 1, CLI_BATCH_MAX, &c->max_batch); break;
        case O_KV_TYPE: ok = cli_parse_kv_type(opt, v, &c->kv_type); break;
        case O_WEIGHTS: ok = cli_parse_weights(opt, v, &c->weights); break;
        case O_CTX: ok = cli_parse_int(opt, v, 1, CLI_CTX_MAX, &c->ctx); break;
        case O_KV_MEM: {
            size_t bytes;
            if ((ok = cli_parse_size(opt, v, &bytes))) c->kv_mem_mb = (long)TDM_MIN(bytes >> 20, (size_t)1 << 30);
            break;
        }
        case O_TP: ok = cli_parse_tensor_parallel(opt, v, &c->tensor_parallel); break;
        case O_MAX_TOKENS:
            if ((ok = cli_parse_int(opt, v, 1, CLI_COUNT_MAX, &n))) c->gp.max_tokens = n;
            break;
        case O_SPEC_K: ok = cli_parse_spec_k(opt, v, &c->spec_k); break;
        case O_DRAFT_VOCAB: ok = cli_parse_draft_vocab(opt, v, &c->draft_vocab); break;
        case O_MAX_CONN: ok = cli_parse_int(opt, v, 1, CLI_CONNECTIONS_MAX, &sv->max_connections); break;
        case O_MAX_CONN_IP: ok = cli_parse_int(opt, v, 0, CLI_CONNECTIONS_MAX, &sv->max_connections_per_ip); break;
        case O_READ_TIMEOUT:
            if ((ok = cli_parse_float_gt(opt, v, 0, CLI_CONN_TIMEOUT_S_MAX, &f))) sv->read_timeout_s = f;
            break;
        case O_IDLE_TIMEOUT:
            if ((ok = cli_parse_float_gt(opt, v, 0, CLI_CONN_TIMEOUT_S_MAX, &f))) sv->idle_timeout_s = f;
            break;
        case O_LOG_FILE: ok = set_path_flag(opt, v, sv->log_file); break;
        case O_LOG_FORMAT:
            if (!(ok = !strcmp(v, "text") || !strcmp(v, "json")))
                cli_usage_error("option %s: '%s' is not text or json", opt, v);
            sv->log_json = !strcmp(v, "json");
            break;
        case O_CORS: {
            char why[160];
            if (!(ok = cli_cors_origin_check(v, why, sizeof why))) cli_usage_error("option %s: %s", opt, why);
            else ok = set_str_flag(opt, v, sv->cors_origin, sizeof sv->cors_origin);
            break;
        }
        case O_SPEC_TREE: {
            char msg[300];
            if (!(ok = tdm_arg_spec_tree_into(v, &c->spec_tree, c->spec_tree_shape, sizeof c->spec_tree_shape, msg,
                                          sizeof msg)))
                cli_usage_error("option %s: %s", opt, msg);
            break;
        }
        }
        if (!ok) return false;
    }
    if (!c->target[0]) {
        cli_usage_error("serve: missing -m MODEL (or CONFIG.ini's [model] target)");
        return false;
    }
    for (int o = O_SPEC_K; o <= O_SPEC_TREE; o++)
        if (!c->draft[0] && a->val[o]) {
            cli_needs(a->name[o], "-d DRAFT");
            return false;
        }
    return true;
}

#ifdef TDM_HAVE_HTTP

/* The id clients name the model by: model_name, else the target's file name without
 * ".gguf". */
static void model_id(const cli_job_cfg *c, char *out, size_t cap) {
    if (c->server.model_name[0]) {
        snprintf(out, cap, "%s", c->server.model_name);
        return;
    }
    const char *slash = strrchr(c->target, '/'), *base = slash ? slash + 1 : c->target;
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".gguf") == 0) n -= 5;
    snprintf(out, cap, "%.*s", (int)n, base);
}

/* A chat template given as a file must be readable before the load begins: its text
 * (heap, *owned) or the value itself (a built-in or model-named template, or inline);
 * NULL with the error printed. */
static const char *template_arg(const cli_job_cfg *c, char **owned) {
    *owned = NULL;
    const char *v = c->chat_template;
    const size_t n = strlen(v);
    const bool inline_text = strstr(v, "{{") || strstr(v, "{%");
    if (!inline_text && (strchr(v, '/') || (n > 6 && !strcmp(v + n - 6, ".jinja")))) {
        FILE *f = fopen(v, "rb");
        if (!f) return cli_error("serve: chat template %s: %s", v, strerror(errno)), NULL;
        fclose(f);
    }
    return cli_chat_template_arg(v, owned);
}

/* The chat template once the model is loaded: the config's, which must render a
 * one-message conversation (else the error is printed and *ok is false); else the
 * model's own, else ChatML (said in the log). */
static const char *chat_template(const cli_job_cfg *c, const char *given, const tandem_model *target, srv_log *log,
                                 bool *ok) {
    tandem_chat_message m = {"user", "hi"};
    char *t = NULL;
    *ok = true;
    if (c->chat_template[0]) {
        if (tandem_chat_render(target, given, &m, 1, true, &t) != TANDEM_OK) {
            *ok = false;
            cli_error("serve: chat template '%.200s' cannot be used with this model: %s", c->chat_template,
                      tandem_last_error());
        }
        tandem_free(t);
        return given;
    }
    if (tandem_chat_render(target, NULL, &m, 1, true, &t) == TANDEM_OK) {
        tandem_free(t);
        return NULL;
    }
    srv_logf(log, "serve: the model has no chat template of its own: /v1/chat/completions uses chatml");
    return "chatml";
}

/* The models' load: its progress goes to /health, and SIGTERM or SIGINT (blocked,
 * so pending) stops it. */
typedef struct load_watch {
    srv *s;
    const sigset_t *sigs;
    int n_models, model;         /* models to load, the one loading (0-based) */
    float last;
    int sig;                     /* the signal that stopped the load, 0 = none */
} load_watch;

static int pending_signal(const sigset_t *sigs) {
    sigset_t p;
    if (sigpending(&p) != 0) return 0;
    for (int sig = 1; sig < NSIG; sig++)
        if (sigismember(sigs, sig) == 1 && sigismember(&p, sig) == 1) return sig;
    return 0;
}

static bool on_load_progress(float progress, void *user) {
    load_watch *w = user;
    if (progress < w->last && w->model + 1 < w->n_models) w->model++; /* (the next model's load began) */
    w->last = progress;
    srv_set_progress(w->s, ((float)w->model + progress) / (float)w->n_models);
    return !(w->sig = pending_signal(w->sigs));
}

/* Enough file descriptors for the connections (the soft limit raised up to the hard
 * one when it is short); false with the error printed. */
static bool fd_room(int max_connections) {
    const rlim_t need = (rlim_t)max_connections + 256; /* (the slack, models, log, engine) */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= need) return true;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need) {
        cli_error("serve: max_connections %d needs %llu open files, but this process may have %llu (ulimit -Hn): "
                  "lower max_connections or raise the limit", max_connections, (unsigned long long)need,
                  (unsigned long long)rl.rlim_max);
        return false;
    }
    rl.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
        cli_error("serve: cannot raise the open files limit to %llu: %s", (unsigned long long)need, strerror(errno));
        return false;
    }
    return true;
}

/* Ready: serves until SIGTERM or SIGINT, then drains; the exit code. */
static int run_ready(const cli_job_cfg *c, srv *s, srv_log *log, tandem_model *target, bool has_draft,
                     tandem_engine *eng, const char *tmpl, const sigset_t *sigs) {
    const cli_server_cfg *sv = &c->server;
    tandem_model_info info;
    tandem_status st = tandem_engine_start(eng);
    if (st == TANDEM_OK) st = tandem_model_get_info(target, &info);
    if (st != TANDEM_OK) return cli_status_error(st, NULL);
    char id[256];
    model_id(c, id, sizeof id);
    srv_model m = {.target = target, .engine = eng, .chat_template = tmpl, .prefix_cache = c->prefix_cache != 0};
    m.lim = (oai_limits){.model_id = id, .n_ctx = tandem_engine_n_ctx(eng), .n_vocab = info.n_vocab, .has_draft = has_draft,
                         .defaults = cli_job_request(c, has_draft).params, .timeout_s = sv->request_timeout_s};
    srv_set_ready(s, &m);
    srv_logf(log, "serve: ready: model '%s'%s, context %d, %d sequences at once, max_queue %d%s%s%s%s%s%s", id,
             has_draft ? " with a draft" : "", m.lim.n_ctx, c->max_batch, sv->max_queue,
             sv->api_key[0] ? ", API key required" : "", sv->cors_origin[0] ? ", CORS for " : "", sv->cors_origin, s->m.tool_format ? ", tool calls in the format " : "",
             s->m.tool_format ? tdm_tool_format_name(s->m.tool_format) : "",
             s->m.reasoning ? ", reasoning split from <think>" : "");
    int sig = 0;
    while (sigwait(sigs, &sig) != 0) {}
    srv_logf(log, "serve: %s: draining (grace %.0f s)", sig == SIGTERM ? "SIGTERM" : "SIGINT", sv->shutdown_grace_s);
    const int n = srv_shutdown(s, sv->shutdown_grace_s);
    srv_logf(log, "serve: stopped (%d requests cancelled)", n);
    return CLI_EXIT_OK;
}

static int serve(const cli_job_cfg *c) {
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* (the threads started below inherit it) */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN); /* (a log file over its size limit: a failed write, reported) */
    const cli_server_cfg *sv = &c->server;
    char err[PATH_MAX + 512];
    if (!fd_room(sv->max_connections)) return CLI_EXIT_ERROR;
    srv_log *log = srv_log_open(sv->log_file[0] ? sv->log_file : NULL, sv->log_json ? SRV_LOG_JSON : SRV_LOG_TEXT,
                                err, sizeof err);
    if (!log) return cli_error("serve: %s", err);
    char *owned_tmpl = NULL;
    const char *given_tmpl = NULL;
    if (c->chat_template[0] && !(given_tmpl = template_arg(c, &owned_tmpl))) {
        srv_log_close(log);
        return CLI_EXIT_ERROR;
    }
    srv_config scfg = {.host = sv->host, .port = sv->port, .api_key = sv->api_key[0] ? sv->api_key : NULL,
                       .max_queue = sv->max_queue, .max_body = (size_t)sv->max_body_kb * 1024, .log = log,
                       .cors_origin = sv->cors_origin[0] ? sv->cors_origin : NULL,
                       .conns = {.max_connections = sv->max_connections, .max_per_ip = sv->max_connections_per_ip,
                                 .read_timeout_s = sv->read_timeout_s, .idle_timeout_s = sv->idle_timeout_s}};
    srv *s = NULL;
    if (!srv_start(&scfg, &s, err, sizeof err)) {
        free(owned_tmpl);
        srv_log_close(log);
        return cli_error("serve: %s", err);
    }
    srv_logf(log, "serve: listening on http://%s:%d (loading %s)", sv->host, srv_port(s), c->target);
    tandem_model *target = NULL, *draft = NULL;
    tandem_engine *eng = NULL;
    load_watch w = {.s = s, .sigs = &sigs, .n_models = c->draft[0] ? 2 : 1};
    int rc = cli_job_open_engine(c, on_load_progress, &w, &target, &draft, &eng);
    if (rc < 0 && !w.sig) w.sig = pending_signal(&sigs); /* (one that came after the last tensor) */
    if (w.sig) {
        srv_logf(log, "serve: %s during the load: stopped", w.sig == SIGTERM ? "SIGTERM" : "SIGINT");
        rc = CLI_EXIT_OK;
    } else if (rc < 0) {
        bool ok;
        const char *tmpl = chat_template(c, given_tmpl, target, log, &ok);
        rc = ok ? run_ready(c, s, log, target, draft != NULL, eng, tmpl, &sigs) : CLI_EXIT_ERROR;
    }
    srv_shutdown(s, 0); /* (a no-op after run_ready's) */
    tandem_engine_close(eng);
    tandem_model_close(draft);
    tandem_model_close(target);
    free(owned_tmpl);
    srv_free(s);
    srv_log_close(log);
    return rc;
}

#else

static int serve(const cli_job_cfg *c) {
    (void)c;
    return cli_error("serve: this tandem was built without HTTP support (libmicrohttpd was not found when it was "
                     "configured: install libmicrohttpd-dev, then meson setup --reconfigure)");
}

#endif

/* Reads the config (or the defaults), puts the flags over it and serves. */
static int serve_config(const serve_args *a) {
    const tandem_generate_params defaults = tandem_generate_default_params();
    cli_job_cfg *c = malloc(sizeof *c); /* (large: paths) */
    if (!c) return cli_error("out of memory");
    int rc = -1;
    if (!a->config) cli_serve_cfg_init(c, &defaults);
    else if (!cli_serve_cfg_load(a->config, &defaults, a->sets, a->n_sets, c)) rc = cli_error("%s", c->err);
    if (rc < 0) rc = apply_flags(a, c) ? serve(c) : CLI_EXIT_USAGE;
    cli_job_cfg_free(c);
    free(c);
    return rc;
}

int cli_serve(int argc, char **argv) {
    serve_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc < 0) rc = serve_config(&a);
    free(a.sets);
    return rc;
}
