"""The write channel between a node's worker processes and its core (docs/architecture.md, "Processes").

A worker passes each unary write (WRITE_METHODS), and its rounds of read-index asks for LINEARIZABLE
reads (READ_INDEX: the core adds that handler, corelink.ReadIndexes), to the core over one Unix socket,
<data_dir>/channel/writes.sock (0600, in the channel directory, 0700), in batched frames: the calls that
arrive while the worker's sender is busy go out together in the next frame, and the core's answers
that are ready together come back in one frame. A call carries the request bytes untouched, the
method, the caller's metadata with the worker's CALLER header (who the client was: corelink), and the
caller's deadline on CLOCK_MONOTONIC, which a worker and its core share (one machine, the core's child):
a call that waited in the socket (a stopped or busy core) arrives with only the time it still has, never
a fresh allowance. When the worker's call ends before its answer (its client cancelled, its deadline
passed) the worker sends a cancel, and the core cancels that call's context (is_active() False, its
callbacks called, as gRPC's): a write not yet proposed then never is (rpc.in_time). The core reads every
frame already waiting before it starts their calls, so a cancel queued behind its call is seen first.
An answer carries the status, its details, the reply bytes and the trailing metadata, with the core's
apply offset (CORE_OFFSET) the worker's replica reaches before it answers.

On the core every call runs through the same interceptors as a gRPC call on its private socket
(grpcserver.interceptors: WorkerCallers, the call guard, auth, the decode guard) and the same servicer
method, on a pool of [grpc] workers threads: tokens, certificate roles, session owners and refusals are
decided as for a direct call, in the same words. What it saves is gRPC's per-call cost on both ends
(HTTP/2 streams, the completion queue, one socket write per call and per answer): docs/benchmarks.md,
"The batched write channel".

A frame (nameserver/framing.py) is a 4-byte big-endian length and a list of records, each a list of
length-prefixed fields: a call is [id, deadline (ns, or -1), method, request, metadata key, value, ...], a
cancel [id], an answer [id, code, details, reply, trailing key, value, ...].
A worker whose link breaks fails the calls waiting on it with UNAVAILABLE (the caller retries; with an
exactly-once session the retry is answered from the session); the core finishes a call it started
whatever becomes of the link (Raft decides whether it was written, never the link).
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NoReturn

import grpc

from nameserver import framing
from nameserver.api.inprocess import LocalContext, LocalRpcError
from nameserver.api.later import Later
from nameserver.core.nowait import WouldBlock, no_wait, waiting_allowed
from nameserver.pb import api_pb2

log = logging.getLogger("nameserver.api.writechannel")

SOCKET_NAME = os.path.join("channel", "writes.sock")
NAMESERVER = api_pb2.DESCRIPTOR.services_by_name["NameServer"]
# The NameServer's unary writes (a chunked registration, a client stream, goes by corelink's forwarder).
WRITE_METHODS = ("RegisterBroker", "UnregisterBroker", "Heartbeat", "PutKv", "DeleteKv", "UpdateSettings",
                 "WipeWritePerm", "AddWritePerm", "RegisterTopic", "DeleteTopic", "BindQueue", "ReleaseQueue")
# The writes the core runs on the channel's reader thread (WriteChannelServer's `inline`), whose servicer answers
# from the apply (NameServerService.write): not Heartbeat (it reads the state under its lock, and writes
# nothing), not UnregisterBroker (its broker is forgotten once the write committed: a thread waits for it).
INLINE_WRITES = tuple(name for name in WRITE_METHODS if name not in ("Heartbeat", "UnregisterBroker"))
BATCH_BYTES = 1 << 20     # a frame gathers calls up to about this many bytes (one call may be larger)
_ID = struct.Struct(">Q")
_NO_TIME = -1             # a call whose caller set no deadline
MAX_WAITING_FRAMES = 64   # frames the core reads together before starting their calls (cancels first)
MAX_HANDLERS_KEPT = 4096  # intercepted handlers kept, per distinct method and metadata (WriteCalls.handler)
MAX_ADMITTED = 64         # READ_INDEX metadata kept as admitted by the interceptors (a worker's is one)
READ_INDEX = "/rip18.CoreLink/ReadIndex"  # the core's linearizable read index, for its workers only
_READ_INDEX = READ_INDEX.encode()

Metadata = tuple[tuple[str, str | bytes], ...]
Answer = tuple[grpc.StatusCode, str, bytes, Metadata]  # code, details, reply bytes, trailing metadata
Cancel = Callable[..., None]  # a started call's cancel: (why: (code, details) | None = None, tell: bool = True)
# the core's read index without a waiting thread: the index now, or None and done(index | None) later
StartReadIndex = Callable[[Callable[[int | None], None]], "int | None"]
# A worker's write whose answer came before its call ran (frontchannel.WriteFirst): the handler answers with it
# instead of sending the write (corelink.CoreForwarder); set only around that one call's run.
GIVEN_WRITE: contextvars.ContextVar[Answer | None] = contextvars.ContextVar("rip18_given_write", default=None)


def socket_path(data_dir: str) -> str:
    return os.path.join(data_dir, SOCKET_NAME)


def method_path(name: str) -> str:
    return f"/{NAMESERVER.full_name}/{name}"


# ---- records -----------------------------------------------------------------------------------------

def _metadata_fields(metadata: Metadata) -> list[bytes]:
    out: list[bytes] = []
    for k, v in metadata:
        out += (k.encode(), v if isinstance(v, bytes) else v.encode())
    return out


def _metadata_of(fields: list[bytes]) -> Metadata:
    """Binary values are gRPC's "-bin" keys; every other value is text."""
    pairs = []
    for k, v in zip(fields[::2], fields[1::2], strict=True):
        key = k.decode()
        pairs.append((key, v if key.endswith("-bin") else v.decode()))
    return tuple(pairs)


