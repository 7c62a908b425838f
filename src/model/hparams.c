/* hparams.c - a model's hyperparameters from its GGUF metadata, read as llama.cpp
 * reads them for the architectures tandem runs (llama, qwen2, qwen3, gemma3,
 * qwen3moe, and llama with experts: Mixtral; see
 * docs/DESIGN.md, "Architectures").  Every key is "<arch>.<suffix>"; a missing
 * required key or a value out of range is a TANDEM_ERR_FORMAT error naming it, an
 * architecture or scaling tandem does not run a TANDEM_ERR_UNSUPPORTED one. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Sane limits for hyperparameters read from an untrusted file. */
#define MAX_EMBD   (1 << 16)
#define MAX_LAYER  1024
#define MAX_HEAD   1024
#define MAX_FF     (1 << 20)
#define MAX_VOCAB  (1 << 22)
#define MAX_HDIM   1024
#define MAX_CTX    (1u << 24)

static tandem_status get_u32_key(const tdm_gguf *g, const char *arch, const char *suffix,
                                 bool required, uint32_t def, uint32_t *out, tdm_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (required) return tdm_gguf_get_u32(g, key, out, err);
    return tdm_gguf_opt_u32(g, key, def, out, err);
}

static tandem_status get_f32_key(const tdm_gguf *g, const char *arch, const char *suffix,
                                 bool required, float def, float *out, tdm_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (required) return tdm_gguf_get_f32(g, key, out, err);
    return tdm_gguf_opt_f32(g, key, def, out, err);
}

static bool has_key(const tdm_gguf *g, const char *arch, const char *suffix) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return tdm_gguf_find(g, key) != NULL;
}

static tandem_status check_range(const char *what, uint32_t v, uint32_t lo, uint32_t hi, tdm_err *err) {
    if (v < lo || v > hi)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "hyperparameter %s = %u is out of range [%u, %u]",
                          what, v, lo, hi);
    return TANDEM_OK;
}

/* An optional positive finite float key (absent: def). */
static tandem_status get_pos_f32(const tdm_gguf *g, const char *arch, const char *suffix, float def, float *out,
                                 tdm_err *err) {
    tandem_status st = get_f32_key(g, arch, suffix, false, def, out, err);
    if (st) return st;
    if (!(*out > 0 && isfinite(*out)))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "hyperparameter %s.%s = %g is invalid (must be positive)", arch,
                          suffix, (double)*out);
    return TANDEM_OK;
}

static const struct {
    const char *name;
    uint32_t id;
} k_archs[] = {{"llama", TDM_ARCH_LLAMA}, {"qwen2", TDM_ARCH_QWEN2}, {"qwen3", TDM_ARCH_QWEN3}, {"gemma3", TDM_ARCH_GEMMA3},
                {"qwen3moe", TDM_ARCH_QWEN3MOE}, {"eagle3", TDM_ARCH_EAGLE3}};

/* The RoPE scaling: rope.scaling.type none / linear / yarn.  As in llama.cpp, an
 * absent type means linear with rope.scaling.factor (or the older
 * rope.scale_linear) when one is given; a type that scales needs the factor. */
