/* eagle3.c - EAGLE-3 draft heads: the file's keys and tensors, checked, placed on a
 * backend, and paired with a target (eagle3.h; the forward: eagle3_forward.c). */
#include "eagle3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "ggml_types.h"

bool tdm_gguf_is_eagle3(const tdm_gguf *g) {
    tdm_gguf_str a;
    const tdm_gguf_value *v = tdm_gguf_find(g, "general.architecture");
    if (!v || v->type != TDM_GGUF_STRING || tdm_gguf_get_str(g, "general.architecture", &a, NULL)) return false;
    return a.len == 6 && memcmp(a.ptr, "eagle3", 6) == 0;
}

/* The tensor `name` with GGUF shape {ne0} (ne1 == 0) or {ne0, ne1}, of a supported
 * type (i64: only `want_i64`); NULL and OK when absent and optional. */
static tandem_status find(const tdm_gguf *g, const char *name, int64_t ne0, int64_t ne1, bool optional, bool want_i64,
                          const tdm_gguf_tensor **out, tdm_err *err) {
    *out = NULL;
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, name);
    if (!t) return optional ? TANDEM_OK : tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: missing tensor '%s'", name);
    const bool ok = t->ne[0] == ne0 && (ne1 ? t->ne[1] == ne1 && t->n_dims == 2 : t->ne[1] == 1) && t->ne[2] == 1 &&
                    t->ne[3] == 1;
    if (!ok)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld%s%lld]",
                          name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                          (long long)ne0, ne1 ? ", " : "", ne1 ? (long long)ne1 : 0LL);
    if (want_i64) {
        if (t->type != 27 /* GGML_TYPE_I64 */ || !t->data || t->nbytes != (uint64_t)ne0 * 8)
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: tensor '%s' must be i64 (%lld values)", name,
                              (long long)ne0);
    } else if (!tdm_dtype_supported(t->type)) {
        char ty[64], list[256];
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "eagle3: tensor '%s' has type %s, which tandem does not support (supported: %s)", name,
                          tdm_ggml_type_describe(t->type, ty, sizeof ty), tdm_ggml_supported_list(list, sizeof list));
    } else {
        uint64_t rb;
        if (!tdm_dtype_row_bytes(t->type, (uint64_t)ne0, &rb))
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: tensor '%s': row of %lld not a multiple of its block",
                              name, (long long)ne0);
    }
    *out = t;
    return TANDEM_OK;
}

/* The feature layers: eagle3.target_layers, 3 ids, i32 or u32, each >= 0. */
static tandem_status read_feat_layers(const tdm_gguf *g, int32_t *ids, tdm_err *err) {
    const char *key = "eagle3.target_layers";
    const tdm_gguf_value *v = tdm_gguf_find(g, key);
    if (!v) return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: missing key '%s' (the target's feature layers)", key);
    if (v->type != TDM_GGUF_ARRAY || (v->v.arr.type != TDM_GGUF_INT32 && v->v.arr.type != TDM_GGUF_UINT32))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: key '%s' must be an array of integers", key);
    if (v->v.arr.n != TDM_EAGLE3_N_FEAT)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: '%s' has %llu entries, an EAGLE-3 head fuses exactly %d", key,
                          (unsigned long long)v->v.arr.n, TDM_EAGLE3_N_FEAT);
    for (int i = 0; i < TDM_EAGLE3_N_FEAT; i++) {
        int32_t id = tdm_gguf_arr_i32(&v->v.arr, (uint64_t)i); /* (u32 above 2^31: negative) */
        if (id < 0 || id > 1024)
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: '%s'[%d] = %d is out of range [0, 1024]", key, i, (int)id);
        ids[i] = id;
    }
    return TANDEM_OK;
}

/* The d2t table (i64, [n]) as target ids: each in [0, n_vocab), distinct; *sorted
 * false when not ascending.  ids: [n] out. */
static tandem_status read_d2t(const tdm_gguf_tensor *t, int32_t n, int32_t n_vocab, int32_t *ids, bool *sorted,
                              tdm_err *err) {
    *sorted = true;
    for (int32_t j = 0; j < n; j++) {
        int64_t v;
        memcpy(&v, (const uint8_t *)t->data + (size_t)j * 8, 8); /* (the file's alignment may be 1) */
        if (v < 0 || v >= n_vocab)
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: d2t[%d] = %lld is not a token id of the vocabulary of %d",
                              (int)j, (long long)v, (int)n_vocab);
        ids[j] = (int32_t)v;
        if (j > 0 && ids[j] <= ids[j - 1]) *sorted = false;
    }
    if (*sorted) return TANDEM_OK;
    /* distinct: a marked pass over the vocabulary */
    uint8_t *seen = tdm_calloc((size_t)n_vocab, 1);
    if (!seen) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    tandem_status st = TANDEM_OK;
    for (int32_t j = 0; j < n && !st; j++)
        if (seen[ids[j]]++) st = tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: d2t maps two draft rows to token %d", (int)ids[j]);
    free(seen);
    return st;
}

