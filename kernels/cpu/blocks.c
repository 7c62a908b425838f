/* blocks.c - every transformer block of a forward pass, tensor parallel over the
 * CPU backend's threads (the `blocks` op).
 *
 * Thread t of T owns a contiguous share of the heads (n_head / T query heads,
 * n_kv_head / T kv heads: whole GQA groups) and of the FFN features: n_ff / T, or,
 * where that would cut W2's quantisation blocks (W2's columns are the features: the
 * real 1.5B target's 8960 / 2 = 4480 is 17.5 Q4_K blocks), whole blocks as evenly as
 * they go (17 and 18: the larger share about 3 % above the mean).
 * With fewer kv heads than threads (a draft with one kv head), T / n_kv_head
 * threads share each kv head: each computes its K and V (a few rows of Wqkv), the
 * first writes them to the cache, and a third barrier per block lets the others
 * read them there.
 * Each thread keeps its own copy of the residual stream x[n][E].  Per block:
 *
 *   xb = rmsnorm(x)                                   every thread, whole rows
 *   q, k, v of its heads = xb W^T (the W rows of its heads) (+ bias)
 *   rope; write its kv heads to the cache; attention of its query heads
 *   P_t = att_t Wo_t^T   (Wo_t: the Wo columns of its heads; a partial sum)
 *   sync;  x += P_0 + P_1 + ... + P_{T-1}             every thread, that order
 *   xb = rmsnorm(x);  gate, up of its features;  h_t = swiglu(gate, up)
 *   P_t = h_t W2_t^T     (W2_t: the W2 columns of its features)
 *   sync;  x += P_0 + ... + P_{T-1}
 *
 * This is Megatron-LM's tensor parallelism with threads as the ranks.
 * Activations cross between cores twice per block (the partial sums), not after
 * every op; a thread reads the same part of the weights at every step, so its
 * core's caches keep that part; and there are two barriers per block instead
 * of one fork-join per op.  Every thread adds the partial sums in the same
 * order, so the copies of x stay identical.
 *
 * Numerics: the Wo and W2 products are sums of T partial sums, so results depend
 * on T (not on the batch's other rows: each row's arithmetic is its own).  With
 * one thread this op declines and the forward runs op by op.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_internal.h"

/* Largest team: the partial sums each thread reads grow with T. */
#define BLOCKS_MAX_T 64

typedef struct blocks_job {
    tdm_cpu *c;
    const tdm_blocks_args *a;
    int T;
    int32_t n;                  /* batch rows */
    int32_t qh, kh;             /* query heads, kv heads per thread (kh = 1 when replicated) */
    int32_t share;              /* threads per kv head: 1, or T / n_kv_head when the kv heads
                                   are fewer than the threads (replicated: each of them
                                   computes the kv head, the first writes the cache) */
    int32_t ql, kl, qw;         /* per thread: q width, k (= v) width, q+k+v width */
    int32_t f0[BLOCKS_MAX_T + 1]; /* thread t's FFN features: [f0[t], f0[t + 1]) */
    int32_t fl_max;             /* the most features of a thread (its buffers' size) */
    int64_t n_tot_max;          /* visible slots of the widest row */
    const int32_t *slice;       /* [n_slices][2] attention slices */
    int32_t n_slices;
    const float *cs;            /* RoPE table [pos][n_rot / 2][2] */
    float scale;                /* attention softmax scale */
    /* offsets (floats) of each thread's buffers in c->team[t].buf */
    size_t o_x, o_xb, o_qkv, o_att, o_gu, o_ff, o_part; /* o_part: [2][n][E] */
} blocks_job;

/* The first kv head of thread t. */
static inline int32_t kv_head0(const blocks_job *j, int t) { return t / j->share * j->kh; }

/* The views thread t multiplies with in block L. */
typedef struct block_views {
    tdm_weight q, k, v, o, gate, up, down;
} block_views;

