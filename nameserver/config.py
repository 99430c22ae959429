"""Node configuration: a TOML file, overridden by command-line flags.

    [node]
    raft_addr = "127.0.0.1:9201"      # this node's id in the cluster
    grpc_addr = "127.0.0.1:9101"
    data_dir = "data/local/n1"
    worker_processes = "auto"         # gRPC and remoting front-end processes (default "auto": one per CPU)
    grpc_front = "auto"               # who owns the gRPC port: "go", one compiled front end passing calls to
                                      # the workers, or "grpcio", each worker's own; "auto" (default): "go"
                                      # when the node has workers and `make setup` built it (docs/operations.md)
    grpc_front_cache_mb = 32          # with "go": its cache of repeated route reads' replies, MiB (0: none)

    [[cluster.members]]               # every member, this node included
    raft_addr = "127.0.0.1:9201"
    grpc_addr = "127.0.0.1:9101"

    [cluster]   initial_state = "new" (default) or "existing": a node started with an empty data directory
                to join a cluster that has data never campaigns before it has heard a leader (etcd's
                --initial-cluster-state); ignored once the node holds any entry

    [raft]      election_min_ms, election_max_ms, snapshot_every_entries, snapshot_every_seconds,
                snapshots_kept, batch_append, idle_noop_ms, password_file / password_env,
                fsync (true: the journal is on disk before an append is acknowledged; false trades
                that durability for speed: docs/benchmarks.md measures the difference), read_lease
                (true: the leader answers linearizable reads under a lease that rests on the election
                timeout and on clocks that run at about the same rate; false: a heartbeat round each),
                wire_compress_level (zlib level of Raft frames, 0 = none), group_commit_in_flight (entries
                appended and not yet committed before proposals wait to share the next one)
    [liveness]  default_timeout_ms (RocketMQ: 120000), scan_interval_ms (5000), forward_interval_ms
    [routes]    order_message_enable
    [grpc]      max_message_bytes, workers, write_timeout_ms
    [sessions]  session_ttl_ms, max_sessions, max_sessions_per_owner (exactly-once client sessions)
    [limits]    what one caller can hold of a node (docs/operations.md, "Security"): max_wait_ms,
                max_waiting_reads, remoting_max_connections, remoting_idle_timeout_ms,
                remoting_frame_timeout_ms, remoting_reply_timeout_ms, remoting_max_header_bytes,
                remoting_max_ext_fields, remoting_max_unsent_bytes(_per_connection), grpc_max_connections,
                grpc_handshake_timeout_ms, grpc_idle_timeout_ms, grpc_max_concurrent_rpcs,
                grpc_max_streams_per_connection, grpc_progress_timeout_ms, grpc_max_streams,
                grpc_max_streams_per_caller, max_followers, metrics_max_connections, metrics_timeout_ms,
                reserved_fds, metrics_max_broker_sets; quotas of the state: max_queue_datas, max_brokers, max_kv_keys,
                max_kv_bytes, max_controller_sets; registration_topics_in_flight; forward_clock_skew_ms
    [remoting]  listen = "127.0.0.1:9876"   (RocketMQ remoting protocol; off when absent), role, tls
    [metrics]   listen = "127.0.0.1:9301"   (Prometheus /metrics; off when absent)
    [archive]   dir = "archive"              (node-side log archive; off when absent)
    [controller] listen = "127.0.0.1:9878"  (RocketMQ 5 controller mode, RIP-44; off when absent), role,
                scan_interval_ms (1000), heartbeat_timeout_ms (10000, for heartbeats that name none),
                elect_unclean_master (false), notify_broker_role_changed (true); docs/controller.md.
                A member's controller address for others' answers: [[cluster.members]] controller_addr
    [sharding]  groups (1: one Raft group; > 1 needs worker_processes), raft_port_step (100),
                leader_balance_s (30; 0: off): docs/scaling.md
    [replica]   follow = ["voter:9101", ...]: a read replica's config (`nameserver replica`), not a node's;
                max_lag_entries (1000), max_silence_ms (5000)
    [security]  mode = "dev" | "secure"      (secure: Raft password, TLS and [auth] are mandatory)
    [tls]       cert_file, key_file, ca_file, client_auth = "none" | "require" (mutual TLS)
    [auth]      tokens_file (TOML [tokens] "<sha256 hex of token>" = "role"), cert_roles = {CN or SAN = role},
                peer_role ("peer"), peer_token_file / peer_token_env (this node's token for node-to-node calls)
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from typing import Any


class ConfigError(Exception):
    pass


ROLES = ("broker", "client", "admin", "peer")  # what each may call: nameserver/api/auth.py
SECURITY_MODES = ("dev", "secure")
# grpcio can only ignore client certificates or require them: "request but do not require" is not exposed.
CLIENT_AUTH = ("none", "require")
REMOTING_TLS_MODES = ("off", "permissive", "enforcing")  # RocketMQ's tls.server.mode


@dataclass(frozen=True)
class Member:
    raft_addr: str
    grpc_addr: str
    controller_addr: str = ""  # its [controller] listen address, when it serves controller mode


@dataclass
class NodeConfig:
    raft_addr: str
    grpc_addr: str
    data_dir: str
    members: list[Member]
    initial_state: str = "new"     # "existing": an empty node joining a cluster with data waits for its leader
    election_min_ms: int = 400
    # A dead leader is replaced after the first follower's timer fires: the earlier of two draws in
    # [min, max]. 900 gave failover p99 0.93-0.98 s in two short runs, but 2.0 s and one election during
    # the 10-minute load in the full run of 2026-11-26 (a leader stall of 0.4-0.9 s deposes it more
    # often); 1400 had none in two such runs (docs/benchmarks.md). Operators who want the faster
    # failover set 900. The minimum, which keeps a busy leader from being deposed, stays 400.
    election_max_ms: int = 1400
    snapshot_every_entries: int = 10_000
    snapshot_every_seconds: float = 300.0
    snapshots_kept: int = 3
    batch_append: bool = False
    fsync: bool = True
    read_lease: bool = True
    # zlib level of Raft frames (0-9): 0 (stored), because pysyncobj's 3 cost the leader's tick thread ~80 us per
    # follower for an entry of 4 registrations (3 KiB): a third of that thread's CPU per write on 3 nodes
    # (docs/benchmarks.md). A slow link between members may want 1 (5x smaller frames for registrations).
    wire_compress_level: int = 0
    group_commit_linger_us: int = 2000  # how long the leader waits for more proposals to share an entry
    # entries the leader has appended and not yet committed before new proposals wait for the next entry (and
    # share it): fewer make each entry carry more writes under load (raftlog/proposer.py, docs/benchmarks.md)
    group_commit_in_flight: int = 2
    idle_noop_ms: int = 0          # leader appends a no-op when idle this long (KRaft: 500); 0: off
    password: str | None = field(default=None, repr=False)
    default_timeout_ms: int = 120_000
    scan_interval_ms: int = 5_000
    forward_interval_ms: int = 100
    order_message_enable: bool = False
    max_message_bytes: int = 8 << 20
    workers: int = 64
    max_watchers: int = 32         # each open watch holds a gRPC worker thread
    write_timeout_ms: int = 10_000
    remoting_addr: str = ""        # RocketMQ remoting protocol listener (host:port); empty: off
    metrics_addr: str = ""         # Prometheus /metrics HTTP listener (host:port); empty: off
    archive_dir: str = ""          # node-side log archive (Parquet segments); empty: off
    # Worker processes sharing the client ports (SO_REUSEPORT), each serving reads from a read replica and
    # passing the rest to this process (docs/architecture.md). A TOML without the key gets "auto" (load: a
    # worker per CPU, so a node uses its cores); 0 here, for a config built in code: one process. Nodes
    # sharing one machine (deploy/local-3) set it, as "auto" gives each a worker per CPU of the machine.
    worker_processes: int = 0
    workers_off_reason: str = ""   # why the default "auto" ran no workers (load); said at start
    # Who terminates gRPC: "go" (front/: one compiled process owns the port and hands each call to the workers,
    # 0.45-0.57x grpcio's server CPU a route read on one node; docs/operations.md) or "grpcio" (each worker's own
    # server on the shared port). "auto", the default, is settled at the node's start (nameserver/ops/gofront.py
    # settle): "go" when the node runs workers and the front end is built (make setup), else "grpcio", said in
    # its log when it has workers. An explicit "go" builds the front end if it must, and refuses to start
    # when it cannot.
    grpc_front: str = "auto"
    # With grpc_front = "go": the front end's reply cache of repeated eventual reads (front/cache.go), MiB over
    # all workers; 0: none. Only for the Go front end (grpcio's port has no such cache).
    grpc_front_cache_mb: int = 32
    session_ttl_ms: int = 3_600_000  # exactly-once client sessions idle longer than this expire
    max_sessions: int = 100_000    # live sessions of all owners; past it a new one is refused (never evicts)
    # One owner's (caller's) live sessions: its next one evicts its own oldest, never another owner's
    # (nameserver/state/sessions.py). 10,000 keeps ten owners flooding at once within max_sessions.
    max_sessions_per_owner: int = 10_000
    security_mode: str = "dev"
    tls_cert_file: str = ""        # this node's certificate: served, and presented to peers as client cert
    tls_key_file: str = ""
    tls_ca_file: str = ""          # verifies client certificates and peer nodes
    tls_client_auth: str = "none"
    auth_tokens: dict[str, str] = field(default_factory=dict, repr=False)  # sha256 hex of token -> role
    cert_roles: dict[str, str] = field(default_factory=dict)  # certificate CN or SAN -> role
    peer_role: str = "peer"        # the role trusted with node-to-node (forwarded) calls
    peer_token: str | None = field(default=None, repr=False)  # sent to peers as a bearer token
    remoting_role: str = ""        # the role remoting calls act as; empty: the node's own (peer) rights
    remoting_tls: str = ""         # off | permissive | enforcing; empty: permissive with [tls], else off
    # [controller]: RocketMQ 5's controller (RIP-44) on this log; docs/controller.md.
    controller_addr: str = ""      # its remoting listener (brokers' controllerAddr); empty: off
    # [replica]: this process is a read replica following the voters at `follow` (their gRPC addresses),
    # not a node: `nameserver replica --config` (docs/operations.md, "Read replicas on other machines").
    replica_follow: list[str] = field(default_factory=list)
    # Past either bound a replica refuses reads (UNAVAILABLE, remoting SYSTEM_ERROR) so clients fail over.
    # 1,000 entries is about a second of heavy registration load; 5 s is five missed keepalives (a voter
    # sends one a second): a voter that died or froze is noticed, a slow network is not mistaken for one.
    replica_max_lag_entries: int = 1000
    replica_max_silence_ms: int = 5000
    # A replica follows a voter that does not lead while one is ready: the leader's CPU per write bounds the
    # cluster's writes, and each Follow stream costs its sender an encode and a send per entry. True: follow
    # the leader too (fresher by a heartbeat: a follower applies an entry when it hears it is committed).
    replica_follow_leader: bool = False
    controller_role: str = ""      # the role controller-port calls act as; empty: the node's own (peer) rights
    controller_scan_interval_ms: int = 1_000   # how often the leader looks for sets whose master went silent
    controller_heartbeat_timeout_ms: int = 10_000  # for a heartbeat that names no timeout (RocketMQ's default)
    # the defaults of two replicated settings (nameserver/state/settings.py: the log's value wins)
    elect_unclean_master: bool = False         # elect outside the in-sync replicas when none of them is alive
    notify_broker_role_changed: bool = True    # push NOTIFY_BROKER_ROLE_CHANGED to a set's brokers
    # [limits]: no caller, authenticated or not, can hold more of a node than these.
    max_wait_ms: int = 30_000      # longest any call waits server-side (min_offset, read index, a write)
    max_waiting_reads: int = 16    # reads waiting for min_offset at once; more fail RESOURCE_EXHAUSTED
    # 0: as many as the open-file limit leaves after everything else (nameserver/ops/fdlimits.py), at least
    # REMOTING_CONNECTIONS_FLOOR: a fleet's brokers and clients each hold a connection to every node.
    remoting_max_connections: int = 0
    remoting_idle_timeout_ms: int = 120_000   # RocketMQ's serverChannelMaxIdleTimeSeconds
    remoting_frame_timeout_ms: int = 30_000   # a frame, once begun, must arrive whole within this
    remoting_reply_timeout_ms: int = 30_000   # replies a client leaves unread this long close it
    # A frame's header is decoded on the listener's one thread: these bound what one frame costs it
    # (a stock header is a few hundred bytes and ~15 extFields; the frame itself may be 16 MiB).
    remoting_max_header_bytes: int = 64 << 10
    remoting_max_ext_fields: int = 256
    # Request bodies not yet handled, replies being built or not yet read by their client: per connection
    # twice the largest frame a client accepts (16 MiB), so two pipelined large replies fit; the node's
    # total bounds the rest.
    remoting_max_unsent_bytes_per_connection: int = 32 << 20
    remoting_max_unsent_bytes: int = 256 << 20
    grpc_max_connections: int = 4096
    grpc_handshake_timeout_ms: int = 10_000   # a connection that never speaks HTTP/2 is closed
    grpc_idle_timeout_ms: int = 300_000       # connections without calls are closed (clients reconnect)
    grpc_max_concurrent_rpcs: int = 1024      # calls running or queued; more fail RESOURCE_EXHAUSTED
    # What one call holds of a worker (nameserver/api/callguard.py). Streams a connection: gRPC clients
    # queue past it, but streams a fresh connection opens before the node's SETTINGS arrive are reset, so
    # it stays above any client's burst (a follower forwards at most [grpc] workers calls at once). 256
    # let a 20-connection flood grow the node by 107 MiB and writes to 1.7 s; 100: 37-49 MiB.
    grpc_max_streams_per_connection: int = 100
    grpc_progress_timeout_ms: int = 10_000    # a request message, a client stream's next, a reply's send
    grpc_max_streams: int = 16                # streaming calls at once (Watch apart): a quarter of the workers
    grpc_max_streams_per_caller: int = 4      # of those, one caller's (its token, else its address)
    # Read replicas following this node at once (Log.Follow; a node's worker processes are replicas too,
    # all with one peer credential, so they are bounded here, not per caller). Each holds a gRPC worker.
    max_followers: int = 16
    metrics_max_connections: int = 16
    metrics_timeout_ms: int = 10_000          # a scrape must send its request within this
    # broker sets with series of their own on /metrics (5 each); the rest only in totals. Any broker
    # may make a set, so this bounds the page; 256 is more sets than a real cluster runs.
    metrics_max_broker_sets: int = 256
    reserved_fds: int = 64         # descriptors no connection may take: the journal and snapshots need them
    # What the state may hold (nameserver/state/quotas.py), refused past these at translation. Sized from
    # the resident memory measured per record (docs/operations.md, "Quotas: sizing the state"): the
    # defaults together come to about 1.4 GiB per node.
    max_queue_datas: int = 1_000_000          # topic/ records (~1 KiB each): one per topic per broker name
    max_brokers: int = 10_000                 # registered broker addresses (~0.6 KiB each)
    max_kv_keys: int = 100_000                # KV config keys and namespaces (~0.5 KiB each)
    max_kv_bytes: int = 64 << 20              # their bytes (~5 bytes of a node's memory per byte stored)
    max_controller_sets: int = 10_000         # controller-mode broker sets
    # Topics of registrations being translated and proposed at once on the leader: a bigger registration
    # waits its turn (up to max_wait_ms, then RESOURCE_EXHAUSTED), so several huge ones cannot stall
    # the log (nameserver/core/budget.py). One 200,000-topic registration always fits alone.
    registration_topics_in_flight: int = 100_000
    # How far this node's wall clock may be behind a node that forwards it a write: the write is proposed
    # only while its forwarder's deadline (headers.FORWARD_DEADLINE) is more than this ahead of our clock,
    # so never after it while clocks agree this well. NTP keeps a cluster's nodes within a few ms (tens
    # across a WAN); a write arriving with less time left could hardly commit and answer in time anyway.
    forward_clock_skew_ms: int = 100
    # [sharding] (docs/scaling.md, "Sharding"): Raft groups on every node. 1: one group, today's node (a
    # group costs a core process per node, worth it only when one leader's CPU bounds the writes).
    groups: int = 1
    # group k's Raft address of a member is its raft_addr's port + k x step, so [[cluster.members]] stays one
    # list; 100, as 1 would collide with the local cluster's consecutive Raft ports (9201-9203).
    raft_port_step: int = 100
    # group k's leader hands its leadership to group k's preferred member once it has led this long and that
    # member is caught up (nameserver/groups/leaderbalance.py; Kafka's auto leader rebalance); 0: off.
    leader_balance_s: float = 30.0
    group: int = 0                 # which group this process's core runs (group_config), not a setting

    @property
    def tls_enabled(self) -> bool:
        return bool(self.tls_cert_file)

    @property
    def remoting_tls_mode(self) -> str:
        """RocketMQ's tls.server.mode for the remoting port: the key's value, else permissive when the
        node has a certificate (plain and TLS clients on one port, as RocketMQ's default), else off."""
        return self.remoting_tls or ("permissive" if self.tls_enabled else "off")

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth_tokens or self.cert_roles)

    @property
    def partners(self) -> list[str]:
        return [m.raft_addr for m in self.members if m.raft_addr != self.raft_addr]

    def grpc_of(self, raft_addr: str | None) -> str | None:
        for m in self.members:
            if m.raft_addr == raft_addr:
                return m.grpc_addr
        return None

    def controller_of(self, raft_addr: str | None) -> str:
        """A member's controller address as configured ("" when not)."""
        if raft_addr == self.raft_addr:
            return self.controller_addr
        return next((m.controller_addr for m in self.members if m.raft_addr == raft_addr), "")


