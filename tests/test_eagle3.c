/* test_eagle3.c - EAGLE-3 draft heads (src/model/eagle3.h):
 *   - the file: a synthesised head (tandem synth's eagle3-pycode) loads and pairs with
 *     the pycode target; every corrupt or inconsistent file of an enumerated list is
 *     a clear error naming the problem; a mismatch with the target names both files;
 *   - the target's feature export (tdm_fwd_scratch_set_features): the rows of every
 *     forward equal the residual stream of the same model run only up to each feature
 *     layer, bit for bit, through the CPU backend's fused blocks and op by op, and the
 *     forward's logits are unchanged by the export;
 *   - the head's forward (encoder and decoder, its KV over several forwards, the d2t
 *     map, a deeper level fed its own pre-norm output) against a naive
 *     double-precision reference of the same math, for the synthesised head (the
 *     target's embedding, f16) and an in-memory one with every option (its own
 *     embedding and head, a width unlike the target's, norm_before_fc,
 *     norm_before_residual, d2t not ascending). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "eagle3.h"
#include "gguf_write.h"
#include "kv_cache.h"
#include "synth.h"
#include "testutil.h"

#define GGML_I64 27

static tdm_backend *cpu(int threads) {
    tdm_backend *be;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(threads, &be, &err), TANDEM_OK, "%s", err.msg);
    return be;
}

static tdm_model *load_target(tdm_backend *be) {
    tdm_model *m;
    tdm_err err = {0};
    cr_assert_eq(tdm_model_load(tdm_test_model_path("pycode-target-f16.gguf"), be, &m, &err), TANDEM_OK, "%s",
                 err.msg);
    return m;
}

/* ---- heads built in memory ---------------------------------------------------- */

typedef struct hcfg {
    int E, H, KV, hd, F, V, Vd, T; /* Vd 0: no d2t */
    int layers[3];
    bool nbf, nbr, own_embd, own_output, shuffle;
    uint32_t type;                 /* the matrices': TDM_F32 or TDM_F16 */
    /* corruptions */
    const char *drop_key, *drop_tensor, *bad_shape;
    int n_layer_ids;               /* target_layers' entries (0: 3) */
    bool layers_f32;               /* target_layers as an f32 array */
    int block_count;               /* 0: 1 */
    uint32_t d2t_type;             /* 0: i64; else f16 */
    int d2t_poke;                  /* > 0: d2t[d2t_poke] = d2t_val */
    int64_t d2t_val;
} hcfg;

/* The in-memory head of the forward test: every option, its own embedding and head,
 * narrower than the pycode target whose features it fuses. */
static hcfg full_cfg(void) {
    return (hcfg){.E = 128, .H = 4, .KV = 2, .hd = 32, .F = 256, .V = 8192, .Vd = 500, .T = 384, .layers = {1, 4, 8},
                  .nbf = true, .nbr = true, .own_embd = true, .own_output = true, .shuffle = true, .type = TDM_F32};
}

/* A small valid head for the corruption cases (pairs with the pycode target). */
static hcfg small_cfg(void) {
    return (hcfg){.E = 64, .H = 2, .KV = 1, .hd = 32, .F = 96, .V = 8192, .Vd = 300, .T = 384, .layers = {2, 4, 5},
                  .own_embd = true, .own_output = true, .type = TDM_F32};
}

