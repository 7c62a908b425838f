/* engine.c - engine set-up, forwards (feeding tokens through the target or the
 * draft, their outputs checked), a sequence's set-up and result. */
#include "engine.h"

#include <float.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "constrain.h"
#include "kv_cache.h"
#include "penalty.h"
#include "threadpool.h"

static void copy_block_cb(void *user, int32_t src, int32_t dst) {
    tdm_engine *e = user;
    tandem_status st = tdm_kv_store_copy_block(&e->kv_t, src, dst, &e->copy_err);
    if (!st && e->draft) st = tdm_kv_store_copy_block(&e->kv_d, src, dst, &e->copy_err);
    if (st && !e->copy_status) e->copy_status = st;
}

static tandem_status check_pair(const tdm_model *t, const tdm_model *d, tdm_err *err) {
    if (t->hp.n_vocab != d->hp.n_vocab)
        return tdm_seterr(err, TANDEM_ERR_MISMATCH, "target vocab size %d != draft vocab size %d",
                          (int)t->hp.n_vocab, (int)d->hp.n_vocab);
    int32_t nt = tdm_tok_n_vocab(t->tok), nd = tdm_tok_n_vocab(d->tok);
    if (nt != nd)
        return tdm_seterr(err, TANDEM_ERR_MISMATCH, "target tokenizer has %d tokens, draft has %d", (int)nt,
                          (int)nd);
    if (tdm_tok_bos(t->tok) != tdm_tok_bos(d->tok) || tdm_tok_eos(t->tok) != tdm_tok_eos(d->tok))
        return tdm_seterr(err, TANDEM_ERR_MISMATCH, "BOS/EOS differ: target %d/%d, draft %d/%d",
                          (int)tdm_tok_bos(t->tok), (int)tdm_tok_eos(t->tok), (int)tdm_tok_bos(d->tok),
                          (int)tdm_tok_eos(d->tok));
    for (int32_t i = 0; i < nt; i++) {
        size_t la, lb;
        const char *a = tdm_tok_text(t->tok, i, &la), *b = tdm_tok_text(d->tok, i, &lb);
        if (la != lb || memcmp(a, b, la) != 0)
            return tdm_seterr(err, TANDEM_ERR_MISMATCH, "vocabularies differ at token %d ('%.*s' vs '%.*s')",
                              (int)i, (int)TDM_MIN(la, 40), a, (int)TDM_MIN(lb, 40), b);
    }
    return TANDEM_OK;
}

int64_t tdm_kv_budget_blocks(size_t budget, uint64_t weights, uint64_t work, size_t kv_bytes, size_t block_bytes,
                             tdm_err *err) {
    const double mib = 1024.0 * 1024.0;
    if (block_bytes == 0) {
        tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "KV block size overflows");
        return 0;
    }
    const uint64_t used = weights + work;
    const uint64_t left = budget > used ? (uint64_t)budget - used : 0;
    if (left < block_bytes) {
        tdm_seterr(err, TANDEM_ERR_NOMEM,
                   "gpu_mem of %.1f MiB leaves %.1f MiB for the KV cache after %.1f MiB of weights and %.1f MiB of "
                   "working buffers; one KV block takes %.3f MiB",
                   budget / mib, left / mib, weights / mib, work / mib, block_bytes / mib);
        return 0;
    }
    if (kv_bytes > 0 && kv_bytes > left) {
        tdm_seterr(err, TANDEM_ERR_NOMEM,
                   "kv_bytes of %.1f MiB does not fit in the %.1f MiB gpu_mem of %.1f MiB leaves after %.1f MiB of "
                   "weights and %.1f MiB of working buffers",
                   kv_bytes / mib, left / mib, budget / mib, weights / mib, work / mib);
        return 0;
    }
    return (int64_t)((kv_bytes > 0 ? kv_bytes : left) / block_bytes);
}