INITIAL_STATES = ("new", "existing")
MAX_WORKER_PROCESSES = 64  # each one is an interpreter with a copy of the state: more is a typo
AUTO = "auto"  # [node] worker_processes = "auto": one per CPU this process may run on (auto_worker_processes)


def auto_worker_processes(max_followers: int) -> int:
    """What worker_processes = "auto" means: a worker per CPU the node may run on (its affinity, and its
    cgroup's CPU quota when it has one: a container limited to 2 CPUs on a 64-core host gets 2), and at
    most half of limits.max_followers (each worker's replica is a follower of its core; the other half
    stays for read replicas and other nodes' catch-up). One CPU: none (a worker would add a copy of the
    state and no CPU to run it on)."""
    cpus = usable_cpus()
    return 0 if cpus <= 1 else min(cpus, MAX_WORKER_PROCESSES, max_followers // 2)


def usable_cpus() -> int:
    """The CPUs this process may use: its affinity, within its cgroup's CPU quota (rounded up) if any."""
    cpus = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota()
    return cpus if quota is None else min(cpus, max(1, math.ceil(quota)))


def cgroup_cpu_quota(root: str = "/sys/fs/cgroup", own: str = "/proc/self/cgroup") -> float | None:
    """The CPUs this process's cgroup may use per period (quota / period), or None when unlimited or
    unknown. cgroup v2: <root>/<own path>/cpu.max ("max 100000" or "200000 100000"); v1:
    <root>/cpu/<own path>/cpu.cfs_quota_us (-1 unlimited) and cpu.cfs_period_us. Inside a container with a
    cgroup namespace its own path is "/"; without one (Docker's default on v1) the path names the host's
    hierarchy while the mount is the container's own cgroup: a path not under the mount falls back to the
    mount's root files, as the JDK does."""
    try:
        with open(own) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.lstrip("/")
        try:
            if hier == "0" and not controllers:  # v2
                own_dir = os.path.join(root, path)
                with open(os.path.join(own_dir if os.path.isdir(own_dir) else root, "cpu.max")) as f:
                    quota, *period = f.read().split()
                if quota != "max":
                    return int(quota) / int(period[0] if period else 100000)
            elif "cpu" in controllers.split(","):  # v1
                base = os.path.join(root, "cpu", path)
                if not os.path.isdir(base):
                    base = os.path.join(root, "cpu")
                with open(os.path.join(base, "cpu.cfs_quota_us")) as f:
                    quota_us = int(f.read())
                if quota_us > 0:
                    with open(os.path.join(base, "cpu.cfs_period_us")) as f:
                        return quota_us / int(f.read())
        except (OSError, ValueError):
            continue
    return None

# With workers the core listens on Unix sockets under <data_dir>/channel/ (the longest name below), and the
# kernel takes at most 107 bytes for such a path (sun_path's 108 with its NUL): checked at load, not at bind.
CHANNEL_SOCKET_LONGEST = os.path.join("channel", "remoting.sock")
UNIX_PATH_MAX = 107
_SECTIONS: dict[str, tuple[str, ...]] = {
    "node": ("worker_processes", "grpc_front", "grpc_front_cache_mb"),
    "raft": ("election_min_ms", "election_max_ms", "snapshot_every_entries", "snapshot_every_seconds",
             "snapshots_kept", "batch_append", "idle_noop_ms", "group_commit_linger_us", "fsync",
             "read_lease", "wire_compress_level", "group_commit_in_flight"),
    "liveness": ("default_timeout_ms", "scan_interval_ms", "forward_interval_ms"),
    "routes": ("order_message_enable",),
    "grpc": ("max_message_bytes", "workers", "write_timeout_ms", "max_watchers"),
    "sessions": ("session_ttl_ms", "max_sessions", "max_sessions_per_owner"),
    "sharding": ("groups", "raft_port_step", "leader_balance_s"),
    "limits": ("max_wait_ms", "max_waiting_reads", "remoting_max_connections", "remoting_idle_timeout_ms",
               "remoting_frame_timeout_ms", "remoting_reply_timeout_ms", "remoting_max_header_bytes",
               "remoting_max_ext_fields", "remoting_max_unsent_bytes_per_connection", "remoting_max_unsent_bytes",
               "grpc_max_connections",
               "grpc_handshake_timeout_ms", "grpc_idle_timeout_ms", "grpc_max_concurrent_rpcs",
               "grpc_max_streams_per_connection", "grpc_progress_timeout_ms", "grpc_max_streams",
               "grpc_max_streams_per_caller", "max_followers", "metrics_max_connections", "metrics_timeout_ms",
               "reserved_fds", "metrics_max_broker_sets", "max_queue_datas", "max_brokers", "max_kv_keys",
               "max_kv_bytes", "max_controller_sets", "registration_topics_in_flight", "forward_clock_skew_ms"),
}
LIMITS = _SECTIONS["limits"]
# The fewest remoting connections limits.remoting_max_connections = 0 sets, when the open-file limit leaves
# room for them (the fixed default before it followed the limit); a listener made without a budget takes it.
REMOTING_CONNECTIONS_FLOOR = 4096
# Single-key sections: [remoting] listen, [metrics] listen, [archive] dir.
# ([remoting] role and tls, [security], [tls] and [auth] are read by _security.)
_LISTENERS = {"remoting": ("listen", "remoting_addr"), "metrics": ("listen", "metrics_addr"),
              "archive": ("dir", "archive_dir")}


_DEFAULTS = {f.name: f.default for f in fields(NodeConfig)}


def _typed(name: str, value: Any, default: Any) -> Any:
    """`value` as the type of the setting's default, or a ConfigError naming the setting."""
    kind = type(default)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = default is None or isinstance(value, kind)
    if not ok:
        raise ConfigError(f"{name} must be {kind.__name__ if default is not None else 'set'}, "
                          f"not {value!r}")
    return float(value) if kind is float else value


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
    members = _cluster(doc.get("cluster", {}), kwargs)
    for section, keys in _SECTIONS.items():
        for key in keys:
            if key in doc.get(section, {}):
                value = doc[section][key]
                if key == "worker_processes" and value == AUTO:
                    continue  # resolved once the limits and the overrides are known, below
                if key == "worker_processes" and isinstance(value, str):
                    raise ConfigError(f'node.worker_processes must be int or "{AUTO}", not {value!r}')
                kwargs[key] = _typed(f"{section}.{key}", value, _DEFAULTS[key])
    for section, (key, attr) in _LISTENERS.items():
        if key in doc.get(section, {}):
            kwargs[attr] = str(doc[section][key])
    raft = doc.get("raft", {})
    kwargs["password"] = _secret(raft.get("password_file"), raft.get("password_env"), base, "raft.password")
    _security(doc, base, kwargs)
    _controller(doc.get("controller", {}), kwargs)
    if "replica" in doc:
        _replica(doc["replica"], kwargs)
    for key, value in (overrides or {}).items():
        if value is not None:
            kwargs[key] = value
    # after the overrides: "auto" depends on limits.max_followers, which they may set (or they say "auto")
    # without the key anywhere: "auto", the default (a node uses its cores)
    explicit_workers = "worker_processes" in node or (overrides or {}).get("worker_processes") is not None
    if kwargs.get("worker_processes", node.get("worker_processes", AUTO)) == AUTO:
        kwargs["worker_processes"] = auto_worker_processes(kwargs.get("max_followers", _DEFAULTS["max_followers"]))
    for key in ("raft_addr", "grpc_addr", "data_dir"):
        if not kwargs.get(key):
            raise ConfigError(f"node.{key} is required")
    for attr in ("data_dir", "archive_dir"):
        if kwargs.get(attr) and not os.path.isabs(kwargs[attr]) and path:
            kwargs[attr] = os.path.normpath(os.path.join(base, kwargs[attr]))
    if not members:
        members = [Member(kwargs["raft_addr"], kwargs["grpc_addr"], kwargs.get("controller_addr", ""))]
    if kwargs["raft_addr"] not in {m.raft_addr for m in members}:
        raise ConfigError(f"node.raft_addr {kwargs['raft_addr']} is not in cluster.members")
    cfg = NodeConfig(members=members, **kwargs)
    if not 0 < cfg.election_min_ms < cfg.election_max_ms:
        raise ConfigError("raft.election_min_ms must be positive and below raft.election_max_ms")
    if cfg.group_commit_in_flight < 1:
        raise ConfigError(f"raft.group_commit_in_flight must be >= 1, not {cfg.group_commit_in_flight}")
    if not 0 <= cfg.wire_compress_level <= 9:
        raise ConfigError("raft.wire_compress_level must be a zlib level, 0..9")
    if cfg.scan_interval_ms < 100:
        raise ConfigError("liveness.scan_interval_ms must be >= 100")
    if not 0 <= cfg.worker_processes <= MAX_WORKER_PROCESSES:
        raise ConfigError(f"node.worker_processes must be 0..{MAX_WORKER_PROCESSES}")
    if cfg.worker_processes:
        # the last group's directory is the deepest (a bad groups is refused by _check_sharding below)
        deepest = group_data_dir(cfg.data_dir, max(cfg.groups - 1, 0))
        longest = os.path.join(os.path.abspath(deepest), CHANNEL_SOCKET_LONGEST)
        length = len(os.fsencode(longest))
        if length > UNIX_PATH_MAX and not explicit_workers:
            # the default "auto" on a data_dir past the socket bound: one process, as a node ran before
            # workers were its default; said at start (server.py), never a refusal of a config that ran
            cfg = replace(cfg, worker_processes=0, workers_off_reason=f"data_dir too long for the channel "
                          f"sockets ({length} > {UNIX_PATH_MAX} bytes)")
        elif length > UNIX_PATH_MAX:
            raise ConfigError(f"node.data_dir is too long for node.worker_processes: the core's channel socket "
                              f"{longest} would be {length} bytes, past the {UNIX_PATH_MAX} a "
                              "Unix socket path may have; choose a shorter data_dir")
    _check_sharding(cfg)  # after "auto" is settled: a node with groups runs workers
    _check_front(cfg)
    # each worker's replica follows the core, and each group core's replica follows group 0's core
    if cfg.worker_processes + cfg.groups - 1 > cfg.max_followers:
        raise ConfigError(f"limits.max_followers ({cfg.max_followers}) must be at least node.worker_processes "
                          f"({cfg.worker_processes}) + sharding.groups - 1 ({cfg.groups - 1}): each worker's replica "
                          "follows the core (and each group core's follows group 0's), and one past the bound would "
                          "never become ready")
    if cfg.max_sessions_per_owner <= 0:
        raise ConfigError("sessions.max_sessions_per_owner must be positive")
    for key in LIMITS:
        if getattr(cfg, key) <= 0 and not (key == "remoting_max_connections" and cfg.remoting_max_connections == 0):
            raise ConfigError(f"limits.{key} must be positive")
    _check_security(cfg)
    return cfg


GRPC_FRONTS = (AUTO, "grpcio", "go")
MAX_FRONT_CACHE_MB = 1 << 20  # a TiB: more is a typo (and past the front end's int flag on no machine)


def _check_front(cfg: NodeConfig) -> None:
    if cfg.grpc_front not in GRPC_FRONTS:
        raise ConfigError(f'node.grpc_front must be "{AUTO}", "grpcio" or "go", not {cfg.grpc_front!r}')
    if cfg.grpc_front_cache_mb < 0:
        raise ConfigError(f"node.grpc_front_cache_mb must be 0 (no cache) or more, not {cfg.grpc_front_cache_mb}")
    if cfg.grpc_front_cache_mb > MAX_FRONT_CACHE_MB:
        raise ConfigError(f"node.grpc_front_cache_mb must be at most {MAX_FRONT_CACHE_MB} (MiB), not "
                          f"{cfg.grpc_front_cache_mb}")
    if cfg.grpc_front == "go" and cfg.replica_follow:
        raise ConfigError('node.grpc_front = "go" is a node\'s (its core starts the front end); a read replica '
                          'serves gRPC with grpcio: remove it or set "grpcio"')
    if cfg.grpc_front == "go" and cfg.worker_processes < 1:
        why = f" (they are off: {cfg.workers_off_reason})" if cfg.workers_off_reason else ""
        raise ConfigError(f'node.grpc_front = "go" needs node.worker_processes >= 1{why}: the Go front end hands '
                          "every call to the node's worker processes")


MAX_GROUPS = 64  # each group is a core process per node: more is a typo
MAX_LEADER_BALANCE_S = 86_400.0  # a day: a longer settle period is a typo (0 turns the duty off)


def _check_sharding(cfg: NodeConfig) -> None:
    if not 1 <= cfg.groups <= MAX_GROUPS:
        raise ConfigError(f"sharding.groups must be 1..{MAX_GROUPS}, not {cfg.groups}")
    if cfg.raft_port_step < 1:
        raise ConfigError(f"sharding.raft_port_step must be positive, not {cfg.raft_port_step}")
    if not 0 <= cfg.leader_balance_s <= MAX_LEADER_BALANCE_S:
        raise ConfigError(f"sharding.leader_balance_s must be 0 (off) .. {MAX_LEADER_BALANCE_S:g} seconds, "
                          f"not {cfg.leader_balance_s:g}")
    if cfg.groups == 1:
        return
    if cfg.worker_processes < 1:
        raise ConfigError(f"sharding.groups = {cfg.groups} needs node.worker_processes >= 1: only the workers "
                          "follow every group, route writes to their group and merge reads")
    for member in cfg.members:
        port = _port(member.raft_addr) + (cfg.groups - 1) * cfg.raft_port_step
        if port > 65535:
            raise ConfigError(f"sharding.raft_port_step: group {cfg.groups - 1}'s Raft port of {member.raft_addr} "
                              f"would be {port}, past 65535")


def _port(addr: str) -> int:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"raft_addr {addr!r} must be host:port")
    return int(port)


