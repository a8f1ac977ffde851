#!/usr/bin/env python3
"""test_serve_http.py — `flashlm serve`'s HTTP layer over raw sockets (standard library only), run by CTest.

Starts the server on stories260K (tests/data) and checks what a client library would hide:
- request smuggling (RFC 9112 section 6.1, 6.3): Content-Length with Transfer-Encoding, two different Content-Length
  values, a Transfer-Encoding that does not end in chunked, one with an unknown coding before chunked (501), a
  Transfer-Encoding in an HTTP/1.0 request: each answered once with 400 (501) and the connection closed, the bytes
  after the headers never answered as a second request;
- a client that half-closes after its request (shutdown of its sending side, as `nc -N`) gets its answer;
- the header and body timeouts (--header-timeout 1, --body-timeout 1): a client that sends part of its headers, or
  part of its body, is answered 408 and closed; an idle kept-alive connection is closed; the server answers others
  meanwhile;
- the connection limit (--max-connections 4): the fifth connection gets 503 while four idle ones are open, and once
  they close a new one is served; with the default limit 1000 idle connections do not lock a client out;
- without --api-key: a Host that is not an address of the server (DNS rebinding) is 403, a cross-origin POST from an
  origin --cors does not allow is 403, a POST that is not application/json is 415; --cors ORIGIN allows that origin
  (Access-Control-Allow-Origin on the answer and on the OPTIONS preflight) and no other; "localhost" allows the
  loopback origins;
- with --api-key: "bearer" in any case and x-api-key are accepted; --alias (repeated, comma lists) and --tags as
  llama-server lists them in /v1/models (sorted, the id the first alias), the aliases the model's names under
  --strict-model, the model's facts in its meta;
- the endpoints llama-server's users call: /tokenize and /detokenize (round trip), /props, /slots, /v1/models/{id},
  /completion (llama-server's fields), the routes without /v1, /v1/embeddings, /v1/responses (501), any model name
  served unless --strict-model (404), the context-length error's wording (and llama-server's fields beside it:
  exceed_context_size_error, n_prompt_tokens, n_ctx);
- llama-server's request fields: response_fields, verbose (__verbose: the prompt as text), logit_bias by text (equal to
  the bias of its token ids), stream_options.include_usage on /v1/completions, add_generation_prompt and
  continue_final_message, post_sampling_probs (the sampler's probabilities, against softmax(logprob / T) over the
  top-k of the same request's log-probabilities; 400 on /v1/completions), /v1/chat/completions/input_tokens, a JSON schema tuple,
  several prompts in one request (each answered as alone), a mixed sequence of ids and text, "n" choices,
  return_progress (the prompt's progress events, the reply unchanged);
  without --cors a loopback origin may call, a foreign one may not;
No timing assertions: the timeouts are made short by flags and only their effect is checked.

usage: test_serve_http.py FLASHLM_BINARY DATA_DIR
"""
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time

if len(sys.argv) != 3:
    print(__doc__)
    sys.exit(2)
CLI, DATA = sys.argv[1], sys.argv[2]
STORIES = os.path.join(DATA, "models", "stories260K", "stories260K.gguf")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)
    return cond


