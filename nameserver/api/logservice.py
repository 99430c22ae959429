"""The Log gRPC service: read the metadata log (for export and the Spark pipeline) and dump the state.

ReadLog streams committed entries from this node's in-memory history ring (raftlog/history.py), in
bounded batches, from any node. Entries older than the ring fail OUT_OF_RANGE naming the oldest offset
kept: another node may keep more, and the node's archive (nameserver/ops/archive.py) holds the rest as
Parquet segments the pipeline reads directly. DumpState streams a consistent copy of the state, taken
under the state lock in O(keys) pointer copies, then sorted and chunked outside it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc

from nameserver import headers
from nameserver.core.node import NameServerNode
from nameserver.pb import api_pb2, api_pb2_grpc
from raftlog.history import Compacted

log = logging.getLogger("nameserver.api.logservice")

DEFAULT_BATCH = 500
MAX_BATCH = 5000
DUMP_CHUNK_ITEMS = 1000
DUMP_CHUNK_BYTES = 1 << 20
WAIT_CAP_S = 30.0
# Initial metadata of ReadLog: the last offset the stream covers (to_offset, resolved) and the oldest kept.


class LogService(api_pb2_grpc.LogServicer):
    def __init__(self, node: NameServerNode) -> None:
        self.node = node
        self.max_message_bytes = node.cfg.max_message_bytes

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
        # a consistent copy: values are immutable bytes, so this is pointer copies
        frozen, offset, digest = self.node.inspect(lambda s: (s.kv.freeze(), s.kv.offset, s.kv.digest_hex))
        chunk = api_pb2.StateChunk(apply_offset=offset, digest=digest)
        size = 0
        for key in sorted(frozen):
            value, version, rtype = frozen[key]
            chunk.items.add(key=key, value=value, version=version, type=rtype)
            size += len(key) + len(value) + 24
            if len(chunk.items) >= DUMP_CHUNK_ITEMS or size >= DUMP_CHUNK_BYTES:
                yield chunk
                if not context.is_active():
                    return
                chunk = api_pb2.StateChunk(apply_offset=offset, digest=digest)
                size = 0
        yield chunk  # always at least one message, so an empty state still reports offset and digest
