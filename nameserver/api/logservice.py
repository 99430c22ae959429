"""The Log gRPC service: read the metadata log (for export and the Spark pipeline) and dump the state.

ReadLog streams committed entries from this node's in-memory history ring (raftlog/history.py), in
bounded batches, from any node. Entries older than the ring fail OUT_OF_RANGE naming the oldest offset
kept: another node may keep more, and the node's archive (nameserver/ops/archive.py) holds the rest as
Parquet segments the pipeline reads directly. DumpState streams a consistent copy of the state, taken
under the state lock in O(keys) pointer copies, then sorted and chunked outside it. Follow feeds a read
replica (nameserver/replica): such a copy, then the entries applied after it, as they are applied.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Generator, Iterator

import grpc

from nameserver import headers, safetext
from nameserver.core.node import NameServerNode
from nameserver.pb import api_pb2, api_pb2_grpc
from raftlog.history import Compacted

log = logging.getLogger("nameserver.api.logservice")

DEFAULT_BATCH = 500
MAX_BATCH = 5000
DUMP_CHUNK_ITEMS = 1000
DUMP_CHUNK_BYTES = 1 << 20
WAIT_CAP_S = 30.0
MAX_REPLICA_NAME = 256  # a replica's address as listed by Status: bounded whatever the header says
FOLLOW_KEEPALIVE_S = 1.0  # an idle Follow stream sends the apply offset this often (the follower's lag)
# Initial metadata of ReadLog: the last offset the stream covers (to_offset, resolved) and the oldest kept.


class ReadReplicas:
    """The read replicas on other machines following this node now: one per open Follow stream that names
    its replica (headers.READ_REPLICA: its public gRPC address; a worker's stream names none). Nothing is
    configured: a replica is listed while its stream is open, and gone when it ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[object, str] = {}

    def opened(self, addr: str) -> object:
        token = object()
        with self._lock:
            self._open[token] = addr
        return token

    def closed(self, token: object) -> None:
        with self._lock:
            self._open.pop(token, None)

    def addresses(self) -> list[str]:
        with self._lock:
            return sorted(set(self._open.values()))


class LogService(api_pb2_grpc.LogServicer):
    def __init__(self, node: NameServerNode, replicas: ReadReplicas | None = None) -> None:
        self.node = node
        self.replicas = replicas or ReadReplicas()
        self.max_message_bytes = node.cfg.max_message_bytes
        self.max_followers = node.cfg.max_followers
        self._followers = 0
        self._followers_lock = threading.Lock()

    def _check_ready(self, context: grpc.ServicerContext) -> None:
        if not self.node.log.ready:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"not ready: {self.node.not_ready_reason()}")

    def _wait_applied(self, context: grpc.ServicerContext, offset: int, field: str, margin_s: float = 0.0) -> None:
        """Wait (within the call's deadline less `margin_s`, at most WAIT_CAP_S) for this node to apply
        `offset`; else UNAVAILABLE with the node's apply offset in the trailer."""
        rlog = self.node.log
        left = context.time_remaining()
        wait_s = WAIT_CAP_S if left is None else max(0.0, min(left - margin_s, WAIT_CAP_S))
        if not rlog.wait_applied(offset, wait_s, context.is_active):
            context.set_trailing_metadata(((headers.APPLY_OFFSET, str(rlog.apply_offset)),))
            context.abort(grpc.StatusCode.UNAVAILABLE,
                          f"node applied up to {rlog.apply_offset}, below {field} {offset}")

    def ReadLog(self, request: api_pb2.ReadLogRequest, context: grpc.ServicerContext
                ) -> Iterator[api_pb2.LogBatch]:
        for name in ("from_offset", "to_offset", "max_batch"):
            if getattr(request, name) < 0:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{name}: must be >= 0")
        if request.to_offset and request.to_offset < request.from_offset:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "to_offset: must be 0 or >= from_offset")
        self._check_ready(context)
        rlog = self.node.log
        start = max(request.from_offset, 1)
        to = request.to_offset or self.node.log.commit_offset
        self._wait_applied(context, to, "to_offset")
        limit = min(request.max_batch or DEFAULT_BATCH, MAX_BATCH)
        context.send_initial_metadata(((headers.LOG_TO_OFFSET, str(to)),
                                       (headers.LOG_FIRST_KEPT, str(rlog.history.first_kept))))
        cursor = start - 1
        while cursor < to and context.is_active():
            try:
                entries = rlog.history.after(cursor, limit=limit, upto=to)
            except Compacted as exc:
                context.abort(grpc.StatusCode.OUT_OF_RANGE,
                              f"offset {exc.requested} is no longer kept on this node (oldest kept: "
                              f"{exc.first_kept}); try another node, or read the node's archive")
            if not entries:
                return  # everything <= to is applied: the rest of the range holds no entries
            batch = api_pb2.LogBatch()
            size = 0
            for e in entries:
                if batch.entries and size + len(e.data) > self.max_message_bytes // 2:
                    break
                batch.entries.add(offset=e.offset, term=e.term, entry=e.data)
                size += len(e.data) + 32
                cursor = e.offset
            yield batch

    def DigestAt(self, request: api_pb2.DigestAtRequest, context: grpc.ServicerContext
                 ) -> api_pb2.DigestAtReply:
        """The digest right after `offset`: an exported log's last offset is a cut every live node can
        be compared at, however far it has moved on since (idle no-ops move it twice a second)."""
        if request.offset < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "offset: must be >= 0")
        self._check_ready(context)
        rlog = self.node.log
        # answer before the caller's deadline, so it learns how far behind this node is
        self._wait_applied(context, request.offset, "offset", margin_s=0.5)
        digest, first = self.node.inspect(lambda s: (s.kv.digest_at(request.offset), s.kv.first_digest_offset))
        if digest is None:
            context.abort(grpc.StatusCode.OUT_OF_RANGE,
                          f"offset {request.offset} is older than this node's digest history (oldest: {first}); "
                          "audit a newer export, or compare a state dump")
        return api_pb2.DigestAtReply(offset=request.offset, digest=digest, apply_offset=rlog.apply_offset,
                                     first_kept=first)

    def DumpState(self, request: api_pb2.DumpStateRequest, context: grpc.ServicerContext
                  ) -> Iterator[api_pb2.StateChunk]:
        self._check_ready(context)
        for chunk in self._state_chunks():
            yield chunk
            if not context.is_active():
                return

    def _state_chunks(self) -> Iterator[api_pb2.StateChunk]:
        """A consistent copy of the state, sorted and chunked: always at least one chunk, so an empty
        state still reports its offset and digest."""
        # under the state lock: values are immutable bytes, so this is pointer copies
        frozen, offset, digest = self.node.inspect(lambda s: (s.kv.freeze(), s.kv.offset, s.kv.digest_hex))
        chunk = api_pb2.StateChunk(apply_offset=offset, digest=digest)
        size = 0
        for key in sorted(frozen):
            value, version, rtype = frozen[key]
            chunk.items.add(key=key, value=value, version=version, type=rtype)
            size += len(key) + len(value) + 24
            if len(chunk.items) >= DUMP_CHUNK_ITEMS or size >= DUMP_CHUNK_BYTES:
                yield chunk
                chunk = api_pb2.StateChunk(apply_offset=offset, digest=digest)
                size = 0
        yield chunk

    def Follow(self, request: api_pb2.FollowRequest, context: grpc.ServicerContext
               ) -> Iterator[api_pb2.FollowMessage]:
        """A read replica's feed (nameserver/replica/replica.py): a snapshot when the follower has
        nothing or is older than this node's history, then the entries after its offset as they are
        applied (woken by the apply offset, not polling), a keepalive every FOLLOW_KEEPALIVE_S when idle.

        Nothing is buffered per stream but the message being sent: entries are read from the history
        ring (raftlog/history.py) that ReadLog serves too. A follower that stops reading is cut off by
        the call guard's progress timeout (limits.grpc_progress_timeout_ms) and resumes from its offset;
        one that fell behind the ring is sent a snapshot again, and so is every follower once this node
        restored a snapshot (its state replaced, whatever the offsets)."""
        if request.from_offset < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "from_offset: must be >= 0")
        self._check_ready(context)
        with self._followers_lock:
            full = self._followers >= self.max_followers
            self._followers += not full
        if full:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"limits.max_followers: this node already feeds "
                          f"{self.max_followers} read replicas; follow another node")
        named = next((v for k, v in context.invocation_metadata() if k == headers.READ_REPLICA), "")
        listed = self.replicas.opened(safetext.shown(named, MAX_REPLICA_NAME)) if named else None
        try:
            yield from self._follow(request.from_offset, context)
        finally:
            if listed is not None:
                self.replicas.closed(listed)
            with self._followers_lock:
                self._followers -= 1

    def _follow(self, from_offset: int, context: grpc.ServicerContext) -> Iterator[api_pb2.FollowMessage]:
        rlog = self.node.log
        cursor = from_offset
        # This node's state as the follower holds it is the one since this many restores. A restore replaces
        # the state whatever its offset: one at or below the cursor leaves the history past the cursor intact
        # (no Compacted), so the follower would keep the state it had, never the one restored (finding 13).
        restores = rlog.restores
        if cursor == 0 or cursor < rlog.history.first_kept - 1:
            cursor = yield from self._follow_snapshot(rlog.apply_offset)
        while context.is_active():
            if rlog.apply_error:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"not ready: {self.node.not_ready_reason()}")
            rlog.wait_applied(cursor + 1, FOLLOW_KEEPALIVE_S, context.is_active)
            applied = rlog.apply_offset  # before reading the history: it holds every entry up to here
            try:
                entries = rlog.history.after(cursor, limit=MAX_BATCH, upto=applied)
            except Compacted:
                entries = None
            # Read after the history: entries read from a history a restore reset are never sent.
            if entries is None or rlog.restores != restores:
                restores = rlog.restores  # before the state is read: a restore after it is seen next time
                cursor = yield from self._follow_snapshot(applied)
                continue
            msg = api_pb2.FollowMessage(core_offset=applied)
            through = max(cursor, applied)
            size = 0
            for i, e in enumerate(entries):
                if msg.entries and size + len(e.data) > self.max_message_bytes // 2:
                    through = entries[i - 1].offset  # the rest next time
                    break
                msg.entries.add(offset=e.offset, term=e.term, entry=e.data)
                size += len(e.data) + 32
            else:
                if len(entries) == MAX_BATCH:
                    through = entries[-1].offset
            msg.through_offset = cursor = through
            yield msg

    def _follow_snapshot(self, core_offset: int) -> Generator[api_pb2.FollowMessage, None, int]:
        """Send the state as it is now; returns its offset (the follower's new cursor)."""
        offset = 0
        last: api_pb2.FollowMessage | None = None
        for chunk in self._state_chunks():
            if last is not None:
                yield last
            last = api_pb2.FollowMessage(snapshot=chunk, core_offset=core_offset)
            offset = chunk.apply_offset
        assert last is not None  # _state_chunks yields at least one chunk
        last.snapshot_done = True
        last.through_offset = offset
        yield last
        return offset
