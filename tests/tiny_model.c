/* tiny_model.c - random-weight llama / qwen2 / qwen3 / gemma3 models for tests. */
#include "tiny_model.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "gguf_write.h"
#include "testutil.h"

tdm_tiny_cfg tdm_tiny_default(void) {
    tdm_tiny_cfg c = {.n_vocab = 16, .n_embd = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 96,
                      .wtype = TDM_F32, .scale = 0.15f, .emb_scale = 0.4f, .seed = 1, .arch = "llama", .eos = -1};
    return c;
}

/* Writes a random tensor [ne1][ne0] (ne1 == 1: a 1-D tensor of ne0).  skip: generate
 * the values but leave the tensor out; extra_row: write ne1 + 1 rows (a wrong shape);
 * plant (non-NULL): its first value is *plant (q8_0: its first block's scale). */
static void add_tensor_ex(tdm_gguf_writer *w, const char *name, uint32_t type, int64_t ne0, int64_t ne1,
                          uint64_t *rng, float scale, float bias, bool skip, bool extra_row, const float *plant) {
    int64_t rows = ne1 + (extra_row ? 1 : 0);
    int64_t n = ne0 * rows;
    float *f = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = bias + tdm_test_randf(rng, -scale, scale);
    const bool q8 = type == TDM_Q8_0;
    cr_assert(!plant || q8 || type == TDM_F32 || type == TDM_F16 || type == TDM_BF16, "%s: no value planted in a %s",
              name, tdm_dtype_name(type));
    if (plant && !q8) f[0] = *plant;
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(type, (uint64_t)ne0, &rb));
    uint8_t *data = malloc((size_t)(rb * (uint64_t)rows));
    for (int64_t r = 0; r < rows; r++) tdm_row_from_f32(type, f + r * ne0, data + r * rb, ne0);
    if (plant && q8) { /* the first block's scale (quantising a NaN has no defined result) */
        const uint16_t d = tdm_f32_to_f16(*plant);
        memcpy(data + offsetof(tdm_block_q8_0, d), &d, sizeof d);
    }
    int64_t ne[2] = {ne0, rows};
    if (!skip) tdm_gguf_w_tensor(w, name, type, rows > 1 ? 2 : 1, ne, data, (size_t)(rb * (uint64_t)rows));
    free(f);
    free(data);
}

/* The value nan_tensor's first element gets (NaN unless nan_value says otherwise). */
static float planted(const tdm_tiny_cfg *c) { return c->nan_value != 0 ? c->nan_value : NAN; }

/* The same, applying the config's skip_tensor / bad_shape_tensor / nan_tensor to this name. */
static void add_tensor(tdm_gguf_writer *w, const tdm_tiny_cfg *c, const char *name, uint32_t type, int64_t ne0,
                       int64_t ne1, uint64_t *rng, float scale, float bias) {
    bool skip = c->skip_tensor && strcmp(c->skip_tensor, name) == 0;
    bool bad = c->bad_shape_tensor && strcmp(c->bad_shape_tensor, name) == 0;
    const float plant = planted(c);
    const bool nan = c->nan_tensor && strcmp(c->nan_tensor, name) == 0;
    add_tensor_ex(w, name, type, ne0, ne1, rng, scale, bias, skip, bad, nan ? &plant : NULL);
}

/* A random 3-D tensor [ne2][ne1][ne0] (experts), with the config's skip_tensor,
 * bad_shape_tensor (one row more per expert), extra_expert_tensor, flat_tensor and
 * nan_tensor (f32, f16, bf16). */
