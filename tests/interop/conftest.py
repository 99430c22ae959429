"""Fixtures for the interop tests: Apache RocketMQ's real brokers, clients and mqadmin against our cluster.

These tests are collected only when RMQ_INTEROP is set (they start JVMs and fetch jars from Maven Central):

    make interop          # everything, both lines (RMQ_INTEROP=1 ... -m 'interop or not interop')
    RMQ_INTEROP=1 .venv/bin/python -m pytest -q tests/interop -m 'not interop'   # the short version

Every test is parametrized over both RocketMQ lines (tests/interop/jars.py LINES: 4.9.x and 5.x); RMQ_LINES
narrows that (make test: RMQ_LINES=5.x, the short version on one line). RMQ_WORKERS=N runs our nodes with N
worker processes each (start_ours), behind the default gRPC front end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from cluster import Cluster

from . import jars, remoting
from .launcher import Broker, JavaProc, RocketMQ
from .recorder import Recorder

if not os.environ.get("RMQ_INTEROP"):
    collect_ignore_glob = ["test_*.py"]

LINE_IDS = {jars.LINE_4: "4.9", jars.LINE_5: "5.x"}
CLUSTER = "InteropCluster"


def selected_lines() -> tuple[str, ...]:
    """RMQ_LINES picks lines by id or version ("5.x", "4.9.7,5.x"); unset: both. make test runs 5.x only."""
    wanted = [w.strip() for w in os.environ.get("RMQ_LINES", "").split(",") if w.strip()]
    if not wanted:
        return jars.LINES
    by_name = {v: v for v in jars.LINES} | {i: v for v, i in LINE_IDS.items()}
    unknown = [w for w in wanted if w not in by_name]
    if unknown:
        raise pytest.UsageError(f"RMQ_LINES: unknown line(s) {unknown}; known: {sorted(by_name)}")
    return tuple(dict.fromkeys(by_name[w] for w in wanted))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "interop: long interop scenario with real RocketMQ (make interop)")


@dataclass
class Deployment:
    """Our 3-node cluster (remoting on) and real brokers: broker-a master + slave, broker-b master."""
    rmq: RocketMQ
    ours: Cluster | None
    namesrv: str  # the namesrvAddr the brokers and clients use ("a;b;c")
    brokers: dict[str, Broker] = field(default_factory=dict)
    stock: object | None = None  # the stock NameServer's JavaProc when namesrv is the stock one

    @property
    def addrs(self) -> list[str]:
        return self.namesrv.split(";")

    @property
    def version(self) -> str:
        return self.rmq.version

    def wait_brokers(self, expected: dict[str, set[int]], addrs: list[str] | None = None,
                     timeout: float = 90.0) -> dict:
        """Wait until every nameserver address lists exactly `expected` {brokerName: {brokerId...}}."""
        deadline = time.monotonic() + timeout
        last: dict = {}
        while time.monotonic() < deadline:
            ok = True
            for a in addrs or self.addrs:
                try:
                    info = remoting.cluster_info(a)
                except (OSError, AssertionError) as exc:
                    last[a] = repr(exc)
                    ok = False
                    continue
                # a name left with no address is no broker (stock 5.5.0 keeps one after a heartbeat timeout)
                got = {n: {int(i) for i in bd["brokerAddrs"]} for n, bd in info.get("brokerAddrTable", {}).items()
                       if bd.get("brokerAddrs")}
                last[a] = got
                ok = ok and got == expected
            if ok:
                return last
            time.sleep(0.5)
        raise AssertionError(f"brokers {expected} not registered everywhere after {timeout}s: {last}\n"
                             + self.logs())

    def wait_route(self, topic: str, pred=lambda r: r is not None, addrs: list[str] | None = None,
                   timeout: float = 60.0) -> dict[str, dict | None]:
        deadline = time.monotonic() + timeout
        routes: dict[str, dict | None] = {}
        while time.monotonic() < deadline:
            routes = {a: remoting.route(a, topic) for a in addrs or self.addrs}
            if all(pred(r) for r in routes.values()):
                return routes
            time.sleep(0.5)
        raise AssertionError(f"route of {topic} not as expected after {timeout}s: {routes}")

    def logs(self) -> str:
        return self.ours.logs() if self.ours is not None else ""

    def stop(self, grace: float = 15.0) -> None:
        self.rmq.stop_all(grace)
        if self.ours is not None:
            self.ours.stop()


def start_ours(root: str, **settings) -> Cluster:
    """Our 3-node cluster with the remoting listener on (tests/cluster.py), ready. RMQ_WORKERS=N gives each node
    N worker processes (and with them the default gRPC front end, the Go one when built) where a test sets none."""
    os.makedirs(root, exist_ok=True)
    if "worker_processes" not in settings and os.environ.get("RMQ_WORKERS"):
        settings["worker_processes"] = int(os.environ["RMQ_WORKERS"])
    c = Cluster(root, 3, remoting=True, **settings)
    c.start()
    c.wait_ready(timeout=max(60.0, c.ready_timeout))  # a cluster with workers takes longer (Cluster.ready_timeout)
    return c


@dataclass
class Upstream:
    """The differential's upstream behind the recorder: the stock NameServer (proc) or our 3-node cluster (ours,
    asked at node 0's remoting port)."""
    rmq: RocketMQ
    proc: JavaProc | None
    ours: Cluster | None
    addr: str
    rec: Recorder


