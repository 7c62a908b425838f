/* tree.c - token-tree shapes and the tree structure (tree.h). */
#include "tree.h"

#include <stdlib.h>
#include <string.h>

tdm_tree_cfg tdm_tree_cfg_dynamic(int32_t budget) {
    tdm_tree_cfg c;
    memset(&c, 0, sizeof c);
    c.budget = TDM_MIN(TDM_MAX(budget, 1), TDM_TREE_MAX);
    c.topk = 4;
    c.width = 4;
    /* levels for about two kept nodes each: deep trees pay where the draft agrees
     * with the target often (on the pycode pair, budget 32: 16 levels commit 7.9
     * tokens per target forward on 20 dev prompts, 8 levels 6.5; tests/RESULTS) */
    c.depth = TDM_MIN(TDM_TREE_DEPTH_MAX, TDM_MAX(2, c.budget / 2));
    return c;
}

int32_t tdm_tree_shape_nodes(const int32_t *shape, int32_t n_shape) {
    int64_t level = 1, total = 0;
    for (int32_t d = 0; d < n_shape; d++) {
        level *= shape[d];
        total += level;
        if (total > (1 << 20)) return 1 << 20;
    }
    return (int32_t)total;
}

bool tdm_tree_cfg_parse_shape(const char *s, tdm_tree_cfg *out, tdm_err *err) {
    tdm_tree_cfg c;
    memset(&c, 0, sizeof c);
    const char *p = s;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 16) {
            tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                       "tree shape '%s': expected branching factors 1..16 separated by commas, e.g. 4,2,2,1", s);
            return false;
        }
        if (c.n_shape == TDM_TREE_SHAPE_MAX) {
            tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree shape '%s': more than %d depths", s, TDM_TREE_SHAPE_MAX);
            return false;
        }
        c.shape[c.n_shape++] = (int32_t)v;
        p = end;
        if (*p == ',') {
            p++;
            if (!*p) break;
        } else if (*p) {
            tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree shape '%s': unexpected '%c'", s, *p);
            return false;
        }
    }
    if (c.n_shape == 0) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree shape '%s' is empty", s);
        return false;
    }
    const int32_t n = tdm_tree_shape_nodes(c.shape, c.n_shape);
    if (n > TDM_TREE_MAX) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree shape '%s' has %d nodes; at most %d", s, (int)n, TDM_TREE_MAX);
        return false;
    }
    c.budget = n;
    *out = c;
    return true;
}

void tdm_tree_reset(tdm_tree *t) {
    t->n = 0;
    t->n_fed = 0;
    t->qrow_root = -1;
}

int32_t tdm_tree_add(tdm_tree *t, int32_t parent, int32_t token, float w) {
    if (t->n >= TDM_TREE_POOL) return -1;
    const int32_t i = t->n++;
    t->token[i] = token;
    t->parent[i] = parent;
    t->depth[i] = parent < 0 ? 0 : t->depth[parent] + 1;
    t->w[i] = w;
    t->dslot[i] = -1;
    t->qrow[i] = -1;
    return i;
}

void tdm_tree_masks(tdm_tree *t) {
    for (int32_t i = 0; i < t->n && i < TDM_TREE_MAX; i++)
        t->mask[i] = (t->parent[i] < 0 ? 0 : t->mask[t->parent[i]]) | (1ull << i);
}

void tdm_tree_prune(tdm_tree *t, int32_t budget) {
    const int32_t n = t->n;
    if (budget > TDM_TREE_MAX) budget = TDM_TREE_MAX;
    if (n > budget) {
        /* best first among the nodes whose parent is kept */
        bool keep[TDM_TREE_POOL] = {false};
        for (int32_t got = 0; got < budget; got++) {
            int32_t best = -1;
            for (int32_t i = 0; i < n; i++)
                if (!keep[i] && (t->parent[i] < 0 || keep[t->parent[i]]) && (best < 0 || t->w[i] > t->w[best])) best = i;
            if (best < 0) break;
            keep[best] = true;
        }
        int32_t map[TDM_TREE_POOL], m = 0;
        for (int32_t i = 0; i < n; i++) {
            map[i] = -1;
            if (!keep[i]) continue;
            map[i] = m;
            t->token[m] = t->token[i];
            t->parent[m] = t->parent[i] < 0 ? -1 : map[t->parent[i]];
            t->depth[m] = t->depth[i];
            t->w[m] = t->w[i];
            t->dslot[m] = t->dslot[i];
            t->qrow[m] = t->qrow[i];
            m++;
        }
        t->n = m;
    }
    tdm_tree_masks(t);
}

int32_t tdm_tree_children(const tdm_tree *t, int32_t v, int32_t *kids) {
    int32_t k = 0;
    for (int32_t i = v + 1; i < t->n; i++)
        if (t->parent[i] == v) kids[k++] = i;
    return k;
}

int32_t tdm_top_tokens(const float *d, int32_t n, int32_t k, int32_t *ids) {
    k = TDM_MIN(k, n);
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t i = 0; i < n; i++) {
            if (best >= 0 && !(d[i] > d[best])) continue;
            bool taken = false;
            for (int32_t x = 0; x < j && !taken; x++) taken = ids[x] == i;
            if (!taken) best = i;
        }
        ids[j] = best;
    }
    return k;
}

int32_t tdm_draw_distinct(const float *d, int32_t n, int32_t k, tdm_rng *rng, int32_t *ids) {
    int32_t got = 0;
    double left = 0;
    for (int32_t i = 0; i < n; i++) left += d[i] > 0 ? d[i] : 0;
    while (got < k && left > 0) {
        const double u = tdm_rng_uniform(rng) * left;
        double cum = 0;
        int32_t pick = -1, last = -1;
        for (int32_t i = 0; i < n && pick < 0; i++) {
            if (!(d[i] > 0)) continue;
            bool taken = false;
            for (int32_t x = 0; x < got && !taken; x++) taken = ids[x] == i;
            if (taken) continue;
            last = i;
            cum += d[i];
            if (u < cum) pick = i;
        }
        if (pick < 0) pick = last; /* (rounding at the top end) */
        if (pick < 0) break;
        ids[got++] = pick;
        left -= d[pick];
    }
    return got;
}