uint64_t tdm_engine_fwd_scratch_bytes(const tdm_hparams *hp, int32_t rows) {
    const uint64_t qd = (uint64_t)hp->n_head * (uint64_t)hp->head_dim, kvd = (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim;
    const uint64_t width = TDM_MAX((uint64_t)hp->n_embd, qd);
    /* (forward_moe.c; and the routing and the grouped products' slots of each row's
     * experts where a GPU runs them, cuda_moe.cu) */
    const uint64_t ku = (uint64_t)hp->n_expert_used;
    const uint64_t moe = hp->n_expert ? (uint64_t)hp->n_expert + 3 * (uint64_t)hp->n_embd +
                                            ku * (2 + (uint64_t)hp->n_ff + (uint64_t)hp->n_embd) : 0;
    const uint64_t per_row = 2 * width + qd + 2 * kvd + qd + 3 * (uint64_t)hp->n_ff + moe;
    return per_row * (uint64_t)rows * sizeof(float);
}

/* forward.c's scratch for `rows` rows, and as much again for the backend's own
 * forward buffers (the CUDA backend's fused forward keeps its activations apart). */
static uint64_t fwd_bytes(const tdm_model *m, int32_t rows) { return 2 * tdm_engine_fwd_scratch_bytes(&m->hp, rows); }

int32_t tdm_engine_logit_rows(int32_t n_seq_max) {
    if (n_seq_max <= 1) return TDM_ENGINE_TREE_ROWS;
    const int64_t rows = (int64_t)n_seq_max * TDM_ENGINE_BATCH_ROWS_PER_SEQ;
    return (int32_t)TDM_MAX(TDM_ENGINE_TREE_ROWS, TDM_MIN(rows, TDM_ENGINE_BATCH_LOGITS_MAX));
}

uint64_t tdm_engine_work_bytes(const tdm_model *target, const tdm_model *draft, int32_t prefill_chunk,
                               int32_t n_logit_rows) {
    const uint64_t logits = (uint64_t)n_logit_rows * (uint64_t)target->hp.n_vocab * sizeof(float);
    uint64_t b = fwd_bytes(target, prefill_chunk) + logits + (64ull << 20);
    if (draft) b += fwd_bytes(draft, prefill_chunk) + logits;
    return b;
}

bool tdm_engine_kv_dtype(const tdm_backend *be, int32_t kv_type, uint32_t *out) {
    switch (kv_type) {
    case TANDEM_KV_AUTO: *out = be->kv_type; return true; /* f16 on the CPU and the GPU */
    case TANDEM_KV_F32: *out = TDM_F32; return true;
    case TANDEM_KV_F16: *out = TDM_F16; return true;
    case TANDEM_KV_Q8_0: *out = TDM_Q8_0; return true;
    case TANDEM_KV_FP8: *out = TDM_F8_E4M3; return true;
    default: return false;
    }
}

int32_t tdm_draft_vocab_rows(int32_t draft_vocab, int32_t n_vocab) {
    if (draft_vocab == TANDEM_DRAFT_VOCAB_AUTO)
        return n_vocab > TANDEM_DRAFT_VOCAB_AUTO_ABOVE ? TANDEM_DRAFT_VOCAB_AUTO_N : 0;
    if (draft_vocab == 0 || (draft_vocab >= TANDEM_DRAFT_VOCAB_MIN && draft_vocab <= n_vocab)) return draft_vocab;
    return -2;
}

tandem_status tdm_engine_set_draft_vocab(tdm_engine *e, const int32_t *ids, int32_t n, tdm_err *err) {
    if (!e->draft) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "the engine has no draft model");
    if (e->head) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "the engine's draft is an EAGLE-3 head (its vocabulary is its d2t)");
    e->fs_d.vhead = NULL;
    tdm_vocab_head_free(&e->vhead);
    if (n == 0) return TANDEM_OK;
    tandem_status st = tdm_vocab_head_init(&e->vhead, e->draft, ids, n, err);
    if (!st) e->fs_d.vhead = &e->vhead;
    return st;
}

/* The draft's head over the first n token ids and the target's special tokens
 * (cfg.draft_vocab), unless that is every token. */
static tandem_status draft_head(tdm_engine *e, int32_t n, tdm_err *err) {
    int32_t *ids, n_ids;
    tandem_status st = tdm_vocab_subset_ids(e->target->tok, e->n_vocab, n, &ids, &n_ids, err);
    if (st) return st;
    if (n_ids < e->n_vocab) st = tdm_engine_set_draft_vocab(e, ids, n_ids, err);
    free(ids);
    return st;
}

tandem_status tdm_engine_create(tdm_model *target, tdm_model *draft, const tdm_engine_cfg *cfg,
                                tdm_engine **out, tdm_err *err) {
    return tdm_engine_create_ex(target, draft, NULL, cfg, out, err);
}

