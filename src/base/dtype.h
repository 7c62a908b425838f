/* dtype.h - tensor element types (numbering from GGML/GGUF) and their block layouts.
 *
 * Block formats, as GGUF defines them:
 *   F32   1 element,  4 bytes
 *   F16   1 element,  2 bytes (IEEE half)
 *   BF16  1 element,  2 bytes (upper half of an f32)
 *   Q8_0  32 elements, 34 bytes: { f16 d; int8 qs[32]; }            x[i] = d * qs[i]
 *   Q4_0  32 elements, 18 bytes: { f16 d; uint8 qs[16]; }           x[j]    = d * ((qs[j] & 15) - 8),
 *                                                                   x[j+16] = d * ((qs[j] >> 4) - 8)
 *   Q4_1  32 elements, 20 bytes: { f16 d, m; uint8 qs[16]; }        x[j] = q[j] * d + m (q: Q4_0's nibbles)
 *   Q5_0  32 elements, 22 bytes: { f16 d; uint8 qh[4]; qs[16]; }    x[j] = (q[j] - 16) * d, q[j] = nibble |
 *                                                                   bit j of qh (little-endian u32) << 4
 *   Q5_1  32 elements, 24 bytes: { f16 d, m; uint8 qh[4]; qs[16]; } x[j] = q[j] * d + m
 * K-quants: super-blocks of TDM_QK_K = 256 elements in sub-blocks of 16 or 32, each
 * with a small integer scale (and min) under the super-block's f16 scale(s); the
 * exact bit layouts are in dtype_kquant.c:
 *   Q2_K  84 bytes  (2.625 bits/weight)  16 x 16, 4-bit scale and min, 2-bit quants
 *   Q3_K  110 bytes (3.4375)             16 x 16, 6-bit signed scales, 3-bit quants
 *   Q4_K  144 bytes (4.5)                8 x 32, 6-bit scale and min, 4-bit quants
 *   Q5_K  176 bytes (5.5)                8 x 32, 6-bit scale and min, 5-bit quants
 *   Q6_K  210 bytes (6.5625)             16 x 16, int8 scales, 6-bit quants
 * Every dequantised value is computed in f32 in the order the definitions give
 * (no fused multiply-add): e.g. Q4_K x = (d * sc) * q - (dmin * m).
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
    TDM_Q4_1 = 3,
    TDM_Q5_0 = 6,
    TDM_Q5_1 = 7,
    TDM_Q8_0 = 8,
    TDM_Q2_K = 10,
    TDM_Q3_K = 11,
    TDM_Q4_K = 12,
    TDM_Q5_K = 13,
    TDM_Q6_K = 14,
    TDM_BF16 = 30,
    /* FP8 E4M3 (OCP: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities,
     * 0x7f / 0xff NaN, largest 448) with a scale per row: element (r, c) is
     * tdm_e4m3_to_f32(byte) * tdm_weight.scale[r].  Never in a file (tdm_dtype_supported
     * is false for it): the model loader makes such weights from F16 / BF16 / F32 /
     * Q8_0 ones when asked for FP8 weights (tandem_model_params.weights).  One byte
     * per element; tdm_row_to_f32 gives the unscaled values. */
    TDM_F8_E4M3 = 100,
} tdm_dtype;

#define TDM_E4M3_MAX 448.0f /* the largest finite E4M3 value */

#define TDM_QK 32    /* elements per Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 block */
#define TDM_QK_K 256 /* elements per K-quant super-block */

typedef struct tdm_block_q8_0 {
    uint16_t d;           /* f16 scale */
    int8_t qs[TDM_QK];
} tdm_block_q8_0;

typedef struct tdm_block_q4_0 {
    uint16_t d;           /* f16 scale */
    uint8_t qs[TDM_QK / 2];
} tdm_block_q4_0;

typedef struct tdm_block_q4_1 {
    uint16_t d, m;          /* f16 scale, f16 offset */
    uint8_t qs[TDM_QK / 2]; /* [16] element j in the low nibble of byte j, j + 16 in the high */
} tdm_block_q4_1;

