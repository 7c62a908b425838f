#!/usr/bin/env python3
"""Reference data for the real published pair (tests/test_real_pair.c): the target
Qwen2.5-Coder-1.5B-Instruct Q4_K_M and its draft Qwen2.5-Coder-0.5B-Instruct Q4_K_M
(scripts/get-real-pair.sh fetches both into models/real/; the two share one tokenizer,
so the ids are the target's, and their chat templates differ in one line only, the
tools prompt's: the renderings with tools are recorded for each).

Writes qwen2.5-coder-pair.jsonl, one JSON object per line:
  {"kind": "tokenize", "text", "ids"}
      ids: llama.cpp's tokenizer on the target file (llama-tokenize --ids, special tokens
      parsed; no BOS: the file's add_bos_token is false);
  {"kind": "render", "json", "prompt", "prompt_draft"}
      a conversation with tools (an object {"messages", "tools"} as JSON text, for
      tandem_chat_render_json) and its rendering by the target's and by the draft's chat
      template in Python's jinja2;
  {"kind": "plain" | "chat", "prompt", "messages" (chat), "prompt_ids", "tokens", "margins"}
      prompt: the text (chat: the conversation rendered by the chat template with
      Python's jinja2, as transformers' apply_chat_template renders it);
      prompt_ids: llama.cpp's tokens of the prompt;
      tokens: up to N_NEW greedy tokens of a float32 reference forward of the target
      (every tensor dequantised to float32 by the gguf package, as transformers does
      when it loads a GGUF; a plain numpy qwen2 forward: q/k/v biases, NeoX RoPE),
      ending at an end-of-generation token;
      margins: at each of those positions, the reference's top-two logit margin.

usage: python3 -m venv /tmp/refenv && /tmp/refenv/bin/pip install numpy gguf jinja2
       /tmp/refenv/bin/python tests/data/real/gen_pair_ref.py TARGET.gguf DRAFT.gguf LLAMA_TOKENIZE
LLAMA_TOKENIZE: the llama-tokenize binary of a llama.cpp build, or llama_tokenize_ids
built from this folder's llama_tokenize_ids.c against its library (a build without the
tool; the file says how).  About 8 GiB of memory (the target's weights in float32); the
20 prompts decode together (one pass over the weights a step).
"""
import json
import os
import sys

import numpy as np
from gguf import GGUFReader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "chat"))
from gen import environment  # noqa: E402  (tests/data/chat/gen.py: transformers' jinja2 setup)
import gen_ref  # noqa: E402  (tests/data/real/gen_ref.py: the llama reference, llama_tokenize)
from gen_ref import llama_tokenize  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "qwen2.5-coder-pair.jsonl")
N_NEW = 32

TOKENIZE_CASES = [
    "Hello world",
    " leading space and  two  spaces   three",
    "digits 1 12 123 1234 12345 3.14159 2024-12-01 0x1F 1e-9",
    "contractions: don't, I'm, we'll, they've, she'd, it's, DON'T, You'RE",
    "tabs\tand\nnewlines\n\n\nand \r\n crlf",
    "trailing spaces   ",
    "   ",
    "\n\n\n\n",
    "\t\t\tx\t \t",
    "",
    "unicode: café naïve Ærøskøbing Привет мир 你好世界 こんにちは 안녕하세요",
    "emoji 🙂🚀👩‍💻 and symbols ©®™ — – … «»",
    "math ∑∫√∞ ≤≥≠ αβγ",
    "Ünïcödé ÀÉÎÕÜ and combining e\u0301, a\u00a0non-breaking space and \u2003em space",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class Node:\n\tdef __init__(self, val=None):\n\t\tself.val = val\n\t\tself.next = None\n",
    "#include <stdio.h>\nint main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}\n",
    "fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); println!(\"{:?}\", v); }",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE 'A%' ORDER BY id DESC;",
    "const f = async (a, b) => { await sleep(100); return a ?? b; };",
    "if (x != y && z <= 3 || !w) { y >>= 2; x <<= 1; z ^= 0xFF; }",
    "        deeply    indented\n                code",
    "x=1;y=22;z=333;w=4444;v=55555",
    "ALLCAPS CamelCase snake_case kebab-case __dunder__ camelCaseHTTPServer",
    "URL https://example.com/path?q=1&r=two#frag and email a.b@c.org",
    "JSON {\"key\": [1, 2.5, true, null], \"k2\": \"v\"}",
    "<html><body><div class=\"a\">text &amp; more</div></body></html>",
    "# Title\n\n- item one\n- **bold** and `code`\n\n```python\nprint('hi')\n```\n",
    "'''docstring''' \"\"\"triple\"\"\" r'raw\\n' b'\\x00\\xff' f'{x!r:>10}'",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite code<|im_end|>\n",
    "specials inside text: a<|endoftext|>b <|im_end|>c<|im_start|>",
    "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n    return c<|fim_middle|>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "<|im_start|> not quite <|im_end |> <|unknown|>",
    "Mixed 中文 and English 代码 code: 变量 = 42  # 注释",
    "العربية עברית हिन्दी ไทย",
    "!!!???...,,,;;;:::---___===+++***",
    "    return {'a': 1, 'b': [2, 3], 'c': {'d': None}}\n\n\n",
    "a" * 64 + " " + "ab" * 20 + " " + "0" * 30,
]

