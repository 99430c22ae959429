"""Client retries, backoff, deadlines, exactly-once metadata and read-your-writes, over fake stubs."""

from __future__ import annotations

import time
from typing import Any

import grpc
import pytest

from nameserver import headers
from nameserver.client import Client, EndpointPool, NameServerError, RetryPolicy, parse_endpoints
from nameserver.pb import api_pb2


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str = "", trailers: tuple = ()) -> None:
        self._code, self._details, self._trailers = code, details, trailers

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple:
        return self._trailers


class FakeStub:
    """Records every call as (endpoint, method, request, metadata); answers from a script."""

    def __init__(self, script: list[Any]) -> None:
        self.script = script
        self.calls: list[tuple[str, str, Any, dict[str, str]]] = []

    def bind(self, addr: str) -> Any:
        stub = self

        class Bound:
            def __getattr__(self, method: str) -> Any:
                def call(request: Any, timeout: float, metadata: Any = None) -> Any:
                    assert timeout > 0
                    stub.calls.append((addr, method, request, dict(metadata or ())))
                    outcome = stub.script.pop(0)
                    if isinstance(outcome, Exception):
                        raise outcome
                    return outcome
                return call

        return Bound()


def make_client(script: list[Any], deadline: float = 5.0, leader: str | None = "n1:1",
                sleep: Any = lambda s: None) -> tuple[Client, FakeStub]:
    client = Client("n1:1,n2:2,n3:3", retry=RetryPolicy(deadline_s=deadline, attempt_timeout_s=1.0,
                                                         rand=lambda: 0.5), sleep=sleep)
    stub = FakeStub(script)
    client.pool.ns = stub.bind  # type: ignore[method-assign]
    client.pool.set_leader(leader)
    client.pool.discover_leader = lambda timeout_s=1.0: client.pool.leader  # type: ignore[method-assign]
    return client, stub


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    top = RetryPolicy(initial_backoff_s=0.1, max_backoff_s=1.0, rand=lambda: 1.0)
    assert [round(top.backoff(n), 3) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert RetryPolicy(rand=lambda: 0.0).backoff(5) == 0.0
    with pytest.raises(ValueError):
        RetryPolicy(initial_backoff_s=2.0, max_backoff_s=1.0)


def test_parse_endpoints() -> None:
    assert parse_endpoints(" a:1, b:2,a:1 ") == ["a:1", "b:2"]
    for bad in ("", "a", "a:x", ":1"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


def test_a_write_retried_after_an_unknown_outcome_keeps_its_sequence() -> None:
    ok = api_pb2.WriteReply(offset=42, records=1)
    client, stub = make_client([FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED),
                                FakeRpcError(grpc.StatusCode.UNAVAILABLE, "no leader"), ok,
                                api_pb2.WriteReply(offset=43, records=1)])
    assert client.put_kv("NS", "k", "v").offset == 42
    client.put_kv("NS", "k", "w")
    seqs = [int(md[headers.CLIENT_SEQ]) for _, _, _, md in stub.calls]
    assert seqs[0] == seqs[1] == seqs[2] < seqs[3]
    assert {md[headers.CLIENT_ID] for _, _, _, md in stub.calls} == {client.client_id}
    assert stub.calls[0][0] == "n1:1" and stub.calls[1][0] != "n1:1"  # moved off the failing leader
    assert client.retries == 2


def test_non_retryable_status_raises_at_once() -> None:
    client, stub = make_client([FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "topic: bad")])
    with pytest.raises(NameServerError) as err:
        client.delete_topic("bad topic")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and err.value.attempts == 1
    assert len(stub.calls) == 1


def test_reads_carry_the_highest_offset_seen_and_rotate_nodes() -> None:
    route = api_pb2.GetRouteReply(apply_offset=50)
    client, stub = make_client([api_pb2.WriteReply(offset=40, records=1), route,
                                FakeRpcError(grpc.StatusCode.UNAVAILABLE, "behind", ((headers.APPLY_OFFSET, "45"),)),
                                route])
    client.put_kv("NS", "k", "v")
    client.get_route("T")
    assert stub.calls[1][2].min_offset == 40
    assert client.last_offset == 50
    client.get_route("T")
    (first, _, req1, _), (second, _, req2, _) = stub.calls[2], stub.calls[3]
    assert req1.min_offset == req2.min_offset == 50 and first != second


def test_read_your_writes_can_be_turned_off() -> None:
    client, stub = make_client([api_pb2.WriteReply(offset=40, records=1), api_pb2.GetRouteReply()])
    client.read_your_writes = False
    client.put_kv("NS", "k", "v")
    client.get_route("T", min_offset=7)
    assert stub.calls[1][2].min_offset == 7


def test_retries_stop_at_the_deadline() -> None:
    client, stub = make_client([FakeRpcError(grpc.StatusCode.UNAVAILABLE, "down")] * 1000, deadline=0.3,
                               sleep=time.sleep)
    with pytest.raises(NameServerError) as err:
        client.get_cluster_info()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.attempts == len(stub.calls) > 1


def test_not_found_kv_is_none() -> None:
    client, _ = make_client([FakeRpcError(grpc.StatusCode.NOT_FOUND, "no KV config")])
    assert client.get_kv("NS", "missing") is None


def test_large_registrations_go_over_the_stream() -> None:
    client, stub = make_client([api_pb2.RegisterBrokerReply(offset=9, records=12_003)])
    topics = [api_pb2.TopicConfig(topic_name=f"T{i}", read_queue_nums=1, write_queue_nums=1, perm=6)
              for i in range(12_000)]
    client.register_broker(api_pb2.RegisterBrokerRequest(cluster_name="C", broker_name="b",
                                                         broker_addr="10.0.0.1:1", topics=topics))
    _, method, chunks, _ = stub.calls[0]
    chunks = list(chunks)
    assert method == "RegisterBrokerStream" and len(chunks) == 4
    assert chunks[0].WhichOneof("part") == "header" and len(chunks[3].topics.topics) == 2000


def test_pool_cools_down_failed_endpoints_and_tracks_the_leader() -> None:
    now = [0.0]
    pool = EndpointPool("a:1,b:2,c:3", cooldown_s=1.0, clock=lambda: now[0])
    pool.set_leader("b:2")
    assert pool.write_target() == "b:2"
    pool.mark_failed("b:2")
    assert pool.leader is None
    assert "b:2" not in {pool.next_endpoint() for _ in range(6)}
    now[0] = 1.5
    assert "b:2" in {pool.next_endpoint() for _ in range(6)}
    pool.set_leader("d:4")  # learned from a Status reply: becomes an endpoint
    assert "d:4" in pool.endpoints
