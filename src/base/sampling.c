/* sampling.c - seeded RNG (xoshiro256** / splitmix64), logits -> processed
 * distribution (temperature, softmax, top-k, top-p, min-p), and drawing from a
 * distribution.  See sampling.h.
 *
 * The filters work on a candidate list (scratch idx/val: the tokens with p > 0) under
 * a strict total order: higher probability first, lower token id first among equal
 * probabilities.  top-k and top-p select a prefix of that order with quickselect-style
 * partitioning (expected O(n)), so no full sort of a 150k vocabulary is needed.
 */
#include "sampling.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------- rng */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl64(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void tdm_rng_seed(tdm_rng *rng, uint64_t seed) {
    if (!rng) return;
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) rng->s[i] = splitmix64(&x);
    /* splitmix64 is a bijection of distinct counters: the state cannot be all zero. */
}

uint64_t tdm_rng_next(tdm_rng *rng) {
    if (!rng) return 0;
    uint64_t *s = rng->s;
    const uint64_t result = rotl64(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return result;
}

double tdm_rng_uniform(tdm_rng *rng) {
    return (double)(tdm_rng_next(rng) >> 11) * 0x1.0p-53;
}

/* ---------------------------------------------------------------- argmax */

int32_t tdm_argmax(const float *logits, int32_t n) {
    if (!logits || n <= 0) return -1;
    /* The first index of the largest non-NaN value (0 when all are NaN).  Pass 1
     * takes the maximum of each chunk (a branch-free loop the compiler vectorises:
     * NaN never compares greater) and remembers the first chunk that reaches the
     * overall maximum; pass 2 finds the first index of that value in that chunk. */
    enum { CH = 64 };
    float best = -INFINITY;
    int32_t best_chunk = -1;
    for (int32_t c0 = 0; c0 < n; c0 += CH) {
        int32_t c1 = n - c0 < CH ? n : c0 + CH;
        float m = -INFINITY;
        if (c1 - c0 == CH) {
            float lane[8]; /* eight running maxima: plain SIMD max instructions */
            for (int l = 0; l < 8; l++) lane[l] = -INFINITY;
            for (int32_t i = c0; i < c1; i += 8)
                for (int l = 0; l < 8; l++) lane[l] = logits[i + l] > lane[l] ? logits[i + l] : lane[l];
            for (int l = 0; l < 8; l++) m = lane[l] > m ? lane[l] : m;
        } else {
            for (int32_t i = c0; i < c1; i++) m = logits[i] > m ? logits[i] : m;
        }
        bool has = m > best;
        if (!has && best_chunk < 0) /* a chunk of -inf (and NaN) values */
            for (int32_t i = c0; i < c1 && !has; i++) has = logits[i] == m;
        if (has) {
            best = m;
            best_chunk = c0;
        }
    }
    for (int32_t i = best_chunk; i >= 0 && i < n; i++)
        if (logits[i] == best) return i;
    return 0;
}

/* --------------------------------------------------------------- scratch */

tandem_status tdm_sampler_scratch_init(tdm_sampler_scratch *s, int32_t n_vocab, tdm_err *err) {
    if (!s) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "sampler scratch: NULL pointer");
    memset(s, 0, sizeof *s);
    if (n_vocab <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "sampler scratch: n_vocab must be > 0 (got %d)",
                          (int)n_vocab);
    s->idx = tdm_mallocarray((size_t)n_vocab, sizeof *s->idx);
    s->val = tdm_mallocarray((size_t)n_vocab, sizeof *s->val);
    if (!s->idx || !s->val) {
        tdm_sampler_scratch_free(s);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "sampler scratch: out of memory for %d tokens",
                          (int)n_vocab);
    }
    s->n_vocab = n_vocab;
    return TANDEM_OK;
}

void tdm_sampler_scratch_free(tdm_sampler_scratch *s) {
    if (!s) return;
    free(s->idx);
    free(s->val);
    s->idx = NULL;
    s->val = NULL;
    s->n_vocab = 0;
}

