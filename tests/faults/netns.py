"""Nodes in their own network namespaces: partitions, cut cables, and a delay proxy on every Raft link.

Layout (every name carries a per-run token, so parallel runs never collide; nothing is added to the
host's network namespace, and the subnets exist only inside the namespaces this module creates):

    netns <tok>-hub:  bridge br0 (10.77.0.254/24, 10.77.1.254/24), one veth end per node (v1, v2, ...)
                      + the client forwarder: unix sockets in a host directory -> each node's gRPC
    netns <tok>-n<i>: eth0 = 10.77.0.<i>/24 (the node's Raft identity) and 10.77.1.<i>/24 (its gRPC
                      listener, and the address its Raft port is reached at through a proxy)

Why two addresses per node: pysyncobj names a peer by its address string and only the node whose
string is greater dials each pair. To delay a link without changing those strings (and without
iptables, absent here), node A's namespace gets each peer's 10.77.0.<j> as a local /32 on lo, where
a proxy in A's namespace listens and forwards to the peer's 10.77.1.<j>. pysyncobj binds its Raft
port on 0.0.0.0, so the peer accepts there. gRPC uses 10.77.1.<j>, which is never shadowed.

Why a forwarder for the client: the pytest process stays in the host namespace (its gRPC channels
open sockets on gRPC's own threads, so a per-thread setns would not hold). Unix sockets cross
namespaces, so a forwarder process inside the hub bridges unix:/<dir>/n<i>.sock to the node's gRPC.
The client therefore sits on the hub: partitions between nodes never cut it off, except a pulled cable.

Partitions are blackhole routes inside node namespaces (per pair, both addresses, both directions);
`cut_cable` sets the node's veth end down in the hub (the node loses everyone, the client included).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import grpc

from tests.cluster import ROOT, Cluster

PREFIX = "rf"  # netns names: rf<pid>x<hex>-hub, rf<pid>x<hex>-n1, ...
RAFT_BASE_PORT = 7000  # node i: Raft on 10.77.0.i:7000+i (distinct ports: a shadow listener must not clash)
GRPC_PORT = 9000


class NetnsUnavailable(RuntimeError):
    pass


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise NetnsUnavailable(f"`ip {' '.join(args)}` failed (exit {r.returncode}): {r.stderr.strip()}")
    return r


def raft_ip(i: int) -> str:
    return f"10.77.0.{i}"


def svc_ip(i: int) -> str:
    return f"10.77.1.{i}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_namespaces() -> list[str]:
    """Delete namespaces left by runs whose process is gone (a killed pytest cannot run finalizers)."""
    removed = []
    r = ip("netns", "list", check=False)
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX) or "x" not in name:
            continue
        pid_part = name[len(PREFIX):].split("x", 1)[0]
        if pid_part.isdigit() and not _pid_alive(int(pid_part)):
            # Only the name goes: processes still inside (if any) were not started by this run.
            ip("netns", "del", name, check=False)
            removed.append(name)
    return removed


def _kill_netns_pids(name: str) -> None:
    """SIGKILL what still runs in one of this lab's namespaces (only processes this lab's run started)."""
    r = ip("netns", "pids", name, check=False)
    for pid in r.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@dataclass
class Lab:
    """A hub namespace with a bridge, one namespace per node, and the partition controls."""

    size: int
    token: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}x{uuid.uuid4().hex[:6]}")
    sock_dir: str = ""
    proxied: bool = False
    procs: list[subprocess.Popen] = field(default_factory=list)  # every helper: forwarder and Raft proxies
    raft_proxies: list[subprocess.Popen] = field(default_factory=list)
    blackholes: set[tuple[int, int]] = field(default_factory=set)
    cables_cut: set[int] = field(default_factory=set)
    control_paths: list[str] = field(default_factory=list)
    stats_paths: list[str] = field(default_factory=list)
    forwarder_stats: str = ""
    log_dir: str = ""

    @property
    def hub(self) -> str:
        return f"{self.token}-hub"

    def ns(self, i: int) -> str:
        return f"{self.token}-n{i}"

    def create(self, log_dir: str, proxied: bool = False) -> None:
        """Build the namespaces; raise NetnsUnavailable with the failing command and its error."""
        self.proxied = proxied
        self.log_dir = log_dir
        remove_stale_namespaces()
        # Unix socket paths are limited to ~107 bytes: keep them out of pytest's long tmp paths.
        self.sock_dir = tempfile.mkdtemp(prefix=f"{self.token}-")
        ip("netns", "add", self.hub)
        ip("-n", self.hub, "link", "set", "lo", "up")
        ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        ip("-n", self.hub, "addr", "add", "10.77.0.254/24", "dev", "br0")
        ip("-n", self.hub, "addr", "add", "10.77.1.254/24", "dev", "br0")
        ip("-n", self.hub, "link", "set", "br0", "up")
        for i in range(1, self.size + 1):
            ns = self.ns(i)
            ip("netns", "add", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            # Created inside the hub, the peer end moved straight into the node's namespace: the
            # veth names never exist in the host namespace.
            ip("-n", self.hub, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", self.hub, "link", "set", f"v{i}", "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{raft_ip(i)}/24", "dev", "eth0")
            ip("-n", ns, "addr", "add", f"{svc_ip(i)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
        self._start_forwarder()
        if proxied:
            for i in range(1, self.size + 1):
                self._start_raft_proxy(i)

    def _spawn_proxy(self, ns: str, tag: str, routes: list[dict[str, str]]
                     ) -> tuple[subprocess.Popen, str, str]:
        routes_path = os.path.join(self.sock_dir, f"{tag}.routes.json")
        control = os.path.join(self.sock_dir, f"{tag}.control.json")
        stats = os.path.join(self.sock_dir, f"{tag}.stats.json")

        with open(routes_path, "w") as f:
            json.dump(routes, f)
        with open(control, "w") as f:
            json.dump({}, f)
        with open(os.path.join(self.log_dir, f"{tag}.log"), "ab") as log:
            proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-m", "tests.faults.proxy",
                                     "--routes", routes_path, "--control", control, "--stats", stats],
                                    stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                    env=os.environ | {"PYTHONPATH": ROOT})
        self.procs.append(proc)
        deadline = time.monotonic() + 20
        while not os.path.exists(stats):  # written once every listener is bound
            if proc.poll() is not None or time.monotonic() > deadline:
                raise NetnsUnavailable(f"proxy {tag} in {ns} did not start (exit {proc.poll()}); "
                                       f"see {self.log_dir}/{tag}.log")
            time.sleep(0.05)
        return proc, control, stats

    def _start_forwarder(self) -> None:
        routes = [{"name": f"client->n{i}", "listen": f"unix:{self.client_sock(i)}",
                   "upstream": f"{svc_ip(i)}:{GRPC_PORT}", "link": "client"} for i in range(1, self.size + 1)]
        _, _, self.forwarder_stats = self._spawn_proxy(self.hub, "forwarder", routes)

    def _start_raft_proxy(self, i: int) -> None:
        ns = self.ns(i)
        routes = []
        for j in range(1, self.size + 1):
            if j == i:
                continue
            ip("-n", ns, "addr", "add", f"{raft_ip(j)}/32", "dev", "lo")  # shadow: n<i> dials its proxy
            routes.append({"name": f"n{i}->n{j}", "listen": f"{raft_ip(j)}:{RAFT_BASE_PORT + j}",
                           "upstream": f"{svc_ip(j)}:{RAFT_BASE_PORT + j}", "link": "raft"})
        proc, control, stats = self._spawn_proxy(ns, f"proxy-n{i}", routes)
        self.raft_proxies.append(proc)
        self.control_paths.append(control)
        self.stats_paths.append(stats)

    def client_sock(self, i: int) -> str:
        return os.path.join(self.sock_dir, f"n{i}.sock")

    # ---- faults --------------------------------------------------------------------------------

    def partition(self, *groups: list[int]) -> None:
        """Cut every link between nodes of different groups (node numbers from 1); others stay up."""
        for gi, a_group in enumerate(groups):
            for b_group in groups[gi + 1:]:
                for a in a_group:
                    for b in b_group:
                        self.cut(a, b)

    def cut(self, a: int, b: int) -> None:
        """Drop traffic between nodes a and b, both ways (blackhole routes to both of the peer's addresses)."""
        for x, y in ((a, b), (b, a)):
            if (x, y) in self.blackholes:
                continue
            for addr in (raft_ip(y), svc_ip(y)):
                ip("-n", self.ns(x), "route", "add", "blackhole", f"{addr}/32")
            self.blackholes.add((x, y))

    def cut_cable(self, i: int) -> None:
        """Set node i's veth end in the hub down: it loses every peer and the client."""
        ip("-n", self.hub, "link", "set", f"v{i}", "down")
        self.cables_cut.add(i)

    def heal(self) -> None:
        for x, y in sorted(self.blackholes):
            for addr in (raft_ip(y), svc_ip(y)):
                ip("-n", self.ns(x), "route", "del", "blackhole", f"{addr}/32", check=False)
        self.blackholes.clear()
        for i in sorted(self.cables_cut):
            ip("-n", self.hub, "link", "set", f"v{i}", "up")
        self.cables_cut.clear()

    def set_delay(self, delay_ms: float, jitter_ms: float) -> None:
        """Delay ± jitter on every Raft link, each direction (0, 0: off)."""

        assert self.proxied, "the lab was created without Raft proxies"
        spec = {"delay_ms": delay_ms, "jitter_ms": jitter_ms}
        for path in self.control_paths:
            with open(path, "w") as f:
                json.dump({"raft": {"up": spec, "down": spec}}, f)
        for proc in self.raft_proxies:
            proc.send_signal(signal.SIGHUP)

    def proxy_stats(self) -> dict[str, Any]:
        """Counters of every Raft proxy route, by route name (n<i>->n<j>)."""

        out: dict[str, Any] = {}
        for path in self.stats_paths:
            with open(path) as f:
                out.update(json.load(f)["routes"])
        return out

    # ---- teardown ------------------------------------------------------------------------------

    def destroy(self) -> None:
        """Stop helper processes, delete every namespace (their veths and bridge go with them)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for name in [self.ns(i) for i in range(1, self.size + 1)] + [self.hub]:
            _kill_netns_pids(name)
            ip("netns", "del", name, check=False)
        if self.sock_dir:
            shutil.rmtree(self.sock_dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        r = ip("netns", "list", check=False)
        return [line.split()[0] for line in r.stdout.splitlines() if line.startswith(self.token)]


class NetnsCluster(Cluster):
    """tests.cluster.Cluster with node i in namespace <tok>-n<i>, reached by the test through the hub."""

    def __init__(self, root: str, lab: Lab, **settings: Any) -> None:
        self.lab = lab
        super().__init__(root, lab.size, connect=self._connect, **settings)
        self._sock_of: dict[str, str] = {}
        for i, n in enumerate(self.nodes, start=1):
            n.raft_addr = f"{raft_ip(i)}:{RAFT_BASE_PORT + i}"
            n.grpc_addr = f"{svc_ip(i)}:{GRPC_PORT}"
            self._sock_of[n.grpc_addr] = lab.client_sock(i)
        for n in self.nodes:
            self._write_config(n)

    def _connect(self, addr: str, options: list) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{self._sock_of[addr]}", options=options)

    def index(self, node: Any) -> int:
        return self.nodes.index(node) + 1

    def start(self, node: Any = None) -> None:
        for n in [node] if node else self.nodes:
            with open(n.log_path, "ab") as log:
                # `ip netns exec` execs (no fork): the Popen pid is the node, so kill/SIGSTOP reach it.
                n.proc = subprocess.Popen(
                    ["ip", "netns", "exec", self.lab.ns(self.index(n)), sys.executable, "-m",
                     "nameserver.cli.serve", "serve", "--config", n.config_path],
                    stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=os.environ | {"PYTHONPATH": ROOT})
