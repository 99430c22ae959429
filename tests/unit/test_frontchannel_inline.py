"""A worker's end of the Go front end's socket (nameserver/api/frontchannel.py), spoken to directly over a real
Unix socket in this process: an eventual read whose request comes in the frame after its call record (as a
lone caller's mostly does) is still answered on the link's own thread when that frame is already waiting,
not handed to the pool (a thread wake and a GIL hand-over a call). And what the worker lets the front end's
reply cache keep: only an inline call's OK answer of a reusable method, stamped with the generation read
before it ran; each move of the generation said on the link before anything it voids could be kept
(docs/architecture.md, "The Go front end's reply cache")."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from nameserver import framing
from nameserver.api.frontchannel import (
    CALL,
    GENERATION,
    HALF_CLOSE,
    MESSAGE,
    NO_CALL,
    REUSABLE,
    STATUS,
    UNARY,
    FrontServer,
    Generations,
    Inline,
    Reusable,
    socket_path,
)
from nameserver.config import NodeConfig
from nameserver.core.nowait import WouldBlock, waiting_allowed
from nameserver.pb import api_pb2
from nameserver.replica import ReadReplica
from nameserver.state import MetadataState, translate
from nameserver.state.metadata import ORDER_TOPIC_CONFIG
from nameserver.state.shards import moves
from nameserver.worker import _inline_reads, _reusable_reads, wanted_offset
from raftlog.codec import encode_entry
from raftlog.pb import entry_pb2
from tests.cluster import register_request

READ, BUSY, FAILS = "/t.T/Read", "/t.T/Busy", "/t.T/Fails"
CALLER = json.dumps({"peer": "ipv4:127.0.0.1:1", "auth": {}}).encode()


class Reads(grpc.GenericRpcHandler):
    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if handler_call_details.method == BUSY:
            return grpc.unary_unary_rpc_method_handler(busy)
        if handler_call_details.method == FAILS:
            return grpc.unary_unary_rpc_method_handler(fails)
        if handler_call_details.method != READ:
            return None
        return grpc.unary_unary_rpc_method_handler(lambda request, context: threading.current_thread().name.encode())


def busy(request: bytes, context: grpc.ServicerContext) -> bytes:
    """A read that would wait (an offset the replica has not applied): it may not on the link's thread."""
    if not waiting_allowed():
        raise WouldBlock("the offset is not applied yet")
    return threading.current_thread().name.encode() + b" " + request


def fails(request: bytes, context: grpc.ServicerContext) -> bytes:
    context.abort(grpc.StatusCode.NOT_FOUND, "no such topic")
    raise AssertionError("abort raises")


def _started(data_dir: str, inline: Inline, reusable: Reusable | None = None, **settings: Any) -> FrontServer:
    """A worker's front channel server at `data_dir`'s socket 0 (1 worker process, 4 threads, `settings` on top),
    serving Reads, started."""
    cfg = replace(NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:0", data_dir=data_dir, members=[]),
                  worker_processes=1, workers=4, **settings)
    server = FrontServer(cfg, socket_path(data_dir, 0), [], inline, reusable)
    server.add_generic_rpc_handlers((Reads(),))
    server.start()
    return server


@pytest.fixture
def link(tmp_path: Any) -> Iterator[socket.socket]:
    data_dir = str(tmp_path)
    server = _started(data_dir, Inline(frozenset({READ, BUSY}), lambda method, request: True))
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(socket_path(data_dir, 0))
    try:
        yield sock
    finally:
        sock.close()
        server.stop()


def _answer(sock: socket.socket) -> list[bytes]:
    body = framing.read_frame(sock, 1 << 20)
    assert body is not None
    (record,) = framing.unpack(body)
    return record


def test_a_request_in_the_next_frame_already_waiting_is_answered_on_the_link_thread(link: socket.socket) -> None:
    key = (1).to_bytes(8, "big")
    call = framing.pack([[CALL, key, b"-1", READ.encode(), CALLER]])
    request = framing.pack([[MESSAGE, key, b"x"], [HALF_CLOSE, key]])
    link.sendall(call + request)  # two frames, both waiting when the worker reads the first
    kind, got, thread = _answer(link)[:3]
    assert (kind, got) == (UNARY, key)
    assert thread.decode().startswith("front-channel"), thread


