/* test_tokenizer.c - tokenizers against the reference cases, decoding, streaming,
 * malformed vocabularies and speed. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "testutil.h"
#include "tokenizer.h"
#include "unicode.h"

typedef struct loaded {
    tdm_gguf *g;
    tdm_tokenizer *t;
} loaded;

static loaded load_path(const char *path) {
    loaded L = {0};
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open(path, &L.g, &err), TANDEM_OK, "%s: %s", path, err.msg);
    cr_assert_eq(tdm_tokenizer_load(L.g, &L.t, &err), TANDEM_OK, "%s: %s", path, err.msg);
    return L;
}

static void unload(loaded *L) {
    tdm_tokenizer_free(L->t);
    tdm_gguf_close(L->g);
}

static void print_ids(const char *label, const int32_t *ids, size_t n) {
    fprintf(stderr, "  %s (%zu):", label, n);
    for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, "\n");
}

/* Runs every case of a jsonl file {"text", "ids"}; returns the number of failures. */
static size_t run_cases(const tdm_tokenizer *t, const char *jsonl, bool add_bos, const char *text_key,
                        const char *ids_key) {
    size_t n, fails = 0;
    tdm_json **cases = tdm_test_jsonl(jsonl, &n);
    cr_assert_gt(n, 0, "%s has no cases", jsonl);
    for (size_t i = 0; i < n; i++) {
        const tdm_json *text = tdm_json_get(cases[i], text_key);
        cr_assert(text && text->type == TDM_JSON_STRING, "%s:%zu: no \"%s\"", jsonl, i + 1, text_key);
        size_t n_exp;
        int32_t *exp = tdm_test_json_ids(tdm_json_get(cases[i], ids_key), &n_exp);
        int32_t *got;
        size_t n_got;
        tdm_err err = {0};
        cr_assert_eq(tdm_tokenize(t, text->str, text->str_len, add_bos, true, &got, &n_got, &err), TANDEM_OK,
                     "%s", err.msg);
        if (n_got != n_exp || (n_exp && memcmp(got, exp, n_exp * sizeof *exp) != 0)) {
            fails++;
            fprintf(stderr, "MISMATCH %s:%zu text: ", jsonl, i + 1);
            tdm_json_write_str(stderr, text->str, text->str_len);
            fprintf(stderr, "\n");
            print_ids("expected", exp, n_exp);
            print_ids("actual  ", got, n_got);
        }
        free(got);
        free(exp);
    }
    tdm_test_jsonl_free(cases, n);
    return fails;
}

Test(tokenizer, pycode_cases) {
    loaded L = load_path(tdm_test_model_path("pycode-target-f16.gguf"));
    size_t f = run_cases(L.t, tdm_test_data_path("tokenizer-cases.jsonl"), false, "text", "ids");
    cr_expect_eq(f, 0, "%zu pycode tokenizer cases differ", f);
    unload(&L);
}

Test(tokenizer, refs_prompt_ids) {
    loaded L = load_path(tdm_test_model_path("pycode-target-f16.gguf"));
    cr_assert(tdm_tok_add_bos(L.t));
    cr_assert_eq(tdm_tok_bos(L.t), 0);
    size_t f = run_cases(L.t, tdm_test_data_path("refs-dev.jsonl"), true, "prompt", "prompt_ids");
    cr_expect_eq(f, 0, "%zu refs-dev prompts differ", f);
    unload(&L);
}

static void vocab_case(const char *name) {
    char g[128], j[128];
    snprintf(g, sizeof g, "vocab/ggml-vocab-%s.gguf", name);
    snprintf(j, sizeof j, "vocab/%s.jsonl", name);
    loaded L = load_path(tdm_test_data_path(g));
    size_t f = run_cases(L.t, tdm_test_data_path(j), false, "text", "ids");
    cr_expect_eq(f, 0, "%zu %s cases differ", f, name);
    unload(&L);
}

Test(tokenizer, vocab_gpt2) { vocab_case("gpt-2"); }
Test(tokenizer, vocab_llama_spm) { vocab_case("llama-spm"); }
Test(tokenizer, vocab_phi3) { vocab_case("phi-3"); }
Test(tokenizer, vocab_starcoder) { vocab_case("starcoder"); }

