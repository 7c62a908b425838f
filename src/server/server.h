/* server.h - `tandem serve`'s HTTP server: an OpenAI-compatible front end that is one
 * more request source of the engine's scheduler (docs/DESIGN.md, "Server").
 *
 *   http.c  libmicrohttpd glue: the daemon (a thread per connection), routing, the
 *           body and its limit, its framing, the API key, health / models / metrics,
 *           the request log, shutdown
 *   conn.c  the connections' deadlines and eviction (slow and idle clients)
 *   log.c   the log: stderr or a file, whole lines or none
 *   gen.c   a generation request's life: parse (oai_request.c), render the chat,
 *           tokenize, check the context, admit (max_queue) and submit to the engine,
 *           then wait for the result or stream its tokens (oai_response.c); a client
 *           that goes away (its connection reset; not one that only half-closed it)
 *           cancels its request
 *
 * Threads: libmicrohttpd runs each connection on a thread of its own, which may
 * block (waiting for a result, or for the next piece of a stream); the engine's
 * scheduler thread runs the token and finish callbacks, which only append to a
 * request's queue under its mutex and signal it.  Nothing here calls exit(). */
#ifndef TDM_SERVER_H
#define TDM_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "conn.h"
#include "log.h"
#include "metrics.h"
#include "oai_request.h"
#include "tandem.h"
#include "tool_calls.h"

typedef struct srv_config {
    const char *host;            /* numeric address or name to bind; "127.0.0.1" */
    int port;                    /* 0: any free port (srv_port says which) */
    const char *api_key;         /* NULL: none; else "Authorization: Bearer KEY" (not "") */
    int max_queue;               /* requests waiting in the scheduler beyond which a new one
                                    gets 429; 0 = no limit */
    size_t max_body;             /* bytes of a request body at most (413 beyond) */
    srv_conn_limits conns;       /* connections at once, per address, their deadlines */
    srv_log *log;                /* borrowed; NULL: stderr */
    const char *cors_origin;     /* NULL: no CORS (no such header, OPTIONS a 405); "*" or
                                    comma-separated origins: answers to a request from one
                                    of them (its Origin header; any with "*") carry
                                    Access-Control-Allow-Origin, and OPTIONS preflights
                                    of the endpoints are answered 204 */
} srv_config;

/* What the server serves, once loaded (srv_set_ready). */
typedef struct srv_model {
    tandem_model *target;        /* borrowed: outlive the server's use (srv_shutdown) */
    tandem_engine *engine;       /* borrowed; its own scheduler thread runs */
    oai_limits lim;              /* model id, context, defaults (strings borrowed) */
    const char *chat_template;   /* for tandem_chat_render: NULL = the model's own */
    bool prefix_cache;           /* the engine's prefix cache is on: the choices of a
                                    request of n > 1 after the first are submitted once
                                    the first's prompt is computed, and share its blocks */
    tdm_tool_format tool_format; /* how the template writes tool calls (srv_set_ready
                                    finds it): the format a chat's output is parsed in
                                    when tools are offered */
    bool reasoning;              /* the template renders reasoning_content in <think>
                                    (srv_set_ready finds it): a chat's output that begins
                                    with <think> has its reasoning split off */
    int n_tool_markers;          /* the format's markers that are control tokens, which
                                    the engine's text leaves out (Qwen's <tool_call>):
                                    a tool request's output gets their text back at
                                    their place, as llama-server's preserved tokens */
    int32_t tool_marker_id[TDM_TOOL_MARKERS_MAX];
    const char *tool_marker_text[TDM_TOOL_MARKERS_MAX];
} srv_model;

typedef struct srv_job srv_job;

typedef struct srv {
    srv_config cfg;
    struct MHD_Daemon *daemon;
    srv_metrics *metrics;
    srv_conns *conns;
    int port;
    int64_t created;             /* Unix seconds at start: the model's "created" */
    pthread_mutex_t mu;          /* the fields below */
    pthread_cond_t cv;           /* n_jobs changed */
    enum { SRV_LOADING, SRV_READY, SRV_DRAINING } state;
    float load_progress;         /* loading: the fraction of the models loaded (/health) */
    srv_model m;                 /* set once under mu (state READY), read-only after */
    srv_job *jobs;               /* generation requests submitted and not finished */
    int n_jobs;
    int n_http;                  /* HTTP requests received whole (headers and body) and not
                                    yet completed (their answer fully sent or their
                                    connection closed); a body still arriving is no request */
    uint64_t next_id;
} srv;

/* Starts listening (state loading: /health answers 503, generation 503).  False with
 * err set (bind failure, out of memory, no HTTP support). */
bool srv_start(const srv_config *cfg, srv **out, char *err, size_t cap);
int srv_port(const srv *s);
/* While loading: the fraction loaded, in [0, 1] (/health's "progress"). */
void srv_set_progress(srv *s, float progress);
/* m's tool_format is found here, from the chat template's rendering of a call. */
void srv_set_ready(srv *s, const srv_model *m);
/* SIGTERM: stops taking connections and requests (/health 503), lets the requests in
 * flight finish for up to grace_s seconds, cancels the rest (those not started get
 * 503, those cut keep their text: finish_reason "abort") and waits up to a second
 * for their answers, then stops the daemon, closing every connection (after this the
 * models may be closed).  Returns the requests it cancelled. */
int srv_shutdown(srv *s, double grace_s);
void srv_free(srv *s);

/* ---- between http.c and gen.c ---- */

struct MHD_Connection;
/* An answer to queue: status, content type and body (taken over, heap). */
int srv_send(srv *s, struct MHD_Connection *c, int status, const char *type, char *body, size_t len);
int srv_send_error(srv *s, struct MHD_Connection *c, const oai_error *e);
/* The CORS headers of an answer to c (none unless cfg.cors_origin allows its Origin). */
struct MHD_Response;
void srv_cors_headers(const srv *s, struct MHD_Connection *c, struct MHD_Response *r);
/* POST /v1/completions and /v1/chat/completions with its whole body: queues the
 * answer (or a stream) and returns MHD's result.  *status: the status answered.
 * *log_job: the request's job when one was submitted (else left as it is), for the log
 * line's token count (srv_job_tokens) once the request ends; the caller holds a
 * reference to it until srv_job_release. */
int srv_generate(srv *s, struct MHD_Connection *c, oai_kind kind, const char *body, size_t len, double t_arrival,
                 int *status, srv_job **log_job);
uint64_t srv_job_tokens(srv_job *j); /* tokens generated so far */
void srv_job_release(srv_job *j);    /* NULL: no-op */
/* Cancels every request in flight (shutdown: each marked so). */
int srv_cancel_all(srv *s);

#endif
