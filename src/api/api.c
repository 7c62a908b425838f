/* api.c - the public C API (include/tandem.h) over the internal objects. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api_internal.h"
#include "chat.h"
#include "engine.h"
#include "tp.h"
#include "scheduler.h"
#include "tandem.h"

static _Thread_local char g_last_error[TDM_ERR_MSG_LEN];

const char *tandem_last_error(void) { return g_last_error; }

/* TDM_VERSION_STRING: meson.build's project version (a -D of the library). */
const char *tandem_version(void) { return TDM_VERSION_STRING; }

static char g_system_info[256];
static pthread_once_t g_system_info_once = PTHREAD_ONCE_INIT;

static void system_info_init(void) {
    snprintf(g_system_info, sizeof g_system_info, "cpu: SIMD levels built: %s; this CPU: %s\n%s\n%s\n",
#if defined(__x86_64__)
             "scalar, avx2, avx512",
#else
             "scalar",
#endif
             tdm_cpu_features(),
#ifdef TDM_HAVE_CUDA
             "cuda: built (sm_90)",
#else
             "cuda: not built",
#endif
#ifdef TDM_HAVE_NCCL
             "nccl: built (--tensor-parallel across GPUs)"
#else
             "nccl: not built"
#endif
    );
}

const char *tandem_system_info(void) {
    pthread_once(&g_system_info_once, system_info_init);
    return g_system_info;
}

static tandem_status fail(const tdm_err *err, tandem_status st) {
    if (err && err->msg[0])
        snprintf(g_last_error, sizeof g_last_error, "%s", err->msg);
    else
        snprintf(g_last_error, sizeof g_last_error, "%s", tandem_status_str(st));
    return st;
}

static tandem_status fail_msg(tandem_status st, const char *msg) {
    snprintf(g_last_error, sizeof g_last_error, "%s", msg);
    return st;
}

const char *tandem_finish_reason_str(tandem_finish_reason r) {
    switch (r) {
    case TANDEM_FINISH_EOS: return "eos";
    case TANDEM_FINISH_LENGTH: return "length";
    case TANDEM_FINISH_CANCELLED: return "cancelled";
    case TANDEM_FINISH_STOP: return "stop";
    case TANDEM_FINISH_TIMEOUT: return "timeout";
    case TANDEM_FINISH_ERROR: return "error";
    default: return "none";
    }
}

void tandem_free(void *p) { free(p); }

/* ---------------------------------------------------------------- models */

struct tandem_model {
    tdm_model *m;    /* the model, or an EAGLE-3 head's shell (head->m) */
    tdm_eagle3 *head; /* an EAGLE-3 draft head (a draft only), or NULL */
    tdm_backend *be; /* holds the weights */
    tandem_backend_kind kind;
};

/* A model without a tokenizer of its own (an EAGLE-3 head): the error of the calls
 * that need one. */
static tandem_status no_tok(const tandem_model *model) {
    return model->m->tok ? TANDEM_OK
                         : fail_msg(TANDEM_ERR_INVALID_ARG, "the model is an EAGLE-3 draft head: it has no tokenizer of its own");
}

/* Whether the file is an EAGLE-3 head (architecture eagle3); false where it cannot
 * be read (the model's load then says why). */
static bool is_head_file(const char *path) {
    tdm_gguf *g;
    tdm_err err = {0};
    if (tdm_gguf_open(path, &g, &err)) return false;
    const bool head = tdm_gguf_is_eagle3(g);
    tdm_gguf_close(g);
    return head;
}

tdm_backend *tdm_api_model_backend(tandem_model *model) { return model ? model->be : NULL; }

tandem_model_params tandem_model_default_params(void) {
    tandem_model_params p = {.backend = TANDEM_BACKEND_CPU, .cuda_device = 0, .tensor_parallel = 1};
    return p;
}

