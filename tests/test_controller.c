/* test_controller.c - the speculation length (draft/length.h): expected tokens,
 * acceptance estimation, the choice of k for a batch of one and of many against
 * brute force over measured step costs (draft/costs.h), unmeasured lengths from the
 * row model, holding, exploration, back-off and probes; the lookup length; chain or
 * tree from a tree's own measured costs (draft/tree_ctrl.h); lookups that stop
 * proposing where their measured rate is below the draft model's (draft/payoff.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "common.h"
#include "costs.h"
#include "length.h"
#include "payoff.h"
#include "testutil.h"
#include "tree_ctrl.h"

/* 1 + a + ... + a^k: the expected tokens of a step, summed term by term. */
static double series(double a, int k) {
    double s = 0, t = 1;
    for (int i = 0; i <= k; i++) {
        s += t;
        t *= a;
    }
    return s;
}

Test(controller, expected_tokens_formula) {
    for (int k = 0; k <= 12; k++) {
        cr_assert_float_eq(tdm_ctrl_expected_tokens(0.0, k), 1.0, 1e-12, "alpha 0, k %d", k);
        cr_assert_float_eq(tdm_ctrl_expected_tokens(1.0, k), k + 1.0, 1e-12, "alpha 1, k %d", k);
        cr_assert_float_eq(tdm_ctrl_expected_tokens(1.0 - 1e-9, k), k + 1.0, 1e-5, "alpha -> 1, k %d", k);
        for (double a = 0.05; a < 1.0; a += 0.1)
            cr_assert_float_eq(tdm_ctrl_expected_tokens(a, k), series(a, k), 1e-9, "alpha %g k %d", a, k);
    }
    cr_assert_float_eq(tdm_ctrl_expected_tokens(0.7, 0), 1.0, 1e-12, "k = 0: only the target's token");
    cr_assert_float_eq(tdm_ctrl_expected_tokens(0.5, 1), 1.5, 1e-12);
    cr_assert_float_eq(tdm_ctrl_expected_tokens(0.5, 2), 1.75, 1e-12);
    cr_assert_float_eq(tdm_ctrl_expected_tokens(-0.3, 4), 1.0, 1e-12);
    cr_assert_float_eq(tdm_ctrl_expected_tokens(NAN, 4), 1.0, 1e-12);
}

/* Bernoulli acceptance process: each drafted token accepted with probability a, the
 * step stops at the first rejection. */
static double run_alpha(double a, double ema, int fixed_k, uint64_t seed, int steps) {
    tdm_spec_ctrl ctl;
    tdm_ctrl_init(&ctl, 1, 16, 0);
    ctl.alpha_ema = ema;
    uint64_t st = seed;
    double sum = 0;
    int cnt = 0;
    for (int s = 0; s < steps; s++) {
        int k = fixed_k ? fixed_k : 1 + (int)(tdm_test_rand(&st) % 16);
        int n = 0;
        while (n < k && tdm_test_randu(&st) < a) n++;
        tdm_ctrl_observe(&ctl, k, n);
        cr_assert(ctl.alpha >= 0 && ctl.alpha <= 1);
        if (s >= steps / 4) {
            sum += ctl.alpha;
            cnt++;
        }
    }
    return sum / cnt;
}

Test(controller, alpha_converges_to_true_rate) {
    const double rates[] = {0.05, 0.3, 0.6, 0.8, 0.95};
    for (size_t i = 0; i < TDM_ARRAY_LEN(rates); i++) {
        double a = rates[i];
        double m_var = run_alpha(a, 0.02, 0, 100 + i, 40000);   /* k varies per step */
        double m_k2 = run_alpha(a, 0.02, 2, 200 + i, 40000);    /* k = 2: a per-step ratio EMA is biased here */
        double m_k8 = run_alpha(a, 0.02, 8, 300 + i, 40000);
        cr_assert_lt(fabs(m_var - a), 0.01, "true %g, estimate %g (k varies)", a, m_var);
        cr_assert_lt(fabs(m_k2 - a), 0.01, "true %g, estimate %g (k = 2)", a, m_k2);
        cr_assert_lt(fabs(m_k8 - a), 0.01, "true %g, estimate %g (k = 8)", a, m_k8);
    }
    /* With the default weight the estimate also tracks the rate, just more noisily. */
    cr_assert_lt(fabs(run_alpha(0.7, 0.2, 0, 7, 20000) - 0.7), 0.03);
}