def group_raft_addr(raft_addr: str, group: int, step: int) -> str:
    """A member's Raft address in `group`: its raft_addr's port + group x step (group 0: raft_addr)."""
    if group == 0:
        return raft_addr
    host, _, _ = raft_addr.rpartition(":")
    return f"{host}:{_port(raft_addr) + group * step}"


def group_data_dir(data_dir: str, group: int) -> str:
    """Group 0 keeps data_dir itself (a one-group node's files are group 0's); group k: data_dir/g<k>."""
    return data_dir if group == 0 else os.path.join(data_dir, f"g{group}")


def group_config(cfg: NodeConfig, group: int) -> NodeConfig:
    """Group `group`'s core's configuration: its Raft addresses (every member's, shifted by the step), its
    data directory (its private sockets follow it), and for group k >= 1 no port of its own but private
    sockets (no metrics, controller or archive: the group-0 core's alone) and no workers to start (`group`
    says so; worker_processes stays, it sizes the private sockets the node's workers reach it on)."""
    if not 0 <= group < cfg.groups:
        raise ConfigError(f"group {group} is not a group of this node (sharding.groups = {cfg.groups})")
    if group == 0:
        return cfg
    step = cfg.raft_port_step
    return replace(cfg, group=group, raft_addr=group_raft_addr(cfg.raft_addr, group, step),
                   data_dir=group_data_dir(cfg.data_dir, group),
                   members=[replace(m, raft_addr=group_raft_addr(m.raft_addr, group, step), controller_addr="")
                            for m in cfg.members],
                   metrics_addr="", controller_addr="", archive_dir="")


