/* tokenizer.c - loading a GGUF vocabulary, special-token splitting, encode and
 * decode entry points (the algorithms live in tok_bpe.c / tok_spm.c /
 * tok_pretok.c). */
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_internal.h"
#include "unicode.h"

/* ------------------------------------------------------------ small helpers */

bool tok_ids_push(tok_ids *o, int32_t id) {
    if (o->n == o->cap) {
        size_t nc = o->cap ? o->cap * 2 : 64;
        int32_t *nv = realloc(o->v, nc * sizeof *nv);
        if (!nv) return false;
        o->v = nv;
        o->cap = nc;
    }
    o->v[o->n++] = id;
    return true;
}

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 0xCBF29CE484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001B3ull;
    }
    return h ^ (h >> 29);
}

int32_t tok_lookup(const tdm_tokenizer *t, const char *s, size_t len) {
    uint32_t i = (uint32_t)hash_bytes(s, len) & t->index.mask;
    for (;;) {
        int32_t id = t->index.slots[i];
        if (id < 0) return -1;
        if (t->text_len[id] == len && memcmp(tok_text(t, id), s, len) == 0) return id;
        i = (i + 1) & t->index.mask;
    }
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* Inserts id under its text; a later duplicate text replaces the earlier id. */
static void index_insert(tdm_tokenizer *t, int32_t id) {
    const char *s = tok_text(t, id);
    size_t len = t->text_len[id];
    uint32_t i = (uint32_t)hash_bytes(s, len) & t->index.mask;
    for (;;) {
        int32_t cur = t->index.slots[i];
        if (cur < 0 || (t->text_len[cur] == len && memcmp(tok_text(t, cur), s, len) == 0)) {
            t->index.slots[i] = id;
            return;
        }
        i = (i + 1) & t->index.mask;
    }
}

/* Inserts a merge unless the pair is already there (the first rule wins). */
static void merge_insert(tok_mergemap *m, int32_t l, int32_t r, int32_t rank, int32_t result) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint64_t hsh = key * 0x9E3779B97F4A7C15ull;
    uint32_t i = (uint32_t)(hsh >> 32) & m->mask;
    for (;;) {
        tok_merge_slot *s = &m->slots[i];
        if (s->key == key) return;
        if (s->key == UINT64_MAX) {
            s->key = key;
            s->rank = rank;
            s->result = result;
            return;
        }
        i = (i + 1) & m->mask;
    }
}

/* ------------------------------------------------------------------ loading */

void tdm_tokenizer_free(tdm_tokenizer *t) {
    if (!t) return;
    free(t->arena);
    free(t->text_off);
    free(t->text_len);
    free(t->piece_off);
    free(t->piece_len);
    free(t->scores);
    free(t->type);
    free(t->index.slots);
    free(t->merges.slots);
    free(t->specials);
    free(t->eog);
    free(t);
}

static bool str_is(tdm_gguf_str s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

/* Optional token id key: -1 (or def) when absent; FORMAT error when out of range. */
static tandem_status opt_token_id(const tdm_gguf *g, const char *key, int32_t def, int32_t n_vocab,
                                  int32_t *out, tdm_err *err) {
    *out = def < n_vocab ? def : -1;
    if (!tdm_gguf_find(g, key)) return TANDEM_OK;
    uint32_t v;
    tandem_status st = tdm_gguf_get_u32(g, key, &v, err);
    if (st != TANDEM_OK) {
        /* some files store -1 (as int32) for "none" */
        int32_t iv;
        if (tdm_gguf_get_i32(g, key, &iv, NULL) == TANDEM_OK && iv == -1) {
            *out = -1;
            return TANDEM_OK;
        }
        return st;
    }
    if (v >= (uint32_t)n_vocab)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "tokenizer: %s = %u is out of range (n_vocab %d)",
                          key, v, n_vocab);
    *out = (int32_t)v;
    return TANDEM_OK;
}

