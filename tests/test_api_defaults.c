/* test_api_defaults.c - the public header, the README and the code agree:
 *   - every field of tandem_model_params, tandem_engine_params, tandem_generate_params
 *     and tandem_request gives its default in its comment as "default VALUE"
 *     (include/tandem.h's convention), VALUE a C expression this test evaluates, and
 *     it equals what tandem_*_default_params() / tandem_request_default() return; a
 *     field the header declares and this test does not know fails (so a new field
 *     comes with its documented default);
 *   - where the README gives a default of `tandem_X_params.FIELD` ("(default V)"), it
 *     is the header's;
 *   - the README's table "Environment variables (diagnostics only)" lists exactly
 *     the variables src/base/diag.c reads;
 * and the rest of the grown-up API: tandem_version() against the header's macros, a
 * log callback receiving the library's warning, the default sink restored, a
 * malformed diagnostic variable an error naming it. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"
#include "diag.h"
#include "liblog.h"
#include "tandem.h"
#include "testutil.h"

/* ---- the header's documented defaults ---------------------------------------- */

typedef enum kind { K_INT, K_SIZE, K_U64, K_BOOL, K_FLOAT, K_DOUBLE, K_PTR, K_GENERATE } kind;

typedef struct field {
    const char *name;
    size_t off, size;
    kind k;
} field;

#define F(S, f, k) {#f, offsetof(S, f), sizeof(((S *)0)->f), k}

static const field model_fields[] = {
    F(tandem_model_params, backend, K_INT),
    F(tandem_model_params, cuda_device, K_INT),
    F(tandem_model_params, tensor_parallel, K_INT),
    F(tandem_model_params, progress_callback, K_PTR),
    F(tandem_model_params, progress_callback_user_data, K_PTR),
    F(tandem_model_params, weights, K_INT),
};
static const field engine_fields[] = {
    F(tandem_engine_params, n_threads, K_INT),
    F(tandem_engine_params, kv_bytes, K_SIZE),
    F(tandem_engine_params, n_ctx, K_INT),
    F(tandem_engine_params, n_seq_max, K_INT),
    F(tandem_engine_params, kv_block_size, K_INT),
    F(tandem_engine_params, gpu_mem, K_SIZE),
    F(tandem_engine_params, max_batch_tokens, K_INT),
    F(tandem_engine_params, prefix_cache, K_BOOL),
    F(tandem_engine_params, batch_invariant, K_BOOL),
    F(tandem_engine_params, kv_type, K_INT),
    F(tandem_engine_params, draft_vocab, K_INT),
};
static const field generate_fields[] = {
    F(tandem_generate_params, max_tokens, K_INT),
    F(tandem_generate_params, temperature, K_FLOAT),
    F(tandem_generate_params, top_k, K_INT),
    F(tandem_generate_params, top_p, K_FLOAT),
    F(tandem_generate_params, min_p, K_FLOAT),
    F(tandem_generate_params, seed, K_U64),
    F(tandem_generate_params, spec_k, K_INT),
    F(tandem_generate_params, spec_k_min, K_INT),
    F(tandem_generate_params, spec_k_max, K_INT),
    F(tandem_generate_params, spec_p_min, K_FLOAT),
    F(tandem_generate_params, spec_ngram, K_INT),
    F(tandem_generate_params, spec_tree, K_INT),
    F(tandem_generate_params, spec_tree_shape, K_PTR),
    F(tandem_generate_params, bench_oracle_tokens, K_PTR),
    F(tandem_generate_params, bench_n_oracle, K_INT),
    F(tandem_generate_params, bench_oracle_alpha, K_FLOAT),
    F(tandem_generate_params, on_token, K_PTR),
    F(tandem_generate_params, user_data, K_PTR),
    F(tandem_generate_params, ignore_eos, K_BOOL),
    F(tandem_generate_params, stop, K_PTR),
    F(tandem_generate_params, n_stop, K_INT),
    F(tandem_generate_params, grammar, K_PTR),
    F(tandem_generate_params, json_schema, K_PTR),
    F(tandem_generate_params, presence_penalty, K_FLOAT),
    F(tandem_generate_params, frequency_penalty, K_FLOAT),
    F(tandem_generate_params, repetition_penalty, K_FLOAT),
    F(tandem_generate_params, logit_bias, K_PTR),
    F(tandem_generate_params, n_logit_bias, K_INT),
    F(tandem_generate_params, min_tokens, K_INT),
    F(tandem_generate_params, logprobs, K_BOOL),
    F(tandem_generate_params, top_logprobs, K_INT),
    F(tandem_generate_params, on_token_lp, K_PTR),
};
static const field request_fields[] = {
    F(tandem_request, prompt, K_PTR),
    F(tandem_request, prompt_ids, K_PTR),
    F(tandem_request, n_prompt_ids, K_SIZE),
    F(tandem_request, params, K_GENERATE),
    F(tandem_request, priority, K_INT),
    F(tandem_request, timeout_ms, K_DOUBLE),
};