class _Sender:
    """Writes what was queued since its last write as one frame. A record put while the link is idle is
    written at once by the thread that puts it, as far as the socket takes it without waiting: no wake of
    another thread per call and per answer (on a loaded machine, where a woken thread waits its turn,
    most of what the channel added to a call). What is put while a write is under way, and the rest of a
    frame the socket did not take at once, the sender's own thread writes, in order, batched."""

    def __init__(self, sock: socket.socket, name: str, on_error: Callable[[BaseException], None]) -> None:
        self.sock = sock
        self.on_error = on_error
        self._cond = threading.Condition()
        self._queue: list[list[bytes]] = []
        self._rest = b""       # the unsent end of a frame written at once: the thread sends it first
        self._writing = False  # a thread is writing to the socket
        self._closed = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def put(self, record: list[bytes]) -> None:
        held = getattr(_holding, "senders", None)
        with self._cond:
            self._queue.append(record)
            if held is not None and not (self._writing or self._rest or self._closed):
                held[self] = None  # written with the others put on this thread at the hold's end (sends_held)
                return
            if self._writing or self._rest or self._closed:
                self._cond.notify()  # the sender's thread takes it after what is under way
                return
            self._writing = True
            frame = framing.pack(self._take())
        self._send(frame)

    def flush(self) -> None:
        """Write what is queued now, as put does (sends_held's end)."""
        with self._cond:
            if not self._queue:
                return
            if self._writing or self._rest or self._closed:
                self._cond.notify()
                return
            self._writing = True
            frame = framing.pack(self._take())
        self._send(frame)

    def _send(self, frame: bytes) -> None:
        try:
            sent = self.sock.send(frame, socket.MSG_DONTWAIT)  # never waits: a full socket is the thread's
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._failed(exc)
            return
        with self._cond:
            self._rest = frame[sent:]
            self._writing = False
            if self._rest or self._queue:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _take(self) -> list[list[bytes]]:
        """The records of the next frame (about BATCH_BYTES at most; at least one), off the queue."""
        taken, size = 0, 0
        for record in self._queue:
            if taken and size >= BATCH_BYTES:
                break
            taken += 1
            size += sum(len(f) for f in record)
        batch, self._queue = self._queue[:taken], self._queue[taken:]
        return batch

    def _failed(self, exc: BaseException) -> None:
        with self._cond:
            self._closed = True
            self._writing = False
            self._cond.notify()
        self.on_error(exc)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._writing or not (self._rest or self._queue)):
                    self._cond.wait()
                if self._closed:
                    return
                self._writing = True
                data, self._rest = self._rest, b""
                if self._queue:
                    data += framing.pack(self._take())
            try:
                self.sock.sendall(data)
            except OSError as exc:
                self._failed(exc)
                return
            with self._cond:
                self._writing = False


