/* cli_merge.c - `tandem merge OUT.jsonl IN.jsonl... [--input JOB_INPUT.jsonl] [--force]`:
 * joins the outputs of a job's shards (`tandem run --shard I/N`).
 *
 * The lines are copied as they are, file by file in the order given.  Every line must
 * be a complete JSON object (ending in a newline: a last line cut short by a kill is
 * refused, as the rerun of that shard would complete it) with an "id", and every id
 * must appear exactly once over all the files; with --input, every id of the job's
 * input must be there and no other.  Ids compare as `tandem run` writes them (the JSON
 * text: 7 and "7" differ).  The result goes to OUT.tmp, renamed to OUT when every
 * check passed: on an error OUT is not touched and nothing is left behind.  An
 * existing OUT is replaced only with --force (`tandem merge s1.jsonl s2.jsonl`
 * without OUT would otherwise overwrite a shard).
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "input.h"
#include "json.h"

#define MERGE_LINE_MAX TDM_INPUT_TOTAL_MAX /* one output line at most (64 MiB) */
#define MERGE_SHOW 5                       /* problems listed one by one, at most */

typedef struct merge_opts {
    const char *out, *input;
    char **ins;                  /* [n_ins] the shard outputs (argv) */
    int n_ins;
    bool force;
} merge_opts;

/* One id of the shard outputs, where it stands. */
typedef struct merge_id {
    char *id;                    /* the JSON text (heap) */
    const char *file;
    int line;
    size_t seq;                  /* reading order */
} merge_id;

typedef struct merge_ids {
    merge_id *v;
    size_t n, cap;
} merge_ids;

static void ids_free(merge_ids *ids) {
    for (size_t i = 0; i < ids->n; i++) free(ids->v[i].id);
    free(ids->v);
    *ids = (merge_ids){0};
}

static bool ids_push(merge_ids *ids, char *id, const char *file, int line) {
    if (ids->n == ids->cap) {
        size_t nc = ids->cap ? 2 * ids->cap : 256;
        merge_id *nv = realloc(ids->v, nc * sizeof *nv);
        if (!nv) return false;
        ids->v = nv;
        ids->cap = nc;
    }
    ids->v[ids->n] = (merge_id){id, file, line, ids->n};
    ids->n++;
    return true;
}

static int cmp_id(const void *a, const void *b) {
    const merge_id *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->seq > y->seq) - (x->seq < y->seq);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void strs_free(char **v, size_t n) {
    for (size_t i = 0; v && i < n; i++) free(v[i]);
    free(v);
}

/* Returns -1 to go on, else an exit code. */
static int parse_args(int argc, char **argv, merge_opts *o) {
    *o = (merge_opts){.ins = calloc((size_t)argc, sizeof *o->ins)};
    if (!o->ins) return cli_error("out of memory");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool missing = false;
        if (cli_is_help(a)) return cli_usage(stdout), CLI_EXIT_OK;
        if (cli_opt_flag(a, NULL, "--force")) o->force = true;
        else if (cli_take(argc, argv, &i, NULL, "--input", &v, &missing)) o->input = v;
        else if (a[0] == '-' && a[1]) return cli_unknown_arg(a);
        else if (!o->out) o->out = a;
        else o->ins[o->n_ins++] = argv[i];
        if (missing) return CLI_EXIT_USAGE;
    }
    if (!o->out) return cli_usage_error("merge: missing OUT.jsonl");
    if (o->n_ins == 0) return cli_usage_error("merge: no input files (tandem merge OUT.jsonl IN.jsonl...)");
    return -1;
}

/* One line of a shard output: checked, its id collected, copied to out.  False with
 * err set ("FILE:LINE: problem"). */
