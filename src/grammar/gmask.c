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
    int32_t n_sorted;
    uint32_t max_len;
    uint8_t *eog;      /* [n] */
    int32_t *eog_ids;  /* [n_eog] */
    int32_t n_eog;
};

static const tdm_gvocab *sort_vocab; /* (qsort has no context argument in C11) */

static int cmp_tok(const void *a, const void *b) {
    const tdm_gvocab *v = sort_vocab;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    size_t lx = v->off[x + 1] - v->off[x], ly = v->off[y + 1] - v->off[y];
    int c = memcmp(v->data + v->off[x], v->data + v->off[y], TDM_MIN(lx, ly));
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

void tdm_gvocab_free(tdm_gvocab *v) {
    if (!v) return;
    free(v->data), free(v->off), free(v->order), free(v->lcp), free(v->eog), free(v->eog_ids);
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
    sort_vocab = v;
    qsort(v->order, (size_t)v->n_sorted, sizeof(int32_t), cmp_tok);
    for (int32_t k = 0; k < v->n_sorted; k++) {
        uint32_t l = 0;
        if (k > 0) {
            int32_t a = v->order[k - 1], b = v->order[k];
            size_t la = v->off[a + 1] - v->off[a], lb = v->off[b + 1] - v->off[b];
            while (l < la && l < lb && v->data[v->off[a] + l] == v->data[v->off[b] + l]) l++;
        }
        v->lcp[k] = l;
    }
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

/* One level of the walk: the stacks after a prefix of bytes. */
typedef struct wlevel {
    size_t off;       /* its stacks: ids[off .. off + n) */
    uint32_t n;
    gutf8 u;          /* an incomplete UTF-8 sequence at its end */
    size_t ids_end;   /* m->n_ids and ... */
    uint32_t n_nodes; /* ... m->n_nodes once it was made */
} wlevel;

tandem_status tdm_gmatch_mask(tdm_gmatch *m, const tdm_gvocab *v, uint32_t *mask, int32_t *n_allowed,
                              tdm_err *err) {
    if (!m || !v || !mask) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar mask: NULL argument");
    memset(mask, 0, tdm_gvocab_mask_words(v) * sizeof(uint32_t));
    size_t need = ((size_t)v->max_len + 1) * sizeof(wlevel);
    if (m->walk_cap < need) {
        void *w = realloc(m->walk, need);
        if (!w) return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask: out of memory");
        m->walk = w;
        m->walk_cap = need;
    }
    wlevel *lv = m->walk;
    const gstate cur = m->st[m->n_st - 1];
    m->n_ids = cur.off + cur.n;
    lv[0] = (wlevel){cur.off, cur.n, cur.part, m->n_ids, m->n_nodes};
    uint32_t depth = 0, dead_at = UINT32_MAX;
    int32_t count = 0;
    tandem_status st = TANDEM_OK;
    for (int32_t k = 0; k < v->n_sorted && st == TANDEM_OK; k++) {
        uint32_t lcp = v->lcp[k];
        if (dead_at != UINT32_MAX) {
            if (lcp > dead_at) continue; /* shares the prefix no stack takes */
            dead_at = UINT32_MAX;
        }
        if (depth > lcp) {
            depth = lcp;
            m->n_ids = lv[depth].ids_end;
            tdm_gm_truncate_nodes(m, lv[depth].n_nodes);
        }
        int32_t id = v->order[k];
        const uint8_t *b = (const uint8_t *)v->data + v->off[id];
        uint32_t len = (uint32_t)(v->off[id + 1] - v->off[id]);
        bool ok = true;
        while (depth < len) {
            const wlevel *p = &lv[depth];
            wlevel q = *p;
            int r = gutf8_step(&q.u, b[depth]);
            if (r == 0) {
                uint32_t lo, hi;
                gutf8_range(&q.u, &lo, &hi);
                ok = tdm_gm_can_take(m, p->off, p->n, lo, hi);
            } else if (r > 0) {
                q.off = m->n_ids;
                st = tdm_gm_advance(m, p->off, p->n, q.u.cp, &q.n, err);
                ok = st == TANDEM_OK && q.n > 0;
                q.u = (gutf8){0};
            } else ok = false;
            if (!ok) {
                dead_at = depth;
                m->n_ids = p->ids_end;
                tdm_gm_truncate_nodes(m, p->n_nodes);
                break;
            }
            q.ids_end = m->n_ids;
            q.n_nodes = m->n_nodes;
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