_holding = threading.local()  # senders: the _Senders a sends_held on this thread holds records of (None: none);
#                               ending: what runs at its end (at_hold_end)


@contextlib.contextmanager
def sends_held() -> Iterator[None]:
    """Records put on this thread inside go out at its end, one frame per sender, instead of one write each
    (an answer that serves several reads, a frame of several calls: one system call, and one wake of the
    reader at the other end, for all of them). Nested: the outermost one writes. Hold only work that does
    not wait: what is held waits for it."""
    if getattr(_holding, "senders", None) is not None:
        yield
        return
    senders: dict[_Sender, None] = {}
    ending: dict[Callable[[], None], None] = {}
    _holding.senders, _holding.ending = senders, ending
    try:
        yield
    finally:
        # each step and each flush on its own: one that fails must not leave the others' records unsent
        try:
            while ending:  # each once, in order; what they put is held too
                step = next(iter(ending))
                del ending[step]
                try:
                    step()
                except Exception:
                    log.exception("a step at the end of held sends failed")
        finally:
            _holding.senders = _holding.ending = None
            for sender in senders:
                try:
                    sender.flush()
                except Exception:
                    log.exception("a held send failed")


def at_hold_end(step: Callable[[], None]) -> bool:
    """Run `step` at the end of this thread's sends_held, once however often asked (False: no hold here;
    the caller runs it itself): what several calls of one frame each would send (a read-index ask) is sent
    once for all of them."""
    ending = getattr(_holding, "ending", None)
    if ending is None:
        return False
    ending[step] = None
    return True


# ---- the core's side --------------------------------------------------------------------------------

class _Details:
    """grpc.HandlerCallDetails for a call off the channel."""

    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str, metadata: Metadata) -> None:
        self.method = method
        self.invocation_metadata = metadata


class ChannelContext(LocalContext):
    """A servicer context for a call off the channel: its caller (peer, auth context) is set by the
    interceptors from the worker's CALLER header, its status kept for the answer. `deadline`: the
    caller's, on time.monotonic(). Cancelled when its worker says so (the worker's call ended), and ended
    when answered: either way, as gRPC's, it is no longer active and its callbacks are called, once."""

    answers_later = False  # the service may answer with a Later (WriteChannelServer's writes: NameServerService.write)

    def __init__(self, deadline: float | None, metadata: Metadata) -> None:
        super().__init__(None, metadata)  # type: ignore[arg-type]  # binary values pass through
        self._deadline = deadline
        self._callbacks: list[Callable[[], None]] | None = []  # None once ended
        self._ending = threading.Lock()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._ending:
            if self._callbacks is None:
                return False  # ended already: not called (as gRPC's)
            self._callbacks.append(callback)
            return True

    def cancel(self) -> None:
        super().cancel()
        self.end()

    def end(self) -> None:
        with self._ending:
            callbacks, self._callbacks = self._callbacks or [], None
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a callback's bug must not take the channel's reader down
                log.exception("write channel: a call's callback failed")

    def peer(self) -> str:
        return "unix:" + SOCKET_NAME

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def abort(self, code: grpc.StatusCode, details: str) -> NoReturn:
        raise LocalRpcError(code, details, self._trailing)

    def trailing(self) -> Metadata:
        return tuple(self._trailing)


