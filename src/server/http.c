/* http.c - libmicrohttpd glue of `tandem serve` (server.h): the daemon, routing, the
 * request body, its limit and framing, the API key, /health, /v1/models, /metrics, the
 * request log, shutdown.
 *
 * The daemon runs every connection on a thread of its own (MHD_USE_THREAD_PER_
 * CONNECTION), so a handler may block on its request (gen.c); conn.c keeps slow and
 * idle connections from holding the threads (deadlines, eviction), told of each
 * connection's state here: a new connection and each request line (reading), a
 * request whose body is complete (answering: only then is it counted in n_http), an
 * answer sent (idle).  The body is collected across the access handler's calls up to
 * max_body bytes; a longer one (by its Content-Length or as it arrives) is read to its
 * end and answered 413.  Conflicting Content-Length headers (or one beside
 * Transfer-Encoding) are a 400 that closes the connection: the body's end is unknown.
 * HEAD is answered as GET without the body (libmicrohttpd leaves it out). */
#include <arpa/inet.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "oai_response.h"
#include "server.h"

#define CONNECTION_SLACK 64        /* libmicrohttpd's limit beyond max_connections: room for
                                      the evicted ones until their threads are gone */
#define SHUTDOWN_CANCEL_WAIT_S 1.0 /* after the grace: for the cancelled requests' answers */
#define LOG_URL_MAX 200

/* One HTTP request (libmicrohttpd's per-request context, from its request line). */
typedef struct conn_ctx {
    double t_start;              /* the request line */
    double t_arrival;            /* its headers (the request's arrival for the latencies) */
    bool headers;                /* the access handler was called */
    bool counted;                /* the body is complete: in n_http */
    int status;                  /* the answer's, 0 = none yet */
    char url[LOG_URL_MAX + 1];   /* for the log (control characters replaced) */
    char method[16];
    char *body;
    size_t len, cap;
    bool too_big;
    srv_job *job;                /* a generation's job, for the log line's tokens (a reference) */
} conn_ctx;

/* The origin a CORS answer allows for the request's Origin header: "*", the origin
 * itself when cors_origin lists it, or NULL (no CORS headers). */
static const char *cors_allowed(const srv *s, struct MHD_Connection *c) {
    const char *list = s->cfg.cors_origin;
    if (!list) return NULL;
    if (!strcmp(list, "*")) return "*";
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin || !*origin) return NULL;
    const size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        const size_t k = end ? (size_t)(end - p) : strlen(p);
        if (k == n && !memcmp(p, origin, n)) return origin;
        p += k + (end != NULL);
    }
    return NULL;
}

void srv_cors_headers(const srv *s, struct MHD_Connection *c, struct MHD_Response *r) {
    const char *origin = cors_allowed(s, c);
    if (s->cfg.cors_origin && strcmp(s->cfg.cors_origin, "*") != 0)
        MHD_add_response_header(r, "Vary", "Origin"); /* (the answer depends on it: caches keep them apart) */
    if (!origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
    MHD_add_response_header(r, "Access-Control-Expose-Headers", "Retry-After");
}

/* Queues an answer (body taken over); allow: the Allow header of a 405, close: close the
 * connection after it. */
static int respond(srv *s, struct MHD_Connection *c, int status, const char *type, char *body, size_t len,
                   const char *allow, bool close) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (status == 429 || status == 503) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 401) MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (close) MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    srv_cors_headers(s, c, r);
    const enum MHD_Result q = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return q;
}

int srv_send(srv *s, struct MHD_Connection *c, int status, const char *type, char *body, size_t len) {
    return respond(s, c, status, type, body, len, NULL, false);
}

static int send_error_ex(srv *s, struct MHD_Connection *c, const oai_error *e, const char *allow, bool close) {
    size_t n = 0;
    char *body = oai_error_json(e, &n);
    if (!body) return MHD_NO;
    return respond(s, c, e->status, "application/json", body, n, allow, close);
}

