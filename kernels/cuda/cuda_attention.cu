/* cuda_attention.cu - kv_write and attention over the paged KV cache on the GPU.
 *
 * The cache layout is the op contract's (kernels/backend.h): per block and kv head,
 * K as [head_dim][block_size] and V as [block_size][head_dim].  For a thread per
 * key slot, K's layout makes a warp's loads of one d consecutive (coalesced); for a
 * thread per output dimension, V's does.
 *
 * The host packs, per row, its visible count, extra slots and an offset into a flat
 * copy of the block tables of the batch's sequences (checked there: every slot a
 * row reads or writes is backed by a block), and uploads it once per op.
 *
 * attention: batches (token-tree batches among them) on an f16, q8_0 or fp8 cache of
 * a head dim the tiled kernels know go to cuda_flash.cu (tiles of rows, split key
 * ranges, online softmax).  The others (rows with CSR extra slots, f32 caches,
 * other head dims, every batch under TDM_CUDA_ATTN_SCORES; token trees: their masks as
 * extra slots in rank order, cuda_fused.h) run two kernels here: scores (a thread per (row, head, slot): scale * q.K, d in
 * increasing order) into device scratch, then per (row, head) a block that takes
 * the softmax (max subtracted) and the weighted sum of V.  Scores live in global
 * memory, so any context length works.
 *
 * q8_0 and fp8 caches (src/base/kv_layout.h): kv_write quantises each head vector by
 * one warp (cuda_kvq8.cuh); attention reads the int8 quants / E4M3 codes as values and
 * applies the slot scales: score = (scale * q . kq) * kscale, weights p * vscale (as
 * the CPU does).
 */
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_fused.h"
#include "cuda_kvq8.cuh"
#include "cuda_nonfinite.cuh"

#define ATT_THREADS 128

/* ---- metadata ------------------------------------------------------------------ */

/* Per row: [0] n_visible, [1] n_extra, [2] first extra (index into the extra list),
 * [3] offset of the sequence's block table; then the extra slots, then the tables. */
enum { ROW_INTS = 5 }; /* n_visible, n_extra, extra offset, table offset, window start */

typedef struct attn_meta {
    const int32_t *rows;   /* [n_rows][ROW_INTS] */
    const int32_t *extra;  /* extra slots */
    const int32_t *tabs;   /* block tables */
} attn_meta;

/* Packs the batch's metadata into the host staging buffer and uploads it; checks
 * that every visible or extra slot of every row is backed by a block (a row's
 * n_visible may be 0).  Returns the device copy's pointers in *m and the widest
 * row's slot count in *max_tot. */
