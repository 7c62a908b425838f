/* gguf_write.c - builds a GGUF file in memory or streams it to a FILE.
 *
 * Metadata is serialised into a byte buffer as it is added; tensors are kept as a
 * list (name, shape, type, copied data or, for streamed tensors, only the size) and
 * laid out at finish / begin time:
 *   header | kv pairs | tensor infos | pad to alignment | data[0] pad | data[1] pad | ... data[n-1]
 * Each tensor's data starts at a multiple of the alignment; there is no padding after
 * the last tensor (so truncating the file anywhere inside the data makes it invalid).
 * The head (everything before data[0]) is built by one function for both outputs,
 * so a streamed file is byte for byte the in-memory one.
 * The writer does not validate what it is given (tests use it to make corrupt files):
 * n_dims, type and nbytes are written as passed.  When the alignment is not the default
 * 32 and no "general.alignment" key was written, finish() appends one (u32).
 */
#include "gguf_write.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct wbuf {
    uint8_t *p;
    size_t len, cap;
} wbuf;

typedef struct wtensor {
    char *name;
    uint32_t type, n_dims;
    int64_t *ne;   /* [n_dims] */
    uint8_t *data; /* [nbytes]; NULL for a streamed tensor */
    uint64_t nbytes;
    bool streamed; /* registered by tdm_gguf_w_tensor_info */
    uint64_t off;  /* data offset within the data section (set when the head is built) */
} wtensor;

struct tdm_gguf_writer {
    uint32_t version, alignment;
    uint64_t n_kv;
    wbuf kv;            /* serialised kv pairs */
    wtensor *tensors;   /* [n_tensors] */
    size_t n_tensors, cap_tensors;
    bool has_alignment_key;
    tandem_status failed; /* first failure of an earlier call (NOMEM / INVALID_ARG) */
    /* streaming (after tdm_gguf_stream_begin) */
    FILE *out;          /* not owned */
    const char *out_name;
    uint64_t pos;       /* bytes written to out */
    uint64_t data_start; /* file offset of the data section */
    size_t cur;         /* the tensor whose data comes next */
    uint64_t cur_done;  /* bytes of it written so far */
    bool cur_entered;   /* the padding before it is written */
};

static bool wb_reserve(wbuf *b, size_t extra) {
    if (extra <= b->cap - b->len) return true;
    size_t need;
    if (__builtin_add_overflow(b->len, extra, &need)) return false;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return false;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p;
    b->cap = cap;
    return true;
}

static void wb_put(tdm_gguf_writer *w, wbuf *b, const void *src, size_t n) {
    if (w->failed) return;
    if (!wb_reserve(b, n)) {
        w->failed = TANDEM_ERR_NOMEM;
        return;
    }
    if (n) memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void wb_le(tdm_gguf_writer *w, wbuf *b, uint64_t v, unsigned n) {
    uint8_t tmp[8];
    for (unsigned i = 0; i < n; i++) tmp[i] = (uint8_t)(v >> (8 * i));
    wb_put(w, b, tmp, n);
}

static void wb_str(tdm_gguf_writer *w, wbuf *b, const char *s, size_t n) {
    wb_le(w, b, n, 8);
    wb_put(w, b, s, n);
}

tdm_gguf_writer *tdm_gguf_writer_new(uint32_t version, uint32_t alignment) {
    if (alignment == 0) alignment = 32;
    if (alignment & (alignment - 1)) return NULL;
    tdm_gguf_writer *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->version = version;
    w->alignment = alignment;
    return w;
}

void tdm_gguf_writer_free(tdm_gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].ne);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w->kv.p);
    free(w);
}

