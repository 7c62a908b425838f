/* gguf.c - hardened GGUF (v2/v3) parser over a memory-mapped file or a caller buffer.
 *
 * File layout (all little-endian):
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   n_kv x { string key; u32 type; value }
 *   n_tensors x { string name; u32 n_dims; u64 ne[n_dims]; u32 ggml_type; u64 offset }
 *   padding to `alignment`, then the data section (tensor offsets are relative to it).
 *   string = u64 length + bytes (no NUL); array = u32 elem type + u64 count + elements.
 *
 * Every read goes through need(), which checks the remaining bytes first, so a corrupt
 * file can never make the parser read past the buffer; every declared count is
 * checked against the bytes left (times the smallest possible element size) before
 * anything is allocated for it.
 */
#include "gguf.h"
#include "ggml_types.h"
#include "json.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32

/* ------------------------------------------------------------------ types */

static const char *const type_names[TDM_GGUF_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

const char *tdm_gguf_type_name(uint32_t type) {
    return type < TDM_GGUF_TYPE_COUNT ? type_names[type] : "unknown";
}

/* Size in bytes of a scalar type; 0 for STRING, ARRAY and unknown types. */
uint64_t tdm_gguf_scalar_size(uint32_t type) {
    switch (type) {
    case TDM_GGUF_UINT8: case TDM_GGUF_INT8: case TDM_GGUF_BOOL: return 1;
    case TDM_GGUF_UINT16: case TDM_GGUF_INT16: return 2;
    case TDM_GGUF_UINT32: case TDM_GGUF_INT32: case TDM_GGUF_FLOAT32: return 4;
    case TDM_GGUF_UINT64: case TDM_GGUF_INT64: case TDM_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static uint64_t rd_le(const uint8_t *p, unsigned n) {
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Decodes a scalar at p (tdm_gguf_scalar_size(type) bytes) into a value. */
static void decode_scalar(uint32_t type, const uint8_t *p, tdm_gguf_value *out) {
    out->type = type;
    uint64_t raw = rd_le(p, (unsigned)tdm_gguf_scalar_size(type));
    switch (type) {
    case TDM_GGUF_UINT8: case TDM_GGUF_UINT16: case TDM_GGUF_UINT32: case TDM_GGUF_UINT64:
        out->v.u64 = raw;
        break;
    case TDM_GGUF_INT8: out->v.i64 = (int8_t)raw; break;
    case TDM_GGUF_INT16: out->v.i64 = (int16_t)raw; break;
    case TDM_GGUF_INT32: out->v.i64 = (int32_t)raw; break;
    case TDM_GGUF_INT64: out->v.i64 = (int64_t)raw; break;
    case TDM_GGUF_FLOAT32: {
        uint32_t u = (uint32_t)raw;
        float f;
        memcpy(&f, &u, 4);
        out->v.f64 = f;
        break;
    }
    case TDM_GGUF_FLOAT64: memcpy(&out->v.f64, &raw, 8); break;
    case TDM_GGUF_BOOL: out->v.b = raw != 0; break;
    default: break;
    }
}

/* ------------------------------------------------------------ hash index */

/* Open addressing (linear probing) over FNV-1a; slots hold index + 1 (0 = empty). */
typedef struct name_table {
    uint32_t *slots; /* [cap] */
    uint64_t cap;    /* power of two, >= 2 * entries */
} name_table;

typedef struct gguf_index {
    name_table keys;
    name_table tensors;
} gguf_index;

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static bool table_init(name_table *t, uint64_t n) {
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    t->slots = tdm_calloc((size_t)cap, sizeof *t->slots);
    t->cap = cap;
    return t->slots != NULL;
}

/* Finds name; `name_at(i)` gives the name of entry i.  Returns the slot (empty if absent). */
#define TABLE_PROBE(t, name, name_at, slot_out)                                   \
    do {                                                                          \
        uint64_t m_ = (t)->cap - 1, s_ = fnv1a(name) & m_;                        \
        while ((t)->slots[s_] && strcmp(name_at((t)->slots[s_] - 1), (name)) != 0) \
            s_ = (s_ + 1) & m_;                                                   \
        (slot_out) = s_;                                                          \
    } while (0)

/* ---------------------------------------------------------------- parser */

typedef struct parser {
    const uint8_t *buf;
    size_t size;
    uint64_t pos;
    tdm_err *err;
    char ctx[128]; /* what is being parsed: "key 'general.name'", "tensor 'x'" */
} parser;

static tandem_status need(parser *p, uint64_t n, const char *what) {
    if (n <= p->size - p->pos) return TANDEM_OK;
    return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                      "truncated file: need %" PRIu64 " bytes at offset %" PRIu64
                      " for %s%s%s, file is %zu bytes",
                      n, p->pos, what, p->ctx[0] ? " of " : "", p->ctx, p->size);
}

static tandem_status rd_u32(parser *p, uint32_t *out, const char *what) {
    tandem_status st = need(p, 4, what);
    if (st) return st;
    *out = (uint32_t)rd_le(p->buf + p->pos, 4);
    p->pos += 4;
    return TANDEM_OK;
}

static tandem_status rd_u64(parser *p, uint64_t *out, const char *what) {
    tandem_status st = need(p, 8, what);
    if (st) return st;
    *out = rd_le(p->buf + p->pos, 8);
    p->pos += 8;
    return TANDEM_OK;
}

static uint64_t remaining(const parser *p) { return p->size - p->pos; }

/* Reads a string (u64 length + bytes) whose bytes stay in the buffer. */
static tandem_status rd_str(parser *p, tdm_gguf_str *out, uint64_t max_len, const char *what) {
    uint64_t at = p->pos, len;
    tandem_status st = rd_u64(p, &len, what);
    if (st) return st;
    if (len > max_len)
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                          "%s%s%s at offset %" PRIu64 " has length %" PRIu64
                          ", over the limit of %" PRIu64 " bytes",
                          what, p->ctx[0] ? " of " : "", p->ctx, at, len, max_len);
    if ((st = need(p, len, what))) return st;
    out->ptr = (const char *)p->buf + p->pos;
    out->len = len;
    p->pos += len;
    return TANDEM_OK;
}

/* Reads a key or tensor name: non-empty, no NUL byte, at most TDM_GGUF_MAX_KEY bytes. */
static tandem_status rd_name(parser *p, char **out, const char *what) {
    uint64_t at = p->pos;
    tdm_gguf_str s;
    tandem_status st = rd_str(p, &s, TDM_GGUF_MAX_KEY, what);
    if (st) return st;
    if (s.len == 0)
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT, "%s of %s at offset %" PRIu64 " is empty", what,
                          p->ctx, at);
    if (memchr(s.ptr, 0, s.len))
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                          "%s '%.64s' (of %s at offset %" PRIu64 ") contains a NUL byte", what, s.ptr,
                          p->ctx, at);
    *out = tdm_strndup(s.ptr, (size_t)s.len);
    if (!*out) return tdm_seterr(p->err, TANDEM_ERR_NOMEM, "out of memory");
    return TANDEM_OK;
}

