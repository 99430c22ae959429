"""Client: typed calls to a nameserver cluster with leader following, retries, deadlines and
read-your-writes.

- Writes go to the leader when known (any node forwards, but that costs a hop). Each logical write
  gets a fresh sequence number under this client's id (gRPC metadata x-client-id / x-client-seq) and
  keeps it for its retries, so a retry after an unknown outcome returns the first result instead of
  applying twice. Writes of one client are serialized, as the server keeps one result per client id.
- Reads rotate over the endpoints. Every read carries `min_offset` = the highest offset this client
  has seen (its writes' offsets and earlier reads' apply offsets): read-your-writes and monotonic
  reads, whichever node answers. On a cluster with several Raft groups (a reply's `offsets` vector,
  docs/api.md) the token is a vector, one offset a group: routes and the cluster info carry it as
  `min_offsets`, the other reads group 0's entry as `min_offset` (a write of a group-1 set raises
  only group 1's entry: its offset says nothing of group 0's log).
- UNAVAILABLE and DEADLINE_EXCEEDED are retried on another node with exponential backoff and full
  jitter, until the call's deadline. Other statuses raise NameServerError at once.
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc

from nameserver import headers
from nameserver.chunking import register_chunks, should_stream
from nameserver.client.credentials import PLAINTEXT, Credentials
from nameserver.client.endpoints import EndpointPool
from nameserver.client.errors import NameServerError, apply_offset_of, status_of
from nameserver.client.retry import RETRYABLE_CODES, Deadline, RetryPolicy
from nameserver.pb import api_pb2, state_pb2

_READ, _WRITE, _LEADER = "read", "write", "leader"



class Client:
    """A thread-safe client of one nameserver cluster.

    >>> client = Client("127.0.0.1:9101,127.0.0.1:9102,127.0.0.1:9103")  # doctest: +SKIP

    endpoints: "host:port,..." or a list; any subset of the cluster's nodes.
    timeout: default deadline of every call, in seconds (all attempts together); each method
        takes `timeout=` to override it. With `retry`, its deadline_s is the default instead.
    retry: backoff and per-attempt timeout (RetryPolicy).
    client_id: the exactly-once identity (default: random). Reusing an id across processes works
        because sequence numbers start from the wall clock in microseconds.
    read_your_writes: pass the highest offset seen as `min_offset` on every read (default on).
    credentials: TLS files and a bearer token for a secured cluster (default: plaintext).
    """

    def __init__(self, endpoints: str | Sequence[str], *, timeout: float = 10.0,
                 retry: RetryPolicy | None = None, client_id: str | None = None,
                 read_your_writes: bool = True, sleep: Callable[[float], None] = time.sleep,
                 credentials: Credentials = PLAINTEXT) -> None:
        self.pool = EndpointPool(endpoints, credentials=credentials)
        self.retry = retry or RetryPolicy(deadline_s=timeout)
        self.timeout = self.retry.deadline_s
        self.client_id = client_id or f"py-{uuid.uuid4().hex[:20]}"
        if not 1 <= len(self.client_id) <= 64 or "/" in self.client_id or not self.client_id.isprintable():
            raise ValueError("client_id must be 1..64 printable characters without '/'")
        self.read_your_writes = read_your_writes
        self._sleep = sleep
        self._seq = itertools.count(time.time_ns() // 1000)
        self._write_lock = threading.Lock()
        self._token_lock = threading.Lock()
        self._token = 0
        self._vector: list[int] = []  # with several groups: the highest offset seen in each, by group
        self.retries = 0  # attempts beyond the first, over the client's life (for metrics and tests)

    # ---- lifecycle ----

    def close(self) -> None:
        self.pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def last_offset(self) -> int:
        """The read-your-writes token: the highest write offset or read apply offset seen."""
        return self._token

    def observe(self, offset: int) -> None:
        """Raise the read-your-writes token (e.g. to an offset learned from another client)."""
        with self._token_lock:
            if offset > self._token:
                self._token = offset

    def _min_offset(self, explicit: int) -> int:
        return max(explicit, self._token) if self.read_your_writes else explicit

    def _min_offsets(self) -> list[int]:
        """The read-your-writes vector (empty: one group, or none seen yet)."""
        if not self.read_your_writes:
            return []
        with self._token_lock:
            return list(self._vector)

    def _observe_reply(self, reply: Any, kind: str) -> None:
        """Raise the token from a reply: its offset vector when the cluster has several groups (group 0's
        entry is the plain token), else its write offset or read apply offset."""
        vector = getattr(reply, "offsets", None)
        if not vector:
            self.observe(getattr(reply, "offset", 0) if kind == _WRITE else getattr(reply, "apply_offset", 0))
            return
        with self._token_lock:
            self._vector += [0] * (len(vector) - len(self._vector))
            for group, offset in enumerate(vector):
                self._vector[group] = max(self._vector[group], offset)
        self.observe(vector[0])

    # ---- the retry loop ----

    def _call(self, method: str, request: Any, kind: str = _READ, timeout: float | None = None,
              stub: str = "ns") -> Any:
        deadline = Deadline(timeout if timeout is not None else self.timeout)
        if kind == _WRITE:
            with self._write_lock:
                md = ((headers.CLIENT_ID, self.client_id), (headers.CLIENT_SEQ, str(next(self._seq))))
                return self._attempts(method, request, kind, deadline, md, stub)
        return self._attempts(method, request, kind, deadline, (), stub)

    def _attempts(self, method: str, request: Any, kind: str, deadline: Deadline,
                  metadata: tuple[tuple[str, str], ...], stub: str) -> Any:
        failed: str | None = None
        attempt = 0
        if kind != _READ and self.pool.leader is None:
            self.pool.discover_leader(timeout_s=max(0.05, min(1.0, deadline.remaining())))
        while True:
            addr = self.pool.next_endpoint(failed) if kind == _READ else self.pool.write_target(failed)
            target = self.pool.ns(addr) if stub == "ns" else self.pool.admin(addr)
            payload = iter(request) if isinstance(request, list) else request  # a stream: fresh per attempt
            try:
                reply = getattr(target, method)(
                    payload, timeout=max(0.05, deadline.attempt_timeout(self.retry.attempt_timeout_s)),
                    metadata=metadata or None)
            except grpc.RpcError as err:
                code, details = status_of(err)
                attempt += 1
                if code not in RETRYABLE_CODES or deadline.expired():
                    raise NameServerError(method, code, details, attempt, apply_offset_of(err)) from None
                failed = addr
                self.pool.mark_failed(addr)
                if kind != _READ:
                    self.pool.discover_leader(timeout_s=max(0.05, min(1.0, deadline.remaining())))
                self.retries += 1
                self._sleep(min(self.retry.backoff(attempt - 1), deadline.remaining()))
                continue
            self.pool.mark_ok(addr)
            self._observe_reply(reply, kind)
            return reply

    # ---- broker side ----

    def register_broker(self, request: api_pb2.RegisterBrokerRequest, *, timeout: float | None = None
                        ) -> api_pb2.RegisterBrokerReply:
        """Register (or re-register) a broker; tables over 5,000 topics go over the client stream."""
        if should_stream(request):
            return self._call("RegisterBrokerStream", register_chunks(request), _WRITE, timeout)
        return self._call("RegisterBroker", request, _WRITE, timeout)

    def unregister_broker(self, cluster_name: str, broker_name: str, broker_addr: str, broker_id: int = 0,
                          *, timeout: float | None = None) -> api_pb2.WriteReply:
        request = api_pb2.UnregisterBrokerRequest(cluster_name=cluster_name, broker_name=broker_name,
                                                  broker_addr=broker_addr, broker_id=broker_id)
        return self._call("UnregisterBroker", request, _WRITE, timeout)

    def heartbeat(self, heartbeats: Sequence[api_pb2.BrokerHeartbeat], *, timeout: float | None = None
                  ) -> list[str]:
        """Send heartbeats (to the leader when known); returns the addresses to register again."""
        reply = self._call("Heartbeat", api_pb2.HeartbeatRequest(heartbeats=heartbeats), _LEADER, timeout)
        return list(reply.unknown_addrs)

    # ---- reads ----

    def get_route(self, topic: str, *, min_offset: int = 0, zone_name: str = "",
                  timeout: float | None = None) -> api_pb2.GetRouteReply:
        """A topic's route; NameServerError with code NOT_FOUND when the topic has none."""
        request = api_pb2.GetRouteRequest(topic=topic, min_offset=self._min_offset(min_offset),
                                          zone_name=zone_name, min_offsets=self._min_offsets())
        return self._call("GetRoute", request, _READ, timeout)

    def get_cluster_info(self, *, min_offset: int = 0, timeout: float | None = None
                         ) -> api_pb2.GetClusterInfoReply:
        request = api_pb2.GetClusterInfoRequest(min_offset=self._min_offset(min_offset),
                                                min_offsets=self._min_offsets())
        return self._call("GetClusterInfo", request, _READ, timeout)

    def get_topic_list(self, kind: api_pb2.TopicListKind = api_pb2.TOPIC_LIST_ALL, cluster_name: str = "", *,
                       min_offset: int = 0, timeout: float | None = None) -> list[str]:
        request = api_pb2.GetTopicListRequest(kind=kind, cluster_name=cluster_name,
                                              min_offset=self._min_offset(min_offset))
        return list(self._call("GetTopicList", request, _READ, timeout).topics)

    def get_broker_member_group(self, cluster_name: str, broker_name: str, *, min_offset: int = 0,
                                timeout: float | None = None) -> list[state_pb2.BrokerAddr]:
        request = api_pb2.GetBrokerMemberGroupRequest(cluster_name=cluster_name, broker_name=broker_name,
                                                      min_offset=self._min_offset(min_offset))
        return list(self._call("GetBrokerMemberGroup", request, _READ, timeout).addrs)

    # ---- KV config ----

    def put_kv(self, namespace: str, key: str, value: str, *, timeout: float | None = None
               ) -> api_pb2.WriteReply:
        request = api_pb2.PutKvRequest(namespace=namespace, key=key, value=value)
        return self._call("PutKv", request, _WRITE, timeout)

    def get_kv(self, namespace: str, key: str, *, min_offset: int = 0, timeout: float | None = None
               ) -> str | None:
        """The value, or None when the key does not exist."""
        request = api_pb2.GetKvRequest(namespace=namespace, key=key, min_offset=self._min_offset(min_offset))
        try:
            return self._call("GetKv", request, _READ, timeout).value
        except NameServerError as err:
            if err.code == grpc.StatusCode.NOT_FOUND:
                return None
            raise

    def delete_kv(self, namespace: str, key: str, *, timeout: float | None = None) -> api_pb2.WriteReply:
        request = api_pb2.DeleteKvRequest(namespace=namespace, key=key)
        return self._call("DeleteKv", request, _WRITE, timeout)

    def list_kv(self, namespace: str, *, min_offset: int = 0, timeout: float | None = None
                ) -> dict[str, str]:
        request = api_pb2.ListKvRequest(namespace=namespace, min_offset=self._min_offset(min_offset))
        return dict(self._call("ListKv", request, _READ, timeout).table)

    # ---- topics and permissions ----

    def wipe_write_perm(self, broker_name: str, *, timeout: float | None = None) -> api_pb2.BrokerPermReply:
        return self._call("WipeWritePerm", api_pb2.BrokerPermRequest(broker_name=broker_name), _WRITE, timeout)

    def add_write_perm(self, broker_name: str, *, timeout: float | None = None) -> api_pb2.BrokerPermReply:
        return self._call("AddWritePerm", api_pb2.BrokerPermRequest(broker_name=broker_name), _WRITE, timeout)

    def register_topic(self, topic: str, queue_datas: Sequence[state_pb2.QueueData], *,
                       timeout: float | None = None) -> api_pb2.WriteReply:
        request = api_pb2.RegisterTopicRequest(topic=topic, queue_datas=queue_datas)
        return self._call("RegisterTopic", request, _WRITE, timeout)

    def delete_topic(self, topic: str, cluster_name: str = "", *, timeout: float | None = None
                     ) -> api_pb2.WriteReply:
        request = api_pb2.DeleteTopicRequest(topic=topic, cluster_name=cluster_name)
        return self._call("DeleteTopic", request, _WRITE, timeout)

    # ---- queue bindings ----

    def bind_queue(self, topic: str, queue_id: int, owner: str, expected_version: int = 0, *,
                   timeout: float | None = None) -> api_pb2.BindingReply:
        """Compare-and-set: FAILED_PRECONDITION (NameServerError) when the version does not match."""
        request = api_pb2.BindQueueRequest(topic=topic, queue_id=queue_id, owner=owner,
                                           expected_version=expected_version)
        return self._call("BindQueue", request, _WRITE, timeout)

    def release_queue(self, topic: str, queue_id: int, expected_version: int, *,
                      timeout: float | None = None) -> api_pb2.BindingReply:
        request = api_pb2.ReleaseQueueRequest(topic=topic, queue_id=queue_id, expected_version=expected_version)
        return self._call("ReleaseQueue", request, _WRITE, timeout)

    def get_binding(self, topic: str, queue_id: int, *,
                    consistency: api_pb2.Consistency = api_pb2.LINEARIZABLE,
                    min_offset: int = 0, timeout: float | None = None) -> api_pb2.GetBindingReply:
        request = api_pb2.GetBindingRequest(topic=topic, queue_id=queue_id, consistency=consistency,
                                            min_offset=self._min_offset(min_offset))
        return self._call("GetBinding", request, _READ, timeout)

    def list_bindings(self, topic: str, *, consistency: api_pb2.Consistency = api_pb2.LINEARIZABLE,
                      min_offset: int = 0,
                      timeout: float | None = None) -> list[api_pb2.QueueBinding]:
        request = api_pb2.ListBindingsRequest(topic=topic, consistency=consistency,
                                              min_offset=self._min_offset(min_offset))
        return list(self._call("ListBindings", request, _READ, timeout).bindings)

    # ---- watch and admin ----

    def watch(self, key_prefixes: Sequence[str] = (), topics: Sequence[str] = (), start_offset: int = 0,
              progress_interval_ms: int = 0, endpoint: str | None = None) -> Iterator[api_pb2.WatchResponse]:
        """One raw Watch stream on one node (no resumption: RouteCache does that). Cancel it with
        `.cancel()` on the returned iterator."""
        request = api_pb2.WatchRequest(key_prefixes=key_prefixes, topics=topics, start_offset=start_offset,
                                       progress_interval_ms=progress_interval_ms)
        return self.pool.ns(endpoint or self.pool.next_endpoint()).Watch(request)

    def status(self, endpoint: str | None = None, *, timeout: float = 2.0) -> api_pb2.NodeStatus:
        """Admin.Status of one node (the given endpoint, else whichever answers first)."""
        if endpoint is not None:
            try:
                return self.pool.admin(endpoint).Status(api_pb2.StatusRequest(), timeout=timeout)
            except grpc.RpcError as err:
                code, details = status_of(err)
                raise NameServerError("Status", code, details) from None
        return self._call("Status", api_pb2.StatusRequest(), _READ, timeout, stub="admin")

    def leader(self, *, timeout: float = 2.0) -> str | None:
        """The leader's gRPC address as the cluster reports it now (None during an election)."""
        return self.pool.discover_leader(timeout_s=timeout)
