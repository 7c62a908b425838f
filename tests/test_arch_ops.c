/* test_arch_ops.c - the pieces the qwen3 / gemma3 blocks and the RoPE scalings add,
 * below the whole forward (test_arch.c): the CPU ops head_rmsnorm, geglu, add,
 * scale and softcap at every SIMD level against plain double references; RoPE with
 * a frequency table and a magnitude; attention with a sliding window and
 * soft-capping against ref_attention (tests/ref_ops.c), batch invariance included;
 * the frequency tables of src/model/rope.c on real models' parameters; and every way a
 * model of these architectures is refused at load with an error naming the
 * problem (missing tensors and keys, bad values, unknown scalings and
 * architectures, a backend without sliding-window attention). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_testutil.h"
#include "cpu_internal.h"
#include "model.h"
#include "ref_ops.h"
#include "rope.h"
#include "testutil.h"
#include "tiny_model.h"

/* ------------------------------------------------------------ row ops */

Test(arch_ops, row_ops_every_level) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int nl = tdm_test_levels(lv);
    uint64_t rng = 31;
    const int32_t n = 5, nh = 3, hd = 40, stride = nh * hd + 7, ff = 150, dim = 77;
    float *x = tdm_test_rand_vec(&rng, (size_t)n * stride, -3, 3), *g = tdm_test_rand_vec(&rng, hd, -2, 2);
    float *gu = tdm_test_rand_vec(&rng, (size_t)n * 2 * ff, -12, 12), *y = tdm_test_rand_vec(&rng, (size_t)n * dim, -5, 5);
    float *first[5] = {0};
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        tdm_err err = {0};
        float *h = malloc((size_t)n * stride * 4), *o = malloc((size_t)n * ff * 4), *a = malloc((size_t)n * dim * 4);
        float *s = malloc((size_t)n * dim * 4), *c = malloc((size_t)n * dim * 4);
        memcpy(h, x, (size_t)n * stride * 4);
        cr_assert_eq(b->ops->head_rmsnorm(b, h, n, stride, nh, hd, g, 1e-6f, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(b->ops->geglu(b, gu, n, ff, o, &err), TANDEM_OK, "%s", err.msg);
        memcpy(a, y, (size_t)n * dim * 4);
        cr_assert_eq(b->ops->add(b, a, x, n, dim, &err), TANDEM_OK, "%s", err.msg);
        memcpy(s, y, (size_t)n * dim * 4);
        cr_assert_eq(b->ops->scale(b, s, n, dim, 8.0f, &err), TANDEM_OK, "%s", err.msg);
        memcpy(c, y, (size_t)n * dim * 4);
        cr_assert_eq(b->ops->softcap(b, c, n, dim, 2.5f, &err), TANDEM_OK, "%s", err.msg);
        /* against double references */
        double e1 = 0, n1 = 0;
        for (int32_t i = 0; i < n; i++)
            for (int32_t k = 0; k < stride; k++) {
                const float *r = x + (size_t)i * stride;
                double want = r[k];
                if (k < nh * hd) {
                    const float *v = r + k / hd * hd;
                    double ss = 0;
                    for (int32_t d = 0; d < hd; d++) ss += (double)v[d] * v[d];
                    want = r[k] / sqrt(ss / hd + 1e-6) * g[k % hd];
                }
                e1 += (h[(size_t)i * stride + k] - want) * (h[(size_t)i * stride + k] - want);
                n1 += want * want;
                if (k >= nh * hd) cr_assert_eq(h[(size_t)i * stride + k], x[(size_t)i * stride + k], "past the heads");
            }
        cr_assert_lt(sqrt(e1 / n1), 1e-6, "head_rmsnorm level %d: %g", lv[l], sqrt(e1 / n1));
        for (int32_t i = 0; i < n; i++)
            for (int32_t k = 0; k < ff; k++) {
                double gv = gu[(size_t)i * 2 * ff + k], u = gu[(size_t)i * 2 * ff + ff + k];
                double want = 0.5 * gv * (1 + tanh(sqrt(2 / M_PI) * (gv + 0.044715 * gv * gv * gv))) * u;
                cr_assert(fabs(o[(size_t)i * ff + k] - want) <= 1e-5 * (1 + fabs(want)), "geglu(%g) * %g = %g, not %g",
                          gv, u, o[(size_t)i * ff + k], want);
            }
        for (int32_t k = 0; k < n * dim; k++) {
            cr_assert_eq(a[k], y[k] + x[k]);
            cr_assert_eq(s[k], y[k] * 8.0f);
            double want = 2.5 * tanh(y[k] / 2.5);
            cr_assert(fabs(c[k] - want) <= 1e-6, "softcap(%g) = %g, not %g", y[k], c[k], want);
        }
        /* every level: the same bits */
        float *outs[5] = {h, o, a, s, c};
        size_t sizes[5] = {(size_t)n * stride, (size_t)n * ff, (size_t)n * dim, (size_t)n * dim, (size_t)n * dim};
        for (int k = 0; k < 5; k++) {
            if (l == 0) first[k] = outs[k];
            else {
                cr_assert(memcmp(first[k], outs[k], sizes[k] * 4) == 0, "op %d differs at level %d", k, lv[l]);
                free(outs[k]);
            }
        }
        /* an infinity is not capped into a finite value (broken weights stay visible) */
        float inf_row[4] = {INFINITY, -INFINITY, NAN, 1.0f};
        cr_assert_eq(b->ops->softcap(b, inf_row, 1, 4, 2.5f, &err), TANDEM_OK, "%s", err.msg);
        cr_assert(isnan(inf_row[0]) && isnan(inf_row[1]) && isnan(inf_row[2]), "softcap(+-inf, NaN) = %g %g %g",
                  inf_row[0], inf_row[1], inf_row[2]);
        cr_assert_eq(inf_row[3], 2.5f * tanhf(1.0f / 2.5f));
        /* bad arguments: clear errors */
        cr_assert_eq(b->ops->head_rmsnorm(b, h, n, nh * hd - 1, nh, hd, g, 1e-6f, &err), TANDEM_ERR_INVALID_ARG);
        cr_assert_eq(b->ops->softcap(b, c, n, dim, 0.0f, &err), TANDEM_ERR_INVALID_ARG);
        cr_assert_eq(b->ops->scale(b, s, n, dim, NAN, &err), TANDEM_ERR_INVALID_ARG);
        cr_assert_eq(b->ops->add(b, NULL, x, n, dim, &err), TANDEM_ERR_INVALID_ARG);
        cr_assert_eq(b->ops->geglu(b, gu, n, 0, o, &err), TANDEM_ERR_INVALID_ARG);
        tdm_backend_destroy(b);
    }
    for (int k = 0; k < 5; k++) free(first[k]);
    free(x), free(g), free(gu), free(y);
}

