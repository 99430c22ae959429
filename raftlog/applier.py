"""The apply thread: builds the state from committed entries, in order, off the Raft tick thread.

pysyncobj's tick thread only enqueues (index, bytes); everything that takes time (decoding,
applying, resolving waiters, feeding watchers, freezing the state for a snapshot, restoring a
snapshot) happens here. Apply never raises: a malformed entry is logged and skipped as a no-op; an
entry from a newer format stops this node's apply (with a critical log) rather than diverge.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from raftlog.codec import decode_for_apply
from raftlog.digest import digest_hex, digest_of
from raftlog.history import AppliedEntry, EntryHistory
from raftlog.kvstate import ChangeTuple
from raftlog.pb import entry_pb2

log = logging.getLogger("raftlog.apply")
ALIVE_CHECK_S = 0.2  # how soon a waiter notices that its caller went away
DIGEST_CHECK_DELAY_S = 2.0  # a restored snapshot's digest is recomputed this long after the restore
DIGEST_CHECK_CHUNK = 20_000  # pairs hashed between two pauses of that check


class StateMachine(Protocol):
    """hashicorp/raft's FSM, our flavour: apply, freeze (for snapshot), restore."""

    def apply_entry(self, offset: int, entry: entry_pb2.Entry, changes: list[ChangeTuple]
                    ) -> list[entry_pb2.BatchResult]: ...

    def freeze(self) -> Any: ...  # a point-in-time copy, iterated by `snapshot_items`

    def snapshot_items(self, frozen: Any) -> Iterable[tuple[str, bytes, int, int]]: ...

    def restore(self, offset: int, items: Iterable[tuple[str, bytes, int, int]], digest_hex: str | None = None
                ) -> None: ...

    @property
    def digest_hex(self) -> str: ...


@runtime_checkable
class RestoresInParts(Protocol):
    """A state machine whose restore leaves part of its work for after the node is ready (derived indexes):
    `restore_rest` does one chunk of it, under the state lock, and says whether more is left."""

    def restore_rest(self) -> bool: ...


@dataclass(slots=True)
class Applied:
    """What a proposer learns about its batch."""

    offset: int
    result: entry_pb2.BatchResult
    term: int


class _Waiter:
    __slots__ = ("event", "applied")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.applied: Applied | None = None


@contextlib.contextmanager
def frozen_load(young_only: bool = False) -> Iterator[None]:
    """The cyclic garbage collector off while a snapshot builds millions of objects, and what it built frozen
    after (gc.freeze: out of every generation the collector walks). Paused, because each build step would
    otherwise start collections that walk everything built so far; frozen, because the first collection
    after the pause walked the whole loaded state once more (0.1-0.2 s of a million-key restart), and later
    full collections again, for nothing. What is frozen is never collected as a cycle: a loaded state must be
    freed by its reference counts when a later load replaces it (a state replaced whole, as a replica's is,
    breaks its own cycle first: nameserver/state/metadata.py release). Collected first, so that garbage
    cycles made before the load are not frozen with it (cheap: an earlier load is frozen, not walked); the
    cycles other threads leave during the load are (small, once per load). `young_only`: collect the youngest
    generation only first (a chunk of a restore's rest, one of dozens: a full collection each walked the copy
    of the whole map the digest check holds, ~0.2 s in all at a million keys)."""
    was_enabled = gc.isenabled()
    gc.collect(0 if young_only else 2)
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()


