/* grammar_parse.c - GBNF text -> a compiled tdm_grammar (grammar.h states the
 * syntax and the limits).  A recursive-descent parser over the bytes: each rule's
 * body becomes a vector of elements; groups and repetitions become generated rules
 * (x* as R ::= x R | "", x{2,4} as x x R1 with R1 ::= x R2 | "", R2 ::= x | "");
 * then the rules are laid out one after another and checked (grammar_check.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef struct evec {
    gelem *v;
    uint32_t n, cap;
} evec;

typedef struct prule {
    char *name;     /* NULL: generated */
    evec body;
    bool defined;
    size_t used_at; /* offset of the first reference (undefined-rule errors) */
    size_t def_at;  /* offset of the definition */
} prule;

typedef struct parser {
    const char *s;
    size_t len, i;
    prule *rules;
    uint32_t n_rules, cap_rules;
    uint32_t *hash; /* open addressing: rule index + 1 of named rules, 0 empty */
    uint32_t hash_cap;
    uint32_t *rng;  /* class ranges, pairs */
    uint32_t n_rng, cap_rng;
    gclass *cls;
    uint32_t n_cls, cap_cls;
    uint64_t n_el;  /* elements in all rules so far (the limit) */
    tdm_err *err;
    tandem_status st;
} parser;

static void where(const parser *p, size_t at, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t k = 0; k < at && k < p->len; k++) {
        if (p->s[k] == '\n') l++, c = 1;
        else c++;
    }
    *line = l;
    *col = c;
}

__attribute__((format(printf, 3, 4))) static bool fail(parser *p, size_t at, const char *fmt, ...) {
    if (p->st != TANDEM_OK) return false;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int l, c;
    where(p, at, &l, &c);
    p->st = tdm_seterr(p->err, TANDEM_ERR_FORMAT, "grammar line %d:%d: %s", l, c, msg);
    return false;
}

static bool nomem(parser *p) {
    if (p->st == TANDEM_OK) p->st = tdm_seterr(p->err, TANDEM_ERR_NOMEM, "grammar: out of memory");
    return false;
}

static bool grow(parser *p, void **v, uint32_t *cap, uint32_t need, size_t size) {
    if (need <= *cap) return true;
    uint32_t nc = *cap ? *cap : 16;
    while (nc < need) nc *= 2;
    void *nv = realloc(*v, (size_t)nc * size);
    if (!nv) return nomem(p);
    *v = nv;
    *cap = nc;
    return true;
}

static bool emit(parser *p, evec *e, uint32_t type, uint32_t val) {
    if (++p->n_el > TDM_GRAMMAR_MAX_ELEMENTS)
        return fail(p, p->i, "more than %u elements (after expanding repetitions): the grammar is too large",
                    TDM_GRAMMAR_MAX_ELEMENTS);
    if (!grow(p, (void **)&e->v, &e->cap, e->n + 1, sizeof(gelem))) return false;
    e->v[e->n++] = (gelem){type, val};
    return true;
}

static uint32_t hash_name(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t k = 0; k < n; k++) h = (h ^ (uint8_t)s[k]) * 16777619u;
    return h;
}