/* ------------------------------------------------------ candidate ordering */

/* a before b in the candidate order: higher value, then lower token id. */
static inline bool before(float va, int32_t ia, float vb, int32_t ib) {
    return va > vb || (va == vb && ia < ib);
}

static inline void swap_cand(int32_t *idx, float *val, int32_t a, int32_t b) {
    int32_t ti = idx[a];
    idx[a] = idx[b];
    idx[b] = ti;
    float tv = val[a];
    val[a] = val[b];
    val[b] = tv;
}

/* Partitions [lo, hi) around a pseudo-random pivot: afterwards [lo, j) come before the
 * pivot, the pivot is at j, and (j, hi) come after it.  Returns j. */
static int32_t partition(int32_t *idx, float *val, int32_t lo, int32_t hi, uint64_t *rs) {
    int32_t p = lo + (int32_t)(splitmix64(rs) % (uint64_t)(hi - lo));
    swap_cand(idx, val, p, hi - 1);
    const float pv = val[hi - 1];
    const int32_t pi = idx[hi - 1];
    int32_t j = lo;
    for (int32_t i = lo; i < hi - 1; i++)
        if (before(val[i], idx[i], pv, pi)) swap_cand(idx, val, i, j++);
    swap_cand(idx, val, j, hi - 1);
    return j;
}

/* Insertion sort of [lo, hi) into candidate order (small ranges). */
static void sort_small(int32_t *idx, float *val, int32_t lo, int32_t hi) {
    for (int32_t i = lo + 1; i < hi; i++) {
        float v = val[i];
        int32_t id = idx[i];
        int32_t j = i;
        while (j > lo && before(v, id, val[j - 1], idx[j - 1])) {
            val[j] = val[j - 1];
            idx[j] = idx[j - 1];
            j--;
        }
        val[j] = v;
        idx[j] = id;
    }
}

/* Moves the first k candidates (in candidate order) of [0, n) to [0, k), 0 < k < n. */
static void select_top_k(int32_t *idx, float *val, int32_t n, int32_t k, uint64_t *rs) {
    int32_t lo = 0, hi = n;
    while (hi - lo > 1) {
        int32_t j = partition(idx, val, lo, hi, rs);
        if (j == k - 1 || j == k) return;
        if (j < k) lo = j + 1;
        else hi = j;
    }
}

/* The smallest m such that the first m candidates (candidate order) of [0, n) have
 * mass >= target; they are moved to [0, m).  Returns n when the whole mass falls short
 * (rounding), and at least 1. */
static int32_t select_top_p(int32_t *idx, float *val, int32_t n, double target, uint64_t *rs) {
    int32_t lo = 0, hi = n; /* [0, lo) are confirmed kept; the answer lies in [lo, hi] */
    double acc = 0.0;       /* mass of [0, lo) */
    while (lo < hi) {
        if (hi - lo <= 32) {
            sort_small(idx, val, lo, hi);
            for (int32_t i = lo; i < hi; i++) {
                acc += val[i];
                if (acc >= target) return i + 1;
            }
            return hi;
        }
        int32_t j = partition(idx, val, lo, hi, rs);
        double upper = 0.0;
        for (int32_t i = lo; i < j; i++) upper += val[i];
        if (acc + upper >= target) {
            hi = j;  /* the prefix ends before the pivot */
        } else {
            acc += upper + val[j];
            if (acc >= target) return j + 1;
            lo = j + 1;
        }
    }
    return lo > 0 ? lo : 1;
}

/* ---------------------------------------------------------- distribution */

static void one_hot(float *probs, int32_t n, int32_t tok) {
    memset(probs, 0, (size_t)n * sizeof *probs);
    if (tok >= 0 && tok < n) probs[tok] = 1.0f;
}

/* exp(x) in float for x <= 0 (Cody-Waite reduction, the Cephes degree-6 polynomial:
 * about 1 ulp), subnormal results included (a scale of 2^(k+64) and one rounding
 * multiply by 2^-64); 0 below -104 (where float rounds to 0) and for NaN.  Plain
 * arithmetic and integer bit moves, so loops over it vectorise. */
