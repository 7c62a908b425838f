/* test_forward_ref.c - the engine's forward pass against a plain C reference on
 * tiny random-weight llama / qwen2 models (tests/tiny_model.c; the newer
 * architectures: test_arch.c).
 *
 * The reference (tests/ref_forward.c) reads the GGUF itself, dequantises every
 * weight with tdm_row_to_f32 and runs the textbook forward in double precision
 * over the whole token sequence (causal attention, no KV cache).  The engine's
 * logits at every position (tdm_engine_score_last on each prefix) must match with
 * a normalised error ||engine - ref|| / ||ref|| below a tight tolerance: both sides
 * use the same dequantised weights, so only f32 rounding separates them.
 *
 * Also: prefill in chunks vs. one row at a time gives bit-identical logits
 * (batch invariance) for every weight type; the CPU backend's tensor-parallel
 * blocks match the reference, the op-by-op forward and themselves across batch
 * shapes, and run exactly where their shape rules say.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "dtype.h"
#include "engine.h"
#include "fwd_testutil.h"
#include "kv_cache.h"
#include "ref_forward.h"
#include "testutil.h"
#include "tiny_model.h"

/* ------------------------------------------------------------ against the reference */

Test(forward_ref, llama_tied_output, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(11);
    check_case("llama tied", &c, TOL_F32);
}

Test(forward_ref, llama_separate_output, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(12);
    c.untied_output = true;
    check_case("llama untied", &c, TOL_F32);
}

Test(forward_ref, qwen2_biases_neox_rope, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(13);
    c.arch = "qwen2";
    check_case("qwen2", &c, TOL_F32);
    c.untied_output = true;
    c.seed = 14;
    check_case("qwen2 untied", &c, TOL_F32);
}

/* The CPU's default cache (TANDEM_KV_AUTO) is f16: the same logits as an explicit
 * f16 cache, and against the reference an error that K and V rounded to half
 * precision explain (11-bit significands: a relative 2^-12 per value; measured
 * 2.5e-4 on both) but well above the f32 cache's (5e-7).  Errors a wrong cache
 * layout or a misread element would make are of order 1. */
#define TOL_F16_KV 1e-3
Test(forward_ref, f16_kv_default, .timeout = 180) {
    const char *arch[] = {"llama", "qwen2"};
    for (size_t i = 0; i < TDM_ARRAY_LEN(arch); i++) {
        tdm_tiny_cfg c = base_cfg(60 + i);
        c.arch = arch[i];
        const double e_auto = check_case_kv("auto cache", &c, TOL_F16_KV, TANDEM_KV_AUTO);
        const double e16 = check_case_kv("f16 cache", &c, TOL_F16_KV, TANDEM_KV_F16);
        const double e32 = check_case_kv("f32 cache", &c, TOL_F32, TANDEM_KV_F32);
        cr_assert_eq(e_auto, e16, "%s: the default cache is not f16 (error %.3g, f16's %.3g)", arch[i], e_auto, e16);
        cr_assert_gt(e16, e32, "%s: an f16 cache as exact as f32 (%.3g vs %.3g): not rounded?", arch[i], e16, e32);
    }
}

Test(forward_ref, gqa_ratios_1_2_4, .timeout = 180) {
    const int kv_heads[] = {4, 2, 1}; /* n_head 4: ratios 1, 2, 4 */
    for (size_t i = 0; i < TDM_ARRAY_LEN(kv_heads); i++) {
        tdm_tiny_cfg c = base_cfg(20 + i);
        c.n_head = 4;
        c.n_head_kv = kv_heads[i];
        char what[64];
        snprintf(what, sizeof what, "llama GQA %d", 4 / kv_heads[i]);
        check_case(what, &c, TOL_F32);
        c.arch = "qwen2";
        snprintf(what, sizeof what, "qwen2 GQA %d", 4 / kv_heads[i]);
        check_case(what, &c, TOL_F32);
    }
}

Test(forward_ref, head_dim_16_and_32, .timeout = 180) {
    /* head_dim = n_embd / n_head */
    struct { int embd, head, head_kv; } s[] = {{64, 4, 2}, {64, 2, 1}, {128, 4, 2}, {128, 8, 2}};
    for (size_t i = 0; i < TDM_ARRAY_LEN(s); i++) {
        tdm_tiny_cfg c = base_cfg(30 + i);
        c.n_embd = s[i].embd;
        c.n_head = s[i].head;
        c.n_head_kv = s[i].head_kv;
        char what[64];
        snprintf(what, sizeof what, "llama embd %d heads %d/%d (head_dim %d)", s[i].embd, s[i].head,
                 s[i].head_kv, s[i].embd / s[i].head);
        check_case(what, &c, TOL_F32);
    }
}

