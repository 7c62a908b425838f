/* filters.c - jinja2's filters that chat templates use:
 * abs, attr, capitalize, count, d, default, e, escape, first, float, indent, int,
 * items, join, last, length, list, lower, map, reject, rejectattr, replace, reverse,
 * safe, select, selectattr, sort, string, title, tojson (as transformers defines it:
 * json.dumps with ensure_ascii=False), trim, unique, upper. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jj_internal.h"

typedef bool (*filter_fn)(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out);

static bool ret_str(const jj_str *s, jj_val *out) {
    *out = jv_str(s);
    return s != NULL;
}

static bool f_trim(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    const jj_str *s, *chars;
    return jj_str_of(c, v, &s) && jj_arg_str(c, n, a, 0, "chars", &chars) && ret_str(jj_s_strip(c, s, chars, true, true), out);
}

static bool with_case(jj_ctx *c, jj_val v, jj_case m, jj_val *out) {
    const jj_str *s;
    return jj_str_of(c, v, &s) && ret_str(jj_s_case(c, s, m), out);
}
static bool f_upper(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { (void)n, (void)a; return with_case(c, v, JJ_UPPER, out); }
static bool f_lower(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { (void)n, (void)a; return with_case(c, v, JJ_LOWER, out); }
static bool f_capitalize(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { (void)n, (void)a; return with_case(c, v, JJ_CAPITALIZE, out); }
static bool f_title(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { (void)n, (void)a; return with_case(c, v, JJ_TITLE, out); }

static bool f_length(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)a;
    int64_t len;
    if (!jj_length(c, v, &len)) return jj_fail(c, n, TANDEM_ERR_FORMAT, "object of type '%s' has no len()", jv_type_name(v));
    *out = jv_int(len);
    return true;
}

/* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
static bool f_tojson(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    jj_val ea = jv_bool(false), sep = jv_none(), sk = jv_bool(false);
    int64_t indent;
    jj_arg(a, 0, "ensure_ascii", &ea);
    if (!jj_arg_int(c, n, a, 1, "indent", -1, &indent)) return false;
    jj_arg(a, 2, "separators", &sep);
    jj_arg(a, 3, "sort_keys", &sk);
    if (indent > 64) return jj_fail(c, n, TANDEM_ERR_FORMAT, "tojson: indent %lld is too large", (long long)indent);
    const char *isep = indent >= 0 ? "," : ", ", *ksep = ": ";
    if (sep.t == JV_LIST) {
        if (sep.u.l->n != 2 || sep.u.l->v[0].t != JV_STR || sep.u.l->v[1].t != JV_STR)
            return jj_fail(c, n, TANDEM_ERR_FORMAT, "tojson: separators must be two strings");
        isep = sep.u.l->v[0].u.s->s;
        ksep = sep.u.l->v[1].u.s->s;
    }
    jj_buf b = {0};
    bool ok = jj_buf_json(c, &b, v, jj_truthy(ea), (int)indent, isep, ksep, jj_truthy(sk), 0);
    const jj_str *s = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
    free(b.p);
    return ret_str(s, out);
}

static bool f_default(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)n;
    jj_val def, boolean = jv_bool(false);
    if (!jj_arg(a, 0, "default_value", &def)) {
        const jj_str *e = jj_str_new(c, "", 0);
        if (!e) return false;
        def = jv_str(e);
    }
    jj_arg(a, 1, "boolean", &boolean);
    *out = v.t == JV_UNDEF || (jj_truthy(boolean) && !jj_truthy(v)) ? def : v;
    return true;
}

/* item.attribute for the attribute arguments of join, map, sort...: dotted paths
 * and integer parts as jinja2's attrgetter reads them. */
static bool attr_path(jj_ctx *c, const jj_node *n, jj_val v, jj_val attr, jj_val *out) {
    if (attr.t == JV_INT) {
        *out = v.t == JV_LIST && attr.u.i >= 0 && (size_t)attr.u.i < v.u.l->n ? v.u.l->v[attr.u.i] : jv_undef(NULL);
        return true;
    }
    if (attr.t != JV_STR) return jj_fail(c, n, TANDEM_ERR_FORMAT, "attribute must be a string");
    if (!jj_work(c, attr.u.s->len, JJ_SCAN)) return false;
    const char *p = attr.u.s->s;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        char part[128];
        if (len >= sizeof part) return jj_fail(c, n, TANDEM_ERR_FORMAT, "attribute name too long");
        memcpy(part, p, len);
        part[len] = 0;
        if (v.t == JV_UNDEF) return *out = v, true;
        if (!jj_work(c, 1, JJ_ITEM)) return false;
        char *end;
        long idx = strtol(part, &end, 10);
        if (len && *end == 0 && v.t == JV_LIST)
            v = idx >= 0 && (size_t)idx < v.u.l->n ? v.u.l->v[idx] : jv_undef(NULL);
        else if (!jj_get_attr(c, n, v, part, &v))
            return false;
        if (!dot) break;
        p = dot + 1;
    }
    *out = v;
    return true;
}

