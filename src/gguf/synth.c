/* synth.c - random-weight models with real shapes (synth.h): the shape table, the
 * metadata and tensor list, the random tiles and the streamed file.
 *
 * File layout (streamed with gguf_write): metadata, then the tensors in this order
 * (GGUF ne order, ne[0] fastest = the row length; hd = the shape's head_dim or
 * n_embd / n_head):
 *   token_embd.weight   [n_embd, n_vocab]   matrix type
 *   output_norm.weight  [n_embd]            f32, 1.0
 *   output.weight       [n_embd, n_vocab]   matrix type (not for tied shapes)
 *   rope_freqs.weight   [hd / 2]            f32, Llama 3's divisors (shapes with rope_freqs)
 *   per layer N:
 *   blk.N.attn_norm.weight   [n_embd]                   f32, 1.0
 *   blk.N.attn_q.weight      [n_embd, n_head * hd]
 *   blk.N.attn_k.weight      [n_embd, n_head_kv * hd]
 *   blk.N.attn_v.weight      [n_embd, n_head_kv * hd]
 *   blk.N.attn_output.weight [n_head * hd, n_embd]
 *   blk.N.ffn_norm.weight    [n_embd]                   f32, 1.0
 *   blk.N.ffn_gate.weight    [n_embd, n_ff]
 *   blk.N.ffn_up.weight      [n_embd, n_ff]
 *   blk.N.ffn_down.weight    [n_ff, n_embd]
 *   or, with experts (f = n_ff_exp or n_ff, x = n_expert):
 *   blk.N.ffn_gate_inp.weight  [n_embd, x]      f32, random (the router)
 *   blk.N.ffn_gate_exps.weight [n_embd, f, x]
 *   blk.N.ffn_up_exps.weight   [n_embd, f, x]
 *   blk.N.ffn_down_exps.weight [f, n_embd, x]
 *   blk.N.attn_q_norm.weight, attn_k_norm.weight [hd]   f32, 1.0 (qwen3, gemma3)
 *   blk.N.post_attention_norm.weight, post_ffw_norm.weight [n_embd]  f32, 1.0 (gemma3)
 *
 * Matrix data: one tile per distinct row length (ne[0]), at most tile_bytes of
 * encoded blocks of values uniform in [-a, a], a = sqrt(3) * 0.5 / sqrt(ne[0]) (a
 * standard deviation of 0.5 / sqrt(ne[0])).  Each matrix is its tile read
 * circularly from a block chosen by the seed and the tensor's index.
 */
#include "synth.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "dtype.h"
#include "gguf.h"

/* The shapes of well-known models. */
#define LLAMA(nm, e, l, h, kv, ff, v, ctx, base) {.name = nm, .n_embd = e, .n_layer = l, .n_head = h, .n_head_kv = kv, \
                                                 .n_ff = ff, .n_vocab = v, .n_ctx = ctx, .rope_base = base}
