/* forward.c - the llama-family forward pass over a batch, written once on top of
 * the backend op table (kernels/backend.h).
 *
 * x = embedding rows (times embd_scale: gemma3).  Per layer:
 *   xb = rmsnorm(x);  qkv = xb Wqkv^T (+ b);  [per-head rmsnorm of q, k: qwen3, gemma3]
 *   rope(q), rope(k) (the layer's parameters: gemma3's sliding-window layers have
 *   their own base);  write k, v to the paged cache;  att = attention(q, cache) (the
 *   layer's window, the model's soft-cap);
 *   x += att Wo^T  [gemma3: x += rmsnorm(att Wo^T)];
 *   xb = rmsnorm(x);  gu = xb W13^T;  x += act(gu) W2^T  [gemma3: x += rmsnorm(...)]
 *   with act SwiGLU, or GeGLU for gemma3.
 * Then the rows that want logits are gathered, normed and projected (and soft-capped
 * where the model says).  A backend with a `blocks` op runs all the layers in one
 * call instead (the CPU backend: tensor parallel over its threads,
 * kernels/cpu/blocks.c), or declines the model's shape.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "sampling.h"
#include "tp.h"
#include "vocab_head.h"

void tdm_fwd_scratch_free(tdm_fwd_scratch *s) {
    if (!s) return;
    if (s->tp_rank) { /* (each on its rank's device) */
        for (int32_t r = 0; r < s->tp_n; r++) {
            (void)tdm_backend_activate(s->tp_rank[r].be, NULL);
            tdm_fwd_scratch_free(&s->tp_rank[r]);
        }
        free(s->tp_rank);
        s->tp_rank = NULL;
        s->tp_n = 0;
        (void)tdm_backend_activate(s->be, NULL);
    }
    if (!s->be) return;
    float **bufs[] = {&s->x,      &s->xb,         &s->qkv,   &s->att,  &s->gate_up, &s->ff,
                      &s->tp_y,   &s->tp_logits,  &s->moe_logits, &s->moe_x, &s->moe_y, &s->moe_acc,
                      &s->sub_logits, &s->feat};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bufs); i++) {
        if (*bufs[i]) s->be->ops->free(s->be, *bufs[i]);
        *bufs[i] = NULL;
    }
    free(s->moe_ids);
    free(s->moe_w);
    free(s->moe_rows);
    free(s->moe_rw);
    s->moe_ids = s->moe_rows = NULL;
    s->moe_w = s->moe_rw = NULL;
    if (s->moe_ids_dev) s->be->ops->free(s->be, s->moe_ids_dev);
    if (s->moe_w_dev) s->be->ops->free(s->be, s->moe_w_dev);
    s->moe_ids_dev = NULL;
    s->moe_w_dev = NULL;
    free(s->ids);
    s->ids = NULL;
    free(s->host_logits);
    s->host_logits = NULL;
    s->cap_host = 0;
    s->cap_rows = 0;
    s->cap_ids = 0;
    s->cap_tp_y = 0;
    s->cap_tp_logits = 0;
    s->cap_sub = 0;
    s->cap_feat = 0;
    s->blocks_declined = false;
    s->mm_rows = 0;
}

/* y[n][w->rows] (+)= x[n][w->cols] W^T, in slices of s->mm_rows rows when set. */
tandem_status tdm_fwd_matmul(tdm_backend *be, const tdm_fwd_scratch *s, const tdm_weight *w, const float *x,
                                int32_t n, float *y, bool acc, tdm_err *err) {
    const int32_t step = s->mm_rows > 0 ? s->mm_rows : n;
    for (int32_t i = 0; i < n; i += step) {
        const int32_t k = TDM_MIN(step, n - i);
        tandem_status st = be->ops->matmul(be, w, x + (size_t)i * w->cols, k, y + (size_t)i * w->rows, acc, err);
        if (st) return st;
    }
    return TANDEM_OK;
}

