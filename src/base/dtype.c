/* dtype.c - tensor element types: block layouts and scalar conversions. */
#include "dtype.h"

#include <math.h>
#include <string.h>

#include "dtype_quant.h"

/* Every E4M3 code's value (tdm_e4m3_to_f32): a table, so converting rows is a load a
 * value. */
static const float e4m3_values[256] = {
    0.0f, 0x1p-9f, 0x1p-8f, 0x1.8p-8f, 0x1p-7f, 0x1.4p-7f, 0x1.8p-7f, 0x1.cp-7f,
    0x1p-6f, 0x1.2p-6f, 0x1.4p-6f, 0x1.6p-6f, 0x1.8p-6f, 0x1.ap-6f, 0x1.cp-6f, 0x1.ep-6f,
    0x1p-5f, 0x1.2p-5f, 0x1.4p-5f, 0x1.6p-5f, 0x1.8p-5f, 0x1.ap-5f, 0x1.cp-5f, 0x1.ep-5f,
    0x1p-4f, 0x1.2p-4f, 0x1.4p-4f, 0x1.6p-4f, 0x1.8p-4f, 0x1.ap-4f, 0x1.cp-4f, 0x1.ep-4f,
    0x1p-3f, 0x1.2p-3f, 0x1.4p-3f, 0x1.6p-3f, 0x1.8p-3f, 0x1.ap-3f, 0x1.cp-3f, 0x1.ep-3f,
    0x1p-2f, 0x1.2p-2f, 0x1.4p-2f, 0x1.6p-2f, 0x1.8p-2f, 0x1.ap-2f, 0x1.cp-2f, 0x1.ep-2f,
    0x1p-1f, 0x1.2p-1f, 0x1.4p-1f, 0x1.6p-1f, 0x1.8p-1f, 0x1.ap-1f, 0x1.cp-1f, 0x1.ep-1f,
    0x1p+0f, 0x1.2p+0f, 0x1.4p+0f, 0x1.6p+0f, 0x1.8p+0f, 0x1.ap+0f, 0x1.cp+0f, 0x1.ep+0f,
    0x1p+1f, 0x1.2p+1f, 0x1.4p+1f, 0x1.6p+1f, 0x1.8p+1f, 0x1.ap+1f, 0x1.cp+1f, 0x1.ep+1f,
    0x1p+2f, 0x1.2p+2f, 0x1.4p+2f, 0x1.6p+2f, 0x1.8p+2f, 0x1.ap+2f, 0x1.cp+2f, 0x1.ep+2f,
    0x1p+3f, 0x1.2p+3f, 0x1.4p+3f, 0x1.6p+3f, 0x1.8p+3f, 0x1.ap+3f, 0x1.cp+3f, 0x1.ep+3f,
    0x1p+4f, 0x1.2p+4f, 0x1.4p+4f, 0x1.6p+4f, 0x1.8p+4f, 0x1.ap+4f, 0x1.cp+4f, 0x1.ep+4f,
    0x1p+5f, 0x1.2p+5f, 0x1.4p+5f, 0x1.6p+5f, 0x1.8p+5f, 0x1.ap+5f, 0x1.cp+5f, 0x1.ep+5f,
    0x1p+6f, 0x1.2p+6f, 0x1.4p+6f, 0x1.6p+6f, 0x1.8p+6f, 0x1.ap+6f, 0x1.cp+6f, 0x1.ep+6f,
    0x1p+7f, 0x1.2p+7f, 0x1.4p+7f, 0x1.6p+7f, 0x1.8p+7f, 0x1.ap+7f, 0x1.cp+7f, 0x1.ep+7f,
    0x1p+8f, 0x1.2p+8f, 0x1.4p+8f, 0x1.6p+8f, 0x1.8p+8f, 0x1.ap+8f, 0x1.cp+8f, NAN,
    -0.0f, -0x1p-9f, -0x1p-8f, -0x1.8p-8f, -0x1p-7f, -0x1.4p-7f, -0x1.8p-7f, -0x1.cp-7f,
    -0x1p-6f, -0x1.2p-6f, -0x1.4p-6f, -0x1.6p-6f, -0x1.8p-6f, -0x1.ap-6f, -0x1.cp-6f, -0x1.ep-6f,
    -0x1p-5f, -0x1.2p-5f, -0x1.4p-5f, -0x1.6p-5f, -0x1.8p-5f, -0x1.ap-5f, -0x1.cp-5f, -0x1.ep-5f,
    -0x1p-4f, -0x1.2p-4f, -0x1.4p-4f, -0x1.6p-4f, -0x1.8p-4f, -0x1.ap-4f, -0x1.cp-4f, -0x1.ep-4f,
    -0x1p-3f, -0x1.2p-3f, -0x1.4p-3f, -0x1.6p-3f, -0x1.8p-3f, -0x1.ap-3f, -0x1.cp-3f, -0x1.ep-3f,
    -0x1p-2f, -0x1.2p-2f, -0x1.4p-2f, -0x1.6p-2f, -0x1.8p-2f, -0x1.ap-2f, -0x1.cp-2f, -0x1.ep-2f,
    -0x1p-1f, -0x1.2p-1f, -0x1.4p-1f, -0x1.6p-1f, -0x1.8p-1f, -0x1.ap-1f, -0x1.cp-1f, -0x1.ep-1f,
    -0x1p+0f, -0x1.2p+0f, -0x1.4p+0f, -0x1.6p+0f, -0x1.8p+0f, -0x1.ap+0f, -0x1.cp+0f, -0x1.ep+0f,
    -0x1p+1f, -0x1.2p+1f, -0x1.4p+1f, -0x1.6p+1f, -0x1.8p+1f, -0x1.ap+1f, -0x1.cp+1f, -0x1.ep+1f,
    -0x1p+2f, -0x1.2p+2f, -0x1.4p+2f, -0x1.6p+2f, -0x1.8p+2f, -0x1.ap+2f, -0x1.cp+2f, -0x1.ep+2f,
    -0x1p+3f, -0x1.2p+3f, -0x1.4p+3f, -0x1.6p+3f, -0x1.8p+3f, -0x1.ap+3f, -0x1.cp+3f, -0x1.ep+3f,
    -0x1p+4f, -0x1.2p+4f, -0x1.4p+4f, -0x1.6p+4f, -0x1.8p+4f, -0x1.ap+4f, -0x1.cp+4f, -0x1.ep+4f,
    -0x1p+5f, -0x1.2p+5f, -0x1.4p+5f, -0x1.6p+5f, -0x1.8p+5f, -0x1.ap+5f, -0x1.cp+5f, -0x1.ep+5f,
    -0x1p+6f, -0x1.2p+6f, -0x1.4p+6f, -0x1.6p+6f, -0x1.8p+6f, -0x1.ap+6f, -0x1.cp+6f, -0x1.ep+6f,
    -0x1p+7f, -0x1.2p+7f, -0x1.4p+7f, -0x1.6p+7f, -0x1.8p+7f, -0x1.ap+7f, -0x1.cp+7f, -0x1.ep+7f,
    -0x1p+8f, -0x1.2p+8f, -0x1.4p+8f, -0x1.6p+8f, -0x1.8p+8f, -0x1.ap+8f, -0x1.cp+8f, NAN,
};

