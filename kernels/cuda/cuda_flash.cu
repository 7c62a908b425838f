/* cuda_flash.cu - attention of a forward's rows over the paged KV cache, by tiles
 * of rows and split key ranges (flash-decoding), for decode, verification and
 * prefill alike.
 *
 * A thread block takes one tile (consecutive rows of one sequence), some heads of
 * one kv head (its "query vectors": rows x heads, at most QN) and one split of
 * TDM_FLASH_SPLIT keys, so the tile's K / V are read once per split whatever the
 * number of rows and heads sharing them (grouped-query attention).  Its warps (one
 * per 32 keys of the split) take 32 keys each at a time: a warp stages them in its own shared memory (K as
 * [d][key], V as [key][d], f16, 16-byte loads; a q8_0 or fp8 cache: the int8 quants
 * or E4M3 codes, 8-byte loads, and the keys' scales, applied as the CPU does:
 * score = (scale q.kq) kscale, weight p vscale), each lane scores one key against
 * every query vector (f32 FMAs, d in increasing order), the warp keeps a running
 * maximum, sum and weighted sum of V per query vector (online softmax), and the
 * warps' states are merged in warp order at the end.  A row whose keys fit one
 * split gets its output there; for the others a second kernel combines the splits
 * of each (row, head) in split order (giving a one-split row exactly the same).
 *
 * Every grouping of keys is fixed by the key's index alone (32-key chunks, splits
 * of TDM_FLASH_SPLIT), and keys a row cannot see contribute exact zeros, so a row's
 * output does not depend on which other rows share its tile or its batch.
 * Invisible keys are masked (causal within the new rows: a row sees [0, nv); a
 * token-tree row also the slots nv + j of its tree mask's bits j).
 *
 * Tiles of few rows (decode, verification) go to cuda_decode_attn.cu instead, which
 * computes the same thing in the same order without staging (tdm_cuda_flash).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "cuda_fused.h"
#include "cuda_kvq8.cuh"
#include "cuda_kvstage.cuh"
#include "cuda_nonfinite.cuh"
#include "cuda_quant.cuh"
#include "cuda_reduce.cuh"

/* Warps per thread block: one per 32-key chunk of a split, so that a short context
 * is one step of every warp (four for head dim 256, whose K / V chunks are twice as
 * large in shared memory). */
template <int HD> struct fl_warps { static constexpr int n = HD >= 256 ? 4 : TDM_FLASH_SPLIT / 32; };
#define FL_CHUNK TDM_KV_CHUNK /* keys per warp step */

/* For the decode kernel (cuda_decode_attn.cu), which takes the chunks of a split in
 * the same streams as these warps. */
int32_t tdm_flash_warps(int32_t head_dim) {
    switch (head_dim) {
    case 64: return fl_warps<64>::n;
    case 80: return fl_warps<80>::n;
    case 96: return fl_warps<96>::n;
    case 128: return fl_warps<128>::n;
    case 256: return fl_warps<256>::n;
    default: return 0;
    }
}

int32_t tdm_flash_heads_per_block(const tdm_cuda *c, const tdm_batch *bt, int32_t n_head, int32_t n_kv_head,
                                  int32_t max_q) {
    int32_t max_nv = 0;
    for (int32_t r = 0; r < bt->n_rows; r++)
        max_nv = TDM_MAX(max_nv, tdm_cuda_row_end(bt->n_visible[r], bt->tree && bt->tree_mask ? bt->tree_mask[r] : 0));
    const int64_t splits = TDM_MAX(1, (max_nv + TDM_FLASH_SPLIT - 1) / TDM_FLASH_SPLIT);
    const int64_t tiles = (bt->n_rows + max_q - 1) / max_q;
    if (tiles * splits * n_kv_head < c->n_sm / 2) return 1;
    const int32_t g = n_head / n_kv_head;
    for (int32_t d = TDM_MIN(g, max_q); d > 1; d--)
        if (g % d == 0) return d;
    return 1;
}

bool tdm_flash_supported(int32_t head_dim, int32_t block_size, uint32_t cache_type) {
    const bool hd = head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256;
    return hd && block_size > 0 && block_size % 8 == 0 && (cache_type == TDM_F16 || tdm_kv_scaled(cache_type));
}

size_t tdm_flash_part_floats(int32_t n_splits, int32_t n_rows, int32_t n_head, int32_t head_dim) {
    return (size_t)n_splits * (size_t)n_rows * (size_t)n_head * (size_t)(head_dim + 2);
}