tandem_status tdm_fwd_scratch_reserve(tdm_fwd_scratch *s, tdm_backend *be, const tdm_hparams *hp, int32_t rows,
                                      tdm_err *err) {
    if (s->be && s->be != be) tdm_fwd_scratch_free(s);
    s->be = be;
    if (rows > s->cap_ids) {
        int32_t *ni = realloc(s->ids, (size_t)rows * sizeof *ni);
        if (!ni) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        s->ids = ni;
        s->cap_ids = rows;
    }
    if (rows <= s->cap_rows) return TANDEM_OK;
    int32_t cap = TDM_MAX(rows, s->cap_rows * 2);
    int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    int64_t width = TDM_MAX((int64_t)hp->n_embd, qd);
    const size_t ne = (size_t)hp->n_expert, moe_e = ne ? (size_t)hp->n_embd : 0; /* (dense: none) */
    size_t sizes[] = {(size_t)width, (size_t)width, (size_t)(qd + 2 * kvd), (size_t)qd,
                      (size_t)2 * (size_t)hp->n_ff, (size_t)hp->n_ff, ne, moe_e, moe_e, moe_e};
    float **bufs[] = {&s->x, &s->xb, &s->qkv, &s->att, &s->gate_up, &s->ff,
                      &s->moe_logits, &s->moe_x, &s->moe_y, &s->moe_acc};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bufs); i++) {
        if (*bufs[i]) be->ops->free(be, *bufs[i]);
        *bufs[i] = NULL;
    }
    s->cap_rows = 0;
    if (ne) { /* the routing, on the host */
        const size_t k = (size_t)hp->n_expert_used;
        free(s->moe_ids);
        free(s->moe_w);
        free(s->moe_rows);
        free(s->moe_rw);
        s->moe_ids = tdm_mallocarray((size_t)cap * k, sizeof *s->moe_ids);
        s->moe_w = tdm_mallocarray((size_t)cap * k, sizeof *s->moe_w);
        s->moe_rows = tdm_mallocarray((size_t)cap, sizeof *s->moe_rows);
        s->moe_rw = tdm_mallocarray((size_t)cap, sizeof *s->moe_rw);
        if (!s->moe_ids || !s->moe_w || !s->moe_rows || !s->moe_rw)
            return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        if (!be->host_memory) { /* the moe_route op's output, on the device */
            if (s->moe_ids_dev) be->ops->free(be, s->moe_ids_dev);
            if (s->moe_w_dev) be->ops->free(be, s->moe_w_dev);
            s->moe_ids_dev = NULL;
            s->moe_w_dev = NULL;
            void *pi, *pw;
            tandem_status st = be->ops->alloc(be, (size_t)cap * k * sizeof(int32_t), &pi, err);
            if (st) return st;
            s->moe_ids_dev = pi;
            if ((st = be->ops->alloc(be, (size_t)cap * k * sizeof(float), &pw, err))) return st;
            s->moe_w_dev = pw;
        }
    }
    for (size_t i = 0; i < TDM_ARRAY_LEN(bufs); i++) {
        if (sizes[i] == 0) continue;
        void *p;
        tandem_status st = be->ops->alloc(be, sizes[i] * (size_t)cap * sizeof(float), &p, err);
        if (st) return st;
        *bufs[i] = p;
    }
    s->cap_rows = cap;
    return TANDEM_OK;
}

tandem_status tdm_fwd_check_batch(const tdm_model *m, const tdm_kv_store *kv, const tdm_batch *b,
                                  const tdm_kv_seq *const *seqs, bool tokens_on_host, tdm_err *err) {
    if (b->n_rows <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "empty batch");
    if (kv->n_layer != m->hp.n_layer || kv->n_kv_head != m->hp.n_head_kv || kv->head_dim != m->hp.head_dim)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "KV storage does not match the model");
    for (int32_t i = 0; i < b->n_rows; i++) {
        int32_t t = b->token[i];
        if (tokens_on_host && (t < 0 || t >= m->hp.n_vocab))
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "token id %d out of range [0, %d)", (int)t,
                              (int)m->hp.n_vocab);
        const tdm_kv_seq *sq = seqs[b->seq[i]];
        if (b->slot[i] < 0 || b->slot[i] >= sq->len || b->n_visible[i] > sq->len || b->n_visible[i] < 0)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "row %d: slot %d / visible %d outside the sequence's %d reserved positions",
                              (int)i, (int)b->slot[i], (int)b->n_visible[i], (int)sq->len);
        if (b->pos[i] < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "negative position");
    }
    return TANDEM_OK;
}

tandem_status tdm_model_forward(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv,
                                const tdm_batch *batch, const tdm_kv_seq *const *seqs,
                                tdm_fwd_scratch *s, float *logits, tdm_err *err) {
    return tdm_model_forward_ex(m, be, kv, batch, seqs, s, TDM_FWD_LOGITS, logits, NULL, err);
}

/* The attention output (or FFN output) y[n][E] into the residual stream: x += y,
 * through the post norm when the layer has one (y is overwritten then). */
