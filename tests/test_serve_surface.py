"""test_serve_surface.py - the rest of `tandem serve`'s OpenAI surface, with the pycode pair.

usage: python3 test_serve_surface.py TANDEM [full|reduced]

  - n > 1 (the `openai` package): n = 3 completions and chats, whole and streamed: the
    choices' indices, greedy choices equal to the n = 1 answer, sampled choice i equal to
    an n = 1 request with seed + i, the usage summed (the prompt once, its blocks shared
    through the prefix cache: cached_tokens), streamed chunks indexed per choice with
    one finish_reason each, then the include_usage chunk; with tools (parsed per choice);
    a timeout and a client that goes away end every choice; n = 17 refused
  - ignore_eos: a prompt the model ends at once (its end token) runs to max_tokens
  - GET /v1/models/{id} (openai's models.retrieve), 404 with an error object for another id
  - POST /tokenize and /detokenize: the ids equal `tandem tokenize`'s (with and without
    the BOS), the text comes back, pieces, bad ids and unknown members a 400 naming them
  - every vLLM / llama-server / OpenAI member that is not implemented: a 400 naming it,
    on both endpoints; its neutral value answered
  - CORS: off by default (no header, OPTIONS a 405); with --cors-origin the listed
    origins get Access-Control-Allow-Origin on answers (streams and errors too) and
    preflights are answered 204; "*" allows any; bad values refused at startup
Prints 'N passed, N failed'; exits 1 on a failure, 77 when the openai package is missing
(after the other checks pass).
"""
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import DRAFT, HOST, TARGET, Checks, Server, metrics, post, request, wait_until  # noqa: E402

TANDEM = sys.argv[1]
REDUCED = len(sys.argv) > 2 and sys.argv[2] == "reduced"
MODEL = "pycode-target-f16"
N_TOK = 12
C, CH = "/v1/completions", "/v1/chat/completions"
# longer than one KV block (16 tokens): choices after the first take it from the cache
LONG = "def f(x):\n    return x\n\n\ndef fibonacci(n):\n    if n < 2:\n        return n\n"

c = Checks()


def err_of(data):
    try:
        return json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        return {}


def expect_error(port, path, body, status, param, needle, what):
    st, hd, data = post(port, path, body)
    e = err_of(data)
    ok = st == status and e.get("param") == param and needle in e.get("message", "")
    c.check(ok and hd.get("content-type") == "application/json", "%s -> %d naming '%s'" % (what, status, param),
            "got %d %s" % (st, data[:300]))


def sse(data):
    """The JSON events of a stream's body, and whether it ended with [DONE]."""
    events, done = [], False
    for block in data.decode().split("\n\n"):
        if block.startswith("data: [DONE]"):
            done = True
        elif block.startswith("data: "):
            events.append(json.loads(block[6:]))
    return events, done


QWEN_TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "chat", "qwen2.5.jinja")
srv = Server(TANDEM, ["-m", TARGET, "-d", DRAFT, "-t", "1", "--max-batch", "4", "--chat-template", QWEN_TEMPLATE])
port = srv.port

# ---------------------------------------------------------------- n > 1, raw
st, _, data = post(port, C, {"prompt": LONG, "max_tokens": N_TOK, "temperature": 0})
one = json.loads(data) if st == 200 else {}
st, _, data = post(port, C, {"prompt": LONG, "max_tokens": N_TOK, "temperature": 0, "n": 3})
three = json.loads(data) if st == 200 else {}
ch = three.get("choices", [])
c.check(st == 200 and [x["index"] for x in ch] == [0, 1, 2], "n = 3: three choices, indices 0, 1, 2", data[:300])
c.check(one and all(x["text"] == one["choices"][0]["text"] for x in ch),
        "n = 3 greedy: every choice equals the n = 1 answer", data[:400])
u = three.get("usage", {})
c.check(u.get("prompt_tokens") == one.get("usage", {}).get("prompt_tokens")
        and u.get("completion_tokens") == 3 * one.get("usage", {}).get("completion_tokens", -1)
        and u.get("total_tokens") == u.get("prompt_tokens", 0) + u.get("completion_tokens", 0),
        "n = 3: usage counts the prompt once and the completions summed", u)