/* ------------------------------------------------------------ RoPE */

/* A yarn table on the rope op: against ref_rope; NULL and the default table give the
 * same bits; mscale 0 means 1. */
Test(arch_ops, rope_table_and_magnitude) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int nl = tdm_test_levels(lv);
    uint64_t rng = 41;
    const int32_t n = 6, nh = 3, hd = 64, stride = nh * hd + 3;
    int32_t pos[6] = {0, 1, 7, 100, 4095, 70000};
    tdm_rope_scaling sc = tdm_rope_scaling_make(TDM_ROPE_SCALING_YARN, 4.0f, 1.0f, 4096);
    double freq[24], dflt[24];
    tdm_rope_table(&sc, 48, 1e6f, 0.25f, NULL, freq);
    for (int t = 0; t < 24; t++) dflt[t] = 0.5 * pow(10000.0, -2.0 * t / 48);
    const tdm_rope_params rps[] = {
        {.n_rot = 48, .freq_base = 1e6f, .freq_scale = 0.25f, .neox = true, .freq = freq,
         .mscale = tdm_rope_mscale(&sc, 0.25f)},
        {.n_rot = 48, .freq_base = 10000.0f, .freq_scale = 0.5f, .neox = false, .freq = NULL, .mscale = 0},
        {.n_rot = 48, .freq_base = 10000.0f, .freq_scale = 0.5f, .neox = false, .freq = dflt, .mscale = 1},
    };
    float *x = tdm_test_rand_vec(&rng, (size_t)n * stride, -2, 2);
    float *out[3][TDM_CPU_N_LEVELS];
    for (int l = 0; l < nl; l++) {
        tdm_backend *b = tdm_test_backend(lv[l], 2);
        for (int p = 0; p < 3; p++) {
            float *v = malloc((size_t)n * stride * 4), *ref = malloc((size_t)n * stride * 4);
            memcpy(v, x, (size_t)n * stride * 4);
            memcpy(ref, x, (size_t)n * stride * 4);
            tdm_err err = {0};
            cr_assert_eq(b->ops->rope(b, v, n, stride, nh, hd, pos, &rps[p], &err), TANDEM_OK, "%s", err.msg);
            ref_rope(ref, n, stride, nh, hd, pos, &rps[p]);
            double e = ref_nrm_err(v, ref, (size_t)n * stride);
            cr_assert_lt(e, 1e-6, "rope %d level %d: %g", p, lv[l], e);
            out[p][l] = v;
            free(ref);
        }
        cr_assert(memcmp(out[1][l], out[2][l], (size_t)n * stride * 4) == 0, "NULL table vs its default");
        if (l > 0)
            for (int p = 0; p < 3; p++)
                cr_assert(memcmp(out[p][0], out[p][l], (size_t)n * stride * 4) == 0, "rope %d: level %d differs", p, lv[l]);
        tdm_backend_destroy(b);
    }
    for (int l = 0; l < nl; l++)
        for (int p = 0; p < 3; p++) free(out[p][l]);
    free(x);
}

