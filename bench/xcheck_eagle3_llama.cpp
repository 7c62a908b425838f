// xcheck_eagle3_llama.cpp - llama.cpp's side of bench/xcheck_eagle3.py: greedy
// speculative decoding with an EAGLE-3 head through llama.cpp's own drafter
// (common/speculative.cpp, `draft-eagle3`), printing every step's draft.
//
// Not part of tandem's build: bench/xcheck_eagle3.py compiles it with g++ against a
// llama.cpp source tree and its built libraries (libllama, libllama-common, ggml).
// No program of the June 2026 tree drives draft-eagle3 on the CPU build: the server
// (which does) is not in the snapshot, and examples/speculative-simple feeds the
// head's context like a draft model's (no common_speculative_process; its own TODO).
// This driver runs the server's sequence of calls for one sequence:
//   prefill: llama_decode(target, prompt) -> common_speculative_process(prompt batch)
//            (the head's KV for positions 0..N-2; N-1 deferred) -> first token = argmax
//   step:    common_speculative_draft (id_last, n_past) -> the draft d[0..k)
//            llama_decode(target, [id_last, d...]) -> common_speculative_process(batch)
//            -> accept the longest prefix equal to the target's argmaxes
//            -> common_speculative_accept(n_accepted) -> truncate the target's KV
// The draft length is capped as tandem caps it (max_tokens - generated - 1), so both
// engines take the same steps; greedy everywhere (argmax of the logits; the drafter's
// own top-1 of its top-k sampler is the argmax), no p_min, no n_min.
//
// usage: xcheck_eagle3_llama TARGET HEAD|- N_PREDICT K THREADS PROMPT_FILE...
//   HEAD "-": target only (plain greedy decoding).
// Output, per prompt file i:
//   P i <prompt ids...>
//   S <generated before the step> <k> <draft ids...> A <accepted>   (one per step)
//   O i <output ids...>                                              (EOS included)
#include "common.h"
#include "llama.h"
#include "log.h"
#include "speculative.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static void quiet_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static llama_token argmax_row(llama_context * ctx, int32_t i, int32_t n_vocab) {
    const float * l = llama_get_logits_ith(ctx, i);
    int32_t best = 0;
    for (int32_t t = 1; t < n_vocab; t++)
        if (l[t] > l[best]) best = t; // (first maximum, as tandem's argmax)
    return best;
}

