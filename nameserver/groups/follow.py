"""A read replica of one group's core on this node, over its private socket (the way a worker follows its
core: nameserver/worker.py), and group 0's state as a group core's translations read it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from nameserver import localfeed
from nameserver.api import corelink
from nameserver.config import NodeConfig, group_config
from nameserver.core.reads import NotReady
from nameserver.replica import ReadReplica
from nameserver.state import MetadataState

T = TypeVar("T")


def follow_core(cfg: NodeConfig, group: int, name: str, accounting: bool = False) -> ReadReplica:
    """A replica (not started) of group `group`'s core on this node, fed over that core's Unix feed
    (nameserver/localfeed.py; its gRPC socket carries the rest); `cfg` is the node's (group 0's).
    `accounting`: keep the digest and quota totals entry by entry (a replica serving reads only does not:
    the core keeps and reports them)."""
    core = group_config(cfg, group)
    opts = [("grpc.max_receive_message_length", cfg.max_message_bytes),
            ("grpc.max_send_message_length", cfg.max_message_bytes)]
    return ReadReplica(corelink.target(core), lambda target: corelink.own_channel(core, opts), name=name,
                       accounting=accounting,
                       feed=localfeed.LocalFeed(localfeed.socket_path(core.data_dir), cfg.max_message_bytes))


class Group0View:
    """A group core's read of group 0's state (NameServerNode.group0): `fn(state)` under the replica's
    lock; NotReady (UNAVAILABLE: the broker retries) until the replica has loaded."""

    def __init__(self, replica: ReadReplica) -> None:
        self.replica = replica

    def __call__(self, fn: Callable[[MetadataState], Any]) -> Any:
        if not self.replica.ready:
            raise NotReady(f"group 0's replica on this node: {self.replica.not_ready_reason()}")
        with self.replica.lock:
            return fn(self.replica.state)
