/* jj_parse.h - what the expression parser (parser.c) and the statement parser
 * (parse_stmt.c) share: the token cursor, node allocation, messages. */
#ifndef TDM_JJ_PARSE_H
#define TDM_JJ_PARSE_H

#include "jj_internal.h"

typedef struct parser {
    const jj_token *t;
    size_t n, i;
    jj_arena *a;
    tdm_err *err;
    int depth;
} parser;

typedef struct nvec {
    jj_node **v;
    size_t n, cap;
} nvec;

typedef struct svec {
    const char **v;
    size_t n, cap;
} svec;

/* "line L, column C: message" at token at; returns false. */
bool jp_pfail(parser *P, const jj_token *at, tandem_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
const jj_token *jp_peek(const parser *P);
const jj_token *jp_peek2(const parser *P);
const jj_token *jp_next(parser *P);
bool jp_tok_is(const jj_token *t, jj_tk kind, const char *text);
bool jp_is_op(const jj_token *t, const char *op);
bool jp_is_kw(const jj_token *t, const char *kw);
/* A short description of a token for messages (buf: scratch). */
const char *jp_describe(const jj_token *t, char buf[48]);
/* Consumes the next token if it is kind/text, else fails "expected WHAT, found ...". */
bool jp_expect(parser *P, jj_tk kind, const char *text, const char *what);
/* Arena memory (zeroed), NULL with the parse's memory message. */
void *jp_alloc(parser *P, size_t n);
jj_node *jp_node(parser *P, jj_kind kind, const jj_token *at);
char *jp_name_dup(parser *P, const jj_token *t);
bool jp_nvec_push(parser *P, nvec *a, jj_node *x);
bool jp_svec_push(parser *P, svec *a, const char *s);
/* One more level of nesting (the caller decrements P->depth on the way out);
 * false past TDM_JINJA_MAX_NESTING. */
bool jp_enter(parser *P);

/* parser.c: expressions */
jj_node *jp_parse_expr(parser *P);
jj_node *jp_parse_or(parser *P);   /* no conditional expression (a for's iterable) */
jj_node *jp_parse_tuple(parser *P); /* a, b, c as a tuple; one expression as itself */
/* The |filter and "is test" suffixes after n. */
jj_node *jp_parse_filters(parser *P, jj_node *n);
/* Call arguments after "(" into n (list, names + list2), through ")". */
bool jp_parse_args(parser *P, jj_node *n);

#endif