tandem_status tdm_engine_create_ex(tdm_model *target, tdm_model *draft, tdm_eagle3 *head, const tdm_engine_cfg *cfg,
                                   tdm_engine **out, tdm_err *err) {
    *out = NULL;
    tandem_status st;
    if (head) { /* the head's shell stands for the draft (its KV layout, "has a draft") */
        if (draft) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "a draft model and an EAGLE-3 head at once");
        if ((st = tdm_eagle3_pair(head, target, err))) return st;
        draft = head->m;
    }
    if (draft && draft->tp_size > 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "the draft model is split (tensor parallel %d): only a target can be; open the draft whole",
                          (int)draft->tp_size);
    if (target->tp_size > 0 && !target->tp)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "the target is rank %d of a split model, not its rank 0",
                          (int)target->tp_rank);
    if (draft && !head && (st = check_pair(target, draft, err))) return st;
    const int32_t n_sub = tdm_draft_vocab_rows(cfg->draft_vocab, target->hp.n_vocab);
    if (n_sub < 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          "draft_vocab %d is out of range: %d (auto), 0 (the whole vocabulary) or a number of tokens "
                          "in [%d, %d] (the vocabulary's size)",
                          (int)cfg->draft_vocab, TANDEM_DRAFT_VOCAB_AUTO, TANDEM_DRAFT_VOCAB_MIN, (int)target->hp.n_vocab);
    tdm_engine *e = calloc(1, sizeof *e);
    if (!e) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    e->target = target;
    e->draft = draft;
    e->head = head;
    e->cfg = *cfg;
    if (e->cfg.n_ctx <= 0) e->cfg.n_ctx = TDM_MIN(TANDEM_CTX_DEFAULT, target->hp.n_ctx_train);
    if (e->cfg.n_seq_max <= 0) e->cfg.n_seq_max = 1;
    if (e->cfg.block_size <= 0) e->cfg.block_size = 16;
    /* rows per prefill forward: 256 on the CPU; 512 on a GPU, where a larger product
     * keeps the tensor cores busier */
    if (e->cfg.prefill_chunk <= 0)
        e->cfg.prefill_chunk = target->be && !target->be->host_memory ? TDM_ENGINE_CHUNK_GPU : TDM_ENGINE_CHUNK_CPU;
    if (e->cfg.max_batch_tokens <= 0) e->cfg.max_batch_tokens = e->cfg.prefill_chunk;
    e->n_vocab = target->hp.n_vocab;
    e->n_logit_rows = tdm_engine_logit_rows(e->cfg.n_seq_max);
    e->max_rows = TDM_MAX(TDM_MAX(e->cfg.prefill_chunk, e->cfg.max_batch_tokens),
                          TDM_MAX(TANDEM_SPEC_K_MAX + 2, e->n_logit_rows));

    if (target->be && !target->be->host_memory) { /* a GPU: compute where the weights are */
        if (draft && draft->be && draft->be->ops != target->be->ops) {
            st = tdm_seterr(err, TANDEM_ERR_MISMATCH, "target (%s) and draft (%s) are on different backends",
                            target->be->ops->name, draft->be->ops->name);
            goto fail;
        }
        e->be = target->be;
        e->be_borrowed = true;
    } else if (draft && draft->be && !draft->be->host_memory) {
        st = tdm_seterr(err, TANDEM_ERR_MISMATCH, "the draft is on %s, the target on the CPU", draft->be->ops->name);
        goto fail;
    } else if ((st = tdm_backend_cpu_create(e->cfg.n_threads, &e->be, err))) {
        goto fail;
    }

    if ((st = tdm_model_check_backend(target, e->be, err)) || (draft && (st = tdm_model_check_backend(draft, e->be, err))))
        goto fail;

    /* KV pool: one block table per sequence, bytes per block counted for both models */
    uint32_t kv_type;
    if (!tdm_engine_kv_dtype(e->be, e->cfg.kv_type, &kv_type)) {
        st = tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "kv_type %d is not a tandem_kv_type", (int)e->cfg.kv_type);
        goto fail;
    }
    tdm_kv_layout lay[2] = {tdm_model_kv_layout(target, kv_type)};
    int nm = 1;
    if (draft) lay[nm++] = tdm_model_kv_layout(draft, kv_type);
    int32_t bs = e->cfg.block_size;
    size_t bpb = tdm_kv_bytes_per_block(lay, nm, bs);
    if (bpb == 0) {
        st = tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "KV block size overflows");
        goto fail;
    }
    int64_t n_blocks;
    if (e->cfg.gpu_mem > 0 && !e->be->host_memory) {
        const uint64_t weights = target->weight_bytes + (draft ? draft->weight_bytes : 0);
        uint64_t work = tdm_engine_work_bytes(target, draft, e->max_rows, e->n_logit_rows);
        if (draft && !head && n_sub > 0) /* the draft's head over part of the vocabulary (draft_head; its
                                   special tokens counted as 1024 more rows at most) and its logits */
            work += (uint64_t)(n_sub + 1024) * (draft->output.row_bytes + (uint64_t)e->n_logit_rows * sizeof(float) + 4);
        if (head) { /* a head's rows (head.c: features, g, two h), the target's exported features
                       and every sequence's pending ones */
            const uint64_t F = 3 * (uint64_t)head->ep.target_hidden, E = (uint64_t)head->ep.n_embd;
            work += ((uint64_t)(e->max_rows + TDM_HEAD_PENDING) * (F + 3 * E) + (uint64_t)e->max_rows * F +
                     (uint64_t)e->cfg.n_seq_max * TDM_HEAD_PENDING * F) * sizeof(float);
        }
        n_blocks = tdm_kv_budget_blocks(e->cfg.gpu_mem, weights, work, e->cfg.kv_bytes, bpb, err);
        if (n_blocks == 0) {
            st = err ? err->status : TANDEM_ERR_NOMEM;
            goto fail;
        }
        if (n_blocks > INT32_MAX / 2) n_blocks = INT32_MAX / 2;
    } else if (e->cfg.kv_bytes > 0) {
        n_blocks = (int64_t)(e->cfg.kv_bytes / bpb);
    } else {
        int64_t per_seq = ((int64_t)e->cfg.n_ctx + TDM_MAX(TANDEM_SPEC_K_MAX, TANDEM_SPEC_TREE_MAX) + 2 + bs - 1) / bs;
        n_blocks = per_seq * e->cfg.n_seq_max;
    }
    if (n_blocks < 1 || n_blocks > INT32_MAX / 2) {
        st = tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "KV budget of %zu bytes gives %lld blocks of %zu bytes",
                        e->cfg.kv_bytes, (long long)n_blocks, bpb);
        goto fail;
    }
    if (e->be->host_memory) {
        /* the CPU's cache takes memory as it is used (cpu_backend.c), so the system
         * would accept any budget and stop the process only when the tokens held
         * outgrow the machine: a budget beyond its memory is refused here */
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        const double gib = 1024.0 * 1024.0 * 1024.0, want = (double)n_blocks * (double)bpb;
        const double have = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
        if (have > 0 && want > have) {
            st = tdm_seterr(err, TANDEM_ERR_NOMEM,
                            "a KV cache of %.1f GiB (%s) is more than this machine's %.1f GiB of memory: a "
                            "smaller --kv-mem / kv_bytes, --ctx / n_ctx or number of sequences at once",
                            want / gib,
                            e->cfg.kv_bytes > 0 ? "kv_bytes" : "n_ctx tokens for each of n_seq_max sequences",
                            have / gib);
            goto fail;
        }
    }
    if ((st = tdm_kv_pool_create((int32_t)n_blocks, bs, &e->pool, err))) goto fail;
    tdm_kv_pool_set_copy(e->pool, copy_block_cb, e);
    if (e->cfg.prefix_cache) (void)tdm_kv_pool_set_prefix_cache(e->pool, true); /* (off when it cannot allocate) */
    if ((st = tdm_kv_store_init(&e->kv_t, target, e->be, kv_type, (int32_t)n_blocks, bs, err))) goto fail;
    if (draft && (st = tdm_kv_store_init(&e->kv_d, draft, e->be, kv_type, (int32_t)n_blocks, bs, err)))
        goto fail;
    if ((st = tdm_batch_init(&e->batch, e->max_rows, err))) goto fail;

    e->mask_words = ((size_t)e->n_vocab + 31) / 32;
    if (pthread_mutex_init(&e->gv_mu, NULL) != 0) {
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "cannot create a mutex");
        goto fail;
    }
    e->gv_mu_ok = true;
    /* logits rows: a feed asks for its last row only, a verification for k + 1 rows */
    size_t lbytes = (size_t)e->n_logit_rows * (size_t)e->n_vocab * sizeof(float);
    e->ids = tdm_calloc((size_t)e->n_logit_rows, sizeof(int32_t));
    if (!e->ids) {
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    void *p;
    if ((st = e->be->ops->alloc(e->be, lbytes, &p, err))) goto fail;
    e->out_t = p;
    if (draft) {
        if ((st = e->be->ops->alloc(e->be, lbytes, &p, err))) goto fail;
        e->out_d = p;
    }
    if (e->be->host_memory) {
        e->logits_t = e->out_t;
        e->logits_d = e->out_d;
    } else {
        e->logits_t = tdm_malloc(lbytes);
        e->logits_d = draft ? tdm_malloc(lbytes) : NULL;
        if (!e->logits_t || (draft && !e->logits_d)) {
            st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
            goto fail;
        }
    }
    /* sampling on the device (cfg.host_sampling: on host copies of the logits) */
    const tdm_backend_ops *bo = e->be->ops;
    if (!e->be->host_memory && bo->probs_dev && bo->sample_dev && bo->accept_dev && !e->cfg.host_sampling) {
        if ((st = bo->alloc(e->be, lbytes, &p, err))) goto fail;
        e->p_dev = p;
        if ((st = bo->alloc(e->be, TDM_ENGINE_SAMP_WORDS * sizeof(int32_t), &p, err))) goto fail;
        e->samp_dev = p;
        if ((st = bo->alloc(e->be, 2 * (size_t)e->n_logit_rows * sizeof(int32_t), &p, err))) goto fail;
        e->draw_dev = p;
        if (bo->row_top) {
            if ((st = bo->alloc(e->be, (size_t)e->n_logit_rows * sizeof(tdm_row_top), &p, err))) goto fail;
            e->lp_dev = p;
        }
        if (bo->mask_rows) { /* (about 19 KB a row for a vocabulary of 150 K) */
            if ((st = bo->alloc(e->be, (size_t)e->n_logit_rows * e->mask_words * sizeof(uint32_t), &p, err))) goto fail;
            e->mask_dev = p;
        }
    }
    e->tmp = tdm_calloc((size_t)e->n_vocab, sizeof(float));
    if (!e->tmp) {
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = tdm_sampler_scratch_init(&e->ss, e->n_vocab, err))) goto fail;
    e->piece_cap = tdm_tok_max_piece(target->tok) + 16;
    e->piece = malloc((size_t)e->piece_cap);
    if (!e->piece) {
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (draft && !head && n_sub > 0 && (st = draft_head(e, n_sub, err))) goto fail;
    if (head && (st = tdm_engine_head_init(e, err))) goto fail;
    tdm_phase_init(&e->ph);
    *out = e;
    return TANDEM_OK;
fail:
    tdm_engine_free(e);
    return st;
}

