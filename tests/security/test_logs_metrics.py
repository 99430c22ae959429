"""The black-box probe's attacks on what operators read (issue 11, #9, #13, #20), against a real secure
3-node cluster with the controller port on:

- #9: a broker name holding a newline, a forged `CRITICAL` line and ESC, sent anonymously over
  remoting, reaches the node's log file escaped on its own line; repeating it many times writes one
  line per interval, and a bad frame on each of hundreds of connections a bounded number
  (nameserver/safetext.py, nameserver/ops/logfmt.py, nameserver/logthrottle.py);
- #13: anonymous APPLY_BROKER_ID with a new broker-set name each time grows /metrics by at most
  5 series per listed set, [limits] metrics_max_broker_sets of them (nameserver/ops/metrics.py);
- #20: `nsctl kv list`, run as an operator runs it, prints keys and values holding terminal escapes
  and newlines with no control byte and no forged row (nameserver/cli/render.py).

While each runs: a write through another channel is acknowledged every 0.2 s, each within 2 s; no
election (terms unchanged); the node's resident memory grows < 64 MiB and its threads by <= 16.
The default run is short (a few hundred requests, small limits); SECURITY_LONG=1 runs the floods at
the probe's size against the default limits.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from nameserver.config import NodeConfig
from nameserver.logthrottle import REPEAT_BURST, REPEAT_INTERVAL_S
from nameserver.pb import api_pb2
from nameserver.remoting import codes
from tests.cluster import ROOT, NodeProc
from tests.security.attacks import (
    LONG,
    SHORT_LIMITS,
    Secure,
    Writer,
    read_reply,
    remoting_call,
    remoting_frame,
    rss_mib,
    secure_cluster,
    started,
    threads,
)

pytestmark = pytest.mark.cluster

SHORT_MAX_BROKER_SETS = 16
MAX_BROKER_SETS = NodeConfig.metrics_max_broker_sets if LONG else SHORT_MAX_BROKER_SETS
RSS_GROWTH_MIB = 64
THREAD_GROWTH = 16
FORGED = "2026-01-01 00:00:00,000 CRITICAL nameserver: forged"
ESC = "\x1b"


@pytest.fixture(scope="module")
def sec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    limits = {"metrics_max_broker_sets": MAX_BROKER_SETS} if LONG else SHORT_LIMITS | {
        "metrics_max_broker_sets": SHORT_MAX_BROKER_SETS}
    with started(secure_cluster(str(tmp_path_factory.mktemp("logs-metrics")), limits, controller=True)) as s:
        yield s


@contextlib.contextmanager
def watched(sec: Secure, node: NodeProc, tag: str) -> Iterator[None]:
    """The checks every attack here makes while it runs (see the module's doc)."""
    terms = [st.term for st in sec.cluster.statuses() if st is not None]
    rss, nthreads = rss_mib(node), threads(node)
    peak = {"rss": rss, "threads": nthreads}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.2):
            with contextlib.suppress(OSError, ValueError):
                peak["rss"] = max(peak["rss"], rss_mib(node))
                peak["threads"] = max(peak["threads"], threads(node))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        with Writer(sec.stub(node, "admin"), tag=tag, cluster=sec.cluster) as writer:
            yield
    finally:
        stop.set()
        sampler.join(timeout=5)
    writer.check()
    assert all(n.alive for n in sec.cluster.nodes), sec.cluster.logs()
    after = [st.term for st in sec.cluster.statuses() if st is not None]
    assert after == terms, f"an election during the attack: terms {terms} -> {after}"
    assert peak["rss"] - rss < RSS_GROWTH_MIB, f"resident memory grew {peak['rss'] - rss:.0f} MiB"
    assert peak["threads"] - nthreads <= THREAD_GROWTH, f"threads grew from {nthreads} to {peak['threads']}"


# ---- #9: a broker name that forges a log line ----------------------------------------------------


def _registration_body() -> bytes:
    """A registration whose one topic the node cannot store: it logs the broker's name with it."""
    table = {"bad topic!": {"topicName": "bad topic!", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}}
    return json.dumps({"topicConfigSerializeWrapper": {"dataVersion": {"counter": 1, "timestamp": 1},
                                                       "topicConfigTable": table}}).encode()


