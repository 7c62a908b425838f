/* tool_calls.c - a model's output text parsed into tool calls (tool_calls.h). */
#include "tool_calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#define HERMES_OPEN "<tool_call>"
#define HERMES_CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"
#define MISTRAL_CALLS "[TOOL_CALLS]"
#define MISTRAL_ARGS "[ARGS]"

const char tdm_tool_probe_json[] =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"probe\"}, {\"role\": \"assistant\", \"content\": null, "
    "\"tool_calls\": [{\"id\": \"callprob1\", \"type\": \"function\", \"function\": {\"name\": \"tdm_probe_fn\", "
    "\"arguments\": \"{\\\"tdm_probe_arg\\\": 1}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"callprob1\", "
    "\"name\": \"tdm_probe_fn\", \"content\": \"1\"}], \"tools\": [{\"type\": \"function\", \"function\": {\"name\": "
    "\"tdm_probe_fn\", \"description\": \"probe\", \"parameters\": {\"type\": \"object\", \"properties\": "
    "{\"tdm_probe_arg\": {\"type\": \"integer\"}}}}}]}";

size_t tdm_tool_format_markers(tdm_tool_format f, const char *const **out) {
    static const char *const hermes[] = {HERMES_OPEN, HERMES_CLOSE}, *const llama3[] = {PYTHON_TAG},
                             *const mistral[] = {MISTRAL_CALLS, MISTRAL_ARGS};
    switch (f) {
    case TDM_TOOL_FORMAT_HERMES: return *out = hermes, 2;
    case TDM_TOOL_FORMAT_LLAMA3: return *out = llama3, 1;
    case TDM_TOOL_FORMAT_MISTRAL: return *out = mistral, 2;
    case TDM_TOOL_FORMAT_NONE: break;
    }
    *out = NULL;
    return 0;
}

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"

const char tdm_think_probe_json[] =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"probe\"}, {\"role\": \"assistant\", \"content\": "
    "\"tdm_probe_answer\", \"reasoning_content\": \"tdm_probe_reasoning\"}]}";

const char *tdm_tool_format_name(tdm_tool_format f) {
    switch (f) {
    case TDM_TOOL_FORMAT_HERMES: return "hermes";
    case TDM_TOOL_FORMAT_LLAMA3: return "llama3";
    case TDM_TOOL_FORMAT_MISTRAL: return "mistral";
    case TDM_TOOL_FORMAT_NONE: break;
    }
    return "none";
}

/* The first occurrence of needle in s[0..len), or len. */
static size_t find(const char *s, size_t len, size_t from, const char *needle) {
    const size_t n = strlen(needle);
    for (size_t i = from; i + n <= len; i++)
        if (s[i] == needle[0] && memcmp(s + i, needle, n) == 0) return i;
    return len;
}

static bool starts(const char *s, size_t len, size_t at, const char *needle) {
    const size_t n = strlen(needle);
    return at + n <= len && memcmp(s + at, needle, n) == 0;
}

tdm_tool_format tdm_tool_format_detect(const char *r, size_t len) {
    if (find(r, len, 0, MISTRAL_CALLS) < len) return TDM_TOOL_FORMAT_MISTRAL;
    const size_t call = find(r, len, 0, "tdm_probe_fn\"");
    if (call == len) return TDM_TOOL_FORMAT_NONE;
    /* the rendered call: the last mention of the function's name with its argument */
    size_t at = call, next;
    while ((next = find(r, len, at + 1, "tdm_probe_fn\"")) < len) at = next;
    if (find(r, len, 0, HERMES_OPEN) < len) return TDM_TOOL_FORMAT_HERMES;
    if (find(r, len, 0, PYTHON_TAG) < len || find(r, len, at, "\"parameters\"") < len)
        return TDM_TOOL_FORMAT_LLAMA3;
    return TDM_TOOL_FORMAT_NONE;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t len, size_t at) {
    while (at < len && is_ws(s[at])) at++;
    return at;
}

bool tdm_think_detect(const char *r, size_t len) {
    const size_t open = find(r, len, 0, THINK_OPEN), reason = find(r, len, open, "tdm_probe_reasoning");
    return open < len && reason < len && find(r, len, reason, THINK_CLOSE) < len;
}

static size_t marker_or_tail(const char *s, size_t len, const char *marker);

