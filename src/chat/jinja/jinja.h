/* jinja.h - a Jinja-subset template engine for chat templates.
 *
 * Renders the `tokenizer.chat_template` of real models as Python's jinja2 does with
 * the settings of HF transformers' apply_chat_template: trim_blocks, lstrip_blocks,
 * no autoescape, the loopcontrols extension ({% break %}, {% continue %}), the
 * {% generation %} block, the globals raise_exception(msg) and strftime_now(fmt),
 * and transformers' tojson (json.dumps with ensure_ascii=False).  One trailing
 * newline of the source is dropped and \r\n / \r become \n, as jinja2 does.
 *
 * Supported: {{ }}, {% if/elif/else %}, {% for %} (tuple targets, an `if` filter,
 * `else`, loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem,
 * loop.cycle), {% set %} (names, tuples, ns.attr, the block form), {% macro %} with
 * defaults, {% filter %}, {% raw %}, comments, whitespace control -/+ on every tag;
 * expressions with Python's precedence, literals (strings with Python escapes, ints,
 * floats, lists, tuples, dicts), subscripts and slices (strings by code point), the
 * str/dict/list methods templates call (strip, split, startswith, items, get, ...),
 * the common filters and tests (filters.c and methods.c list them).  Anything else is a
 * clear error naming the template line and column, never a wrong rendering.
 *
 * Values follow jinja2's default Undefined: a missing variable or member prints as
 * "", is false and iterates as empty; an operation on it (attribute, +) is an error.
 *
 * Untrusted templates and inputs are bounded: the source's size and the parse's
 * memory (TDM_JINJA_MAX_SOURCE, TDM_JINJA_MAX_PARSE_MEMORY), nesting depth of the
 * parse and of macro calls, and a render's output bytes, memory and evaluation steps
 * (tdm_jinja_limits).  Steps count nodes evaluated and loop iterations, and every
 * walk over data is charged to them (a step per 2 bytes searched or compared, per
 * byte case-mapped or escaped, per 64 bytes copied, per value or scope name visited;
 * searches are linear), so the step bound bounds a render's time: 50M steps take
 * about a second.  A template past a bound fails with a message saying which;
 * nothing aborts.  No global state: a parsed template is immutable and may be
 * rendered by several threads at once.
 */
#ifndef TDM_JINJA_H
#define TDM_JINJA_H

#include "common.h"
#include "json.h"

typedef struct tdm_jinja tdm_jinja;

typedef struct tdm_jinja_limits {
    size_t max_output;  /* bytes of rendered text at most; default 16 MiB */
    size_t max_memory;  /* bytes of values one render may allocate; default 256 MiB */
    uint64_t max_steps; /* evaluation steps (nodes, loop iterations, data walked); default 50M */
    int max_calls;      /* macro calls nested at most; default 64 */
    int64_t now;        /* the time strftime_now formats, seconds since the epoch, in UTC;
                           default -1 = the clock, in the local time zone */
} tdm_jinja_limits;

tdm_jinja_limits tdm_jinja_default_limits(void);

/* The deepest nesting of blocks and expressions a template may have. */
#define TDM_JINJA_MAX_NESTING 200
/* The largest template source, in bytes (real chat templates are under 64 KiB). */
#define TDM_JINJA_MAX_SOURCE ((size_t)1 << 20)
/* The most memory a parse may take (tokens and tree; ~10-50 bytes a byte of source). */
#define TDM_JINJA_MAX_PARSE_MEMORY ((size_t)64 << 20)

/* Parses src[0..len) (UTF-8; need not be NUL-terminated; copied).  On a syntax
 * error: TANDEM_ERR_FORMAT, err "line L, column C: problem"; a construct outside
 * the subset: TANDEM_ERR_UNSUPPORTED, the same form; a source longer than
 * TDM_JINJA_MAX_SOURCE, or one whose parse would take more than
 * TDM_JINJA_MAX_PARSE_MEMORY: TANDEM_ERR_NOMEM, saying which.  Messages escape the
 * control characters of the text they quote. */
tandem_status tdm_jinja_parse(const char *src, size_t len, tdm_jinja **out, tdm_err *err);
void tdm_jinja_free(tdm_jinja *t); /* NULL is a no-op */

/* msg with its control characters, other unprintable code points and bytes that are
 * not UTF-8 escaped as Python's repr writes them (\n, \x1b, \u202e), cut to fit
 * out[cap] at a whole character: for messages that quote a template's text or data. */
void tdm_jinja_escape(char *out, size_t cap, const char *msg);

/* One variable of a render: a JSON value (NULL: none), or a string when str is set. */
typedef struct tdm_jinja_var {
    const char *name;
    const tdm_json *json;
    const char *str; /* NUL-terminated; wins over json */
} tdm_jinja_var;

/* Renders with vars[n_vars] as the template's variables (a later one of the same
 * name wins).  JSON numbers written as integers become ints, others floats; JSON
 * objects keep their member order.  lim NULL: the defaults.  On success *out is the text (malloc'ed,
 * NUL-terminated; free()) and *out_len its length.  Errors: TANDEM_ERR_FORMAT for a
 * render error ("line L, column C: ..."; raise_exception's message is quoted in
 * it), TANDEM_ERR_UNSUPPORTED for an unsupported filter, test or method,
 * TANDEM_ERR_NOMEM past a limit or when an allocation fails. */
tandem_status tdm_jinja_render(const tdm_jinja *t, const tdm_jinja_var *vars, size_t n_vars,
                               const tdm_jinja_limits *lim, char **out, size_t *out_len, tdm_err *err);

#endif
