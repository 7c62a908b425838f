/* common.h - internal helpers shared by every part of tandem.
 *
 * Error convention: internal functions return a tandem_status and, on failure,
 * fill a caller-provided tdm_err with a message that names the problem (the key,
 * tensor, file offset, ...).  A NULL tdm_err is allowed and means "don't care".
 * Nothing in the library calls abort() or exit() on input.
 */
#ifndef TDM_COMMON_H
#define TDM_COMMON_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tandem.h"

#define TDM_ERR_MSG_LEN 256

typedef struct tdm_err {
    tandem_status status;
    char msg[TDM_ERR_MSG_LEN];
} tdm_err;

/* Sets err (if non-NULL) and returns status, so callers can write
 * `return tdm_seterr(err, TANDEM_ERR_FORMAT, "bad key '%s'", key);`. */
tandem_status tdm_seterr(tdm_err *err, tandem_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Overflow-checked arithmetic: return true on overflow. */
static inline bool tdm_add_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}
static inline bool tdm_mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline bool tdm_mul_overflow_size(size_t a, size_t b, size_t *out) {
    return __builtin_mul_overflow(a, b, out);
}

/* Allocation helpers: never abort; return NULL on failure or overflow. */
void *tdm_malloc(size_t n);                  /* malloc, NULL for n == 0 too */
void *tdm_calloc(size_t n, size_t size);     /* overflow-checked calloc */
void *tdm_mallocarray(size_t n, size_t size);/* overflow-checked malloc */
void *tdm_alloc_aligned(size_t n, size_t align); /* free with tdm_free_aligned */
void tdm_free_aligned(void *p);
char *tdm_strndup(const char *s, size_t n);

/* Monotonic clock in seconds. */
double tdm_now(void);

/* Read a whole file into a NUL-terminated heap buffer, without a size limit: for
 * trusted files (test data, benchmarks); untrusted input goes through input.h. */
tandem_status tdm_read_file(const char *path, char **out, size_t *out_len, tdm_err *err);

#define TDM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TDM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TDM_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* The smallest float >= v (v >= 0): how every bound is rounded to float. */
static inline float tdm_float_up(double v) {
    float f = (float)v;
    return (double)f < v ? nextafterf(f, INFINITY) : f;
}

#endif
