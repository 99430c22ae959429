"""A node's Raft role: pysyncobj's _RAFT_STATE values, named in this one place."""

from __future__ import annotations

from enum import IntEnum


class Role(IntEnum):
    FOLLOWER = 0
    CANDIDATE = 1
    LEADER = 2