static const tdm_synth_shape shapes[] = {
    /*    name            n_embd layers heads kv  n_ff   n_vocab  n_ctx  rope base */
    LLAMA("llama2-7b",      4096,  32,    32,   32, 11008, 32000,   4096,  10000.0f),
    LLAMA("llama3-8b",      4096,  32,    32,   8,  14336, 128256,  8192,  500000.0f),
    LLAMA("llama2-13b",     5120,  40,    40,   40, 13824, 32000,   4096,  10000.0f),
    LLAMA("tinyllama-1.1b", 2048,  22,    32,   4,  5632,  32000,   2048,  10000.0f),
    LLAMA("llama-160m",     768,   12,    12,   12, 3072,  32000,   2048,  10000.0f),
    {.name = "smollm2-135m", .n_embd = 576, .n_layer = 30, .n_head = 9, .n_head_kv = 3, .n_ff = 1536,
     .n_vocab = 49152, .n_ctx = 8192, .rope_base = 100000.0f, .tied = true},
    {.name = "llama3.2-1b", .n_embd = 2048, .n_layer = 16, .n_head = 32, .n_head_kv = 8, .n_ff = 8192,
     .n_vocab = 128256, .n_ctx = 131072, .rope_base = 500000.0f, .tied = true, .rope_freqs = true},
    {.name = "qwen3-0.6b", .n_embd = 1024, .n_layer = 28, .n_head = 16, .n_head_kv = 8, .n_ff = 3072,
     .n_vocab = 151936, .n_ctx = 40960, .rope_base = 1000000.0f, .arch = "qwen3", .head_dim = 128, .tied = true},
    {.name = "gemma3-1b", .n_embd = 1152, .n_layer = 26, .n_head = 4, .n_head_kv = 1, .n_ff = 6912,
     .n_vocab = 262144, .n_ctx = 32768, .rope_base = 1000000.0f, .arch = "gemma3", .head_dim = 256, .tied = true,
     .sliding_window = 512},
    /* for tests: small and fast, with the vocabulary of the llama2 shapes */
    {.name = "tiny", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 512, .n_vocab = 32000,
     .n_ctx = 2048, .rope_base = 10000.0f, .hidden = true},
    {.name = "tiny-qwen3", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 512, .n_vocab = 32000,
     .n_ctx = 2048, .rope_base = 1000000.0f, .hidden = true, .arch = "qwen3", .head_dim = 128},
    {.name = "tiny-gemma3", .n_embd = 256, .n_layer = 6, .n_head = 4, .n_head_kv = 1, .n_ff = 512, .n_vocab = 32000,
     .n_ctx = 2048, .rope_base = 1000000.0f, .hidden = true, .arch = "gemma3", .head_dim = 128, .tied = true,
     .sliding_window = 16},
    {.name = "tiny-llama3", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 512, .n_vocab = 32000,
     .n_ctx = 2048, .rope_base = 500000.0f, .hidden = true, .tied = true, .rope_freqs = true},
    /* mixtures of experts: Qwen3-30B-A3B and Mixtral-8x7B, a small qwen3moe for CPU
     * measurements, and test shapes */
    {.name = "qwen3-30b-a3b", .n_embd = 2048, .n_layer = 48, .n_head = 32, .n_head_kv = 4, .n_ff = 6144,
     .n_vocab = 151936, .n_ctx = 40960, .rope_base = 1000000.0f, .arch = "qwen3moe", .head_dim = 128,
     .n_expert = 128, .n_expert_used = 8, .n_ff_exp = 768},
    {.name = "mixtral-8x7b", .n_embd = 4096, .n_layer = 32, .n_head = 32, .n_head_kv = 8, .n_ff = 14336,
     .n_vocab = 32000, .n_ctx = 32768, .rope_base = 1000000.0f, .n_expert = 8, .n_expert_used = 2},
    {.name = "qwen3moe-small", .n_embd = 1024, .n_layer = 8, .n_head = 16, .n_head_kv = 4, .n_ff = 2048,
     .n_vocab = 32000, .n_ctx = 4096, .rope_base = 1000000.0f, .hidden = true, .arch = "qwen3moe", .head_dim = 64,
     .n_expert = 32, .n_expert_used = 4, .n_ff_exp = 512},
    {.name = "mixtral-small", .n_embd = 1024, .n_layer = 8, .n_head = 16, .n_head_kv = 4, .n_ff = 2048,
     .n_vocab = 32000, .n_ctx = 4096, .rope_base = 1000000.0f, .hidden = true, .n_expert = 8, .n_expert_used = 2},
    {.name = "tiny-qwen3moe", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 1024, .n_vocab = 32000,
     .n_ctx = 2048, .rope_base = 1000000.0f, .hidden = true, .arch = "qwen3moe", .head_dim = 128, .n_expert = 8,
     .n_expert_used = 2, .n_ff_exp = 256},
    {.name = "tiny-mixtral", .n_embd = 256, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 512, .n_vocab = 32000,
     .n_ctx = 2048, .rope_base = 1000000.0f, .hidden = true, .n_expert = 4, .n_expert_used = 2},    /* EAGLE-3 heads with the shapes of published ones: Llama-3.1-8B-Instruct's
     * (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: one block of the target's width, a 32000-token
     * draft vocabulary, the features entering layers 2, 16 and 29 = SGLang's and
     * vLLM's default (2, L / 2, L - 3)), Vicuna / Llama-2-7B's (the whole 32000-token
     * vocabulary: no d2t), and a small one for the pycode target (models/, 8 layers:
     * 2, 4, 5) for tests */
    {.name = "eagle3-llama3-8b", .n_embd = 4096, .n_layer = 1, .n_head = 32, .n_head_kv = 8, .n_ff = 14336,
     .n_vocab = 128256, .n_ctx = 8192, .rope_base = 500000.0f, .arch = "eagle3", .n_draft_vocab = 32000,
     .feat_layers = {2, 16, 29}},
    {.name = "eagle3-llama2-7b", .n_embd = 4096, .n_layer = 1, .n_head = 32, .n_head_kv = 32, .n_ff = 11008,
     .n_vocab = 32000, .n_ctx = 4096, .rope_base = 10000.0f, .arch = "eagle3", .n_draft_vocab = 32000,
     .feat_layers = {2, 16, 29}},
    {.name = "eagle3-pycode", .n_embd = 384, .n_layer = 1, .n_head = 6, .n_head_kv = 2, .n_ff = 1024, .n_vocab = 8192,
     .n_ctx = 1024, .rope_base = 10000.0f, .arch = "eagle3", .n_draft_vocab = 2048, .feat_layers = {2, 4, 5}},
    /* (the same with its own token embedding: runs in llama.cpp's examples, which give a
     * head no target to borrow from) */
    {.name = "eagle3-pycode-embd", .n_embd = 384, .n_layer = 1, .n_head = 6, .n_head_kv = 2, .n_ff = 1024,
     .n_vocab = 8192, .n_ctx = 1024, .rope_base = 10000.0f, .hidden = true, .arch = "eagle3", .n_draft_vocab = 2048,
     .feat_layers = {2, 4, 5}, .own_embd = true},
};
#undef LLAMA

