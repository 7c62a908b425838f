/* strings.c - Python's str operations on UTF-8 strings, as templates use them:
 * strip (Python's whitespace), case mapping, replace, split, splitlines. */
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

/* Whether cp is one of the code points of chars (NULL: whitespace). */
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
    while (left && b < e) {
        int k;
        uint32_t cp = decode_at(s->s, e, b, &k);
        if (!in_set(cp, chars)) break;
        b += (size_t)k;
    }
    while (right && e > b) {
        size_t p = e - 1;
        while (p > b && ((unsigned char)s->s[p] & 0xC0) == 0x80) p--;
        int k;
        uint32_t cp = decode_at(s->s, e, p, &k);
        if (p + (size_t)k != e) p = e - 1, cp = TDM_UTF8_INVALID; /* a stray continuation byte */
        if (!in_set(cp, chars)) break;
        e = p;
    }
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
    if (!r) return NULL;
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

const jj_str *jj_s_replace(jj_ctx *c, const jj_str *s, const jj_str *old, const jj_str *new_, int64_t count) {
    jj_buf b = {0};
    bool ok = true;
    size_t i = 0;
    int64_t done = 0;
    if (old->len == 0) { /* Python inserts new before every character and at the end */
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
            const char *hit = (count < 0 || done < count) ? memmem(s->s + i, s->len - i, old->s, old->len) : NULL;
            if (!hit) {
                ok = jj_buf_add(c, &b, s->s + i, s->len - i);
                break;
            }
            size_t at = (size_t)(hit - s->s);
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
            const char *hit = (maxsplit < 0 || done < maxsplit) && i <= s->len
                                  ? memmem(s->s + i, s->len - i, sep->s, sep->len) : NULL;
            if (!hit) return push_piece(c, l, s->s + i, s->len - i) ? l : NULL;
            if (!push_piece(c, l, s->s + i, (size_t)(hit - s->s) - i)) return NULL;
            i = (size_t)(hit - s->s) + sep->len;
            done++;
        }
    }
    /* rsplit with a limit: cut the last maxsplit pieces from the right */
    size_t end = s->len;
    size_t *cuts = jj_alloc(c, ((size_t)maxsplit + 1) * sizeof *cuts);
    if (!cuts) return NULL;
    int64_t n = 0;
    while (n < maxsplit && end >= sep->len) {
        size_t p = end - sep->len;
        for (;; p--) {
            if (memcmp(s->s + p, sep->s, sep->len) == 0) break;
            if (p == 0) {
                p = SIZE_MAX;
                break;
            }
        }
        if (p == SIZE_MAX) break;
        cuts[n++] = p;
        end = p;
    }
    size_t prev = 0;
    for (int64_t k = n - 1; k >= 0; k--) {
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

jj_list *jj_s_splitlines(jj_ctx *c, const jj_str *s) {
    jj_list *l = jj_list_new(c, 0);
    if (!l) return NULL;
    size_t b = 0;
    for (size_t i = 0; i < s->len;) {
        size_t k = line_break_at(s->s, s->len, i);
        if (!k) {
            i++;
            continue;
        }
        if (!push_piece(c, l, s->s + b, i - b)) return NULL;
        i += k;
        b = i;
    }
    if (b < s->len && !push_piece(c, l, s->s + b, s->len - b)) return NULL;
    return l;
}
