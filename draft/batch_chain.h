/* batch_chain.h - draft chains for many sequences of a batch at once, one draft
 * forward per round (batch_chain.c). */
#ifndef TDM_BATCH_CHAIN_H
#define TDM_BATCH_CHAIN_H

#include "batch_ctrl.h"
#include "engine.h"
#include "spec_ws.h"

/* Scratch of tdm_draft_batch, sized by the engine. */
typedef struct tdm_draft_scratch {
    const tdm_kv_seq **kv; /* [n sequences] */
    int32_t *who, *slot;   /* [n_logit_rows] each logits row's sequence and chain index */
    int32_t *tok;          /* [n_logit_rows] the token drawn from it */
    tdm_draw_row *rows;    /* [n_logit_rows] */
} tdm_draft_scratch;

/* Drafts k[i] tokens (0 = none) after seqs[i]'s committed tokens into
 * draft[i * TDM_CTRL_MAX_K + 0 .. k[i]): the draft's argmax for a greedy sequence;
 * for a sampled one the token the draft's processed distribution gives with the
 * uniform the target's token at that position will be drawn with, u[i *
 * (TDM_CTRL_MAX_K + 1) + d] for token d (the coupling sched/step.c commit_match relies
 * on).  Every sequence's blocks must already back positions up to n_tokens + k[i] -
 * 2 (the draft writes its K/V there); n_draft becomes n_tokens + k[i] - 1.
 * *catch_up receives the rows fed for tokens the draft had not seen (before the
 * last committed one of each sequence). */
tandem_status tdm_draft_batch(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *const *seqs, int32_t n, const int32_t *k, const double *u,
                              int32_t *draft, const tdm_draft_scratch *scr, int32_t *catch_up, tdm_err *err);

#endif
