/* prompts.c - reads JSON-lines prompt files for `tandem generate` / `tandem bench`
 * and the requests of `tandem run`.
 *
 * One JSON object per line:
 *   {"id": <number|string>, "prompt": <string> | "messages": <[message, ...]>,
 *    "seed": <integer in [0, 2^64-1]>?, "max_tokens": <integer in [0, INT_MAX]>?,
 *    "temperature": <number in [0, FLT_MAX]>?,
 *    "priority": <integer in [INT_MIN, INT_MAX]>?, "timeout_s": <number in [0, 1e9]>?,
 *    "stop": <string | [string, ...]>?, "grammar": <string>?,
 *    "json_schema": <object | string>?, "presence_penalty": <number in [-2, 2]>?,
 *    "frequency_penalty": <number in [-2, 2]>?, "repetition_penalty": <number in (0, 100]>?,
 *    "min_tokens": <integer >= 0>?, "logit_bias": <{"token id": number in [-100, 100]}>?,
 *    "logprobs": <integer in [0, 20] | false>?}
 * (a message is an object with a string "role", as in OpenAI's API: the conversation
 * is rendered by the model's chat template; the ranges of --seed, -n and --temp; a stop list holds at most TANDEM_STOP_MAX
 * strings of 1..TANDEM_STOP_LEN_MAX bytes, and replaces the job's; "grammar" (GBNF
 * text) or "json_schema" (a JSON schema, or its text as a string; at most one of the
 * two) constrains the line's output instead of the job's --grammar / --json-schema,
 * checked when the request is submitted; the penalties, logit_bias, min_tokens and
 * logprobs (N alternatives per token in the output line) replace the job's).  Other members
 * are ignored; a repeated member is an error (json.h); blank lines are skipped.  A
 * missing id becomes the 0-based index of the prompt; a numeric id is echoed as
 * written (9007199254740993, 1.50, 1e3 stay so) and must lie in a double's range, so
 * that a reader of the output that parses numbers as doubles sees neither an infinity
 * nor a false 0.  Every line is checked before anything runs. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "input.h"
#include "json.h"

static void prompt_free(cli_prompt *p) {
    tdm_arg_stop_free(p->stop, p->n_stop);
    free(p->grammar);
    free(p->json_schema);
    free(p->logit_bias);
    free(p->id_str);
    free(p->text);
    free(p->messages);
    free(p->error);
    memset(p, 0, sizeof *p);
}

void cli_prompts_free(cli_prompts *ps) {
    if (!ps) return;
    for (size_t i = 0; i < ps->n; i++) prompt_free(&ps->items[i]);
    free(ps->items);
    ps->items = NULL;
    ps->n = 0;
}

static bool line_err(char *err, size_t cap, const char *path, int line, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static bool line_err(char *err, size_t cap, const char *path, int line, const char *fmt, ...) {
    int k = snprintf(err, cap, "%s:%d: ", path, line);
    if (k < 0 || (size_t)k >= cap) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err + k, cap - (size_t)k, fmt, ap);
    va_end(ap);
    return false;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

/* Whether a number is one a double can hold: finite, and not a non-zero value that
 * rounds to 0 (1e-400). */
static bool in_double_range(const tdm_json *num) {
    if (!isfinite(num->num)) return false;
    if (num->num != 0) return true;
    for (size_t i = 0; i < num->str_len && num->str[i] != 'e' && num->str[i] != 'E'; i++)
        if (num->str[i] >= '1' && num->str[i] <= '9') return false;
    return true;
}

bool cli_messages_ok(const tdm_json *m) {
    if (m->type != TDM_JSON_ARRAY) return false;
    for (size_t i = 0; i < m->n; i++) {
        const tdm_json *role = tdm_json_get(&m->items[i], "role");
        if (m->items[i].type != TDM_JSON_OBJECT || !role || role->type != TDM_JSON_STRING) return false;
    }
    return true;
}

