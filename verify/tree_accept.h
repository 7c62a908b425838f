/* tree_accept.h - acceptance rules for a verified token tree (draft/tree.h).
 *
 * The target's row for the root (the last committed token) and for every node
 * give its distribution for the token after it.
 *
 * Matching (greedy, and the scheduler's coupled sampling): from the root, move to
 * the first child whose token equals the target's token at the current node,
 * while there is one; the target's token at the last node reached is emitted.  The
 * path is the longest root-to-leaf path whose every token is the target's at its
 * parent, so the output is the target's alone.
 *
 * Multi-candidate speculative sampling (SpecInfer's recursive rejection sampling;
 * Sequoia's without replacement): at the current node with target distribution p
 * and children x_1..x_k drawn from the draft's q, child x_i is accepted with
 * probability min(1, p(x_i) / q(x_i)); after a rejection p <- norm(max(p - q, 0))
 * and, for children drawn without replacement, q <- q with x_i removed,
 * renormalised; after the last rejection (or at a node without children) the
 * emitted token is drawn from p.  An accepted child becomes the current node with
 * its own target distribution.  The emitted tokens have exactly the target's
 * distribution.
 */
#ifndef TDM_TREE_ACCEPT_H
#define TDM_TREE_ACCEPT_H

#include "sampling.h"
#include "tree.h"

/* Matching.  target[1 + n]: the target's token at the root (0) and at node i (1 +
 * i).  Writes the accepted nodes to path (root side first) and returns their
 * count; *next = the target's token after them. */
int32_t tdm_tree_accept_match(const tdm_tree *t, const int32_t *target, int32_t *path, int32_t *next);

/* One rejection's update: r <- norm(max(r - q, 0)) (r itself when that has no
 * mass), and when !replacement q[x] <- 0, q renormalised (left as it is when
 * nothing remains).  r and q: [n] doubles. */
void tdm_sibling_reject(double *r, double *q, int32_t x, int32_t n, bool replacement);

/* Sampling.  p: [1 + t->n][V] target distributions (root, then nodes); q: the
 * draft distributions, row t->qrow_root for the root's children and t->qrow[i] for
 * node i's; scratch: [2][V] doubles.  One uniform per decision, one for the
 * emitted token.  Returns the path length as above. */
int32_t tdm_tree_accept_sample(const tdm_tree *t, const float *p, const float *q, int32_t V, bool replacement,
                               tdm_rng *rng, double *scratch, int32_t *path, int32_t *next);

#endif
