/* jj_internal.h - the parts of the Jinja engine (jinja.h) and how they meet:
 *
 *   lexer.c    source -> tokens (data, tag delimiters, names, literals, operators),
 *              whitespace control applied as jinja2's lexer does
 *   parser.c   tokens -> a tree of jj_node (statements and expressions)
 *   value.c    values, the arena they live in, conversion to text (str, repr, JSON),
 *              comparison, truth
 *   eval.c     the renderer: statements, scopes, expressions, calls, macros
 *   ops.c      the binary operators (arithmetic, ~, comparisons, in)
 *   strings.c  Python's str operations (strip, split, replace, case)
 *   filters.c  filters
 *   tests.c    tests, and the argument helpers of filters, tests and methods
 *   methods.c  methods of str/dict/loop, global functions (range, namespace, ...)
 *
 * Memory: everything a parse or a render allocates comes from one arena (jj_arena)
 * freed at once; a render's arena has a byte limit.  Errors: functions return false
 * (or NULL) after setting the context's error with the node's line and column.
 *
 * Work: a render counts steps (nodes evaluated, loop iterations) and charges every
 * walk over data to the same count (jj_work), so that the step bound bounds the time
 * of any template: a step is about the time of one node, and every loop over bytes,
 * list items, dict keys or scope names pays in proportion to what it visits.  The
 * searches are linear (jj_s_find, jj_s_rfind).  A function that cannot report an
 * error (equality, lookups) stops its walk once the bound is passed; the error it
 * leaves set fails the render.
 */
#ifndef TDM_JJ_INTERNAL_H
#define TDM_JJ_INTERNAL_H

#include <stdarg.h>

#include "jinja.h"

/* ------------------------------------------------------------------ arena */

typedef struct jj_chunk jj_chunk;
typedef struct jj_arena {
    jj_chunk *head;
    size_t used;  /* bytes handed out plus chunk overhead */
    size_t limit; /* 0 = none */
} jj_arena;

/* n bytes aligned to 16 (zeroed), NULL when the limit or malloc refuses. */
void *jj_arena_alloc(jj_arena *a, size_t n);
void jj_arena_free(jj_arena *a);

/* ----------------------------------------------------------------- tokens */

typedef enum jj_tk {
    TK_EOF,
    TK_DATA,        /* text between tags (p, n: after whitespace control) */
    TK_VAR_BEGIN,   /* {{ */
    TK_VAR_END,     /* }} */
    TK_BLOCK_BEGIN, /* {% */
    TK_BLOCK_END,   /* %} */
    TK_NAME,
    TK_STRING,      /* p, n: the decoded value (arena) */
    TK_INT,
    TK_FLOAT,
    TK_OP,          /* p, n: the operator's text */
} jj_tk;

typedef struct jj_token {
    jj_tk kind;
    int line, col;
    const char *p;
    size_t n;
    union {
        int64_t i;
        double f;
    };
} jj_token;

/* Tokenizes src (already normalized: \n newlines, no trailing newline) into *out
 * (malloc'ed; free()) and decoded strings from a, which the parse no longer needs once
 * the tree is built; the DATA and NAME tokens point into src.  {% raw %} bodies become
 * DATA.  The tokens and strings together stay within a->limit: on return a->limit is
 * lowered by the tokens' bytes (a->limit - a->used is what they leave of it).  false
 * with err set. */
bool jj_lex(const char *src, size_t len, jj_arena *a, jj_token **out, size_t *n_out, tdm_err *err);
/* Sets err for an allocation of the parse that failed (its arena's limit is
 * TDM_JINJA_MAX_PARSE_MEMORY); returns false. */
bool jj_parse_nomem(tdm_err *err);

/* ----------------------------------------------------------------- values */

typedef enum jj_type {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT,
    JV_NS,    /* namespace(): a dict whose members `set ns.x = ...` changes */
    JV_LOOP,  /* the loop variable of a for */
    JV_MACRO, /* a {% macro %} */
    JV_FUNC,  /* a global function (jj_func) */
    JV_CALLER, /* caller() inside a macro called by {% call %}: the call block's body */
} jj_type;

typedef struct jj_str {
    size_t len;
    char s[]; /* [len] bytes + NUL */
} jj_str;

typedef struct jj_val jj_val;
typedef struct jj_list jj_list;
typedef struct jj_dict jj_dict;
typedef struct jj_loop jj_loop;
typedef struct jj_node jj_node;
typedef struct jj_caller jj_caller;

