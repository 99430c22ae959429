"""A worker process's end of the Go front end ([node] grpc_front = "go"; docs/architecture.md, "Processes").

The node's compiled front end (front/, grpc-go) owns the public gRPC port and hands each call to one of the
node's workers over that worker's Unix socket, <data_dir>/channel/front-<index>.sock (0600, in the channel
directory, 0700). The worker answers it with the same handlers and the same interceptors its grpcio server
would run (grpcserver.interceptors: the call guard, metrics, auth, the decode guard; corelink's forwarder and
the service code), so a call meets the same checks and gets the same status and details whichever front end
took it. `FrontServer` stands in for the worker's grpc.Server (add_generic_rpc_handlers, start, stop).

Frames are nameserver/framing.py's; the records (front/frames.go says them too), each naming its kind in one
byte and its call by an 8-byte id:

    front -> worker  c  call: deadline (ns on CLOCK_MONOTONIC, shared with the front end; -1: none), method,
                        caller (corelink's CALLER form: the client's address and its certificate's names, which
                        the front end takes from the connection, never from the client's metadata), metadata
                     m  a request message     h  the client's stream ended     x  cancel (the client left)
                     a  a streamed reply was handed to the client
    worker -> front  u  the reply and trailing metadata (status OK)   m  a streamed reply
                     r  the same as u, and reusable: the state generation it was read at, the reply, trailing
                        metadata (the front end may answer the same call with it again: below)
                     a  a request message was taken by the handler
                     s  status: code, details, trailing metadata
                     g  the worker's state generation moved: 8 zero bytes (no call), the generation

Each direction keeps at most WINDOW messages of a call unacknowledged (requests: past the first), so a
client that sends faster than its handler reads, or does not read what a stream sends, holds no more than
that in either process; the call guard's progress bound then sees the stall as it would under grpcio.
Calls run on a pool of [grpc] workers threads, at most limits.grpc_max_concurrent_rpcs at once (as grpcio's
server), but for the eventual reads that will not wait (Inline), answered on the link's own thread.

The front end's reply cache (front/cache.go; [node] grpc_front_cache_mb) answers repeated calls without the
worker, and the worker alone decides what it may keep (Reusable): a reply goes as r, not u, only when
- its method is one of Reusable.methods (GetRoute, GetClusterInfo, GetTopicList: unary eventual reads whose
  answer is a function of the request, the caller's credential and the replica's state alone), and its call
  ran inline (Inline.here: no offset it names past the replica's, with several groups no entry of its offset
  vector past its group's replica; nothing waited: a read that had to wait, or would have, goes to the pool
  and its reply is never reusable);
- it is an answer (u), not a status: an error is never kept (a refusal of auth, a limit's, NOT_FOUND), nor a
  call cancelled with a status (the call guard's).
Every interceptor gives a repeat of such a call what it gave the first: the call guard's per-caller and
per-node bounds count streams only (a unary read takes no slot), its progress bound watches a request the
front end already holds whole; auth decides from the metadata (a token) and the certificate's names, both in
the front end's key (with the method, the request bytes and every metadata pair the worker gets; the caller's
identity is its address without the port and its certificate's names: nothing these reads run reads the
port); no quota or rate limit applies to a read; the metrics count only what reaches a worker (the front end
counts its hits: nameserver_grpc_front_cache_hits_total).
Each reply is stamped with the worker's state generation read before the call ran (Generations); the worker
says each new generation on each link (g) before anything it voids could be kept there (at once on a link that
was sent a reusable reply of the last one, else just before that link's next reusable reply), and the front end
serves an entry only while its generation is the link's latest. The generation moves only when something these
replies read may have changed: after a batch its
replica publishes that moved the state's route_generation (nameserver/state/metadata.py: a changed record of a
kind with RecordKind.routes in nameserver/logformat/records.py: topic, broker, filter, setting, shard, and of
the KV records those of the order-topic config's namespace; or a restore), after a snapshot it installs, and
when its replica turns unready (so that reads it would refuse are not answered from the cache). GetRoute reads
topic, broker and filter records, the order-topic KV config and two settings; GetClusterInfo broker records;
GetTopicList topic and broker records and its settings: each of them moves route_generation, so all three are
kept. What none of them reads does not move it: an idle no-op, a liveness (live/), session, binding, member or
controller record, a KV namespace's kvns/ record, any other KV namespace's keys.
A kept reply therefore carries the apply_offset it was read at, which may be below the node's offset by then:
the answer is the same at every offset from that one to the node's (docs/api.md, "Offsets"). A request naming
a min_offset (or min_offsets) W is its own entry (the key holds the request's bytes), and it was kept only
when it ran inline, which it did only with its replica at W or past it: an entry never answers a read below
the offset it names.
A sharded node's worker (several Raft groups: a replica of each, nameserver/groups/links.py) answers the three
merged over every group's replica (nameserver/groups/reads.py), and its generation covers them all: it moves
when any group's replica publishes a batch that moved that group's route_generation, installs a snapshot, or
turns unready (worker._reusable_reads: the token is every group's snapshot count and route_generation). A
merged reply reads each group's topic, broker and filter records, group 0's settings and order-topic KV, and
group 0's directory (shard/ records, RecordKind.routes: an assignment, a move begun or finished moves group 0's
route_generation; a move's copy and drop move the target's and the source's). It was computed only with every
group at or past the directory's floor (else ReplicaBehind: a wait, so the pool's, never kept); the floor moves
only with a directory record, and offsets only grow, so it holds while the generation does. A min_offsets
vector is in the key, and its call ran inline only with every group's replica at or past its entry
(min_offset: group 0's); a kept reply's offsets vector is the one it was read at.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import socket
import struct
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn

import grpc

from nameserver import framing
from nameserver.api.corelink import decode_caller
from nameserver.api.grpcwrap import CALL_RECEIVED
from nameserver.api.inprocess import LocalRpcError
from nameserver.api.writechannel import (
    _NO_TIME,
    BATCH_BYTES,
    GIVEN_WRITE,
    Answer,
    ChannelContext,
    _Details,
    _metadata_fields,
    _metadata_of,
    _returning,
    _Sender,
    readable,
    sends_held,
)
from nameserver.config import NodeConfig
from nameserver.core.nowait import WouldBlock, no_wait
from nameserver.core.readindex import GIVEN_INDEX

log = logging.getLogger("nameserver.api.frontchannel")

WINDOW = 2  # messages of a call unacknowledged each way (front/call.go's window)
MAX_HANDLERS_KEPT = 4096  # intercepted handlers kept, per distinct method and metadata (_handler)
CALL, MESSAGE, HALF_CLOSE, CANCEL, TAKEN = b"c", b"m", b"h", b"x", b"a"
UNARY, STATUS, REUSABLE, GENERATION = b"u", b"s", b"r", b"g"
NO_CALL = bytes(8)  # a generation record's call id
READINESS_CHECK_S = 0.25  # how soon a replica turning unready moves the generation (Generations.follow)
_ID = struct.Struct(">Q")
_END = object()
Metadata = tuple[tuple[str, str | bytes], ...]


def socket_path(data_dir: str, index: int) -> str:
    return os.path.join(data_dir, "channel", f"front-{index}.sock")


class FrontContext(ChannelContext):
    """What the handlers use of grpc.ServicerContext, for a call from the front end: the caller the front
    end named, the deadline it passed on, its cancel, abort's status (code(), as grpcio's context has it,
    for the metrics interceptor)."""

    def __init__(self, deadline: float | None, metadata: Metadata, peer: str, auth: dict[str, list[bytes]],
                 on_cancel: Callable[[], None]) -> None:
        super().__init__(deadline, metadata)
        self._peer, self._auth, self._on_cancel = peer, auth, on_cancel
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self.ended_with: tuple[grpc.StatusCode, str] | None = None  # cancel_with's status

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def cancel(self) -> None:
        self._cancelled = True
        self._on_cancel()  # a wait on the client ends at once
        self.end()

    def cancel_with(self, code: grpc.StatusCode, details: str) -> None:
        """Cancel with the status the client gets, whatever the handler answers after (as grpcio's call
        cancelled with a status: callguard.cancel_call)."""
        if self.ended_with is None:
            self.ended_with = (code, details)
        self.cancel()

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        self._code = code
        super().abort(code, details)

    def abort_with_status(self, status: grpc.Status) -> NoReturn:
        self.set_trailing_metadata(tuple(status.trailing_metadata or ()))  # type: ignore[arg-type]  # -bin values
        self.abort(status.code, status.details)

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def set_status(self) -> tuple[bytes, list[bytes]] | None:
        """The status set with set_code (and set_details) rather than abort, as grpcio sends it; None: none."""
        if self._code is None or self._code == grpc.StatusCode.OK:
            return None
        return STATUS, [str(self._code.value[0]).encode(), self._details.encode()]


class _Call:
    """One call's state on the worker: its request messages as they come, its reply credits."""

    def __init__(self, call_id: bytes, sender: _Sender, method: str, known_caller: bool) -> None:
        self.id = call_id
        self.sender = sender
        self.method = method
        self.known_caller = known_caller
        self.held: bytes | None = None  # an inline candidate's request, until its stream ends (_take)
        self.streamed = False  # it sent a second request message: never inline
        self.requests: queue.SimpleQueue[Any] = queue.SimpleQueue()
        # made when a reply stream starts (most calls are unary: none); set before that stream's first
        # is_active(), so a cancel either finds it to release or is seen by that check
        self.credits: threading.Semaphore | None = None
        self.context: FrontContext | None = None
        self.index: int | None = None  # its read index, asked for as it came (IndexFirst)
        self.answer: Answer | None = None  # its write's answer from the core, sent as it came (WriteFirst)
        self.arrived: float | None = None  # when it came, for a call run only once its index did (IndexFirst)

    def wake(self) -> None:
        """The call was cancelled: its waits on the client end."""
        self.requests.put(_END)
        if (credits := self.credits) is not None:
            credits.release(WINDOW + 1)

    def received(self, deserialize: Callable[[bytes], Any] | None) -> Iterator[Any]:
        """The client's request messages, each but the first acknowledged as the handler takes it (the first
        took no credit: a unary call costs no acknowledgement); ends with the client's stream or the call."""
        first = True
        while (item := self.requests.get()) is not _END:
            if not first:
                self.sender.put([TAKEN, self.id])
            first = False
            yield deserialize(item) if deserialize is not None else item


