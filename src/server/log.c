/* log.c - the server's log lines, whole or not at all (log.h). */
#include "log.h"

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

struct srv_log {
    pthread_mutex_t mu;
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

/* The line, time-stamped for a file, with its newline (buf has LINE_MAX_BYTES + 64). */
static size_t format_line(const srv_log *log, char *buf, const char *fmt, va_list ap) {
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
    char note[160 + LINE_MAX_BYTES + 64];
    const char *out = buf;
    size_t n = len;
    if (log->failing && log->file) {
        size_t k = stamp(note);
        k += (size_t)snprintf(note + k, sizeof note - k, "serve: %lu log lines were lost here (%s)\n",
                              log->lost_since, strerror(log->failing));
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
    char buf[LINE_MAX_BYTES + 64];
    va_list ap;
    va_start(ap, fmt);
    const size_t n = format_line(log, buf, fmt, ap);
    va_end(ap);
    write_line(log, buf, n);
}

srv_log *srv_log_open(const char *path, char *err, size_t cap) {
    if (path && strlen(path) >= sizeof ((srv_log *)0)->path) return snprintf(err, cap, "%s: path too long", path), NULL;
    srv_log *log = calloc(1, sizeof *log);
    if (!log) return snprintf(err, cap, "out of memory"), NULL;
    pthread_mutex_init(&log->mu, NULL);
    log->fd = 2;
    if (!path) return log;
    log->file = true;
    snprintf(log->path, sizeof log->path, "%s", path);
    log->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644);
    const char *what = "cannot open it for appending";
    bool ok = log->fd >= 0;
    if (ok) {
        char buf[128];
        size_t n = stamp(buf);
        n += (size_t)snprintf(buf + n, sizeof buf - n, "serve: log opened by tandem serve (pid %ld)\n", (long)getpid());
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
