/* test_accept.c - acceptance rules: exactness computed exactly (no sampling),
 * Monte-Carlo checks of tdm_accept_sample (chi-square), greedy rules, rng use. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "accept.h"
#include "tree_accept.h"
#include "stats.h"

#define NMAX 8

/* P(first emitted token = y) for one drafted token x ~ q verified against p:
 *   sum_x q(x) * [a(x) * [x == y] + (1 - a(x)) * residual(y)]
 * computed with the library's own tdm_accept_prob and tdm_residual_dist. */
static void first_token_dist(const float *p, const float *q, int n, double *out) {
    float r[NMAX];
    tdm_residual_dist(p, q, n, r);
    for (int y = 0; y < n; y++) out[y] = 0;
    for (int x = 0; x < n; x++) {
        if (q[x] == 0) continue;
        double a = tdm_accept_prob(p[x], q[x]);
        cr_assert(a >= 0 && a <= 1, "accept prob %g out of [0,1]", a);
        out[x] += q[x] * a;
        for (int y = 0; y < n; y++) out[y] += q[x] * (1 - a) * r[y];
    }
}

static void check_exact(const float *p, const float *q, int n, const char *what) {
    double d[NMAX];
    first_token_dist(p, q, n, d);
    for (int y = 0; y < n; y++)
        cr_assert_lt(fabs(d[y] - p[y]), 1e-6, "%s: P(first = %d) = %.9f, p = %.9f", what, y, d[y], p[y]);
}

