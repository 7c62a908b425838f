/* vocab_head.c - an output head over part of the vocabulary (vocab_head.h). */
#include "vocab_head.h"

#include <stdlib.h>
#include <string.h>

#include "qhead.h"

static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

tandem_status tdm_vocab_subset_ids(const tdm_tokenizer *tok, int32_t n_vocab, int32_t n, int32_t **ids,
                                   int32_t *n_ids, tdm_err *err) {
    *ids = NULL;
    *n_ids = 0;
    if (n_vocab <= 0 || n < 1 || n > n_vocab)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "vocabulary subset of %d tokens: out of range [1, %d]", (int)n,
                          (int)n_vocab);
    const int32_t *eog;
    const int32_t n_eog = tdm_tok_eog_ids(tok, &eog);
    const int32_t n_tok = TDM_MIN(tdm_tok_n_vocab(tok), n_vocab);
    int32_t extra = n_eog;
    for (int32_t i = n; i < n_tok; i++) extra += tdm_tok_is_special(tok, i);
    int32_t *out = tdm_mallocarray((size_t)n + (size_t)extra, sizeof *out);
    if (!out) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    int32_t k = 0;
    for (int32_t i = 0; i < n; i++) out[k++] = i;
    for (int32_t i = n; i < n_tok; i++)
        if (tdm_tok_is_special(tok, i)) out[k++] = i;
    for (int32_t i = 0; i < n_eog; i++)
        if (eog[i] >= n && eog[i] < n_vocab) out[k++] = eog[i];
    qsort(out + n, (size_t)(k - n), sizeof *out, cmp_i32);
    int32_t u = n; /* (an end-of-generation id may be special too: once) */
    for (int32_t i = n; i < k; i++)
        if (out[i] != out[u - 1]) out[u++] = out[i];
    *ids = out;
    *n_ids = u;
    return TANDEM_OK;
}

void tdm_vocab_head_free(tdm_vocab_head *h) {
    if (!h) return;
    for (size_t i = 0; i < TDM_ARRAY_LEN(h->buf); i++)
        if (h->buf[i]) h->be->ops->free(h->be, h->buf[i]);
    free(h->ids);
    memset(h, 0, sizeof *h);
}

/* The head's rows in the rows layout (host memory) into backend memory, in the
 * layout the backend asks for where its ops read any layout (as model.c places the
 * whole head). */
static tandem_status place_rows(tdm_vocab_head *h, const uint8_t *rows, size_t bytes, tdm_err *err) {
    tdm_backend *be = h->be;
    tdm_weight *w = &h->w;
    uint32_t layout = TDM_LAYOUT_ROWS;
    if (be->any_layout && be->ops->weight_layout) layout = be->ops->weight_layout(be, w->type, w->rows, w->cols);
    if (!tdm_layout_fits(layout, w->type, w->rows, w->cols)) layout = TDM_LAYOUT_ROWS;
    tandem_status st = be->ops->alloc(be, bytes, &h->buf[0], err);
    if (st) return st;
    const void *src = rows;
    void *packed = NULL;
    if (layout != TDM_LAYOUT_ROWS) {
        if (!(packed = tdm_malloc(bytes))) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        tdm_weight_pack(layout, w->type, w->rows, w->cols, rows, packed);
        src = packed;
    }
    st = be->ops->upload(be, h->buf[0], src, bytes, err);
    free(packed);
    if (st) return st;
    w->layout = layout;
    w->data = h->buf[0];
    return TANDEM_OK;
}

/* The quantised copy of the head's rows, on the backends where the model's whole head
 * gets one (int8 dot products, host memory, a type the few-row kernels do not read
 * directly); none when the rows hold a non-finite value (as model.c). */
