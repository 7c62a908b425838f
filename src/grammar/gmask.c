/* gmask.c - vocabularies as sorted byte strings, and the token mask: one walk over
 * the sorted tokens that advances the matcher's stacks byte by byte and shares the
 * work of common prefixes (a token starting with a longer one's prefix reuses the
 * stacks computed for it: each level of the walk is kept until a token with a
 * shorter common prefix comes), pruning every token below a byte no stack takes.
 * Nodes and stack sets the walk makes live past the matcher's history and are
 * truncated away as the walk backs up, so a mask leaves the matcher as it was. */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

struct tdm_gvocab {
    int32_t n;
    char *data;        /* every token's bytes, in id order */
    size_t *off;       /* [n + 1] token i: data[off[i] .. off[i + 1]) */
    int32_t *order;    /* [n_sorted] ids of the tokens with bytes, by their bytes */
    uint32_t *lcp;     /* [n_sorted] common prefix with the previous one in order */
    char *sdata;       /* the sorted tokens' bytes one after another (the walk reads
                          them in order: no random access into data) */
    size_t *soff;      /* [n_sorted + 1] */
    int32_t n_sorted;
    uint32_t max_len;
    uint8_t *eog;      /* [n] */
    int32_t *eog_ids;  /* [n_eog] */
    int32_t n_eog;
};

/* A token while sorting (the comparison needs no global state: vocabularies may be
 * built on several threads at once). */
typedef struct sortent {
    const char *p;
    size_t len;
    int32_t id;
} sortent;

static int cmp_tok(const void *a, const void *b) {
    const sortent *x = a, *y = b;
    int c = memcmp(x->p, y->p, TDM_MIN(x->len, y->len));
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void tdm_gvocab_free(tdm_gvocab *v) {
    if (!v) return;
    free(v->data), free(v->off), free(v->order), free(v->lcp), free(v->eog), free(v->eog_ids);
    free(v->sdata), free(v->soff);
    free(v);
}

tandem_status tdm_gvocab_create_raw(int32_t n, const char *const *bytes, const size_t *lens, const int32_t *eog,
                                    int32_t n_eog, tdm_gvocab **out, tdm_err *err) {
    if (!out || n <= 0 || !bytes || !lens || n_eog < 0 || (n_eog > 0 && !eog))
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar vocabulary: bad arguments (n %d, n_eog %d)", (int)n,
                          (int)n_eog);
    *out = NULL;
    tdm_gvocab *v = calloc(1, sizeof *v);
    if (!v) return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar vocabulary: out of memory");
    v->n = n;
    size_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        if (lens[i] > UINT32_MAX / 2 || (lens[i] && !bytes[i]))
            return tdm_gvocab_free(v), tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar vocabulary: token %d: bad bytes", (int)i);
        total += lens[i];
    }
    v->data = tdm_malloc(total + 1);
    v->off = tdm_mallocarray((size_t)n + 1, sizeof(size_t));
    v->order = tdm_mallocarray((size_t)n, sizeof(int32_t));
    v->lcp = tdm_mallocarray((size_t)n, sizeof(uint32_t));
    v->eog = tdm_calloc((size_t)n, 1);
    v->eog_ids = tdm_mallocarray((size_t)n_eog + 1, sizeof(int32_t));
    if (!v->data || !v->off || !v->order || !v->lcp || !v->eog || !v->eog_ids) {
        tdm_gvocab_free(v);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar vocabulary: out of memory");
    }
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        v->off[i] = o;
        if (lens[i]) memcpy(v->data + o, bytes[i], lens[i]);
        o += lens[i];
        if (lens[i]) v->order[v->n_sorted++] = i;
        if (lens[i] > v->max_len) v->max_len = (uint32_t)lens[i];
    }
    v->off[n] = o;
    for (int32_t k = 0; k < n_eog; k++) {
        if (eog[k] < 0 || eog[k] >= n) {
            tdm_gvocab_free(v);
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar vocabulary: end-of-generation id %d out of range",
                              (int)eog[k]);
        }
        if (!v->eog[eog[k]]) v->eog_ids[v->n_eog++] = eog[k];
        v->eog[eog[k]] = 1;
    }
    sortent *se = tdm_mallocarray((size_t)v->n_sorted + 1, sizeof(sortent));
    if (!se) {
        tdm_gvocab_free(v);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar vocabulary: out of memory");
    }
    for (int32_t k = 0; k < v->n_sorted; k++) {
        int32_t id = v->order[k];
        se[k] = (sortent){v->data + v->off[id], v->off[id + 1] - v->off[id], id};
    }
    qsort(se, (size_t)v->n_sorted, sizeof(sortent), cmp_tok);
    for (int32_t k = 0; k < v->n_sorted; k++) v->order[k] = se[k].id;
    free(se);
    for (int32_t k = 0; k < v->n_sorted; k++) {
        uint32_t l = 0;
        if (k > 0) {
            int32_t a = v->order[k - 1], b = v->order[k];
            size_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
            while (l < la && l < lb && v->data[v->off[a] + l] == v->data[v->off[b] + l]) l++;
        }
        v->lcp[k] = l;
    }
    v->sdata = tdm_malloc(total + 1);
    v->soff = tdm_mallocarray((size_t)v->n_sorted + 1, sizeof(size_t));
    if (!v->sdata || !v->soff) {
        tdm_gvocab_free(v);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar vocabulary: out of memory");
    }
    o = 0;
    for (int32_t k = 0; k < v->n_sorted; k++) {
        int32_t id = v->order[k];
        size_t l = v->off[id + 1] - v->off[id];
        v->soff[k] = o;
        memcpy(v->sdata + o, v->data + v->off[id], l);
        o += l;
    }
    v->soff[v->n_sorted] = o;
    *out = v;
    return TANDEM_OK;
}