def test_a_request_in_the_same_frame_is_answered_on_the_link_thread_and_a_late_one_by_the_pool(
        link: socket.socket) -> None:
    one, two = (1).to_bytes(8, "big"), (2).to_bytes(8, "big")
    link.sendall(framing.pack([[CALL, one, b"-1", READ.encode(), CALLER], [MESSAGE, one, b"x"], [HALF_CLOSE, one]]))
    assert _answer(link)[2].decode().startswith("front-channel")
    link.sendall(framing.pack([[CALL, two, b"-1", READ.encode(), CALLER]]))  # nothing else waits: the pool's
    threading.Event().wait(0.2)
    link.sendall(framing.pack([[MESSAGE, two, b"x"], [HALF_CLOSE, two]]))
    assert _answer(link)[2].decode().startswith("grpc")


def test_a_call_with_more_than_one_request_message_is_never_inline(link: socket.socket) -> None:
    """A unary method sent A, B, C (a client that is not grpcio's) is the pool's: the handler reads A, and
    whether C would not wait says nothing of A."""
    key = (1).to_bytes(8, "big")
    link.sendall(framing.pack([[CALL, key, b"-1", READ.encode(), CALLER], [MESSAGE, key, b"a"], [MESSAGE, key, b"b"],
                               [MESSAGE, key, b"c"], [HALF_CLOSE, key]]))
    assert _answer(link)[2].decode().startswith("grpc")


def test_an_inline_call_that_would_wait_is_handed_to_the_pool(link: socket.socket) -> None:
    """The backstop: a read the inline check let through that would still wait raises WouldBlock on the
    link's thread (nothing answered) and is answered by the pool, with its request."""
    key = (1).to_bytes(8, "big")
    link.sendall(framing.pack([[CALL, key, b"-1", BUSY.encode(), CALLER], [MESSAGE, key, b"r"], [HALF_CLOSE, key]]))
    kind, got, reply = _answer(link)[:3]
    assert (kind, got) == (UNARY, key)
    assert reply.startswith(b"grpc") and reply.endswith(b" r"), reply


def test_the_offset_an_inline_read_waits_for_counts_every_offset_it_names() -> None:
    route, cluster = "/rip18.nameserver.v1.NameServer/GetRoute", "/rip18.nameserver.v1.NameServer/GetClusterInfo"
    assert wanted_offset(route, api_pb2.GetRouteRequest(topic="t", min_offsets=[9]).SerializeToString()) == 9
    assert wanted_offset(route, api_pb2.GetRouteRequest(min_offset=3, min_offsets=[2]).SerializeToString()) == 3
    assert wanted_offset(cluster, api_pb2.GetClusterInfoRequest(min_offsets=[0, 7]).SerializeToString()) == 7
    assert wanted_offset(route, b"") == 0
    assert wanted_offset(route, b"\xff\xff") is None


def test_a_call_held_when_its_link_ends_gives_its_concurrency_slot_back(tmp_path: Any) -> None:
    """A call whose request never came before the front end's link ended never runs: its slot is the
    next link's (else enough lost links leave the worker answering "Concurrent RPC limit exceeded")."""
    data_dir = str(tmp_path)
    server = _started(data_dir, Inline(frozenset({READ}), lambda method, request: True), grpc_max_concurrent_rpcs=1)
    try:
        for i in range(3):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as lost:
                lost.connect(socket_path(data_dir, 0))
                # the call waits for the next frame (its request, likely), which ends the link: past any bound
                lost.sendall(framing.pack([[CALL, (i).to_bytes(8, "big"), b"-1", READ.encode(), CALLER]])
                             + b"\xff\xff\xff\xff")
                threading.Event().wait(0.1)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as link:
            link.settimeout(5)
            link.connect(socket_path(data_dir, 0))
            key = (9).to_bytes(8, "big")
            deadline = time.monotonic() + 5
            while True:  # the lost links' ends are seen on their own threads: a moment later at most
                link.sendall(framing.pack([[CALL, key, b"-1", READ.encode(), CALLER], [MESSAGE, key, b"x"],
                                           [HALF_CLOSE, key]]))
                answer = _answer(link)
                if answer[0] == UNARY or time.monotonic() > deadline:
                    break
                threading.Event().wait(0.05)
            assert answer[0] == UNARY, answer
    finally:
        server.stop()


