/* test_gguf.c - GGUF loader and writer: round trips, real files, a corpus of corrupt
 * files (each rejected with the right status and a message naming the problem),
 * truncation at every offset, random byte mutations, getters and value printing. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "gguf_write.h"
#include "testutil.h"

/* ------------------------------------------------------------ helpers */

/* A growable byte buffer for hand-made metadata payloads. */
typedef struct bytes {
    uint8_t p[4096];
    size_t n;
} bytes;

static void b_put(bytes *b, const void *src, size_t n) {
    cr_assert(b->n + n <= sizeof b->p);
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void b_u32(bytes *b, uint32_t v) {
    uint8_t t[4];
    for (int i = 0; i < 4; i++) t[i] = (uint8_t)(v >> (8 * i));
    b_put(b, t, 4);
}
static void b_u64(bytes *b, uint64_t v) {
    uint8_t t[8];
    for (int i = 0; i < 8; i++) t[i] = (uint8_t)(v >> (8 * i));
    b_put(b, t, 8);
}
/* An array header: element type and count. */
static void b_arr(bytes *b, uint32_t elem_type, uint64_t n) {
    b_u32(b, elem_type);
    b_u64(b, n);
}
static void b_str(bytes *b, const char *s, size_t n) {
    b_u64(b, n);
    b_put(b, s, n);
}

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Offset of the length field of the GGUF string `s` (u64 length + bytes) in buf. */
static size_t str_off(const uint8_t *buf, size_t len, const char *s) {
    size_t n = strlen(s);
    uint8_t pat[256];
    cr_assert(n + 8 <= sizeof pat);
    put_u64(pat, n);
    memcpy(pat + 8, s, n);
    const uint8_t *hit = memmem(buf, len, pat, n + 8);
    cr_assert(hit, "string '%s' not found in the file", s);
    return (size_t)(hit - buf);
}
/* Offset of the value of metadata key `key` (after its u32 type). */
static size_t val_off(const uint8_t *buf, size_t len, const char *key) {
    return str_off(buf, len, key) + 8 + strlen(key) + 4;
}
/* Offset of the n_dims field of tensor `name`'s info. */
static size_t tinfo_off(const uint8_t *buf, size_t len, const char *name) {
    return str_off(buf, len, name) + 8 + strlen(name);
}

typedef struct file {
    uint8_t *p;
    size_t n;
} file;

static file finish(tdm_gguf_writer *w) {
    file f = {0};
    cr_assert_eq(tdm_gguf_writer_finish(w, &f.p, &f.n), TANDEM_OK);
    tdm_gguf_writer_free(w);
    return f;
}

static uint8_t zeros[4096];

/* The valid file every corruption starts from:
 *   kv: general.architecture="llama", general.name="tiny", llama.block_count=8 (u32),
 *       general.alignment=32 (u32), flag=true, tokenizer.ggml.tokens=["a","bc","def"],
 *       scores=[1,2,3] (f32)
 *   tensors: "a" f32 [4,2] (32 B), "b" q8_0 [64,2] (136 B), "c" f16 [32] (64 B) */
static void base_meta(tdm_gguf_writer *w) {
    static const char *toks[] = {"a", "bc", "def"};
    static const float sc[] = {1, 2, 3};
    tdm_gguf_w_str(w, "general.architecture", "llama");
    tdm_gguf_w_str(w, "general.name", "tiny");
    tdm_gguf_w_u32(w, "llama.block_count", 8);
    tdm_gguf_w_u32(w, "general.alignment", 32);
    tdm_gguf_w_bool(w, "flag", true);
    tdm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    tdm_gguf_w_arr_f32(w, "scores", sc, 3);
}
static void base_tensors(tdm_gguf_writer *w) {
    tdm_gguf_w_tensor(w, "a", TDM_F32, 2, (int64_t[]){4, 2}, zeros, 32);
    tdm_gguf_w_tensor(w, "b", TDM_Q8_0, 2, (int64_t[]){64, 2}, zeros, 136);
    tdm_gguf_w_tensor(w, "c", TDM_F16, 1, (int64_t[]){32}, zeros, 64);
}
static file base_file(void) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    base_meta(w);
    base_tensors(w);
    return finish(w);
}

/* ------------------------------------------------------------ round trip */

typedef struct tspec {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    size_t nbytes; /* computed by hand from the block layouts */
} tspec;

static const tspec round_tensors[] = {
    {"vec.f32", TDM_F32, 1, {7}, 28},
    {"mat.f16", TDM_F16, 2, {16, 3}, 96},
    {"cube.bf16", TDM_BF16, 3, {8, 2, 3}, 96},
    {"blk.0.attn_q.weight", TDM_Q8_0, 2, {64, 2}, 4 * 34},
    {"t4.q4_0", TDM_Q4_0, 4, {32, 3, 2, 2}, 12 * 18},
    {"one", TDM_F32, 4, {1, 1, 1, 1}, 4},
};

static const char *const round_strs[] = {"hello", "", "wörld \"q\"\n", "tab\t"};
static const float round_f32s[] = {0.5f, -1.25f, 3e38f, 1e-30f};
static const int32_t round_i32s[] = {-2147483647 - 1, -1, 0, 2147483647};

