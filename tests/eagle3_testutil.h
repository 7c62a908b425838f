/* eagle3_testutil.h - shared helpers of the EAGLE-3 tests (test_eagle3.c,
 * test_eagle3_forward.c): backends and the pycode target, EAGLE-3 heads built in
 * memory (every option, and corruptions of a valid file), tandem synth's heads, and a
 * one-sequence KV rig. */
#ifndef TDM_EAGLE3_TESTUTIL_H
#define TDM_EAGLE3_TESTUTIL_H

#include "eagle3.h"
#include "engine.h"
#include "tiny_model.h"

/* A CPU backend of `threads` threads; the pycode target on be. */
tdm_backend *cpu(int threads);
tdm_model *load_target(tdm_backend *be);

typedef struct hcfg {
    int E, H, KV, hd, F, V, Vd, T; /* Vd 0: no d2t */
    int layers[3];
    bool nbf, nbr, own_embd, own_output, shuffle;
    uint32_t type;                 /* the matrices': TDM_F32 or TDM_F16 */
    bool mixed;                    /* attn_k and ffn_up in f16, the others of `type` (f32) */
    /* corruptions */
    const char *drop_key, *drop_tensor, *bad_shape;
    int n_layer_ids;               /* target_layers' entries (0: 3) */
    bool layers_f32;               /* target_layers as an f32 array */
    int block_count;               /* 0: 1 */
    uint32_t d2t_type;             /* 0: i64; else f16 */
    int d2t_poke;                  /* > 0: d2t[d2t_poke] = d2t_val */
    int64_t d2t_val;
} hcfg;

/* The in-memory head of the forward tests: every option, its own embedding and head,
 * narrower than the pycode target whose features it fuses. */
hcfg full_cfg(void);
/* A small valid head for the corruption cases (pairs with the pycode target). */
hcfg small_cfg(void);
/* The file's bytes (malloc'ed). */
uint8_t *build_head(const hcfg *c, size_t *len);
/* Loads a head from memory (the buffer must outlive it). */
tandem_status load_mem(const uint8_t *buf, size_t len, tdm_backend *be, tdm_eagle3 **h, tdm_err *err);

/* tandem synth's head of `shape` of type `type` (kind: a mix, or NULL), the pycode
 * target's tokenizer, in a temporary file whose path is written to path[32];
 * synth_head: the eagle3-pycode shape. */
void synth_shape(char *path, const char *shape, uint32_t type, const char *kind);
void synth_head(char *path, uint32_t type, const char *kind);

/* A head on a tiny random target of tc's shape (tiny_model.h), loaded on be: width
 * 32, features of layers 0, 1 and 2, its own embedding and head, vd of the target's
 * tokens in its vocabulary (d2t).  *buf holds the file's bytes (free after the head). */
tdm_eagle3 *tiny_head(tdm_backend *be, const tdm_tiny_cfg *tc, int vd, uint8_t **buf);
/* Sampling with a head keeps the target's distribution: the first n_pos tokens of
 * runs continuations of the prompt {3, 7, 1, 9, 4, 3, 7, 1} under gp, ref's against
 * spec's, two-sample chi-square p-value above bound at each position; the drafts must
 * be accepted and rejected both (acceptance in (0.05, 0.98)).  Logs under `what`. */
void check_same_distribution(tdm_engine *ref, tdm_engine *spec, const tandem_generate_params *gp, int runs, int n_pos,
                             double bound, const char *what);

/* One sequence of 64 positions over 4 blocks of 16, f32 K/V for model m. */
typedef struct rig {
    tdm_kv_store kv;
    tdm_kv_seq seq;
    int32_t blocks[4];
} rig;
void rig_open(rig *r, const tdm_model *m, tdm_backend *be);
/* Rows [p0, p0 + n) of tok, causal, one sequence; logits for all or none. */
void fill_batch(tdm_batch *b, const int32_t *tok, int p0, int n, bool logits);

#endif
