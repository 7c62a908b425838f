/* cli_merge.c - `tandem merge OUT.jsonl IN.jsonl... [--input JOB_INPUT.jsonl [--sort]]
 * [--force]`: joins the outputs of a job's shards (`tandem run --shard I/N`).
 *
 * The lines are copied as they are, file by file in the order given; with --sort (and
 * --input) they are written in the order of the job's input (`tandem run` writes them
 * in the order they complete), held in memory until then.  Every line must
 * be a complete JSON object (ending in a newline: a last line cut short by a kill is
 * refused, as the rerun of that shard would complete it) with an "id", and every id
 * must appear exactly once over all the files; with --input, every id of the job's
 * input must be there and no other.  Ids compare as `tandem run` writes them (the JSON
 * text: 7 and "7" differ).  The result goes to OUT.tmp (line_out.c: a regular file,
 * locked while it is written), synced and renamed to OUT when every check passed: on
 * an error (a full disk, a read-only file system among them) OUT is not touched and
 * nothing is left behind.  An existing OUT is replaced only with --force (`tandem
 * merge s1.jsonl s2.jsonl` without OUT would otherwise overwrite a shard), and only
 * when it is a regular file.
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
#define MERGE_FLUSH (1u << 20)             /* OUT.tmp written in pieces of about 1 MiB */

typedef struct merge_opts {
    const char *out, *input;
    char **ins;                  /* [n_ins] the shard outputs (argv) */
    int n_ins;
    bool force, sort;
} merge_opts;

/* --sort: the lines kept (in the order read) to be written in input order. */
typedef struct merge_kept {
    char **text;                 /* [n] each line with its newline */
    size_t *len;
    size_t n, cap;
} merge_kept;

static bool keep_line(merge_kept *k, const char *text, size_t n) {
    if (k->n == k->cap) {
        const size_t nc = k->cap ? 2 * k->cap : 256;
        char **nt = realloc(k->text, nc * sizeof *nt);
        if (nt) k->text = nt;
        size_t *nl = nt ? realloc(k->len, nc * sizeof *nl) : NULL;
        if (!nl) return false;
        k->len = nl;
        k->cap = nc;
    }
    char *t = malloc(n + 1);
    if (!t) return false;
    memcpy(t, text, n);
    t[n] = '\n';
    k->text[k->n] = t;
    k->len[k->n++] = n + 1;
    return true;
}

static void kept_free(merge_kept *k) {
    for (size_t i = 0; i < k->n; i++) free(k->text[i]);
    free(k->text), free(k->len);
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
        else if (cli_opt_flag(a, NULL, "--sort")) o->sort = true;
        else if (cli_take(argc, argv, &i, NULL, "--input", &v, &missing)) o->input = v;
        else if (a[0] == '-' && a[1]) return cli_unknown_arg(a);
        else if (!o->out) o->out = a;
        else o->ins[o->n_ins++] = argv[i];
        if (missing) return CLI_EXIT_USAGE;
    }
    if (!o->out) return cli_usage_error("merge: missing OUT.jsonl");
    if (o->n_ins == 0) return cli_usage_error("merge: no input files (tandem merge OUT.jsonl IN.jsonl...)");
    if (o->sort && !o->input) return cli_usage_error("merge: --sort needs --input JOB_INPUT.jsonl (its order)");
    return -1;
}

/* One line of a shard output: checked, its id collected, copied to out.  False with
 * err set ("FILE:LINE: problem"). */
static bool take_line(const char *path, int line, const char *text, size_t n, cli_line_out *out, cli_ids *ids,
                      merge_kept *kept, size_t *n_err_lines, char *err, size_t cap) {
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
    if (!cli_ids_push(ids, t, path, line, false)) return free(t), snprintf(err, cap, "out of memory"), false;
    if (kept) return keep_line(kept, text, n) ? true : (snprintf(err, cap, "out of memory"), false);
    FILE *f = cli_line_out_stream(out);
    fwrite(text, 1, n, f);
    fputc('\n', f);
    return cli_line_out_flush_at(out, MERGE_FLUSH) ? true : (snprintf(err, cap, "%s", out->err), false);
}

/* Copies the lines of one shard output into out (blank lines dropped). */
static bool take_file(const char *path, cli_line_out *out, cli_ids *ids, merge_kept *kept, size_t *n_err_lines,
                      char *err, size_t cap) {
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
            ok = take_line(path, r.line, text, n, out, ids, kept, n_err_lines, err, cap);
        }
    }
    tdm_lines_close(&r);
    return ok;
}

/* The ids of the job's input (path), in input order; false when it cannot be read
 * (reported). */
static bool input_ids(const char *path, cli_ids *want) {
    char err[PATH_MAX + 512];
    cli_prompts in;
    *want = (cli_ids){0};
    if (!cli_prompts_read_lenient(path, &in, err, sizeof err)) return cli_error("%s", err), false;
    const bool ok = cli_ids_of_prompts(want, &in, path);
    cli_prompts_free(&in);
    return ok;
}