/* A new rule (name NULL: generated); returns its index or UINT32_MAX. */
static uint32_t new_rule(parser *p, const char *name, size_t nlen) {
    if (p->n_rules >= TDM_GRAMMAR_MAX_RULES) {
        fail(p, p->i, "more than %u rules (groups and repetitions count): the grammar is too large",
             TDM_GRAMMAR_MAX_RULES);
        return UINT32_MAX;
    }
    if (!grow(p, (void **)&p->rules, &p->cap_rules, p->n_rules + 1, sizeof(prule))) return UINT32_MAX;
    prule *r = &p->rules[p->n_rules];
    memset(r, 0, sizeof *r);
    r->def_at = p->i;
    if (name) {
        r->name = tdm_strndup(name, nlen);
        if (!r->name) return nomem(p), UINT32_MAX;
        /* the name table at most half full */
        if (2 * (p->n_rules + 1) > p->hash_cap) {
            uint32_t nc = p->hash_cap ? 2 * p->hash_cap : 64;
            uint32_t *nh = calloc(nc, sizeof *nh);
            if (!nh) return nomem(p), UINT32_MAX;
            for (uint32_t k = 0; k < p->hash_cap; k++) {
                if (!p->hash[k]) continue;
                const char *nm = p->rules[p->hash[k] - 1].name;
                uint32_t h = hash_name(nm, strlen(nm)) & (nc - 1);
                while (nh[h]) h = (h + 1) & (nc - 1);
                nh[h] = p->hash[k];
            }
            free(p->hash);
            p->hash = nh;
            p->hash_cap = nc;
        }
        uint32_t h = hash_name(name, nlen) & (p->hash_cap - 1);
        while (p->hash[h]) h = (h + 1) & (p->hash_cap - 1);
        p->hash[h] = p->n_rules + 1;
    }
    return p->n_rules++;
}

