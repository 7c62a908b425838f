/* nonfinite_testutil.c - planted NaN / infinity weights are a model error (see the header). */
#include "nonfinite_testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "testutil.h"
#include "tiny_model.h"

/* The weights of layer 0 (the fault must cross the later layers to reach the logits),
 * one of layer 1, the output norm and the heads: the tied one (token_embd, token 0's
 * row) and a separate output.weight.  llama runs the fused blocks; its q8_0 matrices
 * take the integer-dot path (a NaN norm weight makes the activations they quantise
 * NaN; a planted matrix value is its first block's scale), its f16 ones the 16-bit
 * products (on the GPU's tensor cores activations are split into f16 parts); qwen2
 * adds biases; gemma3
 * runs op by op (GeGLU, post norms, q / k norms, a sliding window) with both
 * soft-caps, whose tanh must not cap an infinity. */
typedef struct nf_case {
    const char *arch;
    uint32_t wtype;
    const char *const *tensors; /* NULL-terminated */
} nf_case;

static const char *const llama_f32[] = {
    "blk.0.attn_norm.weight", "blk.0.attn_q.weight",    "blk.0.attn_k.weight", "blk.0.attn_v.weight",
    "blk.0.attn_output.weight", "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
    "blk.0.ffn_down.weight",  "blk.1.attn_q.weight",    "output_norm.weight",  "token_embd.weight",
    "output.weight",          NULL,
};
static const char *const llama_q8[] = {"blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                                       "blk.0.ffn_down.weight",  "token_embd.weight",   "output.weight",
                                       NULL};
static const char *const llama_f16[] = {"blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.ffn_norm.weight",
                                        "blk.0.ffn_down.weight", "output_norm.weight", NULL};
static const char *const qwen2[] = {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias",
                                    "blk.0.attn_q.weight", "output_norm.weight", NULL};
static const char *const gemma3[] = {
    "blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.0.post_attention_norm.weight",
    "blk.0.post_ffw_norm.weight", "blk.0.attn_q.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight",
    "output_norm.weight", "token_embd.weight", NULL,
};
/* (a zero router: every token takes experts 0 and 1, so the planted first value is read) */
static const char *const qwen3moe[] = {"blk.0.ffn_norm.weight", "blk.0.ffn_gate_exps.weight",
                                       "blk.0.ffn_up_exps.weight", "blk.1.ffn_down_exps.weight", NULL};
static const nf_case cases[] = {
    {"llama", TDM_F32, llama_f32},
    {"qwen3moe", TDM_F32, qwen3moe},
    {"llama", TDM_Q8_0, llama_q8},
    {"llama", TDM_F16, llama_f16},
    {"qwen2", TDM_F32, qwen2},
    {"gemma3", TDM_F32, gemma3},
};

/* The opened models' settings. */
typedef struct nf_run {
    const char *where; /* the backend (and level), for messages */
    const tandem_model_params *mp;
    int32_t head_dim, n_prompt;
} nf_run;

/* A tiny model of the case (seed: target 1, draft 5) with value planted in tensor
 * (NULL: a sound one); *file: its base name.  The model keeps the file mapped; it is
 * unlinked here. */
static tandem_model *open_tiny(const nf_run *run, const nf_case *k, uint64_t seed, const char *tensor, float value,
                               char *file, size_t cap) {
    tdm_tiny_cfg c = tdm_tiny_default();
    c.arch = k->arch;
    c.wtype = k->wtype;
    c.seed = seed;
    c.head_dim = run->head_dim;
    if (strcmp(k->arch, "qwen3moe") == 0) {
        c.n_expert = 4;
        c.n_expert_used = 2;
        c.zero_router = true;
    }
    if (strcmp(k->arch, "gemma3") == 0) {
        c.n_layer = 6;
        c.sliding_window = 8;
        c.attn_softcap = 1.0f;
        c.final_softcap = 2.0f;
    }
    c.nan_tensor = tensor;
    c.nan_value = value;
    c.untied_output = tensor && strcmp(tensor, "output.weight") == 0;
    char *path = tdm_tiny_model_file(&c);
    snprintf(file, cap, "%s", strrchr(path, '/') + 1);
    tandem_model *m = NULL;
    cr_assert_eq(tandem_model_open(path, run->mp, &m), TANDEM_OK, "%s %s: %s", k->arch, tensor, tandem_last_error());
    unlink(path);
    free(path);
    return m;
}