static file round_file(uint32_t version, uint32_t alignment, uint8_t tdata[][256]) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(version, alignment);
    cr_assert(w);
    bytes b = {0};
    int64_t i64 = INT64_MIN;
    double f64 = -2.718281828459045;
    tdm_gguf_w_raw(w, "t.u8", TDM_GGUF_UINT8, (uint8_t[]){200}, 1);
    tdm_gguf_w_raw(w, "t.i8", TDM_GGUF_INT8, (int8_t[]){-100}, 1);
    tdm_gguf_w_raw(w, "t.u16", TDM_GGUF_UINT16, (uint8_t[]){0xff, 0xff}, 2);      /* 65535 */
    tdm_gguf_w_raw(w, "t.i16", TDM_GGUF_INT16, (uint8_t[]){0x00, 0x80}, 2);      /* -32768 */
    tdm_gguf_w_u32(w, "t.u32", 4000000000u);
    tdm_gguf_w_i32(w, "t.i32", -123456);
    tdm_gguf_w_u64(w, "t.u64", UINT64_MAX);
    tdm_gguf_w_raw(w, "t.i64", TDM_GGUF_INT64, &i64, 8); /* little-endian host */
    tdm_gguf_w_f32(w, "t.f32", 0.1f);
    tdm_gguf_w_raw(w, "t.f64", TDM_GGUF_FLOAT64, &f64, 8);
    tdm_gguf_w_bool(w, "t.true", true);
    tdm_gguf_w_bool(w, "t.false", false);
    tdm_gguf_w_str(w, "t.str", "a \"quoted\" string\n");
    tdm_gguf_w_str(w, "t.empty", "");
    b_str(&b, "a\0b", 3);
    tdm_gguf_w_raw(w, "t.nul_str", TDM_GGUF_STRING, b.p, b.n);
    tdm_gguf_w_arr_str(w, "t.arr_str", round_strs, 4);
    tdm_gguf_w_arr_f32(w, "t.arr_f32", round_f32s, 4);
    tdm_gguf_w_arr_i32(w, "t.arr_i32", round_i32s, 4);
    tdm_gguf_w_arr_i32(w, "t.arr_empty", NULL, 0);
    /* [u8 1, 2, 255], [bool], [u64], [f64] */
    b.n = 0;
    b_arr(&b, TDM_GGUF_UINT8, 3);
    b_put(&b, (uint8_t[]){1, 2, 255}, 3);
    tdm_gguf_w_raw(w, "t.arr_u8", TDM_GGUF_ARRAY, b.p, b.n);
    b.n = 0;
    b_arr(&b, TDM_GGUF_BOOL, 2);
    b_put(&b, (uint8_t[]){1, 0}, 2);
    tdm_gguf_w_raw(w, "t.arr_bool", TDM_GGUF_ARRAY, b.p, b.n);
    b.n = 0;
    b_arr(&b, TDM_GGUF_FLOAT64, 2);
    b_put(&b, &f64, 8), b_put(&b, &f64, 8);
    tdm_gguf_w_raw(w, "t.arr_f64", TDM_GGUF_ARRAY, b.p, b.n);
    /* nested: [[1, 2], [3], []] of i32 */
    b.n = 0;
    b_arr(&b, TDM_GGUF_ARRAY, 3);
    b_arr(&b, TDM_GGUF_INT32, 2);
    b_u32(&b, 1), b_u32(&b, 2);
    b_arr(&b, TDM_GGUF_INT32, 1);
    b_u32(&b, 3);
    b_arr(&b, TDM_GGUF_INT32, 0);
    tdm_gguf_w_raw(w, "t.nested_i32", TDM_GGUF_ARRAY, b.p, b.n);
    /* nested strings: [["x", "yz"], [[...]]] -> second element is an array of arrays */
    b.n = 0;
    b_arr(&b, TDM_GGUF_ARRAY, 2);
    b_arr(&b, TDM_GGUF_STRING, 2);
    b_str(&b, "x", 1), b_str(&b, "yz", 2);
    b_arr(&b, TDM_GGUF_ARRAY, 1);
    b_arr(&b, TDM_GGUF_STRING, 1);
    b_str(&b, "deep", 4);
    tdm_gguf_w_raw(w, "t.nested_str", TDM_GGUF_ARRAY, b.p, b.n);
    /* exactly TDM_GGUF_MAX_DEPTH levels of arrays: accepted */
    b.n = 0;
    for (int d = 1; d < TDM_GGUF_MAX_DEPTH; d++) {
        b_arr(&b, TDM_GGUF_ARRAY, 1);
    }
    b_arr(&b, TDM_GGUF_INT32, 1);
    b_u32(&b, 77);
    tdm_gguf_w_raw(w, "t.max_depth", TDM_GGUF_ARRAY, b.p, b.n);

    uint64_t rng = 42;
    for (size_t i = 0; i < TDM_ARRAY_LEN(round_tensors); i++) {
        const tspec *t = &round_tensors[i];
        for (size_t j = 0; j < t->nbytes; j++) tdata[i][j] = (uint8_t)tdm_test_rand(&rng);
        tdm_gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, tdata[i], t->nbytes);
    }
    return finish(w);
}

#define KV(key) tdm_gguf_find(g, key)

