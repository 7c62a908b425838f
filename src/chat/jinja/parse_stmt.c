/* parse_stmt.c - the statements of a template: text, {{ }}, and the tags if / elif /
 * else, for (with else and an if filter), set (names, tuples, ns.attr, block form),
 * macro, call, filter, break / continue, generation; each body ends at its end tag,
 * an unclosed one is an error naming the tag that opened it. */
#include <string.h>

#include "jj_parse.h"

/* ------------------------------------------------------------- statements */

typedef struct ends {
    const char *const *names; /* the end tags that close this body */
    size_t n;
    const jj_token *open;     /* the tag that opened it (for "unclosed" messages) */
    const char *what;
} ends;

static bool parse_body(parser *P, nvec *body, const ends *e, const jj_token **end_kw, int loops);

static jj_node *body_node(parser *P, const jj_token *at, nvec *b) {
    jj_node *n = jp_node(P, S_BODY, at);
    if (!n) return NULL;
    n->list = b->v;
    n->n = b->n;
    return n;
}

static bool end_tag(parser *P) { return jp_expect(P, TK_BLOCK_END, NULL, "'%}'"); }

/* n's list from a body, list2 from another (may be NULL). */
static void set_lists(jj_node *n, const nvec *list, const nvec *list2) {
    n->list = list->v;
    n->n = list->n;
    if (list2) {
        n->list2 = list2->v;
        n->n2 = list2->n;
    }
}

/* (a, b=default, ...) through ")" after "(": the names, and the defaults (NULL for
 * none) when defs is given, else no defaults allowed. */
static bool parse_params(parser *P, svec *names, nvec *defs) {
    while (!jp_is_op(jp_peek(P), ")")) {
        if (names->n && !jp_expect(P, TK_OP, ",", "',' or ')'")) return false;
        const jj_token *p = jp_next(P);
        if (p->kind != TK_NAME) return jp_pfail(P, p, TANDEM_ERR_FORMAT, "expected a parameter name");
        jj_node *d = NULL;
        if (defs && jp_is_op(jp_peek(P), "=")) {
            jp_next(P);
            if (!(d = jp_parse_expr(P))) return false;
        } else if (defs && defs->n && defs->v[defs->n - 1]) {
            return jp_pfail(P, p, TANDEM_ERR_FORMAT, "a parameter without a default after one with a default");
        }
        if (!jp_svec_push(P, names, jp_name_dup(P, p)) || (defs && !jp_nvec_push(P, defs, d))) return false;
    }
    jp_next(P);
    return true;
}

/* if / elif chain: the condition is next; ends at elif, else or endif. */
static jj_node *parse_if(parser *P, const jj_token *kw, int loops) {
    static const char *const e1[] = {"elif", "else", "endif"}, *const e2[] = {"endif"};
    jj_node *n = jp_node(P, S_IF, kw);
    if (!n || !(n->a = jp_parse_expr(P)) || !end_tag(P)) return NULL;
    nvec then = {0}, other = {0};
    const jj_token *ek = NULL;
    ends e = {e1, 3, kw, "if"};
    if (!parse_body(P, &then, &e, &ek, loops)) return NULL;
    set_lists(n, &then, NULL);
    if (jp_is_kw(ek, "elif")) {
        jj_node *sub = parse_if(P, ek, loops);
        if (!sub || !jp_nvec_push(P, &other, sub)) return NULL;
    } else if (jp_is_kw(ek, "else")) {
        ends e_else = {e2, 1, kw, "if"};
        if (!end_tag(P) || !parse_body(P, &other, &e_else, &ek, loops) || !end_tag(P)) return NULL;
    } else if (!end_tag(P)) {
        return NULL;
    }
    n->list2 = other.v;
    n->n2 = other.n;
    return n;
}

/* Names of a for / set target: a, b or (a, b). */
static bool parse_targets(parser *P, svec *names) {
    bool paren = jp_is_op(jp_peek(P), "(");
    if (paren) jp_next(P);
    do {
        if (names->n) jp_next(P); /* the ',' */
        const jj_token *t = jp_next(P);
        if (t->kind != TK_NAME) {
            char b[48];
            return jp_pfail(P, t, TANDEM_ERR_FORMAT, "expected a variable name, found %s", jp_describe(t, b));
        }
        if (!jp_svec_push(P, names, jp_name_dup(P, t))) return false;
    } while (jp_is_op(jp_peek(P), ","));
    return !paren || jp_expect(P, TK_OP, ")", "')'");
}

