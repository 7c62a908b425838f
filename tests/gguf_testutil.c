/* gguf_testutil.c - helpers shared by the GGUF tests; see gguf_testutil.h. */
#include "gguf_testutil.h"

#include <criterion/criterion.h>
#include <string.h>

#include "gguf.h"

/* ------------------------------------------------------------ byte builders */

void b_put(bytes *b, const void *src, size_t n) {
    cr_assert(b->n + n <= sizeof b->p);
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
void b_u32(bytes *b, uint32_t v) {
    uint8_t t[4];
    for (int i = 0; i < 4; i++) t[i] = (uint8_t)(v >> (8 * i));
    b_put(b, t, 4);
}
void b_u64(bytes *b, uint64_t v) {
    uint8_t t[8];
    for (int i = 0; i < 8; i++) t[i] = (uint8_t)(v >> (8 * i));
    b_put(b, t, 8);
}
void b_arr(bytes *b, uint32_t elem_type, uint64_t n) {
    b_u32(b, elem_type);
    b_u64(b, n);
}
void b_str(bytes *b, const char *s, size_t n) {
    b_u64(b, n);
    b_put(b, s, n);
}

void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ------------------------------------------------------------ offsets in a file */

/* Offset of the length field of the GGUF string `s` (u64 length + bytes) in buf. */
size_t str_off(const uint8_t *buf, size_t len, const char *s) {
    size_t n = strlen(s);
    uint8_t pat[256];
    cr_assert(n + 8 <= sizeof pat);
    put_u64(pat, n);
    memcpy(pat + 8, s, n);
    const uint8_t *hit = memmem(buf, len, pat, n + 8);
    cr_assert(hit, "string '%s' not found in the file", s);
    return (size_t)(hit - buf);
}
/* Offset of the value of metadata key `key` (after its u32 type). */
size_t val_off(const uint8_t *buf, size_t len, const char *key) {
    return str_off(buf, len, key) + 8 + strlen(key) + 4;
}
/* Offset of the n_dims field of tensor `name`'s info. */
size_t tinfo_off(const uint8_t *buf, size_t len, const char *name) {
    return str_off(buf, len, name) + 8 + strlen(name);
}

/* ------------------------------------------------------------ writer output */

file finish(tdm_gguf_writer *w) {
    file f = {0};
    cr_assert_eq(tdm_gguf_writer_finish(w, &f.p, &f.n), TANDEM_OK);
    tdm_gguf_writer_free(w);
    return f;
}

uint8_t zeros[4096];

/* ------------------------------------------------------------ base file (see the header) */

void base_meta(tdm_gguf_writer *w) {
    static const char *toks[] = {"a", "bc", "def"};
    static const float sc[] = {1, 2, 3};
    tdm_gguf_w_str(w, "general.architecture", "llama");
    tdm_gguf_w_str(w, "general.name", "tiny");
    tdm_gguf_w_u32(w, "llama.block_count", 8);
    tdm_gguf_w_u32(w, "general.alignment", 32);
    tdm_gguf_w_bool(w, "flag", true);
    tdm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    tdm_gguf_w_arr_f32(w, "scores", sc, 3);
}
void base_tensors(tdm_gguf_writer *w) {
    tdm_gguf_w_tensor(w, "a", TDM_F32, 2, (int64_t[]){4, 2}, zeros, 32);
    tdm_gguf_w_tensor(w, "b", TDM_Q8_0, 2, (int64_t[]){64, 2}, zeros, 136);
    tdm_gguf_w_tensor(w, "c", TDM_F16, 1, (int64_t[]){32}, zeros, 64);
}
file base_file(void) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    base_meta(w);
    base_tensors(w);
    return finish(w);
}
