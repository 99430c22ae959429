"""Apache RocketMQ's mqadmin (org.apache.rocketmq.tools.command.MQAdminStartup) against our 3 remoting ports."""

from __future__ import annotations

import json
import re
import time

import pytest

from . import jars, remoting
from .conftest import CLUSTER, Deployment
from .recorder import parse_body
from .traffic import create_topic, produce

pytestmark = pytest.mark.interop


def _ok(r) -> str:
    assert r.returncode == 0, f"mqadmin exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    assert "Exception" not in r.stdout, r.stdout
    assert "Exception" not in r.stderr, f"{r.stdout}\n{r.stderr[-3000:]}"
    return r.stdout


def _broker_stats(d: Deployment, *args: str) -> str:
    """clusterList/brokerStatus ask each broker for its runtime stats. A 4.9.7 broker's first seconds
    answer those with NoSuchElementException (LinkedList.getLast on its still-empty TPS samples), a
    broker-side race unrelated to the nameserver: ask again for a few seconds."""
    deadline = time.monotonic() + 20
    while True:
        r = d.rmq.mqadmin(*args, namesrv=d.namesrv)
        if "NoSuchElementException" not in r.stdout + r.stderr or time.monotonic() > deadline:
            return _ok(r)
        time.sleep(1)


def test_cluster_list(deployment: Deployment) -> None:
    d = deployment
    out = _broker_stats(d, "clusterList")
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(CLUSTER)]
    got = sorted((r[1], r[2], r[3]) for r in rows)
    b = d.brokers
    assert got == sorted([("broker-a", "0", b["a0"].addr), ("broker-a", "1", b["a1"].addr),
                          ("broker-b", "0", b["b0"].addr)]), out


def test_topic_list_and_topic_route(deployment: Deployment) -> None:
    d = deployment
    out = _ok(d.rmq.mqadmin("topicList", namesrv=d.namesrv))
    topics = set(out.split())
    assert {"TBW102", "SELF_TEST_TOPIC", CLUSTER, "broker-a", "broker-b"} <= topics, out
    out = _ok(d.rmq.mqadmin("topicRoute", "-t", "broker-b", namesrv=d.namesrv))
    route = parse_body(out[out.index("{"):].encode())  # fastjson's pretty form: unquoted integer keys
    assert [q["brokerName"] for q in route["queueDatas"]] == ["broker-b"]
    assert route["brokerDatas"][0]["brokerAddrs"] == {"0": d.brokers["b0"].addr}


def test_update_topic_then_delete_topic(deployment: Deployment) -> None:
    d = deployment
    topic = "InteropAdminTopic"
    create_topic(d, topic, queues=3)  # updateTopic -c: created on both masters, registered on every node
    for addr in d.addrs:
        qds = remoting.route(addr, topic)["queueDatas"]
        assert sorted((q["brokerName"], q["readQueueNums"], q["writeQueueNums"]) for q in qds) == [
            ("broker-a", 3, 3), ("broker-b", 3, 3)]
    out = _ok(d.rmq.mqadmin("deleteTopic", "-c", CLUSTER, "-t", topic, namesrv=d.namesrv))
    assert "success" in out, out
    d.wait_route(topic, lambda r: r is None, timeout=30)


def test_kv_config_update_get_delete(deployment: Deployment) -> None:
    d = deployment
    ns, key = "INTEROP_NS", "interopKey"
    _ok(d.rmq.mqadmin("updateKvConfig", "-s", ns, "-k", key, "-v", "v1", namesrv=d.namesrv))
    for addr in d.addrs:  # mqadmin has no getKvConfig: GET_KV_CONFIG (101) and GET_KVLIST_BY_NAMESPACE (219)
        r = remoting.call(addr, 101, {"namespace": ns, "key": key})
        assert (r.code, r.ext_fields.get("value")) == (0, "v1"), (addr, r)
        r = remoting.call(addr, 219, {"namespace": ns})
        assert r.code == 0 and json.loads(r.body) == {"table": {key: "v1"}}, (addr, r)
    _ok(d.rmq.mqadmin("deleteKvConfig", "-s", ns, "-k", key, namesrv=d.namesrv))
    for addr in d.addrs:
        r = remoting.call(addr, 101, {"namespace": ns, "key": key})
        assert r.code == 22, (addr, r)