/* The identifiers a default may name. */
static const struct {
    const char *name;
    long value;
} idents[] = {
    {"TANDEM_BACKEND_CPU", TANDEM_BACKEND_CPU},
    {"TANDEM_BACKEND_CUDA", TANDEM_BACKEND_CUDA},
    {"TANDEM_KV_AUTO", TANDEM_KV_AUTO},
    {"TANDEM_WEIGHTS_NATIVE", TANDEM_WEIGHTS_NATIVE},
    {"TANDEM_SPEC_TREE_AUTO", TANDEM_SPEC_TREE_AUTO},
    {"TANDEM_DRAFT_VOCAB_AUTO", TANDEM_DRAFT_VOCAB_AUTO},
};

static char *read_source(const char *rel) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", TDM_SOURCE_ROOT, rel);
    char *text = NULL;
    size_t len = 0;
    tdm_err err = {0};
    cr_assert_eq(tdm_read_file(path, &text, &len, &err), TANDEM_OK, "%s", err.msg);
    return text;
}

/* One field as the header declares it: its name and the text of its comment. */
typedef struct hfield {
    char name[64];
    char comment[2048];
} hfield;

static void append(char *dst, size_t cap, const char *src, size_t n) {
    size_t len = strlen(dst);
    if (len + n + 2 > cap) n = cap > len + 2 ? cap - len - 2 : 0;
    memcpy(dst + len, src, n);
    dst[len + n] = '\0';
}

/* The fields of `typedef struct NAME { ... } NAME;` in text.  A field's comment is
 * the one that starts on the line of its ';', or after it on a later line indented
 * deeper than the declaration (a continuation); a comment at the declarations' own
 * indentation is about the fields after it and belongs to none. */
static int header_fields(const char *text, const char *name, hfield *out, int cap) {
    char open[128];
    snprintf(open, sizeof open, "typedef struct %s {", name);
    const char *p = strstr(text, open);
    cr_assert(p, "include/tandem.h has no '%s'", open);
    p += strlen(open);
    int n = 0, depth = 0, decl_col = -1, last = -1, last_line = -1, last_col = -1, line = 0, col = 0;
    char decl[512] = "";
    for (; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            const char *end = strstr(p + 2, "*/");
            cr_assert(end, "an unterminated comment in %s", name);
            const bool attach = last >= 0 && decl_col < 0 && (line == last_line || col > last_col);
            if (attach) {
                append(out[last].comment, sizeof out[last].comment, " ", 1);
                append(out[last].comment, sizeof out[last].comment, p + 2, (size_t)(end - p - 2));
            } else if (decl_col < 0) {
                last = -1; /* a block comment: the fields after it are not continued */
            }
            for (const char *q = p; q < end + 2; q++) {
                if (*q == '\n') line++, col = 0;
                else col++;
            }
            p = end + 1;
            continue;
        }
        if (*p == '\n') {
            line++, col = 0;
            continue;
        }
        if (*p == '}' && depth == 0) {
            cr_assert(decl_col < 0, "%s: a declaration without ';' before '}'", name);
            return n;
        }
        if (!isspace((unsigned char)*p) && decl_col < 0) {
            decl_col = col;
            decl[0] = '\0';
        }
        if (decl_col >= 0) {
            if (*p == '(') depth++;
            if (*p == ')') depth--;
            if (*p == ';' && depth == 0) {
                cr_assert_lt(n, cap);
                hfield *f = &out[n];
                memset(f, 0, sizeof *f);
                /* the name: after "(*" for a function pointer, else the last identifier */
                const char *fp = strstr(decl, "(*");
                const char *s = fp ? fp + 2 : NULL;
                if (!s) {
                    s = decl + strlen(decl);
                    while (s > decl && isspace((unsigned char)s[-1])) s--;
                    while (s > decl && (isalnum((unsigned char)s[-1]) || s[-1] == '_')) s--;
                }
                size_t k = 0;
                while ((isalnum((unsigned char)s[k]) || s[k] == '_') && k + 1 < sizeof f->name) k++;
                memcpy(f->name, s, k);
                cr_assert_gt(k, 0, "%s: no field name in '%s'", name, decl);
                last = n++;
                last_line = line;
                last_col = decl_col;
                decl_col = -1;
            } else {
                char c[2] = {*p, 0};
                append(decl, sizeof decl, c, 1);
            }
        }
        col++;
    }
    cr_assert_fail("%s: no closing brace", name);
    return n;
}

