/* quantize.h - converting a GGUF model's matrices to another type (`tandem
 * quantize`), with llama.cpp's tensor-type rules for its named mixes.
 *
 * Kinds (the --type argument): a plain type (f16, q8_0, q4_0, q4_1, q5_0, q5_1,
 * q2_k .. q6_k: every matrix that type, the output head q6_k unless the type is
 * q8_0 or f16, as llama.cpp does), or a mix: q4_k_m / q5_k_m (q4_k / q5_k matrices;
 * q6_k for the output head and for attn_v and ffn_down in the layers llama.cpp
 * gives more bits: the first and last eighth and every third between), q3_k_m
 * (q3_k; attn_v q5_k in the first two layers, else q4_k; attn_output q4_k; ffn_down
 * q5_k in the first sixteenth, else q4_k) and q2_k (q2_k; attn_v, attn_output and
 * ffn_down q3_k, attn_v q4_k with 4+ query heads per kv head).  Only 2-D tensors
 * named *.weight change; norms and biases stay as they are.  A matrix whose rows are
 * not whole blocks of its type falls back as llama.cpp's does: q4_k -> q5_0, q5_k
 * -> q5_1, q6_k -> q8_0, q2_k / q3_k -> q4_0, then f16 past a multiple of 32. */
#ifndef TDM_QUANTIZE_H
#define TDM_QUANTIZE_H

#include "common.h"
#include "gguf.h"

typedef struct tdm_quant_kind {
    const char *name;   /* as --type takes it */
    uint32_t base;      /* the matrices' type */
    uint32_t file_type; /* general.file_type (llama_ftype) */
    int mix;            /* 0: plain; otherwise which rules (quantize.c) */
} tdm_quant_kind;

/* The kind of a name ("q4_k_m", ...), NULL when unknown; the list of all names. */
const tdm_quant_kind *tdm_quant_kind_find(const char *name);
const char *tdm_quant_kind_names(void);

/* The type a tensor of the model gets: name, dims, its row length ne0, and the
 * model's shape (layers, whether it has an output.weight, query heads per kv head). */
typedef struct tdm_quant_model {
    int32_t n_layer, gqa;
    bool has_output;
} tdm_quant_model;
uint32_t tdm_quant_tensor_type(const tdm_quant_kind *k, const tdm_quant_model *m, const tdm_gguf_tensor *t);

/* Progress: tensor i of n (name, its new type) done, bytes written so far. */
typedef void (*tdm_quant_progress_fn)(void *ctx, uint64_t i, uint64_t n, const char *name, uint32_t type,
                                      uint64_t bytes);

/* Writes in's tensors converted per the kind to out ("out.tmp" first, renamed at the
 * end; an existing out is refused unless overwrite), the metadata copied with
 * general.file_type set.  Errors name the file or the tensor. */
tandem_status tdm_quantize_file(const char *in, const char *out, const tdm_quant_kind *k, bool overwrite,
                                tdm_quant_progress_fn progress, void *ctx, tdm_err *err);

#endif
