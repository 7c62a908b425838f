/* tok_pretok.c - pre-tokenization: the text decoded to code points, then each
 * pre-tokenizer's sequence of split rules (tok_pretok_rules.c) applied in turn, as
 * Hugging Face's Sequence of Split(..., "isolated") steps and llama.cpp's
 * unicode_regex_split apply their regexes: every rule splits every piece the
 * previous ones made into its matches and the text between them.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "tok_pretok.h"
#include "unicode.h"

#define MAX_RULES 6

typedef struct pretok_def {
    uint8_t n;
    tok_rule rules[MAX_RULES];
} pretok_def;

#define R(kind, arg, opts) {(kind), (arg), (opts)}
#define GPT2 R(RULE_GPT2, 0, 0)
#define QWEN2_OPTS (RULE_CONTRACTIONS | RULE_PUNCT_NL)

/* Each pre-tokenizer's regexes, in the order its tokenizer.json (or llama.cpp's
 * llama-vocab.cpp where the file has none) applies them. */
static const pretok_def defs[TOK_PRE_COUNT] = {
    [TOK_PRE_GPT2] = {1, {GPT2}},
    [TOK_PRE_DEFAULT] = {4, {R(RULE_RUN, SET_PUNCT_DEFAULT, 0), GPT2, R(RULE_NUMBERS, 0, 0), R(RULE_ASCII3, 0, 0)}},
    [TOK_PRE_FALCON] = {3, {R(RULE_RUN, SET_PUNCT_FALCON, 0), GPT2, R(RULE_ASCII3, 0, 0)}},
    [TOK_PRE_STARCODER] = {2, {R(RULE_NUMBERS, 1, 0), GPT2}},
    [TOK_PRE_LLAMA3] = {1, {R(RULE_LLAMA3, 3, QWEN2_OPTS)}},
    [TOK_PRE_QWEN2] = {1, {R(RULE_LLAMA3, 1, QWEN2_OPTS)}},
    [TOK_PRE_QWEN35] = {1, {R(RULE_LLAMA3, 1, QWEN2_OPTS | RULE_MARKS)}},
    [TOK_PRE_SEED_CODER] = {1, {R(RULE_LLAMA3, 1, RULE_CONTRACTIONS)}},
    [TOK_PRE_NO_CONTRACTION] = {1, {R(RULE_LLAMA3, 1, RULE_PUNCT_NL)}},
    [TOK_PRE_LAGUNA] = {2, {R(RULE_LINES, 0, 0), R(RULE_LLAMA3, 1, QWEN2_OPTS)}},
    [TOK_PRE_GPT4O] = {1, {R(RULE_O200K, 3, RULE_CONTRACTIONS)}},
    [TOK_PRE_TEKKEN] = {1, {R(RULE_O200K, 1, 0)}},
    [TOK_PRE_DEEPSEEK_LLM] = {6, {R(RULE_NEWLINE, 0, 0), R(RULE_RUN, SET_DEEPSEEK_LATIN, RULE_WS_PREFIX),
                                  R(RULE_RUN, SET_DEEPSEEK_PUNCT, RULE_WS_PREFIX), R(RULE_TRAILING_WS, 0, 0),
                                  R(RULE_RUN, SET_DEEPSEEK_CJK, 0), R(RULE_NUMBERS, 0, 0)}},
    [TOK_PRE_DEEPSEEK_CODER] = {5, {R(RULE_NEWLINE, 0, 0), R(RULE_RUN, SET_LETTER, RULE_WS_PREFIX),
                                    R(RULE_RUN, SET_PUNCT, RULE_WS_PREFIX), R(RULE_RUN, SET_DEEPSEEK_CJK, 0),
                                    R(RULE_NUMBERS, 1, 0)}},
    [TOK_PRE_DEEPSEEK3] = {3, {R(RULE_NUMBERS, 3, 0), R(RULE_RUN, SET_CJK_KANA, 0), R(RULE_DEEPSEEK3, 0, 0)}},
    [TOK_PRE_BLOOM] = {1, {R(RULE_BLOOM, 0, 0)}},
    [TOK_PRE_VIKING] = {2, {R(RULE_BLOOM, 0, 0), R(RULE_NUMBERS, 1, 0)}},
    [TOK_PRE_SUPERBPE] = {2, {R(RULE_NUMBERS, 0, 0), R(RULE_THOUSANDS, 0, 0)}},
};

bool tok_ends_push(tok_ends *o, size_t e) {
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        size_t *nv = realloc(o->v, nc * sizeof *nv);
        if (!nv) return false;
        o->v = nv;
        o->cap = nc;
    }
    o->v[o->n++] = e;
    return true;
}

/* One rule over every piece of in, into out. */
static bool apply(const tok_rule *r, const tok_cps *t, const tok_ends *in, tok_ends *out) {
    out->n = 0;
    size_t start = 0;
    for (size_t k = 0; k < in->n; k++) {
        if (!tok_rule_split(r, t, start, in->v[k], out)) return false;
        start = in->v[k];
    }
    return true;
}

bool tok_pretokenize(tok_pre pre, const char *text, size_t len, tok_spans *out) {
    out->n = 0;
    if (len == 0) return true;
    if ((unsigned)pre >= TOK_PRE_COUNT) return false;
    uint32_t *cp = tdm_mallocarray(len, sizeof *cp);
    uint16_t *fl = tdm_mallocarray(len, sizeof *fl);
    size_t *off = tdm_mallocarray(len + 1, sizeof *off); /* byte offset of each code point */
    tok_ends a = {0}, b = {0};
    bool ok = cp && fl && off;
    size_t n = 0;
    if (ok) {
        const uint8_t *u = (const uint8_t *)text;
        uint16_t invalid = tdm_unicode_flags(0xFFFD); /* what a decoder would put there */
        for (size_t i = 0; i < len; n++) {
            int k = tdm_utf8_decode(u + i, len - i, &cp[n]);
            fl[n] = (cp[n] & TDM_UTF8_INVALID) ? invalid : tdm_unicode_flags(cp[n]);
            off[n] = i;
            i += (size_t)k;
        }
        off[n] = len;
        ok = tok_ends_push(&a, n);
    }
    const tok_cps t = {cp, fl};
    const pretok_def *d = &defs[pre];
    for (unsigned k = 0; ok && k < d->n; k++) {
        ok = apply(&d->rules[k], &t, &a, &b);
        tok_ends sw = a;
        a = b;
        b = sw;
    }
    if (ok && a.n > out->cap) {
        size_t *ne = realloc(out->end, a.n * sizeof *ne);
        if (ne) {
            out->end = ne;
            out->cap = a.n;
        } else {
            ok = false;
        }
    }
    if (ok) {
        for (size_t k = 0; k < a.n; k++) out->end[k] = off[a.v[k]];
        out->n = a.n;
    }
    free(cp);
    free(fl);
    free(off);
    free(a.v);
    free(b.v);
    return ok;
}
