"""The real gRPC servicers over an in-memory single node: requests in, replies or statuses out, no sockets.

LocalNode gives NameServerService what it asks of a NameServerNode (reads, leader writes, heartbeats)
with a MetadataState and no Raft: a write is translated and applied at once, and its entry is kept
so that tests can replay the log. FakeContext turns `context.abort` into an exception. Any other
exception escaping a servicer method would reach a client as UNKNOWN: that is a bug.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from nameserver.api.service import NameServerService
from nameserver.config import NodeConfig
from nameserver.core.forwarder import LeaderForwarder
from nameserver.core.liveness import LivenessTable
from nameserver.core.node import OffsetNotReached, WriteResult
from nameserver.pb import api_pb2
from nameserver.state import MetadataState, Translation
from raftlog.pb import entry_pb2


class Aborted(Exception):  # noqa: N818 - mirrors grpc's abort
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


@dataclass
class FakeContext:
    metadata: list[tuple[str, str]] = field(default_factory=list)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)

    def invocation_metadata(self) -> list[tuple[str, str]]:
        return self.metadata

    def time_remaining(self) -> float:
        return 1.0

    def set_trailing_metadata(self, md: Any) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def cancel(self) -> None:  # a stalled registration stream's timer (never fires here: streams are lists)
        pass


class _Log:
    """The part of ReplicatedLog the service reads: always the ready leader."""

    ready = True

    def __init__(self, node: LocalNode) -> None:
        self._node = node

    def is_leader(self) -> bool:
        return True

    @property
    def apply_offset(self) -> int:
        return self._node.state.offset


class LocalNode:
    """A single in-memory leader: every write is applied immediately and its entry recorded."""

    def __init__(self) -> None:
        self.cfg = NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir="", members=[])
        self.state = MetadataState()
        self.lock = threading.RLock()
        self.log = _Log(self)
        self.liveness = LivenessTable()
        self.entries: list[tuple[int, bytes]] = []  # (offset, serialized Entry): the log, for replays
        # the real serve-or-forward path, which serves every write here (this node always leads)
        self.forwarder = LeaderForwarder(self.cfg, lambda: self.cfg.raft_addr, self.log.is_leader, lambda _: None)

    def read(self, fn: Callable[[MetadataState], Any], min_offset: int, timeout: float,
             alive: Callable[[], bool] | None = None) -> tuple[Any, int]:
        if min_offset > self.state.offset:
            raise OffsetNotReached(self.state.offset, min_offset)
        return fn(self.state), self.state.offset

    def read_route(self, key: Any, compute: Callable[[MetadataState], Any], min_offset: int, timeout: float,
                   alive: Callable[[], bool] | None = None) -> tuple[Any, int]:
        return self.read(compute, min_offset, timeout, alive)  # no route cache here: every read computes

    def inspect(self, fn: Callable[[MetadataState], Any]) -> Any:
        return fn(self.state)

    def write(self, translate_fn: Callable[[MetadataState], Translation], timeout: float, client: Any = None,
              reply_of: Any = None, topics: int = 0, wanted: Callable[[], None] | None = None) -> WriteResult:
        tr = translate_fn(self.state)
        if wanted is not None and tr.batch.records:
            wanted()  # as the real node: checked just before the proposal
        if not tr.batch.records:
            return WriteResult(self.state.offset, 0, tr)
        offset = self.state.offset + 1
        entry = entry_pb2.Entry(batches=[tr.batch])
        result = self.state.apply_entry(offset, entry)[0]
        # Nothing runs concurrently here, so a translation's preconditions must hold when applied.
        assert result.applied, f"fresh translation refused at apply: {result}"
        self.entries.append((offset, entry.SerializeToString(deterministic=True)))
        return WriteResult(offset, len(tr.batch.records), tr)

    def catch_up(self, offset: int, timeout: float, alive: Callable[[], bool] | None = None) -> bool:
        return offset <= self.state.offset  # writes apply at once here

    def forget_broker(self, addr: str) -> None:
        self.liveness.forget(addr)

    def heartbeat(self, beats: Any, versions: dict | None = None) -> list[str]:
        return self.state.data_versions((b.broker_addr for b in beats), versions)

    def linearizable_index(self, timeout: float) -> int:
        # As the real node: a read index costs a barrier (an empty batch) through the log.
        offset = self.state.offset + 1
        entry = entry_pb2.Entry(batches=[entry_pb2.Batch(request_id=f"barrier-{offset}")])
        self.state.apply_entry(offset, entry)
        self.entries.append((offset, entry.SerializeToString(deterministic=True)))
        return offset


@dataclass
class Outcome:
    """What a client would see: a reply, or a status code with details."""

    reply: Message | None
    code: grpc.StatusCode
    details: str = ""


# Unary NameServer methods and RegisterBrokerStream, by request type; Watch and ReadIndex need a log.
SKIPPED = {"Watch": "needs the applied-entry feed of a real node (covered live)",
           "ReadIndex": "needs Raft (covered live)"}


def methods() -> dict[str, tuple[type[Message], bool]]:
    """NameServer method name -> (request type, client streaming), from the service descriptor."""
    svc = api_pb2.DESCRIPTOR.services_by_name["NameServer"]
    out = {}
    for m in svc.methods:
        if m.name not in SKIPPED:
            out[m.name] = (GetMessageClass(m.input_type), m.client_streaming)
    return out


class Servicer:
    """NameServerService over a LocalNode."""

    def __init__(self) -> None:
        self.node = LocalNode()
        self.service = NameServerService(self.node)  # type: ignore[arg-type]  # duck-typed node

    def call(self, method: str, request: Message | list[Message]) -> Outcome:
        """Call like gRPC would; an exception other than an abort propagates (it is a bug)."""
        fn = getattr(self.service, method)
        arg: Any = iter(request) if isinstance(request, list) else request
        try:
            reply = fn(arg, FakeContext())
        except Aborted as exc:
            return Outcome(None, exc.code, exc.details)
        return Outcome(reply, grpc.StatusCode.OK)


def replay(entries: list[tuple[int, bytes]]) -> MetadataState:
    """A fresh state that applied these entries (as a follower would)."""
    state = MetadataState()
    for offset, data in entries:
        state.apply_entry(offset, entry_pb2.Entry.FromString(data))
    return state

