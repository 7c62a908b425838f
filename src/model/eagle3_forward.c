/* eagle3_forward.c - an EAGLE-3 head's encoder (fc over the target's features) and
 * decoder (one block over [normed embedding ; normed g], the draft vocabulary's
 * logits placed at the target's ids), written once on the backend op table, so any
 * backend with the ops a llama block uses (and scatter_cols for a d2t head) runs it.
 *
 * The attention's input is [rmsnorm(e) ; rmsnorm(g)] (2 * n_embd wide); rather than
 * concatenate the rows, the q, k, v weights are split at load into the columns that
 * read each half (wqkv_e, wqkv_g), so qkv = xe Wqkv_e^T + xg Wqkv_g^T: two products
 * that read the same bytes as one, and no copy.
 */
#include <stdlib.h>
#include <string.h>

#include "eagle3.h"

void tdm_eagle3_scratch_free(tdm_eagle3_scratch *s) {
    if (!s || !s->be) return;
    float **bufs[] = {&s->g, &s->x, &s->xe, &s->xg, &s->qkv, &s->att, &s->gu, &s->ff, &s->enc, &s->sub};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bufs); i++) {
        if (*bufs[i]) s->be->ops->free(s->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    free(s->ids);
    memset(s, 0, sizeof *s);
}

static tandem_status reserve(const tdm_eagle3 *h, tdm_backend *be, tdm_eagle3_scratch *s, int32_t n, tdm_err *err) {
    if (s->be && s->be != be) tdm_eagle3_scratch_free(s);
    if (s->be && n <= s->cap) return TANDEM_OK;
    tdm_eagle3_scratch_free(s);
    s->be = be;
    const tdm_eagle3_hparams *ep = &h->ep;
    const int32_t cap = TDM_MAX(n, 16);
    const size_t E = (size_t)ep->n_embd, qd = (size_t)ep->n_head * (size_t)ep->head_dim,
                 kvd = (size_t)ep->n_head_kv * (size_t)ep->head_dim;
    const size_t sizes[] = {E, E, E, E, qd + 2 * kvd, qd, 2 * (size_t)ep->n_ff, (size_t)ep->n_ff,
                            ep->norm_before_fc ? 3 * (size_t)ep->target_hidden : 0,
                            ep->has_d2t ? (size_t)ep->n_draft_vocab : 0};
    float **bufs[] = {&s->g, &s->x, &s->xe, &s->xg, &s->qkv, &s->att, &s->gu, &s->ff, &s->enc, &s->sub};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bufs); i++) {
        if (!sizes[i]) continue;
        void *p;
        tandem_status st = be->ops->alloc(be, sizes[i] * (size_t)cap * sizeof(float), &p, err);
        if (st) {
            tdm_eagle3_scratch_free(s);
            return st;
        }
        *bufs[i] = p;
    }
    if (!(s->ids = tdm_mallocarray((size_t)cap, sizeof *s->ids))) {
        tdm_eagle3_scratch_free(s);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    s->be = be;
    s->cap = cap;
    return TANDEM_OK;
}

tandem_status tdm_eagle3_fuse(const tdm_eagle3 *h, tdm_backend *be, tdm_eagle3_scratch *s, const float *feat, int32_t n,
                              float *g, tdm_err *err) {
    if (n <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "eagle3: no feature rows");
    tandem_status st = reserve(h, be, s, n, err);
    if (st) return st;
    if (h->enc_norm) {
        const int32_t T3 = 3 * h->ep.target_hidden;
        if ((st = be->ops->rmsnorm(be, feat, h->enc_norm, n, T3, h->m->hp.norm_eps, s->enc, err))) return st;
        feat = s->enc;
    }
    return be->ops->matmul(be, &h->fc, feat, n, g, false, err);
}

