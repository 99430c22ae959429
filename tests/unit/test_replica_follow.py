"""ReadReplica over a real in-process gRPC server serving Log.Follow from a stand-in core (a MetadataState,
its history ring and an apply offset that waiters are woken on), or over a worker's Unix feed of the same
messages (`follow`: both), and the replica's pure parts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from bench.replicaapply import StandInLog
from nameserver.api.callguard import CallGuard
from nameserver.api.follow import FollowFeed
from nameserver.api.logservice import LogService
from nameserver.config import Member, NodeConfig
from nameserver.core.reads import NotReady
from nameserver.localfeed import FeedServer, FeedStream, FollowRefused, LocalFeed
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.replica import ReadReplica, ReplicaNode
from nameserver.replica.follower import SnapshotMismatch
from nameserver.state import MetadataState, quotas, translate
from raftlog import kvstate
from raftlog.codec import encode_entry
from raftlog.history import AppliedEntry
from raftlog.pb import entry_pb2
from tests.cluster import register_request


class StandInCore:
    """A core's state and log, applied by the test: entries through the same MetadataState code."""

    def __init__(self, keep: int = 1000) -> None:
        self.lock = threading.RLock()
        self.cfg = SimpleNamespace(max_message_bytes=1 << 20, max_followers=2)
        self.state = MetadataState()
        self.log = StandInLog(keep)

    def write(self, translation: translate.Translation) -> int:
        offset = self.log.apply_offset + 1
        entry = entry_pb2.Entry(term=1, batches=[translation.batch])
        with self.lock:
            self.state.apply_entry(offset, entry)
        self.log.history.append(AppliedEntry(offset, 1, encode_entry(entry), ()))
        self.log.publish(offset)
        return offset

    def noop(self) -> int:
        """An offset without an entry of ours (pysyncobj's no-op)."""
        offset = self.log.apply_offset + 1
        with self.lock:
            self.state.kv.offset = offset
        self.log.publish(offset)
        return offset

    def put(self, key: str, value: str) -> int:
        return self.write(translate.put_kv(self.state, "ns", key, value))

    def restore(self, snapshot: MetadataState) -> None:
        """Replace the state with `snapshot`'s, as the apply thread restores one (raftlog/applier.py)."""
        with self.lock:
            self.state.restore(snapshot.kv.offset, snapshot.kv.items())
            self.log.restores += 1
        self.log.history.reset(snapshot.kv.offset)
        self.log.publish(snapshot.kv.offset)

    def inspect(self, fn: Callable) -> object:
        with self.lock:
            return fn(self.state)

    def not_ready_reason(self) -> str:
        return "stand-in"


@pytest.fixture
def replicas() -> Iterator[Callable[..., ReadReplica]]:
    made: list[ReadReplica] = []

    def make(addr: str, **kw: object) -> ReadReplica:
        r = ReadReplica(addr, grpc.insecure_channel, name=f"r{len(made)}", **kw)  # type: ignore[arg-type]
        made.append(r)
        r.start()
        return r

    yield make
    for r in made:
        r.stop()


@pytest.fixture(params=["grpc", "unix"])
def follow(request, serve_log, tmp_path) -> Iterator[Callable[[StandInCore], tuple[str, dict[str, Any]]]]:
    """Where a replica follows a stand-in core, and how: over Log.Follow (a remote replica's) or over a Unix
    feed of the same messages (a worker's, nameserver/localfeed.py). Returns (target, ReadReplica kwargs)."""
    servers: list[FeedServer] = []

    def start(core: StandInCore) -> tuple[str, dict[str, Any]]:
        addr = serve_log(core)
        if request.param == "grpc":
            return addr, {}
        feed = FeedServer(str(tmp_path / f"feed{len(servers)}.sock"), FollowFeed(core).messages, 10.0)  # type: ignore[arg-type]
        feed.start()
        servers.append(feed)
        return addr, {"feed": LocalFeed(feed.path, core.cfg.max_message_bytes)}

    yield start
    for s in servers:
        s.stop()


