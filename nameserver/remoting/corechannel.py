"""The local channel between a node's core and its remoting worker processes (docs/architecture.md).

The core serves the remoting protocol on a private Unix socket too (<data_dir>/channel/remoting.sock: the
socket 0600, its directory 0700) with the same handlers and role as its public port. A worker answers
the codes REQUESTS marks `replica` from its read replica and passes every other frame to the core over
a few persistent connections to that socket (CoreChannel): requests pipelined, each given an opaque
of the link's own and its answer mapped back to the client's. Two fields ride along, set by us and never by a client:
- CONN_FIELD on a request: the worker's name for the client connection it came on, so the core binds a
  broker to that client connection, not to the shared link (RocketMQ unregisters a broker whose
  channel closes: the worker sends CONNECTION_CLOSED when such a client goes, the supervisor reports
  every client of a worker that died);
- APPLIED_FIELD on an answer: the core's apply offset once it answered (a write on a follower is
  answered once applied here: nameserver/api/service.py). The worker's next read on that client
  connection waits, bounded, for its replica to reach it: a client reads its own writes.

A REGISTER_BROKER that changes nothing in the worker's replica (every broker re-sends its whole topic
table every 30 s) is decided in the worker by the core's own code over the replica
(NameServerService.unchanged_registration) and answered there; the core hears only a note (NOTE_ALIVE:
the broker's names, address, DataVersion and the worker's name for its connection; the notes that wait
while one is in flight go together in the next frame). The core refreshes the broker's liveness, binds
it to that client connection, and names the notes whose broker it does not hold at that DataVersion (a
replica behind the core, which expired or changed the broker meanwhile): the worker then passes the
registration itself on, as it passes every changed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import grpc

from nameserver import validation
from nameserver.api import auth
from nameserver.config import NodeConfig
from nameserver.pb import api_pb2, state_pb2
from nameserver.remoting import codes, frame
from nameserver.remoting.bodies import BodyError
from nameserver.remoting.command import Command, FrameError
from nameserver.remoting.handlers import (
    BROKER_CHANNEL_CODES,
    REPLICA_CODES,
    Handlers,
    registration_answer,
    registration_request,
)
from nameserver.remoting.request import RequestError
from nameserver.remoting.status import rpc_error_parts

log = logging.getLogger("nameserver.remoting.channel")

CONN_FIELD = "__rip18WorkerConn"
APPLIED_FIELD = "__rip18AppliedOffset"
CONNECTION_CLOSED = 99_001  # oneway, worker to core; a private code no RocketMQ release uses
NOTE_ALIVE = 99_002         # worker to core: unchanged registrations answered by the worker (a JSON list)
PRIVATE_CODES = frozenset({CONNECTION_CLOSED, NOTE_ALIVE})
SOCKET_NAME = os.path.join("channel", "remoting.sock")
LINKS = 4                    # connections from each worker to the core
LINK_INFLIGHT = 256          # requests in flight on one link (the core reads no further until some are answered)
MAX_REPLY_FRAME = 256 << 20  # the core's answers: ours, not a client's
SETTLE_S = 2.0               # how long a read waits for the replica to reach the connection's last write
SETTLE_POLL_S = 0.002


def socket_path(cfg: NodeConfig) -> str:
    return os.path.join(cfg.data_dir, SOCKET_NAME)


def channel_config(cfg: NodeConfig, workers: int) -> NodeConfig:
    """The core's socket's limits: room for every worker's links, a forwarded header's extra field and
    frame bytes, and no idle close (the links are ours)."""
    return replace(cfg, remoting_max_connections=workers * LINKS + 8,
                   remoting_max_ext_fields=cfg.remoting_max_ext_fields + 1,
                   remoting_max_header_bytes=cfg.remoting_max_header_bytes + 1024,
                   remoting_idle_timeout_ms=24 * 3600 * 1000)


CHANNEL_MAX_FRAME = frame.DEFAULT_MAX_FRAME + (64 << 10)  # a client's largest frame, its header re-encoded


# ---- the core's side --------------------------------------------------------------------------------

class WorkerClient:
    """A client connection of a worker, as the core's handlers know it (a broker's channel)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class CoreHandlers:
    """The core's handlers as its Unix socket serves them: the public port's, with the fields above."""

    def __init__(self, handlers: Handlers, applied: Callable[[], int]) -> None:
        self.inner = handlers
        self.applied = applied
        self._clients: dict[str, WorkerClient] = {}
        self._lock = threading.Lock()

    @property
    def supported_codes(self) -> list[int]:
        return self.inner.supported_codes

    def handle(self, req: Command, conn: object | None = None) -> Command:
        name = req.ext_fields.get(CONN_FIELD)
        if req.code == CONNECTION_CLOSED:
            if name:
                self._closed([name])
            return req.response()
        if req.code == NOTE_ALIVE:
            return self._noted(req)
        client = self._client(name) if name and req.code in BROKER_CHANNEL_CODES else None
        resp = self.inner.handle(req, client if name else conn)
        resp.ext_fields[APPLIED_FIELD] = str(self.applied())
        return resp

    def _noted(self, req: Command) -> Command:
        """A worker's unchanged registrations: each broker's liveness refreshed (the leader hears it as from
        a registration: the heartbeat names this node's connection) and its connection bound. The answer
        lists the notes whose broker this node does not hold at the note's DataVersion: those the worker
        sends whole."""
        notes = json.loads(req.body)
        beats = [api_pb2.BrokerHeartbeat(cluster_name=n["cluster"], broker_name=n["broker"], broker_addr=n["addr"],
                                         channel_node=self.inner.cfg.raft_addr) for n in notes]
        try:
            reply = self.inner.ns.Heartbeat(api_pb2.HeartbeatRequest(heartbeats=beats), timeout=self.inner.timeout)
        except grpc.RpcError as exc:  # the worker passes each registration on: the core answers it as ever
            log.info("remoting: %d unchanged registration(s) not noted: %s", len(notes), rpc_error_parts(exc)[1])
            return req.response(body=json.dumps(list(range(len(notes)))).encode())
        stale = []
        for i, (note, beat) in enumerate(zip(notes, beats, strict=True)):
            held = reply.data_versions.get(beat.broker_addr)
            if held is None or held != state_pb2.DataVersion.FromString(bytes.fromhex(note["version"])):
                stale.append(i)
            else:
                self.inner.bind(beat, self._client(note["conn"]))
        return req.response(body=json.dumps(stale).encode())

    def _client(self, name: str) -> WorkerClient:
        with self._lock:
            client = self._clients.get(name)
            if client is None:
                client = self._clients[name] = WorkerClient(name)
            return client

    def connection_closed(self, conn: object) -> None:
        """A link closed: its worker's clients are not (they close by CONNECTION_CLOSED or worker_gone)."""

    def worker_pids(self) -> set[int]:
        """The worker processes whose clients this core holds (a client's name begins with its pid)."""
        with self._lock:
            return {int(name.split(":", 1)[0]) for name in self._clients if name.split(":", 1)[0].isdigit()}

    def worker_gone(self, pid: int) -> None:
        """A worker process died: each broker connection it held is closed."""
        prefix = f"{pid}:"
        with self._lock:
            names = [n for n in self._clients if n.startswith(prefix)]
        self._closed(names)

    def _closed(self, names: list[str]) -> None:
        for name in names:
            with self._lock:
                client = self._clients.pop(name, None)
            if client is not None:
                self.inner.connection_closed(client)