tandem_status tdm_gvocab_create(const tdm_tokenizer *t, tdm_gvocab **out, tdm_err *err) {
    if (!t || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar vocabulary: NULL argument");
    int32_t n = tdm_tok_n_vocab(t), cap = tdm_tok_max_piece(t) + 1;
    char **bytes = tdm_calloc((size_t)n, sizeof(char *));
    size_t *lens = tdm_calloc((size_t)n, sizeof(size_t));
    char *buf = tdm_malloc((size_t)cap);
    tandem_status st = TANDEM_OK;
    if (!bytes || !lens || !buf) st = tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar vocabulary: out of memory");
    for (int32_t i = 0; i < n && st == TANDEM_OK; i++) {
        int32_t l = tdm_token_to_piece(t, i, false, buf, cap);
        if (l < 0 || l > cap) {
            st = tdm_seterr(err, TANDEM_ERR_INTERNAL, "grammar vocabulary: token %d has no piece", (int)i);
            break;
        }
        lens[i] = (size_t)l;
        bytes[i] = tdm_strndup(buf, (size_t)l);
        if (!bytes[i]) st = tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar vocabulary: out of memory");
    }
    if (st == TANDEM_OK) {
        const int32_t *eog;
        int32_t n_eog = tdm_tok_eog_ids(t, &eog);
        for (int32_t k = 0; k < n_eog; k++) lens[eog[k]] = 0; /* matched only as the end */
        st = tdm_gvocab_create_raw(n, (const char *const *)bytes, lens, eog, n_eog, out, err);
    }
    for (int32_t i = 0; bytes && i < n; i++) free(bytes[i]);
    free(bytes), free(lens), free(buf);
    return st;
}

int32_t tdm_gvocab_n(const tdm_gvocab *v) { return v->n; }
size_t tdm_gvocab_mask_words(const tdm_gvocab *v) { return ((size_t)v->n + 31) / 32; }
bool tdm_gvocab_is_eog(const tdm_gvocab *v, int32_t id) { return id >= 0 && id < v->n && v->eog[id]; }

const char *tdm_gvocab_bytes(const tdm_gvocab *v, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= v->n || v->off[id + 1] == v->off[id]) return NULL;
    *len = v->off[id + 1] - v->off[id];
    return v->data + v->off[id];
}