static bool make_views(const blocks_job *j, const tdm_block_weights *L, int t, block_views *bv) {
    const tdm_blocks_args *a = j->a;
    const int64_t qd = (int64_t)a->n_head * a->head_dim, kvd = (int64_t)a->n_kv_head * a->head_dim;
    const int64_t k0 = (int64_t)kv_head0(j, t) * a->head_dim, fl = j->f0[t + 1] - j->f0[t];
    const bool split = tdm_qkv_split(L); /* (q, k, v kept apart: their rows from 0 each) */
    const tdm_weight *wq = split ? &L->wq : &L->wqkv, *wk = split ? &L->wk : &L->wqkv, *wv = split ? &L->wv : &L->wqkv;
    return tdm_weight_rows_view(wq, t * j->ql, j->ql, &bv->q) &&
           tdm_weight_rows_view(wk, (split ? 0 : qd) + k0, j->kl, &bv->k) &&
           tdm_weight_rows_view(wv, (split ? 0 : qd + kvd) + k0, j->kl, &bv->v) &&
           tdm_weight_cols_view(&L->wo, t * j->ql, j->ql, &bv->o) &&
           tdm_weight_rows_view(&L->w13, j->f0[t], fl, &bv->gate) &&
           tdm_weight_rows_view(&L->w13, (int64_t)a->n_ff + j->f0[t], fl, &bv->up) &&
           tdm_weight_cols_view(&L->w2, j->f0[t], fl, &bv->down);
}

/* x[n][E] += the partial sums of every thread (part p of each), in thread order. */
static void add_partials(const blocks_job *j, int p, float *x) {
    const int32_t E = j->a->n_embd;
    const size_t len = (size_t)j->n * (size_t)E;
    const float *parts[BLOCKS_MAX_T];
    for (int u = 0; u < j->T; u++) parts[u] = j->c->team[u].buf + j->o_part + (size_t)p * len;
    if (j->T == 2) { /* (the common case, as one vector loop) */
        const float *p0 = parts[0], *p1 = parts[1];
        for (size_t i = 0; i < len; i++) x[i] += p0[i] + p1[i];
        return;
    }
    for (size_t i = 0; i < len; i++) {
        float s = parts[0][i];
        for (int u = 1; u < j->T; u++) s += parts[u][i];
        x[i] += s;
    }
}

static void rmsnorm_rows(const tdm_cpu_kernels *k, const float *x, const float *g, int32_t n, int32_t E, float eps,
                         float *o) {
    for (int32_t i = 0; i < n; i++) k->rmsnorm_row(x + (int64_t)i * E, g, E, eps, o + (int64_t)i * E);
}

/* The stream entering layer l (x: a thread's whole copy) into a->feat's columns of
 * each feature whose layer is l. */
static void export_feat(const tdm_blocks_args *a, int32_t l, const float *x, int32_t n) {
    const size_t E = (size_t)a->n_embd, w = (size_t)a->n_feat * E;
    for (int32_t k = 0; k < a->n_feat; k++)
        if (a->feat_layers[k] == l)
            for (int32_t i = 0; i < n; i++) memcpy(a->feat + (size_t)i * w + (size_t)k * E, x + (size_t)i * E, E * 4);
}