tandem_status tdm_fwd_residual(tdm_backend *be, const tdm_hparams *hp, const float *post_norm, float *x, float *y,
                               int32_t n, tdm_err *err) {
    tandem_status st;
    if (post_norm && (st = be->ops->rmsnorm(be, y, post_norm, n, hp->n_embd, hp->norm_eps, y, err))) return st;
    return be->ops->add(be, x, y, n, hp->n_embd, err);
}

/* s->qkv[n][qd + 2 kvd] = s->xb Wqkv^T: the fused weight's one product, or the three
 * of q, k and v kept apart (tdm_qkv_split): one row's straight into its columns, more
 * rows' each into a buffer free at this point (s->att: q; s->gate_up: k, v), then
 * copied into the rows' columns. */
static tandem_status qkv_product(tdm_backend *be, const tdm_fwd_scratch *s, const tdm_layer *L, int32_t qd,
                                 int32_t kvd, int32_t n, tdm_err *err) {
    if (!tdm_qkv_split(L)) return tdm_fwd_matmul(be, s, &L->wqkv, s->xb, n, s->qkv, false, err);
    const int32_t qkv_w = qd + 2 * kvd;
    const tdm_weight *w[3] = {&L->wq, &L->wk, &L->wv};
    const int32_t col[3] = {0, qd, qd + kvd};
    tandem_status st;
    if (n == 1) {
        for (int p = 0; p < 3; p++)
            if ((st = tdm_fwd_matmul(be, s, w[p], s->xb, 1, s->qkv + col[p], false, err))) return st;
        return TANDEM_OK;
    }
    /* (gate_up holds [rows][2 n_ff] floats: k and v fit wherever kvd <= n_ff, as in
     * every model of the architectures tandem runs; a mixture of experts: each
     * expert's n_ff) */
    const int64_t ff = (L->exp_w13 ? L->exp_w13[0].rows : L->w13.rows) / 2;
    if (kvd > ff)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "forward: separate q, k, v weights with kv width %d above the "
                          "FFN's %lld features", (int)kvd, (long long)ff);
    float *out[3] = {s->att, s->gate_up, s->gate_up + (size_t)n * kvd};
    for (int p = 0; p < 3; p++) {
        if ((st = tdm_fwd_matmul(be, s, w[p], s->xb, n, out[p], false, err))) return st;
        const size_t width = (size_t)w[p]->rows;
        for (int32_t i = 0; i < n; i++)
            if ((st = be->ops->copy(be, s->qkv + (size_t)i * qkv_w + col[p], out[p] + (size_t)i * width,
                                    width * sizeof(float), err)))
                return st;
    }
    return TANDEM_OK;
}

tandem_status tdm_fwd_layer_attn(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                 const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, int32_t l, float *y, tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    const tdm_backend_ops *op = be->ops;
    tandem_status st;
    const int32_t n = batch->n_rows, E = hp->n_embd;
    const int32_t qd = hp->n_head * hp->head_dim, kvd = hp->n_head_kv * hp->head_dim;
    const int32_t qkv_w = qd + 2 * kvd;
    const tdm_layer *L = &m->layers[l];
    const bool swa = tdm_hparams_layer_swa(hp, l);
    const tdm_rope_params *rp = swa ? &hp->rope_swa : &hp->rope;
    if ((st = op->rmsnorm(be, s->x, L->attn_norm, n, E, hp->norm_eps, s->xb, err))) return st;
    if ((st = qkv_product(be, s, L, qd, kvd, n, err))) return st;
    if (L->bqkv && (st = op->add_bias(be, s->qkv, L->bqkv, n, qkv_w, err))) return st;
    if (L->q_norm &&
        ((st = op->head_rmsnorm(be, s->qkv, n, qkv_w, hp->n_head, hp->head_dim, L->q_norm, hp->norm_eps, err)) ||
         (st = op->head_rmsnorm(be, s->qkv + qd, n, qkv_w, hp->n_head_kv, hp->head_dim, L->k_norm, hp->norm_eps,
                                err))))
        return st;
    if ((st = op->rope(be, s->qkv, n, qkv_w, hp->n_head, hp->head_dim, batch->pos, rp, err))) return st;
    if ((st = op->rope(be, s->qkv + qd, n, qkv_w, hp->n_head_kv, hp->head_dim, batch->pos, rp, err))) return st;
    tdm_kv_write_args kw = {
        .batch = batch, .seqs = seqs, .k = s->qkv + qd, .v = s->qkv + qd + kvd,
        .row_stride = qkv_w, .k_cache = kv->k[l], .v_cache = kv->v[l], .cache_type = kv->type,
        .n_kv_head = hp->n_head_kv, .head_dim = hp->head_dim, .block_size = kv->block_size,
    };
    if ((st = op->kv_write(be, &kw, err))) return st;
    tdm_attn_args aa = {
        .batch = batch, .seqs = seqs, .q = s->qkv, .q_stride = qkv_w, .out = s->att,
        .k_cache = kv->k[l], .v_cache = kv->v[l], .cache_type = kv->type, .n_head = hp->n_head,
        .n_kv_head = hp->n_head_kv, .head_dim = hp->head_dim, .block_size = kv->block_size,
        .scale = hp->attn_scale, .window = swa ? hp->swa_window : 0, .softcap = hp->attn_softcap,
    };
    if ((st = op->attention(be, &aa, err))) return st;
    if (y) return tdm_fwd_matmul(be, s, &L->wo, s->att, n, y, false, err);
    if (L->attn_post_norm)
        return (st = tdm_fwd_matmul(be, s, &L->wo, s->att, n, s->xb, false, err))
                   ? st
                   : tdm_fwd_residual(be, hp, L->attn_post_norm, s->x, s->xb, n, err);
    return tdm_fwd_matmul(be, s, &L->wo, s->att, n, s->x, true, err);
}