void tdm_engine_free(tdm_engine *e) {
    if (!e) return;
    tdm_phase_report(&e->ph);
    if (e->be) {
        tdm_fwd_scratch_free(&e->fs_t);
        tdm_fwd_scratch_free(&e->fs_d);
        tdm_vocab_head_free(&e->vhead);
        if (e->head) tdm_engine_head_free(e);
        if (e->out_t) e->be->ops->free(e->be, e->out_t);
        if (e->out_d) e->be->ops->free(e->be, e->out_d);
        void *dev[] = {e->p_dev, e->samp_dev, e->draw_dev, e->mask_dev, e->edit_dev, e->lp_dev};
        for (size_t i = 0; i < TDM_ARRAY_LEN(dev); i++)
            if (dev[i]) e->be->ops->free(e->be, dev[i]);
        if (!e->be->host_memory) {
            free(e->logits_t);
            free(e->logits_d);
        }
        tdm_kv_store_free(&e->kv_t);
        tdm_kv_store_free(&e->kv_d);
    }
    free(e->edit_host);
    tdm_kv_pool_free(e->pool);
    tdm_batch_free(&e->batch);
    free(e->ids);
    free(e->tmp);
    free(e->piece);
    tdm_sampler_scratch_free(&e->ss);
    tdm_constraint_reg_free(e->con_reg);
    tdm_gvocab_free(e->gvocab);
    tdm_threadpool_destroy(e->host_pool);
    if (e->gv_mu_ok) pthread_mutex_destroy(&e->gv_mu);
    if (!e->be_borrowed) tdm_backend_destroy(e->be);
    free(e);
}

