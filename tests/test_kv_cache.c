/* test_kv_cache.c - the paged KV block pool against a trivially correct reference.
 *
 * The reference model keeps, per sequence, the logical contents (one value per
 * position, written when the position is reserved, as a real cache would write K/V).
 * The "device" storage is a fake array [n_blocks][block_size] that the pool's copy
 * callback copies.  After every operation each sequence's positions, read through its
 * block table, must equal the reference (this catches a missing copy-on-write), the
 * refcounts must equal the number of tables holding each block, and n_free must equal
 * n_blocks minus the blocks in use.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kv_cache.h"

#define MAX_SEQ 8

typedef struct fake_store {
    int32_t n_blocks, block_size;
    int64_t *data;   /* [n_blocks][block_size] */
    int64_t n_copies;
} fake_store;

static void fake_copy(void *ud, int32_t src, int32_t dst) {
    fake_store *fs = ud;
    cr_assert(src >= 0 && src < fs->n_blocks && dst >= 0 && dst < fs->n_blocks && src != dst,
              "copy callback with bad blocks %d -> %d", src, dst);
    memcpy(&fs->data[(size_t)dst * fs->block_size], &fs->data[(size_t)src * fs->block_size],
           (size_t)fs->block_size * sizeof(int64_t));
    fs->n_copies++;
}

typedef struct harness {
    tdm_kv_pool *pool;
    fake_store fs;
    int n_seq;
    tdm_kv_seq seq[MAX_SEQ];
    int64_t *ref[MAX_SEQ];   /* [ref_cap] logical contents of each sequence */
    int32_t ref_len[MAX_SEQ];
    int32_t ref_cap;
    int64_t next_value;
} harness;

static void h_init(harness *h, int32_t n_blocks, int32_t block_size, int n_seq, int32_t max_len) {
    memset(h, 0, sizeof *h);
    tdm_err err = {0};
    cr_assert_eq(tdm_kv_pool_create(n_blocks, block_size, &h->pool, &err), TANDEM_OK, "%s", err.msg);
    h->fs.n_blocks = n_blocks;
    h->fs.block_size = block_size;
    h->fs.data = calloc((size_t)n_blocks * block_size, sizeof(int64_t));
    tdm_kv_pool_set_copy(h->pool, fake_copy, &h->fs);
    h->n_seq = n_seq;
    h->ref_cap = max_len;
    for (int s = 0; s < n_seq; s++) {
        h->seq[s] = (tdm_kv_seq)TDM_KV_SEQ_INIT;
        h->ref[s] = calloc((size_t)max_len, sizeof(int64_t));
    }
    h->next_value = 1;
}

static void h_free(harness *h) {
    for (int s = 0; s < h->n_seq; s++) {
        tdm_kv_seq_free(h->pool, &h->seq[s]);
        free(h->ref[s]);
    }
    cr_assert_eq(tdm_kv_pool_n_free(h->pool), tdm_kv_pool_n_blocks(h->pool),
                 "blocks leaked: %d of %d free", tdm_kv_pool_n_free(h->pool),
                 tdm_kv_pool_n_blocks(h->pool));
    tdm_kv_pool_free(h->pool);
    free(h->fs.data);
}

static int64_t *slot(harness *h, int32_t block, int32_t pos_in_block) {
    return &h->fs.data[(size_t)block * h->fs.block_size + pos_in_block];
}

