/* engine.h - the generation engine: a target model, an optional draft model, one
 * paged KV cache shared by both (one block table per sequence, K/V storage per
 * model), and the per-request state.
 *
 * Invariants of a running sequence (n = seq->n_tokens committed tokens):
 *   - the target's K/V hold positions [0, n_target) with n_target = n - 1: the
 *     last committed token is "pending" and is fed by the next step;
 *   - the draft's K/V hold positions [0, n_draft), n_draft <= n - 1 (the draft
 *     catches up on the tokens it has not seen at the start of each step);
 *   - the block table backs max(n_target, n_draft) positions: after verification
 *     one truncate rolls both models back, so no K/V entry of a rejected token
 *     survives.
 * With an EAGLE-3 head as the draft (head.c) the head's slot P holds the row of the
 * draft's position P + 1 (n_draft counts as for a draft model), and the target's
 * features of the committed positions the head has not consumed are kept per
 * sequence (tdm_seq.feat).
 */
#ifndef TDM_ENGINE_H
#define TDM_ENGINE_H

#include <pthread.h>

#include "logit_edit.h"
#include "eagle3.h"
#include "model.h"
#include "phase_prof.h"
#include "sampling.h"
#include "stop.h"
#include "tokenizer.h"
#include "vocab_head.h"

/* Most rows of one forward that want logits (a verification of the longest chain);
 * an engine of many sequences holds TDM_ENGINE_BATCH_ROWS_PER_SEQ rows per sequence
 * (a batched verification of chains of up to 7 tokens in one forward), up to
 * TDM_ENGINE_BATCH_LOGITS_MAX (tdm_engine.n_logit_rows). */
#define TDM_ENGINE_LOGIT_ROWS (TANDEM_SPEC_K_MAX + 1)
/* Logits rows of a tree verification (the pending token and TDM_TREE_MAX nodes): every
 * engine with a draft keeps at least this many. */
#define TDM_ENGINE_TREE_ROWS (TANDEM_SPEC_TREE_MAX + 1)
#define TDM_ENGINE_BATCH_ROWS_PER_SEQ 8
#define TDM_ENGINE_BATCH_LOGITS_MAX 512
/* e->samp_dev: ok flags of up to TDM_ENGINE_LOGIT_ROWS rows, then the output words. */
#define TDM_ENGINE_SAMP_OUT 40
#define TDM_ENGINE_SAMP_IDS 64 /* (the scheduler's tokens of one batched step) */
#define TDM_ENGINE_SAMP_WORDS 128

/* Rows per prefill forward (tdm_engine_cfg.prefill_chunk's default): 256 on the CPU;
 * 512 on a GPU, where a larger product keeps the tensor cores busier. */
#define TDM_ENGINE_CHUNK_CPU 256
#define TDM_ENGINE_CHUNK_GPU 512
/* The most host threads of an engine on a backend without its own (tdm_engine_host_for). */
#define TDM_ENGINE_HOST_THREADS 8

/* Bytes of forward.c's scratch (tdm_fwd_scratch) for `rows` rows of a model of
 * these shapes: the CPU's forward buffers (a GPU keeps as much again). */
uint64_t tdm_engine_fwd_scratch_bytes(const tdm_hparams *hp, int32_t rows);

typedef struct tdm_engine_cfg {
    int32_t n_threads;
    int32_t n_ctx;
    int32_t n_seq_max;
    int32_t block_size;
    size_t kv_bytes;
    int32_t prefill_chunk;   /* rows per prefill forward */
    size_t gpu_mem;          /* device budget (tandem_engine_params.gpu_mem), 0 = none */
    int32_t max_batch_tokens;/* rows per scheduler step, 0 = prefill_chunk */
    bool prefix_cache;       /* share identical prompt prefixes' blocks */
    bool batch_invariant;    /* rows of a batch computed as alone (tandem_engine_params) */
    bool host_sampling;      /* sample on host copies of the logits where the backend could on
                                the device (tests compare the two; default false) */
    int32_t kv_type;         /* tandem_kv_type of both caches; 0 = TANDEM_KV_AUTO, the
                                backend's (tdm_backend.kv_type) */
    int32_t draft_vocab;     /* tandem_engine_params.draft_vocab: the draft's head over the
                                first N token ids and the special ones; 0 = the whole
                                vocabulary, TANDEM_DRAFT_VOCAB_AUTO (-1) = tdm_draft_vocab_rows */
} tdm_engine_cfg;

