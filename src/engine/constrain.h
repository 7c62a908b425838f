/* constrain.h - a request's grammar constraint (grammar-constrained decoding): the
 * grammar compiled at submission (tandem_generate_params.grammar / .json_schema),
 * its matcher after the committed tokens, and the token masks of a step's rows.
 *
 * The one rule: every logits row of a constrained sequence is masked before its
 * draw (tokens the grammar refuses after the row's text get TDM_LOGIT_NONE), the
 * draft's rows with the state along its chain, the target's verification row d with
 * the state after the chain's first d tokens, so that what the target keeps is what
 * it would draw alone under the grammar, speculated or not.  The matcher follows
 * the committed tokens only: drafting and verification mark it, accept along the
 * chain and roll back before the commit (tdm_constraint_commit) accepts what was
 * kept; a preemption or recomputation keeps the committed tokens, so the matcher
 * stays right.  End of generation is allowed only where the grammar is complete; a
 * finished grammar (no text can follow) ends the sequence, finish reason stop.
 * Rejection sampling reads the target's masked rows (tdm_engine_mask_rows) and the
 * draft's q rows drawn from its masked rows on the host; where the q rows live on
 * the device (ws->q_dev), a constrained sampled sequence is verified by agreement
 * instead (sched/step.c).  A token tree's rows are masked alike, each with the state
 * of its own path (tdm_constraint_tree_rows; the draft's rows of a tree with
 * tdm_constraint_path_mask), and the commit accepts the kept path.
 *
 * The vocabulary (tdm_gvocab) is the target tokenizer's, built once per engine at
 * the first constrained request; a mask row covers the model's n_vocab logits
 * (ids past the tokenizer's are never allowed). */
#ifndef TDM_CONSTRAIN_H
#define TDM_CONSTRAIN_H

#include "engine.h"
#include "grammar.h"

/* Mask rows a sequence keeps: a verified chain's (its pending token and the longest
 * chain) or a verified tree's (its pending token and every node). */
#define TDM_CON_ROWS (TDM_MAX(TANDEM_SPEC_K_MAX, TDM_TREE_MAX_NODES) + 1)
/* The longest path of a tree node whose mask is kept (tdm_constraint.pmasks): a
 * tree's depth at most (TDM_TREE_DEPTH_MAX, draft/tree.h). */
#define TDM_CON_PATH_MAX 16
/* How many matcher states accepted between two commits of its history. */
#define TDM_CON_COMMIT_EVERY 64u

/* Requests of one grammar (the same grammar or json_schema text) share its compiled
 * form and a mask cache (tdm_gshare: a state one sequence met costs the others a
 * copy): the engine keeps up to TDM_CON_SHARED such grammars, each kept after its
 * last request until a new grammar needs its place (the least recently used idle
 * one); with every place in use a request compiles its own, unshared. */
#define TDM_CON_SHARED 8
/* The most bytes of masks each shared grammar's cache keeps. */
#define TDM_CON_SHARE_BYTES ((size_t)8 << 20)

typedef struct tdm_con_reg tdm_con_reg;
typedef struct tdm_con_entry tdm_con_entry;
/* Frees the engine's shared grammars (at its close: no constrained sequence left). */
void tdm_constraint_reg_free(tdm_con_reg *r);

typedef struct tdm_constraint {
    tdm_grammar *g;          /* compiled at submission: owned, or the shared entry's */
    tdm_con_reg *reg;        /* the engine's shared grammars, and the entry of g there */
    tdm_con_entry *shared;   /* (NULL: g is owned) */
    tdm_gmatch *m;           /* the state after the committed tokens (between steps) */
    const tdm_gvocab *v;     /* the engine's */
    uint32_t *masks;         /* [TDM_CON_ROWS][words] host: a step's rows' masks */
    size_t words;            /* (n_vocab + 31) / 32: a row of the model's logits */
    uint32_t mark;           /* the matcher's depth where a chain's drafting began */
    int32_t n_valid;         /* masks[0..n_valid) are this step's chain's rows 0.. (the
                                drafting computed them: row d after draft[0..d)); 0 after
                                every commit and at each drafting's start */
    /* a tree's masks by path (the drafting's, reused by the verification's rows):
     * entry x holds the mask after the committed text and path key[x][0..key_n[x]);
     * emptied by every commit; allocated at the first tree */
    uint32_t *pmasks;        /* [TDM_CON_ROWS][words] host */
    int32_t (*key)[TDM_CON_PATH_MAX]; /* [TDM_CON_ROWS] */
    int32_t key_n[TDM_CON_ROWS];
    int32_t allowed[TDM_CON_ROWS]; /* each entry's count of allowed tokens */
    int32_t n_paths;
    tandem_status fail_st;   /* a committed token the grammar refused, or its memory ran out */
    tdm_err fail_err;
} tdm_constraint;

