/* oai_chat.c - a chat request's conversation and tools (oai_request.h): messages with
 * every member the chat templates use, tools, tool_choice and parallel_tool_calls,
 * validated and written as the JSON that tandem_chat_render_json renders. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "oai_request.h"

#define BAD "invalid_request_error"

static const char *type_name(const tdm_json *v) {
    static const char *const names[] = {"null", "a boolean", "a number", "a string", "an array", "an object"};
    return v->type <= TDM_JSON_OBJECT ? names[v->type] : "?";
}

static const tdm_json *member(const tdm_json *j, const char *name) {
    const tdm_json *v = tdm_json_get(j, name);
    return v && v->type != TDM_JSON_NULL ? v : NULL;
}

static bool is_text(const tdm_json *v) { return v->type == TDM_JSON_STRING && !memchr(v->str, '\0', v->str_len); }

static void str(FILE *f, const char *s, size_t n) { tdm_json_write_str(f, s, n); }

/* A message's content: a string, null, or text parts joined (heap; *out NULL for null). */
static bool message_content(const tdm_json *c, size_t i, char **out, oai_error *e) {
    *out = NULL;
    if (!c || c->type == TDM_JSON_NULL) return true;
    if (c->type == TDM_JSON_STRING) {
        if (memchr(c->str, '\0', c->str_len))
            return oai_fail(e, 400, "messages", "invalid_value", "'messages'[%zu].content holds a NUL character", i);
        return (*out = tdm_strndup(c->str, c->str_len)) ? true : oai_fail(e, 500, NULL, NULL, "out of memory");
    }
    if (c->type != TDM_JSON_ARRAY)
        return oai_fail(e, 400, "messages", "invalid_type",
                        "'messages'[%zu].content must be a string, null or an array of text parts, not %s", i,
                        type_name(c));
    size_t total = 0;
    for (size_t k = 0; k < c->n; k++) {
        const tdm_json *part = &c->items[k], *t = tdm_json_get(part, "type"), *text = tdm_json_get(part, "text");
        if (part->type != TDM_JSON_OBJECT || !t || t->type != TDM_JSON_STRING || strcmp(t->str, "text") != 0 ||
            !text || !is_text(text))
            return oai_fail(e, 400, "messages", "unsupported_value",
                            "'messages'[%zu].content[%zu] is not a text part ({\"type\": \"text\", \"text\": "
                            "\"...\"}; only text is supported)", i, k);
        total += text->str_len;
    }
    char *s = malloc(total + 1);
    if (!s) return oai_fail(e, 500, NULL, NULL, "out of memory");
    size_t at = 0;
    for (size_t k = 0; k < c->n; k++) {
        const tdm_json *text = tdm_json_get(&c->items[k], "text");
        memcpy(s + at, text->str, text->str_len);
        at += text->str_len;
    }
    s[at] = '\0';
    *out = s;
    return true;
}

/* An optional string member of messages[i] written as ", "name": ...". */
static bool opt_string(FILE *f, const tdm_json *msg, const char *name, size_t i, oai_error *e) {
    const tdm_json *v = member(msg, name);
    if (!v) return true;
    if (!is_text(v))
        return oai_fail(e, 400, "messages", "invalid_type", "'messages'[%zu].%s must be a string, not %s", i, name,
                        type_name(v));
    fprintf(f, ", \"%s\": ", name);
    str(f, v->str, v->str_len);
    return true;
}

/* messages[i].tool_calls: [{id, type: "function", function: {name, arguments}}], the
 * arguments (a JSON object's text, as OpenAI sends them; "" is {}) written as the object
 * the templates print with tojson (as vLLM and llama-server pass them). */