static bool f_join(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    const jj_str *sep;
    jj_val attr;
    const jj_list *l;
    bool has_attr = jj_arg(a, 1, "attribute", &attr) && attr.t != JV_NONE;
    if (!jj_arg_str(c, n, a, 0, "d", &sep) || !jj_iter_list(c, n, v, &l)) return false;
    jj_buf b = {0};
    bool ok = true;
    for (size_t i = 0; i < l->n && ok; i++) {
        jj_val item = l->v[i];
        ok = jj_work(c, 1, JJ_ITEM);
        if (ok && i && sep) ok = jj_buf_add(c, &b, sep->s, sep->len);
        if (ok && has_attr) ok = attr_path(c, n, item, attr, &item);
        if (ok) ok = jj_buf_str(c, &b, item);
    }
    const jj_str *s = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
    free(b.p);
    return ret_str(s, out);
}

static bool f_first(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)a;
    const jj_list *l;
    if (!jj_iter_list(c, n, v, &l)) return false;
    *out = l->n ? l->v[0] : jv_undef(NULL);
    return true;
}

static bool f_last(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)a;
    const jj_list *l;
    if (!jj_iter_list(c, n, v, &l)) return false;
    *out = l->n ? l->v[l->n - 1] : jv_undef(NULL);
    return true;
}

static bool f_list(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)a;
    const jj_list *l;
    if (!jj_iter_list(c, n, v, &l)) return false;
    jj_list *r = jj_list_new(c, l->n);
    if (!r) return false;
    for (size_t i = 0; i < l->n; i++) r->v[r->n++] = l->v[i];
    *out = jv_list(r);
    return true;
}

static bool f_string(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)n, (void)a;
    return jj_to_str(c, v, out);
}

static bool f_safe(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)n, (void)a;
    return jj_to_str(c, v, out);
}

