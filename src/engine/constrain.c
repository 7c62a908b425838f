/* constrain.c - a request's grammar constraint (constrain.h). */
#include "constrain.h"

#include <stdlib.h>
#include <string.h>

#include "json_schema.h"

/* One shared grammar: its text (a json_schema's or a GBNF grammar's), the compiled
 * grammar and its mask cache, the requests on it, and when it was last taken. */
struct tdm_con_entry {
    bool schema;
    char *text;
    size_t len;
    tdm_grammar *g;     /* NULL: a free place */
    tdm_gshare *sh;
    int32_t refs;
    uint64_t used;
};

struct tdm_con_reg {
    pthread_mutex_t mu;
    tdm_con_entry e[TDM_CON_SHARED];
    uint64_t clock;
};

static void entry_clear(tdm_con_entry *x) {
    tdm_gshare_free(x->sh);
    tdm_grammar_free(x->g);
    free(x->text);
    *x = (tdm_con_entry){0};
}

void tdm_constraint_reg_free(tdm_con_reg *r) {
    if (!r) return;
    for (int k = 0; k < TDM_CON_SHARED; k++) entry_clear(&r->e[k]);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* The engine's vocabulary and shared grammars, made at the first constrained request
 * (the registry's absence, out of memory, only leaves grammars unshared). */
static tandem_status engine_gvocab(tdm_engine *e, const tdm_gvocab **out, tdm_con_reg **reg, tdm_err *err) {
    tandem_status st = TANDEM_OK;
    pthread_mutex_lock(&e->gv_mu);
    if (!e->gvocab) st = tdm_gvocab_create(e->target->tok, &e->gvocab, err);
    if (!st && !e->con_reg && (e->con_reg = calloc(1, sizeof *e->con_reg)) &&
        pthread_mutex_init(&e->con_reg->mu, NULL) != 0) {
        free(e->con_reg);
        e->con_reg = NULL;
    }
    *out = e->gvocab;
    *reg = e->con_reg;
    pthread_mutex_unlock(&e->gv_mu);
    return st;
}

/* The entry of this text in use or kept (its refs taken), or NULL; under r->mu. */
static tdm_con_entry *entry_find(tdm_con_reg *r, bool schema, const char *text, size_t len) {
    for (int k = 0; k < TDM_CON_SHARED; k++) {
        tdm_con_entry *x = &r->e[k];
        if (x->g && x->schema == schema && x->len == len && !memcmp(x->text, text, len)) {
            x->refs++;
            x->used = ++r->clock;
            return x;
        }
    }
    return NULL;
}

/* c->g: the shared grammar of this text, else compiled here (shared where a place is
 * free or idle, else owned by c).  Errors: the grammar engine's (gerr). */
static tandem_status constraint_grammar(tdm_constraint *c, const tdm_gvocab *v, bool schema, const char *text,
                                        tdm_err *gerr) {
    const size_t len = strlen(text);
    tdm_con_reg *r = c->reg;
    if (r) {
        pthread_mutex_lock(&r->mu);
        c->shared = entry_find(r, schema, text, len);
        pthread_mutex_unlock(&r->mu);
        if (c->shared) {
            c->g = c->shared->g;
            return TANDEM_OK;
        }
    }
    tdm_grammar *g;
    tandem_status st = schema ? tdm_json_schema_grammar(text, len, &g, gerr) : tdm_grammar_parse(text, len, &g, gerr);
    if (st) return st;
    c->g = g; /* (owned unless shared below) */
    if (!r) return TANDEM_OK;
    char *copy = tdm_strndup(text, len);
    tdm_gshare *sh = NULL;
    tdm_err serr;
    if (!copy || tdm_gshare_create(g, v, TDM_CON_SHARE_BYTES, &sh, &serr)) {
        free(copy);
        return TANDEM_OK; /* (memory short: unshared) */
    }
    pthread_mutex_lock(&r->mu);
    tdm_con_entry *x = entry_find(r, schema, text, len); /* (another request's, compiled meanwhile) */
    if (!x) {
        tdm_con_entry *place = NULL; /* a free place, else the idle one least recently taken */
        for (int k = 0; k < TDM_CON_SHARED && !(place && !place->g); k++)
            if (!r->e[k].g || (!r->e[k].refs && (!place || r->e[k].used < place->used))) place = &r->e[k];
        if (place) {
            entry_clear(place);
            *place = (tdm_con_entry){schema, copy, len, g, sh, 1, ++r->clock};
            copy = NULL, sh = NULL, g = NULL;
            x = place;
        }
    }
    pthread_mutex_unlock(&r->mu);
    free(copy);
    tdm_gshare_free(sh);
    if (x) {
        tdm_grammar_free(g); /* (NULL where it became the entry's) */
        c->shared = x;
        c->g = x->g;
    }
    return TANDEM_OK;
}

/* A grammar engine's error as the request's: TANDEM_ERR_INVALID_ARG (the request's
 * value is wrong) naming the field, unless memory ran out. */
static tandem_status bad_value(tandem_status st, const char *field, const tdm_err *gerr, tdm_err *err) {
    const char *msg = strncmp(gerr->msg, "grammar ", 8) ? gerr->msg : gerr->msg + 8; /* ("grammar line 3:7: ...") */
    if (st == TANDEM_ERR_NOMEM) return tdm_seterr(err, st, "%s: %s", field, msg);
    return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: %s", field, msg);
}

tandem_status tdm_constraint_init(tdm_engine *e, tdm_seq *s, const tandem_generate_params *gp, tdm_err *err) {
    s->con = NULL;
    if (!gp->grammar && !gp->json_schema) return TANDEM_OK;
    if (gp->grammar && gp->json_schema)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar and json_schema are both set (at most one constrains a request)");
    tdm_constraint *c = calloc(1, sizeof *c);
    if (!c) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    s->con = c;
    tdm_err gerr = {0};
    tandem_status st = engine_gvocab(e, &c->v, &c->reg, err);
    if (st) return st;
    const bool schema = !gp->grammar;
    if ((st = constraint_grammar(c, c->v, schema, schema ? gp->json_schema : gp->grammar, &gerr)))
        return bad_value(st, schema ? "json_schema" : "grammar", &gerr, err);
    if ((st = tdm_gmatch_create(c->g, &c->m, err))) return st;
    if (c->shared && (st = tdm_gmatch_share(c->m, c->shared->sh, err))) return st;
    c->words = e->mask_words;
    c->masks = tdm_calloc((size_t)TDM_CON_ROWS * c->words, sizeof(uint32_t));
    if (!c->masks) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    /* refused before any token runs: a grammar the vocabulary cannot start */
    int32_t n_allowed = 0;
    if ((st = tdm_constraint_mask_now(s, c->masks, &n_allowed, &gerr))) return bad_value(st, gp->grammar ? "grammar" : "json_schema", &gerr, err);
    if (n_allowed == 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s: no token of the model's vocabulary can begin its text",
                          gp->grammar ? "grammar" : "json_schema");
    return TANDEM_OK;
}

void tdm_constraint_free(tdm_seq *s) {
    tdm_constraint *c = s->con;
    if (!c) return;
    tdm_gmatch_free(c->m);
    if (c->shared) {
        pthread_mutex_lock(&c->reg->mu);
        c->shared->refs--;
        pthread_mutex_unlock(&c->reg->mu);
    } else {
        tdm_grammar_free(c->g);
    }
    free(c->masks);
    free(c->pmasks);
    free(c->key);
    free(c);
    s->con = NULL;
}

tandem_status tdm_constraint_mask_now(tdm_seq *s, uint32_t *row, int32_t *n_allowed, tdm_err *err) {
    tdm_constraint *c = s->con;
    const size_t vw = tdm_gvocab_mask_words(c->v);
    if (vw <= c->words) {
        tandem_status st = tdm_gmatch_mask(c->m, c->v, row, n_allowed, err);
        if (st) return st;
        memset(row + vw, 0, (c->words - vw) * sizeof(uint32_t)); /* (ids past the tokenizer's) */
        return TANDEM_OK;
    }
    /* a tokenizer larger than the model's head (never seen): its mask cut to the head */
    uint32_t *full = malloc(vw * sizeof(uint32_t));
    if (!full) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    tandem_status st = tdm_gmatch_mask(c->m, c->v, full, n_allowed, err);
    if (!st) {
        memcpy(row, full, c->words * sizeof(uint32_t));
        *n_allowed = 0;
        for (size_t w = 0; w < c->words; w++) *n_allowed += __builtin_popcount(row[w]);
    }
    free(full);
    return st;
}

tandem_status tdm_constraint_rows(tdm_seq *s, const int32_t *draft, int32_t k, tdm_err *err) {
    tdm_constraint *c = s->con;
    if (k < 0 || k + 1 > TDM_CON_ROWS)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "masks of a chain of %d tokens, at most %d", (int)k, TDM_CON_ROWS - 1);
    const uint32_t mark = tdm_gmatch_mark(c->m);
    tandem_status st = TANDEM_OK;
    /* the rows the drafting computed for this chain: the matcher brought past them */
    int32_t d = TDM_MIN(c->n_valid, k);
    c->n_valid = 0;
    for (int32_t x = 0; x < d; x++) {
        tdm_err aerr;
        if (tdm_gmatch_accept_token(c->m, c->v, draft[x], &aerr)) { /* (never: the drafting accepted them) */
            d = 0;
            (void)tdm_gmatch_rollback(c->m, mark, &aerr);
            break;
        }
    }
    for (; d <= k; d++) {
        uint32_t *row = c->masks + (size_t)d * c->words;
        int32_t n_allowed = 0;
        if ((st = tdm_constraint_mask_now(s, row, &n_allowed, err))) break;
        if (n_allowed == 0) {
            if (d == 0) {
                st = tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                                "the grammar allows no token of the model's vocabulary after the text so far");
                break;
            }
            memset(row, 0xff, c->words * sizeof(uint32_t)); /* (the sequence ends before this row's token) */
        }
        if (d == k) break;
        tdm_err aerr;
        if (tdm_gmatch_accept_token(c->m, c->v, draft[d], &aerr)) { /* (a proposal cut short: the rest never kept) */
            for (int32_t x = d + 1; x <= k; x++) memset(c->masks + (size_t)x * c->words, 0xff, c->words * sizeof(uint32_t));
            break;
        }
    }
    tdm_err rerr;
    (void)tdm_gmatch_rollback(c->m, mark, &rerr);
    return st;
}

