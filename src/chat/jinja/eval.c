/* eval.c - renders a parsed template: scopes, statements, expressions, macros, and
 * the entry points of jinja.h.
 *
 * Scopes follow jinja2: the template's variables are the outermost frame; every
 * iteration of a for loop and every macro call runs in a frame of its own, so a
 * {% set %} inside a loop is not seen after it (namespace() is the way out, as in
 * jinja2); if blocks share their enclosing frame.  A macro sees its parameters and
 * the template's top-level variables. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jj_internal.h"

#define EVAL_DEPTH_MAX 1000 /* nested evaluations (deep expressions, macro recursion) */

struct tdm_jinja {
    char *src;     /* normalized source */
    jj_arena arena;
    jj_node *root;
};

struct jj_caller {
    const jj_node *block; /* the S_CALL_BLOCK */
    jj_frame *scope;      /* where the call block is: its body sees that scope */
};

struct jj_frame {
    jj_frame *parent;
    size_t n, cap;
    const char **names;
    jj_val *vals;
};

bool jj_fail(jj_ctx *c, const jj_node *n, tandem_status st, const char *fmt, ...) {
    if (c->err && c->err->status != TANDEM_OK) return false; /* keep the first error */
    if (!n) n = c->at;
    char raw[TDM_ERR_MSG_LEN], m[TDM_ERR_MSG_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    tdm_jinja_escape(m, sizeof m, raw); /* it may quote the template's text or data */
    if (n)
        tdm_seterr(c->err, st, "line %d, column %d: %s", n->line, n->col, m);
    else
        tdm_seterr(c->err, st, "%s", m);
    return false;
}

/* ------------------------------------------------------------------ scopes */

static jj_frame *frame_new(jj_ctx *c, jj_frame *parent) {
    jj_frame *f = jj_alloc(c, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static bool frame_set(jj_ctx *c, jj_frame *f, const char *name, jj_val v) {
    size_t i = 0;
    while (i < f->n && strcmp(f->names[i], name) != 0) i++;
    if (!jj_work(c, i, JJ_ITEM)) return false;
    if (i < f->n) {
        f->vals[i] = v;
        return true;
    }
    if (f->n == f->cap) {
        size_t nc = f->cap ? f->cap * 2 : 4;
        const char **nn = jj_alloc(c, nc * sizeof *nn);
        jj_val *nv = nn ? jj_alloc(c, nc * sizeof *nv) : NULL;
        if (!nv) return false;
        if (f->n) {
            memcpy(nn, f->names, f->n * sizeof *nn);
            memcpy(nv, f->vals, f->n * sizeof *nv);
        }
        f->names = nn;
        f->vals = nv;
        f->cap = nc;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
    return true;
}

jj_val jj_lookup(jj_ctx *c, const char *name) {
    for (jj_frame *f = c->cur; f; f = f->parent) {
        size_t i = f->n;
        while (i-- > 0 && strcmp(f->names[i], name) != 0) {}
        if (!jj_work(c, i == SIZE_MAX ? f->n : f->n - i, JJ_ITEM)) return jv_undef(name); /* the render fails */
        if (i != SIZE_MAX) return f->vals[i];
    }
    int fn = jj_global_func(name);
    if (fn >= 0) {
        jj_val v = {.t = JV_FUNC};
        v.u.fn = fn;
        return v;
    }
    return jv_undef(name);
}

static bool too_many_steps(jj_ctx *c) {
    return jj_fail(c, NULL, TANDEM_ERR_NOMEM, "the template ran more than %llu steps", (unsigned long long)c->lim.max_steps);
}

bool jj_work(jj_ctx *c, uint64_t n, unsigned cost) {
    const uint64_t units = n <= UINT64_MAX / JJ_STEP ? n * cost : UINT64_MAX; /* cost <= JJ_STEP */
    c->work += units % JJ_STEP;
    const uint64_t add = units / JJ_STEP + c->work / JJ_STEP;
    c->work %= JJ_STEP;
    c->steps = c->steps > UINT64_MAX - add ? UINT64_MAX : c->steps + add;
    return !jj_over(c) || too_many_steps(c);
}

static bool step(jj_ctx *c, const jj_node *n) {
    c->at = n;
    return jj_work(c, 1, JJ_STEP);
}

/* ----------------------------------------------------------- statements */

static bool exec_body(jj_ctx *c, jj_node *const *list, size_t n);
static bool exec_call_block(jj_ctx *c, const jj_node *n);
static bool eval_args(jj_ctx *c, const jj_node *n, jj_args *a);

/* Renders a body into a string of its own. */
static bool capture(jj_ctx *c, jj_node *const *list, size_t n, jj_val *out) {
    jj_buf *saved = c->out, b = {0};
    c->out = &b;
    bool ok = exec_body(c, list, n);
    c->out = saved;
    const jj_str *s = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
    free(b.p);
    *out = jv_str(s);
    return s != NULL;
}

/* Binds a for / set target (one name, or several unpacking a sequence). */
static bool bind(jj_ctx *c, const jj_node *n, jj_frame *f, jj_val v) {
    if (n->n_names == 1) return frame_set(c, f, n->names[0], v);
    if (v.t != JV_LIST)
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "cannot unpack a %s into %zu names", jv_type_name(v), n->n_names);
    if (v.u.l->n != n->n_names)
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "cannot unpack %zu values into %zu names", v.u.l->n, n->n_names);
    for (size_t i = 0; i < n->n_names; i++)
        if (!frame_set(c, f, n->names[i], v.u.l->v[i])) return false;
    return true;
}

static bool exec_for(jj_ctx *c, const jj_node *n) {
    jj_val it;
    const jj_list *items;
    if (!jj_eval(c, n->a, &it) || !jj_iter_list(c, n->a, it, &items)) return false;
    if (n->b) { /* {% for x in xs if cond %}: the loop sees only the items that pass */
        jj_list *kept = jj_list_new(c, 0);
        jj_frame *saved = c->cur;
        if (!kept) return false;
        for (size_t i = 0; i < items->n; i++) {
            jj_frame *f = frame_new(c, saved);
            jj_val cond;
            c->cur = f;
            bool ok = f && bind(c, n, f, items->v[i]) && jj_eval(c, n->b, &cond);
            c->cur = saved;
            if (!ok || !step(c, n)) return false;
            if (jj_truthy(cond) && !jj_list_push(c, kept, items->v[i])) return false;
        }
        items = kept;
    }
    jj_frame *saved = c->cur;
    if (items->n == 0) {
        jj_frame *f = frame_new(c, saved);
        if (!f) return false;
        c->cur = f;
        bool ok = exec_body(c, n->list2, n->n2);
        c->cur = saved;
        return ok;
    }
    jj_loop *L = jj_alloc(c, sizeof *L);
    if (!L) return false;
    L->length = (int64_t)items->n;
    L->items = items;
    for (size_t i = 0; i < items->n; i++) {
        if (!step(c, n)) return false;
        L->index0 = (int64_t)i;
        jj_frame *f = frame_new(c, saved);
        jj_val lv = {.t = JV_LOOP};
        lv.u.loop = L;
        if (!f || !bind(c, n, f, items->v[i]) || !frame_set(c, f, "loop", lv)) return false;
        c->cur = f;
        bool ok = exec_body(c, n->list, n->n);
        c->cur = saved;
        if (!ok) return false;
        if (c->jump) {
            int j = c->jump;
            c->jump = 0;
            if (j == 1) break;
        }
    }
    return true;
}

static bool exec_stmt(jj_ctx *c, const jj_node *n) {
    if (!step(c, n)) return false;
    jj_val v;
    switch ((jj_kind)n->kind) {
    case S_DATA: return jj_buf_add(c, c->out, n->str, n->len);
    case S_OUT: return jj_eval(c, n->a, &v) && jj_buf_str(c, c->out, v);
    case S_BODY: return exec_body(c, n->list, n->n);
    case S_IF:
        if (!jj_eval(c, n->a, &v)) return false;
        return jj_truthy(v) ? exec_body(c, n->list, n->n) : exec_body(c, n->list2, n->n2);
    case S_FOR: return exec_for(c, n);
    case S_SET: return jj_eval(c, n->a, &v) && bind(c, n, c->cur, v);
    case S_SET_BLOCK: return capture(c, n->list, n->n, &v) && frame_set(c, c->cur, n->names[0], v);
    case S_SET_ATTR: {
        jj_val ns = jj_lookup(c, n->str);
        if (ns.t != JV_NS)
            return jj_fail(c, n, TANDEM_ERR_FORMAT, "cannot assign attribute on non-namespace object '%s'", n->str);
        const jj_str *k = jj_str_new(c, n->names[0], strlen(n->names[0]));
        return k && jj_eval(c, n->a, &v) && jj_dict_set(c, ns.u.d, jv_str(k), v);
    }
    case S_MACRO: {
        jj_val m = {.t = JV_MACRO};
        m.u.macro = n;
        return frame_set(c, c->cur, n->str, m);
    }
    case S_FILTER_BLOCK: {
        jj_val body;
        if (!capture(c, n->list, n->n, &body)) return false;
        const jj_str *saved = c->block_input;
        c->block_input = body.u.s;
        bool ok = jj_eval(c, n->a, &v);
        c->block_input = saved;
        return ok && jj_buf_str(c, c->out, v);
    }
    case S_CALL_BLOCK: return exec_call_block(c, n);
    case S_BREAK: c->jump = 1; return true;
    case S_CONTINUE: c->jump = 2; return true;
    default: return jj_fail(c, n, TANDEM_ERR_INTERNAL, "bad statement node %d", n->kind);
    }
}

static bool exec_body(jj_ctx *c, jj_node *const *list, size_t n) {
    if (++c->depth > EVAL_DEPTH_MAX) return jj_fail(c, NULL, TANDEM_ERR_FORMAT, "the template nests too deeply");
    bool ok = true;
    for (size_t i = 0; i < n && ok && !c->jump; i++) ok = exec_stmt(c, list[i]);
    c->depth--;
    return ok;
}

bool jj_call_macro(jj_ctx *c, const jj_node *at, jj_val mv, const jj_val *args, size_t n_args,
                   const char **kw, const jj_val *kwv, size_t n_kw, const jj_caller *caller, jj_val *out) {
    /* a macro: its parameters over the template's variables; a caller: the call
     * block's parameters over the scope of the call block */
    const jj_node *m = mv.t == JV_MACRO ? mv.u.macro : mv.u.caller->block;
    const char *name = mv.t == JV_MACRO ? m->str : "caller";
    if (c->calls >= c->lim.max_calls)
        return jj_fail(c, at, TANDEM_ERR_FORMAT, "macro calls nested deeper than %d", c->lim.max_calls);
    if (n_args > m->n_names)
        return jj_fail(c, at, TANDEM_ERR_FORMAT, "macro '%s' takes not more than %zu argument(s)", name, m->n_names);
    if (!jj_work(c, (uint64_t)m->n_names * (n_kw + 1), JJ_ITEM)) return false; /* matching the keywords */
    jj_frame *f = frame_new(c, mv.t == JV_MACRO ? c->globals : mv.u.caller->scope);
    if (!f) return false;
    jj_frame *saved = c->cur;
    for (size_t k = 0; k < n_kw; k++) {
        size_t p = 0;
        while (p < m->n_names && strcmp(m->names[p], kw[k]) != 0) p++;
        if (p == m->n_names)
            return jj_fail(c, at, TANDEM_ERR_FORMAT, "macro '%s' has no parameter '%s'", name, kw[k]);
        if (p < n_args) return jj_fail(c, at, TANDEM_ERR_FORMAT, "macro '%s' got parameter '%s' twice", name, kw[k]);
    }
    c->cur = f;
    bool ok = true;
    for (size_t p = 0; p < m->n_names && ok; p++) {
        jj_val v = jv_undef(m->names[p]);
        bool given = p < n_args;
        if (given) v = args[p];
        for (size_t k = 0; k < n_kw && !given; k++)
            if (strcmp(m->names[p], kw[k]) == 0) {
                v = kwv[k];
                given = true;
            }
        if (!given && m->kind == S_MACRO && m->list2[p]) ok = jj_eval(c, m->list2[p], &v);
        ok = ok && frame_set(c, f, m->names[p], v);
    }
    if (ok && caller) {
        jj_val cv = {.t = JV_CALLER};
        cv.u.caller = caller;
        ok = frame_set(c, f, "caller", cv);
    }
    c->calls++;
    int jump = c->jump;
    c->jump = 0;
    ok = ok && capture(c, m->list, m->n, out);
    c->jump = jump;
    c->calls--;
    c->cur = saved;
    return ok;
}

/* {% call m(args) %}body{% endcall %}: m's output, caller() in it rendering body. */
static bool exec_call_block(jj_ctx *c, const jj_node *n) {
    const jj_node *call = n->a;
    jj_val fn, out;
    jj_args a;
    if (!jj_eval(c, call->a, &fn)) return false;
    if (fn.t != JV_MACRO) return jj_fail(c, n, TANDEM_ERR_FORMAT, "{%% call %%} needs a macro, not %s", jv_type_name(fn));
    jj_caller *cl = jj_alloc(c, sizeof *cl);
    if (!cl || !eval_args(c, call, &a)) return false;
    cl->block = n;
    cl->scope = c->cur;
    return jj_call_macro(c, n, fn, a.pos, a.n_pos, a.kw, a.kwv, a.n_kw, cl, &out) && jj_buf_str(c, c->out, out);
}

/* ------------------------------------------------------------ expressions */

static bool eval_args(jj_ctx *c, const jj_node *n, jj_args *a) {
    memset(a, 0, sizeof *a);
    jj_val *pos = n->n ? jj_alloc(c, n->n * sizeof *pos) : NULL, *kwv = n->n2 ? jj_alloc(c, n->n2 * sizeof *kwv) : NULL;
    if ((n->n && !pos) || (n->n2 && !kwv)) return false;
    for (size_t i = 0; i < n->n; i++)
        if (!jj_eval(c, n->list[i], &pos[i])) return false;
    for (size_t i = 0; i < n->n2; i++)
        if (!jj_eval(c, n->list2[i], &kwv[i])) return false;
    a->pos = pos;
    a->n_pos = n->n;
    a->kw = n->names;
    a->kwv = kwv;
    a->n_kw = n->n2;
    return true;
}

static bool undefined_error(jj_ctx *c, const jj_node *n, jj_val v) {
    if (v.u.name) return jj_fail(c, n, TANDEM_ERR_FORMAT, "'%s' is undefined", v.u.name);
    return jj_fail(c, n, TANDEM_ERR_FORMAT, "an undefined value was used");
}

/* obj.name (no call). */
bool jj_get_attr(jj_ctx *c, const jj_node *n, jj_val obj, const char *name, jj_val *out) {
    *out = jv_undef(name);
    switch (obj.t) {
    case JV_UNDEF: return undefined_error(c, n, obj);
    case JV_DICT:
    case JV_NS: {
        const jj_val *v = jj_dict_get(c, obj.u.d, name, strlen(name));
        if (v) *out = *v;
        return true;
    }
    case JV_LOOP: {
        const jj_loop *L = obj.u.loop;
        int64_t i = L->index0, len = L->length;
        if (!strcmp(name, "index0")) *out = jv_int(i);
        else if (!strcmp(name, "index")) *out = jv_int(i + 1);
        else if (!strcmp(name, "revindex")) *out = jv_int(len - i);
        else if (!strcmp(name, "revindex0")) *out = jv_int(len - i - 1);
        else if (!strcmp(name, "first")) *out = jv_bool(i == 0);
        else if (!strcmp(name, "last")) *out = jv_bool(i == len - 1);
        else if (!strcmp(name, "length")) *out = jv_int(len);
        else if (!strcmp(name, "depth")) *out = jv_int(1);
        else if (!strcmp(name, "depth0")) *out = jv_int(0);
        else if (!strcmp(name, "previtem") && i > 0) *out = L->items->v[i - 1];
        else if (!strcmp(name, "nextitem") && i + 1 < len) *out = L->items->v[i + 1];
        return true;
    }
    default: return true;
    }
}

/* Python's index normalization: -1 is the last; false when out of range. */
static bool norm_index(int64_t i, size_t len, size_t *out) {
    if (i < 0) i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len) return false;
    *out = (size_t)i;
    return true;
}

static bool get_item(jj_ctx *c, const jj_node *n, jj_val obj, jj_val key, jj_val *out) {
    *out = jv_undef(NULL);
    size_t at;
    switch (obj.t) {
    case JV_UNDEF: return undefined_error(c, n, obj);
    case JV_DICT:
    case JV_NS: {
        const jj_val *v = jj_dict_find(c, obj.u.d, key);
        if (v) *out = *v;
        else if (key.t == JV_STR) out->u.name = key.u.s->s;
        return true;
    }
    case JV_LIST:
        if ((key.t == JV_INT || key.t == JV_BOOL) && norm_index(key.t == JV_INT ? key.u.i : key.u.b, obj.u.l->n, &at))
            *out = obj.u.l->v[at];
        return true;
    case JV_STR: {
        const jj_str *s = obj.u.s;
        if (key.t != JV_INT) return true;
        size_t len = jj_utf8_len(c, s->s, s->len);
        if (!norm_index(key.u.i, len, &at)) return true;
        size_t b0 = jj_utf8_offset(c, s->s, s->len, at), b1 = b0 + jj_utf8_offset(c, s->s + b0, s->len - b0, 1);
        const jj_str *r = jj_str_new(c, s->s + b0, b1 - b0);
        *out = jv_str(r);
        return r != NULL;
    }
    case JV_LOOP:
        if (key.t == JV_STR) return jj_get_attr(c, n, obj, key.u.s->s, out);
        return true;
    default: return true;
    }
}

static bool slice_bound(jj_ctx *c, const jj_node *n, jj_val v, bool *given, int64_t *out) {
    *given = false;
    if (v.t == JV_NONE || v.t == JV_UNDEF) return true;
    if (v.t != JV_INT) return jj_fail(c, n, TANDEM_ERR_FORMAT, "slice indices must be integers or None");
    *given = true;
    *out = v.u.i;
    return true;
}

/* Python slice semantics (start, stop, step; negatives count from the end). */
static bool eval_slice(jj_ctx *c, const jj_node *n, jj_val *out) {
    jj_val obj, b[3] = {jv_none(), jv_none(), jv_none()};
    const jj_node *parts[3] = {n->b, n->c, n->d};
    if (!jj_eval(c, n->a, &obj)) return false;
    for (int i = 0; i < 3; i++)
        if (parts[i] && !jj_eval(c, parts[i], &b[i])) return false;
    bool g0, g1, g2;
    int64_t start = 0, stop = 0, stp = 1;
    if (!slice_bound(c, n, b[0], &g0, &start) || !slice_bound(c, n, b[1], &g1, &stop) ||
        !slice_bound(c, n, b[2], &g2, &stp))
        return false;
    if (stp == 0) return jj_fail(c, n, TANDEM_ERR_FORMAT, "slice step cannot be zero");
    if (obj.t == JV_UNDEF) return undefined_error(c, n, obj);
    if (obj.t != JV_LIST && obj.t != JV_STR)
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "'%s' object is not subscriptable", jv_type_name(obj));
    const bool is_str = obj.t == JV_STR;
    const int64_t len = is_str ? (int64_t)jj_utf8_len(c, obj.u.s->s, obj.u.s->len) : (int64_t)obj.u.l->n;
    if (!g0) start = stp > 0 ? 0 : len - 1;
    else if (start < 0) start = start + len < 0 ? (stp > 0 ? 0 : -1) : start + len;
    else if (start >= len) start = stp > 0 ? len : len - 1;
    if (!g1) stop = stp > 0 ? len : -1;
    else if (stop < 0) stop = stop + len < 0 ? (stp > 0 ? 0 : -1) : stop + len;
    else if (stop >= len) stop = stp > 0 ? len : len - 1;
    jj_list *l = jj_list_new(c, 0);
    if (!l) return false;
    size_t *offs = NULL; /* code point -> byte offset, for strings */
    if (is_str) {
        if (!(offs = jj_alloc(c, ((size_t)len + 1) * sizeof *offs))) return false;
        size_t bi = 0;
        for (int64_t i = 0; i <= len; i++) {
            offs[i] = bi;
            if (i < len) bi = jj_utf8_offset(c, obj.u.s->s + bi, obj.u.s->len - bi, 1) + bi;
        }
    }
    jj_buf sb = {0};
    bool ok = true;
    for (int64_t i = start; ok && (stp > 0 ? i < stop : i > stop); i += stp) {
        if (is_str)
            ok = jj_buf_add(c, &sb, obj.u.s->s + offs[i], offs[i + 1] - offs[i]);
        else
            ok = jj_list_push(c, l, obj.u.l->v[i]);
        if (stp > 0 ? i > INT64_MAX - stp : i < INT64_MIN - stp) break;
    }
    if (ok && is_str) {
        const jj_str *s = jj_str_new(c, sb.p ? sb.p : "", sb.n);
        ok = s != NULL;
        *out = jv_str(s);
    } else if (ok) {
        l->tuple = obj.u.l->tuple;
        *out = jv_list(l);
    }
    free(sb.p);
    return ok;
}