/* Starts a kv pair: key and type tag. */
static bool kv_begin(tdm_gguf_writer *w, const char *key, uint32_t type) {
    if (!w) return false;
    if (!key || w->out) { /* no metadata once streaming has begun */
        if (!w->failed) w->failed = TANDEM_ERR_INVALID_ARG;
        return false;
    }
    if (strcmp(key, "general.alignment") == 0) w->has_alignment_key = true;
    wb_str(w, &w->kv, key, strlen(key));
    wb_le(w, &w->kv, type, 4);
    w->n_kv++;
    return true;
}

void tdm_gguf_w_u32(tdm_gguf_writer *w, const char *key, uint32_t v) {
    if (kv_begin(w, key, TDM_GGUF_UINT32)) wb_le(w, &w->kv, v, 4);
}

void tdm_gguf_w_i32(tdm_gguf_writer *w, const char *key, int32_t v) {
    if (kv_begin(w, key, TDM_GGUF_INT32)) wb_le(w, &w->kv, (uint32_t)v, 4);
}

void tdm_gguf_w_u64(tdm_gguf_writer *w, const char *key, uint64_t v) {
    if (kv_begin(w, key, TDM_GGUF_UINT64)) wb_le(w, &w->kv, v, 8);
}

void tdm_gguf_w_f32(tdm_gguf_writer *w, const char *key, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    if (kv_begin(w, key, TDM_GGUF_FLOAT32)) wb_le(w, &w->kv, u, 4);
}

void tdm_gguf_w_bool(tdm_gguf_writer *w, const char *key, bool v) {
    if (kv_begin(w, key, TDM_GGUF_BOOL)) wb_le(w, &w->kv, v ? 1 : 0, 1);
}

void tdm_gguf_w_str(tdm_gguf_writer *w, const char *key, const char *v) {
    if (!v) {
        if (w && !w->failed) w->failed = TANDEM_ERR_INVALID_ARG;
        return;
    }
    if (kv_begin(w, key, TDM_GGUF_STRING)) wb_str(w, &w->kv, v, strlen(v));
}

void tdm_gguf_w_arr_str(tdm_gguf_writer *w, const char *key, const char *const *v, uint64_t n) {
    if (!kv_begin(w, key, TDM_GGUF_ARRAY)) return;
    wb_le(w, &w->kv, TDM_GGUF_STRING, 4);
    wb_le(w, &w->kv, n, 8);
    for (uint64_t i = 0; i < n; i++) {
        const char *s = v[i] ? v[i] : "";
        wb_str(w, &w->kv, s, strlen(s));
    }
}

static void arr_4byte(tdm_gguf_writer *w, const char *key, uint32_t et, const void *v, uint64_t n) {
    if (!kv_begin(w, key, TDM_GGUF_ARRAY)) return;
    wb_le(w, &w->kv, et, 4);
    wb_le(w, &w->kv, n, 8);
    const uint8_t *p = v;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * i, 4);
        wb_le(w, &w->kv, u, 4);
    }
}

void tdm_gguf_w_arr_f32(tdm_gguf_writer *w, const char *key, const float *v, uint64_t n) {
    arr_4byte(w, key, TDM_GGUF_FLOAT32, v, n);
}

void tdm_gguf_w_arr_i32(tdm_gguf_writer *w, const char *key, const int32_t *v, uint64_t n) {
    arr_4byte(w, key, TDM_GGUF_INT32, v, n);
}

static void put_array(tdm_gguf_writer *w, const tdm_gguf_array *a);

