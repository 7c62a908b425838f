/* cuda_tree_attn.cu - attention of token-tree batches on the GPU for the shapes
 * the tiled kernels (cuda_flash.cu, which take tree masks too) do not run: f32
 * caches, head dim 32, or TANDEM_CUDA_TREE_FLASH=0 (tdm_cuda_attention_on routes).
 * Also the kv_move op (a tree's accepted path moved into consecutive slots).
 *
 * Tree attention: a row sees slots [0, n_visible) of its sequence and the slots
 * n_visible + j of the bits j of its tree mask.  The host expands each row's mask
 * into its list of extra slots and packs, per row, [n_visible, n_extra, first
 * extra, block table offset], then the extra slots, then the block tables of the
 * batch's sequences, checked there (every slot a row reads is backed by a block),
 * and uploads it once.  One thread block of TREE_WARPS warps per (row, head):
 *   - q (HD floats, the head dim a template parameter) in shared memory;
 *   - warp w takes the tiles of 32 visible keys w, w + TREE_WARPS, ...: lane l
 *     scores key 32 t + l (scale q . K, K read through the block table: a
 *     block's keys side by side for each d, so a warp's loads of one d are
 *     consecutive), then the warp updates its running max, normaliser and
 *     weighted sum of V (lanes over d: V rows are contiguous) - an online softmax;
 *   - the warps' partial results are merged in warp order.
 * q8_0 caches: scores and weights times the slots' scales, as the CPU does
 * (kernels/kv_layout.h).  Head dims 32, 64, 96, 128, 256; others are refused with
 * TANDEM_ERR_UNSUPPORTED, as are sliding windows, soft-capping and tree batches
 * that also carry CSR extra slots. */
#include <cuda_fp16.h>
#include <math.h>

#include "cuda_internal.h"
#include "cuda_kvq8.cuh"

#define TREE_WARPS 4
enum { TREE_ROW_INTS = 4 };

typedef struct tree_meta {
    const int32_t *rows;  /* [n_rows][TREE_ROW_INTS] */
    const int32_t *extra; /* extra slots of every row */
    const int32_t *tabs;  /* block tables */
} tree_meta;

/* The row's extra slots, from its tree mask: n_visible + j for the set bits j. */
static int32_t mask_slots(uint64_t m, int32_t nv, int32_t *out) {
    int32_t n = 0;
    for (; m; m &= m - 1) out[n++] = nv + __builtin_ctzll(m);
    return n;
}

/* Checks row r's reads (its sequence, the slots up to its highest tree slot backed)
 * and expands its mask into extra[]; returns the count, or -1 with err set. */
static int32_t tree_row(const tdm_attn_args *a, int32_t r, int32_t *extra, tdm_err *err) {
    const tdm_batch *bt = a->batch;
    const tdm_kv_seq *s = a->seqs[bt->seq[r]];
    const int32_t bs = a->block_size, nv = bt->n_visible[r];
    const int64_t cap = TDM_MIN((int64_t)s->len, (int64_t)s->n_blocks * bs);
    const int32_t ne = mask_slots(bt->tree_mask[r], nv, extra);
    const int64_t top = ne ? extra[ne - 1] : (int64_t)nv - 1;
    if (nv < 0 || top >= cap) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: row %d sees slot %lld of a sequence of %lld", (int)r,
                   (long long)TDM_MAX(top, (int64_t)nv), (long long)cap);
        return -1;
    }
    for (int64_t b = 0; b <= top / bs && top >= 0; b++)
        if (s->blocks[b] < 0) {
            tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: row %d: block %lld has id %d", (int)r, (long long)b,
                       (int)s->blocks[b]);
            return -1;
        }
    return ne;
}

/* Host metadata of a tree batch, uploaded: rows, extra slots, then each sequence's
 * block table once (tab[seq index] its offset). */
