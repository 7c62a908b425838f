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

/* llama.cpp's llama_ftype numbers and llama_model_ftype_name's names (3/5/6 and 33-35
 * are retired numbers). */
static const char *const file_type_names[] = {
    [0] = "all F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [4] = "Q4_1, some F16", [7] = "Q8_0",
    [8] = "Q5_0", [9] = "Q5_1", [10] = "Q2_K - Medium", [11] = "Q3_K - Small", [12] = "Q3_K - Medium",
    [13] = "Q3_K - Large", [14] = "Q4_K - Small", [15] = "Q4_K - Medium", [16] = "Q5_K - Small",
    [17] = "Q5_K - Medium", [18] = "Q6_K", [19] = "IQ2_XXS - 2.0625 bpw", [20] = "IQ2_XS - 2.3125 bpw",
    [21] = "Q2_K - Small", [22] = "IQ3_XS - 3.3 bpw", [23] = "IQ3_XXS - 3.0625 bpw", [24] = "IQ1_S - 1.5625 bpw",
    [25] = "IQ4_NL - 4.5 bpw", [26] = "IQ3_S - 3.4375 bpw", [27] = "IQ3_S mix - 3.66 bpw", [28] = "IQ2_S - 2.5 bpw",
    [29] = "IQ2_M - 2.7 bpw", [30] = "IQ4_XS - 4.25 bpw", [31] = "IQ1_M - 1.75 bpw", [32] = "BF16",
    [36] = "TQ1_0 - 1.69 bpw ternarization", [37] = "TQ2_0 - 2.06 bpw ternarization", [38] = "MXFP4 MoE",
};

const char *tdm_ggml_file_type_name(uint32_t file_type, char *buf, size_t cap) {
    enum { GUESSED = 1024 };
    uint32_t ft = file_type & ~(uint32_t)GUESSED;
    if (ft >= sizeof file_type_names / sizeof *file_type_names || !file_type_names[ft] || cap == 0) return NULL;
    snprintf(buf, cap, "%s%s", file_type_names[ft], (file_type & GUESSED) ? " (guessed)" : "");
    return buf;
}
