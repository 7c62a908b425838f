/* head.c - an EAGLE-3 head as the engine's draft (engine.h, docs/DESIGN.md "EAGLE-3
 * draft heads", phase 2): its buffers, its forward over a draft batch, and the
 * pending feature rows of each sequence.
 *
 * The drafters (draft/chain.c) build the head's batches as they build the draft
 * model's (token p at position p); the head's row for the token at p is its slot
 * p - 1 at RoPE position p - 1 (llama.cpp's "EAGLE3 input convention": slot P holds
 * token P + 1 with the target's feature of position P).  A catch-up row (p - 1 a
 * committed position) is fed fc(feature p - 1), kept pending since the target's
 * forward that computed it; a drafted row (deeper levels) the head's own output h
 * of the sequence's row before it, from the previous head forward.
 *
 * Token trees (tree mode, tdm_engine_head_tree_begin / _end around a tree's levels,
 * draft/tree_draft.c): a node's row is the draft's row one slot lower (draft slot
 * n + d, mask over the draft slots n + j, becomes head slot n - 1 + d with the same
 * mask over head slots n - 1 + j) and is fed its token with the h of its parent's
 * row: every forward's h rows stay in e->h_tree, and each sequence maps its root (the
 * last catch-up row) and its fed nodes to them (tdm_seq.h_node), so a parent fed in
 * any earlier forward of the round (a level split over several) serves.  After the
 * verification only the accepted path's features become pending
 * (tdm_engine_head_keep_path), as a chain's.
 *
 * Pending rows are the target's features of committed positions only: after a
 * verification only the accepted path's rows are kept (tdm_engine_head_keep), so a
 * rejected position never leaves a feature, and the head's own drafted slots are
 * dropped (n_draft cut to the first of them): the next catch-up writes them again
 * with the target's features.  Roll-back is by construction; the KV truncate does
 * the rest.
 *
 * A prefix-cache hit of c positions leaves the head without the feature of position
 * c - 1 (the target never computed it): the sequence never writes that slot, which
 * keeps what the shared block holds (the head's row of the sequence that published
 * it), and only the proposals see it; the output is the target's. */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

static tdm_seq *seq_of(const tdm_kv_seq *kv) { return (tdm_seq *)((char *)kv - offsetof(tdm_seq, kv)); }

static size_t feat_w(const tdm_engine *e) { return 3 * (size_t)e->head->ep.target_hidden; }
static size_t emb_w(const tdm_engine *e) { return (size_t)e->head->ep.n_embd; }

tandem_status tdm_engine_head_init(tdm_engine *e, tdm_err *err) {
    const int32_t cap = e->max_rows + TDM_HEAD_PENDING;
    tandem_status st = tdm_fwd_scratch_set_features(&e->fs_t, e->head->ep.feat_layers, TDM_EAGLE3_N_FEAT, err);
    if (st || (st = tdm_batch_init(&e->hb, cap, err))) return st;
    const size_t sizes[] = {feat_w(e), emb_w(e), emb_w(e), emb_w(e)};
    float **bufs[] = {&e->h_feat, &e->h_g, &e->h_out[0], &e->h_out[1]};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bufs); i++) {
        void *p;
        if ((st = e->be->ops->alloc(e->be, sizes[i] * (size_t)cap * sizeof(float), &p, err))) return st;
        *bufs[i] = p;
    }
    return TANDEM_OK;
}

void tdm_engine_head_free(tdm_engine *e) {
    float *bufs[] = {e->h_feat, e->h_g, e->h_out[0], e->h_out[1], e->h_tree};
    for (size_t i = 0; i < TDM_ARRAY_LEN(bufs); i++)
        if (bufs[i]) e->be->ops->free(e->be, bufs[i]);
    tdm_eagle3_scratch_free(&e->hs);
    tdm_batch_free(&e->hb);
}

/* Tree mode: the h rows of the forward just run (at e->h_tree_n) mapped to their
 * sequences' root and nodes (draft slot n_tokens - 1 + j, j in [0, TDM_TREE_MAX_NODES]);
 * a sequence's map starts empty at its first forward of the round. */
