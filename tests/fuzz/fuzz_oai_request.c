/* fuzz_oai_request.c - libFuzzer harness for `tandem serve`'s request parser and
 * validator (src/server/oai_request.c) and the answers built from what it accepts
 * (src/server/oai_response.c; not built by default: scripts/fuzz.sh builds it).
 *
 * The input's first byte picks the endpoint (bit 0: chat) and the server's limits
 * (bit 1: a draft model, bit 2: a request_timeout_s); the rest is the request body.
 * Checks (abort() on a violation, so the fuzzer reports it):
 *   - a parse either succeeds or fails with a status in {400, 404, 500}, an error
 *     type and a non-empty message; a failure leaves nothing allocated;
 *   - what it accepts is within the engine's ranges: a prompt (text or token ids in
 *     the vocabulary) or messages with roles, max_tokens in [1, n_ctx), top_p in
 *     (0, 1], min_p in [0, 1], temperature >= 0, at most TANDEM_STOP_MAX stop strings
 *     of 1..TANDEM_STOP_LEN_MAX bytes, spec_k only with a draft, include_usage only
 *     with stream, a timeout no longer than the server's;
 *   - the context check passes or fails with 400; the error and every answer and
 *     stream event built from the request parse back as JSON;
 *   - chat: the conversation for the template (chat_json) is JSON; the last message's
 *     content, as a model's output parsed for tool calls in the format bits 6-7 pick
 *     (src/chat/tool_calls.c), answers as JSON whole and streamed (with and without the
 *     reasoning split, bit 3), and what streaming
 *     lets out at each byte (up to 512) is a prefix of the parsed content. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "oai_request.h"
#include "oai_response.h"
#include "tool_calls.h"

/* The answers' logprobs read tokens' text through the library (oai_response.c),
 * which this harness does not link: no request here carries logprobs results, so
 * these stand-ins are never reached with a token. */
