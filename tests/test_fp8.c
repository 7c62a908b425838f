/* test_fp8.c - FP8 E4M3 weights (tandem_model_params.weights = TANDEM_WEIGHTS_FP8):
 * the E4M3 codec against a brute-force nearest search over every code; per-row
 * quantisation; the CPU matmul of an FP8 weight against a double-precision product
 * of its dequantised values; a model loaded with FP8 weights (block weights FP8,
 * the embedding and output head kept, fewer bytes) generating what the F16 model
 * generates for most prompts' first tokens; the parameter's bad values. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "dtype.h"
#include "tandem.h"
#include "testutil.h"

Test(fp8, decode_every_code) {
    cr_assert(isnan(tdm_e4m3_to_f32(0x7f)) && isnan(tdm_e4m3_to_f32(0xff)));
    cr_assert_eq(tdm_e4m3_to_f32(0x7e), 448.0f);
    cr_assert_eq(tdm_e4m3_to_f32(0x01), ldexpf(1.0f, -9));  /* smallest subnormal */
    cr_assert_eq(tdm_e4m3_to_f32(0x08), ldexpf(1.0f, -6));  /* smallest normal */
    cr_assert_eq(tdm_e4m3_to_f32(0x38), 1.0f);
    cr_assert_eq(tdm_e4m3_to_f32(0xb8), -1.0f);
    for (int b = 0; b < 256; b++) {
        if ((b & 0x7f) == 0x7f) continue;
        const float v = tdm_e4m3_to_f32((uint8_t)b);
        cr_assert_eq(tdm_f32_to_e4m3(v), (uint8_t)b, "code 0x%02x (%g) does not round-trip", b, (double)v);
    }
}

/* The nearest code by search (ties to the even code), saturating at +-448. */
static uint8_t ref_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e;
    int best = 0;
    double bd = INFINITY;
    for (int c = 0; c <= 0x7e; c++) {
        const double d = fabs((double)tdm_e4m3_to_f32((uint8_t)c) - a);
        if (d < bd || (d == bd && (c & 1) == 0)) {
            bd = d;
            best = c;
        }
    }
    return sign | (uint8_t)best;
}

Test(fp8, encode_rounds_to_nearest_even) {
    srand(7);
    for (int c = 0; c < 0x7e; c++) { /* every midpoint between neighbours, and beside it */
        const float lo = tdm_e4m3_to_f32((uint8_t)c), hi = tdm_e4m3_to_f32((uint8_t)(c + 1));
        const float mid = (lo + hi) / 2;
        const float probes[] = {mid, nextafterf(mid, 0), nextafterf(mid, INFINITY), lo, hi, -mid};
        for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
            cr_assert_eq(tdm_f32_to_e4m3(probes[i]), ref_e4m3(probes[i]), "%.9g: 0x%02x, nearest 0x%02x",
                         (double)probes[i], tdm_f32_to_e4m3(probes[i]), ref_e4m3(probes[i]));
    }
    for (int i = 0; i < 20000; i++) {
        const float f = ldexpf((float)rand() / (float)RAND_MAX * 2 - 1, rand() % 24 - 14);
        cr_assert_eq(tdm_f32_to_e4m3(f), ref_e4m3(f), "%.9g", (double)f);
    }
    cr_assert_eq(tdm_f32_to_e4m3(1e9f), 0x7e);
    cr_assert_eq(tdm_f32_to_e4m3(-INFINITY), 0xfe);
    cr_assert_eq(tdm_f32_to_e4m3(NAN), 0x7f);
    cr_assert_eq(tdm_f32_to_e4m3(1e-30f), 0x00);
}

Test(fp8, row_quantisation) {
    float x[64], back;
    uint8_t q[64];
    float s;
    for (int i = 0; i < 64; i++) x[i] = sinf((float)i) * 3.0f;
    cr_assert(tdm_row_to_e4m3(x, 64, q, &s));
    float amax = 0;
    for (int i = 0; i < 64; i++) amax = fmaxf(amax, fabsf(x[i]));
    cr_assert_float_eq(s, amax / 448.0f, 1e-9);
    for (int i = 0; i < 64; i++) {
        back = tdm_e4m3_to_f32(q[i]) * s;
        cr_assert(fabsf(back - x[i]) <= fabsf(x[i]) / 16 + s * ldexpf(1, -9), "x[%d] %g -> %g", i, (double)x[i],
                  (double)back);
    }
    memset(x, 0, sizeof x);
    cr_assert(tdm_row_to_e4m3(x, 64, q, &s));
    cr_assert_eq(s, 1.0f);
    x[5] = NAN;
    cr_assert_not(tdm_row_to_e4m3(x, 64, q, &s));
}

/* y = x W^T by the CPU backend against double sums of the dequantised weight, for
 * the direct row counts and the tile path. */
