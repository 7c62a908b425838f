/* cpu_backend.c - the CPU backend: op table, creation, SIMD level selection. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "diag.h"

/* ---- SIMD level ---------------------------------------------------------------- */

tdm_cpu_level tdm_cpu_best_level(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool fma16 = __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
                 __builtin_cpu_supports("avx2");
    if (fma16 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return TDM_CPU_AVX512;
    if (fma16) return TDM_CPU_AVX2;
#endif
    return TDM_CPU_SCALAR;
}

/* tdm_cpu_cap_level's cap (TDM_CPU_N_LEVELS: none). */
static _Atomic int g_level_cap = TDM_CPU_N_LEVELS;

void tdm_cpu_cap_level(tdm_cpu_level cap) { g_level_cap = (int)cap; }

tdm_cpu_level tdm_cpu_default_level(void) {
    int level = (int)tdm_cpu_best_level();
    const int diag = tdm_diag_get()->cpu_level_cap; /* TANDEM_CPU: can only lower the level */
    if (diag >= 0) level = TDM_MIN(level, diag);
    return (tdm_cpu_level)TDM_MIN(level, g_level_cap);
}

const char *tdm_cpu_level_name(tdm_cpu_level level) {
    switch (level) {
    case TDM_CPU_AVX512: return "avx512";
    case TDM_CPU_AVX2: return "avx2";
    default: return "scalar";
    }
}

const tdm_cpu_kernels *tdm_cpu_kernels_for(tdm_cpu_level level) {
#if defined(__x86_64__)
    if (level == TDM_CPU_AVX512) return &tdm_cpu_kernels_avx512;
    if (level == TDM_CPU_AVX2) return &tdm_cpu_kernels_avx2;
#endif
    (void)level;
    return &tdm_cpu_kernels_scalar;
}

const char *tdm_cpu_features(void) { return tdm_cpu_level_name(tdm_cpu_default_level()); }

/* ---- memory ops ---------------------------------------------------------------- */

/* Every block of backend memory starts CPU_HDR bytes after a header that says how it
 * was made.  A block of at least CPU_MAP_MIN bytes is an anonymous mapping: its pages
 * read as zero and the kernel backs one with memory only when it is first written, so
 * a KV cache sized for its whole budget is resident only for the blocks in use (the
 * pool hands out the lowest free ones first), a working buffer only for the rows used.
 * Its header sits at the end of a first page of its own, so the block starts on a page
 * boundary.  A smaller block comes from posix_memalign and is zeroed. */
#define CPU_HDR 64
#define CPU_PAGE 4096
#define CPU_MAP_MIN ((size_t)256 << 10)

typedef struct cpu_hdr {
    uint64_t mapped; /* 1: an anonymous mapping starting CPU_PAGE bytes before the block */
    uint64_t bytes;  /* the block's size (rounded to 64) */
} cpu_hdr;

static tandem_status cpu_alloc(tdm_backend *b, size_t bytes, void **out, tdm_err *err) {
    (void)b;
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "alloc: NULL out pointer");
    *out = NULL;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes || rounded > SIZE_MAX - 2 * CPU_PAGE)
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "alloc: %zu bytes overflow", bytes);
    if (rounded == 0) rounded = 64;
    uint8_t *p;
    cpu_hdr h = {.mapped = rounded >= CPU_MAP_MIN, .bytes = rounded};
    if (h.mapped) {
        void *m = mmap(NULL, CPU_PAGE + rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED)
            return tdm_seterr(err, TANDEM_ERR_NOMEM, "alloc: out of memory for %zu bytes (%.1f MiB)", bytes,
                              (double)bytes / (1 << 20));
        p = (uint8_t *)m + CPU_PAGE;
    } else {
        uint8_t *m = tdm_alloc_aligned(CPU_HDR + rounded, 64);
        if (!m) return tdm_seterr(err, TANDEM_ERR_NOMEM, "alloc: out of memory for %zu bytes", bytes);
        p = m + CPU_HDR;
        memset(p, 0, rounded);
    }
    memcpy(p - CPU_HDR, &h, sizeof h);
    *out = p;
    return TANDEM_OK;
}

static void cpu_free(tdm_backend *b, void *p) {
    (void)b;
    if (!p) return;
    cpu_hdr h;
    memcpy(&h, (uint8_t *)p - CPU_HDR, sizeof h);
    if (h.mapped) munmap((uint8_t *)p - CPU_PAGE, CPU_PAGE + (size_t)h.bytes);
    else tdm_free_aligned((uint8_t *)p - CPU_HDR);
}

