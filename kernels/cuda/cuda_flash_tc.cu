/* cuda_flash_tc.cu - attention of prefill batches (more rows than a verification)
 * on tensor cores: flash attention over the paged KV cache, f16 operands and f32
 * accumulation (WMMA 16x16x16), online softmax in f32.
 *
 * A warp takes one tile of the batch (at most 16 consecutive rows of one sequence,
 * as cuda_meta.cu makes them with one head per block) and one head, and walks the
 * tile's keys in chunks of 32: it stages the chunk's K (as [d][key], the cache's
 * own order within a block) and V ([key][d]) in its shared memory, computes the
 * scores S = Q K^T of its 16 rows with the tensor cores, masks the keys a row
 * cannot see (key >= its visible count, outside its tree mask) and updates each row's running maximum,
 * sum and output O = O * correction + P V (P rounded to f16).  The output is written
 * once, after the last chunk; no split of the keys, so no partials.
 *
 * Q is rounded to f16 (K and V are f16 in the cache; a q8_0 cache's are staged
 * dequantised to f16, cuda_kvstage.cuh); against the f32 kernels of cuda_flash.cu
 * the results differ by about 1e-3 relative.  A row's result depends
 * only on its own query and visible keys (each output element's dot products run
 * over key chunks fixed by key index), not on the other rows of its tile.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <mma.h>

#include "cuda_fused.h"
#include "cuda_kvstage.cuh"
#include "cuda_nonfinite.cuh"

using namespace nvcuda;

#define TC_CH TDM_KV_CHUNK /* keys per chunk */
#define TC_ROWS 16

template <int HD> struct tc_cfg {
    static constexpr int W = HD >= 256 ? 2 : 4; /* warps per block */
    static constexpr size_t q = (size_t)TC_ROWS * HD * 2;  /* Q f16 [16][HD] */
    static constexpr size_t k = (size_t)HD * TC_CH * 2;    /* K f16 [HD][32] */
    static constexpr size_t v = (size_t)TC_CH * HD * 2;    /* V f16 [32][HD] */
    static constexpr size_t s = (size_t)TC_ROWS * TC_CH * 4; /* S f32 [16][32] */
    static constexpr size_t p = (size_t)TC_ROWS * TC_CH * 2; /* P f16 [16][32] */
    static constexpr size_t o = (size_t)TC_ROWS * HD * 4;  /* O f32 [16][HD] */
    static constexpr size_t st = (size_t)TC_ROWS * 4 * 4;  /* per row: correction, visible count, tree mask */
    static constexpr size_t warp = q + k + v + s + p + o + st;
    static constexpr size_t total = W * warp;
    static_assert(q % 32 == 0 && k % 32 == 0 && v % 32 == 0 && s % 32 == 0 && p % 32 == 0 && o % 32 == 0,
                  "WMMA pointers stay 32-byte aligned");
};

bool tdm_flash_tc_ok(int32_t head_dim, int32_t n_rows) {
    return n_rows > TDM_CUDA_GEMV_MAX_ROWS &&
           (head_dim == 64 || head_dim == 80 || head_dim == 96 || head_dim == 128 || head_dim == 256);
}

template <int HD>
__global__ void __launch_bounds__(tc_cfg<HD>::W * 32) k_flash_tc(const tdm_flash_args a) {
    TDM_PDL_ENTRY();
    typedef tc_cfg<HD> C;
    extern __shared__ __align__(128) uint8_t smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t item = (int64_t)blockIdx.x * C::W + warp;
    if (item >= (int64_t)a.n_tiles * a.n_head) return; /* (no block-wide barrier below) */
    const int32_t ti = (int32_t)(item / a.n_head), h = (int32_t)(item % a.n_head);
    const int32_t kvh = h / (a.n_head / a.n_kv_head);
    uint8_t *wb = smem + (size_t)warp * C::warp;
    __half *Qs = (__half *)wb;
    __half *Ks = (__half *)(wb + C::q);
    __half *Vs = (__half *)(wb + C::q + C::k);
    float *Ss = (float *)(wb + C::q + C::k + C::v);
    __half *Ps = (__half *)(wb + C::q + C::k + C::v + C::s);
    float *Os = (float *)(wb + C::q + C::k + C::v + C::s + C::p);
    float *Cs = (float *)(wb + C::q + C::k + C::v + C::s + C::p + C::o); /* [16] corrections */
    int32_t *NVs = (int32_t *)(Cs + TC_ROWS);                              /* [16] visible counts */
    uint64_t *TRs = (uint64_t *)(NVs + TC_ROWS);                           /* [16] tree masks */

    const tdm_cuda_tile tile = a.tiles[ti];
    for (int32_t i = lane; i < TC_ROWS * HD; i += 32) {
        const int32_t r = i / HD, d = i % HD;
        const float v = r < tile.n_rows ? a.q[(size_t)(tile.row0 + r) * a.q_stride + (size_t)h * HD + d] : 0.0f;
        Qs[i] = __float2half_rn(v);
        Os[i] = 0.0f;
    }
    if (lane < TC_ROWS) {
        NVs[lane] = lane < tile.n_rows ? a.rows[tile.row0 + lane].nv : 0;
        TRs[lane] = lane < tile.n_rows ? a.rows[tile.row0 + lane].tree : 0;
    }
    __syncwarp();

    const int32_t bs = a.block_size, n_kv = a.n_kv_head;
    const bool q8 = a.cache_type == TDM_Q8_0;
    const int32_t *tab = a.tabs + tile.tab;
    const int r = lane >> 1, half = lane & 1; /* softmax: two lanes per row, 16 keys each */
    float m = -INFINITY, l = 0.0f;
    for (int32_t base = 0; base < tile.kv_len; base += TC_CH) {
        /* stage K as [d][key] and V as [key][d]; keys past the tile's: V zeros */
        if (q8)
            tdm_kv_stage_q8_half<HD>(lane, base, tile.kv_len, tab, bs, n_kv, kvh, (const uint8_t *)a.k_cache,
                                     (const uint8_t *)a.v_cache, Ks, Vs);
        else
            tdm_kv_stage<HD>(lane, base, tile.kv_len, tab, bs, n_kv, kvh, (const __half *)a.k_cache,
                             (const __half *)a.v_cache, Ks, Vs);
        __syncwarp();
        /* S = Q K^T */
#pragma unroll
        for (int nt = 0; nt < TC_CH / 16; nt++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, Qs + kk * 16, HD);
                wmma::load_matrix_sync(fb, Ks + (size_t)kk * 16 * TC_CH + nt * 16, TC_CH);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(Ss + nt * 16, acc, TC_CH, wmma::mem_row_major);
        }
        __syncwarp();
        /* online softmax of row r over its 16 keys of the chunk (and its partner's) */
        {
            const int32_t nv = NVs[r];
            const uint64_t tr = TRs[r];
            float sc[16], mx = -INFINITY;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int32_t key = base + half * 16 + j;
                sc[j] = tdm_cu_score(tdm_cu_row_sees(nv, tr, key), Ss[r * TC_CH + half * 16 + j] * a.scale);
                mx = tdm_cu_max_nan(mx, sc[j]);
            }
            mx = tdm_cu_max_nan(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            const float mn = tdm_cu_max_nan(m, mx); /* (NaN: every weight NaN) */
            float corr = 1.0f, sum = 0.0f;
            if (mn != -INFINITY) corr = expf(m - mn);
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const float p = mn != -INFINITY ? expf(sc[j] - mn) : 0.0f;
                const __half ph = __float2half_rn(p);
                Ps[r * TC_CH + half * 16 + j] = ph;
                sum += __half2float(ph); /* the sum of what P V adds */
            }
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            l = l * corr + sum;
            m = mn;
            if (half == 0) Cs[r] = corr;
        }
        __syncwarp();
        /* O = O * correction + P V */
        for (int32_t i = lane; i < TC_ROWS * HD; i += 32) Os[i] *= Cs[i / HD];
        __syncwarp();
