/* json_schema.c - JSON schema -> GBNF text (json_schema.h lists what is supported).
 * Each schema node becomes a rule rN whose text is the value followed by optional
 * whitespace; the primitives (string, number, any value ...) are fixed rules written
 * once.  A $ref's rule is named when first met, so recursive schemas work. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"
#include "json_schema.h"

static const char *PRIMITIVES =
    "ws ::= | \" \" | \"\\n\"{1,2} [ \\t]{0,20}\n"
    "boolean ::= (\"true\" | \"false\") ws\n"
    "null ::= \"null\" ws\n"
    "char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"
    "string ::= \"\\\"\" char* \"\\\"\" ws\n"
    "integral-part ::= \"0\" | [1-9] [0-9]{0,15}\n"
    "integer ::= \"-\"? integral-part ws\n"
    "number ::= \"-\"? integral-part (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,16})? ws\n"
    "value ::= object | array | string | number | boolean | null\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "date ::= [0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )\n"
    "time ::= ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? "
    "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )\n"
    "date-string ::= \"\\\"\" date \"\\\"\" ws\n"
    "time-string ::= \"\\\"\" time \"\\\"\" ws\n"
    "date-time-string ::= \"\\\"\" date \"T\" time \"\\\"\" ws\n"
    "uuid-string ::= \"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
    "[0-9a-fA-F]{12} \"\\\"\" ws\n";

typedef struct sbuf {
    char *s;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *ns = realloc(b->s, nc);
        if (!ns) {
            b->oom = true;
            return;
        }
        b->s = ns, b->cap = nc;
    }
    if (n) memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

__attribute__((format(printf, 2, 3))) static void sb_printf(sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n >= (int)sizeof tmp) n = (int)sizeof tmp - 1;
    if (n > 0) sb_add(b, tmp, (size_t)n);
}

typedef struct refent {
    char *ref;
    uint32_t rule;
} refent;

typedef struct ctx {
    const tdm_json *root;
    sbuf out;        /* the rules */
    uint32_t n_rules;
    refent *refs;
    uint32_t n_refs, cap_refs;
    tdm_err *err;
    tandem_status st;
} ctx;

__attribute__((format(printf, 4, 5))) static uint32_t fail(ctx *c, tandem_status st, const char *path,
                                                          const char *fmt, ...) {
    if (c->st == TANDEM_OK) {
        char msg[160];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        c->st = tdm_seterr(c->err, st, "json schema at %.80s: %s", path, msg);
    }
    return UINT32_MAX;
}

/* path + "/" + key, the key escaped as in a JSON pointer (~0 ~1). */
static void subpath(char *dst, size_t cap, const char *path, const char *key) {
    size_t n = (size_t)snprintf(dst, cap, "%s/", path);
    for (const char *k = key; *k && n + 3 < cap; k++) {
        if (*k == '~') dst[n++] = '~', dst[n++] = '0';
        else if (*k == '/') dst[n++] = '~', dst[n++] = '1';
        else dst[n++] = *k;
    }
    dst[n < cap ? n : cap - 1] = 0;
}

/* A GBNF literal of the bytes s (UTF-8 kept; quotes, backslashes, controls escaped). */
static void gbnf_literal(sbuf *b, const char *s, size_t n) {
    sb_str(b, "\"");
    for (size_t k = 0; k < n; k++) {
        unsigned char ch = (unsigned char)s[k];
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            sb_add(b, e, 2);
        } else if (ch < 0x20 || ch == 0x7F) sb_printf(b, "\\x%02X", ch);
        else sb_add(b, (const char *)&ch, 1);
    }
    sb_str(b, "\"");
}

