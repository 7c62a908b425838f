#!/usr/bin/env bash
# test_install.sh - `meson install` gives a host program everything it needs: the
# header, a shared library with a versioned soname that exports the TANDEM_API
# functions alone, a real (not thin) static archive and tandem.pc.  Installs the
# build into a temporary directory (--destdir), then builds examples/async_chat.c
# from a copy, with nothing but `pkg-config ... tandem` on the installed files,
# linked against the shared library and against the archive, and runs each.
#
# usage: tests/test_install.sh BUILD_DIR SOURCE_ROOT [SANITIZE]
# SANITIZE: the build's b_sanitize (address,undefined ...): the host program is
# compiled with the same -fsanitize, and the all-static build is left out.
# Uses $TDM_MODELS (meson sets it), else the models/ directory next to this script;
# $CC, else cc.  Exit status 0 when every check passes, 1 otherwise.
BUILD=$1
SRC=$2
SANITIZE=${3:-none}
if [ -z "$BUILD" ] || [ -z "$SRC" ]; then
    echo "usage: $0 BUILD_DIR SOURCE_ROOT" >&2
    exit 2
fi
MODELS=${TDM_MODELS:-$(dirname "$0")/../models}
CC=${CC:-cc}
HOST_CFLAGS=()
[ "$SANITIZE" != none ] && HOST_CFLAGS=("-fsanitize=$SANITIZE")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
FAILED=0
pass() { echo "ok   - $1"; }
fail() { echo "FAIL - $1"; FAILED=1; }

# ---------------------------------------------------------------- the install
DEST=$TMP/dest
if ! meson install -C "$BUILD" --destdir "$DEST" --no-rebuild --quiet >"$TMP/install.log" 2>&1; then
    cat "$TMP/install.log"
    fail "meson install --destdir"
    exit 1
fi
pass "meson install --destdir"
PC_FILE=$(find "$DEST" -name tandem.pc | head -n 1)
if [ -z "$PC_FILE" ]; then
    fail "tandem.pc installed"
    exit 1
fi
pass "tandem.pc installed"
# the .pc names the real prefix: a copy of it names the one under DEST (its other
# variables derive from prefix; --define-variable would move inih's prefix too)
PREFIX=$(sed -n 's/^prefix=//p' "$PC_FILE")
mkdir "$TMP/pc"
sed "s|^prefix=.*|prefix=$DEST$PREFIX|" "$PC_FILE" >"$TMP/pc/tandem.pc"
export PKG_CONFIG_PATH=$TMP/pc
PC=pkg-config
LIBDIR=$($PC --variable=libdir tandem)
INCDIR=$($PC --variable=includedir tandem)
MAJOR=$(sed -n 's/^#define TANDEM_VERSION_MAJOR \([0-9]*\)$/\1/p' "$SRC/include/tandem.h")
VERSION=$(sed -n 's/^#define TANDEM_VERSION "\(.*\)"$/\1/p' "$SRC/include/tandem.h")

[ "$($PC --modversion tandem)" = "$VERSION" ] && pass "tandem.pc version $VERSION" || fail "tandem.pc version"
cmp -s "$INCDIR/tandem.h" "$SRC/include/tandem.h" && pass "tandem.h installed" || fail "tandem.h installed"
[ -x "$DEST$PREFIX/bin/tandem" ] && pass "bin/tandem installed" || fail "bin/tandem installed"
# a static link needs the archive's own dependencies: threads, m, inih
static_libs=$($PC --static --libs tandem)
case " $static_libs " in
    *" -lm "*"-linih"* | *"-linih"*" -lm "*) pass "pkg-config --static --libs: -lm, -linih ($static_libs)" ;;
    *) fail "pkg-config --static --libs lacks -lm or -linih: $static_libs" ;;
esac
case "$static_libs" in
    *pthread*) pass "pkg-config --static --libs: threads" ;;
    *) fail "pkg-config --static --libs lacks threads: $static_libs" ;;
esac

# ---------------------------------------------------------------- the libraries
SO=$LIBDIR/libtandem.so
[ -f "$SO.$VERSION" ] && [ -L "$SO.$MAJOR" ] && [ -L "$SO" ] &&
    pass "libtandem.so -> libtandem.so.$MAJOR -> libtandem.so.$VERSION" || fail "shared library files"