int srv_send_error(srv *s, struct MHD_Connection *c, const oai_error *e) {
    return send_error_ex(s, c, e, NULL, false);
}

/* An OPTIONS preflight of an endpoint with CORS on: 204 with the methods it takes and
 * the headers the browser asks to send (Authorization, Content-Type). */
static int preflight(srv *s, struct MHD_Connection *c, const char *methods, int *status) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    srv_cors_headers(s, c, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", methods);
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", h && *h ? h : "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    *status = 204;
    const enum MHD_Result q = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    return q;
}

/* "Authorization: Bearer KEY" must name the server's key (when it has one). */
static bool authorized(const srv *s, struct MHD_Connection *c) {
    if (!s->cfg.api_key) return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    const size_t a = strlen(h), b = strlen(s->cfg.api_key);
    unsigned diff = a != b; /* compare every byte: no timing hint of a prefix */
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(h[i] ^ s->cfg.api_key[i]);
    return diff == 0;
}

static int health(srv *s, struct MHD_Connection *c, int *status) {
    pthread_mutex_lock(&s->mu);
    const int state = s->state;
    const char *model = state == SRV_READY ? s->m.lim.model_id : NULL;
    const float progress = s->load_progress;
    pthread_mutex_unlock(&s->mu);
    size_t n = 0;
    char *body = oai_health_json(state == SRV_READY ? "ok" : state == SRV_LOADING ? "loading" : "shutting_down", model,
                                 state == SRV_LOADING ? progress : -1.0f, &n);
    *status = state == SRV_READY ? 200 : 503;
    return body ? srv_send(s, c, *status, "application/json", body, n) : MHD_NO;
}