tandem_status tdm_gmatch_accept_token(tdm_gmatch *m, const tdm_gvocab *v, int32_t id, tdm_err *err) {
    if (!m || !v) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar matcher: NULL argument");
    if (tdm_gvocab_is_eog(v, id)) {
        if (!tdm_gmatch_is_complete(m))
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "the grammar does not allow the end here (token %d)", (int)id);
        return tdm_gmatch_accept(m, "", 0, err);
    }
    size_t len;
    const char *b = tdm_gvocab_bytes(v, id, &len);
    if (!b) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "the grammar never allows token %d (no text)", (int)id);
    return tdm_gmatch_accept(m, b, len, err);
}

/* The walk's memo: the stack sets met during one walk, interned by content (their
 * ids sorted), and the transitions (set, code point) -> set computed so far.  Inside
 * a JSON string, say, almost every character leads back to the same set, so most
 * steps of the walk are one lookup instead of an advance (ASCII characters through a
 * direct row of 128 per set, others and partial UTF-8 checks through a hashed
 * table).  Tables are cleared per walk by a stamp; the hashed one stops taking
 * entries when half full. */
#define MEMO_SLOTS (1u << 15)
#define DEAD UINT32_MAX

typedef struct gwalk_memo {
    size_t *set_off;   /* [n_sets] set s: m->ids[set_off[s] .. + set_n[s]) */
    uint32_t *set_n;
    uint32_t n_sets, cap_sets;
    uint32_t *sh;      /* [sh_cap] set id, or UINT32_MAX (by stamp) */
    uint32_t *sh_stamp;
    uint32_t sh_cap;
    uint64_t tkey[MEMO_SLOTS]; /* set << 32 | code point */
    uint32_t tval[MEMO_SLOTS]; /* the set after it, or DEAD */
    uint32_t tstamp[MEMO_SLOTS];
    uint32_t n_trans;
    uint32_t stamp;
    uint32_t *set_row; /* [n_sets] the set's row of ascii, or UINT32_MAX */
    uint32_t *ascii;   /* rows of 128: the set after an ASCII character (direct) */
    uint32_t n_rows, cap_rows;
} gwalk_memo;

#define UNKNOWN (UINT32_MAX - 1)

void tdm_gm_memo_free(gwalk_memo *w) {
    if (!w) return;
    free(w->set_off), free(w->set_n), free(w->sh), free(w->sh_stamp), free(w->set_row), free(w->ascii);
    free(w);
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static uint32_t hash_ids(const uint32_t *ids, uint32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t k = 0; k < n; k++) h = (h ^ ids[k]) * 0x100000001B3ull;
    return (uint32_t)(h ^ (h >> 29));
}

static bool sh_grow(gwalk_memo *w, const uint32_t *ids) {
    uint32_t nc = w->sh_cap ? 2 * w->sh_cap : 1024;
    uint32_t *nh = tdm_mallocarray(nc, sizeof(uint32_t)), *ns = tdm_calloc(nc, sizeof(uint32_t));
    if (!nh || !ns) return free(nh), free(ns), false;
    for (uint32_t s = 0; s < w->n_sets; s++) {
        uint32_t h = hash_ids(ids + w->set_off[s], w->set_n[s]) & (nc - 1);
        while (ns[h] == w->stamp) h = (h + 1) & (nc - 1);
        nh[h] = s, ns[h] = w->stamp;
    }
    free(w->sh), free(w->sh_stamp);
    w->sh = nh, w->sh_stamp = ns, w->sh_cap = nc;
    return true;
}

