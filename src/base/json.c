/* json.c - strict RFC 8259 JSON parser to a DOM, and a string writer.
 *
 * Recursive descent with an explicit depth limit (TDM_JSON_MAX_DEPTH).  Every
 * error names line:column (1-based; columns count bytes).
 */
#include "json.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "unicode.h"

typedef struct parser {
    const uint8_t *s;   /* [len] input */
    size_t len;
    size_t pos;
    tdm_err *err;
    tandem_status status; /* first error, TANDEM_OK while fine */
} parser;

static void pos_to_linecol(const parser *p, size_t pos, size_t *line, size_t *col) {
    size_t l = 1, c = 1;
    for (size_t i = 0; i < pos && i < p->len; i++) {
        if (p->s[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

__attribute__((format(printf, 3, 4)))
static bool fail_at(parser *p, size_t pos, const char *fmt, ...) {
    if (p->status != TANDEM_OK) return false;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    size_t line, col;
    pos_to_linecol(p, pos, &line, &col);
    p->status = TANDEM_ERR_FORMAT;
    tdm_seterr(p->err, TANDEM_ERR_FORMAT, "JSON %zu:%zu: %s", line, col, what);
    return false;
}

static bool fail_nomem(parser *p) {
    if (p->status != TANDEM_OK) return false;
    p->status = TANDEM_ERR_NOMEM;
    tdm_seterr(p->err, TANDEM_ERR_NOMEM, "JSON: out of memory at byte %zu", p->pos);
    return false;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        uint8_t c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static const char *describe(parser *p, char buf[16]) {
    if (p->pos >= p->len) return "end of input";
    uint8_t c = p->s[p->pos];
    if (c >= 0x20 && c < 0x7F) snprintf(buf, 16, "'%c'", c);
    else snprintf(buf, 16, "byte 0x%02X", c);
    return buf;
}

/* ---- strings */

typedef struct sbuf {
    char *p;
    size_t n, cap;
} sbuf;

static bool sbuf_put(sbuf *b, const char *src, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 32;
        while (cap < b->n + n + 1) {
            if (cap > SIZE_MAX / 2) return false;
            cap *= 2;
        }
        char *np = realloc(b->p, cap);
        if (!np) return false;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static int hexval(uint8_t c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static bool read_hex4(parser *p, size_t at, uint32_t *out) {
    if (at + 4 > p->len) return fail_at(p, at, "truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p->s[at + i]);
        if (h < 0) return fail_at(p, at + i, "bad hex digit in \\u escape");
        v = (v << 4) | (uint32_t)h;
    }
    *out = v;
    return true;
}

/* Parses a string literal at p->pos (which is '"'); the result is malloc'ed. */
static bool parse_string(parser *p, char **out, size_t *out_len) {
    size_t start = p->pos;
    p->pos++; /* opening quote */
    sbuf b = {0};
    if (!sbuf_put(&b, "", 0)) return fail_nomem(p);
    for (;;) {
        if (p->pos >= p->len) {
            free(b.p);
            return fail_at(p, start, "unterminated string");
        }
        uint8_t c = p->s[p->pos];
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            free(b.p);
            return fail_at(p, p->pos, "control character 0x%02X in string", c);
        }
        if (c == '\\') {
            size_t esc = p->pos;
            if (p->pos + 1 >= p->len) {
                free(b.p);
                return fail_at(p, esc, "unterminated escape");
            }
            uint8_t e = p->s[p->pos + 1];
            char ch = 0;
            switch (e) {
            case '"': ch = '"'; break;
            case '\\': ch = '\\'; break;
            case '/': ch = '/'; break;
            case 'b': ch = '\b'; break;
            case 'f': ch = '\f'; break;
            case 'n': ch = '\n'; break;
            case 'r': ch = '\r'; break;
            case 't': ch = '\t'; break;
            case 'u': break;
            default:
                free(b.p);
                return fail_at(p, esc, "invalid escape '\\%c'", e >= 0x20 && e < 0x7F ? e : '?');
            }
            if (e != 'u') {
                p->pos += 2;
                if (!sbuf_put(&b, &ch, 1)) {
                    free(b.p);
                    return fail_nomem(p);
                }
                continue;
            }
            uint32_t cp;
            if (!read_hex4(p, p->pos + 2, &cp)) {
                free(b.p);
                return false;
            }
            p->pos += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF) {
                free(b.p);
                return fail_at(p, esc, "lone low surrogate \\u%04X", cp);
            }
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (p->pos + 1 >= p->len || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u') {
                    free(b.p);
                    return fail_at(p, esc, "lone high surrogate \\u%04X", cp);
                }
                if (!read_hex4(p, p->pos + 2, &lo)) {
                    free(b.p);
                    return false;
                }
                if (lo < 0xDC00 || lo > 0xDFFF) {
                    free(b.p);
                    return fail_at(p, esc, "high surrogate \\u%04X not followed by a low surrogate", cp);
                }
                p->pos += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            char enc[4];
            int n = tdm_utf8_encode(cp, enc);
            if (!sbuf_put(&b, enc, (size_t)n)) {
                free(b.p);
                return fail_nomem(p);
            }
            continue;
        }
        /* raw UTF-8: copy a maximal run of plain bytes after validating */
        uint32_t cp;
        int n = tdm_utf8_decode(p->s + p->pos, p->len - p->pos, &cp);
        if (cp & TDM_UTF8_INVALID) {
            free(b.p);
            return fail_at(p, p->pos, "invalid UTF-8 byte 0x%02X in string", c);
        }
        if (!sbuf_put(&b, (const char *)p->s + p->pos, (size_t)n)) {
            free(b.p);
            return fail_nomem(p);
        }
        p->pos += (size_t)n;
    }
    *out = b.p;
    *out_len = b.n;
    return true;
}

/* ---- numbers */

static bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }

/* Parses a number at p->pos into v: the literal (malloc'ed) and its nearest double. */
static bool parse_number(parser *p, tdm_json *v) {
    size_t start = p->pos, i = p->pos;
    if (i < p->len && p->s[i] == '-') i++;
    if (i >= p->len || !is_digit(p->s[i])) return fail_at(p, i, "expected a digit in number");
    if (p->s[i] == '0') {
        i++;
        if (i < p->len && is_digit(p->s[i])) return fail_at(p, i, "leading zero in number");
    } else {
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    if (i < p->len && p->s[i] == '.') {
        i++;
        if (i >= p->len || !is_digit(p->s[i])) return fail_at(p, i, "expected a digit after '.'");
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->len || !is_digit(p->s[i])) return fail_at(p, i, "expected a digit in exponent");
        while (i < p->len && is_digit(p->s[i])) i++;
    }
    size_t n = i - start;
    char *lit = malloc(n + 1);
    if (!lit) return fail_nomem(p);
    memcpy(lit, p->s + start, n);
    lit[n] = 0;
    v->str = lit;
    v->str_len = n;
    v->num = strtod(lit, NULL); /* overflow gives +-HUGE_VAL: still a number */
    p->pos = i;
    return true;
}

/* A valid number literal as digits d[0..nd) times 10^exp10 (digits of the integer and
 * the fraction part in one run).  The exponent saturates far beyond any integer. */
typedef struct num_digits {
    const char *ip, *fp; /* integer / fraction digits */
    size_t ni, nf;
    int64_t exp10;
} num_digits;

static char digit_at(const num_digits *d, size_t k) { return k < d->ni ? d->ip[k] : d->fp[k - d->ni]; }

static bool split_literal(const char *s, size_t n, bool *neg, num_digits *d) {
    size_t i = 0;
    *neg = n > 0 && s[0] == '-';
    if (*neg) i++;
    *d = (num_digits){.ip = s + i};
    while (i < n && is_digit((uint8_t)s[i])) i++, d->ni++;
    if (i < n && s[i] == '.') {
        d->fp = s + ++i;
        while (i < n && is_digit((uint8_t)s[i])) i++, d->nf++;
    }
    int64_t e = 0;
    bool eneg = false;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-')) eneg = s[i++] == '-';
        for (; i < n && is_digit((uint8_t)s[i]); i++)
            if (e < 1000000000) e = e * 10 + (s[i] - '0');
    }
    if (i != n || d->ni == 0) return false; /* not a literal of parse_number */
    d->exp10 = (eneg ? -e : e) - (int64_t)d->nf;
    return true;
}

/* The exact magnitude of a number literal when it denotes an integer below 2^64. */
static bool literal_integer(const tdm_json *j, bool *neg, uint64_t *mag) {
    num_digits d;
    if (!j || j->type != TDM_JSON_NUMBER || !j->str || !split_literal(j->str, j->str_len, neg, &d)) return false;
    size_t nd = d.ni + d.nf, a = 0, b = nd;
    while (a < nd && digit_at(&d, a) == '0') a++;
    *mag = 0;
    if (a == nd) return true; /* zero, in any spelling */
    while (digit_at(&d, b - 1) == '0') b--;
    int64_t e = d.exp10 + (int64_t)(nd - b); /* value = digits [a, b) * 10^e */
    if (e < 0 || (int64_t)(b - a) + e > 20) return false;
    uint64_t m = 0;
    for (size_t k = a; k < b; k++)
        if (__builtin_mul_overflow(m, 10, &m) || __builtin_add_overflow(m, (uint64_t)(digit_at(&d, k) - '0'), &m))
            return false;
    for (int64_t k = 0; k < e; k++)
        if (__builtin_mul_overflow(m, 10, &m)) return false;
    *mag = m;
    return true;
}

/* ---- values */

static bool parse_value(parser *p, tdm_json *v, int depth);

static bool grow(void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t nc = *cap ? *cap * 2 : 4;
    if (nc < need) nc = need;
    size_t bytes;
    if (tdm_mul_overflow_size(nc, elem, &bytes)) return false;
    void *np = realloc(*arr, bytes);
    if (!np) return false;
    *arr = np;
    *cap = nc;
    return true;
}

/* Starts an array or object at its opening bracket; true when it is empty (the
 * closing bracket consumed too). */
static bool open_container(parser *p, tdm_json *v, tdm_json_type type, uint8_t close) {
    v->type = type;
    p->pos++; /* '[' or '{' */
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return true;
    }
    return false;
}

static bool parse_array(parser *p, tdm_json *v, int depth) {
    size_t cap = 0;
    if (open_container(p, v, TDM_JSON_ARRAY, ']')) return true;
    for (;;) {
        if (!grow((void **)&v->items, &cap, v->n + 1, sizeof *v->items)) return fail_nomem(p);
        tdm_json *e = &v->items[v->n];
        memset(e, 0, sizeof *e);
        v->n++;
        skip_ws(p);
        if (!parse_value(p, e, depth + 1)) return false;
        skip_ws(p);
        char d[16];
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == ']') {
            p->pos++;
            return true;
        }
        return fail_at(p, p->pos, "expected ',' or ']' in array, got %s", describe(p, d));
    }
}

/* A member name of the object being parsed: where it starts, for the duplicate check. */
typedef struct member_name {
    const char *s;   /* the decoded name (owned by the object) */
    size_t len;      /* its length (names may hold NUL bytes) */
    size_t pos;      /* input offset of its opening quote */
} member_name;

static int cmp_member_name(const void *a, const void *b) {
    const member_name *x = a, *y = b;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    int c = memcmp(x->s, y->s, x->len);
    if (c) return c;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Fails at the first repetition (in input order) of a name among names[0..n)
 * (sorted in place: O(n log n), so a line of many members stays cheap). */
static bool check_unique_names(parser *p, member_name *names, size_t n) {
    if (n < 2) return true;
    qsort(names, n, sizeof *names, cmp_member_name);
    const member_name *dup = NULL;
    for (size_t i = 1; i < n; i++) {
        const member_name *a = &names[i - 1], *b = &names[i];
        if (a->len == b->len && memcmp(a->s, b->s, a->len) == 0 && (!dup || b->pos < dup->pos)) dup = b;
    }
    if (!dup) return true;
    char shown[48]; /* the name, printable ASCII only, cut at 40 bytes */
    size_t k = 0;
    for (size_t i = 0; i < dup->len && k < 40; i++) {
        uint8_t c = (uint8_t)dup->s[i];
        shown[k++] = c >= 0x20 && c < 0x7F && c != '"' ? (char)c : '?';
    }
    shown[k] = 0;
    return fail_at(p, dup->pos, "duplicate member name \"%s%s\"", shown, dup->len > k ? "..." : "");
}

static bool parse_members(parser *p, tdm_json *v, int depth, member_name **names, size_t *ncap) {
    size_t cap = 0, kcap = 0;
    for (;;) {
        char d[16];
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != '"')
            return fail_at(p, p->pos, "expected a member name string, got %s", describe(p, d));
        if (!grow((void **)&v->items, &cap, v->n + 1, sizeof *v->items) ||
            !grow((void **)&v->keys, &kcap, v->n + 1, sizeof *v->keys) ||
            !grow((void **)names, ncap, v->n + 1, sizeof **names))
            return fail_nomem(p);
        tdm_json *e = &v->items[v->n];
        memset(e, 0, sizeof *e);
        v->keys[v->n] = NULL;
        v->n++;
        member_name *nm = &(*names)[v->n - 1];
        nm->pos = p->pos;
        if (!parse_string(p, &v->keys[v->n - 1], &nm->len)) return false;
        nm->s = v->keys[v->n - 1];
        skip_ws(p);
        if (p->pos >= p->len || p->s[p->pos] != ':')
            return fail_at(p, p->pos, "expected ':' after member name, got %s", describe(p, d));
        p->pos++;
        skip_ws(p);
        if (!parse_value(p, e, depth + 1)) return false;
        skip_ws(p);
        if (p->pos < p->len && p->s[p->pos] == ',') {
            p->pos++;
            continue;
        }
        if (p->pos < p->len && p->s[p->pos] == '}') {
            p->pos++;
            return check_unique_names(p, *names, v->n);
        }
        return fail_at(p, p->pos, "expected ',' or '}' in object, got %s", describe(p, d));
    }
}

static bool parse_object(parser *p, tdm_json *v, int depth) {
    if (open_container(p, v, TDM_JSON_OBJECT, '}')) return true;
    member_name *names = NULL;
    size_t ncap = 0;
    bool ok = parse_members(p, v, depth, &names, &ncap);
    free(names);
    return ok;
}

static bool match_word(parser *p, const char *w) {
    size_t n = strlen(w);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n) != 0) return false;
    p->pos += n;
    return true;
}