class WriteCalls:
    """A write method called as the core's gRPC server calls it: the same interceptors around the
    same servicer methods. `interceptors`: outermost first, as grpc.server takes them."""

    def __init__(self, servicer: Any, interceptors: Sequence[grpc.ServerInterceptor]) -> None:
        self.interceptors = tuple(interceptors)
        self._intercepted: dict[tuple[str, Metadata], Any] = {}  # (method, metadata): its handler (handler)
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}
        for name in WRITE_METHODS:
            m = NAMESERVER.methods_by_name[name]
            self.handlers[method_path(name)] = grpc.unary_unary_rpc_method_handler(
                getattr(servicer, name), request_deserializer=getattr(api_pb2, m.input_type.name).FromString,
                response_serializer=getattr(api_pb2, m.output_type.name).SerializeToString)

    def call(self, method: str, request: bytes, context: ChannelContext) -> Answer:
        """The call's answer, waited for (start's, on this thread)."""
        answered: list[Answer] = []
        done = threading.Event()

        def answer(outcome: Answer) -> None:
            answered.append(outcome)
            done.set()

        self.start(method, request, context, answer)
        done.wait()
        return answered[0]

    def start(self, method: str, request: bytes, context: ChannelContext, answer: Callable[[Answer], None]) -> None:
        """Run the call; `answer(its answer)` when it is there: at once, or, for a reply that comes later (a
        write answered from the core's apply: Later), on the thread that makes it. The context ends first."""
        try:
            outcome = self._answer(method, request, context)
        except WouldBlock:
            raise  # nothing was done: the call runs again where it may wait, on the same context
        except BaseException:
            context.end()
            raise
        if isinstance(outcome, Later):
            outcome.then(lambda got: self._answered(got.result(), context, answer))
        else:
            self._answered(outcome, context, answer)

    @staticmethod
    def _answered(outcome: Answer, context: ChannelContext, answer: Callable[[Answer], None]) -> None:
        context.end()
        answer(outcome)

    def handler(self, method: str, metadata: Metadata) -> Any:
        """The method's handler wrapped by the interceptors, as grpcio's server would build it; None when an
        interceptor serves no handler. Built once per distinct method and metadata (a worker's calls for a
        client mostly repeat both: its CALLER header names the client's connection): what an interceptor's
        intercept_service returns depends on those alone, and the per-call checks run in the handler it
        returns (grpcserver.interceptors; the Go front end's worker keeps its handlers the same way,
        frontchannel.FrontServer._handler). A method not in `handlers` is never kept."""
        key = (method, metadata)
        handler = self._intercepted.get(key, _NOT_KEPT)
        if handler is not _NOT_KEPT:
            return handler
        details = _Details(method, metadata)
        handler = self.handlers[method]
        for interceptor in reversed(self.interceptors):
            handler = interceptor.intercept_service(_returning(handler), details)
            if handler is None:
                break
        if len(self._intercepted) >= MAX_HANDLERS_KEPT:  # a bound, not an eviction order: start again
            self._intercepted.clear()
        self._intercepted[key] = handler
        return handler

    def _answer(self, method: str, request: bytes, context: ChannelContext) -> Answer | Later:
        """The call's answer, or a Later of it (a reply that comes later)."""
        if method not in self.handlers:
            return grpc.StatusCode.UNIMPLEMENTED, f"{method} is not a write of the channel", b"", ()
        handler = self.handler(method, context.invocation_metadata())
        if handler is None:
            return grpc.StatusCode.UNIMPLEMENTED, "", b"", ()

        def reply() -> Any:
            parsed = handler.request_deserializer(request) if handler.request_deserializer else request
            if handler.unary_unary:
                return handler.unary_unary(parsed, context)
            if handler.stream_unary:  # the call guard serves unary methods as request-streaming ones
                return handler.stream_unary(iter((parsed,)), context)
            raise LocalRpcError(grpc.StatusCode.UNIMPLEMENTED, "", ())

        first = _encoded(handler, method, context, reply)
        if not isinstance(first, Later):
            return first
        out = Later()
        first.then(lambda got: out.resolve(_encoded(handler, method, context, got.result)))
        return out