/* Everything the pool and the tables say, checked against the reference. */
static void h_check(harness *h, const char *what, int step) {
    int32_t nb = tdm_kv_pool_n_blocks(h->pool), bs = tdm_kv_pool_block_size(h->pool);
    int32_t *count = calloc((size_t)nb, sizeof *count);
    for (int s = 0; s < h->n_seq; s++) {
        tdm_kv_seq *q = &h->seq[s];
        cr_assert_eq(q->len, h->ref_len[s], "%s step %d: seq %d len %d, expected %d", what, step, s,
                     q->len, h->ref_len[s]);
        cr_assert_eq(q->n_blocks, (q->len + bs - 1) / bs, "%s step %d: seq %d has %d blocks for len %d",
                     what, step, s, q->n_blocks, q->len);
        cr_assert_leq(q->n_blocks, q->cap_blocks);
        for (int32_t i = 0; i < q->n_blocks; i++) {
            int32_t b = q->blocks[i];
            cr_assert(b >= 0 && b < nb, "%s step %d: seq %d block[%d] = %d out of range", what, step, s, i, b);
            for (int32_t j = 0; j < i; j++)
                cr_assert_neq(q->blocks[j], b, "%s step %d: seq %d holds block %d twice", what, step, s, b);
            count[b]++;
        }
        for (int32_t p = 0; p < q->len; p++) {
            int64_t got = *slot(h, q->blocks[p / bs], p % bs);
            cr_assert_eq(got, h->ref[s][p], "%s step %d: seq %d position %d reads %lld, expected %lld",
                         what, step, s, p, (long long)got, (long long)h->ref[s][p]);
        }
    }
    int32_t in_use = 0;
    for (int32_t b = 0; b < nb; b++) {
        cr_assert_eq(tdm_kv_pool_refcount(h->pool, b), count[b], "%s step %d: block %d refcount %d, %d tables hold it",
                     what, step, b, tdm_kv_pool_refcount(h->pool, b), count[b]);
        if (count[b]) in_use++;
    }
    cr_assert_eq(tdm_kv_pool_n_free(h->pool), nb - in_use, "%s step %d: n_free %d, expected %d", what, step,
                 tdm_kv_pool_n_free(h->pool), nb - in_use);
    free(count);
}

/* Blocks a reserve must allocate, computed from the tables alone. */
static int32_t expected_alloc(harness *h, int s, int32_t new_len) {
    tdm_kv_seq *q = &h->seq[s];
    int32_t bs = tdm_kv_pool_block_size(h->pool);
    if (new_len <= q->len) return 0;
    int32_t need = (new_len + bs - 1) / bs - q->n_blocks;
    if (q->len % bs != 0) { /* the last block gets written: shared? */
        int32_t b = q->blocks[q->n_blocks - 1], holders = 0;
        for (int t = 0; t < h->n_seq; t++)
            for (int32_t i = 0; i < h->seq[t].n_blocks; i++) holders += h->seq[t].blocks[i] == b;
        if (holders > 1) need++;
    }
    return need;
}

typedef struct snapshot {
    int32_t len[MAX_SEQ], n_blocks[MAX_SEQ];
    int32_t *blocks[MAX_SEQ];
    int32_t *refcount;
    int64_t *data;
    int32_t n_free;
} snapshot;

static void snap_take(harness *h, snapshot *sn) {
    int32_t nb = h->fs.n_blocks;
    for (int s = 0; s < h->n_seq; s++) {
        sn->len[s] = h->seq[s].len;
        sn->n_blocks[s] = h->seq[s].n_blocks;
        sn->blocks[s] = malloc(((size_t)h->seq[s].n_blocks + 1) * sizeof(int32_t));
        if (h->seq[s].n_blocks) memcpy(sn->blocks[s], h->seq[s].blocks, (size_t)h->seq[s].n_blocks * sizeof(int32_t));
    }
    sn->refcount = malloc((size_t)nb * sizeof(int32_t));
    for (int32_t b = 0; b < nb; b++) sn->refcount[b] = tdm_kv_pool_refcount(h->pool, b);
    sn->data = malloc((size_t)nb * h->fs.block_size * sizeof(int64_t));
    memcpy(sn->data, h->fs.data, (size_t)nb * h->fs.block_size * sizeof(int64_t));
    sn->n_free = tdm_kv_pool_n_free(h->pool);
}