/* A model split p->tensor_parallel ways (tp.h): on the CPU every rank's weights on
 * h->be (the engine computes them in turn); on CUDA rank r on device cuda_device +
 * r, the other ranks' backends owned by the model's group, NCCL between them. */
static tandem_status open_split(const char *path, const tandem_model_params *p, tandem_model *h, tdm_err *err) {
    const int n = p->tensor_parallel;
    if (n < 1 || n > TDM_TP_MAX)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "tensor_parallel %d is out of range [1, %d]", n, TDM_TP_MAX);
    tdm_backend *bes[TDM_TP_MAX] = {h->be};
    tdm_collective *coll = NULL;
    tandem_status st = TANDEM_OK;
    const bool cuda = p->backend == TANDEM_BACKEND_CUDA;
    for (int r = 1; r < n && !st; r++) {
        if (!cuda) bes[r] = h->be;
        else st = tdm_backend_cuda_create(p->cuda_device + r, &bes[r], err);
    }
    if (!st) st = cuda ? tdm_collective_nccl_create(bes, n, &coll, err) : tdm_collective_host_create(n, &coll, err);
    if (st) {
        for (int r = 1; cuda && r < n; r++) tdm_backend_destroy(bes[r]);
        (void)tdm_backend_activate(h->be, NULL);
        return st;
    }
    const tdm_load_opts pr = {p->progress_callback, p->progress_callback_user_data, 0.0f, 1.0f,
                                  p->weights == TANDEM_WEIGHTS_FP8};
    return tdm_model_load_tp(path, bes, n, cuda, coll, &pr, &h->m, err);
}