def _encoded(handler: Any, method: str, context: ChannelContext, reply: Callable[[], Any]) -> Answer | Later:
    """The answer of `reply()` (a Later as it is: encoded when it comes, by calling this again with its result):
    the reply's bytes, or the status of what it raised."""
    try:
        got = reply()
        if isinstance(got, Later):
            return got
        body = handler.response_serializer(got) if handler.response_serializer else got
        return grpc.StatusCode.OK, "", body, context.trailing()
    except LocalRpcError as exc:
        return exc.code(), exc.details(), b"", context.trailing()
    except WouldBlock:
        if not waiting_allowed():
            raise  # run where nothing may wait: the caller runs it again where it may (WriteChannelServer)
        log.exception("write channel call %s failed", method)
        return grpc.StatusCode.UNKNOWN, "Exception calling application: WouldBlock", b"", context.trailing()
    except Exception as exc:  # a servicer bug: what gRPC answers for one, and a log line
        log.exception("write channel call %s failed", method)
        return grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}", b"", context.trailing()


_NOT_KEPT = object()


def _returning(handler: Any) -> Callable[[Any], Any]:
    """An interceptor's continuation: the handler within."""
    return lambda _details: handler


def readable(link: socket.socket) -> Any:
    """A poll of `link` for waiting bytes (not select.select: it refuses descriptors past 1,023, and a core
    may hold more); its poll(0) says whether a frame's bytes wait."""
    waiting = select.poll()
    waiting.register(link, select.POLLIN)
    return waiting