/* Decodes ids with the streaming decoder, checking every chunk is whole UTF-8. */
static char *detok_all(const tdm_tokenizer *t, const int32_t *ids, size_t n, size_t *out_len,
                       size_t *n_held) {
    size_t cap = 64 + n * (size_t)(tdm_tok_max_piece(t) + 8), len = 0;
    char *s = malloc(cap + 1);
    tdm_detok d;
    tdm_detok_init(&d, t);
    *n_held = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t k = tdm_detok_push(&d, t, ids[i], s + len, (int32_t)(cap - len));
        cr_assert_geq(k, 0, "detok_push failed for id %d", ids[i]);
        if (d.n_pending) (*n_held)++;
        len += (size_t)k;
    }
    int32_t k = tdm_detok_flush(&d, s + len, (int32_t)(cap - len));
    cr_assert_geq(k, 0);
    len += (size_t)k;
    s[len] = 0;
    *out_len = len;
    return s;
}

static void round_trip_file(const char *model, const char *jsonl, const char *key) {
    loaded L = load_path(model);
    size_t n;
    tdm_json **cases = tdm_test_jsonl(jsonl, &n);
    for (size_t i = 0; i < n; i++) {
        const tdm_json *text = tdm_json_get(cases[i], key);
        int32_t *ids;
        size_t n_ids, len, held;
        tdm_err err = {0};
        /* parse_special off: special-token text stays text and must come back */
        cr_assert_eq(tdm_tokenize(L.t, text->str, text->str_len, false, false, &ids, &n_ids, &err), TANDEM_OK);
        char *s = detok_all(L.t, ids, n_ids, &len, &held);
        cr_expect(len == text->str_len && memcmp(s, text->str, len) == 0,
                  "%s:%zu: round trip differs:\n  in : %s\n  out: %s", jsonl, i + 1, text->str, s);
        free(s);
        free(ids);
    }
    tdm_test_jsonl_free(cases, n);
    unload(&L);
}

Test(tokenizer, round_trip_pycode) {
    round_trip_file(tdm_test_model_path("pycode-target-f16.gguf"), tdm_test_data_path("tokenizer-cases.jsonl"),
                    "text");
    round_trip_file(tdm_test_model_path("pycode-target-f16.gguf"), tdm_test_data_path("refs-dev.jsonl"),
                    "prompt");
}

Test(tokenizer, round_trip_gpt2) {
    round_trip_file(tdm_test_data_path("vocab/ggml-vocab-gpt-2.gguf"), tdm_test_data_path("vocab/gpt-2.jsonl"),
                    "text");
}

Test(tokenizer, round_trip_spm) {
    /* SPM: byte fallback makes every text representable; the decoder strips the
     * space the encoder put in front */
    round_trip_file(tdm_test_data_path("vocab/ggml-vocab-llama-spm.gguf"),
                    tdm_test_data_path("vocab/llama-spm.jsonl"), "text");
}

Test(tokenizer, special_tokens) {
    loaded L = load_path(tdm_test_model_path("pycode-target-f16.gguf"));
    const char *s = "a<|endoftext|>b";
    int32_t *ids;
    size_t n;
    cr_assert_eq(tdm_tokenize(L.t, s, strlen(s), false, true, &ids, &n, NULL), TANDEM_OK);
    cr_assert_eq(n, 3);
    cr_expect_eq(ids[1], 0);
    free(ids);
    /* without parse_special the text is tokenized as text */
    cr_assert_eq(tdm_tokenize(L.t, s, strlen(s), false, false, &ids, &n, NULL), TANDEM_OK);
    cr_expect_gt(n, 3);
    for (size_t i = 0; i < n; i++) cr_expect_neq(ids[i], 0);
    free(ids);
    cr_expect(tdm_tok_is_eog(L.t, 0));
    cr_expect(!tdm_tok_is_eog(L.t, 5));
    char buf[64];
    cr_expect_eq(tdm_token_to_piece(L.t, 0, false, buf, sizeof buf), 0);
    cr_expect_eq(tdm_token_to_piece(L.t, 0, true, buf, sizeof buf), 13);
    cr_expect(memcmp(buf, "<|endoftext|>", 13) == 0);
    cr_expect_eq(tdm_token_to_piece(L.t, 1 << 20, true, buf, sizeof buf), -1);
    cr_expect_eq(tdm_token_to_piece(L.t, -1, true, buf, sizeof buf), -1);
    unload(&L);
}

