/* oai_tokenize.c - POST /tokenize and /detokenize (oai_response.h): llama-server's and
 * vLLM's shapes, with the served model's tokenizer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "oai_response.h"
#include "unicode.h"

static const tdm_json *member(const tdm_json *j, const char *name) {
    const tdm_json *v = tdm_json_get(j, name);
    return v && v->type != TDM_JSON_NULL ? v : NULL;
}

/* Parses body as a JSON object whose members are all in known[] (else a 400 naming
 * the first other one: nothing is ignored here) and whose model, if given, is the
 * served one (else 404). */
static tdm_json *parse_body(const char *body, size_t len, const oai_limits *lim, const char *const *known, size_t n_known,
                            const char *path, oai_error *e) {
    tdm_json *j = NULL;
    tdm_err jerr = {0};
    if (tdm_json_parse(body, len, &j, &jerr) != TANDEM_OK) {
        oai_fail(e, 400, NULL, "invalid_json", "the body is not valid JSON: %s", jerr.msg);
        return NULL;
    }
    if (j->type != TDM_JSON_OBJECT) {
        oai_fail(e, 400, NULL, "invalid_type", "the body of %s must be a JSON object", path);
        tdm_json_free(j);
        return NULL;
    }
    for (size_t i = 0; i < j->n; i++) {
        const char *k = j->keys[i];
        bool ok = !strcmp(k, "model");
        for (size_t q = 0; q < n_known && !ok; q++) ok = !strcmp(k, known[q]);
        if (!ok) {
            oai_fail(e, 400, k, "unsupported_parameter", "'%.60s' is not a member %s takes", k, path);
            tdm_json_free(j);
            return NULL;
        }
    }
    const tdm_json *m = member(j, "model");
    if (m && (m->type != TDM_JSON_STRING || strcmp(m->str, lim->model_id) != 0)) {
        oai_fail(e, 404, "model", "model_not_found", "The model '%.200s' does not exist (this server serves '%s')",
                 m->type == TDM_JSON_STRING ? m->str : "?", lim->model_id);
        tdm_json_free(j);
        return NULL;
    }
    return j;
}

static bool get_flag(const tdm_json *j, const char *name, bool *out, oai_error *e) {
    const tdm_json *v = member(j, name);
    if (!v) return true;
    if (v->type != TDM_JSON_BOOL) return oai_fail(e, 400, name, "invalid_type", "'%s' must be a boolean", name);
    *out = v->b;
    return true;
}

static bool valid_utf8(const char *s, size_t n) {
    for (size_t at = 0; at < n;) {
        uint32_t cp;
        at += (size_t)tdm_utf8_decode((const uint8_t *)s + at, n - at, &cp);
        if (cp & TDM_UTF8_INVALID) return false;
    }
    return true;
}

/* {"id": ID, "piece": its text}: the piece as a string when it is whole UTF-8, else as
 * its bytes (an array of numbers), as llama-server writes it. */
static bool write_piece(FILE *f, const tandem_model *model, int32_t id) {
    char *t = NULL;
    if (tandem_detokenize(model, &id, 1, &t) != TANDEM_OK) return false;
    const size_t n = strlen(t);
    fprintf(f, "{\"id\": %d, \"piece\": ", (int)id);
    if (valid_utf8(t, n)) {
        tdm_json_write_str(f, t, n);
    } else {
        fputc('[', f);
        for (size_t i = 0; i < n; i++) fprintf(f, i ? ", %u" : "%u", (unsigned)(unsigned char)t[i]);
        fputc(']', f);
    }
    fputc('}', f);
    tandem_free(t);
    return true;
}

/* The memory stream's text, or NULL (a 500) when writing it failed. */
static char *close_text(FILE *f, char **buf, size_t *n, size_t *len, oai_error *e) {
    const bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) { /* (fclose sets *buf and *n) */
        free(*buf);
        oai_fail(e, 500, NULL, NULL, "out of memory");
        return NULL;
    }
    *len = *n;
    return *buf;
}