/* Decoded piece of token id (render_special = false) written to dst; returns length.
 * dst has room for text_len + 3 bytes. */
static uint32_t decode_piece(const tdm_tokenizer *t, int32_t id, char *dst) {
    const char *s = tok_text(t, id);
    uint32_t len = t->text_len[id];
    uint8_t ty = t->type[id];
    if (ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_UNUSED) return 0;
    if (ty == TOK_TYPE_USER_DEFINED) {
        memcpy(dst, s, len);
        return len;
    }
    if (t->model == TOK_MODEL_SPM) {
        if (ty == TOK_TYPE_UNKNOWN) {
            memcpy(dst, "\xE2\x96\x85", 3); /* U+2585, as llama.cpp renders <unk> */
            return 3;
        }
        unsigned byte;
        char tail;
        if (ty == TOK_TYPE_BYTE && len == 6 && sscanf(s, "<0x%2X%c", &byte, &tail) == 2 && tail == '>') {
            dst[0] = (char)byte;
            return 1;
        }
        uint32_t n = 0;
        for (uint32_t i = 0; i < len;) {
            if (i + 3 <= len && memcmp(s + i, "\xE2\x96\x81", 3) == 0) { /* U+2581 -> ' ' */
                dst[n++] = ' ';
                i += 3;
            } else {
                dst[n++] = s[i++];
            }
        }
        return n;
    }
    if (ty == TOK_TYPE_UNKNOWN) return 0;
    /* byte-level BPE: each code point maps back to one byte */
    uint32_t n = 0;
    for (uint32_t i = 0; i < len;) {
        uint32_t cp;
        int k = tdm_utf8_decode((const uint8_t *)s + i, len - i, &cp);
        int b = (cp & TDM_UTF8_INVALID) ? -1 : tdm_cp_to_byte(cp);
        if (b >= 0) {
            dst[n++] = (char)b;
        } else {
            memcpy(dst + n, s + i, (size_t)k); /* not a byte-level char: keep as is */
            n += (uint32_t)k;
        }
        i += (uint32_t)k;
    }
    return n;
}

typedef struct special_key {
    uint32_t len;
    int32_t id;
} special_key;

static int special_cmp(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static tandem_status load_merges(tdm_tokenizer *t, const tdm_gguf_array *m, tdm_err *err) {
    if (m->n > INT32_MAX) return tdm_seterr(err, TANDEM_ERR_FORMAT, "tokenizer: too many merges");
    uint32_t cap = pow2_at_least(2 * m->n + 1);
    t->merges.mask = cap - 1;
    t->merges.slots = tdm_mallocarray(cap, sizeof *t->merges.slots);
    if (!t->merges.slots) return tdm_seterr(err, TANDEM_ERR_NOMEM, "tokenizer: out of memory");
    for (uint32_t i = 0; i < cap; i++) t->merges.slots[i].key = UINT64_MAX;
    char *buf = NULL;
    size_t buf_cap = 0;
    for (uint64_t r = 0; r < m->n; r++) {
        const char *s = m->strs[r].ptr;
        size_t len = (size_t)m->strs[r].len;
        const char *sp = len > 1 ? memchr(s + 1, ' ', len - 1) : NULL;
        if (!sp) {
            free(buf);
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "tokenizer: merge %llu ('%.*s') is not 'left right'",
                              (unsigned long long)r, (int)TDM_MIN(len, 64), s);
        }
        size_t ll = (size_t)(sp - s), rl = len - ll - 1;
        int32_t l = tok_lookup(t, s, ll), rr = tok_lookup(t, sp + 1, rl);
        if (l < 0 || rr < 0) {
            free(buf);
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "tokenizer: merge %llu ('%.*s') names an unknown token",
                              (unsigned long long)r, (int)TDM_MIN(len, 64), s);
        }
        if (ll + rl > buf_cap) {
            free(buf);
            buf_cap = ll + rl + 64;
            buf = malloc(buf_cap);
            if (!buf) return tdm_seterr(err, TANDEM_ERR_NOMEM, "tokenizer: out of memory");
        }
        memcpy(buf, s, ll);
        memcpy(buf + ll, sp + 1, rl);
        int32_t res = tok_lookup(t, buf, ll + rl);
        if (res < 0) {
            free(buf);
            return tdm_seterr(err, TANDEM_ERR_FORMAT,
                              "tokenizer: merge %llu ('%.*s') makes a token that is not in the vocabulary",
                              (unsigned long long)r, (int)TDM_MIN(len, 64), s);
        }
        merge_insert(&t->merges, l, rr, (int32_t)r, res);
    }
    free(buf);
    return TANDEM_OK;
}

