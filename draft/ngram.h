/* ngram.h - n-gram lookup proposals ("prompt lookup decoding").
 *
 * A proposer that costs no model forward: it finds the most recent earlier
 * occurrence of the sequence's last n tokens (prompt and generated text alike)
 * and proposes the tokens that followed it.  Code and structured text repeat
 * themselves (identifiers, call patterns, whole lines), so such continuations are
 * often what the target would write next.  The target verifies them like any
 * draft, so the output is unchanged: greedy stays token-for-token identical, and
 * sampling treats a proposal as a draft distribution that is one-hot on it.
 */
#ifndef TDM_NGRAM_H
#define TDM_NGRAM_H

#include <stdbool.h>
#include <stdint.h>

/* Longest n-gram tried (spec_ngram is clamped to it). */
#define TDM_NGRAM_MAX 8
/* Shortest n-gram matched: a single token repeats too often to be a good guess. */
#define TDM_NGRAM_MIN 2
/* Starting acceptance estimate of n-gram proposals: optimistic (a match in code is
 * usually right), so that a request tries them early; it adapts per request. */
#define TDM_NGRAM_ALPHA_PRIOR 0.8
/* A match passed over for the draft model is used anyway once in this many, so that
 * a low acceptance estimate can recover. */
#define TDM_NGRAM_EXPLORE 8

/* Looks up toks[len - n, len) for n = n_max down to TDM_NGRAM_MIN at earlier
 * positions (most recent first) and copies up to max_out tokens that followed the
 * first match found into out.  Returns the number proposed (0: no match, or
 * n_max < TDM_NGRAM_MIN, or max_out <= 0). */
int32_t tdm_ngram_propose(const int32_t *toks, int32_t len, int32_t n_max, int32_t max_out, int32_t *out);

/* The same lookup over the text toks[0..len) followed by tail[0..n_tail) (a tree's
 * spine, drafted but not committed), without joining them. */
int32_t tdm_ngram_propose_after(const int32_t *toks, int32_t len, const int32_t *tail, int32_t n_tail, int32_t n_max,
                                int32_t max_out, int32_t *out);

/* Several continuations for a lookup tree: those that followed the matches of
 * toks[len - n, len), n = n_max down to TDM_NGRAM_MIN, most recent match first
 * within each n, each up to max_out tokens, skipping one that repeats the start of
 * an earlier one; at most max_cands, written to out[c * max_out ..] with their
 * lengths in lens[c].  Returns how many (the first is tdm_ngram_propose's). */
int32_t tdm_ngram_propose_multi(const int32_t *toks, int32_t len, int32_t n_max, int32_t max_out, int32_t max_cands,
                                int32_t *out, int32_t *lens);

/* Whether a proposal is taken over the draft model's chain: when its value (expected
 * tokens, or tokens per second) is at least the draft's, and otherwise on every
 * TDM_NGRAM_EXPLORE-th match passed over (*n_skips counts them, per sequence), so
 * that a low acceptance estimate can recover. */
bool tdm_ngram_take(double value_ngram, double value_draft, int32_t *n_skips);

/* Continuations of n-gram lookup matches a lookup tree holds at most. */
#define TDM_LOOKUP_CANDS 4

#endif
