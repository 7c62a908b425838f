/* cuda_prof.cu - see cuda_prof.h. */
#include <stdlib.h>

#include "cuda_prof.h"

#define PROF_EVENTS 4096

static const char *const stage_names[TDM_PROF_N] = {"rmsnorm", "Wqkv", "RoPE + K/V", "attention",
                                                    "Wo", "rmsnorm 2", "W13 + SwiGLU", "W2"};

struct tdm_cuda_prof {
    cudaEvent_t ev[PROF_EVENTS];
    int stage[PROF_EVENTS];
    int n_ev, n_created;
    bool rows_path;
    int32_t rows;
    double ms[2][TDM_PROF_N];  /* [rows path?][stage] */
    uint64_t forwards[2], rows_sum[2];
};

bool tdm_cuda_prof_on(void) { return tdm_diag_get()->cuda_profile; }

static tdm_cuda_prof *prof_of(tdm_cuda *c) {
    if (!c->prof) c->prof = (tdm_cuda_prof *)calloc(1, sizeof *c->prof);
    return c->prof;
}

static void record(tdm_cuda_prof *p, tdm_cuda *c, int stage) {
    if (p->n_ev >= PROF_EVENTS) return;
    if (p->n_ev >= p->n_created) {
        if (cudaEventCreate(&p->ev[p->n_ev]) != cudaSuccess) return;
        p->n_created++;
    }
    p->stage[p->n_ev] = stage;
    cudaEventRecord(p->ev[p->n_ev++], c->stream);
}

void tdm_cuda_prof_begin(tdm_cuda *c, int32_t n, bool rows_path) {
    tdm_cuda_prof *p = prof_of(c);
    if (!p) return;
    p->n_ev = 0;
    p->rows = n;
    p->rows_path = rows_path;
}

void tdm_cuda_prof_mark(tdm_cuda *c, tdm_prof_stage s) {
    if (c->prof) record(c->prof, c, (int)s);
}

void tdm_cuda_prof_end(tdm_cuda *c) {
    tdm_cuda_prof *p = c->prof;
    if (!p || p->n_ev == 0) return;
    record(p, c, -1);
    cudaStreamSynchronize(c->stream);
    const int k = p->rows_path ? 1 : 0;
    for (int i = 0; i + 1 < p->n_ev; i++) {
        float ms = 0;
        if (p->stage[i] >= 0 && cudaEventElapsedTime(&ms, p->ev[i], p->ev[i + 1]) == cudaSuccess)
            p->ms[k][p->stage[i]] += ms;
    }
    p->forwards[k]++;
    p->rows_sum[k] += (uint64_t)p->rows;
    p->n_ev = 0;
}

void tdm_cuda_prof_report(tdm_cuda *c) {
    tdm_cuda_prof *p = c->prof;
    if (!p) return;
    for (int k = 1; k >= 0; k--) {
        if (!p->forwards[k]) continue;
        double total = 0;
        for (int s = 0; s < TDM_PROF_N; s++) total += p->ms[k][s];
        tdm_log(TANDEM_LOG_INFO, "tandem cuda profile: %llu forwards on the %s (%.1f rows each), %.1f us each:",
                (unsigned long long)p->forwards[k], k ? "row kernels" : "cuBLAS path",
                (double)p->rows_sum[k] / (double)p->forwards[k], 1e3 * total / (double)p->forwards[k]);
        for (int s = 0; s < TDM_PROF_N; s++)
            tdm_log(TANDEM_LOG_INFO, "  %-14s %9.1f us  %5.1f %%", stage_names[s],
                    1e3 * p->ms[k][s] / (double)p->forwards[k], total > 0 ? 100 * p->ms[k][s] / total : 0.0);
    }
    for (int i = 0; i < p->n_created; i++) cudaEventDestroy(p->ev[i]);
    free(p);
    c->prof = NULL;
}
