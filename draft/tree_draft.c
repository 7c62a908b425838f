/* tree_draft.c - token trees from the draft model or an EAGLE-3 head (tree_draft.h,
 * tree.h).
 *
 * Round 0 feeds every job's catch-up rows; each later round feeds the nodes that
 * get children, all jobs together in one draft forward (more only when the rows
 * exceed the batch or the logits rows).  Each logits row's distribution (softmax
 * of the draft's logits; for a sampled job the request's processed distribution,
 * kept in ws->tree_q for verification) gives the children of its node.  When every
 * job is greedy and the backend has the topk op, the candidates come from the
 * device instead (e->tree_topk_*: ids and softmax probabilities, no logits rows
 * downloaded).  A constrained or penalised job's rows are masked and edited on the
 * host first, each with the grammar state and the counts of its node's path
 * (edit_row), so that its children are tokens the grammar allows there. */
#include "tree_draft.h"

#include <stddef.h>
#include <string.h>

#include "constrain.h"
#include "kv_cache.h"
#include "oracle.h"
#include "penalty.h"

int32_t tdm_tree_slots(const tdm_tree_cfg *c) {
    /* target nodes: the budget; draft nodes: those fed, at most TDM_TREE_MAX - 1 */
    const int32_t fed = c->n_shape > 0 ? c->budget : (c->depth - 1) * c->width;
    return TDM_MIN(TDM_MAX(c->budget, fed), TDM_TREE_MAX);
}

/* rows of one draft forward being gathered */
typedef struct lvl_buf {
    tdm_engine *e;
    tdm_spec_ws *ws;
    tdm_tree_job *jobs;
    const tdm_kv_seq **kv;
    int32_t who[TDM_ENGINE_BATCH_LOGITS_MAX], node[TDM_ENGINE_BATCH_LOGITS_MAX]; /* per logits row */
    int32_t m;
    int32_t n_fwd;
    /* greedy trees on a device backend with the topk op: each logits row's
     * candidates come from the device (ws->tree_topk_*; no logits cross to the host) */
    bool dev_topk;
} lvl_buf;

/* Children count of node v (-1: the root) of a job's tree. */
static int32_t n_children(const tdm_tree_job *j, int32_t v) {
    const tdm_tree *t = j->tree;
    const int32_t d = v < 0 ? 0 : t->depth[v] + 1; /* the children's depth */
    if (d >= (j->cfg.n_shape > 0 ? j->cfg.n_shape : j->cfg.depth)) return 0;
    int32_t c = j->cfg.n_shape > 0 ? j->cfg.shape[d] : j->cfg.topk;
    /* a sampled tree is never pruned: it stops at its budget */
    if (j->sample || j->cfg.n_shape > 0) c = TDM_MIN(c, j->cfg.budget - t->n);
    return TDM_MAX(c, 0);
}

/* Benchmark only (draft/oracle.h): node v's candidates own[0..n_own) rearranged
 * when v's path is the target's continuation; returns how many of them (at most k)
 * become children. */
static int32_t oracle_children(const tdm_seq *s, tdm_spec_rec *sr, const tdm_tree *t, int32_t v, int32_t *own, int32_t n_own, int32_t k) {
    const int32_t g = s->n_tokens - s->n_prompt, d = v < 0 ? 0 : t->depth[v] + 1; /* the children's depth */
    bool on = g + d < sr->n_oracle;
    for (int32_t a = v; a >= 0 && on; a = t->parent[a]) on = t->token[a] == sr->oracle[g + t->depth[a]];
    if (!on) return TDM_MIN(n_own, k);
    int32_t out[17];
    const int32_t n = tdm_oracle_arrange(sr->oracle[g + d], sr->oracle_alpha, &sr->oracle_rng, own, n_own, k, out);
    for (int32_t i = 0; i < n; i++) own[i] = out[i];
    return n;
}

/* Node v's children: the candidates ids[0..got) with probabilities pr (the
 * benchmark's oracle rearranges them first). */
