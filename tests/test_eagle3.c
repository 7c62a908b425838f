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
 *     norm_before_residual, d2t not ascending, q / k / v of two types). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "eagle3.h"
#include "gguf_write.h"
#include "kv_cache.h"
#include "quantize.h"
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
    bool mixed;                    /* attn_k and ffn_up in f16, the others of `type` (f32) */
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
    const bool f16 = c->mixed && (!strcmp(name, "blk.0.attn_k.weight") || !strcmp(name, "blk.0.ffn_up.weight"));
    const uint32_t type = norm || ne1 == 0 ? TDM_F32 : f16 ? TDM_F16 : c->type;
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

/* tandem synth's eagle3-pycode head of type `type` (kind: a mix, or NULL) in a
 * temporary file whose path is written to path[32]. */
static void synth_shape(char *path, const char *shape, uint32_t type, const char *kind) {
    strcpy(path, "/tmp/tdm_eagle3_XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    tdm_synth_opts o = {.shape = tdm_synth_shape_find(shape), .type = type, .seed = 5,
                        .kind = kind ? tdm_quant_kind_find(kind) : NULL,
                        .tokenizer_from = tdm_test_model_path("pycode-target-f16.gguf"), .overwrite = true};
    cr_assert_not_null(o.shape);
    tdm_err err = {0};
    cr_assert_eq(tdm_synth_write(&o, path, NULL, &err), TANDEM_OK, "%s", err.msg);
}

static void synth_head(char *path, uint32_t type, const char *kind) { synth_shape(path, "eagle3-pycode", type, kind); }

