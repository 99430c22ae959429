"""Which process holds which TCP socket, from Linux /proc: a node's worker processes (its children), the
sockets listening on one of its ports, the process that accepted a given connection."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

LISTEN = 0x0A  # /proc/net/tcp's state of a listening socket
UNIX_ACCEPTING = 0x10000  # /proc/net/unix's flag of a listening socket (__SO_ACCEPTCON)


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def socket_inodes(pid: int) -> set[int]:
    out: set[int] = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def tcp_sockets(seen_by: int | None = None) -> list[tuple[int, int, int, int]]:
    """(local port, remote port, state, inode) of every TCP socket, IPv4 and IPv6 (gRPC listens on
    127.0.0.1 with an IPv6 socket: ::ffff:127.0.0.1); of the network namespace of process `seen_by` when
    given (a node in its own namespace: tests/faults/netns.py), else of ours."""
    rows = []
    net = f"/proc/{seen_by}/net" if seen_by is not None else "/proc/net"
    for table in (f"{net}/tcp", f"{net}/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:  # no IPv6 in this kernel
            continue
        for line in lines:
            parts = line.split()
            rows.append((int(parts[1].split(":")[1], 16), int(parts[2].split(":")[1], 16), int(parts[3], 16),
                         int(parts[9])))
    return rows


def listening(port: int, seen_by: int | None = None) -> set[int]:
    """The inodes of the sockets listening on `port` (several with SO_REUSEPORT), in `seen_by`'s namespace."""
    return {inode for lport, _, state, inode in tcp_sockets(seen_by) if lport == port and state == LISTEN}


def unix_listening(path: re.Pattern[str], seen_by: int | None = None) -> set[int]:
    """The inodes of the Unix sockets listening at a path `path` matches (seen by process `seen_by`)."""
    table = f"/proc/{seen_by}/net/unix" if seen_by is not None else "/proc/net/unix"
    try:
        with open(table) as f:
            lines = f.readlines()[1:]
    except OSError:
        return set()
    # Num RefCount Protocol Flags Type St Inode Path: a listening socket has __SO_ACCEPTCON in its flags
    return {int(parts[6]) for parts in (line.split() for line in lines)
            if len(parts) > 7 and int(parts[3], 16) & UNIX_ACCEPTING and path.search(parts[7])}


def listener_pids(pid: int, port: int) -> list[int]:
    """Of `pid` and its children, those with a socket listening on `port` (in `pid`'s network namespace)."""
    inodes = listening(port, pid)
    return [p for p in [pid, *children(pid)] if socket_inodes(p) & inodes]


FRONT_SOCKET = re.compile(r"/channel/front-\d+\.sock$")  # a worker's, behind the Go front end (frontchannel.py)


def is_worker(pid: int) -> bool:
    """Whether process `pid` is a node's worker process (nameserver.worker)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"nameserver.worker" in f.read()
    except OSError:  # exited meanwhile
        return False


def grpc_serving(core: int, port: int) -> list[int]:
    """Of node `core`'s worker processes, those serving its gRPC port: listening on it (grpcio's port, each
    worker's server, SO_REUSEPORT), or, when another of its children listens there (the Go front end, [node]
    grpc_front = "go"), listening on their front socket (channel/front-I.sock)."""
    listeners = [pid for pid in listener_pids(core, port) if pid != core]
    if all(is_worker(pid) for pid in listeners):  # no front end: the workers own the port
        return listeners
    fronts = unix_listening(FRONT_SOCKET, core)
    return [pid for pid in children(core) if is_worker(pid) and socket_inodes(pid) & fronts]


def wait_grpc_serving(core: int, addr: str, workers: int, timeout: float = 60.0) -> None:
    """Until `workers` worker processes of node `core` serve its gRPC port (grpc_serving), whichever front end
    holds it; with none, until the core listens there itself."""
    if not workers:
        wait_listening(core, addr, 1, timeout)
        return
    port = int(addr.rsplit(":", 1)[1])
    _wait_count(lambda: len(grpc_serving(core, port)), workers, timeout,
                f"{workers} worker(s) of process {core} not serving {addr}")


def wait_listening(pid: int, addr: str, listeners: int, timeout: float = 60.0) -> None:
    """Until `listeners` of the process `pid` and its children listen on `addr`'s port."""
    port = int(addr.rsplit(":", 1)[1])
    _wait_count(lambda: len(listener_pids(pid, port)), listeners, timeout,
                f"{listeners} listener(s) of process {pid} on {addr} not up")


def _wait_count(count: Callable[[], int], want: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while count() != want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout} s")
        time.sleep(0.1)