static bool take_line(const char *path, int line, const char *text, size_t n, FILE *out, merge_ids *ids,
                      size_t *n_err_lines, char *err, size_t cap) {
    tdm_json *j = NULL;
    tdm_err jerr = {0};
    if (tdm_json_parse(text, n, &j, &jerr) != TANDEM_OK)
        return snprintf(err, cap, "%s:%d: malformed line (invalid JSON: %s)", path, line, jerr.msg), false;
    const tdm_json *id = tdm_json_get(j, "id");
    char *t = id ? cli_json_id_text(id) : NULL;
    if (tdm_json_get(j, "error")) (*n_err_lines)++;
    const bool is_object = j->type == TDM_JSON_OBJECT;
    tdm_json_free(j);
    if (!is_object) return snprintf(err, cap, "%s:%d: malformed line (not a JSON object)", path, line), false;
    if (!id) return snprintf(err, cap, "%s:%d: a line without an \"id\"", path, line), false;
    if (!t) return snprintf(err, cap, "%s:%d: \"id\" is not a number or a string", path, line), false;
    if (!ids_push(ids, t, path, line)) return free(t), snprintf(err, cap, "out of memory"), false;
    fwrite(text, 1, n, out);
    fputc('\n', out);
    return true;
}

/* Copies the lines of one shard output into out (blank lines dropped). */
static bool take_file(const char *path, FILE *out, merge_ids *ids, size_t *n_err_lines, char *err, size_t cap) {
    tdm_lines r;
    tdm_err terr = {0};
    if (tdm_lines_open(&r, path, MERGE_LINE_MAX, SIZE_MAX, &terr) != TANDEM_OK)
        return snprintf(err, cap, "%s", terr.msg), false;
    bool ok = true;
    for (;;) {
        const char *text;
        size_t n;
        bool got;
        if (tdm_lines_next(&r, &text, &n, &got, &terr) != TANDEM_OK) {
            snprintf(err, cap, "%s", terr.msg);
            ok = false;
        }
        if (!ok || !got) break;
        if (text + n == r.buf + r.end) { /* no newline after it: the writer was stopped */
            snprintf(err, cap, "%s:%d: truncated line (no newline at its end: the job was stopped while writing "
                     "it; run that shard again to complete it)", path, r.line);
            ok = false;
        } else if (n > 0 && strspn(text, " \t\r") < n) {
            ok = take_line(path, r.line, text, n, out, ids, n_err_lines, err, cap);
        }
    }
    tdm_lines_close(&r);
    return ok;
}

/* Reports every id found more than once (the first MERGE_SHOW by name); ids sorted. */
static bool check_unique(const merge_ids *ids) {
    size_t n_dup = 0;
    for (size_t i = 1, first = 0; i < ids->n; i++) {
        if (strcmp(ids->v[i].id, ids->v[first].id) != 0) {
            first = i;
            continue;
        }
        if (n_dup++ < MERGE_SHOW)
            fprintf(stderr, "error: %s:%d: duplicate id %s (first at %s:%d)\n", ids->v[i].file, ids->v[i].line,
                    ids->v[i].id, ids->v[first].file, ids->v[first].line);
    }
    if (n_dup > MERGE_SHOW) fprintf(stderr, "error: %zu duplicate ids in all\n", n_dup);
    return n_dup == 0;
}

/* The job input's ids, in input order ([*n] heap strings). */
static bool input_ids(const char *path, char ***out, size_t *n) {
    char err[PATH_MAX + 512];
    cli_prompts in;
    *out = NULL;
    *n = 0;
    if (!cli_prompts_read_lenient(path, &in, err, sizeof err)) return cli_error("%s", err), false;
    const size_t m = in.n;
    char **v = calloc(m, sizeof *v);
    bool ok = v != NULL;
    for (size_t i = 0; ok && i < m; i++) ok = (v[i] = cli_prompt_id_text(&in.items[i])) != NULL;
    cli_prompts_free(&in);
    if (!ok) return strs_free(v, m), cli_error("out of memory"), false;
    *out = v;
    *n = m;
    return true;
}

static bool has_id(const merge_ids *ids, const char *id) {
    merge_id key = {.id = (char *)id, .seq = 0};
    size_t lo = 0, hi = ids->n; /* the first entry >= (id, 0) */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cmp_id(&ids->v[mid], &key) < 0) lo = mid + 1;
        else hi = mid;
    }
    return lo < ids->n && strcmp(ids->v[lo].id, id) == 0;
}

