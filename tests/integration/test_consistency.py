"""Queue bindings, read-your-writes, watch and exactly-once writes on a real 3-process cluster."""

from __future__ import annotations

import signal
import threading
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from nameserver import headers
from nameserver.pb import api_pb2
from tests.cluster import Cluster, register_request, retry, running

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 3-node cluster for the tests that only read and write their own keys (topics T and Race,
    namespaces ryw and w) and kill nothing."""
    with running(Cluster(str(tmp_path_factory.mktemp("shared")), 3)) as c:
        yield c


def bind(ns, topic: str, qid: int, owner: str, expected: int, **kw) -> api_pb2.BindingReply:
    return ns.BindQueue(api_pb2.BindQueueRequest(topic=topic, queue_id=qid, owner=owner, expected_version=expected),
                        timeout=10, **kw)


def test_bindings_compare_and_set_and_linearizable_reads(shared: Cluster) -> None:
    c = shared
    c.wait_ready()
    a, b = c.followers()
    first = retry(lambda: bind(a.ns, "T", 0, "broker-a", 0))
    assert first.binding.owner == "broker-a" and first.binding.epoch == 1
    assert first.binding.version == first.offset
    with pytest.raises(grpc.RpcError) as err:  # must-not-exist fails now
        bind(b.ns, "T", 0, "broker-b", 0)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert str(first.offset) in err.value.details()
    second = bind(b.ns, "T", 0, "broker-b", first.binding.version)  # rebind with the right version
    assert second.binding.epoch == 2 and second.binding.owner == "broker-b"
    # a linearizable read on the third node sees it at once, without passing an offset
    for node in c.nodes:
        got = node.ns.GetBinding(api_pb2.GetBindingRequest(topic="T", queue_id=0), timeout=10)
        assert got.found and got.binding.owner == "broker-b" and got.apply_offset >= second.offset
    bind(a.ns, "T", 3, "broker-c", 0)
    listed = c.leader().ns.ListBindings(api_pb2.ListBindingsRequest(topic="T"), timeout=10)
    assert [(x.queue_id, x.owner) for x in listed.bindings] == [(0, "broker-b"), (3, "broker-c")]
    released = a.ns.ReleaseQueue(api_pb2.ReleaseQueueRequest(topic="T", queue_id=0,
                                                             expected_version=second.binding.version), timeout=10)
    got = b.ns.GetBinding(api_pb2.GetBindingRequest(topic="T", queue_id=0), timeout=10)
    assert not got.found and got.apply_offset >= released.offset
    with pytest.raises(grpc.RpcError) as err:
        a.ns.ReleaseQueue(api_pb2.ReleaseQueueRequest(topic="T", queue_id=0, expected_version=5), timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def counters(node) -> dict[str, float]:
    """The read-index counters of a node's /metrics."""
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as resp:
        families = text_string_to_metric_families(resp.read().decode())
        return {s.name: s.value for f in families for s in f.samples
                if s.name.startswith(("nameserver_read_index_", "nameserver_votes_refused"))}


@pytest.mark.parametrize("lease", [True, False], ids=["lease", "no-lease"])
def test_linearizable_reads_under_the_lease_and_asked_of_the_leader_over_the_raft_link(
        make_cluster, lease: bool) -> None:
    """A write through one follower is seen at once by a linearizable read through the other (no
    min_offset): the follower asks the leader over the Raft link, and the leader answers under its
    lease (read_lease on) or after a heartbeat round (off); the counters show which way it went."""
    c = make_cluster(3, metrics=True, security={"raft": {"read_lease": lease}})
    leader = c.wait_ready()
    a, b = c.followers()
    before = {n.name: counters(n) for n in c.nodes}
    version = 0
    for i in range(20):
        owner = f"broker-{i}"
        put = retry(lambda o=owner, v=version: bind(a.ns, "Lease", 0, o, v))
        version = put.binding.version
        for reader in (b, leader):
            got = reader.ns.GetBinding(api_pb2.GetBindingRequest(topic="Lease", queue_id=0), timeout=10)
            assert got.found and got.binding.owner == owner and got.apply_offset >= put.offset, reader.name
    after = {n.name: counters(n) for n in c.nodes}

    def grew(node, name: str) -> float:
        return after[node.name][name] - before[node.name][name]

    assert grew(b, "nameserver_read_index_asks_total") >= 20  # each read of b, one ask (nothing shared it)
    if lease:
        # b's asks and the leader's reads: under the lease, or after a round where a loaded machine let the
        # lease lapse (1-2 of 40 at load 20-40 on 2 cores, before and after session 25's tick changes)
        assert grew(leader, "nameserver_read_index_lease_total") >= 30
        assert (grew(leader, "nameserver_read_index_lease_total")
                + grew(leader, "nameserver_read_index_rounds_total")) >= 40
    else:
        assert grew(leader, "nameserver_read_index_lease_total") == 0
        assert grew(leader, "nameserver_read_index_rounds_total") >= 20
    # no vote was refused while it read (a node refuses votes for a moment after it starts: not counted)
    assert all(grew(n, "nameserver_votes_refused_under_lease_total") == 0 for n in c.nodes)


