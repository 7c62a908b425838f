/* cuda_kvstage.cuh - a warp's staging of 32 keys of the paged K / V cache into its
 * shared memory, for the tiled attention kernels (cuda_flash.cu): f16 caches, q8_0
 * and fp8 caches as quants / codes and scales. */
#ifndef TDM_CUDA_KVSTAGE_CUH
#define TDM_CUDA_KVSTAGE_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#include "cuda_fused.h"
#include "kv_layout.h"

#define TDM_KV_CHUNK 32 /* keys per staging */

/* Keys [base, base + 32) of a tree row's chunk that reaches its ancestors' ranks
 * (cuda_fused.h: ranks past the row's nv map to slots through its mask), K as
 * Ks[HD][32] and V as Vs[32][HD], zeros for ranks >= kv_len (T the element, f16,
 * int8 quants or E4M3 codes; V8 eight of them; a cache unit of kunit / vunit elements per block
 * and kv head: K element (d, slot p) at d * bs + p, V's at p * HD + d).  Each lane
 * finds its key's slot and cache unit once; K goes lane = key, element by element,
 * V as the linear path's vectors with the key's unit from its lane; the loads are
 * issued in batches of 16 before any store, so the warp waits on memory a few
 * times per chunk, not once per element. */
template <int HD, typename T, typename V8>
__device__ __forceinline__ void tdm_kv_stage_tree(int lane, int32_t base, int32_t kv_len, const int32_t *tab,
                                                  int32_t bs, int32_t n_kv, int32_t kvh, const T *kc, const T *vc,
                                                  int64_t kunit, int64_t vunit, T *Ks, T *Vs, int32_t mnv,
                                                  uint64_t mtree) {
    constexpr int BATCH = 16;
    const bool ok = base + lane < kv_len;
    const int32_t slot = ok ? tdm_cu_key_slot(mnv, mtree, base + lane) : 0;
    const int64_t unit = ok ? (int64_t)tab[slot / bs] * n_kv + kvh : 0;
    const T *kp = kc + unit * kunit + slot % bs; /* element d at kp[d * bs] */
#pragma unroll
    for (int d0 = 0; d0 < HD; d0 += BATCH) {
        T v[BATCH];
#pragma unroll
        for (int e = 0; e < BATCH; e++) v[e] = ok ? kp[(size_t)(d0 + e) * bs] : T(0.0f);
#pragma unroll
        for (int e = 0; e < BATCH; e++) Ks[(size_t)(d0 + e) * TDM_KV_CHUNK + lane] = v[e];
    }
    const int64_t vrow = ok ? unit * vunit + (int64_t)(slot % bs) * HD : -1; /* this key's V, -1: zeros */
    constexpr int NI = HD / 8; /* V loads per lane */
#pragma unroll
    for (int i0 = 0; i0 < NI; i0 += BATCH) {
        V8 v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            if (i0 + b >= NI) break;
            const int32_t q = lane + 32 * (i0 + b), j = q / (HD / 8), dc = q % (HD / 8);
            const int64_t r = __shfl_sync(0xffffffffu, (long long)vrow, j);
            V8 u{};
            if (r >= 0) u = *(const V8 *)(vc + r + 8 * dc);
            v[b] = u;
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            if (i0 + b >= NI) break;
            const int32_t q = lane + 32 * (i0 + b), j = q / (HD / 8), dc = q % (HD / 8);
            *(V8 *)(Vs + (size_t)j * HD + 8 * dc) = v[b];
        }
    }
}

/* Keys [base, base + 32) at consecutive slots, K as Ks[HD][32] and V as Vs[32][HD]
 * (T the element, f16, int8 quants or E4M3 codes; V8 eight of them; a cache unit of kunit /
 * vunit elements per block and kv head: K element (d, slot p) at d * bs + p, V's at
 * p * HD + d): each lane's HD / 8 loads of K and HD / 8 of V issued in batches of up
 * to 16 before any of them is stored, so a warp waits on memory once or twice per
 * chunk, not once per load (the stores to shared memory would otherwise order each
 * load after the previous store).  A group of 8 keys that starts before kv_len is
 * loaded whole (what lies past kv_len only meets masked scores); V of keys >= kv_len
 * is zero. */