tandem_status tdm_fwd_layer_ffn(const tdm_model *m, tdm_backend *be, tdm_fwd_scratch *s, int32_t n, int32_t l,
                                float *y, tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    const tdm_backend_ops *op = be->ops;
    const tdm_layer *L = &m->layers[l];
    const int32_t E = hp->n_embd, F = hp->n_ff;
    tandem_status st;
    if (L->exp_w13) return tdm_fwd_layer_moe(m, be, s, n, l, y, err);
    if ((st = op->rmsnorm(be, s->x, L->ffn_norm, n, E, hp->norm_eps, s->xb, err))) return st;
    if ((st = tdm_fwd_matmul(be, s, &L->w13, s->xb, n, s->gate_up, false, err))) return st;
    st = hp->ffn_act == TDM_ACT_GELU_TANH ? op->geglu(be, s->gate_up, n, F, s->ff, err)
                                           : op->swiglu(be, s->gate_up, n, F, s->ff, err);
    if (st) return st;
    if (y) return tdm_fwd_matmul(be, s, &L->w2, s->ff, n, y, false, err);
    if (L->ffn_post_norm)
        return (st = tdm_fwd_matmul(be, s, &L->w2, s->ff, n, s->xb, false, err))
                   ? st
                   : tdm_fwd_residual(be, hp, L->ffn_post_norm, s->x, s->xb, n, err);
    return tdm_fwd_matmul(be, s, &L->w2, s->ff, n, s->x, true, err);
}

/* Blocks [l0, l1), op by op (backends without a `blocks` op, or shapes it does not run). */
static tandem_status blocks_by_ops(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv,
                                   const tdm_batch *batch, const tdm_kv_seq *const *seqs,
                                   tdm_fwd_scratch *s, int32_t l0, int32_t l1, tdm_err *err) {
    tandem_status st;
    for (int32_t l = l0; l < l1; l++)
        if ((st = tdm_fwd_layer_attn(m, be, kv, batch, seqs, s, l, NULL, err)) ||
            (st = tdm_fwd_layer_ffn(m, be, s, batch->n_rows, l, NULL, err)))
            return st;
    return TANDEM_OK;
}

/* The backend's `blocks` op over blocks [l0, l1), with the feature export in the op
 * when feat (backends with blocks_feat); *ran false when there is none or it declined
 * (the model's shape or the backend's configuration, and so remembered; a token-tree
 * batch's may be the batch's, a backend whose blocks op has no tree attention: the
 * next batch asks again).  (A part of the layers only where the op's layer pattern
 * does not depend on the first layer's index: no sliding-window layers.) */
