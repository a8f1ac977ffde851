#!/bin/sh
# Install the Debian/Ubuntu packages flashlm builds against, if any is missing. Idempotent; uses sudo when not root.
set -eu
PKGS="build-essential cmake pkg-config libcmocka-dev libxxhash-dev liburing-dev libopenblas-dev liblapacke-dev
      libcjson-dev libpcre2-dev python3 python3-pip libzip-dev libssl-dev libmicrohttpd-dev"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "flashlm: installing build dependencies:$missing" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
# The test oracle (tests/oracle/dequant.py): the gguf Python package's NumPy dequantizers. pip refuses to touch a
# Debian-managed Python (PEP 668) unless told to; try the polite way first.
if ! python3 -c "import gguf, numpy" 2>/dev/null; then
    echo "flashlm: installing the Python packages gguf and numpy (test oracle)" >&2
    python3 -m pip install -q gguf numpy 2>/dev/null || python3 -m pip install -q --break-system-packages gguf numpy
fi
# flashlm serve's test (tests/test_serve.py) talks to the server through OpenAI's Python client; without it that
# test is skipped, so a failed install only warns.
if ! python3 -c "import openai" 2>/dev/null; then
    echo "flashlm: installing the Python package openai (the client of tests/test_serve.py)" >&2
    python3 -m pip install -q openai 2>/dev/null || python3 -m pip install -q --break-system-packages openai ||
        echo "flashlm: could not install openai: test_serve will be skipped" >&2
fi
# tests/test_serve.py's reference for /apply-template and the tool prompts: the model's own template rendered by jinja2
# (without it that part is skipped, unless FLASHLM_REQUIRE_MODELS=1), so a failed install only warns.
if ! python3 -c "import jinja2" 2>/dev/null; then
    echo "flashlm: installing the Python package jinja2 (the template reference of tests/test_serve.py)" >&2
    python3 -m pip install -q jinja2 2>/dev/null || python3 -m pip install -q --break-system-packages jinja2 ||
        echo "flashlm: could not install jinja2: test_serve's template reference will be skipped" >&2
fi