static tandem_status tree_pack(tdm_cuda *c, const tdm_attn_args *a, tree_meta *m, tdm_err *err) {
    const tdm_batch *bt = a->batch;
    const int32_t n = bt->n_rows;
    if (bt->extra_off) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "tree attention: a tree batch with extra-slot lists");
    if (!bt->tree_mask) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: no tree masks");
    int32_t n_seq = 0;
    size_t n_extra = 0;
    for (int32_t r = 0; r < n; r++) {
        const int32_t si = bt->seq[r];
        if (si < 0 || !a->seqs[si] || !a->seqs[si]->blocks)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: row %d: bad sequence %d", (int)r, (int)si);
        n_seq = TDM_MAX(n_seq, si + 1);
        n_extra += (size_t)__builtin_popcountll(bt->tree_mask[r]);
    }
    int32_t *tab = (int32_t *)malloc((size_t)n_seq * sizeof(int32_t));
    if (!tab) return tdm_seterr(err, TANDEM_ERR_NOMEM, "tree attention: out of memory");
    size_t n_tab = 0;
    for (int32_t i = 0; i < n_seq; i++) tab[i] = -1;
    for (int32_t r = 0; r < n; r++)
        if (tab[bt->seq[r]] < 0) {
            tab[bt->seq[r]] = (int32_t)n_tab;
            n_tab += (size_t)a->seqs[bt->seq[r]]->n_blocks;
        }
    const size_t ints = (size_t)n * TREE_ROW_INTS + n_extra + n_tab;
    int32_t *h = (int32_t *)tdm_cuda_meta_host(c, ints * sizeof(int32_t), err);
    tandem_status st = h ? TANDEM_OK : err ? err->status : TANDEM_ERR_BACKEND;
    int32_t *extra = h ? h + (size_t)n * TREE_ROW_INTS : NULL, *tabs = extra ? extra + n_extra : NULL;
    for (int32_t i = 0; i < n_seq && !st; i++)
        if (tab[i] >= 0) memcpy(tabs + tab[i], a->seqs[i]->blocks, (size_t)a->seqs[i]->n_blocks * sizeof(int32_t));
    for (int32_t r = 0, e0 = 0; r < n && !st; r++) {
        const int32_t ne = tree_row(a, r, extra + e0, err);
        if (ne < 0) st = err ? err->status : TANDEM_ERR_INVALID_ARG;
        int32_t *ri = h + (size_t)r * TREE_ROW_INTS;
        ri[0] = bt->n_visible[r], ri[1] = ne, ri[2] = e0, ri[3] = tab[bt->seq[r]];
        e0 += ne;
    }
    free(tab);
    if (st) return st;
    const int32_t *d = (const int32_t *)tdm_cuda_meta_upload(c, ints * sizeof(int32_t), err);
    if (!d) return err ? err->status : TANDEM_ERR_BACKEND;
    m->rows = d;
    m->extra = d + (size_t)n * TREE_ROW_INTS;
    m->tabs = m->extra + n_extra;
    return TANDEM_OK;
}

/* Block (row * n_head + head): the row's attention output for that head. */
template <typename C, int HD>
__global__ void k_tree_attn(const float *q, int32_t q_stride, const void *kc, const void *vc, int64_t unit, tree_meta m,
                            int32_t n_head, int32_t n_kv, int32_t bs, float scale, float *out) {
    constexpr int PER = HD / 32; /* output dims per lane */
    __shared__ float qs[HD];
    __shared__ float w_m[TREE_WARPS], w_l[TREE_WARPS], w_acc[TREE_WARPS][HD];
    const int32_t rh = blockIdx.x, r = rh / n_head, h = rh % n_head, g = h / (n_head / n_kv);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int32_t d = threadIdx.x; d < HD; d += blockDim.x) qs[d] = q[(size_t)r * q_stride + (size_t)h * HD + d];
    __syncthreads();
    const int32_t *ri = m.rows + (size_t)r * TREE_ROW_INTS;
    const int32_t nv = ri[0], n_tot = ri[0] + ri[1];
    float mx = -INFINITY, l = 0.0f, acc[PER];
