/* metrics.h - the server's counters and latency histograms, and GET /metrics's text
 * (Prometheus text exposition format 0.0.4) with the engine's counters beside them.
 *
 * Every call is thread-safe (one mutex): the HTTP threads count answers, the
 * scheduler thread's token callbacks observe latencies. */
#ifndef TDM_SRV_METRICS_H
#define TDM_SRV_METRICS_H

#include <stdbool.h>
#include <stddef.h>

#include "tandem.h"

/* The endpoints requests are counted by. */
typedef enum srv_endpoint {
    SRV_EP_COMPLETIONS = 0,
    SRV_EP_CHAT,
    SRV_EP_MODELS,
    SRV_EP_HEALTH,
    SRV_EP_METRICS,
    SRV_EP_TOKENIZE,             /* POST /tokenize */
    SRV_EP_DETOKENIZE,           /* POST /detokenize */
    SRV_EP_OTHER,
    SRV_EP_COUNT
} srv_endpoint;

/* Why the server closed a connection of its own accord (conn.h). */
typedef enum srv_conn_close {
    SRV_CONN_READ_TIMEOUT = 0,   /* its request did not arrive within read_timeout_s */
    SRV_CONN_IDLE_TIMEOUT,       /* kept alive past idle_timeout_s */
    SRV_CONN_EVICTED,            /* reading or idle the longest when another needed room */
    SRV_CONN_REFUSED,            /* a new one when no room could be made */
    SRV_CONN_CLOSE_COUNT
} srv_conn_close;

typedef struct srv_metrics srv_metrics;

srv_metrics *srv_metrics_new(void); /* NULL when out of memory */
void srv_metrics_free(srv_metrics *m);

/* One answered request (its HTTP status). */
void srv_metrics_request(srv_metrics *m, srv_endpoint ep, int status);
/* A connection opened (+1) or closed (-1): the gauge of open connections. */
void srv_metrics_conn_open(srv_metrics *m, int delta);
/* The server closed a connection (or refused a new one) for this reason. */
void srv_metrics_conn_closed(srv_metrics *m, srv_conn_close reason);
/* Latencies in seconds: time to first token (from the request's arrival), between
 * two tokens, and the whole request. */
void srv_metrics_ttft(srv_metrics *m, double s);
void srv_metrics_itl(srv_metrics *m, double s);
void srv_metrics_e2e(srv_metrics *m, double s);

/* The exposition text (heap, *len its length); st: the engine's counters, NULL while
 * the model loads.  NULL when out of memory. */
char *srv_metrics_text(srv_metrics *m, const tandem_engine_stats *st, size_t *len);

#endif
