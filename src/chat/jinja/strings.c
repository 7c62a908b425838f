/* strings.c - Python's str operations on UTF-8 strings, as templates use them:
 * strip (Python's whitespace), case mapping, find / rfind, replace, split, splitlines.
 * Each is linear in the bytes it walks and charges them (jj_work): JJ_SCAN a byte for
 * the searches and decoding walks, JJ_ITEM a byte where each character takes calls. */
#include <stdlib.h>
#include <string.h>

#include "jj_internal.h"
#include "unicode.h"

bool jj_is_space(uint32_t cp) {
    return (cp >= 0x1C && cp <= 0x1F) || (cp < 0x80000000u && tdm_unicode_is_space(cp));
}

static uint32_t decode_at(const char *s, size_t n, size_t i, int *k) {
    uint32_t cp;
    *k = tdm_utf8_decode((const uint8_t *)s + i, n - i, &cp);
    return cp;
}

/* Whether cp is one of the code points of chars (NULL: whitespace); the caller
 * charges chars' bytes. */
static bool in_set(uint32_t cp, const jj_str *chars) {
    if (!chars) return jj_is_space(cp);
    for (size_t i = 0; i < chars->len;) {
        int k;
        if (decode_at(chars->s, chars->len, i, &k) == cp) return true;
        i += (size_t)k;
    }
    return false;
}

const jj_str *jj_s_strip(jj_ctx *c, const jj_str *s, const jj_str *chars, bool left, bool right) {
    size_t b = 0, e = s->len;
    const size_t per = 4 + (chars ? chars->len : 0); /* bytes scanned to test one character */
    while (left && b < e && jj_work(c, per, JJ_SCAN)) {
        int k;
        uint32_t cp = decode_at(s->s, e, b, &k);
        if (!in_set(cp, chars)) break;
        b += (size_t)k;
    }
    while (right && e > b && jj_work(c, per, JJ_SCAN)) {
        size_t p = e - 1;
        while (p > b && ((unsigned char)s->s[p] & 0xC0) == 0x80) p--;
        int k;
        uint32_t cp = decode_at(s->s, e, p, &k);
        if (p + (size_t)k != e) p = e - 1, cp = TDM_UTF8_INVALID; /* a stray continuation byte */
        if (!in_set(cp, chars)) break;
        e = p;
    }
    if (jj_over(c)) return NULL;
    if (b == 0 && e == s->len) return s;
    return jj_str_new(c, s->s + b, e - b);
}

/* Simple case mapping: ASCII, Latin-1, Greek and Cyrillic. */
static uint32_t to_upper(uint32_t cp) {
    if (cp >= 'a' && cp <= 'z') return cp - 32;
    if ((cp >= 0xE0 && cp <= 0xFE && cp != 0xF7) || (cp >= 0x3B1 && cp <= 0x3C9 && cp != 0x3C2) ||
        (cp >= 0x430 && cp <= 0x44F))
        return cp - 32;
    if (cp >= 0x450 && cp <= 0x45F) return cp - 80;
    return cp;
}

static uint32_t to_lower(uint32_t cp) {
    if (cp >= 'A' && cp <= 'Z') return cp + 32;
    if ((cp >= 0xC0 && cp <= 0xDE && cp != 0xD7) || (cp >= 0x391 && cp <= 0x3A9 && cp != 0x3A2) ||
        (cp >= 0x410 && cp <= 0x42F))
        return cp + 32;
    if (cp >= 0x400 && cp <= 0x40F) return cp + 80;
    return cp;
}

static bool is_cased(uint32_t cp) { return to_upper(cp) != cp || to_lower(cp) != cp; }

/* jinja2's title filter starts a word after these (and whitespace). */
static bool title_break(uint32_t cp) { return cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || jj_is_space(cp); }

const jj_str *jj_s_case(jj_ctx *c, const jj_str *s, jj_case mode) {
    jj_str *r = (jj_str *)jj_str_new(c, s->s, s->len); /* a copy, same length: the mapping keeps UTF-8 widths */
    if (!r || !jj_work(c, s->len, JJ_ITEM)) return NULL; /* a character mapped, re-encoded: a step a byte */
    bool start = true, prev_cased = false;
    for (size_t i = 0; i < s->len;) {
        int k;
        uint32_t cp = decode_at(s->s, s->len, i, &k), m = cp;
        switch (mode) {
        case JJ_UPPER: m = to_upper(cp); break;
        case JJ_LOWER: m = to_lower(cp); break;
        case JJ_CAPITALIZE: m = i == 0 ? to_upper(cp) : to_lower(cp); break;
        case JJ_TITLE: /* jinja2: each piece after a break: first character upper, the rest lower */
            if (title_break(cp)) {
                start = true;
            } else {
                m = start ? to_upper(cp) : to_lower(cp);
                start = false;
            }
            break;
        case JJ_PYTITLE: /* str.title: upper after an uncased character */
            m = prev_cased ? to_lower(cp) : to_upper(cp);
            prev_cased = is_cased(cp);
            break;
        }
        if (m != cp && cp < 0x80000000u) {
            char enc[4];
            int kk = tdm_utf8_encode(m, enc);
            if (kk == k) memcpy(r->s + i, enc, (size_t)k);
        }
        i += (size_t)k;
    }
    return r;
}