static tandem_status place_qhead(tdm_vocab_head *h, const tdm_model *m, tdm_err *err) {
    tdm_backend *be = h->be;
    if (!m->has_qhead || !be->int8_dot || !be->host_memory || h->w.layout != TDM_LAYOUT_ROWS) return TANDEM_OK;
    const size_t bytes = tdm_qhead_bytes(h->w.rows, h->w.cols);
    if (bytes == 0) return TANDEM_OK;
    tandem_status st = be->ops->alloc(be, bytes, &h->buf[2], err);
    if (st) return st;
    tdm_err qerr;
    st = tdm_qhead_fill(&h->w, h->buf[2], &qerr);
    if (st == TANDEM_ERR_NOMEM) return tdm_seterr(err, st, "%s", qerr.msg);
    if (st == TANDEM_OK) {
        tdm_qhead_place(&h->qh, h->w.rows, h->w.cols, h->buf[2]);
        h->has_qhead = true;
    }
    return TANDEM_OK;
}

static tandem_status head_init(tdm_vocab_head *h, const tdm_model *m, const int32_t *ids, int32_t n, tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    if (m->tp_size > 0)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "a head over part of the vocabulary: the model is split");
    if (!m->be->ops->scatter_cols)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "a head over part of the vocabulary: the %s backend has no scatter_cols op", m->be->ops->name);
    if (n < 1 || n > hp->n_vocab)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "a head over %d of the %d tokens", (int)n, (int)hp->n_vocab);
    for (int32_t j = 0; j < n; j++)
        if (ids[j] < 0 || ids[j] >= hp->n_vocab || (j > 0 && ids[j] <= ids[j - 1]))
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "a head over part of the vocabulary: id %d at %d is not ascending in [0, %d)",
                              (int)ids[j], (int)j, (int)hp->n_vocab);
    const char *name = hp->tied_output ? "token_embd.weight" : "output.weight";
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(m->gguf, name);
    uint64_t rb;
    if (!t || !t->data || t->type != m->output.type || t->ne[0] != hp->n_embd || t->ne[1] != hp->n_vocab ||
        !tdm_dtype_row_bytes(t->type, (uint64_t)hp->n_embd, &rb))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "a head over part of the vocabulary: model '%s' has no %s of its "
                          "head's type and shape", tdm_model_label(m), name);
    h->be = m->be;
    h->n = n;
    h->n_vocab = hp->n_vocab;
    if (!(h->ids = tdm_mallocarray((size_t)n, sizeof *h->ids))) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    memcpy(h->ids, ids, (size_t)n * sizeof *ids);
    tandem_status st = h->be->ops->alloc(h->be, (size_t)n * sizeof *ids, &h->buf[1], err);
    if (!st) st = h->be->ops->upload(h->be, h->buf[1], ids, (size_t)n * sizeof *ids, err);
    if (st) return st;
    h->ids_dev = h->buf[1];
    h->w = (tdm_weight){.type = t->type, .rows = n, .cols = hp->n_embd, .row_bytes = (size_t)rb};
    const size_t bytes = (size_t)rb * (size_t)n;
    uint8_t *rows = tdm_malloc(bytes);
    if (!rows) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory gathering the head's rows");
    for (int32_t j = 0; j < n; j++)
        memcpy(rows + (size_t)j * rb, (const uint8_t *)t->data + (size_t)ids[j] * rb, (size_t)rb);
    /* an untied head's file pages are not read again for this head (the gather paged
     * them in: dropped rather than held beside the copy; they come back on demand) */
    if (!hp->tied_output) tdm_gguf_release(m->gguf, t->data, (size_t)t->nbytes);
    st = place_rows(h, rows, bytes, err);
    free(rows);
    if (st) return st;
    return place_qhead(h, m, err);
}

tandem_status tdm_vocab_head_init(tdm_vocab_head *h, const tdm_model *m, const int32_t *ids, int32_t n, tdm_err *err) {
    memset(h, 0, sizeof *h);
    tandem_status st = head_init(h, m, ids, n, err);
    if (st) tdm_vocab_head_free(h);
    return st;
}
