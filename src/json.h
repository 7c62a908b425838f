/* json.h - a small, strict JSON parser (RFC 8259) and string writer.
 *
 * Used for prompt files (untrusted input: depth, sizes and escapes are checked and
 * errors name the line/column) and for test data.  Strings are decoded to UTF-8
 * (\uXXXX surrogate pairs combined; a lone surrogate is an error) and may contain
 * NUL bytes, so they carry a length.
 */
#ifndef TDM_JSON_H
#define TDM_JSON_H

#include <stdio.h>

#include "common.h"

typedef enum tdm_json_type {
    TDM_JSON_NULL,
    TDM_JSON_BOOL,
    TDM_JSON_NUMBER,
    TDM_JSON_STRING,
    TDM_JSON_ARRAY,
    TDM_JSON_OBJECT,
} tdm_json_type;

#define TDM_JSON_MAX_DEPTH 64

typedef struct tdm_json tdm_json;
struct tdm_json {
    tdm_json_type type;
    bool b;              /* BOOL */
    double num;          /* NUMBER */
    char *str;           /* STRING: NUL-terminated, str_len bytes (may contain NUL) */
    size_t str_len;
    size_t n;            /* ARRAY / OBJECT: element count */
    tdm_json *items;     /* [n] elements / member values */
    char **keys;         /* OBJECT: [n] NUL-terminated member names */
};

/* Parses exactly one JSON value (surrounding whitespace allowed). */
tandem_status tdm_json_parse(const char *text, size_t len, tdm_json **out, tdm_err *err);
void tdm_json_free(tdm_json *j); /* NULL is a no-op */

/* Member lookup (first match); NULL if absent or j is not an object. */
const tdm_json *tdm_json_get(const tdm_json *j, const char *key);
/* Number -> integer when it is integral and within range; false otherwise. */
bool tdm_json_int(const tdm_json *j, int64_t *out);

/* Writes s as a JSON string literal (quotes, escapes; invalid UTF-8 bytes become
 * U+FFFD so the output is always valid JSON). */
void tdm_json_write_str(FILE *f, const char *s, size_t len);

#endif
