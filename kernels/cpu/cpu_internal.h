/* cpu_internal.h - private declarations of the CPU backend (kernels/cpu).
 *
 * The backend picks a SIMD level at run time (tdm_cpu_level) and uses the kernel
 * table of that level (tdm_cpu_kernels).  The tables live in matmul.c (scalar),
 * matmul_avx2.c and matmul_avx512.c (compiled with their ISA flags).
 *
 * Determinism contract of every kernel table: the value of one matmul output
 * element y[i][r] depends only on x[i], W row r, the weight's layout and the SIMD
 * level, never on n, on the thread count or on how rows are grouped.  In the rows
 * layout each (x row, W row) pair is accumulated in one vector accumulator (lanes
 * over k, k in increasing steps of the vector width, masked tail) and reduced by a
 * fixed tree; in the P64 layout in one lane, k by k (gemv_p64).
 */
#ifndef TDM_CPU_INTERNAL_H
#define TDM_CPU_INTERNAL_H

#include <math.h>

#include "backend.h"
#include "qdot.h"
#include "threadpool.h"

typedef enum tdm_cpu_level {
    TDM_CPU_SCALAR = 0,
    TDM_CPU_AVX2 = 1,   /* AVX2 + FMA + F16C */
    TDM_CPU_AVX512 = 2, /* AVX-512 F/BW/VL/DQ + FMA + F16C */
    TDM_CPU_N_LEVELS = 3,
} tdm_cpu_level;

/* Rows of W per conversion group: tiles are padded to a multiple of this. */
#define TDM_MM_RB 4
/* Largest n that uses the direct (convert on the fly) matmul path. */
#ifndef TDM_MM_DIRECT_MAX
#define TDM_MM_DIRECT_MAX 16
#endif
/* Largest n whose integer-dot matmul reads the weight blocks directly (k_qgemv; at
 * most TDM_MM_DIRECT_MAX): past it the prep path's integer forms, shared by 16 x
 * rows, cost less than unpacking each block for every 4 x rows. */
#ifndef TDM_QGEMV_MAX
#define TDM_QGEMV_MAX 8
#endif