static tandem_status pack_meta(tdm_cuda *c, const tdm_batch *bt, const tdm_kv_seq *const *seqs, int32_t bs,
                               int32_t window, const char *op, attn_meta *m, int32_t *max_tot, tdm_err *err) {
    const int32_t n = bt->n_rows;
    size_t n_extra = bt->extra_off ? (size_t)bt->extra_off[n] : 0;
    if (bt->extra_off && (bt->extra_off[0] != 0 || bt->extra_off[n] < 0 || !bt->extra_slot))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: bad extra offsets", op);
    /* distinct sequences in first-use order, and the table ints they need */
    size_t n_tab = 0;
    for (int32_t r = 0; r < n; r++) {
        int32_t si = bt->seq[r];
        const tdm_kv_seq *s = si >= 0 ? seqs[si] : NULL;
        if (!s || !s->blocks)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: row %d: bad sequence %d", op, (int)r, (int)si);
        bool seen = false;
        for (int32_t q = 0; q < r && !seen; q++) seen = bt->seq[q] == si;
        if (!seen) n_tab += (size_t)s->n_blocks;
    }
    const size_t ints = (size_t)n * ROW_INTS + n_extra + n_tab;
    int32_t *h = (int32_t *)tdm_cuda_meta_host(c, ints * sizeof(int32_t), err);
    if (!h) return err ? err->status : TANDEM_ERR_BACKEND;
    int32_t *extra = h + (size_t)n * ROW_INTS, *tabs = extra + n_extra;
    if (n_extra) memcpy(extra, bt->extra_slot, n_extra * sizeof(int32_t));
    size_t used = 0;
    int32_t widest = 0;
    for (int32_t r = 0; r < n; r++) {
        const int32_t si = bt->seq[r];
        const tdm_kv_seq *s = seqs[si];
        int32_t off = -1;
        for (int32_t q = 0; q < r && off < 0; q++)
            if (bt->seq[q] == si) off = h[(size_t)q * ROW_INTS + 3];
        if (off < 0) {
            off = (int32_t)used;
            memcpy(tabs + used, s->blocks, (size_t)s->n_blocks * sizeof(int32_t));
            used += (size_t)s->n_blocks;
        }
        const int64_t cap = TDM_MIN((int64_t)s->len, (int64_t)s->n_blocks * bs);
        const int32_t nv = bt->n_visible[r];
        if (nv < 0 || nv > cap)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "%s: row %d: n_visible %d outside the sequence (len %d, %d blocks)", op, (int)r,
                              (int)nv, (int)s->len, (int)s->n_blocks);
        for (int32_t blk = 0; blk < (nv + bs - 1) / bs; blk++)
            if (s->blocks[blk] < 0)
                return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: row %d: block %d has id %d", op, (int)r,
                                  (int)blk, (int)s->blocks[blk]);
        int32_t e0 = 0, e1 = 0;
        if (bt->extra_off) {
            e0 = bt->extra_off[r];
            e1 = bt->extra_off[r + 1];
            if (e0 < 0 || e1 < e0 || (size_t)e1 > n_extra)
                return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: row %d: bad extra offsets [%d, %d)", op, (int)r,
                                  (int)e0, (int)e1);
            for (int32_t e = e0; e < e1; e++) {
                int32_t slot = bt->extra_slot[e];
                if (slot < 0 || slot >= cap || s->blocks[slot / bs] < 0)
                    return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                                      "%s: row %d: extra slot %d outside the sequence (len %d)", op, (int)r,
                                      (int)slot, (int)s->len);
            }
        }
        int32_t *ri = h + (size_t)r * ROW_INTS;
        ri[0] = nv;
        ri[1] = e1 - e0;
        ri[2] = e0;
        ri[3] = off;
        /* sliding window: the visible slots before ri[4] are not seen (as the CPU
         * backend: extra slots, after the visible ones, always are) */
        ri[4] = window > 0 ? TDM_MIN(nv, TDM_MAX(0, bt->pos[r] - window + 1)) : 0;
        widest = TDM_MAX(widest, nv + (e1 - e0));
    }
    const int32_t *d = (const int32_t *)tdm_cuda_meta_upload(c, ints * sizeof(int32_t), err);
    if (!d) return err ? err->status : TANDEM_ERR_BACKEND;
    m->rows = d;
    m->extra = d + (size_t)n * ROW_INTS;
    m->tabs = m->extra + n_extra;
    *max_tot = widest;
    return TANDEM_OK;
}

/* ---- kv_write ------------------------------------------------------------------ */

template <typename C> __device__ __forceinline__ C to_cache(float v);
template <> __device__ __forceinline__ float to_cache<float>(float v) { return v; }
template <> __device__ __forceinline__ __half to_cache<__half>(float v) { return __float2half_rn(v); }

/* Block (row r, kv head g): K and V of the row into its slot. */
template <typename C>
__global__ void k_kv_write(const float *k, const float *v, int32_t row_stride, const int32_t *dst, C *kc, C *vc,
                           int32_t n_kv, int32_t hd, int32_t bs) {
    TDM_PDL_ENTRY();
    const int32_t r = blockIdx.x, g = blockIdx.y;
    const int64_t blk = dst[2 * r], p = dst[2 * r + 1];
    const float *kr = k + (size_t)r * row_stride + (size_t)g * hd, *vr = v + (size_t)r * row_stride + (size_t)g * hd;
    C *kb = kc + ((blk * n_kv + g) * hd) * bs + p;
    C *vb = vc + ((blk * n_kv + g) * bs + p) * hd;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        kb[(size_t)d * bs] = to_cache<C>(kr[d]);
        vb[d] = to_cache<C>(vr[d]);
    }
}

