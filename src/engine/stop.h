/* stop.h - stop strings: where generated text must end, and how much of it may be
 * streamed before it is known not to begin one.
 *
 * A request's stop strings are copied into one tdm_stop (owned storage).  As text
 * grows, tdm_stop_find looks for the earliest occurrence that ends in the new part
 * (an occurrence that ended earlier was found then); tdm_stop_holdback says how many
 * trailing bytes could still be the start of a stop string, which a stream keeps
 * back until more text decides them. */
#ifndef TDM_STOP_H
#define TDM_STOP_H

#include <stddef.h>

#include "common.h"
#include "tandem.h"

typedef struct tdm_stop {
    char *str[TANDEM_STOP_MAX]; /* [n] NUL-terminated copies */
    size_t len[TANDEM_STOP_MAX];
    int n;
    size_t max_len;             /* longest of them */
} tdm_stop;

/* Copies and checks stops[0..n): n in [0, TANDEM_STOP_MAX], each non-NULL, 1 to
 * TANDEM_STOP_LEN_MAX bytes; TANDEM_ERR_INVALID_ARG naming the index otherwise.
 * On failure st is empty (nothing to free). */
tandem_status tdm_stop_init(tdm_stop *st, const char *const *stops, int n, tdm_err *err);
void tdm_stop_free(tdm_stop *st);

/* The offset of the earliest stop string in text[0, len) that ends after offset
 * `from` (bytes before it were already searched), or -1. */
ptrdiff_t tdm_stop_find(const tdm_stop *st, const char *text, size_t len, size_t from);

/* The length of the longest suffix of text[0, len) that is a proper prefix of a stop
 * string (0 when none, or no stop strings). */
size_t tdm_stop_holdback(const tdm_stop *st, const char *text, size_t len);

#endif
