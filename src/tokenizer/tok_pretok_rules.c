/* tok_pretok_rules.c - the pre-tokenizers' regexes as code (tok_pretok.h lists them).
 *
 * Each function gives exactly what the regex engines of the references (Hugging
 * Face tokenizers' Oniguruma, Python's regex module) match: alternatives tried in
 * order, greedy quantifiers backtracking only as far as the rest needs.  Classes:
 * \s is White_Space, \p{..} the general categories of src/base/unicode_data.c, and an
 * invalid UTF-8 byte belongs to no category (as the U+FFFD a decoder puts there).
 * (?i:'s) also matches 's' written U+017F (long s), which case-folds to s.
 * Every match function runs in time linear in what it matches, so a piece costs
 * linear time whatever its content.
 */
#include "tok_pretok.h"
#include "unicode.h"

/* One piece: code points [.., end). */
typedef struct span {
    const uint32_t *cp;
    const uint16_t *fl;
    size_t end;
} span;

#define NO_CP 0xFFFFFFFFu

static inline uint32_t cp_at(const span *s, size_t i) { return i < s->end ? s->cp[i] : NO_CP; }
static inline uint16_t fl_at(const span *s, size_t i) { return i < s->end ? s->fl[i] : 0; }
static inline bool has(const span *s, size_t i, uint16_t f) { return (fl_at(s, i) & f) != 0; }
static inline bool is_rn(uint32_t c) { return c == '\r' || c == '\n'; }
static inline bool is_ws(const span *s, size_t i) { return has(s, i, TDM_UCD_WHITESPACE); }
/* [^\s\p{L}\p{N}] (inside the piece) */
static inline bool is_other(const span *s, size_t i) {
    return i < s->end && !has(s, i, TDM_UCD_WHITESPACE | TDM_UCD_LETTER | TDM_UCD_NUMBER);
}

static size_t run_of(const span *s, size_t i, uint16_t f) {
    while (has(s, i, f)) i++;
    return i;
}