static bool eval_call(jj_ctx *c, const jj_node *n, jj_val *out) {
    jj_args a;
    if (n->a->kind == E_ATTR) {
        jj_val obj;
        if (!jj_eval(c, n->a->a, &obj)) return false;
        if (obj.t == JV_UNDEF) return undefined_error(c, n->a, obj);
        if (!eval_args(c, n, &a)) return false;
        bool handled = false;
        if (!jj_method(c, n, obj, n->a->str, &a, out, &handled)) return false;
        if (handled) return true;
        jj_val fn;
        if (!jj_get_attr(c, n->a, obj, n->a->str, &fn)) return false;
        if (fn.t == JV_UNDEF)
            return jj_fail(c, n, TANDEM_ERR_UNSUPPORTED, "'%s' object has no method '%s'", jv_type_name(obj), n->a->str);
        return jj_call_func(c, n, fn, &a, out);
    }
    jj_val fn;
    if (!jj_eval(c, n->a, &fn)) return false;
    if (fn.t == JV_UNDEF) return undefined_error(c, n->a, fn);
    return eval_args(c, n, &a) && jj_call_func(c, n, fn, &a, out);
}

static bool eval_collection(jj_ctx *c, const jj_node *n, jj_val *out) {
    if (n->kind == E_DICT) {
        jj_dict *d = jj_dict_new(c, n->n);
        if (!d) return false;
        for (size_t i = 0; i < n->n; i++) {
            jj_val k, v;
            if (!jj_eval(c, n->list[i], &k) || !jj_eval(c, n->list2[i], &v) || !jj_dict_set(c, d, k, v)) return false;
        }
        *out = jv_dict(d);
        return true;
    }
    jj_list *l = jj_list_new(c, n->n);
    if (!l) return false;
    for (size_t i = 0; i < n->n; i++)
        if (!jj_eval(c, n->list[i], &l->v[l->n++])) return false;
    l->tuple = n->kind == E_TUPLE;
    *out = jv_list(l);
    return true;
}