template <int HD, typename T, typename V8>
__device__ __forceinline__ void tdm_kv_stage_linear(int lane, int32_t base, int32_t kv_len, const int32_t *tab,
                                                    int32_t bs, int32_t n_kv, int32_t kvh, const T *kc, const T *vc,
                                                    int64_t kunit, int64_t vunit, T *Ks, T *Vs) {
    constexpr int NI = HD / 8;  /* loads of K (and of V) per lane: 4 HD / 32 = 32 (HD / 8) / 32 */
    constexpr int NT = 2 * NI;  /* K's, then V's */
    constexpr int BATCH = 16;
#pragma unroll
    for (int i0 = 0; i0 < NT; i0 += BATCH) {
        V8 v[BATCH];
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int it = i0 + b;
            if (it >= NT) break;
            V8 u{};
            if (it < NI) {
                const int32_t q = lane + 32 * it, kg = q & 3, d = q >> 2, slot = base + 8 * kg;
                if (slot < kv_len)
                    u = *(const V8 *)(kc + ((int64_t)tab[slot / bs] * n_kv + kvh) * kunit + (size_t)d * bs + slot % bs);
            } else {
                const int32_t q = lane + 32 * (it - NI), j = q / (HD / 8), dc = q % (HD / 8), slot = base + j;
                if (slot < kv_len)
                    u = *(const V8 *)(vc + ((int64_t)tab[slot / bs] * n_kv + kvh) * vunit + (size_t)(slot % bs) * HD +
                                      8 * dc);
            }
            v[b] = u;
        }
#pragma unroll
        for (int b = 0; b < BATCH; b++) {
            const int it = i0 + b;
            if (it >= NT) break;
            if (it < NI) {
                const int32_t q = lane + 32 * it, kg = q & 3, d = q >> 2;
                *(V8 *)(Ks + (size_t)d * TDM_KV_CHUNK + 8 * kg) = v[b];
            } else {
                const int32_t q = lane + 32 * (it - NI), j = q / (HD / 8), dc = q % (HD / 8);
                *(V8 *)(Vs + (size_t)j * HD + 8 * dc) = v[b];
            }
        }
    }
}

/* Keys [base, base + 32) of kv head kvh (block table tab, block size bs, n_kv kv
 * heads; caches in kernels/backend.h's layouts) by the 32 lanes of one warp: K as
 * Ks[HD][32] (the cache's own order within a block, 8 keys per 16-byte load; a group
 * of 8 that starts before kv_len is loaded whole, and what lies past kv_len only
 * meets masked scores), V as Vs[32][HD] with zeros for keys >= kv_len.  The caller
 * syncs the warp before reading them. */
template <int HD>
__device__ __forceinline__ void tdm_kv_stage(int lane, int32_t base, int32_t kv_len, const int32_t *tab, int32_t bs,
                                             int32_t n_kv, int32_t kvh, const __half *kc, const __half *vc, __half *Ks,
                                             __half *Vs, int32_t mnv = 0, uint64_t mtree = 0) {
    if (!tdm_cu_keys_linear(mnv, mtree, base, TDM_KV_CHUNK)) {
        tdm_kv_stage_tree<HD, __half, uint4>(lane, base, kv_len, tab, bs, n_kv, kvh, kc, vc, (int64_t)HD * bs,
                                             (int64_t)HD * bs, Ks, Vs, mnv, mtree);
        return;
    }
    tdm_kv_stage_linear<HD, __half, uint4>(lane, base, kv_len, tab, bs, n_kv, kvh, kc, vc, (int64_t)HD * bs,
                                           (int64_t)HD * bs, Ks, Vs);
}

/* The same keys of a q8_0 (T int8_t) or fp8 (T __nv_fp8_e4m3) cache
 * (src/base/kv_layout.h): K's quants / codes as Ks[HD][32] (8 keys per 8-byte load),
 * V's as Vs[32][HD] (8 values per load, zeros for keys >= kv_len), and the keys'
 * scales Kd[32], Vd[32] (0 for keys >= kv_len). */
template <int HD, typename T>
__device__ __forceinline__ void tdm_kv_stage_q8(int lane, int32_t base, int32_t kv_len, const int32_t *tab, int32_t bs,
                                                int32_t n_kv, int32_t kvh, const uint8_t *kc, const uint8_t *vc, T *Ks,
                                                T *Vs, float *Kd, float *Vd, int32_t mnv = 0, uint64_t mtree = 0) {
    static_assert(sizeof(T) == 1, "one byte a value");
    const int64_t unit = tdm_kv_unit_bytes(TDM_Q8_0, bs, HD); /* (fp8's too) */
    if (!tdm_cu_keys_linear(mnv, mtree, base, TDM_KV_CHUNK)) {
        const int32_t key = base + lane, slot = tdm_cu_key_slot(mnv, mtree, key);
        const int64_t blk = key < kv_len ? tab[slot / bs] : -1;
        tdm_kv_stage_tree<HD, T, uint2>(lane, base, kv_len, tab, bs, n_kv, kvh, (const T *)kc, (const T *)vc, unit,
                                        unit, Ks, Vs, mnv, mtree);
        float kd = 0.0f, vd = 0.0f;
        if (blk >= 0) {
            const int64_t at = (blk * n_kv + kvh) * unit + tdm_kv_scale_off(bs, HD) + 4 * (slot % bs);
            kd = *(const float *)(kc + at);
            vd = *(const float *)(vc + at);
        }
        Kd[lane] = kd;
        Vd[lane] = vd;
        return;
    }
    tdm_kv_stage_linear<HD, T, uint2>(lane, base, kv_len, tab, bs, n_kv, kvh, (const T *)kc, (const T *)vc, unit, unit,
                                      Ks, Vs);
    const int32_t slot = base + lane;
    float kd = 0.0f, vd = 0.0f;
    if (slot < kv_len) {
        const int64_t at = ((int64_t)tab[slot / bs] * n_kv + kvh) * unit + tdm_kv_scale_off(bs, HD) + 4 * (slot % bs);
        kd = *(const float *)(kc + at);
        vd = *(const float *)(vc + at);
    }
    Kd[lane] = kd;
    Vd[lane] = vd;
}

#endif
