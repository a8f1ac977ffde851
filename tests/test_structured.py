#!/usr/bin/env python3
"""test_structured.py — structured output and tool calls of `flashlm serve` through the clients people use, at the
versions pinned below (CI installs them: .ci/run), run by CTest.

With Qwen2.5-Coder-0.5B-Instruct from the model cache (flashlm pull qwen2.5-coder-0.5b; its chat template has a tool
format), greedy:
- openai: `client.chat.completions.parse(response_format=<pydantic model>)` gives a parsed instance; a tool call
  with `tools` + `tool_choice="required"` round trip (the call, the tool's result sent back, a reply);
- langchain-openai: `ChatOpenAI.with_structured_output(<pydantic model>)` gives an instance; `bind_tools([...],
  tool_choice=...)` gives an AIMessage whose `tool_calls` name the tool with valid arguments;
- litellm: `completion(model="openai/...", tools=..., tool_choice="required")` gives tool_calls;
- the `llm` CLI (an OpenAI-compatible model in extra-openai-models.yaml): `llm --schema` prints JSON that validates.
A client that is not installed is skipped with the reason (a failure with FLASHLM_REQUIRE_MODELS=1, where CI has
installed them); exit 77 when none is installed or the model is not pulled (a failure with FLASHLM_REQUIRE_MODELS=1).

usage: test_structured.py FLASHLM_BINARY
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

SKIP = 77
PINS = {"openai": "3.57.0", "langchain-openai": "1.8.1", "litellm": "1.110.2", "llm": "0.36"}
REQUIRE = os.environ.get("FLASHLM_REQUIRE_MODELS") == "1"
if len(sys.argv) != 2:
    print(__doc__)
    sys.exit(2)
CLI = sys.argv[1]
CACHE = os.environ.get("FLASHLM_CACHE") or os.path.join(
    os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "flashlm")
QWEN = os.path.join(CACHE, "models", "qwen2.5-coder-0.5b.gguf")
KEY = "structured-key"
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no fetch of its price list (offline runs)

failures, passed, skipped = [], [], []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


def version(dist):
    try:
        from importlib.metadata import version as v
        return v(dist)
    except Exception:
        return None


def missing(client, why):
    msg = "%s: %s (python3 -m pip install '%s==%s'; CI installs it in .ci/run)" % (client, why, client, PINS[client])
    if REQUIRE:
        check(False, msg + " [FLASHLM_REQUIRE_MODELS=1]")
    else:
        print("test_structured: SKIPPED", msg, flush=True)
        skipped.append(client)


class Server:
    def __init__(self, model, *args):
        self.proc = subprocess.Popen([CLI, "serve", "-m", model, "--port", "0", "--api-key", KEY, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.log, self.port = [], None
        deadline = time.time() + 120
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"on http://127\.0\.0\.1:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            self.proc.kill()
            raise SystemExit("test_structured: the server did not start:\n" + "".join(self.log))
        self.drain = threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True)
        self.drain.start()
        self.base = "http://127.0.0.1:%d/v1" % self.port
        self.model = "qwen2.5-coder-0.5b"

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "hung"


ASK_PERSON = "Describe a programmer called Ann, 31 years old, who knows Python and C, as JSON."
ASK_WEATHER = "What is the weather in Paris?"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "the city"}},
                   "required": ["city"], "additionalProperties": False}}}


def person_ok(p):
    return isinstance(p.name, str) and p.name and isinstance(p.age, int) and isinstance(p.languages, list) and \
        all(isinstance(x, str) for x in p.languages)


def test_openai(srv, Person):
    import openai
    c = openai.OpenAI(base_url=srv.base, api_key=KEY, max_retries=0, timeout=600)
    r = c.chat.completions.parse(model=srv.model, messages=[{"role": "user", "content": ASK_PERSON}],
                                 response_format=Person, temperature=0, max_tokens=120)
    p = r.choices[0].message.parsed
    check(isinstance(p, Person) and person_ok(p), "openai .parse(): a Person: %r" % (p,))
    # a tool round trip
    msgs = [{"role": "user", "content": ASK_WEATHER}]
    r = c.chat.completions.create(model=srv.model, messages=msgs, tools=[WEATHER], tool_choice="required",
                                  temperature=0, max_tokens=60)
    m = r.choices[0].message
    ok = check(r.choices[0].finish_reason == "tool_calls" and m.tool_calls and
               m.tool_calls[0].function.name == "get_weather", "openai: a get_weather call: %r" % m)
    if ok:
        args = json.loads(m.tool_calls[0].function.arguments)
        check(isinstance(args.get("city"), str) and set(args) == {"city"}, "openai: arguments %r" % args)
        msgs += [m.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": json.dumps({"temperature_c": 21})}]
        r = c.chat.completions.create(model=srv.model, messages=msgs, tools=[WEATHER], temperature=0, max_tokens=40)
        m2 = r.choices[0].message
        check(bool(m2.content) or bool(m2.tool_calls), "openai: a reply after the tool's result: %r" % m2)


def test_langchain(srv, Person):
    from langchain_openai import ChatOpenAI
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return "21 C"

    llm = ChatOpenAI(base_url=srv.base, api_key=KEY, model=srv.model, temperature=0, max_tokens=120, max_retries=0)
    p = llm.with_structured_output(Person).invoke(ASK_PERSON)
    check(isinstance(p, Person) and person_ok(p), "langchain with_structured_output: a Person: %r" % (p,))
    p = llm.with_structured_output(Person, method="json_mode").invoke(ASK_PERSON + " Keys: name, age, languages.")
    check(isinstance(p, Person), "langchain with_structured_output json_mode: a Person: %r" % (p,))
    msg = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(ASK_WEATHER)
    tc = msg.tool_calls
    check(len(tc) == 1 and tc[0]["name"] == "get_weather" and isinstance(tc[0]["args"].get("city"), str),
          "langchain bind_tools: a get_weather call: %r" % tc)
    msg = llm.bind_tools([get_weather], tool_choice="any").invoke(ASK_WEATHER)
    check(len(msg.tool_calls) >= 1 and msg.tool_calls[0]["name"] == "get_weather",
          "langchain bind_tools any: %r" % msg.tool_calls)


def test_litellm(srv):
    import litellm
    r = litellm.completion(model="openai/" + srv.model, api_base=srv.base, api_key=KEY,
                           messages=[{"role": "user", "content": ASK_WEATHER}], tools=[WEATHER],
                           tool_choice="required", temperature=0, max_tokens=60)
    m = r.choices[0].message
    ok = check(r.choices[0].finish_reason == "tool_calls" and m.tool_calls and
               m.tool_calls[0].function.name == "get_weather", "litellm: a get_weather call: %r" % m)
    if ok:
        check(isinstance(json.loads(m.tool_calls[0].function.arguments).get("city"), str),
              "litellm: arguments %r" % m.tool_calls[0].function.arguments)
    r = litellm.completion(model="openai/" + srv.model, api_base=srv.base, api_key=KEY,
                           messages=[{"role": "user", "content": ASK_PERSON}], temperature=0, max_tokens=120,
                           response_format={"type": "json_object"})
    try:
        check(isinstance(json.loads(r.choices[0].message.content), dict), "litellm json_object: an object")
    except ValueError:
        check(False, "litellm json_object: not JSON: %r" % r.choices[0].message.content)


def test_llm_cli(srv, exe):
    home = tempfile.mkdtemp(prefix="flm-llm-")
    try:
        with open(os.path.join(home, "extra-openai-models.yaml"), "w") as f:
            f.write("- model_id: flashlm\n  model_name: %s\n  api_base: \"%s\"\n  api_key_name: flashlm\n"
                    "  supports_schema: true\n  supports_tools: true\n" % (srv.model, srv.base))
        with open(os.path.join(home, "keys.json"), "w") as f:
            json.dump({"flashlm": KEY}, f)
        env = dict(os.environ, LLM_USER_PATH=home)
        r = subprocess.run([exe, "-m", "flashlm", "--no-log", "-o", "temperature", "0", "-o", "max_tokens", "120",
                            "--schema", "name, age int, languages", ASK_PERSON], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=600)
        ok = check(r.returncode == 0, "llm --schema: exit %d: %s" % (r.returncode, r.stderr[-500:]))
        if ok:
            try:
                v = json.loads(r.stdout)
                check(isinstance(v, dict) and isinstance(v.get("name"), str) and isinstance(v.get("age"), int) and
                      isinstance(v.get("languages"), str), "llm --schema: validates: %r" % v)
            except ValueError:
                check(False, "llm --schema: not JSON: %r" % r.stdout)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main():
    if not os.path.exists(QWEN):
        if REQUIRE:
            print("test_structured: FAILED: qwen2.5-coder-0.5b is not pulled (FLASHLM_REQUIRE_MODELS=1)")
            sys.exit(1)
        print("test_structured: SKIPPED: qwen2.5-coder-0.5b is not pulled (flashlm pull qwen2.5-coder-0.5b)")
        sys.exit(SKIP)
    have = {}
    for client, module in (("openai", "openai"), ("langchain-openai", "langchain_openai"), ("litellm", "litellm")):
        try:
            __import__(module)
            have[client] = True
        except ImportError:
            missing(client, "not installed")
    llm_exe = shutil.which("llm")
    if llm_exe and version("llm"):
        have["llm"] = True
    else:
        missing("llm", "the llm CLI is not installed")
    try:
        import pydantic
    except ImportError:
        pydantic = None
        for c in ("openai", "langchain-openai"):
            if have.pop(c, None):
                missing(c, "pydantic is not installed")
    if not have:
        print("test_structured: SKIPPED: no client installed")
        sys.exit(1 if failures else SKIP)
    for c in have:
        v = version(c)
        print("test_structured: %s %s%s" % (c, v, "" if v == PINS[c] else " (pinned: %s)" % PINS[c]), flush=True)
    Person = None
    if pydantic:
        class Person(pydantic.BaseModel):
            name: str
            age: int
            languages: list[str]
    srv = Server(QWEN, "-c", "2048")
    try:
        for c, fn in (("openai", lambda: test_openai(srv, Person)), ("langchain-openai", lambda: test_langchain(srv, Person)),
                      ("litellm", lambda: test_litellm(srv)), ("llm", lambda: test_llm_cli(srv, llm_exe))):
            if c not in have:
                continue
            n = len(failures)
            try:
                fn()
            except Exception as e:  # a client's exception is this client's failure; the others still run
                check(False, "%s: %s: %s" % (c, type(e).__name__, e))
            (passed if len(failures) == n else []).append(c)
            print("test_structured: %s %s" % (c, "passed" if len(failures) == n else "FAILED"), flush=True)
    finally:
        check(srv.stop() == 0, "the server stops on SIGTERM (exit 0)")
    print("test_structured: passed: %s; skipped: %s" % (", ".join(passed) or "none", ", ".join(skipped) or "none"))
    if failures:
        print("test_structured: %d FAILED" % len(failures))
        sys.exit(1)
    print("test_structured: all passed")


if __name__ == "__main__":
    main()
