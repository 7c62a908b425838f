/* cuda_graph.cu - CUDA graphs of whole forward passes (see cuda_graph.h), and the
 * fixed metadata buffer they read.
 *
 * A forward of a decode or verification batch is ~10 launches per layer; replaying
 * them as one graph removes the launch gaps.  The graph is keyed by everything
 * that fixes its launches (rows, tiles, splits, the buffers' and weights'
 * addresses); the batch's contents (positions, slots, block tables) are data in
 * the metadata buffer, copied in before each launch.  Freeing any device memory
 * drops every graph (cu_free), so a graph never reads memory that is gone. */
#include <stdlib.h>
#include <string.h>

#include "cuda_graph.h"

#define GRAPH_KEY_MAX 16
#define GRAPH_CACHE 64
#define GRAPH_FAILS_MAX 4 /* failed captures (of different shapes) after which graphs are off */

typedef struct graph_entry {
    uint64_t key[GRAPH_KEY_MAX];
    size_t n_key;
    int seen;                /* times the key was run */
    bool failed;             /* its capture failed: run directly from now on */
    cudaGraphExec_t exec;    /* NULL until captured */
    uint64_t last_use;
} graph_entry;

struct tdm_cuda_graphs {
    graph_entry e[GRAPH_CACHE];
    int n;
    uint64_t clock, replays, captures;
    bool off;                /* TANDEM_CUDA_GRAPHS=0 (src/base/diag.h), or GRAPH_FAILS_MAX captures failed */
    int fails;               /* captures that failed */
    uint8_t *meta_h, *meta_d;
    size_t meta_cap;
    cudaEvent_t meta_copied; /* recorded after each metadata copy */
    bool meta_pending;
};

static tdm_cuda_graphs *graphs_of(tdm_cuda *c, tdm_err *err) {
    if (c->graphs) return c->graphs;
    tdm_cuda_graphs *g = (tdm_cuda_graphs *)calloc(1, sizeof *g);
    if (!g) {
        tdm_seterr(err, TANDEM_ERR_NOMEM, "cuda graphs: out of memory");
        return NULL;
    }
    g->off = tdm_diag_get()->cuda_graphs_off;
    cudaError_t e = cudaEventCreateWithFlags(&g->meta_copied, cudaEventDisableTiming);
    if (e != cudaSuccess) {
        free(g);
        tdm_cuda_status(e, "cuda graphs: event", err);
        return NULL;
    }
    c->graphs = g;
    return g;
}

void *tdm_cuda_graph_meta_host(tdm_cuda *c, size_t bytes, tdm_err *err) {
    tdm_cuda_graphs *g = graphs_of(c, err);
    if (!g) return NULL;
    if (g->meta_pending) {
        cudaError_t e = cudaEventSynchronize(g->meta_copied);
        if (e != cudaSuccess) {
            tdm_cuda_status(e, "forward metadata copy", err);
            return NULL;
        }
        g->meta_pending = false;
    }
    if (bytes <= g->meta_cap) return g->meta_h;
    const size_t cap = TDM_MAX((size_t)1 << 16, 2 * bytes);
    cudaError_t e = cudaStreamSynchronize(c->stream); /* (the old device buffer may be in use) */
    if (e != cudaSuccess) {
        tdm_cuda_status(e, "forward metadata", err);
        return NULL;
    }
    tdm_cuda_graphs_clear(c);
    cudaFreeHost(g->meta_h);
    cudaFree(g->meta_d);
    g->meta_h = g->meta_d = NULL;
    g->meta_cap = 0;
    void *h = NULL, *d = NULL;
    e = cudaMallocHost(&h, cap);
    if (e == cudaSuccess) e = cudaMalloc(&d, cap);
    if (e != cudaSuccess) {
        cudaFreeHost(h);
        tdm_cuda_status(e, "forward metadata", err);
        return NULL;
    }
    g->meta_h = (uint8_t *)h;
    g->meta_d = (uint8_t *)d;
    g->meta_cap = cap;
    return g->meta_h;
}

void *tdm_cuda_graph_meta_upload(tdm_cuda *c, size_t bytes, tdm_err *err) {
    tdm_cuda_graphs *g = c->graphs;
    if (!g || bytes > g->meta_cap) {
        tdm_seterr(err, TANDEM_ERR_BACKEND, "forward metadata: upload of %zu bytes without room", bytes);
        return NULL;
    }
    cudaError_t e = cudaMemcpyAsync(g->meta_d, g->meta_h, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e == cudaSuccess) e = cudaEventRecord(g->meta_copied, c->stream);
    if (e != cudaSuccess) {
        tdm_cuda_status(e, "forward metadata upload", err);
        return NULL;
    }
    g->meta_pending = true;
    return g->meta_d;
}

