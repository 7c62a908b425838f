/* moe.c - the router of a mixture-of-experts layer (moe.h). */
#include "moe.h"

#include <math.h>

#include "model.h"

void tdm_moe_route(const float *logits, int32_t n_expert, int32_t k, int32_t *ids, float *w) {
    float p[TDM_MAX_EXPERTS];
    float mx = -INFINITY;
    for (int32_t e = 0; e < n_expert; e++)
        if (logits[e] > mx) mx = logits[e];
    double sum = 0;
    for (int32_t e = 0; e < n_expert; e++) sum += (p[e] = expf(logits[e] - mx));
    const float inv = (float)(1.0 / sum);
    for (int32_t e = 0; e < n_expert; e++) p[e] *= inv;
    /* the k most probable, most probable first: repeatedly the first strict maximum
     * among the experts not yet taken (a NaN is never larger: ids stay valid) */
    uint64_t taken[TDM_MAX_EXPERTS / 64] = {0};
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_expert; e++)
            if (!(taken[e / 64] >> (e % 64) & 1u) && (best < 0 || p[e] > p[best])) best = e;
        taken[best / 64] |= 1ull << (best % 64);
        ids[j] = best;
        w[j] = p[best];
    }
    float s = 0;
    for (int32_t j = 0; j < k; j++) s += w[j];
    if (s < 6.103515625e-5f) s = 6.103515625e-5f;
    for (int32_t j = 0; j < k; j++) w[j] /= s;
}