/* Whether a token after "default" is a value: a number, true, false, NULL, a
 * TANDEM_ constant, or a tandem_*() call. */
static bool is_value(const char *v) {
    char *end;
    if (!*v) return false;
    strtod(v, &end);
    if (!*end) return true;
    if (!strcmp(v, "true") || !strcmp(v, "false") || !strcmp(v, "NULL")) return true;
    if (!strncmp(v, "TANDEM_", 7)) return true;
    size_t n = strlen(v);
    return !strncmp(v, "tandem_", 7) && n > 2 && !strcmp(v + n - 2, "()");
}

/* The "default VALUE" phrases of a comment: how many, the first four in values. */
static int find_defaults(const char *comment, char values[4][96]) {
    int n = 0;
    for (const char *p = comment; (p = strstr(p, "efault")); p++) {
        if (p == comment || (p[-1] != 'd' && p[-1] != 'D') || !isspace((unsigned char)p[6])) continue;
        if (p - 1 > comment && (isalnum((unsigned char)p[-2]) || p[-2] == '_')) continue;
        const char *v = p + 6;
        while (isspace((unsigned char)*v)) v++;
        char tok[96];
        size_t k = 0;
        while (v[k] && !isspace((unsigned char)v[k]) && k + 1 < sizeof tok) k++;
        memcpy(tok, v, k);
        tok[k] = '\0';
        while (k > 0 && strchr(".,;:", tok[k - 1])) tok[--k] = '\0';
        if (k > 0 && tok[k - 1] == ')' && !(k > 1 && tok[k - 2] == '(')) tok[--k] = '\0';
        if (!is_value(tok)) continue;
        if (n < 4) snprintf(values[n], sizeof values[n], "%s", tok);
        n++;
    }
    return n;
}

/* The header's default of a field of type k, evaluated, equals the struct's bytes. */
static void check_value(const char *sname, const field *f, const char *v, const void *base) {
    const uint8_t *at = (const uint8_t *)base + f->off;
    double want = 0;
    bool numeric = true;
    if (!strcmp(v, "true")) want = 1;
    else if (!strcmp(v, "false") || !strcmp(v, "NULL")) want = 0;
    else if (!strncmp(v, "TANDEM_", 7)) {
        size_t i = 0;
        while (i < TDM_ARRAY_LEN(idents) && strcmp(idents[i].name, v)) i++;
        cr_assert_lt(i, TDM_ARRAY_LEN(idents), "%s.%s: default %s: add it to this test's identifiers", sname, f->name, v);
        want = (double)idents[i].value;
    } else if (!strncmp(v, "tandem_", 7)) {
        numeric = false;
    } else {
        want = strtod(v, NULL);
    }
    double got = 0;
    switch (f->k) {
    case K_INT: got = *(const int *)at; break;
    case K_SIZE: got = (double)*(const size_t *)at; break;
    case K_U64: got = (double)*(const uint64_t *)at; break;
    case K_BOOL: got = *(const bool *)at; break;
    case K_FLOAT: got = *(const float *)at; break;
    case K_DOUBLE: got = *(const double *)at; break;
    case K_PTR: {
        static const uint8_t zero[16];
        cr_assert(!strcmp(v, "NULL"), "%s.%s: a pointer's default must be NULL, the header says %s", sname, f->name, v);
        cr_assert(memcmp(at, zero, f->size) == 0, "%s.%s: the header says NULL, the code's is not", sname, f->name);
        return;
    }
    case K_GENERATE: {
        cr_assert_str_eq(v, "tandem_generate_default_params()", "%s.%s", sname, f->name);
        /* field by field: the padding between fields holds anything */
        const tandem_generate_params g = tandem_generate_default_params();
        for (size_t i = 0; i < TDM_ARRAY_LEN(generate_fields); i++) {
            const field *gf = &generate_fields[i];
            cr_assert(memcmp((const char *)at + gf->off, (const char *)&g + gf->off, gf->size) == 0,
                      "%s.%s.%s: not tandem_generate_default_params()'s", sname, f->name, gf->name);
        }
        return;
    }
    }
    cr_assert(numeric, "%s.%s: default %s is not a value of its type", sname, f->name, v);
    cr_assert(got == want, "%s.%s: the header documents default %s, %s returns %g", sname, f->name, v,
              strcmp(sname, "tandem_request") ? "its *_default_params()" : "tandem_request_default()", got);
}