/* src/model/rope.c on Qwen3's YaRN (factor 4 over 32768 positions, heads of 128, base 1e6):
 * ggml_rope_yarn_corr_dims gives [23, 40]; pairs up to 23 keep their frequency,
 * from 40 on they are divided by 4, between they mix linearly; the magnitude is
 * 1 + 0.1 ln 4 and llama.cpp's attention factor 1.  Llama 3's divisors divide. */
Test(arch_ops, rope_tables_of_real_models) {
    tdm_rope_scaling sc = tdm_rope_scaling_make(TDM_ROPE_SCALING_YARN, 4.0f, 1.0f, 32768);
    cr_assert_float_eq(sc.attn_factor, 1.0f, 1e-6);
    cr_assert_float_eq(tdm_rope_mscale(&sc, 0.25f), 1.0f + 0.1f * logf(4.0f), 1e-6);
    double f[64];
    tdm_rope_table(&sc, 128, 1e6f, 0.25f, NULL, f);
    for (int t = 0; t < 64; t++) {
        double ex = pow(1e6, -2.0 * t / 128), ramp = t <= 23 ? 1 : t >= 40 ? 0 : 1 - (t - 23) / 17.0;
        double want = ex / 4 * (1 - ramp) + ex * ramp;
        cr_assert(fabs(f[t] - want) <= 1e-6 * want, "pair %d: %.9g, not %.9g", t, f[t], want);
    }
    tdm_rope_scaling lin = tdm_rope_scaling_make(TDM_ROPE_SCALING_LINEAR, 8.0f, 1.0f, 0);
    float ff[32];
    for (int t = 0; t < 32; t++) ff[t] = 1.0f + (float)t / 4;
    tdm_rope_table(&lin, 64, 500000.0f, 0.125f, ff, f);
    for (int t = 0; t < 32; t++) {
        double want = 0.125 * pow(500000.0, -2.0 * t / 64) / ff[t];
        cr_assert(fabs(f[t] - want) <= 1e-12 * want, "linear + rope_freqs pair %d", t);
    }
    cr_assert_float_eq(tdm_rope_mscale(&lin, 0.125f), 1.0f, 0);
    tdm_rope_scaling att = tdm_rope_scaling_make(TDM_ROPE_SCALING_NONE, 1.0f, 0.5f, 0);
    cr_assert_float_eq(tdm_rope_mscale(&att, 1.0f), 0.5f, 0, "rope.scaling.attn_factor scales cos and sin");
}

