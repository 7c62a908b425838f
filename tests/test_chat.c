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
#include <sys/resource.h>
#include <time.h>

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

/* Renders src with the members of the JSON object v as its variables. */
static tandem_status render_with(const char *src, const tdm_json *v, const tdm_jinja_limits *lim, char **out,
                                 tdm_err *err) {
    tdm_jinja *t = NULL;
    *out = NULL;
    tandem_status st = tdm_jinja_parse(src, strlen(src), &t, err);
    if (st != TANDEM_OK) return st;
    tdm_jinja_var vars[8];
    for (size_t i = 0; i < v->n && i < 8; i++) vars[i] = (tdm_jinja_var){.name = v->keys[i], .json = &v->items[i]};
    size_t n;
    st = tdm_jinja_render(t, vars, v->n, lim, out, &n, err);
    tdm_jinja_free(t);
    return st;
}

static tdm_json *parse_json(const char *text) {
    tdm_json *v = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_parse(text, strlen(text), &v, &err), TANDEM_OK, "%s", err.msg);
    return v;
}

static tandem_status render_text(const char *src, const char *vars_json, const tdm_jinja_limits *lim, char **out,
                                 tdm_err *err) {
    tdm_json *v = parse_json(vars_json);
    tandem_status st = render_with(src, v, lim, out, err);
    tdm_json_free(v);
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

typedef struct render_case {
    const char *src, *want;
} render_case;

/* Each case's template renders its text (no variables, the default limits). */
static void expect_renders(const render_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char *out = NULL;
        tdm_err err = {0};
        cr_assert_eq(render_text(cases[i].src, "{}", NULL, &out, &err), TANDEM_OK, "'%s': %s", cases[i].src, err.msg);
        cr_assert_str_eq(out, cases[i].want, "'%s'", cases[i].src);
        free(out);
    }
}

/* CPU seconds this thread has run. */
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *put(char *p, const char *s, size_t n) {
    memcpy(p, s, n);
    return p + n;
}

/* {"s": "aaa..." (n bytes), "t": the same, "l": [0, ...] (n / 10 items), "m": the same}. */
static tdm_json *big_vars(size_t n) {
    char *v = malloc(4 * n + 64), *p = v;
    if (!v) abort();
    for (int k = 0; k < 2; k++) {
        p = put(p, k ? ", \"t\": \"" : "{\"s\": \"", k ? 8 : 7);
        memset(p, 'a', n);
        p = put(p + n, "\"", 1);
    }
    for (int k = 0; k < 2; k++) {
        p = put(p, k ? "], \"m\": [0" : ", \"l\": [0", k ? 10 : 9);
        for (size_t i = 1; i < n / 10; i++) p = put(p, ",0", 2);
    }
    put(p, "]}", 3);
    tdm_json *j = parse_json(v);
    free(v);
    return j;
}

/* Every walk over data pays steps in proportion to what it visits: under a bound of
 * 100000 steps each operation runs on 100-byte strings (10-item lists) and fails on
 * 1 MB ones (100000-item lists), where it walked the data for a handful of steps. */
