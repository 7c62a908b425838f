/* test_chat.c - chat templates: the Jinja engine renders 36 real templates (from the
 * models' tokenizer configs, tests/data/chat/NAME.jinja) exactly as Python's jinja2 does
 * under HF transformers' settings (tests/data/chat/expected.jsonl, from gen.py), over
 * 12 conversations with add_generation_prompt off and on, failing where jinja2
 * fails; the built-in templates render what the real ones of their families render;
 * errors (syntax, unknown filter, raise_exception, limits) are clear; models and
 * vocabularies give their templates, BOS/EOS texts and end-of-turn tokens. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "tandem.h"
#include "testutil.h"
#include "tokenizer.h"

#define NOW_2025_02_10 1739145600 /* gen.py's strftime_now date, UTC */

static char *read_data(const char *name, size_t *len) {
    char *s = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_read_file(tdm_test_data_path(name), &s, len, &err), TANDEM_OK, "%s", err.msg);
    return s;
}

static tdm_json *read_json(const char *name) {
    size_t len;
    char *s = read_data(name, &len);
    tdm_json *j = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_parse(s, len, &j, &err), TANDEM_OK, "%s: %s", name, err.msg);
    free(s);
    return j;
}

static const tdm_json *conversation(const tdm_json *convs, const char *name) {
    for (size_t i = 0; i < convs->n; i++)
        if (strcmp(tdm_json_get(&convs->items[i], "name")->str, name) == 0) return &convs->items[i];
    cr_assert_fail("no conversation '%s'", name);
    return NULL;
}

static const char *str_or_null(const tdm_json *j) { return j && j->type == TDM_JSON_STRING ? j->str : NULL; }

/* Renders template file NAME.jinja over conversation conv. */
static tandem_status render(const char *tmpl, const tdm_json *meta, const tdm_json *conv, bool agp, char **out,
                            tdm_err *err) {
    char path[128];
    snprintf(path, sizeof path, "chat/%s.jinja", tmpl);
    size_t len;
    char *src = read_data(path, &len);
    const tdm_json *tools = tdm_json_get(conv, "tools");
    tdm_chat_input in = {.messages = tdm_json_get(conv, "messages"),
                         .tools = tools && tools->type != TDM_JSON_NULL ? tools : NULL,
                         .add_generation_prompt = agp,
                         .bos_token = str_or_null(tdm_json_get(meta, "bos_token")),
                         .eos_token = str_or_null(tdm_json_get(meta, "eos_token"))};
    tdm_jinja_limits lim = tdm_jinja_default_limits();
    lim.now = NOW_2025_02_10;
    size_t n;
    tandem_status st = tdm_chat_render(src, len, tmpl, &in, &lim, out, &n, err);
    if (st == TANDEM_OK) cr_assert_eq(n, strlen(*out), "%s: the length returned is the text's", tmpl);
    free(src);
    return st;
}

/* The first byte where a and b differ. */
static size_t diff_at(const char *a, const char *b) {
    size_t i = 0;
    while (a[i] && a[i] == b[i]) i++;
    return i;
}

Test(chat, real_templates_render_as_jinja2_does) {
    tdm_json *templates = read_json("chat/templates.json"), *convs = read_json("chat/conversations.json");
    size_t n;
    tdm_json **rows = tdm_test_jsonl(tdm_test_data_path("chat/expected.jsonl"), &n);
    cr_assert_geq(n, 800, "expected.jsonl has %zu rows", n);
    int bad = 0, n_out = 0, n_err = 0;
    for (size_t i = 0; i < n; i++) {
        const char *tmpl = tdm_json_get(rows[i], "template")->str, *cname = tdm_json_get(rows[i], "conversation")->str;
        const bool agp = tdm_json_get(rows[i], "add_generation_prompt")->b;
        const tdm_json *want = tdm_json_get(rows[i], "output"), *werr = tdm_json_get(rows[i], "error");
        char *got = NULL;
        tdm_err err = {0};
        tandem_status st = render(tmpl, tdm_json_get(templates, tmpl), conversation(convs, cname), agp, &got, &err);
        if (want) {
            n_out++;
            if (st != TANDEM_OK || strcmp(got, want->str) != 0) {
                if (bad++ < 8) {
                    size_t at = st == TANDEM_OK ? diff_at(got, want->str) : 0;
                    cr_log_error("%s / %s / agp=%d: %s at byte %zu: got '%.80s', jinja2 '%.80s'", tmpl, cname, agp,
                                 st ? err.msg : "differs", at, st ? "" : got + at, want->str + at);
                }
            }
        } else {
            n_err++;
            bool raised = tdm_json_get(rows[i], "raised")->b;
            /* jinja2 failed: so must we, with raise_exception's own text when it raised */
            if (st == TANDEM_OK || err.msg[0] == 0 || (raised && !strstr(err.msg, werr->str))) {
                if (bad++ < 8)
                    cr_log_error("%s / %s / agp=%d: jinja2 fails ('%.100s'), we %s '%.100s'", tmpl, cname, agp,
                                 werr->str, st ? "fail with" : "render", st ? err.msg : got);
            }
        }
        free(got);
    }
    cr_assert_eq(bad, 0, "%d of %zu renderings differ from jinja2's", bad, n);
    cr_assert(n_out > 700 && n_err > 20, "outputs %d, errors %d", n_out, n_err);
    tdm_test_jsonl_free(rows, n);
    tdm_json_free(templates);
    tdm_json_free(convs);
}

