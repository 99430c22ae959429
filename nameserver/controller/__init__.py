"""Controller mode (RIP-44): RocketMQ 5's broker-set master election served from this Raft log.

The decisions are pure (nameserver/state/controller.py); this package holds what runs around them on a
node: the heartbeat table, the gRPC Controller service, the leader's election scan and the notifier.
The controller's remoting port is nameserver/remoting/controller.py. docs/controller.md tells the story.
"""

from nameserver.controller.elector import ElectionScan
from nameserver.controller.heartbeats import HeartbeatTable
from nameserver.controller.notify import RoleChangeNotifier
from nameserver.controller.service import ControllerService

__all__ = ["ControllerService", "ElectionScan", "HeartbeatTable", "RoleChangeNotifier"]