/* The id member (absent: the prompt's index). */
static bool id_from_json(const tdm_json *j, cli_prompt *p, size_t index, const char *path, int line, char *err,
                         size_t cap) {
    const tdm_json *id = tdm_json_get(j, "id");
    if (!id) {
        p->id_kind = CLI_ID_INT;
        p->id_int = (int64_t)index;
        return true;
    }
    if (id->type == TDM_JSON_NUMBER && !in_double_range(id))
        return line_err(err, cap, path, line, "\"id\" %.40s is outside the range of a double", id->str);
    if (id->type != TDM_JSON_NUMBER && id->type != TDM_JSON_STRING)
        return line_err(err, cap, path, line, "\"id\" must be a number or a string");
    p->id_kind = id->type == TDM_JSON_STRING ? CLI_ID_STR : CLI_ID_NUM;
    p->id_str = tdm_strndup(id->str, id->str_len);
    p->id_len = id->str_len;
    if (!p->id_str) return line_err(err, cap, path, line, "out of memory");
    return true;
}

/* seed, max_tokens, temperature. */
static bool sampling_from_json(const tdm_json *j, cli_prompt *p, const char *path, int line, char *err,
                               size_t cap) {
    const tdm_json *v = tdm_json_get(j, "seed");
    if (v) {
        if (!tdm_json_u64(v, &p->seed))
            return line_err(err, cap, path, line, "\"seed\" must be an integer in [0, %llu]",
                            (unsigned long long)UINT64_MAX);
        p->has_seed = true;
    }
    v = tdm_json_get(j, "max_tokens");
    if (v) {
        int64_t m;
        if (!tdm_json_int(v, &m) || m < 0 || m > CLI_COUNT_MAX)
            return line_err(err, cap, path, line, "\"max_tokens\" must be an integer in [0, %d]", CLI_COUNT_MAX);
        p->has_max_tokens = true;
        p->max_tokens = (int)m;
    }
    v = tdm_json_get(j, "temperature");
    if (v) {
        if (v->type != TDM_JSON_NUMBER || !(v->num >= 0 && v->num <= CLI_TEMP_MAX)) /* as --temp */
            return line_err(err, cap, path, line, "\"temperature\" must be a number in [0, %g]", CLI_TEMP_MAX);
        p->has_temperature = true;
        p->temperature = (float)v->num;
    }
    return true;
}

/* priority, timeout_s, stop: the scheduling of the request. */
static bool request_from_json(const tdm_json *j, cli_prompt *p, const char *path, int line, char *err,
                              size_t cap) {
    const tdm_json *v = tdm_json_get(j, "priority");
    if (v) {
        int64_t x;
        if (!tdm_json_int(v, &x) || x < INT_MIN || x > INT_MAX)
            return line_err(err, cap, path, line, "\"priority\" must be an integer in [%d, %d]", INT_MIN, INT_MAX);
        p->has_priority = true;
        p->priority = (int)x;
    }
    v = tdm_json_get(j, "timeout_s");
    if (v) {
        if (v->type != TDM_JSON_NUMBER || !(v->num >= 0 && v->num <= TDM_ARG_TIMEOUT_S_MAX))
            return line_err(err, cap, path, line, "\"timeout_s\" must be a number of seconds in [0, %g]",
                            TDM_ARG_TIMEOUT_S_MAX);
        p->has_timeout = true;
        p->timeout_ms = v->num * 1000.0;
    }
    v = tdm_json_get(j, "stop");
    if (v) {
        char why[128];
        if (!tdm_arg_stop_from_json(v, &p->stop, &p->n_stop, why, sizeof why))
            return line_err(err, cap, path, line, "\"stop\"%s", why);
        p->has_stop = true;
    }
    const tdm_json *g = tdm_json_get(j, "grammar"), *js = tdm_json_get(j, "json_schema");
    if (g && js) return line_err(err, cap, path, line, "give \"grammar\" or \"json_schema\", not both");
    if (g) {
        if (g->type != TDM_JSON_STRING || strlen(g->str) != g->str_len)
            return line_err(err, cap, path, line, "\"grammar\" must be a string of GBNF text (without NUL)");
        if (!(p->grammar = tdm_strndup(g->str, g->str_len))) return line_err(err, cap, path, line, "out of memory");
    }
    if (js) {
        if (js->type == TDM_JSON_STRING && strlen(js->str) == js->str_len) p->json_schema = tdm_strndup(js->str, js->str_len);
        else if (js->type == TDM_JSON_OBJECT || js->type == TDM_JSON_BOOL) p->json_schema = tdm_json_text(js);
        else return line_err(err, cap, path, line, "\"json_schema\" must be a JSON schema (an object) or its text");
        if (!p->json_schema) return line_err(err, cap, path, line, "out of memory");
    }
    return true;
}

