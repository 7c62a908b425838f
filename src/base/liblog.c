/* liblog.c - tandem_log_set and tdm_log (liblog.h). */
#include "liblog.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>

/* The default sink: info and above on stderr (the library emits info only for
 * the reports a diagnostic variable asks for; debug is dropped). */
static void log_stderr(tandem_log_level level, const char *msg, void *user_data) {
    (void)user_data;
    if (level == TANDEM_LOG_ERROR) fprintf(stderr, "tandem: error: %s\n", msg);
    else if (level == TANDEM_LOG_WARN) fprintf(stderr, "tandem: warning: %s\n", msg);
    else if (level == TANDEM_LOG_INFO) fprintf(stderr, "%s\n", msg);
}

/* The callback and its user data, changed and called under one lock: once
 * tandem_log_set returns, the old callback is never called again. */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static tandem_log_cb g_cb = log_stderr;
static void *g_user;

void tandem_log_set(tandem_log_cb cb, void *user_data) {
    pthread_mutex_lock(&g_mu);
    g_cb = cb ? cb : log_stderr;
    g_user = cb ? user_data : NULL;
    pthread_mutex_unlock(&g_mu);
}

void tdm_log(tandem_log_level level, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_mu);
    g_cb(level, msg, g_user);
    pthread_mutex_unlock(&g_mu);
}