static void value_free(tdm_gguf_value *v) {
    if (v->type != TDM_GGUF_ARRAY) return;
    free(v->v.arr.strs);
    if (v->v.arr.elems) {
        for (uint64_t i = 0; i < v->v.arr.n; i++) value_free(&v->v.arr.elems[i]);
        free(v->v.arr.elems);
    }
    v->v.arr.strs = NULL;
    v->v.arr.elems = NULL;
}

static tandem_status parse_value(parser *p, uint32_t type, int depth, tdm_gguf_value *out);

static tandem_status check_bools(parser *p, const uint8_t *b, uint64_t n, uint64_t at) {
    for (uint64_t i = 0; i < n; i++)
        if (b[i] > 1)
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                              "bool value %u at offset %" PRIu64 " of %s is not 0 or 1", b[i],
                              at + i, p->ctx);
    return TANDEM_OK;
}

/* Parses an array body (after the ARRAY type tag); depth = nesting of this array (1 = top). */
static tandem_status parse_array(parser *p, int depth, tdm_gguf_value *out) {
    tdm_gguf_array *a = &out->v.arr;
    memset(a, 0, sizeof *a);
    if (depth > TDM_GGUF_MAX_DEPTH)
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                          "%s: arrays nested deeper than %d levels at offset %" PRIu64, p->ctx,
                          TDM_GGUF_MAX_DEPTH, p->pos);
    uint64_t at = p->pos, n;
    uint32_t et;
    tandem_status st;
    if ((st = rd_u32(p, &et, "the array element type"))) return st;
    if (et >= TDM_GGUF_TYPE_COUNT)
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                          "%s: array at offset %" PRIu64 " has unknown element type %" PRIu32,
                          p->ctx, at, et);
    if ((st = rd_u64(p, &n, "the array length"))) return st;
    /* Smallest encoding of one element: scalars their size, a string its u64 length,
     * a nested array its u32 type + u64 count. */
    uint64_t min_elem = et == TDM_GGUF_STRING ? 8 : et == TDM_GGUF_ARRAY ? 12 : tdm_gguf_scalar_size(et);
    uint64_t min_bytes;
    if (n > TDM_GGUF_MAX_ARRAY || tdm_mul_overflow_u64(n, min_elem, &min_bytes) ||
        min_bytes > remaining(p))
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                          "%s: array at offset %" PRIu64 " declares %" PRIu64
                          " elements of type %s, more than %s (%" PRIu64 " bytes left)",
                          p->ctx, at, n, tdm_gguf_type_name(et),
                          n > TDM_GGUF_MAX_ARRAY ? "the limit" : "the file holds", remaining(p));
    a->type = et;
    a->n = n;
    a->data = p->buf + p->pos;
    if (et == TDM_GGUF_STRING) {
        if (n && !(a->strs = tdm_mallocarray((size_t)n, sizeof *a->strs)))
            return tdm_seterr(p->err, TANDEM_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; i < n; i++)
            if ((st = rd_str(p, &a->strs[i], TDM_GGUF_MAX_STRING, "an array string"))) return st;
    } else if (et == TDM_GGUF_ARRAY) {
        if (n && !(a->elems = tdm_calloc((size_t)n, sizeof *a->elems)))
            return tdm_seterr(p->err, TANDEM_ERR_NOMEM, "out of memory");
        for (uint64_t i = 0; i < n; i++) {
            a->elems[i].type = TDM_GGUF_ARRAY;
            if ((st = parse_array(p, depth + 1, &a->elems[i]))) return st;
        }
    } else {
        if (et == TDM_GGUF_BOOL && (st = check_bools(p, p->buf + p->pos, n, p->pos))) return st;
        p->pos += min_bytes;
    }
    return TANDEM_OK;
}

