/* matmul.c - matmul dispatch (threads, tiles) and the portable scalar kernels.
 *
 * y[n][rows] = x[n][cols] * W^T.  Work is split into chunks of W rows (output
 * columns) that threads claim dynamically; every output element is computed by one
 * chunk with the same code whatever thread runs it, so results do not depend on the
 * thread count.
 *
 *   n <= TDM_MM_DIRECT_MAX and a weight type the level's gemv handles: the direct
 *   kernel converts W on the fly (decode and short verification batches: memory
 *   bound).
 *   otherwise: each chunk of W rows is converted once to an f32 tile in the thread's
 *   scratch, then all n input rows are multiplied against it (each W byte is read
 *   once per call).
 *   Q4_1, Q5_0, Q5_1 and the K-quants, any n: x quantised to int8 once per call,
 *   then the level's integer-dot kernel (qdot.h) over ranges of W rows; for n <=
 *   TDM_QGEMV_MAX the kernel that reads the file's blocks directly where the CPU has
 *   one (k_qgemv: Q4_K, Q6_K, Q5_0 with AVX-512 VNNI; the same bits).
 */
#include <math.h>
#include <string.h>

#include "cpu_internal.h"


/* ---- scalar kernels ------------------------------------------------------------ */

/* Lanes of the emulated vector accumulator (plain lane-wise arithmetic, which the
 * compiler may vectorise without changing results). */
#define SC_L 8

static float sc_reduce(const float a[SC_L]) {
    float s4[4], s2[2];
    for (int l = 0; l < 4; l++) s4[l] = a[l] + a[l + 4];
    for (int l = 0; l < 2; l++) s2[l] = s4[l] + s4[l + 2];
    return s2[0] + s2[1];
}

/* f16 -> f32, bit-exact with tdm_f16_to_f32 (subnormals, inf, NaN payloads), written
 * without branches so loops over it vectorise. */
static inline float sc_h2f(uint16_t h) {
    uint32_t o = (uint32_t)(h & 0x7fff) << 13, e = o & 0x0f800000u;
    o += (uint32_t)(127 - 15) << 23;
    o += e == 0x0f800000u ? (uint32_t)(128 - 16) << 23 : 0; /* inf / NaN */
    float f, sub;
    uint32_t o_sub = o + (1u << 23), magic = (uint32_t)113 << 23;
    memcpy(&f, &o_sub, 4);
    memcpy(&sub, &magic, 4);
    f -= sub; /* renormalised subnormal */
    uint32_t fs;
    memcpy(&fs, &f, 4);
    o = e == 0 ? fs : o;
    o |= (uint32_t)(h & 0x8000) << 16;
    memcpy(&f, &o, 4);
    return f;
}

static void sc_h2f_row(const uint8_t *src, float *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = sc_h2f(h);
    }
}

static float sc_dot(const float *x, const float *w, int64_t n) {
    float acc[SC_L] = {0};
    int64_t k = 0;
    for (; k + SC_L <= n; k += SC_L)
        for (int l = 0; l < SC_L; l++) acc[l] += x[k + l] * w[k + l];
    for (int l = 0; k + l < n; l++) acc[l] += x[k + l] * w[k + l];
    return sc_reduce(acc);
}

static void sc_convert_rows(const tdm_weight *w, int64_t r0, int64_t nr, float *dst, int64_t ld) {
    const uint8_t *base = (const uint8_t *)w->data;
    for (int64_t i = 0; i < nr; i++) {
        const uint8_t *src = base + (size_t)(r0 + i) * w->row_bytes;
        if (w->type == TDM_F16) sc_h2f_row(src, dst + i * ld, w->cols);
        else tdm_row_to_f32(w->type, src, dst + i * ld, w->cols);
    }
}

