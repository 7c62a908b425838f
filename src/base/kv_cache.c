/* kv_cache.c - paged KV cache block pool: free list, reference counts, block
 * tables with copy-on-write, prefix caching (chain-hash table + LRU of evictable
 * blocks).  See kv_cache.h.
 *
 * Invariants (kept by every function here; tdm_kv_pool_check verifies them):
 *   - refcount[b] == number of block tables that hold b.
 *   - every block is exactly one of: held (refcount >= 1), free (refcount 0, not
 *     registered, in free_list[0 .. n_free), a LIFO stack), cached (refcount 0,
 *     registered, on the LRU list; n_cached of them).
 *   - for every sequence: n_blocks == ceil(len / block_size) <= cap_blocks.
 *   - b is registered <=> pb[b].key == b <=> b is in the hash chain of bucket
 *     pb[b].hash & (n_buckets - 1); then tok[b] holds its block_size token ids,
 *     pb[b].hash == H(parent's hash or 0, tok[b]) & hash_mask, and the parent
 *     (pb[b].parent, -1 for a first block) was registered when b was, with gen
 *     pb[b].parent_gen.  Identity = (parent, parent_gen, tok): no two registered
 *     blocks share one, so a lookup is exact whatever the hash does.
 *   - pb[b].gen counts b's registrations: a child (or duplicate) of b whose recorded
 *     gen differs from b's is stale (b was unregistered since): lookups skip it.
 *     The parent's gen predates the child's registration, so chains never loop.
 *   - pb[b].key == c != b (c >= 0): b is not registered but holds the same content
 *     as c did when registered with gen pb[b].key_gen (publish found b a duplicate);
 *     reset whenever b is allocated or written.
 *   - nothing is registered while the cache is off.
 */
#include "kv_cache.h"
#include "kv_layout.h"

#include <stdlib.h>
#include <string.h>

/* Prefix-cache state of one block (meaningful fields depend on key: see the top). */
typedef struct kv_pblock {
    uint64_t hash;          /* chain hash, while registered */
    uint64_t gen;           /* registrations of this block so far */
    uint64_t parent_gen;    /* the parent's gen when this block was registered */
    uint64_t key_gen;       /* key's gen when key (a duplicate's original) was set */
    int32_t parent;         /* registered block of the previous chain position; -1: first */
    int32_t key;            /* self: registered; other block: duplicate of it; -1: none */
    int32_t chain_next;     /* next registered block in the same bucket; -1 ends */
    int32_t lru_prev;       /* cached list neighbours (towards older / newer); -1 ends */
    int32_t lru_next;
} kv_pblock;

struct tdm_kv_pool {
    int32_t n_blocks;
    int32_t block_size;     /* token positions per block */
    int32_t *refcount;      /* [n_blocks] */
    int32_t *free_list;     /* [n_blocks] stack of free block ids; top at n_free - 1 */
    int32_t n_free;         /* free blocks (cached ones not included) */
    tdm_kv_copy_fn copy;    /* may be NULL (nothing to copy: e.g. accounting-only use) */
    void *copy_user_data;

    /* prefix cache */
    bool prefix_on;
    kv_pblock *pb;          /* [n_blocks] */
    int32_t *bucket;        /* [n_buckets] first registered block of each hash chain; -1 empty */
    int32_t n_buckets;      /* power of two >= n_blocks (capped at 2^30) */
    uint64_t hash_mask;     /* ANDed into every chain hash: all ones but in tests */
    int32_t *tok;           /* [n_blocks][block_size] token ids of registered blocks; NULL until on */
    int32_t lru_head;       /* least recently released cached block; -1 when none */
    int32_t lru_tail;       /* most recently released cached block; -1 when none */
    int32_t n_cached;       /* blocks on the LRU list */
    uint64_t n_queried, n_hit, n_evicted; /* tdm_kv_prefix_stats */
};

/* ------------------------------------------------------------- accounting */