static tandem_status load_vocab(tdm_tokenizer *t, const tdm_gguf *g, tdm_err *err) {
    tandem_status st;
    const tdm_gguf_array *toks, *types = NULL, *scores = NULL;
    if ((st = tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", TDM_GGUF_STRING, &toks, err))) return st;
    if (toks->n == 0 || toks->n > INT32_MAX / 2)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "tokenizer: tokenizer.ggml.tokens has %llu entries",
                          (unsigned long long)toks->n);
    int32_t n = (int32_t)toks->n;
    t->n_vocab = n;
    if (tdm_gguf_find(g, "tokenizer.ggml.token_type")) {
        if ((st = tdm_gguf_get_arr(g, "tokenizer.ggml.token_type", TDM_GGUF_INT32, &types, err))) return st;
        if (types->n != toks->n)
            return tdm_seterr(err, TANDEM_ERR_FORMAT,
                              "tokenizer: tokenizer.ggml.token_type has %llu entries, tokens has %d",
                              (unsigned long long)types->n, n);
    }
    if (tdm_gguf_find(g, "tokenizer.ggml.scores")) {
        if ((st = tdm_gguf_get_arr(g, "tokenizer.ggml.scores", TDM_GGUF_FLOAT32, &scores, err))) return st;
        if (scores->n != toks->n)
            return tdm_seterr(err, TANDEM_ERR_FORMAT,
                              "tokenizer: tokenizer.ggml.scores has %llu entries, tokens has %d",
                              (unsigned long long)scores->n, n);
    }
    /* arena: raw texts, then pieces (each piece <= text_len + 3 bytes), NUL-separated */
    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (toks->strs[i].len > (1u << 20))
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "tokenizer: token %d is %llu bytes long", i,
                              (unsigned long long)toks->strs[i].len);
        total += 2 * toks->strs[i].len + 5;
    }
    if (total > SIZE_MAX / 2) return tdm_seterr(err, TANDEM_ERR_NOMEM, "tokenizer: vocabulary too large");
    t->arena = malloc((size_t)total);
    t->text_off = tdm_mallocarray((size_t)n, sizeof *t->text_off);
    t->text_len = tdm_mallocarray((size_t)n, sizeof *t->text_len);
    t->piece_off = tdm_mallocarray((size_t)n, sizeof *t->piece_off);
    t->piece_len = tdm_mallocarray((size_t)n, sizeof *t->piece_len);
    t->scores = tdm_calloc((size_t)n, sizeof *t->scores);
    t->type = tdm_malloc((size_t)n);
    uint32_t cap = pow2_at_least(2 * (uint64_t)n);
    t->index.mask = cap - 1;
    t->index.slots = tdm_mallocarray(cap, sizeof *t->index.slots);
    if (!t->arena || !t->text_off || !t->text_len || !t->piece_off || !t->piece_len || !t->scores ||
        !t->type || !t->index.slots)
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "tokenizer: out of memory for %d tokens", n);
    memset(t->index.slots, 0xFF, cap * sizeof *t->index.slots);
    uint64_t off = 0;
    for (int32_t i = 0; i < n; i++) {
        t->text_off[i] = off;
        t->text_len[i] = (uint32_t)toks->strs[i].len;
        memcpy(t->arena + off, toks->strs[i].ptr, t->text_len[i]);
        off += t->text_len[i];
        t->arena[off++] = 0;
        int32_t ty = types ? tdm_gguf_arr_i32(types, (uint64_t)i) : TOK_TYPE_NORMAL;
        t->type[i] = (ty >= TOK_TYPE_NORMAL && ty <= TOK_TYPE_BYTE) ? (uint8_t)ty : TOK_TYPE_NORMAL;
        if (scores) t->scores[i] = tdm_gguf_arr_f32(scores, (uint64_t)i);
        index_insert(t, i);
    }
    t->max_piece = 0;
    for (int32_t i = 0; i < n; i++) {
        t->piece_off[i] = off;
        t->piece_len[i] = decode_piece(t, i, t->arena + off);
        off += t->piece_len[i];
        t->arena[off++] = 0;
        int32_t m = (int32_t)TDM_MAX(t->piece_len[i], t->text_len[i]);
        if (m > t->max_piece) t->max_piece = m;
    }
    return TANDEM_OK;
}

