/* oracle.c - the benchmark's rearranged draft candidates (oracle.h). */
#include "oracle.h"

int32_t tdm_oracle_rank(double alpha, tdm_rng *rng) {
    const double u1 = tdm_rng_uniform(rng), u2 = tdm_rng_uniform(rng);
    return u1 < alpha ? 0 : u2 < 0.5 ? 1 : -1;
}

int32_t tdm_oracle_arrange(int32_t truth, double alpha, tdm_rng *rng, const int32_t *own, int32_t n_own, int32_t k,
                           int32_t *out) {
    const int32_t at = tdm_oracle_rank(alpha, rng); /* where the truth goes, -1: nowhere */
    int32_t n = 0;
    for (int32_t i = 0; i < n_own && n < k; i++) {
        if (n == at) out[n++] = truth;
        if (n < k && own[i] != truth) out[n++] = own[i];
    }
    if (n == at && n < k) out[n++] = truth;
    return n;
}