_Static_assert(sizeof(tdm_block_q4_1) == 20 && sizeof(tdm_block_q5_0) == 22 && sizeof(tdm_block_q5_1) == 24,
               "32-element block sizes");
_Static_assert(sizeof(tdm_block_q2_K) == 84 && sizeof(tdm_block_q3_K) == 110 && sizeof(tdm_block_q4_K) == 144 &&
                   sizeof(tdm_block_q5_K) == 176 && sizeof(tdm_block_q6_K) == 210,
               "K-quant block sizes");

bool tdm_dtype_supported(uint32_t type) {
    switch (type) {
    case TDM_F32: case TDM_F16: case TDM_BF16: case TDM_Q8_0: case TDM_Q4_0:
    case TDM_Q4_1: case TDM_Q5_0: case TDM_Q5_1:
    case TDM_Q2_K: case TDM_Q3_K: case TDM_Q4_K: case TDM_Q5_K: case TDM_Q6_K: return true;
    default: return false;
    }
}

const char *tdm_dtype_name(uint32_t type) {
    switch (type) {
    case TDM_F32: return "f32";
    case TDM_F16: return "f16";
    case TDM_BF16: return "bf16";
    case TDM_Q8_0: return "q8_0";
    case TDM_Q4_0: return "q4_0";
    case TDM_Q4_1: return "q4_1";
    case TDM_Q5_0: return "q5_0";
    case TDM_Q5_1: return "q5_1";
    case TDM_Q2_K: return "q2_k";
    case TDM_Q3_K: return "q3_k";
    case TDM_Q4_K: return "q4_k";
    case TDM_Q5_K: return "q5_k";
    case TDM_Q6_K: return "q6_k";
    case TDM_F8_E4M3: return "fp8_e4m3";
    default: return "unknown";
    }
}