/* q8_0 (C int8_t), fp8 (C __nv_fp8_e4m3): one warp per block (row r, kv head g): K
 * and V of the row quantised into its slot with their scales. */
template <typename C>
__global__ void k_kv_write_q8(const float *k, const float *v, int32_t row_stride, const int32_t *dst, uint8_t *kc,
                              uint8_t *vc, int32_t n_kv, int32_t hd, int32_t bs) {
    TDM_PDL_ENTRY();
    const int32_t r = blockIdx.x, g = blockIdx.y;
    const int64_t blk = dst[2 * r], unit = tdm_kv_unit_bytes(TDM_Q8_0, bs, hd); /* (fp8's too) */
    const int32_t p = dst[2 * r + 1];
    const float *kr = k + (size_t)r * row_stride + (size_t)g * hd, *vr = v + (size_t)r * row_stride + (size_t)g * hd;
    tdm_cu_kv8_write<C>(kr, hd, kc + (blk * n_kv + g) * unit, bs, p, true, threadIdx.x);
    tdm_cu_kv8_write<C>(vr, hd, vc + (blk * n_kv + g) * unit, bs, p, false, threadIdx.x);
}

tandem_status tdm_cuda_kv_write(tdm_backend *b, const tdm_kv_write_args *a, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "kv_write", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (!a || !a->batch) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: NULL args or batch");
    const tdm_batch *bt = a->batch;
    if (bt->n_rows < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: n_rows %d", (int)bt->n_rows);
    if (bt->n_rows == 0) return TANDEM_OK;
    if (!tdm_kv_type_ok(a->cache_type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "kv_write: cache type %s", tdm_dtype_name(a->cache_type));
    if (a->n_kv_head <= 0 || a->head_dim <= 0 || a->block_size <= 0 ||
        (int64_t)a->n_kv_head * a->head_dim > a->row_stride || a->n_kv_head > 65535)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: n_kv_head %d, head_dim %d, block_size %d, row_stride %d",
                          (int)a->n_kv_head, (int)a->head_dim, (int)a->block_size, (int)a->row_stride);
    if (!a->seqs || !a->k || !a->v || !a->k_cache || !a->v_cache || !bt->seq || !bt->slot)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: NULL pointer");
    const int32_t n = bt->n_rows, bs = a->block_size;
    int32_t *h = (int32_t *)tdm_cuda_meta_host(c, (size_t)n * 2 * sizeof(int32_t), err);
    if (!h) return err ? err->status : TANDEM_ERR_BACKEND;
    for (int32_t r = 0; r < n; r++) {
        int32_t si = bt->seq[r], slot = bt->slot[r];
        const tdm_kv_seq *s = si >= 0 ? a->seqs[si] : NULL;
        if (!s || !s->blocks)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_write: row %d: bad sequence %d", (int)r, (int)si);
        if (slot < 0 || slot >= s->len || slot / bs >= s->n_blocks || s->blocks[slot / bs] < 0)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "kv_write: row %d: slot %d outside the sequence (len %d, %d blocks)", (int)r, (int)slot,
                              (int)s->len, (int)s->n_blocks);
        h[2 * r] = s->blocks[slot / bs];
        h[2 * r + 1] = slot % bs;
    }
    const int32_t *d = (const int32_t *)tdm_cuda_meta_upload(c, (size_t)n * 2 * sizeof(int32_t), err);
    if (!d) return err ? err->status : TANDEM_ERR_BACKEND;
    const dim3 grid((unsigned)n, (unsigned)a->n_kv_head);
    const unsigned threads = (unsigned)TDM_MIN(a->head_dim, 256);
    if (a->cache_type == TDM_Q8_0)
        tdm_launch(k_kv_write_q8<int8_t>, grid, 32, 0, c->stream, a->k, a->v, a->row_stride, d, (uint8_t *)a->k_cache,
                   (uint8_t *)a->v_cache, a->n_kv_head, a->head_dim, bs);
    else if (a->cache_type == TDM_F8_E4M3)
        tdm_launch(k_kv_write_q8<__nv_fp8_e4m3>, grid, 32, 0, c->stream, a->k, a->v, a->row_stride, d,
                   (uint8_t *)a->k_cache, (uint8_t *)a->v_cache, a->n_kv_head, a->head_dim, bs);
    else if (a->cache_type == TDM_F16)
        tdm_launch(k_kv_write<__half>, grid, threads, 0, c->stream, a->k, a->v, a->row_stride, d, (__half *)a->k_cache,
                                                           (__half *)a->v_cache, a->n_kv_head, a->head_dim, bs);
    else
        tdm_launch(k_kv_write<float>, grid, threads, 0, c->stream, a->k, a->v, a->row_stride, d, (float *)a->k_cache,
                                                          (float *)a->v_cache, a->n_kv_head, a->head_dim, bs);
    TDM_CU_LAUNCHED("kv_write");
    return TANDEM_OK;
}