Test(controller, alpha_tracks_a_change) {
    tdm_spec_ctrl ctl;
    tdm_ctrl_init(&ctl, 1, 8, 0);
    for (int s = 0; s < 200; s++) tdm_ctrl_observe(&ctl, 4, 4); /* everything accepted */
    cr_assert_gt(ctl.alpha, 0.99);
    for (int s = 0; s < 200; s++) tdm_ctrl_observe(&ctl, 4, 0); /* everything rejected */
    cr_assert_lt(ctl.alpha, 0.01);
    double before = ctl.alpha;
    tdm_ctrl_observe(&ctl, 0, 0); /* nothing drafted: no information */
    cr_assert_eq(ctl.alpha, before);
    tdm_ctrl_observe(&ctl, 3, 7); /* n_accepted clamped to k */
    cr_assert_gt(ctl.alpha, before);
}

Test(controller, init_clamps) {
    tdm_spec_ctrl ctl;
    tdm_ctrl_init(&ctl, 0, 100, 0);
    cr_assert_eq(ctl.k_min, 1);
    cr_assert_eq(ctl.k_max, TDM_CTRL_MAX_K);
    tdm_ctrl_init(&ctl, 6, 3, 0);
    cr_assert(ctl.k_min == 6 && ctl.k_max == 6);
    tdm_ctrl_init(&ctl, 2, 9, 99);
    cr_assert_eq(ctl.k_fixed, TDM_CTRL_MAX_K);
    cr_assert_float_eq(ctl.alpha_ema, 0.2, 1e-12);
    tdm_ctrl_init(&ctl, 2, 9, -3);
    cr_assert_eq(ctl.k_fixed, 0);
}

/* ---- the length of a step (draft/length.h) ---- */

static void seqs_at(tdm_len_seq *bs, int n, double alpha, int cap) {
    for (int i = 0; i < n; i++) bs[i] = (tdm_len_seq){alpha, cap};
}

/* A controller whose step costs at batch b are T[0..kmax], each measured twice. */
static void measure_steps(tdm_len_ctrl *c, int b, const double *T, int kmax) {
    for (int k = 0; k <= kmax; k++) tdm_len_observe_step(c, b, k, T[k]), tdm_len_observe_step(c, b, k, T[k]);
}

/* The brute-force best of E(k) / T(k) over k = 0 and [kmin, kmax], the shorter on
 * ties (E from the sequences' alphas and caps, as length.h defines it). */
static int brute_len(const tdm_len_seq *bs, int n, const double *T, int kmin, int kmax, double *best_rate) {
    int best = 0;
    double br = -1;
    for (int k = 0; k <= kmax; k++) {
        if (k > 0 && k < kmin) continue;
        double e = 0;
        for (int i = 0; i < n; i++) e += series(bs[i].alpha, k < bs[i].cap ? k : bs[i].cap);
        const double r = e / T[k];
        if (r > br * (1 + 1e-12)) br = r, best = k;
    }
    if (best_rate) *best_rate = br;
    return best;
}

/* With every length measured the choice is the brute-force best, for a lone
 * sequence and for batches, on cost curves of every shape, with mixed alphas and
 * caps. */
Test(controller, len_choice_matches_brute_force) {
    static tdm_len_ctrl c;
    uint64_t st = 5;
    int checked = 0;
    const int sizes[] = {1, 4, 16};
    for (int curve = 0; curve < 5; curve++)
        for (int trial = 0; trial < 150; trial++) {
            const int n = sizes[trial % 3];
            double T[TDM_CTRL_MAX_K + 1];
            const double base = 0.005 + 0.05 * tdm_test_randu(&st), slope = 0.3 * tdm_test_randu(&st) * base;
            for (int k = 0; k <= TDM_CTRL_MAX_K; k++) {
                switch (curve) {
                case 0: T[k] = base + 0.01 * slope * k; break;                 /* memory bound */
                case 1: T[k] = base + slope * k; break;                        /* overhead + linear */
                case 2: T[k] = base * (1 + k); break;                          /* compute bound */
                case 3: T[k] = base + slope * k * k * 0.1; break;              /* convex */
                default: T[k] = base * (1 + (k > 8) + (k > 16)) + slope * k;   /* steps (tiles) */
                }
            }
            tdm_len_init(&c);
            measure_steps(&c, n, T, TDM_CTRL_MAX_K);
            tdm_len_seq bs[16];
            for (int i = 0; i < n; i++)
                bs[i] = (tdm_len_seq){trial % 10 == 0 ? 1.0 : tdm_test_randu(&st), 1 + (int)(tdm_test_rand(&st) % TDM_CTRL_MAX_K)};
            const int kmin = 1 + (int)(tdm_test_rand(&st) % 3);
            const int kmax = kmin + (int)(tdm_test_rand(&st) % (TDM_CTRL_MAX_K - kmin + 1));
            tdm_len_choice ch;
            tdm_len_choose(&c, bs, n, 0, kmin, kmax, &ch);
            double br;
            const int want = brute_len(bs, n, T, kmin, kmax, &br);
            cr_assert_eq(ch.k, want, "curve %d batch %d k in [%d, %d]: chose %d, best %d", curve, n, kmin, kmax, ch.k, want);
            cr_assert(!ch.trial && !ch.probe);
            cr_assert_float_eq(ch.rate, br, 1e-9 * br, "the choice's rate");
            cr_assert_float_eq(ch.rate_plain, n / T[0], 1e-9 * n / T[0], "a plain step's rate");
            checked++;
        }
    cr_assert_eq(checked, 750);
}