Test(tokenizer, streaming_multibyte) {
    const char *texts[] = {"emoji 🎉🚀 end", "日本語のテキスト", "𝕏𝕐 😶‍🌫️ ok", "Cửa Việt 🦙"};
    const char *models[] = {"pycode-target-f16.gguf", NULL, NULL};
    const char *vocabs[] = {NULL, "vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-llama-spm.gguf"};
    for (size_t m = 0; m < 3; m++) {
        loaded L = load_path(models[m] ? tdm_test_model_path(models[m]) : tdm_test_data_path(vocabs[m]));
        size_t total_held = 0;
        for (size_t i = 0; i < TDM_ARRAY_LEN(texts); i++) {
            int32_t *ids;
            size_t n, len, held;
            cr_assert_eq(tdm_tokenize(L.t, texts[i], strlen(texts[i]), false, false, &ids, &n, NULL), TANDEM_OK);
            /* push one token at a time: every chunk must be whole UTF-8 */
            tdm_detok d;
            tdm_detok_init(&d, L.t);
            char out[1024];
            size_t pos = 0;
            for (size_t k = 0; k < n; k++) {
                int32_t w = tdm_detok_push(&d, L.t, ids[k], out + pos, (int32_t)(sizeof out - pos));
                cr_assert_geq(w, 0);
                for (int32_t b = 0; b < w;) {
                    uint32_t cp;
                    int c = tdm_utf8_decode((const uint8_t *)out + pos + b, (size_t)(w - b), &cp);
                    cr_assert(!(cp & TDM_UTF8_INVALID), "half a character emitted for '%s'", texts[i]);
                    b += c;
                }
                pos += (size_t)w;
            }
            cr_expect_eq(tdm_detok_flush(&d, out + pos, 8), 0);
            cr_expect(pos == strlen(texts[i]) && memcmp(out, texts[i], pos) == 0, "stream decode of '%s'",
                      texts[i]);
            char *s = detok_all(L.t, ids, n, &len, &held);
            total_held += held;
            free(s);
            free(ids);
        }
        /* byte-level / byte-fallback vocabularies split these characters */
        cr_expect_gt(total_held, 0, "no multi-byte character was split across tokens");
        unload(&L);
    }
}

Test(tokenizer, streaming_invalid_is_emitted) {
    loaded L = load_path(tdm_test_data_path("vocab/ggml-vocab-gpt-2.gguf"));
    /* a lone lead byte followed by ASCII: emitted as-is once clearly invalid */
    const char s[] = "\xE2" "A\xF0\x9F";
    int32_t *ids;
    size_t n, len, held;
    cr_assert_eq(tdm_tokenize(L.t, s, 4, false, false, &ids, &n, NULL), TANDEM_OK);
    char *out = detok_all(L.t, ids, n, &len, &held);
    cr_expect(len == 4 && memcmp(out, s, 4) == 0);
    free(out);
    free(ids);
    unload(&L);
}

Test(tokenizer, invalid_utf8_bytewise) {
    const char *paths[] = {"pycode", "vocab/ggml-vocab-gpt-2.gguf", "vocab/ggml-vocab-starcoder.gguf",
                           "vocab/ggml-vocab-llama-spm.gguf", "vocab/ggml-vocab-phi-3.gguf"};
    uint64_t rng = 42;
    for (size_t m = 0; m < TDM_ARRAY_LEN(paths); m++) {
        loaded L = load_path(m == 0 ? tdm_test_model_path("pycode-target-f16.gguf") : tdm_test_data_path(paths[m]));
        /* bytes the vocabulary can represent (StarCoder lacks e.g. 0xC0, 0xF5..0xFF,
         * which never occur in UTF-8; those are dropped, as the reference does) */
        bool usable[256];
        for (int c = 0; c < 256; c++) {
            char one = (char)c;
            int32_t *ids;
            size_t n;
            cr_assert_eq(tdm_tokenize(L.t, &one, 1, false, false, &ids, &n, NULL), TANDEM_OK);
            usable[c] = n > 0;
            free(ids);
        }
        cr_expect(usable[0xE2] && usable[0x80] && usable[0xF0]);
        for (int iter = 0; iter < 200; iter++) {
            char buf[64];
            size_t len = tdm_test_rand(&rng) % sizeof buf;
            for (size_t i = 0; i < len; i++) {
                uint64_t r = tdm_test_rand(&rng);
                buf[i] = (char)((r & 3) == 0 ? ' ' : (r & 3) == 1 ? 'a' + (r >> 8) % 26 : (r >> 8));
                if (!usable[(uint8_t)buf[i]]) buf[i] = '#';
            }
            int32_t *ids;
            size_t n, out_len, held;
            cr_assert_eq(tdm_tokenize(L.t, buf, len, false, false, &ids, &n, NULL), TANDEM_OK);
            for (size_t i = 0; i < n; i++) cr_assert(ids[i] >= 0 && ids[i] < tdm_tok_n_vocab(L.t));
            char *s = detok_all(L.t, ids, n, &out_len, &held);
            /* byte-level BPE and byte fallback are lossless, even for invalid UTF-8 */
            cr_expect(out_len == len && memcmp(s, buf, len) == 0, "%s: bytes not preserved (iter %d)",
                      paths[m], iter);
            free(s);
            free(ids);
        }
        unload(&L);
    }
}

