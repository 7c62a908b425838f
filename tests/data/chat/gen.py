#!/usr/bin/env python3
"""Generates expected.jsonl: each chat template of this directory (NAME.jinja, listed
in templates.json with the model it comes from and its BOS/EOS texts) rendered over
each conversation of conversations.json, with add_generation_prompt off and on, by
Python's jinja2 exactly as HF transformers' apply_chat_template renders it:

  - ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
    loopcontrols extension;
  - the globals raise_exception (a TemplateError) and strftime_now (here a fixed
    date, 2025-02-10 00:00 UTC, so the outputs do not change from day to day);
  - transformers' tojson filter (json.dumps, ensure_ascii=False);
  - the variables messages, tools (None unless the conversation has tools),
    documents=None, add_generation_prompt, and bos_token / eos_token where the
    model's tokenizer has them.

Each line: {"template", "conversation", "add_generation_prompt", "output"} or, when
jinja2 fails, "error" (its message) and "raised" (true for raise_exception) in place
of "output".  tests/test_chat.c renders the same and compares.

usage: python3 -m venv /tmp/venv-chat && /tmp/venv-chat/bin/pip install jinja2
       /tmp/venv-chat/bin/python tests/data/chat/gen.py
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
NOW = datetime.datetime(2025, 2, 10, 0, 0, 0)


class Raised(jinja2.exceptions.TemplateError):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return NOW.strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    templates = json.load(open(os.path.join(HERE, "templates.json"), encoding="utf-8"))
    convs = json.load(open(os.path.join(HERE, "conversations.json"), encoding="utf-8"))
    env = environment()
    lines = []
    for name in sorted(templates):
        meta = templates[name]
        src = open(os.path.join(HERE, name + ".jinja"), encoding="utf-8").read()
        tmpl = env.from_string(src)
        for conv in convs:
            for agp in (False, True):
                kw = {"messages": conv["messages"], "tools": conv.get("tools"), "documents": None,
                      "add_generation_prompt": agp}
                for t in ("bos_token", "eos_token"):
                    if meta.get(t) is not None:
                        kw[t] = meta[t]
                row = {"template": name, "conversation": conv["name"], "add_generation_prompt": agp}
                try:
                    row["output"] = tmpl.render(**kw)
                except Raised as e:
                    row["error"] = str(e)
                    row["raised"] = True
                except Exception as e:  # the C renderer must fail too
                    row["error"] = "%s: %s" % (type(e).__name__, e)
                    row["raised"] = False
                lines.append(json.dumps(row, ensure_ascii=False))
    with open(os.path.join(HERE, "expected.jsonl"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("gen.py: %d renderings of %d templates (jinja2 %s)" % (len(lines), len(templates), jinja2.__version__),
          file=sys.stderr)


if __name__ == "__main__":
    main()
