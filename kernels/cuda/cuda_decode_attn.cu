/* cuda_decode_attn.cu - attention of decode and verification rows (tiles of a few
 * rows of one sequence) over the paged f16, q8_0 or fp8 KV cache, with K / V read straight from
 * global memory: the same grid, arguments, partials and results (bit for bit) as
 * the tiled kernel k_flash (cuda_flash.cu), which stays for prefill tiles.
 *
 * Why: k_flash stages 32 keys of K and V per warp in shared memory (about 130 KiB a
 * block for head dim 128), so one block fits an SM and a decode row (one query
 * vector per block with MHA) keeps little memory in flight.  Here a block takes
 * the same (tile, heads of one kv head, split of TDM_FLASH_SPLIT keys) with 128
 * threads and a few KiB of shared memory, so many blocks share an SM and their
 * loads overlap.
 *
 * Layouts (kernels/backend.h): per block and kv head, K as [HD][block_size] and V
 * as [block_size][HD], f16, or q8_0's int8 quants / fp8's E4M3 codes with per-slot scales
 * (src/base/kv_layout.h: score = (scale q.kq) kscale, weight p vscale, as k_flash).
 * Queries q[row][q_stride] f32, heads at h * HD.
 *
 * A block, for its split's keys k0 = split * 256 .. k0 + 255:
 *   1. scores: thread t takes keys k0 + 2t, k0 + 2t + 1 (one 4-byte load of K per d,
 *      consecutive threads on consecutive keys: coalesced along the block's keys)
 *      against every query vector of the tile (rows x heads, at most QN, Q in
 *      shared memory): s = fma chain over d = 0 .. HD - 1, then s * scale, or -inf
 *      for a key the row does not see (key >= its nv, outside its tree mask) -> Ps[q][256];
 *   2. softmax bookkeeping exactly as k_flash's warps do it: the split's 8 chunks
 *      of 32 keys are taken in "streams" (chunk u in stream u % W, W = k_flash's
 *      warps: 8, or 4 for HD 256, the stream's chunks in order), per chunk the
 *      running maximum (warp max), the correction of the stream's state, the
 *      weights p = exp(s - max) (written over the scores) and the running sum
 *      l (butterfly warp sum); per stream its final max and sum -> Ms, Ls;
 *   3. V: thread (dims 2 dp, 2 dp + 1; a group of query vectors) runs each stream's
 *      weighted sum of V rows (a 4-byte load per key: the key's V row is read by
 *      HD / 2 consecutive threads) in key order, then folds the streams in stream
 *      order with weights exp(m_w - M), as k_flash merges its warps (one query
 *      vector: the thread groups share the streams, group 0 folds); a row whose
 *      keys fit one split is written as A / L, else (A, M, L) go to the partials
 *      for k_flash_combine.
 * Every operation and its order is k_flash's, so a row's output is the same
 * whichever kernel takes it, and (as there) depends on nothing but the row's own
 * keys: groupings are fixed by the key index alone, invisible keys add exact zeros.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cuda_fused.h"
#include "cuda_kvq8.cuh"
#include "cuda_nonfinite.cuh"
#include "cuda_reduce.cuh"

#define DA_THREADS 128                   /* threads per block: two keys each in step 1 */
#define DA_CHUNKS (TDM_FLASH_SPLIT / 32) /* chunks of 32 keys per split */
#define DA_VKEYS 16                      /* V rows loaded ahead per thread in step 3 */
static_assert(TDM_FLASH_SPLIT == 2 * DA_THREADS, "two keys per thread cover a split");

/* k_flash's warps per block (fl_warps in cuda_flash.cu): the streams here.  The
 * launcher checks the two agree (tdm_flash_warps). */
template <int HD> struct da_streams { static constexpr int n = HD >= 256 ? 4 : TDM_FLASH_SPLIT / 32; };
int32_t tdm_flash_warps(int32_t head_dim); /* cuda_flash.cu */

/* C: the cache element type, __half (f16), int8_t (q8_0 quants) or __nv_fp8_e4m3 (fp8
 * codes). */
