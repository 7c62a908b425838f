/* test_arch.c - the architectures beyond llama / qwen2 and the RoPE scalings of
 * downloaded models, on tiny random-weight models (tests/tiny_model.c) against the
 * independent double-precision reference forward (tests/ref_forward.c):
 *   Llama 3's rope_freqs, YaRN (llama and qwen3), qwen3 (q / k norms, key_length
 *   other than n_embd / n_head), gemma3 (scaled embeddings, post norms, GeGLU, a
 *   sliding window shorter than the prompt on five of every six layers with their
 *   own RoPE base, linear scaling of the global layers, optional soft-caps, the 27B
 *   attention scale);
 * mutation checks that the comparison sees a wrong window, base, scaling or
 * activation; batch invariance; the CPU tensor-parallel blocks (qwen3 runs there,
 * gemma3 is declined); speculative decoding equal to target-only decoding on
 * gemma3, qwen3, qwen3moe and Mixtral pairs; the new ops against plain references;
 * and every way such a model can be refused (missing tensors and keys, bad values, a
 * backend without sliding-window attention) with an error naming the problem.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "engine.h"
#include "fwd_testutil.h"
#include "kv_cache.h"
#include "ref_forward.h"
#include "scheduler.h"
#include "testutil.h"
#include "tiny_model.h"

/* qwen3 with heads of 32 (key_length) over n_embd 64: q is 128 wide. */
static tdm_tiny_cfg qwen3_cfg(uint64_t seed) {
    tdm_tiny_cfg c = base_cfg(seed);
    c.arch = "qwen3";
    c.head_dim = 32;
    return c;
}

/* gemma3: 7 layers (0-4 and 6 slide, 5 is global), one kv head, heads of 32, a
 * window of 8 over the 40-token prompt, global RoPE base 1e6 (local: 10000). */
static tdm_tiny_cfg gemma3_cfg(uint64_t seed) {
    tdm_tiny_cfg c = base_cfg(seed);
    c.arch = "gemma3";
    c.n_layer = 7;
    c.n_head = 4;
    c.n_head_kv = 1;
    c.head_dim = 32;
    c.sliding_window = 8;
    c.rope_base = 1e6f;
    return c;
}

/* ------------------------------------------------------------ RoPE scalings */

Test(arch, llama3_rope_freqs, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(200);
    c.n_head = 2;
    c.n_head_kv = 1; /* heads of 32: 16 pairs, most of them scaled by the file's divisors */
    c.rope_freqs_ctx = 32;
    c.rope_base = 500000.0f;
    cmp k;
    cmp_open(&k, &c, "llama rope_freqs");
    cr_assert(k.x.m->hp.rope_freqs && k.rm.rope_freqs, "rope_freqs.weight not seen");
    k.rm.use_rope_freqs = false; /* the comparison sees a forward that ignores them */
    ref_rope_tables(&k.rm);
    cmp_expect_far(&k, "without rope_freqs", 1e-2);
    cmp_close(&k);
    /* and with linear scaling on top */
    c.rope_scale = 2.0f;
    c.seed = 201;
    check_case("llama rope_freqs + linear x2", &c, TOL_F32);
}

/* YaRN with heads of 32 and an original context of 4096: pairs 0-5 keep their
 * frequency, 12-15 are interpolated, 6-11 mix; the magnitude 1 + 0.1 ln 4. */
Test(arch, yarn_llama_and_qwen3, .timeout = 120) {
    tdm_tiny_cfg c = base_cfg(210);
    c.n_head = 2;
    c.n_head_kv = 1;
    c.rope_scale = 4.0f;
    c.rope_type = "yarn";
    c.yarn_orig_ctx = 4096;
    cmp k;
    cmp_open(&k, &c, "llama yarn x4");
    cr_assert(k.rm.yarn);
    cr_assert_float_eq(k.x.m->hp.rope.mscale, 1.0f + 0.1f * logf(4.0f), 1e-6, "yarn magnitude %g",
                       k.x.m->hp.rope.mscale);
    k.rm.yarn = false; /* linear scaling instead: far */
    ref_rope_tables(&k.rm);
    cmp_expect_far(&k, "with linear scaling instead", 1e-2);
    cmp_close(&k);

    tdm_tiny_cfg q = qwen3_cfg(211);
    q.rope_scale = 4.0f;
    q.rope_type = "yarn";
    q.yarn_orig_ctx = 4096;
    q.rope_attn_factor = 0.9f;
    check_case("qwen3 yarn x4, attn_factor 0.9", &q, TOL_F32);
    /* no original context: the training context (256) */
    c.yarn_orig_ctx = 0;
    c.seed = 212;
    check_case("llama yarn x4, original context from context_length", &c, TOL_F32);
}

