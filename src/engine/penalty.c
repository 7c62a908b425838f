/* penalty.c - a request's logit edits (penalty.h). */
#include "penalty.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

enum { PEN_PROMPT = 1, PEN_EOG = 2, PEN_BIAS = 4, PEN_SEEN = 8 };

static void seen_add(tdm_penalty *p, int32_t t) { /* (seen holds n_vocab: never full) */
    if (p->flag[t] & PEN_SEEN) return;
    p->seen[p->n_seen++] = t;
    p->flag[t] |= PEN_SEEN;
}

tandem_status tdm_penalty_init(tdm_engine *e, tdm_seq *s, const tandem_generate_params *gp, tdm_err *err) {
    s->pen = NULL;
    const tandem_status bad = TANDEM_ERR_INVALID_ARG;
    if (!(gp->presence_penalty >= -2 && gp->presence_penalty <= 2))
        return tdm_seterr(err, bad, "presence_penalty %g is out of range [-2, 2]", gp->presence_penalty);
    if (!(gp->frequency_penalty >= -2 && gp->frequency_penalty <= 2))
        return tdm_seterr(err, bad, "frequency_penalty %g is out of range [-2, 2]", gp->frequency_penalty);
    if (!(gp->repetition_penalty > 0 && gp->repetition_penalty <= 100))
        return tdm_seterr(err, bad, "repetition_penalty %g is out of range (0, 100]", gp->repetition_penalty);
    if (gp->min_tokens < 0) return tdm_seterr(err, bad, "min_tokens %d is out of range [0, INT_MAX]", gp->min_tokens);
    if (gp->n_logit_bias < 0 || gp->n_logit_bias > TANDEM_LOGIT_BIAS_MAX || (gp->n_logit_bias > 0 && !gp->logit_bias))
        return tdm_seterr(err, bad, "logit_bias: %d entries (at most %d, and an array for them)", gp->n_logit_bias,
                          TANDEM_LOGIT_BIAS_MAX);
    for (int i = 0; i < gp->n_logit_bias; i++) {
        const tandem_logit_bias *b = &gp->logit_bias[i];
        if (b->token < 0 || b->token >= e->n_vocab)
            return tdm_seterr(err, bad, "logit_bias: token %d is out of range [0, %d)", (int)b->token, (int)e->n_vocab);
        if (!(b->bias >= -100 && b->bias <= 100))
            return tdm_seterr(err, bad, "logit_bias: the bias %g of token %d is out of range [-100, 100]", b->bias,
                              (int)b->token);
        for (int j = 0; j < i; j++)
            if (gp->logit_bias[j].token == b->token)
                return tdm_seterr(err, bad, "logit_bias: token %d is given twice", (int)b->token);
    }
    const bool any = gp->presence_penalty != 0 || gp->frequency_penalty != 0 || gp->repetition_penalty != 1 ||
                     gp->n_logit_bias > 0 || gp->min_tokens > 0;
    if (!any) return TANDEM_OK;
    tdm_penalty *p = calloc(1, sizeof *p);
    if (!p) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    s->pen = p;
    p->presence = gp->presence_penalty;
    p->frequency = gp->frequency_penalty;
    p->repetition = gp->repetition_penalty;
    p->min_tokens = gp->min_tokens;
    p->n_vocab = e->n_vocab;
    const size_t V = (size_t)e->n_vocab;
    p->count = tdm_calloc(V, sizeof(int32_t));
    p->extra = tdm_calloc(V, sizeof(int32_t));
    p->flag = tdm_calloc(V, 1);
    p->seen = tdm_calloc(V, sizeof(int32_t));
    if (!p->count || !p->extra || !p->flag || !p->seen) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    if (gp->n_logit_bias > 0) {
        p->bias = tdm_calloc(V, sizeof(float));
        p->biased = tdm_calloc((size_t)gp->n_logit_bias, sizeof(int32_t));
        if (!p->bias || !p->biased) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
        for (int i = 0; i < gp->n_logit_bias; i++) {
            const int32_t t = gp->logit_bias[i].token;
            p->bias[t] = gp->logit_bias[i].bias;
            p->flag[t] |= PEN_BIAS;
            p->biased[p->n_bias++] = t;
        }
    }
    if (p->min_tokens > 0) {
        p->n_eog = tdm_tok_eog_ids(e->target->tok, &p->eog);
        for (int32_t i = 0; i < p->n_eog; i++)
            if (p->eog[i] >= 0 && p->eog[i] < e->n_vocab) p->flag[p->eog[i]] |= PEN_EOG;
    }
    /* the text so far: the prompt (the repetition penalty's window), and any generated
     * tokens the sequence already holds */
    for (int32_t i = 0; i < s->n_tokens; i++) {
        const int32_t t = s->tokens[i];
        if (i >= s->n_prompt) p->count[t]++;
        else p->flag[t] |= PEN_PROMPT;
        if (i >= s->n_prompt || p->repetition != 1) seen_add(p, t);
    }
    return TANDEM_OK;
}

