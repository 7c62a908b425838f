/* conn.h - `tandem serve`'s guard of its connections against slow and idle clients
 * (slowloris): what each connection is doing, its deadline, and who gives way when
 * the server is full.
 *
 * A connection is in one of these states (http.c reports the changes from
 * libmicrohttpd's callbacks):
 *   reading    from its opening, or from the request line of a later request on it,
 *              until its request's body is complete: the request must arrive within
 *              read_timeout_s (headers and body together: a client trickling a byte
 *              at a time gains nothing);
 *   answering  the request is complete and is being served (generation, the answer
 *              sent): no deadline of ours, never evicted;
 *   idle       the answer went out, the connection is kept alive for the next
 *              request: closed after idle_timeout_s.
 * A reading or idle connection may be evicted: when a connection opens while
 * max_connections are open (or max_per_ip from its address), the one that has been
 * reading its request the longest, else the one idle the longest (of that address
 * when the per-address limit is what is reached), is closed to make room.  When none
 * can be (all answering), the new connection is closed instead.  So silent and
 * trickling connections cannot lock clients out: /health and new requests get in, at
 * the price of the slowest requests, then of the oldest kept-alive connections.
 *
 * Closing is shutdown(2) of the socket, which wakes libmicrohttpd's thread for it
 * (EOF) so that it closes the connection itself; the socket stays registered (and so
 * is never shut down after libmicrohttpd closed it and the number was reused) until
 * srv_conns_closed.  A thread sweeps the deadlines every SRV_CONNS_SWEEP_MS. */
#ifndef TDM_SRV_CONN_H
#define TDM_SRV_CONN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "metrics.h"

#define SRV_CONNS_SWEEP_MS 100

typedef struct srv_conn_limits {
    int max_connections;         /* open at once, >= 1 */
    int max_per_ip;              /* open at once from one address; 0 = no limit */
    double read_timeout_s;       /* a request's headers and body arrive within this, > 0 */
    double idle_timeout_s;       /* a kept-alive connection waits this long for its next
                                    request, > 0 */
} srv_conn_limits;

typedef struct srv_conns srv_conns;
typedef struct srv_conn srv_conn;

/* Starts the sweeping thread.  NULL when out of memory or threads. */
srv_conns *srv_conns_new(const srv_conn_limits *lim, srv_metrics *metrics);
/* Stops the thread (every connection must have been reported closed). */
void srv_conns_free(srv_conns *cs);

/* A connection was accepted (socket fd, peer address): registered as reading, after
 * making room as above.  NULL when it was refused (its socket is shut down) or out
 * of memory (then it goes unguarded). */
srv_conn *srv_conns_opened(srv_conns *cs, int fd, const struct sockaddr *addr);
/* The state changes (c may be NULL: no-ops). */
void srv_conns_reading(srv_conns *cs, srv_conn *c);
void srv_conns_answering(srv_conns *cs, srv_conn *c);
void srv_conns_idle(srv_conns *cs, srv_conn *c);
/* libmicrohttpd is closing it: forgotten (c may be NULL). */
void srv_conns_closed(srv_conns *cs, srv_conn *c);

#endif
