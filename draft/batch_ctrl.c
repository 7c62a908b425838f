/* batch_ctrl.c - the speculation length of a batch (batch_ctrl.h). */
#include "batch_ctrl.h"

#include <math.h>

#include "common.h"
#include "controller.h"

void tdm_rowcost_init(tdm_rowcost *c) {
    for (int i = 0; i <= TDM_ROWCOST_MAX; i++) c->t[i] = 0.0, c->n[i] = 0;
    c->ema = 0.2;
}

void tdm_rowcost_observe(tdm_rowcost *c, int32_t rows, double seconds) {
    if (rows < 1 || !(seconds > 0.0) || isinf(seconds)) return;
    if (rows > TDM_ROWCOST_MAX) rows = TDM_ROWCOST_MAX;
    c->t[rows] = c->n[rows] < 2 ? seconds : c->t[rows] + c->ema * (seconds - c->t[rows]);
    if (c->n[rows] < 2) c->n[rows]++;
}

double tdm_rowcost_get(const tdm_rowcost *c, int32_t rows) {
    if (rows < 1) rows = 1;
    if (rows > TDM_ROWCOST_MAX) { /* beyond the table: proportional to the last entry's estimate */
        const double t = tdm_rowcost_get(c, TDM_ROWCOST_MAX);
        return t * (double)rows / TDM_ROWCOST_MAX;
    }
    if (c->t[rows] > 0.0) return c->t[rows];
    int32_t lo = 0, hi = 0;
    for (int32_t i = rows - 1; i >= 1; i--)
        if (c->t[i] > 0.0) {
            lo = i;
            break;
        }
    for (int32_t i = rows + 1; i <= TDM_ROWCOST_MAX; i++)
        if (c->t[i] > 0.0) {
            hi = i;
            break;
        }
    if (lo && hi) {
        const double line = c->t[lo] + (c->t[hi] - c->t[lo]) * (double)(rows - lo) / (double)(hi - lo);
        const double roof = TDM_MAX(c->t[lo], c->t[hi] * (double)rows / (double)hi);
        return TDM_MIN(line, roof);
    }
    if (hi) return c->t[hi]; /* below every measurement: no dearer than the next */
    if (!lo) return 0.0;
    /* above every measurement: the slope of the two highest points, at least flat */
    int32_t lo2 = 0;
    for (int32_t i = lo - 1; i >= 1; i--)
        if (c->t[i] > 0.0) {
            lo2 = i;
            break;
        }
    double slope = lo2 ? (c->t[lo] - c->t[lo2]) / (double)(lo - lo2) : 0.0;
    if (slope < 0.0) slope = 0.0;
    return c->t[lo] + slope * (double)(rows - lo);
}

void tdm_batch_steps_init(tdm_batch_steps *t) {
    for (int b = 0; b <= TDM_BATCH_STEP_B; b++)
        for (int k = 0; k <= TDM_BATCH_STEP_K; k++) t->t[b][k] = 0.0, t->n[b][k] = 0;
}

void tdm_batch_steps_observe(tdm_batch_steps *t, int32_t batch, int32_t k, double seconds) {
    if (batch < 1 || k < 0 || k > TDM_BATCH_STEP_K || !(seconds > 0.0) || isinf(seconds)) return;
    if (batch > TDM_BATCH_STEP_B) batch = TDM_BATCH_STEP_B;
    double *x = &t->t[batch][k];
    if (t->n[batch][k] < 2) { /* (the first may include one-time work) */
        *x = seconds;
        t->n[batch][k]++;
        return;
    }
    /* a step slowed by something else (another process, a page fault) moves the
     * estimate by at most as much as a step twice as dear */
    const double v = seconds > 2.0 * *x ? 2.0 * *x : seconds < 0.5 * *x ? 0.5 * *x : seconds;
    *x += 0.2 * (v - *x);
}

int32_t tdm_batch_choose_k_measured(const tdm_batch_steps *t, const tdm_rowcost *target, const tdm_rowcost *draft,
                                    const tdm_batch_seq *seqs, int32_t n, int32_t other_rows, int32_t k_max,
                                    bool *trial, int32_t *explore) {
    if (trial) *trial = false;
    if (explore) *explore = -1;
    if (n <= 0) return 0;
    const double *meas = t->t[TDM_MIN(n, TDM_BATCH_STEP_B)];
    k_max = TDM_MIN(k_max, TDM_BATCH_STEP_K);
    if (!(meas[0] > 0.0) || k_max <= 0) return 0; /* plain first */
    /* expected tokens and rows of each length, and the model's cost of each */
    double e[TDM_BATCH_STEP_K + 1], model[TDM_BATCH_STEP_K + 1], extra[TDM_BATCH_STEP_K + 1];
    double pw[TDM_BATCH_SEQ_MAX];
    const int32_t np = TDM_MIN(n, TDM_BATCH_SEQ_MAX);
    double td = tdm_rowcost_get(draft, n);
    if (!(td > 0.0)) td = tdm_rowcost_get(target, n) / 4.0; /* (the single-sequence controller's prior) */
    double ek = (double)n;
    int32_t rows = n;
    for (int32_t i = 0; i < np; i++) pw[i] = 1.0;
    for (int32_t k = 0; k <= k_max; k++) {
        if (k > 0)
            for (int32_t i = 0; i < np; i++) {
                if (k > seqs[i].cap) continue; /* (its chain stopped growing) */
                const double a = seqs[i].alpha > 0.0 ? (seqs[i].alpha < 1.0 ? seqs[i].alpha : 1.0) : 0.0;
                pw[i] *= a;
                ek += pw[i];
                rows++;
            }
        const double tr = tdm_rowcost_get(target, rows);
        e[k] = ek;
        model[k] = (double)k * td + tr;
        extra[k] = other_rows > 0 ? tdm_rowcost_get(target, rows + other_rows) - tr : 0.0;
    }
    int32_t best = 0;
    double best_rate = 0.0, rate[TDM_BATCH_STEP_K + 1];
    for (int32_t k = 0; k <= k_max; k++) {
        double tk = meas[k];
        if (!(tk > 0.0)) { /* from the nearest measured length, the lower one first */
            int32_t j = -1;
            for (int32_t d = 1; j < 0 && d <= k_max; d++) {
                if (k - d >= 0 && meas[k - d] > 0.0) j = k - d;
                else if (k + d <= k_max && meas[k + d] > 0.0) j = k + d;
            }
            tk = meas[j] + model[k] - model[j];
        }
        tk += extra[k] > 0.0 ? extra[k] : 0.0;
        rate[k] = tk > 0.0 ? e[k] / tk : 0.0;
        if (rate[k] > best_rate) {
            best_rate = rate[k];
            best = k;
        }
    }
    if (trial) *trial = !(meas[best] > 0.0);
    /* a neighbour worth measuring (again): one sampled less than twice (its only
     * sample may include one-time work), else one expected within 10 % of the best */
    const uint8_t *nm = t->n[TDM_MIN(n, TDM_BATCH_STEP_B)];
    for (int32_t d = -1; explore && d <= 1; d += 2) {
        const int32_t k = best + d;
        if (k < 0 || k > k_max) continue;
        if (nm[k] < 2 && (*explore < 0 || nm[*explore] >= 2)) *explore = k;
        else if (*explore < 0 && rate[k] >= 0.9 * best_rate) *explore = k;
    }
    return best;
}
