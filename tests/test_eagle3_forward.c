/* test_eagle3_forward.c - an EAGLE-3 head's forward (src/model/eagle3_forward.c:
 * encoder and decoder, its KV over several forwards, the d2t map, a deeper level fed
 * its own pre-norm output) against a naive double-precision reference of the same
 * math, for tandem synth's eagle3-pycode head (the target's embedding; f16 and q8_0)
 * and an in-memory one with every option (its own embedding and head, a width unlike
 * the target's, norm_before_fc, norm_before_residual, d2t not ascending, q / k / v of
 * two types), and a token tree's rows (a tree draft level: the attention's ancestor
 * masks). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "eagle3_testutil.h"
#include "testutil.h"

/* ---- the head's forward against a double-precision reference ------------------ */

/* The head's math in double, weights read from its file (and the target's embedding
 * from the target's file when the head has none). */
typedef struct rhead {
    int E, H, KV, hd, F, V, Vd, T;
    double eps, base;
    bool nbf, nbr;
    double *fc, *enc, *embd, *an, *hn, *wq, *wk, *wv, *wo, *fn, *wg, *wu, *wd, *on, *out;
    int64_t *d2t;   /* [Vd] as the file has it (NULL: the identity) */
    double *K, *Vc; /* [64][kvd] the reference's cache */
} rhead;

static double *read_mat(const tdm_gguf *g, const char *name, int64_t rows, int64_t cols) {
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, name);
    cr_assert_not_null(t, "%s", name);
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(t->type, (uint64_t)cols, &rb));
    double *d = malloc((size_t)(rows * cols) * sizeof *d);
    float *f = malloc((size_t)cols * sizeof *f);
    for (int64_t r = 0; r < rows; r++) {
        tdm_row_to_f32(t->type, (const uint8_t *)t->data + (size_t)r * rb, f, cols);
        for (int64_t c = 0; c < cols; c++) d[r * cols + c] = f[c];
    }
    free(f);
    return d;
}

static void rhead_open(rhead *r, const tdm_gguf *g, const tdm_gguf *target, const tdm_eagle3 *h) {
    const tdm_eagle3_hparams *ep = &h->ep;
    *r = (rhead){.E = ep->n_embd, .H = ep->n_head, .KV = ep->n_head_kv, .hd = ep->head_dim, .F = ep->n_ff,
                 .V = ep->n_vocab, .Vd = ep->n_draft_vocab, .T = ep->target_hidden, .eps = h->m->hp.norm_eps,
                 .base = h->m->hp.rope.freq_base, .nbf = ep->norm_before_fc, .nbr = ep->norm_before_residual};
    const int E = r->E, qd = r->H * r->hd, kvd = r->KV * r->hd;
    r->fc = read_mat(g, "fc.weight", E, 3 * r->T);
    if (r->nbf) r->enc = read_mat(g, "enc.output_norm.weight", 1, 3 * r->T);
    r->embd = read_mat(ep->own_embd ? g : target, "token_embd.weight", r->V, E);
    r->an = read_mat(g, "blk.0.attn_norm.weight", 1, E);
    r->hn = read_mat(g, "blk.0.attn_norm_2.weight", 1, E);
    r->wq = read_mat(g, "blk.0.attn_q.weight", qd, 2 * E);
    r->wk = read_mat(g, "blk.0.attn_k.weight", kvd, 2 * E);
    r->wv = read_mat(g, "blk.0.attn_v.weight", kvd, 2 * E);
    r->wo = read_mat(g, "blk.0.attn_output.weight", E, qd);
    r->fn = read_mat(g, "blk.0.ffn_norm.weight", 1, E);
    r->wg = read_mat(g, "blk.0.ffn_gate.weight", r->F, E);
    r->wu = read_mat(g, "blk.0.ffn_up.weight", r->F, E);
    r->wd = read_mat(g, "blk.0.ffn_down.weight", E, r->F);
    r->on = read_mat(g, "output_norm.weight", 1, E);
    r->out = read_mat(g, "output.weight", r->Vd, E);
    const tdm_gguf_tensor *d = tdm_gguf_find_tensor(g, "d2t");
    if (d) {
        r->d2t = malloc((size_t)r->Vd * sizeof *r->d2t);
        memcpy(r->d2t, d->data, (size_t)r->Vd * 8);
    }
    r->K = calloc((size_t)64 * kvd, sizeof(double));
    r->Vc = calloc((size_t)64 * kvd, sizeof(double));
}