static tandem_status cpu_memcpy(const char *op, void *dst, const void *src, size_t n, tdm_err *err) {
    if (n == 0) return TANDEM_OK;
    if (!dst || !src) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: NULL pointer", op);
    memmove(dst, src, n);
    return TANDEM_OK;
}

static tandem_status cpu_upload(tdm_backend *b, void *dst, const void *src, size_t n, tdm_err *err) {
    (void)b;
    return cpu_memcpy("upload", dst, src, n, err);
}
static tandem_status cpu_download(tdm_backend *b, void *dst, const void *src, size_t n,
                                  tdm_err *err) {
    (void)b;
    return cpu_memcpy("download", dst, src, n, err);
}
static tandem_status cpu_copy(tdm_backend *b, void *dst, const void *src, size_t n, tdm_err *err) {
    (void)b;
    return cpu_memcpy("copy", dst, src, n, err);
}
static tandem_status cpu_sync(tdm_backend *b, tdm_err *err) {
    (void)b;
    (void)err;
    return TANDEM_OK;
}

static void cpu_destroy(tdm_backend *b);

/* P64 for the weights it fits when the level has its kernel. */
static uint32_t cpu_weight_layout(tdm_backend *b, uint32_t type, int64_t rows, int64_t cols) {
    tdm_cpu *c = tdm_cpu_of(b, "weight_layout", NULL);
    if (!c || !c->k->gemv_p64) return TDM_LAYOUT_ROWS;
    return tdm_layout_fits(TDM_LAYOUT_P64, type, rows, cols) ? TDM_LAYOUT_P64 : TDM_LAYOUT_ROWS;
}

static void cpu_host_for(tdm_backend *b, int32_t n, void (*fn)(void *user, int32_t i), void *user) {
    tdm_cpu *c = tdm_cpu_of(b, "host_for", NULL);
    if (!c || !c->pool || n <= 1) {
        for (int32_t i = 0; i < n; i++) fn(user, i);
        return;
    }
    tdm_threadpool_for(c->pool, n, fn, user); /* (each task a chunk, claimed dynamically) */
}

static const tdm_backend_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_upload,
    .download = cpu_download,
    .copy = cpu_copy,
    .get_rows = tdm_cpu_get_rows,
    .weight_layout = cpu_weight_layout,
    .rmsnorm = tdm_cpu_rmsnorm,
    .matmul = tdm_cpu_matmul,
    .add_bias = tdm_cpu_add_bias,
    .rope = tdm_cpu_rope,
    .kv_write = tdm_cpu_kv_write,
    .attention = tdm_cpu_attention,
    .swiglu = tdm_cpu_swiglu,
    .gather_rows = tdm_cpu_gather_rows,
    .qhead_logits = tdm_cpu_qhead_logits,
    .head_argmax = tdm_cpu_head_argmax,
    .blocks = tdm_cpu_blocks,
    .sync = cpu_sync,
    .head_rmsnorm = tdm_cpu_head_rmsnorm,
    .geglu = tdm_cpu_geglu,
    .add = tdm_cpu_add,
    .scale = tdm_cpu_scale,
    .softcap = tdm_cpu_softcap,
    .moe_experts = tdm_cpu_moe_experts,
    .scatter_cols = tdm_cpu_scatter_cols,
    .mask_rows = tdm_cpu_mask_rows,
    .edit_rows = tdm_cpu_edit_rows,
    .row_top = tdm_cpu_row_top,
    .host_for = cpu_host_for,
};

tdm_cpu *tdm_cpu_of(tdm_backend *b, const char *op, tdm_err *err) {
    if (!b || b->ops != &cpu_ops || !b->impl) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: not a CPU backend", op);
        return NULL;
    }
    return b->impl;
}

void tdm_backend_cpu_set_tp(tdm_backend *b, bool on) {
    if (b && b->ops == &cpu_ops && b->impl) ((tdm_cpu *)b->impl)->tp_mode = on ? 0 : -1;
}

uint64_t tdm_backend_cpu_blocks_runs(const tdm_backend *b) {
    return b && b->ops == &cpu_ops && b->impl ? ((const tdm_cpu *)b->impl)->blocks_runs : 0;
}

int tdm_backend_cpu_level(const tdm_backend *b) {
    if (!b || b->ops != &cpu_ops || !b->impl) return -1;
    return (int)((const tdm_cpu *)b->impl)->level;
}

/* ---- scratch ------------------------------------------------------------------- */

