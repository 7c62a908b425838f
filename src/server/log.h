/* log.h - `tandem serve`'s log: its own lines (listening, ready, draining, stopped) and
 * one line per HTTP request answered, on stderr or appended to a file (--log-file).
 *
 * Each line is formatted whole and written with one write(2), under a mutex, so
 * lines never interleave.  A write that fails (a full disk, a read-only or lost file
 * system, an I/O error) never leaves part of a line in the file: a short write is cut
 * back off (ftruncate to where the line began).  The first failure is reported on
 * stderr with its cause, the lines are counted as lost, and the server goes on; when
 * a write succeeds again, stderr and the file say how many lines were lost.  A file
 * that cannot be opened for appending, or whose first line cannot be written, is an
 * error at startup (srv_log_open).  Lines in a file begin with the UTC time
 * (2025-01-31T12:00:00.000Z); lines on stderr do not (its collector stamps them).
 *
 * SRV_LOG_JSON (--log-format json, for log shippers): every line, on stderr or in the
 * file, is one JSON object with its time: {"time": "...Z", "msg": "serve: ..."}, and
 * a request's line {"time", "event": "request", "client", "method", "path", "status"
 * (null when none was sent), "tokens", "seconds", "outcome"}. */
#ifndef TDM_SRV_LOG_H
#define TDM_SRV_LOG_H

#include <stdbool.h>
#include <stddef.h>

#include <stdint.h>

typedef struct srv_log srv_log;

typedef enum srv_log_format { SRV_LOG_TEXT, SRV_LOG_JSON } srv_log_format;

/* path NULL: stderr.  Else the file, created (0644) or appended to, with a first line
 * saying who opened it.  NULL with err set when it cannot be opened or written. */
srv_log *srv_log_open(const char *path, srv_log_format format, char *err, size_t cap);
/* One line (no newline in fmt: it is added; a line longer than 2 KiB is cut).  log
 * NULL: stderr, unguarded. */
void srv_logf(srv_log *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* One served request: who asked, what, the status sent (0: none), the tokens generated,
 * the seconds from its request line to its end, and how it ended (NULL: completed, else
 * "timed out", "the client went away", ...). */
typedef struct srv_log_request {
    const char *client, *method, *path;
    int status;
    uint64_t tokens;
    double seconds;
    const char *outcome;
} srv_log_request;
/* The request's line: serve: CLIENT "METHOD PATH" STATUS SECONDS s, N tokens[ (OUTCOME)],
 * or its JSON object. */
void srv_log_request_line(srv_log *log, const srv_log_request *r);
/* Says on stderr how many lines were lost, if any, and closes the file. */
void srv_log_close(srv_log *log);

#endif