static void check_round(const tdm_gguf *g, uint32_t version, uint32_t alignment, uint8_t tdata[][256]) {
    cr_assert_eq(g->version, version);
    cr_assert_eq(g->alignment, alignment);
    cr_assert_eq(g->n_tensors, TDM_ARRAY_LEN(round_tensors));
    const tdm_gguf_value *v;
    cr_assert((v = KV("t.u8")) && v->type == TDM_GGUF_UINT8 && v->v.u64 == 200);
    cr_assert((v = KV("t.i8")) && v->type == TDM_GGUF_INT8 && v->v.i64 == -100);
    cr_assert((v = KV("t.u16")) && v->type == TDM_GGUF_UINT16 && v->v.u64 == 65535);
    cr_assert((v = KV("t.i16")) && v->type == TDM_GGUF_INT16 && v->v.i64 == -32768);
    cr_assert((v = KV("t.u32")) && v->type == TDM_GGUF_UINT32 && v->v.u64 == 4000000000u);
    cr_assert((v = KV("t.i32")) && v->type == TDM_GGUF_INT32 && v->v.i64 == -123456);
    cr_assert((v = KV("t.u64")) && v->type == TDM_GGUF_UINT64 && v->v.u64 == UINT64_MAX);
    cr_assert((v = KV("t.i64")) && v->type == TDM_GGUF_INT64 && v->v.i64 == INT64_MIN);
    cr_assert((v = KV("t.f32")) && v->type == TDM_GGUF_FLOAT32 && (float)v->v.f64 == 0.1f);
    cr_assert((v = KV("t.f64")) && v->type == TDM_GGUF_FLOAT64 && v->v.f64 == -2.718281828459045);
    cr_assert((v = KV("t.true")) && v->type == TDM_GGUF_BOOL && v->v.b);
    cr_assert((v = KV("t.false")) && v->type == TDM_GGUF_BOOL && !v->v.b);
    cr_assert((v = KV("t.str")) && v->type == TDM_GGUF_STRING && v->v.str.len == 18 &&
              memcmp(v->v.str.ptr, "a \"quoted\" string\n", 18) == 0);
    cr_assert((v = KV("t.empty")) && v->type == TDM_GGUF_STRING && v->v.str.len == 0);
    cr_assert((v = KV("t.nul_str")) && v->v.str.len == 3 && memcmp(v->v.str.ptr, "a\0b", 3) == 0);

    cr_assert((v = KV("t.arr_str")) && v->type == TDM_GGUF_ARRAY && v->v.arr.type == TDM_GGUF_STRING);
    cr_assert_eq(v->v.arr.n, 4);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(v->v.arr.strs[i].len, strlen(round_strs[i]));
        cr_assert(memcmp(v->v.arr.strs[i].ptr, round_strs[i], strlen(round_strs[i])) == 0);
    }
    const tdm_gguf_array *a;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_get_arr(g, "t.arr_f32", TDM_GGUF_FLOAT32, &a, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(a->n, 4);
    for (int i = 0; i < 4; i++) cr_assert_eq(tdm_gguf_arr_f32(a, (uint64_t)i), round_f32s[i]);
    cr_assert_eq(tdm_gguf_get_arr(g, "t.arr_i32", TDM_GGUF_INT32, &a, &err), TANDEM_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++) cr_assert_eq(tdm_gguf_arr_i32(a, (uint64_t)i), round_i32s[i]);
    cr_assert_eq(tdm_gguf_get_arr(g, "t.arr_empty", TDM_GGUF_INT32, &a, &err), TANDEM_OK);
    cr_assert_eq(a->n, 0);
    cr_assert_eq(tdm_gguf_get_arr(g, "t.arr_u8", TDM_GGUF_UINT8, &a, &err), TANDEM_OK);
    cr_assert(a->n == 3 && memcmp(a->data, (uint8_t[]){1, 2, 255}, 3) == 0);
    cr_assert_eq(tdm_gguf_get_arr(g, "t.arr_bool", TDM_GGUF_BOOL, &a, &err), TANDEM_OK);
    cr_assert(a->n == 2 && memcmp(a->data, (uint8_t[]){1, 0}, 2) == 0);
    cr_assert_eq(tdm_gguf_get_arr(g, "t.arr_f64", TDM_GGUF_FLOAT64, &a, &err), TANDEM_OK);
    double d;
    memcpy(&d, (const uint8_t *)a->data + 8, 8);
    cr_assert(a->n == 2 && d == -2.718281828459045);

    cr_assert_eq(tdm_gguf_get_arr(g, "t.nested_i32", TDM_GGUF_ARRAY, &a, &err), TANDEM_OK);
    cr_assert_eq(a->n, 3);
    const tdm_gguf_array *e0 = &a->elems[0].v.arr, *e1 = &a->elems[1].v.arr, *e2 = &a->elems[2].v.arr;
    cr_assert(a->elems[0].type == TDM_GGUF_ARRAY && e0->type == TDM_GGUF_INT32 && e0->n == 2);
    cr_assert(tdm_gguf_arr_i32(e0, 0) == 1 && tdm_gguf_arr_i32(e0, 1) == 2);
    cr_assert(e1->n == 1 && tdm_gguf_arr_i32(e1, 0) == 3);
    cr_assert(e2->type == TDM_GGUF_INT32 && e2->n == 0);

    cr_assert_eq(tdm_gguf_get_arr(g, "t.nested_str", TDM_GGUF_ARRAY, &a, &err), TANDEM_OK);
    cr_assert_eq(a->n, 2);
    e0 = &a->elems[0].v.arr;
    cr_assert(e0->type == TDM_GGUF_STRING && e0->n == 2 && e0->strs[1].len == 2 &&
              memcmp(e0->strs[1].ptr, "yz", 2) == 0);
    e1 = &a->elems[1].v.arr;
    cr_assert(e1->type == TDM_GGUF_ARRAY && e1->n == 1);
    e2 = &e1->elems[0].v.arr;
    cr_assert(e2->type == TDM_GGUF_STRING && e2->n == 1 && memcmp(e2->strs[0].ptr, "deep", 4) == 0);

    v = KV("t.max_depth");
    for (int lvl = 1; lvl < TDM_GGUF_MAX_DEPTH; lvl++) {
        cr_assert(v->type == TDM_GGUF_ARRAY && v->v.arr.type == TDM_GGUF_ARRAY && v->v.arr.n == 1);
        v = &v->v.arr.elems[0];
    }
    cr_assert(v->v.arr.type == TDM_GGUF_INT32 && tdm_gguf_arr_i32(&v->v.arr, 0) == 77);

    cr_assert_null(KV("t.absent"));
    cr_assert_null(tdm_gguf_find_tensor(g, "absent"));
    for (size_t i = 0; i < TDM_ARRAY_LEN(round_tensors); i++) {
        const tspec *s = &round_tensors[i];
        const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, s->name);
        cr_assert(t, "tensor %s", s->name);
        cr_assert_eq(t, &g->tensors[i], "tensors keep file order");
        cr_assert_str_eq(t->name, s->name);
        cr_assert_eq(t->type, s->type);
        cr_assert_eq(t->n_dims, s->n_dims);
        for (uint32_t k = 0; k < 4; k++)
            cr_assert_eq(t->ne[k], k < s->n_dims ? s->ne[k] : 1, "%s ne[%u]", s->name, k);
        cr_assert_eq(t->nbytes, s->nbytes, "%s", s->name);
        size_t at = (size_t)((const uint8_t *)t->data - g->base);
        cr_assert_eq(at % alignment, 0, "%s data at %zu", s->name, at);
        cr_assert_eq(at, g->data_offset + t->offset);
        cr_assert(memcmp(t->data, tdata[i], s->nbytes) == 0, "%s data", s->name);
    }
}

Test(gguf, round_trip_memory_and_file) {
    static const uint32_t aligns[] = {1, 32, 64, 256};
    for (uint32_t version = 2; version <= 3; version++) {
        for (size_t ai = 0; ai < TDM_ARRAY_LEN(aligns); ai++) {
            uint8_t tdata[TDM_ARRAY_LEN(round_tensors)][256];
            file f = round_file(version, aligns[ai], tdata);
            tdm_gguf *g = NULL;
            tdm_err err = {0};
            cr_assert_eq(tdm_gguf_open_memory(f.p, f.n, &g, &err), TANDEM_OK, "v%u a%u: %s", version,
                         aligns[ai], err.msg);
            check_round(g, version, aligns[ai], tdata);
            tdm_gguf_close(g);

            char path[] = "/tmp/tdm_gguf_XXXXXX";
            int fd = mkstemp(path);
            cr_assert(fd >= 0);
            cr_assert_eq(write(fd, f.p, f.n), (ssize_t)f.n);
            close(fd);
            cr_assert_eq(tdm_gguf_open(path, &g, &err), TANDEM_OK, "%s", err.msg);
            cr_assert_null(g->base == f.p ? g : NULL, "file open maps its own copy");
            check_round(g, version, aligns[ai], tdata);
            tdm_gguf_close(g);
            unlink(path);
            free(f.p);
        }
    }
}