template <int HD, int QN, typename C>
__global__ void __launch_bounds__(DA_THREADS) k_flash_decode(const tdm_flash_args a, int32_t gh) {
    TDM_PDL_ENTRY();
    constexpr bool q8 = tdm_cu_kv_scaled<C>(); /* (q8_0 or fp8: with scales) */
    constexpr int W = da_streams<HD>::n;
    constexpr int HP = HD / 2;             /* dim pairs */
    constexpr int G = DA_THREADS / HP;     /* query-vector groups in step 3 */
    constexpr int QG = (QN + G - 1) / G;   /* query vectors per thread in step 3 */
    static_assert(G >= 1 && DA_CHUNKS % W == 0, "shape");
    __shared__ __align__(16) float Qs[QN * HD];        /* [QN][HD] */
    __shared__ __align__(16) float Ps[QN][TDM_FLASH_SPLIT]; /* scores, then weights */
    __shared__ float Cs[QN][DA_CHUNKS];                /* a chunk's correction of its stream */
    __shared__ float Ms[QN][W], Ls[QN][W];             /* a stream's max and sum */
    __shared__ int32_t NVs[QN];
    __shared__ uint64_t TRs[QN];                       /* tree masks (cuda_fused.h) */
    __shared__ float Vsc[q8 ? TDM_FLASH_SPLIT : 1];      /* q8_0, fp8: the split's V scales */

    const tdm_cuda_tile tile = a.tiles[blockIdx.x];
    const int32_t split0 = (int32_t)blockIdx.z * TDM_FLASH_SPLIT;
    if (blockIdx.z > 0 && split0 >= tile.kv_len) return; /* (the combine reads only splits with keys) */
    const int32_t group = a.n_head / a.n_kv_head, hsplit = group / gh;
    const int32_t kvh = (int32_t)blockIdx.y / hsplit, h0 = kvh * group + ((int32_t)blockIdx.y % hsplit) * gh;
    const int32_t nq = tile.n_rows * gh; /* query vector qi: row row0 + qi / gh, head h0 + qi % gh */
    const int t = threadIdx.x, warp = t >> 5, lane = t & 31;

    for (int32_t i = t; i < QN * HD; i += DA_THREADS) {
        const int32_t qi = i / HD, d = i % HD;
        float v = 0.0f;
        if (qi < nq) v = a.q[(size_t)(tile.row0 + qi / gh) * a.q_stride + (size_t)(h0 + qi % gh) * HD + d];
        Qs[i] = v;
    }
    for (int32_t qi = t; qi < QN; qi += DA_THREADS) {
        NVs[qi] = qi < nq ? a.rows[tile.row0 + qi / gh].nv : 0;
        TRs[qi] = qi < nq ? a.rows[tile.row0 + qi / gh].tree : 0;
    }
    __syncthreads();

    const uint8_t *kc = (const uint8_t *)a.k_cache, *vc = (const uint8_t *)a.v_cache;
    const int32_t bs = a.block_size, n_kv = a.n_kv_head, kv_len = tile.kv_len;
    const int64_t unit = tdm_kv_unit_bytes(a.cache_type, bs, HD);
    const int32_t *tab = a.tabs + tile.tab;
    /* key ranks to slots: a token-tree row is alone in its tile (cuda_fused.h) */
    const int32_t mnv = a.rows[tile.row0].nv;
    const uint64_t mtree = a.rows[tile.row0].tree;

    /* 1. scores of keys key, key + 1 (same cache block: bs is a multiple of 8; a tree
     * row's ranks past its prefix: each key from its own slot) */
    {
        const int32_t key = split0 + 2 * t;
        float s0[QN], s1[QN], ks0 = 1.0f, ks1 = 1.0f;
#pragma unroll
        for (int qi = 0; qi < QN; qi++) s0[qi] = s1[qi] = 0.0f;
        if constexpr (q8) Vsc[2 * t] = Vsc[2 * t + 1] = 0.0f;
        if (key < kv_len) {
            const bool lin = tdm_cu_keys_linear(mnv, mtree, key, 2);
            const int32_t sl0 = tdm_cu_key_slot(mnv, mtree, key);
            const int32_t sl1 = lin ? sl0 + 1 : key + 1 < kv_len ? tdm_cu_key_slot(mnv, mtree, key + 1) : sl0;
            const uint8_t *ku = tdm_cu_kv_unit(kc, tab[sl0 / bs], n_kv, kvh, unit);
            const uint8_t *ku1 = lin ? ku : tdm_cu_kv_unit(kc, tab[sl1 / bs], n_kv, kvh, unit);
            const C *kp = (const C *)ku + sl0 % bs;   /* K[0][key] */
            const C *kp1 = (const C *)ku1 + sl1 % bs; /* K[0][key + 1] */
            if constexpr (q8) {
                const uint8_t *vu = tdm_cu_kv_unit(vc, tab[sl0 / bs], n_kv, kvh, unit);
                const uint8_t *vu1 = lin ? vu : tdm_cu_kv_unit(vc, tab[sl1 / bs], n_kv, kvh, unit);
                ks0 = tdm_cu_kv_scale<C>(ku, bs, HD, sl0 % bs), ks1 = tdm_cu_kv_scale<C>(ku1, bs, HD, sl1 % bs);
                Vsc[2 * t] = tdm_cu_kv_scale<C>(vu, bs, HD, sl0 % bs);
                Vsc[2 * t + 1] = tdm_cu_kv_scale<C>(vu1, bs, HD, sl1 % bs);
            }
#pragma unroll 4
            for (int32_t d = 0; d < HD; d += 4) {
                float2 kf[4];
#pragma unroll
                for (int e = 0; e < 4; e++)
                    kf[e] = lin ? tdm_cu_kv_val2<C>(kp + (size_t)(d + e) * bs)
                                : make_float2(tdm_cu_kv_val<C>(kp[(size_t)(d + e) * bs]),
                                              tdm_cu_kv_val<C>(kp1[(size_t)(d + e) * bs]));
#pragma unroll
                for (int qi = 0; qi < QN; qi++) {
                    if (qi >= nq) continue;
                    const float4 q4 = *(const float4 *)(Qs + (size_t)qi * HD + d);
                    float u0 = s0[qi], u1 = s1[qi];
                    u0 = fmaf(q4.x, kf[0].x, u0);
                    u1 = fmaf(q4.x, kf[0].y, u1);
                    u0 = fmaf(q4.y, kf[1].x, u0);
                    u1 = fmaf(q4.y, kf[1].y, u1);
                    u0 = fmaf(q4.z, kf[2].x, u0);
                    u1 = fmaf(q4.z, kf[2].y, u1);
                    u0 = fmaf(q4.w, kf[3].x, u0);
                    u1 = fmaf(q4.w, kf[3].y, u1);
                    s0[qi] = u0;
                    s1[qi] = u1;
                }
            }
        }
#pragma unroll
        for (int qi = 0; qi < QN; qi++) {
            if (qi >= nq) continue;
            const int32_t nv = NVs[qi];
            const uint64_t tr = TRs[qi];
            *(float2 *)&Ps[qi][2 * t] = make_float2(tdm_cu_score(tdm_cu_row_sees(nv, tr, key), s0[qi] * a.scale * ks0),
                                                    tdm_cu_score(tdm_cu_row_sees(nv, tr, key + 1), s1[qi] * a.scale * ks1));
        }
    }
    __syncthreads();

    /* 2. per (query vector, stream), a warp: k_flash's online softmax over the
     * stream's chunks (lane = key within the chunk) */
    for (int32_t sx = warp; sx < nq * W; sx += DA_THREADS / 32) {
        const int32_t qi = sx / W, w = sx % W;
        float m = -INFINITY, l = 0.0f;
        for (int32_t u = w; u < DA_CHUNKS; u += W) {
            if (split0 + u * 32 >= kv_len) break;
            const float sc = Ps[qi][u * 32 + lane];
            const float mn = tdm_cu_max_nan(m, tdm_cu_warp_max(sc));
            float p = 0.0f, corr = 1.0f;
            if (mn != -INFINITY) {
                corr = expf(m - mn);
                p = expf(sc - mn);
            }
            l = fmaf(l, corr, tdm_cu_warp_sum(p));
            m = mn;
            Ps[qi][u * 32 + lane] = p;
            if (lane == 0) Cs[qi][u] = corr;
        }
        if (lane == 0) {
            Ms[qi][w] = m;
            Ls[qi][w] = l;
        }
    }
    __syncthreads();

    /* 3. weighted sums of V, dims 2 dp, 2 dp + 1, query vectors g, g + G, ... */
    const int32_t dp = t % HP, g = t / HP;
    float M[QG], L[QG];
    float2 A[QG];
#pragma unroll
    for (int i = 0; i < QG; i++) {
        const int32_t qi = g + i * G;
        float mx = -INFINITY;
        if (qi < nq)
            for (int w = 0; w < W; w++) mx = tdm_cu_max_nan(mx, Ms[qi][w]);
        M[i] = mx;
        L[i] = 0.0f;
        A[i] = make_float2(0.0f, 0.0f);
    }
    /* stream w's weighted sum of V rows, in key order, for query vectors q0, q0 + G, ... */
    auto stream_sum = [&](int w, int32_t q0, float2 *acc) {
#pragma unroll
        for (int i = 0; i < QG; i++) acc[i] = make_float2(0.0f, 0.0f);
        for (int32_t u = w; u < DA_CHUNKS; u += W) {
            const int32_t base = split0 + u * 32;
            if (base >= kv_len) break;
#pragma unroll
            for (int i = 0; i < QG; i++) {
                const int32_t qi = q0 + i * G;
                if (qi >= nq) continue;
                const float c = Cs[qi][u];
                acc[i] = make_float2(acc[i].x * c, acc[i].y * c);
            }
            for (int32_t j0 = 0; j0 < 32; j0 += DA_VKEYS) {
                float2 v[DA_VKEYS];
#pragma unroll
                for (int j = 0; j < DA_VKEYS; j++) {
                    const int32_t key = base + j0 + j;
                    v[j] = make_float2(0.0f, 0.0f);
                    if (key < kv_len) {
                        const int32_t slot = tdm_cu_key_slot(mnv, mtree, key);
                        const uint8_t *vu = tdm_cu_kv_unit(vc, tab[slot / bs], n_kv, kvh, unit);
                        v[j] = tdm_cu_kv_val2<C>((const C *)vu + (size_t)(slot % bs) * HD + 2 * dp);
                    }
                }
#pragma unroll
                for (int j = 0; j < DA_VKEYS; j++)
#pragma unroll
                    for (int i = 0; i < QG; i++) {
                        const int32_t qi = q0 + i * G;
                        if (qi >= nq) continue;
                        float p = Ps[qi][u * 32 + j0 + j];
                        if constexpr (q8) p *= Vsc[u * 32 + j0 + j];
                        acc[i] = make_float2(fmaf(p, v[j].x, acc[i].x), fmaf(p, v[j].y, acc[i].y));
                    }
            }
        }
    };
    /* the streams folded in stream order with weights exp(m_w - M), as k_flash merges its warps */
    auto fold = [&](int w, const float2 *acc) {
#pragma unroll
        for (int i = 0; i < QG; i++) {
            const int32_t qi = g + i * G;
            if (qi >= nq || M[i] == -INFINITY) continue;
            const float e = expf(Ms[qi][w] - M[i]);
            L[i] = fmaf(e, Ls[qi][w], L[i]);
            A[i] = make_float2(fmaf(e, acc[i].x, A[i].x), fmaf(e, acc[i].y, A[i].y));
        }
    };
    if constexpr (QN == 1 && G >= 2) {
        /* One query vector (MHA decode): the G thread groups would otherwise idle but
         * one, so they take the streams between them (group g: streams g, g + G, ...),
         * park each stream's sum in shared memory, and group 0 folds them in stream
         * order - the same operations in the same order, so the same bits. */
        __shared__ float2 Af[W][HP];
        if (g < G)
            for (int w = g; w < W; w += G) {
                float2 acc[QG];
                stream_sum(w, 0, acc);
                Af[w][dp] = acc[0];
            }
        __syncthreads();
        if (g != 0) return;
        for (int w = 0; w < W; w++) {
            const float2 acc[1] = {Af[w][dp]};
            fold(w, acc);
        }
    } else {
        if (g >= G) return;
        for (int w = 0; w < W; w++) {
            float2 acc[QG];
            stream_sum(w, g, acc);
            fold(w, acc);
        }
    }

#pragma unroll
    for (int i = 0; i < QG; i++) {
        const int32_t qi = g + i * G;
        if (qi >= nq) continue;
        const int32_t r = tile.row0 + qi / gh, h = h0 + qi % gh;
        const int32_t ns_row = (tdm_cu_row_end(NVs[qi], TRs[qi]) + TDM_FLASH_SPLIT - 1) / TDM_FLASH_SPLIT;
        if (ns_row <= 1 && blockIdx.z > 0) continue;
        if (ns_row > 1 && (int32_t)blockIdx.z >= ns_row) continue; /* none of the row's keys here */
        if (ns_row <= 1) { /* the row's only split (or none: 0): its output, as the combine gives it */
            const size_t o = (size_t)r * a.n_head * HD + (size_t)h * HD + 2 * dp;
            const float v0 = tdm_cu_attn_div(A[i].x, L[i]), v1 = tdm_cu_attn_div(A[i].y, L[i]);
            if (a.out_type == TDM_F16) {
                ((__half *)a.out)[o] = __float2half_rn(v0);
                ((__half *)a.out)[o + 1] = __float2half_rn(v1);
            } else if (a.out_type == TDM_BF16) {
                ((__nv_bfloat16 *)a.out)[o] = __float2bfloat16_rn(v0);
                ((__nv_bfloat16 *)a.out)[o + 1] = __float2bfloat16_rn(v1);
            } else {
                ((float *)a.out)[o] = v0;
                ((float *)a.out)[o + 1] = v1;
            }
            continue;
        }
        float *pr = a.part + (((size_t)blockIdx.z * a.n_rows + r) * a.n_head + h) * (HD + 2);
        pr[2 * dp] = A[i].x;
        pr[2 * dp + 1] = A[i].y;
        if (dp == 0) {
            pr[HD] = M[i];
            pr[HD + 1] = L[i];
        }
    }
}

