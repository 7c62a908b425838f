/* input.c - bounded readers of untrusted input (see input.h).
 *
 * Buffers grow by doubling from 64 KiB up to the limit plus one byte, the least
 * that shows a breach, so a reader never holds more than its limit (plus one). */
#include "input.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define INPUT_CHUNK ((size_t)64 << 10)

/* "1 MiB" for a whole number of MiB, else "N bytes". */
static const char *limit_str(size_t limit, char buf[32]) {
    if (limit % ((size_t)1 << 20) == 0)
        snprintf(buf, 32, "%zu MiB", limit >> 20);
    else
        snprintf(buf, 32, "%zu bytes", limit);
    return buf;
}

static tandem_status too_large(const char *name, size_t max, tdm_err *err) {
    char b[32];
    return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: input larger than the %s limit", name, limit_str(max, b));
}

/* Refuses a directory, and a regular file larger than max (from its size). */
static tandem_status check_stat(FILE *f, const char *name, size_t max, tdm_err *err) {
    struct stat st;
    int fd = fileno(f);
    if (fd < 0 || fstat(fd, &st) != 0) return TANDEM_OK; /* not a file descriptor: read and see */
    if (S_ISDIR(st.st_mode)) return tdm_seterr(err, TANDEM_ERR_IO, "%s: is a directory", name);
    if (S_ISREG(st.st_mode) && st.st_size > 0 && (uint64_t)st.st_size > (uint64_t)max)
        return too_large(name, max, err);
    return TANDEM_OK;
}

/* Grows *buf (capacity *cap) to hold at least need bytes, to at most limit. */
static bool grow_to(char **buf, size_t *cap, size_t need, size_t limit) {
    if (need <= *cap) return true;
    if (need > limit) return false;
    size_t nc = *cap ? *cap : INPUT_CHUNK;
    while (nc < need) nc = nc > limit / 2 ? limit : nc * 2;
    if (nc > limit) nc = limit;
    char *nb = realloc(*buf, nc);
    if (!nb) return false;
    *buf = nb;
    *cap = nc;
    return true;
}

static tandem_status read_error(const char *name, tdm_err *err) {
    return tdm_seterr(err, TANDEM_ERR_IO, "error reading '%s': %s", name, strerror(errno ? errno : EIO));
}

tandem_status tdm_input_read_all(FILE *f, const char *name, size_t max, char **out, size_t *out_len,
                                 tdm_err *err) {
    *out = NULL;
    *out_len = 0;
    tandem_status st = check_stat(f, name, max, err);
    if (st) return st;
    char *buf = NULL;
    size_t cap = 0, len = 0;
    const size_t limit = max + 2; /* max bytes, one more to see a breach, the NUL */
    for (;;) {
        if (!grow_to(&buf, &cap, TDM_MIN(len + INPUT_CHUNK, limit), limit)) {
            free(buf);
            return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory reading %s", name);
        }
        errno = 0;
        size_t r = fread(buf + len, 1, cap - 1 - len, f);
        len += r;
        if (len > max) {
            free(buf);
            return too_large(name, max, err);
        }
        if (r == 0) break;
    }
    if (ferror(f)) {
        free(buf);
        return read_error(name, err);
    }
    buf[len] = 0;
    *out = buf;
    *out_len = len;
    return TANDEM_OK;
}

tandem_status tdm_lines_open(tdm_lines *r, const char *path, size_t line_max, size_t total_max, tdm_err *err) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) return tdm_seterr(err, TANDEM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    tandem_status st = check_stat(f, path, total_max, err);
    if (st) {
        fclose(f);
        return st;
    }
    *r = (tdm_lines){.f = f, .own = true, .name = path, .line_max = line_max, .total_max = total_max};
    return TANDEM_OK;
}

void tdm_lines_close(tdm_lines *r) {
    if (!r) return;
    if (r->own && r->f) fclose(r->f);
    free(r->buf);
    memset(r, 0, sizeof *r);
}

/* How often a wait for input on a terminal or pipe looks at r->stop: a signal may be
 * delivered to another thread, so the wait cannot count on EINTR alone. */
#define STOP_POLL_MS 100

/* Up to n bytes from a terminal or pipe into p, as soon as any have arrived: *got
 * 0 at the end.  Waits in poll() slices so that r->stop is seen. */
static tandem_status read_now(tdm_lines *r, char *p, size_t n, size_t *got, tdm_err *err) {
    const int fd = fileno(r->f);
    for (;;) {
        if (r->stop && *r->stop) return tdm_seterr(err, TANDEM_ERR_CANCELLED, "%s: interrupted", r->name);
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, r->stop ? STOP_POLL_MS : -1);
        if (pr < 0 && errno != EINTR) return read_error(r->name, err);
        if (pr <= 0) continue;
        ssize_t k = read(fd, p, n);
        if (k >= 0) {
            *got = (size_t)k;
            return TANDEM_OK;
        }
        if (errno != EINTR && errno != EAGAIN) return read_error(r->name, err);
    }
}

/* Reads more after the pending bytes (moved to the front), growing the buffer when
 * they fill it. */
static tandem_status lines_fill(tdm_lines *r, tdm_err *err) {
    if (r->start > 0) {
        memmove(r->buf, r->buf + r->start, r->end - r->start);
        r->end -= r->start;
        r->start = 0;
    }
    if (!grow_to(&r->buf, &r->cap, r->end + 1, r->line_max + 1))
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory reading '%s'", r->name);
    if (r->mode == 0) {
        struct stat st;
        const int fd = fileno(r->f);
        r->mode = fd >= 0 && fstat(fd, &st) == 0 && !S_ISREG(st.st_mode) ? 2 : 1;
    }
    size_t got = 0;
    if (r->mode == 2) {
        tandem_status st = read_now(r, r->buf + r->end, r->cap - r->end, &got, err);
        if (st) return st;
    } else {
        errno = 0;
        got = fread(r->buf + r->end, 1, r->cap - r->end, r->f);
    }
    r->end += got;
    r->total += got;
    if (r->total > r->total_max) return too_large(r->name, r->total_max, err);
    if (got == 0) {
        if (r->mode == 1 && ferror(r->f)) return read_error(r->name, err);
        r->eof = true;
    }
    return TANDEM_OK;
}

tandem_status tdm_lines_next(tdm_lines *r, const char **line, size_t *len, bool *got, tdm_err *err) {
    *line = NULL;
    *len = 0;
    *got = false;
    for (;;) {
        size_t pending = r->end - r->start;
        char *nl = pending ? memchr(r->buf + r->start, '\n', pending) : NULL;
        size_t n = nl ? (size_t)(nl - (r->buf + r->start)) : pending;
        if (n > r->line_max) {
            char b[32];
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s:%d: line longer than the %s limit", r->name,
                              r->line + 1, limit_str(r->line_max, b));
        }
        if (nl || (r->eof && pending > 0)) {
            *line = r->buf + r->start;
            *len = n;
            *got = true;
            r->start += nl ? n + 1 : n;
            r->line++;
            return TANDEM_OK;
        }
        if (r->eof) return TANDEM_OK;
        tandem_status st = lines_fill(r, err);
        if (st) return st;
    }
}