/* The N of a draft_vocab value for a vocabulary of n_vocab tokens: auto (-1) gives
 * TANDEM_DRAFT_VOCAB_AUTO_N when n_vocab > TANDEM_DRAFT_VOCAB_AUTO_ABOVE, else 0; 0
 * and N in [TANDEM_DRAFT_VOCAB_MIN, n_vocab] give themselves; -2 for any other value. */
int32_t tdm_draft_vocab_rows(int32_t draft_vocab, int32_t n_vocab);

/* The cache element type (tdm_dtype) an engine on backend be makes for kv_type
 * (tandem_kv_type); false for a value outside the enum. */
bool tdm_engine_kv_dtype(const tdm_backend *be, int32_t kv_type, uint32_t *out);

/* Logits rows an engine of n_seq_max sequences keeps (tdm_engine.n_logit_rows). */
int32_t tdm_engine_logit_rows(int32_t n_seq_max);

/* The KV blocks a device budget leaves: (budget - weights - work) / block_bytes,
 * capped by kv_bytes / block_bytes when kv_bytes > 0; 0 with err set (naming the
 * figures, TANDEM_ERR_NOMEM) when not even one block fits or kv_bytes does not fit
 * in what is left. */
int64_t tdm_kv_budget_blocks(size_t budget, uint64_t weights, uint64_t work, size_t kv_bytes, size_t block_bytes,
                             tdm_err *err);
/* Device bytes an engine's working buffers take besides weights and KV cache (the
 * forward buffers of its prefill chunk for each model, logits, and a fixed 64 MiB
 * for the backend's workspaces): what tdm_kv_budget_blocks subtracts. */
uint64_t tdm_engine_work_bytes(const tdm_model *target, const tdm_model *draft, int32_t prefill_chunk,
                               int32_t n_logit_rows);

/* Feature rows a sequence keeps pending for an EAGLE-3 head (tdm_seq.feat): the
 * longest verified path (a chain of TANDEM_SPEC_K_MAX tokens and its bonus row) and one
 * more; a sequence that goes on without drafting (lookups, plain steps) past that
 * has the head consume its oldest rows at once (head.c). */
#define TDM_HEAD_PENDING (TANDEM_SPEC_K_MAX + 2)

