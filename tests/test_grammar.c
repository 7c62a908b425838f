/* test_grammar.c - the GBNF grammar engine: what grammars accept and reject, the
 * errors of bad grammars, the token mask against a brute-force check on the pycode
 * and (when present) the real Qwen vocabularies, and snapshots / rollbacks fuzzed
 * against replays from scratch. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "grammar.h"
#include "testutil.h"
#include "tokenizer.h"

static const char *JSON_GBNF =
    "# JSON, whitespace bounded\n"
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9]{1,4})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static tdm_grammar *compile(const char *text) {
    tdm_grammar *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_grammar_parse(text, strlen(text), &g, &err), TANDEM_OK, "grammar <<%s>>: %s", text, err.msg);
    return g;
}

static bool matches(const tdm_grammar *g, const char *s) {
    bool ok = false;
    tdm_err err = {0};
    cr_assert_eq(tdm_grammar_matches(g, s, strlen(s), &ok, &err), TANDEM_OK, "%s", err.msg);
    return ok;
}

typedef struct gcase {
    const char *grammar;
    const char *yes[8];
    const char *no[8];
} gcase;

static const gcase CASES[] = {
    {"root ::= \"abc\"", {"abc"}, {"", "ab", "abcd", "abd"}},
    {"root ::= \"a\" | \"bc\" | \"\"", {"a", "bc", ""}, {"b", "abc"}},
    {"root ::= [a-c]+ \"!\"", {"a!", "abcab!"}, {"!", "ad!", "a"}},
    {"root ::= [^a-c\\n]*", {"", "xyz", "é€😀"}, {"a", "x\n"}},
    {"root ::= . .", {"ab", "é😀", "\n\t"}, {"a", "abc"}},
    {"root ::= \"x\"{3}", {"xxx"}, {"xx", "xxxx"}},
    {"root ::= \"x\"{2,}", {"xx", "xxxxxxx"}, {"x", ""}},
    {"root ::= \"x\"{1,3} \"y\"{0,1}", {"x", "xxx", "xy", "xxxy"}, {"xxxx", "y", "xyy"}},
    {"root ::= (\"ab\" | \"c\")* \"d\"?", {"", "ababc", "cd", "d"}, {"a", "dd", "abd d"}},
    {"root ::= item (\",\" item)*\nitem ::= [0-9]+ # a number\n", {"1", "12,3,456"}, {"", "1,", ",1", "1,,2"}},
    {"root ::= \"\\x41\\u00e9\\U0001F600\\n\\t\\\"\\\\\"", {"Aé😀\n\t\"\\"}, {"A"}},
    {"root ::= [\\x00-\\x7F]+", {"abc\x7f"}, {"é"}},
    {"root ::= paren\nparen ::= \"(\" paren* \")\"", {"()", "(()())", "((()))"}, {"(", "())", "(()"}},
    {"root ::= (\n  \"a\" |\n  \"b\"\n) \"c\"\n\n# trailing comment", {"ac", "bc"}, {"c", "abc"}},
    {"root ::= a b\na ::= \"x\"?\nb ::= \"y\"? \"z\"", {"xyz", "z", "xz", "yz"}, {"x", "xy"}},
    {"root ::= [a-z_-]+", {"a-b_c"}, {"A"}},
    {"root ::= (\"a\" (\"b\" (\"c\")?)?)+", {"a", "abcab", "aaabc"}, {"b", "ac"}},
};

Test(grammar, accepts_and_rejects) {
    for (size_t c = 0; c < TDM_ARRAY_LEN(CASES); c++) {
        tdm_grammar *g = compile(CASES[c].grammar);
        for (int k = 0; k < 8 && CASES[c].yes[k]; k++)
            cr_expect(matches(g, CASES[c].yes[k]), "grammar %zu <<%s>> rejects \"%s\"", c, CASES[c].grammar, CASES[c].yes[k]);
        for (int k = 0; k < 8 && CASES[c].no[k]; k++)
            cr_expect(!matches(g, CASES[c].no[k]), "grammar %zu <<%s>> accepts \"%s\"", c, CASES[c].grammar, CASES[c].no[k]);
        tdm_grammar_free(g);
    }
}

Test(grammar, json) {
    tdm_grammar *g = compile(JSON_GBNF);
    const char *yes[] = {"{}", "{\"a\": 1}", "{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\n\"], \"b\": {}}",
                         "{\n  \"k\": \"é😀\"\n}"};
    const char *no[] = {"[]", "{", "{\"a\" 1}", "{\"a\": 01x}", "{\"a\": \"\n\"}", "{\"a\":1,}", "{}  x"};
    for (size_t k = 0; k < TDM_ARRAY_LEN(yes); k++) cr_expect(matches(g, yes[k]), "rejects %s", yes[k]);
    for (size_t k = 0; k < TDM_ARRAY_LEN(no); k++) cr_expect(!matches(g, no[k]), "accepts %s", no[k]);
    tdm_grammar_free(g);
}

typedef struct bad {
    const char *grammar;
    const char *error;
} bad;

static const bad BAD[] = {
    {"", "no 'root' rule"},
    {"# only a comment\n", "no 'root' rule"},
    {"rot ::= \"a\"", "no 'root' rule"},
    {"root ::= foo", "line 1:10: undefined rule 'foo'"},
    {"root ::= \"a\"\nroot ::= \"b\"", "line 2:1: rule 'root' defined again (first at line 1:1)"},
    {"root ::= \"abc", "line 1:10: unterminated literal"},
    {"root ::= [a-z", "line 1:10: unterminated character class"},
    {"root ::= []", "line 1:10: empty character class"},
    {"root ::= [z-a]", "line 1:12: character range end below its start"},
    {"root ::= (\"a\"", "line 1:10: unmatched '('"},
    {"root ::= \"a\")", "line 1:13: unexpected ')'"},
    {"root ::= * \"a\"", "line 1:10: repetition '*' without an item before it"},
    {"root ::= \"a\"{2,1}", "repetition {2,1}: maximum below minimum"},
    {"root ::= \"a\"{99999}", "repetition bound above the limit 10000"},
    {"root ::= \"a\"{2", "expected '}' closing the repetition"},
    {"root ::= \"\\q\"", "line 1:11: unknown escape '\\q'"},
    {"root ::= \"\\x4\"", "escape needs 2 hex digits"},
    {"root ::= \"\\uD800\"", "is not a Unicode scalar value"},
    {"root ::= \"\xff\"", "invalid UTF-8"},
    {"root = \"a\"", "line 1:6: expected '::='"},
    {"root ::= \"a\"\n| \"b\"", "line 2:1: expected a rule name"},
    {"root ::= root \"a\" | \"b\"", "left recursion: rule 'root'"},
    {"root ::= a\na ::= b \"x\" | \"y\"\nb ::= a", "left recursion: rule"},
    {"root ::= e a\ne ::= \"\" | \"z\"\na ::= root \"x\" | \"y\"", "left recursion"},
    {"root ::= (\"a\"?)*", "left recursion"},
    {"root ::= \"a\" root", "the grammar can match nothing"},
    {"root ::= x\nx ::= \"(\" x \")\"", "the grammar can match nothing"},
    {"root ::= \"a\" \"\n\"", "newline inside a literal"},
};

Test(grammar, bad_grammars) {
    for (size_t c = 0; c < TDM_ARRAY_LEN(BAD); c++) {
        tdm_grammar *g = (tdm_grammar *)1;
        tdm_err err = {0};
        tandem_status st = tdm_grammar_parse(BAD[c].grammar, strlen(BAD[c].grammar), &g, &err);
        cr_expect_eq(st, TANDEM_ERR_FORMAT, "<<%s>>: status %d (%s)", BAD[c].grammar, st, err.msg);
        cr_expect_null(g);
        cr_expect(strstr(err.msg, BAD[c].error) != NULL, "<<%s>>: error \"%s\", expected \"%s\"", BAD[c].grammar,
                  err.msg, BAD[c].error);
    }
}

Test(grammar, limits) {
    /* nesting past the limit */
    char deep[400] = "root ::= ";
    for (int k = 0; k < 70; k++) strcat(deep, "(");
    strcat(deep, "\"a\"");
    for (int k = 0; k < 70; k++) strcat(deep, ")");
    tdm_grammar *g = NULL;
    tdm_err err = {0};
    cr_expect_eq(tdm_grammar_parse(deep, strlen(deep), &g, &err), TANDEM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "nested deeper than the limit 64"), "%s", err.msg);
    /* elements past the limit through repetitions */
    char big[400] = "root ::=";
    for (int k = 0; k < 11; k++) strcat(big, " \"abcdefghij\"{10000}");
    cr_expect_eq(tdm_grammar_parse(big, strlen(big), &g, &err), TANDEM_ERR_FORMAT);
    cr_expect(strstr(err.msg, "elements (after expanding repetitions)"), "%s", err.msg);
    /* bounded repetitions generate rules */
    g = compile("root ::= \"x\"{0,500}");
    cr_expect_geq(tdm_grammar_n_rules(g), 500);
    char s[502];
    memset(s, 'x', 501);
    s[500] = 0;
    cr_expect(matches(g, s));
    s[500] = 'x', s[501] = 0;
    cr_expect(!matches(g, s));
    tdm_grammar_free(g);
}