/* The payload of a value (what follows its type tag). */
static void put_value(tdm_gguf_writer *w, const tdm_gguf_value *v) {
    wbuf *b = &w->kv;
    uint64_t size = tdm_gguf_scalar_size(v->type);
    switch (v->type) {
    case TDM_GGUF_UINT8: case TDM_GGUF_UINT16: case TDM_GGUF_UINT32: case TDM_GGUF_UINT64:
        wb_le(w, b, v->v.u64, (unsigned)size);
        break;
    case TDM_GGUF_INT8: case TDM_GGUF_INT16: case TDM_GGUF_INT32: case TDM_GGUF_INT64:
        wb_le(w, b, (uint64_t)v->v.i64, (unsigned)size);
        break;
    case TDM_GGUF_FLOAT32: {
        float f = (float)v->v.f64; /* widened from a float: exact */
        uint32_t u;
        memcpy(&u, &f, 4);
        wb_le(w, b, u, 4);
        break;
    }
    case TDM_GGUF_FLOAT64: {
        uint64_t u;
        memcpy(&u, &v->v.f64, 8);
        wb_le(w, b, u, 8);
        break;
    }
    case TDM_GGUF_BOOL: wb_le(w, b, v->v.b ? 1 : 0, 1); break;
    case TDM_GGUF_STRING: wb_str(w, b, v->v.str.ptr, (size_t)v->v.str.len); break;
    case TDM_GGUF_ARRAY: put_array(w, &v->v.arr); break;
    default:
        if (!w->failed) w->failed = TANDEM_ERR_INVALID_ARG;
        break;
    }
}

/* An array body: element type, count, elements (scalars are kept packed little-endian
 * as in the file they came from, so they are copied as they are). */
static void put_array(tdm_gguf_writer *w, const tdm_gguf_array *a) {
    wb_le(w, &w->kv, a->type, 4);
    wb_le(w, &w->kv, a->n, 8);
    if (a->type == TDM_GGUF_STRING) {
        for (uint64_t i = 0; i < a->n; i++) wb_str(w, &w->kv, a->strs[i].ptr, (size_t)a->strs[i].len);
    } else if (a->type == TDM_GGUF_ARRAY) {
        for (uint64_t i = 0; i < a->n; i++) put_array(w, &a->elems[i].v.arr);
    } else {
        uint64_t size = tdm_gguf_scalar_size(a->type);
        if (size == 0 && a->n && !w->failed) w->failed = TANDEM_ERR_INVALID_ARG;
        if (size && a->n) wb_put(w, &w->kv, a->data, (size_t)(size * a->n));
    }
}

void tdm_gguf_w_value(tdm_gguf_writer *w, const char *key, const tdm_gguf_value *v) {
    if (!v) {
        if (w && !w->failed) w->failed = TANDEM_ERR_INVALID_ARG;
        return;
    }
    if (kv_begin(w, key, v->type)) put_value(w, v);
}

void tdm_gguf_w_raw(tdm_gguf_writer *w, const char *key, uint32_t type, const void *payload, size_t n) {
    if (kv_begin(w, key, type)) wb_put(w, &w->kv, payload, n);
}

/* Appends a tensor; data == NULL with streamed: only its size is known. */
static void add_tensor(tdm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const int64_t *ne, const void *data, uint64_t nbytes, bool streamed) {
    if (!w || w->failed) return;
    if (!name || (n_dims && !ne) || (nbytes && !data && !streamed) || w->out || nbytes > SIZE_MAX) {
        w->failed = TANDEM_ERR_INVALID_ARG;
        return;
    }
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? 2 * w->cap_tensors : 16;
        wtensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) {
            w->failed = TANDEM_ERR_NOMEM;
            return;
        }
        w->tensors = t;
        w->cap_tensors = cap;
    }
    wtensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = tdm_strndup(name, strlen(name));
    t->ne = n_dims ? tdm_mallocarray(n_dims, sizeof *t->ne) : NULL;
    t->data = nbytes && !streamed ? malloc((size_t)nbytes) : NULL;
    if (!t->name || (n_dims && !t->ne) || (nbytes && !streamed && !t->data)) {
        free(t->name);
        free(t->ne);
        free(t->data);
        w->failed = TANDEM_ERR_NOMEM;
        return;
    }
    if (n_dims) memcpy(t->ne, ne, n_dims * sizeof *ne);
    if (t->data && data) memcpy(t->data, data, (size_t)nbytes);
    t->type = type;
    t->n_dims = n_dims;
    t->nbytes = nbytes;
    t->streamed = streamed;
    w->n_tensors++;
}