class FrontServer(framing.LinkServer):
    """A worker's calls from the Go front end: grpc.Server's part the worker uses, over its front socket."""

    def __init__(self, cfg: NodeConfig, path: str, interceptors: Sequence[grpc.ServerInterceptor],
                 inline: Inline | None = None, reusable: Reusable | None = None,
                 index_first: IndexFirst | None = None, write_first: WriteFirst | None = None) -> None:
        """`inline`: which calls may run on the link's own thread (see Inline); `reusable`: which of those
        the front end may answer again from its cache (see Reusable; None: none); `index_first`: which calls
        ask their read index as they arrive and run when it comes (see IndexFirst); `write_first`: which
        writes go to the core as they arrive and run when the answer is there (see WriteFirst)."""
        super().__init__(path, "front-channel")
        self.inline = inline
        self.index_first = index_first
        self.write_first = write_first
        self.reusable = reusable
        self.interceptors = tuple(interceptors)
        self.generic: list[grpc.GenericRpcHandler] = []
        self.max_message = cfg.max_message_bytes
        self.max_frame = BATCH_BYTES + cfg.max_message_bytes + framing.FRAME_SLACK
        self.max_calls = cfg.grpc_max_concurrent_rpcs
        self.pool = ThreadPoolExecutor(max_workers=cfg.workers, thread_name_prefix="grpc")
        self._lock = threading.Lock()
        self._running = 0
        self._handlers: dict[tuple[str, Metadata], Any] = {}  # (method, metadata): its handler (_handler)

    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self.generic.extend(handlers)

    def stop(self, grace: float | None = None) -> threading.Event:  # type: ignore[override]  # grpc.Server's
        super().stop()
        if self.reusable is not None:
            self.reusable.generations.stopped.set()
        self.pool.shutdown(wait=False, cancel_futures=True)
        done = threading.Event()
        done.set()
        return done

    # ---- a link from the front end -------------------------------------------------------------------

    def serve(self, link: socket.socket) -> None:
        sender = _Sender(link, "front-channel-answers", lambda exc: framing.close(link))
        if self.reusable is not None:  # the link's first record: the generation its replies are read at
            self.reusable.generations.attach(sender)
        calls: dict[bytes, _Call] = {}
        held: dict[bytes, _Call] = {}  # inline candidates whose request has not ended yet
        waiting = readable(link)
        reader = framing.FrameReader(link, self.max_frame)
        try:
            while (body := reader.read_frame()) is not None:
                older = set(held)
                with sends_held():  # the frame's replies run here, and its calls' read-index asks: one write each way
                    for fields in framing.unpack(body):
                        self._take(fields, calls, sender, held)
                # A call's request that did not come with it may be in the next frame, already here (a lone
                # caller's call record and request mostly come as two frames): a call waits for that one
                # frame, no longer; with none waiting, or past it, the call is the pool's.
                late = [k for k in held if k in older] if held and (reader.buffered() or waiting.poll(0)) \
                    else list(held)
                for key in late:
                    call = held.pop(key)
                    call.held = None
                    self.pool.submit(self._run, call, calls)
        except (OSError, ValueError, EOFError, RuntimeError) as exc:  # RuntimeError: the pool is shut down
            if self.listening:
                log.warning("front channel: the front end's link ended: %s", exc)
        finally:
            for call in held.values():  # never run: each gives its concurrency slot back
                self._finish(call, calls, STATUS, [str(grpc.StatusCode.CANCELLED.value[0]).encode(),
                                                   b"the front end's link ended"])
            if self.reusable is not None:
                self.reusable.generations.detach(sender)
            sender.close()
            with self._lock:
                left = list(calls.values())
            for call in left:  # the front end went away: so did every client of its calls
                if call.context is not None:
                    call.context.cancel()

    def _take(self, fields: list[bytes], calls: dict[bytes, _Call], sender: _Sender, held: dict[bytes, _Call]
              ) -> None:
        if len(fields) < 2:
            raise ValueError("front channel: a record of the wrong shape")
        kind, call_id = fields[0], fields[1]
        if kind == CALL:
            if len(fields) < 5 or len(fields) % 2 == 0 or not fields[2].lstrip(b"-").isdigit():
                raise ValueError("front channel: a call of the wrong shape")
            ns = int(fields[2])
            caller = _caller(fields[4])
            call = _Call(call_id, sender, fields[3].decode(errors="replace"), caller is not None)
            peer, auth = caller if caller is not None else ("unknown", {})
            try:
                metadata = _metadata_of(fields[5:])
            except UnicodeDecodeError:  # this call's fault, not the link's: it alone is refused
                sender.put([STATUS, call_id, str(grpc.StatusCode.INVALID_ARGUMENT.value[0]).encode(),
                            f"metadata: {_undecodable(fields[5:])}'s value is not UTF-8".encode()])
                return
            call.context = FrontContext(None if ns == _NO_TIME else ns / 1e9, metadata, peer, auth, call.wake)
            with self._lock:
                calls[call_id] = call
                refused = self._running >= self.max_calls
                self._running += 0 if refused else 1
            if refused:  # grpcio's answer past maximum_concurrent_rpcs
                self._finish(call, calls, STATUS, [str(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]).encode(),
                                                   b"Concurrent RPC limit exceeded!"], counted=False)
                return
            if (self.inline is not None and call.method in self.inline.methods) or \
                    (self.index_first is not None and call.method in self.index_first.methods) or \
                    (self.write_first is not None and call.method in self.write_first.methods):
                held[call_id] = call  # its request is likely in this frame: see at its end (HALF_CLOSE)
                return
            self.pool.submit(self._run, call, calls)
            return
        with self._lock:
            found = calls.get(call_id)
        if found is None:
            return  # a call that ended already
        if kind == MESSAGE and len(fields) == 3:
            found.requests.put(fields[2])
            if (candidate := held.get(call_id)) is not None:
                if candidate.held is None and not candidate.streamed:
                    candidate.held = fields[2]
                else:  # a second message: not a unary call, whatever comes after; the pool's
                    candidate.held, candidate.streamed = None, True
        elif kind == HALF_CLOSE:
            found.requests.put(_END)
            if held.pop(call_id, None) is not None:
                request, found.held = found.held, None
                if request is not None and self.inline is not None and found.method in self.inline.methods \
                        and self.inline.here(found.method, request):
                    self._run(found, calls, inline=request)
                elif request is None or not (self._index_first(found, calls, request)
                                             or self._write_first(found, calls, request)):
                    self.pool.submit(self._run, found, calls)
        elif kind == CANCEL and found.context is not None:
            found.context.cancel()
        elif kind == TAKEN and found.credits is not None:
            found.credits.release()

    def _index_first(self, call: _Call, calls: dict[bytes, _Call], request: bytes) -> bool:
        """Ask `call`'s read index now and run it when it comes (IndexFirst); False: not such a call."""
        first, context = self.index_first, call.context
        if first is None or context is None or call.method not in first.methods:
            return False

        def indexed(index: int | None) -> None:
            if index is None:  # the pool's call asks again, and waits
                self._to_pool(call, calls)
                return
            call.index = index
            self._run(call, calls, inline=request)

        call.arrived = time.perf_counter()
        return first.start(call.method, request, context, indexed)

    def _write_first(self, call: _Call, calls: dict[bytes, _Call], request: bytes) -> bool:
        """Send `call`'s write to the core now and run the call when its answer is there (WriteFirst); False:
        not such a call. A call whose caller the front end did not name is never sent (the pool's refuses it)."""
        first, context = self.write_first, call.context
        if first is None or context is None or call.method not in first.methods or not call.known_caller:
            return False

        def answered(answer: Answer) -> None:
            call.answer = answer
            self._run(call, calls, inline=request)

        call.arrived = time.perf_counter()
        return first.start(call.method, request, context, answered)

    def _to_pool(self, call: _Call, calls: dict[bytes, _Call]) -> None:
        try:
            self.pool.submit(self._run, call, calls)
        except RuntimeError:  # the pool is shut down: the worker stops, and so does the link
            self._finish(call, calls, STATUS, [str(grpc.StatusCode.UNAVAILABLE.value[0]).encode(),
                                               b"the worker is stopping"])

    def _finish(self, call: _Call, calls: dict[bytes, _Call], kind: bytes, fields: list[bytes],
                counted: bool = True) -> None:
        with self._lock:
            calls.pop(call.id, None)
            self._running -= 1 if counted else 0
        if kind == REUSABLE and self.reusable is not None:  # after the generation it may be kept at
            self.reusable.generations.reply(call.sender, int(fields[0]), [kind, call.id, *fields])
        else:
            call.sender.put([kind, call.id, *fields])

    # ---- a call ----------------------------------------------------------------------------------------

    def _run(self, call: _Call, calls: dict[bytes, _Call], inline: bytes | None = None) -> None:
        """Answer `call`; `inline`: its one request, run on the link's thread where nothing may wait (a step
        that would wait hands the call to the pool, nothing answered: nameserver/core/nowait.py)."""
        context = call.context
        assert context is not None
        kind, fields = STATUS, [b"13", b"the worker did not answer"]
        # the generation before the read: a reply kept under it holds at least that state (Reusable)
        generation = None
        if inline is not None and self.reusable is not None and call.method in self.reusable.methods:
            generation = self.reusable.generations.value
        given = GIVEN_INDEX.set(call.index) if call.index is not None else None
        written = GIVEN_WRITE.set(call.answer) if call.answer is not None else None
        received = CALL_RECEIVED.set(call.arrived) if call.arrived is not None else None
        try:
            if inline is None:
                kind, fields = self._outcome(call, context)
            else:
                with no_wait():
                    kind, fields = self._outcome(call, context, inline=True)
        except WouldBlock:  # its request again, and its end (the first copy of both were taken)
            call.requests = queue.SimpleQueue()
            call.requests.put(inline)
            call.requests.put(_END)
            self._to_pool(call, calls)
            return
        finally:
            if given is not None:
                GIVEN_INDEX.reset(given)
            if written is not None:
                GIVEN_WRITE.reset(written)
            if received is not None:
                CALL_RECEIVED.reset(received)
            if context.ended_with is not None:  # cancelled with a status: the client gets that one
                kind, fields = STATUS, [str(context.ended_with[0].value[0]).encode(), context.ended_with[1].encode()]
        if kind == UNARY and generation is not None:
            kind, fields = REUSABLE, [str(generation).encode(), *fields]
        fields += _metadata_fields(context.trailing())
        self._finish(call, calls, kind, fields)
        context.end()

    def _outcome(self, call: _Call, context: FrontContext, inline: bool = False) -> tuple[bytes, list[bytes]]:
        """The call's answer: its reply, or its status."""
        try:
            if not call.known_caller:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "the front end did not name the call's caller")
            kind, fields = self._answer(call, call.method, context)
            return context.set_status() or (kind, fields)
        except LocalRpcError as exc:
            return STATUS, [str(exc.code().value[0]).encode(), (exc.details() or "").encode()]
        except Exception as exc:  # a servicer bug: what gRPC answers for one, and a log line
            if inline and isinstance(exc, WouldBlock):
                raise  # _run hands the call to the pool
            set_status = context.set_status()  # a method not implemented sets UNIMPLEMENTED, then raises
            if set_status is None:
                log.exception("front channel call %s failed", call.method)
            return set_status or (STATUS, [str(grpc.StatusCode.UNKNOWN.value[0]).encode(),
                                           f"Exception calling application: {exc}".encode()])

    def _handler(self, method: str, context: FrontContext) -> Any:
        """The method's handler wrapped by the interceptors, as grpcio's server would build it; None when
        no handler serves `method`. Built once per distinct method and metadata (a client's calls mostly
        repeat both): what an interceptor's intercept_service returns depends on those alone, and the
        per-call checks run in the handler it returns (grpcserver.interceptors)."""
        metadata = context.invocation_metadata()
        key = (method, metadata)
        handler = self._handlers.get(key, _END)
        if handler is not _END:
            return handler
        details = _Details(method, metadata)
        handler = next((h for g in self.generic if (h := g.service(details)) is not None), None)
        for interceptor in reversed(self.interceptors):
            handler = interceptor.intercept_service(_returning(handler), details)
        if len(self._handlers) >= MAX_HANDLERS_KEPT:  # a bound, not an eviction order: start again
            self._handlers.clear()
        self._handlers[key] = handler
        return handler

    def _answer(self, call: _Call, method: str, context: FrontContext) -> tuple[bytes, list[bytes]]:
        handler = self._handler(method, context)
        if handler is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        requests = call.received(handler.request_deserializer)
        if handler.request_streaming:
            arg: Any = requests
        else:
            arg = next(requests, _END)
            if arg is _END:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, "request: the call carried no request message")
        behavior = (handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream)
        encode = handler.response_serializer or (lambda reply: reply)
        if not handler.response_streaming:
            return UNARY, [self._within_bound(encode(behavior(arg, context)), context)]
        responses = iter(behavior(arg, context))
        credits = call.credits = threading.Semaphore(WINDOW)
        for reply in responses:
            if context.is_active():
                credits.acquire()  # the front end handed the last ones to the client (or the call ended)
            if not context.is_active():
                # once more: a bound that cancelled the call (the call guard's) answers with its status
                next(responses, None)
                _close(responses)
                context.abort(grpc.StatusCode.CANCELLED, "the caller went away")
            try:
                message = self._within_bound(encode(reply), context)
            except BaseException:
                _close(responses)
                raise
            call.sender.put([MESSAGE, call.id, message])
        return STATUS, [b"0", b""]

    def _within_bound(self, reply: bytes, context: FrontContext) -> bytes:
        """`reply`, when [grpc] max_message_bytes allows it; else the call ends as grpcio's server ends it
        (a reply past the bound would also be past the front end's frame bound, and end the whole link)."""
        if len(reply) > self.max_message:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"Sent message larger than max ({len(reply)} vs. {self.max_message})")
        return reply


