/* spec_ws.c - the speculation workspace (spec_ws.h). */
#include "spec_ws.h"

#include <float.h>
#include <stdlib.h>

static tandem_status nomem(tdm_err *err) { return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory"); }

tandem_status tdm_spec_ws_create(tdm_engine *e, const tdm_spec_ws_opts *opts, tdm_spec_ws **out, tdm_err *err) {
    static const tdm_spec_ws_opts none = {0};
    if (!opts) opts = &none;
    *out = NULL;
    if (!e->draft) return tdm_seterr(err, TANDEM_ERR_INTERNAL, "a speculation workspace needs a draft model");
    if (opts->lookup_cands < 0 || opts->lookup_cands > TDM_LOOKUP_CANDS)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "lookup_cands %d is out of range [0, %d]", (int)opts->lookup_cands,
                          TDM_LOOKUP_CANDS);
    if (opts->lookup_tree_extra < 0 || opts->lookup_tree_extra > TDM_TREE_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "lookup_tree_extra %d is out of range [0, %d]",
                          (int)opts->lookup_tree_extra, TDM_TREE_MAX);
    if (opts->tree_auto_max < 0 || opts->tree_auto_max > TDM_TREE_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree_auto_max %d is out of range [0, %d]",
                          (int)opts->tree_auto_max, TDM_TREE_MAX);
    tdm_spec_ws *ws = tdm_calloc(1, sizeof *ws);
    if (!ws) return nomem(err);
    tdm_backend *be = e->be;
    const tdm_backend_ops *bo = be->ops;
    const size_t V = (size_t)e->n_vocab;
    tandem_status st = TANDEM_OK;
    void *p;
    /* greedy draft chains on the device */
    if (!be->host_memory && bo->argmax_dev && bo->get_rows_dev && !opts->host_chain) {
        if ((st = bo->alloc(be, (2 * TDM_CTRL_MAX_K + TDM_CHAIN_DEV_EXTRA) * sizeof(int32_t), &p, err))) goto fail;
        ws->chain_dev = p;
        const float lowest = -FLT_MAX; /* (finite: argmax_dev reports a row with an infinity) */
        if ((st = bo->upload(be, ws->chain_dev + 2 * TDM_CTRL_MAX_K, &lowest, sizeof lowest, err))) goto fail;
        if ((st = bo->alloc(be, (size_t)TDM_CTRL_MAX_K * (size_t)e->n_logit_rows * sizeof(int32_t), &p, err)))
            goto fail;
        ws->bchain_dev = p;
        if (e->p_dev) { /* (q rows on the device come from device draft chains) */
            if ((st = bo->alloc(be, (size_t)TDM_CTRL_MAX_K * V * sizeof(float), &p, err))) goto fail;
            ws->q_dev = p;
        }
    }
    ws->probs = tdm_calloc((size_t)(TDM_CTRL_MAX_K + 1) * V, sizeof(float));
    ws->qprobs = tdm_calloc((size_t)TDM_CTRL_MAX_K * V, sizeof(float));
    ws->tree_p = tdm_calloc((size_t)(TDM_TREE_MAX + 1) * V, sizeof(float));
    ws->tree_q = tdm_calloc((size_t)(TDM_TREE_MAX + 1) * V, sizeof(float));
    ws->tree_scr = tdm_calloc(2 * V, sizeof(double));
    if (!ws->probs || !ws->qprobs || !ws->tree_p || !ws->tree_q || !ws->tree_scr) {
        st = nomem(err);
        goto fail;
    }
    /* greedy tree levels' candidates on the device */
    if (!be->host_memory && bo->topk && !opts->host_topk) {
        const size_t cells = (size_t)e->n_logit_rows * TDM_TREE_TOPK;
        ws->tree_topk_ids = tdm_calloc(cells, sizeof(int32_t));
        ws->tree_topk_p = tdm_calloc(cells, sizeof(float));
        if (!ws->tree_topk_ids || !ws->tree_topk_p) {
            st = nomem(err);
            goto fail;
        }
        /* a lone sequence's greedy dynamic trees grown on the device, level after
         * level without a wait */
        if (bo->tree_grow && !opts->host_tree) {
            if ((st = bo->alloc(be, sizeof(tdm_dtree), &p, err))) goto fail;
            ws->dtree = p;
            if (!(ws->dtree_h = tdm_calloc(1, sizeof(tdm_dtree)))) {
                st = nomem(err);
                goto fail;
            }
        }
    }
    tdm_len_init(&ws->len);
    ws->opts = *opts;
    if (ws->opts.lookup_cands == 0) ws->opts.lookup_cands = TDM_LOOKUP_CANDS;
    if (ws->opts.tree_auto_max == 0) ws->opts.tree_auto_max = TDM_TREE_MAX;
    *out = ws;
    return TANDEM_OK;
fail:
    tdm_spec_ws_free(e, ws);
    return st;
}

void tdm_spec_ws_free(tdm_engine *e, tdm_spec_ws *ws) {
    if (!ws) return;
    void *dev[] = {ws->chain_dev, ws->bchain_dev, ws->q_dev, ws->dtree};
    for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++)
        if (dev[i]) e->be->ops->free(e->be, dev[i]);
    free(ws->probs);
    free(ws->qprobs);
    free(ws->tree_p);
    free(ws->tree_q);
    free(ws->tree_scr);
    free(ws->tree_topk_ids);
    free(ws->tree_topk_p);
    free(ws->dtree_h);
    free(ws);
}
