/* lexer.c - Jinja source -> tokens, with whitespace control as jinja2's lexer
 * applies it under trim_blocks and lstrip_blocks:
 *   - "{%-" / "{{-" / "{#-" strip the whitespace before the tag, "-%}" / "-}}" / "-#}"
 *     the whitespace after it;
 *   - trim_blocks: the first newline after a block tag or a comment is removed;
 *   - lstrip_blocks: spaces and tabs from the start of a line up to a block tag or a
 *     comment are removed ("{%+" keeps them).
 * Inside tags: names, numbers, strings (Python escapes), operators.  "}}" and "%}"
 * end a tag only outside brackets, so dict literals work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jj_internal.h"
#include "unicode.h"

typedef struct lexer {
    const char *s;
    size_t n, pos;
    int line, col;    /* of pos */
    jj_arena *a;      /* the decoded strings */
    size_t budget;    /* bytes for the tokens and the strings together */
    jj_token *toks;   /* malloc'ed */
    size_t n_toks, cap;
    tdm_err *err;
} lexer;

static bool lex_fail(lexer *L, int line, int col, const char *fmt, const char *arg) {
    char raw[200], m[200];
    snprintf(raw, sizeof raw, fmt, arg);
    tdm_jinja_escape(m, sizeof m, raw);
    tdm_seterr(L->err, TANDEM_ERR_FORMAT, "line %d, column %d: %s", line, col, m);
    return false;
}

/* Moves pos to p, counting lines. */
static void advance_to(lexer *L, size_t p) {
    for (; L->pos < p; L->pos++) {
        if (L->s[L->pos] == '\n') {
            L->line++;
            L->col = 1;
        } else if (((unsigned char)L->s[L->pos] & 0xC0) != 0x80) {
            L->col++;
        }
    }
}

static jj_token *push(lexer *L, jj_tk kind, int line, int col) {
    if (L->n_toks == L->cap) {
        size_t nc = L->cap ? L->cap * 2 : 64;
        const size_t bytes = nc * sizeof *L->toks;
        jj_token *nt = bytes < L->budget - L->a->used ? realloc(L->toks, bytes) : NULL;
        if (!nt) return jj_parse_nomem(L->err), NULL;
        L->toks = nt;
        L->cap = nc;
        L->a->limit = L->budget - bytes; /* the strings get what the tokens leave (> 0: 0 is none) */
    }
    jj_token *t = &L->toks[L->n_toks++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = line;
    t->col = col;
    return t;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
static bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* Emits the data [start, end) with the whitespace rules of the tag that follows
 * (kind '{', '%', '#' or 0 at the end; mod its '-' / '+' / 0). */
static bool emit_data(lexer *L, size_t start, size_t end, char kind, char mod, bool line_start, int line,
                      int col) {
    if (mod == '-') {
        while (end > start && is_ws(L->s[end - 1])) end--;
    } else if ((kind == '%' || kind == '#') && mod != '+') {
        size_t l = end;
        while (l > start && L->s[l - 1] != '\n') l--;
        if (l > start || line_start) {
            size_t k = l;
            while (k < end && is_ws(L->s[k])) k++;
            if (k == end) end = l;
        }
    }
    if (end == start) return true;
    jj_token *t = push(L, TK_DATA, line, col);
    if (!t) return false;
    t->p = L->s + start;
    t->n = end - start;
    return true;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A string literal at pos (quote q): decoded with Python's escapes into the token. */
static bool lex_string(lexer *L, jj_token *t) {
    const char q = L->s[L->pos];
    size_t i = L->pos + 1, end = i;
    while (end < L->n && L->s[end] != q) end += L->s[end] == '\\' ? 2 : 1;
    if (end >= L->n) return lex_fail(L, t->line, t->col, "unterminated string literal%s", "");
    char *o = jj_arena_alloc(L->a, end - i + 1);
    if (!o) return jj_parse_nomem(L->err);
    size_t k = 0;
    while (i < end) {
        char ch = L->s[i++];
        if (ch != '\\') {
            o[k++] = ch;
            continue;
        }
        char e = L->s[i++];
        uint32_t cp = 0;
        int nhex = 0;
        switch (e) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\\': case '\'': case '"': o[k++] = e; break;
        case '\n': break; /* a continued line */
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int d = 0; d < 2 && i < end && L->s[i] >= '0' && L->s[i] <= '7'; d++) cp = cp * 8 + (uint32_t)(L->s[i++] - '0');
                k += (size_t)tdm_utf8_encode(cp, o + k);
            } else {
                o[k++] = '\\';
                o[k++] = e;
            }
        }
        if (nhex) {
            for (int d = 0; d < nhex; d++) {
                int h = i < end ? hexval(L->s[i]) : -1;
                if (h < 0) return lex_fail(L, t->line, t->col, "bad \\%s escape in a string literal", e == 'x' ? "x" : e == 'u' ? "u" : "U");
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                return lex_fail(L, t->line, t->col, "escape outside Unicode in a string literal%s", "");
            k += (size_t)tdm_utf8_encode(cp, o + k);
        }
    }
    o[k] = 0;
    t->p = o;
    t->n = k;
    advance_to(L, end + 1);
    return true;
}

static bool lex_number(lexer *L, jj_token *t) {
    size_t i = L->pos;
    char buf[64];
    size_t k = 0;
    bool is_float = false;
    while (i < L->n && (is_digit(L->s[i]) || L->s[i] == '_')) {
        if (L->s[i] != '_' && k < sizeof buf - 1) buf[k++] = L->s[i];
        i++;
    }
    if (i + 1 < L->n && L->s[i] == '.' && is_digit(L->s[i + 1])) {
        is_float = true;
        if (k < sizeof buf - 1) buf[k++] = '.';
        i++;
        while (i < L->n && (is_digit(L->s[i]) || L->s[i] == '_')) {
            if (L->s[i] != '_' && k < sizeof buf - 1) buf[k++] = L->s[i];
            i++;
        }
    }
    if (i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < L->n && (L->s[j] == '+' || L->s[j] == '-')) j++;
        if (j < L->n && is_digit(L->s[j])) {
            is_float = true;
            while (i < j && k < sizeof buf - 1) buf[k++] = L->s[i++];
            while (i < L->n && is_digit(L->s[i])) {
                if (k < sizeof buf - 1) buf[k++] = L->s[i];
                i++;
            }
        }
    }
    buf[k] = 0;
    if (k >= sizeof buf - 1) return lex_fail(L, t->line, t->col, "number literal too long%s", "");
    if (is_float) {
        t->kind = TK_FLOAT;
        t->f = strtod(buf, NULL);
    } else {
        t->kind = TK_INT;
        uint64_t v = 0;
        for (size_t d = 0; d < k; d++) {
            if (v > (uint64_t)INT64_MAX / 10 || (v == (uint64_t)INT64_MAX / 10 && (uint64_t)(buf[d] - '0') > (uint64_t)INT64_MAX % 10))
                return lex_fail(L, t->line, t->col, "integer literal %s is too large", buf);
            v = v * 10 + (uint64_t)(buf[d] - '0');
        }
        t->i = (int64_t)v;
    }
    advance_to(L, i);
    return true;
}