/* int(value) or float(value) as jinja2 converts, the default when it cannot. */
static bool number_of(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool want_int, jj_val *out) {
    jj_val def = want_int ? jv_int(0) : jv_float(0);
    jj_arg(a, 0, "default", &def);
    int64_t base = 10;
    if (want_int && !jj_arg_int(c, n, a, 1, "base", 10, &base)) return false;
    if (base < 2 || base > 36) base = 10;
    double f;
    switch (v.t) {
    case JV_INT: case JV_BOOL: *out = want_int ? jv_int(v.t == JV_INT ? v.u.i : v.u.b) : jv_float(v.t == JV_INT ? (double)v.u.i : v.u.b); return true;
    case JV_FLOAT:
        f = v.u.f;
        break;
    case JV_STR: {
        const jj_str *s = jj_s_strip(c, v.u.s, NULL, true, true);
        if (!s || !jj_work(c, s->len, JJ_SCAN)) return false;
        char *end;
        errno = 0;
        if (want_int) {
            long long i = strtoll(s->s, &end, (int)base);
            if (s->len && *end == 0 && errno == 0) return *out = jv_int(i), true;
        }
        f = strtod(s->s, &end);
        if (!s->len || *end != 0 || (want_int && !isfinite(f))) return *out = def, true;
        break;
    }
    default: *out = def; return true;
    }
    if (!want_int) return *out = jv_float(f), true;
    if (!(f > -9.2e18 && f < 9.2e18)) return *out = def, true;
    *out = jv_int((int64_t)f);
    return true;
}
static bool f_int(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { return number_of(c, n, v, a, true, out); }
static bool f_float(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { return number_of(c, n, v, a, false, out); }

static bool f_abs(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)a;
    if (v.t == JV_INT && v.u.i != INT64_MIN) return *out = jv_int(v.u.i < 0 ? -v.u.i : v.u.i), true;
    if (v.t == JV_FLOAT) return *out = jv_float(fabs(v.u.f)), true;
    if (v.t == JV_BOOL) return *out = jv_int(v.u.b), true;
    return jj_fail(c, n, TANDEM_ERR_FORMAT, "bad operand type for abs(): '%s'", jv_type_name(v));
}

static bool f_replace(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    const jj_str *s, *old, *new_;
    int64_t count;
    if (!jj_str_of(c, v, &s) || !jj_arg_str(c, n, a, 0, "old", &old) || !jj_arg_str(c, n, a, 1, "new", &new_) ||
        !jj_arg_int(c, n, a, 2, "count", -1, &count))
        return false;
    if (!old || !new_) return jj_fail(c, n, TANDEM_ERR_FORMAT, "replace needs the old and the new string");
    return ret_str(jj_s_replace(c, s, old, new_, count), out);
}

/* jinja2 3.1 indent(width=4, first=False, blank=False): every line after the first
 * (and the first with first=True) gets the indentation; blank lines only with blank. */
static bool f_indent(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    const jj_str *s, *ind = NULL;
    jj_val w, first = jv_bool(false), blank = jv_bool(false);
    char spaces[257];
    if (!jj_str_of(c, v, &s)) return false;
    if (!jj_arg(a, 0, "width", &w)) w = jv_int(4);
    jj_arg(a, 1, "first", &first);
    jj_arg(a, 2, "blank", &blank);
    if (w.t == JV_STR) {
        ind = w.u.s;
    } else if (w.t == JV_INT && w.u.i >= 0 && w.u.i <= 256) {
        memset(spaces, ' ', (size_t)w.u.i);
        if (!(ind = jj_str_new(c, spaces, (size_t)w.u.i))) return false;
    } else {
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "indent: width must be a string or an integer in [0, 256]");
    }
    jj_str *t = jj_str_alloc(c, s->len + 1); /* s + "\n", as jinja2 does */
    if (!t) return false;
    memcpy(t->s, s->s, s->len);
    t->s[s->len] = '\n';
    jj_list *lines = jj_s_splitlines(c, t, false);
    if (!lines) return false;
    jj_buf b = {0};
    bool ok = true;
    if (jj_truthy(first)) ok = jj_buf_add(c, &b, ind->s, ind->len);
    for (size_t i = 0; i < lines->n && ok; i++) {
        const jj_str *line = lines->v[i].u.s;
        if (i) ok = jj_buf_add(c, &b, "\n", 1);
        if (ok && i && (line->len || jj_truthy(blank))) ok = jj_buf_add(c, &b, ind->s, ind->len);
        if (ok) ok = jj_buf_add(c, &b, line->s, line->len);
    }
    const jj_str *r = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
    free(b.p);
    return ret_str(r, out);
}

static bool f_items(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)a;
    jj_list *l = jj_list_new(c, 0);
    if (!l) return false;
    if (v.t == JV_DICT || v.t == JV_NS) {
        for (size_t i = 0; i < v.u.d->n; i++) {
            jj_list *kv = jj_list_new(c, 2);
            if (!kv) return false;
            kv->v[0] = v.u.d->k[i];
            kv->v[1] = v.u.d->v[i];
            kv->n = 2;
            kv->tuple = true;
            if (!jj_list_push(c, l, jv_list(kv))) return false;
        }
    } else if (v.t != JV_UNDEF) {
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "items: can only get item pairs from a mapping, not %s", jv_type_name(v));
    }
    *out = jv_list(l);
    return true;
}

static bool f_escape(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)n, (void)a;
    const jj_str *s;
    if (!jj_str_of(c, v, &s)) return false;
    jj_buf b = {0};
    bool ok = jj_work(c, s->len, JJ_ITEM); /* an append a byte */
    for (size_t i = 0; i < s->len && ok; i++) {
        const char *r = s->s[i] == '&' ? "&amp;" : s->s[i] == '<' ? "&lt;" : s->s[i] == '>' ? "&gt;"
                      : s->s[i] == '"' ? "&#34;" : s->s[i] == '\'' ? "&#39;" : NULL;
        ok = r ? jj_buf_add(c, &b, r, strlen(r)) : jj_buf_add(c, &b, s->s + i, 1);
    }
    const jj_str *r = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
    free(b.p);
    return ret_str(r, out);
}

