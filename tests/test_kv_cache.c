/* test_kv_cache.c - the paged KV block pool against a trivially correct reference.
 *
 * The reference model keeps, per sequence, the logical contents (one value per
 * position, written when the position is reserved, as a real cache would write K/V).
 * The "device" storage is a fake array [n_blocks][block_size] that the pool's copy
 * callback copies.  After every operation each sequence's positions, read through its
 * block table, must equal the reference (this catches a missing copy-on-write), the
 * refcounts must equal the number of tables holding each block, and n_free must equal
 * n_blocks minus the blocks in use.
 *
 * With the prefix cache on (h_init_prefix) the reference also knows each position's
 * token id, and a position's value is a hash of the whole token prefix up to it (as
 * real K/V depend on the whole prefix), so a block matched under the wrong prefix
 * reads wrong values.  Registered blocks must never change while registered, their
 * registered token ids must equal the tokens of every sequence holding them, and
 * the pool's own invariant check must pass.
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
    bool prefix;             /* prefix cache on: values are kv_value() of the token prefix */
    int32_t *tok[MAX_SEQ];   /* [ref_cap] token id of each position */
    int64_t *frozen;         /* [n_blocks][block_size] a registered block's data when first seen */
    bool *seen;              /* [n_blocks] frozen holds the block's registered data */
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
        h->tok[s] = calloc((size_t)max_len, sizeof(int32_t));
    }
    h->frozen = calloc((size_t)n_blocks * block_size, sizeof(int64_t));
    h->seen = calloc((size_t)n_blocks, sizeof(bool));
    h->next_value = 1;
}

/* h_init with the prefix cache on. */
static void h_init_prefix(harness *h, int32_t n_blocks, int32_t block_size, int n_seq, int32_t max_len) {
    h_init(h, n_blocks, block_size, n_seq, max_len);
    cr_assert(tdm_kv_pool_set_prefix_cache(h->pool, true));
    h->prefix = true;
}

static void h_check(harness *h, const char *what, int step);

/* Checks everything once more, frees every sequence (no block may leak) and the pool. */
static void h_free(harness *h) {
    h_check(h, "end", -1);
    for (int s = 0; s < h->n_seq; s++) {
        tdm_kv_seq_free(h->pool, &h->seq[s]);
        free(h->ref[s]);
        free(h->tok[s]);
    }
    free(h->frozen);
    free(h->seen);
    cr_assert_eq(tdm_kv_pool_n_free(h->pool), tdm_kv_pool_n_blocks(h->pool),
                 "blocks leaked: %d of %d free", tdm_kv_pool_n_free(h->pool),
                 tdm_kv_pool_n_blocks(h->pool));
    tdm_kv_pool_free(h->pool);
    free(h->fs.data);
}

static int64_t *slot(harness *h, int32_t block, int32_t pos_in_block) {
    return &h->fs.data[(size_t)block * h->fs.block_size + pos_in_block];
}

/* The prefix cache's state against the tables and the reference. */
static void h_check_prefix(harness *h, const char *what, int step) {
    int32_t nb = tdm_kv_pool_n_blocks(h->pool), bs = tdm_kv_pool_block_size(h->pool);
    tdm_err err = {0};
    cr_assert_eq(tdm_kv_pool_check(h->pool, &err), TANDEM_OK, "%s step %d: %s", what, step, err.msg);
    int32_t cached = 0;
    for (int32_t b = 0; b < nb; b++) {
        if (!tdm_kv_prefix_tokens(h->pool, b)) {
            h->seen[b] = false;
            continue;
        }
        cached += tdm_kv_pool_refcount(h->pool, b) == 0;
        int64_t *fz = &h->frozen[(size_t)b * bs];
        if (!h->seen[b]) memcpy(fz, slot(h, b, 0), (size_t)bs * sizeof *fz);
        else
            cr_assert(!memcmp(fz, slot(h, b, 0), (size_t)bs * sizeof *fz),
                      "%s step %d: registered block %d was written", what, step, b);
        h->seen[b] = true;
    }
    cr_assert_eq(tdm_kv_pool_n_cached(h->pool), cached, "%s step %d: n_cached %d, %d registered unheld blocks",
                 what, step, tdm_kv_pool_n_cached(h->pool), cached);
    for (int s = 0; s < h->n_seq; s++)
        for (int32_t i = 0; i < h->seq[s].n_blocks; i++) {
            const int32_t *rt = tdm_kv_prefix_tokens(h->pool, h->seq[s].blocks[i]);
            for (int32_t j = 0; rt && j < bs && i * bs + j < h->seq[s].len; j++)
                cr_assert_eq(rt[j], h->tok[s][i * bs + j],
                             "%s step %d: seq %d block %d (id %d) registered with token %d at %d, holds %d", what,
                             step, s, i, h->seq[s].blocks[i], rt[j], j, h->tok[s][i * bs + j]);
        }
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
    h_check_prefix(h, what, step);
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
    int32_t n_free, n_cached;
    bool *reg;   /* [n_blocks] registered */
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
    sn->n_cached = tdm_kv_pool_n_cached(h->pool);
    sn->reg = malloc((size_t)nb * sizeof(bool));
    for (int32_t b = 0; b < nb; b++) sn->reg[b] = tdm_kv_prefix_tokens(h->pool, b) != NULL;
}

static void snap_free(harness *h, snapshot *sn) {
    for (int t = 0; t < h->n_seq; t++) free(sn->blocks[t]);
    free(sn->refcount);
    free(sn->data);
    free(sn->reg);
}