class Server:
    def __init__(self, *args):
        self.proc = subprocess.Popen([CLI, "serve", "-m", STORIES, "--port", "0", "-c", "256", "-t", "1", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log, self.port = [], None
        while True:
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
            raise SystemExit("test_serve_http: the server did not start:\n" + "".join(self.log))
        threading.Thread(target=lambda: [self.log.append(l) for l in self.proc.stderr], daemon=True).start()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "hung"


def connect(port):
    return socket.create_connection(("127.0.0.1", port), timeout=60)


def read_all(s):
    """Everything until the server closes the connection (None when it keeps it open for 20 s)."""
    s.settimeout(20)
    out = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                return out
            out += c
    except socket.timeout:
        return None
    except ConnectionResetError:
        return out


def read_response(s):
    """One response (status, headers dict lower-cased, body) from s, by Content-Length."""
    s.settimeout(60)
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            c = s.recv(65536)
            if not c:
                return None
            buf += c
        head, rest = buf.split(b"\r\n\r\n", 1)
        if not re.match(rb"HTTP/1\.[01] 1\d\d ", head):
            break
        buf = rest  # an interim 1xx response (a half-closed client gets a 100 Continue): the final one follows
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    hdrs = {}
    for l in lines[1:]:
        k, v = l.split(":", 1)
        hdrs[k.strip().lower()] = v.strip()
    n = int(hdrs.get("content-length", "0"))
    while len(rest) < n:
        c = s.recv(65536)
        if not c:
            break
        rest += c
    return status, hdrs, rest[:n]


def request(port, method, path, body=None, headers=None, half_close=False):
    """One request on a new connection: (status, headers, body); the connection is closed after."""
    h = {"Host": "127.0.0.1:%d" % port}
    if body is not None:
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        body = body.encode() if isinstance(body, str) else body
        h["Content-Type"] = "application/json"
        h["Content-Length"] = str(len(body))
    h.update(headers or {})
    raw = "%s %s HTTP/1.1\r\n" % (method, path) + "".join("%s: %s\r\n" % kv for kv in h.items() if kv[1] is not None)
    s = connect(port)
    s.sendall(raw.encode() + b"\r\n" + (body or b""))
    if half_close:
        s.shutdown(socket.SHUT_WR)
    r = read_response(s)
    s.close()
    return r


def n_responses(data):
    return len(re.findall(rb"HTTP/1\.[01] [2-5]\d\d ", data))


def test_smuggling(port):
    body = b'{"prompt":"Once","max_tokens":2}'
    smuggled = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    cases = [
        ("CL and TE", b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % (len(body) + 5),
         b"0\r\n\r\n" + smuggled, 400),
        ("TE and CL", b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", b"0\r\n\r\n" + smuggled, 400),
        ("two Content-Length", b"Content-Length: %d\r\nContent-Length: %d\r\n" % (len(body), len(body) + 10),
         body + smuggled, 400),
        ("a Content-Length list that differs", b"Content-Length: %d, 7\r\n" % len(body), body + smuggled, 400),
        ("Content-Length not a number", b"Content-Length: +%d\r\n" % len(body), body + smuggled, 400),
        ("unknown Transfer-Encoding", b"Transfer-Encoding: gzip\r\n", body + smuggled, 400),
        ("chunked not last", b"Transfer-Encoding: chunked, gzip\r\n", body + smuggled, 400),
        ("chunked twice", b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", b"0\r\n\r\n" + smuggled,
         400),
        ("an unknown coding before chunked", b"Transfer-Encoding: gzip, chunked\r\n", b"0\r\n\r\n" + smuggled, 501),
        # whitespace before the colon (RFC 9112 section 5.1): framed as chunked by a proxy that trims the name
        ("TE with a space before its colon", b"Content-Length: 4\r\nTransfer-Encoding : chunked\r\n",
         b"%x\r\n" % len(smuggled) + smuggled + b"\r\n0\r\n\r\n", 400),
        ("CL with a space before its colon", b"Content-Length : 4\r\nTransfer-Encoding: chunked\r\n",
         b"0\r\n\r\n" + smuggled, 400),
        ("a second Host", b"Host: evil.example\r\nContent-Length: %d\r\n" % len(body), body + smuggled, 400),
    ]
    for what, hdrs, rest, status in cases:
        s = connect(port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" + hdrs +
                  b"\r\n" + rest)
        data = read_all(s)
        s.close()
        if not check(data is not None, "%s: the connection is closed after the answer" % what):
            continue
        check(data.startswith(b"HTTP/1.1 %d " % status), "%s: status %d: %r" % (what, status, data[:120]))
        # the smuggled request after the body is never answered; libmicrohttpd itself refuses a Content-Length that
        # is not a number (before the server sees the headers), and writes its 400's head twice then (0.9.75):
        # still one status, the connection closed
        check(b"HTTP/1.1 200" not in data and b'"status":"ok"' not in data, "%s: nothing smuggled: %r" % (what, data))
        if b"not a number" not in what.encode() and b"list" not in what.encode():
            check(n_responses(data) == 1, "%s: one response, not two: %r" % (what, data[:400]))
        check(b"connection: close" in data.lower(), "%s: Connection: close" % what)
    # HTTP/1.0 with Transfer-Encoding
    s = connect(port)
    s.sendall(b"POST /v1/completions HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + smuggled)
    data = read_all(s)
    s.close()
    check(data is not None and data.startswith(b"HTTP/1.") and b" 400 " in data[:16] and n_responses(data) == 1,
          "HTTP/1.0 with Transfer-Encoding: 400 once: %r" % (data or b"")[:200])
    # a well-framed chunked request is served (the check refuses only the ambiguous ones)
    s = connect(port)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    data = read_all(s) or b""
    s.close()
    check(data.startswith(b"HTTP/1.1 200 ") and b'"completion_tokens":2' in data, "chunked body served: %r" %
          data[:200])


def test_half_close(port):
    st, _, body = request(port, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 3, "temperature": 0},
                          half_close=True)
    check(st == 200 and json.loads(body)["usage"]["completion_tokens"] == 3, "half-closed client answered: %s" % st)
    st, _, body = request(port, "GET", "/health", half_close=True)
    check(st == 200, "half-closed GET answered: %s" % st)


def metric(port, name):
    st, _, body = request(port, "GET", "/metrics")
    m = re.search(r"^flashlm_%s (\S+)$" % name, body.decode(), re.M)
    return float(m.group(1)) if m else None


def test_client_leaves():
    """A client that closes its connection while its (non-streamed) reply is generated cancels it: its end of input
    alone does not (half-close), but the interim 100 Continue the server then sends draws a reset from a closed
    socket."""
    srv = Server("-c", "2048", "--slots", "--metrics")  # a long reply: greedy stories260K fills 2048 tokens before it ends
    try:
        before = metric(srv.port, "requests_cancelled_total")
        s = connect(srv.port)
        body = json.dumps({"prompt": "I believe the meaning of life is", "max_tokens": 100000,
                           "temperature": 0}).encode()
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.time() + 30
        while time.time() < deadline and metric(srv.port, "requests_running") != 1:
            time.sleep(0.02)
        s.close()
        while time.time() < deadline and metric(srv.port, "requests_cancelled_total") <= before:
            time.sleep(0.05)
        check(metric(srv.port, "requests_cancelled_total") > before, "a client that left is cancelled")
        # the slot is marked free after the count: wait for it (under ASan the two are far apart)
        while True:
            st, _, b = request(srv.port, "GET", "/slots")
            if st != 200 or not json.loads(b)[0]["is_processing"] or time.time() >= deadline:
                break
            time.sleep(0.05)
        check(st == 200 and not json.loads(b)[0]["is_processing"], "its slot is free: %r" % b[:200])
    finally:
        check(srv.stop() == 0, "leaving client server: SIGTERM exit 0")


def test_timeouts():
    srv = Server("--header-timeout", "1", "--body-timeout", "1")
    try:
        # headers that never end
        s = connect(srv.port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        data = read_all(s)
        check(data is not None and data.startswith(b"HTTP/1.1 408"), "slow headers: 408 and closed: %r" % data)
        s.close()
        # headers trickled a byte at a time keep the connection active but do not extend the deadline
        s = connect(srv.port)
        closed = False
        for ch in b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200:
            try:
                s.sendall(bytes([ch]))
            except OSError:
                closed = True
                break
            time.sleep(0.05)
            s.setblocking(False)
            try:
                if s.recv(1 << 16, socket.MSG_PEEK) is not None:
                    closed = True
                    break
            except BlockingIOError:
                pass
            except OSError:
                closed = True
                break
            finally:
                s.setblocking(True)
        check(closed, "a slowloris client is cut off by the header deadline")
        s.close()
        # a body that never completes
        s = connect(srv.port)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\":")
        data = read_all(s)
        check(data is not None and data.startswith(b"HTTP/1.1 408"), "slow body: 408 and closed: %r" % data)
        s.close()
        # a kept-alive connection left idle is closed (silently) after its answer
        s = connect(srv.port)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        r = read_response(s)
        check(r is not None and r[0] == 200, "kept-alive: first answer")
        data = read_all(s)
        check(data == b"", "an idle kept-alive connection is closed without a response: %r" % data)
        s.close()
        check(request(srv.port, "GET", "/health")[0] == 200, "served after the timeouts")
    finally:
        check(srv.stop() == 0, "timeouts server: SIGTERM exit 0")


def test_connection_limit():
    srv = Server("--max-connections", "4")
    try:
        idle = [connect(srv.port) for _ in range(4)]
        time.sleep(0.2)  # the server has accepted them (their order against the fifth is what matters)
        st, hdrs, body = request(srv.port, "GET", "/health")
        check(st == 503 and json.loads(body)["error"]["code"] == "too_many_connections" and
              hdrs.get("connection") == "close", "the fifth connection: 503 %s %r" % (st, body[:200]))
        for s in idle:
            s.close()
        deadline = time.time() + 30
        st = None
        while time.time() < deadline:
            st = request(srv.port, "GET", "/health")[0]
            if st == 200:
                break
            time.sleep(0.1)
        check(st == 200, "served once the idle connections closed: %s" % st)
    finally:
        check(srv.stop() == 0, "limit server: SIGTERM exit 0")
    # the default limit: 1000 idle connections do not lock a client out (this process needs the descriptors too)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        print("test_serve_http: the hard limit on open files (%d) is below 1100: the 1000-connection part skipped" %
              hard)
        return
    if soft != resource.RLIM_INFINITY and soft < 1100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1100 if hard == resource.RLIM_INFINITY else min(hard, 4096), hard))
    srv = Server()
    try:
        idle = []
        for _ in range(1000):
            idle.append(connect(srv.port))
        st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 2})
        check(st == 200, "answered under 1000 idle connections: %s %r" % (st, body[:200]))
        for s in idle:
            s.close()
    finally:
        check(srv.stop() == 0, "1000 connections server: SIGTERM exit 0")


