"""NOTIFY_BROKER_ROLE_CHANGED: the leader tells a set's live brokers of the master it just elected.

A oneway remoting request to each broker's own address (the one it registered), as Apache RocketMQ's
controller sends it (ControllerManager.notifyBrokerRoleChanged; nameserver/remoting/oneway.py). Best
effort: a broker that misses it learns the new master from its next CONTROLLER_GET_REPLICA_INFO poll
(every few seconds).
"""

from __future__ import annotations

import logging

from nameserver.pb import api_pb2
from nameserver.remoting import codes
from nameserver.remoting.command import Command
from nameserver.remoting.controller import sync_state_set_body
from nameserver.remoting.oneway import OnewaySender
from nameserver.safetext import shown

log = logging.getLogger("nameserver.controller")


def role_change(view: api_pb2.BrokerSetView) -> Command:
    return Command(code=codes.NOTIFY_BROKER_ROLE_CHANGED, version=codes.SERVER_VERSION, flag=codes.FLAG_ONEWAY,
                   ext_fields={"masterAddress": view.master_address, "masterBrokerId": str(view.master_id),
                               "masterEpoch": str(view.master_epoch),
                               "syncStateSetEpoch": str(view.sync_state_set_epoch)},
                   body=sync_state_set_body(view))


class RoleChangeNotifier:
    def __init__(self, workers: int = 2) -> None:
        self._sender = OnewaySender(log, "controller-notify", workers)

    def __call__(self, view: api_pb2.BrokerSetView) -> None:
        """Notify every live broker of the set (off the caller's thread)."""
        if not view.master_id:
            return
        cmd = role_change(view)
        what = (f"broker set {shown(view.broker_name)}'s master {view.master_id} ({shown(view.master_address)}) "
                f"at epoch {view.master_epoch}")
        for replica in view.replicas:
            if replica.alive and replica.address:
                self._sender.send(replica.address, cmd, what)

    def stop(self) -> None:
        self._sender.stop()