tandem_status tdm_eagle3_read_hparams(const tdm_gguf *g, tdm_hparams *hp, tdm_eagle3_hparams *ep, tdm_err *err) {
    memset(ep, 0, sizeof *ep);
    tandem_status st = tdm_hparams_read(g, hp, err);
    if (st) return st;
    if (hp->arch_id != TDM_ARCH_EAGLE3)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "architecture '%s' is not an EAGLE-3 head (eagle3)", hp->arch);
    if (hp->n_layer != 1)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: block_count is %d, an EAGLE-3 head has one decoder layer",
                          (int)hp->n_layer);
    uint32_t th;
    bool nbr, nbf;
    if ((st = tdm_gguf_get_u32(g, "eagle3.target_hidden_size", &th, err)) ||
        (st = tdm_gguf_opt_bool(g, "eagle3.norm_before_residual", false, &nbr, err)) ||
        (st = tdm_gguf_opt_bool(g, "eagle3.norm_before_fc", false, &nbf, err)) ||
        (st = read_feat_layers(g, ep->feat_layers, err)))
        return st;
    if (th < 1 || th > (1u << 16))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: target_hidden_size %u is out of range [1, 65536]", th);
    ep->n_embd = hp->n_embd;
    ep->n_head = hp->n_head;
    ep->n_head_kv = hp->n_head_kv;
    ep->head_dim = hp->head_dim;
    ep->n_ff = hp->n_ff;
    ep->n_vocab = hp->n_vocab;
    ep->target_hidden = (int32_t)th;
    ep->norm_before_residual = nbr;
    ep->norm_before_fc = nbf;

    /* every tensor's shape (the loader places them; info and -d check here) */
    const int64_t E = hp->n_embd, T3 = 3 * (int64_t)th, F = hp->n_ff;
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim, kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    const tdm_gguf_tensor *t, *d2t = tdm_gguf_find_tensor(g, "d2t");
    int64_t nd = hp->n_vocab;
    if (d2t) {
        nd = d2t->ne[0];
        if (d2t->n_dims != 1 || nd < 1 || nd > hp->n_vocab)
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: d2t has %lld entries (%u dims); the draft vocabulary "
                              "must lie in [1, %d] (the vocabulary)", (long long)nd, (unsigned)d2t->n_dims,
                              (int)hp->n_vocab);
        if ((st = find(g, "d2t", nd, 0, false, true, &t, err))) return st;
    }
    ep->has_d2t = d2t != NULL;
    ep->n_draft_vocab = (int32_t)nd;
    struct {
        const char *name;
        int64_t ne0, ne1;
        bool optional;
    } want[] = {
        {"fc.weight", T3, E, false},
        {"enc.output_norm.weight", T3, 0, !nbf},
        {"token_embd.weight", E, hp->n_vocab, true},
        {"output_norm.weight", E, 0, false},
        {"output.weight", E, nd, true},
        {"blk.0.attn_norm.weight", E, 0, false},
        {"blk.0.attn_norm_2.weight", E, 0, false},
        {"blk.0.attn_q.weight", 2 * E, qd, false},
        {"blk.0.attn_k.weight", 2 * E, kvd, false},
        {"blk.0.attn_v.weight", 2 * E, kvd, false},
        {"blk.0.attn_output.weight", qd, E, false},
        {"blk.0.ffn_norm.weight", E, 0, false},
        {"blk.0.ffn_gate.weight", E, F, false},
        {"blk.0.ffn_up.weight", E, F, false},
        {"blk.0.ffn_down.weight", F, E, false},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(want); i++)
        if ((st = find(g, want[i].name, want[i].ne0, want[i].ne1, want[i].optional, false, &t, err))) return st;
    ep->own_embd = tdm_gguf_find_tensor(g, "token_embd.weight") != NULL;
    ep->own_output = tdm_gguf_find_tensor(g, "output.weight") != NULL;
    if (ep->has_d2t) {
        int32_t *ids = tdm_mallocarray((size_t)nd, sizeof *ids);
        bool sorted;
        if (!ids) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        st = read_d2t(d2t, (int32_t)nd, hp->n_vocab, ids, &sorted, err);
        free(ids);
        if (st) return st;
        /* a head borrowing the target's output scores the whole vocabulary in its order */
        if (!ep->own_output && (nd != hp->n_vocab || !sorted))
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "eagle3: the file has no output.weight (the target's head scores "
                              "every token in order) but its d2t is not the identity");
        ep->has_d2t = ep->own_output;
    }
    return TANDEM_OK;
}

