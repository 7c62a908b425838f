/* scheduler.h - the scheduler: many requests over one engine, continuous batching.
 *
 * Requests are submitted (from any thread) into an inbox; each step moves them into
 * the priority queue, applies cancels and deadlines, admits waiting requests while a
 * place (n_seq_max) and KV blocks are free, plans the step's rows under the token
 * budget (every running sequence's next row, then prompt chunks of the sequences
 * still prefilling), runs the forwards, draws and commits each sequence's token,
 * and finishes the sequences that are done (their blocks freed at once, on_finish
 * called).  When the KV pool runs out, the lowest-priority, newest sequence is
 * preempted: its blocks are freed and it goes back to the queue with its tokens, to
 * be recomputed when it is admitted again.
 *
 * Rows are computed as each alone (forwards of at most the backend's
 * invariant_rows rows, prompt chunks on fixed boundaries), so greedy output equals
 * one-at-a-time output; a sampled request draws from its own generator, so its
 * tokens do not depend on the rest of the batch.  Speculation, on an engine with a
 * draft: one step for a lone sequence (the batch of one) and a batch alike
 * (step.c): the decoding sequences' proposals (n-gram lookups where they pay, the
 * draft model's chains drafted together, one draft forward per round,
 * draft/chain.h, or token trees) are verified by the step's target forward, with
 * one length for the step from measured costs (draft/length.h; 0 when it does not
 * pay); a sampled sequence is verified by agreement with the target's own draws,
 * or by rejection sampling on an engine of one sequence (n_seq_max 1).
 *
 * Threads: submit, cancel and stats may be called from any thread; step from one
 * thread at a time, and not while the scheduler's own thread (start) runs.
 * Callbacks run on the stepping thread. */
#ifndef TDM_SCHED_H
#define TDM_SCHED_H

#include "engine.h"
#include "spec_ws.h"
#include "tandem.h"

typedef struct tdm_sched tdm_sched;

tandem_status tdm_sched_create(tdm_engine *e, const tdm_spec_ws_opts *opts, tdm_sched **out, tdm_err *err);
/* The scheduler's speculation workspace (the length controller and the measured
 * costs, ...), NULL without a draft model: for tests that set what a step
 * measured. */
tdm_spec_ws *tdm_sched_ws(tdm_sched *s);
/* Stops the thread, finishes every request still queued or running (cancelled,
 * on_finish called here) and frees.  NULL is a no-op. */
void tdm_sched_free(tdm_sched *s);

/* Validates and queues a request from prompt ids (copied).  A bad request fails
 * here with err set and no callback. */
tandem_status tdm_sched_submit(tdm_sched *s, const int32_t *prompt, int32_t n_prompt,
                               const tandem_generate_params *gp, int priority, double timeout_ms,
                               tandem_finish_cb on_finish, void *user_data, uint64_t *out_id, tdm_err *err);
tandem_status tdm_sched_cancel(tdm_sched *s, uint64_t id, tdm_err *err);
/* Exactly one thread steps a scheduler at any time, whatever the callers do: the
 * scheduler thread, a blocking run (tdm_sched_run) or tdm_sched_step each take the
 * right to step (waiting while another holds it) for one iteration at a time.
 *
 * One iteration; *n_pending: requests queued or running after it (may be NULL).
 * Called from a callback: TANDEM_ERR_INVALID_ARG. */
tandem_status tdm_sched_step(tdm_sched *s, int *n_pending, tdm_err *err);
/* Start / stop the scheduler thread; one at a time (a start waits for a stop in
 * progress to join the thread, and the reverse).  stop waits for the current step.
 * From a callback: TANDEM_ERR_INVALID_ARG. */
tandem_status tdm_sched_start(tdm_sched *s, tdm_err *err);
tandem_status tdm_sched_stop(tdm_sched *s, tdm_err *err);
bool tdm_sched_running(tdm_sched *s);
void tdm_sched_stats(tdm_sched *s, tandem_engine_stats *out);

/* Runs n requests to the end and fills res[i] with request i's result (what
 * tandem_generate_batch does): a request that fails validation fails alone.  With
 * the thread running it waits for them; otherwise it steps until they are done
 * (while another caller steps, it waits for that step; several callers take turns). */
tandem_status tdm_sched_run(tdm_sched *s, const int32_t *const *prompts, const int32_t *n_prompts,
                            const tandem_generate_params *params, const int *priority, const double *timeout_ms,
                            int32_t n, tandem_result *res, tdm_err *err);

/* One request on an engine that runs nothing else: a scheduler made for it, the
 * request run to its end (tandem_generate's path).  A request that fails returns
 * its status with err set (and res empty). */
tandem_status tdm_generate_one(tdm_engine *e, const int32_t *prompt, int32_t n_prompt,
                               const tandem_generate_params *gp, tandem_result *res, tdm_err *err);

#endif
