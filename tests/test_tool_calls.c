/* test_tool_calls.c - model output parsed into tool calls (src/chat/tool_calls.h):
 * every format, parallel calls, text around calls, malformed calls that stay text
 * whole, the streaming rule (what may be sent as content before the end) checked at
 * every byte boundary against the whole parse, and the format detected from the real
 * templates of tests/data/chat (Qwen 2.5 / 3, Llama 3.1 / 3.2, Mistral). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "json.h"
#include "grammar.h"
#include "testutil.h"
#include "tool_calls.h"

typedef struct call_case {
    tdm_tool_format f;
    const char *text;
    const char *content;  /* NULL: none */
    size_t n_calls;
    const char *names[3];
    const char *args[3];  /* as tdm_json_write writes them */
} call_case;

static const char *const tool_names[] = {"get_weather", "f", "a"}; /* the tools offered */

static const call_case cases[] = {
    /* hermes: one, with text before, parallel, missing last closing tag, string arguments */
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
     NULL, 1, {"get_weather"}, {"{\"city\": \"Paris\"}"}},
    {TDM_TOOL_FORMAT_HERMES, "Let me look.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n",
     "Let me look.", 1, {"f"}, {"{}"}},
    {TDM_TOOL_FORMAT_HERMES,
     "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", "
     "\"arguments\": {\"y\": [1, \"}\"]}}\n</tool_call>",
     NULL, 2, {"a", "b"}, {"{\"x\": 1}", "{\"y\": [1, \"}\"]}"}},
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"a b\"}}\n", NULL, 1, {"f"},
     {"{\"q\": \"a b\"}"}},
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"k\\\": true}\"}</tool_call> done",
     "done", 1, {"f"}, {"{\"k\": true}"}},
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>{\"name\": \"f\"}</tool_call>", NULL, 1, {"f"}, {"{}"}},
    /* hermes: malformed calls stay text, whole */
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }}\n</tool_call>",
     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }}\n</tool_call>", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>{\"arguments\": {}}</tool_call>", "<tool_call>{\"arguments\": {}}</tool_call>", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": 5}</tool_call>",
     "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": 5}</tool_call>", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_HERMES, "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
     "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_HERMES, "no call here {\"name\": \"f\"}", "no call here {\"name\": \"f\"}", 0, {0}, {0}},
    /* hermes without the tags (Qwen 2.5 Coder): the whole output, bare or fenced, naming tools offered */
    {TDM_TOOL_FORMAT_HERMES, "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", NULL, 1, {"get_weather"},
     {"{\"city\": \"Paris\"}"}},
    {TDM_TOOL_FORMAT_HERMES, "```json\n{\n  \"name\": \"f\",\n  \"arguments\": {}\n}\n```", NULL, 1, {"f"}, {"{}"}},
    {TDM_TOOL_FORMAT_HERMES, "\n{\"name\": \"f\"}\n{\"name\": \"a\"}", NULL, 2, {"f", "a"}, {"{}", "{}"}},
    {TDM_TOOL_FORMAT_HERMES, "{\"name\": \"rm_rf\", \"arguments\": {}}", "{\"name\": \"rm_rf\", \"arguments\": {}}", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_HERMES, "```json\n{\"name\": \"f\"}\n```\nmore", "```json\n{\"name\": \"f\"}\n```\nmore", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_HERMES, "```python\nprint(1)\n```", "```python\nprint(1)\n```", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_HERMES, "Example: {\"name\": \"f\"}", "Example: {\"name\": \"f\"}", 0, {0}, {0}},
    /* llama3: bare, after <|python_tag|>, several; text first or after is not a call */
    {TDM_TOOL_FORMAT_LLAMA3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", NULL, 1,
     {"get_weather"}, {"{\"city\": \"Oslo\"}"}},
    {TDM_TOOL_FORMAT_LLAMA3, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"z\": null}}",
     NULL, 2, {"a", "b"}, {"{}", "{\"z\": null}"}},
    {TDM_TOOL_FORMAT_LLAMA3, "Sure.<|python_tag|>{\"name\": \"a\", \"parameters\": {}}", "Sure.", 1, {"a"}, {"{}"}},
    {TDM_TOOL_FORMAT_LLAMA3, "The answer is {\"name\": \"a\"}", "The answer is {\"name\": \"a\"}", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_LLAMA3, "{\"name\": \"a\", \"parameters\": {}} and more", "{\"name\": \"a\", \"parameters\": {}} and more",
     0, {0}, {0}},
    {TDM_TOOL_FORMAT_LLAMA3, "{\"x\": 1}", "{\"x\": 1}", 0, {0}, {0}},
    /* mistral: v3 arrays (parallel), v11 NAME[ARGS]{...} */
    {TDM_TOOL_FORMAT_MISTRAL,
     "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"p\": 1}}, {\"name\": \"b\", \"arguments\": {}, \"id\": \"abcdefghi\"}]",
     NULL, 2, {"a", "b"}, {"{\"p\": 1}", "{}"}},
    {TDM_TOOL_FORMAT_MISTRAL, "Checking. [TOOL_CALLS]a[ARGS]{\"p\": 2}[TOOL_CALLS]b[ARGS]{}", "Checking.", 2, {"a", "b"},
     {"{\"p\": 2}", "{}"}},
    {TDM_TOOL_FORMAT_MISTRAL, "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"p\": 1}}", "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"p\": 1}}",
     0, {0}, {0}},
    {TDM_TOOL_FORMAT_MISTRAL, "[TOOL_CALLS][]", "[TOOL_CALLS][]", 0, {0}, {0}},
    /* another format's calls, and no format: text */
    {TDM_TOOL_FORMAT_MISTRAL, "<tool_call>{\"name\": \"a\"}</tool_call>", "<tool_call>{\"name\": \"a\"}</tool_call>", 0, {0}, {0}},
    {TDM_TOOL_FORMAT_NONE, "<tool_call>{\"name\": \"a\"}</tool_call>", "<tool_call>{\"name\": \"a\"}</tool_call>", 0, {0}, {0}},
};

