/* dtype.h - tensor element types (numbering from GGML/GGUF) and their block layouts.
 *
 * Block formats, as GGUF defines them:
 *   F32   1 element,  4 bytes
 *   F16   1 element,  2 bytes (IEEE half)
 *   BF16  1 element,  2 bytes (upper half of an f32)
 *   Q8_0  32 elements, 34 bytes: { f16 d; int8 qs[32]; }            x[i] = d * qs[i]
 *   Q4_0  32 elements, 18 bytes: { f16 d; uint8 qs[16]; }           x[j]    = d * ((qs[j] & 15) - 8),
 *                                                                   x[j+16] = d * ((qs[j] >> 4) - 8)
 */
#ifndef TDM_DTYPE_H
#define TDM_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum tdm_dtype {
    TDM_F32 = 0,
    TDM_F16 = 1,
    TDM_Q4_0 = 2,
    TDM_Q8_0 = 8,
    TDM_BF16 = 30,
} tdm_dtype;

#define TDM_QK 32 /* elements per Q8_0 / Q4_0 block */

typedef struct tdm_block_q8_0 {
    uint16_t d;           /* f16 scale */
    int8_t qs[TDM_QK];
} tdm_block_q8_0;

typedef struct tdm_block_q4_0 {
    uint16_t d;           /* f16 scale */
    uint8_t qs[TDM_QK / 2];
} tdm_block_q4_0;

/* True for the types tandem supports. */
bool tdm_dtype_supported(uint32_t type);
const char *tdm_dtype_name(uint32_t type);   /* "f32", "q8_0", ... or "unknown" */
uint32_t tdm_dtype_block_elems(uint32_t type); /* elements per block (0 if unsupported) */
uint32_t tdm_dtype_block_bytes(uint32_t type); /* bytes per block (0 if unsupported) */
/* Bytes of a row of n elements; returns false if n is not a multiple of the block
 * size or the type is unsupported. */
bool tdm_dtype_row_bytes(uint32_t type, uint64_t n, uint64_t *out);

/* Scalar conversions (exact IEEE round-to-nearest-even for f32 -> f16/bf16). */
float tdm_f16_to_f32(uint16_t h);
uint16_t tdm_f32_to_f16(float f);
static inline float tdm_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
uint16_t tdm_f32_to_bf16(float f);

/* Dequantise / convert one row of n elements (n a multiple of the block size). */
void tdm_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n);
/* Quantise / convert one row from f32 (reference implementation, used by tests and
 * by future quantisation tools). */
void tdm_row_from_f32(uint32_t type, const float *src, void *dst, int64_t n);

/* Memory layouts of a weight matrix W[rows][cols] (tdm_weight.layout). */
typedef enum tdm_layout {
    /* rows contiguous: element (r, c) of row r at r * row_bytes */
    TDM_LAYOUT_ROWS = 0,
    /* blocks of 64 rows, column by column: [rows / 64][cols][64] elements, so element
     * (r, c) is at index ((r / 64) * cols + c) * 64 + r % 64.  For element types
     * (f32, f16, bf16) and rows a multiple of 64: a matmul reads one sequential
     * stream per block and gets 16 outputs per vector without horizontal sums. */
    TDM_LAYOUT_P64 = 1,
    /* quantised rows split: each row (row_bytes apart, as in the rows layout) holds
     * the quants of all its blocks first (32 int8 per Q8_0 block, 16 bytes of
     * nibbles per Q4_0 block, in the block format's own order), then the blocks'
     * f16 scales.  For Q8_0 and Q4_0: 16-byte loads of quants whatever the block
     * size, and a row view is still a row range (the GPU's matmul reads it). */
    TDM_LAYOUT_QSPLIT = 2,
} tdm_layout;
#define TDM_LAYOUT_P64_ROWS 64

/* True when a weight of this type and shape can have the layout. */
bool tdm_layout_fits(uint32_t layout, uint32_t type, int64_t rows, int64_t cols);
/* dst = the rows-layout matrix src[rows][row_bytes] rearranged into layout (same
 * byte count); false (dst untouched) when the layout does not fit. */
bool tdm_weight_pack(uint32_t layout, uint32_t type, int64_t rows, int64_t cols, const void *src,
                     void *dst);
/* Element (r, c) of a weight in any layout, as f32 (reference access for tests and
 * slow paths); NaN for an unsupported type or layout. */
float tdm_weight_elem(uint32_t type, uint32_t layout, int64_t cols, size_t row_bytes, const void *data,
                      int64_t r, int64_t c);

#endif
