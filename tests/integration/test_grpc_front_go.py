"""A node with [node] grpc_front = "go": the Go front end (front/) owns the gRPC port, TLS and the
connection limits, and hands every call to the node's 2 worker processes, which answer it with the node's
own service code (nameserver/api/frontchannel.py). One secure node (TLS from its cert/key files, tokens by
role) with the attack suite's short limits, its workers and front end as a node runs them.

What a client sees must be what grpcio's port gives it: a registration and a route read; a watch stream's
change; a bad field refused naming the field; tokens decide (none, an unknown one, a role without the
right); a call's deadline ends it; the stream bounds of tests/security/test_grpc_streams.py (unfinished
streams without a credential, a credentialed caller that never sends, stalled registration streams past
the per-caller bound), and grpcio's keepalive enforcement (a ping flood is sent GOAWAY). A worker
SIGKILLed: the other one serves at once; and (slow) the core starts it again and the front end dials it
again; with no worker at all, UNAVAILABLE naming why.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from bench.procnet import children
from nameserver import tlsconf
from nameserver.cli import nsctl
from nameserver.config import usable_cpus
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.cluster import NodeProc, register_request
from tests.faults.workers import serving, workers_of
from tests.security.attacks import SHORT_LIMITS, Secure, secure_cluster
from tests.security.http2 import PING, RawConnection, frame

pytestmark = pytest.mark.cluster

LIMITS = SHORT_LIMITS | {"grpc_max_streams_per_connection": 50, "grpc_progress_timeout_ms": 2000,
                         "grpc_max_streams": 8, "grpc_max_streams_per_caller": 4}
NAMESERVER = "/rip18.nameserver.v1.NameServer"


@pytest.fixture(scope="module")
def sec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    s = secure_cluster(str(tmp_path_factory.mktemp("go-front")), LIMITS, size=1, worker_processes=2,
                       sections={"node": {"grpc_front": "go"}})
    s.cluster.start()
    try:
        s.cluster.wait_ready(timeout=120)
        yield s
    finally:
        s.cluster.stop()


def _node(sec: Secure) -> NodeProc:
    return sec.cluster.nodes[0]


def test_a_registration_then_a_route_read(sec: Secure) -> None:
    node = _node(sec)
    with open(node.log_path) as f:
        assert "(the Go front end)" in f.read()  # not grpcio's port: the setting took
    reply = sec.stub(node, "broker").RegisterBroker(
        register_request("GoCluster", "go-broker", "10.9.0.1:10911", ["GoTopic"]), timeout=10)
    route = sec.stub(node, "client").GetRoute(api_pb2.GetRouteRequest(topic="GoTopic", min_offset=reply.offset),
                                              timeout=10)
    assert [b.broker_name for b in route.route.broker_datas] == ["go-broker"]
    assert route.apply_offset >= reply.offset


def test_a_watch_streams_a_registration(sec: Secure) -> None:
    node = _node(sec)
    stream = sec.stub(node, "client").Watch(api_pb2.WatchRequest(topics=["WatchedTopic"], progress_interval_ms=200),
                                            timeout=20)
    try:
        first = next(stream)  # the current state (none): the listing's end, then changes
        assert first.initial_state_done or first.initial_state or not first.events
        sec.stub(node, "broker").RegisterBroker(
            register_request("GoCluster", "watched", "10.9.0.3:10911", ["WatchedTopic"]), timeout=10)
        keys = next(k for m in stream for e in m.events if (k := e.key).startswith("topic/WatchedTopic"))
        assert keys
    finally:
        stream.cancel()


def test_a_bad_field_is_refused_naming_it(sec: Secure) -> None:
    with pytest.raises(grpc.RpcError) as err:
        sec.stub(_node(sec), "broker").RegisterBroker(register_request("GoCluster", "go-broker", "not an address", []),
                                                      timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("broker_addr:"), err.value.details()


def test_writes_sent_as_they_arrive_read_back_and_retry_exactly_once(sec: Secure) -> None:
    """A write behind the Go front end goes to the core as it arrives and is answered once the worker's
    replica has it (frontchannel.WriteFirst; the core answers from its apply): each KV put reads back at
    once, through either worker, at its offset; a session's retry gets the first reply and writes nothing."""
    node = _node(sec)
    admin = sec.stub(node, "admin")
    for i in range(20):
        put = admin.PutKv(api_pb2.PutKvRequest(namespace="GoWrites", key=f"k{i}", value=f"v{i}"), timeout=10)
        got = admin.GetKv(api_pb2.GetKvRequest(namespace="GoWrites", key=f"k{i}", min_offset=put.offset), timeout=10)
        assert got.value == f"v{i}" and got.apply_offset >= put.offset
    session = (("x-client-id", "go-writer"), ("x-client-seq", "1"))
    request = api_pb2.PutKvRequest(namespace="GoWrites", key="once", value="first")
    first = admin.PutKv(request, metadata=session, timeout=10)
    request.value = "second"
    again = admin.PutKv(request, metadata=session, timeout=10)
    assert again.offset == first.offset and again.records == first.records
    assert admin.GetKv(api_pb2.GetKvRequest(namespace="GoWrites", key="once", min_offset=first.offset),
                       timeout=10).value == "first"


