"""The controller's heartbeat table: liveness by each broker's own timeout, the start-up grace, ranks."""

from __future__ import annotations

from nameserver.controller.heartbeats import HeartbeatTable
from nameserver.pb import api_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beat(broker_id: int, timeout_ms: int = 0, epoch: int = 1, offset: int = 10, priority: int = 0
         ) -> api_pb2.ControllerHeartbeatRequest:
    return api_pb2.ControllerHeartbeatRequest(cluster_name="c", broker_name="b", broker_address=f"10.0.0.{broker_id}:1",
                                              broker_id=broker_id, epoch=epoch, max_offset=offset,
                                              election_priority=priority, timeout_ms=timeout_ms)


def test_a_broker_is_alive_for_its_own_timeout_after_each_heartbeat() -> None:
    clock = Clock()
    table = HeartbeatTable(clock, default_timeout_s=10)
    clock.now += 11  # past the start-up grace
    table.beat(beat(1, timeout_ms=2000))
    table.beat(beat(2))  # names no timeout: the default
    clock.now += 1.9
    assert table.alive("b", 1) and table.alive("b", 2)
    clock.now += 0.2
    assert not table.alive("b", 1) and table.alive("b", 2)
    table.beat(beat(1, timeout_ms=2000))
    assert table.alive("b", 1)
    assert not table.alive("b", 3) and not table.alive("other", 1)  # never heard of, after the grace


def test_a_node_that_just_started_gives_unknown_brokers_the_benefit_of_the_doubt() -> None:
    clock = Clock()
    table = HeartbeatTable(clock, default_timeout_s=10)
    assert table.alive("b", 7)  # it may well be heartbeating to the others: not yet a reason to elect
    clock.now += 10.01
    assert not table.alive("b", 7)


def test_rank_forget_and_expiry() -> None:
    clock = Clock()
    table = HeartbeatTable(clock, default_timeout_s=10)
    table.beat(beat(1, epoch=3, offset=500, priority=2))
    assert table.rank("b", 1) == (3, 500, 2) and table.rank("b", 2) is None
    table.beat(beat(2))
    table.forget("b", [1])
    assert table.rank("b", 1) is None and table.rank("b", 2) is not None
    clock.now += 601
    assert table.expire(keep_for_s=600) == 1 and len(table) == 0
