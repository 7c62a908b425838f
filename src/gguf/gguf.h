/* gguf.h - a parsed, validated, memory-mapped GGUF file (versions 2 and 3).
 *
 * A model file is untrusted input: tdm_gguf_open checks every count, length,
 * dimension, offset and size against the file size and sane limits before use.
 * After a successful open every field below is consistent:
 *   - every key and tensor name is unique, NUL-free and NUL-terminated;
 *   - every string value / array lies inside the file;
 *   - every tensor has 1..4 dims, ne[i] >= 1 and a data offset aligned to `alignment`;
 *   - every tensor whose type GGML defines a size for (ggml_types.h), supported by
 *     tandem or not, has ne[0] a multiple of its block size and its data inside the
 *     data section, not overlapping another tensor.  A tensor of a type number of
 *     unknown size (not a GGML type, or one without a known size) has nbytes 0 and
 *     data NULL: the file still opens, for its metadata and the other tensors.
 * Whether tandem computes with a tensor's type is tdm_dtype_supported(type); the
 * model loader rejects the others, naming the tensor and the type.
 */
#ifndef TDM_GGUF_H
#define TDM_GGUF_H

#include "common.h"
#include "dtype.h"

/* GGUF metadata value types (numbering from the GGUF specification). */
typedef enum tdm_gguf_type {
    TDM_GGUF_UINT8 = 0,
    TDM_GGUF_INT8 = 1,
    TDM_GGUF_UINT16 = 2,
    TDM_GGUF_INT16 = 3,
    TDM_GGUF_UINT32 = 4,
    TDM_GGUF_INT32 = 5,
    TDM_GGUF_FLOAT32 = 6,
    TDM_GGUF_BOOL = 7,
    TDM_GGUF_STRING = 8,
    TDM_GGUF_ARRAY = 9,
    TDM_GGUF_UINT64 = 10,
    TDM_GGUF_INT64 = 11,
    TDM_GGUF_FLOAT64 = 12,
    TDM_GGUF_TYPE_COUNT
} tdm_gguf_type;

const char *tdm_gguf_type_name(uint32_t type); /* "u32", "string", ... or "unknown" */
/* Bytes of one scalar value of the type (0 for STRING, ARRAY and unknown types). */
uint64_t tdm_gguf_scalar_size(uint32_t type);

/* Limits applied while parsing (a file beyond them is rejected as corrupt). */
#define TDM_GGUF_MAX_STRING   (1u << 30)   /* bytes in one string */
#define TDM_GGUF_MAX_KEY      (1u << 16)   /* bytes in a key or tensor name */
#define TDM_GGUF_MAX_ARRAY    (1ull << 28) /* elements in one array */
#define TDM_GGUF_MAX_DEPTH    8            /* nesting of arrays */
#define TDM_GGUF_MAX_KV       (1u << 20)   /* metadata pairs */
#define TDM_GGUF_MAX_TENSORS  (1u << 20)
#define TDM_GGUF_MAX_DIMS     4

/* A string inside the mapping: NOT NUL-terminated, may contain any bytes. */
typedef struct tdm_gguf_str {
    const char *ptr;
    uint64_t len;
} tdm_gguf_str;

typedef struct tdm_gguf_value tdm_gguf_value;

typedef struct tdm_gguf_array {
    uint32_t type;             /* element type (tdm_gguf_type) */
    uint64_t n;                /* element count */
    const void *data;          /* scalar elements: n packed little-endian values in the mapping
                                  (possibly unaligned: read with memcpy or the getters below) */
    tdm_gguf_str *strs;        /* type == STRING: [n] strings (heap index into the mapping) */
    tdm_gguf_value *elems;     /* type == ARRAY: [n] nested array values (heap) */
} tdm_gguf_array;

struct tdm_gguf_value {
    uint32_t type; /* tdm_gguf_type */
    union {
        uint64_t u64;  /* UINT8/16/32/64, widened */
        int64_t i64;   /* INT8/16/32/64, widened */
        double f64;    /* FLOAT32/64, widened */
        bool b;        /* BOOL */
        tdm_gguf_str str;
        tdm_gguf_array arr;
    } v;
};

typedef struct tdm_gguf_kv {
    char *key;             /* NUL-terminated heap copy */
    tdm_gguf_value value;
} tdm_gguf_kv;

typedef struct tdm_gguf_tensor {
    char *name;            /* NUL-terminated heap copy */
    uint32_t type;         /* GGML type number (tdm_dtype when tdm_dtype_supported) */
    uint32_t n_dims;       /* 1..4 */
    int64_t ne[TDM_GGUF_MAX_DIMS]; /* elements per dim, ne[0] fastest; unused dims are 1 */
    uint64_t offset;       /* byte offset within the data section */
    uint64_t nbytes;       /* size of the data; 0 for a type of unknown size */
    const void *data;      /* pointer into the mapping; NULL for a type of unknown size.  At
                              a multiple of `alignment` from the data section, which a
                              legal file may set as low as 1: then possibly misaligned for
                              the type's values (read with memcpy, or copy it) */
} tdm_gguf_tensor;

