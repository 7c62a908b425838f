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

typedef enum tok_pre {
    TOK_PRE_GPT2,      /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    TOK_PRE_LLAMA3,    /* (?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    TOK_PRE_QWEN2,     /* as LLAMA3 with \p{N} (single digits) */
    TOK_PRE_STARCODER, /* \p{N} split first, then GPT2 */
} tok_pre;

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
    int32_t eog[TDM_TOK_EOG_MAX];  /* every end-of-generation id: eos, eot, eom, and the
                                      special tokens of end-of-turn texts (tokenizer.c) */
    int32_t n_eog;
    bool add_bos;
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