cached = u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
c.check(16 <= cached < u.get("prompt_tokens", 0),
        "n = 3: the prompt's blocks are shared through the prefix cache (cached_tokens %d)" % cached, u)
expect_error(port, C, {"prompt": "x", "n": 17}, 400, "n", "'n' is 17, out of range [1, 16]", "n = 17")
expect_error(port, C, {"prompt": "x", "n": 0}, 400, "n", "out of range [1, 16]", "n = 0")

# streamed, completions: each choice's pieces under its index, one finish each, then usage
st, hd, data = post(port, C, {"prompt": LONG, "max_tokens": N_TOK, "temperature": 0, "n": 3, "stream": True,
                              "stream_options": {"include_usage": True}})
events, done = sse(data) if st == 200 else ([], False)
texts, finishes = {}, {}
for ev in events[:-1]:
    for x in ev["choices"]:
        texts[x["index"]] = texts.get(x["index"], "") + x["text"]
        if x["finish_reason"]:
            finishes[x["index"]] = finishes.get(x["index"], []) + [x["finish_reason"]]
last = events[-1] if events else {}
c.check(st == 200 and done and sorted(texts) == [0, 1, 2]
        and all(t == one["choices"][0]["text"] for t in texts.values()),
        "n = 3 streamed: each index's pieces make the n = 1 text", "%r" % texts)
c.check(finishes == {0: ["length"], 1: ["length"], 2: ["length"]}, "n = 3 streamed: one finish_reason per choice",
        finishes)
c.check(last.get("choices") == [] and last.get("usage", {}).get("completion_tokens") == 3 * N_TOK
        and all(ev.get("usage", 1) is None for ev in events[:-1]),
        "n = 3 streamed: include_usage's last chunk carries the summed usage (null before)", last)

# n = 2 with tools (the output parsed per choice): whole and streamed agree, per index
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER], "max_tokens": N_TOK,
        "temperature": 0, "n": 2}
st, _, data = post(port, CH, body)
whole = [x["message"] for x in json.loads(data)["choices"]] if st == 200 else []
st, _, data = post(port, CH, dict(body, stream=True))
events, done = sse(data) if st == 200 else ([], False)
streamed = {}
for ev in events:
    for x in ev["choices"]:
        m = streamed.setdefault(x["index"], {"content": ""})
        m["content"] += x["delta"].get("content") or ""
        if x["delta"].get("tool_calls"):
            m["calls"] = m.get("calls", 0) + 1
c.check(len(whole) == 2 and whole[0] == whole[1] and done and sorted(streamed) == [0, 1]
        and all(streamed[i]["content"] == (whole[i]["content"] or "") and bool(streamed[i].get("calls"))
                == bool(whole[i].get("tool_calls")) for i in range(2)),
        "n = 2 with tools: equal choices, each streamed under its index as answered whole", "%r / %r" % (whole, streamed))
# a timeout ends every choice (those submitted after the first with what is left of it)
st, _, data = post(port, C, {"prompt": LONG, "max_tokens": 900, "temperature": 0, "n": 3, "timeout_s": 0.05})
ch = json.loads(data)["choices"] if st == 200 else []
c.check(len(ch) == 3 and all(x["finish_reason"] == "length" and x.get("tandem", {}).get("timeout") for x in ch),
        "n = 3 with timeout_s: every choice ends with finish_reason length and tandem.timeout", data[:400])

# a client of n = 3 that goes away cancels every choice and frees their KV blocks
def raw_send(body):
    s = socket.create_connection((HOST, port), timeout=30)
    b = json.dumps(body).encode()
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
               % (C, len(b))).encode() + b)
    return s


def cancelled():
    return metrics(port).get('tandem_engine_requests_total{outcome="cancelled"}', 0)


