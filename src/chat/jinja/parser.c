/* parser.c - tokens -> jj_node tree: the shared helpers and the expressions, which
 * follow jinja2's grammar and precedence, loosest first:
 *   a if c else b,  or,  and,  not,  comparisons (== != < <= > >= in, not in; chained),
 *   + -,  ~,  * / // %,  **,  unary - +,  then primary with postfix . [] () and the
 *   filter (|name) and test (is [not] name) suffixes.
 * Unknown filters and tests are errors here, as jinja2 reports them at compile time.
 * Nesting is bounded by TDM_JINJA_MAX_NESTING. */
#include <stdio.h>
#include <string.h>

#include "jj_parse.h"

bool jp_pfail(parser *P, const jj_token *at, tandem_status st, const char *fmt, ...) {
    char raw[200], m[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    tdm_jinja_escape(m, sizeof m, raw);
    tdm_seterr(P->err, st, "line %d, column %d: %s", at->line, at->col, m);
    return false;
}

const jj_token *jp_peek(const parser *P) { return &P->t[P->i]; }
const jj_token *jp_peek2(const parser *P) { return &P->t[P->i + 1 < P->n ? P->i + 1 : P->i]; }
const jj_token *jp_next(parser *P) {
    const jj_token *t = &P->t[P->i];
    if (t->kind != TK_EOF) P->i++;
    return t;
}

bool jp_tok_is(const jj_token *t, jj_tk kind, const char *text) {
    if (t->kind != kind) return false;
    if (!text) return true;
    size_t l = strlen(text);
    return t->n == l && memcmp(t->p, text, l) == 0;
}
bool jp_is_op(const jj_token *t, const char *op) { return jp_tok_is(t, TK_OP, op); }
bool jp_is_kw(const jj_token *t, const char *kw) { return jp_tok_is(t, TK_NAME, kw); }

/* A short description of a token for messages. */
const char *jp_describe(const jj_token *t, char buf[48]) {
    switch (t->kind) {
    case TK_EOF: return "the end of the template";
    case TK_DATA: return "text";
    case TK_VAR_BEGIN: return "'{{'";
    case TK_VAR_END: return "'}}'";
    case TK_BLOCK_BEGIN: return "'{%'";
    case TK_BLOCK_END: return "'%}'";
    case TK_STRING: return "a string";
    case TK_INT: case TK_FLOAT: return "a number";
    default: snprintf(buf, 48, "'%.*s'", (int)TDM_MIN(t->n, 40), t->p); return buf;
    }
}

bool jp_expect(parser *P, jj_tk kind, const char *text, const char *what) {
    const jj_token *t = jp_peek(P);
    if (!jp_tok_is(t, kind, text)) {
        char b[48];
        return jp_pfail(P, t, TANDEM_ERR_FORMAT, "expected %s, found %s", what, jp_describe(t, b));
    }
    jp_next(P);
    return true;
}

bool jj_parse_nomem(tdm_err *err) {
    tdm_seterr(err, TANDEM_ERR_NOMEM, "the template needs more than %zu MiB of memory to parse",
               TDM_JINJA_MAX_PARSE_MEMORY >> 20);
    return false;
}

void *jp_alloc(parser *P, size_t n) {
    void *p = jj_arena_alloc(P->a, n);
    if (!p) jj_parse_nomem(P->err);
    return p;
}

jj_node *jp_node(parser *P, jj_kind kind, const jj_token *at) {
    jj_node *n = jp_alloc(P, sizeof *n);
    if (!n) return NULL;
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

char *jp_name_dup(parser *P, const jj_token *t) {
    char *s = jp_alloc(P, t->n + 1);
    if (!s) return NULL;
    memcpy(s, t->p, t->n);
    return s;
}

/* A growable array of node pointers (arena). */
bool jp_nvec_push(parser *P, nvec *a, jj_node *x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 4;
        jj_node **nv = jp_alloc(P, nc * sizeof *nv);
        if (!nv) return false;
        if (a->n) memcpy(nv, a->v, a->n * sizeof *nv);
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return true;
}

bool jp_svec_push(parser *P, svec *a, const char *s) {
    if (!s) return false;
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 4;
        const char **nv = jp_alloc(P, nc * sizeof *nv);
        if (!nv) return false;
        if (a->n) memcpy(nv, a->v, a->n * sizeof *nv);
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = s;
    return true;
}

bool jp_enter(parser *P) {
    if (++P->depth > TDM_JINJA_MAX_NESTING)
        return jp_pfail(P, jp_peek(P), TANDEM_ERR_FORMAT, "template nested deeper than %d levels", TDM_JINJA_MAX_NESTING);
    return true;
}

/* ------------------------------------------------------------ expressions */

static jj_node *parse_unary(parser *P, bool with_filter);

/* Call arguments after "(": positional then keyword (name=value). */
bool jp_parse_args(parser *P, jj_node *n) {
    nvec pos = {0}, kwv = {0};
    svec kw = {0};
    while (!jp_is_op(jp_peek(P), ")")) {
        if (pos.n + kw.n > 0 && !jp_expect(P, TK_OP, ",", "',' or ')'")) return false;
        if (jp_is_op(jp_peek(P), ")")) break; /* a trailing comma */
        if (jp_peek(P)->kind == TK_NAME && jp_is_op(jp_peek2(P), "=")) {
            const jj_token *name = jp_next(P);
            jp_next(P);
            jj_node *v = jp_parse_expr(P);
            if (!v || !jp_svec_push(P, &kw, jp_name_dup(P, name)) || !jp_nvec_push(P, &kwv, v)) return false;
        } else {
            if (kw.n) return jp_pfail(P, jp_peek(P), TANDEM_ERR_FORMAT, "a positional argument after a keyword argument");
            jj_node *v = jp_parse_expr(P);
            if (!v || !jp_nvec_push(P, &pos, v)) return false;
        }
    }
    jp_next(P);
    n->list = pos.v;
    n->n = pos.n;
    n->names = kw.v;
    n->n_names = kw.n;
    n->list2 = kwv.v;
    n->n2 = kwv.n;
    return true;
}

/* [a, b], (a, b) / (a), {k: v}. */
static jj_node *parse_brackets(parser *P, const jj_token *open) {
    const char close = open->p[0] == '[' ? ']' : open->p[0] == '(' ? ')' : '}';
    char cs[2] = {close, 0};
    jj_node *n = jp_node(P, close == ']' ? E_LIST : close == ')' ? E_TUPLE : E_DICT, open);
    if (!n) return NULL;
    nvec items = {0}, vals = {0};
    bool comma = false;
    while (!jp_is_op(jp_peek(P), cs)) {
        if (items.n && !jp_expect(P, TK_OP, ",", close == '}' ? "',' or '}'" : close == ']' ? "',' or ']'" : "',' or ')'"))
            return NULL;
        if (items.n) comma = true;
        if (jp_is_op(jp_peek(P), cs)) break;
        jj_node *x = jp_parse_expr(P);
        if (!x || !jp_nvec_push(P, &items, x)) return NULL;
        if (close == '}') {
            if (!jp_expect(P, TK_OP, ":", "':'")) return NULL;
            jj_node *v = jp_parse_expr(P);
            if (!v || !jp_nvec_push(P, &vals, v)) return NULL;
        }
    }
    jp_next(P);
    if (close == ')' && items.n == 1 && !comma) return items.v[0]; /* (x) */
    n->list = items.v;
    n->n = items.n;
    n->list2 = vals.v;
    n->n2 = vals.n;
    return n;
}

static jj_node *parse_primary(parser *P) {
    const jj_token *t = jp_next(P);
    jj_node *n;
    switch (t->kind) {
    case TK_NAME:
        if (jp_is_kw(t, "true") || jp_is_kw(t, "True") || jp_is_kw(t, "false") || jp_is_kw(t, "False")) {
            if (!(n = jp_node(P, E_LIT, t))) return NULL;
            n->lit = jv_bool(t->p[0] == 't' || t->p[0] == 'T');
            return n;
        }
        if (jp_is_kw(t, "none") || jp_is_kw(t, "None")) {
            if (!(n = jp_node(P, E_LIT, t))) return NULL;
            n->lit = jv_none();
            return n;
        }
        if (!(n = jp_node(P, E_NAME, t)) || !(n->str = jp_name_dup(P, t))) return NULL;
        n->len = t->n;
        return n;
    case TK_STRING: {
        /* adjacent literals join: 'a' 'b' */
        size_t total = t->n;
        size_t j = P->i;
        while (j < P->n && P->t[j].kind == TK_STRING) total += P->t[j++].n;
        jj_str *s = jp_alloc(P, sizeof *s + total + 1);
        if (!s || !(n = jp_node(P, E_LIT, t))) return NULL;
        memcpy(s->s, t->p, t->n);
        s->len = t->n;
        while (jp_peek(P)->kind == TK_STRING) {
            const jj_token *u = jp_next(P);
            memcpy(s->s + s->len, u->p, u->n);
            s->len += u->n;
        }
        n->lit = jv_str(s);
        return n;
    }
    case TK_INT:
    case TK_FLOAT:
        if (!(n = jp_node(P, E_LIT, t))) return NULL;
        n->lit = t->kind == TK_INT ? jv_int(t->i) : jv_float(t->f);
        return n;
    case TK_OP:
        if (jp_is_op(t, "(") || jp_is_op(t, "[") || jp_is_op(t, "{")) return parse_brackets(P, t);
        /* fall through */
    default: {
        char b[48];
        jp_pfail(P, t, TANDEM_ERR_FORMAT, "expected an expression, found %s", jp_describe(t, b));
        return NULL;
    }
    }
}

/* x[...]: an index or a slice a:b:c. */
static jj_node *parse_subscript(parser *P, jj_node *obj, const jj_token *at) {
    jj_node *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    bool slice = false;
    for (;;) {
        if (jp_is_op(jp_peek(P), ":")) {
            if (++k > 2) return jp_pfail(P, jp_peek(P), TANDEM_ERR_FORMAT, "too many ':' in a slice"), NULL;
            slice = true;
            jp_next(P);
            continue;
        }
        if (jp_is_op(jp_peek(P), "]")) break;
        if (parts[k]) return jp_expect(P, TK_OP, "]", "']'"), NULL;
        if (!(parts[k] = jp_parse_expr(P))) return NULL;
    }
    jp_next(P);
    jj_node *n = jp_node(P, slice ? E_SLICE : E_ITEM, at);
    if (!n) return NULL;
    n->a = obj;
    if (!slice && !parts[0]) return jp_pfail(P, at, TANDEM_ERR_FORMAT, "empty subscript"), NULL;
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

/* callee(args) after the "(" at t. */
static jj_node *parse_call(parser *P, jj_node *callee, const jj_token *t) {
    jj_node *m = jp_node(P, E_CALL, t);
    if (!m) return NULL;
    m->line = callee->line; /* messages point at what is called */
    m->col = callee->col;
    m->a = callee;
    return jp_parse_args(P, m) ? m : NULL;
}

static jj_node *parse_postfix(parser *P, jj_node *n) {
    for (;;) {
        const jj_token *t = jp_peek(P);
        if (jp_is_op(t, ".")) {
            jp_next(P);
            const jj_token *name = jp_next(P);
            jj_node *m;
            if (name->kind == TK_INT) { /* x.0 is x[0] */
                if (!(m = jp_node(P, E_ITEM, t)) || !(m->b = jp_node(P, E_LIT, name))) return NULL;
                m->b->lit = jv_int(name->i);
            } else {
                if (name->kind != TK_NAME) {
                    char b[48];
                    return jp_pfail(P, name, TANDEM_ERR_FORMAT, "expected an attribute name, found %s", jp_describe(name, b)), NULL;
                }
                if (!(m = jp_node(P, E_ATTR, t)) || !(m->str = jp_name_dup(P, name))) return NULL;
                m->len = name->n;
            }
            m->a = n;
            n = m;
        } else if (jp_is_op(t, "[")) {
            jp_next(P);
            if (!(n = parse_subscript(P, n, t))) return NULL;
        } else if (jp_is_op(t, "(")) {
            jp_next(P);
            if (!(n = parse_call(P, n, t))) return NULL;
        } else {
            return n;
        }
    }
}

/* Tokens that can begin the bare argument of a test ("x is divisibleby 3"). */
static bool starts_test_arg(const jj_token *t) {
    if (t->kind == TK_STRING || t->kind == TK_INT || t->kind == TK_FLOAT) return true;
    if (t->kind == TK_OP) return jp_is_op(t, "(") || jp_is_op(t, "[") || jp_is_op(t, "{") || jp_is_op(t, "-");
    if (t->kind != TK_NAME) return false;
    static const char *const stop[] = {"else", "or", "and", "if", "in", "is", "not"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(stop); i++)
        if (jp_is_kw(t, stop[i])) return false;
    return true;
}

/* |filter(args) and "is [not] test" suffixes (and calls on their results). */
jj_node *jp_parse_filters(parser *P, jj_node *n) {
    for (;;) {
        const jj_token *t = jp_peek(P);
        if (jp_is_op(t, "|")) {
            jp_next(P);
            const jj_token *name = jp_next(P);
            if (name->kind != TK_NAME) return jp_pfail(P, name, TANDEM_ERR_FORMAT, "expected a filter name after '|'"), NULL;
            jj_node *f = jp_node(P, E_FILTER, name);
            if (!f || !(f->str = jp_name_dup(P, name))) return NULL;
            if (!jj_is_filter(f->str))
                return jp_pfail(P, name, TANDEM_ERR_UNSUPPORTED, "unknown filter '%s'", f->str), NULL;
            f->a = n;
            if (jp_is_op(jp_peek(P), "(")) {
                jp_next(P);
                if (!jp_parse_args(P, f)) return NULL;
            }
            n = f;
        } else if (jp_is_kw(t, "is")) {
            jp_next(P);
            bool neg = false;
            if (jp_is_kw(jp_peek(P), "not")) {
                jp_next(P);
                neg = true;
            }
            const jj_token *name = jp_next(P);
            if (name->kind != TK_NAME) return jp_pfail(P, name, TANDEM_ERR_FORMAT, "expected a test name after 'is'"), NULL;
            jj_node *f = jp_node(P, E_TEST, name);
            if (!f || !(f->str = jp_name_dup(P, name))) return NULL;
            if (!jj_is_test(f->str)) return jp_pfail(P, name, TANDEM_ERR_UNSUPPORTED, "unknown test '%s'", f->str), NULL;
            f->a = n;
            f->op = neg ? OP_NOT : OP_NONE;
            if (jp_is_op(jp_peek(P), "(")) {
                jp_next(P);
                if (!jp_parse_args(P, f)) return NULL;
            } else if (starts_test_arg(jp_peek(P))) {
                jj_node *arg = parse_postfix(P, parse_primary(P));
                if (!arg) return NULL;
                if (!(f->list = jp_alloc(P, sizeof *f->list))) return NULL;
                f->list[0] = arg;
                f->n = 1;
            }
            n = f;
        } else if (jp_is_op(t, "(") && n->kind == E_FILTER) {
            jp_next(P);
            if (!(n = parse_call(P, n, t))) return NULL;
        } else {
            return n;
        }
    }
}

static jj_node *parse_unary(parser *P, bool with_filter) {
    if (!jp_enter(P)) return NULL;
    const jj_token *t = jp_peek(P);
    jj_node *n;
    if (jp_is_op(t, "-") || jp_is_op(t, "+")) {
        jp_next(P);
        if (!(n = jp_node(P, E_UNARY, t))) return NULL;
        n->op = t->p[0] == '-' ? OP_NEG : OP_POS;
        if (!(n->a = parse_unary(P, false))) return NULL;
    } else {
        n = parse_primary(P);
        if (n) n = parse_postfix(P, n);
    }
    if (n && with_filter) n = jp_parse_filters(P, n);
    P->depth--;
    return n;
}

static jj_node *binary(parser *P, const jj_token *at, jj_op op, jj_node *a, jj_node *b) {
    if (!a || !b) return NULL;
    jj_node *n = jp_node(P, E_BIN, at);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

/* The left-associative binary levels, loosest first; each operand is the next
 * level, the last level's operand a unary expression. */
typedef struct op_level {
    const char *text[4]; /* operators (or keywords) of the level */
    jj_op op[4];
    bool keyword;
} op_level;

enum { LVL_OR, LVL_AND, LVL_MATH1 = 2, LVL_CONCAT, LVL_MATH2, LVL_POW, LVL_N };

static const op_level levels[LVL_N] = {
    [LVL_OR] = {{"or"}, {OP_OR}, true},
    [LVL_AND] = {{"and"}, {OP_AND}, true},
    [LVL_MATH1] = {{"+", "-"}, {OP_ADD, OP_SUB}, false},
    [LVL_CONCAT] = {{"~"}, {OP_CONCAT}, false},
    [LVL_MATH2] = {{"*", "/", "//", "%"}, {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD}, false},
    [LVL_POW] = {{"**"}, {OP_POW}, false},
};

static jj_node *parse_not(parser *P);

static jj_node *parse_level(parser *P, int lv);

/* An operand of level lv: "and" takes "not" expressions, "**" unary ones, the others
 * the next level's. */
static jj_node *operand(parser *P, int lv) {
    return lv == LVL_AND ? parse_not(P) : lv == LVL_POW ? parse_unary(P, true) : parse_level(P, lv + 1);
}

static jj_node *parse_level(parser *P, int lv) {
    jj_node *n = operand(P, lv);
    for (;;) {
        const jj_token *t = jp_peek(P);
        jj_op op = OP_NONE;
        for (int i = 0; i < 4 && levels[lv].text[i] && op == OP_NONE; i++)
            if (levels[lv].keyword ? jp_is_kw(t, levels[lv].text[i]) : jp_is_op(t, levels[lv].text[i])) op = levels[lv].op[i];
        if (!n || op == OP_NONE) return n;
        jp_next(P);
        n = binary(P, t, op, n, operand(P, lv));
    }
}

/* a < b < c is (a < b) and (b < c), b evaluated twice (our values have no effects). */
static jj_node *parse_compare(parser *P) {
    jj_node *n = parse_level(P, LVL_MATH1), *last = n, *chain = NULL;
    for (;;) {
        const jj_token *t = jp_peek(P);
        jj_op op = jp_is_op(t, "==") ? OP_EQ : jp_is_op(t, "!=") ? OP_NE : jp_is_op(t, "<") ? OP_LT : jp_is_op(t, "<=") ? OP_LE
                 : jp_is_op(t, ">") ? OP_GT : jp_is_op(t, ">=") ? OP_GE : jp_is_kw(t, "in") ? OP_IN : OP_NONE;
        if (op == OP_NONE && jp_is_kw(t, "not") && jp_is_kw(jp_peek2(P), "in")) {
            jp_next(P);
            op = OP_NOTIN;
        }
        if (!last || op == OP_NONE) return chain ? chain : n;
        jp_next(P);
        jj_node *rhs = parse_level(P, LVL_MATH1);
        jj_node *cmp = binary(P, t, op, last, rhs);
        if (!cmp) return NULL;
        chain = chain ? binary(P, t, OP_AND, chain, cmp) : cmp;
        last = rhs;
    }
}

static jj_node *parse_not(parser *P) {
    if (jp_is_kw(jp_peek(P), "not")) {
        if (!jp_enter(P)) return NULL;
        const jj_token *t = jp_next(P);
        jj_node *n = jp_node(P, E_UNARY, t);
        if (!n || !(n->a = parse_not(P))) return NULL;
        n->op = OP_NOT;
        P->depth--;
        return n;
    }
    return parse_compare(P);
}

jj_node *jp_parse_or(parser *P) { return parse_level(P, LVL_OR); }

jj_node *jp_parse_expr(parser *P) {
    if (!jp_enter(P)) return NULL;
    jj_node *n = jp_parse_or(P);
    while (n && jp_is_kw(jp_peek(P), "if")) {
        const jj_token *t = jp_next(P);
        jj_node *c = jp_node(P, E_COND, t);
        if (!c) return NULL;
        c->a = n;
        if (!(c->b = jp_parse_or(P))) return NULL;
        if (jp_is_kw(jp_peek(P), "else")) {
            jp_next(P);
            if (!(c->c = jp_parse_expr(P))) return NULL;
        }
        n = c;
    }
    P->depth--;
    return n;
}

/* An expression, or several separated by commas as a tuple (for, set). */
jj_node *jp_parse_tuple(parser *P) {
    const jj_token *at = jp_peek(P);
    jj_node *first = jp_parse_expr(P);
    if (!first || !jp_is_op(jp_peek(P), ",")) return first;
    jj_node *n = jp_node(P, E_TUPLE, at);
    nvec items = {0};
    if (!n || !jp_nvec_push(P, &items, first)) return NULL;
    while (jp_is_op(jp_peek(P), ",")) {
        jp_next(P);
        if (jp_peek(P)->kind == TK_BLOCK_END) break;
        jj_node *x = jp_parse_expr(P);
        if (!x || !jp_nvec_push(P, &items, x)) return NULL;
    }
    n->list = items.v;
    n->n = items.n;
    return n;
}

