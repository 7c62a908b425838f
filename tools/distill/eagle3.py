#!/usr/bin/env python3
"""eagle3.py - trains an EAGLE-3 draft head (Li et al. 2025) for the pycode target and
writes it in the layout tandem and llama.cpp read (architecture `eagle3`;
docs/DESIGN.md, "EAGLE-3 draft heads"; src/model/eagle3_forward.c is the forward this
file mirrors).

The head, as tandem runs it.  Feature id l is the residual stream entering target
layer l (l = the layer count: after the last layer, before the output norm); the
file's `eagle3.target_layers` name three of them.  Slot P of the head holds the row
(token x_{P+1}, g_P) at RoPE position P, where g_P = fc([f_a ; f_b ; f_c]_P) for a
position the target verified, or, for a position the head drafted itself, the
previous row's pre-norm block output.  The block:

    xe = rmsnorm(tok_embd[x], attn_norm)       xg = rmsnorm(g, attn_norm_2)
    q, k, v = [xe ; xg] W^T (RoPE on q, k)     x = g + attention(q, k, v) Wo^T
    x = x + ffn(rmsnorm(x, ffn_norm))          (x: the next row's g when drafting)
    logits = rmsnorm(x, output_norm) output^T  (row j scores target token d2t[j])

Here row p is (x_p, g_{p-1}) at position p: the same attention as tandem's slot p - 1
(RoPE depends only on the distance), with the BOS row (which has no slot) kept out
of every other row's keys.  Training runs the chain as inference would ("training-
time test", as eagle.py): pass 0 with the target's features everywhere, pass s with
the states of pass s - 1, attending to exactly the keys inference would see (`--check`
compares this with drafting one row at a time); loss: forward KL to the target's
next-token distribution restricted to the draft vocabulary, at every pass.

Draft vocabulary: the shape `tandem synth --shape eagle3-pycode` writes (2048 rows and
a d2t table): the 2048 tokens the target predicts most often on the training text.
The block starts as a copy of the target layer the last feature enters (its q / k /
v columns for g; zero for the embedding's), fc picks that feature, output_norm and
the output rows are the target's: the untrained head is that layer's logit lens.

It reports, on the dev prompts' greedy continuations (never trained on), the mean
accepted length E[min(L, k)] of greedy chains of k = 1..K drafted tokens for the head
and for a draft model (draft-xs), both computed as the engine's greedy acceptance
would, and writes the head's tensors (head.npz, for patch_gguf.py into a synth file).

    python3 tools/distill/eagle3.py --target T.gguf --draft D.gguf --head-gguf SYNTH.gguf \\
        --corpus C.npy --out DIR
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distill import Llama, check_refs, kl_forward  # noqa: E402
from eagle import FDraft, chain_lengths, shift_down  # noqa: E402
from gguf_read import read_gguf  # noqa: E402


def target_states(target, ids, layers):
    """ids [B, T] -> (the residual streams entering each of `layers`, concatenated
    [B, T, 3 dim]; the output head's input norm(x) [B, T, dim])."""
    x = target.w("token_embd.weight")[ids]
    pos = torch.arange(ids.shape[1], device=ids.device)
    feats = []
    for l in range(target.n_layer):
        if l in layers:
            feats.append(x)
        x = target.block(l, x, pos, target.causal)
    if target.n_layer in layers:
        feats.append(x)
    feats = [feats[sorted(layers).index(l)] for l in layers]  # in the file's order
    return torch.cat(feats, -1), target.norm(x, target.w("output_norm.weight"))


@torch.no_grad()
def greedy_extend(target, prefixes, length, batch):
    """Each row of prefixes continued greedily by the target to `length` tokens (one
    batched prefill of the prefix, then KV-cached steps)."""
    out = []
    for b0 in range(0, prefixes.shape[0], batch):
        pre = prefixes[b0:b0 + batch]
        nb, P = pre.shape
        ids = torch.zeros(nb, length, dtype=torch.long)
        ids[:, :P] = pre
        cache = [[torch.zeros(nb, target.n_kv, length, target.hd) for _ in range(2)] for _ in range(target.n_layer)]
        x = target.w("token_embd.weight")[pre]
        pos = torch.arange(P)
        for l in range(target.n_layer):
            def attend(q, k, v, l=l):
                cache[l][0][:, :, :P], cache[l][1][:, :, :P] = k, v
                return target.causal(q, k, v)
            x = target.block(l, x, pos, attend)
        ids[:, P] = target.head(x[:, -1:])[:, 0].argmax(-1)
        for t in range(P, length - 1):
            ids[:, t + 1] = target.step(ids[:, t], cache, t).argmax(-1)
        out.append(ids)
        print("  greedy windows %d / %d" % (b0 + nb, prefixes.shape[0]), flush=True)
    return torch.cat(out)


class Head(torch.nn.Module):
    def __init__(self, target, layers, d2t, n_ff):
        super().__init__()
        E = target.dim
        self.dim, self.n_head, self.n_kv, self.hd = E, target.n_head, target.n_kv, target.hd
        self.eps, self.base = target.eps, target.base
        self.layers = layers
        self.register_buffer("tok_embd", target.w("token_embd.weight").detach().clone())  # the target's (borrowed)
        self.register_buffer("d2t", d2t.clone())
        qd, kvd = self.n_head * self.hd, self.n_kv * self.hd
        src = "blk.%d." % layers[-1]  # the layer the last feature enters
        tw = lambda n: target.w(src + n).detach().clone().float()  # noqa: E731
        P = torch.nn.Parameter
        fc = torch.zeros(E, 3 * E)
        fc[:, 2 * E:] = torch.eye(E)
        self.fc = P(fc)                                                   # [E, 3E]
        self.attn_norm = P(torch.ones(E))                                 # on the embedding
        self.hidden_norm = P(tw("attn_norm.weight"))                      # attn_norm_2, on g
        self.wq = P(torch.cat([torch.zeros(qd, E), tw("attn_q.weight")], 1))    # [qd, 2E]
        self.wk = P(torch.cat([torch.zeros(kvd, E), tw("attn_k.weight")], 1))   # [kvd, 2E]
        self.wv = P(torch.cat([torch.zeros(kvd, E), tw("attn_v.weight")], 1))   # [kvd, 2E]
        self.wo = P(tw("attn_output.weight"))                             # [E, qd]
        self.ffn_norm = P(tw("ffn_norm.weight"))
        self.gate, self.up, self.down = P(tw("ffn_gate.weight")), P(tw("ffn_up.weight")), P(tw("ffn_down.weight"))
        assert self.gate.shape[0] == n_ff, (self.gate.shape, n_ff)
        self.output_norm = P(target.w("output_norm.weight").detach().clone().float())
        self.output = P(target.out_weight().detach()[d2t].clone().float())  # [Vd, E]

    rope = Llama.rope
    ttt_attention = FDraft.ttt_attention
    hide_bos = True  # row 0 (BOS) has no slot in tandem: no other row sees its key

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def block(self, emb, g, pos, attend):
        """emb, g [B, T, E] -> the block's output x [B, T, E] (pre-norm)."""
        B, T, E = g.shape
        h = torch.cat([self.norm(emb, self.attn_norm), self.norm(g, self.hidden_norm)], -1)
        q = (h @ self.wq.T).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = (h @ self.wk.T).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = (h @ self.wv.T).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        o = attend(self.rope(q, pos), self.rope(k, pos), v)
        x = g + o.transpose(1, 2).reshape(B, T, E) @ self.wo.T
        u = self.norm(x, self.ffn_norm)
        return x + (F.silu(u @ self.gate.T) * (u @ self.up.T)) @ self.down.T

    def logits(self, x):  # [..., E] -> [..., Vd]
        return self.norm(x, self.output_norm) @ self.output.T

    def passes(self, ids, feats, n_pass, states=False):
        """Training-time test.  ids [B, T], feats [B, T, 3E] (the target's features at
        every row).  Returns the logits of every pass, [n_pass] x [B, T, Vd] (or, with
        states, the block outputs [B, T, E] they come from); pass s at row p is the
        depth-(s+1) draft from the base row p - s (row p reads token x_p)."""
        T = ids.shape[1]
        emb = self.tok_embd[ids]
        pos = torch.arange(T, device=ids.device)
        K, V, outs, x = [], [], [], None
        g0 = feats @ self.fc.T
        for s in range(n_pass):
            g = shift_down(g0 if s == 0 else x, 1, 1)

            def attend(q, k, v, s=s):
                K.append(k)
                V.append(v)
                return self.ttt_attention(q, K, V, s)
            x = self.block(emb, g, pos, attend)
            outs.append(x if states else self.logits(x))
        return outs

    def names_tensors(self):
        """The file's tensors by name (rows first)."""
        return [("fc.weight", self.fc), ("output_norm.weight", self.output_norm), ("output.weight", self.output),
                ("d2t", self.d2t), ("blk.0.attn_norm.weight", self.attn_norm),
                ("blk.0.attn_norm_2.weight", self.hidden_norm), ("blk.0.attn_q.weight", self.wq),
                ("blk.0.attn_k.weight", self.wk), ("blk.0.attn_v.weight", self.wv),
                ("blk.0.attn_output.weight", self.wo), ("blk.0.ffn_norm.weight", self.ffn_norm),
                ("blk.0.ffn_gate.weight", self.gate), ("blk.0.ffn_up.weight", self.up),
                ("blk.0.ffn_down.weight", self.down)]

    def names_arrays(self):
        """The file's tensors as arrays (float32; d2t int64)."""
        return {n: t.detach().cpu().numpy().astype(np.int64 if n == "d2t" else np.float32)
                for n, t in self.names_tensors()}


def check_passes(head, target, ids):
    """passes() against drafting one row at a time as tandem does (true g up to the
    base row, then each drafted row's g = the previous row's block output)."""
    with torch.no_grad():
        for prm in (head.wq, head.wk, head.wv):  # the embedding half too
            prm[:, :head.dim].normal_(0, 0.05)
        feats, _ = target_states(target, ids, head.layers)
        outs = head.passes(ids, feats, 4)
        emb = head.tok_embd[ids]
        g0 = shift_down(feats @ head.fc.T, 1, 1)
        worst = 0.0
        for b in (5, 20, 40):
            # rows 1..b (row 0, BOS, has no slot in tandem), then drafted rows
            e, g = emb[:, 1:b + 1], g0[:, 1:b + 1]
            for s in range(4):
                pos = torch.arange(1, e.shape[1] + 1)
                x = head.block(e, g, pos, lambda q, k, v: F.scaled_dot_product_attention(
                    q, k.repeat_interleave(head.n_head // head.n_kv, 1),
                    v.repeat_interleave(head.n_head // head.n_kv, 1), is_causal=True))
                err = (head.logits(x[0, -1]) - outs[s][0, b + s]).abs().max().item()
                worst = max(worst, err)
                e = torch.cat([e, emb[:, b + s + 1:b + s + 2]], 1)
                g = torch.cat([g, x[:, -1:]], 1)
        print("check: passes() against one row at a time, worst |logit diff| %.2e" % worst, flush=True)
        assert worst < 1e-3


@torch.no_grad()
def evaluate(target, head, draft, seqs, n0, n_pass, layers):
    """seqs [N, T]: BOS + prompt (n0 tokens in all) + the target's greedy continuation.
    Bases b >= n0 with b + n_pass < T.  Returns E[min(L, k)], k = 1..n_pass, for the
    head and for the draft model."""
    feats, hfin = target_states(target, seqs, layers)
    tgt = (hfin @ target.out_weight().T).argmax(-1)  # [N, T]: the target's next token
    outs = head.passes(seqs, feats, n_pass)
    L_h = chain_lengths([head.d2t[o.argmax(-1)] == tgt for o in outs])
    dl = draft(seqs).argmax(-1) == tgt  # teacher-forced: depth s from base b is row b + s
    L_d = chain_lengths([dl] * n_pass)
    sel = slice(n0, seqs.shape[1] - n_pass)
    return [[L[:, sel].float().clamp(max=k).mean().item() for k in range(1, n_pass + 1)] for L in (L_h, L_d)]


def load_head(target, layers, n_ff, path):
    """A Head with the tensors of a head.npz (no d2t: the whole vocabulary, the
    target's output head)."""
    w = np.load(path)
    full = "d2t" not in w
    n_vocab = target.w("token_embd.weight").shape[0]
    head = Head(target, layers, torch.arange(n_vocab) if full else torch.from_numpy(w["d2t"]), n_ff)
    with torch.no_grad():
        for n, t in head.names_tensors():
            if n in w:
                t.copy_(torch.from_numpy(w[n]))
            else:
                assert full and n in ("output.weight", "d2t"), n
    return head


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True, help="the draft model to compare with (draft-xs)")
    ap.add_argument("--draft-key", default="draft-xs")
    ap.add_argument("--head-gguf", required=True, help="a head of the wanted shape (tandem synth --shape eagle3-pycode)")
    ap.add_argument("--refs", default="tests/data/refs-dev.jsonl")
    ap.add_argument("--prompts-len", type=int, default=64, help="continuation length for the dev evaluation (up to 64: "
                    "the references' own greedy continuations, else the target continues the prompts)")
    ap.add_argument("--corpus", required=True, help="token ids (.npy, make_corpus.py)")
    ap.add_argument("--n-seq", type=int, default=384)
    ap.add_argument("--len", type=int, default=160)
    ap.add_argument("--greedy-prefix", type=int, default=128)
    ap.add_argument("--passes", type=int, default=4)
    ap.add_argument("--crop", type=int, default=64, help="rows of a window per training sequence (a random crop)")
    ap.add_argument("--loss-rows", type=int, default=24, help="rows per sequence and pass the loss judges (random; "
                    "the output head's product is most of a step's cost on a CPU)")
    ap.add_argument("--skip-before", action="store_true", help="skip the untrained head's evaluation")
    ap.add_argument("--decay", type=float, default=0.8, help="loss weight of pass s is decay^s")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-k", type=int, default=6)
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default="", help="cache of the training windows (.pt), made if missing")
    ap.add_argument("--full-vocab", action="store_true", help="score the whole vocabulary with the target's own "
                    "output head (the file then has no output.weight and no d2t) instead of the synth head's "
                    "draft vocabulary and own output rows")
    ap.add_argument("--skip-refs", action="store_true", help="skip the check against the reference logits")
    ap.add_argument("--check", action="store_true", help="check passes() against one row at a time, and stop")
    ap.add_argument("--eval-only", default="", help="a head.npz to evaluate (no training)")
    ap.add_argument("--resume", default="", help="a head.npz to start from (its d2t too)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    target = Llama(a.target)
    target.requires_grad_(False)
    kv, infos, _ = read_gguf(a.head_gguf)
    layers = list(kv["eagle3.target_layers"])
    n_vocab = target.w("token_embd.weight").shape[0]
    n_vd = n_vocab if a.full_vocab or "d2t" not in infos else infos["d2t"][1][0]
    n_ff = kv["eagle3.feed_forward_length"]
    assert kv["eagle3.target_hidden_size"] == target.dim and kv["eagle3.embedding_length"] == target.dim
    assert "token_embd.weight" not in infos, "this script trains heads that borrow the target's embedding"
    print("head: feature layers %s, draft vocabulary %d, n_ff %d" % (layers, n_vd, n_ff), flush=True)

    if a.check:
        r = json.loads(open(a.refs).readline())
        ids = torch.tensor([r["prompt_ids"] + r["target_greedy_ids"]])[:, :60]
        check_passes(Head(target, layers, torch.arange(n_vd), n_ff), target, ids)
        return

    draft = Llama(a.draft)
    draft.requires_grad_(False)
    if not a.skip_refs:
        check_refs({"target": target, a.draft_key: draft}, a.refs, "cpu")
    rows = [json.loads(l) for l in open(a.refs)]
    n0 = len(rows[0]["prompt_ids"])
    if a.prompts_len <= len(rows[0]["target_greedy_ids"]):
        dev_seqs = torch.tensor([r["prompt_ids"] + r["target_greedy_ids"][:a.prompts_len] for r in rows])
    else:
        dev_seqs = greedy_extend(target, torch.tensor([r["prompt_ids"] for r in rows]), n0 + a.prompts_len, 128)
    pairs = [(int(dev_seqs[i, n0 + j]), t) for i, r in enumerate(rows)
             for j, t in enumerate(r["target_greedy_ids"][:a.prompts_len])]
    print("dev continuations: %d of %d greedy tokens equal the reference's" %
          (sum(x == y for x, y in pairs), len(pairs)), flush=True)
    os.makedirs(a.out, exist_ok=True)

    if a.eval_only:
        head = load_head(target, layers, n_ff, a.eval_only)
        e_h, e_d = evaluate(target, head, draft, dev_seqs, n0, a.eval_k, layers)
        print("E[accepted | k=1..%d] head %s | %s %s" % (a.eval_k, " ".join("%.3f" % v for v in e_h), a.draft_key,
                                                          " ".join("%.3f" % v for v in e_d)), flush=True)
        return

    # training text: windows of real code (after a BOS), continued greedily by the target
    t0 = time.time()
    if a.data and os.path.exists(a.data):
        data = torch.load(a.data)
    else:
        toks = torch.from_numpy(np.load(a.corpus).astype(np.int64))
        gen = torch.Generator().manual_seed(1)
        st = torch.randint(0, len(toks) - a.greedy_prefix, (a.n_seq,), generator=gen)
        pre = torch.cat([torch.zeros(a.n_seq, 1, dtype=torch.long),
                         torch.stack([toks[i:i + a.greedy_prefix - 1] for i in st.tolist()])], 1)
        data = greedy_extend(target, pre, a.len, 256)
        if a.data:
            torch.save(data, a.data)
    print("training text: %d windows of %d tokens (%d real + greedy) in %.0f s" %
          (data.shape[0], a.len, a.greedy_prefix, time.time() - t0), flush=True)
    t0 = time.time()
    fcache = a.data[:-3] + "-feats.pt" if a.data else ""
    if fcache and os.path.exists(fcache):
        feats, hfin, nxt = torch.load(fcache)
    else:
        with torch.no_grad():
            fs, hs = zip(*[target_states(target, data[i:i + 64], layers) for i in range(0, data.shape[0], 64)])
            feats, hfin = torch.cat(fs), torch.cat(hs)
            nxt = torch.cat([(hfin[i:i + 64] @ target.out_weight().T).argmax(-1) for i in range(0, data.shape[0], 64)])
        if fcache:
            torch.save((feats, hfin, nxt), fcache)
    # the draft vocabulary: the tokens the target predicts most often on the training text
    cnt = torch.bincount(nxt.flatten(), minlength=n_vocab)
    d2t = cnt.topk(n_vd).indices.sort().values
    cover = cnt[d2t].sum().item() / cnt.sum().item()
    dev_next = torch.tensor([t for r in rows for t in r["target_greedy_ids"]])
    in_vd = torch.zeros(cnt.shape[0], dtype=torch.bool)
    in_vd[d2t] = True
    print("target features %s in %.0f s; draft vocabulary covers %.4f of the training text's next tokens, "
          "%.4f of the dev continuations'" % (tuple(feats.shape), time.time() - t0, cover,
                                              in_vd[dev_next].float().mean().item()), flush=True)

    head = load_head(target, layers, n_ff, a.resume) if a.resume else Head(target, layers, d2t, n_ff)
    if a.full_vocab:
        head.output.requires_grad_(False)  # the target's own head, not written
    out_vd = target.out_weight()[d2t]  # [Vd, E]: the target's logits on the draft vocabulary

    def report(tag):
        e_h, e_d = evaluate(target, head, draft, dev_seqs, n0, a.eval_k, layers)
        print("%s: E[accepted | k=1..%d] head %s | %s %s" % (tag, a.eval_k, " ".join("%.3f" % v for v in e_h),
                                                            a.draft_key, " ".join("%.3f" % v for v in e_d)), flush=True)
        return e_h

    def save(tag):
        arrs = head.names_arrays()
        if a.full_vocab:  # the target's head scores every token: no output rows, no d2t
            del arrs["output.weight"], arrs["d2t"]
        np.savez(os.path.join(a.out, "head.npz"), **arrs)
        print("saved %s (%s)" % (os.path.join(a.out, "head.npz"), tag), flush=True)

    if not a.skip_before:
        report("before")
    wts = [a.decay ** s for s in range(a.passes)]
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0)
    t0, step, last_save = time.time(), 0, time.time()
    lo = 8  # first base row judged (a few tokens of context)
    while True:
        frac = (time.time() - t0) / (a.minutes * 60)
        if frac >= 1:
            break
        for gr in opt.param_groups:  # linear warm-up over 50 steps, cosine decay over the time budget
            gr["lr"] = a.lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * frac))
        idx = torch.randint(0, data.shape[0], (a.batch,))
        c0 = int(torch.randint(0, data.shape[1] - a.crop + 1, (1,)))
        x, f, hf = data[idx, c0:c0 + a.crop], feats[idx, c0:c0 + a.crop], hfin[idx, c0:c0 + a.crop]
        rows = (lo + a.passes - 1 + torch.randperm(a.crop - lo - a.passes + 1)[:a.loss_rows]).sort().values
        with torch.no_grad():
            pt = torch.log_softmax(hf[:, rows] @ out_vd.T, -1)  # [B, R, Vd]
        outs = head.passes(x, f, a.passes, states=True)
        loss = 0.0
        for s, o in enumerate(outs):  # pass s, row p: base p - s >= lo (a crop's row 0 acts as its BOS)
            loss = loss + wts[s] * kl_forward(pt, torch.log_softmax(head.logits(o[:, rows]), -1))
        loss = loss / sum(wts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 50 == 0:
            print("step %d loss %.4f lr %.2e (%.0f s)" % (step, loss.item(), opt.param_groups[0]["lr"],
                                                         time.time() - t0), flush=True)
        if time.time() - last_save > 300:
            save("step %d" % step)
            last_save = time.time()
    print("trained %d steps (%d windows) in %.0f s" % (step, step * a.batch, time.time() - t0), flush=True)
    save("final, step %d" % step)
    report("after")


if __name__ == "__main__":
    main()