typedef struct tdm_block_q5_0 {
    uint16_t d;             /* f16 scale */
    uint8_t qh[4];          /* bit j (little-endian u32): the 5th bit of element j */
    uint8_t qs[TDM_QK / 2]; /* [16] low 4 bits, as Q4_0 */
} tdm_block_q5_0;

typedef struct tdm_block_q5_1 {
    uint16_t d, m;          /* f16 scale, f16 offset */
    uint8_t qh[4];          /* [4] as Q5_0 */
    uint8_t qs[TDM_QK / 2]; /* [16] as Q5_0 */
} tdm_block_q5_1;

typedef struct tdm_block_q2_K {
    uint8_t scales[16];     /* [16] per 16 elements: scale (low nibble), min (high nibble) */
    uint8_t qs[64];         /* [64] 2-bit quants: element 128 h + 32 s + l at bits 2 s of qs[32 h + l] */
    uint16_t d, dmin;       /* f16 super-block scale of the scales, of the mins */
} tdm_block_q2_K;

typedef struct tdm_block_q3_K {
    uint8_t hmask[32];      /* [32] bit k of hmask[l]: the high bit of element 32 k + l */
    uint8_t qs[64];         /* [64] low 2 bits, laid out as Q2_K's */
    uint8_t scales[12];     /* [12] 16 6-bit scales (biased by 32), packed (dtype_kquant.c) */
    uint16_t d;             /* f16 super-block scale */
} tdm_block_q3_K;

typedef struct tdm_block_q4_K {
    uint16_t d, dmin;       /* f16 super-block scale of the scales, of the mins */
    uint8_t scales[12];     /* [12] 8 6-bit scales and 8 6-bit mins, packed (dtype_kquant.c) */
    uint8_t qs[TDM_QK_K / 2]; /* [128] element 64 p + l in the low nibble of qs[32 p + l], 64 p + 32 + l high */
} tdm_block_q4_K;

typedef struct tdm_block_q5_K {
    uint16_t d, dmin;       /* as Q4_K */
    uint8_t scales[12];     /* [12] as Q4_K */
    uint8_t qh[TDM_QK_K / 8]; /* [32] bit k of qh[l]: the 5th bit of element 32 k + l */
    uint8_t qs[TDM_QK_K / 2]; /* [128] low 4 bits, as Q4_K */
} tdm_block_q5_K;

typedef struct tdm_block_q6_K {
    uint8_t ql[TDM_QK_K / 2]; /* [128] low 4 bits (dtype_kquant.c) */
    uint8_t qh[TDM_QK_K / 4]; /* [64] high 2 bits */
    int8_t scales[16];        /* [16] per 16 elements */
    uint16_t d;               /* f16 super-block scale */
} tdm_block_q6_K;

/* True for the K-quant types (super-blocks of TDM_QK_K). */
static inline bool tdm_dtype_is_kquant(uint32_t type) { return type >= TDM_Q2_K && type <= TDM_Q6_K; }

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
/* E4M3 (TDM_F8_E4M3): exact decoding; encoding rounds to nearest even, saturates to
 * +-TDM_E4M3_MAX (as the hardware's satfinite conversion does), NaN to 0x7f. */
float tdm_e4m3_to_f32(uint8_t b);
uint8_t tdm_f32_to_e4m3(float f);
/* One row of n values as E4M3 with its scale: *scale = max |x| / TDM_E4M3_MAX (1 for
 * a row of zeros), dst[i] = e4m3(x[i] / *scale).  Non-finite values: false (dst and
 * scale undefined). */
bool tdm_row_to_e4m3(const float *x, int64_t n, uint8_t *dst, float *scale);

/* Dequantise / convert one row of n elements (n a multiple of the block size). */
void tdm_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n);
/* Quantise / convert one row from f32 (reference implementation, used by tests,
 * `tandem quantize` and `tandem synth`).  The 32-element types round to the nearest
 * level of a scale from the block's extremes; the K-quants search per sub-block for
 * the scale (and min) of least weighted squared error, then quantise the sub-block
 * scales under the super-block's. */
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
