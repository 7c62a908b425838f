/* cli_info.c - `tandem info MODEL [-d DRAFT] [--ctx N]`: the GGUF header, every
 * metadata pair, a tensor table and totals, then an estimate of the memory an engine
 * of the model (and the draft) takes on the CPU.  Reads the files with the GGUF
 * parser directly (no model load), so it describes any file whose metadata parses: a
 * tensor of a type tandem does not compute with is listed with its GGML type name and
 * marked unsupported, and a file without a model's hyperparameters gets no estimate.
 * An EAGLE-3 draft head (architecture eagle3) is described as one (its shapes, the
 * target's feature layers, its draft vocabulary); with -d HEAD beside a target, the
 * pair is checked. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "common.h"
#include "dtype.h"
#include "engine.h"
#include "ggml_types.h"
#include "gguf.h"
#include "kv_layout.h"
#include "model.h"
#include "eagle3.h"

#define INFO_MAX_ARRAY_ELEMS 8

static void print_type(const tdm_gguf_value *v) {
    if (v->type == TDM_GGUF_ARRAY)
        printf("array[%s]", tdm_gguf_type_name(v->v.arr.type));
    else
        fputs(tdm_gguf_type_name(v->type), stdout);
}

static void print_shape(const tdm_gguf_tensor *t, char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    for (uint32_t d = 0; d < t->n_dims && k < cap; d++) {
        int w = snprintf(buf + k, cap - k, "%s%lld", d ? ", " : "[", (long long)t->ne[d]);
        if (w < 0) break;
        k += (size_t)w;
    }
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

/* A string of several lines (a chat template): its size, then each line indented
 * under the key, rather than one escaped line of thousands of characters.  Control
 * bytes other than tab show as \xNN (nothing in the file reaches the terminal raw). */
static void print_text_lines(const tdm_gguf_str *str) {
    uint64_t n_lines = 1;
    for (uint64_t i = 0; i < str->len; i++) n_lines += str->ptr[i] == '\n';
    printf("(%llu bytes, %llu lines)\n    | ", (unsigned long long)str->len, (unsigned long long)n_lines);
    for (uint64_t i = 0; i < str->len; i++) {
        unsigned char c = (unsigned char)str->ptr[i];
        if (c == '\n') fputs(i + 1 < str->len ? "\n    | " : "\n    |", stdout);
        else if ((c < 0x20 && c != '\t') || c == 0x7f) printf("\\x%02x", c);
        else fputc(c, stdout);
    }
    fputc('\n', stdout);
}

static double mib(double b) { return b / (1024.0 * 1024.0); }

/* One model of the estimate: its hyperparameters and the bytes of its tensors. */
typedef struct est_model {
    tdm_hparams hp;
    uint64_t weights;
} est_model;

/* Reads path's hyperparameters and tensor bytes; false with *why set when the file
 * does not open or has no model's hyperparameters. */
static bool est_read(const char *path, est_model *m, tdm_err *why) {
    tdm_gguf *g = NULL;
    memset(m, 0, sizeof *m);
    if (tdm_gguf_open(path, &g, why)) return false;
    const bool ok = tdm_hparams_read(g, &m->hp, why) == TANDEM_OK;
    for (uint64_t i = 0; i < g->n_tensors; i++) m->weights += g->tensors[i].nbytes;
    tdm_gguf_close(g);
    return ok;
}

/* K and V bytes per token of a cache of this type (blocks of 16, as the engine). */
static double kv_per_token(const tdm_hparams *hp, uint32_t type) {
    const tdm_kv_layout l = {hp->n_layer, hp->n_head_kv, hp->head_dim, type};
    return (double)tdm_kv_bytes_per_block(&l, 1, 16) / 16.0;
}

/* The memory an engine of the target (and the draft) takes on the CPU with the
 * defaults: the weights, the f16 KV cache at the context, the working buffers (the
 * forward buffers of a prefill chunk and the logits rows, engine.c). */
