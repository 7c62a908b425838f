/* cuda_fused.h - the fused forward pass on the GPU (cuda_blocks.cu) and its
 * kernels: per-forward batch metadata in device memory, the fused row kernels
 * (cuda_fused.cu) and attention over the paged cache by tiles of rows with split
 * key ranges (cuda_flash.cu). */
#ifndef TDM_CUDA_FUSED_H
#define TDM_CUDA_FUSED_H

#include "cuda_internal.h"

/* One batch row, as the fused kernels read it. */
typedef struct tdm_cuda_row {
    int32_t pos;     /* RoPE position */
    int32_t kv_blk;  /* physical block of the slot it writes */
    int32_t kv_off;  /* slot % block_size */
    int32_t nv;      /* visible slots [0, nv) of its sequence */
    uint64_t tree;   /* a token-tree row (src/base/batch.h): bit j, it also sees slot nv + j; 0: none */
} tdm_cuda_row;

/* Keys in rank order.  A row's visible keys, in order, are slots [0, nv) and then
 * its tree slots nv + j (the set bits j, ascending: its ancestors by depth, then
 * itself); the attention kernels group and order keys by this rank, never by slot,
 * so a tree node at depth d gets exactly the bits a causal row of the same tokens
 * at consecutive slots gets (target-only decoding).  A tree row is therefore alone
 * in its tile (tdm_cuda_meta_fill), whose key ranks map to slots through its mask.
 *
 * The number of a row's keys (the end of its ranks): nv + the bits of its mask. */
static inline int32_t tdm_cuda_row_end(int32_t nv, uint64_t tree) {
    int32_t n = 0;
    for (uint64_t m = tree; m; m &= m - 1) n++;
    return nv + n;
}
/* The end of the slots a row reads: past nv and its highest tree slot. */
static inline int32_t tdm_cuda_row_slot_end(int32_t nv, uint64_t tree) {
    int32_t top = 0;
    for (uint64_t m = tree; m; m >>= 1) top++;
    return nv + top;
}
#ifdef __CUDACC__
/* The same on the device. */
__device__ __forceinline__ int32_t tdm_cu_row_end(int32_t nv, uint64_t tree) { return nv + __popcll(tree); }
/* Whether a row (nv, tree) sees the key of rank `key`: its ranks are [0, end). */
__device__ __forceinline__ bool tdm_cu_row_sees(int32_t nv, uint64_t tree, int32_t key) {
    return key < tdm_cu_row_end(nv, tree);
}
/* The slot of rank `key` in a tile whose rows are (nv, tree) (tree != 0: the tile's
 * one row; tree == 0: any rows, ranks are slots). */
__device__ __forceinline__ int32_t tdm_cu_key_slot(int32_t nv, uint64_t tree, int32_t key) {
    if (!tree || key < nv) return key;
    uint64_t m = tree;
    for (int32_t i = key - nv; i > 0 && m; i--) m &= m - 1;
    return m ? nv + __ffsll((long long)m) - 1 : key; /* (past the row's ranks: never read) */
}
/* Whether ranks [base, base + n) of such a tile are consecutive slots. */
__device__ __forceinline__ bool tdm_cu_keys_linear(int32_t nv, uint64_t tree, int32_t base, int32_t n) {
    return !tree || base + n <= nv;
}
#endif

/* Consecutive rows of one sequence attended together: they read the sequence's
 * K / V once (a token-tree row: a tile of its own).  Each row sees key ranks
 * [0, tdm_cuda_row_end); kv_len = the largest row end. */
typedef struct tdm_cuda_tile {
    int32_t row0, n_rows;
    int32_t tab;     /* offset of the sequence's block table in the tables array */
    int32_t kv_len;
} tdm_cuda_tile;

/* A forward's metadata as the fused kernels read it, packed on the host into one
 * buffer (rows, then tiles, then the block tables of the batch's sequences, each
 * once) and copied to the device (cuda_meta.cu). */
typedef struct tdm_cuda_meta {
    int32_t n_rows, n_tiles, n_tab; /* rows, tiles, table entries */
    int32_t tile_rows;              /* rows per tile at most (the cap) */
    int32_t max_tile_rows;          /* rows of the largest tile */
    int32_t max_kv;                 /* the largest tile's kv_len */
    size_t bytes;
} tdm_cuda_meta;
/* Bytes the metadata of a batch needs (checks its sequence indices). */
tandem_status tdm_cuda_meta_size(const tdm_batch *bt, const tdm_kv_seq *const *seqs, size_t *bytes, tdm_err *err);
/* Packs it into host (tdm_cuda_meta_size bytes), tiles of at most max_q /
 * heads_per_block rows (max_q: tdm_flash_max_q), checking every slot the rows write or read against the
 * block tables; fails (TANDEM_ERR_INVALID_ARG) naming the row. */
tandem_status tdm_cuda_meta_fill(const tdm_batch *bt, const tdm_kv_seq *const *seqs, int32_t block_size,
                                 int32_t heads_per_block, int32_t max_q, void *host, tdm_cuda_meta *m,
                                 tdm_err *err);
/* rows[i].tree = masks[i] for i < n (both device memory), queued: a token tree
 * grown on the device gives a forward's masks (tdm_batch.tree_mask_dev). */
tandem_status tdm_cuda_meta_masks(tdm_cuda *c, tdm_cuda_row *rows, const uint64_t *masks, int32_t n, tdm_err *err);
/* The parts of a packed buffer (host or device copy) of n rows. */
void tdm_cuda_meta_at(const void *buf, int32_t n, const tdm_cuda_row **rows, const tdm_cuda_tile **tiles,
                      const int32_t **tabs);

