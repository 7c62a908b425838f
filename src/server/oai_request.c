/* oai_request.c - OpenAI-style request bodies into engine requests (the members and
 * their ranges: oai_request.h). */
#include "oai_request.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "request_args.h"
#include "json.h"

#define TEMP_MAX 1e6
#define BAD "invalid_request_error"

bool oai_fail(oai_error *e, int status, const char *param, const char *code, const char *fmt, ...) {
    e->status = status;
    e->type = status == 404 ? "not_found_error" : status == 401 ? "authentication_error"
            : status == 413 ? "request_too_large" : status == 429 ? "rate_limit_error"
            : status == 503 ? "service_unavailable" : status >= 500 ? "server_error" : BAD;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

static const char *type_name(const tdm_json *v) {
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return v->type <= TDM_JSON_OBJECT ? names[v->type] : "?";
}

static bool wrong_type(oai_error *e, const char *name, const char *want, const tdm_json *v) {
    return oai_fail(e, 400, name, "invalid_type", "'%s' must be %s, not %s", name, want, type_name(v));
}

/* A member that is absent or null: nothing to do. */
static const tdm_json *member(const tdm_json *j, const char *name) {
    const tdm_json *v = tdm_json_get(j, name);
    return v && v->type != TDM_JSON_NULL ? v : NULL;
}

static bool get_int(const tdm_json *j, const char *name, int64_t lo, int64_t hi, bool *has, int64_t *out,
                    oai_error *e) {
    const tdm_json *v = member(j, name);
    *has = v != NULL;
    if (!v) return true;
    if (v->type != TDM_JSON_NUMBER) return wrong_type(e, name, "an integer", v);
    if (!tdm_json_int(v, out)) return oai_fail(e, 400, name, "invalid_value", "'%s' must be an integer, not %s", name, v->str);
    if (*out < lo || *out > hi)
        return oai_fail(e, 400, name, "invalid_value", "'%s' is %lld, out of range [%lld, %lld]", name,
                        (long long)*out, (long long)lo, (long long)hi);
    return true;
}

/* A number in [lo, hi], or (lo, hi] when lo_open (there as the float the engine takes,
 * where 1e-320 is 0; hi at most FLT_MAX then). */
static bool get_num(const tdm_json *j, const char *name, double lo, bool lo_open, double hi, bool *has, double *out,
                    oai_error *e) {
    const tdm_json *v = member(j, name);
    *has = v != NULL;
    if (!v) return true;
    if (v->type != TDM_JSON_NUMBER) return wrong_type(e, name, "a number", v);
    const double x = v->num;
    if (!isfinite(x) || !(x <= hi) || (lo_open ? !(x > lo && (float)x > lo) : !(x >= lo)))
        return oai_fail(e, 400, name, "invalid_value", "'%s' is %s, out of range %c%g, %g]", name, v->str,
                        lo_open ? '(' : '[', lo, hi);
    *out = x;
    return true;
}

static bool get_bool(const tdm_json *j, const char *name, bool *out, oai_error *e) {
    const tdm_json *v = member(j, name);
    if (!v) return true;
    if (v->type != TDM_JSON_BOOL) return wrong_type(e, name, "a boolean", v);
    *out = v->b;
    return true;
}

/* Members that would change the answer in ways not implemented: refused unless they
 * hold their neutral value. */
static bool check_unsupported(const tdm_json *j, oai_kind kind, oai_error *e) {
    const tdm_json *v = member(j, "echo");
    if (v && !(v->type == TDM_JSON_BOOL && !v->b))
        return oai_fail(e, 400, "echo", "unsupported_parameter", "'echo' is not supported by this server");
    if (kind == OAI_COMPLETION && (v = member(j, "top_logprobs")) && !(v->type == TDM_JSON_NUMBER && v->num == 0))
        return oai_fail(e, 400, "top_logprobs", "unsupported_parameter",
                        "'top_logprobs' is a chat member: a completion takes 'logprobs': N");
    v = member(j, "best_of");
    if (v && !(v->type == TDM_JSON_NUMBER && v->num == 1))
        return oai_fail(e, 400, "best_of", "unsupported_parameter", "'best_of' is not supported by this server (only 1)");
    static const char *const absent[] = {"suffix", "tools", "functions"};
    const size_t n_absent = kind == OAI_CHAT ? 1 : 3; /* (chat: tools and functions are oai_chat.c's) */
    for (size_t i = 0; i < n_absent; i++)
        if (member(j, absent[i]) && !(member(j, absent[i])->type == TDM_JSON_ARRAY && member(j, absent[i])->n == 0))
            return oai_fail(e, 400, absent[i], "unsupported_parameter", "'%s' is not supported by this server", absent[i]);
    return true;
}

/* logit_bias: {"token id": bias in [-100, 100], ...} (at most TANDEM_LOGIT_BIAS_MAX). */
static bool get_logit_bias(const tdm_json *j, const oai_limits *lim, oai_request *r, oai_error *e) {
    const tdm_json *v = member(j, "logit_bias");
    if (!v) return true;
    if (v->type != TDM_JSON_OBJECT) return wrong_type(e, "logit_bias", "an object of token ids to biases", v);
    if (v->n == 0) return true;
    if (v->n > TANDEM_LOGIT_BIAS_MAX)
        return oai_fail(e, 400, "logit_bias", "invalid_value", "'logit_bias' has %zu entries, at most %d", v->n,
                        TANDEM_LOGIT_BIAS_MAX);
    if (!(r->logit_bias = calloc(v->n, sizeof *r->logit_bias))) return oai_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < v->n; i++) {
        const char *k = v->keys[i];
        char *end = NULL;
        const long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id >= lim->n_vocab)
            return oai_fail(e, 400, "logit_bias", "invalid_value", "'logit_bias': key \"%.40s\" is not a token id in [0, %d)",
                            k, lim->n_vocab);
        const tdm_json *b = &v->items[i];
        if (b->type != TDM_JSON_NUMBER || !(b->num >= -100 && b->num <= 100))
            return oai_fail(e, 400, "logit_bias", "invalid_value", "'logit_bias': the bias of token %ld must be a number in [-100, 100]",
                            id);
        for (size_t x = 0; x < i; x++)
            if (r->logit_bias[x].token == (int32_t)id)
                return oai_fail(e, 400, "logit_bias", "invalid_value", "'logit_bias': token %ld is given twice", id);
        r->logit_bias[i] = (tandem_logit_bias){(int32_t)id, (float)b->num};
    }
    r->params.logit_bias = r->logit_bias;
    r->params.n_logit_bias = (int)v->n;
    return true;
}

