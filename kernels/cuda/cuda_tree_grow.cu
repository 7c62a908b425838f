/* cuda_tree_grow.cu - the tree_grow op (kernels/backend.h): one level of a greedy
 * dynamic token tree grown in device memory (kernels/dtree.h).
 *
 * Two kernels, queued: the topk kernel (cuda_rowops.cu) on the level's logits rows,
 * then one block that appends the children and picks the next expansions.  The
 * host queues every level of a tree this way and waits once, for the whole tree
 * (draft/tree_draft.c); nothing here reads host memory. */
#include "cuda_internal.h"

#define TG_THREADS 256

/* Whether new node a (weight wa) goes before new node b among the candidates for
 * expansion: higher weight, ties to the earlier (tree_draft.c's pick_expand). */
__device__ __forceinline__ bool tg_before(float wb, int32_t b, float wa, int32_t a) {
    return wb > wa || (wb == wa && b < a);
}

/* One level, in one block: the children of the level's rows appended (row by row,
 * each row's in rank order, as tdm_tree_add), then the `width` best new nodes
 * picked as the next level's expansions.  The level's state lives in shared memory
 * and each step runs across the block, so the work is a few dependent global
 * accesses deep, not one per node: a new node's mask is its parent's (the mask the
 * previous level wrote for that row) with its own slot's bit. */
__global__ void __launch_bounds__(TG_THREADS)
k_tree_grow(tdm_dtree *t, const int32_t *__restrict__ ids, const float *__restrict__ probs, int32_t n, int32_t k,
            int32_t depth, int32_t width, int32_t want_exp) {
    TDM_PDL_ENTRY();
    __shared__ int32_t s_cnt[TDM_DTREE_LEVEL], s_off[TDM_DTREE_LEVEL + 1]; /* per row: children, first of them */
    __shared__ int32_t s_par[TDM_DTREE_LEVEL];     /* per row: its node (-1: the root) */
    __shared__ float s_pw[TDM_DTREE_LEVEL];        /* per row: its node's weight */
    __shared__ uint64_t s_pmask[TDM_DTREE_LEVEL];  /* per row: its node's draft mask (0: the root) */
    __shared__ float s_w[TDM_DTREE_POOL];          /* per new node: weight */
    __shared__ int32_t s_row[TDM_DTREE_POOL];      /* per new node: its row */
    __shared__ int32_t s_tok[TDM_DTREE_POOL];      /* per new node: token */
    __shared__ int32_t s_pick[TDM_DTREE_LEVEL];
    __shared__ int32_t s_first, s_last, s_fed, s_n_pick, s_bad;
    const int32_t tid = (int32_t)threadIdx.x;
    if (tid == 0) {
        s_first = depth == 0 ? 0 : t->n;
        s_fed = depth == 0 ? 0 : t->n_fed;
        s_n_pick = 0;
        s_bad = 0;
    }
    for (int32_t r = tid; r < n; r += blockDim.x) {
        const int32_t par = depth == 0 ? -1 : t->exp[r];
        s_par[r] = par;
        s_pw[r] = par < 0 ? 1.0f : t->w[par];
        s_pmask[r] = par < 0 ? 0 : t->next_mask[r];
        int32_t c = 0;
        while (c < k && ids[(size_t)r * k + c] >= 0) c++;
        s_cnt[r] = c;
        if (c == 0) s_bad = 1; /* (a row with a NaN or an infinity) */
    }
    __syncthreads();
    if (tid == 0) {
        int32_t off = 0;
        for (int32_t r = 0; r < n; r++) s_off[r] = off, off += s_cnt[r];
        s_off[n] = off;
        s_last = min(TDM_DTREE_POOL, s_first + off);
        if (depth == 0) t->n_exp = 0, t->n_fed = 0;
        if (depth == 0 || s_bad) t->bad = s_bad;
        t->n = s_last;
    }
    __syncthreads();
    const int32_t first = s_first, last = s_last;
    /* the children */
    for (int32_t x = tid; x < last - first; x += blockDim.x) {
        int32_t r = 0;
        while (s_off[r + 1] <= x) r++;
        const int32_t i = x - s_off[r], j = first + x;
        const int32_t id = ids[(size_t)r * k + i];
        const float w = s_pw[r] * probs[(size_t)r * k + i];
        t->token[j] = id;
        t->parent[j] = s_par[r];
        t->depth[j] = depth;
        t->dslot[j] = -1;
        t->w[j] = w;
        s_w[x] = w;
        s_row[x] = r;
        s_tok[x] = id;
    }
    __syncthreads();
    if (width <= 0) return;
    /* the next expansions: the `width` best new nodes (a node's rank counted over
     * every other new node) */
    const int32_t lim = min(width, min(TDM_DTREE_LEVEL, TDM_TREE_MAX_NODES - s_fed));
    for (int32_t a = tid; a < last - first; a += blockDim.x) {
        int32_t rank = 0;
        const float wa = s_w[a];
        for (int32_t b = 0; b < last - first && rank < lim; b++) rank += b != a && tg_before(s_w[b], b, wa, a);
        if (rank < lim) s_pick[atomicAdd(&s_n_pick, 1)] = a;
    }
    __syncthreads();
    if (tid == 0) { /* creation order, so that draft slots follow the tree's own order */
        const int32_t m = s_n_pick;
        for (int32_t a = 1; a < m; a++)
            for (int32_t x = a; x > 0 && s_pick[x - 1] > s_pick[x]; x--) {
                const int32_t tmp = s_pick[x];
                s_pick[x] = s_pick[x - 1], s_pick[x - 1] = tmp;
            }
        if (m < want_exp) t->bad = 1;
        t->n_exp = m;
        t->n_fed = s_fed + m;
    }
    __syncthreads();
    const int32_t m = s_n_pick;
    for (int32_t j = tid; j < max(m, want_exp) && j < TDM_DTREE_LEVEL; j += blockDim.x) {
        const int32_t slot = s_fed + j;
        if (j >= m) { /* (a stand-in: the tree is reported bad) */
            t->exp[j] = -1;
            t->next_tok[j] = 0;
            t->next_mask[j] = (1ull << (slot & 63)) | ((1ull << depth) - 1);
            continue;
        }
        const int32_t x = s_pick[j], v = first + x;
        t->dslot[v] = slot;
        t->exp[j] = v;
        t->next_tok[j] = s_tok[x];
        t->next_mask[j] = s_pmask[s_row[x]] | (1ull << (slot & 63));
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