static bool eval_node(jj_ctx *c, const jj_node *n, jj_val *out) {
    jj_val a, b;
    jj_args args;
    switch ((jj_kind)n->kind) {
    case E_LIT: *out = n->lit; return true;
    case E_NAME: *out = jj_lookup(c, n->str); return true;
    case E_ATTR: return jj_eval(c, n->a, &a) && jj_get_attr(c, n, a, n->str, out);
    case E_ITEM: return jj_eval(c, n->a, &a) && jj_eval(c, n->b, &b) && get_item(c, n, a, b, out);
    case E_SLICE: return eval_slice(c, n, out);
    case E_CALL: return eval_call(c, n, out);
    case E_FILTER:
        return jj_eval(c, n->a, &a) && eval_args(c, n, &args) && jj_filter(c, n, n->str, a, &args, out);
    case E_TEST: {
        bool r;
        if (!jj_eval(c, n->a, &a) || !eval_args(c, n, &args) || !jj_test(c, n, n->str, a, &args, &r)) return false;
        *out = jv_bool(n->op == OP_NOT ? !r : r);
        return true;
    }
    case E_BLOCK_INPUT: *out = jv_str(c->block_input); return c->block_input != NULL;
    case E_UNARY:
        if (!jj_eval(c, n->a, &a)) return false;
        if (n->op == OP_NOT) return *out = jv_bool(!jj_truthy(a)), true;
        if (a.t == JV_INT || a.t == JV_BOOL) {
            int64_t i = a.t == JV_INT ? a.u.i : a.u.b;
            if (n->op == OP_NEG && i == INT64_MIN) return jj_fail(c, n, TANDEM_ERR_FORMAT, "integer overflow");
            return *out = jv_int(n->op == OP_NEG ? -i : i), true;
        }
        if (a.t == JV_FLOAT) return *out = jv_float(n->op == OP_NEG ? -a.u.f : a.u.f), true;
        if (a.t == JV_UNDEF) return undefined_error(c, n, a);
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "bad operand type for unary %c: '%s'", n->op == OP_NEG ? '-' : '+',
                       jv_type_name(a));
    case E_BIN:
        if (!jj_eval(c, n->a, &a)) return false;
        if (n->op == OP_AND || n->op == OP_OR) {
            if (jj_truthy(a) == (n->op == OP_OR)) return *out = a, true;
            return jj_eval(c, n->b, out);
        }
        return jj_eval(c, n->b, &b) && jj_eval_binary(c, n, a, b, out);
    case E_COND:
        if (!jj_eval(c, n->b, &a)) return false;
        if (jj_truthy(a)) return jj_eval(c, n->a, out);
        if (n->c) return jj_eval(c, n->c, out);
        *out = jv_undef(NULL);
        return true;
    case E_LIST:
    case E_TUPLE:
    case E_DICT: return eval_collection(c, n, out);
    default: return jj_fail(c, n, TANDEM_ERR_INTERNAL, "bad expression node %d", n->kind);
    }
}

