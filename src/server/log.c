/* log.c - the server's log lines, whole or not at all (log.h). */
#include "log.h"

#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 2048
#define JSON_LINE_MAX (6 * LINE_MAX_BYTES + 128) /* a message escaped (\u00XX at worst) in its object */

struct srv_log {
    pthread_mutex_t mu;
    srv_log_format format;
    int fd;                      /* the file, or 2 */
    bool file;
    char path[512];
    unsigned long lost;          /* lines lost so far */
    unsigned long lost_since;    /* lost since the last line that was written */
    int failing;                 /* the errno of the failure going on, 0 = none */
};

/* Writes all of buf at the end of the file; false with errno set, the file as it
 * was (a partial line cut back off). */
static bool append(srv_log *log, const char *buf, size_t len) {
    const off_t at = log->file ? lseek(log->fd, 0, SEEK_END) : -1;
    size_t done = 0;
    while (done < len) {
        const ssize_t n = write(log->fd, buf + done, len - done);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        const int e = n < 0 ? errno : ENOSPC;
        if (done > 0 && at >= 0 && ftruncate(log->fd, at) != 0) {
            fprintf(stderr, "serve: log file %s: a partial line could not be cut off: %s\n", log->path,
                    strerror(errno));
        }
        errno = e;
        return false;
    }
    return true;
}

/* "2025-01-31T12:00:00.000Z " into buf (32 bytes at least); its length. */
static size_t stamp(char *buf) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, 24, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(buf + n, 8, ".%03ldZ ", ts.tv_nsec / 1000000L);
    return n;
}

/* msg as the JSON object {"time": "...", "msg": msg} and a newline into buf (cap bytes,
 * at least 64); its length.  A message whose escaped form does not fit is cut. */
static size_t json_msg_line(char *buf, size_t cap, const char *msg, size_t len) {
    char t[32];
    const size_t nt = stamp(t) - 1; /* (without the blank) */
    size_t n = (size_t)snprintf(buf, cap, "{\"time\": \"%.*s\", \"msg\": ", (int)nt, t);
    FILE *f = fmemopen(buf + n, cap - n - 2, "w");
    size_t k = 0;
    bool ok = false;
    if (f) {
        setvbuf(f, NULL, _IONBF, 0);
        tdm_json_write_str(f, msg, len);
        k = (size_t)ftell(f);
        ok = !ferror(f);
        fclose(f);
    }
    if (!ok) k = (size_t)snprintf(buf + n, cap - n - 2, "\"(a line too long for the log)\"");
    n += k;
    buf[n++] = '}';
    buf[n++] = '\n';
    return n;
}

/* The line, time-stamped for a file, with its newline (buf has LINE_MAX_BYTES + 64);
 * in JSON, {"time", "msg"} (buf has JSON_LINE_MAX). */
static size_t format_line(const srv_log *log, char *buf, const char *fmt, va_list ap) {
    if (log && log->format == SRV_LOG_JSON) {
        char msg[LINE_MAX_BYTES];
        const int k = vsnprintf(msg, sizeof msg, fmt, ap);
        const size_t len = k < 0 ? 0 : (size_t)k < sizeof msg ? (size_t)k : sizeof msg - 1;
        return json_msg_line(buf, JSON_LINE_MAX, msg, len);
    }
    size_t n = log && log->file ? stamp(buf) : 0;
    const int k = vsnprintf(buf + n, LINE_MAX_BYTES, fmt, ap);
    if (k > 0) n += (size_t)k < LINE_MAX_BYTES ? (size_t)k : LINE_MAX_BYTES - 1;
    buf[n++] = '\n';
    return n;
}