static void add_children(tdm_tree_job *j, int32_t v, int32_t c, int32_t *ids, float *pr, int32_t got) {
    tdm_tree *t = j->tree;
    if (j->sr->oracle) {
        /* the benchmark's candidates are right at rank 0 with probability alpha, at
         * rank 1 with (1 - alpha) / 2: the weights of a draft calibrated so (a
         * random-weight draft's own are flat, which would shape no tree) */
        got = oracle_children(j->s, j->sr, t, v, ids, got, TDM_MIN(c, 16));
        const double a = j->sr->oracle_alpha;
        for (int32_t i = 0; i < got; i++)
            pr[i] = (float)(i == 0 ? a : i == 1 || got <= 2 ? (1 - a) / 2 : (1 - a) / 2 / (got - 2));
    }
    const float w = v < 0 ? 1.0f : t->w[v];
    for (int32_t i = 0; i < got; i++)
        if (tdm_tree_add(t, v, ids[i], w * pr[i]) < 0) break;
}

/* The error of a draft logits row that holds a NaN or an infinity (node v's). */
static tandem_status nonfinite(const lvl_buf *b, const tdm_tree_job *j, int32_t v, tdm_err *err) {
    return tdm_engine_nonfinite(b->e, true, j->s->n_tokens + (v < 0 ? -1 : j->tree->depth[v]), err);
}

/* Whether the job's draft rows are masked or edited (on the host: edit_row). */
static bool job_edited(const tdm_tree_job *j) { return j->s->con || j->s->pen; }

/* A constrained or penalised job's draft row l of node v (-1: the root) masked with
 * the grammar's state after the committed text and v's path, and edited with the
 * counts of both, as the target's row of v will be (constrain.h, penalty.h);
 * *none when the grammar allows nothing there (v's token finished it: no children). */
static tandem_status edit_row(const tdm_engine *e, const tdm_tree_job *j, int32_t v, float *l, bool *none, tdm_err *err) {
    const tdm_tree *t = j->tree;
    tdm_seq *s = j->s;
    int32_t path[TDM_TREE_DEPTH_MAX + 1], d = 0;
    *none = false;
    for (int32_t a = v; a >= 0 && d <= TDM_TREE_DEPTH_MAX; a = t->parent[a]) path[d++] = t->token[a];
    for (int32_t a = 0, z = d - 1; a < z; a++, z--) {
        const int32_t tmp = path[a];
        path[a] = path[z], path[z] = tmp;
    }
    tandem_status st;
    if (s->pen && (st = tdm_penalty_draft_row(s, path, d, l, err))) return st;
    if (!s->con) return TANDEM_OK;
    int32_t n_allowed = 0;
    const uint32_t *mask;
    if ((st = tdm_constraint_path_mask(s, path, d, &mask, &n_allowed, err))) return st;
    *none = n_allowed == 0;
    if (!*none) tdm_logits_mask(l, e->n_vocab, mask, TDM_LOGIT_NONE);
    return TANDEM_OK;
}

/* The children of node v from the draft's logits row l (host memory). */
static tandem_status grow(lvl_buf *b, tdm_tree_job *j, int32_t v, float *l, tdm_err *err) {
    tdm_engine *e = b->e;
    tdm_spec_ws *ws = b->ws;
    tdm_tree *t = j->tree;
    const int32_t V = e->n_vocab, c = n_children(j, v);
    if (c <= 0) return TANDEM_OK;
    if (!tdm_logits_finite(l, V)) return nonfinite(b, j, v, err);
    if (job_edited(j)) {
        bool none;
        tandem_status st = edit_row(e, j, v, l, &none, err);
        if (st || none) return st;
    }
    float *q = e->tmp;
    if (j->sample) { /* its q row stays for verification */
        const int32_t row = v < 0 ? 0 : 1 + t->dslot[v];
        q = ws->tree_q + (size_t)row * (size_t)V;
        if (v < 0) t->qrow_root = row;
        else t->qrow[v] = row;
    }
    const tdm_sampler_params soft = {1.0f, 0, 1.0f, 0.0f};
    tdm_probs_from_logits(l, V, j->sample ? &j->s->sp : &soft, &e->ss, q);
    int32_t ids[TDM_TREE_TOPK];
    int32_t got = j->sample ? tdm_draw_distinct(q, V, TDM_MIN(c, 16), &j->s->rng, ids)
                            : tdm_top_tokens(q, V, TDM_MIN(c, 16) + (j->sr->oracle ? 1 : 0), ids);
    float pr[TDM_TREE_TOPK]; /* the probability of each rank */
    for (int32_t i = 0; i < got; i++) pr[i] = q[ids[i]];
    if (job_edited(j))
        while (got > 0 && !(pr[got - 1] > 0)) got--; /* (fewer tokens allowed than children asked) */
    add_children(j, v, c, ids, pr, got);
    return TANDEM_OK;
}