static inline uint32_t lower_ascii(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

/* Length of 's|'t|'re|'ve|'m|'ll|'d at i (0 if none); icase: (?i:...). */
static size_t contraction(const span *s, size_t i, bool icase) {
    if (cp_at(s, i) != '\'') return 0;
    uint32_t a = cp_at(s, i + 1), b = cp_at(s, i + 2);
    if (icase) {
        a = a == 0x17F ? 's' : lower_ascii(a);
        b = lower_ascii(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at i (a whitespace): all of the run, but the last one when a
 * non-space follows it in the piece. */
static size_t spaces_end(const span *s, size_t i) {
    size_t e = run_of(s, i, TDM_UCD_WHITESPACE);
    return (e - i > 1 && e < s->end) ? e - 1 : e;
}

/* \s*[\r\n]+|\s+(?!\S)|\s+ at i (a whitespace): up to the run's last newline if it
 * has one. */
static size_t newline_spaces_end(const span *s, size_t i) {
    size_t e = run_of(s, i, TDM_UCD_WHITESPACE), last_nl = 0;
    for (size_t k = i; k < e; k++)
        if (is_rn(s->cp[k])) last_nl = k + 1;
    return last_nl ? last_nl : spaces_end(s, i);
}

/* \p{N}{1,max} at i (max 0: no limit); i if i is not a number. */
static size_t numbers_end(const span *s, size_t i, unsigned max) {
    size_t e = i;
    while (has(s, e, TDM_UCD_NUMBER) && (max == 0 || e - i < max)) e++;
    return e;
}

/* ------------------------------------------------------------------ GPT-2 */

static size_t gpt2_at(const span *s, size_t i) {
    size_t c = contraction(s, i, false);
    if (c) return i + c;
    size_t q = i + (cp_at(s, i) == ' ');
    if (q < s->end && !is_ws(s, q)) { /* ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+' */
        if (has(s, q, TDM_UCD_LETTER)) return run_of(s, q, TDM_UCD_LETTER);
        if (has(s, q, TDM_UCD_NUMBER)) return run_of(s, q, TDM_UCD_NUMBER);
        while (is_other(s, q)) q++;
        return q;
    }
    return spaces_end(s, i);
}

/* --------------------------------------------------------------- Llama 3 */

static size_t llama3_at(const span *s, size_t i, const tok_rule *r) {
    if (r->opts & RULE_CONTRACTIONS) {
        size_t c = contraction(s, i, true);
        if (c) return i + c;
    }
    uint16_t letter = TDM_UCD_LETTER | ((r->opts & RULE_MARKS) ? TDM_UCD_MARK : 0);
    uint32_t c0 = s->cp[i];
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    if (has(s, i, letter)) return run_of(s, i, letter);
    if (!is_rn(c0) && !has(s, i, TDM_UCD_NUMBER) && has(s, i + 1, letter)) return run_of(s, i + 1, letter);
    /* \p{N}{1,k} */
    if (has(s, i, TDM_UCD_NUMBER)) return numbers_end(s, i, r->arg);
    /* ' ?[^\s\p{L}\p{N}]+[\r\n]*' (Qwen 3.5: [^\s\p{L}\p{M}\p{N}]) */
    size_t q = i + (c0 == ' ');
    if (is_other(s, q) && !has(s, q, letter)) {
        while (is_other(s, q) && !has(s, q, letter)) q++;
        if (r->opts & RULE_PUNCT_NL)
            while (is_rn(cp_at(s, q))) q++;
        return q;
    }
    return newline_spaces_end(s, i); /* s->cp[i] is a whitespace here */
}

/* ----------------------------------------------------------------- o200k */

/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
static inline bool is_up(const span *s, size_t i) {
    uint16_t f = fl_at(s, i);
    return ((f & TDM_UCD_LETTER) && !(f & TDM_UCD_LOWER)) || (f & TDM_UCD_MARK);
}
static inline bool is_low(const span *s, size_t i) {
    uint16_t f = fl_at(s, i);
    return ((f & TDM_UCD_LETTER) && !(f & TDM_UCD_UPPER)) || (f & TDM_UCD_MARK);
}

/* [up]*[low]+ at q: its end, or q when it does not match.  The [up]* run gives back
 * characters until [low]+ can start: at the run's end if a lower-case letter follows
 * it, else at its last character that is also [low] (then [low]+ is that one). */
static size_t up_star_low_plus(const span *s, size_t q) {
    size_t e = q, last_both = SIZE_MAX;
    for (; is_up(s, e); e++)
        if (is_low(s, e)) last_both = e;
    if (is_low(s, e)) {
        while (is_low(s, e)) e++;
        return e;
    }
    return last_both != SIZE_MAX ? last_both + 1 : q;
}

/* [up]+[low]* at q: its end, or q. */
static size_t up_plus_low_star(const span *s, size_t q) {
    size_t e = q;
    while (is_up(s, e)) e++;
    if (e == q) return q;
    while (is_low(s, e)) e++;
    return e;
}

static size_t o200k_at(const span *s, size_t i, const tok_rule *r) {
    uint32_t c0 = s->cp[i];
    /* the optional [^\r\n\p{L}\p{N}] in front of both letter alternatives */
    bool pre = !is_rn(c0) && !has(s, i, TDM_UCD_LETTER | TDM_UCD_NUMBER);
    size_t e = i;
    if (pre && (e = up_star_low_plus(s, i + 1)) > i + 1) goto letters;
    if ((e = up_star_low_plus(s, i)) > i) goto letters;
    if (pre && (e = up_plus_low_star(s, i + 1)) > i + 1) goto letters;
    if ((e = up_plus_low_star(s, i)) > i) goto letters;
    if (has(s, i, TDM_UCD_NUMBER)) return numbers_end(s, i, r->arg);
    size_t q = i + (c0 == ' ');
    if (is_other(s, q)) { /* ' ?[^\s\p{L}\p{N}]+[\r\n/]*' */
        while (is_other(s, q)) q++;
        while (is_rn(cp_at(s, q)) || cp_at(s, q) == '/') q++;
        return q;
    }
    return newline_spaces_end(s, i);
letters:
    if (r->opts & RULE_CONTRACTIONS) e += contraction(s, e, true);
    return e;
}

/* ------------------------------------------------------------ DeepSeek V3 */

static inline bool is_ascii_punct(uint32_t c) {
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}
static inline bool is_ascii_alpha(uint32_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

/* i when nothing matches at i */
static size_t deepseek3_at(const span *s, size_t i) {
    uint32_t c0 = s->cp[i];
    if (is_ascii_punct(c0) && is_ascii_alpha(cp_at(s, i + 1))) {
        size_t e = i + 1;
        while (is_ascii_alpha(cp_at(s, e))) e++;
        return e;
    }
    const uint16_t lm = TDM_UCD_LETTER | TDM_UCD_MARK, ps = TDM_UCD_PUNCT | TDM_UCD_SYMBOL;
    if (has(s, i, lm)) return run_of(s, i, lm);
    if (!is_rn(c0) && !has(s, i, TDM_UCD_LETTER | ps) && has(s, i + 1, lm)) return run_of(s, i + 1, lm);
    size_t q = i + (c0 == ' ');
    if (has(s, q, ps)) {
        q = run_of(s, q, ps);
        while (is_rn(cp_at(s, q))) q++;
        return q;
    }
    if (is_ws(s, i)) return newline_spaces_end(s, i);
    return i;
}

/* ------------------------------------------------------------------ BLOOM */

static inline bool bloom_char(const span *s, size_t i) {
    if (i >= s->end || is_ws(s, i)) return false;
    switch (s->cp[i]) {
    case '(': case '|': case '.': case ',': case '!': case '?': case ')':
    case 0x2026: /* … */ case 0x3002: /* 。 */ case 0xFF0C: /* ， */ case 0x3001: /* 、 */
    case 0x0964: /* । */ case 0x06D4: /* ۔ */ case 0x060C: /* ، */
        return false;
    default:
        return true;
    }
}

static size_t bloom_at(const span *s, size_t i) {
    size_t q = i + (s->cp[i] == ' ');
    if (!bloom_char(s, q)) return i;
    while (bloom_char(s, q)) q++;
    return q;
}

/* ------------------------------------------------------------ sets, runs */

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

/* DeepSeek LLM's cased-letter class, as its pattern lists it */
static const cp_range deepseek_latin[] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377}, {0x37B, 0x37D},
    {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C}, {0x38E, 0x3A1}, {0x3A3, 0x3F5},
    {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5},
    {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77},
    {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D},
    {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D},
    {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC},
    {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC},
    {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D},
    {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134},
    {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184},
    {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D},
    {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF},
    {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F},
    {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2},
    {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
static const cp_range deepseek_punct[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E},
};
static const cp_range deepseek_cjk[] = {{0x800, 0x9FA5}, {0xAC00, 0xD7FF}}; /* 一-龥, ࠀ-一, 가-퟿ */
static const cp_range cjk_kana[] = {{0x3040, 0x30FF}, {0x4E00, 0x9FA5}};    /* ぀-ゟ, ゠-ヿ, 一-龥 */

static bool in_ranges(uint32_t c, const cp_range *r, size_t n) {
    size_t lo = 0, hi = n; /* sorted: binary search over [lo, hi) */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c > r[mid].hi) lo = mid + 1;
        else if (c < r[mid].lo) hi = mid;
        else return true;
    }
    return false;
}

#define IN(c, table) in_ranges((c), (table), sizeof(table) / sizeof(table)[0])

static bool in_set(const span *s, size_t i, unsigned set) {
    if (i >= s->end) return false;
    uint32_t c = s->cp[i];
    switch (set) {
    case SET_LETTER: return has(s, i, TDM_UCD_LETTER);
    case SET_PUNCT: return has(s, i, TDM_UCD_PUNCT);
    case SET_PUNCT_DEFAULT:
    case SET_PUNCT_FALCON:
        return has(s, i, TDM_UCD_PUNCT) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' ||
               c == '^' || c == '~' || c == '|' || (set == SET_PUNCT_FALCON && c == '`');
    case SET_DEEPSEEK_LATIN: return IN(c, deepseek_latin);
    case SET_DEEPSEEK_PUNCT: return IN(c, deepseek_punct);
    case SET_DEEPSEEK_CJK: return IN(c, deepseek_cjk);
    case SET_CJK_KANA: return IN(c, cjk_kana);
    default: return false;
    }
}

/* \s?[SET]+: the first i in [pos, end) where it matches */
static bool run_find(const span *s, const tok_rule *r, size_t pos, size_t *ms, size_t *me) {
    for (size_t i = pos; i < s->end; i++) {
        size_t q = i;
        if ((r->opts & RULE_WS_PREFIX) && is_ws(s, i) && in_set(s, i + 1, r->arg)) q = i + 1;
        else if (!in_set(s, i, r->arg)) continue;
        while (in_set(s, q, r->arg)) q++;
        *ms = i;
        *me = q;
        return true;
    }
    return false;
}

/* ---------------------------------------------------------------- finding */

/* Rules that match somewhere at almost every position: the first position where
 * match_at gives a non-empty match. */
static size_t match_at(const tok_rule *r, const span *s, size_t i) {
    switch (r->kind) {
    case RULE_GPT2: return gpt2_at(s, i);
    case RULE_LLAMA3: return llama3_at(s, i, r);
    case RULE_O200K: return o200k_at(s, i, r);
    case RULE_DEEPSEEK3: return deepseek3_at(s, i);
    case RULE_BLOOM: return bloom_at(s, i);
    case RULE_LINES: {
        bool nl = s->cp[i] == '\n';
        while (i < s->end && (s->cp[i] == '\n') == nl) i++;
        return i;
    }
    default: return i;
    }
}

static bool is_ascii_digit(const span *s, size_t i) { return cp_at(s, i) >= '0' && cp_at(s, i) <= '9'; }

/* The first match of rule r in [pos, s->end): true and [*ms, *me), or false. */
static bool find(const tok_rule *r, const span *s, size_t pos, size_t *ms, size_t *me) {
    size_t end = s->end;
    switch (r->kind) {
    case RULE_RUN: return run_find(s, r, pos, ms, me);
    case RULE_NUMBERS:
        for (size_t i = pos; i < end; i++)
            if (has(s, i, TDM_UCD_NUMBER)) {
                *ms = i;
                *me = numbers_end(s, i, r->arg);
                return true;
            }
        return false;
    case RULE_ASCII3:
        for (size_t i = pos; i + 3 <= end; i++)
            if (is_ascii_digit(s, i) && is_ascii_digit(s, i + 1) && is_ascii_digit(s, i + 2)) {
                *ms = i;
                *me = i + 3;
                return true;
            }
        return false;
    case RULE_NEWLINE:
        for (size_t i = pos; i < end; i++)
            if (is_rn(s->cp[i])) {
                *ms = i;
                *me = i + 1;
                return true;
            }
        return false;
    case RULE_TRAILING_WS: {
        size_t k = end;
        while (k > pos && is_ws(s, k - 1)) k--;
        *ms = k;
        *me = end;
        return k < end;
    }
    default:
        for (size_t i = pos; i < end; i++) {
            size_t e = match_at(r, s, i);
            if (e > i) {
                *ms = i;
                *me = e;
                return true;
            }
        }
        return false;
    }
}

/* (?=(\d{3})+(?!\d)): zero-width matches where a multiple of 3 digits follow in a
 * run of \d split the run into its leading 1 or 2 digits (joined to what precedes
 * them in the piece) and 3-digit groups. */
static bool thousands_split(const span *s, size_t start, tok_ends *out) {
    size_t prev = start;
    for (size_t i = start; i < s->end;) {
        if (!has(s, i, TDM_UCD_DIGIT)) {
            i++;
            continue;
        }
        size_t e = run_of(s, i, TDM_UCD_DIGIT);
        if (e - i >= 3)
            for (size_t g = i + (e - i) % 3; g < e; g += 3)
                if (g > prev) {
                    if (!tok_ends_push(out, g)) return false;
                    prev = g;
                }
        i = e;
    }
    return tok_ends_push(out, s->end);
}

bool tok_rule_split(const tok_rule *r, const tok_cps *t, size_t start, size_t end, tok_ends *out) {
    const span s = {t->cp, t->fl, end};
    if (r->kind == RULE_THOUSANDS) return thousands_split(&s, start, out);
    size_t pos = start, ms, me;
    while (pos < end && find(r, &s, pos, &ms, &me)) {
        if (ms > pos && !tok_ends_push(out, ms)) return false; /* the text before the match */
        if (!tok_ends_push(out, me)) return false;
        pos = me;
    }
    return pos == end || tok_ends_push(out, end);
}
