/* ggml_types.h - every tensor type number a GGUF file may carry (GGML's numbering):
 * its name and block geometry, whether or not tandem computes with it.
 *
 * dtype.h is the authority on the types tandem supports (their layouts and
 * conversions); this table only describes the others, so that a file holding them
 * can still be opened, sized and listed (`tandem info`, `tandem tokenize`). */
#ifndef TDM_GGML_TYPES_H
#define TDM_GGML_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* GGML's name of a type ("q4_1", "iq2_xs", ...), or NULL for a number GGML does not
 * define (or no longer defines: 4, 5, 31-33, 36-38). */
const char *tdm_ggml_type_name(uint32_t type);

/* Elements and bytes per block of a type; false when the number is not a type this
 * table knows the size of (then the data size of such a tensor is unknown). */
bool tdm_ggml_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes);

/* "3 (q4_1)", or "99 (not a GGML type)", into buf; returns buf. */
const char *tdm_ggml_type_describe(uint32_t type, char *buf, size_t cap);

/* The names of the types tandem supports (tdm_dtype_supported), comma-separated,
 * into buf ("f32, f16, q4_0, ..."); returns buf. */
const char *tdm_ggml_supported_list(char *buf, size_t cap);

/* llama.cpp's name of a general.file_type value (llama_ftype: 15 -> "Q4_K - Medium",
 * the names its loader prints), with " (guessed)" for the guessed flag (1024) into
 * buf; NULL for a number llama.cpp does not define. */
const char *tdm_ggml_file_type_name(uint32_t file_type, char *buf, size_t cap);

#endif