static void sc_gemm(const float *x, int64_t ldx, int32_t n, const float *wt, int64_t ldw,
                    int64_t nr, int64_t cols, float *y, int64_t ldy, bool acc) {
    for (int32_t i = 0; i < n; i++) {
        const float *xi = x + i * ldx;
        float *yi = y + i * ldy;
        for (int64_t j = 0; j < nr; j++) {
            float d = sc_dot(xi, wt + j * ldw, cols);
            yi[j] = acc ? yi[j] + d : d;
        }
    }
}

static bool sc_gemv(const tdm_weight *w, const float *x, int32_t n, int64_t r0, int64_t r1,
                    float *y, int64_t ldy, bool acc) {
    if (w->type != TDM_F32) return false; /* others go through the tile path */
    const uint8_t *base = (const uint8_t *)w->data;
    for (int64_t r = r0; r < r1; r++) {
        const float *wr = (const float *)(const void *)(base + (size_t)r * w->row_bytes);
        for (int32_t i = 0; i < n; i++) {
            float d = sc_dot(x + i * w->cols, wr, w->cols);
            y[i * ldy + r] = acc ? y[i * ldy + r] + d : d;
        }
    }
    return true;
}

/* Element e of a K/V cache array of type f32, f16, q8_0 (the int8 quant) or fp8
 * (the E4M3 code's value). */
static inline float sc_kv_get(uint32_t type, const void *p, size_t e) {
    if (type == TDM_F16) return sc_h2f(((const uint16_t *)p)[e]);
    if (type == TDM_Q8_0) return (float)((const int8_t *)p)[e];
    if (type == TDM_F8_E4M3) return tdm_e4m3_to_f32(((const uint8_t *)p)[e]);
    return ((const float *)p)[e];
}

/* Scores one multiply and one add per d, in increasing d (the contract's order). */
static void sc_attn_qk(const float *qv, int64_t ldq, int32_t nq, const void *const *kt, uint32_t type,
                       int32_t bs, int32_t cnt, int32_t hd, float scale, float *s, int64_t lds) {
    for (int32_t j = 0; j < cnt; j++) {
        const void *blk = kt[j / bs];
        int32_t p = j % bs;
        for (int32_t q = 0; q < nq; q++) {
            float acc = 0.0f;
            for (int32_t d = 0; d < hd; d++) acc += qv[q * ldq + d] * sc_kv_get(type, blk, (size_t)d * bs + p);
            s[q * lds + j] = acc * scale;
        }
    }
}

static void sc_attn_pv(float *acc, const float *p, int64_t ldp, int32_t nh, const void *v,
                       uint32_t type, int32_t cnt, int32_t hd) {
    for (int32_t i = 0; i < cnt; i++)
        for (int32_t h = 0; h < nh; h++) {
            float *y = acc + h * hd, a = p[h * ldp + i];
            for (int32_t k = 0; k < hd; k++) y[k] += a * sc_kv_get(type, v, (size_t)i * hd + k);
        }
}

static float sc_softmax_num(float *x, int32_t n) {
    float m = x[0], acc[SC_L] = {0};
    for (int32_t i = 1; i < n; i++) m = x[i] > m ? x[i] : m;
    for (int32_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - m);
        acc[i % SC_L] += x[i];
    }
    return sc_reduce(acc);
}

