"""The remoting listener: a TCP server (uvloop) on its own thread, handlers on a thread pool.

A cheap read (a route read) is answered on the fast path, in the connection's receive callback, when
nothing about it could wait or hold bytes (RemotingServer._fast); everything else takes the slow path:
a task, an in-flight slot, a reservation in the reply budget, the pool, the drain bound. Every bound
below holds on both.

A connection that sends a malformed frame (bad or oversize length, truncated, undecodable header) is
closed with one log line; other connections never notice. Requests on one connection are handled
concurrently (responses carry the request's opaque); oneway requests get no response.

What one connection can hold is bounded ([limits] in the node's TOML):
- a frame's header is at most remoting_max_header_bytes with at most remoting_max_ext_fields
  extFields (it is decoded on this listener's one thread: its size bounds what one frame can stall);
  a larger header is answered with an error and its connection closed before the rest is read;
- at most MAX_INFLIGHT_PER_CONNECTION requests, counted until their reply has left (written and
  drained), so a client that never reads its replies stops being read itself (TCP backpressure), and
  is closed when a reply stays unread for remoting_reply_timeout_ms;
- reply bytes being built or not yet sent: remoting_max_unsent_bytes_per_connection, and
  remoting_max_unsent_bytes for the node (replybudget.py): a connection at its share is not read until
  its replies are sent (closed after remoting_reply_timeout_ms), a request past the node's total is
  answered SYSTEM_BUSY;
- a frame, once begun, arrives whole within remoting_frame_timeout_ms (slow senders);
- a connection silent for remoting_idle_timeout_ms is closed (RocketMQ closes idle channels too);
  both by a periodic sweep of per-connection stamps (no timer per frame), within sweep_s past the bound;
- beyond remoting_max_connections, new connections are closed at once.

TLS ([remoting] tls, RocketMQ's tls.server.mode): "permissive" (the default when the node has a
certificate) peeks at each new connection's first byte and speaks TLS when it is a handshake record
(0x16), plain otherwise, so plain and `tls.enable=true` clients share the port; "enforcing" closes a
connection that does not start a handshake; "off" never speaks TLS. A failed handshake closes that
connection only. The peek and the handshake are bounded by remoting_frame_timeout_ms, and connections
still in them count against remoting_max_connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, cast

import uvloop

from nameserver.api.auth import NAMESERVER_SERVICE
from nameserver.api.inprocess import InProcessStub
from nameserver.config import REMOTING_CONNECTIONS_FLOOR, NodeConfig
from nameserver.core.nowait import WouldBlock, no_wait
from nameserver.remoting import codes, frame, memtrim
from nameserver.remoting.command import Command, FrameError, FrameRefused
from nameserver.remoting.handlers import INLINE_CODES, Handlers  # INLINE_CODES: route reads, on the loop
from nameserver.remoting.headercache import JsonHeaders
from nameserver.remoting.ratelog import RateLimitedLog
from nameserver.remoting.replybudget import SMALL_REPLY, ReplyBudget, Verdict

log = logging.getLogger("nameserver.remoting")

MAX_INFLIGHT_PER_CONNECTION = 16  # bounds memory per connection (each holds up to one frame and its reply)
WRITE_BUFFER_HIGH = 256 << 10  # unsent reply bytes above which a reply waits to be drained
TLS_HANDSHAKE_RECORD = 0x16    # the first byte of every TLS ClientHello
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on with no time: close() resets the connection
# A request whose code's first answer is awaited (replybudget.py) waits at most this long for it, then
# reserves as for a small reply: a slow first request (a read waiting for an election) holds up the
# others of its code no longer than this, and they are not refused for reservations either. What they
# turn out to hold is still bounded when built (admit: per connection and for the node).
PROBE_WAIT_S = 1.0
TRIM_DELAY_S = 1.0  # after the last large reply is released, for the transports and builds to let go of it
# A frame up to this size is copied out of the receive buffer twice (a slice, then its bytes: less work than a
# memoryview for a route read's ~200 bytes); a larger one once, through a view (no second copy of 16 MiB).
SMALL_FRAME = 64 << 10
READ_BUFFER_LIMIT = 128 << 10  # bytes read behind a handed-off frame past which the connection is not read
MIN_SWEEP_S, MAX_SWEEP_S = 0.05, 1.0  # how often idle and slow-frame bounds are checked (a quarter of the least)
# Connections the kernel completes before the listener accepts them (RocketMQ's serverSocketBacklog; asyncio
# defaults to 100, and a burst of brokers and clients past it waits out a 1 s SYN retry).
LISTEN_BACKLOG = 1024


class Connection(asyncio.Protocol):
    """One client connection: its bytes not yet framed, what its replies hold, and its requests in flight.

    Frames are cut out of what arrives (data_received) and answered at once when they take the fast path
    (RemotingServer._fast); any other frame is handed to a task, and the frames after it wait until that
    one has its in-flight slot and reservation (the connection is not read meanwhile past READ_BUFFER_LIMIT),
    as a stream reader waiting on them would."""

    __slots__ = ("server", "transport", "peer", "held", "tasks", "slots", "buf", "handing_off", "read_paused",
                 "write_paused", "drained", "frame_began", "active", "eof", "counted")

    def __init__(self, server: RemotingServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.held = 0  # bytes reserved for its replies being built, and of those written and not yet sent
        self.tasks: set[asyncio.Task] = set()
        self.slots = asyncio.Semaphore(server.inflight_per_connection)
        self.buf = bytearray()        # received, not yet a whole frame (or waiting behind a hand-off)
        self.handing_off = False      # a frame waits for its slot or reservation: the frames after it wait too
        self.read_paused = False
        self.write_paused = False     # the transport holds more than WRITE_BUFFER_HIGH unsent
        self.drained: list[asyncio.Future[None]] = []  # replies waiting for the transport to have room
        self.frame_began: float | None = None  # when the partial frame in buf began (remoting_frame_timeout_ms)
        self.active = time.monotonic()  # when it last had a frame or request in progress (remoting_idle_timeout_ms)
        self.eof = False
        self.counted = False          # admitted: one of the server's connections

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.server._opened(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.server._received(self)

    def eof_received(self) -> bool:
        self.eof = True
        self.server._received(self)
        # half-open: frames waiting behind a hand-off are still handled (_received closes it). A TLS
        # transport closes itself here whatever this says (and warns when told otherwise).
        return self.transport is not None and self.transport.get_extra_info("sslcontext") is None

    def connection_lost(self, exc: Exception | None) -> None:
        self.write_paused = False
        self._wake()
        self.server._lost(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake()

    def _wake(self) -> None:
        waiters, self.drained = self.drained, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self.active = time.monotonic()  # the idle bound counts from its last request's end

    def waiting(self) -> bool:
        """A request of its is still in progress (a finished task may wait a turn of the loop to leave `tasks`)."""
        return bool(self.tasks) and any(not task.done() for task in self.tasks)

    def closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    async def drain(self) -> None:
        """Return once the transport holds no more than WRITE_BUFFER_HIGH unsent (as StreamWriter.drain)."""
        if self.closing():
            raise ConnectionResetError("connection closed")
        if self.write_paused:
            waiter = asyncio.get_running_loop().create_future()
            self.drained.append(waiter)
            await waiter
            if self.closing():
                raise ConnectionResetError("connection closed")


class FrontEnd(Protocol):
    """A remoting worker's split (nameserver/remoting/corechannel.py): the codes it answers itself, and
    the node's core for the rest."""

    local_codes: frozenset[int]

    async def forward(self, cmd: Command, conn: Connection) -> Command: ...

    async def settle(self, conn: Connection) -> None: ...  # before a local read: the connection's writes seen

    def settled(self, conn: Connection) -> bool: ...  # settle would not wait

    def closed(self, conn: Connection) -> None: ...


