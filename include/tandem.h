/* tandem.h - public C API of tandem, a speculative-decoding LLM inference runtime.
 *
 * Conventions
 * - Opaque handles with paired open/close; close(NULL) is a no-op.
 * - Parameter structs are filled with defaults by tandem_*_default_params() (and
 *   tandem_request_default()); every field's comment gives its default as
 *   "default VALUE", VALUE a C expression (tests/test_api_defaults.c checks each one
 *   against the function).
 * - Every fallible call returns a tandem_status.  When a call fails, a message that
 *   names the problem is available from tandem_last_error() on the same thread
 *   until the next failing call on that thread.
 * - Ownership: memory returned through out-parameters is owned by the caller unless
 *   stated otherwise and freed with the named function.
 * - Thread safety: a tandem_model is immutable after open and may be shared by
 *   several engines and threads.  On a tandem_engine, every call but
 *   tandem_engine_close may be called from any thread at any time: generate, submit,
 *   cancel, step, start, stop and get_stats (exactly one thread steps the engine at
 *   once, the others wait; see "Asynchronous use").  tandem_engine_close must be the
 *   last call on an engine, made when no other call on it is in progress.
 *   tandem_status_str and tandem_last_error may be called from any thread.
 * - The library never calls abort() or exit(); bad input becomes a status code.
 */
#ifndef TANDEM_H
#define TANDEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header (meson.build's project version; the build checks that
 * they agree).  tandem_version() is the library's, which may differ when a program
 * runs against another build than it was compiled with. */
#define TANDEM_VERSION_MAJOR 0
#define TANDEM_VERSION_MINOR 1
#define TANDEM_VERSION_PATCH 0
#define TANDEM_VERSION "0.1.0"

/* Every function of this header is marked TANDEM_API: the one set of symbols the
 * library exports (it is built with hidden visibility for everything else). */
#if defined(__GNUC__) || defined(__clang__)
#define TANDEM_API __attribute__((visibility("default")))
#else
#define TANDEM_API
#endif

typedef enum tandem_status {
    TANDEM_OK = 0,
    TANDEM_ERR_INVALID_ARG,  /* a bad argument or request (NULL handle, out-of-range value) */
    TANDEM_ERR_IO,           /* a file could not be opened, read or mapped */
    TANDEM_ERR_FORMAT,       /* malformed or corrupt input (GGUF, JSON, config file), also a
                                model whose weights give non-finite logits (NaN, infinity) */
    TANDEM_ERR_UNSUPPORTED,  /* well-formed but not supported (architecture, tensor type) */
    TANDEM_ERR_NOMEM,        /* an allocation failed */
    TANDEM_ERR_MISMATCH,     /* target and draft models are incompatible */
    TANDEM_ERR_KV_FULL,      /* the paged KV cache has no free block */
    TANDEM_ERR_BACKEND,      /* the compute backend failed or is unavailable */
    TANDEM_ERR_CANCELLED,    /* a callback asked to stop */
    TANDEM_ERR_INTERNAL,     /* a bug in tandem: please report it */
} tandem_status;

/* A static English description of a status ("ok", "format error", ...). */
TANDEM_API const char *tandem_status_str(tandem_status status);

/* The message of the last failing call on this thread ("" if none). */
TANDEM_API const char *tandem_last_error(void);

/* The library's version, "MAJOR.MINOR.PATCH" (a static string). */
TANDEM_API const char *tandem_version(void);
/* What this build of the library can run on, one line per backend (a static
 * string, as llama.cpp's llama_print_system_info): the CPU's SIMD levels built and
 * the one this CPU runs ("cpu: SIMD levels built: scalar, avx2, avx512; this CPU:
 * avx512"), then whether CUDA and NCCL are built in.  Thread-safe. */
TANDEM_API const char *tandem_system_info(void);

/* ------------------------------------------------------------------- log */

/* The library's own messages: warnings (an environment variable that is set but no
 * longer read, ...) and the reports a diagnostic environment variable asks for
 * (TANDEM_CUDA_PROFILE, TANDEM_SPEC_PHASES: info).  A failing call's error is its
 * status and tandem_last_error, never a log message. */
typedef enum tandem_log_level {
    TANDEM_LOG_ERROR = 0,
    TANDEM_LOG_WARN = 1,
    TANDEM_LOG_INFO = 2,
    TANDEM_LOG_DEBUG = 3,
} tandem_log_level;

/* Receives one message: a line of UTF-8 text without a trailing newline, valid
 * during the call.  May be called from any thread of the process (an engine's own
 * thread among them), one call at a time; it must not call back into tandem. */
typedef void (*tandem_log_cb)(tandem_log_level level, const char *msg, void *user_data);

/* Sends every later message to cb with user_data; NULL restores the default, which
 * writes info and above to stderr (warnings as "tandem: warning: ..."; the library
 * emits info only for the reports asked for) and drops debug.  Once it returns, the
 * previous callback is not called again.  Thread-safe. */
TANDEM_API void tandem_log_set(tandem_log_cb cb, void *user_data);

/* ---------------------------------------------------------------- models */

typedef struct tandem_model tandem_model;

typedef enum tandem_backend_kind {
    TANDEM_BACKEND_CPU = 0,
    TANDEM_BACKEND_CUDA = 1,
} tandem_backend_kind;

/* The format the weights are computed in (tandem_model_params.weights). */
typedef enum tandem_weights {
    TANDEM_WEIGHTS_NATIVE = 0, /* as the file stores them */
    TANDEM_WEIGHTS_FP8 = 1,    /* the transformer blocks' dense F16 / BF16 / F32 / Q8_0
                                  matrices quantised at load to FP8 E4M3 with a scale per
                                  output row (as vLLM's dynamic FP8): half the bytes of
                                  F16, FP8 tensor cores on Hopper.  The embedding, the
                                  output head, MoE routers and experts, norms and the
                                  4- to 6-bit types stay as stored */
} tandem_weights;