def test_browser_rules(port):
    ok = {"prompt": "Once", "max_tokens": 1}
    st, _, body = request(port, "GET", "/health", headers={"Host": "evil.example:%d" % port})
    check(st == 403, "a foreign Host (DNS rebinding) is refused: %s" % st)
    st, _, _ = request(port, "GET", "/health", headers={"Host": "localhost:%d" % port})
    check(st == 200, "Host localhost is served: %s" % st)
    # a target in absolute-form (RFC 9112 section 3.2.2: a server must accept it), its authority checked as a Host
    st, _, b = request(port, "GET", "http://127.0.0.1:%d/v1/models" % port)
    check(st == 200 and b'"data"' in b, "absolute-form GET /v1/models: %s %r" % (st, b[:100]))
    st, _, _ = request(port, "GET", "http://evil.example/v1/models")
    check(st == 403, "absolute-form with a foreign authority: %s" % st)
    st, _, body = request(port, "POST", "/v1/completions", ok, headers={"Origin": "http://evil.example"})
    check(st == 403 and b"--cors" in body, "a cross-origin POST is refused: %s %r" % (st, body[:200]))
    st, _, body = request(port, "POST", "/v1/completions", ok, headers={"Content-Type": "text/plain"})
    check(st == 415, "a text/plain POST is refused: %s" % st)
    st, _, body = request(port, "POST", "/v1/completions", ok,
                          headers={"Content-Type": "application/x-www-form-urlencoded"})
    check(st == 415, "a form POST is refused: %s" % st)
    st, hdrs, _ = request(port, "POST", "/v1/completions", ok, headers={"Origin": "http://127.0.0.1:%d" % port})
    check(st == 200 and hdrs.get("access-control-allow-origin") == "http://127.0.0.1:%d" % port,
          "a same-origin POST (the page) is served: %s %s" % (st, hdrs))
    st, hdrs, _ = request(port, "OPTIONS", "/v1/chat/completions",
                          headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
    check(st == 200 and "access-control-allow-origin" not in hdrs, "preflight of a foreign origin: no CORS headers")


def test_cors():
    srv = Server("--cors", "http://app.example:3000", "--cors", "localhost", "--no-slots")
    try:
        port = srv.port
        st, _, b = request(port, "GET", "/slots")
        check(st == 501 and "--no-slots" in b.decode(), "/slots with --no-slots: 501 (%s %r)" % (st, b))
        st, hdrs, _ = request(port, "OPTIONS", "/v1/chat/completions",
                              headers={"Origin": "http://app.example:3000", "Access-Control-Request-Method": "POST",
                                       "Access-Control-Request-Headers": "content-type, authorization"})
        check(st == 200 and hdrs.get("access-control-allow-origin") == "http://app.example:3000" and
              "POST" in hdrs.get("access-control-allow-methods", "") and
              "authorization" in hdrs.get("access-control-allow-headers", ""), "preflight allowed: %s %s" % (st, hdrs))
        st, hdrs, body = request(port, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 1},
                                 headers={"Origin": "http://app.example:3000"})
        check(st == 200 and hdrs.get("access-control-allow-origin") == "http://app.example:3000",
              "--cors origin served with Access-Control-Allow-Origin: %s" % st)
        for o in ("http://localhost:5173", "http://127.0.0.1", "http://[::1]:8000"):
            st, hdrs, _ = request(port, "OPTIONS", "/v1/completions", headers={"Origin": o})
            check(hdrs.get("access-control-allow-origin") == o, "--cors localhost allows %s" % o)
        for o in ("http://app.example:3001", "http://localhost.evil.example", "http://evil.example"):
            st, hdrs, _ = request(port, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 1},
                                  headers={"Origin": o})
            check(st == 403, "origin %s not in --cors: 403 (%s)" % (o, st))
    finally:
        check(srv.stop() == 0, "cors server: SIGTERM exit 0")


def test_key():
    # llama-server's --alias: repeated or a comma list, spaces stripped, repeats dropped, sorted (a std::set); the id is
    # the first in byte order; --tags likewise, informational. Under --strict-model the aliases are the model's names
    srv = Server("--api-key", "k-123", "--strict-model", "--alias", "tiny-b, tiny-a", "-a", "zeta,,tiny-a",
                 "--tags", "small,chat", "--tags", "chat")
    try:
        port = srv.port
        body = {"prompt": "Once", "max_tokens": 1}
        for h in ({"Authorization": "Bearer k-123"}, {"Authorization": "bearer k-123"},
                  {"Authorization": "BEARER  k-123"}, {"x-api-key": "k-123"}):
            st = request(port, "POST", "/v1/completions", body, headers=h)[0]
            check(st == 200, "key accepted as %s: %s" % (h, st))
        for h in ({}, {"Authorization": "Bearer k-12"}, {"Authorization": "Basic k-123"}, {"x-api-key": "k-1234"}):
            st = request(port, "POST", "/v1/completions", body, headers=h)[0]
            check(st == 401, "key refused as %s: %s" % (h, st))
        # with a key, any Host and Origin may call (the key is the gate)
        st = request(port, "POST", "/v1/completions", body,
                     headers={"x-api-key": "k-123", "Host": "box.lan", "Origin": "http://ui.example"})[0]
        check(st == 200, "with --api-key any Host/Origin: %s" % st)
        st, _, b = request(port, "POST", "/v1/completions", dict(body, model="gpt-4"), headers={"x-api-key": "k-123"})
        check(st == 404 and json.loads(b)["error"]["code"] == "model_not_found", "--strict-model: 404 (%s)" % st)
        key = {"x-api-key": "k-123"}
        st, _, b = request(port, "GET", "/v1/models", headers=key)
        m = json.loads(b)["data"][0] if st == 200 else {}
        check(m.get("id") == "tiny-a" and m.get("aliases") == ["tiny-a", "tiny-b", "zeta"] and
              m.get("tags") == ["chat", "small"], "--alias/--tags in /v1/models: %r" % m)
        # the model's facts (stories260K: vocab 512, d_model 64, the GGUF's context_length 2048; -c 256, one slot)
        meta = m.get("meta", {})
        check(meta.get("n_vocab") == 512 and meta.get("n_embd") == 64 and meta.get("n_ctx_train") == 2048 and
              meta.get("n_ctx") == 256 and meta.get("size") == os.path.getsize(STORIES), "/v1/models meta: %r" % meta)
        for name in ("tiny-a", "tiny-b", "zeta"):
            st, _, b = request(port, "POST", "/v1/completions", dict(body, model=name), headers=key)
            check(st == 200 and json.loads(b)["model"] == "tiny-a", "--strict-model: alias %s served: %s" % (name, st))
            st, _, b = request(port, "GET", "/v1/models/" + name, headers=key)
            check(st == 200 and json.loads(b)["id"] == "tiny-a", "/v1/models/%s: %s" % (name, st))
        for name in ("stories260K", "tiny"):  # with aliases the file name is not a name
            st = request(port, "POST", "/v1/completions", dict(body, model=name), headers=key)[0]
            check(st == 404, "--strict-model: %s is not a name: 404 (%s)" % (name, st))
            st = request(port, "GET", "/v1/models/" + name, headers=key)[0]
            check(st == 404, "/v1/models/%s: 404 (%s)" % (name, st))
    finally:
        check(srv.stop() == 0, "key server: SIGTERM exit 0")


