#!/usr/bin/env python3
"""wrap.py SOURCE OUT - writes OUT as a one-line #include of SOURCE (the build's way
of recompiling a CUDA source when a header it includes changes; see meson.build)."""
import sys

with open(sys.argv[2], "w") as f:
    f.write('#include "%s"\n' % sys.argv[1])
