/* tokenizer.h - GGUF tokenizers: byte-level BPE ("gpt2") and SentencePiece ("llama").
 *
 * Built from a GGUF's tokenizer.ggml.* metadata (a vocabulary-only GGUF is
 * enough).  Supported:
 *   - tokenizer.ggml.model = "gpt2": byte-level BPE with merges; the pre-tokenizer
 *     named by tokenizer.ggml.pre, as llama.cpp names them (tok_pretok_names.c;
 *     llama.cpp's "default" when absent); an unknown name is an error.
 *   - tokenizer.ggml.model = "llama": SentencePiece BPE over scores, byte fallback
 *     (<0xXX> tokens), the leading-space rule (add_space_prefix, default true);
 *     tokenizer.ggml.pre is not read.
 * Control tokens written in the text become those tokens when parse_special is set,
 * user-defined ones always.  BOS/EOS/EOT/EOM ids and add_bos_token / add_eos_token
 * come from metadata, with llama.cpp's defaults.
 *
 * Byte-level BPE needs a token for every byte of the text; a vocabulary without one
 * for some byte (StarCoder's has none for 0xC0, 0xC1, 0xF1, 0xF5-0xFF) skips that
 * byte when encoding, as the byte has no representation in it.
 *
 * Immutable after load: safe to share across threads.
 */
#ifndef TDM_TOKENIZER_H
#define TDM_TOKENIZER_H

#include "common.h"
#include "gguf.h"

typedef struct tdm_tokenizer tdm_tokenizer;

tandem_status tdm_tokenizer_load(const tdm_gguf *g, tdm_tokenizer **out, tdm_err *err);
void tdm_tokenizer_free(tdm_tokenizer *t); /* NULL is a no-op */

int32_t tdm_tok_n_vocab(const tdm_tokenizer *t);
int32_t tdm_tok_bos(const tdm_tokenizer *t);  /* -1 if none */
int32_t tdm_tok_eos(const tdm_tokenizer *t);  /* -1 if none */
bool tdm_tok_add_bos(const tdm_tokenizer *t); /* tokenizer.ggml.add_bos_token */
/* True for end-of-generation tokens: EOS, EOT, EOM and the tokens llama.cpp treats so
 * by their text (<|im_end|>, <end_of_turn>, <|eot_id|>, <|endoftext|>, ...). */
bool tdm_tok_is_eog(const tdm_tokenizer *t, int32_t id);
#define TDM_TOK_EOG_MAX 32 /* (the most tdm_tok_eog_ids can give: 6 ids + the texts) */
/* The end-of-generation ids, ascending (at most TDM_TOK_EOG_MAX); returns the count. */
int32_t tdm_tok_eog_ids(const tdm_tokenizer *t, const int32_t **ids);
/* True for the vocabulary's special tokens: control tokens (tokenizer.ggml.token_type
 * 3: <|im_end|>, <|endoftext|>, ...) and user-defined ones (4: tokens added to the
 * vocabulary, such as Qwen's <tool_call>); false for other ids and out of range. */
bool tdm_tok_is_special(const tdm_tokenizer *t, int32_t id);
/* Longest output of tdm_token_to_piece over the vocabulary (render_special = true). */
int32_t tdm_tok_max_piece(const tdm_tokenizer *t);
/* The raw vocabulary string of a token (as stored in the GGUF); NULL if out of range. */
const char *tdm_tok_text(const tdm_tokenizer *t, int32_t id, size_t *len);

/* Encodes UTF-8 text (invalid UTF-8 is encoded byte-wise, never rejected).
 * *ids is malloc'ed (free()).  add_special adds the special tokens the vocabulary
 * asks for, as llama.cpp's add_special: BOS first when add_bos_token, EOS last when
 * add_eos_token. */
tandem_status tdm_tokenize(const tdm_tokenizer *t, const char *text, size_t len, bool add_special,
                           bool parse_special, int32_t **ids, size_t *n_ids, tdm_err *err);

/* The bytes a token decodes to (byte-level BPE decoded; SentencePiece: U+2581 -> ' ',
 * <0xXX> -> that byte; control tokens -> "" unless render_special).  Returns the
 * byte count, which may exceed cap (then nothing is written beyond cap); -1 for an
 * invalid id. */
int32_t tdm_token_to_piece(const tdm_tokenizer *t, int32_t id, bool render_special, char *buf,
                           int32_t cap);

/* Streaming decoder: holds back incomplete UTF-8 sequences across tokens so it
 * never emits half a code point. */
typedef struct tdm_detok {
    char pending[8];
    int32_t n_pending;
    bool first;        /* SentencePiece: strip the leading space of the first piece */
} tdm_detok;

void tdm_detok_init(tdm_detok *d, const tdm_tokenizer *t);
/* Appends the token's bytes; writes the complete characters now available into out
 * (cap >= tdm_tok_max_piece(t) + 8 is always enough for one token; 256 + 8 for
 * usual vocabularies) and returns their count; -1 for an invalid id or a too small
 * cap (then nothing is consumed).  Control tokens decode to "". */
int32_t tdm_detok_push(tdm_detok *d, const tdm_tokenizer *t, int32_t id, char *out, int32_t cap);
/* Flushes what is held back (an incomplete sequence at the very end); cap >= 8. */
int32_t tdm_detok_flush(tdm_detok *d, char *out, int32_t cap);

#endif