int main(int argc, char ** argv) {
    if (argc < 7) {
        fprintf(stderr, "usage: %s TARGET HEAD|- N_PREDICT K THREADS PROMPT_FILE...\n", argv[0]);
        return 2;
    }
    const std::string path_tgt = argv[1], path_head = argv[2];
    const int n_predict = atoi(argv[3]), k_max = atoi(argv[4]), n_threads = atoi(argv[5]);
    const bool spec = path_head != "-";

    llama_log_set(quiet_log, nullptr);
    common_log_set_verbosity_thold(-1);
    llama_backend_init();

    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model_tgt = llama_model_load_from_file(path_tgt.c_str(), mp);
    if (!model_tgt) { fprintf(stderr, "cannot load %s\n", path_tgt.c_str()); return 1; }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_threads = cp.n_threads_batch = n_threads;
    cp.n_seq_max = 1;
    llama_context * ctx_tgt = llama_init_from_model(model_tgt, cp);
    if (!ctx_tgt) { fprintf(stderr, "cannot create the target's context\n"); return 1; }

    llama_model * model_dft = nullptr;
    llama_context * ctx_dft = nullptr;
    if (spec) {
        model_dft = llama_model_load_from_file(path_head.c_str(), mp);
        if (!model_dft) { fprintf(stderr, "cannot load %s\n", path_head.c_str()); return 1; }
        llama_context_params cpd = cp;
        cpd.ctx_other = ctx_tgt; // the head borrows the target's embedding / output head
        ctx_dft = llama_init_from_model(model_dft, cpd);
        if (!ctx_dft) { fprintf(stderr, "cannot create the head's context\n"); return 1; }
    }

    const llama_vocab * vocab = llama_model_get_vocab(model_tgt);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    llama_batch batch = llama_batch_init(512, 0, 1);

    for (int f = 6; f < argc; f++) {
        std::ifstream in(argv[f], std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        const std::vector<llama_token> prompt = common_tokenize(vocab, ss.str(), true, false);
        const int idx = f - 6;
        printf("P %d", idx);
        for (auto t : prompt) printf(" %d", t);
        printf("\n");

        llama_memory_clear(llama_get_memory(ctx_tgt), true);
        common_speculative * sp = nullptr;
        if (spec) {
            llama_memory_clear(llama_get_memory(ctx_dft), true);
            common_params_speculative ps;
            ps.types = {COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3};
            ps.draft.n_max = k_max;
            ps.draft.n_min = 0;
            ps.draft.p_min = 0.0f;
            ps.draft.backend_sampling = false;
            ps.draft.ctx_tgt = ctx_tgt;
            ps.draft.ctx_dft = ctx_dft;
            sp = common_speculative_init(ps, 1);
            if (!sp) { fprintf(stderr, "common_speculative_init failed\n"); return 1; }
        }

        // prefill: the whole prompt, the first token from its last row
        common_batch_clear(batch);
        for (size_t i = 0; i < prompt.size(); i++)
            common_batch_add(batch, prompt[i], (llama_pos) i, {0}, i + 1 == prompt.size());
        if (llama_decode(ctx_tgt, batch)) { fprintf(stderr, "prefill failed\n"); return 1; }
        if (sp && !common_speculative_process(sp, batch)) { fprintf(stderr, "process failed\n"); return 1; }
        llama_tokens tokens(prompt.begin(), prompt.end());
        std::vector<llama_token> out;
        llama_token id_last = argmax_row(ctx_tgt, batch.n_tokens - 1, n_vocab);
        out.push_back(id_last);
        if (sp) common_speculative_begin(sp, 0, tokens);

        while ((int) out.size() < n_predict && !llama_vocab_is_eog(vocab, id_last)) {
            const int room = n_predict - (int) out.size() - 1; // tandem_sched_room
            const llama_pos n_past = (llama_pos) tokens.size(); // id_last's position
            llama_tokens draft;
            if (sp && room > 0) {
                auto & dp = common_speculative_get_draft_params(sp, 0);
                dp = {true, std::min(k_max, room), n_past, id_last, &tokens, &draft};
                common_speculative_draft(sp);
                // the head's rows past id_last's are the drafts' own: dropped before the
                // verify batch's rows are written there (speculative-simple does the same)
                llama_memory_seq_rm(llama_get_memory(ctx_dft), 0, n_past, -1);
                if ((int) draft.size() > std::min(k_max, room)) draft.resize(std::min(k_max, room));
            }
            common_batch_clear(batch);
            common_batch_add(batch, id_last, n_past, {0}, true);
            for (size_t i = 0; i < draft.size(); i++) common_batch_add(batch, draft[i], n_past + 1 + i, {0}, true);
            if (llama_decode(ctx_tgt, batch)) { fprintf(stderr, "verify failed\n"); return 1; }
            if (sp && !common_speculative_process(sp, batch)) { fprintf(stderr, "process failed\n"); return 1; }
            // accepted: the longest prefix of the draft equal to the target's argmaxes
            std::vector<llama_token> ids;
            size_t acc = 0;
            for (size_t i = 0; i <= draft.size(); i++) {
                const llama_token t = argmax_row(ctx_tgt, (int32_t) i, n_vocab);
                ids.push_back(t);
                if (i == draft.size() || t != draft[i]) break;
                acc++;
            }
            if (sp && !draft.empty()) {
                printf("S %d %d", (int) out.size(), (int) draft.size());
                for (auto t : draft) printf(" %d", t);
                printf(" A %d\n", (int) acc);
                common_speculative_accept(sp, 0, (uint16_t) acc);
            }
            tokens.push_back(id_last);
            for (size_t i = 0; i < ids.size(); i++) {
                id_last = ids[i];
                out.push_back(id_last);
                if (i + 1 < ids.size()) tokens.push_back(id_last);
                if (llama_vocab_is_eog(vocab, id_last) || (int) out.size() >= n_predict) break;
            }
            llama_memory_seq_rm(llama_get_memory(ctx_tgt), 0, (llama_pos) tokens.size(), -1);
        }
        printf("O %d", idx);
        for (auto t : out) printf(" %d", t);
        printf("\n");
        fflush(stdout);
        common_speculative_free(sp);
    }

    llama_batch_free(batch);
    llama_free(ctx_dft);
    llama_model_free(model_dft);
    llama_free(ctx_tgt);
    llama_model_free(model_tgt);
    llama_backend_free();
    return 0;
}
