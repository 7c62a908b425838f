/* liblog.h - the library's own messages (warnings, and the reports a diagnostic
 * environment variable asks for), delivered to the callback of tandem_log_set
 * (include/tandem.h), by default to stderr.
 *
 * Everything the library writes goes through tdm_log; src/cli and src/server, the
 * programs, write their own output.  Errors of a call are its status and
 * tandem_last_error, not log messages: the log carries what has no caller to return
 * to (a variable that is set but no longer read, a profile printed at exit). */
#ifndef TDM_LIBLOG_H
#define TDM_LIBLOG_H

#include "tandem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Formats one message (one line, no trailing newline) and passes it to the
 * current callback.  Thread-safe: calls are serialised, so a callback is never
 * entered twice at once. */
void tdm_log(tandem_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif
#endif