/* ---- matcher: partial UTF-8, accept errors, completion ---- */

Test(grammar, partial_utf8) {
    tdm_grammar *g = compile("root ::= \"é\" [😀-😂] \"x\"");
    tdm_gmatch *m;
    tdm_err err = {0};
    cr_assert_eq(tdm_gmatch_create(g, &m, &err), TANDEM_OK);
    const char *t = "é😀x"; /* C3 A9 F0 9F 98 80 78 */
    cr_assert_eq(tdm_gmatch_accept(m, t, 1, &err), TANDEM_OK, "%s", err.msg);
    cr_expect(!tdm_gmatch_is_complete(m));
    cr_assert_eq(tdm_gmatch_accept(m, t + 1, 2, &err), TANDEM_OK, "%s", err.msg);
    /* F0 9F 99 (U+1F640..) cannot become U+1F600..U+1F602 */
    cr_expect_eq(tdm_gmatch_accept(m, "\xF0\x9F\x99", 3, &err), TANDEM_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "the grammar does not allow"), "%s", err.msg);
    cr_assert_eq(tdm_gmatch_accept(m, t + 3, 2, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_gmatch_accept(m, t + 5, 2, &err), TANDEM_OK, "%s", err.msg);
    cr_expect(tdm_gmatch_is_complete(m));
    cr_expect(tdm_gmatch_is_finished(m));
    cr_expect_eq(tdm_gmatch_accept(m, "x", 1, &err), TANDEM_ERR_INVALID_ARG);
    cr_expect_eq(tdm_gmatch_mark(m), 4);
    cr_expect_eq(tdm_gmatch_rollback(m, 5, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_gmatch_rollback(m, 1, &err), TANDEM_OK);
    cr_expect_eq(tdm_gmatch_accept(m, "\xA9\xF0\x9F\x98\x82x", 6, &err), TANDEM_OK, "%s", err.msg);
    cr_expect(tdm_gmatch_is_complete(m));
    /* invalid UTF-8 never matches, even under . */
    tdm_gmatch_free(m);
    tdm_grammar_free(g);
    g = compile("root ::= .*");
    cr_assert_eq(tdm_gmatch_create(g, &m, &err), TANDEM_OK);
    cr_expect_eq(tdm_gmatch_accept(m, "\xC0\x80", 2, &err), TANDEM_ERR_INVALID_ARG);
    cr_expect_eq(tdm_gmatch_accept(m, "\xED\xA0\x80", 3, &err), TANDEM_ERR_INVALID_ARG); /* a surrogate */
    cr_expect_eq(tdm_gmatch_accept(m, "\x80", 1, &err), TANDEM_ERR_INVALID_ARG);
    cr_expect_eq(tdm_gmatch_accept(m, "ok \xE2\x82\xAC", 6, &err), TANDEM_OK);
    tdm_gmatch_free(m);
    tdm_grammar_free(g);
}

/* ---- the mask against brute force ---- */

/* The mask by trying every token's bytes from the current state. */
static void brute_mask(tdm_gmatch *m, const tdm_gvocab *v, uint32_t *mask) {
    memset(mask, 0, tdm_gvocab_mask_words(v) * 4);
    uint32_t mark = tdm_gmatch_mark(m);
    for (int32_t id = 0; id < tdm_gvocab_n(v); id++) {
        size_t len;
        const char *b = tdm_gvocab_bytes(v, id, &len);
        bool ok;
        if (tdm_gvocab_is_eog(v, id)) ok = tdm_gmatch_is_complete(m);
        else if (!b) ok = false;
        else {
            ok = tdm_gmatch_accept(m, b, len, NULL) == TANDEM_OK;
            if (ok) cr_assert_eq(tdm_gmatch_rollback(m, mark, NULL), TANDEM_OK);
        }
        if (ok) mask[id / 32] |= 1u << (id % 32);
    }
    cr_assert_eq(tdm_gmatch_mark(m), mark);
}

/* Random walks through the grammar (tokens drawn among the allowed ones, preferring
 * those that move towards the end sometimes), checking the mask at every state. */
static void check_masks(const tdm_grammar *g, const tdm_gvocab *v, int walks, int steps, uint64_t seed,
                        tdm_gshare *sh, const char *what) {
    size_t nw = tdm_gvocab_mask_words(v);
    uint32_t *fast = calloc(nw, 4), *slow = calloc(nw, 4);
    int32_t *allowed = calloc((size_t)tdm_gvocab_n(v), sizeof(int32_t));
    int checked = 0;
    for (int w = 0; w < walks; w++) {
        tdm_gmatch *m;
        tdm_err err = {0};
        cr_assert_eq(tdm_gmatch_create(g, &m, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(tdm_gmatch_share(m, sh, &err), TANDEM_OK, "%s", err.msg);
        for (int s = 0; s < steps; s++) {
            int32_t n_allowed = -1;
            cr_assert_eq(tdm_gmatch_mask(m, v, fast, &n_allowed, &err), TANDEM_OK, "%s", err.msg);
            brute_mask(m, v, slow);
            int32_t n = 0;
            for (int32_t id = 0; id < tdm_gvocab_n(v); id++) {
                bool a = fast[id / 32] >> (id % 32) & 1, b = slow[id / 32] >> (id % 32) & 1;
                if (a != b) {
                    size_t len;
                    const char *bytes = tdm_gvocab_bytes(v, id, &len);
                    cr_assert(false, "%s: walk %d step %d: token %d \"%.*s\": mask %d, brute force %d", what, w, s, id,
                              (int)len, bytes ? bytes : "", a, b);
                }
                if (a && !tdm_gvocab_is_eog(v, id)) allowed[n++] = id;
            }
            int32_t bits = 0;
            for (size_t k = 0; k < nw; k++) bits += __builtin_popcount(fast[k]);
            cr_assert_eq(n_allowed, bits, "%s: the count", what);
            checked++;
            if (n == 0) break;
            int32_t id = allowed[tdm_test_rand(&seed) % (uint64_t)n];
            cr_assert_eq(tdm_gmatch_accept_token(m, v, id, &err), TANDEM_OK, "%s", err.msg);
        }
        tdm_gmatch_free(m);
    }
    cr_log_info("%s: %d masks equal to brute force", what, checked);
    free(fast), free(slow), free(allowed);
}

typedef struct vocab_of {
    tdm_gguf *gg;
    tdm_tokenizer *t;
    tdm_gvocab *v;
} vocab_of;

static bool load_vocab(const char *path, vocab_of *o) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    fclose(f);
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open(path, &o->gg, &err), TANDEM_OK, "%s: %s", path, err.msg);
    cr_assert_eq(tdm_tokenizer_load(o->gg, &o->t, &err), TANDEM_OK, "%s: %s", path, err.msg);
    cr_assert_eq(tdm_gvocab_create(o->t, &o->v, &err), TANDEM_OK, "%s: %s", path, err.msg);
    return true;
}

static void unload_vocab(vocab_of *o) {
    tdm_gvocab_free(o->v);
    tdm_tokenizer_free(o->t);
    tdm_gguf_close(o->gg);
}

static const char *MASK_GRAMMARS[] = {
    NULL, /* JSON_GBNF */
    "root ::= (\"def \" [a-z_]+ \"(\" [a-z, ]* \"):\" \"\\n\" (\"    \" [^\\n]* \"\\n\")+)+",
    "root ::= (\"é\" | \"日本\" | [😀-😏] | [a-z ])+ \".\"",
    "root ::= \"SELECT \" col (\", \" col)* \" FROM \" [a-z]+ \";\"\ncol ::= [a-z]+ | \"*\"",
};

static void mask_suite(const tdm_gvocab *v, int walks, int steps, const char *name) {
    for (size_t k = 0; k < TDM_ARRAY_LEN(MASK_GRAMMARS); k++) {
        tdm_grammar *g = compile(MASK_GRAMMARS[k] ? MASK_GRAMMARS[k] : JSON_GBNF);
        char what[64];
        snprintf(what, sizeof what, "%s, grammar %zu", name, k);
        check_masks(g, v, walks, steps, 1234 + k, NULL, what);
        tdm_grammar_free(g);
    }
}

Test(grammar, mask_pycode, .timeout = 300) {
    vocab_of o = {0};
    cr_assert(load_vocab(tdm_test_model_path("pycode-target-f16.gguf"), &o));
    mask_suite(o.v, 4, 30, "pycode");
    unload_vocab(&o);
}

Test(grammar, mask_qwen, .timeout = 600) {
    vocab_of o = {0};
    if (!load_vocab(tdm_test_model_path("real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"), &o)) {
        cr_skip_test("models/real/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf absent");
        return;
    }
    /* the EOG ids: end-of-generation, never text */
    const int32_t *eog;
    int32_t n_eog = tdm_tok_eog_ids(o.t, &eog);
    cr_assert_gt(n_eog, 0);
    for (int32_t k = 0; k < n_eog; k++) cr_expect(tdm_gvocab_is_eog(o.v, eog[k]));
    mask_suite(o.v, 2, 12, "qwen");
    unload_vocab(&o);
}

/* A vocabulary of every byte, some multi-byte characters, some longer strings and an
 * EOG: small enough for thorough fuzzing. */
static tdm_gvocab *small_vocab(void) {
    static const char *extra[] = {"\"", "\":", "{\"", "\"}", "\": \"", "true", "tr", "null", "12", "3.5", "é", "\xC3",
                                  "\xA9", "\xF0\x9F", "\x98\x80", "😀", ", ", "\n  ", "[1", "]}", "abc", "_x"};
    int32_t n = 256 + (int32_t)TDM_ARRAY_LEN(extra) + 2;
    const char **b = calloc((size_t)n, sizeof(char *));
    size_t *l = calloc((size_t)n, sizeof(size_t));
    char bytes[256]; /* (copied by the vocabulary) */
    for (int k = 0; k < 256; k++) bytes[k] = (char)k, b[k] = bytes + k, l[k] = 1;
    for (size_t k = 0; k < TDM_ARRAY_LEN(extra); k++) b[256 + k] = extra[k], l[256 + k] = strlen(extra[k]);
    b[n - 2] = "", l[n - 2] = 0; /* a control token */
    b[n - 1] = "", l[n - 1] = 0; /* the EOG */
    int32_t eog = n - 1;
    tdm_gvocab *v = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_gvocab_create_raw(n, b, l, &eog, 1, &v, &err), TANDEM_OK, "%s", err.msg);
    free(b), free(l);
    return v;
}

