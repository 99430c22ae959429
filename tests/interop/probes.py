"""The differential's raw probes (test_differential.py, and its short version test_differential_short.py): requests
sent through the recorder with our own codec, for the codes and cases no tool sends. One place, both tests."""

from __future__ import annotations

import json
import time

from tests.fakebroker import FakeBroker

from . import jars, remoting
from .conftest import CLUSTER
from .explained import ODD_BROKER

# MQVersion.Version ordinals a client of each line sends in its request header.
LINE_VERSION = {jars.LINE_4: 407, jars.LINE_5: 513}
OLD_CLIENT = 399  # a client before 4.9.4: answered in fastjson's form
HB_BROKER = "diff-hb-broker"
# Three NamesrvConfig keys both lines have, set to their defaults (318, one key a call).
STOCK_SETTINGS = (("orderMessageEnable", "false"), ("clusterTest", "false"), ("productEnvName", "center"))


def probe(ns: str, code: int, ext: dict[str, str], body: bytes = b"", version: int = 479) -> None:
    """One request through the recorder; no answer in 10 s (4.9.7 does not answer codes it lacks) is recorded
    as "<no response>"."""
    try:
        remoting.call(ns, code, ext, body, version=version, timeout=10)
    except (OSError, AssertionError) as exc:
        print(f"probe {code} {ext}: {exc!r}")


def _route_body(broker: str) -> bytes:
    return json.dumps({"brokerDatas": [], "queueDatas": [
        {"brokerName": broker, "perm": 6, "readQueueNums": 2, "topicSysFlag": 0, "writeQueueNums": 2}]}).encode()


def raw_probes(ns: str, line: str) -> None:
    """KV reads and deletes (DIFF_NS holds k1 by now), routes, topic lists, 901, a ghost's 322, 217/216, an
    unknown code; then an old client's 106 and 105."""
    probes = [
        (101, {"namespace": "DIFF_NS", "key": "k1"}, b""), (101, {"namespace": "DIFF_NS", "key": "nope"}, b""),
        (219, {"namespace": "DIFF_NS"}, b""), (102, {"namespace": "DIFF_NS", "key": "k1"}, b""),
        (219, {"namespace": "DIFF_NS"}, b""), (219, {"namespace": "NEVER_NS"}, b""),
        (105, {"topic": "NoSuchTopic"}, b""),
        (105, {"topic": "broker-a", "__ZONE_MODE": "true", "__ZONE_NAME": "zone-x"}, b""),
        (206, {}, b""), (224, {"cluster": CLUSTER}, b""), (304, {}, b""), (311, {}, b""), (312, {}, b""),
        (313, {}, b""), (901, {"clusterName": CLUSTER, "brokerName": "broker-a"}, b""),
        (322, {"brokerName": "ghost", "brokerAddr": "127.0.0.1:1", "clusterName": CLUSTER, "brokerId": "0"},
         json.dumps({"counter": 1, "timestamp": 1700000000000}).encode()),
        (217, {"topic": "DiffRegTopic"}, _route_body("ghost-broker")),
        (217, {"topic": "DiffRegTopic2"}, _route_body("broker-a")),
        (105, {"topic": "DiffRegTopic2"}, b""),
        (216, {"topic": "DiffRegTopic2"}, b""),
        (999, {}, b""),
    ]
    for code, ext, body in probes:  # speaking as a client of the line under test
        probe(ns, code, ext, body, version=LINE_VERSION[line])
    for code, ext in ((106, {}), (105, {"topic": "broker-a"})):  # diffClient: explained.py's rows can name it
        probe(ns, code, ext | {"diffClient": str(OLD_CLIENT)}, version=OLD_CLIENT)


def odd_broker_probes(ns: str, line: str) -> None:
    """What a client asks while the broker named ODD_BROKER (on an unbracketed IPv6 address) is registered, as a
    client of the line and as an old one."""
    for code, ext in ((106, {}), (105, {"topic": ODD_BROKER}), (105, {"topic": "TBW102"}), (206, {}),
                      (224, {"cluster": CLUSTER}), (901, {"clusterName": CLUSTER, "brokerName": ODD_BROKER})):
        for client in (LINE_VERSION[line], OLD_CLIENT):
            probe(ns, code, ext | {"diffPhase": "odd-broker", "diffClient": str(client)}, version=client)


def heartbeat_timeout(ns: str, upstream: str, version: int) -> dict[str, str]:
    """A raw REGISTER_BROKER with heartbeatTimeoutMillis=500 from a broker that never heartbeats but keeps its
    connection: cluster info right after, then once it is gone from the upstream (or 15 s passed: 4.9.7 has no
    per-broker timeout), then its topic's route. Returns the aliases of its addresses."""
    fb = FakeBroker(HB_BROKER, CLUSTER)
    try:
        # two topics: stock 5.5.0 refuses a broker's first registration holding exactly one ("register broker
        # failed"; it takes that for a single topic's update from a broker not registered yet)
        fb.register(ns, ["DiffHbTopic", "DiffHbTopic2"], compressed=False, extra={"heartbeatTimeoutMillis": "500"})
        probe(ns, 106, {"diffPhase": "hb-registered"}, version=version)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and remoting.cluster_info(upstream)["brokerAddrTable"].get(
                HB_BROKER, {}).get("brokerAddrs"):  # stock 5.5.0 keeps the name, with no address
            time.sleep(0.3)
        probe(ns, 106, {"diffPhase": "hb-waited"}, version=version)
        probe(ns, 105, {"topic": "DiffHbTopic"}, version=version)
    finally:
        fb.stop()
    return {fb.addr: "<hb-broker>"}