def test_a_leader_paused_under_its_lease_never_serves_a_stale_binding_after_it_resumes(make_cluster) -> None:
    """The read lease's hazard, made on purpose: the leader holds a fresh lease (it is reading), stops
    (SIGSTOP), a new leader is elected and rebinds the queue, and the old leader resumes. Every
    linearizable read through it must see the new owner or fail; the old owner would be a stale read.
    Its lease ran out while it was stopped (monotonic time runs on), and its followers follow the new
    leader now, so no ping round confirms it either."""
    c = make_cluster(3)
    old = c.wait_ready()
    a, b = c.followers()
    first = retry(lambda: bind(old.ns, "Paused", 0, "owner-old", 0))
    req = api_pb2.GetBindingRequest(topic="Paused", queue_id=0)
    for _ in range(20):  # reads under the lease, right up to the stop
        assert old.ns.GetBinding(req, timeout=5).binding.owner == "owner-old"
    old.proc.send_signal(signal.SIGSTOP)
    try:
        new = c.wait_ready([a, b], timeout=30)
        moved = retry(lambda: bind(new.ns, "Paused", 0, "owner-new", first.binding.version))
        assert moved.binding.owner == "owner-new"
    finally:
        old.proc.send_signal(signal.SIGCONT)
    seen: list[str] = []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        try:
            got = old.ns.GetBinding(req, timeout=2)
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
            seen.append("error")
            continue
        seen.append(got.binding.owner)
    assert "owner-old" not in seen, seen
    assert "owner-new" in seen, seen  # and once it follows the new leader, it answers again