typedef struct tdm_cpu_kernels {
    const char *name;
    /* dst[i][0..cols) = W row r0 + i converted to f32, for i < nr; dst rows are ld
     * floats apart (ld >= cols). */
    void (*convert_rows)(const tdm_weight *w, int64_t r0, int64_t nr, float *dst, int64_t ld);
    /* y[i][j] (=|+=) dot(x[i], wt[j]) for i < n, j < nr.
     * x: [n][cols] (rows ldx apart), wt: [nr rounded up to TDM_MM_RB][ldw] f32 (rows
     * past nr readable, values ignored), y: rows ldy apart. */
    void (*gemm)(const float *x, int64_t ldx, int32_t n, const float *wt, int64_t ldw,
                 int64_t nr, int64_t cols, float *y, int64_t ldy, bool acc);
    /* Direct path (small n) for f32/f16/bf16 W, converting W on the fly:
     * y[i][r] (=|+=) dot(x[i], W row r) for i < n, r in [r0, r1); x rows are w->cols
     * apart, y rows ldy apart.  Returns false (and does nothing) for other types. */
    bool (*gemv)(const tdm_weight *w, const float *x, int32_t n, int64_t r0, int64_t r1, float *y,
                 int64_t ldy, bool acc);
    /* Weight types gemv handles: bit (1 << type) set.  Its results are bit-identical
     * to convert_rows + gemm, so the matmul dispatcher may pick either path. */
    uint32_t gemv_types;
    /* The integer-dot matmul of the tdm_qdot_type weights (qdot.h), any n:
     * y[i][r] (=|+=) dot(x[i], W row r) for i < n, r in [r0, r1), x quantised in xq, y
     * rows ldy apart.  The same bits at every level (qdot.h). */
    void (*qdot)(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y, int64_t ldy,
                 bool acc);
    /* Optional (NULL: the level keeps every weight in TDM_LAYOUT_ROWS): matmul of a
     * TDM_LAYOUT_P64 weight of an element type (returns false for others):
     * y[i][r] (=|+=) dot(x[i], W row r) for i < n (any n) and the rows of 64-row
     * blocks [b0, b1); x rows are w->cols apart, y rows ldy apart.  Each output
     * element is one f32 sum of x[i][k] W[r][k] in increasing k (one FMA per k), so
     * the determinism contract holds with this accumulation scheme instead. */
    bool (*gemv_p64)(const tdm_weight *w, const float *x, int32_t n, int64_t b0, int64_t b1, float *y,
                     int64_t ldy, bool acc);
    /* Attention scores from K blocks in the CPU cache layout of K (per block and kv
     * head [hd][bs]: the block's bs keys side by side for each d).  For q < nq and
     * the first cnt slots j of the blocks kt[0], kt[1], ... (bs slots each; element
     * type TDM_F32, TDM_F16, TDM_Q8_0: int8 quants read as their integer values, or
     * TDM_F8_E4M3: E4M3 codes read as their values; the caller applies the q8_0 and
     * fp8 caches' scales, attention.c):
     *   s[q * lds + j] = scale * sum_{d < hd} qv[q * ldq + d] * K_j[d],
     *   K_j[d] = kt[j / bs][d * bs + j % bs],
     * the sum formed in increasing d, one fused multiply-add per d starting from 0
     * (the scalar level: a multiply and an add), then one multiply by scale.  So a
     * score depends only on its query vector and key, never on nq, cnt or the tiling,
     * and a single key (cnt = 1, kt[0] pointing at its column) gives the same value. */
    void (*attn_qk)(const float *qv, int64_t ldq, int32_t nq, const void *const *kt, uint32_t type,
                    int32_t bs, int32_t cnt, int32_t hd, float scale, float *s, int64_t lds);
    /* acc[h][d] += sum_{i < cnt} p[h * ldp + i] * v[i][d] for h < nh, d < hd, summed in
     * order of i; v: cnt contiguous rows of hd elements of type TDM_F32, TDM_F16,
     * TDM_Q8_0 or TDM_F8_E4M3 (quants and codes as attn_qk reads them). */
    void (*attn_pv)(float *acc, const float *p, int64_t ldp, int32_t nh, const void *v,
                    uint32_t type, int32_t cnt, int32_t hd);
    /* x[i] = exp(x[i] - max(x)) for i < n (n >= 1); returns the sum of the new x. */
    float (*softmax_num)(float *x, int32_t n);
    /* RMS norm of one row: ss = sum of (double) x[k]^2 in 8 lanes (lane k % 8, k
     * increasing), lanes added as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7));
     * inv = (float) (1 / sqrt(ss / dim + eps)); o[k] = (x[k] * inv) * g[k] in f32.
     * Every level computes exactly this (the squares are exact in double). */
    void (*rmsnorm_row)(const float *x, const float *g, int32_t dim, float eps, float *o);
    /* RoPE of n_head heads of head_dim floats at v (heads contiguous), rotating pairs
     * (2t, 2t + 1) or, neox, (t, t + half) for t < half by cs[t] = (cos, sin):
     * a' = a cos - b sin, b' = a sin + b cos, each product rounded, then the sum
     * (no fused multiply-add), so every level gives the same floats. */
    void (*rope_row)(float *v, int32_t n_head, int32_t head_dim, int32_t half, bool neox, const float *cs);
    /* o[i] = silu(g[i]) * u[i] = g / (1 + exp(-g)) * u for i < n. */
    void (*swiglu)(const float *g, const float *u, float *o, int32_t n);
    /* dst[i] = f16(src[i]) for i < n, IEEE round to nearest even (as tdm_f32_to_f16,
     * NaN payloads aside). */
    void (*to_f16)(const float *src, uint16_t *dst, int32_t n);
} tdm_cpu_kernels;

