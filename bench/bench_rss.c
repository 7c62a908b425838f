/* bench_rss.c - what each part of a CPU engine costs in resident memory.
 *
 * Reads the process's resident set (/proc/self/statm) after each step: the
 * target's weights open, the draft's, the engine open (its KV cache reserved but
 * not yet written, its working buffers), a generation of -p prompt tokens and -n
 * new ones, and prints a markdown table of each step's growth with the peak
 * (VmHWM, /proc/self/status) at the end, beside what the KV cache holds (the
 * tokens' K/V bytes) and its budget.  The same code as `tandem generate`; for
 * the comparison with llama.cpp's peak see bench/mem_real.sh.
 *
 * usage: bench_rss -m MODEL [-d DRAFT] [-p PROMPT_TOKENS] [-n NEW] [--ctx N]
 *                  [--kv-type f32|f16|q8_0|fp8|auto] [-t THREADS] [--maps]
 *   --maps: then every mapping with more than 1 MiB resident, largest first
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tandem.h"

static double mib(double b) { return b / (1024.0 * 1024.0); }

static double resident(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (!f || fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
    if (f) fclose(f);
    return (double)res * (double)sysconf(_SC_PAGESIZE);
}

static double peak(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double kib = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kib = atof(line + 6);
    if (f) fclose(f);
    return kib * 1024.0;
}

/* --maps: the mappings with more than 1 MiB resident, largest first (a buffer's
 * size names it: KV layers, forward buffers, logits, the weights' file). */
static void print_maps(void) {
    FILE *f = fopen("/proc/self/smaps", "r");
    char line[512], cur[512] = "";
    struct {
        char name[160];
        double size, rss;
    } m[4096];
    int n = 0;
    double size = 0;
    while (f && fgets(line, sizeof line, f)) {
        unsigned long long a, b;
        double kib;
        if (sscanf(line, "%llx-%llx", &a, &b) == 2 && strchr(line, ' ')) {
            size = (double)(b - a);
            snprintf(cur, sizeof cur, "%s", line);
        } else if (!strncmp(line, "Rss:", 4) && sscanf(line + 4, "%lf", &kib) == 1 && kib > 1024 && n < 4096) {
            char *path = strrchr(cur, ' ');
            snprintf(m[n].name, sizeof m[n].name, "%s", path && path[1] != '\n' ? path + 1 : "[anonymous]\n");
            m[n].size = size;
            m[n].rss = kib * 1024.0;
            n++;
        }
    }
    if (f) fclose(f);
    for (int i = 0; i < n; i++) /* (selection sort: a few hundred entries) */
        for (int j = i + 1; j < n; j++)
            if (m[j].rss > m[i].rss) {
                __typeof__(m[0]) t = m[i];
                m[i] = m[j];
                m[j] = t;
            }
    printf("\n| mapping | size MiB | resident MiB |\n|---|---:|---:|\n");
    for (int i = 0; i < n; i++) {
        m[i].name[strcspn(m[i].name, "\n")] = 0;
        printf("| %s | %.2f | %.2f |\n", m[i].name, mib(m[i].size), mib(m[i].rss));
    }
}

static void die(const char *what) {
    fprintf(stderr, "bench_rss: %s: %s\n", what, tandem_last_error());
    exit(1);
}

int main(int argc, char **argv) {
    const char *model = NULL, *draft = NULL;
    int n_prompt = 512, n_new = 128, ctx = 0, threads = 2;
    bool maps = false;
    tandem_kv_type kv = TANDEM_KV_AUTO;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--maps")) {
            maps = true;
            continue;
        }
        if (!v) goto usage;
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "-d")) draft = v;
        else if (!strcmp(a, "-p")) n_prompt = atoi(v);
        else if (!strcmp(a, "-n")) n_new = atoi(v);
        else if (!strcmp(a, "--ctx")) ctx = atoi(v);
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "--kv-type")) {
            if (!strcmp(v, "f32")) kv = TANDEM_KV_F32;
            else if (!strcmp(v, "f16")) kv = TANDEM_KV_F16;
            else if (!strcmp(v, "q8_0")) kv = TANDEM_KV_Q8_0;
            else if (!strcmp(v, "fp8")) kv = TANDEM_KV_FP8;
            else if (strcmp(v, "auto")) goto usage;
        } else goto usage;
        i++;
    }
    if (!model || n_prompt < 1 || n_new < 1 || ctx < 0 || threads < 0) goto usage;

    const double r0 = resident();
    tandem_model *t = NULL, *d = NULL;
    tandem_engine *e = NULL;
    if (tandem_model_open(model, NULL, &t)) die(model);
    const double r_t = resident();
    if (draft && tandem_model_open(draft, NULL, &d)) die(draft);
    const double r_d = resident();
    tandem_engine_params ep = tandem_engine_default_params();
    ep.n_threads = threads;
    ep.n_ctx = ctx;
    ep.kv_type = kv;
    if (tandem_engine_open(t, d, &ep, &e)) die("engine");
    const double r_e = resident();

    tandem_model_info ti, di = {0};
    tandem_model_get_info(t, &ti);
    if (d) tandem_model_get_info(d, &di);
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    for (int i = 0; i < n_prompt; i++) ids[i] = (int32_t)(1000 + (i * 7919) % 20000); /* ordinary token ids */
    tandem_generate_params gp = tandem_generate_default_params();
    gp.max_tokens = n_new;
    gp.ignore_eos = true;
    tandem_result res;
    if (tandem_generate_ids(e, ids, (size_t)n_prompt, &gp, &res)) die("generate");
    const double r_g = resident();
    tandem_engine_stats st;
    tandem_engine_get_stats(e, &st);
    const int n_ctx = tandem_engine_n_ctx(e);
    const size_t held = (size_t)n_prompt + res.n_tokens;
    /* the K/V bytes per token of the cache type used: info's are the backend default's */
    const double per_tok = (double)(ti.kv_bytes_per_token + (d ? di.kv_bytes_per_token : 0));

    printf("| step | resident MiB | growth MiB |\n|---|---:|---:|\n");
    printf("| start (program, libraries) | %.0f | |\n", mib(r0));
    printf("| target open (weights) | %.0f | %.0f |\n", mib(r_t), mib(r_t - r0));
    if (d) printf("| draft open (weights) | %.0f | %.0f |\n", mib(r_d), mib(r_d - r_t));
    printf("| engine open (KV reserved, buffers) | %.0f | %.0f |\n", mib(r_e), mib(r_e - r_d));
    printf("| generate %d + %zu tokens | %.0f | %.0f |\n", n_prompt, res.n_tokens, mib(r_g), mib(r_g - r_e));
    printf("| peak (VmHWM) | %.0f | |\n\n", mib(peak()));
    printf("context %d; KV cache: %zu tokens held, %.0f MiB of K/V at %.1f KiB per token (backend default type; "
           "--kv-type changes it), budget %d blocks of 16 = %.0f MiB\n",
           n_ctx, held, mib(per_tok * (double)held), per_tok / 1024.0, st.kv_blocks_total,
           mib(per_tok * 16.0 * st.kv_blocks_total));
    if (maps) print_maps();
    tandem_result_free(&res);
    free(ids);
    tandem_engine_close(e);
    tandem_model_close(d);
    tandem_model_close(t);
    return 0;
usage:
    fprintf(stderr, "usage: bench_rss -m MODEL [-d DRAFT] [-p PROMPT_TOKENS] [-n NEW] [--ctx N] "
                    "[--kv-type f32|f16|q8_0|fp8|auto] [-t THREADS] [--maps]\n");
    return 2;
}
