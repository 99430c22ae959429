"""Producer queue selection with latency fault tolerance: deterministic, with an injected clock."""

from __future__ import annotations

import pytest

from nameserver.client import (
    LatencyFaultTolerance,
    MessageQueue,
    NoRouteError,
    QueueSelector,
    SendFailed,
    TopicRouteView,
    not_available_duration,
)
from nameserver.pb import state_pb2


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Routes:
    def __init__(self, brokers: list[str], queues: int = 2) -> None:
        self.brokers = brokers
        self.queues = queues

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        return [MessageQueue(topic, b, i) for b in self.brokers for i in range(self.queues)]


@pytest.mark.parametrize("latency, avoided", [
    (0, 0), (49, 0), (50, 0), (99, 0), (100, 0), (549, 0), (550, 30), (999, 30), (1000, 60),
    (1999, 60), (2000, 120), (3000, 180), (14999, 180), (15000, 600), (99999, 600)])
def test_latency_thresholds_map_to_rocketmq_durations(latency: float, avoided: float) -> None:
    assert not_available_duration(latency) == avoided


def test_round_robin_over_writable_queues() -> None:
    sel = QueueSelector(Routes(["a", "b"]), clock=Clock())
    picks = [(q.broker_name, q.queue_id) for q in (sel.select("T") for _ in range(5))]
    assert picks == [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("a", 0)]


def test_publish_queues_skip_read_only_and_masterless_brokers() -> None:
    def broker(name: str, with_master: bool = True) -> state_pb2.BrokerData:
        addrs = [state_pb2.BrokerAddr(broker_id=0 if with_master else 1, addr="10.0.0.1:10911")]
        return state_pb2.BrokerData(cluster="C", broker_name=name, addrs=addrs)

    view = TopicRouteView("T", (
        state_pb2.QueueData(broker_name="c", write_queue_nums=1, read_queue_nums=1, perm=6),
        state_pb2.QueueData(broker_name="a", write_queue_nums=2, read_queue_nums=4, perm=6),
        state_pb2.QueueData(broker_name="ro", write_queue_nums=2, read_queue_nums=2, perm=4),
        state_pb2.QueueData(broker_name="slave", write_queue_nums=2, read_queue_nums=2, perm=6),
    ), (broker("a"), broker("c"), broker("ro"), broker("slave", with_master=False)))
    assert view.publish_queues() == [MessageQueue("T", "a", 0), MessageQueue("T", "a", 1),
                                     MessageQueue("T", "c", 0)]


def test_a_slow_broker_is_avoided_for_its_period_then_chosen_again() -> None:
    clock = Clock()
    sel = QueueSelector(Routes(["a", "b"], queues=1), clock=clock)
    sel.record(MessageQueue("T", "a", 0), latency_ms=600)  # >= 550 ms: 30 s
    assert {sel.select("T").broker_name for _ in range(6)} == {"b"}
    clock.now += 29.9
    assert {sel.select("T").broker_name for _ in range(6)} == {"b"}
    clock.now += 0.1
    assert {sel.select("T").broker_name for _ in range(6)} == {"a", "b"}


def test_fast_sends_never_avoid_a_broker() -> None:
    sel = QueueSelector(Routes(["a", "b"], queues=1), clock=Clock())
    sel.record(MessageQueue("T", "a", 0), latency_ms=100)
    assert {sel.select("T").broker_name for _ in range(4)} == {"a", "b"}


def test_a_failed_send_isolates_for_the_longest_period_and_is_retried_elsewhere() -> None:
    clock = Clock()
    sel = QueueSelector(Routes(["a", "b", "c"], queues=1), clock=clock)
    tried: list[str] = []

    def send(mq: MessageQueue) -> str:
        tried.append(mq.broker_name)
        if mq.broker_name == "a":
            clock.now += 0.01
            raise ConnectionError("broker a is down")
        return f"sent via {mq.broker_name}"

    assert sel.send("T", send) == "sent via b"
    assert tried == ["a", "b"]
    item = sel.faults.item("a")
    assert item is not None and item.available_at == pytest.approx(clock.now + 600)
    assert "a" not in {sel.select("T").broker_name for _ in range(9)}
    clock.now += 599
    assert "a" not in {sel.select("T").broker_name for _ in range(9)}
    clock.now += 2
    assert "a" in {sel.select("T").broker_name for _ in range(9)}


def test_send_gives_up_after_the_retries_on_different_brokers() -> None:
    sel = QueueSelector(Routes(["a", "b", "c"], queues=1), clock=Clock())

    def send(mq: MessageQueue) -> None:
        raise TimeoutError(mq.broker_name)

    with pytest.raises(SendFailed) as err:
        sel.send("T", send, retries=2)
    assert [mq.broker_name for mq, _ in err.value.errors] == ["a", "b", "c"]


def test_when_every_broker_is_avoided_the_least_bad_one_is_chosen() -> None:
    clock = Clock()
    sel = QueueSelector(Routes(["a", "b", "c"], queues=1), clock=clock)
    sel.record(MessageQueue("T", "a", 0), latency_ms=3500)   # 180 s
    sel.record(MessageQueue("T", "b", 0), latency_ms=1200)   # 60 s: back soonest
    sel.record(MessageQueue("T", "c", 0), latency_ms=0, failed=True)  # 600 s
    assert {sel.select("T").broker_name for _ in range(5)} == {"b"}
    # on a retry after b failed, b is not picked again while another broker exists
    assert sel.select("T", last_broker="b").broker_name == "a"


def test_a_retry_prefers_another_broker_than_the_one_that_failed() -> None:
    sel = QueueSelector(Routes(["a", "b"], queues=2), clock=Clock())
    assert all(sel.select("T", last_broker="a").broker_name == "b" for _ in range(4))
    single = QueueSelector(Routes(["a"], queues=2), clock=Clock())
    assert single.select("T", last_broker="a").broker_name == "a"  # nothing else to choose


def test_no_writable_queue_raises() -> None:
    with pytest.raises(NoRouteError):
        QueueSelector(Routes([]), clock=Clock()).select("T")


def test_disabled_fault_tolerance_is_plain_round_robin() -> None:
    sel = QueueSelector(Routes(["a", "b"], queues=1), enabled=False, clock=Clock())
    sel.record(MessageQueue("T", "a", 0), latency_ms=0, failed=True)
    assert [sel.select("T").broker_name for _ in range(4)] == ["a", "b", "a", "b"]


def test_fault_table_is_shared_by_name() -> None:
    clock = Clock()
    faults = LatencyFaultTolerance(clock=clock)
    assert faults.update("x", 2500) == 120
    assert not faults.is_available("x")
    faults.remove("x")
    assert faults.is_available("x")
    assert faults.least_bad([]) is None