static void snap_check_and_free(harness *h, snapshot *sn) {
    int32_t nb = h->fs.n_blocks;
    for (int s = 0; s < h->n_seq; s++) {
        cr_assert_eq(h->seq[s].len, sn->len[s], "KV_FULL changed seq %d len", s);
        cr_assert_eq(h->seq[s].n_blocks, sn->n_blocks[s], "KV_FULL changed seq %d blocks", s);
        if (sn->n_blocks[s])
            cr_assert(!memcmp(h->seq[s].blocks, sn->blocks[s], (size_t)sn->n_blocks[s] * sizeof(int32_t)),
                      "KV_FULL changed seq %d block table", s);
        free(sn->blocks[s]);
    }
    for (int32_t b = 0; b < nb; b++)
        cr_assert_eq(tdm_kv_pool_refcount(h->pool, b), sn->refcount[b], "KV_FULL changed refcount of block %d", b);
    cr_assert(!memcmp(h->fs.data, sn->data, (size_t)nb * h->fs.block_size * sizeof(int64_t)),
              "KV_FULL copied a block");
    cr_assert_eq(tdm_kv_pool_n_free(h->pool), sn->n_free, "KV_FULL changed n_free");
    free(sn->refcount);
    free(sn->data);
}

/* Reserve through the pool and, on success, write fresh values into the new positions
 * (through the block table, like a forward pass) and into the reference. */
static tandem_status h_reserve(harness *h, int s, int32_t new_len) {
    int32_t bs = tdm_kv_pool_block_size(h->pool);
    int32_t old = h->seq[s].len;
    int32_t want = expected_alloc(h, s, new_len);
    bool should_fit = want <= tdm_kv_pool_n_free(h->pool);
    snapshot sn;
    snap_take(h, &sn);
    tdm_err err = {0};
    tandem_status st = tdm_kv_seq_reserve(h->pool, &h->seq[s], new_len, &err);
    if (st == TANDEM_ERR_KV_FULL) {
        cr_assert(!should_fit, "reserve %d -> %d failed with %d free blocks, needs %d: %s", old, new_len,
                  tdm_kv_pool_n_free(h->pool), want, err.msg);
        cr_assert(strstr(err.msg, "free") != NULL, "KV_FULL message should name free blocks: %s", err.msg);
        snap_check_and_free(h, &sn);
        return st;
    }
    for (int t = 0; t < h->n_seq; t++) free(sn.blocks[t]);
    free(sn.refcount);
    free(sn.data);
    cr_assert_eq(st, TANDEM_OK, "reserve %d -> %d: %s", old, new_len, err.msg);
    cr_assert(should_fit, "reserve %d -> %d succeeded with %d free blocks but needs %d", old, new_len,
              tdm_kv_pool_n_free(h->pool), want);
    for (int32_t p = old; p < new_len; p++) {
        int64_t v = h->next_value++;
        *slot(h, h->seq[s].blocks[p / bs], p % bs) = v;
        h->ref[s][p] = v;
    }
    if (new_len > h->ref_len[s]) h->ref_len[s] = new_len;
    return st;
}

static void h_truncate(harness *h, int s, int32_t new_len) {
    tdm_kv_seq_truncate(h->pool, &h->seq[s], new_len);
    if (new_len >= 0 && new_len < h->ref_len[s]) h->ref_len[s] = new_len;
}

static void h_fork(harness *h, int src, int dst) {
    tdm_err err = {0};
    tandem_status st = tdm_kv_seq_fork(h->pool, &h->seq[src], &h->seq[dst], &err);
    cr_assert_eq(st, TANDEM_OK, "fork %d -> %d: %s", src, dst, err.msg);
    memcpy(h->ref[dst], h->ref[src], (size_t)h->ref_len[src] * sizeof(int64_t));
    h->ref_len[dst] = h->ref_len[src];
}

static void h_free_seq(harness *h, int s) {
    tdm_kv_seq_free(h->pool, &h->seq[s]);
    h->ref_len[s] = 0;
}

