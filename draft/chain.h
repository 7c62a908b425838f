/* chain.h - chain proposals by the draft model for one sequence or a batch of them
 * (chain.c): the one drafter of every step's chains, whether the engine's draft is a
 * draft model or an EAGLE-3 head (src/engine/head.c: the head runs each round's rows
 * as its own slots, fed the target's features or its previous level's output).
 *
 * Each drafting sequence first catches up on the committed tokens its draft has not
 * seen; then round d drafts token d of every sequence still drafting, one row each.
 * A round is one draft forward for all of them (more when its rows exceed the
 * engine's batch or logits rows), so the draft's weights are read once per round
 * for the whole batch.  Per sequence (tdm_chain_req):
 *   - greedy: the draft's argmax (the oracle benchmark's arrangement, oracle.h, when
 *     the request has one);
 *   - sampled, coupled (u given): the token the draft's processed distribution gives
 *     with the uniform the target's token at that position will be drawn with (the
 *     scheduler's batch verification by agreement, sched/step.c commit_match);
 *   - sampled, own (u NULL): drawn from q, the draft's processed distribution, with
 *     the request's generator; the q rows are kept (ws->qprobs on the host, ws->q_dev
 *     on the device) for verification by rejection sampling (verify/verify.h).  At
 *     most one such sequence per call: the workspace holds one chain's q rows.
 *   - p_min (the request's spec_p_min): drafting stops before a token whose
 *     distribution's top probability is below it (greedy: of the softmax of the
 *     logits; sampled: of q), looking at the distribution only, never at the token
 *     drawn (deciding on the drawn token would bias what reaches verification);
 *   - n-gram extension (k_ext > k and the request's lookups on): once a drafted
 *     prefix makes a lookup match, the chain is completed from the match (up to
 *     k_ext tokens in all) when the lookups' expected rate beats the draft model's.
 *   - a constrained sequence (constrain.h): each row masked on the host with the
 *     grammar's state after the chain so far (the matcher marked at the start,
 *     accepting each drafted token, rolled back at the end), a lookup's extension
 *     cut at the first token the grammar refuses; it runs round by round on the host.
 * Where the backend keeps argmaxes and samples in its memory, a lone sequence's
 * forwards (greedy, or sampled with q rows on the device), and a batch of greedy
 * sequences with one k and neither p_min nor an extension nor the oracle, run back
 * to back on the device with one wait for all tokens; p_min and the extension then
 * cut the chain where the round-by-round drafting would have stopped (each decision
 * depends only on the tokens before it), so the proposal is the same. */
#ifndef TDM_CHAIN_H
#define TDM_CHAIN_H

#include "engine.h"
#include "spec_rec.h"
#include "spec_ws.h"

/* One sequence's part of a drafting call. */
typedef struct tdm_chain_req {
    tdm_seq *s;
    tdm_spec_rec *sr;     /* p_min, lookups, the oracle benchmark */
    int32_t k;            /* tokens the draft model drafts at most, 0..TDM_CTRL_MAX_K (0: none) */
    int32_t k_ext;        /* the chain's length at most with a lookup's extension (<= k: none),
                             at most TDM_CTRL_MAX_K */
    const double *u;      /* [k] coupled uniforms (sampled), or NULL: own draws and q rows */
    int32_t *draft;       /* [TDM_CTRL_MAX_K] out: the chain */
    int32_t n_drafted;    /* out: its length */
    int32_t n_model;      /* out: its first n_model tokens are the draft model's */
    int32_t n_forwards;   /* out: the draft forwards it took part in */
} tdm_chain_req;

/* Scratch of tdm_draft_chains, sized by the caller for n_logit_rows rows and its
 * most sequences. */
typedef struct tdm_draft_scratch {
    const tdm_kv_seq **kv; /* [n sequences] */
    int32_t *who, *slot;   /* [n_logit_rows] each logits row's sequence and chain index */
    int32_t *tok;          /* [n_logit_rows] the token drawn from it */
    tdm_draw_row *rows;    /* [n_logit_rows] */
} tdm_draft_scratch;

/* Drafts req[0..n)'s chains (see the top of the file).  Reserves the KV blocks the
 * draft writes (positions up to n_tokens + k - 2); each drafting sequence's n_draft
 * then counts the positions its draft holds consistent with the chain.  *catch_up
 * receives the rows fed for tokens the draft had not seen (before the last
 * committed one of each sequence; an EAGLE-3 head's beyond the k rows of the path it
 * feeds at every level 1, engine.h).  With an EAGLE-3 head as the engine's draft
 * the rounds run on the host (tdm_engine_forward runs the head). */
tandem_status tdm_draft_chains(tdm_engine *e, tdm_spec_ws *ws, tdm_chain_req *req, int32_t n, const tdm_draft_scratch *scr,
                               int32_t *catch_up, tdm_err *err);
/* Fills the q rows [from, from + n) of ws->qprobs one-hot on draft[from ..] (the
 * distribution of a lookup proposal) when the request samples on the host (device
 * q rows past the model's are one-hot already). */
void tdm_draft_onehot_q(const tdm_engine *e, tdm_spec_ws *ws, const tdm_seq *s, const int32_t *draft, int32_t from, int32_t n);

#endif
