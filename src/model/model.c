/* model.c - tensor validation and weight placement (the hyperparameters: hparams.c). */
#include "model.h"
#include "ggml_types.h"
#include "qhead.h"
#include "tp.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ weights */

static bool is_host_backend(const tdm_backend *be) { return strcmp(be->ops->name, "cpu") == 0; }

static tandem_status own(tdm_model *m, void *p, tdm_err *err) {
    if (m->n_owned == m->cap_owned) {
        int32_t nc = m->cap_owned ? m->cap_owned * 2 : 64;
        void **no = realloc(m->owned, (size_t)nc * sizeof *no);
        if (!no) {
            m->be->ops->free(m->be, p);
            return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        }
        m->owned = no;
        m->cap_owned = nc;
    }
    m->owned[m->n_owned++] = p;
    return TANDEM_OK;
}

static tandem_status alloc_owned(tdm_model *m, size_t bytes, void **out, tdm_err *err) {
    tandem_status st = m->be->ops->alloc(m->be, bytes, out, err);
    if (st) return st;
    return own(m, *out, err);
}

/* Tells the load's progress hook (if any) that fraction done of the model is loaded;
 * TANDEM_ERR_CANCELLED when it says stop. */
static tandem_status report_progress(const tdm_model *m, float done, tdm_err *err) {
    const tdm_load_opts *pr = m->load_opts;
    if (!pr || !pr->fn) return TANDEM_OK;
    if (done > 1.0f) done = 1.0f;
    if (!pr->fn(pr->base + pr->scale * done, pr->user))
        return tdm_seterr(err, TANDEM_ERR_CANCELLED, "the model load was cancelled by its progress callback (at %.0f%%)",
                          100.0 * (pr->base + pr->scale * done));
    return TANDEM_OK;
}

/* Finds a tensor and checks its shape: ne0 x ne1 (ne1 = 0: a 1-D tensor), or with
 * ne2 > 0 a 3-D ne0 x ne1 x ne2 (a mixture-of-experts layer's experts, one [ne1][ne0]
 * matrix each; ne2 = 1 may be stored as 2-D).  Each tensor found is a step of the
 * load's progress (the hook may cancel here). */
static tandem_status find_tensor_nd(tdm_model *m, const char *name, int64_t ne0, int64_t ne1, int64_t ne2,
                                    bool optional, const tdm_gguf_tensor **out, tdm_err *err) {
    *out = NULL;
    const uint64_t n_tensors = m->gguf->n_tensors ? m->gguf->n_tensors : 1;
    tandem_status st = report_progress(m, (float)((double)m->n_found++ / (double)n_tensors), err);
    if (st) return st;
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(m->gguf, name);
    if (!t) {
        if (optional) return TANDEM_OK;
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "missing tensor '%s'", name);
    }
    bool ok;
    if (ne2 > 0)
        ok = t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == ne2 && t->ne[3] == 1 &&
             (t->n_dims == 3 || (ne2 == 1 && t->n_dims == 2));
    else {
        uint32_t want_dims = ne1 ? 2 : 1;
        ok = t->ne[0] == ne0 && (ne1 ? t->ne[1] == ne1 : true) && t->ne[2] == 1 && t->ne[3] == 1 &&
             (t->n_dims == want_dims || (ne1 == 0 && t->ne[1] == 1));
    }
    if (!ok && ne2 > 0)
        return tdm_seterr(err, TANDEM_ERR_FORMAT,
                          "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld]", name,
                          (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                          (long long)ne0, (long long)ne1, (long long)ne2);
    if (!ok)
        return tdm_seterr(err, TANDEM_ERR_FORMAT,
                          "tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld%s%lld]", name,
                          (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                          (long long)t->ne[3], (long long)ne0, ne1 ? ", " : "",
                          ne1 ? (long long)ne1 : 0LL);
    if (!tdm_dtype_supported(t->type)) {
        char ty[64], list[256];
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "tensor '%s' has type %s, which tandem does not support (supported: %s)", name,
                          tdm_ggml_type_describe(t->type, ty, sizeof ty),
                          tdm_ggml_supported_list(list, sizeof list));
    }
    *out = t;
    return TANDEM_OK;
}

static tandem_status find_tensor(tdm_model *m, const char *name, int64_t ne0, int64_t ne1, bool optional,
                                 const tdm_gguf_tensor **out, tdm_err *err) {
    return find_tensor_nd(m, name, ne0, ne1, 0, optional, out, err);
}

/* Values [off, off + n) of a 1-D vector of n_full, converted to f32 in backend
 * memory. */
static tandem_status load_vec_part(tdm_model *m, const char *name, int64_t n_full, int64_t off, int64_t n,
                                   bool optional, const float **out, tdm_err *err) {
    *out = NULL;
    const tdm_gguf_tensor *t;
    tandem_status st = find_tensor(m, name, n_full, 0, optional, &t, err);
    if (st || !t) return st;
    if (n_full % tdm_dtype_block_elems(t->type))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "tensor '%s': size not a multiple of its block", name);
    float *host = tdm_mallocarray((size_t)n_full, sizeof(float));
    if (!host) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    tdm_row_to_f32(t->type, t->data, host, n_full);
    void *dev;
    st = alloc_owned(m, (size_t)n * sizeof(float), &dev, err);
    if (!st) st = m->be->ops->upload(m->be, dev, host + off, (size_t)n * sizeof(float), err);
    free(host);
    if (st) return st;
    m->n_params += (uint64_t)n;
    m->weight_bytes += (uint64_t)n * sizeof(float);
    *out = dev;
    return TANDEM_OK;
}