typedef struct tandem_model_params {
    tandem_backend_kind backend; /* where the weights live, and so where an engine on this
                                    model computes; default TANDEM_BACKEND_CPU.  CUDA fails with
                                    TANDEM_ERR_BACKEND in a build without CUDA or where no
                                    device can be used */
    int cuda_device;             /* CUDA device index; default 0 */
    int tensor_parallel;         /* split the weights across this many ranks, in [1, 8]
                                    (Megatron-style tensor parallelism: attention heads and KV
                                    heads, FFN features and the output head's vocabulary
                                    divided between them, two all-reduces per layer).  CUDA:
                                    devices cuda_device .. cuda_device + N - 1, through NCCL;
                                    the CPU: N shards computed one after another (the same
                                    path, for testing).  Heads, KV heads and FFN features must
                                    divide by N, and a quantised attn_output / ffn_down must
                                    give each rank whole blocks of columns: otherwise
                                    TANDEM_ERR_INVALID_ARG (or _UNSUPPORTED) naming what does
                                    not.  A split model is a target only (a draft model is
                                    not split; it runs on the first rank's device).  Default
                                    1 = not split */
    bool (*progress_callback)(float progress, void *user_data);
                                 /* called on the opening thread as the load goes, with the
                                    fraction done in [0, 1] (0 first, then before each tensor,
                                    1 last) and progress_callback_user_data; returning false
                                    stops the load: tandem_model_open fails with
                                    TANDEM_ERR_CANCELLED, everything it allocated freed.
                                    Default NULL: no calls */
    void *progress_callback_user_data; /* default NULL */
    tandem_weights weights;      /* default TANDEM_WEIGHTS_NATIVE; another value than the
                                    enum's: TANDEM_ERR_INVALID_ARG */
} tandem_model_params;

TANDEM_API tandem_model_params tandem_model_default_params(void);

/* Opens a GGUF model file (validated; tensor data memory-mapped).  An EAGLE-3 draft
 * head (architecture eagle3) opens too, as a draft for tandem_engine_open only: it
 * has no tokenizer of its own (tandem_tokenize and the chat calls refuse it). */
TANDEM_API tandem_status tandem_model_open(const char *path, const tandem_model_params *params,
                                           tandem_model **out);
TANDEM_API void tandem_model_close(tandem_model *model);

typedef struct tandem_model_info {
    const char *arch;     /* "llama", "qwen2"; owned by the model */
    const char *name;     /* general.name or ""; owned by the model */
    int n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv;
    int n_ff;             /* FFN features (a mixture of experts: of each expert) */
    int32_t bos, eos;     /* -1 when the model has none */
    uint64_t n_params;
    uint64_t weight_bytes;
    uint64_t decode_bytes;       /* weight bytes one decode step reads: every matrix and
                                    norm, but one row of the token embedding (a mixture of
                                    experts: the router and expert_used_count experts of
                                    each layer) */
    uint64_t kv_bytes_per_token; /* K and V bytes per position, all layers, in the cache
                                    type of the model's backend (f16 on the CPU and CUDA; an
                                    engine's kv_type may pick another); of a split model, on
                                    each rank (its KV heads) */
    int tensor_parallel;         /* ranks the weights are split across (1: not split); the
                                    shapes above are the whole model's; n_params and
                                    weight_bytes what all ranks hold together (a tensor every
                                    rank keeps whole, such as the token embedding, once per
                                    rank); decode_bytes one rank's */
} tandem_model_info;

TANDEM_API tandem_status tandem_model_get_info(const tandem_model *model, tandem_model_info *out);

/* Tokenizes text.  *out_ids is allocated with malloc (free with tandem_free).
 * add_bos: add the special tokens the model's tokenizer asks for: BOS first when
 * add_bos_token, EOS last when add_eos_token (llama.cpp's add_special).
 * Text spelling a special token (e.g. "<|endoftext|>") becomes that token. */
TANDEM_API tandem_status tandem_tokenize(const tandem_model *model, const char *text, size_t len,
                                         bool add_bos, int32_t **out_ids, size_t *out_n);

/* Decodes token ids to UTF-8 text (malloc'ed, NUL-terminated; free with tandem_free). */
TANDEM_API tandem_status tandem_detokenize(const tandem_model *model, const int32_t *ids, size_t n,
                                           char **out_text);

TANDEM_API void tandem_free(void *p);

/* ------------------------------------------------------------ tokenizers */

/* A stand-alone tokenizer from any GGUF with tokenizer metadata: a whole model or a
 * vocabulary-only file (no tensors needed).  Immutable after open: may be shared by
 * threads.  encode/decode behave as tandem_tokenize/tandem_detokenize. */
typedef struct tandem_tokenizer tandem_tokenizer;

TANDEM_API tandem_status tandem_tokenizer_open(const char *path, tandem_tokenizer **out);
TANDEM_API void tandem_tokenizer_close(tandem_tokenizer *tokenizer);
TANDEM_API tandem_status tandem_tokenizer_encode(const tandem_tokenizer *tokenizer, const char *text, size_t len,
                                                 bool add_bos, int32_t **out_ids, size_t *out_n);
TANDEM_API tandem_status tandem_tokenizer_decode(const tandem_tokenizer *tokenizer, const int32_t *ids, size_t n,
                                                 char **out_text);

/* ------------------------------------------------------------------ chat */

/* One message of a conversation. */
typedef struct tandem_chat_message {
    const char *role;    /* "system", "user", "assistant", ... (UTF-8, NUL-terminated) */
    const char *content; /* the text (UTF-8, NUL-terminated); NULL: none (null in the
                            template) */
} tandem_chat_message;