/* The penalties (OpenAI's presence / frequency, vLLM's repetition_penalty or
 * llama-server's repeat_penalty, vLLM's min_tokens), logit_bias and logprobs (chat:
 * logprobs true and top_logprobs N; completions: logprobs N). */
static bool get_penalties(const tdm_json *j, const oai_limits *lim, oai_request *r, oai_error *e) {
    tandem_generate_params *g = &r->params;
    bool has, has2;
    double x, x2;
    int64_t i;
    if (!get_num(j, "presence_penalty", -2, false, 2, &has, &x, e)) return false;
    if (has) g->presence_penalty = (float)x;
    if (!get_num(j, "frequency_penalty", -2, false, 2, &has, &x, e)) return false;
    if (has) g->frequency_penalty = (float)x;
    if (!get_num(j, "repetition_penalty", 0, true, 100, &has, &x, e)) return false;
    if (!get_num(j, "repeat_penalty", 0, true, 100, &has2, &x2, e)) return false;
    if (has && has2 && x != x2)
        return oai_fail(e, 400, "repeat_penalty", "invalid_value", "give one of 'repetition_penalty' and 'repeat_penalty'");
    if (has || has2) g->repetition_penalty = (float)(has ? x : x2);
    if (!get_int(j, "min_tokens", 0, lim->n_ctx > 1 ? lim->n_ctx - 1 : 1, &has, &i, e)) return false;
    if (has) {
        if (r->has_max_tokens && i > g->max_tokens)
            return oai_fail(e, 400, "min_tokens", "invalid_value", "'min_tokens' %lld is more than 'max_tokens' %d",
                            (long long)i, g->max_tokens);
        g->min_tokens = (int)i;
    }
    if (!get_logit_bias(j, lim, r, e)) return false;
    const tdm_json *lp = member(j, "logprobs");
    if (r->kind == OAI_CHAT) {
        bool on = false;
        if (!get_bool(j, "logprobs", &on, e)) return false;
        if (!get_int(j, "top_logprobs", 0, TANDEM_TOP_LOGPROBS_MAX, &has, &i, e)) return false;
        if (has && i > 0 && !on)
            return oai_fail(e, 400, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
        g->logprobs = on;
        g->top_logprobs = on && has ? (int)i : 0;
    } else if (lp && !(lp->type == TDM_JSON_BOOL && !lp->b)) {
        if (!get_int(j, "logprobs", 0, TANDEM_TOP_LOGPROBS_MAX, &has, &i, e)) return false;
        g->logprobs = true;
        g->top_logprobs = (int)i;
    }
    return true;
}

/* completions: prompt as a string, [string] or [token id, ...]. */
static bool get_prompt(const tdm_json *j, const oai_limits *lim, oai_request *r, oai_error *e) {
    const tdm_json *p = member(j, "prompt");
    if (!p) return oai_fail(e, 400, "prompt", "missing_required_parameter", "'prompt' is required");
    if (p->type == TDM_JSON_ARRAY && p->n == 1 && p->items[0].type == TDM_JSON_STRING) p = &p->items[0];
    if (p->type == TDM_JSON_STRING) {
        if (p->str_len == 0) return oai_fail(e, 400, "prompt", "invalid_value", "'prompt' is empty");
        if (!(r->prompt = tdm_strndup(p->str, p->str_len))) return oai_fail(e, 500, NULL, NULL, "out of memory");
        r->prompt_len = p->str_len;
        return true;
    }
    if (p->type != TDM_JSON_ARRAY) return wrong_type(e, "prompt", "a string or an array of token ids", p);
    if (p->n == 0) return oai_fail(e, 400, "prompt", "invalid_value", "'prompt' is empty");
    if (p->items[0].type == TDM_JSON_STRING || p->items[0].type == TDM_JSON_ARRAY)
        return oai_fail(e, 400, "prompt", "unsupported_value",
                        "'prompt' holds %zu prompts; this server takes one prompt per request", p->n);
    if (!(r->prompt_ids = calloc(p->n, sizeof *r->prompt_ids))) return oai_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; i < p->n; i++) {
        int64_t id;
        if (p->items[i].type != TDM_JSON_NUMBER || !tdm_json_int(&p->items[i], &id) || id < 0 || id >= lim->n_vocab)
            return oai_fail(e, 400, "prompt", "invalid_value",
                            "'prompt'[%zu] is not a token id in [0, %d) (a prompt array holds token ids)", i,
                            lim->n_vocab);
        r->prompt_ids[i] = (int32_t)id;
    }
    r->n_prompt_ids = p->n;
    return true;
}