static graph_entry *find(tdm_cuda_graphs *g, const uint64_t *key, size_t n_key) {
    for (int i = 0; i < g->n; i++)
        if (g->e[i].n_key == n_key && memcmp(g->e[i].key, key, n_key * sizeof *key) == 0) return &g->e[i];
    return NULL;
}

static graph_entry *insert(tdm_cuda_graphs *g, const uint64_t *key, size_t n_key) {
    graph_entry *v;
    if (g->n < GRAPH_CACHE) {
        v = &g->e[g->n++];
    } else { /* the least recently used */
        v = &g->e[0];
        for (int i = 1; i < g->n; i++)
            if (g->e[i].last_use < v->last_use) v = &g->e[i];
        if (v->exec) cudaGraphExecDestroy(v->exec);
    }
    memset(v, 0, sizeof *v);
    memcpy(v->key, key, n_key * sizeof *key);
    v->n_key = n_key;
    return v;
}

/* A failed capture: that shape runs directly from now on; after GRAPH_FAILS_MAX of
 * them graphs are off. */
static void capture_failed(tdm_cuda_graphs *g, graph_entry *v) {
    cudaGetLastError();
    v->failed = true;
    if (++g->fails >= GRAPH_FAILS_MAX) g->off = true;
}

/* Captures fn into e->exec; on failure marks the shape (the caller runs fn). */
static tandem_status capture(tdm_cuda *c, tdm_cuda_graphs *g, graph_entry *v,
                             tandem_status (*fn)(const void *, tdm_err *), const void *ctx, tdm_err *err) {
    cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        capture_failed(g, v);
        return TANDEM_OK;
    }
    c->capturing = true;
    tdm_err ferr;
    memset(&ferr, 0, sizeof ferr);
    tandem_status st = fn(ctx, &ferr);
    c->capturing = false;
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(c->stream, &graph);
    if (st || e != cudaSuccess || !graph) {
        if (graph) cudaGraphDestroy(graph);
        capture_failed(g, v);
        (void)err;
        return TANDEM_OK; /* (run directly below) */
    }
    e = cudaGraphInstantiate(&v->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        v->exec = NULL;
        capture_failed(g, v);
        return TANDEM_OK;
    }
    g->captures++;
    return TANDEM_OK;
}

tandem_status tdm_cuda_graph_run(tdm_cuda *c, const uint64_t *key, size_t n_key,
                                 tandem_status (*fn)(const void *ctx, tdm_err *err), const void *ctx, tdm_err *err) {
    tdm_cuda_graphs *g = graphs_of(c, err);
    if (!g) return err ? err->status : TANDEM_ERR_NOMEM;
    if (g->off || n_key > GRAPH_KEY_MAX) return fn(ctx, err);
    graph_entry *v = find(g, key, n_key);
    if (!v) v = insert(g, key, n_key);
    v->last_use = ++g->clock;
    if (!v->exec && !v->failed && v->seen++ >= 1) {
        tandem_status st = capture(c, g, v, fn, ctx, err);
        if (st) return st;
    }
    if (!v->exec) return fn(ctx, err);
    TDM_CU(cudaGraphLaunch(v->exec, c->stream));
    g->replays++;
    return TANDEM_OK;
}

void tdm_cuda_graphs_clear(tdm_cuda *c) {
    tdm_cuda_graphs *g = c->graphs;
    if (!g) return;
    for (int i = 0; i < g->n; i++)
        if (g->e[i].exec) cudaGraphExecDestroy(g->e[i].exec);
    g->n = 0;
}

void tdm_cuda_graphs_free(tdm_cuda *c) {
    tdm_cuda_graphs *g = c->graphs;
    if (!g) return;
    tdm_cuda_graphs_clear(c);
    cudaFreeHost(g->meta_h);
    cudaFree(g->meta_d);
    cudaEventDestroy(g->meta_copied);
    free(g);
    c->graphs = NULL;
}

void tdm_cuda_graph_stats(const tdm_cuda *c, uint64_t *replays, uint64_t *captures) {
    *replays = c->graphs ? c->graphs->replays : 0;
    *captures = c->graphs ? c->graphs->captures : 0;
}