static uint64_t rnd(uint64_t *st) {
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int32_t rnd_below(uint64_t *st, int32_t n) { return (int32_t)(rnd(st) % (uint64_t)n); }

static void random_ops(int32_t n_blocks, int32_t bs, int n_seq, int n_ops, uint64_t seed) {
    int32_t max_len = n_blocks * bs / 2 + 3;
    harness h;
    h_init(&h, n_blocks, bs, n_seq, max_len);
    uint64_t st = seed;
    int n_full = 0, n_forks = 0;
    for (int step = 0; step < n_ops; step++) {
        int s = rnd_below(&st, n_seq);
        int op = rnd_below(&st, 100);
        const char *what;
        if (op < 40) { /* append a small random amount (often inside the last block) */
            what = "append";
            int32_t add = rnd_below(&st, 2 * bs + 2);
            int32_t nl = TDM_MIN(h.seq[s].len + add, max_len);
            n_full += h_reserve(&h, s, nl) == TANDEM_ERR_KV_FULL;
        } else if (op < 50) { /* reserve to a random absolute length */
            what = "reserve";
            n_full += h_reserve(&h, s, rnd_below(&st, max_len + 1)) == TANDEM_ERR_KV_FULL;
        } else if (op < 75) { /* truncate to a random length (often a little) */
            what = "truncate";
            int32_t len = h.seq[s].len;
            int32_t nl = rnd_below(&st, 2) ? rnd_below(&st, len + 1) : TDM_MAX(0, len - rnd_below(&st, bs + 2));
            h_truncate(&h, s, nl);
        } else if (op < 92) { /* fork into an empty sequence (free one first if needed) */
            what = "fork";
            int d = rnd_below(&st, n_seq);
            if (d == s) continue;
            if (h.seq[d].len > 0 || rnd_below(&st, 2)) h_free_seq(&h, d);
            else h_truncate(&h, d, 0); /* keeps its table allocation */
            h_fork(&h, s, d);
            n_forks++;
        } else {
            what = "free";
            h_free_seq(&h, s);
        }
        h_check(&h, what, step);
    }
    cr_assert_gt(n_forks, 0);
    if (bs > 1) /* with one position per block, a written block is always a new one */
        cr_assert_gt(h.fs.n_copies, 0, "random ops never exercised copy-on-write");
    else
        cr_assert_eq(h.fs.n_copies, 0, "block_size 1 never needs copy-on-write");
    cr_log_info("kv random ops nb=%d bs=%d: %d KV_FULL, %d forks, %lld copies", n_blocks, bs, n_full,
                n_forks, (long long)h.fs.n_copies);
    h_free(&h);
}

Test(kv_cache, random_ops_bs4) { random_ops(64, 4, 8, 20000, 1); }
Test(kv_cache, random_ops_bs1) { random_ops(48, 1, 8, 10000, 2); }
Test(kv_cache, random_ops_bs16) { random_ops(40, 16, 8, 20000, 3); }
Test(kv_cache, random_ops_bs3_tight) { random_ops(12, 3, 5, 20000, 4); }
Test(kv_cache, random_ops_two_seqs) { random_ops(30, 5, 2, 5000, 5); }

Test(kv_cache, block_boundaries) {
    harness h;
    h_init(&h, 8, 4, 2, 64);
    cr_assert_eq(h_reserve(&h, 0, 4), TANDEM_OK); /* exactly one block */
    cr_assert_eq(h.seq[0].n_blocks, 1);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 7);
    h_check(&h, "boundary", 0);
    h_fork(&h, 0, 1);
    cr_assert_eq(h_reserve(&h, 0, 5), TANDEM_OK); /* shared block is full: no copy */
    cr_assert_eq(h.fs.n_copies, 0, "a full shared block must not be copied");
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, h.seq[0].blocks[0]), 2);
    cr_assert_eq(h.seq[0].n_blocks, 2);
    h_check(&h, "boundary", 1);
    cr_assert_eq(h_reserve(&h, 0, 8), TANDEM_OK);
    cr_assert_eq(h.seq[0].n_blocks, 2);
    cr_assert_eq(h_reserve(&h, 0, 9), TANDEM_OK);
    cr_assert_eq(h.seq[0].n_blocks, 3);
    h_truncate(&h, 0, 8);
    cr_assert_eq(h.seq[0].n_blocks, 2);
    h_truncate(&h, 0, 4);
    cr_assert_eq(h.seq[0].n_blocks, 1);
    h_check(&h, "boundary", 2);
    cr_assert_eq(tdm_kv_blocks_for(h.pool, 0), 0);
    cr_assert_eq(tdm_kv_blocks_for(h.pool, 1), 1);
    cr_assert_eq(tdm_kv_blocks_for(h.pool, 4), 1);
    cr_assert_eq(tdm_kv_blocks_for(h.pool, 5), 2);
    cr_assert_eq(tdm_kv_blocks_for(h.pool, INT32_MAX), (int32_t)(((int64_t)INT32_MAX + 3) / 4));
    h_free(&h);
}

