/* tok_pretok.h - the split rules pre-tokenizers are made of, shared by tok_pretok.c
 * (which runs a sequence of them over the text) and tok_pretok_rules.c (the rules).
 *
 * Each rule is one regex of a pre-tokenizer, written as code.  A pre-tokenizer is a
 * sequence of rules applied as Hugging Face's Split(pattern, "isolated") steps (and
 * llama.cpp's unicode_regex_split) apply theirs: each rule splits every piece the
 * previous one made, its matches and the text between them becoming pieces.  A rule
 * sees one piece at a time: the piece's end is the end of the text for it ($, (?!\S)).
 */
#ifndef TDM_TOK_PRETOK_H
#define TDM_TOK_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The decoded text: code points (an invalid UTF-8 byte is one code point
 * TDM_UTF8_INVALID | byte, with flags 0: of no category, as U+FFFD would be in the
 * references) and their TDM_UCD_* flags. */
typedef struct tok_cps {
    const uint32_t *cp;
    const uint16_t *fl;
} tok_cps;

typedef enum tok_rule_kind {
    RULE_GPT2,        /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    RULE_LLAMA3,      /* (?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,k}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    RULE_O200K,       /* [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|..)?|
                         [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|..)?|
                         \p{N}{1,k}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
    RULE_DEEPSEEK3,   /* [!-/:-@[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|
                         \s*[\r\n]+|\s+(?!\S)|\s+ */
    RULE_BLOOM,       /*  ?[^(\s|.,!?…。，、।۔،)]+ */
    RULE_RUN,         /* \s?[SET]+ (arg: tok_set, opts: RULE_WS_PREFIX) */
    RULE_NUMBERS,     /* \p{N}{1,k} (k = arg; 0: \p{N}+) */
    RULE_ASCII3,      /* [0-9][0-9][0-9] */
    RULE_NEWLINE,     /* [\r\n] */
    RULE_TRAILING_WS, /* \s+$ */
    RULE_LINES,       /* [^\n]+|[\n]+ */
    RULE_THOUSANDS,   /* (?=(\d{3})+(?!\d)): a run of \d split in groups of 3 from the right */
} tok_rule_kind;

/* Character sets of RULE_RUN. */
typedef enum tok_set {
    SET_LETTER,          /* \p{L} */
    SET_PUNCT,           /* \p{P} */
    SET_PUNCT_DEFAULT,   /* [\p{P}\$\+<=>\^~\|] */
    SET_PUNCT_FALCON,    /* [\p{P}\$\+<=>\^~\|`] */
    SET_DEEPSEEK_LATIN,  /* DeepSeek LLM's cased letters [A-Za-zµÀ-ÖØ-öø-ƺ...] */
    SET_DEEPSEEK_PUNCT,  /* [!-/:-~！-／：-～‘-‟　-。] */
    SET_DEEPSEEK_CJK,    /* [一-龥ࠀ-一가-퟿] */
    SET_CJK_KANA,        /* [一-龥぀-ゟ゠-ヿ] */
} tok_set;

/* Options. */
enum {
    RULE_CONTRACTIONS = 1 << 0, /* LLAMA3, O200K: with the contractions */
    RULE_MARKS = 1 << 1,        /* LLAMA3: \p{M} counts as a letter (Qwen 3.5) */
    RULE_PUNCT_NL = 1 << 2,     /* LLAMA3: a punctuation run takes the newlines after it */
    RULE_WS_PREFIX = 1 << 3,    /* RUN: \s? before the run */
};

typedef struct tok_rule {
    uint8_t kind;  /* tok_rule_kind */
    uint8_t arg;   /* digits per number piece, or the tok_set */
    uint8_t opts;
} tok_rule;

/* Piece ends in code points (increasing; piece k = [v[k-1], v[k])). */
typedef struct tok_ends {
    size_t *v;
    size_t n, cap;
} tok_ends;

bool tok_ends_push(tok_ends *o, size_t end); /* false when out of memory */

/* Splits the piece [start, end) by rule r: pushes the end of each match and of each
 * stretch between matches, the last one end.  False when out of memory. */
bool tok_rule_split(const tok_rule *r, const tok_cps *t, size_t start, size_t end, tok_ends *out);

#endif