static int metrics(srv *s, struct MHD_Connection *c, int *status) {
    pthread_mutex_lock(&s->mu);
    const bool ready = s->state != SRV_LOADING;
    pthread_mutex_unlock(&s->mu);
    tandem_engine_stats st;
    const bool have = ready && tandem_engine_get_stats(s->m.engine, &st) == TANDEM_OK;
    size_t n = 0;
    char *body = srv_metrics_text(s->metrics, have ? &st : NULL, &n);
    *status = body ? 200 : 500;
    return body ? srv_send(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", body, n) : MHD_NO;
}

/* GET /v1/models, or with id (the rest of /v1/models/{id}) that one model: the
 * served one, else 404. */
static int models(srv *s, struct MHD_Connection *c, const char *id, int *status) {
    pthread_mutex_lock(&s->mu);
    const bool ready = s->state != SRV_LOADING;
    pthread_mutex_unlock(&s->mu);
    oai_error e;
    if (!ready) {
        oai_fail(&e, 503, NULL, "unavailable", "the model is loading");
        *status = 503;
        return srv_send_error(s, c, &e);
    }
    if (id && strcmp(id, s->m.lim.model_id) != 0) {
        oai_fail(&e, 404, "model", "model_not_found", "The model '%.200s' does not exist (this server serves '%s')", id,
                 s->m.lim.model_id);
        *status = 404;
        return srv_send_error(s, c, &e);
    }
    size_t n = 0;
    char *body = id ? oai_model_json(s->m.lim.model_id, s->created, s->m.lim.n_ctx, &n)
                    : oai_models_json(s->m.lim.model_id, s->created, s->m.lim.n_ctx, &n);
    *status = body ? 200 : 500;
    return body ? srv_send(s, c, 200, "application/json", body, n) : MHD_NO;
}

/* POST /tokenize and /detokenize with the served model's tokenizer. */
static int tokens(srv *s, struct MHD_Connection *c, bool detok, const conn_ctx *x, int *status) {
    pthread_mutex_lock(&s->mu);
    const bool ready = s->state != SRV_LOADING;
    pthread_mutex_unlock(&s->mu);
    oai_error e = {0};
    size_t n = 0;
    char *body = NULL;
    if (!ready) oai_fail(&e, 503, NULL, "unavailable", "the model is loading");
    else if (detok) body = oai_detokenize_json(s->m.target, &s->m.lim, x->body ? x->body : "", x->len, &n, &e);
    else body = oai_tokenize_json(s->m.target, &s->m.lim, x->body ? x->body : "", x->len, &n, &e);
    if (!body) {
        *status = e.status ? e.status : 500;
        return srv_send_error(s, c, &e);
    }
    *status = 200;
    return srv_send(s, c, 200, "application/json", body, n);
}

#define MODELS_PREFIX "/v1/models/"

static srv_endpoint endpoint_of(const char *url) {
    if (!strcmp(url, "/v1/completions")) return SRV_EP_COMPLETIONS;
    if (!strcmp(url, "/v1/chat/completions")) return SRV_EP_CHAT;
    if (!strcmp(url, "/v1/models") || !strncmp(url, MODELS_PREFIX, strlen(MODELS_PREFIX))) return SRV_EP_MODELS;
    if (!strcmp(url, "/tokenize")) return SRV_EP_TOKENIZE;
    if (!strcmp(url, "/detokenize")) return SRV_EP_DETOKENIZE;
    if (!strcmp(url, "/health")) return SRV_EP_HEALTH;
    if (!strcmp(url, "/metrics")) return SRV_EP_METRICS;
    return SRV_EP_OTHER;
}

/* The answer of a request whose body is complete. */
static int route(srv *s, struct MHD_Connection *c, const char *url, const char *method, conn_ctx *x, int *status) {
    const srv_endpoint ep = endpoint_of(url);
    const bool post = ep == SRV_EP_COMPLETIONS || ep == SRV_EP_CHAT || ep == SRV_EP_TOKENIZE || ep == SRV_EP_DETOKENIZE;
    const bool allowed = post ? !strcmp(method, "POST") : !strcmp(method, "GET") || !strcmp(method, "HEAD");
    const bool cors = s->cfg.cors_origin != NULL;
    const char *allow = post ? (cors ? "POST, OPTIONS" : "POST") : (cors ? "GET, HEAD, OPTIONS" : "GET, HEAD");
    oai_error e;
    if (ep == SRV_EP_OTHER) {
        oai_fail(&e, 404, NULL, "not_found", "no such endpoint: %s %.200s", method, url);
    } else if (cors && !strcmp(method, "OPTIONS")) {
        return preflight(s, c, allow, status);
    } else if (!allowed) {
        oai_fail(&e, 405, NULL, "method_not_allowed", "%.200s takes %s, not %s", url,
                 post ? "POST" : "GET or HEAD", method);
        *status = e.status;
        return send_error_ex(s, c, &e, allow, false);
    } else if (ep == SRV_EP_HEALTH) {
        return health(s, c, status);
    } else if (ep == SRV_EP_METRICS) {
        return metrics(s, c, status);
    } else if (!authorized(s, c)) {
        oai_fail(&e, 401, NULL, "invalid_api_key", "a valid API key is required (Authorization: Bearer KEY)");
    } else if (ep == SRV_EP_MODELS) {
        return models(s, c, strcmp(url, "/v1/models") ? url + strlen(MODELS_PREFIX) : NULL, status);
    } else if (x->too_big) {
        oai_fail(&e, 413, NULL, "request_too_large", "the request body is larger than the limit of %zu bytes (max_body_kb)",
                 s->cfg.max_body);
    } else if (ep == SRV_EP_TOKENIZE || ep == SRV_EP_DETOKENIZE) {
        return tokens(s, c, ep == SRV_EP_DETOKENIZE, x, status);
    } else {
        return srv_generate(s, c, ep == SRV_EP_CHAT ? OAI_CHAT : OAI_COMPLETION, x->body ? x->body : "", x->len,
                            x->t_arrival, status, &x->job);
    }
    *status = e.status;
    return srv_send_error(s, c, &e);
}

/* Appends a piece of the body (over the limit: dropped, and the request marked). */
static void take_body(srv *s, conn_ctx *x, const char *data, size_t n) {
    if (x->too_big) return;
    if (x->len + n > s->cfg.max_body) {
        x->too_big = true;
        return;
    }
    if (x->len + n + 1 > x->cap) {
        size_t nc = x->cap ? x->cap : 4096;
        while (nc < x->len + n + 1) nc *= 2;
        char *nb = realloc(x->body, nc);
        if (!nb) {
            x->too_big = true; /* (no memory for it: as if it were over the limit) */
            return;
        }
        x->body = nb;
        x->cap = nc;
    }
    memcpy(x->body + x->len, data, n);
    x->len += n;
    x->body[x->len] = '\0';
}

/* Content-Length and Transfer-Encoding headers, for the framing check. */
typedef struct framing {
    const char *length;          /* the first Content-Length */
    bool conflict;               /* another Content-Length with another value */
    bool chunked;                /* a Transfer-Encoding */
} framing;

static enum MHD_Result on_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    framing *f = cls;
    if (!strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING)) f->chunked = true;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) != 0) return MHD_YES;
    if (!f->length) f->length = value ? value : "";
    else if (strcmp(f->length, value ? value : "") != 0) f->conflict = true;
    return MHD_YES;
}

