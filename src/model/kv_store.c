/* kv_store.c - a model's K/V storage for the blocks of a pool (model.h): its
 * layout, allocation (a chain of one store per rank for a split model, tp.h), and
 * the block copies and slot moves that act on every rank. */
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "tp.h"

/* ------------------------------------------------------------ KV storage */

tdm_kv_layout tdm_model_kv_layout(const tdm_model *m, uint32_t type) {
    tdm_kv_layout l = {m->hp.n_layer, m->hp.n_head_kv, m->hp.head_dim, type};
    return l;
}

uint64_t tdm_kv_bytes_per_token(const tdm_kv_layout *l, int32_t block_size) {
    size_t b = tdm_kv_bytes_per_block(l, 1, block_size);
    return block_size > 0 ? (uint64_t)b / (uint64_t)block_size : 0;
}

/* Bytes of one block of one layer's K (or V) cache of s: its n_kv_head units. */
static size_t kv_store_block_bytes(const tdm_kv_store *s) {
    return (size_t)s->n_kv_head * (size_t)tdm_kv_unit_bytes(s->type, s->block_size, s->head_dim);
}

static tandem_status kv_store_init_one(tdm_kv_store *s, const tdm_model *m, tdm_backend *be, uint32_t type,
                                       int32_t n_blocks, int32_t block_size, tdm_err *err);

tandem_status tdm_kv_store_init(tdm_kv_store *s, const tdm_model *m, tdm_backend *be, uint32_t type,
                                int32_t n_blocks, int32_t block_size, tdm_err *err) {
    tandem_status st = kv_store_init_one(s, m, be, type, n_blocks, block_size, err);
    if (st || !m->tp) return st;
    /* a split model: the other ranks' KV heads of the same blocks, on their devices */
    const tdm_tp_group *g = m->tp;
    tdm_kv_store *prev = s;
    for (int32_t r = 1; r < g->n && !st; r++) {
        tdm_kv_store *sr = calloc(1, sizeof *sr);
        if (!sr) {
            st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
            break;
        }
        tdm_backend *br = tdm_tp_rank_be(g, r, be);
        if ((st = tdm_backend_activate(br, err)) ||
            (st = kv_store_init_one(sr, g->rank[r], br, type, n_blocks, block_size, err))) {
            free(sr);
            break;
        }
        prev->tp_next = sr;
        prev = sr;
    }
    tandem_status st0 = tdm_backend_activate(be, st ? NULL : err);
    if (!st) st = st0;
    if (st) tdm_kv_store_free(s);
    return st;
}

