"""The registry workloads, run the same way against our cluster, etcd and a bare gRPC echo server.

Each system is a `Target` adapter; the load loops below never know which one they drive:

- **registration**: each op registers one broker with T topics and really writes. Ours: RegisterBroker
  with a fresh DataVersion and toggled queue counts, so the live record and the T queue datas change
  (T+1 records; the reply's `records` is what we count). etcd: one Txn comparing the broker key's
  version, putting the broker key and one route key per topic (T+1 puts, counted as records).
  Writes go to the leader on both (no follower-forwarding hop on either side).
- **route reads** (eventual): ours GetRoute on every node; etcd a serializable Range over the topic's
  route keys. Threads are spread evenly over the nodes, results per node and in total.
- **linearizable reads**: ours GetBinding(LINEARIZABLE) (read index through the log); etcd a
  linearizable single-key Range (read index). Spread over the nodes like route reads.
- **watch propagation**: one writer on the leader, a watcher on a follower; from the write's
  acknowledgement to the event's arrival (the method of bench/consistency.py).
- **echo** (the ceiling): the same loops, each op one unary echo of a request of the same size.

Client model, the same for every target: one thread per concurrent client, each with its own channel
on its own HTTP/2 connection (a local subchannel pool, so channels to one address do not share a
connection), synchronous unary calls. All client threads live in the harness process, whose GIL and
CPU they share with the servers on the same 2 cores: every load reports the client's and the
servers' CPU use so a client-bound figure can be told from a server-bound one.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from bench.consistency import summary
from bench.echo import echo_stub
from bench.etcd import EtcdCluster, prefix_end
from bench.load import Op, new_channel, run_load
from bench.pb.etcd.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from bench.procs import LocalCluster, with_descendants
from nameserver.pb import api_pb2, api_pb2_grpc, state_pb2

CLIENT_MODEL = ("one client thread per unit of concurrency, each with its own gRPC channel on its own "
                "HTTP/2 connection (local subchannel pool), synchronous unary calls; identical for every "
                "target; all clients in the harness process")
ROUTE_BROKERS = 4              # brokers serving every route-read topic: a route has 4 queue datas + 4 brokers
HEARTBEAT_TIMEOUT_MS = 3_600_000  # bench brokers never expire mid-run (an expiry would write records)
REG_BROKER = "reg-w"           # registration brokers: reg-w<worker>, topics RegW<worker>T<k>
REG_TOPIC = "RegW"
REG_ADDR = "10.77."
WATCH_GAP_S = 0.01             # between watched writes, as in consistency.py
WATCH_DRAIN_S = 1.0


def watch_propagation(put: Callable[[str], str], watch: Callable[[Callable[[str, float], None], threading.Event],
                                                                 Callable[[], None]],
                      seconds: float) -> dict[str, Any]:
    """From a write's acknowledgement to its event on another node's watch stream.

    `put(name)` writes one key (through the leader) and returns the key its event will carry, after the
    write is acknowledged; `watch(on_event, ready)` opens the stream on another node, calls
    on_event(key, arrival) per event, sets `ready` once it is listening, and returns a cancel function.
    """
    arrived: dict[str, float] = {}
    ready = threading.Event()

    def on_event(key: str, when: float) -> None:
        arrived.setdefault(key, when)

    cancel = watch(on_event, ready)
    try:
        if not ready.wait(10):
            raise RuntimeError("watch stream did not start within 10 s")
        acked: dict[str, float] = {}
        stop = time.monotonic() + seconds
        i = 0
        while time.monotonic() < stop:
            key = put(f"k{i}")
            acked[key] = time.perf_counter()
            i += 1
            time.sleep(WATCH_GAP_S)
        time.sleep(WATCH_DRAIN_S)
    finally:
        cancel()
    # An event can beat the writer's own acknowledgement: that counts as 0, not negative.
    lat = [max(0.0, arrived[k] - t0) for k, t0 in acked.items() if k in arrived]
    res = summary(lat, seconds)
    res["writes"] = len(acked)
    res["missing"] = len(acked) - len(lat)
    return res


def _spread(endpoints: list[str], names: dict[str, str]) -> tuple[Callable[[int], str], Callable[[int], str]]:
    """Worker i -> (endpoint, node name), round-robin, so every node gets the same number of threads."""
    return (lambda i: endpoints[i % len(endpoints)]), (lambda i: names[endpoints[i % len(endpoints)]])


# ---- the common interface ------------------------------------------------------------------------

class Target(ABC):
    """One system under test. Workloads it cannot do (echo has no watch) return None from supports()."""

    name: str
    topics: int

    @abstractmethod
    def pids(self) -> list[int]: ...

    @abstractmethod
    def leader_endpoint(self) -> str: ...

    @abstractmethod
    def endpoints(self) -> dict[str, str]:
        """Client endpoint -> node name, every node."""

    def supports(self, workload: str) -> bool:
        return True

    # registration
    @abstractmethod
    def registration_op(self, channel: grpc.Channel, worker: int) -> Op: ...

    def registration_mark(self) -> Any:
        """A position in the system's history taken before the registration loads."""
        return None

    def registration_check(self, mark: Any) -> dict[str, Any]:
        """Count, from the system itself, the records the registration loads committed after `mark`."""
        return {}

    @abstractmethod
    def reregistration_op(self, channel: grpc.Channel, worker: int) -> Op:
        """The steady state of a fleet: the worker's broker registers again, unchanged (RocketMQ
        brokers do this every 30 s). Only after registration_op ran for this worker."""

    # reads
    def setup_reads(self) -> None:  # noqa: B027 (optional hook: echo has nothing to set up)
        """Write the route and binding data the read loads read, and wait until every node has it."""

    @abstractmethod
    def route_read_op(self, channel: grpc.Channel, worker: int) -> Op: ...

    @abstractmethod
    def linearizable_read_op(self, channel: grpc.Channel, worker: int) -> Op: ...

    # watch
    def watch_put(self, key: str) -> str:
        raise NotImplementedError

    def watch_open(self, on_event: Callable[[str, float], None], ready: threading.Event) -> Callable[[], None]:
        raise NotImplementedError