/* The kept mask of path[0..n) (tdm_constraint.pmasks), or -1. */
static int32_t path_find(const tdm_constraint *c, const int32_t *path, int32_t n) {
    if (n > TDM_CON_PATH_MAX) return -1;
    for (int32_t x = 0; x < c->n_paths; x++)
        if (c->key_n[x] == n && !memcmp(c->key[x], path, (size_t)n * sizeof *path)) return x;
    return -1;
}

/* The mask of the matcher's state (after path[0..n)) into a new kept entry where
 * there is room (its index), else into masks row 0 (-1); *row where it is. */
static tandem_status path_keep(tdm_seq *s, const int32_t *path, int32_t n, const uint32_t **row, int32_t *n_allowed,
                               tdm_err *err) {
    tdm_constraint *c = s->con;
    if (!c->pmasks && n <= TDM_CON_PATH_MAX) {
        c->pmasks = tdm_calloc((size_t)TDM_CON_ROWS * c->words, sizeof(uint32_t));
        c->key = calloc(TDM_CON_ROWS, sizeof *c->key);
        if (!c->pmasks || !c->key) {
            free(c->pmasks), free(c->key);
            c->pmasks = NULL, c->key = NULL;
            return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        }
    }
    const bool keep = c->pmasks && n <= TDM_CON_PATH_MAX && c->n_paths < TDM_CON_ROWS;
    uint32_t *out = keep ? c->pmasks + (size_t)c->n_paths * c->words : c->masks;
    tandem_status st = tdm_constraint_mask_now(s, out, n_allowed, err);
    if (st) return st;
    if (keep) {
        memcpy(c->key[c->n_paths], path, (size_t)n * sizeof *path);
        c->key_n[c->n_paths] = n;
        c->allowed[c->n_paths++] = *n_allowed;
    }
    *row = out;
    return TANDEM_OK;
}

