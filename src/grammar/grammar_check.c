/* grammar_check.c - the checks a compiled grammar must pass before a matcher may run
 * on it: no left recursion (the matcher expands rule references at the top of a
 * stack until a character is on top, which would never end), and a root that can
 * match some text.  Both rest on two fixpoints over the alternatives, computed with
 * worklists in time linear in the grammar (the input is untrusted):
 *   nullable[r]:   r can match the empty text;
 *   productive[r]: r can match some finite text. */
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef struct alts {
    uint32_t n;        /* alternatives */
    uint32_t *rule;    /* [n] the rule of each */
    uint32_t *start;   /* [n] its first element */
    uint32_t *occ_off; /* [n_rules + 1] CSR: the alternatives referring to rule r ... */
    uint32_t *occ;     /* ... one entry per reference */
} alts;

static void alts_free(alts *a) {
    free(a->rule), free(a->start), free(a->occ_off), free(a->occ);
}

static bool alts_build(const tdm_grammar *g, alts *a) {
    memset(a, 0, sizeof *a);
    uint32_t n = g->n_rules; /* each rule has one alternative more than its ALTs */
    for (uint32_t k = 0; k < g->n_el; k++) n += g->el[k].type == GE_ALT;
    a->rule = tdm_mallocarray(n, sizeof(uint32_t));
    a->start = tdm_mallocarray(n, sizeof(uint32_t));
    a->occ_off = tdm_calloc((size_t)g->n_rules + 1, sizeof(uint32_t));
    a->occ = tdm_mallocarray(g->n_el + 1, sizeof(uint32_t));
    if (!a->rule || !a->start || !a->occ_off || !a->occ) return false;
    for (uint32_t r = 0; r < g->n_rules; r++) {
        uint32_t k = g->rule_start[r];
        a->rule[a->n] = r, a->start[a->n] = k, a->n++;
        for (;; k++) {
            if (g->el[k].type == GE_END) break;
            if (g->el[k].type == GE_ALT) a->rule[a->n] = r, a->start[a->n] = k + 1, a->n++;
            else if (g->el[k].type == GE_REF) a->occ_off[g->el[k].val + 1]++;
        }
    }
    for (uint32_t r = 0; r < g->n_rules; r++) a->occ_off[r + 1] += a->occ_off[r];
    uint32_t *fill = tdm_mallocarray((size_t)g->n_rules + 1, sizeof(uint32_t));
    if (!fill) return false;
    memcpy(fill, a->occ_off, g->n_rules * sizeof(uint32_t));
    for (uint32_t i = 0; i < a->n; i++)
        for (uint32_t k = a->start[i]; g->el[k].type != GE_END && g->el[k].type != GE_ALT; k++)
            if (g->el[k].type == GE_REF) a->occ[fill[g->el[k].val]++] = i;
    free(fill);
    return true;
}

/* The fixpoint: a rule holds when one of its alternatives has every REF holding (and,
 * unless terms_hold, no TERM). */
static bool fixpoint(const tdm_grammar *g, const alts *a, bool terms_hold, bool *out) {
    uint32_t *need = tdm_mallocarray(a->n ? a->n : 1, sizeof(uint32_t));
    uint32_t *work = tdm_mallocarray((size_t)g->n_rules + 1, sizeof(uint32_t));
    if (!need || !work) return free(need), free(work), false;
    memset(out, 0, g->n_rules * sizeof(bool));
    uint32_t nw = 0;
    for (uint32_t i = 0; i < a->n; i++) {
        uint32_t c = 0;
        for (uint32_t k = a->start[i]; g->el[k].type != GE_END && g->el[k].type != GE_ALT; k++)
            c += g->el[k].type == GE_REF ? 1u : terms_hold ? 0u : (1u << 30);
        need[i] = c;
        if (c == 0 && !out[a->rule[i]]) out[a->rule[i]] = true, work[nw++] = a->rule[i];
    }
    while (nw > 0) {
        uint32_t r = work[--nw];
        for (uint32_t o = a->occ_off[r]; o < a->occ_off[r + 1]; o++) {
            uint32_t i = a->occ[o];
            if (--need[i] == 0 && !out[a->rule[i]]) out[a->rule[i]] = true, work[nw++] = a->rule[i];
        }
    }
    free(need), free(work);
    return true;
}

