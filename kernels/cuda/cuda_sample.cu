/* cuda_sample.cu - sampling on the device: the ops probs_dev (the processed
 * distribution of logits rows, in sampling.h's order and with its tie rules),
 * sample_dev (a draw from a distribution with a uniform the host drew) and
 * accept_dev (the speculative acceptance rule of verify/accept.h).  One thread
 * block of 1024 threads per row.
 *
 * Masses are summed in fixed point (2^-52 units, integers), so totals, the top-p
 * cut and every draw depend only on the values, never on the order in which
 * threads add them: the same inputs give the same token on every run.  An entry
 * below 2^-52 weighs nothing (tdm_sample_probs would draw it with that probability).
 *
 *   probs:  e_j = exp((l_j - max) / T) (the max gives 1); top-k keeps the k largest
 *           (ties: lower id first), top-p the smallest prefix by value descending
 *           (ties: lower id first) whose mass reaches top_p of what top-k left, min-p
 *           the entries >= min_p * max; the survivors are divided by their sum.
 *           Both cuts find their threshold value by a radix select over the
 *           values' bits (4 passes of 256 bins), then keep the entries above it and
 *           the first entries equal to it in index order.
 *   draw:   the entry j whose fixed-point prefix sum (index order) first exceeds
 *           u * total, among positive entries, as tdm_sample_probs finds it.
 *   accept: for each drafted token x_i, accept with probability min(1, p_i(x) /
 *           q_i(x)) (uniform u_i); at the first rejection draw from max(0, p_i -
 *           q_i) (p_i when that has no mass) with u_{i+1}; after k acceptances draw
 *           the bonus token from p_k with u_k.
 */
#include <math.h>
#include <string.h>

#include "cuda_internal.h"

#define SB 1024                          /* threads per block */
#define SWARPS (SB / 32)
#define FIX 4503599627370496.0           /* 2^52: fixed-point units per unit of mass */
typedef unsigned long long u64;

__device__ __forceinline__ u64 fix_of(float p) { return p > 0.0f ? (u64)((double)p * FIX) : 0ull; }

/* ---- block-wide helpers (every thread calls them) ------------------------------- */

__device__ float blk_max(float v, float *sf) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sf[wid] = v;
    __syncthreads();
    float m = sf[0];
    for (int w = 1; w < SWARPS; w++) m = fmaxf(m, sf[w]);
    return m;
}

/* The block's sum of v (u64: exact; double: in a fixed order), to every thread. */
template <typename T> __device__ T blk_sum(T v, T *sw) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) sw[wid] = v;
    __syncthreads();
    T s = 0;
    for (int w = 0; w < SWARPS; w++) s += sw[w];
    return s;
}

/* Inclusive prefix sum of v over the block in thread order; *total = the block's sum. */
__device__ u64 blk_scan_u64(u64 v, u64 *su, u64 *total) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        const u64 t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    __syncthreads();
    if (lane == 31) su[wid] = v;
    __syncthreads();
    u64 before = 0, all = 0;
    for (int w = 0; w < SWARPS; w++) {
        if (w < wid) before += su[w];
        all += su[w];
    }
    *total = all;
    return before + v;
}

/* ---- the processed distribution ------------------------------------------------------ */

/* The value t among e[0..V) (non-negative floats, compared by their bits) at which
 * the measure (MASS: fixed-point mass; else the count) accumulated from the largest
 * value down first reaches need (> 0); *above = the measure of the values > t. */
template <bool MASS> __device__ uint32_t select_key(const float *e, int32_t V, u64 need, u64 *above, u64 *hist) {
    __shared__ uint32_t s_prefix;
    __shared__ u64 s_above;
    uint32_t prefix = 0, mask = 0;
    u64 abv = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += SB) hist[i] = 0;
        __syncthreads();
        for (int32_t j = threadIdx.x; j < V; j += SB) {
            const float v = e[j];
            const uint32_t key = __float_as_uint(v);
            if ((key & mask) != prefix) continue;
            const u64 w = MASS ? fix_of(v) : 1ull;
            if (w) atomicAdd(&hist[(key >> shift) & 255u], w);
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* warp 0: lane l sums bins 255 - 8 l down to 248 - 8 l */
            const int lane = threadIdx.x;
            u64 own = 0;
            for (int i = 0; i < 8; i++) own += hist[255 - 8 * lane - i];
            u64 incl = own; /* inclusive sum over lanes 0..lane (bins from the top) */
            for (int o = 1; o < 32; o <<= 1) {
                const u64 t = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += t;
            }
            /* the first lane whose bins reach need, then the bin within them */
            const unsigned hit = __ballot_sync(0xffffffffu, abv + incl >= need);
            const int first = hit ? __ffs(hit) - 1 : 31;
            if (lane == first) {
                u64 cum = abv + incl - own;
                int b = 255 - 8 * lane;
                for (int i = 0; i < 7; i++, b--) {
                    if (cum + hist[b] >= need) break;
                    cum += hist[b];
                }
                s_prefix = prefix | ((uint32_t)b << shift);
                s_above = cum;
            }
        }
        __syncthreads();
        prefix = s_prefix;
        abv = s_above;
        mask |= 255u << shift;
        __syncthreads();
    }
    *above = abv;
    return prefix;
}