/* A whole 1-D vector converted to f32 in backend memory. */
static tandem_status load_vec(tdm_model *m, const char *name, int64_t n, bool optional, const float **out,
                              tdm_err *err) {
    return load_vec_part(m, name, n, 0, n, optional, out, err);
    return TANDEM_OK;
}

/* What a weight is read by (place_weight): matmul only, so the backend may ask for
 * another layout; a transformer block's dense weight, made FP8 when the model is
 * loaded with FP8 weights. */
enum { W_MATMUL = 1, W_BLOCK = 2 };

/* Whether a block weight of this type becomes FP8 (tandem_model_params.weights):
 * the 16- and 8-bit types; 4- to 6-bit K-quants and the like stay (FP8 would be
 * more bytes). */
static bool fp8_source(uint32_t type) {
    return type == TDM_F32 || type == TDM_F16 || type == TDM_BF16 || type == TDM_Q8_0;
}

/* w = the rows-layout matrix at host memory src ([rows] rows of type) as FP8 E4M3
 * with per-row scales (tdm_row_to_e4m3), in backend memory. */
static tandem_status place_fp8(tdm_model *m, const void *src, uint32_t type, int64_t rows, int64_t cols,
                               tdm_weight *w, tdm_err *err) {
    uint64_t rb;
    tdm_dtype_row_bytes(type, (uint64_t)cols, &rb);
    uint8_t *q = tdm_mallocarray((size_t)rows, (size_t)cols);
    float *sc = tdm_mallocarray((size_t)rows, sizeof(float)), *tmp = tdm_mallocarray((size_t)cols, sizeof(float));
    tandem_status st = TANDEM_OK;
    if (!q || !sc || !tmp) st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory making a weight FP8");
    for (int64_t r = 0; r < rows && !st; r++) {
        tdm_row_to_f32(type, (const uint8_t *)src + (size_t)r * rb, tmp, cols);
        if (!tdm_row_to_e4m3(tmp, cols, q + (size_t)r * (size_t)cols, &sc[r]))
            st = tdm_seterr(err, TANDEM_ERR_FORMAT,
                            "row %lld of a %lld x %lld %s weight holds a non-finite value: it cannot be made FP8",
                            (long long)r, (long long)rows, (long long)cols, tdm_dtype_name(type));
    }
    void *dq = NULL, *ds = NULL;
    if (!st) st = alloc_owned(m, (size_t)rows * (size_t)cols, &dq, err);
    if (!st) st = m->be->ops->upload(m->be, dq, q, (size_t)rows * (size_t)cols, err);
    if (!st) st = alloc_owned(m, (size_t)rows * sizeof(float), &ds, err);
    if (!st) st = m->be->ops->upload(m->be, ds, sc, (size_t)rows * sizeof(float), err);
    free(q);
    free(sc);
    free(tmp);
    if (st) return st;
    w->type = TDM_F8_E4M3;
    w->row_bytes = (size_t)cols;
    w->layout = TDM_LAYOUT_ROWS;
    w->data = dq;
    w->scale = ds;
    /* (the callers count the source's bytes: count the difference) */
    m->weight_bytes += (uint64_t)rows * ((uint64_t)cols + sizeof(float)) - rb * (uint64_t)rows;
    return TANDEM_OK;
}

/* Places a matmul weight whose rows-layout bytes are at host memory src in backend
 * memory, in the layout the backend asks for (zero-copy on the CPU backend when that
 * is the rows layout and src is the mapped file, i.e. when src_owned is false, and
 * src is aligned to GGUF's default 32 bytes: a file with a smaller general.alignment
 * may start a tensor at any byte, where the kernels' typed loads would be misaligned,
 * so such a tensor is copied into the backend's aligned memory). */
