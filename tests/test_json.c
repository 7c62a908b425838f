/* test_json.c - the strict JSON parser and the string writer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

static tdm_json *parse_ok(const char *s) {
    tdm_json *j = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_parse(s, strlen(s), &j, &err), TANDEM_OK, "'%s': %s", s, err.msg);
    cr_assert_not_null(j);
    return j;
}

Test(json, document) {
    tdm_json *j = parse_ok(" {\"a\": [1, -2.5, true, false, null], \"b\": {\"c\": \"d\"}, \"e\": [], \"f\": {}}\n");
    cr_assert_eq(j->type, TDM_JSON_OBJECT);
    cr_assert_eq(j->n, 4);
    const tdm_json *a = tdm_json_get(j, "a");
    cr_assert(a && a->type == TDM_JSON_ARRAY && a->n == 5);
    cr_expect_eq(a->items[0].num, 1.0);
    cr_expect_eq(a->items[1].num, -2.5);
    cr_expect(a->items[2].type == TDM_JSON_BOOL && a->items[2].b);
    cr_expect(a->items[3].type == TDM_JSON_BOOL && !a->items[3].b);
    cr_expect_eq(a->items[4].type, TDM_JSON_NULL);
    const tdm_json *c = tdm_json_get(tdm_json_get(j, "b"), "c");
    cr_assert(c && c->type == TDM_JSON_STRING);
    cr_expect_str_eq(c->str, "d");
    cr_expect_eq(tdm_json_get(j, "e")->n, 0);
    cr_expect_eq(tdm_json_get(j, "f")->type, TDM_JSON_OBJECT);
    cr_expect_null(tdm_json_get(j, "zz"));
    cr_expect_null(tdm_json_get(a, "a"));
    tdm_json_free(j);
    tdm_json_free(NULL);
}

Test(json, scalars_at_top) {
    const char *docs[] = {"0", "\"x\"", "true", "null", "[[[]]]", " \t\r\n42 \n"};
    for (size_t i = 0; i < sizeof docs / sizeof *docs; i++) tdm_json_free(parse_ok(docs[i]));
}

Test(json, escapes) {
    tdm_json *j = parse_ok("\"q\\\" b\\\\ s\\/ \\b\\f\\n\\r\\t \\u0041\\u00e9\\u20AC\\ud83d\\ude00 \\u0000z\"");
    const char want[] = "q\" b\\ s/ \b\f\n\r\t A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80 \0z";
    cr_assert_eq(j->str_len, sizeof want - 1);
    cr_expect(memcmp(j->str, want, sizeof want - 1) == 0);
    cr_expect_eq(j->str[j->str_len], 0);
    tdm_json_free(j);
    /* raw UTF-8 passes through */
    j = parse_ok("\"日本 🎉\"");
    cr_expect_str_eq(j->str, "日本 🎉");
    tdm_json_free(j);
}

Test(json, numbers) {
    struct { const char *s; double v; } cases[] = {
        {"0", 0}, {"-0", -0.0}, {"7", 7}, {"-13", -13}, {"123456789", 123456789},
        {"1.5", 1.5}, {"-0.25", -0.25}, {"1e3", 1000}, {"1E+2", 100}, {"25e-1", 2.5},
        {"-1.5e2", -150}, {"9007199254740993", 9007199254740992.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        tdm_json *j = parse_ok(cases[i].s);
        cr_expect_eq(j->type, TDM_JSON_NUMBER);
        cr_expect_eq(j->num, cases[i].v, "%s -> %g", cases[i].s, j->num);
        tdm_json_free(j);
    }
    int64_t v;
    tdm_json *j = parse_ok("[42, -7, 1.5, 1e300, \"3\", 2e0]");
    cr_expect(tdm_json_int(&j->items[0], &v) && v == 42);
    cr_expect(tdm_json_int(&j->items[1], &v) && v == -7);
    cr_expect(!tdm_json_int(&j->items[2], &v));
    cr_expect(!tdm_json_int(&j->items[3], &v));
    cr_expect(!tdm_json_int(&j->items[4], &v));
    cr_expect(tdm_json_int(&j->items[5], &v) && v == 2);
    tdm_json_free(j);
}

Test(json, invalid_corpus) {
    struct { const char *s; size_t len; } bad[] = {
#define B(x) {x, sizeof(x) - 1}
        B(""), B("   "), B("{"), B("}"), B("["), B("[1,]"), B("[,1]"), B("{\"a\":1,}"), B("{\"a\" 1}"),
        B("{a:1}"), B("{'a':1}"), B("[1 2]"), B("01"), B("-"), B("1."), B(".5"), B("1e"), B("1e+"),
        B("+1"), B("0x10"), B("NaN"), B("Infinity"), B("tru"), B("nul"), B("True"), B("\"abc"),
        B("\"a\nb\""), B("\"\t\""), B("\"\\x\""), B("\"\\u12\""), B("\"\\u12G4\""), B("\"\\ud800\""),
        B("\"\\udc00\""), B("\"\\ud800\\u0041\""), B("\"\\ud800x\""), B("\"\xC3\""), B("\"\xFF\""),
        B("\"\xED\xA0\x80\""), B("\"\xC0\xAF\""), B("1 2"), B("{} x"), B("[] []"), B("\"a\" \"b\""),
        B("[1]\x00"), B("/* c */ 1"), B("[1,\n  2,\n  x]"), B("\xEF\xBB\xBF{}"),
#undef B
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tdm_json *j = (tdm_json *)0x1;
        tdm_err err = {0};
        tandem_status st = tdm_json_parse(bad[i].s, bad[i].len, &j, &err);
        cr_expect_eq(st, TANDEM_ERR_FORMAT, "case %zu accepted: '%s'", i, bad[i].s);
        cr_expect_null(j, "case %zu: out not NULL", i);
        cr_expect(strncmp(err.msg, "JSON ", 5) == 0 && strchr(err.msg, ':'), "case %zu message: '%s'", i, err.msg);
    }
}

Test(json, error_line_column) {
    const char *s = "{\n  \"a\": [1,\n  2,\n  x]\n}";
    tdm_json *j;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_parse(s, strlen(s), &j, &err), TANDEM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "4:3"), "message '%s' should point at 4:3", err.msg);
}