Test(kv_cache, block_size_one) {
    harness h;
    h_init(&h, 6, 1, 2, 16);
    cr_assert_eq(h_reserve(&h, 0, 3), TANDEM_OK);
    cr_assert_eq(h.seq[0].n_blocks, 3);
    h_fork(&h, 0, 1);
    cr_assert_eq(h_reserve(&h, 1, 4), TANDEM_OK); /* new block only: nothing shared is written */
    cr_assert_eq(h.fs.n_copies, 0);
    cr_assert_eq(h_reserve(&h, 0, 6), TANDEM_ERR_KV_FULL); /* needs 3, 2 free */
    cr_assert_eq(h_reserve(&h, 0, 5), TANDEM_OK);
    h_check(&h, "bs1", 0);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 0);
    h_truncate(&h, 0, 0);
    h_check(&h, "bs1", 1);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 2);
    h_free(&h);
}

Test(kv_cache, truncate_to_zero_and_reuse) {
    harness h;
    h_init(&h, 4, 8, 1, 32);
    cr_assert_eq(h_reserve(&h, 0, 30), TANDEM_OK);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 0);
    h_truncate(&h, 0, 0);
    h_check(&h, "trunc0", 0);
    cr_assert_eq(h.seq[0].n_blocks, 0);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 4);
    h_truncate(&h, 0, -1); /* bad length: no-op */
    h_truncate(&h, 0, 5);  /* growing: no-op */
    cr_assert_eq(h.seq[0].len, 0);
    cr_assert_eq(h_reserve(&h, 0, 32), TANDEM_OK);
    h_check(&h, "trunc0", 1);
    h_free(&h);
}

Test(kv_cache, fork_empty) {
    harness h;
    h_init(&h, 4, 4, 3, 16);
    h_fork(&h, 0, 1);
    cr_assert_eq(h.seq[1].len, 0);
    cr_assert_eq(h.seq[1].n_blocks, 0);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 4);
    cr_assert_eq(h_reserve(&h, 1, 3), TANDEM_OK);
    cr_assert_eq(h_reserve(&h, 0, 3), TANDEM_OK);
    h_check(&h, "fork-empty", 0);
    tdm_err err = {0};
    /* dst not empty */
    cr_assert_eq(tdm_kv_seq_fork(h.pool, &h.seq[0], &h.seq[1], &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strlen(err.msg) > 0);
    cr_assert_eq(tdm_kv_seq_fork(h.pool, &h.seq[0], &h.seq[0], &err), TANDEM_ERR_INVALID_ARG);
    h_check(&h, "fork-empty", 1);
    h_free(&h);
}

Test(kv_cache, fork_then_both_append_into_shared_block) {
    harness h;
    h_init(&h, 8, 4, 3, 32);
    cr_assert_eq(h_reserve(&h, 0, 6), TANDEM_OK); /* blocks 0 (full), 1 (2 of 4) */
    h_fork(&h, 0, 1);
    h_fork(&h, 0, 2);
    int32_t shared = h.seq[0].blocks[1];
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, shared), 3);
    cr_assert_eq(h_reserve(&h, 0, 7), TANDEM_OK); /* copy for writer 0 */
    cr_assert_eq(h.fs.n_copies, 1);
    cr_assert_neq(h.seq[0].blocks[1], shared);
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, shared), 2);
    h_check(&h, "both-append", 0);
    cr_assert_eq(h_reserve(&h, 1, 8), TANDEM_OK); /* still shared with 2: copy again */
    cr_assert_eq(h.fs.n_copies, 2);
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, shared), 1);
    h_check(&h, "both-append", 1);
    cr_assert_eq(h_reserve(&h, 2, 7), TANDEM_OK); /* last holder: writes in place */
    cr_assert_eq(h.fs.n_copies, 2);
    cr_assert_eq(h.seq[2].blocks[1], shared);
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, h.seq[0].blocks[0]), 3); /* full block 0 stays shared */
    h_check(&h, "both-append", 2);
    /* Truncate into a shared full block, then append: must copy block 0. */
    h_truncate(&h, 1, 3);
    cr_assert_eq(h_reserve(&h, 1, 4), TANDEM_OK);
    cr_assert_eq(h.fs.n_copies, 3);
    h_check(&h, "both-append", 3);
    h_free(&h);
}

