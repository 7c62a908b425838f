/* synth_vocab.c - a synthetic SentencePiece ("llama") vocabulary of any size for
 * synthetic models (synth.h).
 *
 * Token order:
 *   0 <unk> (type 2 unknown), 1 <s>, 2 </s> (type 3 control),
 *   3..258 <0x00>..<0xFF> (type 6 byte),
 *   then normal pieces (type 1): "▁", the 94 printable ASCII characters '!'..'~',
 *   and for length L = 1, 2, ...: every "▁" + L lower-case letters, then (L >= 2)
 *   every bare string of L letters, in lexicographic order, up to n_vocab.
 * Every piece is unique and every piece longer than one character is the merge of
 * two shorter ones, so SentencePiece merging reaches it.  Scores: 0 for the special
 * and byte tokens, -k for the k-th normal piece (shorter pieces merge first).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "synth.h"

#define N_SPECIAL 3
#define N_BYTE 256
#define MIN_VOCAB (N_SPECIAL + N_BYTE + 1)
#define MAX_WORD 8 /* 26^8 pieces: far beyond any vocabulary */
#define PIECE_CAP 16 /* "▁" (3 bytes) + MAX_WORD letters + NUL */

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_BYTE = 6 };

typedef struct vocab {
    char *arena;        /* [n_vocab][PIECE_CAP] */
    const char **toks;  /* [n_vocab] into arena */
    float *scores;      /* [n_vocab] */
    int32_t *types;     /* [n_vocab] */
    int32_t n, cap;
    int32_t n_normal;   /* normal pieces so far (for the scores) */
} vocab;

/* Appends a token; false once the vocabulary is full. */
static bool add(vocab *v, const char *text, int32_t type) {
    if (v->n == v->cap) return false;
    char *slot = v->arena + (size_t)v->n * PIECE_CAP;
    snprintf(slot, PIECE_CAP, "%s", text);
    v->toks[v->n] = slot;
    v->types[v->n] = type;
    v->scores[v->n] = type == TT_NORMAL ? -(float)v->n_normal++ : 0.0f;
    v->n++;
    return v->n < v->cap;
}

/* Every word of len letters (with the "▁" prefix or without), in order; false once full. */
static bool add_words(vocab *v, int len, bool prefix) {
    int idx[MAX_WORD] = {0};
    char text[PIECE_CAP];
    for (;;) {
        size_t k = 0;
        if (prefix) {
            memcpy(text, "\xe2\x96\x81", 3);
            k = 3;
        }
        for (int i = 0; i < len; i++) text[k++] = (char)('a' + idx[i]);
        text[k] = 0;
        if (!add(v, text, TT_NORMAL)) return false;
        int i = len - 1; /* odometer */
        while (i >= 0 && ++idx[i] == 26) idx[i--] = 0;
        if (i < 0) return true;
    }
}

static bool fill(vocab *v) {
    char text[PIECE_CAP];
    if (!add(v, "<unk>", TT_UNKNOWN) || !add(v, "<s>", TT_CONTROL) || !add(v, "</s>", TT_CONTROL)) return false;
    for (int b = 0; b < N_BYTE; b++) {
        snprintf(text, sizeof text, "<0x%02X>", b);
        if (!add(v, text, TT_BYTE)) return false;
    }
    if (!add(v, "\xe2\x96\x81", TT_NORMAL)) return false;
    for (char c = '!'; c <= '~'; c++) {
        text[0] = c;
        text[1] = 0;
        if (!add(v, text, TT_NORMAL)) return false;
    }
    for (int len = 1; len <= MAX_WORD; len++) {
        if (!add_words(v, len, true)) return false;
        if (len >= 2 && !add_words(v, len, false)) return false;
    }
    return false;
}

tandem_status tdm_synth_vocab(tdm_gguf_writer *w, int32_t n_vocab, tdm_err *err) {
    if (n_vocab < MIN_VOCAB)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "a synthetic vocabulary needs at least %d tokens, not %d",
                          MIN_VOCAB, (int)n_vocab);
    vocab v = {.cap = n_vocab};
    v.arena = tdm_mallocarray((size_t)n_vocab, PIECE_CAP);
    v.toks = tdm_mallocarray((size_t)n_vocab, sizeof *v.toks);
    v.scores = tdm_mallocarray((size_t)n_vocab, sizeof *v.scores);
    v.types = tdm_mallocarray((size_t)n_vocab, sizeof *v.types);
    tandem_status st = TANDEM_OK;
    if (!v.arena || !v.toks || !v.scores || !v.types) {
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory for a vocabulary of %d tokens", (int)n_vocab);
    } else {
        fill(&v); /* stops when full: 26^MAX_WORD pieces cannot run out */
        tdm_gguf_w_str(w, "tokenizer.ggml.model", "llama");
        tdm_gguf_w_str(w, "tokenizer.ggml.pre", "default");
        tdm_gguf_w_arr_str(w, "tokenizer.ggml.tokens", v.toks, (uint64_t)v.n);
        tdm_gguf_w_arr_f32(w, "tokenizer.ggml.scores", v.scores, (uint64_t)v.n);
        tdm_gguf_w_arr_i32(w, "tokenizer.ggml.token_type", v.types, (uint64_t)v.n);
        tdm_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", 1);
        tdm_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", 2);
        tdm_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", 0);
        tdm_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", true);
        tdm_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", false);
    }
    free(v.arena);
    free(v.toks);
    free(v.scores);
    free(v.types);
    return st;
}