static void blocks_task(void *ctx, int64_t chunk, int t) {
    (void)chunk;
    blocks_job *j = ctx;
    const tdm_blocks_args *a = j->a;
    tdm_cpu *c = j->c;
    const tdm_cpu_kernels *k = c->k;
    const int32_t n = j->n, E = a->n_embd, hd = a->head_dim, half = a->rope->n_rot / 2;
    const int32_t ql = j->ql, kl = j->kl, qw = j->qw, fl = j->f0[t + 1] - j->f0[t];
    float *buf = c->team[t].buf, *scratch = c->scratch[t].buf;
    float *x = buf + j->o_x, *xb = buf + j->o_xb, *qkv = buf + j->o_qkv, *att = buf + j->o_att;
    float *gu = buf + j->o_gu, *ff = buf + j->o_ff, *part = buf + j->o_part;
    const size_t len = (size_t)n * (size_t)E;
    const tdm_batch *bt = a->batch;

    memcpy(x, a->x, len * sizeof(float));
    for (int32_t l = 0; l < a->n_layer; l++) {
        const tdm_block_weights *L = &a->layers[l];
        block_views bv;
        make_views(j, L, t, &bv); /* (checked for every layer by tdm_cpu_blocks) */
        if (a->feat && t == 0) export_feat(a, l, x, n); /* (x is not written before the next sync) */

        /* attention */
        rmsnorm_rows(k, x, L->attn_norm, n, E, a->norm_eps, xb);
        tdm_cpu_matmul_local(c, &bv.q, xb, n, qkv, qw, scratch);
        tdm_cpu_matmul_local(c, &bv.k, xb, n, qkv + ql, qw, scratch);
        tdm_cpu_matmul_local(c, &bv.v, xb, n, qkv + ql + kl, qw, scratch);
        if (L->bqkv) {
            const int64_t qd = (int64_t)a->n_head * hd, kvd = (int64_t)a->n_kv_head * hd;
            const int64_t k0 = (int64_t)kv_head0(j, t) * hd;
            const float *bias[3] = {L->bqkv + t * ql, L->bqkv + qd + k0, L->bqkv + qd + kvd + k0};
            const int32_t at[3] = {0, ql, ql + kl}, w[3] = {ql, kl, kl};
            for (int32_t i = 0; i < n; i++)
                for (int p = 0; p < 3; p++)
                    for (int32_t e = 0; e < w[p]; e++) qkv[(int64_t)i * qw + at[p] + e] += bias[p][e];
        }
        if (L->q_norm) /* qwen3: each head's RMSNorm before RoPE */
            for (int32_t i = 0; i < n; i++) {
                float *r = qkv + (int64_t)i * qw;
                for (int32_t h = 0; h < j->qh; h++) k->rmsnorm_row(r + h * hd, L->q_norm, hd, a->norm_eps, r + h * hd);
                for (int32_t h = 0; h < j->kh; h++)
                    k->rmsnorm_row(r + ql + h * hd, L->k_norm, hd, a->norm_eps, r + ql + h * hd);
            }
        for (int32_t i = 0; i < n; i++) {
            const float *cs = j->cs + (size_t)bt->pos[i] * (size_t)half * 2;
            k->rope_row(qkv + (int64_t)i * qw, j->qh, hd, half, a->rope->neox, cs);
            k->rope_row(qkv + (int64_t)i * qw + ql, j->kh, hd, half, a->rope->neox, cs);
        }
        tdm_kv_write_args kw = {
            .batch = bt, .seqs = a->seqs, .k = qkv + ql, .v = qkv + ql + kl, .row_stride = qw,
            .k_cache = a->k_cache[l], .v_cache = a->v_cache[l], .cache_type = a->cache_type,
            .n_kv_head = a->n_kv_head, .head_dim = hd, .block_size = a->block_size,
        };
        if (t % j->share == 0) tdm_cpu_kv_write_heads(c, &kw, kv_head0(j, t), j->kh);
        if (j->share > 1) tdm_team_sync(c->pool, t); /* the kv head's writer is done */
        tdm_attn_args aa = {
            .batch = bt, .seqs = a->seqs, .q = qkv, .q_stride = qw, .out = att,
            .k_cache = a->k_cache[l], .v_cache = a->v_cache[l], .cache_type = a->cache_type,
            .n_head = a->n_kv_head * (j->qh / j->kh), /* (the heads a kv group has here) */
            .n_kv_head = a->n_kv_head, .head_dim = hd, .block_size = a->block_size, .scale = j->scale,
        };
        const tdm_attn_io io = {qkv, qw, att, ql};
        for (int32_t g = 0; g < j->kh; g++)
            for (int32_t s = 0; s < j->n_slices; s++)
                tdm_cpu_attn_run(k, &aa, &io, j->n_tot_max, j->slice + 2 * s, kv_head0(j, t) + g, g, scratch);
        tdm_cpu_matmul_local(c, &bv.o, att, n, part, E, scratch);
        tdm_team_sync(c->pool, t);
        add_partials(j, 0, x);

        /* feed-forward */
        rmsnorm_rows(k, x, L->ffn_norm, n, E, a->norm_eps, xb);
        tdm_cpu_matmul_local(c, &bv.gate, xb, n, gu, 2 * fl, scratch);
        tdm_cpu_matmul_local(c, &bv.up, xb, n, gu + fl, 2 * fl, scratch);
        for (int32_t i = 0; i < n; i++)
            k->swiglu(gu + (int64_t)i * 2 * fl, gu + (int64_t)i * 2 * fl + fl, ff + (int64_t)i * fl, fl);
        tdm_cpu_matmul_local(c, &bv.down, ff, n, part + len, E, scratch);
        tdm_team_sync(c->pool, t);
        add_partials(j, 1, x);
    }
    if (t == 0) memcpy(a->x, x, len * sizeof(float));
}

