#!/usr/bin/env bash
# Make sure `prometheus` and `promtool` are on PATH: the tests run a real Prometheus and promtool.
# Installs Debian's `prometheus` package (which ships both) when either is missing. Runs unattended:
# CI is root with no stdin; elsewhere it uses passwordless sudo, or says what to run.
set -euo pipefail

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    SUDO=(sudo -n)
else
    echo "ensure-prometheus: prometheus/promtool missing; run as root: apt-get install -y prometheus" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-prometheus: no apt-get here; install Prometheus (server and promtool) by hand" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
echo "ensure-prometheus: installing Debian's prometheus package" >&2
# A lock held by another apt run (another test process) is waited for, not treated as failure.
"${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=300 update -qq
"${SUDO[@]}" apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends prometheus >&2
# The package's service is not ours to run: the tests start their own Prometheus on a free port.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    "${SUDO[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1
