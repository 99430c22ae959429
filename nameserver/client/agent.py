"""Broker agent: keeps brokers registered with the nameserver, as a RocketMQ broker does.

A BrokerAgent holds one broker's identity and topic table. A BrokerFleet drives any number of agents
from one thread: it registers those not registered yet (or whose DataVersion changed), sends the
others' heartbeats in batches, registers again any address the cluster reports unknown (e.g. expired
while partitioned), and unregisters everyone on a clean stop. The Client underneath follows the
leader and retries, so a nameserver failover costs a few retried calls and no broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from nameserver.client.client import Client
from nameserver.client.errors import NameServerError
from nameserver.pb import api_pb2, state_pb2

log = logging.getLogger("nameserver.client.agent")

HEARTBEATS_PER_CALL = 1000


@dataclass(frozen=True)
class BrokerIdentity:
    cluster_name: str
    broker_name: str
    broker_addr: str
    broker_id: int = 0                 # 0 = master
    ha_server_addr: str = ""
    zone_name: str = ""
    heartbeat_timeout_ms: int = 0      # 0 = the server's default (120 s)


def topic_config(name: str, queues: int = 4, perm: int = 6, sys_flag: int = 0) -> api_pb2.TopicConfig:
    """A topic with `queues` read and write queues (perm 6 = read + write)."""
    return api_pb2.TopicConfig(topic_name=name, read_queue_nums=queues, write_queue_nums=queues, perm=perm,
                               topic_sys_flag=sys_flag)


@dataclass
class AgentStats:
    registrations: int = 0
    heartbeats: int = 0
    reregistrations: int = 0      # after the cluster reported the address unknown
    failures: int = 0             # calls that failed even after the client's retries
    last_error: str = ""


class BrokerAgent:
    """One broker's registration state. Thread-safe; driven by a BrokerFleet."""

    def __init__(self, identity: BrokerIdentity, topics: Iterable[api_pb2.TopicConfig],
                 data_version: int = 1) -> None:
        self.identity = identity
        self._lock = threading.Lock()
        self._topics = list(topics)
        self._version = state_pb2.DataVersion(counter=data_version, timestamp=int(time.time() * 1000))
        self._registered_version: state_pb2.DataVersion | None = None
        self.stats = AgentStats()

    @property
    def data_version(self) -> state_pb2.DataVersion:
        with self._lock:
            return state_pb2.DataVersion(counter=self._version.counter, timestamp=self._version.timestamp)

    @property
    def registered(self) -> bool:
        with self._lock:
            return self._registered_version is not None

    def needs_registration(self) -> bool:
        with self._lock:
            return self._registered_version != self._version

    def update_topics(self, topics: Iterable[api_pb2.TopicConfig]) -> None:
        """Change the topic table: bumps the DataVersion, so the fleet registers again."""
        with self._lock:
            self._topics = list(topics)
            self._version = state_pb2.DataVersion(counter=self._version.counter + 1,
                                                  timestamp=int(time.time() * 1000))

    def forget_registration(self) -> None:
        """The cluster does not know this broker (anymore): register again on the next tick."""
        with self._lock:
            self._registered_version = None

    def register_request(self) -> tuple[api_pb2.RegisterBrokerRequest, state_pb2.DataVersion]:
        i = self.identity
        with self._lock:
            version = state_pb2.DataVersion(counter=self._version.counter, timestamp=self._version.timestamp)
            request = api_pb2.RegisterBrokerRequest(
                cluster_name=i.cluster_name, broker_name=i.broker_name, broker_addr=i.broker_addr,
                broker_id=i.broker_id, ha_server_addr=i.ha_server_addr, zone_name=i.zone_name,
                heartbeat_timeout_ms=i.heartbeat_timeout_ms, data_version=version, topics=self._topics)
        return request, version

    def register(self, client: Client) -> api_pb2.RegisterBrokerReply:
        request, version = self.register_request()
        reply = client.register_broker(request)
        with self._lock:
            self._registered_version = version
        self.stats.registrations += 1
        return reply

    def heartbeat_message(self) -> api_pb2.BrokerHeartbeat:
        i = self.identity
        return api_pb2.BrokerHeartbeat(cluster_name=i.cluster_name, broker_name=i.broker_name,
                                       broker_addr=i.broker_addr)


@dataclass
class BrokerFleet:
    """Drives agents from one thread: register when needed, heartbeat every `heartbeat_interval_s`.

    `stop()` unregisters every registered agent (a clean shutdown); `kill(agent)` stops one agent's
    heartbeats without unregistering it (a crash, for demos and tests).
    """

    client: Client
    agents: Sequence[BrokerAgent]
    heartbeat_interval_s: float = 1.0
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _killed: set[str] = field(default_factory=set, init=False)
    rounds: int = field(default=0, init=False)

    def start(self) -> BrokerFleet:
        self._thread = threading.Thread(target=self._run, name="broker-fleet", daemon=True)
        self._thread.start()
        return self

    def __enter__(self) -> BrokerFleet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def live_agents(self) -> list[BrokerAgent]:
        return [a for a in self.agents if a.identity.broker_addr not in self._killed]

    def kill(self, agent: BrokerAgent) -> None:
        """Stop this agent's heartbeats (without unregistering): the cluster expires it on timeout."""
        self._killed.add(agent.identity.broker_addr)

    def run_once(self) -> None:
        """One round: registrations that are due, then one batched heartbeat for the others."""
        live = self.live_agents()
        for agent in live:
            if self._stop.is_set():
                return
            if agent.needs_registration():
                self._register(agent)
        beating = [a for a in live if a.registered]
        by_addr = {a.identity.broker_addr: a for a in beating}
        for start in range(0, len(beating), HEARTBEATS_PER_CALL):
            batch = beating[start:start + HEARTBEATS_PER_CALL]
            try:
                unknown = self.client.heartbeat([a.heartbeat_message() for a in batch])
            except NameServerError as err:
                for agent in batch:
                    agent.stats.failures += 1
                    agent.stats.last_error = str(err)
                log.warning("heartbeat of %d broker(s) failed: %s", len(batch), err)
                continue
            for agent in batch:
                agent.stats.heartbeats += 1
            for addr in unknown:
                forgotten = by_addr.get(addr)
                if forgotten is not None:
                    forgotten.forget_registration()
                    forgotten.stats.reregistrations += 1
                    self._register(agent)
        self.rounds += 1

    def _register(self, agent: BrokerAgent) -> None:
        try:
            agent.register(self.client)
        except NameServerError as err:
            agent.stats.failures += 1
            agent.stats.last_error = str(err)
            log.warning("registration of %s failed: %s", agent.identity.broker_name, err)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception:  # keep heartbeating whatever one round hit
                log.exception("broker fleet round failed")
            self._stop.wait(max(0.0, self.heartbeat_interval_s - (time.monotonic() - started)))

    def stop(self, unregister: bool = True) -> int:
        """Stop heartbeating; with `unregister`, unregister every live registered agent. Returns how
        many were unregistered."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        done = 0
        if not unregister:
            return 0
        for agent in self.live_agents():
            if not agent.registered:
                continue
            i = agent.identity
            try:
                self.client.unregister_broker(i.cluster_name, i.broker_name, i.broker_addr, i.broker_id)
                agent.forget_registration()
                done += 1
            except NameServerError as err:
                log.warning("unregistration of %s failed: %s", i.broker_name, err)
        return done