tandem_status tdm_eagle3_forward(const tdm_eagle3 *h, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                 const tdm_kv_seq *const *seqs, tdm_eagle3_scratch *s, const float *g, float *h_out,
                                 float *logits, tdm_err *err) {
    const tdm_model *m = h->m;
    const tdm_hparams *hp = &m->hp;
    const tdm_eagle3_hparams *ep = &h->ep;
    const tdm_backend_ops *op = be->ops;
    const tdm_layer *L = &m->layers[0];
    tandem_status st;
    if (!h->paired)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "eagle3: head '%s' is not paired with a target (tdm_eagle3_pair)",
                          tdm_model_label(m));
    if (be->ops != m->be->ops) /* (a backend of its kind: an engine's, as for a draft model) */
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "eagle3: the head runs on a backend of its own kind");
    if (ep->has_d2t && !op->scatter_cols)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "eagle3: backend %s has no scatter_cols op", op->name);
    if (batch->tree_mask_dev)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "eagle3: tree masks in backend memory are not read by the ops");
    if ((st = tdm_fwd_check_batch(m, kv, batch, seqs, true, err))) return st;
    const int32_t n = batch->n_rows, E = ep->n_embd, F = ep->n_ff;
    const int32_t qd = ep->n_head * ep->head_dim, kvd = ep->n_head_kv * ep->head_dim, qkv_w = qd + 2 * kvd;
    if ((st = reserve(h, be, s, n, err))) return st;

    /* attention: qkv = [rmsnorm(e) ; rmsnorm(g)] Wqkv^T, as two products */
    if ((st = op->get_rows(be, &h->tok_embd, batch->token, n, s->x, err)) ||
        (st = op->rmsnorm(be, s->x, L->attn_norm, n, E, hp->norm_eps, s->xe, err)) ||
        (st = op->rmsnorm(be, g, h->hidden_norm, n, E, hp->norm_eps, s->xg, err)) ||
        (st = op->matmul(be, &h->wqkv_e, s->xe, n, s->qkv, false, err)) ||
        (st = op->matmul(be, &h->wqkv_g, s->xg, n, s->qkv, true, err)) ||
        (st = op->rope(be, s->qkv, n, qkv_w, ep->n_head, ep->head_dim, batch->pos, &hp->rope, err)) ||
        (st = op->rope(be, s->qkv + qd, n, qkv_w, ep->n_head_kv, ep->head_dim, batch->pos, &hp->rope, err)))
        return st;
    tdm_kv_write_args kw = {
        .batch = batch, .seqs = seqs, .k = s->qkv + qd, .v = s->qkv + qd + kvd, .row_stride = qkv_w,
        .k_cache = kv->k[0], .v_cache = kv->v[0], .cache_type = kv->type, .n_kv_head = ep->n_head_kv,
        .head_dim = ep->head_dim, .block_size = kv->block_size,
    };
    tdm_attn_args aa = {
        .batch = batch, .seqs = seqs, .q = s->qkv, .q_stride = qkv_w, .out = s->att, .k_cache = kv->k[0],
        .v_cache = kv->v[0], .cache_type = kv->type, .n_head = ep->n_head, .n_kv_head = ep->n_head_kv,
        .head_dim = ep->head_dim, .block_size = kv->block_size, .scale = hp->attn_scale,
    };
    if ((st = op->kv_write(be, &kw, err)) || (st = op->attention(be, &aa, err))) return st;
    /* x = residual (g, or its norm) + att Wo^T; then the FFN half */
    const float *res = ep->norm_before_residual ? s->xg : g;
    if ((st = op->copy(be, s->x, res, (size_t)n * (size_t)E * sizeof(float), err)) ||
        (st = op->matmul(be, &L->wo, s->att, n, s->x, true, err)) ||
        (st = op->rmsnorm(be, s->x, L->ffn_norm, n, E, hp->norm_eps, s->xe, err)) ||
        (st = op->matmul(be, &L->w13, s->xe, n, s->gu, false, err)) ||
        (st = op->swiglu(be, s->gu, n, F, s->ff, err)) ||
        (st = op->matmul(be, &L->w2, s->ff, n, s->x, true, err)))
        return st;
    if (h_out && (st = op->copy(be, h_out, s->x, (size_t)n * (size_t)E * sizeof(float), err))) return st;

    /* logits of the rows that want them */
    int32_t nl;
    if ((st = tdm_fwd_logit_rows(be, batch, s->x, m->out_norm, E, hp->norm_eps, s->ids, s->xe, s->xg, &nl, err)) ||
        nl == 0)
        return st;
    if (!ep->has_d2t) return op->matmul(be, &h->output, s->xg, nl, logits, false, err);
    if ((st = op->matmul(be, &h->output, s->xg, nl, s->sub, false, err))) return st;
    return op->scatter_cols(be, s->sub, nl, ep->n_draft_vocab, h->d2t_dev, ep->n_vocab, TDM_LOGIT_NONE, logits, err);
}