tdm_think_split tdm_think_split_text(const char *s, size_t len, bool whole) {
    tdm_think_split t = {.content_at = 0};
    const size_t first = skip_ws(s, len, 0), rest = len - first, n = strlen(THINK_OPEN);
    if (!whole && rest < n && (rest == 0 || memcmp(s + first, THINK_OPEN, rest) == 0)) { /* (whitespace, part of <think>) */
        t.content_at = len;
        return t;
    }
    t.decided = true;
    if (rest < n || memcmp(s + first, THINK_OPEN, n) != 0) return t;
    t.has = true;
    t.reason_at = skip_ws(s, len, first + n);
    const size_t close = find(s, len, t.reason_at, THINK_CLOSE);
    size_t end = close < len ? close : marker_or_tail(s, len, THINK_CLOSE);
    if (close == len && end < t.reason_at) end = t.reason_at;
    while (end > t.reason_at && is_ws(s[end - 1])) end--;
    t.reason_len = end - t.reason_at;
    t.reason_safe = t.reason_len;
    t.content_at = close < len ? skip_ws(s, len, close + strlen(THINK_CLOSE)) : len;
    return t;
}

/* The end (exclusive) of the JSON object or array that begins at s[at], found by its
 * brackets outside strings; 0 when it does not end within len. */
static size_t json_end(const char *s, size_t len, size_t at) {
    int depth = 0;
    bool in_str = false;
    for (size_t i = at; i < len; i++) {
        const char c = s[i];
        if (in_str) {
            if (c == '\\') i++;
            else if (c == '"') in_str = false;
        } else if (c == '"') {
            in_str = true;
        } else if (c == '{' || c == '[') {
            if (++depth > TDM_JSON_MAX_DEPTH) return 0;
        } else if (c == '}' || c == ']') {
            if (--depth == 0) return i + 1;
        }
    }
    return 0;
}

/* ---- the result being built ---- */

typedef struct build {
    tdm_tool_call *calls;
    size_t n, cap;
    char *content; /* joined pieces */
    size_t content_len;
    bool oom;
} build;

static void free_calls(tdm_tool_call *c, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(c[i].name);
        free(c[i].arguments);
    }
    free(c);
}

static void build_free(build *b) {
    free_calls(b->calls, b->n);
    free(b->content);
    memset(b, 0, sizeof *b);
}

/* Appends text[a..z) with the whitespace next to calls removed (at its end, and at its
 * start unless it begins the text, which streaming may have sent), after a newline
 * when content is there already. */
static void add_content(build *b, const char *s, size_t a, size_t z) {
    if (a > 0) a = skip_ws(s, z, a);
    while (z > a && is_ws(s[z - 1])) z--;
    if (z == a || b->oom) return;
    const size_t sep = b->content_len ? 1 : 0;
    char *c = realloc(b->content, b->content_len + sep + (z - a) + 1);
    if (!c) {
        b->oom = true;
        return;
    }
    if (sep) c[b->content_len] = '\n';
    memcpy(c + b->content_len + sep, s + a, z - a);
    b->content_len += sep + (z - a);
    c[b->content_len] = '\0';
    b->content = c;
}

/* Adds the call of name (a JSON string) and args (an object, a string holding one, or
 * NULL: {}); false when they are not a call. */
static bool add_call_parts(build *b, const tdm_json *name, const tdm_json *args) {
    if (!name || name->type != TDM_JSON_STRING || name->str_len == 0 || memchr(name->str, '\0', name->str_len))
        return false;
    char *a = NULL;
    if (!args || args->type == TDM_JSON_NULL) {
        a = strdup("{}");
    } else if (args->type == TDM_JSON_OBJECT) {
        a = tdm_json_text(args);
    } else if (args->type == TDM_JSON_STRING) {
        tdm_json *inner = NULL;
        tdm_err err = {0};
        if (tdm_json_parse(args->str, args->str_len, &inner, &err) != TANDEM_OK) return false;
        const bool obj = inner->type == TDM_JSON_OBJECT;
        if (obj) a = tdm_json_text(inner);
        tdm_json_free(inner);
        if (!obj) return false;
    } else {
        return false;
    }
    if (b->n == b->cap) {
        const size_t nc = b->cap ? b->cap * 2 : 4;
        tdm_tool_call *c = realloc(b->calls, nc * sizeof *c);
        if (!c) {
            free(a);
            b->oom = true;
            return true;
        }
        b->calls = c;
        b->cap = nc;
    }
    char *nm = strndup(name->str, name->str_len);
    if (!a || !nm) {
        free(a);
        free(nm);
        b->oom = true;
        return true;
    }
    b->calls[b->n++] = (tdm_tool_call){.name = nm, .arguments = a};
    return true;
}