Test(eagle3, synth_head_loads_and_pairs) {
    char path[32];
    tdm_err err = {0};
    /* the quantised heads load and pair (q4_k and q6_k do not tile its 1152-value rows) */
    const uint32_t types[3] = {TDM_Q8_0, TDM_Q4_0, TDM_Q4_K};
    for (int i = 0; i < 3; i++) {
        synth_head(path, types[i], i == 2 ? "q4_k_m" : NULL);
        tdm_backend *be = cpu(1);
        tdm_eagle3 *h;
        cr_assert_eq(tdm_eagle3_load(path, be, &h, &err), TANDEM_OK, "%d: %s", i, err.msg);
        unlink(path);
        tdm_model *t = load_target(be);
        cr_assert_eq(tdm_eagle3_pair(h, t, &err), TANDEM_OK, "%s", err.msg);
        tdm_eagle3_free(h);
        tdm_model_free(t);
        tdm_backend_destroy(be);
    }
    { /* the hidden shape with its own embedding (what llama.cpp's examples run) */
        synth_shape(path, "eagle3-pycode-embd", TDM_F16, NULL);
        tdm_backend *be = cpu(1);
        tdm_eagle3 *h;
        cr_assert_eq(tdm_eagle3_load(path, be, &h, &err), TANDEM_OK, "%s", err.msg);
        unlink(path);
        tdm_model *t = load_target(be);
        cr_assert(h->ep.own_embd && h->tok_embd.rows == 8192);
        cr_assert_eq(tdm_eagle3_pair(h, t, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_neq(h->tok_embd.data, t->tok_embd.data, "its own embedding");
        tdm_eagle3_free(h);
        tdm_model_free(t);
        tdm_backend_destroy(be);
    }
    tdm_synth_opts bad = {.shape = tdm_synth_shape_find("eagle3-pycode"), .type = TDM_Q4_K};
    tdm_gguf_writer *w;
    cr_assert_eq(tdm_synth_plan(&bad, &w, NULL, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "not whole q4_k blocks"), "%s", err.msg);
    synth_head(path, TDM_F16, NULL);
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

/* ---- the target's feature export ---------------------------------------------- */

typedef struct rig {
    tdm_kv_store kv;
    tdm_kv_seq seq;
    int32_t blocks[4];
} rig;

static void rig_open(rig *r, const tdm_model *m, tdm_backend *be) {
    tdm_err err = {0};
    memset(r, 0, sizeof *r);
    cr_assert_eq(tdm_kv_store_init(&r->kv, m, be, TDM_F32, 4, 16, &err), TANDEM_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++) r->blocks[i] = i;
    r->seq = (tdm_kv_seq){.blocks = r->blocks, .n_blocks = 4, .cap_blocks = 4, .len = 64};
}

/* Rows [p0, p0 + n) of tok, causal, one sequence; logits for all or none. */
static void fill_batch(tdm_batch *b, const int32_t *tok, int p0, int n, bool logits) {
    tdm_batch_clear(b);
    for (int i = 0; i < n; i++) cr_assert_geq(tdm_batch_add(b, tok[p0 + i], p0 + i, 0, p0 + i, logits), 0);
}

/* The export of the layers ids[n] from the pycode target over two forwards (a
 * 20-row prefill, then 3 rows) against the residual stream of the same model cut
 * after each layer, and the logits against a forward without the export. */
static void check_export(const int32_t *ids, int n, bool by_ops) {
    tdm_backend *be = cpu(2);
    tdm_model *t = load_target(be);
    const int E = t->hp.n_embd, V = t->hp.n_vocab;
    tdm_err err = {0};
    int32_t tok[23];
    uint64_t rng = 17;
    for (int i = 0; i < 23; i++) tok[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)V);
    const int p0[2] = {0, 20}, nr[2] = {20, 3};
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, 32, &err), TANDEM_OK);
    /* with the export, and without */
    float *feat[2], *logits[2][2];
    for (int with = 0; with < 2; with++) {
        rig r;
        rig_open(&r, t, be);
        tdm_fwd_scratch s = {0};
        s.blocks_declined = by_ops;
        if (with) cr_assert_eq(tdm_fwd_scratch_set_features(&s, ids, n, &err), TANDEM_OK, "%s", err.msg);
        const tdm_kv_seq *seqs[1] = {&r.seq};
        for (int k = 0; k < 2; k++) {
            fill_batch(&b, tok, p0[k], nr[k], true);
            logits[with][k] = malloc((size_t)nr[k] * (size_t)V * sizeof(float));
            cr_assert_eq(tdm_model_forward(t, be, &r.kv, &b, seqs, &s, logits[with][k], &err), TANDEM_OK, "%s",
                         err.msg);
            if (with) {
                const size_t sz = (size_t)nr[k] * (size_t)n * (size_t)E * sizeof(float);
                feat[k] = malloc(sz);
                memcpy(feat[k], s.feat, sz);
            }
        }
        cr_assert_eq(s.blocks_declined, by_ops, "the fused blocks ran the model");
        tdm_fwd_scratch_free(&s);
        tdm_kv_store_free(&r.kv);
    }
    for (int k = 0; k < 2; k++)
        cr_assert_eq(memcmp(logits[0][k], logits[1][k], (size_t)nr[k] * (size_t)V * sizeof(float)), 0,
                     "forward %d: the export changed the logits", k);
    /* the reference: the model cut after layer ids[j] */
    for (int j = 0; j < n; j++) {
        tdm_model cut = *t;
        cut.hp.n_layer = ids[j];
        rig r;
        rig_open(&r, t, be);
        tdm_kv_store kcut = r.kv;
        kcut.n_layer = ids[j];
        tdm_fwd_scratch s = {0};
        s.blocks_declined = by_ops;
        const tdm_kv_seq *seqs[1] = {&r.seq};
        for (int k = 0; k < 2; k++) {
            fill_batch(&b, tok, p0[k], nr[k], false);
            cr_assert_eq(tdm_model_forward(&cut, be, &kcut, &b, seqs, &s, NULL, &err), TANDEM_OK, "%s", err.msg);
            for (int i = 0; i < nr[k]; i++)
                cr_assert_eq(memcmp(feat[k] + ((size_t)i * (size_t)n + (size_t)j) * (size_t)E, s.x + (size_t)i * E,
                                    (size_t)E * sizeof(float)),
                             0, "layer %d, forward %d, row %d: the exported stream differs (%s)", (int)ids[j], k, i,
                             by_ops ? "ops" : "fused blocks");
        }
        tdm_fwd_scratch_free(&s);
        tdm_kv_store_free(&r.kv);
    }
    for (int k = 0; k < 2; k++) {
        free(feat[k]);
        free(logits[0][k]);
        free(logits[1][k]);
    }
    tdm_batch_free(&b);
    tdm_model_free(t);
    tdm_backend_destroy(be);
}