uint32_t tdm_dtype_block_elems(uint32_t type) {
    switch (type) {
    case TDM_F32: case TDM_F16: case TDM_BF16: case TDM_F8_E4M3: return 1;
    case TDM_Q8_0: case TDM_Q4_0: case TDM_Q4_1: case TDM_Q5_0: case TDM_Q5_1: return TDM_QK;
    case TDM_Q2_K: case TDM_Q3_K: case TDM_Q4_K: case TDM_Q5_K: case TDM_Q6_K: return TDM_QK_K;
    default: return 0;
    }
}

uint32_t tdm_dtype_block_bytes(uint32_t type) {
    switch (type) {
    case TDM_F32: return 4;
    case TDM_F16: case TDM_BF16: return 2;
    case TDM_F8_E4M3: return 1;
    case TDM_Q8_0: return sizeof(tdm_block_q8_0);
    case TDM_Q4_0: return sizeof(tdm_block_q4_0);
    case TDM_Q4_1: return sizeof(tdm_block_q4_1);
    case TDM_Q5_0: return sizeof(tdm_block_q5_0);
    case TDM_Q5_1: return sizeof(tdm_block_q5_1);
    case TDM_Q2_K: return sizeof(tdm_block_q2_K);
    case TDM_Q3_K: return sizeof(tdm_block_q3_K);
    case TDM_Q4_K: return sizeof(tdm_block_q4_K);
    case TDM_Q5_K: return sizeof(tdm_block_q5_K);
    case TDM_Q6_K: return sizeof(tdm_block_q6_K);
    default: return 0;
    }
}

bool tdm_dtype_row_bytes(uint32_t type, uint64_t n, uint64_t *out) {
    uint32_t be = tdm_dtype_block_elems(type), bb = tdm_dtype_block_bytes(type);
    if (be == 0 || n % be != 0) return false;
    return !__builtin_mul_overflow(n / be, (uint64_t)bb, out);
}

float tdm_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t tdm_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow -> inf (>= 65520) */
    if (absx < 0x38800000u) { /* below smallest normal half: subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffff) | 0x800000;
        /* value = m * 2^(e - 150); a half subnormal is r * 2^-24, so r = m >> (126 - e) */
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    /* normal */
    uint32_t r = ((absx >> 13) - ((127 - 15) << 10));
    uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
    return (uint16_t)(sign | r);
}

uint16_t tdm_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
    uint32_t lsb = (x >> 16) & 1;
    x += 0x7fff + lsb;
    return (uint16_t)(x >> 16);
}