/* ---- attention ----------------------------------------------------------------- */

/* The cache slot of a row's j-th visible key (its own slots, then its extras). */
__device__ __forceinline__ int32_t slot_of(const attn_meta &m, const int32_t *ri, int32_t j) {
    return j < ri[0] ? j : m.extra[ri[2] + j - ri[0]];
}

/* Grid (row * n_head + head, slot chunk): scores[rh][j] = scale * q . K[slot j],
 * d in increasing order (q8_0, fp8: times the slot's scale); q staged in shared memory
 * (hd floats).  unit: bytes of a (block, kv head) unit of the cache. */
template <typename C>
__global__ void k_scores(const float *q, int32_t q_stride, const void *kc, int64_t unit, attn_meta m, int32_t n_head,
                         int32_t n_kv, int32_t hd, int32_t bs, float scale, float softcap, float *scores, int32_t ld) {
    TDM_PDL_ENTRY();
    extern __shared__ float qs[];
    const int32_t rh = blockIdx.x, r = rh / n_head, h = rh % n_head;
    const float *qv = q + (size_t)r * q_stride + (size_t)h * hd;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qv[d];
    __syncthreads();
    const int32_t *ri = m.rows + (size_t)r * ROW_INTS;
    const int32_t j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= ri[0] + ri[1]) return;
    if (j < ri[4]) { /* outside the sliding window */
        scores[(size_t)rh * ld + j] = -INFINITY;
        return;
    }
    const int32_t slot = slot_of(m, ri, j), g = h / (n_head / n_kv);
    const int64_t blk = m.tabs[ri[3] + slot / bs];
    const uint8_t *ku = tdm_cu_kv_unit(kc, blk, n_kv, g, unit);
    const C *kb = (const C *)ku + slot % bs;
    float acc = 0.0f;
#pragma unroll 16
    for (int32_t d = 0; d < hd; d++) acc = fmaf(qs[d], tdm_cu_kv_val<C>(kb[(size_t)d * bs]), acc);
    const float sc = acc * scale * tdm_cu_kv_scale<C>(ku, bs, hd, slot % bs);
    scores[(size_t)rh * ld + j] = softcap > 0.0f ? tdm_cu_softcap(sc, softcap) : sc;
}

__device__ float block_reduce(float v, bool is_max) {
    __shared__ float part[32];
    for (int o = 16; o > 0; o >>= 1) {
        float t = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, t) : v + t;
    }
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) part[wid] = v;
    __syncthreads();
    float s = part[0];
    for (int w = 1; w < nw; w++) s = is_max ? fmaxf(s, part[w]) : s + part[w];
    return s;
}

#define PV_WARPS (ATT_THREADS / 32)
#define PV_D 256 /* output dimensions per pass (8 per lane) */

/* Block (row * n_head + head): softmax of the row's scores (in place, as
 * numerators), then out = sum_j p_j V[slot j] / sum_j p_j (q8_0, fp8: the weights p_j
 * times the slots' scales).  Warp w sums the slots j = w, w + PV_WARPS, ... (lanes
 * over d, so each V row is one coalesced read) and the warps' partial sums are
 * added in warp order. */