/* The header's default of each field of a struct, by name (filled for the README
 * check). */
typedef struct documented {
    char sname[64], name[64], value[96];
} documented;
static documented g_doc[128];
static int g_n_doc;

static void check_struct(const char *text, const char *sname, const field *fields, size_t n_fields, const void *def) {
    hfield hf[64];
    const int n = header_fields(text, sname, hf, 64);
    cr_assert_eq((size_t)n, n_fields, "%s: the header declares %d fields, this test knows %zu (a new field needs a row here)",
                 sname, n, n_fields);
    for (int i = 0; i < n; i++) {
        const field *f = NULL;
        for (size_t j = 0; j < n_fields; j++)
            if (!strcmp(fields[j].name, hf[i].name)) f = &fields[j];
        cr_assert(f, "%s.%s: declared in the header, unknown to this test", sname, hf[i].name);
        char values[4][96];
        const int nv = find_defaults(hf[i].comment, values);
        cr_assert_eq(nv, 1, "%s.%s: its comment gives %d \"default VALUE\" phrases, not one:%s", sname, hf[i].name, nv,
                     hf[i].comment);
        check_value(sname, f, values[0], def);
        cr_assert_lt(g_n_doc, (int)TDM_ARRAY_LEN(g_doc));
        documented *d = &g_doc[g_n_doc++];
        snprintf(d->sname, sizeof d->sname, "%s", sname);
        memcpy(d->name, hf[i].name, sizeof d->name);
        memcpy(d->value, values[0], sizeof d->value);
    }
}

static void check_header(void) {
    char *h = read_source("include/tandem.h");
    const tandem_model_params mp = tandem_model_default_params();
    const tandem_engine_params ep = tandem_engine_default_params();
    const tandem_generate_params gp = tandem_generate_default_params();
    const tandem_request rq = tandem_request_default();
    g_n_doc = 0;
    check_struct(h, "tandem_model_params", model_fields, TDM_ARRAY_LEN(model_fields), &mp);
    check_struct(h, "tandem_engine_params", engine_fields, TDM_ARRAY_LEN(engine_fields), &ep);
    check_struct(h, "tandem_generate_params", generate_fields, TDM_ARRAY_LEN(generate_fields), &gp);
    check_struct(h, "tandem_request", request_fields, TDM_ARRAY_LEN(request_fields), &rq);
    free(h);
}

Test(api_defaults, header_defaults_are_the_code_defaults) { check_header(); }

/* A default that disagrees is caught: the parser on a made-up struct. */
Test(api_defaults, parser_reads_the_convention) {
    const char *text = "typedef struct tandem_x {\n"
                       "    int a;  /* [0, 9]; default 3 */\n"
                       "    bool (*cb)(int x);\n"
                       "                  /* called ...; Default NULL: none */\n"
                       "    /* a block comment about b and c; default 7 */\n"
                       "    float b; /* default 0.5 = half,\n"
                       "                by default the middle */\n"
                       "    int c;   /* the default is 2; no phrase */\n"
                       "} tandem_x;\n";
    hfield hf[8];
    cr_assert_eq(header_fields(text, "tandem_x", hf, 8), 4);
    const char *names[] = {"a", "cb", "b", "c"};
    const char *want[] = {"3", "NULL", "0.5", NULL};
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(hf[i].name, names[i]);
        char v[4][96];
        const int n = find_defaults(hf[i].comment, v);
        if (want[i]) {
            cr_assert_eq(n, 1, "%s: %d defaults in '%s'", names[i], n, hf[i].comment);
            cr_assert_str_eq(v[0], want[i]);
        } else {
            cr_assert_eq(n, 0, "%s: '%s'", names[i], hf[i].comment);
        }
    }
}

/* ---- the README ---------------------------------------------------------------- */

/* Every `tandem_X_params.FIELD` the README names is a field of the header, and a
 * "(default V)" after it in the same sentence is the header's V. */
