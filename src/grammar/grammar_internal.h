/* grammar_internal.h - the compiled form of a grammar, shared by the parser
 * (grammar_parse.c), its checks (grammar_check.c), the matcher (gmatch.c) and the
 * mask (gmask.c).  Not for use outside src/grammar.
 *
 * A grammar is an array of elements.  Rule r starts at el[rule_start[r]]: its
 * alternatives one after another, each a sequence of REF and TERM elements, separated
 * by ALT, the last one followed by END.  An empty alternative is an ALT or END right
 * where the alternative starts.
 */
#ifndef TDM_GRAMMAR_INTERNAL_H
#define TDM_GRAMMAR_INTERNAL_H

#include "grammar.h"

enum { GE_END = 0, GE_ALT = 1, GE_REF = 2, GE_TERM = 3 };

typedef struct gelem {
    uint32_t type; /* GE_* */
    uint32_t val;  /* GE_REF: the rule; GE_TERM: the character class */
} gelem;

/* A set of code points: ranges rng[2 * off ...] as inclusive [lo, hi] pairs, sorted
 * and disjoint; neg: the complement. */
typedef struct gclass {
    uint32_t off, n;
    bool neg;
} gclass;

struct tdm_grammar {
    gelem *el;            /* [n_el] */
    uint32_t n_el;
    uint32_t *rule_start; /* [n_rules] index into el */
    uint32_t n_rules;
    uint32_t root;
    uint32_t *alt_off;    /* [n_rules + 1] CSR: rule r's alternatives start at ... */
    uint32_t *alt;        /* [n_alts] ... el[alt[alt_off[r] ...]] */
    gclass *cls;          /* [n_cls] */
    uint32_t n_cls;
    uint32_t *rng;        /* [2 * n_rng] */
    uint32_t n_rng;
};

static inline bool gclass_has(const tdm_grammar *g, uint32_t c, uint32_t cp) {
    const gclass *k = &g->cls[c];
    const uint32_t *r = g->rng + 2 * (size_t)k->off;
    uint32_t lo = 0, hi = k->n; /* binary search over the sorted ranges */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cp < r[2 * mid]) hi = mid;
        else if (cp > r[2 * mid + 1]) lo = mid + 1;
        else return !k->neg;
    }
    return k->neg;
}

/* Whether the class holds some code point of [a, b]. */
static inline bool gclass_meets(const tdm_grammar *g, uint32_t c, uint32_t a, uint32_t b) {
    const gclass *k = &g->cls[c];
    const uint32_t *r = g->rng + 2 * (size_t)k->off;
    if (!k->neg) {
        for (uint32_t i = 0; i < k->n; i++)
            if (r[2 * i] <= b && r[2 * i + 1] >= a) return true;
        return false;
    }
    /* complement: some point of [a, b] outside every range */
    uint32_t x = a;
    for (uint32_t i = 0; i < k->n && x <= b; i++) {
        if (r[2 * i + 1] < x) continue;
        if (r[2 * i] > x) return true;
        if (r[2 * i + 1] >= b) return false;
        x = r[2 * i + 1] + 1;
    }
    return x <= b;
}

/* One incomplete UTF-8 sequence: the bits so far, continuation bytes still to come
 * (0: none pending) and the sequence's length. */
typedef struct gutf8 {
    uint32_t cp;
    uint8_t left, total;
} gutf8;

/* Adds byte b: -1 invalid UTF-8 (or an overlong form, a surrogate, above U+10FFFF),
 * 0 incomplete, 1 a code point (u->cp) complete. */
static inline int gutf8_step(gutf8 *u, uint8_t b) {
    if (u->left == 0) {
        if (b < 0x80) { u->cp = b; u->total = 1; return 1; }
        if (b >= 0xC2 && b <= 0xDF) u->cp = b & 0x1Fu, u->left = 1, u->total = 2;
        else if (b >= 0xE0 && b <= 0xEF) u->cp = b & 0x0Fu, u->left = 2, u->total = 3;
        else if (b >= 0xF0 && b <= 0xF4) u->cp = b & 0x07u, u->left = 3, u->total = 4;
        else return -1;
        return 0;
    }
    if ((b & 0xC0) != 0x80) return -1;
    u->cp = (u->cp << 6) | (b & 0x3Fu);
    if (--u->left > 0) return 0;
    uint32_t c = u->cp;
    if ((u->total == 3 && c < 0x800) || (u->total == 4 && (c < 0x10000 || c > 0x10FFFF)) || (c >= 0xD800 && c <= 0xDFFF))
        return -1;
    return 1;
}

