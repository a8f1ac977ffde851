#!/usr/bin/env python3
"""test_serve_page.py — the chat page of `flashlm serve` in headless Chromium (Debian's `chromium` package), run by
CTest: load /?q=...&temp=0 (the page sends the question once loaded), let the streamed reply arrive, check the DOM
(the user's message, a non-empty assistant reply, the per-token statistics panel filled in), and save a screenshot
(OUT_DIR/serve_page.png, kept under the build folder as a CI artifact; not committed).

usage: test_serve_page.py FLASHLM_BINARY DATA_DIR OUT_DIR     (exit 77: skipped, no chromium)
"""
import html
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

if len(sys.argv) != 4:
    print(__doc__)
    sys.exit(2)
CLI, DATA, OUT = sys.argv[1:4]
MODEL = os.path.join(DATA, "models", "stories260K", "stories260K.gguf")
browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
if not browser:
    if os.environ.get("FLASHLM_REQUIRE_MODELS") == "1":  # CI installs it (.ci/run): never skip silently there
        print("test_serve_page: FAILED: no chromium (FLASHLM_REQUIRE_MODELS=1)")
        sys.exit(1)
    print("test_serve_page: SKIPPED: no chromium (apt-get install chromium; CI installs it in .ci/run)")
    sys.exit(77)

srv = subprocess.Popen([CLI, "serve", "-m", MODEL, "--port", "0", "-c", "256", "-t", "1", "--api-key", "k"],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
port = None
log = []
deadline = time.time() + 60
while time.time() < deadline and port is None:
    line = srv.stderr.readline()
    if not line:
        break
    log.append(line)
    m = re.search(r"on http://127\.0\.0\.1:(\d+)/", line)
    if m:
        port = int(m.group(1))
if port is None:
    srv.kill()
    sys.exit("test_serve_page: the server did not start:\n" + "".join(log))

failures = []
profile = tempfile.mkdtemp(prefix="flm-chromium-")
try:
    # with --api-key the page itself loads without the key, and shows the API's 401 (the key field is empty)
    url = "http://127.0.0.1:%d/?q=Once%%20upon%%20a%%20time&temp=0" % port
    common = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--no-first-run", "--user-data-dir=" + profile, "--virtual-time-budget=60000"]
    dom = subprocess.run(common + ["--dump-dom", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=180).stdout
    if "/metrics: HTTP 401" not in html.unescape(dom):  # the panel says why it is empty
        failures.append("the server panel without the key should say /metrics: HTTP 401")
    if "missing or wrong API key" not in html.unescape(dom):
        failures.append("without the key the page should show the 401 error: %s" % dom[-1500:])
    srv.send_signal(signal.SIGTERM)
    srv.wait(timeout=60)
    # again without a key on the server: the reply streams in
    # (with --metrics: the page's "Server, all clients" panel reads GET /metrics)
    srv = subprocess.Popen([CLI, "serve", "-m", MODEL, "--port", "0", "-c", "256", "-t", "1", "--metrics"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port = None
    while port is None:
        line = srv.stderr.readline()
        if not line:
            sys.exit("test_serve_page: the second server did not start")
        m = re.search(r"on http://127\.0\.0\.1:(\d+)/", line)
        if m:
            port = int(m.group(1))
    # a short reply (&n=24): Chromium dumps the DOM when its virtual-time budget runs out, and virtual time runs
    # ahead of a stream that a busy machine (ctest -j) produces slowly, so a long reply could be cut; a load that
    # still ends before the reply is tried again, twice (the page's output itself is checked below, every time)
    url = "http://127.0.0.1:%d/?q=Once%%20upon%%20a%%20time&temp=0&n=24" % port
    for attempt in range(3):
        dom = subprocess.run(common + ["--dump-dom", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=180).stdout
        if 'data-replies="1"' in dom:
            break
    if 'data-replies="1"' not in dom:
        failures.append("the reply did not finish (no data-replies=\"1\")")
    user = re.search(r'<div class="msg user">([^<]*)</div>', dom)
    bot = re.search(r'<div class="msg assistant">([^<]*)</div>', dom)
    if not user or user.group(1) != "Once upon a time":
        failures.append("the user's message: %r" % (user.group(1) if user else None))
    if not bot or len(bot.group(1).strip()) < 10:
        failures.append("the assistant's reply: %r" % (bot.group(1) if bot else None))
    n = re.search(r'<td class="v" id="s-n">(\d+)</td>', dom)
    if not n or int(n.group(1)) < 5:
        failures.append("the statistics panel: %r" % (n.group(0) if n else None))
    for f in ("s-compute", "s-tps", "s-mib"):
        if re.search(r'id="%s">–<' % f, dom):
            failures.append("%s not filled in" % f)
    # the server's counters after the reply: its tokens (the reply's at least: a load tried again adds its own), the MiB read per
    # generated token (0.00: a GGUF in RAM reads nothing from flash), no pass that joined several slots (one slot)
    tok = re.search(r'<td class="v" id="m-tok">([^<]*)</td>', dom)
    if not tok or not n or not tok.group(1).isdigit() or int(tok.group(1)) < int(n.group(1)):
        failures.append("the server panel's tokens %r, the reply's %r" % (tok.group(1) if tok else None,
                                                                          n.group(1) if n else None))
    for f, want in (("m-mib", "0.00"), ("m-joined", "0")):
        got = re.search(r'<td class="v" id="%s">([^<]*)</td>' % f, dom)
        if not got or got.group(1) != want:
            failures.append("%s: %r, want %r" % (f, got.group(1) if got else None, want))
    os.makedirs(OUT, exist_ok=True)
    shot = os.path.join(OUT, "serve_page.png")
    subprocess.run(common + ["--window-size=1100,700", "--screenshot=" + shot, url], stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, timeout=180)
    if not os.path.exists(shot) or os.path.getsize(shot) < 5000:
        failures.append("no screenshot at %s" % shot)
    else:
        print("test_serve_page: screenshot %s (%d bytes); reply %r" % (shot, os.path.getsize(shot),
                                                                    bot.group(1)[:80] if bot else None))
finally:
    srv.send_signal(signal.SIGTERM)
    try:
        srv.wait(timeout=60)
    except subprocess.TimeoutExpired:
        srv.kill()
    shutil.rmtree(profile, ignore_errors=True)

for f in failures:
    print("FAIL:", f)
if failures:
    sys.exit(1)
print("test_serve_page: all passed")
