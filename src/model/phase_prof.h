/* phase_prof.h - where a speculative step's time goes, for benchmarks: with
 * TANDEM_SPEC_PHASES=1 (src/base/diag.h) the engine waits for the backend at each phase's end
 * (which removes the overlap between phases, so totals grow a little) and reports
 * each phase's mean time (logged: tandem_log_set) when it is freed.  Off (no waits, no clock
 * reads) otherwise. */
#ifndef TDM_PHASE_PROF_H
#define TDM_PHASE_PROF_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"

typedef enum tdm_phase {
    TDM_PH_TREE_CATCHUP,  /* a tree's draft catch-up forward */
    TDM_PH_TREE_LEVELS,   /* its level forwards and candidate kernels */
    TDM_PH_TREE_FINISH,   /* the tree's download and pruning */
    TDM_PH_TREE_VERIFY,   /* the target's forward over the tree */
    TDM_PH_TREE_ACCEPT,   /* the verdict */
    TDM_PH_TREE_KEEP,     /* K/V moves, truncation, commits */
    TDM_PH_CHAIN_DRAFT,   /* a chain's drafting */
    TDM_PH_CHAIN_VERIFY,  /* its verification and commit */
    TDM_PH_N
} tdm_phase;

typedef struct tdm_phase_prof {
    bool on;
    bool in_step;            /* between tdm_phase_start and a step's last phase (marks
                                elsewhere, e.g. trees drafted by the scheduler, count nothing) */
    double last;             /* seconds: the previous mark */
    double sum[TDM_PH_N];    /* seconds */
    int64_t n[TDM_PH_N];
    uint64_t caps_last;      /* CUDA graph captures at the previous mark */
    uint64_t caps[TDM_PH_N]; /* captures during each phase */
} tdm_phase_prof;

void tdm_phase_init(tdm_phase_prof *p);
/* The start of a step (waits for the backend first). */
void tdm_phase_start(tdm_phase_prof *p, tdm_backend *be);
/* The end of phase ph, which began at the previous mark or start (TDM_PH_TREE_KEEP
 * and TDM_PH_CHAIN_VERIFY end the step). */
void tdm_phase_mark(tdm_phase_prof *p, tdm_backend *be, tdm_phase ph);
/* One line per phase that ran, logged at info (with the CUDA graphs captured in it). */
void tdm_phase_report(const tdm_phase_prof *p);

#endif
