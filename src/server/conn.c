/* conn.c - the connections' states, deadlines and eviction (conn.h). */
#include "conn.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"

enum { ST_READING, ST_ANSWERING, ST_IDLE, ST_CLOSING };

struct srv_conn {
    int fd;
    struct sockaddr_storage addr;
    int state;
    double since;                /* tdm_now() when the state began */
    srv_conn *prev, *next;
};

struct srv_conns {
    srv_conn_limits lim;
    srv_metrics *metrics;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* stop */
    pthread_t sweeper;
    bool stop;
    srv_conn *head;
    int n_live;                  /* registered and not closing */
};

/* The same peer address (the port aside). */
static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b) {
    if (a->ss_family != b->ss_family) return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &((const struct sockaddr_in6 *)b)->sin6_addr,
                       sizeof(struct in6_addr));
    return true; /* (another family: one "address") */
}

/* Shuts a connection's socket (cs->mu held): libmicrohttpd's thread sees EOF and
 * closes it. */
static void close_conn(srv_conns *cs, srv_conn *c, srv_conn_close reason) {
    shutdown(c->fd, SHUT_RDWR);
    c->state = ST_CLOSING;
    cs->n_live--;
    srv_metrics_conn_closed(cs->metrics, reason);
}

/* The one to evict (of addr's address unless NULL): the connection reading its request
 * the longest, else the one idle the longest; NULL when all are answering. */
static srv_conn *oldest(srv_conns *cs, const struct sockaddr_storage *addr) {
    srv_conn *best = NULL;
    for (srv_conn *c = cs->head; c; c = c->next) {
        if ((c->state != ST_READING && c->state != ST_IDLE) || (addr && !same_addr(&c->addr, addr))) continue;
        if (!best || (c->state == ST_READING && best->state == ST_IDLE) ||
            (c->state == best->state && c->since < best->since))
            best = c;
    }
    return best;
}

static int count_addr(srv_conns *cs, const struct sockaddr_storage *addr) {
    int n = 0;
    for (srv_conn *c = cs->head; c; c = c->next) n += c->state != ST_CLOSING && same_addr(&c->addr, addr);
    return n;
}

static void *sweep(void *arg) {
    srv_conns *cs = arg;
    pthread_mutex_lock(&cs->mu);
    while (!cs->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += SRV_CONNS_SWEEP_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&cs->cv, &cs->mu, &ts);
        const double now = tdm_now();
        for (srv_conn *c = cs->head; c; c = c->next) {
            if (c->state == ST_READING && now - c->since > cs->lim.read_timeout_s)
                close_conn(cs, c, SRV_CONN_READ_TIMEOUT);
            else if (c->state == ST_IDLE && now - c->since > cs->lim.idle_timeout_s)
                close_conn(cs, c, SRV_CONN_IDLE_TIMEOUT);
        }
    }
    pthread_mutex_unlock(&cs->mu);
    return NULL;
}

srv_conns *srv_conns_new(const srv_conn_limits *lim, srv_metrics *metrics) {
    srv_conns *cs = calloc(1, sizeof *cs);
    if (!cs) return NULL;
    cs->lim = *lim;
    cs->metrics = metrics;
    pthread_mutex_init(&cs->mu, NULL);
    pthread_cond_init(&cs->cv, NULL);
    if (pthread_create(&cs->sweeper, NULL, sweep, cs) != 0) {
        pthread_cond_destroy(&cs->cv);
        pthread_mutex_destroy(&cs->mu);
        free(cs);
        return NULL;
    }
    return cs;
}

void srv_conns_free(srv_conns *cs) {
    if (!cs) return;
    pthread_mutex_lock(&cs->mu);
    cs->stop = true;
    pthread_cond_signal(&cs->cv);
    pthread_mutex_unlock(&cs->mu);
    pthread_join(cs->sweeper, NULL);
    while (cs->head) { /* (none left when every close was reported) */
        srv_conn *c = cs->head;
        cs->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&cs->cv);
    pthread_mutex_destroy(&cs->mu);
    free(cs);
}

srv_conn *srv_conns_opened(srv_conns *cs, int fd, const struct sockaddr *addr) {
    srv_conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->fd = fd;
    const size_t alen = !addr ? 0 : addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                  : addr->sa_family == AF_INET  ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr);
    if (addr) memcpy(&c->addr, addr, alen);
    pthread_mutex_lock(&cs->mu);
    bool room = true;
    if (cs->lim.max_per_ip > 0 && count_addr(cs, &c->addr) >= cs->lim.max_per_ip) {
        srv_conn *v = oldest(cs, &c->addr);
        if (v) close_conn(cs, v, SRV_CONN_EVICTED);
        else room = false;
    }
    if (room && cs->n_live >= cs->lim.max_connections) {
        srv_conn *v = oldest(cs, NULL);
        if (v) close_conn(cs, v, SRV_CONN_EVICTED);
        else room = false;
    }
    if (!room) {
        pthread_mutex_unlock(&cs->mu);
        shutdown(fd, SHUT_RDWR);
        srv_metrics_conn_closed(cs->metrics, SRV_CONN_REFUSED);
        free(c);
        return NULL;
    }
    c->state = ST_READING;
    c->since = tdm_now();
    c->next = cs->head;
    if (cs->head) cs->head->prev = c;
    cs->head = c;
    cs->n_live++;
    pthread_mutex_unlock(&cs->mu);
    srv_metrics_conn_open(cs->metrics, 1);
    return c;
}

static void set_state(srv_conns *cs, srv_conn *c, int state) {
    if (!c) return;
    pthread_mutex_lock(&cs->mu);
    if (c->state != ST_CLOSING) {
        c->state = state;
        c->since = tdm_now();
    }
    pthread_mutex_unlock(&cs->mu);
}

void srv_conns_reading(srv_conns *cs, srv_conn *c) { set_state(cs, c, ST_READING); }
void srv_conns_answering(srv_conns *cs, srv_conn *c) { set_state(cs, c, ST_ANSWERING); }
void srv_conns_idle(srv_conns *cs, srv_conn *c) { set_state(cs, c, ST_IDLE); }

void srv_conns_closed(srv_conns *cs, srv_conn *c) {
    if (!c) return;
    pthread_mutex_lock(&cs->mu);
    if (c->state != ST_CLOSING) cs->n_live--;
    if (c->prev) c->prev->next = c->next;
    else cs->head = c->next;
    if (c->next) c->next->prev = c->prev;
    pthread_mutex_unlock(&cs->mu);
    srv_metrics_conn_open(cs->metrics, -1);
    free(c);
}
