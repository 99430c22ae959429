"""The delay proxy itself (tests/faults/proxy.py), on 127.0.0.1 against an echo server: it delays each
direction by what its control file says (re-read on SIGHUP), never reorders bytes under jitter, and
counts what passed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from tests.cluster import ROOT, free_ports


@pytest.fixture
def echo_port() -> Iterator[int]:
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield port
    stop.set()
    t.join(timeout=2)
    srv.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


@pytest.fixture
def proxy(tmp_path, echo_port: int) -> Iterator[tuple[int, str, str, subprocess.Popen]]:
    (listen,) = free_ports(1)
    routes, control, stats = (str(tmp_path / n) for n in ("routes.json", "control.json", "stats.json"))
    with open(routes, "w") as f:
        json.dump([{"name": "t", "listen": f"127.0.0.1:{listen}", "upstream": f"127.0.0.1:{echo_port}",
                    "link": "raft"}], f)
    with open(control, "w") as f:
        json.dump({}, f)
    proc = subprocess.Popen([sys.executable, "-m", "tests.faults.proxy", "--routes", routes, "--control", control,
                             "--stats", stats, "--seed", "3"], cwd=ROOT, env=os.environ | {"PYTHONPATH": ROOT})
    deadline = time.monotonic() + 10
    while not os.path.exists(stats):
        assert proc.poll() is None and time.monotonic() < deadline, "the proxy did not start"
        time.sleep(0.02)
    yield listen, control, stats, proc
    proc.terminate()
    proc.wait(timeout=5)


def _stats(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _set(control: str, stats: str, proc: subprocess.Popen, up: dict, down: dict) -> None:
    with open(control) as f:
        before = f.read()
    with open(control, "w") as f:
        json.dump({"raft": {"up": up, "down": down}}, f)
    reloads = _stats(stats)["reloads"]
    proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 5
    while _stats(stats)["reloads"] == reloads:  # the stats file reports each reload
        assert time.monotonic() < deadline, f"no reload after SIGHUP (control was {before})"
        time.sleep(0.02)


def _rtt(sock: socket.socket, n: int = 5) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.monotonic()
        sock.sendall(b"x")
        assert sock.recv(1) == b"x"
        best = min(best, time.monotonic() - t0)
    return best


def test_proxy_delays_each_direction_and_keeps_order(proxy) -> None:
    listen, control, stats, proc = proxy
    with socket.create_connection(("127.0.0.1", listen)) as sock:
        assert _rtt(sock) < 0.03  # no delay configured
        _set(control, stats, proc, {"delay_ms": 60}, {})
        assert 0.055 <= _rtt(sock) < 0.5  # one way delayed
        _set(control, stats, proc, {"delay_ms": 40}, {"delay_ms": 40})
        assert 0.075 <= _rtt(sock) < 0.5  # both ways
        # jitter larger than the gap between chunks: a later chunk must still not overtake an earlier one
        _set(control, stats, proc, {"delay_ms": 20, "jitter_ms": 20}, {"delay_ms": 20, "jitter_ms": 20})
        sent = b"".join(i.to_bytes(4, "big") for i in range(2000))
        for i in range(0, len(sent), 400):
            sock.sendall(sent[i:i + 400])
            time.sleep(0.001)
        got = b""
        sock.settimeout(10)
        while len(got) < len(sent):
            got += sock.recv(65536)
        assert got == sent
    deadline = time.monotonic() + 5
    while (st := _stats(stats)["routes"]["t"])["down_bytes"] < len(sent) and time.monotonic() < deadline:
        time.sleep(0.05)  # the stats file is rewritten every 0.25 s
    assert st["conns"] == 1 and st["up_bytes"] >= len(sent) and st["down_bytes"] >= len(sent), st
    assert 20 <= st["max_hold_ms"] <= 60, st
