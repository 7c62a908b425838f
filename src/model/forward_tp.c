/* forward_tp.c - the forward pass of a split model (tp.h): every op on every rank
 * with the rank's weights and K/V, one thread driving the ranks in turn (each
 * rank's ops enqueue on its own device and return, so the devices work side by
 * side), two all-reduces per block and one gather of the logits.
 *
 *   x = embedding rows (every rank, the whole table)
 *   per block, on every rank r:  y_r = attention half (its heads) up to Wo_r
 *                                all-reduce: y = sum_r y_r;  x += y (post norm)
 *                                y_r = FFN half (its features) up to W2_r
 *                                all-reduce;  x += y
 *   logits: rank r's rows of the output head give its vocabulary columns,
 *   gathered into rank 0's logits.
 * The residual stream x is the same on every rank (the all-reduce gives every rank
 * the same sum). */
#include <stdlib.h>
#include <string.h>

#include "tp.h"

typedef struct rank_ctx {
    const tdm_model *m;
    tdm_backend *be;
    tdm_kv_store *kv;
    tdm_fwd_scratch *s;
} rank_ctx;

/* A grown-on-demand float buffer of a rank's scratch. */
static tandem_status grow(tdm_backend *be, float **buf, size_t *cap, size_t n, tdm_err *err) {
    if (n <= *cap) return TANDEM_OK;
    if (*buf) be->ops->free(be, *buf);
    *buf = NULL;
    *cap = 0;
    void *p;
    tandem_status st = be->ops->alloc(be, n * sizeof(float), &p, err);
    if (st) return st;
    *buf = p;
    *cap = n;
    return TANDEM_OK;
}

/* The ranks' models, backends, K/V storage and scratch; every rank's buffers for
 * n rows (and nl logits rows). */
static tandem_status ranks_of(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, tdm_fwd_scratch *s, int32_t n,
                              int32_t nl, rank_ctx *rk, tdm_err *err) {
    const tdm_tp_group *g = m->tp;
    if (!s->tp_rank && g->n > 1) {
        s->tp_rank = calloc((size_t)g->n - 1, sizeof *s->tp_rank);
        if (!s->tp_rank) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        s->tp_n = g->n - 1;
    }
    tdm_kv_store *kr = kv;
    for (int32_t r = 0; r < g->n; r++, kr = kr->tp_next) {
        if (!kr)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "KV storage of %d ranks for a model split %d ways", (int)r,
                              (int)g->n);
        rk[r] = (rank_ctx){g->rank[r], tdm_tp_rank_be(g, r, be), kr, r == 0 ? s : &s->tp_rank[r - 1]};
        tdm_fwd_scratch *sr = rk[r].s;
        tandem_status st;
        if ((st = tdm_backend_activate(rk[r].be, err)) ||
            (st = tdm_fwd_scratch_reserve(sr, rk[r].be, &rk[r].m->hp, n, err)) ||
            (st = grow(rk[r].be, &sr->tp_y, &sr->cap_tp_y, (size_t)sr->cap_rows * (size_t)m->hp.n_embd, err)) ||
            (st = grow(rk[r].be, &sr->tp_logits, &sr->cap_tp_logits,
                       (size_t)TDM_MAX(nl, 1) * (size_t)rk[r].m->output.rows, err)))
            return st;
    }
    return TANDEM_OK;
}

/* All-reduce of every rank's tp_y ([n][n_embd]), then x += y on every rank (through
 * the layer's post norm where it has one). */
static tandem_status reduce_add(const tdm_tp_group *g, rank_ctx *rk, int32_t n, int32_t l, bool ffn, tdm_err *err) {
    float *bufs[TDM_TP_MAX];
    for (int32_t r = 0; r < g->n; r++) bufs[r] = rk[r].s->tp_y;
    const int32_t E = rk[0].m->hp.n_embd;
    tandem_status st = g->coll->ops->all_reduce_sum(g->coll, bufs, (size_t)n * (size_t)E, err);
    for (int32_t r = 0; r < g->n && !st; r++) {
        const tdm_layer *L = &rk[r].m->layers[l];
        if (!(st = tdm_backend_activate(rk[r].be, err)))
            st = tdm_fwd_residual(rk[r].be, &rk[r].m->hp, ffn ? L->ffn_post_norm : L->attn_post_norm, rk[r].s->x,
                                  rk[r].s->tp_y, n, err);
    }
    return st;
}

