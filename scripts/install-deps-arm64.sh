#!/bin/sh
# Install what the 64-bit Arm cross build needs (`make cross-arm64`), if any is missing: Debian's aarch64 cross
# compiler, qemu's user-mode emulator (ctest runs the arm64 tests through it) and the arm64 multiarch builds of the
# libraries flashlm links (the same list as scripts/install-deps.sh, with libc6 and libgomp1 for running them).
# Debian only: Ubuntu serves arm64 packages from ports.ubuntu.com, which its sources do not list by default.
# Idempotent; uses sudo when not root.
set -eu
PKGS="gcc-aarch64-linux-gnu qemu-user-static libc6:arm64 libgomp1:arm64 libcmocka-dev:arm64 libxxhash-dev:arm64
      liburing-dev:arm64 libopenblas-dev:arm64 liblapacke-dev:arm64 libcjson-dev:arm64 libpcre2-dev:arm64
      libzip-dev:arm64 libssl-dev:arm64 libmicrohttpd-dev:arm64"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -n "$missing" ] || exit 0
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "flashlm: adding the arm64 architecture to dpkg (multiarch -dev packages)" >&2
    $SUDO dpkg --add-architecture arm64
fi
echo "flashlm: installing the arm64 cross build's packages:$missing" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
