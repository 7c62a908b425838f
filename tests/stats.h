/* stats.h - small statistics helpers for the tests (header-only: nothing to link).
 *
 *   tdm_stat_gamma_q(a, x)  regularized upper incomplete gamma Q(a, x) = Gamma(a, x) / Gamma(a)
 *   tdm_stat_chi2_sf(x, df) P(X >= x) for X ~ chi-square(df) = Q(df / 2, x / 2)
 *   tdm_stat_chi2_gof(...)  Pearson goodness-of-fit p-value of observed counts
 *
 * Q(a, x) uses the power series of P(a, x) for x < a + 1 and Lentz's continued fraction
 * for Q(a, x) otherwise (both converge fast in those regions).
 */
#ifndef TDM_TEST_STATS_H
#define TDM_TEST_STATS_H

#include <math.h>
#include <stdint.h>

static inline double tdm_stat_gamma_q(double a, double x) {
    if (!(a > 0) || !(x >= 0)) return NAN;
    if (x == 0) return 1.0;
    const double log_prefix = a * log(x) - x - lgamma(a); /* log(x^a e^-x / Gamma(a)) */
    if (x < a + 1.0) {
        /* P(a, x) = x^a e^-x / Gamma(a + 1) * sum_n x^n / ((a + 1) ... (a + n)) */
        double term = 1.0 / a, sum = term;
        for (int n = 1; n < 100000; n++) {
            term *= x / (a + n);
            sum += term;
            if (fabs(term) < fabs(sum) * 1e-16) break;
        }
        double p = sum * exp(log_prefix);
        return p >= 1.0 ? 0.0 : 1.0 - p;
    }
    /* Q(a, x) = x^a e^-x / Gamma(a) * 1 / (x + 1 - a - 1 (1 - a) / (x + 3 - a - ...)) */
    const double tiny = 1e-300;
    double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
    for (int i = 1; i < 100000; i++) {
        double an = -i * (i - a);
        b += 2.0;
        d = an * d + b;
        if (fabs(d) < tiny) d = tiny;
        c = b + an / c;
        if (fabs(c) < tiny) c = tiny;
        d = 1.0 / d;
        double delta = d * c;
        h *= delta;
        if (fabs(delta - 1.0) < 1e-16) break;
    }
    return exp(log_prefix) * h;
}

static inline double tdm_stat_chi2_sf(double x, double df) {
    if (x <= 0) return 1.0;
    return tdm_stat_gamma_q(0.5 * df, 0.5 * x);
}

/* Pearson chi-square goodness of fit: counts[n] observed in total draws against
 * probabilities probs[n] (need not be normalised).  Bins expecting fewer than 5 draws
 * are pooled into one bin.  Returns the p-value; returns -1 if a draw fell in a bin of
 * probability 0 (impossible under the hypothesis) and sets *df_out (may be NULL). */
static inline double tdm_stat_chi2_gof(const uint64_t *counts, const double *probs, int n,
                                       int *df_out) {
    double psum = 0, total = 0;
    for (int i = 0; i < n; i++) {
        psum += probs[i] > 0 ? probs[i] : 0;
        total += (double)counts[i];
        if (!(probs[i] > 0) && counts[i] > 0) return -1.0;
    }
    double stat = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int i = 0; i < n; i++) {
        if (!(probs[i] > 0)) continue;
        double e = total * probs[i] / psum;
        if (e < 5.0) {
            pool_e += e;
            pool_o += (double)counts[i];
            continue;
        }
        stat += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
        bins++;
    }
    if (pool_e > 0) {
        stat += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        bins++;
    }
    int df = bins - 1;
    if (df_out) *df_out = df;
    if (df < 1) return 1.0; /* one possible outcome: nothing to test */
    return tdm_stat_chi2_sf(stat, df);
}

/* Two-sample chi-square test of homogeneity on counts a[n], b[n]; columns with an
 * expected count below 5 in either row are pooled. */
static inline double tdm_stat_chi2_two_sample(const uint64_t *a, const uint64_t *b, int32_t n) {
    double na = 0, nb = 0;
    for (int32_t i = 0; i < n; i++) {
        na += (double)a[i];
        nb += (double)b[i];
    }
    double tot = na + nb, stat = 0, pa = 0, pb = 0;
    int bins = 0;
    for (int32_t i = 0; i <= n; i++) {
        double oa, ob;
        if (i < n) {
            oa = (double)a[i];
            ob = (double)b[i];
            double col = oa + ob;
            if (col * na / tot < 5 || col * nb / tot < 5) {
                pa += oa;
                pb += ob;
                continue;
            }
        } else {
            oa = pa;
            ob = pb;
            if (oa + ob == 0) break;
        }
        double col = oa + ob, ea = col * na / tot, eb = col * nb / tot;
        stat += (oa - ea) * (oa - ea) / ea + (ob - eb) * (ob - eb) / eb;
        bins++;
    }
    if (bins < 2) return 1.0;
    return tdm_stat_chi2_sf(stat, bins - 1);
}

#endif
