"""The Log gRPC service: read the metadata log (for export and the Spark pipeline) and dump the state.

ReadLog streams committed entries from this node's in-memory history ring (raftlog/history.py), in
bounded batches, from any node. Entries older than the ring fail OUT_OF_RANGE naming the oldest offset
kept: another node may keep more, and the node's archive (nameserver/ops/archive.py) holds the rest as
Parquet segments the pipeline reads directly. DumpState streams a consistent copy of the state, taken
under the state lock in O(keys) pointer copies, then sorted and chunked outside it. Follow feeds a read
replica (nameserver/replica): such a copy, then the entries applied after it, as they are applied
(nameserver/api/follow.py, which a worker's Unix feed serves too).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import grpc

from nameserver import headers, safetext
from nameserver.api.follow import MAX_BATCH, FollowFeed, state_chunks
from nameserver.core.node import NameServerNode
from nameserver.localfeed import FollowRefused
from nameserver.pb import api_pb2, api_pb2_grpc
from raftlog.history import Compacted

log = logging.getLogger("nameserver.api.logservice")

DEFAULT_BATCH = 500
WAIT_CAP_S = 30.0
MAX_REPLICA_NAME = 256  # a replica's address as listed by Status: bounded whatever the header says
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
    def __init__(self, node: NameServerNode, replicas: ReadReplicas | None = None,
                 feed: FollowFeed | None = None) -> None:
        """`feed`: the node's followers' feed, shared with its workers' Unix feed (one followers' bound)."""
        self.node = node
        self.replicas = replicas or ReadReplicas()
        self.max_message_bytes = node.cfg.max_message_bytes
        self.feed = feed or FollowFeed(node)

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
        for chunk in state_chunks(self.node):
            yield chunk
            if not context.is_active():
                return

    def Follow(self, request: api_pb2.FollowRequest, context: grpc.ServicerContext
               ) -> Iterator[api_pb2.FollowMessage]:
        """A read replica's feed (nameserver/api/follow.py: the messages; a worker's replica takes the same
        over its Unix feed, nameserver/localfeed.py). A follower that stops reading is cut off by the call
        guard's progress timeout (limits.grpc_progress_timeout_ms) and resumes from its offset."""
        named = next((v for k, v in context.invocation_metadata() if k == headers.READ_REPLICA), "")
        listed = self.replicas.opened(safetext.shown(named, MAX_REPLICA_NAME)) if named else None
        try:
            yield from self.feed.messages(request.from_offset, context.is_active)
        except FollowRefused as exc:
            context.abort(exc.code(), exc.details())
        finally:
            if listed is not None:
                self.replicas.closed(listed)
