/* verdict.h - what a verification decides, as data: how many proposed tokens the
 * target accepts, which ones (a tree's path), and the target's own token after
 * them.  Verifiers (verify/) return verdicts and change nothing else of the
 * sequence but its random generator (the draws the rule used); the scheduler
 * (sched/commit.c) rolls the K/V back and commits the tokens. */
#ifndef TDM_VERDICT_H
#define TDM_VERDICT_H

#include <stdint.h>

#include "tree.h"

typedef struct tdm_verdict {
    int32_t n_acc;             /* proposed tokens accepted: a prefix of a chain, or the
                                  nodes of path[] for a tree */
    int32_t next;              /* the target's token after them (the correction or the
                                  bonus) */
    int32_t path[TDM_TREE_MAX];/* (trees) the accepted nodes, root side first */
} tdm_verdict;

#endif