Test(eagle3, feature_export) {
    const int32_t head[3] = {2, 4, 5}, edges[4] = {0, 8, 3, 3};
    for (int by_ops = 0; by_ops < 2; by_ops++) {
        check_export(head, 3, by_ops);
        check_export(edges, 4, by_ops);
    }
    tdm_fwd_scratch s = {0};
    tdm_err err = {0};
    const int32_t bad[5] = {1, 2, 3, 4, 5}, neg[1] = {-1};
    cr_assert_eq(tdm_fwd_scratch_set_features(&s, bad, 5, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert_eq(tdm_fwd_scratch_set_features(&s, neg, 1, &err), TANDEM_ERR_INVALID_ARG);
    /* a layer beyond the model: the forward says so */
    const int32_t beyond[1] = {9};
    cr_assert_eq(tdm_fwd_scratch_set_features(&s, beyond, 1, &err), TANDEM_OK);
    tdm_backend *be = cpu(1);
    tdm_model *t = load_target(be);
    rig r;
    rig_open(&r, t, be);
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, 4, &err), TANDEM_OK);
    const int32_t tok[1] = {5};
    fill_batch(&b, tok, 0, 1, false);
    const tdm_kv_seq *seqs[1] = {&r.seq};
    cr_assert_eq(tdm_model_forward(t, be, &r.kv, &b, seqs, &s, NULL, &err), TANDEM_ERR_INVALID_ARG);
    cr_assert(strstr(err.msg, "layer 9"), "%s", err.msg);
    tdm_fwd_scratch_free(&s);
    tdm_batch_free(&b);
    tdm_kv_store_free(&r.kv);
    tdm_model_free(t);
    tdm_backend_destroy(be);
}

/* ---- the head's forward against a double-precision reference ------------------ */

/* The head's math in double, weights read from its file (and the target's embedding
 * from the target's file when the head has none). */
typedef struct rhead {
    int E, H, KV, hd, F, V, Vd, T;
    double eps, base;
    bool nbf, nbr;
    double *fc, *enc, *embd, *an, *hn, *wq, *wk, *wv, *wo, *fn, *wg, *wu, *wd, *on, *out;
    int64_t *d2t;   /* [Vd] as the file has it (NULL: the identity) */
    double *K, *Vc; /* [64][kvd] the reference's cache */
} rhead;

static double *read_mat(const tdm_gguf *g, const char *name, int64_t rows, int64_t cols) {
    const tdm_gguf_tensor *t = tdm_gguf_find_tensor(g, name);
    cr_assert_not_null(t, "%s", name);
    uint64_t rb;
    cr_assert(tdm_dtype_row_bytes(t->type, (uint64_t)cols, &rb));
    double *d = malloc((size_t)(rows * cols) * sizeof *d);
    float *f = malloc((size_t)cols * sizeof *f);
    for (int64_t r = 0; r < rows; r++) {
        tdm_row_to_f32(t->type, (const uint8_t *)t->data + (size_t)r * rb, f, cols);
        for (int64_t c = 0; c < cols; c++) d[r * cols + c] = f[c];
    }
    free(f);
    return d;
}

static void rhead_open(rhead *r, const tdm_gguf *g, const tdm_gguf *target, const tdm_eagle3 *h) {
    const tdm_eagle3_hparams *ep = &h->ep;
    *r = (rhead){.E = ep->n_embd, .H = ep->n_head, .KV = ep->n_head_kv, .hd = ep->head_dim, .F = ep->n_ff,
                 .V = ep->n_vocab, .Vd = ep->n_draft_vocab, .T = ep->target_hidden, .eps = h->m->hp.norm_eps,
                 .base = h->m->hp.rope.freq_base, .nbf = ep->norm_before_fc, .nbr = ep->norm_before_residual};
    const int E = r->E, qd = r->H * r->hd, kvd = r->KV * r->hd;
    r->fc = read_mat(g, "fc.weight", E, 3 * r->T);
    if (r->nbf) r->enc = read_mat(g, "enc.output_norm.weight", 1, 3 * r->T);
    r->embd = read_mat(ep->own_embd ? g : target, "token_embd.weight", r->V, E);
    r->an = read_mat(g, "blk.0.attn_norm.weight", 1, E);
    r->hn = read_mat(g, "blk.0.attn_norm_2.weight", 1, E);
    r->wq = read_mat(g, "blk.0.attn_q.weight", qd, 2 * E);
    r->wk = read_mat(g, "blk.0.attn_k.weight", kvd, 2 * E);
    r->wv = read_mat(g, "blk.0.attn_v.weight", kvd, 2 * E);
    r->wo = read_mat(g, "blk.0.attn_output.weight", E, qd);
    r->fn = read_mat(g, "blk.0.ffn_norm.weight", 1, E);
    r->wg = read_mat(g, "blk.0.ffn_gate.weight", r->F, E);
    r->wu = read_mat(g, "blk.0.ffn_up.weight", r->F, E);
    r->wd = read_mat(g, "blk.0.ffn_down.weight", E, r->F);
    r->on = read_mat(g, "output_norm.weight", 1, E);
    r->out = read_mat(g, "output.weight", r->Vd, E);
    const tdm_gguf_tensor *d = tdm_gguf_find_tensor(g, "d2t");
    if (d) {
        r->d2t = malloc((size_t)r->Vd * sizeof *r->d2t);
        memcpy(r->d2t, d->data, (size_t)r->Vd * 8);
    }
    r->K = calloc((size_t)64 * kvd, sizeof(double));
    r->Vc = calloc((size_t)64 * kvd, sizeof(double));
}

