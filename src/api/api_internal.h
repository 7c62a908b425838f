/* api_internal.h - what the tests reach past the public header: an engine opened
 * with some of the device paths it would take turned to the host's (the GPU tests
 * compare the two), and the backend behind a model.  Not part of include/tandem.h;
 * not exported from a shared build. */
#ifndef TDM_API_INTERNAL_H
#define TDM_API_INTERNAL_H

#include "backend.h"
#include "spec_ws.h"
#include "tandem.h"

typedef struct tdm_api_paths {
    bool host_sampling;  /* sample on host copies of the logits (tdm_engine_cfg) */
    tdm_spec_ws_opts ws; /* drafting's host paths (draft/spec_ws.h) */
} tdm_api_paths;

/* tandem_engine_open with paths (NULL: the defaults, every device path the backend
 * has). */
tandem_status tdm_api_engine_open(tandem_model *target, tandem_model *draft, const tandem_engine_params *params,
                                  const tdm_api_paths *paths, tandem_engine **out);

/* The backend holding a model's weights, where an engine on a GPU computes (rank 0's
 * of a split model); NULL for NULL. */
tdm_backend *tdm_api_model_backend(tandem_model *model);

#endif