void tdm_gguf_w_tensor(tdm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const int64_t *ne, const void *data, size_t nbytes) {
    add_tensor(w, name, type, n_dims, ne, data, nbytes, false);
}

void tdm_gguf_w_tensor_info(tdm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                            const int64_t *ne, uint64_t nbytes) {
    add_tensor(w, name, type, n_dims, ne, NULL, nbytes, true);
}

static void pad_to(tdm_gguf_writer *w, wbuf *b, uint64_t align) {
    static const uint8_t zeros[64];
    size_t pad = (size_t)((align - b->len % align) % align);
    while (pad > 0) {
        size_t k = pad < sizeof zeros ? pad : sizeof zeros;
        wb_put(w, b, zeros, k);
        pad -= k;
    }
}

static void add_alignment_key(tdm_gguf_writer *w) {
    if (w->alignment != 32 && !w->has_alignment_key) tdm_gguf_w_u32(w, "general.alignment", w->alignment);
}

static uint64_t align_up(uint64_t x, uint64_t a) { return x + (a - x % a) % a; }

/* Everything before the first tensor's data into b; sets every tensor's offset. */
static void build_head(tdm_gguf_writer *w, wbuf *b) {
    add_alignment_key(w);
    wb_put(w, b, "GGUF", 4);
    wb_le(w, b, w->version, 4);
    wb_le(w, b, w->n_tensors, 8);
    wb_le(w, b, w->n_kv, 8);
    wb_put(w, b, w->kv.p, w->kv.len);
    uint64_t off = 0; /* data offset of the next tensor */
    for (size_t i = 0; i < w->n_tensors; i++) {
        wtensor *t = &w->tensors[i];
        wb_str(w, b, t->name, strlen(t->name));
        wb_le(w, b, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) wb_le(w, b, (uint64_t)t->ne[d], 8);
        wb_le(w, b, t->type, 4);
        wb_le(w, b, off, 8);
        t->off = off;
        off = align_up(off + t->nbytes, w->alignment);
    }
    if (w->n_tensors) pad_to(w, b, w->alignment);
}

/* The file size for a head of head_len bytes. */
static uint64_t file_size(const tdm_gguf_writer *w, uint64_t head_len) {
    if (!w->n_tensors) return head_len;
    const wtensor *last = &w->tensors[w->n_tensors - 1];
    return head_len + last->off + last->nbytes;
}

tandem_status tdm_gguf_writer_sizes(tdm_gguf_writer *w, uint64_t *head_bytes, uint64_t *file_bytes) {
    if (!w || !head_bytes || !file_bytes) return TANDEM_ERR_INVALID_ARG;
    wbuf b = {0};
    build_head(w, &b);
    free(b.p);
    if (w->failed) return w->failed;
    *head_bytes = b.len;
    *file_bytes = file_size(w, b.len);
    return TANDEM_OK;
}

tandem_status tdm_gguf_writer_finish(tdm_gguf_writer *w, uint8_t **out, size_t *out_len) {
    if (!w || !out || !out_len) return TANDEM_ERR_INVALID_ARG;
    *out = NULL;
    *out_len = 0;
    for (size_t i = 0; i < w->n_tensors; i++)
        if (w->tensors[i].streamed && w->tensors[i].nbytes) return TANDEM_ERR_INVALID_ARG;
    wbuf b = {0};
    build_head(w, &b);
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (i) pad_to(w, &b, w->alignment);
        wb_put(w, &b, w->tensors[i].data, (size_t)w->tensors[i].nbytes);
    }
    if (w->failed) {
        free(b.p);
        return w->failed;
    }
    *out = b.p;
    *out_len = b.len;
    return TANDEM_OK;
}

/* ------------------------------------------------------------ streaming */