static void check_parse(const call_case *c, size_t i) {
    tdm_tool_parse p;
    cr_assert_eq(tdm_tool_calls_parse(c->f, c->text, strlen(c->text), tool_names, 3, &p), TANDEM_OK);
    cr_expect_eq(p.n_calls, c->n_calls, "case %zu (%s): %zu calls, not %zu", i, c->text, p.n_calls, c->n_calls);
    if (c->content) cr_expect(p.content && strcmp(p.content, c->content) == 0, "case %zu: content [%s], not [%s]", i,
                              p.content ? p.content : "(null)", c->content);
    else cr_expect_null(p.content, "case %zu: content [%s], not none", i, p.content);
    for (size_t k = 0; k < p.n_calls && k < c->n_calls; k++) {
        cr_expect_str_eq(p.calls[k].name, c->names[k], "case %zu call %zu", i, k);
        cr_expect_str_eq(p.calls[k].arguments, c->args[k], "case %zu call %zu: [%s]", i, k, p.calls[k].arguments);
    }
    tdm_tool_parse_free(&p);
}

Test(tool_calls, formats) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_parse(&cases[i], i);
}

/* Streaming: at every byte boundary, what may be sent is a prefix of the final
 * content (or nothing, when there is none), never a byte of a call; and once the
 * text is whole, the parse is the same whatever was sent before. */
