/* value.c - the engine's values: the arena, strings, lists, ordered dicts; text
 * conversion as Python does it (str, repr, json.dumps); truth, equality, ordering. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jj_internal.h"
#include "unicode.h"

/* ------------------------------------------------------------------ arena */

struct jj_chunk {
    jj_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define CHUNK_MIN ((size_t)64 << 10)

void *jj_arena_alloc(jj_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    jj_chunk *h = a->head;
    if (!h || h->size - h->used < n) {
        size_t size = n > CHUNK_MIN ? n : CHUNK_MIN;
        if (size > SIZE_MAX / 2 || (a->limit && (a->used + size + sizeof *h > a->limit || a->used + size < a->used)))
            return NULL;
        h = malloc(sizeof *h + size);
        if (!h) return NULL;
        h->next = a->head;
        h->size = size;
        h->used = 0;
        a->head = h;
        a->used += size + sizeof *h;
    }
    void *p = h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

void jj_arena_free(jj_arena *a) {
    for (jj_chunk *h = a->head, *nx; h; h = nx) {
        nx = h->next;
        free(h);
    }
    a->head = NULL;
    a->used = 0;
}

void *jj_alloc(jj_ctx *c, size_t n) {
    if (!jj_work(c, n, JJ_COPY)) return NULL;
    void *p = jj_arena_alloc(&c->arena, n);
    if (!p)
        jj_fail(c, NULL, TANDEM_ERR_NOMEM, "the template needs more than %zu MiB of memory",
                c->lim.max_memory >> 20);
    return p;
}

/* ---------------------------------------------------------- construction */

jj_str *jj_str_alloc(jj_ctx *c, size_t n) {
    if (n > SIZE_MAX / 2) return jj_fail(c, NULL, TANDEM_ERR_NOMEM, "string too long"), NULL;
    jj_str *r = jj_alloc(c, sizeof *r + n + 1);
    if (r) r->len = n;
    return r;
}

const jj_str *jj_str_new(jj_ctx *c, const char *s, size_t n) {
    jj_str *r = jj_str_alloc(c, n);
    if (r && n) memcpy(r->s, s, n);
    return r;
}

jj_list *jj_list_new(jj_ctx *c, size_t cap) {
    jj_list *l = jj_alloc(c, sizeof *l);
    if (!l) return NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(jj_val) / 2 || !(l->v = jj_alloc(c, cap * sizeof(jj_val)))) return NULL;
        l->cap = cap;
    }
    return l;
}

bool jj_list_push(jj_ctx *c, jj_list *l, jj_val v) {
    if (l->n == l->cap) {
        size_t nc = l->cap ? l->cap * 2 : 4;
        jj_val *nv = nc < SIZE_MAX / sizeof *nv / 2 ? jj_alloc(c, nc * sizeof *nv) : NULL;
        if (!nv) return false;
        if (l->n) memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = v;
    return true;
}

jj_dict *jj_dict_new(jj_ctx *c, size_t cap) {
    jj_dict *d = jj_alloc(c, sizeof *d);
    if (!d) return NULL;
    if (cap) {
        if (cap > SIZE_MAX / sizeof(jj_val) / 2 || !(d->k = jj_alloc(c, cap * sizeof(jj_val))) ||
            !(d->v = jj_alloc(c, cap * sizeof(jj_val))))
            return NULL;
        d->cap = cap;
    }
    return d;
}

jj_val *jj_dict_get(jj_ctx *c, const jj_dict *d, const char *key, size_t len) {
    size_t i = 0, compared = 0; /* keys visited, bytes compared */
    for (; i < d->n; i++) {
        if (d->k[i].t != JV_STR || d->k[i].u.s->len != len) continue;
        compared += len;
        if (memcmp(d->k[i].u.s->s, key, len) == 0) break;
    }
    bool ok = jj_work(c, TDM_MIN(i + 1, d->n), JJ_ITEM) && jj_work(c, compared, JJ_SCAN);
    return ok && i < d->n ? &d->v[i] : NULL;
}

jj_val *jj_dict_find(jj_ctx *c, const jj_dict *d, jj_val key) {
    if (key.t == JV_STR) return jj_dict_get(c, d, key.u.s->s, key.u.s->len);
    for (size_t i = 0; i < d->n && !jj_over(c); i++)
        if (jj_equal(c, d->k[i], key)) return &d->v[i];
    return NULL;
}

bool jj_dict_set(jj_ctx *c, jj_dict *d, jj_val k, jj_val v) {
    jj_val *old = jj_dict_find(c, d, k);
    if (old) {
        *old = v;
        return true;
    }
    if (jj_over(c)) return false;
    if (d->n == d->cap) {
        size_t nc = d->cap ? d->cap * 2 : 4;
        jj_val *nk = jj_alloc(c, nc * sizeof *nk), *nv = nk ? jj_alloc(c, nc * sizeof *nv) : NULL;
        if (!nv) return false;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nv, d->v, d->n * sizeof *nv);
        }
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
    return true;
}

