/* kv_cache.c - paged KV cache block pool: free list, reference counts, block
 * tables with copy-on-write.  See kv_cache.h.
 *
 * Invariants (kept by every function here):
 *   - refcount[b] == number of block tables that hold b; 0 <=> b is on the free list.
 *   - free_list[0 .. n_free) holds exactly the blocks with refcount 0 (a LIFO stack).
 *   - for every sequence: n_blocks == ceil(len / block_size) <= cap_blocks.
 */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

struct tdm_kv_pool {
    int32_t n_blocks;
    int32_t block_size;     /* token positions per block */
    int32_t *refcount;      /* [n_blocks] */
    int32_t *free_list;     /* [n_blocks] stack of free block ids; top at n_free - 1 */
    int32_t n_free;
    tdm_kv_copy_fn copy;    /* may be NULL (nothing to copy: e.g. accounting-only use) */
    void *copy_user_data;
};

/* ------------------------------------------------------------- accounting */

size_t tdm_kv_bytes_per_block(const tdm_kv_layout *models, int n_models, int32_t block_size) {
    if (!models || n_models <= 0 || block_size <= 0) return 0;
    uint64_t total = 0;
    for (int m = 0; m < n_models; m++) {
        const tdm_kv_layout *l = &models[m];
        if (l->n_layer < 0 || l->n_kv_head < 0 || l->head_dim < 0 || l->elem_bytes < 0) return 0;
        uint64_t b = 2; /* K and V */
        if (tdm_mul_overflow_u64(b, (uint64_t)l->n_layer, &b) ||
            tdm_mul_overflow_u64(b, (uint64_t)l->n_kv_head, &b) ||
            tdm_mul_overflow_u64(b, (uint64_t)l->head_dim, &b) ||
            tdm_mul_overflow_u64(b, (uint64_t)l->elem_bytes, &b) ||
            tdm_mul_overflow_u64(b, (uint64_t)block_size, &b) ||
            tdm_add_overflow_u64(total, b, &total))
            return 0;
    }
    if (total > (uint64_t)SIZE_MAX) return 0;
    return (size_t)total;
}

/* ------------------------------------------------------------------- pool */

tandem_status tdm_kv_pool_create(int32_t n_blocks, int32_t block_size, tdm_kv_pool **out,
                                 tdm_err *err) {
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv pool: NULL output pointer");
    *out = NULL;
    if (n_blocks <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv pool: n_blocks must be > 0 (got %d)",
                          (int)n_blocks);
    if (block_size <= 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "kv pool: block_size must be > 0 (got %d)", (int)block_size);
    tdm_kv_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return tdm_seterr(err, TANDEM_ERR_NOMEM, "kv pool: out of memory");
    pool->refcount = tdm_calloc((size_t)n_blocks, sizeof *pool->refcount);
    pool->free_list = tdm_mallocarray((size_t)n_blocks, sizeof *pool->free_list);
    if (!pool->refcount || !pool->free_list) {
        tdm_kv_pool_free(pool);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "kv pool: out of memory for %d blocks",
                          (int)n_blocks);
    }
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    /* Stack order so that the first allocations hand out blocks 0, 1, 2, ... */
    for (int32_t i = 0; i < n_blocks; i++) pool->free_list[i] = n_blocks - 1 - i;
    pool->n_free = n_blocks;
    *out = pool;
    return TANDEM_OK;
}

void tdm_kv_pool_free(tdm_kv_pool *pool) {
    if (!pool) return;
    free(pool->refcount);
    free(pool->free_list);
    free(pool);
}

void tdm_kv_pool_set_copy(tdm_kv_pool *pool, tdm_kv_copy_fn fn, void *user_data) {
    if (!pool) return;
    pool->copy = fn;
    pool->copy_user_data = user_data;
}

