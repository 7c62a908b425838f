/* gen.c - a generation request's life in the server (server.h): from its parsed body
 * to the engine's scheduler and back, whole or streamed as server-sent events.
 *
 * A job is shared by the connection's thread and the engine's callbacks (two
 * references; the last one out frees it).  The token callback appends the text piece
 * to the job's queue and signals; the connection's thread waits on the job's condition
 * variable in slices of 100 ms and, between them, looks whether its client is gone
 * (poll: the connection reset, POLLHUP or POLLERR): then it cancels the request, whose
 * KV blocks the scheduler frees at its next step.  A client that only half-closed its
 * side after its request (shutdown(SHUT_WR): EOF, POLLRDHUP) still gets its answer;
 * one that closed its socket without a reset is found out when the answer is written
 * (a stream: at its next event).
 *
 * The answer begins when there is something to say: a whole answer at the result, a
 * stream at its first text (or the result), so that a request that fails, or that
 * shutdown cancels before it produced a token, is answered with its HTTP status (500,
 * or 503 with Retry-After) rather than a 200 with an empty text.  One that shutdown
 * cut after it produced tokens keeps its text, with finish_reason "abort". */
#include <errno.h>
#include <microhttpd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common.h"
#include "oai_response.h"
#include "server.h"

#define WAIT_SLICE_MS 100
#define PING_S 15.0 /* a stream idle this long gets an SSE comment (proxies keep it) */

enum { PH_TEXT, PH_USAGE, PH_DONE, PH_END };   /* a stream's, after its choices' events */
enum { CH_TEXT, CH_FINAL, CH_OVER };           /* a choice's in a stream */

/* One choice of a request (n of them): its own engine request. */
typedef struct srv_choice {
    srv_job *j;
    tandem_request_id id;
    bool submitted;              /* in the engine (else finished without starting) */
    oai_meta meta;               /* the job's, with this choice's index (and called_tools) */
    bool got_token;
    double t_last;               /* tdm_now() of its last token */
    char *pending;               /* stream: text passed by on_token, not yet sent */
    size_t n_pending, cap_pending;
    bool done;                   /* res is set (on_finish) */
    tandem_result res;
    int phase;                   /* stream: CH_* */
    bool first_chunk;
    size_t n_sent_text;          /* stream: bytes of text sent so far */
    oai_stream_sent sent;        /* parsed stream: what went out */
    char *acc;                   /* parsed chat (tools, reasoning): the output so far, with
                                    the text of the call markers that are control tokens
                                    (NUL-terminated); a stream holds back what may be a
                                    call or the end of the reasoning */
    size_t n_acc, cap_acc;
    size_t n_engine_text;        /* chat with tools: bytes of the engine's text in acc */
    int32_t *lp_tok;             /* stream with logprobs: [n_lp] tokens not yet sent, and */
    tandem_token_logprob *lp;    /* [n_lp] their log-probabilities (on_token_lp) */
    size_t n_lp, cap_lp;
    size_t lp_offset;            /* completions: the text offset of the next token */
} srv_choice;

struct srv_job {
    srv *s;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                    /* the connection's, one per choice in the engine (released
                                    at its finish) and the log's (srv_generate's *log_job) */
    int fd;                      /* the client's socket, -1 unknown */
    char id_text[48];
    oai_meta meta;
    bool stream, include_usage;
    double t_arrival;            /* tdm_now() at arrival */
    double t_submit;             /* the first choice's submission */
    bool got_token;              /* any choice's first token (the time to first token) */
    uint64_t n_tokens;           /* tokens generated so far, all choices (the log line's) */
    int n_done;                  /* choices finished */
    bool done;                   /* every choice finished */
    bool listed;                 /* in s->jobs, until every choice finished (under s->mu) */
    bool gone;                   /* the client went away: cancelled */
    bool shut;                   /* cancelled by the server's shutdown */
    int phase;                   /* stream: what comes after the choices' events */
    int next_choice;             /* stream: the choice whose events are looked at first */
    char **tool_names;           /* [n_tool_names] the request's (meta points here) */
    size_t n_tool_names;
    char *out;                   /* stream: bytes formatted, out_off of them given to MHD */
    size_t out_len, out_off;
    double t_out;                /* stream: when bytes were last given to MHD */
    srv_job *prev, *next;        /* s->jobs (under s->mu) */
    int n;                       /* choices */
    srv_choice c[];              /* [n] */
};

