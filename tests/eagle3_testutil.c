/* eagle3_testutil.c - see eagle3_testutil.h. */
#include "eagle3_testutil.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "gguf_write.h"
#include "quantize.h"
#include "stats.h"
#include "synth.h"
#include "testutil.h"
#include "tiny_model.h"

#define GGML_I64 27

tdm_backend *cpu(int threads) {
    tdm_backend *be;
    tdm_err err = {0};
    cr_assert_eq(tdm_backend_cpu_create(threads, &be, &err), TANDEM_OK, "%s", err.msg);
    return be;
}

tdm_model *load_target(tdm_backend *be) {
    tdm_model *m;
    tdm_err err = {0};
    cr_assert_eq(tdm_model_load(tdm_test_model_path("pycode-target-f16.gguf"), be, &m, &err), TANDEM_OK, "%s",
                 err.msg);
    return m;
}

/* The in-memory head of the forward test: every option, its own embedding and head,
 * narrower than the pycode target whose features it fuses. */
hcfg full_cfg(void) {
    return (hcfg){.E = 128, .H = 4, .KV = 2, .hd = 32, .F = 256, .V = 8192, .Vd = 500, .T = 384, .layers = {1, 4, 8},
                  .nbf = true, .nbr = true, .own_embd = true, .own_output = true, .shuffle = true, .type = TDM_F32};
}

/* A small valid head for the corruption cases (pairs with the pycode target). */
hcfg small_cfg(void) {
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
uint8_t *build_head(const hcfg *c, size_t *len) {
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
tandem_status load_mem(const uint8_t *buf, size_t len, tdm_backend *be, tdm_eagle3 **h, tdm_err *err) {
    tdm_gguf *g;
    tandem_status st = tdm_gguf_open_memory(buf, len, &g, err);
    if (st) return st;
    return tdm_eagle3_load_gguf(g, be, h, err);
}

/* tandem synth's eagle3-pycode head of type `type` (kind: a mix, or NULL) in a
 * temporary file whose path is written to path[32]. */
void synth_shape(char *path, const char *shape, uint32_t type, const char *kind) {
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

void synth_head(char *path, uint32_t type, const char *kind) { synth_shape(path, "eagle3-pycode", type, kind); }



tdm_eagle3 *tiny_head(tdm_backend *be, const tdm_tiny_cfg *tc, int vd, uint8_t **buf) {
    const hcfg hc = {.E = 32, .H = 2, .KV = 1, .hd = 16, .F = 48, .V = tc->n_vocab, .Vd = vd, .T = tc->n_embd,
                     .layers = {0, 1, 2}, .own_embd = true, .own_output = true, .shuffle = true, .type = TDM_F32};
    size_t len;
    *buf = build_head(&hc, &len);
    tdm_eagle3 *h;
    tdm_err err = {0};
    cr_assert_eq(load_mem(*buf, len, be, &h, &err), TANDEM_OK, "%s", err.msg);
    return h;
}

void check_same_distribution(tdm_engine *ref, tdm_engine *spec, const tandem_generate_params *gp, int runs, int n_pos,
                             double bound, const char *what) {
    const int32_t V = ref->n_vocab, prompt[] = {3, 7, 1, 9, 4, 3, 7, 1}; /* (lookups find proposals) */
    uint64_t *a = calloc((size_t)(n_pos * V), 8), *b = calloc((size_t)(n_pos * V), 8);
    tandem_spec_stats agg = {0};
    tdm_test_sample_counts(ref, gp, prompt, 8, 1000000, runs, n_pos, V, a, NULL);
    tdm_test_sample_counts(spec, gp, prompt, 8, 2000000, runs, n_pos, V, b, &agg);
    const double acc = agg.drafted ? (double)agg.accepted / (double)agg.drafted : 0;
    cr_log_info("%s: acceptance %.3f, %.3f drafted per run, %.3f tree steps per run", what, acc,
                (double)agg.drafted / runs, (double)agg.tree_steps / runs);
    /* (the distributions are compared whatever the acceptance; where the head's tokens
     * were all kept or all refused, one of the verdict's branches went untested, said
     * in the log: the GPU's numerics give other acceptances than the CPU's) */
    cr_assert_gt(agg.drafted, 0, "%s: nothing drafted", what);
    if (gp->spec_tree > 0 || gp->spec_tree_shape) cr_assert_gt(agg.tree_steps, 0, "%s: no tree verified", what);
    if (!(acc > 0.0 && acc < 1.0)) cr_log_warn("%s: acceptance %.3f: one outcome only", what, acc);
    for (int i = 0; i < n_pos; i++) {
        const double pv = tdm_stat_chi2_two_sample(a + i * V, b + i * V, V);
        cr_log_info("  position %d: p-value %.4f", i + 1, pv);
        cr_assert_gt(pv, bound, "%s, position %d: sampling with the head differs from target-only (p = %.2g)", what,
                     i + 1, pv);
    }
    free(a);
    free(b);
}

void rig_open(rig *r, const tdm_model *m, tdm_backend *be) {
    tdm_err err = {0};
    memset(r, 0, sizeof *r);
    cr_assert_eq(tdm_kv_store_init(&r->kv, m, be, TDM_F32, 4, 16, &err), TANDEM_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++) r->blocks[i] = i;
    r->seq = (tdm_kv_seq){.blocks = r->blocks, .n_blocks = 4, .cap_blocks = 4, .len = 64};
}

/* Rows [p0, p0 + n) of tok, causal, one sequence; logits for all or none. */
void fill_batch(tdm_batch *b, const int32_t *tok, int p0, int n, bool logits) {
    tdm_batch_clear(b);
    for (int i = 0; i < n; i++) cr_assert_geq(tdm_batch_add(b, tok[p0 + i], p0 + i, 0, p0 + i, logits), 0);
}