Test(gguf, writer_alignment_and_defaults) {
    cr_assert_null(tdm_gguf_writer_new(3, 3), "alignment must be a power of two");
    /* a non-default alignment adds general.alignment automatically */
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 128);
    base_tensors(w);
    file f = finish(w);
    tdm_gguf *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open_memory(f.p, f.n, &g, &err), TANDEM_OK, "%s", err.msg);
    uint32_t al = 0;
    cr_assert_eq(tdm_gguf_get_u32(g, "general.alignment", &al, &err), TANDEM_OK);
    cr_assert_eq(al, 128);
    cr_assert_eq(g->data_offset % 128, 0);
    for (uint64_t i = 0; i < g->n_tensors; i++) cr_assert_eq(g->tensors[i].offset % 128, 0);
    tdm_gguf_close(g);
    free(f.p);
    /* no metadata, no tensors: the smallest valid file (24 bytes) */
    f = finish(tdm_gguf_writer_new(3, 32));
    cr_assert_eq(f.n, 24);
    cr_assert_eq(tdm_gguf_open_memory(f.p, f.n, &g, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(g->n_kv == 0 && g->n_tensors == 0 && g->alignment == 32);
    tdm_gguf_close(g);
    free(f.p);
}

/* ------------------------------------------------------- corrupt corpus */

/* Each mutation gets the base file and edits it in place, or replaces it. */
typedef void (*mutate_fn)(file *f);

static void replace(file *f, file nf) {
    free(f->p);
    *f = nf;
}

static void m_bad_magic(file *f) { f->p[0] = 'X'; }
static void m_version1(file *f) { put_u32(f->p + 4, 1); }
static void m_version4(file *f) { put_u32(f->p + 4, 4); }
static void m_version999(file *f) { put_u32(f->p + 4, 999); }
static void m_big_endian(file *f) { put_u32(f->p + 4, 0x03000000u); }
static void m_empty(file *f) { f->n = 0; }
static void m_header_only(file *f) { f->n = 20; }
static void m_n_tensors_huge(file *f) { put_u64(f->p + 8, 1ull << 63); }
static void m_n_kv_huge(file *f) { put_u64(f->p + 16, 1ull << 63); }
static void m_n_kv_over_file(file *f) { put_u64(f->p + 16, 1000); }
static void m_str_len_huge(file *f) { put_u64(f->p + val_off(f->p, f->n, "general.name"), 1ull << 63); }
static void m_str_len_past_end(file *f) {
    size_t at = val_off(f->p, f->n, "general.name");
    put_u64(f->p + at, f->n - (at + 8) + 1); /* one byte more than the file holds */
}
static void m_key_len_zero(file *f) { put_u64(f->p + str_off(f->p, f->n, "general.name"), 0); }
static void m_key_len_huge(file *f) { put_u64(f->p + str_off(f->p, f->n, "general.name"), 70000); }
static void m_key_nul(file *f) { f->p[str_off(f->p, f->n, "general.name") + 8 + 3] = 0; }
static void m_arr_count_huge(file *f) {
    put_u64(f->p + val_off(f->p, f->n, "tokenizer.ggml.tokens") + 4, 1ull << 62);
}
static void m_arr_count_past_end(file *f) {
    put_u64(f->p + val_off(f->p, f->n, "scores") + 4, 1000000); /* 4 MB of f32 in a small file */
}
static void m_arr_elem_unknown(file *f) { put_u32(f->p + val_off(f->p, f->n, "scores"), 13); }
static void m_value_type_13(file *f) { put_u32(f->p + val_off(f->p, f->n, "flag") - 4, 13); }
static void m_value_type_ffff(file *f) { put_u32(f->p + val_off(f->p, f->n, "flag") - 4, 0xFFFFFFFFu); }
static void m_bool_2(file *f) { f->p[val_off(f->p, f->n, "flag")] = 2; }
static void m_depth_over(file *f) {
    bytes b = {0};
    for (int d = 0; d < TDM_GGUF_MAX_DEPTH; d++) { /* MAX_DEPTH + 1 levels of arrays */
        b_arr(&b, TDM_GGUF_ARRAY, 1);
    }
    b_arr(&b, TDM_GGUF_INT32, 1);
    b_u32(&b, 5);
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_raw(w, "too.deep", TDM_GGUF_ARRAY, b.p, b.n);
    replace(f, finish(w));
}
static void m_duplicate_key(file *f) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    base_meta(w);
    tdm_gguf_w_str(w, "general.name", "again");
    base_tensors(w);
    replace(f, finish(w));
}
static void alignment_file(file *f, int kind) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_str(w, "general.architecture", "llama");
    if (kind == 0) tdm_gguf_w_u32(w, "general.alignment", 0);
    if (kind == 1) tdm_gguf_w_u32(w, "general.alignment", 3);
    if (kind == 2) tdm_gguf_w_str(w, "general.alignment", "32");
    if (kind == 3) tdm_gguf_w_u64(w, "general.alignment", 32);
    base_tensors(w);
    replace(f, finish(w));
}
static void m_align_0(file *f) { alignment_file(f, 0); }
static void m_align_3(file *f) { alignment_file(f, 1); }
static void m_align_str(file *f) { alignment_file(f, 2); }
static void m_align_u64(file *f) { alignment_file(f, 3); }
static void one_tensor(file *f, uint32_t type, uint32_t n_dims, const int64_t *ne, size_t nbytes) {
    static uint8_t big[4096];
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    base_meta(w);
    tdm_gguf_w_tensor(w, "a", TDM_F32, 2, (int64_t[]){4, 2}, zeros, 32);
    tdm_gguf_w_tensor(w, "blk.0.attn_q.weight", type, n_dims, ne, big, nbytes);
    replace(f, finish(w));
}
static void m_n_dims_5(file *f) { one_tensor(f, TDM_F32, 5, (int64_t[]){1, 1, 1, 1, 1}, 4); }
static void m_n_dims_0(file *f) { one_tensor(f, TDM_F32, 0, NULL, 4); }
static void m_dim_zero(file *f) { one_tensor(f, TDM_F32, 2, (int64_t[]){4, 0}, 0); }
static void m_dim_negative(file *f) { one_tensor(f, TDM_F32, 2, (int64_t[]){4, -1}, 16); }
static void m_dims_overflow(file *f) {
    one_tensor(f, TDM_F32, 3, (int64_t[]){32, 1ll << 40, 1ll << 40}, 128);
}
static void m_size_overflow(file *f) { /* 2^62 elements fit int64, 2^62 * 4 bytes do not */
    one_tensor(f, TDM_F32, 2, (int64_t[]){1ll << 31, 1ll << 31}, 128);
}
static void m_q8_not_block(file *f) { one_tensor(f, TDM_Q8_0, 2, (int64_t[]){48, 2}, 102); }
static void m_q4_not_block(file *f) { one_tensor(f, TDM_Q4_0, 1, (int64_t[]){33}, 18); }
static void m_unknown_ttype(file *f) { one_tensor(f, 99, 1, (int64_t[]){32}, 128); }
static void m_past_end(file *f) { /* declares 64 KiB of f32 but the file holds 128 bytes */
    one_tensor(f, TDM_F32, 2, (int64_t[]){128, 128}, 128);
}
/* Offset field of tensor `name` (base file: every tensor has its own dims count). */
static size_t toff(file *f, const char *name, uint32_t n_dims) {
    return tinfo_off(f->p, f->n, name) + 4 + 8 * n_dims + 4;
}
static void m_misaligned(file *f) {
    size_t at = toff(f, "b", 2);
    put_u64(f->p + at, get_u64(f->p + at) + 4);
}
static void m_offset_huge(file *f) { put_u64(f->p + toff(f, "c", 1), 0xFFFFFFFFFFFFFFE0ull); }
static void m_offset_past(file *f) { put_u64(f->p + toff(f, "c", 1), 1ull << 40); }
static void m_overlap(file *f) { put_u64(f->p + toff(f, "c", 1), get_u64(f->p + toff(f, "b", 2))); }
static void m_overlap_partial(file *f) { /* "b" is [32, 168): put "c" (64 bytes) at 160 */
    put_u64(f->p + toff(f, "c", 1), 160);
}
static void m_dup_tensor(file *f) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    base_meta(w);
    base_tensors(w);
    tdm_gguf_w_tensor(w, "b", TDM_F32, 1, (int64_t[]){8}, zeros, 32);
    replace(f, finish(w));
}
static void m_tname_nul(file *f) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    base_meta(w);
    tdm_gguf_w_tensor(w, "bad_name", TDM_F32, 1, (int64_t[]){8}, zeros, 32);
    file nf = finish(w);
    nf.p[str_off(nf.p, nf.n, "bad_name") + 8 + 3] = 0;
    replace(f, nf);
}
static void m_tname_empty(file *f) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    base_meta(w);
    tdm_gguf_w_tensor(w, "", TDM_F32, 1, (int64_t[]){8}, zeros, 32);
    replace(f, finish(w));
}
static void m_block_count_str(file *f) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_str(w, "llama.block_count", "eight");
    replace(f, finish(w));
}
static void m_nothing(file *f) { (void)f; }