PLAIN_PROMPTS = [
    "def quicksort(arr):\n",
    "import numpy as np\n\n# compute the mean of each column\n",
    "class Stack:\n    def __init__(self):\n",
    "def is_prime(n: int) -> bool:\n    \"\"\"Return True if n is a prime number.\"\"\"\n",
    "#include <stdio.h>\n\nint main(void) {\n",
    "// Binary search in a sorted array\nfunction binarySearch(arr, target) {\n",
    "SELECT customers.name, COUNT(orders.id)\nFROM customers\n",
    "def read_json(path):\n    with open(path) as f:\n",
    "fn fibonacci(n: u64) -> u64 {\n",
    "The capital of France is",
    "# Merge two sorted lists into one sorted list\ndef merge(a, b):\n",
    "public class HelloWorld {\n    public static void main(String[] args) {\n",
]

CHATS = [
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "What does the `yield` keyword do in Python?"}],
    [{"role": "system", "content": "You are a concise coding assistant."},
     {"role": "user", "content": "Write a bash one-liner that counts the lines of all .c files."}],
    [{"role": "user", "content": "Write a C function that returns the length of a string."}],
    [{"role": "user", "content": "Hi!"},
     {"role": "assistant", "content": "Hello! How can I help you with your code today?"},
     {"role": "user", "content": "Write a JavaScript function that sums an array."}],
    [{"role": "user", "content": "Explain the difference between a list and a tuple in Python."}],
    [{"role": "system", "content": "Answer with code only."},
     {"role": "user", "content": "FizzBuzz in Python."}],
    [{"role": "user", "content": "How do I read a file line by line in Go?"}],
]

