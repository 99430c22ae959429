"""Node configuration: a TOML file, overridden by command-line flags.

    [node]
    raft_addr = "127.0.0.1:9201"      # this node's id in the cluster
    grpc_addr = "127.0.0.1:9101"
    data_dir = "data/local/n1"

    [[cluster.members]]               # every member, this node included
    raft_addr = "127.0.0.1:9201"
    grpc_addr = "127.0.0.1:9101"

    [raft]      election_min_ms, election_max_ms, snapshot_every_entries, snapshot_every_seconds,
                snapshots_kept, batch_append, idle_noop_ms, password_file / password_env
    [liveness]  default_timeout_ms (RocketMQ: 120000), scan_interval_ms (5000), forward_interval_ms
    [routes]    order_message_enable, zone_mode
    [grpc]      max_message_bytes, workers, write_timeout_ms
    [sessions]  session_ttl_ms, max_sessions (exactly-once client sessions)
    [remoting]  listen = "127.0.0.1:9876"   (RocketMQ remoting protocol; off when absent)
    [metrics]   listen = "127.0.0.1:9301"   (Prometheus /metrics; off when absent)
    [archive]   dir = "archive"              (node-side log archive; off when absent)
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any


class ConfigError(Exception):
    pass


@dataclass(frozen=True)
class Member:
    raft_addr: str
    grpc_addr: str


@dataclass
class NodeConfig:
    raft_addr: str
    grpc_addr: str
    data_dir: str
    members: list[Member]
    election_min_ms: int = 400
    election_max_ms: int = 1400
    snapshot_every_entries: int = 10_000
    snapshot_every_seconds: float = 300.0
    snapshots_kept: int = 3
    batch_append: bool = False
    idle_noop_ms: int = 0          # leader appends a no-op when idle this long (KRaft: 500); 0: off
    password: str | None = field(default=None, repr=False)
    default_timeout_ms: int = 120_000
    scan_interval_ms: int = 5_000
    forward_interval_ms: int = 100
    order_message_enable: bool = False
    zone_mode: bool = False
    max_message_bytes: int = 8 << 20
    workers: int = 64
    max_watchers: int = 32         # each open watch holds a gRPC worker thread
    write_timeout_ms: int = 10_000
    remoting_addr: str = ""        # RocketMQ remoting protocol listener (host:port); empty: off
    metrics_addr: str = ""         # Prometheus /metrics HTTP listener (host:port); empty: off
    archive_dir: str = ""          # node-side log archive (Parquet segments); empty: off
    session_ttl_ms: int = 3_600_000  # exactly-once client sessions idle longer than this expire
    max_sessions: int = 100_000

    @property
    def partners(self) -> list[str]:
        return [m.raft_addr for m in self.members if m.raft_addr != self.raft_addr]

    def grpc_of(self, raft_addr: str | None) -> str | None:
        for m in self.members:
            if m.raft_addr == raft_addr:
                return m.grpc_addr
        return None


_SECTIONS: dict[str, tuple[str, ...]] = {
    "raft": ("election_min_ms", "election_max_ms", "snapshot_every_entries", "snapshot_every_seconds",
             "snapshots_kept", "batch_append", "idle_noop_ms"),
    "liveness": ("default_timeout_ms", "scan_interval_ms", "forward_interval_ms"),
    "routes": ("order_message_enable", "zone_mode"),
    "grpc": ("max_message_bytes", "workers", "write_timeout_ms", "max_watchers"),
    "sessions": ("session_ttl_ms", "max_sessions"),
}
# Single-key sections: [remoting] listen, [metrics] listen, [archive] dir.
_LISTENERS = {"remoting": ("listen", "remoting_addr"), "metrics": ("listen", "metrics_addr"),
              "archive": ("dir", "archive_dir")}


def load(path: str | None, overrides: dict[str, Any] | None = None) -> NodeConfig:
    doc: dict[str, Any] = {}
    if path:
        try:
            with open(path, "rb") as f:
                doc = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    base = os.path.dirname(os.path.abspath(path)) if path else os.getcwd()
    node = doc.get("node", {})
    kwargs: dict[str, Any] = {
        "raft_addr": node.get("raft_addr"),
        "grpc_addr": node.get("grpc_addr"),
        "data_dir": node.get("data_dir"),
    }
    members = [Member(str(m["raft_addr"]), str(m["grpc_addr"]))
               for m in doc.get("cluster", {}).get("members", [])]
    for section, keys in _SECTIONS.items():
        for key in keys:
            if key in doc.get(section, {}):
                kwargs[key] = doc[section][key]
    for section, (key, attr) in _LISTENERS.items():
        if key in doc.get(section, {}):
            kwargs[attr] = str(doc[section][key])
    raft = doc.get("raft", {})
    kwargs["password"] = _secret(raft.get("password_file"), raft.get("password_env"), base)
    for key, value in (overrides or {}).items():
        if value is not None:
            kwargs[key] = value
    for key in ("raft_addr", "grpc_addr", "data_dir"):
        if not kwargs.get(key):
            raise ConfigError(f"node.{key} is required")
    for attr in ("data_dir", "archive_dir"):
        if kwargs.get(attr) and not os.path.isabs(kwargs[attr]) and path:
            kwargs[attr] = os.path.normpath(os.path.join(base, kwargs[attr]))
    if not members:
        members = [Member(kwargs["raft_addr"], kwargs["grpc_addr"])]
    if kwargs["raft_addr"] not in {m.raft_addr for m in members}:
        raise ConfigError(f"node.raft_addr {kwargs['raft_addr']} is not in cluster.members")
    cfg = NodeConfig(members=members, **kwargs)
    if not 0 < cfg.election_min_ms < cfg.election_max_ms:
        raise ConfigError("raft.election_min_ms must be positive and below raft.election_max_ms")
    if cfg.scan_interval_ms < 100:
        raise ConfigError("liveness.scan_interval_ms must be >= 100")
    return cfg


def _secret(file_path: str | None, env_name: str | None, base: str) -> str | None:
    """Secrets come from a file or an environment variable, never from the config text itself."""
    if file_path:
        p = file_path if os.path.isabs(file_path) else os.path.join(base, file_path)
        try:
            with open(p) as f:
                return f.read().strip() or None
        except OSError as exc:
            raise ConfigError(f"raft.password_file: {exc}") from exc
    if env_name:
        value = os.environ.get(env_name)
        if not value:
            raise ConfigError(f"raft.password_env: environment variable {env_name} is not set")
        return value
    return None