static int32_t gcd32(int32_t a, int32_t b) {
    while (b) {
        const int32_t r = a % b;
        a = b, b = r;
    }
    return a;
}

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Checks one block's weights against the shapes of a. */
static tandem_status check_block(const tdm_blocks_args *a, int32_t l, tdm_err *err) {
    const tdm_block_weights *L = &a->layers[l];
    const int64_t E = a->n_embd, F = a->n_ff, qd = (int64_t)a->n_head * a->head_dim,
                  kvd = (int64_t)a->n_kv_head * a->head_dim;
    const struct {
        const tdm_weight *w;
        const char *name;
        int64_t rows, cols;
    } ws[] = {{&L->wqkv, "wqkv", qd + 2 * kvd, E}, {&L->wo, "wo", E, qd}, {&L->w13, "w13", 2 * F, E},
              {&L->w2, "w2", E, F}, {&L->wq, "wq", qd, E}, {&L->wk, "wk", kvd, E}, {&L->wv, "wv", kvd, E}};
    if (L->exp_w13)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: layer %d: mixture-of-experts layers run op by op",
                          (int)l);
    const bool split = tdm_qkv_split(L);
    for (size_t i = 0; i < TDM_ARRAY_LEN(ws); i++) {
        if (i == 0 ? split : i >= 4 && !split) continue; /* (wqkv, or wq, wk and wv) */
        tandem_status st = tdm_cpu_check_weight(ws[i].w, "blocks", err);
        if (st) return st;
        if (ws[i].w->rows != ws[i].rows || ws[i].w->cols != ws[i].cols)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: layer %d: %s is [%lld][%lld], not [%lld][%lld]",
                              (int)l, ws[i].name, (long long)ws[i].w->rows, (long long)ws[i].w->cols,
                              (long long)ws[i].rows, (long long)ws[i].cols);
    }
    if (!L->attn_norm || !L->ffn_norm || !L->q_norm != !L->k_norm)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: layer %d: NULL norm weights", (int)l);
    if (L->attn_post_norm || L->ffn_post_norm)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: layer %d: post norms (gemma3) run op by op", (int)l);
    if (!a->k_cache[l] || !a->v_cache[l])
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: layer %d: NULL K/V cache", (int)l);
    return TANDEM_OK;
}

