/* test_moe.c - mixture-of-experts models (qwen3moe, and llama with experts:
 * Mixtral) on the CPU, on tiny random-weight models (tests/tiny_model.c) against
 * the independent double-precision reference forward (tests/ref_forward.c):
 *   the router (moe.h) on hand-made logits: softmax, top k, renormalised weights,
 *   ties to the lower expert index, non-finite logits;
 *   qwen3moe and Mixtral in f32, f16, q8_0 and q4_k, gate and up experts of
 *   different types, every expert tied (a zero router);
 *   mutation checks that the comparison sees a wrong number of experts per row or a
 *   wrong tie rule; batch invariance (one forward, chunks of 7 rows, one row at a
 *   time: the same bits);
 *   every way an expert tensor or key can be wrong, enumerated, each a clear error
 *   naming the tensor or key; a backend without host memory and without the
 *   device routing op, and a split between devices, refused with
 *   TANDEM_ERR_UNSUPPORTED; decode_bytes;
 *   the CPU's moe_experts op bit for bit against the op-by-op path, every weight type;
 *   continuous batching (with and without a speculating draft) equal to one at a time.
 * (Speculative decoding with an MoE target: test_arch.c.) */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend_testutil.h"
#include "dtype.h"
#include "fwd_testutil.h"
#include "tandem.h"
#include "moe.h"
#include "ref_forward.h"
#include "testutil.h"
#include "tiny_model.h"
#include "tp.h"

/* ------------------------------------------------------------ the router */

static void route(const float *logits, int32_t n, int32_t k, int32_t *ids, float *w) {
    for (int32_t j = 0; j < k; j++) ids[j] = -7, w[j] = -7;
    tdm_moe_route(logits, n, k, ids, w);
}

Test(moe, route_topk_and_weights) {
    int32_t ids[8];
    float w[8];
    /* softmax (1, 2, 4) / 7 over logits 0, ln 2, ln 4; the top 2 renormalised: 4/6, 2/6 */
    const float l3[3] = {0.0f, logf(2.0f), logf(4.0f)};
    route(l3, 3, 2, ids, w);
    cr_assert(ids[0] == 2 && ids[1] == 1, "top 2 of (0, ln 2, ln 4): %d %d", ids[0], ids[1]);
    cr_assert_float_eq(w[0], 4.0f / 6.0f, 1e-6f, "weight %g", w[0]);
    cr_assert_float_eq(w[1], 2.0f / 6.0f, 1e-6f, "weight %g", w[1]);
    /* k = n: every expert, most probable first, weights the softmax itself */
    route(l3, 3, 3, ids, w);
    cr_assert(ids[0] == 2 && ids[1] == 1 && ids[2] == 0);
    cr_assert_float_eq(w[2], 1.0f / 7.0f, 1e-6f, "weight %g", w[2]);
    /* k = 1: weight 1 whatever the probability */
    route(l3, 3, 1, ids, w);
    cr_assert(ids[0] == 2 && w[0] == 1.0f, "k = 1: %d %g", ids[0], w[0]);
    /* large logits do not overflow (the largest is subtracted) */
    const float big[4] = {1000.0f, 999.0f, -1000.0f, 998.0f};
    route(big, 4, 2, ids, w);
    cr_assert(ids[0] == 0 && ids[1] == 1 && isfinite(w[0]) && isfinite(w[1]));
    cr_assert_float_eq(w[0], 1.0f / (1.0f + expf(-1.0f)), 1e-6f, "weight %g", w[0]);
}

