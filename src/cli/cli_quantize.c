/* cli_quantize.c - `tandem quantize IN.gguf OUT.gguf --type TYPE`: converts a
 * model's matrices (quantize.h), a progress line per tensor on stderr (a line
 * every few seconds when stderr is not a terminal), a summary on stdout. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "common.h"
#include "dtype.h"
#include "quantize.h"

#define LINE_EVERY_S 2.0

typedef struct qprogress {
    bool tty;
    double t0, last;
    uint64_t counts[32]; /* tensors per new type */
} qprogress;

static void on_progress(void *ctx, uint64_t i, uint64_t n, const char *name, uint32_t type, uint64_t bytes) {
    qprogress *p = ctx;
    if (type < 32) p->counts[type]++;
    double now = tdm_now();
    if (!p->tty && i < n && now - p->last < LINE_EVERY_S) return;
    p->last = now;
    fprintf(stderr, p->tty ? "\r\033[K[%llu/%llu] %s -> %s, %.1f MiB" : "quantize: [%llu/%llu] %s -> %s, %.1f MiB\n",
            (unsigned long long)i, (unsigned long long)n, name, tdm_dtype_name(type), (double)bytes / 1048576.0);
    if (p->tty && i == n) fputc('\n', stderr);
    fflush(stderr);
}

int cli_quantize(int argc, char **argv) {
    const char *files[2] = {NULL, NULL}, *type_name = NULL;
    bool force = false;
    int n_files = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        bool missing = false;
        if (cli_is_help(a)) {
            cli_usage(stdout);
            return CLI_EXIT_OK;
        }
        if (cli_take(argc, argv, &i, NULL, "--type", &v, &missing)) {
            type_name = v;
        } else if (cli_opt_flag(a, NULL, "--force")) {
            force = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            return cli_unknown_arg(a);
        } else if (n_files == 2) {
            return cli_usage_error("quantize takes an input and an output file (got a third, '%s')", a);
        } else {
            files[n_files++] = a;
        }
        if (missing) return CLI_EXIT_USAGE;
    }
    if (n_files < 2) return cli_usage_error("tandem quantize IN.gguf OUT.gguf --type TYPE");
    if (!type_name) return cli_usage_error("missing required option --type (one of %s)", tdm_quant_kind_names());
    const tdm_quant_kind *k = tdm_quant_kind_find(type_name);
    if (!k) return cli_usage_error("unknown type '%s' (expected one of %s)", type_name, tdm_quant_kind_names());
    if (strcmp(files[0], files[1]) == 0) return cli_usage_error("the output would replace the input '%s'", files[0]);
    qprogress p = {.tty = isatty(STDERR_FILENO) == 1, .t0 = tdm_now()};
    p.last = p.t0;
    tdm_err err = {0};
    tandem_status st = tdm_quantize_file(files[0], files[1], k, force, on_progress, &p, &err);
    if (st == TANDEM_ERR_INVALID_ARG && !force && strstr(err.msg, "already exists"))
        return cli_error("'%s' already exists (use --force to replace it)", files[1]);
    if (st) return cli_error("%s", err.msg[0] ? err.msg : tandem_status_str(st));
    printf("wrote %s (%s):", files[1], k->name);
    for (uint32_t t = 0; t < 32; t++)
        if (p.counts[t]) printf(" %llu %s", (unsigned long long)p.counts[t], tdm_dtype_name(t));
    printf(" tensors in %.2f s\n", tdm_now() - p.t0);
    return CLI_EXIT_OK;
}