Test(tokenizer, speed_128_tokens) {
    loaded L = load_path(tdm_test_model_path("pycode-target-f16.gguf"));
    size_t n;
    tdm_json **cases = tdm_test_jsonl(tdm_test_data_path("refs-dev.jsonl"), &n);
    const tdm_json *p = tdm_json_get(cases[0], "prompt");
    int32_t *ids;
    size_t n_ids;
    cr_assert_eq(tdm_tokenize(L.t, p->str, p->str_len, true, true, &ids, &n_ids, NULL), TANDEM_OK);
    free(ids);
    int reps = 200;
    double t0 = tdm_now();
    for (int r = 0; r < reps; r++) {
        cr_assert_eq(tdm_tokenize(L.t, p->str, p->str_len, true, true, &ids, &n_ids, NULL), TANDEM_OK);
        free(ids);
    }
    double per = (tdm_now() - t0) / reps;
    double per128 = per * 128.0 / (double)n_ids;
    fprintf(stderr, "tokenize: %zu tokens in %.1f us (%.1f us per 128 tokens)\n", n_ids, per * 1e6, per128 * 1e6);
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
    cr_expect_lt(per128, 10e-3);
#else
    cr_expect_lt(per128, 1e-3, "128 tokens took %.3f ms", per128 * 1e3);
#endif
    tdm_test_jsonl_free(cases, n);
    unload(&L);
}

/* ------------------------------------------------- malformed vocabularies */

/* A tiny GGUF v3 writer for metadata-only files. */
typedef struct gbuf {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
} gbuf;

