#!/usr/bin/env python3
"""xcheck_eagle3_variant.py - a copy of an EAGLE-3 head (llama.cpp's eagle3 GGUF) with
the optional switches of published heads turned on, for bench/xcheck_eagle3.py to
cross-check paths a plain head never takes:
  --norm-before-fc        eagle3.norm_before_fc = true and a tensor enc.output_norm.weight
                          [3T] (EAGLE-3.1 heads: rmsnorm of the features before fc);
                          its weights 1 + 0.1 N(0, 1) (--seed)
  --norm-before-residual  eagle3.norm_before_residual = true (RedHat speculators: the
                          block's residual is the normed g)
The metadata's bytes are copied as they are and the new keys appended; the tensors
are laid out anew.

    python3 bench/xcheck_eagle3_variant.py HEAD.gguf OUT.gguf [--norm-before-fc] [--norm-before-residual]
"""
import argparse
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "distill"))
from gguf_read import read_gguf  # noqa: E402

TYPE_SIZE = {0: 4, 1: 2, 27: 8}  # f32, f16, i64: bytes per element


def gguf_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--norm-before-fc", action="store_true")
    ap.add_argument("--norm-before-residual", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    spans = {}
    kv, infos, buf = read_gguf(args.src, spans)
    if kv.get("general.architecture") != "eagle3":
        sys.exit("%s: not an eagle3 head" % args.src)
    new_kv = []
    for flag, key in ((args.norm_before_fc, "eagle3.norm_before_fc"),
                      (args.norm_before_residual, "eagle3.norm_before_residual")):
        if flag:
            if key in kv:
                sys.exit("%s: already has %s" % (args.src, key))
            new_kv.append(gguf_str(key) + struct.pack("<IB", 7, 1))  # (type 7: bool)
    tensors = []  # (name, ggml type, shape rows-first, bytes)
    for name, (t, shape, off) in infos.items():
        n = int(np.prod(shape)) * TYPE_SIZE[t]
        tensors.append((name, t, shape, buf[off:off + n]))
    if args.norm_before_fc:
        T3 = 3 * kv["eagle3.target_hidden_size"]
        w = 1 + 0.1 * np.random.default_rng(args.seed).standard_normal(T3)
        tensors.append(("enc.output_norm.weight", 0, [T3], w.astype(np.float32).tobytes()))
    align = kv.get("general.alignment", 32)
    out = bytearray(b"GGUF" + struct.pack("<IQQ", spans["version"], len(tensors), spans["n_kv"] + len(new_kv)))
    out += buf[spans["kv"][0]:spans["kv"][1]]
    for e in new_kv:
        out += e
    data, offs = bytearray(), []
    for name, t, shape, b in tensors:
        data += b"\0" * (-len(data) % align)
        offs.append(len(data))
        data += b
    for (name, t, shape, b), o in zip(tensors, offs):
        out += gguf_str(name) + struct.pack("<I", len(shape))
        for d in reversed(shape):
            out += struct.pack("<Q", d)
        out += struct.pack("<IQ", t, o)
    out += b"\0" * (-len(out) % align)
    out += data
    with open(args.dst, "wb") as f:
        f.write(out)


if __name__ == "__main__":
    main()
