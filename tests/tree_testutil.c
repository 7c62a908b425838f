/* tree_testutil.c - random token trees and dense tree attention (tree_testutil.h). */
#include "tree_testutil.h"

#include <math.h>
#include <stdlib.h>

#include "ref_ops.h"
#include "testutil.h"

void tdm_test_random_tree(uint64_t *rng, int32_t n, int32_t *parent, int32_t *depth, uint64_t *mask) {
    for (int32_t i = 0; i < n; i++) {
        /* mostly recent parents, so that trees get deep as well as wide */
        int32_t p = (int32_t)(tdm_test_rand(rng) % (uint64_t)(i + 1)) - 1;
        if (i > 0 && tdm_test_rand(rng) % 2) p = i - 1 - (int32_t)(tdm_test_rand(rng) % (uint64_t)TDM_MIN(i, 3));
        parent[i] = p;
        depth[i] = p < 0 ? 0 : depth[p] + 1;
        mask[i] = (p < 0 ? 0 : mask[p]) | (1ull << i);
    }
}

static bool visible(const tdm_batch *bt, int32_t r, int32_t j) {
    const int32_t nv = bt->n_visible[r];
    if (j < nv) return true;
    if (bt->tree_mask && j - nv < 64 && (bt->tree_mask[r] >> (j - nv) & 1)) return true;
    if (bt->extra_off)
        for (int32_t e = bt->extra_off[r]; e < bt->extra_off[r + 1]; e++)
            if (bt->extra_slot[e] == j) return true;
    return false;
}

void ref_tree_attention(const tdm_attn_args *a) {
    const tdm_batch *bt = a->batch;
    const int32_t hd = a->head_dim, group = a->n_head / a->n_kv_head;
    for (int32_t r = 0; r < bt->n_rows; r++) {
        const tdm_kv_seq *s = a->seqs[bt->seq[r]];
        const int32_t len = s->len;
        double *sc = malloc((size_t)len * sizeof(double));
        for (int32_t h = 0; h < a->n_head; h++) {
            const int32_t g = h / group;
            const float *q = a->q + (size_t)r * a->q_stride + (size_t)h * hd;
            double mx = -INFINITY;
            for (int32_t j = 0; j < len; j++) {
                sc[j] = -INFINITY;
                if (!visible(bt, r, j)) continue;
                double d = 0;
                for (int32_t x = 0; x < hd; x++)
                    d += (double)q[x] * ref_kv_get(a->k_cache, a->cache_type, true, s, j, g, x, a->n_kv_head,
                                                   a->block_size, hd);
                sc[j] = d * a->scale;
                mx = fmax(mx, sc[j]);
            }
            double sum = 0;
            for (int32_t j = 0; j < len; j++) sum += sc[j] == -INFINITY ? 0 : exp(sc[j] - mx);
            float *out = a->out + ((size_t)r * a->n_head + h) * hd;
            for (int32_t x = 0; x < hd; x++) {
                double acc = 0;
                for (int32_t j = 0; j < len; j++)
                    if (sc[j] != -INFINITY)
                        acc += exp(sc[j] - mx) *
                               ref_kv_get(a->v_cache, a->cache_type, false, s, j, g, x, a->n_kv_head, a->block_size, hd);
                out[x] = sum > 0 ? (float)(acc / sum) : 0.0f;
            }
        }
        free(sc);
    }
}