void tdm_penalty_free(tdm_seq *s) {
    tdm_penalty *p = s->pen;
    if (!p) return;
    free(p->count);
    free(p->extra);
    free(p->flag);
    free(p->bias);
    free(p->biased);
    free(p->seen);
    free(p->edits);
    free(p);
    s->pen = NULL;
}

void tdm_penalty_commit(tdm_seq *s, int32_t token) {
    tdm_penalty *p = s->pen;
    if (token < 0 || token >= p->n_vocab) return;
    p->count[token]++;
    seen_add(p, token);
}

/* The edit of token t with c occurrences in the generated text (and the chain's
 * prefix); false when it leaves the logit as it is. */
static bool edit_of(const tdm_penalty *p, int32_t t, int32_t c, bool suppress, tdm_logit_edit *ed) {
    const uint8_t f = p->flag[t];
    if (suppress && (f & PEN_EOG)) {
        *ed = (tdm_logit_edit){t, 0.0f, 0.0f, 0.0f, TDM_LOGIT_NONE};
        return true;
    }
    *ed = (tdm_logit_edit){t, (f & PEN_BIAS) ? p->bias[t] : 0.0f, 1.0f, 1.0f, 0.0f};
    bool any = ed->bias != 0;
    if (p->repetition != 1 && (c > 0 || (f & PEN_PROMPT))) {
        ed->pos = 1.0f / p->repetition;
        ed->neg = p->repetition;
        any = true;
    }
    if (c > 0 && (p->frequency != 0 || p->presence != 0)) {
        ed->add = -(p->frequency * (float)c + p->presence);
        any = true;
    }
    return any;
}

static tandem_status room(tdm_penalty *p, int32_t need, tdm_err *err) {
    if (need <= p->cap_edits) return TANDEM_OK;
    int32_t nc = TDM_MAX(need, p->cap_edits * 2);
    tdm_logit_edit *ne = realloc(p->edits, (size_t)nc * sizeof *ne);
    if (!ne) return tdm_seterr(err, TANDEM_ERR_NOMEM, "out of memory");
    p->edits = ne, p->cap_edits = nc;
    return TANDEM_OK;
}

/* Row edits into ed (room for n_seen + d + n_bias + n_eog entries) for the row after
 * the committed text and draft[0..d) (p->extra holding their counts); returns how
 * many.  Every token edited at most once: the seen ones, the chain's new ones, the
 * biased ones, the suppressed ones. */