def wait_until(cond: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def at(replica: ReadReplica, core: StandInCore) -> Callable[[], bool]:
    return lambda: replica.offset == core.log.apply_offset and replica.ready


def test_replica_loads_the_state_then_applies_entries_as_applied(follow, replicas) -> None:
    core = StandInCore()
    for i in range(30):
        core.put(f"k{i % 7}", f"v{i}")
    core.write(translate.register_broker(core.state, register_request("C", "b", "10.0.0.1:10911", ["T"]), 30000))
    addr, kw = follow(core)
    r = replicas(addr, **kw)
    wait_until(at(r, core))
    assert r.bootstraps == 1 and r.digest_hex == core.state.digest_hex and r.lag == 0
    digests = {}
    for i in range(40):  # live: entries and no-op offsets, each pushed as applied
        offset = core.noop() if i % 5 == 0 else core.put(f"k{i % 3}", f"w{i}")
        digests[offset] = core.state.digest_hex
    wait_until(at(r, core))
    with r.lock:
        assert {o: r.state.kv.digest_at(o) for o in digests} == digests
        assert r.state.route("T") == core.state.route("T")
    assert r.bootstraps == 1 and r.reconnects == 0


def test_a_replica_that_serves_reads_only_keeps_no_digest_or_quota_totals_per_entry(
        serve_log, replicas, monkeypatch: pytest.MonkeyPatch) -> None:
    """accounting=False (a node's worker processes): the snapshot's digest is still checked, then entries
    apply without hashing a pair or counting a quota, and read as the core's; a digest asked past the
    snapshot is refused, never answered stale."""
    core = StandInCore()
    core.put("k0", "v")
    r = replicas(serve_log(core), accounting=False)
    wait_until(at(r, core))
    assert r.bootstraps == 1 and r.digest_hex == core.state.digest_hex  # checked on load, and right there
    hashed: list[str] = []  # the threads that hashed a pair
    real, real_prefixed = kvstate.pair_hash, kvstate.prefixed_hash  # a key's first pair, and its later ones
    monkeypatch.setattr(kvstate, "pair_hash",
                        lambda key, value: hashed.append(threading.current_thread().name) or real(key, value))
    monkeypatch.setattr(kvstate, "prefixed_hash", lambda prefix, value: hashed.append(
        threading.current_thread().name) or real_prefixed(prefix, value))
    real_hasher = kvstate.new_pair_hasher  # a new pair's hash, made in the apply loop itself
    monkeypatch.setattr(kvstate, "new_pair_hasher",
                        lambda: hashed.append(threading.current_thread().name) or real_hasher())
    for i in range(10):
        core.put(f"k{i % 3}", f"w{i}")
    core.write(translate.register_broker(core.state, register_request("C", "b", "10.0.0.1:10911", ["T"]), 30000))
    wait_until(at(r, core))
    assert hashed and not [name for name in hashed if name.startswith("replica-")]  # the core's state did
    with r.lock:
        assert r.state.route("T") == core.state.route("T")
        assert r.state.kv.get("kv/ns/k1") == core.state.kv.get("kv/ns/k1") is not None
        assert r.state.usage.totals == dict.fromkeys(quotas.QUOTAS, 0)
        with pytest.raises(RuntimeError, match="keeps no digest"):
            r.state.kv.digest_at(core.log.apply_offset)
    with pytest.raises(RuntimeError, match="keeps no digest"):
        assert not r.digest_hex


def test_resume_from_an_offset_older_than_the_history_loads_a_snapshot_again(follow, replicas) -> None:
    core = StandInCore(keep=5)
    for i in range(10):
        core.put(f"k{i}", "v")
    addr, kw = follow(core)
    r = replicas(addr, **kw)
    wait_until(at(r, core))
    r.stop()
    for i in range(3):  # within the history: the replica resumes with these entries only
        core.put(f"k{i}", "again")
    r.start()
    wait_until(at(r, core))
    assert r.bootstraps == 1 and r.digest_hex == core.state.digest_hex
    r.stop()
    for i in range(20):  # more than the ring keeps
        core.put(f"k{i}", "later")
    r.start()
    wait_until(at(r, core))
    assert r.bootstraps == 2 and r.digest_hex == core.state.digest_hex


def test_a_state_the_core_restores_at_or_below_the_replicas_offset_replaces_the_replicas(follow, replicas) -> None:
    """docs/faults.md, finding 13: a worker kept a state without entries its core held, and loaded no
    snapshot. A core that restores a snapshot at or below a follower's offset (the leader's, or its own
    again) leaves its history past that offset intact: the follower was never sent the restored state and
    kept its own, whatever the two differed by. Now every restore sends the follower the state again."""
    core = StandInCore()
    for i in range(10):
        core.put(f"k{i}", "v")
    addr, kw = follow(core)
    r = replicas(addr, **kw)
    wait_until(at(r, core))
    # the state as the leader has it at the same offset (10): k1 differs, k9 is not there
    truth = MetadataState()
    for i in range(10):
        key, value = ("k1", "the leader's") if i == 9 else (f"k{i}", "v")
        truth.apply_entry(i + 1, entry_pb2.Entry(term=1, batches=[translate.put_kv(truth, "ns", key, value).batch]))
    core.restore(truth)
    core.put("after", "restore")
    wait_until(lambda: r.offset == core.log.apply_offset)
    with r.lock:
        assert r.state.kv_list("ns") == core.state.kv_list("ns")
    assert r.bootstraps == 2 and r.digest_hex == core.state.digest_hex


def test_follow_from_an_offset_sends_entries_only_and_keepalives_when_idle(serve_log) -> None:
    core = StandInCore()
    for i in range(6):
        core.put("k", str(i))
    core.noop()
    with grpc.insecure_channel(serve_log(core)) as ch:
        call = api_pb2_grpc.LogStub(ch).Follow(api_pb2.FollowRequest(from_offset=3), timeout=5)
        first = next(call)
        assert not first.HasField("snapshot")
        assert [e.offset for e in first.entries] == [4, 5, 6]
        assert first.through_offset == first.core_offset == 7
        idle = next(call)  # a keepalive: nothing new
        assert not idle.entries and idle.through_offset == 7
        call.cancel()
        whole = api_pb2_grpc.LogStub(ch).Follow(api_pb2.FollowRequest(), timeout=5)
        first = next(whole)
        assert first.snapshot_done and first.snapshot.apply_offset == first.through_offset == 7
        assert first.snapshot.digest == core.state.digest_hex
        whole.cancel()
        with pytest.raises(grpc.RpcError) as err:
            next(api_pb2_grpc.LogStub(ch).Follow(api_pb2.FollowRequest(from_offset=-1), timeout=5))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "from_offset" in (err.value.details() or "")


def test_followers_past_max_followers_are_refused_until_one_leaves(serve_log) -> None:
    """limits.max_followers (2 on the stand-in) bounds the Follow streams a node feeds: the workers of a
    node all follow with one peer credential, so the call guard's per-caller slots do not bound them."""
    core = StandInCore()
    core.put("k", "v")
    with grpc.insecure_channel(serve_log(core)) as ch:
        stub = api_pb2_grpc.LogStub(ch)
        held = [stub.Follow(api_pb2.FollowRequest(), timeout=30) for _ in range(2)]
        for call in held:
            assert next(call).snapshot_done
        with pytest.raises(grpc.RpcError) as err:
            next(stub.Follow(api_pb2.FollowRequest(), timeout=5))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.max_followers" in (err.value.details() or "")
        held.pop().cancel()
        deadline = time.monotonic() + 5  # the cancelled stream's handler notices within a keepalive
        while True:
            try:
                again = stub.Follow(api_pb2.FollowRequest(), timeout=30)
                assert next(again).snapshot_done
                again.cancel()
                break
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                time.sleep(0.2)
        held[0].cancel()


def _snapshot_of(state: MetadataState, digest: str | None = None) -> api_pb2.StateChunk:
    chunk = api_pb2.StateChunk(apply_offset=state.kv.offset, digest=digest or state.digest_hex)
    for key, value, version, rtype in state.kv.items():
        chunk.items.add(key=key, value=value, version=version, type=rtype)
    return chunk


def test_feed_links_hold_one_of_max_followers_each_until_they_close(tmp_path) -> None:
    """A worker's feed link takes one of limits.max_followers (2 on the stand-in) as a Follow stream does,
    refused RESOURCE_EXHAUSTED past it in the same words, and gives it back once its link closes."""
    core = StandInCore()
    core.put("k", "v")
    server = FeedServer(str(tmp_path / "feed.sock"), FollowFeed(core).messages, 10.0)  # type: ignore[arg-type]
    server.start()

    def first(stream: FeedStream) -> api_pb2.FollowMessage:
        return next(stream)

    try:
        held = [FeedStream(server.path, 0, 1 << 22) for _ in range(2)]
        assert all(first(s).snapshot_done for s in held)  # each has its slot and the state
        with pytest.raises(FollowRefused) as err:
            first(FeedStream(server.path, 0, 1 << 22))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.max_followers" in err.value.details()
        held[0].cancel()  # the core sees it at its next keepalive, within a second

        def admitted() -> bool:
            try:
                return first(FeedStream(server.path, 0, 1 << 22)).snapshot_done
            except FollowRefused:
                return False

        wait_until(admitted)
    finally:
        server.stop()


def test_a_snapshot_whose_pairs_do_not_match_its_digest_is_refused() -> None:
    core = StandInCore()
    core.put("k", "v")
    r = ReadReplica("nowhere", grpc.insecure_channel)
    with pytest.raises(SnapshotMismatch):
        r._install([_snapshot_of(core.state, digest="00" * 16)])
    assert not r.ready and "not loaded" in r.not_ready_reason()


def test_readiness_follows_lag_and_silence_and_reads_wait_for_min_offset() -> None:
    core = StandInCore()
    core.put("k", "v1")
    r = ReadReplica("core", grpc.insecure_channel, max_lag=2)
    cfg = NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir="/nonexistent",
                     members=[Member("127.0.0.1:1", "127.0.0.1:2")])
    node = ReplicaNode(r, cfg)
    with pytest.raises(NotReady):
        node.read(lambda s: s.kv_get("ns", "k"), 0, 1.0)
    generation = r.state.route_generation
    r._install([_snapshot_of(core.state)])
    assert r.state.route_generation > generation + 1  # a route cached before never matches after
    r._heard = time.monotonic()
    assert r.ready and node.read(lambda s: s.kv_get("ns", "k"), 1, 1.0) == ("v1", 1)
    r._core_offset = 9  # the core is further on than the bound allows
    assert not r.ready and "8 entries behind" in r.not_ready_reason()
    entry = encode_entry(entry_pb2.Entry(term=1, batches=[translate.put_kv(core.state, "ns", "k", "v2").batch]))
    r._apply(api_pb2.FollowMessage(entries=[api_pb2.LogEntry(offset=2, term=1, entry=entry)], through_offset=8,
                                   core_offset=9))
    assert r.ready and r.offset == 8 and r.lag == 1
    # a read at an offset not applied yet waits for it, and fails naming both offsets when it does not come
    threading.Timer(0.2, lambda: r._apply(api_pb2.FollowMessage(through_offset=9, core_offset=9))).start()
    assert node.read(lambda s: s.kv_get("ns", "k"), 9, 5.0) == ("v2", 9)
    with pytest.raises(Exception, match="below min_offset 10"):
        node.read(lambda s: s.kv_get("ns", "k"), 10, 0.2)
    r.max_silence_s = 0.0
    assert not r.ready and "has not heard" in r.not_ready_reason()