typedef struct corrupt_case {
    const char *name;
    mutate_fn mutate;
    tandem_status status;
    const char *expect;     /* substring of the error message */
    const char *getter_key; /* non-NULL: the file opens; tdm_gguf_get_u32(key) must fail */
} corrupt_case;

static const corrupt_case corpus[] = {
    {"bad_magic", m_bad_magic, TANDEM_ERR_FORMAT, "bad magic", NULL},
    {"version_1", m_version1, TANDEM_ERR_UNSUPPORTED, "unsupported GGUF version 1", NULL},
    {"version_4", m_version4, TANDEM_ERR_UNSUPPORTED, "version 4", NULL},
    {"version_999", m_version999, TANDEM_ERR_UNSUPPORTED, "version 999", NULL},
    {"big_endian", m_big_endian, TANDEM_ERR_UNSUPPORTED, "big-endian", NULL},
    {"empty_file", m_empty, TANDEM_ERR_FORMAT, "need 4 bytes at offset 0 for the magic, file is 0 bytes", NULL},
    {"truncated_header", m_header_only, TANDEM_ERR_FORMAT,
     "need 8 bytes at offset 16 for the metadata count, file is 20 bytes", NULL},
    {"n_tensors_2^63", m_n_tensors_huge, TANDEM_ERR_FORMAT, "tensor count 9223372036854775808", NULL},
    {"n_kv_2^63", m_n_kv_huge, TANDEM_ERR_FORMAT, "metadata count 9223372036854775808", NULL},
    {"n_kv_over_file", m_n_kv_over_file, TANDEM_ERR_FORMAT, "metadata count 1000 is more than the file", NULL},
    {"string_len_2^63", m_str_len_huge, TANDEM_ERR_FORMAT, "over the limit", NULL},
    {"string_len_past_end", m_str_len_past_end, TANDEM_ERR_FORMAT, "for the string of key 'general.name'", NULL},
    {"key_len_0", m_key_len_zero, TANDEM_ERR_FORMAT, "the key of metadata pair 1 at offset 69 is empty", NULL},
    {"key_len_over_limit", m_key_len_huge, TANDEM_ERR_FORMAT, "length 70000, over the limit of 65536", NULL},
    {"key_nul_byte", m_key_nul, TANDEM_ERR_FORMAT, "contains a NUL byte", NULL},
    {"array_count_2^62", m_arr_count_huge, TANDEM_ERR_FORMAT, "declares 4611686018427387904 elements", NULL},
    {"array_count_past_end", m_arr_count_past_end, TANDEM_ERR_FORMAT, "more than the file holds", NULL},
    {"array_elem_type_13", m_arr_elem_unknown, TANDEM_ERR_FORMAT, "unknown element type 13", NULL},
    {"array_depth_over_limit", m_depth_over, TANDEM_ERR_FORMAT, "nested deeper than 8", NULL},
    {"value_type_13", m_value_type_13, TANDEM_ERR_FORMAT, "key 'flag' has unknown value type 13", NULL},
    {"value_type_0xffffffff", m_value_type_ffff, TANDEM_ERR_FORMAT, "unknown value type 4294967295", NULL},
    {"bool_value_2", m_bool_2, TANDEM_ERR_FORMAT, "not 0 or 1", NULL},
    {"duplicate_key", m_duplicate_key, TANDEM_ERR_FORMAT, "duplicate key 'general.name'", NULL},
    {"alignment_0", m_align_0, TANDEM_ERR_FORMAT, "'general.alignment' is 0, not a nonzero power of two", NULL},
    {"alignment_3", m_align_3, TANDEM_ERR_FORMAT, "'general.alignment' is 3", NULL},
    {"alignment_string", m_align_str, TANDEM_ERR_FORMAT, "'general.alignment' has type string, expected u32", NULL},
    {"alignment_u64", m_align_u64, TANDEM_ERR_FORMAT, "has type u64, expected u32", NULL},
    {"n_dims_5", m_n_dims_5, TANDEM_ERR_FORMAT, "'blk.0.attn_q.weight' has 5 dimensions", NULL},
    {"n_dims_0", m_n_dims_0, TANDEM_ERR_FORMAT, "'blk.0.attn_q.weight' has 0 dimensions", NULL},
    {"dim_zero", m_dim_zero, TANDEM_ERR_FORMAT, "ne[1] = 0", NULL},
    {"dim_negative", m_dim_negative, TANDEM_ERR_FORMAT, "ne[1] = 18446744073709551615", NULL},
    {"dims_product_overflow", m_dims_overflow, TANDEM_ERR_FORMAT, "element count overflows", NULL},
    {"data_size_overflow", m_size_overflow, TANDEM_ERR_FORMAT, "data size overflows", NULL},
    {"q8_0_ne0_48", m_q8_not_block, TANDEM_ERR_FORMAT, "ne[0] = 48 is not a multiple of the q8_0 block size 32", NULL},
    {"q4_0_ne0_33", m_q4_not_block, TANDEM_ERR_FORMAT, "not a multiple of the q4_0 block size", NULL},
    {"tensor_type_99", m_unknown_ttype, TANDEM_ERR_UNSUPPORTED, "'blk.0.attn_q.weight' has unsupported type 99", NULL},
    {"tensor_misaligned", m_misaligned, TANDEM_ERR_FORMAT, "'b': data offset 36 is not a multiple of the alignment 32", NULL},
    {"tensor_past_end", m_past_end, TANDEM_ERR_FORMAT, "'blk.0.attn_q.weight': data [", NULL},
    {"tensor_offset_overflow", m_offset_huge, TANDEM_ERR_FORMAT, "tensor 'c': data offset", NULL},
    {"tensor_offset_past_end", m_offset_past, TANDEM_ERR_FORMAT, "extends past the end of the file", NULL},
    {"tensors_overlap", m_overlap, TANDEM_ERR_FORMAT, "overlap", NULL},
    {"tensors_overlap_partial", m_overlap_partial, TANDEM_ERR_FORMAT, "tensors 'b' [32, 168) and 'c' [160, 224) overlap", NULL},
    {"duplicate_tensor", m_dup_tensor, TANDEM_ERR_FORMAT, "duplicate tensor name 'b'", NULL},
    {"tensor_name_nul", m_tname_nul, TANDEM_ERR_FORMAT, "the tensor name 'bad' (of tensor info 0 at offset 305)", NULL},
    {"tensor_name_empty", m_tname_empty, TANDEM_ERR_FORMAT, "the tensor name of tensor info 0 at offset 305 is empty", NULL},
    {"getter_wrong_type", m_block_count_str, TANDEM_ERR_FORMAT,
     "key 'llama.block_count' has type string, expected an integer", "llama.block_count"},
    {"getter_missing_key", m_nothing, TANDEM_ERR_FORMAT, "missing required key 'llama.context_length'",
     "llama.context_length"},
};

