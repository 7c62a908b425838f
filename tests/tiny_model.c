/* tiny_model.c - random-weight llama / qwen2 models for tests. */
#include "tiny_model.h"

#include <criterion/criterion.h>
#include <math.h>
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
 * nan: its first value is NaN. */
static void add_tensor_ex(tdm_gguf_writer *w, const char *name, uint32_t type, int64_t ne0, int64_t ne1,
                          uint64_t *rng, float scale, float bias, bool skip, bool extra_row, bool nan) {
    int64_t rows = ne1 + (extra_row ? 1 : 0);
    int64_t n = ne0 * rows;
    float *f = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) f[i] = bias + tdm_test_randf(rng, -scale, scale);
    if (nan) f[0] = NAN;
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(type, (uint64_t)ne0, &rb));
    uint8_t *data = malloc((size_t)(rb * (uint64_t)rows));
    for (int64_t r = 0; r < rows; r++) tdm_row_from_f32(type, f + r * ne0, data + r * rb, ne0);
    int64_t ne[2] = {ne0, rows};
    if (!skip) tdm_gguf_w_tensor(w, name, type, rows > 1 ? 2 : 1, ne, data, (size_t)(rb * (uint64_t)rows));
    free(f);
    free(data);
}

/* The same, applying the config's skip_tensor / bad_shape_tensor / nan_tensor to this name. */
static void add_tensor(tdm_gguf_writer *w, const tdm_tiny_cfg *c, const char *name, uint32_t type, int64_t ne0,
                       int64_t ne1, uint64_t *rng, float scale, float bias) {
    bool skip = c->skip_tensor && strcmp(c->skip_tensor, name) == 0;
    bool bad = c->bad_shape_tensor && strcmp(c->bad_shape_tensor, name) == 0;
    bool nan = c->nan_tensor && strcmp(c->nan_tensor, name) == 0;
    add_tensor_ex(w, name, type, ne0, ne1, rng, scale, bias, skip, bad, nan);
}

char *tdm_tiny_model_file(const tdm_tiny_cfg *c) {
    const char *arch = c->arch ? c->arch : "llama";
    bool qwen = strcmp(arch, "qwen2") == 0;
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    cr_assert(w);
    char key[128];
    tdm_gguf_w_str(w, "general.architecture", arch);
    tdm_gguf_w_str(w, "general.name", "tiny-random");
#define KEY(s) (snprintf(key, sizeof key, "%s." s, arch), key)
    tdm_gguf_w_u32(w, KEY("context_length"), 256);
    tdm_gguf_w_u32(w, KEY("embedding_length"), (uint32_t)c->n_embd);
    tdm_gguf_w_u32(w, KEY("block_count"), (uint32_t)c->n_layer);
    tdm_gguf_w_u32(w, KEY("feed_forward_length"), (uint32_t)c->n_ff);
    tdm_gguf_w_u32(w, KEY("attention.head_count"), (uint32_t)c->n_head);
    tdm_gguf_w_u32(w, KEY("attention.head_count_kv"), (uint32_t)c->n_head_kv);
    tdm_gguf_w_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    tdm_gguf_w_f32(w, KEY("rope.freq_base"), 10000.0f);
    if (c->rope_scale > 0) {
        tdm_gguf_w_str(w, KEY("rope.scaling.type"), "linear");
        tdm_gguf_w_f32(w, KEY("rope.scaling.factor"), c->rope_scale);
    }
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
    int32_t hd = c->n_embd / c->n_head, E = c->n_embd;
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
        add_tensor(w, c, T("ffn_gate.weight"), c->wtype, E, c->n_ff, &rng, c->scale, 0);
        add_tensor(w, c, T("ffn_up.weight"), c->wtype, E, c->n_ff, &rng, c->scale, 0);
        add_tensor(w, c, T("ffn_down.weight"), c->ffn_down_type ? c->ffn_down_type : c->wtype, c->n_ff, E, &rng,
                   c->scale, 0);
#undef T
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