/* One row that allows every token. */
static void allow_all(tdm_constraint *c, int32_t row) { memset(c->masks + (size_t)row * c->words, 0xff, c->words * sizeof(uint32_t)); }

/* The walk of tdm_constraint_tree_rows below node v (the matcher at v's path, mark
 * `at`): each child's token accepted, its row masked, its own children walked, the
 * matcher rolled back to `at` before the next child.  A refused child: rows that
 * allow every token for it and (below) its subtree. */
static tandem_status tree_walk(tdm_seq *s, const int32_t *token, const int32_t *parent, int32_t n, int32_t v,
                               uint32_t at, int32_t *path, int32_t d, uint8_t *refused, tdm_err *err) {
    tdm_constraint *c = s->con;
    for (int32_t i = v + 1; i < n; i++) { /* (a child comes after its parent) */
        if (parent[i] != v) continue;
        tdm_err aerr;
        if (tdm_gmatch_accept_token(c->m, c->v, token[i], &aerr)) {
            refused[i] = 1;
            continue;
        }
        if (d < TDM_CON_ROWS) path[d] = token[i];
        uint32_t *row = c->masks + (size_t)(1 + i) * c->words;
        int32_t n_allowed = 0;
        const int32_t x = path_find(c, path, d + 1);
        tandem_status st = TANDEM_OK;
        if (x >= 0) { /* (the drafting's) */
            memcpy(row, c->pmasks + (size_t)x * c->words, c->words * sizeof(uint32_t));
            n_allowed = c->allowed[x];
        } else {
            st = tdm_constraint_mask_now(s, row, &n_allowed, err);
        }
        if (!st && n_allowed == 0) allow_all(c, 1 + i); /* (the grammar finished: node i ends the sequence) */
        if (!st) st = tree_walk(s, token, parent, n, i, tdm_gmatch_mark(c->m), path, d + 1, refused, err);
        tdm_err rerr;
        (void)tdm_gmatch_rollback(c->m, at, &rerr);
        if (st) return st;
    }
    return TANDEM_OK;
}