/* Non-finite logits are a broken model (NaN or infinite weights, an overflow), never
 * a token: every output row of a forward is checked, naming the model and the row's
 * position.  Greedy rows arrive as argmaxes, -1 for such a row (forward.c and the
 * backends' head_argmax check while they read the logits); logits rows are scanned. */
static tandem_status check_outputs(const tdm_engine *e, bool is_draft, const tdm_batch *b, tdm_fwd_kind kind,
                                   tdm_err *err) {
    const float *host = is_draft ? e->logits_d : e->logits_t;
    const size_t V = (size_t)e->n_vocab;
    for (int32_t r = 0, i = 0; r < b->n_rows; r++) {
        if (!b->want_logits[r]) continue;
        bool ok = kind == TDM_FWD_ARGMAX ? e->ids[i] >= 0 : tdm_logits_finite(host + (size_t)i * V, e->n_vocab);
        if (!ok) return tdm_engine_nonfinite(e, is_draft, b->pos[r], err);
        i++;
    }
    return TANDEM_OK;
}

tandem_status tdm_engine_forward(tdm_engine *e, bool is_draft, const tdm_batch *b, const tdm_kv_seq *const *seqs,
                                 tdm_fwd_kind kind, tdm_err *err) {
    float *out = is_draft ? e->out_d : e->out_t, *host = is_draft ? e->logits_d : e->logits_t;
    const tdm_model *m = is_draft ? e->draft : e->target;
    const bool on_dev = kind == TDM_FWD_LOGITS_DEV; /* (checked by the device sampling) */
    const bool head = is_draft && e->head; /* (an EAGLE-3 head: logits rows, argmaxes taken here) */
    tandem_status st = head ? tdm_engine_head_forward(e, b, seqs, err)
                            : tdm_model_forward_ex(m, e->be, is_draft ? &e->kv_d : &e->kv_t, b, seqs,
                                                   is_draft ? &e->fs_d : &e->fs_t, on_dev ? TDM_FWD_LOGITS : kind, out,
                                                   e->ids, err);
    if (st || on_dev) return st;
    int32_t nl = tdm_batch_n_logits(b);
    /* the approximate kind is exact logits here (no quantised head on such backends) */
    if ((kind != TDM_FWD_ARGMAX || head) && host != out && nl > 0 &&
        (st = e->be->ops->download(e->be, host, out, (size_t)nl * (size_t)e->n_vocab * sizeof(float), err)))
        return st;
    if (head && kind == TDM_FWD_ARGMAX) /* (a row's mask, tdm_batch.logit_masks, honoured as the forward's argmax does) */
        for (int32_t i = 0; i < nl; i++) {
            const float *l = host + (size_t)i * (size_t)e->n_vocab;
            const uint32_t *mk = b->logit_masks ? b->logit_masks[i] : NULL;
            e->ids[i] = !tdm_logits_finite(l, e->n_vocab) ? -1 : mk ? tdm_argmax_masked(l, e->n_vocab, mk) : tdm_argmax(l, e->n_vocab);
        }
    return check_outputs(e, is_draft, b, kind, err);
}