/* Interns the set at m->ids[off .. off + n) (the end of ids): returns its id, the
 * copy dropped when an equal set is known; UINT32_MAX when out of memory. */
static uint32_t intern_set(tdm_gmatch *m, gwalk_memo *w, size_t off, uint32_t n) {
    uint32_t *ids = m->ids + off;
    if (n > 16) qsort(ids, n, sizeof(uint32_t), cmp_u32);
    else
        for (uint32_t i = 1; i < n; i++) { /* (most sets are small: insertion sort) */
            uint32_t x = ids[i], j = i;
            while (j > 0 && ids[j - 1] > x) ids[j] = ids[j - 1], j--;
            ids[j] = x;
        }
    if (2 * (w->n_sets + 1) > w->sh_cap && !sh_grow(w, m->ids)) return UINT32_MAX;
    uint32_t h = hash_ids(ids, n) & (w->sh_cap - 1);
    while (w->sh_stamp[h] == w->stamp) {
        uint32_t s = w->sh[h];
        if (w->set_n[s] == n && memcmp(m->ids + w->set_off[s], ids, (size_t)n * sizeof(uint32_t)) == 0) {
            m->n_ids = off; /* known: drop the copy */
            return s;
        }
        h = (h + 1) & (w->sh_cap - 1);
    }
    if (w->n_sets == w->cap_sets) {
        uint32_t nc = w->cap_sets ? 2 * w->cap_sets : 256;
        size_t *no = realloc(w->set_off, nc * sizeof(size_t));
        if (!no) return UINT32_MAX;
        w->set_off = no;
        uint32_t *nn = realloc(w->set_n, nc * sizeof(uint32_t));
        if (!nn) return UINT32_MAX;
        w->set_n = nn;
        uint32_t *nr = realloc(w->set_row, nc * sizeof(uint32_t));
        if (!nr) return UINT32_MAX;
        w->set_row = nr, w->cap_sets = nc;
    }
    uint32_t s = w->n_sets++;
    w->set_off[s] = off, w->set_n[s] = n, w->set_row[s] = UINT32_MAX;
    w->sh[h] = s, w->sh_stamp[h] = w->stamp;
    return s;
}

static tandem_status step_hashed(tdm_gmatch *m, gwalk_memo *w, uint32_t s, uint32_t cp, uint32_t *out, tdm_err *err);

/* The set after cp from set s, computed: advanced and interned (DEAD: none). */
static tandem_status advance_set(tdm_gmatch *m, gwalk_memo *w, uint32_t s, uint32_t cp, uint32_t *out, tdm_err *err) {
    size_t off = m->n_ids;
    uint32_t n;
    tandem_status st = tdm_gm_advance(m, w->set_off[s], w->set_n[s], cp, &n, err);
    if (st != TANDEM_OK) return st;
    *out = DEAD;
    if (n == 0) m->n_ids = off;
    else if ((*out = intern_set(m, w, off, n)) == UINT32_MAX)
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
    return TANDEM_OK;
}

/* The set after code point cp from set s (DEAD: none): an ASCII character through
 * the set's direct row, others through the hashed memo. */
static tandem_status step(tdm_gmatch *m, gwalk_memo *w, uint32_t s, uint32_t cp, uint32_t *out, tdm_err *err) {
    if (cp >= 128) return step_hashed(m, w, s, cp, out, err);
    if (w->set_row[s] == UINT32_MAX) {
        if (w->n_rows == w->cap_rows) {
            uint32_t nc = w->cap_rows ? 2 * w->cap_rows : 64;
            uint32_t *na = realloc(w->ascii, (size_t)nc * 128 * sizeof(uint32_t));
            if (!na) return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
            w->ascii = na, w->cap_rows = nc;
        }
        uint32_t *row = w->ascii + (size_t)w->n_rows * 128;
        for (int k = 0; k < 128; k++) row[k] = UNKNOWN;
        w->set_row[s] = w->n_rows++;
    }
    uint32_t *slot = w->ascii + (size_t)w->set_row[s] * 128 + cp;
    if (*slot != UNKNOWN) {
        *out = *slot;
        return TANDEM_OK;
    }
    uint32_t r;
    tandem_status st = advance_set(m, w, s, cp, &r, err);
    if (st != TANDEM_OK) return st;
    w->ascii[(size_t)w->set_row[s] * 128 + cp] = r;
    *out = r;
    return TANDEM_OK;
}

