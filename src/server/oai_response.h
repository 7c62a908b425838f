/* oai_response.h - the server's answers as OpenAI's API writes them: completion and
 * chat-completion objects, their streaming chunks as server-sent events, error
 * objects, the model list.
 *
 * Every function returns a malloc'ed, NUL-terminated text (*len its length, without
 * the NUL), or NULL when out of memory.  Text goes through the project's JSON string
 * writer (json.h), so any bytes give valid JSON. */
#ifndef TDM_OAI_RESPONSE_H
#define TDM_OAI_RESPONSE_H

#include <stddef.h>
#include <stdint.h>

#include "oai_request.h"
#include "tandem.h"
#include "tool_calls.h"

/* Token log-probabilities to write with a choice or a chunk: tokens[i] and lp[i]
 * (tandem_token_logprob) for i < n. */
typedef struct oai_lp_span {
    const int32_t *tokens;
    const tandem_token_logprob *lp;
    size_t n;
} oai_lp_span;

/* What every object of one answer shares. */
typedef struct oai_meta {
    oai_kind kind;
    const char *id;          /* "cmpl-..." / "chatcmpl-..." */
    int index;               /* the choice's index (n > 1: each choice has its meta) */
    int64_t created;         /* Unix seconds */
    const char *model;       /* the served model's id */
    bool has_draft;          /* usage carries a "spec" object */
    tdm_tool_format tool_format; /* chat with tools offered: the format the output's
                                    calls are parsed in; NONE: the output is text */
    bool parallel_tool_calls;    /* false: only the first call is kept */
    const char *const *tool_names; /* [n_tool_names] the tools offered (bare calls name one) */
    size_t n_tool_names;
    bool reasoning;          /* chat, the template marks reasoning: a <think> block at
                                the output's start is the message's reasoning_content
                                (tdm_think_split_text) */
    bool called_tools;       /* calls were answered (set by oai_result_json, and by the
                                streamer before the last chunk): finish_reason
                                "tool_calls" where it would be "stop" */
    /* logprobs (the request's logprobs member; false: "logprobs": null).  A whole answer writes its result's; a chunk
     * writes lp_span (NULL: an empty list).  Chat: {"content": [{token, logprob, bytes,
     * top_logprobs: [{token, logprob, bytes}]}], "refusal": null}; completions:
     * {tokens, token_logprobs, top_logprobs: [{text: logprob}] (the N likeliest and
     * the sampled token, vLLM's), text_offset} with text_offset counted on from
     * *lp_offset (a stream's running offset, advanced; NULL: from 0).  Every generated
     * token has an entry (an end-of-generation token too, as vLLM gives it). */
    bool logprobs;
    const tandem_model *lp_model; /* token texts (tandem_detokenize) */
    const oai_lp_span *lp_span;
    size_t *lp_offset;
} oai_meta;

/* The output text[0..len) parsed for calls as m says (tdm_tool_calls_parse; without
 * parallel_tool_calls the first call alone).  False out of memory. */
bool oai_tool_parse(const oai_meta *m, const char *text, size_t len, tdm_tool_parse *p);

/* Call k's id: OpenAI's "call_" and 24 letters and digits, or for the mistral format
 * the 9 letters and digits its templates require; derived from the answer's id, the
 * choice's index and k (unique per answer). */
void oai_tool_call_id(const oai_meta *m, size_t k, char *buf, size_t cap);

/* The finish_reason OpenAI's clients know: eos and stop strings -> "stop", length and
 * timeout -> "length", cancelled -> "abort" (vLLM's: the server shut down while the
 * request was generating; its text so far), error -> "error". */
const char *oai_finish_reason(tandem_finish_reason r);

/* The whole answer of a non-streaming request: text (chat with m->reasoning: a <think>
 * block at its start as the message's reasoning_content; chat with m->tool_format: the
 * message's content (null when only calls) and tool_calls [{id, type: "function",
 * function: {name, arguments: a JSON object's text}}], finish_reason "tool_calls"
 * for an answer that ended with its calls; sets m->called_tools), finish_reason, usage (plus
 * "spec" with a draft: steps, drafted, accepted, acceptance_rate, forwards and
 * tokens_per_forward, the tokens each target forward committed, as `tandem generate
 * --json` gives them; a timed-out choice carries "tandem": {"timeout": true}). */
char *oai_result_json(oai_meta *m, const tandem_result *r, size_t *len);
/* The same for a request of n choices: ms[i] and rs[i] choice i's (ms[i].index = i), the
 * head from ms[0]; usage: the prompt's tokens once, the completions' and the
 * speculation's summed, cached_tokens the most a choice took from the prefix cache. */
char *oai_results_json(oai_meta *ms, const tandem_result *rs, size_t n, size_t *len);

