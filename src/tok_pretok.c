/* tok_pretok.c - pre-tokenizer regex splitting, hand-written per regex.
 *
 * The text is decoded to code points first (invalid UTF-8 bytes become one
 * "other" code point each), then a matcher walks the code points and records
 * piece boundaries.  Character classes as the regexes use them:
 *   L = \p{L}, N = \p{N}, S = \s (White_Space), O = anything else
 * (unassigned code points and invalid bytes are O, as [^\s\p{L}\p{N}] matches them).
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "unicode.h"

enum { CL_NONE = 0, CL_L, CL_N, CL_S, CL_O };

typedef struct cpbuf {
    uint32_t *cp;   /* [n] code points */
    size_t *off;    /* [n + 1] byte offset of each code point, off[n] = len */
    uint8_t *cl;    /* [n] CL_* */
    size_t n;
} cpbuf;

static uint8_t classify(uint32_t cp) {
    uint8_t f = tdm_unicode_flags(cp);
    if (f & TDM_UCD_LETTER) return CL_L;
    if (f & TDM_UCD_NUMBER) return CL_N;
    if (f & TDM_UCD_WHITESPACE) return CL_S;
    return CL_O;
}

/* A matcher sees code points [start, end) of the buffer. */
typedef struct span {
    const cpbuf *b;
    size_t end;
} span;

static inline uint8_t cls(const span *s, size_t i) { return i < s->end ? s->b->cl[i] : CL_NONE; }
static inline uint32_t cpt(const span *s, size_t i) { return i < s->end ? s->b->cp[i] : 0xFFFFFFFFu; }

static bool emit(tok_spans *o, size_t end_byte) {
    if (o->n && o->end[o->n - 1] == end_byte) return true; /* empty piece */
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        size_t *ne = realloc(o->end, nc * sizeof *ne);
        if (!ne) return false;
        o->end = ne;
        o->cap = nc;
    }
    o->end[o->n++] = end_byte;
    return true;
}

static inline uint32_t ascii_lower(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* Length of a contraction 's 't 're 've 'm 'll 'd at pos (0 if none). */
static size_t contraction(const span *s, size_t pos, bool icase) {
    if (cpt(s, pos) != '\'') return 0;
    uint32_t a = cpt(s, pos + 1), b = cpt(s, pos + 2);
    if (icase) {
        a = ascii_lower(a);
        b = ascii_lower(b);
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Whitespace tail shared by the regexes: \s+(?!\S)|\s+ at pos (pos is S). */
static size_t whitespace_end(const span *s, size_t pos) {
    size_t n = 0;
    while (cls(s, pos + n) == CL_S) n++;
    if (n > 1 && pos + n < s->end) return pos + n - 1; /* leave one before \S */
    return pos + (n ? n : 1);
}

/* GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static bool split_gpt2(const cpbuf *b, size_t start, size_t end, tok_spans *o) {
    span s = {b, end};
    size_t pos = start;
    while (pos < end) {
        size_t next;
        size_t c = contraction(&s, pos, false);
        if (c) {
            next = pos + c;
        } else {
            bool sp = cpt(&s, pos) == ' ';
            uint8_t k = sp ? cls(&s, pos + 1) : cls(&s, pos);
            if (k == CL_L || k == CL_N || k == CL_O) {
                next = pos + sp;
                while (cls(&s, next) == k) next++;
            } else {
                next = whitespace_end(&s, pos);
            }
        }
        pos = next;
        if (!emit(o, b->off[pos])) return false;
    }
    return true;
}

/* Llama 3 (digits_max = 3) and Qwen2 (digits_max = 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static bool split_llama3(const cpbuf *b, size_t start, size_t end, int digits_max, tok_spans *o) {
    span s = {b, end};
    size_t pos = start;
    while (pos < end) {
        size_t next = 0;
        uint32_t c0 = cpt(&s, pos);
        uint8_t k0 = cls(&s, pos);
        size_t c = contraction(&s, pos, true);
        if (c) {
            next = pos + c;
        } else if (c0 != '\r' && c0 != '\n' && k0 != CL_N &&
                   (k0 == CL_L || cls(&s, pos + 1) == CL_L)) {
            next = pos + 1; /* the optional prefix char, or the first letter */
            while (cls(&s, next) == CL_L) next++;
        } else if (k0 == CL_N) {
            next = pos;
            while (cls(&s, next) == CL_N && next - pos < (size_t)digits_max) next++;
        } else if ((c0 == ' ' ? cls(&s, pos + 1) : k0) == CL_O) {
            next = pos + (c0 == ' ');
            while (cls(&s, next) == CL_O) next++;
            while (cpt(&s, next) == '\r' || cpt(&s, next) == '\n') next++;
        } else {
            /* k0 is whitespace here */
            size_t n = 0, last_nl = 0;
            while (cls(&s, pos + n) == CL_S) {
                uint32_t w = cpt(&s, pos + n);
                n++;
                if (w == '\r' || w == '\n') last_nl = pos + n;
            }
            if (last_nl) next = last_nl;                 /* \s*[\r\n]+ */
            else next = whitespace_end(&s, pos);         /* \s+(?!\S)|\s+ */
        }
        pos = next;
        if (!emit(o, b->off[pos])) return false;
    }
    return true;
}

/* StarCoder: \p{N} split first (each digit alone), then GPT-2 on the rest. */
static bool split_starcoder(const cpbuf *b, tok_spans *o) {
    size_t pos = 0;
    while (pos < b->n) {
        if (b->cl[pos] == CL_N) {
            pos++;
            if (!emit(o, b->off[pos])) return false;
            continue;
        }
        size_t e = pos;
        while (e < b->n && b->cl[e] != CL_N) e++;
        if (!split_gpt2(b, pos, e, o)) return false;
        pos = e;
    }
    return true;
}

bool tok_pretokenize(tok_pre pre, const char *text, size_t len, tok_spans *out) {
    out->n = 0;
    if (len == 0) return true;
    cpbuf b = {0};
    b.cp = tdm_mallocarray(len, sizeof *b.cp);
    b.off = tdm_mallocarray(len + 1, sizeof *b.off);
    b.cl = tdm_malloc(len);
    bool ok = b.cp && b.off && b.cl;
    if (ok) {
        const uint8_t *u = (const uint8_t *)text;
        size_t i = 0;
        while (i < len) {
            uint32_t cp;
            int k = tdm_utf8_decode(u + i, len - i, &cp);
            b.off[b.n] = i;
            b.cp[b.n] = cp;
            b.cl[b.n] = (cp & TDM_UTF8_INVALID) ? CL_O : classify(cp);
            b.n++;
            i += (size_t)k;
        }
        b.off[b.n] = len;
        switch (pre) {
        case TOK_PRE_GPT2: ok = split_gpt2(&b, 0, b.n, out); break;
        case TOK_PRE_LLAMA3: ok = split_llama3(&b, 0, b.n, 3, out); break;
        case TOK_PRE_QWEN2: ok = split_llama3(&b, 0, b.n, 1, out); break;
        case TOK_PRE_STARCODER: ok = split_starcoder(&b, out); break;
        }
    }
    free(b.cp);
    free(b.off);
    free(b.cl);
    return ok;
}
