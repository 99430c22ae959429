"""A large entry sent in pieces (raftlog/chunkedappend.py): its last piece reaches pysyncobj's follower as an
ordinary append, which keeps the entries the follower holds; a piece wrongly labelled last waits for the rest.

The in-process cases run three real pysyncobj nodes (tests/unit/test_raftlog_inprocess.py's trio)."""

from __future__ import annotations

import logging
import random

import pysyncobj.pickle

from raftlog.appendfilter import skip_known_entries
from raftlog.chunkedappend import whole_transmission
from raftlog.pb import entry_pb2
from tests.unit.test_raftlog_inprocess import leader_of, put, trio, wait_for
from tests.unit.test_replysafety import on_tick

__all__ = ["trio"]  # the fixture, shared with test_raftlog_inprocess.py

PIECE = 2 ** 16  # pysyncobj's appendEntriesBatchSizeBytes (its default; we do not set it): the chunk size


def pieces(entry: tuple[bytes, int, int], prev: int, prev_term: int, term: int) -> list[dict]:
    """The messages pysyncobj's leader sends for `entry` (syncobj.py, __sendAppendEntries), labels included."""
    data = pysyncobj.pickle.dumps(entry)
    out = []
    for pos in range(0, len(data), PIECE):
        label = "start" if pos == 0 else "finish" if pos + PIECE >= len(entry[0]) else "process"
        out.append({"type": "append_entries", "transmission": label, "data": data[pos:pos + PIECE], "term": term,
                    "commit_index": 3, "prevLogIdx": prev, "prevLogTerm": prev_term})
    return out


def follower_sees(messages: list[dict]) -> list[dict]:
    """What the binding hands pysyncobj for each piece, with pysyncobj's buffer kept as it keeps it."""
    received: bytes | str = ""
    seen = []
    for m in messages:
        out = whole_transmission(m, received, pysyncobj.pickle.loads)
        seen.append(out)
        label = out.get("transmission")
        received = m["data"] if label == "start" else received + m["data"] if label == "process" else b""
    return seen


def test_the_last_piece_becomes_the_ordinary_append_of_its_entry() -> None:
    entry = (b"v" * 100_000, 11, 3)
    seen = follower_sees(pieces(entry, 10, 3, 3))
    assert [m.get("transmission") for m in seen] == ["start", None]
    last = seen[-1]
    assert last["entries"] == [entry] and "data" not in last
    assert (last["prevLogIdx"], last["prevLogTerm"], last["term"], last["commit_index"]) == (10, 3, 3, 3)
    # the append filter then keeps what the follower holds: 11 (this entry) and 12, 13 after it
    terms = {i: 3 for i in range(1, 14)}
    kept = skip_known_entries(last, 13, 3, terms.get)
    assert (kept.message["prevLogIdx"], kept.message["entries"], kept.acked_through) == (13, [], None)


def test_a_piece_labelled_last_before_the_end_is_a_middle_piece() -> None:
    """pysyncobj labels finish every piece from the end of the command on; the pickle of bytes from 0x80 is
    longer (two bytes each), so a 100 KB random entry goes as start, finish, finish."""
    entry = (random.Random(7).randbytes(100_000), 11, 3)
    sent = pieces(entry, 10, 3, 3)
    assert [m["transmission"] for m in sent] == ["start", "finish", "finish"]
    seen = follower_sees(sent)
    assert [m.get("transmission") for m in seen] == ["start", "process", None]
    assert seen[-1]["entries"] == [entry]


def test_other_messages_pass_unchanged() -> None:
    for m in ({"type": "append_entries", "term": 3, "commit_index": 1, "prevLogIdx": 4, "prevLogTerm": 3,
               "entries": []},
              pieces((b"v" * 70_000, 5, 3), 4, 3, 3)[0],
              {"type": "append_entries", "term": 3, "commit_index": 1, "serialized": (b"x", True, True)},
              {"type": "next_node_idx", "next_node_idx": 4, "reset": False, "success": True}):
        assert whole_transmission(m, b"", pysyncobj.pickle.loads) is m
    no_start = pieces((b"v" * 70_000, 5, 3), 4, 3, 3)[-1]
    assert whole_transmission(no_start, "", pysyncobj.pickle.loads) is no_start  # pysyncobj's buffer when empty