Test(gguf, corrupt_corpus) {
    cr_assert_geq(TDM_ARRAY_LEN(corpus), 25);
    for (size_t i = 0; i < TDM_ARRAY_LEN(corpus); i++) {
        const corrupt_case *c = &corpus[i];
        file f = base_file();
        c->mutate(&f);
        tdm_gguf *g = (tdm_gguf *)1;
        tdm_err err = {0};
        tandem_status st = tdm_gguf_open_memory(f.p, f.n, &g, &err);
        if (c->getter_key) {
            cr_expect_eq(st, TANDEM_OK, "case %s: the file should open: %s", c->name, err.msg);
            if (st == TANDEM_OK) {
                uint32_t v = 12345;
                st = tdm_gguf_get_u32(g, c->getter_key, &v, &err);
                cr_expect_eq(v, 12345, "case %s: output untouched on error", c->name);
                tdm_gguf_close(g);
            }
        } else {
            cr_expect_null(g, "case %s: *out must be NULL on failure", c->name);
        }
        cr_expect_eq(st, c->status, "case %s: status %d (%s), expected %d", c->name, st, err.msg, c->status);
        cr_expect(strstr(err.msg, c->expect) != NULL, "case %s: message \"%s\" lacks \"%s\"", c->name,
                  err.msg, c->expect);
        free(f.p);
    }
}

/* Every prefix of a valid file (except the whole file) is rejected, never read past. */
Test(gguf, truncation_everywhere) {
    file f = base_file();
    tdm_gguf *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open_memory(f.p, f.n, &g, &err), TANDEM_OK, "%s", err.msg);
    uint64_t data_offset = g->data_offset;
    tdm_gguf_close(g);
    for (size_t len = 0; len < f.n; len++) {
        /* a heap copy of exactly len bytes, so ASan catches any read past the end */
        uint8_t *cut = malloc(len ? len : 1);
        memcpy(cut, f.p, len);
        err.msg[0] = 0;
        g = (tdm_gguf *)1;
        tandem_status st = tdm_gguf_open_memory(cut, len, &g, &err);
        cr_expect_eq(st, TANDEM_ERR_FORMAT, "truncated at %zu: status %d", len, st);
        cr_expect_null(g);
        if (len < data_offset)
            cr_expect(strstr(err.msg, "truncated file") || strstr(err.msg, "more than"),
                      "truncated at %zu: \"%s\"", len, err.msg);
        else
            cr_expect(strstr(err.msg, "extends past the end of the file"), "truncated at %zu: \"%s\"", len,
                      err.msg);
        free(cut);
    }
    free(f.p);
}

/* Random byte mutations of a valid file: any result is fine except a crash, a
 * sanitizer report or an error without a message. */
Test(gguf, random_mutations) {
    file f = base_file();
    uint8_t *buf = malloc(f.n);
    uint64_t rng = 7;
    int n_ok = 0;
    for (int iter = 0; iter < 3000; iter++) {
        memcpy(buf, f.p, f.n);
        int flips = 1 + (int)(tdm_test_rand(&rng) % 4);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(tdm_test_rand(&rng) % f.n);
            uint64_t r = tdm_test_rand(&rng);
            buf[at] = (r & 256) ? (uint8_t)r : (uint8_t)(r & 1 ? 0xff : 0); /* random, 0xff or 0 */
        }
        tdm_gguf *g = NULL;
        tdm_err err = {0};
        tandem_status st = tdm_gguf_open_memory(buf, f.n, &g, &err);
        if (st == TANDEM_OK) {
            n_ok++;
            for (uint64_t i = 0; i < g->n_kv; i++) {
                FILE *null = fopen("/dev/null", "w");
                tdm_gguf_value_print(&g->kv[i].value, null, 4);
                fclose(null);
            }
            tdm_gguf_close(g);
        } else {
            cr_expect(err.msg[0] != 0, "iteration %d: status %d without a message", iter, st);
            cr_expect_null(g);
        }
    }
    cr_expect_lt(n_ok, 3000, "mutations must be detected sometimes");
    free(buf);
    free(f.p);
}

/* ------------------------------------------------------------ real files */

static tdm_gguf *open_path(const char *path) {
    tdm_gguf *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open(path, &g, &err), TANDEM_OK, "%s: %s", path, err.msg);
    return g;
}