static void snap_check_and_free(harness *h, snapshot *sn) {
    int32_t nb = h->fs.n_blocks;
    for (int s = 0; s < h->n_seq; s++) {
        cr_assert_eq(h->seq[s].len, sn->len[s], "KV_FULL changed seq %d len", s);
        cr_assert_eq(h->seq[s].n_blocks, sn->n_blocks[s], "KV_FULL changed seq %d blocks", s);
        if (sn->n_blocks[s])
            cr_assert(!memcmp(h->seq[s].blocks, sn->blocks[s], (size_t)sn->n_blocks[s] * sizeof(int32_t)),
                      "KV_FULL changed seq %d block table", s);
    }
    for (int32_t b = 0; b < nb; b++) {
        cr_assert_eq(tdm_kv_pool_refcount(h->pool, b), sn->refcount[b], "KV_FULL changed refcount of block %d", b);
        cr_assert_eq(tdm_kv_prefix_tokens(h->pool, b) != NULL, sn->reg[b], "KV_FULL changed block %d's registration", b);
    }
    cr_assert(!memcmp(h->fs.data, sn->data, (size_t)nb * h->fs.block_size * sizeof(int64_t)),
              "KV_FULL copied a block");
    cr_assert_eq(tdm_kv_pool_n_free(h->pool), sn->n_free, "KV_FULL changed n_free");
    cr_assert_eq(tdm_kv_pool_n_cached(h->pool), sn->n_cached, "KV_FULL changed n_cached");
    snap_free(h, sn);
}

/* What position p holds in the prefix mode: a function of the whole token prefix. */
static int64_t kv_value(int64_t prev, int32_t tok) {
    uint64_t z = (uint64_t)prev * 0x9e3779b97f4a7c15ull + (uint32_t)tok + 1;
    z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
    return (int64_t)(z ^ (z >> 29));
}

/* Reserve through the pool and, on success, write fresh values into the new positions
 * (through the block table, like a forward pass) and into the reference.  toks
 * (indexed by position; may be NULL) gives the new positions' token ids. */
static tandem_status h_reserve_tok(harness *h, int s, int32_t new_len, const int32_t *toks) {
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
    snap_free(h, &sn);
    cr_assert_eq(st, TANDEM_OK, "reserve %d -> %d: %s", old, new_len, err.msg);
    cr_assert(should_fit, "reserve %d -> %d succeeded with %d free blocks but needs %d", old, new_len,
              tdm_kv_pool_n_free(h->pool), want);
    for (int32_t p = old; p < new_len; p++) {
        int32_t tok = toks ? toks[p] : (int32_t)(h->next_value & 0x7fffffff);
        int64_t v = h->prefix ? kv_value(p ? h->ref[s][p - 1] : 0, tok) : h->next_value;
        h->next_value++;
        *slot(h, h->seq[s].blocks[p / bs], p % bs) = v;
        h->ref[s][p] = v;
        h->tok[s][p] = tok;
    }
    if (new_len > h->ref_len[s]) h->ref_len[s] = new_len;
    return st;
}

static tandem_status h_reserve(harness *h, int s, int32_t new_len) { return h_reserve_tok(h, s, new_len, NULL); }

static void h_truncate(harness *h, int s, int32_t new_len) {
    tdm_kv_seq_truncate(h->pool, &h->seq[s], new_len);
    if (new_len >= 0 && new_len < h->ref_len[s]) h->ref_len[s] = new_len;
}

static void h_fork(harness *h, int src, int dst) {
    tdm_err err = {0};
    tandem_status st = tdm_kv_seq_fork(h->pool, &h->seq[src], &h->seq[dst], &err);
    cr_assert_eq(st, TANDEM_OK, "fork %d -> %d: %s", src, dst, err.msg);
    memcpy(h->ref[dst], h->ref[src], (size_t)h->ref_len[src] * sizeof(int64_t));
    memcpy(h->tok[dst], h->tok[src], (size_t)h->ref_len[src] * sizeof(int32_t));
    h->ref_len[dst] = h->ref_len[src];
}

static void h_free_seq(harness *h, int s) {
    tdm_kv_seq_free(h->pool, &h->seq[s]);
    h->ref_len[s] = 0;
}

/* Empties seq s (keeping its table allocation when keep_table) and matches toks[0, n)
 * into it; checks what it got and takes it into the reference. */
static int32_t h_match(harness *h, int s, const int32_t *toks, int32_t n, int32_t max_blocks, bool keep_table) {
    int32_t bs = tdm_kv_pool_block_size(h->pool);
    if (keep_table) h_truncate(h, s, 0);
    else h_free_seq(h, s);
    int32_t got = tdm_kv_prefix_match(h->pool, toks, n, max_blocks, &h->seq[s]);
    cr_assert_eq(got, h->seq[s].len, "match returned %d, seq len %d", got, h->seq[s].len);
    cr_assert(got % bs == 0 && got <= n && got / bs <= max_blocks, "match of %d tokens (max %d blocks) gave %d",
              n, max_blocks, got);
    cr_assert_eq(h->seq[s].n_blocks, got / bs);
    for (int32_t p = 0; p < got; p++) {
        const int32_t *rt = tdm_kv_prefix_tokens(h->pool, h->seq[s].blocks[p / bs]);
        cr_assert(rt && rt[p % bs] == toks[p], "matched block %d does not hold token %d at position %d", p / bs,
                  toks[p], p);
        h->tok[s][p] = toks[p];
        h->ref[s][p] = kv_value(p ? h->ref[s][p - 1] : 0, toks[p]);
    }
    h->ref_len[s] = got;
    return got;
}