struct jj_val {
    uint8_t t; /* jj_type */
    union {
        bool b;
        int64_t i;
        double f;
        const jj_str *s;
        jj_list *l;
        jj_dict *d;      /* DICT, NS */
        jj_loop *loop;
        const jj_node *macro;
        const jj_caller *caller;
        int fn;          /* jj_func */
        const char *name; /* UNDEF: what was missing (for messages), may be NULL */
    } u;
};

struct jj_list {
    size_t n, cap;
    jj_val *v;
    bool tuple; /* written (a, b): repr uses () */
};

struct jj_dict { /* ordered; keys are mostly strings */
    size_t n, cap;
    jj_val *k, *v;
};

struct jj_loop {
    int64_t index0, length;
    const jj_list *items;
};

typedef enum jj_func {
    FN_RANGE, FN_NAMESPACE, FN_DICT, FN_RAISE, FN_STRFTIME,
} jj_func;

static inline jj_val jv_undef(const char *name) { jj_val v = {.t = JV_UNDEF}; v.u.name = name; return v; }
static inline jj_val jv_none(void) { jj_val v = {.t = JV_NONE}; return v; }
static inline jj_val jv_bool(bool b) { jj_val v = {.t = JV_BOOL}; v.u.b = b; return v; }
static inline jj_val jv_int(int64_t i) { jj_val v = {.t = JV_INT}; v.u.i = i; return v; }
static inline jj_val jv_float(double f) { jj_val v = {.t = JV_FLOAT}; v.u.f = f; return v; }
static inline jj_val jv_str(const jj_str *s) { jj_val v = {.t = JV_STR}; v.u.s = s; return v; }
static inline jj_val jv_list(jj_list *l) { jj_val v = {.t = JV_LIST}; v.u.l = l; return v; }
static inline jj_val jv_dict(jj_dict *d) { jj_val v = {.t = JV_DICT}; v.u.d = d; return v; }

/* Python's type name of a value ("str", "int", "list", "dict", "NoneType"...). */
const char *jv_type_name(jj_val v);

/* -------------------------------------------------------------- the tree */

typedef enum jj_kind {
    /* statements */
    S_DATA, S_OUT, S_IF, S_FOR, S_SET, S_SET_ATTR, S_SET_BLOCK, S_MACRO, S_FILTER_BLOCK, S_CALL_BLOCK,
    S_BREAK, S_CONTINUE, S_BODY,
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST, E_UNARY, E_BIN,
    E_COND, E_LIST, E_TUPLE, E_DICT, E_BLOCK_INPUT, /* the body text of a filter block */
} jj_kind;

typedef enum jj_op {
    OP_NONE, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
    OP_AND, OP_OR, OP_NOT, OP_NEG, OP_POS, OP_IN, OP_NOTIN,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE,
} jj_op;

/* One node; which fields a kind uses:
 *   S_DATA str/len;  S_OUT a;  S_BODY list
 *   S_IF a (condition), list (then), list2 (else)
 *   S_FOR names[n_names] (targets), a (iterable), b (if-filter or NULL), list (body),
 *         list2 (else)
 *   S_SET names[n_names] (targets; >1: unpack), a;  S_SET_ATTR str (object), names[0], a
 *   S_SET_BLOCK names[0], list;  S_FILTER_BLOCK a (filters over E_BLOCK_INPUT), list
 *   S_MACRO str (name), names[n_names] (parameters), list2[n_names] (defaults, NULL
 *         entries for none), list (body)
 *   S_CALL_BLOCK a (the E_CALL of the macro), names[n_names] (caller's parameters),
 *         list (the body caller() renders)
 *   E_LIT lit;  E_NAME str;  E_ATTR a, str;  E_ITEM a, b;  E_SLICE a, b, c, d (NULL: omitted)
 *   E_CALL a (callee), list (arguments), names[n_names] + list2 (keyword arguments)
 *   E_FILTER / E_TEST a (input), str (name), list, names + list2 as for calls;
 *         E_TEST op = OP_NOT when negated
 *   E_UNARY op, a;  E_BIN op, a, b;  E_COND a (value), b (condition), c (else or NULL)
 *   E_LIST / E_TUPLE list;  E_DICT list (keys), list2 (values) */
struct jj_node {
    uint8_t kind, op;
    int line, col;
    jj_node *a, *b;
    union { /* E_LIT's value; c, d for the kinds that use them (none uses both) */
        struct {
            jj_node *c, *d;
        };
        jj_val lit;
    };
    jj_node **list, **list2;
    size_t n, n2;
    const char **names;
    size_t n_names;
    const char *str;
    size_t len;
};

/* Parses the tokens into the body of the template (S_BODY). */
bool jj_parse(const jj_token *toks, size_t n, jj_arena *a, jj_node **out, tdm_err *err);

