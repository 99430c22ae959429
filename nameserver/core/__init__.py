"""The node's core: the state machine on the replicated log, the write path, reads at an offset, the one path
to the leader, the leader's duties, liveness, sessions and watches. No gRPC service lives here (nameserver/api)
and nothing here knows a wire protocol; the forwarder is the one place the core opens a channel (to its peers)."""

from nameserver.core.forwarder import LeaderForwarder, NoLeader
from nameserver.core.leaderduties import LeaderDuties
from nameserver.core.node import (
    ClientRef,
    MembershipError,
    NameServerNode,
    NotReady,
    OffsetNotReached,
    SessionSuperseded,
    WriteResult,
)
from nameserver.core.nowait import WouldBlock, no_wait

__all__ = ["ClientRef", "LeaderDuties", "LeaderForwarder", "MembershipError", "NameServerNode", "NoLeader",
           "NotReady", "OffsetNotReached", "SessionSuperseded", "WouldBlock", "WriteResult", "no_wait"]