static const char *shape_arch(const tdm_synth_shape *s) { return s->arch ? s->arch : "llama"; }
static int32_t shape_hd(const tdm_synth_shape *s) { return s->head_dim ? s->head_dim : s->n_embd / s->n_head; }
static bool shape_qk_norm(const tdm_synth_shape *s) {
    return s->arch && (!strcmp(s->arch, "qwen3") || !strcmp(s->arch, "gemma3") || !strcmp(s->arch, "qwen3moe"));
}
static int32_t shape_ff_exp(const tdm_synth_shape *s) { return s->n_ff_exp ? s->n_ff_exp : s->n_ff; }
static bool shape_post_norms(const tdm_synth_shape *s) { return s->arch && !strcmp(s->arch, "gemma3"); }
static bool shape_eagle3(const tdm_synth_shape *s) { return s->arch && !strcmp(s->arch, "eagle3"); }
#define GGML_I64 27 /* (the d2t table's type: no tdm_dtype) */

/* Llama 3.1's rope_freqs (llama.cpp's converter from rope_scaling {factor 32,
 * low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192}):
 * 1 for wavelengths below 8192 / 4, 32 above 8192, smoothly between. */
static void llama3_rope_freqs(int32_t n_rot, float base, float *ff) {
    const double factor = 32, low = 1, high = 4, orig = 8192;
    for (int32_t t = 0; t < n_rot / 2; t++) {
        const double wl = 2 * M_PI * pow(base, 2.0 * t / n_rot);
        if (wl < orig / high) ff[t] = 1.0f;
        else if (wl > orig / low) ff[t] = (float)factor;
        else {
            const double smooth = (orig / wl - low) / (high - low);
            ff[t] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

const tdm_synth_shape *tdm_synth_shapes(size_t *n) {
    *n = TDM_ARRAY_LEN(shapes);
    return shapes;
}

const tdm_synth_shape *tdm_synth_shape_find(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < TDM_ARRAY_LEN(shapes); i++)
        if (strcmp(shapes[i].name, name) == 0) return &shapes[i];
    return NULL;
}

uint32_t tdm_synth_file_type(uint32_t type) {
    switch (type) {
    case TDM_F16: return 1;  /* MOSTLY_F16 */
    case TDM_Q8_0: return 7; /* MOSTLY_Q8_0 */
    case TDM_Q4_0: return 2; /* MOSTLY_Q4_0 */
    case TDM_Q4_K: return 14; /* MOSTLY_Q4_K_S */
    case TDM_Q5_K: return 16; /* MOSTLY_Q5_K_S */
    case TDM_Q6_K: return 18; /* MOSTLY_Q6_K */
    default: return 0;
    }
}

/* ------------------------------------------------------------ tensor list */

typedef struct tdesc {
    char name[48];
    uint32_t type;
    int64_t ne0, ne1; /* ne1 == 0: a vector of ne0 */
    int64_t ne2;      /* > 1: a 3-D tensor of ne2 matrices [ne1][ne0] (experts); else 1 */
    uint64_t nbytes;
    bool random;      /* an f32 matrix of random values (a router), not a norm of ones */
} tdesc;

static void desc3(tdesc *d, const char *name, uint32_t type, int64_t ne0, int64_t ne1, int64_t ne2) {
    snprintf(d->name, sizeof d->name, "%s", name);
    d->type = type;
    d->ne0 = ne0;
    d->ne1 = ne1;
    d->ne2 = ne2;
    uint64_t rb = 0;
    tdm_dtype_row_bytes(type, (uint64_t)ne0, &rb); /* shapes are multiples of the block */
    d->nbytes = rb * (uint64_t)(ne1 ? ne1 : 1) * (uint64_t)ne2;
}

static void desc(tdesc *d, const char *name, uint32_t type, int64_t ne0, int64_t ne1) {
    desc3(d, name, type, ne0, ne1, 1);
}

static uint32_t tdesc_dims(const tdesc *d) { return d->ne2 > 1 ? 3 : d->ne1 ? 2 : 1; }

/* The matrices' type (o->type, or the kind's rule for the tensor). */
static uint32_t matrix_type(const tdm_synth_opts *o, const char *name, int64_t ne0, int64_t ne1, int64_t ne2) {
    if (!o->kind) return o->type;
    const tdm_synth_shape *s = o->shape;
    tdm_quant_model qm = {.n_layer = s->n_layer, .gqa = s->n_head / s->n_head_kv, .has_output = !s->tied};
    tdm_gguf_tensor t = {.name = (char *)name, .type = TDM_F32, .n_dims = ne2 > 1 ? 3 : 2, .ne = {ne0, ne1, ne2, 1}};
    return tdm_quant_tensor_type(o->kind, &qm, &t);
}

/* The tensors in file order (*n of them: 3 + 9 per layer, fewer or more as the
 * header comment says: 10 per layer with experts); NULL when out of memory. */
static tdesc *tensor_list(const tdm_synth_opts *o, size_t *n) {
    const tdm_synth_shape *s = o->shape;
    size_t count = 4 + 13 * (size_t)s->n_layer;
    tdesc *t = tdm_calloc(count, sizeof *t);
    if (!t) return NULL;
    int64_t E = s->n_embd, hd = shape_hd(s);
    int64_t qd = s->n_head * hd, kvd = s->n_head_kv * hd;
    size_t k = 0;
#define MAT(nm, a, b) desc(&t[k++], nm, matrix_type(o, nm, a, b, 1), a, b)
    if (shape_eagle3(s)) { /* (src/model/eagle3.h's layout) */
        MAT("fc.weight", 3 * E, E);                          /* [3 n_embd, n_embd] */
        if (s->own_embd) MAT("token_embd.weight", E, s->n_vocab); /* [n_embd, n_vocab] */
        desc(&t[k++], "output_norm.weight", TDM_F32, E, 0);  /* [n_embd] */
        MAT("output.weight", E, s->n_draft_vocab);           /* [n_embd, n_draft_vocab] */
        if (s->n_draft_vocab < s->n_vocab) {                 /* [n_draft_vocab] i64 */
            snprintf(t[k].name, sizeof t[k].name, "d2t");
            t[k].type = GGML_I64;
            t[k].ne0 = s->n_draft_vocab;
            t[k].ne2 = 1;
            t[k++].nbytes = (uint64_t)s->n_draft_vocab * 8;
        }
        desc(&t[k++], "blk.0.attn_norm.weight", TDM_F32, E, 0);   /* [n_embd] */
        desc(&t[k++], "blk.0.attn_norm_2.weight", TDM_F32, E, 0); /* [n_embd] */
        MAT("blk.0.attn_q.weight", 2 * E, qd);                    /* [2 n_embd, n_head * hd] */
        MAT("blk.0.attn_k.weight", 2 * E, kvd);                   /* [2 n_embd, n_head_kv * hd] */
        MAT("blk.0.attn_v.weight", 2 * E, kvd);
        MAT("blk.0.attn_output.weight", qd, E);                   /* [n_head * hd, n_embd] */
        desc(&t[k++], "blk.0.ffn_norm.weight", TDM_F32, E, 0);
        MAT("blk.0.ffn_gate.weight", E, s->n_ff);
        MAT("blk.0.ffn_up.weight", E, s->n_ff);
        MAT("blk.0.ffn_down.weight", s->n_ff, E);
        *n = k;
        return t;
    }
#define EXPS(nm, a, b) desc3(&t[k++], nm, matrix_type(o, nm, a, b, s->n_expert), a, b, s->n_expert)
    MAT("token_embd.weight", E, s->n_vocab);             /* [n_embd, n_vocab] */
    desc(&t[k++], "output_norm.weight", TDM_F32, E, 0);  /* [n_embd] */
    if (!s->tied) MAT("output.weight", E, s->n_vocab);   /* [n_embd, n_vocab] */
    if (s->rope_freqs) desc(&t[k++], "rope_freqs.weight", TDM_F32, hd / 2, 0); /* [hd / 2] */
    char name[48];
    for (int32_t l = 0; l < s->n_layer; l++) {
#define NAME(x) (snprintf(name, sizeof name, "blk.%d." x, (int)l), name)
        desc(&t[k++], NAME("attn_norm.weight"), TDM_F32, E, 0);  /* [n_embd] */
        MAT(NAME("attn_q.weight"), E, qd);                       /* [n_embd, n_head * hd] */
        MAT(NAME("attn_k.weight"), E, kvd);                      /* [n_embd, n_head_kv * hd] */
        MAT(NAME("attn_v.weight"), E, kvd);                      /* [n_embd, n_head_kv * hd] */
        MAT(NAME("attn_output.weight"), qd, E);                  /* [n_head * hd, n_embd] */
        desc(&t[k++], NAME("ffn_norm.weight"), TDM_F32, E, 0);   /* [n_embd] */
        if (s->n_expert) {
            const int64_t f = shape_ff_exp(s);
            desc(&t[k], NAME("ffn_gate_inp.weight"), TDM_F32, E, s->n_expert); /* [n_embd, x] */
            t[k++].random = true;
            EXPS(NAME("ffn_gate_exps.weight"), E, f);            /* [n_embd, f, x] */
            EXPS(NAME("ffn_up_exps.weight"), E, f);              /* [n_embd, f, x] */
            EXPS(NAME("ffn_down_exps.weight"), f, E);            /* [f, n_embd, x] */
        } else {
            MAT(NAME("ffn_gate.weight"), E, s->n_ff);            /* [n_embd, n_ff] */
            MAT(NAME("ffn_up.weight"), E, s->n_ff);              /* [n_embd, n_ff] */
            MAT(NAME("ffn_down.weight"), s->n_ff, E);            /* [n_ff, n_embd] */
        }
        if (shape_qk_norm(s)) {
            desc(&t[k++], NAME("attn_q_norm.weight"), TDM_F32, hd, 0); /* [hd] */
            desc(&t[k++], NAME("attn_k_norm.weight"), TDM_F32, hd, 0); /* [hd] */
        }
        if (shape_post_norms(s)) {
            desc(&t[k++], NAME("post_attention_norm.weight"), TDM_F32, E, 0); /* [n_embd] */
            desc(&t[k++], NAME("post_ffw_norm.weight"), TDM_F32, E, 0);       /* [n_embd] */
        }
#undef NAME
    }
#undef MAT
#undef EXPS
    *n = k;
    return t;
}

/* ------------------------------------------------------------ metadata */

static tandem_status copy_tokenizer(tdm_gguf_writer *w, const char *path, const tdm_synth_shape *s,
                                    tdm_err *err) {
    tdm_gguf *g = NULL;
    tdm_err e = {0};
    tandem_status st = tdm_gguf_open(path, &g, &e);
    if (st) {
        if (strstr(e.msg, path)) return tdm_seterr(err, st, "%s", e.msg);
        return tdm_seterr(err, st, "tokenizer file '%s': %s", path, e.msg[0] ? e.msg : tandem_status_str(st));
    }
    const tdm_gguf_array *toks;
    if ((st = tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", TDM_GGUF_STRING, &toks, &e))) {
        tdm_gguf_close(g);
        return tdm_seterr(err, st, "tokenizer file '%s' has no token list: %s", path, e.msg);
    }
    if (toks->n != (uint64_t)s->n_vocab) {
        uint64_t n = toks->n;
        tdm_gguf_close(g);
        return tdm_seterr(err, TANDEM_ERR_MISMATCH,
                          "the tokenizer of '%s' has %llu tokens, but shape %s has a vocabulary of %d", path,
                          (unsigned long long)n, s->name, (int)s->n_vocab);
    }
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (strncmp(g->kv[i].key, "tokenizer.", 10) == 0) tdm_gguf_w_value(w, g->kv[i].key, &g->kv[i].value);
    tdm_gguf_close(g);
    return TANDEM_OK;
}

static tandem_status write_metadata(tdm_gguf_writer *w, const tdm_synth_opts *o, tdm_err *err) {
    const tdm_synth_shape *s = o->shape;
    const char *arch = shape_arch(s);
    const bool llama = !s->arch || shape_eagle3(s);
    char text[160], key[96];
    tdm_gguf_w_str(w, "general.architecture", arch);
    snprintf(text, sizeof text, "synth-%s-%s", s->name, o->kind ? o->kind->name : tdm_dtype_name(o->type));
    tdm_gguf_w_str(w, "general.name", text);
    snprintf(text, sizeof text, "random weights with the shapes of %s, written by tandem synth (seed %llu)",
             s->name, (unsigned long long)o->seed);
    tdm_gguf_w_str(w, "general.description", text);
    tdm_gguf_w_u32(w, "general.file_type", o->kind ? o->kind->file_type : tdm_synth_file_type(o->type));
#define KEY(x) (snprintf(key, sizeof key, "%s." x, arch), key)
    tdm_gguf_w_u32(w, KEY("context_length"), (uint32_t)s->n_ctx);
    tdm_gguf_w_u32(w, KEY("embedding_length"), (uint32_t)s->n_embd);
    tdm_gguf_w_u32(w, KEY("block_count"), (uint32_t)s->n_layer);
    tdm_gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)s->n_ff);
    tdm_gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)s->n_head);
    tdm_gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)s->n_head_kv);
    if (s->head_dim) {
        tdm_gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)s->head_dim);
        tdm_gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)s->head_dim);
    }
    tdm_gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), llama ? 1e-5f : 1e-6f);
    tdm_gguf_w_f32(w, KEY("rope.freq_base"), s->rope_base);
    tdm_gguf_w_u32(w, KEY("rope.dimension_count"), (uint32_t)shape_hd(s));
    if (s->sliding_window) tdm_gguf_w_u32(w, KEY("attention.sliding_window"), (uint32_t)s->sliding_window);
    if (s->n_expert) {
        tdm_gguf_w_u32(w, KEY("expert_count"), (uint32_t)s->n_expert);
        tdm_gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)s->n_expert_used);
        if (s->n_ff_exp) tdm_gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)s->n_ff_exp);
    }
    tdm_gguf_w_u32(w, KEY("vocab_size"), (uint32_t)s->n_vocab);
    if (shape_eagle3(s)) {
        tdm_gguf_w_arr_i32(w, KEY("target_layers"), s->feat_layers, 3);
        tdm_gguf_w_u32(w, KEY("target_hidden_size"), (uint32_t)s->n_embd);
    }
