"""Sharding's directory: which Raft group holds each broker set's records (docs/scaling.md, "Sharding").

The directory is group 0's `shard/<brokerName>` records (ShardSet). A set is named by its broker name
alone, not (cluster, broker name): the state already names a set so (`broker/<name>`, `topic/<t>/<name>`,
`ctrl/<name>`), and one group's state holds one BrokerData per name whatever cluster registered it last;
keying the directory by name keeps a sharded fleet's answers equal to one group's for such a fleet too.

A set with no record is group 0's: every set of a cluster that ran with one group stays where it is when
groups are added, and a one-group cluster writes no directory record at all.
"""

from __future__ import annotations

import hashlib

from nameserver.pb import state_pb2

GROUP0 = 0  # the group holding the directory and every record of no broker set (KV, settings, bindings)


def default_group(broker_name: str, groups: int) -> int:
    """The group a new set goes to when no operator chose one: rendezvous hashing (the group whose hash
    with the name is highest), stable across processes and versions (not Python's salted hash), and
    adding a group moves only the sets whose new default is the added group."""
    if groups < 1:
        raise ValueError(f"groups must be at least 1: {groups}")
    name = broker_name.encode("utf-8", "surrogatepass")
    return max(range(groups), key=lambda group: _weight(name, group))


def _weight(name: bytes, group: int) -> bytes:
    return hashlib.blake2b(name, digest_size=8, salt=group.to_bytes(16, "big")).digest()


class Directory:
    """Group 0's directory as an index (MetadataState keeps it from the shard/ records). Not thread-safe:
    the state's owner serializes access, as for every other index."""

    def __init__(self) -> None:
        self._sets: dict[str, state_pb2.ShardSet] = {}
        self._floor: dict[int, int] | None = {}  # None: computed again on the next read

    def set(self, broker_name: str, value: state_pb2.ShardSet | None) -> None:
        if value is None:
            self._sets.pop(broker_name, None)
        else:
            self._sets[broker_name] = value
        self._floor = None

    def __len__(self) -> int:
        return len(self._sets)

    def names(self) -> list[str]:
        return sorted(self._sets)

    def entry(self, broker_name: str) -> state_pb2.ShardSet | None:
        """A copy of the set's record (None: no record, the set is group 0's)."""
        found = self._sets.get(broker_name)
        if found is None:
            return None
        copy = state_pb2.ShardSet()
        copy.CopyFrom(found)
        return copy

    def assigned(self, broker_name: str) -> bool:
        return broker_name in self._sets

    def group_of(self, broker_name: str) -> int:
        """The group holding the set's records: where its writes go and its route is read from (while it
        moves, still the group it leaves: the target's copy is read only once the move is done)."""
        found = self._sets.get(broker_name)
        return GROUP0 if found is None else found.group

    def moving_to(self, broker_name: str) -> int | None:
        """The group the set is moving to, or None when it is not moving."""
        found = self._sets.get(broker_name)
        return found.moving_to if found is not None and found.HasField("moving_to") else None

    def entry_since(self, broker_name: str) -> int:
        """The offset in its group where the set's last move's copy applied (0: it never moved)."""
        found = self._sets.get(broker_name)
        return found.since if found is not None else 0

    def floor(self) -> dict[int, int]:
        """group -> the offset a replica of that group must have applied before a read merges it with this
        directory (the highest `since` of the sets it received by a move): a worker whose directory says a
        set moved reads the set's copy only once its replica of the new group holds the copy."""
        if self._floor is None:
            floor: dict[int, int] = {}
            for value in self._sets.values():
                if value.since > floor.get(value.group, 0):
                    floor[value.group] = value.since
            self._floor = floor
        return dict(self._floor)