static tandem_status parse_value(parser *p, uint32_t type, int depth, tdm_gguf_value *out) {
    memset(out, 0, sizeof *out);
    out->type = type;
    if (type == TDM_GGUF_STRING) return rd_str(p, &out->v.str, TDM_GGUF_MAX_STRING, "the string");
    if (type == TDM_GGUF_ARRAY) return parse_array(p, depth + 1, out);
    uint64_t sz = tdm_gguf_scalar_size(type);
    tandem_status st = need(p, sz, "the value");
    if (st) return st;
    if (type == TDM_GGUF_BOOL && (st = check_bools(p, p->buf + p->pos, 1, p->pos))) return st;
    decode_scalar(type, p->buf + p->pos, out);
    p->pos += sz;
    return TANDEM_OK;
}

static tandem_status parse_kvs(parser *p, tdm_gguf *g, gguf_index *ix) {
    tandem_status st;
    if (!table_init(&ix->keys, g->n_kv)) return tdm_seterr(p->err, TANDEM_ERR_NOMEM, "out of memory");
    if (g->n_kv && !(g->kv = tdm_calloc((size_t)g->n_kv, sizeof *g->kv)))
        return tdm_seterr(p->err, TANDEM_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_kv; i++) {
        tdm_gguf_kv *kv = &g->kv[i];
        kv->value.type = TDM_GGUF_UINT8; /* nothing to free until parsed */
        snprintf(p->ctx, sizeof p->ctx, "metadata pair %" PRIu64, i);
        uint64_t at = p->pos;
        if ((st = rd_name(p, &kv->key, "the key"))) return st;
#define KEY_AT(j) (g->kv[(j)].key)
        uint64_t slot;
        TABLE_PROBE(&ix->keys, kv->key, KEY_AT, slot);
#undef KEY_AT
        if (ix->keys.slots[slot])
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT, "duplicate key '%.128s' at offset %" PRIu64,
                              kv->key, at);
        ix->keys.slots[slot] = (uint32_t)(i + 1);
        snprintf(p->ctx, sizeof p->ctx, "key '%.100s'", kv->key);
        uint32_t type;
        uint64_t type_at = p->pos;
        if ((st = rd_u32(p, &type, "the value type"))) return st;
        if (type >= TDM_GGUF_TYPE_COUNT)
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                              "key '%.128s' has unknown value type %" PRIu32 " at offset %" PRIu64,
                              kv->key, type, type_at);
        if ((st = parse_value(p, type, 0, &kv->value))) return st;
    }
    return TANDEM_OK;
}

static tandem_status read_alignment(parser *p, tdm_gguf *g, gguf_index *ix) {
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    const tdm_gguf_value *v = tdm_gguf_find(g, "general.alignment");
    if (!v) return TANDEM_OK;
    if (v->type != TDM_GGUF_UINT32)
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT, "key 'general.alignment' has type %s, expected u32",
                          tdm_gguf_type_name(v->type));
    uint64_t a = v->v.u64;
    if (a == 0 || (a & (a - 1)) != 0)
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                          "key 'general.alignment' is %" PRIu64 ", not a nonzero power of two", a);
    g->alignment = a;
    (void)ix;
    return TANDEM_OK;
}

