/* test_gguf.c - GGUF loader and writer: round trips of every value and tensor type
 * (in memory, through a file, copied value by value, streamed), writer defaults,
 * streaming errors, real model and vocabulary files, open errors, typed getters, value
 * printing, and a model packed with alignment 1.  The corrupt-input corpus lives in
 * test_gguf_corrupt.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cpu_internal.h"
#include "dtype.h"
#include "engine.h"
#include "ggml_types.h"
#include "gguf.h"
#include "gguf_testutil.h"
#include "gguf_write.h"
#include "testutil.h"
#include "tiny_model.h"

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

/* A writer holding a copy of every key of g (tdm_gguf_w_value) and its tensors: with
 * their data (stream false) or as infos to stream. */
static tdm_gguf_writer *copy_writer(const tdm_gguf *g, bool stream) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(g->version, (uint32_t)g->alignment);
    cr_assert(w);
    for (uint64_t i = 0; i < g->n_kv; i++) tdm_gguf_w_value(w, g->kv[i].key, &g->kv[i].value);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tdm_gguf_tensor *t = &g->tensors[i];
        if (stream)
            tdm_gguf_w_tensor_info(w, t->name, t->type, t->n_dims, t->ne, t->nbytes);
        else
            tdm_gguf_w_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data, (size_t)t->nbytes);
    }
    return w;
}

/* Copying every value and tensor of g (the parse of f) gives f's bytes in memory,
 * and streaming the data in pieces of odd sizes (across tensor boundaries) gives
 * them again. */
