"""Free 127.0.0.1 ports for local clusters: the tests, the benchmark harness, the demo, Spark standalone.

Binding port 0 asks the kernel for a port from its ephemeral range, and that is where two things
collided on a loaded CI machine: two separate picks returned the same port (the first one was closed
again before the second pick), and an outgoing connection took a picked port as its source port
before the server listened on it. So ports come from just below the ephemeral range, which the
kernel never gives to outgoing connections, and one process never hands out the same port twice.
"""

from __future__ import annotations

import random
import socket
import threading

_EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
_SPAN = 12000  # how many ports below the ephemeral range to use
_lock = threading.Lock()
_handed: set[int] = set()


def _pool() -> range:
    try:
        with open(_EPHEMERAL_RANGE) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    start = max(1024, low - _SPAN)
    return range(start, low) if low - start >= 1000 else range(20000, 32000)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """`n` distinct ports that nothing listens on now and that this process has not handed out before."""
    pool = _pool()
    ports: list[int] = []
    with _lock:
        if len(_handed) > len(pool) // 2:  # a very long run: forget the oldest picks rather than fail
            _handed.clear()
        for _ in range(100 * n + 1000):
            if len(ports) == n:
                break
            port = random.choice(pool)
            if port not in _handed and _bindable(port):
                _handed.add(port)
                ports.append(port)
    if len(ports) < n:
        raise OSError(f"no {n} free ports in 127.0.0.1:{pool.start}-{pool.stop - 1}")
    return ports


def free_strided_ports(n: int, rows: int) -> tuple[list[int], int]:
    """`n` ports and a step such that each port + k x step (k < rows) is free too, all handed out: a local
    cluster's Raft ports with [sharding] groups = rows and raft_port_step = step."""
    pool = _pool()
    with _lock:
        for _ in range(1000):
            step = random.randrange(1, max(2, len(pool) // (2 * rows)))
            firsts = [random.randrange(pool.start, pool.stop - (rows - 1) * step) for _ in range(n)]
            picked = [p + k * step for p in firsts for k in range(rows)]
            if len(set(picked)) == len(picked) and all(p not in _handed and _bindable(p) for p in picked):
                _handed.update(picked)
                return firsts, step
    raise OSError(f"no {n} x {rows} free ports in 127.0.0.1:{pool.start}-{pool.stop - 1}")


def free_port() -> int:
    return free_ports(1)[0]


__all__ = ["free_port", "free_ports", "free_strided_ports"]
