/* ref_ops.h - plain, obviously-correct reference implementations of the backend ops
 * (kernels/backend.h), for tests.  Host memory only; double accumulation; weights
 * are dequantised with tdm_row_to_f32.  No argument checking beyond what is needed
 * not to crash on valid input. */
#ifndef TDM_REF_OPS_H
#define TDM_REF_OPS_H

#include "backend.h"

void ref_get_rows(const tdm_weight *w, const int32_t *ids, int32_t n, float *out);
void ref_rmsnorm(const float *x, const float *gamma, int32_t n, int32_t dim, float eps, float *out);
/* y[n][w->rows] (=|+=) x[n][w->cols] * W^T */
void ref_matmul(const tdm_weight *w, const float *x, int32_t n, float *y, bool accumulate);
void ref_add_bias(float *y, const float *bias, int32_t n, int32_t dim);
/* (rp->freq, when set, is read here: host memory) */
void ref_rope(float *x, int32_t n, int32_t row_stride, int32_t n_head, int32_t head_dim,
              const int32_t *pos, const tdm_rope_params *rp);
void ref_swiglu(const float *gate_up, int32_t n, int32_t ff, float *out);
void ref_gather_rows(const float *x, const int32_t *rows, int32_t n, int32_t dim, float *out);
/* kv_write and attention for every cache type (src/base/kv_layout.h); attention in
 * double over the cache's values (q8_0, fp8: scale * quant / code value, dequantised
 * on the fly). */
void ref_kv_write(const tdm_kv_write_args *a);
void ref_attention(const tdm_attn_args *a); /* (window and softcap as backend.h defines them) */
/* The value of K (is_k) or V at (slot, kv head g, element d) of sequence s's blocks
 * in a host cache of any type, in double; and a q8_0 or fp8 cache's scale of that slot. */
double ref_kv_get(const void *cache, uint32_t type, bool is_k, const tdm_kv_seq *s, int32_t slot, int32_t g,
                  int32_t d, int32_t n_kv_head, int32_t bs, int32_t hd);
float ref_kv_scale(const void *cache, bool is_k, const tdm_kv_seq *s, int32_t slot, int32_t g, int32_t n_kv_head,
                      int32_t bs, int32_t hd);

/* ||a - b|| / ||b|| (0 when both are zero; 1e30 if a has a NaN or b is zero and a not). */
double ref_nrm_err(const float *a, const float *b, size_t n);

#endif