extern const tdm_cpu_kernels tdm_cpu_kernels_scalar;
/* The scalar level's row kernels, for levels without their own. */
void tdm_cpu_rmsnorm_row_scalar(const float *x, const float *g, int32_t dim, float eps, float *o);
void tdm_cpu_rope_row_scalar(float *v, int32_t n_head, int32_t head_dim, int32_t half, bool neox, const float *cs);
#if defined(__x86_64__)
extern const tdm_cpu_kernels tdm_cpu_kernels_avx2;
extern const tdm_cpu_kernels tdm_cpu_kernels_avx512;
#endif

/* Per-thread scratch memory (64-byte aligned floats), grown by the caller thread
 * before a parallel region, so workers never allocate. */
typedef struct tdm_cpu_scratch {
    float *buf;
    size_t cap; /* floats */
} tdm_cpu_scratch;

/* cos/sin of RoPE angles per position for one set of rope parameters, filled
 * lazily (values computed exactly as without the cache, so results are identical).
 * A cache serves the parameters whose table and magnitude equal its own. */
#define TDM_ROPE_CACHES 4
typedef struct tdm_rope_cache {
    int32_t n_rot;
    float mscale;             /* the magnitude (tdm_rope_params.mscale, 0 as 1) */
    int32_t cap_pos;          /* positions [0, cap_pos) have room */
    float *cs;                /* [cap_pos][n_rot / 2][2]: cos theta * mscale, sin theta * mscale */
    uint8_t *valid;           /* [cap_pos] */
    double *inv_freq;         /* [n_rot / 2] radians per position (tdm_rope_params.freq, or its
                                 default from freq_base and freq_scale) */
} tdm_rope_cache;

/* A quantised x row (head.c): scale dx (qx = round(x / dx), stored as qx + 128),
 * l1 >= sum |x|, ex >= max |x - dx qx| (both rounded up). */
typedef struct tdm_qhead_xstat {
    float dx, l1, ex;
} tdm_qhead_xstat;

/* x rows an approximation call takes at most. */
#define TDM_QHEAD_MAX_X 16
/* The bound's relative term (the f32 rounding of A itself) and the factor that
 * widens the whole bound over the float arithmetic computing it. */
#define TDM_QHEAD_REL_ERR 1e-6f
#define TDM_QHEAD_WIDEN 1.00001f

/* For n <= TDM_QHEAD_MAX_X x rows xq[n][cols_pad] (unsigned bytes, qx + 128), xs
 * their statistics, and the W rows r < h->rows of 64-row panels [p0, p1), with
 * isum = sum_k xq[i][k] q[r][k] (exact in integers):
 *   A = (dx d[r]) (isum - 128 qsum[r])                        the approximate logit
 *   B = ((l1 xcoef[r] + ex l1[r]) + REL_ERR |A|) WIDEN + FLT_MIN   its bound (tdm_qhead)
 * bound false: out[i * ldo + r] = A;  bound true: out[i * ldo + r] = A + B and
 * lo[i] = max(lo[i], A - B over those rows).  Other entries of out are untouched. */
typedef void (*tdm_qhead_approx_fn)(const tdm_qhead *h, const uint8_t *xq, const tdm_qhead_xstat *xs,
                                    int32_t n, int64_t p0, int64_t p1, bool bound, float *out, int64_t ldo,
                                    float *lo);
void tdm_qhead_approx_ref(const tdm_qhead *h, const uint8_t *xq, const tdm_qhead_xstat *xs, int32_t n,
                          int64_t p0, int64_t p1, bool bound, float *out, int64_t ldo, float *lo);
/* The integer-dot matmul (qdot.h) of n <= TDM_MM_DIRECT_MAX x rows straight from the
 * weight blocks (qgemv_vnni.c): the same bits as the level's qdot.  Returns false (and
 * does nothing) for a type or n it does not handle. */
typedef bool (*tdm_qgemv_fn)(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y,
                             int64_t ldy, bool acc);
#if defined(__x86_64__)
bool tdm_qgemv_vnni(const tdm_weight *w, const tdm_xq *xq, int32_t n, int64_t r0, int64_t r1, float *y, int64_t ldy,
                    bool acc);
