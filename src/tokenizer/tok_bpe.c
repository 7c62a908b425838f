/* tok_bpe.c - byte-level BPE merging of one pre-token.
 *
 * Symbols start as the word's bytes (each byte is one character of the GPT-2
 * byte-level alphabet, so its token is t->byte_tok[byte]).  Adjacent pairs with a
 * merge rule go into a min-heap ordered by (rank, left position); popping applies
 * the lowest-ranked, leftmost merge first, as llama.cpp and HF tokenizers do.
 * Stale heap entries (a side already merged away) are skipped lazily.
 */
#include <stdlib.h>
#include <string.h>

#include "tok_heap.h"
#include "tok_internal.h"
#include "unicode.h"

typedef struct bigram {
    int32_t rank;
    int32_t left, right;     /* symbol indices */
    int32_t id_left, id_right;
    int32_t result;
} bigram;

static bool before(const bigram *a, const bigram *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

TDM_HEAP_DEFINE(heap, bigram, before)

static const tok_merge_slot *merge_find(const tok_mergemap *m, int32_t l, int32_t r) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    uint64_t hsh = key * 0x9E3779B97F4A7C15ull;
    uint32_t i = (uint32_t)(hsh >> 32) & m->mask;
    for (;;) {
        const tok_merge_slot *s = &m->slots[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mask;
    }
}

typedef struct sym {
    int32_t id;         /* token id, -1 if the byte has no token */
    int32_t prev, next; /* neighbour indices, -1 at the ends */
    bool alive;
} sym;

static bool try_pair(const tdm_tokenizer *t, const sym *s, int32_t l, int32_t r, heap *h) {
    if (l < 0 || r < 0 || s[l].id < 0 || s[r].id < 0) return true;
    const tok_merge_slot *m = merge_find(&t->merges, s[l].id, s[r].id);
    if (!m) return true;
    bigram b = {m->rank, l, r, s[l].id, s[r].id, m->result};
    return heap_push(h, b);
}

bool tok_bpe_word(const tdm_tokenizer *t, const char *word, size_t len, tok_ids *out) {
    if (len == 0) return true;
    const uint8_t *u = (const uint8_t *)word;
    if (t->ignore_merges && len <= (size_t)t->max_piece) {
        /* the whole pre-token as one token when the vocabulary has it (no token is
         * longer than max_piece, and a byte's character takes 1 or 2 bytes) */
        char stack[256 * 2], *enc = len <= 256 ? stack : tdm_malloc(2 * len);
        if (!enc) return false;
        size_t n = 0;
        for (size_t i = 0; i < len; i++) n += (size_t)tdm_utf8_encode(tdm_byte_to_cp(u[i]), enc + n);
        int32_t id = tok_lookup(t, enc, n);
        if (enc != stack) free(enc);
        if (id >= 0) return tok_ids_push(out, id);
    }
    if (len == 1) {
        if (t->byte_tok[u[0]] >= 0) return tok_ids_push(out, t->byte_tok[u[0]]);
        return true;
    }
    if (len > INT32_MAX / 2) return false;
    sym *s = tdm_mallocarray(len, sizeof *s);
    if (!s) return false;
    heap h = {0};
    bool ok = true;
    for (size_t i = 0; i < len; i++) {
        s[i].id = t->byte_tok[u[i]];
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < len ? (int32_t)i + 1 : -1;
        s[i].alive = true;
    }
    for (size_t i = 1; i < len && ok; i++) ok = try_pair(t, s, (int32_t)i - 1, (int32_t)i, &h);
    while (ok && h.n) {
        bigram b = heap_pop(&h);
        sym *l = &s[b.left], *r = &s[b.right];
        if (!l->alive || !r->alive || l->next != b.right || l->id != b.id_left || r->id != b.id_right)
            continue; /* stale */
        l->id = b.result;
        r->alive = false;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        ok = try_pair(t, s, l->prev, b.left, &h) && try_pair(t, s, b.left, l->next, &h);
    }
    for (int32_t i = 0; ok && i >= 0; i = s[i].next)
        if (s[i].id >= 0) ok = tok_ids_push(out, s[i].id);
    free(h.v);
    free(s);
    return ok;
}
