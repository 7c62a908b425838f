#!/usr/bin/env python3
"""xcheck_eagle3_ref.py - a third opinion for bench/xcheck_eagle3.py: one step's
EAGLE-3 chain recomputed in float64 with numpy (no KV cache, no f16 rounding of
activations), with the margin between the best and second-best draft logit at each
depth, to tell a genuine disagreement of tandem and llama.cpp from a near-tie that
their f16 KV caches and summation orders break differently.

The forward is the one docs/DESIGN.md ("EAGLE-3 draft heads") and llama.cpp's
src/models/eagle3.cpp describe: features = the residual streams entering the target
layers `eagle3.target_layers`; slot P of the head holds (token P+1, g_P) at RoPE P,
g_P = fc(features_P) for a committed position, the previous slot's pre-norm output
for a drafted one; logits = output(rmsnorm(x)), row j scoring target id d2t[j];
norm_before_fc (rmsnorm of the features, enc.output_norm, before fc) and
norm_before_residual (the block's residual is rmsnorm(g)) as llama.cpp reads them.
Llama targets with tied or own output head, "normal" (adjacent-pair) RoPE.

    python3 bench/xcheck_eagle3_ref.py --target T.gguf --head H.gguf --run OUT --prompt 2 --at 35 -k 4
(OUT: the --out folder of xcheck_eagle3.py; the prompt's ids and the committed
output are read from its tandem_spec.out and llama_spec.out.)  It also prints the
target's best two logits for generated token at - 1 (--at 1: the first).
"""
import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "distill"))
from gguf_read import read_gguf  # noqa: E402


def load(path):
    kv, infos, buf = read_gguf(path)
    w = {}
    for name, (t, shape, off) in infos.items():
        dt = {0: np.float32, 1: np.float16, 27: np.int64}[t]
        a = np.frombuffer(buf, dtype=dt, count=int(np.prod(shape)), offset=off).reshape(shape)
        w[name] = a if t == 27 else a.astype(np.float64)
    return kv, w


