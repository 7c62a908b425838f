/* gguf_testutil.h - helpers shared by the GGUF tests (test_gguf.c, test_gguf_corrupt.c):
 * little-endian byte builders for hand-made metadata payloads, offsets of strings, values
 * and tensor infos inside a serialized file, and the valid base file that the corrupt
 * corpus starts from.  Helpers fail the running Criterion test on error. */
#ifndef TDM_GGUF_TESTUTIL_H
#define TDM_GGUF_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf_write.h"

/* A growable byte buffer for hand-made metadata payloads. */
typedef struct bytes {
    uint8_t p[4096];
    size_t n;
} bytes;

void b_put(bytes *b, const void *src, size_t n);
void b_u32(bytes *b, uint32_t v);
void b_u64(bytes *b, uint64_t v);
void b_arr(bytes *b, uint32_t elem_type, uint64_t n); /* an array header: element type and count */
void b_str(bytes *b, const char *s, size_t n);        /* u64 length + bytes */

/* Little-endian stores and loads at p. */
void put_u32(uint8_t *p, uint32_t v);
void put_u64(uint8_t *p, uint64_t v);
uint64_t get_u64(const uint8_t *p);

/* Offset of the length field of the GGUF string `s` (u64 length + bytes) in buf. */
size_t str_off(const uint8_t *buf, size_t len, const char *s);
/* Offset of the value of metadata key `key` (after its u32 type). */
size_t val_off(const uint8_t *buf, size_t len, const char *key);
/* Offset of the n_dims field of tensor `name`'s info. */
size_t tinfo_off(const uint8_t *buf, size_t len, const char *name);

/* A serialized GGUF file (malloc'd; free p). */
typedef struct file {
    uint8_t *p;
    size_t n;
} file;

/* Finishes and frees the writer, returning its bytes. */
file finish(tdm_gguf_writer *w);

extern uint8_t zeros[4096];

/* The valid file every corruption starts from:
 *   kv: general.architecture="llama", general.name="tiny", llama.block_count=8 (u32),
 *       general.alignment=32 (u32), flag=true, tokenizer.ggml.tokens=["a","bc","def"],
 *       scores=[1,2,3] (f32)
 *   tensors: "a" f32 [4,2] (32 B), "b" q8_0 [64,2] (136 B), "c" f16 [32] (64 B) */
void base_meta(tdm_gguf_writer *w);
void base_tensors(tdm_gguf_writer *w);
file base_file(void);

#endif
