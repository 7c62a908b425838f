/* cuda_graph.h - CUDA graphs of whole forward passes, keyed by batch shape, and the
 * fixed metadata buffer their kernels read (cuda_graph.cu). */
#ifndef TDM_CUDA_GRAPH_H
#define TDM_CUDA_GRAPH_H

#include "cuda_internal.h"

/* The pinned host buffer of a forward's metadata (at least `bytes`), once the copy of
 * the previous forward's metadata is done with it.  NULL with err set on failure. */
void *tdm_cuda_graph_meta_host(tdm_cuda *c, size_t bytes, tdm_err *err);
/* Queues the copy of its first `bytes` to the fixed device buffer and returns that
 * buffer (the same address every forward until it grows). */
void *tdm_cuda_graph_meta_upload(tdm_cuda *c, size_t bytes, tdm_err *err);

/* Runs fn(ctx) on the backend's stream: the first time a key is seen, directly; the
 * second time, captured into a graph that is then launched; later, by launching
 * that graph.  fn must enqueue the same work for the same key (its launches may read
 * only device memory whose addresses the key fixes).  A key whose capture failed
 * runs directly from then on; graphs are off when the environment sets
 * TANDEM_CUDA_GRAPHS=0 or captures of four keys failed. */
tandem_status tdm_cuda_graph_run(tdm_cuda *c, const uint64_t *key, size_t n_key,
                                 tandem_status (*fn)(const void *ctx, tdm_err *err), const void *ctx, tdm_err *err);
/* Drops every captured graph (device memory they read may be gone). */
void tdm_cuda_graphs_clear(tdm_cuda *c);
/* Frees the graphs and the metadata buffers. */
void tdm_cuda_graphs_free(tdm_cuda *c);
/* Graph launches and captures so far (for benchmarks and tests). */
void tdm_cuda_graph_stats(const tdm_cuda *c, uint64_t *replays, uint64_t *captures);

#endif