tandem_status tdm_constraint_tree_rows(tdm_seq *s, const int32_t *token, const int32_t *parent, int32_t n,
                                       tdm_err *err) {
    tdm_constraint *c = s->con;
    if (n < 0 || n + 1 > TDM_CON_ROWS)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "masks of a tree of %d nodes, at most %d", (int)n, TDM_CON_ROWS - 1);
    c->n_valid = 0; /* (a chain's drafted rows are overwritten) */
    int32_t n_allowed = 0, path[TDM_CON_ROWS];
    const int32_t x = path_find(c, path, 0);
    tandem_status st = TANDEM_OK;
    if (x >= 0) {
        memcpy(c->masks, c->pmasks + (size_t)x * c->words, c->words * sizeof(uint32_t));
        n_allowed = c->allowed[x];
    } else if ((st = tdm_constraint_mask_now(s, c->masks, &n_allowed, err))) {
        return st;
    }
    if (n_allowed == 0)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "the grammar allows no token of the model's vocabulary after the text so far");
    uint8_t refused[TDM_CON_ROWS] = {0};
    if ((st = tree_walk(s, token, parent, n, -1, tdm_gmatch_mark(c->m), path, 0, refused, err))) return st;
    for (int32_t i = 0; i < n; i++) {
        if (parent[i] >= 0 && refused[parent[i]]) refused[i] = 1; /* (parents first) */
        if (refused[i]) allow_all(c, 1 + i);
    }
    return TANDEM_OK;
}