tandem_status tdm_cpu_blocks(tdm_backend *b, const tdm_blocks_args *a, tdm_err *err) {
    tdm_cpu *c = tdm_cpu_of(b, "blocks", err);
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    if (!a || !a->batch || !a->layers || !a->k_cache || !a->v_cache || !a->rope || !a->x)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: NULL argument");
    if (a->feat && (!a->feat_layers || a->n_feat <= 0))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: features without layers");
    const int T = c->n_threads;
    if (c->tp_mode < 0) return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: tensor parallel blocks are off");
    if (a->swa_window || a->attn_softcap != 0 || a->ffn_act != TDM_ACT_SILU || (a->rope_swa && a->rope_swa != a->rope))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "blocks: sliding windows, soft-capping, GeGLU and per-layer RoPE (gemma3) run op by op");
    if (T < 2 || T > BLOCKS_MAX_T)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: %d threads (tensor parallel from 2 to %d)", T,
                          BLOCKS_MAX_T);
    if (a->n_layer <= 0 || a->n_embd <= 0 || a->n_ff <= 0 || a->n_head <= 0 || a->n_kv_head <= 0 ||
        a->head_dim <= 0 || a->n_head % a->n_kv_head != 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: n_layer %d, n_embd %d, n_ff %d, heads %d / %d, head_dim %d",
                          (int)a->n_layer, (int)a->n_embd, (int)a->n_ff, (int)a->n_head, (int)a->n_kv_head,
                          (int)a->head_dim);
    /* whole kv heads per thread, or threads per kv head (each with whole query heads) */
    const int32_t group = a->n_head / a->n_kv_head;
    const bool split = a->n_kv_head % T == 0, shared = T % a->n_kv_head == 0 && group % (T / a->n_kv_head) == 0;
    if (!(split || shared))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: %d threads split neither %d kv heads (%d query heads)",
                          T, (int)a->n_kv_head, (int)a->n_head);
    /* the FFN features in units W2's column views can start at (its blocks' elements:
     * rows layout; any column of the element types' P64 layout) */
    int32_t unit = 1;
    for (int32_t l = 0; l < a->n_layer; l++) {
        const tdm_weight *w2 = &a->layers[l].w2;
        const int32_t u = w2->layout == TDM_LAYOUT_ROWS ? (int32_t)tdm_dtype_block_elems(w2->type) : 1;
        if (u > 0) unit = unit / gcd32(unit, u) * u;
    }
    const int32_t units = a->n_ff % unit == 0 ? a->n_ff / unit : 0;
    if (units < T)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "blocks: %d threads cannot split %d FFN features in whole blocks of %d (W2's columns)", T,
                          (int)a->n_ff, (int)unit);
    const tdm_batch *bt = a->batch;
    if (bt->n_rows < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: n_rows %d", (int)bt->n_rows);

    blocks_job j = {.c = c, .a = a, .T = T, .n = bt->n_rows};
    j.qh = a->n_head / T;
    j.share = split ? 1 : T / a->n_kv_head;
    j.kh = split ? a->n_kv_head / T : 1;
    j.ql = j.qh * a->head_dim;
    j.kl = j.kh * a->head_dim;
    j.qw = j.ql + 2 * j.kl;
    j.fl_max = 0;
    for (int t = 0; t <= T; t++) { /* even, or whole units as evenly as they go */
        j.f0[t] = (int32_t)((int64_t)t * units / T) * unit;
        if (t > 0) j.fl_max = TDM_MAX(j.fl_max, j.f0[t] - j.f0[t - 1]);
    }
    j.scale = a->attn_scale;
    tandem_status st;
    size_t mm_scratch = 0; /* floats a thread's matmuls need */
    for (int32_t l = 0; l < a->n_layer; l++) {
        if ((st = check_block(a, l, err))) return st;
        for (int t = 0; t < T; t++) {
            block_views bv;
            if (!make_views(&j, &a->layers[l], t, &bv))
                return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                                  "blocks: layer %d: the weights' layout cannot be split %d ways", (int)l, T);
            const tdm_weight *vw[] = {&bv.q, &bv.k, &bv.v, &bv.o, &bv.gate, &bv.up, &bv.down};
            for (size_t i = 0; i < TDM_ARRAY_LEN(vw); i++)
                mm_scratch = TDM_MAX(mm_scratch, tdm_cpu_matmul_local_scratch(c, vw[i], bt->n_rows));
        }
    }
    if (j.n == 0) return TANDEM_OK;

    /* the checks the ops would make */
    tdm_kv_write_args kw = {
        .batch = bt, .seqs = a->seqs, .k = a->x, .v = a->x, .row_stride = a->n_kv_head * a->head_dim,
        .k_cache = a->k_cache[0], .v_cache = a->v_cache[0], .cache_type = a->cache_type,
        .n_kv_head = a->n_kv_head, .head_dim = a->head_dim, .block_size = a->block_size,
    };
    if (!a->seqs || !bt->seq || !bt->slot || !bt->pos || !bt->n_visible)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: NULL batch or sequence arrays");
    if (!tdm_kv_type_ok(a->cache_type))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "blocks: cache type %s", tdm_dtype_name(a->cache_type));
    if (a->block_size <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "blocks: block size %d", (int)a->block_size);
    if ((st = tdm_cpu_kv_write_check_rows(&kw, err))) return st;
    tdm_attn_args aa = {
        .batch = bt, .seqs = a->seqs, .q = a->x, .q_stride = a->n_head * a->head_dim, .out = a->x,
        .k_cache = a->k_cache[0], .v_cache = a->v_cache[0], .cache_type = a->cache_type,
        .n_head = a->n_head, .n_kv_head = a->n_kv_head, .head_dim = a->head_dim, .block_size = a->block_size,
        .scale = j.scale,
    };
    j.n_tot_max = tdm_cpu_attn_check(&aa, err);
    if (j.n_tot_max < 0) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    if (!(j.cs = tdm_cpu_rope_table(c, a->rope, a->head_dim, bt->pos, j.n, err)))
        return err ? err->status : TANDEM_ERR_INVALID_ARG;

    /* buffers */
    const size_t n = (size_t)j.n, E = (size_t)a->n_embd;
    size_t off = 0;
    j.o_x = off, off += round16(n * E);
    j.o_xb = off, off += round16(n * E);
    j.o_qkv = off, off += round16(n * (size_t)j.qw);
    j.o_att = off, off += round16(n * (size_t)j.ql);
    j.o_gu = off, off += round16(n * 2 * (size_t)j.fl_max);
    j.o_ff = off, off += round16(n * (size_t)j.fl_max);
    j.o_part = off, off += round16(2 * n * E);
    if ((st = tdm_cpu_scratch_grow(c->team, T, off, err))) return st;
    if ((st = tdm_cpu_scratch_reserve(c, TDM_MAX(mm_scratch, tdm_cpu_attn_scratch(&aa, j.n_tot_max)), err)))
        return st;
    int32_t stack_sl[2 * 64];
    int32_t *sl = tdm_cpu_attn_slices(bt, TDM_ATTN_SLICE, stack_sl, 64, &j.n_slices);
    if (!sl) return tdm_seterr(err, TANDEM_ERR_NOMEM, "blocks: out of memory");
    j.slice = sl;

    bool ran = tdm_threadpool_team(c->pool, T, blocks_task, &j);
    if (sl != stack_sl) free(sl);
    c->blocks_runs += ran;
    return ran ? TANDEM_OK : tdm_seterr(err, TANDEM_ERR_INTERNAL, "blocks: no team of %d threads", T);
}
