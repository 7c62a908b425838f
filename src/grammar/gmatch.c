/* gmatch.c - the per-sequence matcher: a set of pushdown stacks over the grammar's
 * elements, advanced one code point at a time, with a history of states for
 * speculation's rollback.
 *
 * A stack is a chain of nodes (element position, node below); the top is always a
 * character class (a TERM) or the stack is empty (the grammar complete).  Nodes are
 * hash-consed in the matcher, so a state is just a set of node ids and a snapshot
 * costs its ids.  Advancing by a code point keeps the stacks whose top takes it,
 * moves each past that element and expands rule references on top into their
 * alternatives (a worklist; an epoch mark per node makes each node expand once per
 * step, which also deduplicates the result).  Nodes and state ids only grow along the
 * history; a rollback truncates both to the sizes the target state had. */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

static bool ends(const tdm_grammar *g, uint32_t pos) { return g->el[pos].type <= GE_ALT; }

static uint32_t hash2(uint32_t pos, uint32_t parent) {
    uint64_t h = ((uint64_t)pos << 32 | parent) * 0x9E3779B97F4A7C15ull;
    return (uint32_t)(h >> 32);
}

static tandem_status nomem(tdm_err *err) { return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar matcher: out of memory"); }

static void rehash_into(tdm_gmatch *m, uint32_t *b, uint32_t nb) {
    memset(b, 0xFF, (size_t)nb * sizeof(uint32_t));
    for (uint32_t id = 1; id < m->n_nodes; id++) { /* oldest first: the newest heads its bucket */
        uint32_t h = hash2(m->nodes[id].pos, m->nodes[id].parent) & (nb - 1);
        m->nodes[id].hnext = b[h];
        b[h] = id;
    }
    free(m->bucket);
    m->bucket = b;
    m->n_bucket = nb;
}

static bool rehash(tdm_gmatch *m, uint32_t nb) {
    uint32_t *b = tdm_mallocarray(nb, sizeof(uint32_t));
    if (!b) return false;
    rehash_into(m, b, nb);
    return true;
}

/* The node (pos, parent), made if new; UINT32_MAX when out of memory or nodes. */
static uint32_t intern(tdm_gmatch *m, uint32_t pos, uint32_t parent) {
    uint32_t h = hash2(pos, parent) & (m->n_bucket - 1);
    for (uint32_t id = m->bucket[h]; id != UINT32_MAX; id = m->nodes[id].hnext)
        if (m->nodes[id].pos == pos && m->nodes[id].parent == parent) return id;
    if (m->n_nodes >= TDM_GMATCH_MAX_NODES) return UINT32_MAX;
    if (m->n_nodes == m->cap_nodes) {
        uint32_t nc = m->cap_nodes * 2;
        gnode *nn = realloc(m->nodes, (size_t)nc * sizeof(gnode));
        if (!nn) return UINT32_MAX;
        m->nodes = nn;
        m->cap_nodes = nc;
    }
    uint32_t id = m->n_nodes++;
    m->nodes[id] = (gnode){pos, parent, m->bucket[h], 0, m->serial};
    if (m->serial != UINT32_MAX) m->serial++; /* (at the top the mask cache stops: gmask.c) */
    m->bucket[h] = id;
    if (m->n_nodes > m->n_bucket && !rehash(m, m->n_bucket * 2)) {
        m->n_nodes--; /* (still the head of its bucket) */
        m->bucket[h] = m->nodes[id].hnext;
        return UINT32_MAX;
    }
    return id;
}

void tdm_gm_truncate_nodes(tdm_gmatch *m, uint32_t n) {
    while (m->n_nodes > n) {
        uint32_t id = --m->n_nodes;
        uint32_t h = hash2(m->nodes[id].pos, m->nodes[id].parent) & (m->n_bucket - 1);
        m->bucket[h] = m->nodes[id].hnext; /* the newest node heads its bucket */
    }
}

static bool push_work(tdm_gmatch *m, uint32_t id) {
    if (m->n_work == m->cap_work) {
        uint32_t nc = m->cap_work ? 2 * m->cap_work : 256;
        uint32_t *nw = realloc(m->work, (size_t)nc * sizeof(uint32_t));
        if (!nw) return false;
        m->work = nw;
        m->cap_work = nc;
    }
    m->work[m->n_work++] = id;
    return true;
}

static bool push_id(tdm_gmatch *m, uint32_t id) {
    if (m->n_ids == m->cap_ids) {
        size_t nc = m->cap_ids ? 2 * m->cap_ids : 1024;
        uint32_t *ni = realloc(m->ids, nc * sizeof(uint32_t));
        if (!ni) return false;
        m->ids = ni;
        m->cap_ids = nc;
    }
    m->ids[m->n_ids++] = id;
    return true;
}

static void next_epoch(tdm_gmatch *m) {
    if (++m->epoch == 0) { /* wrapped: clear the old marks */
        for (uint32_t k = 0; k < m->n_nodes; k++) m->nodes[k].mark = 0;
        m->epoch = 1;
    }
}

/* Expands the worklist into terminal stacks appended to ids (counted in *n_out). */
static tandem_status expand(tdm_gmatch *m, uint32_t *n_out, tdm_err *err) {
    const tdm_grammar *g = m->g;
    while (m->n_work > 0) {
        uint32_t x = m->work[--m->n_work];
        if (x == UINT32_MAX) goto oom;
        if (m->nodes[x].mark == m->epoch) continue;
        m->nodes[x].mark = m->epoch;
        uint32_t pos = m->nodes[x].pos;
        if (x == 0 || g->el[pos].type == GE_TERM) {
            if (*n_out >= TDM_GMATCH_MAX_STACKS) {
                m->n_work = 0;
                return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED,
                                  "grammar matcher: more than %u stacks at once (the grammar is too ambiguous)",
                                  TDM_GMATCH_MAX_STACKS);
            }
            if (!push_id(m, x)) goto oom;
            (*n_out)++;
            continue;
        }
        /* a rule reference on top: its alternatives, each over what follows it */
        uint32_t parent = m->nodes[x].parent;
        uint32_t base = ends(g, pos + 1) ? parent : intern(m, pos + 1, parent);
        if (base == UINT32_MAX) goto oom;
        uint32_t r = g->el[pos].val;
        for (uint32_t a = g->alt_off[r]; a < g->alt_off[r + 1]; a++) {
            uint32_t s = g->alt[a];
            if (!push_work(m, ends(g, s) ? base : intern(m, s, base))) goto oom;
        }
    }
    return TANDEM_OK;
oom:
    m->n_work = 0;
    return m->n_nodes >= TDM_GMATCH_MAX_NODES
               ? tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar matcher: more than %u stack nodes", TDM_GMATCH_MAX_NODES)
               : nomem(err);
}