/* ------------------------------------------------------------ loading */

/* Columns [c0, c0 + nc) of the q, k and v weights ([2E] columns each), their rows
 * stacked into one weight: in the file's type when the three share one whose blocks
 * the split keeps whole, else in f32. */
static tandem_status load_qkv_half(tdm_model *m, int64_t E2, int64_t c0, int64_t nc, tdm_weight *w, tdm_err *err) {
    static const char *names[3] = {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"};
    const tdm_gguf_tensor *t[3];
    int64_t rows = 0;
    bool same = true;
    for (int i = 0; i < 3; i++) {
        t[i] = tdm_gguf_find_tensor(m->gguf, names[i]); /* (checked by tdm_eagle3_read_hparams) */
        rows += t[i]->ne[1];
        same = same && t[i]->type == t[0]->type;
    }
    const uint32_t be = tdm_dtype_block_elems(t[0]->type);
    const uint32_t type = same && c0 % be == 0 && nc % be == 0 ? t[0]->type : TDM_F32;
    uint64_t rb, off = 0;
    tdm_dtype_row_bytes(type, (uint64_t)nc, &rb);
    if (type == t[0]->type) tdm_dtype_row_bytes(type, (uint64_t)c0, &off);
    uint8_t *host = tdm_malloc((size_t)rb * (size_t)rows);
    float *tmp = tdm_mallocarray((size_t)E2, sizeof *tmp);
    if (!host || !tmp) {
        free(host);
        free(tmp);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory splitting the attention weights");
    }
    size_t o = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t src_rb;
        tdm_dtype_row_bytes(t[i]->type, (uint64_t)E2, &src_rb);
        for (int64_t r = 0; r < t[i]->ne[1]; r++, o += (size_t)rb) {
            const uint8_t *src = (const uint8_t *)t[i]->data + (size_t)r * src_rb;
            if (type == t[i]->type) {
                memcpy(host + o, src + off, (size_t)rb);
            } else {
                tdm_row_to_f32(t[i]->type, src, tmp, E2);
                memcpy(host + o, tmp + c0, (size_t)nc * sizeof(float));
            }
        }
    }
    free(tmp);
    w->type = type;
    w->rows = rows;
    w->cols = nc;
    w->row_bytes = (size_t)rb;
    tandem_status st = tdm_model_place(m, host, true, w, err);
    free(host);
    return st;
}

/* The head's output rows and d2t ids, the rows reordered by their ids where the
 * file's are not ascending (the scatter of the logits needs ascending ids). */
static tandem_status load_output_d2t(tdm_eagle3 *h, tdm_err *err) {
    const tdm_eagle3_hparams *ep = &h->ep;
    tdm_model *m = h->m;
    const int32_t n = ep->n_draft_vocab;
    const int64_t E = ep->n_embd;
    if (!ep->has_d2t) return tdm_model_load_mat(m, "output.weight", E, n, false, &h->output, err);
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(m->gguf, "d2t");
    if (!(h->d2t = tdm_mallocarray((size_t)n, sizeof *h->d2t))) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    bool sorted;
    tandem_status st = read_d2t(t, n, ep->n_vocab, h->d2t, &sorted, err);
    if (st) return st;
    if (sorted) {
        st = tdm_model_load_mat(m, "output.weight", E, n, false, &h->output, err);
    } else { /* output row j scores token d2t[j]: the rows in the order of their ids */
        const tdm_gguf_tensor *o = tdm_gguf_find_tensor(m->gguf, "output.weight");
        uint64_t rb;
        tdm_dtype_row_bytes(o->type, (uint64_t)E, &rb);
        int32_t *row_of = tdm_mallocarray((size_t)ep->n_vocab, sizeof *row_of);
        uint8_t *host = tdm_malloc((size_t)rb * (size_t)n);
        if (!row_of || !host) st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        if (!st) {
            for (int32_t v = 0; v < ep->n_vocab; v++) row_of[v] = -1;
            for (int32_t j = 0; j < n; j++) row_of[h->d2t[j]] = j;
            int32_t k = 0;
            for (int32_t v = 0; v < ep->n_vocab; v++)
                if (row_of[v] >= 0) {
                    memcpy(host + (size_t)k * rb, (const uint8_t *)o->data + (size_t)row_of[v] * rb, (size_t)rb);
                    h->d2t[k++] = v;
                }
            h->output = (tdm_weight){.type = o->type, .rows = n, .cols = E, .row_bytes = (size_t)rb};
            st = tdm_model_place(m, host, false, &h->output, err);
        }
        free(row_of);
        free(host);
    }
    if (st) return st;
    void *dev;
    if ((st = tdm_model_alloc(m, (size_t)n * sizeof(int32_t), &dev, err)) ||
        (st = m->be->ops->upload(m->be, dev, h->d2t, (size_t)n * sizeof(int32_t), err)))
        return st;
    h->d2t_dev = dev;
    return TANDEM_OK;
}