void tdm_qhead_approx_vnni(const tdm_qhead *h, const uint8_t *xq, const tdm_qhead_xstat *xs, int32_t n,
                           int64_t p0, int64_t p1, bool bound, float *out, int64_t ldo, float *lo);
#endif

typedef struct tdm_cpu {
    tdm_rope_cache rope[TDM_ROPE_CACHES];
    int32_t rope_next;        /* round-robin replacement */
    tdm_threadpool *pool;
    int n_threads;
    tdm_cpu_level level;
    const tdm_cpu_kernels *k;
    tdm_cpu_scratch *scratch; /* [n_threads] */
    void *xq_buf;             /* x quantised for the integer-dot matmul (64-byte aligned) */
    size_t xq_cap;
    /* quantised output head (head.c): the level's int8 dot kernel, NULL without one */
    tdm_qhead_approx_fn k_approx;
    /* the integer-dot matmul of a few x rows from the file's blocks, NULL without one */
    tdm_qgemv_fn k_qgemv;
    void *head_buf;           /* x bytes, logits or bounds, per-task maxima and candidates of a pass */
    size_t head_cap;
    uint64_t head_rows, head_cands; /* head_argmax: rows answered, exact logits computed */
    /* tensor-parallel blocks (blocks.c) */
    tdm_cpu_scratch *team;    /* [n_threads] per-thread activations */
    uint64_t blocks_runs;     /* forward passes the blocks op ran */
    int tp_mode;              /* 0: tensor-parallel blocks where they fit; -1: never
                                 (tdm_backend_cpu_set_tp) */
    void *moe_buf;            /* moe_experts (moe.c): the experts' outputs and the routing
                                 tables of a call (64-byte aligned) */
    size_t moe_cap;           /* bytes */
} tdm_cpu;

/* Highest level this CPU supports. */
tdm_cpu_level tdm_cpu_best_level(void);
/* Level tdm_backend_cpu_create uses now: the best one, lowered by TANDEM_CPU
 * (src/base/diag.h) and by tdm_cpu_cap_level. */
tdm_cpu_level tdm_cpu_default_level(void);
/* Caps the level of the CPU backends made after it (tdm_backend_cpu_create, so the
 * engines and models of the public API too), as TANDEM_CPU does: for tests that run
 * a whole engine at each level.  TDM_CPU_N_LEVELS lifts the cap.  Thread-safe. */
void tdm_cpu_cap_level(tdm_cpu_level cap);
const char *tdm_cpu_level_name(tdm_cpu_level level);
const tdm_cpu_kernels *tdm_cpu_kernels_for(tdm_cpu_level level);

/* Creates a CPU backend that uses exactly the given level (TANDEM_ERR_UNSUPPORTED if
 * this CPU lacks it).  n_threads 0 = all cores.  Used by tests and benchmarks. */
tandem_status tdm_backend_cpu_create_level(int32_t n_threads, tdm_cpu_level level,
                                           tdm_backend **out, tdm_err *err);
/* The level a CPU backend runs at (-1 when b is not a CPU backend). */
int tdm_backend_cpu_level(const tdm_backend *b);

/* Ensures every thread's scratch holds at least n floats. */
tandem_status tdm_cpu_scratch_reserve(tdm_cpu *c, size_t n, tdm_err *err);
/* The same for count scratch areas arr[0 .. count). */
tandem_status tdm_cpu_scratch_grow(tdm_cpu_scratch *arr, int count, size_t n, tdm_err *err);
/* Lets the `blocks` op run tensor parallel (the default) or
 * not (it then returns TANDEM_ERR_UNSUPPORTED: the ops run one by one).  For tests
 * and benchmarks. */
void tdm_backend_cpu_set_tp(tdm_backend *b, bool on);
/* Forward passes a CPU backend's blocks op has run (0 when b is not one). */
uint64_t tdm_backend_cpu_blocks_runs(const tdm_backend *b);

/* Threads to use for `work` units when each thread should get at least `min_work`. */
static inline int tdm_cpu_nth(const tdm_cpu *c, int64_t work, int64_t min_work) {
    int64_t t = min_work > 0 ? work / min_work : c->n_threads;
    if (t < 1) t = 1;
    return t < c->n_threads ? (int)t : c->n_threads;
}

