/* fuzz_json.c - libFuzzer harness for the JSON parser and string writer (not built
 * by default).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
 *       tests/fuzz/fuzz_json.c src/base/json.c src/base/unicode.c src/base/unicode_data.c src/base/common.c \
 *       -lm -o fuzz_json
 *   ./fuzz_json -max_len=4096 -max_total_time=240 corpus_json/
 *
 * Every input must either parse (then every member lookup, integer conversion and
 * string write works on the whole tree) or fail with a status and a non-empty
 * message and no tree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *null_out; /* /dev/null, opened once */

/* Walks the tree: checks the invariants of each node and exercises the accessors. */
static void walk(const tdm_json *j, int depth) {
    if (depth > TDM_JSON_MAX_DEPTH + 1) abort(); /* the depth limit was not enforced */
    int64_t iv;
    bool is_int = tdm_json_int(j, &iv);
    if (is_int && j->type != TDM_JSON_NUMBER) abort();
    if (is_int && (double)iv != j->num) abort(); /* "integral" must mean exact */
    uint64_t uv;
    if (tdm_json_u64(j, &uv) && (j->type != TDM_JSON_NUMBER || (double)uv != j->num)) abort();
    switch (j->type) {
    case TDM_JSON_NUMBER:
        if (!j->str || j->str_len == 0 || j->str[j->str_len] != 0) abort(); /* the literal */
        /* fall through */
    case TDM_JSON_NULL:
    case TDM_JSON_BOOL:
        if (tdm_json_get(j, "a") != NULL) abort(); /* not an object */
        break;
    case TDM_JSON_STRING:
        if (!j->str || j->str[j->str_len] != 0) abort();
        if (null_out) tdm_json_write_str(null_out, j->str, j->str_len);
        break;
    case TDM_JSON_ARRAY:
        if (j->n && !j->items) abort();
        if (tdm_json_get(j, "a") != NULL) abort();
        for (size_t i = 0; i < j->n; i++) walk(&j->items[i], depth + 1);
        break;
    case TDM_JSON_OBJECT:
        if (j->n && (!j->items || !j->keys)) abort();
        for (size_t i = 0; i < j->n; i++) {
            const char *k = j->keys[i];
            if (!k) abort();
            if (null_out) tdm_json_write_str(null_out, k, strlen(k));
            const tdm_json *m = tdm_json_get(j, k);
            if (!m) abort();
            /* names are unique (a repeated one fails the parse), so no earlier
             * member may have the same name */
            for (size_t e = 0; e < i && m == &j->items[i]; e++)
                if (strcmp(j->keys[e], k) == 0) abort();
            walk(&j->items[i], depth + 1);
        }
        if (tdm_json_get(j, "\x01 surely absent \x02") != NULL) abort();
        break;
    default:
        abort(); /* unknown type tag */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!null_out) null_out = fopen("/dev/null", "w");
    /* the raw input as a string too: invalid UTF-8, NUL and control bytes */
    if (null_out) tdm_json_write_str(null_out, (const char *)data, size);

    /* a private copy so ASan catches reads past the end of the input */
    char *text = malloc(size ? size : 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);

    tdm_json *j = NULL;
    tdm_err err = {0};
    tandem_status st = tdm_json_parse(text, size, &j, &err);
    if (st != TANDEM_OK) {
        if (j || err.msg[0] == 0) abort(); /* a contract violation: report it to the fuzzer */
        free(text);
        return 0;
    }
    if (!j) abort();
    walk(j, 0);
    tdm_json_get(NULL, "a");
    tdm_json_free(j);
    free(text);
    return 0;
}
