/* model_tp.c - a model split across ranks (tp.h): the shape checks, the
 * vocabulary's parts, and loading every rank's weights. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tp.h"

tandem_status tdm_tp_check(const tdm_hparams *hp, int32_t n, tdm_err *err) {
    const tandem_status bad = TANDEM_ERR_INVALID_ARG;
    if (n < 1 || n > TDM_TP_MAX)
        return tdm_seterr(err, bad, "tensor parallel degree %d is out of range [1, %d]", (int)n, TDM_TP_MAX);
    if (hp->n_expert > 0 && n > 1)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "cannot split the model %d ways: a mixture-of-experts model (%d experts) is not yet split "
                          "between devices",
                          (int)n, (int)hp->n_expert);
    if (hp->n_head % n)
        return tdm_seterr(err, bad, "cannot split the model %d ways: its %d attention heads do not divide by %d", (int)n,
                          (int)hp->n_head, (int)n);
    if (hp->n_head_kv % n)
        return tdm_seterr(err, bad, "cannot split the model %d ways: its %d KV heads do not divide by %d", (int)n,
                          (int)hp->n_head_kv, (int)n);
    if (hp->n_ff % n)
        return tdm_seterr(err, bad, "cannot split the model %d ways: its %d FFN features do not divide by %d", (int)n,
                          (int)hp->n_ff, (int)n);
    if (hp->n_vocab < n)
        return tdm_seterr(err, bad, "cannot split the model %d ways: its vocabulary has %d tokens", (int)n,
                          (int)hp->n_vocab);
    return TANDEM_OK;
}

void tdm_tp_vocab_part(int32_t n_vocab, int32_t n, int32_t r, int32_t *v0, int32_t *nv) {
    const int32_t base = n_vocab / n, extra = n_vocab % n; /* the first `extra` ranks one more */
    *v0 = r * base + TDM_MIN(r, extra);
    *nv = base + (r < extra ? 1 : 0);
}

tandem_status tdm_model_load_tp(const char *path, tdm_backend *const *bes, int32_t n, bool owns_be,
                                tdm_collective *coll, const tdm_load_opts *pr, tdm_model **out, tdm_err *err) {
    *out = NULL;
    tandem_status st = TANDEM_OK;
    if (n < 1 || n > TDM_TP_MAX)
        st = tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tensor parallel degree %d is out of range [1, %d]", (int)n,
                        TDM_TP_MAX);
    else if (!coll || coll->n != n)
        st = tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "a collective of %d ranks for %d", coll ? (int)coll->n : 0, (int)n);
    tdm_tp_group *g = st ? NULL : calloc(1, sizeof *g);
    if (!st && !g) st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    if (st) {
        tdm_collective_destroy(coll);
        for (int32_t r = 1; owns_be && r < n && r < TDM_TP_MAX; r++) tdm_backend_destroy(bes[r]);
        return st;
    }
    g->n = n;
    g->coll = coll;
    g->owns_be = owns_be;
    for (int32_t r = 0; r < n; r++) g->be[r] = bes[r];
    const char *base = strrchr(path, '/');
    for (int32_t r = 0; r < n && !st; r++) {
        tdm_gguf *gg;
        if ((st = tdm_backend_activate(bes[r], err))) break;
        if ((st = tdm_gguf_open(path, &gg, err))) break;
        tdm_load_opts rp = {0}; /* rank r: its share of the whole load */
        if (pr) rp = (tdm_load_opts){pr->fn, pr->user, pr->base + pr->scale * (float)r / (float)n, pr->scale / (float)n, pr->fp8};
        if ((st = tdm_model_load_rank(gg, bes[r], r, n, pr ? &rp : NULL, &g->rank[r], err))) break;
        snprintf(g->rank[r]->file, sizeof g->rank[r]->file, "%s", base ? base + 1 : path);
    }
    tandem_status st0 = tdm_backend_activate(bes[0], st ? NULL : err);
    if (!st) st = st0;
    if (st) {
        if (g->rank[0]) { /* (frees the group with it) */
            g->rank[0]->tp = g;
            tdm_model_free(g->rank[0]);
        } else {
            for (int32_t r = 1; r < n; r++) {
                (void)tdm_backend_activate(g->be[r], NULL);
                tdm_model_free(g->rank[r]);
                if (owns_be) tdm_backend_destroy(g->be[r]);
            }
            tdm_collective_destroy(g->coll);
            free(g);
            (void)tdm_backend_activate(bes[0], NULL);
        }
        return st;
    }
    g->rank[0]->tp = g;
    *out = g->rank[0];
    return TANDEM_OK;
}