def test_only_an_inline_ok_answer_of_a_reusable_method_is_marked_reusable(tmp_path: Any) -> None:
    data_dir = str(tmp_path)
    generations = Generations()
    inline_here = {READ: True, BUSY: True, FAILS: True}
    server = _started(data_dir, Inline(frozenset({READ, BUSY, FAILS}), lambda method, request: inline_here[method]),
                      Reusable(frozenset({READ, BUSY, FAILS}), generations))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as link:
            link.settimeout(5)
            link.connect(socket_path(data_dir, 0))
            assert _answer(link) == [GENERATION, NO_CALL, b"0"]  # the link's first record

            def call(i: int, method: str) -> list[bytes]:
                key = i.to_bytes(8, "big")
                link.sendall(framing.pack([[CALL, key, b"-1", method.encode(), CALLER], [MESSAGE, key, b"x"],
                                           [HALF_CLOSE, key]]))
                answer = _answer(link)
                assert answer[1] == key
                return answer

            kind, _, generation, reply = call(1, READ)[:4]
            assert (kind, generation) == (REUSABLE, b"0") and reply.startswith(b"front-channel")
            generations.moved(17)  # the replica published an offset: said at once
            assert _answer(link) == [GENERATION, NO_CALL, b"1"]
            assert call(2, READ)[:3] == [REUSABLE, (2).to_bytes(8, "big"), b"1"]
            assert call(3, BUSY)[0] == UNARY  # it would have waited: answered by the pool, never kept
            assert call(4, FAILS)[0] == STATUS  # an error: never kept
            inline_here[READ] = False  # an offset past the replica's: the pool's
            assert call(5, READ)[0] == UNARY
    finally:
        server.stop()


def _records(sock: socket.socket, n: int) -> list[list[bytes]]:
    """The next `n` records from the worker, however many frames they came in."""
    out: list[list[bytes]] = []
    while len(out) < n:
        body = framing.read_frame(sock, 1 << 20)
        assert body is not None
        out += framing.unpack(body)
    assert len(out) == n, out
    return out


def test_a_move_is_said_at_once_only_on_a_link_that_may_keep_a_reply_of_the_generation_before(tmp_path: Any) -> None:
    """A front end that was sent no reusable reply of the generation it was told last keeps nothing a move
    voids: the move is said before that link's next reusable reply instead (no wake of the front end per
    write); once it was sent one, the next move is said at once."""
    data_dir = str(tmp_path)
    generations = Generations()
    server = _started(data_dir, Inline(frozenset({READ}), lambda method, request: True),
                      Reusable(frozenset({READ}), generations))
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as link:
            link.settimeout(5)
            link.connect(socket_path(data_dir, 0))
            assert _answer(link) == [GENERATION, NO_CALL, b"0"]
            generations.moved()
            generations.moved()  # nothing reusable went on the link: neither is said now
            link.settimeout(0.3)
            with pytest.raises(TimeoutError):
                link.recv(1)
            link.settimeout(5)
            key = (1).to_bytes(8, "big")
            link.sendall(framing.pack([[CALL, key, b"-1", READ.encode(), CALLER], [MESSAGE, key, b"x"],
                                       [HALF_CLOSE, key]]))
            told, reply = _records(link, 2)  # the generation first, then the reply read at it
            assert told == [GENERATION, NO_CALL, b"2"]
            assert reply[:3] == [REUSABLE, key, b"2"]
            generations.moved()  # the front end may keep that reply: said at once
            assert _answer(link) == [GENERATION, NO_CALL, b"3"]
            generations.moved()  # nothing kept of 3
            link.sendall(framing.pack([[CALL, key, b"-1", READ.encode(), CALLER], [MESSAGE, key, b"x"],
                                       [HALF_CLOSE, key]]))
            assert [r[:3] for r in _records(link, 2)] == [[GENERATION, NO_CALL, b"4"], [REUSABLE, key, b"4"]]
    finally:
        server.stop()