def _topic_configs(prefix: str, topics: int, queues: int) -> list[api_pb2.TopicConfig]:
    return [api_pb2.TopicConfig(topic_name=f"{prefix}{k}", read_queue_nums=queues, write_queue_nums=queues, perm=6)
            for k in range(topics)]


def registration_request(name: str, addr: str, topic_prefix: str, topics: int, counter: int
                         ) -> api_pb2.RegisterBrokerRequest:
    """A master's RegisterBroker whose DataVersion and queue counts change with `counter`, so every
    registration rewrites the live record and every queue data (tests/cluster.py register_request)."""
    queues = 4 if counter % 2 else 8
    return api_pb2.RegisterBrokerRequest(
        cluster_name="BenchCluster", broker_name=name, broker_addr=addr, broker_id=0,
        ha_server_addr=addr.rsplit(":", 1)[0] + ":10912", heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
        data_version=state_pb2.DataVersion(counter=counter, timestamp=1700000000000 + counter),
        topics=_topic_configs(topic_prefix, topics, queues))


def _reg_names(worker: int) -> tuple[str, str, str]:
    return f"{REG_BROKER}{worker}", f"{REG_ADDR}{worker // 250}.{worker % 250 + 1}:10911", f"{REG_TOPIC}{worker}T"


# ---- ours ----------------------------------------------------------------------------------------

