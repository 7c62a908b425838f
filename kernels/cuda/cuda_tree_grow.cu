/* cuda_tree_grow.cu - the tree_grow op (kernels/backend.h): one level of a greedy
 * dynamic token tree grown in device memory (kernels/dtree.h).
 *
 * Two kernels, queued: the topk kernel (cuda_rowops.cu) on the level's logits rows,
 * then one block that appends the children and picks the next expansions.  The
 * host queues every level of a tree this way and waits once, for the whole tree
 * (draft/tree_draft.c); nothing here reads host memory. */
#include "cuda_internal.h"

#define TG_THREADS 256

/* Whether node a goes before node b among the candidates for expansion: higher
 * weight, ties to the earlier (tree_draft.c's pick_expand). */
__device__ __forceinline__ bool tg_before(const tdm_dtree *t, int32_t a, int32_t b) {
    return t->w[a] > t->w[b] || (t->w[a] == t->w[b] && a < b);
}

__global__ void __launch_bounds__(TG_THREADS)
k_tree_grow(tdm_dtree *t, const int32_t *ids, const float *probs, int32_t n, int32_t k, int32_t depth, int32_t width,
            int32_t want_exp) {
    TDM_PDL_ENTRY();
    __shared__ int32_t s_first, s_n;
    __shared__ int32_t s_pick[TDM_DTREE_LEVEL];
    __shared__ int32_t s_n_pick;
    if (threadIdx.x == 0) {
        if (depth == 0) t->n = t->n_fed = t->n_exp = t->bad = 0;
        /* the children, row by row, each row's in rank order (tdm_tree_add) */
        s_first = t->n;
        for (int32_t r = 0; r < n; r++) {
            const int32_t par = depth == 0 ? -1 : t->exp[r];
            if (ids[(size_t)r * k] < 0) t->bad = 1; /* (a row with a NaN or an infinity) */
            const float pw = par < 0 ? 1.0f : t->w[par];
            for (int32_t i = 0; i < k; i++) {
                const int32_t id = ids[(size_t)r * k + i];
                if (id < 0 || t->n >= TDM_DTREE_POOL) break;
                const int32_t j = t->n++;
                t->token[j] = id;
                t->parent[j] = par;
                t->depth[j] = depth;
                t->dslot[j] = -1;
                t->w[j] = pw * probs[(size_t)r * k + i];
            }
        }
        s_n = t->n;
    }
    __syncthreads();
    if (width <= 0) return;
    /* the next expansions: the `width` best new nodes (one pass of the block per
     * pick; a node's rank is counted over every other new node) */
    const int32_t first = s_first, last = s_n;
    const int32_t lim = min(width, min(TDM_DTREE_LEVEL, TDM_TREE_MAX_NODES - t->n_fed));
    if (threadIdx.x == 0) s_n_pick = 0;
    __syncthreads();
    for (int32_t a = first + (int32_t)threadIdx.x; a < last; a += blockDim.x) {
        int32_t rank = 0;
        for (int32_t b = first; b < last; b++) rank += b != a && tg_before(t, b, a);
        if (rank < lim) s_pick[atomicAdd(&s_n_pick, 1)] = a;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int32_t m = s_n_pick;
        /* creation order, so that draft slots follow the tree's own order */
        for (int32_t a = 1; a < m; a++)
            for (int32_t x = a; x > 0 && s_pick[x - 1] > s_pick[x]; x--) {
                const int32_t tmp = s_pick[x];
                s_pick[x] = s_pick[x - 1], s_pick[x - 1] = tmp;
            }
        if (m < want_exp) t->bad = 1;
        for (int32_t j = 0; j < max(m, want_exp) && j < TDM_DTREE_LEVEL; j++) {
            const int32_t slot = t->n_fed + j;
            if (j >= m) { /* (a stand-in: the tree is reported bad) */
                t->exp[j] = -1;
                t->next_tok[j] = 0;
                t->next_mask[j] = (1ull << (slot & 63)) | ((1ull << depth) - 1);
                continue;
            }
            const int32_t v = s_pick[j];
            t->dslot[v] = slot;
            t->exp[j] = v;
            t->next_tok[j] = t->token[v];
            uint64_t mask = 0;
            for (int32_t a = v; a >= 0; a = t->parent[a]) mask |= 1ull << (t->dslot[a] & 63);
            t->next_mask[j] = mask;
        }
        t->n_exp = m;
        t->n_fed += m;
    }
}

tandem_status tdm_cuda_tree_grow(tdm_backend *b, tdm_dtree *t, const float *x, int32_t n, int32_t dim, int32_t k,
                                 int32_t depth, int32_t width, int32_t want_exp, tdm_err *err) {
    tdm_cuda *c = tdm_cuda_of(b, "tree_grow", err);
    if (!c) return TANDEM_ERR_INVALID_ARG;
    if (!t || !x || n <= 0 || n > TDM_DTREE_LEVEL || dim <= 0 || k <= 0 || k > 16 || depth < 0 || depth >= 63 ||
        width > TDM_DTREE_LEVEL || want_exp > TDM_DTREE_LEVEL || (depth == 0 && n != 1))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tree_grow: %d rows of %d, k %d, depth %d, width %d", (int)n,
                          (int)dim, (int)k, (int)depth, (int)width);
    const size_t each = (size_t)n * (size_t)k * sizeof(int32_t);
    uint8_t *dev = (uint8_t *)tdm_cuda_buf_get(c, &c->tree_buf, 2 * (size_t)TDM_DTREE_LEVEL * 16 * sizeof(int32_t),
                                               "tree_grow", err);
    if (!dev) return err ? err->status : TANDEM_ERR_BACKEND;
    tandem_status st = tdm_cuda_topk_dev(c, x, n, dim, k, (int32_t *)dev, (float *)(dev + each), err);
    if (st) return st;
    tdm_launch(k_tree_grow, 1, TG_THREADS, 0, c->stream, t, (const int32_t *)dev, (const float *)(dev + each), n, k,
               depth, width, want_exp);
    TDM_CU_LAUNCHED("tree_grow");
    return TANDEM_OK;
}