template <typename C>
__global__ void k_softmax_pv(const void *vc, int64_t unit, attn_meta m, int32_t n_head, int32_t n_kv, int32_t hd,
                             int32_t bs, float *scores, int32_t ld, float *out) {
    TDM_PDL_ENTRY();
    __shared__ float part[PV_WARPS][PV_D];
    const int32_t rh = blockIdx.x, r = rh / n_head, h = rh % n_head;
    const int32_t *ri = m.rows + (size_t)r * ROW_INTS;
    const int32_t n_tot = ri[0] + ri[1], lo = ri[4], g = h / (n_head / n_kv);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    float *sc = scores + (size_t)rh * ld, *o = out + (size_t)r * n_head * hd + (size_t)h * hd;
    if (lo >= n_tot) { /* (nothing seen: as the CPU backend, zeros) */
        for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) o[d] = 0.0f;
        return;
    }
    float mx = -INFINITY;
    for (int32_t j = lo + threadIdx.x; j < n_tot; j += blockDim.x) mx = fmaxf(mx, sc[j]);
    mx = block_reduce(mx, true);
    float sum = 0.0f;
    for (int32_t j = lo + threadIdx.x; j < n_tot; j += blockDim.x) {
        float e = expf(sc[j] - mx);
        sc[j] = e;
        sum += e;
    }
    sum = block_reduce(sum, false); /* (its barriers also publish sc) */
    const float inv = 1.0f / sum;
    for (int32_t d0 = 0; d0 < hd; d0 += PV_D) {
        float acc[PV_D / 32];
#pragma unroll
        for (int i = 0; i < PV_D / 32; i++) acc[i] = 0.0f;
#pragma unroll 4
        for (int32_t j = lo + wid; j < n_tot; j += PV_WARPS) {
            const int32_t slot = slot_of(m, ri, j);
            const int64_t blk = m.tabs[ri[3] + slot / bs];
            const uint8_t *vu = tdm_cu_kv_unit(vc, blk, n_kv, g, unit);
            const C *vr = (const C *)vu + (size_t)(slot % bs) * hd + d0;
            const float p = sc[j] * tdm_cu_kv_scale<C>(vu, bs, hd, slot % bs);
#pragma unroll
            for (int i = 0; i < PV_D / 32; i++) {
                const int32_t d = lane + 32 * i;
                if (d0 + d < hd) acc[i] = fmaf(p, tdm_cu_kv_val<C>(vr[d]), acc[i]);
            }
        }
#pragma unroll
        for (int i = 0; i < PV_D / 32; i++) part[wid][lane + 32 * i] = acc[i];
        __syncthreads();
        for (int32_t d = threadIdx.x; d < PV_D && d0 + d < hd; d += blockDim.x) {
            float t = part[0][d];
            for (int w = 1; w < PV_WARPS; w++) t += part[w][d];
            o[d0 + d] = t * inv;
        }
        __syncthreads();
    }
}

bool tdm_cuda_flash_enabled(const tdm_cuda *c) { return c->attn_path != TDM_CUDA_ATTN_SCORES; }

/* The attention op by tiles and splits (cuda_flash.cu), for batches (token trees
 * among them) on an f16, q8_0 or fp8 cache of a head dim it knows: metadata through
 * the ring. */