static void h_publish(harness *h, int s, int32_t n_valid) {
    tdm_kv_prefix_publish(h->pool, &h->seq[s], h->tok[s], n_valid);
}

/* Computes positions [len, n) of seq s with toks (as a forward pass would) and publishes them. */
static void h_compute_publish(harness *h, int s, int32_t n, const int32_t *toks) {
    cr_assert_eq(h_reserve_tok(h, s, n, toks), TANDEM_OK, "computing seq %d to %d", s, n);
    h_publish(h, s, n);
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
            int32_t cut = rnd_below(&st, bs + 2); /* not inside TDM_MAX: it evaluates twice */
            int32_t nl = rnd_below(&st, 2) ? rnd_below(&st, len + 1) : TDM_MAX(0, len - cut);
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
    tdm_kv_layout m[2] = {{32, 8, 128, TDM_F16}, {22, 4, 64, TDM_F32}};
    size_t want0 = 2ull * 32 * 8 * 128 * 2 * 16, want1 = 2ull * 22 * 4 * 64 * 4 * 16;
    cr_assert_eq(tdm_kv_bytes_per_block(m, 1, 16), want0);
    cr_assert_eq(tdm_kv_bytes_per_block(m, 2, 16), want0 + want1);
    cr_assert_eq(tdm_kv_bytes_per_block(m, 0, 16), 0);
    cr_assert_eq(tdm_kv_bytes_per_block(NULL, 1, 16), 0);
    cr_assert_eq(tdm_kv_bytes_per_block(m, 1, 0), 0);
    /* q8_0: per (block, kv head) the int8 quants and one f32 scale per slot, each
     * padded to 16 bytes (src/base/kv_layout.h) */
    tdm_kv_layout q8 = {32, 8, 128, TDM_Q8_0};
    cr_assert_eq(tdm_kv_bytes_per_block(&q8, 1, 16), 2ull * 32 * 8 * (128 * 16 + 4 * 16));
    tdm_kv_layout q8odd = {1, 1, 3, TDM_Q8_0}; /* 5 x 3 quants -> 16 bytes, 5 scales -> 32 */
    cr_assert_eq(tdm_kv_bytes_per_block(&q8odd, 1, 5), 2ull * (16 + 32));
    tdm_kv_layout bad = {32, 8, 128, TDM_Q4_0};
    cr_assert_eq(tdm_kv_bytes_per_block(&bad, 1, 16), 0, "not a cache type");
    tdm_kv_layout big = {INT32_MAX, INT32_MAX, INT32_MAX, TDM_F32};
    cr_assert_eq(tdm_kv_bytes_per_block(&big, 1, INT32_MAX), 0, "overflow must give 0");
    tdm_kv_layout neg = {-1, 8, 128, TDM_F16};
    cr_assert_eq(tdm_kv_bytes_per_block(&neg, 1, 16), 0);
    /* The sum of two models can overflow although each alone fits. */
    tdm_kv_layout half[2] = {{1 << 30, 1 << 29, 4, TDM_F16}, {1 << 30, 1 << 29, 4, TDM_F16}};
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

/* ---------------------------------------------------------- prefix caching */

static int32_t n_registered(harness *h) {
    int32_t n = 0;
    for (int32_t b = 0; b < tdm_kv_pool_n_blocks(h->pool); b++) n += tdm_kv_prefix_tokens(h->pool, b) != NULL;
    return n;
}

static void seq_tokens(int32_t *t, int32_t n, int32_t first) {
    for (int32_t i = 0; i < n; i++) t[i] = first + i;
}

/* A prefix-cache harness of 8 blocks of 4 positions where seq 0 has computed and
 * published t[0, 8) = 100, 101, ...; u gets t but u7 at position 7.  Returns seq 0's
 * block 1. */
static int32_t h_published(harness *h, int n_seq, int32_t t[8], int32_t u[8], int32_t u7) {
    h_init_prefix(h, 8, 4, n_seq, 32);
    seq_tokens(t, 8, 100);
    seq_tokens(u, 8, 100);
    u[7] = u7;
    h_compute_publish(h, 0, 8, t);
    cr_assert_eq(n_registered(h), 2);
    return h->seq[0].blocks[1];
}

Test(kv_cache, prefix_off_by_default) {
    harness h;
    h_init(&h, 8, 4, 2, 32);
    int32_t t[12];
    seq_tokens(t, 12, 100);
    h_compute_publish(&h, 0, 12, t);
    cr_assert_eq(n_registered(&h), 0);
    cr_assert_eq(tdm_kv_prefix_match(h.pool, t, 12, INT32_MAX, &h.seq[1]), 0);
    cr_assert_eq(h.seq[1].n_blocks, 0);
    h_free_seq(&h, 0);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 0);
    uint64_t q = 1, hit = 1, ev = 1;
    tdm_kv_prefix_stats(h.pool, &q, &hit, &ev);
    cr_assert(q == 0 && hit == 0 && ev == 0);
    tdm_kv_prefix_stats(h.pool, NULL, NULL, NULL);
    h_free(&h);
}

