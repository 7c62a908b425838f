/* stop.c - stop strings (stop.h). */
#include "stop.h"

#include <stdlib.h>
#include <string.h>

tandem_status tdm_stop_init(tdm_stop *st, const char *const *stops, int n, tdm_err *err) {
    memset(st, 0, sizeof *st);
    if (n < 0 || n > TANDEM_STOP_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "n_stop %d is out of range [0, %d]", n, TANDEM_STOP_MAX);
    if (n > 0 && !stops) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "stop is NULL with n_stop %d", n);
    for (int i = 0; i < n; i++) {
        size_t l = stops[i] ? strlen(stops[i]) : 0;
        if (l == 0 || l > TANDEM_STOP_LEN_MAX) {
            tdm_stop_free(st);
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "stop string %d is %s (1 to %d bytes)", i,
                              !stops[i] ? "NULL" : l == 0 ? "empty" : "too long", TANDEM_STOP_LEN_MAX);
        }
        st->str[i] = malloc(l + 1);
        if (!st->str[i]) {
            tdm_stop_free(st);
            return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        }
        memcpy(st->str[i], stops[i], l + 1);
        st->len[i] = l;
        st->n = i + 1;
        if (l > st->max_len) st->max_len = l;
    }
    return TANDEM_OK;
}

void tdm_stop_free(tdm_stop *st) {
    for (int i = 0; i < st->n; i++) free(st->str[i]);
    memset(st, 0, sizeof *st);
}

ptrdiff_t tdm_stop_find(const tdm_stop *st, const char *text, size_t len, size_t from) {
    ptrdiff_t best = -1;
    for (int i = 0; i < st->n; i++) {
        const size_t l = st->len[i];
        if (l > len) continue;
        /* an occurrence ending after `from` starts at or after from + 1 - l */
        size_t p = from + 1 > l ? from + 1 - l : 0;
        for (; p + l <= len; p++) {
            if (best >= 0 && (ptrdiff_t)p >= best) break;
            if (text[p] == st->str[i][0] && memcmp(text + p, st->str[i], l) == 0) {
                best = (ptrdiff_t)p;
                break;
            }
        }
    }
    return best;
}

size_t tdm_stop_holdback(const tdm_stop *st, const char *text, size_t len) {
    size_t best = 0;
    for (int i = 0; i < st->n; i++) {
        const size_t l = st->len[i];
        for (size_t k = TDM_MIN(l - 1, len); k > best; k--)
            if (memcmp(text + len - k, st->str[i], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}
