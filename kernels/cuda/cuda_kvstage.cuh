/* cuda_kvstage.cuh - a warp's staging of 32 keys of the paged K / V cache into its
 * shared memory, shared by the attention kernels (cuda_flash.cu, cuda_flash_tc.cu). */
#ifndef TDM_CUDA_KVSTAGE_CUH
#define TDM_CUDA_KVSTAGE_CUH

#include <cuda_fp16.h>
#include <stdint.h>

#define TDM_KV_CHUNK 32 /* keys per staging */

/* Keys [base, base + 32) of kv head kvh (block table tab, block size bs, n_kv kv
 * heads; caches in kernels/backend.h's layouts) by the 32 lanes of one warp: K as
 * Ks[HD][32] (the cache's own order within a block, 8 keys per 16-byte load; a group
 * of 8 that starts before kv_len is loaded whole, and what lies past kv_len only
 * meets masked scores), V as Vs[32][HD] with zeros for keys >= kv_len.  The caller
 * syncs the warp before reading them. */
template <int HD>
__device__ __forceinline__ void tdm_kv_stage(int lane, int32_t base, int32_t kv_len, const int32_t *tab, int32_t bs,
                                             int32_t n_kv, int32_t kvh, const __half *kc, const __half *vc, __half *Ks,
                                             __half *Vs) {
    for (int32_t q = lane; q < 4 * HD; q += 32) {
        const int32_t kg = q & 3, d = q >> 2, slot = base + 8 * kg;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (slot < kv_len) {
            const int64_t blk = tab[slot / bs];
            v = *(const uint4 *)(kc + (((size_t)blk * n_kv + kvh) * HD + d) * bs + slot % bs);
        }
        *(uint4 *)(Ks + (size_t)d * TDM_KV_CHUNK + 8 * kg) = v;
    }
    for (int32_t q = lane; q < TDM_KV_CHUNK * (HD / 8); q += 32) {
        const int32_t j = q / (HD / 8), dc = q % (HD / 8), slot = base + j;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (slot < kv_len) {
            const int64_t blk = tab[slot / bs];
            v = *(const uint4 *)(vc + (((size_t)blk * n_kv + kvh) * bs + slot % bs) * HD + 8 * dc);
        }
        *(uint4 *)(Vs + (size_t)j * HD + 8 * dc) = v;
    }
}

#endif
