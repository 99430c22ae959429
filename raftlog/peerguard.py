"""Limits on pysyncobj's Raft port: frame sizes, and what an unauthenticated peer may cost.

pysyncobj's TcpConnection reads a 4-byte length prefix (struct 'i': native order, signed), then
appends every recv to one `bytes` buffer (quadratic copying, on the tick thread) until that many
bytes have arrived, and only then decrypts (Fernet: the Raft password). A client without the
password that announced 0x7fffffff and streamed zeros made the tick thread copy gigabytes: writes
stalled for 45 s while the nodes still reported quorum. Nothing limited how many unauthenticated
connections a node held, nor how long a silent one stayed open (pysyncobj's idle timeout runs only
when the socket has an event).

`GuardedTcpConnection` replaces pysyncobj's TcpConnection for accepted and outgoing connections
(binding.py installs it in pysyncobj.tcp_server and pysyncobj.transport, which import the class by
name), `GuardedTcpServer` its TcpServer (a deeper accept queue), and `GuardedTransport` (passed to
SyncObj as `transportClass`) keeps the per-node state:

- Every frame's length must be 0 <= n <= MAX_FRAME, checked as soon as its 4 bytes are in, before
  any of the body is buffered; otherwise the connection is dropped. The read and write buffers
  are bytearrays (amortised appends, O(1) consumption from the front), so a large frame of an
  authenticated peer costs linear, not quadratic, copying; and a send() that leaves bytes in the
  buffer asks the poller for write readiness (pysyncobj only did so from a write event, so the
  rest of a large frame went out one socket buffer per later message: ~15 s for 20 MiB).
- With a password, a connection is *pre-authentication* until a frame arrives that decrypted AND
  carried the fresh random key this side sent (pysyncobj's replay protection). On an outgoing
  connection that is the first frame; on an accepted one the second (the first, the peer's key,
  could be a replay of a sniffed handshake, so it proves nothing). Until then: each frame is at
  most PREAUTH_MAX_FRAME, the connection is read frame by frame (never past the first frame, so
  an honest peer's pipelined traffic is not counted), at most PREAUTH_BUDGET bytes in total, and
  it must authenticate within PREAUTH_DEADLINE_S or be closed: a sweep on the tick closes silent
  ones too. At most MAX_PREAUTH_CONNECTIONS accepted connections may be pre-authentication at
  once (already authenticated peers are unaffected).
- A connection beyond that cap is not refused: it evicts the oldest pre-authentication connection
  that has not *keyed*, i.e. whose first frame has not (yet) decrypted with the password. A member
  sends that frame (its random key) the moment it connects, so its connection keys within a round
  trip and is then out of the strangers' reach; strangers only evict each other. Refusing the
  newcomer instead locked members out: 100 strangers reconnecting kept the 64 slots full, and a
  restarted member took 32 s to rejoin (4.8 s without them), getting in only when a deadline sweep
  freed a slot and it won the race for it. The source address cannot tell members apart (every
  stranger on 127.0.0.1 shares theirs), the first bytes can. A keyed frame may be a replay of a
  sniffed handshake, so a keyed connection is evictable too once it held its key for KEYED_GRACE_S
  without completing the handshake; only when every slot holds a connection keyed less than that
  ago is the newcomer closed at accept.
- Without a password (dev mode) only the frame-size limit applies: anyone who reaches the port
  can send pickles there by design (remote code execution), so nothing else is worth guarding.

Every Raft connection, dialled or accepted, also gets TCP_USER_TIMEOUT (RAFT_TCP_USER_TIMEOUT_MS): the
kernel aborts it when data sent on it stays unacknowledged that long. Without it, a partition of a few
seconds leaves the connection's retransmission timer backed off (200 ms, 400 ms, ... 6.4 s), and after the
heal nothing goes through until that timer fires: a live link silent for seconds (a suspect for
docs/faults.md finding 10). Aborted, the connection is dialled again every 0.1 s and is back at once.

Each refusal logs one warning per kind at most every WARN_EVERY_S, naming the peer address (never
the bytes) and how many refusals of that kind it stands for.

`ENABLED` (environment RAFTLOG_PEERGUARD=off, read at import) turns the guard off: for tests that
measure the attack without it, never for a deployment.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pickle
import socket
import struct
import time
import zlib
from typing import cast

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj.poller import POLL_EVENT_TYPE
from pysyncobj.tcp_connection import CONNECTION_STATE, TcpConnection
from pysyncobj.tcp_server import TcpServer

from raftlog.peerlinks import MembershipTransport

log = logging.getLogger("raftlog.peerguard")

# The largest frame pysyncobj sends: an append_entries with the entries from nextIndex up to and
# including the one that crosses appendEntriesBatchSizeBytes (64 KiB), so one entry of ours travels
# whole however big (only a lone entry of 64 KiB or more is cut into 64 KiB pieces, as are snapshot
# transfers). Ours reach ~12 MiB (GroupCommitter's 4 MiB group plus one gRPC request of up to
# 8 MiB); pickle protocol 2 stores bytes as latin-1 text (x1.5 for bytes >= 0x80) and Fernet is
# base64 (x4/3): a 10 MiB random entry made a 19.6 MiB frame, so ~24 MiB worst case. 16 MiB would
# wedge replication on such an entry forever; 64 MiB leaves room for a raised max_message_bytes.
MAX_FRAME = 64 << 20
# Pre-authentication frames are the handshake: an encrypted pickled 32-byte key (228 bytes
# measured), the key pair reply (312), the node address (~250), or a syncobj_admin command.
PREAUTH_MAX_FRAME = 4 << 10
# Bytes a connection may send before it authenticates: an honest handshake sends under 1 KiB.
PREAUTH_BUDGET = 64 << 10
# A peer on the same network completes the handshake in a few round trips (milliseconds).
PREAUTH_DEADLINE_S = 5.0
# Each unauthenticated accepted connection holds a file descriptor; peers need a handful.
MAX_PREAUTH_CONNECTIONS = 64
# A member answers our key one round trip after its first frame keyed the connection: a keyed
# connection that has not authenticated this long after is a replay, evictable like a stranger.
KEYED_GRACE_S = 1.0
# pysyncobj listens with a backlog of 5: a burst of connections (a flood, or peers and a flood)
# then waits in SYN_RECV for the kernel's SYN-ACK retries (1, 2, 4... s). Room for the cap and more.
LISTEN_BACKLOG = 512
# How often the tick looks for pre-authentication connections past their deadline.
SWEEP_EVERY_S = 0.25
# At most one warning per refusal kind this often (a flood must not flood the log).
WARN_EVERY_S = 10.0
# Unacknowledged data on a Raft connection for this long aborts it (module docstring): above any real RTT and
# an election timeout, below the seconds a backed-off retransmission timer would keep a healed link silent.
RAFT_TCP_USER_TIMEOUT_MS = 3000

# A coalescing transport writes a connection's frames at once when they reach this (a snapshot transfer, a big
# append): what waits for the pass's flush stays small.
COALESCE_MAX_BYTES = 256 << 10
# pysyncobj's own zlib level; a GuardedTransport sends at its `compress_level` (raft.wire_compress_level).
PYSYNCOBJ_COMPRESS_LEVEL = 3
# pysyncobj pickles its messages with protocol 2, which stores bytes (our entries) as latin-1 text rebuilt
# by a call on load: 17 us to pickle and unpickle an append of one 1.5 KB entry, 4 us with protocol 4
# (measured, session 25). Every receiver reads it (pickle.loads takes any protocol), pysyncobj's too.
WIRE_PICKLE_PROTOCOL = 4

ENABLED = os.environ.get("RAFTLOG_PEERGUARD", "on").lower() not in ("off", "0", "false", "no")

_unpack_from = struct.Struct("i").unpack_from
_pack_length = struct.Struct("i").pack
_pack_stored_block = struct.Struct("<BHH").pack  # a stored deflate block's header: final bit, LEN, NLEN
_pack_adler32 = struct.Struct(">I").pack
_STORED_ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, fastest: what zlib.compress(data, 0) writes
_STORED_BLOCK_MAX = 0xFFFF
_EAGAIN = (errno.EAGAIN, errno.EWOULDBLOCK)
_READ_WRITE_ERROR = POLL_EVENT_TYPE.READ | POLL_EVENT_TYPE.WRITE | POLL_EVENT_TYPE.ERROR


def zlib_stream(data: bytes, level: int) -> bytes:
    """`data` as a zlib stream (RFC 1950) that any zlib decompresses, at `level`. Level 0 (the default
    raft.wire_compress_level) is built here, as stored blocks and an Adler-32: zlib.compress sets up a
    deflate state of ~256 KiB per call for a copy (1.2 against 0.35 us a small message once malloc has
    adapted; in a process where glibc still hands those pages back at every free, 55-60 us and ~18 page
    faults a call: measured, session 25)."""
    if level:
        return zlib.compress(data, level)
    n = len(data)
    adler = _pack_adler32(zlib.adler32(data))
    if n <= _STORED_BLOCK_MAX:
        return b"".join((_STORED_ZLIB_HEADER, _pack_stored_block(1, n, n ^ 0xFFFF), data, adler))
    parts: list[bytes | memoryview] = [_STORED_ZLIB_HEADER]
    with memoryview(data) as view:
        for start in range(0, n, _STORED_BLOCK_MAX):
            size = min(_STORED_BLOCK_MAX, n - start)
            parts.append(_pack_stored_block(start + size == n, size, size ^ 0xFFFF))
            parts.append(view[start:start + size])
        parts.append(adler)
        return b"".join(parts)


class _Warner:
    """One log line per refusal kind per WARN_EVERY_S, with the count it stands for."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}  # refusals per kind, ever (tests and status read it)
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def refuse(self, kind: str, peer: str, detail: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        now = time.monotonic()
        if now - self._last.get(kind, -WARN_EVERY_S) < WARN_EVERY_S:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        more = self._suppressed.pop(kind, 0)
        log.warning("raft port: dropped a connection from %s: %s%s", peer, detail,
                    f" (and {more} more of this kind in the last {WARN_EVERY_S:.0f}s)" if more else "")


_default_warner = _Warner()


def _set_user_timeout(sock: object) -> None:
    if isinstance(sock, socket.socket) and hasattr(socket, "TCP_USER_TIMEOUT"):
        with contextlib.suppress(OSError):  # not a TCP socket (tests), or the option is refused
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, RAFT_TCP_USER_TIMEOUT_MS)