class Applier:
    def __init__(self, fsm: StateMachine, lock: AbstractContextManager[Any]) -> None:
        self.fsm = fsm
        # Held while the state changes: readers of the state hold it too (or check that it was not
        # taken meanwhile, nameserver/core/stateguard.py), so they never see half an entry.
        self.lock = lock
        self._queue: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._waiters: dict[str, _Waiter] = {}
        self._waiters_lock = threading.Lock()
        self._offset_cv = threading.Condition()
        self.apply_offset = 0
        self.last_apply_time = time.monotonic()
        self.failed: str | None = None  # set when apply stopped for good
        self.restored_digest_checks = 0  # restored snapshots whose stamped digest was recomputed since
        # Snapshots restored: each replaced the state wholesale (a start, or the leader's snapshot), whatever
        # its offset against the apply offset before. Counted before the history resets and the offset moves.
        self.restores = 0
        self._rest_queued = False  # a chunk of a restore's rest is queued (RestoresInParts)
        self.history = EntryHistory()
        # Called on the apply thread after each applied entry (feeds watchers, archivers, metrics), before
        # the apply offset moves to it: whoever sees the offset knows every listener has the entry.
        self.entry_listeners: list[Callable[[AppliedEntry], None]] = []
        # Called on the apply thread when a snapshot replaced the state (the offset jumps; entries
        # between were never applied here one by one), before the offset moves.
        self.reset_listeners: list[Callable[[int], None]] = []
        self.snapshot_handler: Callable[[int, int, Any, bytes, str], None] | None = None
        self.restore_handler: Callable[[str, int], tuple[int, Iterable, str]] | None = None
        self._thread = threading.Thread(target=self._run, name="apply", daemon=True)
        self._stopped = False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped = True
        self._queue.put(("stop",))
        self._thread.join(timeout=5)

    # ---- called from the tick thread: must be O(1) and never raise ---------------------------

    def enqueue_entry(self, index: int, data: bytes) -> None:
        self._queue.put(("entry", index, data))

    def enqueue_advance(self, index: int) -> None:
        """pysyncobj applied an entry of its own (no-op, membership) up to `index`."""
        self._queue.put(("advance", index))

    def enqueue_snapshot(self, index: int, term: int, raft_meta: bytes) -> None:
        self._queue.put(("snapshot", index, term, raft_meta))

    def enqueue_restore(self, path: str, index: int) -> None:
        self._queue.put(("restore", path, index))

    # ---- proposers ---------------------------------------------------------------------------

    def register(self, request_id: str) -> _Waiter:
        w = _Waiter()
        with self._waiters_lock:
            self._waiters[request_id] = w
        return w

    def unregister(self, request_id: str) -> None:
        if request_id not in self._waiters:
            return  # taken by the apply already (a proposal that applied, on the apply thread itself): no lock
        with self._waiters_lock:
            self._waiters.pop(request_id, None)

    def wait_applied(self, offset: int, timeout: float, alive: Callable[[], bool] | None = None) -> bool:
        """Block until the apply offset reaches `offset` (read-your-writes, barriers). False at the
        timeout, or (checked every ALIVE_CHECK_S) once `alive()` says the waiter's caller has gone."""
        deadline = time.monotonic() + timeout
        with self._offset_cv:
            while self.apply_offset < offset:
                left = deadline - time.monotonic()
                if left <= 0 or self.failed or (alive is not None and not alive()):
                    return False
                self._offset_cv.wait(left if alive is None else min(left, ALIVE_CHECK_S))
            return True

    def fail(self, reason: str) -> None:
        """Stop applying for good (a state we cannot trust); readers see it in status."""
        self.failed = reason
        log.critical("apply stopped: %s", reason)
        with self._offset_cv:
            self._offset_cv.notify_all()

    def queued(self) -> int:
        return self._queue.qsize()

    # ---- the thread --------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            kind = item[0]
            if kind == "stop":
                return
            if self.failed:
                continue  # drain, but never apply past a failure
            try:
                if kind == "entry":
                    self._apply(item[1], item[2])
                elif kind == "advance":
                    self._advance(item[1])
                elif kind == "snapshot":
                    self._snapshot(item[1], item[2], item[3])
                elif kind == "restore":
                    self._restore(item[1], item[2])
                elif kind == "restore-rest":
                    self._restore_rest()
            except Exception as exc:  # apply must not die silently: stop, say why, stay up
                log.exception("apply failed")
                self.fail(f"{kind} failed: {exc}")

    def _apply(self, index: int, data: bytes) -> None:
        if index <= self.apply_offset:
            return  # already covered by a restored snapshot
        entry = decode_for_apply(index, data)
        changes: list[ChangeTuple] = []
        with self.lock:
            results = self.fsm.apply_entry(index, entry, changes)
        applied = AppliedEntry(index, entry.term, data, tuple(changes))
        self.history.append(applied)  # before the offset moves: a reader at that offset finds it here
        for listener in self.entry_listeners:
            try:
                listener(applied)
            except Exception:
                log.exception("entry listener failed at %d", index)
        self._publish(index)
        waiters = self._waiters
        if not waiters:
            return  # nobody proposed here (a follower's every entry): no batch read again, no lock taken
        # every request id read first, then one lock for them all (not one a batch)
        ids = [batch.request_id for batch in entry.batches[:]]  # sliced: kvstate.py apply_entry says why
        with self._waiters_lock:
            found = [waiters.pop(request_id, None) if request_id else None for request_id in ids]
        term = entry.term
        for w, result in zip(found, results, strict=True):
            if w is not None:
                w.applied = Applied(index, result, term)
                w.event.set()

    def _advance(self, index: int) -> None:
        if index > self.apply_offset:
            with self.lock:
                self._set_fsm_offset(index)
            self._publish(index)

    def _set_fsm_offset(self, index: int) -> None:
        setter = getattr(self.fsm, "set_offset", None)
        if setter is not None:
            setter(index)

    def _publish(self, index: int) -> None:
        with self._offset_cv:
            self.apply_offset = index
            self.last_apply_time = time.monotonic()
            self._offset_cv.notify_all()

    def _snapshot(self, index: int, term: int, raft_meta: bytes) -> None:
        # Every entry <= index was enqueued before this request, so the state is at `index` now.
        if index > self.apply_offset:
            self._advance(index)
        with self.lock:
            frozen = self.fsm.freeze()
            digest = self.fsm.digest_hex
        if self.snapshot_handler is not None:
            self.snapshot_handler(index, term, frozen, raft_meta, digest)

    def _check_restored_digest(self, path: str, offset: int, frozen: dict[str, tuple[bytes, int, int]],
                               stamped: str, start_after_s: float = DIGEST_CHECK_DELAY_S) -> None:
        """Recompute a restored snapshot's digest from its pairs; a mismatch stops apply, as a damaged
        snapshot does. Starts late and yields often: the node's catch-up comes first."""
        time.sleep(start_after_s)

        def paced() -> Iterator[tuple[str, bytes]]:
            for i, (key, item) in enumerate(frozen.items()):
                if i % DIGEST_CHECK_CHUNK == DIGEST_CHECK_CHUNK - 1:
                    time.sleep(0.001)  # let the apply and serving threads have the interpreter
                yield key, item[0]

        got = digest_hex(digest_of(paced()))
        self.restored_digest_checks += 1
        if got != stamped:
            self.fail(f"snapshot {path} at offset {offset} holds pairs with digest {got}, but is stamped "
                      f"{stamped}: the state loaded from it cannot be trusted")
        else:
            log.info("restored snapshot at offset %d: digest %s checked over %d pairs", offset, got, len(frozen))

    def _restore(self, path: str, index: int) -> None:
        assert self.restore_handler is not None
        offset, items, digest = self.restore_handler(path, index)
        with self.lock:
            # The stamped digest is taken as is: the file's bytes matched its checksum. Hashing every pair
            # again costs a second per million, on the way to ready; a thread does it afterwards and
            # stops apply if the pairs loaded are not the ones stamped (a damaged file or a writer's bug).
            with frozen_load():
                self.fsm.restore(offset, items, digest)
            frozen = self.fsm.freeze()
            self.restores += 1
        threading.Thread(target=self._check_restored_digest, args=(path, offset, frozen, digest),
                         name="digest-check", daemon=True).start()
        self.history.reset(offset)
        # At or below what was applied here: this node's state up to there is replaced, not extended (its
        # leader found our log disagreeing with its own below its snapshot). Worth a word (finding 13).
        replaced = f"; it replaces the state applied here up to {self.apply_offset}" \
            if 0 < offset <= self.apply_offset else ""
        log.log(logging.WARNING if replaced else logging.INFO, "restored snapshot at offset %d (digest %s)%s",
                offset, digest, replaced, extra={"event": "snapshot_restored", "offset": offset, "digest": digest})
        for listener in self.reset_listeners:
            try:
                listener(offset)
            except Exception:
                log.exception("reset listener failed at %d", offset)
        self._publish(offset)
        if isinstance(self.fsm, RestoresInParts) and not self._rest_queued:
            self._rest_queued = True  # one chain of chunks: a restore meanwhile restarts what it builds
            self._queue.put(("restore-rest",))  # after the entries queued by now: the node's replay first

    def _restore_rest(self) -> None:
        """One chunk of what the restore left, between entries (readers wait for one chunk at most); the next
        chunk queued behind the entries that arrived meanwhile. What it builds is frozen as the load is."""
        assert isinstance(self.fsm, RestoresInParts)
        with self.lock, frozen_load(young_only=True):
            more = self.fsm.restore_rest()
        time.sleep(0)  # the GIL to a reader the lock woke, before the next chunk can take the lock again
        if more:
            self._queue.put(("restore-rest",))
        else:
            self._rest_queued = False
            log.info("restore complete at offset %d: its derived indexes built", self.apply_offset,
                     extra={"event": "restore_complete", "offset": self.apply_offset})