/* The built-in chat templates' names, comma-separated: "chatml, llama2, llama3, gemma,
 * mistral, mistral-v7, phi3, deepseek2, deepseek3, deepseek-r1" (a static string). */
TANDEM_API const char *tandem_chat_builtin_templates(void);

/* Renders a conversation into a prompt with a chat template, as Python's jinja2 does
 * for HF transformers' apply_chat_template (trim_blocks, lstrip_blocks, the
 * raise_exception and strftime_now functions, transformers' tojson).
 *   chat_template: NULL = the model's own (its GGUF's tokenizer.chat_template;
 *       TANDEM_ERR_UNSUPPORTED when it has none); else a built-in name
 *       (tandem_chat_builtin_templates), a named template of the model
 *       (tokenizer.chat_template.NAME), or the text of a Jinja template (anything
 *       containing "{{" or "{%").  An unknown name: TANDEM_ERR_INVALID_ARG.
 *   messages[n_messages]: the conversation (copied; the caller keeps them).
 *   add_generation_prompt: end with the opening of an assistant turn.
 * The template sees messages, add_generation_prompt, bos_token and eos_token (the
 * texts of the model's BOS and EOS tokens, undefined when it has none), tools and
 * documents (none).  When the model adds BOS when tokenizing and the text begins
 * with the BOS token's text, that text is removed (as llama.cpp does): the result
 * is ready for tandem_generate, which adds BOS.  A template that fails (a syntax
 * error, a construct outside the supported subset, raise_exception) fails with
 * TANDEM_ERR_FORMAT or TANDEM_ERR_UNSUPPORTED and a message naming the template's
 * line and column (raise_exception's text quoted, control characters escaped); a
 * built-in template is the fallback.  A template is at most 1 MiB and its parse takes
 * at most 64 MiB; rendering is bounded (16 MiB of text, 256 MiB of memory, 50M steps,
 * which count nodes evaluated and every walk over data, so about a second at most);
 * past a bound: TANDEM_ERR_NOMEM naming it.  *out_text: malloc'ed, NUL-terminated;
 * free with tandem_free.  Thread-safe: the model is only read. */
TANDEM_API tandem_status tandem_chat_render(const tandem_model *model, const char *chat_template,
                                            const tandem_chat_message *messages, size_t n_messages,
                                            bool add_generation_prompt, char **out_text);

/* The same from JSON text json[0..len): an OpenAI-style messages array (each element
 * an object with a string "role"; "content" and any other members, such as
 * "tool_calls", are passed to the template as they are), or an object
 * {"messages": [...], "tools": [...]} whose tools the template also sees.  Bad JSON
 * or messages: TANDEM_ERR_INVALID_ARG naming the problem. */
TANDEM_API tandem_status tandem_chat_render_json(const tandem_model *model, const char *chat_template, const char *json,
                                                 size_t len, bool add_generation_prompt, char **out_text);

/* tandem_chat_render for a stand-alone tokenizer (its GGUF's template and tokens). */
TANDEM_API tandem_status tandem_tokenizer_chat_render(const tandem_tokenizer *tokenizer, const char *chat_template,
                                                      const tandem_chat_message *messages, size_t n_messages,
                                                      bool add_generation_prompt, char **out_text);

/* The model's end-of-generation tokens, ascending: EOS, the end-of-turn and
 * end-of-message tokens its GGUF declares (tokenizer.ggml.eot_token_id,
 * eom_token_id), and its special tokens that end a turn in the chat formats
 * (<|im_end|>, <|eot_id|>, <end_of_turn>, <|end|>, ...).  Generation stops at any of
 * them (finish reason eos).  Writes at most cap ids into out (out may be NULL when
 * cap is 0) and returns how many there are (at most 16). */
TANDEM_API size_t tandem_model_eog_tokens(const tandem_model *model, int32_t *out, size_t cap);

/* --------------------------------------------------------------- engines */

/* An engine runs generation for a target model and, optionally, a draft model that
 * shares its vocabulary.  Both share one paged KV cache. */
typedef struct tandem_engine tandem_engine;

/* The element type of an engine's KV cache (tandem_engine_params.kv_type); both
 * models' caches take it.  Bytes per position (K and V, all layers) of a model with
 * L layers, H kv heads of D dims: f32 8 L H D, f16 4 L H D, q8_0 and fp8 about
 * 2 L H (D + 4). */
typedef enum tandem_kv_type {
    TANDEM_KV_AUTO = 0, /* the backend's: f16 on the CPU and on a GPU */
    TANDEM_KV_F32 = 1,  /* 4 bytes per value */
    TANDEM_KV_F16 = 2,  /* 2 bytes per value (IEEE half) */
    TANDEM_KV_Q8_0 = 3, /* int8 values, one f32 scale per (position, kv head) vector
                           (max |x| / 127, round to nearest): about half of f16;
                           attention reads the int8 values directly */
    TANDEM_KV_FP8 = 4,  /* FP8 E4M3 values, one f32 scale per (position, kv head) vector
                           (max |x| / 448, round to nearest even): the bytes of q8_0;
                           attention reads the E4M3 values directly (on Hopper
                           GPUs, converted in hardware); less exact than q8_0,
                           most on models with outlier key channels such as
                           Qwen2 (bench/RESULTS.md) */
} tandem_kv_type;

/* An engine's context when tandem_engine_params.n_ctx is 0: this many tokens per
 * sequence, or the target's training context if smaller (as llama.cpp's -c). */
#define TANDEM_CTX_DEFAULT 4096

/* The most CPU threads an engine takes (tandem_engine_params.n_threads). */
#define TANDEM_THREADS_MAX 1024

