/* lone.h - the step of a lone speculating sequence (lone.c, lone_tree.c), which
 * the scheduler takes when a single greedy sequence runs (or a sampled one on an
 * engine of one sequence): the length controller (draft/length.h, a batch of
 * one) and the tree controller pick a chain, an n-gram proposal or a token tree
 * from measured costs; the chain is drafted on the device
 * without host round trips where the backend can; sampled chains are verified by
 * rejection sampling.  Commits go through commit.h like every step's. */
#ifndef TDM_LONE_H
#define TDM_LONE_H

#include "engine.h"
#include "sched_internal.h"
#include "spec_rec.h"
#include "spec_ws.h"
#include "tree.h"

/* What a lone step measured, entered in the pair's row costs (draft/costs.h), which
 * every step's length decision reads: a target forward of verify_rows rows took
 * verify_s seconds (0 rows: none), a draft forward draft_s (0: none). */
void tdm_lone_observe(tdm_sched *sc, int32_t verify_rows, double verify_s, double draft_s);
/* tdm_seq_step runs one decode step of the lone running request r (speculative
 * when there is a draft); tdm_seq_step_target a plain target-only step (also the
 * fallback of a speculative step). */
tandem_status tdm_seq_step(tdm_sched *sc, tdm_req *r, tdm_err *err);
tandem_status tdm_seq_step_target(tdm_sched *sc, tdm_req *r, tdm_err *err);
/* One token-tree step (lone_tree.c: draft/tree_draft.c + verify/tree_verify.c)
 * of at most `budget` nodes, within what the request may still take. */
tandem_status tdm_spec_tree_step(tdm_sched *sc, tdm_req *r, int32_t budget, tdm_err *err);
/* A tree drafted for s with n-gram lookup on (spec_ngram; not the oracle benchmark)
 * also holds the lookups' continuations, as SpecInfer merges several speculators'
 * proposals into one token tree that one target forward verifies: the continuation
 * of the committed text below the root (it follows the draft's nodes while they
 * agree), and that of the text plus the spine below the spine's last node; each as
 * long as the n-gram controller's k (which weighs a row's verification cost), no
 * node deeper than max_depth - 1.  A lookup node's weight is its parent's times the
 * lookups' acceptance, and the tree then keeps the budget's best nodes of both
 * speculators (tdm_tree_prune), so it stays within its budget; the spine is
 * recomputed.  A lookup runs no model: the tree costs only the rows it verifies.
 * For a greedy tree, or one verified by the target's own draws (the scheduler's
 * sampled trees): any proposal keeps the output.  root[0..*n_root) (at most
 * TDM_TREE_DEPTH_MAX) is the root's lookup; the tree's lookup nodes are flagged
 * (tdm_tree.lookup). */
void tdm_spec_tree_lookups(tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, tdm_tree *t, int32_t budget, int32_t max_depth, int32_t *root,
                           int32_t *n_root);
/* A greedy step whose proposal is n-gram lookups alone, as a token tree of at most
 * `budget` nodes (lone_tree.c): tdm_spec_lookup_tree merges first[0..n_first)
 * (the lookup the step chose over the draft model) and other matches'
 * continuations (TDM_LOOKUP_CANDS in all) from the root into ws->tree, in that order
 * while the budget lasts, and says whether the tree branches (else the step
 * verifies first[] as a chain: the same proposal, a chain's rows);
 * tdm_spec_lookup_tree_step then verifies it in one target forward (t0: when the
 * step began); no model drafts. */
bool tdm_spec_lookup_tree(tdm_engine *e, tdm_spec_ws *ws, tdm_seq *s, tdm_spec_rec *sr, const int32_t *first, int32_t n_first, int32_t budget);
tandem_status tdm_spec_lookup_tree_step(tdm_sched *sc, tdm_req *r, const int32_t *first, int32_t n_first,
                                        int32_t k_chosen, double t0, tdm_err *err);


/* The tree configuration for s of at most budget nodes, its depth within room
 * tokens (a static shape cut to room depths); false when nothing fits. */
bool tdm_spec_tree_cfg(const tdm_spec_rec *sr, int32_t budget, int32_t room, tdm_tree_cfg *out);


#endif