int32_t tdm_kv_pool_n_blocks(const tdm_kv_pool *pool) { return pool ? pool->n_blocks : 0; }
int32_t tdm_kv_pool_block_size(const tdm_kv_pool *pool) { return pool ? pool->block_size : 0; }
int32_t tdm_kv_pool_n_free(const tdm_kv_pool *pool) { return pool ? pool->n_free : 0; }

int32_t tdm_kv_pool_refcount(const tdm_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return 0;
    return pool->refcount[block];
}

int32_t tdm_kv_blocks_for(const tdm_kv_pool *pool, int32_t len) {
    if (!pool || len <= 0) return 0;
    int64_t bs = pool->block_size;
    return (int32_t)(((int64_t)len + bs - 1) / bs);
}

static int32_t pool_pop(tdm_kv_pool *pool) {
    int32_t b = pool->free_list[--pool->n_free];
    pool->refcount[b] = 1;
    return b;
}

static void pool_release(tdm_kv_pool *pool, int32_t b) {
    if (b < 0 || b >= pool->n_blocks || pool->refcount[b] <= 0) return; /* corrupt table: ignore */
    if (--pool->refcount[b] == 0) pool->free_list[pool->n_free++] = b;
}

/* -------------------------------------------------------------- sequences */

/* Makes room for at least need entries in seq->blocks (capacity doubles). */
static tandem_status seq_grow_table(tdm_kv_seq *seq, int32_t need, tdm_err *err) {
    if (need <= seq->cap_blocks) return TANDEM_OK;
    int64_t cap = seq->cap_blocks > 0 ? seq->cap_blocks : 4;
    while (cap < need) cap *= 2;
    if (cap > INT32_MAX) cap = INT32_MAX;
    size_t bytes;
    if (tdm_mul_overflow_size((size_t)cap, sizeof *seq->blocks, &bytes))
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "kv cache: block table of %lld entries is too big",
                          (long long)cap);
    int32_t *nb = realloc(seq->blocks, bytes);
    if (!nb)
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "kv cache: out of memory for a block table of %lld entries",
                          (long long)cap);
    seq->blocks = nb;
    seq->cap_blocks = (int32_t)cap;
    return TANDEM_OK;
}

static bool seq_valid(const tdm_kv_pool *pool, const tdm_kv_seq *seq) {
    if (seq->len < 0 || seq->n_blocks < 0 || seq->n_blocks > seq->cap_blocks) return false;
    if (seq->n_blocks > 0 && !seq->blocks) return false;
    return seq->n_blocks == tdm_kv_blocks_for(pool, seq->len);
}

tandem_status tdm_kv_seq_reserve(tdm_kv_pool *pool, tdm_kv_seq *seq, int32_t new_len, tdm_err *err) {
    if (!pool || !seq) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv reserve: NULL pool or sequence");
    if (new_len < 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv reserve: negative length %d", (int)new_len);
    if (!seq_valid(pool, seq))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "kv reserve: corrupt sequence (len %d, %d blocks, cap %d)", (int)seq->len,
                          (int)seq->n_blocks, (int)seq->cap_blocks);
    if (new_len <= seq->len) return TANDEM_OK;

    const int32_t bs = pool->block_size;
    const int32_t need = tdm_kv_blocks_for(pool, new_len);
    /* Existing blocks that hold a slot in [len, new_len): from the block of position len
     * to the last block of the table.  Shared ones must be copied before writing. */
    int32_t first_written = seq->len / bs;
    int32_t n_cow = 0;
    for (int32_t i = first_written; i < seq->n_blocks; i++) {
        int32_t b = seq->blocks[i];
        if (b < 0 || b >= pool->n_blocks || pool->refcount[b] <= 0)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "kv reserve: sequence holds invalid block %d at index %d", (int)b, (int)i);
        if (pool->refcount[b] > 1) n_cow++;
    }
    int64_t n_alloc = (int64_t)(need - seq->n_blocks) + n_cow;
    if (n_alloc > pool->n_free)
        return tdm_seterr(err, TANDEM_ERR_KV_FULL,
                          "kv cache full: growing a sequence from %d to %d positions needs %lld "
                          "blocks (%d new, %d copy-on-write) but only %d of %d are free",
                          (int)seq->len, (int)new_len, (long long)n_alloc,
                          (int)(need - seq->n_blocks), (int)n_cow, (int)pool->n_free,
                          (int)pool->n_blocks);
    tandem_status st = seq_grow_table(seq, need, err);
    if (st != TANDEM_OK) return st;

    /* From here nothing can fail. */
    for (int32_t i = first_written; i < seq->n_blocks; i++) {
        int32_t src = seq->blocks[i];
        if (pool->refcount[src] <= 1) continue;
        int32_t dst = pool_pop(pool);
        if (pool->copy) pool->copy(pool->copy_user_data, src, dst);
        pool->refcount[src]--; /* still >= 1: never frees */
        seq->blocks[i] = dst;
    }
    while (seq->n_blocks < need) seq->blocks[seq->n_blocks++] = pool_pop(pool);
    seq->len = new_len;
    return TANDEM_OK;
}

