"""ReplicatedLog: the facade the service uses. Offsets, proposals, barrier, snapshots, status.

end offset = last index in the Raft log; commit offset = last index known replicated on a
majority; apply offset = last index built into the state. apply <= commit <= end on every node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from raftlog.applier import Applied, Applier, StateMachine
from raftlog.binding import FAIL_REASON, PeerLink, RaftNode, SnapshotProgress, SyncObjConf
from raftlog.codec import RaftEntry, decode_raft_meta
from raftlog.crashpoints import crash_point
from raftlog.history import AppliedEntry, EntryHistory
from raftlog.journal import DurableJournal, fsync_dir
from raftlog.keptdump import settle
from raftlog.leadership import LEASE_PROMISE_FRACTION, NotConfirmed
from raftlog.leaseboard import LeaseBoard
from raftlog.pb import entry_pb2
from raftlog.proposer import GroupCommitter, NotLeader, ProposalError
from raftlog.roles import Role
from raftlog.seed import DUMP_NAME, JOURNAL_NAME

log = logging.getLogger("raftlog")



@dataclass(frozen=True)
class LogStats:
    """Counters and gauges of the log, read without locks (each a plain value one thread writes)."""

    batches_proposed: int        # proposals this node group-committed as leader
    entries_proposed: int        # log entries those became
    apply_queue: int             # committed entries waiting for the apply thread
    seconds_since_apply: float   # since the apply thread last applied an entry (or started)
    has_quorum: bool             # this node hears from a majority
    apply_error: str             # why apply stopped for good ("" while it runs)
    lease_reads: int = 0         # read indexes this leader answered under its lease (no round trip)
    read_rounds: int = 0         # ping rounds this leader ran (reads without a lease, and lease renewals)
    read_asks: int = 0           # read indexes this follower asked of its leader over the Raft link
    votes_refused: int = 0       # vote requests this node refused under a lease promise
    pre_vote_rounds: int = 0     # pre-vote rounds this node started (its election timer ran out)
    leader_links_lost: int = 0   # times its leader's link went down and brought the election timer forward


@dataclass(frozen=True)
class LeaderView:
    """Who leads as this node sees it, and whether it is ready: one event of the leader stream."""

    leader: str | None           # the leader's Raft address; None while an election runs
    term: int
    self_leads: bool
    ready: bool


NO_VIEW = LeaderView(leader=None, term=0, self_leads=False, ready=False)


class Subscription:
    """A listener registered with ReplicatedLog.subscribe(), watch_leader() or watch_leadership();
    close() unregisters it (idempotent)."""

    def __init__(self, listeners: list[Callable[[Any], Any]], listener: Callable[[Any], Any]) -> None:
        self._listeners, self._listener = listeners, listener
        listeners.append(listener)

    def close(self) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(self._listener)


@dataclass(frozen=True)
class _ViewEvent:
    view: LeaderView
    role: bool | None = None                                  # this node's new role: watch_leadership's
    first_for: Callable[[LeaderView], object] | None = None   # a new listener's first view, for it alone


@dataclass
class LogConfig:
    self_addr: str
    partners: list[str]
    data_dir: str
    snapshot_every_entries: int = 10_000      # etcd 3.6's default
    snapshot_every_seconds: float = 300.0
    snapshots_kept: int = 3
    election_min_s: float = 0.4
    election_max_s: float = 1.4
    leader_fallback_s: float = 30.0           # pysyncobj's default; see DESIGN invariant 2
    # pysyncobj drops a link after connectionTimeout (3.5 s) without data, and two followers never
    # exchange any: their link is down most of the time and reconnects only every
    # connectionRetryTime (default 5 s). A follower with no live link never starts an election, so
    # a dead leader went unreplaced for up to 5 s, and both followers then stood at once (split
    # vote). Measured: failover p50 1.0 s / max 5.1 s with 5 s, see docs/benchmarks.md.
    connection_retry_s: float = 0.1
    batch_append: bool = False                 # measured: sending per entry commits ~100x sooner
    group_linger_s: float = 0.002
    group_in_flight: int = 2                   # entries appended and not yet committed (raftlog/proposer.py)
    password: str | None = None
    fsync: bool = True                         # sync the journal before acknowledging (raftlog/journal.py)
    read_lease: bool = True                    # the leader's read index under a lease (raftlog/leadership.py)
    wire_compress_level: int = 3               # zlib level of the frames this node sends (pysyncobj's: 3)
    # An empty node joining a cluster that has data: it never campaigns before it has heard a leader
    # (two empty nodes beside one survivor would otherwise elect an empty leader; raftlog/prevote.py)
    join_existing: bool = False

    @property
    def lease_promise_s(self) -> float:
        """How long a yes to a leader's ping forbids a vote: below election_min_s, so that a dead
        leader's followers are free again before a pre-vote can pass (0: no lease)."""
        return LEASE_PROMISE_FRACTION * self.election_min_s if self.read_lease else 0.0


