/* gshare.c - a mask cache shared by the matchers of one grammar over one vocabulary
 * (grammar.h, tdm_gshare): the masks of recent states keyed by the states' content
 * (gmask.c builds the key: the partial UTF-8 sequence and each stack's element
 * positions, the stacks in a canonical order), so that the sequences of a batch under
 * one schema, which meet the same states, walk the vocabulary once per state.  A
 * mutex guards it: masks are computed on several threads at once.  Entries are
 * replaced oldest first; a lookup scans the entries' hashes (a few hundred at most:
 * far cheaper than the walk it saves). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_internal.h"

typedef struct gshare_entry {
    uint64_t h;       /* the key's hash (0: empty) */
    uint32_t *key;    /* [n] */
    uint32_t n;
    uint32_t *mask;   /* [words] */
    int32_t count;
} gshare_entry;

struct tdm_gshare {
    const tdm_grammar *g;
    const tdm_gvocab *v;
    size_t words;
    pthread_mutex_t mu;
    gshare_entry *e;  /* [cap] */
    uint32_t cap, n, next; /* next: the entry to replace once all are used */
    uint64_t hits, misses;
};

tandem_status tdm_gshare_create(const tdm_grammar *g, const tdm_gvocab *v, size_t max_bytes, tdm_gshare **out,
                                tdm_err *err) {
    if (!g || !v || !out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar mask cache: NULL argument");
    *out = NULL;
    tdm_gshare *sh = calloc(1, sizeof *sh);
    if (!sh) return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask cache: out of memory");
    sh->g = g, sh->v = v, sh->words = tdm_gvocab_mask_words(v);
    size_t cap = max_bytes / (sh->words * sizeof(uint32_t));
    sh->cap = (uint32_t)TDM_MIN(TDM_MAX(cap, (size_t)16), (size_t)TDM_GSHARE_MAX_ENTRIES);
    sh->e = calloc(sh->cap, sizeof *sh->e);
    if (!sh->e || pthread_mutex_init(&sh->mu, NULL) != 0) {
        free(sh->e), free(sh);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "grammar mask cache: out of memory");
    }
    *out = sh;
    return TANDEM_OK;
}

void tdm_gshare_free(tdm_gshare *sh) {
    if (!sh) return;
    for (uint32_t k = 0; k < sh->n; k++) free(sh->e[k].key), free(sh->e[k].mask);
    free(sh->e);
    pthread_mutex_destroy(&sh->mu);
    free(sh);
}

tandem_status tdm_gmatch_share(tdm_gmatch *m, tdm_gshare *sh, tdm_err *err) {
    if (!m) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar matcher: NULL argument");
    if (sh && sh->g != m->g)
        return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "grammar mask cache: of another grammar than the matcher's");
    m->share = sh;
    return TANDEM_OK;
}

bool tdm_gshare_usable(const tdm_gshare *sh, const tdm_grammar *g, const tdm_gvocab *v) {
    return sh && sh->g == g && sh->v == v;
}

void tdm_gshare_counts(tdm_gshare *sh, uint64_t *hits, uint64_t *misses) {
    pthread_mutex_lock(&sh->mu);
    *hits = sh->hits, *misses = sh->misses;
    pthread_mutex_unlock(&sh->mu);
}

static gshare_entry *find(tdm_gshare *sh, uint64_t h, const uint32_t *key, uint32_t n) {
    for (uint32_t k = 0; k < sh->n; k++) {
        gshare_entry *e = &sh->e[k];
        if (e->h == h && e->n == n && memcmp(e->key, key, (size_t)n * sizeof(uint32_t)) == 0) return e;
    }
    return NULL;
}

bool tdm_gshare_get(tdm_gshare *sh, uint64_t h, const uint32_t *key, uint32_t n, uint32_t *mask, int32_t *count) {
    pthread_mutex_lock(&sh->mu);
    const gshare_entry *e = find(sh, h | 1, key, n);
    if (e) {
        memcpy(mask, e->mask, sh->words * sizeof(uint32_t));
        *count = e->count;
        sh->hits++;
    } else {
        sh->misses++;
    }
    pthread_mutex_unlock(&sh->mu);
    return e != NULL;
}

void tdm_gshare_put(tdm_gshare *sh, uint64_t h, const uint32_t *key, uint32_t n, const uint32_t *mask, int32_t count) {
    h |= 1; /* (0 marks an empty entry) */
    uint32_t *nk = tdm_mallocarray((size_t)n + 1, sizeof(uint32_t));
    if (!nk) return; /* (memory short: only not cached) */
    memcpy(nk, key, (size_t)n * sizeof(uint32_t));
    pthread_mutex_lock(&sh->mu);
    gshare_entry *e = NULL;
    if (!find(sh, h, key, n)) { /* (another thread may have put it meanwhile) */
        if (sh->n < sh->cap) {
            uint32_t *m = tdm_mallocarray(sh->words, sizeof(uint32_t));
            if (m) e = &sh->e[sh->n++], e->mask = m;
        } else {
            e = &sh->e[sh->next];
            sh->next = (sh->next + 1) % sh->cap;
        }
    }
    if (e) {
        free(e->key);
        e->key = nk, nk = NULL;
        e->h = h, e->n = n, e->count = count;
        memcpy(e->mask, mask, sh->words * sizeof(uint32_t));
    }
    pthread_mutex_unlock(&sh->mu);
    free(nk);
}