static tandem_status read_rope_scaling(const tdm_gguf *g, const char *a, uint32_t n_ctx, tdm_rope_scaling *out,
                                       tdm_err *err) {
    char key[128];
    tandem_status st;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    uint32_t type = TDM_ROPE_SCALING_LINEAR;
    bool typed = tdm_gguf_find(g, key) != NULL;
    if (typed) {
        tdm_gguf_str s;
        if ((st = tdm_gguf_get_str(g, key, &s, err))) return st;
        if (s.len == 4 && memcmp(s.ptr, "none", 4) == 0) type = TDM_ROPE_SCALING_NONE;
        else if (s.len == 6 && memcmp(s.ptr, "linear", 6) == 0) type = TDM_ROPE_SCALING_LINEAR;
        else if (s.len == 4 && memcmp(s.ptr, "yarn", 4) == 0) type = TDM_ROPE_SCALING_YARN;
        else
            return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                              "unsupported rope scaling type '%.*s' in %s (supported: none, linear, yarn)",
                              (int)TDM_MIN(s.len, 32), s.ptr, key);
    }
    float factor = 1.0f;
    if (type != TDM_ROPE_SCALING_NONE) {
        const char *fk = has_key(g, a, "rope.scaling.factor") || !has_key(g, a, "rope.scale_linear")
                             ? "rope.scaling.factor"
                             : "rope.scale_linear";
        if ((st = get_f32_key(g, a, fk, typed, 1.0f, &factor, err))) return st;
        if (!(factor > 0 && isfinite(factor)))
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "%s.%s %g is invalid", a, fk, (double)factor);
    }
    float attn_factor;
    if ((st = get_pos_f32(g, a, "rope.scaling.attn_factor", 1.0f, &attn_factor, err))) return st;
    uint32_t n_orig = n_ctx;
    if (type == TDM_ROPE_SCALING_YARN) {
        if ((st = get_u32_key(g, a, "rope.scaling.original_context_length", false, n_ctx, &n_orig, err)) ||
            (st = check_range("rope.scaling.original_context_length", n_orig, 1, MAX_CTX, err)))
            return st;
    }
    *out = tdm_rope_scaling_make(type, factor, attn_factor, (int32_t)n_orig);
    return TANDEM_OK;
}

/* The mixture-of-experts keys, as llama.cpp reads them: expert_count (0 or absent:
 * a dense FFN; qwen3moe needs experts, and only llama and qwen3moe run them) and
 * expert_used_count in [1, expert_count]; qwen3moe's experts have
 * expert_feed_forward_length features (absent: feed_forward_length /
 * expert_used_count), Mixtral's feed_forward_length.  *n_ff is the experts'. */
static tandem_status read_experts(const tdm_gguf *g, const char *a, tdm_hparams *hp, uint32_t *n_ff, bool has_ff,
                                  tdm_err *err) {
    uint32_t n_exp, n_used = 0, ff_exp;
    tandem_status st;
    if ((st = get_u32_key(g, a, "expert_count", hp->arch_id == TDM_ARCH_QWEN3MOE, 0, &n_exp, err)) ||
        (st = check_range("expert_count", n_exp, hp->arch_id == TDM_ARCH_QWEN3MOE ? 1 : 0, TDM_MAX_EXPERTS, err)))
        return st;
    if (n_exp == 0) return TANDEM_OK;
    if (hp->arch_id != TDM_ARCH_LLAMA && hp->arch_id != TDM_ARCH_QWEN3MOE)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "%s.expert_count is %u: tandem runs experts only in llama (Mixtral) and qwen3moe models", a,
                          n_exp);
    if ((st = get_u32_key(g, a, "expert_used_count", true, 0, &n_used, err)) ||
        (st = check_range("expert_used_count", n_used, 1, n_exp, err)))
        return st;
    if (hp->arch_id == TDM_ARCH_QWEN3MOE) {
        if (!has_key(g, a, "expert_feed_forward_length") && !has_ff)
            return tdm_seterr(err, TANDEM_ERR_FORMAT, "missing key %s.expert_feed_forward_length", a);
        if ((st = get_u32_key(g, a, "expert_feed_forward_length", false, *n_ff / n_used, &ff_exp, err)) ||
            (st = check_range("expert_feed_forward_length", ff_exp, 1, MAX_FF, err)))
            return st;
        *n_ff = ff_exp;
    }
    hp->n_expert = (int32_t)n_exp;
    hp->n_expert_used = (int32_t)n_used;
    return TANDEM_OK;
}

/* gemma3's keys: the sliding window (required), the layer pattern and RoPE base of
 * its sliding-window layers (llama.cpp's constants), the optional soft-caps, the
 * attention scale. */