Test(kv_cache, prefix_match_finds_full_blocks_only) {
    harness h;
    h_init_prefix(&h, 16, 4, 3, 64);
    int32_t t[16], t2[16];
    seq_tokens(t, 16, 100);
    cr_assert_eq(h_match(&h, 1, t, 16, INT32_MAX, false), 0, "empty cache");
    h_compute_publish(&h, 0, 10, t);
    cr_assert_eq(n_registered(&h), 2, "only the two full blocks");
    cr_assert_null(tdm_kv_prefix_tokens(h.pool, h.seq[0].blocks[2]));
    h_check(&h, "full", 0);
    cr_assert_eq(h_match(&h, 1, t, 16, INT32_MAX, false), 8);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(h.seq[1].blocks[i], h.seq[0].blocks[i]);
        cr_assert_eq(tdm_kv_pool_refcount(h.pool, h.seq[0].blocks[i]), 2);
    }
    cr_assert_eq(h_match(&h, 2, t, 7, INT32_MAX, false), 4, "a 7-token request has one full block");
    h_publish(&h, 0, 9); /* block 2 (8..11) is not valid yet: nothing new */
    h_publish(&h, 0, 10);
    cr_assert_eq(n_registered(&h), 2);
    h_check(&h, "full", 1);
    /* seq 1 computes the rest and publishes it: its blocks chain from seq 0's. */
    h_compute_publish(&h, 1, 16, t);
    cr_assert_eq(n_registered(&h), 4);
    cr_assert_eq(h_match(&h, 2, t, 16, INT32_MAX, true), 16);
    cr_assert_eq(h.seq[2].blocks[3], h.seq[1].blocks[3]);
    h_check(&h, "full", 2);
    memcpy(t2, t, sizeof t);
    t2[9] = 999; /* block 2 differs */
    cr_assert_eq(h_match(&h, 2, t2, 16, INT32_MAX, false), 8);
    t2[1] = 999; /* block 0 differs */
    cr_assert_eq(h_match(&h, 2, t2, 16, INT32_MAX, false), 0);
    cr_assert_eq(h_match(&h, 2, t, 16, 1, false), 4, "max_blocks");
    cr_assert_eq(h_match(&h, 2, t, 16, 3, false), 12);
    cr_assert_eq(h_match(&h, 2, t, 16, 0, false), 0);
    h_check(&h, "full", 3);
    /* A non-empty sequence is refused. */
    cr_assert_eq(tdm_kv_prefix_match(h.pool, t, 16, INT32_MAX, &h.seq[1]), 0);
    cr_assert_eq(h.seq[1].len, 16);
    uint64_t q, hit;
    tdm_kv_prefix_stats(h.pool, &q, &hit, NULL);
    /* max_blocks 0 and the refused call count nothing */
    cr_assert_eq(q, 4 + 4 + 1 + 4 + 4 + 4 + 1 + 3, "queried %llu", (unsigned long long)q);
    cr_assert_eq(hit, 0 + 2 + 1 + 4 + 2 + 0 + 1 + 3, "hit %llu", (unsigned long long)hit);
    h_free(&h);
}

Test(kv_cache, prefix_released_blocks_stay_cached) {
    harness h;
    int32_t t[8], u[8];
    int32_t b1 = h_published(&h, 2, t, u, 0), b0 = h.seq[0].blocks[0];
    cr_assert_eq(h_match(&h, 1, t, 8, INT32_MAX, false), 8);
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, b0), 2);
    h_free_seq(&h, 0);
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, b1), 1);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 0);
    h_free_seq(&h, 1);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 2);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 8, "cached blocks count as allocatable");
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, b0), 0);
    cr_assert_not_null(tdm_kv_prefix_tokens(h.pool, b0));
    h_check(&h, "cached", 0);
    cr_assert_eq(h_match(&h, 0, t, 8, INT32_MAX, false), 8, "taken back from the cached list");
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 0);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 6);
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, b1), 1);
    h_free(&h);
}

Test(kv_cache, prefix_eviction_is_lru) {
    harness h;
    h_init_prefix(&h, 8, 2, 4, 32);
    int32_t a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[16];
    seq_tokens(c, 16, 20);
    cr_assert_eq(h_reserve_tok(&h, 0, 4, a), TANDEM_OK);
    cr_assert_eq(h_reserve_tok(&h, 1, 4, b), TANDEM_OK);
    h_publish(&h, 0, 4);
    h_publish(&h, 1, 4);
    int32_t a0 = h.seq[0].blocks[0], a1 = h.seq[0].blocks[1], b0 = h.seq[1].blocks[0], b1 = h.seq[1].blocks[1];
    h_free_seq(&h, 0); /* LRU, oldest first: a1 a0 (a sequence's tail goes first) */
    h_free_seq(&h, 1); /* ... b1 b0 */
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 4);
    cr_assert_eq(h_reserve_tok(&h, 2, 8, c), TANDEM_OK, "the 4 free blocks first");
    uint64_t ev;
    tdm_kv_prefix_stats(h.pool, NULL, NULL, &ev);
    cr_assert_eq(ev, 0);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 4);
    h_check(&h, "lru", 0);
    cr_assert_eq(h_reserve_tok(&h, 2, 10, c), TANDEM_OK);
    cr_assert_eq(h.seq[2].blocks[4], a1, "the least recently released block is evicted");
    cr_assert_null(tdm_kv_prefix_tokens(h.pool, a1));
    cr_assert_not_null(tdm_kv_prefix_tokens(h.pool, a0));
    tdm_kv_prefix_stats(h.pool, NULL, NULL, &ev);
    cr_assert_eq(ev, 1);
    h_check(&h, "lru", 1);
    cr_assert_eq(h_match(&h, 3, a, 4, INT32_MAX, false), 2, "a0 still cached");
    h_free_seq(&h, 3); /* a0 is now the most recently released */
    cr_assert_eq(h_reserve_tok(&h, 2, 12, c), TANDEM_OK);
    cr_assert_eq(h.seq[2].blocks[5], b1);
    cr_assert_eq(h_match(&h, 3, b, 4, INT32_MAX, false), 2, "b0 only");
    cr_assert_eq(h.seq[3].blocks[0], b0);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 1);
    cr_assert_eq(h_reserve_tok(&h, 2, 14, c), TANDEM_OK);
    cr_assert_eq(h.seq[2].blocks[6], a0);
    cr_assert_eq(h_match(&h, 1, a, 4, INT32_MAX, false), 0);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 0);
    cr_assert_eq(h_reserve_tok(&h, 2, 15, c), TANDEM_ERR_KV_FULL, "b0 is held: nothing to evict");
    h_check(&h, "lru", 2);
    tdm_kv_prefix_stats(h.pool, NULL, NULL, &ev);
    cr_assert_eq(ev, 3);
    h_free(&h);
}