size_t tdm_kv_bytes_per_block(const tdm_kv_layout *models, int n_models, int32_t block_size) {
    if (!models || n_models <= 0 || block_size <= 0) return 0;
    uint64_t total = 0;
    for (int m = 0; m < n_models; m++) {
        const tdm_kv_layout *l = &models[m];
        if (l->n_layer < 0 || l->n_kv_head < 0 || l->head_dim < 0 || !tdm_kv_type_ok(l->type)) return 0;
        if ((uint64_t)block_size * (uint64_t)l->head_dim > ((uint64_t)1 << 59)) return 0; /* (a unit overflows) */
        uint64_t b = 2; /* K and V */
        if (tdm_mul_overflow_u64(b, (uint64_t)l->n_layer, &b) ||
            tdm_mul_overflow_u64(b, (uint64_t)l->n_kv_head, &b) ||
            tdm_mul_overflow_u64(b, (uint64_t)tdm_kv_unit_bytes(l->type, block_size, l->head_dim), &b) ||
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
    int32_t n_buckets = 1;
    while (n_buckets < n_blocks && n_buckets < (1 << 30)) n_buckets *= 2;
    pool->refcount = tdm_calloc((size_t)n_blocks, sizeof *pool->refcount);
    pool->free_list = tdm_mallocarray((size_t)n_blocks, sizeof *pool->free_list);
    pool->pb = tdm_mallocarray((size_t)n_blocks, sizeof *pool->pb);
    pool->bucket = tdm_mallocarray((size_t)n_buckets, sizeof *pool->bucket);
    if (!pool->refcount || !pool->free_list || !pool->pb || !pool->bucket) {
        tdm_kv_pool_free(pool);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "kv pool: out of memory for %d blocks",
                          (int)n_blocks);
    }
    pool->n_blocks = n_blocks;
    pool->block_size = block_size;
    /* Stack order so that the first allocations hand out blocks 0, 1, 2, ... */
    for (int32_t i = 0; i < n_blocks; i++) pool->free_list[i] = n_blocks - 1 - i;
    pool->n_free = n_blocks;
    for (int32_t i = 0; i < n_blocks; i++)
        pool->pb[i] = (kv_pblock){.parent = -1, .key = -1, .chain_next = -1, .lru_prev = -1, .lru_next = -1};
    for (int32_t i = 0; i < n_buckets; i++) pool->bucket[i] = -1;
    pool->n_buckets = n_buckets;
    pool->hash_mask = ~(uint64_t)0;
    pool->lru_head = pool->lru_tail = -1;
    *out = pool;
    return TANDEM_OK;
}

void tdm_kv_pool_free(tdm_kv_pool *pool) {
    if (!pool) return;
    free(pool->refcount);
    free(pool->free_list);
    free(pool->pb);
    free(pool->bucket);
    free(pool->tok);
    free(pool);
}

void tdm_kv_pool_set_copy(tdm_kv_pool *pool, tdm_kv_copy_fn fn, void *user_data) {
    if (!pool) return;
    pool->copy = fn;
    pool->copy_user_data = user_data;
}

int32_t tdm_kv_pool_n_blocks(const tdm_kv_pool *pool) { return pool ? pool->n_blocks : 0; }
int32_t tdm_kv_pool_block_size(const tdm_kv_pool *pool) { return pool ? pool->block_size : 0; }
int32_t tdm_kv_pool_n_free(const tdm_kv_pool *pool) { return pool ? pool->n_free + pool->n_cached : 0; }
int32_t tdm_kv_pool_n_cached(const tdm_kv_pool *pool) { return pool ? pool->n_cached : 0; }

int32_t tdm_kv_pool_refcount(const tdm_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks) return 0;
    return pool->refcount[block];
}

int32_t tdm_kv_blocks_for(const tdm_kv_pool *pool, int32_t len) {
    if (!pool || len <= 0) return 0;
    int64_t bs = pool->block_size;
    return (int32_t)(((int64_t)len + bs - 1) / bs);
}

/* ------------------------------------------- prefix cache: table and LRU */

static bool pb_registered(const tdm_kv_pool *pool, int32_t b) { return pool->pb[b].key == b; }

static int32_t *block_tok(const tdm_kv_pool *pool, int32_t b) {
    return pool->tok + (size_t)b * (size_t)pool->block_size;
}

/* Generation a child records for its parent (-1: the root, always 0). */
static uint64_t parent_gen(const tdm_kv_pool *pool, int32_t parent) {
    return parent >= 0 ? pool->pb[parent].gen : 0;
}

static int32_t *bucket_of(tdm_kv_pool *pool, uint64_t hash) {
    return &pool->bucket[hash & (uint64_t)(pool->n_buckets - 1)];
}

