/* cuda_tree_attn.cu - the CUDA backend's attention entry for every batch: token-tree
 * batches (tdm_batch.tree: rows with an ancestor bitset) here, the others to
 * cuda_attention.cu.  Until the tree kernel exists a tree batch is refused with
 * TANDEM_ERR_UNSUPPORTED (never run with its mask ignored). */
#include "cuda_internal.h"

tandem_status tdm_cuda_tree_attention(tdm_backend *b, const tdm_attn_args *a, tdm_err *err) {
    (void)b;
    (void)a;
    return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "attention: token-tree masks are not supported on the CUDA backend yet");
}

tandem_status tdm_cuda_attention_any(tdm_backend *b, const tdm_attn_args *a, tdm_err *err) {
    if (a && a->batch && a->batch->tree) return tdm_cuda_tree_attention(b, a, err);
    return tdm_cuda_attention(b, a, err);
}