static void job_unref(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    const int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0) return;
    for (int i = 0; i < j->n; i++) {
        tandem_result_free(&j->c[i].res);
        free(j->c[i].pending);
        free(j->c[i].acc);
        free(j->c[i].lp_tok);
        free(j->c[i].lp);
    }
    for (size_t i = 0; i < j->n_tool_names; i++) free(j->tool_names[i]);
    free(j->tool_names);
    free(j->out);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* The connection is reset or broken (not merely half-closed by the client). */
static bool peer_gone(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = 0};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL));
}

/* Waits (j->mu held) for a signal or WAIT_SLICE_MS. */
static void wait_slice(srv_job *j) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += WAIT_SLICE_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&j->cv, &j->mu, &ts);
}

/* The engine ids of j's choices that run (j->mu held): into ids, their count. */
static int running_ids(const srv_job *j, tandem_request_id ids[OAI_N_MAX]) {
    int n = 0;
    for (int i = 0; i < j->n; i++)
        if (j->c[i].submitted && !j->c[i].done) ids[n++] = j->c[i].id;
    return n;
}

/* The client is gone (j->mu held on entry, released on return): the request's choices
 * are cancelled, unless already done. */
static void job_cancel_unlock(srv_job *j) {
    tandem_request_id ids[OAI_N_MAX];
    const int n = j->gone ? 0 : running_ids(j, ids);
    j->gone = true;
    pthread_mutex_unlock(&j->mu);
    for (int i = 0; i < n; i++) (void)tandem_engine_cancel(j->s->m.engine, ids[i]); /* (a finished id: no-op) */
}

/* ---- the engine's callbacks (on the scheduler's thread) ---- */

/* Appends t[0..n) to *b (kept NUL-terminated); false out of memory. */
static bool grow_append(char **b, size_t *len, size_t *cap, const char *t, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t nc = *cap ? *cap : 256;
        while (nc < *len + n + 1) nc *= 2;
        char *nb = realloc(*b, nc);
        if (!nb) return false;
        *b = nb, *cap = nc;
    }
    memcpy(*b + *len, t, n);
    *len += n;
    (*b)[*len] = '\0';
    return true;
}

/* The chat's output is parsed (tools offered, or a template that marks reasoning): the
 * text goes through each choice's acc. */
static bool parsed(const srv_job *j) { return j->meta.tool_format != TDM_TOOL_FORMAT_NONE || j->meta.reasoning; }

/* Chat with tools (j->mu held): the piece, then the text of a marker that is a control
 * token.  (The piece is the text before the token: with stop strings it may still hold
 * some back, which then follows the marker; the parse skips whitespace there.) */
static bool tool_text(srv_choice *c, int32_t token, const char *text, size_t len) {
    if (!grow_append(&c->acc, &c->n_acc, &c->cap_acc, text, len)) return false;
    c->n_engine_text += len;
    const srv_model *m = &c->j->s->m;
    for (int i = 0; i < m->n_tool_markers; i++)
        if (token == m->tool_marker_id[i])
            return grow_append(&c->acc, &c->n_acc, &c->cap_acc, m->tool_marker_text[i], strlen(m->tool_marker_text[i]));
    return true;
}

/* A stream's token and its log-probabilities kept for the next chunk (j->mu held);
 * false out of memory. */
static bool keep_logprob(srv_choice *c, int32_t token, const tandem_token_logprob *lp) {
    if (!lp) return true;
    if (c->n_lp == c->cap_lp) {
        const size_t nc = c->cap_lp ? 2 * c->cap_lp : 16;
        int32_t *nt = realloc(c->lp_tok, nc * sizeof *nt);
        if (!nt) return false;
        c->lp_tok = nt;
        tandem_token_logprob *nl = realloc(c->lp, nc * sizeof *nl);
        if (!nl) return false;
        c->lp = nl, c->cap_lp = nc;
    }
    c->lp_tok[c->n_lp] = token;
    c->lp[c->n_lp++] = *lp;
    return true;
}

static bool on_token_lp(int32_t token, const char *text, size_t len, const tandem_token_logprob *lp, void *user);

static bool on_token(int32_t token, const char *text, size_t len, void *user) {
    return on_token_lp(token, text, len, NULL, user);
}