Test(forward_ref, linear_rope_scaling, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(40);
    c.rope_scale = 2.0f;
    check_case("llama rope linear x2", &c, TOL_F32);
    c.arch = "qwen2";
    c.rope_scale = 4.0f;
    check_case("qwen2 rope linear x4", &c, TOL_F32);
}

static const uint32_t k_types[] = {TDM_F32,  TDM_F16,  TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_1, TDM_Q5_0,
                                   TDM_Q5_1, TDM_Q2_K, TDM_Q3_K, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};

/* A tiny model of type t: the K-quants need rows of whole super-blocks (256). */
static tdm_tiny_cfg type_cfg(uint32_t t, uint64_t seed) {
    tdm_tiny_cfg c = base_cfg(seed);
    c.wtype = t;
    if (tdm_dtype_is_kquant(t)) c.n_embd = 256, c.n_ff = 256;
    return c;
}

Test(forward_ref, weight_types, .timeout = 300) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(k_types); i++) {
        tdm_tiny_cfg c = type_cfg(k_types[i], 50 + i);
        char what[64];
        snprintf(what, sizeof what, "llama %s", tdm_dtype_name(k_types[i]));
        check_case(what, &c, type_tol(k_types[i]));
        c.arch = "qwen2";
        c.untied_output = true;
        snprintf(what, sizeof what, "qwen2 untied %s", tdm_dtype_name(k_types[i]));
        check_case(what, &c, type_tol(k_types[i]));
    }
}

/* A Q4_K_M-like mix: Q4_K matrices, Q6_K attn_v and ffn_down, Q5_0 rows where 256
 * does not divide them.  On the CPU the mixed q, k, v stay three weights of the
 * file's types (tdm_qkv_split): the tensor-parallel blocks, the op-by-op forward (its
 * products of several rows copied into the qkv rows, of one row written in place) and
 * every batch shape against the reference and each other. */
Test(forward_ref, mixed_types, .timeout = 120) {
    tdm_tiny_cfg c = type_cfg(TDM_Q4_K, 58);
    c.attn_v_type = TDM_Q6_K;
    c.ffn_down_type = TDM_Q6_K;
    check_case("llama q4_k + q6_k", &c, TOL_QDOTK);
    c.n_embd = 512, c.n_ff = 512; /* (two threads' halves of Wo's and W2's columns: whole blocks) */
    check_tp("llama q4_k + q6_k v", &c, 2, 1);
    c.arch = "qwen2"; /* (q, k, v biases over the split products) */
    c.untied_output = true;
    check_case("qwen2 q4_k + q6_k", &c, TOL_QDOTK);
    check_tp("qwen2 q4_k + q6_k v", &c, 2, 1);
    {
        eng k;
        eng_open(&k, &c, 0);
        const tdm_layer *L = &k.m->layers[0];
        cr_assert(tdm_qkv_split(L) && !L->wqkv.data && L->wqkv.rows == 0, "mixed q, k, v stay apart on the CPU");
        cr_assert(L->wq.type == TDM_Q4_K && L->wk.type == TDM_Q4_K && L->wv.type == TDM_Q6_K);
        const int64_t hd = k.m->hp.head_dim;
        cr_assert(L->wq.rows == k.m->hp.n_head * hd && L->wk.rows == k.m->hp.n_head_kv * hd &&
                  L->wv.rows == L->wk.rows && L->wq.cols == k.m->hp.n_embd);
        eng_close(&k);
    }
    c = base_cfg(59);
    c.wtype = TDM_Q5_0;
    c.attn_v_type = TDM_Q8_0;
    c.untied_output = true;
    check_case("llama q5_0 + q8_0", &c, TOL_QDOT32);
    eng x;
    eng_open(&x, &c, 0);
    cr_assert(tdm_qkv_split(&x.m->layers[0]) && x.m->layers[0].wv.type == TDM_Q8_0, "mixed q, k, v stay apart");
    cr_assert_eq(x.m->layers[0].w2.type, TDM_Q5_0);
    eng_close(&x);
}