static tandem_status try_blocks(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, int32_t l0, int32_t l1, bool feat,
                                bool *ran, tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    const bool part = l0 > 0 || l1 < hp->n_layer;
    *ran = false;
    if (!be->ops->blocks || s->blocks_declined || (part && hp->swa_window > 0)) return TANDEM_OK;
    tdm_blocks_args a = {
        .batch = batch, .seqs = seqs, .layers = m->layers + l0, .k_cache = kv->k + l0, .v_cache = kv->v + l0,
        .cache_type = kv->type, .block_size = kv->block_size, .n_layer = l1 - l0,
        .n_embd = hp->n_embd, .n_ff = hp->n_ff, .n_head = hp->n_head, .n_kv_head = hp->n_head_kv,
        .head_dim = hp->head_dim, .norm_eps = hp->norm_eps, .rope = &hp->rope, .attn_scale = hp->attn_scale,
        .rope_swa = hp->swa_window > 0 ? &hp->rope_swa : NULL, .swa_window = hp->swa_window,
        .swa_pattern = hp->swa_pattern, .attn_softcap = hp->attn_softcap, .ffn_act = hp->ffn_act,
        .n_expert = hp->n_expert, .n_expert_used = hp->n_expert_used, .x = s->x,
    };
    if (feat) {
        a.feat = s->feat;
        a.feat_layers = s->feat_layers;
        a.n_feat = s->n_feat;
    }
    tdm_err probe = {0};
    tandem_status st = be->ops->blocks(be, &a, &probe);
    if (st != TANDEM_ERR_UNSUPPORTED) {
        *ran = true;
        if (st && err) *err = probe;
        return st;
    }
    if (!batch->tree) s->blocks_declined = true;
    return TANDEM_OK;
}

/* Blocks [l0, l1): the backend's `blocks` op when it runs this configuration, else
 * op by op. */
static tandem_status run_block_range(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv,
                                     const tdm_batch *batch, const tdm_kv_seq *const *seqs,
                                     tdm_fwd_scratch *s, int32_t l0, int32_t l1, tdm_err *err) {
    if (l0 == l1) return TANDEM_OK;
    bool ran;
    tandem_status st = try_blocks(m, be, kv, batch, seqs, s, l0, l1, false, &ran, err);
    if (st || ran) return st;
    if (batch->tree_mask_dev) /* (the ops read the host's stand-in masks) */
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "forward: tree masks in backend memory need the backend's fused blocks");
    return blocks_by_ops(m, be, kv, batch, seqs, s, l0, l1, err);
}

tandem_status tdm_fwd_scratch_set_features(tdm_fwd_scratch *s, const int32_t *layers, int32_t n, tdm_err *err) {
    if (n < 0 || n > (int32_t)TDM_ARRAY_LEN(s->feat_layers) || (n > 0 && !layers))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "features: %d layers (at most %d)", (int)n,
                          (int)TDM_ARRAY_LEN(s->feat_layers));
    for (int32_t k = 0; k < n; k++)
        if (layers[k] < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "features: layer %d", (int)layers[k]);
    s->n_feat = n;
    for (int32_t k = 0; k < n; k++) s->feat_layers[k] = layers[k];
    return TANDEM_OK;
}

/* The residual stream entering layer l (s->x), of every row, into the feature
 * columns of each k whose layer is l. */
static tandem_status export_features(const tdm_model *m, tdm_backend *be, tdm_fwd_scratch *s, int32_t n, int32_t l,
                                     tdm_err *err) {
    const size_t E = (size_t)m->hp.n_embd, w = (size_t)s->n_feat * E;
    tandem_status st;
    for (int32_t k = 0; k < s->n_feat; k++) {
        if (s->feat_layers[k] != l) continue;
        for (int32_t i = 0; i < n; i++)
            if ((st = be->ops->copy(be, s->feat + (size_t)i * w + (size_t)k * E, s->x + (size_t)i * E,
                                    E * sizeof(float), err)))
                return st;
    }
    return TANDEM_OK;
}

/* Every block; with the feature export on, by a blocks op that writes the features
 * itself (blocks_feat), else in parts that end at the feature layers, each part's
 * stream exported before the next part runs. */
static tandem_status run_blocks(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv,
                                const tdm_batch *batch, const tdm_kv_seq *const *seqs,
                                tdm_fwd_scratch *s, tdm_err *err) {
    const int32_t L = m->hp.n_layer, n = batch->n_rows;
    if (s->n_feat == 0) return run_block_range(m, be, kv, batch, seqs, s, 0, L, err);
    tandem_status st;
    for (int32_t k = 0; k < s->n_feat; k++)
        if (s->feat_layers[k] > L)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "features: layer %d of model '%s' with %d layers",
                              (int)s->feat_layers[k], tdm_model_label(m), (int)L);
    if (n > s->cap_feat) {
        if (s->feat) be->ops->free(be, s->feat);
        s->feat = NULL;
        s->cap_feat = 0;
        void *p;
        if ((st = be->ops->alloc(be, (size_t)n * (size_t)s->n_feat * (size_t)m->hp.n_embd * sizeof(float), &p, err)))
            return st;
        s->feat = p;
        s->cap_feat = n;
    }
    if (be->blocks_feat) { /* (the stream after the last layer: x itself) */
        bool ran;
        if ((st = try_blocks(m, be, kv, batch, seqs, s, 0, L, true, &ran, err))) return st;
        if (ran) return export_features(m, be, s, n, L, err);
    }
    int32_t l0 = 0;
    for (;;) {
        if ((st = export_features(m, be, s, n, l0, err))) return st;
        int32_t next = L; /* the next feature layer above l0 */
        for (int32_t k = 0; k < s->n_feat; k++)
            if (s->feat_layers[k] > l0 && s->feat_layers[k] < next) next = s->feat_layers[k];
        if ((st = run_block_range(m, be, kv, batch, seqs, s, l0, next, err))) return st;
        if (next == L) return export_features(m, be, s, n, L, err);
        l0 = next;
    }
}