static void check_str(const tdm_gguf *g, const char *key, const char *want) {
    tdm_gguf_str s;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_get_str(g, key, &s, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(s.len == strlen(want) && memcmp(s.ptr, want, s.len) == 0, "%s = '%.*s', want '%s'", key,
              (int)s.len, s.ptr, want);
}

/* Every tensor lies in the data section, aligned, without overlap (re-checked here). */
static void check_layout(const tdm_gguf *g) {
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tdm_gguf_tensor *t = &g->tensors[i];
        uint64_t at = (uint64_t)((const uint8_t *)t->data - g->base);
        cr_assert_eq(at % g->alignment, 0);
        cr_assert_leq(at + t->nbytes, g->size);
        cr_assert_geq(at, g->data_offset);
        cr_assert_eq(tdm_gguf_find_tensor(g, t->name), t);
    }
}

static void check_model(const char *file, uint32_t n_layer, uint64_t n_embd, uint64_t n_tensors) {
    tdm_gguf *g = open_path(tdm_test_model_path(file));
    tdm_err err = {0};
    cr_assert_eq(g->version, 3);
    check_str(g, "general.architecture", "llama");
    uint32_t u = 0;
    cr_assert_eq(tdm_gguf_get_u32(g, "llama.block_count", &u, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(u, n_layer);
    cr_assert_eq(tdm_gguf_get_u32(g, "llama.embedding_length", &u, &err), TANDEM_OK);
    cr_assert_eq(u, n_embd);
    float eps = 0;
    cr_assert_eq(tdm_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err), TANDEM_OK);
    cr_assert_float_eq(eps, 1e-5f, 1e-9f);
    const tdm_gguf_array *toks;
    cr_assert_eq(tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", TDM_GGUF_STRING, &toks, &err), TANDEM_OK);
    cr_assert_eq(toks->n, 8192);
    cr_assert(toks->strs[0].len == 13 && memcmp(toks->strs[0].ptr, "<|endoftext|>", 13) == 0);
    cr_assert_eq(g->n_tensors, n_tensors);
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, "token_embd.weight");
    cr_assert(t);
    cr_assert(t->type == TDM_F16 && t->n_dims == 2 && t->ne[0] == (int64_t)n_embd && t->ne[1] == 8192);
    cr_assert_eq(t->nbytes, n_embd * 8192 * 2);
    char name[64];
    snprintf(name, sizeof name, "blk.%u.ffn_down.weight", n_layer - 1);
    cr_assert(tdm_gguf_find_tensor(g, name), "%s", name);
    snprintf(name, sizeof name, "blk.%u.ffn_down.weight", n_layer);
    cr_assert_null(tdm_gguf_find_tensor(g, name));
    check_layout(g);
    tdm_gguf_close(g);
}

Test(gguf, real_models) {
    check_model("pycode-target-f16.gguf", 8, 384, 2 + 8 * 9);
    check_model("pycode-draft-s-f16.gguf", 2, 256, 2 + 2 * 9);
    check_model("pycode-draft-xs-f16.gguf", 2, 128, 2 + 2 * 9);
}

Test(gguf, vocab_files) {
    static const struct {
        const char *file, *arch, *model;
        uint64_t n_tokens;
    } vocabs[] = {
        {"vocab/ggml-vocab-gpt-2.gguf", "gpt2", "gpt2", 50257},
        {"vocab/ggml-vocab-llama-spm.gguf", "llama", "llama", 32000},
        {"vocab/ggml-vocab-phi-3.gguf", "phi3", "llama", 32064},
        {"vocab/ggml-vocab-starcoder.gguf", "starcoder2", "gpt2", 49152},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(vocabs); i++) {
        tdm_gguf *g = open_path(tdm_test_data_path(vocabs[i].file));
        tdm_err err = {0};
        cr_assert_eq(g->n_tensors, 0);
        check_str(g, "general.architecture", vocabs[i].arch);
        check_str(g, "tokenizer.ggml.model", vocabs[i].model);
        const tdm_gguf_array *toks;
        cr_assert_eq(tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", TDM_GGUF_STRING, &toks, &err), TANDEM_OK);
        cr_assert_eq(toks->n, vocabs[i].n_tokens, "%s", vocabs[i].file);
        const tdm_gguf_array *types;
        cr_assert_eq(tdm_gguf_get_arr(g, "tokenizer.ggml.token_type", TDM_GGUF_INT32, &types, &err),
                     TANDEM_OK, "%s", err.msg);
        cr_assert_eq(types->n, toks->n);
        tdm_gguf_close(g);
    }
}

Test(gguf, open_errors) {
    tdm_gguf *g = (tdm_gguf *)1;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open("/nonexistent/dir/x.gguf", &g, &err), TANDEM_ERR_IO);
    cr_assert_null(g);
    cr_assert(strstr(err.msg, "cannot open '/nonexistent/dir/x.gguf'"), "%s", err.msg);
    cr_assert_eq(tdm_gguf_open("/tmp", &g, &err), TANDEM_ERR_IO);
    cr_assert(strstr(err.msg, "not a regular file"), "%s", err.msg);
    char path[] = "/tmp/tdm_gguf_empty_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(tdm_gguf_open(path, &g, &err), TANDEM_ERR_FORMAT);
    cr_assert(strstr(err.msg, "truncated file"), "%s", err.msg);
    unlink(path);
    cr_assert_eq(tdm_gguf_open_memory(NULL, 10, &g, &err), TANDEM_ERR_INVALID_ARG);
    tdm_gguf_close(NULL);
}

/* --------------------------------------------------------------- getters */

Test(gguf, typed_getters) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_u32(w, "u32", 7);
    tdm_gguf_w_i32(w, "neg", -5);
    tdm_gguf_w_u64(w, "big", 1ull << 40);
    tdm_gguf_w_f32(w, "f", 2.5f);
    tdm_gguf_w_bool(w, "b", true);
    tdm_gguf_w_str(w, "s", "text");
    tdm_gguf_w_arr_i32(w, "ai", (int32_t[]){1, 2}, 2);
    uint8_t u8 = 9;
    tdm_gguf_w_raw(w, "u8", TDM_GGUF_UINT8, &u8, 1);
    file f = finish(w);
    tdm_gguf *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open_memory(f.p, f.n, &g, &err), TANDEM_OK, "%s", err.msg);

    uint32_t u = 0;
    int32_t i = 0;
    uint64_t u64 = 0;
    float x = 0;
    bool b = false;
    tdm_gguf_str s;
    const tdm_gguf_array *a;
    cr_assert(tdm_gguf_get_u32(g, "u32", &u, &err) == TANDEM_OK && u == 7);
    cr_assert(tdm_gguf_get_u32(g, "u8", &u, &err) == TANDEM_OK && u == 9, "any integer type that fits");
    cr_assert(tdm_gguf_get_i32(g, "neg", &i, &err) == TANDEM_OK && i == -5);
    cr_assert(tdm_gguf_get_i32(g, "u32", &i, &err) == TANDEM_OK && i == 7);
    cr_assert(tdm_gguf_get_u64(g, "big", &u64, &err) == TANDEM_OK && u64 == 1ull << 40);
    cr_assert_eq(tdm_gguf_get_u32(g, "neg", &u, &err), TANDEM_ERR_FORMAT);
    cr_assert(strstr(err.msg, "key 'neg' value -5 is out of range"), "%s", err.msg);
    cr_assert_eq(tdm_gguf_get_u32(g, "big", &u, &err), TANDEM_ERR_FORMAT);
    cr_assert(strstr(err.msg, "out of range"), "%s", err.msg);
    cr_assert_eq(tdm_gguf_get_i32(g, "big", &i, &err), TANDEM_ERR_FORMAT);
    cr_assert_eq(tdm_gguf_get_u32(g, "f", &u, &err), TANDEM_ERR_FORMAT);
    cr_assert_str_eq(err.msg, "key 'f' has type f32, expected an integer");
    cr_assert(tdm_gguf_get_f32(g, "f", &x, &err) == TANDEM_OK && x == 2.5f);
    cr_assert(tdm_gguf_get_f32(g, "neg", &x, &err) == TANDEM_OK && x == -5.0f, "integers are numbers");
    cr_assert_eq(tdm_gguf_get_f32(g, "s", &x, &err), TANDEM_ERR_FORMAT);
    cr_assert_str_eq(err.msg, "key 's' has type string, expected a number");
    cr_assert(tdm_gguf_get_bool(g, "b", &b, &err) == TANDEM_OK && b);
    cr_assert_eq(tdm_gguf_get_bool(g, "u32", &b, &err), TANDEM_ERR_FORMAT);
    cr_assert_str_eq(err.msg, "key 'u32' has type u32, expected bool");
    cr_assert(tdm_gguf_get_str(g, "s", &s, &err) == TANDEM_OK && s.len == 4 && !memcmp(s.ptr, "text", 4));
    cr_assert_eq(tdm_gguf_get_str(g, "ai", &s, &err), TANDEM_ERR_FORMAT);
    cr_assert_str_eq(err.msg, "key 'ai' has type array of i32, expected string");
    cr_assert_eq(tdm_gguf_get_arr(g, "ai", TDM_GGUF_STRING, &a, &err), TANDEM_ERR_FORMAT);
    cr_assert_str_eq(err.msg, "key 'ai' has type array of i32, expected array of string");
    cr_assert_eq(tdm_gguf_get_arr(g, "s", TDM_GGUF_STRING, &a, &err), TANDEM_ERR_FORMAT);
    cr_assert_eq(tdm_gguf_get_str(g, "nope", &s, &err), TANDEM_ERR_FORMAT);
    cr_assert_str_eq(err.msg, "missing required key 'nope'");

    cr_assert(tdm_gguf_opt_u32(g, "nope", 11, &u, &err) == TANDEM_OK && u == 11);
    cr_assert(tdm_gguf_opt_u32(g, "u32", 11, &u, &err) == TANDEM_OK && u == 7);
    cr_assert(tdm_gguf_opt_i32(g, "nope", -3, &i, &err) == TANDEM_OK && i == -3);
    cr_assert(tdm_gguf_opt_f32(g, "nope", 0.25f, &x, &err) == TANDEM_OK && x == 0.25f);
    cr_assert(tdm_gguf_opt_bool(g, "nope", true, &b, &err) == TANDEM_OK && b);
    cr_assert_eq(tdm_gguf_opt_u32(g, "s", 1, &u, &err), TANDEM_ERR_FORMAT, "present, wrong type");
    cr_assert_eq(tdm_gguf_opt_bool(g, "u32", false, &b, &err), TANDEM_ERR_FORMAT);
    tdm_gguf_close(g);
    free(f.p);
}