# conversations with tools (tandem_chat_render_json): rendered only
TOOL_CHATS = [
    {"messages": [{"role": "user", "content": "What is the weather in Paris?"}],
     "tools": [{"type": "function", "function": {
         "name": "get_weather", "description": "Current weather of a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]},
    {"messages": [{"role": "system", "content": "You call tools when useful."},
                  {"role": "user", "content": "Add 2 and 3."},
                  {"role": "assistant", "content": "", "tool_calls": [
                      {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]},
                  {"role": "tool", "content": "5"},
                  {"role": "user", "content": "Thanks, and 2 × 3? «ü»"}],
     "tools": [{"type": "function", "function": {"name": "add", "description": "a + b",
                "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]},
]


class Model(gen_ref.Model):
    """The textbook qwen2 forward in float32 over dequantised weights: gen_ref.py's llama
    (its loading, RMSNorm, end-of-generation tokens) with q/k/v biases and NeoX RoPE."""

    def rope(self, x, pos):
        # NeoX layout (qwen2): dims i and i + hd/2 rotate by pos * inv_freq[i] (all hd
        # dims rotate: the file has no rope.dimension_count)
        ang = np.outer(pos, self.inv_freq)  # [n][hd/2]
        c = np.cos(ang).astype(np.float32)[:, None, :]
        s = np.sin(ang).astype(np.float32)[:, None, :]
        h = self.hd // 2
        a, b = x[..., :h], x[..., h:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    def forward(self, seqs):
        """seqs: [(ids, cache, pos0)], each cache per layer [K, V] of [n][Hkv][hd] (grown
        here); the sequences' rows go through the matrices together (one pass over the
        weights), their attention apart.  Returns each sequence's last-row logits."""
        rows = [len(ids) for ids, _, _ in seqs]
        pos = [np.arange(p0, p0 + n) for (_, _, p0), n in zip(seqs, rows)]
        x = self.t["token_embd.weight"][np.concatenate([np.asarray(ids) for ids, _, _ in seqs])]
        N = x.shape[0]
        grp = self.H // self.Hkv
        scale = np.float32(1.0 / np.sqrt(self.hd))
        for l in range(self.L):
            p = "blk.%d." % l
            h = self.rmsnorm(x, self.t[p + "attn_norm.weight"])
            q = (h @ self.t[p + "attn_q.weight"].T + self.t[p + "attn_q.bias"]).reshape(N, self.H, self.hd)
            k = (h @ self.t[p + "attn_k.weight"].T + self.t[p + "attn_k.bias"]).reshape(N, self.Hkv, self.hd)
            v = (h @ self.t[p + "attn_v.weight"].T + self.t[p + "attn_v.bias"]).reshape(N, self.Hkv, self.hd)
            att = np.empty((N, self.H, self.hd), dtype=np.float32)
            r0 = 0
            for (_, cache, _), n, ps in zip(seqs, rows, pos):
                qs, ks, vs = self.rope(q[r0:r0 + n], ps), self.rope(k[r0:r0 + n], ps), v[r0:r0 + n]
                if len(cache) <= l:
                    cache.append([ks, vs])
                else:
                    cache[l][0] = np.concatenate([cache[l][0], ks])
                    cache[l][1] = np.concatenate([cache[l][1], vs])
                K, V = cache[l]
                T = K.shape[0]
                mask = np.arange(T)[None, :] > (ps[:, None])
                for hh in range(self.H):
                    kv = hh // grp
                    sc = (qs[:, hh, :] @ K[:, kv, :].T) * scale  # [n][T]
                    sc = np.where(mask, -np.inf, sc)
                    sc = sc - sc.max(axis=1, keepdims=True)
                    w = np.exp(sc)
                    w = w / w.sum(axis=1, keepdims=True)
                    att[r0:r0 + n, hh, :] = w @ V[:, kv, :]
                r0 += n
            x = x + att.reshape(N, self.E) @ self.t[p + "attn_output.weight"].T
            h = self.rmsnorm(x, self.t[p + "ffn_norm.weight"])
            g = h @ self.t[p + "ffn_gate.weight"].T
            u = h @ self.t[p + "ffn_up.weight"].T
            x = x + ((g / (1.0 + np.exp(-g))) * u) @ self.t[p + "ffn_down.weight"].T
        last = np.cumsum(rows) - 1
        h = self.rmsnorm(x[last], self.t["output_norm.weight"])
        return h @ self.out.T

    def greedy(self, prompts):
        """Up to N_NEW greedy tokens of each prompt and the top-two margins: the prompts
        prefilled one by one, then decoded together (one row each)."""
        caches = [[] for _ in prompts]
        logits = [self.forward([(ids, c, 0)])[0] for ids, c in zip(prompts, caches)]
        toks = [[] for _ in prompts]
        margins = [[] for _ in prompts]
        live = list(range(len(prompts)))
        for _ in range(N_NEW):
            step = []
            for i, lg in zip(live, logits):
                top2 = np.argsort(lg)[-2:]
                t = int(top2[1])
                toks[i].append(t)
                margins[i].append(round(float(lg[top2[1]] - lg[top2[0]]), 4))
                if t not in self.eog and len(toks[i]) < N_NEW:
                    step.append(i)
            live = step
            if not live:
                break
            logits = self.forward([([toks[i][-1]], caches[i], len(prompts[i]) + len(toks[i]) - 1) for i in live])
        return toks, margins


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    path, draft, tok_bin = sys.argv[1], sys.argv[2], sys.argv[3]
    tpl, tpl_draft = (environment().from_string(bytes(GGUFReader(p).fields["tokenizer.chat_template"].parts[-1])
                                                .decode("utf-8")) for p in (path, draft))
    lines = []
    for text in TOKENIZE_CASES:
        lines.append({"kind": "tokenize", "text": text, "ids": llama_tokenize(tok_bin, path, text)})
    for c in TOOL_CHATS:
        lines.append({"kind": "render", "json": json.dumps(c, ensure_ascii=False),
                      "prompt": tpl.render(add_generation_prompt=True, **c),
                      "prompt_draft": tpl_draft.render(add_generation_prompt=True, **c)})
    jobs = [("plain", p, None) for p in PLAIN_PROMPTS]
    jobs += [("chat", tpl.render(messages=c, add_generation_prompt=True), c) for c in CHATS]
    for _, prompt, msgs in jobs:  # without tools the two templates agree
        assert msgs is None or tpl_draft.render(messages=msgs, add_generation_prompt=True) == prompt
    prompt_ids = [llama_tokenize(tok_bin, path, prompt) for _, prompt, _ in jobs]
    toks, margins = Model(path).greedy(prompt_ids)
    for i, (kind, prompt, msgs) in enumerate(jobs):
        line = {"kind": kind, "prompt": prompt}
        if msgs is not None:
            line["messages"] = msgs
        line.update({"prompt_ids": prompt_ids[i], "tokens": toks[i], "margins": margins[i]})
        lines.append(line)
        print("%d/%d %s: %d prompt tokens, %d new" % (i + 1, len(jobs), kind, len(prompt_ids[i]), len(toks[i])))
    with open(OUT, "w", encoding="utf-8") as f:
        for l in lines:
            f.write(json.dumps(l, ensure_ascii=False) + "\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
