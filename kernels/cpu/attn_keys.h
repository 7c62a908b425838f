/* attn_keys.h - the key vectors of an attention score call (kernel table attn_qk),
 * shared by the SIMD levels' kernels (plain C, inlined into each ISA file).
 *
 * The first cnt slots of K blocks kt[0], kt[1], ... (bs slots each, per block
 * [hd][bs]) are cut into vectors of up to `width` consecutive slots of one block;
 * a kernel takes them `nmax` at a time and scores every query vector against them.
 */
#ifndef TDM_ATTN_KEYS_H
#define TDM_ATTN_KEYS_H

#include <stddef.h>
#include <stdint.h>

typedef struct tdm_kvec {
    const uint8_t *k; /* element (d, first slot) is at k + d * bs * esz */
    float *s;         /* scores of the first query vector for these slots */
    int32_t len;      /* slots in the vector, 0 for padding (k, s valid, never read) */
} tdm_kvec;

/* Cursor over the key vectors: block b, slot offset off inside it. */
typedef struct tdm_kcursor {
    const void *const *kt;
    float *s;
    int32_t bs, cnt, width, b, off;
    size_t esz;
} tdm_kcursor;

/* Fills v[0..nmax) with the next key vectors (padding past the last one); returns
 * how many are real, 0 when none are left. */
static inline int tdm_kcursor_next(tdm_kcursor *c, int nmax, tdm_kvec *v) {
    int n = 0;
    for (; n < nmax && (int64_t)c->b * c->bs + c->off < c->cnt; n++) {
        int32_t j0 = c->b * c->bs + c->off, len = c->bs - c->off;
        if (len > c->width) len = c->width;
        if (len > c->cnt - j0) len = c->cnt - j0;
        v[n].k = (const uint8_t *)c->kt[c->b] + (size_t)c->off * c->esz;
        v[n].s = c->s + j0;
        v[n].len = len;
        if ((c->off += c->width) >= c->bs) {
            c->b++;
            c->off = 0;
        }
    }
    for (int i = n; n > 0 && i < nmax; i++) v[i] = (tdm_kvec){v[0].k, v[0].s, 0};
    return n;
}

/* Query vectors in balanced groups of at most gmax: group g has base + (g < extra). */
static inline void tdm_balanced_groups(int32_t n, int32_t gmax, int32_t *groups, int32_t *base, int32_t *extra) {
    *groups = (n + gmax - 1) / gmax;
    *base = n / *groups;
    *extra = n % *groups;
}

#endif
