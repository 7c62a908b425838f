/* api_values.c - the public header's plain values, which every layer may use (the
 * scheduler fills and frees results, errors name their status): status strings,
 * the default generation parameters, freeing a result.  The rest of the public API
 * is src/api/api.c. */
#include <stdlib.h>
#include <string.h>

#include "tandem.h"

const char *tandem_status_str(tandem_status s) {
    switch (s) {
    case TANDEM_OK: return "ok";
    case TANDEM_ERR_INVALID_ARG: return "invalid argument";
    case TANDEM_ERR_IO: return "I/O error";
    case TANDEM_ERR_FORMAT: return "format error";
    case TANDEM_ERR_UNSUPPORTED: return "unsupported";
    case TANDEM_ERR_NOMEM: return "out of memory";
    case TANDEM_ERR_MISMATCH: return "target/draft mismatch";
    case TANDEM_ERR_KV_FULL: return "KV cache full";
    case TANDEM_ERR_BACKEND: return "backend error";
    case TANDEM_ERR_CANCELLED: return "cancelled";
    case TANDEM_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

tandem_generate_params tandem_generate_default_params(void) {
    tandem_generate_params p = {
        .max_tokens = 128, .temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0,
        .spec_k = 0, .spec_k_min = 1, .spec_k_max = 12, .spec_p_min = 0.0f, .spec_ngram = 4, .on_token = NULL, .user_data = NULL, .ignore_eos = false,
        .stop = NULL, .n_stop = 0, .repetition_penalty = 1.0f,
    };
    return p;
}

void tandem_result_free(tandem_result *r) {
    if (!r) return;
    free(r->tokens);
    free(r->text);
    free(r->error);
    free(r->logprobs);
    memset(r, 0, sizeof *r);
}