Test(moe, route_ties_to_lower_index) {
    int32_t ids[8];
    float w[8];
    const float l4[4] = {1.0f, 3.0f, 3.0f, 2.0f}; /* the tie is the top pair */
    route(l4, 4, 1, ids, w);
    cr_assert_eq(ids[0], 1, "tie at the top: expert %d", ids[0]);
    route(l4, 4, 2, ids, w);
    cr_assert(ids[0] == 1 && ids[1] == 2 && w[0] == 0.5f && w[1] == 0.5f);
    const float l5[5] = {0.5f, 2.0f, 1.0f, 0.0f, 1.0f}; /* the tie at the boundary of k = 2 */
    route(l5, 5, 2, ids, w);
    cr_assert(ids[0] == 1 && ids[1] == 2, "tie at the boundary: %d %d", ids[0], ids[1]);
    /* 128 equal logits (Qwen3-30B-A3B's count), k = 8: experts 0..7 at 1/8 each */
    float eq[128];
    for (int i = 0; i < 128; i++) eq[i] = -0.25f;
    route(eq, 128, 8, ids, w);
    for (int j = 0; j < 8; j++) cr_assert(ids[j] == j && w[j] == 0.125f, "slot %d: expert %d weight %g", j, ids[j], w[j]);
    /* ties past 64 experts (a second word of the taken set) */
    eq[100] = eq[70] = 5.0f;
    route(eq, 128, 3, ids, w);
    cr_assert(ids[0] == 70 && ids[1] == 100 && ids[2] == 0, "%d %d %d", ids[0], ids[1], ids[2]);
}

Test(moe, route_nonfinite_logits) {
    int32_t ids[4];
    float w[4];
    const float cases[][4] = {{NAN, 1, 2, 3}, {1, NAN, NAN, 0}, {INFINITY, 0, 1, 2}, {-INFINITY, -INFINITY, -INFINITY, -INFINITY}};
    for (size_t c = 0; c < TDM_ARRAY_LEN(cases); c++) {
        route(cases[c], 4, 3, ids, w);
        for (int j = 0; j < 3; j++) {
            cr_assert(ids[j] >= 0 && ids[j] < 4, "case %zu slot %d: expert %d", c, j, ids[j]);
            for (int i = 0; i < j; i++) cr_assert_neq(ids[i], ids[j], "case %zu: expert %d twice", c, ids[j]);
        }
        bool bad = false;
        for (int j = 0; j < 3; j++) bad |= !isfinite(w[j]);
        cr_assert(bad, "case %zu: non-finite logits gave finite weights", c);
    }
}

/* ------------------------------------------------------------ against the reference */

Test(moe, qwen3moe_matches_reference, .timeout = 120) {
    tdm_tiny_cfg c = qwen3moe_cfg(500);
    check_case("qwen3moe f32", &c, TOL_F32);
    c.seed = 501;
    c.wtype = TDM_F16;
    c.exp_up_type = TDM_BF16; /* gate and up of different types: fused as f16 (exactly, here) */
    check_case("qwen3moe f16 + bf16 up", &c, type_tol(TDM_F16));
    c.seed = 502;
    c.wtype = TDM_Q8_0;
    c.exp_up_type = 0;
    check_case("qwen3moe q8_0", &c, type_tol(TDM_Q8_0));
}

/* K-quants need rows of 256: n_embd and the experts' features 256.  Their products
 * round the activations to int8 (fwd_testutil.h), enough to flip a close routing
 * decision against the exact reference (an O(1) difference): a zero router, every
 * expert used at 1 / 8, reads every expert's blocks without any decision to flip. */
Test(moe, qwen3moe_kquants, .timeout = 180) {
    tdm_tiny_cfg c = qwen3moe_cfg(510);
    c.zero_router = true;
    c.n_expert_used = c.n_expert;
    c.n_embd = 256;
    c.n_ff = 256;
    c.n_head = 4;
    c.head_dim = 64;
    c.wtype = TDM_Q4_K;
    c.ffn_down_type = TDM_Q6_K;
    c.attn_v_type = TDM_Q6_K; /* (Q4_K_M's mix: q, k and v kept apart on the CPU) */
    check_case("qwen3moe q4_k, q6_k v and down", &c, type_tol(TDM_Q4_K));
}