Test(controller, len_plain_step_first) {
    static tdm_len_ctrl c;
    tdm_len_init(&c);
    tdm_len_seq bs[16];
    seqs_at(bs, 16, 0.9, 8);
    tdm_len_choice ch;
    tdm_len_choose(&c, bs, 16, 0, 1, 8, &ch);
    cr_assert_eq(ch.k, 0, "nothing measured: plain");
    cr_assert(!ch.trial && !ch.probe);
    cr_assert_eq(c.dec_explore, -1);
    tdm_len_init(&c);
    tdm_len_choose(&c, bs, 1, 0, 1, 8, &ch);
    cr_assert_eq(ch.k, 0, "a lone sequence too");
}

/* Neighbours to measure: one sampled once first, whatever its one sample says,
 * then one expected within 10 % of the best, else, while speculating, either in
 * turn; exploration takes 3 steps in every 256. */
Test(controller, len_explores_neighbours) {
    static tdm_len_ctrl c;
    tdm_len_init(&c);
    const int B = 16;
    const double T[] = {10e-3, 22e-3, 30e-3, 37e-3, 45e-3};
    measure_steps(&c, B, T, 4);
    tdm_len_seq bs[16];
    seqs_at(bs, B, 0.6, 8);
    tdm_len_choice ch;
    tdm_len_choose(&c, bs, B, 0, 1, 4, &ch);
    cr_assert_eq(ch.k, 0);
    cr_assert_eq(c.dec_explore, -1, "not speculating: k = 1 (16 * 1.6 / 22 ms, below 16 / 10 ms) is left to the probes");
    static tdm_len_ctrl c1; /* a lone sequence, alpha 0.9: k = 3 best (3.44 / 17 ms), k = 2 and 4 within 10 % */
    tdm_len_init(&c1);
    const double T1[] = {10e-3, 12e-3, 14e-3, 17e-3, 21e-3};
    measure_steps(&c1, 1, T1, 4);
    const tdm_len_seq one = {0.9, 8};
    tdm_len_choose(&c1, &one, 1, 0, 1, 4, &ch);
    cr_assert_eq(ch.k, 3);
    cr_assert_eq(c1.dec_explore, 2, "a neighbour nearly as good");
    const double T2[] = {10e-3, 12e-3, 14e-3, 30e-3, 40e-3}; /* k = 2 best, k = 1 and 3 clearly worse */
    tdm_len_init(&c1);
    measure_steps(&c1, 1, T2, 4);
    tdm_len_choose(&c1, &one, 1, 0, 1, 4, &ch);
    cr_assert_eq(ch.k, 2);
    cr_assert(c1.dec_explore == 1 || c1.dec_explore == 3, "while speculating, a neighbour in turn (got %d)", c1.dec_explore);
    tdm_len_init(&c);
    tdm_len_observe_step(&c, B, 0, 10e-3);
    tdm_len_observe_step(&c, B, 0, 10e-3);
    tdm_len_observe_step(&c, B, 1, 80e-3);
    tdm_len_choose(&c, bs, B, 0, 1, 4, &ch);
    cr_assert_eq(ch.k, 0);
    cr_assert_eq(c.dec_explore, 1, "k = 1 has one sample");
    int explored = 0;
    for (int s = 2; s <= 514; s++) { /* (decisions 256-258 and 512-514 explore) */
        tdm_len_choose(&c, bs, B, 0, 1, 4, &ch);
        explored += ch.k == 1 && !ch.probe;
    }
    cr_assert_eq(explored, 6, "3 steps in every 256 explore (got %d in 514)", explored);
}

/* An unmeasured length is estimated from the nearest measured one plus the row
 * model's difference, and tried (a trial, held 3 steps) when that estimate wins. */