_CONTROLLER_KEYS = {"listen": "controller_addr", "role": "controller_role",
                    "scan_interval_ms": "controller_scan_interval_ms",
                    "heartbeat_timeout_ms": "controller_heartbeat_timeout_ms",
                    "elect_unclean_master": "elect_unclean_master",
                    "notify_broker_role_changed": "notify_broker_role_changed"}


def _cluster(section: dict[str, Any], kwargs: dict[str, Any]) -> list[Member]:
    """[[cluster.members]] as Members; [cluster] initial_state into kwargs."""
    for key in section:
        if key not in ("members", "initial_state"):
            raise ConfigError(f"cluster.{key} is not a setting (settings: members, initial_state)")
    if "initial_state" in section:
        if section["initial_state"] not in INITIAL_STATES:
            raise ConfigError(f"cluster.initial_state must be one of {', '.join(INITIAL_STATES)}, "
                              f"not {section['initial_state']!r}")
        kwargs["initial_state"] = section["initial_state"]
    return [Member(str(m["raft_addr"]), str(m["grpc_addr"]), str(m.get("controller_addr", "")))
            for m in section.get("members", [])]


def _controller(section: dict[str, Any], kwargs: dict[str, Any]) -> None:
    for key, value in section.items():
        attr = _CONTROLLER_KEYS.get(key)
        if attr is None:
            raise ConfigError(f"controller.{key} is not a setting (settings: {', '.join(_CONTROLLER_KEYS)})")
        kwargs[attr] = _typed(f"controller.{key}", value, _DEFAULTS[attr])
    for attr in ("controller_scan_interval_ms", "controller_heartbeat_timeout_ms"):
        if attr in kwargs and kwargs[attr] < 100:
            raise ConfigError(f"controller.{attr.removeprefix('controller_')} must be >= 100")