class SnapshotStoreLike(Protocol):
    """What raftlog needs of snapshot.SnapshotStore (raftlog does not import it)."""

    def write(self, offset: int, term: int, digest: str, items: Any, meta: bytes = b"") -> Any: ...
    def read_info(self, path: str) -> Any: ...
    def import_file(self, src_path: str, *, move: bool = False, check_entries: bool = True) -> Any: ...
    def load(self, path: str, verify: bool = True, *, bytes_verified: bool = False) -> tuple[Any, Any]: ...
    def link_to(self, info: Any, dest_path: str) -> object: ...
    def prune(self, keep: int) -> object: ...


class ReplicatedLog:
    def __init__(self, cfg: LogConfig, fsm: StateMachine, store: SnapshotStoreLike,
                 state_lock: AbstractContextManager[Any]) -> None:
        self.cfg = cfg
        self.fsm = fsm
        self.store = store
        os.makedirs(cfg.data_dir, exist_ok=True)
        self.dump_path = os.path.join(cfg.data_dir, DUMP_NAME)
        self.journal_path = os.path.join(cfg.data_dir, JOURNAL_NAME)
        self._cleanup_stale_files()
        # an install a crash cut short may have left the node's own snapshot set aside (raftlog/keptdump.py)
        settle(self.dump_path, self._dump_index, cfg.fsync)
        # Opened first: a corrupt journal stops the node before anything else starts.
        self.journal = DurableJournal(self.journal_path, fsync=cfg.fsync, compacted_to=self._snapshot_first_entry())
        self.applier = Applier(fsm, state_lock)
        self.applier.snapshot_handler = self._write_snapshot
        self.applier.restore_handler = self._load_snapshot
        self.progress = SnapshotProgress()
        self.snapshot_offset = 0
        self.snapshot_time = 0.0
        self.snapshot_bytes = 0
        self._snapshot_writer: threading.Thread | None = None
        self._ready_target: int | None = None
        # One ordered stream of leader views, seen on the tick thread, delivered on one thread of its own
        self._view_listeners: list[Callable[[LeaderView], object]] = []
        self._leader_listeners: list[Callable[[bool], None]] = []
        self._leader_events: queue.SimpleQueue[_ViewEvent | None] = queue.SimpleQueue()
        self._view = NO_VIEW
        self._view_key: tuple[str | None, int, bool, bool] = (None, 0, False, False)
        self._view_lock = threading.Lock()  # a new listener's first view and the stream stay in order
        self._leader_thread = threading.Thread(target=self._dispatch_views, name="leader-events", daemon=True)
        self._leader_thread.start()
        self._was_leader = False
        self.leader_changes = 0
        self.applier.start()
        conf = SyncObjConf(
            journalFile=self.journal_path,
            fullDumpFile=self.dump_path,
            appendEntriesUseBatch=cfg.batch_append,
            raftMinTimeout=cfg.election_min_s,
            raftMaxTimeout=cfg.election_max_s,
            leaderFallbackTimeout=cfg.leader_fallback_s,
            connectionRetryTime=cfg.connection_retry_s,
            # pysyncobj refuses an election timeout longer than its link timeout (3.5 s by default)
            connectionTimeout=max(3.5, cfg.election_max_s),
            logCompactionMinEntries=cfg.snapshot_every_entries,
            logCompactionMinTime=cfg.snapshot_every_seconds,
            onStateChanged=self._on_state_changed,
            password=cfg.password,
            dynamicMembershipChange=True,  # members can be added/removed at runtime, one at a time
        )
        # pysyncobj's tick thread starts inside RaftNode's constructor and may change this node's role
        # before `self.raft` is set (an election while a long journal replays): the committer exists
        # first, and a role change seen then is passed on once the constructor returned (_role_lock).
        self.committer = GroupCommitter(self.applier, self._append, self.is_leader, self.term,
                                        linger_s=cfg.group_linger_s, max_in_flight=cfg.group_in_flight)
        self._role_lock = threading.Lock()
        self._role_before_raft: bool | None = None
        self.raft = RaftNode(cfg.self_addr, cfg.partners, conf, self.applier,
                             self._read_dump_meta, self.progress, self.journal, cfg.lease_promise_s,
                             join_existing=cfg.join_existing, wire_compress_level=cfg.wire_compress_level)
        with self._role_lock:
            if self._role_before_raft is not None:
                self._observe(role=self._role_before_raft)
        self.raft.addOnTickCallback(self._on_tick)
        self.committer.start()

    def _same_file_as(self, path: str) -> str:
        """'(the same file as snapshots/snap-...mdb) ' when the store holds a hard link of `path`."""
        directory: str = getattr(self.store, "directory", None) or ""
        try:
            inode = os.stat(path).st_ino
            for name in sorted(os.listdir(directory)) if directory else []:
                if os.stat(os.path.join(directory, name)).st_ino == inode:
                    return f"(the same file as {os.path.join(directory, name)}) "
        except OSError:
            pass
        return ""

    def _cleanup_stale_files(self) -> None:
        for name in os.listdir(self.cfg.data_dir):
            if ".restore-" in name or name in ("raft.dump.tmp", "raft.dump.1.tmp", "raft.journal.compact"):
                os.unlink(os.path.join(self.cfg.data_dir, name))

    def close(self) -> None:
        """Stop and wait: when this returns no thread of this log touches its files or its port, so the
        same data directory can be opened again at once (pysyncobj's destroy() only asks its tick
        thread to stop at its next tick; a restart that raced it ran two Raft nodes on one journal)."""
        self.committer.stop()
        self.raft.tick_watch.stop()  # the tick stops below: not a stall
        try:
            self.raft.destroy()
            tick = self.raft.tick_thread()
            if tick is not None and tick is not threading.current_thread():
                tick.join(timeout=10)
        finally:
            self.applier.stop()
            self._leader_events.put(None)
            if self._leader_thread is not threading.current_thread():
                self._leader_thread.join(timeout=5)
            writer = self._snapshot_writer
            if writer is not None and writer is not threading.current_thread():
                writer.join(timeout=30)

    # ---- offsets and roles -------------------------------------------------------------------

    @property
    def apply_offset(self) -> int:
        return self.applier.apply_offset

    @property
    def commit_offset(self) -> int:
        return self.raft.raftCommitIndex

    @property
    def end_offset(self) -> int:
        last = self.raft.last_log_index()
        return self.commit_offset if last is None else last

    def term(self) -> int:
        return self.raft.raftCurrentTerm

    def is_leader(self) -> bool:
        return self.raft._isLeader()

    def leader(self) -> str | None:
        node = self.raft._getLeader()
        return node.id if node is not None else None

    def role(self) -> Role:
        return self.raft.role()

    @property
    def ready(self) -> bool:
        """Loaded its snapshot and applied everything committed when it first heard the cluster."""
        return self._ready_target is not None and self.applier.apply_offset >= self._ready_target \
            and not self.applier.failed

    def peer_links(self) -> dict[str, PeerLink]:
        """Each other member's Raft link and match index, by Raft address."""
        return self.raft.peer_links()

    @property
    def has_quorum(self) -> bool:
        return bool(self.raft.hasQuorum)

    @property
    def apply_error(self) -> str:
        """Why apply stopped for good; "" while it runs."""
        return self.applier.failed or ""

    def stats(self) -> LogStats:
        lead, prevote = self.raft.leadership, self.raft.prevote
        assert prevote is not None  # set in RaftNode's constructor
        return LogStats(batches_proposed=self.committer.batches_appended,
                        entries_proposed=self.committer.entries_appended,
                        apply_queue=self.applier.queued(),
                        seconds_since_apply=time.monotonic() - self.applier.last_apply_time,
                        has_quorum=self.has_quorum, apply_error=self.apply_error,
                        lease_reads=lead.lease_reads, read_rounds=lead.rounds, read_asks=lead.asks,
                        votes_refused=lead.votes_refused, pre_vote_rounds=prevote.rounds_started,
                        leader_links_lost=prevote.leader_links_lost)

    # ---- applied entries: listeners and the recent history -------------------------------------

    def subscribe(self, listener: Callable[[AppliedEntry], None]) -> Subscription:
        """Call `listener` on the apply thread after each applied entry, before apply_offset moves to it
        (it must not block); close the returned Subscription to stop."""
        return Subscription(self.applier.entry_listeners, listener)

    def subscribe_resets(self, listener: Callable[[int], None]) -> Subscription:
        """Call `listener(offset)` on the apply thread when a snapshot replaced the state at `offset`
        (entries up to it were not seen one by one), before apply_offset moves; close() to stop."""
        return Subscription(self.applier.reset_listeners, listener)

    def watch_leader(self, listener: Callable[[LeaderView], object]) -> Subscription:
        """Call `listener(view)` with the current LeaderView, then with each change of the leader, the
        term, this node's role or its readiness, in order, on the leader-events thread (never the tick
        thread: a listener may block briefly); close() to stop."""
        with self._view_lock:
            subscription = Subscription(self._view_listeners, listener)
            self._leader_events.put(_ViewEvent(self._view, first_for=listener))
        return subscription

    def watch_leadership(self, listener: Callable[[bool], None]) -> Subscription:
        """Call `listener(is_leader)` each time this node gains or loses leadership (the same stream,
        on the same thread, as watch_leader); close() to stop."""
        return Subscription(self._leader_listeners, listener)

    def _dispatch_views(self) -> None:
        # A listener hears broadcasts only after its first view: one queued before it subscribed would
        # otherwise reach it ahead of (or twice with) the view it starts from.
        started: list[Callable[[LeaderView], object]] = []
        while (event := self._leader_events.get()) is not None:
            listeners = list(self._view_listeners)
            started = [s for s in started if s in listeners]
            if event.first_for is not None:
                targets = [event.first_for] if event.first_for in listeners else []
                started += targets
            else:
                targets = [s for s in listeners if s in started]
            for listener in targets:
                self._deliver(listener, event.view)
            if event.role is not None:
                for role_listener in list(self._leader_listeners):
                    self._deliver(role_listener, event.role)

    @staticmethod
    def _deliver(listener: Callable[[Any], object], value: Any) -> None:
        try:
            listener(value)
        except Exception:
            log.exception("leader listener failed")

    def _observe(self, role: bool | None = None) -> None:
        """Tick thread: put the view on the leader stream when it changed (`role`: this node's role
        just changed to it)."""
        seen = (self.leader(), self.term(), self.is_leader() if role is None else role, self.ready)
        if seen != self._view_key or role is not None:  # a tuple compare: this runs on every tick
            view = LeaderView(*seen)
            with self._view_lock:
                self._view, self._view_key = view, seen
                self._leader_events.put(_ViewEvent(view, role=role))

    @property
    def restores(self) -> int:
        """Snapshots restored here since the start (each replaced the state): Log.Follow sends its
        followers the state again after one."""
        return self.applier.restores

    @property
    def history(self) -> EntryHistory:
        """The recent applied entries (a bounded ring): after(), first_kept. Read only."""
        return self.applier.history

    # ---- writes and reads ----------------------------------------------------------------------

    def propose(self, batch: entry_pb2.Batch, timeout: float) -> Applied:
        return self.committer.propose(batch, timeout)

    def barrier(self, timeout: float) -> int:
        """Commit a no-op through the log and wait for its local apply; returns its offset."""
        return self.propose(entry_pb2.Batch(request_id=uuid.uuid4().hex), timeout).offset

    def leased_read_index(self) -> int | None:
        """The leader's commit index if it holds a valid read lease (raftlog/leadership.py), at once
        and from any thread; None otherwise (then ask read_index)."""
        return self.raft.leadership.leased_index()

    def publish_lease(self, path: str) -> LeaseBoard:
        """Keep this node's read lease and commit index on a page at `path` for its worker processes
        (raftlog/leaseboard.py): no lease there until the tick thread took the page over."""
        board = LeaseBoard(path)

        def attach() -> None:  # the tick thread is the page's one writer from here on
            self.raft.lease_board = board
            board.commit(self.raft.commit_index())
            self.raft.leadership.board = board
            self.raft.leadership.publish_lease()

        self.raft.call_on_tick(attach)
        return board

    def hold_read_index_answers(self, hold: Callable[[], AbstractContextManager[Any]]) -> None:
        """Run the answers of one TELL or heartbeat round inside `hold()` (on the tick thread): the node's
        write channel sends their replies to a worker in one frame (writechannel.sends_held)."""
        self.raft.leadership.resolving = hold

    def read_index_from_leader(self, timeout: float) -> int | None:
        """A follower's read index, asked of the leader over the Raft link (one message each way, no
        gRPC call); None when that cannot answer (no leader known, a leader without this message, a
        lost message): the caller then asks another way."""
        try:
            return self.raft.leadership.read_index_from_leader(timeout)
        except NotConfirmed:
            return None

    def read_index_later(self, done: Callable[[int | None], None]) -> None:
        """read_index without a waiting thread (leader only): done(index) on the Raft tick thread once a
        heartbeat round started after this call confirms it; done(None) when that round cannot (not the
        leader, no entry of this term committed yet, leadership lost): then ask read_index, which waits
        and falls back to a barrier."""
        self.raft.leadership.read_index_later(lambda index, error: done(None if error else index))

    def read_index_from_leader_later(self, done: Callable[[int | None], None]) -> None:
        """read_index_from_leader without a waiting thread: done(index) on the Raft tick thread, from an
        ask of the leader sent after this call; done(None) when that way has none (as
        read_index_from_leader's None)."""
        self.raft.leadership.read_index_from_leader_later(lambda index, error: done(None if error else index))

    def read_index(self, timeout: float) -> int:
        """An index covering every write acknowledged before this call (leader only).

        Confirmed by a heartbeat round (raftlog/leadership.py): no log entry, no fsync. Falls back
        to a barrier when that cannot answer yet (no entry of this term committed). The caller
        waits for the local apply to reach it.
        """
        if not self.is_leader():
            raise NotLeader("this node is not the leader")
        deadline = time.monotonic() + timeout
        try:
            return self.raft.leadership.read_index(timeout)
        except NotConfirmed as exc:
            if not self.is_leader():
                raise NotLeader(f"this node is not the leader ({exc})") from None
            return self.barrier(max(0.1, deadline - time.monotonic()))

    def wait_applied(self, offset: int, timeout: float, alive: Callable[[], bool] | None = None) -> bool:
        return self.applier.wait_applied(offset, timeout, alive)

    # ---- membership (pysyncobj dynamic membership: one change at a time) ----------------------------

    def members(self) -> list[str]:
        """The Raft members as this node knows them (itself included)."""
        return sorted([self.cfg.self_addr] + [n.id for n in self.raft.otherNodes])

    def _await(self, start: Callable[[Callable], None], what: str, timeout: float) -> None:
        done = threading.Event()
        outcome: list[int] = []

        def callback(_res: object, err: int) -> None:  # tick thread
            outcome.append(err)
            done.set()

        start(callback)
        if not done.wait(timeout):
            raise ProposalError(f"{what}: no answer in {timeout:.1f}s", unknown_outcome=True)
        if outcome[0] != FAIL_REASON.SUCCESS:
            raise ProposalError(f"{what}: refused by Raft (reason {outcome[0]}: another change in "
                                f"progress, or not the leader)", unknown_outcome=False)

    def add_member(self, addr: str, timeout: float) -> None:
        self._await(lambda cb: self.raft.addNodeToCluster(addr, callback=cb), f"add member {addr}", timeout)

    def remove_member(self, addr: str, timeout: float) -> None:
        self._await(lambda cb: self.raft.removeNodeFromCluster(addr, callback=cb), f"remove member {addr}",
                    timeout)

    def transfer_leadership(self, addr: str | None, timeout: float) -> None:
        # on the tick thread: it sends to the target (binding.RaftNode.call_on_tick says why)
        self._await(lambda cb: self.raft.call_on_tick(lambda: self.raft.transferLeadership(addr, callback=cb)),
                    "transfer leadership", timeout)

    def take_snapshot(self) -> None:
        self.raft.forceLogCompaction()

    def _append(self, data: bytes, callback: Callable) -> None:
        self.raft.append_entry(data, callback)

    # ---- pysyncobj callbacks (tick thread) -------------------------------------------------------

    def _on_state_changed(self, old: int, new: int) -> None:
        leader = new == Role.LEADER
        if leader != self._was_leader:
            self._was_leader = leader
            self.leader_changes += 1
            if not leader:
                # Entries this node appended and did not see commit may never be: answer their
                # proposers now (outcome unknown) rather than at their deadline, so clients retry.
                self.committer.abandon_in_flight("leadership lost before the entry committed (outcome unknown)")
            with self._role_lock:
                if "raft" not in vars(self):  # still inside RaftNode's constructor: passed on after it
                    self._role_before_raft = leader
                    return
                self._observe(role=leader)  # to the listeners, in order, off this thread

    def _on_tick(self) -> None:
        self._check_ready()
        self._observe()

    def _check_ready(self) -> None:
        # Tick thread; replaces pysyncobj's onReady, which fires only when its last-applied index EQUALS the
        # leader's commit index at a tick. A node that restored a snapshot past the commit index
        # its leader last reported, and then kept up under load, could miss that instant forever
        # (a restarted node stayed "not ready" in a long fault run). Greater-or-equal is what
        # readiness means.
        if self._ready_target is not None:
            return
        leader_commit = self.raft.leader_commit_index()
        if leader_commit is not None and self.raft.raftLastApplied >= leader_commit:
            self._ready_target = self.raft.raftLastApplied

    # ---- snapshots ----------------------------------------------------------------------------

    def _write_snapshot(self, index: int, term: int, frozen: Any, raft_meta: bytes, digest: str) -> None:
        # Runs on its own thread so the apply thread keeps applying while the file is written.
        def write() -> None:
            ok = False
            try:
                t0 = time.monotonic()
                info = self.store.write(index, term, digest, self.fsm.snapshot_items(frozen), raft_meta)
                crash_point("snapshot-file-written")
                with self.raft.dump_lock:  # not while the tick thread swaps raft.dump for a received snapshot
                    linked = self._dump_index(self.dump_path) < index
                    if linked:
                        self.store.link_to(info, self.dump_path)
                if not linked:
                    # one from the leader, newer, was installed while this one was written: the log goes with it
                    log.info("snapshot at offset %d not linked as %s, which holds a newer one", index, self.dump_path)
                elif self.cfg.fsync:
                    # The new raft.dump is on disk before pysyncobj compacts the journal behind it
                    # (here, off the tick thread): a crash must not pair it with an older snapshot.
                    fsync_dir(self.dump_path)
                crash_point("snapshot-linked")
                self.store.prune(self.cfg.snapshots_kept)
                self.snapshot_offset = index
                self.snapshot_time = time.time()
                self.snapshot_bytes = info.size_bytes
                ok = True
                seconds = time.monotonic() - t0
                log.info("snapshot at offset %d: %d keys, %d bytes, %.2fs", index, info.count,
                         info.size_bytes, seconds,
                         extra={"event": "snapshot_written", "offset": index, "term": term, "keys": info.count,
                                "bytes": info.size_bytes, "seconds": round(seconds, 3)})
            except Exception:
                log.exception("snapshot at offset %d failed", index)
            finally:
                self.progress.finish(ok)

        self._snapshot_writer = threading.Thread(target=write, name="snapshot-writer", daemon=True)
        self._snapshot_writer.start()

    def _snapshot_first_entry(self) -> int:
        """The first log entry pysyncobj keeps beside its snapshot (the one before the snapshot's last);
        0 without a readable snapshot. The journal skips what a compaction cut short left before it."""
        if not os.path.exists(self.dump_path):
            return 0
        try:
            _last, prev, _cluster = self._read_dump_meta(self.dump_path)
        except Exception:  # a damaged snapshot is reported when pysyncobj loads it
            return 0
        return int(prev[1])

    def _dump_index(self, path: str) -> int:
        """The last index of the snapshot at `path`; -1 when there is none or it cannot be read."""
        try:
            return int(self._read_dump_meta(path)[0][1])
        except Exception:
            return -1

    def _read_dump_meta(self, path: str) -> tuple[RaftEntry, RaftEntry, list[str]]:
        return decode_raft_meta(self.store.read_info(path).meta)

    def _load_snapshot(self, staged_path: str, index: int) -> tuple[int, Any, str]:
        crash_point("install-staged")
        try:
            # the staged hard link is not needed after (move=True)
            info = self.store.import_file(staged_path, move=True, check_entries=False)
        except Exception as exc:
            # Name the files an operator can look at, not the staging copies the store made.
            raise RuntimeError(f"corrupt snapshot at offset {index}: {self.dump_path} "
                               f"{self._same_file_as(staged_path)}is damaged ({exc})") from exc
        crash_point("install-imported")
        # the bytes were verified by import_file; what is loaded is checked against the stamped digest by
        # the applier's digest-check thread (snapshot/store.py load, bytes_verified)
        info, items = self.store.load(info.path, bytes_verified=True)
        self.snapshot_offset = max(self.snapshot_offset, info.offset)
        self.snapshot_bytes = info.size_bytes
        return info.offset, items, info.digest


__all__ = ["LogConfig", "NotLeader", "ProposalError", "ReplicatedLog"]