class WriteChannelServer(framing.LinkServer):
    """The core's end: the socket, a reader per worker link, the calls on a pool, answers batched back."""

    def __init__(self, path: str, calls: WriteCalls, threads: int, max_request_bytes: int,
                 read_index: StartReadIndex | None = None, inline: frozenset[str] = frozenset()) -> None:
        """`read_index`: the core's read index without a waiting thread (NameServerNode.start_linearizable_index):
        a READ_INDEX ask is then answered from the link's reader thread or the Raft tick thread, no pool
        thread and no interceptors per ask, once the interceptors admitted an ask with the same metadata
        (see _read_index_here); without it every ask runs as a write does."""
        super().__init__(path, "write-channel")
        self.writes = calls
        self.read_index = read_index
        # the writes run on the link's reader thread, the pool's only when they would wait (_run_here)
        self.inline = frozenset(method_path(name).encode() for name in inline)
        self._admitted: set[tuple[bytes, ...]] = set()  # READ_INDEX asks' metadata the interceptors let through
        self.max_frame = BATCH_BYTES + max_request_bytes + framing.FRAME_SLACK
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="write-channel")
        self._lock = threading.Lock()
        self.calls = 0          # writes, read-index asks and frames received (/metrics)
        self.read_indexes = 0
        self.frames = 0
        self.cancels = 0        # cancels received (of calls still running or waiting)

    def stop(self) -> None:
        super().stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def serve(self, link: socket.socket) -> None:
        sender = _Sender(link, "write-channel-answers", lambda exc: framing.close(link))
        running: dict[bytes, ChannelContext] = {}  # this link's calls not answered yet, for their cancels
        waiting = readable(link)  # made once per link, not per pass
        reader = framing.FrameReader(link, self.max_frame)
        try:
            while bodies := self._waiting_frames(reader, waiting):
                calls: list[tuple[list[bytes], ChannelContext]] = []
                cancels = []
                for fields in (record for body in bodies for record in framing.unpack(body)):
                    if len(fields) == 1:
                        cancels.append(fields[0])
                        continue
                    if len(fields) < 4 or len(fields) % 2 or not fields[1].lstrip(b"-").isdigit():
                        raise ValueError("write channel: a call of the wrong shape")
                    ns = int(fields[1])
                    context = ChannelContext(None if ns == _NO_TIME else ns / 1e9, _metadata_of(fields[4:]))
                    calls.append((fields, context))
                with self._lock:
                    self.frames += len(bodies)
                    self.read_indexes += sum(1 for fields, _ in calls if fields[2] == _READ_INDEX)
                    self.calls += sum(1 for fields, _ in calls if fields[2] != _READ_INDEX)
                    running.update((fields[0], context) for fields, context in calls)
                    cancelled = [c for c in (running.get(call_id) for call_id in cancels) if c is not None]
                    self.cancels += len(cancelled)
                for context in cancelled:
                    context.cancel()
                for fields, context in calls:
                    if fields[2] == _READ_INDEX and self.read_index is not None and not fields[3] \
                            and tuple(fields[4:]) in self._admitted:
                        self._read_index_here(sender, fields, context, running)
                    elif fields[2] in self.inline and context.is_active():
                        self._run_here(sender, fields, context, running)
                    else:
                        self.pool.submit(self._run, sender, fields, context, running)
        except (OSError, ValueError, EOFError, RuntimeError) as exc:  # RuntimeError: the pool is shut down
            if self.listening:
                log.warning("write channel: a worker's link ended: %s", exc)
        finally:
            sender.close()

    def _waiting_frames(self, reader: framing.FrameReader, waiting: Any) -> list[bytes]:
        """The next frame, and every other one already waiting on the link (read with it, or on the socket:
        `waiting` polls it; at most MAX_WAITING_FRAMES); [] at the end of the link."""
        bodies: list[bytes] = []
        while len(bodies) < MAX_WAITING_FRAMES and (not bodies or reader.buffered() or waiting.poll(0)):
            body = reader.read_frame()
            if body is None:
                break
            bodies.append(body)
        return bodies

    def _run(self, sender: _Sender, fields: list[bytes], context: ChannelContext,
             running: dict[bytes, ChannelContext]) -> None:
        """Run a call and answer it: a write's answer may come later, from the core's apply, when no thread
        waits for it (NameServerService.write)."""
        call_id, method, request = fields[0], fields[2].decode(), fields[3]

        def answer(outcome: Answer) -> None:
            code, details, body, trailing = outcome
            with self._lock:
                if running.get(call_id) is context:
                    del running[call_id]
            if code == grpc.StatusCode.OK and fields[2] == _READ_INDEX and not request:
                with self._lock:
                    if len(self._admitted) >= MAX_ADMITTED:  # a bound, not an eviction order: start again
                        self._admitted.clear()
                    self._admitted.add(tuple(fields[4:]))
            sender.put([call_id, str(code.value[0]).encode(), details.encode(), body, *_metadata_fields(trailing)])

        if fields[2] != _READ_INDEX:
            context.answers_later = True
        try:
            self.writes.start(method, request, context, answer)
        except WouldBlock:
            raise  # _run_here's: the pool runs it again
        except BaseException:
            with self._lock:
                if running.get(call_id) is context:
                    del running[call_id]
            raise

    def _run_here(self, sender: _Sender, fields: list[bytes], context: ChannelContext,
                  running: dict[bytes, ChannelContext]) -> None:
        """A write run on the link's reader thread, with no hand-off to the pool: its interceptors and its
        servicer run to the proposal, and its answer comes from the apply (NameServerService.write). A step
        that would wait (no leader here, the budget full, a refusal to confirm through the log, a registration
        in parts) raises WouldBlock before anything was done (nameserver/core/nowait.py): then the pool runs
        the call from its start, as ever."""
        try:
            with no_wait():
                self._run(sender, fields, context, running)
        except WouldBlock:
            self.pool.submit(self._run, sender, fields, context, running)

    def _read_index_here(self, sender: _Sender, fields: list[bytes], context: ChannelContext,
                         running: dict[bytes, ChannelContext]) -> None:
        """A READ_INDEX ask answered without a pool thread: at once when the core leads under its lease, else
        from the Raft tick thread when the round or the leader's answer comes (an ask that way has no index:
        the pool's, as any ask). Only for metadata the interceptors admitted before (`_admitted`, added by
        _run): what they decide for READ_INDEX is a function of the method and the metadata alone (the
        worker's CALLER and token: grpcserver.interceptors), so they decide an ask like one they let
        through alike; an ask with any other metadata still meets them first."""
        call_id = fields[0]

        def answered(index: int | None) -> None:
            if index is None:  # the waiting way, with its fallbacks
                # RuntimeError: the pool is shut down (the core is stopping); the worker's ask times out
                with contextlib.suppress(RuntimeError):
                    self.pool.submit(self._run, sender, fields, context, running)
                return
            with self._lock:
                if running.get(call_id) is context:
                    del running[call_id]
            context.end()
            sender.put([call_id, b"0", b"", api_pb2.ReadIndexReply(read_index=index).SerializeToString()])

        assert self.read_index is not None
        index = self.read_index(answered)
        if index is not None:
            answered(index)