/* A number member in [lo, hi] (lo_open: (lo, hi]); *has whether given. */
static bool num_member(const tdm_json *j, const char *name, double lo, bool lo_open, double hi, bool *has, float *out,
                       const char *path, int line, char *err, size_t cap) {
    const tdm_json *v = tdm_json_get(j, name);
    if (!v) return true;
    if (v->type != TDM_JSON_NUMBER || !(v->num <= hi) || (lo_open ? !(v->num > lo) : !(v->num >= lo)))
        return line_err(err, cap, path, line, "\"%s\" must be a number in %c%g, %g]", name, lo_open ? '(' : '[', lo, hi);
    *has = true;
    *out = (float)v->num;
    return true;
}

/* presence_penalty, frequency_penalty, repetition_penalty, min_tokens, logit_bias,
 * logprobs. */
static bool penalties_from_json(const tdm_json *j, cli_prompt *p, const char *path, int line, char *err, size_t cap) {
    if (!num_member(j, "presence_penalty", -2, false, 2, &p->has_presence, &p->presence, path, line, err, cap) ||
        !num_member(j, "frequency_penalty", -2, false, 2, &p->has_frequency, &p->frequency, path, line, err, cap) ||
        !num_member(j, "repetition_penalty", 0, true, 100, &p->has_repetition, &p->repetition, path, line, err, cap))
        return false;
    const tdm_json *v = tdm_json_get(j, "min_tokens");
    if (v) {
        int64_t m;
        if (!tdm_json_int(v, &m) || m < 0 || m > CLI_COUNT_MAX)
            return line_err(err, cap, path, line, "\"min_tokens\" must be an integer in [0, %d]", CLI_COUNT_MAX);
        p->has_min_tokens = true;
        p->min_tokens = (int)m;
    }
    if ((v = tdm_json_get(j, "logprobs"))) {
        int64_t m;
        if (v->type == TDM_JSON_BOOL && !v->b) m = -1;
        else if (!tdm_json_int(v, &m) || m < 0 || m > TANDEM_TOP_LOGPROBS_MAX)
            return line_err(err, cap, path, line, "\"logprobs\" must be an integer in [0, %d] (alternatives per token) or false",
                            TANDEM_TOP_LOGPROBS_MAX);
        p->has_logprobs = true;
        p->logprobs = (int)m;
    }
    if ((v = tdm_json_get(j, "logit_bias"))) {
        if (v->type != TDM_JSON_OBJECT || v->n > TANDEM_LOGIT_BIAS_MAX)
            return line_err(err, cap, path, line, "\"logit_bias\" must be an object of at most %d token ids to biases",
                            TANDEM_LOGIT_BIAS_MAX);
        if (v->n && !(p->logit_bias = calloc(v->n, sizeof *p->logit_bias)))
            return line_err(err, cap, path, line, "out of memory");
        for (size_t i = 0; i < v->n; i++) {
            char *end = NULL;
            const long id = strtol(v->keys[i], &end, 10);
            const tdm_json *b = &v->items[i];
            if (!v->keys[i][0] || *end || id < 0 || id > INT32_MAX || b->type != TDM_JSON_NUMBER ||
                !(b->num >= -100 && b->num <= 100))
                return line_err(err, cap, path, line,
                                "\"logit_bias\": \"%.40s\" must be a token id given a number in [-100, 100]", v->keys[i]);
            p->logit_bias[i] = (tandem_logit_bias){(int32_t)id, (float)b->num};
        }
        p->n_logit_bias = (int)v->n; /* (ids within the vocabulary, and once each: checked at submission) */
        if (!p->logit_bias) p->logit_bias = calloc(1, sizeof *p->logit_bias); /* ({}: none, replacing the job's) */
        if (!p->logit_bias) return line_err(err, cap, path, line, "out of memory");
    }
    return true;
}

