"""What a read replica is fed, whatever carries it: Log.Follow's gRPC stream (nameserver/api/logservice.py:
remote read replicas) or a worker's Unix feed (nameserver/localfeed.py, on the same machine as its core).

A snapshot when the follower has nothing or is older than this node's history, then the entries after its
offset as they are applied (woken by the apply offset, not polling: every entry applied since the last
message goes in the next one), a keepalive every FOLLOW_KEEPALIVE_S when idle. Nothing is buffered per
follower but the message being sent: entries are read from the history ring (raftlog/history.py) that
ReadLog serves too. A follower that fell behind the ring is sent a snapshot again, and so is every follower
once this node restored a snapshot (its state replaced, whatever the offsets: finding 13). A refusal is a
FollowRefused with gRPC's code and words: not ready (the replica asks again soon), apply stopped (it backs
off), the followers' bound (limits.max_followers, shared by both transports).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator, Iterator

import grpc

from nameserver.core.node import NameServerNode
from nameserver.localfeed import FollowRefused
from nameserver.pb import api_pb2
from raftlog.history import Compacted

MAX_BATCH = 5000  # entries per message at most (a follower far behind takes several)
DUMP_CHUNK_ITEMS = 1000
DUMP_CHUNK_BYTES = 1 << 20
FOLLOW_KEEPALIVE_S = 1.0  # an idle feed sends the apply offset this often (the follower's lag)


def state_chunks(node: NameServerNode) -> Iterator[api_pb2.StateChunk]:
    """A consistent copy of the state, sorted and chunked: always at least one chunk, so an empty state
    still reports its offset and digest (DumpState's chunks, and a follower's snapshot)."""
    # under the state lock: values are immutable bytes, so this is pointer copies
    frozen, offset, digest = node.inspect(lambda s: (s.kv.freeze(), s.kv.offset, s.kv.digest_hex))
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


class FollowFeed:
    """The feeds of one node's followers: both transports take their messages here, and their followers
    are counted against the one limits.max_followers."""

    def __init__(self, node: NameServerNode) -> None:
        self.node = node
        self.max_message_bytes = node.cfg.max_message_bytes
        self.max_followers = node.cfg.max_followers
        self._followers = 0
        self._followers_lock = threading.Lock()

    def messages(self, from_offset: int, is_active: Callable[[], bool]
                 ) -> Generator[api_pb2.FollowMessage, None, None]:
        """One follower's messages from `from_offset` while `is_active()`; FollowRefused when refused."""
        if from_offset < 0:
            raise FollowRefused(grpc.StatusCode.INVALID_ARGUMENT, "from_offset: must be >= 0")
        if not self.node.log.ready:
            raise FollowRefused(grpc.StatusCode.UNAVAILABLE, f"not ready: {self.node.not_ready_reason()}")
        with self._followers_lock:
            full = self._followers >= self.max_followers
            self._followers += not full
        if full:
            raise FollowRefused(grpc.StatusCode.RESOURCE_EXHAUSTED, f"limits.max_followers: this node already feeds "
                                f"{self.max_followers} read replicas; follow another node")
        try:
            yield from self._follow(from_offset, is_active)
        finally:
            with self._followers_lock:
                self._followers -= 1

    def _follow(self, from_offset: int, is_active: Callable[[], bool]) -> Iterator[api_pb2.FollowMessage]:
        rlog = self.node.log
        cursor = from_offset
        # This node's state as the follower holds it is the one since this many restores. A restore replaces
        # the state whatever its offset: one at or below the cursor leaves the history past the cursor intact
        # (no Compacted), so the follower would keep the state it had, never the one restored (finding 13).
        restores = rlog.restores
        if cursor == 0 or cursor < rlog.history.first_kept - 1:
            cursor = yield from self._snapshot(rlog.apply_offset)
        while is_active():
            if rlog.apply_error:
                raise FollowRefused(grpc.StatusCode.UNAVAILABLE, f"not ready: {self.node.not_ready_reason()}")
            rlog.wait_applied(cursor + 1, FOLLOW_KEEPALIVE_S, is_active)
            applied = rlog.apply_offset  # before reading the history: it holds every entry up to here
            try:
                entries = rlog.history.after(cursor, limit=MAX_BATCH, upto=applied)
            except Compacted:
                entries = None
            # Read after the history: entries read from a history a restore reset are never sent.
            if entries is None or rlog.restores != restores:
                restores = rlog.restores  # before the state is read: a restore after it is seen next time
                cursor = yield from self._snapshot(applied)
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

    def _snapshot(self, core_offset: int) -> Generator[api_pb2.FollowMessage, None, int]:
        """Send the state as it is now; returns its offset (the follower's new cursor)."""
        offset = 0
        last: api_pb2.FollowMessage | None = None
        for chunk in state_chunks(self.node):
            if last is not None:
                yield last
            last = api_pb2.FollowMessage(snapshot=chunk, core_offset=core_offset)
            offset = chunk.apply_offset
        assert last is not None  # state_chunks yields at least one chunk
        last.snapshot_done = True
        last.through_offset = offset
        yield last
        return offset


__all__ = ["DUMP_CHUNK_BYTES", "DUMP_CHUNK_ITEMS", "FOLLOW_KEEPALIVE_S", "MAX_BATCH", "FollowFeed", "state_chunks"]