Test(tool_calls, stream_prefix_at_every_boundary) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const call_case *c = &cases[i];
        const size_t len = strlen(c->text);
        tdm_tool_parse whole;
        cr_assert_eq(tdm_tool_calls_parse(c->f, c->text, len, tool_names, 3, &whole), TANDEM_OK);
        const char *content = whole.content ? whole.content : "";
        for (size_t k = 0; k <= len; k++) {
            const size_t safe = tdm_tool_calls_stream_safe(c->f, c->text, k);
            cr_assert(safe <= k, "case %zu at %zu: %zu > %zu", i, k, safe, k);
            cr_expect(safe <= strlen(content) && memcmp(c->text, content, safe) == 0,
                      "case %zu at byte %zu: streamed [%.*s] is no prefix of the content [%s]", i, k, (int)safe,
                      c->text, content);
        }
        tdm_tool_parse_free(&whole);
    }
}

/* The stream releases text as it comes when no call is near, and holds a marker's
 * beginning back. */
Test(tool_calls, stream_holds_markers_only) {
    const char *t = "Hello world <tool_";
    cr_expect_eq(tdm_tool_calls_stream_safe(TDM_TOOL_FORMAT_HERMES, t, strlen(t)), strlen("Hello world"));
    t = "Hello world <b>";
    cr_expect_eq(tdm_tool_calls_stream_safe(TDM_TOOL_FORMAT_HERMES, t, strlen(t)), strlen(t));
    t = "x [TOOL_CA";
    cr_expect_eq(tdm_tool_calls_stream_safe(TDM_TOOL_FORMAT_MISTRAL, t, strlen(t)), 1);
    t = "  {\"name";
    cr_expect_eq(tdm_tool_calls_stream_safe(TDM_TOOL_FORMAT_LLAMA3, t, strlen(t)), 0);
    t = "<|python";
    cr_expect_eq(tdm_tool_calls_stream_safe(TDM_TOOL_FORMAT_LLAMA3, t, strlen(t)), 0);
    t = "Plain answer";
    cr_expect_eq(tdm_tool_calls_stream_safe(TDM_TOOL_FORMAT_LLAMA3, t, strlen(t)), strlen(t));
    cr_expect_eq(tdm_tool_calls_stream_safe(TDM_TOOL_FORMAT_NONE, "<tool_call>", 11), 11);
}

/* The format, from the real templates' rendering of the probe conversation. */
Test(tool_calls, detect_from_real_templates) {
    static const struct {
        const char *name;
        tdm_tool_format f;
    } want[] = {
        {"qwen2.5", TDM_TOOL_FORMAT_HERMES},     {"qwen3", TDM_TOOL_FORMAT_HERMES},
        {"llama3.1", TDM_TOOL_FORMAT_LLAMA3},    {"llama3.2", TDM_TOOL_FORMAT_LLAMA3},
        {"mistral-v0.3", TDM_TOOL_FORMAT_MISTRAL}, {"mistral-nemo", TDM_TOOL_FORMAT_MISTRAL},
        {"zephyr", TDM_TOOL_FORMAT_NONE},
    };
    tdm_json *probe = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_parse(tdm_tool_probe_json, strlen(tdm_tool_probe_json), &probe, &err), TANDEM_OK, "%s",
                 err.msg);
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
        char path[128];
        snprintf(path, sizeof path, "chat/%s.jinja", want[i].name);
        char *src = NULL;
        size_t len = 0;
        cr_assert_eq(tdm_read_file(tdm_test_data_path(path), &src, &len, &err), TANDEM_OK, "%s", err.msg);
        tdm_chat_input in = {.messages = tdm_json_get(probe, "messages"), .tools = tdm_json_get(probe, "tools"),
                             .add_generation_prompt = true, .bos_token = "<s>", .eos_token = "</s>"};
        char *out = NULL;
        size_t n = 0;
        tdm_tool_format got = TDM_TOOL_FORMAT_NONE;
        if (tdm_chat_render(src, len, want[i].name, &in, NULL, &out, &n, &err) == TANDEM_OK)
            got = tdm_tool_format_detect(out, n);
        cr_expect_eq(got, want[i].f, "%s: %s, not %s (%s)", want[i].name, tdm_tool_format_name(got),
                     tdm_tool_format_name(want[i].f), out ? out : err.msg);
        free(out);
        free(src);
    }
    tdm_json_free(probe);
}

