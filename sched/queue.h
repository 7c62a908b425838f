/* queue.h - the waiting requests: a binary heap, higher priority first, then
 * earlier arrival (first come, first served within a priority).  A preempted
 * request keeps its arrival order, so it goes back ahead of the later ones. */
#ifndef TDM_SCHED_QUEUE_H
#define TDM_SCHED_QUEUE_H

#include <stdbool.h>
#include <stdint.h>

typedef struct tdm_req tdm_req;

typedef struct tdm_queue {
    tdm_req **heap; /* [cap] heap[0] is the next to run */
    int32_t n, cap;
} tdm_queue;

void tdm_queue_free(tdm_queue *q);
/* false when out of memory (the queue is unchanged) */
bool tdm_queue_push(tdm_queue *q, tdm_req *r);
tdm_req *tdm_queue_top(const tdm_queue *q); /* NULL when empty */
tdm_req *tdm_queue_pop(tdm_queue *q);
/* Removes every request for which drop(r, user) returns true (drop may finish it),
 * keeping the heap order of the others. */
void tdm_queue_filter(tdm_queue *q, bool (*drop)(tdm_req *r, void *user), void *user);
/* true when a should run before b */
bool tdm_req_before(const tdm_req *a, const tdm_req *b);

#endif