static void add_tensor3(tdm_gguf_writer *w, const tdm_tiny_cfg *c, const char *name, uint32_t type, int64_t ne0,
                        int64_t ne1, int64_t ne2, uint64_t *rng, float scale) {
    const bool is = c->skip_tensor && !strcmp(c->skip_tensor, name);
    if (c->bad_shape_tensor && !strcmp(c->bad_shape_tensor, name)) ne1++;
    if (c->extra_expert_tensor && !strcmp(c->extra_expert_tensor, name)) ne2++;
    const int64_t n = ne0 * ne1 * ne2;
    float *f = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = tdm_test_randf(rng, -scale, scale);
    if (c->nan_tensor && !strcmp(c->nan_tensor, name)) {
        cr_assert(type == TDM_F32 || type == TDM_F16 || type == TDM_BF16, "%s: no value planted in a %s", name,
                  tdm_dtype_name(type));
        f[0] = planted(c);
    }
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(type, (uint64_t)ne0, &rb));
    uint8_t *data = malloc((size_t)(rb * (uint64_t)(ne1 * ne2)));
    for (int64_t r = 0; r < ne1 * ne2; r++) tdm_row_from_f32(type, f + r * ne0, data + r * rb, ne0);
    const bool flat = c->flat_tensor && !strcmp(c->flat_tensor, name);
    int64_t ne[3] = {ne0, flat ? ne1 * ne2 : ne1, ne2};
    if (!is) tdm_gguf_w_tensor(w, name, type, flat ? 2 : 3, ne, data, (size_t)(rb * (uint64_t)(ne1 * ne2)));
    free(f);
    free(data);
}

/* Llama 3's rope_freqs (as llama.cpp's converter computes them from the config's
 * rope_scaling): 1 for wavelengths below orig / 4, 8 above orig, smoothly between. */
static void llama3_rope_freqs(int32_t n_rot, float base, int32_t orig, float *ff) {
    const double factor = 8, low = 1, high = 4;
    const double low_wl = orig / low, high_wl = orig / high;
    for (int32_t t = 0; t < n_rot / 2; t++) {
        double freq = 1.0 / pow(base, 2.0 * t / n_rot), wl = 2 * M_PI / freq;
        if (wl < high_wl) ff[t] = 1.0f;
        else if (wl > low_wl) ff[t] = (float)factor;
        else {
            double smooth = (orig / wl - low) / (high - low);
            ff[t] = (float)(1.0 / ((1 - smooth) / factor + smooth));
        }
    }
}

char *tdm_tiny_model_file(const tdm_tiny_cfg *c) {
    const char *arch = c->arch ? c->arch : "llama";
    bool qwen = strcmp(arch, "qwen2") == 0;
    bool qk_norm = strcmp(arch, "qwen3") == 0 || strcmp(arch, "gemma3") == 0 || strcmp(arch, "qwen3moe") == 0;
    bool post_norms = strcmp(arch, "gemma3") == 0;
    const float base = c->rope_base > 0 ? c->rope_base : 10000.0f;
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, c->alignment ? c->alignment : 32);
    cr_assert(w);
    char key[128];
    tdm_gguf_w_str(w, "general.architecture", arch);
    tdm_gguf_w_str(w, "general.name", "tiny-random");