/* Soft-capping of one score or logit: cap * tanh(x / cap), NaN for an infinite x.  An
 * infinity there comes from broken weights or an overflow, and tanh(+-inf) = +-1 would
 * turn it into a plausible +-cap; as NaN it reaches the logits check. */
static inline float tdm_cpu_softcap1(float x, float cap) { return isinf(x) ? NAN : cap * tanhf(x / cap); }

/* Ops (ops.c, matmul.c, attention.c). */
tandem_status tdm_cpu_get_rows(tdm_backend *b, const tdm_weight *w, const int32_t *ids, int32_t n,
                               float *out, tdm_err *err);
tandem_status tdm_cpu_rmsnorm(tdm_backend *b, const float *x, const float *gamma, int32_t n,
                              int32_t dim, float eps, float *out, tdm_err *err);
tandem_status tdm_cpu_matmul(tdm_backend *b, const tdm_weight *w, const float *x, int32_t n,
                             float *y, bool accumulate, tdm_err *err);
tandem_status tdm_cpu_qhead_logits(tdm_backend *b, const tdm_qhead *h, const float *x, int32_t n,
                                   float *y, tdm_err *err);
tandem_status tdm_cpu_head_argmax(tdm_backend *b, const tdm_weight *w, const tdm_qhead *h,
                                  const float *x, int32_t n, const uint32_t *const *masks, int32_t *ids,
                                  tdm_err *err);
tandem_status tdm_cpu_add_bias(tdm_backend *b, float *y, const float *bias, int32_t n, int32_t dim,
                               tdm_err *err);
tandem_status tdm_cpu_rope(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                           int32_t head_dim, const int32_t *pos, const tdm_rope_params *rp,
                           tdm_err *err);
tandem_status tdm_cpu_kv_write(tdm_backend *b, const tdm_kv_write_args *a, tdm_err *err);
tandem_status tdm_cpu_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *err);
tandem_status tdm_cpu_swiglu(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff,
                             float *out, tdm_err *err);
tandem_status tdm_cpu_gather_rows(tdm_backend *b, const float *x, const int32_t *rows, int32_t n,
                                  int32_t dim, float *out, tdm_err *err);

tandem_status tdm_cpu_blocks(tdm_backend *b, const tdm_blocks_args *a, tdm_err *err);
tandem_status tdm_cpu_moe_experts(tdm_backend *b, const tdm_moe_args *a, tdm_err *err);

/* The ops of the qwen3 / gemma3 blocks (ops_arch.c). */
tandem_status tdm_cpu_head_rmsnorm(tdm_backend *b, float *x, int32_t n, int32_t row_stride, int32_t n_head,
                                   int32_t head_dim, const float *gamma, float eps, tdm_err *err);
tandem_status tdm_cpu_geglu(tdm_backend *b, const float *gate_up, int32_t n, int32_t ff, float *out, tdm_err *err);
tandem_status tdm_cpu_add(tdm_backend *b, float *y, const float *x, int32_t n, int32_t dim, tdm_err *err);
tandem_status tdm_cpu_scale(tdm_backend *b, float *x, int32_t n, int32_t dim, float s, tdm_err *err);
tandem_status tdm_cpu_softcap(tdm_backend *b, float *x, int32_t n, int32_t dim, float cap, tdm_err *err);
tandem_status tdm_cpu_scatter_cols(tdm_backend *b, const float *x, int32_t n, int32_t nx, const int32_t *ids,
                                   int32_t dim, float fill, float *y, tdm_err *err);
tandem_status tdm_cpu_mask_rows(tdm_backend *b, float *x, int32_t n, int32_t dim, const uint32_t *mask, float fill,
                                tdm_err *err);
tandem_status tdm_cpu_edit_rows(tdm_backend *b, float *x, int32_t n, int32_t dim, const tdm_logit_edit *edits,
                                const int32_t *off, tdm_err *err);