/* C: the cache element type, __half (f16), int8_t (q8_0 quants) or __nv_fp8_e4m3
 * (fp8 codes). */
template <int HD, int QN, typename C> struct fl_smem {
    static constexpr bool q8 = tdm_cu_kv_scaled<C>(); /* (q8_0 or fp8: with scales) */
    static constexpr size_t q_bytes = (size_t)QN * HD * 4;
    static constexpr size_t nv_bytes = (size_t)QN * 16; /* [QN] nv, padding, [QN] tree masks */
    static constexpr size_t kv_bytes = (size_t)FL_CHUNK * HD * sizeof(C); /* K or V of one warp */
    static constexpr size_t p_bytes = (size_t)QN * FL_CHUNK * 4;
    static constexpr size_t sc_bytes = q8 ? 2 * FL_CHUNK * 4 : 0; /* q8_0, fp8: the keys' K and V scales */
    static constexpr size_t warp_bytes = 2 * kv_bytes + p_bytes + sc_bytes;
    static constexpr size_t total = q_bytes + nv_bytes + fl_warps<HD>::n * warp_bytes;
    static_assert((size_t)QN * HD * 4 <= 2 * kv_bytes, "merge area fits a warp's K / V space");
};

template <int HD, int QN, typename C>
__global__ void __launch_bounds__(fl_warps<HD>::n * 32)
k_flash(const tdm_flash_args a, int32_t gh) {
    TDM_PDL_ENTRY();
    typedef fl_smem<HD, QN, C> S;
    constexpr int T = (HD + 63) / 64; /* pairs of output dims per lane */
    extern __shared__ __align__(16) uint8_t smem[];
    float *Qs = (float *)smem;                        /* [QN][HD] */
    int32_t *NVs = (int32_t *)(smem + S::q_bytes);    /* [QN] */
    uint64_t *TRs = (uint64_t *)(smem + S::q_bytes + (size_t)QN * 8); /* [QN] tree masks */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    uint8_t *wbase = smem + S::q_bytes + S::nv_bytes + (size_t)warp * S::warp_bytes;
    C *Ks = (C *)wbase;                               /* [HD][32] */
    C *Vs = (C *)(wbase + S::kv_bytes);               /* [32][HD] */
    float *Ps = (float *)(wbase + 2 * S::kv_bytes);   /* [QN][32] */
    float *Kd = (float *)(wbase + 2 * S::kv_bytes + S::p_bytes); /* q8_0, fp8: [32] K scales, then [32] V scales */
    float *Vd = Kd + FL_CHUNK;

    const tdm_cuda_tile tile = a.tiles[blockIdx.x];
    const int32_t split0 = (int32_t)blockIdx.z * TDM_FLASH_SPLIT;
    if (blockIdx.z > 0 && split0 >= tile.kv_len) return; /* (the combine reads only splits with keys) */
    const int32_t group = a.n_head / a.n_kv_head, hsplit = group / gh;
    const int32_t kvh = (int32_t)blockIdx.y / hsplit, h0 = kvh * group + ((int32_t)blockIdx.y % hsplit) * gh;
    const int32_t nq = tile.n_rows * gh;

    for (int32_t i = threadIdx.x; i < QN * HD; i += blockDim.x) {
        const int32_t qi = i / HD, d = i % HD;
        float v = 0.0f;
        if (qi < nq) v = a.q[(size_t)(tile.row0 + qi / gh) * a.q_stride + (size_t)(h0 + qi % gh) * HD + d];
        Qs[i] = v;
    }
    for (int32_t qi = threadIdx.x; qi < QN; qi += blockDim.x) {
        NVs[qi] = qi < nq ? a.rows[tile.row0 + qi / gh].nv : 0;
        TRs[qi] = qi < nq ? a.rows[tile.row0 + qi / gh].tree : 0;
    }
    __syncthreads();

    const int32_t bs = a.block_size, n_kv = a.n_kv_head;
    const int32_t *tab = a.tabs + tile.tab;
    /* key ranks to slots: a token-tree row is alone in its tile (cuda_fused.h) */
    const int32_t mnv = a.rows[tile.row0].nv;
    const uint64_t mtree = a.rows[tile.row0].tree;
    float m[QN], l[QN];
    float2 acc[QN][T];
#pragma unroll
    for (int qi = 0; qi < QN; qi++) {
        m[qi] = -INFINITY;
        l[qi] = 0.0f;
#pragma unroll
        for (int t = 0; t < T; t++) acc[qi][t] = make_float2(0.0f, 0.0f);
    }

    constexpr int W = fl_warps<HD>::n;
    for (int32_t u = warp; u < TDM_FLASH_SPLIT / FL_CHUNK; u += W) {
        const int32_t base = split0 + u * FL_CHUNK;
        if (base >= tile.kv_len) break;
        /* stage K as [d][key] and V as [key][d]; keys past kv_len as zeros */
        if constexpr (S::q8)
            tdm_kv_stage_q8<HD, C>(lane, base, tile.kv_len, tab, bs, n_kv, kvh, (const uint8_t *)a.k_cache,
                                   (const uint8_t *)a.v_cache, Ks, Vs, Kd, Vd, mnv, mtree);
        else
            tdm_kv_stage<HD>(lane, base, tile.kv_len, tab, bs, n_kv, kvh, (const __half *)a.k_cache,
                             (const __half *)a.v_cache, Ks, Vs, mnv, mtree);
        __syncwarp();
        /* scores: lane = key */
        float s[QN];
#pragma unroll
        for (int qi = 0; qi < QN; qi++) s[qi] = 0.0f;
        for (int32_t d = 0; d < HD; d += 4) {
            float kf[4];
#pragma unroll
            for (int e = 0; e < 4; e++) kf[e] = tdm_cu_kv_val<C>(Ks[(size_t)(d + e) * FL_CHUNK + lane]);
#pragma unroll
            for (int qi = 0; qi < QN; qi++) {
                if (qi >= nq) continue;
                const float4 q4 = *(const float4 *)(Qs + (size_t)qi * HD + d);
                float v = s[qi];
                v = fmaf(q4.x, kf[0], v);
                v = fmaf(q4.y, kf[1], v);
                v = fmaf(q4.z, kf[2], v);
                v = fmaf(q4.w, kf[3], v);
                s[qi] = v;
            }
        }
        const int32_t key = base + lane;
        float kd = 1.0f;
        if constexpr (S::q8) kd = Kd[lane];
#pragma unroll
        for (int qi = 0; qi < QN; qi++) {
            if (qi >= nq) continue;
            const float sc = tdm_cu_score(tdm_cu_row_sees(NVs[qi], TRs[qi], key), s[qi] * a.scale * kd);
            const float mn = tdm_cu_max_nan(m[qi], tdm_cu_warp_max(sc)); /* (NaN: every weight NaN) */
            float p = 0.0f, corr = 1.0f;
            if (mn != -INFINITY) {
                corr = expf(m[qi] - mn);
                p = expf(sc - mn);
            }
            l[qi] = fmaf(l[qi], corr, tdm_cu_warp_sum(p)); /* (explicit: the decode kernel's too) */
            m[qi] = mn;
#pragma unroll
            for (int t = 0; t < T; t++) acc[qi][t] = make_float2(acc[qi][t].x * corr, acc[qi][t].y * corr);
            Ps[qi * FL_CHUNK + lane] = p;
        }
        __syncwarp();
        /* weighted sum of V: lane owns dims 2 lane + 64 t */
        for (int32_t j = 0; j < FL_CHUNK; j++) {
            float2 v[T];
#pragma unroll
            for (int t = 0; t < T; t++) {
                const int32_t dd = 2 * lane + 64 * t;
                v[t] = dd < HD ? tdm_cu_kv_val2<C>(Vs + (size_t)j * HD + dd) : make_float2(0.0f, 0.0f);
            }
            float vd = 1.0f;
            if constexpr (S::q8) vd = Vd[j];
#pragma unroll
            for (int qi = 0; qi < QN; qi++) {
                if (qi >= nq) continue;
                const float p = Ps[qi * FL_CHUNK + j] * vd;
#pragma unroll
                for (int t = 0; t < T; t++) acc[qi][t] = make_float2(fmaf(p, v[t].x, acc[qi][t].x), fmaf(p, v[t].y, acc[qi][t].y));
            }
        }
        __syncwarp();
    }

    /* merge the warps in warp order: each warp's state into its own K / V space */
    __syncthreads();
    float *As = (float *)wbase; /* [QN][HD] */
    float *Ms = Ps;             /* [QN] m, then [QN] l (the warp's P space) */
#pragma unroll
    for (int qi = 0; qi < QN; qi++) {
        if (qi >= nq) continue;
#pragma unroll
        for (int t = 0; t < T; t++) {
            const int32_t dd = 2 * lane + 64 * t;
            if (dd < HD) {
                As[(size_t)qi * HD + dd] = acc[qi][t].x;
                As[(size_t)qi * HD + dd + 1] = acc[qi][t].y;
            }
        }
        if (lane == 0) {
            Ms[qi] = m[qi];
            Ms[QN + qi] = l[qi];
        }
    }
    __syncthreads();
    for (int32_t i = threadIdx.x; i < nq * HD; i += blockDim.x) {
        const int32_t qi = i / HD, d = i % HD;
        float M = -INFINITY;
        for (int w = 0; w < W; w++) {
            const float *mw = (const float *)(smem + S::q_bytes + S::nv_bytes + (size_t)w * S::warp_bytes + 2 * S::kv_bytes);
            M = tdm_cu_max_nan(M, mw[qi]);
        }
        float L = 0.0f, A = 0.0f;
        if (M != -INFINITY)
            for (int w = 0; w < W; w++) {
                const uint8_t *wb = smem + S::q_bytes + S::nv_bytes + (size_t)w * S::warp_bytes;
                const float *mw = (const float *)(wb + 2 * S::kv_bytes);
                const float e = expf(mw[qi] - M);
                L = fmaf(e, mw[QN + qi], L);
                A = fmaf(e, ((const float *)wb)[(size_t)qi * HD + d], A);
            }
        const int32_t r = tile.row0 + qi / gh, h = h0 + qi % gh;
        const int32_t ns_row = (tdm_cu_row_end(NVs[qi], TRs[qi]) + TDM_FLASH_SPLIT - 1) / TDM_FLASH_SPLIT;
        if (ns_row <= 1 && blockIdx.z > 0) continue;
        if (ns_row > 1 && (int32_t)blockIdx.z >= ns_row) continue; /* none of the row's keys here */
        if (ns_row <= 1) { /* the row's only split (or none: 0): its output, as the combine gives it */
            const size_t o = (size_t)r * a.n_head * HD + (size_t)h * HD + d;
            const float v = tdm_cu_attn_div(A, L);
            if (a.out_type == TDM_F16) ((__half *)a.out)[o] = __float2half_rn(v);
            else if (a.out_type == TDM_BF16) ((__nv_bfloat16 *)a.out)[o] = __float2bfloat16_rn(v);
            else ((float *)a.out)[o] = v;
            continue;
        }
        float *pr = a.part + (((size_t)blockIdx.z * a.n_rows + r) * a.n_head + h) * (HD + 2);
        pr[d] = A;
        if (d == 0) {
            pr[HD] = M;
            pr[HD + 1] = L;
        }
    }
}

