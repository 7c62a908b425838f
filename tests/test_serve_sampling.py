"""test_serve_sampling.py - logprobs, the penalties, logit_bias and min_tokens in `tandem serve`.

usage: python3 test_serve_sampling.py TANDEM [full|reduced]

  - the pycode pair (with the draft: speculated tokens' logprobs from the verifying
    forward), the OpenAI chat and completion endpoints: logprobs shapes, whole and streamed
    (chat: choices[].logprobs.content[] with token, logprob, bytes, top_logprobs; completions:
    tokens, token_logprobs, top_logprobs, text_offset); greedy: each token is its own top
    alternative; the streamed logprobs are the whole answer's; the target-only server gives
    the same tokens and logprobs (within 1e-4)
  - presence / frequency / repetition penalties (and llama-server's repeat_penalty),
    logit_bias, min_tokens accepted and changing the output; greedy output equal with and
    without the draft
  - invalid values: a 400 naming the member
  - with the openai package: logprobs and penalties through client.chat.completions.create
    and client.completions.create, whole and streamed
Prints 'N passed, N failed'; exits 1 on a failure, 77 when the openai package is missing
(after the other checks pass).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import HOST, MODELS, TARGET, Checks, Server, post  # noqa: E402

openai_missing = None
try:
    import openai  # noqa: E402
except ImportError:
    openai_missing = "the openai package is not importable (test_serve.sh installs it into a venv)"

TANDEM = sys.argv[1]
DRAFT = os.path.join(MODELS, "pycode-draft-s-f16.gguf")
C, CH = "/v1/completions", "/v1/chat/completions"
c = Checks()


def call(port, path, body):
    st, _, data = post(port, path, body, timeout=120)
    try:
        return st, json.loads(data)
    except ValueError:
        return st, {"raw": data[:300]}


def stream(port, path, body):
    """(status, text, logprob entries put together (chat: content list; completions: dict of lists))"""
    st, _, data = post(port, path, dict(body, stream=True), timeout=120)
    text, chat_lp = "", []
    comp_lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for line in data.decode().split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])
        for x in ch.get("choices", []):
            text += (x.get("delta") or {}).get("content") or x.get("text") or ""
            lp = x.get("logprobs")
            if lp and "content" in lp:
                chat_lp += lp["content"]
            elif lp:
                for k in comp_lp:
                    comp_lp[k] += lp[k]
    return st, text, chat_lp if path == CH else comp_lp


MSG = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
PROMPT = "def fib(n):\n"
N = 24
REDUCED = len(sys.argv) > 2 and sys.argv[2] == "reduced"
outs = {}
for label, args in (("target only", ["-m", TARGET, "-t", "1"]), ("with the draft", ["-m", TARGET, "-d", DRAFT, "-t", "1"])):
    srv = Server(TANDEM, args)
    port = srv.port
    got = {}
    # ---- chat logprobs
    st, r = call(port, CH, {"messages": MSG, "max_tokens": N, "temperature": 0, "logprobs": True, "top_logprobs": 3})
    ok = st == 200
    content = r["choices"][0]["logprobs"]["content"] if ok else []
    ok = ok and len(content) == r["usage"]["completion_tokens"] and len(content) > 0
    ok = ok and all(set(e) == {"token", "logprob", "bytes", "top_logprobs"} and len(e["top_logprobs"]) == 3
                    and e["logprob"] <= 0 and bytes(e["bytes"]).decode("utf-8", "replace") is not None
                    and all(set(t) == {"token", "logprob", "bytes"} for t in e["top_logprobs"]) for e in content)
    ok = ok and all(abs(e["top_logprobs"][0]["logprob"] - e["logprob"]) < 1e-6 and e["top_logprobs"][0]["token"] == e["token"]
                    and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"] >= e["top_logprobs"][2]["logprob"]
                    for e in content)
    c.check(ok, "%s: chat logprobs: an entry per token, greedy tokens their own top alternative" % label, r)
    text = r["choices"][0]["message"]["content"] if st == 200 else None
    c.check(st == 200 and "".join(bytes(e["bytes"]).decode("utf-8", "replace") for e in content).startswith(text or "\0"),
            "%s: chat logprobs: the tokens' bytes spell the answer" % label, (text, content[:3]))
    st2, stext, slp = stream(port, CH, {"messages": MSG, "max_tokens": N, "temperature": 0, "logprobs": True,
                                        "top_logprobs": 3})
    c.check(st2 == 200 and stext == text and [e["token"] for e in slp] == [e["token"] for e in content]
            and all(abs(a["logprob"] - b["logprob"]) < 1e-6 for a, b in zip(slp, content)),
            "%s: chat logprobs streamed: the whole answer's" % label, (stext, text, len(slp), len(content)))
    got["chat"] = [(e["token"], e["logprob"]) for e in content]
    st, r = call(port, CH, {"messages": MSG, "max_tokens": 4, "logprobs": False})
    c.check(st == 200 and r["choices"][0]["logprobs"] is None, "%s: chat logprobs false: null" % label, r)
    # ---- completions logprobs
    st, r = call(port, C, {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": 2})
    lp = r["choices"][0]["logprobs"] if st == 200 else {}
    n = r["usage"]["completion_tokens"] if st == 200 else -1
    ok = st == 200 and all(len(lp[k]) == n for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset"))
    ok = ok and all(2 <= len(d) <= 3 and lp["tokens"][i] in d for i, d in enumerate(lp["top_logprobs"]))
    ok = ok and lp["text_offset"][0] == 0 and all(lp["text_offset"][i + 1] - lp["text_offset"][i] == len(lp["tokens"][i].encode())
                                                  for i in range(n - 1))
    c.check(ok, "%s: completion logprobs: tokens, token_logprobs, top_logprobs, text_offset" % label, r)
    ctext = r["choices"][0]["text"] if st == 200 else None
    st2, stext, slp = stream(port, C, {"prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": 2})
    c.check(st2 == 200 and stext == ctext and slp["tokens"] == lp.get("tokens") and slp["text_offset"] == lp.get("text_offset")
            and all(abs(a - b) < 1e-6 for a, b in zip(slp["token_logprobs"], lp.get("token_logprobs", []))),
            "%s: completion logprobs streamed: the whole answer's (offsets running on)" % label, (slp, lp))
    got["completion"] = list(zip(lp.get("tokens", []), lp.get("token_logprobs", [])))
    # ---- sampled: logprobs of the sampled tokens
    st, r = call(port, C, {"prompt": PROMPT, "max_tokens": N, "temperature": 1.0, "seed": 3, "logprobs": 0})
    lp = r["choices"][0]["logprobs"] if st == 200 else {}
    c.check(st == 200 and all(x <= 0 and math.isfinite(x) for x in lp["token_logprobs"])
            and all(len(d) == 1 for d in lp["top_logprobs"]),
            "%s: sampled, logprobs 0: the sampled tokens' own" % label, r)
    # ---- penalties, logit_bias, min_tokens
    base = {"prompt": PROMPT, "max_tokens": N, "temperature": 0}
    st, plain = call(port, C, base)
    outs_pen = {}
    for name, extra in (("presence_penalty", {"presence_penalty": 1.5}), ("frequency_penalty", {"frequency_penalty": 1.5}),
                        ("repetition_penalty", {"repetition_penalty": 1.5}), ("repeat_penalty", {"repeat_penalty": 1.5}),
                        ("all", {"presence_penalty": -0.5, "frequency_penalty": 0.8, "repetition_penalty": 1.2,
                                 "min_tokens": 8})):
        st, r = call(port, C, dict(base, **extra))
        outs_pen[name] = r["choices"][0]["text"] if st == 200 else None
        c.check(st == 200, "%s: %s accepted" % (label, name), r)
    c.check(outs_pen["frequency_penalty"] != plain["choices"][0]["text"]
            and outs_pen["repetition_penalty"] != plain["choices"][0]["text"],
            "%s: the penalties change the greedy answer" % label, (outs_pen, plain))
    c.check(outs_pen["repetition_penalty"] == outs_pen["repeat_penalty"],
            "%s: repeat_penalty is repetition_penalty" % label, outs_pen)
    got["penalties"] = outs_pen
    # logit_bias: the first token of the plain answer banned, another forced
    st, r = call(port, C, dict(base, max_tokens=3, logit_bias={"16": 100}))
    st2, tok = call(port, "/detokenize", {"tokens": [16]})
    c.check(st == 200 and st2 == 200 and r["choices"][0]["text"].startswith(tok.get("content", "\0")),
            "%s: logit_bias +100 forces a token" % label, (r, tok))
    st, r = call(port, C, dict(base, max_tokens=1, logprobs=1))
    top = r["choices"][0]["logprobs"]["tokens"][0] if st == 200 else None
    st, r2 = call(port, "/tokenize", {"content": top})
    ids = r2.get("tokens") if st == 200 else None
    c.check(ids and len(ids) == 1, "%s: the greedy first token %r tokenizes alone" % (label, top), r2)
    if ids and len(ids) == 1:
        st, r = call(port, C, dict(base, max_tokens=1, logit_bias={str(ids[0]): -100}, logprobs=1))
        c.check(st == 200 and r["choices"][0]["logprobs"]["tokens"][0] != top,
                "%s: logit_bias -100 bans the greedy token" % label, (top, r))
    st, r = call(port, CH, {"messages": MSG, "max_tokens": 12, "temperature": 0, "min_tokens": 12,
                            "logit_bias": {}})
    c.check(st == 200 and r["usage"]["completion_tokens"] == 12, "%s: min_tokens: no end before it" % label, r)
    # ---- invalid values: a 400 naming the member
    for path, body, param in ((C, {"presence_penalty": 3}, "presence_penalty"),
                              (C, {"frequency_penalty": -2.5}, "frequency_penalty"),
                              (C, {"repetition_penalty": 0}, "repetition_penalty"),
                              (C, {"repeat_penalty": -1}, "repeat_penalty"),
                              (C, {"min_tokens": -2}, "min_tokens"),
                              (C, {"min_tokens": 9, "max_tokens": 4}, "min_tokens"),
                              (C, {"logit_bias": {"x": 1}}, "logit_bias"),
                              (C, {"logit_bias": {"5": 200}}, "logit_bias"),
                              (C, {"logprobs": 21}, "logprobs"),
                              (CH, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                              (CH, {"top_logprobs": 2}, "top_logprobs")):
        b = dict({"prompt": "x"} if path == C else {"messages": MSG}, max_tokens=2)
        b.update(body)
        st, r = call(port, path, b)
        e = r.get("error", {})
        c.check(st == 400 and e.get("param") == param and param in e.get("message", ""),
                "%s: %s %s -> 400 naming %s" % (label, path, json.dumps(body), param), r)
    outs[label] = got
    if label == "with the draft":
        if openai_missing is None:
            cl = openai.OpenAI(base_url="http://%s:%d/v1" % (HOST, port), api_key="x", max_retries=0, timeout=120)
            m = cl.models.list().data[0].id
            r = cl.chat.completions.create(model=m, messages=MSG, max_tokens=N, temperature=0, logprobs=True,
                                           top_logprobs=2, presence_penalty=0.5, frequency_penalty=0.5,
                                           logit_bias={"5": -100}, extra_body={"repetition_penalty": 1.1,
                                                                                "min_tokens": 2})
            lc = r.choices[0].logprobs.content
            c.check(len(lc) == r.usage.completion_tokens and all(len(e.top_logprobs) == 2 for e in lc)
                    and all(isinstance(e.bytes, list) for e in lc), "openai: chat logprobs with the penalties", r)
            s = [x for x in cl.chat.completions.create(model=m, messages=MSG, max_tokens=N, temperature=0, logprobs=True,
                                                       top_logprobs=2, presence_penalty=0.5, frequency_penalty=0.5,
                                                       logit_bias={"5": -100},
                                                       extra_body={"repetition_penalty": 1.1, "min_tokens": 2},
                                                       stream=True) if x.choices]
            sl = [e for x in s if x.choices[0].logprobs for e in (x.choices[0].logprobs.content or [])]
            c.check([e.token for e in sl] == [e.token for e in lc]
                    and "".join(x.choices[0].delta.content or "" for x in s) == r.choices[0].message.content,
                    "openai: streamed chat logprobs equal the whole answer's", (sl[:3], lc[:3]))
            r = cl.completions.create(model=m, prompt=PROMPT, max_tokens=N, temperature=0, logprobs=3)
            lp = r.choices[0].logprobs
            c.check(len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
                    == r.usage.completion_tokens, "openai: completion logprobs", lp)
            try:
                cl.chat.completions.create(model=m, messages=MSG, max_tokens=2, frequency_penalty=2.5)
                c.check(False, "openai: frequency_penalty 2.5 is a BadRequestError")
            except openai.BadRequestError as ex:
                c.check(ex.status_code == 400 and "frequency_penalty" in str(ex),
                        "openai: frequency_penalty 2.5 is a BadRequestError naming it", ex)
    srv.stop()

a, b = outs["target only"], outs["with the draft"]
for k in ("chat", "completion"):
    c.check([t for t, _ in a[k]] == [t for t, _ in b[k]] and all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a[k], b[k])),
            "%s: the draft changes no greedy token and no logprob (1e-4)" % k, (a[k][:4], b[k][:4]))
c.check(a["penalties"] == b["penalties"], "the draft changes no greedy penalised answer", (a["penalties"], b["penalties"]))
c.finish(openai_missing)