static tandem_status load_specials(tdm_tokenizer *t, tdm_err *err) {
    int32_t cnt = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) && t->text_len[i])
            cnt++;
    }
    t->n_specials = cnt;
    if (!cnt) return TANDEM_OK;
    special_key *keys = tdm_mallocarray((size_t)cnt, sizeof *keys);
    t->specials = tdm_mallocarray((size_t)cnt, sizeof *t->specials);
    if (!keys || !t->specials) {
        free(keys);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "tokenizer: out of memory");
    }
    cnt = 0;
    for (int32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        if ((ty == TOK_TYPE_CONTROL || ty == TOK_TYPE_USER_DEFINED || ty == TOK_TYPE_UNKNOWN) && t->text_len[i])
            keys[cnt++] = (special_key){t->text_len[i], i};
    }
    qsort(keys, (size_t)cnt, sizeof *keys, special_cmp);
    for (int32_t i = 0; i < cnt; i++) t->specials[i] = keys[i].id;
    free(keys);
    return TANDEM_OK;
}

/* Texts of the tokens that end a generation, as llama.cpp recognises them (its EOG
 * list): chat turn ends, end-of-text markers. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", /* DeepSeek: <｜end▁of▁sentence｜> */
    "[e~[",
};

/* The fill-in-the-middle tokens llama.cpp also ends a generation at (its FIM pad,
 * repository and file separator tokens: a code model's completion stops where the
 * next file or the padding would begin): the GGUF's tokenizer.ggml.fim_*_token_id
 * when set, else the first of these texts the vocabulary holds. */
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]", NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};

_Static_assert(sizeof eog_texts / sizeof eog_texts[0] + 6 <= TDM_TOK_EOG_MAX, "tdm_tok_eog_ids' bound");

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static int32_t find_text(const tdm_tokenizer *t, const char *s) { return tok_lookup(t, s, strlen(s)); }

/* A FIM token: the key's id when set, else the first of texts found (-1: none). */
static tandem_status fim_token(const tdm_tokenizer *t, const tdm_gguf *g, const char *key, const char *const *texts,
                               int32_t *out, tdm_err *err) {
    tandem_status st = opt_token_id(g, key, -1, t->n_vocab, out, err);
    for (int i = 0; !st && *out < 0 && texts[i]; i++) *out = find_text(t, texts[i]);
    return st;
}

/* The end-of-generation set: EOS, EOT, EOM, the FIM pad / repository / file
 * separator tokens and the tokens of eog_texts, less llama.cpp's two exceptions
 * (<|end|> where <|return|> and <|call|> or <|calls|> and <|flush|> exist, </s> where
 * <|tool_response> exists).  Sorted. */