static tandem_status place_weight(tdm_model *m, const void *src, bool src_owned, uint32_t type, int64_t rows,
                                  int64_t cols, size_t bytes, unsigned use, tdm_weight *w, tdm_err *err) {
    tandem_status st;
    if ((use & W_BLOCK) && m->fp8 && fp8_source(type)) {
        if ((st = place_fp8(m, src, type, rows, cols, w, err))) return st;
        if (!src_owned) tdm_gguf_release(m->gguf, src, bytes);
        return TANDEM_OK;
    }
    w->scale = NULL;
    uint32_t layout = TDM_LAYOUT_ROWS;
    if (((use & W_MATMUL) || m->be->any_layout) && m->be->ops->weight_layout)
        layout = m->be->ops->weight_layout(m->be, type, rows, cols);
    if (!tdm_layout_fits(layout, type, rows, cols)) layout = TDM_LAYOUT_ROWS;
    w->layout = layout;
    if (layout == TDM_LAYOUT_ROWS && is_host_backend(m->be) && !src_owned && (uintptr_t)src % 32 == 0) {
        w->data = src;
        return TANDEM_OK;
    }
    void *dev;
    if ((st = alloc_owned(m, bytes, &dev, err))) return st;
    if (layout == TDM_LAYOUT_ROWS) {
        st = m->be->ops->upload(m->be, dev, src, bytes, err);
    } else if (is_host_backend(m->be)) {
        tdm_weight_pack(layout, type, rows, cols, src, dev);
    } else {
        void *tmp = tdm_malloc(bytes);
        if (!tmp) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory packing a weight");
        tdm_weight_pack(layout, type, rows, cols, src, tmp);
        st = m->be->ops->upload(m->be, dev, tmp, bytes, err);
        free(tmp);
    }
    if (st) return st;
    if (!src_owned) tdm_gguf_release(m->gguf, src, bytes); /* the file's copy is not read again */
    w->data = dev;
    return TANDEM_OK;
}

/* A matrix [rows][cols]; use: W_MATMUL, read only by matmul, so the backend may ask
 * for another layout (the embedding and the output head only on backends whose
 * get_rows reads every layout too: any_layout); W_BLOCK, a block's dense weight. */
static tandem_status load_mat(tdm_model *m, const char *name, int64_t cols, int64_t rows, unsigned use,
                              tdm_weight *w, tdm_err *err) {
    const tdm_gguf_tensor *t;
    tandem_status st = find_tensor(m, name, cols, rows, false, &t, err);
    if (st) return st;
    uint64_t rb;
    if (!tdm_dtype_row_bytes(t->type, (uint64_t)cols, &rb))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "tensor '%s': row of %lld not a multiple of its block",
                          name, (long long)cols);
    w->type = t->type;
    w->rows = rows;
    w->cols = cols;
    w->row_bytes = (size_t)rb;
    if ((st = place_weight(m, t->data, false, t->type, rows, cols, t->nbytes, use, w, err))) return st;
    m->n_params += (uint64_t)rows * (uint64_t)cols;
    m->weight_bytes += t->nbytes;
    return TANDEM_OK;
}

/* Rows [r0, r0 + nr) and columns [c0, c0 + nc) of a matrix [rows][cols] (a rank's
 * part of a split model, tp.h; the whole matrix: load_mat).  The columns must be
 * whole blocks of the tensor's type. */
static tandem_status load_mat_part(tdm_model *m, const char *name, int64_t cols, int64_t rows, int64_t r0, int64_t nr,
                                   int64_t c0, int64_t nc, unsigned use, tdm_weight *w, tdm_err *err) {
    if (r0 == 0 && nr == rows && c0 == 0 && nc == cols) return load_mat(m, name, cols, rows, use, w, err);
    const tdm_gguf_tensor *t;
    tandem_status st = find_tensor(m, name, cols, rows, false, &t, err);
    if (st) return st;
    const int64_t be = tdm_dtype_block_elems(t->type);
    if (c0 % be || nc % be)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "tensor '%s' (%s) cannot be split %d ways: a rank's %lld of its %lld columns are not whole "
                          "blocks of %lld values",
                          name, tdm_dtype_name(t->type), (int)m->tp_size, (long long)nc, (long long)cols,
                          (long long)be);
    uint64_t rb_full, rb, off;
    if (!tdm_dtype_row_bytes(t->type, (uint64_t)cols, &rb_full))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "tensor '%s': row of %lld not a multiple of its block", name,
                          (long long)cols);
    tdm_dtype_row_bytes(t->type, (uint64_t)nc, &rb);
    tdm_dtype_row_bytes(t->type, (uint64_t)c0, &off);
    const size_t bytes = (size_t)rb * (size_t)nr;
    uint8_t *host = tdm_malloc(bytes ? bytes : 1);
    if (!host) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory splitting '%s'", name);
    for (int64_t i = 0; i < nr; i++)
        memcpy(host + (size_t)i * rb, (const uint8_t *)t->data + (size_t)(r0 + i) * rb_full + off, (size_t)rb);
    w->type = t->type;
    w->rows = nr;
    w->cols = nc;
    w->row_bytes = (size_t)rb;
    st = place_weight(m, host, true, t->type, nr, nc, bytes, use, w, err);
    free(host);
    m->n_params += (uint64_t)nr * (uint64_t)nc;
    m->weight_bytes += bytes;
    return st;
}

/* Matrices with the same cols stacked by rows into one weight.  Parts of one type
 * are copied as they are; mixed types (a Q4_K_M file's Q4_K q and k with a Q6_K v,
 * on a backend other than the host's: load_qkv) are converted to f16, or to f32 when
 * a value lies outside f16's range. */
static bool mixed_fits_f16(const tdm_gguf_tensor *const *t, const int64_t *row0, const int64_t *rows, int n,
                           int64_t cols, float *tmp) {
    for (int i = 0; i < n; i++) {
        uint64_t rb;
        tdm_dtype_row_bytes(t[i]->type, (uint64_t)cols, &rb);
        for (int64_t r = row0[i]; r < row0[i] + rows[i]; r++) {
            tdm_row_to_f32(t[i]->type, (const uint8_t *)t[i]->data + r * rb, tmp, cols);
            for (int64_t k = 0; k < cols; k++)
                if (!(fabsf(tmp[k]) <= 65504.0f)) return false;
        }
    }
    return true;
}