tandem_status tdm_gm_advance(tdm_gmatch *m, size_t in_off, uint32_t n_in, uint32_t cp, uint32_t *n_out,
                             tdm_err *err) {
    const tdm_grammar *g = m->g;
    next_epoch(m);
    *n_out = 0;
    for (uint32_t k = 0; k < n_in; k++) {
        uint32_t x = m->ids[in_off + k];
        if (x == 0) continue;
        uint32_t pos = m->nodes[x].pos;
        if (!gclass_has(g, g->el[pos].val, cp)) continue;
        uint32_t parent = m->nodes[x].parent;
        if (!push_work(m, ends(g, pos + 1) ? parent : intern(m, pos + 1, parent))) return nomem(err);
        tandem_status st = expand(m, n_out, err);
        if (st != TANDEM_OK) return st;
    }
    return TANDEM_OK;
}

bool tdm_gm_can_take(const tdm_gmatch *m, size_t off, uint32_t n, uint32_t lo, uint32_t hi) {
    for (uint32_t k = 0; k < n; k++) {
        uint32_t x = m->ids[off + k];
        if (x != 0 && gclass_meets(m->g, m->g->el[m->nodes[x].pos].val, lo, hi)) return true;
    }
    return false;
}

static bool push_state(tdm_gmatch *m, size_t off, uint32_t n, gutf8 part) {
    if (m->n_st == m->cap_st) {
        uint32_t nc = m->cap_st ? 2 * m->cap_st : 64;
        gstate *ns = realloc(m->st, (size_t)nc * sizeof(gstate));
        if (!ns) return false;
        m->st = ns;
        m->cap_st = nc;
    }
    m->st[m->n_st++] = (gstate){off, n, m->n_nodes, part};
    return true;
}