static void put(gbuf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(gbuf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(gbuf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(gbuf *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void kv_str(gbuf *b, const char *k, const char *v) {
    put_str(b, k);
    put_u32(b, TDM_GGUF_STRING);
    put_str(b, v);
    b->n_kv++;
}
static void kv_u32(gbuf *b, const char *k, uint32_t v) {
    put_str(b, k);
    put_u32(b, TDM_GGUF_UINT32);
    put_u32(b, v);
    b->n_kv++;
}
static void kv_strs(gbuf *b, const char *k, const char *const *v, size_t n) {
    put_str(b, k);
    put_u32(b, TDM_GGUF_ARRAY);
    put_u32(b, TDM_GGUF_STRING);
    put_u64(b, n);
    for (size_t i = 0; i < n; i++) put_str(b, v[i]);
    b->n_kv++;
}
static void kv_i32s(gbuf *b, const char *k, const int32_t *v, size_t n) {
    put_str(b, k);
    put_u32(b, TDM_GGUF_ARRAY);
    put_u32(b, TDM_GGUF_INT32);
    put_u64(b, n);
    put(b, v, n * 4);
    b->n_kv++;
}
/* Finishes: header in front. */
static tandem_status load_built(gbuf *b, tdm_gguf **g, tdm_tokenizer **t, tdm_err *err) {
    gbuf h = {0};
    put(&h, "GGUF", 4);
    put_u32(&h, 3);
    put_u64(&h, 0);
    put_u64(&h, b->n_kv);
    put(&h, b->p, b->n);
    free(b->p);
    *b = h;
    cr_assert_eq(tdm_gguf_open_memory(b->p, b->n, g, err), TANDEM_OK, "%s", err->msg);
    return tdm_tokenizer_load(*g, t, err);
}

static const char *const tiny_tokens[] = {"<|eos|>", "a", "b", "ab", "\xC4\xA0", "\xC4\xA0" "ab"};
static const int32_t tiny_types[] = {3, 1, 1, 1, 1, 1};
static const char *const tiny_merges[] = {"a b", "\xC4\xA0 ab"};

static void expect_load(gbuf *b, tandem_status want, const char *needle) {
    tdm_gguf *g = NULL;
    tdm_tokenizer *t = NULL;
    tdm_err err = {0};
    tandem_status st = load_built(b, &g, &t, &err);
    cr_expect_eq(st, want, "status %d (%s), want %d", st, err.msg, want);
    if (needle) cr_expect(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
    if (st == TANDEM_OK) {
        int32_t *ids;
        size_t n;
        cr_expect_eq(tdm_tokenize(t, "ab ab<|eos|>", 12, false, true, &ids, &n, NULL), TANDEM_OK);
        cr_expect_eq(n, 3);
        cr_expect(ids[0] == 3 && ids[1] == 5 && ids[2] == 0);
        free(ids);
    }
    tdm_tokenizer_free(t);
    tdm_gguf_close(g);
    free(b->p);
}

Test(tokenizer, tiny_valid) {
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 6);
    kv_i32s(&b, "tokenizer.ggml.token_type", tiny_types, 6);
    kv_strs(&b, "tokenizer.ggml.merges", tiny_merges, 2);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 0);
    expect_load(&b, TANDEM_OK, NULL);
}

Test(tokenizer, missing_tokens) {
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.merges", tiny_merges, 2);
    expect_load(&b, TANDEM_ERR_FORMAT, "tokenizer.ggml.tokens");
}

Test(tokenizer, mismatched_types) {
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 6);
    kv_i32s(&b, "tokenizer.ggml.token_type", tiny_types, 5);
    kv_strs(&b, "tokenizer.ggml.merges", tiny_merges, 2);
    expect_load(&b, TANDEM_ERR_FORMAT, "token_type");
}

Test(tokenizer, merge_unknown_token) {
    const char *const bad[] = {"a b", "x y"};
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 6);
    kv_strs(&b, "tokenizer.ggml.merges", bad, 2);
    expect_load(&b, TANDEM_ERR_FORMAT, "merge 1");
}

Test(tokenizer, merge_without_space) {
    const char *const bad[] = {"ab"};
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 6);
    kv_strs(&b, "tokenizer.ggml.merges", bad, 1);
    expect_load(&b, TANDEM_ERR_FORMAT, "merge 0");
}

Test(tokenizer, id_out_of_range) {
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 6);
    kv_strs(&b, "tokenizer.ggml.merges", tiny_merges, 2);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 6);
    expect_load(&b, TANDEM_ERR_FORMAT, "bos_token_id");
}

Test(tokenizer, missing_merges_and_bad_model) {
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "gpt2");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 6);
    expect_load(&b, TANDEM_ERR_FORMAT, "merges");
    gbuf c = {0};
    kv_str(&c, "tokenizer.ggml.model", "wordpiece");
    kv_strs(&c, "tokenizer.ggml.tokens", tiny_tokens, 6);
    expect_load(&c, TANDEM_ERR_UNSUPPORTED, "wordpiece");
    gbuf d = {0};
    kv_str(&d, "tokenizer.ggml.model", "gpt2");
    kv_str(&d, "tokenizer.ggml.pre", "klingon");
    kv_strs(&d, "tokenizer.ggml.tokens", tiny_tokens, 6);
    kv_strs(&d, "tokenizer.ggml.merges", tiny_merges, 2);
    expect_load(&d, TANDEM_ERR_UNSUPPORTED, "klingon");
}

Test(tokenizer, spm_scores_mismatch) {
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_strs(&b, "tokenizer.ggml.tokens", tiny_tokens, 6);
    put_str(&b, "tokenizer.ggml.scores");
    put_u32(&b, TDM_GGUF_ARRAY);
    put_u32(&b, TDM_GGUF_FLOAT32);
    put_u64(&b, 2);
    float sc[2] = {0, 0};
    put(&b, sc, 8);
    b.n_kv++;
    expect_load(&b, TANDEM_ERR_FORMAT, "scores");
}

