/* forward_moe.c - the FFN half of a mixture-of-experts layer (qwen3moe, Mixtral).
 * On backends whose memory is the host's (the CPU backend):
 *   xb = rmsnorm(x);  logits = xb Router^T;  each row's k experts and weights
 *   (moe.h, on the host);  then expert by expert, in ascending order, over the rows
 *   routed to it: gu = xb_rows W13_e^T, out = swiglu(gu) W2_e^T (the backend's
 *   matmul and swiglu ops, threaded there), acc[row] += weight * out;
 *   x += acc.
 * The experts' part is the backend's moe_experts op where it has one and takes the
 * batch (the CPU: threads take whole experts' products), with the same results.
 * A row's sum runs over its experts in ascending expert order whatever the other
 * rows route to, and the products compute each row as alone on backends with
 * invariant_rows 0 (the CPU) or within s->mm_rows slices otherwise, so a row's result
 * does not depend on the other rows of its forward, as the dense FFN promises.
 * On backends without host memory (CUDA; model.c's tdm_model_check_backend refuses
 * such models where the backend lacks the ops) the rows are routed where the logits
 * are (the moe_route op) and the moe_experts op reads the routing there: nothing in
 * the layer waits for the host.
 */
#include <string.h>

#include "model.h"
#include "moe.h"

tandem_status tdm_fwd_moe_by_ops(tdm_backend *be, const tdm_fwd_scratch *s, const tdm_moe_args *a, tdm_err *err) {
    const tdm_backend_ops *op = be->ops;
    const int32_t n = a->n, E = a->n_embd, F = a->n_ff, K = a->k;
    tandem_status st;
    memset(a->out, 0, (size_t)n * (size_t)E * sizeof *a->out);
    for (int32_t e = 0; e < a->n_expert; e++) {
        int32_t nr = 0; /* the rows routed to e, in row order, and their weights */
        for (int32_t i = 0; i < n; i++)
            for (int32_t j = 0; j < K; j++)
                if (a->ids[(size_t)i * K + j] == e) {
                    s->moe_rows[nr] = i;
                    s->moe_rw[nr++] = a->w[(size_t)i * K + j];
                }
        if (nr == 0) continue;
        const float *in = a->x; /* (every row: no gather) */
        if (nr < n) {
            if ((st = op->gather_rows(be, a->x, s->moe_rows, nr, E, s->moe_x, err))) return st;
            in = s->moe_x;
        }
        if ((st = tdm_fwd_matmul(be, s, &a->w13[e], in, nr, s->gate_up, false, err)) ||
            (st = op->swiglu(be, s->gate_up, nr, F, s->ff, err)) ||
            (st = tdm_fwd_matmul(be, s, &a->w2[e], s->ff, nr, s->moe_y, false, err)))
            return st;
        for (int32_t r = 0; r < nr; r++) {
            float *o = a->out + (size_t)s->moe_rows[r] * E;
            const float *y = s->moe_y + (size_t)r * E, w = s->moe_rw[r];
            for (int32_t c = 0; c < E; c++) o[c] += w * y[c];
        }
    }
    return TANDEM_OK;
}

tandem_status tdm_fwd_layer_moe(const tdm_model *m, tdm_backend *be, tdm_fwd_scratch *s, int32_t n, int32_t l,
                                float *y, tdm_err *err) {
    const tdm_hparams *hp = &m->hp;
    const tdm_backend_ops *op = be->ops;
    const tdm_layer *L = &m->layers[l];
    const int32_t E = hp->n_embd, NE = hp->n_expert, K = hp->n_expert_used;
    tandem_status st;
    const bool dev = !be->host_memory;
    if (dev && (!op->moe_route || !op->moe_experts || !s->moe_ids_dev))
        return tdm_seterr(err, TANDEM_ERR_UNSUPPORTED, "mixture-of-experts layers are not yet on the %s backend",
                          op->name);
    if ((st = op->rmsnorm(be, s->x, L->ffn_norm, n, E, hp->norm_eps, s->xb, err))) return st;
    if ((st = tdm_fwd_matmul(be, s, &L->router, s->xb, n, s->moe_logits, false, err))) return st;
    if (dev) {
        if ((st = op->moe_route(be, s->moe_logits, n, NE, K, s->moe_ids_dev, s->moe_w_dev, err))) return st;
    } else {
        for (int32_t i = 0; i < n; i++)
            tdm_moe_route(s->moe_logits + (size_t)i * NE, NE, K, s->moe_ids + (size_t)i * K, s->moe_w + (size_t)i * K);
    }
    float *acc = y ? y : s->moe_acc;
    tdm_moe_args ma = {.x = s->xb, .n = n, .n_embd = E, .n_ff = hp->n_ff, .n_expert = NE, .k = K,
                       .ids = dev ? s->moe_ids_dev : s->moe_ids, .w = dev ? s->moe_w_dev : s->moe_w,
                       .w13 = L->exp_w13, .w2 = L->exp_w2, .out = acc};
    tdm_err probe = {0};
    st = op->moe_experts ? op->moe_experts(be, &ma, &probe) : TANDEM_ERR_UNSUPPORTED;
    if (st == TANDEM_ERR_UNSUPPORTED && !dev) {
        st = tdm_fwd_moe_by_ops(be, s, &ma, err); /* (declined, or no such op) */
    } else if (st && err) {
        *err = probe;
    }
    if (st || y) return st;
    if (L->ffn_post_norm) return tdm_fwd_residual(be, hp, L->ffn_post_norm, s->x, acc, n, err);
    return op->add(be, s->x, acc, n, E, err);
}