/* One streaming event "data: {...}\n\n": a chunk with the text piece
 * text[0..text_len) (chat: the first chunk's delta also carries the role).
 * include_usage adds "usage": null, as OpenAI does on every chunk but the last. */
char *oai_chunk_sse(const oai_meta *m, const char *text, size_t text_len, bool first, bool include_usage,
                    size_t *len);
/* A chunk of reasoning (chat): the delta carries reasoning_content (vLLM's and
 * llama-server's member) in place of content. */
char *oai_reasoning_chunk_sse(const oai_meta *m, const char *text, size_t text_len, bool first, bool include_usage,
                              size_t *len);
/* A stream's calls (chat): for each, a chunk whose delta carries tool_calls [{index,
 * id, type: "function", function: {name, arguments: ""}}], then one with its
 * arguments ({index, function: {arguments}}), as OpenAI streams them (the first
 * chunk's delta also carries the role). */
char *oai_tool_calls_sse(const oai_meta *m, const tdm_tool_parse *p, bool first, bool include_usage, size_t *len);
/* A parsed chat stream (m->reasoning or m->tool_format): what went out so far. */
typedef struct oai_stream_sent {
    bool first;                  /* no chunk yet (the next carries the role): start true */
    size_t reasoning, content;   /* bytes of reasoning / content sent */
} oai_stream_sent;

/* The events of a parsed chat stream whose output so far is text[0..len): the reasoning
 * and the content that can go out now (what may still begin a call, or end the
 * reasoning, is held back: tdm_think_split_text, tdm_tool_calls_stream_safe); when done
 * (the output whole), the rest of them, then the calls (oai_tool_calls_sse; sets
 * m->called_tools).  NULL with *oom false when there is nothing to send yet.  The
 * deltas put together are the whole answer's message (oai_result_json). */
char *oai_parsed_events(oai_meta *m, oai_stream_sent *sent, const char *text, size_t len, bool done,
                        bool include_usage, size_t *out_len, bool *oom);
/* The last chunk: an empty text / delta with the finish reason of r. */
char *oai_final_chunk_sse(const oai_meta *m, const tandem_result *r, bool include_usage, size_t *len);
/* The usage chunk of stream_options.include_usage: "choices": [] and r's usage. */
char *oai_usage_chunk_sse(const oai_meta *m, const tandem_result *r, size_t *len);
/* The same for n choices' results (their usage as oai_results_json sums it). */
char *oai_usage_chunks_sse(const oai_meta *m, const tandem_result *rs, size_t n, size_t *len);
/* An error inside a stream, after the 200 went out: "data: {"error": {...}}\n\n". */
char *oai_error_sse(const oai_error *e, size_t *len);
/* "data: [DONE]\n\n" */
char *oai_done_sse(size_t *len);

/* {"error": {"message", "type", "param", "code"}} */
char *oai_error_json(const oai_error *e, size_t *len);
/* GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created",
 * "owned_by": "tandem", "max_model_len"}]} */
char *oai_models_json(const char *model, int64_t created, int n_ctx, size_t *len);

/* GET /v1/models/{id}: {"id", "object": "model", "created", "owned_by": "tandem",
 * "max_model_len"} (the served model's; another id is a 404 in http.c). */
char *oai_model_json(const char *model, int64_t created, int n_ctx, size_t *len);

/* POST /tokenize (oai_tokenize.c): {"content": TEXT (llama-server's; add_special
 * defaults to false) or "prompt": TEXT (vLLM's; add_special_tokens defaults to true),
 * "add_special" / "add_special_tokens": bool (the BOS / EOS the tokenizer asks for),
 * "with_pieces": bool, "parse_special": true only, "model": the served id} ->
 * {"tokens": [id, ...] or with_pieces [{"id", "piece": text, or its bytes when not
 * whole UTF-8}], "count", "max_model_len"}.  Any other member, a wrong type or another
 * model is refused (e set: 400 naming it, 404 for the model); NULL then. */
char *oai_tokenize_json(const tandem_model *model, const oai_limits *lim, const char *body, size_t len, size_t *out_len,
                        oai_error *e);
/* POST /detokenize: {"tokens": [id, ...], "model"?} -> {"content": TEXT, "prompt": TEXT}
 * (llama-server's member and vLLM's); an id outside [0, n_vocab) is a 400 naming it. */
char *oai_detokenize_json(const tandem_model *model, const oai_limits *lim, const char *body, size_t len,
                          size_t *out_len, oai_error *e);

/* GET /health: {"status": "ok", "model": ID} (model NULL: {"status": STATUS}), with
 * "progress" (the fraction of the models loaded) when progress >= 0. */
char *oai_health_json(const char *status, const char *model, float progress, size_t *len);

#endif
