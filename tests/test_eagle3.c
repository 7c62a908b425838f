/* test_eagle3.c - EAGLE-3 draft heads (src/model/eagle3.h), the file and the features:
 *   - the file: synthesised heads (tandem synth's eagle3-pycode: f16, q8_0, q4_0,
 *     q4_k_m; eagle3-pycode-embd with its own embedding) load and pair with the pycode
 *     target; every corrupt or inconsistent file of an enumerated list is a clear
 *     error naming the problem; a mismatch with the target names both files;
 *   - the target's feature export (tdm_fwd_scratch_set_features): the rows of every
 *     forward equal the residual stream of the same model run only up to each feature
 *     layer, bit for bit, through the CPU backend's fused blocks and op by op, and the
 *     forward's logits are unchanged by the export.
 * The head's forward: test_eagle3_forward.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "eagle3_testutil.h"
#include "gguf_write.h"
#include "kv_cache.h"
#include "synth.h"
#include "testutil.h"

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
/* The export of the layers ids[n] from the pycode target over two forwards (a
 * 20-row prefill, then 3 rows) against the residual stream of the same model cut
 * after each layer, and the logits against a forward without the export; mode 0:
 * the CPU's fused blocks writing the features themselves, 1: the fused blocks in
 * parts ending at the feature layers (a backend without blocks_feat), 2: op by op. */
static void check_export(const int32_t *ids, int n, int mode) {
    tdm_backend *be = cpu(2);
    const bool by_ops = mode == 2;
    be->blocks_feat = mode == 0;
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
                             0, "layer %d, forward %d, row %d: the exported stream differs (mode %d)", (int)ids[j], k,
                             i, mode);
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
    for (int mode = 0; mode < 3; mode++) {
        check_export(head, 3, mode);
        check_export(edges, 4, mode);
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