tandem_status tdm_gmatch_create(const tdm_grammar *g, tdm_gmatch **out, tdm_err *err) {
    if (!g || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar matcher: NULL argument");
    *out = NULL;
    tdm_gmatch *m = calloc(1, sizeof *m);
    if (!m) return nomem(err);
    m->g = g;
    m->cap_nodes = 256;
    m->nodes = tdm_mallocarray(m->cap_nodes, sizeof(gnode));
    if (!m->nodes || !rehash(m, 256)) {
        tdm_gmatch_free(m);
        return nomem(err);
    }
    m->nodes[0] = (gnode){UINT32_MAX, UINT32_MAX, UINT32_MAX, 0, 0};
    m->serial = 1;
    m->n_nodes = 1;
    /* the root's alternatives over the empty stack */
    next_epoch(m);
    uint32_t n = 0;
    for (uint32_t a = g->alt_off[g->root]; a < g->alt_off[g->root + 1]; a++) {
        uint32_t s = g->alt[a];
        if (!push_work(m, ends(g, s) ? 0 : intern(m, s, 0))) {
            tdm_gmatch_free(m);
            return nomem(err);
        }
    }
    tandem_status st = expand(m, &n, err);
    if (st == TANDEM_OK && !push_state(m, 0, n, (gutf8){0})) st = nomem(err);
    if (st != TANDEM_OK) {
        tdm_gmatch_free(m);
        return st;
    }
    *out = m;
    return TANDEM_OK;
}

void tdm_gmatch_free(tdm_gmatch *m) {
    if (!m) return;
    free(m->nodes);
    free(m->bucket);
    free(m->ids);
    free(m->st);
    free(m->work);
    free(m->walk);
    tdm_gm_memo_free(m->memo);
    tdm_gm_cache_free(m->cache);
    free(m);
}

static tandem_status refuse(tdm_gmatch *m, const gstate *cur, size_t at, const char *why, tdm_err *err) {
    m->n_ids = cur->off + cur->n;
    tdm_gm_truncate_nodes(m, cur->n_nodes);
    return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "the grammar does not allow byte %zu here (%s)", at, why);
}

tandem_status tdm_gmatch_accept(tdm_gmatch *m, const char *bytes, size_t len, tdm_err *err) {
    if (!m || (!bytes && len)) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar matcher: NULL argument");
    gstate cur = m->st[m->n_st - 1];
    size_t base = cur.off + cur.n; /* (the history ends here) */
    m->n_ids = base;
    size_t off = cur.off;
    uint32_t n = cur.n;
    gutf8 u = cur.part;
    for (size_t i = 0; i < len; i++) {
        int r = gutf8_step(&u, (uint8_t)bytes[i]);
        if (r < 0) return refuse(m, &cur, i, "invalid UTF-8", err);
        if (r == 0) continue;
        size_t noff = m->n_ids;
        uint32_t nn;
        tandem_status st = tdm_gm_advance(m, off, n, u.cp, &nn, err);
        if (st != TANDEM_OK) {
            m->n_ids = base;
            tdm_gm_truncate_nodes(m, cur.n_nodes);
            return st;
        }
        if (nn == 0) return refuse(m, &cur, i, "no rule takes this character", err);
        off = noff, n = nn;
        u = (gutf8){0};
    }
    if (u.left > 0) {
        uint32_t lo, hi;
        gutf8_range(&u, &lo, &hi);
        if (!tdm_gm_can_take(m, off, n, lo, hi)) return refuse(m, &cur, len, "no rule takes this character", err);
    }
    /* the new state's stacks right after the current state's (the steps between are scratch) */
    if (off != base) {
        if (off == cur.off) { /* no code point completed: a copy */
            for (uint32_t k = 0; k < n; k++)
                if (!push_id(m, m->ids[off + k])) return nomem(err);
        } else {
            memmove(m->ids + base, m->ids + off, (size_t)n * sizeof(uint32_t));
            m->n_ids = base + n;
        }
    }
    if (!push_state(m, base, n, u)) {
        m->n_ids = base;
        return nomem(err);
    }
    return TANDEM_OK;
}