/* The rule of that name, created (undefined) on first sight. */
static uint32_t rule_named(parser *p, const char *name, size_t nlen) {
    if (p->hash_cap) {
        uint32_t h = hash_name(name, nlen) & (p->hash_cap - 1);
        while (p->hash[h]) {
            const char *nm = p->rules[p->hash[h] - 1].name;
            if (strlen(nm) == nlen && memcmp(nm, name, nlen) == 0) return p->hash[h] - 1;
            h = (h + 1) & (p->hash_cap - 1);
        }
    }
    return new_rule(p, name, nlen);
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when nl. */
static void space(parser *p, bool nl) {
    while (p->i < p->len) {
        char c = p->s[p->i];
        if (c == ' ' || c == '\t' || (nl && (c == '\n' || c == '\r'))) p->i++;
        else if (c == '#') {
            while (p->i < p->len && p->s[p->i] != '\n') p->i++;
        } else break;
    }
}

static bool hexval(parser *p, int ndig, uint32_t *out) {
    uint32_t v = 0;
    size_t at = p->i;
    for (int k = 0; k < ndig; k++) {
        if (p->i >= p->len) return fail(p, at, "escape needs %d hex digits", ndig);
        char c = p->s[p->i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail(p, p->i, "escape needs %d hex digits, found '%c'", ndig, c);
        v = v * 16 + (uint32_t)d;
        p->i++;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return fail(p, at, "escape U+%X is not a Unicode scalar value", (unsigned)v);
    *out = v;
    return true;
}

/* One character of a literal or class (an escape or a UTF-8 sequence). */
static bool parse_char(parser *p, uint32_t *cp) {
    size_t at = p->i;
    if (p->i >= p->len) return fail(p, at, "unexpected end of the grammar");
    uint8_t c = (uint8_t)p->s[p->i];
    if (c == '\\') {
        if (++p->i >= p->len) return fail(p, at, "unexpected end of the grammar after '\\'");
        char e = p->s[p->i++];
        switch (e) {
        case 'n': *cp = '\n'; return true;
        case 't': *cp = '\t'; return true;
        case 'r': *cp = '\r'; return true;
        case '\\': case '"': case '[': case ']': case '-': case '^': case '/': *cp = (uint8_t)e; return true;
        case 'x': return hexval(p, 2, cp);
        case 'u': return hexval(p, 4, cp);
        case 'U': return hexval(p, 8, cp);
        default: return fail(p, at, "unknown escape '\\%c'", e >= 32 && e < 127 ? e : '?');
        }
    }
    gutf8 u = {0};
    for (;;) {
        int r = p->i < p->len ? gutf8_step(&u, (uint8_t)p->s[p->i++]) : -1;
        if (r < 0) return fail(p, at, "invalid UTF-8");
        if (r > 0) break;
    }
    *cp = u.cp;
    return true;
}

static uint32_t new_class(parser *p, const uint32_t *pairs, uint32_t npairs, bool neg) {
    /* sort (insertion: classes are short) and merge the ranges */
    if (!grow(p, (void **)&p->rng, &p->cap_rng, p->n_rng + npairs + 1, 2 * sizeof(uint32_t))) return UINT32_MAX;
    if (!grow(p, (void **)&p->cls, &p->cap_cls, p->n_cls + 1, sizeof(gclass))) return UINT32_MAX;
    uint32_t *r = p->rng + 2 * (size_t)p->n_rng, n = 0;
    for (uint32_t k = 0; k < npairs; k++) {
        uint32_t lo = pairs[2 * k], hi = pairs[2 * k + 1], j = n;
        while (j > 0 && r[2 * (j - 1)] > lo) {
            r[2 * j] = r[2 * (j - 1)];
            r[2 * j + 1] = r[2 * (j - 1) + 1];
            j--;
        }
        r[2 * j] = lo;
        r[2 * j + 1] = hi;
        n++;
    }
    uint32_t m = 0;
    for (uint32_t k = 0; k < n; k++) {
        if (m > 0 && r[2 * k] <= r[2 * (m - 1) + 1] + 1) {
            if (r[2 * k + 1] > r[2 * (m - 1) + 1]) r[2 * (m - 1) + 1] = r[2 * k + 1];
        } else {
            r[2 * m] = r[2 * k];
            r[2 * m + 1] = r[2 * k + 1];
            m++;
        }
    }
    p->cls[p->n_cls] = (gclass){p->n_rng, m, neg};
    p->n_rng += m;
    return p->n_cls++;
}

static bool emit_char(parser *p, evec *e, uint32_t cp) {
    uint32_t pr[2] = {cp, cp};
    uint32_t c = new_class(p, pr, 1, false);
    return c != UINT32_MAX && emit(p, e, GE_TERM, c);
}

static bool parse_alternates(parser *p, evec *e, bool nested, unsigned depth);

/* A repetition's copies: item (its elements) {lo, hi} (hi UINT32_MAX: unbounded). */
static bool repeat(parser *p, evec *e, const gelem *item, uint32_t n_item, uint32_t lo, uint32_t hi) {
    for (uint32_t k = 0; k < lo; k++)
        for (uint32_t j = 0; j < n_item; j++)
            if (!emit(p, e, item[j].type, item[j].val)) return false;
    if (hi == lo) return true;
    if (hi == UINT32_MAX) { /* R ::= item R | "" */
        uint32_t r = new_rule(p, NULL, 0);
        if (r == UINT32_MAX) return false;
        evec *b = &p->rules[r].body;
        for (uint32_t j = 0; j < n_item; j++)
            if (!emit(p, b, item[j].type, item[j].val)) return false;
        if (!emit(p, b, GE_REF, r) || !emit(p, b, GE_ALT, 0)) return false;
        p->rules[r].defined = true;
        return emit(p, e, GE_REF, r);
    }
    /* R1 ::= item R2 | "" ... Rk ::= item | "" (built from the innermost out) */
    uint32_t next = UINT32_MAX;
    for (uint32_t k = hi - lo; k > 0; k--) {
        uint32_t r = new_rule(p, NULL, 0);
        if (r == UINT32_MAX) return false;
        evec *b = &p->rules[r].body;
        for (uint32_t j = 0; j < n_item; j++)
            if (!emit(p, b, item[j].type, item[j].val)) return false;
        if (next != UINT32_MAX && !emit(p, b, GE_REF, next)) return false;
        if (!emit(p, b, GE_ALT, 0)) return false;
        p->rules[r].defined = true;
        next = r;
    }
    return emit(p, e, GE_REF, next);
}

static bool parse_uint(parser *p, uint32_t *out) {
    size_t at = p->i;
    uint64_t v = 0;
    if (p->i >= p->len || p->s[p->i] < '0' || p->s[p->i] > '9') return fail(p, at, "expected a number in { }");
    while (p->i < p->len && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
        v = v * 10 + (uint64_t)(p->s[p->i++] - '0');
        if (v > TDM_GRAMMAR_MAX_REPEAT)
            return fail(p, at, "repetition bound above the limit %u", TDM_GRAMMAR_MAX_REPEAT);
    }
    *out = (uint32_t)v;
    return true;
}

static bool parse_sequence(parser *p, evec *e, bool nested, unsigned depth) {
    uint32_t last = UINT32_MAX; /* where the last item's elements start */
    while (p->i < p->len) {
        size_t at = p->i;
        char c = p->s[p->i];
        if (c == '"') {
            p->i++;
            last = e->n;
            while (p->i < p->len && p->s[p->i] != '"') {
                if (p->s[p->i] == '\n') return fail(p, p->i, "newline inside a literal (write \\n)");
                uint32_t cp;
                if (!parse_char(p, &cp) || !emit_char(p, e, cp)) return false;
            }
            if (p->i >= p->len) return fail(p, at, "unterminated literal");
            p->i++;
        } else if (c == '[') {
            p->i++;
            bool neg = p->i < p->len && p->s[p->i] == '^';
            if (neg) p->i++;
            uint32_t *pairs = NULL, np = 0, capp = 0;
            while (p->i < p->len && p->s[p->i] != ']') {
                uint32_t lo, hi;
                if (!parse_char(p, &lo)) return free(pairs), false;
                hi = lo;
                if (p->i + 1 < p->len && p->s[p->i] == '-' && p->s[p->i + 1] != ']') {
                    size_t rat = p->i;
                    p->i++;
                    if (!parse_char(p, &hi)) return free(pairs), false;
                    if (hi < lo) return free(pairs), fail(p, rat, "character range end below its start");
                }
                if (!grow(p, (void **)&pairs, &capp, np + 1, 2 * sizeof(uint32_t))) return free(pairs), false;
                pairs[2 * np] = lo;
                pairs[2 * np + 1] = hi;
                np++;
            }
            if (p->i >= p->len) return free(pairs), fail(p, at, "unterminated character class");
            p->i++;
            if (np == 0) return fail(p, at, "empty character class");
            uint32_t k = new_class(p, pairs, np, neg);
            free(pairs);
            last = e->n;
            if (k == UINT32_MAX || !emit(p, e, GE_TERM, k)) return false;
        } else if (c == '.') {
            p->i++;
            uint32_t k = new_class(p, NULL, 0, true);
            last = e->n;
            if (k == UINT32_MAX || !emit(p, e, GE_TERM, k)) return false;
        } else if (is_word(c)) {
            size_t b = p->i;
            while (p->i < p->len && is_word(p->s[p->i])) p->i++;
            uint32_t r = rule_named(p, p->s + b, p->i - b);
            if (r == UINT32_MAX) return false;
            if (!p->rules[r].defined && !p->rules[r].used_at) p->rules[r].used_at = b + 1;
            last = e->n;
            if (!emit(p, e, GE_REF, r)) return false;
        } else if (c == '(') {
            if (depth >= TDM_GRAMMAR_MAX_NESTING)
                return fail(p, at, "groups nested deeper than the limit %u", TDM_GRAMMAR_MAX_NESTING);
            p->i++;
            space(p, true);
            uint32_t r = new_rule(p, NULL, 0);
            if (r == UINT32_MAX) return false;
            evec body = {0};
            bool ok = parse_alternates(p, &body, true, depth + 1);
            p->rules[r].body = body; /* (the rule table may have moved) */
            p->rules[r].defined = true;
            if (!ok) return false;
            if (p->i >= p->len || p->s[p->i] != ')') return fail(p, at, "unmatched '('");
            p->i++;
            last = e->n;
            if (!emit(p, e, GE_REF, r)) return false;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last == UINT32_MAX) return fail(p, at, "repetition '%c' without an item before it", c);
            uint32_t lo = 0, hi = UINT32_MAX;
            p->i++;
            if (c == '+') lo = 1;
            else if (c == '?') hi = 1;
            else if (c == '{') {
                space(p, false);
                if (!parse_uint(p, &lo)) return false;
                space(p, false);
                hi = lo;
                if (p->i < p->len && p->s[p->i] == ',') {
                    p->i++;
                    space(p, false);
                    hi = UINT32_MAX;
                    if (p->i < p->len && p->s[p->i] != '}' && !parse_uint(p, &hi)) return false;
                    space(p, false);
                }
                if (p->i >= p->len || p->s[p->i] != '}') return fail(p, at, "expected '}' closing the repetition");
                p->i++;
                if (hi < lo) return fail(p, at, "repetition {%u,%u}: maximum below minimum", lo, hi);
            }
            uint32_t n_item = e->n - last;
            gelem *item = tdm_mallocarray(n_item ? n_item : 1, sizeof(gelem));
            if (!item) return nomem(p);
            if (n_item) memcpy(item, e->v + last, n_item * sizeof(gelem));
            e->n = last;
            p->n_el -= n_item;
            bool ok = repeat(p, e, item, n_item, lo, hi);
            free(item);
            if (!ok) return false;
            last = UINT32_MAX; /* x** is an error as in llama.cpp */
        } else break;
        space(p, nested);
    }
    return true;
}

static bool parse_alternates(parser *p, evec *e, bool nested, unsigned depth) {
    if (!parse_sequence(p, e, nested, depth)) return false;
    while (p->i < p->len && p->s[p->i] == '|') {
        p->i++;
        space(p, true);
        if (!emit(p, e, GE_ALT, 0) || !parse_sequence(p, e, nested, depth)) return false;
    }
    return true;
}

static bool parse_rules(parser *p) {
    space(p, true);
    while (p->i < p->len) {
        size_t at = p->i;
        if (!is_word(p->s[p->i])) return fail(p, at, "expected a rule name");
        while (p->i < p->len && is_word(p->s[p->i])) p->i++;
        size_t nlen = p->i - at;
        space(p, false);
        if (p->len - p->i < 3 || memcmp(p->s + p->i, "::=", 3) != 0) return fail(p, p->i, "expected '::='");
        p->i += 3;
        space(p, true);
        uint32_t r = rule_named(p, p->s + at, nlen);
        if (r == UINT32_MAX) return false;
        if (p->rules[r].defined) {
            int l, c;
            where(p, p->rules[r].def_at, &l, &c);
            return fail(p, at, "rule '%.*s' defined again (first at line %d:%d)", (int)TDM_MIN(nlen, 64), p->s + at, l, c);
        }
        p->rules[r].defined = true;
        p->rules[r].def_at = at;
        evec body = {0};
        bool ok = parse_alternates(p, &body, false, 0);
        p->rules[r].body = body;
        if (!ok) return false;
        if (p->i < p->len && p->s[p->i] != '\n' && p->s[p->i] != '\r')
            return fail(p, p->i, "unexpected '%c'", p->s[p->i] >= 32 && p->s[p->i] < 127 ? p->s[p->i] : '?');
        space(p, true);
    }
    return true;
}

static void parser_free(parser *p) {
    for (uint32_t k = 0; k < p->n_rules; k++) {
        free(p->rules[k].name);
        free(p->rules[k].body.v);
    }
    free(p->rules);
    free(p->hash);
    free(p->rng);
    free(p->cls);
}

void tdm_grammar_free(tdm_grammar *g) {
    if (!g) return;
    free(g->el);
    free(g->rule_start);
    free(g->alt_off);
    free(g->alt);
    free(g->cls);
    free(g->rng);
    free(g);
}

uint32_t tdm_grammar_n_rules(const tdm_grammar *g) { return g->n_rules; }
uint32_t tdm_grammar_n_elements(const tdm_grammar *g) { return g->n_el; }

/* Lays the rules out in one array and runs the checks. */
static tandem_status finish(parser *p, tdm_grammar **out) {
    uint32_t root = UINT32_MAX;
    for (uint32_t k = 0; k < p->n_rules; k++) {
        prule *r = &p->rules[k];
        if (!r->defined) {
            fail(p, r->used_at ? r->used_at - 1 : 0, "undefined rule '%.64s'", r->name);
            return p->st;
        }
        if (r->name && strcmp(r->name, "root") == 0) root = k;
    }
    if (root == UINT32_MAX) {
        fail(p, p->len, "no 'root' rule");
        return p->st;
    }
    tdm_grammar *g = calloc(1, sizeof *g);
    if (!g) return nomem(p), p->st;
    uint64_t n_el = 0;
    for (uint32_t k = 0; k < p->n_rules; k++) n_el += p->rules[k].body.n + 1;
    g->el = tdm_mallocarray(n_el, sizeof(gelem));
    g->rule_start = tdm_mallocarray(p->n_rules, sizeof(uint32_t));
    const char **names = tdm_calloc(p->n_rules, sizeof(char *));
    char (*wh)[24] = tdm_calloc(p->n_rules, 24);
    const char **whp = tdm_calloc(p->n_rules, sizeof(char *));
    if (!g->el || !g->rule_start || !names || !wh || !whp) {
        free(names), free(wh), free(whp);
        tdm_grammar_free(g);
        return nomem(p), p->st;
    }
    for (uint32_t k = 0; k < p->n_rules; k++) {
        g->rule_start[k] = g->n_el;
        if (p->rules[k].body.n) memcpy(g->el + g->n_el, p->rules[k].body.v, p->rules[k].body.n * sizeof(gelem));
        g->n_el += p->rules[k].body.n;
        g->el[g->n_el++] = (gelem){GE_END, 0};
        names[k] = p->rules[k].name;
        int l, c;
        where(p, p->rules[k].def_at, &l, &c);
        snprintf(wh[k], 24, "%d:%d", l, c);
        whp[k] = wh[k];
    }
    g->n_rules = p->n_rules;
    g->root = root;
    /* each rule's alternatives, for the matcher's expansion */
    uint32_t n_alts = g->n_rules;
    for (uint32_t k = 0; k < g->n_el; k++) n_alts += g->el[k].type == GE_ALT;
    g->alt_off = tdm_mallocarray((size_t)g->n_rules + 1, sizeof(uint32_t));
    g->alt = tdm_mallocarray(n_alts, sizeof(uint32_t));
    if (!g->alt_off || !g->alt) {
        free(names), free(wh), free(whp);
        tdm_grammar_free(g);
        return nomem(p), p->st;
    }
    for (uint32_t r = 0, na = 0; r < g->n_rules; r++) {
        g->alt_off[r] = na;
        g->alt[na++] = g->rule_start[r];
        for (uint32_t k = g->rule_start[r]; g->el[k].type != GE_END; k++)
            if (g->el[k].type == GE_ALT) g->alt[na++] = k + 1;
        g->alt_off[r + 1] = na;
    }
    g->cls = p->cls, g->n_cls = p->n_cls, p->cls = NULL;
    g->rng = p->rng, g->n_rng = p->n_rng, p->rng = NULL;
    tandem_status st = tdm_grammar_check(g, names, whp, p->err);
    free(names), free(wh), free(whp);
    if (st != TANDEM_OK) {
        tdm_grammar_free(g);
        return st;
    }
    *out = g;
    return TANDEM_OK;
}

tandem_status tdm_grammar_parse(const char *text, size_t len, tdm_grammar **out, tdm_err *err) {
    if (!out || (!text && len)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar: NULL argument");
    *out = NULL;
    if (len > TDM_GRAMMAR_MAX_TEXT)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "grammar: %zu bytes, above the limit %u", len, TDM_GRAMMAR_MAX_TEXT);
    parser p = {.s = text, .len = len, .err = err, .st = TANDEM_OK};
    if (parse_rules(&p)) p.st = finish(&p, out);
    parser_free(&p);
    return p.st;
}