static void tree_rows_out(tdm_engine *e, const tdm_kv_seq *const *seqs) {
    const tdm_batch *hb = &e->hb;
    for (int32_t i = 0; i < hb->n_rows; i++) {
        tdm_seq *s = seq_of(seqs[hb->seq[i]]);
        if (s->h_round != e->h_tree_round) {
            for (size_t j = 0; j < TDM_ARRAY_LEN(s->h_node); j++) s->h_node[j] = -1;
            s->h_round = e->h_tree_round;
        }
        const int32_t j = hb->slot[i] + 1 - (s->n_tokens - 1); /* (the draft's slot: one above the head's) */
        if (j >= 0 && j < (int32_t)TDM_ARRAY_LEN(s->h_node)) s->h_node[j] = e->h_tree_n + i;
    }
    e->h_tree_n += hb->n_rows;
}

/* Tree mode: the row of e->h_tree a drafted row r of b is fed from (its parent's), or
 * -1.  A tree row's parent is its highest ancestor bit besides its own (ancestors are
 * fed before their descendants, so the parent has the highest draft slot), the root
 * (slot n_visible - 1) when it has none; a causal row's is the slot before it. */
static int32_t tree_src(const tdm_engine *e, const tdm_seq *s, const tdm_batch *b, int32_t r) {
    const uint64_t mask = b->tree_mask ? b->tree_mask[r] : 0;
    int32_t parent = b->slot[r] - 1;
    if (mask) {
        const int32_t own = b->slot[r] - b->n_visible[r];
        const uint64_t up = own >= 0 && own < 64 ? mask & ~(1ull << own) : mask;
        parent = up ? b->n_visible[r] + 63 - __builtin_clzll(up) : b->n_visible[r] - 1;
    }
    const int32_t j = parent - (s->n_tokens - 1);
    if (s->h_round != e->h_tree_round || j < 0 || j >= (int32_t)TDM_ARRAY_LEN(s->h_node)) return -1;
    return s->h_node[j];
}

/* Runs the head over e->hb (rows prepared, n of them): rows with feature rows in
 * e->h_feat (has_feat[i]) are fused, the others take the h of src_row[i] of the
 * previous forward (e->h_out[e->h_cur]); then the block, h into the other h_out
 * buffer, which becomes the current one.  Each sequence's h_row / h_pos follow its
 * last row. */
static tandem_status run(tdm_engine *e, const tdm_kv_seq *const *seqs, const bool *has_feat, const int32_t *src_row,
                         bool any_feat, float *logits, tdm_err *err) {
    const tdm_backend_ops *op = e->be->ops;
    const tdm_batch *hb = &e->hb;
    const int32_t n = hb->n_rows;
    const size_t E = emb_w(e);
    tandem_status st;
    if (n == 0) return TANDEM_OK;
    if (e->h_tree_on && e->h_tree_n + n > e->h_tree_cap)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "the head's tree rows are full (%d of %d, %d more)", (int)e->h_tree_n,
                          (int)e->h_tree_cap, (int)n);
    if (any_feat && (st = tdm_eagle3_fuse(e->head, e->be, &e->hs, e->h_feat, n, e->h_g, err))) return st;
    const float *prev = e->h_tree_on ? e->h_tree : e->h_out[e->h_cur];
    for (int32_t i = 0; i < n; i++)
        if (!has_feat[i] &&
            (st = op->copy(e->be, e->h_g + (size_t)i * E, prev + (size_t)src_row[i] * E, E * sizeof(float), err)))
            return st;
    float *out = e->h_tree_on ? e->h_tree + (size_t)e->h_tree_n * E : e->h_out[e->h_cur ^ 1];
    if ((st = tdm_eagle3_forward(e->head, e->be, &e->kv_d, hb, seqs, &e->hs, e->h_g, out, logits, err))) return st;
    e->h_gen++; /* (in tree mode too: no chain drafts from these rows) */
    if (e->h_tree_on) {
        tree_rows_out(e, seqs);
        return TANDEM_OK;
    }
    e->h_cur ^= 1;
    for (int32_t i = 0; i < n; i++) {
        tdm_seq *s = seq_of(seqs[hb->seq[i]]);
        s->h_row = i;
        s->h_pos = hb->pos[i];
        s->h_gen = e->h_gen;
    }
    return TANDEM_OK;
}

