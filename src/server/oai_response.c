/* oai_response.c - OpenAI-style answers (oai_response.h). */
#include "oai_response.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

/* Each answer is written into a memory stream; the text is the stream's buffer. */
typedef struct out {
    FILE *f;
    char *buf;
    size_t len;
} out;

static bool out_open(out *o) {
    o->buf = NULL;
    o->len = 0;
    o->f = open_memstream(&o->buf, &o->len);
    return o->f != NULL;
}

static char *out_close(out *o, size_t *len) {
    const bool bad = ferror(o->f) != 0;
    if (fclose(o->f) != 0 || bad) {
        free(o->buf);
        return NULL;
    }
    if (len) *len = o->len;
    return o->buf;
}

static void str(FILE *f, const char *s) { tdm_json_write_str(f, s, strlen(s)); }

static void num(FILE *f, double x) {
    if (!isfinite(x)) x = 0;
    fprintf(f, "%.4f", x);
}

const char *oai_finish_reason(tandem_finish_reason r) {
    switch (r) {
    case TANDEM_FINISH_EOS:
    case TANDEM_FINISH_STOP: return "stop";
    case TANDEM_FINISH_LENGTH:
    case TANDEM_FINISH_TIMEOUT: return "length";
    case TANDEM_FINISH_CANCELLED: return "abort";
    case TANDEM_FINISH_ERROR: return "error";
    case TANDEM_FINISH_NONE: break;
    }
    return "stop";
}

/* {"id": ..., "object": ..., "created": ..., "model": ..., */
static void head(FILE *f, const oai_meta *m, bool chunk) {
    fputs("{\"id\": ", f);
    str(f, m->id);
    fprintf(f, ", \"object\": \"%s\", \"created\": %lld, \"model\": ",
            m->kind == OAI_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion",
            (long long)m->created);
    str(f, m->model);
}

/* The usage of an answer's n choices: the prompt counted once (as OpenAI counts it),
 * the completions' tokens and the speculation's counts summed; cached_tokens the most
 * any choice took from the prefix cache (the choices after the first share the first's
 * prompt blocks). */
static void usage(FILE *f, const oai_meta *m, const tandem_result *rs, size_t n) {
    size_t done = 0, cached = 0;
    tandem_spec_stats s = {0};
    for (size_t i = 0; i < n; i++) {
        done += rs[i].n_tokens;
        if (rs[i].n_cached_tokens > cached) cached = rs[i].n_cached_tokens;
        s.steps += rs[i].spec.steps;
        s.drafted += rs[i].spec.drafted;
        s.accepted += rs[i].spec.accepted;
        s.forwards += rs[i].spec.forwards;
        s.forward_tokens += rs[i].spec.forward_tokens;
    }
    const size_t prompt = n ? rs[0].n_prompt_tokens : 0;
    fprintf(f, "\"usage\": {\"prompt_tokens\": %zu, \"completion_tokens\": %zu, \"total_tokens\": %zu", prompt, done,
            prompt + done);
    if (cached) fprintf(f, ", \"prompt_tokens_details\": {\"cached_tokens\": %zu}", cached);
    if (m->has_draft) {
        fprintf(f, ", \"spec\": {\"steps\": %llu, \"drafted\": %llu, \"accepted\": %llu, \"acceptance_rate\": ",
                (unsigned long long)s.steps, (unsigned long long)s.drafted, (unsigned long long)s.accepted);
        num(f, s.drafted ? (double)s.accepted / (double)s.drafted : 0.0);
        fprintf(f, ", \"forwards\": %llu, \"tokens_per_forward\": ", (unsigned long long)s.forwards);
        num(f, s.forwards ? (double)s.forward_tokens / (double)s.forwards : 0.0);
        fputc('}', f);
    }
    fputc('}', f);
}

/* ", "finish_reason": ..." and the timeout mark. */
static void finish(FILE *f, const oai_meta *m, const tandem_result *r) {
    fputs(", \"finish_reason\": ", f);
    const bool calls = m->called_tools && (r->finish_reason == TANDEM_FINISH_EOS || r->finish_reason == TANDEM_FINISH_STOP);
    str(f, calls ? "tool_calls" : oai_finish_reason(r->finish_reason));
    if (r->finish_reason == TANDEM_FINISH_TIMEOUT) fputs(", \"tandem\": {\"timeout\": true}", f);
}