/* Block (row * n_head + head), HD threads at most: the splits holding the row's
 * visible keys combined in split order. */
template <typename O>
__global__ void k_flash_combine(const tdm_cuda_row *rows, const float *part, int32_t n_rows, int32_t n_head,
                                int32_t hd, O *out) {
    TDM_PDL_ENTRY();
    const int32_t r = (int32_t)blockIdx.x / n_head, h = (int32_t)blockIdx.x % n_head;
    const int32_t ns = (tdm_cu_row_end(rows[r].nv, rows[r].tree) + TDM_FLASH_SPLIT - 1) / TDM_FLASH_SPLIT;
    if (ns <= 1) return; /* (k_flash wrote it: A / L of its one split, as below) */
    const size_t stride = (size_t)n_rows * n_head * (hd + 2);
    const float *p0 = part + ((size_t)r * n_head + h) * (hd + 2);
    float M = -INFINITY;
    for (int32_t s = 0; s < ns; s++) M = tdm_cu_max_nan(M, p0[s * stride + hd]);
    float L = 0.0f;
    for (int32_t s = 0; s < ns; s++)
        if (p0[s * stride + hd] != -INFINITY) L = fmaf(expf(p0[s * stride + hd] - M), p0[s * stride + hd + 1], L);
    O *o = out + (size_t)r * n_head * hd + (size_t)h * hd;
    for (int32_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float A = 0.0f;
        for (int32_t s = 0; s < ns; s++)
            if (p0[s * stride + hd] != -INFINITY) A = fmaf(expf(p0[s * stride + hd] - M), p0[s * stride + d], A);
        o[d] = tdm_cu_from_f32<O>(tdm_cu_attn_div(A, L));
    }
}