/* Part i is rows [row0[i], row0[i] + rows[i]) of tensor t[i] (found and checked:
 * at least that many rows of cols, names[i] its name). */
static tandem_status fuse_parts(tdm_model *m, const tdm_gguf_tensor *const *t, const char *const *names,
                                const int64_t *row0, const int64_t *rows, int n, int64_t cols, unsigned use,
                                tdm_weight *w, tdm_err *err) {
    tandem_status st;
    int64_t total_rows = 0;
    bool same = true;
    for (int i = 0; i < n; i++) {
        total_rows += rows[i];
        if (t[i]->type != t[0]->type) same = false;
        uint64_t rb;
        if (!tdm_dtype_row_bytes(t[i]->type, (uint64_t)cols, &rb))
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "tensor '%s': row of %lld not a multiple of its block",
                              names[i], (long long)cols);
    }
    float *tmp = same ? NULL : tdm_mallocarray((size_t)cols, sizeof(float));
    if (!same && !tmp) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory fusing '%s'", names[0]);
    uint32_t type = same ? t[0]->type : mixed_fits_f16(t, row0, rows, n, cols, tmp) ? TDM_F16 : TDM_F32;
    uint64_t rb;
    tdm_dtype_row_bytes(type, (uint64_t)cols, &rb);
    size_t bytes = (size_t)rb * (size_t)total_rows;
    uint8_t *host = tdm_malloc(bytes);
    if (!host) {
        free(tmp);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory fusing '%s'", names[0]);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t src_rb;
        tdm_dtype_row_bytes(t[i]->type, (uint64_t)cols, &src_rb);
        const uint8_t *src = (const uint8_t *)t[i]->data + (size_t)row0[i] * src_rb;
        if (same) {
            memcpy(host + off, src, (size_t)rows[i] * rb);
            off += (size_t)rows[i] * rb;
        } else {
            for (int64_t r = 0; r < rows[i]; r++) {
                tdm_row_to_f32(t[i]->type, src + (size_t)r * src_rb, tmp, cols);
                tdm_row_from_f32(type, tmp, host + off, cols);
                off += (size_t)rb;
            }
        }
        tdm_gguf_release(m->gguf, src, (size_t)rows[i] * src_rb); /* (not read again) */
        m->n_params += (uint64_t)rows[i] * (uint64_t)cols;
        m->weight_bytes += src_rb * (uint64_t)rows[i];
    }
    free(tmp);
    w->type = type;
    w->rows = total_rows;
    w->cols = cols;
    w->row_bytes = (size_t)rb;
    st = place_weight(m, host, true, type, total_rows, cols, bytes, use, w, err);
    free(host);
    return st;
}

/* Part i is rows [row0[i], row0[i] + rows[i]) of names[i] ([full_rows[i]][cols]). */
static tandem_status load_fused(tdm_model *m, const char *const *names, const int64_t *full_rows, const int64_t *row0,
                                const int64_t *rows, int n, int64_t cols, tdm_weight *w, tdm_err *err) {
    const tdm_gguf_tensor *t[4];
    tandem_status st;
    for (int i = 0; i < n; i++)
        if ((st = find_tensor(m, names[i], cols, full_rows[i], false, &t[i], err))) return st;
    return fuse_parts(m, t, names, row0, rows, n, cols, W_MATMUL | W_BLOCK, w, err);
}

/* Layer l's mixture of experts (llama.cpp's layout): the router
 * blk.l.ffn_gate_inp [n_embd, n_expert], and the experts' blk.l.ffn_gate_exps /
 * ffn_up_exps [n_embd, n_ff, n_expert] and ffn_down_exps [n_ff, n_embd, n_expert],
 * any supported type each (the sizes are the shapes' and the types', checked; the
 * GGUF reader checked that each tensor's bytes lie in the file).  Each expert's gate
 * and up rows are fused into one weight, its down matrix placed as it is. */