tandem_status tdm_cpu_scratch_grow(tdm_cpu_scratch *arr, int count, size_t n, tdm_err *err) {
    for (int t = 0; t < count; t++) {
        tdm_cpu_scratch *s = &arr[t];
        if (s->cap >= n) continue;
        size_t cap = n + n / 4 + 1024;
        size_t bytes;
        if (tdm_mul_overflow_size(cap, sizeof(float), &bytes))
            return tdm_seterr(err, TANDEM_ERR_NOMEM, "cpu scratch: %zu floats overflow", n);
        float *p = tdm_alloc_aligned(bytes, 64);
        if (!p) return tdm_seterr(err, TANDEM_ERR_NOMEM, "cpu scratch: out of memory (%zu bytes)", bytes);
        tdm_free_aligned(s->buf);
        s->buf = p;
        s->cap = cap;
    }
    return TANDEM_OK;
}

tandem_status tdm_cpu_scratch_reserve(tdm_cpu *c, size_t n, tdm_err *err) {
    return tdm_cpu_scratch_grow(c->scratch, c->n_threads, n, err);
}

/* ---- creation ------------------------------------------------------------------ */

static void cpu_free_impl(tdm_cpu *c) {
    if (!c) return;
    for (int i = 0; i < TDM_ROPE_CACHES; i++) {
        free(c->rope[i].cs);
        free(c->rope[i].valid);
        free(c->rope[i].inv_freq);
    }
    tdm_threadpool_destroy(c->pool);
    tdm_cpu_scratch *arrs[] = {c->scratch, c->team};
    for (size_t i = 0; i < TDM_ARRAY_LEN(arrs); i++) {
        if (arrs[i])
            for (int t = 0; t < c->n_threads; t++) tdm_free_aligned(arrs[i][t].buf);
        free(arrs[i]);
    }
    tdm_free_aligned(c->head_buf);
    tdm_free_aligned(c->xq_buf);
    tdm_free_aligned(c->moe_buf);
    free(c);
}

static void cpu_destroy(tdm_backend *b) {
    if (!b) return;
    cpu_free_impl(b->impl);
    free(b);
}

tandem_status tdm_backend_cpu_create_level(int32_t n_threads, tdm_cpu_level level,
                                           tdm_backend **out, tdm_err *err) {
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "cpu backend: NULL out pointer");
    *out = NULL;
    tandem_status st = tdm_diag_check(err);
    if (st) return st;
    if (n_threads < 0 || n_threads > TANDEM_THREADS_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "cpu backend: bad thread count %d",
                          (int)n_threads);
    if ((int)level < 0 || level >= TDM_CPU_N_LEVELS || level > tdm_cpu_best_level())
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "cpu backend: SIMD level %d (%s) not available",
                          (int)level, tdm_cpu_level_name(level));
    if (n_threads == 0) {
        long nc = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = nc < 1 ? 1 : nc > 256 ? 256 : (int32_t)nc;
    }
    tdm_cpu *c = calloc(1, sizeof *c);
    tdm_backend *b = calloc(1, sizeof *b);
    if (!c || !b) {
        free(c);
        free(b);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "cpu backend: out of memory");
    }
    c->n_threads = n_threads;
    c->level = level;
    c->k = tdm_cpu_kernels_for(level);
    c->scratch = calloc((size_t)n_threads, sizeof *c->scratch);
    c->team = calloc((size_t)n_threads, sizeof *c->team);
    if (!c->scratch || !c->team) {
        free(b);
        cpu_free_impl(c);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "cpu backend: out of memory");
    }
    st = tdm_threadpool_create(n_threads, TDM_THREADPOOL_SPIN_US, &c->pool, err);
    if (st != TANDEM_OK) {
        free(b);
        cpu_free_impl(c);
        return st;
    }
#if defined(__x86_64__)
    if (level == TDM_CPU_AVX512 && __builtin_cpu_supports("avx512vnni")) {
        c->k_approx = tdm_qhead_approx_vnni;
        c->k_qgemv = tdm_qgemv_vnni;
    }
#endif
    b->ops = &cpu_ops;
    b->n_threads = n_threads;
    b->int8_dot = c->k_approx != NULL;
    b->direct_types = c->k_qgemv ? (1u << TDM_Q4_K) | (1u << TDM_Q6_K) | (1u << TDM_Q5_0) : 0;
    b->host_memory = true;
    b->attn_window_softcap = true;
    b->blocks_feat = true;
    b->kv_type = TDM_F16; /* half the bytes of f32; attention converts with F16C at no cost */
    b->impl = c;
    *out = b;
    return TANDEM_OK;
}

tandem_status tdm_backend_cpu_create(int32_t n_threads, tdm_backend **out, tdm_err *err) {
    return tdm_backend_cpu_create_level(n_threads, tdm_cpu_default_level(), out, err);
}

void tdm_backend_destroy(tdm_backend *b) {
    if (!b || !b->ops || !b->ops->destroy) return;
    b->ops->destroy(b);
}