typedef struct tdm_engine {
    tdm_model *target;
    tdm_model *draft;        /* NULL: target-only; with an EAGLE-3 head, the head's shell
                                (head->m: its one layer's shape, its KV layout) */
    tdm_eagle3 *head;        /* an EAGLE-3 head as the draft (head.c), or NULL.  The
                                draft's K/V (kv_d) are then the head's one layer, and the
                                target's forward exports the head's features (fs_t) */
    tdm_eagle3_scratch hs;   /* the head's activations */
    tdm_batch hb;            /* [max_rows + TDM_HEAD_PENDING] a head forward's rows */
    float *h_feat;           /* [hb cap][3 T] backend: a head forward's feature rows */
    float *h_g;              /* [hb cap][head E] backend: its g rows (fc of the features,
                                or a previous level's output h) */
    float *h_out[2];         /* [hb cap][head E] backend: the latest forward's h rows
                                (h_out[h_cur]) and the one before */
    int32_t h_cur;
    uint64_t h_gen;          /* head forwards so far (tdm_seq.h_gen) */
    /* A token tree's levels (head.c tree mode, between tdm_engine_head_tree_begin and
     * _end): every head forward's h rows stay, one after another, so that a node's
     * children read its parent's h whichever earlier level (or part of one) fed it */
    float *h_tree;           /* [h_tree_cap][head E] backend, grown at a tree's begin */
    int32_t h_tree_cap, h_tree_n; /* rows allocated / written this tree round */
    bool h_tree_on;
    uint64_t h_tree_round;   /* tree rounds so far (tdm_seq.h_round) */
    tdm_backend *be;         /* compute backend: a CPU backend of n_threads (owned), or the
                                target model's own when its memory is not host memory (a
                                GPU: borrowed, be_borrowed) */
    bool be_borrowed;
    tdm_engine_cfg cfg;
    tdm_kv_pool *pool;
    tdm_kv_store kv_t;       /* target K/V */
    tdm_kv_store kv_d;       /* draft K/V (draft only) */
    tdm_batch batch;
    tdm_fwd_scratch fs_t, fs_d;
    tdm_vocab_head vhead;    /* the draft's head over part of the vocabulary (cfg.draft_vocab;
                                fs_d.vhead points here), or zeroed: its whole head */
    int32_t n_vocab;
    int32_t max_rows;        /* batch capacity */
    int32_t n_logit_rows;    /* logits rows one forward may ask for */
    float *logits_t;         /* [n_logit_rows][n_vocab] host-readable: the latest target
                                forward's logits rows */
    float *logits_d;         /* [n_logit_rows][n_vocab] likewise for the draft */
    float *out_t, *out_d;    /* where forwards write logits (backend memory): logits_t /
                                logits_d themselves on a host-memory backend, else device
                                buffers copied to them after each forward */
    int32_t *ids;            /* [n_logit_rows] greedy forwards' argmax per logits row (host) */
    /* Device sampling (backends with probs_dev, sample_dev and accept_dev; else all
     * NULL): the processed distributions stay where the logits are and only token
     * ids come back (engine.c, draw.c; the draft's q rows: draft/spec_ws.h). */
    float *p_dev;            /* [n_logit_rows][n_vocab] backend: target p rows */
    int32_t *samp_dev;       /* [TDM_ENGINE_SAMP_WORDS] backend: ok flags per row, then a
                                draw or an acceptance result (TDM_ENGINE_SAMP_OUT) */
    int32_t *draw_dev;       /* [2][n_logit_rows] backend: tdm_engine_draw's tokens, then
                                its rows' ok flags */
    float *tmp;              /* [n_vocab] host scratch */
    tdm_sampler_scratch ss;
    char *piece;             /* [piece_cap] decoded text of one token */
    int32_t piece_cap;
    tdm_phase_prof ph;       /* TANDEM_SPEC_PHASES=1: speculative steps' phase times */
    /* Constrained decoding (constrain.h) */
    pthread_mutex_t gv_mu;   /* guards gvocab's creation (submissions come from any thread) */
    bool gv_mu_ok;
    struct tdm_threadpool *host_pool; /* a backend without host threads (a GPU's): the
                                         step's host work (tdm_engine_host_for), made at
                                         first use; NULL until then */
    bool host_pool_tried;             /* its making was tried (not again each step) */
    struct tdm_gvocab *gvocab; /* the target tokenizer's vocabulary as byte strings, built at
                                the first constrained request (then immutable), or NULL */
    struct tdm_con_reg *con_reg; /* grammars shared by constrained requests (constrain.h),
                                    made with gvocab, or NULL */
    size_t mask_words;       /* (n_vocab + 31) / 32: a mask row of the logits */
    uint32_t *mask_dev;      /* [n_logit_rows][mask_words] backend: a draw's rows' masks
                                (with p_dev, where the backend has mask_rows), else NULL */
    /* Logit edits of device rows (penalty.h): the rows' offsets and edits gathered on
     * the host, uploaded in one piece to edit_dev (both grown as needed) */
    void *edit_host, *edit_dev;
    size_t edit_cap;         /* bytes of each */
    tdm_row_top *lp_dev;     /* [n_logit_rows] backend: the logprobs summaries of a draw's
                                device rows (with p_dev, where the backend has row_top),
                                else NULL */
    tandem_status copy_status;
    tdm_err copy_err;
} tdm_engine;

