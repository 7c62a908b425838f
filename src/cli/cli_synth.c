/* cli_synth.c - `tandem synth`: writes a random-weight model (llama, qwen3, gemma3,
 * and the mixtures of experts qwen3moe and Mixtral) with the shapes of a real one
 * (synth.h), for speed measurements with tandem and llama.cpp.
 *
 * Progress goes to stderr: a bar on a terminal, a line every few seconds
 * otherwise.  The summary line goes to stdout.  Ctrl-C (SIGINT) or SIGTERM stops
 * the run and removes the temporary file. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "dtype.h"
#include "synth.h"

#define LINE_EVERY_S 2.0  /* progress lines when stderr is not a terminal */
#define BAR_EVERY_S 0.1
#define BAR_WIDTH 40

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

typedef struct progress {
    bool tty;
    double t0, last;
} progress;

static double gib(uint64_t b) { return (double)b / (1024.0 * 1024.0 * 1024.0); }

static bool on_progress(void *ctx, uint64_t done, uint64_t total) {
    progress *p = ctx;
    if (stop_requested) return false;
    double now = tdm_now();
    bool last = done == total;
    if (!last && now - p->last < (p->tty ? BAR_EVERY_S : LINE_EVERY_S)) return true;
    p->last = now;
    double frac = total ? (double)done / (double)total : 1.0;
    double rate = now > p->t0 ? gib(done) / (now - p->t0) : 0.0;
    if (p->tty) {
        char bar[BAR_WIDTH + 1];
        int fill = (int)(frac * BAR_WIDTH);
        for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
        bar[BAR_WIDTH] = 0;
        fprintf(stderr, "\r[%s] %3.0f%%  %.2f / %.2f GiB  %.2f GiB/s", bar, 100.0 * frac, gib(done), gib(total),
                rate);
        if (last) fputc('\n', stderr);
    } else if (!last && done > 0) {
        fprintf(stderr, "synth: %3.0f%%  %.2f / %.2f GiB  %.2f GiB/s\n", 100.0 * frac, gib(done), gib(total), rate);
    }
    fflush(stderr);
    return true;
}

/* "llama2-7b, llama3-8b, ..." (the listed shapes). */
static void shape_list(char *buf, size_t cap) {
    size_t n, k = 0;
    const tdm_synth_shape *s = tdm_synth_shapes(&n);
    buf[0] = 0;
    for (size_t i = 0; i < n && k < cap; i++) {
        if (s[i].hidden) continue;
        int w = snprintf(buf + k, cap - k, "%s%s", k ? ", " : "", s[i].name);
        if (w < 0) break;
        k += (size_t)w;
    }
}

#define SYNTH_TYPES "f16, q8_0, q4_0, q4_k, q5_k, q6_k, q4_k_m or q5_k_m"

static bool parse_type(const char *s, tdm_synth_opts *o) {
    static const uint32_t types[] = {TDM_F16, TDM_Q8_0, TDM_Q4_0, TDM_Q4_K, TDM_Q5_K, TDM_Q6_K};
    for (size_t i = 0; i < TDM_ARRAY_LEN(types); i++)
        if (strcmp(s, tdm_dtype_name(types[i])) == 0) {
            o->type = types[i];
            return true;
        }
    if (strcmp(s, "q4_k_m") == 0 || strcmp(s, "q5_k_m") == 0) {
        o->kind = tdm_quant_kind_find(s);
        o->type = o->kind->base;
        return true;
    }
    return false;
}

/* "[FILE: ]SHAPE TYPE, N tensors, P parameters, B bytes (G GiB)" without a newline. */
static void print_summary(const char *file, const tdm_synth_opts *o, const tdm_synth_info *inf) {
    if (file) printf("%s: ", file);
    printf("%s %s, %llu tensors, %llu parameters, %llu bytes (%.2f GiB)", o->shape->name,
           o->kind ? o->kind->name : tdm_dtype_name(o->type), (unsigned long long)inf->n_tensors, (unsigned long long)inf->n_params,
           (unsigned long long)inf->file_bytes, gib(inf->file_bytes));
}