/* Whether set s can take a code point that the incomplete sequence u can become
 * (memoized in the hashed table under a key no code point has). */
static bool can_take_memo(tdm_gmatch *m, gwalk_memo *w, uint32_t s, const gutf8 *u) {
    uint64_t key = (uint64_t)s << 32 | 0x80000000u | (uint32_t)u->total << 24 | (uint32_t)u->left << 22 | u->cp;
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (MEMO_SLOTS - 1);
    while (w->tstamp[h] == w->stamp) {
        if (w->tkey[h] == key) return w->tval[h] != DEAD;
        h = (h + 1) & (MEMO_SLOTS - 1);
    }
    uint32_t lo, hi;
    gutf8_range(u, &lo, &hi);
    bool ok = tdm_gm_can_take(m, w->set_off[s], w->set_n[s], lo, hi);
    if (2 * (w->n_trans + 1) <= MEMO_SLOTS) { /* (a full table just skips the memo) */
        w->tkey[h] = key, w->tval[h] = ok ? 1 : DEAD, w->tstamp[h] = w->stamp;
        w->n_trans++;
    }
    return ok;
}

static tandem_status step_hashed(tdm_gmatch *m, gwalk_memo *w, uint32_t s, uint32_t cp, uint32_t *out, tdm_err *err) {
    uint64_t key = (uint64_t)s << 32 | cp;
    uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (MEMO_SLOTS - 1);
    while (w->tstamp[h] == w->stamp) {
        if (w->tkey[h] == key) {
            *out = w->tval[h];
            return TANDEM_OK;
        }
        h = (h + 1) & (MEMO_SLOTS - 1);
    }
    uint32_t r;
    tandem_status st = advance_set(m, w, s, cp, &r, err);
    if (st != TANDEM_OK) return st;
    if (2 * (w->n_trans + 1) <= MEMO_SLOTS) { /* (a half-full table just stops memoizing) */
        w->tkey[h] = key, w->tval[h] = r, w->tstamp[h] = w->stamp;
        w->n_trans++;
    }
    *out = r;
    return TANDEM_OK;
}

/* The masks of the last GMASK_CACHE states, keyed by their stacks' node serials
 * (sorted) and the partial UTF-8 sequence: a state the matcher comes back to (inside
 * a string, after each ordinary token) costs a copy.  Keyed per vocabulary pointer.
 * A state not there is looked up next in the matcher's shared cache (gshare.c, by
 * content: serials are the matcher's own), and its walked mask put there. */
#define GMASK_CACHE 4

typedef struct gmask_entry {
    const tdm_gvocab *v;
    uint32_t *key;    /* [n] sorted serials */
    uint32_t n;
    gutf8 part;
    uint32_t *mask;   /* [mask words of v] */
    int32_t count;
} gmask_entry;

/* A state's key by content for the shared cache (tdm_gshare): [part.cp, part.left |
 * part.total << 8, n stacks, then each stack as its depth and its element positions
 * from the top], the stacks ordered by (hash of their positions, depth, positions).
 * A state of more stacks or positions is not shared (computed as before). */
#define SHARE_MAX_STACKS 64u
#define SHARE_MAX_POS 4096u

typedef struct share_stack {
    uint64_t h;
    uint32_t off, n; /* its positions: seq[off .. off + n) */
} share_stack;

