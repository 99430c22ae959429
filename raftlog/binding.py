"""The pysyncobj binding: ONE versioned replicated entry point, and snapshot hooks.

Everything here runs on pysyncobj's tick thread, so every method is O(1) and never raises (an
exception in a replicated method wedges the node: pysyncobj retries the entry forever).

Snapshots: pysyncobj calls `serializer` synchronously on the tick thread. We only enqueue a
snapshot request to the apply thread and return; pysyncobj's own rename of its temp file then
fails harmlessly (we never create it), and `serializeChecker` reports SERIALIZING until the
snapshot writer has put a complete LMDB snapshot of the state at exactly that index in place as
the dump file. pysyncobj then drops the log up to there and streams that file to lagging
followers, whose `deserializer` reads only the file's Raft bookkeeping (fast) and hands the file
to their apply thread to load.

The Raft port: pysyncobj's connections are replaced by raftlog/peerguard.py's guarded ones (frame
size limit; with a password, limits on unauthenticated connections), installed below the same way
as the journal hook.
"""

from __future__ import annotations

import logging
import math
import os
import pickle
import queue
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import pysyncobj.pickle
import pysyncobj.syncobj
import pysyncobj.tcp_server
import pysyncobj.transport
from pysyncobj import FAIL_REASON as FAIL_REASON  # re-exported: log.py and proposer.py read pysyncobj here
from pysyncobj import SyncObj, SyncObjConf, replicated
from pysyncobj.config import SERIALIZER_STATE
from pysyncobj.node import TCPNode

from raftlog.appendfilter import skip_known_entries
from raftlog.appendflow import ProbeGate, RepeatedAnswers
from raftlog.applier import Applier
from raftlog.chunkedappend import whole_transmission
from raftlog.codec import RaftEntry, encode_raft_meta
from raftlog.journal import DurableJournal
from raftlog.keptdump import drop, put_back, received, set_aside
from raftlog.leadership import TRANSFER_VOTE, LeadershipConfirmer
from raftlog.leaseboard import LeaseBoard
from raftlog.peerguard import ENABLED as PEERGUARD_ENABLED
from raftlog.peerguard import GuardedTcpConnection, GuardedTcpServer, GuardedTransport
from raftlog.peerlinks import MembershipTransport
from raftlog.prevote import PreVote
from raftlog.raftview import Peer, RaftView
from raftlog.replysafety import REPLY, capped_ack, keeps_log, snapshot_message, stale_reply, stamp_term
from raftlog.roles import Role
from raftlog.tickwatch import TickWatch

# The pysyncobj whose private internals this module steers (pyproject.toml pins the same version):
# another version may rename or change them silently, so install() refuses it, loudly.
PYSYNCOBJ_VERSION = "0.3.17"
COMMAND_PICKLE_PROTOCOL = 4  # RaftNode.append_entry's

log = logging.getLogger("raftlog.binding")

# pysyncobj builds its journal with a module-level createJournal(path) and offers no other hook:
# route the paths we registered to our journals, anything else to pysyncobj's own.
_journals: dict[str, DurableJournal] = {}
_journals_lock = threading.Lock()
_pysyncobj_create_journal = pysyncobj.syncobj.createJournal
_installed = False


def _create_journal(path: str | None) -> object:
    with _journals_lock:
        journal = _journals.pop(path, None) if path else None
    return journal if journal is not None else _pysyncobj_create_journal(path)


def install() -> None:
    """Check pysyncobj's version and patch it: our journal hook, the guarded peer connections. Done once,
    by the first RaftNode; importing raftlog patches nothing (so the client, the pure state and the
    pipeline never load pysyncobj)."""
    global _installed
    with _journals_lock:
        if _installed:
            return
        if (found := metadata.version("pysyncobj")) != PYSYNCOBJ_VERSION:
            raise ImportError(f"raftlog steers pysyncobj {PYSYNCOBJ_VERSION}'s private internals, but pysyncobj "
                              f"{found} is installed: pip install pysyncobj=={PYSYNCOBJ_VERSION}")
        pysyncobj.syncobj.createJournal = _create_journal
        # pysyncobj's TCP server (accepted connections) and transport (outgoing ones) import TcpConnection
        # by name, the transport TcpServer too: point them at the guarded subclasses. The transport class
        # goes to SyncObj (RaftNode).
        if PEERGUARD_ENABLED:
            pysyncobj.tcp_server.TcpConnection = GuardedTcpConnection
            pysyncobj.transport.TcpConnection = GuardedTcpConnection
            pysyncobj.transport.TcpServer = GuardedTcpServer
        _installed = True