/* The same from logits row r's candidates as the device's topk op gave them. */
static tandem_status grow_top(lvl_buf *b, tdm_tree_job *j, int32_t v, int32_t r, tdm_err *err) {
    const int32_t c = n_children(j, v);
    if (c <= 0) return TANDEM_OK;
    int32_t *ids = b->ws->tree_topk_ids + (size_t)r * TDM_TREE_TOPK;
    float *pr = b->ws->tree_topk_p + (size_t)r * TDM_TREE_TOPK;
    if (ids[0] < 0) return nonfinite(b, j, v, err);
    int32_t got = 0;
    const int32_t want = TDM_MIN(TDM_MIN(c, 16) + (j->sr->oracle ? 1 : 0), TDM_TREE_TOPK);
    while (got < want && ids[got] >= 0) got++;
    add_children(j, v, c, ids, pr, got);
    return TANDEM_OK;
}

static tandem_status flush(lvl_buf *b, tdm_err *err) {
    tdm_engine *e = b->e;
    tdm_spec_ws *ws = b->ws;
    if (e->batch.n_rows == 0) return TANDEM_OK;
    e->batch.rows_shared = true; /* (a draft's rows only propose) */
    tandem_status st = tdm_engine_forward(e, true, &e->batch, b->kv, b->dev_topk ? TDM_FWD_LOGITS_DEV
                                                                                 : TDM_FWD_LOGITS_APPROX, err);
    b->n_fwd++;
    if (!st && b->dev_topk && b->m > 0)
        st = e->be->ops->topk(e->be, e->out_d, b->m, e->n_vocab, TDM_TREE_TOPK, ws->tree_topk_ids,
                              ws->tree_topk_p, err);
    for (int32_t r = 0; r < b->m && !st; r++)
        st = b->dev_topk ? grow_top(b, &b->jobs[b->who[r]], b->node[r], r, err)
                         : grow(b, &b->jobs[b->who[r]], b->node[r], e->logits_d + (size_t)r * (size_t)e->n_vocab, err);
    b->m = 0;
    tdm_batch_clear(&e->batch);
    return st;
}

/* Room for one more row (and a logits row when want). */
static tandem_status make_room(lvl_buf *b, bool want, tdm_err *err) {
    tdm_engine *e = b->e;
    const int32_t cap = TDM_MIN(e->n_logit_rows, TDM_ENGINE_BATCH_LOGITS_MAX);
    if (e->batch.n_rows >= e->max_rows || (want && b->m >= cap)) return flush(b, err);
    return TANDEM_OK;
}

/* The draft's mask of a fed node: its own and its ancestors' draft slots. */
static uint64_t dmask(const tdm_tree *t, int32_t v) {
    uint64_t m = 0;
    for (; v >= 0; v = t->parent[v]) m |= 1ull << t->dslot[v];
    return m;
}

/* The nodes of depth d that get children: every one in a static tree, else the
 * `width` of highest cumulative probability (ties: the earlier). */
