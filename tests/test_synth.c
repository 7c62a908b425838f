/* test_synth.c - synthetic models (synth.h): the shape table against the published
 * parameter counts, the synthetic vocabulary (exact size, unique tokens, lossless
 * round trips through tandem's tokenizer), tiny models of every type that load and
 * give finite, moderate logits, and the file handling (no overwrite, cancellation
 * and failures leave no file behind). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "gguf.h"
#include "gguf_write.h"
#include "synth.h"
#include "tokenizer.h"

static tdm_synth_opts opts(const char *shape, uint32_t type) {
    tdm_synth_opts o = {.shape = tdm_synth_shape_find(shape), .type = type};
    cr_assert(o.shape, "shape %s", shape);
    return o;
}

static bool exists(const char *path) {
    struct stat sb;
    return lstat(path, &sb) == 0;
}

/* A fresh temporary directory (removed by rm_dir). */
static char *tmp_dir(void) {
    char *d = strdup("/tmp/tdm-synth-XXXXXX");
    cr_assert(mkdtemp(d));
    return d;
}

static char *path_in(const char *dir, const char *name) {
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

Test(synth, shapes_have_the_published_sizes) {
    static const struct {
        const char *name;
        uint64_t params;
    } want[] = {
        {"llama2-7b", 6738415616ull},  {"llama3-8b", 8030261248ull},     {"llama2-13b", 13015864320ull},
        {"tinyllama-1.1b", 1100048384ull}, {"llama-160m", 162417408ull},
        /* the published counts of Llama 3.2 1B (plus the 32 rope_freqs), Qwen3 0.6B, Gemma 3 1B */
        {"llama3.2-1b", 1235814400ull + 32}, {"qwen3-0.6b", 596049920ull}, {"gemma3-1b", 999885952ull},
        /* SmolLM2-135M (the real file's 134,515,008, test_real_model) */
        {"smollm2-135m", 134515008ull},
        /* mixtures of experts: Qwen3-30B-A3B and Mixtral-8x7B */
        {"qwen3-30b-a3b", 30532122624ull}, {"mixtral-8x7b", 46702792704ull},
    };
    for (size_t i = 0; i < TDM_ARRAY_LEN(want); i++) {
        tdm_synth_opts o = opts(want[i].name, TDM_Q4_0);
        tdm_gguf_writer *w;
        tdm_synth_info inf;
        tdm_err err = {0};
        cr_assert_eq(tdm_synth_plan(&o, &w, &inf, &err), TANDEM_OK, "%s: %s", want[i].name, err.msg);
        cr_expect_eq(inf.n_params, want[i].params, "%s: %llu parameters", want[i].name,
                     (unsigned long long)inf.n_params);
        const tdm_synth_shape *sh = o.shape;
        const bool qk = sh->arch != NULL, post = sh->arch && !strcmp(sh->arch, "gemma3");
        const uint64_t ffn = sh->n_expert ? 4 : 3; /* (the router and 3 expert tensors) */
        cr_expect_eq(inf.n_tensors, 3 - sh->tied + sh->rope_freqs + (6 + ffn + 2 * qk + 2 * post) * (uint64_t)sh->n_layer,
                     "%s: %llu tensors", want[i].name, (unsigned long long)inf.n_tensors);
        tdm_gguf_writer_free(w);
    }
    cr_assert_null(tdm_synth_shape_find("llama9"));
    cr_assert(tdm_synth_shape_find("tiny")->hidden);
    tdm_synth_opts o = opts("tiny", TDM_BF16);
    tdm_gguf_writer *w;
    cr_assert_eq(tdm_synth_plan(&o, &w, NULL, NULL), TANDEM_ERR_INVALID_ARG, "bf16 is not a synth type");
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

Test(synth, vocabulary) {
    static const int32_t sizes[] = {260, 1000, 32000, 128256};
    static const char text[] = "Hello, world! 42 \xc3\xbcn\xc3\xaf" "code\n\ttabs  and  spaces";
    for (size_t si = 0; si < TDM_ARRAY_LEN(sizes); si++) {
        int32_t n = sizes[si];
        tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
        tdm_err err = {0};
        cr_assert_eq(tdm_synth_vocab(w, n, &err), TANDEM_OK, "%s", err.msg);
        uint8_t *buf;
        size_t len;
        cr_assert_eq(tdm_gguf_writer_finish(w, &buf, &len), TANDEM_OK);
        tdm_gguf_writer_free(w);
        tdm_gguf *g;
        cr_assert_eq(tdm_gguf_open_memory(buf, len, &g, &err), TANDEM_OK, "%s", err.msg);
        const tdm_gguf_array *toks;
        cr_assert_eq(tdm_gguf_get_arr(g, "tokenizer.ggml.tokens", TDM_GGUF_STRING, &toks, &err), TANDEM_OK);
        cr_assert_eq(toks->n, (uint64_t)n);
        /* unique (llama.cpp asserts it) */
        char **s = malloc((size_t)n * sizeof *s);
        for (int32_t i = 0; i < n; i++) s[i] = strndup(toks->strs[i].ptr, (size_t)toks->strs[i].len);
        cr_assert_str_eq(s[0], "<unk>");
        cr_assert_str_eq(s[3 + '\n'], "<0x0A>");
        qsort(s, (size_t)n, sizeof *s, cmp_str);
        for (int32_t i = 1; i < n; i++) cr_assert(strcmp(s[i - 1], s[i]) != 0, "duplicate token '%s'", s[i]);
        for (int32_t i = 0; i < n; i++) free(s[i]);
        free(s);

        tdm_tokenizer *t;
        cr_assert_eq(tdm_tokenizer_load(g, &t, &err), TANDEM_OK, "%s", err.msg);
        cr_assert_eq(tdm_tok_n_vocab(t), n);
        cr_assert_eq(tdm_tok_bos(t), 1);
        cr_assert_eq(tdm_tok_eos(t), 2);
        cr_assert(tdm_tok_add_bos(t));
        int32_t *ids;
        size_t n_ids;
        cr_assert_eq(tdm_tokenize(t, text, strlen(text), true, false, &ids, &n_ids, &err), TANDEM_OK);
        cr_assert(n_ids > 1 && ids[0] == 1);
        if (n >= 32000) cr_expect(n_ids < strlen(text) * 3 / 4, "pieces merge: %zu tokens", n_ids);
        char out[256];
        size_t k = 0;
        tdm_detok d;
        tdm_detok_init(&d, t);
        for (size_t i = 0; i < n_ids; i++) {
            int32_t m = tdm_detok_push(&d, t, ids[i], out + k, (int32_t)(sizeof out - k));
            cr_assert(m >= 0);
            k += (size_t)m;
        }
        k += (size_t)tdm_detok_flush(&d, out + k, (int32_t)(sizeof out - k));
        cr_expect(k == strlen(text) && memcmp(out, text, k) == 0, "n_vocab %d: round trip gave '%.*s'", n, (int)k,
                  out);
        free(ids);
        tdm_tokenizer_free(t);
        tdm_gguf_close(g);
        free(buf);
    }
    tdm_gguf_writer *w = tdm_gguf_writer_new(3, 32);
    cr_assert_eq(tdm_synth_vocab(w, 259, NULL), TANDEM_ERR_INVALID_ARG);
    tdm_gguf_writer_free(w);
}

/* Loads a model and scores a prompt: every logit finite and moderate. */
static void check_logits(const char *path, const char *what, bool tied) {
    tdm_err err = {0};
    tdm_backend *be;
    cr_assert_eq(tdm_backend_cpu_create(1, &be, &err), TANDEM_OK, "%s", err.msg);
    tdm_model *m;
    cr_assert_eq(tdm_model_load(path, be, &m, &err), TANDEM_OK, "%s: %s", what, err.msg);
    cr_assert_eq(m->hp.n_embd, 256);
    cr_assert_eq(m->hp.tied_output, tied);
    tdm_engine_cfg cfg = {.n_threads = 1};
    tdm_engine *e;
    cr_assert_eq(tdm_engine_create(m, NULL, &cfg, &e, &err), TANDEM_OK, "%s", err.msg);
    int32_t ids[24];
    for (int i = 0; i < 24; i++) ids[i] = i == 0 ? 1 : 300 + 997 * i % 31000;
    float *logits = malloc((size_t)m->hp.n_vocab * sizeof *logits);
    cr_assert_eq(tdm_engine_score_last(e, false, ids, 24, logits, &err), TANDEM_OK, "%s", err.msg);
    double sum2 = 0, amax = 0;
    for (int32_t i = 0; i < m->hp.n_vocab; i++) {
        cr_assert(isfinite(logits[i]), "%s: logit %d is %g", what, i, (double)logits[i]);
        sum2 += (double)logits[i] * logits[i];
        amax = fmax(amax, fabs((double)logits[i]));
    }
    double rms = sqrt(sum2 / m->hp.n_vocab);
    cr_expect(rms > 0.05 && amax < 20, "%s: logits rms %g, max |logit| %g", what, rms, amax);
    free(logits);
    tdm_engine_free(e);
    tdm_model_free(m);
    tdm_backend_destroy(be);
}

Test(synth, tiny_models_load_and_give_finite_logits, .timeout = 120) {
    static const uint32_t types[] = {TDM_F16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_K, TDM_Q6_K};
    char *dir = tmp_dir();
    for (size_t i = 0; i < TDM_ARRAY_LEN(types); i++) {
        tdm_synth_opts o = opts("tiny", types[i]);
        o.tile_bytes = 1 << 20; /* tiles shorter than the embedding: wrapping is exercised */
        char *path = path_in(dir, "m.gguf");
        tdm_synth_info inf;
        tdm_err err = {0};
        cr_assert_eq(tdm_synth_write(&o, path, &inf, &err), TANDEM_OK, "%s", err.msg);
        struct stat sb;
        cr_assert_eq(stat(path, &sb), 0);
        cr_assert_eq((uint64_t)sb.st_size, inf.file_bytes);
        tdm_gguf *g;
        cr_assert_eq(tdm_gguf_open(path, &g, &err), TANDEM_OK, "%s", err.msg);
        uint32_t ft;
        cr_assert_eq(tdm_gguf_get_u32(g, "general.file_type", &ft, &err), TANDEM_OK);
        cr_assert_eq(ft, tdm_synth_file_type(types[i]));
        for (uint64_t t = 0; t < g->n_tensors; t++) {
            const tdm_gguf_tensor *x = &g->tensors[t];
            bool norm = strstr(x->name, "norm") != NULL;
            cr_assert_eq(x->type, norm ? (uint32_t)TDM_F32 : types[i], "%s", x->name);
            if (norm) cr_assert_eq(((const float *)x->data)[7], 1.0f);
        }
        /* q and k start at different places of their tile */
        const tdm_gguf_tensor *q = tdm_gguf_find_tensor(g, "blk.0.attn_q.weight");
        const tdm_gguf_tensor *k = tdm_gguf_find_tensor(g, "blk.0.attn_k.weight");
        cr_assert(memcmp(q->data, k->data, 64) != 0);
        tdm_gguf_close(g);
        check_logits(path, tdm_dtype_name(types[i]), false);
        unlink(path);
        free(path);
    }
    rmdir(dir);
    free(dir);
}

/* Writes o's model to path and opens it. */
static tdm_gguf *write_and_open(const tdm_synth_opts *o, const char *path) {
    tdm_err err = {0};
    cr_assert_eq(tdm_synth_write(o, path, NULL, &err), TANDEM_OK, "%s", err.msg);
    tdm_gguf *g;
    cr_assert_eq(tdm_gguf_open(path, &g, &err), TANDEM_OK, "%s", err.msg);
    return g;
}

/* The qwen3, gemma3 and Llama 3 (tied, rope_freqs) test shapes: the extra norms of
 * 1.0, the divisors llama.cpp's converter writes for Llama 3.1, and finite logits. */
Test(synth, other_architectures_load, .timeout = 120) {
    static const char *names[] = {"tiny-qwen3", "tiny-gemma3", "tiny-llama3"};
    char *dir = tmp_dir();
    for (size_t i = 0; i < TDM_ARRAY_LEN(names); i++) {
        tdm_synth_opts o = opts(names[i], TDM_Q8_0);
        o.tile_bytes = 1 << 20;
        char *path = path_in(dir, "m.gguf");
        tdm_err err = {0};
        tdm_gguf *g = write_and_open(&o, path);
        tdm_gguf_str arch;
        cr_assert_eq(tdm_gguf_get_str(g, "general.architecture", &arch, &err), TANDEM_OK);
        const char *want = o.shape->arch ? o.shape->arch : "llama";
        cr_assert(arch.len == strlen(want) && !memcmp(arch.ptr, want, arch.len), "%s: architecture", names[i]);
        if (o.shape->arch) {
            const tdm_gguf_tensor *qn = tdm_gguf_find_tensor(g, "blk.1.attn_q_norm.weight");
            cr_assert(qn && qn->ne[0] == 128 && ((const float *)qn->data)[5] == 1.0f, "%s: q norm", names[i]);
        }
        const tdm_gguf_tensor *rf = tdm_gguf_find_tensor(g, "rope_freqs.weight");
        cr_assert_eq(rf != NULL, o.shape->rope_freqs, "%s: rope_freqs", names[i]);
        if (rf) { /* heads of 64, base 5e5: pair 0 keeps its frequency, pair 31 is divided by 32 */
            cr_assert_eq(rf->ne[0], 32);
            cr_assert_eq(((const float *)rf->data)[0], 1.0f);
            cr_assert_eq(((const float *)rf->data)[31], 32.0f);
        }
        cr_assert_eq(tdm_gguf_find_tensor(g, "output.weight") == NULL, o.shape->tied, "%s: output.weight", names[i]);
        tdm_gguf_close(g);
        check_logits(path, names[i], o.shape->tied);
        unlink(path);
        free(path);
    }
    rmdir(dir);
    free(dir);
}

/* A Q4_K_M-like mix: q4_k matrices, q6_k for the output head and for attn_v and
 * ffn_down of the layers llama.cpp's mix gives more bits (tiny: the second of 2). */
Test(synth, q4_k_m_mix, .timeout = 120) {
    char *dir = tmp_dir();
    tdm_synth_opts o = opts("tiny", TDM_Q4_K);
    o.kind = tdm_quant_kind_find("q4_k_m");
    o.tile_bytes = 1 << 20;
    char *path = path_in(dir, "m.gguf");
    tdm_err err = {0};
    tdm_gguf *g = write_and_open(&o, path);
    uint32_t ft;
    cr_assert_eq(tdm_gguf_get_u32(g, "general.file_type", &ft, &err), TANDEM_OK);
    cr_assert_eq(ft, 15u); /* LLAMA_FTYPE_MOSTLY_Q4_K_M */
    cr_assert_eq(tdm_gguf_find_tensor(g, "output.weight")->type, (uint32_t)TDM_Q6_K);
    cr_assert_eq(tdm_gguf_find_tensor(g, "token_embd.weight")->type, (uint32_t)TDM_Q4_K);
    cr_assert_eq(tdm_gguf_find_tensor(g, "blk.0.attn_v.weight")->type, (uint32_t)TDM_Q4_K);
    cr_assert_eq(tdm_gguf_find_tensor(g, "blk.1.attn_v.weight")->type, (uint32_t)TDM_Q6_K);
    cr_assert_eq(tdm_gguf_find_tensor(g, "blk.1.ffn_down.weight")->type, (uint32_t)TDM_Q6_K);
    cr_assert_eq(tdm_gguf_find_tensor(g, "blk.1.attn_q.weight")->type, (uint32_t)TDM_Q4_K);
    tdm_gguf_close(g);
    check_logits(path, "q4_k_m", false);
    unlink(path);
    free(path);
    rmdir(dir);
    free(dir);
}

static bool stop_at_first(void *ctx, uint64_t done, uint64_t total) {
    (void)total;
    int *calls = ctx;
    ++*calls;
    return done == 0;
}

Test(synth, files_are_never_left_partial) {
    char *dir = tmp_dir();
    char *path = path_in(dir, "m.gguf"), *tmp = path_in(dir, "m.gguf.tmp");
    tdm_synth_opts o = opts("tiny", TDM_Q4_0);
    tdm_err err = {0};
    int calls = 0;
    o.progress = stop_at_first;
    o.progress_ctx = &calls;
    cr_assert_eq(tdm_synth_write(&o, path, NULL, &err), TANDEM_ERR_CANCELLED);
    cr_assert(calls == 2, "%d progress calls", calls);
    cr_assert(!exists(path) && !exists(tmp), "a cancelled run leaves nothing");

    FILE *f = fopen(path, "w");
    fputs("keep", f);
    fclose(f);
    o.progress = NULL;
    cr_assert_eq(tdm_synth_write(&o, path, NULL, &err), TANDEM_ERR_IO);
    cr_assert(strstr(err.msg, "already exists"), "%s", err.msg);
    struct stat sb;
    cr_assert(stat(path, &sb) == 0 && sb.st_size == 4, "the existing file is untouched");
    o.overwrite = true;
    cr_assert_eq(tdm_synth_write(&o, path, NULL, &err), TANDEM_OK, "%s", err.msg);
    cr_assert(stat(path, &sb) == 0 && sb.st_size > 4 && !exists(tmp));

    o.tokenizer_from = path; /* a tokenizer of 32000 tokens: the same as tiny's */
    char *copy = path_in(dir, "copy.gguf");
    cr_assert_eq(tdm_synth_write(&o, copy, NULL, &err), TANDEM_OK, "%s", err.msg);
    o.shape = tdm_synth_shape_find("llama3-8b");
    cr_assert_eq(tdm_synth_write(&o, copy, NULL, &err), TANDEM_ERR_MISMATCH);
    cr_assert(strstr(err.msg, "32000") && strstr(err.msg, "128256"), "%s", err.msg);
    unlink(copy);
    free(copy);

    o = opts("tiny", TDM_Q4_0);
    char *bad = path_in(dir, "no/such/m.gguf");
    cr_assert_eq(tdm_synth_write(&o, bad, NULL, &err), TANDEM_ERR_IO);
    cr_assert(strstr(err.msg, "no/such/m.gguf") && strstr(err.msg, "No such file"), "%s", err.msg);
    free(bad);
    unlink(path);
    rmdir(dir);
    free(path);
    free(tmp);
    free(dir);
}

/* ------------------------------------------------------------ mixtures of experts */

/* The test shapes written and loaded: metadata, tensor shapes and types (q4_k_m:
 * the router stays f32, ffn_down_exps q6_k where llama.cpp's mix gives ffn_down
 * more bits), and finite logits from tandem. */
Test(synth, moe_models_load, .timeout = 120) {
    static const char *names[] = {"tiny-qwen3moe", "tiny-mixtral"};
    char *dir = tmp_dir();
    for (size_t i = 0; i < TDM_ARRAY_LEN(names); i++) {
        tdm_synth_opts o = opts(names[i], TDM_Q4_K);
        o.kind = tdm_quant_kind_find("q4_k_m");
        o.tile_bytes = 1 << 20;
        const tdm_synth_shape *sh = o.shape;
        const int64_t f = sh->n_ff_exp ? sh->n_ff_exp : sh->n_ff;
        char *path = path_in(dir, "m.gguf");
        tdm_err err = {0};
        tdm_gguf *g = write_and_open(&o, path);
        char key[96];
        const char *arch = sh->arch ? sh->arch : "llama";
        uint32_t v;
        snprintf(key, sizeof key, "%s.expert_count", arch);
        cr_assert(tdm_gguf_get_u32(g, key, &v, &err) == TANDEM_OK && v == (uint32_t)sh->n_expert, "%s", key);
        snprintf(key, sizeof key, "%s.expert_used_count", arch);
        cr_assert(tdm_gguf_get_u32(g, key, &v, &err) == TANDEM_OK && v == (uint32_t)sh->n_expert_used, "%s", key);
        snprintf(key, sizeof key, "%s.expert_feed_forward_length", arch);
        cr_assert_eq(tdm_gguf_find(g, key) != NULL, sh->n_ff_exp != 0, "%s", key);
        const tdm_gguf_tensor *r = tdm_gguf_find_tensor(g, "blk.0.ffn_gate_inp.weight");
        cr_assert(r && r->type == TDM_F32 && r->n_dims == 2 && r->ne[0] == 256 && r->ne[1] == sh->n_expert);
        const float *rv = r->data;
        cr_assert(rv[0] != rv[1] && rv[0] != 1.0f, "%s: the router is random", names[i]);
        const tdm_gguf_tensor *gx = tdm_gguf_find_tensor(g, "blk.0.ffn_gate_exps.weight");
        const tdm_gguf_tensor *dx = tdm_gguf_find_tensor(g, "blk.1.ffn_down_exps.weight");
        cr_assert(gx && gx->n_dims == 3 && gx->ne[0] == 256 && gx->ne[1] == f && gx->ne[2] == sh->n_expert);
        cr_assert(dx && dx->n_dims == 3 && dx->ne[0] == f && dx->ne[1] == 256 && dx->ne[2] == sh->n_expert);
        cr_assert_eq(gx->type, (uint32_t)TDM_Q4_K);
        cr_assert_eq(dx->type, (uint32_t)TDM_Q6_K);
        cr_assert_null(tdm_gguf_find_tensor(g, "blk.0.ffn_gate.weight"));
        tdm_gguf_close(g);
        check_logits(path, names[i], false);
        unlink(path);
        free(path);
    }
    rmdir(dir);
    free(dir);
}