static inline float exp_nonpos(float x) {
    float t = x * 1.44269504088896341f;
    float kf = (t + 12582912.0f) - 12582912.0f; /* round to nearest (|t| < 2^22) */
    float r = x - kf * 0.693359375f + kf * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t k = (int32_t)(kf > -160.0f ? kf : -160.0f);
    int32_t adj = k < -125 ? 64 : 0;
    uint32_t bits = (uint32_t)(k + adj + 127) << 23;
    float scale;
    memcpy(&scale, &bits, 4);
    float e = p * scale;
    e = adj ? e * 0x1p-64f : e;
    return x >= -104.0f ? e : 0.0f; /* also NaN -> 0 */
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__) && \
    !defined(__SANITIZE_THREAD__) /* (a resolver must not run instrumented code) */
#define TDM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TDM_VECTOR_CLONES
#endif

/* The 8 lane sums of a double accumulator, added by a fixed tree. */
static inline double sum8(const double acc[8]) {
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* acc[j] += p[i] for i = j mod 8 (the tail into acc[0]): the 8-lane double sum
 * that exp_shifted and exp_sum_shifted share. */
static inline void add_lanes(double acc[8], const float *p, int32_t n) {
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += (double)p[i + j];
    for (; i < n; i++) acc[0] += (double)p[i];
}

/* probs[i] = exp((l[i] - m) * inv_t), 0 for -inf and NaN logits (m finite, the
 * largest logit); returns the sum, accumulated in double over 8 lanes. */
TDM_VECTOR_CLONES static double exp_shifted(const float *l, int32_t n, float m, float inv_t, float *probs) {
    for (int32_t i = 0; i < n; i++) probs[i] = exp_nonpos((l[i] - m) * inv_t);
    double acc[8] = {0};
    add_lanes(acc, probs, n);
    return sum8(acc);
}

/* 16-lane vectors (GCC / Clang vector extensions): the loops below keep one value
 * per lane l for the entries i = l mod 16, as their scalar forms would, so results
 * do not depend on the vector width the compiler picks.  (Written with lane arrays,
 * gcc 12 compiled max_of to scalar code and count_above to 2 K instructions.) */
typedef float tdm_v16f __attribute__((vector_size(64)));
typedef int32_t tdm_v16i __attribute__((vector_size(64)));
typedef float tdm_v16f_u __attribute__((vector_size(64), aligned(4), may_alias)); /* unaligned loads */

/* (Macros, not functions: a function returning a 64-byte vector would change the
 * ABI of the clones without AVX-512.) */
#define V16_LOAD(p) (*(const tdm_v16f_u *)(const void *)(p))
/* m ? a : b per lane (m: all ones or all zeros). */
#define V16_SELECT(m, a, b) ((tdm_v16f)(((tdm_v16i)(a) & (m)) | ((tdm_v16i)(b) & ~(m))))

/* The largest value (NaN ignored; -inf when none), in 16 lanes. */
TDM_VECTOR_CLONES static float max_of(const float *x, int32_t n) {
    tdm_v16f lane = {0};
    lane -= INFINITY; /* every lane -inf */
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        tdm_v16f v = V16_LOAD(x + i);
        lane = V16_SELECT(v > lane, v, lane);
    }
    float l[16];
    memcpy(l, &lane, sizeof l);
    for (; i < n; i++) l[0] = x[i] > l[0] ? x[i] : l[0];
    float m = -INFINITY;
    for (int j = 0; j < 16; j++) m = l[j] > m ? l[j] : m;
    return m;
}

/* x * 0 is 0 for a finite x and NaN for NaN and +-inf, so the sum of those products is
 * 0 exactly when every x is finite: plain multiply-adds in 16 lanes, which vectorise
 * at any optimisation level (a compare-and-or loop did not at -O2).  Static, behind
 * tdm_logits_finite: GCC 12 exports the dispatcher of an external target_clones
 * function whatever its visibility. */
