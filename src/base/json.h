/* json.h - a small, strict JSON parser (RFC 8259) and string writer.
 *
 * Used for prompt files (untrusted input: depth, sizes and escapes are checked and
 * errors name the line/column) and for test data.  Strings are decoded to UTF-8
 * (\uXXXX surrogate pairs combined; a lone surrogate is an error) and may contain
 * NUL bytes, so they carry a length.  A number keeps the literal as written beside
 * its nearest double, so integers of any size and ids can be had exactly.  A member
 * name repeated in one object is an error (RFC 8259 leaves its meaning open; a
 * reader that took the first or the last would silently drop the other).
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
    double num;          /* NUMBER: the nearest double (+-HUGE_VAL beyond its range) */
    char *str;           /* STRING: NUL-terminated, str_len bytes (may contain NUL);
                            NUMBER: the literal as written ("-1.50e3"), NUL-terminated */
    size_t str_len;
    size_t n;            /* ARRAY / OBJECT: element count */
    tdm_json *items;     /* [n] elements / member values */
    char **keys;         /* OBJECT: [n] NUL-terminated member names */
};

/* Parses exactly one JSON value (surrounding whitespace allowed). */
tandem_status tdm_json_parse(const char *text, size_t len, tdm_json **out, tdm_err *err);
void tdm_json_free(tdm_json *j); /* NULL is a no-op */

/* Member lookup (names are unique); NULL if absent or j is not an object. */
const tdm_json *tdm_json_get(const tdm_json *j, const char *key);
/* The exact value of a number whose literal denotes an integer (any spelling: 12,
 * 12.0, 1.2e1, 120e-1) in [-2^63, 2^63 - 1] (tdm_json_int) or [0, 2^64 - 1]
 * (tdm_json_u64); false for any other value or type.  Computed from the literal,
 * never through a double. */
bool tdm_json_int(const tdm_json *j, int64_t *out);
bool tdm_json_u64(const tdm_json *j, uint64_t *out);

/* Writes s as a JSON string literal (quotes, escapes; invalid UTF-8 bytes become
 * U+FFFD so the output is always valid JSON). */
void tdm_json_write_str(FILE *f, const char *s, size_t len);
/* Writes a whole value as JSON text (numbers as their literals; member names
 * holding a NUL are cut at it).  Parsing the text gives the same tree back. */
void tdm_json_write(FILE *f, const tdm_json *j);
/* A heap copy of j's compact text (as tdm_json_write writes it), NUL-terminated; NULL
 * out of memory. */
char *tdm_json_text(const tdm_json *j);

#endif
