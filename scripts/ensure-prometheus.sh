#!/usr/bin/env bash
# Make sure `prometheus` and `promtool` are on PATH: the tests run a real Prometheus and promtool.
set -euo pipefail
if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    exit 0
fi
"$(dirname "$0")/ensure-debian-package.sh" prometheus prometheus promtool
# The package's service is not ours to run: the tests start their own Prometheus on a free port.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    SUDO=(); [ "$(id -u)" -eq 0 ] || SUDO=(sudo -n)
    "${SUDO[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
