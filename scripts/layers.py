#!/usr/bin/env python3
"""scripts/layers.py - checks the include graph against the project's layers.

usage: scripts/layers.py [--edges] [--png FILE] [--known FILE]

Reads every .c/.h/.cu/.cuh under the folders of LAYERS' table (include/, src/,
kernels/, draft/, verify/, sched/) and resolves each `#include "x"` as the compiler
does: relative to the including file's folder first, then the include directories of
meson.build's `layer_dirs` and src/request, src/server, src/cli, in that order; a name that
resolves to no file of the repository (a system or CUDA header) is outside the graph.
Each file belongs to its folder (subfolders count as folders of their own) and each
folder to a layer of LAYERS.  Two rules:

  upward: a file includes a header of a higher layer.  Printed as
          "upward: FROM -> TO (LAYER -> LAYER)", one line per include.
  cycle:  folders that reach one another through includes (a strongly connected
          component of the folder graph with more than one folder), within one layer
          too.  Printed as "cycle: A <-> B [<-> C ...]", the folders sorted.

The violations the code has today are listed in scripts/layers-known.txt (one per
line, the exact text printed; blank lines and lines starting with # are ignored).
Exit status: 0 when every violation found is listed there and every listed one is
still found; 1 when a violation is not listed (new), a listed one no longer occurs
(gone: delete its line, so the list only shrinks) or a line is listed twice; 2 on a usage or setup error (a
source folder outside the table, meson.build without `inc`).

--edges    also prints every folder-level edge: FROM -> TO and its number of includes.
--png FILE draws the layers (folders as boxes in layer rows, the top layer on top;
           include edges between folders labelled with their counts, upward ones red)
           with graphviz `dot`, which only this option needs.
--known F  the list of known violations (default scripts/layers-known.txt; that
           default may be absent: no known violations).

Needs nothing but python3 (standard library) for the check.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys

# Layer of each folder (relative to the repository root), lowest first.  A file may
# include headers of its own layer or a lower one.  chat sits below the kernels
# (it needs gguf and the tokenizer, and is kept off the engine).
LAYERS = [
    (0, "include", ["include"]),
    (1, "base types", ["src/base"]),
    (2, "gguf", ["src/gguf"]),
    (3, "tokenizer, chat, grammar", ["src/tokenizer", "src/chat", "src/chat/jinja", "src/grammar"]),
    (4, "kernels", ["kernels", "kernels/cpu", "kernels/cuda"]),
    (5, "model", ["src/model"]),
    (6, "engine", ["src/engine"]),
    (7, "draft, verify", ["draft", "verify"]),
    (8, "sched", ["sched"]),
    (9, "public API", ["src/api"]),
    (10, "request fields", ["src/request"]),
    (11, "server", ["src/server"]),
    (12, "CLI", ["src/cli"]),
]
ROOTS = ["include", "src", "kernels", "draft", "verify", "sched"]
EXTS = (".c", ".h", ".cu", ".cuh")

INCLUDE_RE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


class SetupError(Exception):
    pass


def layer_of_folder():
    table = {}
    for layer, _, folders in LAYERS:
        for f in folders:
            table[f] = layer
    return table


def meson_include_dirs(repo):
    """The include directories: every folder of meson.build's `layer_dirs` (each layer
    compiles with its own and the lower layers' folders), then src/request,
    src/server and src/cli, in layer order."""
    path = os.path.join(repo, "meson.build")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise SetupError("cannot read %s: %s" % (path, e.strerror))
    m = re.search(r"^layer_dirs\s*=\s*\[(.*?)^\]", text, re.M | re.S)
    if not m:
        raise SetupError("meson.build has no `layer_dirs = [...]`")
    dirs = []
    for d in re.findall(r"'([^']*)'", m.group(1)) + ["src/request", "src/server", "src/cli"]:
        if d not in dirs:
            dirs.append(d)
    return dirs


def source_files(repo):
    files = []
    for root in ROOTS:
        for d, subdirs, names in os.walk(os.path.join(repo, root)):
            subdirs.sort()
            for n in sorted(names):
                if n.endswith(EXTS):
                    files.append(os.path.relpath(os.path.join(d, n), repo).replace(os.sep, "/"))
    return files


def resolve(repo, including, name, inc_dirs):
    """The repository path `#include "name"` in file `including` opens, or None."""
    for d in [os.path.dirname(including)] + inc_dirs:
        p = os.path.normpath(os.path.join(d, name)).replace(os.sep, "/")
        if os.path.isfile(os.path.join(repo, p)):
            return None if p.startswith("../") else p
    return None


def sccs(nodes, edges):
    """Strongly connected components (Tarjan, iterative) of the graph edges: {node: set}."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = [0]
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def analyse(repo):
    """(violations, folder edge counts {(from, to): n}, files, include count)."""
    table = layer_of_folder()
    inc_dirs = meson_include_dirs(repo)
    files = source_files(repo)
    outside = sorted({os.path.dirname(f) for f in files} - set(table))
    if outside:
        raise SetupError("folder(s) with sources but no layer in scripts/layers.py's LAYERS: " + ", ".join(outside))
    violations, edges, n_inc = [], {}, 0
    for f in files:
        text = open(os.path.join(repo, f), encoding="utf-8", errors="replace").read()
        seen = set()
        for name in INCLUDE_RE.findall(text):
            to = resolve(repo, f, name, inc_dirs)
            if to is None or to in seen:
                continue
            seen.add(to)
            n_inc += 1
            a, b = os.path.dirname(f), os.path.dirname(to)
            if b not in table:
                raise SetupError("%s includes %s, in a folder with no layer in LAYERS" % (f, to))
            if table[b] > table[a]:
                violations.append("upward: %s -> %s (%d -> %d)" % (f, to, table[a], table[b]))
            if a != b:
                edges[(a, b)] = edges.get((a, b), 0) + 1
    for comp in folder_cycles(edges):
        violations.append("cycle: " + " <-> ".join(comp))
    return violations, edges, files, n_inc