static tandem_status load_experts(tdm_model *m, int32_t l, tdm_layer *L, tdm_weight *w13, tdm_weight *w2,
                                  tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, F = hp->n_ff, NE = hp->n_expert;
    char nr[96], ng[96], nu[96], nd[96];
    snprintf(nr, sizeof nr, "blk.%d.ffn_gate_inp.weight", (int)l);
    snprintf(ng, sizeof ng, "blk.%d.ffn_gate_exps.weight", (int)l);
    snprintf(nu, sizeof nu, "blk.%d.ffn_up_exps.weight", (int)l);
    snprintf(nd, sizeof nd, "blk.%d.ffn_down_exps.weight", (int)l);
    tandem_status st;
    if ((st = load_mat(m, nr, E, NE, W_MATMUL, &L->router, err))) return st;
    const tdm_gguf_tensor *tg, *tu, *td;
    if ((st = find_tensor_nd(m, ng, E, F, NE, false, &tg, err)) || (st = find_tensor_nd(m, nu, E, F, NE, false, &tu, err)) ||
        (st = find_tensor_nd(m, nd, F, E, NE, false, &td, err)))
        return st;
    uint64_t rb_d;
    if (!tdm_dtype_row_bytes(td->type, (uint64_t)F, &rb_d))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "tensor '%s': row of %lld not a multiple of its block", nd,
                          (long long)F);
    const tdm_gguf_tensor *gu[2] = {tg, tu};
    const char *names[2] = {ng, nu};
    for (int64_t e = 0; e < NE; e++) {
        const int64_t r0[2] = {e * F, e * F}, rows[2] = {F, F};
        if ((st = fuse_parts(m, gu, names, r0, rows, 2, E, W_MATMUL, &w13[e], err))) return st;
        tdm_weight *d = &w2[e];
        d->type = td->type;
        d->rows = E;
        d->cols = F;
        d->row_bytes = (size_t)rb_d;
        const size_t bytes = (size_t)rb_d * (size_t)E;
        if ((st = place_weight(m, (const uint8_t *)td->data + (size_t)e * bytes, false, td->type, E, F, bytes, W_MATMUL, d,
                               err)))
            return st;
        m->n_params += (uint64_t)E * (uint64_t)F;
        m->weight_bytes += bytes;
    }
    L->exp_w13 = w13;
    L->exp_w2 = w2;
    return TANDEM_OK;
}

/* A block's q, k and v weights (names[3], part i rows [row0[i], row0[i] + rows[i]) of
 * [full_rows[i]][cols]): fused into wqkv when the three have one type, or the backend
 * is not the host's (mixed types then become f16, load_fused); on the host, mixed
 * types stay the file's, as wq, wk and wv (tdm_qkv_split): its direct kernels read a
 * Q4_K_M file's Q4_K and Q6_K blocks in place, where an f16 copy of the three is about
 * 3.4 times their bytes read per token. */
static tandem_status load_qkv(tdm_model *m, const char *const *names, const int64_t *full_rows, const int64_t *row0,
                              const int64_t *rows, int64_t cols, tdm_layer *L, tdm_err *err) {
    bool same = true;
    const tdm_gguf_tensor *t0 = tdm_gguf_find_tensor(m->gguf, names[0]);
    for (int i = 1; i < 3 && t0; i++) {
        const tdm_gguf_tensor *t = tdm_gguf_find_tensor(m->gguf, names[i]);
        if (t && t->type != t0->type) same = false;
    }
    if (same || !is_host_backend(m->be)) return load_fused(m, names, full_rows, row0, rows, 3, cols, &L->wqkv, err);
    memset(&L->wqkv, 0, sizeof L->wqkv);
    tdm_weight *w[3] = {&L->wq, &L->wk, &L->wv};
    for (int i = 0; i < 3; i++) {
        tandem_status st = load_mat_part(m, names[i], cols, full_rows[i], row0[i], rows[i], 0, cols, W_MATMUL | W_BLOCK, w[i], err);
        if (st) return st;
    }
    return TANDEM_OK;
}

/* The output head's quantised copy (qhead.h) on backends with int8 dot products,
 * quantised in place (host backends only), unless the backend reads the head's own
 * blocks directly (tdm_backend.direct_types: the copy would be a second, larger one).
 * Optional: a head it cannot bound (non-finite weights) is simply not copied. */
static tandem_status load_qhead(tdm_model *m, tdm_err *err) {
    if (!m->be->int8_dot || !is_host_backend(m->be)) return TANDEM_OK;
    if (m->output.type < 32 && (m->be->direct_types >> m->output.type & 1u)) return TANDEM_OK;
    size_t bytes = tdm_qhead_bytes(m->output.rows, m->output.cols);
    if (bytes == 0) return TANDEM_OK;
    void *buf;
    tandem_status st = alloc_owned(m, bytes, &buf, err);
    if (st) return st;
    tdm_err qerr;
    st = tdm_qhead_fill(&m->output, buf, &qerr);
    if (st == TANDEM_ERR_NOMEM) return tdm_seterr(err, st, "%s", qerr.msg);
    if (st == TANDEM_OK) {
        tdm_qhead_place(&m->qhead, m->output.rows, m->output.cols, buf);
        m->has_qhead = true;
        /* The fill read every row of the mapped file's head; from now on a token reads
         * the quantised copy and only a few exact rows (head_argmax), so the file's
         * pages are dropped rather than held beside it (they come back on demand). */
        tdm_gguf_release(m->gguf, m->output.data, (size_t)m->output.rows * m->output.row_bytes);
    }
    return TANDEM_OK; /* (the unused buffer is freed with the model) */
}

/* A RoPE frequency table ([n_rot / 2] doubles) in backend memory. */
static tandem_status place_rope_table(tdm_model *m, const tdm_rope_params *rp, const float *ff, const double **out,
                                      tdm_err *err) {
    const int32_t half = rp->n_rot / 2;
    double *host = tdm_mallocarray((size_t)half, sizeof(double));
    if (!host) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    tdm_rope_table(&m->hp.rope_scaling, rp->n_rot, rp->freq_base, rp->freq_scale, ff, host);
    void *dev;
    tandem_status st = alloc_owned(m, (size_t)half * sizeof(double), &dev, err);
    if (!st) st = m->be->ops->upload(m->be, dev, host, (size_t)half * sizeof(double), err);
    free(host);
    if (!st) *out = dev;
    return st;
}