char *oai_tokenize_json(const tandem_model *model, const oai_limits *lim, const char *body, size_t len, size_t *out_len,
                        oai_error *e) {
    static const char *const known[] = {"content", "prompt", "add_special", "add_special_tokens", "with_pieces",
                                        "parse_special"};
    tdm_json *j = parse_body(body, len, lim, known, sizeof known / sizeof *known, "/tokenize", e);
    if (!j) return NULL;
    char *out = NULL;
    const tdm_json *content = member(j, "content"), *prompt = member(j, "prompt"), *text = content ? content : prompt;
    /* add_special (llama-server's, default false) or add_special_tokens (vLLM's, default
     * true): the BOS (and EOS) the model's tokenizer asks for */
    bool add = content == NULL, pieces = false, parse_special = true;
    if (content && prompt) {
        oai_fail(e, 400, "prompt", "invalid_value", "give 'content' (llama-server) or 'prompt' (vLLM), not both");
    } else if (!text) {
        oai_fail(e, 400, "content", "missing_required_parameter", "'content' (or 'prompt') is required");
    } else if (text->type != TDM_JSON_STRING) {
        oai_fail(e, 400, content ? "content" : "prompt", "invalid_type", "'%s' must be a string",
                 content ? "content" : "prompt");
    } else if (get_flag(j, "add_special", &add, e) && get_flag(j, "add_special_tokens", &add, e) &&
               get_flag(j, "with_pieces", &pieces, e) && get_flag(j, "parse_special", &parse_special, e)) {
        int32_t *ids = NULL;
        size_t n = 0;
        if (!parse_special) {
            oai_fail(e, 400, "parse_special", "unsupported_value",
                     "'parse_special': false is not supported (text spelling a special token becomes that token)");
        } else if (tandem_tokenize(model, text->str, text->str_len, add, &ids, &n) != TANDEM_OK) {
            oai_fail(e, 500, NULL, NULL, "tokenization failed: %s", tandem_last_error());
        } else {
            char *buf = NULL;
            size_t blen = 0;
            FILE *f = open_memstream(&buf, &blen);
            if (!f) {
                oai_fail(e, 500, NULL, NULL, "out of memory");
            } else {
                fputs("{\"tokens\": [", f);
                bool ok = true;
                for (size_t i = 0; i < n && ok; i++) {
                    if (i) fputs(", ", f);
                    if (pieces) ok = write_piece(f, model, ids[i]);
                    else fprintf(f, "%d", (int)ids[i]);
                }
                fprintf(f, "], \"count\": %zu, \"max_model_len\": %d}", n, lim->n_ctx);
                out = close_text(f, &buf, &blen, out_len, e);
                if (out && !ok) {
                    free(out);
                    out = NULL;
                    oai_fail(e, 500, NULL, NULL, "detokenization failed: %s", tandem_last_error());
                }
            }
        }
        tandem_free(ids);
    }
    tdm_json_free(j);
    return out;
}

char *oai_detokenize_json(const tandem_model *model, const oai_limits *lim, const char *body, size_t len,
                          size_t *out_len, oai_error *e) {
    static const char *const known[] = {"tokens"};
    tdm_json *j = parse_body(body, len, lim, known, 1, "/detokenize", e);
    if (!j) return NULL;
    char *out = NULL;
    const tdm_json *t = member(j, "tokens");
    int32_t *ids = NULL;
    bool ok = true;
    if (!t) ok = oai_fail(e, 400, "tokens", "missing_required_parameter", "'tokens' is required");
    else if (t->type != TDM_JSON_ARRAY) ok = oai_fail(e, 400, "tokens", "invalid_type", "'tokens' must be an array of token ids");
    else if (t->n && !(ids = malloc(t->n * sizeof *ids))) ok = oai_fail(e, 500, NULL, NULL, "out of memory");
    for (size_t i = 0; ok && i < t->n; i++) {
        int64_t id;
        if (t->items[i].type != TDM_JSON_NUMBER || !tdm_json_int(&t->items[i], &id) || id < 0 || id >= lim->n_vocab)
            ok = oai_fail(e, 400, "tokens", "invalid_value", "'tokens'[%zu] is not a token id in [0, %d)", i, lim->n_vocab);
        else ids[i] = (int32_t)id;
    }
    char *text = NULL;
    if (ok && tandem_detokenize(model, ids, t->n, &text) != TANDEM_OK)
        ok = oai_fail(e, 500, NULL, NULL, "detokenization failed: %s", tandem_last_error());
    if (ok) {
        char *buf = NULL;
        size_t blen = 0;
        FILE *f = open_memstream(&buf, &blen);
        if (!f) {
            oai_fail(e, 500, NULL, NULL, "out of memory");
        } else { /* content: llama-server's member; prompt: vLLM's */
            fputs("{\"content\": ", f);
            tdm_json_write_str(f, text, strlen(text));
            fputs(", \"prompt\": ", f);
            tdm_json_write_str(f, text, strlen(text));
            fputc('}', f);
            out = close_text(f, &buf, &blen, out_len, e);
        }
    }
    tandem_free(text);
    free(ids);
    tdm_json_free(j);
    return out;
}