class OursTarget(Target):
    name = "ours"

    def __init__(self, cluster: LocalCluster, topics: int = 8) -> None:
        self.cluster = cluster
        self.topics = topics
        self.counters: dict[int, int] = {}
        self.route_topics = [f"RouteT{k}" for k in range(topics)]
        self.bind_topic = "LinBench"
        self.watch_ns = f"watch{uuid.uuid4().hex[:6]}"
        self._watch_writer: api_pb2_grpc.NameServerStub | None = None

    def pids(self) -> list[int]:
        """Every node's process and its worker processes (the node's CPU is theirs together)."""
        return with_descendants([n.pid for n in self.cluster.nodes if n.proc])

    def _leader(self) -> Any:
        leader = self.cluster.leader()
        if leader is None:
            leader = self.cluster.wait_ready()
        return leader

    def leader_endpoint(self) -> str:
        return self._leader().grpc_addr

    def endpoints(self) -> dict[str, str]:
        return {n.grpc_addr: n.name for n in self.cluster.nodes}

    def _follower(self) -> Any:
        leader = self._leader()
        return next(n for n in self.cluster.nodes if n is not leader)

    def registration_op(self, channel: grpc.Channel, worker: int) -> Op:
        stub = api_pb2_grpc.NameServerStub(channel)
        name, addr, prefix = _reg_names(worker)

        def op() -> int:
            counter = self.counters.get(worker, 0) + 1
            reply = stub.RegisterBroker(registration_request(name, addr, prefix, self.topics, counter), timeout=10)
            self.counters[worker] = counter
            return reply.records

        return op

    def reregistration_op(self, channel: grpc.Channel, worker: int) -> Op:
        stub = api_pb2_grpc.NameServerStub(channel)
        name, addr, prefix = _reg_names(worker)
        request = registration_request(name, addr, prefix, self.topics, self.counters[worker])

        def op() -> int:
            # unchanged DataVersion: the leader refreshes liveness, appends nothing
            return stub.RegisterBroker(request, timeout=10).records

        return op

    def registration_mark(self) -> int:
        self.cluster.wait_converged()
        return self._leader().status().apply_offset

    def registration_check(self, mark: int) -> dict[str, Any]:
        """Replay what the registrations changed from a follower's watch history after `mark`.

        Every record applied is one watch event (only changed values enter the log), so the events
        under the bench brokers' keys between `mark` and the converged end offset are the records the
        cluster committed and applied, counted on a node that did not serve the writes.
        """
        end = self.cluster.wait_converged()[0].apply_offset
        follower = self._follower()
        method = f"watch events on {follower.name} from offset {mark} to {end}"
        stream = follower.ns().Watch(api_pb2.WatchRequest(
            key_prefixes=[f"broker/{REG_BROKER}", f"live/{REG_ADDR}", f"topic/{REG_TOPIC}"],
            start_offset=mark, progress_interval_ms=100), timeout=60)
        events = 0
        try:
            for msg in stream:
                if msg.offset > end:
                    break
                events += len(msg.events)
                if msg.offset == end:
                    break
        except grpc.RpcError as exc:  # e.g. OUT_OF_RANGE: the node's history ring no longer reaches `mark`
            return {"in_cluster": None, "method": method, "error": f"{exc.code().name}: {exc.details()}"}
        finally:
            stream.cancel()
        return {"in_cluster": events, "method": method}

    def setup_reads(self) -> None:
        ns = self._leader().ns()
        for j in range(ROUTE_BROKERS):
            req = api_pb2.RegisterBrokerRequest(
                cluster_name="BenchCluster", broker_name=f"route-b{j}", broker_addr=f"10.78.0.{j + 1}:10911",
                broker_id=0, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
                data_version=state_pb2.DataVersion(counter=1, timestamp=1700000000000),
                topics=_topic_configs("RouteT", self.topics, 4))
            ns.RegisterBroker(req, timeout=10)
        try:
            ns.BindQueue(api_pb2.BindQueueRequest(topic=self.bind_topic, queue_id=0, owner="route-b0"), timeout=10)
        except grpc.RpcError as exc:  # bound already (a second run on the same cluster)
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
        self.cluster.wait_converged()
        for n in self.cluster.nodes:  # what the loads will read is there, and the size we claim
            route = n.ns().GetRoute(api_pb2.GetRouteRequest(topic=self.route_topics[0]), timeout=5).route
            if len(route.queue_datas) != ROUTE_BROKERS or len(route.broker_datas) != ROUTE_BROKERS:
                raise RuntimeError(f"{n.name}: route of {self.route_topics[0]} has {len(route.queue_datas)} "
                                   f"queue datas, {len(route.broker_datas)} brokers; want {ROUTE_BROKERS}")

    def route_read_op(self, channel: grpc.Channel, worker: int) -> Op:
        stub = api_pb2_grpc.NameServerStub(channel)
        reqs = [api_pb2.GetRouteRequest(topic=t) for t in self.route_topics]
        it = iter(range(worker, 1 << 62))

        def op() -> int:
            stub.GetRoute(reqs[next(it) % len(reqs)], timeout=10)
            return 0

        return op

    def linearizable_read_op(self, channel: grpc.Channel, worker: int) -> Op:
        stub = api_pb2_grpc.NameServerStub(channel)
        req = api_pb2.GetBindingRequest(topic=self.bind_topic, queue_id=0, consistency=api_pb2.LINEARIZABLE)

        def op() -> int:
            if not stub.GetBinding(req, timeout=10).found:
                raise RuntimeError("binding not found")
            return 0

        return op

    def watch_put(self, key: str) -> str:
        if self._watch_writer is None:  # look the leader up once, not per write
            self._watch_writer = self._leader().ns()
        self._watch_writer.PutKv(api_pb2.PutKvRequest(namespace=self.watch_ns, key=key, value="v"), timeout=5)
        return f"kv/{self.watch_ns}/{key}"

    def watch_open(self, on_event: Callable[[str, float], None], ready: threading.Event) -> Callable[[], None]:
        channel = new_channel(self._follower().grpc_addr)
        stream = api_pb2_grpc.NameServerStub(channel).Watch(
            api_pb2.WatchRequest(key_prefixes=[f"kv/{self.watch_ns}/"], progress_interval_ms=500), timeout=600)

        def consume() -> None:
            try:
                for msg in stream:
                    now = time.perf_counter()
                    if msg.initial_state_done:
                        ready.set()
                    for e in msg.events:
                        on_event(e.key, now)
            except grpc.RpcError:
                pass

        threading.Thread(target=consume, daemon=True, name="watch-ours").start()

        def cancel() -> None:
            stream.cancel()
            channel.close()

        return cancel