bool tdm_gmatch_is_complete(const tdm_gmatch *m) {
    const gstate *s = &m->st[m->n_st - 1];
    if (s->part.left > 0) return false;
    for (uint32_t k = 0; k < s->n; k++)
        if (m->ids[s->off + k] == 0) return true;
    return false;
}

bool tdm_gmatch_is_finished(const tdm_gmatch *m) {
    const gstate *s = &m->st[m->n_st - 1];
    return s->n == 1 && m->ids[s->off] == 0 && s->part.left == 0;
}

uint32_t tdm_gmatch_n_stacks(const tdm_gmatch *m) { return m->st[m->n_st - 1].n; }

uint32_t tdm_gmatch_mark(const tdm_gmatch *m) { return m->n_st - 1; }

tandem_status tdm_gmatch_rollback(tdm_gmatch *m, uint32_t mark, tdm_err *err) {
    if (!m) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar matcher: NULL argument");
    if (mark >= m->n_st)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar matcher: rollback to mark %u, past the current %u",
                          mark, m->n_st - 1);
    m->n_st = mark + 1;
    m->n_ids = m->st[mark].off + m->st[mark].n;
    tdm_gm_truncate_nodes(m, m->st[mark].n_nodes);
    return TANDEM_OK;
}

tandem_status tdm_gmatch_commit(tdm_gmatch *m, tdm_err *err) {
    if (!m) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar matcher: NULL argument");
    gstate cur = m->st[m->n_st - 1];
    /* keep the nodes the current stacks reach; a node's parent is older than it, so
     * one pass from the newest down marks them all, and renumbering in order keeps
     * parents before children */
    uint32_t *map = tdm_mallocarray(m->n_nodes, sizeof(uint32_t));
    uint32_t *b = tdm_mallocarray(m->n_bucket, sizeof(uint32_t)); /* (n_bucket >= n_nodes) */
    if (!map || !b) return free(map), free(b), nomem(err);
    memset(map, 0, (size_t)m->n_nodes * sizeof(uint32_t));
    for (uint32_t k = 0; k < cur.n; k++) map[m->ids[cur.off + k]] = 1;
    for (uint32_t id = m->n_nodes; id-- > 1;)
        if (map[id]) map[m->nodes[id].parent] = 1;
    uint32_t nn = 1;
    map[0] = 0;
    for (uint32_t id = 1; id < m->n_nodes; id++) {
        if (!map[id]) continue;
        gnode x = m->nodes[id];
        m->nodes[nn] = (gnode){x.pos, map[x.parent], UINT32_MAX, 0, x.serial};
        map[id] = nn++;
    }
    for (uint32_t k = 0; k < cur.n; k++) m->ids[k] = map[m->ids[cur.off + k]];
    free(map);
    m->n_nodes = nn;
    m->n_ids = cur.n;
    m->nodes[0].mark = 0; /* (every mark is now 0: the epochs restart) */
    m->epoch = 0;
    next_epoch(m);
    rehash_into(m, b, m->n_bucket);
    m->n_st = 0;
    push_state(m, 0, cur.n, cur.part); /* (cannot fail: the array holds at least one) */
    return TANDEM_OK;
}