/* ------------------------------------------------------------ qwen3 */

Test(arch, qwen3_qk_norm_key_length, .timeout = 120) {
    tdm_tiny_cfg c = qwen3_cfg(220);
    eng x;
    eng_open(&x, &c, 0);
    cr_assert(x.m->hp.qk_norm && !x.m->hp.qkv_bias && x.m->hp.rope.neox && x.m->hp.head_dim == 32);
    cr_assert(x.m->layers[0].q_norm && x.m->layers[0].k_norm && !x.m->layers[0].bqkv);
    eng_close(&x);
    check_case("qwen3 tied", &c, TOL_F32);
    c.untied_output = true;
    c.seed = 221;
    c.n_head_kv = 1;
    check_case("qwen3 untied, GQA 4", &c, TOL_F32);
    c = base_cfg(222);
    c.arch = "qwen3"; /* heads of n_embd / n_head */
    check_case("qwen3 head_dim 16", &c, TOL_F32);
}

/* ------------------------------------------------------------ gemma3 */

Test(arch, gemma3_window_post_norms_geglu, .timeout = 120) {
    tdm_tiny_cfg c = gemma3_cfg(230);
    eng x;
    eng_open(&x, &c, 0);
    const tdm_hparams *hp = &x.m->hp;
    cr_assert(hp->swa_window == 8 && hp->swa_pattern == 6 && hp->ffn_act == TDM_ACT_GELU_TANH && hp->tied_output);
    cr_assert_float_eq(hp->embd_scale, 8.0f, 1e-6);
    cr_assert_float_eq(hp->rope_swa.freq_base, 10000.0f, 0);
    cr_assert_float_eq(hp->rope.freq_base, 1e6f, 0);
    for (int l = 0; l < 7; l++) cr_assert_eq(tdm_hparams_layer_swa(hp, l), l != 5, "layer %d", l);
    eng_close(&x);
    double e = check_case("gemma3", &c, TOL_F32);
    cr_assert_lt(e, TOL_F32);
    c.rope_scale = 8.0f; /* linear, on the global layers only */
    c.seed = 231;
    check_case("gemma3, global layers scaled x8", &c, TOL_F32);
    c.rope_scale = 0;
    c.untied_output = true;
    c.n_head_kv = 2;
    c.seed = 232;
    check_case("gemma3 untied, GQA 2", &c, TOL_F32);
}

Test(arch, gemma3_softcaps, .timeout = 120) {
    tdm_tiny_cfg c = gemma3_cfg(240);
    c.attn_softcap = 1.0f;
    c.final_softcap = 2.0f;
    cmp k;
    cmp_open(&k, &c, "gemma3 soft-capped");
    k.rm.attn_softcap = 0;
    cmp_expect_far(&k, "without the attention soft-cap", 1e-2);
    k.rm.attn_softcap = 1.0;
    k.rm.final_softcap = 0;
    cmp_expect_far(&k, "without the final soft-cap", 1e-2);
    cmp_close(&k);
}

/* llama.cpp's rule for the 27B (62 layers): scale by n_embd / n_head = 32, not the
 * head dimension 16. */
Test(arch, gemma3_27b_attention_scale, .timeout = 120) {
    tdm_tiny_cfg c = gemma3_cfg(250);
    c.n_layer = 62;
    c.n_embd = 64;
    c.n_head = 2;
    c.head_dim = 16;
    c.n_ff = 32;
    eng x;
    eng_open(&x, &c, 0);
    cr_assert_float_eq(x.m->hp.attn_scale, 1.0f / sqrtf(32.0f), 1e-7);
    eng_close(&x);
    check_case("gemma3 62 layers", &c, TOL_F32);
}