static void rhead_close(rhead *r) {
    double *p[] = {r->fc, r->enc, r->embd, r->an, r->hn, r->wq, r->wk, r->wv, r->wo, r->fn, r->wg, r->wu, r->wd,
                   r->on, r->out, r->K, r->Vc};
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) free(p[i]);
    free(r->d2t);
}

static void rms(const double *x, const double *w, int n, double eps, double *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) y[i] = x[i] * s * w[i];
}

static void mv(const double *W, const double *x, int rows, int cols, double *y) {
    for (int r = 0; r < rows; r++) {
        double a = 0;
        for (int c = 0; c < cols; c++) a += W[(size_t)r * cols + c] * x[c];
        y[r] = a;
    }
}

/* RoPE of n_head heads of hd at position p: adjacent pairs (GGUF "normal"). */
static void rope(double *x, int n_head, int hd, int p, double base) {
    for (int h = 0; h < n_head; h++)
        for (int t = 0; t < hd / 2; t++) {
            const double th = p * pow(base, -2.0 * t / hd), c = cos(th), s = sin(th);
            double *v = x + h * hd + 2 * t, a = v[0], b = v[1];
            v[0] = a * c - b * s;
            v[1] = a * s + b * c;
        }
}

static void rhead_fuse(const rhead *r, const float *feat, double *g) {
    const int n = 3 * r->T;
    double *x = malloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++) x[i] = feat[i];
    if (r->nbf) rms(x, r->enc, n, r->eps, x);
    mv(r->fc, x, r->E, n, g);
    free(x);
}

