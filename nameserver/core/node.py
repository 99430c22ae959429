"""One nameserver node: the state machine, the replicated log, liveness and the write path.

The gRPC layer (nameserver/api/service.py) is a thin shell over this class.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import Message

from nameserver.config import NodeConfig
from nameserver.core.budget import TopicBudget, leading_parts
from nameserver.core.forwarder import LeaderForwarder, NoLeader
from nameserver.core.leaderduties import LeaderDuties
from nameserver.core.liveness import ChannelTable, HeartbeatBuffer, LivenessTable
from nameserver.core.readindex import ReadIndexBatcher
from nameserver.core.reads import LocalReads
from nameserver.core.reads import NotReady as NotReady  # re-exported: callers import them from the node
from nameserver.core.reads import OffsetNotReached as OffsetNotReached
from nameserver.core.routecache import RouteCache
from nameserver.core.sessionclock import SessionClock
from nameserver.core.stateguard import StateGuard
from nameserver.core.watch import WatchHub
from nameserver.pb import api_pb2, state_pb2
from nameserver.safetext import shown
from nameserver.state import MetadataState, Translation, quotas, translate
from nameserver.state.sessions import SessionQuota
from nameserver.state.shards import moves
from nameserver.state.translate import CasFailed
from raftlog.kvstate import KVStateMachine
from raftlog.log import LogConfig, ReplicatedLog
from raftlog.pb import entry_pb2
from raftlog.proposer import NotLeader, ProposalError
from snapshot import SnapshotStore

FOLLOWER_READ_ROUNDS = 2  # ReadIndex calls in flight at once (the fallback when the Raft link cannot answer)
RAFT_ASK_TIMEOUT_S = 1.0  # a read index asked over the Raft link; then the gRPC way
log = logging.getLogger("nameserver.core.node")

# A write that lost a race at apply is translated again; each round of racers has one winner, so N writes of
# one key at once need up to N attempts (8 registrations of one broker at once: 8). The call's deadline bounds
# the time; this bounds the work of one write under a storm (5 left the 8th of 8 racers UNAVAILABLE).
MAX_TRANSLATE_ATTEMPTS = 32
BROKER_EXPIRY, SESSION_EXPIRY = "broker-expiry", "session-expiry"  # the node's own leader duties


class StateMachineAdapter(KVStateMachine):
    """MetadataState as raftlog's state machine: restoring also rebuilds the derived indexes."""

    def __init__(self, state: MetadataState) -> None:
        super().__init__(state.kv)
        self.state = state

    def restore(self, offset: int, items: Iterable[tuple[str, bytes, int, int]], digest_hex: str | None = None
                ) -> None:
        # The route index is built after: the node is ready without it (raftlog/applier.py restore_rest)
        self.state.restore(offset, items, digest_hex, defer_routes=True)

    def restore_rest(self) -> bool:
        return self.state.build_routes()


@dataclass
class WriteResult:
    offset: int
    records: int
    translation: Translation | None
    replayed: bytes | None = None  # a retried exactly-once write: the first attempt's serialized reply


def unchanged_in(state: MetadataState, translate_fn: Callable[[MetadataState], Translation]) -> WriteResult | None:
    """The answer to a write that changes nothing in `state` (its offset, the translation), or None when it
    writes: what a follower's core and a worker's replica answer an unchanged re-registration with."""
    offset_now = state.kv.offset
    translation = translate_fn(state)
    return None if translation.batch.records else WriteResult(offset_now, 0, translation)


@dataclass(frozen=True)
class ClientRef:
    """Exactly-once identity of a write (gRPC metadata x-client-id / x-client-seq), within the sessions
    of its authenticated owner (nameserver/api/auth.py session_owner; "" when auth is off)."""

    client_id: str
    seq: int
    owner: str = ""

    @property
    def session_id(self) -> str:
        """The session's key in the state: two callers sending the same client id never share one."""
        return f"{self.owner}.{self.client_id}" if self.owner else self.client_id


class SessionSuperseded(Exception):
    """A retry of a write older than the client's latest: its result is no longer kept."""