Test(controller, len_unmeasured_length_from_the_nearest) {
    static tdm_len_ctrl c;
    tdm_len_init(&c);
    const int B = 4;
    for (int r = 1; r <= 64; r++) tdm_rowcost_observe(&c.cost.target, r, 1e-3 + 1e-5 * r); /* nearly flat: memory-bound */
    tdm_rowcost_observe(&c.cost.draft, B, 0.1e-3);
    tdm_len_observe_step(&c, B, 0, 1.5e-3); /* the step costs 0.5 ms more than its forward */
    tdm_len_seq bs[4];
    seqs_at(bs, B, 0.9, 8);
    tdm_len_choice ch;
    tdm_len_choose(&c, bs, B, 0, 1, 8, &ch);
    const int k = ch.k;
    cr_assert_gt(k, 2, "cheap rows and alpha 0.9: a long chain (got %d)", k);
    cr_assert(ch.trial, "an unmeasured length is a trial");
    const double want_t = 1.5e-3 + k * 0.1e-3 + (1e-3 + 1e-5 * (B + B * k)) - (1e-3 + 1e-5 * B);
    cr_assert_float_eq(ch.rate, B * series(0.9, k) / want_t, 1e-6 * ch.rate, "T = T(0) + the model's difference");
    for (int i = 0; i < 2; i++) {
        tdm_len_choose(&c, bs, B, 0, 1, 8, &ch);
        cr_assert_eq(ch.k, k, "a trial holds 3 steps");
    }
    /* measured much dearer than the model thought: the choice falls back */
    for (int j = 1; j <= 8; j++)
        for (int i = 0; i < 40; i++) tdm_len_observe_step(&c, B, j, 40e-3);
    tdm_len_choose(&c, bs, B, 0, 1, 8, &ch);
    cr_assert_eq(ch.k, 0);
    cr_assert(!ch.trial);
}

/* A lone sequence decides every step (its acceptance swings with its text); a
 * batch's choice holds 8 steps while the batch keeps its size and limit. */
Test(controller, len_lone_decides_every_step_a_batch_holds) {
    static tdm_len_ctrl c;
    tdm_len_init(&c);
    double T[TDM_CTRL_MAX_K + 1];
    for (int k = 0; k <= TDM_CTRL_MAX_K; k++) T[k] = 10e-3 + 1e-3 * k;
    measure_steps(&c, 1, T, TDM_CTRL_MAX_K);
    measure_steps(&c, 4, T, TDM_CTRL_MAX_K);
    tdm_len_seq hi = {0.95, 16}, lo = {0.05, 16};
    tdm_len_choice ch;
    tdm_len_choose(&c, &hi, 1, 0, 1, 16, &ch);
    const int k_hi = ch.k;
    tdm_len_choose(&c, &lo, 1, 0, 1, 16, &ch);
    cr_assert_gt(k_hi, 3);
    cr_assert_lt(ch.k, k_hi, "a lone sequence's next step follows its estimate");
    tdm_len_seq b_hi[4], b_lo[4];
    seqs_at(b_hi, 4, 0.95, 16);
    seqs_at(b_lo, 4, 0.05, 16);
    tdm_len_choose(&c, b_hi, 4, 0, 1, 16, &ch);
    cr_assert_eq(ch.k, k_hi, "(the same costs)");
    for (int s = 0; s < 7; s++) {
        tdm_len_choose(&c, b_lo, 4, 0, 1, 16, &ch);
        cr_assert_eq(ch.k, k_hi, "step %d: the batch's choice holds", s + 1);
    }
    tdm_len_choose(&c, b_lo, 4, 0, 1, 16, &ch);
    cr_assert_lt(ch.k, k_hi, "then it is made again");
}

/* Back-off: a 7B target with a small draft (a plain step 5.1 ms, each drafted
 * token 0.77 ms more).  At acceptance 0 the choice is plain steps, with probes at
 * gaps 8, 16, 32, 64, 64, ...; probes that lift the estimate bring speculation
 * back; where speculation loses for its cost alone (each token as dear as a
 * step) nothing is probed. */