static tandem_status tp_forward(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, float *logits, int32_t *n_logits,
                                tdm_err *err) {
    const tdm_tp_group *g = m->tp;
    const tdm_hparams *hp = &m->hp;
    tandem_status st;
    if ((st = tdm_fwd_check_batch(m, kv, batch, seqs, true, err))) return st;
    if ((st = tdm_model_check_backend(m, be, err))) return st;
    const int32_t n = batch->n_rows, E = hp->n_embd;
    int32_t nl = 0;
    for (int32_t i = 0; i < n; i++) nl += batch->want_logits[i] ? 1 : 0;
    rank_ctx rk[TDM_TP_MAX];
    if ((st = ranks_of(m, be, kv, s, n, nl, rk, err))) return st;

    for (int32_t r = 0; r < g->n; r++) {
        const tdm_backend_ops *op = rk[r].be->ops;
        if ((st = tdm_backend_activate(rk[r].be, err)) ||
            (st = op->get_rows(rk[r].be, &rk[r].m->tok_embd, batch->token, n, rk[r].s->x, err)))
            return st;
        if (hp->embd_scale != 1.0f && (st = op->scale(rk[r].be, rk[r].s->x, n, E, hp->embd_scale, err))) return st;
    }
    for (int32_t l = 0; l < hp->n_layer; l++) {
        for (int32_t r = 0; r < g->n; r++)
            if ((st = tdm_backend_activate(rk[r].be, err)) ||
                (st = tdm_fwd_layer_attn(rk[r].m, rk[r].be, rk[r].kv, batch, seqs, rk[r].s, l, rk[r].s->tp_y, err)))
                return st;
        if ((st = reduce_add(g, rk, n, l, false, err))) return st;
        for (int32_t r = 0; r < g->n; r++)
            if ((st = tdm_backend_activate(rk[r].be, err)) ||
                (st = tdm_fwd_layer_ffn(rk[r].m, rk[r].be, rk[r].s, n, l, rk[r].s->tp_y, err)))
                return st;
        if ((st = reduce_add(g, rk, n, l, true, err))) return st;
    }
    *n_logits = nl;
    if (nl == 0) return TANDEM_OK;

    /* every rank: its vocabulary columns of the rows that want logits */
    float *parts[TDM_TP_MAX];
    int64_t col0[TDM_TP_MAX], ncols[TDM_TP_MAX];
    for (int32_t r = 0; r < g->n; r++) {
        tdm_fwd_scratch *sr = rk[r].s;
        const tdm_backend_ops *op = rk[r].be->ops;
        int32_t k = 0;
        for (int32_t i = 0; i < n; i++)
            if (batch->want_logits[i]) sr->ids[k++] = i;
        const float *src = sr->x;
        if ((st = tdm_backend_activate(rk[r].be, err))) return st;
        if (nl != n) {
            if ((st = op->gather_rows(rk[r].be, sr->x, sr->ids, nl, E, sr->xb, err))) return st;
            src = sr->xb;
        }
        if ((st = op->rmsnorm(rk[r].be, src, rk[r].m->out_norm, nl, E, hp->norm_eps, sr->xb, err)) ||
            (st = op->matmul(rk[r].be, &rk[r].m->output, sr->xb, nl, sr->tp_logits, false, err)))
            return st;
        parts[r] = sr->tp_logits;
        col0[r] = rk[r].m->vocab0;
        ncols[r] = rk[r].m->output.rows;
    }
    return g->coll->ops->gather_cols(g->coll, logits, hp->n_vocab, parts, col0, ncols, nl, err);
}

tandem_status tdm_tp_forward(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                             const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, float *logits, int32_t *n_logits,
                             tdm_err *err) {
    *n_logits = 0;
    tandem_status st = tp_forward(m, be, kv, batch, seqs, s, logits, n_logits, err);
    tandem_status st0 = tdm_backend_activate(be, st ? NULL : err); /* (the caller goes on with rank 0's device) */
    return st ? st : st0;
}
