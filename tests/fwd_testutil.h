/* fwd_testutil.h - the engine side of the forward-pass comparisons
 * (test_forward_ref.c, test_arch.c): engines over tiny models (tests/tiny_model.h),
 * their logits at every position, the normalised comparison against the reference
 * forward (tests/ref_forward.h), and batch invariance. */
#ifndef TDM_FWD_TESTUTIL_H
#define TDM_FWD_TESTUTIL_H

#include "engine.h"
#include "ref_forward.h"
#include "tiny_model.h"

#define N_TOK 40        /* prompt length: crosses KV blocks of 16 */
#define BLOCK_SIZE 16

typedef struct eng {
    char *path;
    tdm_backend *wbe;
    tdm_model *m;
    tdm_engine *e;
} eng;

/* An engine of `threads` threads over the model, with an f32 KV cache; tp: whether
 * its CPU backend may run the blocks tensor parallel (kernels/cpu/blocks.c). */
void eng_open_ex(eng *x, const tdm_tiny_cfg *cfg, int32_t prefill_chunk, int threads, bool tp);
/* Two threads, tensor parallel allowed, a KV cache of kv_type (tandem_kv_type). */
void eng_open_kv(eng *x, const tdm_tiny_cfg *cfg, int32_t kv_type);
/* Two threads, tensor parallel allowed. */
void eng_open(eng *x, const tdm_tiny_cfg *cfg, int32_t prefill_chunk);
void eng_close(eng *x);
/* Engine logits at every position: the last row of each prefix.  [n][V] */
float *eng_logits_prefixes(eng *x, const int32_t *tok, int n);
/* Engine logits at every position, feeding one row per forward.  [n][V] */
float *eng_logits_rowwise(eng *x, const int32_t *tok, int n);
void random_tokens(int32_t *tok, int n, int V, uint64_t seed);
/* Max over positions of ||a - b|| / ||b|| (b the reference); *worst: its position. */
double max_rel_err(const float *eng_l, const double *ref_l, int n, int V, int *worst);
/* Builds the model, runs the engine and the reference over N_TOK random tokens and
 * expects a normalised error below tol; returns the error. */
double check_case(const char *what, const tdm_tiny_cfg *cfg, double tol);
/* The same with a KV cache of kv_type (check_case: f32). */
double check_case_kv(const char *what, const tdm_tiny_cfg *cfg, double tol, int32_t kv_type);
/* Prefill in one forward, in chunks of 7 rows and one row at a time: bit-identical
 * logits at every position. */
void check_batch_invariance(const tdm_tiny_cfg *c, const char *what);

/* The CPU backend's tensor-parallel blocks with `threads` threads against the
 * reference, the op-by-op forward (to rounding) and themselves over batch shapes
 * (bit for bit); runs_rule: 1, the blocks op must run the model; 0, it must
 * decline; 2, it runs iff the weights are in the rows layout. */
void check_tp(const char *what, const tdm_tiny_cfg *cfg, int threads, int runs_rule);

/* An engine and the reference over one model (test_arch.c, test_moe.c), for checks
 * that a changed reference no longer agrees (the comparison is sharp). */
typedef struct cmp {
    eng x;
    ref_model rm;
    int32_t tok[N_TOK];
    float *got; /* [N_TOK][V] the engine's logits at every position */
} cmp;
/* Opens both sides and expects them to agree (to TOL_F32). */
void cmp_open(cmp *c, const tdm_tiny_cfg *cfg, const char *what);
/* The engine's logits against the reference as it now stands. */
double cmp_err(const cmp *c);
/* The error of a changed reference, which must exceed min. */
void cmp_expect_far(const cmp *c, const char *what, double min);
void cmp_close(cmp *c);

/* Tolerances: the engine computes in f32 (on the same dequantised weights), the
 * reference in double; the measured errors are ~5e-7 (the brief allows 1e-4). */
#define TOL_F32 2e-5
#define TOL_QUANT 2e-5
/* The integer-dot types (Q4_1 .. Q6_K) also round x to int8 per block in every
 * matmul (kernels/cpu/qdot.h, as llama.cpp does): half a step of a block's largest
 * |x| / 127 per input, large against heavy-tailed inputs (SwiGLU's); measured on
 * these models: 1.5-3.4 % with blocks of 32, 4-7.4 % with the K-quants' 256.  The
 * kernels themselves are checked to 1e-5 against the reference on the quantised x
 * (test_backend_ops); here the tolerance still catches any loading error (O(1)). */
#define TOL_QDOT32 5e-2
#define TOL_QDOTK 8e-2

double type_tol(uint32_t t);
/* The default tiny model with a vocabulary of 48 and this seed. */
tdm_tiny_cfg base_cfg(uint64_t seed);
/* Mixtures of experts over base_cfg: qwen3moe with 8 experts of 32 features, 2 per
 * row, heads of 32 (q 128 wide over n_embd 64); Mixtral's layout (llama with
 * experts) with 4 experts of 96 features, 2 per row, 3 layers. */
tdm_tiny_cfg qwen3moe_cfg(uint64_t seed);
tdm_tiny_cfg mixtral_cfg(uint64_t seed);

#endif