/* The RoPE tables of hp.rope and hp.rope_swa, with Llama 3's per-pair divisors
 * (rope_freqs.weight, [n_rot / 2], positive) when the file has them. */
static tandem_status load_rope(tdm_model *m, tdm_err *err) {
    tdm_hparams *hp = &m->hp;
    const int32_t half = hp->rope.n_rot / 2;
    float *ff = NULL;
    tandem_status st;
    if (hp->rope_freqs) {
        const tdm_gguf_tensor *t;
        if ((st = find_tensor(m, "rope_freqs.weight", half, 0, false, &t, err))) return st;
        if (half % tdm_dtype_block_elems(t->type))
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "tensor 'rope_freqs.weight': size not a multiple of its block");
        if (!(ff = tdm_mallocarray((size_t)half, sizeof(float)))) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        tdm_row_to_f32(t->type, t->data, ff, half);
        for (int32_t i = 0; i < half; i++)
            if (!(ff[i] > 0 && isfinite(ff[i]))) {
                st = tdm_seterr(err, TANDEM_ERR_FORMAT, "tensor 'rope_freqs.weight': factor %d is %g (must be positive)",
                                (int)i, (double)ff[i]);
                free(ff);
                return st;
            }
    }
    st = place_rope_table(m, &hp->rope, ff, &hp->rope.freq, err);
    free(ff);
    if (st) return st;
    if (hp->arch_id != TDM_ARCH_GEMMA3) {
        hp->rope_swa.freq = hp->rope.freq; /* (the same parameters) */
        return TANDEM_OK;
    }
    return place_rope_table(m, &hp->rope_swa, NULL, &hp->rope_swa.freq, err);
}

/* Every weight; of a split model's rank (tp.h) its part: hp is the rank's shape,
 * hp_full the file's. */
static tandem_status load_weights(tdm_model *m, tdm_err *err) {
    const tdm_hparams *hp = &m->hp, *hf = &m->hp_full;
    tandem_status st;
    const bool split = m->tp_size > 0;
    const int64_t E = hp->n_embd, V = hp->n_vocab, hd = hp->head_dim, r = split ? m->tp_rank : 0;
    /* the rank's rows / columns: its query heads, KV heads and FFN features */
    const int64_t qd_full = (int64_t)hf->n_head * hd, kvd_full = (int64_t)hf->n_head_kv * hd, F_full = hf->n_ff;
    const int64_t qd = (int64_t)hp->n_head * hd, kvd = (int64_t)hp->n_head_kv * hd, F = hp->n_ff;
    const int64_t q0 = r * qd, kv0 = r * kvd, f0 = r * F;

    if ((st = load_mat(m, "token_embd.weight", E, V, 0, &m->tok_embd, err))) return st;
    if ((st = load_vec(m, "output_norm.weight", E, false, &m->out_norm, err))) return st;
    if (split) { /* its vocabulary rows of the head (tied: of the embedding) */
        int32_t v0, nv;
        tdm_tp_vocab_part(hp->n_vocab, m->tp_size, m->tp_rank, &v0, &nv);
        m->vocab0 = v0;
        if ((st = load_mat_part(m, hp->tied_output ? "token_embd.weight" : "output.weight", E, V, v0, nv, 0, E, 0,
                                &m->output, err)))
            return st;
    } else if (hp->tied_output) {
        m->output = m->tok_embd;
    } else if ((st = load_mat(m, "output.weight", E, V, 0, &m->output, err))) {
        return st;
    }
    if (!split && (st = load_qhead(m, err))) return st;
    if ((st = load_rope(m, err))) return st;
    m->layers = tdm_calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    if (hp->n_expert > 0 &&
        !(m->experts = tdm_calloc((size_t)hp->n_layer * 2 * (size_t)hp->n_expert, sizeof *m->experts)))
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    char n0[96], n1[96], n2[96];
    for (int32_t l = 0; l < hp->n_layer; l++) {
        tdm_layer *L = &m->layers[l];
#define NAME(buf, s) snprintf(buf, sizeof buf, "blk.%d." s, (int)l)
        NAME(n0, "attn_norm.weight");
        if ((st = load_vec(m, n0, E, false, &L->attn_norm, err))) return st;
        NAME(n0, "attn_q.weight");
        NAME(n1, "attn_k.weight");
        NAME(n2, "attn_v.weight");
        const char *qkv[3] = {n0, n1, n2};
        const int64_t qkv_full[3] = {qd_full, kvd_full, kvd_full}, qkv_0[3] = {q0, kv0, kv0}, qkv_n[3] = {qd, kvd, kvd};
        if ((st = load_qkv(m, qkv, qkv_full, qkv_0, qkv_n, E, L, err))) return st;
        if (hp->qkv_bias) {
            const float *bq, *bk, *bv;
            NAME(n0, "attn_q.bias");
            NAME(n1, "attn_k.bias");
            NAME(n2, "attn_v.bias");
            if ((st = load_vec_part(m, n0, qd_full, q0, qd, false, &bq, err)) ||
                (st = load_vec_part(m, n1, kvd_full, kv0, kvd, false, &bk, err)) ||
                (st = load_vec_part(m, n2, kvd_full, kv0, kvd, false, &bv, err)))
                return st;
            /* concatenate the three f32 vectors */
            size_t nb = (size_t)(qd + 2 * kvd) * sizeof(float);
            float *host = tdm_malloc(nb);
            if (!host) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
            st = m->be->ops->download(m->be, host, bq, (size_t)qd * 4, err);
            if (!st) st = m->be->ops->download(m->be, host + qd, bk, (size_t)kvd * 4, err);
            if (!st) st = m->be->ops->download(m->be, host + qd + kvd, bv, (size_t)kvd * 4, err);
            void *dev = NULL;
            if (!st) st = alloc_owned(m, nb, &dev, err);
            if (!st) st = m->be->ops->upload(m->be, dev, host, nb, err);
            free(host);
            if (st) return st;
            L->bqkv = dev;
        }
        if (hp->qk_norm) {
            NAME(n0, "attn_q_norm.weight");
            NAME(n1, "attn_k_norm.weight");
            if ((st = load_vec(m, n0, hp->head_dim, false, &L->q_norm, err)) ||
                (st = load_vec(m, n1, hp->head_dim, false, &L->k_norm, err)))
                return st;
        }
        NAME(n0, "attn_output.weight");
        if ((st = load_mat_part(m, n0, qd_full, E, 0, E, q0, qd, W_MATMUL | W_BLOCK, &L->wo, err))) return st;
        if (hp->post_norms) {
            NAME(n0, "post_attention_norm.weight");
            NAME(n1, "post_ffw_norm.weight");
            if ((st = load_vec(m, n0, E, false, &L->attn_post_norm, err)) ||
                (st = load_vec(m, n1, E, false, &L->ffn_post_norm, err)))
                return st;
        }
        NAME(n0, "ffn_norm.weight");
        if ((st = load_vec(m, n0, E, false, &L->ffn_norm, err))) return st;
        if (hp->n_expert > 0) {
            tdm_weight *w13 = m->experts + (size_t)l * 2 * (size_t)hp->n_expert;
            if ((st = load_experts(m, l, L, w13, w13 + hp->n_expert, err))) return st;
            continue;
        }
        NAME(n0, "ffn_gate.weight");
        NAME(n1, "ffn_up.weight");
        const char *gu[2] = {n0, n1};
        const int64_t gu_full[2] = {F_full, F_full}, gu_0[2] = {f0, f0}, gu_n[2] = {F, F};
        if ((st = load_fused(m, gu, gu_full, gu_0, gu_n, 2, E, &L->w13, err))) return st;
        NAME(n0, "ffn_down.weight");
        if ((st = load_mat_part(m, n0, F_full, E, 0, E, f0, F, W_MATMUL | W_BLOCK, &L->w2, err))) return st;
#undef NAME
    }
    return TANDEM_OK;
}

