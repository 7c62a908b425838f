/* payoff.h - what n-gram lookups actually yield for a request, measured, so that
 * they stop proposing where they do not pay (payoff.c).
 *
 * The controllers choose between a lookup and the draft model from modelled rates
 * (length.h: acceptance estimates; costs.h: measured forward costs).  The model can be
 * wrong where it matters: on a real pair on a CPU (Qwen2.5-Coder 1.5B drafted by
 * 0.5B) the lookups were accepted 22-28 % of the time and lowered both the tokens
 * per target forward and the speed, while the model said they paid.  So every
 * speculative chain step is also measured as what it was: a step whose proposal
 * held looked-up tokens (a lookup step, a chain completed by a lookup) or one whose
 * proposal was the draft model's alone; each kind keeps an EMA of the tokens it
 * committed and of the seconds it took (drafting and verification).  Once both
 * kinds have TDM_PAYOFF_MIN steps, a step proposes no lookups while their rate
 * (tokens per second) is below the model's by more than TDM_PAYOFF_MARGIN; every
 * TDM_PAYOFF_PROBE-th such step proposes them anyway, so that a rising rate is seen.
 * A request starts from the pair's figures (the scheduler's, over every request), so
 * that what the engine has learnt holds from its first step. */
#ifndef TDM_PAYOFF_H
#define TDM_PAYOFF_H

#include <stdbool.h>
#include <stdint.h>

#define TDM_PAYOFF_MIN 4       /* steps of each kind before the measurement decides */
#define TDM_PAYOFF_MARGIN 0.05 /* lookups off below (1 - this) times the model's rate */
#define TDM_PAYOFF_PROBE 16    /* while off, on in one step of this many */
#define TDM_PAYOFF_EMA 0.2     /* weight of a new step */

typedef enum tdm_pay_kind {
    TDM_PAY_MODEL = 0,  /* the draft model's proposal alone */
    TDM_PAY_LOOKUP = 1, /* a proposal holding looked-up tokens */
    TDM_PAY_KINDS = 2,
} tdm_pay_kind;

typedef struct tdm_payoff {
    double tok[TDM_PAY_KINDS]; /* EMA of the tokens a step committed, by kind */
    double sec[TDM_PAY_KINDS]; /* EMA of its seconds, by kind */
    int32_t n[TDM_PAY_KINDS];  /* steps observed, by kind */
    int32_t n_off;             /* steps the lookups were off since the last probe */
} tdm_payoff;

/* A step of kind k that committed `committed` tokens in `seconds`. */
void tdm_payoff_observe(tdm_payoff *p, tdm_pay_kind k, int32_t committed, double seconds);
/* Tokens per second of kind k; 0 until it has TDM_PAYOFF_MIN steps. */
double tdm_payoff_rate(const tdm_payoff *p, tdm_pay_kind k);
/* Whether this step may propose lookups (call once per step: it counts the probe
 * schedule). */
bool tdm_payoff_lookups(tdm_payoff *p);
/* A new request's starting figures from the pair's: their EMAs, with at most
 * TDM_PAYOFF_MIN steps counted each. */
void tdm_payoff_carry(tdm_payoff *dst, const tdm_payoff *pair);

#endif
