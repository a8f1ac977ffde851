#!/bin/sh
# Install the Debian/Ubuntu packages flashlm builds against, if any is missing. Idempotent; uses sudo when not root.
set -eu
PKGS="build-essential cmake pkg-config libcmocka-dev libxxhash-dev liburing-dev libopenblas-dev liblapacke-dev
      libcjson-dev libzip-dev libssl-dev"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "flashlm: installing build dependencies:$missing" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
