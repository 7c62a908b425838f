/* costs.c - measured forward and step costs (costs.h). */
#include "costs.h"

#include <math.h>

#include "common.h"

void tdm_rowcost_init(tdm_rowcost *c) {
    for (int i = 0; i <= TDM_ROWCOST_MAX; i++) c->t[i] = 0.0, c->n[i] = 0;
    c->ema = 0.2;
    c->top = 0;
}

void tdm_rowcost_observe(tdm_rowcost *c, int32_t rows, double seconds) {
    if (rows < 1 || !(seconds > 0.0) || isinf(seconds)) return;
    if (rows > TDM_ROWCOST_MAX) rows = TDM_ROWCOST_MAX;
    /* (the first two samples: the lesser, since one-time work (a CUDA graph captured
     * for a new shape) only ever makes a forward dearer, and a count whose estimate
     * stays too dear is never chosen again to be measured; then an EMA, where a
     * sample under half the estimate replaces it (the estimate held one-time work)
     * and one over twice the estimate moves it as one twice as dear would (another
     * process or a page fault slowed that forward, not its row count)) */
    if (c->n[rows] < 2) {
        c->t[rows] = c->n[rows] == 0 || seconds < c->t[rows] ? seconds : c->t[rows];
        c->n[rows]++;
    } else {
        if (seconds > 2.0 * c->t[rows]) seconds = 2.0 * c->t[rows];
        c->t[rows] = seconds < 0.5 * c->t[rows] ? seconds : c->t[rows] + c->ema * (seconds - c->t[rows]);
    }
    if (rows > c->top) c->top = rows;
}

static double rowcost_anchored(const tdm_rowcost *c, int32_t rows, uint8_t need);

/* The estimate for rows from the other measured counts (rows itself unmeasured or
 * left out): the lesser of the estimates anchored on every measured count and on
 * those sampled at least twice (a count sampled once may hold one-time work, a CUDA
 * graph captured: as an anchor it would make its neighbours look dear too, and they
 * would never be tried and measured; an optimistic estimate is corrected by the
 * first step that takes it). */
static double rowcost_from_others(const tdm_rowcost *c, int32_t rows) {
    const double all = rowcost_anchored(c, rows, 1), twice = rowcost_anchored(c, rows, 2);
    return twice > 0.0 && (all <= 0.0 || twice < all) ? twice : all;
}

double tdm_rowcost_get(const tdm_rowcost *c, int32_t rows) {
    if (rows < 1) rows = 1;
    if (rows > TDM_ROWCOST_MAX) { /* beyond the table: proportional to the last entry's estimate */
        const double t = tdm_rowcost_get(c, TDM_ROWCOST_MAX);
        return t * (double)rows / TDM_ROWCOST_MAX;
    }
    if (c->t[rows] > 0.0 && c->n[rows] >= 2) return c->t[rows];
    const double o = rowcost_from_others(c, rows);
    if (c->t[rows] > 0.0) return o > 0.0 && o < c->t[rows] ? o : c->t[rows]; /* (one sample: at most the others' estimate) */
    return o;
}

/* The estimate for rows from the other counts sampled at least `need` times. */
static double rowcost_anchored(const tdm_rowcost *c, int32_t rows, uint8_t need) {
    int32_t lo = 0, hi = 0;
    for (int32_t i = rows - 1; i >= 1; i--)
        if (c->t[i] > 0.0 && c->n[i] >= need) {
            lo = i;
            break;
        }
    for (int32_t i = rows + 1; i <= c->top; i++)
        if (c->t[i] > 0.0 && c->n[i] >= need) {
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
        if (c->t[i] > 0.0 && c->n[i] >= need) {
            lo2 = i;
            break;
        }
    double slope = lo2 ? (c->t[lo] - c->t[lo2]) / (double)(lo - lo2) : 0.0;
    if (slope < 0.0) slope = 0.0;
    /* (at most proportional to the highest: a fixed overhead plus a cost per row
     * lies between flat and proportional, and two close noisy points can give a
     * slope steeper than that, which would keep longer proposals from ever being
     * tried and measured) */
    return TDM_MIN(c->t[lo] + slope * (double)(rows - lo), c->t[lo] * (double)rows / (double)lo);
}

void tdm_step_costs_init(tdm_step_costs *t) {
    for (int b = 0; b <= TDM_STEP_COST_B; b++)
        for (int k = 0; k <= TDM_CTRL_MAX_K; k++) t->t[b][k] = 0.0, t->n[b][k] = 0;
}

void tdm_step_costs_observe(tdm_step_costs *t, int32_t batch, int32_t k, double seconds) {
    if (batch < 1 || k < 0 || k > TDM_CTRL_MAX_K || !(seconds > 0.0) || isinf(seconds)) return;
    if (batch > TDM_STEP_COST_B) batch = TDM_STEP_COST_B;
    double *x = &t->t[batch][k];
    if (t->n[batch][k] < 2) { /* (the lesser of the first two: either may include one-time work) */
        *x = t->n[batch][k] == 0 || seconds < *x ? seconds : *x;
        t->n[batch][k]++;
        return;
    }
    /* a step slowed by something else (another process, a page fault) moves the
     * estimate by at most as much as a step twice as dear; one at less than half
     * the estimate replaces it (the estimate held one-time work: nothing makes a
     * step that much faster by chance) */
    if (seconds < 0.5 * *x) {
        *x = seconds;
        return;
    }
    *x += 0.2 * ((seconds > 2.0 * *x ? 2.0 * *x : seconds) - *x);
}

void tdm_pair_costs_init(tdm_pair_costs *c) {
    tdm_rowcost_init(&c->target);
    tdm_rowcost_init(&c->draft);
    tdm_step_costs_init(&c->steps);
}

double tdm_cost_target(const tdm_pair_costs *c, int32_t rows) {
    const double t = c ? tdm_rowcost_get(&c->target, rows) : 0.0;
    return t > 0.0 ? t : 1.0;
}

double tdm_cost_draft(const tdm_pair_costs *c, int32_t n) {
    const double t = c ? tdm_rowcost_get(&c->draft, n) : 0.0;
    return t > 0.0 ? t : tdm_cost_target(c, n) / 4.0;
}
