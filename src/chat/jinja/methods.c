/* methods.c - the Python methods templates call, and the global functions.
 *
 * str: strip lstrip rstrip startswith endswith split rsplit splitlines upper lower
 *      title capitalize replace find rfind count (with start, end) join isdigit isspace;
 *      more arguments than Python's, or keywords it does not take, are errors
 * dict: items keys values get      loop: cycle
 * globals: range (at most 100000 items, as jinja2's sandbox allows), namespace, dict,
 *      raise_exception (transformers: the template's own error), strftime_now. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jj_internal.h"

static bool ret_str(const jj_str *s, jj_val *out) {
    *out = jv_str(s);
    return s != NULL;
}

/* startswith / endswith: a string or a tuple of strings. */
static bool affix(jj_ctx *c, const jj_node *n, const jj_str *s, const jj_args *a, bool end, jj_val *out) {
    jj_val p;
    if (!jj_arg(a, 0, NULL, &p)) return jj_fail(c, n, TANDEM_ERR_FORMAT, "%s needs an argument", end ? "endswith" : "startswith");
    const jj_val *opts = &p;
    size_t n_opts = 1;
    if (p.t == JV_LIST) {
        opts = p.u.l->v;
        n_opts = p.u.l->n;
    }
    *out = jv_bool(false);
    for (size_t i = 0; i < n_opts; i++) {
        if (opts[i].t != JV_STR)
            return jj_fail(c, n, TANDEM_ERR_FORMAT, "%s first arg must be str or a tuple of str, not %s",
                           end ? "endswith" : "startswith", jv_type_name(opts[i]));
        const jj_str *x = opts[i].u.s;
        if (!jj_work(c, 1, JJ_ITEM) || !jj_work(c, TDM_MIN(x->len, s->len), JJ_SCAN)) return false;
        if (x->len <= s->len && memcmp(end ? s->s + s->len - x->len : s->s, x->s, x->len) == 0) *out = jv_bool(true);
    }
    return true;
}

enum { FIND, RFIND, COUNT };

/* find / rfind / count of sub in s[start:end]: the bounds and the positions in code
 * points, the bounds adjusted as Python's str methods do (negatives from the end, end
 * clamped to the length, an empty range when start passes end).  Linear: one search
 * (forwards, or backwards for rfind), code points counted once. */
static bool search(jj_ctx *c, const jj_node *n, const jj_str *s, const char *m, const jj_args *a, int mode,
                   jj_val *out) {
    const jj_str *sub;
    int64_t start, end;
    if (!jj_arg_str(c, n, a, 0, "sub", &sub) || !jj_arg_int(c, n, a, 1, "start", 0, &start) ||
        !jj_arg_int(c, n, a, 2, "end", INT64_MAX, &end))
        return false;
    if (!sub) return jj_fail(c, n, TANDEM_ERR_FORMAT, "%s() needs a string to look for", m);
    size_t b0 = 0, b1 = s->len; /* the range in bytes */
    if (start != 0 || end != INT64_MAX || (sub->len == 0 && mode != FIND)) {
        const int64_t len = (int64_t)jj_utf8_len(c, s->s, s->len);
        if (end > len) end = len;
        else if (end < 0) end = end + len < 0 ? 0 : end + len;
        if (start < 0) start = start + len < 0 ? 0 : start + len;
        if (start > end) {
            *out = jv_int(mode == COUNT ? 0 : -1);
            return true;
        }
        b0 = jj_utf8_offset(c, s->s, s->len, (size_t)start);
        b1 = b0 + jj_utf8_offset(c, s->s + b0, s->len - b0, (size_t)(end - start));
    }
    if (sub->len == 0) { /* found at every position of the range */
        *out = jv_int(mode == FIND ? start : mode == RFIND ? end : end - start + 1);
        return !jj_over(c);
    }
    int64_t r = mode == COUNT ? 0 : -1;
    if (mode == COUNT) {
        for (size_t i = b0, at; (at = jj_s_find(c, s->s, b1, i, sub)) != SIZE_MAX; i = at + sub->len) r++;
    } else {
        size_t at = mode == FIND ? jj_s_find(c, s->s + b0, b1 - b0, 0, sub) : jj_s_rfind(c, s->s + b0, b1 - b0, sub);
        if (at != SIZE_MAX) r = start + (int64_t)jj_utf8_len(c, s->s + b0, at);
    }
    *out = jv_int(r);
    return !jj_over(c);
}