def test_concurrent_binds_of_one_queue_have_exactly_one_winner(shared: Cluster) -> None:
    c = shared
    c.wait_ready()
    outcomes: list[str] = []

    def contender(node, owner: str) -> None:
        try:
            retry(lambda: bind(node.ns, "Race", 7, owner, 0))
            outcomes.append("won")
        except grpc.RpcError as exc:
            outcomes.append(exc.code().name)

    threads = [threading.Thread(target=contender, args=(c.nodes[i % 3], f"owner-{i}")) for i in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("won") == 1 and outcomes.count("FAILED_PRECONDITION") == 8


def test_write_on_one_node_then_read_with_its_offset_on_another_sees_it(shared: Cluster) -> None:
    c = shared
    c.wait_ready()
    for i in range(30):
        writer, reader = c.nodes[i % 3], c.nodes[(i + 1) % 3]
        put = retry(lambda w=writer, i=i: w.ns.PutKv(api_pb2.PutKvRequest(namespace="ryw", key=f"k{i}", value=str(i)),
                                                      timeout=10))
        got = reader.ns.GetKv(api_pb2.GetKvRequest(namespace="ryw", key=f"k{i}", min_offset=put.offset), timeout=10)
        assert got.value == str(i) and got.apply_offset >= put.offset
        # The node that answered a write has applied it: a plain read there (no min_offset) sees it, as
        # a broker that registered through a follower asks that follower for its routes next.
        same = writer.ns.GetKv(api_pb2.GetKvRequest(namespace="ryw", key=f"k{i}"), timeout=10)
        assert same.value == str(i) and same.apply_offset >= put.offset


def test_min_offset_beyond_the_log_fails_with_the_nodes_offset(shared: Cluster) -> None:
    with pytest.raises(grpc.RpcError) as err:  # a read: it writes nothing to the shared cluster
        shared.nodes[0].ns.GetKv(api_pb2.GetKvRequest(namespace="n", key="k", min_offset=10**9), timeout=0.5)
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    if err.value.code() == grpc.StatusCode.UNAVAILABLE:
        trailers = dict(err.value.trailing_metadata())
        assert int(trailers[headers.APPLY_OFFSET]) > 0


def collect(stream, stop: threading.Event, out: list) -> None:
    try:
        for msg in stream:
            out.append(msg)
            if stop.is_set():
                break
    except grpc.RpcError as exc:
        out.append(exc)


def test_watch_pushes_changes_and_resumes_without_gaps_or_duplicates(shared: Cluster) -> None:
    c = shared
    c.wait_ready()
    a, b = c.followers()
    first = retry(lambda: a.ns.PutKv(api_pb2.PutKvRequest(namespace="w", key="k0", value="0"), timeout=10))
    b.ns.GetKv(api_pb2.GetKvRequest(namespace="w", key="k0", min_offset=first.offset), timeout=10)  # b has it
    # from now: current state first, then live changes, pushed from another node
    stream = b.ns.Watch(api_pb2.WatchRequest(key_prefixes=["kv/w/"], progress_interval_ms=200), timeout=30)
    got: list = []
    stop = threading.Event()
    t = threading.Thread(target=collect, args=(stream, stop, got), daemon=True)
    t.start()
    c.wait_for("the initial state", lambda: any(m.initial_state_done for m in got if hasattr(m, "offset")))
    assert [e.key for m in got if m.initial_state for e in m.events] == ["kv/w/k0"]
    offsets = []
    for i in range(1, 21):
        offsets.append(a.ns.PutKv(api_pb2.PutKvRequest(namespace="w", key=f"k{i}", value=str(i)), timeout=10).offset)
        if i == 10:
            stream.cancel()  # disconnect half-way
    t.join(5)
    seen = [(m.offset, e.key) for m in got if hasattr(m, "events") and not m.initial_state for e in m.events]
    assert seen, "no live change arrived"
    last = max(o for o, _ in seen)
    # resume from the last offset seen, on the third node: the rest, exactly once, in order
    resumed: list = []
    stream2 = c.leader().ns.Watch(api_pb2.WatchRequest(key_prefixes=["kv/w/"], start_offset=last,
                                                        progress_interval_ms=200), timeout=30)
    t2 = threading.Thread(target=collect, args=(stream2, stop, resumed), daemon=True)
    t2.start()
    c.wait_for("every change after the resume point",
               lambda: any(isinstance(m, api_pb2.WatchResponse) and m.offset >= offsets[-1] for m in resumed))
    stream2.cancel()
    t2.join(5)
    after = [(m.offset, e.key) for m in resumed if isinstance(m, api_pb2.WatchResponse) for e in m.events]
    both = seen + after
    keys = [k for _, k in both]
    assert keys == [f"kv/w/k{i}" for i in range(1, 21)], keys  # no gap, no duplicate, in order
    assert [o for o, _ in both] == sorted(o for o, _ in both)
    assert first.offset < both[0][0]


def test_watch_from_a_compacted_offset_says_relist(make_cluster) -> None:
    c = make_cluster(1, snapshot_every_entries=20)
    c.wait_ready()
    node = c.nodes[0]
    for i in range(40):
        node.ns.PutKv(api_pb2.PutKvRequest(namespace="w", key=f"k{i}", value="v"), timeout=10)
    snap = node.admin.TakeSnapshot(api_pb2.TakeSnapshotRequest(), timeout=30)
    c.kill(node, signal.SIGTERM)  # the restart loads the snapshot: nothing before it is kept
    c.start(node)
    c.wait_ready()
    stream = node.ns.Watch(api_pb2.WatchRequest(key_prefixes=["kv/"], start_offset=1), timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        for _ in stream:
            pass
    assert err.value.code() == grpc.StatusCode.OUT_OF_RANGE
    assert "re-list" in err.value.details()
    # from the snapshot's offset on, resuming works
    after = node.ns.Watch(api_pb2.WatchRequest(key_prefixes=["kv/"], start_offset=snap.offset,
                                               progress_interval_ms=100), timeout=10)
    first = next(iter(after))
    assert first.offset >= snap.offset and not first.events  # a progress message: nothing missed
    after.cancel()


def test_retried_write_after_leader_kill_applies_once(make_cluster) -> None:
    c = make_cluster()
    leader = c.wait_ready()
    follower = c.followers()[0]
    md = [(headers.CLIENT_ID, "client-42"), (headers.CLIENT_SEQ, "1")]
    req = register_request("C", "broker-x", "10.0.0.5:10911", ["T1", "T2"])
    first = retry(lambda: follower.ns.RegisterBroker(req, timeout=10, metadata=md))
    assert first.records > 0
    c.kill(leader)  # the retry lands on a new leader
    survivors = [n for n in c.nodes if n is not leader]
    again = retry(lambda: survivors[1].ns.RegisterBroker(req, timeout=5, metadata=md), timeout=20)
    assert again.offset == first.offset and again.records == first.records  # the first result, not a new write
    end = c.leader(survivors).status().end_offset
    third = retry(lambda: survivors[0].ns.RegisterBroker(req, timeout=5, metadata=md))
    assert third.offset == first.offset
    assert c.leader(survivors).status().end_offset == end  # nothing appended for the retries
    # a KV write retried with the same id is not applied twice either
    kv_md = [(headers.CLIENT_ID, "client-42"), (headers.CLIENT_SEQ, "2")]
    p1 = retry(lambda: survivors[0].ns.PutKv(api_pb2.PutKvRequest(namespace="once", key="k", value="1"),
                                              timeout=5, metadata=kv_md))
    survivors[1].ns.PutKv(api_pb2.PutKvRequest(namespace="once", key="k", value="changed"), timeout=5)
    p2 = survivors[1].ns.PutKv(api_pb2.PutKvRequest(namespace="once", key="k", value="1"), timeout=5, metadata=kv_md)
    assert p2.offset == p1.offset
    got = survivors[0].ns.GetKv(api_pb2.GetKvRequest(namespace="once", key="k", min_offset=p2.offset), timeout=5)
    assert got.value == "changed"  # the retry did not overwrite the later write
    old = [(headers.CLIENT_ID, "client-42"), (headers.CLIENT_SEQ, "1")]
    with pytest.raises(grpc.RpcError) as err:
        survivors[0].ns.PutKv(api_pb2.PutKvRequest(namespace="once", key="k", value="x"), timeout=5, metadata=old)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    bad = [(headers.CLIENT_ID, "client-42"), (headers.CLIENT_SEQ, "zero")]
    with pytest.raises(grpc.RpcError) as err:
        survivors[0].ns.PutKv(api_pb2.PutKvRequest(namespace="once", key="k", value="x"), timeout=5, metadata=bad)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and headers.CLIENT_SEQ in err.value.details()


def test_idle_sessions_expire_through_records(make_cluster) -> None:
    c = make_cluster(1, scan_interval_ms=300, session_ttl_ms=1000)
    c.wait_ready()
    node = c.nodes[0]
    node.ns.PutKv(api_pb2.PutKvRequest(namespace="s", key="k", value="v"), timeout=5,
                  metadata=[(headers.CLIENT_ID, "idle"), (headers.CLIENT_SEQ, "1")])
    assert node.status().keys == 3  # the KV, its namespace and the client's session
    c.wait_for("the idle session to expire", lambda: node.status().keys == 2, timeout=10)


def test_bind_retried_after_killing_the_leader_mid_call_applies_once(make_cluster) -> None:
    """A must-not-exist bind applied twice would fail its retry; exactly-once returns the first result."""
    c = make_cluster()
    c.wait_ready()
    for attempt in range(4):
        leader = c.wait_ready([n for n in c.nodes if n.alive])
        via = next(n for n in c.nodes if n.alive and n is not leader)
        md = [(headers.CLIENT_ID, "mid-call"), (headers.CLIENT_SEQ, str(attempt + 1))]
        req = api_pb2.BindQueueRequest(topic="Mid", queue_id=attempt, owner=f"owner-{attempt}")
        future = via.ns.BindQueue.future(req, timeout=5, metadata=md)
        time.sleep(0.001 * attempt)  # vary where the kill lands: before, during, after the commit
        c.kill(leader)
        try:
            first = future.result()
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), exc
            first = None
        survivors = [n for n in c.nodes if n is not leader]
        again = retry(lambda s=survivors, r=req, m=md: s[0].ns.BindQueue(r, timeout=5, metadata=m), timeout=30)
        assert again.binding.epoch == 1 and again.binding.owner == f"owner-{attempt}"  # applied exactly once
        if first is not None:
            assert again.offset == first.offset
        got = survivors[1].ns.GetBinding(api_pb2.GetBindingRequest(topic="Mid", queue_id=attempt), timeout=10)
        assert got.binding.epoch == 1 and got.binding.version == again.offset
        c.start(leader)
        c.wait_converged(c.nodes, timeout=60)