tandem_status tdm_engine_head_forward(tdm_engine *e, const tdm_batch *b, const tdm_kv_seq *const *seqs, tdm_err *err) {
    const tdm_backend_ops *op = e->be->ops;
    const size_t F = feat_w(e);
    tdm_batch *hb = &e->hb;
    bool has_feat[TDM_ENGINE_BATCH_LOGITS_MAX + 64];
    int32_t src_row[TDM_ENGINE_BATCH_LOGITS_MAX + 64];
    bool *hf = has_feat;
    int32_t *sr = src_row;
    bool own = false, any_feat = false;
    tandem_status st = TANDEM_OK;
    if (b->n_rows > (int32_t)TDM_ARRAY_LEN(has_feat)) { /* (a long catch-up: bigger scratch) */
        hf = tdm_mallocarray((size_t)b->n_rows, sizeof *hf);
        sr = tdm_mallocarray((size_t)b->n_rows, sizeof *sr);
        own = true;
        if (!hf || !sr) {
            st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    if (b->tree && !e->h_tree_on) {
        st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "an EAGLE-3 head's tree rows outside tree mode");
        goto done;
    }
    tdm_batch_clear(hb);
    for (int32_t r = 0; r < b->n_rows; r++) {
        const int32_t p = b->pos[r], P = p - 1;
        tdm_seq *s = seq_of(seqs[b->seq[r]]);
        if (p == 0) { /* (no slot: the head's first row is the second token's) */
            if (b->want_logits[r]) {
                st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "an EAGLE-3 head cannot draft after the first token alone");
                goto done;
            }
            continue;
        }
        /* (the draft's slot, prefix and mask one slot lower: a tree row's mask bits name
         * the same nodes) */
        const bool tree_row = b->tree_mask && b->tree_mask[r];
        const int32_t i = tree_row ? tdm_batch_add_tree(hb, b->token[r], P, b->seq[r], b->slot[r] - 1, b->n_visible[r] - 1,
                                                        b->tree_mask[r], b->want_logits[r])
                                   : tdm_batch_add(hb, b->token[r], P, b->seq[r], b->slot[r] - 1, b->want_logits[r]);
        if (i < 0) {
            st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "the head's batch is full (%d rows)", (int)hb->cap);
            goto done;
        }
        hb->rows_shared = b->rows_shared;
        hf[i] = P < s->n_tokens - 1; /* (a committed position: its feature is pending) */
        if (hf[i]) {
            if (P < s->feat0 || P >= s->feat0 + s->n_feat) {
                st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "the EAGLE-3 head has no feature of position %d (pending [%d, %d))",
                                (int)P, (int)s->feat0, (int)(s->feat0 + s->n_feat));
                goto done;
            }
            if ((st = op->copy(e->be, e->h_feat + (size_t)i * F, s->feat + (size_t)(P - s->feat0) * F, F * sizeof(float),
                               err)))
                goto done;
            any_feat = true;
        } else if (e->h_tree_on) {
            if ((sr[i] = tree_src(e, s, b, r)) < 0) {
                st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "the EAGLE-3 head has no output of the parent of slot %d",
                                (int)b->slot[r]);
                goto done;
            }
        } else {
            if (s->h_gen != e->h_gen || s->h_pos != P - 1) {
                st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "the EAGLE-3 head has no output of position %d to draft from",
                                (int)(P - 1));
                goto done;
            }
            sr[i] = s->h_row;
        }
    }
    st = run(e, seqs, hf, sr, any_feat, e->out_d, err);
done:
    if (own) {
        free(hf);
        free(sr);
    }
    return st;
}