/* The compact JSON text of a value (strings escaped as JSON does by default). */
static void json_compact(sbuf *b, const tdm_json *j) {
    switch (j->type) {
    case TDM_JSON_NULL: sb_str(b, "null"); break;
    case TDM_JSON_BOOL: j->b ? sb_str(b, "true") : sb_str(b, "false"); break;
    case TDM_JSON_NUMBER: sb_add(b, j->str, strlen(j->str)); break;
    case TDM_JSON_STRING:
        sb_str(b, "\"");
        for (size_t k = 0; k < j->str_len; k++) {
            unsigned char ch = (unsigned char)j->str[k];
            if (ch == '"') sb_str(b, "\\\"");
            else if (ch == '\\') sb_str(b, "\\\\");
            else if (ch == '\n') sb_str(b, "\\n");
            else if (ch == '\t') sb_str(b, "\\t");
            else if (ch == '\r') sb_str(b, "\\r");
            else if (ch < 0x20) sb_printf(b, "\\u%04x", ch);
            else sb_add(b, (const char *)&ch, 1);
        }
        sb_str(b, "\"");
        break;
    case TDM_JSON_ARRAY:
    case TDM_JSON_OBJECT:
        sb_add(b, j->type == TDM_JSON_ARRAY ? "[" : "{", 1);
        for (size_t k = 0; k < j->n; k++) {
            if (k) sb_str(b, ",");
            if (j->type == TDM_JSON_OBJECT) {
                tdm_json key = {.type = TDM_JSON_STRING, .str = j->keys[k], .str_len = strlen(j->keys[k])};
                json_compact(b, &key);
                sb_str(b, ":");
            }
            json_compact(b, &j->items[k]);
        }
        sb_add(b, j->type == TDM_JSON_ARRAY ? "]" : "}", 1);
        break;
    }
}

/* A constant value's grammar: its compact text, then whitespace. */
static void const_alt(sbuf *b, const tdm_json *j) {
    sbuf t = {0};
    json_compact(&t, j);
    gbnf_literal(b, t.s ? t.s : "", t.n);
    if (t.oom) b->oom = true;
    free(t.s);
    sb_str(b, " ws");
}

static uint32_t new_rule(ctx *c) { return c->n_rules++; }

static void put_rule(ctx *c, uint32_t r, const sbuf *body) {
    sb_printf(&c->out, "r%u ::= ", r);
    sb_add(&c->out, body->s ? body->s : "", body->n);
    sb_str(&c->out, "\n");
    if (body->oom) c->out.oom = true;
}

/* ---- integer ranges: decimal strings of the integers in [lo, hi], 0 <= lo <= hi ---- */

static int ndigits(int64_t v) {
    int n = 1;
    while (v >= 10) v /= 10, n++;
    return n;
}

/* Equal-length digit strings a <= b: the strings between them. */
static void range_same(sbuf *b, const char *a, const char *z, int n) {
    if (n == 0) return;
    if (a[0] == z[0]) {
        sb_printf(b, "\"%c\" ", a[0]);
        range_same(b, a + 1, z + 1, n - 1);
        return;
    }
    if (n == 1) {
        sb_printf(b, "[%c-%c] ", a[0], z[0]);
        return;
    }
    char nines[20], zeros[20];
    memset(nines, '9', (size_t)n - 1), memset(zeros, '0', (size_t)n - 1);
    sb_printf(b, "( \"%c\" ", a[0]);
    range_same(b, a + 1, nines, n - 1);
    if (z[0] - a[0] > 1) sb_printf(b, "| [%c-%c] [0-9]{%d} ", a[0] + 1, z[0] - 1, n - 1);
    sb_printf(b, "| \"%c\" ", z[0]);
    range_same(b, zeros, z + 1, n - 1);
    sb_str(b, ") ");
}

static const int64_t POW10[] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000, 1000000000,
                                10000000000, 100000000000, 1000000000000, 10000000000000, 100000000000000,
                                1000000000000000, 10000000000000000};

/* lo <= hi, both >= 0; hi -1: unbounded (up to 16 digits). */
static void range_nonneg(sbuf *b, int64_t lo, int64_t hi) {
    sb_str(b, "( ");
    bool first = true;
    int dl = ndigits(lo), dh = hi < 0 ? 16 : ndigits(hi);
    for (int d = dl; d <= dh; d++) {
        int64_t a = d == dl ? lo : POW10[d - 1];
        int64_t z = (hi >= 0 && d == dh) ? hi : POW10[d] - 1;
        if (!first) sb_str(b, "| ");
        first = false;
        if (hi < 0 && d > dl) { /* every longer number */
            sb_printf(b, "[1-9] [0-9]{%d,15} ", d - 1);
            break;
        }
        char as[20], zs[20];
        snprintf(as, sizeof as, "%lld", (long long)a);
        snprintf(zs, sizeof zs, "%lld", (long long)z);
        range_same(b, as, zs, d);
    }
    sb_str(b, ") ");
}

