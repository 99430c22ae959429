"""Read index by heartbeat round, against a stand-in for pysyncobj's private state (no sockets)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from raftlog.leadership import ANSWER, LEADER, PING, LeadershipConfirmer, NotConfirmed

FOLLOWER = 0


class FakeTransport:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, node: str, message: dict[str, Any]) -> None:
        self.sent.append((node, message))


class FakeRaft:
    def __init__(self, state: int = LEADER) -> None:
        self._SyncObj__raftState = state
        self._SyncObj__raftCurrentTerm = 7
        self._SyncObj__raftLeader = "L"
        self._SyncObj__noopIDx = 40
        self._SyncObj__otherNodes = {"B", "C"}
        self._SyncObj__selfNode = "A"
        self._SyncObj__transport = FakeTransport()
        self.raftCommitIndex = 42

    def private(self, name: str) -> Any:  # as raftlog.binding.RaftNode.private
        return getattr(self, f"_SyncObj__{name}")

    def wake(self) -> None:
        pass


def ask_in_background(c: LeadershipConfirmer) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["index"] = c.read_index(5)
        except NotConfirmed as exc:
            out["error"] = str(exc)

    t = threading.Thread(target=run)
    t.start()
    while c._queue.empty():
        pass
    return t, out


def test_a_majority_of_yes_confirms_the_commit_index_at_the_time_of_the_ping() -> None:
    raft = FakeRaft()
    c = LeadershipConfirmer(raft)
    t, out = ask_in_background(c)
    c.on_tick()
    pings = raft._SyncObj__transport.sent
    assert sorted(n for n, _ in pings) == ["B", "C"] and pings[0][1]["type"] == PING
    rid = pings[0][1]["id"]
    raft.raftCommitIndex = 50  # commits after the ping do not change this round's index
    c.on_message("B", {"type": ANSWER, "id": rid, "term": 7, "yes": False})
    c.on_message("C", {"type": ANSWER, "id": rid, "term": 6, "yes": True})  # another term: not counted
    assert t.is_alive()
    c.on_message("C", {"type": ANSWER, "id": rid, "term": 7, "yes": True})
    t.join(5)
    assert out == {"index": 42}


@pytest.mark.parametrize("change", ["follower", "no commit this term"])
def test_no_confirmation_without_leadership_or_a_commit_of_this_term(change: str) -> None:
    raft = FakeRaft()
    if change == "follower":
        raft._SyncObj__raftState = FOLLOWER
    else:
        raft.raftCommitIndex = 39
    c = LeadershipConfirmer(raft)
    t, out = ask_in_background(c)
    c.on_tick()
    t.join(5)
    assert "error" in out and raft._SyncObj__transport.sent == []


def test_losing_leadership_fails_the_rounds_in_flight() -> None:
    raft = FakeRaft()
    c = LeadershipConfirmer(raft)
    t, out = ask_in_background(c)
    c.on_tick()
    raft._SyncObj__raftCurrentTerm = 8  # a newer term began
    raft._SyncObj__raftState = FOLLOWER
    c.on_tick()
    t.join(5)
    assert "leadership lost" in out["error"]


def test_a_follower_says_yes_only_to_its_leader_in_its_term() -> None:
    raft = FakeRaft(state=FOLLOWER)
    c = LeadershipConfirmer(raft)
    sent = raft._SyncObj__transport.sent
    assert c.on_message("L", {"type": PING, "id": 3, "term": 7})
    assert c.on_message("X", {"type": PING, "id": 4, "term": 7})  # not our leader
    assert c.on_message("L", {"type": PING, "id": 5, "term": 6})  # an old term
    assert [(n, m["id"], m["yes"]) for n, m in sent] == [("L", 3, True), ("X", 4, False), ("L", 5, False)]
    assert not c.on_message("L", {"type": "append_entries", "term": 7})  # passed on to pysyncobj