Test(controller, len_backs_off_and_probes) {
    static tdm_len_ctrl c;
    tdm_len_init(&c);
    double T[9];
    for (int k = 0; k <= 8; k++) T[k] = 5.1e-3 + 0.77e-3 * k;
    measure_steps(&c, 1, T, 8);
    tdm_spec_ctrl ctl;
    tdm_ctrl_init(&ctl, 1, 8, 0);
    ctl.alpha = 0.6;
    tdm_len_choice ch;
    tdm_len_seq one = {ctl.alpha, 8};
    tdm_len_choose(&c, &one, 1, 0, 1, 8, &ch);
    cr_assert_gt(ch.k, 1, "alpha 0.6 speculates");
    cr_assert_gt(ch.rate, 1.0 / 5.1e-3);
    /* the draft is never right: alpha falls, then only probes speculate */
    int spec_steps = 0, probes[8], n_probes = 0, last_probe = -1;
    for (int s = 0; s < 400; s++) {
        one.alpha = ctl.alpha;
        tdm_len_choose(&c, &one, 1, 0, 1, 8, &ch);
        cr_assert(ch.k >= 0 && ch.k <= 8);
        if (ch.k == 0) {
            cr_assert_float_eq(ch.rate, 1.0 / 5.1e-3, 1e-6, "a plain step's rate");
            continue;
        }
        spec_steps++;
        if (ch.probe) {
            if (n_probes < 8) probes[n_probes++] = s - last_probe - 1;
            last_probe = s;
        }
        tdm_ctrl_observe(&ctl, ch.k, 0);
    }
    cr_assert_geq(n_probes, 5);
    cr_assert_lt(spec_steps, 40, "%d of 400 steps speculated at acceptance 0", spec_steps);
    const int want[] = {16, 32, 64, 64};
    for (int i = 0; i < 4; i++) cr_assert_eq(probes[i + 1], want[i], "gap %d: %d plain steps", i + 1, probes[i + 1]);
    /* acceptance returns: probes lift the estimate, follow one another sooner, and
     * speculation resumes */
    int resumed = -1;
    for (int s = 0; s < 400 && resumed < 0; s++) {
        one.alpha = ctl.alpha;
        tdm_len_choose(&c, &one, 1, 0, 1, 8, &ch);
        if (ch.k == 0) continue;
        if (!ch.probe) resumed = s;
        tdm_ctrl_observe(&ctl, ch.k, ch.k); /* every token accepted */
    }
    cr_assert_geq(resumed, 0, "speculation never resumed");
    cr_assert_lt(resumed, 64 + 4 * 8 + 8, "speculation resumed only after %d steps", resumed);
    /* cost-bound: every drafted token as dear as a plain step, acceptance 0.9 */
    tdm_len_init(&c);
    for (int k = 0; k <= 8; k++) T[k] = 5.1e-3 * (1 + k);
    measure_steps(&c, 1, T, 8);
    one.alpha = 0.9;
    int spec = 0;
    for (int s = 0; s < 400; s++) {
        tdm_len_choose(&c, &one, 1, 0, 1, 8, &ch);
        spec += ch.k > 0;
    }
    cr_assert_leq(spec, 3, "nothing to probe where speculation loses on cost (%d speculative steps)", spec);
}

/* The lookup length (no draft model): the brute-force best of E / the step's cost. */
Test(controller, lookup_length_matches_brute_force) {
    static tdm_len_ctrl c;
    tdm_len_init(&c);
    for (int i = 0; i < 2; i++) /* (each count sampled twice: measured) */
        for (int r = 1; r <= 40; r++) tdm_rowcost_observe(&c.cost.target, r, 1e-3 + (r > 1 ? 0.3e-3 * (r - 1) : 0));
    tdm_len_observe_step(&c, 1, 0, 1.2e-3); /* (a step's host work is the same for every proposal: left out) */
    for (double a = 0.0; a <= 0.95; a += 0.05)
        for (int cap = 0; cap <= 12; cap += 3) {
            int best = 0;
            double br = -1;
            for (int k = 1; k <= cap; k++) {
                const double r = series(a, k) / (1e-3 + 0.3e-3 * k);
                if (r > br * (1 + 1e-12)) br = r, best = k;
            }
            tdm_spec_ctrl ng;
            tdm_ctrl_init(&ng, 1, 16, 0);
            ng.alpha = a;
            cr_assert_eq(tdm_len_lookup_k(&c, &ng, cap), best, "alpha %.2f cap %d", a, cap);
            tdm_ctrl_init(&ng, 1, 16, 5);
            cr_assert_eq(tdm_len_lookup_k(&c, &ng, cap), cap < 5 ? cap : 5, "a fixed k is the request's");
        }
}

/* Step costs: the lesser of the first two samples (either may hold one-time work
 * such as a graph capture); later, a sample over twice the estimate moves it as one twice as large
 * would, and one under half replaces it. */
