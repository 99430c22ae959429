"""Traffic helpers over tests/interop/java/InteropClient.java: topics made with mqadmin, producers, consumers."""

from __future__ import annotations

import time
from dataclasses import dataclass

from .conftest import CLUSTER, Deployment
from .launcher import JavaProc

BINARY_HEADERS = {"rocketmq.serialize.type": "ROCKETMQ"}  # a client JVM's property: binary remoting headers


def create_topic(d: Deployment, topic: str, queues: int = 4, brokers: tuple[str, ...] = ("broker-a", "broker-b"),
                 namesrv: str | None = None) -> None:
    """`mqadmin updateTopic -c InteropCluster` (creates it on every master), then wait for the route on every
    node to list `brokers`."""
    r = d.rmq.mqadmin("updateTopic", "-c", CLUSTER, "-t", topic, "-r", str(queues), "-w", str(queues),
                      namesrv=namesrv or d.namesrv)
    assert r.returncode == 0 and "success" in r.stdout, f"updateTopic failed:\n{r.stdout}\n{r.stderr}"
    d.wait_route(topic, lambda rt: rt is not None and {q["brokerName"] for q in rt["queueDatas"]} >= set(brokers),
                 addrs=namesrv.split(";") if namesrv else None, timeout=60)


@dataclass
class Consumer:
    proc: JavaProc

    def received(self) -> list[str]:
        return [ln.split()[1] for ln in self.proc.snapshot() if ln.startswith("RECV ")]

    def owned(self) -> set[str] | None:
        """The queues it owned at its last report (None before the first)."""
        lines = [ln for ln in self.proc.snapshot() if ln.startswith("QUEUES")]
        if not lines:
            return None
        parts = lines[-1].split(" ", 1)
        return set(parts[1].split(",")) if len(parts) > 1 and parts[1] else set()

    def wait_owning(self, timeout: float = 60.0) -> set[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            o = self.owned()
            if o:
                return o
            time.sleep(0.3)
        raise AssertionError(f"consumer owns no queue after {timeout}s\n{self.proc.tail()}")

    def wait_received(self, keys: set[str], timeout: float = 90.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.received()
            if keys <= set(got):
                return got
            time.sleep(0.3)
        got = self.received()
        raise AssertionError(f"received {len(set(got) & keys)}/{len(keys)} after {timeout}s; missing "
                             f"{sorted(keys - set(got))[:20]}\n{self.proc.tail()}")


def start_consumer(d: Deployment, topic: str, group: str, instance: str, namesrv: str | None = None,
                   props: dict[str, str] | None = None) -> Consumer:
    """`props`: the JVM's system properties (e.g. rocketmq.serialize.type)."""
    p = d.rmq.client("consume", namesrv or d.namesrv, topic, group, instance, name=f"consumer-{instance}",
                     props=props)
    p.wait_line(lambda ln: ln == "READY", timeout=90)
    return Consumer(p)


@dataclass
class ProduceResult:
    sent: list[str]
    failed: list[str]
    lines: list[str]


def produce(d: Deployment, topic: str, count: int, group: str = "interop-producer", interval_ms: int = 0,
            prefix: str = "m", namesrv: str | None = None, timeout: float = 300.0,
            props: dict[str, str] | None = None) -> ProduceResult:
    """Run the producer to completion: `count` sync sends (each with the client's own 2 retries)."""
    p = start_producer(d, topic, count, group, interval_ms, prefix, namesrv, props)
    return finish_producer(p, timeout)


def start_producer(d: Deployment, topic: str, count: int, group: str = "interop-producer", interval_ms: int = 0,
                   prefix: str = "m", namesrv: str | None = None, props: dict[str, str] | None = None) -> JavaProc:
    return d.rmq.client("produce", namesrv or d.namesrv, topic, str(count), group, str(interval_ms), prefix,
                        name=f"producer-{prefix}", props=props)


def finish_producer(p: JavaProc, timeout: float = 300.0) -> ProduceResult:
    p.wait_line(lambda ln: ln.startswith("DONE "), timeout=timeout)
    lines = p.snapshot()
    return ProduceResult([ln.split()[1] for ln in lines if ln.startswith("SENT ")],
                         [ln for ln in lines if ln.startswith("FAIL ")], lines)