static void sc_swiglu(const float *g, const float *u, float *o, int32_t n) {
    for (int32_t i = 0; i < n; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static void sc_to_f16(const float *src, uint16_t *dst, int32_t n) {
    for (int32_t i = 0; i < n; i++) dst[i] = tdm_f32_to_f16(src[i]);
}

void tdm_cpu_rmsnorm_row_scalar(const float *x, const float *g, int32_t dim, float eps, float *o) {
    double l[8] = {0};
    for (int32_t k = 0; k < dim; k++) l[k % 8] += (double)x[k] * x[k];
    double ss = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    float inv = (float)(1.0 / sqrt(ss / dim + (double)eps));
    for (int32_t k = 0; k < dim; k++) o[k] = x[k] * inv * g[k];
}

void tdm_cpu_rope_row_scalar(float *v, int32_t n_head, int32_t head_dim, int32_t half, bool neox, const float *cs) {
    for (int32_t h = 0; h < n_head; h++, v += head_dim)
        for (int32_t t = 0; t < half; t++) {
            int32_t a = neox ? t : 2 * t, b = neox ? t + half : 2 * t + 1;
            float x0 = v[a], x1 = v[b], c = cs[2 * t], s = cs[2 * t + 1];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
}

const tdm_cpu_kernels tdm_cpu_kernels_scalar = {
    .name = "scalar",
    .convert_rows = sc_convert_rows,
    .gemm = sc_gemm,
    .gemv = sc_gemv,
    .gemv_types = 1u << TDM_F32,
    .qdot = tdm_qdot_ref,
    .attn_qk = sc_attn_qk,
    .attn_pv = sc_attn_pv,
    .softmax_num = sc_softmax_num,
    .rmsnorm_row = tdm_cpu_rmsnorm_row_scalar,
    .rope_row = tdm_cpu_rope_row_scalar,
    .swiglu = sc_swiglu,
    .to_f16 = sc_to_f16,
};

/* ---- validation ---------------------------------------------------------------- */

tandem_status tdm_cpu_check_weight(const tdm_weight *w, const char *op, tdm_err *err) {
    if (!w) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: NULL weight", op);
    if (!tdm_dtype_supported(w->type) && w->type != TDM_F8_E4M3)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s: unsupported weight type %u", op,
                          (unsigned)w->type);
    if (w->type == TDM_F8_E4M3 && (!w->scale || w->layout != TDM_LAYOUT_ROWS))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: an fp8_e4m3 weight needs its row scales and the rows layout",
                          op);
    if (w->rows < 0 || w->cols <= 0 || w->cols > INT32_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: bad weight shape [%lld][%lld]", op,
                          (long long)w->rows, (long long)w->cols);
    uint64_t rb;
    if (!tdm_dtype_row_bytes(w->type, (uint64_t)w->cols, &rb))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "%s: %s weight with %lld columns (not a multiple of %u)", op,
                          tdm_dtype_name(w->type), (long long)w->cols,
                          (unsigned)tdm_dtype_block_elems(w->type));
    if (w->row_bytes < rb)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: row_bytes %zu < %llu for %s x %lld", op,
                          w->row_bytes, (unsigned long long)rb, tdm_dtype_name(w->type),
                          (long long)w->cols);
    if (!w->data && w->rows > 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: NULL weight data", op);
    if (w->layout != TDM_LAYOUT_ROWS && !tdm_layout_fits(w->layout, w->type, w->rows, w->cols))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s: layout %u does not fit a %s weight [%lld][%lld]",
                          op, (unsigned)w->layout, tdm_dtype_name(w->type), (long long)w->rows,
                          (long long)w->cols);
    return TANDEM_OK;
}

/* ---- dispatch ------------------------------------------------------------------ */

typedef struct mm_job {
    tdm_cpu *c;
    const tdm_weight *w;
    const float *x;
    int32_t n;
    float *y;
    bool acc;
    int64_t chunk;   /* W rows per chunk (a multiple of TDM_MM_RB) */
    int64_t ld;      /* floats per tile row */
    tdm_xq xq;       /* the integer-dot path: x quantised (its chunks: W rows, or x rows to quantise) */
    bool direct;     /* the integer-dot path through c->k_qgemv (a few x rows) */
} mm_job;

/* W rows per tile of about 32 KiB of f32 (L1 resident): a multiple of TDM_MM_RB,
 * at most 64; *ld = floats per tile row. */
static int64_t mm_tile_rows(int64_t cols, int64_t *ld) {
    *ld = (cols + 15) & ~(int64_t)15;
    int64_t chunk = (32768 / 4) / *ld;
    chunk = chunk / TDM_MM_RB * TDM_MM_RB;
    if (chunk < TDM_MM_RB) chunk = TDM_MM_RB;
    return chunk > 64 ? 64 : chunk;
}