/* A 400 when the request's framing is ambiguous (RFC 9112 6.3: conflicting
 * Content-Length values, or one beside Transfer-Encoding); false when it is not. */
static bool bad_framing(struct MHD_Connection *c, oai_error *e) {
    framing f = {0};
    MHD_get_connection_values(c, MHD_HEADER_KIND, on_header, &f);
    if (f.conflict)
        return !oai_fail(e, 400, NULL, "invalid_framing",
                         "the request has Content-Length headers of different values: its body's end is unknown");
    if (f.length && f.chunked)
        return !oai_fail(e, 400, NULL, "invalid_framing",
                         "the request has both Content-Length and Transfer-Encoding: its body's end is ambiguous");
    return false;
}

static void copy_for_log(char *dst, size_t cap, const char *src) {
    size_t i = 0;
    for (; src && src[i] && i + 1 < cap; i++) dst[i] = (unsigned char)src[i] < 0x20 || src[i] == 0x7f ? '?' : src[i];
    dst[i] = '\0';
}

/* A request line arrived (libmicrohttpd's URI log callback): a request begins. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    srv *s = cls;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_conns_reading(s->conns, ci ? ci->socket_context : NULL);
    conn_ctx *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    x->t_start = tdm_now();
    copy_for_log(x->url, sizeof x->url, uri);
    return x;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    srv *s = cls;
    conn_ctx *x = *con_cls;
    if (!x || !x->headers) { /* the headers: the body (if any) follows */
        if (!x && !(x = *con_cls = calloc(1, sizeof *x))) return MHD_NO;
        x->headers = true;
        x->t_arrival = tdm_now();
        copy_for_log(x->method, sizeof x->method, method);
        oai_error e;
        if (bad_framing(c, &e)) {
            x->status = e.status;
            srv_metrics_request(s->metrics, endpoint_of(url), e.status);
            return send_error_ex(s, c, &e, NULL, true) == MHD_YES ? MHD_YES : MHD_NO;
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->cfg.max_body) x->too_big = true;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        take_body(s, x, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (x->status) return MHD_YES; /* (answered at its headers) */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_conns_answering(s->conns, ci ? ci->socket_context : NULL);
    pthread_mutex_lock(&s->mu);
    s->n_http++;
    pthread_mutex_unlock(&s->mu);
    x->counted = true;
    int status = 500;
    const int r = route(s, c, url, method, x, &status);
    x->status = status;
    srv_metrics_request(s->metrics, endpoint_of(url), status);
    return r == MHD_YES ? MHD_YES : MHD_NO;
}