Test(controller, step_cost_samples_are_clamped) {
    static tdm_step_costs t;
    tdm_step_costs_init(&t);
    tdm_step_costs_observe(&t, 8, 0, 50e-3);
    cr_assert_float_eq(t.t[8][0], 50e-3, 1e-12, "the first sample is the estimate");
    tdm_step_costs_observe(&t, 8, 0, 10e-3);
    cr_assert_float_eq(t.t[8][0], 10e-3, 1e-12, "the second, cheaper, replaces it");
    tdm_step_costs_observe(&t, 9, 0, 10e-3);
    tdm_step_costs_observe(&t, 9, 0, 50e-3);
    cr_assert_float_eq(t.t[9][0], 10e-3, 1e-12, "a dearer second does not (it was seen stuck there on an H100)");
    tdm_step_costs_observe(&t, 8, 0, 1.0);
    cr_assert_float_eq(t.t[8][0], 12e-3, 1e-12, "a stall counts as twice the estimate");
    tdm_step_costs_observe(&t, 8, 0, 0.0);
    cr_assert_float_eq(t.t[8][0], 12e-3, 1e-12, "a non-positive sample is ignored");
    tdm_step_costs_observe(&t, 8, 0, 7e-3);
    cr_assert_float_eq(t.t[8][0], 12e-3 - 0.2 * 5e-3, 1e-12, "an EMA");
    tdm_step_costs_observe(&t, 8, 0, 1e-3);
    cr_assert_float_eq(t.t[8][0], 1e-3, 1e-12, "a sample under half the estimate replaces it (one-time work)");
    tdm_step_costs_observe(&t, 100000, 0, 5e-3);
    cr_assert_float_eq(t.t[TDM_STEP_COST_B][0], 5e-3, 1e-12, "a batch beyond the table is its last row");
    tdm_step_costs_observe(&t, 8, TDM_CTRL_MAX_K + 1, 5e-3); /* out of range: ignored */
    tdm_step_costs_observe(&t, 8, TDM_CTRL_MAX_K, 5e-3);
    cr_assert_float_eq(t.t[8][TDM_CTRL_MAX_K], 5e-3, 1e-12, "every length up to the longest chain");
}

/* Row costs: the lesser of the first two samples; between measured counts the
 * roofline guess max(t(lo), t(hi) * rows / hi), never above the straight line; the
 * priors of an unmeasured pair. */
Test(controller, rowcost_roofline_between_measurements) {
    tdm_rowcost c;
    tdm_rowcost_init(&c);
    tdm_rowcost_observe(&c, 2, 30e-3); /* (with a graph capture) */
    tdm_rowcost_observe(&c, 2, 0.2e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 2), 0.2e-3, 1e-12);
    tdm_rowcost_observe(&c, 256, 2e-3);
    tdm_rowcost_observe(&c, 256, 2e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 8), 0.2e-3, 1e-12, "flat while the weights dominate");
    cr_assert_float_eq(tdm_rowcost_get(&c, 128), 1e-3, 1e-12, "then proportional to the rows");
    cr_assert_float_eq(tdm_rowcost_get(&c, 1), 0.2e-3, 1e-12, "below every measurement: the next one");
    tdm_rowcost_init(&c);
    tdm_rowcost_observe(&c, 10, 1e-3);
    tdm_rowcost_observe(&c, 20, 10e-3); /* dearer than proportional: the straight line bounds it */
    cr_assert_float_eq(tdm_rowcost_get(&c, 15), 5.5e-3, 1e-12, "min(line 5.5 ms, roof 7.5 ms)");
    /* a count sampled once counts at most at the others' estimate (its sample may
     * hold a graph capture); a sample under half the estimate replaces it */
    tdm_rowcost_init(&c);
    for (int i = 0; i < 2; i++) tdm_rowcost_observe(&c, 2, 1e-3), tdm_rowcost_observe(&c, 8, 1.6e-3);
    tdm_rowcost_observe(&c, 5, 9e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 5), 1.0e-3, 1e-12, "one inflated sample: the others' estimate (roofline 2..8)");
    tdm_rowcost_observe(&c, 5, 1.35e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 5), 1.35e-3, 1e-12, "the second sample, cheaper, replaces it");
    tdm_rowcost_observe(&c, 6, 0.41e-3);
    tdm_rowcost_observe(&c, 6, 1.12e-3); /* (a capture for a new shape after a plain forward) */
    cr_assert_float_eq(tdm_rowcost_get(&c, 6), 0.41e-3, 1e-12, "a dearer second sample does not replace the first");
    tdm_rowcost_observe(&c, 8, 0.5e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 8), 0.5e-3, 1e-12, "under half the estimate: replaces");
    /* a count sampled once (with a graph capture: dear) does not make its neighbours
     * dear: they take the lesser of the estimates with and without it */
    tdm_rowcost_init(&c);
    for (int i = 0; i < 2; i++) tdm_rowcost_observe(&c, 4, 0.24e-3), tdm_rowcost_observe(&c, 5, 0.25e-3);
    tdm_rowcost_observe(&c, 13, 0.95e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 9), 0.29e-3, 1e-12, "the twice-sampled slope, not the line to 0.95 ms");
    cr_assert_float_eq(tdm_rowcost_get(&c, 13), 0.33e-3, 1e-12, "one dear sample: at most the others' estimate");
    /* above every measurement: the slope of the two highest, at most proportional
     * to the highest; a sample over twice the estimate counts as twice */
    tdm_rowcost_init(&c);
    for (int i = 0; i < 2; i++) tdm_rowcost_observe(&c, 4, 1e-3), tdm_rowcost_observe(&c, 5, 1.5e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 10), 3e-3, 1e-12, "slope 0.5 ms a row, capped at 1.5 * 10 / 5 ms");
    tdm_rowcost_init(&c);
    for (int i = 0; i < 2; i++) tdm_rowcost_observe(&c, 4, 1e-3), tdm_rowcost_observe(&c, 5, 1.1e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 10), 1.6e-3, 1e-12, "the line below the roof");
    tdm_rowcost_observe(&c, 5, 50e-3);
    cr_assert_float_eq(tdm_rowcost_get(&c, 5), 1.1e-3 + 0.2 * 1.1e-3, 1e-12, "an outlier moves it as twice the estimate");
    static tdm_pair_costs pc;
    tdm_pair_costs_init(&pc);
    cr_assert_float_eq(tdm_cost_target(&pc, 7), 1.0, 1e-12, "the prior: 1");
    cr_assert_float_eq(tdm_cost_draft(&pc, 3), 0.25, 1e-12, "a draft round a quarter of it");
}

