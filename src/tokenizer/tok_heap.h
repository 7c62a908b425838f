/* tok_heap.h - a binary heap over a value type, generated for the merge queues of
 * the BPE and SentencePiece tokenizers.
 *
 *   TDM_HEAP_DEFINE(NAME, T, BEFORE) defines
 *     typedef struct NAME { T *v; size_t n, cap; } NAME;   (zero-initialise; free(h.v))
 *     static bool NAME##_push(NAME *h, T x);   false when out of memory
 *     static T NAME##_pop(NAME *h);            h->n > 0; the element first by BEFORE
 *   where BEFORE(const T *a, const T *b) is true when a must come out before b.
 */
#ifndef TDM_TOK_HEAP_H
#define TDM_TOK_HEAP_H

#include <stdbool.h>
#include <stdlib.h>

#define TDM_HEAP_DEFINE(NAME, T, BEFORE)                                      \
    typedef struct NAME {                                                    \
        T *v;                                                                \
        size_t n, cap;                                                       \
    } NAME;                                                                  \
                                                                             \
    static bool NAME##_push(NAME *h, T x) {                                  \
        if (h->n == h->cap) {                                                \
            size_t nc = h->cap ? h->cap * 2 : 64;                            \
            T *nv = realloc(h->v, nc * sizeof *nv);                          \
            if (!nv) return false;                                           \
            h->v = nv;                                                       \
            h->cap = nc;                                                     \
        }                                                                    \
        size_t i = h->n++;                                                   \
        while (i > 0) {                                                      \
            size_t p = (i - 1) / 2;                                          \
            if (!BEFORE(&x, &h->v[p])) break;                                \
            h->v[i] = h->v[p];                                               \
            i = p;                                                           \
        }                                                                    \
        h->v[i] = x;                                                         \
        return true;                                                         \
    }                                                                        \
                                                                             \
    static T NAME##_pop(NAME *h) {                                           \
        T top = h->v[0];                                                     \
        T x = h->v[--h->n];                                                  \
        size_t i = 0;                                                        \
        for (;;) {                                                           \
            size_t c = 2 * i + 1;                                            \
            if (c >= h->n) break;                                            \
            if (c + 1 < h->n && BEFORE(&h->v[c + 1], &h->v[c])) c++;         \
            if (!BEFORE(&h->v[c], &x)) break;                                \
            h->v[i] = h->v[c];                                               \
            i = c;                                                           \
        }                                                                    \
        if (h->n) h->v[i] = x;                                               \
        return top;                                                          \
    }

#endif