/* W rows [r0, r0 + nr) converted into tile ([nr rounded up to TDM_MM_RB][ld], the
 * padding zeroed), then every input row multiplied against them. */
static void mm_tile_rows_run(const tdm_cpu_kernels *k, const tdm_weight *w, int64_t r0, int64_t nr, float *tile,
                             int64_t ld, const float *x, int32_t n, float *y, int64_t ldy, bool acc) {
    int64_t padded = (nr + TDM_MM_RB - 1) / TDM_MM_RB * TDM_MM_RB;
    k->convert_rows(w, r0, nr, tile, ld);
    if (w->type == TDM_F8_E4M3) /* (the rows' scales: tdm_weight.scale) */
        for (int64_t i = 0; i < nr; i++)
            for (int64_t c = 0; c < w->cols; c++) tile[i * ld + c] *= w->scale[r0 + i];
    if (padded > nr) memset(tile + nr * ld, 0, (size_t)((padded - nr) * ld) * sizeof(float));
    k->gemm(x, w->cols, n, tile, ld, nr, w->cols, y + r0, ldy, acc);
}

static bool mm_direct(const tdm_cpu *c, const tdm_weight *w, int32_t n) {
    return n <= TDM_MM_DIRECT_MAX && w->type < 32 && (c->k->gemv_types >> w->type & 1u);
}

size_t tdm_cpu_matmul_local_scratch(const tdm_cpu *c, const tdm_weight *w, int32_t n) {
    if (tdm_qdot_type(w->type)) return (tdm_xq_bytes(w->type, w->cols, n) + 64) / sizeof(float) + 1;
    if (w->layout != TDM_LAYOUT_ROWS || mm_direct(c, w, n)) return 0;
    int64_t ld, chunk = mm_tile_rows(w->cols, &ld);
    return (size_t)(chunk * ld);
}

void tdm_cpu_matmul_local(const tdm_cpu *c, const tdm_weight *w, const float *x, int32_t n, float *y,
                          int64_t ldy, float *tile) {
    const tdm_cpu_kernels *k = c->k;
    if (tdm_qdot_type(w->type)) {
        void *buf = (void *)(((uintptr_t)tile + 63) & ~(uintptr_t)63);
        tdm_xq xq;
        tdm_xq_quantize(w->type, x, n, w->cols, 0, n, buf, &xq);
        if (c->k_qgemv && n <= TDM_QGEMV_MAX && c->k_qgemv(w, &xq, n, 0, w->rows, y, ldy, false)) return;
        k->qdot(w, &xq, n, 0, w->rows, y, ldy, false);
        return;
    }
    if (w->layout == TDM_LAYOUT_P64) {
        k->gemv_p64(w, x, n, 0, w->rows / TDM_LAYOUT_P64_ROWS, y, ldy, false);
        return;
    }
    if (mm_direct(c, w, n)) {
        k->gemv(w, x, n, 0, w->rows, y, ldy, false);
        return;
    }
    int64_t ld, chunk = mm_tile_rows(w->cols, &ld);
    for (int64_t r0 = 0; r0 < w->rows; r0 += chunk)
        mm_tile_rows_run(k, w, r0, TDM_MIN(chunk, w->rows - r0), tile, ld, x, n, y, ldy, false);
}

/* Small n: the direct kernel over a range of W rows. */
static void mm_gemv_task(void *ctx, int64_t chunk, int ith) {
    (void)ith;
    mm_job *j = ctx;
    int64_t r0 = chunk * j->chunk, r1 = TDM_MIN(r0 + j->chunk, j->w->rows);
    j->c->k->gemv(j->w, j->x, j->n, r0, r1, j->y, j->w->rows, j->acc);
}

/* P64 layout: a range of 64-row blocks (j->chunk blocks per chunk). */
static void mm_p64_task(void *ctx, int64_t chunk, int ith) {
    (void)ith;
    mm_job *j = ctx;
    int64_t b0 = chunk * j->chunk, b1 = TDM_MIN(b0 + j->chunk, j->w->rows / TDM_LAYOUT_P64_ROWS);
    j->c->k->gemv_p64(j->w, j->x, j->n, b0, b1, j->y, j->w->rows, j->acc);
}

