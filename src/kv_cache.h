/* kv_cache.h - the paged KV cache: block pool, block tables, copy-on-write.
 *
 * The pool hands out fixed-size blocks (block_size token positions each).  A
 * sequence owns a block table: block ids in position order.  Position p of a
 * sequence lives in block blocks[p / block_size], slot p % block_size.
 *
 * One block table serves several models (the target and the draft): each model
 * keeps its own K/V storage indexed by the same block ids (tdm_kv_store), so a
 * sequence's blocks hold the same token positions in both, and one truncate rolls
 * both back.  Memory accounting counts every model's bytes per block.
 *
 * Blocks are reference counted: fork shares all blocks of a sequence; writing into
 * a shared block (reserve over it) first copies it (copy-on-write) through the
 * pool's copy callback, which copies the block in every model's storage.
 *
 * Not thread-safe: the scheduler owns the pool.
 */
#ifndef TDM_KV_CACHE_H
#define TDM_KV_CACHE_H

#include "common.h"

typedef struct tdm_kv_pool tdm_kv_pool;

typedef struct tdm_kv_seq {
    int32_t *blocks;     /* [cap_blocks] block ids in position order; first n_blocks valid */
    int32_t n_blocks;
    int32_t cap_blocks;
    int32_t len;         /* reserved positions: slots [0, len) are backed by blocks */
} tdm_kv_seq;

#define TDM_KV_SEQ_INIT {NULL, 0, 0, 0}

/* Copies block src to block dst in every model's storage. */
typedef void (*tdm_kv_copy_fn)(void *user_data, int32_t src_block, int32_t dst_block);

/* K/V layout of one model: per layer, K and V each n_blocks blocks of
 * n_kv_head x block_size x head_dim elements of elem_bytes each (inside a block K is
 * [n_kv_head][head_dim][block_size] and V [n_kv_head][block_size][head_dim]: see
 * kernels/backend.h; the pool only copies whole blocks). */
typedef struct tdm_kv_layout {
    int32_t n_layer;
    int32_t n_kv_head;
    int32_t head_dim;
    int32_t elem_bytes;  /* 4 for f32, 2 for f16 */
} tdm_kv_layout;

/* Bytes one block costs in all the given models (K and V, every layer). */
size_t tdm_kv_bytes_per_block(const tdm_kv_layout *models, int n_models, int32_t block_size);

tandem_status tdm_kv_pool_create(int32_t n_blocks, int32_t block_size, tdm_kv_pool **out,
                                 tdm_err *err);
void tdm_kv_pool_free(tdm_kv_pool *pool); /* NULL is a no-op */
void tdm_kv_pool_set_copy(tdm_kv_pool *pool, tdm_kv_copy_fn fn, void *user_data);

int32_t tdm_kv_pool_n_blocks(const tdm_kv_pool *pool);
int32_t tdm_kv_pool_block_size(const tdm_kv_pool *pool);
int32_t tdm_kv_pool_n_free(const tdm_kv_pool *pool);
int32_t tdm_kv_pool_refcount(const tdm_kv_pool *pool, int32_t block); /* 0 = free */

/* Blocks needed to back len positions. */
int32_t tdm_kv_blocks_for(const tdm_kv_pool *pool, int32_t len);

/* Grows the sequence so slots [0, new_len) are backed (new_len >= seq->len; a
 * smaller new_len is a no-op returning OK).  Any shared block that holds a slot in
 * [old len, new_len) is first copied (copy-on-write).  On TANDEM_ERR_KV_FULL the
 * sequence is unchanged. */
tandem_status tdm_kv_seq_reserve(tdm_kv_pool *pool, tdm_kv_seq *seq, int32_t new_len, tdm_err *err);

/* Rolls back to new_len positions (new_len <= len): frees the blocks past it.
 * A negative or larger new_len is ignored. */
void tdm_kv_seq_truncate(tdm_kv_pool *pool, tdm_kv_seq *seq, int32_t new_len);

/* dst (which must be empty) shares all of src's blocks. */
tandem_status tdm_kv_seq_fork(tdm_kv_pool *pool, const tdm_kv_seq *src, tdm_kv_seq *dst, tdm_err *err);

/* Releases every block and the table; the sequence is empty and reusable. */
void tdm_kv_seq_free(tdm_kv_pool *pool, tdm_kv_seq *seq);

#endif
