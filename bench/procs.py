"""Start and stop a real local nameserver cluster for the benchmark harness.

Each node is a `nameserver serve` process on free 127.0.0.1 ports, with its TOML, log and data
directory under one root. The harness kills, pauses and restarts nodes through this class.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from nameserver.localports import free_ports, free_strided_ports
from nameserver.pb import api_pb2, api_pb2_grpc


def rss_bytes(pid: int) -> int:
    """Resident memory of a process (Linux /proc)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0



def with_descendants(pids: list[int]) -> list[int]:
    """The processes and every live process below them (a node's worker processes count as the node's),
    from each thread's /proc children list."""
    out, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        out.append(pid)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(child) for child in f.read().split()]
            except OSError:
                pass
    return out


@contextmanager
def children_on(cpus: set[int] | None) -> Iterator[None]:
    """Processes started inside run only on `cpus` (None: no change), as under `taskset -c`: they inherit
    the starting thread's CPU affinity, so a JVM sizes its thread pools for the CPUs it is given."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)

def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


@dataclass
class BenchNode:
    name: str
    raft_addr: str
    grpc_addr: str
    config_path: str
    log_path: str
    data_dir: str
    remoting_addr: str = ""
    proc: subprocess.Popen | None = None
    channel: grpc.Channel | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def ns(self) -> api_pb2_grpc.NameServerStub:
        return api_pb2_grpc.NameServerStub(self._channel())

    def admin(self) -> api_pb2_grpc.AdminStub:
        return api_pb2_grpc.AdminStub(self._channel())

    def _channel(self) -> grpc.Channel:
        if self.channel is None:
            self.channel = grpc.insecure_channel(self.grpc_addr, options=[
                ("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20),
                ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)])
        return self.channel

    def status(self, timeout: float = 1.0) -> api_pb2.NodeStatus | None:
        try:
            return self.admin().Status(api_pb2.StatusRequest(), timeout=timeout)
        except grpc.RpcError:
            return None

    def require_status(self, timeout: float = 5.0) -> api_pb2.NodeStatus:
        """The node's status; RuntimeError when it does not answer (a benchmark cannot go on without it)."""
        st = self.status(timeout)
        if st is None:
            raise RuntimeError(f"{self.name} did not answer Status within {timeout}s; see {self.log_path}")
        return st

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)


@dataclass
class LocalCluster:
    """`size` nodes under `root`. `sections` adds TOML (e.g. {"raft": {"fsync": False}}; a "node" table joins
    the node's own). `remoting`: each node also listens for the RocketMQ remoting protocol."""

    root: str
    size: int = 3
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: list[BenchNode] = field(default_factory=list)
    remoting: bool = False
    groups: int = 1  # [sharding] groups: group k's Raft ports are free at raft_port_step strides

    def __post_init__(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        per = 3 if self.remoting else 2
        ports = free_ports(per * self.size)
        raft_ports, step = free_strided_ports(self.size, self.groups)
        if self.groups > 1:
            self.sections = self.sections | {"sharding": {"groups": self.groups, "raft_port_step": step}}
        for i in range(self.size):
            name = f"n{i + 1}"
            self.nodes.append(BenchNode(name, f"127.0.0.1:{raft_ports[i]}", f"127.0.0.1:{ports[per * i + 1]}",
                                        os.path.join(self.root, f"{name}.toml"),
                                        os.path.join(self.root, f"{name}.log"),
                                        os.path.join(self.root, f"{name}-data"),
                                        f"127.0.0.1:{ports[per * i + 2]}" if self.remoting else ""))
        for n in self.nodes:
            self._write_config(n)

    def _write_config(self, node: BenchNode) -> None:
        own = {"worker_processes": 0, **self.sections.get("node", {})}  # explicit: the default is "auto"
        lines = ["[node]", f'raft_addr = "{node.raft_addr}"', f'grpc_addr = "{node.grpc_addr}"',
                 f'data_dir = "{node.data_dir}"', *(f"{k} = {_toml(v)}" for k, v in own.items()), ""]
        for m in self.nodes:
            lines += ["[[cluster.members]]", f'raft_addr = "{m.raft_addr}"', f'grpc_addr = "{m.grpc_addr}"', ""]
        if node.remoting_addr:
            lines += ["[remoting]", f'listen = "{node.remoting_addr}"', ""]
        for section, table in ((k, v) for k, v in self.sections.items() if k != "node"):
            lines += [f"[{section}]", *(f"{k} = {_toml(v)}" for k, v in table.items()), ""]
        with open(node.config_path, "w") as f:
            f.write("\n".join(lines))

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self, node: BenchNode | None = None) -> None:
        for n in [node] if node else self.nodes:
            with open(n.log_path, "ab") as log:
                n.proc = subprocess.Popen([sys.executable, "-m", "nameserver.cli.serve", "serve",
                                           "--config", n.config_path],
                                          stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, node: BenchNode, sig: int = signal.SIGKILL) -> None:
        if node.proc and node.proc.poll() is None:
            node.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                node.proc.wait(timeout=30)

    def stop(self) -> None:
        for n in self.nodes:
            if n.proc and n.proc.poll() is None:
                n.proc.send_signal(signal.SIGCONT)
                n.proc.terminate()
        for n in self.nodes:
            if n.proc:
                try:
                    n.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    n.proc.kill()
            if n.channel is not None:
                n.channel.close()
                n.channel = None

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- waiting -------------------------------------------------------------------------------

    def leader(self, among: list[BenchNode] | None = None) -> BenchNode | None:
        for n in among or self.nodes:
            st = n.status(timeout=0.5) if n.proc and n.proc.poll() is None else None
            if st is not None and st.role == api_pb2.ROLE_LEADER and st.ready:
                return n
        return None

    def wait_ready(self, nodes: list[BenchNode] | None = None, timeout: float = 60.0) -> BenchNode:
        """Wait until every node in `nodes` (default all) is ready and one of them leads."""
        nodes = nodes or self.nodes
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sts = [n.status(timeout=0.5) for n in nodes]
            ready = [s for s in sts if s is not None and s.ready]
            if len(ready) == len(nodes):
                for n, s in zip(nodes, ready, strict=True):
                    if s.role == api_pb2.ROLE_LEADER:
                        return n
            for n in nodes:
                if n.proc is not None and n.proc.poll() is not None:
                    raise RuntimeError(f"{n.name} exited with {n.proc.returncode}; see {n.log_path}")
            time.sleep(0.05)
        raise TimeoutError(f"cluster not ready within {timeout}s; logs under {self.root}")

    def wait_converged(self, nodes: list[BenchNode] | None = None, timeout: float = 120.0) -> list[api_pb2.NodeStatus]:
        nodes = nodes or self.nodes
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            sts = [s for n in nodes if (s := n.status(timeout=1.0)) is not None]
            if len(sts) == len(nodes) and len({(s.apply_offset, s.digest) for s in sts}) == 1 \
                    and all(s.commit_offset == s.apply_offset for s in sts):
                return sts
            time.sleep(0.1)
        raise TimeoutError(f"nodes did not converge within {timeout}s; logs under {self.root}")


__all__ = ["BenchNode", "LocalCluster", "rss_bytes"]