/* Reasoning: the split of whole outputs, and at every byte boundary of a stream the
 * reasoning and content it lets out are prefixes of the whole split's. */
Test(tool_calls, think_split) {
    static const struct {
        const char *text, *reasoning, *content; /* reasoning NULL: none */
    } cases[] = {
        {"<think>\nLet me see.\n</think>\n\nThe answer.", "Let me see.", "The answer."},
        {"\n<think>a</think>b", "a", "b"},
        {"<think>\nstill thinking", "still thinking", ""},
        {"<think></think>", "", ""},
        {"No reasoning <think>x</think>", NULL, "No reasoning <think>x</think>"},
        {"<thin", NULL, "<thin"},
        {"", NULL, ""},
        {"<think>\nx\n</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call>", "x", "<tool_call>{\"name\": \"f\"}</tool_call>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *s = cases[i].text;
        const size_t len = strlen(s);
        const tdm_think_split w = tdm_think_split_text(s, len, true);
        cr_assert(w.decided);
        cr_expect_eq(w.has, cases[i].reasoning != NULL, "case %zu", i);
        if (w.has)
            cr_expect(w.reason_len == strlen(cases[i].reasoning) && !memcmp(s + w.reason_at, cases[i].reasoning, w.reason_len),
                      "case %zu: reasoning [%.*s]", i, (int)w.reason_len, s + w.reason_at);
        cr_expect_str_eq(s + w.content_at, cases[i].content, "case %zu", i);
        for (size_t k = 0; k <= len; k++) {
            const tdm_think_split p = tdm_think_split_text(s, k, false);
            if (!p.decided) continue;
            cr_expect_eq(p.has, w.has, "case %zu at %zu", i, k);
            if (p.has)
                cr_expect(p.reason_safe <= w.reason_len && !memcmp(s + p.reason_at, s + w.reason_at, p.reason_safe),
                          "case %zu at %zu: streamed reasoning [%.*s]", i, k, (int)p.reason_safe, s + p.reason_at);
            if (p.content_at < k)
                cr_expect_eq(p.content_at, w.content_at, "case %zu at %zu: the content begins at %zu, not %zu", i, k,
                             p.content_at, w.content_at);
        }
    }
}

/* Reasoning templates: Qwen3 renders reasoning_content in <think>, Qwen 2.5 does not. */
Test(tool_calls, think_detect_from_real_templates) {
    tdm_json *probe = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_parse(tdm_think_probe_json, strlen(tdm_think_probe_json), &probe, &err), TANDEM_OK);
    static const struct {
        const char *name;
        bool want;
    } t[] = {{"qwen3", true}, {"qwen2.5", false}, {"llama3.1", false}};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
        char path[128], *src = NULL, *out = NULL;
        size_t len = 0, n = 0;
        snprintf(path, sizeof path, "chat/%s.jinja", t[i].name);
        cr_assert_eq(tdm_read_file(tdm_test_data_path(path), &src, &len, &err), TANDEM_OK, "%s", err.msg);
        tdm_chat_input in = {.messages = tdm_json_get(probe, "messages"), .bos_token = "<s>", .eos_token = "</s>"};
        cr_assert_eq(tdm_chat_render(src, len, t[i].name, &in, NULL, &out, &n, &err), TANDEM_OK, "%s", err.msg);
        cr_expect_eq(tdm_think_detect(out, n), t[i].want, "%s: %s", t[i].name, out);
        free(out);
        free(src);
    }
    tdm_json_free(probe);
}

/* ---- the calls' grammar (tool_choice required / named) ---- */

static bool gmatches(const char *gbnf, const char *text) {
    tdm_grammar *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_grammar_parse(gbnf, strlen(gbnf), &g, &err), TANDEM_OK, "%s\n%s", err.msg, gbnf);
    bool ok = false;
    cr_assert_eq(tdm_grammar_matches(g, text, strlen(text), &ok, &err), TANDEM_OK, "%s", err.msg);
    tdm_grammar_free(g);
    return ok;
}