Test(grammar, mask_small_vocab) {
    tdm_gvocab *v = small_vocab();
    mask_suite(v, 10, 40, "small");
    tdm_gvocab_free(v);
}

/* ---- snapshots: random walks with random rollbacks equal a replay from scratch ---- */

static void same_state(tdm_gmatch *a, tdm_gmatch *b, const tdm_gvocab *v, const char *where) {
    size_t nw = tdm_gvocab_mask_words(v);
    uint32_t *ma = calloc(nw, 4), *mb = calloc(nw, 4);
    cr_assert_eq(tdm_gmatch_mask(a, v, ma, NULL, NULL), TANDEM_OK);
    cr_assert_eq(tdm_gmatch_mask(b, v, mb, NULL, NULL), TANDEM_OK);
    cr_assert_eq(memcmp(ma, mb, nw * 4), 0, "%s: masks differ", where);
    cr_assert_eq(tdm_gmatch_is_complete(a), tdm_gmatch_is_complete(b), "%s", where);
    cr_assert_eq(tdm_gmatch_n_stacks(a), tdm_gmatch_n_stacks(b), "%s", where);
    free(ma), free(mb);
}

Test(grammar, snapshot_fuzz) {
    tdm_gvocab *v = small_vocab();
    tdm_grammar *g = compile(JSON_GBNF);
    uint64_t seed = 99;
    size_t nw = tdm_gvocab_mask_words(v);
    uint32_t *mask = calloc(nw, 4);
    int32_t *path = calloc(4096, sizeof(int32_t)), *allowed = calloc((size_t)tdm_gvocab_n(v), sizeof(int32_t));
    for (int round = 0; round < 30; round++) {
        tdm_gmatch *m;
        cr_assert_eq(tdm_gmatch_create(g, &m, NULL), TANDEM_OK);
        /* path[0 .. len): the accepted tokens; path[0 .. base) committed, then one
         * mark each */
        uint32_t len = 0, base = 0;
        for (int step = 0; step < 200; step++) {
            uint64_t r = tdm_test_rand(&seed) % 10;
            if (r < 2 && len > base) { /* roll back to a random mark */
                uint32_t to = base + (uint32_t)(tdm_test_rand(&seed) % (len - base + 1));
                cr_assert_eq(tdm_gmatch_rollback(m, to - base, NULL), TANDEM_OK);
                len = to;
            } else if (r == 2) { /* commit: the history restarts at mark 0 */
                cr_assert_eq(tdm_gmatch_commit(m, NULL), TANDEM_OK);
                cr_assert_eq(tdm_gmatch_mark(m), 0);
                base = len;
            } else {
                cr_assert_eq(tdm_gmatch_mask(m, v, mask, NULL, NULL), TANDEM_OK);
                int32_t n = 0;
                for (int32_t id = 0; id < tdm_gvocab_n(v); id++)
                    if ((mask[id / 32] >> (id % 32) & 1) && !tdm_gvocab_is_eog(v, id)) allowed[n++] = id;
                if (n == 0) continue;
                int32_t id = allowed[tdm_test_rand(&seed) % (uint64_t)n];
                cr_assert_eq(tdm_gmatch_accept_token(m, v, id, NULL), TANDEM_OK);
                path[len++] = id;
                cr_assert_eq(tdm_gmatch_mark(m), len - base);
            }
            tdm_gmatch *re;
            cr_assert_eq(tdm_gmatch_create(g, &re, NULL), TANDEM_OK);
            for (uint32_t k = 0; k < len; k++) cr_assert_eq(tdm_gmatch_accept_token(re, v, path[k], NULL), TANDEM_OK);
            char where[64];
            snprintf(where, sizeof where, "round %d step %d", round, step);
            same_state(m, re, v, where);
            tdm_gmatch_free(re);
        }
        tdm_gmatch_free(m);
    }
    free(mask), free(path), free(allowed);
    tdm_grammar_free(g);
    tdm_gvocab_free(v);
}