Test(moe, mixtral_matches_reference, .timeout = 120) {
    tdm_tiny_cfg c = mixtral_cfg(520);
    check_case("mixtral f32", &c, TOL_F32);
    c.seed = 521;
    c.wtype = TDM_BF16;
    c.n_expert_used = 1;
    check_case("mixtral bf16, 1 expert per row", &c, type_tol(TDM_BF16));
    c.seed = 522;
    c.wtype = TDM_F32;
    c.n_expert_used = 4; /* every expert */
    check_case("mixtral f32, every expert", &c, TOL_F32);
}

/* A zero router: every logit 0, every row ties over all experts; both sides take
 * the lowest k at 1 / k each. */
Test(moe, every_expert_tied, .timeout = 120) {
    tdm_tiny_cfg c = qwen3moe_cfg(530);
    c.zero_router = true;
    c.n_expert_used = 3;
    check_case("qwen3moe, zero router", &c, TOL_F32);
}

/* The comparison is sharp: a reference with one expert per row less, or with ties
 * to the higher index, disagrees. */
Test(moe, comparison_detects_wrong_routing, .timeout = 120) {
    tdm_tiny_cfg c = qwen3moe_cfg(540);
    cmp k;
    cmp_open(&k, &c, "qwen3moe");
    k.rm.K = 1;
    cmp_expect_far(&k, "with 1 expert per row", 1e-2);
    cmp_close(&k);

    /* ties: a zero router, the reference's experts renumbered n-1-e (its lowest
     * indices are the engine's highest) */
    c = qwen3moe_cfg(542);
    c.zero_router = true;
    cmp_open(&k, &c, "qwen3moe, zero router");
    const ref_model *rm = &k.rm;
    const size_t per[3] = {(size_t)rm->F * rm->E, (size_t)rm->F * rm->E, (size_t)rm->E * rm->F};
    for (int l = 0; l < rm->L; l++) {
        float *mats[3] = {rm->layers[l].wg, rm->layers[l].wu, rm->layers[l].wd};
        for (int m = 0; m < 3; m++)
            for (int e = 0; e < rm->NE / 2; e++) {
                float *a = mats[m] + (size_t)e * per[m], *b = mats[m] + (size_t)(rm->NE - 1 - e) * per[m];
                for (size_t i = 0; i < per[m]; i++) {
                    const float t = a[i];
                    a[i] = b[i];
                    b[i] = t;
                }
            }
    }
    cmp_expect_far(&k, "breaking ties to the higher index", 1e-2);
    cmp_close(&k);
}

Test(moe, batch_invariance, .timeout = 180) {
    tdm_tiny_cfg q = qwen3moe_cfg(550);
    check_batch_invariance(&q, "qwen3moe");
    tdm_tiny_cfg m = mixtral_cfg(551);
    m.wtype = TDM_Q8_0;
    check_batch_invariance(&m, "mixtral q8_0");
}

/* ------------------------------------------------------------ refusals */

typedef struct bad_case {
    const char *what;
    void (*edit)(tdm_tiny_cfg *c);
    tandem_status want;
    const char *names; /* what the message must contain */
} bad_case;

static void e_skip_gate(tdm_tiny_cfg *c) { c->skip_tensor = "blk.1.ffn_gate_exps.weight"; }
static void e_skip_router(tdm_tiny_cfg *c) { c->skip_tensor = "blk.0.ffn_gate_inp.weight"; }
static void e_skip_down(tdm_tiny_cfg *c) { c->skip_tensor = "blk.0.ffn_down_exps.weight"; }
static void e_shape_up(tdm_tiny_cfg *c) { c->bad_shape_tensor = "blk.0.ffn_up_exps.weight"; }
static void e_shape_down(tdm_tiny_cfg *c) { c->bad_shape_tensor = "blk.1.ffn_down_exps.weight"; }
static void e_shape_router(tdm_tiny_cfg *c) { c->bad_shape_tensor = "blk.0.ffn_gate_inp.weight"; }
static void e_extra_expert(tdm_tiny_cfg *c) { c->extra_expert_tensor = "blk.0.ffn_gate_exps.weight"; }
static void e_flat(tdm_tiny_cfg *c) { c->flat_tensor = "blk.1.ffn_up_exps.weight"; }
static void e_used_over(tdm_tiny_cfg *c) { c->n_expert_used = c->n_expert + 1; }
static void e_used_zero(tdm_tiny_cfg *c) { c->n_expert_used = 0; }
static void e_used_missing(tdm_tiny_cfg *c) { c->no_expert_used_key = true; }
static void e_count_huge(tdm_tiny_cfg *c) { c->n_expert = 513; }
static void e_dense_qwen3moe(tdm_tiny_cfg *c) { c->n_expert = 0; }
static void e_experts_on_qwen3(tdm_tiny_cfg *c) { c->arch = "qwen3"; }
static void e_dense_tensors(tdm_tiny_cfg *c) { c->arch = "llama"; c->n_expert = 0; }