/* The integers in [lo, hi]; has_lo / has_hi false: unbounded that side. */
static void int_range(sbuf *b, bool has_lo, int64_t lo, bool has_hi, int64_t hi) {
    bool alt = false;
    sb_str(b, "( ");
    /* negative part: -(m) for m in [max(1, -hi), -lo] */
    if (!has_lo || lo < 0) {
        if (!has_hi || hi >= 0) {
            sb_str(b, "\"-\" ");
            range_nonneg(b, 1, has_lo ? -lo : -1);
        } else {
            sb_str(b, "\"-\" ");
            range_nonneg(b, -hi, has_lo ? -lo : -1);
        }
        alt = true;
    }
    if (!has_hi || hi >= 0) {
        if (alt) sb_str(b, "| ");
        range_nonneg(b, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    sb_str(b, ") ws");
}

/* ---- schema nodes ---- */

static const char *ANNOTATIONS[] = {"title", "description", "examples", "default", "$schema", "$id", "$comment",
                                    "$defs", "definitions"};

static uint32_t gen(ctx *c, const tdm_json *s, const char *path, unsigned depth);

static uint32_t gen_ref(ctx *c, const char *ref, const char *path, unsigned depth) {
    for (uint32_t k = 0; k < c->n_refs; k++)
        if (strcmp(c->refs[k].ref, ref) == 0) return c->refs[k].rule;
    const char *name = NULL, *defs = NULL;
    if (strncmp(ref, "#/$defs/", 8) == 0) defs = "$defs", name = ref + 8;
    else if (strncmp(ref, "#/definitions/", 14) == 0) defs = "definitions", name = ref + 14;
    else return fail(c, TANDEM_ERR_UNSUPPORTED, path, "$ref '%.60s': only #/$defs/NAME and #/definitions/NAME", ref);
    const tdm_json *target = tdm_json_get(tdm_json_get(c->root, defs), name);
    if (!target) return fail(c, TANDEM_ERR_FORMAT, path, "$ref '%.60s' names no definition", ref);
    if (c->n_refs == c->cap_refs) {
        uint32_t nc = c->cap_refs ? 2 * c->cap_refs : 8;
        refent *nr = realloc(c->refs, nc * sizeof(refent));
        if (!nr) return fail(c, TANDEM_ERR_NOMEM, path, "out of memory");
        c->refs = nr, c->cap_refs = nc;
    }
    uint32_t r = new_rule(c);
    c->refs[c->n_refs].ref = tdm_strndup(ref, strlen(ref));
    if (!c->refs[c->n_refs].ref) return fail(c, TANDEM_ERR_NOMEM, path, "out of memory");
    c->refs[c->n_refs++].rule = r;
    char p[256];
    snprintf(p, sizeof p, "#/%s", defs);
    char p2[256];
    subpath(p2, sizeof p2, p, name);
    uint32_t t = gen(c, target, p2, depth + 1);
    if (t == UINT32_MAX) return t;
    sbuf body = {0};
    sb_printf(&body, "r%u", t);
    put_rule(c, r, &body);
    free(body.s);
    return r;
}

static bool get_count(ctx *c, const tdm_json *s, const char *key, const char *path, uint32_t *out, bool *used) {
    const tdm_json *v = tdm_json_get(s, key);
    if (!v) return true;
    int64_t x;
    if (!tdm_json_int(v, &x) || x < 0) return fail(c, TANDEM_ERR_FORMAT, path, "'%s' must be a non-negative integer", key), false;
    if (x > TDM_GRAMMAR_MAX_REPEAT)
        return fail(c, TANDEM_ERR_UNSUPPORTED, path, "'%s' %lld above the limit %u", key, (long long)x, TDM_GRAMMAR_MAX_REPEAT), false;
    *out = (uint32_t)x;
    *used = true;
    return true;
}

/* Marks key k of s used. */
static void use(const tdm_json *s, bool *used, const char *key) {
    for (size_t k = 0; k < s->n; k++)
        if (strcmp(s->keys[k], key) == 0) used[k] = true;
}

static void gen_string(ctx *c, const tdm_json *s, const char *path, bool *used, sbuf *b) {
    const tdm_json *fmt = tdm_json_get(s, "format");
    uint32_t lo = 0, hi = UINT32_MAX;
    bool hl = false, hh = false;
    if (!get_count(c, s, "minLength", path, &lo, &hl) || !get_count(c, s, "maxLength", path, &hi, &hh)) return;
    if (hl) use(s, used, "minLength");
    if (hh) use(s, used, "maxLength");
    if (fmt) {
        use(s, used, "format");
        if (fmt->type != TDM_JSON_STRING) { fail(c, TANDEM_ERR_FORMAT, path, "'format' must be a string"); return; }
        if (hl || hh) { fail(c, TANDEM_ERR_UNSUPPORTED, path, "minLength / maxLength beside 'format'"); return; }
        const char *f = fmt->str;
        if (strcmp(f, "date") == 0) sb_str(b, "date-string");
        else if (strcmp(f, "date-time") == 0) sb_str(b, "date-time-string");
        else if (strcmp(f, "time") == 0) sb_str(b, "time-string");
        else if (strcmp(f, "uuid") == 0) sb_str(b, "uuid-string");
        else fail(c, TANDEM_ERR_UNSUPPORTED, path, "string format '%.40s' (supported: date, date-time, time, uuid)", f);
        return;
    }
    if (hh && hi < lo) { fail(c, TANDEM_ERR_FORMAT, path, "maxLength below minLength"); return; }
    if (!hl && !hh) sb_str(b, "string");
    else if (hh) sb_printf(b, "\"\\\"\" char{%u,%u} \"\\\"\" ws", lo, hi);
    else sb_printf(b, "\"\\\"\" char{%u,} \"\\\"\" ws", lo);
}

static bool get_bound(ctx *c, const tdm_json *s, const char *key, const char *path, bool *has, int64_t *v, int adj,
                      bool *used) {
    const tdm_json *j = tdm_json_get(s, key);
    if (!j) return true;
    use(s, used, key);
    int64_t x;
    if (!tdm_json_int(j, &x))
        return fail(c, TANDEM_ERR_UNSUPPORTED, path, "'%s' on an integer must be an integer value", key), false;
    if (x > 999999999999999LL || x < -999999999999999LL)
        return fail(c, TANDEM_ERR_UNSUPPORTED, path, "'%s' %lld beyond 15 digits", key, (long long)x), false;
    x += adj;
    if (*has) *v = adj >= 0 ? (x > *v ? x : *v) : (x < *v ? x : *v);
    else *v = x;
    *has = true;
    return true;
}

static void gen_integer(ctx *c, const tdm_json *s, const char *path, bool *used, sbuf *b) {
    bool hl = false, hh = false;
    int64_t lo = 0, hi = 0;
    if (!get_bound(c, s, "minimum", path, &hl, &lo, 0, used) || !get_bound(c, s, "exclusiveMinimum", path, &hl, &lo, 1, used) ||
        !get_bound(c, s, "maximum", path, &hh, &hi, 0, used) || !get_bound(c, s, "exclusiveMaximum", path, &hh, &hi, -1, used))
        return;
    if (!hl && !hh) sb_str(b, "integer");
    else if (hl && hh && hi < lo) fail(c, TANDEM_ERR_FORMAT, path, "the integer range [%lld, %lld] is empty", (long long)lo, (long long)hi);
    else int_range(b, hl, lo, hh, hi);
}

static void gen_array(ctx *c, const tdm_json *s, const char *path, bool *used, unsigned depth, sbuf *b) {
    uint32_t lo = 0, hi = UINT32_MAX;
    bool hl = false, hh = false;
    if (!get_count(c, s, "minItems", path, &lo, &hl) || !get_count(c, s, "maxItems", path, &hi, &hh)) return;
    if (hl) use(s, used, "minItems");
    if (hh) use(s, used, "maxItems");
    if (hh && hi < lo) { fail(c, TANDEM_ERR_FORMAT, path, "maxItems below minItems"); return; }
    const tdm_json *items = tdm_json_get(s, "items");
    char ip[256];
    subpath(ip, sizeof ip, path, "items");
    char item[16] = "value";
    if (items) {
        use(s, used, "items");
        uint32_t r = gen(c, items, ip, depth + 1);
        if (r == UINT32_MAX) return;
        snprintf(item, sizeof item, "r%u", r);
    }
    if (hh && hi == 0) { sb_str(b, "\"[\" ws \"]\" ws"); return; }
    sb_printf(b, "\"[\" ws ( %s (\",\" ws %s)", item, item);
    uint32_t rl = lo > 0 ? lo - 1 : 0;
    if (hh) sb_printf(b, "{%u,%u}", rl, hi - 1);
    else sb_printf(b, "{%u,}", rl);
    sb_printf(b, " )%s \"]\" ws", lo == 0 ? "?" : "");
}

/* ---- the names of additional members: any string but the declared names ---- */

typedef struct keycp {
    uint32_t *cp; /* the name's code points */
    uint32_t n;
} keycp;

static int cmp_key(const void *a, const void *b) {
    const keycp *x = a, *y = b;
    for (uint32_t k = 0; k < x->n && k < y->n; k++)
        if (x->cp[k] != y->cp[k]) return x->cp[k] < y->cp[k] ? -1 : 1;
    return x->n < y->n ? -1 : x->n > y->n;
}

/* The rule for the rest of a member name after d code points shared by keys[a, b)
 * (sorted): the closing quote unless a declared name ends here, each next code point
 * of a declared name, or any other character (or escape) and then anything. */
static uint32_t notkey_rule(ctx *c, const keycp *keys, size_t a, size_t b, uint32_t d) {
    sbuf body = {0};
    bool ends = false;
    static const char OPEN[] = "( [^\"\\\\\\x7F\\x00-\\x1F";
    sb_add(&body, OPEN, strlen(OPEN));
    for (size_t k = a; k < b; k++) {
        if (keys[k].n == d) { ends = true; continue; }
        if (k > a && keys[k - 1].n > d && keys[k - 1].cp[d] == keys[k].cp[d]) continue;
        sb_printf(&body, "\\U%08X", (unsigned)keys[k].cp[d]);
    }
    sb_add(&body, "] char* \"\\\"\" ws | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) char* \"\\\"\" ws",
           strlen("] char* \"\\\"\" ws | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) char* \"\\\"\" ws"));
    if (!ends) sb_add(&body, " | \"\\\"\" ws", strlen(" | \"\\\"\" ws"));
    for (size_t k = a; k < b && c->st == TANDEM_OK;) {
        if (keys[k].n == d) { k++; continue; }
        size_t e = k;
        while (e < b && keys[e].n > d && keys[e].cp[d] == keys[k].cp[d]) e++;
        uint32_t r = notkey_rule(c, keys, k, e, d + 1);
        sb_printf(&body, " | \"\\U%08X\" r%u", (unsigned)keys[k].cp[d], r);
        k = e;
    }
    sb_str(&body, " )");
    uint32_t r = new_rule(c);
    put_rule(c, r, &body);
    free(body.s);
    return r;
}

/* A rule matching a member name (with its quotes and whitespace) other than the
 * props' names; UINT32_MAX with no error when a name needs escaping in JSON (then
 * any name is allowed: see json_schema.h). */
static uint32_t other_name(ctx *c, const tdm_json *props, const char *path) {
    size_t n = props ? props->n : 0;
    keycp *keys = tdm_calloc(n ? n : 1, sizeof(keycp));
    if (!keys) return fail(c, TANDEM_ERR_NOMEM, path, "out of memory");
    bool plain = true;
    for (size_t k = 0; k < n && plain; k++) {
        const uint8_t *s = (const uint8_t *)props->keys[k];
        size_t len = strlen(props->keys[k]);
        keys[k].cp = tdm_mallocarray(len ? len : 1, sizeof(uint32_t));
        if (!keys[k].cp) { plain = false; fail(c, TANDEM_ERR_NOMEM, path, "out of memory"); break; }
        gutf8 u = {0};
        for (size_t i = 0; i < len; i++) {
            int r = gutf8_step(&u, s[i]);
            if (r < 0 || (r > 0 && (u.cp < 0x20 || u.cp == '"' || u.cp == '\\' || u.cp == 0x7F))) { plain = false; break; }
            if (r > 0) keys[k].cp[keys[k].n++] = u.cp;
        }
    }
    uint32_t r = UINT32_MAX;
    if (plain && c->st == TANDEM_OK) {
        qsort(keys, n, sizeof(keycp), cmp_key);
        uint32_t rest = notkey_rule(c, keys, 0, n, 0);
        r = new_rule(c);
        sbuf body = {0};
        sb_printf(&body, "\"\\\"\" r%u", rest);
        put_rule(c, r, &body);
        free(body.s);
    }
    for (size_t k = 0; k < n; k++) free(keys[k].cp);
    free(keys);
    return r;
}

static void gen_object(ctx *c, const tdm_json *s, const char *path, bool *used, unsigned depth, sbuf *b) {
    const tdm_json *props = tdm_json_get(s, "properties"), *req = tdm_json_get(s, "required");
    const tdm_json *add = tdm_json_get(s, "additionalProperties");
    if (props) use(s, used, "properties");
    if (req) use(s, used, "required");
    if (add) use(s, used, "additionalProperties");
    if (props && props->type != TDM_JSON_OBJECT) { fail(c, TANDEM_ERR_FORMAT, path, "'properties' must be an object"); return; }
    if (req && req->type != TDM_JSON_ARRAY) { fail(c, TANDEM_ERR_FORMAT, path, "'required' must be an array"); return; }
    size_t np = props ? props->n : 0;
    for (size_t k = 0; req && k < req->n; k++) {
        if (req->items[k].type != TDM_JSON_STRING) { fail(c, TANDEM_ERR_FORMAT, path, "'required' must hold strings"); return; }
        if (!tdm_json_get(props, req->items[k].str)) {
            fail(c, TANDEM_ERR_UNSUPPORTED, path, "required property '%.40s' is not in 'properties'", req->items[k].str);
            return;
        }
    }
    /* each property's member rule: "name" ws ":" ws value */
    uint32_t *kv = tdm_calloc(np ? np : 1, sizeof(uint32_t));
    bool *isreq = tdm_calloc(np ? np : 1, sizeof(bool));
    if (!kv || !isreq) { free(kv), free(isreq); fail(c, TANDEM_ERR_NOMEM, path, "out of memory"); return; }
    char pp[256], p2[256];
    subpath(pp, sizeof pp, path, "properties");
    for (size_t k = 0; k < np && c->st == TANDEM_OK; k++) {
        for (size_t q = 0; req && q < req->n; q++)
            if (strcmp(req->items[q].str, props->keys[k]) == 0) isreq[k] = true;
        subpath(p2, sizeof p2, pp, props->keys[k]);
        uint32_t v = gen(c, &props->items[k], p2, depth + 1);
        if (v == UINT32_MAX) break;
        kv[k] = new_rule(c);
        sbuf body = {0};
        tdm_json key = {.type = TDM_JSON_STRING, .str = props->keys[k], .str_len = strlen(props->keys[k])};
        sbuf kt = {0};
        json_compact(&kt, &key);
        gbnf_literal(&body, kt.s ? kt.s : "", kt.n);
        free(kt.s);
        sb_printf(&body, " ws \":\" ws r%u", v);
        put_rule(c, kv[k], &body);
        free(body.s);
    }
    /* additional members */
    char extra[16] = "";
    if (c->st == TANDEM_OK && (!add || add->type != TDM_JSON_BOOL || add->b)) {
        char val[16] = "value";
        if (add && add->type != TDM_JSON_BOOL) {
            char ap[256];
            subpath(ap, sizeof ap, path, "additionalProperties");
            uint32_t v = gen(c, add, ap, depth + 1);
            if (v != UINT32_MAX) snprintf(val, sizeof val, "r%u", v);
        }
        uint32_t nm = other_name(c, props, path);
        uint32_t e = new_rule(c);
        sbuf body = {0};
        if (nm != UINT32_MAX) sb_printf(&body, "r%u \":\" ws %s", nm, val);
        else sb_printf(&body, "string \":\" ws %s", val);
        put_rule(c, e, &body);
        free(body.s);
        snprintf(extra, sizeof extra, "r%u", e);
    }
    if (c->st == TANDEM_OK) {
        /* required ones (in properties' order), then the optional ones, then extras */
        uint32_t *order = tdm_calloc(np ? np : 1, sizeof(uint32_t));
        size_t n_req = 0, n = 0;
        if (!order) { free(kv), free(isreq); fail(c, TANDEM_ERR_NOMEM, path, "out of memory"); return; }
        for (size_t k = 0; k < np; k++) if (isreq[k]) order[n++] = kv[k];
        n_req = n;
        for (size_t k = 0; k < np; k++) if (!isreq[k]) order[n++] = kv[k];
        sb_str(b, "\"{\" ws ");
        if (n_req > 0) {
            for (size_t k = 0; k < n_req; k++) sb_printf(b, "%sr%u ", k ? "\",\" ws " : "", order[k]);
            for (size_t k = n_req; k < n; k++) sb_printf(b, "(\",\" ws r%u)? ", order[k]);
            if (extra[0]) sb_printf(b, "(\",\" ws %s)* ", extra);
        } else if (n > 0 || extra[0]) {
            /* the first member present is one of the optional ones, or an extra */
            sb_str(b, "( ");
            for (size_t f = 0; f < n; f++) {
                sb_printf(b, "%sr%u ", f ? "| " : "", order[f]);
                for (size_t k = f + 1; k < n; k++) sb_printf(b, "(\",\" ws r%u)? ", order[k]);
                if (extra[0]) sb_printf(b, "(\",\" ws %s)* ", extra);
            }
            if (extra[0]) sb_printf(b, "%s%s (\",\" ws %s)* ", n ? "| " : "", extra, extra);
            sb_str(b, ")? ");
        }
        sb_str(b, "\"}\" ws");
        free(order);
    }
    free(kv), free(isreq);
}

static void gen_type(ctx *c, const tdm_json *s, const char *t, const char *path, bool *used, unsigned depth, sbuf *b) {
    if (strcmp(t, "object") == 0) gen_object(c, s, path, used, depth, b);
    else if (strcmp(t, "array") == 0) gen_array(c, s, path, used, depth, b);
    else if (strcmp(t, "string") == 0) gen_string(c, s, path, used, b);
    else if (strcmp(t, "integer") == 0) gen_integer(c, s, path, used, b);
    else if (strcmp(t, "number") == 0) {
        if (tdm_json_get(s, "minimum") || tdm_json_get(s, "maximum") || tdm_json_get(s, "exclusiveMinimum") ||
            tdm_json_get(s, "exclusiveMaximum"))
            fail(c, TANDEM_ERR_UNSUPPORTED, path, "minimum / maximum on a number (supported on integers only)");
        else sb_str(b, "number");
    } else if (strcmp(t, "boolean") == 0) sb_str(b, "boolean");
    else if (strcmp(t, "null") == 0) sb_str(b, "null");
    else fail(c, TANDEM_ERR_FORMAT, path, "unknown type '%.30s'", t);
}

static uint32_t gen(ctx *c, const tdm_json *s, const char *path, unsigned depth) {
    if (c->st != TANDEM_OK) return UINT32_MAX;
    if (depth > TDM_JSON_MAX_DEPTH) return fail(c, TANDEM_ERR_UNSUPPORTED, path, "schemas nested too deep");
    if (s->type == TDM_JSON_BOOL) {
        if (!s->b) return fail(c, TANDEM_ERR_UNSUPPORTED, path, "the schema false matches nothing");
        uint32_t r = new_rule(c);
        sbuf body = {0};
        sb_str(&body, "value");
        put_rule(c, r, &body);
        free(body.s);
        return r;
    }
    if (s->type != TDM_JSON_OBJECT) return fail(c, TANDEM_ERR_FORMAT, path, "a schema must be an object or a boolean");
    bool *used = tdm_calloc(s->n ? s->n : 1, sizeof(bool));
    if (!used) return fail(c, TANDEM_ERR_NOMEM, path, "out of memory");
    for (size_t k = 0; k < TDM_ARRAY_LEN(ANNOTATIONS); k++) use(s, used, ANNOTATIONS[k]);
    sbuf b = {0};
    const tdm_json *ref = tdm_json_get(s, "$ref"), *en = tdm_json_get(s, "enum"), *cn = tdm_json_get(s, "const");
    const tdm_json *any = tdm_json_get(s, "anyOf"), *one = tdm_json_get(s, "oneOf"), *ty = tdm_json_get(s, "type");
    if (ref) {
        use(s, used, "$ref");
        if (ref->type != TDM_JSON_STRING) fail(c, TANDEM_ERR_FORMAT, path, "'$ref' must be a string");
        else {
            uint32_t r = gen_ref(c, ref->str, path, depth);
            if (r != UINT32_MAX) sb_printf(&b, "r%u", r);
        }
    } else if (cn || en) {
        use(s, used, cn ? "const" : "enum");
        if (ty) use(s, used, "type"); /* (the values say it) */
        if (cn) const_alt(&b, cn);
        else if (en->type != TDM_JSON_ARRAY || en->n == 0) fail(c, TANDEM_ERR_FORMAT, path, "'enum' must be a non-empty array");
        else
            for (size_t k = 0; k < en->n; k++) {
                if (k) sb_str(&b, " | ");
                const_alt(&b, &en->items[k]);
            }
    } else if (any || one) {
        const char *kw = any ? "anyOf" : "oneOf";
        const tdm_json *alts = any ? any : one;
        use(s, used, kw);
        if (alts->type != TDM_JSON_ARRAY || alts->n == 0) fail(c, TANDEM_ERR_FORMAT, path, "'%s' must be a non-empty array", kw);
        char ap[256], p2[256];
        subpath(ap, sizeof ap, path, kw);
        for (size_t k = 0; c->st == TANDEM_OK && alts->type == TDM_JSON_ARRAY && k < alts->n; k++) {
            snprintf(p2, sizeof p2, "%.200s/%zu", ap, k);
            uint32_t r = gen(c, &alts->items[k], p2, depth + 1);
            if (r != UINT32_MAX) sb_printf(&b, "%sr%u", k ? " | " : "", r);
        }
    } else if (ty) {
        use(s, used, "type");
        if (ty->type == TDM_JSON_STRING) gen_type(c, s, ty->str, path, used, depth, &b);
        else if (ty->type == TDM_JSON_ARRAY && ty->n > 0) {
            for (size_t k = 0; k < ty->n && c->st == TANDEM_OK; k++) {
                if (ty->items[k].type != TDM_JSON_STRING) { fail(c, TANDEM_ERR_FORMAT, path, "'type' must hold strings"); break; }
                sb_add(&b, k ? " | ( " : "( ", k ? 5 : 2);
                gen_type(c, s, ty->items[k].str, path, used, depth, &b);
                sb_str(&b, " )");
            }
        } else fail(c, TANDEM_ERR_FORMAT, path, "'type' must be a string or a non-empty array");
    } else if (tdm_json_get(s, "properties") || tdm_json_get(s, "additionalProperties") || tdm_json_get(s, "required"))
        gen_type(c, s, "object", path, used, depth, &b);
    else if (tdm_json_get(s, "items")) gen_type(c, s, "array", path, used, depth, &b);
    else sb_str(&b, "value");
    /* every keyword must have been used */
    for (size_t k = 0; k < s->n && c->st == TANDEM_OK; k++)
        if (!used[k])
            fail(c, TANDEM_ERR_UNSUPPORTED, path, "keyword '%.40s' is not supported here (or does not apply to the schema's type)",
                 s->keys[k]);
    free(used);
    if (c->st != TANDEM_OK) {
        free(b.s);
        return UINT32_MAX;
    }
    uint32_t r = new_rule(c);
    put_rule(c, r, &b);
    free(b.s);
    return r;
}

tandem_status tdm_json_schema_to_gbnf_json(const tdm_json *schema, char **out, tdm_err *err) {
    if (!schema || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "json schema: NULL argument");
    *out = NULL;
    ctx c = {.root = schema, .err = err, .st = TANDEM_OK};
    sb_add(&c.out, PRIMITIVES, strlen(PRIMITIVES));
    uint32_t r = gen(&c, schema, "#", 0);
    if (r != UINT32_MAX) sb_printf(&c.out, "root ::= r%u\n", r);
    for (uint32_t k = 0; k < c.n_refs; k++) free(c.refs[k].ref);
    free(c.refs);
    if (c.st == TANDEM_OK && c.out.oom) c.st = tdm_seterr(err, TANDEM_ERR_NOMEM, "json schema: out of memory");
    if (c.st != TANDEM_OK) {
        free(c.out.s);
        return c.st;
    }
    *out = c.out.s;
    return TANDEM_OK;
}

tandem_status tdm_json_schema_to_gbnf(const char *schema, size_t len, char **out, tdm_err *err) {
    if (!schema || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "json schema: NULL argument");
    if (len > TDM_JSON_SCHEMA_MAX_TEXT)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "json schema: %zu bytes, above the limit %u", len, TDM_JSON_SCHEMA_MAX_TEXT);
    tdm_json *j = NULL;
    tdm_err e2 = {0};
    if (tdm_json_parse(schema, len, &j, &e2) != TANDEM_OK)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "json schema: not JSON: %s", e2.msg);
    tandem_status st = tdm_json_schema_to_gbnf_json(j, out, err);
    tdm_json_free(j);
    return st;
}

tandem_status tdm_json_schema_grammar(const char *schema, size_t len, tdm_grammar **out, tdm_err *err) {
    char *text = NULL;
    tandem_status st = tdm_json_schema_to_gbnf(schema, len, &text, err);
    if (st != TANDEM_OK) return st;
    st = tdm_grammar_parse(text, strlen(text), out, err);
    free(text);
    return st;
}

tandem_status tdm_json_object_grammar(tdm_grammar **out, tdm_err *err) {
    sbuf b = {0};
    sb_add(&b, PRIMITIVES, strlen(PRIMITIVES));
    sb_str(&b, "root ::= object\n");
    if (b.oom) return free(b.s), tdm_seterr(err, TANDEM_ERR_NOMEM, "json schema: out of memory");
    tandem_status st = tdm_grammar_parse(b.s, b.n, out, err);
    free(b.s);
    return st;
}
