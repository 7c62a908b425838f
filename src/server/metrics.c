/* metrics.c - counters, histograms and their Prometheus text (metrics.h). */
#include "metrics.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_STATUS 16 /* distinct HTTP statuses counted per endpoint */
#define N_BUCKETS 14

static const char *const ep_names[SRV_EP_COUNT] = {"completions", "chat_completions", "models",
                                                   "health", "metrics", "tokenize", "detokenize", "other"};

typedef struct hist {
    const char *name, *help;
    double le[N_BUCKETS]; /* upper bounds, ascending; 0 ends the list (+Inf follows) */
    uint64_t count[N_BUCKETS + 1];
    double sum;
    uint64_t n;
} hist;

struct srv_metrics {
    pthread_mutex_t mu;
    struct {
        int status;
        uint64_t n;
    } req[SRV_EP_COUNT][N_STATUS];
    hist ttft, itl, e2e;
    int64_t conns_open;
    uint64_t conns_closed[SRV_CONN_CLOSE_COUNT];
};

static const char *const close_names[SRV_CONN_CLOSE_COUNT] = {"read_timeout", "idle_timeout", "evicted", "refused"};

srv_metrics *srv_metrics_new(void) {
    srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    if (pthread_mutex_init(&m->mu, NULL) != 0) {
        free(m);
        return NULL;
    }
    m->ttft = (hist){.name = "tandem_time_to_first_token_seconds", .help = "Time from a request's arrival to its first token.",
                     .le = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}};
    m->itl = (hist){.name = "tandem_inter_token_latency_seconds", .help = "Time between two tokens of a request's stream.",
                    .le = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}};
    m->e2e = (hist){.name = "tandem_request_duration_seconds", .help = "Time from a request's arrival to its last token.",
                    .le = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}};
    return m;
}

