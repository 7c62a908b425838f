/* spec_rec.c - a sequence's speculation record (spec_rec.h). */
#include "spec_rec.h"

#include <stdlib.h>
#include <string.h>

#include "ngram.h"

_Static_assert(TDM_CTRL_MAX_K == TANDEM_SPEC_K_MAX, "the controller's limit is the public one");
_Static_assert(TDM_NGRAM_MIN == TANDEM_SPEC_NGRAM_MIN && TDM_NGRAM_MAX == TANDEM_SPEC_NGRAM_MAX,
               "the n-gram lengths are the public ones");
_Static_assert(TDM_TREE_MAX == TANDEM_SPEC_TREE_MAX, "the tree's limit is the public one");

tandem_status tdm_spec_rec_init(tdm_spec_rec *r, const tandem_generate_params *gp, int32_t n_seq_max, double carry,
                                tdm_err *err) {
    memset(r, 0, sizeof *r);
    if (gp->spec_tree_shape && !tdm_tree_cfg_parse_shape(gp->spec_tree_shape, &r->tree_shape, err))
        return err ? err->status : TANDEM_ERR_INVALID_ARG;
    r->spec_tree = r->tree_shape.n_shape > 0 ? r->tree_shape.budget : gp->spec_tree;
    tdm_tree_ctrl_init(&r->tctrl);
    if (gp->bench_oracle_tokens) {
        if (n_seq_max > 1)
            return tdm_seterr(err, TANDEM_ERR_INVALID_ARG,
                              "bench_oracle_tokens needs an engine of one sequence (n_seq_max %d)", (int)n_seq_max);
        r->oracle = tdm_mallocarray((size_t)gp->bench_n_oracle, sizeof(int32_t));
        if (!r->oracle) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        memcpy(r->oracle, gp->bench_oracle_tokens, (size_t)gp->bench_n_oracle * sizeof(int32_t));
        r->n_oracle = gp->bench_n_oracle;
        r->oracle_alpha = gp->bench_oracle_alpha;
        tdm_rng_seed(&r->oracle_rng, gp->seed ^ 0x6f7261636c65ull);
    }
    tdm_ctrl_init(&r->ctrl, gp->spec_k_min, gp->spec_k_max, gp->spec_k);
    if (carry >= 0) r->ctrl.alpha = 0.5 * (r->ctrl.alpha + carry); /* (halfway from the prior) */
    r->spec_p_min = gp->spec_p_min;
    r->spec_ngram = r->oracle ? 0 : gp->spec_ngram;
    tdm_ctrl_init(&r->ctrl_ng, gp->spec_k_min, gp->spec_k_max, gp->spec_k);
    r->ctrl_ng.alpha = TDM_NGRAM_ALPHA_PRIOR;
    return TANDEM_OK;
}

void tdm_spec_rec_step(tdm_spec_rec *r) { r->lookups = r->spec_ngram > 0 && tdm_payoff_lookups(&r->pay); }

void tdm_spec_rec_free(tdm_spec_rec *r) {
    free(r->oracle);
    r->oracle = NULL;
}