void tdm_row_to_f32(uint32_t type, const void *src, float *dst, int64_t n) {
    switch (type) {
    case TDM_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case TDM_F16: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = tdm_f16_to_f32(h);
        }
        break;
    }
    case TDM_BF16: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = tdm_bf16_to_f32(h);
        }
        break;
    }
    case TDM_F8_E4M3: {
        const uint8_t *s = src;
        for (int64_t i = 0; i < n; i++) dst[i] = e4m3_values[s[i]];
        break;
    }
    case TDM_Q8_0: {
        const uint8_t *s = src;
        for (int64_t b = 0; b < n / TDM_QK; b++) {
            tdm_block_q8_0 blk;
            memcpy(&blk, s + b * sizeof blk, sizeof blk);
            float d = tdm_f16_to_f32(blk.d);
            for (int j = 0; j < TDM_QK; j++) dst[b * TDM_QK + j] = d * (float)blk.qs[j];
        }
        break;
    }
    case TDM_Q4_0: {
        const uint8_t *s = src;
        for (int64_t b = 0; b < n / TDM_QK; b++) {
            tdm_block_q4_0 blk;
            memcpy(&blk, s + b * sizeof blk, sizeof blk);
            float d = tdm_f16_to_f32(blk.d);
            for (int j = 0; j < TDM_QK / 2; j++) {
                dst[b * TDM_QK + j] = d * (float)((blk.qs[j] & 15) - 8);
                dst[b * TDM_QK + j + TDM_QK / 2] = d * (float)((blk.qs[j] >> 4) - 8);
            }
        }
        break;
    }
    default:
        if (!tdm_qrow_to_f32(type, src, dst, n)) tdm_krow_to_f32(type, src, dst, n);
        break;
    }
}

void tdm_row_from_f32(uint32_t type, const float *src, void *dst, int64_t n) {
    uint8_t *d8 = dst;
    switch (type) {
    case TDM_F32:
        memcpy(dst, src, (size_t)n * 4);
        break;
    case TDM_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = tdm_f32_to_f16(src[i]);
            memcpy(d8 + 2 * i, &h, 2);
        }
        break;
    case TDM_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h = tdm_f32_to_bf16(src[i]);
            memcpy(d8 + 2 * i, &h, 2);
        }
        break;
    case TDM_F8_E4M3:
        for (int64_t i = 0; i < n; i++) d8[i] = tdm_f32_to_e4m3(src[i]);
        break;
    case TDM_Q8_0:
        for (int64_t b = 0; b < n / TDM_QK; b++) {
            const float *x = src + b * TDM_QK;
            float amax = 0;
            for (int j = 0; j < TDM_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
            float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            tdm_block_q8_0 blk;
            blk.d = tdm_f32_to_f16(d);
            for (int j = 0; j < TDM_QK; j++) blk.qs[j] = (int8_t)roundf(x[j] * id);
            memcpy(d8 + b * sizeof blk, &blk, sizeof blk);
        }
        break;
    case TDM_Q4_0:
        for (int64_t b = 0; b < n / TDM_QK; b++) {
            const float *x = src + b * TDM_QK;
            float amax = 0, max = 0;
            for (int j = 0; j < TDM_QK; j++) {
                if (fabsf(x[j]) > amax) {
                    amax = fabsf(x[j]);
                    max = x[j];
                }
            }
            float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
            tdm_block_q4_0 blk;
            blk.d = tdm_f32_to_f16(d);
            for (int j = 0; j < TDM_QK / 2; j++) {
                int a = (int)(x[j] * id + 8.5f), c = (int)(x[j + TDM_QK / 2] * id + 8.5f);
                a = a < 0 ? 0 : a > 15 ? 15 : a;
                c = c < 0 ? 0 : c > 15 ? 15 : c;
                blk.qs[j] = (uint8_t)(a | (c << 4));
            }
            memcpy(d8 + b * sizeof blk, &blk, sizeof blk);
        }
        break;
    default:
        if (!tdm_qrow_from_f32(type, src, dst, n)) tdm_krow_from_f32(type, src, dst, n);
        break;
    }
}