static bool tool_calls(FILE *f, const tdm_json *tc, size_t i, oai_error *e) {
    if (tc->type != TDM_JSON_ARRAY)
        return oai_fail(e, 400, "messages", "invalid_type", "'messages'[%zu].tool_calls must be an array, not %s", i,
                        type_name(tc));
    fputs(", \"tool_calls\": [", f);
    for (size_t k = 0; k < tc->n; k++) {
        const tdm_json *c = &tc->items[k];
        if (c->type != TDM_JSON_OBJECT)
            return oai_fail(e, 400, "messages", "invalid_type", "'messages'[%zu].tool_calls[%zu] must be an object, not %s",
                            i, k, type_name(c));
        const tdm_json *id = member(c, "id"), *type = member(c, "type"), *fn = member(c, "function");
        if (id && !is_text(id))
            return oai_fail(e, 400, "messages", "invalid_type", "'messages'[%zu].tool_calls[%zu].id must be a string", i, k);
        if (type && !(type->type == TDM_JSON_STRING && strcmp(type->str, "function") == 0))
            return oai_fail(e, 400, "messages", "invalid_value",
                            "'messages'[%zu].tool_calls[%zu].type must be \"function\"", i, k);
        if (!fn || fn->type != TDM_JSON_OBJECT)
            return oai_fail(e, 400, "messages", "invalid_type",
                            "'messages'[%zu].tool_calls[%zu].function must be an object ({\"name\", \"arguments\"})", i, k);
        const tdm_json *name = member(fn, "name"), *args = member(fn, "arguments");
        if (!name || !is_text(name) || name->str_len == 0)
            return oai_fail(e, 400, "messages", "invalid_value",
                            "'messages'[%zu].tool_calls[%zu].function.name must be a non-empty string", i, k);
        tdm_json *parsed = NULL;
        if (args && args->type == TDM_JSON_STRING && args->str_len > 0) {
            tdm_err err = {0};
            if (tdm_json_parse(args->str, args->str_len, &parsed, &err) != TANDEM_OK || parsed->type != TDM_JSON_OBJECT) {
                tdm_json_free(parsed);
                return oai_fail(e, 400, "messages", "invalid_value",
                                "'messages'[%zu].tool_calls[%zu].function.arguments is not the text of a JSON object",
                                i, k);
            }
            args = parsed;
        } else if (args && args->type == TDM_JSON_STRING) {
            args = NULL; /* "": no arguments */
        } else if (args && args->type != TDM_JSON_OBJECT) {
            return oai_fail(e, 400, "messages", "invalid_type",
                            "'messages'[%zu].tool_calls[%zu].function.arguments must be a string, not %s", i, k,
                            type_name(args));
        }
        fputs(k ? ", {" : "{", f);
        if (id) {
            fputs("\"id\": ", f);
            str(f, id->str, id->str_len);
            fputs(", ", f);
        }
        fputs("\"type\": \"function\", \"function\": {\"name\": ", f);
        str(f, name->str, name->str_len);
        fputs(", \"arguments\": ", f);
        if (args) tdm_json_write(f, args);
        else fputs("{}", f);
        fputs("}}", f);
        tdm_json_free(parsed);
    }
    fputc(']', f);
    return true;
}

bool oai_chat_messages(const tdm_json *j, oai_request *r, FILE *f, oai_error *e) {
    const tdm_json *m = member(j, "messages");
    if (!m) return oai_fail(e, 400, "messages", "missing_required_parameter", "'messages' is required");
    if (m->type != TDM_JSON_ARRAY)
        return oai_fail(e, 400, "messages", "invalid_type", "'messages' must be an array of messages, not %s",
                        type_name(m));
    if (m->n == 0) return oai_fail(e, 400, "messages", "invalid_value", "'messages' is empty");
    if (!(r->messages = calloc(m->n, sizeof *r->messages))) return oai_fail(e, 500, NULL, NULL, "out of memory");
    r->n_messages = m->n;
    fputs("{\"messages\": [", f);
    for (size_t i = 0; i < m->n; i++) {
        const tdm_json *msg = &m->items[i], *role = tdm_json_get(msg, "role");
        if (msg->type != TDM_JSON_OBJECT)
            return oai_fail(e, 400, "messages", "invalid_type", "'messages'[%zu] must be an object, not %s", i,
                            type_name(msg));
        if (!role || role->type != TDM_JSON_STRING || role->str_len == 0 || memchr(role->str, '\0', role->str_len))
            return oai_fail(e, 400, "messages", "invalid_value", "'messages'[%zu].role must be a non-empty string", i);
        char *content;
        if (!message_content(tdm_json_get(msg, "content"), i, &content, e)) return false;
        r->messages[i].content = content;
        if (!(r->messages[i].role = tdm_strndup(role->str, role->str_len)))
            return oai_fail(e, 500, NULL, NULL, "out of memory");
        fputs(i ? ", {\"role\": " : "{\"role\": ", f);
        str(f, role->str, role->str_len);
        fputs(", \"content\": ", f);
        if (content) str(f, content, strlen(content));
        else fputs("null", f);
        if (!opt_string(f, msg, "name", i, e) || !opt_string(f, msg, "tool_call_id", i, e) ||
            !opt_string(f, msg, "reasoning_content", i, e))
            return false;
        const tdm_json *tc = member(msg, "tool_calls");
        if (tc && !tool_calls(f, tc, i, e)) return false;
        fputc('}', f);
    }
    fputc(']', f);
    return true;
}