static bool parse_value(parser *p, tdm_json *v, int depth) {
    char d[16];
    if (depth > TDM_JSON_MAX_DEPTH)
        return fail_at(p, p->pos, "nesting deeper than %d levels", TDM_JSON_MAX_DEPTH);
    if (p->pos >= p->len) return fail_at(p, p->pos, "expected a value, got end of input");
    uint8_t c = p->s[p->pos];
    switch (c) {
    case '{': return parse_object(p, v, depth);
    case '[': return parse_array(p, v, depth);
    case '"':
        v->type = TDM_JSON_STRING;
        return parse_string(p, &v->str, &v->str_len);
    case 't':
        if (!match_word(p, "true")) break;
        v->type = TDM_JSON_BOOL;
        v->b = true;
        return true;
    case 'f':
        if (!match_word(p, "false")) break;
        v->type = TDM_JSON_BOOL;
        v->b = false;
        return true;
    case 'n':
        if (!match_word(p, "null")) break;
        v->type = TDM_JSON_NULL;
        return true;
    default:
        if (c == '-' || is_digit(c)) {
            v->type = TDM_JSON_NUMBER;
            return parse_number(p, v);
        }
        break;
    }
    return fail_at(p, p->pos, "unexpected %s, expected a value", describe(p, d));
}