/* Knuth-Morris-Pratt: the first occurrence of sub (not empty) in hay[0..n) reading
 * forwards, or the last one reading backwards (both strings reversed); its offset, or
 * SIZE_MAX.  Linear: each byte read advances the scan or shortens the match state.
 * (Not memmem: glibc's is linear too, but AddressSanitizer checks the whole haystack
 * on every call, which a loop of searches through one string makes quadratic.) */
static size_t kmp(jj_ctx *c, const char *hay, size_t n, const jj_str *sub, bool backwards) {
    const size_t m = sub->len;
    size_t small[64], *border = m <= TDM_ARRAY_LEN(small) ? small : jj_alloc(c, m * sizeof *border);
    if (!border || !jj_work(c, 1, JJ_ITEM) || !jj_work(c, m, JJ_SCAN)) return SIZE_MAX;
#define P(j) (backwards ? sub->s[m - 1 - (j)] : sub->s[j])
#define H(i) (backwards ? hay[n - 1 - (i)] : hay[i])
    border[0] = 0; /* border[j]: the longest proper border of P(0..j) */
    for (size_t j = 1, k = 0; j < m; j++) {
        while (k > 0 && P(j) != P(k)) k = border[k - 1];
        if (P(j) == P(k)) k++;
        border[j] = k;
    }
    size_t i = 0, q = 0;
    for (; i < n; i++) {
        while (q > 0 && H(i) != P(q)) q = border[q - 1];
        if (H(i) == P(q) && ++q == m) break;
    }
#undef P
#undef H
    if (!jj_work(c, i < n ? i + 1 : n, JJ_SCAN) || q < m) return SIZE_MAX;
    return backwards ? n - 1 - i : i + 1 - m;
}

size_t jj_s_find(jj_ctx *c, const char *s, size_t n, size_t from, const jj_str *sub) {
    if (from > n || sub->len > n - from) return SIZE_MAX;
    if (sub->len == 0) return from;
    const size_t at = kmp(c, s + from, n - from, sub, false);
    return at == SIZE_MAX ? at : from + at;
}

size_t jj_s_rfind(jj_ctx *c, const char *s, size_t end, const jj_str *sub) {
    if (sub->len > end) return SIZE_MAX;
    return sub->len ? kmp(c, s, end, sub, true) : end;
}

const jj_str *jj_s_replace(jj_ctx *c, const jj_str *s, const jj_str *old, const jj_str *new_, int64_t count) {
    jj_buf b = {0};
    bool ok = true;
    size_t i = 0;
    int64_t done = 0;
    if (old->len == 0) { /* Python inserts new before every character and at the end */
        ok = jj_work(c, s->len, JJ_ITEM); /* two appends a character */
        while (ok && (count < 0 || done < count) && i <= s->len) {
            ok = jj_buf_add(c, &b, new_->s, new_->len);
            done++;
            if (i == s->len) {
                i++;
                break;
            }
            int k;
            decode_at(s->s, s->len, i, &k);
            ok = ok && jj_buf_add(c, &b, s->s + i, (size_t)k);
            i += (size_t)k;
        }
        if (ok && i < s->len) ok = jj_buf_add(c, &b, s->s + i, s->len - i);
    } else {
        while (ok && i < s->len) {
            const size_t at = (count < 0 || done < count) ? jj_s_find(c, s->s, s->len, i, old) : SIZE_MAX;
            if (at == SIZE_MAX) {
                ok = !jj_over(c) && jj_buf_add(c, &b, s->s + i, s->len - i);
                break;
            }
            ok = jj_buf_add(c, &b, s->s + i, at - i) && jj_buf_add(c, &b, new_->s, new_->len);
            i = at + old->len;
            done++;
        }
    }
    const jj_str *r = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
    free(b.p);
    return r;
}