def test_9_broker_name_cannot_forge_a_log_line_or_send_escapes(sec: Secure) -> None:
    node = sec.cluster.followers()[0]
    name = f"b9\n{FORGED} {ESC}[2J{ESC}]52;c;cHduZWQ={chr(7)}\x9b31m"
    ext = {"brokerName": name, "brokerAddr": "10.9.0.1:10911", "clusterName": "C9", "brokerId": "0"}
    body = _registration_body()
    repeats = 5000 if LONG else 300
    with open(node.log_path, "rb") as f:
        start = len(f.read())
    t0 = time.monotonic()
    with watched(sec, node, "log9-"):
        host, port = node.remoting_addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            for i in range(repeats):
                sock.sendall(remoting_frame(codes.REGISTER_BROKER, ext, body, opaque=i + 1))
                reply = read_reply(sock)
                # refused naming the field (the name is not a broker name), or registered without the topic
                assert reply.code == codes.SUCCESS or "broker_name" in (reply.remark or ""), reply.remark
    took = time.monotonic() - t0
    time.sleep(0.5)  # the handler logs before it answers; let the log file catch up anyway
    with open(node.log_path, "rb") as f:
        written = f.read()[start:]
    assert ESC.encode() not in written and b"\xc2\x9b" not in written, "a raw escape reached the log"
    lines = written.decode("utf-8", "replace").splitlines()
    assert not [line for line in lines if line.startswith(FORGED[:10]) and "forged" in line], \
        "a broker name forged a log line"
    mentions = [line for line in lines if "b9\\n" in line]
    # logged escaped, once per 10 s however often it is repeated (nameserver/logthrottle.py), or never
    # when the name is refused before anything is logged
    assert len(mentions) <= 1 + int(took // 10) + 1, f"{len(mentions)} lines for {repeats} bad registrations"
    for line in mentions:
        assert "\\x1b[2J" in line and "\\x9b31m" in line, line


def test_9_bad_frames_on_new_connections_log_a_bounded_number_of_lines(sec: Secure) -> None:
    """Each connection's bad frame is refused (the connection closed) where the remoting server logs
    it: the node's log handler holds back repeats of one line past REPEAT_BURST per 10 s."""
    node = sec.cluster.followers()[1]
    head = json.dumps({"code": f"x\n{FORGED}{ESC}[2J", "flag": 0, "opaque": 1, "version": 1}).encode()
    bad = struct.pack(">ii", 4 + len(head), len(head)) + head
    connections = 3000 if LONG else 300
    with open(node.log_path, "rb") as f:
        start = len(f.read())
    host, port = node.remoting_addr.rsplit(":", 1)
    t0 = time.monotonic()
    with watched(sec, node, "frames9-"):
        for _ in range(connections):
            with socket.create_connection((host, int(port)), timeout=10) as sock:
                sock.sendall(bad)
                assert sock.recv(1) == b"", "a bad frame left its connection open"
    took = time.monotonic() - t0
    time.sleep(0.5)
    with open(node.log_path, "rb") as f:
        written = f.read()[start:]
    assert ESC.encode() not in written
    lines = [line for line in written.decode("utf-8", "replace").splitlines() if "closing connection from" in line]
    bound = REPEAT_BURST * (1 + int(took // REPEAT_INTERVAL_S) + 1)
    assert 0 < len(lines) <= bound, f"{len(lines)} lines for {connections} bad frames (bound {bound})"


# ---- #13: new broker-set names flood /metrics ----------------------------------------------------


def _scrape(node: NodeProc) -> tuple[int, int, dict[str, float]]:
    """(bytes, series, the controller totals) of the node's /metrics."""
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    totals = {line.split()[0]: float(line.split()[1]) for line in samples
              if line.startswith("nameserver_controller_broker_sets")}
    return len(text.encode()), len(samples), totals


def _apply_ids(addr: str, names: list[str], failures: list[str]) -> None:
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        for i, name in enumerate(names):
            sock.sendall(remoting_frame(1013, {"clusterName": "FloodCluster", "brokerName": name,
                                               "appliedBrokerId": "1",
                                               "registerCheckCode": f"10.13.0.1:10911;{i}"}, opaque=i + 1))
            reply = read_reply(sock)
            if reply.code != codes.SUCCESS:
                failures.append(f"{reply.code}: {reply.remark}")


def test_13_new_broker_set_names_cannot_grow_metrics_without_bound(sec: Secure) -> None:
    leader = sec.cluster.wait_ready(timeout=30)
    metadata = remoting_call(leader.controller_addr, 1005)  # CONTROLLER_GET_METADATA_INFO
    controller = metadata.ext("controllerLeaderAddress") or leader.controller_addr
    sets, senders = (8000, 8) if LONG else (400, 4)
    nodes = [leader, sec.cluster.followers()[0]]
    before = {n.name: _scrape(n) for n in nodes}
    failures: list[str] = []
    with watched(sec, leader, "metrics13-"):
        workers = [threading.Thread(target=_apply_ids, args=(controller, [f"flood-{k}-{i}" for i in range(
            k, sets, senders)], failures)) for k in range(senders)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(timeout=300)
    made = sets - len(failures)
    # Each listed set has 5 series; the rest of the growth is the flood's own request and response
    # counters and latency histograms (about 20 series per method and code on each port).
    series_bound = 5 * MAX_BROKER_SETS + 2 + 100
    bytes_bound = series_bound * 200
    sec.cluster.wait_converged(timeout=30)  # every node has applied every set
    for n in nodes:
        size0, series0, _ = before[n.name]
        size, series, totals = _scrape(n)
        assert series - series0 <= series_bound, \
            f"{n.name}: /metrics grew {series0} -> {series} series for {made} sets (bound +{series_bound})"
        assert size - size0 <= bytes_bound, \
            f"{n.name}: /metrics grew {size0} -> {size} bytes for {made} sets (bound +{bytes_bound})"
        # the cap was crossed, and what it leaves out is counted
        assert totals["nameserver_controller_broker_sets"] == made > MAX_BROKER_SETS, totals
        assert totals["nameserver_controller_broker_sets_unlisted"] == made - MAX_BROKER_SETS, totals


# ---- #20: nsctl prints what clients stored -------------------------------------------------------


def test_20_nsctl_prints_no_control_byte_and_no_forged_row(sec: Secure) -> None:
    node = sec.cluster.wait_ready(timeout=30)
    admin = sec.stub(node, "admin")
    entries = {
        f"k-osc{ESC}]0;owned{chr(7)}": "v1",
        "k-forge": f"v2\n{FORGED}  forged-value",
        "k-csi": f"{ESC}[2J{ESC}[31mred\x9b0m\r\u2028",
    }
    for key, value in entries.items():
        admin.PutKv(api_pb2.PutKvRequest(namespace="NSCTL20", key=key, value=value), timeout=10)
    base = [sys.executable, "-m", "nameserver.cli.nsctl", "--endpoints", node.grpc_addr, "--tls-ca", sec.ca_file]
    env = os.environ | {"PYTHONPATH": ROOT, "NSCTL_TOKEN": sec.tokens["admin"]}
    with watched(sec, node, "nsctl20-"):
        listed = subprocess.run([*base, "kv", "list", "NSCTL20"], capture_output=True, cwd=ROOT, env=env, timeout=60)
        got = subprocess.run([*base, "kv", "get", "NSCTL20", "k-csi"], capture_output=True, cwd=ROOT, env=env,
                             timeout=60)
        as_json = subprocess.run([*base, "--json", "kv", "list", "NSCTL20"], capture_output=True, cwd=ROOT,
                                 env=env, timeout=60)
    for res in (listed, got, as_json):
        assert res.returncode == 0, res.stderr
        bad = re.findall(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8\xa9]", res.stdout)
        assert not bad, f"control bytes {bad[:5]} in nsctl's output:\n{res.stdout!r}"
    lines = listed.stdout.decode().splitlines()
    assert len(lines) == 1 + len(entries) + 1, lines  # header, one row per key, "served at"
    assert not [line for line in lines if line.startswith(FORGED[:10])], lines
    assert "v2\\n2026-01-01" in listed.stdout.decode()  # shown escaped, not dropped
    assert json.loads(as_json.stdout)["table"] == entries  # --json keeps the exact values