TDM_VECTOR_CLONES static bool logits_finite(const float *x, int32_t n) {
    if (!x || n <= 0) return true;
    float acc[16] = {0};
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[i + l] * 0.0f;
    for (; i < n; i++) acc[0] += x[i] * 0.0f;
    float s = 0;
    for (int l = 0; l < 16; l++) s += acc[l];
    return s == 0;
}

bool tdm_logits_finite(const float *x, int32_t n) { return logits_finite(x, n); }

int32_t tdm_argmax_finite(const float *logits, int32_t n) {
    return tdm_logits_finite(logits, n) ? tdm_argmax(logits, n) : -1;
}

int32_t tdm_argmax_masked(const float *l, int32_t n, const uint32_t *mask) {
    if (!tdm_logits_finite(l, n)) return -1;
    int32_t best = -1;
    for (int32_t w = 0; w * 32 < n; w++) {
        uint32_t bits = mask[w];
        while (bits) {
            const int32_t i = w * 32 + __builtin_ctz(bits);
            bits &= bits - 1;
            if (i < n && (best < 0 || l[i] > l[best])) best = i;
        }
    }
    return best;
}

void tdm_logits_mask(float *l, int32_t n, const uint32_t *mask, float fill) {
    for (int32_t w = 0; w * 32 < n; w++) {
        const uint32_t bits = mask[w];
        if (bits == 0xffffffffu) continue;
        const int32_t end = n - w * 32 < 32 ? n - w * 32 : 32;
        for (int32_t b = 0; b < end; b++)
            if (!(bits >> b & 1u)) l[w * 32 + b] = fill;
    }
}

/* sum_i exp(l[i] - m) (m finite, the largest logit) without storing the terms:
 * chunks of 256 (a multiple of 8, so the lanes see what exp_shifted's would) go
 * through a stack buffer, so the exp loop vectorises as exp_shifted's does. */
TDM_VECTOR_CLONES static double exp_sum_shifted(const float *l, int32_t n, float m) {
    float buf[256];
    double acc[8] = {0};
    for (int32_t c0 = 0; c0 < n; c0 += 256) {
        const int32_t len = n - c0 < 256 ? n - c0 : 256;
        for (int32_t i = 0; i < len; i++) buf[i] = exp_nonpos(l[c0 + i] - m);
        add_lanes(acc, buf, len);
    }
    return sum8(acc);
}

/* How many logits are +inf. */
static double count_pos_inf(const float *l, int32_t n) {
    double cnt = 0;
    for (int32_t i = 0; i < n; i++) cnt += l[i] == INFINITY;
    return cnt;
}

float tdm_top_prob(const float *logits, int32_t n) {
    if (!logits || n <= 0) return 0.0f;
    float m = max_of(logits, n);
    if (m == -INFINITY) return 0.0f;
    if (m == INFINITY) return (float)(1.0 / count_pos_inf(logits, n));
    return (float)(1.0 / exp_sum_shifted(logits, n, m)); /* the sum is >= 1: the max adds 1 */
}

TDM_VECTOR_CLONES static void scale_probs(float *probs, int32_t n, double inv) {
    for (int32_t i = 0; i < n; i++) probs[i] = (float)(probs[i] * inv);
}

/* scale_probs, and in the same pass (chunks of 256, a multiple of 8, so each lane
 * adds the same entries in the same order) the sum and the largest entry of the
 * result: what positive_sum_max returns for entries that are all >= 0, bit for bit. */
TDM_VECTOR_CLONES static double scale_sum_max(float *probs, int32_t n, double inv, float *xmax) {
    double acc[8] = {0};
    tdm_v16f mv = {0};
    float m = 0;
    for (int32_t c0 = 0; c0 < n; c0 += 256) {
        const int32_t len = n - c0 < 256 ? n - c0 : 256;
        float *q = probs + c0;
        for (int32_t i = 0; i < len; i++) q[i] = (float)(q[i] * inv);
        add_lanes(acc, q, len);
        int32_t i = 0;
        for (; i + 16 <= len; i += 16) {
            tdm_v16f v = V16_LOAD(q + i);
            mv = V16_SELECT(v > mv, v, mv);
        }
        for (; i < len; i++) m = q[i] > m ? q[i] : m;
    }
    float mx[16];
    memcpy(mx, &mv, sizeof mx);
    for (int l = 0; l < 16; l++) m = mx[l] > m ? mx[l] : m;
    *xmax = m;
    return sum8(acc);
}