/* ---- weight layouts -------------------------------------------------------------- */

static size_t elem_size(uint32_t type) {
    return type == TDM_F32 ? 4 : (type == TDM_F16 || type == TDM_BF16) ? 2 : 0;
}

bool tdm_layout_fits(uint32_t layout, uint32_t type, int64_t rows, int64_t cols) {
    if (layout == TDM_LAYOUT_ROWS) return tdm_dtype_supported(type);
    if (layout == TDM_LAYOUT_P64)
        return elem_size(type) != 0 && rows > 0 && cols > 0 && rows % TDM_LAYOUT_P64_ROWS == 0;
    if (layout == TDM_LAYOUT_QSPLIT)
        return (type == TDM_Q8_0 || type == TDM_Q4_0) && rows > 0 && cols > 0 && cols % TDM_QK == 0;
    return false;
}

/* Bytes of quants of one block in the QSPLIT layout (block bytes less the scale). */
static size_t qsplit_quant_bytes(uint32_t type) { return tdm_dtype_block_bytes(type) - 2; }

/* One row of nb blocks from the block format into quants-then-scales. */
static void qsplit_row(uint32_t type, int64_t nb, const uint8_t *src, uint8_t *dst) {
    const size_t bb = tdm_dtype_block_bytes(type), qb = qsplit_quant_bytes(type);
    uint8_t *scales = dst + (size_t)nb * qb;
    for (int64_t b = 0; b < nb; b++) {
        memcpy(scales + 2 * b, src + b * bb, 2);
        memcpy(dst + b * qb, src + b * bb + 2, qb);
    }
}

bool tdm_weight_pack(uint32_t layout, uint32_t type, int64_t rows, int64_t cols, const void *src,
                     void *dst) {
    if (!tdm_layout_fits(layout, type, rows, cols) || !src || !dst) return false;
    size_t es = elem_size(type);
    if (layout == TDM_LAYOUT_ROWS) {
        uint64_t rb = 0;
        tdm_dtype_row_bytes(type, (uint64_t)cols, &rb);
        memcpy(dst, src, (size_t)rb * (size_t)rows);
        return true;
    }
    if (layout == TDM_LAYOUT_QSPLIT) {
        uint64_t rb = 0;
        tdm_dtype_row_bytes(type, (uint64_t)cols, &rb);
        for (int64_t r = 0; r < rows; r++)
            qsplit_row(type, cols / TDM_QK, (const uint8_t *)src + r * rb, (uint8_t *)dst + r * rb);
        return true;
    }
    /* tile by tile (64 rows x 64 columns), so that reads and writes stay in L1:
     * a 4096 x 4096 f16 matrix packs in ~20 ms, 1.2 ns per element (row by row with
     * a memcpy per element: 1.8 ns) */
    const int64_t B = TDM_LAYOUT_P64_ROWS;
    for (int64_t b = 0; b < rows / B; b++)
        for (int64_t c0 = 0; c0 < cols; c0 += B) {
            int64_t c1 = c0 + B < cols ? c0 + B : cols;
/* (src may be a misaligned tensor of a GGUF file: its elements are read with memcpy) */
#define PACK_TILE(T)                                                                               \
    do {                                                                                           \
        const unsigned char *sv = (const unsigned char *)src + (size_t)b * B * (size_t)cols * sizeof(T); \
        T *dv = (T *)dst + (size_t)b * B * (size_t)cols;                                           \
        for (int64_t r = 0; r < B; r++)                                                            \
            for (int64_t c = c0; c < c1; c++)                                                      \
                memcpy(&dv[(size_t)c * B + (size_t)r], sv + ((size_t)r * (size_t)cols + (size_t)c) * sizeof(T), \
                       sizeof(T));                                                                 \
    } while (0)
            if (es == 2) PACK_TILE(uint16_t);
            else PACK_TILE(uint32_t);
#undef PACK_TILE
        }
    return true;
}