/* Per-request state. */
typedef struct tdm_seq {
    tdm_kv_seq kv;
    int32_t *tokens;         /* [cap] prompt + generated */
    int32_t n_tokens, cap;
    int32_t n_prompt;
    int32_t n_target;        /* target K/V positions held */
    int32_t n_draft;         /* draft K/V positions held */
    int32_t max_new;         /* stop after this many generated tokens */
    tdm_sampler_params sp;
    tdm_rng rng;
    bool ignore_eos;         /* an end-of-generation token does not finish it */
    bool done;
    tandem_finish_reason finish;
    /* streaming */
    tdm_detok detok;
    tandem_token_cb on_token;
    void *user_data;
    char *text;              /* all generated text so far (cut before a stop string) */
    size_t text_len, text_cap;
    size_t emitted;          /* bytes of text passed to on_token */
    tdm_stop stop;           /* the request's stop strings */
    struct tdm_constraint *con; /* its grammar (constrain.h), NULL: unconstrained */
    struct tdm_penalty *pen;    /* its penalties / logit_bias / min_tokens (penalty.h), NULL: none */
    int32_t min_tokens;         /* stop strings are not looked for before this many tokens */
    /* logprobs (tandem_generate_params.logprobs): lp_top < 0 off, else the alternatives
     * per token; the scheduler fills lp_rows[d] (row d of the step's verified chain:
     * its logsumexp, top entries and drawn token's logit; a tree's rows in node order,
     * then its accepted path's moved to the front, tdm_commit_tree) before committing,
     * and each committed token takes the next row (lp_next) into lp[] */
    int32_t lp_top;
    tandem_token_lp_cb on_token_lp;
    tandem_token_logprob *lp;   /* [lp_cap] one per generated token */
    int32_t lp_cap, lp_next, lp_fill; /* lp_rows[lp_next .. lp_fill) not yet taken */
    struct tdm_lp_row *lp_rows; /* [TDM_LP_ROWS] */
    /* With an EAGLE-3 head (head.c).  The head's slot P holds (token P + 1, g of
     * position P) at RoPE position P; in the draft's count, n_draft = P + 2 for its
     * last valid slot P, so its catch-up rows (draft positions p in [n_draft, n)) are
     * head slots p - 1, fed fc(feature p - 1).  Pending: the target's features of the
     * committed positions [feat0, feat0 + n_feat) the head has not consumed. */
    float *feat;             /* [TDM_HEAD_PENDING][3 T] backend, allocated at first use */
    int32_t feat0, n_feat;
    int32_t h_row;           /* row of e->h_out[e->h_cur] holding the output h of its last
                                head row (slot h_pos), valid while h_gen == e->h_gen */
    int32_t h_pos;
    uint64_t h_gen;
    /* in a head's tree round (h_round == e->h_tree_round): row of e->h_tree holding the
     * head's output for draft slot n_tokens - 1 + j (j = 0: the root's row, the last
     * catch-up row; j = 1 + d: the tree node of draft slot d), -1: none */
    int32_t h_node[TDM_TREE_MAX_NODES + 1];
    uint64_t h_round;
} tdm_seq;

/* A step's logits rows of one sequence at most: a verified chain's or tree's. */
#define TDM_LP_ROWS (TDM_MAX(TANDEM_SPEC_K_MAX, TDM_TREE_MAX_NODES) + 1)
/* A logits row's logprobs summary for the token drawn from it (tdm_seq.lp_rows). */
typedef struct tdm_lp_row {
    int32_t token;   /* the token drawn from the row */
    float logit;     /* its logit */
    double lse;      /* the row's logsumexp */
    int32_t k;
    int32_t ids[TANDEM_TOP_LOGPROBS_MAX];
    float val[TANDEM_TOP_LOGPROBS_MAX]; /* their logits */
} tdm_lp_row;

tandem_status tdm_engine_create(tdm_model *target, tdm_model *draft, const tdm_engine_cfg *cfg,
                                tdm_engine **out, tdm_err *err);
/* The same with an EAGLE-3 head as the draft (draft NULL; head borrowed, paired with
 * the target here: a mismatch is TANDEM_ERR_MISMATCH naming both).  The head drafts
 * chains and token trees. */
tandem_status tdm_engine_create_ex(tdm_model *target, tdm_model *draft, tdm_eagle3 *head, const tdm_engine_cfg *cfg,
                                   tdm_engine **out, tdm_err *err);

/* ---- the EAGLE-3 head as the draft (head.c) ---- */
/* The head's buffers and the target's feature export (from tdm_engine_create_ex). */
tandem_status tdm_engine_head_init(tdm_engine *e, tdm_err *err);
void tdm_engine_head_free(tdm_engine *e);
/* A forward of the head over a draft batch (rows as the draft model's: token p at
 * position p; seqs[i] must be tdm_seq kv fields): row p becomes head slot p - 1 (a
 * row at position 0 has no slot and is skipped; it may not want logits), fed
 * fc(feature p - 1) from the sequence's pending rows for a committed position, else
 * the output h of the sequence's row at p - 1 in the previous head forward.  In tree
 * mode (below) a drafted row takes the h of its parent's row instead (a tree row's
 * parent: its highest ancestor bit, else the root's row; a causal row's: the slot
 * before it), and a tree row keeps its mask, one slot lower.  The logits rows over
 * the whole vocabulary (the head's ids, TDM_LOGIT_NONE elsewhere) land in e->out_d. */