/* The comparison is sharp: a reference with the other RoPE layout, or without the
 * linear scaling, is far from the engine. */
Test(forward_ref, comparison_detects_wrong_rope, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(60);
    c.rope_scale = 2.0f;
    eng x;
    eng_open(&x, &c, 0);
    ref_model rm;
    ref_load(x.path, &rm);
    int32_t tok[N_TOK];
    random_tokens(tok, N_TOK, rm.V, 77);
    float *got = eng_logits_prefixes(&x, tok, N_TOK);
    int worst;
    double *ref = ref_forward(&rm, tok, N_TOK);
    cr_assert_lt(max_rel_err(got, ref, N_TOK, rm.V, &worst), TOL_F32);
    free(ref);
    rm.neox = true;
    ref = ref_forward(&rm, tok, N_TOK);
    double e_layout = max_rel_err(got, ref, N_TOK, rm.V, &worst);
    free(ref);
    rm.neox = false;
    rm.freq_scale = 1.0;
    ref_rope_tables(&rm);
    ref = ref_forward(&rm, tok, N_TOK);
    double e_scale = max_rel_err(got, ref, N_TOK, rm.V, &worst);
    free(ref);
    cr_log_info("wrong layout: %.3g, no scaling: %.3g", e_layout, e_scale);
    cr_assert_gt(e_layout, 1e-2, "NEOX reference agrees with the llama engine (%.3g)", e_layout);
    cr_assert_gt(e_scale, 1e-2, "unscaled reference agrees with the scaled engine (%.3g)", e_scale);
    free(got);
    ref_free(&rm);
    eng_close(&x);
}
Test(forward_ref, batch_invariance_every_weight_type, .timeout = 300) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(k_types); i++) {
        tdm_tiny_cfg c = type_cfg(k_types[i], 70 + i);
        char what[64];
        snprintf(what, sizeof what, "llama %s", tdm_dtype_name(k_types[i]));
        check_batch_invariance(&c, what);
        c.arch = "qwen2";
        c.untied_output = true;
        snprintf(what, sizeof what, "qwen2 %s", tdm_dtype_name(k_types[i]));
        check_batch_invariance(&c, what);
    }
}

/* ------------------------------------------------------------ tensor-parallel blocks */

typedef struct tp_case {
    const char *what;
    int embd, head, head_kv, ff, threads;
    uint32_t wtype;
    const char *arch;
    int runs; /* 1: the blocks op takes this shape; 0: it declines (the forward runs op by
                 op); 2: it takes it iff the weights are in the rows layout (the P64
                 layout cannot split into slices of 32 rows) */
} tp_case;

static void check_tp_case(const tp_case *tc, uint64_t seed) {
    tdm_tiny_cfg c = base_cfg(seed);
    c.n_embd = tc->embd;
    c.n_head = tc->head;
    c.n_head_kv = tc->head_kv;
    c.n_ff = tc->ff;
    c.wtype = tc->wtype;
    c.arch = tc->arch;
    c.untied_output = tc->arch && !strcmp(tc->arch, "qwen2");
    check_tp(tc->what, &c, tc->threads, tc->runs);
}

/* head_dim 64 with 4 / 2 heads and 256 FFN features split two ways: slices of
 * 128 / 64 / 128 rows, so the P64 layout (element types) splits too */