/* One row at position p (the rows before it in the cache): h[E] and logits[V]. */
static void rhead_row(rhead *r, int32_t token, const double *g, int p, double *h, double *logits) {
    const int E = r->E, qd = r->H * r->hd, kvd = r->KV * r->hd, F = r->F;
    double *cat = malloc((size_t)2 * E * sizeof *cat), *q = malloc((size_t)qd * sizeof *q);
    double *att = calloc((size_t)qd, sizeof *att), *x = malloc((size_t)E * sizeof *x);
    double *xn = malloc((size_t)E * sizeof *xn), *gu = malloc((size_t)2 * F * sizeof *gu);
    double *y = malloc((size_t)E * sizeof *y), *ld = malloc((size_t)r->Vd * sizeof *ld);
    rms(r->embd + (size_t)token * E, r->an, E, r->eps, cat);
    rms(g, r->hn, E, r->eps, cat + E);
    mv(r->wq, cat, qd, 2 * E, q);
    mv(r->wk, cat, kvd, 2 * E, r->K + (size_t)p * kvd);
    mv(r->wv, cat, kvd, 2 * E, r->Vc + (size_t)p * kvd);
    rope(q, r->H, r->hd, p, r->base);
    rope(r->K + (size_t)p * kvd, r->KV, r->hd, p, r->base);
    for (int hh = 0; hh < r->H; hh++) {
        const int kh = hh / (r->H / r->KV);
        double *sc = malloc((size_t)(p + 1) * sizeof *sc), mx = -1e300, sum = 0;
        for (int j = 0; j <= p; j++) {
            double d = 0;
            for (int i = 0; i < r->hd; i++) d += q[hh * r->hd + i] * r->K[(size_t)j * kvd + kh * r->hd + i];
            sc[j] = d / sqrt((double)r->hd);
            if (sc[j] > mx) mx = sc[j];
        }
        for (int j = 0; j <= p; j++) sum += (sc[j] = exp(sc[j] - mx));
        for (int j = 0; j <= p; j++)
            for (int i = 0; i < r->hd; i++)
                att[hh * r->hd + i] += sc[j] / sum * r->Vc[(size_t)j * kvd + kh * r->hd + i];
        free(sc);
    }
    mv(r->wo, att, E, qd, x);
    for (int i = 0; i < E; i++) x[i] += r->nbr ? cat[E + i] : g[i];
    rms(x, r->fn, E, r->eps, xn);
    mv(r->wg, xn, F, E, gu);
    mv(r->wu, xn, F, E, gu + F);
    for (int i = 0; i < F; i++) gu[i] = gu[i] / (1.0 + exp(-gu[i])) * gu[F + i];
    mv(r->wd, gu, E, F, y);
    for (int i = 0; i < E; i++) h[i] = x[i] + y[i];
    rms(h, r->on, E, r->eps, xn);
    mv(r->out, xn, r->Vd, E, ld);
    for (int v = 0; v < r->V; v++) logits[v] = NAN;
    for (int j = 0; j < r->Vd; j++) logits[r->d2t ? r->d2t[j] : j] = ld[j];
    free(cat), free(q), free(att), free(x), free(xn), free(gu), free(y), free(ld);
}

/* ||a - b|| / ||b|| over n values. */
static double rel(const float *a, const double *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    return sqrt(num / (den > 0 ? den : 1));
}

/* The logits row got[V] against the reference: the mapped ids within tol, every
 * other id TDM_LOGIT_NONE. */
static void expect_logits(const float *got, const double *want, int V, double tol, const char *what) {
    double num = 0, den = 0;
    int n_none = 0;
    for (int v = 0; v < V; v++) {
        if (isnan(want[v])) {
            cr_assert_eq(got[v], TDM_LOGIT_NONE, "%s: token %d is not in the draft vocabulary", what, v);
            n_none++;
            continue;
        }
        num += (got[v] - want[v]) * (got[v] - want[v]);
        den += want[v] * want[v];
    }
    cr_assert_gt(den, 0);
    cr_assert_lt(sqrt(num / den), tol, "%s: logits error %g", what, sqrt(num / den));
}

/* Three forwards of the head (5 rows at positions 0-4 from fused features, 1 row,
 * then 2 rows of which the first is a deeper level fed the previous row's output and
 * only the second wants logits) against the reference. */