/* A call object {"name": ..., "arguments" | "parameters": ...}. */
static bool add_call(build *b, const tdm_json *o) {
    if (o->type != TDM_JSON_OBJECT) return false;
    const tdm_json *args = tdm_json_get(o, "arguments");
    if (!args) args = tdm_json_get(o, "parameters");
    return add_call_parts(b, tdm_json_get(o, "name"), args);
}

/* The JSON value at s[at] (an object or array): parsed into *out, *end after it. */
static bool json_at(const char *s, size_t len, size_t at, tdm_json **out, size_t *end) {
    if (at >= len || (s[at] != '{' && s[at] != '[')) return false;
    const size_t z = json_end(s, len, at);
    if (!z) return false;
    tdm_err err = {0};
    if (tdm_json_parse(s + at, z - at, out, &err) != TANDEM_OK) return false;
    *end = z;
    return true;
}

/* An object call at s[at]; *end after it. */
static bool object_call_at(build *b, const char *s, size_t len, size_t at, size_t *end) {
    tdm_json *o = NULL;
    if (!json_at(s, len, at, &o, end)) return false;
    const bool ok = add_call(b, o);
    tdm_json_free(o);
    return ok;
}

/* ---- the formats: each fills b and returns false when the text is not calls ---- */

/* The whole output as call objects, bare or in one ```json / ``` fence, each naming
 * one of names[n_names]. */
static bool parse_bare(build *b, const char *s, size_t len, const char *const *names, size_t n_names) {
    size_t at = skip_ws(s, len, 0);
    bool fenced = false;
    if (starts(s, len, at, "```json\n") || starts(s, len, at, "```\n")) {
        fenced = true;
        at = skip_ws(s, len, find(s, len, at, "\n"));
    }
    if (n_names == 0 || at == len || s[at] != '{') return false;
    while (at < len && s[at] == '{') {
        size_t end;
        const size_t before = b->n;
        if (!object_call_at(b, s, len, at, &end)) return false;
        bool known = false;
        for (size_t i = 0; b->n > before && i < n_names && !known; i++) known = !strcmp(b->calls[before].name, names[i]);
        if (b->n > before && !known) return false;
        at = skip_ws(s, len, end);
    }
    if (fenced && starts(s, len, at, "```")) at = skip_ws(s, len, at + 3);
    return at == len;
}

static bool parse_hermes(build *b, const char *s, size_t len, const char *const *names, size_t n_names) {
    size_t m = find(s, len, 0, HERMES_OPEN), from = 0;
    if (m == len) return parse_bare(b, s, len, names, n_names);
    while (m < len) {
        add_content(b, s, from, m);
        size_t at = skip_ws(s, len, m + strlen(HERMES_OPEN)), end;
        if (!object_call_at(b, s, len, at, &end)) return false;
        at = skip_ws(s, len, end);
        if (starts(s, len, at, HERMES_CLOSE)) at += strlen(HERMES_CLOSE);
        else if (at != len) return false;
        from = at;
        m = find(s, len, at, HERMES_OPEN);
    }
    add_content(b, s, from, len);
    return true;
}

static bool parse_llama3(build *b, const char *s, size_t len) {
    size_t at = find(s, len, 0, PYTHON_TAG);
    if (at < len) {
        add_content(b, s, 0, at);
        at += strlen(PYTHON_TAG);
    } else {
        at = 0;
    }
    at = skip_ws(s, len, at);
    if (at == len || s[at] != '{') return false;
    while (at < len) {
        size_t end;
        if (!object_call_at(b, s, len, at, &end)) return false;
        at = skip_ws(s, len, end);
        if (at < len && s[at] == ';') at = skip_ws(s, len, at + 1);
    }
    return true;
}

