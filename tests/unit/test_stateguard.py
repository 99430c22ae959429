"""Optimistic reads of the state (nameserver/core/stateguard.py): alone, and on a real one-node
NameServerNode, where a leader's translation no longer holds the state lock: apply and readers go on
while it runs, and a translation that an apply overtook is made again."""

from __future__ import annotations

import threading
import time

import pytest

from nameserver.core import NameServerNode
from nameserver.core.stateguard import OPTIMISTIC_ATTEMPTS, StateGuard
from nameserver.pb import state_pb2
from nameserver.state import keys, translate
from tests.threads import held_elsewhere


def test_a_read_that_no_apply_overtook_counts_and_needs_no_lock() -> None:
    guard = StateGuard()
    with held_elsewhere(guard.lock):  # a short reader (status, a route miss) holds the lock
        assert guard.optimistic(lambda: 42) == 42  # did not wait for that reader
    assert (guard.optimistic_reads, guard.optimistic_retries, guard.locked_fallbacks) == (1, 0, 0)


def test_an_apply_under_a_read_makes_it_read_again_and_a_torn_reads_exception_is_dropped() -> None:
    guard = StateGuard()
    calls = []

    def fn() -> int:
        calls.append(1)
        if len(calls) == 1:
            with guard.writer:  # an entry applied while this attempt read
                pass
        if len(calls) == 2:
            with guard.writer:
                raise RuntimeError("dictionary changed size during iteration")  # the torn read's symptom
        return len(calls)

    assert guard.optimistic(fn) == 3
    assert (guard.optimistic_reads, guard.optimistic_retries, guard.locked_fallbacks) == (1, 2, 0)


def test_an_exception_while_the_state_held_still_is_the_answer() -> None:
    guard = StateGuard()

    def refuse() -> None:
        raise ValueError("the request is bad")

    with pytest.raises(ValueError, match="bad"):
        guard.optimistic(refuse)
    assert guard.optimistic_retries == 0


def test_a_read_that_loses_every_race_runs_under_the_lock() -> None:
    guard = StateGuard()
    owned = []

    def fn() -> str:
        owned.append(guard.lock._is_owned())  # type: ignore[attr-defined]
        if not owned[-1]:
            with guard.writer:
                pass
        return "done"

    assert guard.optimistic(fn) == "done"
    assert owned == [False] * OPTIMISTIC_ATTEMPTS + [True] and guard.locked_fallbacks == 1


def test_a_read_that_starts_during_an_apply_waits_for_that_entry_only() -> None:
    guard = StateGuard()
    inside, release = threading.Event(), threading.Event()

    def apply() -> None:
        with guard.writer:
            inside.set()
            release.wait(10)

    t = threading.Thread(target=apply)
    t.start()
    assert inside.wait(5)
    threading.Timer(0.2, release.set).start()
    assert guard.optimistic(lambda: "after the entry") == "after the entry"
    t.join()
    assert guard.optimistic_reads == 1 and guard.locked_fallbacks == 0


def test_a_long_translation_stalls_neither_apply_nor_reads_and_is_made_again_when_overtaken(
        node: NameServerNode) -> None:
    """A translation that takes long (a registration of 70,000 topics takes about a second) used to hold
    the state lock throughout: a write of another key and a locked read waited for it. Now both go on,
    and the long translation, overtaken by that write's apply, is made again against the new state."""
    started, go = threading.Event(), threading.Event()
    seen: list[bytes | None] = []

    def slow(state):  # reads a key, then takes its time, as a huge diff would
        seen.append(state.kv.get(keys.kv_key("ns", "other")))
        if len(seen) == 1:
            started.set()
            go.wait(10)
        return translate.put_kv(state, "ns", "slow", f"saw-{len(seen)}")

    result: list[object] = []
    t = threading.Thread(target=lambda: result.append(node.write(slow, 10)))
    t.start()
    try:
        assert started.wait(10)
        t0 = time.monotonic()
        other = node.write(lambda s: translate.put_kv(s, "ns", "other", "v"), 5)  # proposed, applied
        value, offset = node.read(lambda s: s.kv.get(keys.kv_key("ns", "other")), other.offset, 5)
        assert time.monotonic() - t0 < 5 and offset >= other.offset and value is not None
    finally:
        go.set()
        t.join(10)
    assert len(seen) == 2 and seen[0] is None and seen[1] is not None  # made again, after the apply
    assert result and node.guard.optimistic_retries >= 1
    got, _ = node.read(lambda s: s.kv.get(keys.kv_key("ns", "slow")), 0, 5)
    kv = state_pb2.KvValue()
    kv.ParseFromString(got)
    assert kv.value == "saw-2"
