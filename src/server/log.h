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
 * (2025-01-31T12:00:00.000Z); lines on stderr do not (its collector stamps them). */
#ifndef TDM_SRV_LOG_H
#define TDM_SRV_LOG_H

#include <stdbool.h>
#include <stddef.h>

typedef struct srv_log srv_log;

/* path NULL: stderr.  Else the file, created (0644) or appended to, with a first line
 * saying who opened it.  NULL with err set when it cannot be opened or written. */
srv_log *srv_log_open(const char *path, char *err, size_t cap);
/* One line (no newline in fmt: it is added; a line longer than 2 KiB is cut).  log
 * NULL: stderr, unguarded. */
void srv_logf(srv_log *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Says on stderr how many lines were lost, if any, and closes the file. */
void srv_log_close(srv_log *log);

#endif