static tandem_status parse_tensor_info(parser *p, tdm_gguf *g, gguf_index *ix, uint64_t i) {
    tdm_gguf_tensor *t = &g->tensors[i];
    tandem_status st;
    snprintf(p->ctx, sizeof p->ctx, "tensor info %" PRIu64, i);
    uint64_t at = p->pos;
    if ((st = rd_name(p, &t->name, "the tensor name"))) return st;
#define TNAME_AT(j) (g->tensors[(j)].name)
    uint64_t slot;
    TABLE_PROBE(&ix->tensors, t->name, TNAME_AT, slot);
#undef TNAME_AT
    if (ix->tensors.slots[slot])
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT, "duplicate tensor name '%.128s' at offset %" PRIu64,
                          t->name, at);
    ix->tensors.slots[slot] = (uint32_t)(i + 1);
    snprintf(p->ctx, sizeof p->ctx, "tensor '%.100s'", t->name);
    const char *nm = t->name;
    if ((st = rd_u32(p, &t->n_dims, "the dimension count"))) return st;
    if (t->n_dims < 1 || t->n_dims > TDM_GGUF_MAX_DIMS)
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT, "tensor '%.128s' has %" PRIu32
                          " dimensions (n_dims must be 1..%d)", nm, t->n_dims, TDM_GGUF_MAX_DIMS);
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < TDM_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t ne;
        if ((st = rd_u64(p, &ne, "a dimension"))) return st;
        if (ne == 0 || ne > (uint64_t)INT64_MAX)
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT, "tensor '%.128s' has invalid dimension ne[%" PRIu32
                              "] = %" PRIu64 " (must be >= 1)", nm, d, ne);
        if (tdm_mul_overflow_u64(nelem, ne, &nelem) || nelem > (uint64_t)INT64_MAX)
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                              "tensor '%.128s': the element count overflows (dims product)", nm);
        t->ne[d] = (int64_t)ne;
    }
    if ((st = rd_u32(p, &t->type, "the tensor type"))) return st;
    /* a type tandem does not compute with is still sized when GGML defines it (its
     * data is then placed and checked like any other); of an unknown number the size
     * is unknown: nbytes stays 0 and data NULL */
    uint32_t be, bb;
    if (tdm_dtype_supported(t->type)) {
        be = tdm_dtype_block_elems(t->type);
        bb = tdm_dtype_block_bytes(t->type);
    } else if (!tdm_ggml_type_block(t->type, &be, &bb)) {
        be = bb = 0;
    }
    if (be) {
        const char *tn = tdm_dtype_supported(t->type) ? tdm_dtype_name(t->type) : tdm_ggml_type_name(t->type);
        if ((uint64_t)t->ne[0] % be != 0)
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                              "tensor '%.128s': ne[0] = %" PRId64 " is not a multiple of the %s block size %" PRIu32,
                              nm, t->ne[0], tn, be);
        if (tdm_mul_overflow_u64((uint64_t)t->ne[0] / be, bb, &t->nbytes) ||
            tdm_mul_overflow_u64(t->nbytes, nelem / (uint64_t)t->ne[0], &t->nbytes))
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT, "tensor '%.128s': the data size overflows", nm);
    }
    if ((st = rd_u64(p, &t->offset, "the data offset"))) return st;
    if (t->offset % g->alignment != 0)
        return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                          "tensor '%.128s': data offset %" PRIu64 " is not a multiple of the alignment %" PRIu64,
                          nm, t->offset, g->alignment);
    return TANDEM_OK;
}

static int cmp_by_offset(const void *a, const void *b, void *ctx) {
    const tdm_gguf_tensor *ts = ctx;
    uint64_t oa = ts[*(const uint32_t *)a].offset, ob = ts[*(const uint32_t *)b].offset;
    return oa < ob ? -1 : oa > ob;
}