/* Each built-in against the real template it stands for, on the conversations that
 * template renders (no tools; cond filters more). */
static void builtin_matches(const char *builtin, const char *real, bool system_only, bool no_system) {
    tdm_json *templates = read_json("chat/templates.json"), *convs = read_json("chat/conversations.json");
    const tdm_json *meta = tdm_json_get(templates, real);
    const char *src = tdm_chat_builtin(builtin);
    cr_assert(src, "no built-in '%s'", builtin);
    int compared = 0;
    for (size_t c = 0; c < convs->n; c++) {
        const tdm_json *conv = &convs->items[c], *msgs = tdm_json_get(conv, "messages");
        bool has_system = strcmp(tdm_json_get(&msgs->items[0], "role")->str, "system") == 0;
        if (tdm_json_get(conv, "tools") || (system_only && !has_system) || (no_system && has_system)) continue;
        for (int agp = 0; agp < 2; agp++) {
            char *want = NULL, *got = NULL;
            tdm_err err = {0};
            if (render(real, meta, conv, agp, &want, &err) != TANDEM_OK) continue; /* the real one refuses */
            tdm_chat_input in = {.messages = msgs, .add_generation_prompt = agp,
                                 .bos_token = str_or_null(tdm_json_get(meta, "bos_token")),
                                 .eos_token = str_or_null(tdm_json_get(meta, "eos_token"))};
            size_t n;
            cr_assert_eq(tdm_chat_render(src, strlen(src), builtin, &in, NULL, &got, &n, &err), TANDEM_OK, "%s: %s",
                         builtin, err.msg);
            size_t at = diff_at(got, want);
            cr_assert_str_eq(got, want, "%s vs %s on %s (agp %d): at byte %zu: '%.60s' vs '%.60s'", builtin, real,
                             tdm_json_get(conv, "name")->str, agp, at, got + at, want + at);
            compared++;
            free(want);
            free(got);
        }
    }
    cr_assert_geq(compared, 6, "%s: only %d conversations compared", builtin, compared);
    tdm_json_free(templates);
    tdm_json_free(convs);
}

Test(chat, builtin_templates_render_like_the_real_ones) {
    builtin_matches("chatml", "chatml-openorca", false, false);
    builtin_matches("llama2", "llama2", false, false);
    builtin_matches("llama3", "llama3", false, false);
    builtin_matches("gemma", "gemma3", false, false);
    builtin_matches("gemma", "gemma", false, true);
    builtin_matches("mistral", "mistral-v0.3", false, false);
    builtin_matches("mistral-v7", "mistral-v7", true, false);
    builtin_matches("phi3", "phi3.5", false, false);
    builtin_matches("deepseek2", "deepseek-v2", false, false);
    builtin_matches("deepseek3", "deepseek-v3", false, false);
    builtin_matches("deepseek-r1", "deepseek-r1", false, false);
    builtin_matches("deepseek-r1", "deepseek-r1-distill-llama", false, false);
}

/* ------------------------------------------------------------------ errors */

static tandem_status render_text(const char *src, const char *vars_json, const tdm_jinja_limits *lim, char **out,
                                 tdm_err *err) {
    tdm_jinja *t = NULL;
    *out = NULL;
    tandem_status st = tdm_jinja_parse(src, strlen(src), &t, err);
    if (st != TANDEM_OK) return st;
    tdm_json *v = NULL;
    cr_assert_eq(tdm_json_parse(vars_json, strlen(vars_json), &v, err), TANDEM_OK);
    tdm_jinja_var vars[8];
    for (size_t i = 0; i < v->n && i < 8; i++) vars[i] = (tdm_jinja_var){.name = v->keys[i], .json = &v->items[i]};
    size_t n;
    st = tdm_jinja_render(t, vars, v->n, lim, out, &n, err);
    tdm_json_free(v);
    tdm_jinja_free(t);
    return st;
}

