"""gguf_read.py - the few parts of a GGUF file distill.py and patch_gguf.py need:
metadata, tensor infos (type, shape rows first, absolute offset) and f16/f32 data,
and where the metadata lies (for patch_gguf.py's rewrite without some tensors)."""
import struct

import numpy as np

GGUF_TYPES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


def read_gguf(path, spans=None):
    """(kv dict, {name: (ggml_type, shape rows-first, byte offset)}, bytes).  spans,
    a dict if given, gets "version" and "kv" (the metadata's byte range)."""
    buf = open(path, "rb").read()
    off = 0

    def take(fmt):
        nonlocal off
        v = struct.unpack_from("<" + fmt, buf, off)
        off += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal off
        n = take("Q")
        s = buf[off:off + n].decode("utf-8", errors="replace")
        off += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            it, n = take("I"), take("Q")
            return [value(it) for _ in range(n)]
        return take(GGUF_TYPES[t])

    assert buf[:4] == b"GGUF", path
    off = 4
    version = take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    kv = {}
    kv0 = off
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    if spans is not None:
        spans.update(version=version, kv=(kv0, off), n_kv=n_kv)
    infos = []
    for _ in range(n_tensors):
        name = string()
        nd = take("I")
        ne = [take("Q") for _ in range(nd)]
        t = take("I")
        o = take("Q")
        infos.append((name, t, list(reversed(ne)), o))
    align = kv.get("general.alignment", 32)
    data0 = (off + align - 1) // align * align
    return kv, {n: (t, shape, data0 + o) for n, t, shape, o in infos}, buf


def tensor(buf, info):
    t, shape, o = info
    dt = {0: np.float32, 1: np.float16}[t]
    n = int(np.prod(shape))
    return np.frombuffer(buf, dtype=dt, count=n, offset=o).reshape(shape).astype(np.float32)


