"""Route cache: topic routes kept current by Watch, with a periodic pull as the fallback.

The cache mirrors the state's `topic/<topic>/<brokerName>` (QueueData) and `broker/<brokerName>`
(BrokerData) keys. A watch thread applies changes as the serving node applies them (a dead broker
leaves the cache within milliseconds of its removal record). When the stream breaks it resumes from
the last change it saw (OUT_OF_RANGE "compacted": it lists the current state again), on another node
after a failure. A pull thread re-reads every cached topic's route every `pull_interval_s`, and keeps
a pulled route only when the node that served it had applied at least as far as the cache: with
`watch=False` this is RocketMQ's 30 s pull, the baseline that watch improves on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from nameserver.client.client import Client
from nameserver.client.errors import NameServerError, status_of
from nameserver.client.retry import RetryPolicy
from nameserver.logformat import keynames, records
from nameserver.pb import api_pb2, state_pb2

log = logging.getLogger("nameserver.client.routes")

PERM_WRITE = 0x2
PERM_READ = 0x4
MASTER_ID = 0

Listener = Callable[[int, list[str]], None]


@dataclass(frozen=True, order=True)
class MessageQueue:
    """One queue of a topic on one broker (RocketMQ's MessageQueue)."""

    topic: str
    broker_name: str
    queue_id: int


@dataclass(frozen=True)
class TopicRouteView:
    """A topic's route as cached: queue datas and the broker datas they refer to."""

    topic: str
    queue_datas: tuple[state_pb2.QueueData, ...]
    broker_datas: tuple[state_pb2.BrokerData, ...]

    def master_addr(self, broker_name: str) -> str | None:
        for b in self.broker_datas:
            if b.broker_name == broker_name:
                return next((a.addr for a in b.addrs if a.broker_id == MASTER_ID), None)
        return None

    def publish_queues(self) -> list[MessageQueue]:
        """Writable queues, as RocketMQ's topicRouteData2TopicPublishInfo builds them: brokers sorted
        by name, only those with write permission and a registered master, queue ids 0..write-1."""
        out: list[MessageQueue] = []
        for qd in sorted(self.queue_datas, key=lambda q: q.broker_name):
            if qd.perm & PERM_WRITE and self.master_addr(qd.broker_name) is not None:
                out += [MessageQueue(self.topic, qd.broker_name, i) for i in range(qd.write_queue_nums)]
        return out


class RouteCache:
    """Topic routes for a producer or consumer, fed by Watch (and a periodic pull as fallback).

    topics: the topics to follow; None follows every topic.
    watch: False turns the cache into a pull-only one (RocketMQ's behaviour).
    pull_interval_s: period of the pull (30 s, RocketMQ's pollNameServerInterval).
    """

    def __init__(self, client: Client, topics: Sequence[str] | None = None, *, watch: bool = True,
                 pull_interval_s: float = 30.0, progress_interval_ms: int = 1000,
                 retry: RetryPolicy | None = None) -> None:
        self.client = client
        self.follow_all = topics is None
        self.watch_enabled = watch
        self.pull_interval_s = pull_interval_s
        self.progress_interval_ms = progress_interval_ms
        self.retry = retry or RetryPolicy(initial_backoff_s=0.1, max_backoff_s=2.0)
        self._interest: set[str] = set(topics or ())
        self._lock = threading.Condition()
        self._queues: dict[str, dict[str, state_pb2.QueueData]] = {}
        self._brokers: dict[str, state_pb2.BrokerData] = {}
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stream: grpc.Future | None = None
        self.offset = 0          # the cache is current up to this offset (highest seen)
        self._resume_offset = 0  # last change (or listing) offset: where a broken watch resumes
        self.connected = False   # a watch stream is up and past its initial listing
        self.events_applied = 0
        self.pulls = 0
        self.reconnects = 0

    # ---- lifecycle ----

    def start(self) -> RouteCache:
        if self.watch_enabled:
            self._spawn(self._watch_loop, "route-watch")
        if self.pull_interval_s > 0:
            self._spawn(self._pull_loop, "route-pull")
        return self

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.cancel()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> RouteCache:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(offset, changed_keys)` after every applied change (watch or pull)."""
        self._listeners.append(listener)

    # ---- reading the cache ----

    def route(self, topic: str) -> TopicRouteView | None:
        """The cached route of `topic`; a topic not followed yet is fetched once, then followed."""
        if not self.follow_all and topic not in self._interest:
            self._interest.add(topic)
            self._restart_watch()
            self.pull_topic(topic)
        elif not self.watch_enabled and topic not in self._interest:
            self._interest.add(topic)
            self.pull_topic(topic)
        with self._lock:
            queues = self._queues.get(topic)
            if not queues:
                return None
            datas = tuple(queues[name] for name in sorted(queues))
            brokers = tuple(self._brokers[n] for n in sorted(queues) if n in self._brokers)
        return TopicRouteView(topic, datas, brokers)

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        view = self.route(topic)
        return view.publish_queues() if view is not None else []

    def broker_names(self) -> set[str]:
        with self._lock:
            return set(self._brokers)

    def topics(self) -> set[str]:
        with self._lock:
            return {t for t, q in self._queues.items() if q}

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Block until `predicate()` holds after some change (or now); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.5))
        return True

    def wait_synced(self, timeout: float = 10.0) -> bool:
        """Block until the watch listed the current state (or a pull succeeded, in pull mode)."""
        return self.wait_for(lambda: self.offset > 0, timeout)

    # ---- applying changes ----

    def _apply_event(self, ev: api_pb2.WatchEvent) -> None:
        kind, _, rest = ev.key.partition("/")
        if kind == "topic":
            topic, _, part = rest.rpartition("/")
            broker = keynames.unescape(part)  # a broker name is escaped in keys (nameserver/state/keys.py)
            if broker is None:
                return
            if ev.deleted:
                self._queues.get(topic, {}).pop(broker, None)
            else:
                self._queues.setdefault(topic, {})[broker] = state_pb2.QueueData.FromString(ev.value)
        elif kind == "broker":
            name = keynames.unescape(rest)
            if name is None:
                return
            if ev.deleted:
                self._brokers.pop(name, None)
            else:
                self._brokers[name] = state_pb2.BrokerData.FromString(ev.value)

    def _notify(self, offset: int, keys: list[str]) -> None:
        for listener in list(self._listeners):
            try:
                listener(offset, keys)
            except Exception:  # a listener's bug must not stop the cache
                log.exception("route cache listener failed")

    def apply_changes(self, offset: int, events: Sequence[api_pb2.WatchEvent]) -> None:
        """Apply one WatchResponse's events (also the entry point for tests)."""
        with self._lock:
            for ev in events:
                self._apply_event(ev)
            self.events_applied += len(events)
            self.offset = max(self.offset, offset)
            self._resume_offset = max(self._resume_offset, offset)
            self._lock.notify_all()
        self._notify(offset, [e.key for e in events])

    def replace_all(self, offset: int, events: Sequence[api_pb2.WatchEvent]) -> None:
        """Install a full listing (a watch's initial state) in place of the cache's contents."""
        with self._lock:
            self._queues.clear()
            self._brokers.clear()
            for ev in events:
                self._apply_event(ev)
            self.offset = max(self.offset, offset)
            self._resume_offset = offset
            self._lock.notify_all()
        self._notify(offset, [e.key for e in events])

    def _progress(self, offset: int) -> None:
        with self._lock:
            self.offset = max(self.offset, offset)
            self._lock.notify_all()

    # ---- watch ----

    def _prefixes(self) -> list[str]:
        if self.follow_all:
            return [records.TOPIC.prefix, records.BROKER.prefix]
        return [records.BROKER.prefix] + [f"{records.TOPIC.prefix}{t}/" for t in sorted(self._interest)]

    def _restart_watch(self) -> None:
        stream = self._stream
        if stream is not None:
            stream.cancel()  # the loop reconnects with the new prefixes from the last offset

    def _watch_loop(self) -> None:
        attempt = 0
        endpoint: str | None = None
        while not self._stop.is_set():
            endpoint = self.client.pool.next_endpoint(avoid=endpoint)
            try:
                self._consume(endpoint)
                attempt = 0
            except grpc.RpcError as err:
                code, details = status_of(err)
                if self._stop.is_set():
                    break
                if code == grpc.StatusCode.CANCELLED:  # our own cancel (new interest): resume at once
                    continue
                if code == grpc.StatusCode.OUT_OF_RANGE:
                    self._resume_offset = 0  # compacted: list the current state again
                log.info("watch on %s broke (%s: %s); resuming from offset %d", endpoint, code.name, details,
                         self._resume_offset)
            finally:
                self.connected = False
            self.reconnects += 1
            self._stop.wait(self.retry.backoff(attempt))
            attempt = min(attempt + 1, 10)

    def _consume(self, endpoint: str) -> None:
        stream = self.client.pool.ns(endpoint).Watch(api_pb2.WatchRequest(
            key_prefixes=self._prefixes(), start_offset=self._resume_offset,
            progress_interval_ms=self.progress_interval_ms))
        self._stream = stream
        if self._stop.is_set():
            stream.cancel()
        listing: list[api_pb2.WatchEvent] = []
        for resp in stream:
            if resp.initial_state:
                listing.extend(resp.events)
                if resp.initial_state_done:
                    self.replace_all(resp.offset, listing)
                    listing = []
                    self.connected = True
            elif resp.events:
                self.connected = True
                self.apply_changes(resp.offset, resp.events)
            else:
                self.connected = True
                self._progress(resp.offset)

    # ---- pull ----

    def _pull_loop(self) -> None:
        if not self.watch_enabled:
            self.pull_all()
        while not self._stop.wait(self.pull_interval_s):
            self.pull_all()

    def pull_all(self) -> None:
        """Re-read every followed topic's route now (what the pull thread does each period)."""
        names = set(self._interest) | (self.topics() if self.follow_all else set())
        if self.follow_all and not self.watch_enabled:
            try:
                names |= set(self.client.get_topic_list(min_offset=0))
            except NameServerError as err:
                log.info("route pull: topic list failed: %s", err)
        for topic in sorted(names):
            if self._stop.is_set():
                return
            self.pull_topic(topic)
        self.pulls += 1
        if not self.watch_enabled:
            self._progress(max(1, self.client.last_offset))

    def pull_topic(self, topic: str) -> bool:
        """Fetch one topic's route; keep it when it is at least as fresh as the cache. True if kept."""
        try:
            reply = self.client.get_route(topic)
            queue_datas, broker_datas, offset = list(reply.route.queue_datas), list(reply.route.broker_datas), \
                reply.apply_offset
        except NameServerError as err:
            if err.code != grpc.StatusCode.NOT_FOUND:
                log.info("route pull of %s failed: %s", topic, err)
                return False
            queue_datas, broker_datas, offset = [], [], err.apply_offset or 0
        with self._lock:
            if offset < self.offset and self.watch_enabled:
                return False  # staler than what the watch already applied
            before = self._queues.get(topic, {})
            self._queues[topic] = {q.broker_name: q for q in queue_datas}
            for name in set(before) - set(self._queues[topic]):
                if not any(name in q for q in self._queues.values()):
                    self._brokers.pop(name, None)
            for b in broker_datas:
                self._brokers[b.broker_name] = b
            self.offset = max(self.offset, offset)
            self._lock.notify_all()
        self._notify(offset, [f"{records.TOPIC.prefix}{topic}/"])
        return True