/* A function's name as OpenAI allows it: 1 to 64 of a-z, A-Z, 0-9, '_', '-'. */
static bool good_name(const tdm_json *v) {
    if (v->type != TDM_JSON_STRING || v->str_len == 0 || v->str_len > 64) return false;
    for (size_t i = 0; i < v->str_len; i++) {
        const char c = v->str[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return true;
}

/* tools: [{type: "function", function: {name, description?, parameters?, strict?}}];
 * *any_strict: a tool asks for strict arguments. */
static bool get_tools(const tdm_json *j, oai_request *r, bool *any_strict, oai_error *e) {
    const tdm_json *t = member(j, "tools");
    if (!t) return true;
    if (t->type != TDM_JSON_ARRAY)
        return oai_fail(e, 400, "tools", "invalid_type", "'tools' must be an array, not %s", type_name(t));
    for (size_t k = 0; k < t->n; k++) {
        const tdm_json *tool = &t->items[k], *type = member(tool, "type"), *fn = member(tool, "function");
        if (tool->type != TDM_JSON_OBJECT)
            return oai_fail(e, 400, "tools", "invalid_type", "'tools'[%zu] must be an object, not %s", k, type_name(tool));
        if (!type || type->type != TDM_JSON_STRING || strcmp(type->str, "function") != 0)
            return oai_fail(e, 400, "tools", "unsupported_value",
                            "'tools'[%zu].type must be \"function\" (the only tool type)", k);
        if (!fn || fn->type != TDM_JSON_OBJECT)
            return oai_fail(e, 400, "tools", "invalid_type", "'tools'[%zu].function must be an object", k);
        const tdm_json *name = member(fn, "name"), *desc = member(fn, "description"), *params = member(fn, "parameters"),
                       *strict = member(fn, "strict");
        if (!name || !good_name(name))
            return oai_fail(e, 400, "tools", "invalid_value",
                            "'tools'[%zu].function.name must be 1 to 64 letters, digits, '_' or '-'", k);
        for (size_t p = 0; p < k; p++)
            if (!strcmp(tdm_json_get(tdm_json_get(&t->items[p], "function"), "name")->str, name->str))
                return oai_fail(e, 400, "tools", "invalid_value", "'tools'[%zu].function.name '%s' is given twice", k,
                                name->str);
        if (desc && !is_text(desc))
            return oai_fail(e, 400, "tools", "invalid_type", "'tools'[%zu].function.description must be a string", k);
        if (params && params->type != TDM_JSON_OBJECT)
            return oai_fail(e, 400, "tools", "invalid_type",
                            "'tools'[%zu].function.parameters must be an object (a JSON schema)", k);
        if (strict && strict->type != TDM_JSON_BOOL)
            return oai_fail(e, 400, "tools", "invalid_type", "'tools'[%zu].function.strict must be a boolean", k);
        if (strict && strict->b) *any_strict = true;
    }
    if (!t->n) return true;
    r->tool_names = calloc(t->n, sizeof *r->tool_names);
    r->tool_params = calloc(t->n, sizeof *r->tool_params);
    r->n_tools = t->n; /* (oai_request_free frees what was made) */
    if (!r->tool_names || !r->tool_params) return oai_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t k = 0; k < t->n; k++) {
        const tdm_json *fn = tdm_json_get(&t->items[k], "function"), *name = tdm_json_get(fn, "name"),
                       *params = tdm_json_get(fn, "parameters");
        if (!(r->tool_names[k] = tdm_strndup(name->str, name->str_len)) || (params && !(r->tool_params[k] = tdm_json_text(params))))
            return oai_fail(e, 500, NULL, NULL, "out of memory");
    }
    return true;
}

/* tool_choice: "none", "auto", "required" or a named function ({"type": "function",
 * "function": {"name": one of the tools}}); parallel_tool_calls: a boolean.  Strict
 * tools are enforced with "required" or a named function (the calls' grammar holds
 * their schemas); with "auto" the model may answer in text, which no grammar bounds
 * here: refused rather than not enforced. */
static bool get_tool_choice(const tdm_json *j, oai_request *r, bool any_strict, oai_error *e) {
    r->tool_choice = r->n_tools ? OAI_TOOLS_AUTO : OAI_TOOLS_NONE;
    r->parallel_tool_calls = true;
    const tdm_json *v = member(j, "parallel_tool_calls");
    if (v) {
        if (v->type != TDM_JSON_BOOL)
            return oai_fail(e, 400, "parallel_tool_calls", "invalid_type", "'parallel_tool_calls' must be a boolean, not %s",
                            type_name(v));
        r->parallel_tool_calls = v->b;
    }
    const tdm_json *c = member(j, "tool_choice");
    const bool is_none = c && c->type == TDM_JSON_STRING && !strcmp(c->str, "none");
    const bool is_auto = !c || (c->type == TDM_JSON_STRING && !strcmp(c->str, "auto"));
    const bool named = c && c->type == TDM_JSON_OBJECT;
    if (any_strict && (is_auto || is_none))
        return oai_fail(e, 400, "tools", "unsupported_value",
                        "a tool with strict: true needs tool_choice \"required\" or a named function (where a grammar "
                        "holds the calls to their schemas); with \"%s\" the arguments would not be enforced",
                        is_none ? "none" : "auto");
    if (is_none) {
        r->tool_choice = OAI_TOOLS_NONE;
        return true;
    }
    if (is_auto) return true;
    if ((c->type == TDM_JSON_STRING && !strcmp(c->str, "required")) || named) {
        if (!r->n_tools)
            return oai_fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' %s needs 'tools'",
                            named ? "naming a function" : "\"required\"");
        if (!named) {
            r->tool_choice = OAI_TOOLS_REQUIRED;
            return true;
        }
        const tdm_json *type = member(c, "type"), *fn = member(c, "function"), *name = fn ? member(fn, "name") : NULL;
        if (!type || type->type != TDM_JSON_STRING || strcmp(type->str, "function") != 0 || !name ||
            name->type != TDM_JSON_STRING)
            return oai_fail(e, 400, "tool_choice", "invalid_value",
                            "'tool_choice' naming a function must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
        for (size_t k = 0; k < r->n_tools; k++)
            if (!strcmp(r->tool_names[k], name->str)) {
                r->tool_choice = OAI_TOOLS_NAMED;
                r->tool_named = (int)k;
                return true;
            }
        return oai_fail(e, 400, "tool_choice", "invalid_value", "'tool_choice' names '%s', which is not among 'tools'",
                        name->str);
    }
    return oai_fail(e, 400, "tool_choice", "invalid_value",
                    "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": "
                    "{\"name\": ...}}");
}

bool oai_chat_tools(const tdm_json *j, oai_request *r, FILE *f, oai_error *e) {
    if (member(j, "functions") || member(j, "function_call")) {
        const char *which = member(j, "functions") ? "functions" : "function_call";
        return oai_fail(e, 400, which, "unsupported_parameter",
                        "'%s' (deprecated by OpenAI) is not supported by this server: use 'tools' and 'tool_choice'",
                        which);
    }
    bool any_strict = false;
    if (!get_tools(j, r, &any_strict, e) || !get_tool_choice(j, r, any_strict, e)) return false;
    if (r->tool_choice != OAI_TOOLS_NONE) {
        fputs(", \"tools\": ", f);
        tdm_json_write(f, member(j, "tools"));
    }
    fputc('}', f);
    return true;
}