static tandem_status flash_op(tdm_cuda *c, const tdm_attn_args *a, tdm_err *err) {
    const tdm_batch *bt = a->batch;
    const int32_t n = bt->n_rows, max_q = tdm_flash_max_q(n);
    const int32_t gh = tdm_flash_heads_per_block(c, bt, a->n_head, a->n_kv_head, max_q);
    size_t bytes;
    tandem_status st = tdm_cuda_meta_size(bt, a->seqs, &bytes, err);
    if (st) return st;
    void *h = tdm_cuda_meta_host(c, bytes, err);
    if (!h) return err ? err->status : TANDEM_ERR_BACKEND;
    tdm_cuda_meta m;
    if ((st = tdm_cuda_meta_fill(bt, a->seqs, a->block_size, gh, max_q, h, &m, err))) return st;
    const void *d = tdm_cuda_meta_upload(c, bytes, err);
    if (!d) return err ? err->status : TANDEM_ERR_BACKEND;
    tdm_flash_args fa;
    tdm_cuda_meta_at(d, n, &fa.rows, &fa.tiles, &fa.tabs);
    fa.n_rows = n;
    fa.n_tiles = m.n_tiles;
    fa.n_splits = TDM_MAX(1, (m.max_kv + TDM_FLASH_SPLIT - 1) / TDM_FLASH_SPLIT);
    fa.tile_rows = m.max_tile_rows;
    fa.heads_per_block = gh;
    fa.q = a->q;
    fa.q_stride = a->q_stride;
    fa.k_cache = a->k_cache;
    fa.v_cache = a->v_cache;
    fa.cache_type = a->cache_type;
    fa.n_head = a->n_head;
    fa.n_kv_head = a->n_kv_head;
    fa.head_dim = a->head_dim;
    fa.block_size = a->block_size;
    fa.scale = a->scale;
    fa.part = (float *)tdm_cuda_buf_get(c, &c->att_buf,
                                        tdm_flash_part_floats(fa.n_splits, n, a->n_head, a->head_dim) * sizeof(float),
                                        "attention partials", err);
    if (!fa.part) return err ? err->status : TANDEM_ERR_BACKEND;
    fa.out = a->out;
    fa.out_type = TDM_F32;
    fa.tree = bt->tree;
    return tdm_cuda_flash(c, &fa, err);
}

/* The scores and softmax-V kernels for cache element type C (grid g1 of scores). */
template <typename C>
static tandem_status tiled_attention(tdm_cuda *c, const tdm_attn_args *a, const attn_meta &m, dim3 g1, size_t qbytes,
                                     float *scores, int32_t ld, tdm_err *err) {
    const int64_t unit = tdm_kv_unit_bytes(a->cache_type, a->block_size, a->head_dim);
    const unsigned rh = g1.x;
    tdm_launch(k_scores<C>, g1, ATT_THREADS, qbytes, c->stream, a->q, a->q_stride, a->k_cache, unit, m, a->n_head, a->n_kv_head,
                                                      a->head_dim, a->block_size, a->scale, a->softcap, scores, ld);
    TDM_CU_LAUNCHED("attention scores");
    tdm_launch(k_softmax_pv<C>, rh, ATT_THREADS, 0, c->stream, a->v_cache, unit, m, a->n_head, a->n_kv_head, a->head_dim,
                                                     a->block_size, scores, ld, a->out);
    TDM_CU_LAUNCHED("attention softmax and V");
    return TANDEM_OK;
}

/* A token-tree batch as a batch of CSR extra slots (a shallow copy; the caller
 * frees ex->extra_off and ex->extra_slot): row r's extras are n_visible + j for the
 * set bits j of its mask, ascending - its keys in rank order, so the scores and
 * softmax kernels treat a tree node at depth d exactly as a causal row of the same
 * tokens at consecutive slots. */
static tandem_status tree_extras(const tdm_batch *bt, tdm_batch *ex, tdm_err *err) {
    const int32_t n = bt->n_rows;
    if (!bt->tree_mask) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: tree batch without masks");
    if (bt->extra_off) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: a tree batch with CSR extra slots");
    int64_t total = 0;
    for (int32_t r = 0; r < n; r++) total += __builtin_popcountll(bt->tree_mask[r]);
    *ex = *bt;
    ex->tree = false;
    ex->tree_mask = NULL;
    ex->extra_off = (int32_t *)malloc((size_t)(n + 1) * sizeof(int32_t));
    ex->extra_slot = (int32_t *)malloc((size_t)TDM_MAX(total, 1) * sizeof(int32_t));
    if (!ex->extra_off || !ex->extra_slot) {
        free(ex->extra_off);
        free(ex->extra_slot);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "attention: out of memory for %lld tree slots", (long long)total);
    }
    int32_t e = 0;
    for (int32_t r = 0; r < n; r++) {
        ex->extra_off[r] = e;
        for (uint64_t m = bt->tree_mask[r]; m; m &= m - 1) ex->extra_slot[e++] = bt->n_visible[r] + __builtin_ctzll(m);
    }
    ex->extra_off[n] = e;
    return TANDEM_OK;
}