Test(chat, walks_over_data_are_charged_as_steps) {
    static const char *const ops[] = {
        "s.find('b')", "s.rfind('b')", "s.count('a')", "s.count('a', 1, -1)", "'b' in s", "s.startswith(t)",
        "s.endswith(('b', t))", "s | length", "s[-1]", "s[::-1]", "s == t", "s < t", "s.replace('a', 'b')",
        "s.split('b')", "s.rsplit('a', 1)", "s.split()", "s.strip('a')", "s.upper()", "s | title", "s.isdigit()",
        "s.splitlines()", "s | tojson", "s | e", "s | trim('a')", "s | list | length", "(s ~ 'b') | length",
        "'-'.join(l | map('string'))", "1 in l", "l | select | list", "l == m", "l | unique | list", "l | sort",
        "l | join", "l | tojson | length", "l | string | length", "{'k': l} == {'k': m}",
    };
    tdm_json *small = big_vars(100), *big = big_vars(1000000);
    tdm_jinja_limits lim = tdm_jinja_default_limits();
    lim.max_steps = 100000;
    for (size_t i = 0; i < TDM_ARRAY_LEN(ops); i++) {
        char src[200], *out = NULL;
        snprintf(src, sizeof src, "{{ %s }}", ops[i]);
        tdm_err err = {0};
        cr_assert_eq(render_with(src, small, &lim, &out, &err), TANDEM_OK, "'%s' on 100 bytes: %s", ops[i], err.msg);
        free(out);
        err = (tdm_err){0};
        tandem_status st = render_with(src, big, &lim, &out, &err);
        cr_assert_eq(st, TANDEM_ERR_NOMEM, "'%s' on 1 MB: status %d (%s)", ops[i], st, err.msg);
        cr_assert(strstr(err.msg, "ran more than 100000 steps"), "'%s': %s", ops[i], err.msg);
        cr_assert_null(out);
    }
    tdm_json_free(small);
    tdm_json_free(big);
}

/* Templates that ran for minutes or forever: each ends, with a result or at a bound.
 * Under the default limits each takes about a second at most; here, under a twentieth
 * of the steps and an eighth of the memory, about a twentieth of that, asserted with
 * room for a loaded machine and the sanitizers. */
Test(chat, hostile_templates_stop_within_a_second) {
#define S16 "{% set s = 'a' * 16000000 %}"
#define LOOP(body) "{% for i in range(100000) %}" body "{% endfor %}"
#define DAG "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(80) %}{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}"
    static const char *const cases[] = {
        "{{ ('a' * 100000).rfind('a') }}",   /* 54 s before: a code point count per match */
        "{{ ('a' * 2000000).rfind('a') }}",  /* over 30 minutes before */
        "{{ ('' * 9223372036854775807) | length }}{{ ([] * 9223372036854775807) | length }}", /* forever */
        S16 LOOP("{{ s.find('b') }}"), S16 LOOP("{{ s.rfind('b') }}"), S16 LOOP("{{ s.count('a') }}"),
        "{% set s = 'ab' * 8000000 %}" LOOP("{{ s.find('abababac') }}"),
        S16 "{% set t = 'b' ~ 'a' * 100000 %}" LOOP("{{ s.rfind(t) }}{{ s.rsplit(t, 2) | length }}"),
        S16 LOOP("{{ 'b' in s }}{{ s | length }}{{ s[-1] }}"), S16 LOOP("{{ s.replace('a', '') }}"),
        "{% set s = 'a' * 1000000 %}" LOOP("{{ s.replace('', '') | length }}"),
        "{% set s = 'a' * 1000000 %}{% set t = 'b' * 1000000 ~ 'a' %}" LOOP("{{ s.strip(t) }}"),
        S16 LOOP("{{ s.upper() | length }}"), S16 LOOP("{{ s | tojson | length }}"), S16 LOOP("{{ s | e | length }}"),
        "{% set l = [''] * 1000000 %}" LOOP("{{ l | join }}"), "{% set l = [0] * 2000000 %}" LOOP("{{ 1 in l }}"),
        DAG "{{ ns.a == ns.b }}", DAG "{{ ns.a in [ns.b] }}", DAG "{{ ns.a < ns.b }}", DAG "{{ ns.a | tojson | length }}",
        "{{ range(100000) | unique | list | length }}", "{{ range(100000) | reverse | sort | first }}",
        "{{ ([0.1 + 0.2] * 700000) | string | length }}", /* 17 formattings a float before */
        "{% set ns = namespace() %}{% set ns.x = ns %}{% set p = 'x.' * 5000000 ~ 'x' %}{% set l = [ns] * 100 %}"
        LOOP("{{ l | map(attribute=p) | list | length }}"),
        LOOP(LOOP("{{ '' }}")),
    };
#undef S16
#undef LOOP
#undef DAG
    tdm_jinja_limits lim = tdm_jinja_default_limits();
    lim.max_steps /= 20;
    lim.max_memory /= 8;
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++) {
        char *out = NULL;
        tdm_err err = {0};
        double t0 = cpu_seconds();
        tandem_status st = render_text(cases[i], "{}", &lim, &out, &err);
        double dt = cpu_seconds() - t0;
        cr_assert(st == TANDEM_OK || (st == TANDEM_ERR_NOMEM && (strstr(err.msg, "steps") || strstr(err.msg, "memory") ||
                                                                  strstr(err.msg, "rendered text"))),
                  "case %zu: status %d: %s", i, st, err.msg);
        cr_assert_lt(dt, 2.0, "case %zu ('%.60s...') took %.2f s of CPU", i, cases[i], dt);
        free(out);
    }
}