typedef struct gmask_cache {
    gmask_entry e[GMASK_CACHE];
    uint32_t next;    /* the entry to replace */
    uint32_t *key;    /* scratch: the current state's key */
    uint32_t key_cap;
    uint32_t *seq;    /* [SHARE_MAX_POS] scratch: the stacks' positions (made at the first
                         shared mask) */
    uint32_t *ckey;   /* [3 + SHARE_MAX_STACKS + SHARE_MAX_POS] the content key */
    share_stack stk[SHARE_MAX_STACKS];
} gmask_cache;

void tdm_gm_cache_free(gmask_cache *c) {
    if (!c) return;
    for (int k = 0; k < GMASK_CACHE; k++) free(c->e[k].key), free(c->e[k].mask);
    free(c->key), free(c->seq), free(c->ckey);
    free(c);
}

static int cmp_stack(const uint32_t *seq, const share_stack *a, const share_stack *b) {
    if (a->h != b->h) return a->h < b->h ? -1 : 1;
    if (a->n != b->n) return a->n < b->n ? -1 : 1;
    return memcmp(seq + a->off, seq + b->off, (size_t)a->n * sizeof(uint32_t));
}

/* The current state's content key into c->ckey: its length (0: not shared: too
 * large, or out of memory), *h its hash. */
static uint32_t content_key(const tdm_gmatch *m, gmask_cache *c, const gstate *cur, uint64_t *h) {
    if (cur->n > SHARE_MAX_STACKS) return 0;
    if (!c->seq && !(c->seq = tdm_mallocarray(SHARE_MAX_POS, sizeof(uint32_t)))) return 0;
    if (!c->ckey && !(c->ckey = tdm_mallocarray(3 + SHARE_MAX_STACKS + SHARE_MAX_POS, sizeof(uint32_t)))) return 0;
    uint32_t used = 0;
    for (uint32_t k = 0; k < cur->n; k++) {
        uint64_t hh = 0xCBF29CE484222325ull;
        const uint32_t off = used;
        for (uint32_t x = m->ids[cur->off + k]; x != 0; x = m->nodes[x].parent) {
            if (used == SHARE_MAX_POS) return 0;
            c->seq[used++] = m->nodes[x].pos;
            hh = (hh ^ m->nodes[x].pos) * 0x100000001B3ull;
        }
        share_stack t = {hh, off, used - off};
        uint32_t j = k; /* (insertion: at most SHARE_MAX_STACKS) */
        while (j > 0 && cmp_stack(c->seq, &c->stk[j - 1], &t) > 0) c->stk[j] = c->stk[j - 1], j--;
        c->stk[j] = t;
    }
    uint32_t *key = c->ckey, n = 0;
    key[n++] = cur->part.cp;
    key[n++] = (uint32_t)cur->part.left | (uint32_t)cur->part.total << 8;
    key[n++] = cur->n;
    for (uint32_t k = 0; k < cur->n; k++) {
        key[n++] = c->stk[k].n;
        memcpy(key + n, c->seq + c->stk[k].off, (size_t)c->stk[k].n * sizeof(uint32_t));
        n += c->stk[k].n;
    }
    uint64_t hk = 0x9E3779B97F4A7C15ull ^ n;
    for (uint32_t k = 0; k < n; k++) hk = (hk ^ key[k]) * 0x100000001B3ull;
    *h = hk ^ (hk >> 31);
    return n;
}


/* The current state's key in c->key; false when out of memory. */
static bool state_key(tdm_gmatch *m, gmask_cache *c, const gstate *cur) {
    if (c->key_cap < cur->n + 1) {
        uint32_t *nk = realloc(c->key, ((size_t)cur->n + 1) * sizeof(uint32_t));
        if (!nk) return false;
        c->key = nk, c->key_cap = cur->n + 1;
    }
    for (uint32_t k = 0; k < cur->n; k++) c->key[k] = m->nodes[m->ids[cur->off + k]].serial;
    qsort(c->key, cur->n, sizeof(uint32_t), cmp_u32);
    return true;
}

