"""The stock NameServer as the oracle: the same scenario against Apache RocketMQ's NameServer and against one
of our nodes, each behind a recording proxy (recorder.py); every response compared field by field.

The scenario: real brokers (broker-a master + slave, broker-b with forceRegister off, acting master on
5.x) register and heartbeat; mqadmin runs its nameserver commands; raw probes cover the codes no tool
sends here; a broker with compressed registration comes and goes; a producer sends; the brokers shut
down (unregistering). Our own polling goes straight to
the upstream, so only the deterministic sequence passes through the recorder. The listing is printed
and written to $RMQ_DIFF_OUT/differences-<version>.txt when that is set.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass

import pytest

from . import jars, remoting
from .conftest import CLUSTER, Deployment, start_brokers, start_ours
from .launcher import RocketMQ
from .recorder import Difference, Exchange, Recorder, compare, exchange_json, parse_body, render
from .traffic import create_topic, produce

pytestmark = pytest.mark.interop

@dataclass(frozen=True)
class Explained:
    """A difference docs/remoting.md explains ("Still different"). It covers a Difference only when the code
    matches, the line matches (empty: both), the request holds `request`'s fields, and every differing
    field path matches `paths`; anything else still fails the test."""
    code: int
    why: str
    lines: tuple[str, ...] = ()
    paths: str = r".*"
    request: tuple[tuple[str, str], ...] = ()

    def covers(self, line: str, d: Difference) -> bool:
        if d.code != self.code or (self.lines and line not in self.lines) or d.kind != "fields":
            return False
        if any(d.request.get(k) != v for k, v in self.request):
            return False
        return all(re.fullmatch(self.paths, p) for p in d.fields)


# MQVersion.Version ordinals a client of each line sends in its request header.
LINE_VERSION = {jars.LINE_4: 407, jars.LINE_5: 513}


def broker_qdv(ex: Exchange) -> bool:
    """A real broker's QUERY_DATA_VERSION (not the "ghost" probe). Its answer depends on whether the
    broker's own registration of a new DataVersion has landed yet, which races the periodic 322
    differently on each side; so these are checked against the rule instead of compared."""
    return ex.request.code == 322 and ex.request.ext("brokerName") != "ghost"


def qdv_rule_broken(exs: list[Exchange]) -> list[str]:
    """RocketMQ's rule for 322: changed is false exactly when the DataVersion asked about equals the one
    held, which the answer's body carries (no body: unknown, so changed)."""
    bad = []
    for ex in exs:
        if not broker_qdv(ex) or ex.response is None or ex.request.is_oneway:
            continue
        asked, held = parse_body(ex.request.body), parse_body(ex.response.body) if ex.response.body else None
        same = isinstance(held, dict) and isinstance(asked, dict) and all(
            asked.get(k) == held.get(k) for k in ("counter", "timestamp"))
        if ex.response.ext_fields.get("changed") != ("false" if same else "true"):
            bad.append(f"asked {asked}, held {held}, changed={ex.response.ext_fields.get('changed')}")
    return bad


UNANSWERED_ON_4_9 = r"<no response>|code|remark|body(\..*)?"  # 4.9.7 sends nothing for codes it lacks
EXPLAINED: list[Explained] = [
    Explained(319, "our public settings and RocketMQ's replicated switches, not the Java server's settings",
              paths=r"body\..+"),
    Explained(318, "a key that changes nothing here is named in the remark (stock's is null)", paths="remark"),
    Explained(304, "brokerAddr: the lowest-id address of the first broker name, so every node answers the same",
              paths=r"body\.brokerAddr"),
    *[Explained(code, "BrokerData on 4.9.7 has no enableActingMaster; one body for both lines",
                lines=(jars.LINE_4,), paths=r"body\..*\.enableActingMaster") for code in (105, 106)],
    *[Explained(code, "4.9.7 does not answer a code it lacks (the client times out); we answer as 5.x does",
                lines=(jars.LINE_4,), paths=UNANSWERED_ON_4_9) for code in (217, 901, 999)],
    Explained(105, "4.9.7 never answered the 217 that registered this topic (above), so it has no route",
              lines=(jars.LINE_4,), request=(("topic", "DiffRegTopic2"),)),
    *[Explained(105, "mqadmin's internal producer asks for TBW102 when its timer fires, so whether an answer "
                "falls between wipeWritePerm and addWritePerm (perm 5, then 6, then the broker's 7) is timing",
                lines=(line,), request=(("topic", "TBW102"),), paths=paths)
      for line, paths in ((jars.LINE_4, r"body\.queueDatas\[\d+\]\.perm|body\.brokerDatas\[\d+\]\.enableActingMaster"),
                          (jars.LINE_5, r"body\.queueDatas\[\d+\]\.perm"))],
    Explained(105, "4.9.7 has no zone filter (ZoneRouteRPCHook came with 5.x); we filter as 5.x does",
              lines=(jars.LINE_4,), request=(("__ZONE_MODE", "true"),)),
]