tandem_status tdm_engine_feed(tdm_engine *e, tdm_seq *s, bool is_draft, int32_t from, int32_t to,
                              bool want_last, tdm_fwd_kind kind, tdm_err *err) {
    const tdm_kv_seq *seqs[1] = {&s->kv};
    tandem_status st;
    if ((st = tdm_kv_seq_reserve(e->pool, &s->kv, to, err))) return st;
    if (e->copy_status) return tdm_seterr(err, e->copy_status, "%s", e->copy_err.msg);
    for (int32_t c = from; c < to; c += e->max_rows) {
        int32_t end = TDM_MIN(to, c + e->max_rows);
        tdm_batch_clear(&e->batch);
        for (int32_t p = c; p < end; p++)
            tdm_batch_add(&e->batch, s->tokens[p], p, 0, p, want_last && p == to - 1);
        if ((st = tdm_engine_forward(e, is_draft, &e->batch, seqs, kind, err))) return st;
    }
    if (is_draft)
        s->n_draft = to;
    else
        s->n_target = to;
    return TANDEM_OK;
}

void tdm_engine_draws(const tdm_seq *s, int32_t n, double *u) {
    tdm_rng r = s->rng;
    for (int32_t i = 0; i < n; i++) u[i] = tdm_rng_uniform(&r);
}

void tdm_engine_consume(tdm_seq *s, int32_t n) {
    for (int32_t i = 0; i < n; i++) (void)tdm_rng_uniform(&s->rng);
}

tandem_status tdm_engine_check_ok(const tdm_engine *e, bool is_draft, const int32_t *ok, int32_t n, int32_t pos0,
                                  tdm_err *err) {
    for (int32_t i = 0; i < n; i++)
        if (!ok[i]) return tdm_engine_nonfinite(e, is_draft, pos0 + i, err);
    return TANDEM_OK;
}

tandem_status tdm_engine_nonfinite(const tdm_engine *e, bool is_draft, int32_t pos, tdm_err *err) {
    const char *who = is_draft ? "draft" : "target", *name = tdm_model_label(is_draft ? e->draft : e->target);
    if (pos < 0)
        return tdm_seterr(err, TANDEM_ERR_FORMAT, "%s model '%s': non-finite logits (NaN or infinity)", who, name);
    return tdm_seterr(err, TANDEM_ERR_FORMAT, "%s model '%s': non-finite logits (NaN or infinity) at position %d", who,
                      name, (int)pos);
}

_Static_assert(TDM_ENGINE_LOGIT_ROWS <= TDM_ENGINE_SAMP_OUT && TDM_ENGINE_SAMP_OUT + 2 <= TDM_ENGINE_SAMP_WORDS,
               "the device sampling words hold every row's flag and the result");