Test(grammar, commit_keeps_the_state) {
    tdm_gvocab *v = small_vocab();
    tdm_grammar *g = compile(JSON_GBNF);
    tdm_gmatch *m, *re;
    cr_assert_eq(tdm_gmatch_create(g, &m, NULL), TANDEM_OK);
    cr_assert_eq(tdm_gmatch_create(g, &re, NULL), TANDEM_OK);
    const char *doc = "{\"a\": [1, 2, {\"b\": \"x\xC3";
    cr_assert_eq(tdm_gmatch_accept(m, doc, strlen(doc), NULL), TANDEM_OK);
    cr_assert_eq(tdm_gmatch_accept(re, doc, strlen(doc), NULL), TANDEM_OK);
    cr_assert_eq(tdm_gmatch_commit(m, NULL), TANDEM_OK);
    cr_expect_eq(tdm_gmatch_mark(m), 0);
    same_state(m, re, v, "after commit");
    const char *rest = "\xA9\"}]}";
    cr_assert_eq(tdm_gmatch_accept(m, rest, strlen(rest), NULL), TANDEM_OK);
    cr_expect(tdm_gmatch_is_complete(m));
    cr_assert_eq(tdm_gmatch_rollback(m, 0, NULL), TANDEM_OK);
    same_state(m, re, v, "after commit and rollback");
    tdm_gmatch_free(m), tdm_gmatch_free(re);
    tdm_grammar_free(g);
    tdm_gvocab_free(v);
}