class Inline:
    """Calls a worker answers on the link's own thread, with no hand-off to the pool (a thread wake and a
    GIL hand-over a call: docs/benchmarks.md, "The Go front end in the product"): `methods` whose request
    arrived whole with the call, and for which `here(method, request bytes)` says the answer will not wait
    (an eventual read its replica can serve now). Anything that may wait (a min_offset ahead of the
    replica, a linearizable read, a write, a stream) goes to the pool: a wait on the link thread would hold
    every call behind it."""

    def __init__(self, methods: frozenset[str], here: Callable[[str, bytes], bool]) -> None:
        self.methods = methods
        self.here = here


# IndexFirst's start: (method, request bytes, context, done(index | None)) -> whether it asked
StartIndex = Callable[[str, bytes, "FrontContext", Callable[[int | None], None]], bool]


class IndexFirst:
    """Calls that need a read index (a worker's LINEARIZABLE reads) whose index is asked for as the call arrives
    whole, with no thread waiting for it: `start(method, request bytes, context, done)` asks (False: not this
    call, which goes to the pool as any) and calls `done(index)` when the answer comes, on the write channel's
    reader thread (on the leader's node under its lease: at once, on the link's thread, from the core's lease
    page read after the call arrived: nameserver/api/coreindex.py), where the call then runs as an inline one
    would (a step that would wait hands it to the pool, its index kept: GIVEN_INDEX); `done(None)`: no index
    that way, the pool's call asks as ever. The index comes from an ask sent after the call arrived, as the
    handler's own would (nameserver/api/coreindex.py), so the read covers every write acknowledged before it;
    the call meets its interceptors and the service's checks when it runs, as any. What this saves is a pool
    thread's two wakes per read (docs/benchmarks.md, "Issue 27: the linearizable read's CPU (session 24)"), and
    under the lease the ask itself ("Issue 27: the linearizable read's path (session 26)")."""

    def __init__(self, methods: frozenset[str], start: StartIndex) -> None:
        self.methods = methods
        self.start = start