static void check_forward(const uint8_t *buf, size_t len, const char *path, double tol) {
    tdm_backend *be = cpu(2);
    tdm_model *t = load_target(be);
    tdm_err err = {0};
    tdm_eagle3 *h;
    if (buf) cr_assert_eq(load_mem(buf, len, be, &h, &err), TANDEM_OK, "%s", err.msg);
    else cr_assert_eq(tdm_eagle3_load(path, be, &h, &err), TANDEM_OK, "%s", err.msg);
    cr_assert_eq(tdm_eagle3_pair(h, t, &err), TANDEM_OK, "%s", err.msg);
    rhead r;
    rhead_open(&r, h->m->gguf, t->gguf, h);
    const int E = r.E, V = r.V, T3 = 3 * r.T, N = 8;
    uint64_t rng = 99;
    float *feat = malloc((size_t)N * T3 * sizeof *feat), *g = malloc((size_t)N * E * sizeof *g);
    for (int i = 0; i < N * T3; i++) feat[i] = tdm_test_randf(&rng, -2.0f, 2.0f);
    int32_t tok[8];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)(tdm_test_rand(&rng) % (uint64_t)V);
    tdm_eagle3_scratch s = {0};
    cr_assert_eq(tdm_eagle3_fuse(h, be, &s, feat, N, g, &err), TANDEM_OK, "%s", err.msg);
    double *rg = malloc((size_t)N * E * sizeof *rg);
    for (int i = 0; i < N; i++) rhead_fuse(&r, feat + (size_t)i * T3, rg + (size_t)i * E);
    cr_assert_lt(rel(g, rg, N * E), 1e-5, "fused features: %g", rel(g, rg, N * E));

    rig kv;
    rig_open(&kv, h->m, be);
    const tdm_kv_seq *seqs[1] = {&kv.seq};
    tdm_batch b;
    cr_assert_eq(tdm_batch_init(&b, 8, &err), TANDEM_OK);
    float *logits = malloc((size_t)5 * V * sizeof *logits), *hout = malloc((size_t)5 * E * sizeof *hout);
    double *rl = malloc((size_t)V * sizeof *rl), *rh = malloc((size_t)N * E * sizeof *rh);
    char what[64];
    /* 1: five rows */
    fill_batch(&b, tok, 0, 5, true);
    cr_assert_eq(tdm_eagle3_forward(h, be, &kv.kv, &b, seqs, &s, g, hout, logits, &err), TANDEM_OK, "%s", err.msg);
    for (int i = 0; i < 5; i++) {
        rhead_row(&r, tok[i], rg + (size_t)i * E, i, rh + (size_t)i * E, rl);
        snprintf(what, sizeof what, "row %d", i);
        expect_logits(logits + (size_t)i * V, rl, V, tol, what);
        cr_assert_lt(rel(hout + (size_t)i * E, rh + (size_t)i * E, E), tol, "row %d: h", i);
    }
    /* 2: one row */
    fill_batch(&b, tok, 5, 1, true);
    cr_assert_eq(tdm_eagle3_forward(h, be, &kv.kv, &b, seqs, &s, g + (size_t)5 * E, hout, logits, &err), TANDEM_OK,
                 "%s", err.msg);
    rhead_row(&r, tok[5], rg + (size_t)5 * E, 5, rh + (size_t)5 * E, rl);
    expect_logits(logits, rl, V, tol, "row 5");
    /* 3: a deeper level's row (g = row 5's output), then a fused one wanting logits */
    float g3[2 * 512];
    cr_assert_leq(E, 512);
    memcpy(g3, hout, (size_t)E * sizeof(float));
    memcpy(g3 + E, g + (size_t)7 * E, (size_t)E * sizeof(float));
    fill_batch(&b, tok, 6, 2, true);
    b.want_logits[0] = 0;
    cr_assert_eq(tdm_eagle3_forward(h, be, &kv.kv, &b, seqs, &s, g3, NULL, logits, &err), TANDEM_OK, "%s", err.msg);
    double *g6 = malloc((size_t)E * sizeof *g6);
    for (int i = 0; i < E; i++) g6[i] = hout[i]; /* (the engine's h, as the head reads it) */
    rhead_row(&r, tok[6], g6, 6, rh + (size_t)6 * E, rl);
    rhead_row(&r, tok[7], rg + (size_t)7 * E, 7, rh + (size_t)7 * E, rl);
    expect_logits(logits, rl, V, tol, "row 7");
    /* an unpaired head refuses to run */
    h->paired = false;
    cr_assert_eq(tdm_eagle3_forward(h, be, &kv.kv, &b, seqs, &s, g3, NULL, logits, &err), TANDEM_ERR_INVALID_ARG);
    free(g6), free(rl), free(rh), free(logits), free(hout), free(rg), free(feat), free(g);
    tdm_batch_free(&b);
    tdm_kv_store_free(&kv.kv);
    tdm_eagle3_scratch_free(&s);
    rhead_close(&r);
    tdm_eagle3_free(h);
    tdm_model_free(t);
    tdm_backend_destroy(be);
}

Test(eagle3, forward_every_option) {
    hcfg c = full_cfg();
    size_t len;
    uint8_t *buf = build_head(&c, &len);
    check_forward(buf, len, NULL, 2e-5);
    free(buf);
    /* q, k, v (and gate, up) of two types: fused in f32 at load */
    c.mixed = true;
    buf = build_head(&c, &len);
    check_forward(buf, len, NULL, 2e-5);
    free(buf);
}

Test(eagle3, forward_synth_head) {
    char path[32];
    synth_head(path, TDM_F16, NULL);
    check_forward(NULL, 0, path, 2e-5);
    unlink(path);
    /* q8_0 weights (the reference reads them dequantised) */
    synth_head(path, TDM_Q8_0, NULL);
    check_forward(NULL, 0, path, 2e-5);
    unlink(path);
}