static void print_estimate(const char *path, const char *draft_path, int ctx_opt) {
    est_model t, d;
    tdm_err why = {0};
    if (!est_read(path, &t, &why)) {
        printf("memory estimate: none (%s)\n", why.msg);
        return;
    }
    if (draft_path && !est_read(draft_path, &d, &why)) {
        printf("memory estimate: none (draft %s: %s)\n", draft_path, why.msg);
        return;
    }
    const est_model *ms[2] = {&t, draft_path ? &d : NULL};
    const char *names[2] = {"target", "draft"};
    const int ctx = ctx_opt > 0 ? ctx_opt : TDM_MIN(TANDEM_CTX_DEFAULT, t.hp.n_ctx_train);
    const int32_t logit_rows = tdm_engine_logit_rows(1);
    double weights = 0, kv16 = 0, kv8 = 0, kv32 = 0, fwd = 0, logits = 0;
    for (int i = 0; i < 2 && ms[i]; i++) {
        weights += (double)ms[i]->weights;
        kv16 += kv_per_token(&ms[i]->hp, TDM_F16);
        kv8 += kv_per_token(&ms[i]->hp, TDM_Q8_0);
        kv32 += kv_per_token(&ms[i]->hp, TDM_F32);
        fwd += (double)tdm_engine_fwd_scratch_bytes(&ms[i]->hp, TDM_ENGINE_CHUNK_CPU);
        logits += (double)logit_rows * (double)t.hp.n_vocab * sizeof(float);
    }
    const double kv_ctx = kv16 * ctx, work = fwd + logits;
    printf("memory estimate (CPU, one sequence, the defaults):\n");
    for (int i = 0; i < 2 && ms[i]; i++)
        printf("  %s weights: %.1f MiB (the file's tensors)\n", names[i], mib((double)ms[i]->weights));
    printf("  KV cache (f16): %.1f KiB per token%s; %.1f MiB at a context of %d (%s); q8_0 or fp8 %.1f KiB per "
           "token, f32 %.1f\n",
           kv16 / 1024.0, draft_path ? " (both models)" : "", mib(kv_ctx), ctx,
           ctx_opt > 0 ? "--ctx" : "the default: min(4096, the model's training context)", kv8 / 1024.0,
           kv32 / 1024.0);
    printf("  working buffers: %.1f MiB at most (forward buffers of %d-token prefill chunks %.1f MiB, logits of up "
           "to %d rows %.1f MiB)\n",
           mib(work), TDM_ENGINE_CHUNK_CPU, mib(fwd), (int)logit_rows, mib(logits));
    printf("  total: %.1f MiB with the context full; the KV cache takes memory as tokens arrive, so a short "
           "conversation needs about %.1f MiB\n",
           mib(weights + kv_ctx + work), mib(weights + work));
}

/* An EAGLE-3 head's description (its keys and shapes checked as a load checks them):
 * CLI_EXIT_OK, or an error naming what is wrong. */
static int print_eagle3(const tdm_gguf *g) {
    tdm_hparams hp;
    tdm_eagle3_hparams ep;
    tdm_err err = {0};
    tandem_status st = tdm_eagle3_read_hparams(g, &hp, &ep, &err);
    if (st) return cli_error("invalid EAGLE-3 head: %s", err.msg[0] ? err.msg : tandem_status_str(st));
    uint64_t bytes = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) bytes += g->tensors[i].nbytes;
    printf("EAGLE-3 draft head (architecture eagle3, llama.cpp's layout):\n");
    printf("  decoder: 1 layer, hidden %d, %d heads / %d KV heads of %d, FFN %d, attention input 2 x %d; RMSNorm eps "
           "%g, RoPE base %g%s\n",
           (int)ep.n_embd, (int)ep.n_head, (int)ep.n_head_kv, (int)ep.head_dim, (int)ep.n_ff, (int)ep.n_embd,
           (double)hp.norm_eps, (double)hp.rope.freq_base, hp.rope_freqs ? " with rope_freqs" : "");
    printf("  features: the target's residual stream entering layers %d, %d, %d (target hidden %d), fused by fc "
           "[%d -> %d]%s%s\n",
           (int)ep.feat_layers[0], (int)ep.feat_layers[1], (int)ep.feat_layers[2], (int)ep.target_hidden,
           3 * (int)ep.target_hidden, (int)ep.n_embd, ep.norm_before_fc ? ", normed first (norm_before_fc)" : "",
           ep.norm_before_residual ? "; residual from the normed features (norm_before_residual)" : "");
    printf("  vocabulary: the target's %d tokens; draft vocabulary %d%s\n", (int)ep.n_vocab, (int)ep.n_draft_vocab,
           ep.has_d2t ? " (d2t maps each to a target id)" : " (all of them)");
    printf("  token embedding: %s; output head: %s\n", ep.own_embd ? "its own" : "the target's",
           ep.own_output ? "its own" : "the target's");
    printf("  weights: %.1f MiB; KV cache (f16): %.1f KiB per token\n", mib((double)bytes),
           kv_per_token(&hp, TDM_F16) / 1024.0);
    return CLI_EXIT_OK;
}