# ---- etcd ----------------------------------------------------------------------------------------

def _put(key: str, value: bytes) -> rpc_pb2.RequestOp:
    return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=key.encode(), value=value))


class EtcdTarget(Target):
    """The same registry on etcd: keys laid out as our state keys, values the same state.proto bytes."""

    name = "etcd"

    def __init__(self, cluster: EtcdCluster, topics: int = 8) -> None:
        self.cluster = cluster
        self.topics = topics
        self.versions: dict[int, int] = {}  # worker -> its broker key's version (the Txn's compare)
        self.counters: dict[int, int] = {}
        self.route_topics = [f"RouteT{k}" for k in range(topics)]
        self.bind_key = b"bind/LinBench/0"
        self.watch_prefix = f"kv/watch{uuid.uuid4().hex[:6]}/"
        self._watch_writer: rpc_pb2_grpc.KVStub | None = None

    def pids(self) -> list[int]:
        return [m.pid for m in self.cluster.members if m.proc]

    def _leader(self) -> Any:
        return self.cluster.leader() or self.cluster.wait_ready()

    def leader_endpoint(self) -> str:
        return self._leader().client_addr

    def endpoints(self) -> dict[str, str]:
        return {m.client_addr: m.name for m in self.cluster.members}

    def _follower(self) -> Any:
        leader = self._leader()
        return next(m for m in self.cluster.members if m is not leader)

    def _registration_txn(self, name: str, addr: str, prefix: str, counter: int, version: int
                          ) -> rpc_pb2.TxnRequest:
        queues = 4 if counter % 2 else 8
        live = state_pb2.BrokerLive(cluster="BenchCluster", broker_name=name, broker_addr=addr,
                                    ha_server_addr=addr.rsplit(":", 1)[0] + ":10912",
                                    heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
                                    data_version=state_pb2.DataVersion(counter=counter,
                                                                       timestamp=1700000000000 + counter))
        qd = state_pb2.QueueData(broker_name=name, read_queue_nums=queues, write_queue_nums=queues,
                                 perm=6).SerializeToString(deterministic=True)
        return rpc_pb2.TxnRequest(
            compare=[rpc_pb2.Compare(key=f"broker/{name}".encode(), target=rpc_pb2.Compare.VERSION,
                                     result=rpc_pb2.Compare.EQUAL, version=version)],
            success=[_put(f"broker/{name}", live.SerializeToString(deterministic=True)),
                     *(_put(f"topic/{prefix}{k}/{name}", qd) for k in range(self.topics))])

    def registration_op(self, channel: grpc.Channel, worker: int) -> Op:
        kv = rpc_pb2_grpc.KVStub(channel)
        name, addr, prefix = _reg_names(worker)

        def op() -> int:
            counter = self.counters.get(worker, 0) + 1
            version = self.versions.get(worker)
            if version is None:  # first op, or the last one's outcome is unknown: read the key's version
                got = kv.Range(rpc_pb2.RangeRequest(key=f"broker/{name}".encode(), keys_only=True), timeout=10)
                version = got.kvs[0].version if got.kvs else 0
            self.versions.pop(worker, None)
            reply = kv.Txn(self._registration_txn(name, addr, prefix, counter, version), timeout=10)
            if not reply.succeeded:  # nobody else writes this broker: a refused compare is a harness bug
                raise RuntimeError(f"etcd txn compare failed for broker/{name} at version {version}")
            self.counters[worker] = counter
            self.versions[worker] = version + 1
            return 1 + self.topics

        return op

    def reregistration_op(self, channel: grpc.Channel, worker: int) -> Op:
        kv = rpc_pb2_grpc.KVStub(channel)
        name, addr, prefix = _reg_names(worker)
        full = self._registration_txn(name, addr, prefix, self.counters[worker], 0)
        live = full.success[0].request_put.value
        # write only if the broker changed: compare its value; the puts sit in the failure branch
        txn = rpc_pb2.TxnRequest(
            compare=[rpc_pb2.Compare(key=f"broker/{name}".encode(), target=rpc_pb2.Compare.VALUE,
                                     result=rpc_pb2.Compare.EQUAL, value=live)],
            failure=list(full.success))

        def op() -> int:
            reply = kv.Txn(txn, timeout=10)
            if not reply.succeeded:
                raise RuntimeError(f"broker/{name} changed under an unchanged re-registration")
            return 0

        return op

    def _version_sum(self) -> tuple[int, int, str]:
        follower = self._follower()
        total = 0
        keys = 0
        for prefix in (f"broker/{REG_BROKER}".encode(), f"topic/{REG_TOPIC}".encode()):
            resp = follower.kv().Range(rpc_pb2.RangeRequest(key=prefix, range_end=prefix_end(prefix),
                                                            keys_only=True), timeout=30)
            total += sum(kv.version for kv in resp.kvs)
            keys += len(resp.kvs)
        return total, keys, follower.name

    def registration_mark(self) -> int:
        return self._version_sum()[0]

    def registration_check(self, mark: Any) -> dict[str, Any]:
        """Sum the versions of the bench brokers' keys on a follower (linearizable): a key's version
        counts the puts since its creation, so the sum (less the mark's) is every put committed."""
        total, keys, name = self._version_sum()
        return {"in_cluster": total - (mark or 0), "keys": keys,
                "method": f"sum of key versions under broker/{REG_BROKER}*, topic/{REG_TOPIC}* on {name}"}

    def setup_reads(self) -> None:
        kv = self._leader().kv()
        for j in range(ROUTE_BROKERS):
            name, addr = f"route-b{j}", f"10.78.0.{j + 1}:10911"
            bd = state_pb2.BrokerData(cluster="BenchCluster", broker_name=name,
                                      addrs=[state_pb2.BrokerAddr(broker_id=0, addr=addr)])
            qd = state_pb2.QueueData(broker_name=name, read_queue_nums=4, write_queue_nums=4, perm=6)
            kv.Txn(rpc_pb2.TxnRequest(success=[
                _put(f"broker/{name}", bd.SerializeToString(deterministic=True)),
                *(_put(f"topic/{t}/{name}", qd.SerializeToString(deterministic=True)) for t in self.route_topics)]),
                timeout=10)
        kv.Put(rpc_pb2.PutRequest(key=self.bind_key, value=b"route-b0"), timeout=10)
        for m in self.cluster.members:  # linearizable: every member has applied the setup
            prefix = f"topic/{self.route_topics[0]}/".encode()
            got = m.kv().Range(rpc_pb2.RangeRequest(key=prefix, range_end=prefix_end(prefix)), timeout=10)
            if got.count != ROUTE_BROKERS:
                raise RuntimeError(f"etcd {m.name}: {got.count} route keys under {prefix!r}, want {ROUTE_BROKERS}")

    def route_read_op(self, channel: grpc.Channel, worker: int) -> Op:
        kv = rpc_pb2_grpc.KVStub(channel)
        reqs = []
        for t in self.route_topics:
            prefix = f"topic/{t}/".encode()
            reqs.append(rpc_pb2.RangeRequest(key=prefix, range_end=prefix_end(prefix), serializable=True))
        it = iter(range(worker, 1 << 62))

        def op() -> int:
            kv.Range(reqs[next(it) % len(reqs)], timeout=10)
            return 0

        return op

    def linearizable_read_op(self, channel: grpc.Channel, worker: int) -> Op:
        kv = rpc_pb2_grpc.KVStub(channel)
        req = rpc_pb2.RangeRequest(key=self.bind_key)  # serializable=False: linearizable (read index)

        def op() -> int:
            if not kv.Range(req, timeout=10).kvs:
                raise RuntimeError("binding key not found")
            return 0

        return op

    def watch_put(self, key: str) -> str:
        if self._watch_writer is None:  # look the leader up once, not per write
            self._watch_writer = self._leader().kv()
        full = self.watch_prefix + key
        self._watch_writer.Put(rpc_pb2.PutRequest(key=full.encode(), value=b"v"), timeout=5)
        return full

    def watch_open(self, on_event: Callable[[str, float], None], ready: threading.Event) -> Callable[[], None]:
        channel = new_channel(self._follower().client_addr)
        done = threading.Event()
        prefix = self.watch_prefix.encode()

        def requests() -> Iterator[rpc_pb2.WatchRequest]:
            yield rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(key=prefix,
                                                                                 range_end=prefix_end(prefix)))
            done.wait()  # keep the request side open until cancelled

        stream = rpc_pb2_grpc.WatchStub(channel).Watch(requests(), timeout=600)

        def consume() -> None:
            try:
                for msg in stream:
                    now = time.perf_counter()
                    if msg.created:
                        ready.set()
                    for e in msg.events:
                        on_event(e.kv.key.decode(), now)
            except grpc.RpcError:
                pass

        threading.Thread(target=consume, daemon=True, name="watch-etcd").start()

        def cancel() -> None:
            done.set()
            stream.cancel()
            channel.close()

        return cancel


