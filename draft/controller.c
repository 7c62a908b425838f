/* controller.c - adaptive speculation length: acceptance EMA, cost model, choice of k.
 * See controller.h.
 *
 * Verify-cost estimate for n positions (tdm_cost_verify):
 *   - measured n: its EMA;
 *   - between two measured points: linear interpolation;
 *   - beyond the last measured point m (or below the first): linear extrapolation
 *     from the two nearest measured points, clamped between "flat" (t(m)) and
 *     "proportional" (t(m) * n / m) - a fixed overhead plus a per-position cost always
 *     lies between the two;
 *   - one measured point: flat, t(n) = t(m) (like the prior; optimistic, so the
 *     controller tries other k and measures them);
 *   - nothing measured: the prior, t(n) = 1 (only ratios of costs matter).
 *
 * Acceptance estimate (tdm_ctrl_observe): a step that drafted k tokens and accepted
 * n_accepted evaluated e = min(n_accepted + 1, k) tokens (each a Bernoulli(alpha)
 * trial, stopping at the first rejection).  alpha moves toward n_accepted / e with
 * weight alpha_ema * e / k.  Weighting by e keeps the estimate unbiased: by Wald's
 * identity E[n_accepted] = alpha * E[e], so the expected update is zero exactly at the
 * true alpha (a plain EMA of the per-step ratio n_accepted / e would converge to a
 * smaller value, e.g. alpha (1 + alpha) / 2 for k = 2).  Dividing by k keeps the weight
 * <= alpha_ema.
 */
#include "controller.h"

#include "common.h"

#include <math.h>
#include <stddef.h>

#define PRIOR_T_VERIFY 1.0
#define N_VERIFY_MAX TDM_COST_MAX_N /* largest index of t_verify */
#define ALPHA_PRIOR 0.6
#define ALPHA_CLAMP_MAX 0.999

/* ------------------------------------------------------------- cost model */

void tdm_cost_init(tdm_cost_model *c) {
    if (!c) return;
    c->t_draft = 0.0;
    for (int i = 0; i <= TDM_COST_MAX_N; i++) c->t_verify[i] = 0.0;
    c->ema = 0.1;
}

static double ema_update(double old, double sample, double w) {
    if (!(w > 0.0 && w <= 1.0)) w = 0.1;
    return old > 0.0 ? old + w * (sample - old) : sample; /* first sample: take it */
}

void tdm_cost_observe_draft(tdm_cost_model *c, double seconds_per_step) {
    if (!c || !(seconds_per_step > 0.0) || isinf(seconds_per_step)) return;
    c->t_draft = ema_update(c->t_draft, seconds_per_step, c->ema);
}

void tdm_cost_observe_verify(tdm_cost_model *c, int32_t n_positions, double seconds) {
    if (!c || n_positions < 1 || n_positions > N_VERIFY_MAX) return;
    if (!(seconds > 0.0) || isinf(seconds)) return;
    c->t_verify[n_positions] = ema_update(c->t_verify[n_positions], seconds, c->ema);
}

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

double tdm_cost_verify(const tdm_cost_model *c, int32_t n) {
    if (n < 1) n = 1;
    if (!c) return PRIOR_T_VERIFY;
    if (n <= N_VERIFY_MAX && c->t_verify[n] > 0.0) return c->t_verify[n];
    /* nearest measured points: below (b1 < b0 < n) and above (n < a0 < a1) */
    int b0 = 0, b1 = 0, a0 = 0, a1 = 0;
    for (int i = TDM_MIN(n - 1, N_VERIFY_MAX); i >= 1 && !b1; i--)
        if (c->t_verify[i] > 0.0) {
            if (!b0) b0 = i;
            else b1 = i;
        }
    for (int i = n + 1; i <= N_VERIFY_MAX && !a1; i++)
        if (c->t_verify[i] > 0.0) {
            if (!a0) a0 = i;
            else a1 = i;
        }
    if (b0 && a0) { /* interpolate */
        double tb = c->t_verify[b0], ta = c->t_verify[a0];
        return tb + (ta - tb) * (double)(n - b0) / (double)(a0 - b0);
    }
    if (b0) { /* beyond the last measured point */
        double t0 = c->t_verify[b0];
        double lin = t0;
        if (b1) lin = t0 + (t0 - c->t_verify[b1]) * (double)(n - b0) / (double)(b0 - b1);
        return clampd(lin, t0, t0 * (double)n / (double)b0);
    }
    if (a0) { /* below the first measured point */
        double t0 = c->t_verify[a0];
        double lin = t0;
        if (a1) lin = t0 - (c->t_verify[a1] - t0) * (double)(a0 - n) / (double)(a1 - a0);
        return clampd(lin, t0 * (double)n / (double)a0, t0);
    }
    return PRIOR_T_VERIFY;
}

double tdm_cost_draft(const tdm_cost_model *c) {
    if (c && c->t_draft > 0.0) return c->t_draft;
    return tdm_cost_verify(c, 1) / 4.0;
}

/* ------------------------------------------------------------- controller */