static bool on_token_lp(int32_t token, const char *text, size_t len, const tandem_token_logprob *lp, void *user) {
    srv_choice *c = user;
    srv_job *j = c->j;
    const double now = tdm_now();
    pthread_mutex_lock(&j->mu);
    if (!j->got_token) srv_metrics_ttft(j->s->metrics, now - j->t_arrival);
    else if (c->got_token) srv_metrics_itl(j->s->metrics, now - c->t_last);
    const bool first = !c->got_token;
    j->got_token = c->got_token = true;
    j->n_tokens++;
    c->t_last = now;
    bool ok = !j->gone;
    if (parsed(j) && ok) {
        ok = tool_text(c, token, text, len);
    } else if (j->stream && len > 0 && ok) {
        ok = grow_append(&c->pending, &c->n_pending, &c->cap_pending, text, len); /* (out of memory: the stream
                                                                                    cannot go on) */
    }
    if (j->stream && ok) ok = keep_logprob(c, token, lp);
    if (j->stream || (first && j->n > 1)) pthread_cond_signal(&j->cv); /* (the first: srv_generate submits the rest) */
    pthread_mutex_unlock(&j->mu);
    return ok;
}

/* Choice c finished with *r (taken over): from on_finish, or for a choice that was never
 * submitted; the last one takes the job off the server's list.  Drops the choice's
 * reference. */
static void choice_done(srv_choice *c, tandem_result *r) {
    srv_job *j = c->j;
    srv *s = j->s;
    pthread_mutex_lock(&j->mu);
    c->res = *r;
    if (parsed(j)) { /* the text no callback passed (none, as the engine streams) */
        const size_t tl = r->status == TANDEM_OK && r->text ? strlen(r->text) : 0;
        if (tl > c->n_engine_text && !tool_text(c, -1, r->text + c->n_engine_text, tl - c->n_engine_text)) {
            free(c->acc);
            c->acc = NULL;
            c->n_acc = c->cap_acc = 0;
        }
    }
    c->done = true;
    const bool last = ++j->n_done == j->n;
    j->done = last;
    bool all_ok = true;
    for (int i = 0; i < j->n; i++) all_ok = all_ok && j->c[i].res.status == TANDEM_OK;
    pthread_cond_broadcast(&j->cv);
    const double t0 = j->t_arrival;
    pthread_mutex_unlock(&j->mu);
    if (last && all_ok) srv_metrics_e2e(s->metrics, tdm_now() - t0);
    if (last) {
        pthread_mutex_lock(&s->mu);
        if (j->listed) {
            if (j->prev) j->prev->next = j->next;
            else if (s->jobs == j) s->jobs = j->next;
            if (j->next) j->next->prev = j->prev;
            j->listed = false;
            s->n_jobs--;
            pthread_cond_broadcast(&s->cv);
        }
        pthread_mutex_unlock(&s->mu);
    }
    job_unref(j);
}

static void on_finish(tandem_request_id id, tandem_result *r, void *user) {
    (void)id;
    choice_done(user, r);
}

int srv_cancel_all(srv *s) {
    int n = 0;
    pthread_mutex_lock(&s->mu);
    for (srv_job *j = s->jobs; j; j = j->next) {
        tandem_request_id ids[OAI_N_MAX];
        pthread_mutex_lock(&j->mu);
        j->shut = true;
        const int k = running_ids(j, ids);
        pthread_mutex_unlock(&j->mu);
        for (int i = 0; i < k; i++)
            if (tandem_engine_cancel(s->m.engine, ids[i]) == TANDEM_OK) n++;
    }
    pthread_mutex_unlock(&s->mu);
    return n;
}

/* Shutdown cancelled it before any choice produced a token (j->done). */
static bool never_started(const srv_job *j) {
    if (!j->shut) return false;
    for (int i = 0; i < j->n; i++) {
        const tandem_result *r = &j->c[i].res;
        if (!(r->status == TANDEM_OK && r->finish_reason == TANDEM_FINISH_CANCELLED && r->n_tokens == 0)) return false;
    }
    return true;
}

/* The first choice that failed (j->done), or NULL. */
static const tandem_result *failed(const srv_job *j) {
    for (int i = 0; i < j->n; i++)
        if (j->c[i].res.status != TANDEM_OK) return &j->c[i].res;
    return NULL;
}

/* ---- streaming ---- */

/* A parsed stream's events of choice c (j->mu held): oai_parsed_events over c->acc. */
static bool parsed_event(srv_job *j, srv_choice *c, char **t, size_t *n, bool *oom) {
    if (c->done) c->phase = CH_FINAL;
    if (c->done && c->res.status == TANDEM_OK && !c->acc && c->n_engine_text) return *oom = true, false;
    *t = oai_parsed_events(&c->meta, &c->sent, c->acc ? c->acc : "", c->n_acc, c->done, j->include_usage, n, oom);
    return *t != NULL;
}

