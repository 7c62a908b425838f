/* fuzz_tokenizer.c - libFuzzer harness for the tokenizers (not built by default).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Iinclude -Isrc \
 *       tests/fuzz/fuzz_tokenizer.c src/tokenizer/tokenizer.c src/tokenizer/tok_bpe.c src/tokenizer/tok_spm.c \
 *       src/tokenizer/tok_pretok.c src/tokenizer/tok_pretok_rules.c src/tokenizer/tok_pretok_names.c src/base/unicode.c src/base/unicode_data.c \
 *       src/gguf/gguf.c src/gguf/ggml_types.c src/base/json.c src/base/dtype.c \
 *       src/base/common.c -lm -o fuzz_tokenizer
 *   TDM_REPO=/path/to/repo ./fuzz_tokenizer -max_len=4096 -timeout=10 corpus_tok/
 *
 * The vocabularies are loaded once (paths relative to $TDM_REPO, else to the current
 * directory); the first input byte picks one (mod 3):
 *   0: models/pycode-target-f16.gguf                   byte-level BPE, gpt-2 pre-tokenizer
 *   1: tests/data/vocab/ggml-vocab-llama-spm.gguf      SentencePiece
 *   2: tests/data/vocab/ggml-vocab-starcoder.gguf      byte-level BPE, starcoder pre-tokenizer
 * The rest of the input (any bytes: invalid UTF-8, NUL) is tokenized with and
 * without BOS and parse_special, then decoded with the streaming decoder.
 * Checks (abort() on a violation, so the fuzzer reports it):
 *   - tokenizing never fails; every id is in range; add_bos prepends exactly BOS;
 *   - the streaming decoder never rejects an id with cap = max_piece + 8 and its
 *     output equals the concatenated pieces (tdm_token_to_piece), with the first
 *     leading space dropped for SentencePiece with add_space_prefix;
 *   - byte-level BPE: decode(encode(text)) == text when text is valid UTF-8, holds
 *     no special-token text and every byte of it has a byte token (the starcoder
 *     vocabulary has none for C0, C1, F1, F5..FF: such bytes are silently dropped,
 *     so e.g. U+40000..U+7FFFF, valid UTF-8 with lead byte F1, do not round-trip).
 * Optional stricter checks (to investigate, not contract):
 *   TDM_FUZZ_BYTES_ROUNDTRIP=1  byte-level BPE round trip for invalid UTF-8 too;
 *   TDM_FUZZ_SPM_ROUNDTRIP=1    round trip for SentencePiece (valid UTF-8, no special
 *                               text, no U+2581, which decodes to ' ' by design). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "tok_internal.h" /* token types, the special-token list, add_space_prefix */
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_VOCABS 3
static const char *const vocab_paths[N_VOCABS] = {
    "models/pycode-target-f16.gguf",
    "tests/data/vocab/ggml-vocab-llama-spm.gguf",
    "tests/data/vocab/ggml-vocab-starcoder.gguf",
};
static tdm_tokenizer *vocabs[N_VOCABS];
static bool check_bytes_roundtrip, check_spm_roundtrip;

static void fail(const char *what, const tdm_tokenizer *t, const uint8_t *text, size_t len) {
    fprintf(stderr, "fuzz_tokenizer: %s (model %s, %zu bytes of text:", what,
            t->model == TOK_MODEL_SPM ? "spm" : "bpe", len);
    for (size_t i = 0; i < len && i < 256; i++) fprintf(stderr, " %02x", text[i]);
    fprintf(stderr, ")\n");
    abort();
}

static tdm_tokenizer *load_vocab(const char *rel) {
    const char *repo = getenv("TDM_REPO");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", repo && repo[0] ? repo : ".", rel);
    tdm_gguf *g = NULL;
    tdm_tokenizer *t = NULL;
    tdm_err err = {0};
    if (tdm_gguf_open(path, &g, &err) != TANDEM_OK || tdm_tokenizer_load(g, &t, &err) != TANDEM_OK) {
        fprintf(stderr, "fuzz_tokenizer: cannot load %s: %s (set TDM_REPO to the repository root)\n",
                path, err.msg);
        exit(1);
    }
    tdm_gguf_close(g); /* the tokenizer owns copies of everything it needs */
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < N_VOCABS; i++) vocabs[i] = load_vocab(vocab_paths[i]);
    const char *e = getenv("TDM_FUZZ_BYTES_ROUNDTRIP");
    check_bytes_roundtrip = e && e[0] == '1';
    e = getenv("TDM_FUZZ_SPM_ROUNDTRIP");
    check_spm_roundtrip = e && e[0] == '1';
    return 0;
}