/* chat: messages and tools (oai_chat.c) into r->chat_json. */
static bool get_chat(const tdm_json *j, oai_request *r, oai_error *e) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    if (!f) return oai_fail(e, 500, NULL, NULL, "out of memory");
    const bool ok = oai_chat_messages(j, r, f, e) && oai_chat_tools(j, r, f, e);
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        free(buf);
        return ok ? oai_fail(e, 500, NULL, NULL, "out of memory") : false;
    }
    if (!ok) {
        free(buf);
        return false;
    }
    r->chat_json = buf;
    return true;
}

static bool get_stop(const tdm_json *j, oai_request *r, oai_error *e) {
    const tdm_json *v = member(j, "stop");
    if (!v) return true;
    char why[160];
    if (!tdm_arg_stop_from_json(v, &r->stop, &r->n_stop, why, sizeof why))
        return oai_fail(e, 400, "stop", "invalid_value", "'stop'%s", why);
    r->params.stop = (const char *const *)r->stop;
    r->params.n_stop = r->n_stop;
    return true;
}

/* seed: the API's uint64, any value; a negative integer (down to -2^63) is taken
 * modulo 2^64. */
static bool get_seed(const tdm_json *j, tandem_generate_params *g, oai_error *e) {
    const tdm_json *v = member(j, "seed");
    if (!v) return true;
    if (v->type != TDM_JSON_NUMBER) return wrong_type(e, "seed", "an integer", v);
    uint64_t u;
    int64_t i;
    if (tdm_json_u64(v, &u)) g->seed = u;
    else if (tdm_json_int(v, &i)) g->seed = (uint64_t)i;
    else
        return oai_fail(e, 400, "seed", "invalid_value", "'seed' must be an integer in [%lld, %llu], not %.64s",
                        (long long)INT64_MIN, (unsigned long long)UINT64_MAX, v->str);
    return true;
}

