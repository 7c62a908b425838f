/* test_json_schema.c - JSON schemas -> grammars: each keyword's documents accepted
 * and rejected, and bad schemas refused with the path of the problem. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "json_schema.h"

typedef struct scase {
    const char *schema;
    const char *yes[8];
    const char *no[8];
} scase;

static const scase CASES[] = {
    {"{\"type\": \"string\"}", {"\"\"", "\"héllo \\\"x\\\" \\u00e9\"", "\"a\" "}, {"1", "\"a", "\"\n\"", "'a'"}},
    {"{\"type\": \"integer\"}", {"0", "-12", "1234567890123456"}, {"01", "1.5", "-", "\"1\"", "12345678901234567"}},
    {"{\"type\": \"number\"}", {"0", "-1.5", "2e10", "3.25E-2"}, {".5", "1.", "+1", "NaN"}},
    {"{\"type\": \"boolean\"}", {"true", "false"}, {"True", "1", "null"}},
    {"{\"type\": \"null\"}", {"null"}, {"nul", "\"null\""}},
    {"{\"type\": [\"string\", \"null\"]}", {"\"x\"", "null"}, {"1", "false"}},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"string\"}},"
     " \"required\": [\"a\"], \"additionalProperties\": false}",
     {"{\"a\": 1}", "{\"a\": 1, \"b\": \"x\"}", "{\n  \"a\": -3,\n  \"b\": \"\"\n}"},
     {"{}", "{\"b\": \"x\"}", "{\"b\": \"x\", \"a\": 1}", "{\"a\": 1, \"c\": 2}", "{\"a\": \"1\"}"}},
    {"{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}, \"b\": {\"type\": \"boolean\"}}}",
     {"{}", "{\"a\": 1}", "{\"b\": true}", "{\"a\": 1, \"b\": false, \"zz\": [1, {\"q\": null}]}", "{\"other\": 1}"},
     {"{\"a\": true}", "{\"b\": 1}", "[]"}},
    /* additional members' names: anything but the declared ones */
    {"{\"type\": \"object\", \"properties\": {\"ab\": {\"type\": \"integer\"}, \"a\": {\"type\": \"integer\"}, "
     "\"é\": {\"type\": \"null\"}}}",
     {"{\"abc\": \"x\"}", "{\"b\": \"x\"}", "{\"ab\": 1}", "{\"\": 1}", "{\"a\": 1, \"x\": true}", "{\"éé\": 1}", "{\"\\u0061x\": 1}"},
     {"{\"a\": \"x\"}", "{\"ab\": \"x\"}", "{\"x\": 1, \"a\": \"y\"}", "{\"é\": 1}"}},
    {"{\"type\": \"object\", \"additionalProperties\": {\"type\": \"integer\"}}",
     {"{}", "{\"x\": 1, \"y\": 2}"}, {"{\"x\": \"1\"}"}},
    {"{\"type\": \"array\", \"items\": {\"type\": \"integer\"}}", {"[]", "[1]", "[1, 2,3]"}, {"[1,]", "[\"a\"]", "{}"}},
    {"{\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, \"minItems\": 2, \"maxItems\": 3}",
     {"[true, false]", "[true, true, true]"}, {"[]", "[true]", "[true, true, true, true]"}},
    {"{\"type\": \"array\", \"items\": {\"type\": \"string\"}, \"maxItems\": 0}", {"[]", "[ ]"}, {"[\"a\"]"}},
    {"{\"type\": \"array\", \"maxItems\": 1}", {"[]", "[{\"a\": []}]"}, {"[1, 2]"}},
    {"{\"enum\": [\"red\", 2, null, {\"a\": [true]}]}", {"\"red\"", "2", "null", "{\"a\":[true]}"},
     {"\"blue\"", "3", "{\"a\": [true]}"}},
    {"{\"const\": \"x\\\"y\"}", {"\"x\\\"y\""}, {"\"xy\""}},
    {"{\"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\", \"maxLength\": 2}]}", {"1", "\"ab\""}, {"\"abc\"", "true"}},
    {"{\"oneOf\": [{\"type\": \"null\"}, {\"type\": \"boolean\"}]}", {"null", "true"}, {"0"}},
    {"{\"type\": \"string\", \"minLength\": 2, \"maxLength\": 4}", {"\"ab\"", "\"a\\nbc\"", "\"éééé\""}, {"\"a\"", "\"abcde\""}},
    {"{\"type\": \"string\", \"minLength\": 1}", {"\"a\"", "\"abcdefgh\""}, {"\"\""}},
    {"{\"type\": \"string\", \"format\": \"date\"}", {"\"2026-12-07\""}, {"\"2026-13-07\"", "\"26-12-07\"", "\"2026-12-7\""}},
    {"{\"type\": \"string\", \"format\": \"date-time\"}", {"\"2026-12-07T11:45:00Z\"", "\"2026-12-07T11:45:00.123+01:00\""},
     {"\"2026-12-07 11:45:00Z\"", "\"2026-12-07T25:00:00Z\""}},
    {"{\"type\": \"string\", \"format\": \"uuid\"}", {"\"123e4567-e89b-12d3-a456-426614174000\""},
     {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\""}},
    {"{\"type\": \"integer\", \"minimum\": 0}", {"0", "7", "123456"}, {"-1", "-0"}},
    {"{\"type\": \"integer\", \"minimum\": 10, \"maximum\": 255}", {"10", "99", "100", "199", "255"}, {"9", "256", "300", "1000", "-10"}},
    {"{\"type\": \"integer\", \"minimum\": -5, \"maximum\": 3}", {"-5", "-1", "0", "3"}, {"-6", "4", "-0"}},
    {"{\"type\": \"integer\", \"exclusiveMinimum\": 0, \"exclusiveMaximum\": 10}", {"1", "9"}, {"0", "10"}},
    {"{\"type\": \"integer\", \"maximum\": -10}", {"-10", "-11", "-12345"}, {"-9", "0", "5"}},
    {"{\"type\": \"integer\", \"minimum\": 37}", {"37", "99", "100", "4000000"}, {"36", "10", "0"}},
    {"{\"$defs\": {\"node\": {\"type\": \"object\", \"properties\": {\"next\": {\"anyOf\": [{\"$ref\": \"#/$defs/node\"}, "
     "{\"type\": \"null\"}]}}, \"required\": [\"next\"], \"additionalProperties\": false}}, \"$ref\": \"#/$defs/node\"}",
     {"{\"next\": null}", "{\"next\": {\"next\": {\"next\": null}}}"}, {"{}", "{\"next\": 1}"}},
    {"{\"definitions\": {\"i\": {\"type\": \"integer\"}}, \"type\": \"array\", \"items\": {\"$ref\": \"#/definitions/i\"}}",
     {"[1, 2]"}, {"[\"1\"]"}},
    {"{}", {"1", "{\"a\": [null]}", "\"s\""}, {"", "{"}},
    {"true", {"[]", "false"}, {"x"}},
    {"{\"title\": \"t\", \"description\": \"d\", \"examples\": [1], \"default\": 1, \"$schema\": \"x\", \"type\": \"integer\"}",
     {"5"}, {"\"5\""}},
    {"{\"properties\": {\"name\": {\"type\": \"string\"}}, \"required\": [\"name\"], \"additionalProperties\": false}",
     {"{\"name\": \"x\"}"}, {"{}"}},
};

