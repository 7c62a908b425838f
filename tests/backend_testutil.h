/* backend_testutil.h - helpers of the CPU backend tests (test_backend_ops.c,
 * test_layout.c): backends per SIMD level, random vectors and weights. */
#ifndef TDM_BACKEND_TESTUTIL_H
#define TDM_BACKEND_TESTUTIL_H

#include "backend.h"
#include "cpu_internal.h"

/* The SIMD levels this machine has, lowest first; returns their count. */
int tdm_test_levels(tdm_cpu_level out[TDM_CPU_N_LEVELS]);
/* A random weight [rows][cols] of type t (elements in [-0.1, 0.1)) in the layout
 * be's loader gives it (its weight_layout op); *buf: its memory (free), and when
 * rows_bytes is not NULL, *rows_bytes a malloc'd copy in the rows layout. */
tdm_weight tdm_test_rand_weight_for(tdm_backend *be, uint32_t t, int64_t rows, int64_t cols, uint64_t *rng,
                                    void **buf, uint8_t **rows_bytes);
/* A CPU backend at exactly this level with nt threads (fails the test otherwise). */
tdm_backend *tdm_test_backend(tdm_cpu_level level, int nt);
/* n floats uniform in [lo, hi) (malloc'd, 64 spare bytes). */
float *tdm_test_rand_vec(uint64_t *rng, size_t n, float lo, float hi);
/* n mask words (token masks, mask_rows): every 5th all ones, every 7th (else) all
 * zeros, the others random (malloc'd). */
uint32_t *tdm_test_rand_mask(uint64_t *rng, size_t n);
/* A random weight [rows][cols] of the given type in the rows layout, values in
 * [-1, 1) rounded through tdm_row_from_f32 (data malloc'd). */
tdm_weight tdm_test_weight(uint32_t type, int64_t rows, int64_t cols, uint64_t *rng);

/* Block tables for n_seq sequences of lens[s] positions (block size bs) over a
 * random permutation of n_seq's blocks plus `spare` unused ones, so sequences
 * interleave in the pool: seqs[s] is filled (blocks calloc'd; free each
 * seqs[s].blocks) and sp[s] points at it.  Returns the pool's block count. */
/* The slot that row i of a sequence of len writes, in a scrambled order that visits
 * every slot once: (i * m + 3) mod len, m the first step from 7 up coprime with len
 * (two rows writing one slot would leave the order of their writes to chance). */
int32_t tdm_test_scrambled_slot(int32_t i, int32_t len);
int32_t tdm_test_shuffled_seqs(uint64_t *rng, int n_seq, const int32_t *lens, int32_t bs, int32_t spare,
                               tdm_kv_seq *seqs, const tdm_kv_seq **sp);

/* Normalised error of b's matmul of w (any layout) against ref_matmul of ref (the
 * same matrix in the rows layout) on n random rows, accumulating into random y
 * when acc. */
double tdm_test_matmul_err(tdm_backend *b, const tdm_weight *w, const tdm_weight *ref, int32_t n, bool acc,
                           uint64_t *rng);

#endif
