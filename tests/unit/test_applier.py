"""The apply thread's ordering guarantees, on the real Applier (no Raft)."""

import threading

from raftlog.applier import Applier
from raftlog.codec import encode_entry
from raftlog.kvstate import KVState, KVStateMachine
from raftlog.pb import entry_pb2


def entry(i: int) -> bytes:
    return encode_entry(entry_pb2.Entry(term=1, batches=[entry_pb2.Batch(
        records=[entry_pb2.Record(type=5, key=f"kv/ns/k{i}", value=str(i).encode())])]))


def test_an_entry_is_in_the_history_before_its_offset_is_published() -> None:
    """ReadLog and resuming watchers wake on the apply offset, then read the history: never a gap."""
    applier = Applier(KVStateMachine(KVState()), threading.RLock())
    applier.start()
    try:
        for i in range(1, 501):
            applier.enqueue_entry(i, entry(i))
            assert applier.wait_applied(i, 5)
            got = applier.history.after(i - 1, limit=1)
            assert got and got[0].offset == i, f"offset {i} published before it reached the history"
    finally:
        applier.stop()


def test_a_malformed_entry_applies_as_a_noop_and_apply_goes_on() -> None:
    kv = KVState()
    applier = Applier(KVStateMachine(kv), threading.RLock())
    applier.start()
    try:
        applier.enqueue_entry(1, b"\xff\xfe not protobuf")
        applier.enqueue_entry(2, entry(2))
        assert applier.wait_applied(2, 5)
        assert kv.get("kv/ns/k2") == b"2" and not applier.failed
    finally:
        applier.stop()


def test_listeners_have_an_entry_before_its_offset_is_published() -> None:
    """A watch stream's progress message says "nothing up to this offset is still owed": it reads the apply
    offset, then finds its queue empty. That holds only if every listener got the entry before the offset
    moved to it (before this order, a progress offset could pass an event still on its way)."""
    applier = Applier(KVStateMachine(KVState()), threading.RLock())
    seen: list[tuple[int, int]] = []
    applier.entry_listeners.append(lambda e: seen.append((e.offset, applier.apply_offset)))
    applier.start()
    try:
        for i in range(1, 201):
            applier.enqueue_entry(i, entry(i))
        assert applier.wait_applied(200, 5)
        assert [o for o, _ in seen] == list(range(1, 201))
        assert all(published < offset for offset, published in seen), "an offset was published before a listener"
    finally:
        applier.stop()


def test_a_restored_snapshot_takes_its_stamped_digest_and_a_wrong_stamp_stops_apply() -> None:
    """Restore trusts the stamp (no hashing on the way to ready); the later check catches a wrong one."""
    from raftlog.digest import digest_hex, digest_of

    pairs = [(f"k{i}", f"v{i}".encode()) for i in range(50)]
    right = digest_hex(digest_of(pairs))
    items = [(k, v, 7, 1) for k, v in pairs]

    kv = KVState()
    applier = Applier(KVStateMachine(kv), threading.RLock())
    applier.restore_handler = lambda path, index: (7, iter(items), right)
    applier._restore("snap-ok", 7)
    assert kv.digest_hex == right and kv.offset == 7
    applier._check_restored_digest("snap-ok", 7, kv.freeze(), right, start_after_s=0)
    assert applier.failed is None and applier.restored_digest_checks >= 1

    kv = KVState()
    applier = Applier(KVStateMachine(kv), threading.RLock())
    wrong = digest_hex(digest_of(pairs[:-1]))
    applier.restore_handler = lambda path, index: (7, iter(items), wrong)
    applier._restore("snap-bad", 7)
    assert kv.digest_hex == wrong  # taken as stamped
    applier._check_restored_digest("snap-bad", 7, kv.freeze(), wrong, start_after_s=0)
    assert applier.failed is not None and "snap-bad" in applier.failed and right in applier.failed


def test_every_restore_is_counted_before_the_history_resets_and_the_offset_moves(caplog) -> None:
    """Log.Follow sends its followers the state again after any restore, one below the apply offset too
    (nameserver/api/logservice.py): the count must have moved by the time the history or offset did."""
    kv = KVState()
    applier = Applier(KVStateMachine(kv), threading.RLock())
    applier.restore_handler = lambda path, index: (index, iter([("k", b"v", index, 1)]), None)
    seen: list[tuple[int, int, int]] = []
    applier.reset_listeners.append(lambda offset: seen.append((applier.restores, applier.history.first_kept,
                                                               applier.apply_offset)))
    applier._restore("snap-a", 9)
    applier._restore("snap-b", 4)  # below the apply offset: the state is replaced all the same
    assert seen == [(1, 10, 0), (2, 5, 9)] and applier.apply_offset == 4 and applier.restores == 2
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warned == ["restored snapshot at offset 4 (digest None); it replaces the state applied here up to 9"]