/* tandem_engine_params.draft_vocab: the draft model's logits over part of the
 * vocabulary (its head computes only those rows; FR-Spec, arXiv 2502.14856).  The
 * tokens are ids [0, N) (a byte-level BPE vocabulary's ids follow its merge order,
 * which roughly follows frequency: of Qwen2.5-Coder-1.5B's greedy tokens on code
 * prompts, 95-96.5 % have an id below 32768, 98.5 % below 65536) and every special
 * token (control and user-defined, the end-of-generation ids), so the draft can
 * still propose the end.  The target scores every token, so output is unchanged:
 * greedy output is the same token for token, and sampled output keeps its
 * distribution (the draft's proposals just never name the other tokens).  On the real
 * pair (Qwen2.5-Coder 1.5B / 0.5B, 2 CPU threads) N = 65536 decodes 4-9 % faster than
 * the whole vocabulary, 32768 0.5-9 %, 16384 not at all (bench/RESULTS.md). */
#define TANDEM_DRAFT_VOCAB_AUTO (-1)       /* N = _AUTO_N for a vocabulary above _AUTO_ABOVE, else all */
#define TANDEM_DRAFT_VOCAB_AUTO_N 65536
#define TANDEM_DRAFT_VOCAB_AUTO_ABOVE 65536
#define TANDEM_DRAFT_VOCAB_MIN 1024        /* the smallest N */

typedef struct tandem_engine_params {
    int n_threads;        /* CPU threads for compute, in [0, TANDEM_THREADS_MAX]; default 0 =
                             all cores (unused when the models are on the CUDA backend: the
                             engine computes there) */
    size_t kv_bytes;      /* KV cache budget in bytes (both models); default 0 = enough for
                             n_ctx tokens of n_seq_max sequences.  A hard limit: on the CPU
                             the cache's memory is taken as blocks are first used (resident
                             memory grows with the tokens held, up to this), on a GPU all
                             of it when the engine opens */
    int n_ctx;            /* max tokens per sequence (prompt and generated), >= 0; a prompt
                             of n_ctx tokens or more is TANDEM_ERR_INVALID_ARG, a generation
                             reaching it ends with TANDEM_FINISH_LENGTH; default 0 =
                             min(TANDEM_CTX_DEFAULT, the target's training context); more
                             than the training context is allowed (the model may degrade
                             past it) */
    int n_seq_max;        /* sequences decoding at once (tandem_generate_batch); the KV cache
                             holds n_ctx tokens for each unless kv_bytes / gpu_mem size it;
                             default 1 */
    int kv_block_size;    /* tokens per KV block; default 16 */
    size_t gpu_mem;       /* device memory budget in bytes for an engine on a GPU: both
                             models' weights, the engine's working buffers (an estimate from
                             the shapes) and the KV cache, which gets the rest (kv_bytes, when
                             also set, must fit in that rest).  TANDEM_ERR_NOMEM naming the
                             figures when the weights and buffers leave no room for a block.
                             Default 0 = no budget: kv_bytes or n_ctx size the cache.
                             With a target split across GPUs (tensor_parallel), the budget
                             of each GPU, counted on the first (which also holds the draft):
                             every GPU holds the same number of KV blocks.  Ignored on the
                             CPU */
    int max_batch_tokens; /* token rows one scheduler step computes at most, decode rows and
                             prompt chunks together (a long prompt is prefilled over several
                             steps, beside the running decodes), [0, 65536]; default 0 = 512
                             on a GPU, 256 on the CPU */
    bool prefix_cache;    /* share the KV blocks of identical prompt prefixes between
                             requests (full blocks, found by hash, copy-on-write); default true */
    bool batch_invariant; /* true: compute every row of a batch as it would be computed
                             alone, so that greedy output never depends on the batch (on a
                             GPU: forwards of at most 16 decode rows, prompt chunks in
                             forwards of their own; slower from about 8 sequences on).
                             false: the rows of several sequences share forwards and the
                             GPU picks its products by speed (as vLLM does; a near-tie may
                             break the other way than alone).  A lone sequence's rows are
                             always its own, so its speculative output equals target-only
                             output either way.  No effect on the CPU, whose rows are
                             invariant at any batch size; default false */
    tandem_kv_type kv_type; /* element type of the KV cache (target and draft); a value
                             outside the enum is TANDEM_ERR_INVALID_ARG; default
                             TANDEM_KV_AUTO (f16 on the CPU and on a GPU) */
    int draft_vocab;      /* the draft's logits over this many tokens (TANDEM_DRAFT_VOCAB_AUTO
                             above): 0 = the whole vocabulary; N in [TANDEM_DRAFT_VOCAB_MIN,
                             the vocabulary's size] = ids [0, N) and the special tokens;
                             TANDEM_DRAFT_VOCAB_AUTO (-1) = 65536 for a vocabulary larger
                             than 65536 tokens, else the whole.  Another value is
                             TANDEM_ERR_INVALID_ARG (when the engine opens); ignored without
                             a draft; default TANDEM_DRAFT_VOCAB_AUTO */
} tandem_engine_params;

TANDEM_API tandem_engine_params tandem_engine_default_params(void);

/* draft may be NULL (target-only decoding), a draft model, or an EAGLE-3 draft head
 * (a file of architecture eagle3, opened by tandem_model_open), which drafts chains
 * and token trees (spec_tree) from the target's own features.  The engine
 * borrows both models: they must outlive it.  Fails with TANDEM_ERR_MISMATCH when the
 * vocabularies differ (a head: its width, feature layers or vocabulary do not fit the
 * target) or the two models are on different backends. */
TANDEM_API tandem_status tandem_engine_open(tandem_model *target, tandem_model *draft,
                                            const tandem_engine_params *params, tandem_engine **out);