Test(kv_cache, kv_full_is_all_or_nothing) {
    harness h;
    h_init(&h, 4, 4, 2, 32);
    cr_assert_eq(h_reserve(&h, 0, 6), TANDEM_OK); /* 2 blocks */
    h_fork(&h, 0, 1);
    /* 6 -> 12 needs 1 new block + 1 copy-on-write = 2; exactly 2 free: fits. */
    cr_assert_eq(expected_alloc(&h, 0, 12), 2);
    /* 6 -> 13 needs 2 new + 1 copy = 3 > 2 free: fails, nothing changes (checked in h_reserve). */
    tdm_err err = {0};
    cr_assert_eq(tdm_kv_seq_reserve(h.pool, &h.seq[0], 13, &err), TANDEM_ERR_KV_FULL);
    cr_assert(strstr(err.msg, "3") && strstr(err.msg, "2"), "message should name needed and free: %s", err.msg);
    cr_assert_eq(h_reserve(&h, 0, 13), TANDEM_ERR_KV_FULL);
    h_check(&h, "full", 0);
    cr_assert_eq(h.fs.n_copies, 0);
    cr_assert_eq(h_reserve(&h, 0, 12), TANDEM_OK);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 0);
    cr_assert_eq(h_reserve(&h, 1, 7), TANDEM_OK); /* sole holder now: no block needed */
    cr_assert_eq(h_reserve(&h, 1, 9), TANDEM_ERR_KV_FULL);
    h_check(&h, "full", 1);
    h_free(&h);
}