static double positive_sum_max(const float *x, int32_t n, float *xmax);

/* probs = softmax(logits / temperature) over the vocabulary; with total non-NULL
 * also *total and *pmax = positive_sum_max(probs) (from the scaling pass when it
 * can).  Returns false when no token has a finite-or-+inf logit (all NaN or -inf). */
static bool softmax_t(const float *logits, int32_t n, double temp, float *probs, double *total, float *pmax) {
    float m = max_of(logits, n);
    if (m == -INFINITY) return false;
    if (m == INFINITY) { /* uniform over the +inf logits */
        const double cnt = count_pos_inf(logits, n);
        for (int32_t i = 0; i < n; i++) probs[i] = logits[i] == INFINITY ? (float)(1.0 / cnt) : 0.0f;
        if (total) *total = positive_sum_max(probs, n, pmax);
        return true;
    }
    /* (a huge temperature makes inv_t 0: every finite logit then gets exp(0) = 1) */
    double sum = exp_shifted(logits, n, m, (float)(1.0 / temp), probs);
    /* The max logit contributes exp(0) = 1, so sum >= 1 (or NaN / inf for absurd temps). */
    if (!(sum >= 1.0) || isinf(sum)) {
        int32_t a = tdm_argmax(logits, n);
        one_hot(probs, n, a);
        if (total) *total = positive_sum_max(probs, n, pmax);
        return true;
    }
    if (total) *total = scale_sum_max(probs, n, 1.0 / sum, pmax); /* exp terms are >= 0 */
    else scale_probs(probs, n, 1.0 / sum);
    return true;
}

/* The sum (double, 8 lanes) and the largest of the positive entries. */
TDM_VECTOR_CLONES static double positive_sum_max(const float *x, int32_t n, float *xmax) {
    double acc[8] = {0};
    float mx[8] = {0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            float v = x[i + l] > 0.0f ? x[i + l] : 0.0f;
            acc[l] += (double)v;
            mx[l] = v > mx[l] ? v : mx[l];
        }
    for (; i < n; i++) {
        float v = x[i] > 0.0f ? x[i] : 0.0f;
        acc[0] += (double)v;
        mx[0] = v > mx[0] ? v : mx[0];
    }
    *xmax = 0;
    for (int l = 0; l < 8; l++) *xmax = mx[l] > *xmax ? mx[l] : *xmax;
    return sum8(acc);
}

/* The count and (float) mass of {p >= th}, in 16 lanes. */
TDM_VECTOR_CLONES static void count_above(const float *probs, int32_t n, float th, int32_t *cnt, float *mass) {
    tdm_v16i cv = {0};
    tdm_v16f mv = {0};
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        tdm_v16f v = V16_LOAD(probs + i);
        tdm_v16i ge = v >= th; /* -1 where v >= th */
        cv -= ge;
        mv += V16_SELECT(ge, v, (tdm_v16f){0});
    }
    int32_t c[16];
    float m[16];
    memcpy(c, &cv, sizeof c);
    memcpy(m, &mv, sizeof m);
    for (; i < n; i++) {
        c[0] += probs[i] >= th;
        m[0] += probs[i] >= th ? probs[i] : 0.0f;
    }
    *cnt = 0;
    *mass = 0;
    for (int l = 0; l < 16; l++) {
        *cnt += c[l];
        *mass += m[l];
    }
}

/* A threshold theta such that {p >= theta} (a prefix of the filters' order) still
 * holds everything the first active filter keeps, so the candidate list can skip the
 * tail of the vocabulary: pmax / 16, / 256, ... until the set keeps enough (top-k:
 * k tokens; top-p: the target mass with a margin far above the float rounding of
 * the count; min-p: the threshold itself).  0 (keep all) after 8 tries. */
