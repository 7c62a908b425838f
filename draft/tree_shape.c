/* tree_shape.c - token-tree shapes (tree.h): the dynamic configuration of a node
 * budget, static shapes and their parser (on its own, so that the job-file parser
 * links it without the tree machinery). */
#include "tree.h"

#include <stdlib.h>
#include <string.h>

/* tdm_tree_set_bench_shape's values; 0 = unset. */
static _Atomic int32_t g_width, g_branch, g_depth;

tandem_status tdm_tree_set_bench_shape(const tdm_tree_bench_shape *s, tdm_err *err) {
    if (s->width < 0 || s->width > 16)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree width %d: expected 1..16 (0: the default)", (int)s->width);
    if (s->branch < 0 || s->branch > 16)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree branch %d: expected 1..16 (0: the default)",
                          (int)s->branch);
    if (s->depth == 1 || s->depth < 0 || s->depth > TDM_TREE_DEPTH_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree depth %d: expected 2..%d (0: the default)", (int)s->depth,
                          TDM_TREE_DEPTH_MAX);
    g_width = s->width;
    g_branch = s->branch;
    g_depth = s->depth;
    return TANDEM_OK;
}

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
    /* a benchmark's shape (tdm_tree_set_bench_shape) */
    const int32_t width = g_width, branch = g_branch, depth = g_depth;
    if (width > 0) c.width = width;
    if (branch > 0) c.topk = branch;
    if (depth > 0) c.depth = TDM_MIN(depth, TDM_MAX(2, c.budget));
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