# WriteFirst's start: (method, request bytes, context, done(the core's answer)) -> whether it sent the write
StartWrite = Callable[[str, bytes, "FrontContext", Callable[[Answer], None]], bool]


class WriteFirst:
    """Unary writes sent to the core as they arrive whole, with no thread waiting for the answer:
    `start(method, request bytes, context, done)` sends (False: not this call, which goes to the pool as any)
    and calls `done(answer)` once the core answered and the worker's replica has the core's offset of that
    answer (read-your-writes: on the replica's thread when it applies it, else on the write channel's reader
    thread; past the settle bound, with the replica behind, the call's wait is the pool's), where the call
    then runs as an inline one would, its handler answering with the core's answer (GIVEN_WRITE) instead of
    sending the write again; a step that would wait hands it to the pool with that answer kept. The call meets
    the worker's interceptors when it runs: every check they make of a write (the call guard's refusal, auth)
    the core makes first, in the same words, from the same metadata and caller (corelink.WorkerCallers), so a
    write they would refuse never enters the log; and a call the front end did not name a caller of is never
    sent. What this saves is a pool thread's two wakes per write (the front channel's hand-off, the write
    channel's answer): docs/benchmarks.md, "Issue 27: the write's call path without a blocked thread
    (session 25)"."""

    def __init__(self, methods: frozenset[str], start: StartWrite) -> None:
        self.methods = methods
        self.start = start


