/* draw.c - the tokens of a forward's logits rows for many sequences at once
 * (tdm_engine_draw in engine.h): argmax for greedy rows, a draw with a given
 * uniform for sampled ones, on the host or where the logits are.
 *
 * The uniforms come from the caller, which peeks them from the sequences'
 * generators (tdm_engine_draws) and consumes as many as it keeps: a scheduler step
 * that verifies a drafted chain draws the target's token at every position of the
 * chain with the uniform that position would use without speculation. */
#include "engine.h"

#include <stdlib.h>
#include <string.h>

/* Whether two sequences' rows are drawn alike (every sampler parameter equal). */
static bool same_sampler(const tdm_sampler_params *a, const tdm_sampler_params *b) {
    return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p && a->min_p == b->min_p;
}

/* rows [j, end) that one device call can take: sampled rows of the same sampler
 * parameters (a batch of requests with the same settings: one call, not one a
 * sequence; each row's probabilities and draw are its own whatever shares the
 * call), any greedy rows otherwise */
static int32_t run_end(const tdm_draw_row *rows, int32_t j, int32_t m) {
    const bool sampled = rows[j].s->sp.temperature > 0;
    int32_t end = j + 1;
    while (end < m && (sampled ? rows[end].s == rows[j].s || same_sampler(&rows[end].s->sp, &rows[j].s->sp)
                               : rows[end].s->sp.temperature <= 0))
        end++;
    return end;
}

static tandem_status draw_dev(tdm_engine *e, const float *l, const tdm_draw_row *rows, int32_t m, int32_t *tok,
                              tdm_err *err) {
    const tdm_backend_ops *op = e->be->ops;
    const int32_t V = e->n_vocab;
    int32_t *ids_d = e->draw_dev, *ok_d = e->draw_dev + m;
    double u[TDM_ENGINE_BATCH_LOGITS_MAX];
    tandem_status st = TANDEM_OK;
    for (int32_t j = 0; j < m && !st;) {
        const int32_t end = run_end(rows, j, m), n = end - j;
        const float *lj = l + (size_t)j * (size_t)V;
        if (rows[j].s->sp.temperature > 0) {
            float *pj = e->p_dev + (size_t)j * (size_t)V;
            for (int32_t i = j; i < end; i++) u[i] = rows[i].u;
            st = op->probs_dev(e->be, lj, n, V, &rows[j].s->sp, pj, ok_d + j, err);
            for (int32_t i = 0; i < n && !st; i += TDM_SAMPLE_DEV_MAX_ROWS) /* (its uniforms travel by value) */
                st = op->sample_dev(e->be, pj + (size_t)i * (size_t)V, TDM_MIN(n - i, TDM_SAMPLE_DEV_MAX_ROWS), V,
                                    u + j + i, ids_d + j + i, NULL, err);
        } else {
            st = op->argmax_dev(e->be, lj, n, V, ids_d + j, NULL, err);
        }
        j = end;
    }
    int32_t got[2 * TDM_ENGINE_BATCH_LOGITS_MAX];
    if (!st) st = op->download(e->be, got, e->draw_dev, 2 * (size_t)m * sizeof(int32_t), err);
    for (int32_t j = 0; j < m && !st; j++) tok[j] = rows[j].s->sp.temperature > 0 && !got[m + j] ? -1 : got[j];
    return st;
}

/* A host row's edits, then its mask (a row with non-finite logits is left as it is,
 * for its reader to refuse). */
static void host_row(const tdm_engine *e, float *l, const tdm_draw_row *row) {
    if ((!row->mask && !row->n_edit) || !tdm_logits_finite(l, e->n_vocab)) return;
    if (row->n_edit) {
        const int32_t off[2] = {0, row->n_edit};
        (void)tdm_logits_edit_rows(l, 1, e->n_vocab, row->edit, off); /* (ids checked at submission) */
    }
    if (row->mask) tdm_logits_mask(l, e->n_vocab, row->mask, TDM_LOGIT_NONE);
}

/* The edits of device rows [0, m) in one upload (the rows' offsets, then the edits)
 * and one edit_rows call. */
static tandem_status edit_dev(tdm_engine *e, float *l, const tdm_draw_row *rows, int32_t m, tdm_err *err) {
    const tdm_backend_ops *op = e->be->ops;
    size_t n_ed = 0;
    for (int32_t j = 0; j < m; j++) n_ed += (size_t)rows[j].n_edit;
    if (n_ed == 0) return TANDEM_OK;
    if (!op->edit_rows)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "this backend cannot edit logits rows (penalties, logit_bias, min_tokens)");
    if (n_ed > INT32_MAX / 2) return tdm_seterr(err, TANDEM_ERR_INTERNAL, "%zu logit edits in one step", n_ed);
    const size_t head = ((size_t)(m + 1) * sizeof(int32_t) + 15) / 16 * 16;
    const size_t bytes = head + n_ed * sizeof(tdm_logit_edit);
    if (bytes > e->edit_cap) { /* (grown: both buffers at twice the size) */
        const size_t cap = TDM_MAX(bytes, 2 * e->edit_cap);
        void *h = malloc(cap), *d = NULL;
        tandem_status st = h ? op->alloc(e->be, cap, &d, err) : tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        if (st) {
            free(h);
            return st;
        }
        free(e->edit_host);
        if (e->edit_dev) op->free(e->be, e->edit_dev);
        e->edit_host = h, e->edit_dev = d, e->edit_cap = cap;
    }
    int32_t *off = e->edit_host;
    tdm_logit_edit *ed = (tdm_logit_edit *)((char *)e->edit_host + head);
    off[0] = 0;
    for (int32_t j = 0; j < m; j++) {
        if (rows[j].n_edit) memcpy(ed + off[j], rows[j].edit, (size_t)rows[j].n_edit * sizeof *ed);
        off[j + 1] = off[j] + rows[j].n_edit;
    }
    tandem_status st = op->upload(e->be, e->edit_dev, e->edit_host, bytes, err);
    if (!st)
        st = op->edit_rows(e->be, l, m, e->n_vocab, (const tdm_logit_edit *)((char *)e->edit_dev + head), e->edit_dev, err);
    return st;
}