/* The most positional arguments of each str method, and the keywords it takes. */
static const struct {
    const char *name;
    size_t max_pos;
    const char *kw[3];
} str_sigs[] = {
    {"strip", 1, {"chars"}}, {"lstrip", 1, {"chars"}}, {"rstrip", 1, {"chars"}}, {"startswith", 1, {0}},
    {"endswith", 1, {0}}, {"split", 2, {"sep", "maxsplit"}}, {"rsplit", 2, {"sep", "maxsplit"}},
    {"splitlines", 1, {"keepends"}}, {"upper", 0, {0}}, {"lower", 0, {0}}, {"title", 0, {0}},
    {"capitalize", 0, {0}}, {"replace", 3, {"count"}}, {"find", 3, {0}}, {"rfind", 3, {0}}, {"count", 3, {0}},
    {"join", 1, {0}}, {"isdigit", 0, {0}}, {"isspace", 0, {0}},
};

/* false with an error when a's arguments do not fit str method m's signature. */
static bool check_sig(jj_ctx *c, const jj_node *n, const char *m, const jj_args *a, bool *known) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(str_sigs); i++) {
        if (strcmp(str_sigs[i].name, m) != 0) continue;
        *known = true;
        if (a->n_pos > str_sigs[i].max_pos)
            return jj_fail(c, n, TANDEM_ERR_UNSUPPORTED, "str.%s() takes at most %zu argument(s) (%zu given)", m,
                           str_sigs[i].max_pos, a->n_pos);
        for (size_t k = 0; k < a->n_kw; k++) {
            size_t j = 0;
            while (j < TDM_ARRAY_LEN(str_sigs[i].kw) && str_sigs[i].kw[j] && strcmp(str_sigs[i].kw[j], a->kw[k]) != 0) j++;
            if (j == TDM_ARRAY_LEN(str_sigs[i].kw) || !str_sigs[i].kw[j])
                return jj_fail(c, n, TANDEM_ERR_UNSUPPORTED, "str.%s() takes no keyword argument '%s'", m, a->kw[k]);
        }
        return true;
    }
    *known = false;
    return true;
}

static bool str_method(jj_ctx *c, const jj_node *n, const jj_str *s, const char *m, const jj_args *a, jj_val *out,
                       bool *handled) {
    if (!check_sig(c, n, m, a, handled)) return false;
    if (!*handled) return true;
    const jj_str *x, *y;
    int64_t k;
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip"))
        return jj_arg_str(c, n, a, 0, "chars", &x) && ret_str(jj_s_strip(c, s, x, m[0] != 'r', m[0] != 'l'), out);
    if (!strcmp(m, "startswith")) return affix(c, n, s, a, false, out);
    if (!strcmp(m, "endswith")) return affix(c, n, s, a, true, out);
    if (!strcmp(m, "split") || !strcmp(m, "rsplit")) {
        if (!jj_arg_str(c, n, a, 0, "sep", &x) || !jj_arg_int(c, n, a, 1, "maxsplit", -1, &k)) return false;
        jj_list *l = jj_s_split(c, s, x, k, m[0] == 'r');
        *out = jv_list(l);
        return l != NULL;
    }
    if (!strcmp(m, "splitlines")) {
        jj_val keep = jv_bool(false);
        jj_arg(a, 0, "keepends", &keep);
        jj_list *l = jj_s_splitlines(c, s, jj_truthy(keep));
        *out = jv_list(l);
        return l != NULL;
    }
    if (!strcmp(m, "upper")) return ret_str(jj_s_case(c, s, JJ_UPPER), out);
    if (!strcmp(m, "lower")) return ret_str(jj_s_case(c, s, JJ_LOWER), out);
    if (!strcmp(m, "title")) return ret_str(jj_s_case(c, s, JJ_PYTITLE), out);
    if (!strcmp(m, "capitalize")) return ret_str(jj_s_case(c, s, JJ_CAPITALIZE), out);
    if (!strcmp(m, "replace")) {
        if (!jj_arg_str(c, n, a, 0, "old", &x) || !jj_arg_str(c, n, a, 1, "new", &y) || !jj_arg_int(c, n, a, 2, "count", -1, &k))
            return false;
        if (!x || !y) return jj_fail(c, n, TANDEM_ERR_FORMAT, "replace needs two strings");
        return ret_str(jj_s_replace(c, s, x, y, k), out);
    }
    if (!strcmp(m, "find")) return search(c, n, s, m, a, FIND, out);
    if (!strcmp(m, "rfind")) return search(c, n, s, m, a, RFIND, out);
    if (!strcmp(m, "count")) return search(c, n, s, m, a, COUNT, out);
    if (!strcmp(m, "join")) {
        jj_val it;
        const jj_list *l;
        if (!jj_arg(a, 0, NULL, &it)) return jj_fail(c, n, TANDEM_ERR_FORMAT, "join needs an iterable");
        if (!jj_iter_list(c, n, it, &l)) return false;
        jj_buf b = {0};
        bool ok = true;
        for (size_t i = 0; i < l->n && ok; i++) {
            if (!(ok = jj_work(c, 1, JJ_ITEM))) break;
            if (l->v[i].t != JV_STR) {
                ok = jj_fail(c, n, TANDEM_ERR_FORMAT, "sequence item %zu: expected str instance, %s found", i,
                             jv_type_name(l->v[i]));
                break;
            }
            ok = (!i || jj_buf_add(c, &b, s->s, s->len)) && jj_buf_add(c, &b, l->v[i].u.s->s, l->v[i].u.s->len);
        }
        const jj_str *r = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
        free(b.p);
        return ret_str(r, out);
    }
    if (!strcmp(m, "isdigit") || !strcmp(m, "isspace")) {
        if (!jj_work(c, s->len, JJ_SCAN)) return false;
        bool r = s->len > 0;
        for (size_t i = 0; i < s->len && r; i++)
            r = m[2] == 'd' ? (s->s[i] >= '0' && s->s[i] <= '9') : jj_is_space((unsigned char)s->s[i]);
        *out = jv_bool(r);
        return true;
    }
    return jj_fail(c, n, TANDEM_ERR_INTERNAL, "str.%s has no implementation", m);
}