/* Python's str methods: find / rfind / count with their bounds, rsplit, splitlines
 * with keepends, the empty separator; arguments Python does not take are errors. */
Test(chat, string_methods_follow_python) {
    static const render_case cases[] = {
        {"{{ 'abcabc'.find('c', 3) }} {{ 'abcabc'.find('c', -2, -1) }} {{ 'abcabc'.rfind('abc') }} "
         "{{ 'abcabc'.rfind('b', 0, 4) }}", "5 -1 3 1"},
        {"{{ 'abcabc'.count('bc') }} {{ 'aaaa'.count('aa') }} {{ 'abc'.count('') }} {{ 'abc'.count('', 1, 2) }} "
         "{{ 'abc'.count('', 5) }}", "2 2 4 2 0"},
        {"{{ 'abc'.find('', 4) }} {{ 'abc'.find('', 3) }} {{ 'abc'.rfind('') }} {{ 'abc'.rfind('', 2, 1) }}", "-1 3 3 -1"},
        {"{{ 'héé'.find('é') }} {{ 'héé'.rfind('é') }} {{ 'héé'.count('é', 2) }} {{ 'x'.find('xx') }} "
         "{{ 'aaa'.rfind('aa') }}", "1 2 1 -1 1"},
        {"{{ 'a,b,,c'.rsplit(',', 2) }} {{ 'aaa'.rsplit('aa', 1) }} {{ 'a,b'.rsplit(',', 10 ** 12) }}",
         "['a,b', '', 'c'] ['a', ''] ['a', 'b']"},
        {"{{ 'a\\nb\\r\\nc'.splitlines(True) }} {{ 'a\\nb\\r\\nc'.splitlines() }}", "['a\\n', 'b\\r\\n', 'c'] ['a', 'b', 'c']"},
        {"{{ 'ab'.replace('', '-') }} {{ 'aXbXc'.replace('X', '', 1) }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 'x' * 0 }}",
         "-a-b- abXc ababab [1, 1] "},
        {"{{ 0.1 + 0.2 }} {{ 1e23 }} {{ 5e-324 }} {{ 2.5 }} {{ -0.0 }} {{ 1e16 }} {{ 123456.789e3 }}",
         "0.30000000000000004 1e+23 5e-324 2.5 -0.0 1e+16 123456789.0"},
    };
    expect_renders(cases, TDM_ARRAY_LEN(cases));
    expect_error("{{ 'abc'.find('a', 0, 1, 2) }}", "{}", NULL, TANDEM_ERR_UNSUPPORTED, "str.find() takes at most 3 argument(s) (4 given)");
    expect_error("{{ 'abc'.startswith('a', 1) }}", "{}", NULL, TANDEM_ERR_UNSUPPORTED, "str.startswith() takes at most 1");
    expect_error("{{ 'abc'.upper(1) }}", "{}", NULL, TANDEM_ERR_UNSUPPORTED, "str.upper() takes at most 0");
    expect_error("{{ 'abc'.strip(x=1) }}", "{}", NULL, TANDEM_ERR_UNSUPPORTED, "str.strip() takes no keyword argument 'x'");
}