bool oai_tool_parse(const oai_meta *m, const char *text, size_t len, tdm_tool_parse *p) {
    if (tdm_tool_calls_parse(m->tool_format, text, len, m->tool_names, m->n_tool_names, p) != TANDEM_OK) return false;
    if (!m->parallel_tool_calls)
        while (p->n_calls > 1) {
            p->n_calls--;
            free(p->calls[p->n_calls].name);
            free(p->calls[p->n_calls].arguments);
        }
    return true;
}

void oai_tool_call_id(const oai_meta *m, size_t k, char *buf, size_t cap) {
    static const char digits[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the answer's id, then splitmix64 per character */
    for (const char *c = m->id; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    if (m->index) h = (h ^ (uint64_t)m->index) * 1099511628211ull; /* (choice i's calls: ids of their own) */
    h = (h ^ ((uint64_t)k + 1)) * 0xff51afd7ed558ccdull; /* (murmur3's finalizer: call k's own sequence) */
    h = (h ^ (h >> 33)) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 33;
    const bool mistral = m->tool_format == TDM_TOOL_FORMAT_MISTRAL;
    const size_t n = mistral ? 9 : 24;
    size_t at = (size_t)snprintf(buf, cap, "%s", mistral ? "" : "call_");
    for (size_t i = 0; i < n && at + 1 < cap; i++) {
        uint64_t z = (h += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        buf[at++] = digits[z % (sizeof digits - 1)];
    }
    if (cap) buf[at < cap ? at : cap - 1] = '\0';
}

/* "tool_calls": [...] of a whole message. */
static void message_calls(FILE *f, const oai_meta *m, const tdm_tool_parse *p) {
    fputs(", \"tool_calls\": [", f);
    for (size_t k = 0; k < p->n_calls; k++) {
        char id[40];
        oai_tool_call_id(m, k, id, sizeof id);
        fputs(k ? ", {\"id\": " : "{\"id\": ", f);
        str(f, id);
        fputs(", \"type\": \"function\", \"function\": {\"name\": ", f);
        str(f, p->calls[k].name);
        fputs(", \"arguments\": ", f);
        str(f, p->calls[k].arguments);
        fputs("}}", f);
    }
    fputc(']', f);
}

/* ---- logprobs ---- */

/* A token's text (tandem_free it), or NULL (none: an empty text). */
static char *token_text(const oai_meta *m, int32_t id) {
    char *t = NULL;
    if (!m->lp_model || tandem_detokenize(m->lp_model, &id, 1, &t) != TANDEM_OK) return NULL;
    return t;
}

static void lp_num(FILE *f, float x) { fprintf(f, "%.9g", isfinite(x) ? (double)x : -9999.0); }

/* chat: {"token", "logprob", "bytes" of one token (left open) */
static void chat_lp_entry(FILE *f, const oai_meta *m, int32_t id, float lp) {
    char *t = token_text(m, id);
    const char *s = t ? t : "";
    fputs("{\"token\": ", f);
    str(f, s);
    fputs(", \"logprob\": ", f);
    lp_num(f, lp);
    fputs(", \"bytes\": [", f);
    for (size_t i = 0; s[i]; i++) fprintf(f, i ? ", %u" : "%u", (unsigned)(unsigned char)s[i]);
    fputc(']', f);
    tandem_free(t);
}

/* ", "logprobs": ..." of the tokens of sp (NULL: none) */
static void logprobs_json(FILE *f, const oai_meta *m, const oai_lp_span *sp) {
    if (!m->logprobs) {
        fputs(", \"logprobs\": null", f);
        return;
    }
    const size_t n = sp ? sp->n : 0;
    if (m->kind == OAI_CHAT) {
        fputs(", \"logprobs\": {\"content\": [", f);
        for (size_t i = 0; i < n; i++) {
            const tandem_token_logprob *lp = &sp->lp[i];
            if (i) fputs(", ", f);
            chat_lp_entry(f, m, sp->tokens[i], lp->logprob);
            fputs(", \"top_logprobs\": [", f);
            for (int k = 0; k < lp->n_top; k++) {
                if (k) fputs(", ", f);
                chat_lp_entry(f, m, lp->top_ids[k], lp->top_logprobs[k]);
                fputc('}', f);
            }
            fputs("]}", f);
        }
        fputs("], \"refusal\": null}", f);
        return;
    }
    size_t off = m->lp_offset ? *m->lp_offset : 0;
    fputs(", \"logprobs\": {\"tokens\": [", f);
    for (size_t i = 0; i < n; i++) {
        char *t = token_text(m, sp->tokens[i]);
        if (i) fputs(", ", f);
        str(f, t ? t : "");
        tandem_free(t);
    }
    fputs("], \"token_logprobs\": [", f);
    for (size_t i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        lp_num(f, sp->lp[i].logprob);
    }
    fputs("], \"top_logprobs\": [", f);
    for (size_t i = 0; i < n; i++) {
        const tandem_token_logprob *lp = &sp->lp[i];
        /* {text: logprob} of the alternatives and the sampled token (vLLM's), a text
         * once (two tokens of one text: the likelier) */
        char *heap[TANDEM_TOP_LOGPROBS_MAX + 1];
        const char *texts[TANDEM_TOP_LOGPROBS_MAX + 1];
        int nt = 0;
        fputs(i ? ", {" : "{", f);
        for (int k = 0; k <= lp->n_top && k <= TANDEM_TOP_LOGPROBS_MAX; k++) {
            const int32_t id = k < lp->n_top ? lp->top_ids[k] : sp->tokens[i];
            const float v = k < lp->n_top ? lp->top_logprobs[k] : lp->logprob;
            char *t = token_text(m, id);
            const char *tt = t ? t : "";
            bool seen = false;
            for (int x = 0; x < nt && !seen; x++) seen = !strcmp(texts[x], tt);
            if (seen) {
                tandem_free(t);
                continue;
            }
            if (nt) fputs(", ", f);
            str(f, tt);
            fputs(": ", f);
            lp_num(f, v);
            heap[nt] = t, texts[nt++] = tt;
        }
        for (int x = 0; x < nt; x++) tandem_free(heap[x]);
        fputc('}', f);
    }
    fputs("], \"text_offset\": [", f);
    for (size_t i = 0; i < n; i++) {
        char *t = token_text(m, sp->tokens[i]);
        fprintf(f, i ? ", %zu" : "%zu", off);
        off += t ? strlen(t) : 0;
        tandem_free(t);
    }
    fputs("]}", f);
    if (m->lp_offset) *m->lp_offset = off;
}

/* One choice of a whole answer: {"index": ..., "message" or "text", "logprobs", finish}
 * (sets m->called_tools); false out of memory. */
static bool choice_json(FILE *f, oai_meta *m, const tandem_result *r) {
    const char *text = r->text ? r->text : "";
    fprintf(f, "{\"index\": %d, ", m->index);
    if (m->kind == OAI_CHAT && (m->tool_format != TDM_TOOL_FORMAT_NONE || m->reasoning)) {
        const size_t tl = strlen(text);
        const tdm_think_split t = m->reasoning ? tdm_think_split_text(text, tl, true) : (tdm_think_split){0};
        tdm_tool_parse p;
        if (!oai_tool_parse(m, text + t.content_at, tl - t.content_at, &p)) return false;
        fputs("\"message\": {\"role\": \"assistant\", \"content\": ", f);
        if (p.content) str(f, p.content);
        else fputs("null", f);
        if (t.has) {
            fputs(", \"reasoning_content\": ", f);
            tdm_json_write_str(f, text + t.reason_at, t.reason_len);
        }
        if (p.n_calls) message_calls(f, m, &p);
        m->called_tools = p.n_calls > 0;
        fputc('}', f);
        tdm_tool_parse_free(&p);
    } else if (m->kind == OAI_CHAT) {
        fputs("\"message\": {\"role\": \"assistant\", \"content\": ", f);
        str(f, text);
        fputc('}', f);
    } else {
        fputs("\"text\": ", f);
        str(f, text);
    }
    const oai_lp_span sp = {r->tokens, r->logprobs, r->logprobs ? r->n_tokens : 0};
    logprobs_json(f, m, &sp);
    finish(f, m, r);
    fputc('}', f);
    return true;
}

char *oai_results_json(oai_meta *ms, const tandem_result *rs, size_t n, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    FILE *f = o.f;
    head(f, &ms[0], false);
    fputs(", \"choices\": [", f);
    for (size_t i = 0; i < n; i++) {
        if (i) fputs(", ", f);
        if (!choice_json(f, &ms[i], &rs[i])) {
            fclose(o.f);
            free(o.buf);
            return NULL;
        }
    }
    fputs("], ", f);
    usage(f, &ms[0], rs, n);
    fputs("}", f);
    return out_close(&o, len);
}

char *oai_result_json(oai_meta *m, const tandem_result *r, size_t *len) { return oai_results_json(m, r, 1, len); }

/* "data: " + a chunk's head and its one choice up to the piece of text. */
static void chunk_open(FILE *f, const oai_meta *m, const char *field, const char *text, size_t n, bool first) {
    fputs("data: ", f);
    head(f, m, true);
    fprintf(f, ", \"choices\": [{\"index\": %d, ", m->index);
    if (m->kind == OAI_CHAT) {
        fprintf(f, first ? "\"delta\": {\"role\": \"assistant\", \"%s\": " : "\"delta\": {\"%s\": ", field);
        tdm_json_write_str(f, text, n);
        fputc('}', f);
    } else {
        fputs("\"text\": ", f);
        tdm_json_write_str(f, text, n);
    }
    logprobs_json(f, m, m->lp_span);
}

static char *chunk_sse(const oai_meta *m, const char *field, const char *text, size_t text_len, bool first,
                       bool include_usage, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    chunk_open(o.f, m, field, text, text_len, first);
    fputs(", \"finish_reason\": null}]", o.f);
    if (include_usage) fputs(", \"usage\": null", o.f);
    fputs("}\n\n", o.f);
    return out_close(&o, len);
}

char *oai_chunk_sse(const oai_meta *m, const char *text, size_t text_len, bool first, bool include_usage,
                    size_t *len) {
    return chunk_sse(m, "content", text, text_len, first, include_usage, len);
}

char *oai_reasoning_chunk_sse(const oai_meta *m, const char *text, size_t text_len, bool first, bool include_usage,
                              size_t *len) {
    return chunk_sse(m, "reasoning_content", text, text_len, first, include_usage, len);
}

char *oai_tool_calls_sse(const oai_meta *m, const tdm_tool_parse *p, bool first, bool include_usage, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    FILE *f = o.f;
    for (size_t k = 0; k < p->n_calls; k++) {
        char id[40];
        oai_tool_call_id(m, k, id, sizeof id);
        for (int part = 0; part < 2; part++) {
            fputs("data: ", f);
            head(f, m, true);
            fprintf(f, ", \"choices\": [{\"index\": %d, \"delta\": {", m->index);
            if (first && k == 0 && part == 0) fputs("\"role\": \"assistant\", \"content\": null, ", f);
            fprintf(f, "\"tool_calls\": [{\"index\": %zu, ", k);
            if (part == 0) {
                fputs("\"id\": ", f);
                str(f, id);
                fputs(", \"type\": \"function\", \"function\": {\"name\": ", f);
                str(f, p->calls[k].name);
                fputs(", \"arguments\": \"\"}}]}", f);
            } else {
                fputs("\"function\": {\"arguments\": ", f);
                str(f, p->calls[k].arguments);
                fputs("}}]}", f);
            }
            fputs(", \"logprobs\": null, \"finish_reason\": null}]", f);
            if (include_usage) fputs(", \"usage\": null", f);
            fputs("}\n\n", f);
        }
    }
    return out_close(&o, len);
}

/* Writes a reasoning or content chunk of text[0..n) into f, if n > 0. */
static void put_chunk(const oai_meta *m, oai_stream_sent *sent, FILE *f, bool reasoning, const char *text, size_t n,
                      bool include_usage, bool *oom) {
    if (n == 0) return;
    size_t k = 0;
    char *c = chunk_sse(m, reasoning ? "reasoning_content" : "content", text, n, sent->first, include_usage, &k);
    if (c) fwrite(c, 1, k, f);
    else *oom = true;
    free(c);
    sent->first = false;
}

char *oai_parsed_events(oai_meta *m, oai_stream_sent *sent, const char *text, size_t len, bool done,
                        bool include_usage, size_t *out_len, bool *oom) {
    *oom = false;
    const tdm_think_split sp = m->reasoning ? tdm_think_split_text(text, len, done) : (tdm_think_split){.decided = true};
    if (!sp.decided) return NULL;
    out o;
    if (!out_open(&o)) return *oom = true, NULL;
    FILE *f = o.f;
    const size_t reason_end = done ? sp.reason_len : sp.reason_safe;
    if (sp.has && reason_end > sent->reasoning) {
        put_chunk(m, sent, f, true, text + sp.reason_at + sent->reasoning, reason_end - sent->reasoning, include_usage,
                  oom);
        sent->reasoning = reason_end;
    }
    const char *c = text + sp.content_at;
    const size_t cl = len - sp.content_at;
    if (!done) {
        const size_t safe = tdm_tool_calls_stream_safe(m->tool_format, c, cl);
        if (safe > sent->content) {
            put_chunk(m, sent, f, false, c + sent->content, safe - sent->content, include_usage, oom);
            sent->content = safe;
        }
    } else {
        tdm_tool_parse p;
        if (!oai_tool_parse(m, c, cl, &p)) {
            *oom = true;
        } else {
            /* the content not sent yet (what was sent is a prefix of it: the hold-back rule) */
            const size_t pl = p.content ? strlen(p.content) : 0;
            if (pl > sent->content && (!sent->content || memcmp(p.content, c, sent->content) == 0)) {
                put_chunk(m, sent, f, false, p.content + sent->content, pl - sent->content, include_usage, oom);
                sent->content = pl;
            }
            if (p.n_calls) {
                size_t k = 0;
                char *e = oai_tool_calls_sse(m, &p, sent->first, include_usage, &k);
                if (e) fwrite(e, 1, k, f);
                else *oom = true;
                free(e);
                sent->first = false;
                m->called_tools = true;
            }
            tdm_tool_parse_free(&p);
        }
    }
    size_t n = 0;
    char *t = out_close(&o, &n);
    if (!t || *oom) {
        free(t);
        return *oom = true, NULL;
    }
    if (n == 0) {
        free(t);
        return NULL;
    }
    *out_len = n;
    return t;
}

char *oai_final_chunk_sse(const oai_meta *m, const tandem_result *r, bool include_usage, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    FILE *f = o.f;
    if (m->kind == OAI_CHAT) { /* an empty delta */
        fputs("data: ", f);
        head(f, m, true);
        fprintf(f, ", \"choices\": [{\"index\": %d, \"delta\": {}", m->index);
        logprobs_json(f, m, m->lp_span);
    } else {
        chunk_open(f, m, "content", "", 0, false);
    }
    finish(f, m, r);
    fputs("}]", f);
    if (include_usage) fputs(", \"usage\": null", f);
    fputs("}\n\n", f);
    return out_close(&o, len);
}

char *oai_usage_chunks_sse(const oai_meta *m, const tandem_result *rs, size_t n, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    fputs("data: ", o.f);
    head(o.f, m, true);
    fputs(", \"choices\": [], ", o.f);
    usage(o.f, m, rs, n);
    fputs("}\n\n", o.f);
    return out_close(&o, len);
}

char *oai_usage_chunk_sse(const oai_meta *m, const tandem_result *r, size_t *len) {
    return oai_usage_chunks_sse(m, r, 1, len);
}

static void error_obj(FILE *f, const oai_error *e) {
    fputs("{\"error\": {\"message\": ", f);
    str(f, e->message);
    fputs(", \"type\": ", f);
    str(f, e->type ? e->type : "server_error");
    fputs(", \"param\": ", f);
    if (e->param[0]) str(f, e->param);
    else fputs("null", f);
    fputs(", \"code\": ", f);
    if (e->code[0]) str(f, e->code);
    else fputs("null", f);
    fputs("}}", f);
}

char *oai_error_json(const oai_error *e, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    error_obj(o.f, e);
    return out_close(&o, len);
}

char *oai_error_sse(const oai_error *e, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    fputs("data: ", o.f);
    error_obj(o.f, e);
    fputs("\n\n", o.f);
    return out_close(&o, len);
}

char *oai_done_sse(size_t *len) {
    static const char done[] = "data: [DONE]\n\n";
    char *s = malloc(sizeof done);
    if (!s) return NULL;
    memcpy(s, done, sizeof done);
    *len = sizeof done - 1;
    return s;
}

/* A model object: {"id", "object": "model", "created", "owned_by", "max_model_len"}. */
static void model_obj(FILE *f, const char *model, int64_t created, int n_ctx) {
    fputs("{\"id\": ", f);
    str(f, model);
    fprintf(f, ", \"object\": \"model\", \"created\": %lld, \"owned_by\": \"tandem\", \"max_model_len\": %d}",
            (long long)created, n_ctx);
}

char *oai_models_json(const char *model, int64_t created, int n_ctx, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    fputs("{\"object\": \"list\", \"data\": [", o.f);
    model_obj(o.f, model, created, n_ctx);
    fputs("]}", o.f);
    return out_close(&o, len);
}

char *oai_model_json(const char *model, int64_t created, int n_ctx, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    model_obj(o.f, model, created, n_ctx);
    return out_close(&o, len);
}

char *oai_health_json(const char *status, const char *model, float progress, size_t *len) {
    out o;
    if (!out_open(&o)) return NULL;
    fputs("{\"status\": ", o.f);
    str(o.f, status);
    if (model) {
        fputs(", \"model\": ", o.f);
        str(o.f, model);
    }
    if (progress >= 0) {
        fputs(", \"progress\": ", o.f);
        num(o.f, progress);
    }
    fputc('}', o.f);
    return out_close(&o, len);
}