void tdm_kv_seq_truncate(tdm_kv_pool *pool, tdm_kv_seq *seq, int32_t new_len) {
    /* A negative or growing new_len is a no-op (the function cannot report errors). */
    if (!pool || !seq || new_len < 0 || new_len >= seq->len) return;
    int32_t keep = tdm_kv_blocks_for(pool, new_len);
    if (keep > seq->n_blocks) keep = seq->n_blocks; /* corrupt table: be defensive */
    for (int32_t i = keep; i < seq->n_blocks; i++) pool_release(pool, seq->blocks[i]);
    seq->n_blocks = keep;
    seq->len = new_len;
}

tandem_status tdm_kv_seq_fork(tdm_kv_pool *pool, const tdm_kv_seq *src, tdm_kv_seq *dst, tdm_err *err) {
    if (!pool || !src || !dst)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv fork: NULL pool or sequence");
    if (src == dst) {
        if (src->len == 0 && src->n_blocks == 0) return TANDEM_OK;
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv fork: source and destination are the same sequence");
    }
    if (dst->len != 0 || dst->n_blocks != 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "kv fork: destination is not empty (len %d, %d blocks)", (int)dst->len,
                          (int)dst->n_blocks);
    if (!seq_valid(pool, src))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv fork: corrupt source sequence (len %d, %d blocks)",
                          (int)src->len, (int)src->n_blocks);
    for (int32_t i = 0; i < src->n_blocks; i++) {
        int32_t b = src->blocks[i];
        if (b < 0 || b >= pool->n_blocks || pool->refcount[b] <= 0)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "kv fork: source holds invalid block %d at index %d", (int)b, (int)i);
        if (pool->refcount[b] == INT32_MAX)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv fork: block %d has too many references", (int)b);
    }
    if (dst->cap_blocks < 0 || (dst->cap_blocks > 0 && !dst->blocks))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv fork: corrupt destination table");
    tandem_status st = seq_grow_table(dst, src->n_blocks, err);
    if (st != TANDEM_OK) return st;
    for (int32_t i = 0; i < src->n_blocks; i++) {
        dst->blocks[i] = src->blocks[i];
        pool->refcount[src->blocks[i]]++;
    }
    dst->n_blocks = src->n_blocks;
    dst->len = src->len;
    return TANDEM_OK;
}

void tdm_kv_seq_free(tdm_kv_pool *pool, tdm_kv_seq *seq) {
    if (!seq) return;
    if (pool)
        for (int32_t i = 0; i < seq->n_blocks; i++) pool_release(pool, seq->blocks[i]);
    free(seq->blocks);
    seq->blocks = NULL;
    seq->n_blocks = 0;
    seq->cap_blocks = 0;
    seq->len = 0;
}