/* The sampling members, over the server's defaults (the other servers' members that
 * this one does not implement refused first: oai_refused.c). */
static bool get_sampling(const tdm_json *j, const oai_limits *lim, oai_request *r, oai_error *e) {
    if (!oai_check_refused(j, e)) return false;
    tandem_generate_params *g = &r->params;
    bool has;
    int64_t i;
    double x;
    const bool chat = r->kind == OAI_CHAT;
    const char *mt = chat && member(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (!get_int(j, mt, 1, lim->n_ctx > 1 ? lim->n_ctx - 1 : 1, &has, &i, e)) return false;
    if ((r->has_max_tokens = has)) g->max_tokens = (int)i;
    if (!get_num(j, "temperature", 0, false, TEMP_MAX, &has, &x, e)) return false;
    if (has) g->temperature = (float)x;
    if (!get_num(j, "top_p", 0, true, 1, &has, &x, e)) return false;
    if (has) g->top_p = (float)x;
    if (!get_num(j, "min_p", 0, false, 1, &has, &x, e)) return false;
    if (has) g->min_p = (float)x;
    if (!get_int(j, "top_k", -1, INT32_MAX, &has, &i, e)) return false;
    if (has) g->top_k = i < 0 ? 0 : (int)i;
    if (!get_seed(j, g, e)) return false;
    if (!get_int(j, "n", 1, OAI_N_MAX, &has, &i, e)) return false;
    r->n = has ? (int)i : 1;
    if (!get_bool(j, "ignore_eos", &g->ignore_eos, e)) return false;
    return get_stop(j, r, e) && get_penalties(j, lim, r, e);
}

/* spec_tree: null, false, "off" or 0 = chains only; true or "auto" = the controller
 * chooses chain or tree; a node budget (an integer, or its digits as a string); or a
 * static shape ("4,2,2,1"). */
static bool get_spec_tree(const tdm_json *j, const oai_limits *lim, oai_request *r, oai_error *e) {
    const tdm_json *t = member(j, "spec_tree");
    if (!t || t->type == TDM_JSON_NULL) return true;
    int tree = 0;
    const char *shape = NULL;
    if (t->type == TDM_JSON_BOOL) {
        tree = t->b ? TANDEM_SPEC_TREE_AUTO : 0;
    } else if (t->type == TDM_JSON_NUMBER) {
        if (!(t->num >= 0 && t->num <= TANDEM_SPEC_TREE_MAX && t->num == floor(t->num)))
            return oai_fail(e, 400, "spec_tree", "invalid_value",
                            "'spec_tree' is %g; a node budget is an integer in [1, %d] (0: off)", t->num,
                            TANDEM_SPEC_TREE_MAX);
        tree = (int)t->num;
    } else if (t->type == TDM_JSON_STRING) {
        char msg[300] = "a static shape of at most 63 characters";
        if (strlen(t->str) >= sizeof r->spec_tree_shape ||
            !tdm_arg_spec_tree_from_str(t->str, &tree, &shape, msg, sizeof msg))
            return oai_fail(e, 400, "spec_tree", "invalid_value", "'spec_tree': %s", msg);
    } else {
        return wrong_type(e, "spec_tree", "\"off\", \"auto\", a node budget or a static shape such as \"4,2,2,1\"", t);
    }
    if (tree == 0) {
        r->params.spec_tree = 0;
        r->params.spec_tree_shape = NULL;
        return true;
    }
    if (!lim->has_draft)
        return oai_fail(e, 400, "spec_tree", "unsupported_parameter",
                        "'spec_tree' has no effect: this server runs without a draft model");
    if (shape) {
        snprintf(r->spec_tree_shape, sizeof r->spec_tree_shape, "%s", shape);
        r->params.spec_tree = 0;
        r->params.spec_tree_shape = r->spec_tree_shape;
    } else {
        r->params.spec_tree = tree;
        r->params.spec_tree_shape = NULL;
    }
    return true;
}

/* The tandem extensions and streaming. */
static bool get_extensions(const tdm_json *j, const oai_limits *lim, oai_request *r, oai_error *e) {
    bool has;
    int64_t i;
    double x;
    if (!get_bool(j, "stream", &r->stream, e)) return false;
    const tdm_json *so = member(j, "stream_options");
    if (so) {
        if (so->type != TDM_JSON_OBJECT) return wrong_type(e, "stream_options", "an object", so);
        if (!r->stream)
            return oai_fail(e, 400, "stream_options", "invalid_value", "'stream_options' is only allowed with 'stream': true");
        if (!get_bool(so, "include_usage", &r->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return false;
        }
        for (size_t k = 0; k < so->n; k++) { /* (include_obfuscation: this server pads nothing) */
            const char *name = so->keys[k];
            const tdm_json *v = &so->items[k];
            const bool neutral = v->type == TDM_JSON_NULL || !strcmp(name, "include_usage") ||
                                 (!strcmp(name, "include_obfuscation") && v->type == TDM_JSON_BOOL) ||
                                 (!strcmp(name, "continuous_usage_stats") && v->type == TDM_JSON_BOOL && !v->b);
            if (!neutral)
                return oai_fail(e, 400, "stream_options", "unsupported_parameter",
                                "'stream_options.%.40s' is not supported by this server (only include_usage)", name);
        }
    }
    if (!get_int(j, "priority", INT32_MIN, INT32_MAX, &has, &i, e)) return false;
    if (has) r->priority = (int)i;
    if (!get_num(j, "timeout_s", 0, false, TDM_ARG_TIMEOUT_S_MAX, &has, &x, e)) return false;
    r->timeout_ms = lim->timeout_s * 1000.0;
    if (has && x > 0 && (r->timeout_ms == 0 || x * 1000.0 < r->timeout_ms)) r->timeout_ms = x * 1000.0;
    if (!get_int(j, "spec_k", 0, TANDEM_SPEC_K_MAX, &has, &i, e)) return false;
    if (has) {
        if (!lim->has_draft)
            return oai_fail(e, 400, "spec_k", "unsupported_parameter",
                            "'spec_k' has no effect: this server runs without a draft model");
        r->params.spec_k = (int)i;
        if (i > 0 && r->params.spec_k_max < i) r->params.spec_k_max = (int)i;
    }
    return get_spec_tree(j, lim, r, e);
}

/* A JSON value as text (heap); false with e set when out of memory. */
static bool json_text(const tdm_json *v, char **out, oai_error *e) {
    size_t len = 0;
    FILE *m = open_memstream(out, &len);
    if (!m) return oai_fail(e, 500, NULL, NULL, "out of memory");
    tdm_json_write(m, v);
    if (fclose(m) != 0) {
        free(*out);
        *out = NULL;
        return oai_fail(e, 500, NULL, NULL, "out of memory");
    }
    return true;
}

/* response_format json_schema's json_schema: {name, schema?, strict?, description?}. */
static bool get_format_schema(const tdm_json *w, oai_request *r, oai_error *e) {
    const char *P = "response_format";
    if (!w || w->type != TDM_JSON_OBJECT)
        return oai_fail(e, 400, P, "invalid_value",
                        "'response_format.json_schema' must be an object {\"name\", \"schema\", \"strict\"}");
    const tdm_json *name = member(w, "name"), *schema = member(w, "schema"), *strict = member(w, "strict"),
                   *desc = member(w, "description");
    if (!name || name->type != TDM_JSON_STRING)
        return oai_fail(e, 400, P, "invalid_value", "'response_format.json_schema.name' is required (a string)");
    bool name_ok = name->str_len >= 1 && name->str_len <= 64;
    for (size_t i = 0; i < name->str_len && name_ok; i++) {
        const char c = name->str[i];
        name_ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    }
    if (!name_ok)
        return oai_fail(e, 400, P, "invalid_value",
                        "'response_format.json_schema.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -");
    if (strict && strict->type != TDM_JSON_BOOL)
        return oai_fail(e, 400, P, "invalid_type", "'response_format.json_schema.strict' must be a boolean");
    if (desc && desc->type != TDM_JSON_STRING)
        return oai_fail(e, 400, P, "invalid_type", "'response_format.json_schema.description' must be a string");
    if (schema && schema->type != TDM_JSON_OBJECT && schema->type != TDM_JSON_BOOL)
        return oai_fail(e, 400, P, "invalid_type", "'response_format.json_schema.schema' must be an object");
    /* (enforced whether strict or not, as vLLM and llama-server do; no schema: any JSON) */
    if (!schema) return (r->json_schema = tdm_strndup("{}", 2)) ? true : oai_fail(e, 500, NULL, NULL, "out of memory");
    return json_text(schema, &r->json_schema, e);
}

/* The output's constraint: response_format ({"type": "text"}, {"type":
 * "json_object"}: any JSON object, {"type": "json_schema", "json_schema": {...}}) or
 * llama-server's extensions grammar (GBNF text) and json_schema (a schema object);
 * at most one of them.  An invalid grammar or schema is the engine's 400 at
 * submission, naming where. */
static bool get_constraint(const tdm_json *j, oai_request *r, oai_error *e) {
    const tdm_json *rf = member(j, "response_format"), *g = member(j, "grammar"), *js = member(j, "json_schema");
    const char *from = NULL;
    if (rf) {
        const tdm_json *t = rf->type == TDM_JSON_OBJECT ? member(rf, "type") : NULL;
        if (rf->type != TDM_JSON_OBJECT) return wrong_type(e, "response_format", "an object", rf);
        if (!t || t->type != TDM_JSON_STRING)
            return oai_fail(e, 400, "response_format", "invalid_value",
                            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\"");
        if (!strcmp(t->str, "json_object")) {
            if (!(r->json_schema = tdm_strndup("{\"type\":\"object\"}", 17))) return oai_fail(e, 500, NULL, NULL, "out of memory");
            from = "response_format";
        } else if (!strcmp(t->str, "json_schema")) {
            if (!get_format_schema(tdm_json_get(rf, "json_schema"), r, e)) return false;
            from = "response_format";
        } else if (strcmp(t->str, "text") != 0) {
            return oai_fail(e, 400, "response_format", "unsupported_value",
                            "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", not \"%.64s\"",
                            t->str);
        }
    }
    if (g) {
        if (from) return oai_fail(e, 400, "grammar", "invalid_value", "give one of 'response_format', 'grammar' and 'json_schema'");
        if (g->type != TDM_JSON_STRING || strlen(g->str) != g->str_len)
            return wrong_type(e, "grammar", "a string of GBNF text", g);
        if (!(r->grammar = tdm_strndup(g->str, g->str_len))) return oai_fail(e, 500, NULL, NULL, "out of memory");
        from = "grammar";
    }
    if (js) {
        if (from)
            return oai_fail(e, 400, "json_schema", "invalid_value", "give one of 'response_format', 'grammar' and 'json_schema'");
        if (js->type != TDM_JSON_OBJECT && js->type != TDM_JSON_BOOL) return wrong_type(e, "json_schema", "an object", js);
        if (!json_text(js, &r->json_schema, e)) return false;
    }
    r->params.grammar = r->grammar;
    r->params.json_schema = r->json_schema;
    return true;
}

bool oai_request_parse(oai_kind kind, const char *body, size_t len, const oai_limits *lim, oai_request *r,
                       oai_error *e) {
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    r->kind = kind;
    r->params = lim->defaults;
    r->params.stop = NULL;
    r->params.n_stop = 0;
    r->params.on_token = NULL;
    r->params.user_data = NULL;
    r->params.grammar = r->params.json_schema = NULL;
    r->params.logit_bias = NULL;
    r->params.n_logit_bias = 0;
    r->params.on_token_lp = NULL;
    tdm_json *j = NULL;
    tdm_err jerr = {0};
    if (tdm_json_parse(body, len, &j, &jerr) != TANDEM_OK)
        return oai_fail(e, 400, NULL, "invalid_json", "the body is not valid JSON: %s", jerr.msg);
    bool ok;
    if (j->type != TDM_JSON_OBJECT) {
        ok = oai_fail(e, 400, NULL, "invalid_type", "the body must be a JSON object, not %s", type_name(j));
    } else {
        const tdm_json *m = member(j, "model");
        ok = true;
        if (m && m->type != TDM_JSON_STRING) ok = wrong_type(e, "model", "a string", m);
        else if (m && (m->str_len != strlen(lim->model_id) || memcmp(m->str, lim->model_id, m->str_len) != 0))
            ok = oai_fail(e, 404, "model", "model_not_found", "The model '%.*s' does not exist (this server serves '%s')",
                          (int)(m->str_len > 200 ? 200 : m->str_len), m->str, lim->model_id);
        ok = ok && (kind == OAI_CHAT ? get_chat(j, r, e) : get_prompt(j, lim, r, e));
        ok = ok && check_unsupported(j, kind, e) && get_sampling(j, lim, r, e) && get_extensions(j, lim, r, e);
        ok = ok && get_constraint(j, r, e);
    }
    tdm_json_free(j);
    if (!ok) oai_request_free(r);
    return ok;
}

bool oai_fit_context(oai_request *r, size_t n_prompt, const oai_limits *lim, oai_error *e) {
    const size_t n_ctx = lim->n_ctx > 0 ? (size_t)lim->n_ctx : 0;
    const char *what = r->kind == OAI_CHAT ? "messages" : "prompt";
    if (n_prompt >= n_ctx)
        return oai_fail(e, 400, what, "context_length_exceeded",
                        "This model's maximum context length is %zu tokens. However, your %s is %zu tokens, which "
                        "leaves no room for a completion", n_ctx, what, n_prompt);
    const size_t room = n_ctx - n_prompt;
    if (r->has_max_tokens && (size_t)r->params.max_tokens > room)
        return oai_fail(e, 400, "max_tokens", "context_length_exceeded",
                        "This model's maximum context length is %zu tokens. However, you requested %zu tokens (%zu "
                        "in the %s, %d in the completion)", n_ctx, n_prompt + (size_t)r->params.max_tokens, n_prompt,
                        what, r->params.max_tokens);
    if (!r->has_max_tokens && (size_t)r->params.max_tokens > room) r->params.max_tokens = (int)room;
    return true;
}

void oai_request_free(oai_request *r) {
    if (!r) return;
    free(r->prompt);
    free(r->prompt_ids);
    for (size_t i = 0; i < r->n_messages; i++) {
        free((char *)r->messages[i].role);
        free((char *)r->messages[i].content);
    }
    free(r->messages);
    free(r->chat_json);
    for (size_t i = 0; i < r->n_tools; i++) {
        free(r->tool_names[i]);
        if (r->tool_params) free(r->tool_params[i]);
    }
    free(r->tool_names);
    free(r->tool_params);
    tdm_arg_stop_free(r->stop, r->n_stop);
    free(r->logit_bias);
    free(r->grammar);
    free(r->json_schema);
    memset(r, 0, sizeof *r);
}
