/* tool_calls.h - a model's output text parsed into OpenAI tool calls.
 *
 * Chat templates that take tools teach the model a format for its calls; the output
 * is parsed back in that format (the format is the template's: tdm_tool_format_detect
 * reads it from the template's own rendering of an assistant turn with a call):
 *   hermes   Qwen 2.5 / 3, Hermes 2 / 3: one block per call, several in a row for
 *            parallel calls, text around them allowed:
 *            <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
 *            (a last block whose closing tag is missing at the end of the text counts
 *            when its JSON is whole: generation may stop at EOS right after it);
 *            without any <tool_call>, an output that is only call objects, bare or
 *            in one ```json fence, each naming one of the tools offered, is calls
 *            too (as llama.cpp's Hermes parser: Qwen 2.5 Coder writes them so)
 *   llama3   Llama 3.1+: the output is the call(s) alone, optionally after
 *            <|python_tag|>, separated by ';' or whitespace:
 *            {"name": "f", "parameters": {...}}
 *   mistral  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] (v3), or
 *            [TOOL_CALLS]f[ARGS]{...} repeated (v11+); text before allowed.
 * A call object has a non-empty string "name" and its arguments as "arguments" or
 * "parameters": an object, or a string holding a JSON object (absent: {}).  Output
 * in which any call marker's block does not parse is text, whole: never a
 * half-parsed call.
 */
#ifndef TDM_TOOL_CALLS_H
#define TDM_TOOL_CALLS_H

#include <stddef.h>

#include "common.h"

typedef enum tdm_tool_format {
    TDM_TOOL_FORMAT_NONE = 0, /* no calls parsed: the text is content */
    TDM_TOOL_FORMAT_HERMES,
    TDM_TOOL_FORMAT_LLAMA3,
    TDM_TOOL_FORMAT_MISTRAL,
} tdm_tool_format;

/* The marker texts of format f ("<tool_call>", "</tool_call>"; "<|python_tag|>";
 * "[TOOL_CALLS]", "[ARGS]"): *out points to a static array; returns their count (at
 * most TDM_TOOL_MARKERS_MAX).  A vocabulary may have them as control tokens, which
 * decode to nothing: whoever builds the text to parse puts their text back. */
#define TDM_TOOL_MARKERS_MAX 2
size_t tdm_tool_format_markers(tdm_tool_format f, const char *const **out);

/* "none", "hermes", "llama3", "mistral" */
const char *tdm_tool_format_name(tdm_tool_format f);

/* The format a template uses, from its rendering of tdm_tool_probe_json (a
 * conversation with a tool and an assistant call of it): the call's rendering names
 * it ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>" or a bare {"name": ...} object
 * with "parameters").  NONE when the template rendered no call. */
tdm_tool_format tdm_tool_format_detect(const char *rendered, size_t len);

/* {"messages": [...], "tools": [...]}: the probe conversation for tdm_tool_format_detect. */
extern const char tdm_tool_probe_json[];

/* ---- reasoning (Qwen3 style) ----
 * A template that renders an assistant message's reasoning_content between <think> and
 * </think> marks reasoning: tdm_think_detect says so from its rendering of
 * tdm_think_probe_json.  Then an output that begins (after whitespace) with <think>
 * holds its reasoning up to </think> (to the end when </think> never comes) and its
 * content after it, both without the whitespace around them.  (An output whose
 * <think> the template put in the prompt, as DeepSeek-R1's does, is not split.) */
extern const char tdm_think_probe_json[];
bool tdm_think_detect(const char *rendered, size_t len);

typedef struct tdm_think_split {
    bool decided;       /* false: the text so far may still begin <think> */
    bool has;           /* the output begins with <think> */
    size_t reason_at, reason_len; /* the reasoning, text[reason_at..+reason_len) */
    size_t content_at;  /* the content begins here (len when there is none yet) */
    size_t reason_safe; /* streaming: the reasoning up to here (from reason_at) can be
                           sent now: before a tail that may begin </think> and before
                           trailing whitespace */
} tdm_think_split;

/* Splits s[0..len): the whole output (whole: always decided), or a stream's text so far. */
tdm_think_split tdm_think_split_text(const char *s, size_t len, bool whole);

typedef struct tdm_tool_call {
    char *name;      /* NUL-terminated */
    char *arguments; /* a JSON object's text, NUL-terminated */
} tdm_tool_call;

typedef struct tdm_tool_parse {
    char *content;        /* the text outside the calls, NUL-terminated; NULL when
                             there is none (only whitespace) and calls were found */
    tdm_tool_call *calls; /* [n_calls] in order */
    size_t n_calls;
} tdm_tool_parse;

/* Parses text[0..len) in format f into *out (names[n_names]: the tools offered, for
 * the hermes format's bare calls; n_names 0: none accepted) (free with tdm_tool_parse_free).  Without
 * a call (or when a call block does not parse) *out holds the whole text as content
 * and no call.  The content around calls: the pieces of text outside them, with the
 * whitespace next to a call removed, joined.  Fails only out of memory
 * (TANDEM_ERR_NOMEM; *out empty). */
tandem_status tdm_tool_calls_parse(tdm_tool_format f, const char *text, size_t len, const char *const *names,
                                   size_t n_names, tdm_tool_parse *out);
void tdm_tool_parse_free(tdm_tool_parse *p);

/* Streaming: of the text generated so far, text[0..len), how many leading bytes can
 * go out as content now.  It stops before the first call marker, before a tail that
 * may be the start of one, and before trailing whitespace (which belongs to no
 * content when a call follows).  What it allows is always a prefix of the content
 * that tdm_tool_calls_parse gives for any continuation of the text.  NONE: len. */
size_t tdm_tool_calls_stream_safe(tdm_tool_format f, const char *text, size_t len);

/* tool_grammar.c: GBNF text (*out malloc'ed) that admits only tool calls in format f
 * (tool_choice "required" or a named function): calls of the tools names[n] whose
 * arguments follow params[i] (a JSON schema's text, as json_schema.h compiles it;
 * NULL: any object), of tool `only` alone when only >= 0; one call, or with parallel
 * several (hermes: blocks on lines of their own; llama3: separated by "; ").
 * TANDEM_ERR_UNSUPPORTED for the mistral format (its [TOOL_CALLS] marker is a control
 * token, which no grammar writes) and for a schema json_schema.h refuses (the message
 * names the keyword and its path); TANDEM_ERR_INVALID_ARG for a name outside
 * [A-Za-z0-9_-]{1,64}. */
tandem_status tdm_tool_grammar(tdm_tool_format f, const char *const *names, const char *const *params, size_t n,
                               int only, bool parallel, char **out, tdm_err *err);

#endif