tandem_status tdm_engine_head_forward(tdm_engine *e, const tdm_batch *b, const tdm_kv_seq *const *seqs, tdm_err *err);
/* Tree mode for the head forwards until tdm_engine_head_tree_end (a token tree's
 * levels, draft/tree_draft.c): every forward's h rows are kept (e->h_tree, grown to
 * `rows`, the most rows the round's forwards hold together) and each sequence maps
 * its root and tree nodes to them (tdm_seq.h_node). */
tandem_status tdm_engine_head_tree_begin(tdm_engine *e, int32_t rows, tdm_err *err);
void tdm_engine_head_tree_end(tdm_engine *e);
/* After a target forward whose rows [row, row + n) were positions [pos, pos + n) of s,
 * now committed (a prompt chunk, or a verified path's rows): their features become
 * pending, the head's slots from pos on are dropped (a drafted row's slot held the
 * head's own h, not the target's feature), and the head consumes all but the last
 * pending row at once when consume is set (prompt chunks) or the pending rows would
 * exceed TDM_HEAD_PENDING.  Sets s->n_draft. */
tandem_status tdm_engine_head_keep(tdm_engine *e, tdm_seq *s, int32_t row, int32_t pos, int32_t n, bool consume,
                                   tdm_err *err);
/* The same after a verified token tree whose root row was `row` (node i at row + 1 +
 * i, verify/tree_verify.h) and whose accepted path is path[0..n - 1) (n: the tokens
 * committed, the path's and the next one): the path's feature rows are moved behind
 * the root's (path indices only grow, so no source is overwritten before it is read),
 * then kept as a chain's. */
tandem_status tdm_engine_head_keep_path(tdm_engine *e, tdm_seq *s, int32_t row, int32_t pos, const int32_t *path,
                                        int32_t n, tdm_err *err);

/* Device sampling helpers.  tdm_engine_draws: u[0..n) from a copy of the request's
 * generator (the generator itself moves on only by tdm_engine_consume, once the
 * host knows how many draws the device used, so the stream is the one host
 * sampling would use).  tdm_engine_check_ok: the ok flags of rows [0, n) as
 * probs_dev wrote them (downloaded into ok), TANDEM_ERR_FORMAT naming the model and
 * the position of the first row with non-finite logits. */
void tdm_engine_draws(const tdm_seq *s, int32_t n, double *u);
void tdm_engine_consume(tdm_seq *s, int32_t n);
tandem_status tdm_engine_check_ok(const tdm_engine *e, bool is_draft, const int32_t *ok, int32_t n, int32_t pos0,
                                  tdm_err *err);
/* The error for a row of non-finite logits (NaN or infinity): TANDEM_ERR_FORMAT naming
 * the model (target or draft) and the row's position (pos < 0: none known). */
tandem_status tdm_engine_nonfinite(const tdm_engine *e, bool is_draft, int32_t pos, tdm_err *err);
/* One logits row to draw a token from (tdm_engine_draw). */
typedef struct tdm_draw_row {
    const tdm_seq *s; /* its sequence: greedy, or its sampler parameters */
    double u;         /* the uniform a sampled row draws with */
    const uint32_t *mask; /* host [e->mask_words]: the row's allowed tokens (grammar-
                             constrained decoding, constrain.h; the others get
                             TDM_LOGIT_NONE before the draw), or NULL: all */
    const tdm_logit_edit *edit; /* host [n_edit]: the row's logit edits (penalties,
                             logit_bias, min_tokens: penalty.h), applied before the mask */
    int32_t n_edit;
} tdm_draw_row;
/* The token of each of the m <= e->n_logit_rows logits rows of the latest forward
 * of the target or the draft (row j is rows[j]'s, forward of the given kind): the
 * argmax when its sequence is greedy, else the token tdm_sample_probs_u draws with
 * rows[j].u from the sequence's processed distribution (on the device for
 * TDM_FWD_LOGITS_DEV); -1 for a row with non-finite logits.  Consumes nothing from
 * the generators (the caller knows how many draws it keeps).  A row with a mask is
 * masked where its logits are first (the logits rows keep the mask: a rule that
 * reads them later sees the masked row); it needs a forward of logits (an argmax
 * forward: TANDEM_ERR_INTERNAL). */
