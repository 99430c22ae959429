"""Local port picks: distinct across calls, free, and outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

import pytest

from nameserver import localports
from nameserver.localports import free_ports


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        return int(f.read().split()[0])


def test_separate_picks_never_repeat_a_port() -> None:
    # Binding port 0 twice may return the same port once the first socket is closed: a CI run lost
    # a cluster to exactly that (one node's metrics port was another's gRPC port).
    picks = [p for _ in range(300) for p in free_ports(1)] + free_ports(200)
    assert len(set(picks)) == len(picks)


def test_picks_are_free_and_below_the_ephemeral_range() -> None:
    low = _ephemeral_low()
    for port in free_ports(20):
        assert port < low  # an outgoing connection never takes it as its source port
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = range(_ephemeral_low() - 200, _ephemeral_low() - 140)
    monkeypatch.setattr(localports, "_pool", lambda: pool)
    monkeypatch.setattr(localports, "_handed", set())
    held = []
    try:
        for port in pool[::2]:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()  # taken by something else already: just as good for this test
                continue
            s.listen()
            held.append(s)
        busy = {s.getsockname()[1] for s in held}
        picks = free_ports(20)
        assert len(set(picks)) == 20 and not busy & set(picks)
        with pytest.raises(OSError, match="free ports"):
            free_ports(len(pool))
    finally:
        for s in held:
            s.close()


def test_strided_picks_are_free_at_every_stride_and_never_handed_again() -> None:
    """A sharded local cluster's Raft ports: group k's port of each member is the member's + k x step."""
    firsts, step = localports.free_strided_ports(3, 4)
    every = [p + k * step for p in firsts for k in range(4)]
    assert step >= 1 and len(set(every)) == 12
    for port in every:
        assert port < _ephemeral_low()
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert not set(every) & set(free_ports(200))
