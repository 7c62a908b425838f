/* bench_fp8.c - FP8 weights' quality against the stored weights (issue 45's floor:
 * teacher-forced top-1 agreement >= 97 %), with kv_quality.h: for each prompt the
 * model as stored decodes -G greedy tokens; the same model with FP8 weights
 * (tandem_model_params.weights) then runs those tokens (teacher forcing), and each
 * step's argmax is compared with the reference's token.  Prints one markdown row:
 * the weights' bytes both ways, the top-1 agreement over every step, the prompts
 * whose greedy output is unchanged, the mean common prefix of the greedy outputs,
 * and the normalised logits error.  Exit status 1 below 97 % agreement.
 *
 * usage: bench_fp8 [-m MODEL] [--prompts FILE] [-P 100] [-T 128] [-G 64] [--threads 2]
 *                  [--margin 0.5] [--backend cpu|cuda]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_prompts.h"
#include "kv_quality.h"

static uint64_t weight_bytes(const char *path, bool fp8) {
    tdm_err err = {0};
    tdm_backend *be = NULL;
    tdm_model *m = NULL;
    const tdm_load_progress opt = {.fp8 = fp8};
    if (tdm_backend_cpu_create(1, &be, &err) || tdm_model_load_progress(path, be, &opt, &m, &err)) {
        fprintf(stderr, "bench_fp8: %s: %s\n", path, err.msg);
        exit(2);
    }
    const uint64_t b = m->weight_bytes;
    tdm_model_free(m);
    tdm_backend_destroy(be);
    return b;
}

int main(int argc, char **argv) {
    const char *model = "models/pycode-target-f16.gguf", *prompts_path = "tests/data/prompts-dev.jsonl";
    int P = 100, T = 128, G = 64, threads = 2;
    float margin = 0.5f;
    bool cuda = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const bool has = i + 1 < argc;
        if (!strcmp(a, "-m") && has) model = argv[++i];
        else if (!strcmp(a, "--prompts") && has) prompts_path = argv[++i];
        else if (!strcmp(a, "-P") && has) P = atoi(argv[++i]);
        else if (!strcmp(a, "-T") && has) T = atoi(argv[++i]);
        else if (!strcmp(a, "-G") && has) G = atoi(argv[++i]);
        else if (!strcmp(a, "--threads") && has) threads = atoi(argv[++i]);
        else if (!strcmp(a, "--margin") && has) margin = (float)atof(argv[++i]);
        else if (!strcmp(a, "--backend") && has && (!strcmp(argv[i + 1], "cpu") || !strcmp(argv[i + 1], "cuda")))
            cuda = !strcmp(argv[++i], "cuda");
        else {
            fprintf(stderr,
                    "usage: %s [-m MODEL] [--prompts FILE] [-P 100] [-T 128] [-G 64] [--threads 2] [--margin 0.5] "
                    "[--backend cpu|cuda]\n",
                    argv[0]);
            return 2;
        }
    }
    if (P < 1 || T < 1 || G < 1 || threads < 0) {
        fprintf(stderr, "bench_fp8: -P, -T, -G must be >= 1, --threads >= 0\n");
        return 2;
    }
    const uint64_t b16 = weight_bytes(model, false), b8 = weight_bytes(model, true);
    int n_prompts = 0;
    char **prompts = bench_prompts_read(prompts_path, P, &n_prompts);
    kvq_opts o = {model, threads, TANDEM_KV_F16, TANDEM_KV_F16, T, G, margin, cuda, true};
    kvq_stats st;
    tdm_err err = {0};
    if (!kvq_run(&o, prompts, n_prompts, &st, &err)) {
        fprintf(stderr, "bench_fp8: %s\n", err.msg);
        return 2;
    }
    const double agree = st.n_steps ? 100.0 * (double)st.n_agree / (double)st.n_steps : 0;
    printf("FP8 weights against the stored ones, %s, %d prompts of up to %d tokens, %d greedy tokens each "
           "(teacher-forced on the stored model's output)\n\n",
           cuda ? "GPU" : "CPU", st.n_prompts, T, G);
    printf("| model | weight MB stored | fp8 | top-1 agreement | greedy outputs equal | near-tie / other departures | "
           "mean common prefix | logits error |\n|---|---|---|---|---|---|---|---|\n");
    const char *base = strrchr(model, '/');
    printf("| %s | %.1f | %.1f | %.2f %% (%llu / %llu) | %d / %d | %d / %d | %.1f of %d | %.4f |\n", base ? base + 1 : model,
           (double)b16 / 1e6, (double)b8 / 1e6, agree, (unsigned long long)st.n_agree, (unsigned long long)st.n_steps,
           st.n_equal, st.n_prompts, st.n_near_tie, st.n_other,
           st.n_prompts ? (double)st.prefix_sum / st.n_prompts : 0.0, G, st.logits_err);
    bench_prompts_free(prompts, n_prompts);
    fprintf(stderr, "bench_fp8: %s (top-1 agreement %.2f %%, at least 97 %% wanted)\n", agree >= 97 ? "PASS" : "FAIL",
            agree);
    return agree >= 97 ? 0 : 1;
}