/* Embedding, blocks, and the final norm of the rows that want logits into s->xb;
 * *n_logits = how many (0: nothing more to do).  Tokens from tok_dev (backend
 * memory) when not NULL, else batch->token. */
static tandem_status forward_trunk(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                   const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, const int32_t *tok_dev,
                                   int32_t *n_logits, tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    const tdm_backend_ops *op = be->ops;
    tandem_status st;
    *n_logits = 0;
    if ((st = tdm_fwd_check_batch(m, kv, batch, seqs, !tok_dev, err))) return st;
    if ((st = tdm_model_check_backend(m, be, err))) return st;
    int32_t n = batch->n_rows;
    if ((st = tdm_fwd_scratch_reserve(s, be, hp, n, err))) return st;
    /* a tree verification's rows each as in a decode step: its products in slices the
     * backend computes row by row (the blocks op keeps tree batches on its row
     * kernels itself) */
    s->mm_rows = batch->tree && !batch->rows_shared ? be->invariant_rows : 0;

    const int32_t E = hp->n_embd;
    if (tok_dev) {
        if (!op->get_rows_dev)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "forward: backend %s has no device token ids", op->name);
        if ((st = op->get_rows_dev(be, &m->tok_embd, tok_dev, n, s->x, err))) return st;
    } else if ((st = op->get_rows(be, &m->tok_embd, batch->token, n, s->x, err))) {
        return st;
    }
    if (hp->embd_scale != 1.0f && (st = op->scale(be, s->x, n, E, hp->embd_scale, err))) return st;

    if ((st = run_blocks(m, be, kv, batch, seqs, s, err))) return st;

    /* logits for the rows that want them */
    return tdm_fwd_logit_rows(be, batch, s->x, m->out_norm, E, hp->norm_eps, s->ids, s->xb, s->xb, n_logits, err);
}

tandem_status tdm_fwd_logit_rows(tdm_backend *be, const tdm_batch *batch, const float *x, const float *out_norm,
                                 int32_t E, float eps, int32_t *ids, float *tmp, float *out, int32_t *nl,
                                 tdm_err *err) {
    const tdm_backend_ops *op = be->ops;
    tandem_status st;
    const int32_t n = batch->n_rows;
    *nl = 0;
    for (int32_t i = 0; i < n; i++)
        if (batch->want_logits[i]) ids[(*nl)++] = i;
    if (*nl == 0) return TANDEM_OK;
    const float *src = x;
    if (*nl != n) {
        if ((st = op->gather_rows(be, x, ids, *nl, E, tmp, err))) return st;
        src = tmp;
    }
    return op->rmsnorm(be, src, out_norm, *nl, E, eps, out, err);
}

/* Output logit soft-capping of logits[nl][width], where the model has it. */
static tandem_status final_softcap(const tdm_model *m, tdm_backend *be, float *logits, int32_t nl, int32_t width,
                                   tdm_err *err) {
    if (m->hp.final_softcap <= 0) return TANDEM_OK;
    return be->ops->softcap(be, logits, nl, width, m->hp.final_softcap, err);
}

static tandem_status argmax_rows(tdm_backend *be, tdm_fwd_scratch *s, const float *logits, int32_t nl, int32_t width,
                                 int32_t *ids, tdm_err *err);

/* The nl normed rows in s->xb through a head over part of the vocabulary (s->vhead):
 * its logits (the quantised copy's for TDM_FWD_LOGITS_APPROX where it has one),
 * soft-capped where the model says, placed into logits[nl][n_vocab] with
 * TDM_LOGIT_NONE for every other token; for TDM_FWD_ARGMAX only ids, the argmax of
 * those rows (the lowest id of a tie, as over the whole row: the head's ids ascend),
 * found among the head's own logits (from the quantised copy's bounds when it has
 * one) and mapped to token ids. */