_REPLICA_KEYS = {"max_lag_entries": "replica_max_lag_entries", "max_silence_ms": "replica_max_silence_ms",
                 "follow_leader": "replica_follow_leader"}


def _replica(section: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """[replica] follow (voters' gRPC addresses) and its bounds; a replica has no Raft address or data of its
    own: it is named by its gRPC address."""
    if not isinstance(section, dict):
        raise ConfigError("replica must be a table ([replica] follow = [...])")
    for key, value in section.items():
        if key == "follow":
            if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
                raise ConfigError("replica.follow must be a non-empty list of voters' gRPC addresses (host:port)")
            kwargs["replica_follow"] = list(dict.fromkeys(value))
        elif key in _REPLICA_KEYS:
            kwargs[_REPLICA_KEYS[key]] = _typed(f"replica.{key}", value, _DEFAULTS[_REPLICA_KEYS[key]])
            if key != "follow_leader" and kwargs[_REPLICA_KEYS[key]] <= 0:
                raise ConfigError(f"replica.{key} must be positive")
        else:
            raise ConfigError(f"replica.{key} is not a setting (settings: follow, {', '.join(_REPLICA_KEYS)})")
    if "replica_follow" not in kwargs:
        raise ConfigError("replica.follow is required in a [replica] section: the voters' gRPC addresses")
    kwargs["raft_addr"] = kwargs["raft_addr"] or kwargs["grpc_addr"]
    kwargs["data_dir"] = kwargs["data_dir"] or "."


def _security(doc: dict[str, Any], base: str, kwargs: dict[str, Any]) -> None:
    """[security], [tls], [auth] and [remoting] role and tls into kwargs; files resolved against the config's dir."""
    kwargs["security_mode"] = str(doc.get("security", {}).get("mode", "dev"))
    tls, auth = doc.get("tls", {}), doc.get("auth", {})
    for key in ("cert_file", "key_file", "ca_file"):
        if tls.get(key):
            kwargs[f"tls_{key}"] = _path(str(tls[key]), base)
    kwargs["tls_client_auth"] = str(tls.get("client_auth", "none"))
    if auth.get("tokens_file"):
        kwargs["auth_tokens"] = _tokens(_path(str(auth["tokens_file"]), base))
    roles = auth.get("cert_roles", {})
    if not isinstance(roles, dict):
        raise ConfigError("auth.cert_roles must be a table of identity = role")
    kwargs["cert_roles"] = {str(k): str(v) for k, v in roles.items()}
    kwargs["peer_role"] = str(auth.get("peer_role", "peer"))
    kwargs["peer_token"] = _secret(auth.get("peer_token_file"), auth.get("peer_token_env"), base, "auth.peer_token")
    kwargs["remoting_role"] = str(doc.get("remoting", {}).get("role", ""))
    kwargs["remoting_tls"] = str(doc.get("remoting", {}).get("tls", ""))


def _tokens(path: str) -> dict[str, str]:
    """The tokens file holds only SHA-256 hashes of tokens (`python -m nameserver.api.auth hash` makes one)."""
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f).get("tokens", {})
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"auth.tokens_file: {exc}") from exc
    out: dict[str, str] = {}
    for digest, role in table.items():
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
            # never echo the key: it may be a plaintext token pasted by mistake
            raise ConfigError("auth.tokens_file: every key must be the SHA-256 hex digest of a token")
        out[digest.lower()] = str(role)
    return out