#pragma unroll
    for (int i = 0; i < PER; i++) acc[i] = 0.0f;
    for (int32_t t0 = wid * 32; t0 < n_tot; t0 += TREE_WARPS * 32) {
        const int32_t j = t0 + lane;
        int32_t slot = -1;
        float s = -INFINITY;
        if (j < n_tot) {
            slot = j < nv ? j : m.extra[ri[2] + j - nv];
            const uint8_t *ku = tdm_cu_kv_unit(kc, m.tabs[ri[3] + slot / bs], n_kv, g, unit);
            const C *kb = (const C *)ku + slot % bs;
            float dot = 0.0f;
#pragma unroll 8
            for (int d = 0; d < HD; d++) dot = fmaf(qs[d], tdm_cu_kv_val<C>(kb[(size_t)d * bs]), dot);
            s = dot * scale * tdm_cu_kv_scale<C>(ku, bs, HD, slot % bs);
        }
        float tmax = s;
        for (int o = 16; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
        const float nm = fmaxf(mx, tmax);
        const float corr = mx == -INFINITY ? 0.0f : expf(mx - nm);
        const float p = j < n_tot ? expf(s - nm) : 0.0f;
        float psum = p;
        for (int o = 16; o > 0; o >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, o);
        l = l * corr + psum;
#pragma unroll
        for (int i = 0; i < PER; i++) acc[i] *= corr;
        mx = nm;
        const int32_t cnt = TDM_MIN(32, n_tot - t0);
        for (int32_t x = 0; x < cnt; x++) {
            const int32_t sx = __shfl_sync(0xffffffffu, slot, x);
            const float px = __shfl_sync(0xffffffffu, p, x);
            const uint8_t *vu = tdm_cu_kv_unit(vc, m.tabs[ri[3] + sx / bs], n_kv, g, unit);
            const C *vr = (const C *)vu + (size_t)(sx % bs) * HD;
            const float w = px * tdm_cu_kv_scale<C>(vu, bs, HD, sx % bs);
#pragma unroll
            for (int i = 0; i < PER; i++) acc[i] = fmaf(w, tdm_cu_kv_val<C>(vr[lane + 32 * i]), acc[i]);
        }
    }
    if (lane == 0) w_m[wid] = mx, w_l[wid] = l;
#pragma unroll
    for (int i = 0; i < PER; i++) w_acc[wid][lane + 32 * i] = acc[i];
    __syncthreads();
    float gm = -INFINITY;
    for (int w = 0; w < TREE_WARPS; w++) gm = fmaxf(gm, w_m[w]);
    float gl = 0.0f;
    for (int w = 0; w < TREE_WARPS; w++) gl += w_m[w] == -INFINITY ? 0.0f : w_l[w] * expf(w_m[w] - gm);
    float *o = out + (size_t)r * n_head * HD + (size_t)h * HD;
    for (int32_t d = threadIdx.x; d < HD; d += blockDim.x) {
        float t = 0.0f;
        for (int w = 0; w < TREE_WARPS; w++)
            if (w_m[w] != -INFINITY) t += w_acc[w][d] * expf(w_m[w] - gm);
        o[d] = gl > 0.0f ? t / gl : 0.0f;
    }
}

template <int HD>
static tandem_status launch_hd(tdm_cuda *c, const tdm_attn_args *a, const tree_meta &m, tdm_err *err) {
    const int64_t unit = tdm_kv_unit_bytes(a->cache_type, a->block_size, HD);
    const unsigned grid = (unsigned)((int64_t)a->batch->n_rows * a->n_head);
    const unsigned threads = 32 * TREE_WARPS;
    switch (a->cache_type) {
    case TDM_F16:
        k_tree_attn<__half, HD><<<grid, threads, 0, c->stream>>>(a->q, a->q_stride, a->k_cache, a->v_cache, unit, m,
                                                                a->n_head, a->n_kv_head, a->block_size, a->scale, a->out);
        break;
    case TDM_Q8_0:
        k_tree_attn<int8_t, HD><<<grid, threads, 0, c->stream>>>(a->q, a->q_stride, a->k_cache, a->v_cache, unit, m,
                                                                a->n_head, a->n_kv_head, a->block_size, a->scale, a->out);
        break;
    default:
        k_tree_attn<float, HD><<<grid, threads, 0, c->stream>>>(a->q, a->q_stride, a->k_cache, a->v_cache, unit, m,
                                                               a->n_head, a->n_kv_head, a->block_size, a->scale, a->out);
        break;
    }
    TDM_CU_LAUNCHED("tree attention");
    return TANDEM_OK;
}

tandem_status tdm_cuda_tree_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "tree attention", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    return tdm_cuda_tree_attention_on(c, a, err);
}