/* Zeroes every entry below t and every entry equal to t after the first `keep` of
 * them in index order. */
__device__ void keep_top(float *e, int32_t V, uint32_t t, u64 keep, u64 *su) {
    u64 n_eq = 0;
    for (int32_t j = threadIdx.x; j < V; j += SB) n_eq += __float_as_uint(e[j]) == t;
    n_eq = blk_sum(n_eq, su);
    if (keep >= n_eq) { /* (usual: no tie at the cut) every entry >= t stays */
        for (int32_t j = threadIdx.x; j < V; j += SB)
            if (__float_as_uint(e[j]) < t) e[j] = 0.0f;
        return;
    }
    u64 base = 0;
    for (int32_t c0 = 0; c0 < V; c0 += SB) {
        const int32_t j = c0 + (int32_t)threadIdx.x;
        const uint32_t key = j < V ? __float_as_uint(e[j]) : 0u;
        const bool eq = j < V && key == t;
        u64 total;
        const u64 incl = blk_scan_u64(eq ? 1ull : 0ull, su, &total);
        if (j < V && (key < t || (eq && base + incl - 1 >= keep))) e[j] = 0.0f;
        base += total;
    }
}

struct sample_params {
    float temperature;
    int32_t top_k;
    float top_p, min_p;
};

__global__ void __launch_bounds__(SB) k_probs(const float *logits, int32_t V, sample_params sp, float *probs, int32_t *ok) {
    TDM_PDL_ENTRY();
    __shared__ float sf[SWARPS];
    __shared__ u64 su[SWARPS];
    __shared__ double sd[SWARPS];
    __shared__ u64 hist[256];
    const float *l = logits + (size_t)blockIdx.x * V;
    float *e = probs + (size_t)blockIdx.x * V;
    float m = -INFINITY;
    int bad = 0;
    for (int32_t j = threadIdx.x; j < V; j += SB) {
        const float v = l[j];
        bad |= !isfinite(v);
        m = fmaxf(m, v);
    }
    bad = __syncthreads_or(bad);
    m = blk_max(m, sf);
    if (threadIdx.x == 0) ok[blockIdx.x] = !bad;
    if (bad) {
        for (int32_t j = threadIdx.x; j < V; j += SB) e[j] = 0.0f;
        return;
    }
    if (!(sp.temperature > 0.0f)) { /* greedy: one-hot on the first largest */
        int32_t first = INT32_MAX;
        for (int32_t j = threadIdx.x; j < V; j += SB)
            if (l[j] == m && j < first) first = j;
        for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffffu, first, o));
        __shared__ int32_t sfirst[SWARPS];
        if ((threadIdx.x & 31) == 0) sfirst[threadIdx.x >> 5] = first;
        __syncthreads();
        for (int w = 0; w < SWARPS; w++) first = min(first, sfirst[w]);
        for (int32_t j = threadIdx.x; j < V; j += SB) e[j] = j == first ? 1.0f : 0.0f;
        return;
    }
    const float inv_t = (float)(1.0 / (double)sp.temperature);
    for (int32_t j = threadIdx.x; j < V; j += SB) e[j] = expf((l[j] - m) * inv_t);
    __syncthreads();
    if (sp.top_k > 0 && sp.top_k < V) {
        u64 above;
        const uint32_t t = select_key<false>(e, V, (u64)sp.top_k, &above, hist);
        keep_top(e, V, t, (u64)sp.top_k - above, su);
        __syncthreads();
    }
    if (sp.top_p < 1.0f) {
        u64 mass = 0;
        for (int32_t j = threadIdx.x; j < V; j += SB) mass += fix_of(e[j]);
        mass = blk_sum(mass, su);
        u64 need = (u64)ceil((double)sp.top_p * (double)mass);
        if (need < 1) need = 1;
        if (need > mass) need = mass;
        u64 above;
        const uint32_t t = select_key<true>(e, V, need, &above, hist);
        const u64 w = fix_of(__uint_as_float(t));
        const u64 keep = w ? (need - above + w - 1) / w : 0;
        keep_top(e, V, t, keep, su);
        __syncthreads();
    }
    if (sp.min_p > 0.0f) { /* the max (1) survives the cuts above */
        const double thr = (double)sp.min_p;
        for (int32_t j = threadIdx.x; j < V; j += SB)
            if ((double)e[j] < thr) e[j] = 0.0f;
        __syncthreads();
    }
    double s = 0.0;
    for (int32_t j = threadIdx.x; j < V; j += SB) s += (double)e[j];
    s = blk_sum(s, sd);
    const double inv = 1.0 / s; /* s >= 1: the max survives */
    for (int32_t j = threadIdx.x; j < V; j += SB) e[j] = (float)((double)e[j] * inv);
}