class RequestHandlers(Protocol):
    """What the listener needs of a protocol's handlers (remoting/handlers.py, remoting/controller.py)."""

    @property
    def supported_codes(self) -> list[int]: ...

    def handle(self, req: Command, conn: object | None = None) -> Command: ...

    def connection_closed(self, conn: object) -> None: ...


def split_addr(addr: str) -> tuple[str, int]:
    """"host:port", "[v6]:port" or ":port" (all interfaces) to (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"remoting listen address {addr!r} is not host:port")
    return host.strip("[]"), int(port)


class RemotingServer:
    def __init__(self, cfg: NodeConfig, servicer: Any, listen_addr: str | None = None,
                 max_frame_bytes: int = frame.DEFAULT_MAX_FRAME, workers: int = 16,
                 call_timeout_s: float | None = None, max_connections: int | None = None,
                 observer: Callable[[str, int, float], None] | None = None,
                 handlers: RequestHandlers | None = None, reuse_port: bool = False,
                 unix_path: str = "", front: FrontEnd | None = None,
                 inflight_per_connection: int = MAX_INFLIGHT_PER_CONNECTION, accept_later: bool = False) -> None:
        """`reuse_port`: bind with SO_REUSEPORT (a node's core and its workers share the port);
        `unix_path`: listen on this Unix socket instead (mode 0600, made fresh), without TLS;
        `front`: a worker's split between codes answered here and the core (see FrontEnd);
        `accept_later`: start() binds the port but does not listen, so connecting is refused, until
        accept_connections() (a starting node: docs/remoting.md, "A starting node")."""
        self.listen_addr = unix_path or listen_addr or cfg.remoting_addr
        self.unix_path = unix_path
        self.reuse_port = reuse_port
        self.front = front
        self.inflight_per_connection = inflight_per_connection
        self.accept_later = accept_later and not unix_path
        self.accepting = False  # listening (set on the listener's thread)
        self.max_frame = max_frame_bytes
        self.max_connections = max_connections or cfg.remoting_max_connections or REMOTING_CONNECTIONS_FLOOR
        self.idle_s = cfg.remoting_idle_timeout_ms / 1000
        self.frame_s = cfg.remoting_frame_timeout_ms / 1000
        self.reply_s = cfg.remoting_reply_timeout_ms / 1000
        self.max_header = cfg.remoting_max_header_bytes
        self.max_ext_fields = cfg.remoting_max_ext_fields
        self.json_headers = JsonHeaders(self.max_ext_fields)  # used on the listener's thread only
        self.budget = ReplyBudget(cfg.remoting_max_unsent_bytes_per_connection, cfg.remoting_max_unsent_bytes)
        # what clients' bad frames and unread replies make us log: a few lines per 10 s, values cut short
        self.bad_log = RateLimitedLog(log)
        self.refused_total = 0  # connections closed at accept (over the limit)
        self.inline_fallbacks = 0  # inline reads that found the state busy and went to a worker
        self.fast_total = 0  # requests answered on the fast path (_fast)
        self._refusal_logged = 0.0
        # The node's gRPC servicer, called in-process; with [auth] on, every call has [remoting] role's
        # rights (the protocol carries no credentials).
        # Another protocol on the same machinery (the controller's port) brings its own handlers.
        role = (cfg.remoting_role or "peer") if cfg.auth_enabled else ""
        self.handlers: RequestHandlers = handlers or Handlers(
            InProcessStub(servicer, NAMESERVER_SERVICE, role), cfg, call_timeout_s or cfg.write_timeout_ms / 1000)
        # Told of every answered request: (request code, or "other" for one we do not serve, so a
        # client cannot grow the label set; response code; seconds from frame to answer).
        self.observer = observer
        self._served = frozenset(self.handlers.supported_codes)
        self._freed: asyncio.Future[None] | None = None  # done when reply bytes were last released
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="remoting")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._conns: set[Connection] = set()
        # how often idle and slow-frame connections are looked for: a bound is enforced within this much of it
        self.sweep_s = min(MAX_SWEEP_S, max(MIN_SWEEP_S, min(self.idle_s, self.frame_s) / 4))
        self._sweeper: asyncio.TimerHandle | None = None
        self.tls_mode = "off" if unix_path else cfg.remoting_tls_mode
        self._ssl = tls_server_context(cfg) if self.tls_mode != "off" else None
        self._opening = 0  # accepted connections still in the TLS peek or handshake
        self._listener: socket.socket | None = None  # with TLS, the listening socket (no asyncio.Server)
        self.port = 0  # the bound port (useful with port 0)

    @property
    def connections(self) -> int:
        """Client connections open now, those still in the TLS peek or handshake too (read from other
        threads: plain reads, no lock)."""
        return len(self._conns) + self._opening

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Bind and serve; raises here if the address cannot be bound."""
        self._thread = threading.Thread(target=self._run, name="remoting-io", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise OSError(f"remoting: cannot listen on {self.listen_addr}: {self._error}") from self._error
        log.info("remoting (RocketMQ protocol) %s on %s, at most %d connections",
                 "bound, not yet accepting," if self.accept_later else "listening", self.listen_addr,
                 self.max_connections)

    def _run(self) -> None:
        loop = uvloop.new_event_loop()  # libuv's loop: a third less CPU per request than asyncio's (docs/benchmarks.md)
        self._loop = loop
        try:
            if self.unix_path:
                self._server = loop.run_until_complete(self._start_unix())
            elif self._ssl is None:
                host, port = split_addr(self.listen_addr)
                self._server = cast(asyncio.Server, loop.run_until_complete(  # uvloop's Server has its members
                    loop.create_server(self._connection, host or None, port, reuse_address=True,
                                       reuse_port=self.reuse_port or None, start_serving=False,
                                       backlog=LISTEN_BACKLOG)))
            else:  # connections are accepted here and peeked at before a stream is made of them
                host, port = split_addr(self.listen_addr)
                self._listener = bound_socket(host, port, self.reuse_port)
            self._sweeper = loop.call_later(self.sweep_s, self._sweep)
            if not self.accept_later:
                loop.run_until_complete(self._listen())
            if self._listener is not None:
                self.port = self._listener.getsockname()[1]
            elif self._server is not None and not self.unix_path:
                self.port = self._server.sockets[0].getsockname()[1]
        except (OSError, ValueError) as exc:
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def accept_connections(self) -> None:
        """Listen (once): from now on connections are accepted. For a server made with accept_later."""
        loop = self._loop
        if self.accepting or loop is None or self._error is not None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._listen(), loop).result(timeout=5)
        except Exception as exc:  # stopping meanwhile, or listen() failed: the node serves on without this port
            log.warning("remoting: could not start accepting connections on %s: %s", self.listen_addr, exc)
            return
        log.info("remoting: accepting connections on %s", self.listen_addr)

    async def _listen(self) -> None:
        if self.accepting:
            return
        self.accepting = True
        if self._server is not None:
            await self._server.start_serving()
        elif self._listener is not None:
            self._listener.listen(LISTEN_BACKLOG)
            asyncio.get_running_loop().create_task(self._accept_loop(self._listener))

    async def _start_unix(self) -> asyncio.Server:
        """A private socket only this user may open, made fresh (a stale one from a killed node is removed),
        in a directory only this user may enter: no window in which another user could connect."""
        folder = os.path.dirname(self.unix_path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.unix_path)
        server = await asyncio.get_running_loop().create_unix_server(self._connection, self.unix_path)
        os.chmod(self.unix_path, 0o600)
        return server

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None or self._error is not None or loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=5)
        except Exception:  # stopping must not fail the node's shutdown
            log.exception("remoting: error while closing connections")
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._listener is not None:
            self._listener.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self._conns):
            self._end(conn)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- TLS: accept, peek, maybe handshake -----------------------------------------------------

    async def _accept_loop(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        listener.setblocking(False)
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, or closing
                if listener.fileno() < 0:
                    return
                log.warning("remoting: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            loop.create_task(self._open(sock))

    async def _open(self, sock: socket.socket) -> None:
        """Peek at the first byte; make a plain or TLS stream of the connection and serve it."""
        loop = asyncio.get_running_loop()
        peer = sock.getpeername() if sock.fileno() >= 0 else ("?", 0)
        peer_s = f"{peer[0]}:{peer[1]}"
        if len(self._conns) + self._opening >= self.max_connections:
            self.refused_total += 1
            sock.close()
            return
        self._opening += 1
        try:
            try:
                first = await asyncio.wait_for(self._peek(loop, sock), self.frame_s)
            except (TimeoutError, OSError):
                sock.close()
                return
            if first is None:  # closed before sending anything (a port probe): nothing to say
                sock.close()
                return
            tls = first == TLS_HANDSHAKE_RECORD
            if not tls and self.tls_mode == "enforcing":
                log.warning("remoting: closing connection from %s: not TLS ([remoting] tls = \"enforcing\")",
                            peer_s)
                sock.close()
                return
            try:  # served from here on by the Connection (its connection_made)
                await loop.connect_accepted_socket(self._connection, sock, ssl=self._ssl if tls else None,
                                                   ssl_handshake_timeout=self.frame_s if tls else None)
            except (ssl.SSLError, OSError, TimeoutError) as exc:
                log.warning("remoting: closing connection from %s: TLS handshake failed: %s", peer_s, exc)
                sock.close()
        finally:
            self._opening -= 1

    def _connection(self) -> Connection:
        return Connection(self)

    @staticmethod
    async def _peek(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> int | None:
        """The connection's first byte, left unread; None when it closes before sending one."""
        sock.setblocking(False)
        while True:
            ready = loop.create_future()
            loop.add_reader(sock.fileno(), ready.set_result, None)
            try:
                await ready
            finally:
                loop.remove_reader(sock.fileno())
            try:
                data = sock.recv(1, socket.MSG_PEEK)
            except BlockingIOError:
                continue
            return data[0] if data else None

    # ---- connections ---------------------------------------------------------------------------

    def _opened(self, conn: Connection) -> None:
        transport = conn.transport
        assert transport is not None
        peer = transport.get_extra_info("peername")
        conn.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else (str(peer) or f"unix:{self.unix_path}")
        if len(self._conns) >= self.max_connections:
            self.refused_total += 1
            now = time.monotonic()
            if now - self._refusal_logged > 10:  # one line per 10 s, however many are refused
                self._refusal_logged = now
                log.warning("remoting: %d connections open (limits.remoting_max_connections); refusing new "
                            "ones, such as %s (%d refused so far)", len(self._conns), conn.peer, self.refused_total)
            transport.abort()
            return
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        conn.counted = True
        self._conns.add(conn)

    def _received(self, conn: Connection) -> None:
        """Frame and answer what `conn` has received, up to a frame that is handed off (or the end)."""
        buf = conn.buf
        try:
            while not conn.handing_off:
                size = frame.whole(buf, self.max_frame, self.max_header)
                if not size:
                    break
                if size <= SMALL_FRAME:  # a slice and its bytes: cheaper than a view for a few hundred bytes
                    payload = bytes(buf[4:size])
                else:
                    with memoryview(buf) as view:  # one copy of a large frame, not a slice and then its bytes
                        payload = bytes(view[4:size])
                del buf[:size]
                conn.frame_began = None
                cmd = frame.decode(payload, self.max_header, self.max_ext_fields, self.json_headers.decode)
                del payload
                if cmd.is_response:
                    # A nameserver sends no requests, so no response can be ours.
                    log.debug("remoting: ignoring a response frame from %s (opaque %d)", conn.peer, cmd.opaque)
                elif not self._fast(conn, cmd):
                    self._hand_off(conn, cmd)
        except FrameError as exc:
            self.bad_log.warning("remoting: closing connection from %s: %s", conn.peer, str(exc))
            if isinstance(exc, FrameRefused) and not conn.closing():  # its opaque is unknown: the answer carries 0
                assert conn.transport is not None
                conn.transport.write(frame.encode(Command(
                    code=codes.SYSTEM_ERROR, flag=codes.FLAG_RESPONSE, version=codes.SERVER_VERSION,
                    remark=str(exc), serialize_type=exc.serialize_type)))
            self._end(conn)
            return
        if conn.handing_off:
            if len(buf) > READ_BUFFER_LIMIT and not conn.read_paused and not conn.closing():
                assert conn.transport is not None
                conn.read_paused = True
                conn.transport.pause_reading()
            return
        if conn.eof:
            if buf:
                self.bad_log.warning("remoting: closing connection from %s: truncated frame (%d bytes of a frame)",
                                     conn.peer, len(buf))
            self._end(conn)
        elif buf:
            if conn.frame_began is None:
                conn.frame_began = time.monotonic()
        else:
            conn.active = time.monotonic()

    def _end(self, conn: Connection) -> None:
        """Close the connection (what was written goes first); frames not yet handled are dropped."""
        conn.buf.clear()
        conn.handing_off = False
        if conn.transport is not None:
            conn.transport.close()

    def _lost(self, conn: Connection) -> None:
        conn.buf.clear()
        if not conn.counted:
            return
        conn.counted = False
        self._conns.discard(conn)
        if self.front is not None:
            self.front.closed(conn)
        # Brokers that spoke on it lose this connection (off the loop: it is a gRPC call).
        with contextlib.suppress(RuntimeError):  # the pool is shut down: the node is stopping
            asyncio.get_running_loop().run_in_executor(self._pool, self.handlers.connection_closed, conn)

    def _fast(self, conn: Connection, cmd: Command) -> bool:
        """Answer a cheap read here and now, when it is one whose answer holds nothing past this call: a code
        answered on this loop (INLINE_CODES; in a worker, one it answers itself, the connection's writes
        seen), its reply known to be small, nothing of the connection's held or in flight before it (its
        requests are answered in order), and the transport with room for the reply without waiting (below
        the level at which a reply's drain would wait). False: the slow path answers it (nothing was sent)."""
        code = cmd.code
        if code not in INLINE_CODES or cmd.is_oneway or conn.held or conn.waiting():
            return False
        front = self.front
        if front is not None and cmd.invalid is None and (code not in front.local_codes or not front.settled(conn)):
            return False
        expected = self.budget.expected(code)
        transport = conn.transport
        if expected is None or expected + len(cmd.body) > SMALL_REPLY or transport is None or \
                transport.is_closing() or transport.get_write_buffer_size() + expected > WRITE_BUFFER_HIGH:
            return False
        started = time.monotonic()
        try:
            answered = self._inline(cmd, conn, fallback_counted=False)  # the slow path's try counts it
        except Exception as exc:  # a handler bug answers SYSTEM_ERROR, never kills the server
            log.exception("remoting: request code %d from %s failed", code, conn.peer)
            answered = cmd.response(codes.SYSTEM_ERROR, f"internal error: {exc}")
        if answered is None:
            return False
        resp = answered
        data = frame.encode(resp)
        self.budget.learn(code, len(data))
        if self.observer is not None:
            self.observer(str(code), resp.code, time.monotonic() - started)
        if len(data) > SMALL_REPLY or transport.get_write_buffer_size() + len(data) > WRITE_BUFFER_HIGH:
            self._spawn(conn, self._late_reply(conn, cmd, data))  # larger than its code's replies so far
        else:
            self.fast_total += 1  # before the write: a test reading it after the reply sees it
            transport.write(data)
        return True

    async def _late_reply(self, conn: Connection, cmd: Command, data: bytes) -> None:
        """A fast-path answer that does not fit as one: sent as a slow-path reply (in flight, budgeted)."""
        async with conn.slots:
            await self._reply(conn, cmd, data)

    def _hand_off(self, conn: Connection, cmd: Command) -> None:
        conn.handing_off = True
        self._spawn(conn, self._slow(conn, cmd))

    @staticmethod
    def _spawn(conn: Connection, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        conn.tasks.add(task)
        task.add_done_callback(conn.done)

    async def _slow(self, conn: Connection, cmd: Command) -> None:
        """A request off the fast path: it waits for an in-flight slot and its reservation (the connection's
        later frames wait with it), then is answered on its own."""
        # The slot is held until the reply has been drained: replies nobody reads count against the
        # connection's in-flight requests, so its reader stops (backpressure) instead of queueing more.
        slots = conn.slots
        await slots.acquire()
        try:
            try:
                reserved = await self._reserve(conn, cmd)
            except TimeoutError:
                self._unread(conn)
                return
            self._read_on(conn)
            if cmd.is_oneway:
                await self._answered(cmd, conn, reserved)
            else:  # no local here holds the reply: it is freed as soon as the transport has its copy
                await self._reply(conn, cmd, await self._answered(cmd, conn, reserved))
        finally:
            slots.release()

    def _read_on(self, conn: Connection) -> None:
        """A handed-off frame got its slot and reservation: the frames after it are read and handled."""
        conn.handing_off = False
        if conn.read_paused and not conn.closing():
            assert conn.transport is not None
            conn.read_paused = False
            conn.transport.resume_reading()
        conn.frame_began = None  # a frame waiting behind the hand-off gets its whole bound from now
        self._received(conn)

    def _sweep(self) -> None:
        """Close connections idle past remoting_idle_timeout_ms, or with a frame begun longer ago than
        remoting_frame_timeout_ms: stamps read every SWEEP period, no timer per frame."""
        loop = asyncio.get_running_loop()
        self._sweeper = loop.call_later(self.sweep_s, self._sweep)
        now = time.monotonic()
        for conn in list(self._conns):
            if conn.handing_off or conn.closing():
                continue  # not read now (waiting for room): not the client's doing
            if conn.frame_began is not None:
                if now - conn.frame_began > self.frame_s:
                    self.bad_log.info("remoting: closing connection from %s: a frame took longer than %.0f s to "
                                      "arrive", conn.peer, self.frame_s)
                    self._end(conn)
            elif not conn.tasks and now - conn.active > self.idle_s:
                # waiting for its replies is not idle (a big registration may take a minute)
                self.bad_log.info("remoting: closing connection from %s: idle for %.0f s", conn.peer, self.idle_s)
                self._end(conn)

    def _inline(self, cmd: Command, conn: object, fallback_counted: bool = True) -> Command | None:
        """Answer a cheap read on the loop thread when nothing would block it; None: use a worker."""
        try:
            with no_wait():
                return self.handlers.handle(cmd, conn)
        except WouldBlock:
            self.inline_fallbacks += fallback_counted
            return None

    async def _reserve(self, conn: Connection, cmd: Command) -> int | None:
        """Reserve what the request and its reply may hold while it is handled: the bytes reserved, or None when
        the node has no room (the request is answered SYSTEM_BUSY). While the connection holds its share,
        this waits (the connection is not read meanwhile); TimeoutError after remoting_reply_timeout_ms."""
        # the request's body is held until it is handled too: a frame may be 16 MiB
        replied = cmd.code in self._served and not cmd.is_oneway
        reply: int | None = None if replied else 0
        probe = held = False  # this request is its code's first (replybudget.py); its reservation is held
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.reply_s
        probe_wait_until = loop.time() + PROBE_WAIT_S
        try:
            while True:
                if reply is None:  # still None: the first request of its never-answered code is being answered
                    probe = not self.budget.knows(cmd.code)
                    reply = self.budget.need(cmd.code)
                    probe = probe and reply is not None
                    if reply is None and loop.time() >= probe_wait_until:
                        reply = SMALL_REPLY  # that first one is slow: go ahead, as a small reply (never BUSY)
                need = len(cmd.body) + (reply or 0)
                if (verdict := Verdict.WAIT if reply is None else self.budget.reserve(conn.held, need)) \
                        is not Verdict.WAIT:
                    break
                if self._freed is None or self._freed.done():
                    self._freed = loop.create_future()
                if loop.time() >= deadline:
                    raise TimeoutError
                until = deadline if reply is not None else min(deadline, probe_wait_until)
                await asyncio.wait([self._freed], timeout=until - loop.time())  # does not cancel it
            if verdict is Verdict.BUSY:
                return None
            self._hold(conn, need)
            held = True
            return need
        finally:
            if probe and not held:  # refused, timed out or cancelled: the next request of the code probes
                self.budget.unprobe(cmd.code)

    def _hold(self, conn: Connection, size: int) -> None:
        conn.held += size
        self.budget.charge(size)

    def _release(self, conn: Connection, size: int) -> None:
        conn.held -= size
        if self.budget.release(size):  # after large replies: freed memory back to the system, off the loop
            loop = asyncio.get_running_loop()
            loop.call_later(TRIM_DELAY_S, self._give_back, loop)
        if size and self._freed is not None and not self._freed.done():
            self._freed.set_result(None)  # connections waiting for room look again

    def _give_back(self, loop: asyncio.AbstractEventLoop) -> None:
        with contextlib.suppress(RuntimeError):  # the pool is shut down: the node is stopping
            loop.run_in_executor(self._pool, memtrim.give_back)

    async def _answered(self, cmd: Command, conn: Connection, reserved: int | None) -> bytes:
        """The request's response frame (empty for a oneway request); its reservation released."""
        learns = reserved is not None and cmd.code in self._served and not cmd.is_oneway
        try:
            resp = await self._answer(cmd, conn) if reserved is not None else self._busy(cmd, conn)
            data = b"" if cmd.is_oneway else frame.encode(resp)
            if learns:  # before the reservation goes: requests waiting for the code's first answer see it
                self.budget.learn(cmd.code, len(data))
            return data
        finally:
            if learns:
                self.budget.unprobe(cmd.code)  # answered or not, the code's first answer is no longer awaited
            cmd.body = b""  # handled: what was reserved for it is free again
            self._release(conn, reserved or 0)

    def _busy(self, cmd: Command, conn: Connection) -> Command:
        self.bad_log.warning("remoting: answering %s (code %d) SYSTEM_BUSY: the node's replies hold "
                             "limits.remoting_max_unsent_bytes (%d)", conn.peer, cmd.code, self.budget.node)
        return cmd.response(codes.SYSTEM_BUSY, "[REMOTING_UNSENT_BYTES] the node's replies not yet sent are at "
                            f"limits.remoting_max_unsent_bytes ({self.budget.node} bytes); try again later")

    async def _answer(self, cmd: Command, conn: Connection) -> Command:
        started = time.monotonic()
        try:
            resp = None
            if self.front is not None and cmd.invalid is None:  # a worker: the core answers what it does not
                if cmd.code not in self.front.local_codes:
                    resp = await self.front.forward(cmd, conn)
                else:
                    await self.front.settle(conn)
            if resp is None and cmd.code in INLINE_CODES:
                resp = self._inline(cmd, conn)
            if resp is None:
                resp = await asyncio.get_running_loop().run_in_executor(self._pool, self.handlers.handle, cmd, conn)
        except Exception as exc:  # a handler bug answers SYSTEM_ERROR, never kills the server
            log.exception("remoting: request code %d from %s failed", cmd.code, conn.peer)
            resp = cmd.response(codes.SYSTEM_ERROR, f"internal error: {exc}")
        if self.observer is not None:
            self.observer(str(cmd.code) if cmd.code in self._served else "other", resp.code,
                          time.monotonic() - started)
        log.debug("remoting: %s code %d opaque %d -> %d", conn.peer, cmd.code, cmd.opaque, resp.code)
        return resp

    async def _reply(self, conn: Connection, cmd: Command, data: bytes) -> None:
        """Write a reply within the connection's and the node's unsent-bytes budget; return once it is
        sent (drained), or its connection is closed."""
        transport, budget = conn.transport, self.budget
        if transport is None or transport.is_closing():
            return
        verdict = budget.admit(conn.held, len(data))
        if verdict is Verdict.CLOSE:
            self.bad_log.warning(
                "remoting: closing connection from %s: it does not read its replies (%d bytes held, and a "
                "reply of %d would pass limits.remoting_max_unsent_bytes_per_connection, %d)",
                conn.peer, conn.held, len(data), budget.per_connection)
            self._abort(conn)
            return
        if verdict is Verdict.BUSY:
            data = frame.encode(self._busy(cmd, conn))
        size = len(data)
        self._hold(conn, size)
        try:
            transport.write(data)
            del data  # the transport holds its own copy: nothing else keeps the reply while it waits
            if conn.write_paused:
                async with asyncio.timeout(self.reply_s):
                    await conn.drain()
        except TimeoutError:
            self._unread(conn)
        except (ConnectionError, RuntimeError) as exc:
            log.info("remoting: could not answer %s (code %d): %s", conn.peer, cmd.code, exc)
        finally:
            self._release(conn, size)

    def _unread(self, conn: Connection) -> None:
        self.bad_log.warning("remoting: closing connection from %s: its replies went unread for %.0f s",
                             conn.peer, self.reply_s)
        self._abort(conn)

    @staticmethod
    def _abort(conn: Connection) -> None:
        """Close a connection now, its unsent replies dropped and its requests not yet handled cancelled."""
        transport = conn.transport
        if transport is None:
            return
        sock = transport.get_extra_info("socket")
        if sock is not None:  # a reset: the kernel drops what it still buffers for the client too
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        conn.buf.clear()
        transport.abort()
        current = asyncio.current_task()
        for task in conn.tasks:
            if task is not current:
                task.cancel()


def bound_socket(host: str, port: int, reuse_port: bool) -> socket.socket:
    """A TCP socket bound to (host, port), not yet listening: a connection to it is refused."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # as socket.create_server: IPv6 only, no dual stack
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def tls_server_context(cfg: NodeConfig) -> ssl.SSLContext:
    """The remoting port's TLS: the node's own certificate; client certificates required and verified
    against tls.ca_file when tls.client_auth = "require"."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cfg.tls_cert_file, cfg.tls_key_file)
    if cfg.tls_client_auth == "require":
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cfg.tls_ca_file)
    return ctx