def rmsnorm(x, g, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * g


def rope(x, pos, base):
    """x [T, heads, d]: adjacent pairs (2i, 2i+1) rotated by pos * base^(-2i/d)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2) / d)
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def attention(q, k, v, pos_q, pos_k, n_kv):
    """q [Tq, H, d], k / v [Tk, Hkv, d]; causal by position."""
    rep = q.shape[1] // n_kv
    k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(q.shape[-1])
    s = np.where(pos_k[None, None, :] <= pos_q[None, :, None], s, -np.inf)
    s = np.exp(s - s.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", s, v)


def ffn(x, w, blk):
    g, u = x @ w[blk + "ffn_gate.weight"].T, x @ w[blk + "ffn_up.weight"].T
    return (g / (1 + np.exp(-g)) * u) @ w[blk + "ffn_down.weight"].T


def target_forward(kv, w, ids, layers):
    """(the features of every row [T, 3E], the logits of the last row)."""
    arch = kv["general.architecture"]
    L, H, Hkv = kv[arch + ".block_count"], kv[arch + ".attention.head_count"], kv[arch + ".attention.head_count_kv"]
    eps, base = kv[arch + ".attention.layer_norm_rms_epsilon"], kv.get(arch + ".rope.freq_base", 10000.0)
    x = w["token_embd.weight"][ids]
    T, E = x.shape
    d = E // H
    pos = np.arange(T, dtype=np.float64)
    feats = {}
    for l in range(L):
        feats[l] = x.copy()
        b = "blk.%d." % l
        h = rmsnorm(x, w[b + "attn_norm.weight"], eps)
        q = rope((h @ w[b + "attn_q.weight"].T).reshape(T, H, d), pos, base)
        k = rope((h @ w[b + "attn_k.weight"].T).reshape(T, Hkv, d), pos, base)
        v = (h @ w[b + "attn_v.weight"].T).reshape(T, Hkv, d)
        x = x + attention(q, k, v, pos, pos, Hkv).reshape(T, E) @ w[b + "attn_output.weight"].T
        x = x + ffn(rmsnorm(x, w[b + "ffn_norm.weight"], eps), w, b)
    feats[L] = x
    out_w = w.get("output.weight", w["token_embd.weight"])
    logits = rmsnorm(x[-1], w["output_norm.weight"], eps) @ out_w.T
    return np.concatenate([feats[l] for l in layers], -1), logits


def head_chain(kv, w, tw, feats, ids, k):
    """The head's greedy chain of k tokens after committed ids (the target's features
    of all but the last); per depth (token, [(logit, id) of the best two])."""
    H, Hkv = kv["eagle3.attention.head_count"], kv["eagle3.attention.head_count_kv"]
    eps, base = kv["eagle3.attention.layer_norm_rms_epsilon"], kv.get("eagle3.rope.freq_base", 10000.0)
    E = kv["eagle3.embedding_length"]
    d = E // H
    embd = w.get("token_embd.weight", tw["token_embd.weight"])
    out_w = w.get("output.weight", tw.get("output.weight", tw["token_embd.weight"]))
    d2t = w.get("d2t", np.arange(out_w.shape[0]))
    b = "blk.0."
    wq, wk, wv = w[b + "attn_q.weight"], w[b + "attn_k.weight"], w[b + "attn_v.weight"]
    toks = list(ids[1:])        # slot P: token P + 1
    if kv.get("eagle3.norm_before_fc", False):
        feats = rmsnorm(feats, w["enc.output_norm.weight"], eps)
    g = feats @ w["fc.weight"].T  # g_P for P = 0 .. len(ids) - 2
    K, V = [], []
    chain = []
    P = 0
    for depth in range(k + 1):
        n = len(toks) - P if depth == 0 else 1
        xs_t, xs_g = np.array(toks[P:P + n]), g[P:P + n]
        pos = np.arange(P, P + n, dtype=np.float64)
        xe, xg = rmsnorm(embd[xs_t], w[b + "attn_norm.weight"], eps), rmsnorm(xs_g, w[b + "attn_norm_2.weight"], eps)
        cat = np.concatenate([xe, xg], -1)
        q = rope((cat @ wq.T).reshape(n, H, d), pos, base)
        K.append(rope((cat @ wk.T).reshape(n, Hkv, d), pos, base))
        V.append((cat @ wv.T).reshape(n, Hkv, d))
        Kc, Vc = np.concatenate(K), np.concatenate(V)
        res = xg if kv.get("eagle3.norm_before_residual", False) else xs_g
        x = res + attention(q, Kc, Vc, pos, np.arange(len(Kc), dtype=np.float64), Hkv).reshape(n, E) @ w[b + "attn_output.weight"].T
        x = x + ffn(rmsnorm(x, w[b + "ffn_norm.weight"], eps), w, b)
        if depth == k:
            break
        logits = rmsnorm(x[-1], w["output_norm.weight"], eps) @ out_w.T
        top = np.argsort(-logits)[:2]
        t = int(d2t[top[0]])
        chain.append((t, [(float(logits[j]), int(d2t[j])) for j in top]))
        P += n
        toks.append(t)
        g = np.concatenate([g, x[-1:]])
    return chain


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="models/pycode-target-f16.gguf")
    ap.add_argument("--head", required=True)
    ap.add_argument("--run", required=True, help="xcheck_eagle3.py's --out folder")
    ap.add_argument("--prompt", type=int, required=True, help="prompt index in the run")
    ap.add_argument("--at", type=int, required=True, help="tokens generated before the step")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--output", choices=("tandem", "llama"), default="tandem", help="whose output to continue")
    args = ap.parse_args()
    prompt = out = None
    for line in open(os.path.join(args.run, "llama_spec.out")):
        f = line.split()
        if f[:2] == ["P", str(args.prompt)]:
            prompt = [int(x) for x in f[2:]]
        if f[:2] == ["O", str(args.prompt)] and args.output == "llama":
            out = [int(x) for x in f[2:]]
    if args.output == "tandem":
        for line in open(os.path.join(args.run, "tandem_spec.out")):
            j = json.loads(line)
            if j["id"] == args.prompt:
                out = j["tokens"]
    ids = np.array(prompt + out[:args.at])
    tkv, tw = load(args.target)
    hkv, hw = load(args.head)
    feats, logits = target_forward(tkv, tw, ids[:-1], hkv["eagle3.target_layers"])
    top = np.argsort(-logits)[:2]
    print("target, generated token %d: %d (logit %.6f), second %d (%.6f), margin %.3g" % (
        args.at - 1, top[0], logits[top[0]], top[1], logits[top[1]], logits[top[0]] - logits[top[1]]))
    for depth, (t, top) in enumerate(head_chain(hkv, hw, tw, feats, ids, args.k)):
        (l0, t0), (l1, t1) = top
        print("depth %d: %d (logit %.6f), second %d (%.6f), margin %.3g (relative %.3g)" % (
            depth + 1, t0, l0, t1, l1, l0 - l1, (l0 - l1) / max(abs(l0), 1e-30)))


if __name__ == "__main__":
    main()