#undef KEY
    if (o->tokenizer_from) return copy_tokenizer(w, o->tokenizer_from, s, err);
    return tdm_synth_vocab(w, s->n_vocab, err);
}

tandem_status tdm_synth_plan(const tdm_synth_opts *o, tdm_gguf_writer **out, tdm_synth_info *info,
                             tdm_err *err) {
    *out = NULL;
    if (!o || !o->shape) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "synth: no shape");
    if (!o->kind && !tdm_synth_file_type(o->type))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "synth: matrix type %s is not f16, q8_0, q4_0, q4_k, q5_k or q6_k",
                          tdm_dtype_name(o->type));
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    size_t n = 0;
    tdesc *t = tensor_list(o, &n);
    if (!w || !t) {
        tdm_gguf_writer_free(w);
        free(t);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    tandem_status st = TANDEM_OK;
    for (size_t i = 0; i < n && !st; i++) /* (a type's blocks must tile the rows: q4_k's 256 values, ...) */
        if (t[i].type != GGML_I64 && t[i].ne0 % (int64_t)tdm_dtype_block_elems(t[i].type))
            st = tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "synth: shape %s: tensor '%s' has rows of %lld values, not "
                            "whole %s blocks of %u", o->shape->name, t[i].name, (long long)t[i].ne0,
                            tdm_dtype_name(t[i].type), (unsigned)tdm_dtype_block_elems(t[i].type));
    if (!st) st = write_metadata(w, o, err);
    uint64_t n_params = 0;
    for (size_t i = 0; i < n && !st; i++) {
        int64_t ne[3] = {t[i].ne0, t[i].ne1, t[i].ne2};
        tdm_gguf_w_tensor_info(w, t[i].name, t[i].type, tdesc_dims(&t[i]), ne, t[i].nbytes);
        n_params += (uint64_t)t[i].ne0 * (uint64_t)(t[i].ne1 ? t[i].ne1 : 1) * (uint64_t)t[i].ne2;
    }
    free(t);
    uint64_t head = 0, total = 0;
    if (!st && (st = tdm_gguf_writer_sizes(w, &head, &total)))
        st = tdm_seterr(err, st, "synth: building the header: %s", tandem_status_str(st));
    if (st) {
        tdm_gguf_writer_free(w);
        return st;
    }
    if (info) *info = (tdm_synth_info){.n_tensors = n, .n_params = n_params, .file_bytes = total};
    *out = w;
    return TANDEM_OK;
}

