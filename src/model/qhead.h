/* qhead.h - building the row-quantised copy of an output projection (tdm_qhead,
 * kernels/backend.h) that backends with int8 dot products use for approximate
 * logits and for exact greedy argmax without computing every logit. */
#ifndef TDM_QHEAD_H
#define TDM_QHEAD_H
#include "backend.h"

/* Bytes of the one buffer that holds a quantised head of W[rows][cols] (0 when the
 * shape is too large to index). */
size_t tdm_qhead_bytes(int64_t rows, int64_t cols);
/* Sets h's shape and points its arrays into buf (tdm_qhead_bytes long; host or
 * backend memory, 64-byte aligned). */
void tdm_qhead_place(tdm_qhead *h, int64_t rows, int64_t cols, void *buf);
/* Quantises the host weight w into buf (host memory laid out by tdm_qhead_place).
 * Fails with TANDEM_ERR_FORMAT when w holds a non-finite value (no bound exists). */
tandem_status tdm_qhead_fill(const tdm_weight *w, void *buf, tdm_err *err);

#endif
