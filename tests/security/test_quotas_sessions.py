"""The state-side attacks (issue 11, defects 10-12) against a real secure 3-node cluster.

12: a broker token floods exactly-once sessions while the admin holds an idle one; the admin's retry
    is answered from its own session (never applied a second time), and once the admin's OWN sessions
    evict it, the retry is refused naming the evicted session.
11: every quota of the state crossed: refused naming the quota, nothing appended, the node serving,
    the totals and limits in /metrics.
10: several huge registrations at once, while another caller writes: no election, writes acknowledged
    within 2 s, the followers' memory bounded.

The short run uses small quotas (each crossed in seconds); SECURITY_LONG=1 runs the probe's sizes.
"""

from __future__ import annotations

import concurrent.futures
import re
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from nameserver import headers
from nameserver.chunking import register_chunks
from nameserver.pb import api_pb2, api_pb2_grpc
from tests.cluster import NodeProc, register_request
from tests.fakebroker import FakeBroker
from tests.security.attacks import (
    LONG,
    SHORT_LIMITS,
    Secure,
    Writer,
    eventually,
    rss_mib,
    secure_cluster,
    threads,
)

pytestmark = pytest.mark.cluster

SESSIONS = {"max_sessions": 2000, "max_sessions_per_owner": 500} if LONG else \
    {"max_sessions": 300, "max_sessions_per_owner": 40}
FLOOD_SESSIONS = 8000 if LONG else 500
BIG_TOPICS = 100_000 if LONG else 20_000   # topics per huge registration
BIG_AT_ONCE = 4
# max_kv_keys leaves room for the Writers' keys (one per write, 5 a second) in the long run too
QUOTAS = {"max_queue_datas": BIG_AT_ONCE * BIG_TOPICS + 20_000, "max_brokers": 40,
          "max_kv_keys": 2000 if LONG else 400,
          "max_kv_bytes": 4 << 20, "registration_topics_in_flight": BIG_TOPICS}


@pytest.fixture(scope="module")
def sec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secure]:
    limits = (QUOTAS if LONG else SHORT_LIMITS | QUOTAS)
    s = secure_cluster(str(tmp_path_factory.mktemp("quotas")), limits, sections={"sessions": SESSIONS})
    s.cluster.start()
    try:
        s.cluster.wait_ready(timeout=60)
        s.cluster.wait_converged(timeout=60)
        yield s
    finally:
        s.cluster.stop(wait=False)  # the nodes shut down while the next test starts


def _leader(sec: Secure) -> NodeProc:
    leader = sec.cluster.wait_ready(timeout=30)
    assert leader is not None
    return leader


def _terms(sec: Secure) -> list[int]:
    out = []
    for n in sec.cluster.nodes:
        st = n.status(timeout=5)
        assert st is not None, f"{n.name} did not answer Status"
        out.append(st.term)
    return out


def _metrics(node: NodeProc) -> str:
    with urllib.request.urlopen(f"http://{node.metrics_addr}/metrics", timeout=5) as r:
        return r.read().decode()


def _applied(node: NodeProc, *types: str) -> float:
    """Records of these types this node applied (nameserver_records_applied): the log's end offset
    moves with the Writer and the idle leader's no-ops, these do not."""
    found = [float(m.group(2)) for m in re.finditer(
        r'^nameserver_records_applied_total\{(.*)\} (\S+)$', _metrics(node), re.M)
        if re.search(r'type="(\w+)"', m.group(1)).group(1) in types]  # type: ignore[union-attr]
    assert found, f"no nameserver_records_applied of {types} on {node.name}"
    return sum(found)


def _quota(node: NodeProc, name: str) -> tuple[float, float]:
    """(used, limit) of one quota from the node's /metrics."""
    text = _metrics(node)
    found = {m.group(1): float(m.group(2)) for m in re.finditer(
        rf'^nameserver_quota_(used|limit)\{{quota="{name}"\}} (\S+)$', text, re.M)}
    assert set(found) == {"used", "limit"}, f"no nameserver_quota_used/limit for {name} in /metrics"
    return found["used"], found["limit"]


def _refused(err: pytest.ExceptionInfo[grpc.RpcError], quota: str) -> None:
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value
    assert quota in (err.value.details() or ""), err.value.details()


