"""test_serve.py - `tandem serve` end to end on loopback, with the pycode pair.

usage: python3 test_serve.py TANDEM [full|reduced]

  - the `openai` package (when importable; test_serve.sh installs it into a venv):
    completions and chat, streaming and not; greedy output equals `tandem generate`'s;
    stream_options.include_usage; the API key (401 without it); /v1/models
  - every bad input with its status code and message (raw HTTP): malformed JSON, wrong
    types, unknown model, max_tokens out of range, a body over the limit (413), a prompt
    longer than the context (400 with the numbers), n over its limit, unknown endpoints
  - a request over its timeout_s ends with finish_reason "length" and tandem.timeout
  - a client that disconnects (streaming, or a reset connection) cancels its request:
    its KV blocks are freed (/metrics); seeds over the whole uint64 range;
    usage.spec.tokens_per_forward
  - startup refusals: an empty API key (flag or [server] key), a missing chat template
    file or a mistyped template name, a log file that cannot be opened
  - /health and /metrics (the counters and histograms the issue lists)
  - overload: with max_queue 2 a burst gets 429 with Retry-After, every accepted
    request completes
  - SIGTERM: a stream in flight completes, new connections are refused, exit 0
Prints 'N passed, N failed'; exits 1 on a failure, 77 when the openai package is
missing (after the other checks pass).
"""
import concurrent.futures
import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import DRAFT, HOST, TARGET, Checks, Server, metrics, post, request, wait_until  # noqa: E402

TANDEM = sys.argv[1]
REDUCED = len(sys.argv) > 2 and sys.argv[2] == "reduced"
KEY = "test-key-123"
AUTH = {"Authorization": "Bearer " + KEY}
MODEL = "pycode-target-f16"
N_TOK = 16
PROMPTS = ["def fibonacci(n):", "import os\n\ndef list_files(path):", "class Stack:\n    def __init__(self):"]
if REDUCED:
    PROMPTS = PROMPTS[:2]

c = Checks()


