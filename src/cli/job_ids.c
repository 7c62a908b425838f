/* job_ids.c - the ids of a job's lines and where each stands (FILE:LINE): `tandem run`
 * checks that its input's are unique before anything runs (a resume finds its done
 * lines by id); `tandem merge` checks its shards' outputs and --input.  Ids compare as
 * the JSON text an output line holds (cli_prompt_id_text): 7 and "7" differ.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define IDS_SHOW 5 /* duplicates listed one by one, at most */

void cli_ids_free(cli_ids *ids) {
    for (size_t i = 0; i < ids->n; i++) free(ids->v[i].id);
    free(ids->v);
    *ids = (cli_ids){0};
}

bool cli_ids_push(cli_ids *ids, char *id, const char *file, int line, bool implicit) {
    if (ids->n == ids->cap) {
        size_t nc = ids->cap ? 2 * ids->cap : 256;
        cli_id_at *nv = realloc(ids->v, nc * sizeof *nv);
        if (!nv) return false;
        ids->v = nv;
        ids->cap = nc;
    }
    ids->v[ids->n] = (cli_id_at){id, file, line, implicit, ids->n};
    ids->n++;
    return true;
}

bool cli_ids_of_prompts(cli_ids *ids, const cli_prompts *ps, const char *file) {
    for (size_t i = 0; i < ps->n; i++) {
        const cli_prompt *p = &ps->items[i];
        char *t = cli_prompt_id_text(p);
        if (!t || !cli_ids_push(ids, t, file, p->line, p->id_kind == CLI_ID_INT)) {
            free(t);
            cli_error("out of memory");
            return false;
        }
    }
    return true;
}

static int cmp_id(const void *a, const void *b) {
    const cli_id_at *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

void cli_ids_sort(cli_ids *ids) {
    if (ids->n) qsort(ids->v, ids->n, sizeof *ids->v, cmp_id);
}

bool cli_ids_unique(const cli_ids *ids) {
    size_t n_dup = 0;
    for (size_t i = 1, first = 0; i < ids->n; i++) {
        const cli_id_at *a = &ids->v[first], *b = &ids->v[i];
        if (strcmp(b->id, a->id) != 0) {
            first = i;
            continue;
        }
        if (n_dup++ < IDS_SHOW)
            cli_error("%s:%d: duplicate id %s (first at %s:%d%s)", b->file, b->line, b->id, a->file, a->line,
                      a->implicit || b->implicit ? "; a line without an \"id\" takes its 0-based index" : "");
    }
    if (n_dup > IDS_SHOW) cli_error("%zu duplicate ids in all", n_dup);
    return n_dup == 0;
}

bool cli_ids_has(const cli_ids *ids, const char *id) {
    size_t lo = 0, hi = ids->n; /* the first entry >= id */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(ids->v[mid].id, id) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < ids->n && strcmp(ids->v[lo].id, id) == 0;
}