/* ------------------------------------------------------------ random tiles */

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct tile {
    int64_t cols;       /* the row length it serves */
    uint32_t type;      /* and the type */
    uint8_t *data;      /* [n_blocks * block_bytes] */
    size_t n_blocks, block_bytes;
} tile;

#define MAX_TILES 12 /* (row length, type) pairs: 3 lengths x 2 types in a mix; an EAGLE-3 head's 5 lengths */
#define GEN_CHUNK 4096 /* elements converted at a time (a multiple of the block) */

/* Fills t with n_blocks blocks of `type` encoding uniform values for rows of cols. */
static tandem_status tile_make(tile *t, uint32_t type, int64_t cols, size_t n_blocks, uint64_t seed, tdm_err *err) {
    t->cols = cols;
    t->type = type;
    t->block_bytes = tdm_dtype_block_bytes(type);
    t->n_blocks = n_blocks;
    t->data = tdm_mallocarray(n_blocks, t->block_bytes);
    if (!t->data) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory for a %zu-block tile", n_blocks);
    float buf[GEN_CHUNK];
    uint64_t rng = seed ^ ((uint64_t)cols * 0xd1342543de82ef95ull);
    double a = sqrt(3.0) * 0.5 / sqrt((double)cols);
    size_t be = tdm_dtype_block_elems(type);
    size_t n_elems = n_blocks * be;
    for (size_t done = 0; done < n_elems;) {
        size_t k = TDM_MIN((size_t)GEN_CHUNK, n_elems - done);
        for (size_t i = 0; i < k; i += 2) {
            uint64_t r = splitmix(&rng);
            buf[i] = (float)(a * ((double)(r >> 40) * 0x1.0p-23 - 1.0));
            if (i + 1 < k) buf[i + 1] = (float)(a * ((double)((r >> 8) & 0xffffff) * 0x1.0p-23 - 1.0));
        }
        tdm_row_from_f32(type, buf, t->data + done / be * t->block_bytes, (int64_t)k);
        done += k;
    }
    return TANDEM_OK;
}