bool jj_eval(jj_ctx *c, const jj_node *n, jj_val *out) {
    if (!step(c, n)) return false;
    if (++c->depth > EVAL_DEPTH_MAX) return jj_fail(c, n, TANDEM_ERR_FORMAT, "the template nests too deeply");
    bool ok = eval_node(c, n, out);
    c->depth--;
    return ok;
}

/* -------------------------------------------------------------- entry */

tdm_jinja_limits tdm_jinja_default_limits(void) {
    tdm_jinja_limits l = {.max_output = (size_t)16 << 20, .max_memory = (size_t)256 << 20,
                          .max_steps = 50000000, .max_calls = 64, .now = -1};
    return l;
}

tandem_status tdm_jinja_parse(const char *src, size_t len, tdm_jinja **out, tdm_err *err) {
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "template: NULL out");
    *out = NULL;
    if (!src && len) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "template: NULL source");
    if (len > TDM_JINJA_MAX_SOURCE)
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "the template has %zu bytes, more than the %zu a template may have", len,
                          TDM_JINJA_MAX_SOURCE);
    tdm_jinja *t = calloc(1, sizeof *t);
    char *s = malloc(len + 1);
    if (!t || !s) {
        free(t);
        free(s);
        return tdm_seterr(err, TANDEM_ERR_NOMEM, "template: out of memory");
    }
    /* newlines as jinja2 normalizes them; one trailing newline dropped */
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            s[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            s[k++] = src[i];
        }
    }
    if (k && s[k - 1] == '\n') k--;
    s[k] = 0;
    t->src = s;
    /* the tokens and their decoded strings are freed once the tree is built; with
     * the tree they share the parse's memory bound */
    jj_arena scratch = {.limit = TDM_JINJA_MAX_PARSE_MEMORY};
    jj_token *toks;
    size_t n_toks;
    tdm_err e = {0};
    bool ok = jj_lex(s, k, &scratch, &toks, &n_toks, &e);
    if (ok) {
        t->arena.limit = TDM_MAX(scratch.limit - scratch.used, 1); /* 0 would be none */
        ok = jj_parse(toks, n_toks, &t->arena, &t->root, &e);
        free(toks);
    }
    jj_arena_free(&scratch);
    if (!ok) {
        if (e.status == TANDEM_OK) e.status = TANDEM_ERR_FORMAT;
        tdm_jinja_free(t);
        if (err) *err = e;
        return e.status;
    }
    *out = t;
    return TANDEM_OK;
}

