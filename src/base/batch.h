/* batch.h - a flat list of token rows for one forward pass of one model.
 *
 * A plain decode step, a prefill chunk, a verification chain and (later) a
 * verification tree are all batches.  Each row names its sequence, its token, its
 * RoPE position, the KV slot (logical position in the sequence's block table)
 * where its K/V are written, and what it may attend to:
 *   - slots [0, n_visible) of its sequence (for prefill/decode/chains: slot + 1), and
 *   - optionally extra slots listed in CSR form.  extra_off == NULL means no row
 *     has extra slots;
 *   - a token tree's rows (tdm_batch_add_tree): slots n_visible + j for every bit j
 *     of the row's tree_mask, a compact ancestor bitset over the tree's nodes, which
 *     occupy slots n_visible .. n_visible + 63 after the committed prefix (node i
 *     at slot n_visible + i, its RoPE position n_visible + its depth).  A row has
 *     CSR extras or a tree mask, never both.
 * The forward first writes every row's K/V into its slot, then runs attention, so
 * rows of one sequence see each other exactly through these visible sets.
 */
#ifndef TDM_BATCH_H
#define TDM_BATCH_H

#include <stdint.h>

#include "common.h"

typedef struct tdm_batch {
    int32_t n_rows;
    int32_t cap;           /* allocated rows */
    int32_t *token;        /* [n_rows] token id */
    int32_t *pos;          /* [n_rows] RoPE position */
    int32_t *seq;          /* [n_rows] index into the seqs array given with the batch */
    int32_t *slot;         /* [n_rows] KV slot to write (< the seq's reserved length) */
    int32_t *n_visible;    /* [n_rows] attends to slots [0, n_visible) of its sequence */
    int32_t *extra_off;    /* [n_rows + 1] CSR offsets into extra_slot, or NULL */
    int32_t *extra_slot;   /* extra visible slots (each >= n_visible of its row) */
    uint64_t *tree_mask;   /* [n_rows] bit j: the row also sees slot n_visible + j (0: none) */
    bool tree;             /* some row has a nonzero tree_mask (set by tdm_batch_add_tree,
                              cleared by tdm_batch_clear); backends without tree attention
                              refuse such a batch */
    uint8_t *want_logits;  /* [n_rows] 1 = compute logits for this row */
    int32_t n_extra_cap;
    bool rows_shared;      /* the rows need not be computed as each would be alone: the
                              backend may choose its products by speed (cleared by
                              tdm_batch_clear) */
    const uint64_t *tree_mask_dev; /* NULL, or [n_rows] the rows' tree masks in backend
                              memory, written by earlier queued work (a token tree grown
                              on the device, kernels/dtree.h); tree_mask then holds
                              stand-ins with the same bit count and highest bit (what the
                              host checks and plans by).  Only a backend's fused blocks
                              read them; a forward that cannot fails (cleared by
                              tdm_batch_clear) */
    const uint32_t *const *logit_masks; /* NULL, or [rows with want_logits] in row order: a
                              host mask of the vocabulary per logits row (NULL: that row
                              unmasked; a grammar's allowed tokens), honoured by a forward
                              of kind TDM_FWD_ARGMAX, whose ids are then the best allowed
                              tokens (cleared by tdm_batch_clear) */
} tdm_batch;

tandem_status tdm_batch_init(tdm_batch *b, int32_t cap, tdm_err *err);
void tdm_batch_free(tdm_batch *b);
void tdm_batch_clear(tdm_batch *b);
/* Appends a causal row (n_visible = slot + 1, no extras).  Returns the row index or
 * -1 when full. */
int32_t tdm_batch_add(tdm_batch *b, int32_t token, int32_t pos, int32_t seq, int32_t slot,
                      bool want_logits);
/* Most tree nodes a tree mask addresses. */
#define TDM_TREE_MAX_NODES 64
/* Appends a token-tree row: KV slot `slot`, RoPE position pos, sees slots [0,
 * prefix) and the slots prefix + j of the bits j of mask (mask != 0; its own slot
 * prefix + i among them).  Returns the row index or -1 when full. */
int32_t tdm_batch_add_tree(tdm_batch *b, int32_t token, int32_t pos, int32_t seq, int32_t slot, int32_t prefix,
                           uint64_t mask, bool want_logits);
/* Number of rows with want_logits set. */
int32_t tdm_batch_n_logits(const tdm_batch *b);

#endif
