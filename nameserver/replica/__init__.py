"""Read replicas: a node's state kept current from a core's Log.Follow stream, and a read-only node over
it that the gRPC read handlers serve from (docs/architecture.md, "Read replicas").

Light on purpose: the names below are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nameserver.replica.follower import ReadReplica
    from nameserver.replica.node import ReplicaNode

__all__ = ["ReadReplica", "ReplicaNode"]


def __getattr__(name: str) -> Any:
    if name == "ReadReplica":
        from nameserver.replica.follower import ReadReplica
        return ReadReplica
    if name == "ReplicaNode":
        from nameserver.replica.node import ReplicaNode
        return ReplicaNode
    raise AttributeError(name)