static void write_line(srv_log *log, const char *buf, size_t len) {
    if (!log) {
        fwrite(buf, 1, len, stderr);
        return;
    }
    pthread_mutex_lock(&log->mu);
    /* after failed writes the file's next line says how many were lost: the note and the
     * line go in together or not at all, so the file never resumes without it */
    char note[256 + JSON_LINE_MAX];
    const char *out = buf;
    size_t n = len;
    if (log->failing && log->file) {
        char msg[160];
        const int m = snprintf(msg, sizeof msg, "serve: %lu log lines were lost here (%s)", log->lost_since,
                               strerror(log->failing));
        size_t k = 0;
        if (log->format == SRV_LOG_JSON) {
            k = json_msg_line(note, sizeof note, msg, m < 0 ? 0 : (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1);
        } else {
            k = stamp(note);
            k += (size_t)snprintf(note + k, sizeof note - k, "%s\n", msg);
        }
        if (k + len <= sizeof note) {
            memcpy(note + k, buf, len);
            out = note;
            n = k + len;
        }
    }
    if (!append(log, out, n)) {
        const int e = errno;
        log->lost++;
        log->lost_since++;
        if (log->file && !log->failing)
            fprintf(stderr, "serve: log file %s: cannot write (%s): log lines are lost until it can be written again\n",
                    log->path, strerror(e));
        log->failing = e;
    } else if (log->failing) {
        if (log->file)
            fprintf(stderr, "serve: log file %s: writing again (%lu lines lost)\n", log->path, log->lost_since);
        log->failing = 0;
        log->lost_since = 0;
    }
    pthread_mutex_unlock(&log->mu);
}

void srv_logf(srv_log *log, const char *fmt, ...) {
    char buf[JSON_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    const size_t n = format_line(log, buf, fmt, ap);
    va_end(ap);
    write_line(log, buf, n);
}

void srv_log_request_line(srv_log *log, const srv_log_request *r) {
    char st[16] = "-";
    if (r->status) snprintf(st, sizeof st, "%d", r->status);
    if (!log || log->format == SRV_LOG_TEXT) {
        srv_logf(log, "serve: %s \"%s %s\" %s %.3f s, %llu tokens%s%s%s", r->client, r->method, r->path, st,
                 r->seconds, (unsigned long long)r->tokens, r->outcome ? " (" : "", r->outcome ? r->outcome : "",
                 r->outcome ? ")" : "");
        return;
    }
    char buf[JSON_LINE_MAX];
    FILE *f = fmemopen(buf, sizeof buf - 2, "w");
    if (!f) return;
    setvbuf(f, NULL, _IONBF, 0);
    char t[32];
    fprintf(f, "{\"time\": \"%.*s\", \"event\": \"request\", \"client\": ", (int)(stamp(t) - 1), t);
    tdm_json_write_str(f, r->client, strlen(r->client));
    fputs(", \"method\": ", f);
    tdm_json_write_str(f, r->method, strlen(r->method));
    fputs(", \"path\": ", f);
    tdm_json_write_str(f, r->path, strlen(r->path));
    fprintf(f, ", \"status\": %s, \"tokens\": %llu, \"seconds\": %.3f, \"outcome\": ", r->status ? st : "null",
            (unsigned long long)r->tokens, r->seconds);
    const char *oc = r->outcome ? r->outcome : "completed";
    tdm_json_write_str(f, oc, strlen(oc));
    fputc('}', f);
    const long n = ftell(f);
    const bool ok = !ferror(f);
    fclose(f);
    if (!ok || n <= 0) return; /* (cannot happen: method and path are short) */
    buf[n] = '\n';
    write_line(log, buf, (size_t)n + 1);
}

srv_log *srv_log_open(const char *path, srv_log_format format, char *err, size_t cap) {
    if (path && strlen(path) >= sizeof ((srv_log *)0)->path) return snprintf(err, cap, "%s: path too long", path), NULL;
    srv_log *log = calloc(1, sizeof *log);
    if (!log) return snprintf(err, cap, "out of memory"), NULL;
    pthread_mutex_init(&log->mu, NULL);
    log->format = format;
    log->fd = 2;
    if (!path) return log;
    log->file = true;
    snprintf(log->path, sizeof log->path, "%s", path);
    log->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644);
    const char *what = "cannot open it for appending";
    bool ok = log->fd >= 0;
    if (ok) {
        char buf[256], msg[64];
        const int m = snprintf(msg, sizeof msg, "serve: log opened by tandem serve (pid %ld)", (long)getpid());
        size_t n = 0;
        if (format == SRV_LOG_JSON) {
            n = json_msg_line(buf, sizeof buf, msg, (size_t)m);
        } else {
            n = stamp(buf);
            n += (size_t)snprintf(buf + n, sizeof buf - n, "%s\n", msg);
        }
        what = "cannot write to it";
        ok = append(log, buf, n);
    }
    if (!ok) {
        snprintf(err, cap, "log file %s: %s: %s", path, what, strerror(errno));
        if (log->fd >= 0) close(log->fd);
        pthread_mutex_destroy(&log->mu);
        free(log);
        return NULL;
    }
    return log;
}

void srv_log_close(srv_log *log) {
    if (!log) return;
    if (log->lost) fprintf(stderr, "serve: %lu log lines were lost to failed writes%s%s\n", log->lost,
                           log->file ? " to " : "", log->file ? log->path : "");
    if (log->file) close(log->fd);
    pthread_mutex_destroy(&log->mu);
    free(log);
}
