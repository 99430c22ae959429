"""A lone proposal is appended by its proposer's own thread (raftlog/proposer.py, GroupCommitter._append_alone):
when the group-commit thread waits with nothing in hand, nothing is queued and no entry is in flight, it would
append that proposal at once and alone, so the proposer does when the entry before carried one proposal too (a
writer alone), with no wake of that thread. Anything else still goes through the thread (with entries in flight, or
after an entry several shared, proposals may share the next one), and the cap on entries in flight holds whichever
thread appends. A stand-in log records each entry, the thread that appended it, and holds its result
until the test gives it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from raftlog.applier import Applied
from raftlog.codec import decode_entry
from raftlog.pb import entry_pb2
from raftlog.proposer import GroupCommitter, ProposalError
from tests.unit.test_group_commit_in_flight import StandInApplier, StandInLog


class ThreadLog(StandInLog):
    """StandInLog that also records which thread appended each entry, and the most entries ever in flight."""

    def __init__(self, applier: StandInApplier) -> None:
        super().__init__(applier)
        self.threads: list[str] = []
        self.results = 0
        self.most_in_flight = 0

    def append(self, data: bytes, on_result: Callable[[Any, int], None]) -> None:
        with self.appended:
            self.threads.append(threading.current_thread().name)
            self.most_in_flight = max(self.most_in_flight, len(self.entries) + 1 - self.results)
        super().append(data, on_result)

    def commit(self, i: int) -> None:
        with self.appended:
            self.results += 1
        super().commit(i)


def _batch(key: str) -> entry_pb2.Batch:
    batch = entry_pb2.Batch()
    batch.records.add(key=key, value=b"v")
    return batch


@contextlib.contextmanager
def started(in_flight: int = 2) -> Iterator[tuple[ThreadLog, GroupCommitter]]:
    """A running committer over a stand-in log; stopped at the end."""
    log = ThreadLog(StandInApplier())
    committer = GroupCommitter(log.applier, log.append, lambda: True, lambda: 1,  # type: ignore[arg-type]
                               linger_s=0.0, max_in_flight=in_flight)
    committer.start()
    try:
        yield log, committer
    finally:
        committer.stop()


def _first_entry(committer: GroupCommitter, log: StandInLog) -> None:
    """The term's first proposal, appended and applied: it goes through the thread (which learns from it the
    term of the entries in flight), and leaves none in flight."""
    first, _ = _later(committer, "k0")
    log.wait_entries(1)
    log.commit(0)
    assert first.wait(10)


def _later(committer: GroupCommitter, key: str) -> tuple[threading.Event, list[Any]]:
    """propose_later of one batch; its outcome, and an event set when it came."""
    came = threading.Event()
    got: list[Any] = []

    def done(applied: Applied | None, error: ProposalError | None) -> None:
        got.append(applied if error is None else error)
        came.set()

    committer.propose_later(_batch(key), done)
    return came, got


def test_a_lone_proposal_is_appended_by_its_proposers_thread() -> None:
    with started() as (log, committer):
        _first_entry(committer, log)
        me = threading.current_thread().name
        for i in range(1, 4):  # each alone, nothing in flight: appended here, before propose_later returns
            came, got = _later(committer, f"k{i}")
            assert len(log.entries) == i + 1
            assert log.threads[i] == me
            log.commit(i)
            assert came.wait(10) and isinstance(got[0], Applied)
        assert (committer.entries_appended, committer.batches_appended) == (4, 4)


def test_with_an_entry_in_flight_proposals_go_by_the_thread_and_share_an_entry() -> None:
    with started(in_flight=1) as (log, committer):
        _first_entry(committer, log)
        held, _ = _later(committer, "k1")  # alone: appended here, and in flight until its result comes
        assert log.threads[1] == threading.current_thread().name
        waiting = [_later(committer, f"w{i}") for i in range(3)]  # one in flight: queued, for the thread
        assert len(log.entries) == 2
        log.commit(1)
        log.wait_entries(3)
        assert log.threads[2] == "group-commit"
        assert log.batches(2) == 3
        log.commit(2)
        assert held.wait(10) and all(came.wait(10) for came, _ in waiting)
        # the entry appended last carried several: writers are not alone, the next proposal waits for the thread
        after, _ = _later(committer, "after")
        log.wait_entries(4)
        assert log.threads[3] == "group-commit"
        log.commit(3)
        assert after.wait(10)
        _later(committer, "alone again")  # the last entry carried one: appended here
        assert len(log.entries) == 5 and log.threads[4] == threading.current_thread().name


def test_the_cap_holds_whichever_thread_appends() -> None:
    """Many proposers at once, results given as the entries come: never more entries in flight than the cap."""
    stop = threading.Event()
    outcomes: list[threading.Event] = []
    lock = threading.Lock()
    with started(in_flight=2) as (log, committer):

        def results() -> None:
            given = 0
            while not stop.is_set() or given < len(log.entries):
                with log.appended:
                    log.appended.wait_for(lambda seen=given: len(log.entries) > seen or stop.is_set(), 0.05)
                    ready = len(log.entries) > given
                if ready:
                    log.commit(given)
                    given += 1

        def proposer(n: int) -> None:
            for i in range(40):
                came, _ = _later(committer, f"p{n}-{i}")
                with lock:
                    outcomes.append(came)
                came.wait(10)

        giver = threading.Thread(target=results, daemon=True)
        giver.start()
        try:
            proposers = [threading.Thread(target=proposer, args=(n,), daemon=True) for n in range(6)]
            for t in proposers:
                t.start()
            for t in proposers:
                t.join(30)
        finally:
            stop.set()
            giver.join(10)
        assert len(outcomes) == 240 and all(came.is_set() for came in outcomes)
        assert log.most_in_flight <= 2
        assert committer.batches_appended == 240 and committer.entries_appended == len(log.entries)


def test_a_proposal_being_appended_alone_holds_its_room_under_the_cap(monkeypatch: Any) -> None:
    """While a lone proposal is on its way in on its proposer's thread (its entry being made), the group-commit
    thread counts it in flight: a proposal queued meanwhile waits for the room rather than go past the cap."""
    from raftlog import proposer

    gate, inside = threading.Event(), threading.Event()
    encode = proposer.encode_entry

    def held(entry: entry_pb2.Entry) -> bytes:
        if threading.current_thread().name == "alone":
            inside.set()
            assert gate.wait(10)
        return encode(entry)

    with started(in_flight=1) as (log, committer):
        try:
            _first_entry(committer, log)
            monkeypatch.setattr(proposer, "encode_entry", held)
            alone = threading.Thread(target=_later, args=(committer, "a"), name="alone", daemon=True)
            alone.start()
            assert inside.wait(10)  # "a" took the room and is being appended on its own thread
            queued, _ = _later(committer, "q")  # queued for the thread, which must wait for the room
            threading.Event().wait(0.3)
            assert len(log.entries) == 1
            gate.set()
            alone.join(10)
            log.wait_entries(2)
            assert log.threads[1] == "alone"
            threading.Event().wait(0.3)
            assert len(log.entries) == 2 and log.most_in_flight == 1  # "q" still waits: "a" is in flight
            log.commit(1)
            log.wait_entries(3)
            assert log.threads[2] == "group-commit"
            log.commit(2)
            assert queued.wait(10)
        finally:
            gate.set()


class _PausingQueue:
    """The committer's queue, whose get() holds the group-commit thread, once, after it took a proposal and
    before it returns (the moment it holds one it has not appended)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.took, self.go = threading.Event(), threading.Event()

    def get(self, *args: Any, **kwargs: Any) -> Any:
        item = self.inner.get(*args, **kwargs)
        if item is not None and not self.took.is_set():
            self.took.set()
            assert self.go.wait(10)
        return item

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_lone_proposal_never_overtakes_one_the_thread_holds() -> None:
    """A proposal handed to the group-commit thread and held by it, not appended yet, keeps a proposal made after
    it from going alone: entries keep the order their proposals were made in (one worker's frame of writes)."""
    log = ThreadLog(StandInApplier())
    committer = GroupCommitter(log.applier, log.append, lambda: True, lambda: 1,  # type: ignore[arg-type]
                               linger_s=0.0, max_in_flight=1)
    pausing = _PausingQueue(committer._queue)
    committer._queue = pausing  # type: ignore[assignment]
    pausing.took.set()  # not the term's first proposal
    committer.start()
    try:
        _first_entry(committer, log)
        held, _ = _later(committer, "k1")  # alone, in flight
        pausing.took.clear()
        first, _ = _later(committer, "first")  # one in flight: handed to the thread
        try:
            assert pausing.took.wait(10)  # the thread holds "first"
            log.commit(1)  # nothing in flight now, and the entry before carried one proposal
            assert held.wait(10)
            second, _ = _later(committer, "second")  # made after "first": must not go before it
        finally:
            pausing.go.set()
        given = 2
        while not (first.is_set() and second.is_set()):  # each entry's result as it comes (one in flight)
            log.wait_entries(given + 1)
            log.commit(given)
            given += 1
            assert given < 6
        keys = [b.records[0].key for data, _ in log.entries[2:] for b in decode_entry(data).batches]
        assert keys == ["first", "second"], keys  # in one entry or two, never "second" first
        assert log.threads[2] == "group-commit"
    finally:
        pausing.go.set()
        committer.stop()
