/* prompts.c - reads JSON-lines prompt files for `tandem generate` / `tandem bench`.
 *
 * One JSON object per line:
 *   {"id": <number|string>, "prompt": <string>,
 *    "seed": <int >= 0>?, "max_tokens": <int >= 0>?, "temperature": <number >= 0>?}
 * Other members are ignored; blank lines are skipped.  A missing id becomes the
 * 0-based index of the prompt.  Every line is checked before anything runs. */
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "json.h"

#define CLI_MAX_TOKENS_LIMIT (1 << 30)

static void prompt_free(cli_prompt *p) {
    free(p->id_str);
    free(p->text);
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

/* Fills p from one parsed line; false with err set on a bad member. */
static bool prompt_from_json(const tdm_json *j, cli_prompt *p, size_t index, const char *path,
                             int line, char *err, size_t cap) {
    if (j->type != TDM_JSON_OBJECT) return line_err(err, cap, path, line, "expected a JSON object");
    p->line = line;

    const tdm_json *id = tdm_json_get(j, "id");
    if (!id) {
        p->id_kind = CLI_ID_INT;
        p->id_int = (int64_t)index;
    } else if (id->type == TDM_JSON_STRING) {
        p->id_kind = CLI_ID_STR;
        p->id_str = tdm_strndup(id->str, id->str_len);
        p->id_len = id->str_len;
        if (!p->id_str) return line_err(err, cap, path, line, "out of memory");
    } else if (id->type == TDM_JSON_NUMBER) {
        if (tdm_json_int(id, &p->id_int)) {
            p->id_kind = CLI_ID_INT;
        } else {
            p->id_kind = CLI_ID_NUM;
            p->id_num = id->num;
        }
    } else {
        return line_err(err, cap, path, line, "\"id\" must be a number or a string");
    }

    const tdm_json *pr = tdm_json_get(j, "prompt");
    if (!pr) return line_err(err, cap, path, line, "missing \"prompt\"");
    if (pr->type != TDM_JSON_STRING)
        return line_err(err, cap, path, line, "\"prompt\" must be a string");
    p->text = tdm_strndup(pr->str, pr->str_len);
    p->len = pr->str_len;
    if (!p->text) return line_err(err, cap, path, line, "out of memory");

    const tdm_json *v = tdm_json_get(j, "seed");
    if (v) {
        int64_t s;
        if (v->type != TDM_JSON_NUMBER || !tdm_json_int(v, &s) || s < 0)
            return line_err(err, cap, path, line, "\"seed\" must be a non-negative integer");
        p->has_seed = true;
        p->seed = (uint64_t)s;
    }
    v = tdm_json_get(j, "max_tokens");
    if (v) {
        int64_t m;
        if (v->type != TDM_JSON_NUMBER || !tdm_json_int(v, &m) || m < 0 ||
            m > CLI_MAX_TOKENS_LIMIT)
            return line_err(err, cap, path, line,
                            "\"max_tokens\" must be an integer in [0, %d]", CLI_MAX_TOKENS_LIMIT);
        p->has_max_tokens = true;
        p->max_tokens = (int)m;
    }
    v = tdm_json_get(j, "temperature");
    if (v) {
        if (v->type != TDM_JSON_NUMBER || !isfinite(v->num) || v->num < 0 || v->num > 1e6)
            return line_err(err, cap, path, line, "\"temperature\" must be a number >= 0");
        p->has_temperature = true;
        p->temperature = (float)v->num;
    }
    return true;
}

bool cli_prompts_read(const char *path, cli_prompts *out, char *err, size_t cap) {
    out->items = NULL;
    out->n = 0;
    char *text = NULL;
    size_t len = 0;
    tdm_err terr = {0};
    if (tdm_read_file(path, &text, &len, &terr) != TANDEM_OK) {
        snprintf(err, cap, "%s", terr.msg);
        return false;
    }
    cli_prompts ps = {0};
    size_t items_cap = 0;
    bool ok = true;
    int line = 0;
    const char *p = text, *end = text + len;
    while (ok && p < end) {
        line++;
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        size_t n = (size_t)(le - p);
        if (!is_blank(p, n)) {
            if (ps.n == items_cap) {
                size_t nc = items_cap ? items_cap * 2 : 16;
                cli_prompt *ni = realloc(ps.items, nc * sizeof *ni);
                if (!ni) {
                    ok = line_err(err, cap, path, line, "out of memory");
                    break;
                }
                ps.items = ni;
                items_cap = nc;
            }
            tdm_json *j = NULL;
            tdm_err jerr = {0};
            if (tdm_json_parse(p, n, &j, &jerr) != TANDEM_OK) {
                ok = line_err(err, cap, path, line, "invalid JSON: %s", jerr.msg);
            } else {
                cli_prompt *pr = &ps.items[ps.n];
                memset(pr, 0, sizeof *pr);
                ok = prompt_from_json(j, pr, ps.n, path, line, err, cap);
                if (ok)
                    ps.n++;
                else
                    prompt_free(pr);
            }
            tdm_json_free(j);
        }
        p = nl ? nl + 1 : end;
    }
    free(text);
    if (ok && ps.n == 0) {
        snprintf(err, cap, "%s: no prompts in the file", path);
        ok = false;
    }
    if (!ok) {
        cli_prompts_free(&ps);
        return false;
    }
    *out = ps;
    return true;
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
    case CLI_ID_NUM:
        fprintf(f, "%.17g", isfinite(p->id_num) ? p->id_num : 0.0);
        break;
    case CLI_ID_STR:
        if (json)
            tdm_json_write_str(f, p->id_str, p->id_len);
        else
            fwrite(p->id_str, 1, p->id_len, f);
        break;
    }
}