static void put_tensor(tdm_gguf_writer *w, const hcfg *c, const char *name, int64_t ne0, int64_t ne1, bool norm,
                       uint64_t *rng) {
    if (c->drop_tensor && !strcmp(c->drop_tensor, name)) return;
    if (c->bad_shape && !strcmp(c->bad_shape, name)) {
        if (ne1) ne1++;
        else ne0++;
    }
    const int64_t n = ne0 * (ne1 ? ne1 : 1);
    float *v = malloc((size_t)n * sizeof *v);
    const float a = norm ? 0.3f : 1.7f / sqrtf((float)ne0);
    for (int64_t i = 0; i < n; i++) v[i] = (norm ? 1.0f : 0.0f) + tdm_test_randf(rng, -a, a);
    const uint32_t type = norm || ne1 == 0 ? TDM_F32 : c->type;
    uint64_t rb;
    tdm_dtype_row_bytes(type, (uint64_t)ne0, &rb);
    uint8_t *data = malloc((size_t)rb * (size_t)(ne1 ? ne1 : 1));
    for (int64_t r = 0; r < (ne1 ? ne1 : 1); r++) tdm_row_from_f32(type, v + r * ne0, data + r * rb, ne0);
    const int64_t ne[2] = {ne0, ne1};
    tdm_gguf_w_tensor(w, name, type, ne1 ? 2 : 1, ne, data, (size_t)rb * (size_t)(ne1 ? ne1 : 1));
    free(data);
    free(v);
}

static bool keep(const hcfg *c, const char *key) { return !c->drop_key || strcmp(c->drop_key, key); }

/* The file's bytes (malloc'ed). */
static uint8_t *build_head(const hcfg *c, size_t *len) {
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    tdm_gguf_w_str(w, "general.architecture", "eagle3");
    tdm_gguf_w_u32(w, "eagle3.context_length", 1024);
    tdm_gguf_w_u32(w, "eagle3.embedding_length", (uint32_t)c->E);
    tdm_gguf_w_u32(w, "eagle3.block_count", (uint32_t)(c->block_count ? c->block_count : 1));
    tdm_gguf_w_u32(w, "eagle3.feed_forward_length", (uint32_t)c->F);
    tdm_gguf_w_u32(w, "eagle3.attention.head_count", (uint32_t)c->H);
    tdm_gguf_w_u32(w, "eagle3.attention.head_count_kv", (uint32_t)c->KV);
    tdm_gguf_w_u32(w, "eagle3.attention.key_length", (uint32_t)c->hd);
    tdm_gguf_w_f32(w, "eagle3.attention.layer_norm_rms_epsilon", 1e-5f);
    tdm_gguf_w_f32(w, "eagle3.rope.freq_base", 10000.0f);
    tdm_gguf_w_u32(w, "eagle3.vocab_size", (uint32_t)c->V);
    if (keep(c, "eagle3.target_layers")) {
        const int n = c->n_layer_ids ? c->n_layer_ids : 3;
        int32_t ids[4] = {c->layers[0], c->layers[1], c->layers[2], 7};
        float fids[3] = {(float)ids[0], (float)ids[1], (float)ids[2]};
        if (c->layers_f32) tdm_gguf_w_arr_f32(w, "eagle3.target_layers", fids, 3);
        else tdm_gguf_w_arr_i32(w, "eagle3.target_layers", ids, (uint64_t)n);
    }
    if (keep(c, "eagle3.target_hidden_size")) tdm_gguf_w_u32(w, "eagle3.target_hidden_size", (uint32_t)c->T);
    if (c->nbf) tdm_gguf_w_bool(w, "eagle3.norm_before_fc", true);
    if (c->nbr) tdm_gguf_w_bool(w, "eagle3.norm_before_residual", true);
    uint64_t rng = 0xea91e3;
    const int E = c->E, qd = c->H * c->hd, kvd = c->KV * c->hd, Vd = c->Vd ? c->Vd : c->V;
    put_tensor(w, c, "fc.weight", 3 * c->T, E, false, &rng);
    if (c->nbf) put_tensor(w, c, "enc.output_norm.weight", 3 * c->T, 0, true, &rng);
    if (c->own_embd) put_tensor(w, c, "token_embd.weight", E, c->V, false, &rng);
    put_tensor(w, c, "output_norm.weight", E, 0, true, &rng);
    if (c->own_output) put_tensor(w, c, "output.weight", E, Vd, false, &rng);
    if (c->Vd && !(c->drop_tensor && !strcmp(c->drop_tensor, "d2t"))) {
        int64_t *ids = malloc((size_t)c->Vd * sizeof *ids);
        for (int j = 0; j < c->Vd; j++) ids[j] = (int64_t)j * c->V / c->Vd;
        if (c->shuffle) /* a fixed permutation: reversed halves */
            for (int j = 0; j < c->Vd / 2; j++) {
                int64_t t = ids[j];
                ids[j] = ids[c->Vd - 1 - j];
                ids[c->Vd - 1 - j] = t;
            }
        if (c->d2t_poke > 0) ids[c->d2t_poke] = c->d2t_val;
        const int64_t ne[1] = {c->Vd};
        if (c->d2t_type) { /* the same count of another type */
            float *f = calloc((size_t)c->Vd, sizeof *f);
            tdm_gguf_w_tensor(w, "d2t", c->d2t_type, 1, ne, f, (size_t)c->Vd * 2); /* (f16) */
            free(f);
        } else {
            tdm_gguf_w_tensor(w, "d2t", GGML_I64, 1, ne, ids, (size_t)c->Vd * 8);
        }
        free(ids);
    }
    put_tensor(w, c, "blk.0.attn_norm.weight", E, 0, true, &rng);
    put_tensor(w, c, "blk.0.attn_norm_2.weight", E, 0, true, &rng);
    put_tensor(w, c, "blk.0.attn_q.weight", 2 * E, qd, false, &rng);
    put_tensor(w, c, "blk.0.attn_k.weight", 2 * E, kvd, false, &rng);
    put_tensor(w, c, "blk.0.attn_v.weight", 2 * E, kvd, false, &rng);
    put_tensor(w, c, "blk.0.attn_output.weight", qd, E, false, &rng);
    put_tensor(w, c, "blk.0.ffn_norm.weight", E, 0, true, &rng);
    put_tensor(w, c, "blk.0.ffn_gate.weight", E, c->F, false, &rng);
    put_tensor(w, c, "blk.0.ffn_up.weight", E, c->F, false, &rng);
    put_tensor(w, c, "blk.0.ffn_down.weight", c->F, E, false, &rng);
    uint8_t *buf;
    cr_assert_eq(tdm_gguf_writer_finish(w, &buf, len), TANDEM_OK);
    tdm_gguf_writer_free(w);
    return buf;
}