static tandem_status load_eog(tdm_tokenizer *t, const tdm_gguf *g, tdm_err *err) {
    int32_t fim[3];
    tandem_status st;
    if ((st = fim_token(t, g, "tokenizer.ggml.fim_pad_token_id", fim_pad_texts, &fim[0], err)) ||
        (st = fim_token(t, g, "tokenizer.ggml.fim_rep_token_id", fim_rep_texts, &fim[1], err)) ||
        (st = fim_token(t, g, "tokenizer.ggml.fim_sep_token_id", fim_sep_texts, &fim[2], err)))
        return st;
    size_t cap = TDM_ARRAY_LEN(eog_texts) + 6;
    t->eog = tdm_mallocarray(cap, sizeof *t->eog);
    if (!t->eog) return tdm_seterr(err, TANDEM_ERR_NOMEM, "tokenizer: out of memory");
    bool has_return = find_text(t, "<|return|>") >= 0, has_call = find_text(t, "<|call|>") >= 0,
         has_calls = find_text(t, "<|calls|>") >= 0, has_flush = find_text(t, "<|flush|>") >= 0;
    int32_t end = (has_return && has_call) || (has_calls && has_flush) ? find_text(t, "<|end|>") : -1;
    int32_t s_tok = find_text(t, "<|tool_response>") >= 0 ? find_text(t, "</s>") : -1;
    int32_t n = 0;
    for (size_t i = 0; i < TDM_ARRAY_LEN(eog_texts); i++) {
        int32_t id = find_text(t, eog_texts[i]);
        if (id >= 0 && id != end && id != s_tok) t->eog[n++] = id;
    }
    const int32_t ids[6] = {t->eos, t->eot, t->eom, fim[0], fim[1], fim[2]};
    for (int i = 0; i < 6; i++)
        if (ids[i] >= 0) t->eog[n++] = ids[i];
    qsort(t->eog, (size_t)n, sizeof *t->eog, cmp_i32);
    int32_t k = 0; /* unique */
    for (int32_t i = 0; i < n; i++)
        if (k == 0 || t->eog[k - 1] != t->eog[i]) t->eog[k++] = t->eog[i];
    t->n_eog = k;
    return TANDEM_OK;
}

