/* queue.c - the waiting requests' heap (queue.h). */
#include "queue.h"

#include <stdlib.h>

#include "sched_internal.h"

bool tdm_req_before(const tdm_req *a, const tdm_req *b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->order < b->order;
}

static void sift_up(tdm_queue *q, int32_t i) {
    while (i > 0) {
        int32_t p = (i - 1) / 2;
        if (!tdm_req_before(q->heap[i], q->heap[p])) break;
        tdm_req *t = q->heap[i];
        q->heap[i] = q->heap[p];
        q->heap[p] = t;
        i = p;
    }
}

static void sift_down(tdm_queue *q, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < q->n && tdm_req_before(q->heap[l], q->heap[m])) m = l;
        if (r < q->n && tdm_req_before(q->heap[r], q->heap[m])) m = r;
        if (m == i) return;
        tdm_req *t = q->heap[i];
        q->heap[i] = q->heap[m];
        q->heap[m] = t;
        i = m;
    }
}

void tdm_queue_free(tdm_queue *q) {
    free(q->heap);
    q->heap = NULL;
    q->n = q->cap = 0;
}

bool tdm_queue_push(tdm_queue *q, tdm_req *r) {
    if (q->n == q->cap) {
        int32_t nc = q->cap ? q->cap * 2 : 64;
        tdm_req **nh = realloc(q->heap, (size_t)nc * sizeof *nh);
        if (!nh) return false;
        q->heap = nh;
        q->cap = nc;
    }
    q->heap[q->n++] = r;
    sift_up(q, q->n - 1);
    return true;
}

tdm_req *tdm_queue_top(const tdm_queue *q) { return q->n ? q->heap[0] : NULL; }

tdm_req *tdm_queue_pop(tdm_queue *q) {
    if (!q->n) return NULL;
    tdm_req *r = q->heap[0];
    q->heap[0] = q->heap[--q->n];
    if (q->n) sift_down(q, 0);
    return r;
}

void tdm_queue_filter(tdm_queue *q, bool (*drop)(tdm_req *r, void *user), void *user) {
    int32_t m = 0;
    for (int32_t i = 0; i < q->n; i++)
        if (!drop(q->heap[i], user)) q->heap[m++] = q->heap[i];
    if (m == q->n) return;
    q->n = m;
    for (int32_t i = m / 2 - 1; i >= 0; i--) sift_down(q, i);
}