/* Fills p from one parsed line; false with err set on a bad member. */
static bool prompt_from_json(const tdm_json *j, cli_prompt *p, size_t index, const char *path,
                             int line, char *err, size_t cap) {
    if (j->type != TDM_JSON_OBJECT) return line_err(err, cap, path, line, "expected a JSON object");
    p->line = line;
    if (!id_from_json(j, p, index, path, line, err, cap)) return false;
    const tdm_json *pr = tdm_json_get(j, "prompt"), *msgs = tdm_json_get(j, "messages");
    if (pr && msgs) return line_err(err, cap, path, line, "give \"prompt\" or \"messages\", not both");
    if (msgs) {
        if (!cli_messages_ok(msgs))
            return line_err(err, cap, path, line, "\"messages\" must be an array of objects with a string \"role\"");
        if (!(p->messages = tdm_json_text(msgs)) || !(p->text = tdm_strndup("", 0)))
            return line_err(err, cap, path, line, "out of memory");
        return sampling_from_json(j, p, path, line, err, cap) && request_from_json(j, p, path, line, err, cap) &&
               penalties_from_json(j, p, path, line, err, cap);
    }
    if (!pr) return line_err(err, cap, path, line, "missing \"prompt\" (or \"messages\")");
    if (pr->type != TDM_JSON_STRING)
        return line_err(err, cap, path, line, "\"prompt\" must be a string");
    p->text = tdm_strndup(pr->str, pr->str_len);
    p->len = pr->str_len;
    if (!p->text) return line_err(err, cap, path, line, "out of memory");
    return sampling_from_json(j, p, path, line, err, cap) && request_from_json(j, p, path, line, err, cap) &&
           penalties_from_json(j, p, path, line, err, cap);
}

/* A line that did not parse (err holds why): lenient, an item carrying the error
 * (id: its own where it has a good one, else its index); else false. */
static bool bad_line(cli_prompts *ps, cli_prompt *pr, int line, bool lenient, const char *err) {
    const cli_prompt id = *pr;
    pr->id_str = NULL;
    prompt_free(pr);
    if (!lenient) return free(id.id_str), false;
    pr->line = line;
    pr->id_kind = id.id_str ? id.id_kind : CLI_ID_INT;
    pr->id_int = (int64_t)ps->n;
    pr->id_str = id.id_str;
    pr->id_len = id.id_len;
    pr->error = tdm_strndup(err, strlen(err));
    pr->text = tdm_strndup("", 0);
    if (!pr->error || !pr->text) {
        prompt_free(pr);
        return false;
    }
    ps->n++;
    return true;
}

/* Parses one non-blank line into ps (grown as needed); false with err set. */
static bool add_line(cli_prompts *ps, size_t *items_cap, const char *text, size_t n, const char *path, int line,
                     bool lenient, char *err, size_t cap) {
    if (ps->n == *items_cap) {
        size_t nc = *items_cap ? *items_cap * 2 : 16;
        cli_prompt *ni = realloc(ps->items, nc * sizeof *ni);
        if (!ni) return line_err(err, cap, path, line, "out of memory");
        ps->items = ni;
        *items_cap = nc;
    }
    tdm_json *j = NULL;
    tdm_err jerr = {0};
    cli_prompt *pr = &ps->items[ps->n];
    memset(pr, 0, sizeof *pr);
    if (tdm_json_parse(text, n, &j, &jerr) != TANDEM_OK) {
        line_err(err, cap, path, line, "invalid JSON: %s", jerr.msg);
        return bad_line(ps, pr, line, lenient, err);
    }
    memset(pr, 0, sizeof *pr);
    bool ok = prompt_from_json(j, pr, ps->n, path, line, err, cap);
    tdm_json_free(j);
    return ok ? (ps->n++, true) : bad_line(ps, pr, line, lenient, err);
}

/* Reads every line of r into out. */
static bool read_lines(tdm_lines *r, const char *name, cli_prompts *out, bool lenient, char *err, size_t cap) {
    out->items = NULL;
    out->n = 0;
    tdm_err terr = {0};
    cli_prompts ps = {0};
    size_t items_cap = 0;
    bool ok = true;
    for (;;) {
        const char *text;
        size_t n;
        bool got;
        if (tdm_lines_next(r, &text, &n, &got, &terr) != TANDEM_OK) {
            snprintf(err, cap, "%s", terr.msg);
            ok = false;
        }
        if (!ok || !got) break;
        if (!is_blank(text, n)) ok = add_line(&ps, &items_cap, text, n, name, r->line, lenient, err, cap);
    }
    if (ok && ps.n == 0) {
        snprintf(err, cap, "%s: no prompts in the file", name);
        ok = false;
    }
    if (!ok) {
        cli_prompts_free(&ps);
        return false;
    }
    *out = ps;
    return true;
}

static bool read_prompts(const char *path, cli_prompts *out, bool lenient, char *err, size_t cap) {
    out->items = NULL;
    out->n = 0;
    tdm_lines r;
    tdm_err terr = {0};
    if (tdm_lines_open(&r, path, TDM_INPUT_LINE_MAX, TDM_INPUT_TOTAL_MAX, &terr) != TANDEM_OK) {
        snprintf(err, cap, "%s", terr.msg);
        return false;
    }
    bool ok = read_lines(&r, path, out, lenient, err, cap);
    tdm_lines_close(&r);
    return ok;
}