static void rhead_close(rhead *r) {
    double *p[] = {r->fc, r->enc, r->embd, r->an, r->hn, r->wq, r->wk, r->wv, r->wo, r->fn, r->wg, r->wu, r->wd,
                   r->on, r->out, r->K, r->Vc};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
    free(r->d2t);
}

static void rms(const double *x, const double *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}

static void mv(const double *W, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double a = 0;
        for (int c = 0; c < cols; c++) a += W[(size_t)r * cols + c] * x[c];
        y[r] = a;
    }
}

/* RoPE of n_head heads of hd at position p: adjacent pairs (GGUF "normal"). */
static void rope(double *x, int n_head, int hd, int p, double base) {
    for (int h = 0; h < n_head; h++)
        for (int t = 0; t < hd / 2; t++) {
            const double th = p * pow(base, -2.0 * t / hd), c = cos(th), s = sin(th);
            double *v = x + h * hd + 2 * t, a = v[0], b = v[1];
            v[0] = a * c - b * s;
            v[1] = a * s + b * c;
        }
}

static void rhead_fuse(const rhead *r, const float *feat, double *g) {
    const int n = 3 * r->T;
    double *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++) x[i] = feat[i];
    if (r->nbf) rms(x, r->enc, n, r->eps, x);
    mv(r->fc, x, r->E, n, g);
    free(x);
}

/* One row: its K/V written at `slot` (RoPE at position p), attending to the slots
 * vis[n_vis] (itself among them): h[E] and logits[V]. */
static void rhead_row_at(rhead *r, int32_t token, const double *g, int slot, int p, const int *vis, int n_vis, double *h,
                         double *logits) {
    const int E = r->E, qd = r->H * r->hd, kvd = r->KV * r->hd, F = r->F;
    double *cat = malloc((size_t)2 * E * sizeof *cat), *q = malloc((size_t)qd * sizeof *q);
    double *att = calloc((size_t)qd, sizeof *att), *x = malloc((size_t)E * sizeof *x);
    double *xn = malloc((size_t)E * sizeof *xn), *gu = malloc((size_t)2 * F * sizeof *gu);
    double *y = malloc((size_t)E * sizeof *y), *ld = malloc((size_t)r->Vd * sizeof *ld);
    rms(r->embd + (size_t)token * E, r->an, E, r->eps, cat);
    rms(g, r->hn, E, r->eps, cat + E);
    mv(r->wq, cat, qd, 2 * E, q);
    mv(r->wk, cat, kvd, 2 * E, r->K + (size_t)slot * kvd);
    mv(r->wv, cat, kvd, 2 * E, r->Vc + (size_t)slot * kvd);
    rope(q, r->H, r->hd, p, r->base);
    rope(r->K + (size_t)slot * kvd, r->KV, r->hd, p, r->base);
    for (int hh = 0; hh < r->H; hh++) {
        const int kh = hh / (r->H / r->KV);
        double *sc = malloc((size_t)n_vis * sizeof *sc), mx = -1e300, sum = 0;
        for (int j = 0; j < n_vis; j++) {
            double d = 0;
            for (int i = 0; i < r->hd; i++) d += q[hh * r->hd + i] * r->K[(size_t)vis[j] * kvd + kh * r->hd + i];
            sc[j] = d / sqrt((double)r->hd);
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = 0; j < n_vis; j++) sum += (sc[j] = exp(sc[j] - mx));
        for (int j = 0; j < n_vis; j++)
            for (int i = 0; i < r->hd; i++)
                att[hh * r->hd + i] += sc[j] / sum * r->Vc[(size_t)vis[j] * kvd + kh * r->hd + i];
        free(sc);
    }
    mv(r->wo, att, E, qd, x);
    for (int i = 0; i < E; i++) x[i] += r->nbr ? cat[E + i] : g[i];
    rms(x, r->fn, E, r->eps, xn);
    mv(r->wg, xn, F, E, gu);
    mv(r->wu, xn, F, E, gu + F);
    for (int i = 0; i < F; i++) gu[i] = gu[i] / (1.0 + exp(-gu[i])) * gu[F + i];
    mv(r->wd, gu, E, F, y);
    for (int i = 0; i < E; i++) h[i] = x[i] + y[i];
    rms(h, r->on, E, r->eps, xn);
    mv(r->out, xn, r->Vd, E, ld);
    for (int v = 0; v < r->V; v++) logits[v] = NAN;
    for (int j = 0; j < r->Vd; j++) logits[r->d2t ? r->d2t[j] : j] = ld[j];
    free(cat), free(q), free(att), free(x), free(xn), free(gu), free(y), free(ld);
}

