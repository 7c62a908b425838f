/* gguf_write.h - builds GGUF files in memory (v3, or v2 on request).
 *
 * Used by tests to make valid files (and, by mutating them, corrupt ones) and
 * random-weight models, and later by conversion/quantisation tools.
 */
#ifndef TDM_GGUF_WRITE_H
#define TDM_GGUF_WRITE_H

#include "common.h"
#include "gguf.h"

typedef struct tdm_gguf_writer tdm_gguf_writer;

tdm_gguf_writer *tdm_gguf_writer_new(uint32_t version /* 2 or 3 */, uint32_t alignment);
void tdm_gguf_writer_free(tdm_gguf_writer *w);

/* Metadata (appended in call order). Strings are copied. */
void tdm_gguf_w_u32(tdm_gguf_writer *w, const char *key, uint32_t v);
void tdm_gguf_w_i32(tdm_gguf_writer *w, const char *key, int32_t v);
void tdm_gguf_w_u64(tdm_gguf_writer *w, const char *key, uint64_t v);
void tdm_gguf_w_f32(tdm_gguf_writer *w, const char *key, float v);
void tdm_gguf_w_bool(tdm_gguf_writer *w, const char *key, bool v);
void tdm_gguf_w_str(tdm_gguf_writer *w, const char *key, const char *v);
void tdm_gguf_w_arr_str(tdm_gguf_writer *w, const char *key, const char *const *v, uint64_t n);
void tdm_gguf_w_arr_f32(tdm_gguf_writer *w, const char *key, const float *v, uint64_t n);
void tdm_gguf_w_arr_i32(tdm_gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* A raw value: type and the exact little-endian payload bytes that follow the type
 * field (for arrays: elem type, count, elements).  For tests of odd values. */
void tdm_gguf_w_raw(tdm_gguf_writer *w, const char *key, uint32_t type, const void *payload, size_t n);

/* Tensors: data is copied; ne[0] is the fastest dimension. */
void tdm_gguf_w_tensor(tdm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const int64_t *ne, const void *data, size_t nbytes);

/* Serialises the file. *out is malloc'ed. Returns TANDEM_ERR_NOMEM if any earlier
 * call failed to allocate. */
tandem_status tdm_gguf_writer_finish(tdm_gguf_writer *w, uint8_t **out, size_t *out_len);

#endif
