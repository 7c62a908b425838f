/* tok_spm.c - SentencePiece BPE (GGUF "llama" vocabularies).
 *
 * Symbols start as UTF-8 characters (an invalid byte is a symbol of its own).
 * Every adjacent pair whose concatenation is a vocabulary token goes into a
 * max-heap ordered by (token score desc, left position asc); popping merges the
 * best pair.  Each final symbol is emitted as its token, or byte by byte through
 * the <0xXX> tokens (byte fallback; the unknown token when those are missing).
 */
#include <stdlib.h>
#include <string.h>

#include "tok_heap.h"
#include "tok_internal.h"
#include "unicode.h"

typedef struct sbigram {
    float score;
    int32_t left, right; /* symbol indices */
    size_t size;         /* bytes of the merged text */
} sbigram;

static bool better(const sbigram *a, const sbigram *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

TDM_HEAP_DEFINE(sheap, sbigram, better)

typedef struct ssym {
    size_t off, n;      /* bytes text[off .. off+n); n = 0 once merged away */
    int32_t prev, next;
} ssym;

static bool try_pair(const tdm_tokenizer *t, const char *text, const ssym *s, int32_t l, int32_t r,
                     sheap *h) {
    if (l < 0 || r < 0) return true;
    size_t size = s[l].n + s[r].n;
    int32_t id = tok_lookup(t, text + s[l].off, size);
    if (id < 0) return true;
    sbigram b = {t->scores[id], l, r, size};
    return sheap_push(h, b);
}

static bool emit_bytes(const tdm_tokenizer *t, const char *p, size_t n, tok_ids *out) {
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[(uint8_t)p[i]];
        if (id < 0) id = t->unk;
        if (id >= 0 && !tok_ids_push(out, id)) return false;
    }
    return true;
}

bool tok_spm_encode(const tdm_tokenizer *t, const char *text, size_t len, tok_ids *out) {
    if (len == 0) return true;
    if (len > INT32_MAX / 2) return false;
    ssym *s = tdm_mallocarray(len, sizeof *s);
    if (!s) return false;
    int32_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        int k = tdm_utf8_decode((const uint8_t *)text + i, len - i, &cp);
        s[n].off = i;
        s[n].n = (size_t)k;
        s[n].prev = n - 1;
        s[n].next = n + 1;
        n++;
        i += (size_t)k;
    }
    s[n - 1].next = -1;
    sheap h = {0};
    bool ok = true;
    for (int32_t i = 1; i < n && ok; i++) ok = try_pair(t, text, s, i - 1, i, &h);
    while (ok && h.n) {
        sbigram b = sheap_pop(&h);
        ssym *l = &s[b.left], *r = &s[b.right];
        if (l->n == 0 || r->n == 0 || l->n + r->n != b.size) continue; /* stale */
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) s[r->next].prev = b.left;
        ok = try_pair(t, text, s, l->prev, b.left, &h) && try_pair(t, text, s, b.left, l->next, &h);
    }
    for (int32_t i = 0; ok && i >= 0; i = s[i].next) {
        int32_t id = tok_lookup(t, text + s[i].off, s[i].n);
        if (id >= 0) ok = tok_ids_push(out, id);
        else ok = emit_bytes(t, text + s[i].off, s[i].n, out);
    }
    free(h.v);
    free(s);
    return ok;
}
