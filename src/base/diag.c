/* diag.c - the diagnostic environment variables (diag.h). */
#include "diag.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "liblog.h"

const char *const tdm_diag_names[] = {"TANDEM_CPU", "TANDEM_CUDA_GRAPHS", "TANDEM_CUDA_PROFILE", "TANDEM_SPEC_PHASES",
                                      "TANDEM_SCHED_LOG", NULL};

/* Variables earlier versions read: their settings are parameters now, or their
 * experiments are over (the measured choice is the only one). */
static const char *const removed[] = {
    "TANDEM_CPU_PACK", "TANDEM_CPU_TP", "TANDEM_SPIN_US",
    "TANDEM_CUDA_FLASH", "TANDEM_CUDA_GEMV_KSPLIT", "TANDEM_CUDA_GEMV_TC", "TANDEM_CUDA_PDL", "TANDEM_CUDA_SHARED_ROWS",
    "TANDEM_FLASH_DECODE", "TANDEM_FLASH_TC",
    "TANDEM_TREE_BRANCH", "TANDEM_TREE_DEPTH", "TANDEM_TREE_WIDTH",
    "TANDEM_DRAFT_CHAIN", "TANDEM_DEVICE_SAMPLING", "TANDEM_TREE_TOPK", "TANDEM_TREE_DEVICE",
    "TANDEM_TREE_AUTO_MAX", "TANDEM_LOOKUP_CANDS", "TANDEM_LOOKUP_TREE_EXTRA", "TANDEM_TREE_LOOKUPS",
};

static tdm_diag g_diag;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

/* The variable's value, NULL when unset or empty. */
static const char *value_of(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

static void bad(const char *name, const char *v, const char *want) {
    if (g_diag.error[0]) return; /* (the first one is reported) */
    snprintf(g_diag.error, sizeof g_diag.error, "environment variable %s=%.64s: expected %s", name, v, want);
}

/* A 0 / 1 switch: def when unset, bad() otherwise. */
static bool flag(const char *name, bool def) {
    const char *v = value_of(name);
    if (!v) return def;
    if (strcmp(v, "0") == 0) return false;
    if (strcmp(v, "1") == 0) return true;
    bad(name, v, "0 or 1");
    return def;
}

static void read_all(void) {
    g_diag.cpu_level_cap = -1;
    const char *cpu = value_of("TANDEM_CPU");
    if (cpu) {
        static const char *const levels[] = {"scalar", "avx2", "avx512"};
        for (int i = 0; i < 3; i++)
            if (strcasecmp(cpu, levels[i]) == 0) g_diag.cpu_level_cap = i;
        if (g_diag.cpu_level_cap < 0) bad("TANDEM_CPU", cpu, "scalar, avx2 or avx512");
    }
    g_diag.cuda_graphs_off = !flag("TANDEM_CUDA_GRAPHS", true);
    g_diag.cuda_profile = flag("TANDEM_CUDA_PROFILE", false);
    g_diag.spec_phases = flag("TANDEM_SPEC_PHASES", false);
    g_diag.sched_log = flag("TANDEM_SCHED_LOG", false);
    for (size_t i = 0; i < TDM_ARRAY_LEN(removed); i++)
        if (getenv(removed[i]))
            tdm_log(TANDEM_LOG_WARN,
                    "%s is set but no longer read (the README's \"Environment variables\" lists the ones that are)",
                    removed[i]);
}

const tdm_diag *tdm_diag_get(void) {
    pthread_once(&g_once, read_all);
    return &g_diag;
}

tandem_status tdm_diag_check(tdm_err *err) {
    const tdm_diag *d = tdm_diag_get();
    return d->error[0] ? tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "%s", d->error) : TANDEM_OK;
}