int cli_synth(int argc, char **argv) {
    const char *shape_name = NULL, *type_name = NULL, *out = NULL;
    tdm_synth_opts o = {0};
    bool dry_run = false;
    char shapes[512];
    shape_list(shapes, sizeof shapes);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool missing = false;
        if (cli_is_help(a)) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (cli_take(argc, argv, &i, NULL, "--shape", &v, &missing)) {
            shape_name = v;
        } else if (cli_take(argc, argv, &i, NULL, "--type", &v, &missing)) {
            type_name = v;
        } else if (cli_take(argc, argv, &i, NULL, "--tokenizer-from", &v, &missing)) {
            o.tokenizer_from = v;
        } else if (cli_take(argc, argv, &i, NULL, "--seed", &v, &missing)) {
            if (!missing && !cli_parse_u64(a, v, &o.seed)) return CLI_EXIT_USAGE;
        } else if (cli_opt_flag(a, NULL, "--force")) {
            o.overwrite = true;
        } else if (cli_opt_flag(a, NULL, "--dry-run")) {
            dry_run = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cli_unknown_arg(a);
        } else if (out) {
            return cli_usage_error("synth takes one output file (got '%s' and '%s')", out, a);
        } else {
            out = a;
        }
        if (missing) return CLI_EXIT_USAGE;
    }
    if (!shape_name) return cli_usage_error("missing required option --shape (one of %s)", shapes);
    if (!(o.shape = tdm_synth_shape_find(shape_name)))
        return cli_usage_error("unknown shape '%s' (expected one of %s)", shape_name, shapes);
    if (!type_name) return cli_usage_error("missing required option --type (" SYNTH_TYPES ")");
    if (!parse_type(type_name, &o))
        return cli_usage_error("unknown type '%s' (expected " SYNTH_TYPES ")", type_name);
    if (!out && !dry_run) return cli_usage_error("missing output file (tandem synth --shape S --type T OUT.gguf)");
    if (o.tokenizer_from && access(o.tokenizer_from, R_OK) != 0)
        return cli_error("cannot read tokenizer file '%s': %s", o.tokenizer_from, strerror(errno));

    tdm_synth_info inf;
    tdm_err err = {0};
    if (dry_run) {
        tdm_gguf_writer *w;
        tandem_status st = tdm_synth_plan(&o, &w, &inf, &err);
        if (st) return cli_error("%s", err.msg[0] ? err.msg : tandem_status_str(st));
        tdm_gguf_writer_free(w);
        print_summary(out, &o, &inf);
        fputs("; dry run, nothing written\n", stdout);
        return CLI_EXIT_OK;
    }
    struct stat sb;
    if (!o.overwrite && lstat(out, &sb) == 0)
        return cli_error("'%s' already exists (use --force to replace it)", out);

    progress p = {.tty = isatty(STDERR_FILENO) == 1, .t0 = tdm_now()};
    p.last = p.t0;
    o.progress = on_progress;
    o.progress_ctx = &p;
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    stop_requested = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    tandem_status st = tdm_synth_write(&o, out, &inf, &err);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    double secs = tdm_now() - p.t0;
    if (st == TANDEM_ERR_CANCELLED) {
        if (p.tty) fputc('\n', stderr);
        return cli_error("interrupted: '%s' not written", out);
    }
    if (st) {
        if (p.tty) fputc('\n', stderr);
        return cli_error("%s", err.msg[0] ? err.msg : tandem_status_str(st));
    }
    fputs("wrote ", stdout);
    print_summary(out, &o, &inf);
    printf(" in %.2f s (%.2f GiB/s)\n", secs, secs > 0 ? gib(inf.file_bytes) / secs : 0.0);
    return CLI_EXIT_OK;
}
