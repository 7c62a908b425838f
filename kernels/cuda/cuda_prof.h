/* cuda_prof.h - time per stage of the fused forward (TANDEM_CUDA_PROFILE=1,
 * src/base/diag.h): CUDA events between the stages of every layer, summed per stage
 * and per kind of batch (rows kernels / cuBLAS), logged (info, tandem_log_set) when
 * the backend is destroyed.  While
 * it is on, forwards run without graphs (events between stages). */
#ifndef TDM_CUDA_PROF_H
#define TDM_CUDA_PROF_H

#include "cuda_internal.h"

typedef enum tdm_prof_stage {
    TDM_PROF_NORM, TDM_PROF_QKV, TDM_PROF_ROPE_KV, TDM_PROF_ATTENTION, TDM_PROF_WO, TDM_PROF_NORM2,
    TDM_PROF_W13, TDM_PROF_W2, TDM_PROF_N
} tdm_prof_stage;

/* Whether profiling is on (TANDEM_CUDA_PROFILE). */
bool tdm_cuda_prof_on(void);
/* Starts a forward of n rows (rows_path: the row kernels). */
void tdm_cuda_prof_begin(tdm_cuda *c, int32_t n, bool rows_path);
/* The work enqueued from here to the next mark (or the end) belongs to stage s. */
void tdm_cuda_prof_mark(tdm_cuda *c, tdm_prof_stage s);
/* Ends the forward: waits for it and adds its stage times. */
void tdm_cuda_prof_end(tdm_cuda *c);
/* Logs the table (if anything was measured) and frees the events. */
void tdm_cuda_prof_report(tdm_cuda *c);

#endif
