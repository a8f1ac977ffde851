#!/usr/bin/env python3
"""serve_load.py — load a running `flashlm serve` (or any OpenAI-compatible server) with N concurrent clients.

usage: serve_load.py URL [--clients N] [--requests R] [--max-tokens T] [--stream] [--key KEY] [--model ID]

Each client sends R chat completions one after another (greedy, max_tokens T, a short question that varies per
request so no two prompts are equal) with Python's standard library only (http.client), then the totals are printed:
requests per minute, generated tokens per second over the wall-clock time (all clients together), the mean latency
of a request, and the time to the first streamed token with --stream.
"""
import argparse
import http.client
import json
import threading
import time
import urllib.parse

QUESTIONS = ["What is flash memory?", "Name three fruits.", "Why is the sky blue?", "What is a cat?",
             "Say hello in French.", "What is 2 + 2?", "What is the capital of Italy?", "Describe a tree."]


def one(url, key, model, i, max_tokens, stream):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = {"messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)] + " (%d)" % i}],
            "max_tokens": max_tokens, "temperature": 0, "stream": stream}
    if stream:  # OpenAI servers (llama-server) send the usage chunk only when asked
        body["stream_options"] = {"include_usage": True}
    if model:
        body["model"] = model
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = "Bearer " + key
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", json.dumps(body), h)
    r = c.getresponse()
    first = None
    if stream:
        usage = None
        buf = b""
        while True:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
            if not chunk:
                break
            buf += chunk
            while b"\n\n" in buf:
                ev, buf = buf.split(b"\n\n", 1)
                if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                    continue
                j = json.loads(ev[6:])
                if first is None and j.get("choices"):
                    first = time.time() - t0
                if j.get("usage"):
                    usage = j["usage"]
    else:
        data = r.read()
        if r.status != 200:
            raise SystemExit("HTTP %d: %s" % (r.status, data[:300]))
        usage = json.loads(data)["usage"]
    c.close()
    return time.time() - t0, usage["completion_tokens"], usage["prompt_tokens"], first


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--requests", type=int, default=4, help="requests per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--key")
    ap.add_argument("--model")
    a = ap.parse_args()
    results, lock = [], threading.Lock()

    def client(ci):
        for k in range(a.requests):
            r = one(a.url, a.key, a.model, ci * 1000 + k, a.max_tokens, a.stream)
            with lock:
                results.append(r)

    t0 = time.time()
    ts = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.time() - t0
    n = len(results)
    gen = sum(r[1] for r in results)
    print("clients %d, requests %d in %.2f s: %.1f requests/min, %.2f generated tokens/s (all clients), mean latency "
          "%.2f s, %.1f generated tokens per request%s" % (
              a.clients, n, wall, n * 60 / wall, gen / wall, sum(r[0] for r in results) / n, gen / n,
              ", mean time to first token %.3f s" % (sum(r[3] for r in results) / n) if a.stream else ""))


if __name__ == "__main__":
    main()