static const bad_case bad_cases[] = {
    {"gate experts missing", e_skip_gate, TANDEM_ERR_FORMAT, "blk.1.ffn_gate_exps.weight"},
    {"router missing", e_skip_router, TANDEM_ERR_FORMAT, "blk.0.ffn_gate_inp.weight"},
    {"down experts missing", e_skip_down, TANDEM_ERR_FORMAT, "blk.0.ffn_down_exps.weight"},
    {"up experts one row more", e_shape_up, TANDEM_ERR_FORMAT, "blk.0.ffn_up_exps.weight"},
    {"down experts one row more", e_shape_down, TANDEM_ERR_FORMAT, "blk.1.ffn_down_exps.weight"},
    {"router one row more", e_shape_router, TANDEM_ERR_FORMAT, "blk.0.ffn_gate_inp.weight"},
    {"one expert more", e_extra_expert, TANDEM_ERR_FORMAT, "blk.0.ffn_gate_exps.weight"},
    {"experts as a 2-D tensor", e_flat, TANDEM_ERR_FORMAT, "blk.1.ffn_up_exps.weight"},
    {"expert_used_count over expert_count", e_used_over, TANDEM_ERR_FORMAT, "expert_used_count"},
    {"expert_used_count 0", e_used_zero, TANDEM_ERR_FORMAT, "expert_used_count"},
    {"expert_used_count missing", e_used_missing, TANDEM_ERR_FORMAT, "expert_used_count"},
    {"expert_count over 512", e_count_huge, TANDEM_ERR_FORMAT, "expert_count"},
    {"qwen3moe without experts", e_dense_qwen3moe, TANDEM_ERR_FORMAT, "expert_count"},
    {"experts in a qwen3 file", e_experts_on_qwen3, TANDEM_ERR_UNSUPPORTED, "expert_count"},
};

static tandem_status load_status(const tdm_tiny_cfg *c, tdm_err *err) {
    char *path = tdm_tiny_model_file(c);
    tdm_backend *be;
    cr_assert_eq(tdm_backend_cpu_create(1, &be, err), TANDEM_OK);
    tdm_model *m = NULL;
    tandem_status st = tdm_model_load(path, be, &m, err);
    tdm_model_free(m);
    tdm_backend_destroy(be);
    unlink(path);
    free(path);
    return st;
}

Test(moe, corrupt_experts_refused, .timeout = 120) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(bad_cases); i++) {
        const bad_case *b = &bad_cases[i];
        tdm_tiny_cfg c = qwen3moe_cfg(560 + i);
        b->edit(&c);
        tdm_err err = {0};
        tandem_status st = load_status(&c, &err);
        cr_log_info("%s: %s", b->what, err.msg);
        cr_assert_eq(st, b->want, "%s: status %s (%s), want %s", b->what, tandem_status_str(st), err.msg,
                     tandem_status_str(b->want));
        cr_assert(strstr(err.msg, b->names), "%s: the message '%s' does not name %s", b->what, err.msg, b->names);
    }
    /* the same file shapes load when nothing is wrong (the cases fail for their edit) */
    tdm_tiny_cfg ok = qwen3moe_cfg(599);
    tdm_err err = {0};
    cr_assert_eq(load_status(&ok, &err), TANDEM_OK, "%s", err.msg);
    ok = mixtral_cfg(598);
    cr_assert_eq(load_status(&ok, &err), TANDEM_OK, "%s", err.msg);
    e_dense_tensors(&ok); /* a dense llama still loads */
    cr_assert_eq(load_status(&ok, &err), TANDEM_OK, "%s", err.msg);
}