def _session(cid: str, seq: int) -> list[tuple[str, str]]:
    return [(headers.CLIENT_ID, cid), (headers.CLIENT_SEQ, str(seq))]


# ---- 12: exactly-once sessions belong to their owner -----------------------------------------------


def test_12_a_session_flood_never_evicts_another_owners_session(sec: Secure) -> None:
    leader = _leader(sec)
    admin = sec.stub(leader, "admin")
    put = api_pb2.PutKvRequest(namespace="S12", key="once", value="1")
    first = admin.PutKv(put, timeout=10, metadata=_session("admin-idle", 1))
    assert first.records > 0
    terms, base_rss, base_threads = _terms(sec), rss_mib(leader), threads(leader)
    broker = sec.stub(leader, "broker")

    def flood(lane: int) -> list[str]:
        """One broker address per flooding thread, a new client id per registration."""
        out = []
        for i in range(lane, FLOOD_SESSIONS, 8):
            req = register_request("C12", f"flood{lane}", f"10.12.0.{lane}:10911", ["T12"], counter=i + 2,
                                   timeout_ms=600_000)
            try:
                broker.RegisterBroker(req, timeout=10, metadata=_session(f"flood-{i}", 1))
                out.append("ok")
            except grpc.RpcError as exc:
                out.append(exc.code().name)
        return out

    with Writer(sec.stub(leader, "admin"), tag="s12-", cluster=sec.cluster) as writer, \
            concurrent.futures.ThreadPoolExecutor(8) as pool:
        outcomes = [o for lane in pool.map(flood, range(8)) for o in lane]
        # (a few may lose every race for one of the owner's oldest sessions: UNAVAILABLE, safe to resend)
        assert outcomes.count("ok") >= FLOOD_SESSIONS * 0.95 and set(outcomes) <= {"ok", "UNAVAILABLE"}, \
            {o: outcomes.count(o) for o in set(outcomes)}
        time.sleep(1.5)  # a session expiry scan (liveness.scan_interval_ms = 1000) has run since
        used, _ = _quota(leader, "max_sessions")
        # its quota, the writes in flight at once (each checks the applied state), the admin's one
        bound = SESSIONS["max_sessions_per_owner"] + 8 + 1
        assert used <= bound, f"{used} live sessions: the flood was not bounded (bound {bound})"
        assert rss_mib(leader) - base_rss < 100, f"leader RSS grew {rss_mib(leader) - base_rss:.0f} MiB (bound 100)"
        assert threads(leader) <= base_threads + 16
    writer.check()
    assert _terms(sec) == terms, "an election happened during the flood"
    # the admin's idle session survived another owner's flood: its retry is answered, not applied again
    again = admin.PutKv(put, timeout=10, metadata=_session("admin-idle", 1))
    assert again.offset == first.offset, f"the retry was applied again (offset {first.offset}, then {again.offset})"

    # the admin's OWN sessions evict it (its quota; each eviction picks one of the owner's 16 oldest):
    # the retry is then refused, naming the session
    for i in range(SESSIONS["max_sessions_per_owner"] + 200):
        admin.PutKv(api_pb2.PutKvRequest(namespace="S12", key="own", value=str(i)), timeout=10,
                    metadata=_session(f"admin-own-{i}", 1))
        if i >= SESSIONS["max_sessions_per_owner"] and i % 8 == 0:
            try:
                assert admin.PutKv(put, timeout=10, metadata=_session("admin-idle", 1)).offset == first.offset
            except grpc.RpcError:
                break  # evicted
    end = _applied(leader, "KV_CONFIG", "CLIENT_SESSION")
    for node in (leader, sec.cluster.followers()[0]):  # directly, and across the forwarding path
        with pytest.raises(grpc.RpcError) as err:
            sec.stub(node, "admin").PutKv(put, timeout=10, metadata=_session("admin-idle", 1))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION, err.value
        assert "session admin-idle expired or was evicted; sequence 1 cannot be checked" in (
            err.value.details() or ""), err.value.details()
    assert _applied(leader, "KV_CONFIG", "CLIENT_SESSION") == end, "a refused retry wrote records"
    # a new sequence is a new write: it opens the session again
    assert admin.PutKv(put, timeout=10, metadata=_session("admin-idle", 2)).offset > 0


