/* tp.h - tensor parallelism (Megatron style): one model split across n ranks.
 *
 * Rank r holds, of every block, the query heads [r H/n, (r + 1) H/n) and the KV
 * heads [r G/n, (r + 1) G/n) (wqkv's rows of both and their biases; wo's columns
 * of those query heads), and the FFN features [r F/n, (r + 1) F/n) (w13's gate and
 * up rows, w2's columns); the output head's vocabulary rows [vocab0, vocab0 + Vr)
 * (the vocabulary in n near-equal contiguous parts); norms and the token embedding
 * whole.  Its KV cache holds its KV heads of every block: one block table per
 * sequence for all ranks (and the draft), each rank its own K/V storage.
 *
 * A rank is a tdm_model whose hp is the rank's shape (its heads, KV heads and FFN
 * features; hp.n_vocab stays the whole vocabulary) and whose hp_full is the whole
 * model's.  Rank 0 is the model the engine sees: its `tp` group holds the other
 * ranks, their backends and the collective (kernels/collective.h).  The forward
 * (src/model/forward_tp.c) runs every op on every rank with the rank's weights, sums the
 * attention's and the FFN's output projections over the ranks (two all-reduces per
 * block), and gathers the logits into rank 0's buffer once per forward; everything
 * after the logits (sampling, speculation) is rank 0's, unchanged.
 *
 * Shapes that do not divide are an error at load naming them: heads, KV heads and
 * FFN features by n, and the columns a rank gets of a quantised wo / w2 by the
 * type's block.  A degree of 1 runs the same code (one rank, all-reduces that do
 * nothing), so one device tests the path. */
#ifndef TDM_TP_H
#define TDM_TP_H

#include "collective.h"
#include "model.h"

typedef struct tdm_tp_group {
    int32_t n;                      /* ranks */
    tdm_model *rank[TDM_TP_MAX];    /* [n]; rank[0] owns the group */
    tdm_backend *be[TDM_TP_MAX];    /* [n] where each rank's weights are: for host-memory
                                       backends the ranks compute on the engine's backend,
                                       else each on its own */
    bool owns_be;                   /* be[1 .. n) are destroyed with the group */
    tdm_collective *coll;           /* owned */
} tdm_tp_group;

/* Checks that hp splits n ways (n in [1, TDM_TP_MAX]: heads, KV heads, FFN
 * features), else TANDEM_ERR_INVALID_ARG naming what does not divide. */
tandem_status tdm_tp_check(const tdm_hparams *hp, int32_t n, tdm_err *err);
/* Rank r's vocabulary part of n: [*v0, *v0 + *nv). */
void tdm_tp_vocab_part(int32_t n_vocab, int32_t n, int32_t r, int32_t *v0, int32_t *nv);

/* Loads the model at path split n ways: rank r's weights on bes[r] (which may all be
 * one host backend).  The group takes coll (an n-rank collective over those
 * backends; destroyed with it, also on failure) and, when owns_be, bes[1 .. n)
 * (destroyed with it, also on failure); bes[0] stays the caller's, as for
 * tdm_model_load.  *out is rank 0; tdm_model_free on it frees the whole group.  pr
 * (may be NULL) hears of the progress of the whole (each rank its share) and may cancel. */
tandem_status tdm_model_load_tp(const char *path, tdm_backend *const *bes, int32_t n, bool owns_be,
                                tdm_collective *coll, const tdm_load_opts *pr, tdm_model **out, tdm_err *err);

/* The rank's compute backend: its own unless its memory is host memory (then
 * `engine_be`, the engine's). */
static inline tdm_backend *tdm_tp_rank_be(const tdm_tp_group *g, int32_t r, tdm_backend *engine_be) {
    return r == 0 || g->be[r]->host_memory ? engine_be : g->be[r];
}

/* The forward over all ranks (src/model/forward_tp.c): the batch checked, the logits of
 * the rows that want them into rank 0's logits[*n_logits][n_vocab] (before any
 * final soft-cap). */
tandem_status tdm_tp_forward(const tdm_model *m, tdm_backend *be, tdm_kv_store *kv, const tdm_batch *batch,
                             const tdm_kv_seq *const *seqs, tdm_fwd_scratch *s, float *logits, int32_t *n_logits,
                             tdm_err *err);

#endif