static jj_node *parse_for(parser *P, const jj_token *kw, int loops) {
    static const char *const e1[] = {"else", "endfor"}, *const e2[] = {"endfor"};
    jj_node *n = jp_node(P, S_FOR, kw);
    svec names = {0};
    if (!n || !parse_targets(P, &names) || !jp_expect(P, TK_NAME, "in", "'in'")) return NULL;
    n->names = names.v;
    n->n_names = names.n;
    /* the iterable: no conditional expression (its "if" is the loop's filter) */
    if (!jp_enter(P) || !(n->a = jp_parse_or(P))) return NULL;
    P->depth--;
    if (jp_is_kw(jp_peek(P), "if")) {
        jp_next(P);
        if (!(n->b = jp_parse_expr(P))) return NULL;
    }
    if (jp_is_kw(jp_peek(P), "recursive"))
        return jp_pfail(P, jp_peek(P), TANDEM_ERR_UNSUPPORTED, "recursive loops are not supported"), NULL;
    if (!end_tag(P)) return NULL;
    nvec body = {0}, other = {0};
    const jj_token *ek = NULL;
    ends e = {e1, 2, kw, "for"};
    if (!parse_body(P, &body, &e, &ek, loops + 1)) return NULL;
    if (jp_is_kw(ek, "else")) {
        ends e_else = {e2, 1, kw, "for"};
        if (!end_tag(P) || !parse_body(P, &other, &e_else, &ek, loops)) return NULL;
    }
    if (!end_tag(P)) return NULL;
    set_lists(n, &body, &other);
    return n;
}

static jj_node *parse_set(parser *P, const jj_token *kw, int loops) {
    static const char *const e1[] = {"endset"};
    const jj_token *first = jp_peek(P);
    if (first->kind == TK_NAME && jp_is_op(jp_peek2(P), ".")) { /* ns.attr = value */
        jj_node *n = jp_node(P, S_SET_ATTR, kw);
        if (!n || !(n->str = jp_name_dup(P, jp_next(P)))) return NULL;
        jp_next(P);
        const jj_token *attr = jp_next(P);
        svec names = {0};
        if (attr->kind != TK_NAME) return jp_pfail(P, attr, TANDEM_ERR_FORMAT, "expected an attribute name"), NULL;
        if (!jp_svec_push(P, &names, jp_name_dup(P, attr)) || !jp_expect(P, TK_OP, "=", "'='")) return NULL;
        n->names = names.v;
        n->n_names = 1;
        if (!(n->a = jp_parse_tuple(P)) || !end_tag(P)) return NULL;
        return n;
    }
    svec names = {0};
    if (!parse_targets(P, &names)) return NULL;
    if (jp_is_op(jp_peek(P), "=")) {
        jp_next(P);
        jj_node *n = jp_node(P, S_SET, kw);
        if (!n || !(n->a = jp_parse_tuple(P)) || !end_tag(P)) return NULL;
        n->names = names.v;
        n->n_names = names.n;
        return n;
    }
    if (names.n != 1 || jp_peek(P)->kind != TK_BLOCK_END)
        return jp_expect(P, TK_OP, "=", "'=' or '%}'"), NULL;
    jp_next(P);
    jj_node *n = jp_node(P, S_SET_BLOCK, kw);
    nvec body = {0};
    const jj_token *ek = NULL;
    ends e = {e1, 1, kw, "set"};
    if (!n || !parse_body(P, &body, &e, &ek, loops) || !end_tag(P)) return NULL;
    n->names = names.v;
    n->n_names = 1;
    n->list = body.v;
    n->n = body.n;
    return n;
}