def _route_body(broker: str) -> bytes:
    return json.dumps({"brokerDatas": [], "queueDatas": [
        {"brokerName": broker, "perm": 6, "readQueueNums": 2, "topicSysFlag": 0, "writeQueueNums": 2}]}).encode()


def scenario(version: str, root: str, stock: bool) -> tuple[list[Exchange], dict[str, str], list[Exchange]]:
    version_of = version
    rmq = RocketMQ(version, os.path.join(root, "rmq"))
    ours = None
    rec = None
    try:
        if stock:
            _, upstream = rmq.namesrv()
        else:
            ours = start_ours(os.path.join(root, "ours"))
            upstream = ours.nodes[0].remoting_addr
        rec = Recorder(upstream, "stock" if stock else "ours").start()
        d = Deployment(rmq, ours, rec.addr)
        start_brokers(d, slave=False)  # masters first, then the slave: its first answer names its master
        d.wait_brokers({"broker-a": {0}, "broker-b": {0}}, addrs=[upstream])
        d.brokers["a1"] = rmq.broker("broker-a", rec.addr, 1, CLUSTER)
        d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}}, addrs=[upstream])
        for t in ("broker-a", "broker-b", CLUSTER):
            d.wait_route(t, addrs=[upstream])
        # While the brokers start, what they ask before their own first registration lands depends on
        # how fast each JVM boots; of that phase only the registrations are compared.
        started = len(rec.snapshot())
        ns = rec.addr
        admin = [("clusterList",), ("topicList",), ("topicRoute", "-t", "broker-a"),
                 ("updateKvConfig", "-s", "DIFF_NS", "-k", "k1", "-v", "v1"),
                 ("updateKvConfig", "-s", "DIFF_NS", "-k", "k2", "-v", "v2"),
                 ("deleteKvConfig", "-s", "DIFF_NS", "-k", "k2"),
                 ("getNamesrvConfig",), ("updateNamesrvConfig", "-k", "orderMessageEnable", "-v", "false"),
                 ("wipeWritePerm", "-b", "broker-b"), ("topicRoute", "-t", "broker-b"),
                 ("addWritePerm", "-b", "broker-b"), ("topicRoute", "-t", "broker-b"),
                 ("brokerStatus", "-c", CLUSTER)]
        for args in admin:
            rmq.mqadmin(*args, namesrv=ns)
        # raw probes (through the recorder)
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
        probes += [(106, {}, b"", 399), (105, {"topic": "broker-a"}, b"", 399)]  # an old client (< 4.9.4)
        for code, ext, body, *version in probes:
            try:  # the probes speak as a client of the line under test, but for the old-client ones
                remoting.call(ns, code, ext, body, version=version[0] if version else LINE_VERSION[version_of],
                              timeout=5)
            except (OSError, AssertionError) as exc:  # recorded as "<no response>"
                print(f"{'stock' if stock else 'ours'}: probe {code} {ext}: {exc!r}")
        # a compressed registration (compressedRegister=true), then its shutdown's UNREGISTER_BROKER. 4.9.7
        # only: 5.5.0 marks its zlib body compressed=false, which the stock 5.5.0 NameServer refuses (we
        # read it: test_routes.py::test_compressed_registration), and its cluster would then differ.
        aliases_c = {}
        if not rmq.is5:
            c = rmq.broker("broker-c", ns, 0, CLUSTER, extra={"compressedRegister": "true"})
            d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}, "broker-c": {0}}, addrs=[upstream], timeout=60)
            aliases_c = {c.addr: "<broker-c-0>", c.ha_addr: "<broker-c-0-ha>"}
            c.proc.stop(grace=30)
        create_topic(d, "DiffTopic", namesrv=ns)
        produce(d, "DiffTopic", 10, prefix="diff", namesrv=ns)
        rmq.mqadmin("deleteTopic", "-c", CLUSTER, "-t", "DiffTopic", namesrv=ns)
        time.sleep(12)  # one more QUERY_DATA_VERSION round of broker-b (10 s) after its topics changed
        aliases = {upstream: "<namesrv>", rec.addr: "<namesrv>", rmq.root: "<root>"} | aliases_c
        for b in d.brokers.values():
            aliases[b.addr] = f"<{b.name}-{b.broker_id}>"
            aliases[b.ha_addr] = f"<{b.name}-{b.broker_id}-ha>"
        brokers = list(d.brokers.values())
        # From start-up to here the sequence is deterministic. During shutdown the brokers' requests race
        # their own unregistrations differently on each side, so of the shutdown only the
        # UNREGISTER_BROKER exchanges are compared.
        before = rec.snapshot()
        for b in brokers:  # brokers shut down first: UNREGISTER_BROKER reaches the nameserver
            b.proc.signal(15)
        for b in brokers:
            b.proc.stop(grace=30)
        time.sleep(0.5)
        if rec.undecodable:
            print(f"{'stock' if stock else 'ours'}: {len(rec.undecodable)} frames our codec could not decode")
        everything = rec.snapshot()
        registers = [ex for ex in everything[:started] if ex.request.code == 103]
        unregisters = [ex for ex in everything[len(before):] if ex.request.code == 104]
        return registers + before[started:] + unregisters, aliases, everything
    finally:
        if rec is not None:
            rec.stop()
        rmq.stop_all()
        if ours is not None:
            ours.stop()