static int32_t build_row(const tdm_penalty *p, const int32_t *draft, int32_t d, bool suppress, tdm_logit_edit *ed) {
    int32_t n = 0;
    for (int32_t i = 0; i < p->n_seen; i++) {
        const int32_t t = p->seen[i];
        n += edit_of(p, t, p->count[t] + p->extra[t], suppress, &ed[n]);
    }
    for (int32_t x = 0; x < d; x++) {
        const int32_t t = draft[x];
        if (t < 0 || t >= p->n_vocab || (p->flag[t] & PEN_SEEN)) continue;
        bool dup = false;
        for (int32_t y = 0; y < x && !dup; y++) dup = draft[y] == t;
        if (!dup) n += edit_of(p, t, p->extra[t], suppress, &ed[n]);
    }
    for (int32_t i = 0; i < p->n_bias; i++) {
        const int32_t t = p->biased[i];
        if (!(p->flag[t] & PEN_SEEN) && p->extra[t] == 0) n += edit_of(p, t, 0, suppress, &ed[n]);
    }
    if (suppress)
        for (int32_t i = 0; i < p->n_eog; i++) {
            const int32_t t = p->eog[i];
            if (t < 0 || t >= p->n_vocab || (p->flag[t] & (PEN_SEEN | PEN_BIAS)) || p->extra[t] > 0) continue;
            bool dup = false;
            for (int32_t y = 0; y < i && !dup; y++) dup = p->eog[y] == t;
            if (!dup) n += edit_of(p, t, 0, suppress, &ed[n]);
        }
    return n;
}

static int32_t row_room(const tdm_penalty *p, int32_t d) { return p->n_seen + d + p->n_bias + p->n_eog; }

tandem_status tdm_penalty_tree_rows(tdm_seq *s, const int32_t *token, const int32_t *parent, int32_t n, tdm_err *err) {
    tdm_penalty *p = s->pen;
    if (n < 0 || n + 1 > TDM_PEN_ROWS)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "edits of a tree of %d nodes, at most %d", (int)n, TDM_PEN_ROWS - 1);
    const int32_t n_gen = s->n_tokens - s->n_prompt;
    tandem_status st = TANDEM_OK;
    int32_t e = 0;
    for (int32_t r = 0; r <= n && !st; r++) {
        /* row r's path: node r - 1 and its ancestors, root first (row 0: none) */
        int32_t path[TDM_PEN_ROWS], d = 0;
        for (int32_t v = r - 1; v >= 0 && d < TDM_PEN_ROWS; v = parent[v]) path[d++] = token[v];
        for (int32_t a = 0, b = d - 1; a < b; a++, b--) {
            const int32_t tmp = path[a];
            path[a] = path[b], path[b] = tmp;
        }
        p->off[r] = e;
        for (int32_t x = 0; x < d; x++)
            if (path[x] >= 0 && path[x] < p->n_vocab) p->extra[path[x]]++;
        if (!(st = room(p, e + row_room(p, d), err))) e += build_row(p, path, d, (int64_t)n_gen + d < p->min_tokens, p->edits + e);
        for (int32_t x = 0; x < d; x++)
            if (path[x] >= 0 && path[x] < p->n_vocab) p->extra[path[x]] = 0;
    }
    p->off[n + 1] = e;
    return st;
}

tandem_status tdm_penalty_rows(tdm_seq *s, const int32_t *draft, int32_t k, tdm_err *err) {
    if (k < 0 || k + 1 > TDM_PEN_ROWS)
        return tdm_seterr(err, TANDEM_ERR_INTERNAL, "edits of a chain of %d tokens, at most %d", (int)k, TDM_PEN_ROWS - 1);
    int32_t parent[TDM_PEN_ROWS]; /* (a chain: the tree whose node d is draft[d], below node d - 1) */
    for (int32_t d = 0; d < k; d++) parent[d] = d - 1;
    return tdm_penalty_tree_rows(s, draft, parent, k, err);
}

tandem_status tdm_penalty_draft_row(tdm_seq *s, const int32_t *draft, int32_t d, float *l, tdm_err *err) {
    tdm_penalty *p = s->pen;
    tandem_status st = room(p, row_room(p, d), err);
    if (st) return st;
    for (int32_t x = 0; x < d; x++)
        if (draft[x] >= 0 && draft[x] < p->n_vocab) p->extra[draft[x]]++;
    const int32_t off[2] = {0, build_row(p, draft, d, (int64_t)(s->n_tokens - s->n_prompt) + d < p->min_tokens, p->edits)};
    for (int32_t x = 0; x < d; x++)
        if (draft[x] >= 0 && draft[x] < p->n_vocab) p->extra[draft[x]] = 0;
    (void)tdm_logits_edit_rows(l, 1, p->n_vocab, p->edits, off);
    return TANDEM_OK;
}
