/* kv_quality.h - how far greedy decoding with one KV cache type strays from another
 * (bench_kv; a short run in tests/test_kv_q8.c).
 *
 * For each prompt, the reference engine (ref_type) decodes n_gen greedy tokens,
 * keeping its logits at every step; the test engine (test_type) then runs the same
 * tokens (teacher forcing), so its logits at every step are compared in the same
 * context, and the first step whose argmax differs from the reference's token is
 * where the test engine's own greedy output would first depart.  A departure is a
 * near tie when the reference's top-two logit margin there is below tie_margin.
 * The same compares a model with FP8 weights against the stored ones (test_fp8).
 * Both engines are target-only, one prompt at a time, on the CPU or (cuda) the GPU. */
#ifndef TDM_KV_QUALITY_H
#define TDM_KV_QUALITY_H

#include "engine.h"

typedef struct kvq_opts {
    const char *model;        /* GGUF path */
    int threads;              /* CPU threads of each engine */
    tandem_kv_type ref_type;  /* the reference cache (e.g. TANDEM_KV_F16) */
    tandem_kv_type test_type; /* the cache under test (e.g. TANDEM_KV_Q8_0) */
    int prompt_tokens;        /* prompts cut to at most this many tokens (BOS included) */
    int n_gen;                /* greedy tokens per prompt, >= 1 */
    float tie_margin;         /* near tie: the reference's top-two margin below this */
    bool cuda;                /* the models (and so the engines) on the CUDA backend */
    bool test_fp8;            /* the test engine's model with FP8 weights (tandem_weights);
                                 the reference's as stored (bench_fp8) */
} kvq_opts;

typedef struct kvq_stats {
    int n_prompts;
    int n_equal;              /* the test engine's greedy output equals the reference's */
    int n_near_tie;           /* it departs first at a near tie */
    int n_other;              /* it departs first elsewhere */
    double worst_margin;      /* the largest reference margin at a first departure (0: none) */
    double logits_err;        /* ||L_test - L_ref|| / ||L_ref|| over every step of every prompt */
    double logits_err_max;    /* the largest error of one step */
    uint64_t bytes_per_token[2]; /* the caches' K/V bytes per position (ref, test), both models */
    uint64_t n_steps, n_agree;   /* teacher-forced steps, and those whose test argmax is the
                                    reference's token (top-1 agreement) */
    uint64_t prefix_sum;         /* the greedy outputs' common prefixes, summed (tokens) */
} kvq_stats;

/* Runs the comparison over prompts[0 .. n_prompts); false with err set on failure. */
bool kvq_run(const kvq_opts *o, char *const *prompts, int n_prompts, kvq_stats *st, tdm_err *err);

#endif