@pytest.mark.timeout(1200)  # two whole scenarios, each with JVMs starting and stopping
def test_stock_namesrv_and_ours_answer_alike(line: str, tmp_path) -> None:
    stock, stock_aliases, _ = scenario(line, str(tmp_path / "stock"), stock=True)
    ours, our_aliases, _ = scenario(line, str(tmp_path / "ours"), stock=False)
    # periodic registrations and heartbeats repeat; their first answers are compared like any other
    for side, exs in (("stock", stock), ("ours", ours)):
        assert not qdv_rule_broken(exs), (side, qdv_rule_broken(exs)[:5])
    assert any(broker_qdv(ex) and ex.response is not None for ex in ours), "no broker's 322 was answered"
    diffs = compare([ex for ex in stock if not broker_qdv(ex)], [ex for ex in ours if not broker_qdv(ex)],
                    stock_aliases, our_aliases)
    codes = sorted({ex.request.code for ex in stock} | {ex.request.code for ex in ours})
    report = (f"RocketMQ {line}: {len(stock)} exchanges with the stock NameServer, {len(ours)} with ours; "
              f"codes {codes}\n\n{render(diffs)}\n")
    print(report)
    out = os.environ.get("RMQ_DIFF_OUT")
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, f"differences-{line}.txt"), "w") as f:
            f.write(report)
        for side, exs, aliases in (("stock", stock, stock_aliases), ("ours", ours, our_aliases)):
            with open(os.path.join(out, f"recording-{line}-{side}.jsonl"), "w") as f:
                for ex in exs:
                    f.write(json.dumps(exchange_json(ex, aliases), default=str) + "\n")
    unexplained = [d for d in diffs if not any(e.covers(line, d) for e in EXPLAINED)]
    assert not unexplained, "unexplained differences:\n" + render(unexplained) + "\n\n" + report