@contextmanager
def recorded_upstream(version: str, root: str, stock: bool, grace: float = 15.0) -> Iterator[Upstream]:
    """The stock NameServer or ours started under `root`, behind a recorder; all stopped at the end."""
    rmq = RocketMQ(version, os.path.join(root, "rmq"))
    ours = None
    rec = None
    try:
        proc = None
        if stock:
            proc, addr = rmq.namesrv()
        else:
            ours = start_ours(os.path.join(root, "ours"))
            addr = ours.nodes[0].remoting_addr
        rec = Recorder(addr, "stock" if stock else "ours").start()
        yield Upstream(rmq, proc, ours, addr, rec)
    finally:
        if rec is not None:
            rec.stop()
        rmq.stop_all(grace)
        if ours is not None:
            ours.stop()


def start_brokers(d: Deployment, slave: bool = True) -> None:
    """broker-a (master, stock settings) + its slave; broker-b (master, forceRegister off, so it asks
    QUERY_DATA_VERSION before registering; on 5.x acting master on, so it also sends BROKER_HEARTBEAT 904).
    Both register plain bodies: compressed registration has a test of its own (test_routes.py)."""
    b_extra = {"forceRegister": "false", "registerNameServerPeriod": "10000"}
    if d.rmq.is5:
        b_extra["enableSlaveActingMaster"] = "true"
    d.brokers = {"a0": d.rmq.broker("broker-a", d.namesrv, 0, CLUSTER, wait=False),
                 "b0": d.rmq.broker("broker-b", d.namesrv, 0, CLUSTER, extra=b_extra, wait=False)}
    if slave:  # it learns its master's HA address from the nameserver's answer to its registration
        d.brokers["a1"] = d.rmq.broker("broker-a", d.namesrv, 1, CLUSTER, wait=False)
    for b in d.brokers.values():
        b.proc.wait_line(lambda ln: "boot success" in ln, timeout=180)


def deploy(version: str, root: str, stock: bool = False, slave: bool = True, brokers: bool = True,
           **settings) -> Deployment:
    rmq = RocketMQ(version, os.path.join(root, "rmq"))
    if stock:
        ns, addr = rmq.namesrv()
        d = Deployment(rmq, None, addr, stock=ns)
    else:
        ours = start_ours(os.path.join(root, "ours"), **settings)
        d = Deployment(rmq, ours, ";".join(n.remoting_addr for n in ours.nodes))
    try:
        if brokers:
            start_brokers(d, slave=slave)
    except BaseException:
        d.stop()
        raise
    return d


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (not skip) the tests of lines RMQ_LINES leaves out, whatever parametrized them."""
    lines = selected_lines()
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        line = callspec.params.get("line") if callspec is not None else None
        (drop if line is not None and line not in lines else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session", params=jars.LINES, ids=lambda v: LINE_IDS.get(v, v))
def line(request: pytest.FixtureRequest) -> str:
    try:
        jars.ensure(request.param)
    except RuntimeError as exc:
        pytest.fail(f"cannot fetch RocketMQ {request.param}: {exc}")
    return request.param


@pytest.fixture(scope="package")
def deployment(line: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """Shared by every test of one line (pytest runs a line's tests together): ours + broker-a (master,
    slave) + broker-b, registered. Tests that change it put it back (topics deleted, extra brokers stopped).
    Package scope: stopped once tests/interop is done, not at the end of the session (make test ran its
    later folders beside three idle RocketMQ JVMs: about a core)."""
    d = deploy(line, str(tmp_path_factory.mktemp(f"interop-{LINE_IDS.get(line, line)}")))
    try:
        d.wait_brokers({"broker-a": {0, 1}, "broker-b": {0}})
        yield d
    finally:
        d.stop(grace=2.0)  # nothing is checked after, so no long graceful shutdown


@pytest.fixture
def fresh(line: str, tmp_path) -> Iterator[Deployment]:
    """A deployment of the test's own (for tests that kill things); brokers not yet awaited."""
    d = deploy(line, str(tmp_path))
    try:
        yield d
    finally:
        d.stop()