/* The tile for rows of cols: made on first use, as large as the largest tensor of
 * that row length needs (at most tile_bytes). */
static tandem_status tile_get(tile *tiles, size_t *n_tiles, const tdesc *list, size_t n, const tdm_synth_opts *o,
                              uint32_t type, int64_t cols, const tile **out, tdm_err *err) {
    for (size_t i = 0; i < *n_tiles; i++)
        if (tiles[i].cols == cols && tiles[i].type == type) {
            *out = &tiles[i];
            return TANDEM_OK;
        }
    if (*n_tiles == MAX_TILES) return tdm_seterr(err, TANDEM_ERR_INTERNAL, "synth: too many row lengths and types");
    size_t bb = tdm_dtype_block_bytes(type);
    uint64_t need = 0;
    for (size_t i = 0; i < n; i++)
        if (list[i].type == type && list[i].ne0 == cols) need = TDM_MAX(need, list[i].nbytes / bb);
    size_t cap = (o->tile_bytes ? o->tile_bytes : TDM_SYNTH_TILE_BYTES) / bb;
    size_t n_blocks = (size_t)TDM_MAX((uint64_t)1, TDM_MIN(need, (uint64_t)cap));
    tandem_status st = tile_make(&tiles[*n_tiles], type, cols, n_blocks, o->seed, err);
    if (st) return st;
    *out = &tiles[(*n_tiles)++];
    return TANDEM_OK;
}