def generate(prompts, chat):
    """`tandem generate`'s greedy texts for the prompts (one process, --json)."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i, p in enumerate(prompts):
            f.write(json.dumps({"id": i, "prompt": p}) + "\n")
        path = f.name
    args = [TANDEM, "generate", "-m", TARGET, "-d", DRAFT, "--prompts", path, "-n", str(N_TOK), "--json", "-t", "1"]
    if chat:
        args += ["--chat", "--chat-template", "chatml"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    os.unlink(path)
    if out.returncode != 0:
        raise RuntimeError("tandem generate failed: " + out.stderr)
    return [json.loads(line)["text"] for line in out.stdout.splitlines() if line.strip()]


def err_of(data):
    try:
        return json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        return {}


def expect_error(port, path, body, status, needle, what, headers=None, param=None):
    st, hd, data = post(port, path, body, headers=headers if headers is not None else AUTH)
    e = err_of(data)
    ok = st == status and needle in e.get("message", "") and (param is None or e.get("param") == param)
    ok = ok and hd.get("content-type") == "application/json" and "type" in e
    c.check(ok, "%s -> %d '%s'" % (what, status, needle), "got %d %s" % (st, data[:300]))


# ---------------------------------------------------------------- server A
srv = Server(TANDEM, ["-m", TARGET, "-d", DRAFT, "-t", "1", "--max-batch", "4", "--api-key", KEY,
                      "--max-body-kb", "64"])
port = srv.port
st, _, data = request(port, "GET", "/health")
c.check(st == 200 and json.loads(data).get("status") == "ok", "GET /health is 200 {status: ok} once ready", data)
st, _, data = request(port, "GET", "/v1/models", headers=AUTH)
c.check(st == 200 and json.loads(data)["data"][0]["id"] == MODEL, "GET /v1/models lists the model", data)



def cli(args):
    return subprocess.run([TANDEM, "serve"] + args, capture_output=True, text=True, timeout=60)


r = cli(["-m", TARGET, "--host", HOST, "--port", str(port)])
c.check(r.returncode == 1 and "cannot listen on 127.0.0.1 port %d" % port in r.stderr, "a port in use: exit 1, named",
        r.stderr)
r = cli(["-m", TARGET, "--port", "70000"])
c.check(r.returncode == 2 and "option --port: 70000 is out of range [0, 65535]" in r.stderr, "a bad flag: exit 2",
        r.stderr)
r = cli(["-m", TARGET, "--spec-k", "4"])
c.check(r.returncode == 2 and "has no effect without -d DRAFT" in r.stderr, "--spec-k without a draft: exit 2",
        r.stderr)
with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
    f.write("[model]\ntarget = %s\n[server]\nmax_queue = -1\n" % TARGET)
r = cli([f.name])
c.check(r.returncode == 1 and ":4: [server] max_queue: '-1' is not an integer" in r.stderr,
        "a bad [server] key: exit 1, FILE:LINE named", r.stderr)
r = cli([os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "serve.ini"), "--set",
         "server.nope=1"])
c.check(r.returncode == 1 and "[server] nope: unknown key" in r.stderr, "an unknown [server] key", r.stderr)
os.unlink(f.name)
r = cli(["-m", TARGET, "--port", "0", "--api-key", ""])
c.check(r.returncode == 2 and "option --api-key: empty" in r.stderr and "listening" not in r.stderr,
        "--api-key '': refused (exit 2), not an open server", r.stderr[:300])
with tempfile.NamedTemporaryFile("w", suffix=".ini", delete=False) as f:
    f.write("[model]\ntarget = %s\n[server]\nport = 0\napi_key =\n" % TARGET)
r = cli([f.name])
c.check(r.returncode == 1 and ":5: [server] api_key: empty" in r.stderr and "listening" not in r.stderr,
        "[server] api_key empty: refused, FILE:LINE named", r.stderr[:300])
os.unlink(f.name)
r = cli(["-m", TARGET, "--port", "0", "--chat-template", "/nonexistent/t.jinja"])
c.check(r.returncode == 1 and "chat template /nonexistent/t.jinja: No such file" in r.stderr
        and "listening" not in r.stderr, "--chat-template naming a missing file: refused before the load", r.stderr[:300])
r = cli(["-m", TARGET, "--port", "0", "--chat-template", "chatmll"])
c.check(r.returncode == 1 and "chat template 'chatmll' cannot be used" in r.stderr and "serve: ready" not in r.stderr,
        "--chat-template with a mistyped name: refused at startup, never ready", r.stderr[-300:])
r = cli(["-m", TARGET, "--port", "0", "--log-file", "/nonexistent/serve.log"])
c.check(r.returncode == 1 and "log file /nonexistent/serve.log: cannot open it for appending" in r.stderr,
        "--log-file in a missing directory: refused at startup", r.stderr[:300])

want = generate(PROMPTS, chat=False)
want_chat = generate(PROMPTS, chat=True)

openai_missing = None
try:
    import openai  # noqa: E402
except ImportError:
    openai_missing = "the openai package is not importable (test_serve.sh installs it into a venv)"

if openai_missing is None:
    cl = openai.OpenAI(base_url="http://%s:%d/v1" % (HOST, port), api_key=KEY, max_retries=0, timeout=60)
    c.check([m.id for m in cl.models.list().data] == [MODEL], "openai: models.list()")
    for i, p in enumerate(PROMPTS):
        r = cl.completions.create(model=MODEL, prompt=p, max_tokens=N_TOK, temperature=0)
        c.check(r.choices[0].text == want[i], "openai: completion %d equals tandem generate's" % i,
                "%r vs %r" % (r.choices[0].text, want[i]))
        c.check(r.usage.completion_tokens == N_TOK and r.choices[0].finish_reason == "length",
                "openai: completion %d usage and finish_reason" % i, r)
        chunks = list(cl.completions.create(model=MODEL, prompt=p, max_tokens=N_TOK, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        c.check(text == want[i], "openai: streamed completion %d equals tandem generate's" % i,
                "%r vs %r" % (text, want[i]))
        c.check(len(chunks) >= 3 and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == N_TOK
                and chunks[-2].choices[0].finish_reason == "length",
                "openai: stream %d ends with finish_reason, then the usage chunk" % i)
        msgs = [{"role": "user", "content": p}]
        r = cl.chat.completions.create(model=MODEL, messages=msgs, max_tokens=N_TOK, temperature=0)
        c.check(r.choices[0].message.content == want_chat[i] and r.choices[0].message.role == "assistant",
                "openai: chat %d equals tandem generate --chat's" % i,
                "%r vs %r" % (r.choices[0].message.content, want_chat[i]))
        chunks = list(cl.chat.completions.create(model=MODEL, messages=msgs, max_tokens=N_TOK, temperature=0,
                                                 stream=True))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        c.check(text == want_chat[i] and chunks[0].choices[0].delta.role == "assistant",
                "openai: streamed chat %d equals tandem generate --chat's" % i, "%r vs %r" % (text, want_chat[i]))
    # token trees through tandem's own member: the same greedy text, every step a tree
    for tree in (8, "auto", "2,2,1"):
        r = cl.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=N_TOK, temperature=0,
                                  extra_body={"spec_tree": tree})
        c.check(r.choices[0].text == want[1], "openai: spec_tree %r gives tandem generate's text" % (tree,),
                "%r vs %r" % (r.choices[0].text, want[1]))
    r = cl.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=N_TOK, temperature=0, stop=["\n\n"])
    c.check(r.choices[0].finish_reason == "stop" and "\n\n" not in r.choices[0].text
            and want[0].startswith(r.choices[0].text), "openai: a stop string ends the text before it", r)
    r = cl.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0.8, seed=5, top_p=0.9)
    r2 = cl.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, temperature=0.8, seed=5, top_p=0.9)
    c.check(r.choices[0].text == r2.choices[0].text, "openai: a sampled request with a seed repeats")
    try:
        openai.OpenAI(base_url="http://%s:%d/v1" % (HOST, port), api_key="wrong", max_retries=0).models.list()
        c.check(False, "openai: a wrong API key is refused")
    except openai.AuthenticationError as e:
        c.check(e.status_code == 401, "openai: a wrong API key is refused with 401")
    try:
        cl.completions.create(model="gpt-4", prompt="x", max_tokens=4)
        c.check(False, "openai: an unknown model is refused")
    except openai.NotFoundError as e:
        c.check(e.status_code == 404 and "gpt-4" in str(e), "openai: an unknown model is NotFoundError (404)")
    try:
        cl.completions.create(model=MODEL, prompt="x", max_tokens=4, n=17)
        c.check(False, "openai: n=17 is refused")
    except openai.BadRequestError as e:
        c.check(e.status_code == 400 and "[1, 16]" in str(e), "openai: n=17 is BadRequestError (400)")

# ---------------------------------------------------------------- bad input, raw
C, CH = "/v1/completions", "/v1/chat/completions"
expect_error(port, C, {"prompt": "x"}, 401, "API key", "no Authorization header", headers={})
expect_error(port, C, {"prompt": "x"}, 401, "API key", "a wrong bearer token", headers={"Authorization": "Bearer x"})
expect_error(port, C, '{"prompt": "x",', 400, "not valid JSON", "malformed JSON")
expect_error(port, C, "[1]", 400, "must be a JSON object", "a body that is not an object")
expect_error(port, C, {"prompt": 5}, 400, "'prompt' must be a string or an array of token ids", "a prompt of a wrong type",
             param="prompt")
expect_error(port, C, {"prompt": "x", "max_tokens": "16"}, 400, "'max_tokens' must be an integer, not a string",
             "max_tokens as a string", param="max_tokens")
expect_error(port, C, {"prompt": "x", "temperature": "hot"}, 400, "'temperature' must be a number",
             "temperature as a string", param="temperature")
expect_error(port, C, {"prompt": "x", "stream": 1}, 400, "'stream' must be a boolean", "stream as a number")
expect_error(port, C, {"prompt": "x", "model": "gpt-4"}, 404, "The model 'gpt-4' does not exist", "an unknown model",
             param="model")
expect_error(port, C, {"prompt": "x", "max_tokens": 0}, 400, "'max_tokens' is 0, out of range [1, 1023]",
             "max_tokens 0")
expect_error(port, C, {"prompt": "x", "max_tokens": 5000}, 400, "'max_tokens' is 5000, out of range [1, 1023]",
             "max_tokens beyond the context")
expect_error(port, C, {"prompt": "x", "n": 17}, 400, "'n' is 17, out of range [1, 16]", "n over its limit", param="n")
expect_error(port, C, {"prompt": "x", "top_p": 0}, 400, "'top_p' is 0, out of range (0, 1]", "top_p 0")
expect_error(port, C, {"prompt": "x", "stop": [1]}, 400, "'stop'[0]", "a stop list with a number")
expect_error(port, C, {"prompt": "x", "spec_tree": "2x2"}, 400, "'2x2' is not off, auto, a node budget",
             "a malformed spec_tree")
expect_error(port, C, {"prompt": "x", "logprobs": 21}, 400, "'logprobs' is 21, out of range [0, 20]", "logprobs over 20")
expect_error(port, CH, {"messages": "hi"}, 400, "'messages' must be an array of messages", "messages as a string")
expect_error(port, CH, {"messages": [{"content": "x"}]}, 400, "'messages'[0].role must be a non-empty string",
             "a message without a role")
expect_error(port, C, {"prompt": "x" * (70 * 1024)}, 413, "larger than the limit of 65536 bytes", "a body over the limit")
long_prompt = "def f(x):\n    return x\n" * 200
st, _, data = post(port, C, {"prompt": long_prompt, "max_tokens": 4}, headers=AUTH)
e = err_of(data)
c.check(st == 400 and "maximum context length is 1024 tokens" in e.get("message", "")
        and "your prompt is" in e["message"] and e.get("code") == "context_length_exceeded",
        "a prompt longer than the context -> 400 with the numbers", data[:300])
st, _, data = post(port, C, {"prompt": "def f(x):\n    return x\n" * 40, "max_tokens": 1000}, headers=AUTH)
e = err_of(data)
c.check(st == 400 and "you requested" in e.get("message", "") and "in the completion" in e["message"],
        "prompt + max_tokens over the context -> 400 with the numbers", data[:300])
st, _, data = request(port, "GET", "/v1/nothing", headers=AUTH)
c.check(st == 404 and "no such endpoint" in err_of(data).get("message", ""), "an unknown endpoint -> 404", data)
st, _, data = request(port, "GET", C, headers=AUTH)
c.check(st == 405 and "takes POST" in err_of(data).get("message", ""), "GET on a POST endpoint -> 405", data)

# seeds: the API's uint64 whole
for seed in (2 ** 63, 2 ** 64 - 1):
    st, _, data = post(port, C, {"prompt": "x", "max_tokens": 2, "seed": seed, "temperature": 0.7}, headers=AUTH)
    c.check(st == 200, "seed %d is taken" % seed, data[:200])
expect_error(port, C, {"prompt": "x", "seed": 2 ** 64}, 400, "in [-9223372036854775808, 18446744073709551615]",
             "a seed past 2^64 - 1: the range named", param="seed")
# usage.spec: tokens per target forward (forwards counts them), as tandem generate --json
st, _, data = post(port, C, {"prompt": PROMPTS[0], "max_tokens": N_TOK, "temperature": 0}, headers=AUTH)
sp = json.loads(data)["usage"]["spec"] if st == 200 else {}
c.check(sp.get("forwards", 0) > 0 and "tokens_per_step" not in sp and sp.get("tokens_per_forward", 0) >= 1
        and sp["tokens_per_forward"] * sp["forwards"] <= N_TOK + 0.01,
        "usage.spec: forwards and tokens_per_forward (the tokens they committed, per forward)", sp)

# ---------------------------------------------------------------- timeout
st, _, data = post(port, C, {"prompt": PROMPTS[0], "max_tokens": 1000, "timeout_s": 0.02, "temperature": 0},
                   headers=AUTH)
ch = json.loads(data)["choices"][0] if st == 200 else {}
c.check(st == 200 and ch.get("finish_reason") == "length" and ch.get("tandem", {}).get("timeout") is True
        and json.loads(data)["usage"]["completion_tokens"] < 1000,
        "timeout_s: finish_reason length with tandem.timeout, the text so far", data[:400])


# ---------------------------------------------------------------- disconnects
def cancelled():
    return metrics(port).get('tandem_engine_requests_total{outcome="cancelled"}', 0)


def raw_send(body):
    s = socket.create_connection((HOST, port), timeout=30)
    b = json.dumps(body).encode()
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % (C, KEY, len(b))).encode() + b)
    return s


n0 = cancelled()
s = raw_send({"prompt": PROMPTS[1], "max_tokens": 1000, "stream": True, "ignore": 1})
first = s.recv(4096)
s.close()
ok = wait_until(lambda: cancelled() >= n0 + 1, 10)
m = metrics(port)
c.check(b"200 OK" in first and ok and m.get("tandem_requests_running") == 0 and m.get("tandem_kv_blocks_used") == 0,
        "a streaming client that disconnects cancels its request and frees its KV blocks",
        "first %r, metrics %s" % (first[:80], {k: v for k, v in m.items() if "kv" in k or "running" in k}))
# (a long request: sampled at a high temperature, an end of text is rare, so it runs to
# the context; the reset comes once the request is seen running, not after a fixed
# sleep, which a fast machine outran by finishing first)
s = raw_send({"prompt": PROMPTS[-1], "max_tokens": 1000, "temperature": 1.5, "seed": 7})
running = wait_until(lambda: metrics(port).get("tandem_requests_running", 0) >= 1, 10, step=0.005)
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # gone: the connection reset
s.close()
ok = wait_until(lambda: cancelled() >= n0 + 2, 10)
m = metrics(port)
c.check(running and ok and m.get("tandem_kv_blocks_used") == 0,
        "a waiting (non-streaming) client that disconnects cancels too",
        "seen running %s, cancelled %s, kv blocks %s" % (running, cancelled() - n0, m.get("tandem_kv_blocks_used")))

# ---------------------------------------------------------------- metrics
shared = "def f(x):\n    return x\n" * 8  # (several full KV blocks: what the prefix cache shares)
for _ in range(2):
    post(port, C, {"prompt": shared, "max_tokens": 2}, headers=AUTH)
post(port, C, {"prompt": PROMPTS[0], "max_tokens": N_TOK}, headers=AUTH)  # (speculates: drafted tokens)
m = metrics(port)
for name in ['tandem_http_requests_total{endpoint="completions",status="200"}',
             'tandem_http_requests_total{endpoint="completions",status="400"}',
             "tandem_time_to_first_token_seconds_count", "tandem_inter_token_latency_seconds_count",
             "tandem_prompt_tokens_total", "tandem_generation_tokens_total", "tandem_spec_drafted_tokens_total",
             "tandem_forward_steps_total"]:
    c.check(m.get(name, 0) > 0, "/metrics: %s > 0" % name, m.get(name))
for name in ["tandem_requests_waiting", "tandem_requests_running", "tandem_kv_blocks_free",
             "tandem_prefix_cache_hits_total", "tandem_prefix_cache_hit_tokens_total", "tandem_spec_acceptance_rate",
             "tandem_tokens_per_forward"]:
    c.check(name in m, "/metrics has %s" % name)
c.check(m.get("tandem_prefix_cache_hits_total", 0) > 0, "/metrics: repeated prompts hit the prefix cache")
c.check(srv.stop() == 0, "SIGTERM on an idle server: exit 0", "".join(srv.log)[-500:])

# ---------------------------------------------------------------- overload, SIGTERM
srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--max-batch", "1", "--max-queue", "2", "--shutdown-grace", "20"])
port = srv.port
N = 12


def one(i):
    return post(port, C, {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 48, "temperature": 0})


with concurrent.futures.ThreadPoolExecutor(N) as ex:
    res = list(ex.map(one, range(N)))
n429 = [r for r in res if r[0] == 429]
n200 = [r for r in res if r[0] == 200]
c.check(len(n429) >= 1 and len(n200) >= 2 and len(n429) + len(n200) == N,
        "a burst of %d over max_queue 2: %d answered 429, %d completed" % (N, len(n429), len(n200)),
        [r[0] for r in res])
c.check(all(r[1].get("retry-after") == "1" and "busy" in err_of(r[2]).get("message", "") for r in n429),
        "each 429 carries Retry-After and an error object")
c.check(all(json.loads(r[2])["usage"]["completion_tokens"] == 48 for r in n200), "every accepted request completes")

keep = http.client.HTTPConnection(HOST, port, timeout=30)  # a keep-alive connection open before SIGTERM
keep.request("GET", "/health")
r0 = keep.getresponse()
h0 = r0.status
r0.read()
s = raw_send({"prompt": PROMPTS[0], "max_tokens": 400, "stream": True, "temperature": 0})
s.settimeout(30)
got = s.recv(4096)
time.sleep(0.02)
srv.proc.send_signal(15)


def _connect_refused():
    try:
        socket.create_connection((HOST, port), timeout=1).close()
        return False
    except OSError:
        return True


refused = wait_until(_connect_refused, 5)
try:
    keep.request("GET", "/health")
    r = keep.getresponse()
    h1, body1 = r.status, r.read()
except OSError as e:
    h1, body1 = None, str(e)
keep.close()
c.check(h0 == 200 and h1 == 503 and b"shutting_down" in body1, "SIGTERM: /health turns 503 while draining",
        (h0, h1, body1))
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
s.close()
rc = srv.stop()
c.check(b"data: [DONE]" in got and b'"finish_reason": "length"' in got,
        "SIGTERM: the stream in flight completes", got[-200:])
c.check(refused, "SIGTERM: new connections are refused")
c.check(rc == 0, "SIGTERM: exit 0", "".join(srv.log)[-500:])
c.finish(openai_missing)