/* The empty stack reached before a commit must be reachable after it at every later
 * step (the expansion epochs restart at a commit). */
Test(grammar, commit_then_complete) {
    tdm_grammar *g = compile("root ::= \"a*(\"");
    tdm_gmatch *m;
    cr_assert_eq(tdm_gmatch_create(g, &m, NULL), TANDEM_OK);
    cr_assert_eq(tdm_gmatch_accept(m, "a*(", 3, NULL), TANDEM_OK);
    cr_assert(tdm_gmatch_is_complete(m));
    cr_assert_eq(tdm_gmatch_rollback(m, 0, NULL), TANDEM_OK);
    cr_assert_eq(tdm_gmatch_accept(m, "a*", 2, NULL), TANDEM_OK);
    cr_assert_eq(tdm_gmatch_commit(m, NULL), TANDEM_OK);
    for (int k = 0; k < 20; k++) {
        cr_assert_eq(tdm_gmatch_accept(m, "(", 1, NULL), TANDEM_OK, "step %d", k);
        cr_assert(tdm_gmatch_is_complete(m), "step %d", k);
        cr_assert_eq(tdm_gmatch_rollback(m, 0, NULL), TANDEM_OK);
        cr_assert_eq(tdm_gmatch_commit(m, NULL), TANDEM_OK);
    }
    tdm_gmatch_free(m);
    tdm_grammar_free(g);
}