/* A 10 MB template took 1.35 GB to parse: the source and the parse's memory are
 * bounded, each refusal saying which; a real template's size parses in little. */
Test(chat, template_size_and_parse_memory_are_bounded) {
    const size_t big = (size_t)10 << 20;
    char *src = malloc(big + 1);
    for (size_t i = 0; i + 5 <= big; i += 5) memcpy(src + i, "{{x}}", 5);
    tdm_jinja *t = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_jinja_parse(src, big, &t, &err), TANDEM_ERR_NOMEM);
    cr_assert(strstr(err.msg, "the template has 10485760 bytes, more than the 1048576 a template may have"), "%s", err.msg);
    cr_assert_null(t);
    /* 1 MiB of dense expressions: its tree would pass the parse's memory bound */
    const size_t mib = (size_t)1 << 20; /* TDM_JINJA_MAX_SOURCE */
    memcpy(src, "{{ x", 4);
    for (size_t i = 4; i + 2 <= mib - 3; i += 2) memcpy(src + i, "+x", 2);
    memcpy(src + mib - 3, " }}", 3);
    err = (tdm_err){0};
    cr_assert_eq(tdm_jinja_parse(src, mib, &t, &err), TANDEM_ERR_NOMEM);
    cr_assert(strstr(err.msg, "the template needs more than 64 MiB of memory to parse"), "%s", err.msg);
    /* 1 MiB of a real template parses */
    size_t len;
    char *real = read_data("chat/qwen3.jinja", &len);
    size_t n = 0;
    while (n + len <= mib) memcpy(src + n, real, len), n += len;
    cr_assert_eq(tdm_jinja_parse(src, n, &t, &err), TANDEM_OK, "%s", err.msg);
    tdm_jinja_free(t);
    free(real);
    free(src);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    cr_assert_lt(ru.ru_maxrss, 400 << 10, "peak RSS %ld KiB", ru.ru_maxrss); /* 1.4 GB before */
}

/* Messages quote what the template holds (names, strings, raise_exception's text):
 * control characters come out escaped, never raw to a terminal. */
Test(chat, messages_escape_control_characters) {
    static const struct {
        const char *src, *msg;
    } cases[] = {
        {"{{ raise_exception('\\x1b[2J\\x07gone\\n') }}", "raise_exception: \\x1b[2J\\x07gone\\n"},
        {"{{ {}['\\x1b]0;title\\x07'].x }}", "'\\x1b]0;title\\x07' is undefined"},
        {"{{ [1] | map('\\x9b31m') | list }}", "unknown filter '\\x9b31m'"},
        {"{{ [1] | select('\\x1b') | list }}", "unknown test '\\x1b'"},
        {"{{ 1 \x01 }}", "unexpected character '\\x01'"},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++) {
        char *out = NULL;
        tdm_err err = {0};
        cr_assert_neq(render_text(cases[i].src, "{}", NULL, &out, &err), TANDEM_OK, "'%s'", cases[i].src);
        cr_assert(strstr(err.msg, cases[i].msg), "'%s': message '%s' lacks '%s'", cases[i].src, err.msg, cases[i].msg);
        for (const char *p = err.msg; *p; p++)
            cr_assert((unsigned char)*p >= 0x20 && *p != 0x7f, "'%s': a raw control character in '%s'", cases[i].src, err.msg);
    }
    const char *src, *what;
    size_t len;
    tdm_err err = {0};
    cr_assert_eq(tdm_chat_pick(NULL, "no\x1b[2Jsuch", &src, &len, &what, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "unknown chat template 'no\\x1b[2Jsuch'"), "%s", err.msg);
}

Test(chat, whitespace_control_and_scoping_follow_jinja2) {
    static const render_case cases[] = {
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
    expect_renders(cases, TDM_ARRAY_LEN(cases));
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
