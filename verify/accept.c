/* accept.c - greedy and speculative-sampling acceptance of a drafted chain.
 * See accept.h.
 *
 * Random numbers (reproducibility): tdm_accept_sample draws exactly one uniform per
 * accept decision (in draft order) and one per emitted token (tdm_sample_probs), so
 * a step with n accepted tokens uses n + 1 + 1 draws when it rejects and k + 1 when
 * it accepts everything.
 */
#include "accept.h"

#include <math.h>

int32_t tdm_accept_greedy(const int32_t *draft, int32_t k, const int32_t *target_argmax,
                          int32_t *next) {
    int32_t n = 0;
    if (draft && target_argmax)
        while (n < k && draft[n] == target_argmax[n]) n++;
    if (next) *next = target_argmax ? target_argmax[n] : -1;
    return n;
}

/* min(1, p/q).  p <= 0 (or NaN): the target cannot emit x, always reject.  q <= 0 with
 * p > 0: x cannot have been drawn from q, so the value never affects the output
 * distribution; we return 1, the limit of min(1, p/q) as q -> 0 (accepting a token the
 * target allows), which is also what IEEE arithmetic gives (p/0 = inf). */
double tdm_accept_prob(float px, float qx) {
    if (!(px > 0.0f)) return 0.0;
    if (!(qx > 0.0f)) return 1.0;
    double r = (double)px / (double)qx;
    return r < 1.0 ? r : 1.0;
}

double tdm_residual_dist(const float *p, const float *q, int32_t n, float *residual) {
    if (!p || !q || !residual || n <= 0) return 0.0;
    double mass = 0.0;
    for (int32_t i = 0; i < n; i++) {
        double d = (double)p[i] - (double)q[i];
        if (d > 0.0) mass += d; /* NaN compares false: counts as 0 */
    }
    if (mass > 0.0) {
        const double inv = 1.0 / mass;
        for (int32_t i = 0; i < n; i++) {
            double d = (double)p[i] - (double)q[i];
            residual[i] = d > 0.0 ? (float)(d * inv) : 0.0f;
        }
        return mass;
    }
    /* p <= q everywhere (p == q for distributions): the residual is p itself. */
    double ps = 0.0;
    for (int32_t i = 0; i < n; i++) ps += p[i] > 0.0f ? p[i] : 0.0f;
    const double inv = ps > 0.0 ? 1.0 / ps : 0.0;
    for (int32_t i = 0; i < n; i++) residual[i] = p[i] > 0.0f ? (float)(p[i] * inv) : 0.0f;
    return mass;
}

/* Draws from normalize(max(0, p - q)) (or p when that has no mass) without a buffer:
 * one uniform draw, like tdm_sample_probs. */
static int32_t sample_residual_inline(const float *p, const float *q, int32_t n, tdm_rng *rng) {
    double u = tdm_rng_uniform(rng);
    double mass = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        double d = (double)p[i] - (double)q[i];
        if (d > 0.0) {
            mass += d;
            last = i;
        }
    }
    if (last < 0) { /* no residual mass: sample p with the same draw */
        double ps = 0.0, cum = 0.0;
        for (int32_t i = 0; i < n; i++)
            if (p[i] > 0.0f) {
                ps += p[i];
                last = i;
            }
        for (int32_t i = 0; i < last; i++)
            if (p[i] > 0.0f) {
                cum += p[i];
                if (u * ps < cum) return i;
            }
        return last;
    }
    double target = u * mass, cum = 0.0;
    for (int32_t i = 0; i < last; i++) {
        double d = (double)p[i] - (double)q[i];
        if (d > 0.0) {
            cum += d;
            if (target < cum) return i;
        }
    }
    return last;
}

int32_t tdm_accept_sample(const int32_t *draft, int32_t k, const float *p, const float *q,
                          int32_t n_vocab, tdm_rng *rng, float *scratch, int32_t *next) {
    if (next) *next = -1;
    if (!p || !rng || n_vocab <= 0) return 0;
    if (k < 0 || !draft || !q) k = 0;
    for (int32_t i = 0; i < k; i++) {
        const float *pi = p + (size_t)i * (size_t)n_vocab;
        const float *qi = q + (size_t)i * (size_t)n_vocab;
        const int32_t x = draft[i];
        const double u = tdm_rng_uniform(rng);
        /* An out-of-range drafted id can never be emitted: reject it. */
        const double a = (x >= 0 && x < n_vocab) ? tdm_accept_prob(pi[x], qi[x]) : 0.0;
        if (u < a) continue;
        int32_t tok;
        if (scratch) {
            tdm_residual_dist(pi, qi, n_vocab, scratch);
            tok = tdm_sample_probs(scratch, n_vocab, rng);
        } else {
            tok = sample_residual_inline(pi, qi, n_vocab, rng);
        }
        if (next) *next = tok;
        return i;
    }
    int32_t tok = tdm_sample_probs(p + (size_t)k * (size_t)n_vocab, n_vocab, rng);
    if (next) *next = tok;
    return k;
}