bool jj_from_json(jj_ctx *c, const tdm_json *j, jj_val *out) {
    int64_t iv;
    switch (j->type) {
    case TDM_JSON_NULL: *out = jv_none(); return true;
    case TDM_JSON_BOOL: *out = jv_bool(j->b); return true;
    case TDM_JSON_NUMBER:
        *out = tdm_json_int(j, &iv) && !strpbrk(j->str, ".eE") ? jv_int(iv) : jv_float(j->num);
        return true;
    case TDM_JSON_STRING: {
        const jj_str *s = jj_str_new(c, j->str, j->str_len);
        *out = jv_str(s);
        return s != NULL;
    }
    case TDM_JSON_ARRAY: {
        jj_list *l = jj_list_new(c, j->n);
        if (!l) return false;
        for (size_t i = 0; i < j->n; i++)
            if (!jj_from_json(c, &j->items[i], &l->v[l->n++])) return false;
        *out = jv_list(l);
        return true;
    }
    case TDM_JSON_OBJECT: {
        jj_dict *d = jj_dict_new(c, j->n);
        if (!d) return false;
        for (size_t i = 0; i < j->n; i++) {
            const jj_str *k = jj_str_new(c, j->keys[i], strlen(j->keys[i]));
            if (!k) return false;
            d->k[i] = jv_str(k);
            if (!jj_from_json(c, &j->items[i], &d->v[i])) return false;
            d->n++;
        }
        *out = jv_dict(d);
        return true;
    }
    }
    return jj_fail(c, NULL, TANDEM_ERR_INTERNAL, "bad JSON value");
}

const char *jv_type_name(jj_val v) {
    switch ((jj_type)v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.u.l->tuple ? "tuple" : "list";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_LOOP: return "LoopContext";
    case JV_MACRO: case JV_CALLER: return "Macro";
    case JV_FUNC: return "function";
    }
    return "object";
}

/* ------------------------------------------------------------------- text */