Test(grammar, eog_and_control_tokens) {
    tdm_gvocab *v = small_vocab();
    int32_t n = tdm_gvocab_n(v);
    tdm_grammar *g = compile("root ::= \"a\"*");
    tdm_gmatch *m;
    cr_assert_eq(tdm_gmatch_create(g, &m, NULL), TANDEM_OK);
    uint32_t *mask = calloc(tdm_gvocab_mask_words(v), 4);
    int32_t na;
    cr_assert_eq(tdm_gmatch_mask(m, v, mask, &na, NULL), TANDEM_OK);
    cr_expect(mask[(n - 1) / 32] >> ((n - 1) % 32) & 1, "EOG allowed where complete");
    cr_expect(!(mask[(n - 2) / 32] >> ((n - 2) % 32) & 1), "a control token never");
    cr_expect(mask['a' / 32] >> ('a' % 32) & 1);
    cr_expect_eq(na, 2);
    cr_expect_eq(tdm_gmatch_accept_token(m, v, n - 2, NULL), TANDEM_ERR_INVALID_ARG);
    tdm_gmatch_free(m);
    tdm_grammar_free(g);
    g = compile("root ::= \"ab\"");
    cr_assert_eq(tdm_gmatch_create(g, &m, NULL), TANDEM_OK);
    cr_assert_eq(tdm_gmatch_mask(m, v, mask, &na, NULL), TANDEM_OK);
    cr_expect(!(mask[(n - 1) / 32] >> ((n - 1) % 32) & 1), "EOG not allowed before the end");
    cr_expect_eq(tdm_gmatch_accept_token(m, v, n - 1, NULL), TANDEM_ERR_INVALID_ARG);
    free(mask);
    tdm_gmatch_free(m);
    tdm_grammar_free(g);
    tdm_gvocab_free(v);
}

/* One grammar and one vocabulary shared by threads, each with its own matcher (and a
 * vocabulary built on each thread too), then also one mask cache (tdm_gshare): the
 * masks equal the single-threaded ones. */
typedef struct shared {
    const tdm_grammar *g;
    const tdm_gvocab *v;
    tdm_gshare *sh;
    const char *doc;
    uint64_t sum; /* a checksum of every mask along the document */
    bool ok;
} shared;