def test_kv_list_of_emptied_namespace_is_an_empty_table(deployment: Deployment) -> None:
    """As the stock NameServer: 219 on a namespace whose last key was deleted answers SUCCESS with
    {"table":{}} (KVConfigManager keeps the emptied map)."""
    d = deployment
    ns = "INTEROP_NS_EMPTIED"
    _ok(d.rmq.mqadmin("updateKvConfig", "-s", ns, "-k", "k", "-v", "v", namesrv=d.namesrv))
    _ok(d.rmq.mqadmin("deleteKvConfig", "-s", ns, "-k", "k", namesrv=d.namesrv))
    r = remoting.call(d.addrs[0], 219, {"namespace": ns})
    assert r.code == 0 and json.loads(r.body or b"{}").get("table") == {}, (r.code, r.remark, r.body)


def test_wipe_and_add_write_perm(deployment: Deployment) -> None:
    d = deployment
    out = _ok(d.rmq.mqadmin("wipeWritePerm", "-b", "broker-b", namesrv=d.namesrv))
    counts = [int(x) for x in re.findall(r"OK, (\d+)", out)]
    assert len(counts) == 3 and counts[0] > 0, out  # one line per name server in -n
    d.wait_route("broker-b", lambda r: r is not None and all(not q["perm"] & 2 for q in r["queueDatas"]),
                 timeout=20)
    out = _ok(d.rmq.mqadmin("addWritePerm", "-b", "broker-b", namesrv=d.namesrv))
    counts = [int(x) for x in re.findall(r"OK, (\d+)", out)]
    assert len(counts) == 3 and counts[0] > 0, out
    d.wait_route("broker-b", lambda r: r is not None and all(q["perm"] & 6 == 6 for q in r["queueDatas"]),
                 timeout=20)


def test_broker_status_through_our_cluster_info(deployment: Deployment) -> None:
    d = deployment
    out = _broker_stats(d, "brokerStatus", "-c", CLUSTER)
    for b in d.brokers.values():
        assert b.addr in out, out
    assert "brokerVersionDesc" in out, out


def test_get_namesrv_config_lists_every_node_with_namesrv_config_keys(deployment: Deployment) -> None:
    """getNamesrvConfig asks each address of -n. The stock NameServer answers NamesrvConfig's keys
    (orderMessageEnable, ...); ours answers the replicated ones under those names, and our TOML keys."""
    d = deployment
    out = _ok(d.rmq.mqadmin("getNamesrvConfig", namesrv=d.namesrv))
    for addr in d.addrs:
        assert addr in out, out
    assert "orderMessageEnable" in out, out


def test_update_namesrv_config(deployment: Deployment) -> None:
    """updateNamesrvConfig sends 318 to each address of -n; ours replicates it, so asking one node is
    enough for all three to answer the new value (getNamesrvConfig asks each)."""
    d = deployment
    for value in ("true", "false"):
        r = d.rmq.mqadmin("updateNamesrvConfig", "-k", "orderMessageEnable", "-v", value, namesrv=d.addrs[0])
        assert "success" in r.stdout.lower(), f"{r.stdout}\n{r.stderr[-3000:]}"
        deadline = time.monotonic() + 10  # the others apply it within a heartbeat or two
        for addr in d.addrs:
            while f"orderMessageEnable={value}\n" not in (text := remoting.call(addr, 319).body.decode()):
                assert time.monotonic() < deadline, (addr, text)
                time.sleep(0.2)


def test_update_namesrv_config_takes_stock_keys(deployment: Deployment) -> None:
    """updateNamesrvConfig with NamesrvConfig keys that are not settings here succeeds, as on the stock
    NameServer: a replicated one is applied on every node, the others are accepted and change nothing."""
    d = deployment
    for key, value in (("enableTopicList", "true"), ("clientRequestThreadPoolNums", "16"),
                       ("waitSecondsForService", "10")):
        r = d.rmq.mqadmin("updateNamesrvConfig", "-k", key, "-v", value, namesrv=d.namesrv)
        assert "success" in r.stdout.lower() and "Exception" not in r.stdout + r.stderr, \
            f"{key}: {r.stdout}\n{r.stderr[-3000:]}"
    for addr in d.addrs:
        text = remoting.call(addr, 319).body.decode()
        assert "enableTopicList=true\n" in text and "clientRequestThreadPoolNums=8\n" in text, (addr, text)
        assert "waitSecondsForService=45\n" in text, (addr, text)


