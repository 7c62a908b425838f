/* cuda_meta.cu - a batch's metadata for the fused kernels (cuda_fused.h): per row
 * its position, the cache slot it writes, its visible count and tree mask; rows grouped into
 * tiles (consecutive rows of one sequence) for attention; and the block tables of
 * the batch's sequences, each copied once.  Packed and checked on the host, so a
 * bad batch is reported before anything runs. */
#include <stdlib.h>
#include <string.h>

#include "cuda_fused.h"

/* The number of sequence indices the batch uses (largest + 1), or -1 (err set). */
static int32_t seq_count(const tdm_batch *bt, const tdm_kv_seq *const *seqs, tdm_err *err) {
    int32_t n_seq = 0;
    for (int32_t r = 0; r < bt->n_rows; r++) {
        const int32_t si = bt->seq[r];
        if (si < 0 || !seqs[si] || !seqs[si]->blocks) {
            tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "row %d: bad sequence %d", (int)r, (int)si);
            return -1;
        }
        n_seq = TDM_MAX(n_seq, si + 1);
    }
    return n_seq;
}

/* tab[s] = offset of sequence s's table in first-use order (-1: unused); returns
 * the entries in all, or -1 on out of memory. */
static int64_t table_offsets(const tdm_batch *bt, const tdm_kv_seq *const *seqs, int32_t n_seq, int32_t *tab) {
    for (int32_t s = 0; s < n_seq; s++) tab[s] = -1;
    int64_t n_tab = 0;
    for (int32_t r = 0; r < bt->n_rows; r++)
        if (tab[bt->seq[r]] < 0) {
            tab[bt->seq[r]] = (int32_t)n_tab;
            n_tab += seqs[bt->seq[r]]->n_blocks;
        }
    return n_tab;
}

static size_t bytes_for(int32_t n, int64_t n_tab) {
    return (size_t)n * (sizeof(tdm_cuda_row) + sizeof(tdm_cuda_tile)) + (size_t)n_tab * sizeof(int32_t);
}

tandem_status tdm_cuda_meta_size(const tdm_batch *bt, const tdm_kv_seq *const *seqs, size_t *bytes, tdm_err *err) {
    const int32_t n_seq = seq_count(bt, seqs, err);
    if (n_seq < 0) return TANDEM_ERR_INVALID_ARG;
    int64_t n_tab = 0;
    for (int32_t s = 0; s < n_seq; s++) {
        bool used = false;
        for (int32_t r = 0; r < bt->n_rows && !used; r++) used = bt->seq[r] == s;
        if (used) n_tab += seqs[s]->n_blocks;
    }
    *bytes = bytes_for(bt->n_rows, n_tab);
    return TANDEM_OK;
}

void tdm_cuda_meta_at(const void *buf, int32_t n, const tdm_cuda_row **rows, const tdm_cuda_tile **tiles,
                      const int32_t **tabs) {
    *rows = (const tdm_cuda_row *)buf;
    *tiles = (const tdm_cuda_tile *)(*rows + n);
    *tabs = (const int32_t *)(*tiles + n);
}

/* A row's tree mask (0 outside a token-tree batch). */
static uint64_t row_tree(const tdm_batch *bt, int32_t r) { return bt->tree && bt->tree_mask ? bt->tree_mask[r] : 0; }

/* Checks row r against its sequence's table: the slot it writes and the slots it
 * reads ([0, nv) and its tree slots) are backed by blocks. */
static tandem_status check_row(const tdm_batch *bt, const tdm_kv_seq *s, int32_t r, int32_t bs, tdm_err *err) {
    const int32_t slot = bt->slot[r], nv = bt->n_visible[r];
    const int64_t cap = TDM_MIN((int64_t)s->len, (int64_t)s->n_blocks * bs);
    if (slot < 0 || slot >= cap || s->blocks[slot / bs] < 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "row %d: slot %d outside the sequence (len %d, %d blocks)",
                          (int)r, (int)slot, (int)s->len, (int)s->n_blocks);
    if (nv < 0 || nv > cap || bt->pos[r] < 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "row %d: n_visible %d / position %d outside the sequence (len %d)",
                          (int)r, (int)nv, (int)bt->pos[r], (int)s->len);
    const int64_t end = (int64_t)nv + (tdm_cuda_row_slot_end(0, row_tree(bt, r)));
    if (end > cap)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "row %d: tree slot %lld outside the sequence (len %d)", (int)r,
                          (long long)end - 1, (int)s->len);
    for (int32_t b = 0; b < (int32_t)((end + bs - 1) / bs); b++)
        if (s->blocks[b] < 0)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "row %d: block %d has id %d", (int)r, (int)b, (int)s->blocks[b]);
    return TANDEM_OK;
}