def test_endpoints(port):
    text = "Once upon a time, there was a little dog."
    for m in ("GET", "POST", "DELETE"):  # /health is a GET (or a HEAD: curl -I), as every route has its methods
        st, _, b = request(port, m, "/health", {} if m == "POST" else None)
        check(st == (200 if m == "GET" else 405), "%s /health: %s %r" % (m, st, b[:80]))
    s = connect(port)
    s.sendall(b"HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    data = read_all(s) or b""
    s.close()
    check(data.startswith(b"HTTP/1.1 200 ") and not data.endswith(b"}"), "HEAD /health: 200, no body: %r" % data[:200])
    st, _, b = request(port, "POST", "/tokenize", {"content": text})
    ids = json.loads(b)["tokens"] if st == 200 else []
    check(st == 200 and len(ids) > 5 and all(isinstance(i, int) for i in ids), "/tokenize: %s %r" % (st, b[:100]))
    st, _, b2 = request(port, "POST", "/tokenize", {"content": text, "add_special": True})
    ids_bos = json.loads(b2)["tokens"]
    check(ids_bos[0] == 1 and ids_bos[1:] == ids, "/tokenize add_special: BOS (1) first: %r" % ids_bos[:4])
    st, _, b = request(port, "POST", "/detokenize", {"tokens": ids})
    check(st == 200 and json.loads(b)["content"].strip() == text, "/detokenize round trip: %r" % b[:100])
    st, _, b = request(port, "POST", "/tokenize", {"content": "caf\u00e9 \U0001F917", "with_pieces": True})
    toks = json.loads(b)["tokens"] if st == 200 else []
    check(st == 200 and toks and all("id" in t and "piece" in t for t in toks), "/tokenize with_pieces")
    # the byte tokens of the emoji come as byte values; joined, the pieces give the text back
    raw = b"".join(t["piece"].encode() if isinstance(t["piece"], str) else bytes(t["piece"]) for t in toks)
    check(raw.decode().strip() == "caf\u00e9 \U0001F917", "pieces join to the text: %r" % raw)
    st, _, b = request(port, "POST", "/detokenize", {"tokens": [1, 99999]})
    check(st == 400, "/detokenize of an id outside the vocabulary: 400 (%s)" % st)
    st, _, b = request(port, "GET", "/props")
    p = json.loads(b)
    check(st == 200 and p["total_slots"] == 2 and p["default_generation_settings"]["n_ctx"] == 128 and
          p["model_path"].endswith("stories260K.gguf"), "/props: %r" % p)
    st, _, b = request(port, "GET", "/slots")  # on by default, as llama-server's
    sl = json.loads(b) if st == 200 else None
    check(st == 200 and [x["id"] for x in sl] == [0, 1] and all(x["n_ctx"] == 128 and x["is_processing"] is False
                                                                  for x in sl), "/slots: %s %r" % (st, b))
    st, _, b = request(port, "GET", "/v1/models/stories260K")
    check(st == 200 and json.loads(b)["id"] == "stories260K", "/v1/models/{id}: %s" % st)
    st, _, b = request(port, "GET", "/v1/models/nope")
    check(st == 404, "/v1/models/{another id}: 404 (%s)" % st)
    for path in ("/models", "/v1/models"):
        st, _, b = request(port, "GET", path)
        m = json.loads(b)["data"][0] if st == 200 else {}
        check(m.get("id") == "stories260K" and m.get("aliases") == ["stories260K"] and m.get("tags") == [] and
              m.get("object") == "model", "GET %s: %r" % (path, m))
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}
    st, _, b = request(port, "POST", "/v1/completions", body)
    want = json.loads(b)["choices"][0]["text"]
    st, _, b = request(port, "POST", "/completions", body)  # llama-server's own response at /completions
    r = json.loads(b)
    check(st == 200 and r["content"] == want and r["stop"] is True and r["stop_type"] == "limit" and
          r["timings"]["predicted_n"] == 6 and r["tokens_predicted"] == 6 and r["truncated"] is False,
          "/completions (llama-server's fields): %r" % r)
    st, _, b = request(port, "POST", "/completion", {"prompt": ids_bos[:5], "n_predict": 4, "temperature": 0,
                                                     "return_tokens": True})
    r = json.loads(b)
    check(st == 200 and len(r["tokens"]) == 4 and r["timings"]["prompt_n"] + r["timings"]["cache_n"] == 5,
          "/completion with token ids: %r" % r)
    st, _, b = request(port, "POST", "/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                           "max_tokens": 3, "model": "gpt-3.5-turbo"})
    check(st == 200 and json.loads(b)["usage"]["completion_tokens"] == 3, "/chat/completions, any model name")
    # embeddings: unit length, base64 the same floats, each input of a batch as alone; the slot's cache is reset
    # after (a greedy completion afterwards is the one before)
    st, _, b = request(port, "POST", "/v1/embeddings", {"input": ["Once upon a time", "The dog"], "model": "x"})
    r = json.loads(b)
    vecs = [d["embedding"] for d in r["data"]] if st == 200 else []
    check(st == 200 and len(vecs) == 2 and r["usage"]["prompt_tokens"] > 4 and
          all(abs(sum(x * x for x in v) - 1) < 1e-4 for v in vecs), "/v1/embeddings: %s %r" % (st, b[:200]))
    st, _, b = request(port, "POST", "/v1/embeddings", {"input": "The dog", "encoding_format": "base64"})
    import base64, struct
    raw = base64.b64decode(json.loads(b)["data"][0]["embedding"]) if st == 200 else b""
    one = list(struct.unpack("<%df" % (len(raw) // 4), raw))
    check(len(vecs) == 2 and len(one) == len(vecs[1]) and max(abs(a - c) for a, c in zip(one, vecs[1])) < 1e-6,
          "/v1/embeddings base64 equals the floats, and an input alone equals it in a batch")
    for bad in ({"input": ""}, {"input": []}, {"input": [[1, 99999]]}, {"input": "x", "dimensions": 8},
                {"input": "x", "encoding_format": "int8"}):
        st = request(port, "POST", "/v1/embeddings", bad)[0]
        check(st == 400, "/v1/embeddings %r: 400 (%s)" % (bad, st))
    st, _, b = request(port, "POST", "/v1/completions", body)
    check(json.loads(b)["choices"][0]["text"] == want, "a completion after embeddings is unchanged")
    st, _, b = request(port, "POST", "/v1/responses", {"input": "hi"})
    check(st == 501 and "/v1/chat/completions" in json.loads(b)["error"]["message"], "/v1/responses: 501")
    st, _, b = request(port, "POST", "/v1/completions", {"prompt": "Once upon a time " * 100, "max_tokens": 4})
    msg = json.loads(b)["error"]["message"] if st == 400 else ""
    check(st == 400 and "maximum context length" in msg and "exceeds the available context size" in msg,
          "context error wording (litellm, llama.cpp): %r" % msg)


def sse(port, path, body):
    """A streamed request: the list of its events' JSON objects (until [DONE] or the end)."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    out = []
    for line in r.read().decode().split("\n"):
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            out.append(json.loads(line[6:]))
    c.close()
    return out


def test_llama_fields(port):
    prompt = "I believe the meaning of life is"
    # response_fields: only those, "a/b" from inside a; "prompt" is the prompt's tokens as text (BOS spelled out)
    st, _, b = request(port, "POST", "/completion", {"prompt": prompt, "n_predict": 5, "temperature": 0,
                                                     "response_fields": ["content", "generation_settings/n_predict",
                                                                         "prompt", "nothing/here"]})
    r = json.loads(b)
    check(st == 200 and sorted(r) == ["content", "generation_settings/n_predict", "prompt"] and
          r["generation_settings/n_predict"] == 5 and r["prompt"] == "<s> " + prompt,
          "/completion response_fields: %r" % r)
    full = json.loads(request(port, "POST", "/completion", {"prompt": prompt, "n_predict": 5, "temperature": 0})[2])
    check(full["content"] == r.get("content") and full["prompt"] == "<s> " + prompt, "/completion prompt: %r" % full)
    # verbose: __verbose carries the prompt as text: BOS, then the template's rendering (/apply-template)
    msgs = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]
    st, _, b = request(port, "POST", "/apply-template", {"messages": msgs})
    rendered = json.loads(b)["prompt"]
    st, _, b = request(port, "POST", "/chat/completions", {"messages": msgs, "max_tokens": 2, "verbose": True})
    r = json.loads(b)
    check(st == 200 and r["__verbose"]["prompt"] == "<s> " + rendered, "verbose: %r" % r.get("__verbose"))
    st, _, b = request(port, "POST", "/chat/completions", {"messages": msgs, "max_tokens": 2, "verbose": False})
    check(st == 200 and "__verbose" not in json.loads(b), "verbose false: no __verbose")
    # input_tokens: the prompt tokens a completion of those messages evaluates
    n_prompt = r["usage"]["prompt_tokens"]
    st, _, b = request(port, "POST", "/v1/chat/completions/input_tokens", {"messages": msgs})
    check(st == 200 and json.loads(b)["input_tokens"] == n_prompt, "input_tokens %r vs %d" % (b, n_prompt))
    # logit_bias by text: each of its tokens, the same as by their ids; it changes the greedy reply
    base = {"prompt": "Once upon a time", "n_predict": 8, "temperature": 0, "return_tokens": True}
    r0 = json.loads(request(port, "POST", "/completion", base)[2])
    first = json.loads(request(port, "POST", "/detokenize", {"tokens": r0["tokens"][:1]})[2])["content"]
    ids = json.loads(request(port, "POST", "/tokenize", {"content": first, "parse_special": False})[2])["tokens"]
    r1 = json.loads(request(port, "POST", "/completion", dict(base, logit_bias=[[first, False]]))[2])
    r2 = json.loads(request(port, "POST", "/completion", dict(base, logit_bias=[[i, False] for i in ids]))[2])
    r3 = json.loads(request(port, "POST", "/completion", dict(base, logit_bias={first: -100}))[2])
    check(r1["tokens"] == r2["tokens"] == r3["tokens"] and r1["tokens"][0] != r0["tokens"][0] and
          not set(ids) & set(r1["tokens"]), "logit_bias by text %r: %r %r %r (unbiased %r)" %
          (first, r1["tokens"], r2["tokens"], r3["tokens"], r0["tokens"]))
    st = request(port, "POST", "/completion", dict(base, logit_bias={"-3": 1}))[0]
    check(st == 400, "logit_bias key '-3': 400 (%s)" % st)
    # /v1/completions streamed: every chunk has a choice; the usage on the last, or alone with include_usage
    body = {"prompt": "Once", "max_tokens": 3, "temperature": 0, "stream": True}
    ev = sse(port, "/v1/completions", body)
    check(ev and all(len(e["choices"]) == 1 for e in ev) and ev[-1]["usage"]["completion_tokens"] == 3 and
          ev[-1]["choices"][0]["finish_reason"] == "length", "completions stream usage on the last chunk: %r" % ev[-1:])
    ev = sse(port, "/v1/completions", dict(body, stream_options={"include_usage": True}))
    check(ev and ev[-1]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 3 and
          all(len(e["choices"]) == 1 for e in ev[:-1]), "include_usage: a last chunk of usage alone: %r" % ev[-1:])
    ev = sse(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "stream": True, "verbose": True})
    fin = [e for e in ev if e["choices"] and e["choices"][0]["finish_reason"]]
    check(fin and fin[0]["__verbose"]["prompt"] == "<s> " + rendered, "streamed verbose: %r" % fin[:1])
    # prefill spellings: continue_final_message continues the final assistant message as without it
    pre = msgs + [{"role": "assistant", "content": "Once"}]
    a = json.loads(request(port, "POST", "/chat/completions", {"messages": pre, "max_tokens": 4, "temperature": 0})[2])
    b2 = json.loads(request(port, "POST", "/chat/completions", {"messages": pre, "max_tokens": 4, "temperature": 0,
                                                                "continue_final_message": True,
                                                                "add_generation_prompt": False})[2])
    check(a["choices"][0]["message"]["content"] == b2["choices"][0]["message"]["content"],
          "continue_final_message: the prefill's reply: %r %r" % (a, b2))
    for bad, word in (({"continue_final_message": True, "add_generation_prompt": True, "messages": pre},
                       "add_generation_prompt"),
                      ({"continue_final_message": True, "messages": msgs}, "continue_final_message"),
                      ({"add_generation_prompt": False, "messages": msgs}, "add_generation_prompt"),
                      ({"continue_final_message": False, "messages": pre}, "continue_final_message"),
                      ({"messages": pre + [{"role": "assistant", "content": "x"}]}, "two assistant messages")):
        st, _, b = request(port, "POST", "/chat/completions", dict(bad, max_tokens=1))
        check(st == 400 and word in json.loads(b)["error"]["message"], "%r: 400 naming %s (%s %r)" % (bad, word, st, b))
    # the seed an answer reports is the seed, written as an integer: before, 9007199254740991 came back as
    # 9.00719925474099e+15 (9007199254740990, whose text differs) and random seeds (~1.8e15) in exponent form
    for seed in (9007199254740991, None):
        st, _, b = request(port, "POST", "/completion", {"prompt": "Once", "n_predict": 2, **({"seed": seed} if seed else {})})
        m = re.search(rb'"seed":([^,}]*)', b)
        check(st == 200 and m and m.group(1).isdigit() and (seed is None or int(m.group(1)) == seed),
              "generation_settings.seed written whole (%s %r)" % (st, m and m.group(1)))
    # post_sampling_probs: the probabilities each token was drawn with, against the reference made from the model's
    # log-probabilities of the same request without it (same seed, same tokens): softmax(logprob / T) over the top-k
    # (min-p off: its default 0.05 would cut the tail)
    post = {"prompt": "Today was the day. Today I would finally become a", "n_predict": 6, "temperature": 0.7,
            "top_k": 5, "top_p": 1.0, "min_p": 0.0, "seed": 11}
    st, _, b = request(port, "POST", "/completion", dict(post, n_probs=20))
    ref = json.loads(b)["completion_probabilities"] if st == 200 else []
    st, _, b = request(port, "POST", "/completion", dict(post, n_probs=10, post_sampling_probs=True))
    got = json.loads(b)["completion_probabilities"] if st == 200 else []
    check(len(ref) == 6 and len(got) == 6, "post_sampling_probs: 6 tokens each (%s %r)" % (st, b[:200]))
    import math
    for r, g in zip(ref, got):
        top = r["top_logprobs"][:5]
        z = sum(math.exp(t["logprob"] / 0.7) for t in top)
        want = [(t["id"], math.exp(t["logprob"] / 0.7) / z) for t in top]
        have = [(t["id"], t["prob"]) for t in g["top_probs"]]
        check(g["id"] == r["id"] and "logprob" not in g and "top_logprobs" not in g and
              [i for i, _ in have] == [i for i, _ in want] and
              all(abs(p - q) < 1e-4 for (_, p), (_, q) in zip(have, want)) and
              abs(g["prob"] - dict(want)[g["id"]]) < 1e-4, "post_sampling_probs vs the reference: %r %r" % (have, want))
    # greedy in chat: the token alone, with probability 1; /v1/completions' arrays have no such form: 400
    st, _, b = request(port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "temperature": 0,
                                                              "logprobs": True, "top_logprobs": 4,
                                                              "post_sampling_probs": True})
    c = json.loads(b)["choices"][0]["logprobs"]["content"] if st == 200 else []
    check(len(c) == 3 and all(e["prob"] == 1.0 and [t["prob"] for t in e["top_probs"]] == [1.0] and
                              e["top_probs"][0]["token"] == e["token"] for e in c), "post_sampling_probs greedy: %r" % c)
    st, _, b = request(port, "POST", "/v1/completions", {"prompt": "Once", "max_tokens": 2, "logprobs": 2,
                                                         "post_sampling_probs": True})
    check(st == 400 and "post_sampling_probs" in json.loads(b)["error"]["message"],
          "/v1/completions with post_sampling_probs: 400 (%s)" % st)
    # every field is honoured or refused by name: unknown ones, a sampler flashlm lacks unless off, store: true
    for bad, word in (({"messages": msgs, "frobnicate": 1}, "unknown field 'frobnicate'"),
                      ({"messages": msgs, "mirostat": 2}, "mirostat"),
                      ({"messages": msgs, "typical_p": 0.5}, "typical_p"),
                      ({"messages": msgs, "ignore_eos": True}, "ignore_eos"),
                      ({"messages": msgs, "store": True}, "store"),
                      ({"messages": msgs, "audio": {"voice": "alloy"}}, "audio"),
                      ({"messages": msgs, "modalities": ["text", "audio"]}, "modalities"),
                      ({"messages": msgs, "reasoning_effort": "high"}, "reasoning_effort"),
                      ({"messages": msgs, "id_slot": "a"}, "id_slot")):
        st, _, b = request(port, "POST", "/chat/completions", dict(bad, max_tokens=1))
        check(st == 400 and word in json.loads(b)["error"]["message"], "%r: 400 naming %s (%s %r)" % (bad, word, st, b))
    ok = {"messages": msgs, "max_tokens": 3, "temperature": 0}
    ref = json.loads(request(port, "POST", "/chat/completions", ok)[2])["choices"][0]["message"]["content"]
    same = dict(ok, user="u1", metadata={"k": "v"}, store=False, service_tier="auto", modalities=["text"],
                mirostat=0, typical_p=1, dry_multiplier=0, dry_base=1.75, xtc_probability=0, ignore_eos=False,
                id_slot=-1, prediction={"type": "content", "content": "x"}, reasoning_effort=None)
    st, _, b = request(port, "POST", "/chat/completions", same)
    check(st == 200 and json.loads(b)["choices"][0]["message"]["content"] == ref,
          "inert fields and samplers at their off value: the same reply (%s %r)" % (st, b[:300]))
    for path, body in (("/tokenize", {"content": "a", "add_bos": True}), ("/detokenize", {"tokens": [1], "x": 0}),
                       ("/v1/embeddings", {"input": "a", "truncate": True})):
        st, _, b = request(port, "POST", path, body)
        check(st == 400 and "unknown field" in json.loads(b)["error"]["message"], "%s %r: 400 (%s %r)" % (path, body, st, b))
    # timings_per_token: each token's chunk carries the timings so far (predicted_n counting up), not the first
    ev = sse(port, "/v1/chat/completions", dict(ok, max_tokens=4, stream=True, timings_per_token=True))
    tok = [e for e in ev if e["choices"] and e["choices"][0]["delta"].get("content")]
    check(len(tok) >= 2 and "timings" not in ev[0] and
          [e["timings"]["predicted_n"] for e in tok] == list(range(1, len(tok) + 1)) and
          all("prompt_per_second" in e["timings"] for e in tok), "timings_per_token: %r" % ev[:3])
    ev = sse(port, "/completion", {"prompt": "Once", "n_predict": 3, "temperature": 0, "stream": True,
                                   "timings_per_token": True})
    check([e["timings"]["predicted_n"] for e in ev if not e.get("stop")] == [1, 2, 3],
          "/completion timings_per_token: %r" % ev)
    ev = sse(port, "/v1/chat/completions", dict(ok, max_tokens=4, stream=True))
    check(not any("timings" in e for e in ev if e["choices"]), "no timings per token unless asked")
    # a JSON schema tuple: exactly those items
    st, _, b = request(port, "POST", "/chat/completions", {"messages": msgs, "max_tokens": 40, "json_schema": {
        "items": [{"enum": [1, 2]}, {"type": "boolean"}]}})
    out = json.loads(json.loads(b)["choices"][0]["message"]["content"]) if st == 200 else None
    check(isinstance(out, list) and len(out) == 2 and out[0] in (1, 2) and isinstance(out[1], bool),
          "a tuple schema: %s %r" % (st, b[:300]))
    # the context error: llama-server's type and fields beside OpenAI's code
    long = "Once upon a time " * 100
    n = len(json.loads(request(port, "POST", "/tokenize", {"content": long, "add_special": True})[2])["tokens"])
    st, _, b = request(port, "POST", "/v1/completions", {"prompt": long, "max_tokens": 4})
    e = json.loads(b)["error"]
    check(st == 400 and e["type"] == "exceed_context_size_error" and e["code"] == "context_length_exceeded" and
          e["n_prompt_tokens"] == n and e["n_ctx"] == 128, "context error fields: %r (%d tokens)" % (e, n))
    # embeddings count their prompt batches among llama-server's decodes
    def decodes():
        m = re.search(r"^llamacpp:n_decode_total (\S+)$", request(port, "GET", "/metrics")[2].decode(), re.M)
        return float(m.group(1))
    d0 = decodes()
    request(port, "POST", "/v1/embeddings", {"input": ["Once upon a time", "The dog"]})
    check(decodes() - d0 == 2, "embeddings: one decode per short input (%s)" % (decodes() - d0))
    # several prompts (llama-server's): an array of answers, each the prompt's alone; a mixed sequence of ids and text
    one = lambda pr: json.loads(request(port, "POST", "/completion", {"prompt": pr, "n_predict": 4,
                                                                      "temperature": 0})[2])["content"]
    ids = json.loads(request(port, "POST", "/tokenize", {"content": prompt, "add_special": True})[2])["tokens"]
    st, _, b = request(port, "POST", "/completion", {"prompt": [ids, prompt, {"prompt_string": prompt}, ids[:3]],
                                                     "n_predict": 4, "temperature": 0})
    r = json.loads(b)
    alone = [one(ids), one(prompt), one(ids[:3])]
    check(st == 200 and isinstance(r, list) and [x["content"] for x in r] == alone[:2] + alone[1:],
          "several prompts: %s %r vs %r" % (st, b[:300], alone))
    tail = json.loads(request(port, "POST", "/tokenize", {"content": " is"})[2])["tokens"]
    check(one(ids[:3] + ["meaning of life", 2]) ==
          one(ids[:3] + json.loads(request(port, "POST", "/tokenize", {"content": "meaning of life"})[2])["tokens"]
              + [2]) and tail, "a mixed sequence of ids and text")
    st, _, b = request(port, "POST", "/v1/completions", {"prompt": ["Once", "The dog"], "max_tokens": 3,
                                                         "temperature": 0})
    r = json.loads(b)
    texts = [json.loads(request(port, "POST", "/v1/completions", {"prompt": p, "max_tokens": 3,
                                                                  "temperature": 0})[2])["choices"][0]["text"]
             for p in ("Once", "The dog")]
    check(st == 200 and [c["text"] for c in r["choices"]] == texts and [c["index"] for c in r["choices"]] == [0, 1]
          and r["usage"]["completion_tokens"] == 6, "/v1/completions with two prompts: %r vs %r" % (b[:300], texts))
    # "n": choices, choice i sampled with seed + i (each as the request alone with that seed)
    q = {"messages": msgs, "max_tokens": 6, "temperature": 1, "seed": 7}
    st, _, b = request(port, "POST", "/v1/chat/completions", dict(q, n=3))
    r = json.loads(b)
    want = [json.loads(request(port, "POST", "/v1/chat/completions", dict(q, seed=7 + i))[2])["choices"][0]["message"]
            ["content"] for i in range(3)]
    check(st == 200 and [c["message"]["content"] for c in r["choices"]] == want and
          r["usage"]["completion_tokens"] == 18 and r["usage"]["prompt_tokens"] == n_prompt,
          "n 3: %r vs %r" % (b[:400], want))
    for bad in ({"n": 9}, {"n": 2, "stream": True}):
        st = request(port, "POST", "/v1/chat/completions", dict(q, **bad))[0]
        check(st == 400, "%r: 400 (%s)" % (bad, st))
    # return_progress: the prompt's progress streamed before the reply (one event first, one per batch of -b 256);
    # the reply is the one without it
    pr = "the quick brown fox jumps over the lazy dog " * 2
    q = {"prompt": pr, "n_predict": 4, "temperature": 0, "stream": True}
    plain = "".join(e["content"] for e in sse(port, "/completion", q))
    ev = sse(port, "/completion", dict(q, prompt=pr + "again", return_progress=True))
    ev = sse(port, "/completion", dict(q, return_progress=True))
    prog = [e["prompt_progress"] for e in ev if "prompt_progress" in e]
    tot = len(json.loads(request(port, "POST", "/tokenize", {"content": pr, "add_special": True})[2])["tokens"])
    check(len(prog) == 1 + -(-(tot - prog[0]["cache"]) // 256) and prog[0]["processed"] == prog[0]["cache"] > 0 and
          prog[-1]["processed"] == tot and all(p["total"] == tot for p in prog) and
          "".join(e["content"] for e in ev if "prompt_progress" not in e) == plain and
          ev[0]["timings"]["prompt_n"] == 0 and ev[len(prog) - 1]["timings"]["prompt_n"] == tot - prog[0]["cache"],
          "return_progress: %r (%d tokens)" % (ev[:len(prog)], tot))
    ev = sse(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": 2, "stream": True,
                                            "return_progress": True})
    check(ev and "prompt_progress" in ev[0] and ev[0]["choices"] == [] and ev[-1]["usage"]["completion_tokens"] == 2,
          "chat return_progress: %r" % ev[:2])
    # without --cors a page on this machine (a loopback origin, any port) may call; a remote one may not
    for o in ("http://localhost:5173", "http://127.0.0.1:3000", "http://[::1]"):
        st, hdrs, _ = request(port, "OPTIONS", "/completions", headers={"Origin": o,
                                                                         "Access-Control-Request-Method": "POST"})
        check(st == 200 and hdrs.get("access-control-allow-origin") == o, "loopback origin %s allowed: %s" % (o, hdrs))
    st, hdrs, _ = request(port, "OPTIONS", "/completions", headers={"Origin": "http://localhost.evil.example",
                                                                     "Access-Control-Request-Method": "POST"})
    check("access-control-allow-origin" not in hdrs, "localhost.evil.example is not loopback: %s" % hdrs)


def test_llama_server_flags():
    """llama-server's --metrics (GET /metrics is 501 without it) and --verbose (answers carry "__verbose", the prompt
    as text, unless a request says "verbose": false); generation_settings lists the sampler's settings (llama-server's
    adaptive-p sampler as off); text parts of a message are joined with a newline, as llama.cpp joins them."""
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is"},
                                                      {"type": "text", "text": "the best book"}]}], "max_tokens": 2}
    srv = Server()
    try:
        st, _, b = request(srv.port, "GET", "/metrics")
        check(st == 501 and "--metrics" in json.loads(b)["error"]["message"], "/metrics without --metrics: %s %r" % (st, b[:200]))
        st, _, b = request(srv.port, "POST", "/v1/chat/completions", body)
        check(st == 200 and "__verbose" not in json.loads(b), "no __verbose without --verbose: %s" % st)
        fp = json.loads(b).get("system_fingerprint", "") if st == 200 else ""
        check(re.fullmatch(r"b[0-9]+-[0-9a-f]+|b0-unknown", fp), "system_fingerprint in llama-server's shape: %r" % fp)
        st, _, b = request(srv.port, "POST", "/v1/chat/completions", dict(body, verbose=True))
        v = json.loads(b).get("__verbose", {}) if st == 200 else {}
        check("What is\nthe best book" in v.get("prompt", ""), "text parts joined with a newline: %r" % v.get("prompt"))
        st, _, b = request(srv.port, "POST", "/completion", {"prompt": "Once", "n_predict": 2, "temperature": 0.5,
                                                             "top_k": 7, "min_p": 0.1})
        g = json.loads(b).get("generation_settings", {}) if st == 200 else {}
        check(g.get("temperature") == 0.5 and g.get("top_k") == 7 and abs(g.get("min_p", 0) - 0.1) < 1e-6 and
              abs(g.get("top_p", 0) - 0.95) < 1e-6 and g.get("adaptive_target") == -1, "generation_settings: %r" % g)
    finally:
        check(srv.stop() == 0, "SIGTERM: exit status 0")
    srv = Server("--metrics", "--verbose")
    try:
        st, _, b = request(srv.port, "GET", "/metrics")
        check(st == 200 and b"llamacpp:prompt_tokens_total" in b, "/metrics with --metrics: %s" % st)
        st, _, b = request(srv.port, "POST", "/v1/chat/completions", body)
        v = json.loads(b).get("__verbose") if st == 200 else None
        check(isinstance(v, dict) and "the best book" in v.get("prompt", ""), "--verbose: __verbose by default: %s" % st)
        st, _, b = request(srv.port, "POST", "/v1/chat/completions", dict(body, verbose=False))
        check(st == 200 and "__verbose" not in json.loads(b), "--verbose, \"verbose\": false: none")
    finally:
        check(srv.stop() == 0, "SIGTERM: exit status 0")
    # --kv-unified: each of the 2 slots holds the whole -c 256, not 128; a 150-token prompt fits one (and is refused
    # by name without the flag)
    long_prompt = {"prompt": "Once upon a time " * 40, "n_predict": 2}
    for unified in (False, True):
        srv = Server("--parallel", "2", *(["--kv-unified"] if unified else []))
        want = 256 if unified else 128
        try:
            st, _, b = request(srv.port, "GET", "/props")
            n = json.loads(b)["default_generation_settings"]["n_ctx"] if st == 200 else None
            check(n == want, "--kv-unified %s: /props n_ctx %r, want %d" % (unified, n, want))
            st, _, b = request(srv.port, "GET", "/slots")
            check(st == 200 and [x["n_ctx"] for x in json.loads(b)] == [want, want], "/slots n_ctx: %s %r" % (st, b[:200]))
            st, _, b = request(srv.port, "POST", "/completion", long_prompt)
            np_ = json.loads(b).get("timings", {}).get("prompt_n") if st == 200 else None
            if unified:
                check(st == 200 and np_ and 128 < np_ < 256, "--kv-unified: a %r-token prompt: %s %r" % (np_, st, b[:200]))
            else:
                check(st == 400 and b"context" in b, "without --kv-unified: refused: %s %r" % (st, b[:200]))
        finally:
            check(srv.stop() == 0, "SIGTERM: exit status 0")


def test_option_values():
    """Option values that would leave their option without effect are refused at start, by name: an alias list with
    no name, an empty origin, an address given twice (the second bind failed as "address already in use")."""
    for args, needle in ((["--alias", ""], "--alias: no name"), (["--alias", " , "], "--alias: no name"),
                         (["--cors", ""], "--cors: an empty origin"), (["--cors", "http://a,,http://b"], "--cors: an empty origin"),
                         (["--host", "127.0.0.1,localhost"], "given twice")):
        r = subprocess.run([CLI, "serve", "-m", STORIES, "--port", "0", "-c", "256", "-t", "1", *args],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=60)
        check(r.returncode == 2 and needle in r.stderr, "serve %r: refused naming %r: %d %r" %
              (args, needle, r.returncode, r.stderr[-300:]))


def main():
    test_option_values()
    test_llama_server_flags()
    srv = Server("--parallel", "2", "--metrics")
    try:
        test_smuggling(srv.port)
        test_half_close(srv.port)
        test_browser_rules(srv.port)
        test_endpoints(srv.port)
        test_llama_fields(srv.port)
        check(request(srv.port, "GET", "/health")[0] == 200, "/health after all")
    finally:
        check(srv.stop() == 0, "SIGTERM: exit status 0")
    test_client_leaves()
    test_cors()
    test_key()
    test_timeouts()
    test_connection_limit()
    if failures:
        print("test_serve_http: %d FAILED" % len(failures))
        sys.exit(1)
    print("test_serve_http: all passed")


if __name__ == "__main__":
    main()
