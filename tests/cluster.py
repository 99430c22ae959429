"""A real multi-process nameserver cluster on 127.0.0.1 for tests: start, kill -9, restart, inspect."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from nameserver.localports import free_ports, free_strided_ports
from nameserver.pb import api_pb2, api_pb2_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))




@dataclass
class NodeProc:
    name: str
    raft_addr: str
    grpc_addr: str
    config_path: str
    log_path: str
    metrics_addr: str = ""  # host:port of /metrics when the cluster was made with metrics=True
    remoting_addr: str = ""  # host:port of the RocketMQ remoting listener when made with remoting=True
    controller_addr: str = ""  # host:port of the controller-mode listener when made with controller=True
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to the node process's environment
    channel: grpc.Channel | None = field(default=None, repr=False)
    # How tests reach the node (TLS, tokens) when the cluster was made with `connect=`; default plaintext.
    connect: Callable[[str, list], grpc.Channel] | None = field(default=None, repr=False)

    @property
    def ns(self) -> api_pb2_grpc.NameServerStub:
        return api_pb2_grpc.NameServerStub(self._channel())

    @property
    def admin(self) -> api_pb2_grpc.AdminStub:
        return api_pb2_grpc.AdminStub(self._channel())

    def _channel(self) -> grpc.Channel:
        if self.channel is None:
            opts = [("grpc.max_send_message_length", 64 << 20), ("grpc.max_receive_message_length", 64 << 20),
                    # A node that is starting, or restarted after a kill, is found within 0.1-0.25 s, not
                    # after gRPC's default reconnect backoff (1 s, growing to 120 s while it is down): every
                    # cluster start and restart waits for it (a node's start takes 1-3 s, so at a 1 s cap
                    # the first reconnect after it came up was half a second late on average).
                    ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                    ("grpc.max_reconnect_backoff_ms", 250)]
            self.channel = (self.connect(self.grpc_addr, opts) if self.connect is not None
                            else grpc.insecure_channel(self.grpc_addr, options=opts))
        return self.channel

    def status(self, timeout: float = 1.0) -> api_pb2.NodeStatus | None:
        try:
            return self.admin.Status(api_pb2.StatusRequest(), timeout=timeout)
        except grpc.RpcError:
            return None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class Cluster:
    def __init__(self, root: str, size: int = 3, metrics: bool = False, remoting: bool = False,
                 controller: bool = False, security: dict | Callable[[NodeProc], dict] | None = None,
                 connect: Callable[[str, list], grpc.Channel] | None = None, worker_processes: int = 0,
                 groups: int = 1, grpc_front: str = "", **settings: Any) -> None:
        """`security`: extra TOML sections ({"tls": {...}, "raft": {"password_file": ...}}), or a function of
        the node giving them; `connect(addr, options)`: the channel tests use to reach a node;
        `worker_processes`: [node] worker_processes (remoting worker processes beside each node);
        `groups`: [sharding] groups (Raft groups: group k's Raft ports are free at raft_port_step strides);
        `grpc_front`: [node] grpc_front ("": the node's default, "auto": "go" with workers once built)."""
        self.root = root
        self.worker_processes = worker_processes
        self.grpc_front = grpc_front
        self.groups = groups
        # wait_ready's default: a node's public ports open only once its workers' replicas have loaded,
        # which on a 2-core machine at load 20-60 took 17-40 s after the core was ready (docs/faults.md)
        self.ready_timeout = 120.0 if worker_processes else 30.0
        self.security = security
        self.settings = {"default_timeout_ms": 120000, "scan_interval_ms": 1000,
                         "snapshot_every_entries": 10000, "snapshot_every_seconds": 300} | settings
        ports = iter(free_ports(size * (1 + metrics + remoting + controller)))
        raft_ports, self.raft_port_step = free_strided_ports(size, groups)
        self.nodes = [NodeProc(f"n{i + 1}", f"127.0.0.1:{raft_ports[i]}", f"127.0.0.1:{next(ports)}",
                               os.path.join(root, f"n{i + 1}.toml"), os.path.join(root, f"n{i + 1}.log"),
                               f"127.0.0.1:{next(ports)}" if metrics else "")
                      for i in range(size)]
        for n in self.nodes:
            n.remoting_addr = f"127.0.0.1:{next(ports)}" if remoting else ""
            n.controller_addr = f"127.0.0.1:{next(ports)}" if controller else ""
        for n in self.nodes:
            n.connect = connect
            self._write_config(n)

    def _write_config(self, node: NodeProc, members: list[NodeProc] | None = None) -> None:
        """Write a node's TOML; `members` (default: every node) is its initial cluster membership."""
        s = self.settings
        lines = ["[node]", f'raft_addr = "{node.raft_addr}"', f'grpc_addr = "{node.grpc_addr}"',
                 f'data_dir = "{node.name}-data"']
        lines += [f"worker_processes = {self.worker_processes}"]  # explicit: the default is "auto"
        lines += [f'grpc_front = "{self.grpc_front}"', ""] if self.grpc_front else [""]
        if self.groups > 1:
            # the leader-balancing duty off unless a test sets it: it would move leaders under other tests
            lines += ["[sharding]", f"groups = {self.groups}", f"raft_port_step = {self.raft_port_step}",
                      f"leader_balance_s = {s.get('leader_balance_s', 0)}", ""]
        for m in members or self.nodes:
            lines += ["[[cluster.members]]", f'raft_addr = "{m.raft_addr}"', f'grpc_addr = "{m.grpc_addr}"']
            lines += [f'controller_addr = "{m.controller_addr}"', ""] if m.controller_addr else [""]
        lines += ["[liveness]", f"default_timeout_ms = {s['default_timeout_ms']}",
                  f"scan_interval_ms = {s['scan_interval_ms']}", "",
                  "[raft]", f"snapshot_every_entries = {s['snapshot_every_entries']}",
                  f"snapshot_every_seconds = {s['snapshot_every_seconds']}", ""]
        if "session_ttl_ms" in s:
            lines += ["[sessions]", f"session_ttl_ms = {s['session_ttl_ms']}", ""]
        if node.metrics_addr:
            lines += ["[metrics]", f'listen = "{node.metrics_addr}"', ""]
            # a monitored cluster runs the idle no-op, as deploy/ does, so apply lag stays meaningful
            lines.insert(lines.index("[raft]") + 1, "idle_noop_ms = 500")
        if node.remoting_addr:
            lines += ["[remoting]", f'listen = "{node.remoting_addr}"', ""]
        if node.controller_addr:
            lines += ["[controller]", f'listen = "{node.controller_addr}"',
                      f"scan_interval_ms = {s.get('controller_scan_interval_ms', 500)}", ""]
        sections = self.security(node) if callable(self.security) else self.security
        for section, table in (sections or {}).items():
            body = [f"{k} = {_toml(v)}" for k, v in table.items()]
            if f"[{section}]" in lines:  # a section written above: add to it (TOML forbids a second header)
                at = lines.index(f"[{section}]") + 1
                lines[at:at] = body
            else:
                lines += [f"[{section}]", *body, ""]
        with open(node.config_path, "w") as f:
            f.write("\n".join(lines))

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self, node: NodeProc | None = None) -> None:
        for n in [node] if node else self.nodes:
            with open(n.log_path, "ab") as log:
                n.proc = subprocess.Popen(
                    [sys.executable, "-m", "nameserver.cli.serve", "serve", "--config", n.config_path],
                    stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                    env=os.environ | {"PYTHONPATH": ROOT} | n.env)

    def kill(self, node: NodeProc, sig: int = signal.SIGKILL) -> None:
        assert node.proc is not None
        node.proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM):
            node.proc.wait(timeout=15)

    def stop(self, wait: bool = True) -> None:
        """SIGTERM every node and wait for it (SIGKILL after 10 s). `wait=False`, for a teardown that checks
        nothing more: the nodes shut down (0.5-2 s) while the next test starts; a later stop collects them
        and `reap_stopped` waits for the rest."""
        for n in self.nodes:
            if n.alive:
                n.proc.send_signal(signal.SIGCONT)
                n.proc.terminate()
        for n in self.nodes:
            if n.channel is not None:
                n.channel.close()
                n.channel = None
        procs = [n.proc for n in self.nodes if n.proc is not None]
        if wait:
            for proc in procs:
                _wait_or_kill(proc)
        else:
            _reap_stopped(block=False)
            _stopping.extend((time.monotonic() + 10, proc) for proc in procs)

    def logs(self) -> str:
        out = []
        for n in self.nodes:
            if os.path.exists(n.log_path):
                with open(n.log_path, errors="replace") as f:
                    out.append(f"===== {n.name} =====\n" + "".join(f.readlines()[-60:]))
        return "\n".join(out)

    # ---- waiting -------------------------------------------------------------------------------

    def wait_for(self, what: str, cond: Callable[[], Any], timeout: float = 20.0, every: float = 0.1) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = cond()
            if result:
                return result
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.logs()}")

    def statuses(self, nodes: list[NodeProc] | None = None) -> list[api_pb2.NodeStatus | None]:
        return [n.status() for n in (nodes or self.nodes)]

    def leader(self, nodes: list[NodeProc] | None = None) -> NodeProc | None:
        for n in nodes or self.nodes:
            if n.alive:
                st = n.status()
                if st is not None and st.role == api_pb2.ROLE_LEADER and st.ready:
                    return n
        return None

    def wait_ready(self, nodes: list[NodeProc] | None = None, timeout: float | None = None) -> NodeProc:
        nodes = nodes or [n for n in self.nodes if n.alive]
        timeout = self.ready_timeout if timeout is None else timeout

        def ok() -> NodeProc | None:
            sts = self.statuses(nodes)
            # a remoting port opens just after its node turns ready (docs/remoting.md, "A starting node")
            if all(s is not None and s.ready for s in sts) and all(_accepts(n.remoting_addr) for n in nodes):
                return self.leader(nodes)
            return None

        return self.wait_for("a leader and every node ready", ok, timeout)

    def wait_converged(self, nodes: list[NodeProc] | None = None, timeout: float = 30.0
                       ) -> list[api_pb2.NodeStatus]:
        """Every node ready, its remoting port (if any) open, at the same apply offset with the same digest."""
        nodes = nodes or [n for n in self.nodes if n.alive]

        def ok() -> list[api_pb2.NodeStatus] | None:
            sts = self.statuses(nodes)
            if any(s is None or not s.ready for s in sts):
                return None
            # ready turns true just before a restarted node's remoting port opens (as in wait_ready)
            if not all(_accepts(n.remoting_addr) for n in nodes):
                return None
            if len({s.apply_offset for s in sts}) == 1 and len({s.digest for s in sts}) == 1:
                return sts
            return None

        return self.wait_for("equal apply offsets and digests", ok, timeout)

    def followers(self) -> list[NodeProc]:
        leader = self.leader()
        return [n for n in self.nodes if n.alive and n is not leader]


