/* length.h - the speculation length: one controller for a step of B >= 1
 * speculating sequences (a lone sequence is the batch of one), from measured
 * acceptance and measured costs (length.c).
 *
 * Per sequence and proposer (the draft model, n-gram lookups): an estimate of the
 * per-token acceptance alpha (tdm_ctrl_observe) and the request's bounds.
 * Per pair (tdm_len_ctrl, the scheduler's): the measured costs (costs.h) and the
 * decision's state.
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
 *     (the first may have to catch the draft up and include one-time work); in a batch of more
 *     than one any choice holds 8 steps while the batch keeps its size and limit (a
 *     batch's mean acceptance moves slowly, and each switch between speculating and
 *     not costs the draft's catching up); a lone sequence decides every step (its
 *     acceptance swings with its text).
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
 *     acceptance 0.95 (the cost decides there, and a probe only costs); the gap starts at TDM_CTRL_PROBE_MIN, returns there after a probe that
 *     raised the mean estimate and doubles after one that did not, up to
 *     TDM_CTRL_PROBE_MAX.  At acceptance 0 this costs one short chain per gap instead
 *     of one per token.
 * A request's fixed k (k_fixed) is its own: the scheduler gives it that length and
 * leaves it out of the decision. */
#ifndef TDM_LENGTH_H
#define TDM_LENGTH_H

#include <stdbool.h>
#include <stdint.h>

#include "costs.h"

#define TDM_CTRL_PROBE_MIN 8
#define TDM_LEN_SEQ_MAX 512 /* sequences one decision weighs at most (the rest count as rows only) */
#define TDM_CTRL_PROBE_MAX 64

/* A sequence's acceptance estimate for one proposer, and its request's bounds. */
typedef struct tdm_spec_ctrl {
    int32_t k_min, k_max; /* 1 <= k_min <= k_max <= TDM_CTRL_MAX_K */
    int32_t k_fixed;      /* > 0: always this k */
    double alpha;         /* EMA of the per-token acceptance probability */
    double alpha_ema;     /* smoothing weight, default 0.2 */
} tdm_spec_ctrl;

void tdm_ctrl_init(tdm_spec_ctrl *c, int32_t k_min, int32_t k_max, int32_t k_fixed);
/* Records a step: k proposed, n_accepted of them accepted.  A step that stopped
 * early (p_min) counts only the tokens actually proposed.  A step that evaluated
 * e = min(n_accepted + 1, k) tokens (Bernoulli(alpha) trials to the first
 * rejection) moves alpha toward n_accepted / e with weight alpha_ema * e / k: by
 * Wald's identity the expected update is zero exactly at the true alpha. */
void tdm_ctrl_observe(tdm_spec_ctrl *c, int32_t k, int32_t n_accepted);
/* Expected tokens of a step (the target's own included) at acceptance alpha with
 * k proposed: (1 - alpha^(k+1)) / (1 - alpha), k + 1 at alpha 1, 1 at k = 0. */
double tdm_ctrl_expected_tokens(double alpha, int32_t k);

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
/* A step of n speculating sequences at length k (none of them a lookup or a tree,
 * no prompt chunk, the draft caught up) took seconds. */
void tdm_len_observe_step(tdm_len_ctrl *c, int32_t n, int32_t k, double seconds);
/* Expected tokens per second of a proposal whose step commits e tokens (expected)
 * from rows target rows and rounds draft rounds of a batch of n: e over the row
 * model's cost (costs.h; a step's host work is left out: it is the same whichever
 * proposer proposes, and proposals are weighed against each other with this). */
double tdm_len_rate(const tdm_len_ctrl *c, int32_t n, double e, int32_t rows, int32_t rounds);
/* The length of a sequence's lookup proposal (it runs no model), ng its
 * lookups' estimate and bounds: ng's fixed k, else the k in [ng's k_min, k_max]
 * maximising tdm_len_rate(E[tokens](alpha, k), 1 + k rows, no round); at most cap,
 * 0 when cap < 1. */
int32_t tdm_len_lookup_k(const tdm_len_ctrl *c, const tdm_spec_ctrl *ng, int32_t cap);
/* The same in two parts, for a step that chooses many sequences' lookups: the
 * target's cost by rows, t_rows[r] for r in [1, TDM_CTRL_MAX_K + 1] (once per step),
 * then each sequence's length from them. */
void tdm_len_lookup_costs(const tdm_len_ctrl *c, double *t_rows);
int32_t tdm_len_lookup_k_at(const double *t_rows, const tdm_spec_ctrl *ng, int32_t cap);

#endif
