#!/usr/bin/env python3
"""eagle.py - trains a feature-conditioned draft: a small decoder that sees the
target's last hidden state as well as the tokens (the idea of EAGLE, Li et al. 2024,
with its "training-time test" from EAGLE-3, 2025).

The draft ("fdraft"): dim d, n_layer llama layers, its own tied output head.  Row p
(token x_p at position p) takes

    x_in = tok_embd[x_p] + feat_in  . h_{p-1}      (h: the target's normed final hidden
                                                    state, known for verified positions)
    x_in = tok_embd[x_p] + feat_self . s_{p-1}     (s: the draft's own normed final state,
                                                    for positions it drafted itself)

runs the layers and predicts x_{p+1} from s_p = norm(x) through tok_embd^T.  When
drafting after a verification that ended with the target's token x_{t+1}, row t+1
uses the true h_t; rows t+2, t+3, ... use the draft's own states.  Training runs the
same thing: pass 1 with true features everywhere, pass j with the states of pass j-1
(and attention over exactly the keys inference would see), a forward-KL loss on the
target's distribution at every pass.

It reports, on the dev prompts' greedy continuations (never trained on), the mean
accepted length E[min(L, k)] of a chain of k drafted tokens for the new draft and for
the draft it started from, computed exactly as the engine's greedy acceptance would.

    python3 tools/distill/eagle.py --target T.gguf --init D.gguf --corpus C.npz --out DIR
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distill import Llama, check_refs, continue_greedy, kl_forward, optimizer, train_step  # noqa: E402


def shift_down(t, d, dim):
    """t moved d rows down along dim (row p gets row p - d; zeros in the first d)."""
    if d == 0:
        return t
    lead = t.narrow(dim, 0, t.shape[dim] - d)
    return torch.cat([torch.zeros_like(t.narrow(dim, 0, d)), lead], dim)


class FDraft(torch.nn.Module):
    def __init__(self, base, n_layer, feat_dim):
        super().__init__()
        self.dim, self.n_head, self.n_kv, self.hd = base.dim, base.n_head, base.n_kv, base.hd
        self.eps, self.base = base.eps, base.base
        self.n_layer, self.feat_dim = n_layer, feat_dim
        self.p = torch.nn.ParameterDict()
        keep = ["token_embd.weight", "output_norm.weight"]
        for n in base.names:
            if n in keep or any(n.startswith("blk.%d." % l) for l in range(n_layer)):
                self.p[n.replace(".", "__")] = torch.nn.Parameter(base.w(n).detach().clone().float())
        self.p["feat_in__weight"] = torch.nn.Parameter(torch.zeros(self.dim, feat_dim))
        self.p["feat_self__weight"] = torch.nn.Parameter(torch.zeros(self.dim, self.dim))

    def w(self, name):
        return self.p[name.replace(".", "__")]

    rope = Llama.rope
    norm = Llama.norm
    block = Llama.block
    causal = Llama.causal

    def names(self):
        return [k.replace("__", ".") for k in self.p.keys()]

    def passes(self, ids, feats, n_pass):
        """Training-time test.  ids [B, T], feats [B, T, F] (the target's h at every
        row).  Returns the logits of every pass, [n_pass] x [B, T, V]; pass s (0-based)
        at row p is the depth-(s+1) draft from the base row p - s."""
        B, T = ids.shape
        dev = ids.device
        emb = self.w("token_embd.weight")[ids]
        pos = torch.arange(T, device=dev)
        Ks = [[] for _ in range(self.n_layer)]
        Vs = [[] for _ in range(self.n_layer)]
        outs, state = [], None
        for s in range(n_pass):
            if s == 0:
                x = emb + shift_down(feats, 1, 1) @ self.w("feat_in.weight").T
            else:
                x = emb + shift_down(state, 1, 1) @ self.w("feat_self.weight").T
            for l in range(self.n_layer):
                def attend(q, k, v, l=l, s=s):
                    Ks[l].append(k)
                    Vs[l].append(v)
                    return self.ttt_attention(q, Ks[l], Vs[l], s)
                x = self.block(l, x, pos, attend)
            state = self.norm(x, self.w("output_norm.weight"))
            outs.append(state @ self.w("token_embd.weight").T)
        return outs

    def ttt_attention(self, q, K, V, s):
        """Pass s, row p (base row b = p - s): the keys of pass 0 at positions <= b
        (true features) and the key of pass j at position b + j for j = 1..s.  With
        self.hide_bos (eagle3.py), row 0's key is hidden from every other row."""
        B, H, T, hd = q.shape
        rep = self.n_head // self.n_kv
        scale = 1.0 / math.sqrt(hd)
        p = torch.arange(T, device=q.device)
        K0, V0 = K[0].repeat_interleave(rep, 1), V[0].repeat_interleave(rep, 1)
        sc = (q @ K0.transpose(-1, -2)) * scale
        ok = p[None, :] <= p[:, None] - s
        if getattr(self, "hide_bos", False):
            ok = ok & ((p[None, :] >= 1) | (p[:, None] == 0))
        sc = sc.masked_fill(~ok, float("-inf"))
        extra, vals = [], []
        for j in range(1, s + 1):
            d = s - j  # the key sits d rows above the query
            Kj = shift_down(K[j].repeat_interleave(rep, 1), d, 2)
            Vj = shift_down(V[j].repeat_interleave(rep, 1), d, 2)
            e = (q * Kj).sum(-1) * scale
            extra.append(e.masked_fill(~(p >= d), float("-inf"))[..., None])
            vals.append(Vj)
        P = torch.softmax(torch.cat([sc] + extra, -1), -1)
        out = P[..., :T] @ V0
        for j, Vj in enumerate(vals):
            out = out + P[..., T + j:T + j + 1] * Vj
        return out

    def _trunk(self, x):  # plain causal forward over input rows x [1, T, d] -> states
        pos = torch.arange(x.shape[1], device=x.device)
        for l in range(self.n_layer):
            x = self.block(l, x, pos, self.causal)
        return self.norm(x, self.w("output_norm.weight"))