Test(kv_cache, prefix_kv_full_only_when_cached_exhausted) {
    harness h;
    h_init_prefix(&h, 4, 4, 2, 32);
    int32_t t[17];
    seq_tokens(t, 17, 0);
    h_compute_publish(&h, 0, 16, t);
    h_free_seq(&h, 0);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 4);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 4);
    seq_tokens(t, 17, 50);
    cr_assert_eq(h_reserve_tok(&h, 1, 16, t), TANDEM_OK);
    uint64_t ev;
    tdm_kv_prefix_stats(h.pool, NULL, NULL, &ev);
    cr_assert_eq(ev, 4);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 0);
    cr_assert_eq(h_reserve_tok(&h, 1, 17, t), TANDEM_ERR_KV_FULL);
    h_free(&h);
}

/* Every chain hash 0: one bucket, one hash; only tokens and parents tell blocks apart. */
Test(kv_cache, prefix_exact_under_hash_collisions) {
    harness h;
    h_init_prefix(&h, 16, 4, 4, 32);
    tdm_kv_prefix_set_hash_mask(h.pool, 0);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {1, 2, 3, 9, 5, 6, 7, 8}, c[4] = {5, 6, 7, 8};
    int32_t d[8] = {1, 2, 3, 4, 5, 6, 7, 0};
    cr_assert_eq(h_reserve_tok(&h, 0, 8, a), TANDEM_OK);
    cr_assert_eq(h_reserve_tok(&h, 1, 8, b), TANDEM_OK);
    h_publish(&h, 0, 8);
    h_publish(&h, 1, 8);
    cr_assert_eq(n_registered(&h), 4, "b's second block has a's tokens but another parent");
    cr_assert_eq(h_match(&h, 2, b, 8, INT32_MAX, false), 8);
    cr_assert(h.seq[2].blocks[0] == h.seq[1].blocks[0] && h.seq[2].blocks[1] == h.seq[1].blocks[1]);
    cr_assert_eq(h_match(&h, 3, a, 8, INT32_MAX, false), 8);
    cr_assert(h.seq[3].blocks[0] == h.seq[0].blocks[0] && h.seq[3].blocks[1] == h.seq[0].blocks[1]);
    h_check(&h, "collide", 0); /* the values read through the tables are each prefix's own */
    cr_assert_eq(h_match(&h, 2, c, 4, INT32_MAX, false), 0, "a second block's tokens do not start a prefix");
    cr_assert_eq(h_match(&h, 2, d, 8, INT32_MAX, false), 4);
    h_publish(&h, 0, 8); /* idempotent */
    cr_assert_eq(n_registered(&h), 4);
    h_free_seq(&h, 0);
    h_free_seq(&h, 3);
    h_check(&h, "collide", 1);
    cr_assert_eq(h_match(&h, 0, a, 8, INT32_MAX, false), 8, "cached blocks match in the shared bucket");
    h_free(&h);
}

Test(kv_cache, prefix_write_unregisters) {
    harness h;
    int32_t t[8], u[8];
    int32_t b1 = h_published(&h, 2, t, u, 51);
    h_truncate(&h, 0, 6); /* into the registered block: it keeps its registration... */
    cr_assert_not_null(tdm_kv_prefix_tokens(h.pool, b1));
    h_check(&h, "write", 0);
    cr_assert_eq(h_reserve_tok(&h, 0, 8, u), TANDEM_OK); /* ...until it is written */
    cr_assert_eq(h.seq[0].blocks[1], b1, "unshared: written in place");
    cr_assert_eq(h.fs.n_copies, 0);
    cr_assert_null(tdm_kv_prefix_tokens(h.pool, b1));
    h_check(&h, "write", 1);
    cr_assert_eq(h_match(&h, 1, t, 8, INT32_MAX, false), 4);
    cr_assert_eq(h_match(&h, 1, u, 8, INT32_MAX, false), 4);
    h_publish(&h, 0, 8);
    cr_assert_eq(h_match(&h, 1, u, 8, INT32_MAX, false), 8);
    cr_assert_eq(h.seq[1].blocks[1], b1);
    h_free(&h);
}

