#!/usr/bin/env bash
# ensure-debian-package.sh PACKAGE COMMAND...: install Debian's PACKAGE unless every COMMAND is on PATH.
# Runs unattended: CI is root with no stdin; elsewhere it uses passwordless sudo, or says what to run.
set -euo pipefail
pkg=$1
shift
missing=0
for cmd in "$@"; do command -v "$cmd" >/dev/null 2>&1 || missing=1; done
[ "$missing" -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "ensure-debian-package: $* missing; run as root: apt-get install -y $pkg" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-debian-package: no apt-get here; install $pkg ($*) by hand" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
echo "ensure-debian-package: installing Debian's $pkg" >&2
# A lock held by another apt run (another test process) is waited for, not treated as failure.
"${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=300 update -qq
"${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "$pkg" >&2
for cmd in "$@"; do command -v "$cmd" >/dev/null 2>&1 || { echo "ensure-debian-package: $cmd still missing" >&2; exit 1; }; done