static float candidate_threshold(const float *probs, int32_t n, const tdm_sampler_params *p, bool use_k,
                                 bool use_p, float pmax, double total) {
    if (!use_k && !use_p) return (float)((double)p->min_p * (double)pmax) * 0.999f;
    const double target = (double)p->top_p * total * 1.001;
    float th = pmax;
    for (int t = 0; t < 8; t++) {
        th *= 0.0625f;
        int32_t cnt;
        float mass;
        count_above(probs, n, th, &cnt, &mass);
        if (use_k ? cnt >= p->top_k : (double)mass * (1.0 - 1e-4) >= target) return th;
    }
    return 0.0f;
}

/* Whether any of x[0 .. 16) (fewer at the end: n) is positive and >= th. */
static inline bool any_candidate(const float *x, int32_t n, float th) {
    int any = 0;
    for (int32_t i = 0; i < n; i++) any |= (x[i] > 0.0f) & (x[i] >= th);
    return any != 0;
}

/* The start of the first block of 16 at or after q0 (q0 a multiple of 16) that
 * holds an entry x[i] > 0 with x[i] >= th, i < end; end when none does. */
static int32_t next_block(const float *x, int32_t q0, int32_t end, float th) {
    for (; q0 < end; q0 += 16)
        if (any_candidate(x + q0, end - q0 < 16 ? end - q0 : 16, th)) return q0;
    return end;
}

/* The entries with probs[i] > 0 and >= theta, in index order, into idx / val;
 * returns their count.  Blocks of 16 are tested branch-free first: below a
 * threshold most blocks hold no candidate. */
TDM_VECTOR_CLONES static int32_t collect_candidates(const float *probs, int32_t n_vocab, float theta, int32_t *idx,
                                                    float *val) {
    int32_t n = 0;
    for (int32_t q0 = next_block(probs, 0, n_vocab, theta); q0 < n_vocab;
         q0 = next_block(probs, q0 + 16, n_vocab, theta))
        for (int32_t i = q0; i < q0 + 16 && i < n_vocab; i++)
            if (probs[i] > 0.0f && probs[i] >= theta) {
                idx[n] = i;
                val[n] = probs[i];
                n++;
            }
    return n;
}

