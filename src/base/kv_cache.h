/* kv_cache.h - the paged KV cache: block pool, block tables, copy-on-write,
 * prefix caching.
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
 * Prefix caching (off by default; tdm_kv_pool_set_prefix_cache), as vLLM's
 * automatic prefix caching: a full block whose K/V are final can be registered
 * (tdm_kv_prefix_publish) under its identity, the token ids of the whole prefix up
 * to its end: a chain hash h_i = H(h_{i-1}, the block's block_size token ids) finds
 * it, and the stored token ids and parent block make the lookup exact despite hash
 * collisions.  A new request takes the longest run of registered leading blocks
 * (tdm_kv_prefix_match) instead of computing them.  A registered block nobody holds
 * any more stays cached (evictable, its K/V valid) until an allocation needs it and
 * no block is free: then the least recently released cached block is evicted.
 * A block's state is one of
 *   held       refcount >= 1 (registered or not);
 *   cached     refcount 0, registered, on the LRU list of evictable blocks;
 *   free       refcount 0, not registered, on the free list;
 * and a registered block is never written: reserve copies a shared block
 * (copy-on-write) and unregisters an unshared one before its slots get written.
 * With the cache off no block is ever registered and everything above the prefix
 * section behaves as without it.
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
 * n_kv_head units of block_size x head_dim values of the cache type (inside a block
 * K is [n_kv_head][head_dim][block_size] and V [n_kv_head][block_size][head_dim],
 * q8_0 with per-slot scales in each unit: see kernels/backend.h, src/base/kv_layout.h;
 * the pool only copies whole blocks). */
typedef struct tdm_kv_layout {
    int32_t n_layer;
    int32_t n_kv_head;
    int32_t head_dim;
    uint32_t type;       /* the cache type: TDM_F32, TDM_F16, TDM_Q8_0 or TDM_F8_E4M3 */
} tdm_kv_layout;

/* Bytes one block costs in all the given models (K and V, every layer); 0 when it
 * overflows or a layout is invalid. */
size_t tdm_kv_bytes_per_block(const tdm_kv_layout *models, int n_models, int32_t block_size);

tandem_status tdm_kv_pool_create(int32_t n_blocks, int32_t block_size, tdm_kv_pool **out,
                                 tdm_err *err);
void tdm_kv_pool_free(tdm_kv_pool *pool); /* NULL is a no-op */
void tdm_kv_pool_set_copy(tdm_kv_pool *pool, tdm_kv_copy_fn fn, void *user_data);

int32_t tdm_kv_pool_n_blocks(const tdm_kv_pool *pool);
int32_t tdm_kv_pool_block_size(const tdm_kv_pool *pool);
/* Blocks an allocation can take: free ones plus cached (evictable) ones.  A reserve
 * fails with TANDEM_ERR_KV_FULL only when it needs more than this. */
int32_t tdm_kv_pool_n_free(const tdm_kv_pool *pool);
/* Cached blocks: registered, refcount 0, evictable (counted in n_free too). */
int32_t tdm_kv_pool_n_cached(const tdm_kv_pool *pool);
int32_t tdm_kv_pool_refcount(const tdm_kv_pool *pool, int32_t block); /* 0 = free or cached */

/* Blocks needed to back len positions. */
int32_t tdm_kv_blocks_for(const tdm_kv_pool *pool, int32_t len);

/* Grows the sequence so slots [0, new_len) are backed (new_len >= seq->len; a
 * smaller new_len is a no-op returning OK).  Any shared block that holds a slot in
 * [old len, new_len) is first copied (copy-on-write); an unshared registered one is
 * unregistered (its content is about to change).  New blocks come from the free
 * list, else by evicting the least recently used cached block.  On
 * TANDEM_ERR_KV_FULL the sequence and the pool are unchanged. */
tandem_status tdm_kv_seq_reserve(tdm_kv_pool *pool, tdm_kv_seq *seq, int32_t new_len, tdm_err *err);

/* Rolls back to new_len positions (new_len <= len): releases the blocks past it
 * (a registered one nobody else holds becomes cached).  A block cut in the middle
 * keeps its registration until a reserve writes into it.  A negative or larger
 * new_len is ignored. */
