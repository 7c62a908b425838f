/* oai_request.h - the body of an OpenAI-style request (POST /v1/completions,
 * /v1/chat/completions) parsed and validated into an engine request.
 *
 * Free of HTTP and of the engine: it reads JSON text and a few limits and either
 * fills an oai_request or an oai_error (HTTP status, OpenAI error type, the member at
 * fault and a message naming the problem).  This is the part of the server that
 * untrusted bytes reach first; it is fuzzed (tests/fuzz/fuzz_oai_request.c).
 *
 * Members read (others are ignored, as OpenAI-compatible servers do):
 *   model (string, must be the served model's id; absent or null: it), prompt
 *   (completions: a string, an array of one string, or an array of token ids),
 *   messages (chat: an array of {role: string, content: string | null | [{type:
 *   "text", text: string}, ...], and for agents' histories name, tool_call_id,
 *   reasoning_content (strings) and tool_calls ([{id, type: "function", function:
 *   {name, arguments: a JSON object's text}}])}), tools (chat: [{type: "function",
 *   function: {name (1-64 of [a-zA-Z0-9_-]), description, parameters (an object),
 *   strict (bool: with "required" or a named function only)}}]), tool_choice ("auto",
 *   the default with tools; "none": the tools are then not shown to the model and its
 *   output is not parsed for calls; "required" or {"type": "function", "function":
 *   {"name": one of the tools}}: the output held to calls by a grammar of the
 *   template's call format, built at submission, gen.c), parallel_tool_calls (bool,
 *   default true; false: one call, only the first call is kept), max_tokens / max_completion_tokens (integer >= 1),
 *   temperature [0, 1e6], top_p (0, 1], top_k (integer, -1 or 0 = off), min_p [0, 1],
 *   seed (integer in [-2^63, 2^64 - 1]: a uint64, a negative one modulo 2^64), stop
 *   (string or array of strings, null = none), n (choices, 1..OAI_N_MAX: each its own
 *   engine request with the seed seed + its index), stream (bool),
 *   stream_options.include_usage (bool; with stream only; other members refused but
 *   include_obfuscation and continuous_usage_stats false), ignore_eos (bool, vLLM's and
 *   llama-server's: generate max_tokens tokens whatever they are);
 *   the tandem extensions priority (integer), timeout_s [0, 1e9], spec_k (0 = adaptive,
 *   or 1..TANDEM_SPEC_K_MAX; needs a draft), spec_tree ("off", false, null or 0:
 *   chains only; "auto" or true: chain or tree as the controller expects faster; a
 *   node budget 1..TANDEM_SPEC_TREE_MAX as an integer or a string; a static shape
 *   such as "4,2,2,1"; needs a draft); the output's constraint, at most one of:
 *   response_format ({"type": "text"}; {"type": "json_object"}: any JSON object;
 *   {"type": "json_schema", "json_schema": {name (1-64 of [a-zA-Z0-9_-]), schema (an
 *   object; absent: any JSON), strict (bool; enforced either way), description}}),
 *   and llama-server's grammar (GBNF text) and json_schema (a schema object); an
 *   invalid grammar or schema is a 400 at submission naming where; presence_penalty
 *   and frequency_penalty [-2, 2], repetition_penalty (vLLM's) or repeat_penalty
 *   (llama-server's; the window is the whole prompt + output) (0, 100], min_tokens
 *   (vLLM's; integer, at most max_tokens), logit_bias ({"token id": bias in [-100,
 *   100]}, at most TANDEM_LOGIT_BIAS_MAX), logprobs (chat: a boolean, with top_logprobs
 *   0..TANDEM_TOP_LOGPROBS_MAX; completions: an integer 0..TANDEM_TOP_LOGPROBS_MAX, the
 *   alternatives per token).  Members that would change the output in ways not
 *   supported are refused rather than ignored: echo, best_of > 1, suffix, tools
 *   (completions), functions and function_call (deprecated: use tools).
 */
#ifndef TDM_OAI_REQUEST_H
#define TDM_OAI_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "json.h"
#include "tandem.h"

#define OAI_N_MAX 16 /* n: choices of one request at most */

typedef enum oai_kind { OAI_COMPLETION = 0, OAI_CHAT = 1 } oai_kind;

/* An error as the server answers it: {"error": {"message", "type", "param", "code"}}. */
typedef struct oai_error {
    int status;           /* HTTP status: 400, 401, 404, 413, 429, 500, 503 */
    const char *type;     /* "invalid_request_error", "not_found_error", ... (static) */
    char param[64];       /* the member at fault ("" = none: null in the answer) */
    char code[48];        /* a machine-readable code ("" = null): "model_not_found",
                             "context_length_exceeded", "unsupported_value", ... */
    char message[512];
} oai_error;