static void expect_error(const char *src, const char *vars, const tdm_jinja_limits *lim, tandem_status want,
                         const char *msg) {
    char *out = NULL;
    tdm_err err = {0};
    tandem_status st = render_text(src, vars, lim, &out, &err);
    cr_assert_eq(st, want, "'%s': status %d (%s), expected %d", src, st, err.msg, want);
    cr_assert(strstr(err.msg, msg), "'%s': message '%s' lacks '%s'", src, err.msg, msg);
    cr_assert_null(out);
}

Test(chat, errors_name_the_problem_and_place) {
    expect_error("ab\n{% if x %}", "{}", NULL, TANDEM_ERR_FORMAT, "line 2, column 4: unclosed 'if'");
    expect_error("{{ x ", "{}", NULL, TANDEM_ERR_FORMAT, "unclosed tag");
    expect_error("{# open", "{}", NULL, TANDEM_ERR_FORMAT, "unclosed comment");
    expect_error("{{ 'abc }}", "{}", NULL, TANDEM_ERR_FORMAT, "unterminated string");
    expect_error("x {{ y | frobnicate }}", "{}", NULL, TANDEM_ERR_UNSUPPORTED, "column 10: unknown filter 'frobnicate'");
    expect_error("{{ y is frob }}", "{}", NULL, TANDEM_ERR_UNSUPPORTED, "unknown test 'frob'");
    expect_error("{% include 'x' %}", "{}", NULL, TANDEM_ERR_UNSUPPORTED, "'include' tag is not supported");
    expect_error("{% endfor %}", "{}", NULL, TANDEM_ERR_FORMAT, "unexpected 'endfor'");
    expect_error("{% break %}", "{}", NULL, TANDEM_ERR_FORMAT, "'break' outside a loop");
    expect_error("{{ 1 + }}", "{}", NULL, TANDEM_ERR_FORMAT, "expected an expression");
    expect_error("{{ raise_exception('Roles must alternate!') }}", "{}", NULL, TANDEM_ERR_FORMAT,
                 "line 1, column 4: raise_exception: Roles must alternate!");
    expect_error("{{ x.y }}", "{}", NULL, TANDEM_ERR_FORMAT, "'x' is undefined");
    expect_error("{{ 'a' + 1 }}", "{}", NULL, TANDEM_ERR_FORMAT, "unsupported operand type(s) for +: 'str' and 'int'");
    expect_error("{{ 1 // 0 }}", "{}", NULL, TANDEM_ERR_FORMAT, "division or modulo by zero");
    expect_error("{{ range(1000000) }}", "{}", NULL, TANDEM_ERR_FORMAT, "range too big");
    expect_error("{{ 9223372036854775807 + 1 }}", "{}", NULL, TANDEM_ERR_FORMAT, "integer overflow");
    expect_error("{% set x.y = 1 %}", "{\"x\": 1}", NULL, TANDEM_ERR_FORMAT, "non-namespace");
    expect_error("{% for a, b in [1] %}{% endfor %}", "{}", NULL, TANDEM_ERR_FORMAT, "cannot unpack");
    expect_error("{{ messages.append(1) }}", "{\"messages\": []}", NULL, TANDEM_ERR_FORMAT, "immutable");
}

Test(chat, hostile_templates_hit_limits_not_the_machine) {
    tdm_jinja_limits lim = tdm_jinja_default_limits();
    /* deep nesting: the parser's bound */
    char deep[4096] = "{{ ";
    for (int i = 0; i < 1000; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 1000; i++) strcat(deep, ")");
    strcat(deep, " }}");
    expect_error(deep, "{}", NULL, TANDEM_ERR_FORMAT, "nested deeper than");
    /* a long left-deep expression: the evaluator's bound */
    char *chain = malloc(40000);
    strcpy(chain, "{{ 1");
    for (int i = 0; i < 5000; i++) strcat(chain, "+1");
    strcat(chain, " }}");
    expect_error(chain, "{}", NULL, TANDEM_ERR_FORMAT, "nests too deeply");
    free(chain);
    /* runaway recursion */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "{}", NULL, TANDEM_ERR_FORMAT,
                 "macro calls nested deeper than 64");
    /* output, memory, steps */
    lim.max_output = 1000;
    expect_error("{% for i in range(100) %}{{ 'x' * 20 }}{% endfor %}", "{}", &lim, TANDEM_ERR_NOMEM,
                 "rendered text would exceed 1000 bytes");
    lim = tdm_jinja_default_limits();
    lim.max_memory = 4 << 20;
    expect_error("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
                 "{}", &lim, TANDEM_ERR_NOMEM, "more than 4 MiB of memory");
    lim = tdm_jinja_default_limits();
    lim.max_steps = 100000;
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "{}", &lim,
                 TANDEM_ERR_NOMEM, "more than 100000 steps");
}