soname=$(readelf -d "$SO" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libtandem.so.$MAJOR" ] && pass "soname $soname" || fail "soname '$soname' (want libtandem.so.$MAJOR)"
# the exported functions are exactly the TANDEM_API declarations of tandem.h
grep -o '^TANDEM_API[^(]*(' "$SRC/include/tandem.h" | sed 's/.*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)($/\1/' |
    sort -u >"$TMP/api"
nm -D --defined-only "$SO" | awk '$2 == "T" { print $3 }' | sort -u >"$TMP/exported"
if [ -s "$TMP/api" ] && cmp -s "$TMP/api" "$TMP/exported"; then
    pass "libtandem.so exports the $(wc -l <"$TMP/api") TANDEM_API functions and nothing else"
else
    fail "libtandem.so's exports differ from tandem.h's TANDEM_API functions:"
    diff "$TMP/api" "$TMP/exported" | head -n 20
fi
nm -D --defined-only "$SO" | awk '$2 != "T" && $2 != "A" { bad = 1; print } END { exit bad }' >"$TMP/data" &&
    pass "libtandem.so exports no data" || { fail "libtandem.so exports data:"; head -n 5 "$TMP/data"; }
AR=$LIBDIR/libtandem.a
if [ "$(head -c 8 "$AR")" = '!<arch>' ] && ar t "$AR" | grep -q 'api\.c\.o$'; then
    pass "libtandem.a is a real archive ($(ar t "$AR" | wc -l) objects)"
else
    fail "libtandem.a is not a real archive (a thin one refers to the build tree)"
fi

# ---------------------------------------------------------------- a host program
# a copy of the example, so that nothing of the source tree is on its include path
cp "$SRC/examples/async_chat.c" "$TMP/app.c"
ARGS=("$MODELS/pycode-target-f16.gguf" "$MODELS/pycode-draft-xs-f16.gguf")
# run_app NAME BINARY: it runs and prints its four results
run_app() {
    if "$2" "${ARGS[@]}" >"$TMP/run.log" 2>&1 && [ "$(grep -c '^request [0-9]: ok' "$TMP/run.log")" -eq 4 ]; then
        pass "$1 runs"
    else
        fail "$1 runs:"
        tail -n 5 "$TMP/run.log"
    fi
}
# shared: the three lines of the README
if $CC "${HOST_CFLAGS[@]}" -o "$TMP/app_shared" "$TMP/app.c" $($PC --cflags --libs tandem) 2>"$TMP/cc.log"; then
    pass "async_chat builds with pkg-config --cflags --libs tandem"
    readelf -d "$TMP/app_shared" | grep -q "NEEDED.*\[libtandem.so.$MAJOR\]" &&
        pass "async_chat needs libtandem.so.$MAJOR" || fail "async_chat does not need libtandem.so.$MAJOR"
    LD_LIBRARY_PATH=$LIBDIR run_app "async_chat (shared)" "$TMP/app_shared"
else
    cat "$TMP/cc.log"
    fail "async_chat builds with pkg-config --cflags --libs tandem"
fi
# static: the archive by name (the shared library beside it would be chosen for
# -ltandem), the rest as --static gives it
if $CC "${HOST_CFLAGS[@]}" -o "$TMP/app_static" "$TMP/app.c" $($PC --cflags tandem) \
        $($PC --static --libs tandem | sed 's/-ltandem\b/-l:libtandem.a/') 2>"$TMP/cc.log"; then
    pass "async_chat builds with pkg-config --static and libtandem.a"
    readelf -d "$TMP/app_static" | grep -q 'NEEDED.*libtandem' &&
        fail "async_chat (static) needs libtandem.so" || pass "async_chat (static) needs no libtandem.so"
    run_app "async_chat (static)" "$TMP/app_static"
else
    cat "$TMP/cc.log"
    fail "async_chat builds with pkg-config --static and libtandem.a"
fi
# all static, as the README shows it (a CPU build: the CUDA libraries are shared ones;
# not with a sanitizer, whose runtime is a shared one)
if ! grep -q cuda "$PC_FILE" && [ "$SANITIZE" = none ]; then
    if $CC -o "$TMP/app_all_static" "$TMP/app.c" $($PC --static --cflags --libs tandem) -static 2>"$TMP/cc.log"; then
        pass "async_chat builds with -static"
        readelf -d "$TMP/app_all_static" | grep -q NEEDED &&
            fail "async_chat (-static) needs shared libraries" || pass "async_chat (-static) needs no shared library"
        run_app "async_chat (-static)" "$TMP/app_all_static"
    else
        cat "$TMP/cc.log"
        fail "async_chat builds with -static"
    fi
fi

exit $FAILED