def _peer_of(sock: object) -> str:
    if not isinstance(sock, socket.socket):
        return "?"
    try:
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except (OSError, AttributeError, ValueError):
        return "?"


class GuardedTcpConnection(TcpConnection):
    """pysyncobj's TcpConnection with the limits above; the authenticated fast path stays lean."""

    # pysyncobj's own attributes this class touches (untyped there; mangled names are its private state)
    _TcpConnection__writeBuffer: bytes | bytearray
    _TcpConnection__readBuffer: bytes | bytearray
    recvLastTimestamp: float

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._pg_owner: GuardedTransport | None = None
        self._pg_accepted = False
        self._pg_authed = False
        self._pg_keyed_at: float | None = None  # when an accepted connection's first frame decrypted
        self._pg_since = time.monotonic()
        self._pg_bytes = 0
        self._pg_scan = 0  # offset in the read buffer of the next frame header not yet checked
        super().__init__(*args, **kwargs)
        self._pg_peer = _peer_of(kwargs.get("socket"))
        _set_user_timeout(kwargs.get("socket"))

    # ---- state -----------------------------------------------------------------------------

    @property
    def preauth(self) -> bool:
        return self.encryptor is not None and not self._pg_authed

    def _pg_start(self, owner: GuardedTransport | None, accepted: bool) -> None:
        """The pre-authentication period starts (at accept, or at each outgoing connect)."""
        self._pg_authed = False
        self._pg_keyed_at = None
        self._pg_since = time.monotonic()
        self._pg_bytes = 0
        self._pg_accepted = accepted
        if owner is not None:
            self._pg_owner = owner
        if self._pg_owner is not None and self.encryptor is not None:
            self._pg_owner._pg_track(self)

    def _pg_refuse(self, kind: str, detail: str) -> None:
        owner = self._pg_owner
        (owner.warner if owner is not None else _default_warner).refuse(kind, self._pg_peer, detail)
        self.disconnect()

    def connect(self, host: str, port: int) -> bool:
        self._pg_peer = f"{host}:{port}"
        self._pg_scan = 0
        self._pg_start(None, accepted=False)
        ok = super().connect(host, port)
        if ok:
            _set_user_timeout(self._TcpConnection__socket)
        if not ok and self._pg_owner is not None:
            self._pg_owner._pg_untrack(self)
        return ok

    def disconnect(self) -> None:
        if self._pg_owner is not None:
            self._pg_owner._pg_untrack(self)
        self._pg_scan = 0
        super().disconnect()

    # ---- writing: a bytearray too (pysyncobj re-slices a bytes buffer after every send() call, so
    # one large frame cost quadratic copying on the sending tick thread as well) --------------

    def send(self, message: object) -> None:
        if type(self._TcpConnection__writeBuffer) is not bytearray:
            self._TcpConnection__writeBuffer = bytearray(self._TcpConnection__writeBuffer)
        # pysyncobj's send(), with the zlib level of the owner's setting instead of its fixed 3 (the
        # receiver decompresses whatever the level, so members may differ), and pickle protocol 4 instead
        # of its 2 (the receiver's pickle.loads reads either; see WIRE_PICKLE_PROTOCOL).
        if self.sendRandKey:
            message = (self.sendRandKey, message)
        owner = self._pg_owner
        data = zlib_stream(pickle.dumps(message, WIRE_PICKLE_PROTOCOL),
                           owner.compress_level if owner is not None else PYSYNCOBJ_COMPRESS_LEVEL)
        if self.encryptor:
            data = self.encryptor.encrypt_at_time(data, int(time.monotonic()))
        buf = self._TcpConnection__writeBuffer
        buf += _pack_length(len(data))
        buf += data
        if owner is not None and owner.coalesce and len(buf) < COALESCE_MAX_BYTES:
            owner._unsent[self] = None  # written with the others of this pass (GuardedTransport.flush)
            return
        self.flush()

    def flush(self) -> None:
        """Write what the buffer holds, as much as the socket takes now; ask for write readiness for the rest."""
        self._TcpConnection__trySendBuffer()
        # pysyncobj asks the poller for write readiness only from a write event, so what one send()
        # left in the buffer went out only with the next message (a heartbeat every 100 ms: a
        # 20 MiB frame took ~15 s). Ask for it here.
        fileno = self._TcpConnection__fileno
        if (self._TcpConnection__writeBuffer and fileno is not None
                and self._TcpConnection__state == CONNECTION_STATE.CONNECTED):
            self._TcpConnection__poller.subscribe(fileno, self._TcpConnection__processConnection,
                                                  _READ_WRITE_ERROR)

    def _TcpConnection__processSend(self) -> bool:  # noqa: N802 (pysyncobj's mangled name)
        buf = self._TcpConnection__writeBuffer
        if not buf:
            return False
        try:
            res = self._TcpConnection__socket.send(buf)
        except OSError as e:
            if e.errno not in _EAGAIN:
                self.disconnect()
            return False
        if res <= 0:
            if res < 0:
                self.disconnect()
            return False
        if type(buf) is bytearray:
            del buf[:res]  # O(1): CPython moves the start of a bytearray
        else:
            self._TcpConnection__writeBuffer = bytearray(buf[res:])
        return True

    # ---- reading (pysyncobj calls these by their mangled names) ------------------------------

    def _TcpConnection__processRead(self) -> bool:  # noqa: N802 (pysyncobj's mangled name)
        sock = self._TcpConnection__socket
        buf = self._TcpConnection__readBuffer
        if type(buf) is not bytearray:  # pysyncobj resets it to bytes() on connect/disconnect
            buf = bytearray(buf)
            self._TcpConnection__readBuffer = buf
            self._pg_scan = 0
        preauth = self.encryptor is not None and not self._pg_authed
        if preauth:
            # Read exactly up to the end of the first frame: it must be parsed (and may
            # authenticate the connection) before anything after it is looked at.
            have = len(buf)
            want = 4 - have if have < 4 else 4 + _unpack_from(buf, 0)[0] - have
            if want <= 0:
                return False
        else:
            want = self._TcpConnection__recvBufferSize
        try:
            incoming = sock.recv(want)
        except OSError as e:
            if e.errno not in _EAGAIN:
                self.disconnect()
            return False
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            self.disconnect()
            return False
        if not incoming:
            self.disconnect()
            return False
        buf += incoming
        end = len(buf)
        limit = MAX_FRAME
        if preauth:
            self._pg_bytes += len(incoming)
            if self._pg_bytes > PREAUTH_BUDGET:
                self._pg_refuse("preauth-budget", f"sent over {PREAUTH_BUDGET} bytes before authenticating")
                return False
            limit = PREAUTH_MAX_FRAME
        scan = self._pg_scan
        while scan + 4 <= end:
            n = _unpack_from(buf, scan)[0]
            if n < 0 or n > limit:
                if preauth:
                    self._pg_refuse("preauth-frame", f"announced a {n}-byte frame before authenticating "
                                                     f"(limit {PREAUTH_MAX_FRAME})")
                else:
                    self._pg_refuse("frame-size", f"announced a {n}-byte frame (limit {MAX_FRAME})")
                return False
            scan += 4 + n
        self._pg_scan = scan
        if preauth:
            return end < 4 or end < 4 + _unpack_from(buf, 0)[0]  # stop once the first frame is in
        # Complete frames waiting to be parsed: stop reading, the poller is level-triggered. This
        # bounds the buffer to about one MAX_FRAME however fast the other side writes. A recv that
        # returned less than it asked for emptied the socket: stop too (pysyncobj read again until
        # EAGAIN, a syscall and an exception per readable event for nothing; more data polls again).
        return end <= MAX_FRAME and len(incoming) == want

    def _TcpConnection__processParseMessage(self) -> object:  # noqa: N802
        buf = cast(bytearray, self._TcpConnection__readBuffer)  # __processRead made it one
        have = len(buf)
        if have < 4:
            return None
        n = _unpack_from(buf, 0)[0]
        if have - 4 < n:
            return None
        if n < 0:  # the read path drops these first; never slice with a negative length
            self._pg_refuse("frame-size", f"announced a {n}-byte frame")
            return None
        with memoryview(buf) as view:
            data = bytes(view[4:4 + n])
        encryptor = self.encryptor
        fresh_key = self.recvRandKey  # a frame carrying it proves the password and is no replay
        try:
            if encryptor:
                stamp = encryptor.extract_timestamp(data)
                if stamp < self.recvLastTimestamp:
                    raise ValueError("replayed frame")
                self.recvLastTimestamp = stamp
                data = encryptor.decrypt(data)
            message = pysyncobj_pickle.loads(zlib.decompress(data))
            if fresh_key:
                key, message = message
                if key != fresh_key:
                    raise ValueError("wrong session key")
        except Exception:
            if encryptor and not self._pg_authed:
                self._pg_refuse("preauth-bad-frame", "a frame that did not decrypt with the Raft password")
            else:
                self.disconnect()
            return None
        del buf[:4 + n]
        self._pg_scan -= 4 + n
        if encryptor and not self._pg_authed:
            if fresh_key:
                self._pg_authed = True
                if self._pg_owner is not None:
                    self._pg_owner._pg_untrack(self)
            elif self._pg_keyed_at is None:
                self._pg_keyed_at = time.monotonic()  # the peer's key: it knows the password (or replays)
        return message