# ---- echo (the ceiling) --------------------------------------------------------------------------

def _route_reply_size(topics: int) -> int:
    """Bytes of a GetRoute reply for a topic served by ROUTE_BROKERS brokers (what a route read carries)."""
    reply = api_pb2.GetRouteReply(apply_offset=1 << 20)
    for j in range(ROUTE_BROKERS):
        reply.route.broker_datas.add(cluster="BenchCluster", broker_name=f"route-b{j}",
                                     addrs=[state_pb2.BrokerAddr(broker_id=0, addr=f"10.78.0.{j + 1}:10911")])
        reply.route.queue_datas.add(broker_name=f"route-b{j}", read_queue_nums=4, write_queue_nums=4, perm=6)
    return reply.ByteSize()


class EchoTarget(Target):
    """Bare gRPC echo servers, one process per node of the clusters: registrations go to the first (the
    leader's role), reads are spread over all of them; each op echoes bytes the size of the workload's
    request (registration) or reply (route read)."""

    name = "ceiling"

    def __init__(self, addrs: list[str], pids: list[int], topics: int = 8) -> None:
        self.addrs = addrs
        self._pids = pids
        self.topics = topics
        name, addr, prefix = _reg_names(0)
        self.reg_payload = registration_request(name, addr, prefix, topics, 1).SerializeToString()
        self.read_payload = b"r" * _route_reply_size(topics)

    def pids(self) -> list[int]:
        return list(self._pids)

    def leader_endpoint(self) -> str:
        return self.addrs[0]

    def endpoints(self) -> dict[str, str]:
        return {a: f"echo{i + 1}" for i, a in enumerate(self.addrs)}

    def supports(self, workload: str) -> bool:
        return workload in ("registration", "route_reads")

    def _echo(self, channel: grpc.Channel, payload: bytes) -> Op:
        call = echo_stub(channel)

        def op() -> int:
            call(payload, timeout=10)
            return 0

        return op

    def registration_op(self, channel: grpc.Channel, worker: int) -> Op:
        return self._echo(channel, self.reg_payload)

    def reregistration_op(self, channel: grpc.Channel, worker: int) -> Op:
        return self._echo(channel, self.reg_payload)

    def route_read_op(self, channel: grpc.Channel, worker: int) -> Op:
        return self._echo(channel, self.read_payload)

    def linearizable_read_op(self, channel: grpc.Channel, worker: int) -> Op:
        return self._echo(channel, self.read_payload)