static void check_copies(const tdm_gguf *g, const file *f) {
    static const size_t pieces[] = {1, 7, 100, 4096};
    tdm_err err = {0};
    file c = finish(copy_writer(g, false));
    cr_assert(c.n == f->n && memcmp(c.p, f->p, f->n) == 0, "copied values differ");
    free(c.p);
    /* the data section: the tensors' bytes back to back, without padding */
    uint8_t data[TDM_ARRAY_LEN(round_tensors) * 256];
    size_t n_data = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        memcpy(data + n_data, g->tensors[i].data, g->tensors[i].nbytes);
        n_data += g->tensors[i].nbytes;
    }
    for (size_t pi = 0; pi < TDM_ARRAY_LEN(pieces); pi++) {
        tdm_gguf_writer *w = copy_writer(g, true);
        uint64_t head = 0, total = 0;
        cr_assert_eq(tdm_gguf_writer_sizes(w, &head, &total), TANDEM_OK);
        cr_assert_eq(total, f->n);
        cr_assert_eq(head, g->data_offset);
        uint8_t *mem = NULL;
        size_t n_mem = 0;
        cr_assert_eq(tdm_gguf_writer_finish(w, &mem, &n_mem), TANDEM_ERR_INVALID_ARG,
                     "streamed tensors cannot finish in memory");
        FILE *out = tmpfile();
        cr_assert(out);
        cr_assert_eq(tdm_gguf_stream_begin(w, out, "tmpfile", &err), TANDEM_OK, "%s", err.msg);
        for (size_t at = 0; at < n_data; at += pieces[pi]) {
            size_t k = TDM_MIN(pieces[pi], n_data - at);
            cr_assert_eq(tdm_gguf_stream_write(w, data + at, k, &err), TANDEM_OK, "%s", err.msg);
        }
        cr_assert_eq(tdm_gguf_stream_end(w, &err), TANDEM_OK, "%s", err.msg);
        tdm_gguf_writer_free(w);
        long size = ftell(out);
        cr_assert_eq(size, (long)f->n, "pieces of %zu: %ld bytes, want %zu", pieces[pi], size, f->n);
        uint8_t *back = malloc(f->n);
        rewind(out);
        cr_assert_eq(fread(back, 1, f->n, out), f->n);
        cr_assert(memcmp(back, f->p, f->n) == 0, "pieces of %zu: bytes differ", pieces[pi]);
        free(back);
        fclose(out);
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
            check_copies(g, &f);
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

/* ------------------------------------------------------------ streaming */

Test(gguf, stream_errors) {
    int64_t ne[2] = {32, 2};
    uint8_t data[200] = {0};
    tdm_err err = {0};
    /* more data than declared, then fewer */
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_str(w, "k", "v");
    tdm_gguf_w_tensor_info(w, "a", TDM_Q8_0, 2, ne, 2 * 34);
    FILE *out = tmpfile();
    cr_assert_eq(tdm_gguf_stream_begin(w, out, "tmpfile", &err), TANDEM_OK, "%s", err.msg);
    tdm_gguf_w_str(w, "late", "x");
    cr_assert_eq(tdm_gguf_stream_write(w, data, 69, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "more data"), "%s", err.msg);
    tdm_gguf_writer_free(w);
    fclose(out);

    w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_tensor_info(w, "a", TDM_Q8_0, 2, ne, 2 * 34);
    tdm_gguf_w_tensor_info(w, "b", TDM_Q8_0, 2, ne, 2 * 34);
    out = tmpfile();
    cr_assert_eq(tdm_gguf_stream_begin(w, out, "tmpfile", &err), TANDEM_OK);
    cr_assert_eq(tdm_gguf_stream_write(w, data, 100, &err), TANDEM_OK);
    cr_assert_eq(tdm_gguf_stream_end(w, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "'b' got 32 of its 68 bytes"), "%s", err.msg);
    tdm_gguf_writer_free(w);
    fclose(out);

    /* a tensor with its data in memory cannot be streamed */
    w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_tensor(w, "a", TDM_Q8_0, 2, ne, data, 2 * 34);
    out = tmpfile();
    cr_assert_eq(tdm_gguf_stream_begin(w, out, "tmpfile", &err), TANDEM_ERR_INVALID_ARG);
    tdm_gguf_writer_free(w);
    fclose(out);

    /* a full disk: the OS error is reported with the name */
    out = fopen("/dev/full", "wb");
    if (!out) return;
    w = tdm_gguf_writer_new(3, 32);
    int64_t big[1] = {1 << 20};
    tdm_gguf_w_tensor_info(w, "big", TDM_F32, 1, big, 4u << 20);
    tandem_status st = tdm_gguf_stream_begin(w, out, "/dev/full", &err);
    uint8_t *chunk = calloc(1, 4u << 20);
    if (!st) st = tdm_gguf_stream_write(w, chunk, 4u << 20, &err);
    if (!st) st = tdm_gguf_stream_end(w, &err);
    cr_assert_eq(st, TANDEM_ERR_IO);
    cr_assert(strstr(err.msg, "/dev/full") && strstr(err.msg, "No space left"), "%s", err.msg);
    free(chunk);
    tdm_gguf_writer_free(w);
    fclose(out);
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

/* Released pages of a mapped file read back unchanged; ranges outside the
 * mapping and NULL are ignored. */
Test(gguf, release_reads_back) {
    tdm_gguf *g = open_path(tdm_test_model_path("pycode-target-f16.gguf"));
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, "blk.3.ffn_up.weight");
    cr_assert(t);
    uint8_t *copy = malloc(t->nbytes);
    cr_assert(copy);
    memcpy(copy, t->data, t->nbytes);
    tdm_gguf_release(g, t->data, t->nbytes);
    cr_assert(memcmp(copy, t->data, t->nbytes) == 0, "released pages read back differently");
    tdm_gguf_release(g, copy, t->nbytes); /* not in the mapping: ignored */
    tdm_gguf_release(g, NULL, 10);
    tdm_gguf_release(NULL, t->data, 10);
    cr_assert(memcmp(copy, t->data, t->nbytes) == 0);
    free(copy);
    tdm_gguf_close(g);
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

/* The GGML type table (src/gguf/ggml_types.c, which sizes the tensors of types tandem does
 * not compute with) agrees with the block structs of every supported type (dtype.c). */
Test(gguf, ggml_type_table_matches_supported_types) {
    int n = 0;
    for (uint32_t t = 0; t < 64; t++) {
        if (!tdm_dtype_supported(t)) continue;
        uint32_t be = 0, bb = 0;
        cr_assert(tdm_ggml_type_block(t, &be, &bb), "type %u: not in the GGML table", t);
        cr_expect_eq(be, tdm_dtype_block_elems(t), "type %s: block elements", tdm_dtype_name(t));
        cr_expect_eq(bb, tdm_dtype_block_bytes(t), "type %s: block bytes", tdm_dtype_name(t));
        cr_expect(strcasecmp(tdm_ggml_type_name(t), tdm_dtype_name(t)) == 0, "type %u: named %s and %s", t,
                  tdm_ggml_type_name(t), tdm_dtype_name(t));
        n++;
    }
    cr_assert_geq(n, 13);
}

/* ------------------------------------------------------------ alignment */

/* A model written with general.alignment = 1 (legal: tensors packed back to back at
 * any byte) loads and computes the logits of the same model written with the default
 * 32, bit for bit, at the scalar level and the CPU's best, for each weight type: no
 * kernel reads a misaligned value (the sanitizer build reports one). */
static float *packed_logits(const tdm_tiny_cfg *c, const int32_t *ids, int32_t n, bool *misaligned) {
    char *path = tdm_tiny_model_file(c);
    tdm_err err = {0};
    tdm_gguf *g = open_path(path);
    *misaligned = false;
    for (uint64_t i = 0; i < g->n_tensors; i++) *misaligned |= (uintptr_t)g->tensors[i].data % 4 != 0;
    tdm_gguf_close(g);
    tdm_backend *be = NULL;
    tdm_model *m = NULL;
    cr_assert_eq(tdm_backend_cpu_create(1, &be, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_model_load(path, be, &m, &err), TANDEM_OK, "%s: %s", tdm_dtype_name(c->wtype), err.msg);
    tdm_engine *e = tdm_test_engine(m, NULL, 1);
    float *out = malloc((size_t)c->n_vocab * sizeof(float));
    cr_assert_eq(tdm_engine_score_last(e, false, ids, n, out, &err), TANDEM_OK, "%s", err.msg);
    tdm_engine_free(e);
    tdm_model_free(m);
    tdm_backend_destroy(be);
    unlink(path);
    free(path);
    return out;
}

Test(gguf, alignment_one_loads_as_aligned, .timeout = 120) {
    static const uint32_t types[] = {TDM_F32, TDM_F16, TDM_BF16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_K, TDM_Q6_K};
    static const char *const levels[] = {"scalar", NULL};
    const int32_t ids[] = {1, 5, 2, 9, 3, 3, 7, 0, 4};
    for (size_t l = 0; l < TDM_ARRAY_LEN(levels); l++) {
        if (levels[l]) tdm_cpu_cap_level(TDM_CPU_SCALAR);
        for (size_t i = 0; i < TDM_ARRAY_LEN(types); i++) {
            tdm_tiny_cfg c = tdm_tiny_default();
            c.n_embd = c.n_ff = 256; /* (whole K-quant super-blocks) */
            c.wtype = types[i];
            bool mis = false;
            float *want = packed_logits(&c, ids, 9, &mis);
            c.alignment = 1;
            float *got = packed_logits(&c, ids, 9, &mis);
            cr_assert(mis, "%s: no tensor of the packed file is misaligned (the test would prove nothing)",
                      tdm_dtype_name(c.wtype));
            for (int32_t v = 0; v < c.n_vocab; v++)
                cr_assert(memcmp(&got[v], &want[v], sizeof(float)) == 0, "%s (%s): logit %d is %g, aligned %g",
                          tdm_dtype_name(c.wtype), levels[l] ? levels[l] : "best level", (int)v, (double)got[v],
                          (double)want[v]);
            free(got);
            free(want);
        }
        tdm_cpu_cap_level(TDM_CPU_N_LEVELS);
    }
}