int cli_eagle3_check(const char *target, const char *draft, bool *is_head, char *fit, size_t cap) {
    tdm_gguf *gd = NULL, *gt = NULL;
    tdm_err err = {0};
    *is_head = false;
    if (tdm_gguf_open(draft, &gd, &err)) return CLI_EXIT_OK; /* (not for us to say) */
    if (!tdm_gguf_is_eagle3(gd)) {
        tdm_gguf_close(gd);
        return CLI_EXIT_OK;
    }
    *is_head = true;
    tdm_hparams hd, ht;
    tdm_eagle3_hparams ep;
    tandem_status st = tdm_eagle3_read_hparams(gd, &hd, &ep, &err);
    tdm_gguf_close(gd);
    if (st) return cli_error("%s: invalid EAGLE-3 head: %s", draft, err.msg);
    if ((st = tdm_gguf_open(target, &gt, &err)) || (st = tdm_hparams_read(gt, &ht, &err))) {
        tdm_gguf_close(gt);
        return cli_error("%s: %s", target, err.msg);
    }
    tdm_gguf_close(gt);
    const char *bd = strrchr(draft, '/'), *bt = strrchr(target, '/');
    if ((st = tdm_eagle3_check_target(&ep, bd ? bd + 1 : draft, &ht, bt ? bt + 1 : target, &err)))
        return cli_error("%s", err.msg);
    snprintf(fit, cap, "EAGLE-3 head %s fits target %s (the features entering layers %d, %d, %d of its %d)", draft,
             target, (int)ep.feat_layers[0], (int)ep.feat_layers[1], (int)ep.feat_layers[2], (int)ht.n_layer);
    return CLI_EXIT_OK;
}