def test_a_restored_state_is_left_out_of_the_collectors_walks_and_collection_resumes() -> None:
    """raftlog/applier.py frozen_load: what a restore built is frozen (gc.freeze), so no collection walks a
    million-key state again (the first one after the load did, on the way to ready); the collector is on after."""
    import gc

    items = [(f"k{i}", f"v{i}".encode(), i, 1) for i in range(1000)]  # 1,000 distinct items: 1,000 tuples
    kv = KVState()
    applier = Applier(KVStateMachine(kv), threading.RLock())
    applier.restore_handler = lambda path, index: (7, iter(items), None)
    try:
        applier._restore("snap", 7)
        assert gc.isenabled()
        walked = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
        held = kv._values
        assert id(held) not in walked and not any(id(item) in walked for item in held.values())
        assert gc.get_freeze_count() >= len(items)
        gc.disable()  # a process that runs without the collector keeps it off
        applier._restore("snap", 8)
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_each_waiting_proposer_gets_its_own_batch_s_result_and_others_are_left_alone() -> None:
    """An entry of several batches: a proposer waiting for one gets that batch's result at the entry's offset and
    term (applied, or its failed precondition), whatever the others are (waited for, not, without an id)."""
    kv = KVState()
    applier = Applier(KVStateMachine(kv), threading.RLock())
    applier.start()
    try:
        first, third, late = applier.register("a"), applier.register("c"), applier.register("d")
        batches = [entry_pb2.Batch(request_id="a", records=[entry_pb2.Record(type=5, key="kv/ns/a", value=b"1")]),
                   entry_pb2.Batch(request_id="b", records=[entry_pb2.Record(type=5, key="kv/ns/b", value=b"1")]),
                   entry_pb2.Batch(request_id="c", preconditions=[entry_pb2.Precondition(key="kv/ns/a", version=9)],
                                   records=[entry_pb2.Record(type=5, key="kv/ns/c", value=b"1")]),
                   entry_pb2.Batch(records=[entry_pb2.Record(type=5, key="kv/ns/e", value=b"1")])]
        applier.enqueue_entry(4, encode_entry(entry_pb2.Entry(term=7, batches=batches)))
        assert first.event.wait(5) and third.event.wait(5) and applier.wait_applied(4, 5)
        assert first.applied is not None and third.applied is not None
        assert (first.applied.offset, first.applied.term, first.applied.result.applied) == (4, 7, True)
        assert (third.applied.offset, third.applied.term, third.applied.result.applied) == (4, 7, False)
        assert third.applied.result.failed_key == "kv/ns/a" and third.applied.result.failed_key_version == 4
        assert not late.event.is_set() and late.applied is None  # its batch is still to come
        applier.enqueue_entry(5, encode_entry(entry_pb2.Entry(term=7, batches=[entry_pb2.Batch(request_id="d")])))
        assert late.event.wait(5) and late.applied is not None and late.applied.offset == 5
        assert [kv.get(f"kv/ns/{k}") for k in "abce"] == [b"1", b"1", None, b"1"]
    finally:
        applier.stop()


def test_a_proposer_that_stopped_waiting_is_not_woken_and_unregistering_twice_is_harmless() -> None:
    applier = Applier(KVStateMachine(KVState()), threading.RLock())
    applier.start()
    try:
        gone, kept = applier.register("gone"), applier.register("kept")
        applier.unregister("gone")  # its caller timed out before the entry applied
        applier.enqueue_entry(1, encode_entry(entry_pb2.Entry(term=2, batches=[
            entry_pb2.Batch(request_id="gone"), entry_pb2.Batch(request_id="kept")])))
        assert kept.event.wait(5) and kept.applied is not None and kept.applied.offset == 1
        assert applier.wait_applied(1, 5) and not gone.event.is_set() and gone.applied is None
        applier.unregister("kept")  # after the apply took it (the proposer's own cleanup)
        applier.unregister("never")
        assert not applier._waiters
    finally:
        applier.stop()