static tandem_status load_weights(tdm_eagle3 *h, tdm_err *err) {
    tdm_model *m = h->m;
    const tdm_eagle3_hparams *ep = &h->ep;
    const int64_t E = ep->n_embd, T3 = 3 * (int64_t)ep->target_hidden, F = ep->n_ff;
    const int64_t qd = (int64_t)ep->n_head * ep->head_dim;
    tandem_status st;
    if (!(m->layers = tdm_calloc(1, sizeof *m->layers))) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    tdm_layer *L = &m->layers[0];
    if ((st = tdm_model_load_mat(m, "fc.weight", T3, E, true, &h->fc, err)) ||
        (st = tdm_model_load_vec(m, "enc.output_norm.weight", T3, !ep->norm_before_fc, &h->enc_norm, err)) ||
        (st = tdm_model_load_vec(m, "output_norm.weight", E, false, &m->out_norm, err)) ||
        (st = tdm_model_load_vec(m, "blk.0.attn_norm.weight", E, false, &L->attn_norm, err)) ||
        (st = tdm_model_load_vec(m, "blk.0.attn_norm_2.weight", E, false, &h->hidden_norm, err)) ||
        (st = load_qkv_half(m, 2 * E, 0, E, &h->wqkv_e, err)) ||
        (st = load_qkv_half(m, 2 * E, E, E, &h->wqkv_g, err)) ||
        (st = tdm_model_load_mat(m, "blk.0.attn_output.weight", qd, E, true, &L->wo, err)) ||
        (st = tdm_model_load_vec(m, "blk.0.ffn_norm.weight", E, false, &L->ffn_norm, err)) ||
        (st = tdm_model_load_mat(m, "blk.0.ffn_down.weight", F, E, true, &L->w2, err)))
        return st;
    /* gate and up rows fused as a block's w13 (the swiglu op's layout) */
    const tdm_gguf_tensor *tg = tdm_gguf_find_tensor(m->gguf, "blk.0.ffn_gate.weight"),
                          *tu = tdm_gguf_find_tensor(m->gguf, "blk.0.ffn_up.weight");
    {
        const bool same = tg->type == tu->type;
        const uint32_t type = same ? tg->type : TDM_F32;
        uint64_t rb, src_rb[2];
        tdm_dtype_row_bytes(type, (uint64_t)E, &rb);
        tdm_dtype_row_bytes(tg->type, (uint64_t)E, &src_rb[0]);
        tdm_dtype_row_bytes(tu->type, (uint64_t)E, &src_rb[1]);
        uint8_t *host = tdm_malloc((size_t)rb * (size_t)(2 * F));
        if (!host) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        const tdm_gguf_tensor *part[2] = {tg, tu};
        for (int p = 0; p < 2; p++)
            for (int64_t r = 0; r < F; r++) {
                const uint8_t *src = (const uint8_t *)part[p]->data + (size_t)r * src_rb[p];
                uint8_t *dst = host + (size_t)(p * F + r) * rb;
                if (same) memcpy(dst, src, (size_t)rb);
                else tdm_row_to_f32(part[p]->type, src, (float *)dst, E);
            }
        L->w13 = (tdm_weight){.type = type, .rows = 2 * F, .cols = E, .row_bytes = (size_t)rb};
        st = tdm_model_place(m, host, true, &L->w13, err);
        free(host);
        if (st) return st;
    }
    if (ep->own_embd && (st = tdm_model_load_mat(m, "token_embd.weight", E, ep->n_vocab, false, &h->tok_embd, err)))
        return st;
    if (ep->own_output && (st = load_output_d2t(h, err))) return st;
    return tdm_model_load_rope(m, err);
}