int cli_info(int argc, char **argv) {
    const char *path = NULL, *draft = NULL;
    int ctx = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool missing = false;
        if (cli_is_help(a)) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (cli_take(argc, argv, &i, "-d", "--draft", &v, &missing)) {
            if (missing) return CLI_EXIT_USAGE;
            draft = v;
            continue;
        }
        if (cli_take(argc, argv, &i, NULL, "--ctx", &v, &missing)) {
            if (missing || !cli_parse_int(a, v, 1, CLI_CTX_MAX, &ctx)) return CLI_EXIT_USAGE;
            continue;
        }
        if (cli_take(argc, argv, &i, "-m", "--model", &v, &missing)) {
            if (missing) return CLI_EXIT_USAGE;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cli_unknown_arg(a);
        } else {
            v = a;
        }
        if (path) return cli_usage_error("info takes one model file");
        path = v;
    }
    if (!path) return cli_usage_error("missing model file (tandem info MODEL)");

    tdm_gguf *g = NULL;
    tdm_err err = {0};
    tandem_status s = tdm_gguf_open(path, &g, &err);
    if (s != TANDEM_OK) {
        const char *msg = err.msg[0] ? err.msg : tandem_status_str(s);
        if (strstr(msg, path)) return cli_error("%s", msg);
        return cli_error("%s: %s", path, msg);
    }

    printf("file: %s\n", path);
    printf("GGUF version: %u\n", g->version);
    printf("alignment: %llu\n", (unsigned long long)g->alignment);
    printf("metadata: %llu keys\n", (unsigned long long)g->n_kv);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const tdm_gguf_kv *kv = &g->kv[i];
        printf("  %s: ", kv->key);
        print_type(&kv->value);
        fputs(" = ", stdout);
        if (kv->value.type == TDM_GGUF_STRING && memchr(kv->value.v.str.ptr, '\n', kv->value.v.str.len)) {
            print_text_lines(&kv->value.v.str);
            continue;
        }
        tdm_gguf_value_print(&kv->value, stdout, INFO_MAX_ARRAY_ELEMS);
        char ft[48];
        if (strcmp(kv->key, "general.file_type") == 0 && kv->value.type == TDM_GGUF_UINT32 &&
            tdm_ggml_file_type_name((uint32_t)kv->value.v.u64, ft, sizeof ft))
            printf(" (%s)", ft);
        fputc('\n', stdout);
    }

    size_t name_w = 4;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        size_t n = strlen(g->tensors[i].name);
        if (n > name_w) name_w = n;
    }
    if (name_w > 64) name_w = 64;
    printf("tensors: %llu\n", (unsigned long long)g->n_tensors);
    printf("  %-*s  %-7s  %-24s  %s\n", (int)name_w, "name", "type", "shape", "bytes");
    uint64_t n_params = 0, n_bytes = 0, n_unsupported = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const tdm_gguf_tensor *t = &g->tensors[i];
        char shape[128], bytes[32], ty[16];
        print_shape(t, shape, sizeof shape);
        bool ok = tdm_dtype_supported(t->type) || (strcmp(t->name, "d2t") == 0 && tdm_gguf_is_eagle3(g));
        const char *name = ok ? tdm_dtype_name(t->type) : tdm_ggml_type_name(t->type);
        if (!name) {
            snprintf(ty, sizeof ty, "%u", (unsigned)t->type);
            name = ty;
        }
        if (t->nbytes || ok) snprintf(bytes, sizeof bytes, "%llu", (unsigned long long)t->nbytes);
        else snprintf(bytes, sizeof bytes, "?");
        printf("  %-*s  %-7s  %-24s  %s", (int)name_w, t->name, name, shape, bytes);
        if (!ok) {
            char desc[64];
            printf("  unsupported type %s", tdm_ggml_type_describe(t->type, desc, sizeof desc));
            n_unsupported++;
        }
        fputc('\n', stdout);
        uint64_t ne = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) ne *= (uint64_t)t->ne[d];
        n_params += ne;
        n_bytes += t->nbytes;
    }
    printf("total: %llu tensors, %llu parameters, %llu bytes (%.2f MiB)\n",
           (unsigned long long)g->n_tensors, (unsigned long long)n_params,
           (unsigned long long)n_bytes, (double)n_bytes / (1024.0 * 1024.0));
    if (n_unsupported) {
        char list[256];
        printf("note: %llu tensor%s a type tandem does not support (supported: %s): tandem tokenize "
               "works on this file, tandem generate does not\n",
               (unsigned long long)n_unsupported, n_unsupported == 1 ? " has" : "s have",
               tdm_ggml_supported_list(list, sizeof list));
    }
    const bool head = tdm_gguf_is_eagle3(g);
    if (head) {
        int rc = print_eagle3(g);
        tdm_gguf_close(g);
        return rc;
    }
    tdm_gguf_close(g);
    if (draft) { /* an EAGLE-3 head beside the target: the pair checked */
        char fit[512];
        bool is_head;
        int rc = cli_eagle3_check(path, draft, &is_head, fit, sizeof fit);
        if (rc != CLI_EXIT_OK) return rc;
        if (is_head) printf("%s; it drafts chains and token trees from the target's features\n", fit);
    }
    print_estimate(path, draft, ctx);
    return CLI_EXIT_OK;
}