/* Tile path: convert a chunk of W rows, multiply every input row against it. */
static void mm_tile_task(void *ctx, int64_t chunk, int ith) {
    mm_job *j = ctx;
    int64_t rows = j->w->rows, r0 = chunk * j->chunk;
    mm_tile_rows_run(j->c->k, j->w, r0, TDM_MIN(j->chunk, rows - r0), j->c->scratch[ith].buf, j->ld, j->x, j->n,
                     j->y, rows, j->acc);
}

/* ---- the integer-dot path (qdot.h) ------------------------------------------------ */

static void qdot_quant_task(void *ctx, int64_t chunk, int ith) {
    (void)ith;
    mm_job *j = ctx;
    int32_t i0 = (int32_t)(chunk * j->chunk), i1 = (int32_t)TDM_MIN(i0 + j->chunk, j->n);
    tdm_xq unused;
    tdm_xq_quantize(j->w->type, j->x, j->n, j->w->cols, i0, i1, j->c->xq_buf, &unused);
}

static void qdot_task(void *ctx, int64_t chunk, int ith) {
    (void)ith;
    mm_job *j = ctx;
    int64_t r0 = chunk * j->chunk, r1 = TDM_MIN(r0 + j->chunk, j->w->rows);
    if (j->direct && j->c->k_qgemv(j->w, &j->xq, j->n, r0, r1, j->y, j->w->rows, j->acc)) return;
    j->c->k->qdot(j->w, &j->xq, j->n, r0, r1, j->y, j->w->rows, j->acc);
}

static tandem_status mm_qdot(tdm_cpu *c, const tdm_weight *w, const float *x, int32_t n, float *y, bool acc,
                             tdm_err *err) {
    size_t bytes = tdm_xq_bytes(w->type, w->cols, n);
    if (c->xq_cap < bytes) {
        void *p = tdm_alloc_aligned(bytes, 64);
        if (!p) return tdm_seterr(err, TANDEM_ERR_NOMEM, "matmul: out of memory (%zu bytes for quantised x)", bytes);
        tdm_free_aligned(c->xq_buf);
        c->xq_buf = p;
        c->xq_cap = bytes;
    }
    mm_job j = {.c = c, .w = w, .x = x, .n = n, .y = y, .acc = acc};
    const int64_t rows = w->rows, flops = rows * w->cols * (int64_t)n;
    /* x rows quantised in chunks of 16 across the threads when there are many */
    j.chunk = 16;
    int64_t n_q = (n + j.chunk - 1) / j.chunk;
    tdm_threadpool_run(c->pool, n_q, tdm_cpu_nth(c, (int64_t)n * w->cols, 1 << 16), qdot_quant_task, &j);
    tdm_xq_quantize(w->type, x, n, w->cols, 0, 0, c->xq_buf, &j.xq); /* the descriptor only */
    int nth;
    if (n <= TDM_MM_DIRECT_MAX) { /* one contiguous range per thread (see the direct path) */
        j.direct = c->k_qgemv != NULL && n <= TDM_QGEMV_MAX;
        nth = tdm_cpu_nth(c, flops, 16384);
        if (nth > rows / 32) nth = rows >= 64 ? (int)(rows / 32) : 1;
        j.chunk = (rows + nth - 1) / nth;
        j.chunk = (j.chunk + 3) / 4 * 4;
    } else { /* W chunks of 64 rows, which stay in the caches while every x row passes */
        j.chunk = 64;
        nth = tdm_cpu_nth(c, TDM_MIN(flops, ((rows + 63) / 64) * 65536), 65536);
    }
    tdm_threadpool_run(c->pool, (rows + j.chunk - 1) / j.chunk, nth, qdot_task, &j);
    return TANDEM_OK;
}