static int32_t pick_expand(const tdm_tree_job *j, int32_t d, int32_t *out) {
    const tdm_tree *t = j->tree;
    const int32_t lim = j->cfg.n_shape > 0 ? TDM_TREE_POOL : j->cfg.width;
    int32_t k = 0;
    bool used[TDM_TREE_POOL] = {false};
    while (k < lim && t->n_fed + k < TDM_TREE_MAX) {
        int32_t best = -1;
        for (int32_t i = 0; i < t->n; i++)
            if (t->depth[i] == d && !used[i] && (best < 0 || t->w[i] > t->w[best])) best = i;
        if (best < 0) break;
        used[best] = true;
        out[k++] = best;
    }
    /* in creation order, so that draft slots follow the tree's own order */
    for (int32_t a = 1; a < k; a++)
        for (int32_t x = a; x > 0 && out[x - 1] > out[x]; x--) {
            const int32_t tmp = out[x];
            out[x] = out[x - 1], out[x - 1] = tmp;
        }
    return k;
}

_Static_assert(TDM_DTREE_POOL == TDM_TREE_POOL, "a device-grown tree holds what a host tree holds");

/* A device address inside the engine's device tree (never dereferenced here). */
#define DTREE_AT(ws, member) ((void *)((char *)(ws)->dtree + offsetof(tdm_dtree, member)))

/* One greedy dynamic tree grown on the device (kernels/dtree.h, the tree_grow op):
 * the catch-up forward, then one draft forward per level whose rows' tokens and
 * masks the op wrote (the host gives positions, slots and stand-in masks, known in
 * advance: a level of W expansions takes the next W draft slots, and every mask of
 * depth d has d + 1 bits, its own slot highest), all queued; the host waits once,
 * for the finished tree, which it then prunes as the host path does.  The same
 * tree as the host path's (the same candidates, weights and picks).
 * TANDEM_ERR_UNSUPPORTED when the draft's forward cannot take device masks (before
 * any level ran: the caller drafts on the host then). */
static tandem_status tree_on_device(tdm_engine *e, tdm_spec_ws *ws, tdm_tree_job *j, int32_t *n_fwd, tdm_err *err) {
    tdm_seq *s = j->s;
    const tdm_backend_ops *op = e->be->ops;
    const tdm_kv_seq *kv[1] = {&s->kv};
    const int32_t P = s->n_tokens, V = e->n_vocab;
    const int32_t depth = j->cfg.depth, width = j->cfg.width, k = TDM_MIN(j->cfg.topk, 16);
    tdm_batch *b = &e->batch;
    tandem_status st;
    *n_fwd = 0;
    tdm_tree_reset(j->tree);
    /* round 0: catch up; the pending token's row gives the root's children */
    for (int32_t c = s->n_draft; c < P; c += e->max_rows) {
        const int32_t end = TDM_MIN(P, c + e->max_rows);
        tdm_batch_clear(b);
        b->rows_shared = true;
        for (int32_t p = c; p < end; p++) tdm_batch_add(b, s->tokens[p], p, 0, p, p == P - 1);
        if ((st = tdm_model_forward_dev(e->draft, e->be, &e->kv_d, b, kv, &e->fs_d, NULL, e->out_d, NULL, NULL, err)))
            return st;
        ++*n_fwd;
    }
    s->n_draft = P;
    tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_CATCHUP);
    int32_t n_exp = depth > 1 ? TDM_MIN(width, k) : 0, fed = 0;
    if ((st = op->tree_grow(e->be, ws->dtree, e->out_d, 1, V, k, 0, n_exp > 0 ? width : 0, n_exp, err))) return st;
    for (int32_t d = 0; d + 1 < depth && n_exp > 0; d++) {
        const int32_t W = n_exp;
        tdm_batch_clear(b);
        b->rows_shared = true; /* (a draft's rows only propose) */
        if (W == 1 && fed == d) { /* one expansion a level so far: slot P + d, position P + d,
                                      every earlier slot its ancestor, a chain's row */
            tdm_batch_add(b, 0, P + d, 0, P + d, true);
        } else {
            for (int32_t x = 0; x < W; x++)
                tdm_batch_add_tree(b, 0, P + d, 0, P + fed + x, P, (1ull << (fed + x)) | ((1ull << d) - 1), true);
            b->tree_mask_dev = DTREE_AT(ws, next_mask);
        }
        st = tdm_model_forward_dev(e->draft, e->be, &e->kv_d, b, kv, &e->fs_d, DTREE_AT(ws, next_tok), e->out_d, NULL,
                                   NULL, err);
        tdm_batch_clear(b);
        if (st) {
            if (st == TANDEM_ERR_UNSUPPORTED && d == 0) s->n_draft = P - 1; /* (the host path feeds it again) */
            return st;
        }
        ++*n_fwd;
        fed += W;
        n_exp = d + 2 < depth ? TDM_MIN(TDM_MIN(width, W * k), TDM_TREE_MAX - fed) : 0;
        if ((st = op->tree_grow(e->be, ws->dtree, e->out_d, W, V, k, d + 1, n_exp > 0 ? width : 0, n_exp, err)))
            return st;
    }
    tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_LEVELS);
    tdm_dtree *h = ws->dtree_h;
    if ((st = op->download(e->be, h, ws->dtree, sizeof *h, err))) return st;
    if (h->bad || h->n < 0 || h->n > TDM_TREE_POOL || h->n_fed < 0 || h->n_fed > TDM_TREE_MAX)
        return tdm_engine_nonfinite(e, true, P - 1, err);
    tdm_tree *t = j->tree;
    for (int32_t i = 0; i < h->n; i++) {
        if (h->parent[i] >= i || h->parent[i] < -1 || h->dslot[i] >= h->n_fed)
            return tdm_seterr(err, TANDEM_ERR_BACKEND, "tree_grow: node %d of %d is malformed", (int)i, (int)h->n);
        t->token[i] = h->token[i];
        t->parent[i] = h->parent[i];
        t->depth[i] = h->depth[i];
        t->w[i] = h->w[i];
        t->dslot[i] = h->dslot[i];
        t->qrow[i] = -1;
        t->lookup[i] = 0;
    }
    t->n = h->n;
    t->n_fed = h->n_fed;
    tdm_tree_prune(t, j->cfg.budget);
    tdm_tree_spine_first(t);
    tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_FINISH);
    return TANDEM_OK;
}