static const tp_case tp_cases[] = {
    {"f16 P64, 2 threads", 256, 4, 2, 256, 2, TDM_F16, "llama", 1},
    {"f32 P64, 2 threads", 256, 4, 2, 256, 2, TDM_F32, "llama", 1},
    {"bf16 P64, 2 threads", 256, 4, 2, 256, 2, TDM_BF16, "llama", 1},
    {"qwen2 f16 (biases, NEOX rope), 2 threads", 256, 4, 2, 256, 2, TDM_F16, "qwen2", 1},
    {"q8_0 rows layout, 2 threads", 256, 4, 2, 256, 2, TDM_Q8_0, "llama", 1},
    {"q4_0 rows layout, 4 threads", 256, 8, 4, 256, 4, TDM_Q4_0, "llama", 1},
    {"qwen2 q8_0 slices of 32 rows, 4 threads", 128, 4, 4, 128, 4, TDM_Q8_0, "qwen2", 1},
    {"f16 slices of 32 rows, 4 threads", 128, 4, 4, 128, 4, TDM_F16, "llama", 2},
    {"3 threads, 2 kv heads: declines", 256, 4, 2, 258, 3, TDM_F16, "llama", 0},
    {"1 thread: declines", 256, 4, 2, 256, 1, TDM_F16, "llama", 0},
    {"one kv head shared by 2 threads", 256, 4, 1, 256, 2, TDM_F16, "llama", 1},
    {"qwen2 q8_0, 2 kv heads shared by 4 threads", 256, 4, 2, 256, 4, TDM_Q8_0, "qwen2", 1},
    {"4 threads, 2 query heads on one kv head: declines", 128, 2, 1, 256, 4, TDM_F16, "llama", 0},
    {"q4_k, 2 threads", 512, 8, 2, 512, 2, TDM_Q4_K, "llama", 1},
    {"qwen2 q6_k, 2 threads", 512, 8, 2, 512, 2, TDM_Q6_K, "qwen2", 1},
    {"q5_0, 4 threads", 256, 8, 4, 256, 4, TDM_Q5_0, "llama", 1},
    /* FFN features that do not split evenly in whole blocks of W2's columns: shares of
     * whole blocks as even as they go (the real 1.5B target's 35 Q4_K blocks: 17, 18) */
    {"q4_k FFN of 3 super-blocks on 2 threads: 1 and 2", 512, 8, 2, 768, 2, TDM_Q4_K, "llama", 1},
    {"qwen2 q5_0 FFN of 6 blocks on 4 threads: 1, 2, 1, 2", 256, 8, 4, 192, 4, TDM_Q5_0, "qwen2", 1},

    {"q4_k column slices of 128 (not whole super-blocks): declines", 256, 4, 2, 256, 2, TDM_Q4_K, "llama", 0},
};

Test(forward_ref, tensor_parallel_blocks, .timeout = 300) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(tp_cases); i++) check_tp_case(&tp_cases[i], 90 + i);
}

/* Some of them at the lower SIMD levels (rows layout: the direct and tile kernels on
 * views). */
Test(forward_ref, tensor_parallel_blocks_lower_levels, .timeout = 300) {
    static const size_t picks[] = {0, 6, 10}; /* f16 2 threads, q8_0 4 threads, a shared kv head */
    static const tdm_cpu_level levels[] = {TDM_CPU_AVX2, TDM_CPU_SCALAR};
    for (size_t l = 0; l < TDM_ARRAY_LEN(levels); l++) {
        tdm_cpu_cap_level(levels[l]);
        for (size_t i = 0; i < TDM_ARRAY_LEN(picks); i++) check_tp_case(&tp_cases[picks[i]], 120 + i + 10 * l);
    }
    tdm_cpu_cap_level(TDM_CPU_N_LEVELS);
}

/* Two sequences in one batch, one of them with tree rows (a sibling and its child:
 * extra visible slots), through the tensor-parallel blocks: each row's logits equal,
 * bit for bit, those of its path fed as a plain sequence, and those of the
 * op-by-op forward to rounding. */
