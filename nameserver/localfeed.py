"""A worker's feed: its read replica follows its core over a Unix socket instead of Log.Follow's gRPC stream
(docs/architecture.md, "Processes"). Read replicas on other machines keep Log.Follow.

The messages are Log.Follow's own (nameserver/api/follow.py: the snapshot, the entries as applied, the
keepalives, the resends after a restore, the refusals); what this saves is gRPC's per-message work on both
ends (HTTP/2 frames, the completion queues, the poller threads: docs/benchmarks.md, "A worker's feed over a
Unix socket"). The socket is the core's, <data_dir>/channel/feed.sock (0600, in the channel directory,
0700), framed as the write channel is (nameserver/framing.py):

- the worker's one frame: [[from_offset]] (decimal);
- then the core's frames, each [[FollowMessage]] (its protobuf bytes), one per message as the feed yields it,
  until a refusal [[code, details]] (gRPC's status number and words), after which the core closes the link.

A link that breaks, a frame that is torn or not one, is closed with a logged reason on either end; the
replica reconnects from its offset with its backoff (nameserver/replica/follower.py), reading a FollowRefused
(a grpc.RpcError, as a Follow call's) as it reads Log.Follow's. A worker that stops reading is cut after
limits.grpc_progress_timeout_ms, as the call guard cuts a Follow stream.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Generator

import grpc
from google.protobuf.message import DecodeError

from nameserver import framing
from nameserver.pb import api_pb2

log = logging.getLogger("nameserver.localfeed")

SOCKET_NAME = os.path.join("channel", "feed.sock")
REQUEST_BYTES = 64  # the worker's one frame: an offset

Messages = Callable[[int, Callable[[], bool]], Generator[api_pb2.FollowMessage, None, None]]


def socket_path(data_dir: str) -> str:
    return os.path.join(data_dir, SOCKET_NAME)


def max_frame_bytes(max_message_bytes: int) -> int:
    """The largest frame the core sends: one message, which Log.Follow would carry within [grpc]
    max_message_bytes too."""
    return max_message_bytes + framing.FRAME_SLACK


class StatusError(grpc.RpcError):
    """A gRPC status raised without a gRPC call (a call's error has these two methods): what a local
    caller reads as it reads a real call's error."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class FollowRefused(StatusError):
    """The core refuses to feed a follower (nameserver/api/follow.py), in gRPC's terms: raised on the core,
    aborting a Follow call or sent on the feed, and raised again on the worker from the feed, where the
    replica reads it as it reads a Follow call's error. Also a broken feed link, on the worker's side."""


# ---- the core's side --------------------------------------------------------------------------------

class FeedServer(framing.LinkServer):
    """The core's end: the socket, and a thread per worker link that writes its feed's messages."""

    def __init__(self, path: str, messages: Messages, send_timeout_s: float) -> None:
        """`messages(from_offset, is_active)`: a follower's messages (FollowFeed.messages)."""
        super().__init__(path, "worker-feed")
        self.messages = messages
        self.send_timeout_s = send_timeout_s

    def serve(self, link: socket.socket) -> None:
        try:
            link.settimeout(self.send_timeout_s)  # the request's read, and every message's send
            body = framing.read_frame(link, REQUEST_BYTES)
            if body is None:
                return
            records = framing.unpack(body)
            if len(records) != 1 or len(records[0]) != 1 or not records[0][0].isdigit():
                raise ValueError("a feed request of the wrong shape")
            messages = self.messages(int(records[0][0]), lambda: self.holds(link))
            try:
                for msg in messages:
                    link.sendall(framing.pack_one(msg.SerializeToString()))
            except FollowRefused as exc:
                link.sendall(framing.pack(((str(exc.code().value[0]).encode(), exc.details().encode()),)))
            finally:
                messages.close()  # now, not when collected: it holds one of limits.max_followers
        except (ValueError, EOFError) as exc:  # not a feed request
            log.warning("worker feed: closing a worker's link: %s", exc or type(exc).__name__)
        except OSError as exc:  # the worker went (its replica moved on, it stopped) or stopped reading (a timeout)
            if self.holds(link):
                log.info("worker feed: a worker's link ended: %s", exc or type(exc).__name__)


# ---- a worker's side --------------------------------------------------------------------------------

class LocalFeed:
    """Where a worker's replica follows its core: the feed socket at `path` (ReadReplica(feed=...))."""

    def __init__(self, path: str, max_message_bytes: int) -> None:
        self.path = path
        self.max_frame = max_frame_bytes(max_message_bytes)

    def follow(self, from_offset: int) -> FeedStream:
        return FeedStream(self.path, from_offset, self.max_frame)


class FeedStream:
    """One follow over the feed, used as a Follow call is: iterated for its FollowMessages, cancel()led;
    a refusal or a broken link raises FollowRefused."""

    def __init__(self, path: str, from_offset: int, max_frame: int) -> None:
        self.path = path
        self.max_frame = max_frame
        self._cancelled = False
        self._pending: list[list[bytes]] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(path)
            self._sock.sendall(framing.pack(((str(from_offset).encode(),),)))
        except OSError as exc:
            self._sock.close()
            raise FollowRefused(grpc.StatusCode.UNAVAILABLE, f"cannot reach the core's feed {path}: {exc}") from exc
        self._frames = framing.FrameReader(self._sock, max_frame)  # one recv for the frames that came together

    def __iter__(self) -> FeedStream:
        return self

    def __next__(self) -> api_pb2.FollowMessage:
        while not self._pending:
            try:
                body = self._frames.read_frame()
                field = None if body is None else framing.one_field(body)
                if field is None:
                    self._pending = [] if body is None else framing.unpack(body)
            except (OSError, ValueError, EOFError) as exc:
                raise self._broken(exc) from exc
            if field is not None:  # a frame of one message, the feed's usual: no records to unpack
                return self._message(field)
            if body is None:
                if self._cancelled:
                    raise FollowRefused(grpc.StatusCode.CANCELLED, "cancelled")
                framing.close(self._sock)
                raise StopIteration  # the core closed the link between messages: a stream that ended
        fields = self._pending.pop(0)
        if len(fields) == 2 and fields[0].isdigit():  # the core's refusal; it closes the link
            framing.close(self._sock)
            code = framing.status_code(int(fields[0]))
            raise FollowRefused(code, fields[1].decode(errors="replace"))
        if len(fields) != 1:
            raise self._broken(ValueError(f"a feed record of {len(fields)} fields"))
        return self._message(fields[0])

    def _message(self, field: bytes) -> api_pb2.FollowMessage:
        try:
            return api_pb2.FollowMessage.FromString(field)
        except DecodeError as exc:
            raise self._broken(ValueError(f"a feed message that does not decode: {exc}")) from exc

    def cancel(self) -> None:
        """End the stream: a reader waiting on it raises FollowRefused(CANCELLED)."""
        self._cancelled = True
        framing.close(self._sock)

    def _broken(self, exc: BaseException) -> FollowRefused:
        framing.close(self._sock)
        if self._cancelled:
            return FollowRefused(grpc.StatusCode.CANCELLED, "cancelled")
        why = str(exc) or type(exc).__name__
        log.warning("replica feed %s: closing the link: %s", self.path, why)
        return FollowRefused(grpc.StatusCode.UNAVAILABLE, f"the core's feed broke: {why}")


__all__ = ["FeedServer", "FeedStream", "FollowRefused", "LocalFeed", "StatusError", "max_frame_bytes",
           "socket_path"]
