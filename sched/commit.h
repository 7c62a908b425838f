/* commit.h - the one place where tokens are committed and the K/V rolled back
 * (commit.c): every step, of one sequence or many, chain or tree, ends here; and the one
 * place a step enters a request's speculation statistics. */
#ifndef TDM_COMMIT_H
#define TDM_COMMIT_H

#include "engine.h"
#include "spec_rec.h"
#include "tree.h"
#include "verdict.h"

/* Appends a token to the sequence and emits it: detokenised into the request's
 * text, end of generation (EOS, max_tokens, the context) and stop strings checked,
 * the text that can no longer begin a stop string passed to the token callback
 * (which may cancel); a constrained sequence's matcher accepts it, and a grammar
 * that nothing can follow any more ends it (finish reason stop).  Returns false
 * when generation must stop (s->done is then set). */
bool tdm_commit_token(tdm_engine *e, tdm_seq *s, int32_t token);

/* After a verdict on a chain draft[0..v->n_acc + ...) after s's n committed tokens:
 * rolls both models back to n + v->n_acc positions with one truncate of the shared
 * block table (the target holds rows up to the last accepted token; the draft what
 * it was fed, at most as much) and commits the accepted tokens and v->next (as far
 * as the request takes them). */
void tdm_commit_chain(tdm_engine *e, tdm_seq *s, const int32_t *draft, const tdm_verdict *v);

/* After a verdict on s's tree t: the path's K/V of both models move to consecutive
 * slots n .. n + m - 1 (the draft's as far as it saw the path), one truncate to n +
 * m rolls everything else back, a logprobs request's rows (the tree's, in node
 * order) are cut to the path's, and the path's tokens and v->next are committed
 * (as far as the request takes them; a grammar's matcher and the penalties' counts
 * follow them as a chain's). */
tandem_status tdm_commit_tree(tdm_engine *e, tdm_seq *s, const tdm_tree *t, const tdm_verdict *v, tdm_err *err);

/* One step as the request's speculation statistics (tandem_spec_stats) count it. */
typedef struct tdm_step_obs {
    int32_t proposed;        /* tokens (chain) or nodes (tree) verified; 0: a plain step */
    int32_t accepted;        /* of them accepted */
    int32_t looked_up;       /* of the proposed, from n-gram lookup */
    int32_t looked_up_acc;   /* of those, accepted */
    bool lookup_step;        /* the proposal was lookups alone (no draft model ran) */
    bool tree;               /* a token tree */
    int32_t committed;       /* tokens the step committed */
    int32_t k_final;         /* the length the controller chose, -1: unchanged */
    double draft_s, verify_s;/* the step's drafting and verification seconds */
} tdm_step_obs;
/* Records a step of sr's sequence: its statistics, and, where its seconds are its
 * own (a step of that sequence alone: pair is the scheduler's payoff; NULL for a
 * batch's, whose seconds every sequence of the step shares), what a chain step (or a lookup
 * step) yielded per second in the payoff of lookups and of the draft model
 * (draft/payoff.h), the sequence's and the pair's. */
void tdm_spec_stats_add(tdm_spec_rec *sr, tdm_payoff *pair, const tdm_step_obs *o);
/* A finished request's statistics: ss with its rates and the decode time outside
 * drafting and verification (other_ms, with a draft; decode_ms: the result's). */
void tdm_spec_stats_result(tandem_spec_stats *out, const tandem_spec_stats *ss, double decode_ms, bool has_draft);

#endif
