"""NOTIFY_MIN_BROKER_ID_CHANGE (905): a broker set's members are told when the set's lowest broker id changes.

As Apache RocketMQ 5's RouteInfoManager does while NamesrvConfig's notifyMinBrokerIdChanged is on (here a
replicated setting, off by default as there):
- a broker registers with an id below the set's lowest: the set's other members are told, with the
  newcomer's HA address (registerBroker);
- the lowest-id broker leaves (unregistration, expiry, closed connections) and others remain, in a set
  whose brokers register with enableActingMaster: the remaining members are told, with the address that
  left (unRegisterBroker).
The header is stock's NotifyMinBrokerIdChangeRequestHeader as stock fills it: minBrokerId,
minBrokerAddr, offlineBrokerAddr, haBrokerAddr (brokerName stays unset there too).

Every node applies the change; a node tells only the members whose remoting connection it holds (they
registered or heartbeat through it), so a broker hears once from each node it is connected to, as from
each stock NameServer it registers with. A starting node holds no connection (its port opens once it
is ready), so replaying its log tells no one. The request goes to the broker's own address, as stock's
invokeOneway(brokerAddr): a broker serves 905 on its listening port, not on its connection to us.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from nameserver.pb import state_pb2
from nameserver.remoting import codes
from nameserver.remoting.command import Command
from nameserver.remoting.oneway import OnewaySender
from nameserver.safetext import shown
from nameserver.state import keys, settings

log = logging.getLogger("nameserver.remoting.minbroker")


@dataclass(frozen=True)
class MinIdChange:
    min_id: int
    min_addr: str
    offline_addr: str  # the lowest-id broker that left; "" when a lower id registered
    recipients: tuple[str, ...]


def min_id_change(old: state_pb2.BrokerData | None, new: state_pb2.BrokerData | None) -> MinIdChange | None:
    """Stock's rule for one change of a set's BrokerData: what to tell whom, or None."""
    before = {a.broker_id: a.addr for a in old.addrs} if old is not None else {}
    after = {a.broker_id: a.addr for a in new.addrs} if new is not None else {}
    if not before or not after:  # a set that appears or disappears: nobody to tell
        return None
    low, now = min(before), min(after)
    if now < low:
        # chooseBrokerAddrsToNotify: the others, or the one member when it is alone
        others = tuple(addr for bid, addr in sorted(after.items()) if bid != now)
        return MinIdChange(now, after[now], "", others or (after[now],))
    if low not in after and new is not None and new.enable_acting_master:
        return MinIdChange(now, after[now], before[low], tuple(addr for _, addr in sorted(after.items())))
    return None


def notice(change: MinIdChange, ha_addr: str) -> Command:
    fields = {"minBrokerId": str(change.min_id), "minBrokerAddr": change.min_addr}
    if change.offline_addr:
        fields["offlineBrokerAddr"] = change.offline_addr
    if ha_addr:
        fields["haBrokerAddr"] = ha_addr
    return Command(code=codes.NOTIFY_MIN_BROKER_ID_CHANGE, version=codes.SERVER_VERSION, flag=codes.FLAG_ONEWAY,
                   ext_fields=fields)


def _broker_data(raw: bytes | None) -> state_pb2.BrokerData | None:
    return None if raw is None else state_pb2.BrokerData.FromString(raw)


# One applied key change as the log's change feed carries it, (offset, type, key, old, new): raftlog.kvstate.Change's
# layout (this adapter reaches the node only through what it is given: no raftlog import).
KeyChange = tuple[int, int, str, bytes | None, bytes | None]


class Registry(Protocol):
    """What is read of the node's state (MetadataState)."""

    def setting_on(self, name: str, default: bool) -> bool: ...

    def broker_live(self, broker_addr: str) -> state_pb2.BrokerLive | None: ...


class MinBrokerIdNotifier:
    """Fed each applied entry's changes by the node (nameserver/server.py); `holds(addr)`: this node
    holds that broker's connection (Handlers.holds)."""

    def __init__(self, holds: Callable[[str], bool]) -> None:
        self._holds = holds
        self._sender = OnewaySender(log, "min-broker-id")

    def stop(self) -> None:
        self._sender.stop()

    def on_changes(self, changes: Iterable[KeyChange], state: Registry) -> None:
        """On the apply thread, after the entry (`state` is read here without its lock: this thread is its
        only writer): decode only broker-set changes; send off this thread. A change is read by position, as
        the log's change feed carries it (raftlog/kvstate.py Change)."""
        for _offset, rtype, key, old, new in changes:
            if rtype != keys.BROKER_TYPE:
                continue
            if not state.setting_on(settings.NOTIFY_MIN_BROKER_ID_CHANGED, False):
                return
            found = min_id_change(_broker_data(old), _broker_data(new))
            if found is None:
                continue
            recipients = [addr for addr in found.recipients if self._holds(addr)]
            if not recipients:
                continue
            live = None if found.offline_addr else state.broker_live(found.min_addr)
            cmd = notice(found, live.ha_server_addr if live is not None else "")
            what = (f"broker set {shown(key[len(keys.BROKER_PREFIX):])}'s lowest broker id {found.min_id} "
                    f"({shown(found.min_addr)})" + (f", {shown(found.offline_addr)} left" if found.offline_addr
                                                    else ""))
            for addr in recipients:
                self._sender.send(addr, cmd, what)