static bool matches(const tdm_grammar *g, const char *s) {
    bool ok = false;
    tdm_err err = {0};
    cr_assert_eq(tdm_grammar_matches(g, s, strlen(s), &ok, &err), TANDEM_OK, "%s", err.msg);
    return ok;
}

Test(json_schema, keywords) {
    for (size_t c = 0; c < sizeof CASES / sizeof CASES[0]; c++) {
        tdm_grammar *g = NULL;
        tdm_err err = {0};
        cr_assert_eq(tdm_json_schema_grammar(CASES[c].schema, strlen(CASES[c].schema), &g, &err), TANDEM_OK,
                     "schema %zu %s: %s", c, CASES[c].schema, err.msg);
        for (int k = 0; k < 8 && CASES[c].yes[k]; k++)
            cr_expect(matches(g, CASES[c].yes[k]), "schema %zu %s rejects %s", c, CASES[c].schema, CASES[c].yes[k]);
        for (int k = 0; k < 8 && CASES[c].no[k]; k++)
            cr_expect(!matches(g, CASES[c].no[k]), "schema %zu %s accepts %s", c, CASES[c].schema, CASES[c].no[k]);
        tdm_grammar_free(g);
    }
}

/* Every integer of a window against the range's bounds. */
Test(json_schema, integer_ranges_exhaustive) {
    const long long bounds[][2] = {{0, 0}, {0, 9}, {1, 10}, {5, 123}, {-123, -5}, {-99, 1000}, {17, 17}, {100, 999}, {98, 1002}};
    for (size_t b = 0; b < sizeof bounds / sizeof bounds[0]; b++) {
        char schema[128];
        snprintf(schema, sizeof schema, "{\"type\": \"integer\", \"minimum\": %lld, \"maximum\": %lld}", bounds[b][0],
                 bounds[b][1]);
        tdm_grammar *g = NULL;
        tdm_err err = {0};
        cr_assert_eq(tdm_json_schema_grammar(schema, strlen(schema), &g, &err), TANDEM_OK, "%s", err.msg);
        for (long long v = -1100; v <= 1100; v++) {
            char s[32];
            snprintf(s, sizeof s, "%lld", v);
            bool want = v >= bounds[b][0] && v <= bounds[b][1];
            cr_assert_eq(matches(g, s), want, "%s: %lld", schema, v);
        }
        tdm_grammar_free(g);
    }
}