static float *multi_seq_logits(eng *x, const int32_t *ta, const int32_t *tb, int32_t alt[2]) {
    tdm_engine *e = x->e;
    int V = x->m->hp.n_vocab;
    tdm_err err = {0};
    tdm_seq sa, sb;
    memset(&sa, 0, sizeof sa);
    memset(&sb, 0, sizeof sb);
    sa.tokens = (int32_t *)ta;
    sa.n_tokens = sa.cap = 19;
    sb.tokens = (int32_t *)tb;
    sb.n_tokens = sb.cap = 16;
    cr_assert_eq(tdm_engine_feed(e, &sa, false, 0, 16, false, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_feed(e, &sb, false, 0, 14, false, TDM_FWD_LOGITS, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_kv_seq_reserve(e->pool, &sa.kv, 19, &err), TANDEM_OK);
    cr_assert_eq(tdm_kv_seq_reserve(e->pool, &sb.kv, 18, &err), TANDEM_OK);
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, 8, &err), TANDEM_OK);
    /* B first, then A: B at 14, 15; the sibling of 15 (token alt[0], slot 16) and its
     * child (alt[1], position 16, slot 17) see [0, 15) plus their tree slots */
    tdm_batch_add(&b, tb[14], 14, 1, 14, true);
    tdm_batch_add(&b, tb[15], 15, 1, 15, true);
    tdm_batch_add(&b, alt[0], 15, 1, 16, true);
    tdm_batch_add(&b, alt[1], 16, 1, 17, true);
    for (int p = 16; p < 19; p++) tdm_batch_add(&b, ta[p], p, 0, p, true);
    b.n_visible[2] = b.n_visible[3] = 15;
    b.extra_off = calloc(8, sizeof(int32_t));
    b.extra_slot = malloc(3 * sizeof(int32_t));
    b.extra_off[3] = 1; /* row 2: slot 16 */
    b.extra_off[4] = b.extra_off[5] = b.extra_off[6] = b.extra_off[7] = 3; /* row 3: 16, 17 */
    b.extra_slot[0] = 16;
    b.extra_slot[1] = 16;
    b.extra_slot[2] = 17;
    const tdm_kv_seq *seqs[2] = {&sa.kv, &sb.kv};
    float *out = malloc((size_t)b.n_rows * V * sizeof(float));
    cr_assert_eq(tdm_model_forward(x->m, e->be, &e->kv_t, &b, seqs, &e->fs_t, out, &err), TANDEM_OK, "%s",
                 err.msg);
    tdm_batch_free(&b);
    tdm_kv_seq_free(e->pool, &sa.kv);
    tdm_kv_seq_free(e->pool, &sb.kv);
    return out;
}

Test(forward_ref, tensor_parallel_multi_sequence_batch, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(140);
    c.n_embd = 256;
    c.n_head = 4;
    c.n_head_kv = 2;
    c.n_ff = 256;
    c.wtype = TDM_F16;
    eng tp, ops;
    eng_open_ex(&tp, &c, 0, 2, true);
    eng_open_ex(&ops, &c, 0, 2, false);
    int V = tp.m->hp.n_vocab;
    int32_t ta[19], tb[16], alt[2];
    random_tokens(ta, 19, V, 1401);
    random_tokens(tb, 16, V, 1402);
    random_tokens(alt, 2, V, 1403);
    uint64_t runs0 = tdm_backend_cpu_blocks_runs(tp.e->be);
    float *got = multi_seq_logits(&tp, ta, tb, alt);
    cr_assert_gt(tdm_backend_cpu_blocks_runs(tp.e->be), runs0, "the blocks op did not run");
    float *base = multi_seq_logits(&ops, ta, tb, alt);

    /* each row's path as a plain sequence */
    int32_t paths[7][19], lens[7];
    for (int r = 0; r < 2; r++) {
        memcpy(paths[r], tb, sizeof(int32_t) * (size_t)(15 + r));
        lens[r] = 15 + r;
    }
    memcpy(paths[2], tb, sizeof(int32_t) * 15);
    paths[2][15] = alt[0];
    lens[2] = 16;
    memcpy(paths[3], paths[2], sizeof(int32_t) * 16);
    paths[3][16] = alt[1];
    lens[3] = 17;
    for (int r = 4; r < 7; r++) {
        memcpy(paths[r], ta, sizeof(int32_t) * (size_t)(13 + r));
        lens[r] = 13 + r;
    }
    float *one = malloc((size_t)V * sizeof(float));
    double *bd = malloc((size_t)V * sizeof(double));
    tdm_err err = {0};
    for (int r = 0; r < 7; r++) {
        cr_assert_eq(tdm_engine_score_last(tp.e, false, paths[r], lens[r], one, &err), TANDEM_OK, "%s", err.msg);
        cr_assert(memcmp(one, got + (size_t)r * V, (size_t)V * sizeof(float)) == 0,
                  "row %d: the batch of two sequences differs from its path fed alone", r);
        for (int i = 0; i < V; i++) bd[i] = base[(size_t)r * V + i];
        int worst;
        double e = max_rel_err(got + (size_t)r * V, bd, 1, V, &worst);
        cr_assert(e < 1e-5, "row %d: tensor parallel vs op by op %.3g", r, e);
    }
    cr_assert_eq(tdm_kv_pool_n_free(tp.e->pool), tdm_kv_pool_n_blocks(tp.e->pool), "KV blocks leaked");
    free(one);
    free(bd);
    free(got);
    free(base);
    eng_close(&tp);
    eng_close(&ops);
}