tandem_status tdm_cuda_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "attention", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    return tdm_cuda_attention_on(c, a, err);
}

tandem_status tdm_cuda_attention_on(tdm_cuda *c, const tdm_attn_args *a, tdm_err *err) {
    if (!a || !a->batch) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: NULL args or batch");
    const tdm_batch *bt = a->batch;
    if (bt->n_rows < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: n_rows %d", (int)bt->n_rows);
    if (bt->n_rows == 0) return TANDEM_OK;
    if (!tdm_kv_type_ok(a->cache_type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: cache type %s", tdm_dtype_name(a->cache_type));
    if (a->n_head <= 0 || a->n_kv_head <= 0 || a->n_head % a->n_kv_head != 0 || a->head_dim <= 0 ||
        a->block_size <= 0 || (int64_t)a->n_head * a->head_dim > a->q_stride)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "attention: n_head %d, n_kv_head %d, head_dim %d, block_size %d, q_stride %d",
                          (int)a->n_head, (int)a->n_kv_head, (int)a->head_dim, (int)a->block_size, (int)a->q_stride);
    if (!a->seqs || !a->q || !a->out || !a->k_cache || !a->v_cache || !bt->seq || !bt->n_visible)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: NULL pointer");
    if (!isfinite(a->scale)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: scale %g", (double)a->scale);
    if (a->window < 0 || !(a->softcap >= 0 && isfinite(a->softcap)) || (a->window > 0 && !bt->pos))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: window %d, softcap %g%s", (int)a->window,
                          (double)a->softcap, a->window > 0 && !bt->pos ? ", NULL positions" : "");
    const int64_t rh = (int64_t)bt->n_rows * a->n_head;
    if (rh > INT32_MAX) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: %lld (row, head) pairs", (long long)rh);
    /* (sliding windows and soft-capping: the tiled kernels only) */
    if (!bt->extra_off && a->window == 0 && a->softcap == 0 &&
        tdm_flash_supported(a->head_dim, a->block_size, a->cache_type) && tdm_cuda_flash_enabled(c))
        return flash_op(c, a, err);
    attn_meta m;
    int32_t max_tot = 0;
    tandem_status st;
    if (bt->tree) { /* a tree's masks as extra slots, in rank order (cuda_fused.h) */
        tdm_batch ex;
        if ((st = tree_extras(bt, &ex, err))) return st;
        st = pack_meta(c, &ex, a->seqs, a->block_size, a->window, "attention", &m, &max_tot, err);
        free(ex.extra_off);
        free(ex.extra_slot);
    } else {
        st = pack_meta(c, bt, a->seqs, a->block_size, a->window, "attention", &m, &max_tot, err);
    }
    if (st) return st;
    const int32_t ld = TDM_MAX(max_tot, 1);
    float *scores = tdm_cuda_scratch(c, (size_t)rh * (size_t)ld, err);
    if (!scores) return err ? err->status : TANDEM_ERR_BACKEND;
    const unsigned chunks = (unsigned)((ld + ATT_THREADS - 1) / ATT_THREADS);
    if (chunks > 65535u) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: %d visible slots", (int)max_tot);
    const dim3 g1((unsigned)rh, chunks);
    const size_t qbytes = (size_t)a->head_dim * sizeof(float);
    if (qbytes > 48 * 1024) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: head_dim %d", (int)a->head_dim);
    switch (a->cache_type) {
    case TDM_F16: return tiled_attention<__half>(c, a, m, g1, qbytes, scores, ld, err);
    case TDM_Q8_0: return tiled_attention<int8_t>(c, a, m, g1, qbytes, scores, ld, err);
    case TDM_F8_E4M3: return tiled_attention<__nv_fp8_e4m3>(c, a, m, g1, qbytes, scores, ld, err);
    default: return tiled_attention<float>(c, a, m, g1, qbytes, scores, ld, err);
    }
}