typedef struct tdm_gguf {
    uint32_t version;      /* 2 or 3 */
    uint64_t alignment;    /* general.alignment or 32 */
    uint64_t n_kv;
    tdm_gguf_kv *kv;       /* [n_kv] in file order */
    uint64_t n_tensors;
    tdm_gguf_tensor *tensors; /* [n_tensors] in file order */
    const uint8_t *base;   /* the whole file */
    size_t size;
    uint64_t data_offset;  /* start of the tensor data section within the file */
    /* private */
    void *map;             /* mmap'ed region (NULL for a memory buffer) */
    size_t map_size;
    void *hash;            /* lookup index */
} tdm_gguf;

/* Says that bytes [p, p + n) of g's file will not be read again soon (their
 * contents were copied elsewhere): the mapped pages they fill entirely are dropped
 * from the process, so a model whose weights are repacked or fused does not keep
 * both copies resident.  Reading them later maps them back in from the file.  A
 * no-op for memory buffers and for ranges outside the mapping. */
void tdm_gguf_release(const tdm_gguf *g, const void *p, size_t n);

/* Opens and validates a file (mmap).  On failure *out is NULL and err names the
 * problem: TANDEM_ERR_IO (cannot open/map), TANDEM_ERR_FORMAT (corrupt), or
 * TANDEM_ERR_UNSUPPORTED (unknown version).  Tensor types tandem does not support
 * are not an error here (see above). */
tandem_status tdm_gguf_open(const char *path, tdm_gguf **out, tdm_err *err);

/* The same over a buffer the caller keeps alive until tdm_gguf_close. */
tandem_status tdm_gguf_open_memory(const void *buf, size_t size, tdm_gguf **out, tdm_err *err);

void tdm_gguf_close(tdm_gguf *g); /* NULL is a no-op */

/* Lookups (NULL when absent). */
const tdm_gguf_value *tdm_gguf_find(const tdm_gguf *g, const char *key);
const tdm_gguf_tensor *tdm_gguf_find_tensor(const tdm_gguf *g, const char *name);

/* Typed getters.  Missing key: TANDEM_ERR_FORMAT "missing required key 'K'".
 * Wrong type: TANDEM_ERR_FORMAT "key 'K' has type T, expected ...".
 * Integer getters accept any integer type whose value fits the output.
 * Float getters accept FLOAT32/FLOAT64 (and integers). */
tandem_status tdm_gguf_get_u32(const tdm_gguf *g, const char *key, uint32_t *out, tdm_err *err);
tandem_status tdm_gguf_get_i32(const tdm_gguf *g, const char *key, int32_t *out, tdm_err *err);
tandem_status tdm_gguf_get_u64(const tdm_gguf *g, const char *key, uint64_t *out, tdm_err *err);
tandem_status tdm_gguf_get_f32(const tdm_gguf *g, const char *key, float *out, tdm_err *err);
tandem_status tdm_gguf_get_bool(const tdm_gguf *g, const char *key, bool *out, tdm_err *err);
tandem_status tdm_gguf_get_str(const tdm_gguf *g, const char *key, tdm_gguf_str *out, tdm_err *err);
/* Array getter: checks the key is an array with elements of elem_type. */
tandem_status tdm_gguf_get_arr(const tdm_gguf *g, const char *key, uint32_t elem_type,
                               const tdm_gguf_array **out, tdm_err *err);

/* Optional variants: a missing key leaves *out = def and returns OK; a present key
 * of the wrong type is still an error. */
tandem_status tdm_gguf_opt_u32(const tdm_gguf *g, const char *key, uint32_t def, uint32_t *out, tdm_err *err);
tandem_status tdm_gguf_opt_i32(const tdm_gguf *g, const char *key, int32_t def, int32_t *out, tdm_err *err);
tandem_status tdm_gguf_opt_f32(const tdm_gguf *g, const char *key, float def, float *out, tdm_err *err);
tandem_status tdm_gguf_opt_bool(const tdm_gguf *g, const char *key, bool def, bool *out, tdm_err *err);

/* Element readers for scalar arrays (i < a->n; caller checks type). */
float tdm_gguf_arr_f32(const tdm_gguf_array *a, uint64_t i);   /* FLOAT32 */
int32_t tdm_gguf_arr_i32(const tdm_gguf_array *a, uint64_t i); /* INT32 */

/* Writes a value as text (for `tandem info`): scalars, strings quoted and escaped,
 * arrays abbreviated after max_elems elements. */
void tdm_gguf_value_print(const tdm_gguf_value *v, void *file /* FILE* */, int max_elems);

#endif