bool jj_buf_add(jj_ctx *c, jj_buf *b, const char *s, size_t n) {
    if (n == 0) return true;
    if (!jj_work(c, n, JJ_COPY)) return false;
    if (b->n + n > c->lim.max_output || b->n + n < b->n)
        return jj_fail(c, NULL, TANDEM_ERR_NOMEM, "the rendered text would exceed %zu bytes", c->lim.max_output);
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return jj_fail(c, NULL, TANDEM_ERR_NOMEM, "out of memory");
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static bool add_s(jj_ctx *c, jj_buf *b, const char *s) { return jj_buf_add(c, b, s, strlen(s)); }

/* x with p significant digits ("%.{p-1}e") into e; whether they read back as x. */
static bool reads_back(double x, int p, char e[40]) {
    snprintf(e, 40, "%.*e", p - 1, x);
    return strtod(e, NULL) == x;
}

/* Python's repr of a float: the shortest digits that read back, fixed notation for
 * exponents in [-4, 16), else d.ddde+XX.  Each try of a precision (a formatting and a
 * parse, ~0.3 us) is charged as 32 steps. */
static bool float_repr(jj_ctx *c, double x, char out[40]) {
    if (isnan(x)) {
        strcpy(out, "nan");
        return true;
    }
    if (isinf(x)) {
        strcpy(out, x < 0 ? "-inf" : "inf");
        return true;
    }
    char e[40];
    int tries = 0;
    bool found = false;
    /* away from the subnormals a double keeps every decimal of 15 digits (DBL_DIG):
     * when 15 digits read back, those without their trailing zeros are the shortest
     * (what trying 1, 2, ... digits finds); else it takes 16 or 17 */
    for (int p = 15; fabs(x) >= 1e-300 && p <= 17 && !found; p++, tries++) found = reads_back(x, p, e);
    for (int p = 1; p <= 17 && !found; p++, tries++) found = reads_back(x, p, e);
    if (!jj_work(c, (uint64_t)tries * 32, JJ_ITEM)) return false;
    /* e: [-]d[.ddd]e[+-]XX */
    const char *s = e;
    bool neg = *s == '-';
    if (neg) s++;
    char dig[20];
    int nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.') dig[nd++] = *s;
    int ex = atoi(s + 1);
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    char *o = out;
    if (neg) *o++ = '-';
    if (ex >= -4 && ex < 16) {
        if (ex < 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -ex - 1; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = dig[i];
        } else {
            for (int i = 0; i <= ex; i++) *o++ = i < nd ? dig[i] : '0';
            *o++ = '.';
            if (nd > ex + 1)
                for (int i = ex + 1; i < nd; i++) *o++ = dig[i];
            else
                *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = dig[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = dig[i];
        }
        snprintf(o, 8, "e%c%02d", ex < 0 ? '-' : '+', (ex < 0 ? -ex : ex) % 1000);
    }
    return true;
}

/* Python's str.isprintable for one code point (an approximation from our tables:
 * control, separators other than ' ', format characters, unassigned). */
static bool printable(uint32_t cp) {
    if (cp == ' ') return true;
    if (cp >= 0x80000000u) return false;
    uint8_t f = tdm_unicode_flags(cp);
    if (!(f & TDM_UCD_ASSIGNED) || (f & (TDM_UCD_CONTROL | TDM_UCD_WHITESPACE))) return false;
    if (cp == 0xAD || (cp >= 0x200B && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202E) ||
        (cp >= 0x2060 && cp <= 0x206F) || cp == 0xFEFF || (cp >= 0xE000 && cp <= 0xF8FF))
        return false;
    return true;
}

/* Writes s with the escapes esc gives: it fills out[] for a code point that needs one
 * and returns its length, else 0 (the character as it is). */
typedef size_t (*escape_fn)(uint32_t cp, char q, bool ascii, char out[16]);

static bool escaped(jj_ctx *c, jj_buf *b, const char *s, size_t n, escape_fn esc, char q, bool ascii) {
    if (!jj_work(c, n, JJ_ITEM) || !jj_buf_add(c, b, &q, 1)) return false; /* a decode, a test, an append a character */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int k = tdm_utf8_decode((const uint8_t *)s + i, n - i, &cp);
        char e[16];
        size_t el = cp >= 0x80000000u ? (size_t)snprintf(e, sizeof e, "\\udc%02x", (unsigned)(cp & 0xFF)) /* surrogateescape */
                                       : esc(cp, q, ascii, e);
        if (!(el ? jj_buf_add(c, b, e, el) : jj_buf_add(c, b, s + i, (size_t)k))) return false;
        i += (size_t)k;
    }
    return jj_buf_add(c, b, &q, 1);
}

static size_t two(char out[16], char c) {
    out[0] = '\\';
    out[1] = c;
    return 2;
}

/* repr(str): the quote, backslash, \n \r \t, non-printable characters escaped. */
static size_t repr_escape(uint32_t cp, char q, bool ascii, char out[16]) {
    (void)ascii;
    if (cp == (uint32_t)q || cp == '\\') return two(out, (char)cp);
    if (cp == '\n' || cp == '\r' || cp == '\t') return two(out, cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
    if (printable(cp)) return 0;
    return (size_t)snprintf(out, 16, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
}

void tdm_jinja_escape(char *out, size_t cap, const char *msg) {
    const size_t n = strlen(msg);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        const int len = tdm_utf8_decode((const uint8_t *)msg + i, n - i, &cp);
        char e[16];
        size_t el = 0;
        if (cp >= 0x80000000u)
            el = (size_t)snprintf(e, sizeof e, "\\x%02x", (unsigned)(cp & 0xFF)); /* not UTF-8 */
        else if (cp == '\n' || cp == '\r' || cp == '\t')
            el = two(e, cp == '\n' ? 'n' : cp == '\r' ? 'r' : 't');
        else if (!printable(cp))
            el = (size_t)snprintf(e, sizeof e, cp < 0x100 ? "\\x%02x" : cp < 0x10000 ? "\\u%04x" : "\\U%08x", (unsigned)cp);
        const size_t w = el ? el : (size_t)len;
        if (k + w >= cap) break;
        memcpy(out + k, el ? e : msg + i, w);
        k += w;
        i += (size_t)len;
    }
    if (cap) out[k] = 0;
}

static bool repr_str(jj_ctx *c, jj_buf *b, const char *s, size_t n) {
    bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
    return escaped(c, b, s, n, repr_escape, sq && !dq ? '"' : '\'', false);
}

static bool buf_val(jj_ctx *c, jj_buf *b, jj_val v, bool repr, int depth) {
    char num[48];
    if (depth > TDM_JINJA_MAX_NESTING) return jj_fail(c, NULL, TANDEM_ERR_FORMAT, "a value nested too deeply to print");
    if (!jj_work(c, 1, JJ_ITEM)) return false;
    switch ((jj_type)v.t) {
    case JV_UNDEF: return true;
    case JV_NONE: return add_s(c, b, "None");
    case JV_BOOL: return add_s(c, b, v.u.b ? "True" : "False");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); return add_s(c, b, num);
    case JV_FLOAT: return float_repr(c, v.u.f, num) && add_s(c, b, num);
    case JV_STR: return repr ? repr_str(c, b, v.u.s->s, v.u.s->len) : jj_buf_add(c, b, v.u.s->s, v.u.s->len);
    case JV_LIST: {
        const jj_list *l = v.u.l;
        if (!add_s(c, b, l->tuple ? "(" : "[")) return false;
        for (size_t i = 0; i < l->n; i++)
            if ((i && !add_s(c, b, ", ")) || !buf_val(c, b, l->v[i], true, depth + 1)) return false;
        return add_s(c, b, l->tuple ? (l->n == 1 ? ",)" : ")") : "]");
    }
    case JV_NS:
        if (!add_s(c, b, "<Namespace ")) return false;
        /* fall through */
    case JV_DICT: {
        const jj_dict *d = v.u.d;
        if (!add_s(c, b, "{")) return false;
        for (size_t i = 0; i < d->n; i++)
            if ((i && !add_s(c, b, ", ")) || !buf_val(c, b, d->k[i], true, depth + 1) || !add_s(c, b, ": ") ||
                !buf_val(c, b, d->v[i], true, depth + 1))
                return false;
        return add_s(c, b, v.t == JV_NS ? "}>" : "}");
    }
    case JV_LOOP: return add_s(c, b, "<LoopContext>");
    case JV_MACRO: case JV_CALLER: return add_s(c, b, "<Macro>");
    case JV_FUNC: return add_s(c, b, "<built-in function>");
    }
    return true;
}

bool jj_buf_str(jj_ctx *c, jj_buf *b, jj_val v) { return buf_val(c, b, v, false, 0); }
bool jj_buf_repr(jj_ctx *c, jj_buf *b, jj_val v) { return buf_val(c, b, v, true, 0); }

bool jj_to_str(jj_ctx *c, jj_val v, jj_val *out) {
    if (v.t == JV_STR) {
        *out = v;
        return true;
    }
    jj_buf b = {0};
    bool ok = jj_buf_str(c, &b, v);
    const jj_str *s = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
    free(b.p);
    *out = jv_str(s);
    return s != NULL;
}

/* json.dumps' string escapes; ascii: everything past U+007E too (\uXXXX, pairs). */
static size_t json_escape(uint32_t cp, char q, bool ascii, char out[16]) {
    (void)q;
    switch (cp) {
    case '"': return two(out, '"');
    case '\\': return two(out, '\\');
    case '\n': return two(out, 'n');
    case '\r': return two(out, 'r');
    case '\t': return two(out, 't');
    case '\b': return two(out, 'b');
    case '\f': return two(out, 'f');
    default:
        if (!(cp < 0x20 || (ascii && cp > 0x7E && cp != 0x7F))) return 0;
        if (cp >= 0x10000)
            return (size_t)snprintf(out, 16, "\\u%04x\\u%04x", (unsigned)(0xD800 + ((cp - 0x10000) >> 10)),
                                    (unsigned)(0xDC00 + ((cp - 0x10000) & 0x3FF)));
        return (size_t)snprintf(out, 16, "\\u%04x", (unsigned)cp);
    }
}

static bool json_str(jj_ctx *c, jj_buf *b, const char *s, size_t n, bool ascii) {
    return escaped(c, b, s, n, json_escape, '"', ascii);
}

static bool newline_indent(jj_ctx *c, jj_buf *b, int indent, int level) {
    static const char spaces[] = "                                                                ";
    if (!add_s(c, b, "\n")) return false;
    for (size_t left = (size_t)indent * (size_t)level, k; left; left -= k) /* in runs: up to 64 x 200 spaces */
        if (!jj_buf_add(c, b, spaces, k = TDM_MIN(left, sizeof spaces - 1))) return false;
    return true;
}

/* A dict key as json.dumps writes it: strings, numbers, booleans and None only. */
static bool json_key(jj_ctx *c, jj_buf *b, jj_val k, bool ascii) {
    char num[48];
    switch (k.t) {
    case JV_STR: return json_str(c, b, k.u.s->s, k.u.s->len, ascii);
    case JV_INT: snprintf(num, sizeof num, "\"%lld\"", (long long)k.u.i); return add_s(c, b, num);
    case JV_FLOAT: num[0] = '"'; return float_repr(c, k.u.f, num + 1) && add_s(c, b, strcat(num, "\""));
    case JV_BOOL: return add_s(c, b, k.u.b ? "\"true\"" : "\"false\"");
    case JV_NONE: return add_s(c, b, "\"null\"");
    default: return jj_fail(c, NULL, TANDEM_ERR_FORMAT, "tojson: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
    }
}

static int key_cmp(const void *a, const void *b) {
    const jj_val *x = *(const jj_val *const *)a, *y = *(const jj_val *const *)b;
    if (x->t != JV_STR || y->t != JV_STR) return 0;
    size_t n = TDM_MIN(x->u.s->len, y->u.s->len);
    int r = memcmp(x->u.s->s, y->u.s->s, n);
    return r ? r : (x->u.s->len > y->u.s->len) - (x->u.s->len < y->u.s->len);
}

bool jj_buf_json(jj_ctx *c, jj_buf *b, jj_val v, bool ascii, int indent, const char *isep, const char *ksep,
                 bool sort_keys, int depth) {
    char num[48];
    if (depth > TDM_JINJA_MAX_NESTING) return jj_fail(c, NULL, TANDEM_ERR_FORMAT, "tojson: a value nested too deeply");
    if (!jj_work(c, 1, JJ_ITEM)) return false;
    switch ((jj_type)v.t) {
    case JV_NONE: return add_s(c, b, "null");
    case JV_BOOL: return add_s(c, b, v.u.b ? "true" : "false");
    case JV_INT: snprintf(num, sizeof num, "%lld", (long long)v.u.i); return add_s(c, b, num);
    case JV_FLOAT:
        if (isnan(v.u.f)) return add_s(c, b, "NaN");
        if (isinf(v.u.f)) return add_s(c, b, v.u.f < 0 ? "-Infinity" : "Infinity");
        return float_repr(c, v.u.f, num) && add_s(c, b, num);
    case JV_STR: return json_str(c, b, v.u.s->s, v.u.s->len, ascii);
    case JV_LIST: {
        const jj_list *l = v.u.l;
        if (l->n == 0) return add_s(c, b, "[]");
        if (!add_s(c, b, "[")) return false;
        for (size_t i = 0; i < l->n; i++) {
            if (i && !add_s(c, b, isep)) return false;
            if (indent >= 0 && !newline_indent(c, b, indent, depth + 1)) return false;
            if (!jj_buf_json(c, b, l->v[i], ascii, indent, isep, ksep, sort_keys, depth + 1)) return false;
        }
        if (indent >= 0 && !newline_indent(c, b, indent, depth)) return false;
        return add_s(c, b, "]");
    }
    case JV_NS:
    case JV_DICT: {
        const jj_dict *d = v.u.d;
        if (d->n == 0) return add_s(c, b, "{}");
        const jj_val **order = jj_alloc(c, d->n * sizeof *order);
        if (!order) return false;
        for (size_t i = 0; i < d->n; i++) order[i] = &d->k[i];
        if (sort_keys) { /* n log n comparisons, each of up to the longest key */
            uint64_t log2n = 1, longest = 0;
            while (log2n < 64 && ((uint64_t)1 << log2n) < d->n) log2n++;
            for (size_t i = 0; i < d->n; i++)
                if (d->k[i].t == JV_STR && d->k[i].u.s->len > longest) longest = d->k[i].u.s->len;
            const uint64_t cmps = d->n * log2n;
            if (!jj_work(c, cmps, JJ_ITEM) || !jj_work(c, longest < UINT64_MAX / cmps ? cmps * longest : UINT64_MAX, JJ_SCAN))
                return false;
            qsort(order, d->n, sizeof *order, key_cmp);
        }
        if (!add_s(c, b, "{")) return false;
        for (size_t i = 0; i < d->n; i++) {
            size_t at = (size_t)(order[i] - d->k);
            if (i && !add_s(c, b, isep)) return false;
            if (indent >= 0 && !newline_indent(c, b, indent, depth + 1)) return false;
            if (!json_key(c, b, d->k[at], ascii) || !add_s(c, b, ksep) ||
                !jj_buf_json(c, b, d->v[at], ascii, indent, isep, ksep, sort_keys, depth + 1))
                return false;
        }
        if (indent >= 0 && !newline_indent(c, b, indent, depth)) return false;
        return add_s(c, b, "}");
    }
    default:
        return jj_fail(c, NULL, TANDEM_ERR_FORMAT, "tojson: Object of type %s is not JSON serializable", jv_type_name(v));
    }
}

/* -------------------------------------------------------------- semantics */

bool jj_truthy(jj_val v) {
    switch ((jj_type)v.t) {
    case JV_UNDEF: case JV_NONE: return false;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0;
    case JV_STR: return v.u.s->len != 0;
    case JV_LIST: return v.u.l->n != 0;
    case JV_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static bool is_num(jj_val v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }
static double num_f(jj_val v) { return v.t == JV_FLOAT ? v.u.f : v.t == JV_INT ? (double)v.u.i : (double)v.u.b; }
static int64_t num_i(jj_val v) { return v.t == JV_INT ? v.u.i : (int64_t)v.u.b; }

/* Values nest as a DAG (a list may hold one list many times), so a comparison
 * may visit far more values than memory holds: each visit is charged. */
bool jj_equal(jj_ctx *c, jj_val a, jj_val b) {
    if (!jj_work(c, 1, JJ_ITEM)) return false;
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.t != b.t) return false;
    switch ((jj_type)a.t) {
    case JV_UNDEF: case JV_NONE: return true;
    case JV_STR:
        return a.u.s->len == b.u.s->len && jj_work(c, a.u.s->len, JJ_SCAN) && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case JV_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jj_equal(c, a.u.l->v[i], b.u.l->v[i])) return false;
        return true;
    case JV_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            const jj_val *o = jj_dict_find(c, b.u.d, a.u.d->k[i]);
            if (!o || !jj_equal(c, a.u.d->v[i], *o)) return false;
        }
        return true;
    case JV_NS: return a.u.d == b.u.d;
    case JV_LOOP: return a.u.loop == b.u.loop;
    case JV_MACRO: return a.u.macro == b.u.macro;
    case JV_CALLER: return a.u.caller == b.u.caller;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return false;
    }
}

bool jj_compare(jj_ctx *c, const jj_node *n, jj_val a, jj_val b, int *cmp) {
    if (is_num(a) && is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = num_i(a), y = num_i(b);
            *cmp = (x > y) - (x < y);
        } else {
            double x = num_f(a), y = num_f(b);
            if (isnan(x) || isnan(y)) return *cmp = 2, true; /* unordered: every < > false */
            *cmp = (x > y) - (x < y);
        }
        return true;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t m = TDM_MIN(a.u.s->len, b.u.s->len);
        if (!jj_work(c, m, JJ_SCAN)) return false;
        int r = memcmp(a.u.s->s, b.u.s->s, m);
        *cmp = r ? (r > 0) - (r < 0) : (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
        return true;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t m = TDM_MIN(a.u.l->n, b.u.l->n);
        for (size_t i = 0; i < m; i++) {
            if (jj_equal(c, a.u.l->v[i], b.u.l->v[i])) continue;
            return !jj_over(c) && jj_compare(c, n, a.u.l->v[i], b.u.l->v[i], cmp);
        }
        if (jj_over(c)) return false;
        *cmp = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return true;
    }
    return jj_fail(c, n, TANDEM_ERR_FORMAT, "'<' not supported between instances of '%s' and '%s'", jv_type_name(a),
                   jv_type_name(b));
}

size_t jj_utf8_len(jj_ctx *c, const char *s, size_t n) {
    size_t count = 0;
    jj_work(c, n, JJ_SCAN); /* a bound passed here fails the render */
    for (size_t i = 0; i < n; count++) {
        uint32_t cp;
        i += (size_t)tdm_utf8_decode((const uint8_t *)s + i, n - i, &cp);
    }
    return count;
}

size_t jj_utf8_offset(jj_ctx *c, const char *s, size_t n, size_t idx) {
    size_t i = 0;
    for (size_t k = 0; k < idx && i < n; k++) {
        uint32_t cp;
        i += (size_t)tdm_utf8_decode((const uint8_t *)s + i, n - i, &cp);
    }
    jj_work(c, i, JJ_SCAN); /* a bound passed here fails the render */
    return i;
}

bool jj_length(jj_ctx *c, jj_val v, int64_t *out) {
    switch (v.t) {
    case JV_STR: *out = (int64_t)jj_utf8_len(c, v.u.s->s, v.u.s->len); return true;
    case JV_LIST: *out = (int64_t)v.u.l->n; return true;
    case JV_DICT: case JV_NS: *out = (int64_t)v.u.d->n; return true;
    case JV_UNDEF: *out = 0; return true;
    default: return false;
    }
}

bool jj_iter_list(jj_ctx *c, const jj_node *n, jj_val v, const jj_list **out) {
    static const jj_list empty = {0};
    switch (v.t) {
    case JV_LIST: *out = v.u.l; return true;
    case JV_UNDEF: *out = &empty; return true;
    case JV_DICT: {
        jj_list *l = jj_list_new(c, v.u.d->n);
        if (!l) return false;
        for (size_t i = 0; i < v.u.d->n; i++) l->v[l->n++] = v.u.d->k[i];
        *out = l;
        return true;
    }
    case JV_STR: {
        const jj_str *s = v.u.s;
        jj_list *l = jj_list_new(c, 0);
        if (!l || !jj_work(c, s->len, JJ_SCAN)) return false;
        for (size_t i = 0; i < s->len;) {
            uint32_t cp;
            int k = tdm_utf8_decode((const uint8_t *)s->s + i, s->len - i, &cp);
            const jj_str *ch = jj_str_new(c, s->s + i, (size_t)k);
            if (!ch || !jj_list_push(c, l, jv_str(ch))) return false;
            i += (size_t)k;
        }
        *out = l;
        return true;
    }
    default:
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "'%s' object is not iterable", jv_type_name(v));
    }
}
