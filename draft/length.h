/* length.h - the speculation length of a batch's step: one k for its B speculating
 * sequences, from measured acceptance and measured costs (length.c).  (A lone
 * sequence's step still takes its own per-sequence controller, controller.h; the
 * decision below is written for any B >= 1 so that it can take that over.)
 *
 * Per sequence: the draft model's acceptance estimate alpha (controller.h,
 * tdm_ctrl_observe) and its room.  Per pair (tdm_len_ctrl, the scheduler's): the
 * measured costs (costs.h) and the decision's state.
 *
 * The decision (tdm_len_choose) for n sequences with acceptance alpha_i and room
 * cap_i (the tokens each may still draft), drafting k tokens each:
 *     E(k) = sum_i E[tokens](alpha_i, min(k, cap_i)),   E[tokens](a, k) = 1 + a + ... + a^k
 *     T(k) = the measured seconds of a step of this batch at length k (costs.h,
 *            sampled at least twice), or else the nearest such length's plus the
 *            row model's difference, model(k) = k t_draft(n) + t_target(rows(k));
 *            a length sampled once takes the lesser of its sample (which may include
 *            one-time work: a CUDA graph captured) and that estimate,
 * plus the model's cost of the step's rows that do not speculate (prompt chunks,
 * trees: `other`); the choice maximises E(k) / T(k) over k = 0 (no speculation:
 * E(0) = n) and k_min <= k <= k_max.  As a batch grows the target's forward turns
 * compute-bound, t_target grows with its rows, and the choice falls to 0.
 *   - Plain first: until a plain step of this batch size is measured the step does
 *     not speculate.
 *   - Holding: a choice of a length sampled less than twice (a trial) holds 3 steps
 *     (the first may have to catch the draft up and include one-time work); in a
 *     batch of more than one any choice holds 8 steps while the batch keeps its size
 *     and limit (a batch's mean acceptance moves slowly, and each switch between
 *     speculating and not costs the draft's catching up); a batch of one decides
 *     every step (one sequence's acceptance swings with its text).
 *   - Exploration: 3 steps in every 256 take a neighbouring length to measure, one
 *     sampled less than twice first, else one expected within 10 % of the best,
 *     else, while speculating, the lower and the higher in turn (a measurement that
 *     held one-time work is corrected so: costs.h; at most 3 steps in 256 at a
 *     worse length; a batch that does not speculate is re-checked by the probes
 *     below, which cost the draft's catching up).
 *   - Back-off and probes: when the choice is not to speculate, every gap-th such
 *     step probes for one step with the length that a hopeful estimate (alpha + 0.2,
 *     at most 0.95) would choose (at least k_min), so that a rising acceptance is
 *     seen, unless speculating would not beat a plain step by 10 % even at
 *     acceptance 0.95 (the cost decides there, and a probe only costs); the gap
 *     starts at TDM_LEN_PROBE_MIN, returns there after a probe that raised the mean
 *     estimate and doubles after one that did not, up to TDM_LEN_PROBE_MAX.
 * A request's fixed k (k_fixed) is its own: the scheduler gives it that length. */
#ifndef TDM_LENGTH_H
#define TDM_LENGTH_H

#include <stdbool.h>
#include <stdint.h>

#include "controller.h"
#include "costs.h"

#define TDM_LEN_PROBE_MIN 8
#define TDM_LEN_PROBE_MAX 64
#define TDM_LEN_SEQ_MAX 512 /* sequences one decision weighs at most (the rest count as rows only) */

typedef struct tdm_len_seq {
    double alpha; /* acceptance estimate */
    int32_t cap;  /* most tokens it may draft this step (room, its k_max) */
} tdm_len_seq;

typedef struct tdm_len_choice {
    int32_t k;        /* the step's length (0: no speculation) */
    double rate;      /* expected tokens per second of the step at k */
    double rate_plain;/* ... of a plain step */
    double e;         /* expected tokens of the speculating sequences at k */
    int32_t rows;     /* their target rows at k */
    bool trial;       /* k is sampled less than twice */
    bool probe;       /* a back-off probe */
} tdm_len_choice;

/* The pair's controller (the scheduler's, in its speculation workspace). */
typedef struct tdm_len_ctrl {
    tdm_pair_costs cost;
    int32_t dec_b, dec_kmax, dec_k; /* the last decision's batch size, limit and length */
    int32_t dec_hold;               /* steps it still holds */
    int32_t dec_explore;            /* a neighbouring length worth measuring, -1 = none */
    int32_t explore_k;              /* the length the current exploration takes, -1 = none */
    uint64_t n_steps;               /* decisions asked for (exploration schedule) */
    int32_t n_plain;                /* plain steps since the last probe */
    int32_t probe_gap;              /* plain steps before the next probe */
    bool probing;                   /* the last step was a probe */
    double probe_alpha;             /* the mean estimate when it was taken */
    bool log;                       /* each decision logged (info), with the step costs */
} tdm_len_ctrl;

void tdm_len_init(tdm_len_ctrl *c);
/* The step's length for seqs[0..n) (n >= 1; k_max at most TDM_CTRL_MAX_K), as
 * above; updates the decision's state. */
void tdm_len_choose(tdm_len_ctrl *c, const tdm_len_seq *seqs, int32_t n, int32_t other, int32_t k_min, int32_t k_max,
                    tdm_len_choice *out);
/* A step of n speculating sequences at length k (no prompt chunk or tree in it,
 * the draft caught up) took seconds. */
void tdm_len_observe_step(tdm_len_ctrl *c, int32_t n, int32_t k, double seconds);
/* Expected tokens per second of a proposal whose step commits e tokens (expected)
 * from rows target rows and rounds draft rounds of a batch of n: e over the row
 * model's cost (costs.h; a step's host work is left out: it is the same whichever
 * proposer proposes, and proposals are weighed against each other with this). */
double tdm_len_rate(const tdm_len_ctrl *c, int32_t n, double e, int32_t rows, int32_t rounds);

#endif