_transport_class = GuardedTransport if PEERGUARD_ENABLED else MembershipTransport


_ROLES = tuple(sorted(Role))  # by pysyncobj's state value

# Messages that state what is on this node's disk: the journal is synced before they leave.
_PROMISES_ON_DISK = frozenset({REPLY, "response_vote", "request_vote"})


@dataclass(frozen=True)
class PeerLink:
    """Another member as this node sees it (the Admin service's Members)."""

    connected: bool   # its Raft link is up
    match_index: int  # the last index known replicated to it (meaningful on the leader only)
    heard_s: float = math.inf  # seconds since it last answered this leader's appends (inf: never, or a follower)


class SnapshotProgress:
    """The serializer/checker handshake between the tick thread and the snapshot writer."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._state = SERIALIZER_STATE.NOT_SERIALIZING

    def start(self) -> None:
        with self._lock:
            self._state = SERIALIZER_STATE.SERIALIZING

    def finish(self, ok: bool) -> None:
        with self._lock:
            self._state = SERIALIZER_STATE.SUCCESS if ok else SERIALIZER_STATE.FAILED

    def check(self) -> int:
        with self._lock:
            state = self._state
            if state in (SERIALIZER_STATE.SUCCESS, SERIALIZER_STATE.FAILED):
                self._state = SERIALIZER_STATE.NOT_SERIALIZING  # report a result once
            return state


class RaftNode(SyncObj, RaftView):  # RaftView named: mypy checks the accessors against it (SyncObj is untyped)
    """pysyncobj's SyncObj with a single replicated method taking an opaque encoded Entry."""

    def __init__(self, self_addr: str, partners: list[str], conf: SyncObjConf, applier: Applier,
                 read_dump_meta: Callable[[str], tuple[RaftEntry, RaftEntry, list[str]]],
                 progress: SnapshotProgress, journal: DurableJournal, lease_promise_s: float = 0.0,
                 join_existing: bool = False, wire_compress_level: int = 3) -> None:
        install()
        self._applier = applier
        self.journal = journal
        self._commit_index = 0  # behind the commit-index property below; pysyncobj sets it first thing
        self.lease_board: LeaseBoard | None = None  # the workers' page: the commit index as it moves (leaseboard.py)
        self._read_dump_meta = read_dump_meta
        self._progress = progress
        self._enqueued = 0
        self._woken_for = 0  # the last log index a lone leader woke its tick loop to commit
        self._restores = 0
        # While pysyncobj handles a message that verified our log only up to some index, that index: the
        # answer acknowledges up to it, the commit index stops there. A snapshot this follower kept its log
        # for (Figure 13, step 6: raftlog/replysafety.py), an append that kept a tail of another term after
        # its end (raftlog/appendfilter.py)
        self._acked_through: int | None = None
        self._install_failed = False  # pysyncobj answers success after a load it failed: the answer says no
        # Held while raft.dump changes: a received snapshot renamed over it (and put back), our own linked to it
        self.dump_lock = threading.Lock()
        # While pysyncobj handles a snapshot message (raftlog/replysafety.py, 4) or an append that kept a tail of
        # another term (raftlog/appendfilter.py): how far the commit index may go
        self._commit_cap: int | None = None
        self.stale_replies = 0  # append answers of another term dropped (tests and status read it)
        self._stale_logged_term = -1
        # pysyncobj's own methods that send (transferLeadership) write the peer connection's buffer;
        # only the tick thread may: a gRPC thread doing it resized that buffer under the tick thread's
        # memoryview ("Existing exports of data: object cannot be re-sized", seen in CI)
        self._on_tick_calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.real_election_deadline = 0.0
        self.prevote: PreVote | None = None
        conf.serializer = self._serialize
        conf.deserializer = self._deserialize
        conf.serializeChecker = progress.check
        conf.journalFile = journal.path
        with _journals_lock:
            _journals[journal.path] = journal
        try:
            super().__init__(self_addr, partners, conf=conf, transportClass=_transport_class)
        finally:
            with _journals_lock:
                _journals.pop(journal.path, None)
        # pysyncobj renames a received snapshot over its dump before we decide to keep the log: set ours aside
        serializer = self._SyncObj__serializer
        serializer.setTransmissionData = self._receive_snapshot_piece(serializer.setTransmissionData)
        # Durability: a message that promises what is on this node's disk (an acknowledgement of
        # entries, a vote) first syncs the journal on this thread, so nothing is acknowledged that a
        # power loss could take back; one fdatasync covers every entry appended since the last one.
        # The leader never waits for its own disk here: its appends go out unsynced so its fsync
        # overlaps its followers' (Raft thesis, section 10.2.1), the journal's syncer thread makes them
        # durable, and the leader counts itself towards a commit only up to the journal's durable
        # index (the commit-index property below). A stalled fsync on the tick thread stalled the
        # heartbeats and cost an election per stall (docs/faults.md).
        transport = self._SyncObj__transport
        if isinstance(transport, GuardedTransport):
            transport.compress_level = wire_compress_level
            # A tick pass's frames to one peer go out in one send() (raftlog/peerguard.py): flushed after
            # the pass's appends (_checkCommandsToApply below), before the poll and after what it handled
            transport.coalesce = True
            poll = self._poller.poll

            def poll_flushed(timeout: float) -> None:
                transport.flush()
                try:
                    poll(timeout)
                finally:
                    transport.flush()

            self._poller.poll = poll_flushed
        send = transport.send

        self.probe_gate = gate = ProbeGate(conf.appendEntriesPeriod)
        self.repeated_answers = answers = RepeatedAnswers(conf.appendEntriesPeriod)

        def send_after_sync(node: object, message: object) -> object:
            kind = message.get("type") if isinstance(message, dict) else None
            if kind == "request_vote" and isinstance(message, dict) and message.get("term") == prevote.transfer_term:
                message = {**message, TRANSFER_VOTE: True}
            elif kind == "timeout_now":
                leadership.give_up_lease()  # before the target can campaign
            if kind == REPLY and isinstance(message, dict):
                message = capped_ack(stamp_term(message, self.current_term()), self._acked_through,
                                     failed=self._install_failed)
            if kind in _PROMISES_ON_DISK:
                journal.sync()
                if kind == REPLY and isinstance(message, dict) and not answers.may_send(node, message):
                    return True  # it repeats the last answer to that leader (raftlog/appendflow.py)
            elif kind == "append_entries" and not gate.may_send(node, message):
                return True  # held back while the follower is probed (raftlog/appendflow.py)
            return send(node, message)

        self.leadership = leadership = LeadershipConfirmer(self, lease_promise_s)
        # a joining node waits for a leader only while its log holds no leader's entry (the last one is
        # pysyncobj's own, at term 0): once it has any, the setting is ignored
        self.prevote = prevote = PreVote(
            self, conf.raftMinTimeout, conf.raftMaxTimeout, promised=leadership.promises_now,
            heartbeat_s=conf.appendEntriesPeriod,
            await_leader=join_existing and int(self._SyncObj__raftLog[-1][2]) == 0)
        transport.send = send_after_sync
        deliver = transport._onMessageReceivedCallback

        def receive(node: object, message: object) -> None:
            if prevote.on_message(node, message) or leadership.on_message(node, message):
                return
            if isinstance(message, dict) and message.get("type") == "request_vote" \
                    and leadership.refuses_vote(message):
                # take the newer term (a leader steps down), grant nothing: a log too old to vote for
                message = {**message, "last_log_term": -1, "last_log_index": -1}
            if stale_reply(message, self.current_term()):
                self._drop_stale_reply(node, message)  # an answer to another term's append: says nothing of this one
                return
            gate.on_reply(node, message)
            message = whole_transmission(message, self._SyncObj__recvTransmission, pysyncobj.pickle.loads)
            entries = self._SyncObj__raftLog
            acked_through = None
            if len(entries):
                first, last = entries[0][1], entries[-1]

                def term_at(index: int) -> int | None:
                    return entries[index - first][2] if first <= index <= last[1] else None

                message, acked_through = skip_known_entries(message, last[1], last[2], term_at)
            snapshot = snapshot_message(message)
            if snapshot:
                self._commit_cap = self._commit_index  # raised by a snapshot installed or kept (below)
            elif acked_through is not None:
                self._acked_through = self._commit_cap = acked_through
            try:
                if snapshot:
                    with self.dump_lock:  # the dump is swapped in here: the snapshot writer waits
                        deliver(node, message)
                else:
                    deliver(node, message)
            finally:
                self._acked_through = None  # all set only while pysyncobj handles the message
                self._install_failed = False
                self._commit_cap = None

        transport.setOnMessageReceivedCallback(receive)
        link_down = transport._onNodeDisconnectedCallback

        def on_link_down(node: object) -> None:
            prevote.on_link_lost(node)  # our leader's link closed: its process may be gone
            answers.forget(node)  # what went out on that link may never have arrived
            if link_down is not None:
                link_down(node)

        transport.setOnNodeDisconnectedCallback(on_link_down)
        self.tick_watch = TickWatch()
        self.addOnTickCallback(self._on_tick)
        journal.start_syncer(self._on_durable)
        self.tick_watch.start()

    # pysyncobj reads its election timer in one place, to decide whether to campaign. Reading it
    # through this property lets the pre-vote decide (raftlog/prevote.py); writes go through.
    @property
    def _SyncObj__raftElectionDeadline(self) -> float:  # noqa: N802 (pysyncobj's mangled name)
        if self.prevote is None or self.prevote.may_campaign():
            return self.real_election_deadline
        return float("inf")

    @_SyncObj__raftElectionDeadline.setter
    def _SyncObj__raftElectionDeadline(self, value: float) -> None:  # noqa: N802
        self.real_election_deadline = value

    # ---- pysyncobj's private state: read here and nowhere else (shared/notes/pysyncobj.md) ----------
    # The accessors of raftlog.raftview.RaftView (what prevote.py and leadership.py read), then the log's.

    def role(self) -> Role:
        return _ROLES[self._SyncObj__raftState]  # Role(state) costs an enum lookup: ~0.6 us, twice a tick

    def current_term(self) -> int:
        return int(self._SyncObj__raftCurrentTerm)

    def commit_index(self) -> int:
        return self._commit_index

    def leader_peer(self) -> Peer | None:
        leader: Peer | None = self._SyncObj__raftLeader
        return leader

    def self_peer(self) -> Peer | None:
        node: Peer | None = getattr(self, "_SyncObj__selfNode", None)
        return node

    def other_peers(self) -> Collection[Peer]:
        nodes: Collection[Peer] = self._SyncObj__otherNodes
        return nodes

    def last_log(self) -> tuple[int, int]:
        entry = self._SyncObj__raftLog[-1]
        return int(entry[1]), int(entry[2])

    def transfer_in_progress(self) -> bool:
        return bool(self._SyncObj__transferInProgress)

    def noop_index(self) -> int | None:
        index = self._SyncObj__noopIDx
        return None if index is None else int(index)

    def send(self, peer: Peer, message: dict[str, Any]) -> None:
        self._SyncObj__transport.send(peer, message)  # the durability wrapper installed above

    def peer_links(self) -> dict[str, PeerLink]:
        """Each other member's link and, as the leader knows it, how far its log matches ours."""
        match = self._SyncObj__raftMatchIndex
        heard = self._SyncObj__lastResponseTime  # the leader's, per member, on pysyncobj's monotonic clock
        now = pysyncobj.syncobj.monotonicTime()
        return {node.id: PeerLink(connected=bool(self.isNodeConnected(node)), match_index=int(match.get(node, 0)),
                                  heard_s=now - heard[node] if node in heard else math.inf)
                for node in list(self._SyncObj__otherNodes)}

    def last_log_index(self) -> int | None:
        """The index of the last entry in the Raft log (None when the log is empty)."""
        entries = self._SyncObj__raftLog
        return int(entries[-1][1]) if len(entries) else None

    def leader_commit_index(self) -> int | None:
        """The commit index the leader last reported (None before any leader was heard)."""
        value = self._SyncObj__leaderCommitIndex
        return None if value is None else int(value)

    def wake(self) -> None:
        """Wake the tick thread out of its poll (pysyncobj's pipe notifier)."""
        notifier = getattr(self, "_SyncObj__pipeNotifier", None)
        if notifier is not None:
            notifier.notify()

    def call_on_tick(self, fn: Callable[[], None]) -> None:
        """Run fn on the tick thread at its next tick (woken now); any thread may call this."""
        self._on_tick_calls.put(fn)
        self.wake()

    def tick_thread(self) -> threading.Thread | None:
        """pysyncobj's auto-tick thread (None before it started); close() joins it after destroy()."""
        thread: threading.Thread | None = self._SyncObj__thread
        return thread

    def _checkCommandsToApply(self) -> None:  # noqa: N802 (pysyncobj's name)
        # pysyncobj appends the queued commands and sends each to the followers here: the commit index's
        # append and the new entries' of this pass leave now, together, not after the rest of the pass
        try:
            super()._checkCommandsToApply()
        finally:
            transport = self._SyncObj__transport
            if isinstance(transport, GuardedTransport):
                transport.flush()

    def append_entry(self, data: bytes, callback: Callable[[Any, int], None]) -> None:
        """Propose `data` (an encoded Entry) for apply_entry, as `apply_entry(data, callback=callback)` does, with
        the command pickled at protocol 4 instead of pysyncobj's 2: protocol 2 stores bytes as latin-1 text
        (up to twice as long in the journal and on the wire) that every node's apply turns back with a call:
        ~16 us an entry between the leader's pickle and each node's unpickle (session 25). pysyncobj's apply
        (pickle.loads) reads both, so logs and journals written before read as ever."""
        func_id = self._methodToID[self._getFuncName("apply_entry")]
        self._applyCommand(pickle.dumps((func_id, (data,)), COMMAND_PICKLE_PROTOCOL), callback,
                           pysyncobj.syncobj._COMMAND_TYPE.REGULAR)

    @replicated
    def apply_entry(self, data: bytes) -> None:
        # The only replicated method, ever: the Entry inside carries its own format version, so
        # adding features never shifts pysyncobj's method ids between mixed-version nodes.
        # While pysyncobj applies entry N, its last-applied counter still says N - 1.
        try:
            index = self.raftLastApplied + 1
            self._enqueued = index
            self._applier.enqueue_entry(index, data)
        except Exception:  # never raise on the tick thread
            log.exception("could not enqueue an entry")

    # pysyncobj's leader counts itself towards every commit. Reading and writing its commit index
    # through this property counts the leader only up to what its own disk has (the journal's durable
    # index): an index commits when a majority holds it durably, the leader's copy or not (Raft thesis,
    # section 10.2.1). With a slow disk on the leader, its followers' copies commit without it.
    @property
    def _SyncObj__raftCommitIndex(self) -> int:  # noqa: N802 (pysyncobj's mangled name)
        return self._commit_index

    @_SyncObj__raftCommitIndex.setter
    def _SyncObj__raftCommitIndex(self, value: int) -> None:  # noqa: N802
        if value > self._commit_index and getattr(self, "_SyncObj__raftState", None) == Role.LEADER:
            value = self._durable_commit(value)
        cap = getattr(self, "_commit_cap", None)
        if cap is not None and value > self._commit_index:
            value = max(self._commit_index, min(value, cap))  # a log the message did not verify
        self._commit_index = value
        if (board := self.lease_board) is not None:  # before anything up to it is applied
            board.commit(value)

    def _durable_commit(self, wanted: int) -> int:
        """The leader's commit index: `wanted` (pysyncobj's, counting the leader) held to a majority of
        durable copies."""
        durable = self.journal.durable_index
        if wanted <= durable:
            return wanted
        others = self._SyncObj__otherNodes
        matched = sorted((self._SyncObj__raftMatchIndex.get(n, 0) for n in others), reverse=True)
        majority = (len(others) + 1) // 2 + 1
        by_followers = matched[majority - 1] if len(matched) >= majority else 0
        allowed = min(wanted, max(durable, by_followers))
        if allowed <= self._commit_index:
            return self._commit_index
        # Raft commits by counting only entries of the leader's term (the older ones commit with the
        # first of the term after them), and the leader's term holds the end of its log.
        entries = self._SyncObj__raftLog
        first = entries[0][1]
        if allowed < first or entries[allowed - first][2] != self._SyncObj__raftCurrentTerm:
            return self._commit_index
        return allowed

    def _on_durable(self) -> None:
        """The journal's syncer moved the durable index: let the tick count the leader again, when that can
        commit anything."""
        try:
            if self._isLeader() and self._durable_may_commit():
                self.wake()
        except Exception:  # never raise on the syncer thread
            log.exception("could not wake the tick loop")

    def _durable_may_commit(self) -> bool:
        """Syncer thread, after it moved the durable index: whether the leader's own copy can now complete a
        majority, i.e. enough followers already hold an entry past the commit index. Usually the leader's
        fsync finishes before any follower's answer arrives, and a wake then found nothing to commit: a
        pass of the tick thread per entry for nothing (session 25). No commit is missed: the tick computes
        the commit index at the start of every pass, and a pass follows every answer it reads; an answer
        read before this check is counted here, one read after it meets the durable index already moved.
        Reading pysyncobj's dicts off the tick thread may race a membership change: then wake anyway."""
        try:
            others = list(self._SyncObj__otherNodes)
            match = self._SyncObj__raftMatchIndex
            commit = self._commit_index
            ahead = sum(1 for node in others if match.get(node, 0) > commit)
            return ahead >= (len(others) + 1) // 2  # with the leader, (len(others) + 1) // 2 + 1: a majority
        except Exception:
            return True

    def _on_tick(self) -> None:
        self.tick_watch.beat()
        calls = self._on_tick_calls
        while not calls.empty():  # this thread alone takes from it: not empty, a get finds one
            try:
                call = calls.get_nowait()
            except queue.Empty:
                break
            try:
                call()
            except Exception:
                log.exception("a call on the tick thread failed")
        # The leader's entries appended this tick go to the syncer; the commit index follows it.
        self.journal.request_sync()
        try:
            self._wake_lone_leader()
        except Exception:
            log.exception("could not wake the tick loop")
        try:
            if self.prevote is not None:
                self.prevote.on_tick()
                self.leadership.on_tick()
        except Exception:
            log.exception("pre-vote or read-index tick failed")
        # Entries of pysyncobj's own (no-ops, membership) do not reach apply_entry_v1; keep the
        # apply offset moving past them so offsets line up with the Raft log.
        try:
            last = self.raftLastApplied
            if last > self._enqueued:
                self._enqueued = last
                self._applier.enqueue_advance(last)
        except Exception:
            log.exception("tick callback failed")

    def _wake_lone_leader(self) -> None:
        """In a 1-member cluster no follower's answer wakes the tick loop, so an entry appended this tick
        (synced above) would commit only at the next tick, after pysyncobj's 50 ms poll: every write
        waited about 50 ms. Wake it once per newly appended entry; the next tick commits it.
        Not with the journal's syncer: the leader counts itself only up to the durable index, so that
        wake found nothing to commit (a pipe write and read and a tick's pass per entry, for nothing);
        the syncer's own wake after the sync (_on_durable) is the one that commits."""
        if self._SyncObj__otherNodes or self.journal.syncs_in_background or not self._isLeader():
            return
        entries = self._SyncObj__raftLog
        last = entries[-1][1] if len(entries) else 0
        if last > self._woken_for and last > self.raftCommitIndex:
            self._woken_for = last
            self.wake()

    def _drop_stale_reply(self, node: Any, message: Any) -> None:
        self.stale_replies += 1
        if self._stale_logged_term != self.current_term():  # once per term: an election strands a few
            self._stale_logged_term = self.current_term()
            log.info("dropped an append answer of term %s from %s at term %d (success %s, next index %s)",
                     message.get("term"), getattr(node, "id", node), self.current_term(), message.get("success"),
                     message.get("next_node_idx"))

    # pysyncobj installs a snapshot sent by its leader with __loadDumpFile(clearJournal=True), which clears
    # the whole log. Reading it through here keeps the log when this follower holds the snapshot's last
    # entry (raftlog/replysafety.py, rule 2). A restart's load (clearJournal=False) goes through unchanged.
    def _SyncObj__loadDumpFile(self, clearJournal: bool) -> None:  # noqa: N802,N803 (pysyncobj's names)
        dump, fsync = self._SyncObj__conf.fullDumpFile, self.journal.fsync
        if clearJournal and self._keeps_log_for_snapshot():
            put_back(dump, fsync)  # the log goes with our own dump (raftlog/keptdump.py)
            return
        restores = self._restores
        SyncObj._SyncObj__loadDumpFile(self, clearJournal)
        # pysyncobj swallows a failed load (our deserializer raised: the apply stopped, loudly) and then
        # answers success with the log it still has, which its leader would count towards commits
        self._install_failed = clearJournal and self._restores == restores
        if self._install_failed:
            put_back(dump, fsync)  # the load failed before it changed anything: the log is still ours
        elif clearJournal:
            drop(dump)
            self._commit_cap = self.last_log()[0]  # the log is the snapshot's now: the leader's

    def _receive_snapshot_piece(self, receive: Callable[[Any], bool]) -> Callable[[Any], bool]:
        """pysyncobj's Serializer.setTransmissionData, which renames the last piece's file over the dump,
        with the dump in place set aside first (raftlog/keptdump.py)."""
        dump = self._SyncObj__conf.fullDumpFile

        def receive_piece(data: Any) -> bool:
            last = isinstance(data, tuple) and len(data) == 3 and bool(data[2])
            if last:
                try:
                    set_aside(dump, self.journal.fsync)
                except OSError as exc:
                    log.warning("could not set %s aside before a snapshot from the leader (%s); dropped that "
                                "snapshot, the leader sends it again", dump, exc)
                    return False
            done = receive(data)
            if done and last:
                try:
                    received(dump, self.journal.fsync)
                except OSError as exc:  # not durable: not installed (the one set aside comes back)
                    log.warning("could not make the snapshot from the leader durable in %s (%s); dropped it, "
                                "the leader sends it again", dump, exc)
                    put_back(dump, self.journal.fsync)
                    return False
            return done

        return receive_piece

    def _keeps_log_for_snapshot(self) -> bool:
        try:
            last, _prev, _cluster = self._read_dump_meta(self._SyncObj__conf.fullDumpFile)
        except Exception:
            return False  # pysyncobj's load reports it (the deserializer above)
        entries = self._SyncObj__raftLog
        first, end = (entries[0][1], entries[-1][1]) if len(entries) else (1, 0)

        def term_at(index: int) -> int | None:
            return int(entries[index - first][2]) if first <= index <= end else None

        if not keeps_log(last, self.raftLastApplied, term_at):
            return False
        self._acked_through = self._commit_cap = int(last[1])
        log.info("kept the log through %d over a leader's snapshot at %d (applied %d): it holds that entry",
                 end, last[1], self.raftLastApplied)
        return True

    def _serialize(self, tmp_path: str, data: tuple) -> None:
        last, prev, cluster = data
        nodes = [getattr(n, "id", str(n)) for n in cluster]
        self._progress.start()
        self._applier.enqueue_snapshot(last[1], last[2], encode_raft_meta(tuple(last), tuple(prev), nodes))

    def _deserialize(self, path: str) -> tuple:
        try:
            last, prev, cluster = self._read_dump_meta(path)
        except Exception as exc:
            # pysyncobj would log this and replay its (compacted) journal onto an empty state: a
            # silent divergence. Stop applying instead, loudly, and let status show why.
            self._applier.fail(f"cannot load snapshot {path}: {exc}")
            raise
        # pysyncobj may replace `path` with the next snapshot before the apply thread gets to it,
        # so hand over a hard link of this one.
        self._restores += 1
        staged = f"{path}.restore-{last[1]}-{self._restores}"
        if os.path.exists(staged):
            os.unlink(staged)
        os.link(path, staged)
        self._enqueued = max(self._enqueued, last[1])
        self._applier.enqueue_restore(staged, last[1])
        return last, prev, {TCPNode(addr) for addr in cluster}