tandem_status tdm_engine_draw(tdm_engine *e, bool is_draft, const tdm_draw_row *rows, int32_t m, tdm_fwd_kind kind,
                              int32_t *tok, tdm_err *err);
/* The masks of rows [0, m) (those with one) applied to the latest forward's logits
 * rows where they are (what tdm_engine_draw does first), for a rule that reads the
 * rows itself (rejection sampling): host rows (TDM_FWD_LOGITS) with finite logits,
 * or device rows (TDM_FWD_LOGITS_DEV) through the backend's mask_rows; a masked row
 * of another kind is TANDEM_ERR_INTERNAL. */
tandem_status tdm_engine_mask_rows(tdm_engine *e, bool is_draft, const tdm_draw_row *rows, int32_t m, tdm_fwd_kind kind,
                                   tdm_err *err);
void tdm_engine_free(tdm_engine *e);
/* fn(user, i) for every i in [0, n), on the target backend's host threads where it
 * has them (the backend op host_for), else on the engine's own (host_pool: up to
 * TDM_ENGINE_HOST_THREADS, the machine's cores permitting; in order on this thread
 * when it cannot be made); returns when all have returned.  For a step's host work that is independent per sequence (each
 * call touches only its i's data and never the backend). */
void tdm_engine_host_for(tdm_engine *e, int32_t n, void (*fn)(void *user, int32_t i), void *user);
/* The draft's logits over ids[n] only (ascending token ids: a head over part of the
 * vocabulary, vocab_head.h; cfg.draft_vocab's, or any other map of head rows to
 * tokens), replacing the one it has; n = 0: its whole head again.  On failure the
 * draft is left with its whole head.  Not while a request runs. */
tandem_status tdm_engine_set_draft_vocab(tdm_engine *e, const int32_t *ids, int32_t n, tdm_err *err);

/* Fills res from a finished sequence (tokens, text: moved out of s, timings in
 * milliseconds; res->spec zeroed: the scheduler fills it). */
tandem_status tdm_seq_result(tdm_seq *s, double prefill_ms, double decode_ms, tandem_result *res,
                             tdm_err *err);

/* tdm_seq_init validates a request and makes its sequence (tokens, sampler,
 * controllers, stop strings); tdm_seq_release frees the sequence's blocks and
 * buffers (safe after a failed init). */
tandem_status tdm_seq_init(tdm_engine *e, tdm_seq *s, const int32_t *prompt, int32_t n_prompt,
                           const tandem_generate_params *gp, tdm_err *err);
void tdm_seq_release(tdm_engine *e, tdm_seq *s);

/* Internal steps, shared by the target-only and speculative paths. */
/* Forward of model (target or draft) over rows tokens[from, to) of seq at positions
 * from.., writing K/V; when want_last, the last row's output of the given kind:
 * logits into e->logits_t / e->logits_d, or (TDM_FWD_ARGMAX) its argmax into e->ids[0]. */
tandem_status tdm_engine_feed(tdm_engine *e, tdm_seq *s, bool is_draft, int32_t from, int32_t to,
                              bool want_last, tdm_fwd_kind kind, tdm_err *err);
/* One forward of the target or the draft over batch (e->batch or another), with
 * outputs of the given kind for its want_logits rows: logits rows readable at
 * e->logits_t / e->logits_d, or (TDM_FWD_ARGMAX) argmaxes in e->ids. */
tandem_status tdm_engine_forward(tdm_engine *e, bool is_draft, const tdm_batch *b, const tdm_kv_seq *const *seqs,
                                 tdm_fwd_kind kind, tdm_err *err);


/* Logits after the last of n tokens for the target (or the draft), computed by
 * prefilling a temporary sequence that is freed afterwards.  out: [n_vocab]. */
tandem_status tdm_engine_score_last(tdm_engine *e, bool draft, const int32_t *ids, int32_t n, float *out,
                                    tdm_err *err);

#endif
