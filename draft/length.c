/* length.c - the speculation length of a step, a lone sequence's or a batch's
 * (length.h). */
#include "length.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "liblog.h"

#define ALPHA_PRIOR 0.6

/* ------------------------------------------------------------- acceptance */

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

void tdm_ctrl_init(tdm_spec_ctrl *c, int32_t k_min, int32_t k_max, int32_t k_fixed) {
    if (!c) return;
    k_min = TDM_MIN(TDM_MAX(k_min, 1), TDM_CTRL_MAX_K);
    k_max = TDM_MIN(TDM_MAX(k_max, k_min), TDM_CTRL_MAX_K);
    c->k_min = k_min;
    c->k_max = k_max;
    c->k_fixed = TDM_MIN(TDM_MAX(k_fixed, 0), TDM_CTRL_MAX_K);
    c->alpha = ALPHA_PRIOR;
    c->alpha_ema = 0.2;
}

double tdm_ctrl_expected_tokens(double alpha, int32_t k) {
    if (k <= 0) return 1.0;
    if (!(alpha > 0.0)) return 1.0; /* also NaN */
    if (alpha >= 1.0) return (double)k + 1.0;
    return (1.0 - pow(alpha, (double)k + 1.0)) / (1.0 - alpha);
}

void tdm_ctrl_observe(tdm_spec_ctrl *c, int32_t k, int32_t n_accepted) {
    if (!c || k <= 0) return; /* nothing proposed: no information */
    n_accepted = TDM_MIN(TDM_MAX(n_accepted, 0), k);
    const int32_t evaluated = TDM_MIN(n_accepted + 1, k);
    double w = c->alpha_ema;
    if (!(w > 0.0 && w <= 1.0)) w = 0.2;
    w *= (double)evaluated / (double)k;
    const double a = isnan(c->alpha) ? ALPHA_PRIOR : clampd(c->alpha, 0.0, 1.0);
    c->alpha = a + w * ((double)n_accepted / (double)evaluated - a);
}

/* ------------------------------------------------------------- the decision */

void tdm_len_init(tdm_len_ctrl *c) {
    memset(c, 0, sizeof *c);
    tdm_pair_costs_init(&c->cost);
    c->dec_explore = c->explore_k = -1;
    c->probe_gap = TDM_CTRL_PROBE_MIN;
}

void tdm_len_observe_step(tdm_len_ctrl *c, int32_t n, int32_t k, double seconds) {
    tdm_step_costs_observe(&c->cost.steps, n, k, seconds);
}

double tdm_len_rate(const tdm_len_ctrl *c, int32_t n, double e, int32_t rows, int32_t rounds) {
    const tdm_pair_costs *pc = c ? &c->cost : NULL;
    const double t = (rounds > 0 ? rounds * tdm_cost_draft(pc, n) : 0.0) + tdm_cost_target(pc, rows);
    return e / (t > 0.0 ? t : 1e-30);
}

void tdm_len_lookup_costs(const tdm_len_ctrl *c, double *t_rows) {
    const tdm_pair_costs *pc = c ? &c->cost : NULL;
    t_rows[0] = 0.0;
    for (int32_t r = 1; r <= TDM_CTRL_MAX_K + 1; r++) t_rows[r] = tdm_cost_target(pc, r);
}

int32_t tdm_len_lookup_k_at(const double *t_rows, const tdm_spec_ctrl *ng, int32_t cap) {
    cap = TDM_MIN(TDM_MIN(cap, ng->k_max), TDM_CTRL_MAX_K);
    if (cap < 1) return 0;
    if (ng->k_fixed > 0) return TDM_MIN(ng->k_fixed, cap);
    const double a = isnan(ng->alpha) ? 0.0 : clampd(ng->alpha, 0.0, 0.999);
    int32_t best = 0;
    double best_rate = -1.0;
    for (int32_t k = TDM_MIN(TDM_MAX(ng->k_min, 1), cap); k <= cap; k++) {
        const double t = t_rows[1 + k];
        const double r = tdm_ctrl_expected_tokens(a, k) / (t > 0.0 ? t : 1e-30);
        if (r > best_rate * (1 + 1e-12)) best_rate = r, best = k; /* (ties keep the shorter) */
    }
    return best;
}

int32_t tdm_len_lookup_k(const tdm_len_ctrl *c, const tdm_spec_ctrl *ng, int32_t cap) {
    double t_rows[TDM_CTRL_MAX_K + 2];
    tdm_len_lookup_costs(c, t_rows);
    return tdm_len_lookup_k_at(t_rows, ng, cap);
}

/* Expected tokens e[0..k_max] and target rows[0..k_max] of the sequences at each
 * length, at their estimates (plus `lift`, at most 0.95, for a hopeful one). */