def folder_cycles(edges):
    """The strongly connected components of the folder graph with more than one folder."""
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    return [c for c in sccs(sorted(layer_of_folder()), graph) if len(c) > 1]


def read_known(path, required):
    """The listed violations of path; none when it is absent and not required."""
    known = []
    try:
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if line and not line.startswith("#"):
                known.append(line)
    except FileNotFoundError:
        if required:
            raise SetupError("no such file: %s" % path)
    except OSError as e:
        raise SetupError("cannot read %s: %s" % (path, e.strerror))
    return known


def draw_png(edges, out):
    """The layer picture through graphviz dot: one row per layer, the top layer on top;
    upward edges red, the other edges of a folder cycle dashed orange."""
    table = layer_of_folder()
    in_cycle = {f: i for i, comp in enumerate(folder_cycles(edges)) for f in comp}
    dot = shutil.which("dot")
    if not dot:
        raise SetupError("--png needs graphviz's `dot` (apt-get install graphviz)")
    legend = "includes between folders (numbers: how many); red: upward; dashed orange: in a folder cycle"
    lines = ["digraph layers {", '  graph [rankdir=TB, nodesep=0.35, ranksep=0.55, fontname="Helvetica", '
             'fontsize=11, labelloc=b, label="%s"];' % legend,
             '  node [shape=box, style="rounded,filled", fillcolor="#eef3fb", fontname="Helvetica", fontsize=11];',
             '  edge [fontname="Helvetica", fontsize=9, color="#7a869a", fontcolor="#55606e", arrowsize=0.6];']
    for layer, title, folders in reversed(LAYERS):
        lines.append("  subgraph layer%d { rank=same;" % layer)
        lines.append('    "L%d" [shape=plaintext, style="", label="%d  %s"];' % (layer, layer, title))
        for f in folders:
            lines.append('    "%s";' % f)
        lines.append("  }")
    # invisible spine: keeps the rows in layer order; include edges do not move them
    spine = " -> ".join('"L%d"' % layer for layer, _, _ in reversed(LAYERS))
    lines.append("  %s [style=invis];" % spine)
    for (a, b), n in sorted(edges.items()):
        attrs = 'label="%d"' % n
        if table[b] >= table[a]:  # only downward edges may shape the drawing
            attrs += ", constraint=false"
        if table[b] > table[a]:
            attrs += ', color="#d62728", fontcolor="#d62728", penwidth=1.6'
        elif a in in_cycle and in_cycle[a] == in_cycle.get(b):
            attrs += ', color="#e08a00", fontcolor="#e08a00", style=dashed, penwidth=1.4'
        lines.append('  "%s" -> "%s" [%s];' % (a, b, attrs))
    lines.append("}")
    r = subprocess.run([dot, "-Tpng", "-Gdpi=110", "-o", out], input="\n".join(lines) + "\n", text=True,
                       capture_output=True)
    if r.returncode != 0:
        raise SetupError("dot failed: " + r.stderr.strip())


def main():
    ap = argparse.ArgumentParser(description="Checks the include graph against the project's layers.")
    ap.add_argument("--edges", action="store_true", help="print every folder-level edge and its count")
    ap.add_argument("--png", metavar="FILE", help="draw the layer picture (needs graphviz dot)")
    ap.add_argument("--known", metavar="FILE", help="known violations (default scripts/layers-known.txt)")
    args = ap.parse_args()
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    known_path = args.known or os.path.join(repo, "scripts", "layers-known.txt")
    try:
        violations, edges, files, n_inc = analyse(repo)
        known = read_known(known_path, args.known is not None)
        if args.png:
            draw_png(edges, args.png)
    except SetupError as e:
        print("layers: error: %s" % e, file=sys.stderr)
        return 2
    found, listed = set(violations), set(known)
    new = [v for v in violations if v not in listed]
    gone = [k for k in known if k not in found]
    twice = sorted({k for k in known if known.count(k) > 1})
    if args.edges:
        table = layer_of_folder()
        print("layers: folder edges (includes between folders):")
        for (a, b), n in sorted(edges.items(), key=lambda e: (-table[e[0][0]], e[0])):
            up = "  UPWARD" if table[b] > table[a] else ""
            print("  %-16s -> %-16s %4d  (%d -> %d)%s" % (a, b, n, table[a], table[b], up))
    for v in violations:
        print("  %s %s" % ("known" if v in listed else "NEW  ", v))
    for k in gone:
        print("  GONE  %s   (no longer occurs: delete its line from %s)" % (k, os.path.relpath(known_path, repo)))
    for k in twice:
        print("  TWICE %s   (listed more than once in %s)" % (k, os.path.relpath(known_path, repo)))
    n_up = sum(v.startswith("upward:") for v in violations)
    print("layers: %d files, %d includes, %d folder edges; %d upward includes, %d cycles "
          "(%d known, %d new); %d listed known ones gone" % (len(files), n_inc, len(edges), n_up,
                                                            len(violations) - n_up, len(violations) - len(new),
                                                            len(new), len(gone)))
    if new or gone or twice:
        print("layers: FAILED (%s)" % ", ".join(
            s for s in ["%d new violation(s)" % len(new) if new else "",
                        "%d listed violation(s) gone" % len(gone) if gone else "",
                        "%d listed twice" % len(twice) if twice else ""] if s))
        return 1
    print("layers: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