static char *nested(int depth, char open, char close) {
    char *s = malloc((size_t)depth * 2 + 1);
    for (int i = 0; i < depth; i++) {
        s[i] = open;
        s[depth * 2 - 1 - i] = close;
    }
    s[depth * 2] = 0;
    return s;
}

Test(json, depth_limit) {
    char *ok = nested(TDM_JSON_MAX_DEPTH, '[', ']');
    tdm_json_free(parse_ok(ok));
    free(ok);
    int depths[] = {TDM_JSON_MAX_DEPTH + 1, 100000};
    for (size_t k = 0; k < 2; k++) {
        char *s = nested(depths[k], '[', ']');
        tdm_json *j;
        tdm_err err = {0};
        cr_expect_eq(tdm_json_parse(s, strlen(s), &j, &err), TANDEM_ERR_FORMAT);
        cr_expect(strstr(err.msg, "nesting"), "%s", err.msg);
        free(s);
    }
    /* objects count too */
    char buf[1024] = "";
    for (int i = 0; i < TDM_JSON_MAX_DEPTH + 1; i++) strcat(buf, "{\"a\":");
    strcat(buf, "1");
    for (int i = 0; i < TDM_JSON_MAX_DEPTH + 1; i++) strcat(buf, "}");
    tdm_json *j;
    cr_expect_eq(tdm_json_parse(buf, strlen(buf), &j, NULL), TANDEM_ERR_FORMAT);
}

Test(json, large_array) {
    size_t n = 100000;
    char *s = malloc(n * 2 + 3), *p = s;
    *p++ = '[';
    for (size_t i = 0; i < n; i++) {
        *p++ = (char)('0' + i % 10);
        *p++ = ',';
    }
    p[-1] = ']';
    *p = 0;
    tdm_json *j = parse_ok(s);
    cr_expect_eq(j->n, n);
    cr_expect_eq(j->items[n - 1].num, (double)((n - 1) % 10));
    tdm_json_free(j);
    free(s);
}

static char *write_to_string(const char *s, size_t len, size_t *out_len) {
    char *buf = NULL;
    FILE *f = open_memstream(&buf, out_len);
    tdm_json_write_str(f, s, len);
    fclose(f);
    return buf;
}

Test(json, write_round_trip) {
    const char in[] = "a\"b\\c\n\t\x01\x1f\x7f é 🎉 \0end";
    size_t n;
    char *w = write_to_string(in, sizeof in - 1, &n);
    cr_expect(strstr(w, "\\u0001") && strstr(w, "\\u001f") && strstr(w, "\\n") && strstr(w, "\\\""));
    tdm_json *j = parse_ok(w);
    cr_expect_eq(j->str_len, sizeof in - 1);
    cr_expect(memcmp(j->str, in, sizeof in - 1) == 0);
    tdm_json_free(j);
    free(w);
}

Test(json, write_invalid_utf8) {
    const char in[] = "x\xFFy\xE2\x82z\xC3";
    size_t n;
    char *w = write_to_string(in, sizeof in - 1, &n);
    /* every bad byte -> U+FFFD, and the output parses back */
    tdm_json *j = parse_ok(w);
    cr_expect_str_eq(j->str, "x\xEF\xBF\xBDy\xEF\xBF\xBD\xEF\xBF\xBDz\xEF\xBF\xBD");
    tdm_json_free(j);
    free(w);
}

Test(json, number_literal_is_kept) {
    tdm_json *j = parse_ok("[-1.50e3, 9007199254740993, 0, 1e400]");
    const char *want[] = {"-1.50e3", "9007199254740993", "0", "1e400"};
    for (size_t i = 0; i < 4; i++) {
        cr_expect_str_eq(j->items[i].str, want[i]);
        cr_expect_eq(j->items[i].str_len, strlen(want[i]));
    }
    cr_expect_eq(j->items[0].num, -1500.0);
    tdm_json_free(j);
}

