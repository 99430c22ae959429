"""A read replica of a core's state, fed by its Log.Follow stream (nameserver/api/logservice.py), or, in a
worker, by the same messages over its core's Unix feed (nameserver/localfeed.py).

The replica holds a MetadataState built by the same code the core's apply thread runs: a snapshot is
loaded with MetadataState.restore (its digest recomputed from the pairs and checked against the
core's, not trusted), then each entry is decoded and applied with MetadataState.apply_entry, in order,
at its offset. Same entries at the same offsets: the same state, the same digest at each offset.

One thread follows; on any failure it reconnects with backoff and resumes from its offset (the core
sends a snapshot again when that is older than its history, and after it restored one). A stream silent
past `max_silence_s` (the core sends a keepalive every second) is cut and reopened: a half-open connection
is noticed.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import grpc

from nameserver.localfeed import LocalFeed
from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.state import MetadataState
from raftlog.applier import frozen_load
from raftlog.codec import UnknownEntryFormat, decode_for_apply
from raftlog.history import AppliedEntry, EntryHistory
from raftlog.kvstate import ChangeTuple

log = logging.getLogger("nameserver.replica")

DEFAULT_MAX_LAG = 1000  # entries behind the core's last reported apply offset a ready replica may be
DEFAULT_MAX_SILENCE_S = 5.0  # five missed keepalives: the stream is reopened and the replica is not ready
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 2.0  # between reconnects; back to the minimum after a message
ALIVE_CHECK_S = 0.2  # how soon a waiting reader notices that its caller went away
# The recent entries a watcher resumes from here. Small: a resume after a broken stream or a dead worker
# is seconds back, and an older one is served by the core, whose ring is the node's (a copy of the core's
# 100,000 entries / 128 MiB per worker would multiply the node's memory).
HISTORY_ENTRIES, HISTORY_BYTES = 10_000, 16 << 20


class SnapshotMismatch(Exception):
    """The snapshot's pairs do not hash to the digest the core stamped it with."""