TANDEM_API void tandem_engine_close(tandem_engine *engine);
/* The engine's context: tokens per sequence (tandem_engine_params.n_ctx, its default
 * resolved); 0 for NULL. */
TANDEM_API int tandem_engine_n_ctx(const tandem_engine *engine);

/* The most device memory in use at any time since the engine's backend was made, in
 * bytes (the whole GPU as its driver reports it: every buffer of this process and
 * the CUDA context); 0 for an engine on the CPU. */
TANDEM_API uint64_t tandem_engine_device_peak_bytes(const tandem_engine *engine);
/* The same for rank `rank` of a target split across GPUs (tensor_parallel; rank 0 is
 * the device above, where the draft also runs); 0 for a rank out of range or on the
 * CPU. */
TANDEM_API uint64_t tandem_engine_device_peak_bytes_rank(const tandem_engine *engine, int rank);

typedef enum tandem_finish_reason {
    TANDEM_FINISH_NONE = 0,
    TANDEM_FINISH_EOS,      /* the model produced an end-of-generation token (EOS or an
                               end of turn: tandem_model_eog_tokens) */
    TANDEM_FINISH_LENGTH,   /* max_tokens reached (or the context is full) */
    TANDEM_FINISH_CANCELLED,/* the token callback returned false, or tandem_engine_cancel */
    TANDEM_FINISH_STOP,     /* a stop string was generated: the text ends before it */
    TANDEM_FINISH_TIMEOUT,  /* the request's timeout_ms passed: the text so far */
    TANDEM_FINISH_ERROR,    /* the request failed alone (tandem_result.status and .error) */
} tandem_finish_reason;

TANDEM_API const char *tandem_finish_reason_str(tandem_finish_reason r); /* "eos", "length", ... */

/* Called with each newly committed token and the text it completes (only whole
 * UTF-8 characters; may be empty; text that may begin a stop string is held back
 * until it cannot, and a stop string itself is never passed).  Return false to
 * stop generation (finish reason cancelled). */
typedef bool (*tandem_token_cb)(int32_t token, const char *text, size_t text_len,
                                void *user_data);

/* Log-probabilities of one generated token (tandem_generate_params.logprobs): under
 * the distribution the target draws from after the request's penalties, logit_bias
 * and grammar mask, at temperature 1 and before top_k / top_p / min_p (what vLLM
 * returns by default): logprob = logit - logsumexp(logits) of that row. */
#define TANDEM_TOP_LOGPROBS_MAX 20
typedef struct tandem_token_logprob {
    float logprob;       /* the generated token's */
    int n_top;           /* entries in top_*: the request's top_logprobs */
    int32_t top_ids[TANDEM_TOP_LOGPROBS_MAX];    /* [n_top] the likeliest tokens, most first
                                                    (ties: the lower id first) */
    float top_logprobs[TANDEM_TOP_LOGPROBS_MAX]; /* [n_top] their log-probabilities */
} tandem_token_logprob;

/* on_token with the token's log-probabilities (lp: valid during the call; NULL when
 * the request asked none). */
typedef bool (*tandem_token_lp_cb)(int32_t token, const char *text, size_t text_len,
                                   const tandem_token_logprob *lp, void *user_data);

/* One entry of tandem_generate_params.logit_bias. */
typedef struct tandem_logit_bias {
    int32_t token; /* [0, the model's vocabulary) */
    float bias;    /* added to the token's logit, [-100, 100] */
} tandem_logit_bias;
#define TANDEM_LOGIT_BIAS_MAX 1024 /* n_logit_bias at most this */

/* Bounds of the speculation parameters (tandem_generate_params). */
#define TANDEM_SPEC_K_MAX 32    /* spec_k, spec_k_min, spec_k_max at most this */
#define TANDEM_SPEC_NGRAM_MIN 2 /* spec_ngram: 0, or in [TANDEM_SPEC_NGRAM_MIN, _MAX] */
#define TANDEM_SPEC_NGRAM_MAX 8
#define TANDEM_SPEC_TREE_MAX 64 /* spec_tree: nodes of a token tree at most */
#define TANDEM_SPEC_TREE_AUTO (-1)
#define TANDEM_STOP_MAX 16      /* n_stop at most this */
#define TANDEM_STOP_LEN_MAX 256 /* bytes of one stop string at most */

/* Each field's accepted range is given in brackets; tandem_generate fails with
 * TANDEM_ERR_INVALID_ARG, naming the field, for a value outside it (or NaN). */