/* The levels planned on the host (one draft forward per level for every job, more
 * when a level exceeds the batch or the logits rows). */
static tandem_status host_levels(tdm_engine *e, tdm_spec_ws *ws, tdm_tree_job *jobs, int32_t n, int32_t *n_forwards,
                                 tdm_err *err) {
    const tdm_kv_seq *kv[TDM_ENGINE_BATCH_LOGITS_MAX];
    lvl_buf b = {.e = e, .ws = ws, .jobs = jobs, .kv = kv, .dev_topk = ws->tree_topk_ids != NULL};
    tandem_status st;
    *n_forwards = 0;
    if (n > TDM_ENGINE_BATCH_LOGITS_MAX) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%d trees at once", (int)n);
    int32_t max_depth = 0;
    for (int32_t i = 0; i < n; i++) {
        if (jobs[i].sample || job_edited(&jobs[i])) b.dev_topk = false; /* (its q rows: the whole distribution;
                                                                             its rows masked, edited on the host) */
        kv[i] = &jobs[i].s->kv;
        tdm_tree_reset(jobs[i].tree);
        max_depth = TDM_MAX(max_depth, jobs[i].cfg.n_shape > 0 ? jobs[i].cfg.n_shape : jobs[i].cfg.depth);
    }
    tdm_batch_clear(&e->batch);
    /* round 0: catch up; the pending token's row gives the root's children */
    for (int32_t i = 0; i < n; i++) {
        const tdm_seq *s = jobs[i].s;
        for (int32_t p = s->n_draft; p < s->n_tokens; p++) {
            const bool want = p == s->n_tokens - 1;
            if ((st = make_room(&b, want, err))) return st;
            tdm_batch_add(&e->batch, s->tokens[p], p, i, p, want);
            if (want) b.who[b.m] = i, b.node[b.m++] = -1;
        }
    }
    if ((st = flush(&b, err))) return st;
    for (int32_t i = 0; i < n; i++) jobs[i].s->n_draft = jobs[i].s->n_tokens;
    tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_CATCHUP);
    /* round d + 1: the chosen nodes of depth d */
    for (int32_t d = 0; d + 1 < max_depth; d++) {
        for (int32_t i = 0; i < n; i++) {
            tdm_tree *t = jobs[i].tree;
            const int32_t P = jobs[i].s->n_tokens;
            int32_t ex[TDM_TREE_POOL];
            const int32_t k = pick_expand(&jobs[i], d, ex);
            for (int32_t x = 0; x < k; x++) {
                if (n_children(&jobs[i], ex[x]) <= 0) continue;
                if ((st = make_room(&b, true, err))) return st;
                t->dslot[ex[x]] = t->n_fed++;
                const uint64_t dm = dmask(t, ex[x]);
                if (t->dslot[ex[x]] == d && dm == (2ull << d) - 1) /* (slot = position: a chain's row) */
                    tdm_batch_add(&e->batch, t->token[ex[x]], P + d, i, P + d, true);
                else
                    tdm_batch_add_tree(&e->batch, t->token[ex[x]], P + d, i, P + t->dslot[ex[x]], P, dm, true);
                b.who[b.m] = i, b.node[b.m++] = ex[x];
            }
        }
        if (e->batch.n_rows == 0) break;
        if ((st = flush(&b, err))) return st;
    }
    tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_LEVELS);
    for (int32_t i = 0; i < n; i++) {
        tdm_tree *t = jobs[i].tree;
        if (!jobs[i].sample && jobs[i].cfg.n_shape == 0) tdm_tree_prune(t, jobs[i].cfg.budget);
        tdm_tree_spine_first(t); /* (the masks too) */
    }
    tdm_phase_mark(&e->ph, e->be, TDM_PH_TREE_FINISH);
    *n_forwards = b.n_fwd;
    return TANDEM_OK;
}

