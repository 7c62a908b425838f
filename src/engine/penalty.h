/* penalty.h - a request's logit edits: presence / frequency / repetition penalties,
 * logit_bias and min_tokens (tandem_generate_params), as per-row sparse edit lists
 * (tdm_logit_edit, src/base/logit_edit.h).
 *
 * The one rule, as for grammar masks (constrain.h): every target logits row of the
 * sequence is edited before its draw, verification row d of a chain with the counts
 * of the committed text plus the chain's first d tokens, so that what the target
 * keeps is what it would draw alone, speculated or not.  Host rows are edited in
 * place, device rows by the backend's edit_rows op (tdm_engine_mask_rows).  The
 * draft's rows are edited the same way on the host (draft/chain.c), for acceptance
 * only.  A token tree's rows are edited alike, each with the counts of the
 * committed text plus its own path (tdm_penalty_tree_rows).  The counts follow the committed tokens only
 * (tdm_penalty_commit); a preemption keeps them. */
#ifndef TDM_PENALTY_H
#define TDM_PENALTY_H

#include "engine.h"
#include "logit_edit.h"

#define TDM_PEN_ROWS (TDM_MAX(TANDEM_SPEC_K_MAX, TDM_TREE_MAX_NODES) + 1) /* a verified chain's or tree's rows at most */

typedef struct tdm_penalty {
    float presence, frequency, repetition;
    int32_t min_tokens;
    int32_t n_vocab;
    int32_t *count;          /* [n_vocab] occurrences in the generated text */
    int32_t *extra;          /* [n_vocab] scratch: occurrences in a chain's prefix (zero between calls) */
    uint8_t *flag;           /* [n_vocab] TDM_PEN_* bits */
    float *bias;             /* [n_vocab] logit_bias (NULL without one) */
    int32_t *biased;         /* [n_bias] the biased tokens */
    int32_t n_bias;
    int32_t *seen;           /* [n_vocab], n_seen used: tokens a penalty applies to (generated; with the
                                repetition penalty also the prompt's), each once */
    int32_t n_seen;
    const int32_t *eog;      /* [n_eog] the tokenizer's end-of-generation tokens */
    int32_t n_eog;
    tdm_logit_edit *edits;   /* [cap_edits] a step's rows' edits, row d: [off[d], off[d + 1]) */
    int32_t cap_edits;
    int32_t off[TDM_PEN_ROWS + 1];
} tdm_penalty;

/* s->pen from the request's parameters (NULL when none is on); bad values are
 * TANDEM_ERR_INVALID_ARG naming the field. */
tandem_status tdm_penalty_init(tdm_engine *e, tdm_seq *s, const tandem_generate_params *gp, tdm_err *err);
void tdm_penalty_free(tdm_seq *s);
/* The edits of rows d = 0..k (row d after the committed text and draft[0..d)). */
tandem_status tdm_penalty_rows(tdm_seq *s, const int32_t *draft, int32_t k, tdm_err *err);
/* The edits of a verified token tree's rows (n nodes, parents before children: node
 * i's token token[i], its parent parent[i], -1 = the root; n + 1 <= TDM_PEN_ROWS):
 * row 0 after the committed text, row 1 + i after it and node i's path (its
 * ancestors' tokens and its own), each with those counts (min_tokens: the path's
 * length). */
tandem_status tdm_penalty_tree_rows(tdm_seq *s, const int32_t *token, const int32_t *parent, int32_t n, tdm_err *err);
static inline const tdm_logit_edit *tdm_penalty_row(const tdm_seq *s, int32_t d, int32_t *n) {
    *n = s->pen->off[d + 1] - s->pen->off[d];
    return s->pen->edits + s->pen->off[d];
}
/* Drafting: the draft's host logits row l of chain slot d edited as the target's row
 * d will be (after the committed text and draft[0..d)), so that the draft proposes
 * from the penalised distribution too (acceptance; the verification does not depend
 * on it).  Overwrites the step's row edits (tdm_penalty_rows rebuilds them). */
tandem_status tdm_penalty_draft_row(tdm_seq *s, const int32_t *draft, int32_t d, float *l, tdm_err *err);
/* A committed token counted. */
void tdm_penalty_commit(tdm_seq *s, int32_t token);

#endif
