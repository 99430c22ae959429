"""A sharded node's group cores on its one /metrics (docs/operations.md, "Metrics per group").

With `[sharding] groups` > 1 a node runs a core per Raft group (nameserver/groupcore.py), and only group
0's core has the metrics port. Each group core k >= 1 keeps its own metrics (NodeMetrics: its Raft, apply,
state and process) and serves their text on a private Unix socket, `<data_dir>/g<k>/channel/metrics.sock`
(0600, in the 0700 channel directory; its name is shorter than remoting.sock, whose length the
configuration checks): a connection gets one exposition, then the socket is closed. At each scrape group
0's core reads every group core's (GroupFamilies) and shows each of their samples with a `group="k"`
label, its own group's with `group="0"`: one family per name, one scrape per node, as an etcd or Kafka
operator expects. What is the node's as a whole (the requests its workers answer, the workers) keeps no
group label. A group core that does not answer within the scrape's budget (down, restarting, stopped) is
left out of that scrape, and `nameserver_group_metrics_read{group}` says so (0).

A one-group node runs none of this: its /metrics is unchanged, without a `group` label.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from nameserver.config import NodeConfig, group_data_dir

log = logging.getLogger("nameserver.ops.groupmetrics")

SOCKET_NAME = os.path.join("channel", "metrics.sock")
# All group cores' expositions are read within this, one after another: well inside Prometheus' default
# 10 s scrape timeout, and long enough for a group core whose process is busy (its text is a few KiB).
SCRAPE_BUDGET_S = 5.0
MAX_TEXT_BYTES = 16 << 20  # a group core's exposition is KiBs (its broker-set gauges are bounded too)
SEND_TIMEOUT_S = 10.0  # a reader that stops reading does not hold the group core's thread longer


def socket_path(data_dir: str) -> str:
    """A group core's metrics socket, under its own data directory (config.group_data_dir)."""
    return os.path.join(data_dir, SOCKET_NAME)


def group_sockets(cfg: NodeConfig) -> list[tuple[int, str]]:
    """(group, its core's metrics socket) of every group core of the node (groups 1 to G - 1)."""
    return [(group, socket_path(group_data_dir(cfg.data_dir, group))) for group in range(1, cfg.groups)]


class MetricsSocket:
    """A group core's side: `registry`'s exposition to each connection on `path` (started and stopped with
    the group core)."""

    def __init__(self, registry: CollectorRegistry, path: str) -> None:
        self.path = path
        folder = os.path.dirname(path)
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
        if os.path.exists(path):  # a previous run's
            os.unlink(path)

        class _Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                self.request.settimeout(SEND_TIMEOUT_S)
                try:
                    self.request.sendall(generate_latest(registry))
                except OSError as exc:
                    log.debug("metrics not sent to group 0's core: %s", exc)

        class _Server(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True
            block_on_close = False

        self._server = _Server(path, _Handler)
        os.chmod(path, 0o600)
        self._thread = threading.Thread(target=self._server.serve_forever, name="group-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
        with contextlib.suppress(OSError):  # removed already
            os.unlink(self.path)


def read_group(path: str, deadline: float) -> list[Metric] | None:
    """The metric families a group core's socket answers by `deadline` (time.monotonic), None when it does
    not (gone, restarting, too slow) or answers something that is not an exposition."""
    chunks: list[bytes] = []
    size = 0
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(max(0.0, deadline - time.monotonic()))
            conn.connect(path)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                conn.settimeout(left)
                chunk = conn.recv(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_TEXT_BYTES:
                    log.warning("group core metrics on %s exceed %d bytes: not read", path, MAX_TEXT_BYTES)
                    return None
                chunks.append(chunk)
        return list(text_string_to_metric_families(b"".join(chunks).decode()))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        log.debug("group core metrics on %s not read: %s", path, exc)
        return None


def _labelled(families: dict[str, Metric], metrics: Iterable[Metric], group: str) -> None:
    """Add `metrics`' samples to `families` (one family per name), each labelled with `group`."""
    for m in metrics:
        family = families.get(m.name)
        if family is None:
            family = families[m.name] = Metric(m.name, m.documentation, m.type)
        elif family.type != m.type:  # never between our own processes (one code); a family has one type
            log.debug("group %s's %s is a %s, not a %s: left out", group, m.name, m.type, family.type)
            continue
        for s in m.samples:
            family.add_sample(s.name, {**s.labels, "group": group}, s.value)


class GroupFamilies(Collector):
    """Group 0's core's per-group families (`own`) and each group core's (`cores`: (group, socket)), merged
    by name, each sample labelled with its group."""

    def __init__(self, own: CollectorRegistry, cores: Sequence[tuple[int, str]]) -> None:
        self.own = own
        self.cores = list(cores)

    def describe(self) -> Iterable[Metric]:
        return []  # unchecked collector: the names are known by collecting

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        _labelled(families, self.own.collect(), "0")
        read = GaugeMetricFamily("nameserver_group_metrics_read", "1 if this scrape holds the group core's "
                                 "metrics, 0 if it did not answer in time (down, restarting or stopped).",
                                 labels=["group"])
        read.add_metric(["0"], 1)
        deadline = time.monotonic() + SCRAPE_BUDGET_S
        for group, path in self.cores:
            found = read_group(path, deadline)
            read.add_metric([str(group)], 0 if found is None else 1)
            if found is not None:
                _labelled(families, found, str(group))
        yield from families.values()
        yield read