/* -------------------------------------------------------------- printing */

static char *print_key(const tdm_gguf *g, const char *key, int max_elems) {
    char *text = NULL;
    size_t len = 0;
    FILE *mf = open_memstream(&text, &len);
    const tdm_gguf_value *v = tdm_gguf_find(g, key);
    cr_assert(v, "%s", key);
    tdm_gguf_value_print(v, mf, max_elems);
    fclose(mf);
    return text;
}

Test(gguf, value_print) {
    uint8_t tdata[TDM_ARRAY_LEN(round_tensors)][256];
    file f = round_file(3, 32, tdata);
    tdm_gguf *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open_memory(f.p, f.n, &g, &err), TANDEM_OK, "%s", err.msg);
    static const struct {
        const char *key;
        int max;
        const char *want;
    } cases[] = {
        {"t.u8", 3, "200"},
        {"t.i64", 3, "-9223372036854775808"},
        {"t.u64", 3, "18446744073709551615"},
        {"t.f32", 3, "0.1"},
        {"t.f64", 3, "-2.718281828459045"},
        {"t.true", 3, "true"},
        {"t.str", 3, "\"a \\\"quoted\\\" string\\n\""},
        {"t.nul_str", 3, "\"a\\u0000b\""},
        {"t.arr_i32", 2, "[-2147483648, -1, ... (4 items)]"},
        {"t.arr_i32", 4, "[-2147483648, -1, 0, 2147483647]"},
        {"t.arr_i32", 0, "[... (4 items)]"},
        {"t.arr_str", 10, "[\"hello\", \"\", \"wörld \\\"q\\\"\\n\", \"tab\\t\"]"},
        {"t.arr_bool", 5, "[true, false]"},
        {"t.arr_empty", 5, "[]"},
        {"t.nested_i32", 5, "[[1, 2], [3], []]"},
        {"t.nested_str", 1, "[[\"x\", ... (2 items)], ... (2 items)]"},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(cases); i++) {
        char *text = print_key(g, cases[i].key, cases[i].max);
        cr_expect_str_eq(text, cases[i].want, "%s (max %d)", cases[i].key, cases[i].max);
        free(text);
    }
    tdm_gguf_close(g);
    free(f.p);

    /* a real vocabulary: [first, ..., (8192 items)] */
    g = open_path(tdm_test_model_path("pycode-target-f16.gguf"));
    char *text = print_key(g, "tokenizer.ggml.token_type", 3);
    cr_expect_str_eq(text, "[3, 1, 1, ... (8192 items)]");
    free(text);
    tdm_gguf_close(g);
}
