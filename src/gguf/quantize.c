/* quantize.c - `tandem quantize`'s conversion (quantize.h): tensor-type rules and
 * the streamed output file. */
#include "quantize.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtype.h"
#include "gguf_write.h"

enum { MIX_NONE, MIX_Q2_K, MIX_Q3_K_M, MIX_Q4_K_M, MIX_Q5_K_M };

/* general.file_type values are llama.cpp's llama_ftype. */
static const tdm_quant_kind kinds[] = {
    {"f16", TDM_F16, 1, MIX_NONE},       {"q8_0", TDM_Q8_0, 7, MIX_NONE},      {"q4_0", TDM_Q4_0, 2, MIX_NONE},
    {"q4_1", TDM_Q4_1, 3, MIX_NONE},     {"q5_0", TDM_Q5_0, 8, MIX_NONE},      {"q5_1", TDM_Q5_1, 9, MIX_NONE},
    {"q2_k", TDM_Q2_K, 10, MIX_Q2_K},    {"q3_k", TDM_Q3_K, 11, MIX_NONE},     {"q3_k_m", TDM_Q3_K, 12, MIX_Q3_K_M},
    {"q4_k", TDM_Q4_K, 14, MIX_NONE},    {"q4_k_m", TDM_Q4_K, 15, MIX_Q4_K_M}, {"q5_k", TDM_Q5_K, 16, MIX_NONE},
    {"q5_k_m", TDM_Q5_K, 17, MIX_Q5_K_M}, {"q6_k", TDM_Q6_K, 18, MIX_NONE},
};

const tdm_quant_kind *tdm_quant_kind_find(const char *name) {
    for (size_t i = 0; name && i < TDM_ARRAY_LEN(kinds); i++)
        if (strcmp(kinds[i].name, name) == 0) return &kinds[i];
    return NULL;
}

const char *tdm_quant_kind_names(void) {
    return "f16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q3_k_m, q4_k, q4_k_m, q5_k, q5_k_m, q6_k";
}