tandem_status tdm_model_load_gguf(tdm_gguf *g, tdm_backend *be, tdm_model **out, tdm_err *err) {
    return tdm_model_load_rank(g, be, -1, 0, NULL, out, err);
}

tandem_status tdm_model_load_rank(tdm_gguf *g, tdm_backend *be, int32_t rank, int32_t n, const tdm_load_opts *pr,
                                  tdm_model **out, tdm_err *err) {
    *out = NULL;
    tdm_model *m = calloc(1, sizeof *m);
    if (!m) {
        tdm_gguf_close(g);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    m->gguf = g;
    m->be = be;
    m->load_opts = pr;
    m->fp8 = pr && pr->fp8;
    tandem_status st = tdm_hparams_read(g, &m->hp, err);
    m->hp_full = m->hp;
    if (!st && rank >= 0) { /* the rank's shape (tp.h) */
        if (!(st = tdm_tp_check(&m->hp, n, err)) && (rank >= n))
            st = tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "rank %d of %d", (int)rank, (int)n);
        m->tp_rank = rank;
        m->tp_size = n;
        if (!st) {
            m->hp.n_head /= n;
            m->hp.n_head_kv /= n;
            m->hp.n_ff /= n;
        }
    }
    if (!st && m->hp.arch_id == TDM_ARCH_EAGLE3)
        st = tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "the file is an EAGLE-3 draft head (architecture eagle3), not a "
                        "model: it drafts beside a target (-d FILE)");
    if (!st) st = tdm_model_check_backend(m, be, err);
    if (!st) st = tdm_tokenizer_load(g, &m->tok, err);
    if (!st && tdm_tok_n_vocab(m->tok) > m->hp.n_vocab)
        st = tdm_seterr(err, TANDEM_ERR_FORMAT, "tokenizer has %d tokens but the model's vocab_size is %d",
                        (int)tdm_tok_n_vocab(m->tok), (int)m->hp.n_vocab);
    if (!st) st = load_weights(m, err);
    if (!st) st = report_progress(m, 1.0f, err);
    m->load_opts = NULL;
    if (st) {
        tdm_model_free(m);
        return st;
    }
    tdm_gguf_str name;
    const tdm_gguf_value *nv = tdm_gguf_find(g, "general.name");
    if (nv && nv->type == TDM_GGUF_STRING && tdm_gguf_get_str(g, "general.name", &name, NULL) == TANDEM_OK)
        snprintf(m->name, sizeof m->name, "%.*s", (int)TDM_MIN(name.len, 127), name.ptr);
    *out = m;
    return TANDEM_OK;
}