/* Keys per split (a thread block's share of a tile's keys).  Fixed, so a row's keys
 * are always grouped the same way whatever else is in the batch. */
#define TDM_FLASH_SPLIT 256
/* Query vectors (rows x heads of one kv head) a thread block attends at most. */
#define TDM_FLASH_QMAX 16
/* ... in a batch of at most TDM_CUDA_GEMV_MAX_ROWS rows (decode, verification): the
 * kernel of 4 query vectors, whose state fits in fewer registers, over more blocks
 * (a short batch cannot fill the GPU anyway; the tiles' K / V come from L2). */
#define TDM_FLASH_QMAX_SHORT 4
/* The tile capacity in query vectors for a batch of n rows.  A row's result does
 * not depend on it (nor on which rows share its tile). */
static inline int32_t tdm_flash_max_q(int32_t n) {
    return n <= TDM_CUDA_GEMV_MAX_ROWS ? TDM_FLASH_QMAX_SHORT : TDM_FLASH_QMAX;
}

/* The attention kernels' view of a forward's metadata and buffers. */
typedef struct tdm_flash_args {
    const tdm_cuda_row *rows;    /* [n_rows] device */
    const tdm_cuda_tile *tiles;  /* [n_tiles] device */
    const int32_t *tabs;         /* block tables, device */
    int32_t n_rows, n_tiles, n_splits; /* n_splits: the largest tile's kv_len in splits
                                          (a graph may launch more; the extra exit) */
    int32_t tile_rows;           /* rows of the largest tile (at most TDM_FLASH_QMAX / heads
                                    per block): picks the kernel's query-vector capacity */
    int32_t heads_per_block;     /* tdm_flash_heads_per_block, as the tiles were made for */
    const float *q;              /* [n_rows][q_stride], heads at h * head_dim */
    int32_t q_stride;
    const void *k_cache, *v_cache; /* the layouts of kernels/backend.h (kv_layout.h) */
    uint32_t cache_type;         /* TDM_F16 or TDM_Q8_0 */
    int32_t n_head, n_kv_head, head_dim, block_size;
    float scale;
    float *part;                 /* [n_splits][n_rows][n_head][head_dim + 2] partials */
    void *out;                   /* [n_rows][n_head * head_dim] */
    uint32_t out_type;           /* TDM_F32, TDM_F16 or TDM_BF16 */
    bool tree;                   /* a token-tree batch (never the tensor-core kernel) */
} tdm_flash_args;

/* Heads of one kv head that one thread block takes (a divisor of the group): the
 * whole group (up to TDM_FLASH_QMAX), so its K / V are read once, unless the batch
 * gives too few blocks to fill the GPU (a short decode or verification batch): then
 * one head per block.  A row's result does not depend on it. */
int32_t tdm_flash_heads_per_block(const tdm_cuda *c, const tdm_batch *bt, int32_t n_head, int32_t n_kv_head,
                                  int32_t max_q);
/* Whether the kernels run this shape (head_dim 64, 80, 96, 128 or 256, block_size a
 * multiple of 8, an f16 or q8_0 cache); else the op-table attention serves. */
bool tdm_flash_supported(int32_t head_dim, int32_t block_size, uint32_t cache_type);
/* Floats of partials the attention needs. */
size_t tdm_flash_part_floats(int32_t n_splits, int32_t n_rows, int32_t n_head, int32_t head_dim);
tandem_status tdm_cuda_flash(tdm_cuda *c, const tdm_flash_args *a, tdm_err *err);
/* The decode kernel (cuda_decode_attn.cu): the same arguments, grid, partials and
 * results, bit for bit, as the tiled kernel above, for tiles of few rows (decode,
 * verification: tile_rows <= TDM_FLASH_DECODE_ROWS), with K / V read straight from
 * the cache instead of staged per warp.  tdm_cuda_flash dispatches to it when
 * tdm_flash_decode_use says so (a test's TDM_CUDA_ATTN_TILED or _SCORES turns it
 * off) and runs the split combine after it. */
#define TDM_FLASH_DECODE_ROWS 8
bool tdm_flash_decode_use(const tdm_cuda *c, int32_t tile_rows, int32_t heads_per_block);
tandem_status tdm_cuda_flash_decode(tdm_cuda *c, const tdm_flash_args *a, tdm_err *err);

/* Fused row kernels (cuda_fused.cu).  type: the output's element type; TDM_Q8_0
 * writes int8 blocks into xq instead of out. */
tandem_status tdm_cuda_rmsnorm_to(tdm_cuda *c, const float *x, const float *gamma, int32_t n, int32_t dim, float eps,
                                  uint32_t type, void *out, const tdm_cuda_xq *xq, tdm_err *err);
tandem_status tdm_cuda_rope_table(tdm_cuda *c, const tdm_cuda_row *rows, int32_t n, const tdm_rope_params *rp,
                                  float2 *cs, tdm_err *err);
tandem_status tdm_cuda_rope_kv(tdm_cuda *c, float *qkv, int32_t n, int32_t stride, const float *bias,
                               int32_t n_head, int32_t n_kv, int32_t hd, const tdm_rope_params *rp, const float2 *cs,
                               const tdm_cuda_row *rows, void *kc, void *vc, uint32_t cache_type, int32_t bs,
                               tdm_err *err);
tandem_status tdm_cuda_swiglu_to(tdm_cuda *c, const float *gate_up, int32_t n, int32_t ff, uint32_t type, void *out,
                                 tdm_err *err);

#endif
