/* moe.c - the CPU's moe_experts op (backend.h, tdm_moe_args): a mixture-of-experts
 * layer's expert products in two parallel passes instead of three threaded ops per
 * expert.
 *   1. The (row, expert) pairs sorted by expert (rows ascending within one) into
 *      groups of at most MOE_GROUP rows of one expert; each thread takes whole groups:
 *      gathers their rows, W13, SwiGLU, W2 on the calling thread
 *      (tdm_cpu_matmul_local), the outputs into the pair's place.
 *   2. Each row's weighted sum over its experts in ascending expert order.
 * The kernels' determinism contract (cpu_internal.h) makes each product's values
 * independent of the rows beside it, so a row gets the bits the op-by-op path gives
 * it (forward_moe.c), whatever the batch.  A batch of fewer groups than threads is
 * declined (TANDEM_ERR_UNSUPPORTED): there the threaded matmuls split each product
 * across the threads instead. */
#include <string.h>

#include "cpu_internal.h"

#define MOE_GROUP 16 /* rows of one expert per task: the integer-dot kernels share their
                        prepared x between 16 rows */

typedef struct moe_group {
    int32_t e, p0, m; /* expert, first pair (sorted order), rows */
} moe_group;

typedef struct moe_job {
    tdm_cpu *c;
    const tdm_moe_args *a;
    const int32_t *prow;   /* [n k] the row of each pair, sorted by expert */
    const int32_t *pos;    /* [n k] row i's slot j -> its pair */
    const moe_group *grp;
    float *y;              /* [n k][n_embd] each pair's expert output */
    size_t tile_off;       /* per-thread scratch: x rows, gate|up, h, then the matmul's tile */
} moe_job;

static void moe_group_task(void *ctx, int64_t g, int ith) {
    const moe_job *j = ctx;
    const tdm_moe_args *a = j->a;
    const moe_group *gr = &j->grp[g];
    const int64_t E = a->n_embd, F = a->n_ff;
    float *xg = j->c->scratch[ith].buf, *gu = xg + MOE_GROUP * E, *h = gu + MOE_GROUP * 2 * F;
    for (int32_t r = 0; r < gr->m; r++)
        memcpy(xg + r * E, a->x + (int64_t)j->prow[gr->p0 + r] * E, (size_t)E * sizeof(float));
    tdm_cpu_matmul_local(j->c, &a->w13[gr->e], xg, gr->m, gu, 2 * F, xg + j->tile_off);
    for (int32_t r = 0; r < gr->m; r++) j->c->k->swiglu(gu + r * 2 * F, gu + r * 2 * F + F, h + r * F, (int32_t)F);
    tdm_cpu_matmul_local(j->c, &a->w2[gr->e], h, gr->m, j->y + (int64_t)gr->p0 * E, E, xg + j->tile_off);
}

/* Rows [i * 8, i * 8 + 8): out = the weighted sum, experts ascending. */
static void moe_sum_task(void *ctx, int64_t chunk, int ith) {
    (void)ith;
    const moe_job *j = ctx;
    const tdm_moe_args *a = j->a;
    const int32_t K = a->k, E = a->n_embd;
    for (int32_t i = (int32_t)chunk * 8; i < a->n && i < (int32_t)chunk * 8 + 8; i++) {
        int32_t order[64]; /* (k <= 64: the op declines more) */
        for (int32_t s = 0; s < K; s++) { /* insertion sort of the slots by expert */
            int32_t t = s;
            while (t > 0 && a->ids[(int64_t)i * K + order[t - 1]] > a->ids[(int64_t)i * K + s]) {
                order[t] = order[t - 1];
                t--;
            }
            order[t] = s;
        }
        float *o = a->out + (int64_t)i * E;
        memset(o, 0, (size_t)E * sizeof(float));
        for (int32_t s = 0; s < K; s++) {
            const float w = a->w[(int64_t)i * K + order[s]];
            const float *y = j->y + (int64_t)j->pos[(int64_t)i * K + order[s]] * E;
            for (int32_t c = 0; c < E; c++) o[c] += w * y[c];
        }
    }
}