Test(api_defaults, readme_defaults_are_the_header_defaults) {
    check_header();
    char *r = read_source("README.md");
    int n_named = 0, n_defaults = 0;
    for (const char *p = r; (p = strstr(p, "`tandem_")); p++) {
        char sname[64], name[64];
        int len = 0;
        if (sscanf(p + 1, "%63[a-z_].%63[a-z0-9_]%n", sname, name, &len) != 2 || !strstr(sname, "_params")) continue;
        n_named++;
        const documented *d = NULL;
        for (int i = 0; i < g_n_doc; i++)
            if (!strcmp(g_doc[i].sname, sname) && !strcmp(g_doc[i].name, name)) d = &g_doc[i];
        cr_assert(d, "README.md names %s.%s, which include/tandem.h does not declare", sname, name);
        const char *tick = strchr(p + 1, '`');
        cr_assert(tick);
        /* the rest of the sentence: up to ". " or a blank line, at most 200 bytes */
        char rest[256];
        size_t k = 0;
        for (const char *q = tick + 1; *q && k + 1 < sizeof rest && k < 200; q++) {
            if ((q[0] == '.' && isspace((unsigned char)q[1])) || (q[0] == '\n' && q[1] == '\n')) break;
            rest[k++] = *q == '\n' ? ' ' : *q;
        }
        rest[k] = '\0';
        const char *def = strstr(rest, "(default ");
        if (!def) continue;
        char v[96];
        cr_assert_eq(sscanf(def + 9, "%95[^);,]", v), 1);
        cr_assert_str_eq(v, d->value, "README.md: %s.%s (default %s), include/tandem.h: default %s", sname, name, v,
                         d->value);
        n_defaults++;
    }
    cr_assert_gt(n_named, 3, "the README names only %d parameters (did its wording change?)", n_named);
    cr_assert_gt(n_defaults, 0);
    free(r);
}

/* The README's table of environment variables lists exactly the ones diag.c reads. */
Test(api_defaults, readme_lists_the_diagnostic_variables) {
    char *r = read_source("README.md");
    const char *t = strstr(r, "Environment variables (diagnostics only)");
    cr_assert(t, "README.md has no \"Environment variables (diagnostics only)\" table");
    const char *end = strstr(t, "\n\n");
    end = end ? strstr(end + 2, "\n\n") : NULL; /* (the heading, then the table) */
    int listed = 0;
    for (const char *p = t; (p = strstr(p, "\n| `TANDEM_")) && (!end || p < end); p++) {
        char name[64];
        cr_assert_eq(sscanf(p + 4, "%63[A-Z0-9_]", name), 1);
        bool known = false;
        for (const char *const *n = tdm_diag_names; *n; n++) known |= !strcmp(*n, name);
        cr_assert(known, "README.md lists %s, which src/base/diag.c does not read", name);
        listed++;
    }
    int n_read = 0;
    for (const char *const *n = tdm_diag_names; *n; n++) n_read++;
    cr_assert_eq(listed, n_read, "README.md lists %d variables, src/base/diag.c reads %d", listed, n_read);
    cr_assert_leq(n_read, 5, "issue 42: at most five environment variables");
    free(r);
}

/* ---- version --------------------------------------------------------------------- */

Test(api, version) {
    cr_assert_str_eq(tandem_version(), TANDEM_VERSION, "the library is %s, its header %s", tandem_version(),
                     TANDEM_VERSION);
    char v[32];
    snprintf(v, sizeof v, "%d.%d.%d", TANDEM_VERSION_MAJOR, TANDEM_VERSION_MINOR, TANDEM_VERSION_PATCH);
    cr_assert_str_eq(v, TANDEM_VERSION);
}

/* tandem_system_info: one line per backend, the CPU's level one of those built. */
Test(api, system_info) {
    const char *info = tandem_system_info();
    cr_assert_not_null(info);
    cr_assert_eq(info, tandem_system_info(), "a static string");
    const char *cpu = strstr(info, "cpu: SIMD levels built: ");
    cr_assert(cpu == info, "%s", info);
    const char *mine = strstr(info, "; this CPU: ");
    cr_assert_not_null(mine, "%s", info);
    mine += strlen("; this CPU: ");
    const size_t n = strcspn(mine, "\n");
    char level[16] = {0};
    cr_assert_lt(n, sizeof level, "%s", info);
    memcpy(level, mine, n);
    cr_assert(strcmp(level, "scalar") == 0 || strcmp(level, "avx2") == 0 || strcmp(level, "avx512") == 0, "level %s", level);
    cr_assert(strstr(info, "\ncuda: built") || strstr(info, "\ncuda: not built"), "%s", info);
    cr_assert(strstr(info, "\nnccl: built") || strstr(info, "\nnccl: not built"), "%s", info);
}