@contextmanager
def running(cluster: Cluster, timeout: float = 30.0) -> Iterator[Cluster]:
    """Start `cluster` and wait until it is ready; stopped on the way out (not waited for: see
    `Cluster.stop`), also when starting failed."""
    cluster.start()
    try:
        cluster.wait_ready(timeout=timeout)
        yield cluster
    finally:
        cluster.stop(wait=False)


# Node processes a teardown told to stop and did not wait for (Cluster.stop(wait=False)), each with the
# time it is SIGKILLed by if still running (10 s, as a waited stop).
_stopping: list[tuple[float, subprocess.Popen]] = []


def _wait_or_kill(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    try:
        proc.wait(timeout=max(0.0, timeout))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _reap_stopped(block: bool) -> None:
    """Collect the stopped nodes that exited, kill those past their 10 s; `block`: wait for all of them."""
    now = time.monotonic()
    for entry in list(_stopping):
        deadline, proc = entry
        if block or proc.poll() is not None or now > deadline:
            _wait_or_kill(proc, deadline - time.monotonic())
            _stopping.remove(entry)


def reap_stopped() -> None:
    """Wait for every node stopped without waiting: at the session's end none outlives the tests."""
    _reap_stopped(block=True)


def _accepts(addr: str) -> bool:
    """A TCP connection to `addr` ("" when there is no listener: True) is accepted."""
    if not addr:
        return True
    host, port = addr.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml(str(k))} = {_toml(v)}" for k, v in value.items()) + "}"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def register_request(cluster: str, name: str, addr: str, topics: list[str], broker_id: int = 0,
                     counter: int = 1, timeout_ms: int = 0, queues: int = 4) -> api_pb2.RegisterBrokerRequest:
    from nameserver.pb import state_pb2

    return api_pb2.RegisterBrokerRequest(
        cluster_name=cluster, broker_name=name, broker_addr=addr, broker_id=broker_id,
        ha_server_addr=addr.rsplit(":", 1)[0] + ":10912", heartbeat_timeout_ms=timeout_ms,
        data_version=state_pb2.DataVersion(counter=counter, timestamp=1700000000000),
        topics=[api_pb2.TopicConfig(topic_name=t, read_queue_nums=queues, write_queue_nums=queues, perm=6)
                for t in topics])


def retry(fn: Callable[[], Any], timeout: float = 10.0, codes: tuple = (grpc.StatusCode.UNAVAILABLE,
          grpc.StatusCode.DEADLINE_EXCEEDED)) -> Any:
    """Call fn until it stops failing with a retryable status (as a client library would)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except grpc.RpcError as exc:
            if exc.code() not in codes or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