def test_concurrent_writes_of_one_key_race_and_each_gets_its_outcome(sec: Secure) -> None:
    """Writes proposed with no thread waiting that read the same key at once: the ones that lost the race at
    apply are translated again (the core's write-again threads) and then refused, once confirmed: one bind of a
    free queue wins, every other is FAILED_PRECONDITION; registrations of one broker with other topics all
    land."""
    node = _node(sec)
    admin, broker = sec.stub(node, "admin"), sec.stub(node, "broker")
    outcomes: list[str] = []

    def contender(i: int) -> None:
        try:
            admin.BindQueue(api_pb2.BindQueueRequest(topic="GoRace", queue_id=3, owner=f"o{i}", expected_version=0),
                            timeout=10)
            outcomes.append("won")
        except grpc.RpcError as exc:
            outcomes.append(exc.code().name)

    registered: list[str] = []

    def registrar(i: int) -> None:
        try:
            broker.RegisterBroker(register_request("GoCluster", "go-racer", "10.9.0.7:10911", [f"GoRace{i}"],
                                                   counter=i + 1), timeout=10)
            registered.append("ok")
        except grpc.RpcError as exc:  # the stock NameServer takes each (it registers under one lock)
            registered.append(f"{exc.code().name}: {exc.details()}")

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    threads += [threading.Thread(target=registrar, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1 and outcomes.count("FAILED_PRECONDITION") == 7, outcomes
    assert registered == ["ok"] * 8, registered
    info = sec.stub(node, "client").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)
    assert "go-racer" in info.broker_addr_table


def test_tokens_decide(sec: Secure) -> None:
    node = _node(sec)
    anonymous = api_pb2_grpc.NameServerStub(tlsconf.open_channel(node.grpc_addr, tls=True, ca_file=sec.ca_file))
    with pytest.raises(grpc.RpcError) as none:
        anonymous.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)
    assert none.value.code() == grpc.StatusCode.UNAUTHENTICATED
    forged = api_pb2_grpc.NameServerStub(tlsconf.open_channel(node.grpc_addr, tls=True, ca_file=sec.ca_file,
                                                              token="not-a-token"))
    with pytest.raises(grpc.RpcError) as unknown:
        forged.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)
    assert unknown.value.code() == grpc.StatusCode.UNAUTHENTICATED and unknown.value.details() == "unknown token"
    with pytest.raises(grpc.RpcError) as denied:
        sec.stub(node, "client").RegisterBroker(register_request("GoCluster", "b", "10.9.0.2:10911", []), timeout=10)
    assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "role client" in (denied.value.details() or "")
    sec.stub(node, "client").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)