def _broker_topic_order(addr: str, topic: str) -> bool | None:
    """The broker's own order flag of `topic` (GET_ALL_TOPIC_CONFIG, 21, asked of the broker); None: no such topic."""
    r = remoting.call(addr, 21)
    assert r.code == 0, (r.code, r.remark)
    config = parse_body(r.body)["topicConfigTable"].get(topic)
    return None if config is None else bool(config.get("order"))


def _wait_order(broker: str, topic: str, ordered: bool) -> None:
    deadline = time.monotonic() + 75  # two of broker-a's 30 s registrations, and room for a loaded machine
    while _broker_topic_order(broker, topic) is not ordered:
        assert time.monotonic() < deadline, f"broker-a's {topic}: order is not {ordered} after 75 s"
        time.sleep(1)


# 4.9.x only: a 5.x broker's TopicConfigManager.updateOrderTopicConfig sets order from the table, never clears it
@pytest.mark.parametrize("line", [jars.LINE_4], indirect=True)
def test_broker_clears_an_order_topic_once_its_order_conf_is_deleted(line: str, deployment: Deployment) -> None:
    """updateTopic -o true makes the topic ordered on the brokers and puts its order conf in ORDER_TOPIC_CONFIG;
    updateOrderConf -m delete empties that namespace. The brokers take their topics' order flags from the
    KVTable answered to their registrations: answered {"table":{}} as stock answers it (not no body, which a
    broker takes as "no news"), a 4.9.7 broker-a clears the flag at its next registration (every 30 s)."""
    d = deployment
    topic, broker = "InteropOrderTopic", d.brokers["a0"].addr
    _ok(d.rmq.mqadmin("updateTopic", "-c", CLUSTER, "-t", topic, "-o", "true", namesrv=d.namesrv))
    try:
        r = remoting.call(d.addrs[0], 101, {"namespace": "ORDER_TOPIC_CONFIG", "key": topic})
        assert r.code == 0 and "broker-a:" in (r.ext_fields.get("value") or ""), (r.code, r.remark, r.ext_fields)
        # the topic reaches the broker before its order conf reaches us (mqadmin's order), so the registration
        # the new topic sets off can clear the flag; the next one, with the conf, sets it again
        _wait_order(broker, topic, True)
        _ok(d.rmq.mqadmin("updateOrderConf", "-t", topic, "-m", "delete", namesrv=d.namesrv))
        _wait_order(broker, topic, False)
    finally:
        _ok(d.rmq.mqadmin("deleteTopic", "-c", CLUSTER, "-t", topic, namesrv=d.namesrv))
    d.wait_route(topic, lambda r: r is None, timeout=30)


@pytest.mark.parametrize("line", [jars.LINE_5], indirect=True)  # static topics (RIP-21) are 5.x only
def test_static_topic_route_carries_queue_mappings(line: str, deployment: Deployment) -> None:
    """`mqadmin updateStaticTopic` makes both masters hold a logical-queue mapping; they re-register with it,
    and every node's route carries topicQueueMappingByBroker covering every logical queue once. A real
    producer then sends through the static topic's route."""
    d = deployment
    topic, total = "InteropStaticTopic", 4
    _ok(d.rmq.mqadmin("updateStaticTopic", "-c", CLUSTER, "-t", topic, "-qn", str(total), namesrv=d.namesrv))
    try:
        routes = d.wait_route(topic, lambda r: r is not None and len(r.get("topicQueueMappingByBroker") or {}) == 2,
                              timeout=60)
        for addr, route in routes.items():
            mappings = route["topicQueueMappingByBroker"]
            assert set(mappings) == {"broker-a", "broker-b"}, (addr, mappings)
            logical = []
            for bname, info in mappings.items():
                assert (info["bname"], info["topic"], info["totalQueues"]) == (bname, topic, total), info
                logical += [int(k) for k in info["currIdMap"]]
            assert sorted(logical) == list(range(total)), (addr, mappings)  # each logical queue exactly once
        out = _ok(d.rmq.mqadmin("topicRoute", "-t", topic, namesrv=d.namesrv))
        assert "topicQueueMappingByBroker" in out, out
        res = produce(d, topic, 8, prefix="static")
        assert not res.failed and len(res.sent) == 8, res.lines[-20:]
    finally:
        _ok(d.rmq.mqadmin("deleteTopic", "-c", CLUSTER, "-t", topic, namesrv=d.namesrv))
    d.wait_route(topic, lambda r: r is None, timeout=30)
