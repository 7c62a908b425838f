/* diag.h - the environment variables tandem reads, all of them diagnostics (README,
 * "Environment variables (diagnostics only)"): read here and nowhere else, once per
 * process (the first tdm_diag_get), never a setting a user tunes (those are
 * parameters: include/tandem.h).
 *
 *   TANDEM_CPU=scalar|avx2|avx512  caps the CPU backend's SIMD level (never raises it)
 *   TANDEM_CUDA_GRAPHS=0|1         0: launch every kernel of a GPU forward, no graphs
 *   TANDEM_CUDA_PROFILE=0|1        1: the GPU forward's time per stage, logged when
 *                                  its backend is destroyed
 *   TANDEM_SPEC_PHASES=0|1         1: wait at the end of each phase of a speculative
 *                                  step and log each phase's mean time at the end
 *   TANDEM_SCHED_LOG=0|1           1: log each speculation length a step chooses, with
 *                                  the measured step times, and each sequence's
 *                                  proposal (its chain's ids) and what it yielded
 *
 * Unset or empty: the default (no cap, graphs, no profile, no phases).  A malformed
 * value is an error naming the variable: every backend creation fails with it
 * (tdm_diag_check).  A variable of an earlier version that is no longer read is a
 * warning (tdm_log), once. */
#ifndef TDM_DIAG_H
#define TDM_DIAG_H

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tdm_diag {
    int cpu_level_cap;     /* TANDEM_CPU: -1 none, else 0 scalar, 1 avx2, 2 avx512 (the
                              values of kernels/cpu's tdm_cpu_level) */
    bool cuda_graphs_off;  /* TANDEM_CUDA_GRAPHS=0 */
    bool cuda_profile;     /* TANDEM_CUDA_PROFILE=1 */
    bool spec_phases;      /* TANDEM_SPEC_PHASES=1 */
    bool sched_log;        /* TANDEM_SCHED_LOG=1 */
    char error[TDM_ERR_MSG_LEN]; /* the first malformed variable's message; "" if none
                                    (that variable then has its default) */
} tdm_diag;

/* The variables, read on the first call (thread-safe). */
const tdm_diag *tdm_diag_get(void);

/* TANDEM_OK, or TANDEM_ERR_INVALID_ARG with the message of a malformed variable. */
tandem_status tdm_diag_check(tdm_err *err);

/* The names of the variables read, NULL-terminated (the README's table lists them). */
extern const char *const tdm_diag_names[];

#ifdef __cplusplus
}
#endif
#endif