def test_linearizable_binding_reads_see_what_was_bound_before_and_meet_the_same_checks(sec: Secure) -> None:
    """A LINEARIZABLE binding read behind the Go front end asks its read index as it arrives and runs when
    it comes (frontchannel.IndexFirst; the core answers the ask without a pool thread): it sees every bind
    acknowledged before it, and the call still meets auth and the service's checks."""
    node = _node(sec)
    admin, client = sec.stub(node, "admin"), sec.stub(node, "client")
    for i in range(5):
        bound = admin.BindQueue(api_pb2.BindQueueRequest(topic="GoLin", queue_id=i, owner=f"o{i}"), timeout=10)
        got = client.GetBinding(api_pb2.GetBindingRequest(topic="GoLin", queue_id=i), timeout=10)  # LINEARIZABLE
        assert got.found and got.binding.owner == f"o{i}" and got.apply_offset >= bound.offset
    listed = client.ListBindings(api_pb2.ListBindingsRequest(topic="GoLin"), timeout=10)
    assert sorted(b.owner for b in listed.bindings) == [f"o{i}" for i in range(5)]
    anonymous = api_pb2_grpc.NameServerStub(tlsconf.open_channel(node.grpc_addr, tls=True, ca_file=sec.ca_file))
    with pytest.raises(grpc.RpcError) as none:
        anonymous.GetBinding(api_pb2.GetBindingRequest(topic="GoLin", queue_id=0), timeout=10)
    assert none.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as bad:
        client.GetBinding(api_pb2.GetBindingRequest(topic="", queue_id=0), timeout=10)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and (bad.value.details() or "").startswith("topic")


def test_a_deadline_ends_the_call(sec: Secure) -> None:
    """A read waiting for an offset the node will not reach ends at its caller's deadline, and the node
    serves the next call at once."""
    stub = sec.stub(_node(sec), "client")
    t0 = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        stub.GetRoute(api_pb2.GetRouteRequest(topic="GoTopic", min_offset=1 << 40), timeout=1.0)
    assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE), err.value
    assert time.monotonic() - t0 < 2.0
    stub.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=2)


# ---- the stream bounds (tests/security/test_grpc_streams.py), through the Go front end -----------------

def test_unfinished_streams_without_a_credential_hold_nothing(sec: Secure) -> None:
    node = _node(sec)
    conn = RawConnection(node.grpc_addr, sec.ca_file)
    try:
        opened = conn.open_streams(f"{NAMESERVER}/PutKv", 120)  # HEADERS only, no credential
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(s not in conn.ended for s in opened):
            time.sleep(0.1)
        unanswered = [s for s in opened if s not in conn.ended]
        assert not unanswered, f"{len(unanswered)} of {len(opened)} unfinished streams still held"
        # past limits.grpc_max_streams_per_connection: reset by the transport, never given a status
        refused = len(conn.reset - conn.answered)
        assert refused >= len(opened) - 2 * LIMITS["grpc_max_streams_per_connection"], f"only {refused} reset"
    finally:
        conn.close()
    sec.stub(node, "client").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=2)


def test_a_ping_flood_is_sent_away(sec: Secure) -> None:
    """Keepalive enforcement, as grpcio's: pings with no call open are strikes (the first ping is not),
    and past two the connection is sent GOAWAY and closed.

    No ping follows the one that strikes it out: one arriving after the node closed the connection would
    be unread there, so its kernel would reset the connection, and a reset drops what this side had not
    read yet: the GOAWAY."""
    conn = RawConnection(_node(sec).grpc_addr, sec.ca_file)
    try:
        for i in range(4):  # 20 ms apart: a bound of milliseconds would let them all pass
            conn._send(frame(PING, 0, 0, i.to_bytes(8, "big")))
            time.sleep(0.02)
        assert conn.closed.wait(5), "the node kept a connection that floods it with pings"
        assert conn.goaway, "the connection was closed without a GOAWAY"
    finally:
        conn.close()


