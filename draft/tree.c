/* tree.c - the token-tree structure (tree.h); shapes are in tree_shape.c. */
#include "tree.h"

#include <stdlib.h>
#include <string.h>

void tdm_tree_reset(tdm_tree *t) {
    t->n = 0;
    t->n_fed = 0;
    t->n_spine = 0;
    t->qrow_root = -1;
}

int32_t tdm_tree_add(tdm_tree *t, int32_t parent, int32_t token, float w) {
    if (t->n < 0 || t->n >= TDM_TREE_POOL) return -1;
    const int32_t i = t->n++;
    t->token[i] = token;
    t->parent[i] = parent;
    t->depth[i] = parent < 0 ? 0 : t->depth[parent] + 1;
    t->w[i] = w;
    t->dslot[i] = -1;
    t->qrow[i] = -1;
    t->lookup[i] = 0;
    return i;
}

void tdm_tree_masks(tdm_tree *t) {
    for (int32_t i = 0; i < t->n && i < TDM_TREE_MAX; i++)
        t->mask[i] = (t->parent[i] < 0 ? 0 : t->mask[t->parent[i]]) | (1ull << i);
}

void tdm_tree_spine_first(tdm_tree *t) {
    const int32_t n = t->n;
    int32_t order[TDM_TREE_POOL], map[TDM_TREE_POOL], m = 0;
    bool on[TDM_TREE_POOL] = {false};
    for (int32_t v = -1;;) { /* the first child of v (parents come first: after v) */
        int32_t c = -1;
        for (int32_t i = v + 1; i < n && c < 0; i++)
            if (t->parent[i] == v) c = i;
        if (c < 0) break;
        on[c] = true;
        order[m++] = c;
        v = c;
    }
    const int32_t spine = m;
    for (int32_t i = 0; i < n; i++)
        if (!on[i]) order[m++] = i;
    bool same = true;
    for (int32_t i = 0; i < n; i++) {
        map[order[i]] = i;
        same = same && order[i] == i;
    }
    if (!same) {
        tdm_tree o = *t;
        for (int32_t i = 0; i < n; i++) {
            const int32_t j = order[i];
            t->token[i] = o.token[j];
            t->parent[i] = o.parent[j] < 0 ? -1 : map[o.parent[j]];
            t->depth[i] = o.depth[j];
            t->w[i] = o.w[j];
            t->dslot[i] = o.dslot[j];
            t->qrow[i] = o.qrow[j];
            t->lookup[i] = o.lookup[j];
        }
    }
    t->n_spine = spine;
    tdm_tree_masks(t);
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
            t->lookup[m] = t->lookup[i];
            m++;
        }
        t->n = m;
    }
    t->n_spine = 0;
    tdm_tree_masks(t);
}

int32_t tdm_tree_merge_chain(tdm_tree *t, int32_t v, const int32_t *toks, int32_t n, float a, int32_t max_nodes,
                             int32_t max_depth) {
    int32_t added = 0;
    if (max_nodes > TDM_TREE_MAX) max_nodes = TDM_TREE_MAX;
    if (v < -1 || v >= t->n) return 0;
    for (int32_t i = 0; i < n; i++) {
        if ((v < 0 ? 0 : t->depth[v] + 1) >= max_depth) break;
        int32_t c = -1; /* the child of v with this token (children come after their parent) */
        for (int32_t j = v + 1; j < t->n && c < 0; j++)
            if (t->parent[j] == v && t->token[j] == toks[i]) c = j;
        if (c < 0) {
            if (t->n >= max_nodes || (c = tdm_tree_add(t, v, toks[i], (v < 0 ? 1.0f : t->w[v]) * a)) < 0) break;
            t->lookup[c] = 1;
            added++;
        }
        v = c;
    }
    return added;
}

tdm_tree_share tdm_tree_share_of(const tdm_tree *t, const int32_t *path, int32_t m) {
    tdm_tree_share r = {0, 0, 0, 0};
    while (r.draft_run < m && !t->lookup[path[r.draft_run]]) r.draft_run++;
    for (int32_t j = 0; j < m; j++) r.lookup_acc += t->lookup[path[j]];
    for (int32_t i = 0; i < t->n; i++) {
        r.lookup_nodes += t->lookup[i];
        if (!t->lookup[i]) r.draft_depth = TDM_MAX(r.draft_depth, t->depth[i] + 1);
    }
    return r;
}

int32_t tdm_tree_children(const tdm_tree *t, int32_t v, int32_t *kids) {
    int32_t k = 0;
    for (int32_t i = v + 1; i < t->n; i++)
        if (t->parent[i] == v) kids[k++] = i;
    return k;
}

/* k passes over d, each taking the largest not yet taken (the first on a tie): the
 * definition, and the answer where d holds a NaN (whose comparisons a single pass
 * cannot order the same way). */
static int32_t top_tokens_passes(const float *d, int32_t n, int32_t k, int32_t *ids) {
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

#define TOP_ONE_PASS_MAX 32 /* (the kept list's room; more: the passes) */

/* One pass keeping the k best so far in order (value descending, id ascending): a
 * token enters when it beats the k-th strictly (an equal one comes later in id
 * order, so it ranks below), after every kept one it does not beat; the same
 * tokens in the same order as the k passes wherever d has no NaN. */
int32_t tdm_top_tokens(const float *d, int32_t n, int32_t k, int32_t *ids) {
    k = TDM_MIN(k, n);
    if (k <= 0) return k;
    if (k > TOP_ONE_PASS_MAX) return top_tokens_passes(d, n, k, ids);
    int32_t m = 0;
    float v[TOP_ONE_PASS_MAX];
    for (int32_t i = 0; i < n; i++) {
        const float x = d[i];
        if (x != x) return top_tokens_passes(d, n, k, ids);
        if (m == k && !(x > v[k - 1])) continue;
        int32_t at = m < k ? m++ : k - 1;
        while (at > 0 && x > v[at - 1]) {
            v[at] = v[at - 1], ids[at] = ids[at - 1];
            at--;
        }
        v[at] = x, ids[at] = i;
    }
    return k;
}

/* (the reference of the tests) */
int32_t tdm_top_tokens_ref(const float *d, int32_t n, int32_t k, int32_t *ids) {
    return top_tokens_passes(d, n, TDM_MIN(k, n), ids);
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