/* The comparison is sharp: a reference with another window, no window, the global
 * base on the local layers, unscaled embeddings or SwiGLU is far from the engine. */
Test(arch, comparison_detects_wrong_window, .timeout = 120) {
    tdm_tiny_cfg c = gemma3_cfg(260);
    cmp k;
    cmp_open(&k, &c, "gemma3");
    ref_model *rm = &k.rm;
    const int windows[] = {7, 9, 0};
    for (size_t i = 0; i < TDM_ARRAY_LEN(windows); i++) {
        char what[48];
        snprintf(what, sizeof what, "with window %d instead of 8", windows[i]);
        rm->window = windows[i];
        cmp_expect_far(&k, what, 1e-3);
    }
    rm->window = 8;
    rm->base_swa = rm->base;
    ref_rope_tables(rm);
    cmp_expect_far(&k, "with the global base on the local layers", 1e-2);
    rm->base_swa = 10000.0;
    ref_rope_tables(rm);
    rm->embd_scale = 1.0;
    cmp_expect_far(&k, "with unscaled embeddings", 1e-2);
    rm->embd_scale = 8.0;
    rm->gelu = false;
    cmp_expect_far(&k, "with SwiGLU", 1e-2);
    rm->gelu = true;
    float *saved[7][4];
    for (int l = 0; l < rm->L; l++) {
        ref_layer *y = &rm->layers[l];
        saved[l][0] = y->post_attn, saved[l][1] = y->post_ffn, saved[l][2] = y->q_norm, saved[l][3] = y->k_norm;
        y->post_attn = y->post_ffn = NULL;
    }
    cmp_expect_far(&k, "without post norms", 1e-2);
    for (int l = 0; l < rm->L; l++) {
        ref_layer *y = &rm->layers[l];
        y->post_attn = saved[l][0], y->post_ffn = saved[l][1], y->q_norm = y->k_norm = NULL;
    }
    cmp_expect_far(&k, "without q / k norms", 1e-2);
    for (int l = 0; l < rm->L; l++) rm->layers[l].q_norm = saved[l][2], rm->layers[l].k_norm = saved[l][3];
    cr_assert_lt(cmp_err(&k), TOL_F32, "the reference restored");
    cmp_close(&k);
}

/* ------------------------------------------------------------ batch invariance */

Test(arch, batch_invariance, .timeout = 180) {
    tdm_tiny_cfg q = qwen3_cfg(270);
    check_batch_invariance(&q, "qwen3");
    tdm_tiny_cfg g = gemma3_cfg(271);
    g.attn_softcap = 1.0f;
    g.final_softcap = 2.0f;
    check_batch_invariance(&g, "gemma3 soft-capped");
    tdm_tiny_cfg l = base_cfg(272);
    l.rope_freqs_ctx = 32;
    l.rope_scale = 4.0f;
    l.rope_type = "yarn";
    check_batch_invariance(&l, "llama rope_freqs + yarn");
    g = gemma3_cfg(273);
    g.wtype = TDM_Q8_0;
    check_batch_invariance(&g, "gemma3 q8_0");
}

/* ------------------------------------------------------------ tensor-parallel blocks */

/* Two threads: qwen3 (q / k norms of each thread's heads) and llama with
 * rope_freqs and YaRN run in the blocks op and match the reference, the op-by-op
 * forward and themselves over batch shapes; gemma3 is declined (op by op). */
Test(arch, tensor_parallel_blocks, .timeout = 120) {
    tdm_tiny_cfg q = qwen3_cfg(280);
    q.n_embd = 128;
    q.n_ff = 128;
    q.wtype = TDM_F16;
    check_tp("qwen3 f16", &q, 2, 2);
    tdm_tiny_cfg l = base_cfg(282);
    l.n_embd = 128;
    l.n_ff = 128;
    l.rope_freqs_ctx = 32;
    l.rope_scale = 4.0f;
    l.rope_type = "yarn";
    check_tp("llama rope_freqs + yarn", &l, 2, 2);
    tdm_tiny_cfg g = gemma3_cfg(281);
    check_tp("gemma3 (declined)", &g, 2, 0);
}