static tandem_status subset_head(const tdm_model *m, tdm_backend *be, tdm_fwd_scratch *s, tdm_fwd_kind kind,
                                 float *logits, int32_t nl, int32_t *ids, tdm_err *err) {
    const tdm_vocab_head *h = s->vhead;
    const tdm_backend_ops *op = be->ops;
    tandem_status st;
    if (m->tp || h->n_vocab != m->hp.n_vocab || h->w.cols != m->hp.n_embd)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "forward: the head over part of the vocabulary does not fit "
                          "model '%s'", tdm_model_label(m));
    if (!op->scatter_cols)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "forward: backend %s has no scatter_cols op", op->name);
    const bool q = h->has_qhead && be->int8_dot;
    if (kind == TDM_FWD_ARGMAX && q && m->hp.final_softcap <= 0) {
        const int32_t step = s->mm_rows > 0 ? s->mm_rows : nl;
        for (int32_t i = 0; i < nl; i += step)
            if ((st = op->head_argmax(be, &h->w, &h->qh, s->xb + (size_t)i * m->hp.n_embd, TDM_MIN(step, nl - i), NULL,
                                      ids + i, err)))
                return st;
    } else {
        if (nl > s->cap_sub) {
            if (s->sub_logits) op->free(be, s->sub_logits);
            s->sub_logits = NULL;
            s->cap_sub = 0;
            void *p;
            if ((st = op->alloc(be, (size_t)nl * (size_t)h->n * sizeof(float), &p, err))) return st;
            s->sub_logits = p;
            s->cap_sub = nl;
        }
        float *sub = s->sub_logits;
        st = kind == TDM_FWD_LOGITS_APPROX && q ? op->qhead_logits(be, &h->qh, s->xb, nl, sub, err)
                                                : tdm_fwd_matmul(be, s, &h->w, s->xb, nl, sub, false, err);
        if (st || (st = final_softcap(m, be, sub, nl, h->n, err))) return st;
        if (kind != TDM_FWD_ARGMAX)
            return op->scatter_cols(be, sub, nl, h->n, h->ids_dev, h->n_vocab, TDM_LOGIT_NONE, logits, err);
        if ((st = argmax_rows(be, s, sub, nl, h->n, ids, err))) return st;
    }
    for (int32_t i = 0; i < nl; i++)
        if (ids[i] >= 0) ids[i] = h->ids[ids[i]];
    return TANDEM_OK;
}

tandem_status tdm_model_forward_dev(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                                    const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, const int32_t *tok_dev,
                                    float *logits, int32_t *ids_dev, float *top_dev, tdm_err *err) {
    const tdm_backend_ops *op = be->ops;
    if ((ids_dev && !op->argmax_dev) || !logits)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "forward: backend %s keeps no argmax on the device", op->name);
    if (m->tp_size > 0)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "forward: a split model (tensor parallel) keeps no argmax on the "
                                                       "device (it cannot be the draft)");
    int32_t nl;
    tandem_status st = forward_trunk(m, be, kv, batch, seqs, s, tok_dev, &nl, err);
    if (st || nl == 0) return st;
    if (s->vhead) {
        if ((st = subset_head(m, be, s, TDM_FWD_LOGITS, logits, nl, NULL, err))) return st;
    } else {
        if ((st = tdm_fwd_matmul(be, s, &m->output, s->xb, nl, logits, false, err))) return st;
        if ((st = final_softcap(m, be, logits, nl, m->hp.n_vocab, err))) return st;
    }
    return ids_dev ? op->argmax_dev(be, logits, nl, m->hp.n_vocab, ids_dev, top_dev, err) : TANDEM_OK;
}

static tandem_status forward_tail(const tdm_model *m, tdm_backend *be, tdm_fwd_scratch *s, tdm_fwd_kind kind,
                                  float *logits, int32_t nl, const uint32_t *const *masks, int32_t *ids, tdm_err *err);