static tandem_status load(tdm_tokenizer *t, const tdm_gguf *g, tdm_err *err) {
    tandem_status st;
    tdm_gguf_str model, pre;
    if ((st = tdm_gguf_get_str(g, "tokenizer.ggml.model", &model, err))) return st;
    if (str_is(model, "gpt2")) t->model = TOK_MODEL_BPE;
    else if (str_is(model, "llama")) t->model = TOK_MODEL_SPM;
    else
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "tokenizer: unsupported tokenizer.ggml.model '%.*s'",
                          (int)TDM_MIN(model.len, 64), model.ptr);
    tok_pre_info pi = {TOK_PRE_DEFAULT, false, false}; /* llama.cpp's choice when the name is absent */
    if (t->model == TOK_MODEL_BPE && tdm_gguf_find(g, "tokenizer.ggml.pre")) {
        if ((st = tdm_gguf_get_str(g, "tokenizer.ggml.pre", &pre, err))) return st;
        tok_pre_lookup found = tok_pre_find(pre.ptr, (size_t)pre.len, &pi);
        if (found == TOK_PRE_NOT_IMPLEMENTED)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                              "tokenizer: pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported by tandem",
                              (int)TDM_MIN(pre.len, 64), pre.ptr);
        if (found == TOK_PRE_UNKNOWN)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                              "tokenizer: unknown pre-tokenizer '%.*s' (tokenizer.ggml.pre); the supported "
                              "names are listed in README.md",
                              (int)TDM_MIN(pre.len, 64), pre.ptr);
    }
    t->pre = pi.pre;
    t->ignore_merges = pi.ignore_merges;
    if ((st = load_vocab(t, g, err))) return st;
    if (t->model == TOK_MODEL_BPE) {
        const tdm_gguf_array *m;
        if ((st = tdm_gguf_get_arr(g, "tokenizer.ggml.merges", TDM_GGUF_STRING, &m, err))) return st;
        if ((st = load_merges(t, m, err))) return st;
        for (int b = 0; b < 256; b++) {
            char enc[4];
            int k = tdm_utf8_encode(tdm_byte_to_cp((uint8_t)b), enc);
            t->byte_tok[b] = tok_lookup(t, enc, (size_t)k);
        }
    } else {
        for (int b = 0; b < 256; b++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_tok[b] = tok_lookup(t, name, 6);
        }
    }
    bool spm = t->model == TOK_MODEL_SPM;
    if ((st = opt_token_id(g, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, t->n_vocab, &t->bos, err)) ||
        (st = opt_token_id(g, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, t->n_vocab, &t->eos, err)) ||
        (st = opt_token_id(g, "tokenizer.ggml.eot_token_id", -1, t->n_vocab, &t->eot, err)) ||
        (st = opt_token_id(g, "tokenizer.ggml.eom_token_id", -1, t->n_vocab, &t->eom, err)) ||
        (st = opt_token_id(g, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, t->n_vocab, &t->unk, err)))
        return st;
    if ((st = tdm_gguf_opt_bool(g, "tokenizer.ggml.add_bos_token", spm || pi.add_bos, &t->add_bos, err)) ||
        (st = tdm_gguf_opt_bool(g, "tokenizer.ggml.add_eos_token", false, &t->add_eos, err)))
        return st;
    if (t->add_bos && t->bos < 0 && tdm_gguf_find(g, "tokenizer.ggml.add_bos_token"))
        return tdm_seterr(err, TANDEM_ERR_FORMAT,
                          "tokenizer: tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
    if (t->add_eos && t->eos < 0)
        return tdm_seterr(err, TANDEM_ERR_FORMAT,
                          "tokenizer: tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set");
    if ((st = tdm_gguf_opt_bool(g, "tokenizer.ggml.add_space_prefix", true, &t->add_space_prefix, err)))
        return st;
    if (!spm) t->add_space_prefix = false;
    if ((st = load_eog(t, g, err))) return st;
    return load_specials(t, err);
}

tandem_status tdm_tokenizer_load(const tdm_gguf *g, tdm_tokenizer **out, tdm_err *err) {
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tokenizer: NULL out");
    *out = NULL;
    if (!g) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tokenizer: NULL gguf");
    tdm_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return tdm_seterr(err, TANDEM_ERR_NOMEM, "tokenizer: out of memory");
    tandem_status st = load(t, g, err);
    if (st != TANDEM_OK) {
        tdm_tokenizer_free(t);
        return st;
    }
    *out = t;
    return TANDEM_OK;
}

/* ------------------------------------------------------------------ queries */

int32_t tdm_tok_n_vocab(const tdm_tokenizer *t) { return t ? t->n_vocab : 0; }
int32_t tdm_tok_bos(const tdm_tokenizer *t) { return t ? t->bos : -1; }
int32_t tdm_tok_eos(const tdm_tokenizer *t) { return t ? t->eos : -1; }
bool tdm_tok_add_bos(const tdm_tokenizer *t) { return t && t->add_bos && t->bos >= 0; }
int32_t tdm_tok_max_piece(const tdm_tokenizer *t) { return t ? t->max_piece : 0; }

bool tdm_tok_is_special(const tdm_tokenizer *t, int32_t id) {
    if (!t || id < 0 || id >= t->n_vocab) return false;
    return t->type[id] == TOK_TYPE_CONTROL || t->type[id] == TOK_TYPE_USER_DEFINED;
}