void tdm_probs_from_logits(const float *logits, int32_t n_vocab, const tdm_sampler_params *p,
                           tdm_sampler_scratch *s, float *probs) {
    if (!logits || !probs || n_vocab <= 0) return;
    tdm_sampler_params dp = {1.0f, 0, 1.0f, 0.0f}; /* NULL params: plain softmax */
    if (!p) p = &dp;
    if (!(p->temperature > 0.0f)) { /* greedy (also NaN) */
        one_hot(probs, n_vocab, tdm_argmax(logits, n_vocab));
        return;
    }
    const bool use_k = p->top_k > 0 && p->top_k < n_vocab;
    const bool use_p = p->top_p < 1.0f; /* NaN: off */
    const bool use_min = p->min_p > 0.0f;
    const bool filter = use_k || use_p || use_min;
    double total = 0.0;
    float pmax = 0.0f;
    if (!softmax_t(logits, n_vocab, (double)p->temperature, probs, filter ? &total : NULL, &pmax)) {
        one_hot(probs, n_vocab, 0); /* no usable logit: any token; 0 by convention */
        return;
    }
    if (!filter) return;

    /* Candidate list in scratch (or a temporary one if the scratch is missing). */
    tdm_sampler_scratch tmp = {0};
    int32_t *idx;
    float *val;
    if (s && s->idx && s->val && s->n_vocab >= n_vocab) {
        idx = s->idx;
        val = s->val;
    } else {
        if (tdm_sampler_scratch_init(&tmp, n_vocab, NULL) != TANDEM_OK) {
            one_hot(probs, n_vocab, tdm_argmax(logits, n_vocab)); /* out of memory: degrade */
            return;
        }
        idx = tmp.idx;
        val = tmp.val;
    }
    const float theta = pmax > 0.0f ? candidate_threshold(probs, n_vocab, p, use_k, use_p, pmax, total) : 0.0f;
    const int32_t n0 = collect_candidates(probs, n_vocab, theta, idx, val);
    int32_t n = n0;
    uint64_t rs = 0x5eed5eedull ^ (uint64_t)n0; /* pivot choice: deterministic */

    /* 1. top-k */
    if (use_k && p->top_k < n) {
        select_top_k(idx, val, n, p->top_k, &rs);
        n = p->top_k;
    }
    /* 2. top-p, relative to the mass that survived top-k (all of it without top-k,
     * including the tail below theta) */
    if (use_p && n > 1) {
        double kept = 0.0;
        if (use_k) {
            for (int32_t i = 0; i < n; i++) kept += val[i];
        } else {
            kept = total;
        }
        double target = (double)p->top_p * kept;
        n = select_top_p(idx, val, n, target, &rs);
    }
    /* 3. min-p, relative to the largest probability (always kept by 1 and 2) */
    if (use_min && n > 1) {
        float pmax = 0.0f;
        for (int32_t i = 0; i < n; i++) pmax = val[i] > pmax ? val[i] : pmax;
        double thr = (double)p->min_p * (double)pmax;
        int32_t w = 0;
        for (int32_t i = 0; i < n; i++)
            if ((double)val[i] >= thr) {
                idx[w] = idx[i];
                val[w] = val[i];
                w++;
            }
        n = w;
    }
    /* Renormalise the survivors. */
    double kept = 0.0;
    for (int32_t i = 0; i < n; i++) kept += val[i];
    memset(probs, 0, (size_t)n_vocab * sizeof *probs);
    const double inv = 1.0 / kept; /* kept > 0: every candidate has p > 0 and n >= 1 */
    for (int32_t i = 0; i < n; i++) probs[idx[i]] = (float)(val[i] * inv);
    tdm_sampler_scratch_free(&tmp);
}

/* -------------------------------------------------------------- sampling */

int32_t tdm_sample_probs(const float *probs, int32_t n, tdm_rng *rng) {
    return tdm_sample_probs_u(probs, n, rng ? tdm_rng_uniform(rng) : 0.0);
}

int32_t tdm_sample_probs_u(const float *probs, int32_t n, double u) {
    if (!probs || n <= 0) return -1;
    /* the positive entries in index order (negative and NaN ones count as 0); blocks
     * of 16 without one are skipped after a branch-free test (filtered distributions
     * are mostly zeros) */
    double total = 0.0;
    int32_t last = -1;
    for (int32_t q0 = next_block(probs, 0, n, 0.0f); q0 < n; q0 = next_block(probs, q0 + 16, n, 0.0f))
        for (int32_t i = q0; i < q0 + 16 && i < n; i++)
            if (probs[i] > 0.0f) {
                total += probs[i];
                last = i;
            }
    if (last < 0) return -1;
    const double target = u * total;
    double cum = 0.0;
    for (int32_t q0 = next_block(probs, 0, last, 0.0f); q0 < last; q0 = next_block(probs, q0 + 16, last, 0.0f))
        for (int32_t i = q0; i < q0 + 16 && i < last; i++)
            if (probs[i] > 0.0f) {
                cum += probs[i];
                if (target < cum) return i;
            }
    return last; /* also the guard against rounding at the end */
}

int32_t tdm_sample_logits(const float *logits, int32_t n_vocab, const tdm_sampler_params *p,
                          tdm_sampler_scratch *s, float *probs_tmp, tdm_rng *rng) {
    if (!logits || n_vocab <= 0) return -1;
    if (!p || !(p->temperature > 0.0f) || !probs_tmp) return tdm_argmax(logits, n_vocab);
    tdm_probs_from_logits(logits, n_vocab, p, s, probs_tmp);
    return tdm_sample_probs(probs_tmp, n_vocab, rng);
}