def _resend_large_entry(trio, big: int) -> tuple[list[tuple[str, int, int]], object, object] | None:
    """One try: a stale refusal for the large entry `big` made on the leader for a follower; the pieces the
    follower then receives, each with its last index before and after, once one labelled finish arrived
    (None if none did within 8 s). Also the leader's raft and its peer object for that follower."""
    leader = leader_of(trio)
    follower = next(n for n in trio if n is not leader)
    lraft, raft = leader.log.raft, follower.log.raft
    top = lraft.last_log_index()
    wait_for(lambda: raft.last_log_index() == top)
    assert len(lraft._SyncObj__raftLog[big - lraft._SyncObj__raftLog[0][1]][0]) >= PIECE  # it goes in pieces

    transport = raft._SyncObj__transport
    receive = transport._onMessageReceivedCallback
    cuts: list[tuple[str, int, int]] = []

    def record(node, message):
        before = raft.last_log_index()
        receive(node, message)
        if isinstance(message, dict) and message.get("transmission") is not None:
            cuts.append((message["transmission"], before, raft.last_log_index()))

    on_tick(raft, lambda: transport.setOnMessageReceivedCallback(record))
    to_follower = next(p for p in lraft.other_peers() if p.id == follower.addr)
    lreceive = lraft._SyncObj__transport._onMessageReceivedCallback
    # the refusal of an append sent before the follower had the large entry, arriving late
    on_tick(lraft, lambda: lreceive(to_follower, {"type": "next_node_idx", "next_node_idx": big, "reset": True,
                                                   "success": False, "term": lraft.current_term()}))
    try:
        wait_for(lambda: any(label == "finish" for label, _, _ in cuts), timeout=8)
    except AssertionError:
        on_tick(raft, lambda: transport.setOnMessageReceivedCallback(receive))
        return None
    return cuts, lraft, to_follower


def test_a_large_entry_sent_again_keeps_the_entries_after_it(trio) -> None:
    """A follower holds a large entry and entries after it; a stale refusal moves the leader's next index
    for it back to the large entry, which the leader sends again in pieces. pysyncobj's follower cut its
    log after the entry's previous index on the last piece: entries it had acknowledged, gone.

    On a loaded machine the resend can be lost (a leader change, a link dropped mid-transfer: the leader's
    next index is past the entry again and it never resends it); the refusal is then made again, up to
    three times, so the test waits for a resend that reached its last piece rather than for one tick."""
    leader = leader_of(trio)
    big = leader.log.propose(entry_pb2.Batch(records=[entry_pb2.Record(type=1, key="big", value=b"v" * 70_000)]),
                             timeout=10).offset
    for i in range(3):
        leader.log.propose(put(f"after/{i}", "v"), timeout=10)
    tried = next((t for t in (_resend_large_entry(trio, big) for _ in range(3)) if t is not None), None)
    assert tried is not None, "the leader never sent the large entry again to its last piece"
    cuts, lraft, to_follower = tried
    assert all(after == before for _, before, after in cuts), f"the follower's log was cut: {cuts}"
    wait_for(lambda: not lraft.probe_gate.probing(to_follower))  # its answer was a success


def test_a_large_random_entry_commits_on_every_node(trio, caplog) -> None:
    """pysyncobj's leader labelled two pieces of such an entry finish: its probe gate let only the first
    through (the follower never got the rest, so the write never committed), and the follower's decode of
    the truncated first failed its tick."""
    leader = leader_of(trio)
    value = random.Random(11).randbytes(100_000)
    with caplog.at_level(logging.ERROR, logger="pysyncobj"):
        offset = leader.log.propose(entry_pb2.Batch(records=[entry_pb2.Record(type=1, key="big", value=value)]),
                                    timeout=10).offset
        wait_for(lambda: all(n.log.apply_offset >= offset for n in trio))
    assert all(n.kv.get("big") == value for n in trio)
    assert not [r for r in caplog.records if r.name.startswith("pysyncobj")], "a follower's tick failed"