static const char *rule_label(const char *const *names, uint32_t r) { return names[r] ? names[r] : "(a group or repetition)"; }

/* Left recursion: a cycle in the graph A -> B where B is referred to in an alternative
 * of A after nothing but nullable rules.  Iterative depth-first search with colours. */
static tandem_status left_rec(const tdm_grammar *g, const alts *a, const bool *nullable, const char *const *names,
                              const char *const *where, tdm_err *err) {
    uint32_t n = g->n_rules;
    uint8_t *colour = tdm_calloc(n, 1);
    uint32_t *stk = tdm_mallocarray(n, sizeof(uint32_t)); /* rule on the DFS path */
    uint32_t *pos = tdm_mallocarray(n, sizeof(uint32_t)); /* its next element to look at */
    bool *lft = tdm_mallocarray(n, sizeof(bool));     /* whether it is at a left position */
    tandem_status st = TANDEM_OK;
    if (!colour || !stk || !pos || !lft) {
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar: out of memory");
        goto out;
    }
    (void)a;
    for (uint32_t s = 0; s < n && st == TANDEM_OK; s++) {
        if (colour[s]) continue;
        uint32_t depth = 0;
        stk[depth] = s, pos[depth] = g->rule_start[s], lft[depth] = true, depth++;
        colour[s] = 1;
        while (depth > 0 && st == TANDEM_OK) {
            uint32_t r = stk[depth - 1];
            uint32_t k = pos[depth - 1];
            bool left = lft[depth - 1];
            /* the next reference of r at a left position (after nothing but nullable
             * references in its alternative) */
            uint32_t target = UINT32_MAX;
            for (; g->el[k].type != GE_END; k++) {
                uint32_t t = g->el[k].type;
                if (t == GE_ALT) left = true;
                else if (t == GE_TERM) left = false;
                else {
                    bool was = left;
                    left = left && nullable[g->el[k].val];
                    if (was) { target = g->el[k].val; k++; break; }
                }
            }
            pos[depth - 1] = k, lft[depth - 1] = left;
            if (target != UINT32_MAX) {
                if (colour[target] == 1) {
                    /* a cycle: name a user rule on it */
                    uint32_t named = target;
                    for (uint32_t d = depth; d-- > 0;) {
                        if (names[stk[d]]) named = stk[d];
                        if (stk[d] == target) break;
                    }
                    if (names[target]) named = target;
                    st = tdm_seterr(err, TANDEM_ERR_FORMAT,
                                    "grammar line %s: left recursion: rule '%.64s' can reach itself without "
                                    "matching a character (a repetition of something that can be empty counts)",
                                    where[named], rule_label(names, named));
                    break;
                }
                if (colour[target] == 0) {
                    colour[target] = 1;
                    stk[depth] = target, pos[depth] = g->rule_start[target], lft[depth] = true, depth++;
                }
                continue;
            }
            colour[r] = 2;
            depth--;
        }
    }
out:
    free(colour), free(stk), free(pos), free(lft);
    return st;
}

tandem_status tdm_grammar_check(const tdm_grammar *g, const char *const *names, const char *const *where,
                                tdm_err *err) {
    alts a = {0};
    bool *nullable = tdm_calloc(g->n_rules, sizeof(bool));
    bool *productive = tdm_calloc(g->n_rules, sizeof(bool));
    tandem_status st = TANDEM_OK;
    if (!nullable || !productive || !alts_build(g, &a) || !fixpoint(g, &a, false, nullable) ||
        !fixpoint(g, &a, true, productive)) {
        st = tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar: out of memory");
    } else {
        st = left_rec(g, &a, nullable, names, where, err);
        if (st == TANDEM_OK && !productive[g->root])
            st = tdm_seterr(err, TANDEM_ERR_FORMAT,
                            "grammar line %s: the grammar can match nothing: rule 'root' never ends (each of its "
                            "alternatives needs a rule that recurses forever)",
                            where[g->root]);
    }
    alts_free(&a);
    free(nullable), free(productive);
    return st;
}