static bool dict_method(jj_ctx *c, const jj_node *n, jj_dict *d, const char *m, const jj_args *a, jj_val *out,
                        bool *handled) {
    *handled = true;
    if (!strcmp(m, "get")) {
        jj_val k, def = jv_none();
        if (!jj_arg(a, 0, NULL, &k)) return jj_fail(c, n, TANDEM_ERR_FORMAT, "get needs a key");
        jj_arg(a, 1, NULL, &def);
        const jj_val *v = jj_dict_find(c, d, k);
        *out = v ? *v : def;
        return true;
    }
    const bool items = !strcmp(m, "items"), keys = !strcmp(m, "keys"), values = !strcmp(m, "values");
    if (!items && !keys && !values) {
        *handled = false;
        return true;
    }
    jj_list *l = jj_list_new(c, d->n);
    if (!l) return false;
    for (size_t i = 0; i < d->n; i++) {
        if (!items) {
            l->v[l->n++] = keys ? d->k[i] : d->v[i];
            continue;
        }
        jj_list *kv = jj_list_new(c, 2);
        if (!kv) return false;
        kv->v[0] = d->k[i];
        kv->v[1] = d->v[i];
        kv->n = 2;
        kv->tuple = true;
        l->v[l->n++] = jv_list(kv);
    }
    *out = jv_list(l);
    return true;
}

bool jj_method(jj_ctx *c, const jj_node *n, jj_val obj, const char *name, const jj_args *a, jj_val *out,
               bool *handled) {
    *handled = false;
    switch (obj.t) {
    case JV_STR: return str_method(c, n, obj.u.s, name, a, out, handled);
    case JV_DICT: return dict_method(c, n, obj.u.d, name, a, out, handled);
    case JV_LOOP:
        if (strcmp(name, "cycle") != 0) return true;
        *handled = true;
        if (a->n_pos == 0) return jj_fail(c, n, TANDEM_ERR_FORMAT, "loop.cycle needs at least one value");
        *out = a->pos[obj.u.loop->index0 % (int64_t)a->n_pos];
        return true;
    case JV_LIST:
        if (!strcmp(name, "append") || !strcmp(name, "pop") || !strcmp(name, "insert") || !strcmp(name, "extend") ||
            !strcmp(name, "remove") || !strcmp(name, "clear"))
            return jj_fail(c, n, TANDEM_ERR_FORMAT, "lists are immutable in templates (%s)", name);
        return true;
    default: return true;
    }
}

/* ------------------------------------------------------------- globals */

static const char *const global_names[] = {
    [FN_RANGE] = "range", [FN_NAMESPACE] = "namespace", [FN_DICT] = "dict", [FN_RAISE] = "raise_exception",
    [FN_STRFTIME] = "strftime_now",
};

int jj_global_func(const char *name) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(global_names); i++)
        if (global_names[i] && strcmp(global_names[i], name) == 0) return (int)i;
    return -1;
}

#define RANGE_MAX 100000 /* jinja2's sandbox: MAX_RANGE */