/* ---- draws ------------------------------------------------------------------------- */

/* Entry j of a distribution: p, max(0, p - q), or max(0, p - onehot(x)). */
struct dist {
    const float *p, *q;
    int32_t x;  /* one-hot q's token (q NULL), or -1 */
    bool resid; /* p - q */
    __device__ float at(int32_t j) const {
        const float pj = p[j];
        if (!resid) return pj;
        const float qj = q ? q[j] : (j == x ? 1.0f : 0.0f);
        return pj > qj ? pj - qj : 0.0f;
    }
};

/* The token a uniform u in [0, 1) draws from d over [0, V), -1 when no entry is
 * positive. */
__device__ int32_t blk_draw(const dist &d, int32_t V, double u, u64 *su) {
    __shared__ int32_t s_found;
    u64 t = 0;
    for (int32_t j = threadIdx.x; j < V; j += SB) t += fix_of(d.at(j));
    const u64 total = blk_sum(t, su);
    if (total == 0) return -1;
    u64 target = (u64)(u * (double)total);
    if (target >= total) target = total - 1;
    if (threadIdx.x == 0) s_found = -1;
    __syncthreads();
    u64 base = 0;
    for (int32_t c0 = 0; c0 < V; c0 += SB) {
        const int32_t j = c0 + (int32_t)threadIdx.x;
        const u64 w = j < V ? fix_of(d.at(j)) : 0ull;
        u64 chunk;
        const u64 incl = base + blk_scan_u64(w, su, &chunk);
        if (w > 0 && incl > target && incl - w <= target) s_found = j; /* exactly one j */
        base += chunk;
        __syncthreads();
        if (s_found >= 0) break;
    }
    return s_found;
}

#define SAMPLE_MAX_ROWS TDM_SAMPLE_DEV_MAX_ROWS
struct sample_args {
    double u[SAMPLE_MAX_ROWS];
};

__global__ void __launch_bounds__(SB) k_sample(const float *probs, int32_t V, sample_args a, int32_t *ids, float *pmax) {
    TDM_PDL_ENTRY();
    __shared__ u64 su[SWARPS];
    __shared__ float sf[SWARPS];
    const float *p = probs + (size_t)blockIdx.x * V;
    dist d = {p, NULL, -1, false};
    const int32_t tok = blk_draw(d, V, a.u[blockIdx.x], su);
    if (pmax) {
        float m = 0.0f;
        for (int32_t j = threadIdx.x; j < V; j += SB) m = fmaxf(m, p[j]);
        m = blk_max(m, sf);
        if (threadIdx.x == 0) pmax[blockIdx.x] = m;
    }
    if (threadIdx.x == 0) ids[blockIdx.x] = tok;
}

struct accept_args {
    int32_t draft[TDM_CUDA_ACCEPT_MAX_K];
    double u[TDM_CUDA_ACCEPT_MAX_K + 1];
    int32_t k, n_q;
};