static void expected(const tdm_len_seq *seqs, int32_t n, int32_t k_max, double lift, double *e, int32_t *rows) {
    double pw[TDM_LEN_SEQ_MAX];
    const int32_t np = TDM_MIN(n, TDM_LEN_SEQ_MAX);
    double ek = (double)n;
    int32_t r = n;
    for (int32_t i = 0; i < np; i++) pw[i] = 1.0;
    for (int32_t k = 0; k <= k_max; k++) {
        if (k > 0)
            for (int32_t i = 0; i < np; i++) {
                if (k > seqs[i].cap) continue; /* (its chain stopped growing) */
                double a = isnan(seqs[i].alpha) ? 0.0 : clampd(seqs[i].alpha, 0.0, 1.0);
                if (lift > 0) a = TDM_MAX(a, TDM_MIN(a + lift, 0.95));
                pw[i] *= a;
                ek += pw[i];
                r++;
            }
        e[k] = ek;
        rows[k] = r;
    }
}

/* The best of k = 0 and k_min..k_max by e[k] / t[k] (ties keep the shorter). */
static int32_t best_of(const double *e, const double *t, int32_t k_min, int32_t k_max, double *rate) {
    int32_t best = 0;
    double best_rate = -1.0;
    for (int32_t k = 0; k <= k_max; k++) {
        if (k > 0 && k < k_min) continue;
        rate[k] = t[k] > 0.0 ? e[k] / t[k] : 0.0;
        if (rate[k] > best_rate * (1 + 1e-12)) best_rate = rate[k], best = k; /* (a tie, to rounding: the shorter) */
    }
    return best;
}

static void log_decision(const tdm_len_ctrl *c, int32_t n, int32_t other, int32_t k_max, int32_t k, bool trial,
                         double a_mean) {
    char msg[2048];
    const int32_t nb = TDM_MIN(n, TDM_STEP_COST_B);
    int len = snprintf(msg, sizeof msg, "len: batch %d (+%d rows) k_max %d -> k %d%s, mean alpha %.2f, explore %d; step ms:",
                       (int)n, (int)other, (int)k_max, (int)k, trial ? " (trial)" : "", a_mean, (int)c->dec_explore);
    for (int32_t j = 0; j <= k_max && len > 0 && (size_t)len < sizeof msg; j++)
        len += snprintf(msg + len, sizeof msg - (size_t)len, " %.3f", c->cost.steps.t[nb][j] * 1e3);
    if (len > 0 && (size_t)len < sizeof msg)
        len += snprintf(msg + len, sizeof msg - (size_t)len, "; draft round ms %.3f; target ms by rows (samples):",
                        tdm_rowcost_get(&c->cost.draft, n) * 1e3);
    for (int32_t r = n; r <= n * (k_max + 1) && r <= TDM_ROWCOST_MAX && len > 0 && (size_t)len < sizeof msg; r++)
        len += snprintf(msg + len, sizeof msg - (size_t)len, " %.3f(%d)", tdm_rowcost_get(&c->cost.target, r) * 1e3,
                        (int)c->cost.target.n[r]);
    tdm_log(TANDEM_LOG_INFO, "%s", msg);
}

