/* ngram.c - n-gram lookup proposals; see ngram.h.
 *
 * A backward scan: for a context of L tokens it costs at most L * n comparisons per
 * n-gram length (L <= n_ctx, so a few microseconds), which is negligible next to a
 * model forward, so no index is kept. */
#include "ngram.h"

int32_t tdm_ngram_propose(const int32_t *toks, int32_t len, int32_t n_max, int32_t max_out, int32_t *out) {
    if (!toks || !out || max_out <= 0) return 0;
    if (n_max > TDM_NGRAM_MAX) n_max = TDM_NGRAM_MAX;
    for (int32_t n = n_max; n >= TDM_NGRAM_MIN; n--) {
        if (len < n + 1) continue;
        const int32_t *key = toks + len - n;
        /* a match at j must leave at least one token after it before the key */
        for (int32_t j = len - n - 1; j >= 0; j--) {
            if (toks[j + n - 1] != key[n - 1] || toks[j] != key[0]) continue;
            int32_t i = 1;
            while (i < n - 1 && toks[j + i] == key[i]) i++;
            if (i < n - 1) continue;
            int32_t avail = len - (j + n), cnt = avail < max_out ? avail : max_out;
            for (int32_t c = 0; c < cnt; c++) out[c] = toks[j + n + c];
            return cnt;
        }
    }
    return 0;
}

bool tdm_ngram_take(double value_ngram, double value_draft, int32_t *n_skips) {
    return value_ngram >= value_draft || ++*n_skips % TDM_NGRAM_EXPLORE == 0;
}