Test(kv_cache, prefix_shared_block_is_copied) {
    harness h;
    int32_t t[8], u[8];
    int32_t b1 = h_published(&h, 3, t, u, 1);
    cr_assert_eq(h_match(&h, 1, t, 8, INT32_MAX, false), 8);
    h_truncate(&h, 1, 7);
    cr_assert_eq(h_reserve_tok(&h, 1, 8, u), TANDEM_OK);
    cr_assert_eq(h.fs.n_copies, 1);
    cr_assert_neq(h.seq[1].blocks[1], b1);
    cr_assert_eq(tdm_kv_pool_refcount(h.pool, b1), 1);
    cr_assert_not_null(tdm_kv_prefix_tokens(h.pool, b1), "the original keeps its registration");
    cr_assert_null(tdm_kv_prefix_tokens(h.pool, h.seq[1].blocks[1]));
    h_check(&h, "cow", 0);
    h_publish(&h, 1, 8);
    cr_assert_eq(h_match(&h, 2, u, 8, INT32_MAX, false), 8);
    cr_assert_eq(h.seq[2].blocks[1], h.seq[1].blocks[1]);
    /* The registering sequence writing into its block while another holds it: copy too. */
    h_free_seq(&h, 2);
    h_fork(&h, 0, 2);
    h_truncate(&h, 0, 5);
    cr_assert_eq(h_reserve_tok(&h, 0, 6, u), TANDEM_OK);
    cr_assert_eq(h.fs.n_copies, 2);
    cr_assert_not_null(tdm_kv_prefix_tokens(h.pool, b1));
    h_free(&h);
}

Test(kv_cache, prefix_duplicate_stays_unregistered) {
    harness h;
    int32_t t[8], u[8];
    h_published(&h, 4, t, u, 0);
    h_compute_publish(&h, 1, 8, t); /* the same prefix, computed twice */
    h_publish(&h, 1, 8);
    cr_assert_eq(n_registered(&h), 2);
    cr_assert_null(tdm_kv_prefix_tokens(h.pool, h.seq[1].blocks[0]));
    cr_assert_eq(h_match(&h, 2, t, 8, INT32_MAX, false), 8);
    cr_assert_eq(h.seq[2].blocks[0], h.seq[0].blocks[0]);
    h_free_seq(&h, 0);
    h_free_seq(&h, 2);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 2);
    h_publish(&h, 1, 8); /* the original is cached, still registered: nothing changes */
    cr_assert_eq(n_registered(&h), 2);
    cr_assert_null(tdm_kv_prefix_tokens(h.pool, h.seq[1].blocks[0]));
    cr_assert_eq(h_reserve(&h, 3, 24), TANDEM_OK); /* 6 blocks: evicts both originals */
    cr_assert_eq(n_registered(&h), 0);
    h_publish(&h, 1, 8); /* now the duplicates take their place */
    cr_assert_eq(n_registered(&h), 2);
    cr_assert_eq(h_match(&h, 2, t, 8, INT32_MAX, false), 8, "a match allocates nothing: works with 0 free");
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 0);
    cr_assert_eq(h.seq[2].blocks[1], h.seq[1].blocks[1]);
    h_free(&h);
}

/* A registered block whose parent is unregistered (written) can no longer be
 * reached; the prefix, computed again, is registered anew. */
Test(kv_cache, prefix_child_of_lost_parent) {
    harness h;
    h_init_prefix(&h, 12, 2, 4, 32);
    int32_t a[4] = {1, 2, 3, 4}, x[2] = {1, 7};
    cr_assert_eq(h_reserve_tok(&h, 0, 4, a), TANDEM_OK);
    h_publish(&h, 0, 2); /* block 0 only: p */
    h_compute_publish(&h, 1, 4, a); /* block 0 duplicates p; block 1, c, chains from p */
    int32_t p = h.seq[0].blocks[0], c = h.seq[1].blocks[1];
    cr_assert_eq(n_registered(&h), 2);
    cr_assert_not_null(tdm_kv_prefix_tokens(h.pool, c));
    cr_assert_eq(h_match(&h, 2, a, 4, INT32_MAX, false), 4);
    cr_assert(h.seq[2].blocks[0] == p && h.seq[2].blocks[1] == c);
    h_free_seq(&h, 2);
    h_truncate(&h, 0, 1);
    cr_assert_eq(h_reserve_tok(&h, 0, 2, x), TANDEM_OK); /* p rewritten: unregistered */
    cr_assert_null(tdm_kv_prefix_tokens(h.pool, p));
    cr_assert_eq(h_match(&h, 2, a, 4, INT32_MAX, false), 0);
    h_check(&h, "lost parent", 0);
    h_publish(&h, 1, 4); /* its block 0 is registered now, c re-keyed under it */
    cr_assert_eq(h_match(&h, 2, a, 4, INT32_MAX, false), 4);
    cr_assert(h.seq[2].blocks[0] == h.seq[1].blocks[0] && h.seq[2].blocks[1] == c);
    /* p, rewritten, registers under its new tokens. */
    h_publish(&h, 0, 2);
    cr_assert_eq(n_registered(&h), 3);
    cr_assert_eq(h_match(&h, 3, x, 2, INT32_MAX, false), 2);
    cr_assert_eq(h.seq[3].blocks[0], p);
    h_free(&h);
}