def test_a_follower_that_stops_reading_is_cut_off_and_resumes_from_its_offset() -> None:
    """Nothing queues per stream on the core: the stream's next message waits on the client, and the
    call guard's progress timeout ends a stream whose client stopped reading."""
    core = StandInCore()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         interceptors=[CallGuard(progress_timeout_ms=300, max_streams=4, max_streams_per_caller=4)])
    api_pb2_grpc.add_LogServicer_to_server(LogService(core), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            call = api_pb2_grpc.LogStub(ch).Follow(api_pb2.FollowRequest(), timeout=30)
            assert next(call).snapshot_done
            for i in range(400):  # ~40 MB of entries the client does not read
                core.put(f"k{i}", "x" * 100_000)
            time.sleep(1.5)
            with pytest.raises(grpc.RpcError) as err:
                for _ in call:
                    pass
            assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert "the client read no reply" in (err.value.details() or "")
    finally:
        server.stop(0)


# ---- a worker's start: its core's snapshot file, the stream's snapshot as it comes, a loading core --------


def _write_snapshot(data_dir: str, state: MetadataState) -> int:
    from snapshot.store import SnapshotStore

    store = SnapshotStore(f"{data_dir}/snapshots")
    store.write(state.kv.offset, 1, state.digest_hex, sorted(state.kv.items()))
    return state.kv.offset


def test_a_replica_seeded_from_its_cores_snapshot_file_follows_from_its_offset(serve_log, replicas, tmp_path) -> None:
    from nameserver.replica.seed import seed_from_snapshots

    core = StandInCore()
    for i in range(10):
        core.put(f"k{i}", "v")
    seeded_at = _write_snapshot(str(tmp_path), core.state)
    for i in range(5):  # after the file: the stream brings these
        core.put(f"k{i}", "later")
    r = ReadReplica(serve_log(core), grpc.insecure_channel, name="seeded")
    assert seed_from_snapshots(r, str(tmp_path)) == seeded_at == r.offset
    assert not r.ready  # loaded, but the core has not spoken yet
    r.start()
    try:
        wait_until(at(r, core))
        assert r.bootstraps == 1 and r.digest_hex == core.state.digest_hex  # the file's: no snapshot streamed
    finally:
        r.stop()


def test_a_seeded_replica_answers_routes_while_it_builds_their_index_and_after(serve_log, tmp_path) -> None:
    """A worker's seed leaves the route index to a thread of its own (MetadataState.restore defer_routes): the
    replica's reads answer as its core's before, while and after it is built, with the stream's entries between."""
    from nameserver.replica.seed import seed_from_snapshots
    from nameserver.state.pendingroutes import CHUNK_KEYS

    core = StandInCore()
    for b in range(3):  # more keys than one chunk: the thread takes the lock more than once
        topics = [f"T{t}" for t in range(b, CHUNK_KEYS // 2 + b)]
        core.write(translate.register_broker(core.state, register_request("C", f"b{b}", f"10.0.0.{b}:10911", topics),
                                             30000))
    _write_snapshot(str(tmp_path), core.state)
    core.write(translate.register_broker(core.state, register_request("C", "b1", "10.0.0.1:10911", ["T0", "New"]),
                                         30000))  # after the file: the stream brings it
    r = ReadReplica(serve_log(core), grpc.insecure_channel, name="building")

    def reads(state: MetadataState) -> tuple[object, ...]:
        return (state.topic_count(), state.broker_topics("b1")[-3:], state.topic_brokers("T1"),
                state.topic_brokers("New"), state.has_topic("T0"), state.route("T2"))

    seed_from_snapshots(r, str(tmp_path))
    r.start()
    try:
        wait_until(at(r, core))
        with r.lock:
            assert reads(r.state) == reads(core.state)
        wait_until(lambda: r.state._pending is None)
        assert reads(r.state) == reads(core.state) and r.bootstraps == 1
        assert r.state._topic_queues == core.state._topic_queues
        assert r.state._broker_topics == core.state._broker_topics
    finally:
        r.stop()


def test_a_seed_the_core_does_not_confirm_is_replaced_by_its_state(serve_log, tmp_path) -> None:
    from nameserver.replica.seed import seed_from_snapshots

    core = StandInCore()
    for i in range(10):
        core.put(f"k{i}", "v")
    other = MetadataState()  # another state at the same offset: not what the core holds there
    other.restore(core.state.kv.offset, [("kv/ns/x", b"\x0a\x01y", 1, 0)])
    _write_snapshot(str(tmp_path), other)
    assert seed_from_snapshots(ReadReplica("nowhere", grpc.insecure_channel), str(tmp_path / "none")) == 0
    r = ReadReplica(serve_log(core), grpc.insecure_channel, name="misseeded")
    seed_from_snapshots(r, str(tmp_path))
    r.start()
    try:
        wait_until(at(r, core))
        assert r.bootstraps == 2 and r.digest_hex == core.state.digest_hex
    finally:
        r.stop()


def test_the_streams_snapshot_is_loaded_as_its_chunks_come(monkeypatch) -> None:
    """One chunk held at a time: the load takes a chunk's items before the next chunk is read off the stream."""
    from raftlog import kvstate

    core = StandInCore()
    for i in range(9):
        core.put(f"k{i}", "v")
    items = sorted(core.state.kv.items())
    chunks = [api_pb2.StateChunk(apply_offset=core.state.kv.offset, digest=core.state.digest_hex,
                                 items=[api_pb2.StateItem(key=k, value=v, version=ver, type=t)
                                        for k, v, ver, t in items[i:i + 4]]) for i in range(0, len(items), 4)]
    events: list[tuple[str, object]] = []
    restore = kvstate.KVState.restore

    def watched(self, offset, items, digest=None):  # type: ignore[no-untyped-def]
        def each():  # type: ignore[no-untyped-def]
            for item in items:
                events.append(("item", item[0]))
                yield item
        return restore(self, offset, each(), digest)

    monkeypatch.setattr(kvstate.KVState, "restore", watched)

    def stream() -> Iterator[api_pb2.FollowMessage]:
        for i, chunk in enumerate(chunks[1:], 1):
            events.append(("pulled", i))
            yield api_pb2.FollowMessage(snapshot=chunk, snapshot_done=i == len(chunks) - 1)

    r = ReadReplica("core", grpc.insecure_channel)
    r._install(r._snapshot_chunks(api_pb2.FollowMessage(snapshot=chunks[0]), stream()))
    assert r.digest_hex == core.state.digest_hex and r.offset == core.state.kv.offset
    assert events.index(("item", items[0][0])) < events.index(("pulled", 1))
    assert events.index(("item", items[4][0])) < events.index(("pulled", 2))
    # a stream that ends inside a snapshot: refused, the state held before is kept
    before = r.state
    with pytest.raises(SnapshotMismatch, match="ended before its last chunk"):
        r._install(r._snapshot_chunks(api_pb2.FollowMessage(snapshot=chunks[0]), iter(())))
    assert r.state is before


def test_a_core_still_loading_is_asked_again_at_the_shortest_backoff(follow) -> None:
    """A starting core refuses Follow until it has loaded its state; its workers must not back off to 2 s
    meanwhile (they served that much after the core was ready)."""
    from nameserver.replica import follower

    core = StandInCore()
    core.put("k", "v")
    core.log.ready = False
    waits: list[float] = []

    class Recorded(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if threading.current_thread().name == "replica-early":  # the follower's, not its watchdog's
                waits.append(timeout or 0.0)
            return super().wait(min(timeout or 0.0, 0.01))  # the test's clock: no real backoff

    addr, kw = follow(core)
    r = ReadReplica(addr, grpc.insecure_channel, name="early", **kw)
    r._stop = Recorded()
    r.start()
    try:
        wait_until(lambda: len(waits) >= 8)
        assert set(waits) == {follower.BACKOFF_MIN_S}, waits
        core.log.ready = True
        wait_until(at(r, core))
    finally:
        r.stop()


def test_a_core_whose_apply_stopped_is_asked_again_at_a_growing_backoff(follow) -> None:
    """Not the loading core's shortest backoff: a stopped apply answers the same until its node restarts,
    and 20 Follow calls a second per worker would be its only work."""
    from nameserver.replica import follower

    core = StandInCore()
    core.put("k", "v")
    core.log.ready = False
    core.not_ready_reason = lambda: "apply stopped: restore failed: corrupt snapshot snap-1-1.mdb"  # type: ignore[method-assign]
    waits: list[float] = []

    class Recorded(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if threading.current_thread().name == "replica-stopped":  # the follower's, not its watchdog's
                waits.append(timeout or 0.0)
            return super().wait(min(timeout or 0.0, 0.01))  # the test's clock: no real backoff

    addr, kw = follow(core)
    r = ReadReplica(addr, grpc.insecure_channel, name="stopped", **kw)
    r._stop = Recorded()
    r.start()
    try:
        wait_until(lambda: len(waits) >= 8)
        assert waits[:8] == sorted(waits[:8]) and waits[7] > follower.BACKOFF_MIN_S, waits
        assert r.core_stopped
    finally:
        r.stop()


def test_a_core_whose_apply_stopped_is_named_by_the_replica_until_it_feeds_it(follow, replicas) -> None:
    """docs/faults.md, finding 11: a worker opens its ports when its core refuses for good (its apply
    stopped), so that Admin.Status can say why; its replica's refusal names the core's reason."""
    core = StandInCore()
    core.put("k", "v")
    core.log.ready = False
    core.not_ready_reason = lambda: "apply stopped: restore failed: corrupt snapshot snap-1-1.mdb"  # type: ignore[method-assign]
    addr, kw = follow(core)
    r = replicas(addr, **kw)
    wait_until(lambda: r.core_stopped)
    assert r.core_stopped == "apply stopped: restore failed: corrupt snapshot snap-1-1.mdb"
    assert not r.ready and "corrupt snapshot snap-1-1.mdb" in r.not_ready_reason()
    core.not_ready_reason = lambda: "node is loading its snapshot or replaying its log"  # type: ignore[method-assign]
    wait_until(lambda: not r.core_stopped)  # still loading: not a reason to open the ports
    core.log.ready = True
    wait_until(at(r, core))
    assert not r.core_stopped


def test_a_core_that_stops_sending_is_unanswered_past_the_bound_and_a_refusal_is_an_answer(
        serve_log, tmp_path) -> None:
    """A worker's read of its core's liveness (ReadReplica.unanswered, nameserver/api/corehealth.py): its feed
    stalled, as a frozen core's is (the link open, nothing sent), is unanswered once past max_silence_s and
    answered again when it sends; a core refusing in its own words (still loading) answers, though the
    replica is not ready."""
    core = StandInCore()
    core.put("k", "v")
    frozen = threading.Event()
    feed_of = FollowFeed(core)  # type: ignore[arg-type]

    def messages(from_offset: int, is_active: Callable[[], bool]) -> Iterator[api_pb2.FollowMessage]:
        for msg in feed_of.messages(from_offset, is_active):
            while frozen.is_set() and is_active():
                time.sleep(0.01)
            yield msg

    feed = FeedServer(str(tmp_path / "feed.sock"), messages, 10.0)  # type: ignore[arg-type]
    feed.start()
    r = ReadReplica(serve_log(core), grpc.insecure_channel, name="liveness", max_silence_s=1.5,
                    feed=LocalFeed(feed.path, core.cfg.max_message_bytes))
    r.start()
    try:
        wait_until(at(r, core))
        assert r.unanswered() == 0.0
        frozen.set()
        time.sleep(2.0)  # no keepalive (one a second) for longer than the bound
        assert r.unanswered() > 1.5 and not r.ready
        frozen.clear()
        wait_until(lambda: r.unanswered() == 0.0 and r.ready)
        core.log.ready = False  # refuses a follow: "not ready: ..."
        call = r._call
        assert call is not None
        call.cancel()  # the stream cut (as the watchdog cuts one): the next ones are refused
        wait_until(lambda: not r.ready)  # no message for longer than the bound
        assert r.unanswered() == 0.0 and "not ready" in r.last_error  # but each refusal answered
    finally:
        r.stop()
        feed.stop()


def test_between_follow_calls_there_is_no_stream_to_move_or_cut(serve_log) -> None:
    """The running Follow call is forgotten when it ends: while the replica waits to reconnect, move_to has no
    stream to leave (it said it had, and left a move pending for a later stream), and the silence watchdog
    does not cut the ended call again, over the error that ended it."""
    refusing, feeding = StandInCore(), StandInCore()
    refusing.put("k", "v")
    feeding.put("k", "v")
    refusing.log.ready = False  # answers "not ready": the call ends, the replica goes on to the next voter
    first, second = serve_log(refusing), serve_log(feeding)
    in_gap, go_on = threading.Event(), threading.Event()

    class Held(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if threading.current_thread().name == "replica-gap":  # the follower's wait to reconnect
                in_gap.set()
                go_on.wait(10)
                return self.is_set()
            return super().wait(timeout)

    r = ReadReplica([first, second], grpc.insecure_channel, name="gap", max_silence_s=0.3)
    r._stop = Held()
    r.start()
    try:
        assert in_gap.wait(10)
        time.sleep(1.0)  # past max_silence_s: the watchdog ran over the gap
        assert r.last_error.startswith("UNAVAILABLE"), r.last_error
        assert r.target == second and not r.move_to(first, "a move with no stream to leave")
        go_on.set()
        wait_until(at(r, feeding))
        assert r.target == second
    finally:
        go_on.set()
        r.stop()


def test_a_replaced_state_is_freed_by_its_counts_though_its_load_froze_it() -> None:
    """A replica's loads are frozen out of the collector's walks (raftlog/applier.py frozen_load): the state a
    new load replaces, and a loaded one refused for its digest, must then go by reference counts alone, or
    never (a whole state, hundreds of MiB at a million records, left behind at each snapshot the core resends)."""
    import gc
    import weakref

    core = StandInCore()
    for i in range(10):
        core.put(f"k{i}", "v")
    r = ReadReplica("nowhere", grpc.insecure_channel, name="reloaded")
    items = [(k, v, ver, t) for k, v, ver, t in core.state.kv.items()]
    gc.disable()
    try:
        r.seed(core.state.offset, iter(items), core.state.digest_hex)
        seeded = weakref.ref(r.state)
        r.seed(core.state.offset, iter(items), core.state.digest_hex)
        assert seeded() is None, "the replaced state is still held"
        refused: list[weakref.ref] = []
        real_fresh = r._fresh_state

        def fresh() -> MetadataState:
            state = real_fresh()
            refused.append(weakref.ref(state))
            return state

        r._fresh_state = fresh  # type: ignore[method-assign]
        chunk = api_pb2.StateChunk(apply_offset=core.state.offset, digest="00" * 16)
        chunk.items.add(key="kv/ns/x", value=b"\x0a\x01y", version=1, type=0)
        with pytest.raises(SnapshotMismatch):
            r._install([chunk])
        assert refused and refused[0]() is None, "the refused state is still held"
    finally:
        gc.enable()
        gc.unfreeze()
