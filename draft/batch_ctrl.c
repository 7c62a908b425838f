/* batch_ctrl.c - the speculation length of a batch (batch_ctrl.h). */
#include "batch_ctrl.h"

#include <math.h>

#include "common.h"
#include "controller.h"

void tdm_rowcost_init(tdm_rowcost *c) {
    for (int i = 0; i <= TDM_ROWCOST_MAX; i++) c->t[i] = 0.0;
    c->ema = 0.2;
}

void tdm_rowcost_observe(tdm_rowcost *c, int32_t rows, double seconds) {
    if (rows < 1 || !(seconds > 0.0) || isinf(seconds)) return;
    if (rows > TDM_ROWCOST_MAX) rows = TDM_ROWCOST_MAX;
    c->t[rows] = c->t[rows] > 0.0 ? c->t[rows] + c->ema * (seconds - c->t[rows]) : seconds;
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
    if (lo && hi) return c->t[lo] + (c->t[hi] - c->t[lo]) * (double)(rows - lo) / (double)(hi - lo);
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

int32_t tdm_batch_choose_k(const tdm_rowcost *target, const tdm_rowcost *draft, const tdm_batch_seq *seqs,
                           int32_t n, int32_t other_rows, int32_t k_max) {
    if (n <= 0 || k_max <= 0) return 0;
    /* no speculation until the plain step is measured (the safe choice); then larger
     * row counts look as cheap as the largest measured one until they are tried */
    bool plain_known = false;
    for (int32_t r = TDM_MIN(n + other_rows, TDM_ROWCOST_MAX); r >= 1 && !plain_known; r--) plain_known = target->t[r] > 0.0;
    if (!plain_known) return 0;
    double t0 = tdm_rowcost_get(target, n + other_rows);
    double td = tdm_rowcost_get(draft, n);
    if (!(td > 0.0)) td = t0 / 4.0; /* (the single-sequence controller's prior) */
    int32_t best = 0;
    double best_rate = (double)n / t0;
    /* E[tokens] of sequence i at k: 1 + a + ... + a^k, grown one power per k */
    double e = (double)n;
    int32_t rows = other_rows + n;
    double pw[TDM_BATCH_SEQ_MAX];
    const int32_t np = TDM_MIN(n, TDM_BATCH_SEQ_MAX);
    for (int32_t i = 0; i < np; i++) pw[i] = 1.0;
    for (int32_t k = 1; k <= k_max; k++) {
        for (int32_t i = 0; i < np; i++) {
            if (k > seqs[i].cap) continue; /* (its chain stopped growing) */
            const double a = seqs[i].alpha > 0.0 ? (seqs[i].alpha < 1.0 ? seqs[i].alpha : 1.0) : 0.0;
            pw[i] *= a;
            e += pw[i];
            rows++;
        }
        const double t = (double)k * td + tdm_rowcost_get(target, rows);
        if (t > 0.0 && e / t > best_rate) {
            best_rate = e / t;
            best = k;
        }
    }
    return best;
}

void tdm_batch_rates_init(tdm_batch_rates *t) {
    for (int b = 0; b <= TDM_BATCH_RATE_B; b++)
        for (int k = 0; k <= TDM_BATCH_RATE_K; k++) t->r[b][k] = 0.0;
}

void tdm_batch_rates_observe(tdm_batch_rates *t, int32_t batch, int32_t k, double tokens_per_s) {
    if (batch < 1 || k < 0 || k > TDM_BATCH_RATE_K || !(tokens_per_s > 0.0) || isinf(tokens_per_s)) return;
    if (batch > TDM_BATCH_RATE_B) batch = TDM_BATCH_RATE_B;
    double *r = &t->r[batch][k];
    *r = *r > 0.0 ? *r + 0.2 * (tokens_per_s - *r) : tokens_per_s;
}

int32_t tdm_batch_choose_k_measured(const tdm_batch_rates *t, const tdm_rowcost *target, const tdm_rowcost *draft,
                                    const tdm_batch_seq *seqs, int32_t n, int32_t other_rows, int32_t k_max) {
    if (n <= 0) return 0;
    const int32_t b = TDM_MIN(n, TDM_BATCH_RATE_B);
    k_max = TDM_MIN(k_max, TDM_BATCH_RATE_K);
    const double *r = t->r[b];
    if (!(r[0] > 0.0) || k_max <= 0) return 0; /* plain first */
    int32_t best = 0;
    bool all = true;
    for (int32_t k = 1; k <= k_max; k++) {
        if (r[k] > r[best]) best = k;
        all &= r[k] > 0.0;
    }
    if (all) return best; /* (the model is not needed: every step, this is cheap) */
    const int32_t k_model = tdm_batch_choose_k(target, draft, seqs, n, other_rows, k_max);
    return r[k_model] > 0.0 ? best : k_model; /* try what the model expects, once */
}
