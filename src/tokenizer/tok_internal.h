/* tok_internal.h - private layout of tdm_tokenizer shared by tokenizer.c,
 * tok_bpe.c, tok_spm.c and tok_pretok.c. */
#ifndef TDM_TOK_INTERNAL_H
#define TDM_TOK_INTERNAL_H

#include "tokenizer.h"

/* GGUF token types (tokenizer.ggml.token_type). */
enum {
    TOK_TYPE_UNDEFINED = 0,
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

typedef enum tok_model { TOK_MODEL_BPE, TOK_MODEL_SPM } tok_model;

/* Pre-tokenizers: the distinct split behaviours (tok_pretok.c has each one's regex
 * sequence; tok_pretok_names.c maps the tokenizer.ggml.pre names onto them). */
typedef enum tok_pre {
    TOK_PRE_GPT2,           /* GPT-2's regex */
    TOK_PRE_DEFAULT,        /* llama.cpp's default: punctuation runs, GPT-2, \p{N}+, [0-9]{3} */
    TOK_PRE_FALCON,         /* punctuation runs, GPT-2, [0-9]{3} */
    TOK_PRE_STARCODER,      /* each \p{N} alone, then GPT-2 */
    TOK_PRE_LLAMA3,         /* Llama 3's regex: contractions, letters, \p{N}{1,3}, ... */
    TOK_PRE_QWEN2,          /* Llama 3's with single digits */
    TOK_PRE_QWEN35,         /* Qwen2's with \p{M} joining letters */
    TOK_PRE_SEED_CODER,     /* Qwen2's, punctuation runs not taking newlines */
    TOK_PRE_NO_CONTRACTION, /* Qwen2's without the contractions */
    TOK_PRE_LAGUNA,         /* lines and newline runs, then Qwen2's */
    TOK_PRE_GPT4O,          /* o200k: case-aware letter runs with contractions, \p{N}{1,3} */
    TOK_PRE_TEKKEN,         /* o200k's without contractions, single digits */
    TOK_PRE_DEEPSEEK_LLM,   /* newlines, cased letters, punctuation, trailing spaces, CJK, \p{N}+ */
    TOK_PRE_DEEPSEEK_CODER, /* newlines, \s?\p{L}+, \s?\p{P}+, CJK, each \p{N} */
    TOK_PRE_DEEPSEEK3,      /* \p{N}{1,3}, CJK and kana, then a Llama-3-like regex */
    TOK_PRE_BLOOM,          /* " ?[^(\s|.,!?...)]+" */
    TOK_PRE_VIKING,         /* BLOOM's, then each \p{N} */
    TOK_PRE_SUPERBPE,       /* \p{N}+ split into groups of 3 from the right */
    TOK_PRE_COUNT
} tok_pre;

/* What a tokenizer.ggml.pre name selects besides its split behaviour, as llama.cpp
 * sets it: merges skipped for a pre-token that is in the vocabulary, and
 * add_bos_token's default. */
typedef struct tok_pre_info {
    tok_pre pre;
    bool ignore_merges;
    bool add_bos;
} tok_pre_info;

typedef enum tok_pre_lookup {
    TOK_PRE_FOUND,
    TOK_PRE_NOT_IMPLEMENTED, /* a name llama.cpp knows, of a behaviour tandem lacks */
    TOK_PRE_UNKNOWN,
} tok_pre_lookup;

/* Looks a tokenizer.ggml.pre name up (not NUL-terminated). */
tok_pre_lookup tok_pre_find(const char *name, size_t len, tok_pre_info *out);

/* Open-addressing hash index from token text to id. */
typedef struct tok_strmap {
    uint32_t mask;     /* capacity - 1 (power of two) */
    int32_t *slots;    /* [mask + 1] token id, -1 = empty */
} tok_strmap;

/* (left id, right id) -> merge rank and resulting token id. */
typedef struct tok_merge_slot {
    uint64_t key;      /* (uint64_t)left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} tok_merge_slot;

typedef struct tok_mergemap {
    uint32_t mask;
    tok_merge_slot *slots; /* [mask + 1] */
} tok_mergemap;

struct tdm_tokenizer {
    tok_model model;
    tok_pre pre;
    int32_t n_vocab;
    char *arena;          /* all token texts, then all decoded pieces, NUL-separated */
    uint64_t *text_off;   /* [n_vocab] raw text offsets into arena */
    uint32_t *text_len;   /* [n_vocab] */
    uint64_t *piece_off;  /* [n_vocab] decoded piece (render_special = false) */
    uint32_t *piece_len;  /* [n_vocab] */
    float *scores;        /* [n_vocab] SPM scores (0 when absent) */
    uint8_t *type;        /* [n_vocab] TOK_TYPE_* */
    tok_strmap index;     /* text -> id */
    tok_mergemap merges;  /* BPE only */
    int32_t byte_tok[256];/* BPE: token of each byte's GPT-2 char; SPM: <0xXX>; -1 if none */
    int32_t *specials;    /* [n_specials] control/user-defined/unknown ids, longest text first */
    int32_t n_specials;
    int32_t bos, eos, eot, eom, unk; /* -1 if none */
    int32_t *eog;         /* [n_eog] end-of-generation tokens, sorted */
    int32_t n_eog;
    bool add_bos, add_eos;
    bool add_space_prefix; /* SPM */
    bool ignore_merges;    /* BPE llama-bpe: a whole pre-token in the vocab is taken as is */
    int32_t max_piece;     /* longest token_to_piece output (render_special = true) */
};

static inline const char *tok_text(const tdm_tokenizer *t, int32_t id) { return t->arena + t->text_off[id]; }

/* Text -> id (-1 if absent). */
int32_t tok_lookup(const tdm_tokenizer *t, const char *s, size_t len);

/* Growable id output vector. */
typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
} tok_ids;

bool tok_ids_push(tok_ids *o, int32_t id);

/* Pre-tokenizer: splits text[0..len) into pieces; each piece is [start, end) in
 * bytes; *ends receives the end offset of each piece (the first starts at 0).
 * Returns false on allocation failure. */
typedef struct tok_spans {
    size_t *end;   /* [n] end offsets, increasing; piece i = [end[i-1], end[i]) */
    size_t n, cap;
} tok_spans;

bool tok_pretokenize(tok_pre pre, const char *text, size_t len, tok_spans *out);

/* Byte-level BPE of one pre-token (raw bytes); appends ids. */
bool tok_bpe_word(const tdm_tokenizer *t, const char *word, size_t len, tok_ids *out);

/* SentencePiece BPE of escaped text (spaces already U+2581); appends ids. */
bool tok_spm_encode(const tdm_tokenizer *t, const char *text, size_t len, tok_ids *out);

#endif