Test(kv_cache, prefix_turning_off_frees_cached) {
    harness h;
    int32_t t[8], u[8];
    h_published(&h, 2, t, u, 0);
    cr_assert_eq(h_reserve_tok(&h, 1, 8, t), TANDEM_OK);
    h_free_seq(&h, 0);
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 2);
    cr_assert_not(tdm_kv_pool_set_prefix_cache(h.pool, false));
    cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 0);
    cr_assert_eq(tdm_kv_pool_n_free(h.pool), 6);
    cr_assert_eq(n_registered(&h), 0);
    h_check(&h, "off", 0);
    cr_assert_eq(h_match(&h, 0, t, 8, INT32_MAX, false), 0);
    cr_assert(tdm_kv_pool_set_prefix_cache(h.pool, true));
    cr_assert_eq(h_match(&h, 0, t, 8, INT32_MAX, false), 0, "turning off forgot everything");
    h_publish(&h, 1, 8);
    cr_assert_eq(h_match(&h, 0, t, 8, INT32_MAX, false), 8);
    h_free(&h);
}

/* The longest run of leading blocks whose whole prefix some registered block holds
 * (its last value is the prefix's fingerprint): what a match can find at most. */
static int32_t match_upper_bound(harness *h, const int32_t *toks, int32_t n, int32_t max_blocks) {
    int32_t bs = tdm_kv_pool_block_size(h->pool), nb = tdm_kv_pool_n_blocks(h->pool);
    int64_t v = 0;
    int32_t i = 0;
    for (; i < n / bs && i < max_blocks; i++) {
        for (int32_t j = 0; j < bs; j++) v = kv_value(v, toks[i * bs + j]);
        bool found = false;
        for (int32_t b = 0; b < nb && !found; b++)
            found = tdm_kv_prefix_tokens(h->pool, b) && *slot(h, b, bs - 1) == v;
        if (!found) break;
    }
    return i * bs;
}

/* Tokens for positions [from, to) of a sequence following doc, now and then off it. */
static void gen_tokens(uint64_t *st, const int32_t *doc, int32_t *out, int32_t from, int32_t to) {
    for (int32_t p = from; p < to; p++) out[p] = rnd_below(st, 8) ? doc[p] : rnd_below(st, 3);
}

#define N_DOC 3

static void random_prefix_ops(int32_t n_blocks, int32_t bs, int n_seq, int n_ops, uint64_t seed, uint64_t mask) {
    int32_t max_len = n_blocks * bs / 2 + 3;
    harness h;
    h_init_prefix(&h, n_blocks, bs, n_seq, max_len);
    if (mask != ~(uint64_t)0) tdm_kv_prefix_set_hash_mask(h.pool, mask);
    uint64_t st = seed;
    /* Token alphabet {0, 1, 2}: equal blocks under different prefixes are common.
     * Doc 1 shares doc 0's first third. */
    int32_t *doc[N_DOC], *req = malloc((size_t)max_len * sizeof *req);
    for (int d = 0; d < N_DOC; d++) {
        doc[d] = malloc((size_t)max_len * sizeof *doc[d]);
        for (int32_t p = 0; p < max_len; p++) doc[d][p] = rnd_below(&st, 3);
    }
    memcpy(doc[1], doc[0], (size_t)(max_len / 3) * sizeof *doc[1]);
    int cur[MAX_SEQ] = {0};
    int n_match = 0, n_toggle = 0;
    int64_t hit_pos = 0;
    for (int step = 0; step < n_ops; step++) {
        int s = rnd_below(&st, n_seq);
        int op = rnd_below(&st, 100);
        int32_t len = h.seq[s].len;
        const char *what;
        if (op < 36) { /* append a little, or reserve to an absolute length */
            what = "append";
            int32_t add = rnd_below(&st, 2 * bs + 2); /* not inside TDM_MIN: it evaluates twice */
            int32_t nl = op < 30 ? TDM_MIN(len + add, max_len) : rnd_below(&st, max_len + 1);
            gen_tokens(&st, doc[cur[s]], req, len, nl);
            h_reserve_tok(&h, s, nl, req);
        } else if (op < 52) {
            what = "truncate";
            int32_t cut = rnd_below(&st, bs + 2);
            h_truncate(&h, s, rnd_below(&st, 2) ? rnd_below(&st, len + 1) : TDM_MAX(0, len - cut));
        } else if (op < 62) {
            what = "fork";
            int d = rnd_below(&st, n_seq);
            if (d == s) continue;
            h_free_seq(&h, d);
            h_fork(&h, s, d);
            cur[d] = cur[s];
        } else if (op < 66) {
            what = "free";
            h_free_seq(&h, s);
        } else if (op < 82) { /* a request: match its prefix, compute the rest, maybe publish */
            what = "request";
            int d = rnd_below(&st, N_DOC);
            int32_t n = rnd_below(&st, max_len + 1);
            memcpy(req, doc[d], (size_t)n * sizeof *req);
            if (n > 0 && rnd_below(&st, 4) == 0) req[rnd_below(&st, n)] = 3;
            int32_t maxb = rnd_below(&st, 3) ? INT32_MAX : rnd_below(&st, n / bs + 2);
            int32_t upper = match_upper_bound(&h, req, n, maxb);
            int32_t m = h_match(&h, s, req, n, maxb, rnd_below(&st, 2));
            cr_assert_leq(m, upper, "step %d: matched %d positions, only %d are registered", step, m, upper);
            h_check(&h, "match", step);
            n_match++;
            hit_pos += m;
            cur[s] = d;
            h_reserve_tok(&h, s, n, req);
            h_check(&h, "compute", step); /* a block evicted and written may be published next */
            if (rnd_below(&st, 2)) h_publish(&h, s, h.seq[s].len);
        } else if (op < 98) { /* publish, then everything published must match */
            what = "publish";
            int32_t nv = rnd_below(&st, 2) ? len : rnd_below(&st, len + 1);
            h_publish(&h, s, nv);
            h_check(&h, what, step);
            int t = (s + 1 + rnd_below(&st, n_seq - 1)) % n_seq;
            int32_t m = h_match(&h, t, h.tok[s], len, INT32_MAX, false);
            cr_assert_geq(m, TDM_MIN(nv, len) / bs * bs, "step %d: published %d of %d, matched %d", step, nv, len, m);
            cr_assert_leq(m, len / bs * bs);
            cur[t] = cur[s];
        } else {
            what = "off-on";
            cr_assert_not(tdm_kv_pool_set_prefix_cache(h.pool, false));
            cr_assert_eq(tdm_kv_pool_n_cached(h.pool), 0);
            cr_assert_eq(n_registered(&h), 0);
            cr_assert(tdm_kv_pool_set_prefix_cache(h.pool, true));
            n_toggle++;
        }
        h_check(&h, what, step);
    }
    uint64_t q, hit, ev;
    tdm_kv_prefix_stats(h.pool, &q, &hit, &ev);
    cr_assert_gt(hit, 0);
    cr_assert_gt(ev, 0, "random prefix ops never evicted");
    if (bs > 1) cr_assert_gt(h.fs.n_copies, 0, "random prefix ops never copied");
    cr_log_info("kv prefix ops nb=%d bs=%d mask=%llx: %d matches hit %lld positions, %llu/%llu blocks, %llu "
                "evictions, %lld copies, %d toggles",
                n_blocks, bs, (unsigned long long)mask, n_match, (long long)hit_pos, (unsigned long long)hit,
                (unsigned long long)q, (unsigned long long)ev, (long long)h.fs.n_copies, n_toggle);
    for (int d = 0; d < N_DOC; d++) free(doc[d]);
    free(req);
    h_free(&h);
}

