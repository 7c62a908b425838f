#!/usr/bin/env python3
"""patch_gguf.py - writes a copy of a GGUF file with new values for its f16/f32
(and i64: an EAGLE-3 head's d2t) tensors (same names, shapes and types, so every
offset stays), from an .npz of arrays (distill.py's, eagle.py's or eagle3.py's
output).  --name / --description replace general.name / general.description with
a text of at most the old one's length (padded with spaces: the offsets stay).
--drop NAME leaves a tensor out (the file is laid out anew, metadata unchanged): an
EAGLE-3 head that scores the whole vocabulary with the target's own output head has
no output.weight and no d2t.

    python3 tools/distill/patch_gguf.py SRC.gguf WEIGHTS.npz DST.gguf [--name N] [--description D]
                                        [--drop NAME ...]
"""
import argparse
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_read import read_gguf  # noqa: E402

DTYPES = {0: np.float32, 1: np.float16, 27: np.int64}


def replace_string(out, key, old, new):
    """The value of string key `key` (old) overwritten in place by new, padded."""
    enc_old, enc_new = old.encode(), new.encode()
    if len(enc_new) > len(enc_old):
        sys.exit("patch_gguf: %s: %d bytes, at most %d fit" % (key, len(enc_new), len(enc_old)))
    pat = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", 8) + struct.pack("<Q", len(enc_old)) + enc_old
    at = out.find(pat)
    assert at >= 0, key
    at += len(pat) - len(enc_old)
    out[at:at + len(enc_old)] = enc_new.ljust(len(enc_old))


def relayout(buf, kv, infos, spans, drop):
    """The file's bytes without the tensors named in drop (every other tensor's data
    copied, offsets recomputed; the metadata's bytes as they were)."""
    for n in drop:
        assert n in infos, "no tensor %s" % n
    align = kv.get("general.alignment", 32)
    keep = [n for n in infos if n not in drop]  # (file order)
    head = bytearray(b"GGUF" + struct.pack("<IQQ", spans["version"], len(keep), spans["n_kv"]))
    head += buf[spans["kv"][0]:spans["kv"][1]]
    data, offs = bytearray(), {}
    for n in keep:
        t, shape, off = infos[n]
        nbytes = int(np.prod(shape)) * np.dtype(DTYPES[t]).itemsize
        data += b"\0" * (-len(data) % align)
        offs[n] = len(data)
        data += buf[off:off + nbytes]
    for n in keep:
        t, shape, _ = infos[n]
        head += struct.pack("<Q", len(n)) + n.encode() + struct.pack("<I", len(shape))
        head += b"".join(struct.pack("<Q", d) for d in reversed(shape)) + struct.pack("<IQ", t, offs[n])
    head += b"\0" * (-len(head) % align)
    return bytes(head + data)


def read_gguf_bytes(buf):
    import tempfile
    with tempfile.NamedTemporaryFile(suffix=".gguf") as f:
        f.write(buf)
        f.flush()
        return read_gguf(f.name)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("src")
    ap.add_argument("npz")
    ap.add_argument("dst")
    ap.add_argument("--name", default="")
    ap.add_argument("--description", default="")
    ap.add_argument("--drop", action="append", default=[])
    a = ap.parse_args()
    spans = {}
    kv, infos, buf = read_gguf(a.src, spans)
    if a.drop:
        buf = relayout(buf, kv, infos, spans, a.drop)
        kv, infos, buf = read_gguf_bytes(buf)
    out = bytearray(buf)
    w = np.load(a.npz)
    for name, (t, shape, off) in infos.items():
        arr = w[name]
        assert list(arr.shape) == shape, (name, arr.shape, shape)
        assert t in DTYPES, (name, "type %d" % t)
        b = arr.astype(DTYPES[t]).tobytes()
        out[off:off + len(b)] = b
    if a.name:
        replace_string(out, "general.name", kv["general.name"], a.name)
    if a.description:
        replace_string(out, "general.description", kv["general.description"], a.description)
    open(a.dst, "wb").write(out)
    print("wrote", a.dst, len(out), "bytes")


if __name__ == "__main__":
    main()