Test(fp8, cpu_matmul_against_dequantised) {
    tdm_backend *be;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(2, &be, &err), TANDEM_OK, "%s", err.msg);
    const int rows = 70, cols = 96;
    uint8_t *q = malloc((size_t)rows * cols);
    float *sc = malloc(rows * sizeof(float)), *row = malloc(cols * sizeof(float));
    srand(3);
    for (int r = 0; r < rows; r++) {
        for (int c = 0; c < cols; c++) row[c] = ((float)rand() / (float)RAND_MAX - 0.5f) * (float)(r + 1);
        cr_assert(tdm_row_to_e4m3(row, cols, q + (size_t)r * cols, &sc[r]));
    }
    tdm_weight w = {.type = TDM_F8_E4M3, .rows = rows, .cols = cols, .row_bytes = (size_t)cols, .data = q, .scale = sc};
    const int ns[] = {1, 3, 8, 17, 40};
    for (size_t t = 0; t < sizeof ns / sizeof ns[0]; t++) {
        const int n = ns[t];
        float *x = malloc((size_t)n * cols * sizeof(float)), *y = malloc((size_t)n * rows * sizeof(float));
        for (int i = 0; i < n * cols; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
        cr_assert_eq(be->ops->matmul(be, &w, x, n, y, false, &err), TANDEM_OK, "%s", err.msg);
        for (int i = 0; i < n; i++)
            for (int r = 0; r < rows; r++) {
                double ref = 0, mag = 0;
                for (int c = 0; c < cols; c++) {
                    const double wv = (double)tdm_e4m3_to_f32(q[(size_t)r * cols + c]) * sc[r];
                    ref += wv * x[(size_t)i * cols + c];
                    mag += fabs(wv * x[(size_t)i * cols + c]);
                }
                cr_assert(fabs(y[(size_t)i * rows + r] - ref) <= 1e-5 * mag + 1e-6, "n %d row %d col %d: %g vs %g", n, i,
                          r, (double)y[(size_t)i * rows + r], ref);
            }
        free(x);
        free(y);
    }
    w.scale = NULL; /* an FP8 weight without its scales: refused */
    float x1[96] = {0}, y1[70];
    cr_assert_eq(be->ops->matmul(be, &w, x1, 1, y1, false, &err), TANDEM_ERR_INVALID_ARG);
    free(q);
    free(sc);
    free(row);
    tdm_backend_destroy(be);
}

static int first_tokens(tandem_model *m, const char *prompt, int32_t *out, int n) {
    tandem_engine *e;
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    cr_assert_eq(tandem_engine_open(m, NULL, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = n;
    gp.ignore_eos = true;
    tandem_result r;
    cr_assert_eq(tandem_generate(e, prompt, &gp, &r), TANDEM_OK, "%s", tandem_last_error());
    const int k = (int)r.n_tokens;
    memcpy(out, r.tokens, (size_t)k * sizeof *out);
    tandem_result_free(&r);
    tandem_engine_close(e);
    return k;
}

/* The pycode target with FP8 weights: fewer bytes, and the greedy continuations of
 * ten prompts start as the F16 model's do (FP8 moves a few logits: at least 8 of the
 * 10 first tokens agree, and the 8 first tokens of at least 6). */
Test(fp8, model_generates_as_f16, .timeout = 300) {
    const char *path = tdm_test_model_path("pycode-target-f16.gguf");
    tandem_model_params mp = tandem_model_default_params();
    tandem_model *m16, *m8;
    cr_assert_eq(tandem_model_open(path, &mp, &m16), TANDEM_OK, "%s", tandem_last_error());
    mp.weights = TANDEM_WEIGHTS_FP8;
    cr_assert_eq(tandem_model_open(path, &mp, &m8), TANDEM_OK, "%s", tandem_last_error());
    tandem_model_info i16, i8;
    tandem_model_get_info(m16, &i16);
    tandem_model_get_info(m8, &i8);
    cr_assert_eq(i8.n_params, i16.n_params);
    cr_assert_lt(i8.weight_bytes, i16.weight_bytes * 3 / 4, "fp8 %llu bytes, f16 %llu", (unsigned long long)i8.weight_bytes,
                 (unsigned long long)i16.weight_bytes);
    static const char *prompts[] = {"def fibonacci(n):", "import numpy as np\n", "class Stack:\n    def __init__(self):",
                                    "def read_lines(path):\n", "for i in range(10):\n", "# sort a list of pairs\n",
                                    "def is_prime(n):\n", "from collections import", "def parse_args():\n",
                                    "x = [i * i for i in"};
    int first = 0, eight = 0;
    for (int p = 0; p < 10; p++) {
        int32_t a[8], b[8];
        cr_assert_eq(first_tokens(m16, prompts[p], a, 8), 8);
        cr_assert_eq(first_tokens(m8, prompts[p], b, 8), 8);
        first += a[0] == b[0];
        eight += !memcmp(a, b, sizeof a);
    }
    cr_log_info("fp8 vs f16: first tokens %d / 10, 8 tokens %d / 10", first, eight);
    cr_assert_geq(first, 8, "first tokens agree in %d of 10", first);
    cr_assert_geq(eight, 6, "8 tokens agree in %d of 10", eight);
    tandem_model_close(m8);
    tandem_model_close(m16);
}

Test(fp8, bad_parameter) {
    tandem_model_params mp = tandem_model_default_params();
    cr_assert_eq(mp.weights, TANDEM_WEIGHTS_NATIVE);
    mp.weights = (tandem_weights)7;
    tandem_model *m = (tandem_model *)1;
    cr_assert_eq(tandem_model_open(tdm_test_model_path("pycode-target-f16.gguf"), &mp, &m), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(m);
    cr_assert(strstr(tandem_last_error(), "weights"), "%s", tandem_last_error());
}
