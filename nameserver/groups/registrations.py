"""A sharded worker's answer to an unchanged re-registration of a group k set (k > 0), from its replicas:
the decision group k's core would make (the set's state in group k, group 0's settings and order-topic KV:
translate.register_broker's `group0`), for corechannel.UnchangedRegistrations on group k's channel, which
then notes the broker's liveness at group k's core as group 0's channel notes it at group 0's. A stock
broker re-registers every 30 s, mostly unchanged: with this a set of any group costs its core a note, not a
registration. Group 0's sets are decided by the worker's service over group 0's replica, as with one group.
"""

from __future__ import annotations

from collections.abc import Sequence

from nameserver.api.service import register_reply
from nameserver.core.node import unchanged_in
from nameserver.pb import api_pb2
from nameserver.replica import ReadReplica
from nameserver.state import translate


class GroupRegistrations:
    """`unchanged_registration` for the sets of `group` (> 0), over `replicas` (replicas[k]: group k's)."""

    def __init__(self, replicas: Sequence[ReadReplica], group: int, default_timeout_ms: int) -> None:
        assert group > 0, "group 0's sets are decided over group 0's replica alone"
        self.group0 = replicas[0]
        self.replica = replicas[group]
        self.group = group
        self.default_timeout_ms = default_timeout_ms

    def unchanged_registration(self, request: api_pb2.RegisterBrokerRequest) -> api_pb2.RegisterBrokerReply | None:
        """The reply to a (validated) registration that changes nothing in group `group`'s replica, or None
        (it writes, a replica is not ready, or the directory no longer places the set in this group: a
        move): the core is asked. Both locks in group order, as a merged read takes them (no cycle)."""
        if not (self.group0.ready and self.replica.ready):
            return None
        name = request.broker_name
        with self.group0.lock, self.replica.lock:
            group0 = self.group0.state
            if group0.directory.group_of(name) != self.group or group0.directory.moving_to(name) is not None:
                return None
            unchanged = unchanged_in(self.replica.state, lambda state: translate.register_broker(
                state, request, self.default_timeout_ms, group0=group0))
        return None if unchanged is None else register_reply(unchanged)