typedef struct tandem_generate_params {
    int max_tokens;       /* new tokens at most, [0, INT_MAX]; default 128 */
    float temperature;    /* [0, +inf], 0 = greedy; default 0 */
    int top_k;            /* [0, INT_MAX], 0 = off; default 0 */
    float top_p;          /* (0, 1], 1 = off; default 1 */
    float min_p;          /* [0, 1], 0 = off; default 0 */
    uint64_t seed;        /* per-request generator seed, any value; default 0 */
    int spec_k;           /* drafted tokens per step, [0, TANDEM_SPEC_K_MAX]: 0 = adaptive
                             (needs a draft), >0 fixed; ignored without a draft; default 0 */
    int spec_k_min;       /* adaptive lower bound, [1, spec_k_max]; default 1 */
    int spec_k_max;       /* adaptive upper bound, [spec_k_min, TANDEM_SPEC_K_MAX]; default 12 */
    float spec_p_min;     /* stop drafting when the draft's top probability is below this,
                             [0, 1]; 0 = never; default 0 */
    int spec_ngram;       /* n-gram lookup proposals beside the draft model (ignored
                             without a draft): 0 = off, N in [TANDEM_SPEC_NGRAM_MIN,
                             TANDEM_SPEC_NGRAM_MAX] = match the last N..2 tokens against
                             the earlier text and propose what followed, in the steps
                             where the controller expects that to beat the draft model
                             (lossless; runs no model); default 4 */
    int spec_tree;        /* token trees, from a draft model or an EAGLE-3 head
                             (ignored without a draft): 0 = off (chains only),
                             TANDEM_SPEC_TREE_AUTO = the controller chooses chain or tree
                             and the node budget from measured acceptance and costs, N in
                             [1, TANDEM_SPEC_TREE_MAX] = a tree of at most N draft nodes
                             every step (EAGLE-2's dynamic tree); default 0.  With
                             spec_ngram on and greedy decoding a tree also holds the
                             n-gram lookups' continuations (of the text, and of the text
                             and the tree's likeliest path), and a step of lookups alone
                             verifies up to 4 matches' continuations as one tree
                             (SpecInfer's merged tree of several speculators; at most
                             TANDEM_SPEC_TREE_MAX nodes in all) */
    const char *spec_tree_shape; /* a static tree instead, its branching factor per depth:
                             "4,2,2,1" (at most TANDEM_SPEC_TREE_MAX nodes); NULL = none
                             (spec_tree decides); copied at submission; default NULL */
    /* BENCHMARK ONLY, never a default: controlled acceptance at real cost.  The
     * target's own greedy continuation of this prompt (from a target-only run),
     * bench_n_oracle tokens; at each drafted position on that continuation the
     * draft's candidates are rearranged: its next token comes first with probability
     * bench_oracle_alpha in [0, 1], else second with probability 1/2, else it is
     * not proposed.  The draft runs its real forward; verification is unchanged, so
     * the output is still the target's.  Needs greedy decoding and an engine of one
     * sequence; turns n-gram lookup off.  Copied at submission. */
    const int32_t *bench_oracle_tokens; /* default NULL (off) */
    int bench_n_oracle;                 /* default 0 */
    float bench_oracle_alpha;           /* default 0 */
    tandem_token_cb on_token; /* optional streaming callback; default NULL */
    void *user_data;          /* passed to on_token; default NULL */
    bool ignore_eos;          /* generate max_tokens tokens whatever they are (an
                                 end-of-generation token does not stop it): for
                                 benchmarks; default false */
    const char *const *stop;  /* [n_stop] stop strings (UTF-8, 1..TANDEM_STOP_LEN_MAX bytes
                                 each): generation ends when the text contains one, cut
                                 before it (finish reason stop; tokens keep the one that
                                 completed it).  Copied when the request starts; default NULL */
    int n_stop;               /* [0, TANDEM_STOP_MAX]; default 0 */
    /* Grammar-constrained decoding (at most one of the two; both set:
     * TANDEM_ERR_INVALID_ARG).  Every token is drawn from the model's distribution
     * restricted to the tokens the grammar allows next (greedy: the best of them), the
     * draft's proposals and every verified position likewise, so that speculation
     * keeps the constrained output exactly (greedy) or its distribution (sampled);
     * end of generation only where the text is complete, and a text that nothing can
     * follow ends the request (finish reason stop).  Compiled when the request is
     * submitted: an invalid one fails it with TANDEM_ERR_INVALID_ARG naming where
     * ("grammar: line 3:7: ...", "json_schema: #/properties/a: ..."), as does one that no
     * token of the vocabulary can begin.  Token trees (spec_tree) too: each node's
     * children are drafted under the grammar's state after its path, and its verified
     * row is masked with that state.  A sampled one on an engine of one sequence is
     * verified by rejection sampling with masked target and draft distributions
     * (where the draft's q rows are on the host: the CPU; multi-candidate for a tree),
     * else by agreement with the target's own masked draws. */
    const char *grammar;      /* GBNF text (llama.cpp's syntax, a `root` rule); NULL = none;
                                 default NULL */
    const char *json_schema;  /* a JSON schema (OpenAI's strict subset and more; the
                                 keywords: src/grammar/json_schema.h); `{"type":"object"}`
                                 is JSON mode (any JSON object); NULL = none; default NULL */
    /* Penalties, logit_bias and min_tokens: the target's logits row of each generated
     * token is edited before the draw (in this order: logit_bias added; repetition
     * penalty; frequency and presence penalties subtracted; end-of-generation tokens
     * suppressed below min_tokens), and that edited distribution IS the one sampled
     * (greedy: its argmax).  Speculation stays lossless: verified row d of a drafted
     * chain is edited with the counts of the committed text plus the chain's first d
     * tokens, exactly as without speculation (the draft's rows are edited alike, for
     * acceptance); a token tree's node row with the counts of the committed text plus
     * the node's path.  A sampled one on an engine of one sequence is verified by
     * rejection sampling where the draft's q rows are on the host (the CPU), else by
     * agreement with the target's own draws. */
    float presence_penalty;   /* [-2, 2]: subtracted from the logit of every token that
                                 occurs in the generated text (OpenAI's; the prompt does
                                 not count); 0 = off; default 0 */
    float frequency_penalty;  /* [-2, 2]: times the token's count in the generated text,
                                 subtracted (OpenAI's); 0 = off; default 0 */
    float repetition_penalty; /* (0, 100]: every token that occurs in the prompt or the
                                 generated text has its logit divided by it when positive,
                                 multiplied when negative (vLLM's and llama.cpp's; the
                                 window is the whole prompt + generated text); 1 = off;
                                 default 1 */
    const tandem_logit_bias *logit_bias; /* [n_logit_bias]: token ids each given a bias
                                 (a token at most once); copied at submission; default NULL */
    int n_logit_bias;         /* [0, TANDEM_LOGIT_BIAS_MAX]; default 0 */
    int min_tokens;           /* [0, INT_MAX]: until this many tokens are generated,
                                 end-of-generation tokens are suppressed (their logits
                                 made unreachable) and stop strings are not looked for
                                 (vLLM's); 0 = off; default 0 */
    /* Log-probabilities of the generated tokens (tandem_token_logprob: under the
     * edited, masked distribution at temperature 1, before top_k / top_p / min_p),
     * the speculated ones' from the verifying forward's rows.  A sampled request with
     * logprobs on is verified by agreement with the target's draws (not by rejection
     * sampling); with token trees, a token's from its accepted node's parent row
     * (the bonus token's from the last accepted node's). */
    bool logprobs;            /* the results' logprobs array and on_token_lp's lp;
                                 default false */
    int top_logprobs;         /* [0, TANDEM_TOP_LOGPROBS_MAX] alternatives per token (needs
                                 logprobs when > 0); default 0 */
    tandem_token_lp_cb on_token_lp; /* on_token with the token's log-probabilities (at
                                 most one of on_token and on_token_lp is set); default NULL */
} tandem_generate_params;

