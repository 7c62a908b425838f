/* gguf_write.h - builds GGUF files (v3, or v2 on request), in memory or streamed
 * to a FILE.
 *
 * In memory: used by tests to make valid files (and, by mutating them, corrupt
 * ones) and small random-weight models.  Streamed: metadata and tensor infos are
 * registered first, then the tensors' data is written in order by the caller, so a
 * file of many gigabytes never sits in memory (tandem synth).  Both produce the same
 * bytes for the same metadata, tensors and data.
 */
#ifndef TDM_GGUF_WRITE_H
#define TDM_GGUF_WRITE_H

#include "common.h"
#include "gguf.h"

#include <stdio.h>

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
/* A copy of a parsed value (any type, nested arrays included), e.g. to carry keys
 * over from another file. */
void tdm_gguf_w_value(tdm_gguf_writer *w, const char *key, const tdm_gguf_value *v);
/* A raw value: type and the exact little-endian payload bytes that follow the type
 * field (for arrays: elem type, count, elements).  For tests of odd values. */
void tdm_gguf_w_raw(tdm_gguf_writer *w, const char *key, uint32_t type, const void *payload, size_t n);

/* Tensors: data is copied; ne[0] is the fastest dimension. */
void tdm_gguf_w_tensor(tdm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const int64_t *ne, const void *data, size_t nbytes);

/* A tensor whose nbytes of data are streamed later (tdm_gguf_stream_*); ne[0] is
 * the fastest dimension.  A writer holding such a tensor cannot finish() in memory. */
void tdm_gguf_w_tensor_info(tdm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                            const int64_t *ne, uint64_t nbytes);

/* The layout the writer would produce: bytes before the first tensor's data (header,
 * metadata, tensor infos, padding) and the whole file.  Adds general.alignment when
 * needed, like finish(). */
tandem_status tdm_gguf_writer_sizes(tdm_gguf_writer *w, uint64_t *head_bytes, uint64_t *file_bytes);

/* Serialises the file. *out is malloc'ed. Returns TANDEM_ERR_NOMEM if any earlier
 * call failed to allocate. */
tandem_status tdm_gguf_writer_finish(tdm_gguf_writer *w, uint8_t **out, size_t *out_len);

/* Streaming.  begin() writes everything before the data to f (opened for writing
 * by the caller, who also closes it; name is used in messages).  Then write() takes
 * the tensors' data in file order, in pieces of any size, and puts the alignment
 * padding between tensors itself.  end() checks that every tensor got all its bytes
 * and flushes f.  After begin() no metadata or tensor can be added.  Errors:
 * TANDEM_ERR_IO naming the file and the OS error, TANDEM_ERR_INVALID_ARG for more
 * or fewer bytes than the tensors declared, TANDEM_ERR_NOMEM as for finish(). */
tandem_status tdm_gguf_stream_begin(tdm_gguf_writer *w, FILE *f, const char *name, tdm_err *err);
tandem_status tdm_gguf_stream_write(tdm_gguf_writer *w, const void *data, size_t n, tdm_err *err);
tandem_status tdm_gguf_stream_end(tdm_gguf_writer *w, tdm_err *err);

#endif