tandem_status tdm_model_load(const char *path, tdm_backend *be, tdm_model **out, tdm_err *err) {
    return tdm_model_load_opts(path, be, NULL, out, err);
}

tandem_status tdm_model_load_opts(const char *path, tdm_backend *be, const tdm_load_opts *pr,
                                      tdm_model **out, tdm_err *err) {
    *out = NULL;
    tdm_gguf *g;
    tandem_status st = tdm_gguf_open(path, &g, err);
    if (!st) st = tdm_model_load_rank(g, be, -1, 0, pr, out, err);
    if (st) return st;
    const char *base = strrchr(path, '/');
    snprintf((*out)->file, sizeof (*out)->file, "%s", base ? base + 1 : path);
    return TANDEM_OK;
}

tandem_status tdm_model_check_backend(const tdm_model *m, const tdm_backend *be, tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    const tdm_backend_ops *op = be->ops;
    const char *what = NULL, *missing = NULL;
    if (hp->n_expert > 0 && !be->host_memory && (!op->moe_route || !op->moe_experts)) what = "mixture of experts";
    else if (hp->swa_window > 0 && !be->attn_window_softcap) what = "sliding-window attention";
    else if (hp->attn_softcap > 0 && !be->attn_window_softcap) what = "attention logit soft-capping";
    else if (hp->qk_norm && !op->head_rmsnorm) missing = "head_rmsnorm";
    else if (hp->ffn_act == TDM_ACT_GELU_TANH && !op->geglu) missing = "geglu";
    else if (hp->post_norms && !op->add) missing = "add";
    else if (hp->embd_scale != 1.0f && !op->scale) missing = "scale";
    else if (hp->final_softcap > 0 && !op->softcap) missing = "softcap";
    if (!what && !missing) return TANDEM_OK;
    char who[200]; /* "model 'name' (arch)", or "arch model" while loading */
    if (m->file[0] || m->name[0])
        snprintf(who, sizeof who, "model '%s' (%s)", tdm_model_label(m), hp->arch);
    else
        snprintf(who, sizeof who, "%s model", hp->arch);
    if (what)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s: %s is not yet on the %s backend", who, what, op->name);
    return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s: the %s backend has no %s op", who, op->name, missing);
}

const char *tdm_model_label(const tdm_model *m) {
    if (m->file[0]) return m->file;
    return m->name[0] ? m->name : "unnamed";
}

void tdm_model_free(tdm_model *m) {
    if (!m) return;
    tdm_tp_group *g = m->tp;
    if (g) { /* the other ranks, each on its device */
        for (int32_t r = 1; r < g->n; r++) {
            if (!g->rank[r] && !(g->owns_be && g->be[r])) continue;
            (void)tdm_backend_activate(g->be[r], NULL);
            tdm_model_free(g->rank[r]);
            if (g->owns_be) tdm_backend_destroy(g->be[r]);
        }
        tdm_collective_destroy(g->coll);
        free(g);
        m->tp = NULL;
        if (m->be) (void)tdm_backend_activate(m->be, NULL);
    }
    for (int32_t i = 0; i < m->n_owned; i++) m->be->ops->free(m->be, m->owned[i]);
    free(m->owned);
    free(m->layers);
    free(m->experts);
    tdm_tokenizer_free(m->tok);
    tdm_gguf_close(m->gguf);
    free(m);
}

/* ------------------------------------------------------------ for other formats */

tandem_status tdm_model_load_mat(tdm_model *m, const char *name, int64_t cols, int64_t rows, bool matmul_only,
                                 tdm_weight *w, tdm_err *err) {
    return load_mat(m, name, cols, rows, matmul_only, w, err);
}

tandem_status tdm_model_load_vec(tdm_model *m, const char *name, int64_t n, bool optional, const float **out,
                                 tdm_err *err) {
    return load_vec(m, name, n, optional, out, err);
}

tandem_status tdm_model_place(tdm_model *m, const void *src, bool matmul_only, tdm_weight *w, tdm_err *err) {
    const size_t bytes = w->row_bytes * (size_t)w->rows;
    tandem_status st = place_weight(m, src, true, w->type, w->rows, w->cols, bytes, matmul_only, w, err);
    if (st) return st;
    m->n_params += (uint64_t)w->rows * (uint64_t)w->cols;
    m->weight_bytes += bytes;
    return TANDEM_OK;
}

tandem_status tdm_model_load_rope(tdm_model *m, tdm_err *err) { return load_rope(m, err); }

tandem_status tdm_model_alloc(tdm_model *m, size_t bytes, void **out, tdm_err *err) {
    return alloc_owned(m, bytes, out, err);
}
