/* generate.c - one request through the scheduler: a batch of one (scheduler.h). */
#include <string.h>

#include "scheduler.h"

tandem_status tdm_generate_one(tdm_engine *e, const int32_t *prompt, int32_t n_prompt,
                               const tandem_generate_params *gp, tandem_result *res, tdm_err *err) {
    memset(res, 0, sizeof *res);
    tdm_sched *s;
    tandem_status st = tdm_sched_create(e, NULL, &s, err);
    if (st) return st;
    st = tdm_sched_run(s, &prompt, &n_prompt, gp, NULL, NULL, 1, res, err);
    tdm_sched_free(s);
    if (!st && res->status) { /* its own error is the call's */
        st = res->status;
        tdm_seterr(err, st, "%s", res->error ? res->error : tandem_status_str(st));
        tandem_result_free(res);
    }
    return st;
}