/* Sets *e; returns false (so `return oai_fail(...)` ends a parser). */
bool oai_fail(oai_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* What a request is checked against: the server's model and defaults. */
typedef struct oai_limits {
    const char *model_id;        /* the served model's id (GET /v1/models) */
    int n_ctx;                   /* the engine's context: prompt + completion at most */
    int n_vocab;                 /* token ids of a prompt given as ids lie in [0, n_vocab) */
    bool has_draft;              /* spec_k needs one */
    tandem_generate_params defaults; /* a request's parameters before its own members
                                    (max_tokens: the default when it gives none); stop
                                    and on_token are not used */
    double timeout_s;            /* the server's request_timeout_s, 0 = none: a request's
                                    timeout_s may only shorten it */
} oai_limits;

/* tool_choice: none, auto (the model chooses: text or calls), required (calls only,
 * by a grammar of the template's call format: tool_grammar.c), or a named function
 * (calls of it only). */
typedef enum oai_tool_choice { OAI_TOOLS_NONE = 0, OAI_TOOLS_AUTO = 1, OAI_TOOLS_REQUIRED = 2, OAI_TOOLS_NAMED = 3 } oai_tool_choice;

typedef struct oai_request {
    oai_kind kind;
    char *prompt;                /* completions with a text prompt: [prompt_len] bytes + NUL
                                    (may hold NULs) */
    size_t prompt_len;
    int32_t *prompt_ids;         /* completions with token ids: [n_prompt_ids] */
    size_t n_prompt_ids;
    tandem_chat_message *messages; /* chat: [n_messages]; role and content heap strings
                                    (content NULL for null) */
    size_t n_messages;
    char *chat_json;             /* chat: {"messages": [...], "tools": [...]} as
                                    tandem_chat_render_json takes it: the messages with
                                    the members above (tool call arguments as objects),
                                    the tools unless tool_choice is none */
    size_t n_tools;              /* chat: tools given */
    char **tool_names;           /* [n_tools] their function names (heap strings) */
    char **tool_params;          /* [n_tools] their parameters' JSON schemas (heap strings;
                                    NULL: none given, any object) */
    oai_tool_choice tool_choice; /* NONE: no tools offered, output not parsed for calls */
    int tool_named;              /* NAMED: the index of the tool named */
    bool parallel_tool_calls;    /* false: a response keeps its first call only */
    bool stream, include_usage;
    int n;                       /* choices [1, OAI_N_MAX]: n engine requests, choice i with
                                    the seed params.seed + i */
    bool has_max_tokens;         /* max_tokens given (else params.max_tokens is the default,
                                    cut to what the context leaves: oai_fit_context) */
    tandem_generate_params params; /* the sampling, speculation and stop parameters (stop
                                    points into stop) */
    char **stop;                 /* [n_stop] heap strings */
    int n_stop;
    int priority;
    double timeout_ms;           /* 0 = none */
    char spec_tree_shape[64];    /* a static tree's shape (params.spec_tree_shape points here) */
    char *grammar;               /* the output's GBNF grammar (heap; params.grammar), or NULL */
    char *json_schema;           /* its JSON schema's text (heap; params.json_schema), or NULL */
    tandem_logit_bias *logit_bias; /* [params.n_logit_bias] (heap; params.logit_bias), or NULL */
} oai_request;

/* Parses body[0..len) as a request of kind.  False with *err set (and *out empty) on
 * bad input; true with *out filled (free with oai_request_free). */
bool oai_request_parse(oai_kind kind, const char *body, size_t len, const oai_limits *lim, oai_request *out,
                       oai_error *err);
void oai_request_free(oai_request *r);

/* oai_refused.c: the members of vLLM, llama-server and OpenAI that this server does
 * not implement (length_penalty, mirostat, ...), refused (400 naming
 * the member) unless they hold their neutral value; get_sampling checks them. */
bool oai_check_refused(const tdm_json *j, oai_error *e);

/* oai_chat.c, for oai_request_parse: writes the messages ("{\"messages\": [...]"), then
 * the tools and the closing brace, into f, filling r's chat members. */
bool oai_chat_messages(const tdm_json *j, oai_request *r, FILE *f, oai_error *e);
bool oai_chat_tools(const tdm_json *j, oai_request *r, FILE *f, oai_error *e);

/* Checks a prompt of n_prompt tokens against the context: a prompt that leaves no
 * room (n_prompt >= n_ctx) or an explicit max_tokens that does not fit beside it is a
 * 400 naming the numbers (code context_length_exceeded); a default max_tokens is cut
 * to the room left.  Adjusts r->params.max_tokens. */
bool oai_fit_context(oai_request *r, size_t n_prompt, const oai_limits *lim, oai_error *err);

#endif