for stream in (True, False):
    n0 = cancelled()
    s = raw_send({"prompt": LONG, "max_tokens": 900, "temperature": 1.5, "seed": 3, "n": 3, "stream": stream})
    running = wait_until(lambda: metrics(port).get("tandem_requests_running", 0) >= 3, 20, step=0.005)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # gone: the connection reset
    s.close()
    ok = wait_until(lambda: cancelled() >= n0 + 3, 10)
    m = metrics(port)
    c.check(running and ok and m.get("tandem_requests_running") == 0 and m.get("tandem_kv_blocks_used") == 0,
            "n = 3 %s: a client that goes away cancels its three choices, their KV blocks freed"
            % ("streamed" if stream else "whole"),
            "running %s, cancelled %s, metrics %s" % (running, cancelled() - n0,
                                                      {k: v for k, v in m.items() if "kv" in k or "running" in k}))

# ignore_eos: the model ends a file's last line with its end token at once
END = 'if __name__ == "__main__":\n    main()\n'
st, _, data = post(port, C, {"prompt": END, "max_tokens": 8, "temperature": 0})
r0 = json.loads(data)["choices"][0] if st == 200 else {}
st, _, data = post(port, C, {"prompt": END, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
r1 = json.loads(data) if st == 200 else {}
c.check(r0.get("finish_reason") == "stop" and r1.get("choices", [{}])[0].get("finish_reason") == "length"
        and r1.get("usage", {}).get("completion_tokens") == 8,
        "ignore_eos: generation goes on past the end token to max_tokens", "%s / %s" % (r0, r1))

# ---------------------------------------------------------------- /v1/models/{id}
st, _, data = request(port, "GET", "/v1/models/" + MODEL)
m = json.loads(data) if st == 200 else {}
c.check(m.get("id") == MODEL and m.get("object") == "model" and m.get("max_model_len") == 1024,
        "GET /v1/models/{id}: the model object", data)
st, _, data = request(port, "GET", "/v1/models/gpt-4")
e = err_of(data)
c.check(st == 404 and e.get("code") == "model_not_found" and "'gpt-4' does not exist" in e.get("message", ""),
        "GET /v1/models/{another id}: 404 with an OpenAI error object", data)

# ---------------------------------------------------------------- /tokenize, /detokenize
# (text spelling a special token becomes that token; its text is left out of a
# detokenized text, as the engine's output leaves it out)
TEXTS = ["def f(x):\n    return x * 2\n", "héllo, wörld ✓", "  spaces\tand\ttabs", "<|endoftext|>x"]
BACK = TEXTS[:3] + ["x"]


def cli_tokens(text, bos):
    r = subprocess.run([TANDEM, "tokenize", "-m", TARGET, "--text", text] + ([] if bos else ["--no-bos"]),
                       capture_output=True, text=True, timeout=60)
    return json.loads(r.stdout) if r.returncode == 0 else None


for i, text in enumerate(TEXTS):
    st, _, data = post(port, "/tokenize", {"content": text})
    toks = json.loads(data).get("tokens") if st == 200 else None
    c.check(toks is not None and toks == cli_tokens(text, False) and json.loads(data)["count"] == len(toks),
            "/tokenize text %d (content, llama-server's: no BOS) equals tandem tokenize --no-bos" % i, data[:200])
    st, _, data = post(port, "/tokenize", {"prompt": text, "model": MODEL})
    c.check(st == 200 and json.loads(data)["tokens"] == cli_tokens(text, True),
            "/tokenize text %d (prompt, vLLM's: add_special_tokens true) equals tandem tokenize" % i, data[:200])
    st, _, data = post(port, "/detokenize", {"tokens": toks or []})
    d = json.loads(data) if st == 200 else {}
    c.check(d.get("content") == BACK[i] and d.get("prompt") == BACK[i], "/detokenize gives text %d back" % i,
            data[:200])
st, _, data = post(port, "/tokenize", {"content": TEXTS[0], "with_pieces": True})
pieces = json.loads(data).get("tokens", []) if st == 200 else []
c.check(pieces and all(set(p) == {"id", "piece"} for p in pieces) and [p["id"] for p in pieces] == cli_tokens(TEXTS[0], False)
        and "".join(p["piece"] for p in pieces) == TEXTS[0], "/tokenize with_pieces: ids and pieces that make the text",
        data[:300])
st, _, data = post(port, "/tokenize", {"content": "é", "with_pieces": True})
pc = json.loads(data).get("tokens", []) if st == 200 else []
c.check(pc and (b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pc)
                == "é".encode()), "/tokenize with_pieces: a piece that is not whole UTF-8 comes as its bytes", data)
expect_error(port, "/detokenize", {"tokens": [1, 8192]}, 400, "tokens", "'tokens'[1] is not a token id in [0, 8192)",
             "/detokenize of an id past the vocabulary")
expect_error(port, "/detokenize", {"tokens": [-1]}, 400, "tokens", "'tokens'[0] is not a token id", "/detokenize of -1")
expect_error(port, "/detokenize", {"tokens": "1 2"}, 400, "tokens", "must be an array", "/detokenize of a string")
expect_error(port, "/tokenize", {"content": 5}, 400, "content", "'content' must be a string", "/tokenize of a number")
expect_error(port, "/tokenize", {"content": "x", "add_bos": True}, 400, "add_bos", "'add_bos' is not a member",
             "/tokenize with an unknown member")
expect_error(port, "/tokenize", {}, 400, "content", "'content' (or 'prompt') is required", "/tokenize without text")
expect_error(port, "/tokenize", {"content": "x", "model": "gpt-4"}, 404, "model", "'gpt-4' does not exist",
             "/tokenize naming another model")
st, _, data = request(port, "GET", "/tokenize")
c.check(st == 405 and "takes POST" in err_of(data).get("message", ""), "GET /tokenize -> 405", data)

# ---------------------------------------------------------------- refused members
REFUSED = [("stop_token_ids", [2]), ("include_stop_str_in_output", True),
           ("skip_special_tokens", False), ("use_beam_search", True), ("length_penalty", 0.5), ("bad_words", ["x"]),
           ("allowed_token_ids", [1, 2]), ("truncate_prompt_tokens", 8), ("prompt_logprobs", 1),
           ("add_generation_prompt", False), ("continue_final_message", True), ("add_special_tokens", True),
           ("chat_template", "{{ messages }}"), ("chat_template_kwargs", {"enable_thinking": False}),
           ("return_tokens_as_token_ids", True), ("n_predict", 4), ("n_probs", 2), ("typical_p", 0.5),
           ("tfs_z", 0.9), ("repeat_last_n", 32), ("penalize_nl", True), ("mirostat", 2),
           ("mirostat_tau", 5), ("dry_multiplier", 0.8), ("xtc_probability", 0.3), ("top_n_sigma", 1.5),
           ("dynatemp_range", 0.5), ("samplers", ["top_k"]), ("cache_prompt", False), ("id_slot", 1),
           ("t_max_predict_ms", 100), ("post_sampling_probs", True), ("reasoning_format", "deepseek"),
           ("prediction", {"type": "content", "content": "x"}), ("reasoning_effort", "low"),
           ("guided_json", {"type": "object"}), ("guided_regex", "a+"), ("guided_choice", ["a", "b"]),
           ("structured_outputs", {"json": {}})]
if REDUCED:
    REFUSED = REFUSED[::3]
for name, value in REFUSED:
    for path, body in ((C, {"prompt": "x"}), (CH, {"messages": [{"role": "user", "content": "x"}]})):
        st, _, data = post(port, path, dict(body, max_tokens=1, **{name: value}))
        e = err_of(data)
        c.check(st == 400 and e.get("param") == name and "'%s' is not supported" % name in e.get("message", ""),
                "%s: %s = %s -> 400 naming it" % (path, name, json.dumps(value)), "got %d %s" % (st, data[:300]))
expect_error(port, C, {"prompt": "x", "stream": True, "stream_options": {"continuous_usage_stats": True}}, 400,
             "stream_options", "'stream_options.continuous_usage_stats' is not supported", "continuous_usage_stats")
st, _, data = post(port, C, {"prompt": "x", "max_tokens": 1, "repetition_penalty": 1, "min_tokens": 0,
                             "stop_token_ids": [], "mirostat": 0, "typical_p": 1, "cache_prompt": True,
                             "skip_special_tokens": True, "presence_penalty": 0, "user": "someone"})
c.check(st == 200, "the refused members' neutral values are answered", data[:300])

# ---------------------------------------------------------------- CORS off
ORIGIN = {"Origin": "http://a.test"}
st, hd, data = request(port, "GET", "/v1/models", headers=ORIGIN)
c.check(st == 200 and "access-control-allow-origin" not in hd, "CORS off: no Access-Control-Allow-Origin", hd)
st, hd, data = request(port, "OPTIONS", CH, headers=dict(ORIGIN, **{"Access-Control-Request-Method": "POST"}))
c.check(st == 405 and hd.get("allow") == "POST" and "access-control-allow-origin" not in hd,
        "CORS off: OPTIONS is a 405 (Allow: POST), as any other method", "%d %s" % (st, hd))

# ---------------------------------------------------------------- the openai package
openai_missing = None
try:
    import openai  # noqa: E402
except ImportError:
    openai_missing = "the openai package is not importable (test_serve.sh installs it into a venv)"

if openai_missing is None:
    cl = openai.OpenAI(base_url="http://%s:%d/v1" % (HOST, port), api_key="none", max_retries=0, timeout=60)
    mo = cl.models.retrieve(MODEL)
    c.check(mo.id == MODEL and mo.object == "model", "openai: models.retrieve(id)")
    try:
        cl.models.retrieve("gpt-4")
        c.check(False, "openai: models.retrieve of another id is refused")
    except openai.NotFoundError as ex:
        c.check(ex.status_code == 404, "openai: models.retrieve of another id is NotFoundError (404)")
    msgs = [{"role": "user", "content": LONG}]
    one = cl.chat.completions.create(model=MODEL, messages=msgs, max_tokens=N_TOK, temperature=0)
    r = cl.chat.completions.create(model=MODEL, messages=msgs, max_tokens=N_TOK, temperature=0, n=3)
    c.check([x.index for x in r.choices] == [0, 1, 2]
            and all(x.message.content == one.choices[0].message.content for x in r.choices)
            and r.usage.completion_tokens == 3 * one.usage.completion_tokens
            and r.usage.prompt_tokens == one.usage.prompt_tokens, "openai: chat n = 3, greedy: three equal choices")
    r = cl.completions.create(model=MODEL, prompt="def f(x):", max_tokens=N_TOK, temperature=0.9, seed=7, n=3)
    singles = [cl.completions.create(model=MODEL, prompt="def f(x):", max_tokens=N_TOK, temperature=0.9,
                                     seed=7 + i).choices[0].text for i in range(3)]
    c.check([x.text for x in r.choices] == singles, "openai: sampled n = 3: choice i is the n = 1 answer of seed + i",
            "%r vs %r" % ([x.text for x in r.choices], singles))
    chunks = list(cl.chat.completions.create(model=MODEL, messages=msgs, max_tokens=N_TOK, temperature=0, n=3,
                                             stream=True, stream_options={"include_usage": True}))
    texts, roles, finishes = {}, {}, {}
    for chk in chunks:
        for x in chk.choices:
            texts[x.index] = texts.get(x.index, "") + (x.delta.content or "")
            if x.delta.role:
                roles[x.index] = roles.get(x.index, 0) + 1
            if x.finish_reason:
                finishes[x.index] = x.finish_reason
    c.check(sorted(texts) == [0, 1, 2] and all(t == one.choices[0].message.content for t in texts.values())
            and roles == {0: 1, 1: 1, 2: 1} and finishes == {i: one.choices[0].finish_reason for i in range(3)},
            "openai: streamed chat n = 3: each choice's role once, its text, its finish_reason",
            "%r %r %r" % (texts, roles, finishes))
    c.check(chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3 * one.usage.completion_tokens,
            "openai: streamed chat n = 3: the include_usage chunk last, summed", chunks[-1])
    try:
        cl.completions.create(model=MODEL, prompt="x", max_tokens=1, extra_body={"length_penalty": 1.3})
        c.check(False, "openai: length_penalty is refused")
    except openai.BadRequestError as ex:
        c.check(ex.status_code == 400 and "length_penalty" in str(ex), "openai: length_penalty is a 400")
srv.stop()

# ---------------------------------------------------------------- CORS on
r = subprocess.run([TANDEM, "serve", "-m", TARGET, "--port", "0", "--cors-origin", "http://a.test/"],
                   capture_output=True, text=True, timeout=60)
c.check(r.returncode == 2 and "option --cors-origin: 'http://a.test/' is not an origin" in r.stderr
        and "listening" not in r.stderr, "--cors-origin with a path: refused (exit 2)", r.stderr[:300])
r = subprocess.run([TANDEM, "serve", "-m", TARGET, "--port", "0", "--cors-origin", ""], capture_output=True, text=True,
                   timeout=60)
c.check(r.returncode == 2 and "option --cors-origin: empty" in r.stderr, "--cors-origin '': refused (exit 2)",
        r.stderr[:300])
with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
    f.write("[model]\ntarget = %s\n[server]\nport = 0\ncors_origin = a.test\n" % TARGET)
r = subprocess.run([TANDEM, "serve", f.name], capture_output=True, text=True, timeout=60)
os.unlink(f.name)
c.check(r.returncode == 1 and ":5: [server] cors_origin: 'a.test' is not an origin" in r.stderr,
        "[server] cors_origin without a scheme: refused, FILE:LINE named", r.stderr[:300])

srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--api-key", "k", "--cors-origin", "http://a.test,http://b.test"])
port = srv.port
AUTH = {"Authorization": "Bearer k"}
st, hd, _ = request(port, "OPTIONS", CH, headers={"Origin": "http://b.test", "Access-Control-Request-Method": "POST",
                                                 "Access-Control-Request-Headers": "authorization, content-type"})
c.check(st == 204 and hd.get("access-control-allow-origin") == "http://b.test"
        and "POST" in hd.get("access-control-allow-methods", "")
        and hd.get("access-control-allow-headers") == "authorization, content-type" and hd.get("vary") == "Origin",
        "CORS on: a preflight of a listed origin is 204 with its origin, methods and headers (no key needed)", hd)
st, hd, _ = request(port, "OPTIONS", "/v1/models", headers=ORIGIN)
c.check(st == 204 and "GET" in hd.get("access-control-allow-methods", ""), "CORS on: preflight of GET /v1/models", hd)
st, hd, _ = request(port, "OPTIONS", "/v1/nothing", headers=ORIGIN)
c.check(st == 404, "CORS on: a preflight of an unknown endpoint is its 404", st)
st, hd, data = post(port, C, {"prompt": "x", "max_tokens": 2}, headers=dict(ORIGIN, **AUTH))
c.check(st == 200 and hd.get("access-control-allow-origin") == "http://a.test", "CORS on: an answer carries the origin",
        hd)
st, hd, data = post(port, C, {"prompt": "x", "max_tokens": 2, "stream": True}, headers=dict(ORIGIN, **AUTH))
c.check(st == 200 and hd.get("access-control-allow-origin") == "http://a.test" and sse(data)[1],
        "CORS on: a stream carries the origin", hd)
st, hd, data = post(port, C, {"prompt": "x"}, headers=ORIGIN)
c.check(st == 401 and hd.get("access-control-allow-origin") == "http://a.test",
        "CORS on: an error (401) carries the origin (the browser shows it)", hd)
st, hd, data = request(port, "GET", "/v1/models", headers=dict(AUTH, Origin="http://c.test"))
c.check(st == 200 and "access-control-allow-origin" not in hd, "CORS on: an origin not listed gets no header", hd)
srv.stop()
srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--cors-origin", "*"])
st, hd, data = request(srv.port, "GET", "/health", headers={"Origin": "http://any.test"})
c.check(st == 200 and hd.get("access-control-allow-origin") == "*", "--cors-origin '*': any origin", hd)
srv.stop()
c.finish(openai_missing)
