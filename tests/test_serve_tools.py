"""test_serve_tools.py - tool calling in `tandem serve` (tools, tool_choice, agents' histories).

usage: python3 test_serve_tools.py TANDEM [full|reduced]

  - the pycode target with the real Qwen 2.5 chat template (tests/data/chat/qwen2.5.jinja):
    an agent's history (an assistant message with tool_calls and content null, then a
    role tool message) is rendered and answered; the tools reach the prompt (more
    prompt tokens) unless tool_choice is none; streamed and whole answers agree under
    tools; tool_choice required / named give calls of the tools (named: of that one)
    whose arguments follow the parameters' schemas, whole and streamed (a grammar of the
    template's call format); every refused input (functions, strict tools with tool_choice
    auto, a named tool not offered, tool_choice required with response_format, malformed
    histories and tools) is a 400 naming the member
  - the pycode target with Qwen3's template: the reasoning split is found (the ready
    line), and chat answers (which do not begin with <think>) stream as they answer whole
  - with the real Qwen2.5-Coder-1.5B-Instruct in models/real/ (skipped without it, and in
    the reduced mode): a weather question comes back as a parsed get_weather call,
    whole and streamed, and the round trip with the tool's answer is accepted; twenty
    conversations over three tools are calls (at least 18 with tool_choice auto, all 20
    with required) whose arguments follow the tools' parameters
The model's output parsing itself is tested in C (tests/test_tool_calls.c, the answers in
tests/test_serve_request.c).  Prints 'N passed, N failed'; exits 1 on a failure, 77 when
the openai package is missing (after the other checks pass).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import HOST, MODELS, TARGET, Checks, Server, post  # noqa: E402

TANDEM = sys.argv[1]
REDUCED = len(sys.argv) > 2 and sys.argv[2] == "reduced"
HERE = os.path.dirname(os.path.abspath(__file__))
QWEN_TEMPLATE = os.path.join(HERE, "data", "chat", "qwen2.5.jinja")
QWEN3_TEMPLATE = os.path.join(HERE, "data", "chat", "qwen3.jinja")
REAL = os.path.join(MODELS, "real", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")

c = Checks()

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
HISTORY = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature_c\": 18}"},
]


def err_of(data):
    try:
        return json.loads(data)["error"]
    except (ValueError, KeyError, TypeError):
        return {}


def expect_error(port, body, param, needle, what):
    st, _, data = post(port, "/v1/chat/completions", body)
    e = err_of(data)
    c.check(st == 400 and e.get("param") == param and needle in e.get("message", ""),
            "%s -> 400 naming '%s'" % (what, param), "got %d %s" % (st, data[:300]))


def chat(port, body):
    st, _, data = post(port, "/v1/chat/completions", body, timeout=120)
    return st, (json.loads(data) if st == 200 else err_of(data))


# ---------------------------------------------------------------- pycode, Qwen's template
srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--chat-template", QWEN_TEMPLATE])
port = srv.port
base = {"max_tokens": 8, "temperature": 0}
c.check(any("tool calls in the format hermes" in line for line in srv.log),
        "the ready line names the template's tool call format (hermes)", "".join(srv.log)[-300:])

st, r = chat(port, dict(base, messages=HISTORY, tools=[WEATHER]))
c.check(st == 200 and r["choices"][0]["message"]["role"] == "assistant",
        "an agent's history (tool_calls with content null, a tool message) is rendered and answered", r)
st_hist = st
st, r_none = chat(port, dict(base, messages=HISTORY, tools=[WEATHER], tool_choice="none"))
st2, r_bare = chat(port, dict(base, messages=HISTORY))
if st_hist == 200 and st == 200 and st2 == 200:
    n_tools, n_none, n_bare = (x["usage"]["prompt_tokens"] for x in (r, r_none, r_bare))
    c.check(n_tools > n_none + 20, "the tools are rendered into the prompt (%d tokens, %d with tool_choice none)"
            % (n_tools, n_none))
    c.check(n_none == n_bare, "tool_choice none: the model is not told about the tools (%d = %d tokens)"
            % (n_none, n_bare))
else:
    c.check(False, "tool_choice none and no tools are answered", (r_none, r_bare))
st, r = chat(port, dict(base, messages=HISTORY, tools=[WEATHER], tool_choice="auto", parallel_tool_calls=False))
c.check(st == 200, "tool_choice auto and parallel_tool_calls false are accepted", r)

# tool_choice required / named: a grammar of the template's calls (hermes here) holds the
# output to calls of the tools offered, their arguments to the parameters' schemas
# (enums, so that a call ends within max_tokens whatever the small model prefers)
UNITS = {"type": "function", "function": {
    "name": "set_unit", "description": "Set the temperature unit",
    "parameters": {"type": "object", "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["unit"], "additionalProperties": False}}}
LIGHT = {"type": "function", "function": {
    "name": "switch_light", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}},
                                           "required": ["on"], "additionalProperties": False}}}
ASK = [{"role": "user", "content": "Use the tools."}]
forced = dict(base, max_tokens=256)


def calls_of(r):
    m = r["choices"][0]["message"]
    return [(tc["function"]["name"], json.loads(tc["function"]["arguments"])) for tc in m.get("tool_calls") or []]


for name, choice, tools, want in [
        ("required", "required", [UNITS, LIGHT], None),
        ("named", {"type": "function", "function": {"name": "switch_light"}}, [UNITS, LIGHT], "switch_light"),
        ("required, a strict tool", "required", [{"type": "function", "function": dict(UNITS["function"], strict=True)}],
         "set_unit")]:
    st, r = chat(port, dict(forced, messages=ASK, tools=tools, tool_choice=choice, parallel_tool_calls=False))
    ok = st == 200 and r["choices"][0]["finish_reason"] == "tool_calls"
    calls = calls_of(r) if ok else []
    good = len(calls) == 1 and (want is None or calls[0][0] == want) and (
        (calls[0][0] == "set_unit" and calls[0][1].get("unit") in ("celsius", "fahrenheit") and len(calls[0][1]) == 1) or
        (calls[0][0] == "switch_light" and isinstance(calls[0][1].get("on"), bool) and len(calls[0][1]) == 1))
    c.check(ok and good and not r["choices"][0]["message"].get("content"),
            "tool_choice %s: one call, of the tool named, its arguments valid" % name, r)
# (parallel calls allowed: the small model repeats its call until max_tokens, so the
# last one may be cut; the whole ones are calls)
st, r = chat(port, dict(forced, messages=ASK, tools=[UNITS, LIGHT], tool_choice="required"))
c.check(st == 200 and len(calls_of(r)) >= 1 and all(n in ("set_unit", "switch_light") for n, _ in calls_of(r)),
        "tool_choice required with parallel calls allowed: calls", r)
expect_error(port, dict(base, messages=ASK, tools=[UNITS], tool_choice={"type": "function", "function": {"name": "x"}}),
             "tool_choice", "names 'x', which is not among 'tools'", "tool_choice naming a tool not offered")
expect_error(port, dict(base, messages=ASK, tool_choice="required"), "tool_choice", "needs 'tools'",
             "tool_choice required without tools")
expect_error(port, dict(base, messages=ASK, tools=[UNITS], tool_choice="required",
                        response_format={"type": "json_object"}),
             "tool_choice", "cannot be combined with 'response_format'", "tool_choice required with response_format")
expect_error(port, dict(base, messages=HISTORY, functions=[WEATHER["function"]]), "functions",
             "use 'tools' and 'tool_choice'", "the deprecated functions")
strict = {"type": "function", "function": dict(WEATHER["function"], strict=True)}
expect_error(port, dict(base, messages=HISTORY, tools=[strict]), "tools", "strict: true needs tool_choice",
             "a strict tool with tool_choice auto")
expect_error(port, dict(base, messages=HISTORY, tools=[{"type": "function", "function": {"name": "a b"}}]), "tools",
             "'tools'[0].function.name must be 1 to 64", "a tool named with a space")
bad = [dict(m) for m in HISTORY]
bad[2]["tool_calls"] = [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": 5}}]
expect_error(port, dict(base, messages=bad), "messages",
             "'messages'[2].tool_calls[0].function.arguments must be a string", "arguments that are a number")
bad = [dict(m) for m in HISTORY]
bad[3]["tool_call_id"] = 1
expect_error(port, dict(base, messages=bad), "messages", "'messages'[3].tool_call_id must be a string",
             "a tool_call_id that is a number")

openai_missing = None
try:
    import openai  # noqa: E402
except ImportError:
    openai_missing = "the openai package is not importable (test_serve.sh installs it into a venv)"


def stream_message(cl, **kw):
    """A streamed chat's content and tool calls, reassembled as a client does."""
    content, calls, finish = "", {}, None
    for ch in cl.chat.completions.create(stream=True, **kw):
        if not ch.choices:
            continue
        d = ch.choices[0].delta
        content += d.content or ""
        for tc in d.tool_calls or []:
            call = calls.setdefault(tc.index, {"id": None, "name": None, "arguments": ""})
            if tc.id:
                call["id"] = tc.id
            if tc.function and tc.function.name:
                call["name"] = tc.function.name
            if tc.function and tc.function.arguments:
                call["arguments"] += tc.function.arguments
        finish = ch.choices[0].finish_reason or finish
    return content, [calls[k] for k in sorted(calls)], finish