static const char *const ops2[] = {"**", "//", "==", "!=", "<=", ">="};
static const char ops1[] = "+-*/%~()[]{},.:|<>=";

/* The tokens of one tag up to its end ("}}" for '{', "%}" for '%'); sets *after to
 * '-' or '+' from a modifier before the end (else 0). */
static bool lex_tag(lexer *L, char kind, char *after, int tline, int tcol) {
    int depth = 0;
    const char end1 = kind == '{' ? '}' : '%';
    for (;;) {
        while (L->pos < L->n && is_ws(L->s[L->pos])) advance_to(L, L->pos + 1);
        if (L->pos >= L->n)
            return lex_fail(L, tline, tcol, "unclosed tag: expected '%s'", kind == '{' ? "}}" : "%}");
        const char *p = L->s + L->pos;
        size_t left = L->n - L->pos;
        if (depth == 0) {
            if (left >= 3 && (p[0] == '-' || (p[0] == '+' && kind == '%')) && p[1] == end1 && p[2] == '}') {
                *after = p[0];
                advance_to(L, L->pos + 3);
                break;
            }
            if (left >= 2 && p[0] == end1 && p[1] == '}') {
                advance_to(L, L->pos + 2);
                break;
            }
        }
        jj_token *t = push(L, TK_OP, L->line, L->col);
        if (!t) return false;
        if (is_name_start(*p)) {
            size_t k = 1;
            while (k < left && (is_name_start(p[k]) || is_digit(p[k]))) k++;
            t->kind = TK_NAME;
            t->p = p;
            t->n = k;
            advance_to(L, L->pos + k);
        } else if (is_digit(*p)) {
            if (!lex_number(L, t)) return false;
        } else if (*p == '\'' || *p == '"') {
            t->kind = TK_STRING;
            if (!lex_string(L, t)) return false;
        } else {
            size_t k = 0;
            for (size_t o = 0; o < TDM_ARRAY_LEN(ops2) && !k; o++)
                if (left >= 2 && p[0] == ops2[o][0] && p[1] == ops2[o][1]) k = 2;
            if (!k && strchr(ops1, *p) && *p) k = 1;
            if (!k) {
                char c[8];
                snprintf(c, sizeof c, (unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f ? "\\x%02x" : "%c",
                         (unsigned char)*p);
                return lex_fail(L, L->line, L->col, "unexpected character '%s' in a tag", c);
            }
            if (k == 1 && (*p == '(' || *p == '[' || *p == '{')) depth++;
            if (k == 1 && (*p == ')' || *p == ']' || *p == '}')) {
                if (depth == 0) return lex_fail(L, L->line, L->col, "unbalanced '%c' in a tag", p[0] == ')' ? ")" : p[0] == ']' ? "]" : "}");
                depth--;
            }
            t->p = p;
            t->n = k;
            advance_to(L, L->pos + k);
        }
    }
    return push(L, kind == '{' ? TK_VAR_END : TK_BLOCK_END, L->line, L->col) != NULL;
}

/* After a tag: "-" strips the whitespace that follows, else trim_blocks removes one
 * newline after a block tag or a comment ("+" keeps it). */
static void after_tag(lexer *L, char kind, char mod) {
    if (mod == '-') {
        size_t p = L->pos;
        while (p < L->n && is_ws(L->s[p])) p++;
        advance_to(L, p);
    } else if (kind != '{' && mod != '+' && L->pos < L->n && L->s[L->pos] == '\n') {
        advance_to(L, L->pos + 1);
    }
}

/* "{% raw %}" at the tag whose body starts at pos (after "{%" and a modifier)? */
static bool is_raw_tag(const lexer *L, size_t p, const char *word, size_t *after) {
    while (p < L->n && is_ws(L->s[p])) p++;
    size_t wl = strlen(word);
    if (L->n - p < wl || memcmp(L->s + p, word, wl) != 0) return false;
    p += wl;
    if (p < L->n && (is_name_start(L->s[p]) || is_digit(L->s[p]))) return false;
    while (p < L->n && is_ws(L->s[p])) p++;
    if (p < L->n && (L->s[p] == '-' || L->s[p] == '+')) p++;
    if (L->n - p < 2 || L->s[p] != '%' || L->s[p + 1] != '}') return false;
    *after = p + 2;
    return true;
}

/* The body of {% raw %}: data up to {% endraw %} (whose own whitespace marks work). */
static bool lex_raw(lexer *L, int tline, int tcol) {
    after_tag(L, '%', L->s[L->pos - 3]); /* "-%}" or "+%}" of the raw tag */
    size_t start = L->pos;
    for (size_t p = start; p + 1 < L->n; p++) {
        if (L->s[p] != '{' || L->s[p + 1] != '%') continue;
        size_t q = p + 2, after;
        char mod = 0;
        if (q < L->n && (L->s[q] == '-' || L->s[q] == '+')) mod = L->s[q++];
        if (!is_raw_tag(L, q, "endraw", &after)) continue;
        int line = L->line, col = L->col;
        if (!emit_data(L, start, p, '%', mod, false, line, col)) return false;
        advance_to(L, after);
        after_tag(L, '%', L->s[after - 3]);
        return true;
    }
    return lex_fail(L, tline, tcol, "unclosed {%% raw %%}: expected {%% endraw %%}%s", "");
}

/* The tokens of the whole source, then EOF. */
static bool lex_all(lexer *L) {
    bool line_start = true;
    while (L->pos < L->n) {
        size_t start = L->pos, p = start;
        int dline = L->line, dcol = L->col;
        while (p + 1 < L->n && !(L->s[p] == '{' && (L->s[p + 1] == '{' || L->s[p + 1] == '%' || L->s[p + 1] == '#'))) p++;
        if (p + 1 >= L->n) { /* no more tags */
            if (!emit_data(L, start, L->n, 0, 0, line_start, dline, dcol)) return false;
            break;
        }
        const char kind = L->s[p + 1];
        char mod = p + 2 < L->n && (L->s[p + 2] == '-' || L->s[p + 2] == '+') ? L->s[p + 2] : 0;
        if (kind == '{' && mod == '+') mod = 0; /* "{{+" is "{{" then a unary plus */
        if (!emit_data(L, start, p, kind, mod, line_start, dline, dcol)) return false;
        advance_to(L, p);
        const int tline = L->line, tcol = L->col;
        advance_to(L, p + 2 + (mod ? 1 : 0));
        char after_mod = 0;
        size_t raw_after = 0;
        if (kind == '#') {
            const char *e = NULL;
            for (size_t q = L->pos; q + 1 < L->n; q++)
                if (L->s[q] == '#' && L->s[q + 1] == '}') {
                    e = L->s + q;
                    break;
                }
            if (!e) return lex_fail(L, tline, tcol, "unclosed comment: expected '#}'%s", "");
            after_mod = e > L->s + L->pos && (e[-1] == '-' || e[-1] == '+') ? e[-1] : 0;
            advance_to(L, (size_t)(e - L->s) + 2);
        } else if (kind == '%' && is_raw_tag(L, L->pos, "raw", &raw_after)) {
            advance_to(L, raw_after);
            if (!lex_raw(L, tline, tcol)) return false;
            line_start = L->pos > 0 && L->s[L->pos - 1] == '\n';
            continue;
        } else {
            if (!push(L, kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, tline, tcol)) return false;
            if (!lex_tag(L, kind, &after_mod, tline, tcol)) return false;
        }
        after_tag(L, kind, after_mod);
        line_start = L->pos > 0 && L->s[L->pos - 1] == '\n';
    }
    return push(L, TK_EOF, L->line, L->col) != NULL;
}

bool jj_lex(const char *src, size_t len, jj_arena *a, jj_token **out, size_t *n_out, tdm_err *err) {
    lexer L = {.s = src, .n = len, .line = 1, .col = 1, .a = a, .budget = a->limit, .err = err};
    if (!lex_all(&L)) {
        free(L.toks);
        return false;
    }
    *out = L.toks;
    *n_out = L.n_toks;
    return true;
}