/* --input: every input id present (listed in input order), no other. */
static bool check_input(const merge_ids *ids, const char *path) {
    char **want;
    size_t n_want;
    if (!input_ids(path, &want, &n_want)) return false;
    char **sorted = malloc(n_want * sizeof *sorted);
    if (!sorted) return strs_free(want, n_want), cli_error("out of memory"), false;
    size_t n_missing = 0, n_extra = 0;
    for (size_t i = 0; i < n_want; i++)
        if (!has_id(ids, want[i]) && n_missing++ < MERGE_SHOW * 2)
            fprintf(stderr, "%s%s", n_missing == 1 ? "error: missing ids: " : ", ", want[i]);
    if (n_missing)
        fprintf(stderr, "%s (%zu of the %zu ids of %s)\n", n_missing > MERGE_SHOW * 2 ? ", ..." : "", n_missing,
                n_want, path);
    memcpy(sorted, want, n_want * sizeof *sorted);
    qsort(sorted, n_want, sizeof *sorted, cmp_str);
    for (size_t i = 0; i < ids->n; i++)
        if (!bsearch(&ids->v[i].id, sorted, n_want, sizeof *sorted, cmp_str) && n_extra++ < MERGE_SHOW)
            fprintf(stderr, "error: %s:%d: id %s is not in %s\n", ids->v[i].file, ids->v[i].line, ids->v[i].id, path);
    if (n_extra > MERGE_SHOW) fprintf(stderr, "error: %zu ids in all are not in %s\n", n_extra, path);
    const bool ok = n_missing == 0 && n_extra == 0;
    strs_free(want, n_want);
    free(sorted);
    return ok;
}

/* Writes OUT.tmp from the inputs and checks it; false when anything failed (reported). */
static bool merge_into(const merge_opts *o, FILE *tmp, const char *tmp_path, merge_ids *ids, size_t *n_err_lines) {
    char err[PATH_MAX + 512];
    for (int i = 0; i < o->n_ins; i++)
        if (!take_file(o->ins[i], tmp, ids, n_err_lines, err, sizeof err)) return cli_error("%s", err), false;
    if (fflush(tmp) != 0 || ferror(tmp) || fsync(fileno(tmp)) != 0)
        return cli_error("%s: %s", tmp_path, strerror(errno)), false;
    qsort(ids->v, ids->n, sizeof *ids->v, cmp_id);
    if (!check_unique(ids)) return false;
    return !o->input || check_input(ids, o->input);
}

/* Opens OUT.tmp, refusing an existing OUT without --force; NULL when it cannot
 * (reported). */
static FILE *open_tmp(const merge_opts *o, char *tmp_path, size_t cap) {
    struct stat st;
    if (!o->force && stat(o->out, &st) == 0) return cli_error("%s: exists (give --force to replace it)", o->out), NULL;
    if (snprintf(tmp_path, cap, "%s.tmp", o->out) >= (int)cap) return cli_error("%s: path too long", o->out), NULL;
    FILE *f = fopen(tmp_path, "w");
    if (!f) cli_error("%s: %s", tmp_path, strerror(errno));
    return f;
}

int cli_merge(int argc, char **argv) {
    merge_opts o;
    int rc = parse_args(argc, argv, &o);
    char tmp_path[PATH_MAX];
    FILE *tmp = rc < 0 ? open_tmp(&o, tmp_path, sizeof tmp_path) : NULL;
    if (!tmp) {
        free(o.ins);
        return rc >= 0 ? rc : CLI_EXIT_ERROR;
    }
    merge_ids ids = {0};
    size_t n_err_lines = 0;
    bool ok = merge_into(&o, tmp, tmp_path, &ids, &n_err_lines);
    if (fclose(tmp) != 0 && ok) ok = (cli_error("%s: %s", tmp_path, strerror(errno)), false);
    if (ok && rename(tmp_path, o.out) != 0) ok = (cli_error("%s -> %s: %s", tmp_path, o.out, strerror(errno)), false);
    if (ok)
        fprintf(stderr, "merge: %zu lines from %d files into %s (%zu of them error lines)\n", ids.n, o.n_ins, o.out,
                n_err_lines);
    else
        unlink(tmp_path);
    ids_free(&ids);
    free(o.ins);
    return ok ? CLI_EXIT_OK : CLI_EXIT_ERROR;
}