/* ---- the log callback -------------------------------------------------------------- */

typedef struct captured {
    int n[4];
    char last_warn[1024];
} captured;

static void capture(tandem_log_level level, const char *msg, void *user_data) {
    captured *c = user_data;
    cr_assert(level >= TANDEM_LOG_ERROR && level <= TANDEM_LOG_DEBUG);
    c->n[level]++;
    if (level == TANDEM_LOG_WARN) snprintf(c->last_warn, sizeof c->last_warn, "%s", msg);
}

/* A variable of an earlier version that is set is a warning, once, through the
 * callback (here when the first model opens); the model opens all the same. */
Test(api_log, callback_receives_the_warning) {
    setenv("TANDEM_CUDA_PDL", "0", 1);
    captured c = {0};
    tandem_log_set(capture, &c);
    tandem_model *m = NULL, *m2 = NULL;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-draft-xs-f16.gguf"), NULL, &m), TANDEM_OK, "%s",
                 tandem_last_error());
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-draft-xs-f16.gguf"), NULL, &m2), TANDEM_OK, "%s",
                 tandem_last_error());
    tandem_log_set(NULL, NULL);
    cr_assert_eq(c.n[TANDEM_LOG_WARN], 1, "%d warnings", c.n[TANDEM_LOG_WARN]);
    cr_assert(strstr(c.last_warn, "TANDEM_CUDA_PDL") && strstr(c.last_warn, "no longer read"), "%s", c.last_warn);
    cr_assert_eq(c.n[TANDEM_LOG_ERROR], 0);
    tandem_model_close(m2);
    tandem_model_close(m);
    unsetenv("TANDEM_CUDA_PDL");
}

/* NULL restores the default: warnings and info on stderr, debug dropped; a
 * replaced callback is not called again. */
Test(api_log, default_sink_is_stderr, .init = cr_redirect_stderr) {
    captured c = {0};
    tandem_log_set(capture, &c);
    tdm_log(TANDEM_LOG_WARN, "to the callback %d", 1);
    tandem_log_set(NULL, NULL);
    tdm_log(TANDEM_LOG_WARN, "careful %d", 2);
    tdm_log(TANDEM_LOG_INFO, "tandem phases: %s", "x");
    tdm_log(TANDEM_LOG_DEBUG, "chatter");
    tdm_log(TANDEM_LOG_ERROR, "bad");
    fflush(stderr);
    cr_assert_eq(c.n[TANDEM_LOG_WARN], 1);
    cr_assert_str_eq(c.last_warn, "to the callback 1");
    cr_assert_stderr_eq_str("tandem: warning: careful 2\ntandem phases: x\ntandem: error: bad\n");
}

/* ---- diagnostic variables ---------------------------------------------------------- */

/* A malformed value is an error naming the variable and what it takes. */
Test(api_diag, malformed_cpu_level_is_an_error) {
    setenv("TANDEM_CPU", "avx3", 1);
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-draft-xs-f16.gguf"), NULL, &m), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(m);
    cr_assert(strstr(tandem_last_error(), "TANDEM_CPU=avx3") && strstr(tandem_last_error(), "avx512"), "%s",
              tandem_last_error());
}

Test(api_diag, malformed_switch_is_an_error) {
    setenv("TANDEM_CUDA_GRAPHS", "off", 1);
    tdm_backend *b = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &b, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "TANDEM_CUDA_GRAPHS=off") && strstr(err.msg, "0 or 1"), "%s", err.msg);
}

/* Well-formed values: the level named in any case (it never raises the level), the
 * switches 0 and 1. */
Test(api_diag, values) {
    setenv("TANDEM_CPU", "Scalar", 1);
    setenv("TANDEM_CUDA_GRAPHS", "0", 1);
    setenv("TANDEM_CUDA_PROFILE", "1", 1);
    setenv("TANDEM_SPEC_PHASES", "", 1); /* (empty: unset) */
    const tdm_diag *d = tdm_diag_get();
    cr_assert_eq(d->cpu_level_cap, TDM_CPU_SCALAR);
    cr_assert(d->cuda_graphs_off && d->cuda_profile && !d->spec_phases);
    cr_assert_str_eq(d->error, "");
    cr_assert_str_eq(tdm_cpu_features(), "scalar");
    tdm_backend *b = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &b, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_backend_cpu_level(b), TDM_CPU_SCALAR);
    tdm_backend_destroy(b);
}