static bool push_piece(jj_ctx *c, jj_list *l, const char *p, size_t n) {
    const jj_str *s = jj_str_new(c, p, n);
    return s && jj_list_push(c, l, jv_str(s));
}

/* Whitespace splitting (sep None): runs of whitespace separate, none at the ends. */
static bool split_ws(jj_ctx *c, const jj_str *s, int64_t maxsplit, jj_list *l) {
    size_t i = 0;
    int64_t done = 0;
    if (!jj_work(c, s->len, JJ_SCAN)) return false;
    for (;;) {
        int k;
        while (i < s->len && jj_is_space(decode_at(s->s, s->len, i, &k))) i += (size_t)k;
        if (i >= s->len) return true;
        if (maxsplit >= 0 && done >= maxsplit) {
            size_t e = s->len; /* the rest, trailing whitespace removed */
            const jj_str *rest = jj_str_new(c, s->s + i, e - i), *t = rest ? jj_s_strip(c, rest, NULL, false, true) : NULL;
            return t && jj_list_push(c, l, jv_str(t));
        }
        size_t b = i;
        while (i < s->len && !jj_is_space(decode_at(s->s, s->len, i, &k))) i += (size_t)k;
        if (!push_piece(c, l, s->s + b, i - b)) return false;
        done++;
    }
}

jj_list *jj_s_split(jj_ctx *c, const jj_str *s, const jj_str *sep, int64_t maxsplit, bool from_right) {
    jj_list *l = jj_list_new(c, 0);
    if (!l) return NULL;
    if (!sep) {
        if (from_right && maxsplit >= 0)
            return jj_fail(c, NULL, TANDEM_ERR_UNSUPPORTED, "rsplit() without a separator but with a limit"), NULL;
        return split_ws(c, s, maxsplit, l) ? l : NULL;
    }
    if (sep->len == 0) return jj_fail(c, NULL, TANDEM_ERR_FORMAT, "split: empty separator"), NULL;
    if (!from_right || maxsplit < 0) {
        size_t i = 0;
        int64_t done = 0;
        for (;;) {
            const size_t at = maxsplit < 0 || done < maxsplit ? jj_s_find(c, s->s, s->len, i, sep) : SIZE_MAX;
            if (at == SIZE_MAX) return !jj_over(c) && push_piece(c, l, s->s + i, s->len - i) ? l : NULL;
            if (!push_piece(c, l, s->s + i, at - i)) return NULL;
            i = at + sep->len;
            done++;
        }
    }
    /* rsplit with a limit: cut the last maxsplit pieces from the right (at most one
     * cut per separator's length of the string) */
    size_t end = s->len;
    const size_t most = TDM_MIN((uint64_t)maxsplit, s->len / sep->len);
    size_t *cuts = jj_alloc(c, (most + 1) * sizeof *cuts);
    if (!cuts) return NULL;
    size_t n = 0;
    while (n < most) {
        size_t p = jj_s_rfind(c, s->s, end, sep);
        if (p == SIZE_MAX) break;
        cuts[n++] = p;
        end = p;
    }
    if (jj_over(c)) return NULL;
    size_t prev = 0;
    for (size_t k = n; k-- > 0;) {
        if (!push_piece(c, l, s->s + prev, cuts[k] - prev)) return NULL;
        prev = cuts[k] + sep->len;
    }
    return push_piece(c, l, s->s + prev, s->len - prev) ? l : NULL;
}

/* Python's line boundaries: \n \r \r\n \v \f \x1c \x1d \x1e \x85 U+2028 U+2029. */
static size_t line_break_at(const char *s, size_t n, size_t i) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '\r') return i + 1 < n && s[i + 1] == '\n' ? 2 : 1;
    if (ch == '\n' || ch == '\v' || ch == '\f' || (ch >= 0x1C && ch <= 0x1E)) return 1;
    if (ch == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] == 0x85) return 2;
    if (ch == 0xE2 && i + 2 < n && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9))
        return 3;
    return 0;
}

jj_list *jj_s_splitlines(jj_ctx *c, const jj_str *s, bool keepends) {
    jj_list *l = jj_list_new(c, 0);
    if (!l || !jj_work(c, s->len, JJ_SCAN)) return NULL;
    size_t b = 0;
    for (size_t i = 0; i < s->len;) {
        size_t k = line_break_at(s->s, s->len, i);
        if (!k) {
            i++;
            continue;
        }
        if (!push_piece(c, l, s->s + b, i + (keepends ? k : 0) - b)) return NULL;
        i += k;
        b = i;
    }
    if (b < s->len && !push_piece(c, l, s->s + b, s->len - b)) return NULL;
    return l;
}