def test_the_generation_moves_with_a_publish_that_moved_the_token_and_when_the_replica_turns_unready() -> None:
    generations, listeners, ready, token = Generations(), [], [True], [(0, 1)]
    generations.follow([listeners], lambda: ready[0], lambda: token[0])
    try:
        for listener in listeners:  # a replica's publish listeners: an offset published, nothing read changed
            listener(5)
        assert generations.value == 0
        token[0] = (0, 2)
        for listener in listeners:
            listener(6)
        assert generations.value == 1
        ready[0] = False  # its reads are refused from now on: nothing kept may answer for it
        deadline = time.monotonic() + 5
        while generations.value == 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert generations.value == 2
    finally:
        generations.stopped.set()


def test_a_workers_generation_moves_with_what_its_kept_replies_read_not_with_every_apply() -> None:
    """The worker's own wiring (worker._reusable_reads) over a real replica: a no-op, a member record and a
    queue binding and a KV put in another namespace (none read by GetRoute, GetClusterInfo or GetTopicList)
    keep the generation; a topic's registration, a KV put of the order-topic config and a snapshot installed
    move it."""
    core = StandInCore()
    core.put("ns", "k", "v1")
    replica = _stand_in_replica("core")
    # ready before the readiness watch starts, and for as long as the test runs on a loaded machine: a watch
    # that saw it not ready yet, or silent past its bound, moved the generation too (a flake at load 70)
    replica.max_silence_s = 3600.0
    replica._install([_snapshot_of(core.state)])
    replica._heard = time.monotonic()
    reusable = _reusable_reads([replica])
    generations = reusable.generations
    try:
        assert generations.value == 0

        def apply(*translations: Any) -> int:
            return _moves(generations, core, replica, *translations)

        assert apply() == 0  # an idle no-op
        assert apply(translate.put_member(core.state, "127.0.0.1:9", "127.0.0.1:10")) == 0
        assert apply(translate.bind_queue(core.state, "T", 0, "owner", 0)) == 0
        registration = register_request("C", "b1", "10.0.0.1:1", ["T"])
        assert apply(translate.register_broker(core.state, registration, 30000)) == 1
        assert apply() == 0
        assert apply(translate.put_kv(core.state, "other", "k", "v")) == 0  # a namespace no route reads
        assert apply(translate.put_kv(core.state, ORDER_TOPIC_CONFIG, "T", "b1:4")) == 1  # a route reads it
        replica._install([_snapshot_of(core.state)])  # the same state again: a snapshot still moves it
        assert generations.value == 3
    finally:
        generations.stopped.set()


def test_a_sharded_workers_generation_covers_every_groups_replica() -> None:
    """With two groups (a merged GetRoute, GetClusterInfo or GetTopicList reads both replicas) the worker's
    generation moves with what any group's kept replies read: group 0's directory record (shard/), a
    registration of a group-1 set and a changed one, group 1's snapshot, group 1's replica turning unready;
    an idle no-op in either group, a liveness-only re-registration in group 1, a member record in group 0
    keep it."""
    cores = [StandInCore(), StandInCore()]
    replicas = [_stand_in_replica(f"core-g{group}") for group in range(2)]
    for core, replica in zip(cores, replicas, strict=True):  # ready before the readiness watch starts (above)
        replica.max_silence_s = 3600.0
        replica._install([_snapshot_of(core.state)])
        replica._heard = time.monotonic()  # as a stream's message does: ready (no stream here)
    generations = _reusable_reads(replicas).generations
    try:
        assert all(replica.ready for replica in replicas)
        assert generations.value == 0

        def apply(group: int, *translations: Any) -> int:
            return _moves(generations, cores[group], replicas[group], *translations)

        assert apply(0) == 0 and apply(1) == 0  # idle no-ops
        assert apply(0, moves.pin_set(cores[0].state, "b1", 1, 2)) == 1  # the directory: b1 is group 1's
        registration = register_request("C", "b1", "10.0.0.1:1", ["T"])
        assert apply(1, translate.register_broker(cores[1].state, registration, 30000)) == 1
        assert apply(1) == 0 and apply(0) == 0
        assert apply(1, translate.register_broker(cores[1].state, registration, 30000)) == 0  # its liveness only
        assert apply(0, translate.put_member(cores[0].state, "127.0.0.1:9", "127.0.0.1:10")) == 0
        changed = register_request("C", "b1", "10.0.0.1:1", ["T", "U"])
        assert apply(1, translate.register_broker(cores[1].state, changed, 30000)) == 1
        before = generations.value
        replicas[1]._install([_snapshot_of(cores[1].state)])  # the same state again: a snapshot still moves it
        assert generations.value == before + 1
        replicas[1].failed = "stand-in failure"  # group 1's reads are refused from now on: so is every merged one
        deadline = time.monotonic() + 5
        while generations.value == before + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert generations.value == before + 2
    finally:
        generations.stopped.set()


