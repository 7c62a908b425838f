/* cuda_kv_move.cu - the kv_move op on the GPU: a token tree's accepted path moved
 * into consecutive slots (each model's caches, every layer, in one launch; the pairs
 * in order, kernels/backend.h).  Every
 * source and destination slot is checked against the sequence on the host; f32,
 * f16, q8_0 and fp8 caches (q8_0, fp8: the slot's scales move with its quants,
 * src/base/kv_layout.h). */
#include "cuda_internal.h"
#include "cuda_kvq8.cuh"

/* Block (layer l * n_kv + kv head): the n pairs in order, each slot src[i]'s K and V
 * (and q8_0 / fp8 scales) to slot dst[i], bytes moved one element a thread, the block
 * synchronised between pairs (so a pair that overwrites a slot an earlier pair read
 * comes after that read: tdm_kv_move_args's in-order semantics; the (layer, head)
 * units of different blocks never overlap).  pairs: [n][4] = source block, source
 * position, destination block, destination position. */
__global__ void k_kv_move(const int32_t *pairs, int32_t n, uint8_t *const *kc, uint8_t *const *vc, int32_t n_kv,
                          int32_t hd, int32_t bs, int32_t esz, int64_t unit, bool q8) {
    TDM_PDL_ENTRY();
    const int32_t l = blockIdx.x / n_kv, g = blockIdx.x % n_kv;
    for (int32_t i = 0; i < n; i++) {
        const int32_t *p = pairs + 4 * i;
        if (p[0] == p[2] && p[1] == p[3]) continue; /* (in place; uniform over the block) */
        uint8_t *ks = kc[l] + ((int64_t)p[0] * n_kv + g) * unit, *kd = kc[l] + ((int64_t)p[2] * n_kv + g) * unit;
        uint8_t *vs = vc[l] + ((int64_t)p[0] * n_kv + g) * unit, *vd = vc[l] + ((int64_t)p[2] * n_kv + g) * unit;
        for (int32_t x = threadIdx.x; x < hd * esz; x += blockDim.x) {
            const int32_t d = x / esz, b = x % esz;
            kd[((int64_t)d * bs + p[3]) * esz + b] = ks[((int64_t)d * bs + p[1]) * esz + b];
            vd[(int64_t)p[3] * hd * esz + x] = vs[(int64_t)p[1] * hd * esz + x];
        }
        if (q8 && threadIdx.x < 4) {
            const int64_t so = tdm_kv_scale_off(bs, hd);
            kd[so + 4 * p[3] + threadIdx.x] = ks[so + 4 * p[1] + threadIdx.x];
            vd[so + 4 * p[3] + threadIdx.x] = vs[so + 4 * p[1] + threadIdx.x];
        }
        __syncthreads();
    }
}

tandem_status tdm_cuda_kv_move(tdm_backend *b, const tdm_kv_move_args *a, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "kv_move", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (!a || !a->seq || !a->src || !a->dst || !a->k_cache || !a->v_cache || a->n < 0 || a->n_layer <= 0 ||
        a->n_kv_head <= 0 || a->head_dim <= 0 || a->block_size <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_move: bad arguments");
    if (!tdm_kv_type_ok(a->cache_type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "kv_move: cache type %s", tdm_dtype_name(a->cache_type));
    if (a->n == 0) return TANDEM_OK;
    if ((int64_t)a->n_layer * a->n_kv_head > INT32_MAX)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "kv_move: %d layers x %d kv heads", (int)a->n_layer, (int)a->n_kv_head);
    const int32_t bs = a->block_size;
    /* pairs, then the layers' K and V cache pointers */
    const size_t pair_bytes = (size_t)a->n * 4 * sizeof(int32_t), ptr_bytes = 2 * (size_t)a->n_layer * sizeof(void *);
    const size_t pad = (pair_bytes + 15) & ~(size_t)15;
    uint8_t *h = (uint8_t *)tdm_cuda_meta_host(c, pad + ptr_bytes, err);
    if (!h) return err ? err->status : TANDEM_ERR_BACKEND;
    int32_t *pr = (int32_t *)h;
    for (int32_t i = 0; i < a->n; i++) {
        const int32_t s = a->src[i], d = a->dst[i];
        if (s < 0 || d < 0 || s >= a->seq->len || d >= a->seq->len || a->seq->blocks[s / bs] < 0 || a->seq->blocks[d / bs] < 0)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_move: slot %d to %d outside the sequence (len %d)", (int)s,
                              (int)d, (int)a->seq->len);
        pr[4 * i] = a->seq->blocks[s / bs], pr[4 * i + 1] = s % bs;
        pr[4 * i + 2] = a->seq->blocks[d / bs], pr[4 * i + 3] = d % bs;
    }
    void **ptrs = (void **)(h + pad);
    for (int32_t l = 0; l < a->n_layer; l++) ptrs[l] = a->k_cache[l], ptrs[a->n_layer + l] = a->v_cache[l];
    const uint8_t *dev = (const uint8_t *)tdm_cuda_meta_upload(c, pad + ptr_bytes, err);
    if (!dev) return err ? err->status : TANDEM_ERR_BACKEND;
    uint8_t *const *kp = (uint8_t *const *)(dev + pad), *const *vp = kp + a->n_layer;
    const unsigned grid = (unsigned)(a->n_layer * a->n_kv_head);
    tdm_launch(k_kv_move, grid, 128, 0, c->stream, (const int32_t *)dev, a->n, kp, vp, a->n_kv_head, a->head_dim, bs,
                                           tdm_kv_elem_bytes(a->cache_type), tdm_kv_unit_bytes(a->cache_type, bs, a->head_dim),
                                           tdm_kv_scaled(a->cache_type));
    TDM_CU_LAUNCHED("kv_move");
    return TANDEM_OK;
}