class ReadReplica:
    """The state of `target` (a node's gRPC address, opened with `open_channel`), kept current.

    Also the AppliedSource of a ReplicaNode (nameserver/core/reads.py): ready, apply_offset,
    wait_applied; and is_leader() (never) for read paths that ask."""

    def __init__(self, target: str | Sequence[str], open_channel: Callable[[str], grpc.Channel], name: str = "",
                 max_lag: int = DEFAULT_MAX_LAG, max_silence_s: float = DEFAULT_MAX_SILENCE_S,
                 metadata: Sequence[tuple[str, str]] = (), accounting: bool = True,
                 feed: LocalFeed | None = None) -> None:
        """`target`: one node, or a list (a replica on another machine: the voters), followed one at a
        time, moving to the next when a stream fails or falls silent; `metadata`: sent on each Follow;
        `accounting`: keep the digest (Status reports it) and the quota totals entry by entry (False: a
        worker's replica, which serves reads only: MetadataState); `feed`: a worker's, its core's Unix
        feed (nameserver/localfeed.py), followed instead of the target's Log.Follow (the same messages
        without gRPC's per-message work; `target` still answers DigestAt for a seeded state)."""
        self.accounting = accounting
        self.targets = [target] if isinstance(target, str) else list(target)
        self.target = self.targets[0]
        self.name = name or self.target
        self._metadata = tuple(metadata)
        self.max_lag = max_lag
        self.max_silence_s = max_silence_s
        self._open_channel = open_channel
        self.feed = feed
        # Held by the follower thread while it applies one entry or swaps in a restored state, and by a
        # reader for one read: readers never see half an entry.
        self.lock = threading.Lock()
        # Its route index follows the topic records when read (MetadataState lazy_routes): every reader of a
        # replica's state holds `lock`. A replica that keeps accounts (a remote one, a move's) indexes eagerly.
        self.state = MetadataState(accounting, lazy_routes=not accounting)
        self._bootstrapped = False
        self._offset_cv = threading.Condition()
        self._published = 0  # the offset waiters see: everything up to it is in `state`
        self._core_offset = 0
        self._heard = 0.0  # monotonic time of the last message handled
        self._answered = 0.0  # the same, or of a refusal in the followed node's own words (unanswered())
        self._quiet_since = 0.0  # the same, or the current call's start: what the watchdog measures
        self.failed = ""  # apply stopped for good (an entry of a newer format)
        self.last_error = ""
        # Why the followed node refuses to feed replicas for good, as it said ("" while it feeds us): its
        # apply stopped (a state it cannot trust). A worker then opens its ports anyway (nameserver/worker.py).
        self.core_stopped = ""
        self.bootstraps = 0  # snapshots installed
        self._seeded = ""  # the digest of a state seeded from a file, until the followed node confirms it
        self.reconnects = 0
        self._stop = threading.Event()
        self._call: Any = None  # the running Follow call (a grpc.Call and iterator) or FeedStream
        self._cut = False  # the watchdog cancelled the running call
        self._move_to: str | None = None  # the target to follow next (move_to), else the next in turn
        self._channel: grpc.Channel | None = None
        self._thread: threading.Thread | None = None
        self._watchdog: threading.Thread | None = None
        # What a watch hub (nameserver/core/watch.py) needs, as the core's apply thread gives it: the recent
        # entries with their changes, each entry to the listeners and a snapshot's offset to the reset
        # listeners, on the follower thread, before the offset moves past it.
        self.history = EntryHistory(HISTORY_ENTRIES, HISTORY_BYTES)
        self.entry_listeners: list[Callable[[AppliedEntry], None]] = []
        self.reset_listeners: list[Callable[[int], None]] = []
        # Each offset readers may see from now on (after an apply batch, a snapshot installed), on the
        # follower thread once readers see it: a worker's reply cache generation (nameserver/api/frontchannel.py).
        self.publish_listeners: list[Callable[[int], None]] = []

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"replica-{self.name}", daemon=True)
        self._watchdog = threading.Thread(target=self._watch_silence, name=f"replica-watch-{self.name}",
                                          daemon=True)
        self._thread.start()
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        for t in (self._thread, self._watchdog):
            if t is not None:
                t.join(timeout=5)
        if self._channel is not None:
            self._channel.close()
            self._channel = None
        with self._offset_cv:
            self._offset_cv.notify_all()

    # ---- what readers see ----------------------------------------------------------------------

    @property
    def offset(self) -> int:
        """The last offset applied here."""
        return self._published

    apply_offset = offset  # the name reads (nameserver/core/reads.py) use

    @property
    def digest_hex(self) -> str:
        with self.lock:
            return self.state.kv.digest_hex

    @property
    def core_offset(self) -> int:
        """The core's apply offset, as last heard."""
        return self._core_offset

    @property
    def lag(self) -> int:
        """Entries (offsets) the replica is behind the core, as last heard."""
        return max(0, self._core_offset - self._published)

    @property
    def ready(self) -> bool:
        return not self.not_ready_reason()

    def not_ready_reason(self) -> str:
        """Why reads are refused here, or "" when they are served."""
        if self.failed:
            return f"replica of {self.target} stopped applying: {self.failed}"
        if not self._bootstrapped:
            why = f" ({self.last_error})" if self.last_error else ""
            return f"replica of {self.target} has not loaded the state yet{why}"
        silent = time.monotonic() - self._heard
        if silent > self.max_silence_s:
            why = f": {self.last_error}" if self.last_error else ""
            since = f"for {silent:.1f} s" if self._heard else "yet"  # a seeded state, the stream not begun
            return f"replica has not heard from {self.target} {since}{why}"
        if self.lag > self.max_lag:
            return (f"replica is {self.lag} entries behind {self.target} (at {self._published}, core at "
                    f"{self._core_offset}; ready within {self.max_lag})")
        return ""

    def unanswered(self) -> float:
        """How long the followed node has not answered this replica, once that is past `max_silence_s` (its
        feed's keepalives come every second), else 0: no message, and no refusal in its own words (one still
        loading, one whose apply stopped, answer). A worker's read of its core's liveness: a core that is
        frozen (SIGSTOP) or stalled keeps its sockets open, so calls to it wait rather than fail
        (nameserver/api/corehealth.py turns the node's health NOT_SERVING)."""
        silent = time.monotonic() - self._answered
        return silent if silent > self.max_silence_s else 0.0

    @property
    def apply_error(self) -> str:
        return self.failed

    def is_leader(self) -> bool:
        return False

    def wait_applied(self, offset: int, timeout: float, alive: Callable[[], bool] | None = None) -> bool:
        """Block until this replica has applied `offset`; False at the timeout, once `alive()` turns
        false (checked every ALIVE_CHECK_S), or when the replica stopped."""
        deadline = time.monotonic() + timeout
        with self._offset_cv:
            while self._published < offset:
                left = deadline - time.monotonic()
                if left <= 0 or self.failed or self._stop.is_set() or (alive is not None and not alive()):
                    return False
                self._offset_cv.wait(left if alive is None else min(left, ALIVE_CHECK_S))
            return True

    # ---- the follower thread -------------------------------------------------------------------

    def _run(self) -> None:
        backoff = BACKOFF_MIN_S
        tried = 0  # targets that failed since one last got somewhere
        while not self._stop.is_set():
            heard_before = self._heard
            loading = False
            try:
                self._follow()
                self.last_error = f"{self.target} ended the stream"
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                if not self._cut:  # cut by the watchdog: its reason ("no message from ...") says more
                    self.last_error = f"{exc.code().name}: {exc.details()}"
                self.core_stopped = _apply_stopped(exc)
                if _answered(exc):
                    self._answered = time.monotonic()
                # a loading core answers soon: ask again at once; one whose apply stopped does not recover
                # without a restart: the growing backoff, as for any other failure
                loading = _still_loading(exc) and not self.core_stopped
                if loading:
                    backoff, tried = BACKOFF_MIN_S, 0
            except UnknownEntryFormat as exc:
                self.failed = str(exc)
                log.critical("replica of %s stopped: %s", self.target, exc)
                with self._offset_cv:
                    self._offset_cv.notify_all()
                return
            except SnapshotMismatch as exc:
                self.last_error = str(exc)
                log.error("replica of %s: %s", self.target, exc)
            self._cut = False
            if self._heard > heard_before:
                backoff = BACKOFF_MIN_S  # the last attempt got somewhere: retry soon
                tried = 0
            failed_target = self.target
            tried += 1
            wait = backoff if tried >= len(self.targets) else BACKOFF_MIN_S  # the others at once, then back off
            self._next_target()
            log.log(logging.DEBUG if loading else logging.INFO, "replica of %s reconnects to %s in %.2f s from "
                    "offset %d: %s", failed_target, self.target, wait, self._published, self.last_error)
            self.reconnects += 1
            if self._stop.wait(wait):
                return
            if tried >= len(self.targets):
                tried = 0
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def move_to(self, target: str, reason: str) -> bool:
        """Leave the stream followed now for `target`, another of the targets, from the offset held; False
        when there is no such target or no stream to leave."""
        call = self._call
        if target == self.target or target not in self.targets or call is None:
            return False
        self._move_to = target
        self.last_error = reason
        self._cut = True
        call.cancel()
        return True

    def _next_target(self) -> None:
        """Follow the next of several targets (from the offset held: every voter has the same entries at
        the same offsets), or the one move_to named; with one, reconnect to it."""
        if len(self.targets) < 2:
            return
        moving, self._move_to = self._move_to, None
        self.target = moving or self.targets[(self.targets.index(self.target) + 1) % len(self.targets)]
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _follow(self) -> None:
        """One Follow call, until it fails or ends."""
        if self._channel is None:
            self._channel = self._open_channel(self.target)
        if self._seeded:
            self._confirm_seed()
        start = self._published if self._bootstrapped else 0
        call = (self.feed.follow(start) if self.feed is not None else api_pb2_grpc.LogStub(self._channel).Follow(
            api_pb2.FollowRequest(from_offset=start), metadata=self._metadata or None))
        self._quiet_since = time.monotonic()
        self._call = call
        try:
            if self._stop.is_set():
                call.cancel()
            messages = iter(call)
            for msg in messages:
                self._heard_from(msg)
                if msg.HasField("snapshot"):
                    self._install(self._snapshot_chunks(msg, messages))
                else:
                    self._apply(msg)
        finally:
            self._call = None  # ended: move_to and the watchdog leave it alone until the next one

    def seed(self, offset: int, items: Iterable[tuple[str, bytes, int, int]], digest_hex: str) -> None:
        """Before start(): begin from the followed node's state at `offset` read here (a worker: its core's
        newest snapshot file, loaded while the core loads the same one; nameserver/replica/seed.py) instead of
        a snapshot sent over Follow after the core is ready, which each worker waited for and then loaded one
        after the other. `digest_hex`: the file's stamped digest, taken as the core takes it (the file's
        checksums were checked as it was read); the followed node's digest at `offset` must match it before
        the stream starts (_confirm_seed), else the state comes over Follow as without a seed."""
        fresh = self._fresh_state()
        with frozen_load():  # as the core's applier loads the same file
            fresh.restore(offset, items, digest_hex, defer_routes=True)
        self._swap_in(fresh, offset, digest_hex, "a snapshot file")
        self._seeded = digest_hex
        # a weak reference: a state replaced meanwhile goes by its counts (test_a_replaced_state_is_freed...)
        threading.Thread(target=self._build_routes, args=(weakref.ref(fresh),), name=f"replica-routes-{self.name}",
                         daemon=True).start()

    def _build_routes(self, seeded: weakref.ref[MetadataState]) -> None:
        """The seeded state's route index, as the core's apply thread builds its own after a restore: a chunk
        at a time under the lock (a reader waits for one chunk at most), until built or no longer served."""
        more = True
        while more:
            with self.lock:
                state = seeded()
                if state is None or self.state is not state:
                    return  # replaced (a snapshot over the stream): nothing of it is read any more
                with frozen_load(young_only=True):
                    more = state.build_routes()
                del state
            time.sleep(0)  # the GIL to a reader the lock woke, before the next chunk takes the lock again

    def _confirm_seed(self) -> None:
        assert self._channel is not None
        offset, seeded = self._published, self._seeded
        try:
            reply = api_pb2_grpc.LogStub(self._channel).DigestAt(
                api_pb2.DigestAtRequest(offset=offset), timeout=self.max_silence_s, metadata=self._metadata or None)
            digest = reply.digest
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.OUT_OF_RANGE:
                raise  # not ready yet, or gone: asked again on the next attempt
            digest = f"unknown ({exc.details()})"
        self._seeded = ""
        if digest != seeded:
            log.warning("replica of %s: its digest at offset %d is %s, the snapshot file's %s: loading its state "
                        "over the stream instead", self.target, offset, digest, seeded)
            self._bootstrapped = False

    def _heard_from(self, msg: api_pb2.FollowMessage) -> None:
        self.core_stopped = ""
        self._core_offset = msg.core_offset
        self._heard = self._answered = self._quiet_since = time.monotonic()

    def _snapshot_chunks(self, first: api_pb2.FollowMessage, messages: Iterator[api_pb2.FollowMessage]
                         ) -> Iterator[api_pb2.StateChunk]:
        """The chunks of the snapshot `first` begins, read off the stream as the load takes them: one
        chunk held at a time (holding them all until the last came cost a worker ~130 MiB at a million
        records that its allocator kept after the load)."""
        msg = first
        while True:
            yield msg.snapshot
            if msg.snapshot_done:
                return
            following = next(messages, None)
            if following is None or not following.HasField("snapshot"):
                raise SnapshotMismatch(f"the snapshot from {self.target} ended before its last chunk")
            msg = following
            self._heard_from(msg)

    def _install(self, chunks: Iterable[api_pb2.StateChunk]) -> None:
        """Load a snapshot into a fresh state as its chunks come (readers keep the old one meanwhile), then
        swap it in. Every chunk carries the snapshot's offset and digest: the first one's are used, and
        each chunk must carry the same."""
        stream = iter(chunks)
        first = next(stream)
        offset, digest = first.apply_offset, first.digest

        def items() -> Iterator[tuple[str, bytes, int, int]]:
            chunk: api_pb2.StateChunk | None = first
            while chunk is not None:
                if (chunk.apply_offset, chunk.digest) != (offset, digest):
                    raise SnapshotMismatch(f"a snapshot chunk from {self.target} is of offset {chunk.apply_offset}, "
                                           f"the snapshot of {offset}")
                for it in chunk.items:
                    yield it.key, it.value, it.version, it.type
                chunk = next(stream, None)

        fresh = self._fresh_state()
        with frozen_load():
            fresh.restore(offset, items())  # no stamped digest: every pair is hashed, and checked below
        if fresh.digest_hex != digest:
            fresh.release()
            self._bootstrapped = False
            raise SnapshotMismatch(f"snapshot at offset {offset} from {self.target} hashes to "
                                   f"{fresh.digest_hex}, stamped {digest}")
        self._swap_in(fresh, offset, digest, self.target)

    def _fresh_state(self) -> MetadataState:
        fresh = MetadataState(self.accounting, lazy_routes=not self.accounting)
        # Above every generation of the old state: a route cached against it never matches the new one.
        fresh.route_generation = self.state.route_generation + 1
        return fresh

    def _swap_in(self, fresh: MetadataState, offset: int, digest: str, source: str) -> None:
        """Serve `fresh` (the state at `offset`) from now on."""
        with self.lock:
            replaced, self.state = self.state, fresh
        replaced.release()  # frozen with its load: freed by its counts, or never
        self._seeded = ""
        self._bootstrapped = True
        self.bootstraps += 1
        log.info("replica of %s loaded a snapshot at offset %d from %s (digest %s, %d keys)", self.target, offset,
                 source, digest, len(fresh.kv))
        self.history.reset(offset)
        _notify(self.reset_listeners, offset)
        self._publish(offset, force=True)

    def _apply(self, msg: api_pb2.FollowMessage) -> None:
        """Apply a message's entries in order, each under the lock, as the core's apply thread does."""
        state = self.state
        for e in msg.entries[:]:  # sliced: raftlog/kvstate.py KVState.apply_entry says why
            offset = e.offset  # each field read once: each read makes a new object (the entry's bytes a copy)
            if offset <= state.kv.offset:
                continue  # already held (a resumed stream repeats nothing, but be safe)
            data = e.entry
            entry = decode_for_apply(offset, data)
            changes: list[ChangeTuple] = []
            with self.lock:
                state.apply_entry(offset, entry, changes)
            applied = AppliedEntry(offset, e.term, data, tuple(changes))
            self.history.append(applied)
            _notify(self.entry_listeners, applied)
        if msg.through_offset > state.kv.offset:
            with self.lock:  # offsets without entries of ours (pysyncobj's no-ops): as the core's advance
                state.kv.offset = msg.through_offset
        self._publish(state.kv.offset)

    def _publish(self, offset: int, force: bool = False) -> None:
        with self._offset_cv:
            moved = force or offset > self._published
            if moved:
                self._published = offset
            self._offset_cv.notify_all()
        if moved:
            _notify(self.publish_listeners, offset)

    def _watch_silence(self) -> None:
        """Cut a stream that stopped talking (a half-open connection, a core frozen): the follower
        thread then reconnects."""
        while not self._stop.wait(max(0.1, self.max_silence_s / 4)):
            call = self._call
            if call is not None and time.monotonic() - self._quiet_since > self.max_silence_s:
                self.last_error = f"no message from {self.target} for {self.max_silence_s} s"
                self._quiet_since = time.monotonic()  # once per silence
                self._cut = True
                call.cancel()


