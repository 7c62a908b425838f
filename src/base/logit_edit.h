/* logit_edit.h - per-row edits of logits rows (penalties, logit_bias, min_tokens:
 * src/engine/penalty.h) and the log-probability summary of a row (logprobs): the
 * host references of the backends' edit_rows op and of the engine's logprobs. */
#ifndef TDM_LOGIT_EDIT_H
#define TDM_LOGIT_EDIT_H

#include "common.h"

/* One token's new logit computed from its old one x:
 *   y = x + bias;  y = y > 0 ? y * pos : y * neg;  y = y + add
 * (logit_bias, then the repetition penalty's division / multiplication, then the
 * frequency and presence penalties' subtraction).  pos = neg = 0 with add =
 * TDM_LOGIT_NONE (kernels/backend.h) suppresses the token (min_tokens) and keeps the
 * row finite. */
typedef struct tdm_logit_edit {
    int32_t id;
    float bias, pos, neg, add;
} tdm_logit_edit;

static inline float tdm_logit_edit_apply(const tdm_logit_edit *ed, float x) {
    float y = x + ed->bias;
    y = y > 0 ? y * ed->pos : y * ed->neg;
    return y + ed->add;
}

/* Row i of x[n][dim] gets the edits edits[off[i] .. off[i + 1]) (ids in [0, dim),
 * each at most once a row); returns false, having edited rows before it, at an id
 * out of range.  The reference of the backends' edit_rows op. */
bool tdm_logits_edit_rows(float *x, int32_t n, int32_t dim, const tdm_logit_edit *edits, const int32_t *off);

/* The logprobs summary of one finite logits row: its logsumexp (the sum of the
 * exponentials in double, within 1e-6), and its k <= TDM_ROW_TOP_MAX largest entries
 * (ids, values; decreasing, ties to the lower id). */
#define TDM_ROW_TOP_MAX 20
typedef struct tdm_row_top {
    double lse;
    float want;  /* the backends' row_top op: the logit of the token asked for (0 for none) */
    int32_t k;
    int32_t ids[TDM_ROW_TOP_MAX];
    float val[TDM_ROW_TOP_MAX];
} tdm_row_top;
void tdm_logits_row_top(const float *x, int32_t dim, int32_t k, tdm_row_top *out);

#endif