tandem_status tdm_cuda_meta_fill(const tdm_batch *bt, const tdm_kv_seq *const *seqs, int32_t bs,
                                 int32_t heads_per_block, int32_t max_q, void *host, tdm_cuda_meta *m,
                                 tdm_err *err) {
    const int32_t n = bt->n_rows;
    const int32_t n_seq = seq_count(bt, seqs, err);
    if (n_seq < 0) return TANDEM_ERR_INVALID_ARG;
    int32_t *tab = (int32_t *)malloc((size_t)TDM_MAX(n_seq, 1) * sizeof(int32_t));
    if (!tab) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    const int64_t n_tab = table_offsets(bt, seqs, n_seq, tab);
    tdm_cuda_row *rows = (tdm_cuda_row *)host;
    tdm_cuda_tile *tiles = (tdm_cuda_tile *)(rows + n);
    int32_t *tabs = (int32_t *)(tiles + n);
    for (int32_t s = 0; s < n_seq; s++)
        if (tab[s] >= 0) memcpy(tabs + tab[s], seqs[s]->blocks, (size_t)seqs[s]->n_blocks * sizeof(int32_t));
    if (max_q < 1 || max_q > TDM_FLASH_QMAX) max_q = TDM_FLASH_QMAX;
    /* (a token tree's rows with a mask: a tile each, their key ranks mapped to slots
     * through their masks, cuda_fused.h; its causal rows, the pending token and the
     * spine, tile as a chain's) */
    const int32_t tile_rows = TDM_MAX(1, max_q / heads_per_block);
    int32_t n_tiles = 0, max_kv = 0, max_tile = 0;
    tandem_status st = TANDEM_OK;
    for (int32_t r = 0; r < n && !st; r++) {
        const tdm_kv_seq *s = seqs[bt->seq[r]];
        if ((st = check_row(bt, s, r, bs, err))) break;
        rows[r].pos = bt->pos[r];
        rows[r].kv_blk = s->blocks[bt->slot[r] / bs];
        rows[r].kv_off = bt->slot[r] % bs;
        rows[r].nv = bt->n_visible[r];
        rows[r].tree = row_tree(bt, r);
        const int32_t end = tdm_cuda_row_end(rows[r].nv, rows[r].tree);
        tdm_cuda_tile *t = n_tiles ? &tiles[n_tiles - 1] : NULL;
        if (!t || bt->seq[r] != bt->seq[t->row0] || t->n_rows == tile_rows || rows[r].tree || rows[t->row0].tree) {
            t = &tiles[n_tiles++];
            t->row0 = r;
            t->n_rows = 0;
            t->tab = tab[bt->seq[r]];
            t->kv_len = 0;
        }
        t->n_rows++;
        max_tile = TDM_MAX(max_tile, t->n_rows);
        t->kv_len = TDM_MAX(t->kv_len, end);
        max_kv = TDM_MAX(max_kv, end);
    }
    free(tab);
    if (st) return st;
    m->n_rows = n;
    m->n_tiles = n_tiles;
    m->n_tab = (int32_t)n_tab;
    m->tile_rows = tile_rows;
    m->max_tile_rows = max_tile;
    m->max_kv = max_kv;
    m->bytes = bytes_for(n, n_tab);
    return TANDEM_OK;
}

__global__ void k_meta_masks(tdm_cuda_row *rows, const uint64_t *masks, int32_t n) {
    TDM_PDL_ENTRY();
    const int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) rows[i].tree = masks[i];
}

tandem_status tdm_cuda_meta_masks(tdm_cuda *c, tdm_cuda_row *rows, const uint64_t *masks, int32_t n, tdm_err *err) {
    if (n <= 0) return TANDEM_OK;
    tdm_launch(k_meta_masks, (unsigned)((n + 63) / 64), 64, 0, c->stream, rows, masks, n);
    TDM_CU_LAUNCHED("meta masks");
    return TANDEM_OK;
}