/* A lone sequence's choice (the batch of one) at budgets up to max_budget; the
 * decision counter is the caller's. */
static int32_t choose1(const tdm_tree_ctrl *c, double alpha, const tdm_tree_cost *tc, const tdm_pair_costs *cost,
                       double chain, int32_t max_budget, uint32_t *n_dec) {
    return tdm_tree_choose(&c, &alpha, 1, tc, cost, chain, 0, max_budget, 1 << 20, n_dec);
}

/* Chain or tree (tdm_tree_choose): a tree's verification is weighed at its own
 * measured cost, not at a chain's of the same row count; a sequence that has not
 * measured a budget takes the engine's tokens for it; an unmeasured budget is tried. */
Test(controller, tree_choice_weighs_the_trees_own_costs) {
    uint32_t n_c = 0, n_fresh = 0, n_cs = 0;
    static tdm_len_ctrl lc;
    tdm_len_init(&lc);
    tdm_pair_costs *cost = &lc.cost;
    tdm_rowcost_observe(&cost->draft, 1, 100e-6);
    for (int n = 1; n <= 65; n++) tdm_rowcost_observe(&cost->target, n, 1e-3 + n * 5e-6);
    const double alpha = 0.7;
    const int32_t k = 4;
    const double chain = tdm_len_rate(&lc, 1, series(alpha, k), 1 + k, k);
    tdm_tree_cost tc;
    memset(&tc, 0, sizeof tc);
    tdm_tree_ctrl c;
    tdm_tree_ctrl_init(&c);
    /* nothing measured: the hopeful estimate picks some tree, to try it */
    cr_assert_gt(choose1(&c, alpha, &tc, cost, chain, 8, &n_c), 0);
    /* budgets 4 and 8 measured: 5 tokens each, drafted in 0.3 ms, but verified in
     * 2.5 ms (masked rows): slower than the chain, which is chosen (the choice
     * every 8th step is the runner-up, so compare 7 in 8) */
    for (int i = 0; i < 8; i++) {
        tdm_tree_cost_observe(&tc, 4, 300e-6, 2.5e-3, 5);
        tdm_tree_cost_observe(&tc, 8, 300e-6, 2.5e-3, 5);
        tdm_tree_ctrl_observe(&c, 4, 5);
        tdm_tree_ctrl_observe(&c, 8, 5);
    }
    cr_assert_lt(5.0 / (300e-6 + 2.5e-3), chain, "(the case: the tree is slower)");
    cr_assert_gt(5.0 / (300e-6 + tdm_cost_target(cost, 9)), chain, "(at a chain's verification it would win)");
    int chains = 0;
    for (int i = 0; i < 8; i++) chains += choose1(&c, alpha, &tc, cost, chain, 8, &n_c) == 0;
    cr_assert_eq(chains, 7, "the chain in 7 of 8 steps, got %d", chains);
    /* a new sequence: no tokens of its own, the engine's make the trees lose too */
    tdm_tree_ctrl fresh;
    tdm_tree_ctrl_init(&fresh);
    chains = 0;
    for (int i = 0; i < 8; i++) chains += choose1(&fresh, alpha, &tc, cost, chain, 8, &n_fresh) == 0;
    cr_assert_eq(chains, 7, "a new sequence: the chain in 7 of 8 steps, got %d", chains);
    /* a tree far slower than the chain (verified in 6 ms): its re-check is rarer,
     * every 64th step */
    tdm_tree_cost slow = tc;
    tdm_tree_ctrl cs;
    tdm_tree_ctrl_init(&cs);
    for (int i = 0; i < 60; i++) tdm_tree_cost_observe(&slow, 4, 300e-6, 6e-3, 5), tdm_tree_cost_observe(&slow, 8, 300e-6, 6e-3, 5);
    chains = 0;
    for (int i = 0; i < 64; i++) chains += choose1(&cs, alpha, &slow, cost, chain, 8, &n_cs) == 0;
    cr_assert_eq(chains, 63, "far slower trees: the chain in 63 of 64 steps, got %d", chains);
    /* a tree verified fast wins */
    for (int i = 0; i < 60; i++) tdm_tree_cost_observe(&tc, 8, 300e-6, 1.0e-3, 5);
    for (int i = 0; i < 60; i++) tdm_tree_ctrl_observe(&c, 8, 5);
    tdm_tree_ctrl_init(&fresh);
    n_fresh = 0;
    cr_assert_eq(choose1(&fresh, alpha, &tc, cost, chain, 8, &n_fresh), 8);
    /* times that are not positive are not recorded */
    const double before = tc.t_verify[1];
    tdm_tree_cost_observe(&tc, 8, 0, -1, 0);
    cr_assert_float_eq(tc.t_verify[1], before, 0);
}