/* ------------------------------------------------------------ attention */

/* Sequences of 40 and 23 positions, the last rows of each causal, plus a tree row
 * (a prefix and extra slots); windows 1, 5 and 64 and soft-caps 0 and 0.7: every
 * level against ref_attention, each row alone bit-identical to the batch. */
Test(arch_ops, attention_window_softcap) {
    tdm_cpu_level lv[TDM_CPU_N_LEVELS];
    const int nl = tdm_test_levels(lv);
    uint64_t rng = 51;
    const int32_t nh = 4, nkv = 2, hd = 32, bs = 16, lens[2] = {40, 23};
    tdm_kv_seq seqs[2];
    const tdm_kv_seq *sp[2];
    const int32_t n_blocks = tdm_test_shuffled_seqs(&rng, 2, lens, bs, 2, seqs, sp);
    const size_t cache_floats = (size_t)n_blocks * nkv * bs * hd;
    float *kc = tdm_test_rand_vec(&rng, cache_floats, -1, 1), *vc = tdm_test_rand_vec(&rng, cache_floats, -1, 1);
    tdm_batch bt;
    cr_assert_eq(tdm_batch_init(&bt, 16, NULL), TANDEM_OK);
    for (int s = 0; s < 2; s++)
        for (int32_t p = lens[s] - 5; p < lens[s]; p++) tdm_batch_add(&bt, 0, p, s, p, false);
    /* a tree row of sequence 0 at position 39: prefix [0, 30), extras 33, 36, 38 */
    int32_t tr = tdm_batch_add(&bt, 0, 39, 0, 38, false);
    bt.n_visible[tr] = 30;
    int32_t off[16] = {0}, extra[3] = {33, 36, 38};
    off[tr + 1] = 3;
    bt.extra_off = off;
    bt.extra_slot = extra;
    const int32_t qs = nh * hd;
    float *q = tdm_test_rand_vec(&rng, (size_t)bt.n_rows * qs, -1.5f, 1.5f);
    const size_t n_out = (size_t)bt.n_rows * nh * hd;
    float *ref = calloc(n_out, 4), *out = calloc(n_out, 4), *one = calloc((size_t)nh * hd, 4);
    static const int32_t windows[] = {1, 5, 64};
    static const float caps[] = {0, 0.7f};
    for (size_t w = 0; w < TDM_ARRAY_LEN(windows); w++)
        for (size_t c = 0; c < TDM_ARRAY_LEN(caps); c++) {
            tdm_attn_args a = {.batch = &bt, .seqs = sp, .q = q, .q_stride = qs, .out = ref, .k_cache = kc,
                               .v_cache = vc, .cache_type = TDM_F32, .n_head = nh, .n_kv_head = nkv, .head_dim = hd,
                               .block_size = bs, .scale = 0.3f, .window = windows[w], .softcap = caps[c]};
            ref_attention(&a);
            for (int l = 0; l < nl; l++) {
                tdm_backend *b = tdm_test_backend(lv[l], 2);
                a.out = out;
                tdm_err err = {0};
                cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_OK, "%s", err.msg);
                double e = ref_nrm_err(out, ref, n_out);
                cr_assert_lt(e, 1e-5, "window %d cap %g level %d: %g", windows[w], caps[c], lv[l], e);
                for (int32_t r = 0; r < bt.n_rows; r++) {
                    tdm_batch b1;
                    cr_assert_eq(tdm_batch_init(&b1, 1, NULL), TANDEM_OK);
                    tdm_batch_add(&b1, 0, bt.pos[r], bt.seq[r], bt.slot[r], false);
                    b1.n_visible[0] = bt.n_visible[r];
                    int32_t o1[2] = {0, off[r + 1] - off[r]};
                    b1.extra_off = o1;
                    b1.extra_slot = extra + off[r];
                    tdm_attn_args a1 = a;
                    a1.batch = &b1;
                    a1.q = q + (size_t)r * qs;
                    a1.out = one;
                    cr_assert_eq(b->ops->attention(b, &a1, &err), TANDEM_OK, "%s", err.msg);
                    cr_assert(memcmp(one, out + (size_t)r * nh * hd, (size_t)nh * hd * 4) == 0,
                              "window %d: row %d alone differs from the batch", windows[w], (int)r);
                    b1.extra_off = NULL;
                    b1.extra_slot = NULL;
                    tdm_batch_free(&b1);
                }
                tdm_backend_destroy(b);
            }
        }
    /* the window changes the result (the comparison is not vacuous) */
    tdm_attn_args a = {.batch = &bt, .seqs = sp, .q = q, .q_stride = qs, .out = ref, .k_cache = kc, .v_cache = vc,
                       .cache_type = TDM_F32, .n_head = nh, .n_kv_head = nkv, .head_dim = hd, .block_size = bs,
                       .scale = 0.3f, .window = 5};
    ref_attention(&a);
    a.window = 0;
    a.out = out;
    ref_attention(&a);
    cr_assert_gt(ref_nrm_err(out, ref, n_out), 0.05);
    /* bad arguments */
    tdm_backend *b = tdm_test_backend(TDM_CPU_SCALAR, 1);
    tdm_err err = {0};
    a.window = -1;
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_INVALID_ARG);
    a.window = 0;
    a.softcap = NAN;
    cr_assert_eq(b->ops->attention(b, &a, &err), TANDEM_ERR_INVALID_ARG);
    tdm_backend_destroy(b);
    bt.extra_off = NULL;
    bt.extra_slot = NULL;
    tdm_batch_free(&bt);
    for (int s = 0; s < 2; s++) free(seqs[s].blocks);
    free(kc), free(vc), free(q), free(ref), free(out), free(one);
}