# ---- a worker's side --------------------------------------------------------------------------------

class _Link:
    """One connection to the core's socket, and the requests waiting on it."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.pending: dict[int, asyncio.Future[Command]] = {}
        self.slots = asyncio.Semaphore(LINK_INFLIGHT)


@dataclass
class _ClientState:
    name: str
    min_offset: int = 0     # the core's apply offset after this connection's last answered request
    brokered: bool = False  # it spoke for a broker: the core hears when it closes


class UnchangedRegistrations:
    """A worker's answer to a REGISTER_BROKER its replica holds unchanged: the core's own decision
    (`service`: NameServerService over the replica) and the core's reply, with the note the core must
    hear; None for anything else (a change, a refusal, a replica not ready): the core answers those."""

    REGISTER = f"/{auth.NAMESERVER_SERVICE}/RegisterBroker"
    HEARTBEAT = f"/{auth.NAMESERVER_SERVICE}/Heartbeat"

    def __init__(self, service: Any, cfg: NodeConfig) -> None:
        self.service = service
        role = (cfg.remoting_role or "peer") if cfg.auth_enabled else ""  # the core's port's role
        self.allowed = not role or (auth.allowed(role, self.REGISTER) and auth.allowed(role, self.HEARTBEAT))

    def answer(self, req: Command) -> tuple[Command, dict[str, str]] | None:
        if not self.allowed or req.invalid is not None:
            return None
        try:
            request, clamped = registration_request(req)
            validation.validate_register_broker(request)
        except (RequestError, BodyError, validation.ValidationError):  # refused by the core, in its words
            return None
        reply = self.service.unchanged_registration(request)
        if reply is None:
            return None
        note = {"cluster": request.cluster_name, "broker": request.broker_name, "addr": request.broker_addr,
                "version": request.data_version.SerializeToString().hex()}
        return registration_answer(req, reply, clamped), note


class CoreChannel:
    """A worker's FrontEnd (nameserver/remoting/server.py): REPLICA_CODES answered here, the rest by the core."""

    local_codes = REPLICA_CODES

    def __init__(self, path: str, replica_offset: Callable[[], int], timeout_s: float,
                 links: int = LINKS) -> None:
        self.path = path
        self.replica_offset = replica_offset
        self.timeout_s = timeout_s
        self._links: list[_Link | None] = [None] * links
        self._locks = [asyncio.Lock() for _ in range(links)]
        self._turn = itertools.count()
        self._opaques = itertools.count(1)
        self._names = itertools.count(1)
        self._clients: dict[object, _ClientState] = {}
        self.unchanged: UnchangedRegistrations | None = None  # set once the worker's service exists
        self._notes: list[tuple[dict[str, str], asyncio.Future[bool]]] = []
        self._noting = False
        self.forwarded = 0
        self.failed = 0
        self.answered_unchanged = 0  # registrations answered here, the core told by a note
        self.stale_notes = 0         # ... that the core did not hold as the replica did: passed on whole

    async def forward(self, cmd: Command, conn: object) -> Command:
        if cmd.code in PRIVATE_CODES:  # ours alone
            return cmd.response(codes.REQUEST_CODE_NOT_SUPPORTED, f" request type {cmd.code} not supported")
        state = self._clients.get(conn)
        if state is None:
            state = self._clients[conn] = _ClientState(f"{os.getpid()}:{next(self._names)}")
        state.brokered |= cmd.code in BROKER_CHANNEL_CODES
        if cmd.code == codes.REGISTER_BROKER and self.unchanged is not None:
            local = await self._answer_unchanged(cmd, state)
            if local is not None:
                return local
        # a client's own value of the field is overwritten
        sent = replace(cmd, ext_fields=cmd.ext_fields | {CONN_FIELD: state.name})
        self.forwarded += 1
        try:
            resp = await self._call(sent)
        except (OSError, EOFError, FrameError, TimeoutError) as exc:
            self.failed += 1
            why = str(exc) or type(exc).__name__
            log.warning("remoting worker: request code %d not answered by the node's core: %s", cmd.code, why)
            return cmd.response(codes.SYSTEM_ERROR, f"the node's core did not answer: {why}")
        applied = resp.ext_fields.pop(APPLIED_FIELD, "")
        if applied.isdigit():
            state.min_offset = max(state.min_offset, int(applied))
        resp.opaque = cmd.opaque
        return resp

    async def _answer_unchanged(self, cmd: Command, state: _ClientState) -> Command | None:
        """The worker's answer to an unchanged registration once the core has noted it, or None: pass it on."""
        assert self.unchanged is not None
        local = await asyncio.get_running_loop().run_in_executor(None, self.unchanged.answer, cmd)
        if local is None:
            return None
        resp, note = local
        try:
            held = await self._note(note | {"conn": state.name})
        except (OSError, EOFError, FrameError, TimeoutError, ValueError):
            return None  # passed on whole, answered (or failed) as before
        if not held:
            self.stale_notes += 1
            return None
        self.answered_unchanged += 1
        return resp

    async def _note(self, note: dict[str, str]) -> bool:
        """Tell the core of an unchanged registration; whether it holds the broker as the note says. The
        notes that arrive while one frame is in flight go together in the next."""
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._notes.append((note, waiter))
        if not self._noting:
            self._noting = True
            asyncio.get_running_loop().create_task(self._send_notes())
        return await waiter

    async def _send_notes(self) -> None:
        try:
            while self._notes:
                # at most what one Heartbeat call takes; the rest go in the next frame
                cut = validation.MAX_HEARTBEATS_PER_REQUEST
                batch, self._notes = self._notes[:cut], self._notes[cut:]
                try:
                    resp = await self._call(Command(code=NOTE_ALIVE, body=json.dumps([n for n, _ in batch]).encode()))
                    stale = set(json.loads(resp.body)) if resp.code == codes.SUCCESS else set(range(len(batch)))
                except (OSError, EOFError, FrameError, TimeoutError, ValueError) as exc:
                    for _, waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(exc)
                    continue
                for i, (_, waiter) in enumerate(batch):
                    if not waiter.done():
                        waiter.set_result(i not in stale)
        finally:
            self._noting = False

    async def settle(self, conn: object) -> None:
        """Before a local read: the replica has applied what this connection's last request saw (bounded)."""
        if self.settled(conn):
            return
        state = self._clients[conn]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SETTLE_S
        while self.replica_offset() < state.min_offset and loop.time() < deadline:
            await asyncio.sleep(SETTLE_POLL_S)

    def settled(self, conn: object) -> bool:
        """The replica has applied what this connection's last request saw: a local read needs no wait."""
        state = self._clients.get(conn)
        return state is None or self.replica_offset() >= state.min_offset

    def closed(self, conn: object) -> None:
        state = self._clients.pop(conn, None)
        if state is not None and state.brokered:
            note = Command(code=CONNECTION_CLOSED, flag=codes.FLAG_ONEWAY, ext_fields={CONN_FIELD: state.name})
            task = asyncio.get_running_loop().create_task(self._call(note))
            task.add_done_callback(_quiet)

    # ---- links ----------------------------------------------------------------------------------

    async def _call(self, cmd: Command) -> Command:
        """Send `cmd` on the next link (connecting it if need be) under an opaque of the link's; its answer
        (an empty one for a oneway request)."""
        i = next(self._turn) % len(self._links)
        link = await self._link(i)
        async with link.slots:
            cmd.opaque = next(self._opaques) & 0x7FFFFFFF
            if cmd.is_oneway:
                link.writer.write(frame.encode(cmd))
                await link.writer.drain()
                return cmd.response()
            waiter: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
            link.pending[cmd.opaque] = waiter
            try:
                link.writer.write(frame.encode(cmd))
                await link.writer.drain()
                async with asyncio.timeout(self.timeout_s):
                    return await waiter
            finally:
                link.pending.pop(cmd.opaque, None)

    async def _link(self, i: int) -> _Link:
        async with self._locks[i]:
            link = self._links[i]
            if link is None or link.writer.is_closing():
                reader, writer = await asyncio.open_unix_connection(self.path, limit=2 ** 16)
                link = self._links[i] = _Link(writer)
                asyncio.get_running_loop().create_task(self._read(i, link, reader))
            return link

    async def _read(self, i: int, link: _Link, reader: asyncio.StreamReader) -> None:
        error: BaseException = EOFError("the node's core closed the channel")
        try:
            while (payload := await frame.read(reader, MAX_REPLY_FRAME)) is not None:
                resp = frame.decode(payload)
                waiter = link.pending.get(resp.opaque)
                if waiter is not None and not waiter.done():
                    waiter.set_result(resp)
        except (OSError, FrameError, asyncio.IncompleteReadError) as exc:
            error = exc
        finally:
            link.writer.close()
            if self._links[i] is link:
                self._links[i] = None
            for waiter in link.pending.values():  # the next request reconnects
                if not waiter.done():
                    waiter.set_exception(EOFError(f"the channel to the node's core closed: {error}"))


def _quiet(task: asyncio.Task) -> None:
    with contextlib.suppress(asyncio.CancelledError, OSError, EOFError, FrameError, TimeoutError):
        task.result()