/* --------------------------------------------------------------- renderer */

typedef struct jj_frame jj_frame;

typedef struct jj_buf {
    char *p; /* malloc'ed */
    size_t n, cap;
} jj_buf;

typedef struct jj_ctx {
    tdm_err *err;
    jj_arena arena;
    tdm_jinja_limits lim;
    uint64_t steps;
    uint64_t work;        /* work charged short of a whole step, in 1/JJ_STEP steps */
    int calls;            /* macro calls in progress */
    jj_buf *out;          /* where text goes (the result, or a capture) */
    jj_frame *globals;    /* the template's variables */
    jj_frame *cur;        /* innermost scope */
    int jump;             /* 1 after {% break %}, 2 after {% continue %}, until the loop sees it */
    int depth;            /* evaluations nested now */
    const jj_str *block_input; /* the body text of the {% filter %} block being applied */
    const jj_node *at;    /* the node being evaluated, for messages without one */
} jj_ctx;

/* Sets the error "line L, column C: <message>" from node n (or c->at); returns false. */
bool jj_fail(jj_ctx *c, const jj_node *n, tandem_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
/* Arena allocation that fails with "the template needs more than N MiB of memory"
 * (the bytes are charged as copied). */
void *jj_alloc(jj_ctx *c, size_t n);

/* Work charged per unit, in 1/JJ_STEP of a step: a byte allocated, copied or written;
 * a byte searched, compared or decoded; a value visited (a list item, a dict key, a
 * name in a scope).  Measured: a step is ~16 ns of CPU, a search ~3 ns a byte. */
#define JJ_STEP 64
#define JJ_COPY 1
#define JJ_SCAN 32
#define JJ_ITEM 64
/* Charges n units of cost (JJ_COPY, JJ_SCAN, JJ_ITEM); false with "the template ran
 * more than N steps" once the step bound is passed (and on every call after). */
bool jj_work(jj_ctx *c, uint64_t n, unsigned cost);
/* Whether the step bound has been passed (its error is set). */
static inline bool jj_over(const jj_ctx *c) { return c->steps > c->lim.max_steps; }

/* value.c: construction (NULL / false on failure, error set) */
const jj_str *jj_str_new(jj_ctx *c, const char *s, size_t n);
jj_str *jj_str_alloc(jj_ctx *c, size_t n); /* n bytes to fill, NUL-terminated */
jj_list *jj_list_new(jj_ctx *c, size_t cap);
bool jj_list_push(jj_ctx *c, jj_list *l, jj_val v);
jj_dict *jj_dict_new(jj_ctx *c, size_t cap);
/* Sets key (replacing an equal key's value). */
bool jj_dict_set(jj_ctx *c, jj_dict *d, jj_val k, jj_val v);
/* The value of a string key, or NULL (also past the step bound). */
jj_val *jj_dict_get(jj_ctx *c, const jj_dict *d, const char *key, size_t len);
jj_val *jj_dict_find(jj_ctx *c, const jj_dict *d, jj_val key);
/* A JSON value as a jinja value. */
bool jj_from_json(jj_ctx *c, const tdm_json *j, jj_val *out);

/* value.c: text.  Appends to b (malloc'ed; false on allocation failure or past
 * c->lim.max_output, error set). */
bool jj_buf_add(jj_ctx *c, jj_buf *b, const char *s, size_t n);
/* str(v) as jinja2 prints it: strings as they are, None, True, 1.5, lists as repr. */
bool jj_buf_str(jj_ctx *c, jj_buf *b, jj_val v);
bool jj_buf_repr(jj_ctx *c, jj_buf *b, jj_val v);
/* json.dumps(v, ensure_ascii, indent (<0: none), separators, sort_keys). */
bool jj_buf_json(jj_ctx *c, jj_buf *b, jj_val v, bool ensure_ascii, int indent, const char *item_sep,
                 const char *key_sep, bool sort_keys, int depth);
/* str(v) as a new string value. */
bool jj_to_str(jj_ctx *c, jj_val v, jj_val *out);

/* value.c: semantics */
bool jj_truthy(jj_val v);
/* a == b (false past the step bound). */
bool jj_equal(jj_ctx *c, jj_val a, jj_val b);
/* Python ordering: false with an error for types that do not compare. */
bool jj_compare(jj_ctx *c, const jj_node *n, jj_val a, jj_val b, int *cmp);
/* Code points of a UTF-8 string (bytes that are not valid UTF-8 count one each). */
size_t jj_utf8_len(jj_ctx *c, const char *s, size_t n);
/* Byte offset of code point i (the end when i is past it). */
size_t jj_utf8_offset(jj_ctx *c, const char *s, size_t n, size_t i);
/* Iteration: a list's items, a dict's keys, a string's characters, undefined: none.
 * false with an error for a value that does not iterate. */
bool jj_iter_list(jj_ctx *c, const jj_node *n, jj_val v, const jj_list **out);
/* The length of a str, list, dict; false otherwise. */
bool jj_length(jj_ctx *c, jj_val v, int64_t *out);

/* ops.c: a op b for the arithmetic, comparison, ~ and in operators of n->op. */
bool jj_eval_binary(jj_ctx *c, const jj_node *n, jj_val a, jj_val b, jj_val *out);

/* eval.c */
bool jj_eval(jj_ctx *c, const jj_node *n, jj_val *out);
/* Calls a macro (or a caller) with positional and keyword arguments; the rendered
 * text.  caller: what caller() renders inside the macro (NULL: none). */
bool jj_call_macro(jj_ctx *c, const jj_node *at, jj_val macro, const jj_val *args, size_t n_args,
                   const char **kw_names, const jj_val *kw_vals, size_t n_kw, const jj_caller *caller, jj_val *out);
/* obj.name as templates read it: a dict's member, a loop's field, else undefined;
 * an error on an undefined obj. */
bool jj_get_attr(jj_ctx *c, const jj_node *n, jj_val obj, const char *name, jj_val *out);
/* Looks a name up through the scopes (then the global functions). */
jj_val jj_lookup(jj_ctx *c, const char *name);

/* strings.c: Python's str operations (results may share s when unchanged). */
typedef enum jj_case { JJ_UPPER, JJ_LOWER, JJ_CAPITALIZE, JJ_TITLE /* jinja2's filter */, JJ_PYTITLE /* str.title */ } jj_case;
bool jj_is_space(uint32_t cp); /* str.isspace */
const jj_str *jj_s_strip(jj_ctx *c, const jj_str *s, const jj_str *chars, bool left, bool right);
const jj_str *jj_s_case(jj_ctx *c, const jj_str *s, jj_case mode);
const jj_str *jj_s_replace(jj_ctx *c, const jj_str *s, const jj_str *old, const jj_str *new_, int64_t count);
/* The first occurrence of sub in s[from..n) / the last one in s[0..end): its byte
 * offset, or SIZE_MAX when there is none (also past the step bound); linear in
 * the bytes scanned, which are charged. */
size_t jj_s_find(jj_ctx *c, const char *s, size_t n, size_t from, const jj_str *sub);
size_t jj_s_rfind(jj_ctx *c, const char *s, size_t end, const jj_str *sub);
/* sep NULL: whitespace; maxsplit < 0: no limit. */
jj_list *jj_s_split(jj_ctx *c, const jj_str *s, const jj_str *sep, int64_t maxsplit, bool from_right);
jj_list *jj_s_splitlines(jj_ctx *c, const jj_str *s, bool keepends);

/* filters.c, tests.c, methods.c: each receives the evaluated input and arguments. */
typedef struct jj_args {
    const jj_val *pos;
    size_t n_pos;
    const char **kw;
    const jj_val *kwv;
    size_t n_kw;
} jj_args;

/* Argument i, or the keyword argument name (NULL: positional only); false when absent. */
bool jj_arg(const jj_args *a, size_t i, const char *name, jj_val *out);
/* The same as an int (def when absent or None) / a string (NULL when absent or None);
 * false with an error for another type. */
bool jj_arg_int(jj_ctx *c, const jj_node *n, const jj_args *a, size_t i, const char *name, int64_t def, int64_t *out);
bool jj_arg_str(jj_ctx *c, const jj_node *n, const jj_args *a, size_t i, const char *name, const jj_str **out);
/* str(v). */
bool jj_str_of(jj_ctx *c, jj_val v, const jj_str **out);

bool jj_filter(jj_ctx *c, const jj_node *n, const char *name, jj_val in, const jj_args *a, jj_val *out);
bool jj_test(jj_ctx *c, const jj_node *n, const char *name, jj_val in, const jj_args *a, bool *out);
/* obj.name(args): true with *handled = false when obj has no such method. */
bool jj_method(jj_ctx *c, const jj_node *n, jj_val obj, const char *name, const jj_args *a, jj_val *out,
               bool *handled);
bool jj_call_func(jj_ctx *c, const jj_node *n, jj_val fn, const jj_args *a, jj_val *out);
/* Whether a test name exists (the parser checks names as jinja2 does at compile time). */
bool jj_is_test(const char *name);
bool jj_is_filter(const char *name);
/* The global function of a name, or -1. */
int jj_global_func(const char *name);

#endif