void tdm_kv_seq_truncate(tdm_kv_pool *pool, tdm_kv_seq *seq, int32_t new_len);

/* dst (which must be empty) shares all of src's blocks (registrations unchanged). */
tandem_status tdm_kv_seq_fork(tdm_kv_pool *pool, const tdm_kv_seq *src, tdm_kv_seq *dst, tdm_err *err);

/* Releases every block and the table; the sequence is empty and reusable. */
void tdm_kv_seq_free(tdm_kv_pool *pool, tdm_kv_seq *seq);

/* --------------------------------------------------------- prefix caching
 *
 * tokens[p] is the token id at position p of the sequence / request.  With the
 * prefix cache on, truncate and free release a sequence's blocks last block first,
 * so that a prefix's tail is evicted before its head.
 *
 * Engine use: admit a request with match(prompt, n_prompt, (n_prompt - 1) /
 * block_size, &seq) (so at least the last prompt token is computed and yields
 * logits), then reserve and compute [matched, n_prompt) in every model.  Publish
 * only positions whose K/V are written in every model (the target and the draft)
 * and will not be rolled back: accepted tokens, not speculative ones. */

/* Turns prefix caching on or off (default off).  The first "on" allocates the token
 * store (n_blocks x block_size int32); if that fails the cache stays off.  "Off"
 * unregisters every block (cached ones become free).  Returns whether the cache is
 * on after the call. */
bool tdm_kv_pool_set_prefix_cache(tdm_kv_pool *pool, bool on);

/* Gives an empty sequence (len 0, no blocks) the longest run of leading full blocks
 * of tokens[0, n) that are registered, at most max_blocks of them: appends them to
 * its table (refcount + 1 each; a cached one leaves the LRU list) and sets seq->len
 * to their positions.  Returns seq->len: 0 when the cache is off, nothing matches,
 * seq is not empty, or the table cannot be allocated (seq stays empty).  The caller
 * then reserves and computes positions [returned, n) only.  O(matched blocks x
 * block_size) plus the table growth. */
int32_t tdm_kv_prefix_match(tdm_kv_pool *pool, const int32_t *tokens, int32_t n, int32_t max_blocks,
                            tdm_kv_seq *seq);

/* Registers each full block of seq lying entirely in positions [0, min(n_valid,
 * seq->len)) under its identity (tokens[0, n_valid) must be the sequence's tokens,
 * and the K/V of those positions must be final in every model).  A block whose
 * identity already has a registered block stays unregistered (the sequence keeps
 * it; later calls skip it).  Idempotent; calling it again for the same sequence
 * costs O(1) per block already handled, O(block_size) per new block.  No-op when
 * the cache is off.  Never allocates. */
void tdm_kv_prefix_publish(tdm_kv_pool *pool, const tdm_kv_seq *seq, const int32_t *tokens,
                           int32_t n_valid);

/* Counters since create (any argument may be NULL): full blocks the matches were
 * asked for (min(n / block_size, max_blocks) per call while on), blocks they
 * found, cached blocks evicted. */
void tdm_kv_prefix_stats(const tdm_kv_pool *pool, uint64_t *queried_blocks, uint64_t *hit_blocks,
                         uint64_t *evictions);

/* [block_size] token ids a block is registered under; NULL when it is not
 * registered (or out of range).  For tests and diagnostics. */
const int32_t *tdm_kv_prefix_tokens(const tdm_kv_pool *pool, int32_t block);

/* Testing only: ANDs every chain hash with mask (default all ones; 0 makes every
 * block collide in one bucket with one hash).  Unregisters every block first. */
void tdm_kv_prefix_set_hash_mask(tdm_kv_pool *pool, uint64_t mask);

/* Checks the pool's internal invariants (see kv_cache.c) in O(n_blocks): OK, or
 * TANDEM_ERR_INTERNAL naming the first broken one (TANDEM_ERR_NOMEM if the check
 * cannot allocate its scratch).  For tests and diagnostics. */
tandem_status tdm_kv_pool_check(const tdm_kv_pool *pool, tdm_err *err);

#endif
