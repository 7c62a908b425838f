/* phase_prof.c - a speculative step's phase times (phase_prof.h). */
#include "phase_prof.h"

#include <string.h>

#include "common.h"
#include "diag.h"
#include "liblog.h"

static const char *const NAMES[TDM_PH_N] = {"tree catch-up", "tree levels", "tree finish", "tree verify forward",
                                            "tree accept", "tree keep", "chain draft", "chain verify"};

void tdm_phase_init(tdm_phase_prof *p) {
    memset(p, 0, sizeof *p);
    p->on = tdm_diag_get()->spec_phases;
}

static void wait_for(tdm_backend *be) {
    if (be && be->ops->sync) be->ops->sync(be, NULL); /* (an error shows at the next real call) */
}

static uint64_t captures(tdm_backend *be) {
    uint64_t r = 0, c = 0;
    if (be) tdm_backend_cuda_graph_stats(be, &r, &c);
    return c;
}

void tdm_phase_start(tdm_phase_prof *p, tdm_backend *be) {
    if (!p->on) return;
    wait_for(be);
    p->caps_last = captures(be);
    p->in_step = true;
    p->last = tdm_now();
}

void tdm_phase_mark(tdm_phase_prof *p, tdm_backend *be, tdm_phase ph) {
    if (!p->on || !p->in_step || ph < 0 || ph >= TDM_PH_N) return;
    wait_for(be);
    const double t = tdm_now();
    p->sum[ph] += t - p->last;
    p->n[ph]++;
    const uint64_t c = captures(be);
    p->caps[ph] += c - p->caps_last;
    p->caps_last = c;
    p->in_step = ph != TDM_PH_TREE_KEEP && ph != TDM_PH_CHAIN_VERIFY;
    p->last = tdm_now();
}

void tdm_phase_report(const tdm_phase_prof *p) {
    if (!p->on) return;
    for (int i = 0; i < TDM_PH_N; i++)
        if (p->n[i] > 0)
            tdm_log(TANDEM_LOG_INFO, "tandem phases: %-20s %9.1f us mean over %lld (%llu graph captures)", NAMES[i],
                    p->sum[i] * 1e6 / (double)p->n[i], (long long)p->n[i], (unsigned long long)p->caps[i]);
}