tandem_status tdm_engine_head_keep(tdm_engine *e, tdm_seq *s, int32_t row, int32_t pos, int32_t n, bool consume,
                                   tdm_err *err) {
    const tdm_backend_ops *op = e->be->ops;
    const size_t F = feat_w(e);
    tandem_status st;
    if (n <= 0) return TANDEM_OK;
    if (!s->feat) {
        void *p;
        if ((st = op->alloc(e->be, (size_t)TDM_HEAD_PENDING * F * sizeof(float), &p, err))) return st;
        s->feat = p;
        s->feat0 = s->n_feat = 0;
    }
    /* the head's valid slots [0, h_n): none of the drafted ones (>= pos) */
    int32_t h_n = TDM_MIN(TDM_MAX(s->n_draft - 1, 0), pos);
    /* pending before: [h_n, pos) from the store; where it does not hold them (a
     * preempted sequence's restart, a prefix-cache hit's first chunk) they are skipped */
    if (h_n < s->feat0 || pos > s->feat0 + s->n_feat) h_n = pos, s->feat0 = pos, s->n_feat = 0;
    const int32_t old = pos - h_n, keep_from = h_n - s->feat0;
    const float *feat_t = e->fs_t.feat + (size_t)row * F; /* (the target's rows) */
    if (!consume && old + n <= TDM_HEAD_PENDING) { /* pending [h_n, pos + n) */
        for (int32_t i = 0; i < old && keep_from > 0; i++) /* (to the front, row by row: they may overlap) */
            if ((st = op->copy(e->be, s->feat + (size_t)i * F, s->feat + (size_t)(keep_from + i) * F, F * sizeof(float), err)))
                return st;
        if ((st = op->copy(e->be, s->feat + (size_t)old * F, feat_t, (size_t)n * F * sizeof(float), err))) return st;
        s->feat0 = h_n;
        s->n_feat = old + n;
        s->n_draft = h_n + 1;
        return TANDEM_OK;
    }
    /* the head consumes slots [h_n, pos + n - 1): token P + 1 with feature P */
    const int32_t m = old + n - 1;
    const tdm_kv_seq *seqs[1] = {&s->kv};
    tdm_batch *hb = &e->hb;
    bool *hf = tdm_mallocarray((size_t)TDM_MAX(m, 1), sizeof *hf);
    if (!hf) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    tdm_batch_clear(hb);
    for (int32_t i = 0; i < m; i++) {
        const int32_t P = h_n + i;
        hf[i] = true;
        tdm_batch_add(hb, s->tokens[P + 1], P, 0, P, false);
    }
    hb->rows_shared = true;
    st = TANDEM_OK;
    if (old > 0) st = op->copy(e->be, e->h_feat, s->feat + (size_t)keep_from * F, (size_t)old * F * sizeof(float), err);
    if (!st && n > 1) st = op->copy(e->be, e->h_feat + (size_t)old * F, feat_t, (size_t)(n - 1) * F * sizeof(float), err);
    if (!st) st = run(e, seqs, hf, NULL, m > 0, NULL, err);
    free(hf);
    if (st) return st;
    /* the last row stays pending */
    if ((st = op->copy(e->be, s->feat, feat_t + (size_t)(n - 1) * F, F * sizeof(float), err))) return st;
    s->feat0 = pos + n - 1;
    s->n_feat = 1;
    s->n_draft = pos + n;
    return TANDEM_OK;
}

tandem_status tdm_engine_head_tree_begin(tdm_engine *e, int32_t rows, tdm_err *err) {
    if (rows > e->h_tree_cap) { /* (grown, never shrunk: the largest round so far) */
        const int32_t cap = TDM_MAX(rows, 2 * e->h_tree_cap);
        void *p;
        if (e->h_tree) e->be->ops->free(e->be, e->h_tree);
        e->h_tree = NULL, e->h_tree_cap = 0;
        tandem_status st = e->be->ops->alloc(e->be, (size_t)cap * emb_w(e) * sizeof(float), &p, err);
        if (st) return st;
        e->h_tree = p;
        e->h_tree_cap = cap;
    }
    e->h_tree_on = true;
    e->h_tree_n = 0;
    e->h_tree_round++;
    return TANDEM_OK;
}

void tdm_engine_head_tree_end(tdm_engine *e) {
    e->h_tree_on = false;
    e->h_tree_round++; /* (no sequence's map outlives its round) */
}

tandem_status tdm_engine_head_keep_path(tdm_engine *e, tdm_seq *s, int32_t row, int32_t pos, const int32_t *path,
                                        int32_t n, tdm_err *err) {
    const size_t F = feat_w(e);
    float *feat_t = e->fs_t.feat + (size_t)row * F;
    for (int32_t j = 0; j + 1 < n; j++) {
        if (path[j] < j)
            return tdm_seterr(err, TANDEM_ERR_INTERNAL, "a tree path's node %d at depth %d", (int)path[j], (int)j);
        tandem_status st;
        if (path[j] != j && (st = e->be->ops->copy(e->be, feat_t + (size_t)(1 + j) * F, feat_t + (size_t)(1 + path[j]) * F,
                                                   F * sizeof(float), err)))
            return st;
    }
    return tdm_engine_head_keep(e, s, row, pos, n, false, err);
}