static tandem_engine *open_engine(tandem_model *t, tandem_model *d) {
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = 2;
    tandem_engine *e = NULL;
    cr_assert_eq(tandem_engine_open(t, d, &ep, &e), TANDEM_OK, "engine: %s", tandem_last_error());
    return e;
}

static void prompt_ids(const nf_run *run, int32_t *ids) {
    for (int32_t i = 0; i < run->n_prompt; i++) ids[i] = 1 + i % 15; /* (not token 0: its embedding may be the
                                                                          planted one) */
}

/* Generation on t (+ d) fails with TANDEM_ERR_FORMAT "non-finite logits" naming role
 * and file, and returns no tokens: greedy, sampled and, with a draft, greedy trees. */
static void expect_error(const nf_run *run, tandem_model *t, tandem_model *d, const char *role, const char *file,
                         const char *what) {
    tandem_engine *e = open_engine(t, d);
    int32_t ids[64];
    prompt_ids(run, ids);
    for (int mode = 0; mode < (d ? 3 : 2); mode++) {
        tandem_generate_params gp = tandem_generate_default_params();
        gp.max_tokens = 8;
        gp.temperature = mode == 1 ? 0.8f : 0.0f;
        gp.spec_tree = mode == 2 ? 4 : 0;
        if (d) gp.spec_k = 2; /* (the draft proposes at every step: the length controller would
                                 measure plain steps first, and lookups may win every step of a short text) */
        tandem_result r;
        tandem_status st = tandem_generate_ids(e, ids, (size_t)run->n_prompt, &gp, &r);
        const char *msg = tandem_last_error();
        cr_assert_eq(st, TANDEM_ERR_FORMAT, "%s (%s%s, mode %d): status %d, %zu tokens (%s)", what, role,
                     d ? " + draft" : "", mode, (int)st, r.n_tokens, msg);
        cr_assert(strstr(msg, "non-finite logits") && strstr(msg, role) && strstr(msg, file),
                  "%s (mode %d): message '%s' should name the %s %s", what, mode, msg, role, file);
        cr_assert_null(r.tokens);
        tandem_result_free(&r);
    }
    tandem_engine_close(e);
}

static void check_case(const nf_run *run, const nf_case *k) {
    char tf[64], df[64], bf[64];
    tandem_model *good_t = open_tiny(run, k, 1, NULL, 0, tf, sizeof tf);
    tandem_model *good_d = open_tiny(run, k, 5, NULL, 0, df, sizeof df);
    static const float values[] = {NAN, INFINITY};
    for (size_t v = 0; v < TDM_ARRAY_LEN(values); v++)
        for (const char *const *t = k->tensors; *t; t++) {
            char what[160];
            snprintf(what, sizeof what, "%s %s (%s): %s in %s", k->arch, tdm_dtype_name(k->wtype),
                     run->where, isnan(values[v]) ? "NaN" : "inf", *t);
            tandem_model *bad = open_tiny(run, k, 1, *t, values[v], bf, sizeof bf);
            expect_error(run, bad, NULL, "target model", bf, what);
            expect_error(run, bad, good_d, "target model", bf, what);
            tandem_model_close(bad);
            bad = open_tiny(run, k, 5, *t, values[v], bf, sizeof bf);
            expect_error(run, good_t, bad, "draft model", bf, what);
            tandem_model_close(bad);
        }
    tandem_engine *e = open_engine(good_t, good_d);
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 8;
    tandem_result r;
    int32_t ids[64];
    prompt_ids(run, ids);
    cr_assert_eq(tandem_generate_ids(e, ids, (size_t)run->n_prompt, &gp, &r), TANDEM_OK, "%s: %s", k->arch,
                 tandem_last_error());
    cr_assert_eq(r.n_tokens, 8);
    tandem_result_free(&r);
    tandem_engine_close(e);
    tandem_model_close(good_d);
    tandem_model_close(good_t);
}

void tdm_nf_check_all(const char *where, const tandem_model_params *mp, int32_t head_dim, int32_t n_prompt) {
    cr_assert(n_prompt >= 1 && n_prompt <= 64);
    const nf_run run = {where, mp, head_dim, n_prompt};
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++)
        if (strcmp(cases[i].arch, "qwen3moe") || !mp || mp->backend == TANDEM_BACKEND_CPU) /* (experts: the CPU) */
            check_case(&run, &cases[i]);
}