/* Compiles gp->grammar or gp->json_schema (both: TANDEM_ERR_INVALID_ARG) into s->con
 * (NULL when neither is set); an invalid one is TANDEM_ERR_INVALID_ARG with the
 * grammar engine's message ("grammar: line 3:7: ...", "json_schema: #/properties/a:
 * ..."), a grammar that no token sequence of the vocabulary can start: likewise. */
tandem_status tdm_constraint_init(tdm_engine *e, tdm_seq *s, const tandem_generate_params *gp, tdm_err *err);
void tdm_constraint_free(tdm_seq *s); /* (no constraint: a no-op) */

/* The rows' masks of a verified chain: row d (d = 0..k) after the committed text
 * and draft[0..d), into s->con->masks (tdm_constraint_row; the rows the drafting
 * computed for this chain are kept, n_valid); the matcher is left where it was.  A row after a draft token that leaves nothing to follow (the
 * grammar finished: that token ends the sequence, its row's token is never kept)
 * allows every token.  Row 0 allowing nothing: TANDEM_ERR_INVALID_ARG (the grammar
 * cannot go on with this vocabulary). */
tandem_status tdm_constraint_rows(tdm_seq *s, const int32_t *draft, int32_t k, tdm_err *err);
static inline const uint32_t *tdm_constraint_row(const tdm_seq *s, int32_t d) {
    return s->con->masks + (size_t)d * s->con->words;
}
/* The rows' masks of a verified token tree of n nodes (parents before children:
 * node i's token token[i], its parent parent[i], -1 = the root): row 0 after the
 * committed text, row 1 + i after it and node i's path (its ancestors' tokens and
 * its own), into s->con->masks (n + 1 <= TDM_CON_ROWS), each path's tokens accepted
 * once (a walk of the tree, the matcher rolled back between branches; left where it
 * was), a path's mask the drafting made copied.  A node whose token the grammar refuses after its parent's path (an n-gram
 * lookup's: its parent's row never keeps it), and every node below it, gets a row
 * that allows every token, as does a node after which the grammar is finished (its
 * token ends the sequence).  Row 0 allowing nothing: TANDEM_ERR_INVALID_ARG, as for a
 * chain. */
tandem_status tdm_constraint_tree_rows(tdm_seq *s, const int32_t *token, const int32_t *parent, int32_t n,
                                       tdm_err *err);
/* Drafting a tree: *mask the mask after the committed text and path[0..n) (kept
 * for the verification's rows while the committed text stays; NULL with *n_allowed
 * 0 when the grammar refuses the path; *n_allowed the count); the matcher is left
 * where it was. */
tandem_status tdm_constraint_path_mask(tdm_seq *s, const int32_t *path, int32_t n, const uint32_t **mask,
                                       int32_t *n_allowed, tdm_err *err);
/* The mask of the matcher's current state into row (s->con->words words); *n_allowed
 * the count. */
tandem_status tdm_constraint_mask_now(tdm_seq *s, uint32_t *row, int32_t *n_allowed, tdm_err *err);
/* Drafting: the mask of chain slot d (the matcher after draft[0..d), rows 0..d-1
 * computed before it in this drafting) into s->con->masks row d, kept for the
 * verification (n_valid = d + 1). */
tandem_status tdm_constraint_draft_mask(tdm_seq *s, int32_t d, int32_t *n_allowed, tdm_err *err);
/* Of toks[0..n) after the committed text, the longest prefix the grammar allows
 * (the matcher left where it was): an n-gram lookup is cut there. */
int32_t tdm_constraint_prefix(tdm_seq *s, const int32_t *toks, int32_t n);
/* Drafting: tdm_constraint_draft_begin marks the matcher, each drafted token is
 * accepted (false: the grammar refused it, the chain must stop before it), and
 * tdm_constraint_draft_end rolls the matcher back to the mark. */
void tdm_constraint_draft_begin(tdm_seq *s);
bool tdm_constraint_draft_accept(tdm_seq *s, int32_t token);
void tdm_constraint_draft_end(tdm_seq *s);
/* A committed token: accepted by the matcher (its history committed now and then).
 * False when the grammar refused it or memory ran out (s->con->fail_st says which:
 * the request fails). */
bool tdm_constraint_commit(tdm_seq *s, int32_t token);
/* Whether no text can follow the committed text. */
bool tdm_constraint_finished(const tdm_seq *s);

#endif