/* End of generation: EOS and the tokens llama.cpp recognises by their text, less its
 * exception for <|end|> beside <|return|> and <|call|>. */
Test(tokenizer, eog_by_text) {
    static const char *const toks[] = {"<|endoftext|>", "a", "<|im_end|>", "<end_of_turn>", "<|end|>",
                                       "<|return|>", "<|call|>", "<|im_start|>"};
    static const int32_t types[] = {3, 1, 3, 3, 3, 3, 3, 3};
    for (int with_return = 0; with_return < 2; with_return++) {
        gbuf b = {0};
        kv_str(&b, "tokenizer.ggml.model", "gpt2");
        kv_strs(&b, "tokenizer.ggml.tokens", toks, with_return ? 8 : 5);
        kv_i32s(&b, "tokenizer.ggml.token_type", types, with_return ? 8 : 5);
        kv_strs(&b, "tokenizer.ggml.merges", NULL, 0);
        kv_u32(&b, "tokenizer.ggml.eos_token_id", 1); /* an odd EOS: still one */
        tdm_gguf *g = NULL;
        tdm_tokenizer *t = NULL;
        tdm_err err = {0};
        cr_assert_eq(load_built(&b, &g, &t, &err), TANDEM_OK, "%s", err.msg);
        cr_expect(tdm_tok_is_eog(t, 0) && tdm_tok_is_eog(t, 1) && tdm_tok_is_eog(t, 2) && tdm_tok_is_eog(t, 3));
        cr_expect_eq(tdm_tok_is_eog(t, 4), !with_return, "<|end|> with_return %d", with_return);
        if (with_return) cr_expect(tdm_tok_is_eog(t, 5) && tdm_tok_is_eog(t, 6) && !tdm_tok_is_eog(t, 7));
        cr_expect(!tdm_tok_is_eog(t, -1) && !tdm_tok_is_eog(t, 99));
        tdm_tokenizer_free(t);
        tdm_gguf_close(g);
        free(b.p);
    }
}

/* The FIM pad / repository / file separator tokens end a generation too (as in
 * llama.cpp): found by their texts, or named by tokenizer.ggml.fim_*_token_id; other
 * FIM tokens (prefix, suffix, middle) do not. */
Test(tokenizer, eog_fim_tokens) {
    static const char *const toks[] = {"<|endoftext|>", "a", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_pad|>",
                                       "<|repo_name|>", "<|file_sep|>", "b"};
    static const int32_t types[] = {3, 1, 3, 3, 3, 3, 3, 1};
    for (int by_key = 0; by_key < 2; by_key++) {
        gbuf b = {0};
        kv_str(&b, "tokenizer.ggml.model", "gpt2");
        kv_strs(&b, "tokenizer.ggml.tokens", toks, 8);
        kv_i32s(&b, "tokenizer.ggml.token_type", types, 8);
        kv_strs(&b, "tokenizer.ggml.merges", NULL, 0);
        if (by_key) kv_u32(&b, "tokenizer.ggml.fim_pad_token_id", 7); /* (an odd one: the key wins) */
        tdm_gguf *g = NULL;
        tdm_tokenizer *t = NULL;
        tdm_err err = {0};
        cr_assert_eq(load_built(&b, &g, &t, &err), TANDEM_OK, "%s", err.msg);
        cr_expect(tdm_tok_is_eog(t, 0), "<|endoftext|>");
        cr_expect(!tdm_tok_is_eog(t, 2) && !tdm_tok_is_eog(t, 3), "prefix and middle do not end a generation");
        cr_expect_eq(tdm_tok_is_eog(t, 4), !by_key, "<|fim_pad|> (by its text unless the key names another)");
        cr_expect_eq(tdm_tok_is_eog(t, 7), by_key, "the key's pad token");
        cr_expect(tdm_tok_is_eog(t, 5) && tdm_tok_is_eog(t, 6), "<|repo_name|>, <|file_sep|>");
        tdm_tokenizer_free(t);
        tdm_gguf_close(g);
        free(b.p);
    }
}