static bool same_part(gutf8 a, gutf8 b) { return a.cp == b.cp && a.left == b.left && a.total == b.total; }

/* One level of the walk: the stacks after a prefix of bytes. */
typedef struct wlevel {
    uint32_t set; /* the interned set */
    gutf8 u;      /* an incomplete UTF-8 sequence at its end */
} wlevel;

static tandem_status walk_mask(tdm_gmatch *m, const tdm_gvocab *v, uint32_t *mask, int32_t *n_allowed,
                               tdm_err *err);

tandem_status tdm_gmatch_mask(tdm_gmatch *m, const tdm_gvocab *v, uint32_t *mask, int32_t *n_allowed,
                              tdm_err *err) {
    if (!m || !v || !mask) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar mask: NULL argument");
    size_t words = tdm_gvocab_mask_words(v);
    const gstate cur = m->st[m->n_st - 1];
    if (!m->cache && !(m->cache = calloc(1, sizeof(gmask_cache))))
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
    gmask_cache *c = m->cache;
    if (m->serial == UINT32_MAX) return walk_mask(m, v, mask, n_allowed, err); /* (serials ran out) */
    if (!state_key(m, c, &cur)) return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
    for (int k = 0; k < GMASK_CACHE; k++) {
        gmask_entry *e = &c->e[k];
        if (e->v == v && e->n == cur.n && same_part(e->part, cur.part) &&
            memcmp(e->key, c->key, (size_t)cur.n * sizeof(uint32_t)) == 0) {
            memcpy(mask, e->mask, words * sizeof(uint32_t));
            if (n_allowed) *n_allowed = e->count;
            return TANDEM_OK;
        }
    }
    /* the shared cache's (a state another matcher of this grammar met), else the walk */
    uint64_t kh = 0;
    const uint32_t kn = tdm_gshare_usable(m->share, m->g, v) ? content_key(m, c, &cur, &kh) : 0;
    int32_t count = 0;
    if (!kn || !tdm_gshare_get(m->share, kh, c->ckey, kn, mask, &count)) {
        tandem_status st = walk_mask(m, v, mask, &count, err);
        if (st != TANDEM_OK) return st;
        if (kn) tdm_gshare_put(m->share, kh, c->ckey, kn, mask, count);
    }
    if (n_allowed) *n_allowed = count;
    /* remember it (an allocation failure only skips the cache) */
    gmask_entry *e = &c->e[c->next];
    uint32_t *nk = realloc(e->key, ((size_t)cur.n + 1) * sizeof(uint32_t));
    if (nk) e->key = nk;
    uint32_t *nm = e->v == v ? e->mask : realloc(e->mask, words * sizeof(uint32_t));
    if (nm) e->mask = nm;
    if (nk && nm) {
        memcpy(e->key, c->key, (size_t)cur.n * sizeof(uint32_t));
        memcpy(e->mask, mask, words * sizeof(uint32_t));
        e->v = v, e->n = cur.n, e->part = cur.part, e->count = count;
        c->next = (c->next + 1) % GMASK_CACHE;
    } else e->v = NULL;
    return TANDEM_OK;
}

