/* batch.c - token-row batches for one forward pass. */
#include "batch.h"

#include <stdlib.h>
#include <string.h>

tandem_status tdm_batch_init(tdm_batch *b, int32_t cap, tdm_err *err) {
    memset(b, 0, sizeof *b);
    if (cap <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "batch capacity %d", (int)cap);
    b->cap = cap;
    b->token = tdm_calloc((size_t)cap, sizeof(int32_t));
    b->pos = tdm_calloc((size_t)cap, sizeof(int32_t));
    b->seq = tdm_calloc((size_t)cap, sizeof(int32_t));
    b->slot = tdm_calloc((size_t)cap, sizeof(int32_t));
    b->n_visible = tdm_calloc((size_t)cap, sizeof(int32_t));
    b->want_logits = tdm_calloc((size_t)cap, 1);
    b->tree_mask = tdm_calloc((size_t)cap, sizeof(uint64_t));
    if (!b->token || !b->pos || !b->seq || !b->slot || !b->n_visible || !b->want_logits || !b->tree_mask) {
        tdm_batch_free(b);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory for a batch of %d rows", (int)cap);
    }
    return TANDEM_OK;
}

void tdm_batch_free(tdm_batch *b) {
    if (!b) return;
    free(b->token);
    free(b->pos);
    free(b->seq);
    free(b->slot);
    free(b->n_visible);
    free(b->extra_off);
    free(b->extra_slot);
    free(b->want_logits);
    free(b->tree_mask);
    memset(b, 0, sizeof *b);
}

void tdm_batch_clear(tdm_batch *b) {
    b->n_rows = 0;
    b->rows_shared = false;
    b->tree_mask_dev = NULL;
    b->tree = false;
    b->logit_masks = NULL;
}

int32_t tdm_batch_add(tdm_batch *b, int32_t token, int32_t pos, int32_t seq, int32_t slot,
                      bool want_logits) {
    if (b->n_rows >= b->cap) return -1;
    int32_t i = b->n_rows++;
    b->token[i] = token;
    b->pos[i] = pos;
    b->seq[i] = seq;
    b->slot[i] = slot;
    b->n_visible[i] = slot + 1;
    b->want_logits[i] = want_logits ? 1 : 0;
    if (b->tree_mask) b->tree_mask[i] = 0;
    return i;
}

int32_t tdm_batch_add_tree(tdm_batch *b, int32_t token, int32_t pos, int32_t seq, int32_t slot, int32_t prefix,
                           uint64_t mask, bool want_logits) {
    if (!b->tree_mask) return -1;
    int32_t i = tdm_batch_add(b, token, pos, seq, slot, want_logits);
    if (i < 0) return -1;
    b->n_visible[i] = prefix;
    b->tree_mask[i] = mask;
    b->tree |= mask != 0;
    return i;
}

int32_t tdm_batch_n_logits(const tdm_batch *b) {
    int32_t n = 0;
    for (int32_t i = 0; i < b->n_rows; i++) n += b->want_logits[i] != 0;
    return n;
}