def _check_security(cfg: NodeConfig) -> None:
    if cfg.security_mode not in SECURITY_MODES:
        raise ConfigError(f"security.mode must be one of {', '.join(SECURITY_MODES)}")
    if cfg.tls_client_auth not in CLIENT_AUTH:
        raise ConfigError(f"tls.client_auth must be one of {', '.join(CLIENT_AUTH)} (grpcio cannot make "
                          "client certificates optional: use \"none\" with tokens, or \"require\")")
    if bool(cfg.tls_cert_file) != bool(cfg.tls_key_file):
        raise ConfigError("tls.cert_file and tls.key_file go together")
    if cfg.tls_client_auth != "none" and not (cfg.tls_enabled and cfg.tls_ca_file):
        raise ConfigError("tls.client_auth needs tls.cert_file, tls.key_file and tls.ca_file")
    if cfg.cert_roles and cfg.tls_client_auth == "none":
        raise ConfigError("auth.cert_roles needs client certificates: set tls.client_auth")
    for where, role in ([("auth.tokens_file", r) for r in cfg.auth_tokens.values()]
                        + [("auth.cert_roles", r) for r in cfg.cert_roles.values()]
                        + [("auth.peer_role", cfg.peer_role)]
                        + ([("remoting.role", cfg.remoting_role)] if cfg.remoting_role else [])
                        + ([("controller.role", cfg.controller_role)] if cfg.controller_role else [])):
        if role not in ROLES:
            raise ConfigError(f"{where}: unknown role {role!r} (roles: {', '.join(ROLES)})")
    if cfg.remoting_tls and cfg.remoting_tls not in REMOTING_TLS_MODES:
        raise ConfigError(f"remoting.tls must be one of {', '.join(REMOTING_TLS_MODES)}, got {cfg.remoting_tls!r}")
    if cfg.remoting_tls in ("permissive", "enforcing") and not cfg.tls_enabled:
        raise ConfigError(f'remoting.tls = "{cfg.remoting_tls}" needs the node\'s certificate: set tls.cert_file '
                          "and tls.key_file")
    if cfg.security_mode == "secure":
        if cfg.remoting_addr and not cfg.remoting_role:
            # The remoting protocol carries no credentials: every remoting caller gets this role.
            raise ConfigError('security.mode = "secure" with [remoting] listen needs [remoting] role: the '
                              "rights every (unauthenticated) remoting caller gets, e.g. \"client\" or "
                              "\"broker\"")
        if cfg.controller_addr and not cfg.controller_role:
            raise ConfigError('security.mode = "secure" with [controller] listen needs [controller] role: the '
                              'rights every (unauthenticated) controller-port caller gets, e.g. "broker"')
        if not cfg.password and not cfg.replica_follow:  # a read replica has no Raft port
            raise ConfigError('security.mode = "secure" needs a Raft password: set raft.password_file '
                              "or raft.password_env")
        if not cfg.tls_enabled:
            raise ConfigError('security.mode = "secure" needs TLS: set tls.cert_file and tls.key_file')
        if not cfg.auth_enabled:
            raise ConfigError('security.mode = "secure" needs callers\' identities: set auth.tokens_file '
                              "or auth.cert_roles")


def _path(p: str, base: str) -> str:
    return p if os.path.isabs(p) else os.path.join(base, p)


def _secret(file_path: str | None, env_name: str | None, base: str, name: str) -> str | None:
    """Secrets come from a file or an environment variable, never from the config text itself."""
    if file_path:
        try:
            with open(_path(file_path, base)) as f:
                return f.read().strip() or None
        except OSError as exc:
            raise ConfigError(f"{name}_file: {exc}") from exc
    if env_name:
        value = os.environ.get(env_name)
        if not value:
            raise ConfigError(f"{name}_env: environment variable {env_name} is not set")
        return value
    return None