static char *choice_event_of(srv_job *j, srv_choice *c, size_t *n, bool *oom);

/* Choice c's next event (j->mu held): its text, its last chunk (or its error); NULL
 * when it has none now (*oom set out of memory).  With logprobs, the tokens kept since
 * the last chunk go with the next one. */
static char *choice_event(srv_job *j, srv_choice *c, size_t *n, bool *oom) {
    const oai_lp_span lps = {c->lp_tok, c->lp, c->n_lp};
    c->meta.lp_span = &lps;
    c->meta.lp_offset = &c->lp_offset;
    char *t = choice_event_of(j, c, n, oom);
    c->meta.lp_span = NULL;
    return t;
}

static char *choice_event_of(srv_job *j, srv_choice *c, size_t *n, bool *oom) {
    char *t = NULL;
    if (parsed(j) && c->phase == CH_TEXT) {
        if (parsed_event(j, c, &t, n, oom)) return t;
        if (*oom || !c->done) return NULL;
        /* (the result, with nothing left to say before its last chunk) */
    }
    if (c->n_pending > 0) {
        t = oai_chunk_sse(&c->meta, c->pending, c->n_pending, c->first_chunk, j->include_usage, n);
        c->n_lp = 0;
        c->n_sent_text += c->n_pending;
        c->n_pending = 0;
        c->first_chunk = false;
    } else if (!c->done || c->phase == CH_OVER) {
        return NULL;
    } else if (c->phase == CH_TEXT) { /* what the stream held back (e.g. an unfinished character) */
        const tandem_result *r = &c->res;
        const size_t tl = r->status == TANDEM_OK && r->text ? strlen(r->text) : 0;
        c->phase = CH_FINAL;
        if (tl <= c->n_sent_text) return choice_event(j, c, n, oom);
        t = oai_chunk_sse(&c->meta, r->text + c->n_sent_text, tl - c->n_sent_text, c->first_chunk, j->include_usage,
                          n);
        c->n_lp = 0;
        c->n_sent_text = tl;
        c->first_chunk = false;
    } else { /* CH_FINAL */
        if (c->res.status != TANDEM_OK) {
            oai_error e;
            oai_fail(&e, 500, NULL, "generation_failed", "%s", c->res.error ? c->res.error : "generation failed");
            t = oai_error_sse(&e, n);
        } else {
            t = oai_final_chunk_sse(&c->meta, &c->res, j->include_usage, n);
            c->n_lp = 0;
        }
        c->phase = CH_OVER;
    }
    if (!t) *oom = true;
    return t;
}

/* Formats the next event into j->out (j->mu held); false when there is none yet: the
 * choices' events as they come (looked at in turn), then the usage and [DONE]. */
static bool next_event(srv_job *j, bool *oom) {
    size_t n = 0;
    char *t = NULL;
    if (j->phase == PH_TEXT) {
        bool over = true;
        for (int k = 0; k < j->n && !t && !*oom; k++) {
            const int i = (j->next_choice + k) % j->n;
            t = choice_event(j, &j->c[i], &n, oom);
            if (t) j->next_choice = (i + 1) % j->n;
            over = over && j->c[i].phase == CH_OVER;
        }
        if (t || *oom || !over) {
            j->out = t;
            j->out_len = t ? n : 0;
            j->out_off = 0;
            return t != NULL;
        }
        j->phase = j->include_usage && !failed(j) ? PH_USAGE : PH_DONE;
    }
    if (j->phase == PH_USAGE) {
        tandem_result rs[OAI_N_MAX];
        for (int i = 0; i < j->n; i++) rs[i] = j->c[i].res;
        t = oai_usage_chunks_sse(&j->c[0].meta, rs, (size_t)j->n, &n);
        j->phase = PH_DONE;
    } else {
        t = oai_done_sse(&n);
        j->phase = PH_END;
    }
    if (!t) *oom = true;
    j->out = t;
    j->out_len = t ? n : 0;
    j->out_off = 0;
    return t != NULL;
}