tandem_status tdm_engine_mask_rows(tdm_engine *e, bool is_draft, const tdm_draw_row *rows, int32_t m, tdm_fwd_kind kind,
                                   tdm_err *err) {
    const size_t V = (size_t)e->n_vocab, W = e->mask_words;
    if (kind == TDM_FWD_LOGITS) { /* (host rows) */
        float *l = is_draft ? e->logits_d : e->logits_t;
        for (int32_t j = 0; j < m; j++) host_row(e, l + (size_t)j * V, &rows[j]);
        return TANDEM_OK;
    }
    if (kind != TDM_FWD_LOGITS_DEV) {
        for (int32_t j = 0; j < m; j++)
            if (rows[j].mask || rows[j].n_edit)
                return tdm_seterr(err, TANDEM_ERR_INTERNAL, "a masked or edited logits row in a forward of kind %d", (int)kind);
        return TANDEM_OK;
    }
    tandem_status st = edit_dev(e, is_draft ? e->out_d : e->out_t, rows, m, err);
    if (st) return st;
    /* each masked row's mask uploaded to its row's place in e->mask_dev (a run of rows
     * whose masks lie one after the other on the host, a sequence's chain, in one
     * upload), applied where the logits are, a run of consecutive masked rows per call */
    const tdm_backend_ops *op = e->be->ops;
    float *l = is_draft ? e->out_d : e->out_t;
    for (int32_t j = 0; j < m && !st;) {
        if (!rows[j].mask) {
            j++;
            continue;
        }
        if (!e->mask_dev || !op->mask_rows)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "this backend cannot mask logits rows (grammar-constrained decoding)");
        int32_t end = j;
        while (end < m && rows[end].mask && !st) {
            int32_t run = end + 1;
            while (run < m && rows[run].mask == rows[run - 1].mask + W) run++;
            st = op->upload(e->be, e->mask_dev + (size_t)end * W, rows[end].mask, (size_t)(run - end) * W * sizeof(uint32_t),
                            err);
            end = run;
        }
        if (!st) st = op->mask_rows(e->be, l + (size_t)j * V, end - j, e->n_vocab, e->mask_dev + (size_t)j * W,
                                    TDM_LOGIT_NONE, err);
        j = end;
    }
    return st;
}

tandem_status tdm_engine_draw(tdm_engine *e, bool is_draft, const tdm_draw_row *rows, int32_t m, tdm_fwd_kind kind,
                              int32_t *tok, tdm_err *err) {
    if (m <= 0) return TANDEM_OK;
    if (m > e->n_logit_rows || m > TDM_ENGINE_BATCH_LOGITS_MAX)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "%d logits rows to draw from, at most %d", (int)m,
                          (int)TDM_MIN(e->n_logit_rows, TDM_ENGINE_BATCH_LOGITS_MAX));
    const size_t V = (size_t)e->n_vocab;
    switch (kind) {
    case TDM_FWD_ARGMAX:
        for (int32_t j = 0; j < m; j++) { /* (a masked row's mask went with the forward: tdm_batch.logit_masks) */
            if ((rows[j].mask && (is_draft || !e->batch.logit_masks || e->batch.logit_masks[j] != rows[j].mask)) ||
                rows[j].n_edit)
                return tdm_seterr(err, TANDEM_ERR_INTERNAL,
                                  "a masked logits row without its mask, or an edited one, in an argmax forward");
            tok[j] = e->ids[j];
        }
        return TANDEM_OK;
    case TDM_FWD_LOGITS_DEV: {
        if (!e->draw_dev) break;
        tandem_status st = tdm_engine_mask_rows(e, is_draft, rows, m, kind, err);
        return st ? st : draw_dev(e, is_draft ? e->out_d : e->out_t, rows, m, tok, err);
    }
    case TDM_FWD_LOGITS: {
        float *logits = is_draft ? e->logits_d : e->logits_t;
        for (int32_t j = 0; j < m; j++) {
            const tdm_seq *q = rows[j].s;
            float *l = logits + (size_t)j * V;
            if ((rows[j].mask || rows[j].n_edit) && !tdm_logits_finite(l, e->n_vocab)) { /* (checked before
                                                                         the mask, which writes finite values) */
                tok[j] = -1;
                continue;
            }
            host_row(e, l, &rows[j]);
            if (q->sp.temperature > 0) {
                tdm_probs_from_logits(l, e->n_vocab, &q->sp, &e->ss, e->tmp);
                tok[j] = tdm_sample_probs_u(e->tmp, e->n_vocab, rows[j].u);
            } else {
                tok[j] = tdm_argmax_finite(l, e->n_vocab);
            }
        }
        return TANDEM_OK;
    }
    default:
        break;
    }
    return tdm_seterr(err, TANDEM_ERR_INTERNAL, "no tokens can be drawn from a forward of kind %d", (int)kind);
}