static tandem_status read_gemma3(const tdm_gguf *g, const char *a, tdm_hparams *hp, tdm_err *err) {
    uint32_t win;
    tandem_status st;
    if ((st = get_u32_key(g, a, "attention.sliding_window", true, 0, &win, err)) ||
        (st = check_range("attention.sliding_window", win, 1, MAX_CTX, err)))
        return st;
    hp->swa_window = (int32_t)win;
    hp->swa_pattern = 6; /* five sliding-window layers, then a global one */
    if (has_key(g, a, "attn_logit_softcapping") &&
        (st = get_pos_f32(g, a, "attn_logit_softcapping", 0, &hp->attn_softcap, err)))
        return st;
    if (has_key(g, a, "final_logit_softcapping") &&
        (st = get_pos_f32(g, a, "final_logit_softcapping", 0, &hp->final_softcap, err)))
        return st;
    /* llama.cpp (from gemma_pytorch's query_pre_attn_scalar): the 27B model (62
     * layers) scales by n_embd / n_head, the others by the head dimension */
    hp->attn_scale = hp->n_layer == 62 ? 1.0f / sqrtf((float)(hp->n_embd / hp->n_head))
                                       : 1.0f / sqrtf((float)hp->head_dim);
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->rope_swa.freq_base = 10000.0f;
    hp->rope_swa.freq_scale = 1.0f;
    hp->rope_swa.mscale = tdm_rope_mscale(&hp->rope_scaling, 1.0f);
    hp->qk_norm = hp->post_norms = true;
    hp->ffn_act = TDM_ACT_GELU_TANH;
    return TANDEM_OK;
}