if openai_missing is None:
    cl = openai.OpenAI(base_url="http://%s:%d/v1" % (HOST, port), api_key="x", max_retries=0, timeout=120)
    prompts = ["Write a Python function that adds two numbers.", "What is the weather in Oslo?"]
    for p in prompts:
        msgs = [{"role": "user", "content": p}]
        r = cl.chat.completions.create(model=r_bare["model"], messages=msgs, tools=[WEATHER], max_tokens=16,
                                       temperature=0)
        content, calls, finish = stream_message(cl, model=r_bare["model"], messages=msgs, tools=[WEATHER],
                                                max_tokens=16, temperature=0)
        m = r.choices[0].message
        same = (m.content or "") == content and len(m.tool_calls or []) == len(calls) and \
            finish == r.choices[0].finish_reason
        c.check(same, "openai: streamed and whole answers agree under tools (%r)" % p[:30],
                "%r %r / %r %r" % (m.content, m.tool_calls, content, calls))
    r = cl.chat.completions.create(model=r_bare["model"], messages=ASK, tools=[UNITS, LIGHT], max_tokens=256,
                                   temperature=0, tool_choice={"type": "function", "function": {"name": "set_unit"}})
    tc = r.choices[0].message.tool_calls or []
    c.check(len(tc) >= 1 and all(t.function.name == "set_unit" for t in tc) and
            json.loads(tc[0].function.arguments).get("unit") in ("celsius", "fahrenheit"),
            "openai: tool_choice naming set_unit gives set_unit calls with valid arguments", r)
    content, calls, finish = stream_message(cl, model=r_bare["model"], messages=ASK, tools=[UNITS, LIGHT],
                                            max_tokens=256, temperature=0, tool_choice="required")
    c.check(calls and all(x["name"] in ("set_unit", "switch_light") for x in calls) and
            all(isinstance(json.loads(x["arguments"]), dict) for x in calls),
            "openai: tool_choice required, streamed: calls whose arguments parse", (content, calls, finish))