static uint64_t masks_along(const tdm_grammar *g, const tdm_gvocab *v, tdm_gshare *sh, const char *doc) {
    tdm_gmatch *m;
    if (tdm_gmatch_create(g, &m, NULL) != TANDEM_OK) return 0;
    if (sh && tdm_gmatch_share(m, sh, NULL) != TANDEM_OK) return tdm_gmatch_free(m), 0;
    size_t nw = tdm_gvocab_mask_words(v);
    uint32_t *mask = calloc(nw, 4);
    uint64_t sum = 1469598103934665603ull;
    for (size_t i = 0; doc[i]; i++) {
        if (tdm_gmatch_mask(m, v, mask, NULL, NULL) != TANDEM_OK) break;
        for (size_t k = 0; k < nw; k++) sum = (sum ^ mask[k]) * 1099511628211ull;
        if (tdm_gmatch_accept(m, doc + i, 1, NULL) != TANDEM_OK) break;
    }
    free(mask);
    tdm_gmatch_free(m);
    return sum;
}

static void *thread_main(void *arg) {
    shared *s = arg;
    tdm_gvocab *own = small_vocab();
    s->sum = masks_along(s->g, s->v, s->sh, s->doc);
    s->ok = masks_along(s->g, own, NULL, s->doc) == s->sum;
    tdm_gvocab_free(own);
    return NULL;
}

Test(grammar, shared_across_threads) {
    tdm_grammar *g = compile(JSON_GBNF);
    tdm_gvocab *v = small_vocab();
    const char *doc = "{\"a\": [1, 2.5, {\"b\": \"x\u00e9y\"}], \"c\": null}";
    uint64_t want = masks_along(g, v, NULL, doc);
    tdm_gshare *sh = NULL;
    cr_assert_eq(tdm_gshare_create(g, v, 1 << 20, &sh, NULL), TANDEM_OK);
    for (int round = 0; round < 2; round++) { /* (round 1: the threads' matchers share sh) */
        shared s[4];
        pthread_t th[4];
        for (int k = 0; k < 4; k++) {
            s[k] = (shared){g, v, round ? sh : NULL, doc, 0, false};
            cr_assert_eq(pthread_create(&th[k], NULL, thread_main, &s[k]), 0);
        }
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            cr_expect_eq(s[k].sum, want, "round %d thread %d", round, k);
            cr_expect(s[k].ok, "round %d thread %d: its own vocabulary", round, k);
        }
    }
    uint64_t hits, misses;
    tdm_gshare_counts(sh, &hits, &misses);
    cr_expect_gt(hits, 0, "the threads' states met in the shared cache (%llu misses)", (unsigned long long)misses);
    tdm_gshare_free(sh);
    tdm_gvocab_free(v);
    tdm_grammar_free(g);
}

/* A mask cache shared by matchers of one grammar: every mask along random walks of
 * several matchers equals brute force, a cache of the fewest entries (16: entries
 * replaced) included; a state reached along another history (other node ids) is
 * found by its content; a cache of another grammar is refused. */
