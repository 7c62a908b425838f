/* tree_testutil.c - random token trees and dense tree attention (tree_testutil.h). */
#include "tree_testutil.h"

#include <math.h>
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend_testutil.h"
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

void tdm_test_tree_fix_init(tdm_tree_fix *f, const tdm_tree_case *tc, uint64_t *rng) {
    memset(f, 0, sizeof *f);
    int32_t lens[3];
    for (int s = 0; s < tc->n_seq; s++) lens[s] = tc->prefix[s] + tc->nodes[s];
    const int32_t nb = tdm_test_shuffled_seqs(rng, tc->n_seq, lens, tc->block_size, 2, f->seqs, f->sp);
    f->cache_bytes = (size_t)nb * tc->n_kv_head * (size_t)tdm_kv_unit_bytes(tc->cache_type, tc->block_size, tc->head_dim);
    f->kc = calloc(1, f->cache_bytes), f->vc = calloc(1, f->cache_bytes);
    const int32_t kvd = tc->n_kv_head * tc->head_dim;
    for (int s = 0; s < tc->n_seq; s++) {
        tdm_batch w;
        cr_assert_eq(tdm_batch_init(&w, lens[s], NULL), TANDEM_OK);
        for (int32_t i = 0; i < lens[s]; i++) tdm_batch_add(&w, 0, i, s, i, false);
        float *k = tdm_test_rand_vec(rng, (size_t)lens[s] * kvd, -1, 1), *v = tdm_test_rand_vec(rng, (size_t)lens[s] * kvd, -1, 1);
        tdm_kv_write_args a = {&w, f->sp, k, v, kvd, f->kc, f->vc, tc->cache_type, tc->n_kv_head, tc->head_dim,
                               tc->block_size};
        ref_kv_write(&a);
        free(k), free(v);
        tdm_batch_free(&w);
    }
    cr_assert_eq(tdm_batch_init(&f->bt, 3 * (TDM_TREE_MAX_NODES + 1), NULL), TANDEM_OK);
    for (int s = 0; s < tc->n_seq; s++) {
        const int32_t P = tc->prefix[s], N = tc->nodes[s];
        int32_t parent[TDM_TREE_MAX_NODES], depth[TDM_TREE_MAX_NODES];
        uint64_t mask[TDM_TREE_MAX_NODES];
        tdm_test_random_tree(rng, N, parent, depth, mask);
        if (P > 0) tdm_batch_add(&f->bt, 0, P - 1, s, P - 1, true);
        for (int32_t i = 0; i < N; i++)
            cr_assert_geq(tdm_batch_add_tree(&f->bt, 0, P + depth[i], s, P + i, P, mask[i], true), 0);
    }
    f->q_stride = tc->n_head * tc->head_dim + 5;
    f->q = tdm_test_rand_vec(rng, (size_t)f->bt.n_rows * f->q_stride, -1.5f, 1.5f);
}

void tdm_test_tree_fix_free(tdm_tree_fix *f, int n_seq) {
    for (int s = 0; s < n_seq; s++) free(f->seqs[s].blocks);
    free(f->kc), free(f->vc), free(f->q);
    tdm_batch_free(&f->bt);
}

tdm_attn_args tdm_test_tree_fix_args(const tdm_tree_fix *f, const tdm_tree_case *tc, float *out) {
    return (tdm_attn_args){&f->bt, f->sp, f->q, f->q_stride, out, f->kc, f->vc, tc->cache_type, tc->n_head,
                           tc->n_kv_head, tc->head_dim, tc->block_size, 1.0f / sqrtf((float)tc->head_dim), 0, 0};
}

void tdm_test_kv_copy_slot(const void *ks, const void *vs, const tdm_kv_seq *s, int32_t src, void *kd, void *vd,
                           const tdm_kv_seq *d, int32_t dst, uint32_t type, int32_t n_kv_head, int32_t head_dim,
                           int32_t block_size) {
    const int32_t bs = block_size, hd = head_dim, esz = tdm_kv_elem_bytes(type);
    const int64_t unit = tdm_kv_unit_bytes(type, bs, hd);
    const int32_t ps = src % bs, pd = dst % bs;
    for (int32_t g = 0; g < n_kv_head; g++) {
        const uint8_t *ku = (const uint8_t *)ks + ((int64_t)s->blocks[src / bs] * n_kv_head + g) * unit;
        const uint8_t *vu = (const uint8_t *)vs + ((int64_t)s->blocks[src / bs] * n_kv_head + g) * unit;
        uint8_t *kw = (uint8_t *)kd + ((int64_t)d->blocks[dst / bs] * n_kv_head + g) * unit;
        uint8_t *vw = (uint8_t *)vd + ((int64_t)d->blocks[dst / bs] * n_kv_head + g) * unit;
        for (int32_t x = 0; x < hd; x++) /* K: [hd][bs] */
            memcpy(kw + ((int64_t)x * bs + pd) * esz, ku + ((int64_t)x * bs + ps) * esz, (size_t)esz);
        memcpy(vw + (int64_t)pd * hd * esz, vu + (int64_t)ps * hd * esz, (size_t)hd * esz); /* V: [bs][hd] */
        if (tdm_kv_scaled(type)) { /* (q8_0, fp8: the slot's scales) */
            const int64_t so = tdm_kv_scale_off(bs, hd);
            memcpy(kw + so + 4 * pd, ku + so + 4 * ps, 4);
            memcpy(vw + so + 4 * pd, vu + so + 4 * ps, 4);
        }
    }
}
