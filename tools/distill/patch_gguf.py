#!/usr/bin/env python3
"""patch_gguf.py - writes a copy of a GGUF file with new values for its f16/f32
tensors (same names, shapes and types, so every offset stays), from an .npz of
float32 arrays (distill.py's output).

    python3 tools/distill/patch_gguf.py SRC.gguf WEIGHTS.npz DST.gguf
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_read import read_gguf  # noqa: E402


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: patch_gguf.py SRC.gguf WEIGHTS.npz DST.gguf")
    src, npz, dst = sys.argv[1:4]
    kv, infos, buf = read_gguf(src)
    out = bytearray(buf)
    w = np.load(npz)
    for name, (t, shape, off) in infos.items():
        a = w[name]
        assert list(a.shape) == shape, (name, a.shape, shape)
        dt = {0: np.float32, 1: np.float16}[t]
        b = a.astype(dt).tobytes()
        out[off:off + len(b)] = b
    open(dst, "wb").write(out)
    print("wrote", dst, len(out), "bytes")


if __name__ == "__main__":
    main()
