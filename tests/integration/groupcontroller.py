"""Controller mode on a sharded test cluster (docs/scaling.md, "Controller mode with groups"): a broker set's
stand-in brokers as RocketMQ 5's ReplicasManager drives them over the controller port (find the leader,
take ids, register, heartbeat, elect, report in-sync replicas), and where each group holds what: the set's
routes in the group the directory names, its controller record in group 0 alone."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import grpc

from nameserver.pb import api_pb2, api_pb2_grpc
from nameserver.remoting import codes
from nameserver.remoting.command import Command
from tests.cluster import Cluster, NodeProc, register_request, retry
from tests.fakebroker import FakeBroker
from tests.integration.groupcores import group_core_channel, own_cluster_info, remoting_answer
from tests.interop.recorder import parse_body
from tests.interop.remoting import call

GET_METADATA, NEXT_ID, APPLY_ID, REGISTER, ELECT, ALTER, REPLICA_INFO = 1005, 1012, 1013, 1003, 1002, 1001, 1004
HEARTBEAT, NOTIFY_ROLE_CHANGED = 904, 1008


def ask(port: str, code: int, ext: dict[str, str], body: bytes = b"", within_s: float = 30.0) -> Command:
    """A controller call, sent again while answered SYSTEM_ERROR or SYSTEM_BUSY (a forward to the leader
    that could not connect: a node's public port opened just after the cluster was ready), as a broker's
    ReplicasManager tries again; a decision of the controller (its own codes) is answered at once."""
    deadline = time.monotonic() + within_s
    while True:
        r = call(port, code, ext, body)
        if r.code not in (codes.SYSTEM_ERROR, codes.SYSTEM_BUSY) or time.monotonic() > deadline:
            return r
        time.sleep(0.2)


class ControllerSet:
    """One broker set of `size` stand-in brokers (FakeBrokers: their addresses take the controller's
    notifications), broker ids 1..size as the controller gives them."""

    def __init__(self, name: str, cluster: str, size: int = 2, timeout_ms: int = 60_000) -> None:
        self.name, self.cluster, self.timeout_ms = name, cluster, timeout_ms
        self.brokers = [FakeBroker(name, cluster=cluster).start() for _ in range(size)]
        self.ids: list[int] = []
        self.silent: set[int] = set()  # broker ids that stopped heartbeating
        self._beating = threading.Event()
        self._thread: threading.Thread | None = None

    def addr(self, broker_id: int) -> str:
        return self.brokers[broker_id - 1].addr

    def claim(self, ports: list[str]) -> None:
        """Each broker takes the next id and registers, the i-th through ports[i % len(ports)] (a follower's
        port forwards to the leader)."""
        for i, broker in enumerate(self.brokers):
            port = ports[i % len(ports)]
            r = ask(port, NEXT_ID, {"clusterName": self.cluster, "brokerName": self.name})
            assert r.code == 0, r.remark
            bid = int(r.ext("nextBrokerId"))
            r = ask(port, APPLY_ID, {"clusterName": self.cluster, "brokerName": self.name,
                                      "appliedBrokerId": str(bid), "registerCheckCode": f"{broker.addr};{bid}"})
            assert r.code == 0, r.remark
            r = ask(port, REGISTER, {"clusterName": self.cluster, "brokerName": self.name, "brokerId": str(bid),
                                      "brokerAddress": broker.addr})
            assert r.code == 0, r.remark
            self.ids.append(bid)

    def heartbeat(self, controllers: list[str]) -> None:
        """Every broker not silent beats every controller it reaches (as ReplicasManager does)."""
        for bid in self.ids:
            if bid in self.silent:
                continue
            for addr in controllers:
                with contextlib.suppress(OSError, AssertionError):  # a controller that is down
                    call(addr, HEARTBEAT, {"clusterName": self.cluster, "brokerName": self.name,
                                           "brokerAddr": self.addr(bid), "brokerId": str(bid), "epoch": "1",
                                           "maxOffset": "1000", "confirmOffset": "1000",
                                           "heartbeatTimeoutMills": str(self.timeout_ms), "electionPriority": "0"},
                         timeout=2)

    def start_beating(self, controllers: list[str], every_s: float = 0.2) -> None:
        """One round of heartbeats now (every controller has heard each broker on return), then every
        `every_s` in a thread until stop()."""
        self.heartbeat(controllers)
        self._beating.set()

        def loop() -> None:
            while self._beating.is_set():
                self.heartbeat(controllers)
                time.sleep(every_s)

        self._thread = threading.Thread(target=loop, name=f"beats-{self.name}", daemon=True)
        self._thread.start()

    def elect(self, port: str, broker_id: int, designate: bool = False) -> tuple[int, dict[str, str], str]:
        r = ask(port, ELECT, {"clusterName": self.cluster, "brokerName": self.name, "brokerId": str(broker_id),
                               "designateElect": str(designate).lower()})
        return r.code, r.ext_fields, r.remark

    def report_in_sync(self, port: str, master: int, master_epoch: int, in_sync: list[int], epoch: int) -> int:
        """The master's ALTER_SYNC_STATE_SET: the new in-sync epoch."""
        body = json.dumps({"syncStateSet": in_sync, "syncStateSetEpoch": epoch}).encode()
        r = ask(port, ALTER, {"brokerName": self.name, "masterBrokerId": str(master),
                               "masterEpoch": str(master_epoch)}, body)
        assert r.code == 0, r.remark
        return int(r.ext("newSyncStateSetEpoch"))

    def replica_info(self, port: str) -> tuple[int, dict[str, str], dict]:
        r = ask(port, REPLICA_INFO, {"brokerName": self.name})
        return r.code, r.ext_fields, json.loads(r.body) if r.body else {}

    def notified(self, broker_id: int) -> list[tuple[str, str]]:
        """(masterBrokerId, masterEpoch) of each NOTIFY_BROKER_ROLE_CHANGED broker `broker_id` got."""
        return [(r.ext("masterBrokerId"), r.ext("masterEpoch")) for r in self.brokers[broker_id - 1].requests
                if r.code == NOTIFY_ROLE_CHANGED]

    def register_routes(self, node: NodeProc, topics: list[str]) -> None:
        """The brokers' NameServer registrations (gRPC, through `node`'s workers: placed by the router), the
        master as id 0 and the others by their controller ids, as RocketMQ 5 brokers in controller mode do."""
        for i, bid in enumerate(self.ids):
            request = register_request(self.cluster, self.name, self.addr(bid), topics, broker_id=0 if i == 0 else bid)
            retry(lambda r=request: node.ns.RegisterBroker(r, timeout=10), timeout=30)

    def stop(self) -> None:
        self._beating.clear()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for broker in self.brokers:
            broker.stop()


def leader_port(cluster: Cluster) -> str:
    """The controller leader's port (group 0's Raft leader's node), as a broker's first step finds it ("":
    no live node names one)."""
    for node in cluster.nodes:
        if not node.alive:
            continue
        with contextlib.suppress(OSError, AssertionError):
            r = call(node.controller_addr, GET_METADATA, timeout=2)
            if r.code == 0 and r.ext("controllerLeaderAddress"):
                return r.ext("controllerLeaderAddress")
    return ""


def held_in(node: NodeProc, group: int, name: str) -> bool:
    """Group `group`'s own state on `node` holds the set's routes."""
    return name in own_cluster_info(node, group).broker_addr_table


def controller_records(node: NodeProc, group: int) -> list[str]:
    """The ctrl/ keys group `group`'s own state on `node` holds (a Watch's initial state on its core)."""
    with group_core_channel(node, group) as channel:
        watch = retry(lambda: api_pb2_grpc.NameServerStub(channel).Watch(
            api_pb2.WatchRequest(key_prefixes=["ctrl/"]), timeout=10))
        first = next(watch)
        watch.cancel()
        assert first.initial_state
        return sorted(e.key for e in first.events)


def controller_service_of(node: NodeProc, group: int) -> grpc.StatusCode | None:
    """What group `group`'s core on `node` answers a controller read with (None: served)."""
    with group_core_channel(node, group) as channel:
        try:
            api_pb2_grpc.ControllerStub(channel).ListBrokerSets(api_pb2.ListBrokerSetsRequest(), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return None


def member_group(node: NodeProc, cluster: str, name: str) -> dict[int, str]:
    """GET_BROKER_MEMBER_GROUP (901) on `node`'s NameServer port: what a controller-mode broker reads of its
    set's NameServer registrations."""
    code, body = remoting_answer(node, codes.GET_BROKER_MEMBER_GROUP, {"clusterName": cluster, "brokerName": name})
    assert code == codes.SUCCESS, body
    return {int(k): v for k, v in parse_body(body)["brokerMemberGroup"]["brokerAddrs"].items()}