static jj_node *parse_macro(parser *P, const jj_token *kw) {
    static const char *const e1[] = {"endmacro"};
    jj_node *n = jp_node(P, S_MACRO, kw);
    const jj_token *name = jp_next(P);
    if (!n || name->kind != TK_NAME) return jp_pfail(P, name, TANDEM_ERR_FORMAT, "expected a macro name"), NULL;
    if (!(n->str = jp_name_dup(P, name)) || !jp_expect(P, TK_OP, "(", "'('")) return NULL;
    svec params = {0};
    nvec defs = {0};
    if (!parse_params(P, &params, &defs)) return NULL;
    nvec body = {0};
    const jj_token *ek = NULL;
    ends e = {e1, 1, kw, "macro"};
    if (!end_tag(P) || !parse_body(P, &body, &e, &ek, 0) || !end_tag(P)) return NULL;
    n->names = params.v;
    n->n_names = params.n;
    set_lists(n, &body, &defs);
    return n;
}

/* {% filter name(args) | more %}...{% endfilter %} */
static jj_node *parse_filter_block(parser *P, const jj_token *kw, int loops) {
    static const char *const e1[] = {"endfilter"};
    jj_node *in = jp_node(P, E_BLOCK_INPUT, kw), *n = jp_node(P, S_FILTER_BLOCK, kw);
    const jj_token *name = jp_next(P);
    if (!in || !n) return NULL;
    if (name->kind != TK_NAME) return jp_pfail(P, name, TANDEM_ERR_FORMAT, "expected a filter name"), NULL;
    jj_node *f = jp_node(P, E_FILTER, name);
    if (!f || !(f->str = jp_name_dup(P, name))) return NULL;
    if (!jj_is_filter(f->str)) return jp_pfail(P, name, TANDEM_ERR_UNSUPPORTED, "unknown filter '%s'", f->str), NULL;
    f->a = in;
    if (jp_is_op(jp_peek(P), "(")) {
        jp_next(P);
        if (!jp_parse_args(P, f)) return NULL;
    }
    if (!(n->a = jp_parse_filters(P, f)) || !end_tag(P)) return NULL;
    nvec body = {0};
    const jj_token *ek = NULL;
    ends e = {e1, 1, kw, "filter"};
    if (!parse_body(P, &body, &e, &ek, loops) || !end_tag(P)) return NULL;
    n->list = body.v;
    n->n = body.n;
    return n;
}

/* {% call [(params)] macro(args) %}...{% endcall %} */
static jj_node *parse_call_block(parser *P, const jj_token *kw, int loops) {
    static const char *const e1[] = {"endcall"};
    jj_node *n = jp_node(P, S_CALL_BLOCK, kw);
    svec params = {0};
    if (!n) return NULL;
    if (jp_is_op(jp_peek(P), "(")) {
        jp_next(P);
        if (!parse_params(P, &params, NULL)) return NULL;
    }
    if (!(n->a = jp_parse_expr(P))) return NULL;
    if (n->a->kind != E_CALL) return jp_pfail(P, kw, TANDEM_ERR_FORMAT, "{%% call %%} needs a macro call"), NULL;
    nvec body = {0};
    const jj_token *ek = NULL;
    ends e = {e1, 1, kw, "call"};
    if (!end_tag(P) || !parse_body(P, &body, &e, &ek, 0) || !end_tag(P)) return NULL;
    (void)loops;
    n->names = params.v;
    n->n_names = params.n;
    set_lists(n, &body, NULL);
    return n;
}