tandem_status tdm_cpu_row_top(tdm_backend *b, const float *x, int32_t n, int32_t dim, int32_t k, const int32_t *want,
                              tdm_row_top *out, tdm_err *err);
/* gelu(g) * u for i < n, GELU's tanh approximation in f32 (the geglu op's row). */
void tdm_cpu_geglu_row(const float *g, const float *u, float *o, int32_t n);

/* matmul on the calling thread (a validated weight, possibly a view):
 * y[i][r] = dot(x[i], W row r) for i < n, every row r of w; x rows are w->cols
 * apart, y rows ldy apart.  tile: tdm_cpu_matmul_local_scratch floats. */
void tdm_cpu_matmul_local(const tdm_cpu *c, const tdm_weight *w, const float *x, int32_t n, float *y,
                          int64_t ldy, float *tile);
size_t tdm_cpu_matmul_local_scratch(const tdm_cpu *c, const tdm_weight *w, int32_t n);

/* Pieces of the ops that the tensor-parallel blocks (blocks.c) run per thread. */

/* Where attention reads query vectors and writes outputs: row r's kv group gq
 * (its group heads) at q + r * q_stride + gq * group * hd, likewise out. */
typedef struct tdm_attn_io {
    const float *q;
    int64_t q_stride;
    float *out;
    int64_t out_stride;
} tdm_attn_io;
/* Rows of one sequence per attention slice, at most. */
#define TDM_ATTN_SLICE 8
/* Validates attention arguments as the op does: the largest number of slots a row
 * sees (at least 1), 0 for no rows, or -1 with err set. */
int64_t tdm_cpu_attn_check(const tdm_attn_args *a, tdm_err *err);
/* The batch's rows cut into slices ([n][2]: first row, count) of at most per rows
 * of one sequence: buf when it holds cap slices, else malloc'ed (NULL when that
 * fails); *n_slices set. */
int32_t *tdm_cpu_attn_slices(const tdm_batch *bt, int32_t per, int32_t *buf, int32_t cap, int32_t *n_slices);
/* Scratch floats one slice needs (n_tot_max from tdm_cpu_attn_check). */
size_t tdm_cpu_attn_scratch(const tdm_attn_args *a, int64_t n_tot_max);
/* Attention of one slice for kv head g of the cache, queries and outputs at kv
 * group gq of io. */
void tdm_cpu_attn_run(const tdm_cpu_kernels *k, const tdm_attn_args *a, const tdm_attn_io *io,
                      int64_t n_tot_max, const int32_t *slice, int32_t g, int32_t gq, float *scratch);
/* The RoPE angle table ([pos][n_rot / 2][2] cos, sin) filled for positions pos[0 ..
 * n), after validating rp and the positions; NULL with err set on failure.  Not
 * thread-safe (call before parallel work). */
const float *tdm_cpu_rope_table(tdm_cpu *c, const tdm_rope_params *rp, int32_t head_dim, const int32_t *pos,
                                int32_t n, tdm_err *err);
/* kv_write's per-row checks (sequence, slot inside it). */
tandem_status tdm_cpu_kv_write_check_rows(const tdm_kv_write_args *a, tdm_err *err);
/* Writes kv heads [g0, g0 + ng) of every row; a->k and a->v rows hold those heads
 * from offset 0. */
void tdm_cpu_kv_write_heads(const tdm_cpu *c, const tdm_kv_write_args *a, int32_t g0, int32_t ng);

/* matmul on a CPU backend's state (tdm_cpu_matmul without the backend lookup). */
tandem_status tdm_cpu_matmul_on(tdm_cpu *c, const tdm_weight *w, const float *x, int32_t n, float *y, bool accumulate,
                                tdm_err *err);

/* Validates a weight descriptor (type, dims, row_bytes, data). */
tandem_status tdm_cpu_check_weight(const tdm_weight *w, const char *op, tdm_err *err);

/* The CPU state of a backend, or NULL (with an error) when b is not a CPU backend. */
tdm_cpu *tdm_cpu_of(tdm_backend *b, const char *op, tdm_err *err);

#endif