/* Query vectors (rows x heads) of a tile up to which this kernel is used: with more
 * (grouped-query verification) the tiled kernel's shared K / V tiles win (measured:
 * 64 sequences, 32 / 8 heads, 5 rows: 191-198 against 240-247 GB/s). */
#define TDM_FLASH_DECODE_QMAX 8

bool tdm_flash_decode_use(const tdm_cuda *c, int32_t tile_rows, int32_t heads_per_block) {
    return c->attn_path == TDM_CUDA_ATTN_AUTO && tile_rows >= 1 && tile_rows <= TDM_FLASH_DECODE_ROWS && heads_per_block >= 1 &&
           tile_rows * heads_per_block <= TDM_FLASH_DECODE_QMAX;
}

template <int HD, int QN>
static tandem_status launch_decode(tdm_cuda *c, const tdm_flash_args *a, dim3 grid, tdm_err *err) {
    if (a->cache_type == TDM_Q8_0) tdm_launch(k_flash_decode<HD, QN, int8_t>, grid, DA_THREADS, 0, c->stream, *a, a->heads_per_block);
    else if (a->cache_type == TDM_F8_E4M3)
        tdm_launch(k_flash_decode<HD, QN, __nv_fp8_e4m3>, grid, DA_THREADS, 0, c->stream, *a, a->heads_per_block);
    else tdm_launch(k_flash_decode<HD, QN, __half>, grid, DA_THREADS, 0, c->stream, *a, a->heads_per_block);
    TDM_CU_LAUNCHED("decode attention");
    return TANDEM_OK;
}