void tdm_jinja_free(tdm_jinja *t) {
    if (!t) return;
    jj_arena_free(&t->arena);
    free(t->src);
    free(t);
}

tandem_status tdm_jinja_render(const tdm_jinja *t, const tdm_jinja_var *vars, size_t n_vars,
                               const tdm_jinja_limits *lim, char **out, size_t *out_len, tdm_err *err) {
    if (!out) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "template: NULL out");
    *out = NULL;
    if (out_len) *out_len = 0;
    if (!t) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "template: NULL template");
    if (!vars && n_vars) return tdm_seterr(err, TANDEM_ERR_INVALID_ARG, "template: NULL variables");
    tdm_err e = {0};
    jj_ctx c = {.err = &e, .lim = lim ? *lim : tdm_jinja_default_limits()};
    c.arena.limit = c.lim.max_memory;
    jj_buf b = {0};
    c.out = &b;
    bool ok = (c.globals = c.cur = frame_new(&c, NULL)) != NULL;
    for (size_t i = 0; ok && i < n_vars; i++) {
        jj_val v = jv_none();
        if (vars[i].str) {
            const jj_str *s = jj_str_new(&c, vars[i].str, strlen(vars[i].str));
            ok = s != NULL;
            v = jv_str(s);
        } else if (vars[i].json) {
            ok = jj_from_json(&c, vars[i].json, &v);
        }
        ok = ok && vars[i].name && frame_set(&c, c.globals, vars[i].name, v);
    }
    ok = ok && exec_stmt(&c, t->root);
    ok = ok && e.status == TANDEM_OK; /* a bound passed where it could not be reported (jj_equal...) */
    jj_arena_free(&c.arena);
    if (!ok) {
        free(b.p);
        if (e.status == TANDEM_OK) e.status = TANDEM_ERR_INTERNAL;
        if (err) *err = e;
        return e.status;
    }
    if (!b.p && !(b.p = calloc(1, 1))) return tdm_seterr(err, TANDEM_ERR_NOMEM, "template: out of memory");
    *out = b.p;
    if (out_len) *out_len = b.n;
    return TANDEM_OK;
}