void tdm_len_choose(tdm_len_ctrl *c, const tdm_len_seq *seqs, int32_t n, int32_t other, int32_t k_min, int32_t k_max,
                    tdm_len_choice *out) {
    memset(out, 0, sizeof *out);
    if (n < 1) return;
    k_max = TDM_MIN(TDM_MAX(k_max, 0), TDM_CTRL_MAX_K);
    k_min = TDM_MAX(k_min, 1);
    const int32_t nb = TDM_MIN(n, TDM_STEP_COST_B);
    const double *meas = c->cost.steps.t[nb];
    const uint8_t *nm = c->cost.steps.n[nb];
    const tdm_pair_costs *pc = &c->cost;
    c->n_steps++;
    double a_mean = 0;
    for (int32_t i = 0; i < n; i++) a_mean += (isnan(seqs[i].alpha) ? 0.0 : seqs[i].alpha) / n;
    if (c->probing) { /* the last step probed: did it lift the estimates? */
        c->probe_gap = a_mean > c->probe_alpha + 1e-9 ? TDM_CTRL_PROBE_MIN
                                                       : TDM_MIN(TDM_MAX(2 * c->probe_gap, TDM_CTRL_PROBE_MIN), TDM_CTRL_PROBE_MAX);
        c->probing = false;
    }
    /* each length's expected tokens and rows, the model's cost and the measured */
    double e[TDM_CTRL_MAX_K + 1], model[TDM_CTRL_MAX_K + 1], t[TDM_CTRL_MAX_K + 1], rate[TDM_CTRL_MAX_K + 1];
    int32_t rows[TDM_CTRL_MAX_K + 1];
    expected(seqs, n, k_max, 0.0, e, rows);
    const double td = tdm_cost_draft(pc, n);
    for (int32_t k = 0; k <= k_max; k++) model[k] = (double)k * td + tdm_cost_target(pc, rows[k]);
    const bool plain_measured = meas[0] > 0.0;
    for (int32_t k = 0; k <= k_max; k++) {
        /* a length sampled twice is its measurement; else the nearest such length's
         * plus the model's difference (the lower one first), or the nearest sampled
         * once, or the model alone; a single sample (which may include one-time work:
         * a graph captured, the draft catching up) only where it is the cheaper */
        int32_t j = -1;
        for (int32_t want = 2; want >= 1 && j < 0; want--)
            for (int32_t d = 0; j < 0 && d <= k_max; d++) {
                if (k - d >= 0 && nm[k - d] >= want) j = k - d;
                else if (k + d <= k_max && nm[k + d] >= want) j = k + d;
            }
        double tk = j >= 0 ? meas[j] + model[k] - model[j] : model[k];
        if (j != k && nm[k] >= 1) tk = TDM_MIN(tk, meas[k]);
        if (other > 0) tk += TDM_MAX(tdm_cost_target(pc, rows[k] + other) - tdm_cost_target(pc, rows[k]), 0.0);
        t[k] = tk;
    }
    int32_t best = best_of(e, t, k_min, k_max, rate);
    bool trial = false;
    int32_t explore = -1;
    if (!plain_measured) {
        best = 0; /* plain first */
    } else {
        trial = nm[best] < 2;
        /* a neighbour worth measuring (again): one sampled less than twice (its only
         * sample may include one-time work), else one expected within 10 % of the
         * best, else either, in turn (a measurement that held one-time work twice
         * would otherwise never be corrected) */
        const int32_t turn = (c->n_steps >> 8) & 1 ? 1 : -1;
        for (int32_t d = -1; d <= 1; d += 2) {
            const int32_t k = best + d;
            if (k < 0 || k > k_max || (k > 0 && k < k_min)) continue;
            if (nm[k] < 2 && (explore < 0 || nm[explore] >= 2)) explore = k;
            else if (explore < 0 && rate[k] >= 0.9 * rate[best]) explore = k;
        }
        if (explore < 0 && best > 0) { /* (from 0, a check would cost the draft's catching up) */
            for (int32_t d = turn, i = 0; i < 2 && explore < 0; i++, d = -d) {
                const int32_t k = best + d;
                if (k >= 0 && k <= k_max && !(k > 0 && k < k_min)) explore = k;
            }
        }
    }
    int32_t k;
    if (n == c->dec_b && k_max == c->dec_kmax && c->dec_hold > 0) {
        k = c->dec_k;
        c->dec_hold--;
    } else {
        k = best;
        c->dec_b = n, c->dec_kmax = k_max, c->dec_k = k, c->dec_explore = explore;
        c->dec_hold = trial ? 2 : n > 1 ? 7 : 0;
        if (c->log) log_decision(c, n, other, k_max, k, trial, a_mean);
    }
    if ((c->n_steps & 255) == 0) c->explore_k = c->dec_explore;
    const bool exploring = plain_measured && (c->n_steps & 255) < 3 && c->explore_k >= 0;
    if (exploring) k = TDM_MIN(c->explore_k, k_max);
    if (k == 0 && plain_measured && !exploring) {
        if (++c->n_plain > c->probe_gap) { /* back-off: probe with a hopeful estimate's length */
            c->n_plain = 0;
            double eh[TDM_CTRL_MAX_K + 1], rh[TDM_CTRL_MAX_K + 1];
            int32_t rowsh[TDM_CTRL_MAX_K + 1];
            /* (not where speculation would hardly pay even at acceptance 0.95: there
             * the cost decides, and a probe only costs) */
            expected(seqs, n, k_max, 1.0, eh, rowsh);
            const int32_t kx = best_of(eh, t, k_min, k_max, rh);
            if (kx > 0 && rh[kx] >= 1.1 * rh[0]) {
                expected(seqs, n, k_max, 0.2, eh, rowsh);
                const int32_t kh = best_of(eh, t, k_min, k_max, rh);
                k = kh > 0 ? kh : TDM_MIN(k_min, k_max);
                out->probe = c->probing = true;
                c->probe_alpha = a_mean;
            }
        }
    } else if (k > 0) {
        c->n_plain = 0;
    }
    out->k = k;
    out->trial = k > 0 && nm[k] < 2;
    out->rate = t[k] > 0.0 ? e[k] / t[k] : 0.0;
    out->rate_plain = t[0] > 0.0 ? e[0] / t[0] : 0.0;
    out->e = e[k];
    out->rows = rows[k];
}