static tandem_status kv_store_init_one(tdm_kv_store *s, const tdm_model *m, tdm_backend *be, uint32_t type,
                                       int32_t n_blocks, int32_t block_size, tdm_err *err) {
    memset(s, 0, sizeof *s);
    if (!tdm_kv_type_ok(type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "KV cache type %s", tdm_dtype_name(type));
    const tdm_kv_layout lay = tdm_model_kv_layout(m, type);
    if (n_blocks < 0 || block_size <= 0 || tdm_kv_bytes_per_block(&lay, 1, block_size) == 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "KV cache of %d blocks of %d slots", (int)n_blocks,
                          (int)block_size);
    s->be = be;
    s->type = type;
    s->n_layer = m->hp.n_layer;
    s->n_kv_head = m->hp.n_head_kv;
    s->head_dim = m->hp.head_dim;
    s->block_size = block_size;
    s->n_blocks = n_blocks;
    s->k = tdm_calloc((size_t)s->n_layer, sizeof(void *));
    s->v = tdm_calloc((size_t)s->n_layer, sizeof(void *));
    if (!s->k || !s->v) {
        tdm_kv_store_free(s);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    size_t per_layer;
    if (tdm_mul_overflow_size((size_t)n_blocks, kv_store_block_bytes(s), &per_layer)) {
        tdm_kv_store_free(s);
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "KV cache size overflows");
    }
    for (int32_t l = 0; l < s->n_layer; l++) {
        tandem_status st = be->ops->alloc(be, per_layer, &s->k[l], err);
        if (!st) st = be->ops->alloc(be, per_layer, &s->v[l], err);
        if (st) {
            tdm_kv_store_free(s);
            return st;
        }
    }
    return TANDEM_OK;
}

void tdm_kv_store_free(tdm_kv_store *s) {
    if (!s) return;
    if (s->tp_next) {
        tdm_kv_store *next = s->tp_next;
        s->tp_next = NULL;
        (void)tdm_backend_activate(next->be, NULL);
        tdm_kv_store_free(next);
        free(next);
        if (s->be) (void)tdm_backend_activate(s->be, NULL);
    }
    if (!s->be) return;
    for (int32_t l = 0; l < s->n_layer; l++) {
        if (s->k && s->k[l]) s->be->ops->free(s->be, s->k[l]);
        if (s->v && s->v[l]) s->be->ops->free(s->be, s->v[l]);
    }
    free(s->k);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static tandem_status copy_block_one(tdm_kv_store *s, int32_t src, int32_t dst, tdm_err *err);

/* fn on every rank's store of a chain, each with its device current (rank 0's
 * again at the end). */
#define FOR_EACH_RANK(s, call)                                                             \
    do {                                                                                   \
        tandem_status st_ = TANDEM_OK;                                                     \
        for (tdm_kv_store *r_ = (s); r_ && !st_; r_ = r_->tp_next) {                       \
            if ((s)->tp_next) st_ = tdm_backend_activate(r_->be, err);                     \
            if (!st_) st_ = call;                                                          \
        }                                                                                  \
        if ((s)->tp_next) {                                                                \
            tandem_status a_ = tdm_backend_activate((s)->be, st_ ? NULL : err);            \
            if (!st_) st_ = a_;                                                            \
        }                                                                                  \
        return st_;                                                                        \
    } while (0)

tandem_status tdm_kv_store_copy_block(tdm_kv_store *s, int32_t src, int32_t dst, tdm_err *err) {
    FOR_EACH_RANK(s, copy_block_one(r_, src, dst, err));
}

static tandem_status copy_block_one(tdm_kv_store *s, int32_t src, int32_t dst, tdm_err *err) {
    const size_t bb = kv_store_block_bytes(s);
    for (int32_t l = 0; l < s->n_layer; l++) {
        tandem_status st = s->be->ops->copy(s->be, (uint8_t *)s->k[l] + (size_t)dst * bb,
                                            (const uint8_t *)s->k[l] + (size_t)src * bb, bb, err);
        if (!st)
            st = s->be->ops->copy(s->be, (uint8_t *)s->v[l] + (size_t)dst * bb,
                                  (const uint8_t *)s->v[l] + (size_t)src * bb, bb, err);
        if (st) return st;
    }
    return TANDEM_OK;
}

/* n bytes from src to dst in backend memory (directly on host memory). */
static tandem_status copy_bytes(tdm_backend *be, uint8_t *dst, const uint8_t *src, size_t n, tdm_err *err) {
    if (!be->host_memory) return be->ops->copy(be, dst, src, n, err);
    memcpy(dst, src, n);
    return TANDEM_OK;
}

static tandem_status move_slots_one(tdm_kv_store *s, const tdm_kv_seq *seq, const int32_t *src, const int32_t *dst,
                                     int32_t n, tdm_err *err);

tandem_status tdm_kv_store_move_slots(tdm_kv_store *s, const tdm_kv_seq *seq, const int32_t *src, const int32_t *dst,
                                      int32_t n, tdm_err *err) {
    FOR_EACH_RANK(s, move_slots_one(r_, seq, src, dst, n, err));
}

static tandem_status move_slots_one(tdm_kv_store *s, const tdm_kv_seq *seq, const int32_t *src, const int32_t *dst,
                                     int32_t n, tdm_err *err) {
    for (int32_t i = 0; i < n; i++)
        if (src[i] < 0 || dst[i] < 0 || src[i] >= seq->len || dst[i] >= seq->len)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "KV move of slot %d to %d outside the sequence's %d",
                              (int)src[i], (int)dst[i], (int)seq->len);
    if (n == 0) return TANDEM_OK;
    if (s->be->ops->kv_move) {
        const tdm_kv_move_args a = {seq, src, dst, n, s->k, s->v, s->n_layer, s->type, s->n_kv_head, s->head_dim,
                                    s->block_size};
        return s->be->ops->kv_move(s->be, &a, err);
    }
    const int32_t bs = s->block_size, hd = s->head_dim;
    const int64_t unit = tdm_kv_unit_bytes(s->type, bs, hd), esz = tdm_kv_elem_bytes(s->type);
    const int64_t so = tdm_kv_scale_off(bs, hd);
    tandem_status st = TANDEM_OK;
    for (int32_t l = 0; l < s->n_layer && !st; l++)
        for (int32_t i = 0; i < n && !st; i++) {
            if (src[i] == dst[i]) continue;
            const int32_t ps = src[i] % bs, pd = dst[i] % bs;
            for (int32_t g = 0; g < s->n_kv_head && !st; g++) {
                const int64_t su = ((int64_t)seq->blocks[src[i] / bs] * s->n_kv_head + g) * unit;
                const int64_t du = ((int64_t)seq->blocks[dst[i] / bs] * s->n_kv_head + g) * unit;
                uint8_t *k = (uint8_t *)s->k[l], *v = (uint8_t *)s->v[l];
                /* K: [hd][bs], one element per d; V: [bs][hd], one run */
                for (int32_t d = 0; d < hd && !st; d++)
                    st = copy_bytes(s->be, k + du + ((int64_t)d * bs + pd) * esz, k + su + ((int64_t)d * bs + ps) * esz,
                                    (size_t)esz, err);
                if (!st)
                    st = copy_bytes(s->be, v + du + (int64_t)pd * hd * esz, v + su + (int64_t)ps * hd * esz,
                                    (size_t)(hd * esz), err);
                const bool scaled = tdm_kv_scaled(s->type); /* (q8_0, fp8: the slot's scales too) */
                if (scaled && !st) st = copy_bytes(s->be, k + du + so + 4 * pd, k + su + so + 4 * ps, 4, err);
                if (scaled && !st) st = copy_bytes(s->be, v + du + so + 4 * pd, v + su + so + 4 * ps, 4, err);
            }
        }
    return st;
}