/* ------------------------------------------------------------ speculation */

/* Greedy speculative decoding (a draft of the target's first layers, k = 1, 3 and
 * adaptive) gives the target-only tokens; nothing leaks. */
static void check_spec_pair(const tdm_tiny_cfg *tc, int32_t draft_layers, const char *what) {
    tdm_tiny_cfg dc = *tc;
    dc.n_layer = draft_layers; /* (the same seed: the target's first layers) */
    char *tp = tdm_tiny_model_file(tc), *dp = tdm_tiny_model_file(&dc);
    tdm_err err = {0};
    tdm_backend *wbe;
    tdm_model *t, *d;
    cr_assert_eq(tdm_backend_cpu_create(1, &wbe, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(tp, wbe, &t, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(dp, wbe, &d, &err), TANDEM_OK, "%s", err.msg);
    tdm_engine_cfg ec = {.n_threads = 2, .block_size = BLOCK_SIZE};
    tdm_engine *plain, *spec;
    cr_assert_eq(tdm_engine_create(t, NULL, &ec, &plain, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_engine_create(t, d, &ec, &spec, &err), TANDEM_OK, "%s", err.msg);
    static const int ks[] = {1, 3, 0};
    uint64_t drafted = 0, accepted = 0;
    for (int p = 0; p < 3; p++) {
        int32_t prompt[12];
        random_tokens(prompt, 12, t->hp.n_vocab, tc->seed * 100 + (uint64_t)p);
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 40; /* past the window of 8 and the first KV block */
        gp.spec_ngram = 0;
        tandem_result want;
        cr_assert_eq(tdm_generate_one(plain, prompt, 12, &gp, &want, &err), TANDEM_OK, "%s", err.msg);
        for (size_t i = 0; i < TDM_ARRAY_LEN(ks); i++) {
            gp.spec_k = ks[i];
            tandem_result got;
            cr_assert_eq(tdm_generate_one(spec, prompt, 12, &gp, &got, &err), TANDEM_OK, "%s", err.msg);
            size_t diff = 0;
            while (diff < got.n_tokens && diff < want.n_tokens && got.tokens[diff] == want.tokens[diff]) diff++;
            cr_assert(got.n_tokens == want.n_tokens && diff == want.n_tokens,
                      "%s prompt %d k=%d: differs from target-only at token %zu (lengths %zu / %zu)", what, p, ks[i],
                      diff, got.n_tokens, want.n_tokens);
            cr_assert_eq(tdm_kv_pool_n_free(spec->pool), tdm_kv_pool_n_blocks(spec->pool), "%s: KV blocks leaked", what);
            drafted += got.spec.drafted;
            accepted += got.spec.accepted;
            tandem_result_free(&got);
        }
        tandem_result_free(&want);
    }
    cr_log_info("%s: %llu of %llu drafted tokens accepted", what, (unsigned long long)accepted,
                (unsigned long long)drafted);
    cr_assert_gt(drafted, 0, "%s: nothing was drafted", what);
    cr_assert_gt(accepted, 0, "%s: no draft token was accepted", what);
    tdm_engine_free(plain);
    tdm_engine_free(spec);
    tdm_model_free(t);
    tdm_model_free(d);
    tdm_backend_destroy(wbe);
    unlink(tp);
    unlink(dp);
    free(tp);
    free(dp);
}

Test(arch, speculative_equals_target_only, .timeout = 180) {
    tdm_tiny_cfg g = gemma3_cfg(290);
    g.final_softcap = 2.0f;
    check_spec_pair(&g, 6, "gemma3");
    tdm_tiny_cfg q = qwen3_cfg(291);
    q.n_layer = 3;
    check_spec_pair(&q, 1, "qwen3");
}

/* The same with mixture-of-experts targets (and drafts: their first layer). */
Test(arch, speculative_moe_equals_target_only, .timeout = 180) {
    tdm_tiny_cfg q = qwen3moe_cfg(292);
    q.n_layer = 3;
    check_spec_pair(&q, 1, "qwen3moe");
    tdm_tiny_cfg m = mixtral_cfg(293);
    check_spec_pair(&m, 1, "mixtral");
}