TANDEM_API tandem_generate_params tandem_generate_default_params(void);

#define TANDEM_SPEC_HIST_MAX 33 /* histogram bins: accepted 0..32 tokens per step */

typedef struct tandem_spec_stats {
    uint64_t steps;          /* speculative steps (draft + verify) */
    uint64_t drafted;        /* draft tokens proposed */
    uint64_t accepted;       /* draft tokens accepted */
    double acceptance_rate;  /* accepted / drafted */
    double mean_accepted;    /* accepted / steps */
    int k_final;             /* speculation length chosen for the last step */
    uint64_t accept_hist[TANDEM_SPEC_HIST_MAX]; /* steps that accepted exactly i tokens */
    double draft_ms, verify_ms, other_ms;       /* time spent in each phase */
    uint64_t ngram_steps;    /* steps whose whole proposal came from n-gram lookup (in steps) */
    uint64_t ngram_drafted;  /* proposed tokens that came from lookup: those steps' (a lookup
                                tree's nodes), the lookup completions of drafted chains and
                                the lookup nodes of draft trees (in drafted) */
    uint64_t ngram_accepted; /* of them accepted (in accepted) */
    uint64_t forwards;       /* target forward passes after the prompt's (each commits >= 1 token) */
    uint64_t forward_tokens; /* tokens those forwards committed (tokens per forward: the ratio) */
    uint64_t tree_steps;     /* steps that verified a token tree, the draft's or lookups'
                                (in steps) */
    uint64_t tree_nodes;     /* nodes of those trees (in drafted) */
} tandem_spec_stats;

typedef struct tandem_result {
    tandem_status status;   /* TANDEM_OK; in tandem_generate_batch's results, the error that
                               ended this request alone (message in error) */
    char *error;            /* that error's message (malloc'ed), NULL when status is OK */
    int32_t *tokens;        /* generated tokens (malloc'ed; freed by tandem_result_free) */
    size_t n_tokens;
    char *text;             /* generated text, NUL-terminated (malloc'ed) */
    size_t n_prompt_tokens;
    tandem_finish_reason finish_reason;
    double prefill_ms;      /* prompt through the target (and the draft) + the first token;
                               0 when no token was generated (max_tokens 0: nothing runs) */
    double decode_ms;       /* every later token (n_tokens - 1 of them); 0 when there are none */
    double queue_ms;        /* from submission to the start of its prefill */
    size_t n_cached_tokens; /* prompt tokens whose K/V came from the prefix cache */
    int n_preemptions;      /* times it was preempted (blocks freed, recomputed later) */
    tandem_spec_stats spec; /* all zero without a draft */
    tandem_token_logprob *logprobs; /* [n_tokens] with params.logprobs, else NULL (malloc'ed;
                                       freed by tandem_result_free) */
} tandem_result;

/* Generates a completion of a text prompt (BOS added as the model asks).
 * On success fills *out (free with tandem_result_free). */
TANDEM_API tandem_status tandem_generate(tandem_engine *engine, const char *prompt,
                                         const tandem_generate_params *params, tandem_result *out);

/* The same from prompt token ids (used as given: no BOS is added). */
TANDEM_API tandem_status tandem_generate_ids(tandem_engine *engine, const int32_t *prompt, size_t n_prompt,
                                             const tandem_generate_params *params, tandem_result *out);

TANDEM_API void tandem_result_free(tandem_result *result);

/* One request of a batch (tandem_generate_batch) or of tandem_engine_submit. */
typedef struct tandem_request {
    const char *prompt;            /* text (BOS added as the model asks); NULL: prompt_ids;
                                      default NULL */
    const int32_t *prompt_ids;     /* [n_prompt_ids], used as given when prompt is NULL;
                                      default NULL */
    size_t n_prompt_ids;           /* default 0 */
    tandem_generate_params params; /* this request's parameters; its on_token is called
                                      on the thread that steps the engine; default
                                      tandem_generate_default_params() */
    int priority;                  /* higher runs first, first come first served within a
                                      priority; the lowest-priority, newest sequence is
                                      preempted when the KV cache is full; default 0 */
    double timeout_ms;             /* ends the request (finish reason timeout, the text so
                                      far) this long after its submission, >= 0; 0 = none;
                                      default 0 */
} tandem_request;

/* A request with no prompt and tandem_generate_default_params(), priority 0, no timeout. */
TANDEM_API tandem_request tandem_request_default(void);