class SessionEvicted(SessionSuperseded):
    """A retry whose session was evicted or expired (a tombstone: nameserver/state/sessions.py)."""


class NameServerNode(LocalReads):
    log: ReplicatedLog  # narrower than LocalReads' (which a read replica shares)

    def __init__(self, cfg: NodeConfig) -> None:
        self.cfg = cfg
        os.makedirs(cfg.data_dir, exist_ok=True)
        # The state changes only on the apply thread, through guard.writer; short readers take the lock,
        # the leader's translations read optimistically without it (nameserver/core/stateguard.py).
        self.guard = StateGuard()
        self.lock = self.guard.lock
        self.state = MetadataState()
        self.store = SnapshotStore(os.path.join(cfg.data_dir, "snapshots"), keep=cfg.snapshots_kept)
        self.liveness = LivenessTable()
        self.heartbeats = HeartbeatBuffer()
        self.channels = ChannelTable()
        self._stop = threading.Event()
        self.expired_total = 0
        self._waiting_reads = threading.BoundedSemaphore(cfg.max_waiting_reads)
        self.quota_limits = {name: getattr(cfg, name) for name in quotas.QUOTAS}
        self.session_quota = SessionQuota(cfg.max_sessions_per_owner, cfg.max_sessions)
        self.registrations = TopicBudget(cfg.registration_topics_in_flight)
        self._retry_pool: ThreadPoolExecutor | None = None  # write_later's writes that raced (made when needed)
        self._retries_lock = threading.Lock()
        # [sharding] groups > 1: every write is guarded by the fences of the sets it writes (a set moving
        # out of this group: docs/scaling.md, "a move"); a group core reads group 0's state through `group0`
        # (set by nameserver/groupcore.py: fn(group 0's state) under its replica's lock) for what a
        # registration takes from it.
        self.shard_guard = functools.partial(moves.guard_set_writes, group=cfg.group) if cfg.groups > 1 else None
        self.group0: Callable[[Callable[[MetadataState], Any]], Any] | None = None
        self.log = ReplicatedLog(
            LogConfig(
                self_addr=cfg.raft_addr,
                partners=cfg.partners,
                data_dir=os.path.join(cfg.data_dir, "raft"),
                snapshot_every_entries=cfg.snapshot_every_entries,
                snapshot_every_seconds=cfg.snapshot_every_seconds,
                snapshots_kept=cfg.snapshots_kept,
                election_min_s=cfg.election_min_ms / 1000,
                election_max_s=cfg.election_max_ms / 1000,
                batch_append=cfg.batch_append,
                group_linger_s=cfg.group_commit_linger_us / 1e6,
                group_in_flight=cfg.group_commit_in_flight,
                password=cfg.password,
                fsync=cfg.fsync,
                read_lease=cfg.read_lease,
                wire_compress_level=cfg.wire_compress_level,
                join_existing=cfg.initial_state == "existing",
            ),
            StateMachineAdapter(self.state), self.store, self.guard.writer)
        self.forwarder = LeaderForwarder(cfg, self.log.leader, self.log.is_leader, self.grpc_of)
        self._leadership_feed = self.log.watch_leadership(self._on_leadership)
        self._leader_feed = self.log.watch_leader(lambda _view: self.forwarder.leader_changed())
        self.read_indexes = ReadIndexBatcher(self.log.read_index)
        # On a follower whose ask over the Raft link could not answer, concurrent linearizable reads share
        # one ReadIndex call (a round starts only once the reads in it have arrived, as on the leader).
        self.leader_read_indexes = ReadIndexBatcher(self._read_index_from_leader, name="leader-read-index",
                                                    max_rounds=FOLLOWER_READ_ROUNDS)
        self.watches = WatchHub(max_watchers=cfg.max_watchers)
        self.routes = RouteCache()
        self._watch_feed = self.log.subscribe(self.watches.on_entry)
        self._watch_resets = self.log.subscribe_resets(self.watches.on_reset)
        self.session_clock = SessionClock()  # session idleness by this node's monotonic clock
        self._session_feed = self.log.subscribe(self.session_clock.on_entry)
        # The leader's periodic work on one thread (nameserver/core/leaderduties.py); the server adds its own.
        self.duties = LeaderDuties(lambda: self.log.is_leader() and self.log.ready)
        scan_s = cfg.scan_interval_ms / 1000
        self.duties.add(BROKER_EXPIRY, scan_s, self.scan_once)
        self.duties.add(SESSION_EXPIRY, scan_s, self.expire_sessions)
        self._heartbeat_forward_thread = threading.Thread(target=self._forward_heartbeats_loop,
                                                          name="heartbeat-forward", daemon=True)
        self._heartbeat_forward_thread.start()
        self.duties.start()

    def close(self) -> None:
        self._stop.set()
        self.duties.stop()
        self.read_indexes.stop()
        self.leader_read_indexes.stop()
        self.log.close()
        self.forwarder.close()
        if self._retry_pool is not None:
            self._retry_pool.shutdown(wait=False)

    # ---- reads (read, read_route, inspect, catch_up: nameserver/core/reads.py) ---------------------

    def not_ready_reason(self) -> str:
        if self.log.apply_error:
            return f"apply stopped: {self.log.apply_error}"
        return "node is loading its snapshot or replaying its log"

    def status(self) -> dict[str, Any]:
        with self.lock:
            apply_offset = self.state.kv.offset
            digest = self.state.kv.digest_hex
            keys = len(self.state.kv)
        leader = self.log.leader()
        return {
            "node_id": self.cfg.raft_addr,
            "grpc_addr": self.cfg.grpc_addr,
            "role": self.log.role(),
            "leader_id": leader or "",
            "leader_grpc_addr": self.grpc_of(leader) or "",
            "term": self.log.term(),
            "end_offset": self.log.end_offset,
            "commit_offset": self.log.commit_offset,
            "apply_offset": apply_offset,
            "digest": digest,
            "ready": self.log.ready,
            "snapshot_offset": self.log.snapshot_offset,
            "keys": keys,
            "has_quorum": self.log.has_quorum,
            "apply_error": self.log.apply_error,
        }

    # ---- writes (leader) -------------------------------------------------------------------------

    def write(self, translate_fn: Callable[[MetadataState], Translation], timeout: float,
              client: ClientRef | None = None, reply_of: Callable[[WriteResult], Message] | None = None,
              topics: int = 0, wanted: Callable[[], None] | None = None) -> WriteResult:
        """Translate against the current state and propose; re-translate if a precondition failed.

        With a client ref, the write is exactly-once: a retry of the client's latest sequence
        returns the first attempt's reply (`replayed`) instead of applying again.
        `topics`: a registration's topic count, held of the leader's budget until it commits
        (nameserver/core/budget.py). `wanted` raises when the caller's call is over (rpc.in_time): called
        just before each proposal of the write (of a registration in parts, only before its first), so a
        write is never proposed after its caller's deadline or cancel.
        Raises NotLeader (the caller forwards), ProposalError, SessionSuperseded, TooLargeError (a quota
        or the budget), or the translator's own errors (ValidationError, CasFailed).
        """
        if topics and not self.log.is_leader():
            raise NotLeader("this node is not the leader")
        deadline = time.monotonic() + timeout
        # Waiting for the budget takes at most half the call's time, and less when the registration is
        # expected to take longer than the rest: the write's own time (core/budget.py).
        with self.registrations.hold(topics, timeout / 2, call_left=timeout):
            return self._write(translate_fn, deadline, client, reply_of, in_parts=topics > 0,
                               finish_by=deadline + timeout, wanted=wanted)

    def write_later(self, translate_fn: Callable[[MetadataState], Translation], timeout: float,
                    client: ClientRef | None, reply_of: Callable[[WriteResult], Message] | None, topics: int,
                    wanted: Callable[[], None] | None,
                    done: Callable[[WriteResult | None, BaseException | None], None]
                    ) -> WriteResult | Callable[[], None] | None:
        """`write` with no thread waiting for the commit (the core's answer to a worker's write from the apply:
        nameserver/api/writechannel.py). Translated and proposed here, as `write`'s first attempt; then
        `done(result, None)` once it applied (on the apply thread), or `done(None, error)` with what `write`
        raises for it (ProposalError; after a race with another write, `write`'s own outcome: translated
        again and waited for on a thread of the node's, as `write`'s next attempt), once. Returns a
        WriteResult when it is over at once (an exactly-once retry's reply, a write that changes nothing),
        `give_up` once proposed (call it at the caller's timeout: done(None, ProposalError(outcome
        unknown)) unless done came first), or None when it would wait before proposing (this node does not
        lead, the budget has no room now, a refusal to confirm through the log, a registration in parts): then
        call `write`. Raises what `write` raises before proposing (wanted's, a quota, the translator's)."""
        if not self.log.is_leader():
            return None
        release = self.registrations.take_now(topics)
        if release is None:
            return None
        deadline = time.monotonic() + timeout
        proposed = False
        try:
            try:
                translated = self.guard.optimistic(functools.partial(self._translate, translate_fn, client, reply_of))
            except (CasFailed, SessionSuperseded):
                return None  # a refusal is confirmed through the log before it is answered: write()'s way
            if isinstance(translated, WriteResult):
                return translated  # an exactly-once retry: the first attempt's reply
            translation, offset_now, records = translated
            if not records:
                return WriteResult(offset_now, 0, translation)
            if topics and leading_parts(translation.batch)[0]:
                return None  # a big registration, proposed in parts
            if wanted is not None:
                wanted()

            def committed(applied: Any, error: BaseException | None) -> None:
                release(error is None and applied.result.applied)
                if error is not None:
                    done(None, error)
                elif applied.result.applied:
                    done(WriteResult(applied.offset, records, translation), None)
                else:  # raced: translated again, as write() does, where a refusal's confirmation may wait
                    log.info("write raced on %s (version %d); translating again", shown(applied.result.failed_key),
                             applied.result.failed_key_version)
                    self._retries().submit(self._write_again, translate_fn, deadline, client, reply_of, topics,
                                           wanted, done)

            give_up = self.log.committer.propose_later(translation.batch, committed)
            proposed = True
            return give_up
        finally:
            if not proposed:
                release(False)

    def _retries(self) -> ThreadPoolExecutor:
        with self._retries_lock:
            if self._retry_pool is None:
                self._retry_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="write-again")
            return self._retry_pool

    def _write_again(self, translate_fn: Callable[[MetadataState], Translation], deadline: float,
                     client: ClientRef | None, reply_of: Callable[[WriteResult], Message] | None, topics: int,
                     wanted: Callable[[], None] | None,
                     done: Callable[[WriteResult | None, BaseException | None], None]) -> None:
        """write_later's write after a race: `write`'s next attempts, waited for here."""
        try:
            result = self.write(translate_fn, max(0.0, deadline - time.monotonic()), client, reply_of, topics,
                                wanted=wanted)
        except BaseException as exc:  # handed to the caller's answer, mapped there as write()'s raise is
            done(None, exc)
            return
        done(result, None)

    def _write(self, translate_fn: Callable[[MetadataState], Translation], deadline: float,
               client: ClientRef | None, reply_of: Callable[[WriteResult], Message] | None,
               in_parts: bool = False, finish_by: float = 0.0, wanted: Callable[[], None] | None = None
               ) -> WriteResult:
        """`finish_by`: once a registration's first part committed, its other parts go on past the
        caller's deadline up to this time: stopping between parts left its first topics in the state
        with no broker to own them, and no unregistration could remove them (seen in CI)."""
        confirmed = False
        begun = False  # a part of a registration in parts committed: the rest go on (finish_by)
        for _ in range(MAX_TRANSLATE_ATTEMPTS):
            if not self.log.is_leader():
                raise NotLeader("this node is not the leader")
            try:
                # Without the state lock: apply and readers do not wait for a long translation.
                translated = self.guard.optimistic(functools.partial(self._translate, translate_fn, client, reply_of))
            except (CasFailed, SessionSuperseded):
                # A compare-and-set refusal read from this node's state. That state can be stale: a
                # new leader's apply may lag its commit index, and a paused old leader may not know it
                # was deposed. Confirm once through the log (a barrier) before refusing, or the refusal
                # would not be linearizable. Successes need no such care: preconditions are checked
                # again at apply time.
                # The confirmation is a read index (a heartbeat round to a majority), not a barrier
                # entry: a refused write must leave the log as it found it.
                if confirmed:
                    raise
                confirmed = True
                left = max(0.1, deadline - time.monotonic())
                if not self.log.wait_applied(self.leader_read_index(left), left):
                    raise ProposalError("could not confirm the refusal in time", unknown_outcome=False) from None
                continue
            if isinstance(translated, WriteResult):
                return translated  # an exactly-once retry: the first attempt's reply
            translation, offset_now, records = translated
            if not records:
                return WriteResult(offset_now, 0, translation)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if wanted is not None and not begun:
                wanted()
            batch = translation.batch
            if in_parts:  # a big registration: no entry's apply holds the state long (core/budget.py)
                lead, batch = leading_parts(batch)
                committed = self._propose_all(lead, deadline, max(deadline, finish_by))
                begun = begun or committed > 0
                if committed < len(lead):
                    continue  # someone changed what the translation read: translate again
                left = (max(deadline, finish_by) if lead else deadline) - time.monotonic()
                if left <= 0:
                    break
            applied = self.log.propose(batch, left)
            if applied.result.applied:
                return WriteResult(applied.offset, records, translation)
            translation.batch.ClearField("request_id")
            log.info("write raced on %s (version %d); translating again", shown(applied.result.failed_key),
                     applied.result.failed_key_version)
        raise ProposalError("write kept conflicting with concurrent writes or timed out", unknown_outcome=False)

    def _propose_all(self, parts: list[entry_pb2.Batch], deadline: float, finish_by: float) -> int:
        """Propose parts in order until one is refused at apply; how many were applied: the first by
        `deadline`, the others, once it committed, by `finish_by`."""
        for i, part in enumerate(parts):
            left = (finish_by if i else deadline) - time.monotonic()
            if left <= 0:
                raise ProposalError("a registration's parts did not commit in time", unknown_outcome=True)
            if not self.log.propose(part, left).result.applied:
                return i
        return len(parts)

    def _translate(self, translate_fn: Callable[[MetadataState], Translation], client: ClientRef | None,
                   reply_of: Callable[[WriteResult], Message] | None
                   ) -> WriteResult | tuple[Translation, int, int]:
        """One translation against the state as it is: the replayed reply of an exactly-once retry, or
        (translation, the offset it was made at, its records: the session record an exactly-once write
        adds is not counted, as the reply it keeps says). Reads the state only: run it through the guard."""
        if client is not None:
            replay = self._replay(client)
            if replay is not None:
                return replay
        offset_now = self.state.kv.offset
        translation = translate_fn(self.state)
        if self.shard_guard is not None and translation.batch.records:
            translation = self.shard_guard(self.state, translation)
        records = len(translation.batch.records)
        if records:
            quotas.check(self.state.usage, self.state.kv, translation.batch, self.quota_limits)
        if records and client is not None and reply_of is not None:
            reply = reply_of(WriteResult(0, records, translation)).SerializeToString()
            translate.record_session(translation, self.state, client.session_id, client.owner, client.seq, reply,
                                     int(time.time() * 1000), self.session_quota)
        return translation, offset_now, records

    def unchanged_here(self, translate_fn: Callable[[MetadataState], Translation]) -> WriteResult | None:
        """A follower's answer to a write that changes nothing, or None (forward it to the leader).

        Only while this node has applied everything it knows to be committed, so its state is at most
        one leader heartbeat behind the leader's. An unchanged re-registration (every broker sends one
        to every node every 30 s) is answered here; its liveness goes to the leader with the buffered
        heartbeats. The narrow race it leaves (the leader expires the broker during that heartbeat)
        is the one a plain heartbeat has, and the broker's next registration repairs it."""
        if not self.log.ready or self.log.apply_offset < self.log.commit_offset:
            return None
        return self.guard.optimistic(lambda: unchanged_in(self.state, translate_fn))

    def _replay(self, client: ClientRef) -> WriteResult | None:
        found = self.state.session(client.session_id)
        if found is None:
            return None
        session, version = found
        if session.evicted:
            if client.seq <= session.last_seq:
                raise SessionEvicted(f"session {client.client_id} expired or was evicted; sequence {client.seq} "
                                     "cannot be checked for a duplicate (read the state to see whether it "
                                     "applied; a new sequence opens the session again)")
            return None  # a new write: it opens the session again
        if session.last_seq == client.seq:
            return WriteResult(version, 0, None, replayed=session.reply)
        if session.last_seq > client.seq:
            raise SessionSuperseded(f"client {client.client_id} already wrote sequence {session.last_seq}; "
                                    f"the result of {client.seq} is no longer kept")
        return None

    def linearizable_index(self, timeout: float) -> int:
        """A read index that covers every write acknowledged before this call (via the leader).

        On a follower, every read waiting at once shares one ask of the leader over the Raft link: the
        tick thread sends one ASK for all the reads queued since its last one, so a read never shares an
        ask sent before it arrived (raftlog/leadership.py). When that cannot answer (no leader known
        yet, or no answer within RAFT_ASK_TIMEOUT_S), the reads share ReadIndex calls instead, which
        wait for an election."""
        if not self.log.is_leader():
            deadline = time.monotonic() + timeout
            index = self.log.read_index_from_leader(min(timeout, RAFT_ASK_TIMEOUT_S))
            if index is not None:
                return index
            try:
                return self.leader_read_indexes.read_index(max(0.1, deadline - time.monotonic()))
            except NoLeader:
                if not self.log.is_leader():
                    raise NotLeader("no leader to confirm a read index") from None
        return self.leader_read_index(timeout)

    def start_linearizable_index(self, done: Callable[[int | None], None]) -> int | None:
        """linearizable_index without a waiting thread, for the worker's asks on the write channel: the index
        at once when this node leads under its lease; else None, and `done(index)` is called on the Raft tick
        thread with the index of a heartbeat round (this node leads) or of an ask of the leader (it follows)
        that starts after this call, as linearizable_index's first way; `done(None)` when that way has none
        (no leader known, leadership lost, no answer in time): then call linearizable_index, which waits and
        has the other ways (a barrier, the ReadIndex call). Reads waiting at once share the round or the ask:
        the tick thread sends one for everything queued since its last."""
        if self.log.is_leader():
            leased = self.log.leased_read_index()
            if leased is not None:
                return leased
            self.log.read_index_later(done)
        else:
            self.log.read_index_from_leader_later(done)
        return None

    def leader_read_index(self, timeout: float) -> int:
        """This leader's read index: at once under its lease, else in the next round of the batcher."""
        leased = self.log.leased_read_index()
        return leased if leased is not None else self.read_indexes.read_index(timeout)

    def _read_index_from_leader(self, timeout: float) -> int:
        """One ReadIndex call to the leader for a batch of this follower's reads, waiting for an election
        when none is known (NoLeader: none in time)."""
        return self.forwarder.call("ReadIndex", api_pb2.ReadIndexRequest(), max(0.1, timeout),
                                   wait_s=min(timeout, 3.0), idempotent=True).read_index

    def expire_sessions(self) -> int:
        """Delete idle exactly-once sessions (leader only, through records). Returns how many."""
        if not self.log.is_leader() or not self.log.ready:
            return 0
        fn = lambda s: translate.expire_sessions(  # noqa: E731
            s, self.session_clock.idle_ms, self.cfg.session_ttl_ms)
        try:
            return self.write(fn, self.cfg.write_timeout_ms / 1000).records
        except (NotLeader, ProposalError) as exc:
            log.warning("session expiry not committed: %s", exc)
            return 0

    # ---- liveness ------------------------------------------------------------------------------

    def _on_leadership(self, is_leader: bool) -> None:
        if is_leader:
            self.session_clock.restart()
            self.channels.clear()  # re-reported by each broker's next heartbeat through remoting
            self.liveness.grant_grace(self.evidence_trusted_s)
            log.info("became leader at term %d: brokers' clocks carry on from the evidence this node holds",
                     self.log.term())
        else:
            self.liveness.mark_current()  # it led until now: its clocks were the leader's
            log.info("no longer leader (term %d)", self.log.term())

    @property
    def sync_interval_s(self) -> float:
        """How often a follower fetches the leader's silences: the scan interval, the resolution of expiry."""
        return self.cfg.scan_interval_ms / 1000

    @property
    def evidence_trusted_s(self) -> float:
        """A table synced within this long is current enough for a new leader to go on from: two missed
        syncs and an election (a node back from a partition has older evidence: fresh timeouts)."""
        return 2 * self.sync_interval_s + self.cfg.election_max_ms / 1000

    def liveness_exchange(self, handover: api_pb2.BrokerSilences, want: bool) -> api_pb2.BrokerSilences | None:
        """A follower's sync (a forwarded Heartbeat): its handed-over silences merged here, and, if `want`,
        every registered broker's silence by this leader's clock. None when this node does not lead."""
        if not self.log.is_leader():
            return None
        self.liveness.merge(handover, time.monotonic())
        if not want:
            return api_pb2.BrokerSilences()
        with self.lock:
            addrs = self.state.registered_addrs()
        return self.liveness.silences(addrs)

    def scan_once(self) -> int:
        """Expire silent brokers (leader only). Returns how many removals were committed."""
        if not self.log.is_leader() or not self.log.ready:
            return 0
        with self.lock:
            registered = [(addr, live.heartbeat_timeout_ms or self.cfg.default_timeout_ms, version)
                          for addr, live, version in self.state.live_addrs()]
        removed = 0
        for addr, version in self.liveness.expired(registered):
            try:
                res = self.write(functools.partial(translate.expire_broker, broker_addr=addr,
                                                   expected_live_version=version),
                                 self.cfg.write_timeout_ms / 1000)
            except (NotLeader, ProposalError) as exc:
                log.warning("expiry of %s not committed: %s", shown(addr), exc)
                continue
            if res.records:
                removed += 1
                self.expired_total += 1
                self.forget_broker(addr)
                log.info("expired broker %s (silent past its timeout, or its last connection closed) at "
                         "offset %d", shown(addr), res.offset,
                         extra={"event": "broker_expired", "broker_addr": addr, "offset": res.offset})
        return removed

    def heartbeat(self, beats: Iterable[api_pb2.BrokerHeartbeat],
                  versions: dict[str, state_pb2.DataVersion] | None = None) -> list[str]:
        """Refresh liveness (leader) or buffer for the leader (follower). Returns unknown addresses;
        fills `versions` with the DataVersion held for each known one."""
        beats = list(beats)
        with self.lock:
            unknown = self.state.data_versions((b.broker_addr for b in beats), versions)
        self.note_alive(beats)
        return unknown

    def note_alive(self, beats: Iterable[api_pb2.BrokerHeartbeat]) -> None:
        """Liveness only: refreshed here (leader) or buffered for the leader (follower). For a caller
        that needs nothing back from the state (an unchanged registration answered on a follower)."""
        if self.log.is_leader():
            self._heard(beats)
        else:
            for b in beats:
                self.heartbeats.add(b)
                if not b.channel_closed:
                    self.liveness.touch(b.broker_addr)  # this node's own evidence, for a handover

    def forget_broker(self, addr: str) -> None:
        """An unregistered address: no clock and no connections to keep for it."""
        self.liveness.forget(addr)
        self.channels.forget(addr)

    def _heard(self, beats: Iterable[api_pb2.BrokerHeartbeat]) -> None:
        """Leader: refresh liveness, and keep count of the brokers' remoting connections."""
        for b in beats:
            if b.channel_closed:
                if self.channels.closed(b.broker_addr, b.channel_node):
                    # Not at once: another node's report of a live connection may still be in its
                    # forward buffer (every forward_interval_ms).
                    grace = max(1.0, 10 * self.cfg.forward_interval_ms / 1000)
                    self.liveness.disconnect(b.broker_addr, grace)
                    self.duties.wake(BROKER_EXPIRY, after_s=grace + 0.05)
                continue
            self.liveness.touch(b.broker_addr)
            if b.channel_node:
                self.channels.opened(b.broker_addr, b.channel_node)

    def _forward_heartbeats_loop(self) -> None:
        """Follower: buffered heartbeats to the leader every forward interval; with them, every sync
        interval (and at once after a leader change), the liveness sync (nameserver/core/liveness.py)."""
        interval = self.cfg.forward_interval_ms / 1000
        synced_with: str | None = None  # the leader this node last synced with
        next_sync = 0.0
        while not self._stop.wait(interval):
            pending = self.heartbeats.drain()
            if self.log.is_leader():
                self._heard(pending)
                synced_with = self.cfg.raft_addr
                continue
            leader = self.log.leader()
            sync = leader is not None and (leader != synced_with or time.monotonic() >= next_sync)
            if not pending and not sync:
                continue
            request = api_pb2.HeartbeatRequest(heartbeats=pending, want_silences=sync)
            if sync and leader != synced_with:
                request.handover.CopyFrom(self.liveness.silences())
            sent_at = time.monotonic()
            try:
                reply = self.forwarder.call("Heartbeat", request, 2.0)
            except NoLeader:
                continue  # no leader: this node's own evidence of them goes in its next handover
            except grpc.RpcError as exc:
                log.debug("heartbeat forward failed: %s", exc.code())
                continue
            if sync and reply.silences_from_leader:
                self.liveness.merge(reply.silences, sent_at)
                with self.lock:
                    self.liveness.keep_only(self.state.registered_addrs())
                self.liveness.mark_current()
                synced_with, next_sync = leader, sent_at + self.sync_interval_s

    # ---- peers ---------------------------------------------------------------------------------

    def grpc_of(self, raft_addr: str | None) -> str | None:
        """A member's gRPC address: from the config, else from the member records added at runtime."""
        if raft_addr is None:
            return None
        addr = self.cfg.grpc_of(raft_addr)
        if addr:
            return addr
        with self.lock:
            return self.state.member_grpc_addr(raft_addr)

    # ---- membership ------------------------------------------------------------------------------

    def add_member(self, raft_addr: str, grpc_addr: str, timeout: float) -> list[str]:
        """Leader only: record how to reach the member, then add it to Raft (one change at a time)."""
        deadline = time.monotonic() + timeout
        if raft_addr in self.log.members():
            raise MembershipError(f"{raft_addr} is already a member")
        self.write(lambda s: translate.put_member(s, raft_addr, grpc_addr), timeout)
        self.log.add_member(raft_addr, max(0.1, deadline - time.monotonic()))
        log.info("member %s (gRPC %s) added", raft_addr, grpc_addr,
                 extra={"event": "membership_change", "change": "add", "member": raft_addr})
        return self.log.members()

    def remove_member(self, raft_addr: str, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        if raft_addr not in self.log.members():
            raise MembershipError(f"{raft_addr} is not a member")
        if raft_addr == self.cfg.raft_addr:
            raise MembershipError("the leader cannot remove itself: transfer leadership first")
        self.log.remove_member(raft_addr, timeout)
        self.write(lambda s: translate.delete_member(s, raft_addr), max(0.1, deadline - time.monotonic()))
        log.info("member %s removed", raft_addr,
                 extra={"event": "membership_change", "change": "remove", "member": raft_addr})
        return self.log.members()


class MembershipError(Exception):
    """A membership change that cannot be made as asked (the message says why)."""
