"""The differential's short version (make test): the stock NameServer and our 3-node cluster, each behind the
recording proxy, asked the differential's raw probes only (probes.py; no real broker, mqadmin or producer), and
every exchange compared with the same compare()/explained() as test_differential.py. Not marked interop."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.fakebroker import FakeBroker, data_version_json

from . import jars
from .conftest import CLUSTER, recorded_upstream
from .explained import ODD_BROKER, explained
from .probes import LINE_VERSION, STOCK_SETTINGS, heartbeat_timeout, odd_broker_probes, probe, raw_probes
from .recorder import Exchange, compare, render

# what mqadmin's KV and config commands send in the whole differential: the namespace raw_probes reads
ADMIN = [(100, {"namespace": "DIFF_NS", "key": "k1", "value": "v1"}, b""),
         (100, {"namespace": "DIFF_NS", "key": "k2", "value": "v2"}, b""),
         (102, {"namespace": "DIFF_NS", "key": "k2"}, b""), (319, {}, b""),
         *((318, {}, f"{k}={v}\n".encode()) for k, v in STOCK_SETTINGS)]


def broker_data_version(line: str, counter: int) -> bytes:
    """A 322 body as a broker of `line` writes it: before 5 a DataVersion has no stateVersion (and is answered
    without one)."""
    dv = json.loads(data_version_json(counter))
    if not jars.is_5x(line):
        del dv["stateVersion"]
    return json.dumps(dv, separators=(",", ":")).encode()


def short_scenario(ns: str, upstream: str, line: str) -> dict[str, str]:
    """Every request through the recorder at `ns`; returns the aliases of the fake brokers' addresses."""
    for code, ext, body in ADMIN:
        probe(ns, code, ext, body, version=LINE_VERSION[line])
    # a broker named with '@', a space and a unicode letter, on an unbracketed IPv6 address (it listens on
    # 127.0.0.1: the nameserver only stores and hands out the address it announces)
    odd = FakeBroker(ODD_BROKER, CLUSTER)
    odd.addr = "::1:" + odd.addr.rsplit(":", 1)[1]
    try:
        odd.register(ns, ["TBW102", ODD_BROKER], compressed=False)
        for counter in (1, 2):  # 322: the DataVersion held (changed=false), then another (changed=true)
            odd.call(ns, 322, odd.header(), broker_data_version(line, counter))
        odd.heartbeat(ns)  # 904, oneway
        odd_broker_probes(ns, line)
        raw_probes(ns, line)
        aliases = heartbeat_timeout(ns, upstream, LINE_VERSION[line])
        odd.call(ns, 104, odd.header())
    finally:
        odd.stop()
    return aliases | {odd.addr: "<odd-broker>"}


def run_side(line: str, root: str, stock: bool) -> tuple[list[Exchange], dict[str, str]]:
    with recorded_upstream(line, root, stock, grace=2.0) as up:
        aliases = short_scenario(up.rec.addr, up.addr, line)
        return up.rec.snapshot(), aliases | {up.addr: "<namesrv>", up.rec.addr: "<namesrv>"}


@pytest.mark.timeout(300)
def test_raw_probes_answered_as_stock(line: str, tmp_path) -> None:
    with ThreadPoolExecutor(2) as pool:  # the two sides share nothing: the JVM's start overlaps our cluster's
        stock_f, ours_f = (pool.submit(run_side, line, str(tmp_path / side), side == "stock")
                           for side in ("stock", "ours"))
        (stock, stock_aliases), (ours, our_aliases) = stock_f.result(), ours_f.result()
    codes = {ex.request.code for ex in stock}
    assert codes == {ex.request.code for ex in ours}
    assert {100, 102, 103, 104, 105, 106, 318, 319, 322, 904} <= codes, codes
    diffs = compare(stock, ours, stock_aliases, our_aliases)
    report = (f"RocketMQ {line}: {len(stock)} exchanges with the stock NameServer, {len(ours)} with ours\n"
              f"{render(diffs)}")
    print(report)
    unexplained = [d for d in diffs if not explained(line, d)]
    assert not unexplained, "unexplained differences:\n" + render(unexplained) + "\n\n" + report