static void free_contents(tdm_json *j) {
    if (j->type == TDM_JSON_ARRAY || j->type == TDM_JSON_OBJECT) {
        for (size_t i = 0; i < j->n; i++) {
            free_contents(&j->items[i]);
            if (j->keys) free(j->keys[i]);
        }
        free(j->items);
        free(j->keys);
    }
    free(j->str);
}

void tdm_json_free(tdm_json *j) {
    if (!j) return;
    free_contents(j);
    free(j);
}

tandem_status tdm_json_parse(const char *text, size_t len, tdm_json **out, tdm_err *err) {
    *out = NULL;
    if (!text && len) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "JSON: NULL text");
    parser p = {.s = (const uint8_t *)text, .len = len, .err = err, .status = TANDEM_OK};
    tdm_json *root = calloc(1, sizeof *root);
    if (!root) return tdm_seterr(err, TANDEM_ERR_NOMEM, "JSON: out of memory");
    skip_ws(&p);
    bool ok = parse_value(&p, root, 1);
    if (ok) {
        skip_ws(&p);
        char d[16];
        if (p.pos < p.len) ok = fail_at(&p, p.pos, "trailing %s after the value", describe(&p, d));
    }
    if (!ok) {
        tdm_json_free(root);
        return p.status;
    }
    *out = root;
    return TANDEM_OK;
}