# ---- a worker's side --------------------------------------------------------------------------------



class _Link:
    def __init__(self, sock: socket.socket, on_error: Callable[[_Link, BaseException], None]) -> None:
        self.sock = sock
        self.pending: dict[bytes, Future[Answer]] = {}
        self.broken: str | None = None  # why it broke; a call that finds it broken fails at once
        self.sender = _Sender(sock, "write-channel-calls", lambda exc: on_error(self, exc))


class WriteChannel:
    """A worker's end: call() sends a write to the core and waits for its answer."""

    def __init__(self, path: str, max_reply_bytes: int) -> None:
        self.path = path
        self.max_frame = BATCH_BYTES + max_reply_bytes + framing.FRAME_SLACK
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._link: _Link | None = None

    def call(self, method: str, request: bytes, metadata: Metadata, time_left: float | None,
             alive: Callable[[], bool], on_end: Callable[[Callable[[], None]], bool] | None = None) -> Answer:
        """The core's answer; UNAVAILABLE when the link fails or the core does not answer in time (the
        write may have been made: a session's retry is answered from the session). When the caller's call
        ends first (`alive()` turns False, or `on_end`, gRPC's add_callback, calls back; or its time is
        spent) the core is told to cancel the call: a write it has not proposed yet never is."""
        answer, cancel = self.start(method, request, metadata, time_left)
        if on_end is not None and not on_end(cancel):
            cancel()  # the caller's call had ended already
        try:
            for _ in _waits(time_left):
                if not alive():
                    cancel()
                try:
                    return answer.result(timeout=_WAIT_STEP_S)
                except TimeoutError:
                    continue
            cancel((grpc.StatusCode.DEADLINE_EXCEEDED, "the node's core did not answer in time"))
            return answer.result()
        finally:
            cancel(None, False)

    def start(self, method: str, request: bytes, metadata: Metadata, time_left: float | None
              ) -> tuple[Future[Answer], Cancel]:
        """Send a call without waiting: its answer (set on the channel's reader thread, where a done callback
        of the Future runs; at once UNAVAILABLE when the link fails) and its cancel, which answers the call
        itself (CANCELLED, or DEADLINE_EXCEEDED once its time is spent) and tells the core when unanswered."""
        answer: Future[Answer] = Future()
        try:
            link = self._connected()
        except OSError as exc:
            answer.set_result((grpc.StatusCode.UNAVAILABLE, f"the node's core did not answer: {exc}", b"", ()))
            return answer, _answered
        call_id = _ID.pack(next(self._ids))
        with self._lock:
            broken = link.broken
            if broken is None:
                link.pending[call_id] = answer
        if broken is not None:
            answer.set_result((grpc.StatusCode.UNAVAILABLE, broken, b"", ()))
            return answer, _answered
        deadline = _NO_TIME if time_left is None else time.monotonic_ns() + max(0, int(time_left * 1e9))
        link.sender.put([call_id, str(deadline).encode(), method.encode(), request, *_metadata_fields(metadata)])

        def cancel(why: tuple[grpc.StatusCode, str] | None = None, tell: bool = True) -> None:
            with self._lock:
                waiting = link.pending.pop(call_id, None)
            if waiting is not None and tell:  # not answered yet (gRPC calls back at every call's end)
                link.sender.put([call_id])
                spent = deadline != _NO_TIME and time.monotonic_ns() >= deadline
                code, details = why or ((grpc.StatusCode.DEADLINE_EXCEEDED, "the caller's deadline passed") if spent
                                        else (grpc.StatusCode.CANCELLED, "the caller went away"))
                waiting.set_result((code, details, b"", ()))

        return answer, cancel

    def close(self) -> None:
        with self._lock:
            link, self._link = self._link, None
        if link is not None:
            self._broken(link, EOFError("closed"))

    def _connected(self) -> _Link:
        with self._lock:
            if self._link is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.connect(self.path)
                except OSError:
                    sock.close()
                    raise
                self._link = _Link(sock, self._broken)
                threading.Thread(target=self._read, args=(self._link,), name="write-channel-reader",
                                 daemon=True).start()
            return self._link

    def _read(self, link: _Link) -> None:
        error: BaseException = EOFError("the node's core closed the channel")
        try:
            reader = framing.FrameReader(link.sock, self.max_frame)
            while (body := reader.read_frame()) is not None:
                with sends_held():  # what the frame's answers run sends (replies to the front end) goes together
                    for fields in framing.unpack(body):
                        with self._lock:
                            answer = link.pending.pop(fields[0], None)
                        if answer is not None:
                            code = framing.status_code(int(fields[1]))
                            answer.set_result((code, fields[2].decode(), fields[3], _metadata_of(fields[4:])))
        except (OSError, ValueError, EOFError) as exc:
            error = exc
        self._broken(link, error)

    def _broken(self, link: _Link, error: BaseException) -> None:
        """Every call waiting on `link` fails; the next call connects again."""
        why = f"the node's core did not answer: the write channel closed ({error})"
        with self._lock:
            if self._link is link:
                self._link = None
            if link.broken is None:
                link.broken = why
            pending, link.pending = link.pending, {}
        link.sender.close()
        framing.close(link.sock)
        for answer in pending.values():
            if not answer.done():
                answer.set_result((grpc.StatusCode.UNAVAILABLE, why, b"", ()))


def _answered(why: tuple[grpc.StatusCode, str] | None = None, tell: bool = True) -> None:
    """The cancel of a call answered before it was sent: nothing to do."""


_WAIT_STEP_S = 0.5  # how often a waiting call looks whether its caller is still there


def _waits(time_left: float | None) -> Iterator[None]:
    """Steps of _WAIT_STEP_S until `time_left` (and a second's grace for the core's answer) is spent."""
    end = None if time_left is None else time.monotonic() + time_left + 1.0
    while end is None or time.monotonic() < end:
        yield None


__all__ = ["GIVEN_WRITE", "INLINE_WRITES", "WRITE_METHODS", "ChannelContext", "WriteCalls", "WriteChannel",
           "WriteChannelServer", "method_path", "socket_path"]