void tdm_ctrl_init(tdm_spec_ctrl *c, int32_t k_min, int32_t k_max, int32_t k_fixed) {
    if (!c) return;
    if (k_min < 1) k_min = 1;
    if (k_min > TDM_CTRL_MAX_K) k_min = TDM_CTRL_MAX_K;
    if (k_max < k_min) k_max = k_min;
    if (k_max > TDM_CTRL_MAX_K) k_max = TDM_CTRL_MAX_K;
    if (k_fixed < 0) k_fixed = 0;
    if (k_fixed > TDM_CTRL_MAX_K) k_fixed = TDM_CTRL_MAX_K;
    c->k_min = k_min;
    c->k_max = k_max;
    c->k_fixed = k_fixed;
    c->alpha = ALPHA_PRIOR;
    c->alpha_ema = 0.2;
    c->k_last = k_fixed > 0 ? k_fixed : k_min;
    c->n_plain = 0;
    c->probe_gap = TDM_CTRL_PROBE_MIN;
    c->probing = false;
}

double tdm_ctrl_expected_tokens(double alpha, int32_t k) {
    if (k <= 0) return 1.0;
    if (!(alpha > 0.0)) return 1.0; /* also NaN */
    if (alpha >= 1.0) return (double)k + 1.0;
    return (1.0 - pow(alpha, (double)k + 1.0)) / (1.0 - alpha);
}

double tdm_ctrl_rate(const tdm_cost_model *cost, double alpha, double t_draft, int32_t k) {
    double a = clampd(isnan(alpha) ? 0.0 : alpha, 0.0, ALPHA_CLAMP_MAX);
    double t = (double)k * (t_draft > 0.0 ? t_draft : 0.0) + tdm_cost_verify(cost, k + 1);
    if (!(t > 0.0)) t = 1e-30;
    return tdm_ctrl_expected_tokens(a, k) / t;
}

int32_t tdm_ctrl_choose_k_cost(tdm_spec_ctrl *c, const tdm_cost_model *cost, double t_draft, double *rate) {
    if (!c) return 1;
    if (c->k_fixed > 0) {
        c->k_last = TDM_MIN(c->k_fixed, TDM_CTRL_MAX_K);
        if (rate) *rate = tdm_ctrl_rate(cost, c->alpha, t_draft, c->k_last);
        return c->k_last;
    }
    int32_t lo = TDM_MIN(TDM_MAX(c->k_min, 1), TDM_CTRL_MAX_K);
    int32_t hi = TDM_MIN(TDM_MAX(c->k_max, lo), TDM_CTRL_MAX_K);
    int32_t best = lo;
    double best_rate = -1.0;
    for (int32_t k = lo; k <= hi; k++) {
        double r = tdm_ctrl_rate(cost, c->alpha, t_draft, k);
        if (r > best_rate) { /* strict: ties keep the smaller k */
            best_rate = r;
            best = k;
        }
    }
    c->k_last = best;
    if (rate) *rate = best_rate;
    return best;
}

int32_t tdm_ctrl_plan(tdm_spec_ctrl *c, const tdm_cost_model *cost, double t_draft, double *rate) {
    double r = 0;
    const int32_t k = tdm_ctrl_choose_k_cost(c, cost, t_draft, &r);
    if (rate) *rate = r;
    if (!c || c->k_fixed > 0) return k;
    c->probing = false;
    const double plain = 1.0 / tdm_cost_verify(cost, 1);
    if (!(r < plain)) { /* (also NaN: speculate) */
        c->n_plain = 0;
        return k;
    }
    if (c->probe_gap < 0 || c->probe_gap > TDM_CTRL_PROBE_MAX) c->probe_gap = TDM_CTRL_PROBE_MIN;
    if (++c->n_plain <= c->probe_gap) {
        if (rate) *rate = plain;
        return 0;
    }
    c->n_plain = 0;
    c->probing = true;
    c->k_last = 1;
    if (rate) *rate = tdm_ctrl_rate(cost, c->alpha, t_draft, 1);
    return 1;
}

int32_t tdm_ctrl_choose_k(tdm_spec_ctrl *c, const tdm_cost_model *cost) {
    return tdm_ctrl_choose_k_cost(c, cost, tdm_cost_draft(cost), NULL);
}

void tdm_ctrl_observe(tdm_spec_ctrl *c, int32_t k, int32_t n_accepted) {
    if (!c || k <= 0) return; /* nothing drafted: no information */
    if (n_accepted < 0) n_accepted = 0;
    if (n_accepted > k) n_accepted = k;
    if (c->probing) { /* a back-off probe: the gap to the next */
        c->probe_gap = n_accepted > 0 ? 0 : TDM_MIN(TDM_MAX(2 * c->probe_gap, TDM_CTRL_PROBE_MIN), TDM_CTRL_PROBE_MAX);
        c->probing = false;
    }
    int32_t evaluated = TDM_MIN(n_accepted + 1, k);
    double w = c->alpha_ema;
    if (!(w > 0.0 && w <= 1.0)) w = 0.2;
    w *= (double)evaluated / (double)k;
    double a = isnan(c->alpha) ? ALPHA_PRIOR : clampd(c->alpha, 0.0, 1.0);
    c->alpha = a + w * ((double)n_accepted / (double)evaluated - a);
}