Test(kv_cache, prefix_random_ops_bs4) { random_prefix_ops(32, 4, 6, 4000, 11, ~(uint64_t)0); }
Test(kv_cache, prefix_random_ops_bs1) { random_prefix_ops(24, 1, 5, 3000, 12, ~(uint64_t)0); }
Test(kv_cache, prefix_random_ops_bs3_tight) { random_prefix_ops(12, 3, 4, 4000, 13, ~(uint64_t)0); }
Test(kv_cache, prefix_random_ops_colliding) { random_prefix_ops(24, 2, 5, 3000, 14, 0); }
Test(kv_cache, prefix_random_ops_few_buckets) { random_prefix_ops(32, 2, 6, 3000, 15, 3); }

Test(kv_cache, prefix_bad_arguments) {
    tdm_kv_pool *pool = NULL;
    tdm_err err = {0};
    int32_t t[8] = {0};
    tdm_kv_seq s = TDM_KV_SEQ_INIT;
    cr_assert_not(tdm_kv_pool_set_prefix_cache(NULL, true));
    cr_assert_eq(tdm_kv_prefix_match(NULL, t, 8, 2, &s), 0);
    tdm_kv_prefix_publish(NULL, &s, t, 8);
    tdm_kv_prefix_set_hash_mask(NULL, 0);
    uint64_t q = 1, hit = 1, ev = 1;
    tdm_kv_prefix_stats(NULL, &q, &hit, &ev);
    cr_assert(q == 0 && hit == 0 && ev == 0);
    cr_assert_null(tdm_kv_prefix_tokens(NULL, 0));
    cr_assert_eq(tdm_kv_pool_n_cached(NULL), 0);
    cr_assert_eq(tdm_kv_pool_check(NULL, &err), TANDEM_ERR_INTERNAL);
    cr_assert_eq(tdm_kv_pool_create(4, 4, &pool, &err), TANDEM_OK);
    cr_assert(tdm_kv_pool_set_prefix_cache(pool, true));
    cr_assert(tdm_kv_pool_set_prefix_cache(pool, true), "twice is fine");
    cr_assert_eq(tdm_kv_prefix_match(pool, NULL, 8, 2, &s), 0);
    cr_assert_eq(tdm_kv_prefix_match(pool, t, 8, 2, NULL), 0);
    cr_assert_eq(tdm_kv_prefix_match(pool, t, -1, 2, &s), 0);
    cr_assert_eq(tdm_kv_seq_reserve(pool, &s, 8, &err), TANDEM_OK);
    tdm_kv_prefix_publish(pool, &s, NULL, 8);
    tdm_kv_prefix_publish(pool, NULL, t, 8);
    tdm_kv_prefix_publish(pool, &s, t, -5);
    tdm_kv_prefix_publish(pool, &s, t, 100); /* clipped to the sequence's length */
    cr_assert_not_null(tdm_kv_prefix_tokens(pool, s.blocks[1]));
    cr_assert_null(tdm_kv_prefix_tokens(pool, -1));
    cr_assert_null(tdm_kv_prefix_tokens(pool, 4));
    cr_assert_eq(tdm_kv_pool_check(pool, &err), TANDEM_OK, "%s", err.msg);
    tdm_kv_seq_free(pool, &s);
    cr_assert_eq(tdm_kv_pool_n_cached(pool), 2);
    tdm_kv_pool_free(pool); /* with cached blocks */
}