/* Places every tensor inside the data section and checks that none overlap. */
static tandem_status place_tensors(parser *p, tdm_gguf *g) {
    uint64_t data_end = g->size;
    uint64_t n_sized = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        tdm_gguf_tensor *t = &g->tensors[i];
        uint64_t start, end;
        if (!t->nbytes) continue; /* a type of unknown size: its data cannot be placed */
        n_sized++;
        if (tdm_add_overflow_u64(g->data_offset, t->offset, &start) ||
            tdm_add_overflow_u64(start, t->nbytes, &end))
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                              "tensor '%.128s': data offset %" PRIu64 " + %" PRIu64
                              " bytes overflows (file size %zu)", t->name, t->offset, t->nbytes, g->size);
        if (end > data_end)
            return tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                              "tensor '%.128s': data [%" PRIu64 ", %" PRIu64
                              ") extends past the end of the file (size %zu)",
                              t->name, start, end, g->size);
        t->data = g->base + start;
    }
    if (n_sized < 2) return TANDEM_OK;
    uint32_t *order = tdm_mallocarray((size_t)n_sized, sizeof *order); /* [n_sized] by offset */
    if (!order) return tdm_seterr(p->err, TANDEM_ERR_NOMEM, "out of memory");
    n_sized = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].nbytes) order[n_sized++] = (uint32_t)i;
    qsort_r(order, (size_t)n_sized, sizeof *order, cmp_by_offset, g->tensors);
    tandem_status st = TANDEM_OK;
    for (uint64_t i = 1; i < n_sized; i++) {
        const tdm_gguf_tensor *a = &g->tensors[order[i - 1]], *b = &g->tensors[order[i]];
        if (a->offset + a->nbytes > b->offset) {
            st = tdm_seterr(p->err, TANDEM_ERR_FORMAT,
                            "tensors '%.80s' [%" PRIu64 ", %" PRIu64 ") and '%.80s' [%" PRIu64 ", %" PRIu64
                            ") overlap in the data section",
                            a->name, a->offset, a->offset + a->nbytes, b->name, b->offset,
                            b->offset + b->nbytes);
            break;
        }
    }
    free(order);
    return st;
}

static tandem_status parse(tdm_gguf *g, tdm_err *err) {
    parser p = {.buf = g->base, .size = g->size, .pos = 0, .err = err};
    tandem_status st;
    uint32_t magic;
    if ((st = rd_u32(&p, &magic, "the magic"))) return st;
    if (memcmp(g->base, "GGUF", 4) != 0)
        return tdm_seterr(err, TANDEM_ERR_FORMAT,
                          "bad magic: not a GGUF file (first bytes %02x %02x %02x %02x, expected \"GGUF\")",
                          g->base[0], g->base[1], g->base[2], g->base[3]);
    if ((st = rd_u32(&p, &g->version, "the version"))) return st;
    if (g->version != 2 && g->version != 3) {
        uint32_t v = g->version;
        bool swapped = (v & 0xffff) == 0 && (__builtin_bswap32(v) == 2 || __builtin_bswap32(v) == 3);
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "unsupported GGUF version %" PRIu32
                          " (supported: 2, 3)%s", v, swapped ? "; the file looks big-endian" : "");
    }
    if ((st = rd_u64(&p, &g->n_tensors, "the tensor count"))) return st;
    if ((st = rd_u64(&p, &g->n_kv, "the metadata count"))) return st;
    /* a metadata pair takes at least 14 bytes, a tensor info at least 33 */
    if (g->n_kv > TDM_GGUF_MAX_KV || g->n_kv > remaining(&p) / 14)
        return tdm_seterr(err, TANDEM_ERR_FORMAT,
                          "metadata count %" PRIu64 " is more than %s (file is %zu bytes)", g->n_kv,
                          g->n_kv > TDM_GGUF_MAX_KV ? "the limit" : "the file can hold", g->size);
    if (g->n_tensors > TDM_GGUF_MAX_TENSORS || g->n_tensors > remaining(&p) / 33)
        return tdm_seterr(err, TANDEM_ERR_FORMAT,
                          "tensor count %" PRIu64 " is more than %s (file is %zu bytes)", g->n_tensors,
                          g->n_tensors > TDM_GGUF_MAX_TENSORS ? "the limit" : "the file can hold", g->size);
    gguf_index *ix = calloc(1, sizeof *ix);
    if (!ix) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    g->hash = ix;
    if ((st = parse_kvs(&p, g, ix))) return st;
    p.ctx[0] = 0;
    if ((st = read_alignment(&p, g, ix))) return st;
    if (!table_init(&ix->tensors, g->n_tensors)) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    if (g->n_tensors && !(g->tensors = tdm_calloc((size_t)g->n_tensors, sizeof *g->tensors)))
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((st = parse_tensor_info(&p, g, ix, i))) return st;
    p.ctx[0] = 0;
    uint64_t pad = (g->alignment - p.pos % g->alignment) % g->alignment;
    if (tdm_add_overflow_u64(p.pos, pad, &g->data_offset) || g->data_offset > g->size) {
        if (g->n_tensors > 0)
            return tdm_seterr(err, TANDEM_ERR_FORMAT,
                              "truncated file: the data section would start at offset %" PRIu64
                              " (after alignment padding), file is %zu bytes", p.pos + pad, g->size);
        g->data_offset = g->size; /* no tensors: trailing padding may be absent */
    }
    return place_tensors(&p, g);
}