__global__ void __launch_bounds__(SB) k_accept(const float *p, const float *q, int32_t V, accept_args a, int32_t *out) {
    TDM_PDL_ENTRY();
    __shared__ u64 su[SWARPS];
    __shared__ int s_acc;
    for (int32_t i = 0; i < a.k; i++) {
        __syncthreads(); /* (s_acc of the last decision is read) */
        const int32_t x = a.draft[i];
        const float *pi = p + (size_t)i * V, *qi = i < a.n_q ? q + (size_t)i * V : NULL;
        if (threadIdx.x == 0) {
            double acc = 0.0; /* tdm_accept_prob; an id out of range is rejected */
            if (x >= 0 && x < V) {
                const float px = pi[x], qx = qi ? qi[x] : 1.0f;
                acc = !(px > 0.0f) ? 0.0 : !(qx > 0.0f) ? 1.0 : fmin((double)px / (double)qx, 1.0);
            }
            s_acc = a.u[i] < acc;
        }
        __syncthreads();
        if (s_acc) continue;
        dist r = {pi, qi, qi ? -1 : x, true};
        int32_t tok = blk_draw(r, V, a.u[i + 1], su);
        if (tok < 0) { /* no residual mass: p itself, with the same draw */
            dist pd = {pi, NULL, -1, false};
            tok = blk_draw(pd, V, a.u[i + 1], su);
        }
        if (threadIdx.x == 0) out[0] = i, out[1] = tok;
        return;
    }
    dist pk = {p + (size_t)a.k * V, NULL, -1, false};
    const int32_t tok = blk_draw(pk, V, a.u[a.k], su);
    if (threadIdx.x == 0) out[0] = a.k, out[1] = tok;
}

/* ---- launchers --------------------------------------------------------------------- */

#define GET_CUDA(op)                                                                   \
    tdm_cuda *c = tdm_cuda_of(b, op, err);                                             \
    if (!c) return TANDEM_ERR_INVALID_ARG

tandem_status tdm_cuda_probs_dev(tdm_backend *b, const float *logits, int32_t n, int32_t dim,
                                 const tdm_sampler_params *sp, float *probs, int32_t *ok, tdm_err *err) {
    GET_CUDA("probs_dev");
    if (n < 0 || dim <= 0 || !sp) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "probs_dev: n = %d, dim = %d", (int)n, (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!logits || !probs || !ok) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "probs_dev: NULL pointer");
    if (n > 65535) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "probs_dev: %d rows", (int)n);
    sample_params p = {sp->temperature, sp->top_k, sp->top_p, sp->min_p};
    tdm_launch(k_probs, n, SB, 0, c->stream, logits, dim, p, probs, ok);
    TDM_CU_LAUNCHED("probs_dev");
    return TANDEM_OK;
}

tandem_status tdm_cuda_sample_dev(tdm_backend *b, const float *probs, int32_t n, int32_t dim, const double *u,
                                  int32_t *ids, float *pmax, tdm_err *err) {
    GET_CUDA("sample_dev");
    if (n < 0 || n > SAMPLE_MAX_ROWS || dim <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "sample_dev: n = %d (1..%d), dim = %d", (int)n, SAMPLE_MAX_ROWS,
                          (int)dim);
    if (n == 0) return TANDEM_OK;
    if (!probs || !u || !ids) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "sample_dev: NULL pointer");
    sample_args a;
    for (int32_t i = 0; i < SAMPLE_MAX_ROWS; i++) a.u[i] = i < n ? u[i] : 0.0;
    tdm_launch(k_sample, n, SB, 0, c->stream, probs, dim, a, ids, pmax);
    TDM_CU_LAUNCHED("sample_dev");
    return TANDEM_OK;
}

tandem_status tdm_cuda_accept_dev(tdm_backend *b, const float *p, const float *q, int32_t n_q, const int32_t *draft,
                                  int32_t k, int32_t dim, const double *u, int32_t *out, tdm_err *err) {
    GET_CUDA("accept_dev");
    if (k < 0 || k > TDM_CUDA_ACCEPT_MAX_K || n_q < 0 || n_q > k || dim <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "accept_dev: k = %d (0..%d), %d q rows, dim = %d", (int)k,
                          TDM_CUDA_ACCEPT_MAX_K, (int)n_q, (int)dim);
    if (!p || !u || !out || (k > 0 && !draft) || (n_q > 0 && !q))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "accept_dev: NULL pointer");
    accept_args a;
    memset(&a, 0, sizeof a);
    for (int32_t i = 0; i < k; i++) a.draft[i] = draft[i];
    for (int32_t i = 0; i <= k; i++) a.u[i] = u[i];
    a.k = k;
    a.n_q = n_q;
    tdm_launch(k_accept, 1, SB, 0, c->stream, p, q, dim, a, out);
    TDM_CU_LAUNCHED("accept_dev");
    return TANDEM_OK;
}