tandem_status tdm_hparams_read(const tdm_gguf *g, tdm_hparams *hp, tdm_err *err) {
    memset(hp, 0, sizeof *hp);
    tdm_gguf_str arch;
    tandem_status st = tdm_gguf_get_str(g, "general.architecture", &arch, err);
    if (st) return st;
    size_t ai = TDM_ARRAY_LEN(k_archs);
    for (size_t i = 0; i < TDM_ARRAY_LEN(k_archs); i++)
        if (arch.len == strlen(k_archs[i].name) && memcmp(arch.ptr, k_archs[i].name, arch.len) == 0) ai = i;
    if (ai == TDM_ARRAY_LEN(k_archs))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                          "unsupported architecture '%.*s' (supported: llama, qwen2, qwen3, gemma3, qwen3moe)",
                          (int)TDM_MIN(arch.len, 64), arch.ptr);
    memcpy(hp->arch, arch.ptr, arch.len);
    hp->arch_id = k_archs[ai].id;
    const char *a = hp->arch;

    uint32_t n_ctx, n_embd, n_layer, n_ff, n_head, n_head_kv, n_rot, key_len, val_len, n_vocab;
    /* (qwen3moe: optional, its experts' size has its own key) */
    const bool moe = hp->arch_id == TDM_ARCH_QWEN3MOE, has_ff = has_key(g, a, "feed_forward_length");
    if ((st = get_u32_key(g, a, "context_length", false, 4096, &n_ctx, err)) ||
        (st = get_u32_key(g, a, "embedding_length", true, 0, &n_embd, err)) ||
        (st = get_u32_key(g, a, "block_count", true, 0, &n_layer, err)) ||
        (st = get_u32_key(g, a, "feed_forward_length", !moe, 0, &n_ff, err)) ||
        (st = get_u32_key(g, a, "attention.head_count", true, 0, &n_head, err)))
        return st;
    if ((st = check_range("embedding_length", n_embd, 1, MAX_EMBD, err)) ||
        (st = check_range("block_count", n_layer, 1, MAX_LAYER, err)) ||
        ((!moe || has_ff) && (st = check_range("feed_forward_length", n_ff, 1, MAX_FF, err))) ||
        (st = check_range("attention.head_count", n_head, 1, MAX_HEAD, err)) ||
        (st = check_range("context_length", n_ctx, 1, MAX_CTX, err)))
        return st;
    if ((st = get_u32_key(g, a, "attention.head_count_kv", false, n_head, &n_head_kv, err))) return st;
    if ((st = check_range("attention.head_count_kv", n_head_kv, 1, n_head, err))) return st;
    if (n_head % n_head_kv)
        return tdm_seterr(err, TANDEM_ERR_FORMAT,
                          "head_count %u is not a multiple of head_count_kv %u", n_head, n_head_kv);
    uint32_t def_hd = n_embd / n_head;
    if ((st = get_u32_key(g, a, "attention.key_length", false, def_hd, &key_len, err))) return st;
    if ((st = check_range("attention.key_length", key_len, 2, MAX_HDIM, err))) return st;
    if (key_len % 2)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "head dimension %u is odd", key_len);
    if ((st = get_u32_key(g, a, "attention.value_length", false, key_len, &val_len, err))) return st;
    if (val_len != key_len)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "%s.attention.value_length %u differs from key_length %u", a,
                          val_len, key_len);
    if ((st = get_u32_key(g, a, "rope.dimension_count", false, key_len, &n_rot, err))) return st;
    if (n_rot > key_len || n_rot % 2 || n_rot == 0)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "rope.dimension_count %u invalid for head dim %u",
                          n_rot, key_len);

    const tdm_gguf_value *tokens = tdm_gguf_find(g, "tokenizer.ggml.tokens");
    uint32_t def_vocab = 0;
    if (tokens && tokens->type == TDM_GGUF_ARRAY && tokens->v.arr.n <= MAX_VOCAB)
        def_vocab = (uint32_t)tokens->v.arr.n;
    if ((st = get_u32_key(g, a, "vocab_size", def_vocab == 0, def_vocab, &n_vocab, err))) return st;
    if ((st = check_range("vocab_size", n_vocab, 1, MAX_VOCAB, err))) return st;

    float eps, freq_base;
    if ((st = get_f32_key(g, a, "attention.layer_norm_rms_epsilon", false, 1e-5f, &eps, err)) ||
        (st = get_f32_key(g, a, "rope.freq_base", false, 10000.0f, &freq_base, err)))
        return st;
    if (!(eps > 0 && eps < 1))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "layer_norm_rms_epsilon %g is out of range", eps);
    if (!(freq_base > 0 && isfinite(freq_base)))
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "rope.freq_base %g is invalid", freq_base);
    if ((st = read_rope_scaling(g, a, n_ctx, &hp->rope_scaling, err))) return st;
    if ((st = read_experts(g, a, hp, &n_ff, has_ff, err))) return st;

    hp->n_vocab = (int32_t)n_vocab;
    hp->n_ctx_train = (int32_t)n_ctx;
    hp->n_embd = (int32_t)n_embd;
    hp->n_layer = (int32_t)n_layer;
    hp->n_head = (int32_t)n_head;
    hp->n_head_kv = (int32_t)n_head_kv;
    hp->head_dim = (int32_t)key_len;
    hp->n_ff = (int32_t)n_ff;
    hp->norm_eps = eps;
    hp->rope.n_rot = (int32_t)n_rot;
    hp->rope.freq_base = freq_base;
    hp->rope.freq_scale = 1.0f / hp->rope_scaling.factor;
    /* (eagle3: llama.cpp's LLAMA_ROPE_TYPE_NORM, adjacent pairs, as llama) */
    const bool llama_like = hp->arch_id == TDM_ARCH_LLAMA || hp->arch_id == TDM_ARCH_EAGLE3;
    hp->rope.neox = !llama_like;
    hp->rope.mscale = tdm_rope_mscale(&hp->rope_scaling, hp->rope.freq_scale);
    hp->rope_swa = hp->rope;
    hp->qkv_bias = hp->arch_id == TDM_ARCH_QWEN2;
    hp->qk_norm = hp->arch_id == TDM_ARCH_QWEN3 || hp->arch_id == TDM_ARCH_QWEN3MOE;
    hp->ffn_act = TDM_ACT_SILU;
    hp->embd_scale = 1.0f;
    hp->attn_scale = 1.0f / sqrtf((float)key_len);
    hp->rope_freqs = llama_like && tdm_gguf_find_tensor(g, "rope_freqs.weight") != NULL;
    hp->tied_output = tdm_gguf_find_tensor(g, "output.weight") == NULL;
    if (hp->arch_id == TDM_ARCH_GEMMA3 && (st = read_gemma3(g, a, hp, err))) return st;
    return TANDEM_OK;
}