# ---- 10: huge registrations at once --------------------------------------------------------------


def test_10_huge_registrations_at_once_do_not_stall_writes_or_cost_an_election(sec: Secure) -> None:
    leader = _leader(sec)
    followers = sec.cluster.followers()
    terms = _terms(sec)
    base = {n.name: rss_mib(n) for n in followers}
    held_before = _quota(leader, "max_queue_datas")[0]
    brokers = [FakeBroker(f"big{i}", cluster="C10").start() for i in range(BIG_AT_ONCE)]

    def register(b: FakeBroker) -> str:
        resp = b.register(leader.remoting_addr, [f"B10-{b.name}-{t}" for t in range(BIG_TOPICS)], timeout=120)
        return "ok" if resp.code == 0 else resp.remark or str(resp.code)

    try:
        with Writer(sec.stub(leader, "admin"), tag="s10-", cluster=sec.cluster) as writer, \
                concurrent.futures.ThreadPoolExecutor(BIG_AT_ONCE) as pool:
            outcomes = list(pool.map(register, brokers))
            grown = {n.name: rss_mib(n) - base[n.name] for n in followers}
        writer.check()
        assert _terms(sec) == terms, "an election happened during the registrations"
        # each written, or refused after waiting its turn: never left timed out with its outcome unknown
        # (without the budget, 20,000-topic registrations at once time out here in the short run)
        for o in outcomes:
            assert o == "ok" or "limits.registration_topics_in_flight" in o, o
        assert "ok" in outcomes
        # ~1.2 KiB of resident memory per queue data, and room for the apply's transient copies
        bound = BIG_AT_ONCE * BIG_TOPICS * 1.5 / 1024 + 80
        assert max(grown.values()) < bound, f"follower RSS grew {grown} MiB (bound {bound:.0f})"
    finally:
        for b in brokers:
            b.stop()  # its connection closes: the nameserver unregisters it
        eventually("the huge registrations' brokers unregistered",
                   lambda: _quota(leader, "max_queue_datas")[0] <= held_before, timeout=30)


# ---- 11: quotas of the state ----------------------------------------------------------------------


def test_11_each_quota_is_refused_by_name_and_nothing_is_appended(sec: Secure) -> None:
    leader = _leader(sec)
    admin = sec.stub(leader, "admin")
    terms = _terms(sec)
    with Writer(sec.stub(leader, "admin"), tag="s11-", cluster=sec.cluster) as writer:
        _cross_queue_datas(sec, leader)
        _cross_brokers(sec, leader)
    writer.check()
    _cross_kv(sec, leader, admin)
    assert _terms(sec) == terms
    for name in ("max_queue_datas", "max_brokers", "max_kv_keys", "max_kv_bytes"):
        used, limit = _quota(leader, name)
        assert limit == QUOTAS[name] and 0 <= used <= limit, (name, used, limit)


def _register(stub: api_pb2_grpc.NameServerStub, req: api_pb2.RegisterBrokerRequest) -> api_pb2.RegisterBrokerReply:
    return stub.RegisterBrokerStream(iter(register_chunks(req)), timeout=60)


def _cross_queue_datas(sec: Secure, leader: NodeProc) -> None:
    broker = sec.stub(leader, "broker")
    used, limit = _quota(leader, "max_queue_datas")
    left, n = int(limit - used), 0
    while left > BIG_TOPICS:  # fill up to the last few thousand, one broker name per BIG_TOPICS topics
        n += 1
        _register(broker, register_request("C11", f"fill{n}", f"10.11.1.{n}:10911",
                                           [f"Q11-{n}-{t}" for t in range(BIG_TOPICS)], timeout_ms=600_000))
        left -= BIG_TOPICS
    end = _applied(leader, "TOPIC_QUEUE", "BROKER", "BROKER_LIVE")
    over = register_request("C11", "over", "10.11.2.1:10911", [f"Q11-over-{t}" for t in range(left + 1)],
                            timeout_ms=600_000)
    with pytest.raises(grpc.RpcError) as err:
        _register(broker, over)
    _refused(err, "limits.max_queue_datas")
    # the same over remoting: a SYSTEM_ERROR whose remark names the quota
    fake = FakeBroker("over-remoting", cluster="C11").start()
    try:
        resp = fake.register(leader.remoting_addr, [f"Q11-r-{t}" for t in range(left + 1)])
        assert resp.code != 0 and "limits.max_queue_datas" in (resp.remark or ""), (resp.code, resp.remark)
    finally:
        fake.stop()
    assert _applied(leader, "TOPIC_QUEUE", "BROKER", "BROKER_LIVE") == end, "a refused registration wrote records"
    assert _quota(leader, "max_queue_datas")[0] <= limit