tandem_status tdm_cuda_tree_attention_on(tdm_cuda *c, const tdm_attn_args *a, tdm_err *err) {
    if (!a || !a->batch) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: NULL args or batch");
    const tdm_batch *bt = a->batch;
    if (bt->n_rows <= 0) return bt->n_rows == 0 ? TANDEM_OK : tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: n_rows %d", (int)bt->n_rows);
    if (!tdm_kv_type_ok(a->cache_type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "tree attention: cache type %s", tdm_dtype_name(a->cache_type));
    if (a->n_head <= 0 || a->n_kv_head <= 0 || a->n_head % a->n_kv_head != 0 || a->block_size <= 0 ||
        (int64_t)a->n_head * a->head_dim > a->q_stride)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: n_head %d, n_kv_head %d, head_dim %d, block_size %d",
                          (int)a->n_head, (int)a->n_kv_head, (int)a->head_dim, (int)a->block_size);
    if (!a->seqs || !a->q || !a->out || !a->k_cache || !a->v_cache || !bt->seq || !bt->n_visible)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: NULL pointer");
    if (!isfinite(a->scale)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree attention: scale %g", (double)a->scale);
    if (a->window != 0 || a->softcap != 0)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "tree attention: sliding windows and soft-capping are not on the CUDA tree kernel");
    if ((int64_t)bt->n_rows * a->n_head > INT32_MAX)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "tree attention: %d rows x %d heads", (int)bt->n_rows, (int)a->n_head);
    const int32_t hd = a->head_dim;
    if (hd != 32 && hd != 64 && hd != 96 && hd != 128 && hd != 256)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "tree attention: head dim %d (the CUDA tree kernel takes 32, 64, 96, 128, 256)",
                          (int)hd);
    tree_meta m;
    tandem_status st = tree_pack(c, a, &m, err);
    if (st) return st;
    switch (hd) {
    case 32: return launch_hd<32>(c, a, m, err);
    case 64: return launch_hd<64>(c, a, m, err);
    case 96: return launch_hd<96>(c, a, m, err);
    case 128: return launch_hd<128>(c, a, m, err);
    default: return launch_hd<256>(c, a, m, err);
    }
}

tandem_status tdm_cuda_attention_any(tdm_backend *b, const tdm_attn_args *a, tdm_err *err) {
    return tdm_cuda_attention(b, a, err); /* (which routes tree batches: tdm_cuda_attention_on) */
}

/* ---- kv_move ------------------------------------------------------------------- */

/* Block (pair i, layer l * n_kv + kv head): slot src[i]'s K and V (and q8_0 scales)
 * to slot dst[i], bytes moved one element a thread.  pairs: [n][4] = source block,
 * source position, destination block, destination position. */
__global__ void k_kv_move(const int32_t *pairs, uint8_t *const *kc, uint8_t *const *vc, int32_t n_kv, int32_t hd,
                          int32_t bs, int32_t esz, int64_t unit, bool q8) {
    const int32_t i = blockIdx.x, l = blockIdx.y / n_kv, g = blockIdx.y % n_kv;
    const int32_t *p = pairs + 4 * i;
    uint8_t *ks = kc[l] + ((int64_t)p[0] * n_kv + g) * unit, *kd = kc[l] + ((int64_t)p[2] * n_kv + g) * unit;
    uint8_t *vs = vc[l] + ((int64_t)p[0] * n_kv + g) * unit, *vd = vc[l] + ((int64_t)p[2] * n_kv + g) * unit;
    for (int32_t x = threadIdx.x; x < hd * esz; x += blockDim.x) {
        const int32_t d = x / esz, b = x % esz;
        kd[((int64_t)d * bs + p[3]) * esz + b] = ks[((int64_t)d * bs + p[1]) * esz + b];
        vd[(int64_t)p[3] * hd * esz + x] = vs[(int64_t)p[1] * hd * esz + x];
    }
    if (q8 && threadIdx.x < 4) {
        const int64_t so = tdm_kv_q8_scale_off(bs, hd);
        kd[so + 4 * p[3] + threadIdx.x] = ks[so + 4 * p[1] + threadIdx.x];
        vd[so + 4 * p[3] + threadIdx.x] = vs[so + 4 * p[1] + threadIdx.x];
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
    if ((int64_t)a->n_layer * a->n_kv_head > 65535)
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
    const dim3 grid((unsigned)a->n, (unsigned)(a->n_layer * a->n_kv_head));
    k_kv_move<<<grid, 128, 0, c->stream>>>((const int32_t *)dev, kp, vp, a->n_kv_head, a->head_dim, bs,
                                           tdm_kv_elem_bytes(a->cache_type), tdm_kv_unit_bytes(a->cache_type, bs, a->head_dim),
                                           a->cache_type == TDM_Q8_0);
    TDM_CU_LAUNCHED("kv_move");
    return TANDEM_OK;
}