/* ----------------------------------------------------------- open/close */

static tandem_status open_common(tdm_gguf *g, tdm_gguf **out, tdm_err *err) {
    tandem_status st = parse(g, err);
    if (st) {
        tdm_gguf_close(g);
        return st;
    }
    *out = g;
    return TANDEM_OK;
}

tandem_status tdm_gguf_open_memory(const void *buf, size_t size, tdm_gguf **out, tdm_err *err) {
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tdm_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!buf && size)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tdm_gguf_open_memory: NULL buffer");
    tdm_gguf *g = calloc(1, sizeof *g);
    if (!g) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    static const uint8_t empty[1];
    g->base = buf ? buf : empty;
    g->size = size;
    return open_common(g, out, err);
}

tandem_status tdm_gguf_open(const char *path, tdm_gguf **out, tdm_err *err) {
    if (!out || !path) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tdm_gguf_open: NULL argument");
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return tdm_seterr(err, TANDEM_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return tdm_seterr(err, TANDEM_ERR_IO, "cannot stat '%s': %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return tdm_seterr(err, TANDEM_ERR_IO, "cannot open '%s': not a regular file", path);
    }
    if ((uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return tdm_seterr(err, TANDEM_ERR_IO, "cannot map '%s': file too large", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return tdm_seterr(err, TANDEM_ERR_IO, "cannot map '%s': %s", path, strerror(e));
        }
    }
    close(fd);
    tdm_gguf *g = calloc(1, sizeof *g);
    if (!g) {
        if (map) munmap(map, size);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    static const uint8_t empty[1];
    g->map = map;
    g->map_size = size;
    g->base = map ? map : empty;
    g->size = size;
    return open_common(g, out, err);
}

void tdm_gguf_release(const tdm_gguf *g, const void *p, size_t n) {
    if (!g || !g->map || !p || n == 0) return;
    uintptr_t lo = (uintptr_t)p, hi = lo + n, m0 = (uintptr_t)g->map, m1 = m0 + g->map_size;
    if (lo < m0 || hi > m1 || hi < lo) return;
    long ps = sysconf(_SC_PAGESIZE);
    if (ps <= 0) return;
    uintptr_t a = (lo + (uintptr_t)ps - 1) / (uintptr_t)ps * (uintptr_t)ps, b = hi / (uintptr_t)ps * (uintptr_t)ps;
    if (b > a) (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice only: failure changes nothing */
}

void tdm_gguf_close(tdm_gguf *g) {
    if (!g) return;
    if (g->kv) {
        for (uint64_t i = 0; i < g->n_kv; i++) {
            free(g->kv[i].key);
            value_free(&g->kv[i].value);
        }
        free(g->kv);
    }
    if (g->tensors) {
        for (uint64_t i = 0; i < g->n_tensors; i++) free(g->tensors[i].name);
        free(g->tensors);
    }
    gguf_index *ix = g->hash;
    if (ix) {
        free(ix->keys.slots);
        free(ix->tensors.slots);
        free(ix);
    }
    if (g->map) munmap(g->map, g->map_size);
    free(g);
}

/* ---------------------------------------------------------------- lookup */

const tdm_gguf_value *tdm_gguf_find(const tdm_gguf *g, const char *key) {
    if (!g || !key || !g->hash || !g->kv) return NULL;
    const gguf_index *ix = g->hash;
#define KEY_AT(j) (g->kv[(j)].key)
    uint64_t slot;
    TABLE_PROBE(&ix->keys, key, KEY_AT, slot);
#undef KEY_AT
    uint32_t s = ix->keys.slots[slot];
    return s ? &g->kv[s - 1].value : NULL;
}

const tdm_gguf_tensor *tdm_gguf_find_tensor(const tdm_gguf *g, const char *name) {
    if (!g || !name || !g->hash || !g->tensors) return NULL;
    const gguf_index *ix = g->hash;
#define TNAME_AT(j) (g->tensors[(j)].name)
    uint64_t slot;
    TABLE_PROBE(&ix->tensors, name, TNAME_AT, slot);
#undef TNAME_AT
    uint32_t s = ix->tensors.slots[slot];
    return s ? &g->tensors[s - 1] : NULL;
}

/* --------------------------------------------------------------- getters */

static bool is_unsigned(uint32_t t) {
    return t == TDM_GGUF_UINT8 || t == TDM_GGUF_UINT16 || t == TDM_GGUF_UINT32 || t == TDM_GGUF_UINT64;
}
static bool is_signed(uint32_t t) {
    return t == TDM_GGUF_INT8 || t == TDM_GGUF_INT16 || t == TDM_GGUF_INT32 || t == TDM_GGUF_INT64;
}

static tandem_status lookup(const tdm_gguf *g, const char *key, const tdm_gguf_value **v, tdm_err *err) {
    if (!g || !key) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gguf getter: NULL argument");
    *v = tdm_gguf_find(g, key);
    if (!*v) return tdm_seterr(err, TANDEM_ERR_FORMAT, "missing required key '%s'", key);
    return TANDEM_OK;
}

static tandem_status wrong_type(const char *key, const tdm_gguf_value *v, const char *expected, tdm_err *err) {
    if (v->type == TDM_GGUF_ARRAY)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "key '%s' has type array of %s, expected %s", key,
                          tdm_gguf_type_name(v->v.arr.type), expected);
    return tdm_seterr(err, TANDEM_ERR_FORMAT, "key '%s' has type %s, expected %s", key,
                      tdm_gguf_type_name(v->type), expected);
}

/* An integer value within [lo, hi] (as signed 128-bit-free comparisons). */
static tandem_status get_int(const tdm_gguf *g, const char *key, int64_t lo, uint64_t hi, uint64_t *bits,
                             tdm_err *err) {
    const tdm_gguf_value *v;
    tandem_status st = lookup(g, key, &v, err);
    if (st) return st;
    if (is_unsigned(v->type)) {
        if (v->v.u64 > hi)
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "key '%s' value %" PRIu64 " is out of range (max %" PRIu64 ")",
                              key, v->v.u64, hi);
        *bits = v->v.u64;
        return TANDEM_OK;
    }
    if (is_signed(v->type)) {
        int64_t x = v->v.i64;
        if (x < lo || (x > 0 && (uint64_t)x > hi))
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "key '%s' value %" PRId64 " is out of range [%" PRId64
                              ", %" PRIu64 "]", key, x, lo, hi);
        *bits = (uint64_t)x;
        return TANDEM_OK;
    }
    return wrong_type(key, v, "an integer", err);
}

tandem_status tdm_gguf_get_u32(const tdm_gguf *g, const char *key, uint32_t *out, tdm_err *err) {
    uint64_t b = 0;
    tandem_status st = get_int(g, key, 0, UINT32_MAX, &b, err);
    if (!st) *out = (uint32_t)b;
    return st;
}

tandem_status tdm_gguf_get_i32(const tdm_gguf *g, const char *key, int32_t *out, tdm_err *err) {
    uint64_t b = 0;
    tandem_status st = get_int(g, key, INT32_MIN, INT32_MAX, &b, err);
    if (!st) *out = (int32_t)(int64_t)b;
    return st;
}

tandem_status tdm_gguf_get_u64(const tdm_gguf *g, const char *key, uint64_t *out, tdm_err *err) {
    return get_int(g, key, 0, UINT64_MAX, out, err);
}

tandem_status tdm_gguf_get_f32(const tdm_gguf *g, const char *key, float *out, tdm_err *err) {
    const tdm_gguf_value *v;
    tandem_status st = lookup(g, key, &v, err);
    if (st) return st;
    if (v->type == TDM_GGUF_FLOAT32 || v->type == TDM_GGUF_FLOAT64) *out = (float)v->v.f64;
    else if (is_unsigned(v->type)) *out = (float)v->v.u64;
    else if (is_signed(v->type)) *out = (float)v->v.i64;
    else return wrong_type(key, v, "a number", err);
    return TANDEM_OK;
}

tandem_status tdm_gguf_get_bool(const tdm_gguf *g, const char *key, bool *out, tdm_err *err) {
    const tdm_gguf_value *v;
    tandem_status st = lookup(g, key, &v, err);
    if (st) return st;
    if (v->type != TDM_GGUF_BOOL) return wrong_type(key, v, "bool", err);
    *out = v->v.b;
    return TANDEM_OK;
}

tandem_status tdm_gguf_get_str(const tdm_gguf *g, const char *key, tdm_gguf_str *out, tdm_err *err) {
    const tdm_gguf_value *v;
    tandem_status st = lookup(g, key, &v, err);
    if (st) return st;
    if (v->type != TDM_GGUF_STRING) return wrong_type(key, v, "string", err);
    *out = v->v.str;
    return TANDEM_OK;
}

tandem_status tdm_gguf_get_arr(const tdm_gguf *g, const char *key, uint32_t elem_type,
                               const tdm_gguf_array **out, tdm_err *err) {
    const tdm_gguf_value *v;
    tandem_status st = lookup(g, key, &v, err);
    if (st) return st;
    if (v->type != TDM_GGUF_ARRAY || v->v.arr.type != elem_type) {
        char want[32];
        snprintf(want, sizeof want, "array of %s", tdm_gguf_type_name(elem_type));
        return wrong_type(key, v, want, err);
    }
    *out = &v->v.arr;
    return TANDEM_OK;
}

tandem_status tdm_gguf_opt_u32(const tdm_gguf *g, const char *key, uint32_t def, uint32_t *out, tdm_err *err) {
    if (g && key && !tdm_gguf_find(g, key)) { *out = def; return TANDEM_OK; }
    return tdm_gguf_get_u32(g, key, out, err);
}

tandem_status tdm_gguf_opt_i32(const tdm_gguf *g, const char *key, int32_t def, int32_t *out, tdm_err *err) {
    if (g && key && !tdm_gguf_find(g, key)) { *out = def; return TANDEM_OK; }
    return tdm_gguf_get_i32(g, key, out, err);
}

tandem_status tdm_gguf_opt_f32(const tdm_gguf *g, const char *key, float def, float *out, tdm_err *err) {
    if (g && key && !tdm_gguf_find(g, key)) { *out = def; return TANDEM_OK; }
    return tdm_gguf_get_f32(g, key, out, err);
}

tandem_status tdm_gguf_opt_bool(const tdm_gguf *g, const char *key, bool def, bool *out, tdm_err *err) {
    if (g && key && !tdm_gguf_find(g, key)) { *out = def; return TANDEM_OK; }
    return tdm_gguf_get_bool(g, key, out, err);
}

float tdm_gguf_arr_f32(const tdm_gguf_array *a, uint64_t i) {
    float f;
    memcpy(&f, (const uint8_t *)a->data + 4 * i, 4);
    return f;
}

int32_t tdm_gguf_arr_i32(const tdm_gguf_array *a, uint64_t i) {
    int32_t x;
    memcpy(&x, (const uint8_t *)a->data + 4 * i, 4);
    return x;
}

/* --------------------------------------------------------------- printing */

/* Strings print as JSON literals (escapes; invalid UTF-8 as U+FFFD). */
static void print_str(FILE *f, const char *s, uint64_t n) { tdm_json_write_str(f, s, (size_t)n); }

/* Shortest decimal that reads back to the same value (f32 or f64 precision). */
static void print_float(FILE *f, double x, bool is_f32) {
    char buf[40];
    for (int prec = 6; prec <= 17; prec++) { /* from 6 digits: "1000", not "1e+03" */
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (is_f32 ? (strtof(buf, NULL) == (float)x) : (strtod(buf, NULL) == x)) break;
    }
    fputs(buf, f);
}

static void print_scalar(FILE *f, const tdm_gguf_value *v) {
    if (is_unsigned(v->type)) fprintf(f, "%" PRIu64, v->v.u64);
    else if (is_signed(v->type)) fprintf(f, "%" PRId64, v->v.i64);
    else if (v->type == TDM_GGUF_FLOAT32 || v->type == TDM_GGUF_FLOAT64)
        print_float(f, v->v.f64, v->type == TDM_GGUF_FLOAT32);
    else if (v->type == TDM_GGUF_BOOL) fputs(v->v.b ? "true" : "false", f);
    else if (v->type == TDM_GGUF_STRING) print_str(f, v->v.str.ptr, v->v.str.len);
    else fputs("?", f);
}

void tdm_gguf_value_print(const tdm_gguf_value *v, void *file, int max_elems) {
    FILE *f = file;
    if (!v || !f) return;
    if (v->type != TDM_GGUF_ARRAY) {
        print_scalar(f, v);
        return;
    }
    const tdm_gguf_array *a = &v->v.arr;
    uint64_t shown = max_elems < 0 || (uint64_t)max_elems >= a->n ? a->n : (uint64_t)max_elems;
    uint64_t esz = tdm_gguf_scalar_size(a->type);
    fputc('[', f);
    for (uint64_t i = 0; i < shown; i++) {
        if (i) fputs(", ", f);
        if (a->type == TDM_GGUF_STRING) {
            print_str(f, a->strs[i].ptr, a->strs[i].len);
        } else if (a->type == TDM_GGUF_ARRAY) {
            tdm_gguf_value_print(&a->elems[i], f, max_elems);
        } else {
            tdm_gguf_value e;
            decode_scalar(a->type, (const uint8_t *)a->data + i * esz, &e);
            print_scalar(f, &e);
        }
    }
    if (shown < a->n) fprintf(f, "%s... (%" PRIu64 " items)", shown ? ", " : "", a->n);
    fputc(']', f);
}