#define KEY(s) (snprintf(key, sizeof key, "%s." s, arch), key)
    tdm_gguf_w_u32(w, KEY("context_length"), c->context_length > 0 ? (uint32_t)c->context_length : 256);
    tdm_gguf_w_u32(w, KEY("embedding_length"), (uint32_t)c->n_embd);
    tdm_gguf_w_u32(w, KEY("block_count"), (uint32_t)c->n_layer);
    const bool qmoe = strcmp(arch, "qwen3moe") == 0;
    /* (qwen3moe: the experts' size has its own key, as in Qwen3-30B-A3B's file) */
    tdm_gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)(qmoe ? 3 * c->n_ff : c->n_ff));
    if (c->n_expert) {
        tdm_gguf_w_u32(w, KEY("expert_count"), (uint32_t)c->n_expert);
        if (!c->no_expert_used_key) tdm_gguf_w_u32(w, KEY("expert_used_count"), (uint32_t)c->n_expert_used);
        if (qmoe) tdm_gguf_w_u32(w, KEY("expert_feed_forward_length"), (uint32_t)c->n_ff);
    }
    tdm_gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head);
    tdm_gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv);
    tdm_gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    tdm_gguf_w_f32(w, KEY("rope.freq_base"), base);
    if (c->rope_scale > 0) {
        tdm_gguf_w_str(w, KEY("rope.scaling.type"), c->rope_type ? c->rope_type : "linear");
        tdm_gguf_w_f32(w, KEY("rope.scaling.factor"), c->rope_scale);
    }
    if (c->yarn_orig_ctx > 0) tdm_gguf_w_u32(w, KEY("rope.scaling.original_context_length"), (uint32_t)c->yarn_orig_ctx);
    if (c->rope_attn_factor > 0) tdm_gguf_w_f32(w, KEY("rope.scaling.attn_factor"), c->rope_attn_factor);
    if (c->head_dim > 0) {
        tdm_gguf_w_u32(w, KEY("attention.key_length"), (uint32_t)c->head_dim);
        tdm_gguf_w_u32(w, KEY("attention.value_length"), (uint32_t)c->head_dim);
    }
    if (c->sliding_window) tdm_gguf_w_u32(w, KEY("attention.sliding_window"), (uint32_t)TDM_MAX(c->sliding_window, 0));
    if (c->attn_softcap > 0) tdm_gguf_w_f32(w, KEY("attn_logit_softcapping"), c->attn_softcap);
    if (c->final_softcap > 0) tdm_gguf_w_f32(w, KEY("final_logit_softcapping"), c->final_softcap);