/* Runs n requests together with continuous batching: up to the engine's n_seq_max
 * sequences decode at once, each step one forward of the target over all of their
 * rows (with batch_invariant, rows computed as each alone, so greedy output equals
 * tandem_generate's); a long prompt is prefilled in chunks beside the running
 * decodes (max_batch_tokens); a finished request leaves at once, frees its KV
 * blocks, and the next one (by priority, then array order) takes its place.  When
 * the KV cache is full the lowest-priority, newest sequence is preempted and
 * recomputed later (same output).
 * Speculation, with a draft: one step composes every sequence's proposal (the
 * draft model's chain or tree, or n-gram lookups where they pay) and the target
 * verifies them all in one batched forward, with one speculation length for the
 * batch chosen from measured costs (0 when verification costs more than it saves,
 * as at large batches); a lone request is the batch of one.  A sampled sequence
 * drafts with the uniforms its positions would draw with and keeps the drafted
 * tokens the target's own draws agree with, so a request's tokens never depend on
 * the others (same seed, same tokens); on an engine of one sequence (n_seq_max 1)
 * it is verified by rejection sampling instead (the same distribution, other
 * draws, more accepted).
 * results[i] (free each with tandem_result_free) is request i's result; a request
 * with a bad prompt or parameters, or that cannot fit the KV cache even alone,
 * fails alone: its status and error say why (finish reason error), the others
 * complete.  Returns TANDEM_OK when every request ran (whatever its own status),
 * TANDEM_ERR_INVALID_ARG for NULL arguments.  Thread-safe while the engine's own
 * thread runs (see below); otherwise not (as tandem_generate). */
TANDEM_API tandem_status tandem_generate_batch(tandem_engine *engine, const tandem_request *requests, size_t n,
                                               tandem_result *results);

/* ---------------------------------------------------- asynchronous use
 *
 * The engine is a scheduler: submitted requests wait in a priority queue, join the
 * running batch when a place and KV blocks are free, and leave it at once when they
 * finish (their KV blocks are freed then).  tandem_generate and
 * tandem_generate_batch are submit + run until those requests finish.  Two ways to
 * drive it:
 *   - the host calls tandem_engine_step in a loop (one iteration: one forward of the
 *     target over every running sequence's rows);
 *   - tandem_engine_start runs the steps on a thread of the engine, which sleeps when
 *     nothing is queued; tandem_engine_stop (or close) ends it.
 * Callbacks (params.on_token and on_finish) run on the thread that steps.  They may
 * call tandem_engine_submit and tandem_engine_cancel, nothing else on the engine
 * (step, start, stop and the blocking generate calls fail there with
 * TANDEM_ERR_INVALID_ARG).  While the engine's thread runs, tandem_generate and
 * tandem_generate_batch called from any thread submit and wait; tandem_engine_step
 * fails.  Otherwise (never started, or stopped, even while other threads wait in
 * tandem_generate) the blocking calls step the engine themselves, one caller at a
 * time: each steps while its own requests are unfinished, and every caller's
 * requests advance in each step. */

typedef uint64_t tandem_request_id; /* from 1, unique per engine */

/* Receives a finished request's result and owns it (free with tandem_result_free).
 * Called exactly once per submitted request: finished, failed, cancelled, timed out,
 * or cancelled by tandem_engine_close. */
typedef void (*tandem_finish_cb)(tandem_request_id id, tandem_result *result, void *user_data);

/* Queues a request (prompt, stop strings and ids are copied: the caller may free them
 * on return).  A bad prompt or bad parameters fail here, with no callback.
 * Thread-safe. */
TANDEM_API tandem_status tandem_engine_submit(tandem_engine *engine, const tandem_request *request,
                                              tandem_finish_cb on_finish, void *user_data,
                                              tandem_request_id *out_id);

/* Cancels a queued or running request: at the start of the next step it finishes
 * (reason cancelled, the text so far), its blocks are freed and on_finish is called.
 * TANDEM_ERR_INVALID_ARG for an id that is unknown or already finished.  Thread-safe. */
TANDEM_API tandem_status tandem_engine_cancel(tandem_engine *engine, tandem_request_id id);

/* One scheduler iteration.  *n_pending (optional): requests queued or running after
 * it.  TANDEM_ERR_INVALID_ARG while the engine's thread runs. */
TANDEM_API tandem_status tandem_engine_step(tandem_engine *engine, int *n_pending);

/* Starts / stops the engine's own scheduler thread.  stop waits for the current step
 * to end; queued and running requests stay and continue at the next start or step
 * (callers waiting in tandem_generate then step the engine themselves).  start on a
 * running engine and stop on a stopped one are no-ops returning OK; concurrent starts
 * and stops take effect one after another. */
TANDEM_API tandem_status tandem_engine_start(tandem_engine *engine);
TANDEM_API tandem_status tandem_engine_stop(tandem_engine *engine);

/* Counters of the scheduler (a consistent snapshot).  Thread-safe. */
typedef struct tandem_engine_stats {
    int n_waiting;              /* requests queued (including preempted ones) */
    int n_running;              /* sequences in the running batch */
    int kv_blocks_total;        /* blocks in the KV pool */
    int kv_blocks_free;         /* of them not used by any sequence (cached prefixes count
                                   as free: they are evicted when needed) */
    uint64_t n_submitted, n_finished, n_failed, n_cancelled, n_timeouts;
    uint64_t n_preemptions;
    uint64_t prompt_tokens;     /* prompt tokens of requests that started */
    uint64_t cached_tokens;     /* of them found in the prefix cache */
    uint64_t generated_tokens;
    uint64_t steps;             /* scheduler iterations that ran a forward */
    uint64_t spec_drafted, spec_accepted;
    uint64_t prefix_hits;       /* requests that started with at least one prompt block
                                   found in the prefix cache */
} tandem_engine_stats;

TANDEM_API tandem_status tandem_engine_get_stats(tandem_engine *engine, tandem_engine_stats *out);

#ifdef __cplusplus
}
#endif
#endif