static tandem_status out_write(tdm_gguf_writer *w, const void *p, size_t n, tdm_err *err) {
    if (n && fwrite(p, 1, n, w->out) != n) {
        int e = errno;
        return tdm_seterr(err, TANDEM_ERR_IO, "writing '%s': %s", w->out_name,
                          e ? strerror(e) : "write error");
    }
    w->pos += n;
    return TANDEM_OK;
}

/* Writes zeros up to file offset `to`. */
static tandem_status out_pad(tdm_gguf_writer *w, uint64_t to, tdm_err *err) {
    static const uint8_t zeros[256];
    while (w->pos < to) {
        size_t k = (size_t)TDM_MIN(to - w->pos, (uint64_t)sizeof zeros);
        tandem_status st = out_write(w, zeros, k, err);
        if (st) return st;
    }
    return TANDEM_OK;
}

/* Moves past finished tensors (zero-size ones included) to the next one that takes
 * data, writing the padding before each tensor it enters.  At the end cur ==
 * n_tensors. */
static tandem_status stream_advance(tdm_gguf_writer *w, tdm_err *err) {
    while (w->cur < w->n_tensors) {
        const wtensor *t = &w->tensors[w->cur];
        if (!w->cur_entered) {
            tandem_status st = out_pad(w, w->data_start + t->off, err);
            if (st) return st;
            w->cur_entered = true;
        }
        if (w->cur_done < t->nbytes) return TANDEM_OK;
        w->cur++;
        w->cur_done = 0;
        w->cur_entered = false;
    }
    return TANDEM_OK;
}

tandem_status tdm_gguf_stream_begin(tdm_gguf_writer *w, FILE *f, const char *name, tdm_err *err) {
    if (!w || !f || w->out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gguf stream: bad arguments");
    for (size_t i = 0; i < w->n_tensors; i++)
        if (!w->tensors[i].streamed && w->tensors[i].nbytes)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "gguf stream: tensor '%s' holds its data in memory", w->tensors[i].name);
    wbuf b = {0};
    build_head(w, &b);
    if (w->failed) {
        free(b.p);
        return tdm_seterr(err, w->failed, "gguf writer: %s", tandem_status_str(w->failed));
    }
    w->out = f;
    w->out_name = name ? name : "(stream)";
    w->pos = 0;
    w->data_start = b.len;
    w->cur = 0;
    w->cur_done = 0;
    w->cur_entered = false;
    tandem_status st = out_write(w, b.p, b.len, err);
    free(b.p);
    return st;
}

tandem_status tdm_gguf_stream_write(tdm_gguf_writer *w, const void *data, size_t n, tdm_err *err) {
    if (!w || !w->out || (n && !data))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gguf stream: write before begin");
    const uint8_t *p = data;
    while (n) {
        tandem_status st = stream_advance(w, err);
        if (st) return st;
        if (w->cur == w->n_tensors)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gguf stream: more data than the tensors declare");
        const wtensor *t = &w->tensors[w->cur];
        size_t k = (size_t)TDM_MIN((uint64_t)n, t->nbytes - w->cur_done);
        if ((st = out_write(w, p, k, err))) return st;
        w->cur_done += k;
        p += k;
        n -= k;
    }
    return TANDEM_OK;
}

tandem_status tdm_gguf_stream_end(tdm_gguf_writer *w, tdm_err *err) {
    if (!w || !w->out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gguf stream: end before begin");
    tandem_status st = stream_advance(w, err);
    if (st) return st;
    if (w->cur < w->n_tensors) {
        const wtensor *t = &w->tensors[w->cur];
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "gguf stream: tensor '%s' got %llu of its %llu bytes",
                          t->name, (unsigned long long)w->cur_done, (unsigned long long)t->nbytes);
    }
    if (fflush(w->out) != 0) {
        int e = errno;
        return tdm_seterr(err, TANDEM_ERR_IO, "writing '%s': %s", w->out_name, e ? strerror(e) : "write error");
    }
    return TANDEM_OK;
}