#undef KEY
    /* vocabulary: single printable characters (byte-level BPE maps them to themselves) */
    char strs[90][2];
    const char *toks[90];
    int32_t types[90];
    cr_assert(c->n_vocab >= 2 && c->n_vocab <= 90);
    cr_assert(c->tok_offset >= 0 && c->n_vocab + c->tok_offset <= 94);
    for (int i = 0; i < c->n_vocab; i++) {
        strs[i][0] = (char)('!' + c->tok_offset + i);
        strs[i][1] = 0;
        toks[i] = strs[i];
        types[i] = 1;
    }
    tdm_gguf_w_str(w, "tokenizer.ggml.model", "gpt2");
    tdm_gguf_w_str(w, "tokenizer.ggml.pre", "gpt-2");
    tdm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", toks, (uint64_t)c->n_vocab);
    tdm_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", types, (uint64_t)c->n_vocab);
    tdm_gguf_w_arr_str(w, "tokenizer.ggml.merges", toks, 0);
    tdm_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", false);
    if (c->eos >= 0) tdm_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos);

    uint64_t rng = c->seed * 7919 + 17;
    int32_t hd = c->head_dim > 0 ? c->head_dim : c->n_embd / c->n_head, E = c->n_embd;
    add_tensor(w, c, "token_embd.weight", c->wtype, E, c->n_vocab, &rng, c->emb_scale, 0);
    add_tensor(w, c, "output_norm.weight", TDM_F32, E, 1, &rng, 0.1f, 1.0f);
    char name[96];
    for (int l = 0; l < c->n_layer; l++) {
#define T(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
        add_tensor(w, c, T("attn_norm.weight"), TDM_F32, E, 1, &rng, 0.1f, 1.0f);
        add_tensor(w, c, T("attn_q.weight"), c->wtype, E, c->n_head * hd, &rng, c->scale, 0);
        add_tensor(w, c, T("attn_k.weight"), c->wtype, E, c->n_head_kv * hd, &rng, c->scale, 0);
        add_tensor(w, c, T("attn_v.weight"), c->attn_v_type ? c->attn_v_type : c->wtype, E, c->n_head_kv * hd, &rng,
                   c->scale, 0);
        if (qwen) {
            add_tensor(w, c, T("attn_q.bias"), TDM_F32, c->n_head * hd, 1, &rng, c->scale, 0);
            add_tensor(w, c, T("attn_k.bias"), TDM_F32, c->n_head_kv * hd, 1, &rng, c->scale, 0);
            add_tensor(w, c, T("attn_v.bias"), TDM_F32, c->n_head_kv * hd, 1, &rng, c->scale, 0);
        }
        add_tensor(w, c, T("attn_output.weight"), c->wtype, c->n_head * hd, E, &rng, c->scale, 0);
        add_tensor(w, c, T("ffn_norm.weight"), TDM_F32, E, 1, &rng, 0.1f, 1.0f);
        if (c->n_expert) {
            add_tensor(w, c, T("ffn_gate_inp.weight"), TDM_F32, E, c->n_expert, &rng, c->zero_router ? 0 : 0.5f, 0);
            add_tensor3(w, c, T("ffn_gate_exps.weight"), c->wtype, E, c->n_ff, c->n_expert, &rng, c->scale);
            add_tensor3(w, c, T("ffn_up_exps.weight"), c->exp_up_type ? c->exp_up_type : c->wtype, E, c->n_ff,
                        c->n_expert, &rng, c->scale);
            add_tensor3(w, c, T("ffn_down_exps.weight"), c->ffn_down_type ? c->ffn_down_type : c->wtype, c->n_ff, E,
                        c->n_expert, &rng, c->scale);
        } else {
            add_tensor(w, c, T("ffn_gate.weight"), c->wtype, E, c->n_ff, &rng, c->scale, 0);
            add_tensor(w, c, T("ffn_up.weight"), c->wtype, E, c->n_ff, &rng, c->scale, 0);
            add_tensor(w, c, T("ffn_down.weight"), c->ffn_down_type ? c->ffn_down_type : c->wtype, c->n_ff, E,
                       &rng, c->scale, 0);
        }
        if (qk_norm) { /* (gemma3's norms as its converter stores them: 1 + the checkpoint's) */
            add_tensor(w, c, T("attn_q_norm.weight"), TDM_F32, hd, 1, &rng, 0.1f, 1.0f);
            add_tensor(w, c, T("attn_k_norm.weight"), TDM_F32, hd, 1, &rng, 0.1f, 1.0f);
        }
        if (post_norms) {
            add_tensor(w, c, T("post_attention_norm.weight"), TDM_F32, E, 1, &rng, 0.1f, 1.0f);
            add_tensor(w, c, T("post_ffw_norm.weight"), TDM_F32, E, 1, &rng, 0.1f, 1.0f);
        }
#undef T
    }
    if (c->rope_freqs_ctx > 0) {
        float ff[513];
        cr_assert(hd / 2 < 512);
        llama3_rope_freqs(hd, base, c->rope_freqs_ctx, ff);
        const char *nm = "rope_freqs.weight";
        bool skip = c->skip_tensor && strcmp(c->skip_tensor, nm) == 0;
        bool bad = c->bad_shape_tensor && strcmp(c->bad_shape_tensor, nm) == 0; /* one value more */
        if (c->nan_tensor && strcmp(c->nan_tensor, nm) == 0) ff[0] = planted(c);
        ff[hd / 2] = 1.0f;
        int64_t ne[1] = {hd / 2 + (bad ? 1 : 0)};
        if (!skip) tdm_gguf_w_tensor(w, nm, TDM_F32, 1, ne, ff, (size_t)ne[0] * sizeof(float));
    }
    /* after the layers, so that the other tensors do not depend on this option */
    if (c->untied_output) add_tensor(w, c, "output.weight", c->wtype, E, c->n_vocab, &rng, c->emb_scale, 0);
    uint8_t *buf;
    size_t len;
    cr_assert_eq(tdm_gguf_writer_finish(w, &buf, &len), TANDEM_OK);
    tdm_gguf_writer_free(w);
    char *path = strdup("/tmp/tandem-tiny-XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, buf, len), (ssize_t)len);
    close(fd);
    free(buf);
    return path;
}
