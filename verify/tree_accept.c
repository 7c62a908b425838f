/* tree_accept.c - matching and multi-candidate rejection sampling over a token
 * tree (tree_accept.h). */
#include "tree_accept.h"

#include "accept.h"

int32_t tdm_tree_accept_match(const tdm_tree *t, const int32_t *target, int32_t *path, int32_t *next) {
    int32_t cur = -1, m = 0;
    for (;;) {
        const int32_t want = target[cur + 1];
        int32_t hit = -1;
        for (int32_t i = cur + 1; i < t->n && hit < 0; i++)
            if (t->parent[i] == cur && t->token[i] == want) hit = i;
        if (hit < 0) {
            *next = want;
            return m;
        }
        path[m++] = hit;
        cur = hit;
    }
}

void tdm_sibling_reject(double *r, double *q, int32_t x, int32_t n, bool replacement) {
    double mass = 0;
    for (int32_t i = 0; i < n; i++) {
        const double d = r[i] - q[i];
        mass += d > 0 ? d : 0;
    }
    if (mass > 0)
        for (int32_t i = 0; i < n; i++) {
            const double d = r[i] - q[i];
            r[i] = d > 0 ? d / mass : 0;
        }
    if (replacement || x < 0 || x >= n) return;
    const double left = 1.0 - q[x];
    if (!(left > 0)) return;
    q[x] = 0;
    for (int32_t i = 0; i < n; i++) q[i] /= left;
}

/* A draw from r[n] with one uniform (the last positive entry at the top end). */
static int32_t draw_double(const double *r, int32_t n, double u) {
    double s = 0, cum = 0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++)
        if (r[i] > 0) s += r[i], last = i;
    for (int32_t i = 0; i < last; i++)
        if (r[i] > 0 && u * s < (cum += r[i])) return i;
    return last;
}

int32_t tdm_tree_accept_sample(const tdm_tree *t, const float *p, const float *q, int32_t V, bool replacement,
                               tdm_rng *rng, double *scratch, int32_t *path, int32_t *next) {
    double *r = scratch, *qq = scratch + V;
    int32_t cur = -1, m = 0, kids[TDM_TREE_MAX];
    for (;;) {
        const float *pc = p + (size_t)(cur + 1) * (size_t)V;
        for (int32_t i = 0; i < V; i++) r[i] = pc[i] > 0 ? pc[i] : 0;
        const int32_t k = tdm_tree_children(t, cur, kids);
        const int32_t qr = cur < 0 ? t->qrow_root : t->qrow[cur];
        int32_t hit = -1;
        if (k > 0 && qr >= 0) {
            const float *qc = q + (size_t)qr * (size_t)V;
            for (int32_t i = 0; i < V; i++) qq[i] = qc[i] > 0 ? qc[i] : 0;
            for (int32_t c = 0; c < k && hit < 0; c++) {
                const int32_t x = t->token[kids[c]];
                const double u = tdm_rng_uniform(rng);
                const double a = tdm_accept_prob((float)r[x], (float)qq[x]);
                if (u < a) hit = kids[c];
                else tdm_sibling_reject(r, qq, x, V, replacement);
            }
        }
        if (hit < 0) {
            *next = draw_double(r, V, tdm_rng_uniform(rng));
            return m;
        }
        path[m++] = hit;
        cur = hit;
    }
}