static bool f_attr(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    const jj_str *name;
    if (!jj_arg_str(c, n, a, 0, "name", &name)) return false;
    if (!name) return jj_fail(c, n, TANDEM_ERR_FORMAT, "attr needs a name");
    return jj_get_attr(c, n, v, name->s, out);
}

/* The arguments from i on, as the arguments of another filter or test. */
static jj_args rest_args(const jj_args *a, size_t i) {
    jj_args r = *a;
    r.pos = a->n_pos > i ? a->pos + i : NULL;
    r.n_pos = a->n_pos > i ? a->n_pos - i : 0;
    return r;
}

static bool f_map(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    const jj_list *l;
    jj_val attr, fname, def;
    if (!jj_iter_list(c, n, v, &l)) return false;
    jj_list *r = jj_list_new(c, l->n);
    if (!r) return false;
    bool by_attr = jj_arg(a, SIZE_MAX, "attribute", &attr), has_def = jj_arg(a, SIZE_MAX, "default", &def);
    if (!by_attr && (!jj_arg(a, 0, NULL, &fname) || fname.t != JV_STR))
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "map needs a filter name or attribute=");
    if (!by_attr && !jj_is_filter(fname.u.s->s))
        return jj_fail(c, n, TANDEM_ERR_UNSUPPORTED, "unknown filter '%s'", fname.u.s->s);
    jj_args fa = rest_args(a, 1);
    for (size_t i = 0; i < l->n; i++) {
        jj_val x;
        if (!jj_work(c, 1, JJ_ITEM)) return false;
        if (by_attr ? !attr_path(c, n, l->v[i], attr, &x) : !jj_filter(c, n, fname.u.s->s, l->v[i], &fa, &x)) return false;
        if (by_attr && x.t == JV_UNDEF && has_def) x = def;
        r->v[r->n++] = x;
    }
    *out = jv_list(r);
    return true;
}

