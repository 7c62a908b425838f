/* stop_arg.c - a request's stop strings from JSON (request_args.h): a prompt
 * file's "stop" member and the server's "stop" field. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request_args.h"

void tdm_arg_stop_free(char **stop, int n) {
    for (int i = 0; i < n; i++) free(stop[i]);
    free(stop);
}

/* A stop string: 1..TANDEM_STOP_LEN_MAX bytes, no NUL (the library takes C strings). */
static bool stop_one(const tdm_json *e, const char *at, char **out, char *why, size_t cap) {
    if (e->type != TDM_JSON_STRING) return snprintf(why, cap, "%s must be a string", at), false;
    if (e->str_len == 0) return snprintf(why, cap, "%s is empty", at), false;
    if (e->str_len > TANDEM_STOP_LEN_MAX)
        return snprintf(why, cap, "%s is longer than %d bytes", at, TANDEM_STOP_LEN_MAX), false;
    if (memchr(e->str, '\0', e->str_len)) return snprintf(why, cap, "%s holds a NUL byte", at), false;
    *out = tdm_strndup(e->str, e->str_len);
    return *out ? true : (snprintf(why, cap, ": out of memory"), false);
}

bool tdm_arg_stop_from_json(const tdm_json *v, char ***out, int *n, char *why, size_t cap) {
    *out = NULL;
    *n = 0;
    if (v->type != TDM_JSON_STRING && v->type != TDM_JSON_ARRAY)
        return snprintf(why, cap, " must be a string or an array of strings"), false;
    const bool one = v->type == TDM_JSON_STRING;
    const size_t count = one ? 1 : v->n;
    if (count > TANDEM_STOP_MAX)
        return snprintf(why, cap, " has %zu strings, more than %d", count, TANDEM_STOP_MAX), false;
    char **s = count ? calloc(count, sizeof *s) : NULL;
    if (count && !s) return snprintf(why, cap, ": out of memory"), false;
    for (size_t i = 0; i < count; i++) {
        char at[32] = "";
        if (!one) snprintf(at, sizeof at, "[%zu]", i);
        if (!stop_one(one ? v : &v->items[i], at, &s[i], why, cap)) {
            tdm_arg_stop_free(s, (int)count);
            return false;
        }
    }
    *out = s;
    *n = (int)count;
    return true;
}