/* Integers come from the literal, not through a double: 2^53 + 1 and 2^64 - 1 exactly. */
Test(json, exact_integers) {
    struct { const char *s; bool ok; int64_t v; } ints[] = {
        {"9007199254740993", true, 9007199254740993LL},
        {"-9007199254740993", true, -9007199254740993LL},
        {"9223372036854775807", true, INT64_MAX},
        {"-9223372036854775808", true, INT64_MIN},
        {"9223372036854775808", false, 0},
        {"-9223372036854775809", false, 0},
        {"12345678901234567890123", false, 0},
        {"1.2e1", true, 12}, {"120e-1", true, 12}, {"1.25e1", false, 0}, {"2.0", true, 2},
        {"0.0", true, 0}, {"-0", true, 0}, {"0e999999999999", true, 0}, {"1e-999999999999", false, 0},
        {"100000000000000000000e-2", true, 1000000000000000000LL}, {"1e18", true, 1000000000000000000LL},
        {"0.0005e4", true, 5}, {"5e-1", false, 0},
    };
    for (size_t i = 0; i < sizeof ints / sizeof *ints; i++) {
        tdm_json *j = parse_ok(ints[i].s);
        int64_t v = 0;
        bool ok = tdm_json_int(j, &v);
        cr_expect_eq(ok, ints[i].ok, "%s: int %d", ints[i].s, ok);
        if (ok && ints[i].ok) cr_expect_eq(v, ints[i].v, "%s -> %lld", ints[i].s, (long long)v);
        tdm_json_free(j);
    }
    struct { const char *s; bool ok; uint64_t v; } u64s[] = {
        {"18446744073709551615", true, UINT64_MAX},
        {"18446744073709551616", false, 0},
        {"9223372036854775808", true, 9223372036854775808ULL},
        {"9007199254740993", true, 9007199254740993ULL},
        {"1e19", true, 10000000000000000000ULL}, {"1e20", false, 0},
        {"-1", false, 0}, {"-0", true, 0}, {"0.5", false, 0},
    };
    for (size_t i = 0; i < sizeof u64s / sizeof *u64s; i++) {
        tdm_json *j = parse_ok(u64s[i].s);
        uint64_t v = 0;
        bool ok = tdm_json_u64(j, &v);
        cr_expect_eq(ok, u64s[i].ok, "%s: u64 %d", u64s[i].s, ok);
        if (ok && u64s[i].ok) cr_expect_eq(v, u64s[i].v, "%s -> %llu", u64s[i].s, (unsigned long long)v);
        tdm_json_free(j);
    }
    tdm_json *j = parse_ok("[\"7\", true, null]");
    int64_t v;
    uint64_t u;
    for (size_t i = 0; i < 3; i++) cr_expect(!tdm_json_int(&j->items[i], &v) && !tdm_json_u64(&j->items[i], &u));
    tdm_json_free(j);
}

static void expect_duplicate(const char *s, const char *where, const char *name) {
    tdm_json *j = (tdm_json *)0x1;
    tdm_err err = {0};
    cr_expect_eq(tdm_json_parse(s, strlen(s), &j, &err), TANDEM_ERR_FORMAT, "'%s' accepted", s);
    cr_expect_null(j);
    cr_expect(strstr(err.msg, "duplicate member name") && strstr(err.msg, name) && strstr(err.msg, where),
              "'%s': message '%s' should name %s at %s", s, err.msg, name, where);
}

Test(json, duplicate_member_names_are_rejected) {
    expect_duplicate("{\"id\": 1, \"prompt\": \"x\", \"id\": 2}", "1:26", "\"id\"");
    expect_duplicate("{\"a\": {\"b\": 1,\n \"b\": 2}}", "2:2", "\"b\"");
    expect_duplicate("[{}, {\"k\": 1, \"j\": 2, \"k\": 3, \"j\": 4}]", "1:23", "\"k\"");
    /* names that differ only after a NUL byte are different names */
    tdm_json_free(parse_ok("{\"a\\u0000b\": 1, \"a\\u0000c\": 2, \"a\": 3}"));
    /* many members: distinct ones parse, a repeat at the end is found */
    size_t n = 20000;
    char *s = malloc(n * 16 + 32), *p = s;
    *p++ = '{';
    for (size_t i = 0; i < n; i++) p += sprintf(p, "\"k%zu\": %zu,", i, i);
    p[-1] = '}';
    *p = 0;
    tdm_json *j = parse_ok(s);
    cr_expect_eq(j->n, n);
    tdm_json_free(j);
    strcpy(p - 1, ", \"k7\": 0}");
    tdm_json *bad = NULL;
    tdm_err err = {0};
    cr_expect_eq(tdm_json_parse(s, strlen(s), &bad, &err), TANDEM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "duplicate member name \"k7\""), "%s", err.msg);
    free(s);
}