void srv_metrics_free(srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_request(srv_metrics *m, srv_endpoint ep, int status) {
    if (!m || ep < 0 || ep >= SRV_EP_COUNT) return;
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < N_STATUS; i++) {
        if (m->req[ep][i].status == 0) m->req[ep][i].status = status;
        if (m->req[ep][i].status == status) {
            m->req[ep][i].n++;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_conn_open(srv_metrics *m, int delta) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->conns_open += delta;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_conn_closed(srv_metrics *m, srv_conn_close reason) {
    if (!m || reason < 0 || reason >= SRV_CONN_CLOSE_COUNT) return;
    pthread_mutex_lock(&m->mu);
    m->conns_closed[reason]++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(srv_metrics *m, hist *h, double s) {
    if (!m) return;
    if (!(s >= 0)) s = 0;
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < N_BUCKETS && h->le[b] > 0 && s > h->le[b]) b++;
    if (b < N_BUCKETS && h->le[b] == 0) b = N_BUCKETS; /* past the last bound: +Inf only */
    h->count[b]++;
    h->sum += s;
    h->n++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_ttft(srv_metrics *m, double s) { if (m) observe(m, &m->ttft, s); }
void srv_metrics_itl(srv_metrics *m, double s) { if (m) observe(m, &m->itl, s); }
void srv_metrics_e2e(srv_metrics *m, double s) { if (m) observe(m, &m->e2e, s); }

static void write_hist(FILE *f, const hist *h) {
    fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", h->name, h->help, h->name);
    uint64_t cum = 0;
    for (int b = 0; b < N_BUCKETS && h->le[b] > 0; b++) {
        cum += h->count[b];
        fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", h->name, h->le[b], (unsigned long long)cum);
    }
    fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", h->name, (unsigned long long)h->n,
            h->name, h->sum, h->name, (unsigned long long)h->n);
}

static void metric(FILE *f, const char *name, const char *type, const char *help, double v) {
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

static void write_engine(FILE *f, const tandem_engine_stats *st) {
    metric(f, "tandem_requests_waiting", "gauge", "Requests queued in the scheduler (preempted ones too).", st->n_waiting);
    metric(f, "tandem_requests_running", "gauge", "Sequences in the running batch.", st->n_running);
    metric(f, "tandem_kv_blocks_used", "gauge", "KV cache blocks held by sequences.",
           st->kv_blocks_total - st->kv_blocks_free);
    metric(f, "tandem_kv_blocks_free", "gauge", "KV cache blocks free (cached prefixes count as free).",
           st->kv_blocks_free);
    metric(f, "tandem_prompt_tokens_total", "counter", "Prompt tokens of the requests that started.",
           (double)st->prompt_tokens);
    metric(f, "tandem_generation_tokens_total", "counter", "Tokens generated.", (double)st->generated_tokens);
    metric(f, "tandem_prefix_cache_hit_tokens_total", "counter", "Prompt tokens whose K/V came from the prefix cache.",
           (double)st->cached_tokens);
    metric(f, "tandem_prefix_cache_hits_total", "counter",
           "Requests that started with at least one prompt block from the prefix cache.", (double)st->prefix_hits);
    metric(f, "tandem_preemptions_total", "counter", "Sequences preempted (their blocks freed, recomputed later).",
           (double)st->n_preemptions);
    fputs("# HELP tandem_engine_requests_total Requests finished by the engine, by outcome.\n"
          "# TYPE tandem_engine_requests_total counter\n", f);
    const uint64_t other = st->n_finished - st->n_failed - st->n_cancelled - st->n_timeouts;
    fprintf(f, "tandem_engine_requests_total{outcome=\"finished\"} %llu\n", (unsigned long long)other);
    fprintf(f, "tandem_engine_requests_total{outcome=\"failed\"} %llu\n", (unsigned long long)st->n_failed);
    fprintf(f, "tandem_engine_requests_total{outcome=\"cancelled\"} %llu\n", (unsigned long long)st->n_cancelled);
    fprintf(f, "tandem_engine_requests_total{outcome=\"timeout\"} %llu\n", (unsigned long long)st->n_timeouts);
    metric(f, "tandem_spec_drafted_tokens_total", "counter", "Draft tokens proposed.", (double)st->spec_drafted);
    metric(f, "tandem_spec_accepted_tokens_total", "counter", "Draft tokens accepted.", (double)st->spec_accepted);
    metric(f, "tandem_spec_acceptance_rate", "gauge", "Accepted over drafted tokens since the start.",
           st->spec_drafted ? (double)st->spec_accepted / (double)st->spec_drafted : 0.0);
    metric(f, "tandem_forward_steps_total", "counter", "Scheduler iterations that ran a forward.", (double)st->steps);
    metric(f, "tandem_tokens_per_forward", "gauge", "Generated tokens per scheduler forward since the start.",
           st->steps ? (double)st->generated_tokens / (double)st->steps : 0.0);
}

char *srv_metrics_text(srv_metrics *m, const tandem_engine_stats *st, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    pthread_mutex_lock(&m->mu);
    fputs("# HELP tandem_http_requests_total HTTP requests answered, by endpoint and status.\n"
          "# TYPE tandem_http_requests_total counter\n", f);
    for (int e = 0; e < SRV_EP_COUNT; e++)
        for (int i = 0; i < N_STATUS && m->req[e][i].status; i++)
            fprintf(f, "tandem_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", ep_names[e],
                    m->req[e][i].status, (unsigned long long)m->req[e][i].n);
    fprintf(f, "# HELP tandem_http_connections HTTP connections open.\n# TYPE tandem_http_connections gauge\n"
               "tandem_http_connections %lld\n", (long long)m->conns_open);
    fputs("# HELP tandem_http_connections_closed_total Connections the server closed (or refused), by reason.\n"
          "# TYPE tandem_http_connections_closed_total counter\n", f);
    for (int r = 0; r < SRV_CONN_CLOSE_COUNT; r++)
        fprintf(f, "tandem_http_connections_closed_total{reason=\"%s\"} %llu\n", close_names[r],
                (unsigned long long)m->conns_closed[r]);
    write_hist(f, &m->ttft);
    write_hist(f, &m->itl);
    write_hist(f, &m->e2e);
    pthread_mutex_unlock(&m->mu);
    metric(f, "tandem_model_loaded", "gauge", "1 once the model is loaded and the server takes requests.", st ? 1 : 0);
    if (st) write_engine(f, st);
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}