float tdm_weight_elem(uint32_t type, uint32_t layout, int64_t cols, size_t row_bytes, const void *data,
                      int64_t r, int64_t c) {
    const uint8_t *p = data;
    if (layout == TDM_LAYOUT_P64) {
        const int64_t B = TDM_LAYOUT_P64_ROWS;
        /* blocks 64 rows of row_bytes apart: a view of some columns of a wider
         * weight has row_bytes of the whole */
        if (elem_size(type) == 0) return NAN;
        int64_t stride = row_bytes ? (int64_t)(row_bytes / elem_size(type)) : cols;
        size_t i = (size_t)((r / B) * stride + c) * (size_t)B + (size_t)(r % B);
        const uint8_t *e = p + i * elem_size(type);
        if (type == TDM_F32) {
            float f;
            memcpy(&f, e, 4);
            return f;
        }
        uint16_t h;
        memcpy(&h, e, 2);
        return type == TDM_F16 ? tdm_f16_to_f32(h) : tdm_bf16_to_f32(h);
    }
    uint32_t be = tdm_dtype_block_elems(type), bb = tdm_dtype_block_bytes(type);
    if (layout == TDM_LAYOUT_QSPLIT) { /* rebuild the block holding c */
        if (type != TDM_Q8_0 && type != TDM_Q4_0) return NAN;
        const size_t qb = qsplit_quant_bytes(type);
        const uint8_t *row = p + (size_t)r * row_bytes;
        uint8_t blk[sizeof(tdm_block_q8_0)];
        memcpy(blk, row + (size_t)(cols / TDM_QK) * qb + 2 * (size_t)(c / TDM_QK), 2);
        memcpy(blk + 2, row + (size_t)(c / TDM_QK) * qb, qb);
        float tmp[TDM_QK];
        tdm_row_to_f32(type, blk, tmp, TDM_QK);
        return tmp[c % TDM_QK];
    }
    /* rows layout: convert the block holding c */
    if (be == 0 || be > TDM_QK_K || layout != TDM_LAYOUT_ROWS) return NAN; /* unsupported type or layout */
    float tmp[TDM_QK_K]; /* the largest block */
    tdm_row_to_f32(type, p + (size_t)r * row_bytes + (size_t)(c / be) * bb, tmp, be);
    return tmp[c % be];
}

/* ---- FP8 E4M3 ---- */

float tdm_e4m3_to_f32(uint8_t b) { return e4m3_values[b]; }

uint8_t tdm_f32_to_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint8_t sign = (uint8_t)(u >> 24 & 0x80u);
    u &= 0x7fffffffu;
    if (u >= 0x43e00000u) return sign | 0x7e; /* |f| >= 448: saturate (448 = 0x7e) */
    if (u < 0x3c800000u) {                    /* |f| < 2^-6: multiples of 2^-9 (n = 8: 2^-6, code 8) */
        float a;
        memcpy(&a, &u, 4);
        return sign | (uint8_t)nearbyintf(a * 512.0f); /* (exact scaling; round to nearest even) */
    }
    /* normal: keep 3 mantissa bits, rounding the 20 dropped ones to nearest even (a
     * carry into the exponent is right) */
    u += 0x7ffffu + (u >> 20 & 1u);
    const uint32_t e = (u >> 23) - 127 + 7, m = u >> 20 & 7u;
    return sign | (uint8_t)(e << 3 | m); /* (below 448 rounds to at most 448: e 15, m 6) */
}

bool tdm_row_to_e4m3(const float *x, int64_t n, uint8_t *dst, float *scale) {
    float amax = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return false;
        amax = fmaxf(amax, fabsf(x[i]));
    }
    const float s = amax > 0 ? amax / TDM_E4M3_MAX : 1.0f;
    for (int64_t i = 0; i < n; i++) dst[i] = tdm_f32_to_e4m3(x[i] / s);
    *scale = s;
    return true;
}
