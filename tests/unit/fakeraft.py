"""A stand-in for the Raft node (raftlog.raftview.RaftView) with plain attributes: pre-vote and the read
index tested without sockets."""

from __future__ import annotations

from typing import Any

from raftlog.raftview import RaftView
from raftlog.roles import Role


class FakeTransport:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, node: str, message: dict[str, Any]) -> None:
        self.sent.append((node, message))


class FakeRaft(RaftView):
    def __init__(self, state: int, term: int, log: list[tuple[bytes, int, int]] | None = None,
                 noop: int | None = None, commit: int = 0) -> None:
        self.state = state
        self.term = term
        self.leader: str | None = "L"
        self.log = log or [(b"", 1, 0)]
        self.noop = noop
        self.raftCommitIndex = commit
        self.others = {"B", "C"}
        self.me: str | None = "A"
        self.transferring = False
        self.transport = FakeTransport()
        self.real_election_deadline = 100.0
        self.wakes = 0

    def role(self) -> Role:
        return Role(self.state)

    def current_term(self) -> int:
        return self.term

    def commit_index(self) -> int:
        return self.raftCommitIndex

    def leader_peer(self) -> str | None:
        return self.leader

    def self_peer(self) -> str | None:
        return self.me

    def other_peers(self) -> set[str]:
        return self.others

    def last_log(self) -> tuple[int, int]:
        return self.log[-1][1], self.log[-1][2]

    def transfer_in_progress(self) -> bool:
        return self.transferring

    def noop_index(self) -> int | None:
        return self.noop

    def send(self, peer: Any, message: dict[str, Any]) -> None:
        self.transport.send(peer, message)

    def wake(self) -> None:
        self.wakes += 1