rc = srv.stop()
c.check(rc == 0, "the server stops cleanly", "".join(srv.log)[-500:])

# ---------------------------------------------------------------- pycode, Qwen3's template (reasoning)
srv = Server(TANDEM, ["-m", TARGET, "-t", "1", "--chat-template", QWEN3_TEMPLATE])
c.check(any("tool calls in the format hermes, reasoning split from <think>" in line for line in srv.log),
        "Qwen3's template: the ready line names the hermes format and the reasoning split", "".join(srv.log)[-300:])
if openai_missing is None:
    cl = openai.OpenAI(base_url="http://%s:%d/v1" % (HOST, srv.port), api_key="x", max_retries=0, timeout=120)
    for tools in ([], [WEATHER]):
        msgs = [{"role": "user", "content": "def add(a, b):"}]
        kw = dict(model=r_bare["model"], messages=msgs, max_tokens=12, temperature=0)
        if tools:
            kw["tools"] = tools
        r = cl.chat.completions.create(**kw)
        content, calls, finish = stream_message(cl, **kw)
        m = r.choices[0].message
        c.check((m.content or "") == content and finish == r.choices[0].finish_reason and
                not getattr(m, "reasoning_content", None),
                "Qwen3's template: streamed and whole answers agree, no reasoning without <think> (%s tools)"
                % len(tools), "%r / %r" % (m, content))
    st, r = chat(srv.port, dict(base, messages=HISTORY + [{"role": "assistant", "content": "18 C.",
                                                           "reasoning_content": "The tool said 18."}]))
    c.check(st == 200, "Qwen3's template: a history with reasoning_content is answered", r)
srv.stop()

# ---------------------------------------------------------------- the real Qwen2.5-Coder-1.5B
real_skipped = None
if REDUCED or not os.path.exists(REAL):
    real_skipped = "the real model checks (models/real/%s%s)" % (os.path.basename(REAL),
                                                                 ", reduced mode" if REDUCED else " missing")