/* llama.cpp's layers that get more bits in the _M mixes. */
static bool more_bits(int32_t i, int32_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A type whose blocks divide ne0: t itself or its fallback. */
static uint32_t fit_type(uint32_t t, int64_t ne0) {
    if (ne0 % tdm_dtype_block_elems(t) == 0) return t;
    switch (t) {
    case TDM_Q4_K: t = TDM_Q5_0; break;
    case TDM_Q5_K: t = TDM_Q5_1; break;
    case TDM_Q6_K: t = TDM_Q8_0; break;
    case TDM_Q2_K: case TDM_Q3_K: t = TDM_Q4_0; break;
    default: break;
    }
    return ne0 % tdm_dtype_block_elems(t) == 0 ? t : TDM_F16;
}

uint32_t tdm_quant_tensor_type(const tdm_quant_kind *k, const tdm_quant_model *m, const tdm_gguf_tensor *t) {
    int64_t rows = 1;
    for (uint32_t d = 1; d < t->n_dims; d++) rows *= t->ne[d];
    if (t->n_dims < 2 || rows < 2 || !ends_with(t->name, ".weight")) return t->type; /* norms, biases */
    const char *nm = t->name;
    if (strstr(nm, "ffn_gate_inp.weight")) return t->type; /* a mixture of experts' router (as llama.cpp) */
    int32_t layer = -1;
    if (sscanf(nm, "blk.%d.", &layer) != 1) layer = -1;
    const int32_t L = m->n_layer > 0 ? m->n_layer : 1;
    uint32_t ty = k->base;
    if (strcmp(nm, "output.weight") == 0 || (!m->has_output && strcmp(nm, "token_embd.weight") == 0)) {
        if (k->base != TDM_Q8_0 && k->base != TDM_F16) ty = TDM_Q6_K;
        if (t->ne[0] % TDM_QK_K != 0 && ty == TDM_Q6_K) ty = TDM_Q8_0;
    } else if (strstr(nm, "attn_v.weight")) {
        if (k->mix == MIX_Q2_K) ty = m->gqa >= 4 ? TDM_Q4_K : TDM_Q3_K;
        else if (k->mix == MIX_Q3_K_M) ty = layer < 2 ? TDM_Q5_K : TDM_Q4_K;
        else if ((k->mix == MIX_Q4_K_M || k->mix == MIX_Q5_K_M) && more_bits(layer, L)) ty = TDM_Q6_K;
    } else if (strstr(nm, "ffn_down")) {
        if (k->mix == MIX_Q2_K) ty = TDM_Q3_K;
        else if (k->mix == MIX_Q3_K_M) ty = layer < L / 16 ? TDM_Q5_K : TDM_Q4_K;
        else if ((k->mix == MIX_Q4_K_M || k->mix == MIX_Q5_K_M) && more_bits(layer, L)) ty = TDM_Q6_K;
    } else if (strstr(nm, "attn_output.weight")) {
        if (k->mix == MIX_Q2_K) ty = TDM_Q3_K;
        else if (k->mix == MIX_Q3_K_M) ty = TDM_Q4_K;
    } else if (strstr(nm, "attn_qkv.weight")) {
        if (k->mix == MIX_Q3_K_M) ty = TDM_Q4_K;
        else if (k->mix == MIX_Q4_K_M) ty = TDM_Q5_K;
        else if (k->mix == MIX_Q5_K_M) ty = TDM_Q6_K;
    }
    return fit_type(ty, t->ne[0]);
}

/* ------------------------------------------------------------ the file */

static int32_t arch_u32(const tdm_gguf *g, const char *suffix) {
    const tdm_gguf_value *a = tdm_gguf_find(g, "general.architecture");
    if (!a || a->type != TDM_GGUF_STRING || a->v.str.len > 64) return 0;
    char key[128];
    snprintf(key, sizeof key, "%.*s.%s", (int)a->v.str.len, a->v.str.ptr, suffix);
    const tdm_gguf_value *v = tdm_gguf_find(g, key);
    return v && (v->type == TDM_GGUF_UINT32 || v->type == TDM_GGUF_INT32) ? (int32_t)v->v.u64 : 0;
}

/* Rows [r0, r1) of tensor t converted to type ty (the quantisers are independent
 * per row, so threads split the rows). */
typedef struct conv_job {
    const tdm_gguf_tensor *t;
    uint32_t ty;
    uint64_t r0, r1, src_rb, dst_rb;
    uint8_t *out; /* the whole tensor's output */
    float *row;   /* [ne0] */
    int64_t bad;  /* the first row holding NaN or an infinity (then it stops), -1 = none */
} conv_job;

static void *conv_rows(void *p) {
    conv_job *j = p;
    j->bad = -1;
    for (uint64_t r = j->r0; r < j->r1; r++) {
        tdm_row_to_f32(j->t->type, (const uint8_t *)j->t->data + r * j->src_rb, j->row, j->t->ne[0]);
        for (int64_t i = 0; i < j->t->ne[0]; i++)
            if (!isfinite(j->row[i])) { /* (no scale quantises it: an error, as llama.cpp's) */
                j->bad = (int64_t)r;
                return NULL;
            }
        tdm_row_from_f32(j->ty, j->row, j->out + r * j->dst_rb, j->t->ne[0]);
    }
    return NULL;
}

#define MAX_THREADS 64

/* Tensor t converted to type ty (out: its whole output; rows: MAX_THREADS rows of
 * max_row floats), written to w. */
static tandem_status write_tensor(tdm_gguf_writer *w, const tdm_gguf_tensor *t, uint32_t ty, int n_threads,
                                  float *rows, int64_t max_row, uint8_t *out, tdm_err *err) {
    if (ty == t->type) return tdm_gguf_stream_write(w, t->data, (size_t)t->nbytes, err);
    uint64_t src_rb, dst_rb;
    tdm_dtype_row_bytes(t->type, (uint64_t)t->ne[0], &src_rb);
    tdm_dtype_row_bytes(ty, (uint64_t)t->ne[0], &dst_rb);
    const uint64_t n_rows = t->nbytes / src_rb;
    int nt = (int)TDM_MIN((uint64_t)n_threads, n_rows);
    conv_job jobs[MAX_THREADS];
    pthread_t th[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int k = 0; k < nt; k++) {
        jobs[k] = (conv_job){t, ty, n_rows * (uint64_t)k / (uint64_t)nt, n_rows * (uint64_t)(k + 1) / (uint64_t)nt,
                             src_rb, dst_rb, out, rows + (size_t)k * (size_t)max_row, -1};
        started[k] = k > 0 && pthread_create(&th[k], NULL, conv_rows, &jobs[k]) == 0;
        if (k > 0 && !started[k]) conv_rows(&jobs[k]); /* no thread: do it here */
    }
    conv_rows(&jobs[0]);
    for (int k = 1; k < nt; k++)
        if (started[k]) pthread_join(th[k], NULL);
    for (int k = 0; k < nt; k++)
        if (jobs[k].bad >= 0)
            return tdm_seterr(err, TANDEM_ERR_FORMAT,
                              "tensor '%s': row %lld holds NaN or an infinity (a model with non-finite weights is "
                              "not quantised)", t->name, (long long)jobs[k].bad);
    return tdm_gguf_stream_write(w, out, (size_t)(dst_rb * n_rows), err);
}

tandem_status tdm_quantize_file(const char *in, const char *out, const tdm_quant_kind *k, bool overwrite,
                                tdm_quant_progress_fn progress, void *ctx, tdm_err *err) {
    struct stat sb;
    if (!overwrite && lstat(out, &sb) == 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "'%s' already exists", out);
    tdm_gguf *g = NULL;
    tandem_status st = tdm_gguf_open(in, &g, err);
    if (st) return st;
    tdm_quant_model qm = {.n_layer = arch_u32(g, "block_count"),
                          .has_output = tdm_gguf_find_tensor(g, "output.weight") != NULL};
    int32_t nh = arch_u32(g, "attention.head_count"), nkv = arch_u32(g, "attention.head_count_kv");
    qm.gqa = nh > 0 && nkv > 0 ? nh / nkv : 1;

    tdm_gguf_writer *w = tdm_gguf_writer_new(3, (uint32_t)g->alignment);
    uint32_t *types = tdm_calloc(g->n_tensors ? g->n_tensors : 1, sizeof *types);
    int64_t max_row = 1;
    if (!w || !types) {
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (strcmp(g->kv[i].key, "general.file_type") == 0 || strcmp(g->kv[i].key, "general.alignment") == 0) continue;
        tdm_gguf_w_value(w, g->kv[i].key, &g->kv[i].value);
    }
    tdm_gguf_w_u32(w, "general.file_type", k->file_type);
    if (g->alignment != 32) tdm_gguf_w_u32(w, "general.alignment", (uint32_t)g->alignment);
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tdm_gguf_tensor *t = &g->tensors[i];
        types[i] = tdm_quant_tensor_type(k, &qm, t);
        uint64_t rb, rows = 1;
        for (uint32_t d = 1; d < t->n_dims; d++) rows *= (uint64_t)t->ne[d];
        if (!tdm_dtype_row_bytes(types[i], (uint64_t)t->ne[0], &rb)) {
            st = tdm_seterr(err, TANDEM_ERR_FORMAT, "tensor '%s': rows of %lld do not fit %s", t->name,
                            (long long)t->ne[0], tdm_dtype_name(types[i]));
            goto done;
        }
        max_row = TDM_MAX(max_row, t->ne[0]);
        tdm_gguf_w_tensor_info(w, t->name, types[i], t->n_dims, t->ne, rb * rows);
    }
    uint64_t max_out = 1;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        uint64_t rb, rows = 1;
        tdm_dtype_row_bytes(types[i], (uint64_t)g->tensors[i].ne[0], &rb);
        for (uint32_t d = 1; d < g->tensors[i].n_dims; d++) rows *= (uint64_t)g->tensors[i].ne[d];
        if (types[i] != g->tensors[i].type) max_out = TDM_MAX(max_out, rb * rows);
    }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    const int n_threads = ncpu < 1 ? 1 : ncpu > MAX_THREADS ? MAX_THREADS : (int)ncpu;
    float *row = tdm_mallocarray((size_t)max_row * (size_t)n_threads, sizeof(float));
    uint8_t *buf = tdm_malloc((size_t)max_out);
    char *tmp = tdm_malloc(strlen(out) + 8);
    if (!row || !buf || !tmp) {
        free(row), free(buf), free(tmp);
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        goto done;
    }
    sprintf(tmp, "%s.tmp", out);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = tdm_seterr(err, TANDEM_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
    } else {
        st = tdm_gguf_stream_begin(w, f, tmp, err);
        uint64_t bytes = 0;
        for (uint64_t i = 0; !st && i < g->n_tensors; i++) {
            st = write_tensor(w, &g->tensors[i], types[i], n_threads, row, max_row, buf, err);
            uint64_t rb, rows = 1;
            tdm_dtype_row_bytes(types[i], (uint64_t)g->tensors[i].ne[0], &rb);
            for (uint32_t d = 1; d < g->tensors[i].n_dims; d++) rows *= (uint64_t)g->tensors[i].ne[d];
            bytes += rb * rows;
            if (!st && progress) progress(ctx, i + 1, g->n_tensors, g->tensors[i].name, types[i], bytes);
        }
        if (!st) st = tdm_gguf_stream_end(w, err);
        if (fclose(f) != 0 && !st) st = tdm_seterr(err, TANDEM_ERR_IO, "cannot write '%s': %s", tmp, strerror(errno));
        if (!st && rename(tmp, out) != 0)
            st = tdm_seterr(err, TANDEM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, out, strerror(errno));
        if (st) remove(tmp);
    }
    free(row), free(buf), free(tmp);
done:
    free(types);
    tdm_gguf_writer_free(w);
    tdm_gguf_close(g);
    return st;
}