/* Strict UTF-8 (no overlong forms, surrogates or code points above U+10FFFF). */
static bool valid_utf8(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        size_t k;
        uint32_t cp, min;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { k = 2; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { k = 3; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { k = 4; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (i + k > n) return false;
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + j] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += k;
    }
    return true;
}

/* True if text holds the text of any special (control / user-defined / unknown) token. */
static bool has_special_text(const tdm_tokenizer *t, const uint8_t *text, size_t len) {
    for (int32_t i = 0; i < t->n_specials; i++) {
        size_t sl;
        const char *s = tdm_tok_text(t, t->specials[i], &sl);
        if (s && sl && memmem(text, len, s, sl)) return true;
    }
    return false;
}

/* A growable byte buffer. */
typedef struct bytes {
    char *p;
    size_t n, cap;
} bytes;

static void bytes_add(bytes *b, const char *s, size_t n) {
    if (b->n + n > b->cap) {
        size_t nc = (b->n + n) * 2 + 64;
        char *np = realloc(b->p, nc);
        if (!np) abort();
        b->p = np;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
}

/* Decodes ids[0..n) with the streaming decoder into *out and the plain pieces
 * (SPM: leading space of the first non-empty piece dropped) into *ref. */
static void decode(const tdm_tokenizer *t, const int32_t *ids, size_t n, bytes *out, bytes *ref,
                   const uint8_t *text, size_t len) {
    int32_t cap = tdm_tok_max_piece(t) + 8;
    char *chunk = malloc((size_t)cap);
    char *piece = malloc((size_t)cap);
    if (!chunk || !piece) abort();
    tdm_detok d;
    tdm_detok_init(&d, t);
    bool strip = t->model == TOK_MODEL_SPM && t->add_space_prefix;
    for (size_t i = 0; i < n; i++) {
        int32_t k = tdm_detok_push(&d, t, ids[i], chunk, cap);
        if (k < 0 || k > cap) fail("tdm_detok_push rejected a valid id", t, text, len);
        bytes_add(out, chunk, (size_t)k);
        int32_t pl = tdm_token_to_piece(t, ids[i], false, piece, cap);
        if (pl < 0 || pl > tdm_tok_max_piece(t)) fail("tdm_token_to_piece length out of range", t, text, len);
        int32_t rl = tdm_token_to_piece(t, ids[i], true, NULL, 0);
        if (rl < 0 || rl > tdm_tok_max_piece(t)) fail("render_special piece longer than max_piece", t, text, len);
        const char *p = piece;
        if (strip && pl > 0) {
            if (p[0] == ' ') {
                p++;
                pl--;
            }
            strip = false;
        }
        bytes_add(ref, p, (size_t)pl);
    }
    int32_t k = tdm_detok_flush(&d, chunk, 8);
    if (k < 0 || k > 8) fail("tdm_detok_flush failed", t, text, len);
    bytes_add(out, chunk, (size_t)k);
    if (d.n_pending != 0) fail("tdm_detok_flush left bytes pending", t, text, len);
    free(chunk);
    free(piece);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const tdm_tokenizer *t = vocabs[data[0] % N_VOCABS];
    size_t len = size - 1;
    /* a private copy so ASan catches reads past the end of the text */
    uint8_t *text = malloc(len ? len : 1);
    if (!text) return 0;
    if (len) memcpy(text, data + 1, len);

    bool bpe = t->model == TOK_MODEL_BPE;
    bool utf8 = valid_utf8(text, len);
    bool special = has_special_text(t, text, len);
    bool all_bytes = true; /* every byte of the text has a byte token */
    for (size_t i = 0; i < len && bpe; i++)
        if (t->byte_tok[text[i]] < 0) all_bytes = false;
    /* (add_special prepends BOS only where the vocabulary asks for it: add_bos_token) */
    int32_t n_vocab = tdm_tok_n_vocab(t), bos = tdm_tok_add_bos(t) ? tdm_tok_bos(t) : -1;

    int32_t *plain[2] = {NULL, NULL}; /* [parse_special] ids without BOS */
    size_t n_plain[2] = {0, 0};
    for (int combo = 0; combo < 4; combo++) {
        bool parse_special = combo & 1, add_bos = combo & 2;
        int32_t *ids = NULL;
        size_t n = 0;
        tdm_err err = {0};
        if (tdm_tokenize(t, (const char *)text, len, add_bos, parse_special, &ids, &n, &err) != TANDEM_OK) {
            if (err.msg[0] == 0) fail("tokenize failed without a message", t, text, len);
            fail(err.msg, t, text, len); /* only out-of-memory may fail: not expected here */
        }
        if (n && !ids) fail("ids NULL with n > 0", t, text, len);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= n_vocab) fail("id out of range", t, text, len);
        if (!add_bos) {
            /* (a byte with no token is dropped) */
            if (len && !n && all_bytes) fail("non-empty text gave no tokens", t, text, len);
            plain[parse_special] = ids;
            n_plain[parse_special] = n;
        } else {
            /* BOS prepended exactly once, the rest identical to the plain encoding */
            size_t skip = bos >= 0 ? 1 : 0;
            if (bos >= 0 && (n == 0 || ids[0] != bos)) fail("add_bos did not prepend BOS", t, text, len);
            if (n != n_plain[parse_special] + skip ||
                (n_plain[parse_special] &&
                 memcmp(ids + skip, plain[parse_special], n_plain[parse_special] * sizeof *ids) != 0))
                fail("add_bos changed the rest of the encoding", t, text, len);
        }

        bytes out = {0}, ref = {0};
        decode(t, ids, n, &out, &ref, text, len);
        if (out.n != ref.n || (out.n && memcmp(out.p, ref.p, out.n) != 0))
            fail("streaming decode differs from the concatenated pieces", t, text, len);
        if (!add_bos && !special) {
            bool check = bpe ? (utf8 || check_bytes_roundtrip) && all_bytes
                             : (check_spm_roundtrip && utf8 && !memmem(text, len, "\xE2\x96\x81", 3));
            if (check && (out.n != len || (len && memcmp(out.p, text, len) != 0)))
                fail("decode(encode(text)) != text", t, text, len);
        }
        free(out.p);
        free(ref.p);
        if (add_bos) free(ids);
    }
    free(plain[0]);
    free(plain[1]);
    free(text);
    return 0;
}
