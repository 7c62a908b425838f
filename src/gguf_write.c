/* gguf_write.c - builds a GGUF file in memory.
 *
 * Metadata is serialised into a byte buffer as it is added; tensors are kept as a
 * list (name, shape, type, copied data) and laid out at finish time:
 *   header | kv pairs | tensor infos | pad to alignment | data[0] pad | data[1] pad | ... data[n-1]
 * Each tensor's data starts at a multiple of the alignment; there is no padding after
 * the last tensor (so truncating the file anywhere inside the data makes it invalid).
 * The writer does not validate what it is given (tests use it to make corrupt files):
 * n_dims, type and nbytes are written as passed.  When the alignment is not the default
 * 32 and no "general.alignment" key was written, finish() appends one (u32).
 */
#include "gguf_write.h"

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
    uint8_t *data; /* [nbytes] */
    size_t nbytes;
} wtensor;

struct tdm_gguf_writer {
    uint32_t version, alignment;
    uint64_t n_kv;
    wbuf kv;            /* serialised kv pairs */
    wtensor *tensors;   /* [n_tensors] */
    size_t n_tensors, cap_tensors;
    bool has_alignment_key;
    tandem_status failed; /* first failure of an earlier call (NOMEM / INVALID_ARG) */
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
    if (!key) {
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

void tdm_gguf_w_raw(tdm_gguf_writer *w, const char *key, uint32_t type, const void *payload, size_t n) {
    if (kv_begin(w, key, type)) wb_put(w, &w->kv, payload, n);
}

void tdm_gguf_w_tensor(tdm_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                       const int64_t *ne, const void *data, size_t nbytes) {
    if (!w || w->failed) return;
    if (!name || (n_dims && !ne) || (nbytes && !data)) {
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
    t->data = nbytes ? malloc(nbytes) : NULL;
    if (!t->name || (n_dims && !t->ne) || (nbytes && !t->data)) {
        free(t->name);
        free(t->ne);
        free(t->data);
        w->failed = TANDEM_ERR_NOMEM;
        return;
    }
    if (n_dims) memcpy(t->ne, ne, n_dims * sizeof *ne);
    if (nbytes) memcpy(t->data, data, nbytes);
    t->type = type;
    t->n_dims = n_dims;
    t->nbytes = nbytes;
    w->n_tensors++;
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

tandem_status tdm_gguf_writer_finish(tdm_gguf_writer *w, uint8_t **out, size_t *out_len) {
    if (!w || !out || !out_len) return TANDEM_ERR_INVALID_ARG;
    *out = NULL;
    *out_len = 0;
    if (w->alignment != 32 && !w->has_alignment_key)
        tdm_gguf_w_u32(w, "general.alignment", w->alignment);
    if (w->failed) return w->failed;
    wbuf b = {0};
    wb_put(w, &b, "GGUF", 4);
    wb_le(w, &b, w->version, 4);
    wb_le(w, &b, w->n_tensors, 8);
    wb_le(w, &b, w->n_kv, 8);
    wb_put(w, &b, w->kv.p, w->kv.len);
    uint64_t off = 0; /* data offset of the next tensor */
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        wb_str(w, &b, t->name, strlen(t->name));
        wb_le(w, &b, t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) wb_le(w, &b, (uint64_t)t->ne[d], 8);
        wb_le(w, &b, t->type, 4);
        wb_le(w, &b, off, 8);
        off += t->nbytes;
        off += (w->alignment - off % w->alignment) % w->alignment;
    }
    if (w->n_tensors) pad_to(w, &b, w->alignment);
    for (size_t i = 0; i < w->n_tensors; i++) {
        if (i) pad_to(w, &b, w->alignment);
        wb_put(w, &b, w->tensors[i].data, w->tensors[i].nbytes);
    }
    if (w->failed) {
        free(b.p);
        return w->failed;
    }
    *out = b.p;
    *out_len = b.len;
    return TANDEM_OK;
}