/* The ranges of tandem.h's tandem_generate_params, field by field (NaN fails each). */
static tandem_status check_params(const tandem_generate_params *gp, tdm_err *err) {
    const tandem_status bad = TANDEM_ERR_INVALID_ARG;
    if (gp->max_tokens < 0) return tdm_seterr(err, bad, "max_tokens %d is out of range [0, INT_MAX]", gp->max_tokens);
    if (!(gp->temperature >= 0))
        return tdm_seterr(err, bad, "temperature %g is out of range [0, +inf]", gp->temperature);
    if (gp->top_k < 0) return tdm_seterr(err, bad, "top_k %d is out of range [0, INT_MAX]", gp->top_k);
    if (!(gp->top_p > 0 && gp->top_p <= 1)) return tdm_seterr(err, bad, "top_p %g is out of range (0, 1]", gp->top_p);
    if (!(gp->min_p >= 0 && gp->min_p <= 1)) return tdm_seterr(err, bad, "min_p %g is out of range [0, 1]", gp->min_p);
    if (!(gp->spec_p_min >= 0 && gp->spec_p_min <= 1))
        return tdm_seterr(err, bad, "spec_p_min %g is out of range [0, 1]", gp->spec_p_min);
    if (gp->spec_k < 0 || gp->spec_k > TANDEM_SPEC_K_MAX || gp->spec_k_min < 1 ||
        gp->spec_k_max < gp->spec_k_min || gp->spec_k_max > TANDEM_SPEC_K_MAX)
        return tdm_seterr(err, bad, "bad speculation length (spec_k %d, spec_k_min %d, spec_k_max %d; limit %d)",
                          gp->spec_k, gp->spec_k_min, gp->spec_k_max, TANDEM_SPEC_K_MAX);
    if (gp->spec_tree != 0 && gp->spec_tree != TANDEM_SPEC_TREE_AUTO &&
        (gp->spec_tree < 1 || gp->spec_tree > TANDEM_SPEC_TREE_MAX))
        return tdm_seterr(err, bad, "spec_tree %d is out of range (0 = off, %d = auto, or 1..%d nodes)", gp->spec_tree,
                          TANDEM_SPEC_TREE_AUTO, TANDEM_SPEC_TREE_MAX);
    if (gp->bench_oracle_tokens && (gp->bench_n_oracle < 1 || !(gp->bench_oracle_alpha >= 0 && gp->bench_oracle_alpha <= 1) ||
                                    gp->temperature > 0))
        return tdm_seterr(err, bad,
                          "bench_oracle_tokens: needs bench_n_oracle >= 1 (got %d), bench_oracle_alpha in [0, 1] (got %g) "
                          "and greedy decoding (temperature %g)",
                          gp->bench_n_oracle, gp->bench_oracle_alpha, gp->temperature);
    if (gp->spec_ngram != 0 && (gp->spec_ngram < TANDEM_SPEC_NGRAM_MIN || gp->spec_ngram > TANDEM_SPEC_NGRAM_MAX))
        return tdm_seterr(err, bad, "spec_ngram %d is out of range (0 = off, or %d..%d)", gp->spec_ngram,
                          TANDEM_SPEC_NGRAM_MIN, TANDEM_SPEC_NGRAM_MAX);
    return TANDEM_OK;
}

tandem_status tdm_seq_init(tdm_engine *e, tdm_seq *s, const int32_t *prompt, int32_t n_prompt,
                              const tandem_generate_params *gp, tdm_err *err) {
    memset(s, 0, sizeof *s);
    if (n_prompt <= 0) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "empty prompt");
    if (n_prompt >= e->cfg.n_ctx)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                          e->cfg.n_ctx < e->target->hp.n_ctx_train
                              ? "prompt of %d tokens does not fit the context of %d (--ctx / n_ctx sets it, up to "
                                "the model's training context of %d)"
                              : "prompt of %d tokens does not fit the context of %d (the model's training "
                                "context is %d)",
                          (int)n_prompt, (int)e->cfg.n_ctx, (int)e->target->hp.n_ctx_train);
    tandem_status st = check_params(gp, err);
    if (st) return st;
    for (int32_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= e->n_vocab)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "prompt token %d at index %d is out of range",
                              (int)prompt[i], (int)i);
    s->cap = e->cfg.n_ctx + TDM_MAX(TANDEM_SPEC_K_MAX, TANDEM_SPEC_TREE_MAX) + 2;
    s->tokens = tdm_calloc((size_t)s->cap, sizeof(int32_t));
    if (!s->tokens) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    memcpy(s->tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    s->n_tokens = s->n_prompt = n_prompt;
    s->max_new = gp->max_tokens;
    s->sp.temperature = gp->temperature;
    s->sp.top_k = gp->top_k;
    s->sp.top_p = gp->top_p;
    s->sp.min_p = gp->min_p;
    tdm_rng_seed(&s->rng, gp->seed);
    tdm_detok_init(&s->detok, e->target->tok);
    s->detok.first = false; /* a continuation: keep the leading space of its first piece */
    s->on_token = gp->on_token;
    s->user_data = gp->user_data;
    s->ignore_eos = gp->ignore_eos;
    if ((st = tdm_stop_init(&s->stop, gp->stop, gp->n_stop, err))) return st;
    s->text = malloc(256);
    if (!s->text) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    s->text[0] = 0;
    s->text_cap = 256;
    if ((st = tdm_penalty_init(e, s, gp, err))) return st;
    s->min_tokens = gp->min_tokens;
    if (!(gp->top_logprobs >= 0 && gp->top_logprobs <= TANDEM_TOP_LOGPROBS_MAX))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "top_logprobs %d is out of range [0, %d]", gp->top_logprobs,
                          TANDEM_TOP_LOGPROBS_MAX);
    if (gp->top_logprobs > 0 && !gp->logprobs)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "top_logprobs %d needs logprobs", gp->top_logprobs);
    if (gp->on_token && gp->on_token_lp)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "on_token and on_token_lp are both set (at most one)");
    s->on_token_lp = gp->on_token_lp;
    s->lp_top = -1;
    if (gp->logprobs) {
        s->lp_top = gp->top_logprobs;
        s->lp_rows = calloc(TDM_LP_ROWS, sizeof *s->lp_rows);
        s->lp_cap = TDM_MIN(s->max_new, e->cfg.n_ctx - n_prompt) + 1; /* (every token it can generate) */
        s->lp = tdm_calloc((size_t)s->lp_cap, sizeof *s->lp);
        if (!s->lp_rows || !s->lp) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    return tdm_constraint_init(e, s, gp, err);
}