#pragma unroll
        for (int nt = 0; nt < HD / 16; nt++) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::load_matrix_sync(acc, Os + nt * 16, HD, wmma::mem_row_major);
#pragma unroll
            for (int kc2 = 0; kc2 < TC_CH / 16; kc2++) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
                wmma::load_matrix_sync(fa, Ps + kc2 * 16, TC_CH);
                wmma::load_matrix_sync(fb, Vs + (size_t)kc2 * 16 * HD + nt * 16, HD);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(Os + nt * 16, acc, HD, wmma::mem_row_major);
        }
        __syncwarp();
    }
    /* out = O / l, row by row (lanes 2r and 2r + 1 hold row r's l) */
    if (half == 0) Cs[r] = l;
    __syncwarp();
    for (int32_t i = lane; i < tile.n_rows * HD; i += 32) {
        const int32_t rr = i / HD, d = i % HD;
        const float L = Cs[rr];
        const float v = tdm_cu_attn_div(Os[i], L);
        const size_t o = (size_t)(tile.row0 + rr) * a.n_head * HD + (size_t)h * HD + d;
        if (a.out_type == TDM_F16) ((__half *)a.out)[o] = __float2half_rn(v);
        else if (a.out_type == TDM_BF16) ((__nv_bfloat16 *)a.out)[o] = __float2bfloat16_rn(v);
        else ((float *)a.out)[o] = v;
    }
}

template <int HD> static tandem_status launch_tc(tdm_cuda *c, const tdm_flash_args *a, tdm_err *err) {
    typedef tc_cfg<HD> C;
    if (C::total > c->smem_optin)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: head_dim %d needs %zu bytes of shared memory (%zu)",
                          HD, C::total, c->smem_optin);
    static bool raised = false; /* (per process: every device of a kind has the same limit) */
    if (!raised) {
        TDM_CU(cudaFuncSetAttribute(k_flash_tc<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::total));
        raised = true;
    }
    const int64_t items = (int64_t)a->n_tiles * a->n_head, blocks = (items + C::W - 1) / C::W;
    if (blocks > 0x7fffffff) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: %lld tiles x heads", (long long)items);
    tdm_launch(k_flash_tc<HD>, (unsigned)blocks, C::W * 32, C::total, c->stream, *a);
    TDM_CU_LAUNCHED("attention (tensor cores)");
    return TANDEM_OK;
}

tandem_status tdm_cuda_flash_tc(tdm_cuda *c, const tdm_flash_args *a, tdm_err *err) {
    if (a->n_rows <= 0) return TANDEM_OK;
    if (a->heads_per_block != 1 || a->tile_rows > TC_ROWS)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "attention (tensor cores): tiles of %d rows x %d heads",
                          (int)a->tile_rows, (int)a->heads_per_block);
    switch (a->head_dim) {
    case 64: return launch_tc<64>(c, a, err);
    case 80: return launch_tc<80>(c, a, err);
    case 96: return launch_tc<96>(c, a, err);
    case 128: return launch_tc<128>(c, a, err);
    case 256: return launch_tc<256>(c, a, err);
    default: return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention (tensor cores): head_dim %d", (int)a->head_dim);
    }
}