bool tdm_tok_is_eog(const tdm_tokenizer *t, int32_t id) {
    if (!t || id < 0) return false;
    for (int32_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

int32_t tdm_tok_eog_ids(const tdm_tokenizer *t, const int32_t **ids) {
    *ids = t ? t->eog : NULL;
    return t ? t->n_eog : 0;
}

const char *tdm_tok_text(const tdm_tokenizer *t, int32_t id, size_t *len) {
    if (!t || id < 0 || id >= t->n_vocab) return NULL;
    if (len) *len = t->text_len[id];
    return tok_text(t, id);
}

/* ----------------------------------------------------------------- encoding */

/* A fragment of the input: raw text to tokenize, or an already-known token. */
typedef struct frag {
    int32_t id;        /* -1 = raw text */
    size_t off, len;   /* raw text: bytes text[off .. off+len) */
} frag;

typedef struct frags {
    frag *v;
    size_t n, cap;
} frags;

static bool frags_push(frags *f, frag x) {
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 16;
        frag *nv = realloc(f->v, nc * sizeof *nv);
        if (!nv) return false;
        f->v = nv;
        f->cap = nc;
    }
    f->v[f->n++] = x;
    return true;
}

/* Splits the raw fragments on every occurrence of special token id (in place via
 * a second buffer). */
static bool split_on_special(const tdm_tokenizer *t, const char *text, int32_t id, frags *cur, frags *tmp) {
    const char *st = tok_text(t, id);
    size_t sl = t->text_len[id];
    bool found = false;
    for (size_t i = 0; i < cur->n && !found; i++)
        if (cur->v[i].id < 0 && memmem(text + cur->v[i].off, cur->v[i].len, st, sl)) found = true;
    if (!found) return true;
    tmp->n = 0;
    for (size_t i = 0; i < cur->n; i++) {
        frag f = cur->v[i];
        if (f.id >= 0) {
            if (!frags_push(tmp, f)) return false;
            continue;
        }
        size_t pos = f.off, end = f.off + f.len;
        while (pos < end) {
            const char *hit = memmem(text + pos, end - pos, st, sl);
            size_t h = hit ? (size_t)(hit - text) : end;
            if (h > pos && !frags_push(tmp, (frag){-1, pos, h - pos})) return false;
            if (!hit) break;
            if (!frags_push(tmp, (frag){id, 0, 0})) return false;
            pos = h + sl;
        }
    }
    frags sw = *cur;
    *cur = *tmp;
    *tmp = sw;
    return true;
}

static bool encode_raw_bpe(const tdm_tokenizer *t, const char *s, size_t len, tok_spans *sp, tok_ids *out) {
    if (!tok_pretokenize(t->pre, s, len, sp)) return false;
    size_t start = 0;
    for (size_t i = 0; i < sp->n; i++) {
        if (!tok_bpe_word(t, s + start, sp->end[i] - start, out)) return false;
        start = sp->end[i];
    }
    return true;
}

/* SPM: optional leading space, then ' ' -> U+2581. */
static bool encode_raw_spm(const tdm_tokenizer *t, const char *s, size_t len, bool prefix, tok_ids *out) {
    size_t spaces = prefix ? 1 : 0;
    for (size_t i = 0; i < len; i++) spaces += s[i] == ' ';
    size_t n = len + (prefix ? 1 : 0) + 2 * spaces;
    char *buf = tdm_malloc(n);
    if (!buf) return false;
    size_t k = 0;
    if (prefix) {
        memcpy(buf, "\xE2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(buf + k, "\xE2\x96\x81", 3);
            k += 3;
        } else {
            buf[k++] = s[i];
        }
    }
    bool ok = tok_spm_encode(t, buf, k, out);
    free(buf);
    return ok;
}

tandem_status tdm_tokenize(const tdm_tokenizer *t, const char *text, size_t len, bool add_special,
                           bool parse_special, int32_t **ids, size_t *n_ids, tdm_err *err) {
    if (!ids || !n_ids) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tokenize: NULL output");
    *ids = NULL;
    *n_ids = 0;
    if (!t) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tokenize: NULL tokenizer");
    if (!text && len) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tokenize: NULL text");
    frags cur = {0}, tmp = {0};
    tok_ids out = {0};
    tok_spans sp = {0};
    bool ok = true;
    if (len) ok = frags_push(&cur, (frag){-1, 0, len});
    for (int32_t i = 0; ok && i < t->n_specials; i++) {
        int32_t id = t->specials[i];
        if (!parse_special && t->type[id] != TOK_TYPE_USER_DEFINED) continue;
        ok = split_on_special(t, text, id, &cur, &tmp);
    }
    if (ok && add_special && t->add_bos && t->bos >= 0) ok = tok_ids_push(&out, t->bos);
    bool prev_special = true; /* SPM: the text start gets the space prefix */
    for (size_t i = 0; ok && i < cur.n; i++) {
        frag f = cur.v[i];
        if (f.id >= 0) {
            ok = tok_ids_push(&out, f.id);
            prev_special = true;
        } else if (t->model == TOK_MODEL_BPE) {
            ok = encode_raw_bpe(t, text + f.off, f.len, &sp, &out);
        } else {
            ok = encode_raw_spm(t, text + f.off, f.len, t->add_space_prefix && prev_special, &out);
            prev_special = false;
        }
    }
    if (ok && add_special && t->add_eos) ok = tok_ids_push(&out, t->eos);
    free(cur.v);
    free(tmp.v);
    free(sp.end);
    if (!ok) {
        free(out.v);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "tokenize: out of memory (%zu bytes of text)", len);
    }
    *ids = out.v;
    *n_ids = out.n;
    return TANDEM_OK;
}