template <int HD, int QN, typename C>
static tandem_status launch_flash(tdm_cuda *c, const tdm_flash_args *a, dim3 grid, int32_t gh, tdm_err *err) {
    const size_t smem = fl_smem<HD, QN, C>::total;
    if (smem > c->smem_optin)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: head_dim %d needs %zu bytes of shared memory (%zu)",
                          HD, smem, c->smem_optin);
    static bool raised = false; /* (per process: every device of a kind has the same limit) */
    if (smem > 48 * 1024 && !raised) {
        TDM_CU(cudaFuncSetAttribute(k_flash<HD, QN, C>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        raised = true;
    }
    tdm_launch(k_flash<HD, QN, C>, grid, fl_warps<HD>::n * 32, smem, c->stream, *a, gh);
    TDM_CU_LAUNCHED("attention");
    return TANDEM_OK;
}

template <int HD, typename C>
static tandem_status launch_qn(tdm_cuda *c, const tdm_flash_args *a, dim3 grid, int32_t gh, tdm_err *err) {
    if (a->tile_rows * gh <= 4) return launch_flash<HD, 4, C>(c, a, grid, gh, err);
    return launch_flash<HD, TDM_FLASH_QMAX, C>(c, a, grid, gh, err);
}

template <int HD> static tandem_status launch_hd(tdm_cuda *c, const tdm_flash_args *a, dim3 grid, int32_t gh,
                                                  tdm_err *err) {
    if (a->cache_type == TDM_Q8_0) return launch_qn<HD, int8_t>(c, a, grid, gh, err);
    if (a->cache_type == TDM_F8_E4M3) return launch_qn<HD, __nv_fp8_e4m3>(c, a, grid, gh, err);
    return launch_qn<HD, __half>(c, a, grid, gh, err);
}

tandem_status tdm_cuda_flash(tdm_cuda *c, const tdm_flash_args *a, tdm_err *err) {
    if (a->n_rows <= 0) return TANDEM_OK;
    if (a->cache_type != TDM_F16 && !tdm_kv_scaled(a->cache_type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention (tiles): cache type %s", tdm_dtype_name(a->cache_type));
    const int32_t gh = a->heads_per_block;
    if (gh <= 0 || (a->n_head / a->n_kv_head) % gh != 0 || a->tile_rows * gh > TDM_FLASH_QMAX || a->tile_rows <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention: %d rows x %d heads per tile", (int)a->tile_rows,
                          (int)gh);
    if (a->n_tiles > 0x7fffffff || a->n_splits > 65535 || (int64_t)a->n_kv_head * (a->n_head / a->n_kv_head / gh) > 65535)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: grid of %d tiles x %d splits", (int)a->n_tiles,
                          (int)a->n_splits);
    const dim3 grid((unsigned)a->n_tiles, (unsigned)(a->n_kv_head * (a->n_head / a->n_kv_head / gh)), (unsigned)a->n_splits);
    tandem_status st;
    /* decode / verification tiles go to cuda_decode_attn.cu when they fill the GPU
     * (two blocks per SM): on a small grid (one sequence) the tiled kernel's eight
     * warps per split are faster (measured: batch 1 of the 7B shapes 202 against 131
     * tok/s); both give the same bits */
    const int64_t n_blocks = (int64_t)grid.x * grid.y * grid.z;
    if (tdm_flash_decode_use(c, a->tile_rows, gh) && n_blocks >= 2 * (int64_t)c->n_sm) {
        if ((st = tdm_cuda_flash_decode(c, a, err))) return st;
    } else switch (a->head_dim) {
    case 64: st = launch_hd<64>(c, a, grid, gh, err); break;
    case 80: st = launch_hd<80>(c, a, grid, gh, err); break;
    case 96: st = launch_hd<96>(c, a, grid, gh, err); break;
    case 128: st = launch_hd<128>(c, a, grid, gh, err); break;
    case 256: st = launch_hd<256>(c, a, grid, gh, err); break;
    default: return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: head_dim %d", (int)a->head_dim);
    }
    if (st) return st;
    if (a->n_splits <= 1) return TANDEM_OK; /* every row had one split: written by k_flash */
    const unsigned blocks = (unsigned)(a->n_rows * a->n_head), th = (unsigned)TDM_MIN(a->head_dim, 256);
    if (a->out_type == TDM_F16)
        tdm_launch(k_flash_combine<__half>, blocks, th, 0, c->stream, a->rows, a->part, a->n_rows, a->n_head, a->head_dim, (__half *)a->out);
    else if (a->out_type == TDM_BF16)
        tdm_launch(k_flash_combine<__nv_bfloat16>, blocks, th, 0, c->stream, a->rows, a->part, a->n_rows, a->n_head, a->head_dim,
                                                                       (__nv_bfloat16 *)a->out);
    else
        tdm_launch(k_flash_combine<float>, blocks, th, 0, c->stream, a->rows, a->part, a->n_rows, a->n_head, a->head_dim, (float *)a->out);
    TDM_CU_LAUNCHED("attention combine");
    return TANDEM_OK;
}