/* The request's log line: client, request, status (- when none was sent), time. */
static void log_request(srv *s, struct MHD_Connection *c, const conn_ctx *x, enum MHD_RequestTerminationCode code) {
    char who[INET6_ADDRSTRLEN] = "?";
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    const struct sockaddr *a = ci ? ci->client_addr : NULL;
    if (a && a->sa_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)a)->sin_addr, who, sizeof who);
    else if (a && a->sa_family == AF_INET6)
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)a)->sin6_addr, who, sizeof who);
    const char *how = code == MHD_REQUEST_TERMINATED_COMPLETED_OK         ? NULL
                    : !x->counted                                         ? "the request did not arrive whole"
                    : code == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN      ? "the server stopped"
                    : code == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED      ? "timed out"
                                                                          : "the client went away";
    srv_log_request_line(s->cfg.log, &(srv_log_request){.client = who, .method = x->method[0] ? x->method : "-",
                                                         .path = x->url, .status = x->status,
                                                         .tokens = x->job ? srv_job_tokens(x->job) : 0,
                                                         .seconds = tdm_now() - x->t_start, .outcome = how});
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode code) {
    srv *s = cls;
    conn_ctx *x = *con_cls;
    if (!x) return;
    log_request(s, c, x, code);
    srv_job_release(x->job);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    srv_conns_idle(s->conns, ci ? ci->socket_context : NULL);
    const bool counted = x->counted;
    free(x->body);
    free(x);
    *con_cls = NULL;
    if (!counted) return;
    pthread_mutex_lock(&s->mu);
    s->n_http--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* A connection opened or closed: registered with conn.c (which may refuse it). */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    srv *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        srv_conns_closed(s->conns, *socket_context);
        *socket_context = NULL;
        return;
    }
    const union MHD_ConnectionInfo *fd = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    const union MHD_ConnectionInfo *ad = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    *socket_context = fd ? srv_conns_opened(s->conns, fd->connect_fd, ad ? ad->client_addr : NULL) : NULL;
}

