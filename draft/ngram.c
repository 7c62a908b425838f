/* ngram.c - n-gram lookup proposals; see ngram.h.
 *
 * A backward scan: for a context of L tokens it costs at most L * n comparisons per
 * n-gram length (L <= n_ctx, so a few microseconds), which is negligible next to a
 * model forward, so no index is kept. */
#include "ngram.h"

int32_t tdm_ngram_propose_after(const int32_t *toks, int32_t len, const int32_t *tail, int32_t n_tail, int32_t n_max,
                                int32_t max_out, int32_t *out) {
    if (n_tail <= 0) return tdm_ngram_propose(toks, len, n_max, max_out, out);
    if (!toks || !tail || !out || max_out <= 0 || len < 0) return 0;
    if (n_max > TDM_NGRAM_MAX) n_max = TDM_NGRAM_MAX;
    const int32_t L = len + n_tail;
#define AT(i) ((i) < len ? toks[i] : tail[(i) - len])
    for (int32_t n = n_max; n >= TDM_NGRAM_MIN; n--) {
        if (L < n + 1) continue;
        for (int32_t j = L - n - 1; j >= 0; j--) {
            int32_t i = 0;
            while (i < n && AT(j + i) == AT(L - n + i)) i++;
            if (i < n) continue;
            const int32_t avail = L - (j + n), cnt = avail < max_out ? avail : max_out;
            for (int32_t c = 0; c < cnt; c++) out[c] = AT(j + n + c);
            return cnt;
        }
    }
#undef AT
    return 0;
}

int32_t tdm_ngram_propose_multi(const int32_t *toks, int32_t len, int32_t n_max, int32_t max_out, int32_t max_cands,
                                int32_t *out, int32_t *lens) {
    if (!toks || !out || !lens || max_out <= 0 || max_cands <= 0) return 0;
    if (n_max > TDM_NGRAM_MAX) n_max = TDM_NGRAM_MAX;
    int32_t got = 0;
    for (int32_t n = n_max; n >= TDM_NGRAM_MIN && got < max_cands; n--) {
        if (len < n + 1) continue;
        const int32_t *key = toks + len - n;
        for (int32_t j = len - n - 1; j >= 0 && got < max_cands; j--) {
            if (toks[j + n - 1] != key[n - 1] || toks[j] != key[0]) continue;
            int32_t i = 1;
            while (i < n - 1 && toks[j + i] == key[i]) i++;
            if (i < n - 1) continue;
            const int32_t *c = toks + j + n;
            const int32_t avail = len - (j + n), cnt = avail < max_out ? avail : max_out;
            bool seen = false; /* (the start of an earlier candidate, or one that starts with it) */
            for (int32_t q = 0; q < got && !seen; q++) {
                const int32_t m = cnt < lens[q] ? cnt : lens[q];
                int32_t x = 0;
                while (x < m && out[q * max_out + x] == c[x]) x++;
                seen = x == m;
            }
            if (seen) continue;
            for (int32_t x = 0; x < cnt; x++) out[got * max_out + x] = c[x];
            lens[got++] = cnt;
        }
    }
    return got;
}

int32_t tdm_ngram_propose(const int32_t *toks, int32_t len, int32_t n_max, int32_t max_out, int32_t *out) {
    int32_t n; /* (the first candidate of the multi-match scan) */
    return tdm_ngram_propose_multi(toks, len, n_max, max_out, 1, out, &n) ? n : 0;
}

bool tdm_ngram_take(double value_ngram, double value_draft, int32_t *n_skips) {
    return value_ngram >= value_draft || ++*n_skips % TDM_NGRAM_EXPLORE == 0;
}
