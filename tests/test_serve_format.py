"""test_serve_format.py - structured output in `tandem serve`: response_format json_object and
json_schema, llama-server's grammar and json_schema extensions, with the draft (speculation
under the grammar), whole and streamed.

usage: python3 test_serve_format.py TANDEM [full|reduced]

  - the pycode pair, the OpenAI chat and completion endpoints: response_format json_object
    answers a JSON object; json_schema (strict) an object the schema validates (with the
    jsonschema package where installed, else a check of this schema's keywords); the
    streamed deltas put together are the whole answer; grammar (GBNF) and json_schema in
    the body constrain a completion; the draft changes no greedy answer
  - bad constraints: an invalid grammar or schema is a 400 naming where (line:column,
    the schema path), two constraints at once a 400 naming the member
  - with the openai package: client.chat.completions.create(response_format=...) whole
    and streamed
Prints 'N passed, N failed'; exits 1 on a failure, 77 when the openai package is missing
(after the other checks pass).
"""
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serve_util import HOST, MODELS, TARGET, Checks, Server, post  # noqa: E402

TANDEM = sys.argv[1]
DRAFT = os.path.join(MODELS, "pycode-draft-s-f16.gguf")
c = Checks()

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer"},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "n", "ok"], "additionalProperties": False}

try:
    import jsonschema  # noqa: E402
except ImportError:
    jsonschema = None


def valid(v):
    if jsonschema is not None:
        try:
            jsonschema.validate(v, SCHEMA)
            return True
        except jsonschema.ValidationError:
            return False
    return (isinstance(v, dict) and list(v) == ["name", "n", "ok"] and isinstance(v["name"], str) and
            len(v["name"]) <= 12 and isinstance(v["n"], int) and not isinstance(v["n"], bool) and
            isinstance(v["ok"], bool))


def body_of(st, data):
    try:
        return json.loads(data)
    except ValueError:
        return {"raw": data[:300]}


def chat(port, body):
    st, _, data = post(port, "/v1/chat/completions", body, timeout=120)
    return st, body_of(st, data)


def complete(port, body):
    st, _, data = post(port, "/v1/completions", body, timeout=120)
    return st, body_of(st, data)


def stream_text(port, path, body):
    st, _, data = post(port, path, dict(body, stream=True), timeout=120)
    text = ""
    for line in data.decode().split("\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ch = json.loads(line[6:])
        for choice in ch.get("choices", []):
            text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
    return st, text


MSG = [{"role": "user", "content": "Describe a person as JSON."}]
RF_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": SCHEMA}}

outs = {}
for label, args in (("target only", ["-m", TARGET, "-t", "1"]), ("with the draft", ["-m", TARGET, "-d", DRAFT, "-t", "1"])):
    srv = Server(TANDEM, args)
    port = srv.port
    base = {"max_tokens": 60, "temperature": 0}
    st, r = chat(port, dict(base, messages=MSG, response_format={"type": "json_object"}))
    content = r["choices"][0]["message"]["content"] if st == 200 else None
    try:
        obj = json.loads(content) if content is not None else None
    except ValueError:
        obj = None
    ok_obj = isinstance(obj, dict) or (st == 200 and r["choices"][0]["finish_reason"] == "length")
    c.check(st == 200 and ok_obj, "%s: response_format json_object answers a JSON object" % label, r)
    st, r = chat(port, dict(base, messages=MSG, response_format=RF_SCHEMA))
    content = r["choices"][0]["message"]["content"] if st == 200 else ""
    try:
        v = json.loads(content)
    except ValueError:
        v = None
    c.check(st == 200 and r["choices"][0]["finish_reason"] == "stop" and valid(v),
            "%s: response_format json_schema (strict): the schema validates the answer" % label, r)
    st2, streamed = stream_text(port, "/v1/chat/completions", dict(base, messages=MSG, response_format=RF_SCHEMA))
    c.check(st2 == 200 and streamed == content, "%s: json_schema streamed equals whole" % label, (streamed, content))
    st, r = complete(port, dict(base, prompt="import os\n", grammar='root ::= "def " [a-z_]+ "(" [a-z, ]* "):"'))
    text = r["choices"][0]["text"] if st == 200 else ""
    c.check(st == 200 and re.fullmatch(r"def [a-z_]+\([a-z, ]*\):", text) and r["choices"][0]["finish_reason"] == "stop",
            "%s: the grammar extension constrains a completion" % label, r)
    st, r = complete(port, dict(base, prompt="x = ", json_schema={"type": "array", "items": {"type": "integer"},
                                                                     "maxItems": 3}))
    try:
        v = json.loads(r["choices"][0]["text"]) if st == 200 else None
    except ValueError:
        v = None
    c.check(isinstance(v, list) and len(v) <= 3 and all(isinstance(x, int) for x in v),
            "%s: the json_schema extension constrains a completion" % label, r)
    outs[label] = (content, text)
    # bad constraints
    st, r = chat(port, dict(base, messages=MSG, grammar="root ::= \"a\" nothing"))
    e = r.get("error", {})
    c.check(st == 400 and "grammar: line 1:" in e.get("message", ""), "%s: a bad grammar is a 400 naming line:column"
            % label, r)
    st, r = chat(port, dict(base, messages=MSG, response_format={"type": "json_schema", "json_schema": {
        "name": "p", "schema": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x+"}}}}}))
    e = r.get("error", {})
    c.check(st == 400 and "#/properties/a" in e.get("message", ""), "%s: a bad schema is a 400 naming its path" % label,
            r)
    st, r = chat(port, dict(base, messages=MSG, response_format={"type": "json_object"}, json_schema={}))
    e = r.get("error", {})
    c.check(st == 400 and e.get("param") == "json_schema", "%s: two constraints are a 400" % label, r)
    if label == "with the draft":
        openai_missing = None
        try:
            import openai  # noqa: E402
        except ImportError:
            openai_missing = "the openai package is not importable (test_serve.sh installs it into a venv)"
        if openai_missing is None:
            cl = openai.OpenAI(base_url="http://%s:%d/v1" % (HOST, port), api_key="x", max_retries=0, timeout=120)
            m = cl.models.list().data[0].id
            r = cl.chat.completions.create(model=m, messages=MSG, max_tokens=60, temperature=0, response_format=RF_SCHEMA)
            whole = r.choices[0].message.content
            try:
                v = json.loads(whole)
            except ValueError:
                v = None
            c.check(valid(v), "openai: response_format json_schema", whole)
            s = "".join((ch.choices[0].delta.content or "") for ch in cl.chat.completions.create(
                model=m, messages=MSG, max_tokens=60, temperature=0, response_format=RF_SCHEMA, stream=True)
                if ch.choices)
            c.check(s == whole, "openai: streamed json_schema equals whole", (s, whole))
            try:
                cl.chat.completions.create(model=m, messages=MSG, max_tokens=8, response_format={
                    "type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object", "properties": {
                        "a": {"type": "string", "format": "email"}}}}})
                c.check(False, "openai: an unsupported schema keyword is a BadRequestError")
            except openai.BadRequestError as ex:
                c.check("#/properties/a" in str(ex), "openai: an unsupported schema keyword is a BadRequestError", ex)
    srv.stop()
c.check(outs["target only"] == outs["with the draft"], "the draft changes no greedy constrained answer",
        outs)
c.finish(openai_missing)