def test_a_credentialed_caller_that_never_sends_is_cancelled(sec: Secure) -> None:
    progress_s = LIMITS["grpc_progress_timeout_ms"] / 1000
    stall = threading.Event()

    def never() -> Iterator[bytes]:
        stall.wait(progress_s + 30)
        yield b""

    info = sec.channel(_node(sec), "client").stream_unary(f"{NAMESERVER}/GetClusterInfo")
    t0 = time.monotonic()
    try:
        with pytest.raises(grpc.RpcError) as err:
            info(never())  # no deadline
    finally:
        stall.set()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, err.value
    assert "grpc_progress_timeout_ms" in (err.value.details() or "")
    assert time.monotonic() - t0 < progress_s + 2


def test_stalled_registration_streams_are_bounded_per_caller(sec: Secure) -> None:
    node = _node(sec)
    per_caller, progress_s = LIMITS["grpc_max_streams_per_caller"], LIMITS["grpc_progress_timeout_ms"] / 1000
    stall = threading.Event()

    def chunks(i: int) -> Iterator[api_pb2.RegisterBrokerChunk]:
        yield api_pb2.RegisterBrokerChunk(header=register_request("C2", f"stall{i}", f"10.2.0.{i}:10911", []))
        stall.wait(60)  # the rest never comes (until the test ends)

    stub = sec.stub(node, "broker")
    try:
        calls = [stub.RegisterBrokerStream.future(chunks(i)) for i in range(20)]  # no deadline
        time.sleep(1.0)
        refused = [c for c in calls if c.done()]
        assert len(refused) >= 20 - per_caller * 2, f"only {len(refused)} of 20 stalled streams refused at once"
        for c in refused:
            assert c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, c.exception()
            assert "grpc_max_streams_per_caller" in (c.details() or "")
        sec.stub(node, "client").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=2)  # others are served
        for c in calls:
            assert c.exception(timeout=progress_s + 5) is not None
        admitted = [c for c in calls if c not in refused]
        assert all(c.code() == grpc.StatusCode.DEADLINE_EXCEEDED for c in admitted), {
            (c.code(), c.details()) for c in admitted}
    finally:
        stall.set()


# ---- the workers behind it ----------------------------------------------------------------------------

def _serving_pids(node: NodeProc) -> set[int]:
    """Workers whose log line says they serve (through the front end, on their front socket)."""
    with open(node.log_path, errors="replace") as f:
        text = f.read()
    return {pid for pid in workers_of(node) if f"(pid {pid}) serving gRPC" in text}


def _reads(sec: Secure, node: NodeProc, count: int) -> None:
    stub = sec.stub(node, "client")
    for _ in range(count):
        stub.GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)


def test_the_front_ends_counts_are_in_the_nodes_metrics(sec: Secure) -> None:
    """The core's /metrics: the front end's process up, its restarts, the calls it answered by status code
    (its own counts, written each second)."""
    node = _node(sec)
    _reads(sec, node, 3)
    with pytest.raises(grpc.RpcError):
        api_pb2_grpc.NameServerStub(tlsconf.open_channel(node.grpc_addr, tls=True, ca_file=sec.ca_file)
                                    ).GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=10)

    def scraped() -> dict[str, float] | None:
        with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as r:
            rows = dict(line.rsplit(" ", 1) for line in r.read().decode().splitlines()
                        if line.startswith("nameserver_grpc_front_"))
        found = {k: float(v) for k, v in rows.items()}
        return found if found.get('nameserver_grpc_front_calls_total{code="UNAUTHENTICATED"}') else None

    found = sec.cluster.wait_for("the front end's counts on /metrics", scraped, timeout=10)
    assert found["nameserver_grpc_front_up"] == 1 and found["nameserver_grpc_front_restarts_total"] == 0
    assert found['nameserver_grpc_front_calls_total{code="OK"}'] >= 3