def chain_lengths(correct):
    """correct [n_pass][B, T] bool (pass s, row p: the depth-(s+1) draft from base
    p - s is the target's token) -> L [B, T]: for base b, how many consecutive depths
    are right (at most n_pass)."""
    S = len(correct)
    B, T = correct[0].shape
    L = torch.zeros(B, T, dtype=torch.long, device=correct[0].device)
    alive = torch.ones(B, T, dtype=torch.bool, device=correct[0].device)
    for s in range(S):
        c = torch.zeros(B, T, dtype=torch.bool, device=correct[0].device)
        c[:, :T - s] = correct[s][:, s:]  # base b reads pass s at row b + s
        alive = alive & c
        L += alive.long()
    return L


@torch.no_grad()
def evaluate(target, fd, base_draft, seqs, n0, n_pass):
    """seqs [N, T]: BOS + prompt (n0 tokens in all) + the target's greedy continuation.
    Bases b >= n0 (the row of the target's first generated token onwards) with b +
    n_pass < T.  Returns (E[min(L,k)] for k = 1..n_pass) for fd and for base_draft."""
    feats = target.features(seqs)
    tgt = (feats @ target.out_weight().T).argmax(-1)  # [N, T]: the target's next token
    outs = fd.passes(seqs, feats, n_pass)
    L_fd = chain_lengths([o.argmax(-1) == tgt for o in outs])
    dl = base_draft(seqs).argmax(-1) == tgt  # teacher-forced: depth s from base b is row b + s
    L_b = chain_lengths([dl] * n_pass)
    T = seqs.shape[1]
    sel = slice(n0, T - n_pass)
    res = []
    for L in (L_fd, L_b):
        Ls = L[:, sel].float()
        res.append([Ls.clamp(max=k).mean().item() for k in range(1, n_pass + 1)])
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--init", required=True, help="the draft GGUF whose embedding and first layers start the new draft")
    ap.add_argument("--init-key", default="draft-xs")
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--refs", default="tests/data/refs-dev.jsonl")
    ap.add_argument("--prompts-len", type=int, default=128, help="continuation length for the dev evaluation")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--n-seq", type=int, default=32768)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--greedy-prefix", type=int, default=128)
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--decay", type=float, default=0.8, help="loss weight of pass s is decay^s")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default="", help="cache of the greedy-continued windows (.pt), made if missing")
    ap.add_argument("--check", action="store_true", help="check passes() against drafting one row at a time, and stop")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    target, base = Llama(a.target).to(dev), Llama(a.init).to(dev)
    target.requires_grad_(False)
    base.requires_grad_(False)
    fd = FDraft(base, a.layers, target.dim).to(dev)

    if a.check:  # random feature weights: passes() must give what one-at-a-time drafting gives
        with torch.no_grad():
            fd.w("feat_in.weight").normal_(0, 0.05)
            fd.w("feat_self.weight").normal_(0, 0.1)
            r = json.loads(open(a.refs).readline())
            ids = torch.tensor([r["prompt_ids"] + r["target_greedy_ids"]], device=dev)[:, :60]
            feats = target.features(ids)
            outs = fd.passes(ids, feats, 4)
            # inference, one row at a time: true features up to the base row, then the
            # draft's own states (the tokens forced to ids, as on an accepted path)
            for b in (5, 20, 40):
                xin = fd.w("token_embd.weight")[ids[:, :b + 1]] + torch.cat(
                    [torch.zeros(1, 1, fd.feat_dim, device=dev), feats[:, :b]], 1) @ fd.w("feat_in.weight").T
                for s in range(4):
                    st = fd._trunk(xin)
                    ref = st[0, -1] @ fd.w("token_embd.weight").T
                    err = (ref - outs[s][0, b + s]).abs().max().item()
                    print("base %d depth %d: max |logit diff| %.2e" % (b, s + 1, err))
                    assert err < 1e-3
                    xin = torch.cat([xin, fd.w("token_embd.weight")[ids[:, b + s + 1:b + s + 2]] +
                                     st[:, -1:] @ fd.w("feat_self.weight").T], 1)
        return

    check_refs({"target": target, a.init_key: base}, a.refs, dev)
    # dev sequences: prompt + the target's greedy continuation (evaluation only)
    rows = [json.loads(l) for l in open(a.refs)]
    n0 = len(rows[0]["prompt_ids"])
    pr = torch.tensor([r["prompt_ids"] for r in rows], device=dev)
    dev_seqs = continue_greedy(target, pr, n0 + a.prompts_len, 128, dev)
    pairs = [(int(dev_seqs[i, n0 + j]), t) for i, r in enumerate(rows)
             for j, t in enumerate(r["target_greedy_ids"][:a.prompts_len])]
    print("dev continuations: %d of %d greedy tokens equal the reference's" %
          (sum(x == y for x, y in pairs), len(pairs)), flush=True)

    t0 = time.time()
    if a.data and os.path.exists(a.data):
        data = torch.load(a.data).to(dev)
    else:
        arr = np.load(a.corpus)
        arr = arr["tokens"] if a.corpus.endswith(".npz") else arr
        toks = torch.from_numpy(arr.astype(np.int64))
        gen = torch.Generator().manual_seed(1)
        st = torch.randint(0, len(toks) - a.len, (a.n_seq,), generator=gen)
        w = torch.stack([toks[i:i + a.greedy_prefix - 1] for i in st.tolist()])
        pre = torch.cat([torch.zeros(a.n_seq, 1, dtype=torch.long), w], 1).to(dev)
        data = continue_greedy(target, pre, a.len, 4096, dev)
        if a.data:
            torch.save(data.cpu(), a.data)
    print("training text: %d windows of %d tokens (%d real + greedy) in %.0f s" %
          (data.shape[0], a.len, a.greedy_prefix, time.time() - t0), flush=True)
    t0 = time.time()
    with torch.no_grad():
        feats = torch.cat([target.features(data[i:i + 512]) for i in range(0, data.shape[0], 512)])
    print("target features %s in %.0f s" % (tuple(feats.shape), time.time() - t0), flush=True)

    def report(tag):
        e_fd, e_b = evaluate(target, fd, base, dev_seqs, n0, 8)
        print("%s: E[accepted | k=1..8] fdraft %s | %s %s" % (
            tag, " ".join("%.3f" % v for v in e_fd), a.init_key, " ".join("%.3f" % v for v in e_b)), flush=True)

    report("before")
    lo = a.greedy_prefix - 1
    wts = [a.decay ** s for s in range(a.passes)]
    opt, sched = optimizer(fd.parameters(), a.lr, a.steps, 200)
    t0 = time.time()
    step = 0
    out_w = target.out_weight()
    while step < a.steps and time.time() - t0 < a.minutes * 60:
        idx = torch.randint(0, data.shape[0], (a.batch,), device=dev)
        x, f = data[idx], feats[idx]
        with torch.no_grad():
            pt = torch.log_softmax(f @ out_w.T, -1)  # [B, T, V]
        outs = fd.passes(x, f, a.passes)
        loss = 0.0
        for s, o in enumerate(outs):  # base rows p - s >= lo
            loss = loss + wts[s] * kl_forward(pt[:, lo + s:], torch.log_softmax(o[:, lo + s:], -1))
        loss = loss / sum(wts)
        train_step(opt, sched, fd.parameters(), loss)
        step += 1
        if step % 500 == 0:
            print("step %d loss %.4f (%.0f s)" % (step, loss.item(), time.time() - t0), flush=True)
        if step % 3000 == 0:
            report("step %d" % step)
    print("trained %d steps in %.0f s" % (step, time.time() - t0), flush=True)
    report("after")
    os.makedirs(a.out, exist_ok=True)
    arrs = {n: fd.w(n).detach().float().cpu().numpy() for n in fd.names()}
    np.savez(os.path.join(a.out, "fdraft-%s-%dl.npz" % (a.init_key, a.layers)), **arrs)
    print("wrote", os.path.join(a.out, "fdraft-%s-%dl.npz" % (a.init_key, a.layers)), flush=True)


if __name__ == "__main__":
    main()
