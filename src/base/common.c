/* common.c - error messages, checked allocation, clock, file reading. */
#define _POSIX_C_SOURCE 200809L
#include "common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

tandem_status tdm_seterr(tdm_err *err, tandem_status status, const char *fmt, ...) {
    if (err) {
        err->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

void *tdm_malloc(size_t n) { return n ? malloc(n) : NULL; }

void *tdm_calloc(size_t n, size_t size) {
    size_t tot;
    if (tdm_mul_overflow_size(n, size, &tot) || tot == 0) return NULL;
    return calloc(n, size);
}

void *tdm_mallocarray(size_t n, size_t size) {
    size_t tot;
    if (tdm_mul_overflow_size(n, size, &tot) || tot == 0) return NULL;
    return malloc(tot);
}

void *tdm_alloc_aligned(size_t n, size_t align) {
    void *p = NULL;
    if (n == 0) n = align;
    if (posix_memalign(&p, align, n) != 0) return NULL;
    return p;
}

void tdm_free_aligned(void *p) { free(p); }

char *tdm_strndup(const char *s, size_t n) {
    char *r = malloc(n + 1);
    if (!r) return NULL;
    memcpy(r, s, n);
    r[n] = 0;
    return r;
}

double tdm_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

tandem_status tdm_read_file(const char *path, char **out, size_t *out_len, tdm_err *err) {
    *out = NULL;
    if (out_len) *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return tdm_seterr(err, TANDEM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory reading '%s'", path);
    }
    for (;;) {
        if (len + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory reading '%s'", path);
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        return tdm_seterr(err, TANDEM_ERR_IO, "error reading '%s'", path);
    }
    buf[len] = 0;
    *out = buf;
    if (out_len) *out_len = len;
    return TANDEM_OK;
}