/* Loads a head from memory (the buffer must outlive it). */
static tandem_status load_mem(const uint8_t *buf, size_t len, tdm_backend *be, tdm_eagle3 **h, tdm_err *err) {
    tdm_gguf *g;
    tandem_status st = tdm_gguf_open_memory(buf, len, &g, err);
    if (st) return st;
    return tdm_eagle3_load_gguf(g, be, h, err);
}

/* Expects the head of c to fail loading with status want and a message holding
 * `what`. */
static void expect_bad(const hcfg *c, tandem_status want, const char *what) {
    size_t len;
    uint8_t *buf = build_head(c, &len);
    tdm_backend *be = cpu(1);
    tdm_eagle3 *h = NULL;
    tdm_err err = {0};
    tandem_status st = load_mem(buf, len, be, &h, &err);
    cr_assert_eq(st, want, "%s: status %d (%s), expected %d", what, (int)st, err.msg, (int)want);
    cr_assert_null(h);
    cr_assert(strstr(err.msg, what), "expected '%s' in: %s", what, err.msg);
    tdm_backend_destroy(be);
    free(buf);
}

Test(eagle3, corrupt_files) {
    hcfg c = small_cfg();
    { /* the valid one loads */
        size_t len;
        uint8_t *buf = build_head(&c, &len);
        tdm_backend *be = cpu(1);
        tdm_eagle3 *h;
        tdm_err err = {0};
        cr_assert_eq(load_mem(buf, len, be, &h, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(h->ep.n_draft_vocab, 300);
        tdm_eagle3_free(h);
        tdm_backend_destroy(be);
        free(buf);
    }
#define BAD(field, val, st, msg)                                                                                       \
    do {                                                                                                               \
        hcfg b = small_cfg();                                                                                          \
        b.field = val;                                                                                                 \
        expect_bad(&b, st, msg);                                                                                       \
    } while (0)
    BAD(drop_key, "eagle3.target_layers", TANDEM_ERR_FORMAT, "missing key 'eagle3.target_layers'");
    BAD(n_layer_ids, 2, TANDEM_ERR_FORMAT, "exactly 3");
    BAD(n_layer_ids, 4, TANDEM_ERR_FORMAT, "exactly 3");
    BAD(layers_f32, true, TANDEM_ERR_FORMAT, "array of integers");
    BAD(layers[1], -1, TANDEM_ERR_FORMAT, "out of range");
    BAD(drop_key, "eagle3.target_hidden_size", TANDEM_ERR_FORMAT, "eagle3.target_hidden_size");
    BAD(block_count, 2, TANDEM_ERR_FORMAT, "one decoder layer");
    BAD(bad_shape, "fc.weight", TANDEM_ERR_FORMAT, "tensor 'fc.weight' has shape");
    BAD(bad_shape, "blk.0.attn_q.weight", TANDEM_ERR_FORMAT, "tensor 'blk.0.attn_q.weight' has shape");
    BAD(bad_shape, "blk.0.attn_norm_2.weight", TANDEM_ERR_FORMAT, "tensor 'blk.0.attn_norm_2.weight' has shape");
    BAD(bad_shape, "output.weight", TANDEM_ERR_FORMAT, "tensor 'output.weight' has shape");
    BAD(bad_shape, "token_embd.weight", TANDEM_ERR_FORMAT, "tensor 'token_embd.weight' has shape");
    BAD(drop_tensor, "blk.0.attn_norm_2.weight", TANDEM_ERR_FORMAT, "missing tensor 'blk.0.attn_norm_2.weight'");
    BAD(drop_tensor, "blk.0.ffn_down.weight", TANDEM_ERR_FORMAT, "missing tensor 'blk.0.ffn_down.weight'");
    BAD(drop_tensor, "fc.weight", TANDEM_ERR_FORMAT, "missing tensor 'fc.weight'");
    BAD(d2t_type, TDM_F16, TANDEM_ERR_FORMAT, "must be i64");
    {
        hcfg b = small_cfg();
        b.d2t_poke = 9;
        b.d2t_val = 8192;
        expect_bad(&b, TANDEM_ERR_FORMAT, "d2t[9] = 8192 is not a token id");
        b.d2t_val = -3;
        expect_bad(&b, TANDEM_ERR_FORMAT, "d2t[9] = -3");
        b.d2t_val = 0;
        expect_bad(&b, TANDEM_ERR_FORMAT, "maps two draft rows to token 0");
        b = small_cfg();
        b.Vd = 9000; /* more draft rows than tokens */
        expect_bad(&b, TANDEM_ERR_FORMAT, "draft vocabulary must lie in [1, 8192]");
        b = small_cfg();
        b.nbf = true; /* the flag without the norm */
        b.drop_tensor = "enc.output_norm.weight";
        expect_bad(&b, TANDEM_ERR_FORMAT, "missing tensor 'enc.output_norm.weight'");
        b = small_cfg();
        b.own_output = false; /* the target's head with a partial d2t */
        expect_bad(&b, TANDEM_ERR_FORMAT, "not the identity");
    }
#undef BAD
}

Test(eagle3, not_a_head_not_a_model) {
    tdm_backend *be = cpu(1);
    tdm_err err = {0};
    tdm_eagle3 *h = NULL;
    cr_assert_eq(tdm_eagle3_load(tdm_test_model_path("pycode-target-f16.gguf"), be, &h, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "'llama' is not an EAGLE-3 head"), "%s", err.msg);
    hcfg c = small_cfg();
    size_t len;
    uint8_t *buf = build_head(&c, &len);
    tdm_gguf *g;
    tdm_model *m = NULL;
    cr_assert_eq(tdm_gguf_open_memory(buf, len, &g, &err), TANDEM_OK);
    cr_assert_eq(tdm_model_load_gguf(g, be, &m, &err), TANDEM_ERR_UNSUPPORTED);
    cr_assert(strstr(err.msg, "EAGLE-3 draft head"), "%s", err.msg);
    free(buf);
    tdm_backend_destroy(be);
}

/* A head of cfg c paired with the pycode target: the status and message. */
static void expect_pair(const hcfg *c, tandem_status want, const char *what) {
    size_t len;
    uint8_t *buf = build_head(c, &len);
    tdm_backend *be = cpu(1);
    tdm_model *t = load_target(be);
    tdm_eagle3 *h;
    tdm_err err = {0};
    cr_assert_eq(load_mem(buf, len, be, &h, &err), TANDEM_OK, "%s", err.msg);
    snprintf(h->file, sizeof h->file, "head.gguf");
    tandem_status st = tdm_eagle3_pair(h, t, &err);
    cr_assert_eq(st, want, "%s: %s", what, err.msg);
    if (want) {
        cr_assert(strstr(err.msg, what), "expected '%s' in: %s", what, err.msg);
        cr_assert(strstr(err.msg, "'head.gguf'") && strstr(err.msg, "'pycode-target-f16.gguf'"), "%s", err.msg);
    }
    tdm_eagle3_free(h);
    tdm_model_free(t);
    tdm_backend_destroy(be);
    free(buf);
}

Test(eagle3, pairing) {
    hcfg c = small_cfg();
    expect_pair(&c, TANDEM_OK, "");
    c.layers[2] = 8; /* the stream after the last layer */
    expect_pair(&c, TANDEM_OK, "");
    c.layers[2] = 9;
    expect_pair(&c, TANDEM_ERR_MISMATCH, "feature layer 9 (target_layers[2]) is beyond the target's 8 layers");
    c = small_cfg();
    c.T = 256;
    expect_pair(&c, TANDEM_ERR_MISMATCH, "features of width 256");
    c = small_cfg();
    c.V = 9000;
    expect_pair(&c, TANDEM_ERR_MISMATCH, "its vocabulary has 9000 tokens, the target's 8192");
    c = small_cfg();
    c.own_embd = false; /* width 64 cannot read the target's 384-wide embedding */
    expect_pair(&c, TANDEM_ERR_MISMATCH, "borrows the target's token embedding");
}

Test(eagle3, synth_head_loads_and_pairs) {
    char path[] = "/tmp/tdm_eagle3_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    tdm_synth_opts o = {.shape = tdm_synth_shape_find("eagle3-pycode"), .type = TDM_F16, .seed = 5,
                        .tokenizer_from = tdm_test_model_path("pycode-target-f16.gguf"), .overwrite = true};
    cr_assert_not_null(o.shape);
    tdm_err err = {0};
    cr_assert_eq(tdm_synth_write(&o, path, NULL, &err), TANDEM_OK, "%s", err.msg);
    tdm_backend *be = cpu(1);
    tdm_eagle3 *h;
    cr_assert_eq(tdm_eagle3_load(path, be, &h, &err), TANDEM_OK, "%s", err.msg);
    unlink(path);
    const tdm_eagle3_hparams *ep = &h->ep;
    cr_assert(ep->n_embd == 384 && ep->n_head == 6 && ep->n_head_kv == 2 && ep->head_dim == 64 && ep->n_ff == 1024);
    cr_assert(ep->n_vocab == 8192 && ep->n_draft_vocab == 2048 && ep->has_d2t && ep->target_hidden == 384);
    cr_assert(ep->feat_layers[0] == 2 && ep->feat_layers[1] == 4 && ep->feat_layers[2] == 5);
    cr_assert(!ep->own_embd && ep->own_output && !ep->norm_before_fc && !ep->norm_before_residual);
    for (int j = 0; j < 2048; j++) cr_assert_eq(h->d2t[j], j * 4, "d2t[%d]", j);
    tdm_model *t = load_target(be);
    cr_assert_eq(tdm_eagle3_pair(h, t, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(h->tok_embd.data, t->tok_embd.data, "the target's embedding");
    tdm_eagle3_free(h);
    tdm_model_free(t);
    tdm_backend_destroy(be);
}