tandem_status tdm_cpu_matmul(tdm_backend *b, const tdm_weight *w, const float *x, int32_t n,
                             float *y, bool accumulate, tdm_err *err) {
    tdm_cpu *c = tdm_cpu_of(b, "matmul", err);
    if (!c) return err ? err->status : TANDEM_ERR_INVALID_ARG;
    return tdm_cpu_matmul_on(c, w, x, n, y, accumulate, err);
}

tandem_status tdm_cpu_matmul_on(tdm_cpu *c, const tdm_weight *w, const float *x, int32_t n, float *y, bool accumulate,
                                tdm_err *err) {
    tandem_status st = tdm_cpu_check_weight(w, "matmul", err);
    if (st != TANDEM_OK) return st;
    if (n < 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "matmul: n = %d", (int)n);
    if (n == 0 || w->rows == 0) return TANDEM_OK;
    if (!x || !y) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "matmul: NULL x or y");

    if (tdm_qdot_type(w->type)) {
        if (w->layout != TDM_LAYOUT_ROWS)
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "matmul: %s weight in layout %u (the CPU reads rows)",
                              tdm_dtype_name(w->type), (unsigned)w->layout);
        return mm_qdot(c, w, x, n, y, accumulate, err);
    }
    mm_job j = {.c = c, .w = w, .x = x, .n = n, .y = y, .acc = accumulate};
    int64_t rows = w->rows, cols = w->cols;
    int64_t flops = rows * cols * (int64_t)n;

    if (w->layout != TDM_LAYOUT_ROWS) {
        if (w->layout != TDM_LAYOUT_P64 || !c->k->gemv_p64) /* (fit checked by tdm_cpu_check_weight) */
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                              "matmul: %s weight [%lld][%lld] in layout %u, which the %s kernels do not read",
                              tdm_dtype_name(w->type), (long long)rows, (long long)cols, (unsigned)w->layout,
                              c->k->name);
        /* One contiguous range of 64-row blocks per thread (one sequential stream). */
        int64_t blocks = rows / TDM_LAYOUT_P64_ROWS;
        int nth = tdm_cpu_nth(c, flops, 16384);
        if (nth > blocks) nth = (int)blocks;
        j.chunk = (blocks + nth - 1) / nth; /* in blocks */
        tdm_threadpool_run(c->pool, (blocks + j.chunk - 1) / j.chunk, nth, mm_p64_task, &j);
        return TANDEM_OK;
    }

    if (mm_direct(c, w, n)) {
        /* One contiguous range of W rows per thread, so that each thread's software
         * prefetch runs ahead through all of its range (with 4 chunks claimed per
         * thread, the first rows of every chunk came unprefetched: target decode
         * matmuls 325-340 vs 240-265 us per token).  Small matrices still use two
         * threads from 16 K multiply-adds on: in a speculative step the draft's
         * weights come from memory (the target's verification evicted them), and two
         * cores fetch them twice as fast.  At least 32 rows per thread. */
        int nth = tdm_cpu_nth(c, flops, 16384);
        if (nth > rows / 32) nth = rows >= 64 ? (int)(rows / 32) : 1;
        j.chunk = (rows + nth - 1) / nth;
        j.chunk = (j.chunk + TDM_MM_RB - 1) / TDM_MM_RB * TDM_MM_RB;
        int64_t n_chunks = (rows + j.chunk - 1) / j.chunk;
        tdm_threadpool_run(c->pool, n_chunks, nth, mm_gemv_task, &j);
        return TANDEM_OK;
    }

    int64_t chunk = mm_tile_rows(cols, &j.ld);
    j.chunk = chunk;
    st = tdm_cpu_scratch_reserve(c, (size_t)(chunk * j.ld), err);
    if (st != TANDEM_OK) return st;
    int64_t n_chunks = (rows + chunk - 1) / chunk;
    int nth = tdm_cpu_nth(c, TDM_MIN(flops, n_chunks * 65536), 65536);
    tdm_threadpool_run(c->pool, n_chunks, nth, mm_tile_task, &j);
    return TANDEM_OK;
}