tandem_status tdm_constraint_path_mask(tdm_seq *s, const int32_t *path, int32_t n, const uint32_t **mask,
                                       int32_t *n_allowed, tdm_err *err) {
    tdm_constraint *c = s->con;
    c->n_valid = 0;
    *n_allowed = 0;
    *mask = NULL;
    const int32_t x = path_find(c, path, n);
    if (x >= 0) {
        *mask = c->pmasks + (size_t)x * c->words;
        *n_allowed = c->allowed[x];
        return TANDEM_OK;
    }
    const uint32_t mark = tdm_gmatch_mark(c->m);
    tandem_status st = TANDEM_OK;
    int32_t i = 0;
    tdm_err aerr;
    while (i < n && !tdm_gmatch_accept_token(c->m, c->v, path[i], &aerr)) i++;
    if (i == n) st = path_keep(s, path, n, mask, n_allowed, err);
    tdm_err rerr;
    (void)tdm_gmatch_rollback(c->m, mark, &rerr);
    return st;
}

int32_t tdm_constraint_prefix(tdm_seq *s, const int32_t *toks, int32_t n) {
    tdm_constraint *c = s->con;
    const uint32_t mark = tdm_gmatch_mark(c->m);
    int32_t i = 0;
    tdm_err err;
    while (i < n && !tdm_gmatch_is_finished(c->m) && !tdm_gmatch_accept_token(c->m, c->v, toks[i], &err)) i++;
    (void)tdm_gmatch_rollback(c->m, mark, &err);
    return i;
}

void tdm_constraint_draft_begin(tdm_seq *s) {
    s->con->mark = tdm_gmatch_mark(s->con->m);
    s->con->n_valid = 0;
}

tandem_status tdm_constraint_draft_mask(tdm_seq *s, int32_t d, int32_t *n_allowed, tdm_err *err) {
    tdm_constraint *c = s->con;
    if (d < 0 || d >= TDM_CON_ROWS) return tdm_seterr(err, TANDEM_ERR_INTERNAL, "a chain slot %d, at most %d", (int)d, TDM_CON_ROWS - 1);
    tandem_status st = tdm_constraint_mask_now(s, c->masks + (size_t)d * c->words, n_allowed, err);
    c->n_valid = !st && c->n_valid == d ? d + 1 : 0; /* (rows in order, or none kept) */
    return st;
}

bool tdm_constraint_draft_accept(tdm_seq *s, int32_t token) {
    tdm_err err;
    return tdm_gmatch_accept_token(s->con->m, s->con->v, token, &err) == TANDEM_OK;
}

void tdm_constraint_draft_end(tdm_seq *s) {
    tdm_err err;
    (void)tdm_gmatch_rollback(s->con->m, s->con->mark, &err);
}

bool tdm_constraint_commit(tdm_seq *s, int32_t token) {
    tdm_constraint *c = s->con;
    tdm_err err;
    c->n_valid = 0;
    c->n_paths = 0; /* (the kept masks were of the text before it) */
    tandem_status st = tdm_gmatch_accept_token(c->m, c->v, token, &err);
    if (!st && tdm_gmatch_mark(c->m) >= TDM_CON_COMMIT_EVERY) st = tdm_gmatch_commit(c->m, &err);
    if (st && !c->fail_st) {
        c->fail_st = st == TANDEM_ERR_INVALID_ARG ? TANDEM_ERR_INTERNAL : st;
        tdm_seterr(&c->fail_err, c->fail_st, "grammar: committed token %d: %s", (int)token, err.msg);
    }
    return !st;
}

bool tdm_constraint_finished(const tdm_seq *s) { return tdm_gmatch_is_finished(s->con->m); }