static bool parse_mistral(build *b, const char *s, size_t len) {
    size_t m = find(s, len, 0, MISTRAL_CALLS), from = 0;
    if (m == len) return false;
    while (m < len) {
        add_content(b, s, from, m);
        size_t at = m + strlen(MISTRAL_CALLS), end;
        const size_t first = skip_ws(s, len, at);
        if (first < len && s[first] == '[') { /* v3: an array of call objects */
            tdm_json *arr = NULL;
            if (!json_at(s, len, first, &arr, &end)) return false;
            bool ok = arr->type == TDM_JSON_ARRAY && arr->n > 0;
            for (size_t i = 0; ok && i < arr->n; i++) ok = add_call(b, &arr->items[i]);
            tdm_json_free(arr);
            if (!ok) return false;
        } else { /* v11: NAME[ARGS]{...} */
            const size_t args = find(s, len, at, MISTRAL_ARGS);
            if (args == len || args == at) return false;
            for (size_t i = at; i < args; i++)
                if (is_ws(s[i]) || s[i] == '[' || s[i] == '{') return false;
            tdm_json *o = NULL;
            if (!json_at(s, len, args + strlen(MISTRAL_ARGS), &o, &end)) return false;
            const tdm_json name = {.type = TDM_JSON_STRING, .str = (char *)s + at, .str_len = args - at};
            const bool ok = o->type == TDM_JSON_OBJECT && add_call_parts(b, &name, o);
            tdm_json_free(o);
            if (!ok) return false;
        }
        from = end;
        m = find(s, len, end, MISTRAL_CALLS);
    }
    add_content(b, s, from, len);
    return true;
}

tandem_status tdm_tool_calls_parse(tdm_tool_format f, const char *text, size_t len, const char *const *names,
                                   size_t n_names, tdm_tool_parse *out) {
    memset(out, 0, sizeof *out);
    build b = {0};
    bool calls = false;
    switch (f) {
    case TDM_TOOL_FORMAT_HERMES: calls = parse_hermes(&b, text, len, names, n_names); break;
    case TDM_TOOL_FORMAT_LLAMA3: calls = parse_llama3(&b, text, len); break;
    case TDM_TOOL_FORMAT_MISTRAL: calls = parse_mistral(&b, text, len); break;
    case TDM_TOOL_FORMAT_NONE: break;
    }
    if (b.oom) {
        build_free(&b);
        return TANDEM_ERR_NOMEM;
    }
    if (calls && b.n > 0) {
        out->content = b.content;
        out->calls = b.calls;
        out->n_calls = b.n;
        return TANDEM_OK;
    }
    build_free(&b);
    if (!(out->content = malloc(len + 1))) return TANDEM_ERR_NOMEM;
    memcpy(out->content, text, len);
    out->content[len] = '\0';
    return TANDEM_OK;
}

void tdm_tool_parse_free(tdm_tool_parse *p) {
    if (!p) return;
    free_calls(p->calls, p->n_calls);
    free(p->content);
    memset(p, 0, sizeof *p);
}

/* Where a marker begins in s[0..len), or where a tail that may begin one starts
 * (len: neither). */
static size_t marker_or_tail(const char *s, size_t len, const char *marker) {
    const size_t at = find(s, len, 0, marker), n = strlen(marker);
    if (at < len) return at;
    for (size_t k = n - 1; k > 0; k--)
        if (k <= len && memcmp(s + len - k, marker, k) == 0) return len - k;
    return len;
}

size_t tdm_tool_calls_stream_safe(tdm_tool_format f, const char *s, size_t len) {
    size_t safe = len;
    switch (f) {
    case TDM_TOOL_FORMAT_NONE: return len;
    case TDM_TOOL_FORMAT_HERMES: {
        /* an output that begins as a bare call or a fence may be calls, whole */
        const size_t first = skip_ws(s, len, 0), rest = len - first;
        if (first == len || s[first] == '{' || memcmp(s + first, "```json\n", rest < 8 ? rest : 8) == 0 ||
            memcmp(s + first, "```\n", rest < 4 ? rest : 4) == 0)
            return 0;
        safe = marker_or_tail(s, len, HERMES_OPEN);
        break;
    }
    case TDM_TOOL_FORMAT_MISTRAL: safe = marker_or_tail(s, len, MISTRAL_CALLS); break;
    case TDM_TOOL_FORMAT_LLAMA3: {
        const size_t first = skip_ws(s, len, 0);
        if (first == len || s[first] == '{') return 0; /* the output may be a call, whole */
        const size_t rest = len - first, n = strlen(PYTHON_TAG);
        if (memcmp(s + first, PYTHON_TAG, rest < n ? rest : n) == 0) return 0;
        safe = marker_or_tail(s, len, PYTHON_TAG);
        break;
    }
    }
    while (safe > 0 && is_ws(s[safe - 1])) safe--;
    return safe;
}
