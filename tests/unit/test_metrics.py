"""Metrics, the idle no-op, the leader watch and structured logs, on a real single-node server in-process.

A one-member cluster elects itself, so every RPC here runs the real write path, apply thread and
snapshot handshake; /metrics is scraped over HTTP and parsed with prometheus_client's own parser.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from nameserver.config import Member, NodeConfig
from nameserver.core.idlenoop import IdleNoop
from nameserver.ops import logfmt
from nameserver.ops.metrics import LeaderWatch, MetricsEndpoint, entry_summary, parse_listen
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2
from nameserver.remoting import RemotingServer, codes
from nameserver.server import Server
from raftlog.codec import encode_entry
from raftlog.log import LeaderView, LogStats
from raftlog.pb import entry_pb2
from tests.cluster import ROOT, free_ports, register_request
from tests.security.attacks import read_reply, remoting_call, remoting_frame

REQUIRED_GAUGES = ("nameserver_log_end_offset", "nameserver_commit_offset", "nameserver_apply_offset",
                   "nameserver_snapshot_offset")

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def wait_for(what: str, cond: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = cond()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def scrape_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        return resp.read().decode()


def scrape(port: int) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(scrape_text(port)):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


class Single:
    """A one-node cluster in this process, with metrics on an ephemeral port."""

    def __init__(self, root: str) -> None:
        raft_port, grpc_port = free_ports(2)
        raft, addr = f"127.0.0.1:{raft_port}", f"127.0.0.1:{grpc_port}"
        self.cfg = NodeConfig(raft_addr=raft, grpc_addr=addr, data_dir=os.path.join(root, "data"),
                              members=[Member(raft, addr)], metrics_addr="127.0.0.1:0", idle_noop_ms=500,
                              election_min_ms=400, election_max_ms=600, remoting_addr="127.0.0.1:0")
        self.server = Server(self.cfg)
        self.server.start()
        self.channel = grpc.insecure_channel(addr)
        self.ns = api_pb2_grpc.NameServerStub(self.channel)
        self.admin = api_pb2_grpc.AdminStub(self.channel)
        self.endpoint = next(e for e in self.server.extras if isinstance(e, MetricsEndpoint))
        wait_for("the node to lead and be ready", lambda: self.server.node.log.is_leader()
                 and self.server.node.log.ready)
        metrics = self.server.metrics
        assert metrics is not None
        wait_for("the leader watch to see it", lambda: metrics.leader_changes_seen == 1)

    @property
    def port(self) -> int:
        return self.endpoint.port

    def stop(self) -> None:
        self.channel.close()
        self.server.stop(0)


@pytest.fixture
def single(tmp_path) -> Iterator[Single]:
    s = Single(str(tmp_path))
    yield s
    s.stop()


# ---- the Entry reader ----------------------------------------------------------------------------

@pytest.mark.parametrize("batches", [0, 1, 3, 512])
def test_entry_summary_reads_leader_time_and_batch_count(batches: int) -> None:
    entry = entry_pb2.Entry(term=7, leader_time_ms=1_732_000_000_123)
    for i in range(batches):
        entry.batches.append(entry_pb2.Batch(request_id=f"r{i}", records=[
            entry_pb2.Record(type=3, key=f"topic/T{i}/b", value=b"x" * (i % 300))]))
    assert entry_summary(encode_entry(entry)) == (1_732_000_000_123, batches)


def test_entry_summary_rejects_truncated_bytes() -> None:
    entry = entry_pb2.Entry(term=1, leader_time_ms=5, batches=[entry_pb2.Batch(request_id="abc")])
    data = encode_entry(entry)
    with pytest.raises((ValueError, IndexError)):
        entry_summary(data[:-1])


# ---- metrics of a live node ----------------------------------------------------------------------

def test_required_gauges_match_status(single: Single) -> None:
    single.ns.RegisterBroker(register_request("C", "b1", "10.0.0.1:10911", ["T1"]), timeout=10)
    samples = scrape(single.port)
    status = single.admin.Status(api_pb2.StatusRequest(), timeout=5)
    for name in REQUIRED_GAUGES:
        assert value(samples, name) is not None, name
    # The idle no-op may land between the scrape and Status: offsets only ever grow.
    assert 0 < value(samples, "nameserver_apply_offset") <= status.apply_offset
    assert value(samples, "nameserver_apply_offset") <= value(samples, "nameserver_commit_offset") \
        <= value(samples, "nameserver_log_end_offset")
    assert value(samples, "nameserver_is_leader") == 1
    assert value(samples, "nameserver_ready") == 1
    assert value(samples, "nameserver_raft_term") == status.term
    assert value(samples, "nameserver_leader_changes_seen_total") == 1
    assert value(samples, "nameserver_node_info", node_id=single.cfg.raft_addr,
                 grpc_addr=single.cfg.grpc_addr) == 1
    assert value(samples, "process_resident_memory_bytes") > 0
    assert not [key for key in samples if "group" in dict(key[1])]  # one group: no group label, as ever


def test_records_applied_by_type_and_state_gauges(single: Single) -> None:
    topics = [f"T{i}" for i in range(5)]
    single.ns.RegisterBroker(register_request("C", "b1", "10.0.0.1:10911", topics), timeout=10)
    samples = scrape(single.port)
    assert value(samples, "nameserver_records_applied_total", type="TOPIC_QUEUE", op="upsert") == 5
    assert value(samples, "nameserver_records_applied_total", type="BROKER_LIVE", op="upsert") == 1
    assert value(samples, "nameserver_live_brokers") == 1
    assert value(samples, "nameserver_topics") == 5
    for _ in range(3):  # the first computes the route, the next two reuse it; a changed route is computed again
        single.ns.GetRoute(api_pb2.GetRouteRequest(topic="T1"), timeout=10)
    samples = scrape(single.port)
    assert value(samples, "nameserver_route_reads_total", cache="miss") == 1
    assert value(samples, "nameserver_route_reads_total", cache="hit") == 2
    single.ns.UnregisterBroker(api_pb2.UnregisterBrokerRequest(
        cluster_name="C", broker_name="b1", broker_addr="10.0.0.1:10911", broker_id=0), timeout=10)
    samples = scrape(single.port)
    assert value(samples, "nameserver_records_applied_total", type="TOPIC_QUEUE", op="delete") == 5
    assert value(samples, "nameserver_live_brokers") == 0
    assert value(samples, "nameserver_topics") == 0
    assert state_pb2.RecordType.Name(state_pb2.TOPIC_QUEUE) == "TOPIC_QUEUE"  # the label is the enum name


def test_rpc_counts_and_latency_by_method_and_code(single: Single) -> None:
    ns_service = "rip18.nameserver.v1.NameServer"
    single.ns.RegisterBroker(register_request("C", "b1", "10.0.0.1:10911", ["T1"]), timeout=10)
    for _ in range(3):
        single.ns.GetRoute(api_pb2.GetRouteRequest(topic="T1"), timeout=5)
    with pytest.raises(grpc.RpcError) as missing:
        single.ns.GetRoute(api_pb2.GetRouteRequest(topic="NoSuchTopic"), timeout=5)
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as bad:
        single.ns.GetRoute(api_pb2.GetRouteRequest(topic=""), timeout=5)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    samples = scrape(single.port)

    def handled(method: str, code: str) -> float | None:
        return value(samples, "nameserver_grpc_handled_total", service=ns_service, method=method,
                     type="unary", code=code)

    assert handled("GetRoute", "OK") == 3
    assert handled("GetRoute", "NOT_FOUND") == 1
    assert handled("GetRoute", "INVALID_ARGUMENT") == 1
    assert handled("RegisterBroker", "OK") == 1
    count = value(samples, "nameserver_grpc_handling_seconds_count", service=ns_service, method="GetRoute",
                  type="unary")
    assert count == 5
    inf = value(samples, "nameserver_grpc_handling_seconds_bucket", service=ns_service, method="GetRoute",
                type="unary", le="+Inf")
    assert inf == 5


def test_remoting_requests_are_counted_by_request_and_response_code(single: Single) -> None:
    """Remoting requests call the service in-process, so the gRPC interceptor never sees them: the
    listener's own observer counts them, and a code nobody serves is "other" (a bounded label set)."""
    remoting = next(e for e in single.server.extras if isinstance(e, RemotingServer))
    addr = f"127.0.0.1:{remoting.port}"
    single.ns.RegisterBroker(register_request("C", "b1", "10.0.0.1:10911", ["T1"]), timeout=10)
    assert remoting_call(addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"}).code == codes.SUCCESS
    assert remoting_call(addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"}).code == codes.SUCCESS
    assert remoting_call(addr, codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"}).code == codes.TOPIC_NOT_EXIST
    for code in (12345, 54321):
        assert remoting_call(addr, code).code == codes.REQUEST_CODE_NOT_SUPPORTED
    samples = scrape(single.port)
    route = str(codes.GET_ROUTEINFO_BY_TOPIC)
    assert value(samples, "nameserver_remoting_handled_total", request=route, response="0") == 2
    assert value(samples, "nameserver_remoting_handled_total", request=route,
                 response=str(codes.TOPIC_NOT_EXIST)) == 1
    assert value(samples, "nameserver_remoting_handled_total", request="other",
                 response=str(codes.REQUEST_CODE_NOT_SUPPORTED)) == 2
    assert value(samples, "nameserver_remoting_handling_seconds_count", request=route) == 3
    # ... and none of them as a gRPC call
    assert value(samples, "nameserver_grpc_handled_total", service="rip18.nameserver.v1.NameServer",
                 method="GetRoute", type="unary", code="OK") is None


def test_route_reads_inline_never_wait_for_a_busy_state(single: Single) -> None:
    """Route reads are answered on the remoting loop thread only while they need not wait: a route kept
    from an earlier read (nameserver/core/routecache.py) is answered there even with the state lock held
    (as by a long translation); one that must be computed goes to a worker and waits there, and the loop
    keeps answering other connections meanwhile."""
    remoting = next(e for e in single.server.extras if isinstance(e, RemotingServer))
    host, port = "127.0.0.1", remoting.port
    single.ns.RegisterBroker(register_request("C", "b1", "10.0.0.1:10911", ["T1", "T2"]), timeout=10)
    assert remoting_call(f"{host}:{port}", codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"}).code == codes.SUCCESS
    assert remoting.inline_fallbacks == 0  # answered inline
    lock = single.server.node.lock
    with socket.create_connection((host, port), timeout=10) as a, socket.create_connection((host, port),
                                                                                          timeout=10) as b:
        with lock:
            b.sendall(remoting_frame(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T1"}, opaque=6))
            kept = read_reply(b)  # T1's route was kept: no lock needed, answered inline at once
            assert (kept.code, kept.opaque) == (codes.SUCCESS, 6) and remoting.inline_fallbacks == 0
            a.sendall(remoting_frame(codes.GET_ROUTEINFO_BY_TOPIC, {"topic": "T2"}, opaque=7))
            wait_for("the read to go to a worker", lambda: remoting.inline_fallbacks == 1, timeout=5)
            b.sendall(remoting_frame(12345, opaque=8))  # the loop is free: another connection is answered
            assert read_reply(b).code == codes.REQUEST_CODE_NOT_SUPPORTED
            a.settimeout(0.3)
            with pytest.raises(TimeoutError):
                read_reply(a)  # the read waits for the state, on its worker
            a.settimeout(10)
        reply = read_reply(a)
        assert (reply.code, reply.opaque) == (codes.SUCCESS, 7)
        assert b'"brokerName":"b1"' in reply.body


def test_server_stream_is_timed_until_it_ends(single: Single) -> None:
    stub = health_pb2_grpc.HealthStub(single.channel)
    stream = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)
    assert next(stream).status in (health_pb2.HealthCheckResponse.SERVING,
                                   health_pb2.HealthCheckResponse.NOT_SERVING)  # health updates every 0.2 s
    stream.cancel()

    def counted() -> float | None:
        return value(scrape(single.port), "nameserver_grpc_handled_total", service="grpc.health.v1.Health",
                     method="Watch", type="server_stream", code="CANCELLED")

    assert wait_for("the cancelled stream to be counted", counted) == 1


def test_forwarded_requests_are_counted_by_method(single: Single) -> None:
    beat = api_pb2.HeartbeatRequest(heartbeats=[api_pb2.BrokerHeartbeat(broker_addr="10.0.0.9:10911")])
    single.ns.Heartbeat(beat, timeout=5)
    assert value(scrape(single.port), "nameserver_forwarded_requests_received_total", method="Heartbeat") is None
    single.ns.Heartbeat(beat, timeout=5, metadata=[("x-rip18-forwarded", "1")])
    single.ns.Heartbeat(beat, timeout=5, metadata=[("x-rip18-forwarded", "1")])
    assert value(scrape(single.port), "nameserver_forwarded_requests_received_total", method="Heartbeat") == 2


def test_idle_noop_keeps_apply_lag_small_and_offsets_moving(single: Single) -> None:
    first = scrape(single.port)
    time.sleep(1.6)  # > 3 idle intervals of 500 ms
    later = scrape(single.port)
    assert value(later, "nameserver_idle_noops_total") >= value(first, "nameserver_idle_noops_total") + 2
    assert value(later, "nameserver_apply_offset") > value(first, "nameserver_apply_offset")
    lag = value(later, "nameserver_apply_lag_seconds")
    assert lag is not None and 0 <= lag < 1.5


def test_snapshot_metrics_follow_take_snapshot(single: Single) -> None:
    single.ns.RegisterBroker(register_request("C", "b1", "10.0.0.1:10911", ["T1", "T2"]), timeout=10)
    before = scrape(single.port)
    assert value(before, "nameserver_snapshot_offset") == 0
    assert value(before, "nameserver_snapshot_age_seconds") is None  # no snapshot yet: no sample
    reply = single.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=30)
    after = scrape(single.port)
    assert value(after, "nameserver_snapshot_offset") == reply.offset > 0
    assert value(after, "nameserver_snapshot_size_bytes") > 0
    assert 0 <= value(after, "nameserver_snapshot_age_seconds") < 30


def test_exposition_passes_promtool_lint_and_naming_rules(single: Single) -> None:
    single.ns.RegisterBroker(register_request("C", "b1", "10.0.0.1:10911", ["T1"]), timeout=10)
    text = scrape_text(single.port)
    promtool = ensure_promtool()
    # promtool's linter checks Prometheus' naming conventions (units, _total on counters, help text).
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60)
    ours = [line for line in (lint.stdout + lint.stderr).splitlines() if line.startswith("nameserver_")]
    assert not ours, "\n".join(ours)
    for family in text_string_to_metric_families(text):
        if not family.name.startswith("nameserver_"):
            continue
        assert family.documentation, family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples), family.name
        else:
            assert not family.name.endswith("_total"), family.name
        for unit in ("seconds", "bytes"):
            if unit in family.name:
                assert family.name.endswith(f"_{unit}"), family.name


def ensure_promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        subprocess.run(["bash", os.path.join(ROOT, "scripts", "ensure-prometheus.sh")], check=True,
                       stdin=subprocess.DEVNULL, timeout=900)
        found = shutil.which("promtool")
    assert found, "promtool is still missing after scripts/ensure-prometheus.sh"
    return found


# ---- endpoint and helpers ------------------------------------------------------------------------

def test_metrics_endpoint_refuses_a_busy_port() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        from prometheus_client import CollectorRegistry

        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port} for metrics"):
            MetricsEndpoint(CollectorRegistry(), f"127.0.0.1:{port}")


def test_metrics_endpoint_stops_cleanly() -> None:
    from prometheus_client import CollectorRegistry, Gauge

    reg = CollectorRegistry()
    Gauge("nameserver_test_value", "A test gauge.", registry=reg).set(42)
    ep = MetricsEndpoint(reg, "127.0.0.1:0")
    ep.start()
    port = ep.port
    assert "nameserver_test_value 42.0" in scrape_text(port)
    ep.stop()
    with pytest.raises(OSError):
        scrape_text(port)


@pytest.mark.parametrize("addr, expected", [("127.0.0.1:9301", ("127.0.0.1", 9301)),
                                            ("[::1]:9301", ("::1", 9301)), (":9301", ("0.0.0.0", 9301))])
def test_parse_listen(addr: str, expected: tuple[str, int]) -> None:
    assert parse_listen(addr) == expected


def test_parse_listen_rejects_missing_port() -> None:
    with pytest.raises(ValueError):
        parse_listen("127.0.0.1")


class FakeLog:
    """The slice of ReplicatedLog that LeaderWatch and IdleNoop use."""

    class _Cfg:
        self_addr = "n1"

    def __init__(self) -> None:
        self.cfg = self._Cfg()
        self.has_quorum = True
        self.last_apply_time = 0.0
        self.leading = False
        self.ready = True
        self.barriers = 0

    def is_leader(self) -> bool:
        return self.leading

    def barrier(self, timeout: float) -> int:
        self.barriers += 1
        self.last_apply_time = time.monotonic()
        return self.barriers

    def stats(self) -> LogStats:
        return LogStats(batches_proposed=0, entries_proposed=0, apply_queue=0,
                        seconds_since_apply=time.monotonic() - self.last_apply_time,
                        has_quorum=self.has_quorum, apply_error="")


def test_leader_watch_logs_one_line_per_leader_change(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeLog()
    watch = LeaderWatch(fake)  # type: ignore[arg-type]
    caplog.set_level(logging.INFO, logger="nameserver.ops.metrics")

    def view(leader: str | None, term: int, ready: bool = True) -> LeaderView:
        return LeaderView(leader=leader, term=term, self_leads=leader == "n1", ready=ready)

    assert not watch.observe(view(None, 0))          # no leader yet
    assert watch.observe(view("n2", 1))
    assert not watch.observe(view("n2", 1, ready=False))  # same leader, same term: nothing new
    assert not watch.observe(view(None, 2))          # election under way
    assert watch.observe(view("n1", 2))
    assert watch.observe(view("n1", 3))              # n1 re-elected in a new term: a change too
    events = [r for r in caplog.records if getattr(r, "event", None) == "leader_change"]
    assert [(r.leader, r.term, r.previous_leader, r.self_is_leader) for r in events] == [
        ("n2", 1, "", False), ("n1", 2, "n2", True), ("n1", 3, "n1", True)]


def test_idle_noop_only_on_an_idle_leader_with_quorum() -> None:
    fake = FakeLog()
    noop = IdleNoop(fake, interval_s=0.2)  # type: ignore[arg-type]
    assert not noop.tick()                      # follower
    fake.leading = True
    fake.last_apply_time = time.monotonic()
    assert not noop.tick()                      # just applied something: not idle
    fake.last_apply_time = time.monotonic() - 1
    fake.has_quorum = False
    assert not noop.tick()                      # no majority: the no-op could not commit
    fake.has_quorum = True
    assert noop.tick() and fake.barriers == 1
    assert not noop.tick()                      # the no-op itself made the node busy again


# ---- structured logs -----------------------------------------------------------------------------

def _emit(fmt: str, **extra: Any) -> str:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logfmt.make_formatter(fmt, {"node": "n1"}))
    logger = logging.getLogger(f"test.logfmt.{fmt}")
    logger.propagate = False
    logger.handlers = [handler]
    logger.setLevel(logging.INFO)
    logger.info("leader is now %s", "n2", extra=extra)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("it failed")
    return stream.getvalue()


def test_json_log_lines_carry_event_fields() -> None:
    out = _emit("json", event="leader_change", leader="n2", term=4, level="not the level")
    first, second = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert first["msg"] == "leader is now n2"
    assert (first["event"], first["leader"], first["term"], first["node"]) == ("leader_change", "n2", 4, "n1")
    assert first["level"] == "INFO"             # an extra field never replaces the envelope's
    assert first["logger"] == "test.logfmt.json"
    assert first["ts"].endswith("Z")
    assert "RuntimeError: boom" in second["exc"]
    assert len(out.splitlines()) == 2           # a traceback stays inside its JSON line


def test_text_log_lines_append_event_fields() -> None:
    out = _emit("text", event="snapshot_written", offset=12, path="a b")
    first = out.splitlines()[0]
    assert first.endswith('leader is now n2 [event=snapshot_written offset=12 path="a b"]')
    assert "Traceback" in out


def test_log_format_from_config(tmp_path) -> None:
    path = tmp_path / "n.toml"
    path.write_text('[node]\nraft_addr = "a"\n\n[log]\nformat = "json"\n')
    assert logfmt.format_from_config(str(path)) == "json"
    path.write_text('[node]\nraft_addr = "a"\n')
    assert logfmt.format_from_config(str(path)) is None
    assert logfmt.format_from_config(None) is None
    with pytest.raises(ValueError):
        logfmt.make_formatter("xml")


def test_serve_writes_json_lines_with_a_leader_change_event(tmp_path) -> None:
    raft_port, grpc_port, metrics_port = free_ports(3)
    cmd = [sys.executable, "-m", "nameserver.cli.serve", "serve", "--raft-addr", f"127.0.0.1:{raft_port}",
           "--grpc-addr", f"127.0.0.1:{grpc_port}", "--data-dir", str(tmp_path / "data"),
           "--metrics-addr", f"127.0.0.1:{metrics_port}", "--log-format", "json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, text=True,
                            env=os.environ | {"PYTHONPATH": ROOT})
    try:
        wait_for("the metrics endpoint", lambda: _scrapes(metrics_port), timeout=30)
        wait_for("leadership", lambda: value(scrape(metrics_port), "nameserver_is_leader") == 1, timeout=30)
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    lines = [json.loads(line) for line in out.splitlines()]   # every line is one JSON object
    assert all(line["node"] == f"127.0.0.1:{raft_port}" for line in lines)
    changes = [line for line in lines if line.get("event") == "leader_change"]
    assert len(changes) == 1 and changes[0]["self_is_leader"] is True


def _scrapes(port: int) -> bool:
    try:
        scrape_text(port)
        return True
    except OSError:
        return False


def test_controller_gauges_per_broker_set() -> None:
    from nameserver.ops.metrics import _controller_gauges

    assert list(_controller_gauges([], None, 256)) == []  # no set registered: no controller series at all
    with_master = state_pb2.ControllerBrokerSet(cluster_name="c1", master_id=2, master_epoch=3,
                                                sync_state_set=[2, 3], replicas=[{"broker_id": i} for i in (1, 2, 3)])
    lost = state_pb2.ControllerBrokerSet(cluster_name="c1", master_id=0, master_epoch=4, sync_state_set=[1],
                                         replicas=[{"broker_id": 1}])
    dead = state_pb2.ControllerBrokerSet(cluster_name="c1", master_id=1, master_epoch=5, sync_state_set=[1, 2],
                                         replicas=[{"broker_id": 1}, {"broker_id": 2}])
    heartbeating = {("a", 2), ("a", 3), ("b", 1)}  # set c: every broker died, so no election recorded it
    sets = [("a", with_master), ("b", lost), ("c", dead)]
    got = {(m.name, s.labels["broker_set"]): s.value
           for m in _controller_gauges(sets, lambda name, bid: (name, bid) in heartbeating, 256) for s in m.samples
           if "broker_set" in s.labels}
    assert got == {("nameserver_controller_master_epoch", "a"): 3, ("nameserver_controller_master_epoch", "b"): 4,
                   ("nameserver_controller_master_epoch", "c"): 5,
                   ("nameserver_controller_has_master", "a"): 1, ("nameserver_controller_has_master", "b"): 0,
                   ("nameserver_controller_has_master", "c"): 1,
                   ("nameserver_controller_in_sync_replicas", "a"): 2,
                   ("nameserver_controller_in_sync_replicas", "b"): 1,
                   ("nameserver_controller_in_sync_replicas", "c"): 2,
                   ("nameserver_controller_replicas", "a"): 3, ("nameserver_controller_replicas", "b"): 1,
                   ("nameserver_controller_replicas", "c"): 2,
                   # what BrokerSetWithoutMaster watches: b has no master, c's master is dead
                   ("nameserver_controller_master_alive", "a"): 1, ("nameserver_controller_master_alive", "b"): 0,
                   ("nameserver_controller_master_alive", "c"): 0}


def test_controller_gauges_capped_at_max_broker_sets() -> None:
    """Any broker may name new sets: at most max_listed of them get series, elected sets first; the
    totals count every set."""
    from nameserver.ops.metrics import _controller_gauges

    elected = [(f"z-real{i}", state_pb2.ControllerBrokerSet(cluster_name="c", master_id=1, master_epoch=1))
               for i in range(3)]
    junk = [(f"a-junk{i:04d}", state_pb2.ControllerBrokerSet(cluster_name="c", next_broker_id=2)) for i in range(1000)]
    families = list(_controller_gauges(junk + elected, lambda name, bid: True, 10))
    per_set = [s for m in families for s in m.samples if "broker_set" in s.labels]
    totals = {s.name: s.value for m in families for s in m.samples if "broker_set" not in s.labels}
    assert len(per_set) == 5 * 10
    listed = {s.labels["broker_set"] for s in per_set}
    assert {name for name, _ in elected} <= listed  # a set that has elected is never pushed out by ones that have not
    assert totals == {"nameserver_controller_broker_sets": 1003, "nameserver_controller_broker_sets_unlisted": 993}
