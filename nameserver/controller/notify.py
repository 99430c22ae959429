"""NOTIFY_BROKER_ROLE_CHANGED: the leader tells a set's live brokers of the master it just elected.

A oneway remoting request to each broker's own address (the one it registered), as Apache RocketMQ's
controller sends it (ControllerManager.notifyBrokerRoleChanged). Best effort: a broker that misses it
learns the new master from its next CONTROLLER_GET_REPLICA_INFO poll (every few seconds).
"""

from __future__ import annotations

import logging
import socket
from concurrent.futures import ThreadPoolExecutor

from nameserver.pb import api_pb2
from nameserver.remoting import codes, frame
from nameserver.remoting.command import Command
from nameserver.remoting.controller import sync_state_set_body
from nameserver.remoting.server import split_addr
from nameserver.safetext import shown

log = logging.getLogger("nameserver.controller")

SEND_TIMEOUT_S = 3.0


def role_change(view: api_pb2.BrokerSetView) -> Command:
    return Command(code=codes.NOTIFY_BROKER_ROLE_CHANGED, version=codes.SERVER_VERSION, flag=codes.FLAG_ONEWAY,
                   ext_fields={"masterAddress": view.master_address, "masterBrokerId": str(view.master_id),
                               "masterEpoch": str(view.master_epoch),
                               "syncStateSetEpoch": str(view.sync_state_set_epoch)},
                   body=sync_state_set_body(view))


def send_oneway(addr: str, cmd: Command, timeout_s: float = SEND_TIMEOUT_S) -> None:
    with socket.create_connection(split_addr(addr), timeout=timeout_s) as sock:
        sock.sendall(frame.encode(cmd))


class RoleChangeNotifier:
    def __init__(self, workers: int = 2) -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="controller-notify")
        self.sent = 0
        self.failed = 0

    def __call__(self, view: api_pb2.BrokerSetView) -> None:
        """Notify every live broker of the set (off the caller's thread)."""
        if not view.master_id:
            return
        cmd = role_change(view)
        for replica in view.replicas:
            if replica.alive and replica.address:
                self._pool.submit(self._send, replica.address, cmd, view)

    def _send(self, addr: str, cmd: Command, view: api_pb2.BrokerSetView) -> None:
        try:
            send_oneway(addr, cmd)
            self.sent += 1
            log.info("controller: told %s of broker set %s: master %d (%s) at epoch %d", shown(addr),
                     shown(view.broker_name), view.master_id, shown(view.master_address), view.master_epoch)
        except OSError as exc:
            self.failed += 1
            log.info("controller: could not tell %s of broker set %s's new master: %s", shown(addr),
                     shown(view.broker_name), exc)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