Test(payoff, rates_need_min_steps_and_follow_the_ema) {
    tdm_payoff p = {0};
    for (int i = 0; i < TDM_PAYOFF_MIN - 1; i++) tdm_payoff_observe(&p, TDM_PAY_MODEL, 4, 0.1);
    cr_assert_eq(tdm_payoff_rate(&p, TDM_PAY_MODEL), 0.0, "unmeasured before TDM_PAYOFF_MIN steps");
    tdm_payoff_observe(&p, TDM_PAY_MODEL, 4, 0.1);
    cr_assert_float_eq(tdm_payoff_rate(&p, TDM_PAY_MODEL), 40.0, 1e-9);
    tdm_payoff_observe(&p, TDM_PAY_MODEL, 9, 0.1); /* tok EMA 4 + 0.2 * 5 = 5 */
    cr_assert_float_eq(tdm_payoff_rate(&p, TDM_PAY_MODEL), 50.0, 1e-9);
    tdm_payoff_observe(&p, TDM_PAY_MODEL, 3, -1.0); /* (no time: ignored) */
    cr_assert_float_eq(tdm_payoff_rate(&p, TDM_PAY_MODEL), 50.0, 1e-9);
    cr_assert_eq(tdm_payoff_rate(&p, TDM_PAY_LOOKUP), 0.0);
}

Test(payoff, lookups_that_do_not_pay_stop_and_are_probed) {
    tdm_payoff p = {0};
    cr_assert(tdm_payoff_lookups(&p), "on until measured");
    for (int i = 0; i < TDM_PAYOFF_MIN; i++) {
        tdm_payoff_observe(&p, TDM_PAY_MODEL, 4, 0.1);  /* 40 tok/s */
        tdm_payoff_observe(&p, TDM_PAY_LOOKUP, 1, 0.05); /* 20 tok/s */
    }
    int on = 0;
    for (int i = 0; i < 4 * TDM_PAYOFF_PROBE; i++) on += tdm_payoff_lookups(&p);
    cr_assert_eq(on, 4, "off, probed once in %d steps: %d of %d on", TDM_PAYOFF_PROBE, on, 4 * TDM_PAYOFF_PROBE);
    /* within the margin: on */
    for (int i = 0; i < 40; i++) tdm_payoff_observe(&p, TDM_PAY_LOOKUP, 2, 0.0505); /* 39.6 tok/s */
    for (int i = 0; i < 8; i++) cr_assert(tdm_payoff_lookups(&p), "a rate within %.0f %% of the model's pays",
                                          100 * TDM_PAYOFF_MARGIN);
}

Test(payoff, a_request_starts_from_the_pairs_figures) {
    tdm_payoff pair = {0}, r;
    for (int i = 0; i < 50; i++) {
        tdm_payoff_observe(&pair, TDM_PAY_MODEL, 4, 0.1);
        tdm_payoff_observe(&pair, TDM_PAY_LOOKUP, 1, 0.1);
    }
    pair.n_off = 7;
    tdm_payoff_carry(&r, &pair);
    cr_assert_eq(r.n[TDM_PAY_MODEL], TDM_PAYOFF_MIN);
    cr_assert_eq(r.n[TDM_PAY_LOOKUP], TDM_PAYOFF_MIN);
    cr_assert_eq(r.n_off, 0);
    cr_assert_float_eq(tdm_payoff_rate(&r, TDM_PAY_LOOKUP), 10.0, 1e-9);
    cr_assert_not(tdm_payoff_lookups(&r), "the pair's lookups did not pay: off from the first step");
}