const tdm_json *tdm_json_get(const tdm_json *j, const char *key) {
    if (!j || j->type != TDM_JSON_OBJECT || !key) return NULL;
    for (size_t i = 0; i < j->n; i++)
        if (strcmp(j->keys[i], key) == 0) return &j->items[i];
    return NULL;
}

bool tdm_json_int(const tdm_json *j, int64_t *out) {
    bool neg;
    uint64_t m;
    if (!literal_integer(j, &neg, &m)) return false;
    if (m > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) return false;
    *out = neg ? (int64_t)(0 - m) : (int64_t)m; /* 0 - 2^63 wraps to INT64_MIN's bits */
    return true;
}

bool tdm_json_u64(const tdm_json *j, uint64_t *out) {
    bool neg;
    uint64_t m;
    if (!literal_integer(j, &neg, &m) || (neg && m != 0)) return false;
    *out = m;
    return true;
}

void tdm_json_write_str(FILE *f, const char *s, size_t len) {
    const uint8_t *u = (const uint8_t *)s;
    fputc('"', f);
    size_t i = 0;
    while (i < len) {
        uint8_t c = u[i];
        if (c < 0x80) {
            switch (c) {
            case '"': fputs("\\\"", f); break;
            case '\\': fputs("\\\\", f); break;
            case '\n': fputs("\\n", f); break;
            case '\r': fputs("\\r", f); break;
            case '\t': fputs("\\t", f); break;
            case '\b': fputs("\\b", f); break;
            case '\f': fputs("\\f", f); break;
            default:
                if (c < 0x20) fprintf(f, "\\u%04x", c);
                else fputc(c, f);
            }
            i++;
            continue;
        }
        uint32_t cp;
        int n = tdm_utf8_decode(u + i, len - i, &cp);
        if (cp & TDM_UTF8_INVALID) fputs("\xEF\xBF\xBD", f); /* U+FFFD */
        else fwrite(u + i, 1, (size_t)n, f);
        i += (size_t)n;
    }
    fputc('"', f);
}

void tdm_json_write(FILE *f, const tdm_json *j) {
    switch (j->type) {
    case TDM_JSON_NULL: fputs("null", f); break;
    case TDM_JSON_BOOL: fputs(j->b ? "true" : "false", f); break;
    case TDM_JSON_NUMBER: fwrite(j->str, 1, j->str_len, f); break; /* the literal as written */
    case TDM_JSON_STRING: tdm_json_write_str(f, j->str, j->str_len); break;
    case TDM_JSON_ARRAY:
    case TDM_JSON_OBJECT:
        fputc(j->type == TDM_JSON_ARRAY ? '[' : '{', f);
        for (size_t i = 0; i < j->n; i++) {
            if (i) fputs(", ", f);
            if (j->type == TDM_JSON_OBJECT) {
                tdm_json_write_str(f, j->keys[i], strlen(j->keys[i]));
                fputs(": ", f);
            }
            tdm_json_write(f, &j->items[i]);
        }
        fputc(j->type == TDM_JSON_ARRAY ? ']' : '}', f);
        break;
    }
}

char *tdm_json_text(const tdm_json *j) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return NULL;
    tdm_json_write(f, j);
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        free(buf);
        return NULL;
    }
    return buf;
}