class GuardedTcpServer(TcpServer):
    """pysyncobj's TCP server with a deeper accept queue (see LISTEN_BACKLOG)."""

    def bind(self) -> None:
        super().bind()
        self._TcpServer__socket.listen(LISTEN_BACKLOG)  # listen() again on Linux just resizes the queue


class GuardedTransport(MembershipTransport):
    """raftlog.peerlinks' transport (pysyncobj's, patched for membership changes) that also tracks
    pre-authentication connections, caps and sweeps them."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        self._pg_in: dict[GuardedTcpConnection, None] = {}  # accepted, pre-auth (insertion ordered)
        self._pg_out: dict[GuardedTcpConnection, None] = {}  # outgoing, pre-auth
        self._pg_next_sweep = 0.0
        self.warner = _Warner()
        self.compress_level = PYSYNCOBJ_COMPRESS_LEVEL  # the binding sets raft.wire_compress_level
        # The binding turns this on: a frame is written at the next flush() (the tick calls it after its
        # appends, before it polls and after it handled what the poll brought), so the frames of one pass to
        # one peer leave in one send() and reach it as one wake (COALESCE_MAX_BYTES bounds what waits).
        self.coalesce = False
        self._unsent: dict[GuardedTcpConnection, None] = {}
        super().__init__(*args, **kwargs)

    def flush(self) -> None:
        """Write the frames held back since the last flush (coalesce), connection by connection."""
        while self._unsent:
            unsent, self._unsent = self._unsent, {}
            for conn in unsent:
                conn.flush()

    @property
    def preauth_connections(self) -> int:
        return len(self._pg_in)

    def _pg_track(self, conn: GuardedTcpConnection) -> None:
        (self._pg_in if conn._pg_accepted else self._pg_out)[conn] = None

    def _pg_untrack(self, conn: GuardedTcpConnection) -> None:
        self._pg_in.pop(conn, None)
        self._pg_out.pop(conn, None)

    def _onNewIncomingConnection(self, conn: TcpConnection) -> None:  # noqa: N802 (pysyncobj's name)
        guarded = isinstance(conn, GuardedTcpConnection)
        if guarded and self._syncObj.encryptor and len(self._pg_in) >= MAX_PREAUTH_CONNECTIONS:
            victim = self._pg_evictable()
            if victim is None:
                # Not handed to pysyncobj: it would keep the object in its unknown-connections set.
                self.warner.refuse("preauth-connections", conn._pg_peer,
                                   f"{MAX_PREAUTH_CONNECTIONS} connections already waiting to authenticate")
                conn.disconnect()
                return
            victim._pg_refuse("preauth-evicted", f"evicted for a newer connection: {MAX_PREAUTH_CONNECTIONS} "
                                                 "were waiting to authenticate and it had not sent the key")
        super()._onNewIncomingConnection(conn)
        if guarded:
            conn._pg_start(self, accepted=True)

    def _pg_evictable(self) -> GuardedTcpConnection | None:
        """The pre-authentication connection a newcomer may take the slot of (module docstring): the
        oldest that has not keyed, else the oldest keyed over KEYED_GRACE_S ago, else None."""
        stale_keyed = None
        keyed_before = time.monotonic() - KEYED_GRACE_S
        for conn in self._pg_in:  # oldest first
            keyed_at = conn._pg_keyed_at
            if keyed_at is None:
                return conn
            if stale_keyed is None and keyed_at < keyed_before:
                stale_keyed = conn
        return stale_keyed

    def addNode(self, node: object) -> None:  # noqa: N802
        super().addNode(node)
        conn = self._connections.get(node)
        if isinstance(conn, GuardedTcpConnection):
            conn._pg_owner = self

    def _outgoing_connection(self, node: object) -> object:
        conn = super()._outgoing_connection(node)
        if isinstance(conn, GuardedTcpConnection):
            conn._pg_owner = self
        return conn

    def _onTick(self) -> None:  # noqa: N802
        super()._onTick()
        now = time.monotonic()
        if now < self._pg_next_sweep or not (self._pg_in or self._pg_out):
            return
        self._pg_next_sweep = now + SWEEP_EVERY_S
        for pending in (self._pg_in, self._pg_out):
            for conn in list(pending):
                if conn.state == CONNECTION_STATE.DISCONNECTED or conn._pg_authed:
                    pending.pop(conn, None)
                elif now - conn._pg_since > PREAUTH_DEADLINE_S:
                    conn._pg_refuse("preauth-deadline", f"not authenticated within {PREAUTH_DEADLINE_S:.0f}s")
                    pending.pop(conn, None)