/* A chain's row at position p = its slot, seeing slots [0, p]. */
static void rhead_row(rhead *r, int32_t token, const double *g, int p, double *h, double *logits) {
    int vis[64];
    for (int j = 0; j <= p; j++) vis[j] = j;
    rhead_row_at(r, token, g, p, p, vis, p + 1, h, logits);
}

/* ||a - b|| / ||b|| over n values. */
static double rel(const float *a, const double *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

/* The logits row got[V] against the reference: the mapped ids within tol, every
 * other id TDM_LOGIT_NONE. */
static void expect_logits(const float *got, const double *want, int V, double tol, const char *what) {
    double num = 0, den = 0;
    int n_none = 0;
    for (int v = 0; v < V; v++) {
        if (isnan(want[v])) {
            cr_assert_eq(got[v], TDM_LOGIT_NONE, "%s: token %d is not in the draft vocabulary", what, v);
            n_none++;
            continue;
        }
        num += (got[v] - want[v]) * (got[v] - want[v]);
        den += want[v] * want[v];
    }
    cr_assert_gt(den, 0);
    cr_assert_lt(sqrt(num / den), tol, "%s: logits error %g", what, sqrt(num / den));
}

/* A head (from memory: buf, else the file path) paired with the pycode target on a
 * CPU backend, its reference, N rows of random features fused by both (checked
 * against each other), N random tokens, and a KV rig. */
typedef struct fix {
    tdm_backend *be;
    tdm_model *t;
    tdm_eagle3 *h;
    rhead r;
    int E, V, T3, N;
    float *feat, *g; /* [N][3T], [N][E] */
    double *rg;      /* [N][E] the reference's fused features */
    int32_t tok[16];
    tdm_eagle3_scratch s;
    rig kv;
    tdm_batch b;
} fix;

static void fix_open(fix *f, const uint8_t *buf, size_t len, const char *path, int N, uint64_t seed) {
    tdm_err err = {0};
    memset(f, 0, sizeof *f);
    cr_assert_leq(N, 16);
    f->be = cpu(2);
    f->t = load_target(f->be);
    if (buf) cr_assert_eq(load_mem(buf, len, f->be, &f->h, &err), TANDEM_OK, "%s", err.msg);
    else cr_assert_eq(tdm_eagle3_load(path, f->be, &f->h, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_eagle3_pair(f->h, f->t, &err), TANDEM_OK, "%s", err.msg);
    rhead_open(&f->r, f->h->m->gguf, f->t->gguf, f->h);
    f->E = f->r.E, f->V = f->r.V, f->T3 = 3 * f->r.T, f->N = N;
    uint64_t rng = seed;
    f->feat = malloc((size_t)N * f->T3 * sizeof *f->feat);
    f->g = malloc((size_t)N * f->E * sizeof *f->g);
    f->rg = malloc((size_t)N * f->E * sizeof *f->rg);
    for (int i = 0; i < N * f->T3; i++) f->feat[i] = tdm_test_randf(&rng, -2.0f, 2.0f);
    for (int i = 0; i < N; i++) f->tok[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)f->V);
    cr_assert_eq(tdm_eagle3_fuse(f->h, f->be, &f->s, f->feat, N, f->g, &err), TANDEM_OK, "%s", err.msg);
    for (int i = 0; i < N; i++) rhead_fuse(&f->r, f->feat + (size_t)i * f->T3, f->rg + (size_t)i * f->E);
    const double e = rel(f->g, f->rg, N * f->E);
    cr_assert_lt(e, 1e-5, "fused features: %g", e);
    rig_open(&f->kv, f->h->m, f->be);
    cr_assert_eq(tdm_batch_init(&f->b, 8, &err), TANDEM_OK);
}

/* The head's forward of f->b with g rows (host), into h_out / logits. */
static void fix_forward(fix *f, const float *g, float *h_out, float *logits) {
    tdm_err err = {0};
    const tdm_kv_seq *seqs[1] = {&f->kv.seq};
    cr_assert_eq(tdm_eagle3_forward(f->h, f->be, &f->kv.kv, &f->b, seqs, &f->s, g, h_out, logits, &err), TANDEM_OK,
                 "%s", err.msg);
}

static void fix_close(fix *f) {
    free(f->feat), free(f->g), free(f->rg);
    tdm_batch_free(&f->b);
    tdm_kv_store_free(&f->kv.kv);
    tdm_eagle3_scratch_free(&f->s);
    rhead_close(&f->r);
    tdm_eagle3_free(f->h);
    tdm_model_free(f->t);
    tdm_backend_destroy(f->be);
}

/* Three forwards of the head (5 rows at positions 0-4 from fused features, 1 row,
 * then 2 rows of which the first is a deeper level fed the previous row's output and
 * only the second wants logits) against the reference. */
static void check_forward(const uint8_t *buf, size_t len, const char *path, double tol) {
    fix f;
    fix_open(&f, buf, len, path, 8, 99);
    const int E = f.E, V = f.V;
    float *logits = malloc((size_t)5 * V * sizeof *logits), *hout = malloc((size_t)5 * E * sizeof *hout);
    double *rl = malloc((size_t)V * sizeof *rl), *rh = malloc((size_t)f.N * E * sizeof *rh);
    char what[64];
    /* 1: five rows */
    fill_batch(&f.b, f.tok, 0, 5, true);
    fix_forward(&f, f.g, hout, logits);
    for (int i = 0; i < 5; i++) {
        rhead_row(&f.r, f.tok[i], f.rg + (size_t)i * E, i, rh + (size_t)i * E, rl);
        snprintf(what, sizeof what, "row %d", i);
        expect_logits(logits + (size_t)i * V, rl, V, tol, what);
        cr_assert_lt(rel(hout + (size_t)i * E, rh + (size_t)i * E, E), tol, "row %d: h", i);
    }
    /* 2: one row */
    fill_batch(&f.b, f.tok, 5, 1, true);
    fix_forward(&f, f.g + (size_t)5 * E, hout, logits);
    rhead_row(&f.r, f.tok[5], f.rg + (size_t)5 * E, 5, rh + (size_t)5 * E, rl);
    expect_logits(logits, rl, V, tol, "row 5");
    /* 3: a deeper level's row (g = row 5's output), then a fused one wanting logits */
    float g3[2 * 512];
    cr_assert_leq(E, 512);
    memcpy(g3, hout, (size_t)E * sizeof(float));
    memcpy(g3 + E, f.g + (size_t)7 * E, (size_t)E * sizeof(float));
    fill_batch(&f.b, f.tok, 6, 2, true);
    f.b.want_logits[0] = 0;
    fix_forward(&f, g3, NULL, logits);
    double *g6 = malloc((size_t)E * sizeof *g6);
    for (int i = 0; i < E; i++) g6[i] = hout[i]; /* (the engine's h, as the head reads it) */
    rhead_row(&f.r, f.tok[6], g6, 6, rh + (size_t)6 * E, rl);
    rhead_row(&f.r, f.tok[7], f.rg + (size_t)7 * E, 7, rh + (size_t)7 * E, rl);
    expect_logits(logits, rl, V, tol, "row 7");
    /* an unpaired head refuses to run */
    f.h->paired = false;
    tdm_err err = {0};
    const tdm_kv_seq *seqs[1] = {&f.kv.seq};
    cr_assert_eq(tdm_eagle3_forward(f.h, f.be, &f.kv.kv, &f.b, seqs, &f.s, g3, NULL, logits, &err),
                 TANDEM_ERR_INVALID_ARG);
    f.h->paired = true;
    free(g6), free(rl), free(rh), free(logits), free(hout);
    fix_close(&f);
}

Test(eagle3, forward_every_option) {
    hcfg c = full_cfg();
    size_t len;
    uint8_t *buf = build_head(&c, &len);
    check_forward(buf, len, NULL, 2e-5);
    free(buf);
    /* q, k, v (and gate, up) of two types: fused in f32 at load */
    c.mixed = true;
    buf = build_head(&c, &len);
    check_forward(buf, len, NULL, 2e-5);
    free(buf);
}

Test(eagle3, forward_synth_head) {
    char path[32];
    synth_head(path, TDM_F16, NULL);
    check_forward(NULL, 0, path, 2e-5);
    unlink(path);
    /* q8_0 weights (the reference reads them dequantised) */
    synth_head(path, TDM_Q8_0, NULL);
    check_forward(NULL, 0, path, 2e-5);
    unlink(path);
}

/* A token tree through the head (the attention's tree masks, as a draft level of a
 * tree uses them): after a 5-row prefix, nodes 0 and 1 below the prefix, node 2
 * below node 0, node 3 below node 2, each at slot 5 + i and position 5 + its depth,
 * seeing the prefix and its ancestors; every row against the reference. */
Test(eagle3, forward_tree) {
    hcfg c = full_cfg();
    size_t len;
    uint8_t *buf = build_head(&c, &len);
    fix f;
    fix_open(&f, buf, len, NULL, 9, 7);
    const int E = f.E, V = f.V;
    float *logits = malloc((size_t)5 * V * sizeof *logits);
    double *rh = malloc((size_t)E * sizeof *rh), *rl = malloc((size_t)V * sizeof *rl);
    fill_batch(&f.b, f.tok, 0, 5, false);
    fix_forward(&f, f.g, NULL, logits);
    for (int i = 0; i < 5; i++) rhead_row(&f.r, f.tok[i], f.rg + (size_t)i * E, i, rh, rl);
    /* the tree: each node's depth, and its ancestors' bits (itself among them) */
    const int depth[4] = {0, 0, 1, 2};
    const uint64_t mask[4] = {1, 2, 1 | 4, 1 | 4 | 8};
    tdm_batch_clear(&f.b);
    for (int i = 0; i < 4; i++)
        cr_assert_geq(tdm_batch_add_tree(&f.b, f.tok[5 + i], 5 + depth[i], 0, 5 + i, 5, mask[i], true), 0);
    cr_assert(f.b.tree);
    fix_forward(&f, f.g + (size_t)5 * E, NULL, logits);
    for (int i = 0; i < 4; i++) {
        int vis[16], nv = 0;
        for (int j = 0; j < 5; j++) vis[nv++] = j;
        for (int j = 0; j < 4; j++)
            if (mask[i] >> j & 1) vis[nv++] = 5 + j;
        rhead_row_at(&f.r, f.tok[5 + i], f.rg + (size_t)(5 + i) * E, 5 + i, 5 + depth[i], vis, nv, rh, rl);
        char what[32];
        snprintf(what, sizeof what, "tree node %d", i);
        expect_logits(logits + (size_t)i * V, rl, V, 2e-5, what);
    }
    free(logits), free(rl), free(rh);
    fix_close(&f);
    free(buf);
}