class Generations:
    """A worker's state generation, as the front end's reply cache sees it (Reusable): a number that moves
    whenever a reusable reply could change, said on each link from the front end (a g record, in order with
    the replies on that link: a reply stamped with an older generation that comes after it is never served).

    A move is said on a link at once only when that link was sent a reusable reply of the generation it was
    told last (only then may the front end hold an entry the move voids); otherwise it is said just before the
    link's next reusable reply (`reply`). A front end with nothing kept thus hears of no move: a write's apply
    costs its process no wake, nor the worker a send (docs/benchmarks.md, "Issue 27: the Go front end per call
    (session 26)")."""

    def __init__(self) -> None:
        self.value = 0
        self.stopped = threading.Event()
        self._lock = threading.Lock()
        # each link's sender: the generation it was told last, and whether a reusable reply of that one went
        # to it since (the front end may keep it: the next move is said at once)
        self._senders: dict[_Sender, list[int]] = {}
        self._seen: Hashable = None  # the state token at the last publish (follow)

    def moved(self, *_: Any) -> None:
        """The state changed (a replica's publish listener: the offset it published)."""
        with self._lock:  # said in order on every link
            self.value += 1
            record = [GENERATION, NO_CALL, str(self.value).encode()]
            for sender, told in self._senders.items():
                if told[1]:
                    told[:] = [self.value, 0]
                    sender.put(record)

    def reply(self, sender: _Sender, generation: int, record: list[bytes]) -> None:
        """Send a reusable reply read at `generation` on `sender`'s link, after the current generation when
        the link was not told it yet (the front end keeps a reply of its latest generation only)."""
        with self._lock:
            told = self._senders.get(sender)
            if told is not None:
                if told[0] != self.value:
                    told[:] = [self.value, 0]
                    sender.put([GENERATION, NO_CALL, str(self.value).encode()])
                if generation == told[0]:
                    told[1] = 1
            sender.put(record)

    def attach(self, sender: _Sender) -> None:
        with self._lock:
            self._senders[sender] = [self.value, 0]
            sender.put([GENERATION, NO_CALL, str(self.value).encode()])

    def detach(self, sender: _Sender) -> None:
        with self._lock:
            self._senders.pop(sender, None)

    def follow(self, publish_listeners: Sequence[list[Callable[[int], None]]], ready: Callable[[], bool],
               token: Callable[[], Hashable]) -> None:
        """Move when a replica (one of several: each of `publish_listeners` is one replica's, a group's on a
        sharded node) publishes an offset at which `token()` (what the kept replies read of every replica's
        state: each one's snapshot count and route_generation) differs from the last publish's, and when
        `ready()` (every replica ready) turns false (checked every READINESS_CHECK_S on a thread of its own,
        until stop()): reads are refused from then on, and none is answered from the cache. A publish
        listener runs on its replica's follower thread, after readers may see the batch: a reply read
        meanwhile is stamped with the generation before it, and voided by this move. Several replicas'
        threads compare and move under one lock: a change one of them published is never taken for seen
        by another's older token."""
        self._seen = token()
        seen_lock = threading.Lock()

        def published(_offset: int) -> None:
            with seen_lock:
                now = token()
                if now != self._seen:
                    self._seen = now
                    self.moved()

        for listeners in publish_listeners:
            listeners.append(published)

        def watch() -> None:
            was = True
            while not self.stopped.wait(READINESS_CHECK_S):
                now = ready()
                if was and not now:
                    self.moved()
                was = now

        threading.Thread(target=watch, name="front-generations", daemon=True).start()


class Reusable:
    """Which replies the front end may keep and answer again: `methods`' replies to calls that ran inline
    (see the module's docstring), each stamped with `generations`' value."""

    def __init__(self, methods: frozenset[str], generations: Generations) -> None:
        self.methods = methods
        self.generations = generations


@functools.lru_cache(maxsize=1024)
def _caller(value: bytes) -> tuple[str, dict[str, list[bytes]]] | None:
    """decode_caller, once per distinct caller (a connection's calls all name the same one)."""
    return decode_caller(value.decode(errors="replace"))


def _undecodable(fields: list[bytes]) -> str:
    """The first key whose text value _metadata_of could not decode."""
    for k, v in zip(fields[::2], fields[1::2], strict=True):
        key = k.decode(errors="replace")
        if not key.endswith("-bin"):
            try:
                v.decode()
            except UnicodeDecodeError:
                return key
    return "a header"


def _close(responses: Iterator[Any]) -> None:
    close = getattr(responses, "close", None)
    if close is not None:
        close()


__all__ = ["FrontContext", "FrontServer", "Generations", "Inline", "Reusable", "WriteFirst", "socket_path"]
