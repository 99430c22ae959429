"""A read-only node over a ReadReplica: what the gRPC read handlers (nameserver/api/service.py) use of a
NameServerNode, so NameServerService(ReplicaNode(...)) serves GetRoute, GetClusterInfo, GetTopicList,
GetKv, ListKv, GetBrokerMemberGroup, GetSettings, serializable binding reads and Watch from the replica.

Reads are the core's own (nameserver/core/reads.py): bounded waits for min_offset, NotReady while the
replica is not ready, the route cache. A linearizable read takes its read index from `read_index` (a
worker's core: nameserver/api/corelink.py) and waits for the replica to reach it. A watch is the core's
(nameserver/core/watch.py: a hub fed by the replica's entries, resumed from its history). Writes are not
served here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from nameserver.config import NodeConfig
from nameserver.core.node import WriteResult, unchanged_in
from nameserver.core.nowait import WouldBlock, waiting_allowed
from nameserver.core.readindex import GIVEN_INDEX
from nameserver.core.reads import LocalReads
from nameserver.core.routecache import RouteCache
from nameserver.core.watch import WatchHub
from nameserver.replica.follower import ReadReplica
from nameserver.state import MetadataState, Translation
from raftlog.proposer import NotLeader


class ReplicaNode(LocalReads):
    def __init__(self, replica: ReadReplica, cfg: NodeConfig,
                 read_index: Callable[[float], int] | None = None) -> None:
        """`read_index(timeout)`: a read index covering every write acknowledged before the call."""
        self.cfg = cfg
        self.read_index = read_index
        self.replica = replica
        self.log = replica  # ready, apply_offset, wait_applied, is_leader()
        self.lock = replica.lock
        self.routes = RouteCache()
        self._waiting_reads = threading.BoundedSemaphore(cfg.max_waiting_reads)
        self.watches = WatchHub(max_watchers=cfg.max_watchers)  # [grpc] max_watchers, per process
        replica.entry_listeners.append(self.watches.on_entry)
        replica.reset_listeners.append(self.watches.on_reset)

    @property
    def state(self) -> MetadataState:  # type: ignore[override]  # read-only here: the follower swaps it
        """The replica's current state: a snapshot install swaps it (under the lock)."""
        return self.replica.state

    def not_ready_reason(self) -> str:
        return self.replica.not_ready_reason() or "replica is ready"

    def unchanged_here(self, translate_fn: Callable[[MetadataState], Translation]) -> WriteResult | None:
        """The answer to a write that would change nothing in the replica (None: it writes, or the replica
        is not ready): a worker answers an unchanged re-registration with it, as a follower's core does
        (nameserver/core/node.py), once its core confirms the broker is still registered there."""
        if not self.replica.ready:
            return None
        with self.lock:
            return unchanged_in(self.state, translate_fn)

    def linearizable_index(self, timeout: float) -> int:
        """The read index of `read_index`; without one a linearizable read is refused UNAVAILABLE with
        this message (as a write to a node without a leader is), never answered stale."""
        if self.read_index is None:
            raise NotLeader("this read replica serves SERIALIZABLE reads only: read LINEARIZABLE from a node")
        given = GIVEN_INDEX.get()
        if given is not None:  # asked for this call already, after it arrived
            return given
        if not waiting_allowed():
            raise WouldBlock("a linearizable read waits for its read index")
        return self.read_index(timeout)