/* ------------------------------------------------------------ refused models */

/* Loading a tiny model of cfg must fail with want and a message naming needle. */
static void expect_load_fails(const tdm_tiny_cfg *cfg, tandem_status want, const char *needle, const char *what) {
    char *path = tdm_tiny_model_file(cfg);
    tdm_err err = {0};
    tdm_backend *be;
    cr_assert_eq(tdm_backend_cpu_create(1, &be, &err), TANDEM_OK);
    tdm_model *m = (tdm_model *)0x1;
    tandem_status st = tdm_model_load(path, be, &m, &err);
    cr_assert_eq(st, want, "%s: status %d (%s), want %d", what, (int)st, err.msg, (int)want);
    cr_assert_null(m, "%s: model not NULL after a failure", what);
    cr_assert(strstr(err.msg, needle), "%s: message '%s' does not name '%s'", what, err.msg, needle);
    tdm_backend_destroy(be);
    unlink(path);
    free(path);
}

static tdm_tiny_cfg gemma(void) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.arch = "gemma3";
    c.n_layer = 6;
    c.sliding_window = 4;
    return c;
}

/* Tiny models that must not load: the default one changed as a row says. */
static const struct refusal {
    const char *what, *arch;
    const char *skip, *bad_shape, *nan; /* tdm_tiny_cfg's tensor faults */
    int32_t window;                     /* tdm_tiny_cfg.sliding_window */
    const char *rope_type;              /* with rope.scaling.factor 4 */
    int32_t rope_freqs_ctx;
    tandem_status want;
    const char *needle; /* the message names it */
} refusals[] = {
    {"qwen3 without a q norm", "qwen3", "blk.1.attn_q_norm.weight", NULL, NULL, 0, NULL, 0, TANDEM_ERR_FORMAT,
     "blk.1.attn_q_norm.weight"},
    {"qwen3 k norm of the wrong size", "qwen3", NULL, "blk.0.attn_k_norm.weight", NULL, 0, NULL, 0,
     TANDEM_ERR_FORMAT, "blk.0.attn_k_norm.weight"},
    {"gemma3 without a post-FFN norm", "gemma3", "blk.3.post_ffw_norm.weight", NULL, NULL, 4, NULL, 0,
     TANDEM_ERR_FORMAT, "blk.3.post_ffw_norm.weight"},
    {"gemma3 without a post-attention norm", "gemma3", "blk.0.post_attention_norm.weight", NULL, NULL, 4, NULL, 0,
     TANDEM_ERR_FORMAT, "blk.0.post_attention_norm.weight"},
    {"gemma3 without a window", "gemma3", NULL, NULL, NULL, 0, NULL, 0, TANDEM_ERR_FORMAT,
     "gemma3.attention.sliding_window"},
    {"gemma3 with a window of 0", "gemma3", NULL, NULL, NULL, -1, NULL, 0, TANDEM_ERR_FORMAT,
     "attention.sliding_window = 0"},
    {"an unknown rope scaling type", "llama", NULL, NULL, NULL, 0, "longrope", 0, TANDEM_ERR_UNSUPPORTED,
     "'longrope'"},
    {"rope_freqs of the wrong length", "llama", NULL, "rope_freqs.weight", NULL, 0, "yarn", 32, TANDEM_ERR_FORMAT,
     "rope_freqs.weight"},
    {"a NaN rope_freqs divisor", "llama", NULL, NULL, "rope_freqs.weight", 0, "yarn", 32, TANDEM_ERR_FORMAT,
     "rope_freqs.weight"},
    {"architecture gemma2", "gemma2", NULL, NULL, NULL, 0, NULL, 0, TANDEM_ERR_UNSUPPORTED, "gemma2"},
    {"architecture phi3", "phi3", NULL, NULL, NULL, 0, NULL, 0, TANDEM_ERR_UNSUPPORTED, "phi3"},
};