static void lru_unlink(tdm_kv_pool *pool, int32_t b) {
    kv_pblock *p = &pool->pb[b];
    if (p->lru_prev >= 0) pool->pb[p->lru_prev].lru_next = p->lru_next;
    else pool->lru_head = p->lru_next;
    if (p->lru_next >= 0) pool->pb[p->lru_next].lru_prev = p->lru_prev;
    else pool->lru_tail = p->lru_prev;
    p->lru_prev = p->lru_next = -1;
    pool->n_cached--;
}

static void lru_append(tdm_kv_pool *pool, int32_t b) {
    kv_pblock *p = &pool->pb[b];
    p->lru_prev = pool->lru_tail;
    p->lru_next = -1;
    if (pool->lru_tail >= 0) pool->pb[pool->lru_tail].lru_next = b;
    else pool->lru_head = b;
    pool->lru_tail = b;
    pool->n_cached++;
}

/* Takes b out of the hash table (b registered); the caller handles the lists. */
static void unregister(tdm_kv_pool *pool, int32_t b) {
    int32_t *link = bucket_of(pool, pool->pb[b].hash);
    while (*link != b) link = &pool->pb[*link].chain_next;
    *link = pool->pb[b].chain_next;
    pool->pb[b].chain_next = -1;
    pool->pb[b].key = -1;
}

/* Forgets what b's content was (it is about to change): unregisters a held b. */
static void forget_content(tdm_kv_pool *pool, int32_t b) {
    if (pb_registered(pool, b)) unregister(pool, b);
    pool->pb[b].key = -1;
}