def test_nsctl_status_says_how_the_front_end_is(sec: Secure, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    node = _node(sec)
    token = tmp_path / "admin.token"
    token.write_text(sec.tokens["admin"])
    args = ["--endpoints", node.grpc_addr, "--tls-ca", sec.ca_file, "--token-file", str(token), "status"]
    assert nsctl.main(args) == 0
    front = [line for line in capsys.readouterr().out.splitlines() if "Go gRPC front end" in line]
    assert front == [f"{node.grpc_addr}: Go gRPC front end up, pid {_front_pid(node)}, restarted 0 times"]
    assert nsctl.main(["--json", *args]) == 0
    said = json.loads(capsys.readouterr().out)["nodes"][0]["grpc_front"]
    assert said == {"pid": _front_pid(node), "up": True, "restarts": 0}


def _front_pid(node: NodeProc) -> int:
    assert node.proc is not None
    (pid,) = set(children(node.proc.pid)) - set(workers_of(node))
    return pid


def test_the_front_ends_go_runtime_is_set_by_the_node(sec: Secure) -> None:
    """The front end's process runs with GOMAXPROCS one per worker process (2 here), at most the node's CPUs,
    not Go's default of every CPU; a GOMAXPROCS the node's own environment has is passed on as it is."""
    with open(f"/proc/{_front_pid(_node(sec))}/environ") as f:
        env = dict(item.split("=", 1) for item in f.read().split("\0") if "=" in item)
    assert env.get("GOMAXPROCS") == os.environ.get("GOMAXPROCS", str(max(1, min(usable_cpus(), 2))))


def test_a_killed_worker_leaves_the_other_serving(sec: Secure) -> None:
    node = _node(sec)
    first, second = sorted(sec.cluster.wait_for("both workers serving", lambda: (
        pids if len(pids := _serving_pids(node)) == 2 else None), timeout=60))
    assert sorted(serving(node)) == [first, second]  # the fault suites' count: on their front sockets
    os.kill(first, signal.SIGKILL)
    time.sleep(0.3)  # the front end sees its link end
    _reads(sec, node, 20)  # every one on the other worker
    assert first not in serving(node)


@pytest.mark.slow
def test_a_restarted_worker_is_dialled_again_and_none_left_is_unavailable(sec: Secure) -> None:
    node = _node(sec)
    first, second = sorted(sec.cluster.wait_for("both workers serving", lambda: (
        pids if len(pids := _serving_pids(node)) == 2 else None), timeout=90))
    os.kill(first, signal.SIGKILL)
    restarted = sec.cluster.wait_for("the killed worker back", lambda: (
        pids if len(pids := _serving_pids(node) - {first}) == 2 else None), timeout=90)
    os.kill(second, signal.SIGKILL)
    time.sleep(0.3)
    _reads(sec, node, 20)  # every one on the restarted worker, dialled again
    assert len(restarted - {second}) == 1
    # with no worker at all: UNAVAILABLE, saying so (the core starts them again after its backoff)
    sec.cluster.wait_for("the second worker back", lambda: len(_serving_pids(node) - {first, second}) == 2,
                         timeout=90)
    gone = set(workers_of(node)) | {first, second}
    for pid in gone - {first, second}:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.3)
    with pytest.raises(grpc.RpcError) as err:
        sec.stub(node, "client").GetClusterInfo(api_pb2.GetClusterInfoRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no worker process" in (err.value.details() or "")
    sec.cluster.wait_for("a worker back", lambda: _serving_pids(node) - gone, timeout=90)
    sec.cluster.wait_for("the node answering", lambda: _answers(sec, node), timeout=30)


def _answers(sec: Secure, node: NodeProc) -> bool:
    try:
        _reads(sec, node, 1)
        return True
    except grpc.RpcError:
        return False