/* --input: its ids unique, every one present (listed in input order), no other. */
static bool check_input(const cli_ids *ids, const char *path) {
    cli_ids want;
    bool ok = input_ids(path, &want);
    size_t n_missing = 0, n_extra = 0;
    for (size_t i = 0; ok && i < want.n; i++) /* (input order) */
        if (!cli_ids_has(ids, want.v[i].id) && n_missing++ < MERGE_SHOW * 2)
            fprintf(stderr, "%s%s", n_missing == 1 ? "error: missing ids: " : ", ", want.v[i].id);
    if (n_missing)
        fprintf(stderr, "%s (%zu of the %zu ids of %s)\n", n_missing > MERGE_SHOW * 2 ? ", ..." : "", n_missing,
                want.n, path);
    cli_ids_sort(&want);
    ok = ok && cli_ids_unique(&want);
    for (size_t i = 0; ok && i < ids->n; i++)
        if (!cli_ids_has(&want, ids->v[i].id) && n_extra++ < MERGE_SHOW)
            cli_error("%s:%d: id %s is not in %s", ids->v[i].file, ids->v[i].line, ids->v[i].id, path);
    if (n_extra > MERGE_SHOW) cli_error("%zu ids in all are not in %s", n_extra, path);
    cli_ids_free(&want);
    return ok && n_missing == 0 && n_extra == 0;
}

static int cmp_id_at(const void *a, const void *b) {
    return strcmp(((const cli_id_at *)a)->id, ((const cli_id_at *)b)->id);
}

/* --sort: the kept lines into tmp in the order of the input's ids (every one present
 * and unique: check_input passed); ids sorted by id, their seq the order read. */
static bool write_sorted(const char *input, const cli_ids *ids, const merge_kept *kept, cli_line_out *tmp) {
    cli_ids want;
    bool ok = input_ids(input, &want);
    for (size_t i = 0; ok && i < want.n; i++) {
        const cli_id_at key = {.id = want.v[i].id};
        const cli_id_at *hit = bsearch(&key, ids->v, ids->n, sizeof *ids->v, cmp_id_at);
        if (!hit) continue; /* (cannot be: checked) */
        fwrite(kept->text[hit->seq], 1, kept->len[hit->seq], cli_line_out_stream(tmp));
        if (!cli_line_out_flush_at(tmp, MERGE_FLUSH)) ok = (cli_error("%s", tmp->err), false);
    }
    cli_ids_free(&want);
    return ok;
}

/* Writes OUT.tmp from the inputs (--sort: once checked, in input order), syncs it
 * and checks the ids; false when anything failed (reported). */
static bool merge_into(const merge_opts *o, cli_line_out *tmp, cli_ids *ids, size_t *n_err_lines) {
    char err[PATH_MAX + 512];
    merge_kept kept = {0};
    bool ok = true;
    for (int i = 0; ok && i < o->n_ins; i++)
        if (!take_file(o->ins[i], tmp, ids, o->sort ? &kept : NULL, n_err_lines, err, sizeof err))
            ok = (cli_error("%s", err), false);
    if (ok) cli_ids_sort(ids);
    ok = ok && cli_ids_unique(ids) && (!o->input || check_input(ids, o->input));
    if (ok && o->sort) ok = write_sorted(o->input, ids, &kept, tmp);
    kept_free(&kept);
    if (ok && !cli_line_out_sync(tmp)) ok = (cli_error("%s", tmp->err), false);
    return ok;
}

/* Opens OUT.tmp, refusing an existing OUT without --force or that is not a regular
 * file; false when it cannot (reported; an OUT.tmp there is not this merge's: kept). */
static bool open_tmp(const merge_opts *o, cli_line_out *tmp, char *tmp_path, size_t cap) {
    struct stat st;
    if (stat(o->out, &st) == 0) {
        if (!o->force) return cli_error("%s: exists (give --force to replace it)", o->out), false;
        if (!S_ISREG(st.st_mode)) return cli_error("%s: not a regular file; merge writes only files", o->out), false;
    }
    if (snprintf(tmp_path, cap, "%s.tmp", o->out) >= (int)cap) return cli_error("%s: path too long", o->out), false;
    return cli_line_out_open(tmp, tmp_path, true) ? true : (cli_error("%s", tmp->err), false);
}

int cli_merge(int argc, char **argv) {
    merge_opts o;
    int rc = parse_args(argc, argv, &o);
    char tmp_path[PATH_MAX];
    cli_line_out tmp = {.fd = -1};
    if (rc >= 0 || !open_tmp(&o, &tmp, tmp_path, sizeof tmp_path)) {
        cli_line_out_close(&tmp);
        free(o.ins);
        return rc >= 0 ? rc : CLI_EXIT_ERROR;
    }
    cli_ids ids = {0};
    size_t n_err_lines = 0;
    bool ok = merge_into(&o, &tmp, &ids, &n_err_lines);
    if (ok && !cli_line_out_rename(&tmp, o.out)) ok = (cli_error("%s", tmp.err), false);
    if (ok)
        fprintf(stderr, "merge: %zu lines from %d files into %s (%zu of them error lines)\n", ids.n, o.n_ins, o.out,
                n_err_lines);
    else if (strcmp(tmp.path, tmp_path) == 0)
        unlink(tmp_path);
    if (!cli_line_out_close(&tmp) && ok) ok = (cli_error("%s", tmp.err), false);
    cli_ids_free(&ids);
    free(o.ins);
    return ok ? CLI_EXIT_OK : CLI_EXIT_ERROR;
}