tandem_status tdm_model_forward_ex(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv,
                                   const tdm_batch *batch, const tdm_kv_seq *const *seqs,
                                   tdm_fwd_scratch *s, tdm_fwd_kind kind, float *logits, int32_t *ids,
                                   tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    const tdm_backend_ops *op = be->ops;
    int32_t nl;
    tandem_status st;
    if (kind == TDM_FWD_ARGMAX && !ids) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "forward: NULL ids");
    if (s->vhead) {
        if ((st = forward_trunk(m, be, kv, batch, seqs, s, NULL, &nl, err)) || nl == 0) return st;
        if (kind == TDM_FWD_ARGMAX && batch->logit_masks)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "forward: a head over part of the vocabulary takes no masks");
        return subset_head(m, be, s, kind, logits, nl, ids, err);
    }
    if (m->tp && s->n_feat > 0)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "forward: a split model (tensor parallel) exports no features");
    if (m->tp) { /* a split model: every rank's part of the logits gathered (no quantised head) */
        if ((st = tdm_tp_forward(m, be, kv, batch, seqs, s, logits, &nl, err)) || nl == 0) return st;
        return forward_tail(m, be, s, kind, logits, nl, batch->logit_masks, ids, err);
    }
    st = forward_trunk(m, be, kv, batch, seqs, s, NULL, &nl, err);
    if (st || nl == 0) return st;
    bool q = m->has_qhead && be->int8_dot;
    /* (soft-capped logits: the argmax of the capped values, which f32 rounding can tie
     * where the raw ones differ, so the exact logits are computed) */
    if (kind == TDM_FWD_ARGMAX && q && hp->final_softcap <= 0) {
        const int32_t step = s->mm_rows > 0 ? s->mm_rows : nl;
        for (int32_t i = 0; i < nl; i += step)
            if ((st = op->head_argmax(be, &m->output, &m->qhead, s->xb + (size_t)i * hp->n_embd, TDM_MIN(step, nl - i),
                                      batch->logit_masks ? batch->logit_masks + i : NULL, ids + i, err)))
                return st;
        return TANDEM_OK;
    }
    if (kind == TDM_FWD_LOGITS_APPROX && q) {
        if ((st = op->qhead_logits(be, &m->qhead, s->xb, nl, logits, err))) return st;
        return final_softcap(m, be, logits, nl, hp->n_vocab, err);
    }
    if ((st = tdm_fwd_matmul(be, s, &m->output, s->xb, nl, logits, false, err))) return st;
    return forward_tail(m, be, s, kind, logits, nl, batch->logit_masks, ids, err);
}

/* After the exact logits: the final soft-cap, and for TDM_FWD_ARGMAX the ids. */
static tandem_status forward_tail(const tdm_model *m, tdm_backend *be, tdm_fwd_scratch *s, tdm_fwd_kind kind,
                                  float *logits, int32_t nl, const uint32_t *const *masks, int32_t *ids, tdm_err *err) {
    tandem_status st;
    if ((st = final_softcap(m, be, logits, nl, m->hp.n_vocab, err))) return st;
    if (kind != TDM_FWD_ARGMAX) return TANDEM_OK;
    if (!masks) return argmax_rows(be, s, logits, nl, m->hp.n_vocab, ids, err);
    /* masked rows (a grammar's): the best allowed token of each, read where the
     * logits are (host memory) */
    if (!be->host_memory)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "forward: backend %s takes no masks with an argmax", be->ops->name);
    const int32_t V = m->hp.n_vocab;
    for (int32_t i = 0; i < nl; i++) {
        const float *l = logits + (size_t)i * (size_t)V;
        ids[i] = masks[i] ? tdm_argmax_masked(l, V, masks[i]) : tdm_argmax_finite(l, V);
    }
    return TANDEM_OK;
}

/* ids[i] = tdm_argmax_finite of row i of logits[nl][width] (backend memory): -1 for a
 * row with a non-finite logit. */
static tandem_status argmax_rows(tdm_backend *be, tdm_fwd_scratch *s, const float *logits, int32_t nl, int32_t width,
                                 int32_t *ids, tdm_err *err) {
    const tdm_backend_ops *op = be->ops;
    tandem_status st;
    /* only the ids come back */
    if (op->argmax) return op->argmax(be, logits, nl, width, ids, err);
    const size_t V = (size_t)width;
    const float *hl = logits;
    if (!be->host_memory) { /* the argmax reads a host copy */
        if ((size_t)nl * V > s->cap_host) {
            float *nh = tdm_mallocarray((size_t)nl * V, sizeof(float));
            if (!nh) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
            free(s->host_logits);
            s->host_logits = nh;
            s->cap_host = (size_t)nl * V;
        }
        if ((st = op->download(be, s->host_logits, logits, (size_t)nl * V * sizeof(float), err))) return st;
        hl = s->host_logits;
    }
    for (int32_t i = 0; i < nl; i++) ids[i] = tdm_argmax_finite(hl + (size_t)i * V, width);
    return TANDEM_OK;
}