/* select / reject (by_attr false) and selectattr / rejectattr. */
static bool select_impl(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, bool by_attr, bool keep, jj_val *out) {
    const jj_list *l;
    jj_val attr = jv_none(), tname;
    size_t ti = by_attr ? 1 : 0;
    if (!jj_iter_list(c, n, v, &l)) return false;
    if (by_attr && (!jj_arg(a, 0, NULL, &attr) || attr.t != JV_STR))
        return jj_fail(c, n, TANDEM_ERR_FORMAT, "selectattr / rejectattr need an attribute name");
    bool has_test = jj_arg(a, ti, NULL, &tname);
    if (has_test && (tname.t != JV_STR || !jj_is_test(tname.u.s->s)))
        return jj_fail(c, n, TANDEM_ERR_UNSUPPORTED, "unknown test '%s'", tname.t == JV_STR ? tname.u.s->s : "?");
    jj_args ta = rest_args(a, ti + 1);
    jj_list *r = jj_list_new(c, 0);
    if (!r) return false;
    for (size_t i = 0; i < l->n; i++) {
        jj_val x = l->v[i];
        bool pass;
        if (!jj_work(c, 1, JJ_ITEM)) return false;
        if (by_attr && !attr_path(c, n, x, attr, &x)) return false;
        if (has_test) {
            if (!jj_test(c, n, tname.u.s->s, x, &ta, &pass)) return false;
        } else {
            pass = jj_truthy(x);
        }
        if (pass == keep && !jj_list_push(c, r, l->v[i])) return false;
    }
    *out = jv_list(r);
    return true;
}
static bool f_select(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { return select_impl(c, n, v, a, false, true, out); }
static bool f_reject(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { return select_impl(c, n, v, a, false, false, out); }
static bool f_selectattr(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { return select_impl(c, n, v, a, true, true, out); }
static bool f_rejectattr(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) { return select_impl(c, n, v, a, true, false, out); }

static bool f_reverse(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    (void)a;
    const jj_list *l;
    if (!jj_iter_list(c, n, v, &l)) return false;
    if (v.t == JV_STR) {
        jj_buf b = {0};
        bool ok = true;
        for (size_t i = l->n; i-- > 0 && ok;) ok = jj_buf_add(c, &b, l->v[i].u.s->s, l->v[i].u.s->len);
        const jj_str *s = ok ? jj_str_new(c, b.p ? b.p : "", b.n) : NULL;
        free(b.p);
        return ret_str(s, out);
    }
    jj_list *r = jj_list_new(c, l->n);
    if (!r) return false;
    for (size_t i = l->n; i-- > 0;) r->v[r->n++] = l->v[i];
    *out = jv_list(r);
    return true;
}

/* The key sort and unique compare by: the attribute, lowercased unless case sensitive. */
static bool sort_key(jj_ctx *c, const jj_node *n, jj_val x, jj_val attr, bool cs, jj_val *out) {
    if (attr.t != JV_NONE && !attr_path(c, n, x, attr, &x)) return false;
    if (!cs && x.t == JV_STR) {
        const jj_str *l = jj_s_case(c, x.u.s, JJ_LOWER);
        if (!l) return false;
        x = jv_str(l);
    }
    *out = x;
    return true;
}

static bool f_sort(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    const jj_list *l;
    jj_val rev = jv_bool(false), cs = jv_bool(false), attr = jv_none();
    jj_arg(a, 0, "reverse", &rev);
    jj_arg(a, 1, "case_sensitive", &cs);
    jj_arg(a, 2, "attribute", &attr);
    if (!jj_iter_list(c, n, v, &l)) return false;
    jj_list *r = jj_list_new(c, l->n);
    jj_val *keys = l->n ? jj_alloc(c, l->n * sizeof *keys) : NULL;
    if (!r || (l->n && !keys)) return false;
    /* insertion into place, stable; O(n^2) compares bounded by the step limit */
    for (size_t i = 0; i < l->n; i++) {
        jj_val k;
        if (!sort_key(c, n, l->v[i], attr, jj_truthy(cs), &k)) return false;
        size_t j = i;
        while (j > 0) {
            int cmp;
            if (!jj_work(c, 1, JJ_ITEM) || !jj_compare(c, n, keys[j - 1], k, &cmp)) return false;
            if (jj_truthy(rev) ? cmp >= 0 : cmp <= 0) break;
            keys[j] = keys[j - 1];
            r->v[j] = r->v[j - 1];
            j--;
        }
        keys[j] = k;
        r->v[j] = l->v[i];
        r->n++;
    }
    *out = jv_list(r);
    return true;
}

static bool f_unique(jj_ctx *c, const jj_node *n, jj_val v, const jj_args *a, jj_val *out) {
    const jj_list *l;
    jj_val cs = jv_bool(false), attr = jv_none();
    jj_arg(a, 0, "case_sensitive", &cs);
    jj_arg(a, 1, "attribute", &attr);
    if (!jj_iter_list(c, n, v, &l)) return false;
    jj_list *r = jj_list_new(c, 0), *seen = jj_list_new(c, 0);
    if (!r || !seen) return false;
    for (size_t i = 0; i < l->n; i++) {
        jj_val k;
        bool dup = false;
        if (!sort_key(c, n, l->v[i], attr, jj_truthy(cs), &k)) return false;
        for (size_t j = 0; j < seen->n && !dup; j++) dup = jj_equal(c, seen->v[j], k);
        if (jj_over(c)) return false;
        if (!dup && (!jj_list_push(c, seen, k) || !jj_list_push(c, r, l->v[i]))) return false;
    }
    *out = jv_list(r);
    return true;
}

static const struct {
    const char *name;
    filter_fn fn;
} filters[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"capitalize", f_capitalize}, {"count", f_length}, {"d", f_default},
    {"default", f_default}, {"e", f_escape}, {"escape", f_escape}, {"first", f_first}, {"float", f_float},
    {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
    {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"reject", f_reject},
    {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"safe", f_safe},
    {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
    {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique}, {"upper", f_upper},
};

static filter_fn find_filter(const char *name) {
    for (size_t i = 0; i < TDM_ARRAY_LEN(filters); i++)
        if (strcmp(filters[i].name, name) == 0) return filters[i].fn;
    return NULL;
}

bool jj_is_filter(const char *name) { return find_filter(name) != NULL; }

bool jj_filter(jj_ctx *c, const jj_node *n, const char *name, jj_val in, const jj_args *a, jj_val *out) {
    filter_fn f = find_filter(name);
    if (!f) return jj_fail(c, n, TANDEM_ERR_UNSUPPORTED, "unknown filter '%s'", name);
    if (++c->depth > 1000) return jj_fail(c, n, TANDEM_ERR_FORMAT, "filters nested too deeply");
    bool ok = f(c, n, in, a, out);
    c->depth--;
    return ok;
}
