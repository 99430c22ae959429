"""Open-file budget: every listener's connection limit fits under the process's descriptor limit,
with descriptors left over that no connection can take (the journal, snapshots, peers).

A node that runs out of descriptors must refuse connections, never fail a journal write (which stops
the node: raftlog/journal.py). So at start-up the soft RLIMIT_NOFILE is raised to the hard limit, and
when the configured connection limits still do not fit, they are lowered to fit, with a warning that
names the keys. The remoting port, where a whole fleet connects, takes by default every descriptor the
other limits leave.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from nameserver.config import REMOTING_CONNECTIONS_FLOOR, NodeConfig

log = logging.getLogger("nameserver.limits")

# Descriptors a node holds besides its client connections: journal and meta files, LMDB snapshots,
# Raft links and their pre-authentication allowance (raftlog/binding.py), gRPC's own pipes and
# epoll, log files, the remoting loop. Measured at about 60 on an idle 3-node cluster; doubled.
BASE_FDS = 128


@dataclass(frozen=True)
class ConnectionBudget:
    remoting: int
    grpc: int
    metrics: int
    nofile: int


def raise_nofile() -> int:
    """Raise the soft descriptor limit to the hard one; returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
    return soft


def budget(cfg: NodeConfig, nofile: int) -> ConnectionBudget:
    """The connection limits to enforce: the configured ones, scaled down to fit `nofile`. Remoting's
    limit 0 (the default) takes what the others leave, at least REMOTING_CONNECTIONS_FLOOR."""
    wanted = {"remoting": cfg.remoting_max_connections if cfg.remoting_addr else 0,
              "grpc": cfg.grpc_max_connections,
              "metrics": cfg.metrics_max_connections if cfg.metrics_addr else 0}
    room = nofile - cfg.reserved_fds - BASE_FDS
    if cfg.remoting_addr and not cfg.remoting_max_connections:
        wanted["remoting"] = max(REMOTING_CONNECTIONS_FLOOR, room - wanted["grpc"] - wanted["metrics"])
    total = sum(wanted.values())
    if total <= room:
        return ConnectionBudget(nofile=nofile, **wanted)
    share = max(0, room) / total
    fitted = {k: max(1, int(v * share)) if v else 0 for k, v in wanted.items()}
    log.warning("open-file limit %d (ulimit -n) leaves room for %d connections after limits.reserved_fds = %d "
                "and %d for the node itself, below the configured limits (%s); lowered to %s. Raise the "
                "limit (LimitNOFILE= in systemd) or lower limits.*_max_connections.", nofile, max(0, room),
                cfg.reserved_fds, BASE_FDS, _show(wanted), _show(fitted))
    return ConnectionBudget(nofile=nofile, **fitted)


def _show(limits: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in limits.items() if v)