/* The kernel for the largest tile's query vectors (tile_rows x heads per block). */
template <int HD> static tandem_status launch_hd(tdm_cuda *c, const tdm_flash_args *a, dim3 grid, tdm_err *err) {
    if (tdm_flash_warps(HD) != da_streams<HD>::n)
        return tdm_seterr(err, TANDEM_ERR_BACKEND, "decode attention: streams %d, tiled kernel's warps %d",
                          da_streams<HD>::n, (int)tdm_flash_warps(HD));
    const int32_t nq = a->tile_rows * a->heads_per_block;
    if (nq <= 1) return launch_decode<HD, 1>(c, a, grid, err);
    if (nq <= 4) return launch_decode<HD, 4>(c, a, grid, err);
    if (nq <= 8) return launch_decode<HD, 8>(c, a, grid, err);
    return launch_decode<HD, TDM_FLASH_QMAX>(c, a, grid, err);
}

/* The caller (tdm_cuda_flash) has checked the tiles and the grid; it combines the
 * splits after this. */
tandem_status tdm_cuda_flash_decode(tdm_cuda *c, const tdm_flash_args *a, tdm_err *err) {
    const int32_t gh = a->heads_per_block;
    if (a->tile_rows * gh > TDM_FLASH_QMAX || a->block_size % 8 != 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "decode attention: %d rows x %d heads, block size %d",
                          (int)a->tile_rows, (int)gh, (int)a->block_size);
    const dim3 grid((unsigned)a->n_tiles, (unsigned)(a->n_kv_head * (a->n_head / a->n_kv_head / gh)), (unsigned)a->n_splits);
    switch (a->head_dim) {
    case 64: return launch_hd<64>(c, a, grid, err);
    case 80: return launch_hd<80>(c, a, grid, err);
    case 96: return launch_hd<96>(c, a, grid, err);
    case 128: return launch_hd<128>(c, a, grid, err);
    case 256: return launch_hd<256>(c, a, grid, err);
    default: return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "decode attention: head_dim %d", (int)a->head_dim);
    }
}