def _still_loading(exc: grpc.RpcError) -> bool:
    """The followed node answered that it is not ready yet (a starting core loading its snapshot: Log.Follow
    refuses until then). Its workers, started with it, retry at the shortest backoff: a doubling one reached
    2 s while a core loaded a million records, and the node served that much later."""
    return exc.code() == grpc.StatusCode.UNAVAILABLE and (exc.details() or "").startswith("not ready")


def _answered(exc: grpc.RpcError) -> bool:
    """Whether a failed follow is the followed node's own answer (a refusal: not ready, the followers' bound, a
    bad request), not a link that broke, could not connect, or was cut here (UNAVAILABLE without the node's
    "not ready", CANCELLED, DEADLINE_EXCEEDED)."""
    code = exc.code()
    if code == grpc.StatusCode.UNAVAILABLE:
        return (exc.details() or "").startswith("not ready")
    return code not in (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)


def _apply_stopped(exc: grpc.RpcError) -> str:
    """What the followed node said when it refuses because its apply stopped (Log.Follow's "not ready:"
    and NameServerNode.not_ready_reason's "apply stopped: ..."), else ""."""
    details = exc.details() or ""
    stopped = exc.code() == grpc.StatusCode.UNAVAILABLE and details.startswith("not ready: apply stopped")
    return details.removeprefix("not ready: ") if stopped else ""


def _notify(listeners: list[Callable[[Any], None]], value: Any) -> None:
    for listener in listeners:
        try:
            listener(value)
        except Exception:  # a listener's bug never stops the replica
            log.exception("replica listener failed at offset %s", getattr(value, "offset", value))