static bool fn_range(jj_ctx *c, const jj_node *n, const jj_args *a, jj_val *out) {
    int64_t v[3] = {0, 0, 1};
    if (a->n_pos < 1 || a->n_pos > 3 || a->n_kw) return jj_fail(c, n, TANDEM_ERR_FORMAT, "range expects 1 to 3 integer arguments");
    for (size_t i = 0; i < a->n_pos; i++) {
        jj_val x = a->pos[i];
        if (x.t != JV_INT && x.t != JV_BOOL)
            return jj_fail(c, n, TANDEM_ERR_FORMAT, "'%s' object cannot be interpreted as an integer", jv_type_name(x));
        v[a->n_pos == 1 ? 1 : i] = x.t == JV_INT ? x.u.i : x.u.b;
    }
    if (v[2] == 0) return jj_fail(c, n, TANDEM_ERR_FORMAT, "range() arg 3 must not be zero");
    double count = v[2] > 0 ? ((double)v[1] - (double)v[0]) / (double)v[2] : ((double)v[0] - (double)v[1]) / (double)-v[2];
    if (count > RANGE_MAX)
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "range too big: the sandbox blocks ranges larger than %d", RANGE_MAX);
    jj_list *l = jj_list_new(c, count > 0 ? (size_t)count + 1 : 0);
    if (!l) return false;
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2]) l->v[l->n++] = jv_int(i);
    *out = jv_list(l);
    return true;
}

/* namespace(...) / dict(...): keyword arguments (and dicts given positionally). */
static bool fn_dict(jj_ctx *c, const jj_node *n, const jj_args *a, bool ns, jj_val *out) {
    jj_dict *d = jj_dict_new(c, 0);
    if (!d) return false;
    for (size_t i = 0; i < a->n_pos; i++) {
        jj_val x = a->pos[i];
        if (x.t != JV_DICT && x.t != JV_NS)
            return jj_fail(c, n, TANDEM_ERR_FORMAT, "%s() takes keyword arguments or a dict", ns ? "namespace" : "dict");
        for (size_t k = 0; k < x.u.d->n; k++)
            if (!jj_dict_set(c, d, x.u.d->k[k], x.u.d->v[k])) return false;
    }
    for (size_t k = 0; k < a->n_kw; k++) {
        const jj_str *key = jj_str_new(c, a->kw[k], strlen(a->kw[k]));
        if (!key || !jj_dict_set(c, d, jv_str(key), a->kwv[k])) return false;
    }
    out->t = ns ? JV_NS : JV_DICT;
    out->u.d = d;
    return true;
}

static bool fn_strftime(jj_ctx *c, const jj_node *n, const jj_args *a, jj_val *out) {
    const jj_str *fmt;
    if (!jj_arg_str(c, n, a, 0, "format", &fmt)) return false;
    if (!fmt) return jj_fail(c, n, TANDEM_ERR_FORMAT, "strftime_now needs a format string");
    struct tm tm;
    time_t t = c->lim.now >= 0 ? (time_t)c->lim.now : time(NULL);
    if (!(c->lim.now >= 0 ? gmtime_r(&t, &tm) : localtime_r(&t, &tm)))
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "strftime_now: the time cannot be represented");
    if (fmt->len > 256) return jj_fail(c, n, TANDEM_ERR_FORMAT, "strftime_now: format too long");
    char buf[1024];
    size_t k = fmt->len ? strftime(buf, sizeof buf, fmt->s, &tm) : 0;
    if (fmt->len && k == 0 && fmt->s[0]) buf[0] = 0;
    return ret_str(jj_str_new(c, buf, k), out);
}

bool jj_call_func(jj_ctx *c, const jj_node *n, jj_val fn, const jj_args *a, jj_val *out) {
    if (fn.t == JV_MACRO || fn.t == JV_CALLER)
        return jj_call_macro(c, n, fn, a->pos, a->n_pos, a->kw, a->kwv, a->n_kw, NULL, out);
    if (fn.t != JV_FUNC) return jj_fail(c, n, TANDEM_ERR_FORMAT, "'%s' object is not callable", jv_type_name(fn));
    switch ((jj_func)fn.u.fn) {
    case FN_RANGE: return fn_range(c, n, a, out);
    case FN_NAMESPACE: return fn_dict(c, n, a, true, out);
    case FN_DICT: return fn_dict(c, n, a, false, out);
    case FN_STRFTIME: return fn_strftime(c, n, a, out);
    case FN_RAISE: {
        jj_buf b = {0};
        bool ok = a->n_pos == 0 || jj_buf_str(c, &b, a->pos[0]);
        if (ok) jj_fail(c, n, TANDEM_ERR_FORMAT, "raise_exception: %s", b.p ? b.p : "");
        free(b.p);
        return false;
    }
    default: return jj_fail(c, n, TANDEM_ERR_INTERNAL, "bad function %d", fn.u.fn);
    }
}
