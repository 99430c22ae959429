"""The leader's election scan: a broker set whose master stopped heartbeating gets a new master.

Every [controller] scan_interval_ms, on the Raft leader only, each set whose master is silent past its
heartbeat timeout while another of its brokers still heartbeats is put to an election by policy
(CONTROLLER_ELECT_MASTER with no broker id, as Apache RocketMQ's controller triggers it): the best live
in-sync replica becomes master, both epochs move, and the set's brokers are told. When no in-sync
replica is alive, the set is recorded as having no master (and its epoch moves), unless unclean
elections are allowed. Each election is an ordinary controller write, so it is linearizable and fenced.
"""

from __future__ import annotations

import logging
from typing import Any

from nameserver.controller.heartbeats import HeartbeatTable
from nameserver.core.leaderduties import LeaderDuties
from nameserver.core.node import NameServerNode
from nameserver.pb import api_pb2
from nameserver.safetext import shown
from nameserver.state import controller as decide

log = logging.getLogger("nameserver.controller")


class ElectionScan:
    def __init__(self, node: NameServerNode, controller: Any, heartbeats: HeartbeatTable, interval_s: float) -> None:
        self.node = node
        self.controller = controller  # the Controller service, stub-style (nameserver/api/inprocess.py)
        self.heartbeats = heartbeats
        self.interval_s = interval_s
        self.elections = 0

    def add_to(self, duties: LeaderDuties) -> None:
        """Run as the node's duties: elections on the leader, heartbeat expiry on every node."""
        duties.add("controller-elections", self.interval_s, self.scan_once)
        duties.add("controller-heartbeat-expiry", self.interval_s, self.heartbeats.expire, leader_only=False)

    def scan_once(self) -> list[str]:
        """Elect where a master went silent; returns the sets put to an election."""
        if not self.node.log.is_leader() or not self.node.log.ready:
            return []
        names, _ = self.node.read(lambda s: decide.needs_election(s, self.heartbeats), 0, self.interval_s)
        for name in names:
            reply = self.controller.ElectMaster(api_pb2.ElectMasterRequest(broker_name=name,
                                                                           broker_id=decide.NO_BROKER),
                                                timeout=max(1.0, self.interval_s * 5))
            self.elections += 1
            if reply.code == decide.SUCCESS:
                log.warning("controller: broker set %s's master went silent; elected broker %d (%s) at master "
                            "epoch %d", shown(name), reply.set.master_id, shown(reply.set.master_address),
                            reply.set.master_epoch)
            else:
                log.warning("controller: broker set %s's master went silent and none was elected: %s", shown(name),
                            shown(reply.remark))
        return names