static uint64_t mix64(uint64_t z) { /* splitmix64's finalizer: a bijection */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* h_i = H(h_{i-1}, the block's block_size token ids); h_{-1} = 0. */
static uint64_t chain_hash(const tdm_kv_pool *pool, uint64_t parent_hash, const int32_t *tok) {
    const uint64_t golden = 0x9e3779b97f4a7c15ull;
    uint64_t h = mix64(parent_hash + golden);
    int32_t i = 0;
    for (; i + 1 < pool->block_size; i += 2)
        h = mix64((h + golden) ^ ((uint64_t)(uint32_t)tok[i] | (uint64_t)(uint32_t)tok[i + 1] << 32));
    if (i < pool->block_size) h = mix64((h + golden) ^ (uint64_t)(uint32_t)tok[i]);
    return h & pool->hash_mask;
}

/* The registered block with identity (parent, tokens): exact despite collisions. */
static int32_t lookup(tdm_kv_pool *pool, uint64_t hash, int32_t parent, const int32_t *tok) {
    const uint64_t pgen = parent_gen(pool, parent);
    const size_t bytes = (size_t)pool->block_size * sizeof *tok;
    for (int32_t c = *bucket_of(pool, hash); c >= 0; c = pool->pb[c].chain_next) {
        const kv_pblock *p = &pool->pb[c];
        if (p->hash == hash && p->parent == parent && p->parent_gen == pgen &&
            !memcmp(block_tok(pool, c), tok, bytes))
            return c;
    }
    return -1;
}

static void register_block(tdm_kv_pool *pool, int32_t b, uint64_t hash, int32_t parent,
                           const int32_t *tok) {
    kv_pblock *p = &pool->pb[b];
    p->hash = hash;
    p->parent = parent;
    p->parent_gen = parent_gen(pool, parent);
    p->gen++;
    p->key = b;
    memcpy(block_tok(pool, b), tok, (size_t)pool->block_size * sizeof *tok);
    int32_t *head = bucket_of(pool, hash);
    p->chain_next = *head;
    *head = b;
}

/* Unregisters every block: cached ones go to the free list. */
static void prefix_flush(tdm_kv_pool *pool) {
    while (pool->lru_head >= 0) {
        int32_t b = pool->lru_head;
        lru_unlink(pool, b);
        pool->free_list[pool->n_free++] = b;
    }
    for (int32_t b = 0; b < pool->n_blocks; b++) {
        pool->pb[b].key = -1;
        pool->pb[b].chain_next = -1;
    }
    for (int32_t i = 0; i < pool->n_buckets; i++) pool->bucket[i] = -1;
}

/* ----------------------------------------------------- allocate / release */

/* A block for writing: a free one, else the least recently used cached one
 * (evicted).  The caller has checked tdm_kv_pool_n_free() > 0. */
static int32_t pool_pop(tdm_kv_pool *pool) {
    int32_t b;
    if (pool->n_free > 0) {
        b = pool->free_list[--pool->n_free];
    } else {
        b = pool->lru_head;
        lru_unlink(pool, b);
        unregister(pool, b);
        pool->n_evicted++;
    }
    pool->pb[b].key = -1;
    pool->refcount[b] = 1;
    return b;
}

static void pool_release(tdm_kv_pool *pool, int32_t b) {
    if (b < 0 || b >= pool->n_blocks || pool->refcount[b] <= 0) return; /* corrupt table: ignore */
    if (--pool->refcount[b] > 0) return;
    if (pb_registered(pool, b)) lru_append(pool, b);
    else pool->free_list[pool->n_free++] = b;
}

/* Releases seq->blocks[keep ..] and drops them from the table.  With the prefix
 * cache on, last block first: the tail of a prefix then is evicted before its head. */
static void seq_release_from(tdm_kv_pool *pool, tdm_kv_seq *seq, int32_t keep) {
    if (pool->prefix_on)
        for (int32_t i = seq->n_blocks - 1; i >= keep; i--) pool_release(pool, seq->blocks[i]);
    else
        for (int32_t i = keep; i < seq->n_blocks; i++) pool_release(pool, seq->blocks[i]);
    seq->n_blocks = keep;
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
    if (n_alloc > tdm_kv_pool_n_free(pool))
        return tdm_seterr(err, TANDEM_ERR_KV_FULL,
                          "kv cache full: growing a sequence from %d to %d positions needs %lld "
                          "blocks (%d new, %d copy-on-write) but only %d of %d are free (%d of them cached); "
                          "the budget is kv_bytes (--kv-mem)",
                          (int)seq->len, (int)new_len, (long long)n_alloc,
                          (int)(need - seq->n_blocks), (int)n_cow, (int)tdm_kv_pool_n_free(pool),
                          (int)pool->n_blocks, (int)pool->n_cached);
    tandem_status st = seq_grow_table(seq, need, err);
    if (st != TANDEM_OK) return st;

    /* From here nothing can fail. */
    for (int32_t i = first_written; i < seq->n_blocks; i++) {
        int32_t src = seq->blocks[i];
        if (pool->refcount[src] <= 1) { /* written in place: no longer what it was */
            forget_content(pool, src);
            continue;
        }
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
    seq_release_from(pool, seq, keep);
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
    if (pool) seq_release_from(pool, seq, 0);
    free(seq->blocks);
    seq->blocks = NULL;
    seq->n_blocks = 0;
    seq->cap_blocks = 0;
    seq->len = 0;
}

/* ---------------------------------------------------------- prefix caching */

bool tdm_kv_pool_set_prefix_cache(tdm_kv_pool *pool, bool on) {
    if (!pool) return false;
    if (!on) {
        if (pool->prefix_on) prefix_flush(pool);
        pool->prefix_on = false;
        return false;
    }
    if (!pool->tok) {
        size_t n;
        if (tdm_mul_overflow_size((size_t)pool->n_blocks, (size_t)pool->block_size, &n)) return false;
        pool->tok = tdm_mallocarray(n, sizeof *pool->tok);
        if (!pool->tok) return false;
    }
    pool->prefix_on = true;
    return true;
}

int32_t tdm_kv_prefix_match(tdm_kv_pool *pool, const int32_t *tokens, int32_t n, int32_t max_blocks,
                            tdm_kv_seq *seq) {
    if (!pool || !seq || !pool->prefix_on || !tokens || n <= 0 || max_blocks <= 0) return 0;
    if (seq->len != 0 || seq->n_blocks != 0 || seq->cap_blocks < 0 || (seq->cap_blocks > 0 && !seq->blocks))
        return 0;
    const int32_t bs = pool->block_size;
    const int32_t want = TDM_MIN(n / bs, max_blocks);
    pool->n_queried += (uint64_t)want;
    if (want == 0) return 0;
    /* A chain never repeats a block, so it has at most n_blocks of them. */
    if (seq_grow_table(seq, TDM_MIN(want, pool->n_blocks), NULL) != TANDEM_OK) return 0;
    int32_t m = 0, parent = -1;
    uint64_t hash = 0;
    while (m < want && m < pool->n_blocks) {
        const int32_t *tok = tokens + (size_t)m * (size_t)bs;
        hash = chain_hash(pool, hash, tok);
        int32_t c = lookup(pool, hash, parent, tok);
        if (c < 0 || pool->refcount[c] == INT32_MAX) break;
        seq->blocks[m++] = parent = c;
    }
    for (int32_t i = 0; i < m; i++) {
        int32_t c = seq->blocks[i];
        if (pool->refcount[c]++ == 0) lru_unlink(pool, c);
    }
    seq->n_blocks = m;
    seq->len = m * bs;
    pool->n_hit += (uint64_t)m;
    return seq->len;
}

/* Whether b's key still says what b holds: b is registered, or a duplicate of a
 * block that is still registered as it was then. */
static bool key_valid(const tdm_kv_pool *pool, int32_t b) {
    int32_t k = pool->pb[b].key;
    if (k < 0 || !pb_registered(pool, k)) return false;
    return k == b || pool->pb[b].key_gen == pool->pb[k].gen;
}

void tdm_kv_prefix_publish(tdm_kv_pool *pool, const tdm_kv_seq *seq, const int32_t *tokens,
                           int32_t n_valid) {
    if (!pool || !seq || !pool->prefix_on || !tokens || n_valid <= 0 || !seq_valid(pool, seq)) return;
    const int32_t bs = pool->block_size;
    const int32_t n_full = TDM_MIN(n_valid, seq->len) / bs;
    int32_t parent = -1; /* the registered block of the prefix so far */
    uint64_t hash = 0;
    for (int32_t i = 0; i < n_full; i++) {
        int32_t b = seq->blocks[i];
        if (b < 0 || b >= pool->n_blocks || pool->refcount[b] <= 0 || b == parent) return; /* corrupt */
        if (key_valid(pool, b)) { /* handled before: O(1) */
            const kv_pblock *k = &pool->pb[pool->pb[b].key];
            if (k->parent == parent && k->parent_gen == parent_gen(pool, parent)) {
                parent = pool->pb[b].key;
                hash = k->hash;
                continue;
            }
        }
        const int32_t *tok = tokens + (size_t)i * (size_t)bs;
        hash = chain_hash(pool, hash, tok);
        int32_t c = lookup(pool, hash, parent, tok);
        if (c == b) {
            parent = b;
            continue;
        }
        /* b registered under another identity: its parent was unregistered since (a
         * stale registration nothing can reach).  Re-key it. */
        forget_content(pool, b);
        if (c >= 0) { /* the same content is registered already: b stays a duplicate */
            pool->pb[b].key = c;
            pool->pb[b].key_gen = pool->pb[c].gen;
            parent = c;
        } else {
            register_block(pool, b, hash, parent, tok);
            parent = b;
        }
    }
}

void tdm_kv_prefix_stats(const tdm_kv_pool *pool, uint64_t *queried_blocks, uint64_t *hit_blocks,
                         uint64_t *evictions) {
    if (queried_blocks) *queried_blocks = pool ? pool->n_queried : 0;
    if (hit_blocks) *hit_blocks = pool ? pool->n_hit : 0;
    if (evictions) *evictions = pool ? pool->n_evicted : 0;
}

const int32_t *tdm_kv_prefix_tokens(const tdm_kv_pool *pool, int32_t block) {
    if (!pool || block < 0 || block >= pool->n_blocks || !pb_registered(pool, block)) return NULL;
    return block_tok(pool, block);
}

void tdm_kv_prefix_set_hash_mask(tdm_kv_pool *pool, uint64_t mask) {
    if (!pool) return;
    prefix_flush(pool);
    pool->hash_mask = mask;
}

/* ------------------------------------------------------------ self-check */

enum { ST_HELD = 1, ST_FREE = 2, ST_CACHED = 4, ST_CHAINED = 8 };

#define CHECK(cond, ...) \
    do { \
        if (!(cond)) return tdm_seterr(err, TANDEM_ERR_INTERNAL, "kv pool check: " __VA_ARGS__); \
    } while (0)

/* st: [n_blocks] zeroed scratch for the ST_* flags. */
static tandem_status pool_check(const tdm_kv_pool *pool, uint8_t *st, tdm_err *err) {
    const int32_t nb = pool->n_blocks;
    CHECK(pool->n_free >= 0 && pool->n_free <= nb, "n_free %d of %d", (int)pool->n_free, (int)nb);
    for (int32_t i = 0; i < pool->n_free; i++) {
        int32_t b = pool->free_list[i];
        CHECK(b >= 0 && b < nb && !(st[b] & ST_FREE), "free list entry %d: block %d", (int)i, (int)b);
        st[b] |= ST_FREE;
    }
    int32_t n_lru = 0, prev = -1;
    for (int32_t b = pool->lru_head; b >= 0; prev = b, b = pool->pb[b].lru_next) {
        CHECK(b < nb && !(st[b] & ST_CACHED) && n_lru < nb, "LRU list loops or leaves the pool at %d", (int)b);
        CHECK(pool->pb[b].lru_prev == prev, "LRU block %d: prev %d, expected %d", (int)b,
              (int)pool->pb[b].lru_prev, (int)prev);
        st[b] |= ST_CACHED;
        n_lru++;
    }
    CHECK(pool->lru_tail == prev, "LRU tail %d, expected %d", (int)pool->lru_tail, (int)prev);
    CHECK(n_lru == pool->n_cached, "%d blocks on the LRU list, n_cached %d", (int)n_lru, (int)pool->n_cached);
    int32_t n_chained = 0;
    for (int32_t i = 0; i < pool->n_buckets; i++)
        for (int32_t b = pool->bucket[i]; b >= 0; b = pool->pb[b].chain_next) {
            CHECK(b < nb && !(st[b] & ST_CHAINED) && n_chained < nb, "hash chain %d loops at block %d", (int)i, (int)b);
            CHECK((pool->pb[b].hash & (uint64_t)(pool->n_buckets - 1)) == (uint64_t)i &&
                      (pool->pb[b].hash & ~pool->hash_mask) == 0,
                  "block %d in the wrong bucket %d", (int)b, (int)i);
            st[b] |= ST_CHAINED;
            n_chained++;
        }
    CHECK(pool->prefix_on || n_chained == 0, "%d blocks registered with the cache off", (int)n_chained);
    for (int32_t b = 0; b < nb; b++) {
        const kv_pblock *p = &pool->pb[b];
        bool reg = pb_registered(pool, b);
        CHECK(pool->refcount[b] >= 0, "block %d refcount %d", (int)b, (int)pool->refcount[b]);
        if (pool->refcount[b] > 0) st[b] |= ST_HELD;
        CHECK(reg == !!(st[b] & ST_CHAINED), "block %d: key %d but %s a hash chain", (int)b, (int)p->key,
              reg ? "in no" : "in");
        int want = st[b] & ST_HELD ? ST_HELD : reg ? ST_CACHED : ST_FREE;
        CHECK((st[b] & (ST_HELD | ST_FREE | ST_CACHED)) == want,
              "block %d (refcount %d, %sregistered) is not exactly one of held/free/cached (state %d)",
              (int)b, (int)pool->refcount[b], reg ? "" : "un", (int)st[b]);
        if (!reg) continue;
        CHECK(p->parent >= -1 && p->parent < nb && p->parent != b, "block %d parent %d", (int)b, (int)p->parent);
        /* The hash matches the parent's when the parent still is what it was. */
        if (p->parent >= 0 && pb_registered(pool, p->parent) && p->parent_gen == pool->pb[p->parent].gen)
            CHECK(p->hash == chain_hash(pool, pool->pb[p->parent].hash, block_tok(pool, b)),
                  "block %d hash does not chain from its parent %d", (int)b, (int)p->parent);
        if (p->parent < 0)
            CHECK(p->hash == chain_hash(pool, 0, block_tok(pool, b)), "first block %d hash is wrong", (int)b);
    }
    return TANDEM_OK;
}
#undef CHECK

tandem_status tdm_kv_pool_check(const tdm_kv_pool *pool, tdm_err *err) {
    if (!pool) return tdm_seterr(err, TANDEM_ERR_INTERNAL, "kv pool check: NULL pool");
    uint8_t *st = calloc((size_t)pool->n_blocks, 1);
    if (!st) return tdm_seterr(err, TANDEM_ERR_NOMEM, "kv pool check: out of memory");
    tandem_status status = pool_check(pool, st, err);
    free(st);
    return status;
}