Test(json_schema, json_object) {
    tdm_grammar *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_json_object_grammar(&g, &err), TANDEM_OK, "%s", err.msg);
    cr_expect(matches(g, "{}"));
    cr_expect(matches(g, "{\"a\": [1, 2.5, \"x\", {\"b\": null}], \"c\": true}"));
    cr_expect(!matches(g, "[]"));
    cr_expect(!matches(g, "1"));
    cr_expect(!matches(g, "{\"a\": }"));
    tdm_grammar_free(g);
}

typedef struct bad {
    const char *schema;
    tandem_status st;
    const char *error;
} bad;

static const bad BAD[] = {
    {"{\"type\": \"string\", \"pattern\": \"^a\"}", TANDEM_ERR_UNSUPPORTED, "json schema at #: keyword 'pattern' is not supported"},
    {"{\"properties\": {\"a\": {\"type\": \"string\", \"pattern\": \"x\"}}}", TANDEM_ERR_UNSUPPORTED,
     "at #/properties/a: keyword 'pattern'"},
    {"{\"type\": \"array\", \"items\": {\"type\": \"foo\"}}", TANDEM_ERR_FORMAT, "at #/items: unknown type 'foo'"},
    {"{\"type\": \"integer\", \"minLength\": 1}", TANDEM_ERR_UNSUPPORTED, "keyword 'minLength' is not supported here"},
    {"{\"type\": \"number\", \"minimum\": 1}", TANDEM_ERR_UNSUPPORTED, "minimum / maximum on a number"},
    {"{\"type\": \"integer\", \"minimum\": 1.5}", TANDEM_ERR_UNSUPPORTED, "'minimum' on an integer must be an integer"},
    {"{\"type\": \"integer\", \"minimum\": 5, \"maximum\": 1}", TANDEM_ERR_FORMAT, "the integer range [5, 1] is empty"},
    {"{\"type\": \"string\", \"format\": \"email\"}", TANDEM_ERR_UNSUPPORTED, "string format 'email'"},
    {"{\"$ref\": \"#/$defs/missing\"}", TANDEM_ERR_FORMAT, "$ref '#/$defs/missing' names no definition"},
    {"{\"$ref\": \"http://x/y\"}", TANDEM_ERR_UNSUPPORTED, "only #/$defs/NAME"},
    {"{\"anyOf\": [{\"type\": \"string\"}, {\"allOf\": []}]}", TANDEM_ERR_UNSUPPORTED, "at #/anyOf/1: keyword 'allOf'"},
    {"{\"type\": \"object\", \"properties\": {\"a\": {}}, \"required\": [\"b\"]}", TANDEM_ERR_UNSUPPORTED,
     "required property 'b' is not in 'properties'"},
    {"{\"type\": \"array\", \"maxItems\": 100000}", TANDEM_ERR_UNSUPPORTED, "'maxItems' 100000 above the limit 10000"},
    {"{\"type\": \"array\", \"minItems\": -1}", TANDEM_ERR_FORMAT, "'minItems' must be a non-negative integer"},
    {"{\"enum\": []}", TANDEM_ERR_FORMAT, "'enum' must be a non-empty array"},
    {"false", TANDEM_ERR_UNSUPPORTED, "the schema false matches nothing"},
    {"{\"properties\": {\"a/b~c\": false}}", TANDEM_ERR_UNSUPPORTED, "at #/properties/a~1b~0c: the schema false"},
    {"[1]", TANDEM_ERR_FORMAT, "a schema must be an object or a boolean"},
    {"{\"type\": ", TANDEM_ERR_FORMAT, "json schema: not JSON"},
    {"{\"type\": \"integer\", \"maximum\": 10000000000000000}", TANDEM_ERR_UNSUPPORTED, "beyond 15 digits"},
};

Test(json_schema, bad_schemas) {
    for (size_t c = 0; c < sizeof BAD / sizeof BAD[0]; c++) {
        tdm_grammar *g = NULL;
        tdm_err err = {0};
        tandem_status st = tdm_json_schema_grammar(BAD[c].schema, strlen(BAD[c].schema), &g, &err);
        cr_expect_eq(st, BAD[c].st, "%s: status %d (%s)", BAD[c].schema, st, err.msg);
        cr_expect_null(g);
        cr_expect(strstr(err.msg, BAD[c].error) != NULL, "%s: error \"%s\", expected \"%s\"", BAD[c].schema, err.msg,
                  BAD[c].error);
    }
}