# ---- one target, every workload -------------------------------------------------------------------

def run_target(target: Target, seconds: float, concurrency: list[int], read_threads: int,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Every workload the target supports, one after another; the JSON section for that target."""
    out: dict[str, Any] = {"load_average_before": list(os.getloadavg())}
    pids = target.pids()
    if target.supports("registration"):
        out["registration"] = {}
        checks: list[dict[str, Any]] = []
        for c in concurrency:
            # checked per load: one load's records fit in a node's watch history, all of them may not
            mark = target.registration_mark()
            leader = target.leader_endpoint()
            res = run_load(functools.partial(with_channel, leader, target.registration_op), c, seconds, pids)
            out["registration"][str(c)] = res
            recs = f"{res['records_per_s']:.0f} records/s, " if res["records"] else ""
            log(f"  {target.name} registration c={c}: {recs}{res['per_s']:.0f} ops/s, p50 {res['p50_ms']} ms, "
                f"p99 {res['p99_ms']} ms, errors {res['errors']}")
            check = target.registration_check(mark)
            if check:
                checks.append({**check, "counted": res["records"]})
        if checks:
            counted = sum(ch["counted"] for ch in checks)
            in_cluster = None if any(ch["in_cluster"] is None for ch in checks) else \
                sum(ch["in_cluster"] for ch in checks)
            out["registration_check"] = {"counted": counted, "in_cluster": in_cluster, "ok": counted == in_cluster,
                                         "method": checks[0]["method"] + ", per load", "per_load": checks}
            log(f"  {target.name} registration check: counted {counted}, in cluster {in_cluster} "
                f"({checks[0]['method']}, per load)")
        out["reregistration"] = {}
        for c in concurrency:  # workers 0..c-1 registered above (every concurrency starts at worker 0)
            leader = target.leader_endpoint()
            res = run_load(functools.partial(with_channel, leader, target.reregistration_op), c, seconds, pids)
            out["reregistration"][str(c)] = res
            log(f"  {target.name} unchanged re-registration c={c}: {res['per_s']:.0f} ops/s, "
                f"p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms, records {res['records']}, errors {res['errors']}")
        # As a fleet does it: a RocketMQ broker registers with every nameserver in its list, so each node
        # receives every broker's re-registration. The clients spread over the nodes, round-robin.
        out["reregistration_spread"] = {}
        names = target.endpoints()
        spread_ep, _ = _spread(list(names), names)
        for c in concurrency:
            res = run_load(lambda i: with_channel(spread_ep(i), target.reregistration_op, i),
                           c, seconds, pids)
            out["reregistration_spread"][str(c)] = res
            log(f"  {target.name} unchanged re-registration over every node c={c}: {res['per_s']:.0f} ops/s, "
                f"p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms, records {res['records']}, errors {res['errors']}")
    target.setup_reads()
    names = target.endpoints()
    endpoint_of, node_of = _spread(list(names), names)
    for workload, make in (("route_reads", target.route_read_op), ("linearizable_reads", target.linearizable_read_op)):
        if not target.supports(workload):
            continue
        res = run_load(lambda i, mk=make: with_channel(endpoint_of(i), mk, i),  # type: ignore[misc]
                       read_threads, seconds, pids, group=node_of)
        out[workload] = res
        log(f"  {target.name} {workload} ({read_threads} threads): {res['per_s']:.0f}/s, p50 {res['p50_ms']} ms, "
            f"p99 {res['p99_ms']} ms, errors {res['errors']}")
    if target.supports("watch"):
        res = watch_propagation(target.watch_put, target.watch_open, seconds)
        out["watch"] = res
        log(f"  {target.name} watch propagation: p50 {res['p50_ms']} ms, p99 {res['p99_ms']} ms, "
            f"missing {res['missing']}")
    return out


def with_channel(endpoint: str, make: Callable[[grpc.Channel, int], Op], worker: int) -> tuple[grpc.Channel, Op]:
    channel = new_channel(endpoint)
    return channel, make(channel, worker)