/* The mask by the walk over the sorted vocabulary. */
static tandem_status walk_mask(tdm_gmatch *m, const tdm_gvocab *v, uint32_t *mask, int32_t *n_allowed,
                               tdm_err *err) {
    memset(mask, 0, tdm_gvocab_mask_words(v) * sizeof(uint32_t));
    size_t need = ((size_t)v->max_len + 1) * sizeof(wlevel);
    if (m->walk_cap < need) {
        void *nw = realloc(m->walk, need);
        if (!nw) return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
        m->walk = nw;
        m->walk_cap = need;
    }
    if (!m->memo && !(m->memo = calloc(1, sizeof(gwalk_memo))))
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
    gwalk_memo *w = m->memo;
    if (++w->stamp == 0) { /* wrapped: clear the stamps */
        memset(w->tstamp, 0, sizeof w->tstamp);
        if (w->sh_stamp) memset(w->sh_stamp, 0, (size_t)w->sh_cap * sizeof(uint32_t));
        w->stamp = 1;
    }
    w->n_sets = 0, w->n_trans = 0, w->n_rows = 0;
    wlevel *lv = m->walk;
    const gstate cur = m->st[m->n_st - 1];
    m->n_ids = cur.off + cur.n;
    tandem_status st = TANDEM_OK;
    /* the current set, copied past the history (interning sorts it) */
    size_t off0 = m->n_ids;
    for (uint32_t k = 0; k < cur.n; k++) {
        if (m->n_ids == m->cap_ids) {
            size_t nc = m->cap_ids ? 2 * m->cap_ids : 1024;
            uint32_t *ni = realloc(m->ids, nc * sizeof(uint32_t));
            if (!ni) return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
            m->ids = ni, m->cap_ids = nc;
        }
        m->ids[m->n_ids++] = m->ids[cur.off + k];
    }
    uint32_t s0 = intern_set(m, w, off0, cur.n);
    if (s0 == UINT32_MAX) st = tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
    lv[0] = (wlevel){s0, cur.part};
    uint32_t depth = 0, dead_at = UINT32_MAX;
    int32_t count = 0;
    for (int32_t k = 0; k < v->n_sorted && st == TANDEM_OK; k++) {
        uint32_t lcp = v->lcp[k];
        if (dead_at != UINT32_MAX) {
            if (lcp > dead_at) continue; /* shares the prefix no stack takes */
            dead_at = UINT32_MAX;
        }
        if (depth > lcp) depth = lcp;
        int32_t id = v->order[k];
        const uint8_t *b = (const uint8_t *)v->sdata + v->soff[k];
        uint32_t len = (uint32_t)(v->soff[k + 1] - v->soff[k]);
        bool ok = true;
        while (depth < len) {
            wlevel q = lv[depth];
            int r = gutf8_step(&q.u, b[depth]);
            if (r == 0) ok = can_take_memo(m, w, q.set, &q.u);
            else if (r > 0) {
                st = step(m, w, q.set, q.u.cp, &q.set, err);
                ok = st == TANDEM_OK && q.set != DEAD;
                q.u = (gutf8){0};
            } else ok = false;
            if (!ok) {
                dead_at = depth;
                break;
            }
            lv[++depth] = q;
        }
        if (ok) {
            mask[id / 32] |= 1u << (id % 32);
            count++;
        }
    }
    m->n_ids = cur.off + cur.n;
    tdm_gm_truncate_nodes(m, cur.n_nodes);
    if (st != TANDEM_OK) return st;
    if (tdm_gmatch_is_complete(m))
        for (int32_t k = 0; k < v->n_eog; k++) {
            mask[v->eog_ids[k] / 32] |= 1u << (v->eog_ids[k] % 32);
            count++;
        }
    if (n_allowed) *n_allowed = count;
    return TANDEM_OK;
}

tandem_status tdm_grammar_matches(const tdm_grammar *g, const char *text, size_t len, bool *out, tdm_err *err) {
    tdm_gmatch *m;
    tandem_status st = tdm_gmatch_create(g, &m, err);
    if (st != TANDEM_OK) return st;
    tdm_err e2 = {0};
    st = tdm_gmatch_accept(m, text, len, &e2);
    *out = st == TANDEM_OK && tdm_gmatch_is_complete(m);
    if (st == TANDEM_ERR_INVALID_ARG) st = TANDEM_OK; /* (not matching) */
    tdm_gmatch_free(m);
    if (st != TANDEM_OK && err) *err = e2;
    return st;
}