/* ----------------------------------------------------------------- decoding */

int32_t tdm_token_to_piece(const tdm_tokenizer *t, int32_t id, bool render_special, char *buf,
                           int32_t cap) {
    if (!t || id < 0 || id >= t->n_vocab) return -1;
    const char *src;
    uint32_t n;
    if (render_special && t->type[id] == TOK_TYPE_CONTROL) {
        src = tok_text(t, id);
        n = t->text_len[id];
    } else {
        src = t->arena + t->piece_off[id];
        n = t->piece_len[id];
    }
    if (buf && cap > 0) memcpy(buf, src, TDM_MIN((uint32_t)cap, n));
    return (int32_t)n;
}

void tdm_detok_init(tdm_detok *d, const tdm_tokenizer *t) {
    memset(d, 0, sizeof *d);
    d->first = t && t->model == TOK_MODEL_SPM && t->add_space_prefix;
}

int32_t tdm_detok_push(tdm_detok *d, const tdm_tokenizer *t, int32_t id, char *out, int32_t cap) {
    if (!d || !t || !out || id < 0 || id >= t->n_vocab) return -1;
    const char *piece = t->arena + t->piece_off[id];
    int32_t n = (int32_t)t->piece_len[id];
    if (d->first && n > 0) {
        if (piece[0] == ' ') {
            piece++;
            n--;
        }
        d->first = false; /* only the first non-empty piece */
    }
    if (d->n_pending + n > cap) return -1;
    /* out = pending + piece; then hold back an incomplete tail */
    memcpy(out, d->pending, (size_t)d->n_pending);
    memcpy(out + d->n_pending, piece, (size_t)n);
    int32_t total = d->n_pending + n;
    int32_t hold = (int32_t)tdm_utf8_incomplete_tail((const uint8_t *)out, (size_t)total);
    memcpy(d->pending, out + total - hold, (size_t)hold);
    d->n_pending = hold;
    return total - hold;
}

int32_t tdm_detok_flush(tdm_detok *d, char *out, int32_t cap) {
    if (!d || !out || cap < d->n_pending) return -1;
    int32_t n = d->n_pending;
    memcpy(out, d->pending, (size_t)n);
    d->n_pending = 0;
    return n;
}