/* A file cut short inside its last expert tensor: the GGUF reader refuses it. */
Test(moe, truncated_experts_refused) {
    tdm_tiny_cfg c = mixtral_cfg(570);
    char *path = tdm_tiny_model_file(&c);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    cr_assert_eq(truncate(path, n - 100), 0);
    tdm_backend *be;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(1, &be, &err), TANDEM_OK);
    tdm_model *m = NULL;
    tandem_status st = tdm_model_load(path, be, &m, &err);
    cr_assert_eq(st, TANDEM_ERR_FORMAT, "status %s: %s", tandem_status_str(st), err.msg);
    cr_assert(strstr(err.msg, "ffn_down_exps") || strstr(err.msg, "output"), "message: %s", err.msg);
    cr_log_info("truncated: %s", err.msg);
    tdm_backend_destroy(be);
    unlink(path);
    free(path);
}

/* A backend whose memory is not the host's and that has no moe_route op refuses
 * the model with TANDEM_ERR_UNSUPPORTED naming the mixture of experts and the
 * backend, at load and at each forward; so does a split between devices.  (The
 * CUDA backend routes on the device: test_cuda_moe.c.) */
Test(moe, other_backends_and_splits_refused) {
    tdm_tiny_cfg c = qwen3moe_cfg(580);
    eng x;
    eng_open(&x, &c, 0);
    tdm_backend fake = *x.wbe;
    fake.host_memory = false;
    tdm_err err = {0};
    cr_assert_eq(tdm_model_check_backend(x.m, &fake, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "mixture of experts") && strstr(err.msg, "cpu"), "message: %s", err.msg);
    cr_assert_eq(tdm_model_check_backend(x.m, x.wbe, &err), TANDEM_OK);
    cr_assert_eq(tdm_tp_check(&x.m->hp, 2, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "mixture-of-experts"), "message: %s", err.msg);
    cr_assert_eq(tdm_tp_check(&x.m->hp, 1, &err), TANDEM_OK, "%s", err.msg);
    eng_close(&x);
}

/* tandem_model_info.decode_bytes counts the router and expert_used_count experts of
 * each layer (what a decode step reads), not every expert. */
Test(moe, decode_bytes_count_the_used_experts) {
    tdm_tiny_cfg c = qwen3moe_cfg(590);
    char *path = tdm_tiny_model_file(&c);
    tandem_model_params mp = tandem_model_default_params();
    tandem_model *m;
    cr_assert_eq(tandem_model_open(path, &mp, &m), TANDEM_OK);
    tandem_model_info inf;
    cr_assert_eq(tandem_model_get_info(m, &inf), TANDEM_OK);
    const uint64_t E = 64, V = 48, L = 2, qd = 4 * 32, kvd = 2 * 32, F = 32, NE = 8, K = 2; /* f32 weights */
    const uint64_t layer = ((qd + 2 * kvd) * E + E * qd + NE * E + K * 3 * F * E) * 4;
    const uint64_t want = E * 4 + V * E * 4 + (2 * L + 1) * E * 4 + L * layer;
    cr_assert_eq(inf.decode_bytes, want, "decode_bytes %llu, want %llu", (unsigned long long)inf.decode_bytes,
                 (unsigned long long)want);
    cr_assert_lt(inf.decode_bytes, inf.weight_bytes);
    tandem_model_close(m);
    unlink(path);
    free(path);
}

/* ------------------------------------------------------------ the CPU's moe_experts op */

