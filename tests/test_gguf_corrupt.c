/* test_gguf_corrupt.c - GGUF loader on corrupt input: a corpus of hand-corrupted files
 * (each rejected with the right status and a message naming the problem), truncation at
 * every offset and random byte mutations (no crash, no sanitizer report, always a message). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "gguf_testutil.h"
#include "gguf_write.h"
#include "testutil.h"

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
static void m_q4_1_not_block(file *f) { one_tensor(f, 3 /* q4_1 */, 1, (int64_t[]){48}, 40); }
static void m_q4_1_past_end(file *f) { /* declares 64 x 64 q4_1 (2560 bytes), holds 128 */
    one_tensor(f, 3, 2, (int64_t[]){64, 64}, 128);
}
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
    {"q4_1_ne0_48", m_q4_1_not_block, TANDEM_ERR_FORMAT, "ne[0] = 48 is not a multiple of the q4_1 block size 32", NULL},
    {"q4_1_past_end", m_q4_1_past_end, TANDEM_ERR_FORMAT, "'blk.0.attn_q.weight': data [", NULL},
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

/* Tensor types tandem does not compute with are no reason to refuse a file (its
 * metadata serves tokenize and info): a GGML type is sized and placed like any other,
 * a number GGML does not define gets nbytes 0 and no data. */
Test(gguf, unsupported_tensor_types_open) {
    static uint8_t data[256];
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    base_meta(w);
    tdm_gguf_w_tensor(w, "a", TDM_F32, 2, (int64_t[]){4, 2}, zeros, 32);
    tdm_gguf_w_tensor(w, "iq4_nl", 20, 2, (int64_t[]){64, 2}, data, 72); /* 4 blocks of 18 bytes */
    tdm_gguf_w_tensor(w, "q6_K", 14, 1, (int64_t[]){256}, data, 210);  /* 1 block of 210 bytes */
    tdm_gguf_w_tensor(w, "t99", 99, 1, (int64_t[]){32}, data, 128);    /* not a GGML type */
    tdm_gguf_w_tensor(w, "c", TDM_F16, 1, (int64_t[]){32}, zeros, 64);
    file f = finish(w);
    tdm_gguf *g = NULL;
    tdm_err err = {0};
    cr_assert_eq(tdm_gguf_open_memory(f.p, f.n, &g, &err), TANDEM_OK, "%s", err.msg);
    const tdm_gguf_tensor *q = tdm_gguf_find_tensor(g, "iq4_nl"), *k = tdm_gguf_find_tensor(g, "q6_K"),
                          *u = tdm_gguf_find_tensor(g, "t99"), *c = tdm_gguf_find_tensor(g, "c");
    cr_assert(q && k && u && c);
    cr_expect_eq(q->type, 20);
    cr_expect_eq(q->nbytes, 72);
    cr_expect_eq(k->nbytes, 210);
    cr_expect(q->data && k->data);
    cr_expect(!tdm_dtype_supported(q->type) && !tdm_dtype_supported(u->type));
    cr_expect_eq(u->type, 99);
    cr_expect_eq(u->nbytes, 0, "an unknown type's size is unknown");
    cr_expect_null(u->data);
    cr_expect_eq(c->nbytes, 64);
    cr_expect_eq(memcmp(c->data, zeros, 64), 0, "the tensors after the unknown one are placed");
    tdm_gguf_close(g);
    free(f.p);
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