def test_a_sharded_workers_read_runs_inline_only_with_every_group_at_its_offset() -> None:
    """A request's offset vector (min_offset: group 0's; min_offsets[k]: group k's) runs on the link's thread,
    where its reply may be kept, only when each group's replica has applied its entry."""
    cores = [StandInCore(), StandInCore()]
    replicas = [_stand_in_replica(f"core-g{group}") for group in range(2)]
    for core, replica in zip(cores, replicas, strict=True):
        core.put("ns", "k", "v")
        core.put("ns", "k", "w")
        replica._install([_snapshot_of(core.state)])
    replicas[1]._apply(api_pb2.FollowMessage(through_offset=5))
    assert (replicas[0].offset, replicas[1].offset) == (2, 5)
    here = _inline_reads(replicas[0], SimpleNamespace(replicas=replicas)).here  # type: ignore[arg-type]
    route = f"/{api_pb2.DESCRIPTOR.services_by_name['NameServer'].full_name}/GetRoute"

    def inline(**offsets: Any) -> bool:
        return here(route, api_pb2.GetRouteRequest(topic="T", **offsets).SerializeToString())

    assert inline()
    assert inline(min_offset=2) and inline(min_offsets=[2, 5]) and inline(min_offset=1, min_offsets=[0, 5])
    assert not inline(min_offset=3)  # group 0 is at 2
    assert not inline(min_offsets=[0, 6])  # group 1 is at 5
    assert not inline(min_offsets=[5])  # group 0's entry: group 0 is at 2
    assert not inline(min_offsets=[0, 0, 1])  # more entries than groups: the pool answers the error


def _moves(generations: Generations, core: StandInCore, replica: ReadReplica, *translations: Any) -> int:
    """How often the generation moved while `replica` applied `translations` (written by `core`) and an idle
    no-op after them, in one message."""
    before = generations.value
    entries = [api_pb2.LogEntry(offset=core.write(t), term=1, entry=core.entries[-1]) for t in translations]
    replica._apply(api_pb2.FollowMessage(entries=entries, through_offset=core.offset + 1))
    core.offset += 1  # the no-op the message's through_offset says
    assert replica.offset == core.offset
    return generations.value - before


def _stand_in_replica(name: str) -> ReadReplica:
    """A replica fed by hand (no stream): it counts as heard from for as long as a test runs."""
    return ReadReplica(name, grpc.insecure_channel, max_silence_s=3600)


class StandInCore:
    """A core's state, written through the same MetadataState code; each entry's bytes kept for the feed."""

    def __init__(self) -> None:
        self.state = MetadataState()
        self.offset = 0
        self.entries: list[bytes] = []

    def write(self, translation: translate.Translation) -> int:
        self.offset += 1
        entry = entry_pb2.Entry(term=1, batches=[translation.batch])
        self.state.apply_entry(self.offset, entry)
        self.entries.append(encode_entry(entry))
        return self.offset

    def put(self, namespace: str, key: str, value: str) -> int:
        return self.write(translate.put_kv(self.state, namespace, key, value))


def _snapshot_of(state: MetadataState) -> api_pb2.StateChunk:
    chunk = api_pb2.StateChunk(apply_offset=state.kv.offset, digest=state.digest_hex)
    for key, value, version, rtype in state.kv.items():
        chunk.items.add(key=key, value=value, version=version, type=rtype)
    return chunk
