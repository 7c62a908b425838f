/* ggml_types.c - names and block sizes of GGML's tensor types (ggml.h numbering;
 * sizes from the block structs of ggml-common.h: QK_K = 256).  The loader sizes the
 * types tandem computes with from their block structs (dtype.c); test_gguf checks
 * that this table agrees with them. */
#include "ggml_types.h"

#include <stdio.h>

#include "dtype.h"

typedef struct ggml_type_desc {
    const char *name;
    uint32_t block_elems, block_bytes; /* 0, 0: size not known here */
} ggml_type_desc;

static const ggml_type_desc types[] = {
    [0] = {"f32", 1, 4},
    [1] = {"f16", 1, 2},
    [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},
    [6] = {"q5_0", 32, 22},
    [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},
    [9] = {"q8_1", 32, 36},
    [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},
    [12] = {"q4_K", 256, 144},
    [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},
    [15] = {"q8_K", 256, 292},
    [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},
    [18] = {"iq3_xxs", 256, 98},
    [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},
    [21] = {"iq3_s", 256, 110},
    [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136},
    [24] = {"i8", 1, 1},
    [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},
    [27] = {"i64", 1, 8},
    [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},
    [30] = {"bf16", 1, 2},
    [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},
    [39] = {"mxfp4", 32, 17},
    [40] = {"nvfp4", 0, 0},
    [41] = {"q1_0", 0, 0},
};

static const ggml_type_desc *desc(uint32_t type) {
    if (type >= sizeof types / sizeof types[0] || !types[type].name) return NULL;
    return &types[type];
}

const char *tdm_ggml_type_name(uint32_t type) {
    const ggml_type_desc *d = desc(type);
    return d ? d->name : NULL;
}

bool tdm_ggml_type_block(uint32_t type, uint32_t *block_elems, uint32_t *block_bytes) {
    const ggml_type_desc *d = desc(type);
    if (!d || !d->block_elems) return false;
    *block_elems = d->block_elems;
    *block_bytes = d->block_bytes;
    return true;
}

const char *tdm_ggml_type_describe(uint32_t type, char *buf, size_t cap) {
    const char *name = tdm_ggml_type_name(type);
    if (name) snprintf(buf, cap, "%u (%s)", (unsigned)type, name);
    else snprintf(buf, cap, "%u (not a GGML type)", (unsigned)type);
    return buf;
}

const char *tdm_ggml_supported_list(char *buf, size_t cap) {
    size_t k = 0;
    if (cap) buf[0] = 0;
    for (uint32_t t = 0; t < 64 && k < cap; t++) {
        if (!tdm_dtype_supported(t)) continue;
        const char *name = tdm_ggml_type_name(t);
        int w = snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", name ? name : tdm_dtype_name(t));
        if (w < 0) break;
        k += (size_t)w;
    }
    return buf;
}