/* A choice has text to send, or (a parsed stream) output to look at. */
static bool any_text(const srv_job *j) {
    for (int i = 0; i < j->n; i++)
        if (j->c[i].n_pending > 0 || j->c[i].n_acc > 0) return true;
    return false;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out_off < j->out_len) {
            const size_t n = j->out_len - j->out_off < max ? j->out_len - j->out_off : max;
            memcpy(buf, j->out + j->out_off, n);
            j->out_off += n;
            j->t_out = tdm_now();
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        free(j->out);
        j->out = NULL;
        j->out_len = j->out_off = 0;
        if (j->phase == PH_END) break;
        bool oom = false;
        if (next_event(j, &oom)) continue;
        if (oom) break;
        wait_slice(j);
        bool pending = false;
        for (int i = 0; i < j->n; i++) pending = pending || j->c[i].n_pending > 0;
        if (!j->done && !pending && peer_gone(j->fd)) {
            job_cancel_unlock(j);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (!j->done && !pending && tdm_now() - j->t_out > PING_S) {
            static const char ping[] = ": keep-alive\n\n";
            if ((j->out = malloc(sizeof ping))) {
                memcpy(j->out, ping, sizeof ping);
                j->out_len = sizeof ping - 1;
            }
        }
    }
    const bool ended = j->phase == PH_END;
    if (!ended) {
        job_cancel_unlock(j);
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    pthread_mutex_unlock(&j->mu);
    return MHD_CONTENT_READER_END_OF_STREAM;
}

/* The response is done with (sent, or the connection closed). */
static void stream_free(void *cls) {
    srv_job *j = cls;
    pthread_mutex_lock(&j->mu);
    job_cancel_unlock(j);
    job_unref(j);
}

static int send_stream(srv_job *j, struct MHD_Connection *c) {
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, j, stream_free);
    if (!resp) {
        pthread_mutex_lock(&j->mu);
        job_cancel_unlock(j);
        job_unref(j);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no"); /* nginx: pass each event on at once */
    srv_cors_headers(j->s, c, resp);
    const enum MHD_Result r = MHD_queue_response(c, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return r;
}

/* ---- the answer ---- */

/* Waits (j->mu held) until the answer can begin: the result, or for a stream its first
 * text; a client gone meanwhile cancels the request (the wait goes on to its result). */
static void wait_answer(srv_job *j) {
    while (!j->done && !(j->stream && any_text(j))) {
        wait_slice(j);
        if (!j->done && !j->gone && peer_gone(j->fd)) {
            job_cancel_unlock(j);
            pthread_mutex_lock(&j->mu);
        }
    }
}

/* The whole answer of a finished job (its choices' texts, parsed where they are). */
static char *whole_answer(srv_job *j, size_t *n) {
    oai_meta ms[OAI_N_MAX];
    tandem_result rs[OAI_N_MAX];
    for (int i = 0; i < j->n; i++) {
        srv_choice *c = &j->c[i];
        if (parsed(j) && !c->acc && c->n_engine_text) return NULL; /* (out of memory) */
        ms[i] = c->meta;
        rs[i] = c->res;
        if (parsed(j)) rs[i].text = c->acc ? c->acc : (char *)"";
    }
    return oai_results_json(ms, rs, (size_t)j->n, n);
}

/* Answers the request: a stream (from its first text), or the whole result, an error,
 * or 503 for a request shutdown cancelled before it began.  Takes the connection's
 * reference to j. */
static int answer(srv_job *j, struct MHD_Connection *c, int *status) {
    pthread_mutex_lock(&j->mu);
    wait_answer(j);
    const bool gone = j->gone, done = j->done;
    pthread_mutex_unlock(&j->mu);
    /* (the choices' results are set once, before done: read without the lock from here) */
    if (j->stream && !gone && (!done || (!failed(j) && !never_started(j)))) {
        *status = 200;
        return send_stream(j, c);
    }
    int r;
    oai_error e;
    const tandem_result *bad = done ? failed(j) : NULL;
    if (gone) {
        *status = 499; /* (nginx's "client closed request"; nothing is sent) */
        r = MHD_NO;
    } else if (bad) {
        oai_fail(&e, 500, NULL, "generation_failed", "%s", bad->error ? bad->error : "generation failed");
        *status = 500;
        r = srv_send_error(j->s, c, &e);
    } else if (never_started(j)) {
        oai_fail(&e, 503, NULL, "shutting_down",
                 "the server is shutting down: the request was cancelled before it started (retry)");
        *status = 503;
        r = srv_send_error(j->s, c, &e);
    } else {
        size_t n = 0;
        char *body = whole_answer(j, &n);
        *status = body ? 200 : 500;
        r = body ? srv_send(j->s, c, 200, "application/json", body, n) : MHD_NO;
    }
    job_unref(j);
    return r;
}

/* ---- admission ---- */

/* The prompt's token ids (heap; free with tandem_free): rendered by the chat template,
 * tokenized, or as given. */
static bool prompt_ids(const srv_model *m, const oai_request *rq, int32_t **ids, size_t *n, oai_error *e) {
    tandem_status st;
    *ids = NULL;
    *n = 0;
    if (rq->kind == OAI_CHAT) {
        char *text = NULL;
        st = tandem_chat_render_json(m->target, m->chat_template, rq->chat_json, strlen(rq->chat_json), true, &text);
        if (st != TANDEM_OK)
            return oai_fail(e, st == TANDEM_ERR_NOMEM ? 500 : 400, "messages", "chat_template_error",
                            "the chat template cannot render these messages: %s", tandem_last_error());
        st = tandem_tokenize(m->target, text, strlen(text), true, ids, n);
        tandem_free(text);
    } else if (rq->prompt) {
        st = tandem_tokenize(m->target, rq->prompt, rq->prompt_len, true, ids, n);
    } else {
        if (!(*ids = malloc(rq->n_prompt_ids * sizeof **ids))) return oai_fail(e, 500, NULL, NULL, "out of memory");
        memcpy(*ids, rq->prompt_ids, rq->n_prompt_ids * sizeof **ids);
        *n = rq->n_prompt_ids;
        return true;
    }
    if (st != TANDEM_OK) return oai_fail(e, 500, NULL, NULL, "tokenization failed: %s", tandem_last_error());
    if (*n == 0) return oai_fail(e, 400, rq->kind == OAI_CHAT ? "messages" : "prompt", "invalid_value", "the prompt has no token");
    return true;
}

static srv_job *job_new(srv *s, const oai_request *rq, int fd, double t_arrival) {
    const int n = rq->n >= 1 && rq->n <= OAI_N_MAX ? rq->n : 1;
    srv_job *j = calloc(1, sizeof *j + (size_t)n * sizeof(srv_choice));
    if (!j) return NULL;
    if (pthread_mutex_init(&j->mu, NULL) != 0) return free(j), NULL;
    if (pthread_cond_init(&j->cv, NULL) != 0) {
        pthread_mutex_destroy(&j->mu);
        return free(j), NULL;
    }
    j->s = s;
    j->n = n;
    j->refs = 1 + n;
    j->fd = fd;
    j->stream = rq->stream;
    j->include_usage = rq->include_usage;
    j->t_arrival = j->t_out = t_arrival;
    j->meta = (oai_meta){.kind = rq->kind, .id = j->id_text, .created = (int64_t)time(NULL), .model = s->m.lim.model_id,
                         .has_draft = s->m.lim.has_draft, .parallel_tool_calls = rq->parallel_tool_calls,
                         .tool_format = rq->kind == OAI_CHAT && rq->n_tools > 0 && rq->tool_choice != OAI_TOOLS_NONE
                                            ? s->m.tool_format : TDM_TOOL_FORMAT_NONE,
                         .reasoning = rq->kind == OAI_CHAT && s->m.reasoning,
                         .logprobs = rq->params.logprobs, .lp_model = s->m.target};
    if (j->meta.tool_format != TDM_TOOL_FORMAT_NONE) { /* (out of memory: the one reference dropped frees it) */
        if (!(j->tool_names = calloc(rq->n_tools, sizeof *j->tool_names))) return j->refs = 1, job_unref(j), NULL;
        for (; j->n_tool_names < rq->n_tools; j->n_tool_names++)
            if (!(j->tool_names[j->n_tool_names] = strdup(rq->tool_names[j->n_tool_names])))
                return j->refs = 1, job_unref(j), NULL;
        j->meta.tool_names = (const char *const *)j->tool_names;
        j->meta.n_tool_names = j->n_tool_names;
    }
    for (int i = 0; i < n; i++) {
        srv_choice *c = &j->c[i];
        c->j = j;
        c->meta = j->meta;
        c->meta.index = i;
        c->first_chunk = true;
        c->sent.first = true;
    }
    return j;
}

/* Choice i's engine request: req with its own seed (seed + i) and callback; its
 * timeout counted from the first choice's submission (a choice submitted later has
 * less left). */
static tandem_request choice_request(srv_job *j, const tandem_request *req, int i) {
    tandem_request r = *req;
    if (i == 0) {
        j->t_submit = tdm_now();
    } else if (r.timeout_ms > 0) {
        const double left = r.timeout_ms - (tdm_now() - j->t_submit) * 1000.0;
        r.timeout_ms = left > 1.0 ? left : 1.0;
    }
    r.params.seed = req->params.seed + (uint64_t)i;
    r.params.on_token = req->params.logprobs ? NULL : on_token;
    r.params.on_token_lp = req->params.logprobs ? on_token_lp : NULL;
    r.params.user_data = &j->c[i];
    return r;
}

/* Admits the job and submits its choices [0, n_now) (under s->mu): 429 beyond
 * max_queue, 503 unless ready. */
static bool submit(srv *s, srv_job *j, const tandem_request *req, int n_now, oai_error *e) {
    pthread_mutex_lock(&s->mu);
    bool ok = false;
    tandem_engine_stats st;
    if (s->state != SRV_READY) {
        oai_fail(e, 503, NULL, "unavailable", s->state == SRV_LOADING ? "the model is loading" : "the server is shutting down");
    } else if (s->cfg.max_queue > 0 && tandem_engine_get_stats(s->m.engine, &st) == TANDEM_OK &&
               st.n_waiting >= s->cfg.max_queue) {
        oai_fail(e, 429, NULL, "queue_full", "the server is busy: %d requests are waiting (max_queue %d); retry later",
                 st.n_waiting, s->cfg.max_queue);
    } else {
        const uint64_t n = ++s->next_id;
        snprintf(j->id_text, sizeof j->id_text, "%s-%llx%06llx", j->meta.kind == OAI_CHAT ? "chatcmpl" : "cmpl",
                 (unsigned long long)s->created, (unsigned long long)n);
        const tandem_request r0 = choice_request(j, req, 0);
        tandem_status st2 = tandem_engine_submit(s->m.engine, &r0, on_finish, &j->c[0], &j->c[0].id);
        if (st2 == TANDEM_OK) {
            ok = true;
            j->c[0].submitted = true;
            j->listed = true;
            j->next = s->jobs;
            if (s->jobs) s->jobs->prev = j;
            s->jobs = j;
            s->n_jobs++;
            for (int i = 1; i < n_now; i++) {
                const tandem_request ri = choice_request(j, req, i);
                if (tandem_engine_submit(s->m.engine, &ri, on_finish, &j->c[i], &j->c[i].id) == TANDEM_OK)
                    j->c[i].submitted = true;
            }
        } else {
            oai_fail(e, st2 == TANDEM_ERR_INVALID_ARG ? 400 : 500, NULL, NULL, "%s", tandem_last_error());
        }
    }
    pthread_mutex_unlock(&s->mu);
    return ok;
}

/* Submits the choices not in the engine yet (after the first's prompt is cached, or
 * with submit's): unless the client went away or shutdown cancelled the job meanwhile,
 * when they finish at once, cancelled without a token; one the engine refuses finishes
 * with its error. */
static void submit_rest(srv *s, srv_job *j, const tandem_request *req) {
    tandem_result res[OAI_N_MAX];
    bool unsent[OAI_N_MAX] = {false};
    pthread_mutex_lock(&s->mu);
    for (int i = 1; i < j->n; i++) {
        srv_choice *c = &j->c[i];
        if (c->submitted) continue;
        pthread_mutex_lock(&j->mu);
        const bool off = j->gone || j->shut;
        pthread_mutex_unlock(&j->mu);
        tandem_status st = TANDEM_ERR_INVALID_ARG;
        if (!off) {
            const tandem_request r = choice_request(j, req, i);
            st = tandem_engine_submit(s->m.engine, &r, on_finish, c, &c->id);
        }
        if (st == TANDEM_OK) {
            c->submitted = true;
            continue;
        }
        unsent[i] = true;
        res[i] = (tandem_result){.status = TANDEM_OK, .finish_reason = TANDEM_FINISH_CANCELLED,
                                 .n_prompt_tokens = req->n_prompt_ids};
        if (!off) {
            res[i].status = st;
            res[i].finish_reason = TANDEM_FINISH_ERROR;
            res[i].error = strdup(tandem_last_error());
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (int i = 1; i < j->n; i++) /* (after s->mu: the last one done takes the job off the list under it) */
        if (unsent[i]) choice_done(&j->c[i], &res[i]);
}

/* n > 1 with the prefix cache: waits until the first choice's prompt is computed (its
 * first token, when the engine publishes its blocks to the cache), the client goes
 * away or the choice ends, so that the others take its prompt's blocks from the cache
 * rather than computing the prompt n times. */
static void wait_first_token(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    while (!j->c[0].got_token && !j->c[0].done && !j->gone) {
        wait_slice(j);
        if (!j->c[0].done && !j->gone && peer_gone(j->fd)) {
            job_cancel_unlock(j);
            pthread_mutex_lock(&j->mu);
        }
    }
    pthread_mutex_unlock(&j->mu);
}

uint64_t srv_job_tokens(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    const uint64_t n = j->n_tokens;
    pthread_mutex_unlock(&j->mu);
    return n;
}

/* tool_choice "required" or a named function: the grammar of the calls in the
 * template's format (tool_grammar.c) becomes the request's grammar. */
static bool tool_grammar(const srv_model *m, oai_request *rq, oai_error *e) {
    if (rq->tool_choice != OAI_TOOLS_REQUIRED && rq->tool_choice != OAI_TOOLS_NAMED) return true;
    const char *what = rq->tool_choice == OAI_TOOLS_NAMED ? "naming a function" : "\"required\"";
    if (rq->grammar || rq->json_schema)
        return oai_fail(e, 400, "tool_choice", "invalid_value",
                        "'tool_choice' %s cannot be combined with 'response_format', 'grammar' or 'json_schema': "
                        "the calls are the output's format",
                        what);
    if (m->tool_format == TDM_TOOL_FORMAT_NONE)
        return oai_fail(e, 400, "tool_choice", "unsupported_value",
                        "'tool_choice' %s: the model's chat template writes no tool calls this server can parse", what);
    tdm_err err = {0};
    char *g = NULL;
    if (tdm_tool_grammar(m->tool_format, (const char *const *)rq->tool_names, (const char *const *)rq->tool_params,
                         rq->n_tools, rq->tool_choice == OAI_TOOLS_NAMED ? rq->tool_named : -1, rq->parallel_tool_calls,
                         &g, &err))
        return oai_fail(e, err.status == TANDEM_ERR_NOMEM ? 500 : 400, "tools", "unsupported_value",
                        "'tool_choice' %s: %s", what, err.msg);
    rq->grammar = g; /* (freed with the request, after every choice's submission copied it) */
    rq->params.grammar = g;
    return true;
}

void srv_job_release(srv_job *j) {
    if (j) job_unref(j);
}

int srv_generate(srv *s, struct MHD_Connection *c, oai_kind kind, const char *body, size_t len, double t_arrival,
                 int *status, srv_job **log_job) {
    oai_error e = {0};
    pthread_mutex_lock(&s->mu);
    const int state = s->state;
    pthread_mutex_unlock(&s->mu);
    if (state != SRV_READY) {
        oai_fail(&e, 503, NULL, "unavailable", state == SRV_LOADING ? "the model is loading" : "the server is shutting down");
        *status = e.status;
        return srv_send_error(s, c, &e);
    }
    const srv_model *m = &s->m;
    oai_request rq;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (!oai_request_parse(kind, body, len, &m->lim, &rq, &e)) {
        *status = e.status;
        return srv_send_error(s, c, &e);
    }
    srv_job *j = NULL;
    bool ok = prompt_ids(m, &rq, &ids, &n_ids, &e) && oai_fit_context(&rq, n_ids, &m->lim, &e) &&
              tool_grammar(m, &rq, &e);
    if (ok) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        j = job_new(s, &rq, ci ? ci->connect_fd : -1, t_arrival);
        if (!j) ok = oai_fail(&e, 500, NULL, NULL, "out of memory");
        else if (rq.stream && rq.params.logprobs && parsed(j)) /* (its chunks are the parser's, not the tokens') */
            ok = oai_fail(&e, 400, "logprobs", "unsupported_value",
                          "'logprobs' with 'stream' is not supported where the output is parsed (tools offered, or a "
                          "template that marks reasoning); ask without 'stream'");
    }
    tandem_request req = tandem_request_default();
    if (ok) {
        req.prompt_ids = ids;
        req.n_prompt_ids = n_ids;
        req.params = rq.params;
        req.priority = rq.priority;
        req.timeout_ms = rq.timeout_ms;
        /* (the ids and stop strings are copied at each submission) */
        ok = submit(s, j, &req, m->prefix_cache ? 1 : j->n, &e);
    }
    if (ok && j->n > 1) {
        if (m->prefix_cache) wait_first_token(j);
        submit_rest(s, j, &req);
    }
    tandem_free(ids);
    oai_request_free(&rq);
    if (!ok) {
        if (j) j->refs = 1, job_unref(j);
        *status = e.status;
        return srv_send_error(s, c, &e);
    }
    if (log_job) {
        pthread_mutex_lock(&j->mu);
        j->refs++;
        pthread_mutex_unlock(&j->mu);
        *log_job = j;
    }
    return answer(j, c, status);
}