bool srv_start(const srv_config *cfg, srv **out, char *err, size_t cap) {
    *out = NULL;
    srv *s = calloc(1, sizeof *s);
    if (!s || !(s->metrics = srv_metrics_new())) {
        free(s);
        return snprintf(err, cap, "out of memory"), false;
    }
    s->cfg = *cfg;
    if (!(s->conns = srv_conns_new(&cfg->conns, s->metrics))) {
        srv_metrics_free(s->metrics);
        free(s);
        return snprintf(err, cap, "out of memory (or threads)"), false;
    }
    s->created = (int64_t)time(NULL);
    s->state = SRV_LOADING;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    const int g = getaddrinfo(cfg->host, port, &hints, &ai);
    if (g != 0) {
        snprintf(err, cap, "host '%s': %s", cfg->host, gai_strerror(g));
        srv_free(s);
        return false;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* libmicrohttpd's own timeout (no byte moved for this long) only backs conn.c's
     * deadlines up, for an answer the client stops reading */
    const unsigned stalled = (unsigned)ceil(cfg->conns.read_timeout_s + cfg->conns.idle_timeout_s);
    s->daemon = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR,
                                 ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, s, MHD_OPTION_URI_LOG_CALLBACK, on_uri, s,
                                 MHD_OPTION_CONNECTION_TIMEOUT, stalled, MHD_OPTION_CONNECTION_LIMIT,
                                 (unsigned)(cfg->conns.max_connections + CONNECTION_SLACK), MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon) {
        snprintf(err, cap, "cannot listen on %s port %d (in use, or not an address of this machine?)", cfg->host,
                 cfg->port);
        srv_free(s);
        return false;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    *out = s;
    return true;
}

int srv_port(const srv *s) { return s->port; }

void srv_set_progress(srv *s, float progress) {
    pthread_mutex_lock(&s->mu);
    s->load_progress = progress;
    pthread_mutex_unlock(&s->mu);
}

void srv_set_ready(srv *s, const srv_model *m) {
    char *probe = NULL;
    tdm_tool_format f = TDM_TOOL_FORMAT_NONE;
    if (tandem_chat_render_json(m->target, m->chat_template, tdm_tool_probe_json, strlen(tdm_tool_probe_json), true,
                                &probe) == TANDEM_OK)
        f = tdm_tool_format_detect(probe, strlen(probe));
    tandem_free(probe);
    probe = NULL;
    bool reasoning = false;
    if (tandem_chat_render_json(m->target, m->chat_template, tdm_think_probe_json, strlen(tdm_think_probe_json), false,
                                &probe) == TANDEM_OK)
        reasoning = tdm_think_detect(probe, strlen(probe));
    tandem_free(probe);
    const char *const *markers;
    const size_t n_markers = tdm_tool_format_markers(f, &markers);
    int n_ctl = 0;
    int32_t ctl_id[TDM_TOOL_MARKERS_MAX];
    const char *ctl_text[TDM_TOOL_MARKERS_MAX];
    for (size_t i = 0; i < n_markers; i++) { /* a marker that is one token decoding to "" */
        int32_t *ids = NULL;
        size_t n = 0;
        char *text = NULL;
        if (tandem_tokenize(m->target, markers[i], strlen(markers[i]), false, &ids, &n) == TANDEM_OK && n == 1 &&
            tandem_detokenize(m->target, ids, 1, &text) == TANDEM_OK && text[0] == '\0') {
            ctl_id[n_ctl] = ids[0];
            ctl_text[n_ctl++] = markers[i];
        }
        tandem_free(ids);
        tandem_free(text);
    }
    pthread_mutex_lock(&s->mu);
    s->m = *m;
    s->m.tool_format = f;
    s->m.reasoning = reasoning;
    s->m.n_tool_markers = n_ctl;
    for (int i = 0; i < n_ctl; i++) s->m.tool_marker_id[i] = ctl_id[i], s->m.tool_marker_text[i] = ctl_text[i];
    s->state = SRV_READY;
    pthread_mutex_unlock(&s->mu);
}

/* Waits (s->mu held) until no request is in flight (in the engine, or its answer still
 * being sent) or `until` (tdm_now()) passes. */
static void wait_jobs(srv *s, double until) {
    while ((s->n_jobs > 0 || s->n_http > 0) && tdm_now() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
}

int srv_shutdown(srv *s, double grace_s) {
    pthread_mutex_lock(&s->mu);
    const bool was_ready = s->state == SRV_READY;
    s->state = SRV_DRAINING;
    pthread_mutex_unlock(&s->mu);
    if (s->daemon) {
        const MHD_socket l = MHD_quiesce_daemon(s->daemon); /* new connections are refused */
        if (l != MHD_INVALID_SOCKET) close(l);
    }
    int cancelled = 0;
    if (was_ready) {
        pthread_mutex_lock(&s->mu);
        wait_jobs(s, tdm_now() + grace_s);
        const bool left = s->n_jobs > 0;
        pthread_mutex_unlock(&s->mu);
        if (left) cancelled = srv_cancel_all(s);
        pthread_mutex_lock(&s->mu); /* (their answers: 503, or the text so far) */
        wait_jobs(s, tdm_now() + SHUTDOWN_CANCEL_WAIT_S);
        pthread_mutex_unlock(&s->mu);
    }
    /* every connection is shut: idle ones, bodies still arriving, answers not yet read */
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    return cancelled;
}

void srv_free(srv *s) {
    if (!s) return;
    if (s->daemon) MHD_stop_daemon(s->daemon);
    srv_conns_free(s->conns);
    srv_metrics_free(s->metrics);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