bool cli_prompts_read_stream(FILE *f, const char *name, bool lenient, cli_prompts *out, char *err, size_t cap) {
    tdm_lines r = {.f = f, .own = false, .name = name, .line_max = TDM_INPUT_LINE_MAX,
                   .total_max = TDM_INPUT_TOTAL_MAX};
    bool ok = read_lines(&r, name, out, lenient, err, cap);
    tdm_lines_close(&r);
    return ok;
}

bool cli_prompts_read(const char *path, cli_prompts *out, char *err, size_t cap) {
    return read_prompts(path, out, false, err, cap);
}

bool cli_prompts_read_lenient(const char *path, cli_prompts *out, char *err, size_t cap) {
    return read_prompts(path, out, true, err, cap);
}

bool cli_prompts_single(const char *text, cli_prompts *out) {
    out->n = 0;
    out->items = calloc(1, sizeof *out->items);
    if (!out->items) return false;
    cli_prompt *p = &out->items[0];
    p->id_kind = CLI_ID_INT;
    p->id_int = 0;
    p->len = strlen(text);
    p->text = tdm_strndup(text, p->len);
    if (!p->text) {
        free(out->items);
        out->items = NULL;
        return false;
    }
    out->n = 1;
    return true;
}

void cli_prompt_write_id(FILE *f, const cli_prompt *p, bool json) {
    switch (p->id_kind) {
    case CLI_ID_INT:
        fprintf(f, "%lld", (long long)p->id_int);
        break;
    case CLI_ID_NUM: /* the literal, valid JSON as it is */
        fwrite(p->id_str, 1, p->id_len, f);
        break;
    case CLI_ID_STR:
        if (json)
            tdm_json_write_str(f, p->id_str, p->id_len);
        else
            fwrite(p->id_str, 1, p->id_len, f);
        break;
    }
}

/* A string as a JSON literal (heap), as the output writes it. */
static char *json_str_text(const char *str, size_t n) {
    char *t = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&t, &len);
    if (!m) return NULL;
    tdm_json_write_str(m, str, n);
    if (fclose(m) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

char *cli_json_id_text(const tdm_json *id) {
    if (id->type == TDM_JSON_STRING) return json_str_text(id->str, id->str_len);
    return id->type == TDM_JSON_NUMBER ? tdm_strndup(id->str, id->str_len) : NULL;
}

char *cli_prompt_id_text(const cli_prompt *p) {
    if (p->id_kind == CLI_ID_STR) return json_str_text(p->id_str, p->id_len);
    if (p->id_kind == CLI_ID_NUM) return tdm_strndup(p->id_str, p->id_len);
    char buf[32];
    int n = snprintf(buf, sizeof buf, "%lld", (long long)p->id_int);
    return tdm_strndup(buf, (size_t)n);
}

void cli_prompt_apply(const cli_prompt *p, tandem_request *rq) {
    tandem_generate_params *g = &rq->params;
    if (p->has_seed) g->seed = p->seed;
    if (p->has_max_tokens) g->max_tokens = p->max_tokens;
    if (p->has_temperature) g->temperature = p->temperature;
    if (p->has_stop) {
        g->stop = (const char *const *)p->stop;
        g->n_stop = p->n_stop;
    }
    if (p->grammar || p->json_schema) { /* (the line's constraint replaces the job's) */
        g->grammar = p->grammar;
        g->json_schema = p->json_schema;
    }
    if (p->has_presence) g->presence_penalty = p->presence;
    if (p->has_frequency) g->frequency_penalty = p->frequency;
    if (p->has_repetition) g->repetition_penalty = p->repetition;
    if (p->has_min_tokens) g->min_tokens = p->min_tokens;
    if (p->logit_bias) {
        g->logit_bias = p->logit_bias;
        g->n_logit_bias = p->n_logit_bias;
    }
    if (p->has_logprobs) {
        g->logprobs = p->logprobs >= 0;
        g->top_logprobs = p->logprobs > 0 ? p->logprobs : 0;
    }
    if (p->has_priority) rq->priority = p->priority;
    if (p->has_timeout) rq->timeout_ms = p->timeout_ms;
}