/* The code points an incomplete sequence can still become: [*lo, *hi]. */
static inline void gutf8_range(const gutf8 *u, uint32_t *lo, uint32_t *hi) {
    uint32_t sh = 6u * u->left;
    uint32_t a = u->cp << sh, b = a | ((1u << sh) - 1);
    static const uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (a < min_of[u->total]) a = min_of[u->total];
    if (b > 0x10FFFF) b = 0x10FFFF;
    *lo = a, *hi = b;
}

/* ---- the matcher (gmatch.c), shared with the mask walk (gmask.c) ---- */

/* A stack node: an element position and the node below it; hash-consed, so equal
 * stacks are equal ids.  Node 0 is the empty stack (the grammar complete). */
typedef struct gnode {
    uint32_t pos, parent;
    uint32_t hnext; /* the next node of its hash bucket (older) */
    uint32_t mark;  /* the expansion epoch that last reached it */
    uint32_t serial; /* never reused while the matcher lives (the mask cache's key) */
} gnode;

typedef struct gstate {
    size_t off;       /* its stacks: ids[off .. off + n) */
    uint32_t n;
    uint32_t n_nodes; /* nodes in use once it was made */
    gutf8 part;       /* an incomplete UTF-8 sequence at its end */
} gstate;

struct tdm_gmatch {
    const tdm_grammar *g;
    gnode *nodes;
    uint32_t n_nodes, cap_nodes;
    uint32_t *bucket; /* [n_bucket] newest node of each bucket, UINT32_MAX empty */
    uint32_t n_bucket;
    uint32_t epoch;
    uint32_t *ids;    /* the stack sets of the history, then scratch (mask walk) */
    size_t n_ids, cap_ids;
    gstate *st;       /* [n_st] the history; st[n_st - 1] is the current state */
    uint32_t n_st, cap_st;
    uint32_t *work;   /* expansion worklist */
    uint32_t n_work, cap_work;
    /* mask walk scratch (gmask.c) */
    void *walk;
    size_t walk_cap;
    struct gwalk_memo *memo;
    uint32_t serial;  /* the next node's */
    struct gmask_cache *cache; /* masks of recent states (gmask.c) */
    struct tdm_gshare *share;  /* masks of recent states of every matcher sharing it
                                  (gshare.c; NULL: none) */
};

/* Appends to m->ids the stacks after code point cp from the set ids[in_off .. +n_in);
 * *n_out: their count. */
tandem_status tdm_gm_advance(tdm_gmatch *m, size_t in_off, uint32_t n_in, uint32_t cp, uint32_t *n_out, tdm_err *err);
/* Whether some stack of the set can take a code point of [lo, hi]. */
bool tdm_gm_can_take(const tdm_gmatch *m, size_t off, uint32_t n, uint32_t lo, uint32_t hi);
/* Frees the mask walk's memo (gmask.c); NULL is a no-op. */
void tdm_gm_memo_free(struct gwalk_memo *w);
void tdm_gm_cache_free(struct gmask_cache *c);
/* Drops the nodes past n (the newest first). */
void tdm_gm_truncate_nodes(tdm_gmatch *m, uint32_t n);

/* ---- the shared mask cache (gshare.c) ---- */

/* The most masks one shared cache keeps (its lookup scans them). */
#define TDM_GSHARE_MAX_ENTRIES 512u

/* Whether sh caches masks of grammar g over vocabulary v. */
bool tdm_gshare_usable(const tdm_gshare *sh, const tdm_grammar *g, const tdm_gvocab *v);
/* The mask and count of the state with content key[0..n) (hash h) into mask (the
 * vocabulary's mask words) and *count: false when not cached. */
bool tdm_gshare_get(tdm_gshare *sh, uint64_t h, const uint32_t *key, uint32_t n, uint32_t *mask, int32_t *count);
/* Remembers a state's mask (an allocation failure only skips it). */
void tdm_gshare_put(tdm_gshare *sh, uint64_t h, const uint32_t *key, uint32_t n, const uint32_t *mask, int32_t count);

/* The checks after parsing (grammar_check.c): left recursion and an empty language.
 * names: [n_rules] the user's names (NULL for generated rules), pos: where each rule
 * was defined as "line:col" text. */
tandem_status tdm_grammar_check(const tdm_grammar *g, const char *const *names, const char *const *where,
                                tdm_err *err);

#endif