def _cross_brokers(sec: Secure, leader: NodeProc) -> None:
    broker = sec.stub(leader, "broker")
    used, limit = _quota(leader, "max_brokers")
    for i in range(int(limit - used)):
        broker.RegisterBroker(register_request("C11", f"many{i}", f"10.11.3.{i}:10911", [], timeout_ms=600_000),
                              timeout=10)
    end = _applied(leader, "TOPIC_QUEUE", "BROKER", "BROKER_LIVE")
    with pytest.raises(grpc.RpcError) as err:
        broker.RegisterBroker(register_request("C11", "one-more", "10.11.4.1:10911", [], timeout_ms=600_000),
                              timeout=10)
    _refused(err, "limits.max_brokers")
    assert _applied(leader, "TOPIC_QUEUE", "BROKER", "BROKER_LIVE") == end
    # an address already registered still registers again (no growth)
    assert broker.RegisterBroker(register_request("C11", "many0", "10.11.3.0:10911", [], counter=2,
                                                  timeout_ms=600_000), timeout=10).offset > 0
    for i in range(int(limit - used)):  # room again for the other tests' brokers
        broker.UnregisterBroker(api_pb2.UnregisterBrokerRequest(cluster_name="C11", broker_name=f"many{i}",
                                                                broker_addr=f"10.11.3.{i}:10911"), timeout=10)


def _cross_kv(sec: Secure, leader: NodeProc, admin: api_pb2_grpc.NameServerStub) -> None:
    used, limit = _quota(leader, "max_kv_keys")
    fill = [f"k{i}" for i in range(int(limit - used) - 1)]  # the namespace record counts one
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: admin.PutKv(api_pb2.PutKvRequest(namespace="FILL11", key=k, value="v"),
                                            timeout=10), fill))
    end = _applied(leader, "KV_CONFIG", "KV_NAMESPACE")
    with pytest.raises(grpc.RpcError) as err:
        admin.PutKv(api_pb2.PutKvRequest(namespace="FILL11", key="over", value="v"), timeout=10)
    _refused(err, "limits.max_kv_keys")
    assert _applied(leader, "KV_CONFIG", "KV_NAMESPACE") == end
    assert admin.PutKv(api_pb2.PutKvRequest(namespace="FILL11", key="k0", value="w"), timeout=10).offset > 0
    assert admin.GetKv(api_pb2.GetKvRequest(namespace="FILL11", key="k0"), timeout=10).value == "w"
    for k in fill:  # deleting always passes: room again
        admin.DeleteKv(api_pb2.DeleteKvRequest(namespace="FILL11", key=k), timeout=10)

    used_bytes, limit_bytes = _quota(leader, "max_kv_bytes")
    value = "x" * (512 << 10)
    with pytest.raises(grpc.RpcError) as err:
        for i in range(int((limit_bytes - used_bytes) // len(value)) + 2):
            admin.PutKv(api_pb2.PutKvRequest(namespace="BYTES11", key=f"b{i}", value=value), timeout=10)
    _refused(err, "limits.max_kv_bytes")
    assert _quota(leader, "max_kv_bytes")[0] <= limit_bytes
    for i in range(int((limit_bytes - used_bytes) // len(value)) + 2):
        admin.DeleteKv(api_pb2.DeleteKvRequest(namespace="BYTES11", key=f"b{i}"), timeout=10)
    t0 = time.monotonic()
    admin.PutKv(api_pb2.PutKvRequest(namespace="S11", key="after", value="1"), timeout=5)
    assert time.monotonic() - t0 < 2.0


def test_every_node_serves_after_the_quota_attacks(sec: Secure) -> None:
    for n in sec.cluster.nodes:
        assert n.alive, f"{n.name} exited:\n{sec.cluster.logs()}"
    sec.cluster.wait_converged(timeout=60)