tandem_status tdm_cpu_moe_experts(tdm_backend *b, const tdm_moe_args *a, tdm_err *err) {
    tdm_cpu *c = tdm_cpu_of(b, "moe_experts", err);
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    if (!a || !a->x || !a->ids || !a->w || !a->w13 || !a->w2 || !a->out)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "moe_experts: NULL argument");
    const int32_t n = a->n, K = a->k, NE = a->n_expert, E = a->n_embd, F = a->n_ff;
    if (n < 0 || E <= 0 || F <= 0 || NE <= 0 || NE > 512 || K <= 0 || K > NE)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "moe_experts: n %d, n_embd %d, n_ff %d, %d of %d experts",
                          (int)n, (int)E, (int)F, (int)K, (int)NE);
    if (K > 64) /* (the sum's slot order is a small array) */
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "moe_experts: %d experts per row", (int)K);
    if (n == 0) return TANDEM_OK;
    const int64_t np = (int64_t)n * K;
    for (int64_t p = 0; p < np; p++)
        if (a->ids[p] < 0 || a->ids[p] >= NE)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "moe_experts: row %lld's expert %d of %d",
                              (long long)(p / K), (int)a->ids[p], (int)NE);
    /* the groups: pairs counted per expert, each expert's rows in groups of MOE_GROUP */
    int32_t cnt[512] = {0};
    for (int64_t p = 0; p < np; p++) cnt[a->ids[p]]++;
    int64_t n_groups = 0;
    for (int32_t e = 0; e < NE; e++) n_groups += (cnt[e] + MOE_GROUP - 1) / MOE_GROUP;
    if (n_groups < c->n_threads) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "moe_experts: %lld groups",
                                                   (long long)n_groups);
    size_t tile = 0;
    for (int32_t e = 0; e < NE; e++) {
        if (!cnt[e]) continue;
        const tdm_weight *w13 = &a->w13[e], *w2 = &a->w2[e];
        tandem_status st;
        if ((st = tdm_cpu_check_weight(w13, "moe_experts", err)) || (st = tdm_cpu_check_weight(w2, "moe_experts", err)))
            return st;
        if (w13->rows != 2 * (int64_t)F || w13->cols != E || w2->rows != E || w2->cols != F)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "moe_experts: expert %d is [%lld][%lld] + [%lld][%lld], not [%d][%d] + [%d][%d]", (int)e,
                              (long long)w13->rows, (long long)w13->cols, (long long)w2->rows, (long long)w2->cols,
                              (int)(2 * F), (int)E, (int)E, (int)F);
        tile = TDM_MAX(tile, TDM_MAX(tdm_cpu_matmul_local_scratch(c, w13, MOE_GROUP),
                                     tdm_cpu_matmul_local_scratch(c, w2, MOE_GROUP)));
    }
    /* per thread: x rows, gate|up and h of a group (16-float aligned), then the tile */
    const size_t tile_off = ((size_t)MOE_GROUP * ((size_t)E + 3 * (size_t)F) + 15) & ~(size_t)15;
    tandem_status st = tdm_cpu_scratch_reserve(c, tile_off + tile + 16, err);
    if (st) return st;
    /* the call's buffer: outputs [np][E], then prow, pos [np], the groups */
    const size_t y_bytes = (size_t)np * (size_t)E * sizeof(float), tab = (size_t)np * sizeof(int32_t);
    const size_t need = y_bytes + 2 * tab + (size_t)n_groups * sizeof(moe_group) + 64;
    if (c->moe_cap < need) {
        void *p = tdm_alloc_aligned(need + need / 4, 64);
        if (!p) return tdm_seterr(err, TANDEM_ERR_NOMEM, "moe_experts: out of memory (%zu bytes)", need);
        tdm_free_aligned(c->moe_buf);
        c->moe_buf = p;
        c->moe_cap = need + need / 4;
    }
    float *y = c->moe_buf;
    int32_t *prow = (int32_t *)((char *)c->moe_buf + y_bytes), *pos = prow + np;
    moe_group *grp = (moe_group *)(((uintptr_t)(pos + np) + 15) & ~(uintptr_t)15);
    int32_t start[512];
    for (int32_t e = 0, s = 0; e < NE; e++) {
        start[e] = s;
        s += cnt[e];
    }
    for (int32_t i = 0; i < n; i++) /* rows ascending within each expert */
        for (int32_t j = 0; j < K; j++) {
            const int32_t e = a->ids[(int64_t)i * K + j], p = start[e]++;
            prow[p] = i;
            pos[(int64_t)i * K + j] = p;
        }
    int64_t g = 0;
    for (int32_t e = 0, p = 0; e < NE; p += cnt[e], e++)
        for (int32_t r = 0; r < cnt[e]; r += MOE_GROUP) grp[g++] = (moe_group){e, p + r, TDM_MIN(MOE_GROUP, cnt[e] - r)};
    moe_job j = {.c = c, .a = a, .prow = prow, .pos = pos, .grp = grp, .y = y, .tile_off = tile_off};
    tdm_threadpool_run(c->pool, n_groups, c->n_threads, moe_group_task, &j);
    tdm_threadpool_run(c->pool, (n + 7) / 8, tdm_cpu_nth(c, (int64_t)n * K * E, 8192), moe_sum_task, &j);
    return TANDEM_OK;
}