/* One {% ... %} statement, the keyword next. */
static jj_node *parse_stmt(parser *P, int loops) {
    const jj_token *kw = jp_next(P);
    if (kw->kind != TK_NAME) {
        char b[48];
        return jp_pfail(P, kw, TANDEM_ERR_FORMAT, "expected a tag name after '{%%', found %s", jp_describe(kw, b)), NULL;
    }
    if (jp_is_kw(kw, "if")) return parse_if(P, kw, loops);
    if (jp_is_kw(kw, "for")) return parse_for(P, kw, loops);
    if (jp_is_kw(kw, "set")) return parse_set(P, kw, loops);
    if (jp_is_kw(kw, "macro")) return parse_macro(P, kw);
    if (jp_is_kw(kw, "filter")) return parse_filter_block(P, kw, loops);
    if (jp_is_kw(kw, "call")) return parse_call_block(P, kw, loops);
    if (jp_is_kw(kw, "break") || jp_is_kw(kw, "continue")) {
        if (!loops) return jp_pfail(P, kw, TANDEM_ERR_FORMAT, "'%.*s' outside a loop", (int)kw->n, kw->p), NULL;
        jj_node *n = jp_node(P, kw->p[0] == 'b' ? S_BREAK : S_CONTINUE, kw);
        return n && end_tag(P) ? n : NULL;
    }
    if (jp_is_kw(kw, "generation")) { /* transformers' assistant-mask block: renders its body */
        static const char *const e1[] = {"endgeneration"};
        nvec body = {0};
        const jj_token *ek = NULL;
        ends e = {e1, 1, kw, "generation"};
        if (!end_tag(P) || !parse_body(P, &body, &e, &ek, loops) || !end_tag(P)) return NULL;
        return body_node(P, kw, &body);
    }
    static const char *const unsupported[] = {"include", "import", "from", "extends", "block", "with",
                                              "autoescape", "do"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(unsupported); i++)
        if (jp_is_kw(kw, unsupported[i]))
            return jp_pfail(P, kw, TANDEM_ERR_UNSUPPORTED, "the '%s' tag is not supported", unsupported[i]), NULL;
    return jp_pfail(P, kw, TANDEM_ERR_FORMAT, "unknown tag '%.*s'", (int)TDM_MIN(kw->n, 40), kw->p), NULL;
}

/* Statements and text up to one of e's end tags (its keyword consumed and returned
 * in *end_kw, the rest of that tag left to the caller) or the end (e NULL). */
static bool parse_body(parser *P, nvec *body, const ends *e, const jj_token **end_kw, int loops) {
    if (!jp_enter(P)) return false;
    for (;;) {
        const jj_token *t = jp_peek(P);
        jj_node *n = NULL;
        if (t->kind == TK_EOF) {
            if (!e) break;
            return jp_pfail(P, e->open, TANDEM_ERR_FORMAT, "unclosed '%s': expected '{%% %s %%}' before the end", e->what,
                         e->names[e->n - 1]);
        } else if (t->kind == TK_DATA) {
            jp_next(P);
            if (!(n = jp_node(P, S_DATA, t))) return false;
            n->str = t->p;
            n->len = t->n;
        } else if (t->kind == TK_VAR_BEGIN) {
            jp_next(P);
            if (!(n = jp_node(P, S_OUT, t)) || !(n->a = jp_parse_tuple(P)) || !jp_expect(P, TK_VAR_END, NULL, "'}}'")) return false;
        } else if (t->kind == TK_BLOCK_BEGIN) {
            const jj_token *kw = jp_peek2(P);
            for (size_t i = 0; e && i < e->n; i++)
                if (jp_is_kw(kw, e->names[i])) {
                    jp_next(P);
                    *end_kw = jp_next(P);
                    P->depth--;
                    return true;
                }
            if (kw->kind == TK_NAME && kw->n > 3 && memcmp(kw->p, "end", 3) == 0)
                return jp_pfail(P, kw, TANDEM_ERR_FORMAT, "unexpected '%.*s'%s%s", (int)TDM_MIN(kw->n, 40), kw->p,
                             e ? ": the open tag is " : "", e ? e->what : "");
            if (jp_is_kw(kw, "elif") || jp_is_kw(kw, "else"))
                return jp_pfail(P, kw, TANDEM_ERR_FORMAT, "unexpected '%.*s'", (int)kw->n, kw->p);
            jp_next(P);
            if (!(n = parse_stmt(P, loops))) return false;
        } else {
            char b[48];
            return jp_pfail(P, t, TANDEM_ERR_FORMAT, "unexpected %s", jp_describe(t, b));
        }
        if (!jp_nvec_push(P, body, n)) return false;
    }
    P->depth--;
    return true;
}

bool jj_parse(const jj_token *toks, size_t n, jj_arena *a, jj_node **out, tdm_err *err) {
    parser P = {.t = toks, .n = n, .a = a, .err = err};
    nvec body = {0};
    if (!parse_body(&P, &body, NULL, NULL, 0)) return false;
    return (*out = body_node(&P, &toks[0], &body)) != NULL;
}
