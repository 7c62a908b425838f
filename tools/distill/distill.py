#!/usr/bin/env python3
"""distill.py - distils a draft model from the target on the target's own text.

Runs on a machine with a CUDA GPU and PyTorch (the `device` tool).  Steps:
  1. load the target and the draft from their GGUF files (f16/f32 tensors, llama
     architecture as tandem's models/README.md describes it);
  2. check the PyTorch forward against the transformers reference logits in
     tests/data/refs-dev.jsonl (the next-token top-8 of every dev prompt, for the
     target and the draft);
  3. take the training text: windows of a corpus of real code given as token ids
     (--corpus; tools/distill/data holds the Python standard library's modules
     tokenized), or text sampled from the target itself from BOS alone.  No dev
     prompt is ever used for training: they are the benchmark;
  4. train the draft to match the target's next-token distribution on that text
     (forward KL, temperature 1), keeping its architecture and vocabulary;
  5. report the greedy agreement (draft argmax == target argmax) on held-out sampled
     text before and after, and write the new weights (float32 .npy per tensor).

    python3 tools/distill/distill.py --target T.gguf --draft D.gguf --out DIR
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
from gguf_read import read_gguf, tensor  # noqa: E402

# ---------------------------------------------------------------- the model


class Llama(torch.nn.Module):
    def __init__(self, path):
        super().__init__()
        kv, infos, buf = read_gguf(path)
        a = kv["general.architecture"]
        self.dim = kv[a + ".embedding_length"]
        self.n_layer = kv[a + ".block_count"]
        self.n_head = kv[a + ".attention.head_count"]
        self.n_kv = kv.get(a + ".attention.head_count_kv", self.n_head)
        self.eps = kv.get(a + ".attention.layer_norm_rms_epsilon", 1e-5)
        self.base = kv.get(a + ".rope.freq_base", 10000.0)
        self.hd = self.dim // self.n_head
        self.names = [n for n in infos]
        self.types = {n: infos[n][0] for n in infos}
        self.p = torch.nn.ParameterDict()
        for n in infos:
            self.p[n.replace(".", "__")] = torch.nn.Parameter(torch.from_numpy(tensor(buf, infos[n]).copy()))

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def rope(self, x, pos):  # x [B, H, T, hd]; pairs of adjacent elements (GGUF "normal")
        inv = self.base ** (-torch.arange(0, self.hd, 2, device=x.device, dtype=torch.float32) / self.hd)
        ang = pos[:, None].float() * inv[None, :]
        c, s = ang.cos(), ang.sin()
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * c - x2 * s, x1 * s + x2 * c], -1).flatten(-2)

    def norm(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def forward(self, ids):  # ids [B, T] -> logits [B, T, V]
        return self.head(self.hidden(ids))

    def features(self, ids):  # ids [B, T] -> the output head's input, norm(x) [B, T, dim]
        return self.norm(self.hidden(ids), self.w("output_norm.weight"))

    def out_weight(self):
        return self.w("output.weight") if "output.weight" in self.names else self.w("token_embd.weight")

    def block(self, l, x, pos, attend):
        """Layer l on x [B, T, dim] at positions pos; attend(q, k, v) -> [B, n_head, T, hd]
        gets q [B, n_head, T, hd] and k, v [B, n_kv, T, hd], RoPE applied."""
        B, T, _ = x.shape
        pre = "blk.%d." % l
        h = self.norm(x, self.w(pre + "attn_norm.weight"))
        q = (h @ self.w(pre + "attn_q.weight").T).view(B, T, self.n_head, self.hd).transpose(1, 2)
        k = (h @ self.w(pre + "attn_k.weight").T).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        v = (h @ self.w(pre + "attn_v.weight").T).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        o = attend(self.rope(q, pos), self.rope(k, pos), v)
        x = x + o.transpose(1, 2).reshape(B, T, self.dim) @ self.w(pre + "attn_output.weight").T
        h = self.norm(x, self.w(pre + "ffn_norm.weight"))
        g = h @ self.w(pre + "ffn_gate.weight").T
        u = h @ self.w(pre + "ffn_up.weight").T
        return x + (F.silu(g) * u) @ self.w(pre + "ffn_down.weight").T

    def causal(self, q, k, v, is_causal=True):  # grouped-query attention over k, v
        rep = self.n_head // self.n_kv
        return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                              is_causal=is_causal)

    def hidden(self, ids):  # ids [B, T] -> the last layer's output, before the final norm
        x = self.w("token_embd.weight")[ids]
        pos = torch.arange(ids.shape[1], device=ids.device)
        for l in range(self.n_layer):
            x = self.block(l, x, pos, self.causal)
        return x

    def head(self, x):
        return self.norm(x, self.w("output_norm.weight")) @ self.out_weight().T

    def step(self, ids, cache, t):
        """One new token per sequence at position t (ids [B]); cache: per layer [k, v]."""
        x = self.w("token_embd.weight")[ids][:, None]
        pos = torch.tensor([t], device=ids.device)

        def cached(l):
            def attend(q, k, v):
                cache[l][0][:, :, t] = k[:, :, 0]
                cache[l][1][:, :, t] = v[:, :, 0]
                return self.causal(q, cache[l][0][:, :, :t + 1], cache[l][1][:, :, :t + 1], False)
            return attend

        for l in range(self.n_layer):
            x = self.block(l, x, pos, cached(l))
        return self.head(x)[:, 0]


# ---------------------------------------------------------------- steps


def check_refs(models, refs_path, dev):
    rows = [json.loads(l) for l in open(refs_path)]
    for key, m in models.items():
        worst = 0.0
        agree = 0
        for r in rows:
            ids = torch.tensor([r["prompt_ids"]], device=dev)
            with torch.no_grad():
                lg = m(ids)[0, -1].double().cpu().numpy()
            ref = r[key + "_top8_next"]
            agree += int(np.argmax(lg)) == ref[0][0]
            for tok, val in ref:
                worst = max(worst, abs(lg[tok] - val) / (1.0 + abs(val)))
        print("check %-9s: worst relative logit error %.2e, top-1 %d/%d" % (key, worst, agree, len(rows)), flush=True)
        assert worst < 1e-3 and agree == len(rows), key


@torch.no_grad()
def extend(target, prefixes, length, batch, temp, gen, dev):
    """Each row of prefixes continued by the target to `length` tokens: sampled at
    temperature temp from gen, or greedily when temp is 0."""
    out = []
    for b0 in range(0, prefixes.shape[0], batch):
        pre = prefixes[b0:b0 + batch]
        nb, p = pre.shape
        ids = torch.zeros(nb, length, dtype=torch.long, device=dev)
        ids[:, :p] = pre
        cache = [[torch.zeros(nb, target.n_kv, length, target.hd, device=dev) for _ in range(2)]
                 for _ in range(target.n_layer)]
        for t in range(length - 1):
            lg = target.step(ids[:, t], cache, t).float()
            if t + 1 < p:
                continue
            ids[:, t + 1] = lg.argmax(-1) if temp == 0 else \
                torch.multinomial(torch.softmax(lg / temp, -1), 1, generator=gen)[:, 0]
        out.append(ids)
    return torch.cat(out)


def sample(target, n_seq, length, batch, temp, dev, seed):
    """n_seq texts the target samples from BOS."""
    g = torch.Generator(device=dev).manual_seed(seed)
    return extend(target, torch.zeros(n_seq, 1, dtype=torch.long, device=dev), length, batch, temp, g, dev)


def continue_greedy(target, prefixes, length, batch, dev):
    """Each row of prefixes (BOS + real code), continued greedily by the target to
    `length` tokens: the text a draft meets when it drafts for the greedy target."""
    return extend(target, prefixes, length, batch, 0, None, dev)


def agreement(target, draft, data, batch, lo=0):
    agree = tot = 0
    with torch.no_grad():
        for b0 in range(0, data.shape[0], batch):
            x = data[b0:b0 + batch]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                t, d = target(x)[:, lo:].argmax(-1), draft(x)[:, lo:].argmax(-1)
            agree += (t == d).sum().item()
            tot += t.numel()
    return agree / tot


def dev_agreement(target, draft, refs_path, dev):
    """Teacher-forced agreement on the dev prompts' greedy continuations (a report
    only: the dev prompts are never trained on)."""
    agree = tot = 0
    with torch.no_grad():
        for line in open(refs_path):
            r = json.loads(line)
            ids = torch.tensor([r["prompt_ids"] + r["target_greedy_ids"]], device=dev)
            n0 = len(r["prompt_ids"]) - 1
            t, d = target(ids)[0, n0:-1].argmax(-1), draft(ids)[0, n0:-1].argmax(-1)
            agree += (t == d).sum().item()
            tot += t.numel()
    return agree / tot


def kl_forward(lp, lq):
    """Forward KL(p || q) from log-probabilities [..., V], averaged over positions."""
    return (lp.exp() * (lp - lq)).sum(-1).mean()


def optimizer(params, lr, steps, warmup):
    """AdamW with a linear warm-up and a cosine decay over `steps`."""
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 *
                                              (1 + math.cos(math.pi * min(s, steps) / steps)))
    return opt, sched


def train_step(opt, sched, params, loss):
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    sched.step()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--draft-key", default="draft-xs")
    ap.add_argument("--refs", default="tests/data/refs-dev.jsonl")
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-seq", type=int, default=16384)
    ap.add_argument("--len", type=int, default=384)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--temp", type=float, default=0.6, help="sampling temperature of the training text")
    ap.add_argument("--minutes", type=float, default=6.0, help="training time limit")
    ap.add_argument("--corpus", default="", help="token ids (.npy, or .npz with 'tokens'; uint16) of real code: train on windows of it "
                    "(last 5 %% held out) instead of on sampled text")
    ap.add_argument("--greedy-prefix", type=int, default=0,
                    help="with --corpus: keep the first P tokens of each window (BOS + code) and let the "
                    "target continue it greedily; train and measure on the continuation only")
    a = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    target, draft = Llama(a.target).to(dev), Llama(a.draft).to(dev)
    target.requires_grad_(False)
    check_refs({"target": target, a.draft_key: draft}, a.refs, dev)

    t0 = time.time()
    # the sampler is checked against the full forward: same logits at every position
    chk = sample(target, 4, 64, 4, a.temp, dev, 3)
    with torch.no_grad():
        full = target(chk)
        cache = [[torch.zeros(4, target.n_kv, 64, target.hd, device=dev) for _ in range(2)]
                 for _ in range(target.n_layer)]
        inc = torch.stack([target.step(chk[:, t], cache, t) for t in range(64)], 1)
    print("cached step vs full forward: max abs diff %.2e" % (inc - full).abs().max().item(), flush=True)
    assert (inc - full).abs().max().item() < 1e-2
    if a.corpus:  # windows of real code, each after a BOS
        arr = np.load(a.corpus)
        if a.corpus.endswith(".npz"):  # np.savez_compressed(tokens=...)
            arr = arr["tokens"]
        toks = torch.from_numpy(arr.astype(np.int64))
        cut = int(len(toks) * 0.95)
        def windows(start, stop, n, seed):
            gen = torch.Generator().manual_seed(seed)
            st = torch.randint(start, stop - a.len, (n,), generator=gen)
            w = torch.stack([toks[i:i + a.len - 1] for i in st.tolist()])
            return torch.cat([torch.zeros(n, 1, dtype=torch.long), w], 1).to(dev)
        data, held = windows(0, cut, a.n_seq, 1), windows(cut, len(toks), 256, 2)
        if a.greedy_prefix:
            P = a.greedy_prefix
            data = continue_greedy(target, data[:, :P], a.len, 4096, dev)
            held = continue_greedy(target, held[:, :P], a.len, 4096, dev)
    else:
        data = sample(target, a.n_seq, a.len, 2048, a.temp, dev, 1)
        held = sample(target, 256, a.len, 256, a.temp, dev, 2)
    print("%s: %d + %d (held out) sequences of %d tokens in %.0f s" %
          ("corpus windows" if a.corpus else "sampled", data.shape[0], held.shape[0], a.len, time.time() - t0),
          flush=True)
    lo = a.greedy_prefix - 1 if a.greedy_prefix else 0  # first position judged
    print("greedy agreement before: held-out samples %.4f, dev continuations %.4f" %
          (agreement(target, draft, held, 64, lo), dev_agreement(target, draft, a.refs, dev)), flush=True)

    opt, sched = optimizer(draft.parameters(), a.lr, a.steps, 100)
    t0 = time.time()
    step = 0
    while step < a.steps and time.time() - t0 < a.minutes * 60:
        idx = torch.randint(0, data.shape[0], (a.batch,), device=dev)
        x = data[idx]
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            pt = torch.log_softmax(target(x)[:, lo:].float(), -1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ld = draft(x)[:, lo:].float()
        loss = kl_forward(pt, torch.log_softmax(ld, -1))
        train_step(opt, sched, draft.parameters(), loss)
        step += 1
        if step % 250 == 0:
            print("step %d loss %.4f (%.0f s)" % (step, loss.item(), time.time() - t0), flush=True)
    print("trained %d steps in %.0f s" % (step, time.time() - t0), flush=True)
    print("greedy agreement after: held-out samples %.4f, dev continuations %.4f" %
          (agreement(target, draft, held, 64, lo), dev_agreement(target, draft, a.refs, dev)), flush=True)
    check_refs({"target": target}, a.refs, dev)

    os.makedirs(a.out, exist_ok=True)
    arrs = {n: draft.w(n).detach().float().cpu().numpy() for n in draft.names}
    np.savez(os.path.join(a.out, "draft.npz"), **arrs)
    print("wrote %s" % os.path.join(a.out, "draft.npz"), flush=True)


if __name__ == "__main__":
    main()