Test(tool_grammar, hermes_and_llama3_calls) {
    const char *names[] = {"set_unit", "switch_light"};
    const char *params[] = {"{\"type\": \"object\", \"properties\": {\"unit\": {\"enum\": [\"c\", \"f\"]}}, "
                            "\"required\": [\"unit\"], \"additionalProperties\": false}",
                            NULL};
    char *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_tool_grammar(TDM_TOOL_FORMAT_HERMES, names, params, 2, -1, true, &g, &err), TANDEM_OK, "%s",
                 err.msg);
    cr_assert(gmatches(g, "<tool_call>\n{\"name\": \"set_unit\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>"));
    cr_assert(gmatches(g, "<tool_call>\n{\"name\": \"set_unit\", \"arguments\": {\"unit\": \"f\"}}\n</tool_call>\n"
                          "<tool_call>\n{\"name\": \"switch_light\", \"arguments\": {\"on\": true}}\n</tool_call>"));
    cr_assert_not(gmatches(g, "<tool_call>\n{\"name\": \"set_unit\", \"arguments\": {\"unit\": \"k\"}}\n</tool_call>"));
    cr_assert_not(gmatches(g, "<tool_call>\n{\"name\": \"other\", \"arguments\": {}}\n</tool_call>"));
    cr_assert_not(gmatches(g, "Sure! <tool_call>\n{\"name\": \"set_unit\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>"));
    cr_assert_not(gmatches(g, "")); /* (at least one call) */
    free(g);
    /* one call of the named tool only */
    cr_assert_eq(tdm_tool_grammar(TDM_TOOL_FORMAT_HERMES, names, params, 2, 1, false, &g, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(gmatches(g, "<tool_call>\n{\"name\": \"switch_light\", \"arguments\": {}}\n</tool_call>"));
    cr_assert_not(gmatches(g, "<tool_call>\n{\"name\": \"set_unit\", \"arguments\": {\"unit\": \"c\"}}\n</tool_call>"));
    cr_assert_not(gmatches(g, "<tool_call>\n{\"name\": \"switch_light\", \"arguments\": {}}\n</tool_call>\n"
                              "<tool_call>\n{\"name\": \"switch_light\", \"arguments\": {}}\n</tool_call>"));
    free(g);
    cr_assert_eq(tdm_tool_grammar(TDM_TOOL_FORMAT_LLAMA3, names, params, 2, -1, true, &g, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(gmatches(g, "{\"name\": \"set_unit\", \"parameters\": {\"unit\": \"c\"}}; "
                          "{\"name\": \"switch_light\", \"parameters\": {\"on\": false}}"));
    cr_assert_not(gmatches(g, "{\"name\": \"set_unit\", \"arguments\": {\"unit\": \"c\"}}"));
    free(g);
}

Test(tool_grammar, refusals) {
    const char *names[] = {"f"}, *bad_names[] = {"a b"};
    const char *params[] = {"{\"type\": \"string\", \"pattern\": \"a+\"}"};
    char *g = (char *)1;
    tdm_err err = {0};
    cr_assert_eq(tdm_tool_grammar(TDM_TOOL_FORMAT_MISTRAL, names, NULL, 1, -1, true, &g, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, "mistral"), "%s", err.msg);
    cr_assert_neq(tdm_tool_grammar(TDM_TOOL_FORMAT_HERMES, names, params, 1, -1, true, &g, &err), TANDEM_OK);
    cr_assert(strstr(err.msg, "pattern"), "%s", err.msg);
    cr_assert_eq(tdm_tool_grammar(TDM_TOOL_FORMAT_HERMES, bad_names, NULL, 1, -1, true, &g, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_tool_grammar(TDM_TOOL_FORMAT_HERMES, names, NULL, 1, 3, true, &g, &err), TANDEM_ERR_INVALID_ARG);
}
