"""A sharded node's one /metrics over its group cores (nameserver/ops/groupmetrics.py), in process: a group
core's metrics socket serves its registry's text, and group 0's collector shows its own families and every
group core's in one family per name, each sample labelled with its group, a group core that does not
answer left out and said so. The processes: tests/integration/test_groups.py."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from nameserver.config import Member, NodeConfig
from nameserver.ops import groupmetrics
from nameserver.ops.groupmetrics import GroupFamilies, MetricsSocket
from tests.unit.test_metrics import ensure_promtool


def group_registry(offset: int, records: int) -> CollectorRegistry:
    """What a group's NodeMetrics holds, in small: a gauge, a labelled counter, a histogram."""
    registry = CollectorRegistry()
    Gauge("nameserver_apply_offset", "Last index applied.", registry=registry).set(offset)
    Counter("nameserver_records_applied", "Records applied.", ["type", "op"],
            registry=registry).labels("BROKER_DATA", "upsert").inc(records)
    Histogram("nameserver_applied_entry_bytes", "Entry sizes.", buckets=(256, 1024),
              registry=registry).observe(300 * records)
    return registry


@pytest.fixture
def sockets(tmp_path) -> Iterator[list[str]]:
    """Group 1's core's metrics socket serving; group 2's socket path, where no core listens."""
    served = MetricsSocket(group_registry(offset=7, records=3), groupmetrics.socket_path(str(tmp_path / "g1")))
    served.start()
    yield [served.path, groupmetrics.socket_path(str(tmp_path / "g2"))]
    served.stop()


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_every_group_s_samples_are_one_family_each_labelled_with_its_group(sockets: list[str]) -> None:
    node = CollectorRegistry()
    node.register(GroupFamilies(group_registry(offset=40, records=5), [(1, sockets[0]), (2, sockets[1])]))
    text = generate_latest(node).decode()
    found = samples(text)
    assert found[("nameserver_apply_offset", frozenset({("group", "0")}))] == 40
    assert found[("nameserver_apply_offset", frozenset({("group", "1")}))] == 7
    upserts = frozenset({("type", "BROKER_DATA"), ("op", "upsert")})
    assert found[("nameserver_records_applied_total", upserts | {("group", "0")})] == 5
    assert found[("nameserver_records_applied_total", upserts | {("group", "1")})] == 3
    assert found[("nameserver_applied_entry_bytes_bucket", frozenset({("group", "1"), ("le", "1024.0")}))] == 1
    # group 2's core is not there: left out of this scrape, and said so
    assert not [key for key in found if ("group", "2") in key[1] and key[0] != "nameserver_group_metrics_read"]
    assert [found[("nameserver_group_metrics_read", frozenset({("group", g)}))] for g in "012"] == [1, 1, 0]
    assert text.count("# TYPE nameserver_apply_offset ") == 1  # one family per name
    lint = subprocess.run([ensure_promtool(), "check", "metrics"], input=text, capture_output=True, text=True,
                          timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_group_core_that_does_not_answer_is_left_out_within_the_scrape_s_budget(
        tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stopped group core accepts the connection (the kernel does) and never writes: the scrape goes on
    without it at its budget, and a later scrape reads it once it answers."""
    monkeypatch.setattr(groupmetrics, "SCRAPE_BUDGET_S", 0.3)
    path = groupmetrics.socket_path(str(tmp_path / "g1"))
    os.makedirs(os.path.dirname(path))
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(path)
    silent.listen(4)
    node = CollectorRegistry()
    node.register(GroupFamilies(group_registry(offset=40, records=5), [(1, path)]))
    try:
        found = samples(generate_latest(node).decode())
        assert found[("nameserver_group_metrics_read", frozenset({("group", "1")}))] == 0
        assert ("nameserver_apply_offset", frozenset({("group", "1")})) not in found
    finally:
        silent.close()
    served = MetricsSocket(group_registry(offset=9, records=1), path)  # the group core back
    served.start()
    try:
        found = samples(generate_latest(node).decode())
        assert found[("nameserver_apply_offset", frozenset({("group", "1")}))] == 9
    finally:
        served.stop()


def test_group_sockets_are_under_each_group_core_s_data_dir() -> None:
    cfg = NodeConfig(raft_addr="127.0.0.1:1", grpc_addr="127.0.0.1:2", data_dir="/d", members=[
        Member("127.0.0.1:1", "127.0.0.1:2")], groups=3, worker_processes=1)
    assert groupmetrics.group_sockets(cfg) == [(1, "/d/g1/channel/metrics.sock"), (2, "/d/g2/channel/metrics.sock")]


def test_a_group_core_s_socket_is_its_owner_s_only(sockets: list[str]) -> None:
    assert os.stat(sockets[0]).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(sockets[0])).st_mode & 0o777 == 0o700