/* ------------------------------------------------------------ writing */

static tandem_status write_chunk(tdm_gguf_writer *w, const void *p, size_t n, uint64_t *done, uint64_t total,
                                 const tdm_synth_opts *o, tdm_err *err) {
    tandem_status st = tdm_gguf_stream_write(w, p, n, err);
    if (st) return st;
    *done += n;
    if (o->progress && !o->progress(o->progress_ctx, *done, total))
        return tdm_seterr(err, TANDEM_ERR_CANCELLED, "cancelled");
    return TANDEM_OK;
}

/* Streams every tensor's data. */
static tandem_status write_data(tdm_gguf_writer *w, const tdm_synth_opts *o, uint64_t head, uint64_t total,
                                tdm_err *err) {
    size_t n = 0;
    tdesc *list = tensor_list(o, &n);
    const int32_t n_ones = TDM_MAX(o->shape->n_embd, shape_hd(o->shape));
    float *ones = tdm_mallocarray((size_t)n_ones, sizeof *ones);
    tile tiles[MAX_TILES] = {0};
    size_t n_tiles = 0;
    tandem_status st = TANDEM_OK;
    if (!list || !ones) st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    for (int32_t i = 0; !st && i < n_ones; i++) ones[i] = 1.0f;
    uint64_t done = head, rng = o->seed * 0x2545f4914f6cdd1dull + 1;
    for (size_t i = 0; !st && i < n; i++) {
        const tdesc *d = &list[i];
        uint64_t start = splitmix(&rng);
        if (d->type == TDM_F32 && !strcmp(d->name, "rope_freqs.weight")) {
            float ff[512];
            if (d->ne0 > 512) {
                st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "synth: rope_freqs of %lld pairs", (long long)d->ne0);
                break;
            }
            llama3_rope_freqs((int32_t)d->ne0 * 2, o->shape->rope_base, ff);
            st = write_chunk(w, ff, (size_t)d->nbytes, &done, total, o, err);
            continue;
        }
        if (d->type == GGML_I64) { /* d2t: target ids spread over the vocabulary, ascending */
            const tdm_synth_shape *sh = o->shape;
            for (int64_t j = 0; !st && j < d->ne0; j += 512) {
                int64_t ids[512];
                const int64_t m = TDM_MIN((int64_t)512, d->ne0 - j);
                for (int64_t i = 0; i < m; i++) ids[i] = (j + i) * sh->n_vocab / sh->n_draft_vocab;
                st = write_chunk(w, ids, (size_t)m * 8, &done, total, o, err);
            }
            continue;
        }
        if (d->type == TDM_F32 && !d->random) { /* a norm: [n_embd] or [hd] of 1.0 */
            st = write_chunk(w, ones, (size_t)d->nbytes, &done, total, o, err);
            continue;
        }
        const tile *t = NULL;
        if ((st = tile_get(tiles, &n_tiles, list, n, o, d->type, d->ne0, &t, err))) break;
        size_t tile_bytes = t->n_blocks * t->block_bytes;
        size_t pos = (size_t)(start % t->n_blocks) * t->block_bytes;
        for (uint64_t left = d->nbytes; !st && left > 0;) {
            size_t k = (size_t)TDM_MIN(left, (uint64_t)(tile_bytes - pos));
            st = write_chunk(w, t->data + pos, k, &done, total, o, err);
            left -= k;
            pos = 0;
        }
    }
    for (size_t i = 0; i < n_tiles; i++) free(tiles[i].data);
    free(ones);
    free(list);
    return st;
}

