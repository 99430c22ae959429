"""What pre-vote (prevote.py) and the read index (leadership.py) read of the Raft node, typed.

`raftlog.binding.RaftNode` implements it over pysyncobj's private fields (the one place that names them);
the unit tests implement it with plain attributes. A peer is pysyncobj's node object (hashable, compared
by identity of address), opaque here.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable
from typing import Any, Protocol

from raftlog.roles import Role

Peer = Hashable


class RaftView(Protocol):
    real_election_deadline: float  # the election timer pysyncobj set; the binding hides it behind may_campaign()

    def role(self) -> Role: ...

    def current_term(self) -> int: ...

    def commit_index(self) -> int: ...

    def leader_peer(self) -> Peer | None:
        """The leader this node follows (None when none is known)."""
        ...

    def self_peer(self) -> Peer | None:
        """This node (None before pysyncobj bound its address)."""
        ...

    def other_peers(self) -> Collection[Peer]: ...

    def last_log(self) -> tuple[int, int]:
        """(index, term) of the last entry of the Raft log (never empty: pysyncobj keeps one)."""
        ...

    def transfer_in_progress(self) -> bool:
        """The leader's TimeoutNow arrived: campaign now."""
        ...

    def noop_index(self) -> int | None:
        """The index of this leader's first (no-op) entry of its term (None before it appended one)."""
        ...

    def send(self, peer: Peer, message: dict[str, Any]) -> None:
        """Send a message over the Raft link (pysyncobj's transport; delivery not guaranteed)."""
        ...

    def wake(self) -> None:
        """Wake the tick thread out of its poll."""
        ...


__all__ = ["Peer", "RaftView"]