tandem_status tdm_eagle3_load_gguf(tdm_gguf *g, tdm_backend *be, tdm_eagle3 **out, tdm_err *err) {
    *out = NULL;
    tdm_eagle3 *h = tdm_calloc(1, sizeof *h);
    tdm_model *m = tdm_calloc(1, sizeof *m);
    if (!h || !m) {
        free(h);
        free(m);
        tdm_gguf_close(g);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    h->m = m;
    m->gguf = g;
    m->be = be;
    tandem_status st = tdm_eagle3_read_hparams(g, &m->hp, &h->ep, err);
    m->hp_full = m->hp;
    if (!st) st = load_weights(h, err);
    if (st) {
        tdm_eagle3_free(h);
        return st;
    }
    *out = h;
    return TANDEM_OK;
}

tandem_status tdm_eagle3_load(const char *path, tdm_backend *be, tdm_eagle3 **out, tdm_err *err) {
    *out = NULL;
    tdm_gguf *g;
    tandem_status st = tdm_gguf_open(path, &g, err);
    if (!st) st = tdm_eagle3_load_gguf(g, be, out, err);
    if (st) return st;
    const char *base = strrchr(path, '/');
    snprintf((*out)->file, sizeof (*out)->file, "%s", base ? base + 1 : path);
    snprintf((*out)->m->file, sizeof (*out)->m->file, "%s", (*out)->file);
    return TANDEM_OK;
}

void tdm_eagle3_free(tdm_eagle3 *h) {
    if (!h) return;
    tdm_model_free(h->m);
    free(h->d2t);
    free(h);
}

/* ------------------------------------------------------------ pairing */

tandem_status tdm_eagle3_check_target(const tdm_eagle3_hparams *ep, const char *head_name, const tdm_hparams *t,
                                      const char *target_name, tdm_err *err) {
#define MISMATCH(...) tdm_seterr(err, TANDEM_ERR_MISMATCH, "EAGLE-3 head '%s' does not fit target '%s': " __VA_ARGS__)
    if (t->arch_id == TDM_ARCH_EAGLE3) return MISMATCH("the target is an EAGLE-3 head too", head_name, target_name);
    if (ep->n_vocab != t->n_vocab)
        return MISMATCH("its vocabulary has %d tokens, the target's %d", head_name, target_name, (int)ep->n_vocab,
                        (int)t->n_vocab);
    if (ep->target_hidden != t->n_embd)
        return MISMATCH("it fuses features of width %d (target_hidden_size), the target's hidden size is %d", head_name,
                        target_name, (int)ep->target_hidden, (int)t->n_embd);
    for (int i = 0; i < TDM_EAGLE3_N_FEAT; i++)
        if (ep->feat_layers[i] > t->n_layer)
            return MISMATCH("feature layer %d (target_layers[%d]) is beyond the target's %d layers", head_name,
                            target_name, (int)ep->feat_layers[i], i, (int)t->n_layer);
    if ((!ep->own_embd || !ep->own_output) && ep->n_embd != t->n_embd)
        return MISMATCH("it borrows the target's %s but its width %d is not the target's %d", head_name, target_name,
                        !ep->own_embd ? "token embedding" : "output head", (int)ep->n_embd, (int)t->n_embd);
#undef MISMATCH
    return TANDEM_OK;
}

tandem_status tdm_eagle3_pair(tdm_eagle3 *h, const tdm_model *target, tdm_err *err) {
    const char *hn = h->file[0] ? h->file : "unnamed";
    tandem_status st = tdm_eagle3_check_target(&h->ep, hn, &target->hp, tdm_model_label(target), err);
    if (st) return st;
    /* (backends of one kind: any CPU backend reads host weights, and an engine runs
     * a model loaded by another CUDA backend of the device as it runs a draft) */
    if (target->tp_size > 0 || !target->be || !h->m->be || target->be->ops != h->m->be->ops)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "EAGLE-3 head '%s': its target '%s' must be whole and on a backend of the "
                          "head's kind", hn, tdm_model_label(target));
    if (!h->ep.own_embd) h->tok_embd = target->tok_embd;
    if (!h->ep.own_output) h->output = target->output;
    h->paired = true;
    return TANDEM_OK;
}
