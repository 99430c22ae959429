"""Producer queue selection: round-robin over a topic's writable queues, avoiding slow or failed
brokers (faults.py), and sends retried on another broker."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from nameserver.client.faults import LatencyFaultTolerance
from nameserver.client.routes import MessageQueue

T = TypeVar("T")

DEFAULT_RETRIES = 2  # RocketMQ's retryTimesWhenSendFailed


class RouteSource(Protocol):
    """Where the selector gets a topic's writable queues (a RouteCache, or a stub in tests)."""

    def publish_queues(self, topic: str) -> list[MessageQueue]: ...


class NoRouteError(Exception):
    """The topic has no writable queue in the route."""


class SendFailed(Exception):
    """Every attempt of a send failed; `errors` holds (queue, exception) per attempt."""

    def __init__(self, topic: str, errors: list[tuple[MessageQueue, BaseException]]) -> None:
        tried = ", ".join(f"{mq.broker_name}#{mq.queue_id}: {exc!r}" for mq, exc in errors)
        super().__init__(f"send to {topic} failed after {len(errors)} attempt(s): {tried}")
        self.topic = topic
        self.errors = errors


class QueueSelector:
    """RocketMQ's MQFaultStrategy with latency fault tolerance on.

    select(): the next writable queue in round-robin order whose broker is not being avoided (and not
    the broker that just failed, on a retry); when every broker is avoided, a queue of the least bad one.
    record(): feed back a send's latency (or failure). send(): select, call, record, retry elsewhere.
    """

    def __init__(self, routes: RouteSource, fault_tolerance: LatencyFaultTolerance | None = None, *,
                 enabled: bool = True, clock: Callable[[], float] | None = None) -> None:
        self.routes = routes
        self.faults = fault_tolerance or LatencyFaultTolerance(clock=clock or time.monotonic)
        self.clock = clock or self.faults.clock
        self.enabled = enabled
        self._counters: dict[str, itertools.count[int]] = {}
        self._lock = threading.Lock()

    def _next_index(self, topic: str) -> int:
        with self._lock:
            counter = self._counters.setdefault(topic, itertools.count())
            return next(counter)

    def select(self, topic: str, last_broker: str | None = None) -> MessageQueue:
        queues = self.routes.publish_queues(topic)
        if not queues:
            raise NoRouteError(f"topic {topic} has no writable queue")
        start = self._next_index(topic)
        ordered = [queues[(start + i) % len(queues)] for i in range(len(queues))]
        usable = ordered if not self.enabled else [q for q in ordered if self.faults.is_available(q.broker_name)]
        for mq in usable:
            if mq.broker_name != last_broker:
                return mq
        if usable:
            return usable[0]  # only the broker that just failed is left and it is available again
        brokers = {q.broker_name for q in queues}
        others = brokers - {last_broker} if last_broker is not None and len(brokers) > 1 else brokers
        best = self.faults.least_bad(others)
        return next(q for q in ordered if q.broker_name == best)

    def record(self, mq: MessageQueue, latency_ms: float, failed: bool = False) -> None:
        if self.enabled:
            self.faults.update(mq.broker_name, latency_ms, failed)

    def send(self, topic: str, send_fn: Callable[[MessageQueue], T], retries: int = DEFAULT_RETRIES) -> T:
        """Send through `send_fn(queue)`; an exception counts as a failure and is retried on another
        broker, up to `retries` times. Raises SendFailed with every attempt's error."""
        errors: list[tuple[MessageQueue, BaseException]] = []
        last_broker: str | None = None
        for _ in range(retries + 1):
            mq = self.select(topic, last_broker)
            started = self.clock()
            try:
                result = send_fn(mq)
            except Exception as exc:  # any failure of the user's send: isolate the broker, try another
                self.record(mq, (self.clock() - started) * 1000, failed=True)
                errors.append((mq, exc))
                last_broker = mq.broker_name
                continue
            self.record(mq, (self.clock() - started) * 1000)
            return result
        raise SendFailed(topic, errors)