tandem_status tandem_detokenize(const tandem_model *model, const int32_t *ids, size_t n, char **out_text) {
    (void)model, (void)ids, (void)n;
    *out_text = NULL;
    return TANDEM_ERR_UNSUPPORTED;
}
void tandem_free(void *p) { free(p); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void must_parse(char *text, size_t n, size_t skip) {
    if (!text || n < skip + 2) abort();
    tdm_json *j = NULL;
    tdm_err err = {0};
    if (tdm_json_parse(text + skip, n - skip - (skip ? 2 : 0), &j, &err) != TANDEM_OK) abort();
    tdm_json_free(j);
    free(text);
}

static void check_accepted(const oai_request *r, const oai_limits *l) {
    const tandem_generate_params *g = &r->params;
    if (r->kind == OAI_CHAT) {
        if (!r->messages || r->n_messages == 0 || !r->chat_json) abort();
        must_parse(strdup(r->chat_json), strlen(r->chat_json), 0);
        for (size_t i = 0; i < r->n_messages; i++)
            if (!r->messages[i].role || !r->messages[i].role[0]) abort();
    } else if (!(r->prompt && r->prompt_len > 0) && !(r->prompt_ids && r->n_prompt_ids > 0)) {
        abort();
    }
    for (size_t i = 0; i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= l->n_vocab) abort();
    if (r->has_max_tokens && (g->max_tokens < 1 || g->max_tokens >= l->n_ctx)) abort();
    if (!(g->top_p > 0 && g->top_p <= 1) || !(g->min_p >= 0 && g->min_p <= 1) || !(g->temperature >= 0)) abort();
    if (g->n_stop < 0 || g->n_stop > TANDEM_STOP_MAX) abort();
    for (int i = 0; i < g->n_stop; i++) {
        const size_t n = strlen(g->stop[i]);
        if (n < 1 || n > TANDEM_STOP_LEN_MAX) abort();
    }
    if (g->spec_k != l->defaults.spec_k && !l->has_draft) abort();
    if (r->include_usage && !r->stream) abort();
    if (!(r->timeout_ms >= 0) || (l->timeout_s > 0 && (r->timeout_ms == 0 || r->timeout_ms > l->timeout_s * 1000.0)))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const oai_kind kind = data[0] & 1 ? OAI_CHAT : OAI_COMPLETION;
    oai_limits l = {.model_id = "pycode", .n_ctx = 256, .n_vocab = 512, .has_draft = (data[0] & 2) != 0,
                    .timeout_s = data[0] & 4 ? 30 : 0};
    /* tandem_generate_default_params()'s values (src/api/api.c is not linked) */
    l.defaults = (tandem_generate_params){.max_tokens = 128, .top_p = 1, .spec_k_min = 1, .spec_k_max = 12,
                                          .spec_ngram = 4};
    oai_request r;
    oai_error e;
    size_t n = 0;
    if (!oai_request_parse(kind, (const char *)data + 1, size - 1, &l, &r, &e)) {
        if ((e.status != 400 && e.status != 404 && e.status != 500) || !e.type || !e.message[0]) abort();
        if (r.prompt || r.prompt_ids || r.messages || r.stop) abort();
        must_parse(oai_error_json(&e, &n), n, 0);
        return 0;
    }
    check_accepted(&r, &l);
    if (!oai_fit_context(&r, r.n_prompt_ids ? r.n_prompt_ids : r.prompt_len, &l, &e)) {
        if (e.status != 400 || !e.message[0]) abort();
    } else {
        const size_t np = r.n_prompt_ids ? r.n_prompt_ids : r.prompt_len;
        if (r.params.max_tokens < 0 || np + (size_t)r.params.max_tokens > (size_t)l.n_ctx) abort();
    }
    /* answers of a result holding the prompt's bytes as its text */
    oai_meta m = {.kind = kind, .id = "cmpl-1", .created = 1, .model = l.model_id, .has_draft = l.has_draft};
    tandem_result res = {0};
    res.text = r.prompt ? r.prompt : (char *)"";
    res.n_tokens = 1;
    res.finish_reason = (tandem_finish_reason)(data[0] >> 4) % (TANDEM_FINISH_ERROR + 1);
    must_parse(oai_result_json(&m, &res, &n), n, 0);
    must_parse(oai_chunk_sse(&m, res.text, strlen(res.text), data[0] & 8, r.include_usage, &n), n, 6);
    must_parse(oai_final_chunk_sse(&m, &res, r.include_usage, &n), n, 6);
    must_parse(oai_usage_chunk_sse(&m, &res, &n), n, 6);
    if (kind == OAI_CHAT && r.messages[r.n_messages - 1].content) {
        const char *out = r.messages[r.n_messages - 1].content;
        const size_t len = strlen(out);
        m.tool_format = (tdm_tool_format)((data[0] >> 6) & 3);
        m.parallel_tool_calls = r.parallel_tool_calls;
        res.text = (char *)out;
        must_parse(oai_result_json(&m, &res, &n), n, 0);
        tdm_tool_parse p;
        const char *names[] = {"w", "f", "a"};
        m.tool_names = names;
        m.n_tool_names = 3;
        if (!oai_tool_parse(&m, out, len, &p)) abort();
        if (p.n_calls) {
            char *ev = oai_tool_calls_sse(&m, &p, true, r.include_usage, &n);
            if (!ev || n < 8) abort();
            free(ev);
        }
        /* the same output streamed in two pieces (cut where the body's length says), with
           reasoning split as bit 3 says: every event parses as JSON */
        m.reasoning = (data[0] & 8) != 0;
        oai_stream_sent sent = {.first = true};
        const size_t cut = len ? size % (len + 1) : 0;
        for (int done = 0; done < 2; done++) {
            bool oom = false;
            char *ev = oai_parsed_events(&m, &sent, out, done ? len : cut, done, r.include_usage, &n, &oom);
            if (oom || (ev && (n < 8 || strncmp(ev, "data: ", 6) != 0))) abort();
            free(ev);
        }
        m.reasoning = false;
        const char *content = p.content ? p.content : "";
        for (size_t k = 0; k <= len && k <= 512; k++) {
            const size_t safe = tdm_tool_calls_stream_safe(m.tool_format, out, k);
            if (safe > k || safe > strlen(content) || memcmp(out, content, safe) != 0) abort();
        }
        tdm_tool_parse_free(&p);
    }
    oai_request_free(&r);
    return 0;
}