else:
    srv = Server(TANDEM, ["-m", REAL, "-t", "2"], timeout=120)
    q = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    st, r = chat(srv.port, {"messages": q, "tools": [WEATHER], "max_tokens": 60, "temperature": 0})
    calls = r["choices"][0]["message"].get("tool_calls") if st == 200 else None
    ok = bool(calls) and calls[0]["function"]["name"] == "get_weather" and \
        json.loads(calls[0]["function"]["arguments"]).get("city") == "Paris" and \
        r["choices"][0]["finish_reason"] == "tool_calls" and calls[0]["id"].startswith("call_")
    c.check(ok, "real Qwen2.5-Coder-1.5B: a weather question is a parsed get_weather call", r)
    if openai_missing is None and ok:
        cl = openai.OpenAI(base_url="http://%s:%d/v1" % (HOST, srv.port), api_key="x", max_retries=0, timeout=120)
        content, scalls, finish = stream_message(cl, model=r["model"], messages=q, tools=[WEATHER], max_tokens=60,
                                                 temperature=0)
        c.check(finish == "tool_calls" and len(scalls) == 1 and scalls[0]["name"] == "get_weather" and
                json.loads(scalls[0]["arguments"]) == json.loads(calls[0]["function"]["arguments"]) and not content,
                "real Qwen2.5-Coder-1.5B: the streamed call is the same", (content, scalls, finish))
        hist = q + [{"role": "assistant", "content": None, "tool_calls": [calls[0]]},
                    {"role": "tool", "tool_call_id": calls[0]["id"], "content": "{\"temperature_c\": 18}"}]
        r2 = cl.chat.completions.create(model=r["model"], messages=hist, tools=[WEATHER], max_tokens=24, temperature=0)
        c.check(r2.choices[0].finish_reason in ("stop", "length", "tool_calls"),
                "real Qwen2.5-Coder-1.5B: the round trip with the tool's answer is answered", r2)
    # twenty conversations over three tools: with tool_choice auto the questions that need a
    # tool come back as calls, and every call (auto or required) parses and its arguments
    # follow the tool's parameters
    TOOLS = [WEATHER, {"type": "function", "function": {
        "name": "convert_currency", "description": "Convert an amount of money between currencies",
        "parameters": {"type": "object", "properties": {
            "amount": {"type": "number"}, "from": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]},
            "to": {"type": "string", "enum": ["USD", "EUR", "GBP", "JPY"]}},
            "required": ["amount", "from", "to"], "additionalProperties": False}}},
        {"type": "function", "function": {
            "name": "search_docs", "description": "Search the documentation",
            "parameters": {"type": "object", "properties": {
                "query": {"type": "string"}, "max_results": {"type": "integer"}},
                "required": ["query"], "additionalProperties": False}}}]
    ASKS = ["What is the weather in %s?" % x for x in ("Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Rome")] + \
        ["Convert %d %s to %s." % x for x in ((100, "USD", "EUR"), (250, "EUR", "GBP"), (5000, "JPY", "USD"),
                                             (12, "GBP", "JPY"), (80, "USD", "GBP"), (999, "EUR", "USD"))] + \
        ["Search the documentation for %s." % x for x in ("asyncio timeouts", "list comprehensions", "dataclasses",
                                                          "type hints", "context managers", "f-strings", "pathlib")]

    def valid(name, args):
        if name == "get_weather":
            return set(args) == {"city"} and isinstance(args["city"], str)
        if name == "convert_currency":
            cur = ("USD", "EUR", "GBP", "JPY")
            return set(args) == {"amount", "from", "to"} and isinstance(args["amount"], (int, float)) and \
                args["from"] in cur and args["to"] in cur
        if name == "search_docs":
            return "query" in args and isinstance(args["query"], str) and set(args) <= {"query", "max_results"} and \
                isinstance(args.get("max_results", 1), int)
        return False

    for mode in ("auto", "required"):
        n_calls, bad = 0, []
        for ask in ASKS:
            st, r = chat(srv.port, {"messages": [{"role": "user", "content": ask}], "tools": TOOLS, "max_tokens": 80,
                                    "temperature": 0, "tool_choice": mode, "parallel_tool_calls": False})
            calls = r["choices"][0]["message"].get("tool_calls") if st == 200 else None
            if calls:
                n_calls += 1
                args = json.loads(calls[0]["function"]["arguments"])
                if not valid(calls[0]["function"]["name"], args):
                    bad.append((ask, calls[0]["function"]))
            elif mode == "required":
                bad.append((ask, r))
        c.check(not bad and n_calls >= (20 if mode == "required" else 18),
                "real Qwen2.5-Coder-1.5B, tool_choice %s: %d of 20 conversations are calls, every one valid"
                % (mode, n_calls), bad)
    srv.stop()
c.finish(openai_missing or real_skipped)
