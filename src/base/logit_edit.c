/* logit_edit.c - per-row logit edits and row summaries (logit_edit.h). */
#include "logit_edit.h"

#include <math.h>

#include "sampling.h"

bool tdm_logits_edit_rows(float *x, int32_t n, int32_t dim, const tdm_logit_edit *edits, const int32_t *off) {
    for (int32_t i = 0; i < n; i++) {
        float *row = x + (size_t)i * (size_t)dim;
        for (int32_t j = off[i]; j < off[i + 1]; j++) {
            const tdm_logit_edit *ed = &edits[j];
            if (ed->id < 0 || ed->id >= dim) return false;
            row[ed->id] = tdm_logit_edit_apply(ed, row[ed->id]);
        }
    }
    return true;
}

void tdm_logits_row_top(const float *x, int32_t dim, int32_t k, tdm_row_top *out) {
    if (k > TDM_ROW_TOP_MAX) k = TDM_ROW_TOP_MAX;
    if (k > dim) k = dim;
    if (k < 0) k = 0;
    out->k = k;
    float m = -INFINITY;
    for (int32_t v = 0; v < dim; v++)
        if (x[v] > m) m = x[v];
    /* sum exp(x - m) in one vectorised pass (tdm_top_prob: 1 / that sum, the sum in
     * double, the float result within 1e-7 relative) */
    const float top = tdm_top_prob(x, dim);
    out->lse = top > 0 ? (double)m - log((double)top) : (double)m;
    /* the k largest by insertion into a sorted list (ties: the lower id, seen first, stays ahead) */
    int32_t have = 0;
    for (int32_t v = 0; v < dim && k > 0; v++) {
        const float xv = x[v];
        if (have == k && !(xv > out->val[k - 1])) continue;
        int32_t at = have < k ? have++ : k - 1;
        while (at > 0 && xv > out->val[at - 1]) {
            out->val[at] = out->val[at - 1];
            out->ids[at] = out->ids[at - 1];
            at--;
        }
        out->val[at] = xv;
        out->ids[at] = v;
    }
}