Test(kv_cache, bad_arguments) {
    tdm_kv_pool *pool = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_kv_pool_create(0, 4, &pool, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_kv_pool_create(4, 0, &pool, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_kv_pool_create(-3, 4, &pool, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_null(pool);
    cr_assert_eq(tdm_kv_pool_create(4, 4, NULL, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_kv_pool_create(4, 4, &pool, &err), TANDEM_OK);
    tdm_kv_seq s = TDM_KV_SEQ_INIT;
    cr_assert_eq(tdm_kv_seq_reserve(pool, &s, -1, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "-1"), "%s", err.msg);
    cr_assert_eq(tdm_kv_seq_reserve(NULL, &s, 1, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_kv_seq_reserve(pool, NULL, 1, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_kv_seq_reserve(pool, &s, INT32_MAX, &err), TANDEM_ERR_KV_FULL);
    cr_assert_eq(s.len, 0);
    cr_assert_eq(tdm_kv_seq_reserve(pool, &s, 5, NULL), TANDEM_OK); /* NULL err allowed */
    cr_assert_eq(tdm_kv_seq_reserve(pool, &s, 3, &err), TANDEM_OK); /* smaller: no-op */
    cr_assert_eq(s.len, 5);
    cr_assert_eq(tdm_kv_seq_fork(NULL, &s, &s, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_kv_pool_refcount(pool, -1), 0);
    cr_assert_eq(tdm_kv_pool_refcount(pool, 99), 0);
    tdm_kv_seq_truncate(NULL, &s, 0);
    tdm_kv_seq_free(pool, &s);
    tdm_kv_seq_free(pool, &s); /* twice is fine */
    tdm_kv_seq_free(pool, NULL);
    cr_assert_eq(tdm_kv_pool_n_free(pool), 4);
    tdm_kv_pool_free(pool);
    tdm_kv_pool_free(NULL);
}

Test(kv_cache, bytes_per_block) {
    tdm_kv_layout m[2] = {{32, 8, 128, 2}, {22, 4, 64, 4}};
    size_t want0 = 2ull * 32 * 8 * 128 * 2 * 16, want1 = 2ull * 22 * 4 * 64 * 4 * 16;
    cr_assert_eq(tdm_kv_bytes_per_block(m, 1, 16), want0);
    cr_assert_eq(tdm_kv_bytes_per_block(m, 2, 16), want0 + want1);
    cr_assert_eq(tdm_kv_bytes_per_block(m, 0, 16), 0);
    cr_assert_eq(tdm_kv_bytes_per_block(NULL, 1, 16), 0);
    cr_assert_eq(tdm_kv_bytes_per_block(m, 1, 0), 0);
    tdm_kv_layout big = {INT32_MAX, INT32_MAX, INT32_MAX, 4};
    cr_assert_eq(tdm_kv_bytes_per_block(&big, 1, INT32_MAX), 0, "overflow must give 0");
    tdm_kv_layout neg = {-1, 8, 128, 2};
    cr_assert_eq(tdm_kv_bytes_per_block(&neg, 1, 16), 0);
    /* The sum of two models can overflow although each alone fits. */
    tdm_kv_layout half[2] = {{1 << 30, 1 << 30, 4, 1}, {1 << 30, 1 << 30, 4, 1}};
    cr_assert_eq(tdm_kv_bytes_per_block(half, 1, 1), (size_t)1 << 63);
    cr_assert_eq(tdm_kv_bytes_per_block(half, 2, 1), 0);
}

/* The KV blocks a device budget leaves (tandem_engine_params.gpu_mem): what the
 * weights and buffers leave, in whole blocks; kv_bytes caps it and must fit; too
 * small a budget is an error naming the figures. */
Test(kv_cache, gpu_mem_budget_blocks) {
    const uint64_t M = 1u << 20;
    tdm_err err = {0};
    cr_assert_eq(tdm_kv_budget_blocks(1000 * M, 300 * M, 100 * M, 0, 2 * M, &err), 300);
    cr_assert_eq(tdm_kv_budget_blocks(1000 * M + 1, 300 * M, 100 * M, 0, 2 * M, &err), 300); /* whole blocks */
    cr_assert_eq(tdm_kv_budget_blocks(1000 * M, 300 * M, 100 * M, 64 * M, 2 * M, &err), 32); /* kv_bytes caps */
    memset(&err, 0, sizeof err);
    cr_assert_eq(tdm_kv_budget_blocks(1000 * M, 300 * M, 100 * M, 601 * M, 2 * M, &err), 0);
    cr_assert_eq(err.status, TANDEM_ERR_NOMEM);
    cr_assert(strstr(err.msg, "kv_bytes of 601.0 MiB") && strstr(err.msg, "600.0 MiB"), "%s", err.msg);
    memset(&err, 0, sizeof err);
    cr_assert_eq(tdm_kv_budget_blocks(350 * M, 300 * M, 100 * M, 0, 2 * M, &err), 0); /* less than the weights + work */
    cr_assert_eq(err.status, TANDEM_ERR_NOMEM);
    cr_assert(strstr(err.msg, "gpu_mem of 350.0 MiB leaves 0.0 MiB") && strstr(err.msg, "300.0 MiB of weights"), "%s",
              err.msg);
    memset(&err, 0, sizeof err);
    cr_assert_eq(tdm_kv_budget_blocks(401 * M, 300 * M, 100 * M, 0, 2 * M, &err), 0); /* 1 MiB: not a block */
    cr_assert(strstr(err.msg, "one KV block takes 2.000 MiB"), "%s", err.msg);
    cr_assert_eq(tdm_kv_budget_blocks(402 * M, 300 * M, 100 * M, 0, 2 * M, &err), 1);
}