tandem_status tandem_model_open(const char *path, const tandem_model_params *params, tandem_model **out) {
    if (!out) return fail_msg(TANDEM_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    if (!path) return fail_msg(TANDEM_ERR_INVALID_ARG, "path is NULL");
    tandem_model_params p = params ? *params : tandem_model_default_params();
    tdm_err err = {0};
    tandem_model *h = calloc(1, sizeof *h);
    if (!h) return fail_msg(TANDEM_ERR_NOMEM, "out of memory");
    h->kind = p.backend;
    const tdm_load_opts pr = {p.progress_callback, p.progress_callback_user_data, 0.0f, 1.0f,
                                  p.weights == TANDEM_WEIGHTS_FP8};
    tandem_status st = TANDEM_OK;
    if (p.weights != TANDEM_WEIGHTS_NATIVE && p.weights != TANDEM_WEIGHTS_FP8)
        st = tdm_seterr(&err, TANDEM_ERR_INVALID_ARG, "weights %d is not a tandem_weights value", (int)p.weights);
    else if (pr.fn && !pr.fn(0.0f, pr.user))
        st = tdm_seterr(&err, TANDEM_ERR_CANCELLED, "the model load was cancelled by its progress callback (at 0%%)");
    else if (p.backend == TANDEM_BACKEND_CPU)
        st = tdm_backend_cpu_create(1, &h->be, &err);
    else if (p.backend == TANDEM_BACKEND_CUDA)
        st = tdm_backend_cuda_create(p.cuda_device, &h->be, &err);
    else
        st = tdm_seterr(&err, TANDEM_ERR_INVALID_ARG, "unknown backend %d", (int)p.backend);
    const bool head = !st && is_head_file(path);
    if (head && p.tensor_parallel != 1)
        st = tdm_seterr(&err, TANDEM_ERR_INVALID_ARG, "an EAGLE-3 head is a draft: it is not split (tensor_parallel %d)",
                        p.tensor_parallel);
    else if (head && !(st = tdm_eagle3_load(path, h->be, &h->head, &err))) h->m = h->head->m;
    else if (!st && p.tensor_parallel != 1) st = open_split(path, &p, h, &err);
    else if (!st && !head) st = tdm_model_load_opts(path, h->be, &pr, &h->m, &err);
    if (st) {
        tandem_model_close(h);
        return fail(&err, st);
    }
    *out = h;
    return TANDEM_OK;
}

void tandem_model_close(tandem_model *model) {
    if (!model) return;
    if (model->head) tdm_eagle3_free(model->head); /* (its shell with it) */
    else tdm_model_free(model->m);
    tdm_backend_destroy(model->be);
    free(model);
}

tandem_status tandem_model_get_info(const tandem_model *model, tandem_model_info *out) {
    if (!model || !out) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    const tdm_model *m = model->m;
    const tdm_hparams *hf = &m->hp_full;
    memset(out, 0, sizeof *out);
    out->arch = m->hp.arch;
    out->name = m->name;
    out->n_vocab = hf->n_vocab;
    out->n_ctx_train = hf->n_ctx_train;
    out->n_embd = hf->n_embd;
    out->n_layer = hf->n_layer;
    out->n_head = hf->n_head;
    out->n_head_kv = hf->n_head_kv;
    out->n_ff = hf->n_ff;
    out->bos = m->tok ? tdm_tok_bos(m->tok) : -1;
    out->eos = m->tok ? tdm_tok_eos(m->tok) : -1;
    out->n_params = m->n_params;
    out->weight_bytes = m->weight_bytes;
    out->tensor_parallel = m->tp ? m->tp->n : 1;
    for (int32_t r = 1; m->tp && r < m->tp->n; r++) {
        out->n_params += m->tp->rank[r]->n_params;
        out->weight_bytes += m->tp->rank[r]->weight_bytes;
    }
    const uint64_t norms = (uint64_t)(2 * m->hp.n_layer + 1) * (uint64_t)m->hp.n_embd * sizeof(float);
    uint64_t mats = (uint64_t)m->output.rows * m->output.row_bytes + m->tok_embd.row_bytes;
    for (int32_t l = 0; l < m->hp.n_layer; l++) {
        const tdm_layer *L = &m->layers[l];
        const tdm_weight *w[] = {&L->wqkv, &L->wq, &L->wk, &L->wv, &L->wo, &L->w13, &L->w2}; /* (unused: zero) */
        for (size_t i = 0; i < TDM_ARRAY_LEN(w); i++) mats += (uint64_t)w[i]->rows * w[i]->row_bytes;
        if (L->exp_w13) { /* the router and a token's experts (of the experts' mean size) */
            uint64_t all = 0;
            for (int32_t e = 0; e < m->hp.n_expert; e++)
                all += (uint64_t)L->exp_w13[e].rows * L->exp_w13[e].row_bytes +
                       (uint64_t)L->exp_w2[e].rows * L->exp_w2[e].row_bytes;
            mats += (uint64_t)L->router.rows * L->router.row_bytes +
                    all / (uint64_t)m->hp.n_expert * (uint64_t)m->hp.n_expert_used;
        }
    }
    out->decode_bytes = mats + norms;
    const tdm_kv_layout kl = tdm_model_kv_layout(m, m->be->kv_type);
    out->kv_bytes_per_token = tdm_kv_bytes_per_token(&kl, 16);
    return TANDEM_OK;
}

/* Shared by the model and the stand-alone tokenizer handles. */
static tandem_status encode(const tdm_tokenizer *tok, const char *text, size_t len, bool add_bos,
                            int32_t **out_ids, size_t *out_n) {
    if ((!text && len) || !out_ids || !out_n) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    tdm_err err = {0};
    tandem_status st = tdm_tokenize(tok, text ? text : "", len, add_bos, true, out_ids, out_n, &err);
    return st ? fail(&err, st) : TANDEM_OK;
}

static tandem_status decode(const tdm_tokenizer *tok, const int32_t *ids, size_t n, char **out_text) {
    if ((!ids && n) || !out_text) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    *out_text = NULL;
    size_t cap = 64 + n * 16, len = 0;
    char *buf = malloc(cap);
    int32_t pcap = tdm_tok_max_piece(tok) + 16;
    char *piece = malloc((size_t)pcap);
    if (!buf || !piece) {
        free(buf);
        free(piece);
        return fail_msg(TANDEM_ERR_NOMEM, "out of memory");
    }
    tdm_detok d;
    tdm_detok_init(&d, tok);
    for (size_t i = 0; i <= n; i++) {
        int32_t k;
        if (i < n) {
            if (ids[i] < 0 || ids[i] >= tdm_tok_n_vocab(tok)) {
                free(buf);
                free(piece);
                return fail_msg(TANDEM_ERR_INVALID_ARG, "token id out of range");
            }
            k = tdm_detok_push(&d, tok, ids[i], piece, pcap);
        } else {
            k = tdm_detok_flush(&d, piece, pcap);
        }
        if (k <= 0) continue;
        if (len + (size_t)k + 1 > cap) {
            cap = (len + (size_t)k + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                free(piece);
                return fail_msg(TANDEM_ERR_NOMEM, "out of memory");
            }
            buf = nb;
        }
        memcpy(buf + len, piece, (size_t)k);
        len += (size_t)k;
    }
    free(piece);
    buf[len] = 0;
    *out_text = buf;
    return TANDEM_OK;
}

tandem_status tandem_tokenize(const tandem_model *model, const char *text, size_t len, bool add_bos,
                              int32_t **out_ids, size_t *out_n) {
    if (!model) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL model");
    if (no_tok(model)) return TANDEM_ERR_INVALID_ARG;
    return encode(model->m->tok, text, len, add_bos, out_ids, out_n);
}

tandem_status tandem_detokenize(const tandem_model *model, const int32_t *ids, size_t n, char **out_text) {
    if (!model) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL model");
    if (no_tok(model)) return TANDEM_ERR_INVALID_ARG;
    return decode(model->m->tok, ids, n, out_text);
}

/* ------------------------------------------------------------ tokenizers */

struct tandem_tokenizer {
    tdm_gguf *gguf;
    tdm_tokenizer *tok;
};

tandem_status tandem_tokenizer_open(const char *path, tandem_tokenizer **out) {
    if (!out) return fail_msg(TANDEM_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    if (!path) return fail_msg(TANDEM_ERR_INVALID_ARG, "path is NULL");
    tandem_tokenizer *h = calloc(1, sizeof *h);
    if (!h) return fail_msg(TANDEM_ERR_NOMEM, "out of memory");
    tdm_err err = {0};
    tandem_status st = tdm_gguf_open(path, &h->gguf, &err);
    if (!st) st = tdm_tokenizer_load(h->gguf, &h->tok, &err);
    if (st) {
        tandem_tokenizer_close(h);
        return fail(&err, st);
    }
    *out = h;
    return TANDEM_OK;
}

void tandem_tokenizer_close(tandem_tokenizer *t) {
    if (!t) return;
    tdm_tokenizer_free(t->tok);
    tdm_gguf_close(t->gguf);
    free(t);
}

tandem_status tandem_tokenizer_encode(const tandem_tokenizer *t, const char *text, size_t len, bool add_bos,
                                      int32_t **out_ids, size_t *out_n) {
    if (!t) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL tokenizer");
    return encode(t->tok, text, len, add_bos, out_ids, out_n);
}

tandem_status tandem_tokenizer_decode(const tandem_tokenizer *t, const int32_t *ids, size_t n, char **out_text) {
    if (!t) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL tokenizer");
    return decode(t->tok, ids, n, out_text);
}

/* ------------------------------------------------------------------ chat */

const char *tandem_chat_builtin_templates(void) { return tdm_chat_builtin_names; }

/* messages + tools (both may be NULL) through the template of g / tok. */
static tandem_status chat_render(const tdm_gguf *g, const tdm_tokenizer *tok, const char *tmpl,
                                 const tdm_json *messages, const tdm_json *tools, bool agp, char **out_text) {
    tdm_err err = {0};
    tandem_status st = tdm_chat_render_for(g, tok, tmpl, messages, tools, agp, true, out_text, &err);
    return st ? fail(&err, st) : TANDEM_OK;
}

static tandem_status chat_render_msgs(const tdm_gguf *g, const tdm_tokenizer *tok, const char *tmpl,
                                      const tandem_chat_message *msgs, size_t n, bool agp, char **out_text) {
    if (!out_text) return fail_msg(TANDEM_ERR_INVALID_ARG, "out_text is NULL");
    *out_text = NULL;
    tdm_err err = {0};
    tdm_json *m = NULL;
    tandem_status st = tdm_chat_messages_json(msgs, n, &m, &err);
    if (st) return fail(&err, st);
    st = chat_render(g, tok, tmpl, m, NULL, agp, out_text);
    tdm_json_free(m);
    return st;
}

tandem_status tandem_chat_render(const tandem_model *model, const char *tmpl, const tandem_chat_message *msgs,
                                 size_t n, bool agp, char **out_text) {
    if (!model) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL model");
    if (no_tok(model)) return TANDEM_ERR_INVALID_ARG;
    return chat_render_msgs(model->m->gguf, model->m->tok, tmpl, msgs, n, agp, out_text);
}

tandem_status tandem_tokenizer_chat_render(const tandem_tokenizer *t, const char *tmpl, const tandem_chat_message *msgs,
                                           size_t n, bool agp, char **out_text) {
    if (!t) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL tokenizer");
    return chat_render_msgs(t->gguf, t->tok, tmpl, msgs, n, agp, out_text);
}

tandem_status tandem_chat_render_json(const tandem_model *model, const char *tmpl, const char *json, size_t len,
                                      bool agp, char **out_text) {
    if (!out_text) return fail_msg(TANDEM_ERR_INVALID_ARG, "out_text is NULL");
    *out_text = NULL;
    if (!model || (!json && len)) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    if (no_tok(model)) return TANDEM_ERR_INVALID_ARG;
    tdm_err err = {0};
    tdm_json *j = NULL;
    tandem_status st = tdm_json_parse(json ? json : "", len, &j, &err);
    if (st) return fail(&err, TANDEM_ERR_INVALID_ARG);
    const tdm_json *messages = j, *tools = NULL;
    if (j->type == TDM_JSON_OBJECT) {
        messages = tdm_json_get(j, "messages");
        tools = tdm_json_get(j, "tools");
        if (!messages) st = fail_msg(TANDEM_ERR_INVALID_ARG, "the JSON object has no \"messages\"");
    }
    if (!st) st = chat_render(model->m->gguf, model->m->tok, tmpl, messages, tools, agp, out_text);
    tdm_json_free(j);
    return st;
}

size_t tandem_model_eog_tokens(const tandem_model *model, int32_t *out, size_t cap) {
    if (!model || !model->m->tok) return 0;
    const int32_t *ids;
    size_t n = (size_t)tdm_tok_eog_ids(model->m->tok, &ids);
    for (size_t i = 0; out && i < n && i < cap; i++) out[i] = ids[i];
    return n;
}

/* --------------------------------------------------------------- engines */

struct tandem_engine {
    tdm_engine *e;
    tdm_sched *sched; /* every request goes through it */
    tandem_model *target, *draft;
};

tandem_engine_params tandem_engine_default_params(void) {
    tandem_engine_params p = {.n_threads = 0, .kv_bytes = 0, .n_ctx = 0, .n_seq_max = 1, .kv_block_size = 16,
                              .gpu_mem = 0, .max_batch_tokens = 0, .prefix_cache = true,
                              .batch_invariant = false, .kv_type = TANDEM_KV_AUTO,
                              .draft_vocab = TANDEM_DRAFT_VOCAB_AUTO};
    return p;
}

tandem_status tandem_engine_open(tandem_model *target, tandem_model *draft, const tandem_engine_params *params,
                                 tandem_engine **out) {
    return tdm_api_engine_open(target, draft, params, NULL, out);
}

tandem_status tdm_api_engine_open(tandem_model *target, tandem_model *draft, const tandem_engine_params *params,
                                  const tdm_api_paths *paths, tandem_engine **out) {
    if (!out) return fail_msg(TANDEM_ERR_INVALID_ARG, "out is NULL");
    *out = NULL;
    if (!target) return fail_msg(TANDEM_ERR_INVALID_ARG, "target model is NULL");
    tandem_engine_params p = params ? *params : tandem_engine_default_params();
    if (p.n_threads < 0 || p.n_threads > TANDEM_THREADS_MAX) {
        snprintf(g_last_error, sizeof g_last_error, "n_threads %d is out of range [0, %d]", p.n_threads,
                 TANDEM_THREADS_MAX);
        return TANDEM_ERR_INVALID_ARG;
    }
    if (p.n_ctx < 0) {
        snprintf(g_last_error, sizeof g_last_error, "n_ctx %d is negative (0 = the default context)", p.n_ctx);
        return TANDEM_ERR_INVALID_ARG;
    }
    if (p.n_seq_max < 0 || p.kv_block_size < 0 || p.kv_block_size > 4096)
        return fail_msg(TANDEM_ERR_INVALID_ARG, "bad engine parameters");
    if (p.max_batch_tokens < 0 || p.max_batch_tokens > 65536) {
        snprintf(g_last_error, sizeof g_last_error, "max_batch_tokens %d is out of range [0, 65536]",
                 p.max_batch_tokens);
        return TANDEM_ERR_INVALID_ARG;
    }
    if ((int)p.kv_type < TANDEM_KV_AUTO || (int)p.kv_type > TANDEM_KV_FP8) {
        snprintf(g_last_error, sizeof g_last_error, "kv_type %d is not a tandem_kv_type (0 auto .. 4 fp8)",
                 (int)p.kv_type);
        return TANDEM_ERR_INVALID_ARG;
    }
    if (draft && draft->kind != target->kind)
        return fail_msg(TANDEM_ERR_MISMATCH, "target and draft are on different backends");
    if (target->head) return fail_msg(TANDEM_ERR_INVALID_ARG, "the target is an EAGLE-3 draft head");
    tdm_engine_cfg cfg = {
        .n_threads = p.n_threads, .n_ctx = p.n_ctx, .n_seq_max = p.n_seq_max,
        .block_size = p.kv_block_size, .kv_bytes = p.kv_bytes, .prefill_chunk = 0, .gpu_mem = p.gpu_mem,
        .max_batch_tokens = p.max_batch_tokens, .prefix_cache = p.prefix_cache,
        .batch_invariant = p.batch_invariant, .kv_type = (int32_t)p.kv_type,
        .host_sampling = paths && paths->host_sampling, .draft_vocab = p.draft_vocab,
    };
    tandem_engine *h = calloc(1, sizeof *h);
    if (!h) return fail_msg(TANDEM_ERR_NOMEM, "out of memory");
    tdm_err err = {0};
    tandem_status st = draft && draft->head ? tdm_engine_create_ex(target->m, NULL, draft->head, &cfg, &h->e, &err)
                                            : tdm_engine_create(target->m, draft ? draft->m : NULL, &cfg, &h->e, &err);
    if (!st && (st = tdm_sched_create(h->e, paths ? &paths->ws : NULL, &h->sched, &err))) tdm_engine_free(h->e);
    if (st) {
        free(h);
        return fail(&err, st);
    }
    h->target = target;
    h->draft = draft;
    *out = h;
    return TANDEM_OK;
}

void tandem_engine_close(tandem_engine *engine) {
    if (!engine) return;
    tdm_sched_free(engine->sched); /* (stops its thread; what is left ends cancelled) */
    tdm_engine_free(engine->e);
    free(engine);
}

int tandem_engine_n_ctx(const tandem_engine *engine) { return engine && engine->e ? engine->e->cfg.n_ctx : 0; }

uint64_t tandem_engine_device_peak_bytes(const tandem_engine *engine) {
    if (!engine || !engine->e || !engine->e->be->ops->mem_peak) return 0;
    return (uint64_t)engine->e->be->ops->mem_peak(engine->e->be);
}

uint64_t tandem_engine_device_peak_bytes_rank(const tandem_engine *engine, int rank) {
    if (rank == 0) return tandem_engine_device_peak_bytes(engine);
    if (!engine || !engine->e) return 0;
    const tdm_tp_group *g = engine->e->target->tp;
    if (!g || rank < 0 || rank >= g->n || g->be[rank]->host_memory || !g->be[rank]->ops->mem_peak) return 0;
    return (uint64_t)g->be[rank]->ops->mem_peak(g->be[rank]);
}

/* A request's prompt as token ids (malloc'ed into *ids, *n of them): the text
 * tokenized (BOS as the model asks), or a copy of the ids. */
static tandem_status request_ids(const tandem_engine *engine, const tandem_request *r, int32_t **ids, int32_t *n) {
    *ids = NULL;
    size_t len = 0;
    tandem_status st;
    if (r->prompt) {
        if ((st = tandem_tokenize(engine->target, r->prompt, strlen(r->prompt), true, ids, &len))) return st;
    } else {
        if (!r->prompt_ids && r->n_prompt_ids) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL prompt_ids with n_prompt_ids > 0");
        if (r->n_prompt_ids > INT32_MAX) return fail_msg(TANDEM_ERR_INVALID_ARG, "prompt too long");
        len = r->n_prompt_ids;
        *ids = malloc(TDM_MAX(len, 1) * sizeof(int32_t));
        if (!*ids) return fail_msg(TANDEM_ERR_NOMEM, "out of memory");
        if (len) memcpy(*ids, r->prompt_ids, len * sizeof(int32_t));
    }
    if (len > INT32_MAX) {
        free(*ids);
        *ids = NULL;
        return fail_msg(TANDEM_ERR_INVALID_ARG, "prompt too long");
    }
    *n = (int32_t)len;
    return TANDEM_OK;
}

tandem_status tandem_generate_ids(tandem_engine *engine, const int32_t *prompt, size_t n_prompt,
                                  const tandem_generate_params *params, tandem_result *out) {
    if (!engine || !out || (!prompt && n_prompt)) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    memset(out, 0, sizeof *out);
    tandem_request r = tandem_request_default();
    if (params) r.params = *params;
    r.prompt_ids = prompt;
    r.n_prompt_ids = n_prompt;
    tandem_status st = tandem_generate_batch(engine, &r, 1, out);
    if (!st && out->status) { /* its own error is the call's */
        st = fail_msg(out->status, out->error ? out->error : tandem_status_str(out->status));
        tandem_result_free(out);
    }
    return st;
}

tandem_status tandem_generate(tandem_engine *engine, const char *prompt, const tandem_generate_params *params,
                              tandem_result *out) {
    if (!engine || !prompt || !out) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    memset(out, 0, sizeof *out);
    tandem_request r = tandem_request_default();
    if (params) r.params = *params;
    r.prompt = prompt;
    tandem_status st = tandem_generate_batch(engine, &r, 1, out);
    if (!st && out->status) {
        st = fail_msg(out->status, out->error ? out->error : tandem_status_str(out->status));
        tandem_result_free(out);
    }
    return st;
}

tandem_status tandem_generate_batch(tandem_engine *engine, const tandem_request *reqs, size_t n,
                                    tandem_result *results) {
    if (!engine || (n && (!reqs || !results))) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    if (n > INT32_MAX) return fail_msg(TANDEM_ERR_INVALID_ARG, "more than INT32_MAX requests");
    if (n == 0) return TANDEM_OK;
    int32_t **ids = calloc(n, sizeof *ids), *lens = calloc(n, sizeof *lens);
    tandem_generate_params *ps = calloc(n, sizeof *ps);
    int *prio = calloc(n, sizeof *prio);
    double *tmo = calloc(n, sizeof *tmo);
    tandem_status st = TANDEM_OK;
    if (!ids || !lens || !ps || !prio || !tmo) {
        st = fail_msg(TANDEM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        memset(&results[i], 0, sizeof results[i]);
        ps[i] = reqs[i].params;
        prio[i] = reqs[i].priority;
        tmo[i] = reqs[i].timeout_ms;
        tandem_status rs = request_ids(engine, &reqs[i], &ids[i], &lens[i]);
        if (rs) { /* fails alone */
            results[i].status = rs;
            results[i].error = strdup(tandem_last_error());
            results[i].finish_reason = TANDEM_FINISH_ERROR;
            lens[i] = -1;
        }
    }
    tdm_err err = {0};
    st = tdm_sched_run(engine->sched, (const int32_t *const *)ids, lens, ps, prio, tmo, (int32_t)n, results, &err);
    if (st) fail(&err, st);
done:
    for (size_t i = 0; ids && i < n; i++) free(ids[i]);
    free(ids), free(lens), free(ps), free(prio), free(tmo);
    return st;
}

tandem_status tandem_engine_submit(tandem_engine *engine, const tandem_request *request, tandem_finish_cb on_finish,
                                   void *user_data, tandem_request_id *out_id) {
    if (out_id) *out_id = 0;
    if (!engine || !request) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    int32_t *ids, n;
    tandem_status st = request_ids(engine, request, &ids, &n);
    if (st) return st;
    tdm_err err = {0};
    uint64_t id = 0;
    st = tdm_sched_submit(engine->sched, ids, n, &request->params, request->priority, request->timeout_ms, on_finish,
                          user_data, &id, &err);
    free(ids);
    if (st) return fail(&err, st);
    if (out_id) *out_id = id;
    return TANDEM_OK;
}

tandem_status tandem_engine_cancel(tandem_engine *engine, tandem_request_id id) {
    if (!engine) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL engine");
    tdm_err err = {0};
    tandem_status st = tdm_sched_cancel(engine->sched, id, &err);
    return st ? fail(&err, st) : TANDEM_OK;
}

tandem_status tandem_engine_step(tandem_engine *engine, int *n_pending) {
    if (!engine) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL engine");
    if (tdm_sched_running(engine->sched))
        return fail_msg(TANDEM_ERR_INVALID_ARG, "tandem_engine_step: the engine's own thread is running");
    tdm_err err = {0};
    tandem_status st = tdm_sched_step(engine->sched, n_pending, &err);
    return st ? fail(&err, st) : TANDEM_OK;
}

tandem_status tandem_engine_start(tandem_engine *engine) {
    if (!engine) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL engine");
    tdm_err err = {0};
    tandem_status st = tdm_sched_start(engine->sched, &err);
    return st ? fail(&err, st) : TANDEM_OK;
}

tandem_status tandem_engine_stop(tandem_engine *engine) {
    if (!engine) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL engine");
    tdm_err err = {0};
    tandem_status st = tdm_sched_stop(engine->sched, &err);
    return st ? fail(&err, st) : TANDEM_OK;
}

tandem_status tandem_engine_get_stats(tandem_engine *engine, tandem_engine_stats *out) {
    if (!engine || !out) return fail_msg(TANDEM_ERR_INVALID_ARG, "NULL argument");
    tdm_sched_stats(engine->sched, out);
    return TANDEM_OK;
}

tandem_request tandem_request_default(void) {
    tandem_request r;
    memset(&r, 0, sizeof r);
    r.params = tandem_generate_default_params();
    return r;
}