void tdm_seq_release(tdm_engine *e, tdm_seq *s) {
    tdm_kv_seq_free(e->pool, &s->kv);
    if (s->feat) e->be->ops->free(e->be, s->feat);
    s->feat = NULL;
    free(s->tokens);
    free(s->text);
    tdm_stop_free(&s->stop);
    tdm_constraint_free(s);
    tdm_penalty_free(s);
    free(s->lp);
    free(s->lp_rows);
    s->lp = NULL;
    s->lp_rows = NULL;
    s->tokens = NULL;
    s->text = NULL;
}

tandem_status tdm_seq_result(tdm_seq *s, double prefill_ms, double decode_ms, tandem_result *res,
                             tdm_err *err) {
    int32_t n_gen = s->n_tokens - s->n_prompt;
    res->tokens = tdm_mallocarray((size_t)TDM_MAX(n_gen, 1), sizeof(int32_t));
    if (!res->tokens) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    memcpy(res->tokens, s->tokens + s->n_prompt, (size_t)n_gen * sizeof(int32_t));
    res->status = TANDEM_OK;
    res->n_tokens = (size_t)n_gen;
    res->text = s->text;
    s->text = NULL;
    res->n_prompt_tokens = (size_t)s->n_prompt;
    res->finish_reason = s->finish;
    res->prefill_ms = n_gen > 0 ? prefill_ms : 0.0; /* no token: nothing ran */
    res->decode_ms = n_gen > 1 ? decode_ms : 0.0;   /* the first token is the prefill's */
    memset(&res->spec, 0, sizeof res->spec);
    res->logprobs = NULL;
    if (s->lp_top >= 0) { /* (one per generated token: every commit filled one) */
        res->logprobs = s->lp ? s->lp : tdm_calloc(1, sizeof *res->logprobs);
        s->lp = NULL;
        if (!res->logprobs) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    }
    return TANDEM_OK;
}

tandem_status tdm_engine_score_last(tdm_engine *e, bool draft, const int32_t *ids, int32_t n, float *out,
                                    tdm_err *err) {
    if (draft && !e->draft) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "the engine has no draft model");
    if (draft && e->head)
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "the engine's draft is an EAGLE-3 head: it scores from the target's features");
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = 1;
    tdm_seq s;
    tandem_status st = tdm_seq_init(e, &s, ids, n, &gp, err);
    if (!st) st = tdm_engine_feed(e, &s, draft, 0, n, true, TDM_FWD_LOGITS, err);
    if (!st) memcpy(out, draft ? e->logits_d : e->logits_t, (size_t)e->n_vocab * sizeof(float));
    tdm_seq_release(e, &s);
    return st;
}

void tdm_engine_host_for(tdm_engine *e, int32_t n, void (*fn)(void *user, int32_t i), void *user) {
    if (n > 1 && e->be->ops->host_for) {
        e->be->ops->host_for(e->be, n, fn, user);
        return;
    }
    if (n > 1 && !e->host_pool && !e->host_pool_tried) { /* (once: a machine of one core, or a
                                                              failed start, keeps the loop below) */
        e->host_pool_tried = true;
        const long cores = sysconf(_SC_NPROCESSORS_ONLN);
        const int th = (int)TDM_MIN(cores > 0 ? cores : 1, TDM_ENGINE_HOST_THREADS);
        tdm_err err;
        if (th > 1 && tdm_threadpool_create(th, TDM_THREADPOOL_SPIN_US, &e->host_pool, &err)) e->host_pool = NULL;
    }
    if (n > 1 && e->host_pool) {
        tdm_threadpool_for(e->host_pool, n, fn, user);
        return;
    }
    for (int32_t i = 0; i < n; i++) fn(user, i);
}
