/* vocab_head.h - an output head over part of the vocabulary: a draft model's logits
 * computed for a chosen set of tokens only (FR-Spec's frequent subset; EAGLE-3's
 * d2t table maps its draft head's rows the same way).
 *
 * The head's rows are copies of the model's own output rows (of token_embd when the
 * output is tied) for the chosen ids, in the file's type, so its logits on those
 * ids are the whole head's; the forward (forward.c) places them into
 * whole-vocabulary rows with the backend's scatter_cols op, TDM_LOGIT_NONE elsewhere,
 * so everything that reads a draft's logits is unchanged.  The target always scores
 * every token, so a subset changes the proposals, never the output.
 */
#ifndef TDM_VOCAB_HEAD_H
#define TDM_VOCAB_HEAD_H

#include "model.h"

typedef struct tdm_vocab_head {
    int32_t n;              /* rows: the tokens the head scores */
    int32_t n_vocab;        /* the whole vocabulary: the width of the logits rows */
    int32_t *ids;           /* [n] host: the token id of row j, ascending */
    const int32_t *ids_dev; /* [n] the same in backend memory */
    tdm_weight w;           /* [n][n_embd] those rows of the model's output head, of its type */
    tdm_qhead qh;           /* w's row-quantised copy, when has_qhead (where the model's
                               whole head has one: model.c, load_qhead) */
    bool has_qhead;
    tdm_backend *be;        /* the model's backend, where buf lives */
    void *buf[3];           /* owned backend memory: w's rows, ids_dev, the quantised copy */
} tdm_vocab_head;

/* The ids of a subset of n tokens for a vocabulary of n_vocab (n in [1, n_vocab]):
 * [0, n) in id order (a byte-level BPE vocabulary's ids follow its merges, which
 * roughly follow frequency), plus every special token of tok (control and
 * user-defined, tdm_tok_is_special) and its end-of-generation ids, so that a draft
 * can propose stopping; ascending, without repeats.  *ids is malloc'ed (free()),
 * *n_ids its count (n plus the specials at or above n).  TANDEM_ERR_INVALID_ARG for an
 * n outside [1, n_vocab]. */
tandem_status tdm_vocab_subset_ids(const tdm_tokenizer *tok, int32_t n_vocab, int32_t n, int32_t **ids,
                                   int32_t *n_ids, tdm_err *err);

/* h = the head of model m (whole, not split) over ids[n] (ascending, in [0, n_vocab);
 * else TANDEM_ERR_INVALID_ARG), its rows gathered from the model's file into m's
 * backend.  TANDEM_ERR_UNSUPPORTED when the backend has no scatter_cols op.  h is
 * zeroed first; on failure it holds nothing. */
tandem_status tdm_vocab_head_init(tdm_vocab_head *h, const tdm_model *m, const int32_t *ids, int32_t n, tdm_err *err);
/* Frees h's memory and zeroes it (a zeroed h is a no-op). */
void tdm_vocab_head_free(tdm_vocab_head *h);

#endif