Test(grammar, mask_shared_cache) {
    tdm_gvocab *v = small_vocab();
    for (size_t k = 0; k < TDM_ARRAY_LEN(MASK_GRAMMARS); k++) {
        tdm_grammar *g = compile(MASK_GRAMMARS[k] ? MASK_GRAMMARS[k] : JSON_GBNF);
        for (int small = 0; small < 2; small++) {
            tdm_gshare *sh = NULL;
            cr_assert_eq(tdm_gshare_create(g, v, small ? 1 : 1 << 20, &sh, NULL), TANDEM_OK);
            char what[64];
            snprintf(what, sizeof what, "shared cache%s, grammar %zu", small ? " (16 entries)" : "", k);
            /* (the same seed twice: the second walks meet the first's states) */
            check_masks(g, v, 4, 30, 99 + k, sh, what);
            check_masks(g, v, 4, 30, 99 + k, sh, what);
            uint64_t hits, misses;
            tdm_gshare_counts(sh, &hits, &misses);
            cr_expect_gt(hits, 0, "%s: hits (%llu misses)", what, (unsigned long long)misses);
            tdm_gshare_free(sh);
        }
        tdm_grammar_free(g);
    }
    /* one state by two histories: byte by byte with a mask at each byte (its nodes
     * made in that order, and the walks' made and dropped), and the text at once */
    tdm_grammar *g = compile(JSON_GBNF);
    tdm_gshare *sh = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_gshare_create(g, v, 1 << 20, &sh, &err), TANDEM_OK, "%s", err.msg);
    const char *doc = "{\"a\": [1, {\"b\": \"x";
    const size_t nw = tdm_gvocab_mask_words(v);
    uint32_t *ma = calloc(nw, 4), *mb = calloc(nw, 4), *slow = calloc(nw, 4);
    tdm_gmatch *a, *b;
    cr_assert_eq(tdm_gmatch_create(g, &a, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_gmatch_create(g, &b, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_gmatch_share(a, sh, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_gmatch_share(b, sh, &err), TANDEM_OK, "%s", err.msg);
    for (size_t i = 0; doc[i]; i++) {
        cr_assert_eq(tdm_gmatch_accept(a, doc + i, 1, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(tdm_gmatch_mask(a, v, ma, NULL, &err), TANDEM_OK, "%s", err.msg);
    }
    cr_assert_eq(tdm_gmatch_accept(b, doc, strlen(doc), &err), TANDEM_OK, "%s", err.msg);
    uint64_t h0, m0, h1, m1;
    tdm_gshare_counts(sh, &h0, &m0);
    int32_t na = -1;
    cr_assert_eq(tdm_gmatch_mask(b, v, mb, &na, &err), TANDEM_OK, "%s", err.msg);
    tdm_gshare_counts(sh, &h1, &m1);
    cr_expect_eq(h1, h0 + 1, "the state found by its content");
    cr_expect_eq(m1, m0);
    cr_expect_eq(memcmp(ma, mb, nw * 4), 0);
    brute_mask(b, v, slow);
    cr_expect_eq(memcmp(mb, slow, nw * 4), 0);
    int32_t bits = 0;
    for (size_t k = 0; k < nw; k++) bits += __builtin_popcount(mb[k]);
    cr_expect_eq(na, bits);
    /* another grammar's cache */
    tdm_grammar *g2 = compile(JSON_GBNF);
    tdm_gshare *sh2 = NULL;
    cr_assert_eq(tdm_gshare_create(g2, v, 1 << 20, &sh2, &err), TANDEM_OK, "%s", err.msg);
    cr_expect_eq(tdm_gmatch_share(a, sh2, &err), TANDEM_ERR_INVALID_ARG);
    cr_expect(strstr(err.msg, "another grammar"), "%s", err.msg);
    cr_expect_eq(tdm_gmatch_share(a, NULL, &err), TANDEM_OK);
    tdm_gshare_free(sh2);
    tdm_grammar_free(g2);
    tdm_gmatch_free(a), tdm_gmatch_free(b);
    free(ma), free(mb), free(slow);
    tdm_gshare_free(sh);
    tdm_grammar_free(g);
    tdm_gvocab_free(v);
}

/* Token bytes from the tokenizers: SentencePiece byte-fallback tokens <0xHH> are that
 * byte and U+2581 a space; byte-level BPE's mapped characters are the real bytes; a
 * mask over each vocabulary still equals brute force. */
Test(grammar, vocab_bytes) {
    vocab_of o = {0};
    cr_assert(load_vocab(tdm_test_data_path("vocab/ggml-vocab-llama-spm.gguf"), &o));
    int bytes_seen = 0, spaces = 0;
    for (int32_t id = 0; id < tdm_gvocab_n(o.v); id++) {
        size_t tl, bl;
        const char *text = tdm_tok_text(o.t, id, &tl);
        const char *b = tdm_gvocab_bytes(o.v, id, &bl);
        unsigned hh;
        if (text && tl == 6 && sscanf(text, "<0x%2X>", &hh) == 1) {
            cr_assert(b && bl == 1 && (uint8_t)b[0] == hh, "token %d %.*s", id, (int)tl, text);
            bytes_seen++;
        }
        if (text && tl == 4 && memcmp(text, "\xE2\x96\x81" "a", 4) == 0) { /* "▁a" */
            cr_assert(b && bl == 2 && b[0] == ' ' && b[1] == 'a');
            spaces++;
        }
    }
    cr_expect_eq(bytes_seen, 256);
    cr_expect_eq(spaces, 1);
    tdm_grammar *g = compile(JSON_GBNF);
    check_masks(g, o.v, 2, 15, 7, NULL, "llama-spm");
    tdm_grammar_free(g);
    unload_vocab(&o);
    cr_assert(load_vocab(tdm_test_data_path("vocab/ggml-vocab-gpt-2.gguf"), &o));
    /* "Ġ" (U+0120) is the byte 0x20 in GPT-2's byte-level mapping */
    int mapped = 0;
    for (int32_t id = 0; id < tdm_gvocab_n(o.v); id++) {
        size_t tl, bl;
        const char *text = tdm_tok_text(o.t, id, &tl);
        const char *b = tdm_gvocab_bytes(o.v, id, &bl);
        if (text && tl == 3 && memcmp(text, "\xC4\xA0" "a", 3) == 0) {
            cr_assert(b && bl == 2 && b[0] == ' ' && b[1] == 'a');
            mapped++;
        }
    }
    cr_expect_eq(mapped, 1);
    g = compile(MASK_GRAMMARS[2]);
    check_masks(g, o.v, 2, 15, 8, NULL, "gpt-2");
    tdm_grammar_free(g);
    unload_vocab(&o);
}