/* The op against the op-by-op path (tdm_fwd_moe_by_ops, its reference): the same
 * bits for every weight type the experts come in, batches of 1 to 40 rows, 2 and 3
 * threads; a batch of fewer groups of rows than threads is declined untouched. */
Test(moe, cpu_op_matches_ops_bitwise, .timeout = 120) {
    static const uint32_t types[] = {TDM_F32, TDM_F16, TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};
    enum { E = 256, F = 256, NE = 6, K = 2, N = 40 };
    uint64_t rng = 77;
    float *x = malloc((size_t)N * E * sizeof(float)), *got = malloc((size_t)N * E * sizeof(float)),
          *want = malloc((size_t)N * E * sizeof(float));
    for (int i = 0; i < N * E; i++) x[i] = tdm_test_randf(&rng, -1.0f, 1.0f);
    int32_t ids[N * K];
    float w[N * K];
    for (int threads = 2; threads <= 3; threads++) {
        tdm_backend *be;
        tdm_err err = {0};
        cr_assert_eq(tdm_backend_cpu_create(threads, &be, &err), TANDEM_OK, "%s", err.msg);
        tdm_hparams hp = {.n_embd = E, .n_ff = F, .n_head = 1, .n_head_kv = 1, .head_dim = 64, .n_expert = NE,
                          .n_expert_used = K};
        tdm_fwd_scratch s = {0};
        cr_assert_eq(tdm_fwd_scratch_reserve(&s, be, &hp, N, &err), TANDEM_OK, "%s", err.msg);
        for (size_t ti = 0; ti < TDM_ARRAY_LEN(types); ti++) {
            tdm_weight w13[NE], w2[NE];
            void *bufs[2 * NE];
            for (int e = 0; e < NE; e++) {
                w13[e] = tdm_test_rand_weight_for(be, types[ti], 2 * F, E, &rng, &bufs[2 * e], NULL);
                w2[e] = tdm_test_rand_weight_for(be, types[ti], E, F, &rng, &bufs[2 * e + 1], NULL);
            }
            static const int ns[] = {1, 3, 17, N};
            for (size_t ni = 0; ni < TDM_ARRAY_LEN(ns); ni++) {
                const int n = ns[ni];
                for (int i = 0; i < n; i++) { /* two distinct experts, mostly 0 and 3 (groups of 16 fill) */
                    ids[i * K] = (int32_t)(tdm_test_rand(&rng) % 3 == 0 ? tdm_test_rand(&rng) % NE : 3);
                    do ids[i * K + 1] = (int32_t)(tdm_test_rand(&rng) % NE);
                    while (ids[i * K + 1] == ids[i * K]);
                    w[i * K] = tdm_test_randf(&rng, 0.1f, 0.9f);
                    w[i * K + 1] = 1.0f - w[i * K];
                }
                tdm_moe_args a = {.x = x, .n = n, .n_embd = E, .n_ff = F, .n_expert = NE, .k = K, .ids = ids, .w = w,
                                  .w13 = w13, .w2 = w2, .out = got};
                memset(got, 0xff, (size_t)N * E * sizeof(float));
                tandem_status st = be->ops->moe_experts(be, &a, &err);
                a.out = want;
                cr_assert_eq(tdm_fwd_moe_by_ops(be, &s, &a, &err), TANDEM_OK, "%s", err.msg);
                if (st == TANDEM_ERR_UNSUPPORTED) {
                    cr_assert(n * K <= 16 * threads, "%s, %d rows, %d threads: declined", tdm_dtype_name(types[ti]),
                              n, threads);
                    uint32_t u;
                    memcpy(&u, got, sizeof u);
                    cr_assert_eq(u, 0xffffffffu, "a declined batch was touched");
                    continue;
                }
                cr_assert_eq(st, TANDEM_OK, "%s", err.msg);
                for (int i = 0; i < n * E; i++)
                    cr_assert(memcmp(&got[i], &want[i], sizeof(float)) == 0,
                              "%s, %d rows, %d threads: row %d column %d: op %.9g, ops %.9g",
                              tdm_dtype_name(types[ti]), n, threads, i / E, i % E, got[i], want[i]);
            }
            for (int e = 0; e < 2 * NE; e++) free(bufs[e]);
        }
        /* more than 64 experts per row: declined (the ops take them) */
        tdm_moe_args many = {.x = x, .n = 1, .n_embd = E, .n_ff = F, .n_expert = 100, .k = 65, .ids = ids, .w = w,
                             .w13 = NULL, .w2 = NULL, .out = got};
        static tdm_weight none[100];
        many.w13 = many.w2 = none;
        cr_assert_eq(be->ops->moe_experts(be, &many, &err), TANDEM_ERR_UNSUPPORTED);
        tdm_fwd_scratch_free(&s);
        tdm_backend_destroy(be);
    }
    free(x);
    free(got);
    free(want);
}

