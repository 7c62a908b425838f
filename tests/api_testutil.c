/* api_testutil.c - helpers shared by the public-API tests (see api_testutil.h). */
#include "api_testutil.h"

#include <criterion/criterion.h>

#include "testutil.h"

tandem_model *api_open_model(const char *file) {
    tandem_model *m = NULL;
    tandem_status st = tandem_model_open(tdm_test_model_path(file), NULL, &m);
    cr_assert_eq(st, TANDEM_OK, "%s: %s", file, tandem_last_error());
    cr_assert(m);
    return m;
}

tandem_engine *api_open_engine(tandem_model *t, tandem_model *d, const tandem_engine_params *p) {
    tandem_engine_params def = tandem_engine_default_params();
    def.n_threads = 2;
    tandem_engine *e = NULL;
    tandem_status st = tandem_engine_open(t, d, p ? p : &def, &e);
    cr_assert_eq(st, TANDEM_OK, "engine: %s", tandem_last_error());
    cr_assert(e);
    return e;
}