Test(chat, whitespace_control_and_scoping_follow_jinja2) {
    struct {
        const char *src, *want;
    } cases[] = {
        {"  {% if true %}\n    x\n  {% endif %}\n", "    x\n"},     /* lstrip_blocks + trim_blocks */
        {"a  {%- if true -%}  b  {%- endif -%}  c", "abc"},
        {"  {%+ if true %}x{% endif %}", "  x"},
        {"{% if true +%}\nx{% endif %}", "\nx"},
        {"a {# c #}\nb", "a b"},
        {"{% raw %}{{ x }}{% endraw %}", "{{ x }}"},
        {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", "1"},
        {"{% set ns = namespace(x=1) %}{% for i in [1] %}{% set ns.x = 2 %}{% endfor %}{{ ns.x }}", "2"},
        {"{% for i in range(5) if i is odd %}{{ loop.index }}/{{ loop.length }}{{ ',' if not loop.last }}{% endfor %}",
         "1/2,2/2"},
        {"{% for x in [] %}a{% else %}empty{% endfor %}", "empty"},
        {"{% for i in range(9) %}{% if i == 3 %}{% break %}{% endif %}{% if i is odd %}{% continue %}{% endif %}{{ i }}{% endfor %}",
         "02"},
        {"{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}", "1B23"},
        {"{% set t %}in{{ 1 + 1 }}{% endset %}[{{ t }}]", "[in2]"},
        {"{% filter upper %}hi {{ 'x' }}{% endfilter %}", "HI X"},
        {"{{ 'a' ~ 1 ~ none }}|{{ [1, 'b'] }}|{{ {'k': true} }}|{{ 0.1 + 0.2 }}|{{ 1e100 }}", "a1None|[1, 'b']|{'k': True}|0.30000000000000004|1e+100"},
        {"{{ 'Hello'[1:-1] }}{{ 'héé'[::-1] }}{{ [1,2,3][-1] }}", "ellééh3"},
        {"{{ '  a b  '.strip().split(' ') }}{{ 'x'.startswith(('y', 'x')) }}", "['a', 'b']True"},
        {"{{ {'b': 1, 'a': [1, 2]} | tojson }}|{{ 'é\"' | tojson }}", "{\"b\": 1, \"a\": [1, 2]}|\"é\\\"\""},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++) {
        char *out = NULL;
        tdm_err err = {0};
        cr_assert_eq(render_text(cases[i].src, "{}", NULL, &out, &err), TANDEM_OK, "'%s': %s", cases[i].src, err.msg);
        cr_assert_str_eq(out, cases[i].want, "'%s'", cases[i].src);
        free(out);
    }
}

/* -------------------------------------------------------- models, vocabularies */

Test(chat, vocabulary_template_bos_and_end_of_turn) {
    tandem_tokenizer *tok;
    cr_assert_eq(tandem_tokenizer_open(tdm_test_data_path("vocab/ggml-vocab-phi-3.gguf"), &tok), TANDEM_OK);
    tandem_chat_message msgs[] = {{"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
    char *out = NULL;
    /* its own template (it starts with bos_token; phi-3 adds BOS itself, so the text is removed) */
    cr_assert_eq(tandem_tokenizer_chat_render(tok, NULL, msgs, 3, true, &out), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_str_eq(out, "<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n");
    tandem_free(out);
    cr_assert_eq(tandem_tokenizer_chat_render(tok, "chatml", msgs, 1, false, &out), TANDEM_OK);
    cr_assert_str_eq(out, "<|im_start|>user\nHi<|im_end|>\n");
    tandem_free(out);
    cr_assert_eq(tandem_tokenizer_chat_render(tok, "{{ messages[0].content | upper }}", msgs, 1, false, &out), TANDEM_OK);
    cr_assert_str_eq(out, "HI");
    tandem_free(out);
    cr_assert_eq(tandem_tokenizer_chat_render(tok, "nonesuch", msgs, 1, false, &out), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "unknown chat template 'nonesuch' (built-in: chatml"), "%s", tandem_last_error());
    cr_assert_eq(tandem_tokenizer_chat_render(tok, "{% if %}", msgs, 1, false, &out), TANDEM_ERR_FORMAT);
    cr_assert(strstr(tandem_last_error(), "the chat template given: line 1, column"), "%s", tandem_last_error());
    tandem_chat_message bad[] = {{NULL, "x"}};
    cr_assert_eq(tandem_tokenizer_chat_render(tok, "chatml", bad, 1, false, &out), TANDEM_ERR_INVALID_ARG);
    tandem_tokenizer_close(tok);

    /* <|end|> ends generation in phi-3; <|endoftext|> is its EOS too */
    tdm_gguf *g;
    tdm_tokenizer *t;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open(tdm_test_data_path("vocab/ggml-vocab-phi-3.gguf"), &g, &err), TANDEM_OK);
    cr_assert_eq(tdm_tokenizer_load(g, &t, &err), TANDEM_OK);
    int32_t *ids;
    size_t n;
    cr_assert_eq(tdm_tokenize(t, "<|end|>", 7, false, true, &ids, &n, &err), TANDEM_OK);
    cr_assert_eq(n, 1);
    cr_assert(tdm_tok_is_eog(t, ids[0]), "<|end|> (%d) ends a turn", ids[0]);
    cr_assert(tdm_tok_is_eog(t, tdm_tok_eos(t)));
    cr_assert_not(tdm_tok_is_eog(t, 100));
    const int32_t *eog;
    int32_t n_eog = tdm_tok_eog_ids(t, &eog);
    cr_assert(n_eog >= 2 && n_eog <= TDM_TOK_EOG_MAX);
    for (int32_t i = 1; i < n_eog; i++) cr_assert_lt(eog[i - 1], eog[i]);
    free(ids);
    tdm_tokenizer_free(t);
    tdm_gguf_close(g);

    /* a vocabulary without a template */
    cr_assert_eq(tandem_tokenizer_open(tdm_test_data_path("vocab/ggml-vocab-llama-spm.gguf"), &tok), TANDEM_OK);
    cr_assert_eq(tandem_tokenizer_chat_render(tok, NULL, msgs, 1, true, &out), TANDEM_ERR_UNSUPPORTED);
    cr_assert(strstr(tandem_last_error(), "no chat template"), "%s", tandem_last_error());
    /* llama2 writes <s> itself; the tokenizer adds BOS, so the text starts after it */
    cr_assert_eq(tandem_tokenizer_chat_render(tok, "llama2", msgs, 3, false, &out), TANDEM_OK);
    cr_assert_str_eq(out, "[INST] Hi [/INST] Hello </s><s>[INST] Bye [/INST]");
    tandem_free(out);
    tandem_tokenizer_close(tok);
}

Test(chat, model_api) {
    tandem_model *m;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-target-f16.gguf"), NULL, &m), TANDEM_OK);
    tandem_chat_message msgs[] = {{"system", "Be brief."}, {"user", "def add(a, b):"}};
    char *out = NULL;
    cr_assert_eq(tandem_chat_render(m, NULL, msgs, 2, true, &out), TANDEM_ERR_UNSUPPORTED);
    cr_assert_null(out);
    cr_assert_eq(tandem_chat_render(m, "chatml", msgs, 2, true, &out), TANDEM_OK);
    cr_assert_str_eq(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\ndef add(a, b):<|im_end|>\n"
                          "<|im_start|>assistant\n");
    tandem_free(out);
    const char *json = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"name\": \"t\"}]}";
    cr_assert_eq(tandem_chat_render_json(m, "{{ tools[0].name }}{{ messages | length }}", json, strlen(json), false, &out),
                 TANDEM_OK, "%s", tandem_last_error());
    cr_assert_str_eq(out, "t1");
    tandem_free(out);
    cr_assert_eq(tandem_chat_render_json(m, "chatml", "[{\"content\": 1}]", 16, false, &out), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(tandem_last_error(), "messages[0] needs a string \"role\""), "%s", tandem_last_error());
    cr_assert_eq(tandem_chat_render_json(m, "chatml", "[", 1, false, &out), TANDEM_ERR_INVALID_ARG);
    int32_t eog[16];
    size_t n = tandem_model_eog_tokens(m, eog, 16);
    tandem_model_info info;
    cr_assert_eq(tandem_model_get_info(m, &info), TANDEM_OK);
    cr_assert(n >= 1 && eog[0] == info.eos, "the EOS is among the end-of-generation tokens");
    cr_assert_eq(tandem_model_eog_tokens(m, NULL, 0), n);
    cr_assert_str_eq(tandem_chat_builtin_templates(), tdm_chat_builtin_names);
    tandem_model_close(m);
}