static uint64_t rnd(uint64_t *st) {
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A random distribution over n tokens; each token is zeroed with probability zero_frac. */
static void random_dist(uint64_t *st, float *d, int n, double zero_frac) {
    double s = 0;
    for (int i = 0; i < n; i++) {
        double u = (double)(rnd(st) >> 11) * 0x1.0p-53;
        double z = (double)(rnd(st) >> 11) * 0x1.0p-53;
        d[i] = z < zero_frac ? 0.0f : (float)(0.05 + u);
        s += d[i];
    }
    if (s == 0) {
        d[rnd(st) % (uint64_t)n] = 1.0f;
        return;
    }
    for (int i = 0; i < n; i++) d[i] = (float)(d[i] / s);
}

Test(accept, accept_prob_rules) {
    cr_assert_eq(tdm_accept_prob(0.5f, 0.25f), 1.0);
    cr_assert_float_eq(tdm_accept_prob(0.25f, 0.5f), 0.5, 1e-12);
    cr_assert_eq(tdm_accept_prob(0.0f, 0.5f), 0.0, "p(x) = 0: always reject");
    cr_assert_eq(tdm_accept_prob(0.0f, 0.0f), 0.0);
    cr_assert_eq(tdm_accept_prob(0.3f, 0.0f), 1.0, "q(x) = 0 < p(x): accept (documented)");
    cr_assert_eq(tdm_accept_prob(NAN, 0.5f), 0.0);
}

Test(accept, residual_dist_rules) {
    float p[4] = {0.5f, 0.2f, 0.3f, 0.0f}, q[4] = {0.2f, 0.4f, 0.3f, 0.1f}, r[4];
    double mass = tdm_residual_dist(p, q, 4, r);
    cr_assert_float_eq(mass, 0.3, 1e-7);
    cr_assert_float_eq(r[0], 1.0f, 1e-6);
    cr_assert(r[1] == 0 && r[2] == 0 && r[3] == 0);
    /* p == q: no positive mass, residual = p */
    mass = tdm_residual_dist(p, p, 4, r);
    cr_assert_eq(mass, 0.0);
    for (int i = 0; i < 4; i++) cr_assert_float_eq(r[i], p[i], 1e-7);
}

Test(accept, exactness_hand_made) {
    /* n = 2 .. 6, edge cases: q(x) = 0, p(x) = 0, p = q, one-hot p, one-hot q, disjoint. */
    const float p2[2] = {0.7f, 0.3f}, q2[2] = {0.4f, 0.6f};
    check_exact(p2, q2, 2, "n2");
    const float p3[3] = {0.2f, 0.5f, 0.3f}, q3[3] = {0.6f, 0.0f, 0.4f}; /* q(1) = 0 */
    check_exact(p3, q3, 3, "q zero");
    const float p4[4] = {0.0f, 0.5f, 0.5f, 0.0f}, q4[4] = {0.25f, 0.25f, 0.25f, 0.25f}; /* p zeros */
    check_exact(p4, q4, 4, "p zero");
    const float p5[5] = {0.1f, 0.2f, 0.3f, 0.25f, 0.15f};
    check_exact(p5, p5, 5, "p == q");
    const float oh[5] = {0, 0, 1, 0, 0};
    check_exact(oh, p5, 5, "one-hot p");
    check_exact(p5, oh, 5, "one-hot q");
    check_exact(oh, oh, 5, "one-hot both");
    const float p6[6] = {0.5f, 0.5f, 0, 0, 0, 0}, q6[6] = {0, 0, 0.1f, 0.2f, 0.3f, 0.4f};
    check_exact(p6, q6, 6, "disjoint");
    check_exact(q6, p6, 6, "disjoint reversed");
    const float p6b[6] = {0.3f, 0.0f, 0.2f, 0.0f, 0.5f, 0.0f}, q6b[6] = {0.0f, 0.3f, 0.2f, 0.1f, 0.0f, 0.4f};
    check_exact(p6b, q6b, 6, "mixed zeros");
}

Test(accept, exactness_random) {
    uint64_t st = 17;
    for (int trial = 0; trial < 3000; trial++) {
        int n = 2 + (int)(rnd(&st) % 5);
        float p[NMAX], q[NMAX];
        random_dist(&st, p, n, trial % 3 == 0 ? 0.0 : 0.3);
        random_dist(&st, q, n, trial % 3 == 1 ? 0.0 : 0.3);
        check_exact(p, q, n, "random");
    }
}

/* Draws one token from q with the rng, as a draft model would. */
static int32_t draw(const float *d, int n, tdm_rng *r) { return tdm_sample_probs(d, n, r); }

static void mc_first_token(const float *p, const float *q, int n, bool with_scratch, uint64_t seed) {
    enum { RUNS = 200000 };
    float pq[2][NMAX]; /* p: [k + 1][n] with k = 1: p0 and a bonus row */
    memcpy(pq[0], p, (size_t)n * sizeof(float));
    for (int i = 0; i < n; i++) pq[1][i] = 1.0f / (float)n;
    float scratch[NMAX];
    uint64_t counts[NMAX] = {0};
    double pd[NMAX];
    for (int i = 0; i < n; i++) pd[i] = p[i];
    tdm_rng r;
    tdm_rng_seed(&r, seed);
    int n_acc = 0;
    for (int it = 0; it < RUNS; it++) {
        int32_t x = draw(q, n, &r), next = -1;
        int32_t a = tdm_accept_sample(&x, 1, &pq[0][0], q, n, &r, with_scratch ? scratch : NULL, &next);
        cr_assert(a == 0 || a == 1);
        cr_assert(next >= 0 && next < n);
        int32_t first = a == 1 ? x : next;
        counts[first]++;
        n_acc += a;
    }
    int df;
    double pv = tdm_stat_chi2_gof(counts, pd, n, &df);
    cr_assert_gt(pv, 1e-3, "first token not distributed as p: p-value %g (df %d)", pv, df);
    /* The acceptance rate is sum_x min(p(x), q(x)). */
    double want = 0;
    for (int i = 0; i < n; i++) want += fmin(p[i], q[i]);
    double got = (double)n_acc / RUNS, sd = sqrt(want * (1 - want) / RUNS) + 1e-9;
    cr_assert_lt(fabs(got - want), 5 * sd + 1e-12, "acceptance rate %g, expected %g", got, want);
}

Test(accept, monte_carlo_k1) {
    const float p[5] = {0.1f, 0.35f, 0.05f, 0.3f, 0.2f}, q[5] = {0.3f, 0.1f, 0.3f, 0.0f, 0.3f};
    mc_first_token(p, q, 5, true, 1);
    mc_first_token(p, q, 5, false, 2);
    const float p2[4] = {0.0f, 0.6f, 0.4f, 0.0f}, q2[4] = {0.25f, 0.25f, 0.25f, 0.25f};
    mc_first_token(p2, q2, 4, true, 3);
    const float d1[3] = {1, 0, 0}, d2[3] = {0, 0.5f, 0.5f};
    mc_first_token(d1, d2, 3, true, 4); /* disjoint: always reject */
    mc_first_token(d2, d1, 3, false, 5);
}

Test(accept, monte_carlo_detects_wrong_rule) {
    /* Power check: accepting every drafted token gives q, which the test must reject. */
    enum { RUNS = 100000 };
    const float q[3] = {0.3f, 0.3f, 0.4f}; /* drawn from q, tested against p */
    double pd[3] = {0.5, 0.3, 0.2};
    uint64_t counts[3] = {0};
    tdm_rng r;
    tdm_rng_seed(&r, 8);
    for (int it = 0; it < RUNS; it++) counts[draw(q, 3, &r)]++;
    cr_assert_lt(tdm_stat_chi2_gof(counts, pd, 3, NULL), 1e-3);
}

/* Two-token process with context dependence: p1 and q1 depend on the first token.
 * A step drafts k = 2 (x1 ~ q0, x2 ~ Q1[x1]) and emits n_accepted + 1 tokens; when it
 * emits only one token, a second step (k = 1, from the new context) supplies the second.
 * The joint (t1, t2) must be p0(t1) * P1[t1](t2). */
Test(accept, monte_carlo_k2_joint) {
    enum { N = 4, RUNS = 300000 };
    uint64_t st = 23;
    float p0[N], q0[N], P1[N][N], Q1[N][N], bonus[N];
    random_dist(&st, p0, N, 0.0);
    random_dist(&st, q0, N, 0.25);
    for (int a = 0; a < N; a++) {
        random_dist(&st, P1[a], N, 0.2);
        random_dist(&st, Q1[a], N, 0.2);
    }
    for (int i = 0; i < N; i++) bonus[i] = 1.0f / N;
    uint64_t joint[N * N] = {0}, first[N] = {0};
    double pj[N * N], pf[N];
    for (int a = 0; a < N; a++) {
        pf[a] = p0[a];
        for (int b = 0; b < N; b++) pj[a * N + b] = (double)p0[a] * P1[a][b];
    }
    float scratch[N];
    tdm_rng r;
    tdm_rng_seed(&r, 99);
    for (int it = 0; it < RUNS; it++) {
        int32_t d[2], next;
        d[0] = draw(q0, N, &r);
        d[1] = draw(Q1[d[0]], N, &r);
        float P[3][N], Q[2][N];
        memcpy(P[0], p0, sizeof p0);
        memcpy(P[1], P1[d[0]], sizeof P[1]);
        memcpy(P[2], bonus, sizeof bonus);
        memcpy(Q[0], q0, sizeof q0);
        memcpy(Q[1], Q1[d[0]], sizeof Q[1]);
        int32_t n = tdm_accept_sample(d, 2, &P[0][0], &Q[0][0], N, &r, scratch, &next);
        int32_t t1, t2;
        if (n >= 1) {
            t1 = d[0];
            t2 = n == 2 ? d[1] : next;
        } else {
            t1 = next;
            int32_t x = draw(Q1[t1], N, &r), nx;
            float Pb[2][N];
            memcpy(Pb[0], P1[t1], sizeof Pb[0]);
            memcpy(Pb[1], bonus, sizeof bonus);
            int32_t n2 = tdm_accept_sample(&x, 1, &Pb[0][0], Q1[t1], N, &r, scratch, &nx);
            t2 = n2 == 1 ? x : nx;
        }
        cr_assert(t1 >= 0 && t1 < N && t2 >= 0 && t2 < N);
        first[t1]++;
        joint[t1 * N + t2]++;
    }
    double pv1 = tdm_stat_chi2_gof(first, pf, N, NULL);
    cr_assert_gt(pv1, 1e-3, "first token not p0: p-value %g", pv1);
    double pv2 = tdm_stat_chi2_gof(joint, pj, N * N, NULL);
    cr_assert_gt(pv2, 1e-3, "joint of two tokens wrong: p-value %g", pv2);
}

Test(accept, bonus_from_last_row) {
    /* p = q one-hot on the drafted tokens: everything accepted; bonus drawn from p[k]. */
    enum { N = 3, K = 2 };
    float p[K + 1][N] = {{0, 1, 0}, {1, 0, 0}, {0, 0, 1}}, q[K][N] = {{0, 1, 0}, {1, 0, 0}};
    int32_t d[K] = {1, 0}, next;
    tdm_rng r, ref;
    tdm_rng_seed(&r, 4);
    tdm_rng_seed(&ref, 4);
    cr_assert_eq(tdm_accept_sample(d, K, &p[0][0], &q[0][0], N, &r, NULL, &next), K);
    cr_assert_eq(next, 2);
    for (int i = 0; i < K + 1; i++) tdm_rng_next(&ref);
    cr_assert(!memcmp(&r, &ref, sizeof r), "all accepted: k decisions + 1 bonus draw");
    /* Reject at position 1 (p(x) = 0): 2 decisions + 1 correction draw. */
    d[1] = 2;
    q[1][0] = 0;
    q[1][2] = 1;
    tdm_rng_seed(&r, 4);
    tdm_rng_seed(&ref, 4);
    cr_assert_eq(tdm_accept_sample(d, K, &p[0][0], &q[0][0], N, &r, NULL, &next), 1);
    cr_assert_eq(next, 0, "correction from normalize(max(0, p1 - q1)) = token 0");
    for (int i = 0; i < 3; i++) tdm_rng_next(&ref);
    cr_assert(!memcmp(&r, &ref, sizeof r), "reject at 1: 2 decisions + 1 sample");
    /* k = 0: the token is drawn from p[0] with one draw. */
    cr_assert_eq(tdm_accept_sample(NULL, 0, &p[0][0], NULL, N, &r, NULL, &next), 0);
    cr_assert_eq(next, 1);
    /* Reproducible: same seed, same result. */
    const float pp[2][4] = {{0.25f, 0.25f, 0.25f, 0.25f}, {0.1f, 0.2f, 0.3f, 0.4f}};
    const float qq[1][4] = {{0.7f, 0.1f, 0.1f, 0.1f}};
    for (int s = 0; s < 50; s++) {
        tdm_rng a, b;
        tdm_rng_seed(&a, (uint64_t)s);
        tdm_rng_seed(&b, (uint64_t)s);
        int32_t x = 0, na, nb;
        int32_t ra = tdm_accept_sample(&x, 1, &pp[0][0], &qq[0][0], 4, &a, NULL, &na);
        int32_t rb = tdm_accept_sample(&x, 1, &pp[0][0], &qq[0][0], 4, &b, NULL, &nb);
        cr_assert(ra == rb && na == nb);
    }
}

Test(accept, greedy_rules) {
    int32_t next = -7;
    const int32_t d[4] = {5, 9, 2, 7};
    const int32_t all[5] = {5, 9, 2, 7, 11};
    cr_assert_eq(tdm_accept_greedy(d, 4, all, &next), 4);
    cr_assert_eq(next, 11, "all accepted: bonus = argmax[k]");
    const int32_t mis[5] = {5, 9, 3, 7, 11};
    cr_assert_eq(tdm_accept_greedy(d, 4, mis, &next), 2);
    cr_assert_eq(next, 3, "first mismatch at i: next = argmax[i]");
    const int32_t first[5] = {4, 9, 2, 7, 11};
    cr_assert_eq(tdm_accept_greedy(d, 4, first, &next), 0);
    cr_assert_eq(next, 4);
    cr_assert_eq(tdm_accept_greedy(d, 0, all, &next), 0);
    cr_assert_eq(next, 5, "k = 0: next = argmax[0]");
    cr_assert_eq(tdm_accept_greedy(NULL, 0, all, &next), 0);
    cr_assert_eq(next, 5);
    /* A later match after a mismatch does not count. */
    const int32_t later[5] = {5, 1, 2, 7, 11};
    cr_assert_eq(tdm_accept_greedy(d, 4, later, NULL), 1);
}

Test(accept, sample_greedy_distributions_equal_greedy_rule) {
    /* One-hot p and q (temperature 0) make sampling acceptance the greedy rule. */
    enum { N = 5, K = 3 };
    const int32_t tgt[K + 1] = {3, 1, 4, 0};
    const int32_t d[K] = {3, 1, 2};
    float p[K + 1][N] = {{0}}, q[K][N] = {{0}};
    for (int i = 0; i <= K; i++) p[i][tgt[i]] = 1;
    for (int i = 0; i < K; i++) q[i][d[i]] = 1;
    tdm_rng r;
    tdm_rng_seed(&r, 1);
    for (int it = 0; it < 100; it++) {
        int32_t ns, ng;
        float scratch[N];
        cr_assert_eq(tdm_accept_sample(d, K, &p[0][0], &q[0][0], N, &r, scratch, &ns),
                     tdm_accept_greedy(d, K, tgt, &ng));
        cr_assert_eq(ns, ng);
    }
}

/* ---- token trees: multi-candidate acceptance (verify/tree_accept.h) ---- */

/* P(emitted = y) at one node of target distribution p whose k children are drawn
 * from q (with or without replacement), computed exactly: every ordered draw of
 * the children weighted by its probability under the sampling scheme itself
 * (qo: the original q; drawn: the tokens drawn so far), every accept / reject
 * outcome by the rule's min(1, r(x) / q(x)) on the library's current r and q
 * (tdm_sibling_reject's updates after each rejection). */
static void siblings_dist(const double *r0, const double *q0, const double *qo, const bool *drawn0, int n, int k,
                          bool repl, double weight, double *out) {
    double left = 1;
    for (int i = 0; i < n; i++) left -= !repl && drawn0[i] ? qo[i] : 0;
    if (k == 0 || !(left > 1e-12)) {
        for (int y = 0; y < n; y++) out[y] += weight * r0[y];
        return;
    }
    for (int x = 0; x < n; x++) {
        if (!(qo[x] > 0) || (!repl && drawn0[x])) continue;
        const double px = qo[x] / left; /* the draw's probability */
        const double a = !(r0[x] > 0) ? 0 : !(q0[x] > 0) ? 1 : fmin(1.0, r0[x] / q0[x]);
        out[x] += weight * px * a;
        double r[NMAX], q[NMAX];
        bool drawn[NMAX];
        memcpy(r, r0, sizeof r), memcpy(q, q0, sizeof q), memcpy(drawn, drawn0, sizeof drawn);
        drawn[x] = true;
        tdm_sibling_reject(r, q, x, n, repl);
        siblings_dist(r, q, qo, drawn, n, k - 1, repl, weight * px * (1 - a), out);
    }
}

static void check_siblings(const float *p, const float *q, int n, int k, bool repl, const char *what) {
    double r[NMAX] = {0}, qd[NMAX] = {0}, d[NMAX] = {0};
    bool drawn[NMAX] = {false};
    for (int i = 0; i < n; i++) r[i] = p[i], qd[i] = q[i];
    siblings_dist(r, qd, qd, drawn, n, k, repl, 1.0, d);
    for (int y = 0; y < n; y++)
        cr_assert_lt(fabs(d[y] - p[y]), 1e-6, "%s, k %d, %s replacement: P(emitted = %d) = %.9f, p = %.9f", what, k,
                     repl ? "with" : "without", y, d[y], p[y]);
}

Test(accept, tree_siblings_exact_hand_made) {
    /* q close to p, q far from p, q missing p's support, p missing q's, one-hot q */
    static const float cases[][2][5] = {
        {{0.4f, 0.3f, 0.2f, 0.1f, 0.0f}, {0.35f, 0.35f, 0.2f, 0.1f, 0.0f}},
        {{0.7f, 0.1f, 0.1f, 0.05f, 0.05f}, {0.05f, 0.05f, 0.1f, 0.1f, 0.7f}},
        {{0.2f, 0.2f, 0.2f, 0.2f, 0.2f}, {0.5f, 0.5f, 0.0f, 0.0f, 0.0f}},
        {{0.0f, 0.0f, 0.5f, 0.5f, 0.0f}, {0.25f, 0.25f, 0.25f, 0.25f, 0.0f}},
        {{0.1f, 0.6f, 0.1f, 0.1f, 0.1f}, {0.0f, 0.0f, 1.0f, 0.0f, 0.0f}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int k = 1; k <= 4; k++)
            for (int repl = 0; repl < 2; repl++) check_siblings(cases[c][0], cases[c][1], 5, k, repl, "hand-made");
}

Test(accept, tree_siblings_exact_random) {
    uint64_t st = 99;
    for (int it = 0; it < 60; it++) {
        float p[6], q[6];
        random_dist(&st, p, 6, 0.2);
        random_dist(&st, q, 6, 0.3);
        check_siblings(p, q, 6, 1 + it % 4, it % 2, "random");
    }
}

/* tdm_tree_accept_sample itself, Monte Carlo on a tree of two levels: root
 * children {x0, x1, x2} drawn without replacement from q_root, x0 with children
 * {y0, y1} drawn from q_x0.  The first emitted token is distributed as p_root and,
 * after x0 was accepted, the next as p_x0 (chi-square goodness of fit). */
Test(accept, tree_sample_monte_carlo) {
    enum { V = 5, RUNS = 60000 };
    const float p_root[V] = {0.3f, 0.25f, 0.2f, 0.15f, 0.1f}, q_root[V] = {0.1f, 0.2f, 0.4f, 0.1f, 0.2f};
    const float p_x0[V] = {0.05f, 0.05f, 0.4f, 0.3f, 0.2f}, q_x0[V] = {0.3f, 0.3f, 0.2f, 0.1f, 0.1f};
    float p[5][V] = {{0}}, q[2][V];
    memcpy(q[0], q_root, sizeof q_root), memcpy(q[1], q_x0, sizeof q_x0);
    double scratch[2 * V];
    uint64_t first[V] = {0}, second[V] = {0};
    tdm_rng r;
    tdm_rng_seed(&r, 5);
    for (int it = 0; it < RUNS; it++) {
        tdm_tree t;
        tdm_tree_reset(&t);
        int32_t ids[3];
        const int32_t nr = tdm_draw_distinct(q_root, V, 3, &r, ids);
        cr_assert_eq(nr, 3);
        for (int i = 0; i < 3; i++) tdm_tree_add(&t, -1, ids[i], 1);
        const int32_t nx = tdm_draw_distinct(q_x0, V, 2, &r, ids);
        cr_assert_eq(nx, 2);
        for (int i = 0; i < 2; i++) tdm_tree_add(&t, 0, ids[i], 1);
        tdm_tree_masks(&t);
        t.qrow_root = 0, t.qrow[0] = 1;
        /* p rows: root, x0, x1, x2 (uniform: never reached as a parent here but by
         * a bonus draw), y0, y1 */
        memcpy(p[0], p_root, sizeof p_root), memcpy(p[1], p_x0, sizeof p_x0);
        for (int i = 2; i < 5; i++)
            for (int y = 0; y < V; y++) p[i][y] = 1.0f / V;
        float pall[6][V];
        memcpy(pall, p, sizeof p);
        for (int y = 0; y < V; y++) pall[5][y] = 1.0f / V;
        int32_t path[8], next;
        const int32_t m = tdm_tree_accept_sample(&t, &pall[0][0], &q[0][0], V, false, &r, scratch, path, &next);
        cr_assert(m >= 0 && m <= 2 && next >= 0 && next < V);
        first[m ? t.token[path[0]] : next]++;
        if (m >= 1 && path[0] == 0) second[m == 2 ? t.token[path[1]] : next]++;
    }
    double pr[V], px[V];
    for (int i = 0; i < V; i++) pr[i] = p_root[i], px[i] = p_x0[i];
    int df;
    const double pv1 = tdm_stat_chi2_gof(first, pr, V, &df), pv2 = tdm_stat_chi2_gof(second, px, V, &df);
    cr_assert_gt(pv1, 1e-3, "first token not distributed as p_root: p-value %g", pv1);
    cr_assert_gt(pv2, 1e-3, "token after x0 not distributed as p_x0: p-value %g", pv2);
}

/* Matching: the longest path whose every token is the target's at its parent. */
Test(accept, tree_match_rules) {
    tdm_tree t;
    tdm_tree_reset(&t);
    tdm_tree_add(&t, -1, 5, 1); /* 0 */
    tdm_tree_add(&t, -1, 6, 1); /* 1 */
    tdm_tree_add(&t, 1, 7, 1);  /* 2 */
    tdm_tree_add(&t, 1, 8, 1);  /* 3 */
    tdm_tree_add(&t, 3, 9, 1);  /* 4 */
    tdm_tree_masks(&t);
    int32_t path[8], next;
    /* target tokens at root, 0..4 */
    const int32_t t1[] = {6, 0, 8, 0, 9, 4};
    cr_assert_eq(tdm_tree_accept_match(&t, t1, path, &next), 3);
    cr_assert(path[0] == 1 && path[1] == 3 && path[2] == 4 && next == 4);
    const int32_t t2[] = {6, 0, 1, 2, 3, 4};
    cr_assert_eq(tdm_tree_accept_match(&t, t2, path, &next), 1);
    cr_assert(path[0] == 1 && next == 1);
    const int32_t t3[] = {3, 0, 0, 0, 0, 0};
    cr_assert_eq(tdm_tree_accept_match(&t, t3, path, &next), 0);
    cr_assert_eq(next, 3);
}