/* ------------------------------------------------------------ batches */

/* Continuous batching over an MoE target: six greedy requests batched (their decode
 * steps of several rows go through the moe_experts op), with and without an MoE
 * draft speculating in the batch, give each request's tokens alone. */
Test(moe, batch_equals_one_at_a_time, .timeout = 180) {
    tdm_tiny_cfg tc = qwen3moe_cfg(600), dc = tc;
    tc.n_layer = 3;
    dc.n_layer = 1; /* (the target's first layer) */
    char *tp = tdm_tiny_model_file(&tc), *dp = tdm_tiny_model_file(&dc);
    tandem_model *t, *d;
    cr_assert_eq(tandem_model_open(tp, NULL, &t), TANDEM_OK, "%s", tandem_last_error());
    cr_assert_eq(tandem_model_open(dp, NULL, &d), TANDEM_OK, "%s", tandem_last_error());
    enum { N = 6 };
    int32_t prompts[N][10];
    tandem_request r[N];
    for (int i = 0; i < N; i++) {
        random_tokens(prompts[i], 10, tc.n_vocab, 610 + (uint64_t)i);
        r[i] = tandem_request_default();
        r[i].prompt_ids = prompts[i];
        r[i].n_prompt_ids = 10;
        r[i].params.max_tokens = 24;
        r[i].params.spec_ngram = 0;
        r[i].params.spec_k = 3; /* (a fixed length: the batch speculates whatever its costs) */
    }
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    tandem_engine *e;
    cr_assert_eq(tandem_engine_open(t, NULL, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
    tandem_result alone[N];
    for (int i = 0; i < N; i++)
        cr_assert_eq(tandem_generate_ids(e, prompts[i], 10, &r[i].params, &alone[i]), TANDEM_OK, "%s",
                     tandem_last_error());
    tandem_engine_close(e);
    ep.n_seq_max = N;
    for (int with_draft = 0; with_draft < 2; with_draft++) {
        cr_assert_eq(tandem_engine_open(t, with_draft ? d : NULL, &ep, &e), TANDEM_OK, "%s", tandem_last_error());
        tandem_result got[N];
        cr_assert_eq(tandem_generate_batch(e, r, N, got), TANDEM_OK, "%s", tandem_last_error());
        uint64_t accepted = 0;
        for (int i = 0; i < N; i++) {
            cr_assert(got[i].n_tokens == alone[i].n_tokens &&
                          !memcmp(got[i].tokens, alone[i].tokens, alone[i].n_tokens * sizeof(int32_t)),
                      "request %d %s: batched tokens differ from alone", i, with_draft ? "with a draft" : "target only");
            accepted += got[i].spec.accepted;
            tandem_result_free(&got[i]);
        }
        cr_assert(!with_draft || accepted > 0, "the batch's sequences speculated nothing");
        tandem_engine_close(e);
    }
    for (int i = 0; i < N; i++) tandem_result_free(&alone[i]);
    tandem_model_close(d);
    tandem_model_close(t);
    unlink(tp);
    unlink(dp);
    free(tp);
    free(dp);
}
