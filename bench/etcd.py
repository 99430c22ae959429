"""A real 3-member etcd cluster on 127.0.0.1 for side-by-side benchmarks, and its gRPC stubs.

etcd is Debian's `etcd-server` (3.4.x), installed by scripts/ensure-debian-package.sh when the
`etcd` binary is missing. Members run with etcd's defaults, which matter for the comparison:
the WAL is fsynced before every commit is acknowledged (etcd 3.4 has no switch to turn that off),
heartbeat 100 ms, election timeout 1000 ms, snapshot every 100,000 entries.

The client is plain grpcio over a trimmed copy of etcd's API protos (proto/etcd, generated into
bench.pb.etcd): the same Python gRPC machinery the harness uses for our own cluster, so the
client side costs the same for both.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field

import grpc

from bench.pb.etcd.etcdserverpb import rpc_pb2, rpc_pb2_grpc
from bench.procs import rss_bytes
from nameserver.localports import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENSURE_SCRIPT = os.path.join(ROOT, "scripts", "ensure-debian-package.sh")
# The WAL fsync is etcd's default and cannot be disabled in 3.4; said in every report.
FSYNC_NOTE = "etcd default: WAL fsynced before each commit is acknowledged (not configurable in 3.4)"


class EtcdUnavailable(RuntimeError):
    """etcd is not installed and could not be installed: the comparison cannot run."""


def ensure_etcd() -> str:
    """Path of the `etcd` binary, installing Debian's etcd-server first when it is missing."""
    if shutil.which("etcd") is None:
        proc = subprocess.run(["bash", ENSURE_SCRIPT, "etcd-server", "etcd"], capture_output=True, text=True)
        if proc.returncode != 0 or shutil.which("etcd") is None:
            raise EtcdUnavailable(
                "the etcd side of the benchmark needs Debian's etcd-server (the `etcd` binary) and it could "
                f"not be installed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-800:]}\n"
                "install it by hand: apt-get install -y etcd-server")
    path = shutil.which("etcd")
    assert path is not None
    return path


def etcd_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    for line in out.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range_end for "every key starting with prefix" (the prefix with its last byte + 1)."""
    p = bytearray(prefix)
    while p:
        if p[-1] < 0xFF:
            p[-1] += 1
            return bytes(p)
        p.pop()
    return b"\0"  # every key


@dataclass
class EtcdMember:
    name: str
    client_addr: str  # host:port, what gRPC clients dial
    peer_url: str
    data_dir: str
    log_path: str
    proc: subprocess.Popen | None = None
    channel: grpc.Channel | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc else 0

    def _channel(self) -> grpc.Channel:
        if self.channel is None:
            self.channel = grpc.insecure_channel(self.client_addr)
        return self.channel

    def kv(self) -> rpc_pb2_grpc.KVStub:
        return rpc_pb2_grpc.KVStub(self._channel())

    def maintenance(self) -> rpc_pb2_grpc.MaintenanceStub:
        return rpc_pb2_grpc.MaintenanceStub(self._channel())

    def status(self, timeout: float = 1.0) -> rpc_pb2.StatusResponse | None:
        try:
            return self.maintenance().Status(rpc_pb2.StatusRequest(), timeout=timeout)
        except grpc.RpcError:
            return None

    def rss_bytes(self) -> int:
        return rss_bytes(self.pid)


@dataclass
class EtcdCluster:
    """`size` etcd members under `root` (data dirs `root/<name>.etcd`, logs `root/<name>.log`)."""

    root: str
    size: int = 3
    members: list[EtcdMember] = field(default_factory=list)
    binary: str = ""
    # etcd refuses a transaction of more than --max-txn-ops operations (default 128): a broker with
    # more topics cannot register atomically at all. The harness raises it to fit the workload.
    max_txn_ops: int = 128

    def __post_init__(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        ports = free_ports(2 * self.size)
        for i in range(self.size):
            name = f"e{i + 1}"
            self.members.append(EtcdMember(name, f"127.0.0.1:{ports[2 * i]}", f"http://127.0.0.1:{ports[2 * i + 1]}",
                                           os.path.join(self.root, f"{name}.etcd"),
                                           os.path.join(self.root, f"{name}.log")))

    def start(self) -> None:
        self.binary = self.binary or ensure_etcd()
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        token = f"bench-{uuid.uuid4().hex[:8]}"  # a fresh cluster id: never joins a leftover member
        for m in self.members:
            client_url = f"http://{m.client_addr}"
            args = [self.binary, "--name", m.name, "--data-dir", m.data_dir,
                    "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
                    "--listen-peer-urls", m.peer_url, "--initial-advertise-peer-urls", m.peer_url,
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--initial-cluster-token", token, "--max-txn-ops", str(self.max_txn_ops),
                    "--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"]
            with open(m.log_path, "ab") as log:
                # Own session: a Ctrl-C of the harness does not reach etcd before we stop it in order.
                m.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, member: EtcdMember, sig: int = signal.SIGKILL) -> None:
        if member.proc and member.proc.poll() is None:
            member.proc.send_signal(sig)
            if sig in (signal.SIGKILL, signal.SIGTERM):
                member.proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop every member: the followers, then the leader. A leader stopped together with its
        followers first tries to hand its leadership to one of them, and waits out etcd's request
        timeout (about 7 s) when they are gone; alone, with no peer left, it stops at once."""
        for m in self.members:
            if m.proc and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGCONT)
        leader = self.leader()
        self._terminate([m for m in self.members if m is not leader])
        self._terminate([leader] if leader is not None else [])
        for m in self.members:
            if m.channel is not None:
                m.channel.close()
                m.channel = None

    @staticmethod
    def _terminate(members: list[EtcdMember]) -> None:
        for m in members:
            if m.proc and m.proc.poll() is None:
                m.proc.terminate()
        for m in members:
            if m.proc:
                try:
                    m.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    m.proc.wait(timeout=15)

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def leader(self) -> EtcdMember | None:
        """The member every live member names as leader (Maintenance.Status), if they agree."""
        ids: dict[int, EtcdMember] = {}
        leaders = set()
        for m in self.members:
            st = m.status(timeout=0.5) if m.proc and m.proc.poll() is None else None
            if st is None:
                continue
            ids[st.header.member_id] = m
            leaders.add(st.leader)
        if len(leaders) == 1:
            return ids.get(leaders.pop())
        return None

    def wait_ready(self, timeout: float = 60.0) -> EtcdMember:
        """Wait until every member answers Status, they agree on a leader, and a linearizable read works."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for m in self.members:
                if m.proc is not None and m.proc.poll() is not None:
                    raise RuntimeError(f"etcd {m.name} exited with {m.proc.returncode}; see {m.log_path}")
            sts = [m.status(timeout=0.5) for m in self.members]
            if all(s is not None and s.leader for s in sts) and len({s.leader for s in sts if s}) == 1:
                leader = self.leader()
                if leader is not None:
                    try:
                        for m in self.members:  # a linearizable read on each: every member serves
                            m.kv().Range(rpc_pb2.RangeRequest(key=b"bench/ready"), timeout=2)
                        return leader
                    except grpc.RpcError:
                        pass
            time.sleep(0.05)
        raise TimeoutError(f"etcd cluster not ready within {timeout}s; logs under {self.root}")


__all__ = ["FSYNC_NOTE", "EtcdCluster", "EtcdMember", "EtcdUnavailable", "ensure_etcd", "etcd_version",
           "prefix_end"]