/* An EAGLE-3 head's trees (src/engine/head.c): the host levels with the head in tree
 * mode, which keeps every forward's h rows so that each fed node takes its parent's
 * (the catch-up's last row for the root's children); the rows: every job's catch-up
 * and at most TDM_TREE_MAX fed nodes.  The head's own levels are never grown on the
 * device (tree_on_device runs a draft model's forward). */
static tandem_status head_trees(tdm_engine *e, tdm_spec_ws *ws, tdm_tree_job *jobs, int32_t n, int32_t *n_forwards,
                                tdm_err *err) {
    int32_t rows = 0;
    for (int32_t i = 0; i < n; i++) rows += TDM_MAX(jobs[i].s->n_tokens - jobs[i].s->n_draft, 0) + TDM_TREE_MAX;
    tandem_status st = tdm_engine_head_tree_begin(e, rows, err);
    if (!st) st = host_levels(e, ws, jobs, n, n_forwards, err);
    tdm_engine_head_tree_end(e);
    return st;
}

tandem_status tdm_draft_trees(tdm_engine *e, tdm_spec_ws *ws, tdm_tree_job *jobs, int32_t n, int32_t *n_forwards, tdm_err *err) {
    if (e->head) return head_trees(e, ws, jobs, n, n_forwards, err);
    /* a lone greedy dynamic tree: on the device when the backend grows one */
    if (n == 1 && ws->dtree && !ws->dtree_off && !jobs[0].sample && jobs[0].cfg.n_shape == 0 && !jobs[0].sr->oracle &&
        !job_edited(&jobs[0]) && jobs[0].cfg.depth <= TDM_TREE_DEPTH_MAX) {
        tandem_status st = tree_on_device(e, ws, &jobs[0], n_forwards, err);
        if (st != TANDEM_ERR_UNSUPPORTED) return st;
        /* (a draft whose forward cannot take device masks: levels through the host) */
        ws->dtree_off = true;
    }
    return host_levels(e, ws, jobs, n, n_forwards, err);
}
