"""Raft links between members whose membership lists differ (pysyncobj's transport, patched for it).

pysyncobj connects each pair of members once, from the member with the greater address, and an
accepted connection must name a member of the acceptor's own configuration, or it is closed. Both
rules assume every member knows every other, which a membership change breaks: a member that
missed the change (paused, partitioned or down while it committed) does not know the member that
was added, and when that member becomes leader:

- if the new member's address is the greater, it dials the stale one, which closes the
  connection: it never hears of the leader, never gets the entries that would teach it the new
  membership, and stays behind for good (found by tests/faults/test_membership_faults.py: the
  paused leader never caught up; docs/faults.md);
- if the stale member's address is the greater, it is the one supposed to dial, and does not know
  whom.

Raft itself has no such gap: a server accepts appends from a leader outside its configuration and
votes for candidates outside it (Ongaro's thesis, section 4.1). This transport adds the two missing
pieces:

- **Guests.** An authenticated connection (it proved the Raft password, or the cluster has none)
  naming an unknown address is kept as a guest link. A guest's requests reach Raft (appends,
  votes, pre-votes, timeouts, read-index pings) and their answers go back over the same link; a
  guest's answers to requests of ours are dropped, because only members count towards a commit,
  a vote or a read. When the log makes the guest a member, the link becomes that member's
  (or is closed, if this side is the one to dial it).
- **Reverse dials.** A member this side waits for, that has not connected for
  REVERSE_DIAL_AFTER_S, is dialled from this side. A member that knows us refuses such a dial
  (it dials us itself, within pysyncobj's retry time); one that does not know us takes it as a
  guest. When the regular connection arrives, the reverse one is closed.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import pysyncobj.transport as pysyncobj_transport
from pysyncobj.node import TCPNode
from pysyncobj.tcp_connection import CONNECTION_STATE
from pysyncobj.transport import TCPTransport

from raftlog.leadership import PING as READ_INDEX_PING
from raftlog.prevote import REQUEST as PRE_VOTE_REQUEST

log = logging.getLogger("raftlog.peerlinks")

# What a guest may send: requests that a leader or a candidate outside our configuration sends.
GUEST_REQUESTS = frozenset({"append_entries", "request_vote", "timeout_now", PRE_VOTE_REQUEST, READ_INDEX_PING})
# Guests held at once: members added since this node last caught up, and removed ones still running.
MAX_GUESTS = 8
# The member with the greater address retries every connectionRetryTime (0.1 s here): this long
# without a link means it is down, cut off, or does not know us.
REVERSE_DIAL_AFTER_S = 2.0
REVERSE_CHECK_EVERY_S = 0.5
UNNAMED_LOG_EVERY_S = 10.0  # one log line at most this often for links dropped for not naming their dialer


class MembershipTransport(TCPTransport):
    """pysyncobj's TCP transport with guest links and reverse dials (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._guests: dict[str, TCPNode] = {}
        self._reverse: set[Any] = set()  # live connections this side dialled against the usual direction
        self._unreached: dict[Any, float] = {}  # member -> since when no link (we wait for its dial)
        self._next_reverse_check = 0.0
        self.reverse_dials = 0
        self.unnamed_dropped = 0  # incoming links closed for a first message that named no one
        self._unnamed_log_after = 0.0
        super().__init__(*args, **kwargs)

    @property
    def guests(self) -> list[str]:
        return sorted(self._guests)

    # ---- accepted connections ------------------------------------------------------------------

    def _onIncomingMessageReceived(self, conn: Any, message: Any) -> None:  # noqa: N802 (pysyncobj's name)
        if (self._syncObj.encryptor and not conn.sendRandKey) or message == "readonly" \
                or self._is_utility(message):
            super()._onIncomingMessageReceived(conn, message)  # key exchange, utility command, read-only
            return
        if not isinstance(message, str):
            # pysyncobj looks anything else up as an address: a dict (a Raft request where the dialer's
            # address was due) raised TypeError on the tick thread for each message until the
            # connection closed (docs/faults.md, finding 12). The dialer reconnects and says who it is.
            self._drop_unnamed(conn, message)
            return
        node = self._nodeAddrToNode.get(message)
        if node is None:
            self._accept_guest(conn, message)
            return
        if self._shouldConnect(node):
            # A member we dial ourselves dialled us: it is a reverse dial from one that assumes we do
            # not know it. We do; our own connection comes within the retry time.
            self._unknownConnections.discard(conn)
            conn.disconnect()
            return
        previous = self._connections.get(node)
        super()._onIncomingMessageReceived(conn, message)
        if previous is not None and previous is not conn and previous in self._reverse:
            self._reverse.discard(previous)
            previous.disconnect()  # no longer mapped to the member: its callback finds nothing to do

    def _is_utility(self, message: Any) -> bool:
        """A utility command (pysyncobj's syncobj_admin: a list naming a command it serves)."""
        return isinstance(message, list) and bool(message) and isinstance(message[0], str) \
            and message[0] in self._onUtilityMessageCallbacks

    def _drop_unnamed(self, conn: Any, message: Any) -> None:
        self._unknownConnections.discard(conn)
        conn.disconnect()
        self.unnamed_dropped += 1
        now = time.monotonic()
        if now >= self._unnamed_log_after:
            self._unnamed_log_after = now + UNNAMED_LOG_EVERY_S
            kind = f"a {message.get('type')!s:.64} message" if isinstance(message, dict) else type(message).__name__
            log.warning("raft port: closed an incoming link whose first message was %s, not the dialer's address "
                        "(%d such links so far)", kind, self.unnamed_dropped)

    def _accept_guest(self, conn: Any, address: str) -> None:
        self._unknownConnections.discard(conn)
        try:
            node = TCPNode(address)
        except (ValueError, TypeError):
            conn.disconnect()
            return
        if address not in self._guests and len(self._guests) >= MAX_GUESTS:
            log.warning("raft port: refused a link from %s: already %d links from non-members", address, MAX_GUESTS)
            conn.disconnect()
            return
        previous = self._connections.get(node) if address in self._guests else None
        self._guests[address] = node
        self._connections[node] = conn
        conn.setOnMessageReceivedCallback(functools.partial(self._on_guest_message, node))
        if previous is not None and previous is not conn:
            previous.disconnect()
        else:
            log.info("raft port: %s is not a member here; keeping its link as a guest until the log says more",
                     address)

    def _on_guest_message(self, node: TCPNode, message: Any) -> None:
        if isinstance(message, dict) and message.get("type") in GUEST_REQUESTS:
            self._onMessageReceived(node, message)

    def _onDisconnected(self, conn: Any) -> None:  # noqa: N802 (pysyncobj's name)
        self._reverse.discard(conn)
        node = self._connToNode(conn)
        if node is not None and node not in self._nodes and self._guests.get(getattr(node, "address", "")) == node:
            self._guests.pop(node.address, None)
            self._connections.pop(node, None)
            self._unknownConnections.discard(conn)
            return
        super()._onDisconnected(conn)

    # ---- link events ---------------------------------------------------------------------------------
    # One line per Raft link that comes up or goes down: when a leader goes quiet towards one follower
    # (docs/faults.md, finding 10), the logs then say whether that link was down, and since when.

    def _onNodeConnected(self, node: Any) -> None:  # noqa: N802 (pysyncobj's name)
        log.info("raft link to %s is up", getattr(node, "address", node),
                 extra={"event": "raft_link", "peer": str(getattr(node, "address", node)), "up": True})
        super()._onNodeConnected(node)

    def _onNodeDisconnected(self, node: Any) -> None:  # noqa: N802 (pysyncobj's name)
        log.info("raft link to %s is down", getattr(node, "address", node),
                 extra={"event": "raft_link", "peer": str(getattr(node, "address", node)), "up": False})
        super()._onNodeDisconnected(node)

    # ---- membership ------------------------------------------------------------------------------

    def addNode(self, node: Any) -> None:  # noqa: N802 (pysyncobj's name)
        guest = self._guests.pop(getattr(node, "address", ""), None)
        link = self._connections.pop(guest, None) if guest is not None else None
        super().addNode(node)
        if link is None:
            return
        if node in self._connections or link.state != CONNECTION_STATE.CONNECTED:
            link.disconnect()  # we dial this member ourselves (or the link is gone)
            return
        self._connections[node] = link
        link.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        self._onNodeConnected(node)

    def dropNode(self, node: Any) -> None:  # noqa: N802 (pysyncobj's name)
        self._unreached.pop(node, None)
        super().dropNode(node)

    # ---- reverse dials ---------------------------------------------------------------------------

    def _onTick(self) -> None:  # noqa: N802 (pysyncobj's name)
        super()._onTick()
        now = time.monotonic()
        if now < self._next_reverse_check or self._selfNode is None:
            return
        self._next_reverse_check = now + REVERSE_CHECK_EVERY_S
        for node in list(self._nodes):
            if not isinstance(node, TCPNode) or self._shouldConnect(node) or node in self._preventConnectNodes:
                continue
            conn = self._connections.get(node)
            if conn is not None and conn.state != CONNECTION_STATE.DISCONNECTED:
                self._unreached.pop(node, None)
                continue
            since = self._unreached.setdefault(node, now)
            if now - since >= REVERSE_DIAL_AFTER_S:
                self._unreached[node] = now
                self._dial_reverse(node)

    def _dial_reverse(self, node: TCPNode) -> None:
        conn = self._outgoing_connection(node)
        self._connections[node] = conn
        self._reverse.add(conn)
        self.reverse_dials += 1
        if not conn.connect(node.ip, node.port):
            self._reverse.discard(conn)

    def _outgoing_connection(self, node: TCPNode) -> Any:
        """A connection object dialling `node`, wired as pysyncobj wires the ones it dials."""
        conf = self._syncObj.conf
        conn = pysyncobj_transport.TcpConnection(  # looked up at call time: binding.py may swap the class
            poller=self._syncObj._poller, timeout=conf.connectionTimeout, sendBufferSize=conf.sendBufferSize,
            recvBufferSize=conf.recvBufferSize, keepalive=conf.tcp_keepalive)
        conn.encryptor = self._syncObj.encryptor
        conn.setOnConnectedCallback(functools.partial(self._onOutgoingConnected, conn))
        conn.setOnMessageReceivedCallback(functools.partial(self._onMessageReceived, node))
        conn.setOnDisconnectedCallback(functools.partial(self._onDisconnected, conn))
        return conn


__all__ = ["GUEST_REQUESTS", "MAX_GUESTS", "REVERSE_DIAL_AFTER_S", "MembershipTransport"]