tandem_status tdm_synth_write(const tdm_synth_opts *o, const char *path, tdm_synth_info *info, tdm_err *err) {
    if (!path || !*path) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "synth: no output path");
    struct stat sb;
    if (!o->overwrite && lstat(path, &sb) == 0)
        return tdm_seterr(err, TANDEM_ERR_IO, "'%s' already exists", path);
    tdm_gguf_writer *w;
    tdm_synth_info inf;
    tandem_status st = tdm_synth_plan(o, &w, &inf, err);
    if (st) return st;
    if (info) *info = inf;
    uint64_t head = 0, total = 0;
    tdm_gguf_writer_sizes(w, &head, &total);

    size_t plen = strlen(path);
    char *tmp = tdm_malloc(plen + 5);
    if (!tmp) {
        tdm_gguf_writer_free(w);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = tdm_seterr(err, TANDEM_ERR_IO, "cannot create '%s': %s", tmp, strerror(errno));
        free(tmp);
        tdm_gguf_writer_free(w);
        return st;
    }
    struct statvfs vfs;
    if (fstatvfs(fileno(f), &vfs) == 0 && vfs.f_frsize &&
        (uint64_t)vfs.f_bavail < total / vfs.f_frsize + 1)
        st = tdm_seterr(err, TANDEM_ERR_IO, "'%s': not enough free space (%llu bytes needed, %llu available)", tmp,
                        (unsigned long long)total, (unsigned long long)vfs.f_bavail * vfs.f_frsize);
    if (!st && o->progress && !o->progress(o->progress_ctx, 0, total))
        st = tdm_seterr(err, TANDEM_ERR_CANCELLED, "cancelled");
    if (!st) st = tdm_gguf_stream_begin(w, f, tmp, err);
    if (!st) st = write_data(w, o, head, total, err);
    if (!st) st = tdm_gguf_stream_end(w, err);
    tdm_gguf_writer_free(w);
    if (fclose(f) != 0 && !st) st = tdm_seterr(err, TANDEM_ERR_IO, "writing '%s': %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = tdm_seterr(err, TANDEM_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (st) unlink(tmp);
    free(tmp);
    return st;
}