Test(arch_load, refused_models) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(refusals); i++) {
        const struct refusal *r = &refusals[i];
        tdm_tiny_cfg c = tdm_tiny_default();
        c.arch = r->arch;
        if (!strcmp(r->arch, "gemma3")) c.n_layer = 6;
        c.skip_tensor = r->skip;
        c.bad_shape_tensor = r->bad_shape;
        c.nan_tensor = r->nan;
        c.sliding_window = r->window;
        c.rope_type = r->rope_type;
        c.rope_scale = r->rope_type ? 4.0f : 0;
        c.rope_freqs_ctx = r->rope_freqs_ctx;
        expect_load_fails(&c, r->want, r->needle, r->what);
    }
}

/* A backend whose attention has no sliding window (the CUDA backend today) refuses
 * gemma3 at load and at a forward, with the message the lead's GPU run shows; the
 * other models load there. */
Test(arch_load, backend_without_sliding_window) {
    tdm_err err = {0};
    tdm_backend *cpu;
    cr_assert_eq(tdm_backend_cpu_create(1, &cpu, &err), TANDEM_OK);
    tdm_backend fake = *cpu; /* (the same ops, without the capability) */
    fake.attn_window_softcap = false;
    tdm_tiny_cfg c = gemma();
    char *path = tdm_tiny_model_file(&c);
    tdm_model *m = (tdm_model *)0x1;
    cr_assert_eq(tdm_model_load(path, &fake, &m, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert_null(m);
    cr_assert(strstr(err.msg, "sliding-window attention is not yet on the cpu backend"), "%s", err.msg);
    /* loaded on a capable backend, then run on the other: the forward refuses */
    cr_assert_eq(tdm_model_load(path, cpu, &m, &err), TANDEM_OK, "%s", err.msg);
    err = (tdm_err){0};
    cr_assert_eq(tdm_model_check_backend(m, &fake, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "sliding-window attention") && strstr(err.msg, "gemma3"), "%s", err.msg);
    tdm_model_free(m);
    unlink(path);
    free(path);
    c.sliding_window = 4;
    c.arch = "qwen3";
    path = tdm_tiny_model_file(&c);
    cr_assert_eq(tdm_model_load(path, &fake, &m, &err), TANDEM_OK, "qwen3 needs no window: %s", err.msg);
    tdm_model_free(m);
    unlink(path);
    free(path);
    tdm_backend_destroy(cpu);
}
